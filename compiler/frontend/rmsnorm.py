"""RMSNorm's decompositions, as exporters emit them at opsets without ``RMSNormalization`` (it arrives in opset 23),
matched on the ONNX graph so that :func:`.onnx_fusions._fuse_decompositions` can put one node in their place.

RMSNorm over the last axis of ``x [..., D]`` is ``x / sqrt(mean(x**2) + eps) * weight`` (no mean subtracted, no
bias: Llama's ``LlamaRMSNorm``, T5's ``T5LayerNorm``). The forms matched, each over the last axis only:

- ``Pow(x, 2)`` or ``Mul(x, x)`` -> ``ReduceMean`` (keepdims) -> ``Add(eps)`` (absent: eps 0, as torch's new
  exporter writes Helium's eps of 1e-8), then the inverse root as one of
  ``Sqrt -> Div(1, .)``, ``Sqrt -> Reciprocal``, ``Pow(., -0.5)`` followed by ``Mul(x, .)`` (either operand order),
  or ``Sqrt -> Div(x, .)``;
- then optionally identity ``Cast`` nodes (to FLOAT, as torch writes around a float32 upcast) and a ``Mul`` by a
  constant weight that broadcasts along the last axis only (either operand order), which becomes the scale.

Every inner tensor must have exactly one reader (``x`` may have others) and none may be a graph output, so the
replaced nodes compute nothing else. :func:`match_rms_norm` returns the nodes and the parts of the fused node.
"""
from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import onnx

__all__ = ["match_rms_norm", "last_axis_mean", "square_of", "match_grn", "match_gain_l2", "FUSED_OP", "GRN_OP",
           "GAIN_L2_OP"]

FUSED_OP = "RMSNormalization"
"""The op type of the fused node (inputs ``x`` and ``scale``, attributes ``axis`` = -1 and ``epsilon``): opset 23's
operator of that name, which the importer's rule also reads."""


class OnnxGraph(Protocol):
    """What the matcher reads of an ONNX graph (:class:`.onnx_fusions._OnnxGraph`)."""

    consts: dict[str, np.ndarray]
    producer: dict[str, onnx.NodeProto]
    consumers: dict[str, list[onnx.NodeProto]]
    outputs: set[str]

    def only_user(self, tensor: str, op: str) -> onnx.NodeProto | None: ...

    def other_input(self, node: onnx.NodeProto, tensor: str) -> str: ...

    def scalar(self, node: onnx.NodeProto, tensor: str) -> float | None: ...


def last_axis_mean(g: OnnxGraph, node: onnx.NodeProto, rank: int) -> bool:
    """Whether ``node`` (a ReduceMean) averages over the last axis only and keeps it (keepdims, the default), or is
    a GlobalAveragePool of a rank-3 tensor (tf2onnx's mean over the last axis)."""
    if node.op_type == "GlobalAveragePool":
        return rank == 3
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    axes = attrs.get("axes")
    if len(node.input) > 1 and node.input[1]:
        axes = g.consts[node.input[1]].reshape(-1).tolist() if node.input[1] in g.consts else None
    if axes is None or not attrs.get("keepdims", 1):
        return False
    return [int(v) % rank for v in axes] == [rank - 1]


def square_of(g: OnnxGraph, node: onnx.NodeProto) -> str | None:
    """``x`` when ``node`` is ``Pow(x, 2)`` or ``Mul(x, x)``."""
    if node.op_type == "Pow" and node.input[1] in g.consts and g.scalar(node, node.input[0]) == 2.0:
        return node.input[0]
    if node.op_type == "Mul" and node.input[0] == node.input[1]:
        return node.input[0]
    return None


