"""The ONNX frontend (compiler/frontend/onnx_frontend.py): every operator against ONNX Runtime's float output."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.compiler.ir import GraphError

RNG = np.random.default_rng(7)


def _model(nodes, in_shape, out_shape, inits=(), extra_inputs=()):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in extra_inputs]
    graph = helper.make_graph(nodes, "t", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(model, feeds, atol=1e-5):
    g = import_onnx(model)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    got = run_float(g, feeds)["y"]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=atol, rtol=1e-5)
    return g


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("groups,stride,pads,k", [(1, 1, [1, 1, 1, 1], 3), (1, 2, [0, 1, 2, 0], 3),
                                                   (2, 1, [0, 0, 0, 0], 1), (4, 2, [1, 1, 1, 1], 3),
                                                   (1, 2, [3, 3, 3, 3], 7)])
def test_conv(groups, stride, pads, k):
    w = _x(8, 4 // groups, k, k)
    b = _x(8)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[stride, stride],
                            pads=pads, group=groups)
    model = _model([node], (1, 4, 9, 9), None, [("w", w), ("b", b)])
    g = _check(model, {"x": _x(1, 4, 9, 9)})
    conv = g.nodes[0]
    assert conv.op == "Conv2d" and conv.attrs["groups"] == groups and conv.attrs["pads"] == tuple(pads)


def test_conv_auto_pad_same_upper():
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")
    g = _check(_model([node], (1, 2, 8, 8), None, [("w", _x(3, 2, 3, 3))]), {"x": _x(1, 2, 8, 8)})
    assert g.nodes[0].attrs["pads"] == (0, 0, 1, 1)


def test_batchnorm_folds_into_conv_and_stands_alone():
    bn = [("s", RNG.uniform(0.5, 1.5, 4)), ("bb", _x(4)), ("m", _x(4)), ("v", RNG.uniform(0.5, 2, 4))]
    bn = [(k, np.asarray(v, np.float32)) for k, v in bn]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)]
    g = _check(_model(nodes, (1, 3, 6, 6), None, [("w", _x(4, 3, 3, 3))] + bn), {"x": _x(1, 3, 6, 6)})
    assert [n.op for n in g.nodes] == ["Conv2d"] and g.nodes[0].outputs == ["y"]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["y"])]
    g = _check(_model(nodes, (1, 4, 5, 5), None, bn), {"x": _x(1, 4, 5, 5)})
    assert g.nodes[0].op == "Conv2d" and g.nodes[0].attrs["groups"] == 4
    nodes = [helper.make_node("Gemm", ["x", "fw"], ["d"], transB=1),
             helper.make_node("BatchNormalization", ["d", "s", "bb", "m", "v"], ["y"])]
    g = _check(_model(nodes, (2, 3), None, [("fw", _x(4, 3))] + bn), {"x": _x(2, 3)})
    assert [n.op for n in g.nodes] == ["Dense"]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["y"], name="bn1d")]
    g = _check(_model(nodes, (2, 4), None, bn), {"x": _x(2, 4)})         # BatchNorm1d: a [N, C, 1, 1] view
    assert [n.op for n in g.nodes] == ["Reshape", "Conv2d", "Reshape"]
    with pytest.raises(UnsupportedOperatorError, match=r"node 'bn1d'.*an input of shape \[2, 3\] for 4 channels"):
        import_onnx(_model(nodes, (2, 3), None, bn))


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_and_matmul(trans_b):
    w = _x(6, 5) if trans_b else _x(5, 6)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=trans_b, alpha=0.5, beta=2.0)
    _check(_model([node], (2, 5), None, [("w", w), ("b", _x(6))]), {"x": _x(2, 5)})
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    _check(_model([node], (2, 5), None, [("w", _x(5, 6))]), {"x": _x(2, 5)})
    for bias in (_x(1, 6), np.array(0.5, np.float32)):                  # broadcast biases [1, O] and scalar
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=trans_b)
        _check(_model([node], (2, 5), None, [("w", w), ("b", bias)]), {"x": _x(2, 5)})


@pytest.mark.parametrize("op,const", [("Mul", True), ("Add", True), ("Sub", True), ("Div", True), ("Add", False)])
def test_binary(op, const):
    if const:
        model = _model([helper.make_node(op, ["x", "c"], ["y"])], (1, 3, 4, 4), None,
                       [("c", RNG.uniform(0.5, 2, (1, 3, 1, 1)).astype(np.float32))])
        _check(model, {"x": _x(1, 3, 4, 4)})
    else:
        model = _model([helper.make_node("Add", ["x", "z"], ["y"])], (1, 3, 4, 4), None,
                       extra_inputs=[("z", (1, 3, 4, 4))])
        g = _check(model, {"x": _x(1, 3, 4, 4), "z": _x(1, 3, 4, 4)})
        assert g.inputs == ["x", "z"]


def test_activations_and_pools():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
             helper.make_node("Add", ["r", "c"], ["s"]),
             helper.make_node("MaxPool", ["s"], ["m"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["m"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["a"], ["a2"], kernel_shape=[2, 2], pads=[1, 1, 0, 0],
                              count_include_pad=1),
             helper.make_node("GlobalAveragePool", ["a2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Softmax", ["f"], ["y"], axis=-1)]
    inits = [("lo", np.array(-0.5, np.float32)), ("hi", np.array(0.5, np.float32))]
    g = _check(_model(nodes, (1, 3, 9, 9), None, inits), {"x": _x(1, 3, 9, 9) * 3})
    assert [n.op for n in g.nodes] == ["Relu", "Clip", "Add", "MaxPool", "AvgPool", "AvgPool", "GlobalAvgPool",
                                       "Reshape", "Softmax"]
    assert g.nodes[-1].attrs["axis"] == 1 and g.nodes[1].attrs == {"min": -0.5, "max": 0.5}


def test_reshape_pad_concat_identity():
    nodes = [helper.make_node("Pad", ["x", "p"], ["pd"], mode="constant"),
             helper.make_node("Identity", ["pd"], ["i"]),
             helper.make_node("Concat", ["i", "pd"], ["cc"], axis=1),
             helper.make_node("Dropout", ["cc"], ["d"]),
             helper.make_node("Reshape", ["d", "shape"], ["y"])]
    inits = [("p", np.array([0, 0, 1, 0, 0, 0, 0, 2], np.int64)), ("shape", np.array([1, -1], np.int64))]
    g = _check(_model(nodes, (1, 2, 3, 3), None, inits), {"x": _x(1, 2, 3, 3)})
    assert g.shape("y") == (1, 4 * 4 * 5) and [n.op for n in g.nodes] == ["Pad", "Concat", "Reshape"]


def test_dynamic_batch_is_fixed():
    node = helper.make_node("Relu", ["x"], ["y"])
    model = _model([node], ("N", 3), None)
    assert import_onnx(model, batch=2).shape("x") == (2, 3)


def test_unsupported_operator_names_op_and_node():
    model = _model([helper.make_node("Tan", ["x"], ["y"], name="gate_7")], (1, 3), None)
    with pytest.raises(UnsupportedOperatorError, match=r"ONNX operator 'Tan' \(node 'gate_7'\) is not supported "
                                                       r"by the lab; supported operators are .*Conv"):
        import_onnx(model)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], dilations=[2, 2], name="dil")
    with pytest.raises(UnsupportedOperatorError, match=r"'Conv' \(node 'dil'\) .*: dilations \[2, 2\] \(a dilated "
                                                       r"Conv needs constant weights"):
        import_onnx(_model([node], (1, 1, 8, 8), None, [("w2", _x(1, 1, 3, 3))], extra_inputs=[("w", (1, 1, 3, 3))]))
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="mirror", name="refl")
    with pytest.raises(UnsupportedOperatorError, match=r"node 'refl'.*mode 'mirror' \(only constant, reflect, edge "
                                                       r"and wrap\)"):
        import_onnx(_model([node], (1, 4), None, [("p", np.array([0, 1, 0, 1], np.int64))]))
    with pytest.raises(TypeError, match="import_onnx takes a path or an onnx.ModelProto, not int"):
        import_onnx(3)


@pytest.mark.parametrize("group", [0, -1, 3])
def test_a_conv_group_that_does_not_fit_is_refused(group):
    """A group of 0 (a divide by zero before) or one that does not divide the channels names the node and shapes."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[1, 1], group=group, name="grouped")
    with pytest.raises(UnsupportedOperatorError, match=rf"node 'grouped'.*group={group} does not fit its 4 input "
                                                       rf"channels and weights of shape \[4, 4, 1, 1\]"):
        import_onnx(_model([node], (1, 4, 2, 2), None, [("w", _x(4, 4, 1, 1))]))


