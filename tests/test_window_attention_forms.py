"""Forms of Longformer's and LED's windowed attention (export of transformers 5.24): token ids padded to a multiple
of the window before their lookup (a Pad in an index region, compiler/frontend/indices.py), and a Where whose constant
operand is an array holding one value where the condition drops the activation (onnx_transformer_rules._where);
against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx

RNG_SEED = 67                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)
V, D, T = 50, 16, 6


def _model(nodes, inputs, inits):
    graph = helper.make_graph(nodes, "window", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_token_ids_padded_before_their_lookup_index_the_table():
    """F.pad(input_ids, (0, 2), value=pad) then the embedding and a linear layer."""
    table = RNG.standard_normal((V, D)).astype(np.float32)
    nodes = [helper.make_node("Pad", ["ids", "pads", "pad_id"], ["padded"]),
             helper.make_node("Gather", ["table", "padded"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])]
    inits = [("table", table), ("pads", np.array([0, 0, 0, 2], np.int64)), ("pad_id", np.array(1, np.int64)),
             ("w", RNG.standard_normal((D, 8)).astype(np.float32))]
    model = _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, T])], inits)
    ids = RNG.integers(0, V, (1, T)).astype(np.int64)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"ids": ids})[0]
    graph = import_onnx(model)
    assert want.shape == (1, T + 2, 8)
    np.testing.assert_allclose(run_float(graph, {"ids": ids})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kept_value", [3.0, -np.inf])
def test_a_where_of_a_constant_array_one_valued_where_it_fills_is_a_where_with_that_fill(kept_value):
    """Where(c, -inf array, s): the constant holds -inf wherever c holds (and anything elsewhere): one fill."""
    s = RNG.standard_normal((1, 2, T, T)).astype(np.float32)
    cond = np.triu(np.ones((T, T), bool), 1)[None, None]
    const = np.where(cond, -np.inf, kept_value).astype(np.float32)
    nodes = [helper.make_node("Where", ["cond", "fill", "s"], ["m"]), helper.make_node("Softmax", ["m"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 2, T, T])],
                   [("cond", cond), ("fill", const)])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"s": s})[0]
    graph = import_onnx(model)
    where = next(n for n in graph.nodes if n.op == "Where")
    assert np.isneginf(where.attrs["fill"])
    np.testing.assert_allclose(run_float(graph, {"s": s})["y"], want, rtol=1e-5, atol=1e-6)


def test_a_where_of_a_constant_array_of_several_fills_stays_refused():
    s = RNG.standard_normal((1, 1, T, T)).astype(np.float32)
    cond = np.triu(np.ones((T, T), bool), 1)[None, None]
    const = np.where(cond, RNG.standard_normal((T, T)), 0.0).astype(np.float32)
    nodes = [helper.make_node("Where", ["cond", "fill", "s"], ["y"], name="w")]
    model = _model(nodes, [helper.make_tensor_value_info("s", TensorProto.FLOAT, list(s.shape))],
                   [("cond", cond), ("fill", const)])
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError), match="one value where the condition"):
        import_onnx(model)
