"""A mask fill carried by a data term added to the scores (Doge's dynamic mask), moved into the Softmax
(compiler/frontend/mask_fills.py): the float graph agrees with onnxruntime, the masked keys get exactly 0 in the
quantized Softmax, and the int8 run is within a few output steps of onnxruntime; forms that do not qualify keep their
Where."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from helpers import onnx_model
from helpers import onnx_node as _n
from onnx import helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.kernels import cpu

RNG_SEED = 53                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)
H, T, D = 2, 8, 16
CAUSAL = np.tril(np.ones((T, T), bool))[None, None]


def _doge(fill):
    """scores q.k^T [1, H, T, T] plus expand(Where(causal, exp(dt) [1, H, 1, T], fill)), Softmax, times v."""
    nodes = [_n("Transpose", ["k"], "kt", perm=[0, 1, 3, 2]), _n("MatMul", ["q", "kt"], "s"),
             _n("Exp", ["dt"], "e"), _n("Expand", ["e", "full"], "ee"),
             _n("Where", ["causal", "ee", "fill"], "m"), _n("Add", ["s", "m"], "sm"),
             _n("Softmax", ["sm"], "p", axis=-1), _n("MatMul", ["p", "v"], "y")]
    inits = [("full", np.array([1, H, T, T], np.int64)), ("causal", CAUSAL), ("fill", np.array(fill, np.float32))]
    feeds = {"q": RNG.standard_normal((1, H, T, D)).astype(np.float32),
             "k": RNG.standard_normal((1, H, T, D)).astype(np.float32),
             "v": RNG.standard_normal((1, H, T, D)).astype(np.float32),
             "dt": RNG.standard_normal((1, H, 1, T)).astype(np.float32)}
    return onnx_model(nodes, feeds, inits), feeds


@pytest.mark.parametrize("fill", [np.finfo(np.float32).min, -1e4, -np.inf])
def test_the_fill_of_a_data_term_reaches_the_softmax_and_masked_keys_get_0(fill):
    model, feeds = _doge(fill)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    graph = import_onnx(model)
    softmax = next(n for n in graph.nodes if n.op == "Softmax")
    lifted = graph.producer(softmax.inputs[0])
    assert lifted.op == "Where" and float(lifted.attrs["fill"]) == float(fill)
    np.testing.assert_array_equal(lifted.attrs["keep"], np.broadcast_to(CAUSAL, (1, H, T, T)))
    assert all(float(n.attrs["fill"]) == 0.0 for n in graph.nodes if n.op == "Where" and n is not lifted)
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, rtol=1e-4, atol=1e-4)
    qgraph = quantize(graph, [feeds])
    probs = next(n for n in qgraph.nodes if n.op == "QSoftmax")
    values = qops.run_reference(qgraph, feeds, keep_all=True)
    assert not values[probs.outputs[0]][~np.broadcast_to(CAUSAL, (1, H, T, T))].any()
    got = cpu.run_cpu(qgraph, feeds)["y"]
    np.testing.assert_array_equal(got, qops.run_reference(qgraph, feeds)["y"])
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= 6 * s_out


def test_a_fill_that_is_no_mask_and_a_term_read_elsewhere_keep_their_where():
    """A fill of -5 is data; a term also read by a second output is not the Softmax's alone."""
    model, feeds = _doge(-5.0)
    graph = import_onnx(model)
    assert [float(n.attrs["fill"]) for n in graph.nodes if n.op == "Where"] == [-5.0]
    model, feeds = _doge(-1e9)
    model.graph.output.append(helper.make_tensor_value_info("m", 1, None))
    graph = import_onnx(model)
    assert [float(n.attrs["fill"]) for n in graph.nodes if n.op == "Where"] == [-1e9]
