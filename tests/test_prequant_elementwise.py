"""tests for the element-wise operators, moves and folded shape arithmetic of compiler/frontend/prequant.py (with
compiler/frontend/prequant_tables.py): small float models written with onnx.helper, quantized by onnxruntime's
quantize_static as a user would (no pre-processing), imported as integers, and run by the integer reference against
onnxruntime's own execution of the quantized file: at least 99 % of the output elements within one output step."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper
from test_prequant import _Reader

from vta.compiler import qops
from vta.compiler.frontend import prequant_tables
from vta.compiler.frontend.prequant import import_model

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

SHAPE = (1, 8, 6, 6)
ONE_STEP = 1 + 1e-3
"""One output step, with room for float32 rounding of the dequantized output."""


def _model(nodes: list[onnx.NodeProto], extra: list[onnx.TensorProto] = (), out: str = "y",
           out_shape: tuple[int, ...] = (1, 10), seed: int = 0) -> onnx.ModelProto:
    """``x [1, 8, 6, 6]`` -> conv ``c [1, 8, 6, 6]`` (3x3, pads 1) -> ``nodes`` (from ``c`` to ``h [1, 8, 6, 6]``,
    unless they write ``out`` themselves) -> GlobalAveragePool, Flatten, Gemm ``y [1, 10]``; seeded weights."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b"),
             numpy_helper.from_array((rng.standard_normal((10, 8)) * 0.4).astype(np.float32), "wf"),
             numpy_helper.from_array((rng.standard_normal(10) * 0.1).astype(np.float32), "bf"), *extra]
    head = [] if any(out in n.output for n in nodes) else [
        helper.make_node("GlobalAveragePool", ["h"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
                               *nodes, *head], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, list(out_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _quantized(model: onnx.ModelProto, folder: Path, fmt: str = "QDQ", act: str = "QUInt8") -> Path:
    source, path = folder / "float.onnx", folder / f"{fmt}-{act}.onnx"
    onnx.save(model, source)
    quantization.quantize_static(str(source), str(path), _Reader(SHAPE),
                                 quant_format=getattr(quantization.QuantFormat, fmt),
                                 activation_type=getattr(quantization.QuantType, act),
                                 weight_type=quantization.QuantType.QInt8, per_channel=True)
    return path


def _assert_agrees(path: Path, count: int = 16, shape: tuple[int, ...] = SHAPE) -> list[str]:
    """Import ``path`` as integers (no fallback to its float graph) and compare ``count`` seeded inputs ``x`` of
    ``shape`` through the integer reference with onnxruntime on the file; returns the graph's ops."""
    graph = import_model(path)
    assert graph.is_quantized and not getattr(graph, "absmax_hints", None), "imported as its float graph"
    rng = np.random.default_rng(5)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scale = float(graph.producer(graph.outputs[0]).attrs["scale"])
    steps = []
    for _ in range(count):
        x = rng.standard_normal(shape).astype(np.float32)
        lab = qops.run_reference(graph, {"x": x})[graph.outputs[0]].astype(np.float64)
        ref = session.run(None, {"x": x})[0].astype(np.float64)
        steps.append(np.abs(lab - ref.reshape(lab.shape)).ravel() / scale)
    every = np.concatenate(steps)
    assert np.mean(every <= ONE_STEP) >= 0.99 and every.max() <= 2 * ONE_STEP, (np.mean(every <= ONE_STEP),
                                                                                every.max())
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_silu_is_one_lookup_of_its_input(fmt, tmp_path):
    """``c * sigmoid(c)`` (EfficientNet's SiLU as torch exports it): both operands int8, the product a function of
    ``c`` alone, so one QLut of ``c`` (the Sigmoid's own table is dropped); QLinearMul in QOperator format."""
    nodes = [helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid"),
             helper.make_node("Mul", ["c", "s"], ["h"], name="silu")]
    ops = _assert_agrees(_quantized(_model(nodes), tmp_path, fmt))
    assert ops.count("QLut") == 1 and "QLut2" not in ops


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_an_activation_expanded_to_more_copies(fmt, tmp_path):
    """Grouped-query attention's ``repeat_kv``: an activation ``[1, 8, 1, 6, 6]`` expanded to ``[1, 8, 2, 6, 6]``
    (Llama's keys and values, as torch exports them): a QConcat of copies at the same parameters (it was refused:
    "the lab expands quantized constants, or to the same shape")."""
    rng = np.random.default_rng(9)
    extra = [numpy_helper.from_array(np.array([1, 8, 1, 6, 6], np.int64), "one_copy"),
             numpy_helper.from_array(np.array([1, 8, 2, 6, 6], np.int64), "two_copies"),
             numpy_helper.from_array(np.array([1, 16, 6, 6], np.int64), "flat"),
             numpy_helper.from_array((rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Reshape", ["c", "one_copy"], ["c5"], name="split"),
             helper.make_node("Expand", ["c5", "two_copies"], ["e"], name="repeat"),
             helper.make_node("Reshape", ["e", "flat"], ["merged"], name="merge"),
             helper.make_node("Conv", ["merged", "w2"], ["h"], name="mix")]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path, fmt))
    assert "QConcat" in ops


def test_a_negation_is_a_lookup_of_its_input(tmp_path):
    """Rotary embeddings' ``rotate_half`` (GPT-NeoX's, Llama's) negates half of a quantized activation, and
    onnxruntime's quantizer wraps the Neg in its own QuantizeLinear/DequantizeLinear pair: one QLut, as any
    element-wise function of one input (it was refused: "no rule imports it in a quantized model")."""
    nodes = [helper.make_node("Neg", ["c"], ["n"], name="negate"), helper.make_node("Add", ["n", "c"], ["s"],
                                                                                    name="sum"),
             helper.make_node("Relu", ["n"], ["r"], name="relu"), helper.make_node("Add", ["s", "r"], ["h"],
                                                                                   name="out")]
    ops = _assert_agrees(_quantized(_model(nodes), tmp_path))
    assert "QLut" in ops


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_channel_gate_is_a_table_of_pairs_broadcast(fmt, tmp_path):
    """Squeeze-and-excitation's ``c * sigmoid(mean(c))``: ``[1, 8, 6, 6] * [1, 8, 1, 1]``, a QLut2 broadcast."""
    nodes = [helper.make_node("GlobalAveragePool", ["c"], ["m"], name="squeeze"),
             helper.make_node("Sigmoid", ["m"], ["s"], name="gate"),
             helper.make_node("Mul", ["c", "s"], ["h"], name="excite")]
    ops = _assert_agrees(_quantized(_model(nodes), tmp_path, fmt))
    assert "QLut2" in ops


@pytest.mark.parametrize("op", ["Sub", "Div"])
def test_sub_and_div_of_two_activations(op, tmp_path):
    """``c op relu(c) + 1`` style pairs: Sub and Div of two quantized activations, as a QLut2."""
    extra = [numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    nodes = [helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "one"], ["p"], name="plus_one"),
             helper.make_node(op, ["c", "p"], ["h"], name="pair")]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path))
    assert "QLut2" in ops