def test_a_model_of_no_output_elements_is_refused():
    """bert_tiny with a batch of 0 in its file: the input becomes an empty constant and every output folds to an
    empty one; an error, not a graph of nothing (`vta run` then failed with an IndexError)."""
    from vta.compiler.frontend import zoo
    model = onnx.load(zoo.get_model("bert_tiny"))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    with pytest.raises(GraphError, match="no output with elements to compute"):
        import_onnx(model)


def test_import_from_path(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], (1, 3), None)
    onnx.save(model, tmp_path / "relu.onnx")
    g = import_onnx(tmp_path / "relu.onnx")
    assert g.name == "relu" and g.outputs == ["y"]


def test_constant_subgraphs_fold_and_zero_pad_moves_into_conv():
    # pads computed by a constant subgraph (as torch's exporter emits for "same" padding), then Pad -> Conv
    nodes = [helper.make_node("Concat", ["p_lo", "p_hi"], ["p_cat"], axis=0),
             helper.make_node("Cast", ["p_cat"], ["pads"], to=TensorProto.INT64),
             helper.make_node("Pad", ["x", "pads"], ["xp"], mode="constant"),
             helper.make_node("Conv", ["xp", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 0])]
    inits = [("p_lo", np.array([0, 0, 0, 1], np.int32)), ("p_hi", np.array([0, 0, 1, 1], np.int32)),
             ("w", _x(4, 2, 3, 3))]
    g = _check(_model(nodes, (1, 2, 7, 7), None, inits), {"x": _x(1, 2, 7, 7)})
    assert [n.op for n in g.nodes] == ["Conv2d"] and g.nodes[0].attrs["pads"] == (1, 1, 1, 1)
    assert g.nodes[0].inputs[0] == "x"