def _inverse_root(g: OnnxGraph, add: onnx.NodeProto, x: str) -> tuple[list[onnx.NodeProto], str] | None:
    """From ``Add(mean, eps)`` (or the mean itself): the nodes computing ``x / sqrt(.)`` and the tensor holding
    it."""
    power = g.only_user(add.output[0], "Pow")
    if power is not None and power.input[0] == add.output[0] and g.scalar(power, add.output[0]) == -0.5:
        inv: list[onnx.NodeProto] = [power]
    else:
        sqrt = g.only_user(add.output[0], "Sqrt")
        if sqrt is None:
            return None
        users = g.consumers.get(sqrt.output[0], [])
        if len(users) != 1 or sqrt.output[0] in g.outputs:
            return None
        last = users[0]
        if last.op_type == "Div" and list(last.input) == [x, sqrt.output[0]]:
            return [sqrt, last], last.output[0]
        if last.op_type == "Reciprocal" or (last.op_type == "Div" and last.input[1] == sqrt.output[0] and
                                            last.input[0] in g.consts and g.scalar(last, sqrt.output[0]) == 1.0):
            inv = [sqrt, last]
        else:
            return None
    mul = g.only_user(inv[-1].output[0], "Mul")
    if mul is None or sorted(mul.input) != sorted([x, inv[-1].output[0]]):
        return None
    return [*inv, mul], mul.output[0]


def _identity_casts(g: OnnxGraph, out: str) -> tuple[list[onnx.NodeProto], str]:
    """The Cast-to-FLOAT nodes that follow ``out`` one after another (identities on float32 values)."""
    nodes: list[onnx.NodeProto] = []
    while True:
        cast = g.only_user(out, "Cast")
        to = None if cast is None else next((a.i for a in cast.attribute if a.name == "to"), None)
        if cast is None or to != onnx.TensorProto.FLOAT:
            return nodes, out
        nodes.append(cast)
        out = cast.output[0]


def match_rms_norm(g: OnnxGraph, mean: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]
                   ) -> tuple[list[onnx.NodeProto], dict[str, Any]] | None:
    """The RMSNorm decomposition around the ReduceMean ``mean`` (see the module docstring): (its nodes in graph
    order, ``{"x", "epsilon", "weight" (float64 ``[D]``, ones without a weight Mul), "out"}``), or None."""
    square = g.producer.get(mean.input[0])
    x = None if square is None else square_of(g, square)
    if square is None or x is None or x not in shapes or not last_axis_mean(g, mean, len(shapes[x])):
        return None
    if g.consumers.get(square.output[0]) != [mean] or square.output[0] in g.outputs:
        return None
    add = g.only_user(mean.output[0], "Add")
    eps = None if add is None else g.scalar(add, mean.output[0])
    if add is None or eps is None:          # no eps Add: torch's new exporter drops an eps float32 cannot add
        add, eps = mean, 0.0
    if eps < 0:
        return None
    found = _inverse_root(g, add, x)
    if found is None:
        return None
    inv, out = found
    nodes = [square, mean, *([add] if add is not mean else []), *inv]
    width = shapes[x][-1]
    casts, out = _identity_casts(g, out)
    nodes += casts
    weight = np.ones(width)
    scale = g.only_user(out, "Mul")
    other = None if scale is None else g.other_input(scale, out)
    value = None if other is None else g.consts.get(other)
    if scale is not None and value is not None and value.size in (1, width) and \
            (value.ndim == 0 or value.shape[-1] == value.size):
        weight = np.broadcast_to(value.astype(np.float64).reshape(-1), (width,)).copy()
        nodes.append(scale)
        out = scale.output[0]
    return nodes, {"x": x, "epsilon": eps, "weight": weight, "out": out}


GRN_OP = "GRNScale"
"""The op type of ConvNeXt-V2's fused response normalization (the lab's own: attributes ``axes`` and ``epsilon``)."""


