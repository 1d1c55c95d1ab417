"""RTN fake quantization: error ordering, groups, shapes, and what is left alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from quantdrift.lab.quant import VARIANTS, fake_quant, quantize_model, variant  # noqa: E402


def _weight(seed: int = 0, shape: tuple[int, int] = (32, 256)) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen)


def _err(w: torch.Tensor, bits: int, group: int | None) -> float:
    return float((fake_quant(w, bits, group) - w).pow(2).mean())


def test_error_grows_as_bits_shrink() -> None:
    w = _weight()
    e8, e4, e3, e2 = _err(w, 8, None), _err(w, 4, 64), _err(w, 3, 64), _err(w, 2, 64)
    assert 0 < e8 < e4 < e3 < e2


@pytest.mark.parametrize("name", list(VARIANTS))
def test_shape_and_dtype_kept(name: str) -> None:
    spec = variant(name)
    w = _weight(1)
    q = fake_quant(w, spec.bits, spec.group_size)
    assert q.shape == w.shape and q.dtype == w.dtype
    assert not torch.equal(q, w)


@pytest.mark.parametrize(("bits", "group"), [(4, 64), (3, 64), (2, 64), (4, 128), (8, None)])
def test_each_group_has_at_most_2_pow_bits_levels(bits: int, group: int | None) -> None:
    w = _weight(2)
    q = fake_quant(w, bits, group)
    g = w.shape[1] if group is None else group
    for row in q:
        for chunk in row.split(g):
            assert chunk.unique().numel() <= 2**bits


def test_groups_are_independent() -> None:
    # An outlier in one group must not coarsen the grid of its neighbours.
    w = _weight(3, (4, 128))
    spiked = w.clone()
    spiked[:, :64] *= 100.0
    q, q_spiked = fake_quant(w, 4, 64), fake_quant(spiked, 4, 64)
    assert torch.equal(q[:, 64:], q_spiked[:, 64:])
    # ...but with one group per row it does.
    assert not torch.equal(fake_quant(w, 4, None)[:, 64:], fake_quant(spiked, 4, None)[:, 64:])


def test_zero_stays_exact() -> None:
    w = _weight(4, (2, 64))
    w[:, 5] = 0.0
    assert torch.all(fake_quant(w, 2, 64)[:, 5] == 0.0)


@pytest.mark.parametrize(
    ("shape", "bits", "group"), [((4, 64), 4, 0), ((4, 64), 1, 64), ((64,), 4, 64)]
)
def test_bad_arguments(shape: tuple[int, ...], bits: int, group: int) -> None:
    with pytest.raises(ValueError):
        fake_quant(torch.zeros(shape), bits, group)


def test_unknown_variant() -> None:
    with pytest.raises(ValueError, match="int4-g64"):
        variant("int5")


class _Attn(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, n, torch.nn.Linear(d, d, bias=False))


class _Mlp(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, 2 * d, bias=False)
        self.up_proj = torch.nn.Linear(d, 2 * d, bias=False)
        self.down_proj = torch.nn.Linear(2 * d, d, bias=False)


class _Layer(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.self_attn, self.mlp = _Attn(d), _Mlp(d)


class _TinyLM(torch.nn.Module):
    """Llama-shaped names: model.embed_tokens, model.layers.N.*, a tied lm_head."""

    def __init__(self, vocab: int = 50, d: int = 64) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab, d)
        self.model.layers = torch.nn.ModuleList([_Layer(d), _Layer(d)])
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight


def test_quantize_model_touches_only_block_linears() -> None:
    torch.manual_seed(0)
    lm = _TinyLM()
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    touched = quantize_model(lm, variant("int4-g64"))
    assert len(touched) == 2 * 7
    assert all(".self_attn." in n or ".mlp." in n for n in touched)
    after = lm.state_dict()
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert torch.equal(after["lm_head.weight"], before["lm_head.weight"])
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # still tied
    for name in touched:
        key = f"{name}.weight"
        assert after[key].shape == before[key].shape
        assert not torch.equal(after[key], before[key])


def test_length_batches_keep_long_prompts_apart() -> None:
    from quantdrift.lab.generate import _length_batches

    assert _length_batches([10, 300, 12, 11, 290], 2) == [[0, 3], [2], [4, 1]]


def test_group_not_dividing_the_row_leaves_a_short_last_group() -> None:
    # SmolLM2's hidden size 576 is 4.5 groups of 128.
    w = _weight(5, (3, 576))
    q = fake_quant(w, 4, 128)
    assert q.shape == w.shape
    assert torch.equal(q[:, 512:], fake_quant(w[:, 512:].contiguous(), 4, 64))
    assert torch.equal(q[:, :512], fake_quant(w[:, :512].contiguous(), 4, 128))