@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_mean_squeeze_unsqueeze(keepdims):
    out = "y" if keepdims else "m"
    nodes = [helper.make_node("ReduceMean", ["x"], [out], axes=[-1, 2], keepdims=keepdims)]
    if not keepdims:
        nodes += [helper.make_node("Unsqueeze", ["m", "ax"], ["u"]), helper.make_node("Squeeze", ["u", "ax"], ["y"])]
    g = _check(_model(nodes, (1, 3, 4, 5), None, [("ax", np.array([2], np.int64))]), {"x": _x(1, 3, 4, 5)})
    assert g.nodes[0].op == "GlobalAvgPool" and g.shape("y") == ((1, 3, 1, 1) if keepdims else (1, 3))
    channels = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=keepdims)]   # any other axes:
    g = _check(_model(channels, (1, 3, 4, 5), None), {"x": _x(1, 3, 4, 5)})                 # a view, then a pool
    assert [n.op for n in g.nodes] == ["Transpose", "Reshape", "GlobalAvgPool", "Reshape"]


def test_shape_arithmetic_of_activations_folds():
    # torch's x.view(x.size(0), -1): Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    inits = [("zero", np.array(0, np.int64)), ("ax", np.array([0], np.int64)), ("minus1", np.array([-1], np.int64))]
    g = _check(_model(nodes, (2, 3, 4, 4), None, inits), {"x": _x(2, 3, 4, 4)})
    assert [n.op for n in g.nodes] == ["Relu", "Reshape"] and g.shape("y") == (2, 48)


# ---- files that are not models, opsets, symbolic input dimensions ----------------------------------------------------
def test_model_file_errors_name_the_file(tmp_path):
    from vta.compiler.frontend.onnx_frontend import ModelFileError
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelFileError, match=rf"^The model {empty} is empty \(0 bytes\), not an ONNX model file "
                                             rf"\(\.onnx\)\.$"):
        import_onnx(empty)
    with pytest.raises(ModelFileError, match=rf"^The model {tmp_path} is a folder, not an ONNX model file "
                                             rf"\(\.onnx\)\.$"):
        import_onnx(tmp_path)
    with pytest.raises(ModelFileError, match=rf"^Cannot read the model {tmp_path}/missing.onnx: No such file or "
                                             rf"directory\.$"):
        import_onnx(tmp_path / "missing.onnx")
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 20)
    with pytest.raises(ModelFileError, match=rf"^The model {text} is not an ONNX model file \(\.onnx\), or it is "
                                             rf"truncated: its 400 bytes do not decode as an ONNX protobuf \("):
        import_onnx(text)


def test_truncated_model_is_a_model_file_error(tmp_path):
    from vta.compiler.frontend.onnx_frontend import ModelFileError
    model = _model([helper.make_node("Relu", ["x"], ["y"])], (1, 3), None)
    data = model.SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelFileError, match=rf"^The model {cut} .*truncated"):
        import_onnx(cut)


