"""Decompositions exporters emit (LayerNorm's, Gelu's, SiLU's, RMSNorm's), fused back into one node before the ONNX
import rules run (:func:`_fuse_decompositions`), and torch's unoptimized ``torch.split`` (SplitToSequence and
SequenceAt) as one Split (:func:`_split_sequences`)."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import contrib, float_ref, rmsnorm
from .masks import live_nodes
from .onnx_common import _attrs, tensor_namer


class _OnnxGraph:
    """Producers, consumers and constants of an ONNX graph's tensors, for the pattern matchers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for out in node.output:
                self.producer[out] = node
            for inp in node.input:
                self.consumers.setdefault(inp, []).append(node)
        self.outputs = {o.name for o in model.graph.output}

    def only_user(self, tensor: str, op: str) -> onnx.NodeProto | None:
        """The single consumer of ``tensor`` when it has op ``op`` and ``tensor`` is not a graph output."""
        users = self.consumers.get(tensor, [])
        if len(users) == 1 and users[0].op_type == op and tensor not in self.outputs:
            return users[0]
        return None

    def readers(self, tensor: str) -> list[onnx.NodeProto]:
        """The nodes that read ``tensor``, each once (``Mul(d, d)`` reads ``d`` twice)."""
        return list({id(u): u for u in self.consumers.get(tensor, [])}.values())

    def other_input(self, node: onnx.NodeProto, tensor: str) -> str:
        return node.input[1] if node.input[0] == tensor else node.input[0]

    def scalar(self, node: onnx.NodeProto, tensor: str) -> float | None:
        """The value of ``node``'s other (constant, one-element) operand."""
        other = self.other_input(node, tensor)
        value = self.consts.get(other)
        return float(value.reshape(())) if value is not None and value.size == 1 else None


def _reduce_axes(g: _OnnxGraph, node: onnx.NodeProto) -> list[int] | None:
    a = _attrs(node)
    axes = a.get("axes")
    if len(node.input) > 1 and node.input[1]:
        axes = g.consts[node.input[1]].tolist() if node.input[1] in g.consts else None
    return None if axes is None or not a.get("keepdims", 1) else [int(v) for v in axes]


def _channel_vector(value: np.ndarray) -> np.ndarray | None:
    """``value`` as a vector along the last axis (a scalar, or all its other axes of size 1), else None: a LayerNorm's
    gamma or beta."""
    return value.reshape(-1) if value.ndim == 0 or value.shape[-1] == value.size else None


def _match_layer_norm(g: _OnnxGraph, mean: onnx.NodeProto, rank: int
                      ) -> tuple[list[onnx.NodeProto], dict[str, Any]] | None:
    """``ReduceMean(x) -> Sub(x, mean) -> Pow 2 (or Mul by itself) -> ReduceMean -> Add eps -> Sqrt -> Div`` (or
    a Mul by the Sqrt's Reciprocal) over the last axis, then an optional Mul by gamma and Add of beta: the nodes
    and the LayerNormalization's parts."""
    axes = _reduce_axes(g, mean)
    if axes is None or [v % rank for v in axes] != [rank - 1]:
        return None
    x = mean.input[0]
    sub = g.only_user(mean.output[0], "Sub")
    if sub is None or list(sub.input) != [x, mean.output[0]]:
        return None
    d = sub.output[0]
    users = g.readers(d)
    sq = next((u for u in users if (u.op_type == "Pow" and g.scalar(u, d) == 2.0) or
               (u.op_type == "Mul" and list(u.input) == [d, d])), None)
    div = next((u for u in users if u is not sq), None)          # Div(d, root), or Mul(d, Reciprocal(root))
    if len(users) != 2 or div is None or sq is None or d in g.outputs or \
            not ((div.op_type == "Div" and div.input[0] == d) or div.op_type == "Mul"):
        return None
    var = g.only_user(sq.output[0], "ReduceMean")
    if var is None or _reduce_axes(g, var) != axes:
        return None
    add = g.only_user(var.output[0], "Add")
    eps = None if add is None else g.scalar(add, var.output[0])
    sqrt = None if add is None else g.only_user(add.output[0], "Sqrt")
    if add is None or eps is None or sqrt is None:
        return None
    root = [sqrt]
    if div.op_type == "Mul":                                       # Cohere's bias-free LayerNorm writes d * rsqrt
        recip = g.only_user(sqrt.output[0], "Reciprocal")
        if recip is None or sorted(div.input) != sorted([d, recip.output[0]]):
            return None
        root.append(recip)
    if list(div.input) not in ([d, root[-1].output[0]], [root[-1].output[0], d]) or \
            g.consumers.get(root[-1].output[0], []) != [div]:
        return None
    nodes: list[onnx.NodeProto] = [mean, sub, sq, var, add, *root, div]
    out, parts = div.output[0], {"x": x, "epsilon": eps}
    for op, key in (("Mul", "gamma"), ("Add", "beta")):
        nxt = g.only_user(out, op)
        other = None if nxt is None else g.other_input(nxt, out)
        vector = None if nxt is None or other is None or other not in g.consts else _channel_vector(g.consts[other])
        if nxt is None or vector is None:
            continue
        nodes.append(nxt)
        parts[key], out = vector, nxt.output[0]
    parts["out"] = out
    return nodes, parts


