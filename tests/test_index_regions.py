"""Embedding indices computed from token ids (compiler/frontend/indices.py, the IndexFn node): RoBERTa's position ids
and a token-type buffer gathered by them, built with onnx.helper, against ONNX Runtime and on fsim; the refusals."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.indices import IndexRegionError
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.ir import GraphError
from vta.config import VTAConfig

B, T, D, V, PAD = 2, 8, 16, 20, 1
node = helper.make_node


def _roberta_embeddings(extra=()):
    """RoBERTa's embeddings: words, positions ``cumsum(ids != PAD) * (ids != PAD) + PAD`` and token types gathered
    from a zero buffer by the positions, summed, then a linear layer to ``y``."""
    rng = np.random.default_rng(0)
    inits = {"words": rng.standard_normal((V, D)).astype(np.float32),
             "positions": rng.standard_normal((T + PAD + 1, D)).astype(np.float32),
             "types": rng.standard_normal((2, D)).astype(np.float32),
             "pad": np.array(PAD, np.int64), "axis": np.array(1, np.int64),
             "buffer": np.zeros((B, T + PAD + 1), np.int64),
             "w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("Equal", ["input_ids", "pad"], ["is_pad"]), node("Not", ["is_pad"], ["keep"]),
             node("Cast", ["keep"], ["keep_i"], to=TensorProto.INT32),
             node("CumSum", ["keep_i", "axis"], ["count"]), node("Mul", ["count", "keep_i"], ["masked"]),
             node("Cast", ["masked"], ["masked64"], to=TensorProto.INT64),
             node("Add", ["masked64", "pad"], ["position_ids"]),
             node("GatherElements", ["buffer", "position_ids"], ["type_ids"], axis=1),
             node("Gather", ["words", "input_ids"], ["e_w"]), node("Gather", ["positions", "position_ids"], ["e_p"]),
             node("Gather", ["types", "type_ids"], ["e_t"]), node("Add", ["e_w", "e_p"], ["e_wp"]),
             node("Add", ["e_wp", "e_t"], ["e"]), *extra, node("MatMul", ["e", "w"], ["y"])]
    graph = helper.make_graph(nodes, "roberta", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _ids():
    ids = np.random.default_rng(3).integers(2, V, (B, T)).astype(np.int64)
    ids[1, -3:] = PAD                                          # a padded row: its positions stay at PAD
    return ids


def _ids_model(nodes, inits, name, opset=17):
    """A model of ``nodes`` from the int64 input ``input_ids [B, T]`` to ``y [B, T, D]``, ``inits`` its constants."""
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def _runs_on_fsim(model, ids, path):
    """``model`` saved at ``path``, compiled calibrated on ``ids`` (every layer it can on the accelerator) and run on
    fsim: the output equals the integer reference's."""
    from vta.compiler.pipeline import CalibrationSet, check_inputs, compile_model
    from vta.compiler.runtime.executor import run
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet({"input_ids": np.concatenate([ids, ids])},
                                                        {"source": "test", "samples": 2}))
    feeds = check_inputs(compiled.graph, {"input_ids": ids})
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, feeds)["y"])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))


