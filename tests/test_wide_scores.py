"""Exact attention scores (``quantize(..., scores="int32")``, ``vta run --attention-scores int32``): a score product
read only by softmaxes becomes ``QMatMulWide`` (int8 operands, int32 exact output), its scalar Muls fold into the
scale its softmax reads, masks stay fused; the CPU path is bit-exact with the integer reference, the accelerator
keeps every other layer, and the error against float drops where scores span a wide range."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.kernels import cpu

D, T, H = 32, 32, 2


def _attention(spread: float, *, causal: bool = False, scores_out: bool = False, seed: int = 0) -> onnx.ModelProto:
    """x [1, T, D] -> Q, K (weights of std ``spread``), V -> softmax(Q K^T / sqrt(d) [+ causal mask]) V -> y;
    ``scores_out``: the scaled scores are a graph output too."""
    rng = np.random.default_rng(seed)
    hd = D // H
    inits = {"wq": rng.standard_normal((D, D)) * spread, "wk": rng.standard_normal((D, D)) * spread,
             "wv": rng.standard_normal((D, D)) * 0.3, "scale": np.array(1 / np.sqrt(hd)),
             "causal": np.triu(np.full((T, T), -1e4), 1)}
    shapes = {"shape": np.array([1, T, H, hd], np.int64), "back": np.array([1, T, D], np.int64)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wq"], ["q"]), n("MatMul", ["x", "wk"], ["k"]), n("MatMul", ["x", "wv"], ["v"]),
             n("Reshape", ["q", "shape"], ["q4"]), n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
             n("Reshape", ["k", "shape"], ["k4"]), n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
             n("Reshape", ["v", "shape"], ["v4"]), n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
             n("MatMul", ["qh", "kt"], ["s"], name="scores"), n("Mul", ["s", "scale"], ["ss"], name="scaled")]
    last = "ss"
    if causal:
        nodes.append(n("Add", ["ss", "causal"], ["sm"], name="masked"))
        last = "sm"
    nodes += [n("Softmax", [last], ["p"], axis=-1, name="softmax"), n("MatMul", ["p", "vh"], ["c"], name="context"),
              n("Transpose", ["c"], ["ct"], perm=[0, 2, 1, 3]), n("Reshape", ["ct", "back"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T, D])]
    if scores_out:
        outputs.append(helper.make_tensor_value_info("ss", TensorProto.FLOAT, [1, H, T, T]))
    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D])],
                              outputs, [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()] +
                              [numpy_helper.from_array(v, k) for k, v in shapes.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _data(seed: int = 1) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return ({"x": rng.standard_normal((8, T, D)).astype(np.float32)},
            {"x": rng.standard_normal((1, T, D)).astype(np.float32)})


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("causal", [False, True])
def test_int32_scores_fold_the_scale_keep_the_mask_and_are_bit_exact_on_the_cpu(causal):
    graph = import_onnx(_attention(1.0, causal=causal))
    calib, x = _data()
    qgraph = quantize(graph, calib, scores="int32")
    ops = {n.name: n for n in qgraph.nodes}
    assert ops["scores"].op == "QMatMulWide" and "scaled" not in ops          # the scalar Mul folded away
    assert qgraph.tensors[ops["scores"].outputs[0]].dtype == "int32"
    softmax = ops["softmax"]
    assert softmax.inputs[0] == ops["scores"].outputs[0] and ("bias" in softmax.attrs) == causal
    scales = [qgraph.tensors[ops["scores"].inputs[k]].scale for k in (0, 1)]
    assert softmax.attrs["scale"] == pytest.approx(scales[0] * scales[1] / np.sqrt(D // H))
    assert ops["context"].op == "QMatMul"                  # P.V is read by no softmax: int8 as before
    np.testing.assert_array_equal(cpu.run_cpu(qgraph, x)["y"], qops.run_reference(qgraph, x)["y"])


def test_int32_scores_lose_less_where_scores_span_a_wide_range():
    """Q and K weights of std 4: the scores span hundreds of int8 steps of their calibrated range; the exact
    scores' output is closer to float than the int8 scores' (0.99984 against 0.99929 when written)."""
    graph = import_onnx(_attention(4.0))
    calib, x = _data()
    want = run_float(graph, x)["y"]
    narrow, exact = (_cosine(qops.run_reference(quantize(graph, calib, scores=s), x)["y"], want)
                     for s in ("int8", "int32"))
    assert exact > narrow + 3e-4 and exact > 0.9995


def test_scores_that_are_a_graph_output_stay_int8():
    graph = import_onnx(_attention(1.0, scores_out=True))
    calib, _ = _data()
    qgraph = quantize(graph, calib, scores="int32")
    assert "QMatMulWide" not in [n.op for n in qgraph.nodes]


def test_an_unknown_score_width_is_refused():
    graph = import_onnx(_attention(1.0))
    with pytest.raises(ValueError, match="scores='int16' is unknown; use one of int8, int32"):
        quantize(graph, _data()[0], scores="int16")          # type: ignore[arg-type]


def test_on_fsim_the_exact_scores_run_on_the_cpu_and_every_other_layer_on_the_accelerator(tmp_path, monkeypatch):
    from vta.compiler.options import CompileOptions
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = tmp_path / "attention.onnx"
    onnx.save(_attention(1.0, causal=True), str(path))
    compiled = compile_model(str(path), VTAConfig(), CompileOptions(policy="accel", attention_scores="int32", calib=2))
    where = {s.node.name: isinstance(s, AccelStep) for s in compiled.steps}
    assert where["scores"] is False and where["context"] is True
    assert "exact in int32" in compiled.decisions["scores"].reason
    assert compiled.meta["attention_scores"] == "int32"
    x = _data()[1]
    np.testing.assert_array_equal(run(compiled, x, target="fsim").outputs["y"],
                                  qops.run_reference(compiled.graph, x)["y"])
