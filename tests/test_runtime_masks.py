"""Runtime attention masks (compiler/frontend/masks.py, the KeyMask node, its fusion into the Softmax by
compiler/frontend/quantize.py, compiler/qops.py's masked softmax, compiler/pipeline.py's mask inputs): tiny
transformer blocks built with onnx.helper (batch 2, 8 tokens, width 16, 2 heads, vocabulary 20) whose int64, bool
or 3-D ``attention_mask`` input reaches the scores through an Add or a Where, against ONNX Runtime, the integer
reference and fsim; the refusals; token ids through a Reshape; the NaN guard after a masked softmax."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.masks import MaskError
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.config import VTAConfig

B, T, D, H, V = 2, 8, 16, 2, 20
FLOAT_MIN = float(np.finfo(np.float32).min)                          # -3.4028235e38
node = helper.make_node


def _ids(seed=1):
    return np.random.default_rng(seed).integers(0, V, (B, T)).astype(np.int64)


def _padding_mask(dtype=np.int64):
    """Batch row 0 all kept, row 1 its last 3 keys masked out."""
    mask = np.ones((B, T), dtype)
    mask[1, -3:] = 0
    return mask


def _block(mask_nodes, *, mask_type=TensorProto.INT64, mask_shape=(B, T), extra_inits=(), ids_nodes=None,
           after_softmax=None, scores_cast=False, check=True, layers=1):
    """An HF-BERT-style attention block: an embedding Gather of ``input_ids``, Q/K/V projections, scores ``s``
    (QK^T times 1/sqrt(8)), the mask ``mask_nodes`` making ``z`` from ``s`` and ``attention_mask``, Softmax ``p``
    (``after_softmax`` nodes making ``pg`` from ``p`` when given), P.V and the output projection to ``y``. With
    ``layers`` > 1, more such layers (their tensors suffixed ``_1``, ...) read one mask region, as Hugging Face's
    encoders do: each repeats only the mask nodes that read ``s``."""
    rng = np.random.default_rng(0)

    def w(*shape, spread=0.3):
        return (rng.standard_normal(shape) * spread).astype(np.float32)

    inits = {"table": w(V, D, spread=1.0), "heads": np.array([B, T, H, D // H], np.int64),
             "flat": np.array([B, T, D], np.int64), "scale": np.array(1 / np.sqrt(D // H), np.float32),
             **dict(extra_inits)}
    nodes = list(ids_nodes or [node("Gather", ["table", "input_ids"], ["h"], name="embed")])
    for layer in range(layers):
        sfx = "" if layer == 0 else f"_{layer}"

        def t(name, sfx=sfx):
            return name + sfx

        inits.update({t(f"w{r}"): w(D, D) for r in "qkvo"})
        inits.update({t(f"b{r}"): w(D, spread=0.1) for r in "qkvo"})
        for r in "qkv":
            nodes += [node("MatMul", [t("h"), t(f"w{r}")], [t(f"{r}0")]),
                      node("Add", [t(f"{r}0"), t(f"b{r}")], [t(f"{r}1")]),
                      node("Reshape", [t(f"{r}1"), "heads"], [t(f"{r}2")])]
        nodes += [node("Transpose", [t("q2")], [t("q")], perm=[0, 2, 1, 3]),
                  node("Transpose", [t("k2")], [t("kt")], perm=[0, 2, 3, 1]),
                  node("Transpose", [t("v2")], [t("v")], perm=[0, 2, 1, 3]),
                  node("MatMul", [t("q"), t("kt")], [t("s0")]),
                  node("Mul", [t("s0"), "scale"], [t("s1") if scores_cast else t("s")])]
        if scores_cast:
            nodes.append(node("Cast", [t("s1")], [t("s")], to=TensorProto.FLOAT))
        if layer == 0:
            nodes += mask_nodes
        else:
            for exit_node in (n for n in mask_nodes if "s" in n.input):
                copy = onnx.NodeProto()
                copy.CopyFrom(exit_node)
                copy.name = t(exit_node.name) if exit_node.name else ""
                copy.input[:] = [t(i) if i == "s" else i for i in copy.input]
                copy.output[:] = [t(o) for o in copy.output]
                nodes.append(copy)
        nodes.append(node("Softmax", [t("z")], [t("p")], axis=-1, name=t("softmax")))
        if after_softmax:
            nodes += after_softmax
        nodes += [node("MatMul", [t("pg") if after_softmax else t("p"), t("v")], [t("c0")]),
                  node("Transpose", [t("c0")], [t("c1")], perm=[0, 2, 1, 3]),
                  node("Reshape", [t("c1"), "flat"], [t("c")]),
                  node("MatMul", [t("c"), t("wo")], [t("o0")]),
                  node("Add", [t("o0"), t("bo")], ["y" if layer == layers - 1 else f"h_{layer + 1}"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [B, T]),
                                               helper.make_tensor_value_info("attention_mask", mask_type,
                                                                             list(mask_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, T, D])],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    if check:                                                  # (not for a file with an op of the lab's own)
        onnx.checker.check_model(model, full_check=True)
    return model


def _additive(fill, axes=(1, 2)):
    """HF BERT's extended mask: ``s + (1 - Cast(Unsqueeze(mask))) * fill``."""
    return ([node("Unsqueeze", ["attention_mask", "axes"], ["m1"]), node("Cast", ["m1"], ["mf"], to=TensorProto.FLOAT),
             node("Sub", ["one", "mf"], ["inv"]), node("Mul", ["inv", "fill"], ["bias"]),
             node("Add", ["s", "bias"], ["z"], name="mask_add")],
            [("axes", np.array(axes, np.int64)), ("one", np.array(1.0, np.float32)),
             ("fill", np.array(fill, np.float32))])


