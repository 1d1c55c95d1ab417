"""Reading recorded pairs: one reader for every command that takes a pairs file.

Calibrate, eval, score, the lab's reports, distillation and the demo all read
PairEvent JSONL (gzipped or not) through :func:`read_pairs`, so a bad line is
refused the same way everywhere: one error naming the file and the line.
"""

from __future__ import annotations

import gzip
import lzma
from importlib import resources
from pathlib import Path

from quantdrift.errors import ConfigError
from quantdrift.schemas import PairEvent

LAB_PAIRS = "lab_pairs.jsonl.gz"


def read_pairs(path: Path | None = None) -> list[PairEvent]:
    """PairEvents from JSONL (gzip, xz or plain); a folder: every ``*.jsonl.gz`` and
    ``*.jsonl.xz`` in it, by name (a recorded corpus's blocks); None reads the pairs
    shipped in the package."""
    if path is not None and path.is_dir():
        files = sorted([*path.glob("*.jsonl.gz"), *path.glob("*.jsonl.xz")])
        return [p for f in files for p in read_pairs(f)]
    if path is not None and path.suffix == ".xz":
        raw = lzma.decompress(path.read_bytes())
    elif path is None:
        ref = resources.files("quantdrift.data").joinpath(LAB_PAIRS)
        raw = gzip.decompress(ref.read_bytes())
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
                raise ConfigError(f"{path or LAB_PAIRS} line {n}: {exc}") from exc
    return pairs
