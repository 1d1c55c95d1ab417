"""Keep-alive users of nginx, side by side, in a process of their own.

``python nginx_load.py ROUNDS CLIENTS PORT [PORT ...]``: ``CLIENTS`` users per port,
each on one keep-alive connection (``http.client``, a thread each). In every round
each user sends one chat request, all at the same moment (a barrier), and the round
ends when every answer is back. Whatever else the machine does then (two cores shared
with other work) lands on every port's requests of that round alike, so the ports'
latencies compare pair by pair rather than across different moments. Prints
``{port: [seconds, ...]}`` as JSON; a non-200 answer exits 1.
"""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time

BODY = json.dumps(
    {"model": "m-int4", "messages": [{"role": "user", "content": "Capital of France?"}]}
).encode()


def main(rounds: int, clients: int, ports: list[int]) -> int:
    users = [port for port in ports for _ in range(clients)]
    barrier = threading.Barrier(len(users))
    latencies: dict[int, list[float]] = {port: [] for port in ports}
    failures: list[str] = []

    def user(port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for _ in range(rounds):
                barrier.wait(timeout=60)
                t0 = time.perf_counter()
                conn.request(
                    "POST", "/v1/chat/completions", BODY, {"Content-Type": "application/json"}
                )
                reply = conn.getresponse()
                reply.read()
                latencies[port].append(time.perf_counter() - t0)
                if reply.status != 200:
                    failures.append(f"port {port}: HTTP {reply.status}")
        except Exception as exc:  # a user that fails breaks the barrier for all: said once
            failures.append(f"port {port}: {exc!r}")
            barrier.abort()
        finally:
            conn.close()

    threads = [threading.Thread(target=user, args=(port,)) for port in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.stderr.write("\n".join(failures[:5]) + "\n")
        return 1
    print(json.dumps(latencies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1]), int(sys.argv[2]), [int(p) for p in sys.argv[3:]]))
