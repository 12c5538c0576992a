"""tests for compiler/frontend/prequant.py: pre-quantized ONNX (QDQ and QOperator, as onnxruntime's quantize_static
writes them) imported with the model's own scales and zero points, run by the lab and compared with onnxruntime's
own execution of the quantized model: at least 99 % of the output elements within one output step."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import onnx_model
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError
from vta.compiler.frontend.prequant import import_model, import_quantized, is_quantized_model
from vta.compiler.ir import GraphError
from vta.compiler.pipeline import compile_graph, compile_model
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")

SHAPE = (1, 3, 8, 8)
ONE_STEP = 1 + 1e-3
"""One output step, with room for float32 rounding of the dequantized outputs (relative 1e-6 of the range)."""


def _float_cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv+Relu, Conv, a residual Add, GlobalAveragePool, Flatten, Gemm; seeded weights."""
    rng = np.random.default_rng(seed)

    def init(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
    inits = [init("w1", (8, 3, 3, 3), 0.3), init("b1", (8,), 0.1), init("w2", (8, 8, 3, 3), 0.15),
             init("b2", (8,), 0.1), init("wf", (10, 8), 0.4), init("bf", (10,), 0.1)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             helper.make_node("Add", ["r1", "c2"], ["s"], name="add"),
             helper.make_node("GlobalAveragePool", ["s"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


class _Reader(quantization.CalibrationDataReader):
    """Eight seeded standard-normal inputs ``x`` of ``shape``."""

    def __init__(self, shape: tuple[int, ...] = SHAPE) -> None:
        rng = np.random.default_rng(1)
        self.samples = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.samples, None)


class _Samples(quantization.CalibrationDataReader):
    """onnxruntime's calibration reader over the given feeds (input name -> array, one dict per sample)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self.samples = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.samples, None)


CONFIGS = [(fmt, act, per_channel, symmetric) for fmt in ("QDQ", "QOperator") for act in ("QUInt8", "QInt8")
           for per_channel in (True, False) for symmetric in (False, True)]


def _label(config: tuple[str, str, bool, bool]) -> str:
    fmt, act, per_channel, symmetric = config
    return f"{fmt}-{act}-{'pc' if per_channel else 'pt'}-{'sym' if symmetric else 'asym'}"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every configuration of :data:`CONFIGS` quantized by onnxruntime, by label."""
    folder = tmp_path_factory.mktemp("prequant")
    source = folder / "float.onnx"
    onnx.save(_float_cnn(), source)
    out = {}
    for config in CONFIGS:
        fmt, act, per_channel, symmetric = config
        path = folder / f"{_label(config)}.onnx"
        quantization.quantize_static(str(source), str(path), _Reader(), quant_format=getattr(quantization.QuantFormat,
                                     fmt), activation_type=getattr(quantization.QuantType, act),
                                     weight_type=quantization.QuantType.QInt8, per_channel=per_channel,
                                     extra_options={"ActivationSymmetric": symmetric})
        out[_label(config)] = path
    return out


def _inputs(count: int, seed: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(count)]


def _steps(path: Path, graph_outputs: list[np.ndarray], xs: list[np.ndarray], scale: float) -> np.ndarray:
    """|lab - onnxruntime| in output steps, every element of every input."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = np.concatenate([session.run(None, {"x": x})[0].ravel() for x in xs]).astype(np.float64)
    lab = np.concatenate([o.ravel() for o in graph_outputs]).astype(np.float64)
    return np.abs(lab - ref) / scale


def _output_scale(graph) -> float:
    return float(graph.producer(graph.outputs[0]).attrs["scale"])


@pytest.mark.parametrize("config", CONFIGS, ids=_label)
def test_the_integer_reference_agrees_with_onnxruntime(models, config):
    """Every format and configuration, 32 inputs through the integer reference: >= 99 % within one output step
    (the figures of docs/prequant.md)."""
    path = models[_label(config)]
    graph = import_model(path)
    xs = _inputs(32)
    steps = _steps(path, [qops.run_reference(graph, {"x": x})[graph.outputs[0]] for x in xs], xs,
                   _output_scale(graph))
    assert np.mean(steps <= ONE_STEP) >= 0.99 and steps.max() <= 2 * ONE_STEP, (np.mean(steps <= ONE_STEP),
                                                                                steps.max())
    print(f"{_label(config)}: {100 * np.mean(steps <= ONE_STEP):.1f}% within one step, "
          f"{100 * np.mean(steps < 1e-3):.1f}% exact, max {steps.max():.2f} steps")


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
@pytest.mark.parametrize("op, attrs", [("LeakyRelu", {"alpha": 0.1}), ("Elu", {}), ("Softplus", {})])
def test_an_element_wise_activation_imports_as_a_lookup_table(fmt, op, attrs, tmp_path):
    """A Conv, an element-wise activation (QLinearLeakyRelu in QOperator format; DequantizeLinear, the float op,
    QuantizeLinear in QDQ), a Conv: the activation imports as one QLut at the file's scales, the model as integers,
    and the integer reference agrees with onnxruntime on the quantized file as for the other operators."""
    model = _float_cnn()
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    relu.op_type = op
    relu.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    source, path = tmp_path / "float.onnx", tmp_path / f"{fmt}.onnx"
    onnx.save(model, source)
    quantization.quantize_static(str(source), str(path), _Reader(), quant_format=getattr(quantization.QuantFormat, fmt),
                                 activation_type=quantization.QuantType.QInt8, weight_type=quantization.QuantType.QInt8)
    graph = import_model(path)
    assert graph.is_quantized and [n.attrs["function"] for n in graph.nodes if n.op == "QLut"] == [op]
    xs = _inputs(16)
    steps = _steps(path, [qops.run_reference(graph, {"x": x})[graph.outputs[0]] for x in xs], xs,
                   _output_scale(graph))
    assert np.mean(steps <= ONE_STEP) >= 0.99 and steps.max() <= 2 * ONE_STEP, (np.mean(steps <= ONE_STEP),
                                                                                steps.max())


def test_a_zero_pad_of_a_quantized_activation_imports_as_integers(tmp_path):
    """A constant Pad between the Relu and the next Conv (Keras's ZeroPadding2D, as tf2onnx writes a TFLite int8
    ResNet50): a Pad by the zero point at the activation's own scale; the model stays integers, and agrees with
    onnxruntime on the quantized file as for the other operators."""
    model = _float_cnn()
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    padded = f"{relu.output[0]}_padded"
    for node in model.graph.node:
        node.input[:] = [padded if t == relu.output[0] else t for t in node.input]
    model.graph.initializer.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"))
    index = list(model.graph.node).index(relu)
    model.graph.node.insert(index + 1, helper.make_node("Pad", [relu.output[0], "pads"], [padded], name="zero_pad"))
    source, path = tmp_path / "float.onnx", tmp_path / "qdq.onnx"
    onnx.save(model, source)
    quantization.quantize_static(str(source), str(path), _Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QInt8, weight_type=quantization.QuantType.QInt8)
    graph = import_model(path)
    assert graph.is_quantized and any(n.op == "Pad" and n.name.startswith("zero_pad") for n in graph.nodes)
    xs = _inputs(16)
    steps = _steps(path, [qops.run_reference(graph, {"x": x})[graph.outputs[0]] for x in xs], xs,
                   _output_scale(graph))
    assert np.mean(steps <= ONE_STEP) >= 0.99 and steps.max() <= 2 * ONE_STEP, (np.mean(steps <= ONE_STEP),
                                                                                steps.max())


@pytest.mark.parametrize("label", ["QDQ-QUInt8-pc-asym", "QDQ-QInt8-pt-sym"])
def test_a_cast_to_the_quantized_type_is_read_as_its_input(models, label, tmp_path):
    """torch's export of a quantized model (eager or FX mode) writes ``QuantizeLinear -> Cast(to=UINT8) ->
    DequantizeLinear`` for every quantized tensor: a Cast to the type its input has already. The file imports as
    integers (it was refused outright, 41 of its nodes named for a torchvision ResNet-18), to the same graph results
    as the file without the Casts."""
    model = onnx.load(models[label])
    types = {init.name: init.data_type for init in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type == "QuantizeLinear" and len(node.input) > 2:
            out = node.output[0]
            for reader in model.graph.node:
                reader.input[:] = [f"{out}_cast" if t == out else t for t in reader.input]
            nodes.append(helper.make_node("Cast", [out], [f"{out}_cast"], to=types[node.input[2]],
                                          name=f"{out}_cast"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = tmp_path / "cast.onnx"
    onnx.save(model, path)
    assert sum(n.op_type == "Cast" for n in onnx.load(path).graph.node) >= 4
    graph, plain = import_model(path), import_model(models[label])
    assert graph.is_quantized and "Cast" not in {n.op for n in graph.nodes}
    for x in _inputs(4):
        np.testing.assert_array_equal(qops.run_reference(graph, {"x": x})[graph.outputs[0]],
                                      qops.run_reference(plain, {"x": x})[plain.outputs[0]])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = _inputs(1)[0]
    assert np.array_equal(session.run(None, {"x": x})[0],
                          ort.InferenceSession(str(models[label]), providers=["CPUExecutionProvider"]).run(
                              None, {"x": x})[0])


def _torch_linear(casts: bool = True) -> onnx.ModelProto:
    """A Linear 16 -> 12 over ``x [1, 8, 16]`` as torch exports a quantized one: ``DequantizeLinear`` of int8
    ``W [12, 16]`` per output channel, ``Transpose``, ``MatMul``, ``Add(DequantizeLinear(int32 bias), .)`` with the
    bias first, then ``QuantizeLinear -> Cast(UINT8) -> DequantizeLinear`` (without ``casts``, no Cast); uint8
    activations; seeded values."""
    rng = np.random.default_rng(11)
    sx, sy, sw = 0.03, 0.05, rng.uniform(0.002, 0.006, 12)
    w = rng.integers(-127, 128, (12, 16)).astype(np.int8)
    bias = rng.integers(-3000, 3000, 12).astype(np.int32)
    inits = [numpy_helper.from_array(np.float32(sx), "sx"), numpy_helper.from_array(np.uint8(128), "zx"),
             numpy_helper.from_array(np.float32(sy), "sy"), numpy_helper.from_array(np.uint8(120), "zy"),
             numpy_helper.from_array(w, "w"), numpy_helper.from_array(sw.astype(np.float32), "sw"),
             numpy_helper.from_array(np.zeros(12, np.int8), "zw"), numpy_helper.from_array(bias, "b"),
             numpy_helper.from_array((sx * sw).astype(np.float32), "sb"),
             numpy_helper.from_array(np.zeros(12, np.int32), "zb")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("Cast", ["xq"], ["xc"], to=TensorProto.UINT8),
             helper.make_node("DequantizeLinear", ["xc", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=0),
             helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["xd", "wt"], ["mm"], name="mm"),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bd"], axis=0),
             helper.make_node("Add", ["bd", "mm"], ["h"], name="bias"),
             helper.make_node("QuantizeLinear", ["h", "sy", "zy"], ["hq"]),
             helper.make_node("Cast", ["hq"], ["hc"], to=TensorProto.UINT8),
             helper.make_node("DequantizeLinear", ["hc", "sy", "zy"], ["y"])]
    if not casts:
        nodes = [n for n in nodes if n.op_type != "Cast"]
        for n in nodes:
            n.input[:] = [{"xc": "xq", "hc": "hq"}.get(t, t) for t in n.input]
    return onnx_model(nodes, {"x": np.zeros((1, 8, 16), np.float32)}, inits, opset=13)


def test_a_linear_as_torch_exports_it_imports_as_one_dense_layer(tmp_path):
    """torch's quantized Linear (:func:`_torch_linear`: a per-channel weight transposed, then its int32 bias added)
    is one QDense with that bias, as a Gemm is; the file imports as integers (before: its float graph) and agrees
    with onnxruntime on the file to within one output step on 99 % of the outputs over 16 inputs."""
    path = tmp_path / "linear.onnx"
    onnx.save(_torch_linear(), path)
    graph = import_model(path)
    assert graph.is_quantized and [n.op for n in graph.nodes].count("QDense") == 1
    assert not {"QLut2", "QAffine"} & {n.op for n in graph.nodes}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((1, 8, 16)).astype(np.float32) for _ in range(16)]
    lab = np.concatenate([qops.run_reference(graph, {"x": x})["y"].ravel() for x in xs]).astype(np.float64)
    ref = np.concatenate([session.run(None, {"x": x})[0].ravel() for x in xs]).astype(np.float64)
    steps = np.abs(lab - ref) / 0.05
    assert np.mean(steps <= ONE_STEP) >= 0.99 and steps.max() <= 2 * ONE_STEP, (np.mean(steps <= ONE_STEP),
                                                                                steps.max())


def test_a_quantized_constant_table_computed_on_folds_and_the_weights_stay_integers(tmp_path):
    """Swinv2's continuous position bias as onnxruntime quantizes it: a constant table between a QuantizeLinear and a
    DequantizeLinear, multiplied by a DequantizeLinear'd int8 weight (constants only), quantized and added to a
    layer's result. That computation of constants folds as ONNX defines it; the layer's own weight, read by an
    activation's MatMul through a Transpose, stays a weight. The file imports as integers (it fell back to its float
    graph) and agrees with onnxruntime within one output step on 99 % of the outputs."""
    rng = np.random.default_rng(12)
    inits = [numpy_helper.from_array(np.float32(0.03), "sx"), numpy_helper.from_array(np.int8(0), "z8"),
             numpy_helper.from_array(np.float32(0.05), "sy"),
             numpy_helper.from_array(rng.integers(-127, 128, (12, 16)).astype(np.int8), "w"),
             numpy_helper.from_array(np.float32(0.004), "sw"),
             numpy_helper.from_array(rng.uniform(-1, 1, (8, 3)).astype(np.float32), "table"),
             numpy_helper.from_array(np.float32(1 / 127), "st"),
             numpy_helper.from_array(rng.integers(-127, 128, (3, 12)).astype(np.int8), "w2"),
             numpy_helper.from_array(np.float32(0.002), "sw2"), numpy_helper.from_array(np.float32(0.003), "sb"),
             numpy_helper.from_array(np.float32(0.06), "sm")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "z8"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "z8"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "z8"], ["wd"]),
             helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["xd", "wt"], ["mm"], name="mm"),
             helper.make_node("QuantizeLinear", ["table", "st", "z8"], ["tq"]),
             helper.make_node("DequantizeLinear", ["tq", "st", "z8"], ["td"]),
             helper.make_node("DequantizeLinear", ["w2", "sw2", "z8"], ["w2d"]),
             helper.make_node("MatMul", ["td", "w2d"], ["bias"], name="table_mlp"),
             helper.make_node("QuantizeLinear", ["bias", "sb", "z8"], ["bq"]),
             helper.make_node("DequantizeLinear", ["bq", "sb", "z8"], ["bd"]),
             helper.make_node("QuantizeLinear", ["mm", "sm", "z8"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "sm", "z8"], ["md"]),
             helper.make_node("Add", ["md", "bd"], ["h"], name="add"),
             helper.make_node("QuantizeLinear", ["h", "sy", "z8"], ["hq"]),
             helper.make_node("DequantizeLinear", ["hq", "sy", "z8"], ["y"])]
    graph = helper.make_graph(nodes, "table", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "table.onnx"
    onnx.save(model, path)
    imported = import_model(path)
    assert imported.is_quantized and [n.op for n in imported.nodes].count("QDense") == 1
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    xs = [rng.standard_normal((1, 8, 16)).astype(np.float32) for _ in range(16)]
    lab = np.concatenate([qops.run_reference(imported, {"x": x})["y"].ravel() for x in xs]).astype(np.float64)
    ref = np.concatenate([session.run(None, {"x": x})[0].ravel() for x in xs]).astype(np.float64)
    steps = np.abs(lab - ref) / 0.05
    assert np.mean(steps <= ONE_STEP) >= 0.99 and steps.max() <= 2 * ONE_STEP, (np.mean(steps <= ONE_STEP),
                                                                                steps.max())


def test_a_linear_whose_result_is_left_float_takes_its_bias_too(tmp_path):
    """The same Linear with its result left float (the graph output): completing the file quantizes the Add's result,
    not the MatMul's, so the bias still goes into the one QDense (compiler/frontend/prequant_complete.py)."""
    from vta.compiler.frontend.prequant import complete_partial
    model = _torch_linear()
    kept = [n for n in model.graph.node if n.output[0] not in ("hq", "hc", "y")]
    kept[-1].output[0] = "y"
    del model.graph.node[:]
    model.graph.node.extend(kept)
    path = tmp_path / "linear_float_out.onnx"
    onnx.save(model, path)
    graph = import_model(path)
    assert not graph.is_quantized and graph.partial is not None
    rng = np.random.default_rng(2)
    completed = complete_partial(graph, {"x": rng.standard_normal((4, 8, 16)).astype(np.float32)})
    assert completed is not None
    ops = [n.op for n in completed[0].nodes]
    assert ops.count("QDense") == 1 and not {"QLut2", "QAffine"} & set(ops), ops
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = qops.run_reference(completed[0], {"x": x})["y"]
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_a_zero_point_that_is_not_a_constant_is_refused_by_name():
    """A weight's zero point computed by a node that is also a graph output, so it is not folded (a fuzzed file; a
    KeyError before): the integer import refuses it (naming the zero point), and so does the float graph, which
    cannot dequantize that weight either, naming its DequantizeLinear."""
    model = _torch_linear(casts=False)
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] == "w":
            n.input[2] = "zw_made"
    model.graph.initializer.append(numpy_helper.from_array(np.array([12], np.int64), "zw_shape"))
    model.graph.node.insert(0, helper.make_node("ConstantOfShape", ["zw_shape"], ["zw_zeros"]))   # float zeros
    model.graph.node.insert(1, helper.make_node("Cast", ["zw_zeros"], ["zw_made"], to=TensorProto.INT8))
    model.graph.output.append(helper.make_tensor_value_info("zw_zeros", TensorProto.FLOAT, [12]))
    with pytest.raises(ValueError, match=r"DequantizeLinear \(node '<unnamed, writes wd>'\): no rule"):
        import_model(model)



def test_a_transpose_whose_perm_is_not_a_permutation_is_refused():
    """A Transpose of a quantized activation with ``perm`` [0, 2, 5] of a rank-3 tensor (a fuzzed file; an
    IndexError before): refused naming the perm."""
    inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.int8(0), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node("Transpose", ["xd"], ["t"], perm=[0, 2, 5], name="bad_perm"),
             helper.make_node("QuantizeLinear", ["t", "s", "z"], ["tq"]),
             helper.make_node("DequantizeLinear", ["tq", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "perm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOperatorError, match=r"node 'bad_perm'.*perm \[0, 2, 5\] does not permute"):
        import_quantized(model, "perm")


def _optimized(model: onnx.ModelProto, folder: Path, level: str) -> Path:
    """``model`` as onnxruntime saves it optimized at ``level`` (``ORT_ENABLE_EXTENDED``, ``ORT_ENABLE_ALL``)."""
    source, path = folder / "source.onnx", folder / f"optimized_{level}.onnx"
    onnx.save(model, source)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return path


def test_onnxruntimes_fused_integer_matmul_of_a_static_file_is_read_as_the_qdq_it_was(tmp_path):
    """A QDQ MatMul whose result stays float (scores before a float Softmax), saved by onnxruntime's extended
    optimization as ``com.microsoft.MatMulIntegerToFloat`` of the QuantizeLinear's integers: refused before ("quantized
    with MatMulIntegerToFloat, which the lab neither imports ..."); now read as DequantizeLinear, MatMul, so the file
    is a partially quantized QDQ file, completed and run as integers, following onnxruntime on it."""
    from vta.compiler.frontend.prequant import complete_partial
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.float32(0.05), "sx"), numpy_helper.from_array(np.int8(0), "zx"),
             numpy_helper.from_array(rng.integers(-127, 128, (16, 12)).astype(np.int8), "w"),
             numpy_helper.from_array(rng.uniform(0.002, 0.004, 12).astype(np.float32), "sw"),
             numpy_helper.from_array(np.zeros(12, np.int8), "zw")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "scores", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = _optimized(model, tmp_path, "ORT_ENABLE_EXTENDED")
    assert [n.op_type for n in onnx.load(path).graph.node].count("MatMulIntegerToFloat") == 1
    imported = import_model(path)
    assert imported.partial is not None
    completed = complete_partial(imported, {"x": rng.standard_normal((4, 8, 16)).astype(np.float32)})
    assert completed is not None and "QDense" in {n.op for n in completed[0].nodes}
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = qops.run_reference(completed[0], {"x": x})["y"]
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_a_file_in_onnxruntimes_nhwc_layout_is_refused_saying_how_to_save_it(models, tmp_path):
    """A QOperator CNN saved at ORT_ENABLE_ALL holds onnxruntime's NHWC layout for the machine that saved it
    (QLinearConv with channels_last=1 between Transposes): refused naming those nodes and the level to save at,
    not with a Conv's group mismatch from its float graph."""
    path = _optimized(onnx.load(models["QOperator-QInt8-pt-sym"]), tmp_path, "ORT_ENABLE_ALL")
    if not any(a.name == "channels_last" and a.i for n in onnx.load(path).graph.node for a in n.attribute):
        pytest.skip("onnxruntime did not choose its NHWC layout on this machine")
    with pytest.raises(GraphError, match=r"holds onnxruntime's NHWC layout .*QLinearConv .*ORT_ENABLE_EXTENDED"):
        import_model(path)


@pytest.mark.parametrize("label", ["QDQ-QUInt8-pc-sym", "QOperator-QInt8-pt-sym"])
def test_exact_adds_on_the_cpu_agree_as_well(models, label):
    """``accel_adds=False`` keeps the symmetric residual add an exact QAffine on the CPU."""
    model = onnx.load(models[label])
    graph = import_quantized(model, label, accel_adds=False)
    assert "QAdd" not in [n.op for n in graph.nodes] and "QAffine" in [n.op for n in graph.nodes]
    xs = _inputs(32)
    steps = _steps(models[label], [qops.run_reference(graph, {"x": x})[graph.outputs[0]] for x in xs], xs,
                   _output_scale(graph))
    assert np.mean(steps <= ONE_STEP) >= 0.99 and steps.max() <= ONE_STEP


@pytest.mark.parametrize("label", ["QDQ-QUInt8-pc-asym", "QOperator-QInt8-pt-sym"])
def test_fsim_runs_it_as_the_reference_does(models, label):
    """Compiled (policy accel) and run on fsim: bit-exact with the integer reference, so as close to onnxruntime."""
    compiled = compile_model(str(models[label]), VTAConfig(), policy="accel")
    xs = _inputs(4)
    for x in xs:
        out = run(compiled, {"x": x}, target="fsim").outputs
        ref = qops.run_reference(compiled.graph, {"x": x})
        np.testing.assert_array_equal(out[compiled.graph.outputs[0]], ref[compiled.graph.outputs[0]])
    assert "calibration" not in compiled.meta and compiled.meta["quantization"].startswith("the model's own")


def test_the_accelerator_takes_what_the_rules_allow(models):
    """Convolutions and dense layers go to the accelerator with any zero point (the input's is an explicit Pad and
    a bias term, the output's a bias term); a symmetric residual add too (QAdd); an asymmetric one stays an exact
    QAffine on the CPU, and so do the zero-point Quantize/Dequantize."""
    cfg = VTAConfig()
    asym = compile_graph(import_model(models["QDQ-QUInt8-pc-asym"]), cfg, policy="accel").decisions
    sym = compile_graph(import_model(models["QOperator-QInt8-pc-sym"]), cfg, policy="accel").decisions
    where = {d.node: (d.op, d.target) for d in asym.values()}
    assert where["conv1"] == ("QConv2d", "accel") and where["conv2"] == ("QConv2d", "accel")
    assert where["fc"] == ("QDense", "accel") and where["add"] == ("QAffine", "cpu")
    assert {d.op for d in asym.values() if d.target == "cpu"} == {"QuantizeZp", "Pad", "QAffine", "Reshape",
                                                                "DequantizeZp"}
    assert asym["add"].reason == "QAffine has no accelerator rule"
    ops = {d.op: d.target for d in sym.values()}
    assert ops["QConv2d"] == "accel" and ops["QAdd"] == "accel" and ops["QDense"] == "accel"
    assert "Pad" not in ops and "QAffine" not in ops


def test_zero_points_map_to_int8():
    """uint8 with zero point 128 is int8 with zero point 0: a symmetric uint8 model needs no zero-point op."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array(100, np.uint8), "z2")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z2"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "qdq", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    assert is_quantized_model(model)
    graph = import_quantized(model, "qdq")
    assert [n.op for n in graph.nodes] == ["Quantize", "DequantizeZp"]
    assert graph.nodes[1].attrs["zero_point"] == -28
    values = np.array([[-1.0, 0.26, 3.0, 100.0]], np.float32)
    out = qops.run_reference(graph, {"x": values})["y"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(out, session.run(None, {"x": values})[0])


def test_dynamic_quantization_is_refused_with_the_reason():
    """onnxruntime's quantize_dynamic: scales computed at run time, int32 results scaled by float operators."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.INT32, [2, 4])
    w = numpy_helper.from_array(np.ones((3, 4), np.int8), "w")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "s", "z"], name="dq"),
             helper.make_node("MatMulInteger", ["aq", "w", "z"], ["b"], name="mm")]
    model = helper.make_model(helper.make_graph(nodes, "dyn", [a], [b], [w]),
                              opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOperatorError, match="DynamicQuantizeLinear .*dynamic quantization") as err:
        import_quantized(model, "dyn")
    assert [p.op_type for p in err.value.problems] == ["DynamicQuantizeLinear", "MatMulInteger"]


