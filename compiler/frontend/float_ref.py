"""Float reference of the float graph IR in numpy (float32 activations): calibration and frontend checks.

:func:`run_float` executes a float :class:`~.ir.Graph` (ops of :data:`~.ir.FLOAT_OPS`) and can return every
intermediate tensor, which is what calibration needs.

Every result is the same bytes on every machine: calibration, and so the scales and programs of a compiled model,
must not depend on the host. A BLAS product does (its kernel, chosen by the CPU, and its thread count set the order
in which it sums, and float sums round differently in another order), so convolutions and dense layers go through
:func:`exact_matmul`, whose BLAS call adds integers that float64 holds exactly. The other operations are numpy's
element-wise arithmetic and reductions, whose order is fixed by numpy's own code, not by the CPU.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..ir import Graph, GraphError, Node
from ..qops import (
    KEY_MASK_ATTRS,
    cumsum,
    embed,
    exact_exp,
    gain_l2_scale,
    gather_at,
    grid_sample,
    grn_scale,
    key_mask,
    l2_normalize,
    log_softmax,
    mask_fn,
    mask_pool,
    pick_chosen,
    reduce_rows,
    resize_cubic_weights,
    resize_source,
    resize_taps,
    run_index_fn,
    run_input_fn,
    sink_softmax,
    sum_normalize,
    take_along,
    top_k_one_hot,
)
from .pointwise import pointwise_values

__all__ = ["exact_matmul", "exact_exp", "conv2d", "dense", "maxpool", "avgpool", "resize", "layer_norm", "rms_norm",
           "slice_take", "ACTIVATIONS", "ACTIVATION_DEFAULTS", "FLOAT_FNS", "activation_attrs", "table_values",
           "run_float"]

_MANTISSA_BITS = 53
"""float64 holds every integer of up to this many bits exactly."""


def _fixed_point(x: np.ndarray, axis: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as integers (float64) of at most ``bits`` bits and power-of-two exponents along ``axis``:
    ``x ~ ints * 2**exps``, each slice along ``axis`` scaled by its own largest magnitude (block floating point)."""
    peak = np.maximum(np.max(x, axis=axis, keepdims=True), -np.min(x, axis=axis, keepdims=True))
    exps = np.frexp(peak)[1] - bits          # |x| < 2**frexp(peak)[1], so |ints| <= 2**bits
    ints = x * np.ldexp(1.0, -exps)          # a product by a power of two: exact
    return np.rint(ints, out=ints), exps


_BLOCK_ELEMENTS = 1 << 14
"""Elements of ``a`` rounded and multiplied per BLAS call (128 KiB of float64): bounds the temporaries."""


