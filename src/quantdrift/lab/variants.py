"""The quantized variants the lab knows, by name: plain data, no torch.

Kept apart from :mod:`quantdrift.lab.quant` (which needs torch) so the command
line can list and check variant names without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QuantSpec:
    """``bits`` per weight; ``group_size`` None means one group per output channel."""

    name: str
    bits: int
    group_size: int | None

    @property
    def family(self) -> str:
        """The short label: ``int4`` for ``int4-g64`` and ``int4-g128``."""
        return f"int{self.bits}"


VARIANTS: dict[str, QuantSpec] = {
    s.name: s
    for s in (
        QuantSpec("int8", 8, None),
        QuantSpec("int4-g64", 4, 64),
        QuantSpec("int4-g128", 4, 128),
        QuantSpec("int3-g64", 3, 64),
        QuantSpec("int2-g64", 2, 64),
    )
}

# Real quantized checkpoint formats vLLM runs through its own kernels (lab/export.py).
GPTQ_VARIANTS: dict[str, QuantSpec] = {"int4-g64-gptq": QuantSpec("int4-g64-gptq", 4, 64)}
# Every name `lab export` and `lab vllm` accept: the reference, the RTN variants, GPTQ.
EXPORT_VARIANTS = ("ref-f32", *VARIANTS, *GPTQ_VARIANTS)


def variant(name: str) -> QuantSpec:
    """The spec for a variant name; ValueError listing the known ones otherwise."""
    try:
        return VARIANTS[name]
    except KeyError:
        raise ValueError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}") from None