def test_a_float_result_that_is_not_quantized_is_refused():
    """A Conv of DequantizeLinear'd values whose float result is a graph output: nothing to requantize it to."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 2, 2])
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(np.ones((1, 1, 1, 1), np.int8), "w"),
             numpy_helper.from_array(np.array([0.5], np.float32), "ws")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], axis=0),
             helper.make_node("Conv", ["xf", "wf"], ["y"], name="conv")]
    model = helper.make_model(helper.make_graph(nodes, "open", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOperatorError, match="its float result 'y' is not quantized"):
        import_quantized(model, "open")


@pytest.mark.parametrize("bad", [0.0, -0.5, np.inf, np.nan])
def test_a_scale_that_is_not_finite_and_positive_is_refused(bad):
    """A QuantizeLinear at scale 0, negative, infinite or NaN (a damaged file): refused naming the scale (an
    OverflowError in the requantization's multiplier before)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    inits = [numpy_helper.from_array(np.array(bad, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "scale", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedOperatorError, match=r"node 'quant'.*its scale 's' holds .*; a quantization scale "
                                                       r"must be finite and positive"):
        import_quantized(model, "scale")


@pytest.mark.parametrize("bad", [np.nan, 1e30])
def test_a_bias_that_is_not_finite_or_beyond_int32_is_refused(bad):
    """A Linear's float bias holding NaN, or a value beyond int32 in accumulator units (a damaged file): refused
    naming the node (before, cast to int64 as garbage: a silent wrong answer)."""
    model = _torch_linear(casts=False)
    bias = np.full(12, 0.1, np.float32)
    bias[3] = bad
    model.graph.initializer.append(numpy_helper.from_array(bias, "bf"))
    for n in model.graph.node:
        if n.op_type == "Add":
            n.input[0] = "bf"
    with pytest.raises(UnsupportedOperatorError, match=r"node 'mm'.*its bias holds (nan|[0-9.e+]+) in accumulator "
                                                       r"units .*a bias must be finite and fit int32"):
        import_quantized(model, "bias")


