"""Write a lab variant as a model folder a serving engine (vLLM) loads.

Two kinds of folder:

* **dequantized** (``ref-f32`` and every RTN variant, ``int8`` ... ``int2-g64``):
  the state dict in bf16 after ``quant.quantize_model``, so the engine computes
  what an RTN kernel would, through its ordinary bf16 path;
* **GPTQ W4A16** (``int4-g64-gptq``): round-to-nearest int4, groups of 64, packed
  in the GPTQ checkpoint layout (``qweight``/``qzeros``/``scales``), which the
  engine runs through its own quantized kernel (on CPU: ``CPUWNA16``). The grid is
  *symmetric* (``sym: true``), unlike the lab's asymmetric ``int4-g64``: vLLM's
  GPTQ path has no zero-point kernel on CPU. ``desc_act: false``, v1 layout.

In both, ``lm_head.weight`` is left out (SmolLM2 ties it to the embeddings),
``config.json`` has no ``quantization_config`` of the GGUF the lab loads from,
and the tokenizer files carry the chat template. ``transformers``'
``save_pretrained`` refuses a GGUF-loaded model, hence the hand-written folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from quantdrift.lab.quant import TARGET_SUFFIXES, VARIANTS, QuantSpec, quantize_model
from quantdrift.lab.variants import EXPORT_VARIANTS, GPTQ_VARIANTS

END_OF_TURN = "<|im_end|>"
STAMP = "quantdrift-export.json"


def is_exported(out: Path, name: str) -> bool:
    """True when ``out`` holds a finished export of ``name`` (the stamp is written last)."""
    try:
        return json.loads((out / STAMP).read_text()).get("variant") == name
    except (OSError, ValueError):
        return False


def export(name: str, out: Path, model: Any, tokenizer: Any) -> dict[str, Any]:
    """Write variant ``name`` of the float ``model`` (modified in place) to ``out``."""
    # Deferred: safetensors' torch writer only when a folder is written.
    from safetensors.torch import save_file

    if name not in EXPORT_VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(EXPORT_VARIANTS)}")
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)
    config = _config(model)
    if name in GPTQ_VARIANTS:
        spec = GPTQ_VARIANTS[name]
        tensors = gptq_state_dict(model, spec)
        config["quantization_config"] = {
            "quant_method": "gptq",
            "bits": spec.bits,
            "group_size": spec.group_size,
            "desc_act": False,
            "sym": True,
            "checkpoint_format": "gptq",
        }
    else:
        if name in VARIANTS:
            quantize_model(model, VARIANTS[name])
        tensors = {
            k: v.detach().to(torch.bfloat16).contiguous()
            for k, v in model.state_dict().items()
            if k != "lm_head.weight"
        }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config.get("bos_token_id"), "eos_token_id": _eot(tokenizer)})
    )
    # The GGUF's tokenizer names <|im_start|> as eos; a turn ends on <|im_end|>.
    tokenizer.eos_token = END_OF_TURN
    tokenizer.save_pretrained(str(out))
    info = {"variant": name, "tensors": len(tensors), "format": _format(name)}
    (out / STAMP).write_text(json.dumps(info))
    return info


def _format(name: str) -> str:
    return "gptq-w4a16" if name in GPTQ_VARIANTS else "bf16-dequantized"


def _eot(tokenizer: Any) -> int:
    return int(tokenizer.convert_tokens_to_ids(END_OF_TURN))


def _config(model: Any) -> dict[str, Any]:
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("dtype", None)
    config["torch_dtype"] = "bfloat16"
    config["architectures"] = ["LlamaForCausalLM"]
    config["tie_word_embeddings"] = True
    return config


# --- GPTQ packing ---------------------------------------------------------------------


def rtn_symmetric(weight: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [out, in] in 0..2**bits-1, scale [out, groups]): symmetric RTN, GPTQ's grid.

    vLLM runs GPTQ through its CPU WNA16 kernel only when ``sym: true`` (type
    ``uint4b8``: ``w = (q - 8) * scale``); the lab's asymmetric min-max grid has no
    kernel there. The grid is AutoGPTQ's: ``scale = 2 * absmax / (2**bits - 1)``,
    zero point ``2**(bits-1)``. ``group`` must divide the row (no short last group).
    """
    out_features, in_features = weight.shape
    if in_features % group:
        raise ValueError(f"group {group} does not divide {in_features} input features")
    w = weight.detach().to(torch.float32).reshape(out_features, in_features // group, group)
    qmax = 2**bits - 1
    absmax = w.abs().amax(dim=-1, keepdim=True)
    # fp16 scales, as the checkpoint stores them: the integers are chosen on that grid.
    scale = (2 * absmax / qmax).clamp(min=1e-6).to(torch.float16).to(torch.float32)
    q = torch.clamp(torch.round(w / scale) + 2 ** (bits - 1), 0, qmax)
    return q.reshape(out_features, in_features).to(torch.int32), scale.squeeze(-1)


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``32 // bits`` consecutive rows of small non-negative ints into one int32 row."""
    per = 32 // bits
    if values.shape[0] % per:
        raise ValueError(f"{values.shape[0]} rows do not pack by {per}")
    v = values.to(torch.int64).reshape(values.shape[0] // per, per, *values.shape[1:])
    shifts = (torch.arange(per, dtype=torch.int64) * bits).reshape(1, per, *[1] * (v.dim() - 2))
    packed = (v << shifts).sum(dim=1)
    return ((packed + 2**31) % 2**32 - 2**31).to(torch.int32)  # as signed int32 bits


def gptq_linear(weight: torch.Tensor, bits: int, group: int) -> dict[str, torch.Tensor]:
    """GPTQ tensors of one linear layer (``weight`` is [out, in]); no ``g_idx``
    (``desc_act: false``: vLLM registers none). ``qzeros`` hold v1's ``zero - 1``;
    a symmetric kernel ignores them, but the layout expects them."""
    q, scale = rtn_symmetric(weight, bits, group)
    out_features = weight.shape[0]
    zeros = torch.full((out_features, scale.shape[1]), 2 ** (bits - 1) - 1, dtype=torch.int32)
    return {
        "qweight": pack_rows(q.t().contiguous(), bits),  # [in / 8, out]
        "qzeros": pack_rows(zeros, bits).t().contiguous(),  # [groups, out / 8]
        "scales": scale.t().contiguous().to(torch.float16),  # [groups, out]
    }


def gptq_state_dict(model: Any, spec: QuantSpec) -> dict[str, torch.Tensor]:
    """Every tensor of ``model`` with its target linears as GPTQ, the rest in bf16."""
    assert spec.group_size is not None
    tensors: dict[str, torch.Tensor] = {}
    targets = {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.endswith(TARGET_SUFFIXES)
    }
    for key, value in model.state_dict().items():
        if key == "lm_head.weight":
            continue
        module = key.rsplit(".", 1)[0]
        if module in targets and key.endswith(".weight"):
            for part, t in gptq_linear(value, spec.bits, spec.group_size).items():
                tensors[f"{module}.{part}"] = t
        else:
            tensors[key] = value.detach().to(torch.bfloat16).contiguous()
    return tensors


def dequantize_gptq(t: dict[str, torch.Tensor], bits: int, group: int) -> torch.Tensor:
    """The [out, in] float weight a symmetric GPTQ layer stands for (tests, checks)."""
    per = 32 // bits
    mask = 2**bits - 1
    shifts = torch.arange(per, dtype=torch.int64) * bits
    qw = t["qweight"].to(torch.int64) & 0xFFFFFFFF
    q = ((qw.unsqueeze(1) >> shifts.reshape(1, per, 1)) & mask).reshape(-1, qw.shape[1])
    g = torch.arange(q.shape[0]) // group
    scale = t["scales"].to(torch.float32)
    return ((q - 2 ** (bits - 1)).to(torch.float32) * scale[g]).t().contiguous()
