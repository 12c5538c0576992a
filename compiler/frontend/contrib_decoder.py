"""onnxruntime's decoder operators (domain ``com.microsoft``), as onnxruntime-genai's model builder writes a Llama-,
Mistral-, Qwen- or Phi-style decoder, rewritten into standard nodes (the mechanism of :mod:`.contrib`).

- ``GroupQueryAttention``: packed ``query [B, S, (N + 2 kvN) H]`` or separate query, key and value ``[B, S, . H]``,
  each split into heads; with ``do_rotary``, the rotary embedding of Q and K (a standard ``RotaryEmbedding`` node);
  then ONNX's ``Attention`` of opset 23 over the heads (grouped-query heads, the past keys and values ``[B, kvN, P,
  H]`` concatenated before the new ones as ``present_key``/``present_value``, causal masking aligned at the bottom
  right, ``softcap``, ``scale``), both written in the lab's own domain (:data:`.contrib.LAB_DOMAIN`) and rewritten
  in the next round by :mod:`.onnx_fused`'s rewrites.
  onnxruntime reads two run-time inputs, ``seqlens_k`` (the index of each sequence's last valid token,
  ``ReduceSum(attention_mask) - 1``) and ``total_sequence_length`` (the attention mask's length):

  * the total length must be constant once the graph's shapes are folded (the builder computes it from the mask's
    shape), and equal to ``P + S``: the lab grows the cache by concatenation, as the non-shared buffer does;
  * the first prompt (``S`` equal to the total length, no past) attends causally, to each sequence's first
    ``seqlens_k + 1`` keys (so a padded row's padded queries give onnxruntime's outputs too), and rotates position
    ``s``;
  * any other step (a decode step, ``S = 1``, or a later chunk of a prompt) places its queries after each sequence's
    ``seqlens_k + 1 - S`` valid past positions, as onnxruntime does: the rotary positions and a mask of the past
    keys beyond that are computed at run time from ``seqlens_k`` (a runtime mask, :mod:`.masks`). With no padding
    these are the ``P`` past positions; with padding, the attention output still matches onnxruntime's, but
    onnxruntime then writes the new keys inside the buffer, at the first invalid position, where the lab's
    ``present`` has them at the end.

  Refused with the reason: ``local_window_size`` smaller than the total length in a step that is not the first
  prompt, ``smooth_softmax``, ``head_sink``, ``attention_bias``, ``qk_output``, a shared past/present buffer, a
  ``sliding_window_cache`` (Gemma 2's sliding layers: a ring of the window's capacity).
- ``RotaryEmbedding`` (com.microsoft): the standard ``RotaryEmbedding`` of opset 23 with its inputs reordered;
  ``position_ids`` of one element is an offset (positions ``offset + s``), ``scale`` other than 1 and packed
  batching are refused.
- ``Attention`` with a ``past`` state ``[2, B, N, P, H]`` (onnxruntime's GPT-2 converter): the new keys and values
  after the cached ones (``present``), causal masking aligned at the bottom right, a mask over past and new keys;
  without a past, :mod:`.contrib`'s Attention. ``MultiHeadAttention`` with ``past_key``/``past_value`` ``[B, N, P,
  H]`` (onnxruntime's optimized Whisper, T5 and BART decoders) likewise, with ``present_key``/``present_value``.
- ``MatMulNBits``: the block-quantized weights (2, 4 or 8 bits, with ``scales``, optional ``zero_points``, ``g_idx``
  and ``bias``) dequantized at import into a float ``[K, N]`` constant of a MatMul (and an Add of the bias), which the
  lab then quantizes as any linear layer's weights.
- ``MatMulBnb4`` (onnxruntime's ``MatMulBnb4Quantizer``: bitsandbytes' FP4 or NF4 codes times a per-block absmax)
  likewise.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from .contrib import (
    ATTENTION_ATTRS,
    LAB_DOMAIN,
    MHA_ATTRS,
    REWRITES,
    Rewrite,
    _check_attrs,
    _Context,
    _heads,
    _main_name,
    _mask,
    _NeedsShape,
    _only_inputs,
    _only_outputs,
    _Refusal,
    attend_heads,
    attention_projections,
    lengths_mask,
    mha_projections,
)

__all__ = ["DECODER_REWRITES"]

_MASKED = -10000.0
"""The additive term of a past key beyond a sequence's valid length (onnxruntime leaves it out of the softmax; at this
term its weight is 0 in float32)."""


def _dims(ctx: _Context, tensor: str) -> tuple[int, ...] | None:
    """The static shape of ``tensor``, zero dimensions included (an empty KV cache): shape inference's, or the graph
    input's declared one."""
    if tensor in ctx.shapes:
        return ctx.shapes[tensor]
    for vi in ctx.model.graph.input:
        if vi.name == tensor and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                return tuple(d.dim_value for d in dims)
    return None


