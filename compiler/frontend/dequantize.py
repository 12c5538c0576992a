"""A QDQ-quantized model whose operators the integer import (:mod:`.prequant`) does not take, as its dequantized
float graph.

onnxruntime's ``quantize_static`` in QDQ format leaves every operator float and wraps it in QuantizeLinear /
DequantizeLinear pairs: weights are ``DequantizeLinear`` of int8 constants, activations pass through a
``QuantizeLinear`` -> ``DequantizeLinear`` pair (a fake quantization). :mod:`.prequant` imports such a model with the
file's own scales when it knows every operator (the CNN operators). For the rest (a transformer's Softmax, LayerNorm,
attention products, masks...) :func:`qdq_to_float` removes every activation pair, so the model is the float graph
the quantizer started from, with its weights at their int8 values (each ``DequantizeLinear`` of a constant folds at
import). One pair is more than a fake quantization: onnxruntime deletes a ReLU (or ReLU6's Clip) before a
QuantizeLinear whose zero point is at the bottom of its range, whose clamp computes it; such a pair becomes a Clip to
``[0, hi]`` (:func:`_floor_clamp`), unless its input is never negative anyway (GELU's ``1 + erf``). The lab then
quantizes it as any float model: its own activation scales, calibrated on ``--calibration`` data (or, with the
usual warning, on random inputs), so the run is not bit-exact with onnxruntime's integer execution of the file,
and says which model it measured its error against.

onnxruntime's ``quantize_dynamic`` writes ``MatMulInteger`` of ``DynamicQuantizeLinear`` activations by int8
weights: each such chain becomes the float MatMul with the weights' int8 values (:func:`_dynamic_to_float`), and
each ``ConvInteger`` chain (a ViT's patch embedding) the float Conv. A file in onnxruntime's QOperator format
(``QLinearMatMul``, ``QLinearConv``, com.microsoft's ``QLinearAdd``, ``QLinearSoftmax``, ``QGemm``...) is first
rewritten as QDQ (:func:`qoperator_to_qdq`), then made float the same way. onnxruntime's fused forms of the
dynamic chains (``DynamicQuantizeMatMul``, ``MatMulIntegerToFloat``) become the same float MatMuls, and a
``QAttention`` of ``DynamicQuantizeLinear(x)`` (``quantize_dynamic`` of an optimized BERT's Attention) the
com.microsoft Attention by the dequantized weights, which :mod:`.contrib` imports. Other forms (a quantized
operator whose scales are computed at run time, a QAttention with a past state) are not:
:func:`qdq_to_float` returns None for them, and :func:`undequantized_ops` names them.
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from .masks import live_nodes
from .onnx_common import tensor_namer
from .onnx_fusions import _OnnxGraph

__all__ = ["qdq_to_float", "qdq_ranges", "undequantized_ops", "QDQ_OPS", "qoperator_to_qdq", "along_axis",
           "dequantized_constants"]

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""The only quantized operators of a QDQ model."""

