"""What torch's new (dynamo) ONNX exporter writes, built with onnx.helper: a CastLike of a constant to an activation's
type (folded) and of an activation (an identity), ``torch.split`` unoptimized as SplitToSequence/SequenceAt (one
Split), Hugging Face's GatherND mask lookup, and a file onnxruntime refuses (the float reference stands in, and the
run says why); and what Funnel writes: a Where of two activations by a constant condition, pools with ceil_mode."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import float_outputs
from vta.config import VTAConfig

B, T, D = 2, 8, 16
node = helper.make_node


def _attention(opset=17, split_node=None):
    """Fused QKV ``x [B, T, D] @ w [D, 3D]`` split in three (``split_node`` makes q, k, v from qkv, default
    SplitToSequence and three SequenceAt), q and k scaled by ``Sqrt(CastLike(0.25, q))`` as the exporter writes
    SDPA's scale, single-head attention, output ``y``."""
    rng = np.random.default_rng(0)
    inits = {"w": (rng.standard_normal((D, 3 * D)) * 0.3).astype(np.float32), "chunk": np.array(D, np.int64),
             "p0": np.array(0, np.int64), "p1": np.array(1, np.int64), "p2": np.array(2, np.int64),
             "quarter": np.array([0.25], np.float64)}
    nodes = [node("MatMul", ["x", "w"], ["qkv"])]
    nodes += split_node or [node("SplitToSequence", ["qkv", "chunk"], ["seq"], axis=2),
                            node("SequenceAt", ["seq", "p0"], ["q"]), node("SequenceAt", ["seq", "p1"], ["k"]),
                            node("SequenceAt", ["seq", "p2"], ["v"])]
    nodes += [node("CastLike", ["quarter", "q"], ["scale"]), node("Sqrt", ["scale"], ["root"]),
              node("Mul", ["q", "root"], ["qs"]), node("Mul", ["k", "root"], ["ks"]),
              node("Transpose", ["ks"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["qs", "kt"], ["s"]),
              node("CastLike", ["s", "q"], ["s32"]), node("Softmax", ["s32"], ["p"], axis=-1),
              node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))


def _x():
    return np.random.default_rng(1).standard_normal((B, T, D)).astype(np.float32)


def test_split_to_sequence_and_castlike_import_as_split_and_constants(tmp_path):
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    model = _attention()
    onnx.checker.check_model(model, full_check=True)
    graph = import_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert "CastLike" not in ops and "SplitToSequence" not in ops and ops.count("Slice") == 3
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": _x()})[0]
    np.testing.assert_allclose(run_float(graph, {"x": _x()})["y"], want, atol=1e-5)
    path = tmp_path / "attention.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet({"x": np.concatenate([_x(), _x()])}, {"source": "test"}))
    out = run(compiled, {"x": _x()}, target="fsim").outputs["y"]
    np.testing.assert_array_equal(out, qops.run_reference(compiled.graph, {"x": _x()})["y"])
    assert float(np.ravel(out) @ np.ravel(want) / np.linalg.norm(out) / np.linalg.norm(want)) > 0.99