def _scalar(ctx: _Context, tensor: str, what: str) -> int:
    value = ctx.consts.get(tensor)
    if value is None:
        raise _NeedsShape(f"its {what} input {tensor!r} is computed at run time; the lab needs it constant (the "
                          f"model builder computes it from the attention mask's static shape)")
    if value.size != 1:
        raise _Refusal(f"a {what} of shape {list(value.shape)} (one value)")
    return int(value.reshape(-1)[0])


def _int64(ctx: _Context, tensor: str, name: str) -> str:
    return ctx.emit("Cast", [tensor], name, to=TensorProto.INT64)


# ---- GroupQueryAttention ---------------------------------------------------------------------------------------------
_GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
               "sin_cache", "position_ids", "attention_bias", "head_sink")


def _gqa_inputs(node: onnx.NodeProto) -> dict[str, str]:
    given = dict(zip(_GQA_INPUTS, list(node.input) + [""] * (len(_GQA_INPUTS) - len(node.input))))
    for role in ("attention_bias", "head_sink"):
        if given[role]:
            raise _Refusal(f"input {role} ({given[role]!r})")
    if not given["seqlens_k"] or not given["total_sequence_length"]:
        raise _Refusal("no seqlens_k or total_sequence_length input (the operator needs both)")
    if bool(given["key"]) != bool(given["value"]):
        raise _Refusal("a key without a value or the reverse")
    if bool(given["past_key"]) != bool(given["past_value"]):
        raise _Refusal("a past_key without a past_value or the reverse")
    return given


def _gqa_heads(ctx: _Context, node: onnx.NodeProto, given: dict[str, str], heads: int, kv_heads: int
               ) -> tuple[list[str], int, int, int]:
    """Q ``[B, N, S, H]``, K and V ``[B, kvN, S, H]`` of the packed or separate inputs; with batch, tokens and H."""
    name = _main_name(node)
    q_shape = _dims(ctx, given["query"])
    if q_shape is None:
        raise _NeedsShape(f"a query {given['query']!r} whose static shape is not known")
    if len(q_shape) != 3:
        raise _Refusal(f"a query of shape {list(q_shape)} (only [batch, tokens, hidden])")
    batch, tokens, width = q_shape
    packed = not given["key"]
    parts = heads + 2 * kv_heads if packed else heads
    if width % parts:
        raise _Refusal(f"a query of width {width} for {heads} query heads and {kv_heads} key/value heads"
                       f"{' (packed Q, K and V)' if packed else ''}")
    head = width // parts
    if packed:
        sizes = ctx.const(f"{name}_qkv_sizes", np.array([heads * head, kv_heads * head, kv_heads * head], np.int64))
        q, k, v = (ctx.fresh(f"{name}_{role}") for role in "qkv")
        ctx.nodes.append(helper.make_node("Split", [given["query"], sizes], [q, k, v], name=ctx.fresh(f"{name}_split"),
                                          axis=2))
    else:
        q, k, v = given["query"], given["key"], given["value"]
        for role in ("key", "value"):
            shape = _dims(ctx, given[role])
            if shape != (batch, tokens, kv_heads * head):
                raise _Refusal(f"a {role} of shape {list(shape) if shape else 'unknown'} for a query of shape "
                               f"{list(q_shape)} (it must be [{batch}, {tokens}, {kv_heads * head}])")
    split = [_heads(ctx, t, f"{name}_{role}", n, head, [0, 2, 1, 3]) for t, role, n in
             ((q, "q", heads), (k, "k", kv_heads), (v, "v", kv_heads))]
    return split, batch, tokens, head


