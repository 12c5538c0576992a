"""ONNX's fused operators of opsets 23+ (what torch's exporter writes at ``opset_version >= 23``), built with
onnx.helper: Attention (4-D and 3-D, causal, boolean and float masks, a graph-input mask, grouped-query heads, a KV
cache, scale, softcap, a sliding window), RMSNormalization and SwiGLU. Each imports as the primitive nodes the
rules read (``onnx_fused``); its float reference matches onnxruntime and ONNX's reference evaluator on the file, and
the compiled model matches the integer reference on fsim with its attention products on the accelerator. Refusals
name the node and the reason, all at once."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx
from vta.config import VTAConfig

B, T, D, H = 2, 8, 32, 2
node = helper.make_node
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits, opset=23):
    graph = helper.make_graph(nodes, "fused", inputs, outputs,
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset < 25 else 11
    return model


def _block(rank=4, kv_heads=H, mask=None, past=0, opset=23, batch=B, repeat_kv=False, **attrs):
    """``x [batch, T, D]`` projected to Q (H heads of D/H) and K, V (``kv_heads`` heads), one Attention node
    (``rank`` 4: heads split and merged around it; 3: given as ``[batch, T, width]`` with q/kv_num_heads), then an
    output projection ``y [batch, T, D]``. ``mask``: None, ``("input", dtype, shape)`` for a graph input ``mask``,
    or ``("const", array)``. ``past``: a KV cache of that many tokens as inputs ``past_k``/``past_v`` and outputs
    ``present_k``/``present_v`` (rank 4). ``repeat_kv``: the key/value heads repeated before the Attention node as
    transformers' Llama does (Unsqueeze, Expand, Reshape; rank 4)."""
    rng = np.random.default_rng(0)
    head = D // H
    kv = kv_heads * head
    inits = {"wq": rng.standard_normal((D, D)) * 0.3, "wk": rng.standard_normal((D, kv)) * 0.3,
             "wv": rng.standard_normal((D, kv)) * 0.3, "wo": rng.standard_normal((D, D)) * 0.3}
    inits = {k: v.astype(np.float32) for k, v in inits.items()}
    nodes = [node("MatMul", ["x", "wq"], ["q3"]), node("MatMul", ["x", "wk"], ["k3"]),
             node("MatMul", ["x", "wv"], ["v3"])]
    inputs = [helper.make_tensor_value_info("x", F, [batch, T, D])]
    outputs = [helper.make_tensor_value_info("y", F, [batch, T, D])]
    if rank == 4:
        for role, heads in (("q", H), ("k", kv_heads), ("v", kv_heads)):
            inits[f"{role}_shape"] = np.array([batch, T, heads, head], np.int64)
            nodes += [node("Reshape", [f"{role}3", f"{role}_shape"], [f"{role}s"]),
                      node("Transpose", [f"{role}s"], [role], perm=[0, 2, 1, 3])]
        names = ["q", "k", "v"]
        if repeat_kv:
            inits["axis2"] = np.array([2], np.int64)
            inits["wide"] = np.array([batch, kv_heads, H // kv_heads, T, head], np.int64)
            inits["heads"] = np.array([batch, H, T, head], np.int64)
            for role in "kv":
                nodes += [node("Unsqueeze", [role, "axis2"], [f"{role}u"]),
                          node("Expand", [f"{role}u", "wide"], [f"{role}e"]),
                          node("Reshape", [f"{role}e", "heads"], [f"{role}r"])]
            names = ["q", "kr", "vr"]
    else:
        names = ["q3", "k3", "v3"]
        attrs.update(q_num_heads=H, kv_num_heads=kv_heads)
    mask_name = ""
    if mask is not None and mask[0] == "input":
        mask_name = "mask"
        inputs.append(helper.make_tensor_value_info("mask", mask[1], list(mask[2])))
    elif mask is not None:
        mask_name = "mask_c"
        inits["mask_c"] = mask[1]
    att_in = names + [mask_name]
    att_out = ["a"]
    if past:
        att_in += ["past_k", "past_v"]
        att_out += ["present_k", "present_v"]
        for role in "kv":
            inputs.append(helper.make_tensor_value_info(f"past_{role}", F, [batch, kv_heads, past, head]))
            outputs.append(helper.make_tensor_value_info(f"present_{role}", F, [batch, kv_heads, past + T, head]))
    nodes.append(node("Attention", att_in, att_out, name="attn", **attrs))
    if rank == 4:
        inits["merge_shape"] = np.array([batch, T, D], np.int64)
        nodes += [node("Transpose", ["a"], ["am"], perm=[0, 2, 1, 3]),
                  node("Reshape", ["am", "merge_shape"], ["a3"])]
    else:
        nodes.append(node("Identity", ["a"], ["a3"]))
    nodes.append(node("MatMul", ["a3", "wo"], ["y"]))
    return _model(nodes, inputs, outputs, inits, opset)


def _feeds(model, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "mask":
            keep = np.ones(shape, bool)
            keep[-1, ..., -3:] = False                        # the last row pads its last 3 keys
            kind = vi.type.tensor_type.elem_type
            feeds["mask"] = keep if kind == TensorProto.BOOL else np.where(keep, 0, -np.inf).astype(np.float32)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _check_float(model, atol=2e-5, with_ort=True):
    """The imported graph's float reference against onnxruntime (unless not ``with_ort``) and ONNX's reference
    evaluator on the file."""
    onnx.checker.check_model(model, full_check=True)
    graph = import_onnx(model)
    assert "Attention" not in [n.op for n in graph.nodes]
    feeds = _feeds(model)
    got = run_float(graph, feeds)
    names = [o.name for o in model.graph.output]
    wants = [ReferenceEvaluator(model).run(None, feeds)]
    if with_ort:
        wants.append(ort.InferenceSession(model.SerializeToString()).run(None, feeds))
    for want in wants:
        for name, value in zip(names, want):
            np.testing.assert_allclose(got[name], value, atol=atol, rtol=1e-4, err_msg=name)
    return graph


CAUSAL = np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf).astype(np.float32)

FORMS = {
    "4d": dict(),
    "4d causal": dict(is_causal=1),
    "3d causal": dict(rank=3, is_causal=1),
    "3d grouped-query": dict(rank=3, kv_heads=1, is_causal=1),
    "4d grouped-query": dict(kv_heads=1),
    "repeat_kv by Expand": dict(kv_heads=1, repeat_kv=True, is_causal=1),
    "scale and softcap": dict(scale=0.3, softcap=2.0),
    "bool input mask": dict(mask=("input", TensorProto.BOOL, (B, 1, T, T))),
    "broadcast bool input mask": dict(mask=("input", TensorProto.BOOL, (B, 1, 1, T))),
    "float input mask": dict(mask=("input", F, (B, 1, T, T))),
    "bool input mask and causal": dict(mask=("input", TensorProto.BOOL, (B, 1, T, T)), is_causal=1),
    "constant float mask": dict(mask=("const", CAUSAL)),
    "short constant bool mask": dict(mask=("const", np.ones((T, T - 2), bool))),
    "short float input mask": dict(mask=("input", F, (B, 1, T, T - 2)), is_causal=1),
    "kv cache": dict(past=5, is_causal=1, batch=1),
    "opset 24": dict(opset=24, is_causal=1),
    "sliding window": dict(opset=25, is_causal=1, left_window_size=3),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_attention_imports_as_its_decomposition(form):
    """onnxruntime 1.32 refuses a mask broadcast over the queries (``[B, 1, 1, L]``) and one shorter than the keys,
    which the operator allows: those forms are checked against ONNX's reference evaluator alone."""
    _check_float(_block(**FORMS[form]), with_ort=form not in ("broadcast bool input mask", "short constant bool mask",
                                                               "short float input mask"))


@pytest.fixture
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("form", ["3d grouped-query", "bool input mask and causal", "kv cache",
                                  "repeat_kv by Expand"])
def test_attention_runs_bit_exact_with_its_products_on_the_accelerator(form, tmp_path, _cache):
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    model = _block(**FORMS[form])
    path = tmp_path / "block.onnx"
    onnx.save(model, str(path))
    feeds = _feeds(model)
    calib = {k: np.concatenate([v, _feeds(model, 2)[k]]) for k, v in feeds.items()}
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel",
                             calibration=CalibrationSet(calib, {"source": "test"}))
    products = {s.node.name: isinstance(s, AccelStep) for s in compiled.steps if s.node.op == "QMatMul"}
    assert len(products) == 2 and all(products.values()), products
    result = run(compiled, feeds, target="fsim").outputs
    reference = qops.run_reference(compiled.graph, feeds)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for out, value in zip([o.name for o in model.graph.output], want):
        np.testing.assert_array_equal(result[out], reference[out])
        got = np.ravel(result[out]).astype(np.float64)
        assert float(got @ np.ravel(value) / np.linalg.norm(got) / np.linalg.norm(value)) > 0.99, out


def test_rms_normalization_and_swiglu_at_opset_28():
    rng = np.random.default_rng(0)
    inits = {"g": rng.uniform(0.5, 1.5, D).astype(np.float32), "w1": (rng.standard_normal((D, D)) * 0.3
                                                                        ).astype(np.float32),
             "w2": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    nodes = [node("RMSNormalization", ["x", "g"], ["n"], axis=-1, epsilon=1e-6, stash_type=1),
             node("MatMul", ["n", "w1"], ["a"]), node("MatMul", ["n", "w2"], ["b"]),
             node("SwiGLU", ["a", "b"], ["y"], alpha=1.0)]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [B, T, D])],
                   [helper.make_tensor_value_info("y", F, [B, T, D])], inits, opset=28)
    feeds = _feeds(model)
    graph = import_onnx(model)
    assert {"RMSNorm", "Swish"} <= {n.op for n in graph.nodes}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("axis, scale_shape", [(1, (T, D)), (-2, (D,)), (0, (1,))])
