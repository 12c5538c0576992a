"""Norm forms fused into one node (compiler/frontend/rmsnorm.py): ConvNeXt-V2's global response normalization
(match_grn, GRNScale, qops_pool.qgrn_scale) and a gained, clipped L2 norm (match_gain_l2, GainL2Scale), each as an
exporter writes it, against onnxruntime in float and the integer reference on the CPU path; a lookalike whose mean
is not over the channels stays unfused."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper

RNG_SEED = 43                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)
B, H, W, C = 2, 4, 4, 16


def _grn(mean_axis=-1):
    """``gamma * (x * N) + beta + x``, ``N = G / (mean_c(G) + 1e-6)``, ``G = ReduceL2(x, [1, 2])`` on NHWC, then a
    linear layer."""
    nodes = [helper.make_node("ReduceL2", ["x"], ["g"], axes=[1, 2], keepdims=1),
             helper.make_node("ReduceMean", ["g"], ["m"], axes=[mean_axis], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["me"]), helper.make_node("Div", ["g", "me"], ["n"]),
             helper.make_node("Mul", ["x", "n"], ["xn"]), helper.make_node("Mul", ["gamma", "xn"], ["s"]),
             helper.make_node("Add", ["s", "beta"], ["sb"]), helper.make_node("Add", ["sb", "x"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    inits = [("eps", np.array(1e-6, np.float32)),
             ("gamma", (RNG.standard_normal((1, 1, 1, C)) * 0.5).astype(np.float32)),
             ("beta", (RNG.standard_normal((1, 1, 1, C)) * 0.1).astype(np.float32)),
             ("w", (RNG.standard_normal((C, C)) * 0.3).astype(np.float32))]
    return nodes, inits


def test_the_grn_imports_as_one_node_and_matches_onnxruntime():
    x = RNG.standard_normal((B, H, W, C)).astype(np.float32)
    nodes, inits = _grn()
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, inits, opset=17), {"x": x},
                                           atol=1e-5, rtol=1e-4)
    grn = next(n for n in graph.nodes if n.op == "GRNScale")
    assert tuple(grn.attrs["axes"]) == (1, 2) and grn.attrs["epsilon"] == pytest.approx(1e-6)
    assert "QGRNScale" in [n.op for n in qgraph.nodes]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_a_mean_over_a_spatial_axis_is_no_grn():
    """Not fused: the ReduceL2 alone, the Div of two activations a pair table (pointwise.py)."""
    x = RNG.standard_normal((B, H, W, C)).astype(np.float32)
    nodes, inits = _grn(mean_axis=1)
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, inits, opset=17), {"x": x},
                                           atol=1e-5, rtol=1e-4)
    assert "GRNScale" not in [n.op for n in graph.nodes] and "PointwiseFn" in [n.op for n in graph.nodes]
    assert "QLut2" in [n.op for n in qgraph.nodes]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


@pytest.mark.parametrize("form", ["reciprocal_clip", "div_min", "plain"])
def test_a_gained_l2_norm_imports_as_one_node_and_matches_onnxruntime(form):
    """Inkling-2's query and key norms, ``x * min(c / (||x|| + eps), M)``: with Reciprocal, Mul and a Clip from
    above; with Div and a Min; and without the clip, eps or gain."""
    x = RNG.standard_normal((B, 8, C)).astype(np.float32) * 3
    nodes = [helper.make_node("ReduceL2", ["x"], ["n"], axes=[-1], keepdims=1)]
    inits = [("eps", np.array(1e-6, np.float32)), ("c", np.array(4.0, np.float32)), ("top", np.array(0.5, np.float32)),
             ("w", (RNG.standard_normal((C, C)) * 0.3).astype(np.float32))]
    if form == "reciprocal_clip":
        nodes += [helper.make_node("Add", ["n", "eps"], ["ne"]), helper.make_node("Reciprocal", ["ne"], ["r"]),
                  helper.make_node("Mul", ["r", "c"], ["rc"]), helper.make_node("Clip", ["rc", "", "top"], ["k"])]
    elif form == "div_min":
        nodes += [helper.make_node("Add", ["n", "eps"], ["ne"]), helper.make_node("Div", ["c", "ne"], ["rc"]),
                  helper.make_node("Min", ["rc", "top"], ["k"])]
    else:
        nodes += [helper.make_node("Reciprocal", ["n"], ["k"])]
    nodes += [helper.make_node("Mul", ["k", "x"], ["xs"]), helper.make_node("MatMul", ["xs", "w"], ["y"])]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, inits, opset=17), {"x": x},
                                           atol=1e-5, rtol=1e-4)
    fused = next(n for n in graph.nodes if n.op == "GainL2Scale")
    expected = {"reciprocal_clip": (1e-6, 4.0, 0.5), "div_min": (1e-6, 4.0, 0.5), "plain": (0.0, 1.0, np.inf)}[form]
    assert (fused.attrs["epsilon"], fused.attrs["gain"], fused.attrs["max_gain"]) == pytest.approx(expected)
    assert "QGainL2Scale" in [n.op for n in qgraph.nodes]
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999
