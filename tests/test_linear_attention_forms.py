"""Forms of linear attention blocks (Bailing's, flash-linear-attention's): the L2 norm with its eps inside the root
fused (onnx_fusions._match_l2_normalize, ``inner``), ReduceSum as an exact int64 sum (qops_pool, kind ``sum``), and a
tensor read only by a Where of a constant mask calibrated on the entries it keeps (quantize._kept_ranges); each
against onnxruntime."""
from __future__ import annotations

import numpy as np
from helpers import onnx_model, onnx_op_run
from helpers import onnx_node as _n

RNG_SEED = 61                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def test_an_l2_norm_with_its_eps_inside_the_root_is_one_l2normalize():
    x = _x(2, 8, 16)
    nodes = [_n("Mul", ["x", "x"], "sq"), _n("ReduceSum", ["sq", "axes"], "s", keepdims=1),
             _n("Add", ["s", "eps"], "se"), _n("Sqrt", ["se"], "n"), _n("Div", ["x", "n"], "y")]
    inits = [("axes", np.array([-1], np.int64)), ("eps", np.array(1e-6, np.float32))]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, inits), {"x": x}, atol=1e-5, rtol=1e-5)
    assert [n.op for n in graph.nodes] == ["L2Normalize"] and graph.nodes[0].attrs["inner"]
    assert graph.nodes[0].attrs["epsilon"] == np.float32(1e-6)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert np.abs(got - want).max() <= 2 * s_out + s_in


def test_a_reduce_sum_of_many_mixed_terms_is_exact_then_rounded_once():
    """The sum over 128 terms of mixed signs: within the int8 tolerance of its own output step (the mean pool times
    128 it was rounded at the input's step, about 11 times coarser)."""
    x = _x(4, 6, 128)
    nodes = [_n("ReduceSum", ["x", "axes"], "y", keepdims=0)]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, [("axes", np.array([-1], np.int64))]),
                                           {"x": x}, atol=1e-4, rtol=1e-4)
    reduce = next(n for n in qgraph.nodes if n.op == "QReduce")
    assert reduce.attrs["kind"] == "sum"
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert s_out < 128 * s_in / 4                          # the output's own step, not the count times the input's
    assert np.abs(got - want).max() <= s_out + 128 * s_in / 2 / 8


def test_a_product_masked_by_a_causal_where_is_calibrated_on_the_kept_entries():
    """s = a @ b^T whose upper triangle is large and dropped: the int8 step of s follows the kept lower triangle."""
    a, b = _x(1, 8, 16), _x(1, 8, 16)
    big = np.triu(np.full((8, 8), 50.0, np.float32), 1)
    nodes = [_n("Transpose", ["b"], "bt", perm=[0, 2, 1]), _n("MatMul", ["a", "bt"], "s0"),
             _n("Add", ["s0", "big"], "s"), _n("Trilu", ["s"], "y", upper=0)]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"a": a, "b": b}, [("big", big)]), {"a": a, "b": b},
                                           atol=1e-4, rtol=1e-4)
    where = next(n for n in qgraph.nodes if n.op == "Where")
    kept_absmax = float(np.abs(want).max())
    assert qgraph.tensors[where.inputs[0]].scale <= kept_absmax / 127 * 1.01
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= 3 * s_out
