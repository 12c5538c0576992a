"""Score chains whose mask is added in one shape and whose Softmax is taken in another (XGLM, BLOOM's ALiBi):
:mod:`vta.compiler.frontend.score_chains` rewrites them exactly, and the blocks run bit-exact on fsim."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_runtime_masks import B, H, T, _additive, _block, check_masked_block

from vta.compiler.frontend import score_chains
from vta.compiler.frontend.onnx_frontend import import_onnx

node = helper.make_node


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))


def _shapes(rng, rank):
    return tuple(int(d) for d in rng.integers(1, 4, rank))


def test_an_operand_mapped_across_a_reshape_gives_the_same_values():
    """For random shapes, operands and Reshapes that keep the last axis: the operand broadcast to the Reshape's
    output and reshaped back equals the mapped operand (expanded, reshaped) broadcast to the Reshape's input."""
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(400):
        target = _shapes(rng, int(rng.integers(1, 4))) + (int(rng.integers(2, 5)),)     # rows of 2 or more
        lead = int(np.prod(target[:-1]))
        splits = [d for d in range(1, lead + 1) if lead % d == 0]
        first = int(rng.choice(splits))
        out = (first, lead // first, target[-1]) if rng.random() < 0.5 else (lead, target[-1])
        groups = score_chains.reshape_groups(target, out)
        assert groups is not None and groups[-1] == (range(len(target) - 1, len(target)),
                                                     range(len(out) - 1, len(out)))
        rank = int(rng.integers(0, len(out) + 1))
        shape = tuple(o if rng.random() < 0.5 else 1 for o in out[len(out) - rank:])
        operand = rng.standard_normal(shape)
        mapped = score_chains.map_operand_shape(shape, out, target)
        assert mapped is not None
        expanded, reshaped = mapped
        want = np.broadcast_to(operand, out).reshape(target)
        full = operand.reshape((1,) * (len(expanded) - operand.ndim) + operand.shape)
        got = np.broadcast_to(np.broadcast_to(full, expanded).reshape(reshaped), target)
        np.testing.assert_array_equal(got, want)
        checked += 1
    assert checked == 400
    assert score_chains.map_operand_shape((3, 4), (2, 4), (8,)) is None         # does not broadcast
    assert score_chains.reshape_groups((2, 3), (5,)) is None


def _xglm_nodes():
    """XGLM's chain: the scores viewed ``[B*H, T, T]`` -> ``[B, H, T, T]``, the mask added, viewed back, Softmax;
    after it the probabilities viewed ``[B, H, T, T]`` again."""
    mask_nodes, inits = _additive(-10000.0)
    add = mask_nodes[-1]
    add.input[:] = ["s4", "bias"]
    add.output[:] = ["a"]
    nodes = [node("Reshape", ["s", "flat3"], ["s3"]), node("Reshape", ["s3", "four"], ["s4"]), *mask_nodes,
             node("Reshape", ["a", "flat3"], ["z"], name="view_back")]
    return nodes, inits + [("flat3", np.array([B * H, T, T], np.int64)), ("four", np.array([B, H, T, T], np.int64))]


def _bart_nodes():
    """XGLM's chain with a constant 1e-9 added after the view back (Hugging Face's TF ``stable_softmax``, as tf2onnx
    writes BART, OPT and Blenderbot)."""
    nodes, inits = _xglm_nodes()
    nodes[-1].output[:] = ["z0"]
    return nodes + [node("Add", ["z0", "tiny"], ["z"])], inits + [("tiny", np.array(1e-9, np.float32))]


def _bloom_nodes():
    """BLOOM's chain: ALiBi (the slopes times the keys' positions ``cumsum(mask) - 1``, zero where masked) added to
    the scores in ``[B*H, T, T]``, a view as ``[B, H, T, T]``, then the padding mask added before the Softmax."""
    mask_nodes, inits = _additive(-10000.0)
    mask_nodes[-1].input[:] = ["s4", "bias"]
    nodes = [node("Reshape", ["s", "flat3"], ["s3"]),
             node("Cast", ["attention_mask"], ["mf32"], to=TensorProto.FLOAT),
             node("CumSum", ["mf32", "axis1"], ["cs"]), node("Sub", ["cs", "one"], ["pos0"]),
             node("Mul", ["pos0", "mf32"], ["pos"]), node("Unsqueeze", ["pos", "ax1"], ["pos3"]),
             node("Mul", ["slopes", "pos3"], ["alibi3"]), node("Reshape", ["alibi3", "alibi_shape"], ["alibi"]),
             node("Add", ["s3", "alibi"], ["sa"], name="alibi_add"), node("Reshape", ["sa", "four"], ["s4"]),
             *mask_nodes]
    slopes = (2.0 ** -np.arange(1, H + 1, dtype=np.float32)).reshape(1, H, 1)
    return nodes, inits + [("flat3", np.array([B * H, T, T], np.int64)), ("four", np.array([B, H, T, T], np.int64)),
                           ("axis1", np.array(1, np.int64)), ("ax1", np.array([1], np.int64)),
                           ("slopes", slopes), ("alibi_shape", np.array([B * H, 1, T], np.int64))]


def _bloom_step_nodes():
    """BLOOM's chain as a decode step has it: the ALiBi term broadcast to the scores' own shape (one query row),
    so both operands of its Add have the scores' shape and only one of them is a mask term."""
    nodes, inits = _bloom_nodes()
    alibi_add = next(n for n in nodes if n.name == "alibi_add")
    alibi_add.input[1] = "alibi_full"
    nodes.insert(nodes.index(alibi_add), node("Expand", ["alibi", "flat3"], ["alibi_full"]))
    return nodes, inits


def _codegen_nodes():
    """CodeGen's chain: the mask added to the scores, then the sum divided by a positive constant before the
    Softmax."""
    mask_nodes, inits = _additive(-10000.0)
    mask_nodes[-1].output[:] = ["a"]
    return mask_nodes + [node("Div", ["a", "temperature"], ["z"])], inits + [("temperature",
                                                                              np.array(1.5, np.float32))]


@pytest.mark.parametrize("form", ["xglm", "bloom", "bloom_step", "bart", "codegen"])
def test_a_mask_added_in_another_shape_of_the_scores_runs_on_fsim(form, tmp_path):
    """Each layer's runtime mask reaches its Softmax as one KeyMask; the import computes what onnxruntime does, and
    the compiled block is bit-exact with the integer reference on fsim, close to onnxruntime, with the mask live."""
    nodes, inits = {"xglm": _xglm_nodes, "bloom": _bloom_nodes, "bloom_step": _bloom_step_nodes,
                    "bart": _bart_nodes, "codegen": _codegen_nodes}[form]()
    after = [node("Reshape", ["p", "four"], ["pg"])] if form in ("xglm", "bart") else None
    model = _block(nodes, extra_inits=inits, after_softmax=after, )
    graph = import_onnx(model)
    keys = [n for n in graph.nodes if n.op == "KeyMask"]
    assert len(keys) == 1
    for key in keys:
        assert [r.op for r in graph.consumers(key.outputs[0])] == ["Softmax"]
    check_masked_block(model, graph, tmp_path)


def test_a_chain_with_only_constants_before_its_reshape_is_left_alone():
    """A Reshape after the scores with a constant causal mask after it: the chain already has the form the import
    reads, and normalize changes nothing."""
    causal = np.triu(np.full((T, T), -10000.0, np.float32), 1)
    nodes = [node("Reshape", ["s", "flat3"], ["s3"]), node("Add", ["s3", "causal"], ["z"])]
    inits = [("flat3", np.array([B * H, T, T], np.int64)), ("causal", causal)]
    after = [node("Reshape", ["p", "four"], ["pg"])]
    model = _block(nodes, extra_inits=inits + [("four", np.array([B, H, T, T], np.int64))], after_softmax=after)
    model = onnx.shape_inference.infer_shapes(model)
    before = [n.SerializeToString() for n in model.graph.node]
    from vta.compiler.frontend.contrib import static_shapes
    assert not score_chains.normalize(model, static_shapes(model))
    assert [n.SerializeToString() for n in model.graph.node] == before


def test_groups_follow_the_reshape():
    assert score_chains.reshape_groups((4, 8, 16), (2, 2, 8, 16)) == [(range(0, 1), range(0, 2)),
                                                                       (range(1, 2), range(2, 3)),
                                                                       (range(2, 3), range(3, 4))]
    for src, dst in itertools.product([(6, 4), (2, 3, 4), (1, 6, 4)], repeat=2):
        groups = score_chains.reshape_groups(src, dst)
        assert groups is not None
        assert all(np.prod([src[k] for k in a]) == np.prod([dst[k] for k in b]) for a, b in groups)
