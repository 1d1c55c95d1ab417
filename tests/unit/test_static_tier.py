"""The shipped static tier: loads offline, unit rows, paraphrase above unrelated; calibration."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pytest

from quantdrift.detectors.semantic import cosine_pairs
from quantdrift.embedding.static import (
    Calibration,
    StaticEmbedder,
    fit_calibration,
    load_calibration,
    packaged_static_path,
    spearman,
)
from quantdrift.errors import ConfigError


@pytest.fixture(scope="module")
def static() -> StaticEmbedder:
    def refuse(self: socket.socket, address: Any) -> None:
        raise OSError("network disabled in this test")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket.socket, "connect_ex", refuse)
        return StaticEmbedder()


def test_loads_shipped_model_offline(static: StaticEmbedder) -> None:
    assert static.tier == "static" and static.dim == 256
    assert (packaged_static_path() / "model.safetensors").stat().st_size < 15_000_000


def test_rows_are_unit_or_zero(static: StaticEmbedder) -> None:
    rows = static.embed(["The cat sat on the mat.", "长城是中国古代的军事防御工程。", "", "   "])
    norms = np.linalg.norm(rows, axis=1)
    assert rows.dtype == np.float32 and rows.shape == (4, 256)
    np.testing.assert_allclose(norms[:2], 1.0, atol=1e-5)
    np.testing.assert_allclose(norms[2:], 0.0)
    assert static.embed([]).shape == (0, 256)


def test_paraphrase_scores_above_unrelated(static: StaticEmbedder) -> None:
    ref = "Open Settings, choose Security, then click Reset password and follow the emailed link."
    para = (
        "Go to Settings, pick Security and click Reset password, then follow the link in the email."
    )
    other = "Refunds are only issued on leap years to customers whose names start with Q."
    close, far = cosine_pairs(static, [para, other], [ref, ref])
    assert close > far + 0.2


def test_embedding_is_batch_independent(static: StaticEmbedder) -> None:
    texts = ["alpha beta gamma", "a much longer sentence about the refund policy " * 30, "x"]
    together = static.embed(texts)
    alone = np.stack([static.embed([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-6)


def test_missing_model_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError):
        StaticEmbedder(tmp_path)


def test_shipped_calibration_is_valid() -> None:
    cal = load_calibration(packaged_static_path())
    assert 0 < cal.band < 0.3
    ys = cal.apply(np.linspace(-1, 1, 101))
    assert np.all(np.diff(ys) >= 0) and ys[-1] == pytest.approx(1.0)


def test_fit_is_monotone_and_roundtrips() -> None:
    rng = np.random.default_rng(0)
    s = rng.uniform(0.3, 1.0, 500)
    m = np.clip(1.4 * s - 0.4 + rng.normal(0, 0.03, 500), -1, 1)
    cal = fit_calibration(s, m, threshold=0.88)
    assert np.all(np.diff(cal.knots_y) >= 0)
    assert float(np.abs(cal.apply(s) - (1.4 * s - 0.4)).mean()) < 0.03
    assert 0.02 < cal.band < 0.1
    assert cal.spearman is not None and cal.spearman > 0.95
    assert Calibration.from_json(cal.to_json()) == cal


def test_spearman_matches_definition() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2], [1, 1, 2]) == pytest.approx(1.0)