def _past_length(ctx: _Context, given: dict[str, str], batch: int, kv_heads: int, head: int) -> int:
    if not given["past_key"]:
        return 0
    lengths = set()
    for role in ("past_key", "past_value"):
        shape = _dims(ctx, given[role])
        if shape is None:
            raise _NeedsShape(f"a {role} {given[role]!r} whose static shape is not known")
        if len(shape) != 4 or shape[:2] != (batch, kv_heads) or shape[3] != head:
            raise _Refusal(f"a {role} of shape {list(shape)} (only [batch, kv_num_heads, past, head size] = "
                           f"[{batch}, {kv_heads}, P, {head}])")
        lengths.add(shape[2])
    if len(lengths) != 1:
        raise _Refusal(f"past_key and past_value of {' and '.join(map(str, sorted(lengths)))} positions")
    return lengths.pop()


def _positions(ctx: _Context, name: str, given: dict[str, str], tokens: int, first: bool) -> str:
    """The rotary positions ``[B or 1, S]`` (int64): the given ``position_ids``; ``s`` for the first prompt; else
    ``seqlens_k + 1 - S + s``, computed at run time."""
    if given["position_ids"]:
        return _int64(ctx, given["position_ids"], f"{name}_positions")
    steps = np.arange(tokens, dtype=np.int64)[None]
    if first:
        return ctx.const(f"{name}_positions", steps)
    past = _past_valid(ctx, name, given["seqlens_k"], tokens)
    return ctx.emit("Add", [past, ctx.const(f"{name}_steps", steps)], f"{name}_positions")


def _past_valid(ctx: _Context, name: str, seqlens_k: str, tokens: int) -> str:
    """Each sequence's valid past length ``seqlens_k + 1 - S`` as int64 ``[B, 1]``."""
    lengths = _int64(ctx, seqlens_k, f"{name}_seqlens")
    lengths = ctx.emit("Add", [lengths, ctx.const(f"{name}_past_offset", np.int64(1 - tokens))], f"{name}_past_len")
    return ctx.emit("Unsqueeze", [lengths, ctx.const(f"{name}_past_axis", np.array([1], np.int64))],
                    f"{name}_past_valid")


def _rotate(ctx: _Context, name: str, x: str, given: dict[str, str], positions: str, interleaved: int) -> str:
    cos = ctx.consts.get(given["cos_cache"])
    if cos is None or cos.ndim != 2:
        raise _Refusal(f"a cos_cache {given['cos_cache']!r} that is not a constant [max positions, rotary dim / 2]")
    out = ctx.fresh(f"{name}_rotary")
    ctx.nodes.append(helper.make_node("RotaryEmbedding", [x, given["cos_cache"], given["sin_cache"], positions], [out],
                                      name=out, domain=LAB_DOMAIN, interleaved=interleaved,
                                      rotary_embedding_dim=2 * cos.shape[1]))
    return out


