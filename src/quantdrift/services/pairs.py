"""Reading recorded pairs: one reader for every command that takes a pairs file, and
one for a range of a live topic.

Calibrate, eval, score, the lab's reports, distillation and the demo all read
PairEvent JSONL (gzipped or not) through :func:`read_pairs`, so a bad line is
refused the same way everywhere: one error naming the file and the line.
Replay and calibrate read a topic range through :func:`read_topic`, the one
group-less consumer of :func:`quantdrift.replay.sources.topic_values`.
"""

from __future__ import annotations

import asyncio
import gzip
import lzma
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from quantdrift.errors import ConfigError
from quantdrift.schemas import PairEvent

if TYPE_CHECKING:
    from quantdrift.config import Settings
    from quantdrift.replay.sources import TopicRange

LAB_PAIRS = "lab_pairs.jsonl.gz"
# A slice of the traffic corpus shipped in the package (``quantdrift lab corpus slice``):
# the demo's pairs.
CORPUS_SLICE = "corpus_slice.jsonl.xz"


def read_pairs(path: Path | None = None, *, shipped: str = LAB_PAIRS) -> list[PairEvent]:
    """PairEvents from JSONL (gzip, xz or plain); a folder: every ``*.jsonl.gz`` and
    ``*.jsonl.xz`` in it, by name (a recorded corpus's blocks); None reads the pairs
    shipped in the package as ``shipped``."""
    if path is not None and path.is_dir():
        files = sorted([*path.glob("*.jsonl.gz"), *path.glob("*.jsonl.xz")])
        return [p for f in files for p in read_pairs(f)]
    if path is None:
        ref = resources.files("quantdrift.data").joinpath(shipped)
        unpack = lzma.decompress if shipped.endswith(".xz") else gzip.decompress
        raw = unpack(ref.read_bytes())
    elif path.suffix == ".xz":
        raw = lzma.decompress(path.read_bytes())
    elif path.suffix == ".gz":
        raw = gzip.decompress(path.read_bytes())
    else:
        raw = path.read_bytes()
    pairs = []
    for n, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                pairs.append(PairEvent.parse(line))
            except ValueError as exc:
                raise ConfigError(f"{path or shipped} line {n}: {exc}") from exc
    return pairs


def read_topic(
    settings: Settings,
    topic: str | None,
    rng: TopicRange,
    timeout: float = 60.0,
    progress: Callable[..., None] | None = None,
) -> tuple[list[bytes], str]:
    """The raw values of ``topic`` (None or "": the settings' pairs topic) in ``rng``, and
    a one-line description of where they came from.

    Its own consumer without a group: nothing is committed, so reading a live topic
    moves no worker's offsets. A broker that cannot be reached is a BrokerError; a
    topic that does not exist, a ConfigError.
    """
    # Deferred: aiokafka is loaded only by the commands that read a topic.
    from quantdrift.kafka_clients import consumer_kwargs
    from quantdrift.replay.sources import topic_values

    name = topic or settings.kafka.topics.pairs

    def read_progress(total: int | None = None, advance: int = 0) -> None:
        if progress is not None:
            progress(desc="read topic", total=total, advance=advance)

    lines = asyncio.run(
        topic_values(
            consumer_kwargs(settings.kafka), name, rng, timeout=timeout, progress=read_progress
        )
    )
    return lines, f"topic {name} @ {settings.kafka.bootstrap_servers}"
