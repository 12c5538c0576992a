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

Dynamic quantization (``DynamicQuantizeLinear``, ``MatMulInteger``, ``ConvInteger``) and the QOperator format
(``QLinearConv``, ``QLinearMatMul``, ...) are not QDQ: :func:`qdq_to_float` returns None for them.
"""
from __future__ import annotations

import onnx

__all__ = ["qdq_to_float", "QDQ_OPS"]

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
"""The only quantized operators of a QDQ model."""

_QUANTIZED = frozenset({"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
                        "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat",
                        "QLinearSoftmax", "QGemm", "QAttention", "ConvInteger", "MatMulInteger",
                        "DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def qdq_to_float(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of the QDQ ``model`` without its activation QuantizeLinear -> DequantizeLinear pairs (each pair's
    output read as the pair's float input); constants' pairs and DequantizeLinear of integer constants stay, to fold
    at import. None when ``model`` is not QDQ (another quantized operator) or a QuantizeLinear of an activation is
    read by anything but DequantizeLinear."""
    if any(node.op_type in _QUANTIZED for node in model.graph.node):
        return None
    out = onnx.ModelProto.FromString(model.SerializeToString())
    inits = {i.name for i in out.graph.initializer}
    producer = {o: n for n in out.graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in out.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    rename: dict[str, str] = {}
    drop: set[str] = set()                                    # outputs of the pairs' nodes
    for node in out.graph.node:
        if node.op_type != "QuantizeLinear" or _constant(node.input[0], producer, inits):
            continue
        users = readers.get(node.output[0], [])
        if not users or any(u.op_type != "DequantizeLinear" for u in users) or node.output[0] in _outputs(out):
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


def _final(name: str, rename: dict[str, str]) -> str:
    while name in rename:
        name = rename[name]
    return name


def _outputs(model: onnx.ModelProto) -> set[str]:
    return {o.name for o in model.graph.output}


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
