"""GPTQ weight rounding (compiler/frontend/gptq.py) and its use by the quantizer (``weight_rounding="gptq"``)."""
from __future__ import annotations

import numpy as np
import pytest

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.gptq import gptq_round, input_moments
from vta.compiler.frontend.quantize import calibrate, prepare, quantize
from vta.compiler.ir import Graph


def test_dense_moments_are_the_gram_matrix():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(input_moments(x, (5, 4)), (x.T.astype(np.float64) @ x)[None])


def test_conv_moments_equal_their_definition():
    """Grouped, strided, padded convolution: H[g] = sum over every output position of p p^T, p the group's input
    window (zero padding included) flattened in the weights' (c, kh, kw) order."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 5, 6)).astype(np.float32)
    groups, kh, kw, strides, pads = 2, 3, 2, (2, 1), (1, 0, 1, 1)
    got = input_moments(x, (6, 2, kh, kw), strides=strides, pads=pads, groups=groups)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    want = np.zeros((groups, 2 * kh * kw, 2 * kh * kw))
    for n in range(2):
        for i in range(0, padded.shape[2] - kh + 1, strides[0]):
            for j in range(0, padded.shape[3] - kw + 1, strides[1]):
                for g in range(groups):
                    p = padded[n, 2 * g:2 * g + 2, i:i + kh, j:j + kw].reshape(-1)
                    want[g] += np.outer(p, p)
    assert got.shape == (groups, 12, 12)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_uncorrelated_inputs_round_to_nearest():
    """With uncorrelated inputs (H diagonal) there is no other input to move an error to: GPTQ is nearest
    rounding, clipped to the weight range."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 6)) * 3
    scales = np.array([0.02, 0.05, 0.01, 0.03])
    h = np.diag(rng.uniform(1, 5, 6))[None]
    want = np.clip(np.rint(w / scales[:, None]), -127, 127)
    assert np.array_equal(gptq_round(w, scales, h, 127), want)


def test_correlated_inputs_lower_the_output_error():
    """On strongly correlated inputs with a large mean (a ReLU6 activation's), GPTQ's output error is far below
    nearest rounding's, on the calibration data and on new data from the same distribution alike."""
    rng = np.random.default_rng(2)
    k, o = 32, 8
    mix = rng.standard_normal((k, k)) * 0.3 + np.eye(k)

    def data(n: int) -> np.ndarray:
        return np.clip(rng.standard_normal((n, k)) @ mix + 3.0, 0, 6)

    calib, test = data(2000), data(2000)
    w = rng.standard_normal((o, k))
    scales = np.abs(w).max(axis=1) / 7                     # int4 weights: coarse, so rounding matters
    near = np.clip(np.rint(w / scales[:, None]), -7, 7)
    opt = gptq_round(w, scales, input_moments(calib, (o, k)), 7)
    assert opt.min() >= -7 and opt.max() <= 7 and not np.array_equal(opt, near)
    for x in (calib, test):
        err_near = (((near * scales[:, None] - w) @ x.T) ** 2).mean()
        err_opt = (((opt * scales[:, None] - w) @ x.T) ** 2).mean()
        assert err_opt < 0.2 * err_near, (err_opt, err_near)


