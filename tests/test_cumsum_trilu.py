"""CumSum and Trilu of activations (compiler/frontend/onnx_transformer_rules.py): against onnxruntime within the
int8 tolerance, the CumSum's int64 running sums (qops_pool.qcumsum) bit-exact on the CPU path, and a Trilu as a Where
of its constant triangle; on fsim between linear layers, bit-exact with the integer reference."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper

from vta.compiler import qops
from vta.config import VTAConfig

RNG_SEED = 59                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("exclusive, reverse, axis", [(0, 0, 1), (1, 0, 1), (0, 1, -1), (1, 1, 2)])
def test_cumsum_of_an_activation_runs_within_the_int8_tolerance(exclusive, reverse, axis):
    x = _x(2, 6, 8)
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, [("axis", np.array(axis, np.int64))]),
                                           {"x": x}, atol=1e-5, rtol=1e-5)
    node = next(n for n in qgraph.nodes if n.op == "QCumSum")
    assert node.attrs["axis"] == axis % 3 and node.attrs["exclusive"] == bool(exclusive)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert np.abs(got - want).max() <= 2 * s_out + s_in


def test_qcumsum_sums_exactly_then_rounds_once():
    x = np.array([[127, 127, -128, 5]], np.int8)
    np.testing.assert_array_equal(qops.qcumsum(x, 1, False, False, 1.0, 4.0), [[32, 64, 32, 33]])   # 254/4 = 63.5
    np.testing.assert_array_equal(qops.qcumsum(x, 1, True, True, 1.0, 1.0), [[4, -123, 5, 0]])


@pytest.mark.parametrize("upper, k", [(1, 0), (0, 0), (1, 2), (0, -1)])
def test_trilu_keeps_its_triangle_and_zeroes_the_rest(upper, k):
    x = _x(2, 5, 7)
    nodes = [helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, [("k", np.array(k, np.int64))]), {"x": x},
                                           atol=1e-6, rtol=1e-6)
    where = next(n for n in graph.nodes if n.op == "Where")
    ones = np.ones((5, 7), bool)
    np.testing.assert_array_equal(where.attrs["keep"], np.triu(ones, k) if upper else np.tril(ones, k))
    assert not got[~np.broadcast_to(where.attrs["keep"], got.shape)].any()
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= s_out


def test_a_decayed_running_sum_between_linear_layers_on_fsim(tmp_path, monkeypatch):
    """A linear-attention-style chain: CumSum over tokens of a projection, masked by a Trilu of a product of
    projections, then a linear layer: the graph on fsim gives the integer reference's bits."""
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    x = _x(1, 16, 32)
    nodes = [helper.make_node("MatMul", ["x", "wa"], ["a"]), helper.make_node("CumSum", ["a", "axis"], ["c"]),
             helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "qt"], ["s"]), helper.make_node("Trilu", ["s"], ["t"], upper=0),
             helper.make_node("MatMul", ["t", "c"], ["tc"]), helper.make_node("MatMul", ["tc", "wo"], ["y"])]
    inits = [("wa", _x(32, 32) * 0.2), ("wq", _x(32, 16) * 0.2), ("wo", _x(32, 16) * 0.2),
             ("axis", np.array(1, np.int64))]
    path = tmp_path / "running.onnx"
    onnx.save(onnx_model(nodes, {"x": x}, inits), str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel")
    assert any(n.op == "QCumSum" for n in compiled.graph.nodes)
    out = run(compiled, {"x": x}, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, {"x": x})["y"])


def test_a_cumsum_axis_outside_the_rank_is_refused():
    from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx
    x = _x(1, 4, 6)
    model = onnx_model([helper.make_node("CumSum", ["x", "axis"], ["y"])], {"x": x}, [("axis", np.array(7, np.int64))])
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError), match=r"axis 7 of a tensor of rank 3"):
        import_onnx(model)
