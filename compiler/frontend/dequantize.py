"""A QDQ-quantized model whose operators the integer import (:mod:`.prequant`) does not take, as its dequantized
float graph.

onnxruntime's ``quantize_static`` in QDQ format leaves every operator float and wraps it in QuantizeLinear /
DequantizeLinear pairs: weights are ``DequantizeLinear`` of int8 constants, activations pass through a
``QuantizeLinear`` -> ``DequantizeLinear`` pair (a fake quantization). :mod:`.prequant` imports such a model with the
file's own scales when it knows every operator (the CNN operators). For the rest (a transformer's Softmax, LayerNorm,
attention products, masks...) :func:`qdq_to_float` removes every activation pair, so the model is the float graph
the quantizer started from, with its weights at their int8 values (each ``DequantizeLinear`` of a constant folds at
import). The lab then quantizes it as any float model: its own activation scales, calibrated on ``--calibration``
data (or, with the usual warning, on random inputs), so the run is not bit-exact with onnxruntime's integer
execution of the file, and says which model it measured its error against.

onnxruntime's ``quantize_dynamic`` writes ``MatMulInteger`` of ``DynamicQuantizeLinear`` activations by int8
weights: each such chain becomes the float MatMul with the weights' int8 values (:func:`_dynamic_to_float`). Other
dynamic forms (``ConvInteger``, the fused ``MatMulIntegerToFloat``) and the QOperator format (``QLinearConv``,
``QLinearMatMul``, ...) are not dequantized: :func:`qdq_to_float` returns None for them.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .masks import live_nodes
from .onnx_fusions import _OnnxGraph

__all__ = ["qdq_to_float", "qdq_ranges", "QDQ_OPS"]

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""The only quantized operators of a QDQ model."""

_QUANTIZED = frozenset({"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                        "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat",
                        "QLinearSoftmax", "QGemm", "QAttention", "ConvInteger", "MatMulInteger",
                        "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def qdq_to_float(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of the QDQ (or dynamically quantized) ``model`` with its dynamic MatMuls made float again
    (:func:`_dynamic_to_float`) and without its activation QuantizeLinear -> DequantizeLinear pairs (each pair's
    output read as the pair's float input); constants' pairs and DequantizeLinear of integer constants stay, to fold
    at import. None when ``model`` is not QDQ (another quantized operator) or a QuantizeLinear of an activation is
    read by anything but DequantizeLinear."""
    out = onnx.ModelProto.FromString(model.SerializeToString())
    _dynamic_to_float(out)
    if any(node.op_type in _QUANTIZED for node in out.graph.node):
        return None
    g = _OnnxGraph(out)
    inits, producer, readers = set(g.consts), g.producer, g.consumers
    rename: dict[str, str] = {}
    drop: set[str] = set()                                    # outputs of the pairs' nodes
    for node in out.graph.node:
        if node.op_type != "QuantizeLinear" or _constant(node.input[0], producer, inits):
            continue
        users = readers.get(node.output[0], [])
        if not users or any(u.op_type != "DequantizeLinear" for u in users) or node.output[0] in g.outputs:
            return None
        drop.add(node.output[0])
        for dq in users:
            rename[dq.output[0]] = node.input[0]
            drop.add(dq.output[0])
    if not rename:
        return out
    kept = [n for n in out.graph.node if not (n.output and n.output[0] in drop)]
    for node in kept:
        node.input[:] = [_final(t, rename) for t in node.input]
    for o in out.graph.output:
        if o.name in rename:
            kept.append(onnx.helper.make_node("Identity", [_final(o.name, rename)], [o.name]))
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


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
        scale = inits.get(node.input[1])
        zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.uint8)
        if scale is None or zero is None or scale.size != 1 or zero.size != 1 or zero.dtype.kind not in "iu":
            continue
        info = np.iinfo(zero.dtype)
        z = int(zero.reshape(()))
        value = float(scale.reshape(())) * max(z - int(info.min), int(info.max) - z)
        if np.isfinite(value) and value > 0:                 # onnxruntime writes inf for a -inf mask's range
            ranges[node.input[0]] = value
    return ranges


def _dynamic_to_float(model: onnx.ModelProto) -> None:
    """In place: each ``MatMulInteger(DynamicQuantizeLinear(x), Wq, x_zp, w_zp) -> Cast -> Mul(., x_scale * w_scale)``
    chain (onnxruntime's ``quantize_dynamic`` of a MatMul by constant weights) becomes ``MatMul(x, (Wq - w_zp) *
    w_scale)``: the float layer with its int8 weights' values; a ``DequantizeLinear`` of a ``Gather`` from an int8
    table (a quantized embedding) becomes a Gather from the dequantized table. Nodes left unread afterwards (the
    dynamic quantization of ``x``, the scale products) are dropped. Chains of another form are left (and refused by
    the caller)."""
    g = _OnnxGraph(model)
    inits, producer = g.consts, g.producer
    replace: dict[str, onnx.NodeProto] = {}                  # the chain's final Mul output -> its float MatMul
    gone: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "MatMulInteger" or node.input[1] not in inits:
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
        weights = (inits[node.input[1]].astype(np.float64) - zero.astype(np.float64)) * w_scale.astype(np.float64)
        name = f"{node.input[1]}_dequantized"
        model.graph.initializer.append(numpy_helper.from_array(weights.astype(np.float32), name))
        replace[mul.output[0]] = onnx.helper.make_node("MatMul", [quant.input[0], name], [mul.output[0]],
                                                       name=node.name or mul.output[0])
        gone.update({node.output[0], cast.output[0]})
    for node in model.graph.node:                            # DequantizeLinear(Gather(int8 table, ids))
        gather = producer.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if gather is None or gather.op_type != "Gather" or gather.input[0] not in inits or \
                any(a.name == "axis" and a.i != 0 for a in gather.attribute) or \
                g.only_user(gather.output[0], "DequantizeLinear") is None:
            continue
        scale = inits.get(node.input[1])
        zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros((), np.int64)
        if scale is None or zero is None or scale.size != 1 or zero.size != 1:
            continue
        table = (inits[gather.input[0]].astype(np.float64) - zero.astype(np.float64)) * scale.astype(np.float64)
        name = f"{gather.input[0]}_dequantized"
        model.graph.initializer.append(numpy_helper.from_array(table.astype(np.float32), name))
        replace[node.output[0]] = onnx.helper.make_node("Gather", [name, gather.input[1]], [node.output[0]],
                                                        name=gather.name or node.output[0], axis=0)
        gone.add(gather.output[0])
    if not replace:
        return
    kept = []
    for node in model.graph.node:
        if node.output and node.output[0] in replace:
            kept.append(replace[node.output[0]])
        elif not (node.output and node.output[0] in gone):
            kept.append(node)
    kept = live_nodes(kept, {o.name for o in model.graph.output})
    del model.graph.node[:]
    model.graph.node.extend(kept)


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