def exact_matmul(a: np.ndarray, b: np.ndarray, dtype: type = np.float64) -> np.ndarray:
    """``a @ b`` (``a [..., M, K]``, ``b [..., K, N]``, float) as ``dtype``, the same bits whatever BLAS kernel or
    thread count the host uses.

    Each row of ``a`` and each column of ``b`` is rounded to an integer of ``(53 - ceil(log2 K)) / 2`` bits times a
    power of two (20 bits for K = 4608: a relative error of 2**-20 of the row's or column's largest value, far below
    float32 activations' use here, which is to set int8 scales); the integers' products and their sums over K then
    fit float64's 53-bit mantissa, so BLAS adds them exactly in any order, and scaling back by the powers of two is
    exact too. Rows of ``a`` go through in blocks (:data:`_BLOCK_ELEMENTS`), which bounds the float64 temporaries
    without changing a bit. Non-finite operands fall back to a plain float64 product."""
    a = np.asarray(a)
    b = np.asarray(b, np.float64)
    k = a.shape[-1]
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return np.matmul(a.astype(np.float64), b).astype(dtype)
    total = _MANTISSA_BITS - max(1, int(k - 1).bit_length())
    b_int, b_exp = _fixed_point(b, -2, total - total // 2)
    b_scale = np.ldexp(1.0, b_exp)
    out: np.ndarray = np.empty(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), dtype)
    rows = max(1, _BLOCK_ELEMENTS // max(1, k * int(np.prod(a.shape[:-2], dtype=np.int64))))
    for r in range(0, a.shape[-2], rows):
        a_int, a_exp = _fixed_point(a[..., r:r + rows, :].astype(np.float64), -1, total // 2)
        block = np.matmul(a_int, b_int)
        block *= np.ldexp(1.0, a_exp)        # products by powers of two: exact
        block *= b_scale
        out[..., r:r + rows, :] = block
    return out


def _pad_hw(x: np.ndarray, pads: Sequence[int], value: float) -> np.ndarray:
    top, left, bottom, right = (int(p) for p in pads)
    if not (top or left or bottom or right):
        return x
    n, c, h, w = x.shape  # not np.pad: its slice tuples outlive the call until the garbage collector runs
    out = np.full((n, c, top + h + bottom, left + w + right), value, x.dtype)
    out[:, :, top:top + h, left:left + w] = x
    return out


def _windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    view = np.lib.stride_tricks.sliding_window_view(x, tuple(kernel), axis=(2, 3))
    return view[:, :, ::strides[0], ::strides[1]]


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, strides: Sequence[int], pads: Sequence[int],
           groups: int) -> np.ndarray:
    """Float grouped convolution ``x [N,C,H,W]``, ``w [O, C/groups, KH, KW]`` -> ``[N, O, OH, OW]`` float32."""
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    win = _windows(_pad_hw(x.astype(np.float32), pads, 0.0), (kh, kw), strides)
    oh, ow = win.shape[2], win.shape[3]
    og = o // groups
    cols = win.reshape(n, groups, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6).reshape(groups, n * oh * ow, -1)
    wmat = w.astype(np.float32).reshape(groups, og, cg * kh * kw).transpose(0, 2, 1)
    out = exact_matmul(cols, wmat, np.float32).reshape(groups, n, oh, ow, og)
    out = out.transpose(1, 0, 4, 2, 3).reshape(n, o, oh, ow)
    if b is not None:
        out = out + b.astype(np.float32).reshape(1, o, 1, 1)
    return out


def dense(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """``x [N, K] @ w[O, K].T + b`` float32 (the product by :func:`exact_matmul`)."""
    out = exact_matmul(x, np.asarray(w).T, np.float32)
    return out + b.astype(np.float32) if b is not None else out


def maxpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int]) -> np.ndarray:
    """Float max pooling (pads are -inf)."""
    return _windows(_pad_hw(x, pads, -np.inf), kernel, strides).max(axis=(4, 5))


def avgpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
            count_include_pad: bool) -> np.ndarray:
    """Float average pooling; the divisor excludes pads unless ``count_include_pad``."""
    total = _windows(_pad_hw(x, pads, 0.0), kernel, strides).sum(axis=(4, 5))
    if count_include_pad:
        return (total / (kernel[0] * kernel[1])).astype(np.float32)
    ones = np.ones((1, 1) + x.shape[2:], np.float32)
    count = _windows(_pad_hw(ones, pads, 0.0), kernel, strides).sum(axis=(4, 5))
    return (total / count).astype(np.float32)


