"""One recording session: the engines up (or given), blocks recorded, progress shown.

``lab corpus record`` without ``--engine`` starts the reference and every candidate
with ``lab vllm`` (all at once: they warm up together and share the cores), with a
context long enough for the corpus's longest prompts, and stops them when done, when
``--minutes`` is up, or on an error. With ``--engine NAME=URL`` it uses engines that
are already running (``ref`` is the reference). Progress goes to stderr, one JSON
line per block, with each engine's prompt and generated tokens per second.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from quantdrift.lab.corpus.families import CorpusPrompt
from quantdrift.lab.corpus.record import REFERENCE, Progress, progress_line, record
from quantdrift.lab.vllm_process import EngineProcess, start_engine, wait_ready
from quantdrift.lab.vllm_server import default_model_dir
from quantdrift.stack import free_port

REFERENCE_VARIANT = "ref-f32"
READY_TIMEOUT_S = 1500.0


def parse_engines(specs: Sequence[str]) -> dict[str, str]:
    """``NAME=URL`` options as a dict; ValueError on a malformed one or without ``ref``."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, url = spec.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--engine {spec!r}: expected NAME=http://HOST:PORT")
        out[name] = url.rstrip("/")
    if out and REFERENCE not in out:
        raise ValueError(f"--engine: the reference must be named {REFERENCE!r}")
    return out


@dataclass
class RecordingSession:
    prompts: Sequence[CorpusPrompt]
    out: Path
    candidates: Sequence[str]
    engines: dict[str, str]
    block: int = 25
    concurrency: int = 12
    minutes: float | None = None
    max_model_len: int = 4608
    # Four engines share the machine's memory: at 2 GB of KV cache each, a long prompt's
    # teacher-forced log-probs (a full-vocabulary row per position) pushed the host into
    # the OOM killer. 1 GB still holds about 46k tokens, ten 4.6k-token requests at once.
    kv_cache_gb: int = 1
    teacher_forcing: str = "vllm"

    def run(self, log: TextIO) -> dict[str, Any]:
        # SIGTERM unwinds like Ctrl-C, so the engines this session started are stopped
        # (a recording stopped from outside must not leave four engines running).
        signal.signal(signal.SIGTERM, _raise_interrupt)
        started: list[EngineProcess] = []
        summary: dict[str, Any] = {"out": str(self.out), "error": None}
        try:
            urls = dict(self.engines) or self._start(started, log, summary)
            missing = [c for c in self.candidates if c not in urls]
            if missing:
                raise ValueError(f"no engine for candidate(s): {', '.join(missing)}")
            # Engines given by URL serve under names of their own (the recorder asks them).
            models = (
                {}
                if self.engines
                else {n: REFERENCE_VARIANT if n == REFERENCE else n for n in urls}
            )
            progress = self._record(urls, models, log)
            summary.update(
                blocks=progress.blocks_done,
                pairs_this_run=progress.pairs,
                prompts_this_run=progress.prompts_done,
                without_tf=progress.without_tf,
                seconds=round(progress.seconds, 1),
                engines=progress.rates(),
            )
        except Exception as exc:  # reported in the summary and the exit code
            while isinstance(exc, ExceptionGroup):  # a block's task group: its first cause
                exc = exc.exceptions[0]
            summary["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            for e in started:
                e.stop()
        return summary

    def _start(
        self, started: list[EngineProcess], log: TextIO, summary: dict[str, Any]
    ) -> dict[str, str]:
        # The engines' logs outlive the run: a recording that failed is read by its logs.
        folder = Path(tempfile.mkdtemp(prefix="qd-corpus-"))
        summary["engine_logs"] = str(folder)
        extra = (
            *("--max-model-len", str(self.max_model_len)),
            *("--kv-cache-gb", str(self.kv_cache_gb)),
        )
        for name in (REFERENCE, *self.candidates):
            variant = REFERENCE_VARIANT if name == REFERENCE else name
            e = start_engine(
                variant,
                free_port(),
                folder,
                READY_TIMEOUT_S,
                extra=extra,
                model_dir=default_model_dir(variant),
            )
            started.append(e)
        t0 = time.monotonic()
        wait_ready(started, READY_TIMEOUT_S + 60)
        log.write(f"corpus: {len(started)} engines ready in {time.monotonic() - t0:.0f}s\n")
        names = (REFERENCE, *self.candidates)
        return {n: e.url for n, e in zip(names, started, strict=True)}

    def _record(self, urls: dict[str, str], models: dict[str, str], log: TextIO) -> Progress:
        total = -(-len(self.prompts) // self.block)
        deadline = None if self.minutes is None else time.monotonic() + self.minutes * 60

        def on_block(progress: Progress, info: dict[str, Any]) -> None:
            log.write("corpus: " + progress_line(progress, info, total) + "\n")
            log.flush()

        return asyncio.run(
            record(
                self.prompts,
                self.out,
                urls,
                models,
                self.candidates,
                block=self.block,
                concurrency=self.concurrency,
                deadline=deadline,
                teacher_forcing=self.teacher_forcing,
                on_block=on_block,
            )
        )


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