def test_position_ids_from_token_ids_import_as_index_fns_and_run_on_fsim(tmp_path):
    from vta.compiler.pipeline import CalibrationSet, check_inputs, compile_model
    from vta.compiler.runtime.executor import run
    model = _roberta_embeddings()
    graph = import_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert ops.count("IndexFn") == 2 and ops.count("Embedding") == 3
    assert not {"Equal", "Not", "CumSum", "GatherElements"} & set(ops)
    assert graph.tensors["position_ids"].dtype == "int64"
    ids = _ids()
    positions = run_float(graph, {"input_ids": ids}, keep_all=True)["position_ids"]
    np.testing.assert_array_equal(positions[1], [2, 3, 4, 5, 6, 1, 1, 1])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(run_float(graph, {"input_ids": ids})["y"], want, atol=1e-5)

    path = tmp_path / "roberta.onnx"
    onnx.save(model, str(path))
    calib = {"input_ids": np.concatenate([ids, ids])}
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet(calib, {"source": "test", "samples": 2}))
    feeds = check_inputs(compiled.graph, {"input_ids": ids})
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, feeds)["y"])
    got = out.outputs["y"].astype(np.float64)
    assert float(got.ravel() @ want.ravel() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


def test_computed_ids_outside_the_table_are_a_value_error():
    graph = import_onnx(_roberta_embeddings())
    small = graph.copy()
    small.constants["positions"] = small.constants["positions"][:4]
    with pytest.raises(ValueError, match=r"ids from 1 to 9, outside its table's rows -4 to 3 \(a negative id counts "
                                         r"from the end\)"):
        run_float(small, {"input_ids": _ids()})


def test_a_negative_computed_id_counts_from_the_tables_end_as_onnx_gather_does():
    """LayoutLM's box widths ``x1 - x0`` index a table; a negative one reads from its end, in onnxruntime as here."""
    from vta.compiler.qops import embed
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.testing.assert_array_equal(embed(np.array([[-1, 0, -6]]), table), table[[[5, 0, 0]]])


def test_token_ids_meeting_an_activation_are_refused():
    extra = [node("Cast", ["keep"], ["keep_f"], to=TensorProto.FLOAT), node("Unsqueeze", ["keep_f", "last"], ["k3"]),
             node("Mul", ["e0", "k3"], ["e"])]
    model = _roberta_embeddings(extra)
    for n in model.graph.node:
        if n.op_type == "Add" and list(n.output) == ["e"]:
            n.output[0] = "e0"
    model.graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), "last"))
    with pytest.raises(IndexRegionError, match=r"token ids 'input_ids' reach node .*\(Mul\) together with an "
                                               r"activation"):
        import_onnx(model)


def test_index_arithmetic_that_fails_on_its_ids_is_a_value_error():
    """The region's evaluator failing on the ids it is given (here ids of another rank: CumSum's axis 1 is gone) is a
    ValueError naming the computed indices, not a traceback of the evaluator."""
    from vta.compiler.qops_index import run_index_fn
    graph = import_onnx(_roberta_embeddings())
    types = next(n for n in graph.nodes if n.op == "IndexFn" and n.outputs == ["type_ids"])
    with pytest.raises(ValueError, match="the indices computed from the token ids failed on these ids"):
        run_index_fn(types.attrs["onnx"], np.full((T,), 2, np.int64))


