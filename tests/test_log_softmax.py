"""LogSoftmax and ONNX's other reductions (compiler/qops_pool.py, compiler/frontend/score_chains.py): a classifier's
last LogSoftmax in float32 from its int8 input, one inside the graph as QLogSoftmax, ReduceLogSumExp, ReduceMin,
ReduceL1, ReduceL2, ReduceSumSquare and ReduceLogSum over any axes as QReduce on the CPU; the written-out forms
(``Log(ReduceSum(Exp))``, ``z - ReduceLogSumExp(z)``, its ``Exp``, the max shift of ONNX's expansion) fused into
those operators. Each against onnxruntime in float and the integer reference on the CPU path."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper

from vta.compiler import qops

RNG_SEED = 59                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _ops(graph):
    return [n.op for n in graph.nodes]


def test_a_classifiers_log_softmax_is_float_from_its_int8_logits():
    x = _x(4, 32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("LogSoftmax", ["z"], ["y"])]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, [("w", _x(32, 10))]), {"x": x},
                                           atol=1e-5, rtol=1e-5)
    assert "LogSoftmax" in _ops(qgraph) and qgraph.tensors["y"].dtype == "float32"
    assert (got.argmax(-1) == want.argmax(-1)).all()
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_a_log_softmax_inside_the_graph_is_int8(axis):
    x = _x(3, 6, 8)
    nodes = [helper.make_node("LogSoftmax", ["x"], ["l"], axis=axis), helper.make_node("Relu", ["l"], ["r"]),
             helper.make_node("Add", ["l", "r"], ["y"])]
    _, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}), {"x": x}, atol=1e-5, rtol=1e-5)
    assert "QLogSoftmax" in _ops(qgraph)
    assert np.abs(got - want).max() <= 3 * np.abs(want).max() / 127


@pytest.mark.parametrize("axes, keepdims", [((1,), 1), ((0, 2), 0), ((-1,), 0)])
def test_reduce_log_sum_exp_over_any_axes(axes, keepdims):
    x = 3 * _x(3, 5, 7)
    nodes = [helper.make_node("ReduceLogSumExp", ["x", "axes"], ["y"], keepdims=keepdims)]
    model = onnx_model(nodes, {"x": x}, [("axes", np.array(axes, np.int64))], opset=18)
    _, qgraph, got, want = onnx_op_run(model, {"x": x}, atol=1e-5, rtol=1e-5)
    assert "QReduce" in _ops(qgraph)
    assert np.abs(got - want).max() <= 2 * np.abs(want).max() / 127 + 3 * np.abs(x).max() / 127


@pytest.mark.parametrize("op", ["ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum"])
def test_the_other_reductions(op):
    x = _x(2, 6, 5) + (3.0 if op == "ReduceLogSum" else 0.0)       # a positive sum for the log
    nodes = [helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)]
    model = onnx_model(nodes, {"x": x}, [("axes", np.array([1, 2], np.int64))], opset=18)
    _, qgraph, got, want = onnx_op_run(model, {"x": x}, atol=1e-5, rtol=1e-5)
    assert [n.attrs["kind"] for n in qgraph.nodes if n.op == "QReduce"] == [qops.REDUCE_KINDS[op]]
    steps = 30 if op in ("ReduceL1", "ReduceSumSquare") else 2      # sums of 30 rounded inputs
    assert np.abs(got - want).max() <= 2 * np.abs(want).max() / 127 + steps * np.abs(x).max() / 127 * \
        (2 * np.abs(x).max() if op == "ReduceSumSquare" else 1)


def test_a_log_of_no_positive_sum_is_clipped_not_nan():
    x = np.array([[-3, 1, 1], [0, 0, 0]], np.int8)
    assert qops.qreduce(x, "log_sum", -1, 0.1, 0.05).ravel().tolist() == [0, -128]


def test_the_written_out_forms_fuse_into_one_operator():
    """ONNX's expansion of LogSoftmax (max shift, Exp, ReduceSum, Log, Sub) and Inkling's renormalisation
    ``Exp(z - ReduceLogSumExp(z))``."""
    x = _x(4, 9)
    axes = [("axes", np.array([1], np.int64))]
    expanded = [helper.make_node("ReduceMax", ["x", "axes"], ["m"], keepdims=1),
                helper.make_node("Sub", ["x", "m"], ["a"]), helper.make_node("Exp", ["a"], ["e"]),
                helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1), helper.make_node("Log", ["s"], ["ls"]),
                helper.make_node("Sub", ["a", "ls"], ["l"]), helper.make_node("Relu", ["l"], ["r"]),
                helper.make_node("Add", ["l", "r"], ["y"])]
    graph, _, got, want = onnx_op_run(onnx_model(expanded, {"x": x}, axes, opset=18), {"x": x}, atol=1e-5,
                                      rtol=1e-5)
    assert _ops(graph).count("LogSoftmax") == 1 and not {"Exp", "Log", "MaxPool"} & set(_ops(graph))
    renorm = [helper.make_node("ReduceLogSumExp", ["x", "axes"], ["lse"], keepdims=1),
              helper.make_node("Sub", ["x", "lse"], ["d"]), helper.make_node("Exp", ["d"], ["p"]),
              helper.make_node("Mul", ["p", "p"], ["y"])]
    graph, _, got, want = onnx_op_run(onnx_model(renorm, {"x": x}, axes, opset=18), {"x": x}, atol=1e-5,
                                      rtol=1e-5)
    assert "Softmax" in _ops(graph) and "Reduce" not in _ops(graph)
    assert np.abs(got - want).max() <= 3 * np.abs(want).max() / 127


def test_the_integer_forms_give_the_same_bits_as_the_float_ones_rounded():
    x = RNG.integers(-128, 128, (5, 11)).astype(np.int8)
    z = x.astype(np.float64) * 0.05
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_array_equal(qops.qreduce(x, "log_sum_exp", -1, 0.05, 0.04),
                                  np.clip(np.rint(lse / 0.04), -128, 127).astype(np.int8))
    np.testing.assert_allclose(qops.log_softmax(x, -1, 0.05), z - lse, atol=1e-12)
    assert (qops.log_sum_exp(np.full((2, 3), -np.inf), -1) == -np.inf).all()


def test_layer_normalization_statistics_from_int8_are_within_one_output_step():
    """LayerNormalization's Mean and InvStdDev outputs (Reduce kinds mean and inv_std): the int8 versions round the
    exact statistics of the int8 input once."""
    from vta.compiler.qops_pool import qreduce, reduce_rows
    x = np.random.default_rng(71).integers(-128, 128, (3, 7, 40)).astype(np.int8)
    scale, eps = 0.02, 1e-5
    for kind in ("mean", "inv_std"):
        want = reduce_rows(x.astype(np.float64) * scale, kind, 2, eps)
        out_scale = float(np.abs(want).max()) / 127
        got = qreduce(x, kind, 2, scale, out_scale, eps).astype(np.float64) * out_scale
        assert np.abs(got - want).max() <= 0.5 * out_scale + 1e-12
