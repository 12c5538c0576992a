"""A QDQ model (onnxruntime's quantize_static) with operators the integer import does not take (here an Einsum for
a transformer's attention, before a LayerNorm decomposed into ReduceMean, Sub, Pow, Sqrt, Div) imports as its
dequantized float graph (compiler/frontend/dequantize.py), with a warning; the run measures its error against
onnxruntime on the quantized file and says so. Without the Einsum, the same block imports as integers."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops

B, T, D = 2, 8, 16
node = helper.make_node


def _model(nodes: list, inits: dict, name: str) -> onnx.ModelProto:
    """An opset-17 model of ``nodes`` from ``x [B, T, D]`` to ``y [B, T, D]`` with initializers ``inits``."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _float_block(decomposed: bool = False, einsum: bool = False) -> onnx.ModelProto:
    """x [B, T, D] -> Q, K, V projections -> softmax(Q K^T) V -> LayerNorm -> y. ``decomposed``: the LayerNorm as
    the ReduceMean, Sub, Pow, Sqrt, Div chain some exporters write. ``einsum``: ``P V`` as an Einsum, which the
    integer import does not take (the rest of the block it does, since 2026-11-28: the decomposed LayerNorm too), so
    the QDQ file takes the float fallback."""
    rng = np.random.default_rng(0)
    inits = {f"w{r}": (rng.standard_normal((D, D)) * 0.3).astype(np.float32) for r in "qkv"}
    inits.update(gamma=np.ones(D, np.float32), beta=np.zeros(D, np.float32))
    nodes = [node("MatMul", ["x", f"w{r}"], [r]) for r in "qkv"]
    nodes += [node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["s"]),
              node("Softmax", ["s"], ["p"], axis=-1),
              node("Einsum", ["p", "v"], ["c"], equation="bts,bsd->btd") if einsum else
              node("MatMul", ["p", "v"], ["c"])]
    if not decomposed:
        return _model(nodes + [node("LayerNormalization", ["c", "gamma", "beta"], ["y"], axis=-1)], inits, "block")
    inits.update(two=np.array(2.0, np.float32), eps=np.array(1e-5, np.float32))
    nodes += [node("ReduceMean", ["c"], ["mean"], axes=[-1]), node("Sub", ["c", "mean"], ["centred"]),
              node("Pow", ["centred", "two"], ["squares"]), node("ReduceMean", ["squares"], ["var"], axes=[-1]),
              node("Add", ["var", "eps"], ["var_eps"]), node("Sqrt", ["var_eps"], ["dev"]),
              node("Div", ["centred", "dev"], ["normed"]), node("Mul", ["normed", "gamma"], ["scaled"]),
              node("Add", ["scaled", "beta"], ["y"])]
    return _model(nodes, inits, "block")