def test_rms_normalization_over_several_axes_flattens_them(axis, scale_shape):
    """RMSNormalization over the axes ``axis`` to the last: one RMSNorm over them flattened, the scale broadcast."""
    rng = np.random.default_rng(2)
    model = _model([node("RMSNormalization", ["x", "g"], ["y"], axis=axis, epsilon=1e-5)],
                   [helper.make_tensor_value_info("x", F, [B, T, D])],
                   [helper.make_tensor_value_info("y", F, [B, T, D])],
                   {"g": rng.uniform(0.5, 1.5, scale_shape).astype(np.float32)})
    graph = import_onnx(model)
    norms = [n for n in graph.nodes if n.op == "RMSNorm"]
    assert len(norms) == 1 and graph.shape(norms[0].inputs[0])[-1] == int(np.prod([B, T, D][axis:]))
    feeds = _feeds(model)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=2e-5, rtol=1e-4)


def test_rms_normalization_with_a_scale_that_does_not_broadcast_is_refused():
    model = _model([node("RMSNormalization", ["x", "g"], ["y"], axis=1)],
                   [helper.make_tensor_value_info("x", F, [B, T, D])],
                   [helper.make_tensor_value_info("y", F, [B, T, D])], {"g": np.ones((3, D), np.float32)})
    with pytest.raises(UnsupportedOperatorError, match=r"a scale of shape \(3, 32\) for normalised shape \[8, 32\]"):
        import_onnx(model)


