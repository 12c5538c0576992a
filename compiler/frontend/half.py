"""Models stored in float16 or bfloat16 (``model.half()`` before export, or a converter's output), widened to float32
before import.

The lab quantizes from float32. Every float16 and bfloat16 value is exactly a float32 value, so widening the
initializers, Constant nodes, ConstantOfShape fills, graph inputs, outputs and value infos, and turning each Cast to
float16/bfloat16 into a Cast to float32, gives the float32 model that computes what the file computes, without the
file's rounding to half precision after each node. Quantizing that model to int8 is then what the lab does for any
float32 model; the error the run reports is against onnxruntime on the file as given, in its half precision.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["holds_half", "widen_half"]

_HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


class HalfTensorTooLarge(ValueError):
    """A float16/bfloat16 initializer that would exceed the byte limit once widened (its name and element count)."""


def _widen_tensor(tensor: onnx.TensorProto, limit: int | None = None) -> bool:
    if tensor.data_type not in _HALF:
        return False
    if limit is not None and int(np.prod(tensor.dims, dtype=np.int64)) * 2 > limit:
        raise HalfTensorTooLarge(tensor.name)
    value = numpy_helper.to_array(tensor).astype(np.float32)
    tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    return True


def _widen_graph(graph: onnx.GraphProto, limit: int | None = None) -> int:
    """Widen ``graph`` in place (its subgraphs too); returns how many tensors, types and casts changed. An
    initializer of more than ``limit`` bytes in half precision is left as it is (the size check names it)."""
    changed = 0
    for init in graph.initializer:
        try:
            changed += _widen_tensor(init, limit)
        except HalfTensorTooLarge:
            continue
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        tensor_type = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tensor_type.elem_type in _HALF:
            tensor_type.elem_type = TensorProto.FLOAT
            changed += 1
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                changed += _widen_tensor(attr.t)
            elif attr.type == onnx.AttributeProto.INT and attr.name == "to" and node.op_type == "Cast" and \
                    attr.i in _HALF:
                attr.i = TensorProto.FLOAT
                changed += 1
            elif attr.type == onnx.AttributeProto.GRAPH:
                changed += _widen_graph(attr.g, limit)
    return changed


def holds_half(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph declares a float16 or bfloat16 input, output, value info or initializer."""
    graph = model.graph
    return any(i.data_type in _HALF for i in graph.initializer) or \
        any(vi.type.tensor_type.elem_type in _HALF for vi in [*graph.input, *graph.output, *graph.value_info])


def widen_half(model: onnx.ModelProto, label: str, limit: int | None = None) -> bool:
    """Widen ``model``'s float16 and bfloat16 tensors, types and casts to float32, in place; log a warning naming the
    file when there were any. Returns whether there were. An initializer whose half-precision bytes exceed ``limit``
    stays as it is, allocating nothing, for the caller's size check to refuse."""
    if not _widen_graph(model.graph, limit):
        return False
    logging.getLogger("vta").warning(
        "%s holds float16 or bfloat16 tensors: the lab imports them widened to float32 (exactly) and quantizes from "
        "there; the error it reports is against the file as onnxruntime runs it, in half precision", label)
    return True