def _group_query_attention(ctx: _Context, node: onnx.NodeProto) -> None:
    """GroupQueryAttention as heads, rotary embeddings and opset 23's Attention; see the module docstring."""
    a = _check_attrs(node, {"num_heads", "kv_num_heads", "scale", "local_window_size", "do_rotary",
                            "rotary_interleaved", "softcap", "smooth_softmax", "mask_filter_value", "qk_output",
                            "sliding_window_cache"})
    _only_outputs(ctx, node, ("output", "present_key", "present_value"))
    if int(a.get("sliding_window_cache", 0)):
        raise _Refusal("sliding_window_cache=1 (a KV cache of the window's capacity, filled as a ring; the lab grows "
                       "its cache by concatenation)")
    for flag in ("smooth_softmax", "qk_output"):
        if int(a.get(flag, 0)):
            raise _Refusal(f"{flag}={int(a[flag])}")
    heads, kv_heads = int(a.get("num_heads", 0)), int(a.get("kv_num_heads", 0))
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise _Refusal(f"num_heads {heads} and kv_num_heads {kv_heads} (both positive, the first a multiple of the "
                       f"second)")
    given = _gqa_inputs(node)
    name = _main_name(node)
    total = _scalar(ctx, given["total_sequence_length"], "total_sequence_length")
    (q, k, v), batch, tokens, head = _gqa_heads(ctx, node, given, heads, kv_heads)
    past = _past_length(ctx, given, batch, kv_heads, head)
    first = tokens == total
    if past + tokens != total and not (first and past == 0):
        raise _Refusal(f"a past of {past} positions and {tokens} new for a total_sequence_length of {total} (the lab "
                       f"concatenates the cache: the total must be past + new, not a shared buffer)")
    if first and past:
        raise _Refusal(f"a first prompt ({tokens} tokens, the total length) with a past of {past} positions")
    window = int(a.get("local_window_size", -1))      # a query sees itself and the window - 1 keys before it
    if window <= 0 or window >= total:
        window = -1
    if window >= 0 and not first:
        raise _Refusal(f"local_window_size {window} below the total length {total} in a step that is not the first "
                       f"prompt (its window start depends on seqlens_k at run time)")
    if int(a.get("do_rotary", 0)) == 1:                  # onnxruntime's test: any other value is no rotary
        if not given["cos_cache"] or not given["sin_cache"]:
            raise _Refusal("do_rotary=1 without cos_cache and sin_cache")
        positions = _positions(ctx, name, given, tokens, first)
        interleaved = int(int(a.get("rotary_interleaved", 0)) == 1)
        q = _rotate(ctx, f"{name}_q", q, given, positions, interleaved)
        k = _rotate(ctx, f"{name}_k", k, given, positions, interleaved)
    scale = float(a.get("scale", 0.0)) or 1.0 / math.sqrt(head)
    attrs: dict[str, Any] = {"is_causal": 1, "scale": scale, "softcap": float(a.get("softcap", 0.0))}
    if window >= 0:
        attrs["left_window_size"] = window - 1
    mask = _key_limit_mask(ctx, name, given["seqlens_k"], tokens, np.arange(tokens) - tokens) if first else \
        _key_limit_mask(ctx, name, given["seqlens_k"], tokens, np.concatenate([np.arange(past), np.full(tokens, -1)]))
    inputs = [q, k, v, mask] + ([given["past_key"], given["past_value"]] if past else [])
    outputs = [ctx.fresh(f"{name}_heads_out")]
    for index in (1, 2):
        outputs.append(node.output[index] if len(node.output) > index and node.output[index] else "")
    while not outputs[-1]:
        outputs.pop()
    ctx.nodes.append(helper.make_node("Attention", inputs, outputs, name=ctx.fresh(f"{name}_attention"),
                                      domain=LAB_DOMAIN, **attrs))
    merged = ctx.emit("Transpose", [outputs[0]], f"{name}_merge", perm=[0, 2, 1, 3])
    ctx.nodes.append(helper.make_node(
        "Reshape", [merged, ctx.const(f"{name}_out_shape", np.array([0, 0, heads * head], np.int64))],
        [node.output[0]], name=name))


def _key_limit_mask(ctx: _Context, name: str, seqlens_k: str, tokens: int, index: np.ndarray) -> str:
    """The additive mask ``[B, 1, 1, L]`` keeping key ``j`` where ``index[j] < seqlens_k + 1 - S`` (the causal order
    is Attention's). After the first prompt ``index`` is the past keys' positions and -1 for the new keys (always
    kept): the past beyond each sequence's valid length goes. In the first prompt it is ``j - S``: keys from each
    sequence's length on go, as onnxruntime masks them for every query (the padded queries' outputs then match its
    too)."""
    return lengths_mask(ctx, f"{name}_mask", _past_valid(ctx, f"{name}_mask", seqlens_k, tokens), index[None],
                        _MASKED)