def _match_one_pass_layer_norm(g: _OnnxGraph, mean: onnx.NodeProto, rank: int
                               ) -> tuple[list[onnx.NodeProto], dict[str, Any]] | None:
    """ONNX's own LayerNormalization function body over the last axis: ``m = ReduceMean(x)``, ``var =
    ReduceMean(x * x) - m * m``, ``(x - m) / Sqrt(var + eps)``, with ``m`` and ``Reciprocal(Sqrt(.))`` also read as
    the Mean and InvStdDev outputs; the variance may be clamped at zero first, ``Max(var, c)`` with a constant
    ``c <= 0`` (Flax's ``use_fast_variance``, as jax2onnx writes it: a no-op on the exact variance, which the fused
    node computes). Computed step by step in int8, the variance's two means cancel; as one
    LayerNormalization (its statistics as its second and third outputs) it is exact from the int8 input. The nodes
    (the first ReduceMean last: the fused node stands where it did, before any reader of the mean) and the parts."""
    axes = _reduce_axes(g, mean)
    if axes is None or [v % rank for v in axes] != [rank - 1]:
        return None
    x, m = mean.input[0], mean.output[0]
    users = g.readers(m)
    square_mean = next((u for u in users if u.op_type == "Mul" and list(u.input) == [m, m]), None)
    sub = next((u for u in users if u.op_type == "Sub" and list(u.input) == [x, m]), None)
    if square_mean is None or sub is None:
        return None
    var = g.only_user(square_mean.output[0], "Sub")
    if var is None or var.input[1] != square_mean.output[0]:
        return None
    mean_sq = g.producer.get(var.input[0])
    square = None if mean_sq is None else g.producer.get(mean_sq.input[0])
    if mean_sq is None or mean_sq.op_type != "ReduceMean" or _reduce_axes(g, mean_sq) != axes or square is None or \
            rmsnorm.square_of(g, square) != x or len(g.readers(mean_sq.input[0])) != 1 or \
            len(g.readers(mean_sq.output[0])) != 1:
        return None
    clamp = g.only_user(var.output[0], "Max")
    floor = None if clamp is None or len(clamp.input) != 2 else g.scalar(clamp, var.output[0])
    if clamp is not None and (floor is None or floor > 0):
        return None                                         # a floor above 0 changes the variance
    variance = var if clamp is None else clamp
    add = g.only_user(variance.output[0], "Add")
    eps = None if add is None else g.scalar(add, variance.output[0])
    sqrt = None if add is None or eps is None else g.only_user(add.output[0], "Sqrt")
    if add is None or sqrt is None or eps is None or sqrt.output[0] in g.outputs:
        return None
    div = g.only_user(sub.output[0], "Div")
    root_users = g.readers(sqrt.output[0])
    recip = next((u for u in root_users if u.op_type == "Reciprocal"), None)
    if div is None or list(div.input) != [sub.output[0], sqrt.output[0]] or \
            any(u is not div and u is not recip for u in root_users):
        return None
    nodes: list[onnx.NodeProto] = [square, mean_sq, square_mean, var, *([clamp] if clamp is not None else []), add,
                                   sqrt, sub, div,
                                   *([recip] if recip is not None else []), mean]
    parts: dict[str, Any] = {"x": x, "epsilon": eps, "out": div.output[0]}
    if [u for u in users if u is not square_mean and u is not sub] or m in g.outputs:
        parts["mean"] = m
    if recip is not None:
        parts["inv_std"] = recip.output[0]
    return nodes, parts


def _match_centered_rms_norm(g: _OnnxGraph, mean: onnx.NodeProto, rank: int
                             ) -> tuple[list[onnx.NodeProto], dict[str, Any]] | None:
    """``ReduceMean(x) -> Sub(x, mean) -> RMSNormalization`` over the last axis (opset 23's form of Cohere's
    bias-free LayerNorm): the RMS of the centred values is LayerNorm's standard deviation, so it is a LayerNorm
    with the RMSNormalization's scale as gamma and no beta."""
    if mean.op_type != "ReduceMean" or not rmsnorm.last_axis_mean(g, mean, rank):
        return None
    x = mean.input[0]
    sub = g.only_user(mean.output[0], "Sub")
    norm = None if sub is None or list(sub.input) != [x, mean.output[0]] else \
        g.only_user(sub.output[0], "RMSNormalization")
    if sub is None or norm is None or int(_attrs(norm).get("axis", -1)) % rank != rank - 1 or len(norm.input) < 2 or \
            norm.input[1] not in g.consts:
        return None
    gamma = _channel_vector(g.consts[norm.input[1]])
    if gamma is None:
        return None
    return [mean, sub, norm], {"x": x, "epsilon": float(_attrs(norm).get("epsilon", 1e-5)), "gamma": gamma,
                               "out": norm.output[0]}


