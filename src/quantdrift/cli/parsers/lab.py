"""The flags of ``quantdrift lab`` (what it runs: ``quantdrift.cli.lab``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from quantdrift.cli.common import comma_names, non_negative_int, positive_int
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
    g.set_defaults(func="generate")

    q = lab_sub.add_parser("quality", help="JSON validity and needle recall per variant")
    q.add_argument("pairs", type=Path, help="PairEvent JSONL(.gz)")
    q.add_argument("--json", action="store_true", help="print JSON instead of a table")
    q.set_defaults(func="quality")

    s = lab_sub.add_parser("serve", help="OpenAI-compatible server for one variant")
    s.add_argument("--precision", choices=SERVE_PRECISIONS, required=True)
    s.add_argument("--port", type=positive_int, default=8100)
    s.add_argument("--host", default="127.0.0.1", help="loopback only (127.0.0.1 or localhost)")
    s.add_argument("--threads", type=positive_int, default=None, help="torch threads")
    s.set_defaults(func="serve")

    e = lab_sub.add_parser("export", help="write a variant as a model folder vLLM serves")
    e.add_argument("--variant", choices=EXPORT_VARIANTS, required=True)
    e.add_argument("--out", type=Path, required=True, help="the folder to write")
    e.set_defaults(func="export")

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
    v.set_defaults(func="vllm")
    _register_corpus(lab_sub)


def _variants(text: str) -> list[str]:
    return comma_names(text, VARIANTS, "variant")


def _decodings(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names or any(v not in ("greedy", "sampled") for v in names):
        raise argparse.ArgumentTypeError(f"{text!r}: use greedy, sampled or greedy,sampled")
    return list(dict.fromkeys(names))


def _register_corpus(lab_sub: argparse._SubParsersAction) -> None:
    c = lab_sub.add_parser("corpus", help="the traffic corpus: generate prompts, record pairs")
    c_sub = c.add_subparsers(dest="corpus_command", required=True, parser_class=type(c))
    g = c_sub.add_parser("generate", help="draw the corpus's prompts for a seed (JSONL)")
    g.add_argument("--seed", type=non_negative_int, default=0)
    g.add_argument("--count", type=positive_int, default=3200)
    g.add_argument("--out", type=Path, required=True, help="PROMPTS.jsonl or PROMPTS.jsonl.gz")
    g.set_defaults(func="corpus_generate")
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
    r.set_defaults(func="corpus_record")
    s = c_sub.add_parser(
        "slice", help="a seeded sample of recorded prompts with some labels (the demo's pairs)"
    )
    s.add_argument("--pairs", type=Path, required=True, help="the folder of recorded blocks")
    s.add_argument("--labels", default="int8,int3-g64", help="candidate labels to keep")
    s.add_argument("--prompts", type=positive_int, default=120)
    s.add_argument("--seed", type=non_negative_int, default=0)
    s.add_argument("--out", type=Path, required=True, help="PAIRS.jsonl.xz")
    s.set_defaults(func="corpus_slice")
