"""Pads that crop and pads by axes (compiler/frontend/onnx_rules.py ``_pad``), and float64 files narrowed to float32
(compiler/frontend/half.py ``narrow_double``): each against onnxruntime on the file as given."""
from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import TensorProto, helper, numpy_helper

from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx

RNG_SEED = 47                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("pads", [
    [0, 1, 0, 0, -1, 0],        # RWKV's time shift: one row of zeros in front, the last row cropped
    [0, -2, 1, 0, 0, -1],       # crops and pads on different axes and ends
    [0, 0, -3, 0, 0, 0],        # a crop only
])
def test_negative_pads_crop_as_onnxruntime_does(pads):
    x = _x(1, 6, 8)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
             helper.make_node("Mul", ["p", "two"], ["y"])]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, [("pads", np.array(pads, np.int64)),
                                                                         ("two", np.array(2.0, np.float32))]),
                                           {"x": x}, atol=1e-6, rtol=1e-6)
    assert got.shape == want.shape
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= 2 * s_out


def test_a_pad_by_axes_pads_only_those_axes():
    """Opset 18's axes input: pads for axes [-1, 1] only, the value 0.5."""
    x = _x(1, 3, 4)
    nodes = [helper.make_node("Pad", ["x", "pads", "value", "axes"], ["p"]),
             helper.make_node("Relu", ["p"], ["y"])]
    model = onnx_model(nodes, {"x": x}, [("pads", np.array([1, 2, 0, -1], np.int64)),
                                         ("value", np.array(0.5, np.float32)), ("axes", np.array([-1, 1], np.int64))],
                       opset=18)
    graph, qgraph, got, want = onnx_op_run(model, {"x": x}, atol=1e-6, rtol=1e-6)
    assert got.shape == want.shape == (1, 4, 5)         # axis 1: 3 + 2 - 1; axis 2: 4 + 1 + 0


def test_a_float64_file_imports_rounded_to_float32_and_is_measured_against_the_file(caplog):
    """A linear layer and a log-sum-exp in float64 (as sklearn-onnx's double converters write): the import warns,
    the float32 graph agrees with onnxruntime on the float64 file to float32's rounding, and a mask-like -1e300
    becomes -inf without an error."""
    w = RNG.standard_normal((16, 8)) * 0.3
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Max", ["h", "floor"], ["m"]),
             helper.make_node("ReduceLogSumExp", ["m"], ["y"], axes=[1], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(-1e300), "floor")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = RNG.standard_normal((4, 16))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    with caplog.at_level(logging.WARNING, logger="vta"):
        g = import_onnx(model)
    assert "float64" in caplog.text
    assert g.tensors["x"].dtype == "float32"
    got = run_float(g, {"x": x.astype(np.float32)})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_float64_file_runs_end_to_end_with_its_error_against_the_float64_file(tmp_path, monkeypatch):
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    w = RNG.standard_normal((16, 32)) * 0.3
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4, 32])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "double.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel")
    x = RNG.standard_normal((4, 16))
    out = run(compiled, {"x": x}, target="fsim")
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    scale = np.abs(want).max() / 127
    assert np.abs(out.outputs["y"] - want).max() <= 3 * scale


def test_pads_that_crop_a_whole_axis_are_refused_naming_it():
    x = _x(1, 4, 6)
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], name="crop")]
    from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError), match=r"leave axis 1 \(of 4\) with -1"):
        import_onnx(onnx_model(nodes, {"x": x}, [("pads", np.array([0, -5, 0, 0, 0, 0], np.int64))]))