@pytest.mark.parametrize("op, attrs", [("HardSwish", {}), ("HardSigmoid", {"alpha": 0.25}), ("Tanh", {}),
                                       ("Gelu", {"approximate": "tanh"})])
def test_more_activations_import_as_tables(op, attrs, tmp_path):
    """MobileNetV3's HardSwish and HardSigmoid, Tanh and Gelu between DequantizeLinear and QuantizeLinear: one QLut
    each, at the node's attributes."""
    model = _model([helper.make_node(op, ["c"], ["h"], name="act", **attrs)])
    if op == "Gelu":
        model.opset_import[0].version = 20
    path = _quantized(model, tmp_path)
    if not any(n.op_type == "QuantizeLinear" and n.input[0] == "h" for n in onnx.load(path).graph.node):
        pytest.skip(f"this onnxruntime's quantizer leaves {op} in float")
    ops = _assert_agrees(path)
    assert ops.count("QLut") == 1


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_softmax_output(fmt, tmp_path):
    """A classifier's Softmax after the Gemm (QLinearSoftmax in QOperator format): the lab's float softmax of the
    int8 logits, quantized at the file's output scale and zero point."""
    nodes = [helper.make_node("GlobalAveragePool", ["c"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1, name="fc"),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1, name="softmax")]
    ops = _assert_agrees(_quantized(_model(nodes), tmp_path, fmt))
    assert "Softmax" in ops and "QuantizeZp" in ops