# ---- Attention with a past state (GPT-2 as onnxruntime's converter writes it) ---------------------------------------
def _attention_with_past(ctx: _Context, node: onnx.NodeProto) -> None:
    """com.microsoft Attention with its ``past`` input ``[2, B, N, P, H]`` (keys, then values) and ``present``
    output ``[2, B, N, P + S, H]``: the new keys and values after the past ones; ``unidirectional`` aligned at the
    bottom right (query ``i`` sees keys ``j <= P + i``); a ``mask_index`` of ``P + S`` keys (2-D 0/1, or 1-D end
    positions; constant or computed at run time). Without a past it is :mod:`.contrib`'s Attention."""
    if len(node.input) <= 4 or not node.input[4]:
        REWRITES["Attention"](ctx, node)
        return
    a = _check_attrs(node, ATTENTION_ATTRS)
    _only_inputs(node, ("input", "weights", "bias", "mask_index", "past"))
    _only_outputs(ctx, node, ("output", "present"))
    if int(a.get("past_present_share_buffer", 0)):
        raise _Refusal("past_present_share_buffer=1 (a cache buffer of fixed length; the lab concatenates)")
    (q, k, v), heads, (head, v_head) = attention_projections(ctx, node, a)
    if head != v_head:
        raise _Refusal(f"a past state with key heads of {head} and value heads of {v_head} (one packed size)")
    shape, past_shape = _dims(ctx, node.input[0]), _dims(ctx, node.input[4])
    if shape is None or past_shape is None:
        raise _NeedsShape("an input or past whose static shape is not known")
    batch = shape[0]
    if len(past_shape) != 5 or past_shape[:3] != (2, batch, heads) or past_shape[4] != head:
        raise _Refusal(f"a past of shape {list(past_shape)} (only [2, batch, heads, past, head size] = "
                       f"[2, {batch}, {heads}, P, {head}])")
    past, name = past_shape[3], _main_name(node)
    qh, kh, vh = (_heads(ctx, t, f"{name}_{role}", heads, head, [0, 2, 1, 3]) for t, role in zip((q, k, v), "qkv"))
    if past:
        for index, role in enumerate("kv"):
            cached = ctx.emit("Gather", [node.input[4], ctx.const(f"{name}_past_{role}_index", np.int64(index))],
                              f"{name}_past_{role}", axis=0)
            joined = ctx.emit("Concat", [cached, kh if role == "k" else vh], f"{name}_all_{role}", axis=2)
            kh, vh = (joined, vh) if role == "k" else (kh, joined)
    if len(node.output) > 1 and node.output[1] and node.output[1] in ctx.used:
        zero = ctx.const(f"{name}_present_axis", np.array([0], np.int64))
        parts = [ctx.emit("Unsqueeze", [t, zero], f"{name}_present_{role}") for t, role in ((kh, "k"), (vh, "v"))]
        ctx.nodes.append(helper.make_node("Concat", parts, [node.output[1]], name=ctx.fresh(f"{name}_present"), axis=0))
    _attend_cached(ctx, node, a, (qh, kh, vh), heads * head, head, 3, node.input[0], past)


def _attend_cached(ctx: _Context, node: onnx.NodeProto, a: dict[str, Any], qkv: tuple[str, str, str], width: int,
                   head: int, mask_index: int, keys: str, past: int) -> None:
    """The attention of heads ``qh [B, N, S, H]`` over keys and values ``[B, N, P + L, .]`` (the ``past`` cached
    ones first, then those of the ``[B, L, .]`` input ``keys``): the key mask input ``mask_index`` and
    ``unidirectional`` (aligned at the bottom right) as :func:`.contrib._mask` reads them, then
    :func:`.contrib.attend_heads` into ``node``'s output 0 ``[B, S, width]``."""
    qh, kh, vh = qkv
    mask = _mask(ctx, node, mask_index, bool(a.get("unidirectional", 0)), float(a.get("mask_filter_value", -10000.0)),
                 node.input[0], keys, past)
    kt = ctx.emit("Transpose", [kh], f"{_main_name(node)}_kt", perm=[0, 1, 3, 2])
    attend_heads(ctx, node, qh, kt, vh, width, float(a.get("scale", 1.0 / math.sqrt(head))), mask)


