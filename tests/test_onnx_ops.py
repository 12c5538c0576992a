"""The operators a CNN meets beyond convolutions (Resize, Transpose, Sigmoid, HardSigmoid, HardSwish, DepthToSpace,
1D and 3D pooling, Concat of a constant, Clip), end to end: ONNX import against ONNX Runtime's float output, then
quantization, the integer reference and the CPU kernels; and the frontend's refusals: every unsupported node in one
error, parameters another node computes, tensors too large for the machine."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper

from vta.compiler.frontend.onnx_frontend import (
    TensorTooLargeError,
    UnsupportedModelError,
    UnsupportedOperatorError,
    import_onnx,
)

RNG = np.random.default_rng(11)


def _model(nodes, inputs, inits=(), opset=19):
    return onnx_model(nodes, inputs, inits, opset=opset)


def _x(*shape, spread=2.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _end_to_end(model, feeds):
    """Float import == ONNX Runtime; quantized CPU run == integer reference and within 2 output steps + 1 input step
    of ONNX Runtime. Returns the quantized graph."""
    _, qgraph, got, want = onnx_op_run(model, feeds, atol=1e-5, rtol=1e-5)
    s_in = max(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= 2 * s_out + s_in
    return qgraph


@pytest.mark.parametrize("op,attrs", [("Sigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
                                      ("HardSwish", {})])
def test_activations_become_a_lookup_table(op, attrs):
    x = _x(1, 4, 5, 5, spread=3.0)
    qgraph = _end_to_end(_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x}), {"x": x})
    lut = qgraph.node(f"{op}_y")
    assert lut.op == "QLut" and lut.attrs["function"] == op and lut.attrs["table"].shape == (256,)


@pytest.mark.parametrize("slope", [np.array([0.25], np.float32),
                                   np.linspace(-0.5, 0.75, 4, dtype=np.float32).reshape(4, 1, 1)])
def test_prelu_of_one_slope_is_a_table_and_of_a_slope_per_channel_two_products(slope):
    """torch's ``nn.PReLU()`` (one slope: a LeakyRelu's table) and ``nn.PReLU(C)`` (a slope per channel, some negative:
    ``(1 - a) * Relu(x) + a * x``), each as onnxruntime computes it."""
    x = _x(1, 4, 5, 5, spread=3.0)
    qgraph = _end_to_end(_model([helper.make_node("PRelu", ["x", "a"], ["y"])], {"x": x}, [("a", slope)]), {"x": x})
    ops = [n.op for n in qgraph.nodes]
    assert ("QLut" in ops) == (slope.size == 1) and ("QAdd" in ops or "QAddAct" in ops or slope.size == 1)


def test_transpose_and_depth_to_space():
    x = _x(1, 8, 3, 4)
    qgraph = _end_to_end(_model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 3, 1])], {"x": x}), {"x": x})
    assert [n.op for n in qgraph.nodes] == ["Quantize", "Transpose", "Dequantize"]
    for mode in ("DCR", "CRD"):
        node = helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode=mode)
        qgraph = _end_to_end(_model([node], {"x": x}), {"x": x})
        assert [n.op for n in qgraph.nodes] == ["Quantize", "Reshape", "Transpose", "Reshape", "Dequantize"]


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                   "half_pixel_symmetric"])
def test_resize(mode, coord):
    x = _x(1, 3, 5, 6)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coord)
    # align_corners divides by scale * length - 1 in onnx.reference (the node tests' expected outputs, and the lab)
    # but by the integer output length - 1 in ONNX Runtime: they agree where scale * length is an integer
    scales = [1, 1, 2, 0.5] if coord == "align_corners" else [1, 1, 2.5, 0.75]
    _end_to_end(_model([node], {"x": x}, [("scales", np.array(scales, np.float32))]), {"x": x})


def test_resize_by_sizes_and_its_refusals():
    x = _x(1, 3, 5, 6)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear")
    _end_to_end(_model([node], {"x": x}, [("sizes", np.array([1, 3, 9, 4], np.int64))]), {"x": x})
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic", name="up",
                            coordinate_transformation_mode="tf_crop_and_resize", antialias=1)
    with pytest.raises(UnsupportedOperatorError, match=r"^ONNX operator 'Resize' \(node 'up'\) is not supported by "
                                                       r"the lab: "
                                                       r"coordinate_transformation_mode 'tf_crop_and_resize' \(only "
                                                       r"half_pixel, .*\); antialias=1 \(only 0\)\.$"):
        import_onnx(_model([node], {"x": x}, [("scales", np.array([1, 1, 2, 2], np.float32))]))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pools_of_one_and_three_dimensions(op):
    x1 = _x(2, 3, 11)
    for attrs in ({"kernel_shape": [3], "strides": [2], "pads": [1, 1]},
                  {"kernel_shape": [4], "auto_pad": "SAME_LOWER"}):
        _end_to_end(_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x1}), {"x": x1})
    x3 = _x(1, 2, 5, 6, 7)
    extra = [{}] if op == "MaxPool" else [{"count_include_pad": 0}, {"count_include_pad": 1}]
    for more in extra:
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=[2, 3, 3], strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 1],
                                **more)
        qgraph = _end_to_end(_model([node], {"x": x3}), {"x": x3})
        pools = [n for n in qgraph.nodes if n.op in ("MaxPool", "AvgPool")]
        assert [p.attrs["kernel"] for p in pools] == [(3, 3), (2, 1)]


def test_concat_with_a_constant_operand():
    x, c = _x(1, 3, 4, 4), _x(1, 2, 4, 4, spread=5.0)
    qgraph = _end_to_end(_model([helper.make_node("Concat", ["x", "c"], ["y"], axis=1)], {"x": x}, [("c", c)]),
                         {"x": x})
    concat = qgraph.node("Concat_y")
    assert qgraph.constants[concat.inputs[1]].dtype == np.int8 and concat.attrs["multipliers"][1] == 1


def test_clip_with_min_above_max_gives_max():
    x = _x(1, 2, 4, 4)
    model = _model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"x": x},
                   [("lo", np.array(1.0, np.float32)), ("hi", np.array(0.5, np.float32))])
    qgraph = _end_to_end(model, {"x": x})
    clip = qgraph.node("Clip_y")
    assert clip.attrs["lo"] == clip.attrs["hi"] == round(0.5 / qgraph.tensors["x_q"].scale)


def test_parameters_computed_by_another_node_are_named():
    x = _x(1, 4, 3, 3)
    consts = [("s", np.ones(4, np.float32)), ("b", np.zeros(4, np.float32)), ("m", np.zeros(4, np.float32)),
              ("v", np.ones(4, np.float32))]
    nodes = [helper.make_node("Relu", ["s"], ["s2"]),
             helper.make_node("BatchNormalization", ["x", "s2", "b", "m", "v"], ["y"], name="bn")]
    with pytest.raises(UnsupportedOperatorError, match=r"^ONNX operator 'BatchNormalization' \(node 'bn'\) is not "
                                                       r"supported by the lab: its scale input 's2' is computed by "
                                                       r"another node; it must be a constant initializer\.$"):
        import_onnx(_model(nodes, {"x": x, "s": consts[0][1]}, consts[1:]))
    nodes = [helper.make_node("Relu", ["w"], ["w2"]), helper.make_node("Gemm", ["x", "w2"], ["y"], name="fc")]
    graph = import_onnx(_model(nodes, {"x": _x(2, 3), "w": _x(3, 4)}, []))   # a computed B: the MatMul of two
    assert "MatMul" in [n.op for n in graph.nodes]                          # activations (test_transformer_ops)


def test_every_unsupported_node_is_named_at_once():
    x = _x(1, 4, 8, 8)
    nodes = [helper.make_node("Tan", ["x"], ["a"], name="tan"),
             helper.make_node("MaxPool", ["a"], ["b"], kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1],
                              name="pool"),
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("Resize", ["c", "", "s"], ["y"], mode="cubic", antialias=1, name="up")]
    with pytest.raises(UnsupportedModelError) as info:
        import_onnx(_model(nodes, {"x": x}, [("s", np.array([1, 1, 2, 2], np.float32))]), name="net")
    assert str(info.value).splitlines() == [
        "The model net has 3 nodes the lab cannot compile:",
        "  - Tan (node 'tan'): no rule for this operator",
        "  - MaxPool (node 'pool'): dilations [2, 2] (only 1)",
        "  - Resize (node 'up'): antialias=1 (only 0)",
        info.value.args[0].splitlines()[-1]]
    assert str(info.value).splitlines()[-1].startswith("Supported operators are Abs, Add, Atan, Attention,")
    assert [p.node_name for p in info.value.problems] == ["tan", "pool", "up"]


def test_tensors_too_large_for_the_machine_are_refused_before_allocating():
    node = helper.make_node("Relu", ["x"], ["y"])
    model = _model([node], {"x": np.zeros((1, 3, 2, 2), np.float32)})
    for dim, name in zip(model.graph.input[0].type.tensor_type.shape.dim, ("N", "C", "H", "W")):
        if name != "C":
            dim.dim_param = name
    with pytest.raises(TensorTooLargeError, match=r"^The model ops has tensor 'x' of shape 1x3x200000x200000, which "
                                                  r"would take 480\.0 GB; the lab allows .* per tensor on this machine "
                                                  r"\(a quarter of its memory\); give a smaller batch or input "
                                                  r"shape\.$"):
        import_onnx(model, input_shapes={"x": (1, 3, 200000, 200000)})
    model = _model([node], {"x": np.zeros((1, 3, 224, 224), np.float32)})
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    with pytest.raises(TensorTooLargeError, match=r"tensor 'x' of shape 400000000x3x224x224, which would take "
                                                  r"240\.8 TB"):
        import_onnx(model, batch=400_000_000)
    up = helper.make_node("Resize", ["x", "", "s"], ["y"])
    model = _model([up], {"x": np.zeros((1, 3, 8, 8), np.float32)}, [("s", np.array([1, 1, 64, 64], np.float32))])
    with pytest.raises(TensorTooLargeError, match=r"tensor 'y' of shape 1x3x512x512, which would take 3\.1 MB; the "
                                                  r"lab allows 1\.0 MB per tensor"):
        import_onnx(model, max_tensor_bytes=1_000_000)


def test_a_detectors_post_processing_is_refused_with_the_reason():
    """NonZero (a score threshold's survivors) has an output whose size the values decide: named, with what to
    export instead (torchvision's SSDlite writes it in its post-processing)."""
    x = _x(1, 4)
    model = _model([helper.make_node("Greater", ["x", "zero"], ["keep"]),
                    helper.make_node("NonZero", ["keep"], ["where"], name="survivors"),
                    helper.make_node("Cast", ["where"], ["y"], to=1)], {"x": x},
                   [("zero", np.zeros(1, np.float32))])
    with pytest.raises(UnsupportedModelError, match=r"NonZero \(node 'survivors'\): its output's size depends on the "
                                                    r"values.*without its post-processing"):
        import_onnx(model)


def test_constants_folded_past_protobufs_limit_are_refused_naming_the_largest(monkeypatch):
    """A model whose folded constants pass the 2 GiB protobuf holds (torchvision's MViT-v2 at 16x224x224): a
    TensorTooLargeError naming the largest, not protobuf's EncodeError. (The limit is simulated: the serializer
    raises as it does past 2 GiB.)"""
    from google.protobuf.message import EncodeError

    from vta.compiler.frontend import onnx_frontend

    def refuse(*args, **kwargs):
        raise EncodeError("Failed to serialize proto")
    monkeypatch.setattr(onnx_frontend.shape_inference, "infer_shapes", refuse)
    x = _x(1, 4)
    model = _model([helper.make_node("Add", ["x", "table"], ["y"])], {"x": x}, [("table", np.ones((1, 4), np.float32))])
    with pytest.raises(TensorTooLargeError, match=r"constants take 0\.0 GiB.*'table' 1x4.*protobuf's limit"):
        import_onnx(model)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_at_a_computed_grid(mode, padding, align):
    """GridSample at a grid the model computes (RAFT's lookups, a spatial transformer): the float import equals
    onnxruntime; quantized, the CPU run equals the integer reference (float64 from the int8 input and grid)."""
    rng = np.random.default_rng(12)
    x = (rng.standard_normal((1, 3, 6, 7)) * 2).astype(np.float32)
    grid = (rng.uniform(-1.3, 1.3, (1, 4, 5, 2))).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    _, qgraph, got, want = onnx_op_run(_model([node], {"x": x, "g": grid}, opset=17), {"x": x, "g": grid},
                                       atol=1e-5, rtol=1e-5)
    assert "QGridSample" in [n.op for n in qgraph.nodes]
    if mode == "bilinear":
        assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.97
    else:        # the int8 grid may round a position to the next pixel: most outputs are the same pixel's
        assert np.mean(np.abs(got - want) <= 0.1) >= 0.8


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_of_a_volume(mode):
    """Opset 20's volumetric GridSample (VoxelMorph's warp): trilinear or nearest over [N, C, D, H, W]."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    grid = rng.uniform(-1.1, 1.1, (1, 2, 3, 4, 3)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode="border")
    _, qgraph, got, want = onnx_op_run(_model([node], {"x": x, "g": grid}, opset=20), {"x": x, "g": grid},
                                       atol=1e-5, rtol=1e-5)
    assert got.shape == (1, 2, 2, 3, 4) and "QGridSample" in [n.op for n in qgraph.nodes]


def test_grid_sample_at_a_constant_grid_keeps_it_exact():
    """A grid of constants (RAFT's first lookup, at the zero flow) is the node's float attribute: never quantized."""
    x = _x(1, 2, 5, 5)
    grid = np.linspace(-1, 1, 2 * 3 * 4).reshape(1, 3, 4, 2).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], align_corners=1)
    qgraph = _end_to_end(_model([node], {"x": x}, [("g", grid)], opset=17), {"x": x})
    sample = next(n for n in qgraph.nodes if n.op == "QGridSample")
    np.testing.assert_array_equal(sample.attrs["grid"], grid)


def test_grid_sample_refusals_name_what_is_missing():
    x = _x(1, 2, 5, 5)
    grid = RNG.uniform(-1, 1, (1, 3, 4, 2)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode="bicubic", name="warp")
    with pytest.raises(UnsupportedOperatorError, match=r"'warp'.*mode 'bicubic' \(only bilinear/linear and nearest\)"):
        import_onnx(_model([node], {"x": x, "g": grid}, opset=17))