def _bool_where(form):
    """``Where(Not(m), -inf, s)`` or ``Where(m, s, -inf)`` on a bool mask."""
    unsq = node("Unsqueeze", ["attention_mask", "axes"], ["m1"])
    inits = [("axes", np.array([1, 2], np.int64)), ("ninf", np.array(-np.inf, np.float32))]
    if form == "not":
        return [unsq, node("Not", ["m1"], ["pad"]),
                node("Where", ["pad", "ninf", "s"], ["z"], name="mask_where")], inits
    return [unsq, node("Where", ["m1", "s", "ninf"], ["z"], name="mask_where")], inits


def _ops(graph):
    return [n.op for n in graph.nodes]


def _cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _compile(model, tmp_path, feeds):
    """``model`` compiled for the default config with every linear layer on the accelerator, calibrated on
    ``feeds`` (twice, as two samples)."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path))
    calib = {k: np.concatenate([v, v]) for k, v in feeds.items()}
    return compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                         calibration=CalibrationSet(calib, {"source": "test", "samples": 2}))


def _fsim(compiled, feeds):
    """fsim's ``y`` for ``feeds`` (checked by check_inputs), bit-exact with the integer reference."""
    from vta.compiler.pipeline import check_inputs
    from vta.compiler.runtime.executor import run
    checked = check_inputs(compiled.graph, feeds)
    out = run(compiled, checked, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, checked)["y"])
    return out


def check_masked_block(model, graph, tmp_path):
    """``model`` (a :func:`_block`) imported as ``graph`` computes what onnxruntime does in float; compiled, it runs on
    fsim bit-exact with the integer reference, close to onnxruntime, and the mask is live (batch row 1 changes
    without it)."""
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    compiled = _compile(model, tmp_path, feeds)
    got = _fsim(compiled, feeds).outputs["y"]
    assert _cosine(got, want) > 0.99
    unmasked = {"input_ids": feeds["input_ids"], "attention_mask": np.ones((B, T), np.int64)}
    assert not np.array_equal(_fsim(compiled, unmasked).outputs["y"][1], got[1])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))


# ---- an HF BERT-style block end to end ---------------------------------------------------------------------------
@pytest.mark.parametrize("fill, scores_cast", [(-10000.0, False), (FLOAT_MIN, True)])
def test_bert_block_with_an_int64_mask_on_fsim(fill, scores_cast, tmp_path):
    """Two layers reading one mask region: one KeyMask per layer and an int64 mask input; on fsim bit-exact with
    the integer reference, every linear layer and both attention products on the accelerator, close to ONNX
    Runtime; a masked key's token changes nothing in the kept queries of its batch row. (The float-min variant
    also casts the scores to FLOAT, an identity.)"""
    from vta.compiler.runtime.compiled import AccelStep
    mask_nodes, inits = _additive(fill)
    model = _block(mask_nodes, extra_inits=inits, scores_cast=scores_cast, layers=2)
    graph = import_onnx(model)
    assert _ops(graph).count("KeyMask") == 2 and "Cast" not in _ops(graph)
    assert all(n.inputs[1] == "attention_mask" for n in graph.nodes if n.op == "KeyMask")
    assert {name: graph.tensors[name].dtype for name in graph.inputs} == {"input_ids": "int64",
                                                                           "attention_mask": "int64"}
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)

    compiled = _compile(model, tmp_path, feeds)
    softmaxes = [n for n in compiled.graph.nodes if n.op == "QSoftmax"]
    assert len(softmaxes) == 2 and "KeyMask" not in _ops(compiled.graph)
    for softmax in softmaxes:
        assert softmax.inputs[1] == "attention_mask"
        assert {"key_expand", "key_sel", "key_add", "key_fill"} <= set(softmax.attrs)
        assert tuple(softmax.attrs["key_expand"]) == (2, 1, 1, 8)
    linear = [s for s in compiled.steps if s.node.op in ("QConv2d", "QDense", "QMatMul")]
    assert len(linear) == 12 and all(isinstance(s, AccelStep) for s in linear)    # per layer 4 linear, 2 products
    out = _fsim(compiled, feeds)
    assert sum(layer.where == "accel" for layer in out.layers) == 12
    got = out.outputs["y"]
    assert _cosine(got, want) > 0.99 and np.abs(got - want).max() < 0.1 * np.abs(want).max()

    unmasked = {"input_ids": feeds["input_ids"], "attention_mask": np.ones((B, T), np.int64)}
    assert not np.array_equal(_fsim(compiled, unmasked).outputs["y"][1], got[1])       # the mask is live
    changed = dict(feeds, input_ids=feeds["input_ids"].copy())
    changed["input_ids"][1, -1] = (changed["input_ids"][1, -1] + 1) % V                # a masked key's token
    again = _fsim(compiled, changed).outputs["y"]
    np.testing.assert_array_equal(again[0], got[0])
    np.testing.assert_array_equal(again[1, :T - 3], got[1, :T - 3])


@pytest.mark.parametrize("form", ["not", "where"])
def test_bool_mask_where_matches_the_additive_form_on_fsim(form, tmp_path):
    nodes, inits = _bool_where(form)
    model = _block(nodes, mask_type=TensorProto.BOOL, extra_inits=inits)
    graph = import_onnx(model)
    assert _ops(graph).count("KeyMask") == 1 and "Where" not in _ops(graph) and "Not" not in _ops(graph)
    assert graph.tensors["attention_mask"].dtype == "int64"
    ids, mask = _ids(), _padding_mask()
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids,
                                                                      "attention_mask": mask.astype(bool)})[0]
    np.testing.assert_allclose(run_float(graph, {"input_ids": ids, "attention_mask": mask})["y"], want, atol=1e-5)

    additive_nodes, additive_inits = _additive(-10000.0)
    (additive_dir := tmp_path / "additive").mkdir()
    (bool_dir := tmp_path / "bool").mkdir()
    feeds = {"input_ids": ids, "attention_mask": mask}
    additive = _fsim(_compile(_block(additive_nodes, extra_inits=additive_inits), additive_dir, feeds), feeds)
    masked = _fsim(_compile(model, bool_dir, feeds), {"input_ids": ids, "attention_mask": mask.astype(bool)})
    np.testing.assert_array_equal(masked.outputs["y"], additive.outputs["y"])