def _match_moments_layer_norm(g: _OnnxGraph, mean: onnx.NodeProto, rank: int
                              ) -> tuple[list[onnx.NodeProto], dict[str, Any]] | None:
    """Keras's LayerNormalization as tf2onnx writes it (TF's moments and batchnorm over the last axis):
    ``d = x - mean(x)``, ``var = mean(d * d)``, ``g = gamma / sqrt(var + eps)`` (``Sqrt`` then ``Reciprocal``),
    ``y = x * g + (beta - mean * g)``; the means are ReduceMean or, at rank 3, GlobalAveragePool. Without gamma
    (``scale=False``) ``g`` is the reciprocal itself; without beta (``center=False``) the bias is ``-(mean * g)``
    as ``Neg`` or ``x * g - mean * g`` as ``Sub``. The nodes (the output's last) and the LayerNormalization's
    parts."""
    if not rmsnorm.last_axis_mean(g, mean, rank):
        return None
    x, m = mean.input[0], mean.output[0]
    users = g.consumers.get(m, [])
    sub = next((u for u in users if u.op_type == "Sub" and list(u.input) == [x, m]), None)
    if sub is None or len(users) != 2 or m in g.outputs:
        return None
    d = sub.output[0]
    readers = g.readers(d)
    sq = readers[0] if len(readers) == 1 else None
    if sq is None or d in g.outputs or \
            not ((sq.op_type == "Mul" and list(sq.input) == [d, d]) or
                 (sq.op_type == "Pow" and g.scalar(sq, d) == 2.0)):
        return None
    users_sq = g.consumers.get(sq.output[0], [])
    var = users_sq[0] if len(users_sq) == 1 else None
    if var is None or var.op_type != mean.op_type or not rmsnorm.last_axis_mean(g, var, rank):
        return None
    add = g.only_user(var.output[0], "Add")
    eps = None if add is None else g.scalar(add, var.output[0])
    sqrt = None if add is None or eps is None else g.only_user(add.output[0], "Sqrt")
    recip = None if sqrt is None else g.only_user(sqrt.output[0], "Reciprocal")
    if add is None or sqrt is None or recip is None:
        return None
    nodes = [mean, sub, sq, var, add, sqrt, recip]
    parts: dict[str, Any] = {"x": x, "epsilon": eps}
    scale = recip.output[0]
    gmul = g.only_user(scale, "Mul")
    if gmul is not None and g.other_input(gmul, scale) in g.consts:
        gamma = _channel_vector(g.consts[g.other_input(gmul, scale)])
        if gamma is None:
            return None
        parts["gamma"], scale = gamma, gmul.output[0]
        nodes.append(gmul)
    scaled = g.consumers.get(scale, [])
    m2 = next((u for u in scaled if u.op_type == "Mul" and sorted(u.input) == sorted([m, scale])), None)
    y1 = next((u for u in scaled if u.op_type == "Mul" and sorted(u.input) == sorted([x, scale])), None)
    if len(scaled) != 2 or m2 is None or y1 is None or scale in g.outputs:
        return None
    bias = g.consumers.get(m2.output[0], [])
    if len(bias) != 1 or m2.output[0] in g.outputs or y1.output[0] in g.outputs:
        return None
    last = bias[0]
    if last.op_type == "Sub" and list(last.input) == [y1.output[0], m2.output[0]]:      # center=False, y - m*g
        nodes += [m2, y1, last]
    else:
        if last.op_type == "Sub" and last.input[1] == m2.output[0] and last.input[0] in g.consts:
            beta = _channel_vector(g.consts[last.input[0]])
            if beta is None:
                return None
            parts["beta"] = beta
        elif last.op_type != "Neg":
            return None
        out = g.only_user(last.output[0], "Add")
        if out is None or sorted(out.input) != sorted([y1.output[0], last.output[0]]) or \
                g.consumers.get(y1.output[0], []) != [out]:
            return None
        nodes += [m2, y1, last, out]
    if g.consumers.get(y1.output[0], []) != [nodes[-1]]:
        return None
    parts["out"] = nodes[-1].output[0]
    return nodes, parts


_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power, "Sqrt": np.sqrt,
    "Erf": np.vectorize(math.erf), "Tanh": np.tanh}


def _forward(g: _OnnxGraph, source: str) -> set[int]:
    """The ids of the element-wise nodes up to 10 steps after tensor ``source`` through element-wise nodes only (a
    region of :func:`_region` has no other node)."""
    forward: set[int] = set()
    todo = [source]
    for _ in range(10):
        users = {id(u): u for t in todo for u in g.consumers.get(t, [])
                 if id(u) not in forward and u.op_type in _ELEMENTWISE}
        forward.update(users)
        todo = [out for u in users.values() for out in u.output]
    return forward


def _region(g: _OnnxGraph, source: str, end: onnx.NodeProto, order: dict[int, int], forward: set[int]
            ) -> list[onnx.NodeProto] | None:
    """The nodes on the paths from tensor ``source`` to node ``end`` when they form a closed element-wise region:
    each reads ``source``, another region node's output or a one-element constant, and only ``end``'s output leaves
    it. ``forward`` is :func:`_forward` of ``source`` (the caller keeps it for every end it tries)."""
    region: dict[int, onnx.NodeProto] = {}
    todo_nodes = [end]
    while todo_nodes:
        node = todo_nodes.pop()
        if id(node) not in forward or id(node) in region:
            continue
        region[id(node)] = node
        todo_nodes.extend(g.producer[t] for t in node.input if t in g.producer)
    if id(end) not in region:
        return None
    inside = {out for node in region.values() for out in node.output}
    for node in region.values():
        if node.op_type not in _ELEMENTWISE:
            return None
        for t in node.input:
            if t != source and t not in inside and not (t in g.consts and g.consts[t].size == 1):
                return None
        for out in node.output:
            if node is not end and (out in g.outputs or any(id(u) not in region for u in g.consumers.get(out, []))):
                return None
    return sorted(region.values(), key=lambda n: order[id(n)])


def _gelu_kind(g: _OnnxGraph, source: str, nodes: list[onnx.NodeProto]) -> str | None:
    """``"none"`` or ``"tanh"`` when the element-wise ``nodes`` compute ONNX's Gelu of ``source`` (checked on 81
    values in [-6, 6]), else None."""
    x = np.linspace(-6.0, 6.0, 81)
    values = {source: x}
    with np.errstate(all="ignore"):
        for node in nodes:
            args = [values[t] if t in values else g.consts[t].astype(np.float64).reshape(()) for t in node.input]
            values[node.output[0]] = _ELEMENTWISE[node.op_type](*args)
    got = values[nodes[-1].output[0]]
    for kind in ("none", "tanh"):
        want = float_ref.ACTIVATIONS["Gelu"](x, {"approximate": kind})
        if np.all(np.isfinite(got)) and np.abs(got - want).max() < 1e-4:
            return kind
    return None


