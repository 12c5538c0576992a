"""The integer Softmax's spec (compiler/qops_softmax.py, re-exported by compiler/qops.py): its constants, the
reciprocal's Newton steps, the int32 bound over adversarial rows and its error against float softmax."""
from __future__ import annotations

import numpy as np
import pytest

from vta.compiler import qops
from vta.compiler.qops_softmax import RECIP_GUESS, RECIP_NEWTON_STEPS

SCALES = [(s_in, s_out) for s_in in (0.001, 0.01, 0.04, 0.1, 0.3, 1.0) for s_out in (1 / 32767, 1 / 255, 1 / 127, 0.5)]
MODEL_SCALES = [(32, 0.03680707901481568, 0.004520173147907407), (32, 0.0379164425406869, 0.007874015748031496),
                (128, 0.03913400304599071, 0.0030909807193936325)]
"""(C, input scale, output scale) of bert_tiny's two softmaxes and the BERT-base block's
(``scripts/bench_softmax.py``)."""


def _adversarial(c: int) -> np.ndarray:
    rows = [np.full(c, -128), np.full(c, 127), np.zeros(c), np.r_[127, np.full(c - 1, -128)],
            np.r_[np.full(c - 1, 127), -128], np.r_[np.full(c - 1, -128), 127], np.tile([-128, 127], c)[:c],
            np.r_[1, np.zeros(c - 1)]]
    rng = np.random.default_rng(c)
    rows += [rng.integers(-128, 128, c) for _ in range(6)] + [rng.integers(120, 128, c) for _ in range(2)]
    return np.array(rows, np.int8)


def _float(x: np.ndarray, s_in: float, s_out: float) -> np.ndarray:
    z = x.astype(np.float64) * s_in
    e = np.exp(z - z.max(-1, keepdims=True))
    return np.clip(e / e.sum(-1, keepdims=True) / s_out, -128, 127)


def test_recip_newton_exhaustive():
    """Over every mantissa a in [2**14, 2**15): y <= 2**15 after each step and within 2**-13 of 2**29 / a."""
    a = np.arange(1 << 14, 1 << 15, dtype=np.int64)
    y = RECIP_GUESS[0] - ((a * RECIP_GUESS[1]) >> 15)
    assert y.max() <= 1 << 15 and np.abs(y * a / 2**29 - 1).max() < 1 / 17 + 1e-4
    for _ in range(RECIP_NEWTON_STEPS):
        y = (y * ((1 << 15) - ((a * y) >> 15))) >> 14
        assert y.max() <= 1 << 15
    assert np.abs(y * a / 2**29 - 1).max() < 2**-13


@pytest.mark.parametrize("c", [1, 16, 128, 768, 1024])
def test_isoftmax_never_leaves_int32(c):
    x = _adversarial(c)
    for s_in, s_out in SCALES:
        p = qops.isoftmax_params(s_in, s_out, c)
        assert p["m"] * 255 < 2**31 and p["mq"] <= 32767 and 0 <= p["shift"] <= 16
        trace = qops.isoftmax_trace(x, **p)
        assert max(int(np.abs(v).max()) for v in trace.values()) < 2**31, (c, s_in, s_out)
        assert 2**(14 + p["g"]) <= trace["s"].min() and trace["s"].max() < 2**30
        assert 3 <= trace["b"].min() and trace["b"].max() <= 15
        assert trace["a"].min() >= 2**14 and trace["a"].max() < 2**15


@pytest.mark.parametrize("c", [1, 16, 128, 768])
def test_adversarial_rows_values(c):
    """All equal: 1/C each; one 127 among -128s at a large scale: all of it on the one."""
    s_out = 1 / 255
    for v in (-128, 0, 127):
        out = qops.isoftmax(np.full((1, c), v, np.int8), **qops.isoftmax_params(0.1, s_out, c))
        assert np.abs(out.astype(int) - min(255 / c, 127)).max() <= 0.51
    x = np.r_[127, np.full(c - 1, -128)].astype(np.int8)[None]
    out = qops.isoftmax(x, **qops.isoftmax_params(0.5, 1 / 127, c))
    assert out[0, 0] == 127 and (out[0, 1:] == 0).all()


@pytest.mark.parametrize("c,scales", [(16, SCALES), (128, SCALES), (768, SCALES)]
                         + [(c, [(s_in, s_out)]) for c, s_in, s_out in MODEL_SCALES])
def test_isoftmax_within_stated_error(c, scales):
    """Within 0.5 + 0.0075 p / s_out + 2**-13 / s_out output steps of float softmax (unrounded, clipped), and
    within 0.6 steps at s_out of 1/400 or more (the models' scales: 1/324 to 1/127); over a grid of scales and at
    the models' own, on random rows, narrow rows and the adversarial ones."""
    rng = np.random.default_rng(c)
    x = np.concatenate([_adversarial(c), rng.integers(-128, 128, (16, c)),
                        np.clip(rng.normal(0, 20, (16, c)) + rng.integers(-60, 60, (16, 1)), -128, 127)])
    x = x.astype(np.int8)
    for s_in, s_out in scales:
        real = _float(x, s_in, s_out)
        err = np.abs(qops.isoftmax(x, **qops.isoftmax_params(s_in, s_out, c)) - real)
        assert (err <= 0.5 + 0.0075 * real + 2**-13 / s_out + 1e-9).all(), (s_in, s_out, err.max())
        if s_out >= 1 / 400:
            assert err.max() <= 0.6


def test_isoftmax_exact_values():
    p = qops.isoftmax_params(0.1, 1 / 255, 4)
    assert p == {"channels": 4, "k": 22, "m": 605110, "g": 13, "mq": 32640, "shift": 7}
    y = qops.isoftmax(np.array([[0, 10, 20, 30]], np.int8), **p)
    # float: softmax(0, 1, 2, 3) * 255 = 8.17, 22.22, 60.41, 164.20 (clipped to 127)
    assert y.tolist() == [[8, 22, 60, 127]]


def test_isoftmax_params_refusals():
    with pytest.raises(ValueError, match="positive finite scales"):
        qops.isoftmax_params(0.0, 1.0, 16)
    with pytest.raises(ValueError, match="1 to 1024 channels, not 2048"):
        qops.isoftmax_params(0.1, 0.1, 2048)
    with pytest.raises(ValueError, match="input scale 2 is too large"):
        qops.isoftmax_params(2.0, 0.1, 16)
    with pytest.raises(ValueError, match="output scale 1e-05 is too small"):
        qops.isoftmax_params(0.1, 1e-5, 16)
    with pytest.raises(ValueError, match="rows have 16 channels, not 8"):
        qops.isoftmax(np.zeros((2, 8), np.int8), **qops.isoftmax_params(0.1, 0.1, 16))