def test_shape_arithmetic_shared_biases_and_channel_halves(tmp_path):
    """What torch writes for ShuffleNet-style blocks, without onnxruntime's pre-processing: a Reshape to a shape
    computed by Shape, Gather, Div and Concat (the channel shuffle); Split and Slice into channel halves; Gather
    of channels by constant indices; a bias shared through Identity; ReduceMean over the spatial axes. The shape
    arithmetic folds; the rest imports as integers."""
    rng = np.random.default_rng(3)
    extra = [numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.4).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), "b2"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([2], np.int64), "two"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
             numpy_helper.from_array(np.array([4, 4], np.int64), "halves"),
             numpy_helper.from_array(np.array([0], np.int64), "s0"),
             numpy_helper.from_array(np.array([4], np.int64), "s4"),
             numpy_helper.from_array(np.array([8], np.int64), "s8"),
             numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array(np.array([1, 0, 3, 2, 5, 4, 7, 6], np.int64), "order"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "spatial")]
    nodes = [helper.make_node("Split", ["c", "halves"], ["lo", "hi"], axis=1, name="split"),
             helper.make_node("Identity", ["b2"], ["b2_shared"], name="shared_bias"),
             helper.make_node("Conv", ["hi", "w2", "b2"], ["h1"], name="branch_a"),
             helper.make_node("Conv", ["lo", "w2", "b2_shared"], ["h2"], name="branch_b"),
             helper.make_node("Concat", ["h1", "h2"], ["cat"], axis=1, name="concat"),
             helper.make_node("Shape", ["cat"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0, name="batch"),
             helper.make_node("Gather", ["shape", "one"], ["ch"], axis=0, name="channels"),
             helper.make_node("Div", ["ch", "two"], ["per_group"], name="per_group"),
             helper.make_node("Unsqueeze", ["n", "s0"], ["n1"], name="n1"),
             helper.make_node("Concat", ["n1", "two", "per_group", "minus_one"], ["grouped"], axis=0, name="grouped"),
             helper.make_node("Reshape", ["cat", "grouped"], ["g3"], name="group"),
             helper.make_node("Transpose", ["g3"], ["t3"], perm=[0, 2, 1, 3], name="shuffle"),
             helper.make_node("Reshape", ["t3", "shape"], ["shuffled"], name="ungroup"),
             helper.make_node("Slice", ["shuffled", "s4", "s8", "ax1"], ["back"], name="back_half"),
             helper.make_node("Slice", ["shuffled", "s0", "s4", "ax1"], ["front"], name="front_half"),
             helper.make_node("Concat", ["back", "front"], ["swapped"], axis=1, name="swap"),
             helper.make_node("Gather", ["swapped", "order"], ["h"], axis=1, name="pairs"),
             helper.make_node("ReduceMean", ["h", "spatial"], ["g"], keepdims=0, name="mean"),
             helper.make_node("Gemm", ["g", "wf", "bf"], ["y"], transB=1, name="fc")]
    model = _model(nodes, extra, seed=4)
    model.opset_import[0].version = 18
    ops = _assert_agrees(_quantized(model, tmp_path), count=64)
    assert {"Slice", "Gather", "Transpose"} <= set(ops)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_an_upsampling_resize(mode, tmp_path):
    """LR-ASPP's and FPN's Resize by 2 of a quantized activation: the IR Resize (its integer weights sum to one, so
    the zero point passes through), then a rescale to the file's output parameters."""
    extra = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Resize", ["c", "", "scales"], ["h"], mode=mode, name="up")]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path))
    assert "Resize" in ops


def test_a_batch_norm_after_a_concat(tmp_path):
    """DenseNet's BatchNormalization after a Concat (no Conv to fold it into), its running mean an Identity of its
    bias as torch shares equal initializers (the quantizer then quantizes it as an activation): a depthwise 1x1
    QConv2d; a MaxPool with ceil_mode=1 after it (GoogLeNet's, SqueezeNet's)."""
    rng = np.random.default_rng(6)
    extra = [numpy_helper.from_array((rng.uniform(0.5, 1.5, 16)).astype(np.float32), "gamma"),
             numpy_helper.from_array((rng.standard_normal(16) * 0.2).astype(np.float32), "beta"),
             numpy_helper.from_array((rng.uniform(0.5, 2.0, 16)).astype(np.float32), "var"),
             numpy_helper.from_array((rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Concat", ["c", "r"], ["cat"], axis=1, name="concat"),
             helper.make_node("Identity", ["beta"], ["mean"], name="shared"),
             helper.make_node("BatchNormalization", ["cat", "gamma", "beta", "mean", "var"], ["bn"], name="norm"),
             helper.make_node("MaxPool", ["bn"], ["p"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1,
                              name="pool"),
             helper.make_node("Conv", ["p", "w2"], ["h"], name="mix")]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path), count=32)
    assert ops.count("QConv2d") == 4 and "MaxPool" in ops     # conv, the norm, mix and the pool of the head


@pytest.mark.parametrize("attrs, relu", [({"dilations": [2, 2], "pads": [2, 2, 2, 2]}, True),
                                         ({"dilations": [2, 3], "pads": [1, 0, 2, 3]}, False),
                                         ({"dilations": [1, 3], "pads": [1, 3, 1, 3]}, True)])
@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_dilated_conv_takes_the_phase_form(attrs, relu, fmt, tmp_path):
    """DeepLab's dilated 3x3 (LR-ASPP) in a QDQ file: the phase form with a QuantizeLinear/DequantizeLinear pair at
    the output's parameters after the undilated Conv, so no dilated Conv is left and the sums are onnxruntime's. A
    QOperator file's dilated QLinearConv is first the QDQ nodes it stands for (it fell back to the float graph)."""
    rng = np.random.default_rng(3)
    extra = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), "wd"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "bd")]
    kernel_out = "d" if relu else "h"
    nodes = [helper.make_node("Conv", ["c", "wd", "bd"], [kernel_out], name="dilated", **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["d"], ["h"], name="relu"))
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path, fmt))
    assert "Transpose" in ops                           # the phases moved into the batch and back


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_the_phase_form_takes_names_no_tensor_of_the_file_has(fmt, tmp_path):
    """A dilated convolution in a file whose own tensors bear the names the phase form would give its tensors
    (``dilated_split``, ``dilated_joined``): the rewrite asks for free names, so none of the file's tensors is
    replaced. Before, the residual Add read the phase form's Reshape in place of the file's ``dilated_split``."""
    rng = np.random.default_rng(8)
    extra = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), "wd")]
    nodes = [helper.make_node("Relu", ["c"], ["dilated_split"], name="relu"),
             helper.make_node("Conv", ["dilated_split", "wd"], ["dilated_joined"], name="dilated", dilations=[2, 2],
                              pads=[2, 2, 2, 2]),
             helper.make_node("Add", ["dilated_joined", "dilated_split"], ["h"], name="residual")]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path, fmt))
    assert "Transpose" in ops                           # it took the phase form


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_one_dimensional_convolutions_run_as_integers(fmt, tmp_path):
    """An audio stem's 1D convolutions (Whisper's, Speech2Text's: strided, padded, grouped, dilated) in a quantized
    file: each a QConv2d over ``[N, C, 1, L]`` between Reshapes, as integers at the file's scales (they fell back
    to the float graph before). A dilated one takes the phase form, a QOperator file's after it is written as the
    QDQ nodes it stands for."""
    rng = np.random.default_rng(4)
    shape = (1, 8, 24)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 5)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((16, 4, 3)) * 0.3).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal((8, 16, 3)) * 0.3).astype(np.float32), "w3")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], strides=[2], pads=[2, 2], name="stem"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], group=4, pads=[1, 1], name="grouped"),
             helper.make_node("Conv", ["c2", "w3"], ["y"], dilations=[2], pads=[2, 2], name="last")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    source, path = tmp_path / "float.onnx", tmp_path / "q.onnx"
    onnx.save(model, source)
    quantization.quantize_static(str(source), str(path), _Reader(shape),
                                 quant_format=getattr(quantization.QuantFormat, fmt),
                                 activation_type=quantization.QuantType.QUInt8,
                                 weight_type=quantization.QuantType.QInt8, per_channel=True)
    ops = _assert_agrees(path, shape=shape)
    assert ops.count("QConv2d") == 3 and ops.count("Reshape") >= 6


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_dilated_conv_of_another_stride_takes_its_kernel_with_zeros(fmt, tmp_path):
    """A dilated Conv of strides 2 (the phase form takes strides 1 only): its integer weights with d - 1 zero taps
    between their own, the same sums at 25/9 of the MACs (it fell back to the float graph)."""
    rng = np.random.default_rng(5)
    extra = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), "wd")]
    nodes = [helper.make_node("Conv", ["c", "wd"], ["h"], name="dilated", dilations=[2, 2], pads=[2, 2, 2, 2],
                              strides=[2, 2])]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path, fmt))
    assert ops.count("QConv2d") == 3 and "Transpose" not in ops       # conv, the dilated one, the head's pool


