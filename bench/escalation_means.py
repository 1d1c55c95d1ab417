"""Escalation means side by side: what one MiniLM pair costs, and what else could do it.

Issue: the tiered scorer escalates to MiniLM for pairs near a decision; if
MiniLM were cheap, the escalation budget would rarely bind. Measured here, in
one run on the same ~200-token pairs (``common.long_pairs``), one thread each:

* ``torch``: the packaged sentence-transformers MiniLM (what the worker runs);
* ``torch-bf16``: the same with bfloat16 weights and arithmetic
  (``embedding.dtype: bfloat16``); fast only where the CPU has native bf16 dot
  products, so the machine's flags are printed beside the table;
* ``onnx-fp32``: the same model exported offline to ONNX (from the packaged
  weights, nothing downloaded) and run by ONNX Runtime;
* ``onnx-int8``: that export with dynamic int8 weight quantization.

Each row: ms per pair, speed-up against torch, the largest cosine difference
against torch, and verdict agreement at the similarity threshold (0.88).

    python bench/escalation_means.py [--pairs 96] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import long_pairs, machine, native_bf16, write_section

THRESHOLD = 0.88
SECTION = "## Escalation means (MiniLM: torch fp32 and bf16, ONNX fp32, ONNX int8)"


def export_onnx(st: Any, out: Path) -> tuple[Path, Path]:
    """ONNX export of MiniLM with mean pooling and normalisation, plus its int8 twin."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    module = st[0].auto_model.eval()
    tok = st[0].tokenizer

    class Pooled(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any, mask: Any, types: Any) -> Any:
            hidden = self.model(input_ids=ids, attention_mask=mask, token_type_ids=types)
            weights = mask.unsqueeze(-1).float()
            pooled = (hidden.last_hidden_state * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    sample = tok(["a b", "c"], padding=True, return_tensors="pt")
    fp32, int8 = out / "minilm.onnx", out / "minilm.int8.onnx"
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(
        Pooled(module),
        (sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]),
        str(fp32),
        input_names=["ids", "mask", "types"],
        output_names=["embedding"],
        dynamic_axes={"ids": axes, "mask": axes, "types": axes, "embedding": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return fp32, int8


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=96)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", type=Path, default=None, help="write/update a section in this file")
    args = ap.parse_args(argv)

    import onnxruntime as ort
    import torch
    from sentence_transformers import SentenceTransformer

    from quantdrift.embedding.minilm import SentenceTransformerEmbedder, resolve_model_path

    torch.set_num_threads(1)
    st = SentenceTransformer(str(resolve_model_path("packaged:all-MiniLM-L6-v2")), device="cpu")
    tok, max_len = st[0].tokenizer, st[0].max_seq_length
    pairs = long_pairs(args.pairs, seed=0)
    texts = [t for p in pairs for t in (p.candidate.text, p.reference.text)]

    def cosines(emb: np.ndarray) -> np.ndarray:
        return np.sum(emb[0::2] * emb[1::2], axis=1)

    started = time.perf_counter()
    base = st.encode(texts, batch_size=args.batch, normalize_embeddings=True, convert_to_numpy=True)
    rows = [{"means": "torch", "ms_per_pair": (time.perf_counter() - started) / len(pairs) * 1e3}]
    base_cos = cosines(base)

    def agreement(name: str, cos: np.ndarray, elapsed: float) -> dict[str, Any]:
        return {
            "means": name,
            "ms_per_pair": elapsed / len(pairs) * 1e3,
            "max_abs_cosine_diff": float(np.max(np.abs(cos - base_cos))),
            "verdict_agreement": float(np.mean((cos < THRESHOLD) == (base_cos < THRESHOLD))),
        }

    bf16 = SentenceTransformerEmbedder(batch_size=args.batch, cache_size=0, dtype="bfloat16")
    bf16.embed(texts[:2])  # the first call pays for oneDNN's kernel selection
    started = time.perf_counter()
    rows.append(agreement("torch-bf16", cosines(bf16.embed(texts)), time.perf_counter() - started))
    with tempfile.TemporaryDirectory() as tmp:
        paths = export_onnx(st, Path(tmp))
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        for name, path in zip(("onnx-fp32", "onnx-int8"), paths, strict=True):
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            started = time.perf_counter()
            chunks = []
            for i in range(0, len(texts), args.batch):
                enc = tok(
                    texts[i : i + args.batch],
                    padding=True,
                    truncation=True,
                    max_length=max_len,
                    return_tensors="np",
                )
                feed = {
                    "ids": enc["input_ids"].astype(np.int64),
                    "mask": enc["attention_mask"].astype(np.int64),
                    "types": enc["token_type_ids"].astype(np.int64),
                }
                chunks.append(session.run(None, feed)[0])
            elapsed = time.perf_counter() - started
            row = agreement(name, cosines(np.concatenate(chunks)), elapsed)
            rows.append({**row, "model_mb": round(path.stat().st_size / 1e6, 1)})
    torch_ms = rows[0]["ms_per_pair"]
    for row in rows:
        row["speedup_vs_torch"] = round(torch_ms / row["ms_per_pair"], 2)
        row["ms_per_pair"] = round(row["ms_per_pair"], 1)
    lines = [
        SECTION,
        "",
        f"`python bench/escalation_means.py --pairs {len(pairs)}`: one MiniLM pair "
        "(candidate + reference, ~200 tokens each), one thread, batches of "
        f"{args.batch}. Agreement: the same side of the {THRESHOLD} similarity bar as torch. "
        f"CPU: {machine()['cpu']}; native bf16 dot products: {native_bf16()}.",
        "",
        "| means | ms / pair | × torch | max abs cosine diff | verdict agreement |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['means']} | {r['ms_per_pair']} | {r['speedup_vs_torch']} "
            f"| {r.get('max_abs_cosine_diff', 0):.4f} | {r.get('verdict_agreement', 1.0):.4f} |"
        )
    text = "\n".join([*lines, ""])
    print(text)
    if args.write:
        write_section(args.write, text, SECTION)
    if args.json:
        print(json.dumps({"bench": "escalation_means", "pairs": len(pairs), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
