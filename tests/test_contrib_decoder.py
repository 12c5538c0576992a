"""onnxruntime's decoder operators (compiler/frontend/contrib_decoder.py): GroupQueryAttention, RotaryEmbedding,
MatMulNBits and MatMulBnb4 against onnxruntime itself in float, the quantized graphs bit-exact with the integer
reference on the CPU path, the refusals with their reasons, and a whole decoder as onnxruntime-genai's model builder
writes it (a prompt with an empty KV cache and a decode step) on fsim."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.kernels import cpu

RNG_SEED = 61                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)
MS = "com.microsoft"


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    """A model of ``nodes``: ``inputs`` name -> array (its type and shape), ``outputs`` names (float, shape unknown)."""
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
    graph = helper.make_graph(nodes, "decoder", [_vi(k, types[v.dtype], v.shape) for k, v in inputs.items()],
                              [_vi(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model


def _check(model, feeds, *, compare=None, atol=3e-5):
    """The float import equals onnxruntime on the outputs ``compare`` (all by default); the quantized graph on the
    CPU path equals the integer reference. Returns the float graph."""
    names = [o.name for o in model.graph.output]
    want = dict(zip(names, ort.InferenceSession(model.SerializeToString()).run(None, feeds)))
    graph = import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()})
    got = run_float(graph, feeds)
    for name in compare or names:
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=1e-4, err_msg=name)
    qgraph = quantize(graph, feeds)
    ref = qops.run_reference(qgraph, feeds)
    for name, value in cpu.run_cpu(qgraph, feeds).items():
        np.testing.assert_array_equal(value, ref[name])
    return graph


# ---- GroupQueryAttention ---------------------------------------------------------------------------------------------
def _seqlens_nodes():
    """onnxruntime-genai's builder's inputs of GroupQueryAttention from ``attention_mask [B, T]``."""
    nodes = [helper.make_node("ReduceSum", ["attention_mask", "one"], ["mask_sum"], keepdims=0),
             helper.make_node("Sub", ["mask_sum", "one"], ["last"]),
             helper.make_node("Cast", ["last"], ["seqlens_k"], to=TensorProto.INT32),
             helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
             helper.make_node("Gather", ["mask_shape", "scalar_one"], ["total64"], axis=0),
             helper.make_node("Cast", ["total64"], ["total"], to=TensorProto.INT32)]
    return nodes, [("one", np.array([1], np.int64)), ("scalar_one", np.array(1, np.int64))]


def _gqa_model(*, batch=1, tokens=6, past=0, heads=4, kv_heads=2, head=16, packed=True, rotary=True, rot_dim=None,
               interleaved=0, **attrs):
    """x ``[B, S, 16]`` -> MatMul to Q, K, V -> GroupQueryAttention (cache ``past`` positions) -> y, present K/V."""
    width = 16
    nodes, inits = _seqlens_nodes()
    q_out, kv_out = heads * head, kv_heads * head
    inits = [*inits, ("w_qkv", _x(width, q_out + 2 * kv_out, spread=0.4))]
    nodes.append(helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]))
    if packed:
        qkv = ["qkv", "", ""]
    else:
        inits.append(("sizes", np.array([q_out, kv_out, kv_out], np.int64)))
        nodes.append(helper.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], axis=2))
        qkv = ["q", "k", "v"]
    gqa_in = qkv + ["past_key", "past_value", "seqlens_k", "total"]
    if rotary:
        half = (rot_dim or head) // 2
        angles = np.arange(64)[:, None] / (10000.0 ** (np.arange(half) / half))[None]
        inits += [("cos_cache", np.cos(angles).astype(np.float32)), ("sin_cache", np.sin(angles).astype(np.float32))]
        gqa_in += ["cos_cache", "sin_cache"]
    nodes.append(helper.make_node("GroupQueryAttention", gqa_in, ["y", "present_key", "present_value"],
                                  name="gqa", domain=MS, num_heads=heads, kv_num_heads=kv_heads,
                                  do_rotary=int(rotary), rotary_interleaved=interleaved, **attrs))
    feeds = {"x": _x(batch, tokens, width), "attention_mask": np.ones((batch, past + tokens), np.int64),
             "past_key": _x(batch, kv_heads, past, head), "past_value": _x(batch, kv_heads, past, head)}
    return _model(nodes, feeds, ["y", "present_key", "present_value"], inits), feeds


@pytest.mark.parametrize("packed, rotary, interleaved, rot_dim", [
    (True, True, 0, None), (False, True, 0, None), (True, True, 1, None), (True, False, 0, None),
    (True, True, 0, 16)])
def test_gqa_first_prompt_with_an_empty_cache(packed, rotary, interleaved, rot_dim):
    """(A rotary dimension of 16 on heads of 32: the rest of each head passes through.)"""
    model, feeds = _gqa_model(packed=packed, rotary=rotary, interleaved=interleaved, rot_dim=rot_dim,
                              head=32 if rot_dim else 16)
    graph = _check(model, feeds)
    assert "Softmax" in [n.op for n in graph.nodes]


@pytest.mark.parametrize("past, tokens", [(5, 1), (7, 1)])
def test_gqa_decode_step_with_a_cache(past, tokens):
    model, feeds = _gqa_model(past=past, tokens=tokens)
    _check(model, feeds)


def test_gqa_decode_step_of_a_batch_with_padding_matches_onnxruntimes_output():
    """Row 1's mask ends 2 positions early (5 ones of 7): onnxruntime places its query after 4 valid past positions
    (rotary position 4, keys 0-3 and the new one); the lab's output is the same. (onnxruntime then writes the new key at
    position 4 of its cache, the lab's present has it at the end: present is not compared.)"""
    model, feeds = _gqa_model(batch=2, past=6, tokens=1)
    feeds["attention_mask"][1, 5:] = 0
    _check(model, feeds, compare=["y"])


