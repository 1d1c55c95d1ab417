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
import sys
import time
from pathlib import Path

from quantdrift.cli.common import comma_names, non_negative_int, positive_int
from quantdrift.cli.progress import enabled as progress_enabled
from quantdrift.lab.variants import EXPORT_VARIANTS, VARIANTS  # names only: no torch

SERVE_PRECISIONS = ("ref-f32", *VARIANTS)


def register(sub: argparse._SubParsersAction) -> None:
    lab = sub.add_parser("lab")
    lab_sub = lab.add_subparsers(dest="lab_command", required=True, parser_class=type(lab))

    g = lab_sub.add_parser("generate", help="record shadow and noise PairEvents to JSONL")
    g.add_argument(
        "--variants",
        type=_variants,
        default=["int8", "int4-g64", "int2-g64"],
        help=f"comma-separated, from {', '.join(VARIANTS)}",
    )
    g.add_argument("--out", type=Path, required=True, help="PAIRS.jsonl or PAIRS.jsonl.gz")
    g.add_argument("--prompts", type=positive_int, default=None, help="first N prompts (max 40)")
    g.add_argument(
        "--first-prompt",
        type=non_negative_int,
        default=0,
        help="skip the first N prompts (extend a recorded set; ids and seeds stay absolute)",
    )
    g.add_argument("--max-new-tokens", type=positive_int, default=80)
    g.add_argument(
        "--decoding",
        type=_decodings,
        default=["greedy", "sampled"],
        help="comma-separated: greedy, sampled",
    )
    g.add_argument("--noise-pairs", type=non_negative_int, default=0)
    g.add_argument("--seed", type=non_negative_int, default=0)
    g.add_argument("--batch-size", type=positive_int, default=10)
    g.add_argument("--threads", type=positive_int, default=None, help="torch threads")
    g.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    g.set_defaults(func=generate)

    q = lab_sub.add_parser("quality", help="JSON validity and needle recall per variant")
    q.add_argument("pairs", type=Path, help="PairEvent JSONL(.gz)")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.set_defaults(func=quality)

    s = lab_sub.add_parser("serve", help="OpenAI-compatible server for one variant")
    s.add_argument("--precision", choices=SERVE_PRECISIONS, required=True)
    s.add_argument("--port", type=positive_int, default=8100)
    s.add_argument("--host", default="127.0.0.1", help="loopback only (127.0.0.1 or localhost)")
    s.add_argument("--threads", type=positive_int, default=None, help="torch threads")
    s.set_defaults(func=serve)

    e = lab_sub.add_parser("export", help="write a variant as a model folder vLLM serves")
    e.add_argument("--variant", choices=EXPORT_VARIANTS, required=True)
    e.add_argument("--out", type=Path, required=True, help="the folder to write")
    e.set_defaults(func=export)

    v = lab_sub.add_parser("vllm", help="serve a variant from a real vLLM engine (.venv-vllm)")
    v.add_argument("--variant", choices=EXPORT_VARIANTS, required=True)
    v.add_argument("--port", type=positive_int, default=8000)
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="the exported folder (default: ~/.cache/quantdrift/vllm-models/VARIANT)",
    )
    v.add_argument(
        "--python",
        type=Path,
        default=None,
        help="vLLM's python (default: $QUANTDRIFT_VLLM_PYTHON or .venv-vllm/bin/python)",
    )
    v.add_argument("--kv-cache-gb", type=positive_int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    v.add_argument("--max-model-len", type=positive_int, default=2048)
    v.add_argument("--max-num-seqs", type=positive_int, default=16)
    v.add_argument("--threads", type=positive_int, default=1, help="OMP_NUM_THREADS of the engine")
    v.add_argument(
        "--dtype",
        choices=("bfloat16", "float32"),
        default=None,
        help="the engine's dtype (default: bfloat16 with AVX-512, float32 on an AVX2-only CPU)",
    )
    v.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for ready")
    v.set_defaults(func=vllm)
    _register_corpus(lab_sub)


def _variants(text: str) -> list[str]:
    return comma_names(text, VARIANTS, "variant")


def _decodings(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names or any(v not in ("greedy", "sampled") for v in names):
        raise argparse.ArgumentTypeError(f"{text!r}: use greedy, sampled or greedy,sampled")
    return list(dict.fromkeys(names))


def generate(args: argparse.Namespace) -> int:
    from quantdrift.data.prompts import PROMPTS
    from quantdrift.lab import model as lab_model
    from quantdrift.lab.generate import LabConfig, open_sink, run_lab

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
    from quantdrift.lab.quality import format_table, quality_by_variant
    from quantdrift.services.pairs import read_pairs

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
    from quantdrift.lab.server import serve as run_server

    run_server(args.precision, host=args.host, port=args.port, threads=args.threads)
    return 0


def export(args: argparse.Namespace) -> int:
    from quantdrift.lab import model as lab_model
    from quantdrift.lab.export import export as write

    t0 = time.perf_counter()
    model, tokenizer = lab_model.load()
    info = write(args.variant, args.out, model, tokenizer)
    info["out"] = str(args.out)
    info["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(info))
    return 0


def vllm(args: argparse.Namespace) -> int:
    from quantdrift.lab.vllm_server import (
        VllmServer,
        default_model_dir,
        find_python,
        has_int4_kernel,
        needs_int4_kernel,
    )

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


def _register_corpus(lab_sub: argparse._SubParsersAction) -> None:
    c = lab_sub.add_parser("corpus", help="the traffic corpus: generate prompts, record pairs")
    c_sub = c.add_subparsers(dest="corpus_command", required=True, parser_class=type(c))
    g = c_sub.add_parser("generate", help="draw the corpus's prompts for a seed (JSONL)")
    g.add_argument("--seed", type=non_negative_int, default=0)
    g.add_argument("--count", type=positive_int, default=3200)
    g.add_argument("--out", type=Path, required=True, help="PROMPTS.jsonl or PROMPTS.jsonl.gz")
    g.set_defaults(func=corpus_generate)
    r = c_sub.add_parser(
        "record", help="record the corpus on vLLM engines, resumably (blocks under --out)"
    )
    r.add_argument("--prompts", type=Path, required=True, help="from `lab corpus generate`")
    r.add_argument("--out", type=Path, required=True, help="the folder of recorded blocks")
    r.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a running engine (repeat; `ref` is the reference); none: start them with lab vllm",
    )
    r.add_argument("--variants", default="int8,int4-g64-gptq,int3-g64", help="the candidates")
    r.add_argument("--block", type=positive_int, default=25, help="prompts per resumable block")
    r.add_argument("--concurrency", type=positive_int, default=12)
    r.add_argument("--limit", type=positive_int, default=None, help="the first N prompts only")
    r.add_argument("--minutes", type=float, default=None, help="start no block after this")
    r.add_argument("--max-model-len", type=positive_int, default=4608)
    r.add_argument(
        "--kv-cache-gb", type=positive_int, default=1, help="each engine's VLLM_CPU_KVCACHE_SPACE"
    )
    r.add_argument(
        "--teacher-forcing",
        choices=("vllm", "lab"),
        default="vllm",
        help="how the reference teacher-forces (lab: `lab serve` engines given by --engine)",
    )
    r.set_defaults(func=corpus_record)
    s = c_sub.add_parser(
        "slice", help="a seeded sample of recorded prompts with some labels (the demo's pairs)"
    )
    s.add_argument("--pairs", type=Path, required=True, help="the folder of recorded blocks")
    s.add_argument("--labels", default="int8,int3-g64", help="candidate labels to keep")
    s.add_argument("--prompts", type=positive_int, default=120)
    s.add_argument("--seed", type=non_negative_int, default=0)
    s.add_argument("--out", type=Path, required=True, help="PAIRS.jsonl.xz")
    s.set_defaults(func=corpus_slice)


def corpus_generate(args: argparse.Namespace) -> int:
    from quantdrift.lab.corpus import build

    t0 = time.perf_counter()
    prompts = list(build.generate(args.seed, args.count, build.tokenizer_measure()))
    build.save(args.out, prompts)
    info = build.census(prompts)
    info.update(seed=args.seed, out=str(args.out), seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(info, ensure_ascii=False))
    return 0


def corpus_record(args: argparse.Namespace) -> int:
    from quantdrift.lab.corpus import build
    from quantdrift.lab.corpus.session import RecordingSession, parse_engines

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
    import lzma

    from quantdrift.errors import ConfigError
    from quantdrift.services.corpus_eval import corpus_slice as pick
    from quantdrift.services.pairs import read_pairs

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