def test_a_per_channel_qoperator_file_dequantizes_along_its_output_channels(tmp_path):
    """The float fallback of a QOperator file with per-channel weights (here a QLinearConv with auto_pad, which the
    integer import leaves to it): each weight's DequantizeLinear runs along the output channels (QLinearConv: axis 0;
    QGemm with transB: axis 0), so the float graph computes what the file does (it failed to fold before). The
    dequantization of constants is folded in the float graph itself (``dequantize._fold_constant_dequantizations``),
    so no weight's DequantizeLinear is left there."""
    from vta.compiler.frontend.dequantize import qdq_to_float
    from vta.compiler.frontend.float_ref import run_float
    rng = np.random.default_rng(3)
    extra = [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32), "wd")]
    nodes = [helper.make_node("Conv", ["c", "wd"], ["h"], name="dilated", auto_pad="SAME_UPPER")]
    path = _quantized(_model(nodes, extra), tmp_path, "QOperator")
    plain = qdq_to_float(onnx.load(path))
    assert not [n for n in plain.graph.node if n.op_type == "DequantizeLinear" and
                n.input[0].startswith(("w_", "wd_", "wf_"))]
    x = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0].ravel()
    graph = import_model(path)
    got = run_float(graph, {"x": x})[graph.outputs[0]].ravel()
    assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99
    assert not graph.is_quantized and graph.absmax_hints


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_layer_norm_between_quantized_activations(fmt, tmp_path):
    """LayerNormalization of a quantized activation (a quantizer leaves it float): one QLayerNorm, the input's zero
    point cancelled by the mean, the output's in beta; in QOperator format its result is quantized where it is
    read (here by a 1x1 QLinearConv)."""
    rng = np.random.default_rng(2)
    extra = [numpy_helper.from_array((1 + rng.standard_normal(6) * 0.2).astype(np.float32), "gamma"),
             numpy_helper.from_array((rng.standard_normal(6) * 0.2).astype(np.float32), "beta"),
             numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) * 0.4).astype(np.float32), "w1")]
    nodes = [helper.make_node("LayerNormalization", ["c", "gamma", "beta"], ["n"], name="norm", axis=-1),
             helper.make_node("Conv", ["n", "w1"], ["h"], name="mix")]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path, fmt))
    assert "QLayerNorm" in ops


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("act", ["QUInt8", "QInt8"])
def test_a_matmul_of_two_activations(fmt, act, tmp_path):
    """``c @ transpose(relu(c))`` per channel (attention's Q K^T): a QMatMul with both inputs' zero points and the
    output's, exact in int64 on the CPU (QLinearMatMul of two activations in QOperator format)."""
    nodes = [helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["rt"], name="rt", perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["c", "rt"], ["h"], name="product")]
    ops = _assert_agrees(_quantized(_model(nodes), tmp_path, fmt, act))
    assert "QMatMul" in ops