def test_a_3d_mask_expands_over_heads(tmp_path):
    """A mask [batch, queries, keys]: KeyMask's expand (2, 1, 8, 8); right in float; compiled on the default random
    calibration (a padding mask per batch row) and run on fsim bit-exact and close to ONNX Runtime."""
    from vta.compiler.pipeline import compile_model
    nodes, inits = _additive(-10000.0, axes=(1,))
    model = _block(nodes, mask_shape=(B, T, T), extra_inits=inits)
    graph = import_onnx(model)
    keymask = next(n for n in graph.nodes if n.op == "KeyMask")
    assert tuple(keymask.attrs["expand"]) == (2, 1, 8, 8) and keymask.inputs[1] == "attention_mask"
    mask = np.broadcast_to(_padding_mask()[:, None, :], (B, T, T)).copy()
    mask[0, 2, 5] = 0                                          # one query of row 0 does not see one key
    feeds = {"input_ids": _ids(), "attention_mask": mask}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    onnx.save(model, str(tmp_path / "mask3d.onnx"))
    compiled = compile_model(str(tmp_path / "mask3d.onnx"), VTAConfig(), calib=2, policy="accel")
    assert compiled.meta["calibration"]["source"] == "random normal"
    assert _cosine(_fsim(compiled, feeds).outputs["y"], want) > 0.99


def _causal_nodes(order):
    """GPT-2: ``Where(causal, s, float min)`` and the runtime additive mask, in ``order``."""
    add, inits = _additive(-10000.0)
    first = order == "where_first"
    add[-1] = node("Add", ["sc" if first else "s", "bias"], ["z" if first else "sa"], name="mask_add")
    where = node("Where", ["causal", "s" if first else "sa", "fmin"], ["sc" if first else "z"], name="causal_where")
    inits += [("causal", np.tril(np.ones((1, 1, T, T), bool))), ("fmin", np.array(FLOAT_MIN, np.float32))]
    return add[:-1] + ([where, add[-1]] if first else [add[-1], where]), inits


def test_a_causal_where_and_a_runtime_mask_fuse_into_one_softmax():
    from vta.compiler.frontend.quantize import quantize
    nodes, inits = _causal_nodes("where_first")
    model = _block(nodes, extra_inits=inits)
    graph = import_onnx(model)
    assert _ops(graph).count("KeyMask") == 1 and _ops(graph).count("Where") == 1
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    qgraph = quantize(graph, feeds)
    softmax = next(n for n in qgraph.nodes if n.op == "QSoftmax")
    assert {"keep", "fill", "key_expand", "key_sel", "key_add", "key_fill"} <= set(softmax.attrs)
    assert softmax.inputs[1] == "attention_mask" and qgraph.producer(softmax.inputs[0]).op == "QMul"
    assert "Where" not in _ops(qgraph) and "KeyMask" not in _ops(qgraph)
    np.testing.assert_array_equal(softmax.attrs["keep"], np.tril(np.ones((1, 1, T, T), bool)))
    got = qops.run_reference(qgraph, feeds)["y"]
    assert _cosine(got, want) > 0.99


def test_probabilities_filled_with_0_where_their_scores_were_filled_with_minus_inf(tmp_path):
    """CPM-Ant's and DeBERTa's ``Where(c, 0, Softmax(Where(c, -inf, s)))``: the second fill, by the same condition,
    changes nothing the lab's softmax does not give already (0 there, 0 for a row masked out whole): it goes."""
    nodes, inits = _bool_where("not")
    model = _block(nodes, mask_type=TensorProto.BOOL, extra_inits=[*inits, ("zero", np.array(0.0, np.float32))],
                   after_softmax=[node("Where", ["pad", "zero", "p"], ["pg"], name="probs_fill")])
    graph = import_onnx(model)
    assert "Where" not in _ops(graph) and _ops(graph).count("KeyMask") == 1
    ids, mask = _ids(), _padding_mask()
    mask[1] = 0                                                     # a batch row masked out whole
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids,
                                                                      "attention_mask": mask.astype(bool)})[0]
    np.testing.assert_allclose(run_float(graph, {"input_ids": ids, "attention_mask": mask})["y"], want, atol=1e-5)
    compiled = _compile(model, tmp_path, {"input_ids": ids, "attention_mask": _padding_mask()})
    assert _cosine(_fsim(compiled, {"input_ids": ids, "attention_mask": mask}).outputs["y"], want) > 0.99