def _ids_masked_attention():
    """Word embeddings, then single-head attention masked by ``ids != PAD`` computed in the graph (no
    attention_mask input): ``Where(Unsqueeze(Not(Equal(ids, PAD))), 0, -inf)`` added to the scores."""
    rng = np.random.default_rng(0)
    inits = {"words": rng.standard_normal((V, D)).astype(np.float32), "pad": np.array(PAD, np.int64),
             "ax1": np.array([1], np.int64), "zero": np.array(0.0, np.float32),
             "ninf": np.array(-np.inf, np.float32),
             "wq": (rng.standard_normal((D, D)) * 0.3).astype(np.float32),
             "wk": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("Gather", ["words", "input_ids"], ["e"]), node("MatMul", ["e", "wq"], ["q"]),
             node("MatMul", ["e", "wk"], ["k"]), node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             node("MatMul", ["q", "kt"], ["s"]),
             node("Equal", ["input_ids", "pad"], ["is_pad"]), node("Not", ["is_pad"], ["keep"]),
             node("Unsqueeze", ["keep", "ax1"], ["keep3"]), node("Where", ["keep3", "zero", "ninf"], ["bias"]),
             node("Add", ["s", "bias"], ["sm"]), node("Softmax", ["sm"], ["p"], axis=-1),
             node("MatMul", ["p", "e"], ["y"])]
    graph = helper.make_graph(nodes, "ids_mask",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_a_mask_computed_from_the_token_ids_masks_the_attention(tmp_path):
    """``ids != PAD`` is cut after the comparison: an IndexFn computes it from the ids, and the attention reads it
    as a runtime mask (compiler/frontend/id_masks.py). Against onnxruntime, and bit-exact on fsim."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    model = _ids_masked_attention()
    graph = import_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert "IndexFn" in ops and "KeyMask" in ops
    ids = _ids()
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(run_float(graph, {"input_ids": ids})["y"], want, atol=1e-5, rtol=1e-4)
    unmasked = ids.copy()
    unmasked[unmasked == PAD] = 2
    assert not np.allclose(run_float(graph, {"input_ids": unmasked})["y"][1], want[1], atol=1e-3)  # it masks
    path = tmp_path / "ids_mask.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2,
                             calibration=CalibrationSet({"input_ids": np.concatenate([ids, _ids()])}, {"source": "t"}))
    got = run(compiled, {"input_ids": ids}, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, {"input_ids": ids})["y"])


def test_positions_computed_from_the_attention_mask(tmp_path):
    """OPT's learned positions: ``(cumsum(mask, 1) * mask) - 1 + 2`` index a position table, and the same mask
    masks the attention (additively). The positions run as an IndexFn of the mask input; against onnxruntime and
    bit-exact on fsim."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    rng = np.random.default_rng(0)
    inits = {"words": rng.standard_normal((V, D)).astype(np.float32),
             "positions": rng.standard_normal((T + 2, D)).astype(np.float32), "axis": np.array(1, np.int64),
             "one": np.array(1, np.int64), "two": np.array(2, np.int64), "ax1": np.array([1], np.int64),
             "onef": np.array(1.0, np.float32), "big": np.array(-10000.0, np.float32),
             "wq": (rng.standard_normal((D, D)) * 0.3).astype(np.float32),
             "wk": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("CumSum", ["attention_mask", "axis"], ["count"]),
             node("Mul", ["count", "attention_mask"], ["kept"]),
             node("Sub", ["kept", "one"], ["pos0"]), node("Add", ["pos0", "two"], ["pos"]),
             node("Gather", ["words", "input_ids"], ["e_w"]), node("Gather", ["positions", "pos"], ["e_p"]),
             node("Add", ["e_w", "e_p"], ["e"]), node("MatMul", ["e", "wq"], ["q"]),
             node("MatMul", ["e", "wk"], ["k"]),
             node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), node("MatMul", ["q", "kt"], ["s"]),
             node("Unsqueeze", ["attention_mask", "ax1"], ["m3"]), node("Cast", ["m3"], ["mf"], to=TensorProto.FLOAT),
             node("Sub", ["onef", "mf"], ["inv"]), node("Mul", ["inv", "big"], ["bias"]),
             node("Add", ["s", "bias"], ["sm"]), node("Softmax", ["sm"], ["p"], axis=-1),
             node("MatMul", ["p", "e"], ["y"])]
    graph = helper.make_graph(nodes, "opt",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, T]),
                               helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [B, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    imported = import_onnx(model)
    ops = [n.op for n in imported.nodes]
    assert ops.count("IndexFn") == 1 and "KeyMask" in ops and ops.count("Embedding") == 2
    mask = np.ones((B, T), np.int64)
    mask[1, -3:] = 0
    feeds = {"input_ids": _ids(), "attention_mask": mask}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(imported, feeds)["y"], want, atol=1e-5, rtol=1e-4)
    path = tmp_path / "opt.onnx"
    onnx.save(model, str(path))
    calib = {"input_ids": np.concatenate([_ids(), _ids()]), "attention_mask": np.concatenate([mask, mask])}
    compiled = compile_model(str(path), VTAConfig(), calib=2, calibration=CalibrationSet(calib, {"source": "t"}))
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])