def test_gqa_first_prompt_of_a_padded_batch_matches_onnxruntime_on_every_row():
    """Row 1 padded after 4 of 6 tokens: onnxruntime masks its keys from the 5th on for every query, so even the
    padded queries' outputs (which nothing should read) are its."""
    model, feeds = _gqa_model(batch=2, tokens=6)
    feeds["attention_mask"][1, 4:] = 0
    _check(model, feeds)


@pytest.mark.parametrize("attrs", [{"scale": 0.2}, {"softcap": 2.0}, {"local_window_size": 2},
                                   {"local_window_size": 4}, {"local_window_size": 6}])
def test_gqa_scale_softcap_and_sliding_window_in_a_prompt(attrs):
    model, feeds = _gqa_model(**attrs)
    _check(model, feeds)


@pytest.mark.parametrize("change, words", [
    ({"local_window_size": 2, "past": 5, "tokens": 1}, "local_window_size 2 below the total length 6"),
    ({"smooth_softmax": 1}, "smooth_softmax=1"),
    ({"sliding_window_cache": 1, "local_window_size": 4}, "sliding_window_cache=1 (a KV cache of the window's"),
    ({"heads": 3, "kv_heads": 2}, "num_heads 3 and kv_num_heads 2")])
def test_gqa_refusals_name_what(change, words):
    model, feeds = _gqa_model(**change)
    with pytest.raises(UnsupportedOperatorError, match="GroupQueryAttention") as err:
        import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()})
    assert words in str(err.value)


def test_gqa_with_a_runtime_total_length_is_refused_saying_so():
    model, feeds = _gqa_model()
    total = next(n for n in model.graph.node if n.output[0] == "total")
    total.input[0] = "length"
    model.graph.input.append(_vi("length", TensorProto.INT64, ()))
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError), match="total_sequence_length"):
        import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()})


