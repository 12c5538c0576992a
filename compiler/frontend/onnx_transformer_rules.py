"""The ONNX import rules of the transformer and bookkeeping operators (ReduceMean, LayerNormalization, RMSNorm, Neg,
Gelu, Gather, Slice, Split, Where, the runtime mask and index stand-ins, Cast, Identity, Dropout, Constant) and the
:data:`RULES` table of every rule (:mod:`.onnx_rules` has the others)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
from onnx import numpy_helper

from ..qops import GRID_PADDINGS, REDUCE_KINDS
from . import float_ref, rmsnorm
from .onnx_common import PUBLIC_OPS, UnsupportedOperatorError, _attrs, _decode, _Importer
from .onnx_rules import (
    _axis_op,
    _batchnorm,
    _binary,
    _clip,
    _conv,
    _depth_to_space,
    _gemm,
    _global_average_pool,
    _matmul,
    _pad,
    _pool,
    _reshape,
    _resize,
    _reverse_sequence,
    _transpose,
    broadcast_activation,
)


def _reduce(imp: _Importer, node: onnx.NodeProto) -> None:
    """ReduceMean, ReduceSum, ReduceMax and the others (:data:`.qops.REDUCE_KINDS`) over any axes. A mean over H and
    W of an NCHW tensor (how exporters often write global average pooling) is one GlobalAvgPool. Otherwise the input
    is transposed to put the reduced axes last and viewed as ``[1, kept, reduced, 1]`` (the mean over tokens of
    ``[B, T, C]``, Keras's GlobalAveragePooling1D; WavLM's gate sums; Hiera's max over a mask unit), then a
    GlobalAvgPool (ReduceMean), a MaxPool of kernel ``(reduced, 1)`` or a Reduce of axis 2 (on the CPU; ReduceSum an
    exact sum), viewed as the output's shape."""
    a = _attrs(node)
    axes = a.get("axes")
    axes_input = imp.const_input(node, 1, "axes")
    if axes_input is not None:
        axes = axes_input.tolist()
    shape = tuple(imp.shape(node.input[0]))
    rank = len(shape)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            imp.emit("Reshape", node, [node.input[0]], shape=shape)
            return
        axes = list(range(rank))
    reduced = sorted({int(x) % rank for x in axes})
    out = tuple(imp.shapes_of(node.output[0]))
    if node.op_type == "ReduceMean" and rank == 4 and reduced == [2, 3]:
        if a.get("keepdims", 1):
            imp.emit("GlobalAvgPool", node, [node.input[0]])
            return
        pooled = imp.emit_shaped("GlobalAvgPool", node, [node.input[0]], (*shape[:2], 1, 1))
        imp.emit("Reshape", node, [pooled], shape=out)
        return
    if node.op_type == "ReduceLogSumExp" and reduced == [rank - 1]:     # on the scores as they are: a mask applies
        if a.get("keepdims", 1):
            imp.emit("Reduce", node, [node.input[0]], kind="log_sum_exp", axis=rank - 1)
            return
        kept_axis = imp.emit_shaped("Reduce", node, [node.input[0]], (*shape[:-1], 1), kind="log_sum_exp",
                                    axis=rank - 1)
        imp.emit("Reshape", node, [kept_axis], shape=out)
        return
    kept = [k for k in range(rank) if k not in reduced]
    x = node.input[0]
    if kept + reduced != list(range(rank)):
        perm = tuple(kept + reduced)
        x = imp.emit_shaped("Transpose", node, [x], tuple(shape[k] for k in perm), perm=perm)
    count = int(np.prod([shape[k] for k in reduced]))
    rows = (1, int(np.prod([shape[k] for k in kept])), count, 1)
    view = imp.emit_shaped("Reshape", node, [x], rows, shape=rows)
    if node.op_type == "ReduceMax":
        pooled = imp.emit_shaped("MaxPool", node, [view], (1, rows[1], 1, 1), kernel=(count, 1), strides=(1, 1),
                                 pads=(0, 0, 0, 0))
    elif node.op_type in REDUCE_KINDS:
        pooled = imp.emit_shaped("Reduce", node, [view], (1, rows[1], 1, 1), kind=REDUCE_KINDS[node.op_type], axis=2)
    else:
        pooled = imp.emit_shaped("GlobalAvgPool", node, [view], (1, rows[1], 1, 1))
    imp.emit("Reshape", node, [pooled], shape=out)


def _global_reduce(imp: _Importer, node: onnx.NodeProto) -> None:
    """GlobalMaxPool (Keras's GlobalMaxPooling1D/2D through tf2onnx) and GlobalLpPool of ``p`` 1 or 2: the ReduceMax,
    ReduceL1 or ReduceL2 over every axis after N and C, keeping them (:func:`_reduce`)."""
    p = int(_attrs(node).get("p", 2))
    if node.op_type == "GlobalLpPool" and p not in (1, 2):
        raise UnsupportedOperatorError(node.op_type, node.name, f"p = {p} (only 1 and 2)")
    rank = len(imp.shape(node.input[0]))
    op = "ReduceMax" if node.op_type == "GlobalMaxPool" else f"ReduceL{p}"
    _reduce(imp, onnx.helper.make_node(op, [node.input[0]], list(node.output), name=node.name,
                                       axes=list(range(2, rank)), keepdims=1))


def _layer_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """LayerNormalization (opset 17) with constant scale and bias; its Mean and InvStdDev outputs, when read, are
    Reduces of kinds ``mean`` and ``inv_std`` over the normalised axes (on the CPU)."""
    a = _attrs(node)
    shape = imp.shape(node.input[0])
    axis = int(a.get("axis", -1)) % len(shape)
    for out, kind in zip(node.output[1:3], ("mean", "inv_std")):
        if not out:
            continue
        rows = (1, int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)), 1)
        view = imp.emit_shaped("Reshape", node, [node.input[0]], rows, shape=rows)
        stat = imp.emit_shaped("Reduce", node, [view], (1, rows[1], 1, 1), kind=kind, axis=2,
                               **({"epsilon": float(a.get("epsilon", 1e-5))} if kind == "inv_std" else {}))
        imp.emit("Reshape", node, [stat], output=out, shape=tuple(shape[:axis]) + (1,) * (len(shape) - axis))
    gamma = imp.const_input(node, 1, "Scale")
    beta = imp.const_input(node, 2, "B")
    normed = shape[axis:]
    params = []
    for what, value, default in (("Scale", gamma, 1.0), ("B", beta, 0.0)):
        value = np.full(normed, default) if value is None else value
        try:
            params.append(np.broadcast_to(value, normed))
        except ValueError:
            raise UnsupportedOperatorError(node.op_type, node.name, f"a {what} of shape {value.shape} for "
                                                                    f"normalised shape {normed}") from None
    imp.emit("LayerNorm", node, [node.input[0], imp.new_const(f"{node.output[0]}_gamma", params[0]),
                                 imp.new_const(f"{node.output[0]}_beta", params[1])],
             axis=axis, epsilon=float(a.get("epsilon", 1e-5)))