def test_a_bias_added_after_a_matmul(tmp_path):
    """A linear layer over ``[1, 8, 6, 6]`` as MatMul and an Add of its bias (the quantizer quantizes the bias as
    the Add's input): the MatMul a QDense over the rows, the Add a QLut2 of the activation and the bias's
    integers, broadcast."""
    rng = np.random.default_rng(4)
    extra = [numpy_helper.from_array((rng.standard_normal((6, 5)) * 0.4).astype(np.float32), "wm"),
             numpy_helper.from_array((rng.standard_normal(5) * 0.3).astype(np.float32), "bm")]
    nodes = [helper.make_node("MatMul", ["c", "wm"], ["m"], name="linear"),
             helper.make_node("Add", ["m", "bm"], ["h"], name="bias")]
    ops = _assert_agrees(_quantized(_model(nodes, extra), tmp_path))
    assert "QDense" in ops and "QLut2" in ops


def test_a_float_chain_between_activations_is_one_table(tmp_path):
    """torch's exact GELU as exported: ``Div`` by sqrt(2) left float (the quantizer quantizes Erf's output, not its
    input), then ``Erf``: one QLut of the Div's quantized input, the chain in float64."""
    extra = [numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2")]
    nodes = [helper.make_node("Div", ["c", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["h"], name="erf")]
    path = _quantized(_model(nodes, extra), tmp_path)
    if any(n.op_type == "QuantizeLinear" and n.input[0] == "d" for n in onnx.load(path).graph.node):
        pytest.skip("this onnxruntime's quantizer quantizes the Div's output")
    ops = _assert_agrees(path)
    assert ops.count("QLut") == 1


def test_a_pool_to_another_scale_rounds_as_onnxruntime(tmp_path):
    """GlobalAveragePool to an output scale of its own is a depthwise QConv2d whose rounding offset is added to the
    accumulator, in steps of ``M / 2**S`` output steps (about ``x_scale / (H W y_scale)``, here near 1). Its kernel
    of ``k`` (not 1) makes the step ``k`` times finer: the pooled values equal onnxruntime's on at least 95 % of the
    elements (measured 97 %, the rest the convolution's own one-step differences, which the mean of 36 carries; with
    a kernel of ones it was 88 %, the rounding lost)."""
    nodes = [helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["y"], name="pool")]
    path = _quantized(_model(nodes, out_shape=(1, 8, 1, 1)), tmp_path)
    graph = import_model(path)
    assert "QConv2d" in [n.op for n in graph.nodes if n.name == "pool"]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scale = float(graph.producer(graph.outputs[0]).attrs["scale"])
    rng = np.random.default_rng(6)
    steps = []
    for _ in range(32):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        lab = qops.run_reference(graph, {"x": x})[graph.outputs[0]].astype(np.float64)
        steps.append(np.rint(np.abs(lab - session.run(None, {"x": x})[0]) / scale).ravel())
    assert np.mean(np.concatenate(steps) == 0) >= 0.95


def test_a_qlinear_add_of_two_constants_is_a_constant():
    """GPT-2's attention scale in a QOperator file: com.microsoft's QLinearAdd of two uint8 constants, which the
    quantizer did not fold, read by a Mul of an activation. The import computes the constant as onnxruntime does
    (the Mul then a table of one input)."""
    def const(name: str, value: object, dtype: type) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(value, dtype), name)
    inits = [const("s", 0.05, np.float32), const("z", 128, np.uint8), const("ca", 200, np.uint8),
             const("cb", 90, np.uint8), const("sa", 0.01, np.float32), const("sb", 0.02, np.float32),
             const("zc", 0, np.uint8), const("sc", 0.01, np.float32), const("sy", 0.1, np.float32)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("QLinearAdd", ["ca", "sa", "z", "cb", "sb", "z", "sc", "zc"], ["c"],
                              domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["c", "sc", "zc"], ["cf"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
             helper.make_node("Mul", ["xf", "cf"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "sy", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "sy", "z"], ["y"])]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    imported = import_model(model)
    assert imported.is_quantized and [n.op for n in imported.nodes].count("QLut") == 1
    x = np.linspace(-6, 6, 64, dtype=np.float32).reshape(1, 64)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = qops.run_reference(imported, {"x": x})[imported.outputs[0]]
    np.testing.assert_allclose(got, want, atol=0.1 + 1e-6)            # within one output step


def test_the_tables_read_zero_points_and_clip():
    """prequant_tables: a product of two uint8-domain operands with zero points, a Relu-narrowed output range, and a
    division by zero saturating instead of NaN."""
    pair = prequant_tables.binary_table("Mul", (0.1, -28), (0.05, 10), 0.02, -5, lo=-5)
    a, b = 50, -20
    want = np.clip(np.rint((a + 28) * 0.1 * (b - 10) * 0.05 / 0.02) - 5, -5, 127)
    assert pair[a + 128, b + 128] == want and pair.min() == -5
    div = prequant_tables.binary_table("Div", (1.0, 0), (1.0, 0), 1.0, 0)
    assert div[5 + 128, 128] == 127 and div[-5 + 128, 128] == -128 and div[128, 128] == 0
    inner = np.arange(-128, 128).astype(np.int8)[::-1].copy()
    composed = prequant_tables.composed_table(pair, inner, inner_first=False)
    assert composed[a + 128] == pair[a + 128, int(inner[a + 128]) + 128]


def test_a_dequantized_exponent_is_computed_in_float32_as_onnx_does(tmp_path):
    """onnxruntime's QNN config quantizes a Pow's exponent too: ``DequantizeLinear(uint8 255, fl32(2 / 255))``, which
    ONNX computes in float32 as exactly 2.0. Computed in float64 it was 2.000000118, whose power of every negative
    input is NaN, and the run matched its integer reference with a wrong answer (an RMSNorm's squares: cosine 0.993
    against onnxruntime, 0.979 on a tiny Llama). The table is now the square's."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["eq", "se"], ["e"]),
             helper.make_node("Pow", ["xd", "e"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(0.02), "sx"), numpy_helper.from_array(np.uint8(128), "zx"),
             numpy_helper.from_array(np.array(255, np.uint8), "eq"),
             numpy_helper.from_array(np.float32(2.0) / np.float32(255.0), "se"),
             numpy_helper.from_array(np.float32(0.01), "sy"), numpy_helper.from_array(np.uint8(0), "zy")]
    path = tmp_path / "pow.onnx"
    onnx.save(onnx_model(nodes, {"x": np.zeros((1, 64), np.float32)}, inits), path)
    graph_ir = import_model(path)
    assert graph_ir.is_quantized
    x = np.linspace(-1.2, 1.2, 64, dtype=np.float32).reshape(1, 64)
    lab = qops.run_reference(graph_ir, {"x": x})[graph_ir.outputs[0]].astype(np.float64)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    scale = float(graph_ir.producer(graph_ir.outputs[0]).attrs["scale"])
    assert np.abs(lab - ref).max() <= scale * ONE_STEP