def _mha_with_past(ctx: _Context, node: onnx.NodeProto) -> None:
    """com.microsoft MultiHeadAttention with ``past_key``/``past_value`` ``[B, N, P, H]`` (onnxruntime's optimized
    decoders: Whisper's, T5's, BART's self-attention): the new keys and values ``[B, L, D]`` after the cached ones,
    as ``present_key``/``present_value``; ``unidirectional`` aligned at the bottom right; a ``key_padding_mask`` of
    ``P + L`` keys. Without a past it is :mod:`.contrib`'s MultiHeadAttention."""
    inputs = list(node.input) + [""] * (8 - len(node.input))
    if not inputs[6] and not inputs[7]:
        REWRITES["MultiHeadAttention"](ctx, node)
        return
    a = _check_attrs(node, MHA_ATTRS)
    _only_inputs(node, ("query", "key", "value", "bias", "key_padding_mask", "attention_bias", "past_key",
                        "past_value"))
    _only_outputs(ctx, node, ("output", "present_key", "present_value"))
    if inputs[5]:
        raise _Refusal(f"input attention_bias ({inputs[5]!r}) with a past")
    if not inputs[6] or not inputs[7]:
        raise _Refusal("a past_key without a past_value or the reverse")
    (q, k, v), heads, (head, v_head) = mha_projections(ctx, node, a)
    q_shape, past_k, past_v = _dims(ctx, inputs[0]), _dims(ctx, inputs[6]), _dims(ctx, inputs[7])
    if q_shape is None or past_k is None or past_v is None:
        raise _NeedsShape("a query or past whose static shape is not known")
    batch = q_shape[0]
    if past_k[:2] != (batch, heads) or past_k[3] != head or past_v != past_k[:3] + (v_head,):
        raise _Refusal(f"past_key and past_value of shapes {list(past_k)} and {list(past_v)} (only [batch, heads, "
                       f"past, head size] = [{batch}, {heads}, P, {head}] and [{batch}, {heads}, P, {v_head}])")
    past, name = past_k[2], _main_name(node)
    qh, kh, vh = (_heads(ctx, t, f"{name}_{role}", heads, size, [0, 2, 1, 3])
                  for t, role, size in ((q, "q", head), (k, "k", head), (v, "v", v_head)))
    if past:
        kh = ctx.emit("Concat", [inputs[6], kh], f"{name}_all_k", axis=2)
        vh = ctx.emit("Concat", [inputs[7], vh], f"{name}_all_v", axis=2)
    for index, tensor in ((1, kh), (2, vh)):
        if len(node.output) > index and node.output[index] and node.output[index] in ctx.used:
            ctx.nodes.append(helper.make_node("Identity", [tensor], [node.output[index]],
                                              name=ctx.fresh(f"{name}_present_{'kv'[index - 1]}")))
    _attend_cached(ctx, node, a, (qh, kh, vh), heads * v_head, head, 4, inputs[1], past)


# ---- RotaryEmbedding -------------------------------------------------------------------------------------------------
def _rotary_embedding(ctx: _Context, node: onnx.NodeProto) -> None:
    """com.microsoft RotaryEmbedding ``(input, position_ids, cos_cache, sin_cache)`` as opset 23's ``(input,
    cos_cache, sin_cache, position_ids)``; a one-element ``position_ids`` is the offset of positions ``offset + s``."""
    a = _check_attrs(node, {"interleaved", "is_packed_batching", "num_heads", "rotary_embedding_dim", "scale"})
    if int(a.get("is_packed_batching", 0)):
        raise _Refusal("is_packed_batching=1")
    if float(a.get("scale", 1.0)) != 1.0:
        raise _Refusal(f"scale {float(a['scale'])} (only 1)")
    if len(node.input) < 4 or not all(node.input[:4]):
        raise _Refusal("fewer than its four inputs (input, position_ids, cos_cache, sin_cache)")
    x, positions, cos, sin = node.input[:4]
    name = _main_name(node)
    shape = _dims(ctx, x)
    if shape is None or len(shape) not in (3, 4):
        raise _NeedsShape(f"an input {x!r} whose static shape [batch, tokens, hidden] or [batch, heads, tokens, "
                          f"head] is not known")
    tokens = shape[1] if len(shape) == 3 else shape[2]
    offset = ctx.consts.get(positions)
    pos_shape = _dims(ctx, positions)
    if (offset is not None and offset.size == 1) or pos_shape == (1,):
        steps = ctx.const(f"{name}_steps", np.arange(tokens, dtype=np.int64)[None])
        positions = ctx.emit("Add", [_int64(ctx, positions, f"{name}_offset"), steps], f"{name}_positions")
    attrs: dict[str, Any] = {k: int(a[k]) for k in ("num_heads", "rotary_embedding_dim") if k in a}
    attrs["interleaved"] = int(int(a.get("interleaved", 0)) == 1)
    if len(shape) == 3 and not attrs.get("num_heads"):
        cache = ctx.consts.get(cos)
        rot = int(attrs.get("rotary_embedding_dim", 0)) or (2 * cache.shape[-1] if cache is not None else 0)
        if not rot or shape[2] % rot:
            raise _Refusal(f"a 3-D input of width {shape[2]} without num_heads (the head size is not known)")
        attrs["num_heads"] = shape[2] // rot
    ctx.nodes.append(helper.make_node("RotaryEmbedding", [x, cos, sin, positions], [node.output[0]], name=name,
                                      domain=LAB_DOMAIN, **attrs))