def _with_scores(model, mode):
    """``model`` with its Attention's ``qk_matmul_output`` (of ``qk_matmul_output_mode`` ``mode``) a graph output."""
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    attention.output.extend(["", "", "qk"])
    attention.attribute.append(helper.make_attribute("qk_matmul_output_mode", mode))
    model.graph.output.append(helper.make_tensor_value_info("qk", F, [B, H, T, T]))
    return model


@pytest.mark.parametrize("mode, attrs", [(0, {}), (1, {}), (1, {"softcap": 3.0}), (2, {"softcap": 3.0}), (3, {}),
                                         (3, {"is_causal": 1})])
def test_the_scores_output_is_the_tensor_its_mode_names(mode, attrs):
    """qk_matmul_output: the scaled product (0), after the softcap (1), with the mask added (2), the Softmax (3).
    ONNX's reference evaluator agrees with these wherever it follows the operator's text (mode 0 without a
    softcap: it gives the softcapped product). Mode 2 is given a float mask: a causal one holds -inf."""
    mask = ("const", np.where(CAUSAL == 0, np.float32(0.5), np.float32(-2.0))) if mode == 2 else None
    _check_float(_with_scores(_block(mask=mask, **attrs), mode), with_ort=False)


def test_unsupported_attention_forms_are_refused_together_with_their_reasons():
    model = _with_scores(_block(is_causal=1), 5)           # no such qk_matmul_output_mode
    model.graph.node.append(node("TensorScatter", ["cache", "x"], ["r"], name="scatter"))
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((B, 2 * T, D), np.float32), "cache"))
    model.graph.output.append(helper.make_tensor_value_info("r", F, [B, 2 * T, D]))
    with pytest.raises(UnsupportedModelError) as err:
        import_onnx(model)
    text = str(err.value)
    assert "attn" in text and "qk_matmul_output_mode 5 (0 to 3)" in text
    assert "scatter" in text and "KV cache update" in text