def _gather_nd(imp: _Importer, node: onnx.NodeProto) -> None:
    """GatherND of an activation by constant indices of last dimension 1, ``batch_dims`` 0 (Falcon's split of its
    fused QKV under torch's new exporter): a Gather on axis 0 by ``indices[..., 0]``."""
    a = _attrs(node)
    indices = np.asarray(imp.const_input(node, 1, "indices"), np.int64)
    if int(a.get("batch_dims", 0)) != 0 or indices.ndim < 1 or indices.shape[-1] != 1:
        raise UnsupportedOperatorError(node.op_type, node.name, f"batch_dims {a.get('batch_dims', 0)} and indices "
                                                                f"of shape {list(indices.shape)} (only batch_dims 0 "
                                                                f"and one index per lookup)")
    size = imp.shape(node.input[0])[0]
    idx = indices[..., 0]
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise UnsupportedOperatorError(node.op_type, node.name, f"indices outside [-{size}, {size - 1}]")
    imp.emit("Gather", node, [node.input[0]], axis=0, indices=np.where(idx < 0, idx + size, idx))


def _group_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """InstanceNormalization (torch's GroupNorm is Reshape, InstanceNormalization, Reshape, Mul, Add; wav2vec2's and
    HuBERT's first conv layer; GroupNormalization is rewritten into that form, :mod:`.onnx_fused`): the input ``[N,
    C, *S]`` normalised over ``prod(S)`` per channel (a LayerNorm without scale), then the per-channel scale and
    bias, and the shape back."""
    a = _attrs(node)
    shape = imp.shape(node.input[0])
    if len(shape) < 3:
        raise UnsupportedOperatorError(node.op_type, node.name, f"an input of shape {list(shape)} (only [N, C, ...])")
    n, c = shape[0], shape[1]
    spatial = int(np.prod(shape[2:]))
    groups = c
    scale = imp.const_input(node, 1, "scale")
    bias = imp.const_input(node, 2, "bias")
    per_channel = []
    for what, value in (("scale", scale), ("bias", bias)):
        value = np.asarray(value, np.float64).reshape(-1)
        if value.size != c:
            raise UnsupportedOperatorError(node.op_type, node.name, f"a {what} of {value.size} values for {c} "
                                                                    f"channels")
        per_channel.append(value.reshape(c, 1))
    width = c // groups * spatial
    grouped = imp.emit_shaped("Reshape", node, [node.input[0]], (n, groups, width), shape=(n, groups, width))
    normed = imp.emit_shaped("LayerNorm", node, [grouped, imp.new_const(f"{node.output[0]}_ones", np.ones(width)),
                                                 imp.new_const(f"{node.output[0]}_zeros", np.zeros(width))],
                             (n, groups, width), axis=2, epsilon=float(a.get("epsilon", 1e-5)))
    rows = imp.emit_shaped("Reshape", node, [normed], (n, c, spatial), shape=(n, c, spatial))
    scaled = imp.emit_shaped("Mul", node, [rows, imp.new_const(f"{node.output[0]}_scale", per_channel[0])],
                             (n, c, spatial))
    shifted = imp.emit_shaped("Add", node, [scaled, imp.new_const(f"{node.output[0]}_bias", per_channel[1])],
                              (n, c, spatial))
    imp.emit("Reshape", node, [shifted], shape=tuple(shape))


def _rms_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """RMSNormalization with a constant scale (opset 23's operator, which is also the node
    :func:`_fuse_decompositions` puts in place of RMSNorm's decomposition, :mod:`.rmsnorm`). Over the last axis it is
    one RMSNorm; over the axes ``axis`` to the last, those axes are flattened into one first (a Reshape, the RMSNorm
    with the scale broadcast to them and flattened, and a Reshape back)."""
    a = _attrs(node)
    shape = tuple(imp.shape(node.input[0]))
    axis = int(a.get("axis", -1))
    if not -len(shape) <= axis < len(shape):
        raise UnsupportedOperatorError(node.op_type, node.name, f"axis {axis} of a rank-{len(shape)} input")
    axis %= len(shape)
    normed = shape[axis:]
    scale = imp.const_input(node, 1, "scale")
    value = np.ones(normed) if scale is None else scale
    try:
        gamma = np.broadcast_to(value, normed).reshape(-1)
    except ValueError:
        raise UnsupportedOperatorError(node.op_type, node.name, f"a scale of shape {value.shape} for normalised "
                                                                f"shape {list(normed)}") from None
    epsilon = float(a.get("epsilon", 1e-5))
    gamma_name = imp.new_const(f"{node.output[0]}_gamma", gamma)
    if len(normed) == 1:
        imp.emit("RMSNorm", node, [node.input[0], gamma_name], axis=axis, epsilon=epsilon)
        return
    flat = shape[:axis] + (int(np.prod(normed, dtype=np.int64)),)
    rows = imp.emit_shaped("Reshape", node, [node.input[0]], flat, shape=flat)
    out = imp.emit_shaped("RMSNorm", node, [rows, gamma_name], flat, axis=axis, epsilon=epsilon)
    imp.emit("Reshape", node, [out], shape=shape)


