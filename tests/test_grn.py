"""ConvNeXt-V2's global response normalization (compiler/frontend/rmsnorm.py's match_grn, the GRNScale node and
compiler/qops_pool.py's qgrn_scale): the block as the exporter writes it against onnxruntime in float and the
integer reference on the CPU path; a lookalike whose mean is not over the channels stays unfused."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper

from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx

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
    x = RNG.standard_normal((B, H, W, C)).astype(np.float32)
    nodes, inits = _grn(mean_axis=1)
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError), match="ReduceL2"):
        import_onnx(onnx_model(nodes, {"x": x}, inits, opset=17))
