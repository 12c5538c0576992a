"""The integer LayerNorm's spec (compiler/qops_layernorm.py, re-exported by compiler/qops.py): its constants, the
1/sqrt Newton steps, the int32 bound over adversarial rows and its error against float LayerNorm."""
from __future__ import annotations

import numpy as np
import pytest

from vta.compiler import qops
from vta.compiler.qops_layernorm import NEWTON_STEPS, RSQRT_GUESS

SCALES = [(s_in, s_out) for s_in in np.geomspace(0.005, 0.2, 4) for s_out in np.geomspace(0.01, 0.2, 3)]


def _adversarial(c: int) -> np.ndarray:
    rows = [np.full(c, -128), np.full(c, 127), np.tile([-128, 127], c // 2), np.r_[127, np.full(c - 1, -128)],
            np.r_[np.full(c - 1, 127), -128], np.r_[-128, np.zeros(c - 1)], np.r_[1, np.zeros(c - 1)],
            np.zeros(c), np.full(c, 5), np.full(c, -1), np.tile([0, 1], c // 2)]
    rng = np.random.default_rng(c)
    rows += [rng.integers(-128, 128, c) for _ in range(8)] + [rng.integers(-2, 3, c) for _ in range(4)]
    return np.array(rows, np.int8)


def _params(s_in: float, s_out: float, c: int, eps: float = 1e-5, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return qops.ilayernorm_params(s_in, s_out, rng.normal(1, 0.3, c), rng.normal(0, 0.5, c), eps, c)


def test_rsqrt_newton_exhaustive():
    """Over every mantissa a in [2**13, 2**15): y <= 16383 after each step and within 1.2e-4 of 2**13/sqrt(a/2**15)."""
    a = np.arange(1 << 13, 1 << 15, dtype=np.int64)
    y = ((a * RSQRT_GUESS[1]) >> 15) + RSQRT_GUESS[0]
    assert y.max() <= 16383
    for _ in range(NEWTON_STEPS):
        y = (y * (24576 - ((((y * y) >> 13) * a) >> 15))) >> 14
        assert y.max() <= 16383
    assert np.abs(y / (2**13 / np.sqrt(a / 2**15)) - 1).max() < 1.2e-4


@pytest.mark.parametrize("c", [16, 64, 768, 4096])
def test_ilayernorm_never_leaves_int32(c):
    x = _adversarial(c)
    for s_in, s_out in SCALES:
        for eps in (1e-5, 1e-12):
            p = _params(s_in, s_out, c, eps)
            assert max(abs(p[k]) for k in ("mc", "mc2")) <= 32767 and 0 <= p["shift"] <= 30
            assert np.abs(p["mq"]).max() <= 32767 and np.abs(p["bq"]).max() <= 2**29
            trace = qops.ilayernorm_trace(x, **p)
            assert max(int(np.abs(v).max()) for v in trace.values()) < 2**31, (c, s_in, s_out, eps)
            assert np.abs(trace["p"]).max() <= 1.01 * 2**15


def test_constant_rows_give_beta():
    """A row of zero spread normalises to 0: every output is round(beta / s_out)."""
    c = 64
    rng = np.random.default_rng(0)
    gamma, beta = rng.normal(1, 0.3, c), rng.normal(0, 0.5, c)
    p = qops.ilayernorm_params(0.05, 0.02, gamma, beta, 0.0, c)
    x = np.array([np.full(c, v) for v in (-128, -1, 0, 3, 127)], np.int8)
    want = np.clip(np.rint(beta / 0.02), -128, 127)
    assert np.abs(qops.ilayernorm(x, **p).astype(int) - want).max() <= 1


MODEL_SCALES = [(64, 0.0321, 0.03336), (64, 0.0359, 0.03165), (64, 0.03819, 0.03586), (64, 0.0397, 0.03356),
                (64, 0.03876, 0.03113), (768, 0.03849, 0.04456), (768, 0.0473, 0.04306)]
"""(C, input scale, output scale) of bert_tiny's five LayerNorms and the BERT-base block's two
(``python3 scripts/bench_layernorm.py``)."""


@pytest.mark.parametrize("c,scales", [(16, SCALES), (64, SCALES), (768, SCALES)]
                         + [(c, [(s_in, s_out)]) for c, s_in, s_out in MODEL_SCALES])
def test_ilayernorm_within_stated_error_of_float(c, scales):
    """Rows of spread 5 to 60 input steps around offsets of up to 20 steps: within 0.64 output steps of float
    LayerNorm (of the int8 input, clipped to int8's range), over a grid of scales and at the models' own."""
    rng = np.random.default_rng(c)
    for s_in, s_out in scales:
        x = rng.normal(0, rng.uniform(5, 60, (32, 1)), (32, c)) + rng.integers(-20, 20, (32, 1))
        x = np.clip(np.rint(x), -128, 127).astype(np.int8)
        gamma, beta = rng.normal(1, 0.2, c), rng.normal(0, 0.3, c)
        p = qops.ilayernorm_params(s_in, s_out, gamma, beta, 1e-5, c)
        xf = x.astype(np.float64) * s_in
        real = (xf - xf.mean(-1, keepdims=True)) / np.sqrt(xf.var(-1, keepdims=True) + 1e-5) * gamma + beta
        err = np.abs(qops.ilayernorm(x, **p) - np.clip(real / s_out, -128, 127))
        assert err.max() <= 0.64, (s_in, s_out)


def test_ilayernorm_exact_values():
    p = qops.ilayernorm_params(0.05, 0.02, np.ones(16), np.zeros(16), 1e-5, 16)
    assert {k: v for k, v in p.items() if k not in ("mq", "bq")} == {
        "channels": 16, "k": 18, "mc": 16384, "k2": 18, "mc2": 16384, "eps_steps": 0, "shift": 22}
    assert p["mq"].tolist() == [25600] * 16 and p["bq"].tolist() == [2**21] * 16
    y = qops.ilayernorm(np.arange(-3, 13, dtype=np.int8)[None], **p)
    # float: (x - 4.5) / 4.6098 / 0.02 = -81.35, -70.50, ..., 81.35
    assert y.tolist() == [[-81, -71, -60, -49, -38, -27, -16, -5, 5, 16, 27, 38, 49, 60, 71, 81]]


def test_ilayernorm_params_refusals():
    with pytest.raises(ValueError, match="positive finite scales"):
        qops.ilayernorm_params(0.0, 1.0, np.ones(16), np.zeros(16), 1e-5, 16)
    with pytest.raises(ValueError, match="1 to 4096 channels, not 8192"):
        qops.ilayernorm_params(0.1, 0.1, np.ones(8192), np.zeros(8192), 1e-5, 8192)
    with pytest.raises(ValueError, match="gamma and beta need 16 values each, not 15 and 16"):
        qops.ilayernorm_params(0.1, 0.1, np.ones(15), np.zeros(16), 1e-5, 16)
    with pytest.raises(ValueError, match="more than 2\\*\\*30"):
        qops.ilayernorm_params(1e-6, 0.1, np.ones(16), np.zeros(16), 1.0, 16)
    with pytest.raises(ValueError, match="rows have 16 channels, not 8"):
        qops.ilayernorm(np.zeros((2, 8), np.int8), **qops.ilayernorm_params(0.1, 0.1, np.ones(16), np.zeros(16),
                                                                             1e-5, 16))
