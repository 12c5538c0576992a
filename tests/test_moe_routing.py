"""Mixture-of-experts routing (compiler/frontend/moe.py): a TopK over router scores whose indices gather rows of
constant expert stacks, as transformers' ``batched_mm`` experts export it. The rewrite against onnxruntime in float,
the quantized graph bit-exact with the integer reference on the CPU path and on fsim with every expert's linear layer
on the accelerator, the choice of experts on ties (as ONNX's TopK), and what stays refused."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper

from vta.compiler import qops
from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx
from vta.compiler.qops_index import top_k_one_hot
from vta.config import VTAConfig

RNG_SEED = 37                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)
TOKENS, WIDTH, INNER, EXPERTS, K = 16, 32, 24, 4, 2


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _n(op, inputs, output, **attrs):
    outputs = output if isinstance(output, list) else [output]
    return helper.make_node(op, list(inputs), outputs, name=f"{outputs[0]}_node", **attrs)


def _i64(*values):
    return np.array(values, np.int64)


def moe_block(*, renormalise=True, gather_nd=False, bias=False, router="softmax"):
    """One MoE feed-forward over ``x [TOKENS, WIDTH]`` as the legacy exporter writes Mixtral's ``batched_mm``
    experts: router, TopK, the top-k weights, the tokens tiled k times, each routed row times its expert's gate/up
    matrix (SiLU-gated) and down matrix, weighted and summed over k. The weights: renormalised over the chosen
    experts; as chosen (``renormalise=False``); a Softmax over the chosen logits (``router="topk_softmax"``); or
    DeepSeek-V3's sigmoid scores (``router="sigmoid"``), chosen inside the best of two groups
    (``router="grouped"``). ``gather_nd``: the stacks gathered by
    ``GatherND(W, idx[:, None])``, as torch's new exporter writes it; ``bias``: each expert's down projection has a
    bias gathered by the same indices."""
    rows = TOKENS * K
    nodes = [_n("MatMul", ["x", "w_router"], "logits")]
    if router == "softmax":
        nodes += [_n("Softmax", ["logits"], "probs", axis=-1),
                  _n("TopK", ["probs", "k"], ["top_v", "top_i"], axis=-1)]
        if renormalise:
            nodes += [_n("ReduceSum", ["top_v", "axis_last"], "top_sum", keepdims=1),
                      _n("Div", ["top_v", "top_sum"], "weights")]
        else:
            nodes += [_n("Identity", ["top_v"], "weights")]
    elif router == "grouped":       # DeepSeek-V3's group-limited choice: the best group's experts only
        nodes += [_n("Sigmoid", ["logits"], "probs"), _n("Add", ["probs", "route_bias"], "biased"),
                  _n("Reshape", ["biased", "groups"], "by_group"),
                  _n("TopK", ["by_group", "two"], ["group_top", "unused_i"], axis=-1),
                  _n("ReduceSum", ["group_top", "axis_last"], "group_scores", keepdims=0),
                  _n("TopK", ["group_scores", "one"], ["unused_v", "group_i"], axis=-1, sorted=0),
                  _n("ScatterElements", ["group_zeros", "group_i", "group_ones"], "group_mask", axis=1),
                  _n("Unsqueeze", ["group_mask", "axis_last"], "gm3"), _n("Expand", ["gm3", "groups"], "gm_wide"),
                  _n("Reshape", ["gm_wide", "scores_shape"], "score_mask"),
                  _n("Cast", ["score_mask"], "mask_bool", to=onnx.TensorProto.BOOL),
                  _n("Not", ["mask_bool"], "drop"), _n("Where", ["drop", "minus_inf", "biased"], "allowed"),
                  _n("TopK", ["allowed", "k"], ["top_v", "top_i"], axis=-1, sorted=0),
                  _n("GatherElements", ["probs", "top_i"], "chosen", axis=-1),
                  _n("ReduceSum", ["chosen", "axis_last"], "top_sum", keepdims=1),
                  _n("Div", ["chosen", "top_sum"], "weights")]
    elif router == "sigmoid":       # DeepSeek-V3's: chosen by score + bias, weighted by the score, renormalised
        nodes += [_n("Sigmoid", ["logits"], "probs"), _n("Add", ["probs", "route_bias"], "biased"),
                  _n("TopK", ["biased", "k"], ["top_v", "top_i"], axis=-1),
                  _n("GatherElements", ["probs", "top_i"], "chosen", axis=-1),
                  _n("ReduceSum", ["chosen", "axis_last"], "top_sum", keepdims=1),
                  _n("Add", ["top_sum", "tiny"], "den"), _n("Div", ["chosen", "den"], "weights")]
    else:
        nodes += [_n("TopK", ["logits", "k"], ["top_v", "top_i"], axis=-1),
                  _n("Softmax", ["top_v"], "weights", axis=-1)]
    nodes += [_n("Reshape", ["top_i", "flat"], "idx"),
              _n("Unsqueeze", ["x", "axis1"], "x3"), _n("Tile", ["x3", "tiles"], "xt"),
              _n("Reshape", ["xt", "rows_h"], "xr"), _n("Unsqueeze", ["xr", "axis_last"], "xcol")]
    if gather_nd:
        nodes += [_n("Unsqueeze", ["idx", "axis_last"], "idx_nd"),
                  _n("GatherND", ["w_gate_up", "idx_nd"], "g1"), _n("GatherND", ["w_down", "idx_nd"], "g2")]
    else:
        nodes += [_n("Gather", ["w_gate_up", "idx"], "g1", axis=0), _n("Gather", ["w_down", "idx"], "g2", axis=0)]
    nodes += [_n("MatMul", ["g1", "xcol"], "gu3"), _n("Squeeze", ["gu3", "axis_last"], "gu"),
              _n("Slice", ["gu", "zero", "inner", "axis_last"], "gate"),
              _n("Slice", ["gu", "inner", "inner2", "axis_last"], "up"),
              _n("Sigmoid", ["gate"], "sg"), _n("Mul", ["gate", "sg"], "silu"), _n("Mul", ["silu", "up"], "h"),
              _n("Unsqueeze", ["h", "axis_last"], "hcol"), _n("MatMul", ["g2", "hcol"], "d3"),
              _n("Squeeze", ["d3", "axis_last"], "d")]
    if bias:
        nodes += [_n("Gather", ["b_down", "idx"], "bd", axis=0), _n("Add", ["d", "bd"], "db")]
    nodes += [_n("Reshape", ["weights", "rows_1"], "wr"), _n("Mul", ["db" if bias else "d", "wr"], "dw"),
              _n("Reshape", ["dw", "tkh"], "dk"), _n("ReduceSum", ["dk", "axis1"], "y", keepdims=0)]
    inits = [("w_router", _x(WIDTH, EXPERTS, spread=0.5)), ("k", _i64(K)), ("axis_last", _i64(-1)),
             ("axis1", _i64(1)), ("flat", _i64(-1)), ("tiles", _i64(1, K, 1)), ("rows_h", _i64(rows, WIDTH)),
             ("w_gate_up", _x(EXPERTS, 2 * INNER, WIDTH, spread=0.2)),
             ("w_down", _x(EXPERTS, WIDTH, INNER, spread=0.2)),
             ("zero", _i64(0)), ("inner", _i64(INNER)), ("inner2", _i64(2 * INNER)), ("rows_1", _i64(rows, 1)),
             ("tkh", _i64(TOKENS, K, WIDTH)), ("route_bias", _x(EXPERTS, spread=0.1)),
             ("tiny", np.array([1e-20], np.float32)), ("groups", _i64(TOKENS, 2, EXPERTS // 2)), ("two", _i64(2)),
             ("one", _i64(1)), ("group_zeros", np.zeros((TOKENS, 2), np.float32)),
             ("group_ones", np.ones((TOKENS, 1), np.float32)), ("scores_shape", _i64(TOKENS, EXPERTS)),
             ("minus_inf", np.array(-np.inf, np.float32))]
    if bias:
        inits.append(("b_down", _x(EXPERTS, WIDTH, spread=0.1)))
    return onnx_model(nodes, {"x": _x(TOKENS, WIDTH)}, inits)


def _cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("form", [dict(), dict(renormalise=False), dict(router="topk_softmax"),
                                  dict(router="sigmoid"), dict(router="grouped"), dict(gather_nd=True),
                                  dict(bias=True)])
def test_an_moe_block_imports_dense_over_the_experts_and_matches_onnxruntime(form):
    x = _x(TOKENS, WIDTH)
    graph, qgraph, got, want = onnx_op_run(moe_block(**form), {"x": x}, atol=2e-5, rtol=1e-4)
    ops = [n.op for n in graph.nodes]
    assert ops.count("TopKOneHot") == (3 if form.get("router") == "grouped" else 1) and "Gather" not in ops
    experts = [n for n in graph.nodes if n.name.endswith(tuple(f"/expert{e}" for e in range(EXPERTS)))]
    assert len(experts) == 2 * EXPERTS and {n.op for n in experts} == {"Conv2d"}   # linear layers over the rows
    # int8 scores may flip a close choice: here one token of 16 takes the other group (so two other experts)
    assert _cosine(got, want) > (0.9 if form.get("router") == "grouped" else 0.99)


def test_renormalised_softmax_weights_are_the_softmax_of_the_chosen_logits():
    graph = import_onnx(moe_block())
    assert [n.outputs[0] for n in graph.nodes if n.op == "Softmax"] == ["probs", "weights"]
    onehot = next(n for n in graph.nodes if n.op == "TopKOneHot")
    assert onehot.inputs == ["probs"] and onehot.attrs["k"] == K
    assert not any(n.op == "Div" for n in graph.nodes)


def test_the_moe_block_on_fsim_is_bit_exact_with_the_reference_and_its_experts_run_on_the_accelerator(
        tmp_path, monkeypatch):
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = tmp_path / "moe.onnx"
    onnx.save(moe_block(bias=True), str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel")
    accel = {s.node.name for s in compiled.steps if isinstance(s, AccelStep)}
    assert sum(name.endswith(tuple(f"/expert{e}" for e in range(EXPERTS))) for name in accel) == 2 * EXPERTS
    x = _x(TOKENS, WIDTH)
    out = run(compiled, {"x": x}, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, {"x": x})["y"])


def test_vta_run_says_the_experts_run_dense(tmp_path, monkeypatch, capsys):
    from vta.cli import main
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = tmp_path / "moe.onnx"
    onnx.save(moe_block(), str(path))
    np.save(tmp_path / "x.npy", _x(TOKENS, WIDTH))
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    dense = EXPERTS * TOKENS * K * (2 * INNER * WIDTH + WIDTH * INNER)      # gate/up and down, every expert
    assert "matches_integer_reference: True" in out
    assert (f"moe: 1 top-k choice(s) (TopKOneHot, on the CPU, on int8 scores); the experts' {2 * EXPERTS} linear "
            f"layers ({2 * EXPERTS} on the accelerator) run dense over every routed row: {dense:,} MACs, {EXPERTS} "
            f"times") in out.replace("\n", " ")


def test_top_k_one_hot_breaks_ties_as_onnx_topk_does():
    scores = np.array([[3, 5, 5, 1, 5], [0, 0, 0, 0, 0], [-2, 7, -2, 7, 1]], np.int8)
    model = helper.make_model(helper.make_graph(
        [_n("TopK", ["s", "k"], ["v", "i"], axis=-1)], "topk",
        [helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [3, 5])],
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [3, 3])],
        [onnx.numpy_helper.from_array(_i64(3), "k")]), opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"s": scores.astype(np.float32)})[0]
    for values in (scores, scores.astype(np.float32)):
        hot = top_k_one_hot(values, 3)
        assert hot.shape == (3, 3, 5) and hot.dtype == values.dtype
        np.testing.assert_array_equal(hot.argmax(-1), want)


def test_sigmoid_scores_renormalise_as_one_sum_normalize():
    graph = import_onnx(moe_block(router="sigmoid"))
    norm = next(n for n in graph.nodes if n.op == "SumNormalize")
    assert norm.outputs == ["weights"] and norm.attrs["epsilon"] == pytest.approx(1e-20)
    assert next(n for n in graph.nodes if n.op == "TopKOneHot").inputs == ["biased"]


def test_group_limited_routing_is_one_masked_choice_of_the_experts():
    """The group TopKs become one-hot sums and the masked TopK one TopKOneHot keeping the best group's experts."""
    graph = import_onnx(moe_block(router="grouped"))
    choice = [n for n in graph.nodes if n.op == "TopKOneHot"]
    assert [(n.inputs[0], n.attrs["keep"]) for n in choice] == [("by_group", "all"), ("group_scores", "all"),
                                                                ("biased", "nonzero")]
    assert choice[-1].inputs[1] == "score_mask"
    assert not {"Where", "Not", "Cast", "ScatterElements"} & {n.op for n in graph.nodes}


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_a_masked_top_k_one_hot_chooses_as_topk_of_the_scores_filled_with_minus_infinity(dtype):
    x = RNG.integers(-3, 4, (6, 8)).astype(dtype)
    mask = RNG.integers(0, 2, (6, 8)).astype(dtype)
    mask[0] = 0                                          # fewer kept entries than k: the filled ones by index
    model = helper.make_model(helper.make_graph(
        [_n("TopK", ["s", "k"], ["v", "i"], axis=-1)], "topk",
        [helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [6, 8])],
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, [6, 3])],
        [onnx.numpy_helper.from_array(_i64(3), "k")]), opset_imports=[helper.make_opsetid("", 17)])
    run = ort.InferenceSession(model.SerializeToString())
    for keep, filled in (("nonzero", mask == 0), ("zero", mask != 0)):
        want = run.run(None, {"s": np.where(filled, -np.inf, x).astype(np.float32)})[0]
        np.testing.assert_array_equal(top_k_one_hot(x, 3, mask, keep).argmax(-1), want)


