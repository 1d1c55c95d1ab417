"""A delaying TCP proxy: one slow link on the rig, since this kernel has no ``netem``.

The proxy listens on the observer's address and forwards to one part (Redis, an
upstream); the client whose link is to be slowed is configured with the proxy's
address instead of the part's. While ``delay_s`` is above zero every chunk waits
half of it in each direction, so each round trip gets ``delay_s`` longer, in order
(a chunk never overtakes the one before it, as on a real link). ``delay_s = 0`` is
a plain pipe: the fault starts and stops by setting it, and ``delayed`` counts the
chunks that were held, so a test proves the fault met traffic, and ``peers`` the
addresses its clients came from, so a test proves whose link it slowed.

It runs on its own event loop in a thread; ``stop`` closes it and every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

from quantdrift.stack import free_port


@dataclass
class DelayProxy:
    listen_host: str
    target_host: str
    target_port: int
    delay_s: float = 0.0
    port: int = field(default_factory=free_port)
    delayed: int = 0
    peers: set[str] = field(default_factory=set)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.AbstractServer | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    @property
    def address(self) -> str:
        return f"{self.listen_host}:{self.port}"

    def start(self) -> DelayProxy:
        self._thread = threading.Thread(target=self._serve, daemon=True, name="delay-proxy")
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError(f"delay proxy on {self.address} did not start")
        return self

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()

        async def up() -> None:
            self._server = await asyncio.start_server(self._client, self.listen_host, self.port)
            self._ready.set()

        try:
            self._loop.run_until_complete(up())
            self._loop.run_forever()
        finally:
            self._ready.set()
            self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if peer:
            self.peers.add(str(peer[0]))
        try:
            up_r, up_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        pipes = [self._pipe(reader, up_w), self._pipe(up_r, writer)]
        await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy ``src`` to ``dst``; each chunk leaves ``delay_s / 2`` after it arrived."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await queue.get()
                if not chunk:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(chunk)
                await dst.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while chunk := await src.read(65536):
                hold = self.delay_s / 2
                if hold > 0:
                    self.delayed += 1
                await queue.put((time.monotonic() + hold, chunk))
        except OSError:
            pass
        finally:
            await queue.put((0.0, b""))
            with contextlib.suppress(OSError):
                await sender
            dst.close()

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None or loop.is_closed():
            return

        async def down() -> None:
            server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(down(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