def test_token_ids_that_reach_their_table_only_through_index_arithmetic(tmp_path):
    """EmbeddingGemma's lookup: ``Gather(words, Where(Equal(ids, a) | Equal(ids, b), 0, ids))``: no table reads the
    ids directly, yet they are token ids (an IndexFn computes the lookup's indices), not a mask; the compiled model
    draws random ids inside the table and runs on fsim bit-exact with the integer reference."""
    from vta.compiler.pipeline import token_range
    rng = np.random.default_rng(0)
    inits = {"words": rng.standard_normal((V, D)).astype(np.float32), "a": np.array(3, np.int64),
             "b": np.array(5, np.int64), "zero": np.array(0, np.int64),
             "w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("Equal", ["input_ids", "a"], ["is_a"]), node("Equal", ["input_ids", "b"], ["is_b"]),
             node("Or", ["is_a", "is_b"], ["special"]), node("Where", ["special", "zero", "input_ids"], ["ids"]),
             node("Gather", ["words", "ids"], ["e"]), node("MatMul", ["e", "w"], ["y"])]
    model = _ids_model(nodes, inits, "gemma")
    imported = import_onnx(model)
    assert [n.op for n in imported.nodes][:2] == ["IndexFn", "Embedding"]
    assert token_range(imported, "input_ids") == V
    ids = _ids()
    ids[0, :2] = [3, 5]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(run_float(imported, {"input_ids": ids})["y"], want, atol=1e-5)
    from vta.compiler.frontend.calibration import CalibrationError, load_calibration
    np.savez(tmp_path / "cal.npz", input_ids=np.concatenate([ids, ids]))      # a --calibration file of these ids
    assert load_calibration(tmp_path / "cal.npz", imported)["input_ids"].shape == (2 * B, T)
    np.savez(tmp_path / "far.npz", input_ids=np.full((B, T), V, np.int64))
    with pytest.raises(CalibrationError, match=rf"token ids, integers in \[0, {V - 1}\]"):
        load_calibration(tmp_path / "far.npz", imported)
    _runs_on_fsim(model, ids, tmp_path / "gemma.onnx")


def test_decoder_ids_shifted_from_the_token_ids_with_scatter_and_reduce(tmp_path):
    """FSMT's ``shift_tokens_right``: the last real token of each row (its index a ReduceSum of the non-pad flags,
    minus one; a GatherElements) put first and the rest shifted right (Concat, Slice), then a start token written at
    column 0 (ScatterND), all read by an embedding table: one index region, against onnxruntime and on fsim."""
    rng = np.random.default_rng(0)
    inits = {"words": rng.standard_normal((V, D)).astype(np.float32), "pad": np.array(PAD, np.int64),
             "one": np.array(1, np.int64), "axes": np.array([1], np.int64), "zero1": np.array([0], np.int64),
             "minus1": np.array([-1], np.int64), "where": np.array([[b, 0] for b in range(B)], np.int64),
             "start": np.full(B, 2, np.int64), "w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("Equal", ["input_ids", "pad"], ["is_pad"]), node("Not", ["is_pad"], ["keep"]),
             node("Cast", ["keep"], ["keep64"], to=TensorProto.INT64),
             node("ReduceSum", ["keep64", "axes"], ["count"], keepdims=1), node("Sub", ["count", "one"], ["last"]),
             node("GatherElements", ["input_ids", "last"], ["eos"], axis=1),
             node("Slice", ["input_ids", "zero1", "minus1", "axes"], ["head"]),
             node("Concat", ["eos", "head"], ["shifted"], axis=1),
             node("ScatterND", ["shifted", "where", "start"], ["decoder_ids"]),
             node("Gather", ["words", "decoder_ids"], ["e"]), node("MatMul", ["e", "w"], ["y"])]
    model = _ids_model(nodes, inits, "shift")
    imported = import_onnx(model)
    assert [n.op for n in imported.nodes][:2] == ["IndexFn", "Embedding"]
    ids = _ids()
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(run_float(imported, {"input_ids": ids})["y"], want, atol=1e-5)
    _runs_on_fsim(model, ids, tmp_path / "shift.onnx")


def test_ids_that_reach_a_table_through_an_op_outside_the_index_arithmetic_name_it():
    """``words[max(ids) - ids]``: the refusal names the ReduceMax. The position-table import
    (frontend/position_tables.py) took this input once, its random check samples all having the same row maxima,
    and the run then refused valid ids above the table's 8 rows."""
    rng = np.random.default_rng(0)
    inits = {"words": rng.standard_normal((V, D)).astype(np.float32), "axes": np.array([1], np.int64),
             "w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("ReduceMax", ["input_ids", "axes"], ["top"], name="top", keepdims=1),
             node("Sub", ["top", "input_ids"], ["ids"], name="below"),
             node("Gather", ["words", "ids"], ["e"]), node("MatMul", ["e", "w"], ["y"])]
    model = _ids_model(nodes, inits, "flip", opset=18)
    with pytest.raises(GraphError, match=r"It reaches a table lookup, but node 'top' \(ReduceMax\) computes with "
                                        r"it, an op the index arithmetic does not include"):
        import_onnx(model)


