"""The references of a sentence encoder's head, on the CPU:

* ``MaskPool`` / ``QMaskPool``: a masked pooling over tokens (:mod:`.frontend.pooling`), ``ReduceSum(x * W, axes) /
  D`` with the weights ``W`` and the divisor ``D`` computed from the attention mask by a part of the model's ONNX
  graph (ONNX's reference evaluator);
* ``MaskFn``: an attention mask's additive term computed from the mask by a part of the model's graph (a term
  that is not element-wise in one mask entry, :func:`.frontend.masks.find_key_masks`);
* ``L2Normalize`` / ``QL2Normalize``: ``x / max(||x||_2, eps)`` along one axis (torch's ``F.normalize``, ONNX's
  ``LpNormalization`` with ``p = 2``);
* ``SumNormalize`` / ``QSumNormalize``: ``x / (sum(x) + eps)`` along one axis (an MoE router's top-k weights
  renormalised to sum 1, :mod:`.frontend.moe`);
* ``GRNScale`` / ``QGRNScale``: ConvNeXt-V2's response normalization, ``x * G / (mean_c(G) + eps)`` with ``G`` the
  L2 norm over the spatial axes (:func:`.frontend.rmsnorm.match_grn`);
* ``GainL2Scale`` / ``QGainL2Scale``: ``x * min(gain / (||x||_2 + eps), max_gain)`` along one axis (Inkling-2's query
  and key norms, :func:`.frontend.rmsnorm.match_gain_l2`);
* ``Reduce`` / ``QReduce``: ONNX's other reductions along one axis, kept (:data:`REDUCE_KINDS`: ReduceMin, ReduceL1,
  ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp);
* ``LogSoftmax`` / ``QLogSoftmax``: ``x - log(sum(exp(x)))`` (ONNX's ``LogSoftmax``: a classifier's last layer);
* ``GridSample`` / ``QGridSample``: ONNX's GridSample of a 4-D or 5-D input at a grid computed at run time (RAFT's
  correlation lookups and warps, a spatial transformer, VoxelMorph's), (bi/tri)linear or nearest, in float64 from the
  int8 values.
"""
from __future__ import annotations

import math

import numpy as np

from .qops_index import run_region

__all__ = ["pool_terms", "mask_pool", "qmask_pool", "l2_normalize", "ql2_normalize", "mask_fn", "sum_normalize",
           "qsum_normalize", "grn_scale", "qgrn_scale", "gain_l2_scale", "qgain_l2_scale", "log_sum_exp",
           "REDUCE_KINDS", "reduce_rows", "qreduce", "log_softmax", "qlog_softmax", "exact_exp", "cumsum", "qcumsum",
           "grid_sample", "qgrid_sample", "GRID_MODES", "GRID_PADDINGS"]

REDUCE_KINDS = {"ReduceMin": "min", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sum_square",
                "ReduceLogSum": "log_sum", "ReduceLogSumExp": "log_sum_exp", "ReduceSum": "sum"}
"""ONNX's reductions the ``Reduce`` op computes on the CPU, by the ``kind`` it calls each (ReduceMean and ReduceMax
are pools; ReduceSum was a mean pool times the count until 2026-11-27, whose mean, rounded at the input's int8 step,
lost about half the bits of a sum of n terms of mixed signs (a factor sqrt(n) coarser): it is now an exact int64
sum rounded once at the output's own scale). ReduceProd is not one: a product of int8 values multiplies their
rounding errors (onnx's ``test_reduce_prod_default_axes_keepdims_random``, 12 factors, misses the int8 tolerance
threefold)."""