def _clip(x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    return np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """Softmax along ``axis``; a row masked out whole (every value -inf) is 0, as the NaN guard exporters put after
    a masked softmax makes it."""
    top = x.max(axis=axis, keepdims=True)
    dead = np.isneginf(top)
    z = exact_exp(x - np.where(dead, 0, top))
    total = z.sum(axis=axis, keepdims=True)
    return z / np.where(dead, 1, total)


def _pad(x: np.ndarray, pads: Sequence[int], value: float) -> np.ndarray:
    rank = x.ndim
    return np.pad(x, [(pads[i], pads[i + rank]) for i in range(rank)], constant_values=value)


def resize(x: np.ndarray, mode: str, coordinate_transformation_mode: str, nearest_mode: str, scales: Sequence[float],
           sizes: Sequence[int], cubic_coeff_a: float = -0.75, exclude_outside: bool = False) -> np.ndarray:
    """Float Resize, nearest, linear or cubic (each resized axis in turn, float64 weights), as :func:`.qops.resize`
    with real weights and no rounding."""
    out = np.asarray(x, np.float64)
    for axis, (in_len, out_len, scale) in enumerate(zip(x.shape, sizes, scales)):
        if in_len == out_len and scale == 1.0:
            continue
        if mode == "cubic":
            idx, weights = resize_cubic_weights(resize_source(in_len, out_len, scale, coordinate_transformation_mode),
                                                in_len, cubic_coeff_a, exclude_outside)
            shape = [1] * out.ndim
            shape[axis] = out_len
            out = sum(np.take(out, idx[k], axis=axis) * weights[k].reshape(shape) for k in range(4))
            continue
        i0, i1, frac = resize_taps(resize_source(in_len, out_len, scale, coordinate_transformation_mode), in_len,
                                   mode, nearest_mode)
        shape = [1] * out.ndim
        shape[axis] = out_len
        w1 = frac.reshape(shape)
        out = np.take(out, i0, axis=axis) * (1.0 - w1) + np.take(out, i1, axis=axis) * w1
    return out


def _scalar_map(fn: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    """``fn`` (a C library function of :mod:`math`) on every element in float64, one at a time (as
    :func:`exact_exp`)."""
    flat = np.asarray(x, np.float64).ravel()
    return np.fromiter(map(fn, flat.tolist()), np.float64, flat.size).reshape(np.shape(x))


def _gelu(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    """ONNX's Gelu: ``x/2 * (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"``
    ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3)))``."""
    x = np.asarray(x, np.float64)
    if attrs["approximate"] == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + _scalar_map(math.tanh, inner))
    return 0.5 * x * (1.0 + _scalar_map(math.erf, x / math.sqrt(2.0)))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, axis: int, epsilon: float) -> np.ndarray:
    """ONNX's LayerNormalization over the axes ``axis`` to the last, in float64: ``(x - mean) / sqrt(var + eps) *
    gamma + beta`` (population variance)."""
    x = np.asarray(x, np.float64)
    axes = tuple(range(axis, x.ndim))
    centred = x - x.mean(axis=axes, keepdims=True)
    var = (centred * centred).mean(axis=axes, keepdims=True)
    return centred / np.sqrt(var + epsilon) * np.asarray(gamma, np.float64) + np.asarray(beta, np.float64)


def rms_norm(x: np.ndarray, gamma: np.ndarray, axis: int, epsilon: float) -> np.ndarray:
    """RMSNorm over the axes ``axis`` to the last, in float64: ``x / sqrt(mean(x**2) + eps) * gamma`` (no mean
    subtracted, no bias; Llama's and T5's norm, ONNX's RMSNormalization of opset 23)."""
    x = np.asarray(x, np.float64)
    axes = tuple(range(axis, x.ndim))
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + epsilon) * np.asarray(gamma, np.float64)


def slice_take(x: np.ndarray, axes: Sequence[int], indices: Sequence[Sequence[int]]) -> np.ndarray:
    """The elements of ``x`` at ``indices[k]`` along ``axes[k]`` for every k (a Slice or Split as index lists)."""
    for axis, idx in zip(axes, indices):
        x = np.take(x, np.asarray(idx, np.int64), axis=axis)
    return x