def _with_lengths(model, causal):
    """``model``'s Attention given ``nonpad_kv_seqlen`` (input 6, opset 24) from an int64 graph input ``lens [B]``."""
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    attention.input.extend(["", "", "lens"])             # after q, k, v, no mask: nonpad_kv_seqlen (input 6)
    del attention.attribute[:]
    if causal:
        attention.attribute.append(helper.make_attribute("is_causal", 1))
    model.opset_import[0].version = 24                   # the input Attention gained at opset 24
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT64, [B]))
    return model


@pytest.mark.parametrize("causal", [False, True])
def test_an_external_caches_valid_lengths_mask_the_keys_past_them(causal):
    """``nonpad_kv_seqlen`` (opset 24): keys from each sequence's length on are masked; causal, the queries are the
    last positions before it. The lengths are any integers the model's nodes turn into the mask at run time (a
    length of 0 leaves rows attending to nothing: 0)."""
    model = _with_lengths(_block(), causal)
    graph = import_onnx(model)
    for lens in ([T, 5], [3, 0]):
        feeds = {**_feeds(model), "lens": np.array(lens, np.int64)}
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=2e-5, rtol=1e-4)


def test_vta_run_draws_lengths_and_takes_any_given(tmp_path, capsys, monkeypatch):
    from vta.cli import main
    from vta.compiler.frontend.masks import mask_lengths
    from vta.compiler.pipeline import random_inputs
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    model = _with_lengths(_block(), True)
    graph = import_onnx(model)
    assert mask_lengths(graph, "lens") == T
    drawn = random_inputs(graph, 0)["lens"]
    assert drawn.dtype == np.int64 and ((T + 1) // 2 <= drawn).all() and (drawn <= T).all()
    path = tmp_path / "lens.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "in.npz", **{**_feeds(model), "lens": np.array([T, 5], np.int64)})
    assert main(["run", str(path), "--target", "fsim", "--input", str(tmp_path / "in.npz"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "matches_integer_reference: True" in out and "error against the float model (onnxruntime" in out


def test_external_cache_lengths_with_an_attn_mask_are_refused():
    model = _with_lengths(_block(mask=("input", TensorProto.BOOL, (B, 1, T, T))), False)
    attention = next(n for n in model.graph.node if n.op_type == "Attention")
    attention.input[3] = "mask"
    with pytest.raises(UnsupportedOperatorError, match="nonpad_kv_seqlen with an attn_mask"):
        import_onnx(model)


def test_a_short_float_mask_input_is_a_float_term_with_any_values(tmp_path, capsys, monkeypatch):
    """A float32 ``attn_mask`` input shorter than the keys: the keys past it take no part (the operator pads it with
    -inf), and its own values are added as they are: any floats, not a 0/1 mask (it used to reach the scores
    through a Pad, which made it one, and `vta run` refused real values)."""
    from vta.cli import main
    from vta.compiler.frontend.masks import is_float_mask_input
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    model = _block(mask=("input", F, (B, 1, T, T - 2)), is_causal=1)
    graph = import_onnx(model)
    assert is_float_mask_input(graph, "mask") and "Pad" not in [n.op for n in graph.nodes]
    feeds = _feeds(model)
    feeds["mask"] = np.random.default_rng(3).standard_normal(feeds["mask"].shape).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=2e-5, rtol=1e-4)
    path = tmp_path / "short.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "in.npz", **feeds)
    assert main(["run", str(path), "--target", "fsim", "--input", str(tmp_path / "in.npz"), "--no-progress"]) == 0
    assert "matches_integer_reference: True" in capsys.readouterr().out


def test_a_query_row_masked_out_whole_attends_to_nothing():
    """The operator gives 0 for a row whose keys are all masked (not the NaN of a plain softmax)."""
    model = _block(mask=("input", TensorProto.BOOL, (B, 1, T, T)))
    feeds = _feeds(model)
    feeds["mask"][0, 0, 2, :] = False
    graph = import_onnx(model)
    got = run_float(graph, feeds)["y"]
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)


def test_a_file_onnxruntime_cannot_run_is_measured_against_the_float_reference():
    """onnxruntime 1.32 loads an Attention with a mask broadcast over the queries but fails to run it: the run
    measures against the lab's float reference and says why, instead of ending in a traceback."""
    from vta.compiler.frontend.quantize import float_outputs
    model = _block(mask=("input", TensorProto.BOOL, (B, 1, 1, T)))
    graph = import_onnx(model)
    feeds = _feeds(model)
    got, source = float_outputs(model, graph, feeds)
    assert source.startswith("float reference (onnxruntime failed to run the file: inconsistent q_sequence_length")
    np.testing.assert_allclose(got["y"], ReferenceEvaluator(model).run(None, feeds)[0], atol=2e-5, rtol=1e-4)


EINSUMS = [("bhid,bhjd->bhij", [(2, 3, 5, 4), (2, 3, 6, 4)]), ("bhij,bhjd->bhid", [(2, 3, 5, 6), (2, 3, 6, 4)]),
           ("abc,cd->abd", [(2, 5, 8), (8, 6)]), ("abc,cde->abde", [(2, 5, 8), (8, 3, 4)]),
           ("abcd,cde->abe", [(2, 5, 3, 4), (3, 4, 8)]), ("aecd,abcd->acbe", [(2, 6, 3, 4), (2, 5, 3, 4)]),
           ("...ij,...jk->...ik", [(2, 3, 5, 4), (2, 3, 4, 6)]), ("ij,jk", [(5, 4), (4, 6)]),
           ("bij->bji", [(2, 5, 4)]), ("bi,bj->bij", [(3, 4), (3, 5)]), ("ij,ij->i", [(4, 5), (4, 5)])]


@pytest.mark.parametrize("equation,shapes", EINSUMS)
def test_einsum_imports_as_a_matrix_product(equation, shapes):
    """torch.einsum's and Keras' attention equations: the second operand a constant where it is a weight (no batch
    index), else an input; against onnxruntime."""
    rng = np.random.default_rng(0)
    values = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip("ab", shapes)}
    const = len(shapes) == 2 and not set(equation.split(",")[1]) & set("bh.")
    out_shape = np.einsum(equation, *values.values()).shape
    inputs = [helper.make_tensor_value_info(n, F, list(v.shape)) for n, v in values.items() if not (const and n == "b")]
    model = _model([node("Einsum", list(values), ["y"], equation=equation, name="einsum")], inputs,
                   [helper.make_tensor_value_info("y", F, list(out_shape))], {"b": values["b"]} if const else {},
                   opset=17)
    feeds = {i.name: values[i.name] for i in inputs}
    graph = import_onnx(model)
    assert "Einsum" not in {n.op for n in graph.nodes}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("equation,why", [("ii->i", "repeated in one term"), ("ij->i", "only a permutation"),
                                          ("ij,jk,kl->il", "3 operands"), ("ij,kl->i", "summed in one operand"),
                                          ("i.j->ij", "not operand terms"), ("ij->j->i", "not operand terms")])
def test_unsupported_einsums_are_refused_with_the_reason(equation, why):
    """Each refused by name; a malformed equation before any shape inference (onnx 1.23's loops forever on
    ``i.j,jk->ik``)."""
    operands = ["a"] * (equation.count(",") + 1)
    model = _model([node("Einsum", operands, ["y"], equation=equation, name="e")],
                   [helper.make_tensor_value_info("a", F, [4, 4])], [helper.make_tensor_value_info("y", F, None)],
                   {}, opset=17)
    with pytest.raises(UnsupportedOperatorError, match=f"Einsum.*{why}"):
        import_onnx(model)


@pytest.mark.parametrize("rank,interleaved,rot", [(4, 0, 0), (4, 1, 0), (3, 0, 0), (4, 0, 8), (3, 1, 8)])
def test_rotary_embedding_imports_as_its_decomposition(rank, interleaved, rot):
    """Opset 23's RotaryEmbedding with constant cos/sin caches gathered by a position_ids input (an Embedding of
    them), 4-D [B, H, S, D] or 3-D with num_heads, halves or interleaved pairs, a partial rotary dimension; against
    ONNX's reference evaluator."""
    rng = np.random.default_rng(0)
    heads, head, seq = 2, 16, 6
    half = (rot or head) // 2
    shape = [B, heads, seq, head] if rank == 4 else [B, seq, heads * head]
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rot, **({} if rank == 4 else {"num_heads": heads}))
    inits = {"cos": np.cos(rng.uniform(0, 3, (10, half))).astype(np.float32),
             "sin": np.sin(rng.uniform(0, 3, (10, half))).astype(np.float32)}
    model = _model([node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], name="rope", **attrs)],
                   [helper.make_tensor_value_info("x", F, shape),
                    helper.make_tensor_value_info("pos", TensorProto.INT64, [B, seq])],
                   [helper.make_tensor_value_info("y", F, shape)], inits)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "pos": rng.integers(0, 10, (B, seq)).astype(np.int64)}
    graph = import_onnx(model)
    assert "Embedding" in {n.op for n in graph.nodes}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=1e-5, rtol=1e-4)


