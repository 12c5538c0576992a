"""The forms tf2onnx 1.17 writes for Keras's transformer layers from TensorFlow 2.15 at opsets 17 and 18, built here
node by node: LayerNormalization as TF's moments and batchnorm, GlobalAveragePooling1D as a ReduceMean over the
tokens, the attention mask broadcast by Tile, int32 token ids; and the general forms they needed: reductions over
any axes, element-wise operators of two activations that broadcast. Each imports as the lab's own operators and
computes what onnxruntime does; a whole Keras-style block runs bit-exact on fsim."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import TensorProto, helper, numpy_helper

from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx

RNG_SEED = 117                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)
node = helper.make_node
T, D = 16, 32


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _ops(graph):
    return [n.op for n in graph.nodes]


def _moments_layer_norm(x, out, prefix, *, opset, scale=True, center=True):
    """Keras LayerNormalization(epsilon=1e-5) over the last axis of ``x`` as tf2onnx writes it: the means are
    GlobalAveragePool at opset 17 (rank 3) and ReduceMean with an axes input at 18."""
    def mean(src, dst):
        if opset < 18:
            return node("GlobalAveragePool", [src], [dst])
        return node("ReduceMean", [src, f"{prefix}_axes"], [dst], keepdims=1)
    p = prefix
    nodes = [mean(x, f"{p}_mean"), node("Sub", [x, f"{p}_mean"], [f"{p}_d"]),
             node("Mul", [f"{p}_d", f"{p}_d"], [f"{p}_d2"]), mean(f"{p}_d2", f"{p}_var"),
             node("Add", [f"{p}_var", f"{p}_eps"], [f"{p}_ve"]), node("Sqrt", [f"{p}_ve"], [f"{p}_sd"]),
             node("Reciprocal", [f"{p}_sd"], [f"{p}_r"])]
    inits = [(f"{p}_eps", np.array(1e-5, np.float32)), (f"{p}_axes", np.array([2], np.int64))]
    g = f"{p}_r"
    if scale:
        nodes.append(node("Mul", [g, f"{p}_gamma"], [f"{p}_g"]))
        inits.append((f"{p}_gamma", 1 + _x(D, spread=0.2)))
        g = f"{p}_g"
    nodes += [node("Mul", [f"{p}_mean", g], [f"{p}_m2"]), node("Mul", [x, g], [f"{p}_y1"])]
    if center:
        nodes += [node("Sub", [f"{p}_beta", f"{p}_m2"], [f"{p}_b"]), node("Add", [f"{p}_y1", f"{p}_b"], [out])]
        inits.append((f"{p}_beta", _x(D, spread=0.2)))
    else:
        nodes.append(node("Sub", [f"{p}_y1", f"{p}_m2"], [out]))
    return nodes, inits


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("scale, center", [(True, True), (False, True), (True, False)])
def test_keras_layer_norm_is_one_layer_norm(opset, scale, center):
    x = _x(1, T, D, spread=2.0) + 0.5
    nodes, inits = _moments_layer_norm("x", "y", "ln", opset=opset, scale=scale, center=center)
    model = onnx_model(nodes, {"x": x}, inits, opset=opset)
    graph, qgraph, got, want = onnx_op_run(model, {"x": x}, atol=2e-5, rtol=1e-4)
    assert _ops(graph) == ["LayerNorm"] and "QLayerNorm" in _ops(qgraph)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


def test_a_moments_lookalike_is_not_fused():
    """The same nodes with the variance of another tensor are no LayerNorm: they import one by one (the root and its
    reciprocal as lookup tables), unfused."""
    x = _x(1, T, D)
    nodes, inits = _moments_layer_norm("x", "y", "ln", opset=18)
    nodes[2] = node("Mul", ["ln_d", "x"], ["ln_d2"])
    ops = [n.op for n in import_onnx(onnx_model(nodes, {"x": x}, inits, opset=18)).nodes]
    assert "LayerNorm" not in ops and "Sqrt" in ops


@pytest.mark.parametrize("axes, keepdims, shape", [([1], 0, (1, T, D)), ([-1], 1, (2, T, D)), ([0, 2], 0, (2, 3, 8)),
                                                   ([1], 1, (1, 4, 6, 8))])
def test_reduce_mean_over_any_axes(axes, keepdims, shape):
    x = _x(*shape)
    model = onnx_model([node("ReduceMean", ["x", "axes"], ["y"], keepdims=keepdims)], {"x": x},
                       [("axes", np.array(axes, np.int64))], opset=18)
    graph, qgraph, got, want = onnx_op_run(model, {"x": x}, atol=2e-5, rtol=1e-4)
    assert "GlobalAvgPool" in _ops(graph)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max() + 1e-3


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
@pytest.mark.parametrize("axes, keepdims, shape",
                         [([-1], 0, (1, 6, 8)), ([1], 1, (2, 4, 6)), ([1, 3], 0, (1, 3, 4, 5))])
def test_reduce_sum_and_max_over_any_axes(op, axes, keepdims, shape):
    """WavLM's gate sums, Hiera's max over a mask unit: a view and a pool (a max), or an exact sum (Reduce)."""
    x = _x(*shape)
    model = onnx_model([node(op, ["x", "axes"], ["y"], keepdims=keepdims)], {"x": x},
                       [("axes", np.array(axes, np.int64))], opset=18)
    graph, _, got, want = onnx_op_run(model, {"x": x}, atol=2e-5, rtol=1e-4)
    assert ("MaxPool" if op == "ReduceMax" else "Reduce") in _ops(graph)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max() + 1e-3


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
@pytest.mark.parametrize("shapes", [((2, 6, 8), (2, 6, 1)), ((1, 6, 8), (8,)), ((2, 1, 8), (1, 6, 1))])
def test_two_activations_broadcast(op, shapes):
    """FocalNet's modulation and PoolFormer's ``pool(x) - x``: two activations of different shapes broadcast (each
    to the output's shape), Sub as an Add of the negated second."""
    a, b = _x(*shapes[0]), _x(*shapes[1])
    model = onnx_model([node("Relu", ["a"], ["ra"]), node("Tanh", ["b"], ["tb"]), node(op, ["ra", "tb"], ["y"])],
                       {"a": a, "b": b}, opset=17)
    graph, _, got, want = onnx_op_run(model, {"a": a, "b": b}, atol=2e-5, rtol=1e-4)
    assert ("Mul" if op == "Mul" else "Add") in _ops(graph) and "Sub" not in _ops(graph)
    assert got.shape == want.shape and np.abs(got - want).max() < 0.05 * np.abs(want).max() + 0.02


@pytest.mark.parametrize("repeats, shape", [((1, 3, 1), (2, 1, 5)), ((2, 1, 3), (2, 4, 1)), ((1, 1, 1), (2, 4, 5))])
def test_tile_is_concats_and_an_expand(repeats, shape):
    x = _x(*shape)
    model = onnx_model([node("Tile", ["x", "reps"], ["t"]), node("Relu", ["t"], ["y"])], {"x": x},
                       [("reps", np.array(repeats, np.int64))], opset=17)
    graph, _, got, want = onnx_op_run(model, {"x": x}, atol=1e-6, rtol=1e-6)
    assert "Tile" not in _ops(graph)
    assert got.shape == want.shape == tuple(s * r for s, r in zip(shape, repeats))


def _keras_block(opset):
    """A Keras-style encoder block as tf2onnx writes it: int32 ids -> embedding + positions, one-head attention
    whose key mask (int32 ``[1, T]``) is broadcast by Tile, the Keras LayerNorms, a Dense GELU MLP, and the mean over
    the tokens (GlobalAveragePooling1D) into a Dense head."""
    inits = [("table", _x(50, D)), ("pos", _x(1, T, D, spread=0.1)), ("wq", _x(D, D, spread=0.2)),
             ("wk", _x(D, D, spread=0.2)), ("wv", _x(D, D, spread=0.2)), ("wo", _x(D, D, spread=0.2)),
             ("w1", _x(D, 2 * D, spread=0.2)), ("w2", _x(2 * D, D, spread=0.2)), ("wh", _x(D, 10, spread=0.3)),
             ("scale", np.array(1 / np.sqrt(D), np.float32)), ("reps", np.array([1, T, 1], np.int64)),
             ("one", np.array(1.0, np.float32)), ("big", np.array(-1e9, np.float32)),
             ("pool_axes", np.array([1], np.int64)), ("ax1", np.array([1], np.int64))]
    nodes = [node("Gather", ["table", "ids"], ["e"]), node("Add", ["e", "pos"], ["h"]),
             node("MatMul", ["h", "wq"], ["q"]), node("MatMul", ["h", "wk"], ["k"]), node("MatMul", ["h", "wv"], ["v"]),
             node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["s0"]),
             node("Mul", ["s0", "scale"], ["s"]),
             node("Cast", ["mask"], ["mb"], to=TensorProto.BOOL), node("Unsqueeze", ["mb", "ax1"], ["m3"]),
             node("Tile", ["m3", "reps"], ["mt"]), node("Cast", ["mt"], ["mf"], to=TensorProto.FLOAT),
             node("Sub", ["one", "mf"], ["inv"]), node("Mul", ["inv", "big"], ["bias"]),
             node("Add", ["s", "bias"], ["z"]), node("Softmax", ["z"], ["p"], axis=-1),
             node("MatMul", ["p", "v"], ["c"]), node("MatMul", ["c", "wo"], ["o"]), node("Add", ["h", "o"], ["r1"])]
    ln1, i1 = _moments_layer_norm("r1", "n1", "ln1", opset=opset)
    nodes += ln1
    nodes += [node("MatMul", ["n1", "w1"], ["f0"]), node("Gelu", ["f0"], ["f1"]) if opset >= 20 else
              node("Relu", ["f0"], ["f1"]), node("MatMul", ["f1", "w2"], ["f2"]), node("Add", ["n1", "f2"], ["r2"])]
    ln2, i2 = _moments_layer_norm("r2", "n2", "ln2", opset=opset)
    nodes += ln2
    nodes += [node("ReduceMean", ["n2", "pool_axes"], ["pooled"], keepdims=0) if opset >= 18 else
              node("ReduceMean", ["n2"], ["pooled"], axes=[1], keepdims=0), node("MatMul", ["pooled", "wh"], ["y"])]
    graph = helper.make_graph(nodes, "keras_block",
                              [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, T]),
                               helper.make_tensor_value_info("mask", TensorProto.INT32, [1, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits + i1 + i2])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset", [17, 18])
