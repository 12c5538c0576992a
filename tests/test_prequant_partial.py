"""tests for compiler/frontend/prequant_complete.py: a partially quantized file (onnxruntime's quantize_static with
nodes_to_exclude or op_types_to_quantize) runs on the file's own integers, with only what the file left float
quantized by the lab, instead of falling back to its dequantized float graph."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper
from test_prequant import SHAPE as SHAPE_CNN
from test_prequant import _float_cnn, _Reader, _Samples

from vta.cli import main
from vta.compiler import qops
from vta.compiler.frontend import prequant
from vta.compiler.frontend.prequant_complete import complete, plan_completion
from vta.compiler.pipeline import compile_model, load_graph
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


def _quantized(folder: Path, name: str, **options) -> Path:
    """``_float_cnn`` quantized by onnxruntime (QDQ, per-channel int8 weights unless ``options`` say otherwise:
    per-tensor uint8 weights have zero points other than 128)."""
    source, path = folder / "float.onnx", folder / f"{name}.onnx"
    onnx.save(_float_cnn(), source)
    quantization.quantize_static(str(source), str(path), _Reader(), **{"quant_format": quantization.QuantFormat.QDQ,
                                                                      "per_channel": True, **options})
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("partial")
    return {"ends": _quantized(folder, "ends", nodes_to_exclude=["conv1", "fc"]),
            "middle": _quantized(folder, "middle", nodes_to_exclude=["conv2"]),
            "convs": _quantized(folder, "convs", op_types_to_quantize=["Conv"]),
            "uint8_weights": _quantized(folder, "uint8_weights", weight_type=quantization.QuantType.QUInt8,
                                        activation_type=quantization.QuantType.QUInt8, per_channel=False),
            "uint8_weights_qop": _quantized(folder, "uint8_weights_qop", weight_type=quantization.QuantType.QUInt8,
                                            activation_type=quantization.QuantType.QUInt8, per_channel=False,
                                            quant_format=quantization.QuantFormat.QOperator),
            "whole": _quantized(folder, "whole")}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _file_weights(path: Path) -> dict[str, np.ndarray]:
    """The int8 weights of the file's quantized Convs and Gemm, by node name."""
    model = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dq = {n.output[0]: inits[n.input[0]] for n in model.graph.node if n.op_type == "DequantizeLinear"
          and n.input[0] in inits and inits[n.input[0]].dtype == np.int8}
    return {n.name: dq[n.input[1]] for n in model.graph.node if n.op_type in ("Conv", "Gemm") and n.input[1] in dq}


@pytest.mark.parametrize("case, weights, activations", [("ends", 2, 2), ("middle", 1, 0), ("convs", 1, 3)])
def test_the_plan_names_what_the_file_left_float(files, case, weights, activations):
    """``ends``: conv1's float weights and its float graph input, the Gemm's weights and its float output; ``middle``:
    conv2's weights only (its input and output are quantized for their other readers); ``convs``: the Gemm's weights,
    and the float Add, pool and Gemm results (the Flatten of
    the quantized pool is an alias)."""
    graph = load_graph(str(files[case]))
    assert not graph.is_quantized and graph.partial is not None
    assert graph.partial.needs_ranges == bool(activations)
    plan = plan_completion(onnx.ModelProto.FromString(graph.partial.model))
    assert (len(plan.weights), len(plan.ranges)) == (weights, activations)
    assert plan_completion(onnx.load(files["whole"])).empty