@pytest.mark.parametrize("keepdims", [1, 0])
def test_a_log_sum_exp_of_the_masked_scores_beside_their_softmax(keepdims, tmp_path):
    """Granite's sliding-window attention gates its probabilities by ``Sigmoid(ReduceLogSumExp(z))`` of the masked
    scores ``z``: one runtime mask read by the Softmax and by the log-sum-exp, each applying it in float."""
    nodes, inits = _additive(-10000.0)
    gate = [node("ReduceLogSumExp", ["z"], ["lse"], axes=[-1], keepdims=keepdims)]
    if not keepdims:
        gate.append(node("Unsqueeze", ["lse", "last_axis"], ["lse_k"]))
    gate += [node("Sigmoid", ["lse_k" if not keepdims else "lse"], ["g"]), node("Mul", ["p", "g"], ["pg"])]
    model = _block(nodes, extra_inits=[*inits, ("last_axis", np.array([-1], np.int64))], after_softmax=gate)
    graph = import_onnx(model)
    reduce_node = next(n for n in graph.nodes if n.op == "Reduce")
    assert reduce_node.attrs["kind"] == "log_sum_exp" and reduce_node.inputs == ["z"]
    check_masked_block(model, graph, tmp_path)
    compiled = _compile(model, tmp_path, {"input_ids": _ids(), "attention_mask": _padding_mask()})
    q = next(n for n in compiled.graph.nodes if n.op == "QReduce")
    assert q.inputs[1] == "attention_mask" and "key_fill" in q.attrs
    from vta.compiler.frontend.masks import is_mask_input
    from vta.compiler.pipeline import random_inputs
    assert is_mask_input(compiled.graph, "attention_mask")   # random inputs draw it as a mask, not as floats
    assert np.isin(random_inputs(compiled.graph, 0)["attention_mask"], (0, 1)).all()


def test_a_constant_where_after_the_runtime_mask_is_refused_by_the_quantizer():
    """The other order (the runtime Add, then the causal Where): imported and right in float, but the quantizer
    fuses a runtime mask only into the Softmax it feeds directly."""
    from vta.compiler.frontend.quantize import QuantizationError, quantize
    nodes, inits = _causal_nodes("add_first")
    model = _block(nodes, extra_inits=inits)
    graph = import_onnx(model)
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    with pytest.raises(QuantizationError, match=r"runtime mask 'mask_add' .* feeds causal_where \(Where\)"):
        quantize(graph, feeds)


def _mask_forms():
    """Other exporters' mask regions and the other element types (name -> nodes making ``z`` from ``s``,
    initializers, the mask's element type)."""
    axes = ("axes", np.array([1, 2], np.int64))
    one, big = ("one", np.array(1.0, np.float32)), ("big", np.array(-10000.0, np.float32))
    unsq = node("Unsqueeze", ["attention_mask", "axes"], ["m1"])
    table = ("table2", np.array([-10000.0, 0.0], np.float32))
    lookup = [node("Gather", ["table2", "attention_mask"], ["g"]), node("Unsqueeze", ["g", "axes"], ["bias"]),
              node("Add", ["s", "bias"], ["z"])]
    forms = {
        "sdpa_bool": ([unsq, node("Where", ["m1", "zero", "ninf"], ["bias"]), node("Add", ["s", "bias"], ["z"])],
                      [axes, ("zero", np.array(0.0, np.float32)), ("ninf", np.array(-np.inf, np.float32))],
                      TensorProto.BOOL),
        "sub_from_scores": ([unsq, node("Cast", ["m1"], ["mf"], to=TensorProto.FLOAT),
                             node("Sub", ["mf", "one"], ["inv"]), node("Mul", ["inv", "big"], ["bias"]),
                             node("Sub", ["s", "bias"], ["z"])],
                            [axes, one, ("big", np.array(10000.0, np.float32))], TensorProto.INT64),
        "expand": ([unsq, node("Expand", ["m1", "full"], ["m2"]), node("Cast", ["m2"], ["mf"], to=TensorProto.FLOAT),
                    node("Sub", ["one", "mf"], ["inv"]), node("Mul", ["inv", "big"], ["bias"]),
                    node("Add", ["s", "bias"], ["z"])],
                   [axes, one, big, ("full", np.array([B, H, T, T], np.int64))], TensorProto.INT64),
        "int32_table": (lookup, [axes, table], TensorProto.INT32),
        "int64_table": (lookup, [axes, table], TensorProto.INT64),
        "int64_table_after_unsqueeze": ([unsq, node("Gather", ["table2", "m1"], ["bias"]),
                                         node("Add", ["s", "bias"], ["z"])], [axes, table], TensorProto.INT64),
    }
    for kind in (TensorProto.INT32, TensorProto.UINT8, TensorProto.INT8):
        forms[f"additive_{TensorProto.DataType.Name(kind).lower()}"] = (*_additive(-10000.0), kind)
    return forms


MASK_DTYPES = {TensorProto.BOOL: np.bool_, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32,
               TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8}


@pytest.mark.parametrize("form", list(_mask_forms()))
def test_other_mask_forms_and_element_types(form):
    """Each form imports as one KeyMask of the scores and the mask input (the region gone: the same ops as the
    int64 additive form), agrees with ONNX Runtime in float, and its quantized graph, the mask fused into the
    QSoftmax, stays close."""
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import check_inputs
    nodes, inits, mask_type = _mask_forms()[form]
    model = _block(nodes, mask_type=mask_type, extra_inits=inits)
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask(MASK_DTYPES[mask_type])}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    graph = import_onnx(model)
    keymask = next(n for n in graph.nodes if n.op == "KeyMask")
    assert keymask.inputs == ["s", "attention_mask"] and graph.tensors["attention_mask"].dtype == "int64"
    assert _ops(graph) == _ops(import_onnx(_block(_additive(-10000.0)[0], extra_inits=_additive(-10000.0)[1])))
    checked = check_inputs(graph, feeds)
    np.testing.assert_allclose(run_float(graph, checked)["y"], want, atol=1e-5)
    qgraph = quantize(graph, checked)
    assert next(n for n in qgraph.nodes if n.op == "QSoftmax").inputs[1] == "attention_mask"
    assert _cosine(qops.run_reference(qgraph, checked)["y"], want) > 0.99