def match_grn(g: OnnxGraph, l2: onnx.NodeProto, axes: list[int], rank: int
              ) -> tuple[list[onnx.NodeProto], str, float] | None:
    """ConvNeXt-V2's global response normalization, its scale part: ``x * (G / (mean_c(G) + eps))`` with ``G =
    ReduceL2(x, spatial axes, keepdims)`` and the mean over the last (channel) axis, either operand order of the
    product: the nodes (the Mul last), ``x`` and eps. (The GRN's ``gamma * . + beta + x`` are a constant Mul and
    Adds the lab imports as they are.)"""
    x, norm = l2.input[0], l2.output[0]
    if len(axes) < 1 or rank - 1 in [a % rank for a in axes] or norm in g.outputs:
        return None
    readers = g.consumers.get(norm, [])
    mean = next((n for n in readers if n.op_type == "ReduceMean"), None)
    div = next((n for n in readers if n.op_type == "Div"), None)
    if len(readers) != 2 or mean is None or div is None or div.input[0] != norm or \
            not last_axis_mean(g, mean, rank):
        return None
    add = g.only_user(mean.output[0], "Add")
    eps = g.scalar(add, mean.output[0]) if add is not None else None
    if add is None or eps is None or div.input[1] != add.output[0] or eps < 0 or \
            len(g.consumers.get(add.output[0], [])) != 1:
        return None
    mul = g.only_user(div.output[0], "Mul")
    if mul is None or sorted(mul.input) != sorted([x, div.output[0]]) or mul.input[0] == mul.input[1]:
        return None
    return [l2, mean, add, div, mul], x, eps


GAIN_L2_OP = "GainL2Scale"
"""The op type of a fused ``x * min(gain / (||x||_2 + eps), max_gain)`` (the lab's own: attributes ``axis``,
``epsilon``, ``gain`` and ``max_gain``)."""


def match_gain_l2(g: OnnxGraph, l2: onnx.NodeProto, axes: list[int]) -> tuple[list[onnx.NodeProto], dict] | None:
    """``x * min(gain / (ReduceL2(x, axis, keepdims) + eps), max_gain)`` over one axis (Inkling-2's query and key
    norms): the norm, an optional ``Add`` of a constant ``eps``, the inverse as ``Reciprocal`` (then an optional
    ``Mul`` by a constant ``gain``) or ``Div(gain, .)``, an optional clip from above (``Clip`` with a max only, or
    ``Min`` with a constant), then ``Mul(x, .)`` in either order. Returns the nodes (the Mul last) and the fused
    node's attributes, with ``x``."""
    if len(axes) != 1:
        return None
    x, tensor, nodes = l2.input[0], l2.output[0], [l2]
    parts: dict = {"x": x, "axis": int(axes[0]), "epsilon": 0.0, "gain": 1.0, "max_gain": float("inf")}

    def single(t: str) -> onnx.NodeProto | None:
        users = g.consumers.get(t, [])
        return users[0] if len(users) == 1 and t not in g.outputs else None

    step = single(tensor)
    if step is not None and step.op_type == "Add":
        value = g.scalar(step, tensor)
        if value is None or value < 0:
            return None
        nodes.append(step)
        parts["epsilon"], tensor, step = value, step.output[0], single(step.output[0])
    if step is None:
        return None
    if step.op_type == "Reciprocal":
        nodes.append(step)
        tensor, step = step.output[0], single(step.output[0])
        if step is not None and step.op_type == "Mul" and g.scalar(step, tensor) is not None and \
                step.input[0] != x and step.input[1] != x:
            parts["gain"] = g.scalar(step, tensor)
            nodes.append(step)
            tensor, step = step.output[0], single(step.output[0])
    elif step.op_type == "Div" and step.input[1] == tensor and step.input[0] in g.consts and \
            g.consts[step.input[0]].size == 1:
        parts["gain"] = float(g.consts[step.input[0]].reshape(()))
        nodes.append(step)
        tensor, step = step.output[0], single(step.output[0])
    else:
        return None
    if step is not None and step.op_type in ("Clip", "Min"):
        if step.op_type == "Clip":
            low = step.input[1] if len(step.input) > 1 else ""
            high = step.input[2] if len(step.input) > 2 else ""
            if low or high not in g.consts or g.consts[high].size != 1:
                return None
            parts["max_gain"] = float(g.consts[high].reshape(()))
        else:
            value = g.scalar(step, tensor)
            if value is None or len(step.input) != 2:
                return None
            parts["max_gain"] = value
        nodes.append(step)
        tensor, step = step.output[0], single(step.output[0])
    if step is None or step.op_type != "Mul" or sorted(step.input) != sorted([x, tensor]) or parts["gain"] <= 0:
        return None
    return nodes + [step], parts