def test_protobuf_without_a_graph(tmp_path):
    from vta.compiler.frontend.onnx_frontend import ModelFileError
    path = tmp_path / "nograph.onnx"
    path.write_bytes(onnx.ModelProto(ir_version=8).SerializeToString())
    with pytest.raises(ModelFileError, match=rf"^The model {path} holds no ONNX graph with nodes and outputs; it is "
                                             rf"not an ONNX model file \(\.onnx\), or it is truncated\.$"):
        import_onnx(path)


@pytest.mark.parametrize("opset", [6, 29])
def test_unsupported_opset(opset):
    from vta.compiler.frontend.onnx_frontend import SUPPORTED_OPSETS, UnsupportedOpsetError
    model = _model([helper.make_node("Relu", ["x"], ["y"])], (1, 3), None)
    model.opset_import[0].version = opset
    assert SUPPORTED_OPSETS == (13, 28)
    with pytest.raises(UnsupportedOpsetError, match=rf"^The model t uses ONNX opset {opset}; the frontend supports "
                                                    r"opsets 13 to 28 \(convert it, e\.g\. with "
                                                    r"onnx\.version_converter\.convert_version\)\.$"):
        import_onnx(model)
    model.opset_import[0].version = 13
    assert import_onnx(model).shape("y") == (1, 3)


def _opset9_model():
    """An opset-9 model of the forms the version converter rewrites: Upsample (-> Resize), Pad and Clip with their
    bounds as attributes (-> inputs), a Softmax of a 2-D coercion, Squeeze's axes attribute, BatchNormalization."""
    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.4).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    inits += [numpy_helper.from_array(v.astype(np.float32), n) for n, v in
              (("g", 1 + 0.1 * rng.standard_normal(4)), ("b", 0.1 * rng.standard_normal(4)),
               ("m", 0.1 * rng.standard_normal(4)), ("v", 1 + 0.1 * rng.random(4)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
             helper.make_node("Clip", ["n"], ["r"], min=-1.0, max=2.0),
             helper.make_node("Upsample", ["r", "scales"], ["u"], mode="nearest"),
             helper.make_node("Pad", ["u"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="constant", value=0.0),
             helper.make_node("GlobalAveragePool", ["p"], ["gp"]),
             helper.make_node("Squeeze", ["gp"], ["sq"], axes=[2, 3]),
             helper.make_node("Softmax", ["sq"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    return model


def test_an_older_opset_is_converted_and_computes_what_onnxruntime_does(caplog):
    """Opsets 7 to 12 are converted to 13 by onnx's version converter, with a warning; the float import equals
    onnxruntime on the original file and the quantized graph on the CPU path equals the integer reference."""
    import logging

    from vta.compiler import qops
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.kernels import cpu
    model = _opset9_model()
    x = {"x": np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    with caplog.at_level(logging.WARNING, logger="vta"):
        graph = import_onnx(model)
    assert "uses ONNX opset 9; the lab converted it to opset 13" in caplog.text
    np.testing.assert_allclose(run_float(graph, x)["y"], want, atol=1e-5, rtol=1e-4)
    qgraph = quantize(graph, x)
    np.testing.assert_array_equal(cpu.run_cpu(qgraph, x)["y"], qops.run_reference(qgraph, x)["y"])


def test_an_older_opset_the_converter_cannot_take_is_refused_with_its_reason():
    from vta.compiler.frontend.onnx_frontend import UnsupportedOpsetError
    model = _model([helper.make_node("Crop", ["x"], ["y"], border=[1, 1, 1, 1])], (1, 3, 6, 6), None)
    model.opset_import[0].version = 9
    with pytest.raises(UnsupportedOpsetError, match=r"^The model t uses ONNX opset 9; the frontend supports opsets 13 "
                                                    r"to 28, and onnx's version converter could not convert it to 13 "
                                                    r"\(.*Crop|no registered schema"):
        import_onnx(model)


def test_model_without_default_opset():
    from vta.compiler.frontend.onnx_frontend import UnsupportedOpsetError
    model = _model([helper.make_node("Relu", ["x"], ["y"])], (1, 3), None)
    model.opset_import[0].domain = "com.example"
    with pytest.raises(UnsupportedOpsetError, match=r"^The model t imports no ai\.onnx opset; the frontend supports "
                                                    r"opsets 13 to 28\.$"):
        import_onnx(model)


def test_symbolic_dims_beyond_batch_need_input_shape():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], ("N", 3, "H", "W"), None)
    with pytest.raises(ValueError, match=r"^The model t has input 'x' of shape Nx3xHxW, with symbolic or unknown "
                                         r"dimensions \(H, W\) besides the batch; give its whole shape, e\.g\. "
                                         r"--input-shape x=2x3x224x224\.$"):
        import_onnx(model, batch=2)
    g = import_onnx(model, input_shapes={"x": (1, 3, 8, 6)})
    assert g.shape("x") == (1, 3, 8, 6) and g.shape("y") == (1, 3, 8, 6)


def test_unknown_dim_without_name_needs_input_shape():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], (1, 3), None)
    model.graph.input[0].type.tensor_type.shape.dim[1].Clear()  # neither a value nor a name
    with pytest.raises(ValueError, match=r"^The model t has input 'x' of shape 1x\?, with symbolic or unknown "
                                         r"dimensions \(\?\) besides the batch; give its whole shape, e\.g\. "
                                         r"--input-shape x=1x224\.$"):
        import_onnx(model)


def test_a_reshape_fixed_at_the_export_size_names_the_sizes_this_import_set(tmp_path, capsys):
    """A traced export keeps its Reshape constants at the size it was traced at, while its inputs stay symbolic
    (MobileViT at another image size): the Reshape is named with both sizes, and the input sizes the run set."""
    from vta.cli import main

    shape = ("shape", np.array([1, 3, 64 * 64], np.int64))
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="flat")], ("batch", 3, "height", None),
                   None, [shape])
    with pytest.raises(GraphError, match=r"^Reshape node 'flat' reshapes tensor 'x' of shape 1x3x32x32 \(3,072 "
                                         r"elements\) into 1x3x4096 \(12,288 elements\): its shape does not fit\. The "
                                         r"file leaves sizes of its inputs open and this import set them \(x: "
                                         r"batch=1, height=32, dimension 3=32\); an exporter .* with --input-shape"):
        import_onnx(model, input_shapes={"x": (1, 3, 32, 32)})
    assert import_onnx(model, input_shapes={"x": (1, 3, 64, 64)}).shape("y") == (1, 3, 4096)
    fixed = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="flat")], (1, 3, 32, 32), None, [shape])
    with pytest.raises(GraphError, match=r"its shape does not fit\.$"):      # no sizes were open: no such hint
        import_onnx(fixed)
    path = tmp_path / "traced.onnx"
    onnx.save(model, path)
    assert main(["run", str(path), "--input-shape", "x=1x3x32x32", "--target", "cpu"]) != 0
    err = capsys.readouterr().err
    assert "its shape does not fit" in err and "Traceback" not in err