def _match_gelu(g: _OnnxGraph, core: onnx.NodeProto, order: dict[int, int]
                ) -> tuple[list[onnx.NodeProto], str, str] | None:
    """The element-wise region around an Erf or Tanh node that computes Gelu: (its nodes, source, approximate)."""
    sources: list[str] = []
    frontier = [core]
    for _ in range(5):                                  # the source: up to 5 steps before the core
        frontier = [g.producer[t] for n in frontier for t in n.input if t in g.producer]
        sources.extend(t for n in frontier for t in n.input if t not in g.consts and t not in sources)
    sources = [t for t in core.input] + sources
    ends, frontier = [core], [core]
    for _ in range(4):                                  # the end: up to 4 steps after it
        frontier = [u for n in frontier for u in g.consumers.get(n.output[0], [])]
        ends.extend(frontier)
    forward = {source: _forward(g, source) for source in sources}
    for end in reversed(ends):
        for source in sources:
            nodes = _region(g, source, end, order, forward[source]) if id(end) in forward[source] else None
            kind = None if nodes is None or len(nodes) < 4 else _gelu_kind(g, source, nodes)
            if nodes is not None and kind is not None:
                return nodes, source, kind
    return None


def _match_swish(g: _OnnxGraph, sigmoid: onnx.NodeProto) -> tuple[list[onnx.NodeProto], str, float] | None:
    """``x * Sigmoid(x)`` or ``x * Sigmoid(x * alpha)`` (SiLU, QuickGelu; either operand order): (its nodes, x,
    alpha)."""
    inner, alpha, nodes = sigmoid.input[0], 1.0, [sigmoid]
    scale = g.producer.get(inner)
    if scale is not None and scale.op_type == "Mul" and g.consumers.get(inner) == [sigmoid] and \
            inner not in g.outputs:
        x = next((t for t in scale.input if t not in g.consts), None)
        value = None if x is None else g.scalar(scale, x)
        if value is not None:
            inner, alpha, nodes = x, value, [scale, sigmoid]
    mul = g.only_user(sigmoid.output[0], "Mul")
    if mul is None or sorted(mul.input) != sorted([inner, sigmoid.output[0]]):
        return None
    return [*nodes, mul], inner, alpha


def _match_softmax(g: _OnnxGraph, exp: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]
                   ) -> tuple[list[onnx.NodeProto], str, int] | None:
    """``Exp(x - ReduceMax(x)) / ReduceSum(.)`` over one axis (the max step optional: it does not change the value),
    both reductions keeping their axis, the Exp read only by the two: (its nodes, x, the axis)."""
    source = exp.input[0]
    if source not in shapes:
        return None
    rank = len(shapes[source])
    nodes = [exp]
    sub = g.producer.get(source)
    if sub is not None and sub.op_type == "Sub" and g.consumers.get(source) == [exp] and source not in g.outputs:
        top = g.producer.get(sub.input[1])
        if top is not None and top.op_type == "ReduceMax" and top.input[0] == sub.input[0] and \
                g.consumers.get(top.output[0]) == [sub] and top.output[0] not in g.outputs:
            max_axes = _reduce_axes(g, top)
            source, nodes = sub.input[0], [top, sub, exp]
        else:
            max_axes = None
    else:
        max_axes = None
    users = g.consumers.get(exp.output[0], [])
    total = next((u for u in users if u.op_type == "ReduceSum"), None)
    div = next((u for u in users if u.op_type == "Div"), None)
    if total is None or div is None or len(users) != 2 or exp.output[0] in g.outputs or \
            list(div.input) != [exp.output[0], total.output[0]] or g.consumers.get(total.output[0]) != [div]:
        return None
    axes = _reduce_axes(g, total)
    if axes is None or len(axes) != 1 or (len(nodes) == 3 and [v % rank for v in max_axes or []] !=
                                          [axes[0] % rank]):
        return None
    return [*nodes, total, div], source, axes[0] % rank


L2_NORMALIZE = "L2Normalize"
"""The op type of the fused ``x / max(||x||_2, eps)`` node (attributes ``axis`` and ``epsilon``; the lab's own,
imported as the IR's L2Normalize)."""


def _match_l2_normalize(g: _OnnxGraph, reduce: onnx.NodeProto
                        ) -> tuple[list[onnx.NodeProto], float, str, bool] | None:
    """``x / clamp(ReduceL2(x, axis, keepdims=1), min=eps)``, the clamp a Clip or a Max with a constant (or absent),
    optionally an Expand of the norm back to ``x``'s shape (torch's ``F.normalize``); the norm also as
    ``Sqrt(ReduceSum(x * x))`` or ``Pow(ReduceSum(Pow(x, 2)), 0.5)`` (a hand-written one, TIPSv2's text embedding),
    or with the eps inside the root, ``Sqrt(ReduceSum(x * x) + eps)`` (flash-linear-attention's ``l2norm``, Bailing's
    query and key norms): the nodes, the Div last, eps (0 without a clamp), ``x``, and whether eps is inside."""
    axes = _reduce_axes(g, reduce)
    if axes is None or len(axes) != 1:
        return None
    x, tensor, nodes, eps, inner = reduce.input[0], reduce.output[0], [reduce], 0.0, False
    if reduce.op_type == "ReduceSum":
        square = g.producer.get(x)
        root = g.consumers.get(tensor, [None])[0] if len(g.consumers.get(tensor, [])) == 1 else None
        source = rmsnorm.square_of(g, square) if square is not None else None
        shift = root if root is not None and root.op_type == "Add" else None
        if shift is not None:                                   # sqrt(sum + eps)
            value = g.scalar(shift, tensor)
            root = g.only_user(shift.output[0], "Sqrt") or g.only_user(shift.output[0], "Pow")
            if value is None or value < 0 or root is None or shift.output[0] in g.outputs:
                return None
            eps, inner = float(value), True
        summed = shift.output[0] if shift is not None else tensor
        if square is None or source is None or root is None or tensor in g.outputs or \
                len(g.consumers.get(x, [])) != 1 or \
                x in g.outputs or not (root.op_type == "Sqrt" or root.op_type == "Pow" and len(root.input) == 2
                                       and root.input[1] in g.consts and g.scalar(root, summed) == 0.5):
            return None
        x, tensor, nodes = source, root.output[0], [square, reduce, *([shift] if shift else []), root]
    users = g.consumers.get(tensor, [])
    if len(users) == 1 and users[0].op_type in ("Clip", "Max") and tensor not in g.outputs and not inner:
        clamp = users[0]
        if clamp.op_type == "Clip":
            a = _attrs(clamp)
            low = g.consts.get(clamp.input[1]) if len(clamp.input) > 1 and clamp.input[1] else a.get("min")
            if low is None or (len(clamp.input) > 2 and clamp.input[2]) or "max" in a:
                return None
            eps = float(np.asarray(low).reshape(()))
        else:
            value = g.scalar(clamp, tensor)
            if value is None or len(clamp.input) != 2:
                return None
            eps = value
        nodes.append(clamp)
        tensor = clamp.output[0]
    expand = g.only_user(tensor, "Expand")
    if expand is not None and expand.input[0] == tensor and expand.input[1] in g.consts:
        nodes.append(expand)
        tensor = expand.output[0]
    div = g.only_user(tensor, "Div")
    if div is None or div.input[0] != x or div.input[1] != tensor or eps < 0:
        return None
    return nodes + [div], eps, x, inner


