"""``quantdrift lab ...``: record real pairs from SmolLM2-135M and its RTN-quantized variants.

* ``lab generate --variants int8,int4-g64,int2-g64 --out PAIRS.jsonl[.gz]`` writes PairEvents
  (shadow pairs per variant, plus ``--noise-pairs`` reference-vs-reference pairs).
* ``lab quality PAIRS`` prints JSON validity and needle recall per variant.
* ``lab serve --precision VARIANT`` serves one variant over an OpenAI-compatible API.
* ``lab export --variant VARIANT --out DIR`` writes a model folder vLLM serves.
* ``lab vllm --variant VARIANT --port P`` serves one variant from a real vLLM engine
  (the ``.venv-vllm`` that ``make vllm`` builds), exporting it first if needed.
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import sys
import time

from quantdrift.cli.progress import enabled as progress_enabled
from quantdrift.data.prompts import PROMPTS
from quantdrift.errors import ConfigError
from quantdrift.lab import model as lab_model
from quantdrift.lab.corpus import build
from quantdrift.lab.corpus.session import RecordingSession, parse_engines
from quantdrift.lab.export import export as write
from quantdrift.lab.generate import LabConfig, open_sink, run_lab
from quantdrift.lab.quality import format_table, quality_by_variant
from quantdrift.lab.server import serve as run_server
from quantdrift.lab.vllm_server import (
    VllmServer,
    default_model_dir,
    find_python,
    has_int4_kernel,
    needs_int4_kernel,
)
from quantdrift.services.corpus_eval import corpus_slice as pick
from quantdrift.services.pairs import read_pairs


def generate(args: argparse.Namespace) -> int:
    if args.prompts is not None and args.prompts > len(PROMPTS):
        sys.stderr.write(f"quantdrift: error: --prompts must be <= {len(PROMPTS)}\n")
        return 2
    if args.first_prompt >= (args.prompts or len(PROMPTS)):
        sys.stderr.write("quantdrift: error: --first-prompt must be below --prompts\n")
        return 2
    # Progress lines on a terminal only; the JSON on stdout carries the timings anyway.
    log = sys.stderr if progress_enabled(not args.no_progress) else io.StringIO()
    t0 = time.perf_counter()
    model, tokenizer = lab_model.load(threads=args.threads)
    load_s = time.perf_counter() - t0
    log.write(f"lab: loaded {lab_model.MODEL_NAME} in {load_s:.1f}s\n")
    cfg = LabConfig(
        variants=args.variants,
        prompts=args.prompts or len(PROMPTS),
        max_new_tokens=args.max_new_tokens,
        decodings=tuple(args.decoding),
        noise_pairs=args.noise_pairs,
        seed=args.seed,
        batch_size=args.batch_size,
        first_prompt=args.first_prompt,
    )
    with open_sink(args.out) as sink:
        stats = run_lab(model, tokenizer, cfg, sink, log=log)
    stats["load_s"] = round(load_s, 1)
    stats["total_s"] = round(time.perf_counter() - t0, 1)
    stats["out"] = str(args.out)
    print(json.dumps(stats))
    return 0


def quality(args: argparse.Namespace) -> int:
    if not args.pairs.exists():
        sys.stderr.write(f"quantdrift: error: no such file: {args.pairs}\n")
        return 2
    rows = quality_by_variant(read_pairs(args.pairs))
    if args.json:
        print(json.dumps([r.as_dict() for r in rows]))
    else:
        print(format_table(rows))
    return 0


def serve(args: argparse.Namespace) -> int:
    if args.host not in ("127.0.0.1", "localhost"):
        sys.stderr.write("quantdrift: error: --host must be 127.0.0.1 (loopback only)\n")
        return 2
    run_server(args.precision, host=args.host, port=args.port, threads=args.threads)
    return 0


def export(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    model, tokenizer = lab_model.load()
    info = write(args.variant, args.out, model, tokenizer)
    info["out"] = str(args.out)
    info["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(info))
    return 0


def vllm(args: argparse.Namespace) -> int:
    python = find_python(args.python)
    if python is None:
        sys.stderr.write(
            "quantdrift: error: no vLLM python: run `make vllm` (builds .venv-vllm) "
            "or pass --python / set QUANTDRIFT_VLLM_PYTHON\n"
        )
        return 2
    if needs_int4_kernel(args.variant) and not has_int4_kernel(python):
        sys.stderr.write(
            f"quantdrift: error: {args.variant} needs vLLM's int4 (W4A16) CPU kernel, which "
            "this vLLM build has only for CPUs with AVX-512, and this CPU has none: serve "
            "int4-g64 (the same int4 weights, dequantized) instead\n"
        )
        return 2
    model_dir = args.model_dir or default_model_dir(args.variant)
    server = VllmServer(
        variant=args.variant,
        model_dir=model_dir,
        python=python,
        host=args.host,
        port=args.port,
        kv_cache_gb=args.kv_cache_gb,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        threads=args.threads,
        dtype=args.dtype,
    )
    return server.run(ready_timeout_s=args.ready_timeout)


def corpus_generate(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    prompts = list(build.generate(args.seed, args.count, build.tokenizer_measure()))
    build.save(args.out, prompts)
    info = build.census(prompts)
    info.update(seed=args.seed, out=str(args.out), seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(info, ensure_ascii=False))
    return 0


def corpus_record(args: argparse.Namespace) -> int:
    if not args.prompts.exists():
        sys.stderr.write(f"quantdrift: error: no such file: {args.prompts}\n")
        return 2
    try:
        engines = parse_engines(args.engine)
    except ValueError as exc:
        sys.stderr.write(f"quantdrift: error: {exc}\n")
        return 2
    prompts = build.load(args.prompts)
    if args.limit is not None:
        prompts = prompts[: args.limit]
    session = RecordingSession(
        prompts=prompts,
        out=args.out,
        candidates=[v for v in args.variants.split(",") if v],
        engines=engines,
        block=args.block,
        concurrency=args.concurrency,
        minutes=args.minutes,
        max_model_len=args.max_model_len,
        kv_cache_gb=args.kv_cache_gb,
        teacher_forcing=args.teacher_forcing,
    )
    summary = session.run(log=sys.stderr)
    print(json.dumps(summary))
    return 0 if summary.get("error") is None else 1


def corpus_slice(args: argparse.Namespace) -> int:
    if not args.pairs.exists():
        raise ConfigError(f"no such folder: {args.pairs}")
    labels = [v for v in args.labels.split(",") if v]
    kept = pick(read_pairs(args.pairs), labels, args.prompts, args.seed)
    lines = b"".join(p.model_dump_json(exclude_none=True).encode() + b"\n" for p in kept)
    # xz holds no timestamp: the same slice gives the same bytes, so a regenerated file is
    # no diff.
    args.out.write_bytes(lzma.compress(lines, preset=9))
    print(json.dumps({"out": str(args.out), "prompts": args.prompts, "pairs": len(kept)}))
    return 0