# ---- MatMulNBits -----------------------------------------------------------------------------------------------------
def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unsigned ``bits``-bit values packed little-end first in the bytes of each row of ``packed``, the first
    ``count`` of each row."""
    per_byte = 8 // bits
    shifts = (np.arange(per_byte) * bits).astype(np.uint8)
    values = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], -1)[..., :count].astype(np.int32)


def _nbits_weight(ctx: _Context, node: onnx.NodeProto, a: dict[str, object]) -> np.ndarray:
    """The float ``[K, N]`` weights of a MatMulNBits node: ``(q - zero_point) * scale`` per block of ``block_size``
    rows of each column (the block of row ``k`` is ``g_idx[k]`` when given)."""
    k_dim, n_dim, bits, block = (int(a.get(key, default)) for key, default in  # type: ignore[call-overload]
                                 (("K", 0), ("N", 0), ("bits", 4), ("block_size", 0)))
    if bits not in (2, 4, 8) or block < 16 or block & (block - 1) or k_dim < 1 or n_dim < 1:
        raise _Refusal(f"bits {bits}, block_size {block}, K {k_dim}, N {n_dim} (bits 2, 4 or 8; a block size a power "
                       f"of two of 16 or more)")
    inputs = list(node.input) + [""] * (6 - len(node.input))
    arrays = []
    for index, role in ((1, "B"), (2, "scales")):
        value = ctx.consts.get(inputs[index])
        if value is None:
            raise _Refusal(f"its {role} input {inputs[index]!r} is computed at run time (the lab needs constants)")
        arrays.append(value)
    packed, scales = arrays
    blocks = -(-k_dim // block)
    if packed.dtype != np.uint8 or packed.size != n_dim * blocks * (block * bits // 8):
        raise _Refusal(f"B of shape {list(packed.shape)} and type {packed.dtype} for K {k_dim}, N {n_dim}, "
                       f"block_size {block}, {bits} bits (uint8 [N, blocks, block * bits / 8])")
    if scales.size != n_dim * blocks:
        raise _Refusal(f"scales of {scales.size} values for {n_dim} columns of {blocks} blocks")
    q = _unpack(packed.reshape(n_dim, blocks, -1), bits, block).reshape(n_dim, blocks * block)[:, :k_dim]
    zero = _zero_points(ctx, inputs[3], bits, n_dim, blocks)
    group = np.arange(k_dim) // block
    if inputs[4]:
        g_idx = ctx.consts.get(inputs[4])
        if g_idx is None or g_idx.size != k_dim:
            raise _Refusal(f"a g_idx input {inputs[4]!r} that is not a constant of K = {k_dim} block indices")
        group = g_idx.reshape(-1).astype(np.int64)
        if group.min() < 0 or group.max() >= blocks:
            raise _Refusal(f"g_idx values outside 0..{blocks - 1}")
    scale = scales.astype(np.float64).reshape(n_dim, blocks)[:, group]
    return ((q - zero[:, group]) * scale).T.astype(np.float32)


def _zero_points(ctx: _Context, tensor: str, bits: int, n_dim: int, blocks: int) -> np.ndarray:
    """The zero points ``[N, blocks]`` (float): ``2**(bits - 1)`` when absent; packed like B when uint8, else one
    value per block."""
    if not tensor:
        return np.full((n_dim, blocks), 2 ** (bits - 1), np.float64)
    value = ctx.consts.get(tensor)
    if value is None:
        raise _Refusal(f"its zero_points input {tensor!r} is computed at run time (the lab needs a constant)")
    if value.dtype == np.uint8:
        per_row = -(-blocks * bits // 8)
        if value.size != n_dim * per_row:
            raise _Refusal(f"packed zero_points of {value.size} bytes for {n_dim} columns of {blocks} blocks")
        return _unpack(value.reshape(n_dim, per_row), bits, blocks).astype(np.float64)
    if value.size != n_dim * blocks:
        raise _Refusal(f"zero_points of {value.size} values for {n_dim} columns of {blocks} blocks")
    return value.astype(np.float64).reshape(n_dim, blocks)


def _matmul_nbits(ctx: _Context, node: onnx.NodeProto) -> None:
    """MatMulNBits ``A [..., K] x dequantized B [K, N] (+ bias)`` as a MatMul of a float constant (and an Add)."""
    a = _check_attrs(node, {"K", "N", "bits", "block_size", "accuracy_level"})
    _only_outputs(ctx, node, ("Y",))
    _dequantized_matmul(ctx, node, _nbits_weight(ctx, node, a), node.input[5] if len(node.input) > 5 else "")


def _dequantized_matmul(ctx: _Context, node: onnx.NodeProto, weight: np.ndarray, bias_name: str = "") -> None:
    """``node``'s output as a MatMul of its input 0 by the float ``weight`` ``[K, N]`` (a weight-only quantized
    operator's, dequantized), plus the constant bias ``bias_name`` of N values when given."""
    name = _main_name(node)
    w = ctx.const(f"{name}_weight", weight)
    if not bias_name:
        ctx.nodes.append(helper.make_node("MatMul", [node.input[0], w], [node.output[0]], name=name))
        return
    bias = ctx.consts.get(bias_name)
    if bias is None or bias.size != weight.shape[1]:
        raise _Refusal(f"a bias {bias_name!r} that is not a constant of N = {weight.shape[1]} values")
    product = ctx.emit("MatMul", [node.input[0], w], name)
    ctx.nodes.append(helper.make_node("Add", [product, ctx.const(f"{name}_bias", bias.astype(np.float32))],
                                      [node.output[0]], name=ctx.fresh(f"{name}_bias")))