_QUANTIZED = frozenset({"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                        "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat",
                        "QLinearSoftmax", "QGemm", "QAttention", "ConvInteger", "MatMulInteger",
                        "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def undequantized_ops(model: onnx.ModelProto) -> list[str]:
    """The quantized operators of ``model`` :func:`qdq_to_float` does not make float (QOperator operators, and
    dynamic ones outside the chains it recognizes), sorted, each once."""
    return sorted({node.op_type for node in _rewritten(model).graph.node if node.op_type in _QUANTIZED})


def _rewritten(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with its QOperator nodes written as QDQ (:func:`qoperator_to_qdq`) and its dynamic
    MatMuls and Convs made float (:func:`_dynamic_to_float`)."""
    out = onnx.ModelProto.FromString(model.SerializeToString())
    qoperator_to_qdq(out)
    _dynamic_to_float(out)
    return out


def qdq_to_float(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of the QDQ (or QOperator, or dynamically quantized) ``model`` with its QOperator nodes written as QDQ
    (:func:`qoperator_to_qdq`), its dynamic MatMuls and Convs made float again (:func:`_dynamic_to_float`) and
    without its activation QuantizeLinear -> DequantizeLinear pairs (each pair's output read as the pair's float
    input, or clamped, :func:`_floor_clamp`); constants' pairs and DequantizeLinear of integer constants stay, to
    fold at import. None when ``model`` keeps another quantized operator or a QuantizeLinear of an activation is
    read by anything but DequantizeLinear."""
    out = _rewritten(model)
    if any(node.op_type in _QUANTIZED for node in out.graph.node):
        return None
    for node in out.graph.node:             # onnxruntime's contrib forms (int4, 16-bit) of the same two operators
        if node.op_type in QDQ_OPS and node.domain == "com.microsoft":
            node.domain = ""
    _fold_constant_dequantizations(out)
    g = _OnnxGraph(out)
    inits, producer, readers = set(g.consts), g.producer, g.consumers
    rename: dict[str, str] = {}
    drop: set[str] = set()                                    # outputs of the pairs' nodes
    clamps: dict[str, onnx.NodeProto] = {}                    # a pair's QuantizeLinear output -> its Clip
    new = tensor_namer(out)
    for node in out.graph.node:
        if node.op_type != "QuantizeLinear" or _constant(node.input[0], producer, inits):
            continue
        users = readers.get(node.output[0], [])
        if not users or any(u.op_type != "DequantizeLinear" for u in users) or node.output[0] in g.outputs:
            return None
        drop.add(node.output[0])
        source = node.input[0]
        bounds = _floor_clamp(node, g.consts, producer)
        if bounds is not None:
            source = new(f"{node.output[0]}_clamped")
            lo, hi = (new(f"{source}_{end}") for end in ("min", "max"))
            out.graph.initializer.extend([numpy_helper.from_array(np.array(bounds[0], np.float32), lo),
                                          numpy_helper.from_array(np.array(bounds[1], np.float32), hi)])
            clamps[node.output[0]] = onnx.helper.make_node("Clip", [node.input[0], lo, hi], [source],
                                                           name=f"{node.name or node.output[0]}_clamp")
        for dq in users:
            rename[dq.output[0]] = source
            drop.add(dq.output[0])
    if not rename:
        return out
    kept = [clamps.get(n.output[0], n) if n.output and n.output[0] in clamps else n for n in out.graph.node
            if not (n.output and n.output[0] in drop) or n.output[0] in clamps]
    for node in kept:
        node.input[:] = [_final(t, rename) for t in node.input]
    for o in out.graph.output:
        if o.name in rename:
            kept.append(onnx.helper.make_node("Identity", [_final(o.name, rename)], [o.name]))
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def _per_tensor(quant: onnx.NodeProto, consts: dict[str, np.ndarray]) -> tuple[float, int, np.iinfo] | None:
    """A QuantizeLinear's constant per-tensor scale, zero point (uint8 0 when absent) and its integer type's range;
    None for another form."""
    scale = consts.get(quant.input[1])
    zero = consts.get(quant.input[2]) if len(quant.input) > 2 and quant.input[2] else np.zeros((), np.uint8)
    if scale is None or zero is None or scale.size != 1 or zero.size != 1 or zero.dtype.kind not in "iu":
        return None
    return float(scale.reshape(())), int(zero.reshape(())), np.iinfo(zero.dtype)


_NON_NEGATIVE = frozenset({"Relu", "Softmax", "Sigmoid", "HardSigmoid", "Abs", "Exp", "Sqrt"})
"""Operators whose output is never negative."""


def _scalar(name: str, producer: dict[str, onnx.NodeProto], consts: dict[str, np.ndarray]) -> float | None:
    """The value of a one-element constant: an initializer, a Constant node, or either through a fake quantization
    (QuantizeLinear -> DequantizeLinear, as onnxruntime writes a scalar operand; its float value, unrounded)."""
    for _ in range(3):
        if name in consts:
            value = consts[name]
            return float(value.reshape(())) if value.size == 1 else None
        node = producer.get(name)
        if node is None:
            return None
        if node.op_type == "Constant":
            attr = next((a for a in node.attribute if a.name == "value"), None)
            if attr is None:
                return None
            value = numpy_helper.to_array(attr.t)
            return float(value.reshape(())) if value.size == 1 else None
        if node.op_type not in ("DequantizeLinear", "QuantizeLinear"):
            return None
        name = node.input[0]
    return None


def _bounds(name: str, producer: dict[str, onnx.NodeProto], consts: dict[str, np.ndarray], depth: int = 4
            ) -> tuple[float, float]:
    """An interval holding every value of tensor ``name``, from the operators that compute it (Erf and Tanh in
    [-1, 1], the non-negative ones, a Clip's bounds, an Add or Mul of a one-element constant); infinite where
    unknown."""
    node = producer.get(name)
    if node is None or depth == 0:
        return -np.inf, np.inf
    quant = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
    if quant is not None and quant.op_type == "QuantizeLinear":             # through a fake quantization
        return _bounds(quant.input[0], producer, consts, depth - 1)
    if node.op_type in _NON_NEGATIVE:
        return 0.0, (1.0 if node.op_type in ("Softmax", "Sigmoid", "HardSigmoid") else np.inf)
    if node.op_type in ("Erf", "Tanh"):
        return -1.0, 1.0
    if node.op_type == "Clip":
        lo = _scalar(node.input[1], producer, consts) if len(node.input) > 1 and node.input[1] else None
        hi = _scalar(node.input[2], producer, consts) if len(node.input) > 2 and node.input[2] else None
        return -np.inf if lo is None else lo, np.inf if hi is None else hi
    if node.op_type in ("Add", "Mul") and len(node.input) == 2:
        values = [_scalar(t, producer, consts) for t in node.input]
        k = next((i for i, v in enumerate(values) if v is not None), None)
        if k is None:
            return -np.inf, np.inf
        c = values[k]
        assert c is not None
        lo, hi = _bounds(node.input[1 - k], producer, consts, depth - 1)
        if node.op_type == "Add":
            return lo + c, hi + c
        ends = sorted(v * c if np.isfinite(v) or c else 0.0 for v in (lo, hi))
        return ends[0], ends[1]
    return -np.inf, np.inf


def _floor_clamp(quant: onnx.NodeProto, consts: dict[str, np.ndarray], producer: dict[str, onnx.NodeProto]
                 ) -> tuple[float, float] | None:
    """``(0, scale * (qmax - zp))`` for an activation QuantizeLinear whose zero point is its type's minimum (uint8
    0, int8 -128), unless its input is never negative (:func:`_bounds`): onnxruntime's QDQ quantizer then
    deletes the ReLU (or ReLU6's Clip) before it, since the pair's clamp to ``[0, hi]`` computes it, so the
    dequantized graph needs the clamp back. None otherwise (a per-tensor scale and zero point only)."""
    params = _per_tensor(quant, consts)
    if params is None:
        return None
    scale, zero, info = params
    if zero != int(info.min) or _bounds(quant.input[0], producer, consts)[0] >= 0:
        return None
    hi = scale * (int(info.max) - int(info.min))
    return (0.0, hi) if np.isfinite(hi) and hi > 0 else None


def qdq_ranges(model: onnx.ModelProto) -> dict[str, float]:
    """The largest magnitude each activation QuantizeLinear of the QDQ ``model`` can represent, by the name of the
    float tensor it quantizes: ``scale * max(zp - qmin, qmax - zp)`` for its int8 or uint8 output (per-tensor scale
    and zero point constants only; an infinite or zero range is left out). These are the ranges the file's own
    calibration chose."""
    g = _OnnxGraph(model)
    inits = g.consts
    ranges: dict[str, float] = {}
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or _constant(node.input[0], g.producer, set(inits)):
            continue
        params = _per_tensor(node, inits)
        if params is None:
            continue
        scale, z, info = params
        value = scale * max(z - int(info.min), int(info.max) - z)
        if np.isfinite(value) and value > 0:                 # onnxruntime writes inf for a -inf mask's range
            ranges[node.input[0]] = value
    return ranges


def _dynamic_to_float(model: onnx.ModelProto) -> None:
    """In place: each ``MatMulInteger(DynamicQuantizeLinear(x), Wq, x_zp, w_zp) -> Cast -> Mul(., x_scale * w_scale)``
    chain (onnxruntime's ``quantize_dynamic`` of a MatMul by constant weights) becomes ``MatMul(x, (Wq - w_zp) *
    w_scale)``: the float layer with its int8 weights' values; a ``ConvInteger`` chain (a ViT's patch embedding)
    becomes the Conv with the same attributes (per-output-channel scales and zero points along the weights' first
    axis); a ``DequantizeLinear`` of a ``Gather`` from an int8
    table (a quantized embedding) becomes a Gather from the dequantized table; a ``DequantizeLinear`` that alone reads
    a ``DynamicQuantizeLinear(x)`` (tf2onnx's form of a dynamic-range TFLite model: a fake quantization at a scale
    computed at run time) becomes ``x``; onnxruntime's fused forms of the MatMul
    chain (:func:`_fused_dynamic`) become the same float nodes. Nodes left unread afterwards (the
    dynamic quantization of ``x``, the scale products) are dropped. Chains of another form are left (and refused by
    the caller)."""
    g = _OnnxGraph(model)
    inits, producer = g.consts, g.producer
    replace: dict[str, onnx.NodeProto] = {}                  # the chain's final Mul output -> its float MatMul
    gone: set[str] = set()
    new = tensor_namer(model)
    for node in model.graph.node:
        if node.op_type not in ("MatMulInteger", "ConvInteger") or node.input[1] not in inits:
            continue
        quant = producer.get(node.input[0])
        cast = g.only_user(node.output[0], "Cast")
        mul = g.only_user(cast.output[0], "Mul") if cast is not None else None
        if quant is None or quant.op_type != "DynamicQuantizeLinear" or cast is None or mul is None:
            continue
        scales = producer.get(mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0])
        if scales is None or scales.op_type != "Mul" or quant.output[1] not in scales.input:
            continue
        w_scale = inits.get(scales.input[1] if scales.input[0] == quant.output[1] else scales.input[0])
        zero = inits.get(node.input[3]) if len(node.input) > 3 and node.input[3] else np.zeros((), np.int64)
        if w_scale is None or zero is None:
            continue
        wq = inits[node.input[1]].astype(np.float64)
        per_channel = (-1,) + (1,) * (wq.ndim - 1)        # a Conv's per-output-channel scales and zero points
        zero, w_scale = zero.astype(np.float64), w_scale.astype(np.float64)
        if node.op_type == "ConvInteger":
            zero, w_scale = (v.reshape(per_channel) if v.size > 1 else v for v in (zero, w_scale))
        weights = (wq - zero) * w_scale
        name = new(f"{node.input[1]}_dequantized")
        model.graph.initializer.append(numpy_helper.from_array(weights.astype(np.float32), name))
        replace[mul.output[0]] = onnx.helper.make_node(node.op_type.replace("Integer", ""), [quant.input[0], name],
                                                       [mul.output[0]], name=node.name or mul.output[0])
        replace[mul.output[0]].attribute.extend(node.attribute)   # ConvInteger's are Conv's
        gone.update({node.output[0], cast.output[0]})
    tables: dict[tuple[str, ...], str] = {}                # (table, scale, zero point) -> its float table
    for node in model.graph.node:                            # DequantizeLinear(Gather(int8 table, ids))
        gather = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if gather is None or gather.op_type != "Gather" or gather.input[0] not in inits or \
                any(a.name == "axis" and a.i != 0 for a in gather.attribute) or \
                gather.output[0] in g.outputs or \
                any(u.op_type != "DequantizeLinear" for u in g.consumers.get(gather.output[0], [])):
            continue                     # (a QOperator file written as QDQ reads it by one DequantizeLinear a reader)
        scale = inits.get(node.input[1])
        zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int64)
        if scale is None or zero is None or scale.size != 1 or zero.size != 1:
            continue
        key = (gather.input[0], *node.input[1:3])
        if key not in tables:
            table = (inits[gather.input[0]].astype(np.float64) - zero.astype(np.float64)) * scale.astype(np.float64)
            tables[key] = new(f"{gather.input[0]}_dequantized")
            model.graph.initializer.append(numpy_helper.from_array(table.astype(np.float32), tables[key]))
        name = tables[key]
        replace[node.output[0]] = onnx.helper.make_node("Gather", [name, gather.input[1]], [node.output[0]],
                                                        name=node.name or node.output[0], axis=0)   # one a reader
        gone.add(gather.output[0])
    for node in model.graph.node:      # DequantizeLinear(DynamicQuantizeLinear(x)): tf2onnx's dynamic-range TFLite
        quant = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if quant is not None and quant.op_type == "DynamicQuantizeLinear" and \
                list(node.input[:3]) == list(quant.output[:3]) and len(node.input) == 3 and \
                all(list(g.consumers.get(t, [])) == [node] for t in quant.output[:3]):
            replace[node.output[0]] = onnx.helper.make_node("Identity", [quant.input[0]], [node.output[0]],
                                                            name=node.name or node.output[0])
    extra = _fused_dynamic(model, g, new)
    if not replace and not extra:
        return
    kept = []
    for node in model.graph.node:
        if node.output and node.output[0] in replace:
            kept.append(replace[node.output[0]])
        elif node.output and node.output[0] in extra:
            kept.extend(extra[node.output[0]])
        elif not (node.output and node.output[0] in gone):
            kept.append(node)
    kept = live_nodes(kept, {o.name for o in model.graph.output})
    del model.graph.node[:]
    model.graph.node.extend(kept)


_FUSED_DYNAMIC = {"DynamicQuantizeMatMul": (None, 1, 2, 3, 4), "MatMulIntegerToFloat": (2, 1, 3, 5, 6)}
"""onnxruntime's fused dynamic MatMuls (com.microsoft) -> the indices of their inputs: A's scale (None: A is float
and quantized inside), B, B's scale, B's zero point, the bias."""


def _fused_dynamic(model: onnx.ModelProto, g: _OnnxGraph, new: Callable[[str], str]
                   ) -> dict[str, list[onnx.NodeProto]]:
    """The float nodes for each of onnxruntime's fused dynamic MatMuls in ``model`` (what its extended graph
    optimization saves from ``quantize_dynamic``'s chains), by the node's output: ``MatMul(x, (Bq - b_zp) *
    b_scale)`` and an Add of the bias when there is one. ``x`` is a DynamicQuantizeMatMul's float input, or the float
    input of the DynamicQuantizeLinear that quantized a MatMulIntegerToFloat's A at the scale the node reads. A node
    of another form (B or its scale not constant, A quantized elsewhere) is left (and refused by the caller). The
    new initializers are added to ``model``, named by ``new`` (:func:`.onnx_common.tensor_namer` of ``model``)."""
    inits, producer = g.consts, g.producer
    inputs = {vi.name for vi in model.graph.input}
    written: dict[str, str] = {}                          # a quantized B -> its dequantized initializer
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        if node.domain == "com.microsoft" and node.op_type == "QAttention":
            attention = _qattention(model, g, node, written, new)
            if attention is not None:
                out[node.output[0]] = [attention]
            continue
        if node.domain != "com.microsoft" or node.op_type not in _FUSED_DYNAMIC:
            continue
        a_scale, b, b_scale, b_zero, bias = (node.input[k] if k is not None and len(node.input) > k else ""
                                             for k in _FUSED_DYNAMIC[node.op_type])
        x = node.input[0]
        if a_scale:                                       # MatMulIntegerToFloat: A from DynamicQuantizeLinear(x)
            quant = producer.get(x)
            if quant is None or quant.op_type != "DynamicQuantizeLinear" or quant.output[0] != x or \
                    len(quant.output) < 2 or quant.output[1] != a_scale:
                continue
            x = quant.input[0]
        if b not in inits or b_scale not in inits or (b_zero and b_zero not in inits) or \
                (bias and bias not in inits and bias not in producer and bias not in inputs):
            continue
        name = written.get(b, "")
        if not name:                                     # B read by several nodes is dequantized once
            zero = inits[b_zero].astype(np.float64) if b_zero else 0.0
            weights = (inits[b].astype(np.float64) - zero) * inits[b_scale].astype(np.float64)   # per column: [N]
            name = written[b] = new(f"{b}_dequantized")
            model.graph.initializer.append(numpy_helper.from_array(weights.astype(np.float32), name))
        target = node.output[0]
        label = node.name or target
        product = new(f"{target}_matmul") if bias else target
        nodes = [onnx.helper.make_node("MatMul", [x, name], [product], name=f"{label}_matmul" if bias else label)]
        if bias:
            nodes.append(onnx.helper.make_node("Add", [product, bias], [target], name=label))
        out[target] = nodes
    return out


def _qattention(model: onnx.ModelProto, g: _OnnxGraph, node: onnx.NodeProto, written: dict[str, str],
                new: Callable[[str], str]) -> onnx.NodeProto | None:
    """com.microsoft ``Attention(x, (Wq - w_zp) * w_scale, bias, mask_index)`` with the node's attributes, for a
    ``QAttention`` of ``DynamicQuantizeLinear(x)`` (what ``quantize_dynamic`` makes of an optimized BERT's Attention;
    :mod:`.contrib` then rewrites the Attention); None for another form (input quantized elsewhere, weights or
    scales computed at run time, a past state), which the caller leaves (and refuses). ``w_scale`` and ``w_zp``: one
    value, or one per weight column. ``written``: the dequantized weights made so far, by their quantized name;
    ``new``: the namer of new tensors."""
    inits, producer = g.consts, g.producer
    names = list(node.input) + [""] * (9 - len(node.input))
    x, wq, bias, x_scale, w_scale, mask, x_zero, w_zero, past = names[:9]
    quant = producer.get(x)
    if quant is None or quant.op_type != "DynamicQuantizeLinear" or len(quant.output) < 3 or \
            quant.output[1] != x_scale or (x_zero and quant.output[2] != x_zero) or past:
        return None
    if wq not in inits or w_scale not in inits or (w_zero and w_zero not in inits) or \
            (bias and bias not in inits) or len(node.output) > 1 and any(node.output[1:]):
        return None
    weight = inits[wq].astype(np.float64)
    scale, zero = inits[w_scale].astype(np.float64), inits[w_zero].astype(np.float64) if w_zero else np.zeros(())
    if weight.ndim != 2 or any(v.size not in (1, weight.shape[1]) for v in (scale, zero)):
        return None
    name = written.get(wq, "")
    if not name:
        name = written[wq] = new(f"{wq}_dequantized")
        model.graph.initializer.append(numpy_helper.from_array(
            ((weight - zero.reshape(-1)) * scale.reshape(-1)).astype(np.float32), name))
    inputs = [quant.input[0], name, bias] + ([mask] if mask else [])
    attention = onnx.helper.make_node("Attention", inputs, [node.output[0]], name=node.name or node.output[0],
                                      domain="com.microsoft")
    attention.attribute.extend(node.attribute)
    return attention


_INT8_SHAPE_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split", "Identity",
                             "MaxPool"})