def pool_terms(encoded: str, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weights ``W`` and the divisor ``D`` (float64) the region model ``encoded`` computes from ``mask`` (fed
    in the model's input type); ``D`` is 1 for a model of one output (a plain product by the mask)."""
    results = run_region(encoded, mask, "the pooling's weights computed from the mask failed on this mask")
    divisor = results[1] if len(results) > 1 else 1.0
    return np.asarray(results[0], np.float64), np.asarray(divisor, np.float64)


def mask_pool(x: np.ndarray, mask: np.ndarray, encoded: str, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """Float ``ReduceSum(x * W, axes, keepdims) / D`` in float64."""
    weights, divisor = pool_terms(encoded, mask)
    total = np.sum(np.asarray(x, np.float64) * weights, axis=tuple(axes), keepdims=bool(keepdims))
    return total / divisor


def qmask_pool(x: np.ndarray, mask: np.ndarray, encoded: str, axes: tuple[int, ...], keepdims: bool, scale: float,
               out_scale: float) -> np.ndarray:
    """int8 masked pooling of the int8 ``x`` (of ``scale``): the sum of ``x * W`` exact in int64 (the weights must
    be integers, as a cast 0/1 mask is), times ``scale``, divided by ``D`` in float64, then ``clip(rint(. /
    out_scale))``. The same bits on every machine."""
    weights, divisor = pool_terms(encoded, mask)
    if not np.array_equal(weights, np.rint(weights)) or np.abs(weights).max(initial=0) > 2**31:
        raise ValueError("the pooling's weights computed from the mask are not integers (the lab pools with a 0/1 "
                         "mask's weights)")
    total = np.sum(np.asarray(x, np.int64) * weights.astype(np.int64), axis=tuple(axes), keepdims=bool(keepdims))
    y = total.astype(np.float64) * float(scale) / divisor
    return np.clip(np.rint(y / out_scale), -128, 127).astype(np.int8)


def l2_normalize(x: np.ndarray, axis: int, epsilon: float, inner: bool = False) -> np.ndarray:
    """Float ``x / max(||x||_2, epsilon)`` along ``axis``, in float64 (a zero row gives zeros); with ``inner``,
    ``x / sqrt(sum(x * x) + epsilon)``."""
    x = np.asarray(x, np.float64)
    total = np.sum(x * x, axis=axis, keepdims=True)
    norm = np.sqrt(total + epsilon) if inner else np.maximum(np.sqrt(total), epsilon)
    return x / np.where(norm > 0, norm, 1.0)


def ql2_normalize(x: np.ndarray, axis: int, epsilon: float, scale: float, out_scale: float,
                  inner: bool = False, zero_point: int = 0, out_zero_point: int = 0, lo: int = -128,
                  hi: int = 127) -> np.ndarray:
    """int8 ``x / max(||x||_2, epsilon)`` of the int8 ``x`` (of ``scale`` and ``zero_point``): the squares of
    ``x - zero_point`` summed exactly in int64, then in float64 ``x / max(sqrt(q), epsilon / scale)`` (with
    ``inner``: ``x / sqrt(q + epsilon / scale**2)``) and ``clip(rint(. / out_scale) + out_zero_point, lo, hi)`` (a
    pre-quantized file's output parameters). The same bits on every machine."""
    xi = np.asarray(x, np.int64) - int(zero_point)
    total = (xi * xi).sum(axis=axis, keepdims=True).astype(np.float64)
    norm = np.sqrt(total + epsilon / (scale * scale)) if inner else np.maximum(np.sqrt(total), epsilon / scale)
    y = xi.astype(np.float64) / np.where(norm > 0, norm, 1.0)
    return np.clip(np.rint(y / out_scale) + int(out_zero_point), lo, hi).astype(np.int8)


def sum_normalize(x: np.ndarray, axis: int, epsilon: float) -> np.ndarray:
    """Float ``x / (sum(x, axis) + epsilon)`` in float64; where the denominator is 0, 0."""
    x = np.asarray(x, np.float64)
    den = np.sum(x, axis=axis, keepdims=True) + epsilon
    return np.where(den != 0, x / np.where(den != 0, den, 1.0), 0.0)


def qsum_normalize(x: np.ndarray, axis: int, epsilon: float, scale: float, out_scale: float) -> np.ndarray:
    """int8 ``x / (sum(x) + epsilon)`` of the int8 ``x`` (of ``scale``): the sum exact in int64, then in float64
    ``x / (sum + epsilon / scale)`` (0 where that is 0) and ``clip(rint(. / out_scale))``. The same bits on every
    machine."""
    xi = np.asarray(x, np.int64)
    den = xi.sum(axis=axis, keepdims=True).astype(np.float64) + epsilon / scale
    y = np.where(den != 0, xi.astype(np.float64) / np.where(den != 0, den, 1.0), 0.0)
    return np.clip(np.rint(y / out_scale), -128, 127).astype(np.int8)


def grn_scale(x: np.ndarray, axes: tuple[int, ...], epsilon: float) -> np.ndarray:
    """Float ``x * G / (mean(G, last axis) + epsilon)``, ``G = ||x||_2`` over ``axes`` (kept), in float64."""
    x = np.asarray(x, np.float64)
    norm = np.sqrt(np.sum(x * x, axis=tuple(axes), keepdims=True))
    return x * norm / (norm.mean(axis=-1, keepdims=True) + epsilon)


def qgrn_scale(x: np.ndarray, axes: tuple[int, ...], epsilon: float, scale: float, out_scale: float) -> np.ndarray:
    """int8 :func:`grn_scale` of the int8 ``x`` (of ``scale``): the squares summed exactly in int64, then float64
    and ``clip(rint(. / out_scale))``. The same bits on every machine."""
    xi = np.asarray(x, np.int64)
    norm = np.sqrt((xi * xi).sum(axis=tuple(axes), keepdims=True).astype(np.float64)) * scale
    y = xi.astype(np.float64) * scale * norm / (norm.mean(axis=-1, keepdims=True) + epsilon)
    return np.clip(np.rint(y / out_scale), -128, 127).astype(np.int8)


def _gain(norm: np.ndarray, epsilon: float, gain: float, max_gain: float) -> np.ndarray:
    """``min(gain / (norm + epsilon), max_gain)``; 0 where the denominator is 0 (the row is 0 then)."""
    den = norm + epsilon
    return np.where(den > 0, np.minimum(gain / np.where(den > 0, den, 1.0), max_gain), 0.0)


def gain_l2_scale(x: np.ndarray, axis: int, epsilon: float, gain: float, max_gain: float) -> np.ndarray:
    """Float ``x * min(gain / (||x||_2 + epsilon), max_gain)`` along ``axis``, in float64."""
    x = np.asarray(x, np.float64)
    return x * _gain(np.sqrt(np.sum(x * x, axis=axis, keepdims=True)), epsilon, gain, max_gain)


def qgain_l2_scale(x: np.ndarray, axis: int, epsilon: float, gain: float, max_gain: float, scale: float,
                   out_scale: float) -> np.ndarray:
    """int8 :func:`gain_l2_scale` of the int8 ``x`` (of ``scale``): the squares summed exactly in int64, then float64
    and ``clip(rint(. / out_scale))``. The same bits on every machine."""
    xi = np.asarray(x, np.int64)
    norm = np.sqrt((xi * xi).sum(axis=axis, keepdims=True).astype(np.float64)) * scale
    y = xi.astype(np.float64) * scale * _gain(norm, epsilon, gain, max_gain)
    return np.clip(np.rint(y / out_scale), -128, 127).astype(np.int8)


def mask_fn(encoded: str, mask: np.ndarray) -> np.ndarray:
    """The float32 additive term the region model ``encoded`` computes from ``mask``."""
    (term,) = run_region(encoded, mask, "the attention mask's term computed from the mask failed on this mask")
    return term.astype(np.float32)


def exact_exp(x: np.ndarray) -> np.ndarray:
    """``exp(x)`` in float64 by the C library's ``exp``, one element at a time: numpy's vectorised ``exp`` is chosen
    by the CPU's instruction set (AVX-512 or not) and may differ from it in the last bit."""
    flat = np.asarray(x, np.float64).ravel()
    return np.fromiter(map(_exp, flat.tolist()), np.float64, flat.size).reshape(np.shape(x))


def _exp(v: float) -> float:
    """``math.exp(v)``, or infinity where it overflows (as IEEE arithmetic and numpy give)."""
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _logs(x: np.ndarray) -> np.ndarray:
    """``log(x)`` in float64 by the C library's ``log``, one element at a time (as :func:`exact_exp`): ``-inf`` at 0,
    NaN below."""
    flat = np.asarray(x, np.float64).ravel()
    return np.fromiter((math.log(v) if v > 0 else -math.inf if v == 0 else math.nan for v in flat.tolist()),
                       np.float64, flat.size).reshape(np.shape(x))


def log_sum_exp(x: np.ndarray, axis: int) -> np.ndarray:
    """Float ``log(sum(exp(x), axis))`` (the axis kept) in float64: shifted by the row's largest value, ``exp`` and
    ``log`` by the C library element by element (numpy's vectorised ones depend on the CPU's SIMD); ``-inf`` for a
    row of ``-inf``."""
    z = np.asarray(x, np.float64)
    top = z.max(axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0) if np.isneginf(top).any() else top
    return top + _logs(exact_exp(z - top).sum(axis=axis, keepdims=True))


def reduce_rows(x: np.ndarray, kind: str, axis: int, epsilon: float = 0.0) -> np.ndarray:
    """Float reduction ``kind`` (a value of :data:`REDUCE_KINDS`, or LayerNormalization's statistics ``mean`` and
    ``inv_std``, ``1 / sqrt(var + epsilon)`` of the population variance) of ``x`` along ``axis``, kept, in float64;
    ``log``, ``exp`` by the C library, so the same bits on every machine."""
    z = np.asarray(x, np.float64)
    if kind == "log_sum_exp":
        return log_sum_exp(z, axis)
    if kind == "min":
        return z.min(axis=axis, keepdims=True)
    if kind == "mean":
        return z.mean(axis=axis, keepdims=True)
    if kind == "inv_std":
        return 1.0 / np.sqrt(np.square(z - z.mean(axis=axis, keepdims=True)).mean(axis=axis, keepdims=True) + epsilon)
    return _from_sum(_summand(z, kind).sum(axis=axis, keepdims=True), kind)


def _summand(x: np.ndarray, kind: str) -> np.ndarray:
    """What reduction ``kind`` (a sum: sum, l1, l2, sum_square, log_sum) adds up: ``|x|``, ``x * x`` or ``x``."""
    return np.abs(x) if kind == "l1" else x * x if kind in ("l2", "sum_square") else x


def _from_sum(total: np.ndarray, kind: str) -> np.ndarray:
    """Reduction ``kind`` from its sum (float64): the square root (l2), the log (log_sum), else the sum."""
    return np.sqrt(total) if kind == "l2" else _logs(total) if kind == "log_sum" else total


def qreduce(x: np.ndarray, kind: str, axis: int, scale: float, out_scale: float, epsilon: float = 0.0) -> np.ndarray:
    """int8 :func:`reduce_rows` of the int8 ``x`` (of ``scale``): sums of ``|x|``, ``x`` and ``x * x`` exact in
    int64, the rest in float64 (``inv_std``: the variance's numerator ``n * sum(x * x) - sum(x) ** 2`` exact in
    int64); ``clip(rint(. / out_scale))``, an infinite value (``log`` of 0) clipped, NaN (``log`` of a negative sum)
    0. The same bits on every machine."""
    xi = np.asarray(x, np.int64)
    n = xi.shape[axis]
    if kind == "mean":
        y = xi.sum(axis=axis, keepdims=True).astype(np.float64) * scale / n
    elif kind == "inv_std":
        numerator = n * (xi * xi).sum(axis=axis, keepdims=True) - np.square(xi.sum(axis=axis, keepdims=True))
        y = 1.0 / np.sqrt(numerator.astype(np.float64) * (scale * scale / (n * n)) + epsilon)
    elif kind in ("min", "log_sum_exp"):
        y = reduce_rows(xi.astype(np.float64) * scale, kind, axis)
    else:                                # the exact sum in int64, then scaled (a sum of squares: twice)
        total = _summand(xi, kind).sum(axis=axis, keepdims=True).astype(np.float64)
        y = np.sqrt(total) * scale if kind == "l2" else \
            _from_sum(total * (scale * scale if kind == "sum_square" else scale), kind)
    q = np.nan_to_num(y / out_scale, nan=0.0, posinf=127.0, neginf=-128.0)
    return np.clip(np.rint(q), -128, 127).astype(np.int8)


def log_softmax(x: np.ndarray, axis: int, scale: float = 1.0) -> np.ndarray:
    """Float ``z - log(sum(exp(z), axis))`` of ``z = x * scale`` in float64 (:func:`log_sum_exp`)."""
    z = np.asarray(x, np.float64) * scale
    return z - log_sum_exp(z, axis)


def qlog_softmax(x: np.ndarray, axis: int, scale: float, out_scale: float) -> np.ndarray:
    """int8 :func:`log_softmax` of the int8 ``x`` (of ``scale``): ``clip(rint(. / out_scale))``; the same bits on every
    machine."""
    return np.clip(np.rint(log_softmax(x, axis, scale) / out_scale), -128, 127).astype(np.int8)


def _cumulative(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """ONNX CumSum of ``x`` (an integer or float64 array) along ``axis``: running sums, from the end with
    ``reverse``, each without its own element with ``exclusive``."""
    v = np.flip(x, axis) if reverse else x
    total = np.cumsum(v, axis=axis)
    if exclusive:
        total = total - v
    return np.flip(total, axis) if reverse else total


def cumsum(x: np.ndarray, axis: int, exclusive: bool = False, reverse: bool = False) -> np.ndarray:
    """Float ONNX CumSum of ``x`` along ``axis`` (float64 sums)."""
    return _cumulative(np.asarray(x, np.float64), axis, exclusive, reverse)


def qcumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool, scale: float, out_scale: float) -> np.ndarray:
    """int8 :func:`cumsum` of the int8 ``x`` (of ``scale``): the running sums exact in int64, then
    ``clip(rint(sum * scale / out_scale))``; the same bits on every machine."""
    total = _cumulative(np.asarray(x, np.int64), axis, exclusive, reverse).astype(np.float64)
    return np.clip(np.rint(total * scale / out_scale), -128, 127).astype(np.int8)


GRID_MODES = ("linear", "nearest")
"""The interpolations ``GridSample`` takes (ONNX's ``bilinear`` of opsets 16-19 is ``linear``); ``cubic`` is refused."""

GRID_PADDINGS = ("zeros", "border", "reflection")


def _grid_coords(g: np.ndarray, size: int, align_corners: bool, padding: str, nearest: bool) -> np.ndarray:
    """Normalized grid coordinates ``g`` (-1..1) as pixel coordinates along an axis of ``size`` (float64), with
    ``border`` clamped and ``reflection`` reflected into the axis, in ONNX's order (``nearest``: rounded to the
    nearest integer, halves to even, first)."""
    x = (g + 1.0) / 2.0 * (size - 1) if align_corners else ((g + 1.0) * size - 1.0) / 2.0
    if nearest:
        x = np.rint(x)
    if padding == "border":
        return np.clip(x, 0, size - 1)
    if padding == "reflection":
        low, high = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        span = high - low
        if span <= 0:
            return np.zeros_like(x)
        outside = (x < low) | (x > high)
        distance = np.where(x < low, low - x, x - high)
        flips = np.floor(distance / span)
        extra = distance - flips * span
        back = np.where(x < low, np.where(flips % 2 == 0, low + extra, high - extra),
                        np.where(flips % 2 == 0, high - extra, low + extra))
        x = np.where(outside, back, x)
        return np.clip(x, 0, size - 1) if not nearest else np.clip(np.trunc(x), 0, size - 1)
    return x


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, padding: str, align_corners: bool) -> np.ndarray:
    """ONNX's GridSample of ``x [N, C, *spatial]`` (2-D or 3-D) at ``grid [N, *out, k]`` (normalized coordinates in
    -1..1, the last axis first: ``(x, y)`` or ``(x, y, z)``) in float64: ``[N, C, *out]``. ``mode`` of
    :data:`GRID_MODES` (``linear``: bilinear or trilinear), ``padding`` of :data:`GRID_PADDINGS` (``zeros``: a tap
    outside the input reads 0)."""
    x = np.asarray(x, np.float64)
    grid = np.asarray(grid, np.float64)
    n, sizes = x.shape[0], x.shape[2:]
    rank = len(sizes)
    coords = [_grid_coords(grid[..., rank - 1 - axis], size, align_corners, padding, mode == "nearest")
              for axis, size in enumerate(sizes)]                       # per spatial axis, [N, *out]
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))

    def tap(index: list[np.ndarray]) -> np.ndarray:
        """``x`` at the integer positions ``index`` (one ``[N, *out]`` per spatial axis) for every channel: ``[N, C,
        *out]``, 0 outside the input."""
        inside = np.ones(index[0].shape, bool)
        for i, size in zip(index, sizes):
            inside &= (i >= 0) & (i < size)
        got = x[(batch, slice(None), *(np.clip(i, 0, size - 1) for i, size in zip(index, sizes)))]   # [N, *out, C]
        return np.moveaxis(np.where(inside[..., None], got, 0.0), -1, 1)

    if mode == "nearest":
        return tap([c.astype(np.int64) for c in coords])
    low = [np.floor(c) for c in coords]
    frac = [(c - f)[:, None] for c, f in zip(coords, low)]
    low = [f.astype(np.int64) for f in low]
    out = np.zeros((n, x.shape[1], *grid.shape[1:-1]))
    for corner in range(2 ** rank):                 # every corner of the cell, weighted by its opposite volume
        bits = [(corner >> axis) & 1 for axis in range(rank)]
        weight = np.ones_like(frac[0])
        for b, f in zip(bits, frac):
            weight = weight * (f if b else 1 - f)
        out += weight * tap([f + b for f, b in zip(low, bits)])
    return out


def qgrid_sample(q: np.ndarray, q_grid: np.ndarray, mode: str, padding: str, align_corners: bool, scale: float,
                 grid_scale: float, out_scale: float) -> np.ndarray:
    """GridSample of the int8 ``q`` (at ``scale``) at the int8 grid ``q_grid`` (at ``grid_scale``; or a float32
    constant grid at scale 1): float64 from those values, then rounded once to ``out_scale`` (int8)."""
    y = grid_sample(np.asarray(q, np.float64) * scale, np.asarray(q_grid, np.float64) * grid_scale, mode, padding,
                    align_corners)
    return np.clip(np.rint(y / out_scale), -128, 127).astype(np.int8)