def _expand(imp: _Importer, node: onnx.NodeProto) -> None:
    """Expand of an activation (its broadcast to the static output shape, :func:`.onnx_rules.broadcast_activation`):
    a Reshape adding the leading axes, then for each axis of size 1 broadcast to ``n``, a Concat of ``n`` copies
    along it. Grouped-query attention's ``repeat_kv`` (Unsqueeze, Expand, Reshape) repeats each key/value head so."""
    if imp.is_const(node.input[0]):
        raise UnsupportedOperatorError(node.op_type, node.name, "a constant expanded to a shape computed at run time")
    broadcast_activation(imp, node, node.input[0], tuple(imp.shapes_of(node.output[0])), final=True)


def _neg(imp: _Importer, node: onnx.NodeProto) -> None:
    """Neg of an activation: a Mul by the constant -1 (rotary embeddings' ``rotate_half``)."""
    imp.emit("Mul", node, [node.input[0], imp.new_const(f"{node.output[0]}_c", np.array([-1.0]))])


def _unary(op: str) -> Callable[[_Importer, onnx.NodeProto], None]:
    """The rule of an element-wise ONNX operator of one input (:data:`.float_ref.ACTIVATION_DEFAULTS`) that the float
    graph keeps as the op of that name, with its float attributes; quantized, it is a lookup table (QLut)."""
    def rule(imp: _Importer, node: onnx.NodeProto) -> None:
        attrs: dict[str, Any] = float_ref.activation_attrs(op, _attrs(node))
        imp.emit(op, node, [node.input[0]], None, **attrs)
    return rule


def _prelu(imp: _Importer, node: onnx.NodeProto) -> None:
    """PRelu of an activation by a constant slope ``a`` (broadcast to it): ``x`` where ``x >= 0``, else ``a * x``. One
    slope (torch's ``nn.PReLU()``) is a LeakyRelu, a lookup table; a slope per channel is ``(1 - a) * Relu(x) + a *
    x``: two products by constants and an Add, each requantized once."""
    x, slope = node.input[0], node.input[1]
    if imp.is_const(x) or not imp.is_const(slope):
        raise UnsupportedOperatorError(node.op_type, node.name, "only an activation by a constant slope")
    a = imp.const(slope).astype(np.float64)
    out = tuple(imp.shapes_of(node.output[0]))
    if tuple(imp.shape(x)) != out:
        raise UnsupportedOperatorError(node.op_type, node.name, f"a slope of shape {list(a.shape)} that widens the "
                                                                f"input {list(imp.shape(x))}")
    if not np.isfinite(a).all():
        raise UnsupportedOperatorError(node.op_type, node.name, "a slope that is not finite")
    if a.size == 0 or (a == a.reshape(-1)[0]).all():
        imp.emit("LeakyRelu", node, [x], None,
                 **float_ref.activation_attrs("LeakyRelu", {"alpha": float(a.reshape(-1)[0]) if a.size else 0.0}))
        return
    positive = imp.emit_shaped("Relu", node, [x], out)
    kept = imp.emit_shaped("Mul", node, [positive, imp.new_const(f"{node.output[0]}_keep", 1.0 - a)], out)
    sloped = imp.emit_shaped("Mul", node, [x, imp.new_const(f"{node.output[0]}_slope", a)], out)
    imp.emit("Add", node, [kept, sloped])


def _grid_sample(imp: _Importer, node: onnx.NodeProto) -> None:
    """GridSample of a 4-D or 5-D activation (opset 20's volumes) at a grid of the same batch, (bi/tri)linear or
    nearest, any padding mode and ``align_corners``: on the CPU, float64 from the int8 input and grid
    (:func:`..qops_pool.grid_sample`); a constant grid is the node's attribute ``grid``, exact (never quantized).
    ``cubic`` refused."""
    a = _attrs(node)
    mode = {"bilinear": "linear", "linear": "linear", "nearest": "nearest"}.get(_decode(a.get("mode", "bilinear")))
    padding = _decode(a.get("padding_mode", "zeros"))
    x, grid = node.input[0], node.input[1]
    problems = []
    if mode is None:
        problems.append(f"mode {_decode(a.get('mode'))!r} (only bilinear/linear and nearest)")
    if padding not in GRID_PADDINGS:
        problems.append(f"padding_mode {padding!r}")
    fixed = imp.is_const(grid)               # a grid of constants (RAFT's first lookup, at the zero flow): exact
    x_shape = tuple(imp.shape(x))
    g_shape = tuple(np.shape(imp.const(grid))) if fixed else tuple(imp.shape(grid))
    if len(x_shape) not in (4, 5) or len(g_shape) != len(x_shape) or g_shape[-1] != len(x_shape) - 2 or \
            g_shape[0] != x_shape[0]:
        problems.append(f"an input of shape {list(x_shape)} and a grid of shape {list(g_shape)} (only [N, C, H, W] "
                        f"with [N, Ho, Wo, 2], and [N, C, D, H, W] with [N, Do, Ho, Wo, 3])")
    if imp.is_const(x):
        problems.append("a constant input (only an activation is sampled)")
    if problems:
        raise UnsupportedOperatorError(node.op_type, node.name, "; ".join(problems))
    extra: dict[str, Any] = {"grid": np.asarray(imp.const(grid), np.float32)} if fixed else {}
    imp.emit("GridSample", node, [x] if fixed else [x, grid], mode=mode, padding=padding,
             align_corners=bool(int(a.get("align_corners", 0))), **extra)