def test_the_run_gives_the_files_own_quantization_error_for_scale(models, capsys):
    """`vta run` of a pre-quantized file prints, after its error against onnxruntime on the file, how far onnxruntime
    on the file is from the file's own float computation (its dequantized float graph, run by onnxruntime): the
    scale against which the first figure reads."""
    import re

    from vta.cli import main
    assert main(["run", str(models["QDQ-QInt8-pc-sym"]), "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "error against the quantized model as given (onnxruntime on the quantized file" in out
    found = re.search(r"for scale, the file's own quantization error: onnxruntime on the quantized file against its "
                      r"dequantized float graph \(onnxruntime too\), y: cosine ([0-9.]+)", out)
    assert found is not None, out[-600:]
    assert 0.99 < float(found.group(1)) < 1.0          # int8 activations: close to, and not, the float graph


@pytest.mark.slow
def test_tsim_runs_a_prequantized_model_bit_exactly(models):
    """The RTL (Verilator build cached under ~/.cache/vta-lab) runs the same programs: equal to the reference."""
    compiled = compile_model(str(models["QOperator-QUInt8-pc-asym"]), VTAConfig(), policy="accel")
    x = _inputs(1)[0]
    out = run(compiled, {"x": x}, target="tsim")
    ref = qops.run_reference(compiled.graph, {"x": x})
    np.testing.assert_array_equal(out.outputs[compiled.graph.outputs[0]], ref[compiled.graph.outputs[0]])
    assert any(layer.where == "accel" for layer in out.layers)


def test_a_reshape_of_the_float_input_before_its_quantization(tmp_path):
    """Intel's Neural Compressor writes ``Reshape(x)`` of the float graph input before its first QuantizeLinear (its
    MatMul-Add fusion into a Gemm over rows): the import quantizes the input, then reshapes the integers. It stopped
    with a Python TypeError ("emit_out() got multiple values for argument 'shape'")."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["x2"]),
             helper.make_node("QuantizeLinear", ["x2", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "sw"], ["w"]),
             helper.make_node("Gemm", ["xd", "w"], ["g"]),
             helper.make_node("QuantizeLinear", ["g", "sy", "zy"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    inits = [numpy_helper.from_array(np.array([6, 4], np.int64), "rows"),
             numpy_helper.from_array(np.float32(0.03), "sx"), numpy_helper.from_array(np.uint8(128), "zx"),
             numpy_helper.from_array(rng.integers(-127, 128, (4, 5)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.float32(0.01), "sw"),
             numpy_helper.from_array(np.float32(0.02), "sy"), numpy_helper.from_array(np.uint8(128), "zy")]
    path = tmp_path / "rows.onnx"
    onnx.save(onnx_model(nodes, {"x": np.zeros((2, 3, 4), np.float32)}, inits), path)
    imported = import_model(path)
    assert imported.is_quantized
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    got = qops.run_reference(imported, {"x": x})[imported.outputs[0]].astype(np.float64)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.abs(got.reshape(want.shape) - want).max() <= 0.02 * 1.001