_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _whole_slice(g: _OnnxGraph, node: onnx.NodeProto, shapes: dict[str, list[int]]) -> bool:
    """Whether Slice ``node`` (constant starts, ends, axes and steps; a static input shape) keeps every element in
    order: each sliced axis from its start to at least its end, step 1 (XLM's ``input_ids[:, :slen]``)."""
    shape = shapes.get(node.input[0])
    parts = [g.consts.get(t) if t else None for t in list(node.input[1:5]) + [""] * (5 - len(node.input))]
    if not shape or min(shape) < 1 or parts[0] is None or parts[1] is None or \
            any(t and g.consts.get(t) is None for t in node.input[3:5]):
        return False
    starts, ends = parts[0].reshape(-1).tolist(), parts[1].reshape(-1).tolist()
    axes = parts[2].reshape(-1).tolist() if parts[2] is not None else list(range(len(starts)))
    steps = parts[3].reshape(-1).tolist() if parts[3] is not None else [1] * len(starts)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[int(axis) % len(shape)]
        if step != 1 or (start + dim if start < 0 else start) > 0 or (end + dim if end < 0 else end) < dim:
            return False
    return True


def drop_identities(model: onnx.ModelProto) -> None:
    """Remove, in place, nodes that change no value the lab computes, rewiring their readers to their input:
    ``Max(x, c)`` with ``c`` float32's lowest (XGLM clamps its masked scores so before the Softmax) and ``Min(x, c)``
    with ``c`` its highest; Slices that keep every element (:func:`_whole_slice`); and operands of a Concat with no
    element along its axis (Phi-3's pass-through part of a head when the rotary dimension is the whole head)."""
    g = _OnnxGraph(model)
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
              for vi in list(model.graph.value_info) + list(model.graph.input)}
    alias: dict[str, str] = {}
    kept = []
    changed = False
    for node in model.graph.node:
        node.input[:] = [alias.get(t, t) for t in node.input]
        if node.op_type in ("Max", "Min") and len(node.input) == 2 and node.output[0] not in g.outputs:
            value = g.scalar(node, node.input[0]) if node.input[1] in g.consts else None
            bound = -_FLOAT32_MAX if node.op_type == "Max" else _FLOAT32_MAX
            if value is not None and node.input[0] not in g.consts and (value <= bound if node.op_type == "Max"
                                                                         else value >= bound):
                alias[node.output[0]] = node.input[0]
                changed = True
                continue
        if node.op_type == "Slice" and node.output[0] not in g.outputs and _whole_slice(g, node, shapes):
            alias[node.output[0]] = node.input[0]
            changed = True
            continue
        if node.op_type == "Concat":
            axis = int(_attrs(node).get("axis", 0))
            full = [t for t in node.input if not (t in shapes and -len(shapes[t]) <= axis < len(shapes[t])
                                                  and shapes[t][axis] == 0)]
            if full and len(full) < len(node.input):
                del node.input[:]
                node.input.extend(full)
                changed = True
        kept.append(node)
    if not changed:
        return
    del model.graph.node[:]
    model.graph.node.extend(live_nodes(kept, g.outputs))   # and what no longer has readers