def _max_min(imp: _Importer, node: onnx.NodeProto) -> None:
    """Max (Min) of an activation and a constant of one value (or of one value repeated: RWKV's state starts at a
    ``ConstantOfShape`` of -1e38): a Clip from below (above)."""
    inputs = [t for t in node.input if t]
    consts = [t for t in inputs if imp.is_const(t)]
    value = imp.const(consts[0]).reshape(-1) if len(consts) == 1 else np.zeros(0)
    if len(inputs) != 2 or value.size == 0 or not np.isfinite(value).all() or (value != value[0]).any():
        raise UnsupportedOperatorError(node.op_type, node.name, "only the Max or Min of an activation and a finite "
                                       "constant of one value")
    x = next(t for t in inputs if t not in consts)
    bound = float(value[0])
    out = tuple(imp.shapes_of(node.output[0]))
    if tuple(imp.shape(x)) != out:
        raise UnsupportedOperatorError(node.op_type, node.name, "a constant that widens the activation")
    imp.emit("Clip", node, [x], min=bound if node.op_type == "Max" else None,
             max=bound if node.op_type == "Min" else None)


def _pow(imp: _Importer, node: onnx.NodeProto) -> None:
    """Pow of an activation by a constant integer exponent (up to 8 in size; nemotron's squared ReLU under torch's
    new exporter): ``x * x`` for 2, an element-wise power (a lookup table once quantized) otherwise."""
    x, p = node.input[0], node.input[1]
    if imp.is_const(x) or not imp.is_const(p):
        raise UnsupportedOperatorError(node.op_type, node.name, "only an activation raised to a constant exponent")
    value = imp.const(p).astype(np.float64).reshape(-1)
    if value.size != 1 or not np.isfinite(value[0]) or value[0] != np.round(value[0]) or abs(value[0]) > 8:
        raise UnsupportedOperatorError(node.op_type, node.name, f"the exponent {value.tolist()} (only one integer "
                                       f"from -8 to 8: a power of a negative base is not real otherwise)")
    if value[0] == 2:
        imp.emit("Mul", node, [x, x])
    else:
        imp.emit("Pow", node, [x], exponent=float(value[0]))


def _gelu(imp: _Importer, node: onnx.NodeProto) -> None:
    approximate = _decode(_attrs(node).get("approximate", "none"))
    if approximate not in ("none", "tanh"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"approximate {approximate!r} (only 'none', 'tanh')")
    imp.emit("Gelu", node, [node.input[0]], approximate=approximate)


def _gather(imp: _Importer, node: onnx.NodeProto) -> None:
    """Gather of constant indices from an activation (a token, a head, the class token); Gather on axis 0 of a
    constant table by an int64 graph input (token ids) is an Embedding."""
    if imp.is_const(node.input[0]) and not imp.is_const(node.input[1]):
        ids = imp.name(node.input[1])
        axis = int(_attrs(node).get("axis", 0)) % max(imp.const(node.input[0]).ndim, 1)
        if ids not in imp.graph.tensors or imp.graph.tensors[ids].dtype != "int64" or axis != 0 or \
                imp.const(node.input[0]).ndim != 2:
            raise UnsupportedOperatorError(node.op_type, node.name, "an embedding lookup of computed indices (only "
                                                                    "an int64 graph input of token ids can index a "
                                                                    "constant table [rows, width] on axis 0)")
        imp.emit("Embedding", node, [ids, imp.use_const(node.input[0])])
        return
    computed = imp.name(node.input[1])
    if not imp.is_const(node.input[1]) and computed in imp.graph.tensors and \
            imp.graph.tensors[computed].dtype == "int64":      # rows computed from token ids (CLIP's pooling)
        rank = len(imp.shape(node.input[0]))
        imp.emit("GatherAt", node, [node.input[0], computed], axis=int(_attrs(node).get("axis", 0)) % rank)
        return
    indices = imp.const_input(node, 1, "indices")
    rank = len(imp.shape(node.input[0]))
    axis = int(_attrs(node).get("axis", 0)) % rank
    imp.emit("Gather", node, [node.input[0]], axis=axis,
             indices=gather_indices(node, indices, imp.shape(node.input[0])[axis]))


def gather_indices(node: onnx.NodeProto, indices: Any, size: int) -> np.ndarray:
    """Gather ``node``'s constant ``indices`` into an axis of ``size`` elements, each negative one counted from the
    end (int64, the indices' shape); UnsupportedOperatorError when one lies outside ``[-size, size - 1]``."""
    idx = np.asarray(indices, np.int64)
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise UnsupportedOperatorError(node.op_type, node.name, f"indices outside [-{size}, {size - 1}]")
    return np.where(idx < 0, idx + size, idx)