def test_dead_inputs_round_to_nearest_and_pass_no_error():
    """An input no calibration sample reached (zero row and column of H) keeps its nearest rounding, and the live
    inputs are rounded as if it were absent."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 5)) + 1.0
    w = rng.standard_normal((3, 5))
    scales = np.full(3, 0.1)
    h = input_moments(x, (3, 5))
    with_dead = np.zeros((1, 6, 6))
    with_dead[0][np.ix_([0, 1, 3, 4, 5], [0, 1, 3, 4, 5])] = h[0]
    w6 = np.insert(w, 2, [0.123, -0.26, 0.04], axis=1)
    got = gptq_round(w6, scales, with_dead, 127)
    assert got[:, 2].tolist() == [1, -3, 0]
    assert np.array_equal(np.delete(got, 2, axis=1), gptq_round(w, scales, h, 127))


def test_moments_must_fit_the_weights():
    with pytest.raises(ValueError, match=r"GPTQ moments of shape \(1, 4, 4\) do not fit weights of shape \(3, 5\)"):
        gptq_round(np.zeros((3, 5)), np.ones(3), np.zeros((1, 4, 4)), 127)


def _relu_conv_graph(rng: np.random.Generator) -> Graph:
    g = Graph("conv", inputs=["input"], outputs=["output"])
    g.add_tensor("input", (1, 4, 8, 8), "float32")
    g.add_constant("w", rng.standard_normal((6, 4, 3, 3)).astype(np.float32))
    g.add_constant("b", rng.standard_normal(6).astype(np.float32))
    g.add_tensor("c", (1, 6, 8, 8), "float32")
    g.add_node("Conv2d", "conv", ["input", "w", "b"], ["c"], strides=(1, 1), pads=(1, 1, 1, 1), groups=1)
    g.add_tensor("output", (1, 6, 8, 8), "float32")
    g.add_node("Relu", "act", ["c"], ["output"])
    return g


def test_quantize_with_gptq_lowers_the_error_at_int4():
    """A convolution quantized with int4 weights: the GPTQ graph has the same scales and operators as the nearest
    one, different weights, and a lower error against float on held-out inputs."""
    rng = np.random.default_rng(4)
    g = _relu_conv_graph(rng)
    smooth = rng.standard_normal((24, 4, 1, 1)) + 0.3 * rng.standard_normal((24, 4, 8, 8))
    calib, test = smooth[:16].astype(np.float32), smooth[16:].astype(np.float32)
    near = quantize(g, {"input": calib}, wgt_bits=4)
    opt = quantize(g, {"input": calib}, wgt_bits=4, weight_rounding="gptq")
    assert [n.op for n in opt.nodes] == [n.op for n in near.nodes]
    assert np.array_equal(opt.nodes[1].attrs["w_scale"], near.nodes[1].attrs["w_scale"])
    assert not np.array_equal(opt.constants[opt.nodes[1].inputs[1]], near.constants[near.nodes[1].inputs[1]])

    def error(q: Graph) -> float:
        return sum(float(((qops.run_reference(q, {"input": x[None]})["output"]
                           - run_float(g, {"input": x[None]})["output"]) ** 2).sum()) for x in test)

    assert error(opt) < 0.7 * error(near), (error(opt), error(near))


def test_calibration_moments_and_gptq_errors():
    rng = np.random.default_rng(5)
    g = _relu_conv_graph(rng)
    x = rng.standard_normal((3, 4, 8, 8)).astype(np.float32)
    cal = calibrate(prepare(g), {"input": x}, moments=True)
    assert list(cal.moments) == ["conv"]
    want = sum(input_moments(x[i:i + 1], (6, 4, 3, 3), pads=(1, 1, 1, 1)) for i in range(3))
    np.testing.assert_allclose(cal.moments["conv"], want, rtol=1e-12)
    assert calibrate(prepare(g), {"input": x}).moments == {}
    with pytest.raises(ValueError, match="weight_rounding='gptq' needs the input moments of the layers; the "
                                         "calibration given has none"):
        quantize(g, {}, calibration=calibrate(prepare(g), {"input": x}), weight_rounding="gptq")
    with pytest.raises(ValueError, match="weight_rounding='best' is unknown; use one of nearest, gptq."):
        quantize(g, {"input": x}, weight_rounding="best")  # type: ignore[arg-type]


def test_compile_option_and_bit_exact_on_fsim():
    """``weight_rounding="gptq"`` through the compile options: tiny_cnn's weights change, its operators and scales
    do not, and fsim matches the integer reference bit for bit."""
    from vta.compiler.options import CompileOptions
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    with pytest.raises(ValueError, match="weight_rounding='round' is unknown; use one of nearest, gptq"):
        CompileOptions(weight_rounding="round")
    near = compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2)
    opt = compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2, weight_rounding="gptq")
    assert [n.op for n in opt.graph.nodes] == [n.op for n in near.graph.nodes]
    assert opt.accel_steps == near.accel_steps >= 3
    assert any(not np.array_equal(opt.graph.constants[k], near.graph.constants[k])
               for k in opt.graph.constants if k.endswith("_wq"))
    x = {n: np.random.default_rng(7).standard_normal(opt.graph.shape(n)).astype(np.float32) for n in opt.graph.inputs}
    got = run(opt, x, target="fsim").outputs
    ref = qops.run_reference(opt.graph, x)
    for name in opt.graph.outputs:
        assert np.array_equal(np.asarray(got[name]), np.asarray(ref[name]))