def _causal_conv_block(past, activation, k=4, length=T):
    """``x [B, T, D]`` projected (a linear layer), transposed to channels first, one CausalConvWithState of kernel
    ``k`` (a bias, ``past`` a graph input ``state`` or none), transposed back and projected again; the present state
    is a graph output."""
    rng = np.random.default_rng(3)
    inits = {"w_in": (rng.standard_normal((D, D)) * 0.3).astype(np.float32),
             "w_conv": (rng.standard_normal((D, 1, k)) * 0.5).astype(np.float32),
             "b_conv": (rng.standard_normal(D) * 0.1).astype(np.float32),
             "w_out": (rng.standard_normal((D, D)) * 0.3).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("x", F, [B, length, D])]
    conv_in = ["ht", "w_conv", "b_conv"]
    if past:
        inputs.append(helper.make_tensor_value_info("state", F, [B, D, k - 1]))
        conv_in.append("state")
    nodes = [node("MatMul", ["x", "w_in"], ["h"]), node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
             node("CausalConvWithState", conv_in, ["c", "new_state"], activation=activation),
             node("Transpose", ["c"], ["ct"], perm=[0, 2, 1]), node("MatMul", ["ct", "w_out"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", F, [B, length, D]),
               helper.make_tensor_value_info("new_state", F, [B, D, k - 1])]
    return _model(nodes, inputs, outputs, inits, opset=27)


@pytest.mark.parametrize("past, activation", [(False, "none"), (True, "silu"), (True, "swish")])
def test_causal_conv_with_state_imports_as_concat_conv_and_slice(past, activation):
    model = _causal_conv_block(past, activation)
    graph = import_onnx(model)
    assert "CausalConvWithState" not in [n.op for n in graph.nodes]
    feeds = _feeds(model)
    got = run_float(graph, feeds)
    for name, want in zip(["y", "new_state"], ReferenceEvaluator(model).run(None, feeds)):
        np.testing.assert_allclose(got[name], want, atol=2e-5, rtol=1e-4, err_msg=name)


def test_a_decode_step_of_the_stateful_conv_runs_bit_exact_on_fsim(tmp_path, _cache):
    """One new token and the carried state (Mamba's decode step): the projections on the accelerator, the result
    and the new state equal to the integer reference's and near the float model's."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    model = _causal_conv_block(True, "silu", length=1)
    path = tmp_path / "conv.onnx"
    onnx.save(model, str(path))
    feeds = _feeds(model)
    calib = {k: np.concatenate([v, _feeds(model, 2)[k]]) for k, v in feeds.items()}
    compiled = compile_model(str(path), VTAConfig(), calib=2, calibration=CalibrationSet(calib, {"source": "test"}))
    result = run(compiled, feeds, target="fsim").outputs
    reference = qops.run_reference(compiled.graph, feeds)
    wants = ReferenceEvaluator(model).run(None, feeds)
    for name, want in zip(["y", "new_state"], wants):
        np.testing.assert_array_equal(result[name], reference[name])
        got = np.ravel(result[name]).astype(np.float64)
        assert float(got @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99, name


def test_a_stateful_conv_of_another_activation_is_refused():
    model = _causal_conv_block(False, "gelu")
    with pytest.raises(UnsupportedOperatorError, match="activation 'gelu'"):
        import_onnx(model)
