"""ConvTranspose (compiler/frontend/conv_transpose.py): one Conv of the output phases, interleaved and cut, against
onnxruntime over random strides, kernels, pads, output_padding, output_shape, auto_pad and groups in 1-D and 2-D; a
decoder-style block on fsim bit-exact with the integer reference, its phase Conv on the accelerator; the refusals
with their reasons."""
from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.contrib import static_shapes
from vta.compiler.frontend.conv_transpose import rewrite_conv_transposes, undilate_convs
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.config import VTAConfig


def _model(attrs, x_shape, w_shape, bias=True, before=(), inputs=None):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    inits = [numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_shape[1] * attrs.get("group", 1))
                                             .astype(np.float32), "b"))
    x = "h" if before else "x"
    nodes = list(before) + [helper.make_node("ConvTranspose", inputs or [x, "w"] + (["b"] if bias else []), ["y"],
                                             name="up", **attrs)]
    graph = helper.make_graph(nodes, "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_the_phase_form_computes_what_onnxruntime_does_over_random_attributes():
    """120 random ConvTransposes (1-D and 2-D; strides 1-3, kernels 1-5, groups 1-2; explicit pads, output_shape
    shorter or longer than the full output, SAME_UPPER, VALID or none; output_padding or not): the rewritten graph
    equals onnxruntime's node."""
    rng = np.random.default_rng(11)
    checked = 0
    while checked < 120:
        rank, group = int(rng.integers(1, 3)), int(rng.choice([1, 1, 2]))
        k = [int(v) for v in rng.integers(1, 6, rank)]
        s = [int(v) for v in rng.integers(1, 4, rank)]
        size = [int(v) for v in rng.integers(1, 7, rank)]
        attrs: dict = {"strides": s, "group": group}
        pad_out = [int(rng.integers(0, v)) for v in s] if rng.random() < 0.5 else [0] * rank
        if any(pad_out):
            attrs["output_padding"] = pad_out
        mode = rng.choice(["pads", "shape", "same", "valid", "none"])
        if mode == "pads":
            attrs["pads"] = [int(rng.integers(0, v)) for v in k + k]
        elif mode == "shape":
            attrs["output_shape"] = [a * (n - 1) + o + b - int(rng.integers(-2, b))     # longer too: negative pads
                                     for a, n, o, b in zip(s, size, pad_out, k)]
        elif mode == "same":
            if any(pad_out) or any(b < a for a, b in zip(s, k)):
                continue                              # with output_padding or a short kernel: refused (below)
            attrs["auto_pad"] = "SAME_UPPER"
        elif mode == "valid":
            attrs["auto_pad"] = "VALID"
        c_in = group * int(rng.integers(1, 4))
        model = _model(attrs, [2, c_in] + size, [c_in, int(rng.integers(1, 4))] + k, bias=bool(rng.random() < 0.5))
        x = {"x": rng.standard_normal([2, c_in] + size).astype(np.float32)}
        try:
            want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
        except Exception:  # noqa: BLE001 - an output_shape onnxruntime itself refuses (a length of 0 or less)
            continue
        inferred = onnx.shape_inference.infer_shapes(model)
        assert rewrite_conv_transposes(inferred, static_shapes(inferred)) == {}
        assert "ConvTranspose" not in [n.op_type for n in inferred.graph.node]
        got = ort.InferenceSession(inferred.SerializeToString()).run(None, x)[0]
        assert got.shape == want.shape, attrs
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=str(attrs))
        checked += 1