def _gather_elements(imp: _Importer, node: onnx.NodeProto) -> None:
    """GatherElements of an activation by constant indices (DeBERTa's relative-position attention): TakeAlong, a
    move of values on the CPU. Indices computed at run time are refused."""
    indices = imp.const_input(node, 1, "indices")
    shape = imp.shape(node.input[0])
    axis = int(_attrs(node).get("axis", 0)) % len(shape)
    idx = np.asarray(indices, np.int64)
    size = shape[axis]
    if idx.ndim != len(shape) or any(i > s for k, (i, s) in enumerate(zip(idx.shape, shape)) if k != axis):
        raise UnsupportedOperatorError(node.op_type, node.name, f"indices of shape {list(idx.shape)} for data of "
                                                                f"shape {list(shape)}")
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise UnsupportedOperatorError(node.op_type, node.name, f"indices outside [-{size}, {size - 1}]")
    imp.emit("TakeAlong", node, [node.input[0]], axis=axis, indices=np.where(idx < 0, idx + size, idx))


def _slice_indices(dim: int, start: int, end: int, step: int) -> tuple[int, ...]:
    """The indices ONNX's Slice keeps of an axis of ``dim`` elements (its clamping rules)."""
    start, end = (v + dim if v < 0 else v for v in (start, end))
    if step > 0:
        return tuple(range(min(max(start, 0), dim), min(max(end, 0), dim), step))
    return tuple(range(min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step))


def _slice(imp: _Importer, node: onnx.NodeProto) -> None:
    shape = imp.shape(node.input[0])
    starts = imp.const_input(node, 1, "starts")
    ends = imp.const_input(node, 2, "ends")
    if starts is None or ends is None:
        raise UnsupportedOperatorError(node.op_type, node.name, "no starts and ends inputs (opset 10 or later)")
    axes, indices = slice_spec(node, shape, starts, ends, imp.const_input(node, 3, "axes"),
                               imp.const_input(node, 4, "steps"))
    imp.emit("Slice", node, [node.input[0]], axes=axes, indices=indices)


def slice_spec(node: onnx.NodeProto, shape: tuple[int, ...], starts: np.ndarray, ends: np.ndarray,
               axes: np.ndarray | None, steps: np.ndarray | None
               ) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """The IR Slice's ``axes`` and ``indices`` (the indices kept of each axis) of ONNX Slice ``node`` of an input of
    ``shape``, from its constant inputs (``axes`` and ``steps`` None when absent); UnsupportedOperatorError for a
    step of 0."""
    axes_list = [int(v) % len(shape) for v in (range(len(starts)) if axes is None else axes.reshape(-1))]
    steps_list = [1] * len(axes_list) if steps is None else [int(v) for v in steps.reshape(-1)]
    if 0 in steps_list:
        raise UnsupportedOperatorError(node.op_type, node.name, "a step of 0")
    return tuple(axes_list), tuple(_slice_indices(shape[ax], int(b), int(e), st) for ax, b, e, st in
                                   zip(axes_list, starts.reshape(-1), ends.reshape(-1), steps_list))


def _split(imp: _Importer, node: onnx.NodeProto) -> None:
    """Split: one Slice per output, sizes from shape inference."""
    shape = imp.shape(node.input[0])
    axis = int(_attrs(node).get("axis", 0)) % len(shape)
    begin = 0
    for out in node.output:
        size = imp.shapes_of(out)[axis]
        if out:
            imp.emit("Slice", node, [node.input[0]], output=out, axes=(axis,), indices=(tuple(range(begin,
                                                                                                  begin + size)),))
        begin += size


def _where(imp: _Importer, node: onnx.NodeProto) -> None:
    """Where with a constant condition, an activation and a constant scalar (a causal mask), or a constant array
    whose entries where the condition drops the activation are one value (Longformer's chunk masks: -inf there).
    A condition that keeps the activation everywhere is the activation itself (broadcast to the output), whatever the
    constant (jax's ``jnp.var`` fills NaN where ``n - ddof <= 0``, never); a NaN the condition does select is
    refused. With two activations (Funnel's choice between its same- and different-segment attention terms), a
    selection: :func:`_select`."""
    cond, x, y = node.input
    keep = imp.const_input(node, 0, "condition")
    if not imp.is_const(x) and not imp.is_const(y):
        _select(imp, node, np.asarray(keep, bool), x, y)
        return
    if imp.is_const(x) and imp.is_const(y):
        raise UnsupportedOperatorError(node.op_type, node.name, "needs one activation and one constant value")
    src, fill = (y, x) if imp.is_const(x) else (x, y)
    value = imp.const(fill)
    keep = np.asarray(keep, bool) if src == x else ~np.asarray(keep, bool)
    out = tuple(imp.shapes_of(node.output[0]))
    if keep.all():                        # the activation everywhere (jax's Where(n - ddof > 0, var, NaN))
        if out == tuple(imp.shape(src)):
            imp.alias[node.output[0]] = imp.name(src)
        else:
            broadcast_activation(imp, node, src, out, final=True)
        return
    try:
        dropped = np.broadcast_to(value, out)[~np.broadcast_to(keep, out)]
    except ValueError:
        dropped = value.reshape(-1)
    nan = np.isnan(np.asarray(dropped, np.float64))
    if nan.any():
        raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                       f"its constant {fill!r} is NaN at {int(nan.sum())} of the "
                                       f"{int(np.prod(out))} output elements its constant condition takes from it "
                                       f"(the lab computes finite values; a NaN is taken only where the condition "
                                       f"never selects it)")
    if out != tuple(imp.shape(src)) or value.size != 1 and dropped.size and (dropped != dropped[0]).any():
        raise UnsupportedOperatorError(node.op_type, node.name, f"a constant of shape {value.shape} (only a scalar, "
                                                                f"or one value where the condition drops the "
                                                                f"activation) or an output larger than the activation")
    imp.emit("Where", node, [src], keep=keep, fill=float(dropped[0] if dropped.size else value.reshape(-1)[0]))