# ---- refusals ----------------------------------------------------------------------------------------------------
def test_a_mask_that_scales_hidden_states_is_refused():
    """A product by the mask imports (tests/test_sentence_pooling.py) only where its weights are 0 and 1; here they
    are 0 and 2."""
    nodes, inits = _additive(-10000.0)
    pool = [node("Unsqueeze", ["attention_mask", "last"], ["pm"]), node("Cast", ["pm"], ["pmf"], to=TensorProto.FLOAT),
            node("Mul", ["pmf", "two"], ["pm2"]),
            node("Mul", ["h", "pm2"], ["hp"], name="pool_mul"), node("Add", ["h", "hp"], ["h2"])]
    model = _block(nodes, extra_inits=[*inits, ("last", np.array([2], np.int64)), ("two", np.array(2.0, np.float32))],
                   ids_nodes=[node("Gather", ["table", "input_ids"], ["h"], name="embed")] + pool)
    # the Q/K/V projections read h; add h2 to the graph's outputs so the pooling is not dead
    model.graph.output.append(helper.make_tensor_value_info("h2", TensorProto.FLOAT, [B, T, D]))
    with pytest.raises(MaskError, match=r"'attention_mask'.*node 'pool_mul' \(Mul\)"):
        import_onnx(model)


def test_a_mask_value_other_than_0_and_1_is_refused():
    from vta.compiler.pipeline import check_inputs
    nodes, inits = _additive(-10000.0)
    graph = import_onnx(_block(nodes, extra_inits=inits))
    mask = _padding_mask()
    assert check_inputs(graph, {"input_ids": _ids(), "attention_mask": mask.astype(bool)})[
        "attention_mask"].dtype == np.int64
    mask[0, 3] = 2
    with pytest.raises(ValueError, match=r"1 values other than 0 and 1 in the attention mask input 'attention_mask'"):
        check_inputs(graph, {"input_ids": _ids(), "attention_mask": mask})


@pytest.mark.parametrize("reads_mask", [False, True])
def test_a_keymask_node_of_the_users_file_is_refused(reads_mask):
    """KeyMask is the lab's own operator, not the file's: refused as unknown. Fed by the mask input (which then
    meets the scores in no Add or Where, so it is no mask), the input reads a table of the bias's rows
    (:mod:`.position_tables`), and the unknown node is still what is refused."""
    nodes, inits = _additive(-10000.0)
    if reads_mask:
        nodes[-1] = node("KeyMask", ["s", "bias"], ["z"], name="my_keymask")
    else:
        nodes[-1].output[0] = "z0"
        nodes.append(node("KeyMask", ["z0", "one"], ["z"], name="my_keymask"))
    model = _block(nodes, extra_inits=inits, check=False)
    with pytest.raises(UnsupportedOperatorError, match="KeyMask") as err:
        import_onnx(model)
    assert "my_keymask" in str(err.value) and "KeyMask," not in str(err.value)


# ---- token ids through a Reshape; the NaN guard ------------------------------------------------------------------
def test_token_ids_reshaped_before_the_embedding_read_the_input():
    ids_nodes = [node("Reshape", ["input_ids", "ids_shape"], ["ids"]), node("Gather", ["table", "ids"], ["h"])]
    nodes, inits = _additive(-10000.0)
    model = _block(nodes, extra_inits=[*inits, ("ids_shape", np.array([-1, T], np.int64))], ids_nodes=ids_nodes)
    graph = import_onnx(model)
    embedding = next(n for n in graph.nodes if n.op == "Embedding")
    assert "input_ids" in embedding.inputs and graph.tensors["input_ids"].dtype == "int64"
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)


def test_the_nan_guard_is_dropped_and_a_row_masked_out_whole_is_zero(tmp_path):
    nodes, inits = _bool_where("not")
    guard = [node("IsNaN", ["p"], ["nan"]), node("Where", ["nan", "zero", "p"], ["pg"], name="nan_guard")]
    model = _block(nodes, mask_type=TensorProto.BOOL, extra_inits=[*inits, ("zero", np.array(0.0, np.float32))],
                   after_softmax=guard)
    graph = import_onnx(model)
    assert "IsNaN" not in _ops(graph) and "Where" not in _ops(graph) and _ops(graph).count("KeyMask") == 1
    ids, mask = _ids(), _padding_mask()
    mask[1] = 0                                                # batch row 1: every key masked out
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids,
                                                                      "attention_mask": mask.astype(bool)})[0]
    np.testing.assert_allclose(run_float(graph, {"input_ids": ids, "attention_mask": mask})["y"], want, atol=1e-5)

    compiled = _compile(model, tmp_path, {"input_ids": ids, "attention_mask": _padding_mask()})
    got = _fsim(compiled, {"input_ids": ids, "attention_mask": mask.astype(bool)}).outputs["y"]
    assert np.isfinite(got).all() and _cosine(got, want) > 0.99
    for out in (want, got):                                    # row 1 attends to nothing: the output bias alone
        np.testing.assert_array_equal(out[1], np.broadcast_to(out[1, 0], (T, D)))

    keymask = next(n for n in graph.nodes if n.op == "KeyMask")
    key = {"mask": mask, **{k: keymask.attrs[k] for k in qops.KEY_MASK_ATTRS}}
    x = np.random.default_rng(3).integers(-128, 128, (B, H, T, T)).astype(np.int8)
    p = qops.softmax(x, 0.05, -1, key=key)
    assert np.isfinite(p).all() and (p[1] == 0).all()
    np.testing.assert_allclose(p[0].sum(-1), 1.0, rtol=1e-6)
    assert (qops.qsoftmax(x, 0.05, 1 / 127, -1, key=key)[1] == 0).all()


