"""Round-to-nearest fake quantization of a model's linear layers.

Scheme: **asymmetric min-max** (a scale and an integer zero point per group),
quantize then dequantize in place, so the float model computes exactly what
an RTN-quantized kernel would. ``int8`` is per output channel (one group per
row); the low-bit variants are group-wise along the input dimension.

Only the transformer blocks' linear layers are touched (attention q/k/v/o,
MLP gate/up/down); embeddings and the tied ``lm_head`` stay in float, as in
the usual W4A16 / W8A16 recipes.
"""

from __future__ import annotations

import torch

from quantdrift.lab.variants import VARIANTS, QuantSpec, variant

__all__ = ["TARGET_SUFFIXES", "VARIANTS", "QuantSpec", "fake_quant", "quantize_model", "variant"]

# Module-name suffixes of the linear layers we quantize (Llama-family naming).
TARGET_SUFFIXES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def fake_quant(weight: torch.Tensor, bits: int, group_size: int | None) -> torch.Tensor:
    """RTN-quantize a 2-D weight (out, in) and dequantize it; same shape and dtype.

    Asymmetric min-max per group: ``scale = (max - min) / (2**bits - 1)``,
    ``zero = round(-min / scale)``, ``q = clamp(round(w / scale) + zero, 0, 2**bits - 1)``.
    """
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    out_features, in_features = weight.shape
    group = in_features if group_size is None else group_size
    if group < 1:
        raise ValueError(f"group size must be >= 1, got {group}")
    # A last, shorter group when ``group`` does not divide the row (SmolLM2's 576 with g128):
    # zero padding is exact here, because the grid always spans 0 (lo <= 0 <= hi).
    padded = -(-in_features // group) * group
    w = weight.detach().to(torch.float32)
    if padded != in_features:
        w = torch.nn.functional.pad(w, (0, padded - in_features))
    w = w.reshape(out_features, padded // group, group)
    lo = w.amin(dim=-1, keepdim=True).clamp(max=0.0)  # keep 0 exactly representable
    hi = w.amax(dim=-1, keepdim=True).clamp(min=0.0)
    qmax = 2**bits - 1
    scale = ((hi - lo) / qmax).clamp(min=1e-8)
    zero = torch.round(-lo / scale)
    q = torch.clamp(torch.round(w / scale) + zero, 0, qmax)
    deq = ((q - zero) * scale).reshape(out_features, padded)[:, :in_features]
    return deq.contiguous().to(weight.dtype)


def quantize_model(model: torch.nn.Module, spec: QuantSpec) -> list[str]:
    """Fake-quantize the target linear layers of ``model`` in place; the names touched."""
    touched = []
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.endswith(TARGET_SUFFIXES):
                module.weight.copy_(fake_quant(module.weight, spec.bits, spec.group_size))
                touched.append(name)
    return touched