def _x(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((B, T, D)).astype(np.float32)


def _reader():
    """onnxruntime's calibration reader over four seeded inputs ``x``."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter([{"x": _x(seed)} for seed in range(4)])

        def get_next(self):  # noqa: ANN201 - onnxruntime's interface
            return next(self.data, None)

    return Reader()


@pytest.fixture
def qdq_file(tmp_path):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    source, path = tmp_path / "block.onnx", tmp_path / "block.qdq.onnx"
    onnx.save(_float_block(decomposed=True, einsum=True), str(source))
    quantize_static(str(source), str(path), _reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)
    return path


def test_a_qdq_transformer_block_imports_as_its_dequantized_float_graph(qdq_file, caplog, monkeypatch, tmp_path):
    from vta.compiler.frontend.dequantize import qdq_to_float
    from vta.compiler.frontend.prequant import complete_partial, import_model, is_quantized_model
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    model = onnx.load(str(qdq_file))
    assert is_quantized_model(model)
    plain = qdq_to_float(model)
    assert plain is not None and not any(n.op_type == "QuantizeLinear" and n.input[0] in ("q", "s", "p", "c")
                                         for n in plain.graph.node)
    graph = import_model(str(qdq_file))
    assert not graph.is_quantized and graph.partial is not None        # float islands: completed once calibrated
    with caplog.at_level(logging.WARNING, logger="vta"):
        assert complete_partial(graph, {"x": _x()}) is None             # ... but its Einsum is refused still
    assert "imported as its dequantized float graph" in caplog.text and "does not change that" in caplog.text
    assert {"q", "s", "p"} <= set(graph.absmax_hints)          # the file's own activation ranges, by tensor
    assert all(np.isfinite(v) and v > 0 for v in graph.absmax_hints.values())
    assert {"MatMul", "Softmax"} <= {n.op for n in graph.nodes}
    from vta.compiler.frontend.float_ref import run_float
    float_out = onnx.reference.ReferenceEvaluator(_float_block(decomposed=True, einsum=True)).run(None, {"x": _x()})[0]
    got = run_float(graph, {"x": _x()})["y"]
    cosine = float(got.ravel() @ float_out.ravel() / np.linalg.norm(got) / np.linalg.norm(float_out))
    assert cosine > 0.999                                      # int8 weights, float activations


def test_vta_run_of_a_qdq_block_says_what_it_measured_against(qdq_file, capsys, monkeypatch, tmp_path):
    from vta.cli import main
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "x.npz"
    np.savez(data, x=_x())
    code = main(["run", str(qdq_file), "--target", "fsim", "--input", str(data), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and "matches_integer_reference: True" in out
    assert "activation ranges taken from the quantized file (its own calibration)" in out
    assert f"error against the quantized model as given (onnxruntime on the quantized file {qdq_file})" in out
    assert "imported as its dequantized float graph" in err


def test_a_dynamically_quantized_block_imports_as_float_matmuls(tmp_path, caplog):
    """quantize_dynamic's MatMulInteger chains become float MatMuls by the int8 weights' values."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import import_model
    source, path = tmp_path / "block.onnx", tmp_path / "block.dynamic.onnx"
    onnx.save(_float_block(), str(source))
    quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8)
    assert any(n.op_type == "MatMulInteger" for n in onnx.load(str(path)).graph.node)
    with caplog.at_level(logging.WARNING, logger="vta"):
        graph = import_model(str(path))
    assert "imported as its dequantized float graph" in caplog.text and not graph.is_quantized
    ops = [n.op for n in graph.nodes]
    assert ops.count("Conv2d") == 3 and ops.count("MatMul") == 2  # Q, K, V over the tokens; Q.K^T and P.V
    got, want = run_float(graph, {"x": _x()})["y"], onnx.reference.ReferenceEvaluator(_float_block()).run(
        None, {"x": _x()})[0]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_tf2onnx_dynamic_range_tflite_form_imports_as_float_matmuls(caplog):
    """tf2onnx's form of a dynamic-range TFLite model: ``DequantizeLinear(DynamicQuantizeLinear(x))`` (a fake
    quantization of the activation at a scale computed at run time) before a float MatMul by ``DequantizeLinear`` of
    int8 weights: the activation's pair is ``x``, the weights fold to their int8 values."""
    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import import_model
    rng = np.random.default_rng(3)
    wq = rng.integers(-127, 128, (D, D)).astype(np.int8)
    nodes = [node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             node("DequantizeLinear", ["wq", "ws", "wz"], ["w"]),
             node("MatMul", ["xd", "w"], ["m"]), node("Relu", ["m"], ["y"])]
    model = _model(nodes, {"wq": wq, "ws": np.array(0.01, np.float32), "wz": np.array(0, np.int8)}, "tflite_dynamic")
    with caplog.at_level(logging.WARNING, logger="vta"):
        graph = import_model(model)
    assert "imported as its dequantized float graph" in caplog.text and not graph.is_quantized
    assert [n.op for n in graph.nodes].count("Conv2d") == 1
    want = np.maximum(_x() @ (wq.astype(np.float32) * 0.01), 0)
    np.testing.assert_allclose(run_float(graph, {"x": _x()})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_channel", [False, True])
def test_onnxruntimes_fused_dynamic_matmuls_import_as_the_chains_they_fuse(per_channel, tmp_path):
    """onnxruntime's extended graph optimization saves quantize_dynamic's chains fused: DynamicQuantizeMatMul where
    one MatMul reads the quantized input (its bias folded in), MatMulIntegerToFloat where Q, K and V share it. Both
    become the float MatMuls (and bias Adds) the unfused file gives, value for value."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import import_model
    rng = np.random.default_rng(3)
    inits = {**{f"w{r}": (rng.standard_normal((D, D)) * 0.3).astype(np.float32) for r in "qkvo"},
             "b": (rng.standard_normal(D) * 0.1).astype(np.float32)}
    nodes = [node("MatMul", ["x", "wq"], ["q0"]), node("Add", ["q0", "b"], ["q"]), node("MatMul", ["x", "wk"], ["k"]),
             node("MatMul", ["x", "wv"], ["v"]), node("Add", ["q", "k"], ["s"]), node("Mul", ["s", "v"], ["m"]),
             node("MatMul", ["m", "wo"], ["y"])]
    source, dynamic, fused = (tmp_path / f"{n}.onnx" for n in ("block", "dynamic", "fused"))
    onnx.save(_model(nodes, inits, "fused"), str(source))
    quantize_dynamic(str(source), str(dynamic), weight_type=QuantType.QInt8, per_channel=per_channel)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(fused)
    ort.InferenceSession(str(dynamic), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(fused)).graph.node]
    assert ops.count("MatMulIntegerToFloat") == 3 and ops.count("DynamicQuantizeMatMul") == 1, ops
    x = _x()
    want = run_float(import_model(str(dynamic)), {"x": x})["y"]
    np.testing.assert_allclose(run_float(import_model(str(fused)), {"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("per_channel, mask", [(False, False), (True, True)])
def test_quantize_dynamic_of_an_optimized_attention_imports_as_its_float_attention(per_channel, mask, tmp_path):
    """onnxruntime's documented int8 path for BERT, optimize_model then quantize_dynamic, turns com.microsoft
    Attention into QAttention of DynamicQuantizeLinear: it becomes the Attention by the int8 weights' values (a
    mask_index kept), which the contrib rewrite imports; its float graph gives the fused file's outputs (onnxruntime
    on the file quantizes the input on the fly: within its int8 error)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import import_model
    rng = np.random.default_rng(5)
    inits = {"w": (rng.standard_normal((D, 3 * D)) * 0.3).astype(np.float32),
             "b": (rng.standard_normal(3 * D) * 0.1).astype(np.float32),
             "wo": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    attention_in = ["x", "w", "b"]
    if mask:
        inits["m"] = np.array([T, T - 3], np.int32)             # row 1: its last 3 keys masked
        attention_in.append("m")
    nodes = [helper.make_node("Attention", attention_in, ["a"], name="attention", domain="com.microsoft", num_heads=2),
             node("MatMul", ["a", "wo"], ["y"])]
    model = _model(nodes, inits, "attention")
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    source, path = tmp_path / "attention.onnx", tmp_path / "attention.dynamic.onnx"
    onnx.save(model, str(source))
    quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8, per_channel=per_channel,
                     extra_options={"DefaultTensorType": TensorProto.FLOAT})
    assert "QAttention" in [n.op_type for n in onnx.load(str(path)).graph.node]
    graph = import_model(str(path))
    assert not graph.is_quantized and [n.op for n in graph.nodes].count("MatMul") == 2    # Q.K^T and P.V
    x = _x()
    got = run_float(graph, {"x": x})["y"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


@pytest.mark.parametrize("per_channel", [False, True])
def test_a_dynamically_quantized_patch_embedding_imports_as_a_float_conv(per_channel, tmp_path):
    """quantize_dynamic writes a ViT's patch embedding as ConvInteger of DynamicQuantizeLinear: it becomes the float
    Conv with the int8 weights' values (per-channel scales along the output channels)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import import_model
    rng = np.random.default_rng(5)
    inits = {"w": (rng.standard_normal((8, 3, 4, 4)) * 0.2).astype(np.float32),
             "b": (rng.standard_normal(8) * 0.1).astype(np.float32),
             "flat": np.array([1, 8, 16], np.int64), "proj": (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)}
    nodes = [node("Conv", ["img", "w", "b"], ["p"], kernel_shape=[4, 4], strides=[4, 4]),
             node("Reshape", ["p", "flat"], ["t"]), node("MatMul", ["t", "proj"], ["y"])]
    graph = helper.make_graph(nodes, "patches",
                              [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    source, path = tmp_path / "patches.onnx", tmp_path / "patches.dynamic.onnx"
    onnx.save(model, str(source))
    quantize_dynamic(str(source), str(path), weight_type=QuantType.QInt8, per_channel=per_channel)
    assert any(n.op_type == "ConvInteger" for n in onnx.load(str(path)).graph.node)
    imported = import_model(str(path))
    assert "Conv2d" in [n.op for n in imported.nodes]
    img = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = run_float(imported, {"img": img})["y"]
    want = onnx.reference.ReferenceEvaluator(model).run(None, {"img": img})[0]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_decomposed_layernorm_imports_as_integers(fmt, tmp_path):
    """The block without the Einsum. onnxruntime leaves its decomposed LayerNorm in float in part (a partially
    quantized file: the mean, the difference and the squares float); with calibration samples the lab completes
    that island (compiler/frontend/prequant_complete.py): the decomposition, without the file's pairs inside it, is
    one QLayerNorm between the file's pairs on its input and output in QDQ format (QOperator's steps stay: its two
    ReduceMeans dense layers of ones at the weight scale 1/D), so the whole block runs as integers and follows
    onnxruntime on the file (graph optimizations off): cosine at least 0.999 over four inputs it was not calibrated
    on. (Measured 0.99982 in both formats before the fusion, 0.99996 in QDQ after it; the float graph without the
    samples, 0.99246.)"""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from vta.compiler import qops
    from vta.compiler.frontend.prequant import complete_partial, import_model

    source, path = tmp_path / "block.onnx", tmp_path / f"block.{fmt}.onnx"
    onnx.save(_float_block(decomposed=True), str(source))
    quantize_static(str(source), str(path), _reader(), quant_format=getattr(QuantFormat, fmt),
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    completed = complete_partial(import_model(str(path)), {"x": np.concatenate([_x(seed) for seed in range(4)])})
    assert completed is not None, "the completed file was refused"
    graph = completed[0]
    assert graph.is_quantized
    ops = [n.op for n in graph.nodes]
    if fmt == "QDQ":                                # three projections; Q K^T, P V; one QLayerNorm
        assert ops.count("QDense") == 3 and ops.count("QMatMul") == 2 and "QLayerNorm" in ops
    else:                                           # QOperator keeps its steps: the two means as dense layers
        assert ops.count("QDense") == 5 and ops.count("QMatMul") == 2
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for seed in range(10, 14):
        lab = qops.run_reference(graph, {"x": _x(seed)})[graph.outputs[0]].astype(np.float64).ravel()
        ref = session.run(None, {"x": _x(seed)})[0].astype(np.float64).ravel()
        assert lab @ ref / np.linalg.norm(lab) / np.linalg.norm(ref) >= 0.999


@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
def test_a_qoperator_transformer_imports_as_its_dequantized_float_graph(activation, tmp_path, caplog):
    """A QOperator file (QLinearMatMul, com.microsoft's QLinearSoftmax...) with operators the integer import does not
    take (here an Einsum) becomes QDQ (each quantized operator as DequantizeLinear, the float
    operator, QuantizeLinear; the shape operators on quantized tensors likewise) and then its float graph, as a QDQ
    file does."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import complete_partial, import_model

    source, path = tmp_path / "block.onnx", tmp_path / "block.qop.onnx"
    onnx.save(_float_block(decomposed=True, einsum=True), str(source))
    quantize_static(str(source), str(path), _reader(), quant_format=QuantFormat.QOperator,
                    activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8)
    assert any(n.op_type == "QLinearMatMul" for n in onnx.load(str(path)).graph.node)
    graph = import_model(str(path))
    assert not graph.is_quantized and graph.partial is not None
    with caplog.at_level(logging.WARNING, logger="vta"):
        assert complete_partial(graph, {"x": _x()}) is None
    assert "imported as its dequantized float graph" in caplog.text
    assert {"MatMul", "Softmax"} <= {n.op for n in graph.nodes}
    float_out = onnx.reference.ReferenceEvaluator(_float_block(decomposed=True, einsum=True)).run(None, {"x": _x()})[0]
    got = run_float(graph, {"x": _x()})["y"]
    assert float(got.ravel() @ float_out.ravel() / np.linalg.norm(got) / np.linalg.norm(float_out)) > 0.999


def test_a_file_that_cannot_be_made_float_is_refused_with_what_to_do():
    """A quantized operator with a scale computed at run time cannot be made float again: the error names it and
    says to quantize in QDQ format or give the float model."""
    from vta.compiler.frontend.prequant import import_model
    from vta.compiler.ir import GraphError
    model = _float_block()
    model.graph.node.insert(0, node("QLinearMatMul", ["xq", "xs", "xz", "xq", "xs", "xz", "xs", "xz"], ["odd"]))
    model.graph.node.insert(0, node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]))
    model.graph.node.insert(0, node("ReduceMax", ["x"], ["xs"], keepdims=0))
    model.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int8), "xz"))
    model.graph.output.append(helper.make_tensor_value_info("odd", TensorProto.INT8, None))
    with pytest.raises(GraphError, match=r"is quantized with QLinearMatMul, which the lab neither imports as integers "
                                         r"here .*Quantize the float model in QDQ format.*or give the lab the float"):
        import_model(model)


