"""A sentence encoder's head as exporters write it: masked mean pooling over tokens (sentence-transformers'
``sum(h * m, 1) / clamp(sum(m, 1), min=1e-9)``, in its two export forms) and L2 normalization (``F.normalize``: the
clamped norm Expanded; a Max clamp; no clamp; ONNX's LpNormalization; the norm written out as a root of a sum of
squares). Each imports as one MaskPool and one
L2Normalize node; the float reference matches onnxruntime, and the compiled model matches the integer reference on
fsim, with the attention's use of the same mask alongside."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.config import VTAConfig

B, T, D = 2, 8, 32
node = helper.make_node


def _encoder(pool="sum_mask", norm="clip_expand"):
    """``x [B, T, D]`` and ``mask [B, T]`` (int64): single-head attention masked by ``mask`` (additive), a linear
    layer, then the pooling (``sum_mask``: the divisor sums the raw mask with keepdims; ``sum_expanded``: it sums
    the expanded float mask) and the normalization (``clip_expand``, ``max``, ``none``, ``lp``, the norm written
    out as ``pow_sum`` or ``sqrt_sum``, or None)."""
    rng = np.random.default_rng(0)
    inits = {"wq": rng.standard_normal((D, D)), "wk": rng.standard_normal((D, D)), "wo": rng.standard_normal((D, D))}
    inits = {k: (v * 0.3).astype(np.float32) for k, v in inits.items()}
    inits.update({"ax1": np.array([1], np.int64), "ax2": np.array([2], np.int64), "one": np.array(1.0, np.float32),
                  "big": np.array(-10000.0, np.float32), "tiny": np.array(1e-9, np.float32),
                  "eps": np.array(1e-12, np.float32), "full": np.array([B, T, D], np.int64)})
    nodes = [node("MatMul", ["x", "wq"], ["q"]), node("MatMul", ["x", "wk"], ["k"]),
             node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["s"]),
             node("Unsqueeze", ["mask", "ax1"], ["m1"]), node("Cast", ["m1"], ["mf"], to=TensorProto.FLOAT),
             node("Sub", ["one", "mf"], ["inv"]), node("Mul", ["inv", "big"], ["bias"]),
             node("Add", ["s", "bias"], ["sm"]), node("Softmax", ["sm"], ["p"], axis=-1),
             node("MatMul", ["p", "x"], ["a"]), node("MatMul", ["a", "wo"], ["h"]),
             node("Unsqueeze", ["mask", "ax2"], ["mu"])]
    if pool == "sum_mask":
        nodes += [node("Cast", ["mu"], ["w"], to=TensorProto.FLOAT), node("Mul", ["h", "w"], ["hw"]),
                  node("ReduceSum", ["hw", "ax1"], ["num"], keepdims=0),
                  node("ReduceSum", ["mask", "ax1"], ["cnt"], keepdims=1), node("Cast", ["cnt"], ["cntf"], to=1),
                  node("Clip", ["cntf", "tiny"], ["den"])]
    else:
        nodes += [node("Expand", ["mu", "full"], ["me"]), node("Cast", ["me"], ["w"], to=TensorProto.FLOAT),
                  node("Mul", ["h", "w"], ["hw"]), node("ReduceSum", ["hw", "ax1"], ["num"], keepdims=0),
                  node("ReduceSum", ["w", "ax1"], ["cnt"], keepdims=0), node("Clip", ["cnt", "tiny"], ["den"])]
    nodes.append(node("Div", ["num", "den"], ["pooled" if norm else "y"]))
    if norm in ("clip_expand", "max", "none"):
        nodes.append(node("ReduceL2", ["pooled"], ["n"], axes=[1], keepdims=1))
        last = "n"
        if norm == "clip_expand":
            inits["pooled_shape"] = np.array([B, D], np.int64)
            nodes += [node("Clip", ["n", "eps"], ["nc"]), node("Expand", ["nc", "pooled_shape"], ["ne"])]
            last = "ne"
        elif norm == "max":
            nodes.append(node("Max", ["n", "eps"], ["ne"]))
            last = "ne"
        nodes.append(node("Div", ["pooled", last], ["y"]))
    elif norm == "lp":
        nodes.append(node("LpNormalization", ["pooled"], ["y"], axis=1, p=2))
    elif norm in ("pow_sum", "sqrt_sum"):                   # the norm written out: sqrt(sum(x**2)), TIPSv2's
        inits.update({"two": np.array(2.0, np.float32), "half": np.array(0.5, np.float32)})
        square = node("Pow", ["pooled", "two"], ["sq"]) if norm == "pow_sum" else node("Mul", ["pooled", "pooled"],
                                                                                        ["sq"])
        root = node("Pow", ["ss", "half"], ["n"]) if norm == "pow_sum" else node("Sqrt", ["ss"], ["n"])
        nodes += [square, node("ReduceSum", ["sq", "ax1"], ["ss"], keepdims=1), root,
                  node("Div", ["pooled", "n"], ["y"])]
    graph = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, D]),
                                                 helper.make_tensor_value_info("mask", TensorProto.INT64, [B, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(seed=1):
    rng = np.random.default_rng(seed)
    mask = np.ones((B, T), np.int64)
    mask[1, -3:] = 0
    return {"x": rng.standard_normal((B, T, D)).astype(np.float32), "mask": mask}


FORMS = [("sum_mask", "clip_expand"), ("sum_expanded", "clip_expand"), ("sum_mask", "max"), ("sum_mask", "none"),
         ("sum_mask", "lp"), ("sum_mask", "pow_sum"), ("sum_mask", "sqrt_sum"), ("sum_expanded", None)]


@pytest.mark.parametrize("pool,norm", FORMS)
def test_pooling_and_normalization_import_as_one_node_each(pool, norm):
    model = _encoder(pool, norm)
    onnx.checker.check_model(model, full_check=True)
    graph = import_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert ops.count("MaskPool") == 1 and ops.count("L2Normalize") == (norm is not None)
    assert "KeyMask" in ops                                 # the attention reads the same mask
    feeds = _feeds()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pool,norm", [("sum_mask", "clip_expand"), ("sum_mask", "pow_sum"), ("sum_expanded", None)])
def test_the_head_runs_bit_exact_on_fsim(pool, norm, tmp_path, monkeypatch):
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    model = _encoder(pool, norm)
    path = tmp_path / "encoder.onnx"
    onnx.save(model, str(path))
    calib = {k: np.concatenate([_feeds(2)[k], _feeds(3)[k]]) for k in ("x", "mask")}
    compiled = compile_model(str(path), VTAConfig(), calib=2, calibration=CalibrationSet(calib, {"source": "test"}))
    assert {"QMaskPool"} <= {n.op for n in compiled.graph.nodes}
    feeds = _feeds()
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0].astype(np.float64)
    got = got.astype(np.float64)
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


def test_a_fully_padded_row_pools_to_zero():
    """A row whose mask is all 0: the divisor's clamp keeps it finite, and the pooled row is 0, as in float."""
    model = _encoder("sum_mask", None)
    graph = import_onnx(model)
    feeds = _feeds()
    feeds["mask"][0] = 0
    got = run_float(graph, feeds)["y"]
    assert np.all(got[0] == 0) and np.all(np.isfinite(got))