"""Operators a QOperator file applies to quantized tensors as they are (same scale and zero point; a max commutes
with the dequantization, which is increasing)."""

_QOPERATOR: dict[str, tuple[str, list[tuple[int, int, int]], tuple[int, int]]] = {
    # op -> (float op, its quantized inputs as (value, scale, zero point) indices, the output's (scale, zero point))
    "QLinearMatMul": ("MatMul", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    "QLinearAdd": ("Add", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    "QLinearMul": ("Mul", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    "QLinearSoftmax": ("Softmax", [(0, 1, 2)], (3, 4)),
    "QLinearSigmoid": ("Sigmoid", [(0, 1, 2)], (3, 4)),
    "QLinearLeakyRelu": ("LeakyRelu", [(0, 1, 2)], (3, 4)),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", [(0, 1, 2)], (3, 4)),
    "QLinearAveragePool": ("AveragePool", [(0, 1, 2)], (3, 4)),
    "QLinearConv": ("Conv", [(0, 1, 2), (3, 4, 5)], (6, 7)),
    "QGemm": ("Gemm", [(0, 1, 2), (3, 4, 5)], (7, 8)),
}


def qoperator_to_qdq(model: onnx.ModelProto, only: Callable[[onnx.NodeProto], bool] | None = None) -> None:
    """In place: every QOperator node of :data:`_QOPERATOR` (and QLinearConcat; with ``only``, those it accepts: the
    integer import's dilated QLinearConvs) becomes DequantizeLinear of its
    quantized inputs, the float operator (its attributes; a Conv's or QGemm's int32 bias dequantized at the inputs'
    scales), and QuantizeLinear of the result at its output scale; an operator of :data:`_INT8_SHAPE_OPS` on a
    quantized tensor is wrapped the same way at that tensor's scale. The model is then QDQ, which
    :func:`qdq_to_float` turns into its float graph. A node whose scales are not constants, or a QGemm with a float
    output, is left (and refused by the caller)."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    params: dict[str, tuple[str, str]] = {}              # quantized tensor -> (scale, zero point) tensor names
    nodes: list[onnx.NodeProto] = []
    count = 0
    new = tensor_namer(model)

    def dq(value: str, scale: str, zero: str, axis: int = 1) -> str:
        nonlocal count
        count += 1
        out = new(f"{value}_dq{count}")
        made = onnx.helper.make_node("DequantizeLinear", [value, scale] + ([zero] if zero else []), [out], name=out)
        if axis != 1:
            made.attribute.append(onnx.helper.make_attribute("axis", axis))
        nodes.append(made)
        return out

    def weight_axis(node: onnx.NodeProto, operand: int) -> int:
        """The axis of a per-channel second operand's scales: a QLinearConv's output channels (axis 0), a QGemm's
        output columns (0 with ``transB``, else 1), a QLinearMatMul's last axis; 1 (DequantizeLinear's default)
        for any other operand."""
        value = node.input[3] if operand == 1 and len(node.input) > 3 else ""
        if operand != 1 or value not in inits or inits[node.input[4]].size < 2:
            return 1
        if node.op_type == "QLinearConv":
            return 0
        if node.op_type == "QGemm":
            return 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
        return inits[value].ndim - 1 if node.op_type == "QLinearMatMul" else 1

    def q(value: str, scale: str, zero: str, out: str) -> None:
        nodes.append(onnx.helper.make_node("QuantizeLinear", [value, scale] + ([zero] if zero else []), [out],
                                           name=f"{out}_q"))
        params[out] = (scale, zero)

    for node in model.graph.node:
        if only is not None and not only(node):
            nodes.append(node)
            continue
        spec = _QOPERATOR.get(node.op_type)
        inputs = list(node.input) + [""] * 12
        if node.op_type == "QuantizeLinear":
            params[node.output[0]] = (node.input[1], inputs[2])
        elif node.op_type in _INT8_SHAPE_OPS and node.input and node.input[0] in params:
            scale, zero = params[node.input[0]]
            copy = onnx.NodeProto.FromString(node.SerializeToString())
            copy.input[0] = dq(node.input[0], scale, zero)
            copy.output[:] = [new(f"{o}_float") for o in node.output]
            nodes.append(copy)
            for o, fl_o in zip(node.output, copy.output):
                q(fl_o, scale, zero, o)
            continue
        elif node.op_type == "QLinearConcat" and all(t in inits for t in node.input[:2]) and \
                any(a.name == "axis" for a in node.attribute):
            floats = [dq(*node.input[k:k + 3]) for k in range(2, len(node.input), 3)]
            result = new(f"{node.output[0]}_float")
            nodes.append(onnx.helper.make_node("Concat", floats, [result], name=node.name,
                                               axis=next(a.i for a in node.attribute if a.name == "axis")))
            q(result, node.input[0], node.input[1], node.output[0])
            continue
        elif spec is not None and (node.op_type != "QGemm" or inputs[7]) and \
                all(inputs[sc] in inits and (not inputs[z] or inputs[z] in inits)
                    for _, sc, z in spec[1] + [(0, *spec[2])]):
            op, operands, (ys, yz) = spec
            floats = [dq(inputs[v], inputs[sc], inputs[z], weight_axis(node, k)) for k, (v, sc, z) in
                      enumerate(operands)]
            if any(a.name == "channels_last" and a.i for a in node.attribute):   # NHWC: no float operator of it
                nodes.append(node)
                continue
            bias = inputs[8] if node.op_type == "QLinearConv" else inputs[6] if node.op_type == "QGemm" else ""
            if bias:
                if bias not in inits:
                    nodes.append(node)
                    continue
                step = inits[inputs[1]].astype(np.float64) * inits[inputs[4]].astype(np.float64)
                name = new(f"{bias}_dequantized_{count}")           # a bias two nodes share: one copy each
                count += 1
                model.graph.initializer.append(numpy_helper.from_array(
                    (inits[bias].astype(np.float64) * step).astype(np.float32), name))
                floats.append(name)
            attrs = [a for a in node.attribute if (node.op_type != "QLinearSoftmax" or a.name == "axis")
                     and a.name != "channels_last"]     # a QOperator pool's own attribute, 0 here
            result = new(f"{node.output[0]}_float")
            fl = onnx.helper.make_node(op, floats, [result], name=node.name)
            fl.attribute.extend(attrs)
            nodes.append(fl)
            q(result, inputs[ys], inputs[yz], node.output[0])
            continue
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _fold_constant_dequantizations(model: onnx.ModelProto) -> None:
    """In place: each DequantizeLinear of initializers alone, of either domain (onnxruntime writes com.microsoft's
    for int4 or 16-bit types below opset 21: ``weight_type=QInt4``, ``UseQDQContribOps``, the QNN and Quark
    configurations), becomes the float32 initializer ONNX defines, ``(x - zero_point) * scale`` per tensor, per
    axis or per block of ``block_size`` along the axis, so the float import folds no com.microsoft node (it refused
    them). One whose scales do not fit its values is left (and named by the import)."""
    folded = dequantized_constants(model, {init.name: init for init in model.graph.initializer})
    if folded:
        kept = [node for node in model.graph.node if not (node.output and node.output[0] in folded)]
        del model.graph.node[:]
        model.graph.node.extend(kept)
        model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in folded.items())


def dequantized_constants(model: onnx.ModelProto, consts: Mapping[str, np.ndarray | onnx.TensorProto]
                          ) -> dict[str, np.ndarray]:
    """The float32 values of each DequantizeLinear (of either domain) of ``model`` whose inputs are all ``consts``
    (arrays, or initializers read when used), by its output: ``(x - zero_point) * scale`` as ONNX defines it (per
    tensor, per axis, per block); one whose scales do not fit its values is left out."""
    def array(name: str) -> np.ndarray:
        value = consts[name]
        return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)

    out: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        names = list(node.input) + [""] * (3 - len(node.input))
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx", "com.microsoft") or \
                names[0] not in consts or names[1] not in consts or (names[2] and names[2] not in consts):
            continue
        value = _dequantized(array(names[0]), array(names[1]), array(names[2]) if names[2] else None,
                             {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT})
        if value is not None:
            out[node.output[0]] = value
    return out


def _dequantized(x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None, attrs: dict[str, int]
                 ) -> np.ndarray | None:
    """ONNX's DequantizeLinear of constants in float32 (``axis`` default 1, ``block_size`` 0), or None when the
    scale's shape fits neither a tensor, an axis nor blocks of the values."""
    zero = np.zeros_like(scale, np.int64) if zero is None else zero.astype(np.int64)
    if scale.shape != zero.shape:
        return None
    values = x.astype(np.int64)
    if scale.size == 1:                                    # per tensor, whatever its rank
        scale, zero = scale.reshape(()), zero.reshape(())
    else:
        if values.ndim == 0:
            return None
        axis = attrs.get("axis", 1) % values.ndim
        block = attrs.get("block_size", 0)
        if block <= 0 and scale.size != values.shape[axis]:
            return None
        params = along_axis(values.shape, scale, zero, axis, block)
        if params is None:
            return None
        scale, zero = params
    return ((values - zero).astype(np.float32) * scale.astype(np.float32)).astype(np.float32)


def along_axis(shape: tuple[int, ...], scale: np.ndarray, zero: np.ndarray, axis: int, block: int = 0
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """A DequantizeLinear's ``scale`` and ``zero`` point shaped to broadcast against values of ``shape``: with
    ``block`` (opset 21's ``block_size``) each repeated over its block along ``axis`` (None when the blocks do not
    fit the values), else along ``axis`` when they hold several values, else as they are (per tensor)."""
    if block > 0:
        if scale.ndim != len(shape) or -(-shape[axis] // block) != scale.shape[axis]:
            return None
        return (np.repeat(scale, block, axis=axis).take(range(shape[axis]), axis=axis),
                np.repeat(zero, block, axis=axis).take(range(shape[axis]), axis=axis))
    if scale.size > 1:
        broadcast = [1] * len(shape)
        broadcast[axis] = -1
        return scale.reshape(broadcast), zero.reshape(broadcast)
    return scale, zero


def _final(name: str, rename: dict[str, str]) -> str:
    while name in rename:
        name = rename[name]
    return name


def _constant(name: str, producer: dict[str, onnx.NodeProto], inits: set[str]) -> bool:
    """Whether ``name`` is computed from initializers alone (through Constant nodes and operators on them)."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        t = todo.pop()
        if not t or t in inits or t in seen:
            continue
        seen.add(t)
        node = producer.get(t)
        if node is None:
            return False                                      # a graph input
        todo.extend(node.input)
    return True