def _select(imp: _Importer, node: onnx.NodeProto, keep: np.ndarray, x: str, y: str) -> None:
    """``Where(keep, x, y)`` of two activations by a constant condition: ``x`` (or ``y``) alone when the condition
    is all true (false); else both broadcast to the output's shape and flattened, concatenated (one int8 scale for
    both, so the choice moves values without rounding again), and a Gather of each element from its side, viewed
    as the output."""
    out = tuple(imp.shapes_of(node.output[0]))
    keep = np.broadcast_to(keep, out)
    if keep.all() or not keep.any():
        broadcast_activation(imp, node, x if keep.all() else y, out, final=True)
        return
    size = int(np.prod(out, dtype=np.int64))
    flat = []
    for side in (x, y):
        wide = side if tuple(imp.shape(side)) == out else broadcast_activation(imp, node, side, out)
        flat.append(imp.emit_shaped("Reshape", node, [wide], (size,), shape=(size,)))
    both = imp.emit_shaped("Concat", node, flat, (2 * size,), axis=0)
    index = np.where(keep.reshape(-1), np.arange(size), np.arange(size) + size).astype(np.int64)
    chosen = imp.emit_shaped("Gather", node, [both], (size,), axis=0, indices=index)
    imp.emit("Reshape", node, [chosen], shape=out)


def _key_mask(imp: _Importer, node: onnx.NodeProto) -> None:
    """The exit of a runtime mask's region (:func:`.masks.find_key_masks` put it here; a KeyMask node of the file
    itself is refused as unknown)."""
    mask = imp.key_masks.get(node.output[0])
    if mask is None:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.emit("KeyMask", node, [mask.x, mask.mask], expand=list(mask.expand), sel=mask.sel, add=mask.add,
             fill=mask.fill, additive=mask.additive)


def _cast(imp: _Importer, node: onnx.NodeProto) -> None:
    """Cast of an activation to float32 (activations are float32 already): an identity. Any other cast of an
    activation changes its values, and is refused."""
    to = int(_attrs(node).get("to", 0))
    if to != onnx.TensorProto.FLOAT:
        raise UnsupportedOperatorError(node.op_type, node.name, f"a cast of an activation to "
                                                                f"{onnx.TensorProto.DataType.Name(to)} (only to "
                                                                f"FLOAT, an identity on the lab's float32 values)")
    _alias(imp, node)


def _index_fn(imp: _Importer, node: onnx.NodeProto) -> None:
    """Indices computed from token ids (:func:`.indices.find_index_regions` put the node here; an IndexFn node of the
    file itself is refused as unknown)."""
    region = imp.index_fns.get(node.output[0])
    if region is None:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.graph.add_tensor(region.out, region.shape, "int64")
    imp.graph.add_node("IndexFn", imp.graph.unique_name(node.name, node=True), [region.ids], [region.out],
                       onnx=region.model)


def _input_fn(imp: _Importer, node: onnx.NodeProto) -> None:
    """Values computed from a numeric graph input, in float (:func:`.numeric_inputs.replace_numeric_inputs` put the
    node here; an InputFn node of the file itself is refused as unknown)."""
    region = imp.numeric_fns.get(node.output[0])
    if region is None or list(node.input) != [region.source]:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.graph.add_tensor(region.out, region.shape, "float32")
    imp.graph.add_node("InputFn", imp.graph.unique_name(node.name, node=True), [region.source], [region.out],
                       onnx=region.model)


def _mask_fn(imp: _Importer, node: onnx.NodeProto) -> None:
    """A runtime mask's term computed from the mask (:func:`.masks.find_key_masks` put the node here, before the
    KeyMask that adds it; a MaskFn node of the file itself is refused as unknown)."""
    mask = next((m for m in imp.key_masks.values() if m.fn and m.mask == node.output[0]), None)
    if mask is None:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.graph.add_tensor(mask.mask, tuple(mask.expand), "float32")
    imp.graph.add_node("MaskFn", imp.graph.unique_name(node.name, node=True), [mask.source], [mask.mask],
                       onnx=mask.fn)


def _cumsum(imp: _Importer, node: onnx.NodeProto) -> None:
    """CumSum of an activation along a constant axis (running sums; exclusive, reverse): on the CPU, exact int64
    sums of the int8 input, one rounding (:func:`..qops.qcumsum`)."""
    axis = imp.const_input(node, 1, "axis")
    if axis is None or axis.size != 1:
        raise UnsupportedOperatorError(node.op_type, node.name, "no axis of one value")
    if imp.is_const(node.input[0]):
        raise UnsupportedOperatorError(node.op_type, node.name, "a CumSum of a constant that is not folded")
    a = _attrs(node)
    rank = len(imp.shape(node.input[0]))
    if not -rank <= int(axis.reshape(())) < rank:
        raise UnsupportedOperatorError(node.op_type, node.name, f"axis {int(axis.reshape(()))} of a tensor of rank "
                                                                f"{rank} (from {-rank} to {rank - 1})")
    imp.emit("CumSum", node, [node.input[0]], axis=int(axis.reshape(())) % rank,
             exclusive=bool(a.get("exclusive", 0)), reverse=bool(a.get("reverse", 0)))


def _trilu(imp: _Importer, node: onnx.NodeProto) -> None:
    """Trilu of an activation (its last two axes' upper or lower triangle from diagonal ``k``, zeros elsewhere):
    a Where of that constant triangle, filling 0 (a product by a causal mask)."""
    x = node.input[0]
    shape = tuple(imp.shape(x))
    k = imp.const_input(node, 1, "k")
    if len(shape) < 2 or (k is not None and k.size != 1):
        raise UnsupportedOperatorError(node.op_type, node.name, "an input of rank 2 or more and one diagonal k")
    diagonal = 0 if k is None else int(k.reshape(()))
    ones = np.ones(shape[-2:], bool)
    keep = np.triu(ones, diagonal) if _attrs(node).get("upper", 1) else np.tril(ones, diagonal)
    imp.emit("Where", node, [x], keep=keep, fill=0.0)