def test_a_keras_block_runs_on_fsim(opset, tmp_path, monkeypatch):
    """int32 ids and mask: the ids import as token ids and the mask as a KeyMask; bit-exact with the integer
    reference on fsim, every linear layer on the accelerator, close to onnxruntime, the mask live."""
    from vta.compiler import qops
    from vta.compiler.pipeline import CalibrationSet, check_inputs, compile_model
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    model = _keras_block(opset)
    graph = import_onnx(model)
    assert {name: graph.tensors[name].dtype for name in graph.inputs} == {"ids": "int64", "mask": "int64"}
    assert _ops(graph).count("LayerNorm") == 2 and "KeyMask" in _ops(graph)
    ids = RNG.integers(0, 50, (1, T)).astype(np.int32)
    mask = np.ones((1, T), np.int32)
    mask[0, -4:] = 0
    feeds = {"ids": ids, "mask": mask}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, check_inputs(graph, feeds))["y"], want, atol=1e-4, rtol=1e-4)

    path = tmp_path / "block.onnx"
    path.write_bytes(model.SerializeToString())
    calib = {"ids": np.concatenate([ids, (ids + 7) % 50]), "mask": np.concatenate([mask, mask])}
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet(calib, {"source": "test", "samples": 2}))
    from vta.compiler.runtime.compiled import AccelStep
    linear = [s for s in compiled.steps if s.node.op in ("QConv2d", "QDense", "QMatMul")]
    assert len(linear) == 9 and all(isinstance(s, AccelStep) for s in linear)   # 7 linear layers, 2 products
    checked = check_inputs(compiled.graph, feeds)
    out = run(compiled, checked, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, checked)["y"])
    got = out.outputs["y"]
    cosine = float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want)))
    assert cosine > 0.99
    unmasked = check_inputs(compiled.graph, {"ids": ids, "mask": np.ones((1, T), np.int32)})
    assert not np.array_equal(run(compiled, unmasked, target="fsim").outputs["y"], got)


