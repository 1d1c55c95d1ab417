"""Per-token numbers refuse NaN and infinities by their type, in every model that uses it."""

from __future__ import annotations

import math

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from quantdrift.schemas.pair import FiniteFloats, ModelOutput, PairEvent


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_type_refuses_non_finite_numbers_on_its_own(bad: float) -> None:
    # A bare adapter allows NaN and infinities: the refusal is the type's, not a config's.
    assert TypeAdapter(list[float]).validate_python([bad])
    with pytest.raises(ValidationError, match="values must be finite numbers"):
        TypeAdapter(FiniteFloats).validate_python([0.0, bad])


def test_the_message_names_the_field() -> None:
    class Loose(BaseModel):
        logprobs: FiniteFloats | None = None

    assert Loose(logprobs=None).logprobs is None
    assert Loose(logprobs=[-0.5, 0.0]).logprobs == [-0.5, 0.0]
    with pytest.raises(ValidationError, match="logprobs must be finite numbers"):
        Loose(logprobs=[math.nan])


@pytest.mark.parametrize(
    ("model", "field"),
    [
        (ModelOutput, "entropy"),
        (ModelOutput, "token_logprobs"),
        (PairEvent, "reference_logprobs_on_candidate"),
    ],
)
def test_the_pair_fields_are_of_that_type(model: type[BaseModel], field: str) -> None:
    assert model.model_fields[field].annotation == FiniteFloats | None


def test_entropy_must_also_be_non_negative() -> None:
    with pytest.raises(ValidationError, match="entropy must be >= 0 nats"):
        ModelOutput(text="x", entropy=[0.5, -0.1])
    assert ModelOutput(text="x", entropy=[0.0, 2.5]).entropy == [0.0, 2.5]