@pytest.mark.parametrize("case", ["ends", "middle", "convs", "uint8_weights", "uint8_weights_qop"])
def test_a_partial_file_runs_on_its_own_integers(files, case):
    """The run compiles the file as pre-quantized: every Conv/Gemm the file quantized keeps the file's int8 weights
    bit for bit, fsim equals the integer reference, and the output is closer to onnxruntime on the file than the
    dequantized float graph re-quantized by the lab (the fallback before) on the same input."""
    compiled = compile_model(str(files[case]), VTAConfig(), calib=4)
    assert compiled.graph.is_quantized
    assert "quantized by the lab" in compiled.meta["quantization"] or case.startswith("uint8_weights")
    kept = {} if case.startswith("uint8_weights") else _file_weights(files[case])
    assert kept or "re-quantized to int8" in compiled.meta["quantization"]
    for node in compiled.graph.nodes:
        if node.op in ("QConv2d", "QDense") and node.name in kept:
            np.testing.assert_array_equal(compiled.graph.constants[node.inputs[1]].reshape(-1),
                                          np.asarray(kept[node.name], np.int64).reshape(-1))
    x = np.random.default_rng(7).standard_normal((1, 3, 8, 8)).astype(np.float32)
    out = run(compiled, {"x": x}, target="fsim")
    ref = qops.run_reference(compiled.graph, {"x": x})
    np.testing.assert_array_equal(out.outputs["y"], ref["y"])
    want = ort.InferenceSession(str(files[case]), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    fallback = compile_model(str(files[case]), VTAConfig(), calib=4,
                             graph=_without_partial(load_graph(str(files[case]))))
    before = run(fallback, {"x": x}, target="fsim").outputs["y"]
    assert _cosine(out.outputs["y"], want) > 0.999
    assert np.abs(out.outputs["y"] - want).mean() <= np.abs(before - want).mean()


def _without_partial(graph):
    graph.partial = None
    return graph


def test_the_report_says_what_the_lab_quantized(files, capsys):
    """`vta run` names the completion: the quantization line, and (for float activations) the calibration line with
    the samples their ranges came from. A file with float weights only calibrates nothing: no random-data warning."""
    assert main(["run", str(files["convs"]), "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "quantization: the model's own (pre-quantized), with 1 float weight and 3 float activations quantized " \
           "by the lab" in out.out
    assert "a pre-quantized file run on its own integers, with 1 float weight and 3 float activations" in out.out
    assert "imported as its dequantized float graph" not in out.err
    assert main(["run", str(files["middle"]), "--no-progress"]) == 0
    out = capsys.readouterr()
    assert "with 1 float weight quantized by the lab" in out.out
    assert "RANDOM" not in out.err and "calibration:" not in out.out


def test_outputs_keep_their_names_and_shape_readers_read_float():
    """A float graph output written by an unquantized Gemm keeps its name (now the new DequantizeLinear's output); a
    Shape of a float tensor keeps reading the float value; the completed file still runs in onnxruntime."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z"),
             numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([-1], np.int64), "flat")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["xf"]),
             helper.make_node("Gemm", ["xf", "w"], ["y"], name="fc"),
             helper.make_node("Shape", ["y"], ["shape"]),
             helper.make_node("Reshape", ["y", "flat"], ["r"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [6])], inits),
        opset_imports=[helper.make_opsetid("", 13)])
    model = onnx.shape_inference.infer_shapes(model)
    plan = plan_completion(model)
    assert plan.ranges == ["y"] and [w[1:] for w in plan.weights] == [("w", 1)]
    done = complete(model, plan, {"y": 3.0})
    onnx.checker.check_model(done, full_check=True)
    writers = {o: n for n in done.graph.node for o in n.output}
    assert writers["y"].op_type == "DequantizeLinear" and writers["shape"].input[0] == "y__lab_float"
    assert writers["r"].input[0] == "y"
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y, shape, _ = ort.InferenceSession(done.SerializeToString(), providers=["CPUExecutionProvider"]).run(None,
                                                                                                        {"x": x})
    assert list(shape) == [2, 3] and np.abs(y).max() <= 3.0 + 1e-6


def test_a_file_completion_cannot_save_falls_back_with_the_reason(tmp_path, caplog):
    """A QDQ file whose float operator the integer import has no rule for (a CumSum) is completed, refused again, and
    imported as its float graph, the warning naming the refusal once and saying that completing did not change it."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 4)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1, np.int64), "axis")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("CumSum", ["m", "axis"], ["c"], name="cumsum"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4])], inits),
        opset_imports=[helper.make_opsetid("", 13)])
    source, path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, source)
    samples = _Samples([{"x": rng.standard_normal((1, 8, 4)).astype(np.float32)} for _ in range(4)])
    quantization.quantize_static(str(source), str(path), samples, quant_format=quantization.QuantFormat.QDQ,
                                 op_types_to_quantize=["MatMul"])
    graph = load_graph(str(path))
    assert graph.partial is not None
    with caplog.at_level(logging.WARNING, logger="vta"):
        assert prequant.complete_partial(graph, {"x": rng.standard_normal((2, 8, 4)).astype(np.float32)}) is None
    assert "imported as its dequantized float graph" in caplog.text and caplog.text.count("CumSum") == 1
    assert "quantizing the operators it left float does not change that" in caplog.text
    compiled = compile_model(str(path), VTAConfig(), calib=2)
    assert compiled.meta.get("quantization") is None and compiled.graph.is_quantized


def test_token_ids_reach_onnxruntime_as_integers(tmp_path):
    """A partially quantized embedding model (int64 ids, a Gather from a float table, a Linear onnxruntime quantizes
    and a float MatMul it leaves): the ranges are measured with the ids fed as int64, and the file imports as
    integers."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal((20, 8)).astype(np.float32), "table"),
             numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, 4)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w1"], ["h"], name="lin1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="lin2")]
    model = helper.make_model(helper.make_graph(
        nodes, "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 4])], inits),
        opset_imports=[helper.make_opsetid("", 13)])
    source, path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, source)
    samples = _Samples([{"ids": rng.integers(0, 20, (1, 6)).astype(np.int64)} for _ in range(4)])
    quantization.quantize_static(str(source), str(path), samples, quant_format=quantization.QuantFormat.QDQ,
                                 nodes_to_exclude=["lin2"])
    graph = load_graph(str(path))
    assert graph.partial is not None and graph.partial.needs_ranges
    done = prequant.complete_partial(graph, {"ids": rng.integers(0, 20, (3, 6)).astype(np.int64)})
    assert done is not None and "1 float weight" in done[1]
    ids = rng.integers(0, 20, (1, 6)).astype(np.int64)
    got = qops.run_reference(done[0], {"ids": ids})["y"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    assert _cosine(got, want) > 0.99


def test_a_weight_quantized_as_an_activation_is_narrowed(tmp_path):
    """A weight shared through Identity (torch's export of tied weights; ALBERT's shared layers): onnxruntime
    quantizes the Identity's output as an activation, uint8 with a zero point, whose values minus it leave int8. The
    weight is re-quantized to int8 and the file imports as integers (it took the float graph before)."""
    rng = np.random.default_rng(6)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.3 + 0.1).astype(np.float32), "w")]
    nodes = [helper.make_node("Identity", ["w"], ["tied"]),
             helper.make_node("MatMul", ["x", "w"], ["h"], name="first"),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "tied"], ["y"], name="second")]
    model = helper.make_model(helper.make_graph(
        nodes, "tied", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], inits),
        opset_imports=[helper.make_opsetid("", 13)])
    source, path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, source)
    samples = _Samples([{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)])
    quantization.quantize_static(str(source), str(path), samples, quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QUInt8)
    graph = load_graph(str(path))
    assert graph.partial is not None and not graph.partial.needs_ranges
    done = prequant.complete_partial(graph, None)
    assert done is not None and "1 integer weight re-quantized to int8" in done[1]
    x = rng.standard_normal((4, 8)).astype(np.float32)
    got = qops.run_reference(done[0], {"x": x})["y"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _cosine(got, want) > 0.999


def _qdq_before_products(model: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """``model`` quantized as NVIDIA's toolkits (pytorch-quantization, TensorRT Model Optimizer) write it: a
    QuantizeLinear/DequantizeLinear pair (symmetric int8) on each input of a Conv, Gemm or MatMul only; a weight as
    QuantizeLinear of its float initializer, per output channel; activations at ``absmax / 127`` over ``samples``;
    biases, residual Adds, LayerNorms (here their decomposition, gamma and beta too), pools and softmax float."""
    graph = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    products = [n for n in graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]
    acts = sorted({name for n in products for name in n.input[:2] if name not in inits})
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    inputs = {vi.name for vi in probe.graph.input}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(a) for a in acts if a not in inputs)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    peak: dict[str, float] = {}
    for feed in samples:
        values = {**dict(zip(names, session.run(None, feed))), **feed}
        for a in acts:
            peak[a] = max(peak.get(a, 0.0), float(np.abs(values[a]).max()))
    nodes, extra, pairs = [], [], {}

    def pair(name: str, scale: np.ndarray, axis: int | None) -> str:
        if name not in pairs:
            extra.extend([numpy_helper.from_array(scale.astype(np.float32), f"{name}_s"),
                          numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{name}_z")])
            axes = {} if axis is None else {"axis": axis}
            nodes.extend([helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"],
                                           name=f"{name}_q", **axes),
                          helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"],
                                           [f"{name}_dq"], name=f"{name}_dq", **axes)])
            pairs[name] = f"{name}_dq"
        return pairs[name]

    for n in graph.node:
        if n in products:
            for k in range(2):
                name = n.input[k]
                if name in inits:
                    w = inits[name]
                    transposed = any(a.name == "transB" and a.i for a in n.attribute)
                    axis = 0 if n.op_type == "Conv" or transposed else w.ndim - 1
                    peaks = np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)).max(axis=1)
                    n.input[k] = pair(name, np.maximum(peaks, 1e-8) / 127, axis)
                else:
                    n.input[k] = pair(name, np.array(peak[name] / 127), None)
        nodes.append(n)
    out = helper.make_model(helper.make_graph(nodes, graph.name, graph.input, graph.output,
                                              [*graph.initializer, *extra]), opset_imports=model.opset_import)
    out.ir_version = model.ir_version
    return out


def _scaled_block() -> onnx.ModelProto:
    """``x [2, 8, 16]`` -> MatMul -> Mul by a learned per-feature scale (CaiT's and ConvNeXt's layer scale) -> Add of
    a position table ``[8, 16]`` -> ``y``; seeded weights."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.uniform(0.1, 1.0, 16)).astype(np.float32), "gamma"),
             numpy_helper.from_array((rng.standard_normal((8, 16)) * 0.5).astype(np.float32), "pos")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Mul", ["h", "gamma"], ["hs"], name="scale"),
             helper.make_node("Add", ["hs", "pos"], ["y"], name="pos")]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("case", ["cnn", "attention", "scaled"])
