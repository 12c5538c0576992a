"""Models stored in float16 or bfloat16 (``model.half()`` before export, or a converter's output), widened to float32
before import.

The lab quantizes from float32. Every float16 and bfloat16 value is exactly a float32 value, so widening the
initializers, Constant nodes, ConstantOfShape fills, graph inputs, outputs and value infos, and turning each Cast to
float16/bfloat16 into a Cast to float32, gives the float32 model that computes what the file computes, without the
file's rounding to half precision after each node. Quantizing that model to int8 is then what the lab does for any
float32 model; the error the run reports is against onnxruntime on the file as given, in its half precision.

Models stored in float64 (sklearn-onnx's ``double`` converters, ``model.double()`` before export) are *narrowed* to
float32 the same way (:func:`narrow_double`), each value rounded to the nearest float32 (a value beyond float32's
range becomes an infinity of its sign, as a mask's -1e300 does in float32 anyway). That rounding is far below the
int8 quantization's, and the error the run reports is again against onnxruntime on the file as given, in float64.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

__all__ = ["holds_half", "widen_half", "holds_double", "narrow_double"]

_HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
_DOUBLE = (TensorProto.DOUBLE,)


class HalfTensorTooLarge(ValueError):
    """A float16/bfloat16 initializer that would exceed the byte limit once widened (its name and element count)."""


def _widen_tensor(tensor: onnx.TensorProto, limit: int | None = None, kinds: tuple[int, ...] = _HALF) -> bool:
    if tensor.data_type not in kinds:
        return False
    if limit is not None and int(np.prod(tensor.dims, dtype=np.int64)) * 2 > limit:
        raise HalfTensorTooLarge(tensor.name)
    with np.errstate(over="ignore"):
        value = numpy_helper.to_array(tensor).astype(np.float32)
    tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    return True


def _widen_graph(graph: onnx.GraphProto, limit: int | None = None, kinds: tuple[int, ...] = _HALF) -> int:
    """Turn ``graph``'s tensors, types and casts of the element types ``kinds`` into float32, in place (its
    subgraphs too); returns how many changed. An initializer of more than ``limit`` bytes in half precision is left
    as it is (the size check names it)."""
    changed = 0
    for init in graph.initializer:
        try:
            changed += _widen_tensor(init, limit, kinds)
        except HalfTensorTooLarge:
            continue
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        tensor_type = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tensor_type.elem_type in kinds:
            tensor_type.elem_type = TensorProto.FLOAT
            changed += 1
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                changed += _widen_tensor(attr.t, None, kinds)
            elif attr.type == onnx.AttributeProto.INT and attr.name == "to" and node.op_type == "Cast" and \
                    attr.i in kinds:
                attr.i = TensorProto.FLOAT
                changed += 1
            elif attr.type == onnx.AttributeProto.GRAPH:
                changed += _widen_graph(attr.g, limit, kinds)
    return changed


def _holds(model: onnx.ModelProto, kinds: tuple[int, ...]) -> bool:
    graph = model.graph
    return any(i.data_type in kinds for i in graph.initializer) or \
        any(vi.type.tensor_type.elem_type in kinds for vi in [*graph.input, *graph.output, *graph.value_info])


def holds_half(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph declares a float16 or bfloat16 input, output, value info or initializer."""
    return _holds(model, _HALF)


def holds_double(model: onnx.ModelProto) -> bool:
    """Whether ``model``'s main graph declares a float64 input, output, value info or initializer."""
    return _holds(model, _DOUBLE)


def narrow_double(model: onnx.ModelProto, label: str) -> bool:
    """Narrow ``model``'s float64 tensors, types and casts to float32 (each value rounded to nearest), in place; log
    a warning naming the file when there were any. Returns whether there were."""
    if not _widen_graph(model.graph, None, _DOUBLE):
        return False
    logging.getLogger("vta").warning(
        "%s holds float64 tensors: the lab imports them rounded to float32 and quantizes from there; the error it "
        "reports is against the file as onnxruntime runs it, in float64", label)
    return True


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