# ---- random inputs -----------------------------------------------------------------------------------------------
def test_random_inputs_give_a_padding_mask():
    from vta.compiler.pipeline import is_mask_input, random_inputs
    nodes, inits = _additive(-10000.0)
    graph = import_onnx(_block(nodes, extra_inits=inits))
    assert is_mask_input(graph, "attention_mask") and not is_mask_input(graph, "input_ids")
    for seed in range(5):
        values = random_inputs(graph, seed, samples=3)
        mask, ids = values["attention_mask"], values["input_ids"]
        assert mask.dtype == np.int64 and mask.shape == (3 * B, T) and set(np.unique(mask)) <= {0, 1}
        kept = mask.sum(-1)
        assert (kept >= T // 2).all()
        np.testing.assert_array_equal(mask, (np.arange(T)[None, :] < kept[:, None]).astype(np.int64))  # a prefix
        assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < V


# ---- float masks given at run time -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, nodes", [
    ((B, 1, 1, T), [node("Add", ["s", "attention_mask"], ["z"], name="mask_add")]),
    ((T, T), [node("Unsqueeze", ["attention_mask", "axes"], ["m4"]), node("Add", ["s", "m4"], ["z"], name="mask_add")]),
])
def test_a_float_mask_input_is_added_in_the_softmax_unquantized(shape, nodes, tmp_path):
    """A float32 input added to the scores just before the Softmax (an additive padding mask [B, 1, 1, L]; a
    decoder's tgt_mask [T, T] of 0 and -inf through Unsqueeze): an additive KeyMask, never quantized, added in float
    inside the QSoftmax; -inf accepted as input, NaN and +inf refused; the default input of a square one is causal."""
    from vta.compiler.pipeline import check_inputs, random_inputs
    model = _block(nodes, mask_type=TensorProto.FLOAT, mask_shape=shape,
                   extra_inits=[("axes", np.array([0, 1], np.int64))])
    graph = import_onnx(model)
    keymask = next(n for n in graph.nodes if n.op == "KeyMask")
    assert keymask.attrs["additive"] and tuple(keymask.attrs["expand"]) == ((1, 1, T, T) if len(shape) == 2 else shape)
    assert "Unsqueeze" not in _ops(graph) and graph.tensors["attention_mask"].dtype == "float32"
    if len(shape) == 2:
        mask = np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf).astype(np.float32)
        np.testing.assert_array_equal(random_inputs(graph, 0)["attention_mask"], mask)
    else:
        mask = np.where(_padding_mask()[:, None, None, :] > 0, 0.0, -10000.0).astype(np.float32)
        assert not random_inputs(graph, 0)["attention_mask"].any()
    feeds = {"input_ids": _ids(), "attention_mask": mask}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)

    compiled = _compile(model, tmp_path, feeds)
    softmax = next(n for n in compiled.graph.nodes if n.op == "QSoftmax")
    assert softmax.inputs[1] == "attention_mask" and softmax.attrs["key_additive"]
    assert not any("attention_mask" in n.inputs for n in compiled.graph.nodes if n.op != "QSoftmax")
    got = _fsim(compiled, feeds).outputs["y"]
    assert _cosine(got, want) > 0.99
    for bad in (np.nan, np.inf):
        wrong = mask.copy()
        wrong.flat[0] = bad
        with pytest.raises(ValueError, match="must be finite"):
            check_inputs(compiled.graph, {"input_ids": feeds["input_ids"], "attention_mask": wrong})


def test_a_float_input_added_to_other_activations_stays_an_activation():
    """A float32 input added to an activation that does not feed a Softmax is a model input like any other:
    quantized, no KeyMask."""
    nodes = [node("Add", ["s", "zero"], ["z"])]
    model = _block(nodes, mask_type=TensorProto.FLOAT, mask_shape=(B, T, D), check=False,
                   extra_inits=[("zero", np.zeros((1,), np.float32))])
    model.graph.node.append(node("Add", ["y0", "attention_mask"], ["y"]))
    for n in model.graph.node:
        n.output[:] = ["y0" if o == "y" and n.op_type == "Add" and "attention_mask" not in n.input else o
                       for o in n.output]
    graph = import_onnx(model)
    assert "KeyMask" not in _ops(graph) and graph.tensors["attention_mask"].dtype == "float32"


def test_the_onnx_backend_takes_token_ids_and_masks_at_run_time():
    """VtaBackend freezes inputs at constant-only positions, but not token ids that index an embedding table: a
    model with ids and a bool mask compiles once (calibrated on the first run) and takes other ids and masks."""
    from vta.compiler.onnx_backend import VtaBackend
    nodes, inits = _bool_where("where")
    model = _block(nodes, mask_type=TensorProto.BOOL, extra_inits=inits)
    rep = VtaBackend.prepare(model, device="fsim")
    assert rep.frozen == {}
    ids, mask = _ids(), _padding_mask(np.bool_)
    first = rep.run([ids, mask])[0]
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input_ids": ids, "attention_mask": mask})[0]
    assert _cosine(first, want) > 0.99
    other = rep.run([_ids(seed=7), np.ones((B, T), np.bool_)])[0]
    assert not np.array_equal(other, first)


def _dynamic(model):
    """``model`` with its inputs' dimensions symbolic: ``batch`` and ``sequence`` (as torch's dynamic_axes write)."""
    for vi in model.graph.input:
        for d, name in zip(vi.type.tensor_type.shape.dim, ("batch", "sequence")):
            d.Clear()
            d.dim_param = name
    return model


