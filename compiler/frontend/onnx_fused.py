"""ONNX's own fused operators of opsets 23 and later, rewritten into the standard nodes the rules already import.

torch's exporter (``dynamo=True``) writes ``scaled_dot_product_attention`` as opset 23's ``Attention`` and
``rms_norm`` as ``RMSNormalization`` once the opset is 23 or more. RMSNormalization has a rule of its own
(:mod:`.onnx_transformer_rules`); the operators here are replaced before import, with the mechanism of
:mod:`.contrib` (:func:`.contrib.rewrite_nodes`), so the fusions, the runtime masks and the quantizer see the graph
an exporter writes at opset 22:

- ``Attention`` (opsets 23 to 25), 4-D ``[batch, heads, tokens, head size]`` or 3-D ``[batch, tokens, hidden]``
  query, key and value (with ``q_num_heads`` and ``kv_num_heads``): per-head Reshape/Transpose of 3-D inputs; the
  KV cache's Concat of ``past_key``/``past_value`` along the tokens (``present_key``/``present_value`` are those
  Concats); grouped-query attention's repeat of each key/value head (a Split and a Concat over the head axis);
  MatMul of Q by K^T; Mul by ``scale`` (default ``1/sqrt(head size)``); ``softcap`` as ``softcap *
  tanh(scores / softcap)``; Add of the causal and sliding-window masks as one constant (``-inf`` where masked,
  aligned at the bottom right as the operator is: a query ``i`` sees keys ``j <= i + past``); Add of
  ``attn_mask`` (a boolean mask as ``Where(mask, 0, -inf)``; one shorter than the keys padded with ``-inf``, or, a
  float graph input, the keys past it sliced off); Softmax;
  MatMul by V; Transpose and Reshape back for 3-D. A mask from a graph input then becomes a runtime mask
  (:mod:`.masks`), a constant one a fused softmax bias.
- ``SwiGLU`` (opset 28): ``Swish(a, alpha) * b``.
- ``Einsum`` (opset 12; torch.einsum, Keras' attention): one operand permuted, or two as a batched matrix product
  (Transpose, Reshape, MatMul, Reshape, Transpose), so a projection by a constant is a linear layer and a product
  of two activations an attention product.
- ``RotaryEmbedding`` (opset 23): the rotated part of each head in halves (or even and odd elements), ``x1 cos - x2
  sin`` and ``x1 sin + x2 cos`` put back, the rest passed through; the caches gathered by ``position_ids`` (an
  Embedding when those are an input).
- ``CausalConvWithState`` (opset 27): the carried ``k - 1`` positions (``past_state``, else zeros) before the input,
  a depthwise Conv of kernel ``k`` with the bias, Swish for ``silu``/``swish``; ``present_state`` the last ``k - 1``
  positions of the joined sequence.

``Attention``'s fourth output, ``qk_matmul_output``, is the tensor its ``qk_matmul_output_mode`` names (opset 25's
text): 0 the scaled product, 1 that after the softcap, 2 that with the causal and ``attn_mask`` terms added, 3 the
Softmax.

``Attention``'s ``nonpad_kv_seqlen`` (opset 24: an external KV cache's valid lengths, ``[batch]``) is a mask computed
at run time from the lengths: key ``j`` kept where ``j < nonpad[b]`` and, with ``is_causal``, where ``j <= i +
nonpad[b] - S``; the lab takes the lengths as any integers (:func:`.masks.mask_lengths`).

Refused with the reason: ``nonpad_kv_seqlen`` together with an ``attn_mask``, a past or a sliding window, and the
other fused operators of these opsets (TensorScatter, LinearAttention), which the lab has no rewrite for.
"""
from __future__ import annotations

import math
import re

import numpy as np
import onnx
from onnx import TensorProto, helper

from .contrib import (
    Rewrite,
    _check_attrs,
    _Context,
    _heads,
    _main_name,
    _NeedsShape,
    _only_outputs,
    _Refusal,
    _refuse,
    lengths_mask,
    rewrite_nodes,
)
from .onnx_common import UnsupportedOperatorError

__all__ = ["FUSED_REWRITES", "rewrite_onnx_fused", "check_equations"]