@pytest.mark.parametrize("form", ["int32_reshape", "int64_cast", "transpose"])
def test_token_ids_through_a_reshape_or_a_cast_index_the_table(form):
    """tf2onnx's GPT-2 reshapes int32 ids to ``[-1, T]`` before the lookup; its BERT from int64 ids casts them to
    int32 first; XLNet transposes them to ``[T, B]`` (and its lookup comes out transposed). Either way the ids import
    as token ids and the lookup as one Embedding."""
    kind = TensorProto.INT32 if form == "int32_reshape" else TensorProto.INT64
    step = node("Reshape", ["ids", "flat"], ["ids2"]) if form == "int32_reshape" else \
        node("Transpose", ["ids"], ["ids2"], perm=[1, 0]) if form == "transpose" else \
        node("Cast", ["ids"], ["ids2"], to=TensorProto.INT32)
    nodes = [step, node("Gather", ["table", "ids2"], ["e"]), node("Relu", ["e"], ["y"])]
    rows = 2 if form == "transpose" else 1                     # two sequences: a transpose is no reshape
    out = [T, rows, D] if form == "transpose" else [1, T, D]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("ids", kind, [rows, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              [numpy_helper.from_array(v, k) for k, v in
                               [("table", _x(50, D)), ("flat", np.array([-1, T], np.int64))]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(model)
    assert _ops(g)[0] == "Embedding" and g.tensors["ids"].dtype == "int64"
    ids = RNG.integers(0, 50, (rows, T)).astype(np.int32 if form == "int32_reshape" else np.int64)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(run_float(g, {"ids": ids.astype(np.int64)})["y"], want, atol=1e-6)


def test_t5_rms_norm_with_a_global_average_pool_is_one_node():
    """T5's RMSNorm as tf2onnx writes it at opset 17 (its weight of ones dropped): ``x * 1/sqrt(GAP(x * x) + eps)``
    with the mean over the last axis as a GlobalAveragePool of the rank-3 tensor."""
    x = _x(1, T, D, spread=2.0)
    nodes = [node("Mul", ["x", "x"], ["sq"]), node("GlobalAveragePool", ["sq"], ["ms"]),
             node("Add", ["ms", "eps"], ["me"]), node("Sqrt", ["me"], ["rt"]), node("Reciprocal", ["rt"], ["r"]),
             node("Mul", ["x", "r"], ["y"])]
    model = onnx_model(nodes, {"x": x}, [("eps", np.array(1e-6, np.float32))], opset=17)
    graph, qgraph, got, want = onnx_op_run(model, {"x": x}, atol=2e-5, rtol=1e-4)
    assert len(graph.nodes) == 1 and "Sqrt" not in _ops(graph)
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("condition", [True, False])
def test_an_if_on_a_constant_takes_its_branch(condition):
    """tf2onnx writes Keras's ``tf.cond`` on a constant as an If whose branch reads an outer initializer by name
    (XGLM's causal mask): the branch taken is inlined and folds."""
    x = _x(1, T, D)
    causal, ones = _x(1, T, D), np.ones((1, T, D), np.float32)
    then_branch = helper.make_graph([node("Identity", ["outer"], ["t_out"])], "then", [],
                                    [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [1, T, D])])
    else_branch = helper.make_graph([node("Identity", ["e_ones"], ["e_out"])], "else", [],
                                    [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [1, T, D])],
                                    [numpy_helper.from_array(ones, "e_ones")])
    nodes = [node("If", ["cond"], ["picked"], then_branch=then_branch, else_branch=else_branch),
             node("Add", ["x", "picked"], ["y"])]
    model = onnx_model(nodes, {"x": x}, [("cond", np.array(condition)), ("outer", causal)], opset=17)
    graph, _, got, want = onnx_op_run(model, {"x": x}, atol=1e-6, rtol=1e-6)
    assert "If" not in _ops(graph)
    np.testing.assert_allclose(want, x + (causal if condition else ones), atol=1e-6)


def _rotary_block(cumulative: bool):
    """Llama's rotary embedding of ``position_ids [1, T]`` given as an input (as optimum exports it): each
    position's row ``cos(p * inv_freq)`` (twice), times the queries ``q [1, H, T, D]``; with ``cumulative`` the
    positions are first summed along the row (a value that depends on every entry: no table)."""
    heads, dim = 2, 8
    inv_freq = (1.0 / 10000 ** (np.arange(0, dim, 2) / dim)).astype(np.float32)
    nodes = [node("CumSum", ["position_ids", "zero"], ["pos"])] if cumulative else \
        [node("Identity", ["position_ids"], ["pos"])]
    nodes += [node("Cast", ["pos"], ["pf"], to=TensorProto.FLOAT), node("Unsqueeze", ["pf", "last"], ["p3"]),
              node("Mul", ["p3", "inv_freq"], ["freqs"]), node("Concat", ["freqs", "freqs"], ["emb"], axis=-1),
              node("Cos", ["emb"], ["cos"]), node("Unsqueeze", ["cos", "one"], ["cos4"]),
              node("MatMul", ["x", "wq"], ["q0"]), node("Reshape", ["q0", "heads"], ["q1"]),
              node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]), node("Mul", ["q", "cos4"], ["y"])]
    inits = [("inv_freq", inv_freq), ("last", np.array([-1], np.int64)), ("one", np.array([1], np.int64)),
             ("zero", np.array(1, np.int64)), ("wq", _x(D, heads * dim, spread=0.3)),
             ("heads", np.array([1, T, heads, dim], np.int64))]
    graph = helper.make_graph(nodes, "rotary", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, T, D]),
                                                helper.make_tensor_value_info("position_ids", TensorProto.INT64,
                                                                              [1, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, heads, T, dim])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_position_ids_given_as_an_input_read_a_table_of_rows():
    """Each position's rotary row is a function of that position alone: the input becomes token ids into a table of
    ``P`` rows (``P`` = the largest static input dimension, here x's D), and the block computes what onnxruntime
    does; a position beyond the table is refused by the token-id check."""
    model = _rotary_block(cumulative=False)
    graph = import_onnx(model)
    assert graph.tensors["position_ids"].dtype == "int64" and "Embedding" in _ops(graph)
    feeds = {"x": _x(1, T, D), "position_ids": RNG.permutation(T).reshape(1, T).astype(np.int64)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    from vta.compiler.pipeline import InputError, check_inputs
    assert graph.shape("position_ids_table0")[0] == D
    with pytest.raises(InputError, match=f"token ids outside \\[0, {D - 1}\\].*'position_ids'"):
        check_inputs(graph, dict(feeds, position_ids=np.full((1, T), D, np.int64)))


def test_an_input_whose_rows_depend_on_other_entries_is_computed_in_float():
    """Positions summed along the row are no table lookup: the rotary region is one InputFn of the positions
    (compiler/frontend/numeric_inputs.py), run in float as onnxruntime runs it."""
    model = _rotary_block(cumulative=True)
    graph = import_onnx(model)
    assert "InputFn" in [n.op for n in graph.nodes] and "Embedding" not in [n.op for n in graph.nodes]
    feeds = {"x": _x(1, T, D), "position_ids": (np.arange(T) + 4).reshape(1, T).astype(np.int64)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)


def test_a_rotary_block_with_position_ids_runs_on_fsim(tmp_path, monkeypatch):
    from vta.compiler import qops
    from vta.compiler.pipeline import CalibrationSet, check_inputs, compile_model
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    model = _rotary_block(cumulative=False)
    path = tmp_path / "rotary.onnx"
    path.write_bytes(model.SerializeToString())
    positions = (np.arange(T) + 4).reshape(1, T).astype(np.int64)        # a generation step after 4 tokens
    calib = {"x": np.concatenate([_x(1, T, D), _x(1, T, D)]), "position_ids": np.concatenate([positions] * 2)}
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet(calib, {"source": "test", "samples": 2}))
    feeds = check_inputs(compiled.graph, {"x": _x(1, T, D), "position_ids": positions})
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    assert float((got * want).sum() / (np.linalg.norm(got) * np.linalg.norm(want))) > 0.99