def _pointwise_fn(imp: _Importer, node: onnx.NodeProto) -> None:
    """An element-wise region of one or two activations (:func:`.pointwise.fuse_pointwise_regions` put the node here;
    a PointwiseFn node of the file itself is refused as unknown): one function of each element (pair)."""
    encoded = imp.pointwise_fns.get(node.output[0])
    if encoded is None:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.emit("PointwiseFn", node, list(node.input), onnx=encoded)


def _softmax(imp: _Importer, node: onnx.NodeProto) -> None:
    """Softmax on any axis; with sink logits (:func:`.score_chains.absorb_sinks` took its Concat and Slice), over the
    last axis with the sinks as an attribute, when they broadcast against its rows, or, computed from the
    activations, as its second input (``sink_input``)."""
    sink = imp.sinks.get(node.name)
    if sink is None:
        _axis_op("Softmax")(imp, node)
        return
    shape = imp.shapes_of(node.input[0])
    if isinstance(sink, str):                  # computed sink logits: the Softmax's second input
        imp.emit("Softmax", node, [node.input[0], sink], axis=len(shape) - 1, sink_input=True)
        return
    try:
        fits = np.broadcast_shapes(sink.shape[:-1], shape[:-1]) == shape[:-1] and sink.ndim == len(shape)
    except ValueError:
        fits = False
    if not fits:
        raise UnsupportedOperatorError(node.op_type, node.name, f"sink logits of shape {list(sink.shape)} that do "
                                       f"not broadcast against the rows of its input {list(shape)}")
    imp.emit("Softmax", node, [node.input[0]], axis=len(shape) - 1, sink=sink)


def _routing(imp: _Importer, node: onnx.NodeProto) -> None:
    """An MoE router's choice of experts (TopKOneHot), the chosen scores (PickChosen) or its weights renormalised
    (SumNormalize), where
    :func:`.moe.rewrite_topk_routing` put the node (such a node of the file itself is refused as unknown)."""
    if node.output[0] not in imp.routing:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.emit(node.op_type, node, list(node.input), **{k: _decode(v) for k, v in _attrs(node).items()})


def _mask_pool(imp: _Importer, node: onnx.NodeProto) -> None:
    """A masked pooling over tokens (:func:`.pooling.find_mask_pools` put the node here; a MaskPool node of the file
    itself is refused as unknown)."""
    if node.output[0] not in imp.mask_pools:
        raise UnsupportedOperatorError(node.op_type, node.name)
    a = _attrs(node)
    imp.emit("MaskPool", node, list(node.input), onnx=_decode(a["onnx"]), axes=tuple(int(v) for v in a["axes"]),
             keepdims=bool(a["keepdims"]))


def _l2_normalize(imp: _Importer, node: onnx.NodeProto) -> None:
    """``x / max(||x||_2, eps)`` along one axis: the fused F.normalize (:func:`.onnx_fusions._match_l2_normalize`),
    or ONNX's LpNormalization with ``p = 2`` (no eps); with the fusion's ``inner``, ``x / sqrt(sum(x * x) + eps)``."""
    a = _attrs(node)
    if int(a.get("p", 2)) != 2:
        raise UnsupportedOperatorError(node.op_type, node.name, f"p={a['p']} (only the L2 norm, p=2)")
    rank = len(imp.shape(node.input[0]))
    extra: dict[str, Any] = {"inner": True} if a.get("inner") else {}
    imp.emit("L2Normalize", node, [node.input[0]], axis=int(a.get("axis", -1)) % rank,
             epsilon=float(a.get("epsilon", 0.0)), **extra)


def _grn_scale(imp: _Importer, node: onnx.NodeProto) -> None:
    """ConvNeXt-V2's response normalization, fused (:func:`.rmsnorm.match_grn`): ``x * G / (mean_c(G) + eps)``."""
    a = _attrs(node)
    rank = len(imp.shape(node.input[0]))
    imp.emit("GRNScale", node, [node.input[0]], axes=tuple(int(v) % rank for v in a["axes"]),
             epsilon=float(a["epsilon"]))


def _gain_l2_scale(imp: _Importer, node: onnx.NodeProto) -> None:
    """``x * min(gain / (||x||_2 + eps), max_gain)`` along one axis, fused (:func:`.rmsnorm.match_gain_l2`)."""
    a = _attrs(node)
    rank = len(imp.shape(node.input[0]))
    imp.emit("GainL2Scale", node, [node.input[0]], axis=int(a["axis"]) % rank, epsilon=float(a["epsilon"]),
             gain=float(a["gain"]), max_gain=float(a["max_gain"]))


def _cast_like(imp: _Importer, node: onnx.NodeProto) -> None:
    """CastLike of an activation to a float32 value's type: an identity (as Cast to FLOAT); to another type,
    refused. (A constant's CastLike folds at import.)"""
    target = next((vi.type.tensor_type.elem_type for vi in list(imp.model.graph.value_info)
                   + list(imp.model.graph.input) if vi.name == node.input[1]), None)
    if target is None and imp.is_const(node.input[1]):
        target = onnx.helper.np_dtype_to_tensor_dtype(imp.const(node.input[1]).dtype)
    if target is None and node.input[1] in imp.graph.tensors:
        target = onnx.TensorProto.FLOAT if imp.graph.tensors[node.input[1]].dtype == "float32" else None
    if target != onnx.TensorProto.FLOAT:
        raise UnsupportedOperatorError(node.op_type, node.name, "a cast of an activation to another type than "
                                                                "float32's (only an identity on float32 values)")
    _alias(imp, node)