def test_a_decoder_block_runs_on_fsim_bit_exact_with_its_phase_conv_on_the_accelerator(tmp_path):
    """Conv -> ReLU -> ConvTranspose 2x2 stride 2 (U-Net's and YOLO's upsampling) -> ConvTranspose 3x3 stride 2 pads
    1 output_padding 1: the float import against onnxruntime, and the compiled model on fsim equal to the integer
    reference, close to onnxruntime."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    rng = np.random.default_rng(3)
    w0 = numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.3).astype(np.float32), "w0")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.3).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["h"]),
             helper.make_node("ConvTranspose", ["h", "w", "b"], ["u"], name="up", strides=[2, 2]),
             helper.make_node("ConvTranspose", ["u", "w2"], ["y"], name="up2", strides=[2, 2], pads=[1, 1, 1, 1],
                              output_padding=[1, 1])]
    inits = [w0, w2, numpy_helper.from_array((rng.standard_normal((16, 16, 2, 2)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "unet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    assert want.shape == (1, 8, 24, 24)
    np.testing.assert_allclose(run_float(import_onnx(model), feeds)["y"], want, atol=1e-4, rtol=1e-4)
    path = tmp_path / "unet.onnx"
    onnx.save(model, str(path))
    calib = {"x": np.concatenate([feeds["x"], rng.standard_normal((1, 8, 6, 6)).astype(np.float32)])}
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet(calib, {"source": "test"}))
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99
    accel = [s.node.name for s in compiled.steps if isinstance(s, AccelStep)]
    assert any("phase_conv" in name for name in accel)


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_a_dilated_kernel_computes_what_onnxruntime_does(op):
    """60 random dilated Convs and ConvTransposes (1-D and 2-D; dilations 1-3, strides 1-2, kernels 1-4, groups 1-2;
    explicit pads, SAME_UPPER, SAME_LOWER, VALID or none): a Conv of strides 1 in the phase form, the others as the
    kernel with its zeros, give onnxruntime's output of the dilated node, in the graph as the frontend rewrites it
    (a ConvTranspose then into its phase Conv too); a kernel whose zeros would cost more than 4 times its MACs is
    refused with that reason."""
    rng = np.random.default_rng(12 if op == "Conv" else 13)
    checked = refused = 0
    while checked < 60:
        rank, group = int(rng.integers(1, 3)), int(rng.choice([1, 2]))
        k = [int(v) for v in rng.integers(1, 5, rank)]
        d = [int(v) for v in rng.integers(1, 4, rank)]
        if all(v == 1 for v in d):
            continue
        attrs: dict = {"strides": [int(v) for v in rng.integers(1, 3, rank)], "dilations": d, "group": group}
        mode = rng.choice(["pads", "same", "lower", "valid", "none"])
        if mode == "pads":
            attrs["pads"] = [int(rng.integers(0, v)) for v in k + k]
        elif mode in ("same", "lower") and (op == "Conv" or all(s <= (a - 1) * b + 1 for s, a, b in
                                                                 zip(attrs["strides"], k, d))):
            attrs["auto_pad"] = "SAME_UPPER" if mode == "same" or op == "ConvTranspose" else "SAME_LOWER"
        elif mode == "valid":
            attrs["auto_pad"] = "VALID"
        c_in, c_out = group * int(rng.integers(1, 3)), group * int(rng.integers(1, 3))
        size = [int(v) for v in rng.integers(6, 12, rank)]
        w_shape = [c_out, c_in // group] + k if op == "Conv" else [c_in, c_out // group] + k
        weight = numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w")
        graph = helper.make_graph([helper.make_node(op, ["x", "w"], ["y"], name="dil", **attrs)], "d",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in] + size)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        x = {"x": rng.standard_normal([1, c_in] + size).astype(np.float32)}
        try:
            want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
        except Exception:  # noqa: BLE001 - a window longer than the padded input: onnxruntime refuses it too
            continue
        inferred = onnx.shape_inference.infer_shapes(model)
        reasons = undilate_convs(inferred, static_shapes(inferred))
        if reasons:
            assert "times the MACs" in reasons["y"] and (op == "ConvTranspose" or max(attrs["strides"]) > 1)
            with pytest.raises(UnsupportedOperatorError, match="times the MACs|times its MACs|a dilated Conv needs"):
                import_onnx(model)
            refused += 1
            continue
        phase_form = op == "Conv" and max(attrs["strides"]) == 1
        assert ("Transpose" in [n.op_type for n in inferred.graph.node]) == phase_form
        inferred = onnx.shape_inference.infer_shapes(inferred)
        assert rewrite_conv_transposes(inferred, static_shapes(inferred)) == {}
        got = ort.InferenceSession(inferred.SerializeToString()).run(None, x)[0]
        assert got.shape == want.shape, attrs
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4, err_msg=str(attrs))
        np.testing.assert_allclose(run_float(import_onnx(model), x)["y"], want, atol=1e-4, rtol=1e-4)
        checked += 1
    assert refused > 0


def test_an_atrous_convolution_takes_the_phase_form_on_the_accelerator(tmp_path):
    """DeepLab's ASPP: a 3x3 Conv of dilation 12 and pads 12 at stride 1. The phase form keeps the 3x3 kernel (the
    kernel with its zeros would be 25x25, 69 times the MACs): its Conv runs on the accelerator over the 144 phases as
    a batch, bit-exact with the integer reference, close to onnxruntime."""
    rng = np.random.default_rng(14)
    weight = numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="aspp", dilations=[12, 12],
                                                pads=[12, 12, 12, 12])], "aspp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    feeds = {"x": rng.standard_normal((1, 8, 20, 20)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    fg = import_onnx(model)
    convs = [n for n in fg.nodes if n.op == "Conv2d"]
    assert len(convs) == 1 and fg.shape(convs[0].inputs[1])[2:] == (3, 3)
    np.testing.assert_allclose(run_float(fg, feeds)["y"], want, atol=1e-4, rtol=1e-4)
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import compile_graph
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    qg = quantize(fg, feeds)
    compiled = compile_graph(qg, VTAConfig())
    assert any(isinstance(s, AccelStep) and s.node.op == "QConv2d" for s in compiled.steps)
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(qg, feeds)["y"])
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


@pytest.mark.parametrize("attrs, reason", [
    ({"strides": [2, 2], "auto_pad": "SAME_LOWER"}, "auto_pad SAME_LOWER"),
    ({"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_padding": [1, 1]}, "SAME_UPPER with output_padding"),
    ({"strides": [3, 3], "auto_pad": "SAME_UPPER"}, "SAME_UPPER with a kernel shorter than its stride"),
])
def test_what_the_rewrite_cannot_take_is_refused_with_the_reason(attrs, reason):
    with pytest.raises(UnsupportedOperatorError, match=re.escape(reason)):
        import_onnx(_model(attrs, [1, 2, 4, 4], [2, 3, 2, 2]))


def test_a_weight_computed_at_run_time_is_refused_with_the_reason():
    model = _model({"strides": [2, 2]}, [1, 2, 4, 4], [2, 3, 2, 2], bias=False,
                   before=[helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["w"], ["wn"])],
                   inputs=["h", "wn"])
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((2, 3, 2, 2), np.float32), "w"))
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 3, 2, 2]))
    del model.graph.initializer[:]
    with pytest.raises(UnsupportedOperatorError, match="a weight or bias computed at run time"):
        import_onnx(model)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_a_dilated_pool_of_strides_1_takes_the_phase_form(op):
    """A MaxPool or AveragePool of strides 1, no pads and dilations other than 1 (1-D and 2-D, random kernels and
    dilations): its phases pooled as a batch give onnxruntime's output; with pads it stays refused, naming them."""
    rng = np.random.default_rng(15)
    for _ in range(12):
        rank = int(rng.integers(1, 3))
        k = [int(v) for v in rng.integers(1, 4, rank)]
        d = [int(v) for v in rng.integers(2, 4, rank)]
        size = [int(v) for v in rng.integers(8, 14, rank)]
        graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="pool", kernel_shape=k, dilations=d)], "p",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3] + size)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
        model.ir_version = 9
        x = {"x": rng.standard_normal([1, 3] + size).astype(np.float32)}
        want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
        got = run_float(import_onnx(model), x)["y"]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)
    model.graph.node[0].attribute.append(helper.make_attribute("pads", [1] * (2 * rank)))
    with pytest.raises(UnsupportedOperatorError, match=r"dilations \[.*\] \(only 1\)"):
        import_onnx(model)