def test_input_shape_must_fit_the_model():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], ("N", 3, "H", "W"), None)
    with pytest.raises(ValueError, match=r"^--input-shape x=1x4x8x8 does not fit the model t, whose input 'x' has "
                                         r"shape Nx3xHxW; give 4 dimensions that keep the fixed ones\.$"):
        import_onnx(model, input_shapes={"x": (1, 4, 8, 8)})
    with pytest.raises(ValueError, match=r"^--input-shape x=1x3x8 does not fit the model t"):
        import_onnx(model, input_shapes={"x": (1, 3, 8)})
    with pytest.raises(ValueError, match=r"^--input-shape names 'img', which is not an input of the model t; its "
                                         r"inputs are 'x'\.$"):
        import_onnx(model, input_shapes={"img": (1, 3, 8, 8)})


def test_bad_batch():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], ("N", 3), None)
    with pytest.raises(ValueError, match=r"^batch must be a positive integer \(images per inference\), not 0\.$"):
        import_onnx(model, batch=0)


def _fsim_matches_reference(model, x, tmp_path):
    """``model`` (one input ``x``, one output ``y``) compiled with the accel policy: its fsim output equals the
    integer reference's. Returns the compiled model."""
    from vta.compiler import qops
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel")
    np.testing.assert_array_equal(run(compiled, {"x": x}, target="fsim").outputs["y"],
                                  qops.run_reference(compiled.graph, {"x": x})["y"])
    return compiled


@pytest.mark.parametrize("attrs", [dict(), dict(strides=[2], pads=[1, 1]), dict(group=2, pads=[2, 0]),
                                   dict(auto_pad="SAME_UPPER", strides=[2])])