def _alias(imp: _Importer, node: onnx.NodeProto) -> None:
    imp.alias[node.output[0]] = imp.name(node.input[0])


def _dropout(imp: _Importer, node: onnx.NodeProto) -> None:
    """Dropout in inference mode: an identity. Its mask output and training mode have no inference meaning."""
    training = imp.const_input(node, 2, "training_mode")
    if training is not None and bool(np.asarray(training).any()):
        raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                       "training_mode is true; the lab runs inference, where Dropout is an identity")
    if len(node.output) > 1 and node.output[1] and (imp.uses.get(node.output[1], 0)
                                                   or node.output[1] in imp.graph_outputs):
        raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                       f"its mask output {node.output[1]!r} is used; the lab runs Dropout in "
                                       f"inference mode, as an identity, and computes no mask")
    _alias(imp, node)


def _constant(imp: _Importer, node: onnx.NodeProto) -> None:
    imp.consts[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])


def _scatter(imp: _Importer, node: onnx.NodeProto) -> None:
    """A ScatterND or ScatterElements the rewrite before import left (:func:`.scatter.scatters_as_gathers` makes one
    of constant indices, no reduction and static shapes moves of values): refused, saying which of those it lacks."""
    a = _attrs(node)
    reduction = _decode(a.get("reduction", "none"))
    if reduction != "none":
        why = f"reduction={reduction!r} (the lab takes a scatter that writes, without reduction: moves of values)"
    elif len(node.input) < 3 or not imp.is_const(node.input[1]):
        why = "its indices are computed at run time (the lab takes constant indices: the scatter is then moves)"
    else:
        indices = np.asarray(imp.const(node.input[1]))
        data = imp.shapes.get(node.input[0])
        why = (f"its constant indices (of shape {list(indices.shape)}, from {indices.min() if indices.size else '-'} "
               f"to {indices.max() if indices.size else '-'}) do not fit its data of shape "
               f"{list(data) if data is not None else 'unknown'} and updates")
    raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>", why)


RULES: dict[str, Callable[[_Importer, onnx.NodeProto], None]] = {
    "Conv": _conv,
    "BatchNormalization": _batchnorm,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Relu": lambda imp, node: imp.emit("Relu", node, [node.input[0]]),
    "Clip": _clip,
    "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": _global_average_pool,
    "GlobalLpPool": _global_reduce,
    "GlobalMaxPool": _global_reduce,
    "Flatten": _reshape,
    "Reshape": _reshape,
    "Squeeze": _reshape,
    "Unsqueeze": _reshape,
    "ReduceMax": _reduce,
    "ReverseSequence": _reverse_sequence,
    "ReduceMean": _reduce,
    "ReduceSum": _reduce,
    **{op: _reduce for op in REDUCE_KINDS},
    "Pad": _pad,
    "Concat": _axis_op("Concat"),
    "Expand": _expand,
    "Softmax": _softmax,
    "LogSoftmax": _axis_op("LogSoftmax"),
    "Sigmoid": lambda imp, node: imp.emit("Sigmoid", node, [node.input[0]]),
    "HardSigmoid": lambda imp, node: imp.emit("HardSigmoid", node, [node.input[0]],
                                              alpha=float(_attrs(node).get("alpha", 0.2)),
                                              beta=float(_attrs(node).get("beta", 0.5))),
    "HardSwish": lambda imp, node: imp.emit("HardSwish", node, [node.input[0]]),
    "Transpose": _transpose,
    "DepthToSpace": _depth_to_space,
    "Resize": _resize,
    "LayerNormalization": _layer_norm,
    "Gelu": _gelu,
    rmsnorm.FUSED_OP: _rms_norm,
    "Neg": _neg,
    "Swish": lambda imp, node: imp.emit("Swish", node, [node.input[0]], alpha=float(_attrs(node).get("alpha", 1.0))),
    "Tanh": lambda imp, node: imp.emit("Tanh", node, [node.input[0]]),
    **{op: _unary(op) for op in float_ref.ACTIVATION_DEFAULTS},
    "Pow": _pow,
    "Max": _max_min,
    "Min": _max_min,
    "PRelu": _prelu,
    "GridSample": _grid_sample,
    "ScatterND": _scatter,
    "ScatterElements": _scatter,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "InstanceNormalization": _group_norm,
    "GatherND": _gather_nd,
    "Slice": _slice,
    "Split": _split,
    "Where": _where,
    "KeyMask": _key_mask,
    "IndexFn": _index_fn,
    "MaskPool": _mask_pool,
    "MaskFn": _mask_fn,
    "InputFn": _input_fn,
    "PointwiseFn": _pointwise_fn,
    "CumSum": _cumsum,
    "Trilu": _trilu,
    "TopKOneHot": _routing,
    "SumNormalize": _routing,
    "PickChosen": _routing,
    "L2Normalize": _l2_normalize,
    "LpNormalization": _l2_normalize,
    "GRNScale": _grn_scale,
    "GainL2Scale": _gain_l2_scale,
    "Identity": _alias,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Dropout": _dropout,
    "Constant": _constant,
}
PUBLIC_OPS[:] = sorted((set(RULES) - {"KeyMask", "IndexFn", "MaskPool", "MaskFn", "InputFn", "L2Normalize", "ScatterND",
                                       "ScatterElements",
                                       "PointwiseFn", "GRNScale", "GainL2Scale", "TopKOneHot", "SumNormalize",
                                       "PickChosen"})
                       | {"Attention", "SwiGLU", "ConvTranspose", "Col2Im", "LSTM", "GRU", "RNN"})
#                          and the rewrites before import: onnx_fused's, conv_transpose's, recurrent's