def test_inputs_sharing_a_symbolic_dimension_take_one_shape(tmp_path, capsys):
    """A given shape fixes the symbolic dimensions of the same name in the other inputs; ``vta run`` takes the
    shapes of its --input arrays for inputs with dynamic dimensions and says so."""
    from vta.cli import main
    from vta.compiler.frontend.onnx_frontend import DynamicShapeError
    nodes, inits = _additive(-10000.0)
    model = _dynamic(_block(nodes, extra_inits=inits))
    with pytest.raises(DynamicShapeError, match="--input-shape input_ids="):
        import_onnx(model)
    graph = import_onnx(model, input_shapes={"input_ids": (B, T)})
    assert graph.shape("attention_mask") == (B, T)
    path, data = tmp_path / "dynamic.onnx", tmp_path / "data.npz"
    onnx.save(model, str(path))
    np.savez(data, input_ids=_ids(), attention_mask=_padding_mask())
    code = main(["run", str(path), "--target", "fsim", "--input", str(data), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and f"input shapes from --input {data}: input_ids=2x8, attention_mask=2x8" in err
    assert "matches_integer_reference: True" in out


def test_the_gathernd_lookup_of_the_new_exporter_is_a_mask_region():
    """transformers 5 through torch's new exporter reads the mask with GatherND at the identity (b, key) grid; a
    grid that moves entries is not element-wise, and its term is computed from the mask at run time (MaskFn)."""
    grid = np.stack(np.broadcast_arrays(np.arange(B)[:, None, None, None], np.arange(T)[None, None, None, :]), -1)
    def nodes(index):
        return [node("Cast", ["attention_mask"], ["mb"], to=TensorProto.BOOL),
                node("GatherND", ["mb", index], ["m4"]),
                node("Where", ["m4", "zero", "big"], ["bias"]), node("Add", ["s", "bias"], ["z"], name="mask_add")]
    inits = [("grid", grid.astype(np.int64)), ("flipped", grid[:, :, :, ::-1, :].astype(np.int64)),
             ("zero", np.array(0.0, np.float32)), ("big", np.array(FLOAT_MIN, np.float32))]
    model = _block(nodes("grid"), extra_inits=inits)
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes].count("KeyMask") == 1 and "GatherND" not in [n.op for n in graph.nodes]
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)
    flipped = _block(nodes("flipped"), extra_inits=inits)
    graph = import_onnx(flipped)                        # entries moved: the term is computed at run time
    assert "MaskFn" in [n.op for n in graph.nodes]
    want = ort.InferenceSession(flipped.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5)


def test_a_calibration_file_takes_masks(tmp_path):
    """--calibration's .npz: an int64 mask of 0/1 (not token ids), a float [T, T] mask with -inf stacked along its
    own first axis; a mask value of 2 refused."""
    from vta.compiler.frontend.calibration import CalibrationError, load_calibration
    nodes, inits = _additive(-10000.0)
    graph = import_onnx(_block(nodes, extra_inits=inits))
    path = tmp_path / "calib.npz"
    np.savez(path, input_ids=np.concatenate([_ids()] * 3), attention_mask=np.concatenate([_padding_mask()] * 3))
    values = load_calibration(path, graph)
    assert values["attention_mask"].dtype == np.int64 and values["attention_mask"].shape == (3 * B, T)
    wrong = np.concatenate([_padding_mask()] * 3)
    wrong[0, 0] = 2
    np.savez(path, input_ids=np.concatenate([_ids()] * 3), attention_mask=wrong)
    with pytest.raises(CalibrationError, match="'attention_mask' is an attention mask; it takes 0 and 1 only"):
        load_calibration(path, graph)
    square = [node("Unsqueeze", ["attention_mask", "axes"], ["m4"]), node("Add", ["s", "m4"], ["z"])]
    graph = import_onnx(_block(square, mask_type=TensorProto.FLOAT, mask_shape=(T, T),
                               extra_inits=[("axes", np.array([0, 1], np.int64))]))
    causal = np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf).astype(np.float32)
    np.savez(path, input_ids=np.concatenate([_ids()] * 2), attention_mask=np.concatenate([causal] * 2))
    assert load_calibration(path, graph)["attention_mask"].shape == (2 * T, T)


def test_a_float_mask_of_0_and_1_is_a_mask(tmp_path):
    """A float32 attention_mask of 0/1 turned into an additive term by arithmetic ((1 - m) * -10000) before the
    Softmax is a 0/1 mask like an int64 one (read as int64; other values refused), while a float input added to
    activations elsewhere stays an activation (test above)."""
    from vta.compiler.pipeline import check_inputs
    nodes, inits = _additive(-10000.0)
    model = _block(nodes, mask_type=TensorProto.FLOAT, extra_inits=inits)
    graph = import_onnx(model)
    assert [n.op for n in graph.nodes].count("KeyMask") == 1 and graph.tensors["attention_mask"].dtype == "int64"
    mask = _padding_mask(np.float32)
    feeds = {"input_ids": _ids(), "attention_mask": mask}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, check_inputs(graph, feeds))["y"], want, atol=1e-5)
    compiled = _compile(model, tmp_path, {"input_ids": _ids(), "attention_mask": _padding_mask()})
    got = _fsim(compiled, feeds).outputs["y"]
    assert _cosine(got, want) > 0.99
    with pytest.raises(ValueError, match="values other than 0 and 1"):
        check_inputs(graph, {"input_ids": _ids(), "attention_mask": mask * 0.5})