def test_a_file_quantized_only_before_its_products_runs_on_its_integers(case, tmp_path):
    """A file quantized the TensorRT way (pairs only before the products: :func:`_qdq_before_products`) leaves
    every other operator float. The lab quantizes those islands: the float results of the products, the residual
    Add, the pool; in the attention block the scores, the probabilities, and its decomposed LayerNorm, whose float
    chain becomes one QLayerNorm; in the scaled block a float constant of several values beside an activation (a
    layer scale, a position table), quantized per tensor as onnxruntime quantizes such an input. The file's weights
    stay its own; the output follows onnxruntime on the file (cosine at least 0.999; measured 0.99957, 0.99986 and
    0.99991) and fsim equals the integer reference."""
    from test_qdq_fallback import _float_block, _x
    if case == "cnn":
        model, shape = _float_cnn(), SHAPE_CNN
    elif case == "scaled":
        model, shape = _scaled_block(), (2, 8, 16)
    else:
        model, shape = _float_block(decomposed=True), _x().shape
    rng = np.random.default_rng(3)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    path = tmp_path / f"{case}.trt.onnx"
    onnx.save(_qdq_before_products(model, samples), path)
    graph = prequant.import_model(str(path))
    assert not graph.is_quantized and graph.partial is not None
    completed = prequant.complete_partial(graph, {"x": np.concatenate([s["x"] for s in samples])})
    assert completed is not None, "the completed file was refused"
    quantized, summary = completed
    assert "float activations quantized by the lab" in summary
    ops = [n.op for n in quantized.nodes]
    if case == "attention":
        assert "QLayerNorm" in ops and "ReduceMean" not in ops
    if case == "scaled":
        assert summary.startswith("2 float weights and ")             # the layer scale and the position table
    compiled = compile_model(str(path), VTAConfig(), calib=4, graph=quantized)
    x = np.random.default_rng(9).standard_normal(shape).astype(np.float32)
    out = run(compiled, {"x": x}, target="fsim").outputs
    np.testing.assert_array_equal(out["y"], qops.run_reference(compiled.graph, {"x": x})["y"])
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _cosine(out["y"], want) > 0.999