# ---- RotaryEmbedding -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank, interleaved, offset", [(3, 0, False), (4, 0, False), (3, 1, False), (3, 0, True)])
def test_rotary_embedding(rank, interleaved, offset):
    heads, head, tokens = 2, 8, 5
    angles = np.arange(32)[:, None] / (10000.0 ** (np.arange(head // 2) / (head // 2)))[None]
    inits = [("cos", np.cos(angles).astype(np.float32)), ("sin", np.sin(angles).astype(np.float32))]
    if offset:
        inits.append(("pos", np.array([3], np.int64)))
    else:
        inits.append(("pos", np.array([[0, 2, 4, 6, 9]], np.int64)))
    x = _x(1, tokens, heads * head) if rank == 3 else _x(1, heads, tokens, head)
    attrs = {"num_heads": heads} if rank == 3 else {}
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], name="rope", domain=MS,
                            interleaved=interleaved, **attrs)
    _check(_model([node], {"x": x}, ["y"], inits), {"x": x})


# ---- MatMulNBits -----------------------------------------------------------------------------------------------------
def _nbits(weight, bits, block, zero_points):
    """``weight [K, N]`` as MatMulNBits' B, scales and zero points (asymmetric per block when ``zero_points``)."""
    k, n = weight.shape
    blocks = -(-k // block)
    padded = np.zeros((blocks * block, n), np.float32)
    padded[:k] = weight
    w = padded.T.reshape(n, blocks, block)
    top = 2 ** bits - 1
    if zero_points:
        lo, hi = w.min(axis=2), w.max(axis=2)
        scale = np.maximum(hi - lo, 1e-6) / top
        zero = np.clip(np.round(-lo / scale), 0, top).astype(np.uint8)
    else:
        scale = np.maximum(np.abs(w).max(axis=2), 1e-6) / (2 ** (bits - 1))
        zero = np.full((n, blocks), 2 ** (bits - 1), np.uint8)
    q = np.clip(np.round(w / scale[..., None]) + zero[..., None], 0, top).astype(np.uint8)
    per = 8 // bits
    shifts = (np.arange(per) * bits).astype(np.uint8)
    packed = (q.reshape(n, blocks, -1, per) << shifts).sum(axis=-1).astype(np.uint8)
    zp = None
    if zero_points:
        flat = np.zeros((n, -(-blocks // per) * per), np.uint8)
        flat[:, :blocks] = zero
        zp = (flat.reshape(n, -1, per) << shifts).sum(axis=-1).astype(np.uint8).reshape(-1)
    return packed, scale.astype(np.float32).reshape(-1), zp


@pytest.mark.parametrize("bits, block, zero_points, bias, k", [
    (4, 16, False, False, 32), (4, 32, True, True, 40), (8, 16, True, False, 32), (2, 16, False, True, 16)])
def test_matmul_nbits_dequantizes_to_a_linear_layer(bits, block, zero_points, bias, k):
    n = 24
    packed, scales, zp = _nbits(_x(k, n, spread=0.3), bits, block, zero_points)
    inits = [("B", packed), ("scales", scales)]
    inputs = ["a", "B", "scales", "zp" if zp is not None else "", "", "bias" if bias else ""]
    if zp is not None:
        inits.append(("zp", zp))
    if bias:
        inits.append(("bias", _x(n)))
    while not inputs[-1]:
        inputs.pop()
    node = helper.make_node("MatMulNBits", inputs, ["y"], name="mm", domain=MS, K=k, N=n, bits=bits,
                            block_size=block)
    a = _x(1, 6, k)
    graph = _check(_model([node], {"a": a}, ["y"], inits), {"a": a}, atol=1e-4)
    assert [n.op for n in graph.nodes].count("Conv2d") == 1           # a linear layer (1x1 convolution)


def test_matmul_nbits_refuses_a_block_size_it_does_not_know():
    packed, scales, _ = _nbits(_x(32, 8), 4, 16, False)
    node = helper.make_node("MatMulNBits", ["a", "B", "scales"], ["y"], name="mm", domain=MS, K=32, N=8, bits=4,
                            block_size=12)
    a = _x(1, 2, 32)
    with pytest.raises(UnsupportedOperatorError, match="block_size 12"):
        import_onnx(_model([node], {"a": a}, ["y"], [("B", packed), ("scales", scales)]))


@pytest.mark.parametrize("quant_type, k, n, block", [(0, 32, 24, 16), (1, 40, 9, 32), (1, 7, 5, 64)])
def test_matmul_bnb4_dequantizes_as_onnxruntime_does(quant_type, k, n, block):
    """MatMulBnb4 (FP4 or NF4 codes, two per byte, times a per-block absmax over the transposed weights, the count
    not always a whole number of blocks or bytes) against onnxruntime's own kernel."""
    count = k * n
    packed = RNG.integers(0, 256, -(-count // 2)).astype(np.uint8)
    absmax = np.abs(_x(-(-count // block))) + 0.1
    node = helper.make_node("MatMulBnb4", ["a", "B", "absmax"], ["y"], name="mm", domain=MS, K=k, N=n,
                            block_size=block, quant_type=quant_type)
    a = _x(1, 6, k)
    graph = _check(_model([node], {"a": a}, ["y"], [("B", packed), ("absmax", absmax)]), {"a": a}, atol=1e-4)
    assert [n.op for n in graph.nodes].count("Conv2d") == 1


def test_matmul_bnb4_refuses_an_unknown_quant_type():
    node = helper.make_node("MatMulBnb4", ["a", "B", "absmax"], ["y"], name="mm", domain=MS, K=32, N=8,
                            block_size=32, quant_type=2)
    a = _x(1, 2, 32)
    with pytest.raises(UnsupportedOperatorError, match="quant_type 2"):
        import_onnx(_model([node], {"a": a}, ["y"], [("B", np.zeros(128, np.uint8)),
                                                      ("absmax", np.ones(8, np.float32))]))


# ---- a whole decoder as onnxruntime-genai writes it ------------------------------------------------------------------
def _genai_decoder(layers=2, heads=4, kv_heads=2, head=16, vocab=64):
    """onnxruntime-genai's model builder's graph of a Llama-style decoder, written here with onnx.helper (the builder
    needs the weights of a model on disk): token embedding, per layer SimplifiedLayerNormalization, a packed QKV
    MatMulNBits, GroupQueryAttention with rotary embeddings and the KV cache, the output projection,
    SkipSimplifiedLayerNormalization, a SwiGLU MLP; the final norm and the LM head."""
    width = heads * head
    nodes, inits = _seqlens_nodes()
    inits.append(("embed", _x(vocab, width)))
    half = head // 2
    angles = np.arange(64)[:, None] / (10000.0 ** (np.arange(half) / half))[None]
    inits += [("cos_cache", np.cos(angles).astype(np.float32)), ("sin_cache", np.sin(angles).astype(np.float32))]
    nodes.append(helper.make_node("Gather", ["embed", "input_ids"], ["h0"]))
    inputs = {}
    outputs = ["logits"]
    hidden = "h0"
    for i in range(layers):
        inits += [(f"ln{i}", (1 + _x(width, spread=0.1))), (f"post{i}", (1 + _x(width, spread=0.1)))]
        nodes.append(helper.make_node("SimplifiedLayerNormalization", [hidden, f"ln{i}"], [f"n{i}"], axis=-1,
                                      epsilon=1e-5))
        packed, scales, _ = _nbits(_x(width, width + 2 * kv_heads * head, spread=0.3), 4, 16, False)
        inits += [(f"qkv{i}", packed), (f"qkv_s{i}", scales)]
        nodes.append(helper.make_node("MatMulNBits", [f"n{i}", f"qkv{i}", f"qkv_s{i}"], [f"qkv_out{i}"], domain=MS,
                                      K=width, N=width + 2 * kv_heads * head, bits=4, block_size=16))
        nodes.append(helper.make_node(
            "GroupQueryAttention", [f"qkv_out{i}", "", "", f"past.{i}.key", f"past.{i}.value", "seqlens_k", "total",
                                    "cos_cache", "sin_cache"], [f"attn{i}", f"present.{i}.key", f"present.{i}.value"],
            name=f"layers.{i}.attn", domain=MS, num_heads=heads, kv_num_heads=kv_heads, do_rotary=1,
            scale=1 / np.sqrt(head), local_window_size=-1))
        inits.append((f"o{i}", _x(width, width, spread=0.2)))
        nodes.append(helper.make_node("MatMul", [f"attn{i}", f"o{i}"], [f"o_out{i}"]))
        nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [f"o_out{i}", hidden, f"post{i}"],
                                      [f"m{i}", "", "", f"res{i}"], domain=MS, epsilon=1e-5))
        inits += [(f"gate{i}", _x(width, 48, spread=0.2)), (f"up{i}", _x(width, 48, spread=0.2)),
                  (f"down{i}", _x(48, width, spread=0.2))]
        nodes += [helper.make_node("MatMul", [f"m{i}", f"gate{i}"], [f"g{i}"]),
                  helper.make_node("Sigmoid", [f"g{i}"], [f"gs{i}"]),
                  helper.make_node("Mul", [f"g{i}", f"gs{i}"], [f"silu{i}"]),
                  helper.make_node("MatMul", [f"m{i}", f"up{i}"], [f"u{i}"]),
                  helper.make_node("Mul", [f"silu{i}", f"u{i}"], [f"gu{i}"]),
                  helper.make_node("MatMul", [f"gu{i}", f"down{i}"], [f"d{i}"]),
                  helper.make_node("Add", [f"d{i}", f"res{i}"], [f"h{i + 1}"])]
        hidden = f"h{i + 1}"
        outputs += [f"present.{i}.key", f"present.{i}.value"]
        inputs[f"past.{i}"] = None
    inits += [("final", (1 + _x(width, spread=0.1))), ("head", _x(width, vocab, spread=0.2))]
    nodes += [helper.make_node("SimplifiedLayerNormalization", [hidden, "final"], ["nf"], axis=-1, epsilon=1e-5),
              helper.make_node("MatMul", ["nf", "head"], ["logits"])]
    graph_inputs = [_vi("input_ids", TensorProto.INT64, ("batch", "tokens")),
                    _vi("attention_mask", TensorProto.INT64, ("batch", "total"))]
    for i in range(layers):
        graph_inputs += [_vi(f"past.{i}.{r}", TensorProto.FLOAT, ("batch", kv_heads, "past", head))
                         for r in ("key", "value")]
    graph = helper.make_graph(nodes, "genai", graph_inputs, [_vi(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 9
    return model


def _steps(model, layers=2, kv_heads=2, head=16, vocab=64):
    """The prompt's feeds (8 tokens, an empty cache) and the next decode step's (its cache onnxruntime's present)."""
    session = ort.InferenceSession(model.SerializeToString())
    prompt = {"input_ids": RNG.integers(0, vocab, (1, 8)).astype(np.int64),
              "attention_mask": np.ones((1, 8), np.int64)}
    for i in range(layers):
        for role in ("key", "value"):
            prompt[f"past.{i}.{role}"] = np.zeros((1, kv_heads, 0, head), np.float32)
    outs = dict(zip([o.name for o in session.get_outputs()], session.run(None, prompt)))
    step = {"input_ids": RNG.integers(0, vocab, (1, 1)).astype(np.int64), "attention_mask": np.ones((1, 9), np.int64)}
    for i in range(layers):
        for role in ("key", "value"):
            step[f"past.{i}.{role}"] = outs[f"present.{i}.{role}"]
    return prompt, step


@pytest.mark.parametrize("which", ["prompt", "decode"])
def test_a_genai_decoder_runs_on_fsim_bit_exact_with_its_linear_layers_on_the_accelerator(which, tmp_path,
                                                                                          monkeypatch):
    from vta.compiler.options import CompileOptions
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    model = _genai_decoder()
    feeds = dict(zip(("prompt", "decode"), _steps(model)))[which]
    want = dict(zip([o.name for o in model.graph.output],
                    ort.InferenceSession(model.SerializeToString()).run(None, feeds)))
    graph = import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()})
    floats = run_float(graph, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(floats[name], value, atol=2e-4, rtol=1e-3, err_msg=name)
    path = tmp_path / "genai.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "calib.npz", **feeds)
    options = CompileOptions(calibration=str(tmp_path / "calib.npz"), policy="accel",
                             input_shapes={k: v.shape for k, v in feeds.items()})
    compiled = compile_model(str(path), VTAConfig(), options)
    result = run(compiled, feeds, target="fsim")
    ref = qops.run_reference(compiled.graph, feeds)
    for name in ref:
        np.testing.assert_array_equal(result.outputs[name], ref[name])
    logits, expected = result.outputs["logits"].reshape(-1), want["logits"].reshape(-1)
    assert float(logits @ expected / np.linalg.norm(logits) / np.linalg.norm(expected)) > 0.98
    accel = {s.node.name for s in compiled.steps if isinstance(s, AccelStep) and s.node.op in ("QConv2d", "QMatMul")}
    assert {f"layers.{i}.attn" for i in range(2)} & {n.split("_")[0] for n in accel} or len(accel) >= 12


def test_vta_run_takes_a_prompt_with_an_empty_cache_from_input_shapes_alone(capsys, tmp_path, monkeypatch):
    """``--input-shape past.N.key=1x2x0x16``: the import drops the empty cache, the random attention mask nothing
    reads is ones, and onnxruntime (fed the empty cache) is the float model the run measures against."""
    from vta.cli import main
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = tmp_path / "genai.onnx"
    onnx.save(_genai_decoder(), str(path))
    shapes = ["input_ids=1x8", "attention_mask=1x8"] + [f"past.{i}.{r}=1x2x0x16" for i in range(2)
                                                        for r in ("key", "value")]
    argv = ["run", str(path), "--target", "fsim", "--no-progress"]
    for shape in shapes:
        argv += ["--input-shape", shape]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "matches_integer_reference: True" in out
    assert f"error against the float model (onnxruntime on {path})" in out


def test_an_empty_cache_is_dropped_when_the_new_keys_shape_is_known_only_after_folding():
    """optimum's Llama export: the new keys come from a Reshape whose target is computed from ``Shape`` nodes, so
    their shape is known only after a fold and an inference, with no Shape left to fold; the cache's Concat still
    drops its empty past (it once reached the import as a tensor of no elements)."""
    x, past = _x(1, 8, 32), np.zeros((1, 2, 0, 16), np.float32)
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Slice", ["shape", "zero", "two"], ["lead"]),
             helper.make_node("Concat", ["lead", "heads"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["split"]),
             helper.make_node("Transpose", ["split"], ["keys"], perm=[0, 2, 1, 3]),
             helper.make_node("Concat", ["past", "keys"], ["present"], axis=-2),
             helper.make_node("ReduceSum", ["present", "axes"], ["out"], keepdims=0)]
    inits = [("zero", np.array([0])), ("two", np.array([2])), ("heads", np.array([2, 16])), ("axes", np.array([2]))]
    model = _model(nodes, {"x": x, "past": past}, ["present", "out"], inits)
    graph = _check(model, {"x": x, "past": past})
    assert graph.tensors["present"].shape == (1, 2, 8, 16)


# ---- Attention with a past state (onnxruntime's GPT-2 converter) -----------------------------------------------------
def _gpt2_attention(*, batch=1, tokens=1, past=4, mask="2d", heads=2, head=16):
    """x ``[B, S, 32]`` -> com.microsoft Attention (fused QKV weights, unidirectional) with ``past [2, B, N, P, H]``
    and a ``mask_index`` graph input (``"2d"``: ``[B, P + S]`` of 0/1; ``"1d"``: ``[B]`` end positions; None) ->
    y and present."""
    width = heads * head
    ins = ["x", "w", "b", "mask" if mask else "", "past"]
    nodes = [helper.make_node("Attention", ins, ["y", "present"], name="attn", domain=MS, num_heads=heads,
                              unidirectional=1)]
    inits = [("w", _x(width, 3 * width, spread=0.3)), ("b", _x(3 * width, spread=0.1))]
    feeds = {"x": _x(batch, tokens, width), "past": _x(2, batch, heads, past, head)}
    if mask == "2d":
        feeds["mask"] = np.ones((batch, past + tokens), np.int64)
    elif mask == "1d":
        feeds["mask"] = np.full(batch, past + tokens, np.int64)
    model = _model(nodes, {k: v for k, v in feeds.items()}, ["y", "present"], inits)
    for vi in model.graph.input:                      # onnxruntime's kernel takes int32 masks
        if vi.name == "mask":
            vi.type.tensor_type.elem_type = TensorProto.INT32
    if mask:
        feeds["mask"] = feeds["mask"].astype(np.int32)
    return model, feeds


@pytest.mark.parametrize("tokens, past, mask", [(1, 4, "2d"), (3, 4, "2d"), (1, 4, "1d"), (1, 5, None),
                                                (4, 0, "2d")])
def test_attention_with_a_past_state(tokens, past, mask):
    """GPT-2's decode step (and a prompt with an empty past) as onnxruntime's converter writes it: the present is the
    past then the new keys and values; causal bottom-right; the mask over past and new keys computed at run time."""
    model, feeds = _gpt2_attention(tokens=tokens, past=past, mask=mask)
    wide = {k: v.astype(np.int64) if v.dtype == np.int32 else v for k, v in feeds.items()}
    names = ["y", "present"]
    want = dict(zip(names, ort.InferenceSession(model.SerializeToString()).run(None, feeds)))
    graph = import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()})
    got = run_float(graph, wide)
    for name in names:
        np.testing.assert_allclose(got[name], want[name], atol=3e-5, rtol=1e-4, err_msg=name)
    qgraph = quantize(graph, wide)
    ref = qops.run_reference(qgraph, wide)
    for name, value in cpu.run_cpu(qgraph, wide).items():
        np.testing.assert_array_equal(value, ref[name])


def test_attention_with_a_padded_past_masks_its_keys():
    """Batch 2, row 1's first two past positions padded (mask 0): onnxruntime's output, row by row."""
    model, feeds = _gpt2_attention(batch=2, tokens=1, past=4)
    feeds["mask"][1, :2] = 0
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    graph = import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()})
    wide = {k: v.astype(np.int64) if v.dtype == np.int32 else v for k, v in feeds.items()}
    np.testing.assert_allclose(run_float(graph, wide)["y"], want, atol=3e-5, rtol=1e-4)


def test_attention_with_a_past_of_another_shape_is_refused():
    model, _ = _gpt2_attention()
    past = next(vi for vi in model.graph.input if vi.name == "past")
    past.type.tensor_type.shape.dim[2].dim_value = 3              # 3 heads for num_heads 2
    with pytest.raises(UnsupportedOperatorError, match=r"a past of shape \[2, 1, 3, 4, 16\]"):
        import_onnx(model)


# ---- MultiHeadAttention with a past (onnxruntime's optimized Whisper, T5, BART decoders) -----------------------------
def _mha_past(*, batch=1, tokens=1, past=4, mask="2d", unidirectional=1, heads=2, head=16):
    """q, k, v projections of x ``[B, S, 32]`` -> com.microsoft MultiHeadAttention with ``past_key``/``past_value``
    ``[B, N, P, H]`` (graph inputs) and a ``key_padding_mask`` graph input (``"2d"`` ``[B, P + S]`` 0/1, ``"1d"``
    ``[B]`` end positions, None) -> y, present_key, present_value."""
    width = heads * head
    nodes = [helper.make_node("MatMul", ["x", f"w{r}"], [r]) for r in "qkv"]
    ins = ["q", "k", "v", "", "mask" if mask else "", "", "past_key", "past_value"]
    nodes.append(helper.make_node("MultiHeadAttention", ins, ["y", "present_key", "present_value"], name="mha",
                                  domain=MS, num_heads=heads, unidirectional=unidirectional))
    inits = [(f"w{r}", _x(width, width, spread=0.3)) for r in "qkv"]
    feeds = {"x": _x(batch, tokens, width), "past_key": _x(batch, heads, past, head),
             "past_value": _x(batch, heads, past, head)}
    if mask == "2d":
        feeds["mask"] = np.ones((batch, past + tokens), np.int64)
    elif mask == "1d":
        feeds["mask"] = np.full(batch, past + tokens, np.int64)
    model = _model(nodes, feeds, ["y", "present_key", "present_value"], inits)
    for vi in model.graph.input:
        if vi.name == "mask":
            vi.type.tensor_type.elem_type = TensorProto.INT32
    if mask:
        feeds["mask"] = feeds["mask"].astype(np.int32)
    return model, feeds


@pytest.mark.parametrize("tokens, past, mask, unidirectional", [(1, 4, "2d", 1), (3, 4, "2d", 1), (1, 5, None, 0),
                                                                (2, 4, "1d", 1), (4, 0, None, 1)])
def test_multi_head_attention_with_a_past(tokens, past, mask, unidirectional):
    model, feeds = _mha_past(tokens=tokens, past=past, mask=mask, unidirectional=unidirectional)
    wide = {k: v.astype(np.int64) if v.dtype == np.int32 else v for k, v in feeds.items()}
    names = ["y", "present_key", "present_value"]
    want = dict(zip(names, ort.InferenceSession(model.SerializeToString()).run(None, feeds)))
    graph = import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()})
    got = run_float(graph, {k: v for k, v in wide.items() if k in graph.inputs})
    for name in names:
        np.testing.assert_allclose(got[name], want[name], atol=3e-5, rtol=1e-4, err_msg=name)
    qgraph = quantize(graph, {k: v for k, v in wide.items() if k in graph.inputs})
    ref = qops.run_reference(qgraph, {k: v for k, v in wide.items() if k in graph.inputs})
    for name, value in cpu.run_cpu(qgraph, {k: v for k, v in wide.items() if k in graph.inputs}).items():
        np.testing.assert_array_equal(value, ref[name])