def test_a_file_onnxruntime_refuses_is_measured_against_the_float_reference():
    """An opset-17 file with opset 18's Split(num_outputs) (what torch 2.13's exporter writes at opset_version=17
    with its optimizer): the lab imports it; onnxruntime refuses it, so the float reference stands in, saying why."""
    split = [node("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3)]
    model = _attention(split_node=split)
    graph = import_onnx(model)
    ref, which = float_outputs(model, graph, {"x": _x()})
    assert which.startswith("float reference (onnxruntime refused the file: ") and "num_outputs" in which
    fixed = _attention(opset=18, split_node=split)
    want = ort.InferenceSession(fixed.SerializeToString()).run(None, {"x": _x()})[0]
    np.testing.assert_allclose(ref["y"], want, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_folds_over_more_than_32_entries(axis):
    """transformers' BERT gathers its ``token_type_ids`` buffer ``[1, 512]`` by ``arange``: onnx 1.23's reference
    GatherElements returns one element per row past 32 entries (``np.choose``); the lab's evaluator does not."""
    from vta.compiler.qops import reference_evaluator
    rng = np.random.default_rng(0)
    data = rng.standard_normal((40, 64)).astype(np.float32)
    shape = (5, 64) if axis == 0 else (40, 16)
    size = data.shape[axis]
    indices = rng.integers(-size, size, shape).astype(np.int64)
    window = tuple(slice(None) if k == axis % 2 else slice(0, n) for k, n in enumerate(shape))
    want = np.take_along_axis(data[window], np.where(indices < 0, indices + size, indices), axis=axis)
    got = reference_evaluator(node("GatherElements", ["d", "i"], ["y"], axis=axis)).run(None, {"d": data, "i": indices})
    np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("keep_io_types", [False, True])
def test_a_float16_file_imports_widened_to_float32(keep_io_types, caplog):
    """onnxruntime's float16 converter: every weight float16; with ``keep_io_types`` the inputs stay float32 and their
    Casts are appended at the end of the graph (out of order, which onnxruntime runs). The lab widens the file to
    float32 exactly, sorts the nodes, and warns."""
    from onnxruntime.transformers.float16 import convert_float_to_float16
    model = convert_float_to_float16(_attention(), keep_io_types=keep_io_types)
    graph = import_onnx(model)
    assert "float16" in caplog.text
    x = _x()
    feed = x if keep_io_types else x.astype(np.float16)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": feed})[0].astype(np.float64)
    got = run_float(graph, {"x": x})["y"]
    np.testing.assert_allclose(got, want, atol=0.02 * np.abs(want).max())


def test_onnxruntime_runs_a_half_precision_file_in_a_child_process(monkeypatch):
    """The float reference of a float16 file is onnxruntime's, run in a child process (onnxruntime 1.32 crashed with
    a segmentation fault optimizing one such file, which ended ``vta run`` with no report): the same outputs as in
    the run's own process; a child that dies is named, and the run measures against the lab's float reference."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from vta.compiler.frontend import quantize
    model = convert_float_to_float16(_attention(), keep_io_types=True)
    graph = import_onnx(model)
    x = _x()
    got, which = quantize.float_outputs(model, graph, {"x": x})
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert which == "onnxruntime"
    np.testing.assert_array_equal(got["y"], want)
    assert quantize._ort_isolated(target="faulthandler:_sigsegv") == (
        "crashed", "it ended with signal SIGSEGV (a fault of onnxruntime's; run in a child process, the lab went on)")
    monkeypatch.setattr(quantize, "_ort_isolated", lambda *args: ("crashed", "it ended with signal SIGSEGV"))
    got, which = quantize.float_outputs(model, graph, {"x": x})
    assert which == "float reference (onnxruntime crashed on the file: it ended with signal SIGSEGV)"
    np.testing.assert_allclose(got["y"], want, atol=0.02 * np.abs(want).max())


def test_dynamic_axes_at_batch_one():
    """A file exported with dynamic axes (optimum's ``batch_size``), run at batch 1: position ids from Shape, Range
    and Expand, then a Reshape to a shape computed from Shape nodes. A stale symbolic dimension once kept
    ``[1, T, D] + [1, T, D]`` as ``[unk, T, D]`` (the Shape nodes after it never folded), and a chain of computed
    Reshapes needed more folding passes than there were."""
    rng = np.random.default_rng(0)
    inits = {"table": rng.standard_normal((32, D)).astype(np.float32),
             "w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32),
             "zero": np.array(0, np.int64), "one": np.array(1, np.int64), "i0": np.array([0], np.int64),
             "i2": np.array([2], np.int64), "width": np.array([D], np.int64), "minus1": np.array([-1], np.int64)}
    nodes = [node("MatMul", ["x", "w"], ["x1"]), node("Shape", ["x1"], ["shp"]),
             node("Slice", ["shp", "i0", "i2"], ["bt"]), node("Gather", ["shp", "one"], ["t"]),
             node("Range", ["zero", "t", "one"], ["r"]), node("Expand", ["r", "bt"], ["ids"]),
             node("Gather", ["table", "ids"], ["pe"]), node("Add", ["x1", "pe"], ["h"])]
    h = "h"
    for k in range(3):                                   # three Reshapes to shapes computed from the tensor's
        nodes += [node("Shape", [h], [f"s{k}"]), node("Slice", [f"s{k}", "i0", "i2"], [f"lead{k}"]),
                  node("Concat", [f"lead{k}", "minus1"], [f"to{k}"], axis=0),
                  node("Reshape", [h, f"to{k}"], [f"r{k}"]), node("MatMul", [f"r{k}", "w"], [f"h{k}"])]
        h = f"h{k}"
    nodes.append(node("Identity", [h], ["y"]))
    graph = helper.make_graph(nodes, "dynamic",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = _x()[:1]
    imported = import_onnx(model, batch=1)
    assert {n.op for n in imported.nodes} & {"Shape", "Range"} == set()
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_float(imported, {"x": x})["y"], want, atol=1e-4, rtol=1e-4)


def test_a_clamp_at_float32_lowest_and_an_empty_concat_operand_change_nothing():
    """XGLM clamps its scores with Max(x, float32 lowest); Phi-3 concatenates an empty pass-through part of a head
    (rotary dimension = head size). Both are dropped before import (onnx_fusions.drop_identities)."""
    rng = np.random.default_rng(0)
    inits = {"low": np.array(np.finfo(np.float32).min, np.float32), "w": rng.standard_normal((D, D)).astype(np.float32),
             "b0": np.array([0], np.int64), "e0": np.array([D], np.int64), "bD": np.array([D], np.int64),
             "eD": np.array([2 * D], np.int64), "ax": np.array([2], np.int64)}
    nodes = [node("MatMul", ["x", "w"], ["h"]), node("Max", ["h", "low"], ["hc"]),
             node("Slice", ["hc", "b0", "e0", "ax"], ["head"]), node("Slice", ["hc", "bD", "eD", "ax"], ["rest"]),
             node("Concat", ["head", "rest"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    imported = import_onnx(model)
    assert "Max" not in {n.op for n in imported.nodes} and "Concat" in {n.op for n in imported.nodes}
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": _x()})[0]
    np.testing.assert_allclose(run_float(imported, {"x": _x()})["y"], want, atol=1e-4, rtol=1e-5)


def test_a_transpose_by_a_negative_perm_counts_it_from_the_end():
    """torch exports Mamba2's ``x.permute(0, -2, -1, 1)`` with the negative entries as written; onnxruntime refuses
    the file, the lab reads them as numpy does (and the run says whose reference it measured against)."""
    x = np.random.default_rng(3).standard_normal((1, 3, 4, 5)).astype(np.float32)
    nodes = [node("Transpose", ["x"], ["t"], perm=[0, -2, -1, 1]), node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "perm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(model)
    assert g.shape("y") == (1, 4, 5, 3)
    np.testing.assert_array_equal(run_float(g, {"x": x})["y"], np.maximum(np.transpose(x, (0, 2, 3, 1)), 0))


def _select_block(cond, y_shape=(B, 1, D)):
    """Funnel's choice between two attention terms: ``Where(cond, x @ w1, y)`` with ``cond`` a constant and ``y =
    z @ w2`` (``z`` of ``y_shape``: broadcast along the tokens), then a linear layer to ``out``."""
    rng = np.random.default_rng(1)
    inits = {"w1": (rng.standard_normal((D, D)) * 0.3).astype(np.float32),
             "w2": (rng.standard_normal((D, D)) * 0.3).astype(np.float32),
             "w3": (rng.standard_normal((D, D)) * 0.3).astype(np.float32), "cond": cond}
    nodes = [node("MatMul", ["x", "w1"], ["a"]), node("MatMul", ["z", "w2"], ["b"]),
             node("Where", ["cond", "a", "b"], ["c"], name="choose"), node("MatMul", ["c", "w3"], ["out"])]
    graph = helper.make_graph(nodes, "select", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, D]),
                                                helper.make_tensor_value_info("z", TensorProto.FLOAT, list(y_shape))],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", ["mixed", "all true", "all false"])
def test_a_where_of_two_activations_by_a_constant_condition_selects(form, tmp_path):
    """A mixed condition becomes a Gather from the two sides concatenated (one int8 scale: the choice moves values
    without a rounding); an all-true or all-false one the side it keeps. Against onnxruntime, and on fsim
    bit-exact with the integer reference."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    cond = {"mixed": np.tril(np.ones((T, D), bool)), "all true": np.ones((1, D), bool),
            "all false": np.zeros((T, 1), bool)}[form]
    model = _select_block(cond)
    graph = import_onnx(model)
    assert ("Gather" in [n.op for n in graph.nodes]) == (form == "mixed")
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((B, T, D)).astype(np.float32),
             "z": rng.standard_normal((B, 1, D)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["out"], want, atol=1e-5, rtol=1e-5)
    path = tmp_path / "select.onnx"
    onnx.save(model, str(path))
    calib = {k: np.concatenate([v, v * 0.5]) for k, v in feeds.items()}
    compiled = compile_model(str(path), VTAConfig(), calib=2, calibration=CalibrationSet(calib, {"source": "test"}))
    got = run(compiled, feeds, target="fsim").outputs["out"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["out"])
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def _pool_model(op, kernel, strides, pads, count_include_pad, size=7):
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": 1}
    if op == "AveragePool":
        attrs["count_include_pad"] = count_include_pad
    graph = helper.make_graph([node(op, ["x"], ["y"], name="pool", **attrs)], "pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("op, kernel, strides, pads, count", [
    ("AveragePool", [2, 1], [2, 1], [0, 0, 0, 0], 1),        # Funnel's torch avg_pool2d(ceil_mode=True)
    ("AveragePool", [3, 3], [2, 2], [1, 1, 0, 0], 0), ("MaxPool", [3, 3], [2, 2], [0, 0, 0, 0], 0),
    ("AveragePool", [1280, 1280], [1280, 1280], [0, 0, 0, 0], 1),   # EfficientNet's pooler on a small image
    ("AveragePool", [40, 3], [40, 2], [1, 0, 1, 0], 0), ("MaxPool", [3000, 3000], [3000, 3000], [0, 0, 0, 0], 0)])
def test_ceil_mode_pools_as_onnxruntime_does(op, kernel, strides, pads, count):
    """ceil_mode=1: the end padded until the ceil's windows fit; the last window pools the input it covers. A window
    longer than its padded input, on an axis of one window, is imported as that input's length (no window of
    thousands of padded rows is built)."""
    model = _pool_model(op, kernel, strides, pads, count)
    x = {"x": np.random.default_rng(2).standard_normal((1, 2, 7, 7)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    graph = import_onnx(model)
    got = run_float(graph, x)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-6)
    pool = next(n for n in graph.nodes if n.op in ("MaxPool", "AvgPool"))
    assert max(pool.attrs["kernel"]) <= 9


def test_ceil_mode_with_counted_pads_of_its_own_is_refused():
    from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError
    with pytest.raises(UnsupportedOperatorError, match=r"ceil_mode=1 with count_include_pad=1 and pads of its own"):
        import_onnx(_pool_model("AveragePool", [3, 3], [2, 2], [1, 1, 0, 0], 1))


def _against_onnxruntime(model, x, atol=1e-6):
    """The float import of ``model`` (output ``y``) equals onnxruntime on ``x`` (its shape too), and the quantized
    graph on the CPU path equals the integer reference."""
    from vta.compiler import qops
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.kernels import cpu
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    fg = import_onnx(model)
    got = run_float(fg, x)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-5)
    qg = quantize(fg, x)
    np.testing.assert_array_equal(cpu.run_cpu(qg, x)["y"], qops.run_reference(qg, x)["y"])
    return want


@pytest.mark.parametrize("shape", [(1, 6, 10), (2, 4, 3, 2, 5), (1, 3, 4, 5)])
def test_global_average_pool_of_any_rank_as_onnxruntime_computes_it(shape):
    """GlobalAveragePool at rank 3 (torch's AdaptiveAvgPool1d(1), Swin's pooler) and 5 pools every axis after N and
    C, as at rank 4; the quantized graph on the CPU path equals the integer reference."""
    graph = helper.make_graph([node("GlobalAveragePool", ["x"], ["p"]), node("Relu", ["p"], ["y"])], "gap",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _against_onnxruntime(model, {"x": np.random.default_rng(4).standard_normal(shape).astype(np.float32)})


@pytest.mark.parametrize("shape", [(4, 6), (2, 6, 5), (1, 6, 2, 3, 2)])
def test_batch_normalization_of_any_rank_as_onnxruntime_computes_it(shape):
    """A BatchNormalization that follows no Conv or Gemm, at rank 2 (BatchNorm1d after a MatMul, as timm's LeViT),
    3 or 5: a per-channel scale and shift on axis 1; the quantized graph on the CPU path equals the integer
    reference."""
    rng = np.random.default_rng(len(shape))
    params = [(1 + 0.2 * rng.standard_normal(6)), 0.3 * rng.standard_normal(6), 0.2 * rng.standard_normal(6),
              1 + rng.random(6)]
    inits = [numpy_helper.from_array(p.astype(np.float32), n) for n, p in zip(("g", "b", "m", "v"), params)]
    graph = helper.make_graph([node("Relu", ["x"], ["r"]), node("BatchNormalization", ["r", "g", "b", "m", "v"],
                                                                 ["y"])], "bn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _against_onnxruntime(model, {"x": rng.standard_normal(shape).astype(np.float32)}, atol=1e-5)


@pytest.mark.parametrize("mode, pads, shape, opset", [
    ("reflect", [0, 0, 1, 2, 0, 0, 2, 1], (1, 2, 5, 6), 17),      # TResNet's anti-aliasing pad
    ("edge", [0, 0, 3, 0, 0, 0, 1, 4], (1, 2, 4, 3), 17),
    ("wrap", [0, 0, 2, 1, 0, 0, 1, 2], (1, 2, 4, 5), 19),
    ("reflect", [0, 1, -1, 0, 0, 2], (2, 4, 6), 17),             # a negative pad crops
    ("edge", [0, 0, 0, 0, 0, 0], (2, 3, 4), 17)])
def test_pad_by_reflection_edge_or_wrap_as_onnxruntime_computes_it(mode, pads, shape, opset):
    """Pad's reflect, edge and wrap modes are one Slice of index lists; against onnxruntime, and the quantized graph
    on the CPU path equals the integer reference."""
    graph = helper.make_graph([node("Relu", ["x"], ["r"]), node("Pad", ["r", "pads"], ["p"], mode=mode),
                               node("Sigmoid", ["p"], ["y"])], "pad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(pads, np.int64), "pads")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    _against_onnxruntime(model, {"x": np.random.default_rng(7).standard_normal(shape).astype(np.float32)})


def test_a_reflection_longer_than_the_axis_is_refused():
    from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError
    graph = helper.make_graph([node("Pad", ["x", "pads"], ["y"], mode="reflect", name="pad")], "pad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([0, 0, 3, 0, 0, 0, 0, 0], np.int64), "pads")])
    with pytest.raises(UnsupportedOperatorError, match=r"reflect pads .* of 3 on axis 2 of 3 elements \(at most 2\)"):
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("coord, scales, a, exclude", [
    ("half_pixel", [1, 1, 2, 2], -0.75, 0), ("pytorch_half_pixel", [1, 1, 1.5, 0.5], -0.75, 0),
    ("align_corners", [1, 1, 2, 3], -0.5, 0), ("asymmetric", [1, 1, 0.5, 2], -0.75, 1),
    ("half_pixel", [1, 1, 3, 1], -0.5, 1)])
def test_cubic_resize_as_onnxruntime_computes_it(coord, scales, a, exclude):
    """Resize's cubic mode (CrossViT resizes its patch grid bicubically): Keys' kernel over four taps per axis,
    against onnxruntime; the quantized graph on the CPU path equals the integer reference, whose integer weights sum
    to one (a constant input stays constant)."""
    shape = (1, 3, 6, 5)
    graph = helper.make_graph([node("Relu", ["x"], ["r"]),
                               node("Resize", ["r", "", "scales"], ["y"], mode="cubic",
                                    coordinate_transformation_mode=coord, cubic_coeff_a=a, exclude_outside=exclude)],
                              "cubic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array(scales, np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    want = _against_onnxruntime(model, {"x": np.random.default_rng(3).standard_normal(shape).astype(np.float32)},
                                atol=1e-5)
    flat = np.full((1, 3, 6, 5), 37, np.int8)
    resized = qops.resize(flat, "cubic", coord, "round_prefer_floor", scales, want.shape, a, bool(exclude))
    assert (resized == 37).all()


@pytest.mark.parametrize("op, attrs, shape", [("GlobalMaxPool", {}, (1, 6, 10)), ("GlobalMaxPool", {}, (2, 3, 4, 5)),
                                              ("GlobalLpPool", {"p": 2}, (1, 4, 3, 5)),
                                              ("GlobalLpPool", {"p": 1}, (1, 5, 7))])
def test_global_max_and_lp_pools_as_onnxruntime_computes_them(op, attrs, shape):
    """GlobalMaxPool (tf2onnx's form of Keras's GlobalMaxPooling1D/2D) and GlobalLpPool of p 1 and 2 reduce every
    axis after N and C, keeping them."""
    graph = helper.make_graph([node(op, ["x"], ["p"], **attrs), node("Relu", ["p"], ["y"])], "gp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _against_onnxruntime(model, {"x": np.random.default_rng(5).standard_normal(shape).astype(np.float32)}, atol=1e-5)


def test_keras_int32_ids_mapped_before_their_lookup_are_token_ids():
    """Keras 3's Embedding, through tf2onnx: int32 ids, a negative id mapped to ``id + vocab`` by arithmetic (Less on
    the ids cast to float, Not, Casts, Muls, Add), then the table's Gather. The ids are token ids: the table lookup
    computes what onnxruntime does."""
    rng = np.random.default_rng(6)
    table = rng.standard_normal((20, 8)).astype(np.float32)
    nodes = [node("Add", ["ids", "vocab"], ["wrapped"]), node("Cast", ["ids"], ["idf"], to=TensorProto.FLOAT),
             node("Less", ["idf", "zero"], ["neg"]), node("Not", ["neg"], ["pos"]),
             node("Cast", ["pos"], ["posi"], to=TensorProto.INT32), node("Mul", ["ids", "posi"], ["kept"]),
             node("Cast", ["neg"], ["negi"], to=TensorProto.INT32), node("Mul", ["negi", "wrapped"], ["moved"]),
             node("Add", ["moved", "kept"], ["idx"]), node("Gather", ["table", "idx"], ["e"], axis=0),
             node("Relu", ["e"], ["y"])]
    inits = [numpy_helper.from_array(np.array(20, np.int32), "vocab"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"), numpy_helper.from_array(table, "table")]
    graph = helper.make_graph(nodes, "keras_embedding",
                              [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ids = np.array([[3, -1, 0, 19, -20, 7, 5]], np.int32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"ids": ids})[0]
    fg = import_onnx(model)
    assert fg.tensors["ids"].dtype == "int64"
    np.testing.assert_array_equal(run_float(fg, {"ids": ids.astype(np.int64)})["y"], want)


def test_an_operator_onnx_does_not_define_is_named_so_with_the_way_around_it():
    """tf2onnx writes ``Erfc`` for Keras 3's exact GELU; ONNX has no such operator (onnxruntime refuses the file)."""
    from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError
    graph = helper.make_graph([node("Erfc", ["x"], ["y"], name="gelu_erfc")], "erfc",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOperatorError, match=r"'Erfc' \(node 'gelu_erfc'\).*ONNX defines no operator "
                                                       r"'Erfc', so onnx.checker and onnxruntime refuse this file "
                                                       r"too \(tf2onnx writes it .*1 - Erf\(x\) in its place\)"):
        import_onnx(model)