def tiles_as_expands(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> bool:
    """In place: every Tile with constant repeats and a static input shape becomes the nodes the lab imports, with
    the same values: a Concat of copies along each axis of size above 1 it repeats, then one Expand over the axes of
    size 1 it repeats (tf2onnx writes Keras's attention-mask broadcast ``[B, 1, L] -> [B, S, L]`` so). True when
    any changed (the caller infers the new tensors' shapes)."""
    consts = {init.name: init for init in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    changed = False
    for node in model.graph.node:
        shape = shapes.get(node.input[0]) if node.op_type == "Tile" else None
        reps = consts.get(node.input[1]) if shape is not None and len(node.input) > 1 else None
        repeats = numpy_helper.to_array(reps).astype(np.int64).reshape(-1).tolist() if reps is not None else None
        if shape is None or repeats is None or len(repeats) != len(shape) or min(repeats) < 1:
            nodes.append(node)
            continue
        changed = True
        x, name, dims = node.input[0], node.name or node.output[0], list(shape)
        steps = [k for k, r in enumerate(repeats) if r > 1 and dims[k] > 1]
        expand = any(r > 1 and d == 1 for d, r in zip(dims, repeats)) or not steps
        for k in steps:
            out = node.output[0] if k == steps[-1] and not expand else f"{name}_tile_axis{k}"
            nodes.append(onnx.helper.make_node("Concat", [x] * repeats[k], [out], name=f"{name}_concat{k}", axis=k))
            x, dims[k] = out, dims[k] * repeats[k]
        if expand:
            target = f"{name}_tile_shape"
            model.graph.initializer.append(numpy_helper.from_array(
                np.array([d * (r if d == 1 else 1) for d, r in zip(dims, repeats)], np.int64), target))
            nodes.append(onnx.helper.make_node("Expand", [x, target], [node.output[0]], name=name))
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return changed


def constant_first_matmuls(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> bool:
    """In place: ``MatMul(C, X)`` with ``C`` a constant ``[M, K]`` and ``X`` an activation ``[..., K, N]`` (learned
    queries, as Perceiver's latents) becomes ``(X^T C^T)^T`` over the last two axes: a linear layer of constant
    weights ``C^T [K, M]`` over the rows of ``X^T``, the form the lab puts on the accelerator. True when any changed
    (the caller infers the new tensors' shapes)."""
    consts = {init.name: init for init in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    changed = False
    for node in model.graph.node:
        c = consts.get(node.input[0]) if node.op_type == "MatMul" else None
        shape = shapes.get(node.input[1]) if c is not None else None
        if c is None or shape is None or len(c.dims) != 2 or len(shape) < 2 or node.input[1] in consts:
            nodes.append(node)
            continue
        changed = True
        name, rank = node.name or node.output[0], len(shape)
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        weight = f"{name}_weight_t"
        model.graph.initializer.append(numpy_helper.from_array(
            np.ascontiguousarray(numpy_helper.to_array(c).T), weight))
        nodes += [onnx.helper.make_node("Transpose", [node.input[1]], [f"{name}_xt"], name=f"{name}_xt", perm=perm),
                  onnx.helper.make_node("MatMul", [f"{name}_xt", weight], [f"{name}_yt"], name=name),
                  onnx.helper.make_node("Transpose", [f"{name}_yt"], [node.output[0]], name=f"{name}_back",
                                        perm=perm)]
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return changed


def _replacing(op: str, source: str, nodes: list[onnx.NodeProto], suffix: str | None = None,
               **attrs: Any) -> onnx.NodeProto:
    """The fused ``op`` node of one input ``source`` that replaces ``nodes``: it writes the last one's output and
    keeps its name (or is named after the output, ``_<suffix>``, by default the op's name in lower case)."""
    out = nodes[-1].output[0]
    return onnx.helper.make_node(op, [source], [out], name=nodes[-1].name or f"{out}_{suffix or op.lower()}",
                                 **attrs)


def _drop_constant_row_guards(model: onnx.ModelProto) -> None:
    """In place, before the LayerNorm matchers: jax2onnx's LayerNorm (Equinox's, Flax's with
    ``use_fast_variance=False``) guards the centred values of a constant row, ``Where(And(Equal(ReduceMin(x),
    ReduceMax(x)), ...), 0, x - ReduceMean(x))`` over the same axes: where the row's least and greatest values are
    equal, ``x - mean`` is 0 already, so the Where is ``x - mean`` and its readers read that (the guard's nodes are
    then unread and dropped); and it averages the squares in float64, ``Cast(DOUBLE) -> ReduceMean -> Cast(FLOAT)``
    (a Cast to FLOAT first once the import narrowed float64), which becomes the ReduceMean of the float32 squares
    (the lab's LayerNorm computes its statistics in float64)."""
    g = _OnnxGraph(model)
    types = contrib.elem_types(model)
    rename: dict[str, str] = {}
    casts_back: set[str] = set()                     # the float64 means whose Cast back to float32 goes

    def extrema_equal(t: str, x: str, axes: list[int]) -> bool:
        node = g.producer.get(t)
        if node is None:
            return False
        if node.op_type == "And":
            return any(extrema_equal(name, x, axes) for name in node.input)
        if node.op_type != "Equal":
            return False
        ends = [g.producer.get(name) for name in node.input]
        return all(e is not None and e.input[0] == x and _reduce_axes(g, e) == axes for e in ends) and \
            sorted(e.op_type for e in ends if e is not None) == ["ReduceMax", "ReduceMin"]

    for node in model.graph.node:
        if node.op_type == "Where" and len(node.input) == 3 and node.output[0] not in g.outputs:
            zero = [k for k in (1, 2) if node.input[k] in g.consts and not g.consts[node.input[k]].any()]
            sub = g.producer.get(node.input[3 - zero[0]]) if len(zero) == 1 else None
            mean = g.producer.get(sub.input[1]) if sub is not None and sub.op_type == "Sub" else None
            axes = _reduce_axes(g, mean) if mean is not None and mean.op_type == "ReduceMean" else None
            if zero == [1] and sub is not None and mean is not None and axes is not None and \
                    mean.input[0] == sub.input[0] and extrema_equal(node.input[0], sub.input[0], axes):
                rename[node.output[0]] = sub.output[0]             # Where(constant row, 0, x - mean)
        elif node.op_type == "Cast" and _attrs(node).get("to") in (onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT):
            mean = g.only_user(node.output[0], "ReduceMean")
            back = None if mean is None else g.only_user(mean.output[0], "Cast")
            if mean is not None and back is not None and _attrs(back).get("to") == onnx.TensorProto.FLOAT and \
                    types.get(node.input[0]) == onnx.TensorProto.FLOAT:
                casts_back.add(mean.output[0])
                mean.input[0] = node.input[0]              # the mean of the float32 values, written as the Cast's
                mean.output[0] = back.output[0]
    if not rename and not casts_back:
        return
    for node in model.graph.node:
        node.input[:] = [rename.get(name, name) for name in node.input]
    kept = live_nodes([onnx.NodeProto.FromString(n.SerializeToString()) for n in model.graph.node
                       if not (n.op_type == "Cast" and n.input[0] in casts_back)],
                      {o.name for o in model.graph.output})
    del model.graph.node[:]
    model.graph.node.extend(kept)


def _two_pass_variances(model: onnx.ModelProto) -> bool:
    """In place, after the LayerNorm matchers: every variance left in one-pass form, ``ReduceMean(x * x) -
    ReduceMean(x) ** 2`` over the same axes (a square as Mul by itself or Pow 2), becomes the two-pass
    ``ReduceMean((x - m) ** 2)`` with ``m = ReduceMean(x)``, equal in exact arithmetic; a clamp at zero after it
    (``Max(var, c <= 0)``) goes, as the two-pass variance is never negative. The one-pass form's two means cancel in
    int8 (it was refused); Flax's GroupNorm writes it over ``[N, H, W, G, C/G]``. True when any changed."""
    g = _OnnxGraph(model)
    new = tensor_namer(model)
    order = {id(n): k for k, n in enumerate(model.graph.node)}
    shapes = contrib.static_shapes(model)

    def root(t: str) -> str | None:
        """``x`` when ``t`` is ``Mul(x, x)`` or ``Pow(x, 2)``."""
        node = g.producer.get(t)
        return None if node is None else rmsnorm.square_of(g, node)

    replaced: dict[int, list[onnx.NodeProto]] = {}
    rename: dict[str, str] = {}
    for node in model.graph.node:
        second = g.producer.get(node.input[0]) if node.op_type == "Sub" and len(node.input) == 2 else None
        if second is None or second.op_type != "ReduceMean" or node.output[0] in g.outputs:
            continue
        x, m = root(second.input[0]), root(node.input[1])
        mean = g.producer.get(m) if m is not None else None
        axes = _reduce_axes(g, mean) if mean is not None and mean.op_type == "ReduceMean" else None
        if x is None or m is None or mean is None or mean.input[0] != x or axes is None or \
                _reduce_axes(g, second) != axes or x not in shapes:
            continue
        made: list[onnx.NodeProto] = []
        sub = next((u for u in g.readers(m) if u.op_type == "Sub" and list(u.input) == [x, m] and
                    order[id(u)] < order[id(node)]), None)
        centred = sub.output[0] if sub is not None else new(f"{m}_centred")
        if sub is None:
            made.append(helper.make_node("Sub", [x, m], [centred], name=f"{node.name or node.output[0]}_centre"))
        squares = new(f"{node.output[0]}_squares")
        made.append(helper.make_node("Mul", [centred, centred], [squares], name=f"{node.name or node.output[0]}_sq"))
        model.graph.value_info.extend(helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, list(shapes[x]))
                                      for t in ([] if sub is not None else [centred]) + [squares])
        mean_of = onnx.NodeProto.FromString(second.SerializeToString())
        mean_of.input[0], mean_of.output[0] = squares, node.output[0]
        mean_of.name = node.name or node.output[0]
        replaced[id(node)] = made + [mean_of]
        clamp = g.only_user(node.output[0], "Max")
        floor = None if clamp is None or len(clamp.input) != 2 else g.scalar(clamp, node.output[0])
        if clamp is not None and floor is not None and floor <= 0 and clamp.output[0] not in g.outputs:
            rename[clamp.output[0]] = node.output[0]
    if not replaced:
        return False
    nodes = [new_node for n in model.graph.node for new_node in replaced.get(id(n), [n])]
    for n in nodes:
        n.input[:] = [rename.get(t, t) for t in n.input]
    kept = live_nodes([onnx.NodeProto.FromString(n.SerializeToString()) for n in nodes],
                      {o.name for o in model.graph.output})
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return True


def _fuse_decompositions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace the LayerNorm, Gelu and Softmax decompositions exporters emit (ReduceMean/Sub/Pow/Sqrt/Div; the Erf
    and Tanh forms of Gelu; Exp/ReduceSum/Div) by one LayerNormalization, Gelu or Softmax node writing the
    decomposition's output, so each imports as one operator. Shapes are already inferred; the fused nodes keep the
    output names. Jax2onnx's guards and float64 detours in a LayerNorm go first (:func:`_drop_constant_row_guards`);
    one-pass variances the matchers leave are made two-pass (:func:`_two_pass_variances`) and matched again."""
    _drop_constant_row_guards(model)
    g = _OnnxGraph(model)
    shapes = contrib.static_shapes(model)
    order = {id(n): k for k, n in enumerate(model.graph.node)}
    removed: set[int] = set()
    replacement: dict[int, onnx.NodeProto] = {}
    for node in model.graph.node:
        if id(node) in removed:
            continue
        if node.op_type in ("ReduceMean", "GlobalAveragePool") and node.input[0] in shapes:
            rank = len(shapes[node.input[0]])
            found = _match_layer_norm(g, node, rank) if node.op_type == "ReduceMean" else None
            found = found or _match_moments_layer_norm(g, node, rank) or _match_centered_rms_norm(g, node, rank)
            if found is None and node.op_type == "ReduceMean":
                found = _match_one_pass_layer_norm(g, node, rank)
            if found is None:
                found_rms = rmsnorm.match_rms_norm(g, node, shapes)
                if found_rms is None:
                    continue
                nodes, parts = found_rms
                name = f"{parts['out']}_rms_weight"
                model.graph.initializer.append(numpy_helper.from_array(parts["weight"].astype(np.float32), name))
                fused = onnx.helper.make_node(rmsnorm.FUSED_OP, [parts["x"], name], [parts["out"]],
                                              name=nodes[-1].name or f"{parts['out']}_rmsnorm", axis=-1,
                                              epsilon=parts["epsilon"])
                removed.update(id(n) for n in nodes)
                replacement[id(nodes[-1])] = fused
                continue
            nodes, parts = found
            width = shapes[parts["x"]][-1]
            names = []
            for key, default in (("gamma", 1.0), ("beta", 0.0)):
                name = f"{parts['out']}_ln_{key}"
                value = np.broadcast_to(parts.get(key, np.float32(default)), (width,)).astype(np.float32)
                model.graph.initializer.append(numpy_helper.from_array(value, name))
                names.append(name)
            stats = [parts.get("mean", ""), parts.get("inv_std", "")]
            outs = [parts["out"], *stats] if any(stats) else [parts["out"]]
            while outs[-1] == "":
                outs.pop()
            fused = onnx.helper.make_node("LayerNormalization", [parts["x"], *names], outs,
                                          name=f"{parts['out']}_layernorm", axis=-1, epsilon=parts["epsilon"])
        elif node.op_type in ("Erf", "Tanh"):
            found_gelu = _match_gelu(g, node, order)
            if found_gelu is None:
                continue
            nodes, source, kind = found_gelu
            fused = _replacing("Gelu", source, nodes, approximate=kind)
        elif node.op_type in ("ReduceL2", "ReduceSum"):
            found_l2 = _match_l2_normalize(g, node)
            axes = _reduce_axes(g, node) or []
            grn = rmsnorm.match_grn(g, node, axes, len(shapes[node.input[0]])) if found_l2 is None and axes and \
                node.op_type == "ReduceL2" and node.input[0] in shapes else None
            if grn is not None:
                removed.update(id(n) for n in grn[0])
                replacement[id(grn[0][-1])] = _replacing(rmsnorm.GRN_OP, grn[1], grn[0], "grn",
                                                         axes=[int(a) for a in axes], epsilon=grn[2])
                continue
            gained = rmsnorm.match_gain_l2(g, node, axes) if found_l2 is None and node.op_type == "ReduceL2" \
                else None
            if gained is not None:
                removed.update(id(n) for n in gained[0])
                parts = gained[1]
                replacement[id(gained[0][-1])] = _replacing(rmsnorm.GAIN_L2_OP, parts.pop("x"), gained[0], "l2",
                                                            **parts)
                continue
            if found_l2 is None:
                continue
            nodes, eps, source, inner = found_l2          # its one axis: axes, read above
            fused = _replacing(L2_NORMALIZE, source, nodes, "l2", axis=axes[0], epsilon=eps,
                               **({"inner": 1} if inner else {}))
        elif node.op_type == "Exp":
            found_softmax = _match_softmax(g, node, shapes)
            if found_softmax is None:
                continue
            nodes, source, softmax_axis = found_softmax
            fused = _replacing("Softmax", source, nodes, axis=softmax_axis)
        elif node.op_type == "Sigmoid":
            found_swish = _match_swish(g, node)
            if found_swish is None:
                continue
            nodes, source, alpha = found_swish
            fused = _replacing("Swish", source, nodes, alpha=alpha)
        else:
            continue
        removed.update(id(n) for n in nodes)
        replacement[id(nodes[-1])] = fused
    if replacement:
        kept = [replacement.get(id(n), n) for n in model.graph.node if id(n) not in removed or id(n) in replacement]
        del model.graph.node[:]
        model.graph.node.extend(kept)
    if _two_pass_variances(model):                # what the matchers left of one-pass variances: match again
        return _fuse_decompositions(model)
    return model


def _split_sequences(model: onnx.ModelProto) -> None:
    """In place: ``SplitToSequence(x, split)`` (constant ``split``, ``keepdims`` 1) read only by ``SequenceAt`` at
    constant positions (how torch's new exporter writes ``torch.split`` unoptimized) becomes one ``Split`` whose
    outputs are the SequenceAt outputs (value infos added for their static shapes; a position read twice through an
    Identity). Others are left for the rules to refuse."""
    g = _OnnxGraph(model)
    consts, users = g.consts, g.consumers
    shapes = contrib.static_shapes(model)
    replaced: dict[str, list[onnx.NodeProto]] = {}
    dropped: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "SplitToSequence" or node.input[0] not in shapes:
            continue
        a = _attrs(node)
        shape = shapes[node.input[0]]
        axis = int(a.get("axis", 0)) % len(shape)
        split = consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else np.array(1)
        readers = users.get(node.output[0], [])
        if split is None or int(a.get("keepdims", 1)) != 1 or not readers or any(
                r.op_type != "SequenceAt" or r.input[1] not in consts for r in readers):
            continue
        size = shape[axis]
        if split.ndim == 0:
            step = int(split)
            sizes = [min(step, size - k) for k in range(0, size, step)]
        else:
            sizes = [int(v) for v in split]
        if sum(sizes) != size:
            continue
        names = [f"{node.output[0]}_part{k}" for k in range(len(sizes))]
        extra: list[onnx.NodeProto] = []
        for reader in readers:
            k = int(consts[reader.input[1]].reshape(())) % len(sizes)
            extra.append(helper.make_node("Identity", [names[k]], list(reader.output), name=reader.name))
            dropped.add(reader.output[0])
        for name, part in zip(names, sizes):
            dims = list(shape)
            dims[axis] = part
            model.graph.value_info.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, dims))
        split_sizes = f"{node.output[0]}_sizes"
        model.graph.initializer.append(numpy_helper.from_array(np.array(sizes, np.int64), split_sizes))
        replaced[node.output[0]] = [helper.make_node("Split", [node.input[0], split_sizes], names, axis=axis,
                                                     name=node.name or node.output[0]), *extra]
    if not replaced:
        return
    kept: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type == "SplitToSequence" and node.output[0] in replaced:
            kept.extend(replaced[node.output[0]])
        elif not (node.op_type == "SequenceAt" and node.output[0] in dropped):
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
