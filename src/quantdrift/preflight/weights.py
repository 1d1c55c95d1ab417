"""Checkpoint inspection: ``salient-weights`` and ``fp8-scales``.

Reading, not loading: a safetensors header is 8 bytes of length plus JSON, so
dtypes and shapes of a 70B checkpoint come back in milliseconds; GGUF tensor
types come from ``gguf.GGUFReader`` (memory-mapped). Only the scale scan reads
tensor values, and only of the (small) scale tensors.

Why these rules: the quality of a low-bit model hangs on a few places —
embeddings, ``lm_head`` and the outlier-heavy layers (massive activations sit
in the first and last blocks' MLP down projections: Sun et al., 2024;
AWQ's salient channels, Lin et al., 2024). A checkpoint that rounds those to
4 bits is a different model from the one that was evaluated. And one zero,
NaN or absurd FP8 scale silently zeroes or blows up a whole channel.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quantdrift.errors import ConfigError

# Bits per element of safetensors dtypes (packed ints are resolved from the config).
_DTYPE_BITS = {
    "F64": 64,
    "F32": 32,
    "F16": 16,
    "BF16": 16,
    "I64": 64,
    "I32": 32,
    "I16": 16,
    "I8": 8,
    "U8": 8,
    "BOOL": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
_EMBED = re.compile(r"(embed_tokens|token_embd|wte|word_embeddings|tok_embeddings)")
_HEAD = re.compile(r"(^|\.)(lm_head|output)\.weight$|(^|\.)lm_head(\.|$)")
_BLOCK = re.compile(r"(?:^|\.)(?:layers|blk|h|block)\.(\d+)\.")
_DOWN = re.compile(r"(mlp\.down_proj|ffn_down|mlp\.c_proj|fc2|w2)")
# Quantized-weight companions: metadata, not parameters.
_QMETA = (".scales", ".qzeros", ".g_idx", "_scale", ".scale", "_scale_inv", "_zero_point")
SCALE_SUFFIXES = ("_scale", ".scale", "_scales", ".scales", "_scale_inv")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    kind: str  # dtype or GGML type name
    bits: float
    params: int


@dataclass(slots=True)
class Inspection:
    format: str  # "gguf", "safetensors"
    tensors: list[TensorInfo]
    quantization_config: dict[str, Any] = field(default_factory=dict)
    not_converted: list[str] = field(default_factory=list)


# -- reading -------------------------------------------------------------------------


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (name -> dtype, shape, offsets)."""
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                raise ConfigError(f"{path}: not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n))
    except (OSError, struct.error, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read safetensors header: {exc}") from exc
    header.pop("__metadata__", None)
    return dict(header)


def safetensors_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{path}: no .safetensors files")
    return files


def ggml_bits(type_name: str) -> float:
    """Nominal bits per weight of a GGML tensor type (Q4_1 -> 4, IQ3_XXS -> 3, F16 -> 16).

    >>> ggml_bits("Q8_0"), ggml_bits("F32"), ggml_bits("IQ2_XS"), ggml_bits("BF16")
    (8.0, 32.0, 2.0, 16.0)
    """
    name = type_name.upper()
    if name in ("F32", "F64", "F16", "BF16", "I8", "I16", "I32", "I64"):
        return float(re.sub(r"\D", "", name))
    m = re.match(r"^T?I?Q(\d)", name)
    return float(m.group(1)) if m else 32.0


def inspect_gguf(path: Path) -> Inspection:
    try:
        # Deferred: gguf is the lab extra; only a GGUF checkpoint needs it.
        from gguf import GGUFReader
    except ImportError as exc:  # the lab extra brings it
        raise ConfigError("inspecting GGUF needs the 'gguf' package (pip install gguf)") from exc
    reader = GGUFReader(str(path))
    tensors = [
        TensorInfo(t.name, t.tensor_type.name, ggml_bits(t.tensor_type.name), int(t.n_elements))
        for t in reader.tensors
    ]
    return Inspection("gguf", tensors)


def quant_bits(qc: dict[str, Any]) -> float | None:
    """Weight bits a ``quantization_config`` declares (GPTQ/AWQ ``bits``, compressed-tensors,
    FP8 methods); None when it does not say."""
    for key in ("bits", "w_bit", "weight_bits"):
        if isinstance(qc.get(key), int | float):
            return float(qc[key])
    for group in (qc.get("config_groups") or {}).values():
        weights = group.get("weights") if isinstance(group, dict) else None
        if isinstance(weights, dict) and isinstance(weights.get("num_bits"), int):
            return float(weights["num_bits"])
    if "fp8" in str(qc.get("quant_method", "")).lower():
        return 8.0
    return None


def tensor_infos(header: dict[str, Any], qc: dict[str, Any] | None = None) -> list[TensorInfo]:
    """Parameters of a safetensors header, packed integer weights unpacked with the config.

    GPTQ/AWQ store ``qweight`` as int32 holding 32/bits weights each; their
    ``scales``/``qzeros``/``g_idx`` and FP8 ``*_scale`` are metadata, not parameters.
    """
    bits_cfg = quant_bits(qc or {})
    out = []
    for name, meta in header.items():
        if name.endswith(_QMETA):
            continue
        dtype = str(meta.get("dtype", "?"))
        numel = math.prod(int(d) for d in meta.get("shape", [])) or 1
        bits = float(_DTYPE_BITS.get(dtype, 32))
        if name.endswith(".qweight") and bits_cfg:
            numel = int(numel * bits / bits_cfg)
            bits = bits_cfg
        out.append(TensorInfo(name, dtype, bits, numel))
    return out


def inspect_safetensors(path: Path) -> Inspection:
    """A safetensors file or a Hugging Face directory (config.json + shards)."""
    qc: dict[str, Any] = {}
    cfg_file = (path if path.is_dir() else path.parent) / "config.json"
    if cfg_file.is_file():
        try:
            qc = dict(json.loads(cfg_file.read_text()).get("quantization_config") or {})
        except ValueError as exc:
            raise ConfigError(f"{cfg_file}: invalid JSON: {exc}") from exc
    tensors: list[TensorInfo] = []
    for f in safetensors_files(path):
        tensors.extend(tensor_infos(safetensors_header(f), qc))
    not_converted = [
        str(m)
        for key in ("modules_to_not_convert", "ignore", "modules_not_to_convert")
        for m in (qc.get(key) or [])
    ]
    return Inspection("safetensors", tensors, qc, not_converted)


def inspect(path: Path) -> Inspection:
    if not path.exists():
        raise ConfigError(f"checkpoint not found: {path}")
    if path.suffix == ".gguf":
        return inspect_gguf(path)
    if path.is_dir() and not list(path.glob("*.safetensors")):
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return inspect_gguf(ggufs[0])
    return inspect_safetensors(path)


# -- salient weights (pure) ----------------------------------------------------------


def edge_down_projections(names: Iterable[str]) -> list[str]:
    """The MLP down projections of the first and last block (where outliers live)."""
    by_block: dict[int, list[str]] = {}
    for n in names:
        m = _BLOCK.search(n)
        if m and _DOWN.search(n):
            by_block.setdefault(int(m.group(1)), []).append(n)
    if not by_block:
        return []
    edges = {min(by_block), max(by_block)}
    return sorted(n for b in edges for n in by_block[b])


@dataclass(frozen=True, slots=True)
class SalientResult:
    ok: bool
    why: str
    measured: dict[str, Any]
    low: list[str]  # protected tensors below min_bits


def salient(
    insp: Inspection,
    min_bits: float = 8.0,
    outlier_patterns: Sequence[str] | None = None,
    min_share_high: float = 0.0,
) -> SalientResult:
    """Are embeddings, ``lm_head`` and outlier-heavy layers kept at >= ``min_bits``?

    ``outlier_patterns`` are regexes of tensor names; None = the first and last
    blocks' MLP down projections. A tied ``lm_head`` (no tensor of its own)
    shares the embeddings' precision.
    """
    names = [t.name for t in insp.tensors]
    total = sum(t.params for t in insp.tensors) or 1
    high = sum(t.params for t in insp.tensors if t.bits >= min_bits)
    embeds = [t for t in insp.tensors if _EMBED.search(t.name)]
    heads = [t for t in insp.tensors if _HEAD.search(t.name) and not _EMBED.search(t.name)]
    if outlier_patterns is None:
        outlier_names = set(edge_down_projections(names))
    else:
        rx = [re.compile(p) for p in outlier_patterns]
        outlier_names = {n for n in names if any(r.search(n) for r in rx)}
    outliers = [t for t in insp.tensors if t.name in outlier_names]

    def precision(ts: list[TensorInfo]) -> dict[str, float]:
        return {t.name: t.bits for t in ts}

    low = [t.name for t in (*embeds, *heads, *outliers) if t.bits < min_bits]
    problems = []
    if not embeds:
        problems.append("no embedding tensor found")
    if low:
        problems.append(
            f"{len(low)} protected tensors below {min_bits:g} bits: {', '.join(low[:4])}"
        )
    share = high / total
    if share < min_share_high:
        problems.append(f"share at >= {min_bits:g} bits {share:.1%} < {min_share_high:.0%}")
    measured = {
        "format": insp.format,
        "params": total,
        "share_high_precision": round(share, 4),
        "embeddings": precision(embeds),
        "lm_head": precision(heads) or "tied to embeddings",
        "outlier_layers": precision(outliers),
        "types": _type_shares(insp.tensors, total),
        "quant_bits": quant_bits(insp.quantization_config),
        "group_size": insp.quantization_config.get("group_size"),
        "quant_method": insp.quantization_config.get("quant_method"),
        "modules_not_converted": insp.not_converted,
    }
    if problems:
        return SalientResult(False, "; ".join(problems), measured, low)
    return SalientResult(
        True,
        f"embeddings, lm_head and {len(outliers)} outlier layers at >= {min_bits:g} bits",
        measured,
        [],
    )


def _type_shares(tensors: Sequence[TensorInfo], total: int) -> dict[str, float]:
    by: dict[str, int] = {}
    for t in tensors:
        by[t.kind] = by.get(t.kind, 0) + t.params
    return {k: round(v / total, 4) for k, v in sorted(by.items(), key=lambda kv: -kv[1])}


# -- FP8 / static scales ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScaleStats:
    name: str
    count: int
    zeros: int
    nans: int
    infs: int
    below: int  # finite, non-zero, < lo
    above: int  # finite, > hi
    min: float | None
    max: float | None

    @property
    def bad(self) -> int:
        return self.zeros + self.nans + self.infs + self.below + self.above


def scale_stats(name: str, values: Any, lo: float = 1e-4, hi: float = 1e4) -> ScaleStats:
    """Count out-of-range scales in one tensor (numpy array or anything ``np.asarray`` takes).

    Magnitudes are checked (a negative scale is as wrong as a zero one, so it
    counts as below range).
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    nan = np.isnan(v)
    inf = np.isinf(v)
    finite = v[~nan & ~inf]
    zero = finite == 0
    nonzero = finite[~zero]
    below = int(np.sum(nonzero < lo))
    above = int(np.sum(nonzero > hi))
    return ScaleStats(
        name,
        int(v.size),
        int(zero.sum()),
        int(nan.sum()),
        int(inf.sum()),
        below,
        above,
        float(finite.min()) if finite.size else None,
        float(finite.max()) if finite.size else None,
    )


def is_scale_tensor(name: str) -> bool:
    """``weight_scale``, ``input_scale``, ``k_scale``, ``*.scales``, ``weight_scale_inv``...

    >>> is_scale_tensor("model.layers.0.mlp.down_proj.weight_scale"), is_scale_tensor("x.weight")
    (True, False)
    """
    return name.endswith(SCALE_SUFFIXES)


def scan_scales(path: Path, lo: float = 1e-4, hi: float = 1e4) -> list[ScaleStats]:
    """Read every scale tensor of a safetensors checkpoint and check its values."""
    # Deferred: read only for a safetensors checkpoint.
    from safetensors import safe_open

    out = []
    for f in safetensors_files(path):
        header = safetensors_header(f)
        names = [n for n in header if is_scale_tensor(n)]
        if not names:
            continue
        # torch reads every dtype (bf16, fp8) that numpy cannot; upcast to float32.
        with safe_open(str(f), framework="pt") as st:
            for n in names:
                tensor = st.get_tensor(n).to(dtype=_torch_float32())
                out.append(scale_stats(n, tensor.numpy(), lo, hi))
    return out


def _torch_float32() -> Any:
    # Deferred: torch (seconds to import) only for a bf16/fp8 scale tensor.
    import torch

    return torch.float32
