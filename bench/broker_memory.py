"""The embedded broker's memory: does retention bound it, and does a full partition slow it?

Three probes on a fresh Tansu (memory storage), each a few seconds:

* **retention**: a topic created with ``retention.ms=1000``; ``--mb`` MB produced;
  the broker's RSS after, and again after ``--idle-s`` seconds idle (it would
  drop if retention applied);
* **DeleteRecords**: asked to delete most of a partition; the answer (or the error);
* **tail latency vs partition size**: after every ``--step`` records of 2 KB,
  100 produce-then-fetch round trips at the tail, p50 and max, and the CPU the
  broker spent per step (a store that scans would slow down as it fills), and its CPU
  per idle fetch at the tail (what each polling consumer costs it). ``--per-batch K``
  fills the partition with batches of K records (one produce request each): Tansu keeps
  one object per batch and lists every object of the partition on each fetch of new
  data, so the round trip's cost should follow the batches held, not the records.

    python bench/broker_memory.py [--mb 40 --step 10000 --steps 6] [--per-batch K]
                                  [--skip-retention] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from quantdrift.stack.broker import TansuBroker

VALUE = b"x" * 2000
# Round trips per step: enough that the broker's CPU, counted in 10 ms ticks, resolves.
ROUND_TRIPS = 100


async def produce(bootstrap: str, topic: str, n: int, per_batch: int | None = None) -> None:
    """``n`` records of 2 KB; ``per_batch``: exactly that many per batch (None: as
    aiokafka packs them, up to its 16 KB batches)."""
    room = max(16384, (per_batch or 1) * (len(VALUE) + 200))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=room)
    await producer.start()
    try:
        if per_batch is None:
            for _ in range(n):
                await producer.send(topic, VALUE)
        else:
            for start in range(0, n, per_batch):
                batch = producer.create_batch()
                for _ in range(min(per_batch, n - start)):
                    if batch.append(key=None, value=VALUE, timestamp=None) is None:
                        raise RuntimeError(f"a batch of {per_batch} records does not fit")
                await (await producer.send_batch(batch, topic, partition=0))
        await producer.flush()
    finally:
        await producer.stop()


async def retention(broker: TansuBroker, mb: int, idle_s: float) -> dict[str, Any]:
    proc = psutil.Process(broker.pid)
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("ret", 1, 1, topic_configs={"retention.ms": "1000"})])
    finally:
        await admin.close()
    before = proc.memory_info().rss / 1e6
    await produce(broker.bootstrap, "ret", mb * 500)
    after = proc.memory_info().rss / 1e6
    await asyncio.sleep(idle_s)
    idle = proc.memory_info().rss / 1e6
    return {
        "produced_mb": mb,
        "rss_mb_before": round(before, 1),
        "rss_mb_after": round(after, 1),
        f"rss_mb_after_{idle_s:g}s_idle": round(idle, 1),
        "bounded": idle < after - 0.5 * mb,
    }


async def delete_records(broker: TansuBroker) -> str:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=5000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("del", 1, 1)])
        await produce(broker.bootstrap, "del", 1000)
        answer = await admin.delete_records({TopicPartition("del", 0): RecordsToDelete(900)})
        return f"answered: {answer}"
    except KafkaError as exc:
        return f"failed: {exc!r}"
    finally:
        await admin.close()


async def idle_fetch_cpu(
    proc: psutil.Process, consumer: AIOKafkaConsumer, tp: TopicPartition, end: int, n: int = 100
) -> float:
    """The broker's CPU (ms) per fetch at the tail with nothing new: what every idle
    consumer costs it, ``fetch_max_wait_ms`` apart. A store that scans its whole log per
    fetch would spend more per fetch as the log grows."""
    consumer.seek(tp, end)
    cpu0 = sum(proc.cpu_times()[:2])
    for _ in range(n):
        await consumer.getmany(tp, timeout_ms=20, max_records=1)
    return round((sum(proc.cpu_times()[:2]) - cpu0) / n * 1000, 3)


async def tail_latency(
    broker: TansuBroker, step: int, steps: int, per_batch: int | None = None
) -> list[dict[str, Any]]:
    proc = psutil.Process(broker.pid)
    bootstrap, tp = broker.bootstrap, TopicPartition("tail", 0)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic("tail", 1, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=20)
    await producer.start()
    await consumer.start()
    consumer.assign([tp])
    rows, total = [], 0
    try:
        for _ in range(steps):
            cpu0 = sum(proc.cpu_times()[:2])
            await produce(bootstrap, "tail", step, per_batch)
            total += step
            cpu = sum(proc.cpu_times()[:2]) - cpu0
            lat = []
            round_trip_cpu0 = sum(proc.cpu_times()[:2])
            for j in range(ROUND_TRIPS):
                consumer.seek(tp, total + j)
                t0 = time.perf_counter()
                await (await producer.send(tp.topic, VALUE))
                await consumer.getmany(tp, timeout_ms=5000, max_records=1)
                lat.append((time.perf_counter() - t0) * 1000)
            round_trip_cpu = (sum(proc.cpu_times()[:2]) - round_trip_cpu0) / ROUND_TRIPS * 1000
            total += ROUND_TRIPS
            idle_cpu = await idle_fetch_cpu(proc, consumer, tp, total)
            rows.append(
                {
                    "records": total,
                    "tail_p50_ms": round(statistics.median(lat), 1),
                    "tail_max_ms": round(max(lat), 1),
                    "broker_cpu_s_per_step": round(cpu, 2),
                    "broker_cpu_ms_per_idle_fetch": idle_cpu,
                    "broker_cpu_ms_per_round_trip": round(round_trip_cpu, 2),
                    "rss_mb": round(proc.memory_info().rss / 1e6, 1),
                }
            )
    finally:
        await producer.stop()
        await consumer.stop()
    return rows


async def main(args: argparse.Namespace) -> dict[str, Any]:
    broker = TansuBroker().start()
    try:
        out: dict[str, Any] = {"bench": "broker_memory", "per_batch": args.per_batch}
        if not args.skip_retention:
            out["retention"] = await retention(broker, args.mb, args.idle_s)
            out["delete_records"] = await delete_records(broker)
        out["tail"] = await tail_latency(broker, args.step, args.steps, args.per_batch)
        return out
    finally:
        broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=40)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--step", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--per-batch", type=int, default=None, help="records per batch")
    parser.add_argument("--skip-retention", action="store_true", help="the tail probe only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