def test_the_integer_pooling_is_exact_for_a_0_1_mask():
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (B, T, D)).astype(np.int8)
    model = _encoder("sum_mask", None)
    graph = import_onnx(model)
    pool = next(n for n in graph.nodes if n.op == "MaskPool")
    mask = _feeds()["mask"]
    got = qops.qmask_pool(x, mask, pool.attrs["onnx"], pool.attrs["axes"], pool.attrs["keepdims"], 0.05, 0.05)
    want = np.clip(np.rint((x.astype(np.int64) * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)), -128, 127)
    np.testing.assert_array_equal(got, want)


def test_a_product_by_the_mask_imports_as_a_pooling_over_no_axes(tmp_path, monkeypatch):
    """DeBERTa multiplies its embeddings by the unsqueezed mask: a MaskPool over no axes (weights 0/1, divisor 1)."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    inits = {"w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32), "ax2": np.array([2], np.int64)}
    nodes = [node("Unsqueeze", ["mask", "ax2"], ["mu"]), node("Cast", ["mu"], ["mf"], to=TensorProto.FLOAT),
             node("Mul", ["x", "mf"], ["xm"]), node("MatMul", ["xm", "w"], ["y"])]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, T, D]),
                                                helper.make_tensor_value_info("mask", TensorProto.INT64, [B, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    imported = import_onnx(model)
    pool = next(n for n in imported.nodes if n.op == "MaskPool")
    assert tuple(pool.attrs["axes"]) == ()
    feeds = _feeds()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(imported, feeds)["y"], want, atol=1e-5, rtol=1e-4)
    path = tmp_path / "masked.onnx"
    onnx.save(model, str(path))
    calib = {k: np.concatenate([_feeds(2)[k], _feeds(3)[k]]) for k in ("x", "mask")}
    compiled = compile_model(str(path), VTAConfig(), calib=2, calibration=CalibrationSet(calib, {"source": "test"}))
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])
    assert np.all(got[1, -3:] == 0)                        # the padded tokens' rows are 0