def test_an_if_on_an_input_is_refused_before_the_inputs_it_hides():
    """optimum's merged decoder chooses its branch by a bool input, and its branches are where the int64 mask is
    used: the If is named with what to compile instead, not the mask's type."""
    branch = helper.make_graph([node("Cast", ["mask"], ["b_out"], to=TensorProto.FLOAT)], "b", [],
                               [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [1, T])])
    graph = helper.make_graph([node("If", ["use_cache_branch"], ["y"], then_branch=branch, else_branch=branch,
                                    name="optimum::if")], "merged",
                              [helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]),
                               helper.make_tensor_value_info("mask", TensorProto.INT64, [1, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, T])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError
    with pytest.raises(UnsupportedOperatorError, match=r"'If' \(node 'optimum::if'\).*decoder_with_past_model.onnx"):
        import_onnx(model)


def test_an_if_on_a_constant_writing_a_graph_output_and_a_malformed_one():
    """The branch taken may write the graph's output (its Identity does); an If on a constant without the branch it
    takes is refused with a reason, not a traceback."""
    x = _x(1, T, D)
    branch = helper.make_graph([node("Relu", ["x"], ["b_out"])], "then", [],
                               [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [1, T, D])])
    model = onnx_model([node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)], {"x": x},
                       [("cond", np.array(True))], opset=17)
    graph, _, got, want = onnx_op_run(model, {"x": x}, atol=1e-6, rtol=1e-6)
    assert "If" not in _ops(graph)
    broken = onnx_model([node("If", ["cond"], ["y"])], {"x": x}, [("cond", np.array(True))], opset=17)
    from vta.compiler.frontend.onnx_frontend import ModelFileError
    with pytest.raises(ModelFileError, match=r"not a valid ONNX graph: node #0 \(writes 'y'\) \(If\) lacks its "
                                             r"required attribute 'else_branch'; .* 'then_branch'"):
        import_onnx(broken)


def test_an_integer_input_the_graph_does_not_read_is_taken_and_ignored(tmp_path, monkeypatch):
    """An exporter declares optional inputs the graph ignores (token_type_ids of a model that has no segment table):
    such an int64 input imports as an int64 input nothing reads, and a run with it given matches onnxruntime."""
    from vta.compiler.pipeline import check_inputs, compile_model
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    x = _x(1, T, D)
    model = onnx_model([node("MatMul", ["x", "w"], ["y"])], {"x": x}, [("w", _x(D, 8, spread=0.3))], opset=17)
    model.graph.input.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, [1, T]))
    graph = import_onnx(model)
    assert graph.tensors["token_type_ids"].dtype == "int64" and not graph.consumers("token_type_ids")
    path = tmp_path / "unused.onnx"
    path.write_bytes(model.SerializeToString())
    compiled = compile_model(str(path), VTAConfig(), calib=2)
    feeds = {"x": x, "token_type_ids": np.zeros((1, T), np.int64)}
    got = run(compiled, check_inputs(compiled.graph, feeds), target="fsim").outputs["y"]
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    assert float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99