@pytest.mark.parametrize("image, block, attrs", [
    ((8, 8), (2, 2), {"strides": [2, 2]}),                               # MobileViTV2: windows tiling the image
    ((6, 7), (3, 3), {"pads": [1, 1, 1, 1]}),                            # overlapping windows sum
    ((9, 8), (2, 3), {"strides": [2, 1], "dilations": [2, 1], "pads": [1, 0, 0, 2]}),
    ((7, 7), (3, 2), {"strides": [2, 3]}),                               # the last rows and columns no window reaches
])
def test_a_fold_is_a_grouped_conv_transpose_matching_onnxruntime(image, block, attrs):
    """Col2Im (torch's ``F.fold``) becomes a grouped ConvTranspose of one-hot weights over the columns viewed as
    blocks (:func:`col2im_as_conv_transposes`); the float import agrees with onnxruntime and the quantized graph
    runs bit-exact with the integer reference (it was refused: no rule)."""
    from helpers import onnx_model, onnx_op_run
    strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    grid = [(n + pads[a] + pads[a + 2] - dilations[a] * (block[a] - 1) - 1) // strides[a] + 1 for a, n in
            enumerate(image)]                                  # the windows along each axis
    consts = {"image": np.array(image, np.int64), "block": np.array(block, np.int64)}
    x = np.random.default_rng(2).standard_normal((1, 3 * block[0] * block[1], grid[0] * grid[1])).astype(np.float32)
    nodes = [helper.make_node("Col2Im", ["x", "image", "block"], ["f"], **attrs),
             helper.make_node("Relu", ["f"], ["y"])]
    graph, *_ = onnx_op_run(onnx_model(nodes, {"x": x}, list(consts.items()), opset=18), {"x": x},
                            atol=1e-5, rtol=1e-5)
    assert "Col2Im" not in [n.op for n in graph.nodes]


def test_a_fold_never_takes_a_name_the_file_uses():
    """A Col2Im node ``fold`` beside a convolution whose weights the file named ``fold_onehot``, the name the rewrite
    gave its one-hot weights: the file's weights were replaced (cosine 0.027 against onnxruntime, the run saying it
    matched the integer reference). The rewrite's names are now ones the file does not use."""
    from helpers import onnx_model, onnx_op_run
    x = np.random.default_rng(3).standard_normal((1, 8, 16)).astype(np.float32)
    weights = np.random.default_rng(4).standard_normal((2, 1, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Col2Im", ["x", "image", "block"], ["f"], name="fold", strides=[2, 2]),
             helper.make_node("Conv", ["f", "fold_onehot"], ["y"], group=2, pads=[1, 1, 1, 1])]
    inits = [("image", np.array([8, 8], np.int64)), ("block", np.array([2, 2], np.int64)), ("fold_onehot", weights)]
    onnx_op_run(onnx_model(nodes, {"x": x}, inits, opset=18), {"x": x}, atol=1e-5, rtol=1e-5)