def _eos_pooled(form="eos"):
    """A pooling at a row computed from the ids, then a linear layer to ``y [B, D]``: the hidden states ``[B, T, D]``
    flattened to rows, and one row per sequence taken at ``position + b * T`` (a Gather of an activation at rows
    known only at run time). ``eos``: CLIP's end-of-text token, ``argmax(ids == eos)``; ``last``: a decoder's
    sequence-classification head, the last token that is not padding, ``argmax(arange(T) * (ids != pad))``."""
    rng = np.random.default_rng(4)
    inits = {"words": rng.standard_normal((V, D)).astype(np.float32),
             "w": (rng.standard_normal((D, D)) * 0.3).astype(np.float32),
             "eos": np.array(V - 1, np.int64), "pad": np.array(PAD, np.int64),
             "steps": np.arange(T, dtype=np.int32), "offsets": (np.arange(B) * T).astype(np.int64)}
    if form == "eos":
        position = [node("Equal", ["input_ids", "eos"], ["is_eos"]),
                    node("Cast", ["is_eos"], ["score"], to=TensorProto.INT32)]
    else:
        position = [node("Equal", ["input_ids", "pad"], ["is_pad"]), node("Not", ["is_pad"], ["kept"]),
                    node("Cast", ["kept"], ["kept_i"], to=TensorProto.INT32),
                    node("Mul", ["kept_i", "steps"], ["score"])]
    nodes = [node("Gather", ["words", "input_ids"], ["e"]), node("MatMul", ["e", "w"], ["h"]),
             node("Reshape", ["h", "flat"], ["rows"]), *position,
             node("ArgMax", ["score"], ["at"], axis=-1, keepdims=0), node("Add", ["at", "offsets"], ["row"]),
             node("Gather", ["rows", "row"], ["pooled"], axis=0), node("MatMul", ["pooled", "w"], ["y"])]
    inits["flat"] = np.array([B * T, D], np.int64)
    graph = helper.make_graph(nodes, "clip", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, D])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("form", ["eos", "last"])
def test_rows_of_an_activation_taken_at_positions_computed_from_the_ids(form, tmp_path):
    """CLIP's end-of-text pooling and a decoder's classification head (the last token that is not padding): the
    ids' region (Equal, Not, Cast, Mul, ArgMax, Add) is an IndexFn, not a mask, and the Gather of the hidden rows by
    it a GatherAt; against onnxruntime, and on fsim bit-exact with the integer reference."""
    from vta.compiler.pipeline import CalibrationSet, check_inputs, compile_model
    from vta.compiler.runtime.executor import run
    ids = _ids()                                               # row 1 ends in padding
    ids[0, 5], ids[1, 2] = V - 1, V - 1                       # each row's end-of-text token
    model = _eos_pooled(form)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids})[0]
    graph = import_onnx(model)
    assert "GatherAt" in [n.op for n in graph.nodes]
    np.testing.assert_allclose(run_float(graph, {"input_ids": ids})["y"], want, atol=1e-5, rtol=1e-5)
    path = tmp_path / "clip.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet({"input_ids": np.concatenate([ids, ids])},
                                                        {"source": "test", "samples": 2}))
    feeds = check_inputs(compiled.graph, {"input_ids": ids})
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


def test_rows_taken_outside_the_activation_are_a_clear_error():
    x = np.zeros((4, 3), np.int8)
    with pytest.raises(ValueError, match=r"indices computed at run time reach 2\.\.4, outside the 4 entries"):
        qops.gather_at(x, np.array([2, 4]), 0)
    np.testing.assert_array_equal(qops.gather_at(x + 1, np.array([-1]), 0), np.ones((1, 3), np.int8))