@pytest.mark.parametrize("form", ["where", "add"])
def test_a_mask_of_query_and_key_entries_is_computed_at_run_time(form, tmp_path):
    """DeBERTa's ``mask[:, None, None, :] * mask[:, None, :, None]`` (each score depends on its query's and its key's
    entries: no element-wise KeyMask): the region computes an additive term from the mask at run time (a MaskFn
    node), filled with float32's min by a Where or added; against onnxruntime and bit-exact on fsim."""
    nodes = [node("Unsqueeze", ["attention_mask", "ax1"], ["m1"]), node("Unsqueeze", ["m1", "ax2"], ["m2"]),
             node("Unsqueeze", ["attention_mask", "ax1"], ["n1"]), node("Unsqueeze", ["n1", "ax3"], ["n2"]),
             node("Mul", ["m2", "n2"], ["qk"])]
    inits = [("ax1", np.array([1], np.int64)), ("ax2", np.array([2], np.int64)), ("ax3", np.array([3], np.int64)),
             ("low", np.array(np.finfo(np.float32).min, np.float32)), ("one", np.array(1, np.int64))]
    if form == "where":
        nodes += [node("Cast", ["qk"], ["keep"], to=TensorProto.BOOL), node("Not", ["keep"], ["drop"]),
                  node("Where", ["drop", "low", "s"], ["z"], name="mask_where")]
    else:
        nodes += [node("Sub", ["one", "qk"], ["inv"]), node("Cast", ["inv"], ["invf"], to=TensorProto.FLOAT),
                  node("Mul", ["invf", "low"], ["bias"]), node("Add", ["s", "bias"], ["z"], name="mask_add")]
    model = _block(nodes, extra_inits=inits)
    graph = import_onnx(model)
    assert "MaskFn" in _ops(graph) and _ops(graph).count("KeyMask") == 1
    check_masked_block(model, graph, tmp_path)


def test_a_two_entry_mask_filling_moderate_values_is_refused():
    nodes = [node("Unsqueeze", ["attention_mask", "ax1"], ["m1"]), node("Unsqueeze", ["m1", "ax2"], ["m2"]),
             node("Unsqueeze", ["attention_mask", "ax1"], ["n1"]), node("Unsqueeze", ["n1", "ax3"], ["n2"]),
             node("Mul", ["m2", "n2"], ["qk"]), node("Cast", ["qk"], ["keep"], to=TensorProto.BOOL),
             node("Where", ["keep", "s", "low"], ["z"], name="mask_where")]
    inits = [("ax1", np.array([1], np.int64)), ("ax2", np.array([2], np.int64)), ("ax3", np.array([3], np.int64)),
             ("low", np.array(-5.0, np.float32))]
    with pytest.raises(MaskError, match=r"fills the scores in node 'mask_where' \(Where\) with values above"):
        import_onnx(_block(nodes, extra_inits=inits))


def test_the_run_also_states_the_error_on_the_positions_the_mask_keeps(tmp_path, capsys):
    """`vta run` with an attention mask input: besides the whole output's error, the error on the output rows
    where the mask is 1 (padded rows are what DeBERTa's LayerNorms blow up), in the text and the JSON report;
    equal to the figures computed here from the saved outputs and onnxruntime's."""
    import json

    from vta.cli import main
    from vta.compiler.frontend.quantize import accuracy_vs_float
    mask_nodes, inits = _additive(-10000.0)
    model = _block(mask_nodes, extra_inits=inits)
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path))
    feeds = {"input_ids": _ids(), "attention_mask": _padding_mask()}
    np.savez(tmp_path / "in.npz", **feeds)
    assert main(["run", str(path), "--target", "fsim", "--no-progress", "--input", str(tmp_path / "in.npz"),
                 "--output", str(tmp_path / "out.npz"), "--report-json", str(tmp_path / "r.json")]) == 0
    assert "on the 13 of 16 positions where attention_mask is 1: " in " ".join(capsys.readouterr().out.split())
    kept = json.loads((tmp_path / "r.json").read_text())["accuracy"]["outputs"]["y"]["kept_tokens"]
    got = np.load(tmp_path / "out.npz")["y"]
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    rows = feeds["attention_mask"].astype(bool)
    assert kept["mask"] == "attention_mask" and (kept["tokens"], kept["of"]) == (13, 16)
    assert kept["cosine"] == pytest.approx(accuracy_vs_float(want[rows], got[rows], None)["cosine"], abs=1e-6)


def test_key_lengths_calibrate_as_lengths_not_as_a_mask(tmp_path):
    """torchaudio's Conformer takes ``lengths [batch]`` and masks the keys at and after each length
    (``arange(T) >= lengths[:, None]``): an input of valid-key counts. The calibration file takes such counts (it
    used to be checked as a 0/1 mask and refused), and the run's own lengths give onnxruntime's result."""
    from vta.compiler.frontend.calibration import load_calibration
    from vta.compiler.frontend.masks import mask_lengths
    from vta.compiler.pipeline import check_inputs
    keys = 6
    nodes = [helper.make_node("Unsqueeze", ["lengths", "one"], ["col"]),
             helper.make_node("GreaterOrEqual", ["arange", "col"], ["pad"]),
             helper.make_node("Unsqueeze", ["pad", "one"], ["pad3"]),
             helper.make_node("Where", ["pad3", "ninf", "x"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=-1)]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.arange(keys, dtype=np.int64).reshape(1, keys), "arange"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")]
    graph = helper.make_graph(nodes, "lengths", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, keys]),
                                                 helper.make_tensor_value_info("lengths", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, keys])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fg = import_onnx(model)
    assert mask_lengths(fg, "lengths") == keys
    rng = np.random.default_rng(4)
    np.savez(tmp_path / "calib.npz", x=rng.standard_normal((3, 4, keys)).astype(np.float32),
             lengths=np.array([6, 3, 5]))
    assert load_calibration(tmp_path / "calib.npz", fg)["lengths"].tolist() == [6, 3, 5]
    feeds = {"x": rng.standard_normal((1, 4, keys)).astype(np.float32), "lengths": np.array([4])}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(fg, check_inputs(fg, feeds))["y"], want, atol=1e-6)