def _shape(ctx: _Context, tensor: str, role: str, rank: tuple[int, ...]) -> tuple[int, ...]:
    shape = ctx.shapes.get(tensor)
    if shape is None:
        raise _NeedsShape(f"a {role} {tensor!r} whose static shape is not known")
    if len(shape) not in rank:
        raise _Refusal(f"a {role} of shape {list(shape)} (only rank {' or '.join(map(str, rank))})")
    return shape


def _allowed(queries: int, keys: int, past: int, causal: bool, left: int, right: int) -> np.ndarray | None:
    """The keys each query may see ``[queries, keys]`` under causal and sliding-window masking (Attention's
    bottom-right alignment: query ``i`` is at position ``past + i``), or None when neither applies."""
    if not causal and left < 0 and right < 0:
        return None
    diff = (np.arange(queries)[:, None] + past) - np.arange(keys)[None, :]
    keep = np.ones((queries, keys), bool)
    if causal:
        keep &= diff >= 0
    if left >= 0:
        keep &= diff <= left
    if right >= 0:
        keep &= -diff <= right
    return keep


def _repeat_heads(ctx: _Context, x: str, name: str, heads: int, repeats: int) -> str:
    """``x [B, heads, L, D]`` with each head repeated ``repeats`` times in place (``h0, h0, h1, h1, ...``)."""
    if repeats == 1:
        return x
    parts = [x]
    if heads > 1:
        parts = [ctx.fresh(f"{name}_head{h}") for h in range(heads)]
        ctx.nodes.append(helper.make_node("Split", [x, ctx.const(f"{name}_sizes", np.ones(heads, np.int64))],
                                          parts, name=ctx.fresh(f"{name}_split"), axis=1))
    return ctx.emit("Concat", [p for p in parts for _ in range(repeats)], f"{name}_repeat", axis=1)