def _sigmoid(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    return 1.0 / (1.0 + exact_exp(-np.asarray(x, np.float64)))


def _hard_sigmoid(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    return np.clip(attrs["alpha"] * np.asarray(x, np.float64) + attrs["beta"], 0.0, 1.0)


def _swish(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    """ONNX's Swish (opset 24): ``x * sigmoid(alpha * x)``."""
    x = np.asarray(x, np.float64)
    return x * _sigmoid(attrs["alpha"] * x, attrs)


def _hard_swish(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


def _softplus(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    """``log(1 + exp(x))``, as ``max(x, 0) + log1p(exp(-|x|))`` (no overflow)."""
    x = np.asarray(x, np.float64)
    return np.maximum(x, 0.0) + _scalar_map(math.log1p, exact_exp(-np.abs(x)))


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    """``x`` where ``x > 0``, else ``alpha (exp(x) - 1)``."""
    x = np.asarray(x, np.float64)
    return np.where(x > 0, x, alpha * _scalar_map(math.expm1, np.minimum(x, 0.0)))


def _mish(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x * _scalar_map(math.tanh, _softplus(x, attrs))


def _integer_power(x: np.ndarray, exponent: int) -> np.ndarray:
    """``x ** exponent`` in float64 by repeated products (the same bits on every machine); a negative exponent's
    power of 0 is infinity, as IEEE division gives."""
    x = np.asarray(x, np.float64)
    out = np.ones_like(x)
    for _ in range(abs(exponent)):
        out = out * x
    if exponent >= 0:
        return out
    with np.errstate(divide="ignore"):
        return 1.0 / out


def _sqrt(v: float) -> float:
    return math.sqrt(v) if v >= 0 else math.nan


def _reciprocal(v: float) -> float:
    return 1.0 / v if v != 0 else math.copysign(math.inf, v)


def _math(fn: Callable[[float], float]) -> Callable[[np.ndarray, Mapping], np.ndarray]:
    return lambda x, attrs: _scalar_map(fn, x)


ACTIVATIONS: dict[str, Callable[[np.ndarray, Mapping], np.ndarray]] = {
    "Sigmoid": _sigmoid, "HardSigmoid": _hard_sigmoid, "HardSwish": _hard_swish, "Gelu": _gelu, "Swish": _swish,
    "Tanh": _math(math.tanh), "Exp": lambda x, attrs: exact_exp(x), "Softplus": _softplus, "Mish": _mish,
    "Softsign": lambda x, attrs: np.asarray(x, np.float64) / (1.0 + np.abs(np.asarray(x, np.float64))),
    "Abs": lambda x, attrs: np.abs(np.asarray(x, np.float64)),
    "Sign": lambda x, attrs: np.sign(np.asarray(x, np.float64)),
    "Erf": _math(math.erf), "Sin": _math(math.sin), "Cos": _math(math.cos), "Atan": _math(math.atan),
    "Elu": lambda x, attrs: _elu(x, attrs["alpha"]),
    "Selu": lambda x, attrs: attrs["gamma"] * _elu(x, attrs["alpha"]),
    "Celu": lambda x, attrs: np.maximum(np.asarray(x, np.float64), 0.0) + np.minimum(
        _elu(np.asarray(x, np.float64) / attrs["alpha"], 1.0) * attrs["alpha"], 0.0),
    "LeakyRelu": lambda x, attrs: np.where(np.asarray(x) >= 0, np.asarray(x, np.float64),
                                           attrs["alpha"] * np.asarray(x, np.float64)),
    "ThresholdedRelu": lambda x, attrs: np.where(np.asarray(x) > attrs["alpha"], np.asarray(x, np.float64), 0.0),
    "Pow": lambda x, attrs: _integer_power(x, int(attrs["exponent"])),
    "Sqrt": _math(_sqrt), "Reciprocal": _math(_reciprocal),
    "Neg": lambda x, attrs: -np.asarray(x, np.float64),
}
"""Element-wise activations ``f(x float64, node attrs) -> float64``, the same bits on every machine (exp by
:func:`exact_exp`): the float reference and the quantizer's lookup tables both use them."""

ACTIVATION_DEFAULTS: dict[str, dict[str, float]] = {
    "Elu": {"alpha": 1.0}, "Celu": {"alpha": 1.0}, "LeakyRelu": {"alpha": 0.01}, "ThresholdedRelu": {"alpha": 1.0},
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    **{op: {} for op in ("Exp", "Softplus", "Softsign", "Mish", "Abs", "Sign", "Erf", "Sin", "Cos", "Atan", "Sqrt",
                         "Reciprocal")},
}
"""The element-wise ONNX operators of one input imported as the activation of that name (each a lookup table once
quantized), with ONNX's default of each float attribute they take."""


def activation_attrs(op: str, given: Mapping[str, Any]) -> dict[str, float]:
    """The float attributes of activation ``op`` of :data:`ACTIVATION_DEFAULTS`: ``given``'s (an ONNX node's), else
    ONNX's default of each."""
    return {k: float(given.get(k, v)) for k, v in ACTIVATION_DEFAULTS[op].items()}


def table_values(op: str, x: np.ndarray, attrs: Mapping) -> np.ndarray:
    """Activation ``op`` of :data:`ACTIVATIONS` at the real values ``x`` a lookup table's int8 entries stand for,
    in float64, with NaN (Sqrt of a negative value) as 0; an infinity is left for the table's clip."""
    real = ACTIVATIONS[op](x, attrs)
    return np.where(np.isnan(real), 0.0, real)

FloatFn = Callable[[Node, list[np.ndarray]], np.ndarray]


def _elementwise(fn: Callable[[np.ndarray, Mapping], np.ndarray]) -> FloatFn:
    return lambda node, values: fn(values[0], node.attrs)


FLOAT_FNS: dict[str, FloatFn] = {
    "Conv2d": lambda n, v: conv2d(v[0], v[1], v[2] if len(v) > 2 else None, n.attrs["strides"], n.attrs["pads"],
                                  n.attrs["groups"]),
    "Dense": lambda n, v: dense(v[0], v[1], v[2] if len(v) > 2 else None),
    "Relu": lambda n, v: np.maximum(v[0], 0),
    "Clip": lambda n, v: _clip(v[0], n.attrs["min"], n.attrs["max"]),
    "Add": lambda n, v: v[0] + v[1],
    "Mul": lambda n, v: v[0] * v[1],
    "MaxPool": lambda n, v: maxpool(v[0], n.attrs["kernel"], n.attrs["strides"], n.attrs["pads"]),
    "AvgPool": lambda n, v: avgpool(v[0], n.attrs["kernel"], n.attrs["strides"], n.attrs["pads"],
                                    n.attrs["count_include_pad"]),
    "GlobalAvgPool": lambda n, v: v[0].mean(axis=(2, 3), keepdims=True),
    "Reshape": lambda n, v: v[0].reshape(n.attrs["shape"]),
    "Pad": lambda n, v: _pad(v[0], n.attrs["pads"], n.attrs["value"]),
    "Concat": lambda n, v: np.concatenate(v, axis=n.attrs["axis"]),
    "Softmax": lambda n, v: sink_softmax(v[0], v[1], exact_exp) if n.attrs.get("sink_input") else
    _softmax(v[0], n.attrs["axis"]) if n.attrs.get("sink") is None else sink_softmax(v[0], n.attrs["sink"], exact_exp),
    **{op: _elementwise(fn) for op, fn in ACTIVATIONS.items()},
    "Transpose": lambda n, v: np.transpose(v[0], n.attrs["perm"]),
    "Resize": lambda n, v: resize(v[0], n.attrs["mode"], n.attrs["coordinate_transformation_mode"],
                                  n.attrs["nearest_mode"], n.attrs["scales"], n.attrs["sizes"],
                                  n.attrs.get("cubic_coeff_a", -0.75), bool(n.attrs.get("exclude_outside", 0))),
    "MatMul": lambda n, v: exact_matmul(v[0], v[1], np.float32),
    "LayerNorm": lambda n, v: layer_norm(v[0], v[1], v[2], n.attrs["axis"], n.attrs["epsilon"]),
    "RMSNorm": lambda n, v: rms_norm(v[0], v[1], n.attrs["axis"], n.attrs["epsilon"]),
    "Gather": lambda n, v: np.take(v[0], n.attrs["indices"], axis=n.attrs["axis"]),
    "GatherAt": lambda n, v: gather_at(v[0], v[1], n.attrs["axis"]),
    "TakeAlong": lambda n, v: take_along(v[0], n.attrs["indices"], n.attrs["axis"]),
    "Embedding": lambda n, v: embed(v[0], v[1]),
    "Slice": lambda n, v: slice_take(v[0], n.attrs["axes"], n.attrs["indices"]),
    "Where": lambda n, v: np.where(n.attrs["keep"], v[0], np.float32(n.attrs["fill"])),
    "IndexFn": lambda n, v: run_index_fn(n.attrs["onnx"], v[0]),
    "InputFn": lambda n, v: run_input_fn(n.attrs["onnx"], v[0]),
    "L2Normalize": lambda n, v: l2_normalize(v[0], n.attrs["axis"], n.attrs["epsilon"],
                                             bool(n.attrs.get("inner", False))),
    "MaskFn": lambda n, v: mask_fn(n.attrs["onnx"], v[0]),
    "TopKOneHot": lambda n, v: top_k_one_hot(v[0], n.attrs["k"], v[1] if len(v) > 1 else None, n.attrs["keep"]),
    "PickChosen": lambda n, v: pick_chosen(v[0], v[1]),
    "GainL2Scale": lambda n, v: gain_l2_scale(v[0], n.attrs["axis"], n.attrs["epsilon"], n.attrs["gain"],
                                              n.attrs["max_gain"]),
    "GRNScale": lambda n, v: grn_scale(v[0], n.attrs["axes"], n.attrs["epsilon"]),
    "SumNormalize": lambda n, v: sum_normalize(v[0], n.attrs["axis"], n.attrs["epsilon"]),
    "Reduce": lambda n, v: reduce_rows(v[0], n.attrs["kind"], n.attrs["axis"], n.attrs.get("epsilon", 0.0)),
    "LogSoftmax": lambda n, v: log_softmax(v[0], n.attrs["axis"]),
    "GridSample": lambda n, v: grid_sample(v[0], n.attrs["grid"] if "grid" in n.attrs else v[1], n.attrs["mode"],
                                           n.attrs["padding"], n.attrs["align_corners"]).astype(np.float32),
    "CumSum": lambda n, v: cumsum(v[0], n.attrs["axis"], n.attrs["exclusive"], n.attrs["reverse"]),
    "PointwiseFn": lambda n, v: pointwise_values(n.attrs["onnx"], *v),
    "MaskPool": lambda n, v: mask_pool(v[0], v[1], n.attrs["onnx"], n.attrs["axes"], n.attrs["keepdims"]),
    "KeyMask": lambda n, v: key_mask(v[0], v[1], *(n.attrs[k] for k in KEY_MASK_ATTRS)).astype(np.float32),
}


def run_float(graph: Graph, inputs: Mapping[str, np.ndarray], *, keep_all: bool = False,
              observe: Callable[[str, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
    """Execute a float graph; returns its outputs, or every non-constant tensor when ``keep_all`` (float32).

    ``observe(name, value)`` is called with every input and every tensor a node produces, as it is produced. Unless
    ``keep_all``, a tensor is dropped after its last consumer: memory is the live tensors, not all of them (what
    calibration over many samples needs)."""
    last_use = {name: k for k, node in enumerate(graph.nodes) for name in node.inputs}
    keep = set(graph.outputs)
    values: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise ValueError(f"Input {name!r} of graph {graph.name!r} is missing; given {sorted(inputs)}.")
        values[name] = np.asarray(inputs[name], dtype=np.int64 if graph.tensors[name].dtype == "int64" else
                                  np.float32)
        if values[name].shape != graph.shape(name):
            raise ValueError(f"Input {name!r} has shape {values[name].shape}; graph {graph.name!r} expects "
                             f"{graph.shape(name)}.")
        if observe is not None:
            observe(name, values[name])
    for k, node in enumerate(graph.nodes):
        fn = FLOAT_FNS.get(node.op)
        if fn is None:
            raise GraphError(f"Node {node.name!r} has op {node.op!r}, which the float reference does not define.")
        args = [values[i] if i in values else graph.constants[i] for i in node.inputs]
        out = node.outputs[0]
        values[out] = np.asarray(fn(node, args), dtype=np.int64 if graph.tensors[out].dtype == "int64" else np.float32)
        del args
        if observe is not None:
            observe(out, values[out])
        if not keep_all:
            for name in [*node.inputs, out]:
                if name in values and name not in keep and last_use.get(name, -1) <= k:
                    del values[name]
    return values if keep_all else {name: values[name] for name in graph.outputs}