def _normalized_block(form: str) -> onnx.ModelProto:
    """``x [2, 8, 16]`` -> MatMul -> L2 normalization over the features -> MatMul -> ``y``: torch's ``F.normalize``
    as its exporter writes it (``decomposed``: ReduceL2, Clip at eps, Expand, Div; Swinv2's cosine attention) or
    ONNX's ``LpNormalization``; seeded weights."""
    rng = np.random.default_rng(8)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.float32(1e-12), "eps"),
             numpy_helper.from_array(np.array([2, 8, 16], np.int64), "shape")]
    norm = [helper.make_node("ReduceL2", ["h", "axes"], ["norm"], keepdims=1, name="l2"),
            helper.make_node("Clip", ["norm", "eps"], ["clamped"], name="clamp"),
            helper.make_node("Expand", ["clamped", "shape"], ["wide"], name="expand"),
            helper.make_node("Div", ["h", "wide"], ["n"], name="div")] if form == "decomposed" else \
        [helper.make_node("LpNormalization", ["h"], ["n"], axis=-1, p=2, name="l2")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), *norm,
             helper.make_node("MatMul", ["n", "w2"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "normalized",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("form", ["decomposed", "lp"])
def test_an_l2_normalization_left_float_runs_as_integers(form, tmp_path):
    """``F.normalize`` in a file onnxruntime quantized (uint8 activations: zero points other than 0), which it
    leaves float: the lab quantizes its output and imports it as one ``QL2Normalize`` at the file's scales and zero
    points (the file fell back to its dequantized float graph: no integer rule took ReduceL2). fsim equals the
    integer reference, and the output follows onnxruntime on the file (cosine at least 0.999; measured 0.9999987)."""
    rng = np.random.default_rng(3)
    samples = [{"x": rng.standard_normal((2, 8, 16)).astype(np.float32)} for _ in range(4)]
    source, path = tmp_path / "float.onnx", tmp_path / f"{form}.qdq.onnx"
    onnx.save(_normalized_block(form), source)
    quantization.quantize_static(str(source), str(path), _Samples(samples),
                                 quant_format=quantization.QuantFormat.QDQ)
    graph = prequant.import_model(str(path))
    if graph.partial is not None:
        completed = prequant.complete_partial(graph, {"x": np.concatenate([s["x"] for s in samples])})
        assert completed is not None, "the completed file was refused"
        graph = completed[0]
    assert graph.is_quantized and "QL2Normalize" in [n.op for n in graph.nodes]
    compiled = compile_model(str(path), VTAConfig(), calib=4, graph=graph)
    x = np.random.default_rng(9).standard_normal((2, 8, 16)).astype(np.float32)
    out = run(compiled, {"x": x}, target="fsim").outputs
    np.testing.assert_array_equal(out["y"], qops.run_reference(compiled.graph, {"x": x})["y"])
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _cosine(out["y"], want) > 0.999, _cosine(out["y"], want)


def test_asymmetric_qoperator_weights_keep_their_bias_at_the_new_scale(tmp_path):
    """A QOperator file of asymmetric per-channel int8 weights (``WeightSymmetric=False``), which the lab
    re-quantizes to symmetric int8: each QLinearConv's and QGemm's int32 bias, in units of the input's scale times
    the old weight scale, is rescaled to the new one (it was kept: 0.9918 against onnxruntime on a depthwise
    convolution, for the file's own error of 0.99993). The output follows onnxruntime on the file (cosine at least
    0.9999)."""
    source, path = tmp_path / "float.onnx", tmp_path / "asym.onnx"
    onnx.save(_float_cnn(), source)
    quantization.quantize_static(str(source), str(path), _Reader(), quant_format=quantization.QuantFormat.QOperator,
                                 activation_type=quantization.QuantType.QInt8,
                                 weight_type=quantization.QuantType.QInt8, per_channel=True,
                                 extra_options={"WeightSymmetric": False})
    compiled = compile_model(str(path), VTAConfig(), calib=4)
    assert compiled.graph.is_quantized and "re-quantized to int8" in compiled.meta["quantization"]
    x = np.random.default_rng(7).standard_normal(SHAPE_CNN).astype(np.float32)
    out = run(compiled, {"x": x}, target="fsim").outputs["y"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _cosine(out, want) > 0.9999, _cosine(out, want)


def test_a_qoperator_file_with_a_max_pool_of_integers_completes(tmp_path):
    """onnxruntime's default QOperator file of Conv, Relu, MaxPool (on the uint8 tensor itself), Conv, Relu and a
    mean over H, W it leaves float (the graph's output). The MaxPool of integers stopped the file's dequantized
    float graph, so the float island was never completed and the run was refused (exit 2); the MaxPool is now
    dequantized, pooled and quantized at the same scale (exact), and the file runs as integers."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((10, 16, 1, 1)) * 0.3).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             helper.make_node("Conv", ["p", "w2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("ReduceMean", ["r2", "axes"], ["y"], keepdims=0, name="mean")]
    graph = helper.make_graph(nodes, "pooled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    source, path = tmp_path / "float.onnx", tmp_path / "pooled.onnx"
    onnx.save(model, source)
    quantization.quantize_static(str(source), str(path), _Reader((1, 3, 8, 8)),
                                 quant_format=quantization.QuantFormat.QOperator, per_channel=True)
    compiled = compile_model(str(path), VTAConfig(), calib=4)
    assert compiled.graph.is_quantized
    x = np.random.default_rng(9).standard_normal((1, 3, 8, 8)).astype(np.float32)
    out = run(compiled, {"x": x}, target="fsim").outputs["y"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert _cosine(out, want) > 0.999, _cosine(out, want)


def test_island_ranges_are_measured_with_an_infinite_pair_left_float():
    """onnxruntime's quantizer gives an attention mask's pair a scale of inf; onnxruntime's run of the file then
    computes NaN from it, so a float island after it measured garbage ranges (Llama's RMSNorm after the attention:
    cosine 0.955 against the file's float graph). The ranges are now measured with such a pair left float: here
    ``y = 2 * x`` behind a pair of scale inf, whose range is twice x's."""
    from vta.compiler.frontend.prequant_complete import measure_ranges
    nodes = [helper.make_node("QuantizeLinear", ["x", "inf", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "inf", "zp"], ["xd"]),
             helper.make_node("Mul", ["xd", "two"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(np.inf), "inf"), numpy_helper.from_array(np.uint8(0), "zp"),
             numpy_helper.from_array(np.float32(2.0), "two")]
    graph = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    assert measure_ranges(model, ["y"], {"x": x}) == {"y": pytest.approx(2 * float(np.abs(x).max()))}


def test_an_infinite_pair_on_constants_is_left_float_before_folding():
    """T5's relative-position buckets are computed from constants through ``log(0) = -inf``; onnxruntime's
    calibration then gives that value a pair of scale inf, and folding the pair as ONNX defines it made the bucket
    indices garbage (the run stopped: "reads index -9223372036854775784"). Such a pair on constants goes before the
    import folds them; a pair of scale inf on an activation stays (the import reads it as an unquantized mask)."""
    from vta.compiler.frontend.prequant_complete import unquantize_infinite
    nodes = [helper.make_node("Log", ["c"], ["lc"]),
             helper.make_node("QuantizeLinear", ["lc", "inf", "zp"], ["lq"]),
             helper.make_node("DequantizeLinear", ["lq", "inf", "zp"], ["ld"]),
             helper.make_node("QuantizeLinear", ["x", "inf", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "inf", "zp"], ["xd"]),
             helper.make_node("Add", ["xd", "ld"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0.0, 1.0, 2.0], np.float32), "c"),
             numpy_helper.from_array(np.float32(np.inf), "inf"), numpy_helper.from_array(np.uint8(0), "zp")]
    graph = helper.make_graph(nodes, "pairs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    unquantize_infinite(model, constants_only=True)
    assert [n.op_type for n in model.graph.node] == ["Log", "QuantizeLinear", "DequantizeLinear", "Add"]
    assert list(model.graph.node[-1].input) == ["xd", "lc"]


def _class_token_block() -> onnx.ModelProto:
    """``x [1, 8, 16]`` -> MatMul -> a LayerNorm decomposed as exporters write it at opset 14 (ReduceMean with
    ``axes``, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta) -> MatMul -> ``y``; seeded weights."""
    rng = np.random.default_rng(12)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w2"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(16)).astype(np.float32), "gamma"),
             numpy_helper.from_array((0.1 * rng.standard_normal(16)).astype(np.float32), "beta"),
             numpy_helper.from_array(np.float32(2.0), "two"), numpy_helper.from_array(np.float32(1e-12), "eps")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["mean"], axes=[-1]), helper.make_node("Sub", ["h", "mean"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["g"]),
             helper.make_node("Add", ["g", "beta"], ["ln"]), helper.make_node("MatMul", ["ln", "w2"], ["y"])]
    return onnx_model(nodes, {"x": np.zeros((1, 8, 16), np.float32)}, inits, opset=14)


def test_a_layernorm_the_file_quantized_in_part_is_one_operator(tmp_path):
    """onnxruntime's quantizer at opset 14 quantizes a decomposed LayerNorm's variance, its epsilon, its quotient
    and its scale, and leaves the mean, the difference and the squares float. Completed step by step, the squares
    took one int8 scale over every row, and a row of small values (ViT's class token, here row 0 at a tenth of the
    others) lost its variance: ViT's class-token row agreed with onnxruntime at cosine 0.74, this one at 0.91. The
    file's inner pairs now go and the decomposition is one QLayerNorm between the file's pairs on its input and
    output (0.99994)."""
    source, path = tmp_path / "token.onnx", tmp_path / "token.qdq.onnx"
    onnx.save(_class_token_block(), source)
    rng = np.random.default_rng(4)

    def sample() -> np.ndarray:
        x = rng.standard_normal((1, 8, 16)).astype(np.float32)
        x[0, 0] *= 0.1
        return x

    samples = [sample() for _ in range(8)]
    quantization.quantize_static(str(source), str(path), _Samples([{"x": s} for s in samples]),
                                 quant_format=quantization.QuantFormat.QDQ)
    graph = prequant.import_model(str(path))
    assert graph.partial is not None
    completed = prequant.complete_partial(graph, {"x": np.concatenate(samples)})
    assert completed is not None, "the completed file was refused"
    quantized = completed[0]
    assert "QLayerNorm" in {n.op for n in quantized.nodes} and "ReduceMean" not in {n.op for n in quantized.nodes}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = sample()
    got, want = qops.run_reference(quantized, {"x": x})["y"], session.run(None, {"x": x})[0]
    assert _cosine(got[0, 0], want[0, 0]) > 0.999, _cosine(got[0, 0], want[0, 0])
    assert _cosine(got, want) > 0.995