def test_conv1d_imports_as_a_2d_convolution_over_one_row(attrs, tmp_path, monkeypatch):
    """A 1D convolution (Whisper's and wav2vec's stems) runs as a Conv2d over [N, C, 1, L]: the float reference
    against onnxruntime, and the compiled model bit-exact on fsim with the convolution on the accelerator."""
    from vta.compiler.runtime.compiled import AccelStep
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    groups = attrs.get("group", 1)
    w = (rng.standard_normal((32, 16 // groups, 3)) * 0.3).astype(np.float32)
    model = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", kernel_shape=[3], **attrs)],
                   (1, 16, 24), None, [("w", w), ("b", rng.standard_normal(32).astype(np.float32))])
    x = rng.standard_normal((1, 16, 24)).astype(np.float32)
    graph = _check(model, {"x": x})
    assert "Conv2d" in {n.op for n in graph.nodes}
    compiled = _fsim_matches_reference(model, x, tmp_path)
    assert any(isinstance(s, AccelStep) and s.node.op == "QConv2d" for s in compiled.steps)


def test_gather_elements_of_an_activation_by_constant_indices(tmp_path, monkeypatch):
    """DeBERTa's relative-position attention gathers scores by constant indices: TakeAlong, on the CPU, the same
    move of values in float and in int8 (bit-exact on fsim); negative indices count from the end."""
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    idx = rng.integers(-6, 6, (2, 4, 5)).astype(np.int64)
    w = (rng.standard_normal((5, 8)) * 0.3).astype(np.float32)
    model = _model([helper.make_node("GatherElements", ["x", "idx"], ["g"], axis=2),
                    helper.make_node("MatMul", ["g", "w"], ["y"])], (2, 4, 6), [2, 4, 8], [("idx", idx), ("w", w)])
    x = rng.standard_normal((2, 4, 6)).astype(np.float32)
    graph = _check(model, {"x": x})
    assert "TakeAlong" in {n.op for n in graph.nodes}
    _fsim_matches_reference(model, x, tmp_path)


@pytest.mark.parametrize("op,opset,groups,shape", [("InstanceNormalization", 17, None, (2, 8, 12)),
                                                   ("GroupNormalization", 18, 2, (2, 8, 12)),
                                                   ("GroupNormalization", 21, 4, (2, 8, 3, 4)),
                                                   ("GroupNormalization", 21, 8, (2, 8, 12))])
def test_instance_and_group_normalization(op, opset, groups, shape):
    """wav2vec2's GroupNorm: InstanceNormalization as torch's TorchScript exporter writes it, and GroupNormalization
    (per-group scale at opset 18, per-channel at 21; rewritten into the former); against onnxruntime."""
    rng = np.random.default_rng(0)
    c = 8
    size = c if op == "InstanceNormalization" or opset >= 21 else groups
    attrs = {"epsilon": 1e-5, **({"num_groups": groups} if groups else {})}
    model = _model([helper.make_node(op, ["x", "s", "b"], ["y"], name="norm", **attrs)], shape, list(shape),
                   [("s", rng.uniform(0.5, 1.5, size).astype(np.float32)),
                    ("b", rng.standard_normal(size).astype(np.float32))])
    model.opset_import[0].version = opset
    graph = _check(model, {"x": rng.standard_normal(shape).astype(np.float32)}, atol=1e-4)
    assert "LayerNorm" in {n.op for n in graph.nodes}
    from vta.compiler.frontend.quantize import quantize
    quantize(graph, [{"x": rng.standard_normal(shape).astype(np.float32)}])      # the affine quantizes


def test_gather_nd_of_one_index_per_lookup():
    """Falcon under torch's new exporter splits its fused QKV with GatherND(x, [[-2]]): a Gather on axis 0."""
    rng = np.random.default_rng(0)
    model = _model([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=0)], (4, 3, 5), [1, 3, 5],
                   [("i", np.array([[-2]], np.int64))])
    _check(model, {"x": rng.standard_normal((4, 3, 5)).astype(np.float32)})
    bad = _model([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=0, name="g")], (4, 3, 5), [1, 5],
                 [("i", np.array([[1, 2]], np.int64))])
    with pytest.raises(UnsupportedOperatorError, match="one index per lookup"):
        import_onnx(bad)


def test_an_output_that_is_its_input_unchanged_keeps_its_own_name():
    """A model whose output ``y`` is its input ``x`` unchanged (an Identity; a scatter of no update): the graph's
    output is a copy named ``y`` (it was ``x``, so ``--output`` saved the outputs under the input's name)."""
    model = _model([helper.make_node("Identity", ["x"], ["y"])], (1, 4), None)
    g = import_onnx(model)
    assert g.outputs == ["y"] and g.inputs == ["x"]
