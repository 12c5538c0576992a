"""3-D convolutions as one 2-D Conv over the frames (compiler/frontend/conv3d.py): random kernels, strides, pads,
dilations, groups and auto_pad against onnxruntime, a BatchNormalization folded in; a small R(2+1)D-style block on
fsim bit-exact with the integer reference, its convolutions on the accelerator; the refusals with their reasons."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.config import VTAConfig


def _conv3d(rng, *, bn: bool = False):
    """A random 3-D Conv (and a BatchNormalization after it) with its input."""
    group = int(rng.choice([1, 2]))
    c = group * int(rng.integers(1, 4))
    o = group * int(rng.integers(1, 4))
    kernel = [int(k) for k in rng.integers(1, 4, 3)]
    strides = [int(s) for s in rng.integers(1, 3, 3)]
    dilations = [int(d) for d in rng.integers(1, 3, 3)] if rng.random() < 0.3 else [1, 1, 1]
    x_shape = [int(rng.integers(1, 3)), c, *(int(v) for v in rng.integers(5, 9, 3))]
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group}
    auto = str(rng.choice(["NOTSET", "NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"]))
    if auto == "NOTSET":
        attrs["pads"] = [int(p) for p in rng.integers(0, 3, 6)]
    elif dilations == [1, 1, 1]:
        attrs["auto_pad"] = auto
    inits = [numpy_helper.from_array(rng.standard_normal((o, c // group, *kernel)).astype(np.float32), "W")]
    inputs = ["x", "W"]
    if rng.random() < 0.6:
        inits.append(numpy_helper.from_array(rng.standard_normal(o).astype(np.float32), "B"))
        inputs.append("B")
    nodes = [helper.make_node("Conv", inputs, ["conv" if bn else "y"], name="conv3d", **attrs)]
    if bn:
        for name, value in (("g", rng.uniform(0.5, 2, o)), ("b", rng.standard_normal(o)),
                            ("m", rng.standard_normal(o)), ("v", rng.uniform(0.5, 2, o))):
            inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        nodes.append(helper.make_node("BatchNormalization", ["conv", "g", "b", "m", "v"], ["y"], epsilon=1e-3))
    graph = helper.make_graph(nodes, "conv3d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model, {"x": rng.standard_normal(x_shape).astype(np.float32)}


def test_3d_convolutions_compute_what_onnxruntime_does():
    rng = np.random.default_rng(31)
    done = 0
    for k in range(60):
        model, feeds = _conv3d(rng, bn=k % 3 == 0)
        try:
            want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        except Exception:  # noqa: BLE001 - a random kernel longer than its padded input: onnxruntime refuses it too
            continue
        graph = import_onnx(model)
        ops = [n.op for n in graph.nodes]
        assert ops.count("Conv2d") == 1 and "Mul" not in ops and "Add" not in ops    # the BatchNorm folded in
        got = run_float(graph, feeds)["y"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
        done += 1
    assert done >= 40


def _video_block() -> onnx.ModelProto:
    """R(2+1)D's factored block: a (1, 3, 3) spatial Conv, BatchNorm, Relu, a (3, 1, 1) temporal Conv of stride 2
    padded in time, BatchNorm, Relu, then a 3-D MaxPool."""
    rng = np.random.default_rng(5)
    inits, nodes = [], []

    def conv(x, out, c, o, kernel, strides, pads):
        inits.append(numpy_helper.from_array((rng.standard_normal((o, c, *kernel)) * 0.4).astype(np.float32),
                                             f"{out}_w"))
        for name, value in (("g", rng.uniform(0.5, 1.5, o)), ("b", rng.standard_normal(o) * 0.1),
                            ("m", rng.standard_normal(o) * 0.1), ("v", rng.uniform(0.5, 1.5, o))):
            inits.append(numpy_helper.from_array(value.astype(np.float32), f"{out}_{name}"))
        nodes.extend([helper.make_node("Conv", [x, f"{out}_w"], [f"{out}_c"], kernel_shape=kernel, strides=strides,
                                       pads=pads),
                      helper.make_node("BatchNormalization", [f"{out}_c", *(f"{out}_{n}" for n in "gbmv")],
                                       [f"{out}_bn"]),
                      helper.make_node("Relu", [f"{out}_bn"], [out])])
    conv("x", "s", 3, 16, [1, 3, 3], [1, 2, 2], [0, 1, 1, 0, 1, 1])
    conv("s", "t", 16, 16, [3, 1, 1], [2, 1, 1], [1, 0, 0, 1, 0, 0])
    nodes.append(helper.make_node("MaxPool", ["t"], ["y"], kernel_shape=[1, 2, 2], strides=[1, 2, 2]))
    graph = helper.make_graph(nodes, "video",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_a_factored_video_block_runs_on_the_accelerator(tmp_path):
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    model = _video_block()
    path = tmp_path / "video.onnx"
    onnx.save(model, str(path))
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((1, 3, 4, 16, 16)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    calib = {"x": rng.standard_normal((4, 3, 4, 16, 16)).astype(np.float32)}
    compiled = compile_model(str(path), VTAConfig(), policy="accel", calibration=CalibrationSet(calib, {"source": "t"}))
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])
    assert got.shape == want.shape
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99
    assert sum(isinstance(s, AccelStep) for s in compiled.steps) >= 2


def test_a_3d_convolution_of_a_computed_weight_is_refused_as_a_2d_one_is():
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="c3")], "c3",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4, 4]),
                               helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2, 1, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(UnsupportedOperatorError, match="weights must be a constant initializer"):
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_3d_transposed_convolutions_compute_what_onnxruntime_does():
    """A 3-D ConvTranspose takes the phase form (frontend/conv_transpose.py), whose 3-D Conv then runs over its
    frames: random kernels, strides, pads and output paddings against onnxruntime."""
    rng = np.random.default_rng(32)
    done = 0
    for _ in range(30):
        kernel = [int(k) for k in rng.integers(1, 4, 3)]
        strides = [int(s) for s in rng.integers(1, 3, 3)]
        attrs = {"kernel_shape": kernel, "strides": strides, "pads": [int(p) for p in rng.integers(0, 2, 6)],
                 "output_padding": [int(rng.integers(0, s)) for s in strides]}
        x = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
        graph = helper.make_graph([helper.make_node("ConvTranspose", ["x", "W", "B"], ["y"], **attrs)], "ct3",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(rng.standard_normal((2, 3, *kernel)).astype(np.float32),
                                                           "W"),
                                   numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        try:
            want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        except Exception:  # noqa: BLE001 - pads that leave no output: onnxruntime refuses it too
            continue
        got = run_float(import_onnx(model), {"x": x})["y"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
        done += 1
    assert done >= 20
