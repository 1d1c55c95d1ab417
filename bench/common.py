"""Shared bench inputs: seeded pairs of ~200 tokens, and the machine they ran on.

Texts come from the lab's recorded pairs when the package ships them
(``quantdrift/data/lab_pairs.jsonl.gz``), else from a fixed pool of English
sentences (the standard library's docstrings, sorted, so a seed gives the same
texts on one Python version). Candidates are the reference perturbed the way
quantized outputs differ: most lightly (a healthy model: words dropped or
swapped, a sentence replaced), some heavily (drift: half the sentences
replaced, a truncated answer, a loop).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import random
import re
import time
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

import psutil

from quantdrift.schemas import ModelOutput, PairEvent, RequestInfo

POOL_MODULES = [
    "collections",
    "argparse",
    "json",
    "asyncio",
    "threading",
    "subprocess",
    "logging",
    "email",
    "http.client",
    "unittest",
    "random",
    "statistics",
    "decimal",
    "fractions",
    "pathlib",
    "shutil",
    "tarfile",
    "zipfile",
    "sqlite3",
    "csv",
    "datetime",
    "calendar",
    "heapq",
    "bisect",
    "functools",
    "itertools",
    "inspect",
    "ast",
    "socket",
    "ssl",
    "selectors",
    "typing",
    "dataclasses",
    "enum",
    "string",
    "textwrap",
    "difflib",
    "re",
    "struct",
    "codecs",
    "hashlib",
    "hmac",
    "secrets",
    "urllib.request",
    "html",
    "pdb",
    "timeit",
    "trace",
    "gc",
    "weakref",
    "copy",
    "pprint",
    "reprlib",
    "abc",
    "contextlib",
    "operator",
]

_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@lru_cache(maxsize=1)
def sentence_pool() -> tuple[str, ...]:
    """English sentences of 8-40 words from stdlib docstrings, sorted and deduplicated."""
    found: set[str] = set()
    for name in POOL_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for attr in sorted(dir(module)):
            doc = getattr(getattr(module, attr, None), "__doc__", None)
            if not isinstance(doc, str):
                continue
            for s in _SENTENCE.split(" ".join(doc.split())):
                if 8 <= len(s.split()) <= 40 and s[:1].isupper() and ">>>" not in s:
                    found.add(s)
    return tuple(sorted(found))


def lab_texts() -> list[str]:
    """Reference texts of the shipped lab pairs (empty list if none are shipped)."""
    try:
        from quantdrift.services.pairs import read_pairs

        return [p.reference.text for p in read_pairs(None) if p.reference.text.strip()]
    except (FileNotFoundError, ModuleNotFoundError, OSError):
        return []


def _paragraph(rng: random.Random, pool: tuple[str, ...], words: int) -> str:
    out: list[str] = []
    n = 0
    while n < words:
        s = pool[rng.randrange(len(pool))]
        out.append(s)
        n += len(s.split())
    return " ".join(out)


def perturb(rng: random.Random, text: str, pool: tuple[str, ...], level: float) -> str:
    """A candidate ``level`` away from ``text`` (0 = identical, 1 = unrelated)."""
    words = text.split()
    # Word swaps are left out: quantized models do not scramble word order, and a
    # bag-of-words tier is blind to it by construction.
    kind = rng.choice(("drop", "replace", "replace", "truncate", "loop"))
    if kind == "drop":
        return " ".join(w for w in words if rng.random() >= level * 0.6) or text
    if kind == "replace":
        sents = _SENTENCE.split(text)
        return " ".join(s if rng.random() >= level else rng.choice(pool) for s in sents)
    if kind == "truncate":
        return " ".join(words[: max(3, int(len(words) * (1 - level * 0.8)))])
    keep = max(6, int(len(words) * (1 - level * 0.7)))
    return " ".join(words[:keep] + words[keep - 3 : keep] * int(level * 20))


def drift_level(rng: random.Random) -> float:
    """85 % healthy-looking (light), 10 % moderate, 5 % broken."""
    u = rng.random()
    if u < 0.85:
        return rng.uniform(0.0, 0.25)
    if u < 0.95:
        return rng.uniform(0.25, 0.6)
    return rng.uniform(0.6, 1.0)


def long_pairs(n: int, *, words: int = 150, seed: int = 0, routes: int = 4) -> list[PairEvent]:
    """``n`` seeded PairEvents of ~``words`` words (~200 word-piece tokens) per side."""
    rng = random.Random(seed)
    pool = tuple(lab_texts()) or sentence_pool()
    pairs = []
    for i in range(n):
        ref = _paragraph(rng, pool, words)
        cand = perturb(rng, ref, pool, drift_level(rng))
        ntok = len(cand.split())
        pairs.append(
            PairEvent(
                pair_id=f"bench-{seed}-{i:06d}",
                ts=time.time(),
                route=f"bench/route-{i % routes}",
                kind="shadow",
                candidate=ModelOutput(
                    text=cand,
                    model="bench-int4",
                    precision="int4",
                    entropy=[round(rng.uniform(0.1, 2.0), 3) for _ in range(ntok)],
                ),
                reference=ModelOutput(text=ref, model="bench-bf16", precision="bf16"),
                request=RequestInfo(prompt=f"bench prompt {i}", temperature=0.0, max_tokens=256),
            )
        )
    return pairs


def calibration_pairs(n: int = 400, seed: int = 1) -> Iterator[tuple[str, str]]:
    """(candidate, reference) over the whole drift range, short and long, for fitting."""
    rng = random.Random(seed)
    pool = sentence_pool()
    for _ in range(n):
        ref = _paragraph(rng, pool, rng.choice((20, 60, 120, 180)))
        yield perturb(rng, ref, pool, rng.random()), ref


def machine() -> dict[str, str | int]:
    """nproc, CPU model and versions, for the BENCHMARKS.md header."""
    cpu = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {}
    for dist in (
        "quantdrift",
        "torch",
        "sentence-transformers",
        "model2vec",
        "sacrebleu",
        "rouge-score",
    ):
        try:
            from importlib.metadata import PackageNotFoundError, version

            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = "-"
    return {
        "nproc": os.cpu_count() or 0,
        "cpu": cpu,
        "python": platform.python_version(),
        **versions,
    }


def tree_cpu_seconds(pids: Iterable[int | None], children: bool = True) -> float:
    """User + system CPU seconds of each pid, and of its children unless ``children`` is
    False, so far (gone ones count 0).

    What a bench divides by to say "per core": the machine's cores are shared with the
    load generator and the servers, so a rate alone does not say what one process used.
    A bench measuring itself passes ``children=False``: the worker and the broker it
    started are its children, and counted apart.
    """
    total = 0.0
    for pid in pids:
        if pid is None:
            continue
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for proc in [root, *(root.children(recursive=True) if children else [])]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    total += t.user + t.system
    return total


def write_section(path: Path, section: str, marker: str) -> None:
    """Replace one bench's section (from ``marker`` to the next ``## ``) in ``path``,
    or append it, leaving the other benches' sections as they are."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if marker in text:
        head, _, tail = text.partition(marker)
        nxt = tail.find("\n## ")
        rest = tail[nxt + 1 :] if nxt >= 0 else ""
        # A section ends with one blank line before the next heading, however it was built.
        text = head + (section.rstrip("\n") + "\n\n" if rest else section) + rest
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def finish(result: dict, text: str, write: Path | None, section: str, as_json: bool) -> int:
    """A bench's end: its table on stdout, the same table as its section of ``write``'s
    file, and with ``as_json`` one JSON object as the last line."""
    print(text)
    if write:
        write_section(write, text, section)
        print(f"wrote {write}")
    if as_json:
        print(json.dumps(result))
    return 0


def native_bf16() -> str:
    """The CPU flags that make bf16 matrix products native, or "none" (then emulated)."""
    try:
        flags = next(
            line.split(":", 1)[1].split()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return "unknown"
    found = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return ", ".join(found) or "none"


def policy_flag(policy: str | None) -> str:
    """The ``--policy`` part of a decision bench's command line as its section prints
    it: empty for the default policy."""
    return f" --policy {policy}" if policy else ""