# ---- MatMulBnb4 ------------------------------------------------------------------------------------------------------
_BNB4_CODES = {
    0: np.array([0.0, 0.005208333333, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25,
                 -0.0, -0.005208333333, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667, -0.25], np.float32),
    1: np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                 -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0], np.float32),
}
"""bitsandbytes' 4-bit codes by MatMulBnb4's ``quant_type``: 0 FP4, 1 NF4 (code -> value in units of the block's
absmax)."""


def _matmul_bnb4(ctx: _Context, node: onnx.NodeProto) -> None:
    """MatMulBnb4 ``A [..., K] x dequantized B`` as a MatMul of a float ``[K, N]`` constant. B holds the transposed
    weights ``[N, K]`` flattened, cut into blocks of ``block_size`` values, each value a 4-bit code (two per byte, the
    first in the high nibble) times its block's ``absmax``; checked against onnxruntime's own kernel."""
    a = _check_attrs(node, {"K", "N", "block_size", "quant_type"})
    _only_outputs(ctx, node, ("Y",))
    k_dim, n_dim, block, kind = (int(a.get(key, -1)) for key in ("K", "N", "block_size", "quant_type"))
    if kind not in _BNB4_CODES or block < 16 or block & (block - 1) or k_dim < 1 or n_dim < 1:
        raise _Refusal(f"quant_type {kind}, block_size {block}, K {k_dim}, N {n_dim} (quant_type 0 FP4 or 1 NF4; a "
                       f"block size a power of two of 16 or more)")
    packed, absmax = (ctx.consts.get(node.input[k]) if len(node.input) > k else None for k in (1, 2))
    if packed is None or absmax is None:
        raise _Refusal("its B or absmax input is computed at run time (the lab needs constants)")
    count = n_dim * k_dim
    if packed.dtype != np.uint8 or packed.size != -(-count // 2) or absmax.size != -(-count // block):
        raise _Refusal(f"B of {packed.size} {packed.dtype} values and absmax of {absmax.size} for K {k_dim}, N "
                       f"{n_dim}, block_size {block} (uint8 [(N * K + 1) / 2], absmax [(N * K + block_size - 1) / "
                       f"block_size])")
    flat = packed.reshape(-1)
    codes = np.stack([flat >> 4, flat & 15], axis=-1).reshape(-1)[:count]
    scale = np.repeat(absmax.reshape(-1).astype(np.float32), block)[:count]
    _dequantized_matmul(ctx, node, (_BNB4_CODES[kind][codes] * scale).reshape(n_dim, k_dim).T)


DECODER_REWRITES: dict[str, Rewrite] = {
    "Attention": _attention_with_past,
    "MultiHeadAttention": _mha_with_past,
    "GroupQueryAttention": _group_query_attention,
    "RotaryEmbedding": _rotary_embedding,
    "MatMulNBits": _matmul_nbits,
    "MatMulBnb4": _matmul_bnb4,
}
"""The com.microsoft decoder operators rewritten here (given to :func:`.contrib.rewrite_contrib` by the frontend)."""