def test_other_quantized_formats_are_not_dequantized():
    from vta.compiler.frontend.dequantize import qdq_to_float
    dynamic = _float_block()
    dynamic.graph.node.insert(0, node("ConvInteger", ["x", "wq"], ["xq"]))
    assert qdq_to_float(dynamic) is None


def test_random_calibration_takes_the_files_ranges(qdq_file, monkeypatch, tmp_path):
    """Without --calibration data, a tensor the QDQ file quantized gets the file's range: scale = range / 127."""
    from vta.compiler.frontend.prequant import import_model
    from vta.compiler.options import CompileOptions
    from vta.compiler.pipeline import compile_model
    from vta.config import VTAConfig
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    graph = import_model(str(qdq_file))
    compiled = compile_model(str(qdq_file), VTAConfig(), CompileOptions(calib=2), graph=graph)
    assert compiled.meta["calibration"]["ranges_from_file"] == len(graph.absmax_hints)
    assert compiled.graph.tensors["s"].scale == pytest.approx(graph.absmax_hints["s"] / 127)


def _relu_block(gelu: bool) -> onnx.ModelProto:
    """x [B, T, D] -> MatMul + bias -> ReLU (or the Erf form of GELU) -> MatMul -> y: the MLP of a transformer."""
    rng = np.random.default_rng(3)
    inits = {"w1": (rng.standard_normal((D, 2 * D)) * 0.3).astype(np.float32),
             "b1": (rng.standard_normal(2 * D) * 0.1).astype(np.float32),
             "w2": (rng.standard_normal((2 * D, D)) * 0.3).astype(np.float32),
             "root2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [node("MatMul", ["x", "w1"], ["h0"]), node("Add", ["h0", "b1"], ["h"])]
    if gelu:
        nodes += [node("Div", ["h", "root2"], ["hd"]), node("Erf", ["hd"], ["e"]), node("Add", ["e", "one"], ["e1"]),
                  node("Mul", ["h", "e1"], ["he"]), node("Mul", ["he", "half"], ["a"])]
    else:
        nodes.append(node("Relu", ["h"], ["a"]))
    nodes.append(node("MatMul", ["a", "w2"], ["y"]))
    return _model(nodes, inits, "mlp")


@pytest.mark.parametrize("activation", ["QUInt8", "QInt8"])
@pytest.mark.parametrize("gelu", [False, True])
def test_a_relu_onnxruntime_folded_into_its_quantizer_comes_back_as_a_clamp(activation, gelu, tmp_path):
    """With asymmetric activations onnxruntime deletes a ReLU before a QuantizeLinear whose zero point sits at the
    bottom of its range (the pair's clamp computes it). The dequantized graph clamps there again: it computes what
    the file does (a run without the clamp let the negative values through). GELU's ``1 + erf`` also quantizes with
    its zero point at the bottom, but is never negative: no clamp, and GELU still fuses into one node."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from vta.compiler.frontend.dequantize import qdq_to_float
    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.onnx_frontend import import_onnx

    source, path = tmp_path / "mlp.onnx", tmp_path / "mlp.qdq.onnx"
    onnx.save(_relu_block(gelu), str(source))
    quantize_static(str(source), str(path), _reader(), quant_format=QuantFormat.QDQ,
                    activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8)
    model = onnx.load(str(path))
    plain = qdq_to_float(model)
    assert plain is not None
    clamps = [n for n in plain.graph.node if n.op_type == "Clip"]
    if gelu:
        assert not clamps and "Gelu" in [n.op for n in import_onnx(plain).nodes]
    else:
        assert "Relu" not in [n.op_type for n in model.graph.node]        # onnxruntime folded it
        assert len(clamps) == 1
    import onnxruntime as ort
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": _x()})[0]
    reference = onnx.reference.ReferenceEvaluator(_relu_block(gelu)).run(None, {"x": _x()})[0]
    got = run_float(import_onnx(plain), {"x": _x()})["y"]
    def cosine(a, b):
        return float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))
    assert cosine(got, reference) > 0.999 and cosine(got, want) > 0.999


def _opset21_file(path: Path, nodes: list, inits: list, k: int, n: int) -> Path:
    """``nodes`` from ``x [1, 8, k]`` to ``y [1, 8, n]`` with initializers ``inits``, saved at ``path`` at opset 21
    (blocked DequantizeLinear, int4)."""
    graph = helper.make_graph(nodes, path.stem, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, path)
    return path


def test_blocked_int4_weights_of_opset_21_import(tmp_path, caplog):
    """onnxruntime's weight-only 4-bit QDQ form (``MatMulNBitsQuantizer`` with ``QuantFormat.QDQ``): int4 weights
    dequantized with one scale per block of 32 along K (DequantizeLinear's ``block_size``, opset 21). It failed with
    numpy's "operands could not be broadcast together" (the scales were read as one per channel); now the blocks
    are repeated to the weights' shape, and the file runs as its float graph, following onnxruntime on it."""
    import onnxruntime as ort

    from vta.compiler import qops
    from vta.compiler.frontend.prequant import import_model
    from vta.compiler.frontend.quantize import quantize
    rng = np.random.default_rng(2)
    k, n = 64, 16
    codes = rng.integers(-8, 8, (k, n))
    scales = rng.uniform(0.01, 0.03, (k // 32, n)).astype(np.float32)
    weight = helper.make_tensor("w4", TensorProto.INT4, [k, n], codes.ravel().tolist())
    nodes = [node("DequantizeLinear", ["w4", "ws"], ["w"], axis=0, block_size=32), node("MatMul", ["x", "w"], ["y"])]
    path = _opset21_file(tmp_path / "nbits.onnx", nodes, [weight, numpy_helper.from_array(scales, "ws")], k, n)
    with caplog.at_level(logging.WARNING, logger="vta"):
        imported = import_model(path)
    x = rng.standard_normal((1, 8, k)).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # no MatMulNBits fusion
    want = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(want, x @ (np.repeat(scales, 32, axis=0) * codes), rtol=1e-4, atol=1e-4)
    qgraph = quantize(imported, {"x": rng.standard_normal((4, 8, k)).astype(np.float32)})
    got = qops.run_reference(qgraph, {"x": x})["y"]
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_blocked_weights_between_quantized_activations_take_the_float_graph_saying_why(tmp_path, caplog):
    """The same blocked int4 weights in a QDQ file whose activations are quantized too: the integer import refuses
    the blocked DequantizeLinear by name (its layers take one scale per tensor or output channel), so the file runs
    as its float graph with the warning saying why."""
    from vta.compiler.frontend.prequant import import_model
    rng = np.random.default_rng(2)
    k, n = 64, 16
    nodes = [node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]), node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             node("DequantizeLinear", ["w4", "ws"], ["w"], axis=0, block_size=32), node("MatMul", ["xd", "w"], ["m"]),
             node("QuantizeLinear", ["m", "sy", "zy"], ["yq"]), node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    inits = [helper.make_tensor("w4", TensorProto.INT4, [k, n], rng.integers(-8, 8, k * n).tolist()),
             numpy_helper.from_array(rng.uniform(0.01, 0.03, (k // 32, n)).astype(np.float32), "ws"),
             numpy_helper.from_array(np.float32(0.03), "sx"), numpy_helper.from_array(np.int8(0), "zx"),
             numpy_helper.from_array(np.float32(0.05), "sy"), numpy_helper.from_array(np.int8(0), "zy")]
    path = _opset21_file(tmp_path / "blocked.onnx", nodes, inits, k, n)
    with caplog.at_level(logging.WARNING, logger="vta"):
        imported = import_model(path)
    assert not imported.is_quantized and "per block of 32 values" in caplog.text


def _masked_attention_file(tmp_path: Path, fill: float, fmt: str, nan_guard: bool = False
                           ) -> tuple[Path, np.ndarray]:
    """One attention head over ``x [1, T, D]`` whose scores take ``Where(attention_mask, 0, fill)`` (Hugging Face
    transformers 5's mask, its fill -inf), the last 3 keys masked; with ``nan_guard``, torch's SDPA zeroing of NaN
    rows after the softmax. Quantized by onnxruntime's ``quantize_static`` in ``fmt``: (the file, the mask)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    rng = np.random.default_rng(4)
    inits = {f"w{r}": (rng.standard_normal((D, D)) * 0.3).astype(np.float32) for r in "qkv"}
    inits.update(zero=np.array(0.0, np.float32), fill=np.array(fill, np.float32), axis=np.array([1], np.int64))
    nodes = [node("MatMul", ["x", f"w{r}"], [r]) for r in "qkv"]
    nodes += [node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["s"]),
              node("Cast", ["attention_mask"], ["keep"], to=TensorProto.BOOL),
              node("Unsqueeze", ["keep", "axis"], ["keep3"]), node("Where", ["keep3", "zero", "fill"], ["bias"]),
              node("Add", ["s", "bias"], ["masked"]), node("Softmax", ["masked"], ["p"], axis=-1)]
    if nan_guard:
        nodes += [node("IsNaN", ["p"], ["nan"]), node("Where", ["nan", "zero", "p"], ["pg"])]
    nodes.append(node("MatMul", ["pg" if nan_guard else "p", "v"], ["y"]))
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D]),
                                                helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                                                              [1, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    mask = np.ones((1, T), np.int64)
    mask[0, -3:] = 0

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter([{"x": _x(seed)[:1], "attention_mask": mask} for seed in range(4)])

        def get_next(self):  # noqa: ANN201 - onnxruntime's interface
            return next(self.data, None)

    source, path = tmp_path / "masked.onnx", tmp_path / f"masked.{fmt}.onnx"
    onnx.save(model, source)
    quantize_static(str(source), str(path), Reader(), quant_format=getattr(QuantFormat, fmt))
    return path, mask


@pytest.mark.parametrize("nan_guard, fmt", [(False, "QDQ"), (True, "QDQ"), (True, "QOperator")])
def test_onnxruntimes_infinite_mask_scales_leave_the_mask_float_and_the_run_says_what_it_measured_against(
        nan_guard, fmt, tmp_path, capsys, monkeypatch):
    """A mask written as ``Where(mask, 0, -inf)`` (Hugging Face transformers 5's SDPA mask) quantized by
    ``quantize_static``: its calibration sees -inf, so it writes a scale of inf on the mask and on the masked scores.
    onnxruntime's own run of that file dequantizes them to NaN (every softmax row NaN), so it is not the model. The
    integer import leaves that mask float, as a runtime additive term of the Softmax it reaches (every other tensor at
    the file's own scales; it fell back to the float graph before), and the run measures its error against the
    file's dequantized float graph run by onnxruntime, saying why, rather than against NaN-laundered results.
    ``nan_guard``: torch's SDPA then zeroes NaN rows, ``Where(IsNaN(p), 0, p)``, which dequantized integers never
    are (IsNaN was refused in a quantized file). In QOperator format the QLinearAdd and QLinearSoftmax of those
    scales are read as the QDQ nodes they stand for."""
    import onnxruntime as ort

    from vta.cli import main
    from vta.compiler.frontend.prequant import import_model
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    path, mask = _masked_attention_file(tmp_path, -np.inf, fmt, nan_guard)
    scales = {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}
    assert any(n.op_type == "QuantizeLinear" and n.input[0] == "bias" and np.isinf(scales[n.input[1]])
               for n in onnx.load(path).graph.node)                   # onnxruntime's quantizer wrote inf there
    assert fmt == "QDQ" or "QLinearSoftmax" in {n.op_type for n in onnx.load(path).graph.node}
    probe = onnx.load(path)
    probe.graph.output.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, None))
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    probs = session.run(["p"], {"x": _x()[:1], "attention_mask": mask})[0]
    assert fmt != "QDQ" or np.isnan(probs).all()             # NaN rows (QOperator: rows of other garbage)
    graph = import_model(path)
    assert graph.is_quantized and [n.attrs.get("key_additive") for n in graph.nodes if n.op == "Softmax"] == [True]
    data = tmp_path / "in.npz"
    np.savez(data, x=_x()[:1], attention_mask=mask)
    code = main(["run", str(path), "--target", "fsim", "--input", str(data), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and "matches_integer_reference: True" in out and "float graph instead" not in err
    assert "error against the quantized file's own float computation (onnxruntime on the dequantized float graph " \
           f"of {path}, not on the quantized file: its quantizer gave 'bias'" in out
    cosine = float(out.split("cosine ")[1].split(";")[0].split()[0])
    assert cosine > 0.99


def test_a_mask_whose_fill_values_are_quantized_imports_as_integers(tmp_path):
    """AMD Quark quantizes a mask's fill values too: ``Where(mask, DequantizeLinear(0), DequantizeLinear(fill))`` at
    finite scales. The integer import read a mask region from the integer inputs through plain constants only, so
    the file ran as its float graph; a DequantizeLinear of a one-value constant is now the constant it computes, and
    the file runs as integers, at onnxruntime's results. (Here onnxruntime's own file, its fills wrapped so, with a
    finite fill of -10,000.)"""
    import onnxruntime as ort

    from vta.compiler.frontend.prequant import import_model
    path, mask = _masked_attention_file(tmp_path, -1e4, "QDQ")
    model = onnx.load(path)
    for name, value in (("zero", 0.0), ("fill", -1e4)):          # the fills as Quark writes them: int8 at a scale
        scale = np.float32(max(abs(value), 1.0) / 127)
        model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == name))
        model.graph.initializer.extend([numpy_helper.from_array(np.array(round(value / scale), np.int8), f"{name}_q"),
                                        numpy_helper.from_array(scale, f"{name}_scale")])
        model.graph.node.insert(0, node("DequantizeLinear", [f"{name}_q", f"{name}_scale"], [name]))
    onnx.save(model, path)
    graph = import_model(path)
    assert graph.is_quantized and "MaskFn" in {n.op for n in graph.nodes}
    x = _x()[:1]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "attention_mask": mask})[0]
    got = qops.run_reference(graph, {"x": x, "attention_mask": mask})["y"]
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999   # a step apart


def test_onnxruntimes_com_microsoft_quantize_and_dequantize_take_the_float_graph(tmp_path, caplog):
    """``quantize_static(weight_type=QInt4)`` below opset 21 writes every QuantizeLinear and DequantizeLinear in the
    com.microsoft domain (as do ``UseQDQContribOps``, 16-bit activations, and the QNN and Quark configurations). The
    float-graph fallback stopped on them ("no rewrite for this com.microsoft operator"); they are the same two
    operators, so they are read as ONNX's, and the weights' DequantizeLinear of int4 constants folds."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import complete_partial, import_model
    source, path = tmp_path / "block.onnx", tmp_path / "block.int4.onnx"
    onnx.save(_float_block(decomposed=True, einsum=True), str(source))
    quantize_static(str(source), str(path), _reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt4)
    assert {n.domain for n in onnx.load(path).graph.node if n.op_type == "DequantizeLinear"} == {"com.microsoft"}
    with caplog.at_level(logging.WARNING, logger="vta"):
        graph = import_model(path)
        if graph.partial is not None:        # the float islands' completion is tried first; it keeps the Einsum
            assert complete_partial(graph, {"x": _x()}) is None
    assert not graph.is_quantized and "dequantized float graph" in caplog.text
    import onnxruntime as ort
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": _x()})[0]
    got = run_float(graph, {"x": _x()})["y"]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


def test_a_qoperator_embedding_read_twice_takes_the_float_graph(tmp_path):
    """A QOperator file's quantized embedding lookup read by two quantized operators: written as QDQ, the Gather of
    the int8 table is read by one DequantizeLinear per reader. The float fallback took only a lookup with one
    DequantizeLinear and stopped on the others ("DequantizeLinear ... no rule for this operator"); each is now the
    Gather of the table's float values (one table per scale and zero point)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.prequant import import_model
    rng = np.random.default_rng(5)
    inits = {"table": (rng.standard_normal((32, D)) * 0.5).astype(np.float32),
             "w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("Gather", ["table", "ids"], ["x"]), node("Einsum", ["x", "w"], ["a"], equation="btd,de->bte"),
             node("Add", ["a", "x"], ["y"])]
    graph = helper.make_graph(nodes, "lookup", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.data = iter([{"ids": rng.integers(0, 32, (1, T))} for _ in range(4)])

        def get_next(self):  # noqa: ANN201 - onnxruntime's interface
            return next(self.data, None)

    source, path = tmp_path / "lookup.onnx", tmp_path / "lookup.qop.onnx"
    onnx.save(model, source)
    quantize_static(str(source), str(path), Reader(), quant_format=QuantFormat.QOperator)
    imported = import_model(path)
    ids = rng.integers(0, 32, (1, T))
    import onnxruntime as ort
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    got = run_float(imported, {"ids": ids})["y"]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99