def test_the_values_of_a_topk_alone_are_the_chosen_entries():
    x = _x(2, 6, 10, spread=2.0)
    nodes = [_n("TopK", ["x", "k"], ["y", "i"], axis=-1)]
    graph, _, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, [("k", _i64(3))]), {"x": x}, atol=1e-6, rtol=1e-6)
    assert graph.nodes[0].op == "TopKOneHot" and graph.nodes[0].attrs == {"k": 3, "keep": "all"}
    assert np.abs(got - want).max() <= 3 * np.abs(want).max() / 127


def test_a_topk_whose_indices_reach_anything_else_stays_refused():
    """The indices added to a float (a position offset): no expert gather, so TopK is refused by name."""
    x = _x(TOKENS, EXPERTS)
    nodes = [_n("TopK", ["x", "k"], ["v", "i"], axis=-1), _n("Cast", ["i"], "f", to=onnx.TensorProto.FLOAT),
             _n("Add", ["v", "f"], "y")]
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError), match="TopK"):
        import_onnx(onnx_model(nodes, {"x": x}, [("k", _i64(K))]))


def test_a_scatter_of_the_indices_into_another_shape_stays_refused():
    """ScatterElements of ones into zeros wider than the scores is no mask of the chosen entries."""
    x = _x(TOKENS, EXPERTS)
    nodes = [_n("TopK", ["x", "k"], ["v", "i"], axis=-1),
             _n("ScatterElements", ["zeros", "i", "ones"], "hot", axis=1), _n("Mul", ["hot", "hot"], "y")]
    inits = [("k", _i64(K)), ("zeros", np.zeros((TOKENS, EXPERTS + 2), np.float32)),
             ("ones", np.ones((TOKENS, K), np.float32))]
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError), match="TopK"):
        import_onnx(onnx_model(nodes, {"x": x}, inits))


def test_a_topkonehot_node_of_the_file_itself_is_refused():
    with pytest.raises(UnsupportedOperatorError, match="TopKOneHot"):
        import_onnx(onnx_model([_n("TopKOneHot", ["x"], "y", k=2)], {"x": _x(4, 8)}))
