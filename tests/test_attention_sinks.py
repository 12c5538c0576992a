"""Attention sinks and the max shift written out before a Softmax (compiler/frontend/score_chains.py's
``absorb_sinks`` and ``_drop_max_shifts``, the Softmax's ``sink`` attribute in compiler/qops.py): GPT-OSS's
``Slice(Softmax(Concat([scores + mask, sinks]) - max), :T)`` on a tiny block with a runtime mask, against onnxruntime,
the integer reference and fsim; the sink softmax against the concatenated one; and the forms left alone."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper
from test_runtime_masks import (
    B,
    D,
    T,
    _additive,
    _block,
    _compile,
    _cosine,
    _fsim,
    _ids,
    _padding_mask,
)

from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import QuantizationError, quantize
from vta.compiler.qops import qsoftmax, sink_softmax, softmax

H = 2
node = helper.make_node
SINKS = np.array([0.7, -0.4], np.float32).reshape(1, H, 1, 1)


def _sinks(*, max_shift=True, cast=True, end=-1, sink_first=False, computed=False):
    """GPT-OSS's attention: an additive mask ``zm``, the sinks ``[B, H, T, 1]`` concatenated as one more key
    column, the max shift (``max_shift``), the Softmax, an identity Cast (``cast``) and a Slice dropping the sink
    column (``end``: -1, or T). ``sink_first``: the sink column comes first, and the Slice keeps 1 to T + 1.
    ``computed``: the sinks are Inkling-2's, a projection of the block's input per query and head."""
    mask_nodes, inits = _additive(-10000.0)
    mask_nodes[-1] = node("Add", ["s", "bias"], ["zm"], name="mask_add")
    sink_nodes = [node("Expand", ["sinks", "sink_shape"], ["sk"])] if not computed else \
        [node("MatMul", ["h", "w_sink"], ["sp"]), node("Transpose", ["sp"], ["st"], perm=[0, 2, 1]),
         node("Unsqueeze", ["st", "last"], ["sk"])]
    if computed:
        inits += [("w_sink", (np.random.default_rng(3).standard_normal((D, H)) * 0.5).astype(np.float32))]
    nodes = [*mask_nodes, *sink_nodes,
             node("Concat", ["sk", "zm"] if sink_first else ["zm", "sk"], ["zc"], axis=-1)]
    if max_shift:
        nodes += [node("ReduceMax", ["zc"], ["peak"], axes=[-1], keepdims=1), node("Sub", ["zc", "peak"], ["z"])]
    else:
        nodes += [node("Identity", ["zc"], ["z"])]
    after = [node("Cast", ["p"], ["pc"], to=1)] if cast else [node("Identity", ["p"], ["pc"])]
    after += [node("Slice", ["pc", "zero", "end", "last"], ["pg"])]
    inits += [("sinks", SINKS), ("sink_shape", np.array([B, H, T, 1], np.int64)),
              ("zero", np.array([1 if sink_first else 0], np.int64)),
              ("end", np.array([T + 1 if sink_first else end], np.int64)),
              ("last", np.array([-1], np.int64))]
    return _block(nodes, extra_inits=inits, after_softmax=after)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("max_shift, cast, end", [(True, True, -1), (False, False, T)])
def test_a_block_with_attention_sinks_and_a_runtime_mask_runs_on_fsim(max_shift, cast, end, tmp_path):
    model = _sinks(max_shift=max_shift, cast=cast, end=end)
    graph = import_onnx(model)
    softmax_node = next(n for n in graph.nodes if n.op == "Softmax")
    np.testing.assert_array_equal(softmax_node.attrs["sink"], np.broadcast_to(SINKS, (B, H, T, 1)))
    assert not {"Concat", "Slice", "ReduceMax"} & {n.op for n in graph.nodes}
    assert "KeyMask" in [n.op for n in graph.nodes]
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    compiled = _compile(model, tmp_path, feeds)
    qsoft = next(n for n in compiled.graph.nodes if n.op == "QSoftmax")
    assert "sink" in qsoft.attrs and qsoft.inputs[1] == "attention_mask"
    got = _fsim(compiled, feeds).outputs["y"]
    assert _cosine(got, want) > 0.99
    unmasked = {"input_ids": feeds["input_ids"], "attention_mask": np.ones((B, T), np.int64)}
    assert not np.array_equal(_fsim(compiled, unmasked).outputs["y"][1], got[1])       # the mask is live


def test_sinks_computed_from_the_activations_are_the_softmaxs_second_input(tmp_path):
    """Inkling-2: the sink logits are a projection of the block's input, ``[B, H, T, 1]``; the Softmax reads them
    as its last input (int8 at their own scale), beside the runtime mask, on fsim against onnxruntime."""
    model = _sinks(computed=True)
    graph = import_onnx(model)
    softmax_node = next(n for n in graph.nodes if n.op == "Softmax")
    assert softmax_node.attrs.get("sink_input") and softmax_node.inputs[1] == "sk"
    assert "sk" not in graph.outputs and not {"Concat", "Slice", "ReduceMax"} & {n.op for n in graph.nodes}
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    compiled = _compile(model, tmp_path, feeds)
    qsoft = next(n for n in compiled.graph.nodes if n.op == "QSoftmax")
    assert qsoft.inputs[1] == "attention_mask" and qsoft.inputs[2] == "sk" and "sink_scale" in qsoft.attrs
    assert _cosine(_fsim(compiled, feeds).outputs["y"], want) > 0.99


def test_the_sink_softmax_is_the_concatenated_softmax_without_the_sink_columns():
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (2, 3, 4, 6)).astype(np.int8)
    sink = rng.standard_normal((1, 3, 1, 2))
    wide = np.concatenate([x * 0.05, np.broadcast_to(sink, (2, 3, 4, 2))], axis=-1)
    full = np.exp(wide - wide.max(-1, keepdims=True))
    want = (full / full.sum(-1, keepdims=True))[..., :6]
    np.testing.assert_allclose(softmax(x, 0.05, -1, sink=sink), want, rtol=1e-6)
    np.testing.assert_array_equal(qsoftmax(x, 0.05, 1 / 127, -1, sink=sink),
                                  np.clip(np.rint(want * 127), -128, 127).astype(np.int8))
    dead = np.full((1, 1, 1, 3), -np.inf)              # every key masked: the sink takes it all, the row is 0
    np.testing.assert_array_equal(sink_softmax(dead, np.zeros((1, 1, 1, 1)), np.exp), np.zeros((1, 1, 1, 3)))


def test_a_sink_column_before_the_scores_is_left_alone():
    """Only trailing sink columns are taken: with the sink first, the Concat stays, and the quantizer refuses the
    runtime mask feeding it as before (the lab applies a mask inside the one Softmax it feeds)."""
    graph = import_onnx(_sinks(sink_first=True))
    assert "sink" not in next(n for n in graph.nodes if n.op == "Softmax").attrs
    with pytest.raises(QuantizationError, match="feeds Concat_zc \\(Concat\\)"):
        quantize(graph, {"input_ids": _ids(), "attention_mask": _padding_mask()})


def test_the_max_shift_before_a_masked_softmax_goes(tmp_path):
    """MiMo's first layers: ``Softmax(z - ReduceMax(z))`` after a runtime mask is the Softmax of ``z``."""
    mask_nodes, inits = _additive(-10000.0)
    mask_nodes[-1] = node("Add", ["s", "bias"], ["zm"], name="mask_add")
    mask_nodes += [node("ReduceMax", ["zm"], ["peak"], axes=[-1], keepdims=1), node("Sub", ["zm", "peak"], ["z"])]
    model = _block(mask_nodes, extra_inits=inits)
    graph = import_onnx(model)
    assert not {"ReduceMax", "Sub"} & {n.op for n in graph.nodes}
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    assert _cosine(_fsim(_compile(model, tmp_path, feeds), feeds).outputs["y"], want) > 0.99