def _attention(ctx: _Context, node: onnx.NodeProto) -> None:
    """ONNX Attention (opsets 23-25) as primitive nodes; see the module docstring."""
    a = _check_attrs(node, {"is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale", "softcap",
                            "softmax_precision", "left_window_size", "right_window_size"})
    _only_outputs(ctx, node, ("Y", "present_key", "present_value", "qk_matmul_output"))
    mode = int(a.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise _Refusal(f"qk_matmul_output_mode {mode} (0 to 3)")
    inputs = list(node.input) + [""] * (7 - len(node.input))
    q, k, v, mask, past_k, past_v, nonpad = inputs[:7]
    if nonpad and (mask or past_k or int(a.get("left_window_size", -1)) >= 0 or
                   int(a.get("right_window_size", -1)) >= 0):
        raise _Refusal("input nonpad_kv_seqlen with an attn_mask, past_key/past_value or a sliding window (the lab "
                       "takes the valid lengths alone, with or without is_causal)")
    if bool(past_k) != bool(past_v):
        raise _Refusal("past_key without past_value or the reverse (the operator needs both)")
    name = _main_name(node)
    q_shape = _shape(ctx, q, "query", (3, 4))
    k_shape = _shape(ctx, k, "key", (len(q_shape),))
    v_shape = _shape(ctx, v, "value", (len(q_shape),))
    if len(q_shape) == 3:
        q_heads, kv_heads = int(a.get("q_num_heads", 0)), int(a.get("kv_num_heads", 0))
        if q_heads < 1 or kv_heads < 1 or q_shape[2] % q_heads or k_shape[2] % kv_heads or v_shape[2] % kv_heads:
            raise _Refusal(f"3-D inputs of widths {q_shape[2]}, {k_shape[2]}, {v_shape[2]} with q_num_heads "
                           f"{q_heads} and kv_num_heads {kv_heads} (both must be given and divide the widths)")
        head, v_head = q_shape[2] // q_heads, v_shape[2] // kv_heads
        qh = _heads(ctx, q, f"{name}_q", q_heads, head, [0, 2, 1, 3])
        kh = _heads(ctx, k, f"{name}_k", kv_heads, k_shape[2] // kv_heads, [0, 2, 1, 3])
        vh = _heads(ctx, v, f"{name}_v", kv_heads, v_head, [0, 2, 1, 3])
        queries, new_keys = q_shape[1], k_shape[1]
    else:
        q_heads, kv_heads, head, v_head = q_shape[1], k_shape[1], q_shape[3], v_shape[3]
        qh, kh, vh = q, k, v
        queries, new_keys = q_shape[2], k_shape[2]
    if kv_heads < 1 or q_heads % kv_heads:
        raise _Refusal(f"{q_heads} query heads and {kv_heads} key/value heads (grouped-query attention needs the "
                       f"first a multiple of the second)")
    past = 0
    if past_k:
        past = _shape(ctx, past_k, "past_key", (4,))[2]
        kh = ctx.emit("Concat", [past_k, kh], f"{name}_present_key", axis=2)
        vh = ctx.emit("Concat", [past_v, vh], f"{name}_present_value", axis=2)
    for index, (tensor, role) in enumerate(((kh, "key"), (vh, "value")), start=1):
        if len(node.output) > index and node.output[index]:
            ctx.nodes.append(helper.make_node("Identity", [tensor], [node.output[index]],
                                              name=ctx.fresh(f"{name}_present_{role}")))
    keys = past + new_keys
    kh = _repeat_heads(ctx, kh, f"{name}_k", kv_heads, q_heads // kv_heads)
    vh = _repeat_heads(ctx, vh, f"{name}_v", kv_heads, q_heads // kv_heads)
    kt = ctx.emit("Transpose", [kh], f"{name}_kt", perm=[0, 1, 3, 2])
    scores = ctx.emit("MatMul", [qh, kt], f"{name}_scores")
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(head) if scale is None else float(scale)
    scores = ctx.emit("Mul", [scores, ctx.const(f"{name}_scale", np.float32(scale))], f"{name}_scaled")
    exposed = {0: scores}
    softcap = float(a.get("softcap", 0.0))
    if softcap > 0:
        capped = ctx.emit("Mul", [scores, ctx.const(f"{name}_uncap", np.float32(1.0 / softcap))], f"{name}_uncap")
        capped = ctx.emit("Tanh", [capped], f"{name}_tanh")
        scores = ctx.emit("Mul", [capped, ctx.const(f"{name}_cap", np.float32(softcap))], f"{name}_softcap")
    exposed[1] = scores
    causal = bool(a.get("is_causal", 0))
    keep = _allowed(queries, keys, past, causal and not nonpad, int(a.get("left_window_size", -1)),
                    int(a.get("right_window_size", -1)))
    if mask and _short_float_input(ctx, node, mask, keys):          # before the constant masks, which then fuse
        count = _shape(ctx, mask, "attn_mask", (1, 2, 3, 4))[-1]
        scores, vh = _first_keys(ctx, name, scores, vh, count)
        keep = None if keep is None else keep[:, :count]
    if keep is not None:
        bias = np.where(keep, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
        scores = ctx.emit("Add", [scores, ctx.const(f"{name}_causal", bias)], f"{name}_causal")
    if nonpad:
        scores = ctx.emit("Add", [scores, _nonpad_mask(ctx, name, nonpad, queries, keys, causal)], f"{name}_nonpad")
    if mask:
        scores = ctx.emit("Add", [scores, _additive_mask(ctx, node, mask, keys)], f"{name}_masked")
    exposed[2] = scores
    probs = ctx.emit("Softmax", [scores], f"{name}_softmax", axis=-1)
    exposed[3] = probs
    if len(node.output) > 3 and node.output[3] and node.output[3] in ctx.used:
        ctx.nodes.append(helper.make_node("Identity", [exposed[mode]], [node.output[3]],
                                          name=ctx.fresh(f"{name}_qk_matmul_output")))
    if len(q_shape) == 4:
        ctx.nodes.append(helper.make_node("MatMul", [probs, vh], [node.output[0]], name=name))
        return
    context = ctx.emit("MatMul", [probs, vh], f"{name}_context")
    merged = ctx.emit("Transpose", [context], f"{name}_merge", perm=[0, 2, 1, 3])
    ctx.nodes.append(helper.make_node(
        "Reshape", [merged, ctx.const(f"{name}_out_shape", np.array([0, 0, q_heads * v_head], np.int64))],
        [node.output[0]], name=name))


def _nonpad_mask(ctx: _Context, name: str, nonpad: str, queries: int, keys: int, causal: bool) -> str:
    """The additive mask ``[B, 1, S or 1, L]`` (0 or -inf) of ``nonpad_kv_seqlen [B]`` (an external cache's valid
    lengths, read at run time): key ``j`` is kept where ``j < nonpad[b]``, and, when causal, where ``j <= i +
    nonpad[b] - S`` (the queries are the last ``S`` valid positions), which implies the first; a row with no key
    left gives 0, as the operator's fully-masked rows."""
    j = np.arange(keys)[None, :]
    index = (j - np.arange(queries)[:, None] + queries - 1) if causal else j
    return lengths_mask(ctx, f"{name}_nonpad", nonpad, index, -np.inf)


def _short_float_input(ctx: _Context, node: onnx.NodeProto, mask: str, keys: int) -> bool:
    """Whether ``mask`` is a float32 graph input shorter than the ``keys`` (and the scores output is not read): its
    -inf padding then means the keys past it take no part, which :func:`_first_keys` writes without a Pad, so the
    mask reaches the scores as the float term it is (:func:`.masks.find_float_masks`; through a Pad it would be
    taken for a 0/1 mask)."""
    if ctx.types.get(mask) != TensorProto.FLOAT or mask not in {vi.name for vi in ctx.model.graph.input}:
        return False
    if len(node.output) > 3 and node.output[3] and node.output[3] in ctx.used:
        return False
    shape = ctx.shapes.get(mask)
    return shape is not None and shape[-1] < keys


def _first_keys(ctx: _Context, name: str, scores: str, vh: str, count: int) -> tuple[str, str]:
    """The scores ``[..., L]`` and values ``[B, N, L, Hv]`` of the first ``count`` keys only (the others' -inf
    scores weigh nothing in the softmax)."""
    start, end = ctx.const(f"{name}_keys_b", np.array([0], np.int64)), ctx.const(f"{name}_keys_e",
                                                                                 np.array([count], np.int64))
    scores = ctx.emit("Slice", [scores, start, end, ctx.const(f"{name}_keys_axis", np.array([-1], np.int64))],
                      f"{name}_first_keys")
    vh = ctx.emit("Slice", [vh, start, end, ctx.const(f"{name}_values_axis", np.array([2], np.int64))],
                  f"{name}_first_values")
    return scores, vh


def _additive_mask(ctx: _Context, node: onnx.NodeProto, mask: str, keys: int) -> str:
    """Attention's ``attn_mask`` as an additive term: a boolean mask as ``Where(mask, 0, -inf)``, a float one as
    given; padded with ``-inf`` up to ``keys`` along its last axis when shorter."""
    name = _main_name(node)
    kind = ctx.types.get(mask)
    shape = _shape(ctx, mask, "attn_mask", (1, 2, 3, 4))
    if kind == TensorProto.BOOL:
        mask = ctx.emit("Where", [mask, ctx.const(f"{name}_zero", np.float32(0.0)),
                                  ctx.const(f"{name}_fill", np.float32(-np.inf))], f"{name}_mask_bias")
    elif kind != TensorProto.FLOAT:
        what = TensorProto.DataType.Name(kind) if kind else "unknown"
        raise _Refusal(f"an attn_mask of element type {what} (only bool, or float32 added to the scores)")
    if shape[-1] > keys:
        raise _Refusal(f"an attn_mask of {shape[-1]} keys for {keys} keys")
    if shape[-1] < keys and not _short_float_input(ctx, node, mask, keys):
        pads = [0] * len(shape) + [0] * (len(shape) - 1) + [keys - shape[-1]]
        mask = ctx.emit("Pad", [mask, ctx.const(f"{name}_mask_pads", np.array(pads, np.int64)),
                                ctx.const(f"{name}_mask_pad_value", np.float32(-np.inf))], f"{name}_mask_pad")
    return mask


def _swiglu(ctx: _Context, node: onnx.NodeProto) -> None:
    """SwiGLU (opset 28): ``Swish(a, alpha) * b``."""
    a = _check_attrs(node, {"alpha"})
    name = _main_name(node)
    gate = ctx.emit("Swish", [node.input[0]], f"{name}_swish", alpha=float(a.get("alpha", 1.0)))
    ctx.nodes.append(helper.make_node("Mul", [gate, node.input[1]], [node.output[0]], name=name))


def _rotary(ctx: _Context, node: onnx.NodeProto) -> None:
    """RotaryEmbedding (opset 23) as its decomposition: the rotated part of each head split in halves (or even and
    odd elements when ``interleaved``), ``real = x1 cos - x2 sin`` and ``imag = x1 sin + x2 cos`` concatenated (or
    interleaved back), the rest of the head passed through. ``cos``/``sin`` are the caches gathered by
    ``position_ids`` when given, broadcast over the heads."""
    a = _check_attrs(node, {"interleaved", "num_heads", "rotary_embedding_dim"})
    name = _main_name(node)
    inputs = list(node.input) + [""] * (4 - len(node.input))
    x, cos, sin, positions = inputs[:4]
    shape = _shape(ctx, x, "input", (3, 4))
    if len(shape) == 3:
        heads = int(a.get("num_heads", 0))
        if heads < 1 or shape[2] % heads:
            raise _Refusal(f"a 3-D input of width {shape[2]} with num_heads {heads} (it must divide the width)")
        head = shape[2] // heads
        xr = ctx.emit("Reshape", [x, ctx.const(f"{name}_heads", np.array([shape[0], shape[1], heads, head],
                                                                           np.int64))], f"{name}_x4")
        full: tuple[int, ...] = (shape[0], shape[1], heads, head)
        head_axis = 2
    else:
        xr, full, head_axis = x, tuple(shape), 1
        head = shape[3]
    rot = int(a.get("rotary_embedding_dim", 0)) or head
    if rot % 2 or rot > head:
        raise _Refusal(f"rotary_embedding_dim {rot} for heads of {head} (an even number up to the head size)")
    half = rot // 2
    terms = []
    for role, cache in (("cos", cos), ("sin", sin)):
        value = ctx.emit("Gather", [cache, positions], f"{name}_{role}_at", axis=0) if positions else cache
        value = ctx.emit("Unsqueeze", [value, ctx.const(f"{name}_{role}_axis", np.array([head_axis], np.int64))],
                         f"{name}_{role}_heads")
        target = list(full[:3]) + [half]
        terms.append(ctx.emit("Expand", [value, ctx.const(f"{name}_{role}_shape", np.array(target, np.int64))],
                              f"{name}_{role}_full"))
    c, s = terms
    axis = ctx.const(f"{name}_last", np.array([3], np.int64))
    def piece(start: int, end: int, step: int, role: str) -> str:
        return ctx.emit("Slice", [xr, ctx.const(f"{name}_{role}_b", np.array([start], np.int64)),
                                  ctx.const(f"{name}_{role}_e", np.array([end], np.int64)), axis,
                                  ctx.const(f"{name}_{role}_s", np.array([step], np.int64))], f"{name}_{role}")
    if a.get("interleaved", 0):
        x1, x2 = piece(0, rot, 2, "even"), piece(1, rot, 2, "odd")
    else:
        x1, x2 = piece(0, half, 1, "first"), piece(half, rot, 1, "second")
    def mul(p: str, q: str, role: str) -> str:
        return ctx.emit("Mul", [p, q], f"{name}_{role}")
    minus = ctx.emit("Neg", [mul(x2, s, "x2s")], f"{name}_minus")
    real = ctx.emit("Add", [mul(x1, c, "x1c"), minus], f"{name}_real")
    imag = ctx.emit("Add", [mul(x1, s, "x1s"), mul(x2, c, "x2c")], f"{name}_imag")
    if a.get("interleaved", 0):
        five = ctx.const(f"{name}_five", np.array([4], np.int64))
        pairs = ctx.emit("Concat", [ctx.emit("Unsqueeze", [real, five], f"{name}_real5"),
                                    ctx.emit("Unsqueeze", [imag, five], f"{name}_imag5")], f"{name}_pairs", axis=4)
        rotated = ctx.emit("Reshape", [pairs, ctx.const(f"{name}_rot_shape", np.array(list(full[:3]) + [rot],
                                                                                       np.int64))], f"{name}_rot")
    else:
        rotated = ctx.emit("Concat", [real, imag], f"{name}_rot", axis=3)
    parts = [rotated] + ([piece(rot, head, 1, "pass")] if rot < head else [])
    last = ctx.emit("Concat", parts, f"{name}_joined", axis=3) if len(parts) > 1 else rotated
    ctx.nodes.append(helper.make_node("Reshape", [last, ctx.const(f"{name}_out_shape", np.array(shape, np.int64))],
                                      [node.output[0]], name=name))


def _group_normalization(ctx: _Context, node: onnx.NodeProto) -> None:
    """GroupNormalization (opsets 18 and 21; onnx's shape inference gives its output no shape) as torch's
    TorchScript exporter writes GroupNorm: Reshape to ``[N, G, -1]``, InstanceNormalization, Reshape back, then the
    scale and bias per channel (per group before opset 21)."""
    a = _check_attrs(node, {"num_groups", "epsilon", "stash_type"})
    name = _main_name(node)
    shape = _shape(ctx, node.input[0], "input", tuple(range(3, 9)))
    groups, c = int(a.get("num_groups", 0)), shape[1]
    if groups < 1 or c % groups:
        raise _Refusal(f"num_groups {groups} for {c} channels")
    params = []
    for k, what in ((1, "scale"), (2, "bias")):
        value = ctx.constant(node, k, what)
        if value is None:
            raise _Refusal(f"no {what} input")
        value = value.reshape(-1)
        if value.size == groups and groups != c:
            value = np.repeat(value, c // groups)
        if value.size != c:
            raise _Refusal(f"a {what} of {value.size} values for {c} channels")
        params.append(value.reshape(c, 1).astype(np.float32))
    grouped = ctx.emit("Reshape", [node.input[0], ctx.const(f"{name}_groups", np.array([shape[0], groups, -1],
                                                                                       np.int64))], f"{name}_g")
    normed = ctx.emit("InstanceNormalization", [grouped, ctx.const(f"{name}_ones", np.ones(groups, np.float32)),
                                                ctx.const(f"{name}_zeros", np.zeros(groups, np.float32))],
                      f"{name}_in", epsilon=float(a.get("epsilon", 1e-5)))
    rows = ctx.emit("Reshape", [normed, ctx.const(f"{name}_rows", np.array([shape[0], c, -1], np.int64))],
                    f"{name}_channels")                  # [N, C, prod(S)]: the affine per channel, then the shape
    scaled = ctx.emit("Mul", [rows, ctx.const(f"{name}_scale", params[0])], f"{name}_scaled")
    shifted = ctx.emit("Add", [scaled, ctx.const(f"{name}_bias", params[1])], f"{name}_shifted")
    ctx.nodes.append(helper.make_node("Reshape", [shifted, ctx.const(f"{name}_shape", np.array(shape, np.int64))],
                                      [node.output[0]], name=name))


_TERM = r"[A-Za-z]*(?:\.\.\.)?[A-Za-z]*"
_EQUATION = re.compile(rf"{_TERM}(?:,{_TERM})*(?:->{_TERM})?")


def check_equations(model: onnx.ModelProto) -> None:
    """Refuse an Einsum whose equation is not letters, ``...``, commas and one ``->``, before anything infers
    shapes: onnx 1.23's shape inference loops forever on some malformed ones (``i.j,jk->ik``)."""
    for node in model.graph.node:
        if node.op_type != "Einsum" or node.domain not in ("", "ai.onnx"):
            continue
        value = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "equation"), b"")
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        if not _EQUATION.fullmatch(text.replace(" ", "")):
            raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                           f"equation {text!r}: not operand terms of letters and at most one '...', "
                                           f"separated by commas, with at most one '->'")


def _einsum_terms(node: onnx.NodeProto, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' index strings and the output's of an Einsum equation, ``...`` spelled out as upper-case
    letters from each operand's rank (implicit mode: the indices seen once, in alphabetical order)."""
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    equation = a["equation"].decode(errors="replace") if isinstance(a.get("equation"), bytes) else \
        str(a.get("equation", ""))
    equation = equation.replace(" ", "")
    if not equation or equation.count("->") > 1:
        raise _Refusal(f"equation {equation!r} (none, or more than one '->')")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise _Refusal(f"equation {equation!r} for {len(ranks)} operands")
    if any(not c.isalpha() and c != "." for c in "".join(terms) + rhs):
        raise _Refusal(f"equation {equation!r} (only letters and ...)")
    width = max((rank - len(t.replace("...", "")) for t, rank in zip(terms, ranks) if "..." in t), default=0)
    ellipsis = "".join(chr(ord("A") + k) for k in range(width))
    if width and any(c.isupper() for c in equation):
        raise _Refusal(f"equation {equation!r} with ... and upper-case indices")
    spelled = []
    for t, rank in zip(terms, ranks):
        if "..." in t:
            t = t.replace("...", ellipsis[width - (rank - len(t.replace("...", ""))):])
        if len(t) != rank:
            raise _Refusal(f"operand indices {t!r} for a rank-{rank} operand")
        spelled.append(t)
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:
        seen = "".join(spelled)
        out = ellipsis + "".join(sorted(c for c in set(seen) if seen.count(c) == 1 and c.islower()))
    return spelled, out


def _einsum(ctx: _Context, node: onnx.NodeProto) -> None:
    """Einsum of one operand (a permutation) or two (a batched matrix product: the indices in both operands and
    the output are batch axes, those in both and not the output are summed, the rest are each operand's own) as
    Transpose, Reshape, MatMul, Reshape, Transpose. torch.einsum and Keras' attention write it (``bhid,bhjd->bhij``,
    ``abc,cd->abd``). Refused: an index repeated in one operand (a trace or diagonal), summed indices in one
    operand only, more than two operands."""
    name = _main_name(node)
    shapes = [_shape(ctx, t, f"operand {k}", tuple(range(1, 9))) for k, t in enumerate(node.input)]
    terms, out = _einsum_terms(node, [len(s) for s in shapes])
    if any(len(set(t)) != len(t) for t in terms) or len(set(out)) != len(out):
        raise _Refusal(f"an index repeated in one term of {','.join(terms)}->{out} (a trace or diagonal)")
    if len(terms) == 1:
        if sorted(out) != sorted(terms[0]):
            raise _Refusal(f"{terms[0]}->{out} (one operand: only a permutation)")
        ctx.nodes.append(helper.make_node("Transpose", [node.input[0]], [node.output[0]], name=name,
                                          perm=[terms[0].index(c) for c in out]))
        return
    if len(terms) != 2:
        raise _Refusal(f"{len(terms)} operands (only one or two)")
    (ta, tb), (sa, sb) = terms, shapes
    size = {**{c: n for c, n in zip(tb, sb)}, **{c: n for c, n in zip(ta, sa)}}
    for c, n in zip(tb, sb):
        if c in ta and n != size[c] and 1 not in (n, size[c]):
            raise _Refusal(f"index {c!r} of sizes {size[c]} and {n}")
        size[c] = max(size[c], n)
    batch = [c for c in ta if c in tb and c in out]
    summed = [c for c in ta if c in tb and c not in out]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    lonely = [c for c in left + right if c not in out]
    if lonely or any(c not in ta + tb for c in out):
        raise _Refusal(f"{ta},{tb}->{out}: indices summed in one operand only or output indices in none")
    def operand(tensor: str, term: str, shape: tuple[int, ...], order: list[str], rows: list[str], cols: list[str],
                role: str) -> str:
        perm = [term.index(c) for c in order]
        if perm != list(range(len(term))):
            tensor = ctx.emit("Transpose", [tensor], f"{name}_{role}_t", perm=perm)
        dims = [shape[term.index(c)] for c in batch]
        target = dims + [int(np.prod([size[c] for c in rows])), int(np.prod([size[c] for c in cols]))]
        return ctx.emit("Reshape", [tensor, ctx.const(f"{name}_{role}_shape", np.array(target, np.int64))],
                        f"{name}_{role}_r")
    a = operand(node.input[0], ta, sa, batch + left + summed, left, summed, "a")
    b = operand(node.input[1], tb, sb, batch + summed + right, summed, right, "b")
    product = ctx.emit("MatMul", [a, b], f"{name}_matmul")
    order = batch + left + right
    full = [size[c] for c in order]
    perm = [order.index(c) for c in out]
    if perm == list(range(len(order))):
        ctx.nodes.append(helper.make_node("Reshape", [product, ctx.const(f"{name}_shape", np.array(full, np.int64))],
                                          [node.output[0]], name=name))
        return
    unflat = ctx.emit("Reshape", [product, ctx.const(f"{name}_shape", np.array(full, np.int64))], f"{name}_unflat")
    ctx.nodes.append(helper.make_node("Transpose", [unflat], [node.output[0]], name=name, perm=perm))


def _causal_conv(ctx: _Context, node: onnx.NodeProto) -> None:
    """CausalConvWithState (opset 27; Mamba's and Gated DeltaNet's short convolution) as the three nodes it fuses: the
    ``k - 1`` carried positions (``past_state``, else zeros) put before the input along the time axis, a depthwise
    Conv of kernel ``k`` without padding (with the bias), then Swish for ``activation`` silu/swish;
    ``present_state`` is the last ``k - 1`` positions of that joined sequence (a Slice)."""
    a = _check_attrs(node, {"activation"})
    activation = a.get("activation", b"none")
    activation = activation.decode() if isinstance(activation, bytes) else str(activation)
    if activation not in ("none", "silu", "swish"):
        raise _Refusal(f"activation {activation!r} (only 'silu', 'swish' or 'none')")
    name = _main_name(node)
    inputs = list(node.input) + [""] * (4 - len(node.input))
    x, weight, bias, past = inputs[:4]
    batch, channels, length = _shape(ctx, x, "input", (3,))
    kernel = _shape(ctx, weight, "weight", (3,))
    if kernel[:2] != (channels, 1) or kernel[2] < 1:
        raise _Refusal(f"a weight of shape {list(kernel)} for {channels} channels (only [channels, 1, k])")
    k = kernel[2]
    if past:
        joined = ctx.emit("Concat", [past, x], f"{name}_joined", axis=2) if k > 1 else x
    elif k > 1:
        pads = np.array([0, 0, k - 1, 0, 0, 0], np.int64)
        joined = ctx.emit("Pad", [x, ctx.const(f"{name}_pads", pads)], f"{name}_joined")
    else:
        joined = x
    conv_in = [joined, weight] + ([bias] if bias else [])
    conv = ctx.emit("Conv", conv_in, f"{name}_conv", group=channels, kernel_shape=[k])
    if activation == "none":
        ctx.nodes.append(helper.make_node("Identity", [conv], [node.output[0]], name=name))
    else:
        ctx.nodes.append(helper.make_node("Mul", [conv, ctx.emit("Sigmoid", [conv], f"{name}_gate")],
                                          [node.output[0]], name=name))
    if len(node.output) > 1 and node.output[1] and node.output[1] in ctx.used:
        if k == 1:
            raise _Refusal("a present_state of 0 positions (kernel size 1) that something reads")
        ctx.nodes.append(helper.make_node(
            "Slice", [joined, ctx.const(f"{name}_state_b", np.array([-(k - 1)], np.int64)),
                      ctx.const(f"{name}_state_e", np.array([length + k], np.int64)),
                      ctx.const(f"{name}_state_axis", np.array([2], np.int64))],
            [node.output[1]], name=ctx.fresh(f"{name}_present_state")))


FUSED_REWRITES: dict[str, Rewrite] = {
    "Attention": _attention,
    "SwiGLU": _swiglu,
    "Einsum": _einsum,
    "GroupNormalization": _group_normalization,
    "RotaryEmbedding": _rotary,
    "TensorScatter": _refuse("opset 24's in-place KV cache update has no rewrite in the lab (a cache grown by "
                              "Concat imports)"),
    "LinearAttention": _refuse("opset 27's linear attention has no rewrite in the lab"),
    "CausalConvWithState": _causal_conv,
}
"""ONNX's fused operators (default domain) :func:`rewrite_onnx_fused` rewrites or refuses with a reason."""


def rewrite_onnx_fused(model: onnx.ModelProto) -> dict[str, str]:
    """Replace, in place, each fused default-domain operator of :data:`FUSED_REWRITES` by standard nodes; return
    why each one left is refused, keyed by its first output."""
    def rule_of(node: onnx.NodeProto) -> Rewrite | None:
        return FUSED_REWRITES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    return rewrite_nodes(model, rule_of)
