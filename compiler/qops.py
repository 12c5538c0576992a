"""The bit-exact integer reference of the quantized graph (numpy): the spec every backend must equal.

Every function takes and returns numpy arrays in NCHW (or ``[N, K]``) layout. int8 activations have zero point 0.
Integer semantics (the quantized operator contract, see :mod:`.ir`):

* :func:`conv2d_acc` / :func:`dense_acc`: exact int32 accumulators ``conv(x, w) + bias`` with 32-bit wrap-around.
* :func:`requantize`: ``clip((acc * M[o]) >> S[o], lo, hi)`` per output channel; ``*`` wraps to 32 bits, ``>>`` is
  arithmetic.
* :func:`qadd`: ``clip((a * Ma + b * Mb) >> S, lo, hi)``.
* Ops that only run on the CPU, defined here:

  - ``QMul`` / ``QConcat`` rescale with rounding: ``clip((x * M + r) >> S, -128, 127)``, ``r = 2**(S-1)`` if
    ``S > 0`` else 0, ``M`` may be negative (QMul) and broadcasts with numpy rules.
  - ``MaxPool`` pads with -128. ``AvgPool``/``GlobalAvgPool``: ``floor((2 * sum + count) / (2 * count))`` (round
    half up), ``count`` = window elements inside the input (all of them when ``count_include_pad``).
  - ``QLut``: ``table[x + 128]``, a 256-entry int8 table the quantizer computes from the input and output scales
    (Sigmoid, HardSigmoid, HardSwish: any function of one int8 value is exact this way).
  - ``QGelu``: I-BERT's integer-only GELU (:func:`igelu`), every step an operation of VTA's tensor ALU on int32
    lanes (the accelerator runs it as an ALU-only layer); its integer constants come from :func:`igelu_params`.
  - ``QILayerNorm``: I-BERT's integer-only LayerNorm over the last axis (:func:`ilayernorm`, defined in
    :mod:`.qops_layernorm`), every step an ALU operation with the ``lane_reduce`` knob; constants from
    :func:`ilayernorm_params`.
  - ``QISoftmax``: I-BERT's integer-only softmax over the last axis, without masks (:func:`isoftmax`, defined in
    :mod:`.qops_softmax`), every step an ALU operation with the ``lane_reduce`` knob; constants from
    :func:`isoftmax_params`.
  - ``Transpose``: numpy's transpose. ``Resize`` (output scale = input scale): ``nearest`` picks the source element
    of :func:`resize_source`'s coordinate rounded by ``nearest_mode``; ``linear`` interpolates between the two
    neighbours of each resized axis in turn with weights ``w1 = rint(frac * 2**8)``, ``w0 = 2**8 - w1`` in int64,
    and rounds once at the end: ``(acc + 2**(T-1)) >> T``, ``T = 8`` times the axes interpolated. Neighbours outside
    the input repeat its edge (ONNX's rule).
  - ``Quantize``: ``clip(rint(float64(x) / scale), -128, 127)`` (rint rounds half to even). ``Dequantize``:
    ``float32(float64(x) * scale)``. ``Softmax``: float32 of a float64 softmax of ``x * scale``.
  - Transformer operators (float64 from the int8 input, then requantized; every step an IEEE basic operation or
    the C library's ``exp`` one element at a time, so the result is the same bits on every machine):
    ``QMatMul`` is ``clip((acc * M + r) >> S, -128, 127)`` with ``acc = a @ b`` exact in int64 (numpy broadcasting
    of the leading axes; the quantizer keeps ``acc * M + r`` inside int32), ``r = 2**(S-1)`` (0 when S == 0); a
    pre-quantized model's may carry ``zero_points`` (:func:`qmatmul`; the CPU runs those).
    ``QSoftmax`` is ``clip(rint(p / out_scale), -128, 127)`` of :func:`softmax`'s ``p`` (``Softmax`` returns ``p``
    as float32); both take an optional additive mask ``bias`` and a ``keep``/``fill`` mask (a causal mask, fused
    into the softmax by the quantizer so that the mask's -inf or -10000 never meets an int8 scale).
    ``QLayerNorm``: :func:`layer_norm` (``LayerNorm``, at a pre-quantized model's float output: its float32 value
    before the rounding). ``QRMSNorm`` and ``QMulAct`` (RMSNorm; the product of two activations):
    :mod:`.qops_gated`. ``Gather``, ``Slice`` and ``Where`` select int8 values (``Where``'s fill is
    an int8); ``Embedding`` selects the rows ``ids`` (an int64 graph input) of its int8 table.
  - With a zero point ``z`` (pre-quantized models, :mod:`.frontend.prequant`): ``QuantizeZp`` is
    ``clip(rint(float64(x) / scale) + z, -128, 127)``, ``DequantizeZp`` ``float32(float64(x - z) * scale)``, and
    ``QAffine`` ``clip((sum_i x_i * M_i + offset) >> S, lo, hi)`` in int64 (no wrap-around; inputs of one shape,
    rounding and zero points folded into ``offset``): a rescale (one input) or an add (two).

:func:`run_reference` executes a whole quantized graph and is what backends are checked against.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .ir import AddRequant, Graph, GraphError, Node, Requant
from .qops_gated import PRODUCT_BOUND, qmul_act, rms_norm
from .qops_index import (
    pick_chosen,
    reference_evaluator,
    run_index_fn,
    run_input_fn,
    run_region,
    take_along,
    top_k_one_hot,
)
from .qops_layernorm import ILAYERNORM_ATTRS, NEWTON_STEPS, RSQRT_GUESS, ilayernorm, ilayernorm_params, ilayernorm_trace
from .qops_pool import (
    GRID_PADDINGS,
    REDUCE_KINDS,
    cumsum,
    exact_exp,
    gain_l2_scale,
    grid_sample,
    grn_scale,
    l2_normalize,
    log_softmax,
    log_sum_exp,
    mask_fn,
    mask_pool,
    pool_terms,
    qcumsum,
    qgain_l2_scale,
    qgrid_sample,
    qgrn_scale,
    ql2_normalize,
    qlog_softmax,
    qmask_pool,
    qreduce,
    qsum_normalize,
    reduce_rows,
    sum_normalize,
)
from .qops_softmax import (
    EXP_POLY,
    ISOFTMAX_ATTRS,
    RECIP_GUESS,
    RECIP_NEWTON_STEPS,
    isoftmax,
    isoftmax_params,
    isoftmax_trace,
)

__all__ = [
    "wrap32", "conv2d_acc", "dense_acc", "requantize", "qconv2d", "qdense", "qadd", "rescale", "qconcat",
    "maxpool", "avgpool", "global_avgpool", "pad", "quantize", "dequantize", "softmax", "QOPS", "run_reference",
    "lut", "resize", "resize_source", "resize_taps", "resize_cubic_weights", "resize_cubic_int_weights", "gather_at",
    "RESIZE_WEIGHT_BITS", "quantize_zp", "dequantize_zp", "qaffine",
    "qsoftmax", "qmatmul", "layer_norm", "layer_norm_real", "rms_norm", "qmul_act", "PRODUCT_BOUND", "run_index_fn",
    "run_input_fn", "mask_pool",
    "pool_terms", "mask_fn", "qmask_pool", "take_along", "l2_normalize", "ql2_normalize", "reference_evaluator",
    "embed", "sink_softmax", "top_k_one_hot", "run_region", "grn_scale", "qgrn_scale", "pick_chosen",
    "gain_l2_scale", "qgain_l2_scale",
    "sum_normalize", "qsum_normalize", "log_sum_exp", "REDUCE_KINDS", "reduce_rows", "exact_exp",
    "qreduce", "log_softmax", "qlog_softmax", "cumsum", "qcumsum",
    "key_mask", "KEY_MASK_ATTRS", "softmax_key", "softmax_sink", "qmasked_log_sum_exp", "slice_take", "IGELU_A",
    "IGELU_B", "IGELU_ATTRS",
    "igelu_params",
    "igelu_trace", "igelu", "ISOFTMAX_ATTRS", "isoftmax_params", "isoftmax_trace", "isoftmax", "EXP_POLY",
    "RECIP_GUESS", "RECIP_NEWTON_STEPS", "ILAYERNORM_ATTRS", "ilayernorm_params", "ilayernorm_trace", "ilayernorm",
    "NEWTON_STEPS", "RSQRT_GUESS", "grid_sample", "qgrid_sample", "GRID_PADDINGS",
]


def wrap32(x: np.ndarray) -> np.ndarray:
    """Wrap integers to signed 32 bits (two's complement), returning int32."""
    return np.asarray(x).astype(np.int64).astype(np.int32)


def _windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Sliding windows of an already padded NCHW array: ``[N, C, OH, OW, KH, KW]`` (a view)."""
    view = np.lib.stride_tricks.sliding_window_view(x, tuple(kernel), axis=(2, 3))
    return view[:, :, ::strides[0], ::strides[1]]


def _pad_hw(x: np.ndarray, pads: Sequence[int], value: int | float) -> np.ndarray:
    top, left, bottom, right = (int(p) for p in pads)
    if not (top or left or bottom or right):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def conv2d_acc(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: Sequence[int] = (1, 1),
               pads: Sequence[int] = (0, 0, 0, 0), groups: int = 1) -> np.ndarray:
    """int32 accumulator of a grouped 2D convolution: ``x [N,C,H,W]``, ``w [O, C/groups, KH, KW]``, ``bias [O]``.

    Returns ``[N, O, OH, OW]`` int32, wrapped to 32 bits. Products are summed exactly (float64 sums of int8 products
    are exact below 2**53, far above any reachable reduction length).
    """
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    if c != cg * groups or o % groups:
        raise ValueError(f"Convolution of {c} input channels with weights {w.shape} and groups={groups} is "
                         f"inconsistent: need C == C/groups * groups and O divisible by groups.")
    if cg == 1 and o == groups:
        return _depthwise_acc(x, w, bias, strides, pads)
    xp = _pad_hw(x.astype(np.float64), pads, 0.0)
    win = _windows(xp, (kh, kw), tuple(strides))                      # N, C, OH, OW, KH, KW
    oh, ow = win.shape[2], win.shape[3]
    og = o // groups
    win = win.reshape(n, groups, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    cols = win.reshape(groups, n * oh * ow, cg * kh * kw)             # G, N*OH*OW, Cg*KH*KW
    wmat = w.astype(np.float64).reshape(groups, og, cg * kh * kw).transpose(0, 2, 1)
    out = np.matmul(cols, wmat)                                       # G, N*OH*OW, Og
    out = out.reshape(groups, n, oh, ow, og).transpose(1, 0, 4, 2, 3).reshape(n, o, oh, ow)
    acc = out.astype(np.int64)
    if bias is not None:
        acc = acc + bias.astype(np.int64).reshape(1, o, 1, 1)
    return wrap32(acc)


def _depthwise_acc(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: Sequence[int],
                   pads: Sequence[int]) -> np.ndarray:
    """:func:`conv2d_acc` of a depthwise convolution (``w [C, 1, KH, KW]``, ``groups == C``): one multiply-add of
    a strided view of the padded input per kernel tap, the same exact sums as the matrix product without its
    ``KH * KW``-fold copy of the input. int8 operands accumulate in int32 (``KH * KW * 2**14`` stays below
    ``2**31`` for any kernel under 2**17 taps), wider ones in int64."""
    c, _, kh, kw = w.shape
    narrow = x.dtype.itemsize == 1 and w.dtype.itemsize == 1 and kh * kw < 2**15
    dtype = np.int32 if narrow else np.int64
    xp = _pad_hw(x.astype(dtype), pads, 0)
    sh, sw = int(strides[0]), int(strides[1])
    oh, ow = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    taps = w.astype(dtype).reshape(c, kh, kw)
    acc = np.zeros((x.shape[0], c, oh, ow), dtype)
    for i in range(kh):
        for j in range(kw):
            window = xp[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]
            acc += window * taps[:, i, j].reshape(1, c, 1, 1)
    total = acc.astype(np.int64)
    if bias is not None:
        total = total + bias.astype(np.int64).reshape(1, c, 1, 1)
    return wrap32(total)


def dense_acc(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """int32 accumulator ``x @ w.T + bias`` for ``x [N, K]``, ``w [O, K]``, ``bias [O]``, wrapped to 32 bits."""
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"Dense input has {x.shape[1]} features but weights {w.shape} expect {w.shape[1]}.")
    acc = (x.astype(np.float64) @ w.astype(np.float64).T).astype(np.int64)
    if bias is not None:
        acc = acc + bias.astype(np.int64)[None, :]
    return wrap32(acc)


def requantize(acc: np.ndarray, requant: Requant, axis: int = 1) -> np.ndarray:
    """``clip((acc * M[o]) >> S[o], lo, hi)`` as int8, channel ``o`` along ``axis`` of ``acc`` (int32)."""
    shape = [1] * acc.ndim
    shape[axis] = requant.channels
    m = requant.multiplier.reshape(shape)
    s = requant.shift.reshape(shape)
    prod = wrap32(acc.astype(np.int64) * m)
    shifted = np.right_shift(prod, s.astype(np.int32))
    return np.clip(shifted, requant.lo, requant.hi).astype(np.int8)


def qconv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray, requant: Requant, strides: Sequence[int] = (1, 1),
            pads: Sequence[int] = (0, 0, 0, 0), groups: int = 1) -> np.ndarray:
    """Quantized convolution: int8 ``[N, O, OH, OW]``."""
    return requantize(conv2d_acc(x, w, bias, strides, pads, groups), requant, axis=1)


def qdense(x: np.ndarray, w: np.ndarray, bias: np.ndarray, requant: Requant) -> np.ndarray:
    """Quantized dense layer: int8 ``[N, O]``."""
    return requantize(dense_acc(x, w, bias), requant, axis=1)


def qadd(a: np.ndarray, b: np.ndarray, requant: AddRequant) -> np.ndarray:
    """Quantized add of two same-shape int8 tensors: ``clip((a*Ma + b*Mb) >> S, lo, hi)``."""
    if a.shape != b.shape:
        raise ValueError(f"QAdd operands have shapes {a.shape} and {b.shape}; they must be equal.")
    total = wrap32(a.astype(np.int64) * requant.ma + b.astype(np.int64) * requant.mb)
    return np.clip(np.right_shift(total, requant.shift), requant.lo, requant.hi).astype(np.int8)


def rescale(x: np.ndarray, multiplier: np.ndarray | int, shift: int) -> np.ndarray:
    """``clip((x * M + r) >> S, -128, 127)`` with rounding ``r = 2**(S-1)`` (0 when S == 0); int64 arithmetic."""
    rnd = (1 << (shift - 1)) if shift > 0 else 0
    val = (x.astype(np.int64) * np.asarray(multiplier, dtype=np.int64) + rnd) >> shift
    return np.clip(val, -128, 127).astype(np.int8)


def qconcat(xs: Sequence[np.ndarray], axis: int, multipliers: Sequence[int], shifts: Sequence[int]) -> np.ndarray:
    """Concatenate int8 tensors along ``axis`` after rescaling each to the output scale."""
    return np.concatenate([rescale(x, m, s) for x, m, s in zip(xs, multipliers, shifts)], axis=axis)


def maxpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int]) -> np.ndarray:
    """int8 max pooling over NCHW; padding never wins (pads hold -128)."""
    win = _windows(_pad_hw(x, pads, -128), tuple(kernel), tuple(strides))
    return win.max(axis=(4, 5)).astype(np.int8)


def _round_div(total: np.ndarray, count: np.ndarray | int) -> np.ndarray:
    return np.floor_divide(2 * total + count, 2 * np.asarray(count, dtype=np.int64))


def avgpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
            count_include_pad: bool = False) -> np.ndarray:
    """int8 average pooling: window sum divided by the window count, rounded half up."""
    win = _windows(_pad_hw(x.astype(np.int64), pads, 0), tuple(kernel), tuple(strides))
    total = win.sum(axis=(4, 5))
    if count_include_pad:
        count: np.ndarray | int = int(kernel[0] * kernel[1])
    else:
        ones = np.ones((1, 1) + x.shape[2:], dtype=np.int64)
        count = _windows(_pad_hw(ones, pads, 0), tuple(kernel), tuple(strides)).sum(axis=(4, 5))
    return np.clip(_round_div(total, count), -128, 127).astype(np.int8)


def global_avgpool(x: np.ndarray) -> np.ndarray:
    """int8 global average pooling ``[N, C, H, W] -> [N, C, 1, 1]``, rounded half up."""
    total = x.astype(np.int64).sum(axis=(2, 3), keepdims=True)
    return np.clip(_round_div(total, x.shape[2] * x.shape[3]), -128, 127).astype(np.int8)


def pad(x: np.ndarray, pads: Sequence[int], value: int | float = 0) -> np.ndarray:
    """Constant padding with ONNX-ordered ``pads`` (begins of every axis, then ends)."""
    rank = x.ndim
    if len(pads) != 2 * rank:
        raise ValueError(f"Pad needs {2 * rank} pad values for a rank-{rank} tensor, got {len(pads)}.")
    widths = [(int(pads[i]), int(pads[i + rank])) for i in range(rank)]
    return np.pad(x, widths, constant_values=np.asarray(value).astype(x.dtype))


def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """float -> int8: ``clip(rint(float64(x) / scale), -128, 127)``."""
    return np.clip(np.rint(np.asarray(x, dtype=np.float64) / scale), -128, 127).astype(np.int8)


def dequantize(x: np.ndarray, scale: float) -> np.ndarray:
    """int -> float32: ``float32(float64(x) * scale)``."""
    return (x.astype(np.float64) * scale).astype(np.float32)


def quantize_zp(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """float -> int8 with a zero point: ``clip(rint(float64(x) / scale) + zero_point, -128, 127)``."""
    return np.clip(np.rint(np.asarray(x, dtype=np.float64) / scale) + zero_point, -128, 127).astype(np.int8)


def dequantize_zp(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """int8 with a zero point -> float32: ``float32(float64(x - zero_point) * scale)``."""
    return ((x.astype(np.int64) - zero_point).astype(np.float64) * scale).astype(np.float32)


def qaffine(xs: Sequence[np.ndarray], multipliers: Sequence[int], offset: int, shift: int, lo: int = -128,
            hi: int = 127) -> np.ndarray:
    """``clip((sum_i x_i * M_i + offset) >> shift, lo, hi)`` as int8, in int64 (same-shape int8 inputs)."""
    if len(xs) != len(multipliers) or any(x.shape != xs[0].shape for x in xs):
        raise ValueError(f"QAffine takes one multiplier per input and inputs of one shape, not {len(multipliers)} "
                         f"multipliers for inputs of shapes {[x.shape for x in xs]}.")
    total = np.full(xs[0].shape, int(offset), np.int64)
    for x, m in zip(xs, multipliers):
        total += x.astype(np.int64) * int(m)
    return np.clip(total >> int(shift), lo, hi).astype(np.int8)


KEY_MASK_ATTRS = ("expand", "sel", "add", "fill", "additive")
"""A runtime mask's attributes (a ``KeyMask`` node's; a Softmax's with the prefix ``key_``): see :func:`key_mask`."""


def key_mask(x: np.ndarray, mask: np.ndarray, expand: Sequence[int], sel: np.ndarray, add: np.ndarray,
             fill: np.ndarray, additive: bool = False) -> np.ndarray:
    """A runtime attention mask applied to scores ``x`` (float, computed in x's dtype). A 0/1 mask: ``where(m, A1,
    A0)`` with ``m = mask.reshape(expand) != 0`` and, for mask value ``v``, ``Av = where(sel[v], x + add[v],
    fill[v])`` (``sel``, ``add``, ``fill`` each ``[2, ...]`` broadcasting against ``x``;
    :class:`.frontend.masks.KeyMask`). ``additive``: a float term given at run time, ``x + mask.reshape(expand)``
    (its -inf entries mask out; ``sel``, ``add`` and ``fill`` unused)."""
    if additive:
        return x + np.asarray(mask, x.dtype).reshape(tuple(int(e) for e in expand))
    m = np.asarray(mask).reshape(tuple(int(e) for e in expand)) != 0
    sides = [np.where(np.asarray(sel[v], bool), x + np.asarray(add[v], x.dtype), np.asarray(fill[v], x.dtype))
             for v in (0, 1)]
    return np.where(m, sides[1], sides[0])


def softmax(x: np.ndarray, scale: float, axis: int = -1, bias: np.ndarray | None = None,
            keep: np.ndarray | None = None, fill: float = 0.0, key: Mapping[str, Any] | None = None,
            sink: np.ndarray | None = None) -> np.ndarray:
    """float32 softmax of the dequantized int8 input along ``axis`` (computed in float64).

    With masks, the softmax is of ``z = where(keep, x * scale + bias, fill)`` (``bias`` float and ``keep`` bool,
    each broadcast against ``x``), then of the runtime mask ``key`` when given (``{"mask": values, "expand": ...,
    "sel": ..., "add": ..., "fill": ...}``, :func:`key_mask`), and ``exp`` is the C library's, element by element
    (:func:`exact_exp`); without, numpy's ``exp`` as before. ``sink`` (float, ``[..., w]`` broadcast against the
    rows; the last axis only): logits of ``w`` more columns the denominator counts and the output drops (attention
    sinks)."""
    z = x.astype(np.float64) * scale
    if bias is None and keep is None and key is None and sink is None:
        z = np.exp(z - z.max(axis=axis, keepdims=True))
        return (z / z.sum(axis=axis, keepdims=True)).astype(np.float32)
    return _masked_softmax(z, axis, bias, keep, fill, key, sink).astype(np.float32)


def _masked_logits(z: np.ndarray, bias: np.ndarray | None, keep: np.ndarray | None, fill: float,
                   key: Mapping[str, Any] | None) -> np.ndarray:
    """float64 ``where(keep, z + bias, fill)``, then the runtime mask ``key`` (:func:`key_mask`)."""
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    if keep is not None:
        z = np.where(np.asarray(keep, bool), z, float(fill))
    if key is not None:
        z = key_mask(z, key["mask"], *(key[k] for k in KEY_MASK_ATTRS))
    return z


def qmasked_log_sum_exp(x: np.ndarray, scale: float, out_scale: float, axis: int, bias: np.ndarray | None,
                        keep: np.ndarray | None, fill: float, key: Mapping[str, Any] | None) -> np.ndarray:
    """int8 ``log(sum(exp(z)))`` along ``axis`` (kept) of the masked logits ``z`` of the int8 ``x`` (of ``scale``),
    the masks as :func:`softmax` applies them (Granite's sliding-window attention reads its masked scores in a
    Softmax and in this); ``clip(rint(. / out_scale))``, a row masked out whole -128."""
    y = log_sum_exp(_masked_logits(np.asarray(x, np.float64) * scale, bias, keep, fill, key), axis)
    q = np.nan_to_num(y / out_scale, nan=0.0, posinf=127.0, neginf=-128.0)
    return np.clip(np.rint(q), -128, 127).astype(np.int8)


def _masked_softmax(z: np.ndarray, axis: int, bias: np.ndarray | None, keep: np.ndarray | None,
                    fill: float, key: Mapping[str, Any] | None = None, sink: np.ndarray | None = None) -> np.ndarray:
    """float64 softmax of ``where(keep, z + bias, fill)``, then the runtime mask ``key``, along ``axis`` with
    :func:`exact_exp`, the ``sink`` columns (if any) counted in the denominator only; a row whose every value is
    -inf is 0 (not NaN)."""
    z = _masked_logits(z, bias, keep, fill, key)
    if sink is not None:
        return sink_softmax(z, sink, exact_exp)
    top = z.max(axis=axis, keepdims=True)
    dead = np.isneginf(top)                       # a row masked out whole by -inf fills: 0, as exporters' NaN guard
    e = exact_exp(z - np.where(dead, 0.0, top))
    return e / np.where(dead, 1.0, e.sum(axis=axis, keepdims=True))


def sink_softmax(z: np.ndarray, sink: np.ndarray, exp: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """float64 ``softmax(concat(z, sink), -1)[..., :n]`` (``n`` z's last axis, ``sink [..., w]`` broadcast against
    the rows): the softmax of the last axis with ``w`` more logits that only the denominator counts (GPT-OSS's
    attention sinks), ``exp`` the caller's (the same bits on every machine)."""
    z = np.asarray(z, np.float64)
    s = np.broadcast_to(np.asarray(sink, np.float64), z.shape[:-1] + (np.shape(sink)[-1],))
    top = np.maximum(z.max(axis=-1, keepdims=True), s.max(axis=-1, keepdims=True))
    top = np.where(np.isneginf(top), 0.0, top)
    e, es = exp(z - top), exp(s - top)
    total = e.sum(axis=-1, keepdims=True) + es.sum(axis=-1, keepdims=True)
    return e / np.where(total > 0, total, 1.0)


def qsoftmax(x: np.ndarray, scale: float, out_scale: float, axis: int = -1, bias: np.ndarray | None = None,
             keep: np.ndarray | None = None, fill: float = 0.0, key: Mapping[str, Any] | None = None,
             sink: np.ndarray | None = None) -> np.ndarray:
    """int8 softmax: ``clip(rint(p / out_scale), -128, 127)``, ``p`` the float64 softmax of the dequantized input
    with its masks and sink columns (:func:`softmax`), always with the C library's ``exp``."""
    p = _masked_softmax(x.astype(np.float64) * scale, axis, bias, keep, fill, key, sink)
    return np.clip(np.rint(p / out_scale), -128, 127).astype(np.int8)


def softmax_key(node: Node, values: Sequence[np.ndarray]) -> dict[str, Any] | None:
    """The runtime mask of a Softmax/QSoftmax node (its input 1 and ``key_*`` attributes) for :func:`softmax`, or
    None without one."""
    if len(values) < 2 or f"key_{KEY_MASK_ATTRS[0]}" not in node.attrs:
        return None
    return {"mask": values[1], **{k: node.attrs[f"key_{k}"] for k in KEY_MASK_ATTRS}}


def softmax_sink(node: Node, values: Sequence[np.ndarray]) -> np.ndarray | None:
    """The sink logits of a Softmax/QSoftmax node for :func:`softmax`: its last input, int8 at ``sink_scale``, when
    computed from the activations (Inkling-2), else its ``sink`` attribute (constant sinks, GPT-OSS), else None."""
    if "sink_scale" in node.attrs:
        return np.asarray(values[-1], np.float64) * float(node.attrs["sink_scale"])
    return node.attrs.get("sink")


def embed(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``table[ids]`` (shape ``ids.shape + table.shape[1:]``), a negative id counting from the table's end as ONNX's
    Gather does (LayoutLM's box widths, ``x1 - x0``, index a table so); a ValueError naming the range when an id (a
    computed position id, say) falls outside ``[-rows, rows - 1]``. (Token ids given as inputs are checked to ``[0,
    rows - 1]`` before: :func:`.pipeline.check_inputs`.)"""
    idx = np.asarray(ids, np.int64)
    rows = table.shape[0]
    if idx.size and (idx.min() < -rows or idx.max() >= rows):
        raise ValueError(f"an embedding lookup got ids from {int(idx.min())} to {int(idx.max())}, outside its table's "
                         f"rows {-rows} to {rows - 1} (a negative id counts from the end)")
    return np.take(table, idx, axis=0)


def qmatmul(a: np.ndarray, b: np.ndarray, multiplier: int, shift: int,
            zero_points: Sequence[int] = (0, 0, 0)) -> np.ndarray:
    """int8 ``a [..., M, K] @ b [..., K, N]`` (numpy broadcasting) requantized: ``clip((acc * M + r) >> S)``,
    ``r = 2**(S-1)`` (0 when S == 0), ``acc`` exact, all in int64. ``zero_points`` ``(za, zb, zy)`` (a
    pre-quantized model's, :mod:`.frontend.prequant`): ``acc = (a - za) @ (b - zb)`` and
    ``clip(((acc * M + r) >> S) + zy)``."""
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"QMatMul operands have shapes {a.shape} and {b.shape}; a's last axis must equal b's "
                         f"second to last.")
    za, zb, zy = (int(z) for z in zero_points)
    acc = np.matmul(a.astype(np.int64) - za, b.astype(np.int64) - zb)
    if not zy:
        return rescale(acc, int(multiplier), int(shift))
    rnd = (1 << (int(shift) - 1)) if shift > 0 else 0
    return np.clip(((acc * int(multiplier) + rnd) >> int(shift)) + zy, -128, 127).astype(np.int8)


def qmatmul_wide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int8 ``a [..., M, K] @ b [..., K, N]`` (numpy broadcasting), exact, as int32 (``K * 128 * 128`` fits for any
    K below 131,072)."""
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"QMatMulWide operands have shapes {a.shape} and {b.shape}; a's last axis must equal b's "
                         f"second to last.")
    if a.shape[-1] >= 1 << 17:
        raise ValueError(f"QMatMulWide's depth {a.shape[-1]} could overflow int32 (below 131,072).")
    return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32)


def layer_norm(x: np.ndarray, scale: float, gamma: np.ndarray, beta: np.ndarray, out_scale: float, axis: int = -1,
               epsilon: float = 1e-5) -> np.ndarray:
    """int8 LayerNorm over the axes ``axis`` to the last, from the int8 input ``x`` of ``scale``.

    With ``D`` elements per row, ``s = sum(x)`` and ``q = sum(x*x)`` (exact int64), ``c = D*x - s`` and
    ``v = D*q - s*s`` (exact int64), in float64: ``n = c / sqrt(v + D*D * epsilon / scale**2)`` (the normalised
    value: scale cancels but for epsilon), ``y = n * gamma + beta``, and the result ``clip(rint(y / out_scale))``.
    Only IEEE basic operations and sqrt, in a fixed order: the same bits on every machine."""
    y = layer_norm_real(x, scale, gamma, beta, axis, epsilon)
    return np.clip(np.rint(y / out_scale), -128, 127).astype(np.int8)


def layer_norm_real(x: np.ndarray, scale: float, gamma: np.ndarray, beta: np.ndarray, axis: int = -1,
                    epsilon: float = 1e-5) -> np.ndarray:
    """:func:`layer_norm`'s ``y`` before its rounding, float64 (the ``LayerNorm`` op of a quantized graph returns it
    as float32: a pre-quantized model's float output)."""
    axis = axis % x.ndim
    axes = tuple(range(axis, x.ndim))
    d = int(np.prod(x.shape[axis:]))
    xi = x.astype(np.int64)
    total = xi.sum(axis=axes, keepdims=True)
    squares = (xi * xi).sum(axis=axes, keepdims=True)
    centred = (d * xi - total).astype(np.float64)
    var = (d * squares - total * total).astype(np.float64)
    y = centred / np.sqrt(var + float(d * d) * epsilon / (scale * scale))
    return y * np.asarray(gamma, np.float64) + np.asarray(beta, np.float64)


def slice_take(x: np.ndarray, axes: Sequence[int], indices: Sequence[Sequence[int]]) -> np.ndarray:
    """The elements at ``indices[k]`` along ``axes[k]`` for every k (ONNX Slice and Split, as index lists)."""
    for axis, idx in zip(axes, indices):
        x = np.take(x, np.asarray(idx, np.int64), axis=axis)
    return np.ascontiguousarray(x)


def lut(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """int8 table lookup ``table[x + 128]`` (``table``: 256 int8 values, for inputs -128 to 127)."""
    return np.asarray(table, np.int8)[x.astype(np.int64) + 128]


def lut2(a: np.ndarray, b: np.ndarray, table: np.ndarray) -> np.ndarray:
    """int8 lookup of a pair, ``table[a + 128, b + 128]`` (``table``: 256 x 256 int8 values, row ``a``, column
    ``b``), ``a`` and ``b`` broadcast against each other as numpy does: the output has their broadcast shape."""
    return np.asarray(table, np.int8).reshape(256, 256)[a.astype(np.int64) + 128, b.astype(np.int64) + 128]


IGELU_A, IGELU_B = -0.2888, -1.769
"""I-BERT's second-order fit of erf (Kim et al. 2021): ``L(x) = sgn(x) * (a * (min(|x|, -b) + b)**2 + 1)``."""
IGELU_ATTRS = ("qb", "f", "k1", "qc", "k2", "multiplier", "shift")
"""The integer constants of a ``QGelu`` node (:func:`igelu_params`), in the order :func:`igelu` takes them."""
_IMM = 32767  # the ALU's 16-bit signed immediate


def igelu_params(in_scale: float, out_scale: float) -> dict[str, int]:
    """The integer constants of :func:`igelu` for an int8 input of ``in_scale`` and an int8 output of ``out_scale``.

    With ``s' = in_scale / sqrt 2`` (erf's argument is ``x / sqrt 2``), ``|x|`` is taken in steps of ``s' / 2**f``,
    ``f = max(0, 15 - bitlen(floor(-b / s')))`` fraction bits, so that erf's clip point ``qb = floor(-b / s' *
    2**f)`` has 15 bits (or fewer when ``f`` is 0); ``k1 = max(0, bitlen(qb**2) - 14)`` keeps ``d*d >> k1`` below
    ``2**14``; ``S_L = a * (s' / 2**f)**2 * 2**k1`` is the scale of the polynomial and ``qc = rint(1 / S_L)`` its
    constant term, so that ``erf(|x| / sqrt 2) ~ S_L * ((d*d >> k1) + qc)`` with ``d = min(|q| * 2**f, qb) - qb``.
    ``k2`` brings the largest ``|t|`` over all 256 inputs (:func:`igelu_trace`) below ``2**15``;
    ``multiplier * 2**-shift`` is the rescale ``in_scale * S_L * 2**k2 / (2 * out_scale)`` (negative, as ``S_L``)
    with ``|multiplier| <= 32767`` and the largest ``shift <= 46`` that allows. Every constant fits the ALU's 16-bit
    immediate. Raises ValueError when ``floor(-b / s')`` falls outside [1, 32767] (an input scale above about 2.5 or
    below 7.7e-5, where the table must serve)."""
    if not (in_scale > 0 and out_scale > 0 and math.isfinite(in_scale) and math.isfinite(out_scale)):
        raise ValueError(f"the integer GELU needs positive finite scales, not in_scale={in_scale!r}, "
                         f"out_scale={out_scale!r}")
    sp = in_scale / math.sqrt(2.0)
    whole = int(math.floor(-IGELU_B / sp))
    if not 1 <= whole <= _IMM:
        raise ValueError(f"the integer GELU needs erf's clip point -b / s' = {-IGELU_B / sp:.4g} input steps in "
                         f"[1, {_IMM}] (input scale {in_scale:.4g}); use the table")
    f = max(0, 15 - whole.bit_length())
    qb = int(math.floor(-IGELU_B / sp * float(1 << f)))
    k1 = max(0, (qb * qb).bit_length() - 14)
    s_l = IGELU_A * (sp / float(1 << f)) ** 2 * float(1 << k1)
    qc = int(math.floor(1.0 / s_l + 0.5))
    params = {"qb": qb, "f": f, "k1": k1, "qc": qc, "k2": 0, "multiplier": 1, "shift": 0}
    t = igelu_trace(np.arange(-128, 128, dtype=np.int8), **params)["t"]
    k2 = max(0, int(np.abs(t).max()).bit_length() - 15)
    ratio = in_scale * s_l * float(1 << k2) / (2.0 * out_scale)
    shift = 46
    while shift > 0 and abs(ratio) * 2.0 ** shift > _IMM:
        shift -= 1
    multiplier = int(math.floor(ratio * 2.0 ** shift + 0.5))
    if abs(multiplier) > _IMM:
        raise ValueError(f"the integer GELU's rescale {ratio:.4g} is too large for a 16-bit multiplier (output "
                         f"scale {out_scale:.4g} against input scale {in_scale:.4g})")
    params.update(k2=k2, multiplier=multiplier, shift=shift)
    return params


def igelu_trace(x: np.ndarray, qb: int, f: int, k1: int, qc: int, k2: int, multiplier: int, shift: int
                ) -> dict[str, np.ndarray]:
    """Every intermediate of :func:`igelu` (int64 arrays of ``x``'s shape), in the order the ALU computes them:
    ``v = max(-q, q)``, ``vf = v * 2**f``, ``d = min(vf, qb) - qb``, ``dd = d * d``, ``l = (dd >> k1) + qc``,
    ``vl = v * l``, ``qq = q * qc``, ``t = qq + vl``, ``tk = t >> k2``, ``p = tk * multiplier``, then the rounding
    shift ``r`` (``(p + 2**(shift-1)) >> shift``, or for ``shift > 15`` ``((p >> (shift - 15)) + 2**14) >> 15``,
    the same value with every intermediate inside 2**31) and ``y = clip(r, -128, 127)``. ``>>`` is arithmetic."""
    q = np.asarray(x).astype(np.int64)
    out: dict[str, np.ndarray] = {"q": q}
    out["v"] = v = np.maximum(-q, q)
    out["vf"] = vf = v * (1 << f)
    out["d"] = d = np.minimum(vf, qb) - qb
    out["dd"] = dd = d * d
    out["l"] = lp = (dd >> k1) + qc
    out["vl"] = vl = v * lp
    out["qq"] = qq = q * qc
    out["t"] = t = qq + vl
    out["tk"] = tk = t >> k2
    out["p"] = p = tk * multiplier
    if shift > 15:
        out["p1"] = p1 = (p >> (shift - 15)) + (1 << 14)
        r = p1 >> 15
    elif shift > 0:
        out["p1"] = p1 = p + (1 << (shift - 1))
        r = p1 >> shift
    else:
        r = p
    out["r"] = r
    out["y"] = np.clip(r, -128, 127)
    return out


def igelu(x: np.ndarray, qb: int, f: int, k1: int, qc: int, k2: int, multiplier: int, shift: int) -> np.ndarray:
    """I-BERT's integer GELU of an int8 tensor as int8: ``GELU(x) = (x + |x| * erf(|x| / sqrt 2)) / 2`` with erf
    by the polynomial of :data:`IGELU_A`, :data:`IGELU_B`; the steps are :func:`igelu_trace`'s, each an ALU
    operation (MUL, MAX, MIN, ADD, SHR by immediates or a second lane). With :func:`igelu_params`' constants no
    intermediate leaves int32: ``|vf| <= 2**22``, ``|d| <= qb < 2**15`` so ``d*d < 2**30``, ``|l| < 2**15``,
    ``|v * l|, |q * qc| <= 2**22``, ``|t| < 2**23``, ``|tk| <= 2**15``, ``|p| < 2**30``."""
    return igelu_trace(x, qb, f, k1, qc, k2, multiplier, shift)["y"].astype(np.int8)


def resize_source(in_len: int, out_len: int, scale: float, mode: str) -> np.ndarray:
    """float64 source coordinate of each of the ``out_len`` output positions of one axis resized by ``scale``, by
    ONNX's coordinate transformation ``mode`` (as onnx.reference computes it, with ``scale * in_len`` as the output
    length where ONNX uses it)."""
    x = np.arange(out_len, dtype=np.float64)
    width = scale * in_len
    if mode == "asymmetric":
        return x / scale
    if mode == "align_corners":
        return np.zeros(out_len) if width == 1 else x * (in_len - 1) / (width - 1)
    if mode == "pytorch_half_pixel" and width == 1:
        return np.full(out_len, -0.5)
    if mode in ("half_pixel", "pytorch_half_pixel"):
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        return offset + (x + 0.5) / scale - 0.5
    raise ValueError(f"Resize coordinate transformation {mode!r} is not one the lab implements.")


def resize_taps(src: np.ndarray, in_len: int, mode: str, nearest_mode: str) -> tuple[np.ndarray, np.ndarray,
                                                                                       np.ndarray]:
    """(first index, second index, weight of the second in [0, 1)) per output position: ``linear`` takes the source
    elements left and right of ``src``, ``nearest`` one element (weight 0) by ``nearest_mode``; indices outside the
    input are clamped to its edge."""
    low = np.floor(src)
    frac = src - low
    if mode == "linear":
        return (np.clip(low, 0, in_len - 1).astype(np.int64), np.clip(low + 1, 0, in_len - 1).astype(np.int64), frac)
    up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5, "floor": np.zeros(src.shape, bool),
          "ceil": frac > 0}[nearest_mode]
    idx = np.clip(low + up, 0, in_len - 1).astype(np.int64)
    return idx, idx, np.zeros(src.shape)


def resize_cubic_weights(src: np.ndarray, in_len: int, cubic_coeff_a: float = -0.75,
                         exclude_outside: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """ONNX's cubic interpolation along one axis: (indices ``[4, out]``, float64 weights ``[4, out]``) of the source
    elements at ``floor(src) - 1 .. floor(src) + 2``, Keys' kernel with coefficient ``cubic_coeff_a``. Indices outside
    the input are clamped to its edge; with ``exclude_outside`` their weights are 0 and the rest renormalized."""
    low = np.floor(src)
    taps = low[None, :] + np.arange(-1, 3)[:, None]
    dist = np.abs(src[None, :] - taps)
    a = float(cubic_coeff_a)
    near = ((a + 2) * dist - (a + 3)) * dist * dist + 1
    far = ((a * dist - 5 * a) * dist + 8 * a) * dist - 4 * a
    weights = np.where(dist <= 1, near, np.where(dist < 2, far, 0.0))
    if exclude_outside:
        weights = np.where((taps < 0) | (taps > in_len - 1), 0.0, weights)
        weights = weights / weights.sum(axis=0, keepdims=True)
    return np.clip(taps, 0, in_len - 1).astype(np.int64), weights


def gather_at(x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    """``np.take(x, indices, axis)`` for indices computed at run time (negative ones counted from the end); a
    ValueError naming the range when one falls outside the axis (ONNX's Gather leaves that undefined)."""
    size = x.shape[axis]
    idx = np.asarray(indices, np.int64)
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise ValueError(f"a Gather's indices computed at run time reach {int(idx.min())}..{int(idx.max())}, "
                         f"outside the {size} entries of its axis")
    return np.ascontiguousarray(np.take(x, np.where(idx < 0, idx + size, idx), axis=axis))


RESIZE_WEIGHT_BITS = 8
"""Fractional bits of the integer linear- and cubic-interpolation weights of :func:`resize`."""


def resize_cubic_int_weights(weights: np.ndarray) -> np.ndarray:
    """Cubic weights ``[4, out]`` as integers of :data:`RESIZE_WEIGHT_BITS` fractional bits that sum to one exactly
    (the rounding's remainder goes to each position's largest weight), so a constant input stays constant."""
    one = 1 << RESIZE_WEIGHT_BITS
    w = np.rint(weights * one).astype(np.int64)
    top = np.argmax(weights, axis=0)
    w[top, np.arange(w.shape[1])] += one - w.sum(axis=0)
    return w


def resize(x: np.ndarray, mode: str, coordinate_transformation_mode: str, nearest_mode: str, scales: Sequence[float],
           sizes: Sequence[int], cubic_coeff_a: float = -0.75, exclude_outside: bool = False, multiplier: int = 1,
           shift: int = 0) -> np.ndarray:
    """int8 Resize (see the module docstring): ``sizes`` is the output shape, ``scales`` ONNX's factor per axis;
    ``cubic`` sums four taps by :func:`resize_cubic_int_weights` per axis. The int64 sum is rounded once at the end,
    after the weights' bits and a requantization to the output scale (``multiplier``, ``shift``: cubic's, whose
    overshoot leaves the input's range; 1 and 0 otherwise): ``(acc * M + r) >> (bits + shift)``."""
    acc = x.astype(np.int64)
    bits = 0
    one = 1 << RESIZE_WEIGHT_BITS
    for axis, (in_len, out_len, scale) in enumerate(zip(x.shape, sizes, scales)):
        if in_len == out_len and scale == 1.0:
            continue
        shape = [1] * acc.ndim
        shape[axis] = out_len
        if mode == "cubic":
            idx, weights = resize_cubic_weights(resize_source(in_len, out_len, scale, coordinate_transformation_mode),
                                                in_len, cubic_coeff_a, exclude_outside)
            w = resize_cubic_int_weights(weights)
            acc = sum(np.take(acc, idx[k], axis=axis) * w[k].reshape(shape) for k in range(4))
            bits += RESIZE_WEIGHT_BITS
            continue
        i0, i1, frac = resize_taps(resize_source(in_len, out_len, scale, coordinate_transformation_mode), in_len,
                                   mode, nearest_mode)
        w1 = np.rint(frac * one).astype(np.int64)
        if not w1.any():
            acc = np.take(acc, i0, axis=axis)
            continue
        acc = np.take(acc, i0, axis=axis) * (one - w1).reshape(shape) + np.take(acc, i1, axis=axis) * w1.reshape(shape)
        bits += RESIZE_WEIGHT_BITS
    total = bits + shift
    if total:
        acc = (acc * multiplier + (1 << (total - 1))) >> total
    return np.clip(acc, -128, 127).astype(np.int8)


# ---- the graph executor ------------------------------------------------------------------------------------------
OpFn = Callable[[Node, list[np.ndarray]], np.ndarray]


def qclip(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``clip(x, lo, hi)`` of an int8 tensor."""
    return np.clip(x, lo, hi).astype(np.int8)


def kernel_ops(k: Any) -> dict[str, OpFn]:
    """The ops that have kernels, bound to those of ``k`` (this module, or :mod:`.kernels.cpu`: each provides
    ``quantize``, ``dequantize``, ``qconv2d``, ``qdense``, ``qadd``, ``rescale``, ``qclip``, ``maxpool``,
    ``avgpool``, ``global_avgpool`` and ``lut`` with these functions' signatures): how a node's attributes become its
    kernel's arguments, written once for the reference and for the CPU path."""
    return {
        "Quantize": lambda n, v: k.quantize(v[0], n.attrs["scale"]),
        "Dequantize": lambda n, v: k.dequantize(v[0], n.attrs["scale"]),
        "QConv2d": lambda n, v: k.qconv2d(v[0], v[1], v[2], n.attrs["requant"], n.attrs["strides"], n.attrs["pads"],
                                          n.attrs["groups"]),
        "QDense": lambda n, v: k.qdense(v[0], v[1], v[2], n.attrs["requant"]),
        "QAdd": lambda n, v: k.qadd(v[0], v[1], n.attrs["requant"]),
        "QMul": lambda n, v: k.rescale(v[0], n.attrs["multiplier"], n.attrs["shift"]),
        "QConcat": lambda n, v: np.concatenate([k.rescale(x, m, s) for x, m, s in zip(
            v, n.attrs["multipliers"], n.attrs["shifts"])], axis=n.attrs["axis"]),
        "QClip": lambda n, v: k.qclip(v[0], n.attrs["lo"], n.attrs["hi"]),
        "MaxPool": lambda n, v: k.maxpool(v[0], n.attrs["kernel"], n.attrs["strides"], n.attrs["pads"]),
        "AvgPool": lambda n, v: k.avgpool(v[0], n.attrs["kernel"], n.attrs["strides"], n.attrs["pads"],
                                          n.attrs["count_include_pad"]),
        "GlobalAvgPool": lambda n, v: k.global_avgpool(v[0]),
        "QLut": lambda n, v: k.lut(v[0], n.attrs["table"]),
    }


QOPS: dict[str, OpFn] = {
    **kernel_ops(sys.modules[__name__]),
    "Reshape": lambda n, v: v[0].reshape(n.attrs["shape"]),
    "Pad": lambda n, v: pad(v[0], n.attrs["pads"], n.attrs["value"]),
    "Softmax": lambda n, v: softmax(v[0], n.attrs["scale"], n.attrs["axis"], n.attrs.get("bias"),
                                    n.attrs.get("keep"), n.attrs.get("fill", 0.0), softmax_key(n, v),
                                    softmax_sink(n, v)),
    "QSoftmax": lambda n, v: qsoftmax(v[0], n.attrs["scale"], n.attrs["out_scale"], n.attrs["axis"],
                                      n.attrs.get("bias"), n.attrs.get("keep"), n.attrs.get("fill", 0.0),
                                      softmax_key(n, v), softmax_sink(n, v)),
    "QMatMul": lambda n, v: qmatmul(v[0], v[1], n.attrs["multiplier"], n.attrs["shift"],
                                    n.attrs.get("zero_points", (0, 0, 0))),
    "QMatMulWide": lambda n, v: qmatmul_wide(v[0], v[1]),
    "QLut2": lambda n, v: lut2(v[0], v[1], n.attrs["table"]),
    "QGelu": lambda n, v: igelu(v[0], *(int(n.attrs[k]) for k in IGELU_ATTRS)),
    "QILayerNorm": lambda n, v: ilayernorm(v[0], *(n.attrs[k] for k in ILAYERNORM_ATTRS)),
    "QISoftmax": lambda n, v: isoftmax(v[0], *(n.attrs[k] for k in ISOFTMAX_ATTRS)),
    "QLayerNorm": lambda n, v: layer_norm(v[0], n.attrs["scale"], n.attrs["gamma"], n.attrs["beta"],
                                          n.attrs["out_scale"], n.attrs["axis"], n.attrs["epsilon"]),
    "QRMSNorm": lambda n, v: rms_norm(v[0], n.attrs["scale"], n.attrs["gamma"], n.attrs["out_scale"],
                                      n.attrs["axis"], n.attrs["epsilon"], n.attrs.get("in_zero_point", 0),
                                      n.attrs.get("zero_point", 0)),
    "QMulAct": lambda n, v: qmul_act(v[0], v[1], n.attrs["multiplier"], n.attrs["shift"]),
    "Gather": lambda n, v: np.ascontiguousarray(np.take(v[0], n.attrs["indices"], axis=n.attrs["axis"])),
    "GatherAt": lambda n, v: gather_at(v[0], v[1], n.attrs["axis"]),
    "TakeAlong": lambda n, v: take_along(v[0], n.attrs["indices"], n.attrs["axis"]),
    "Embedding": lambda n, v: embed(v[0], v[1]),
    "IndexFn": lambda n, v: run_index_fn(n.attrs["onnx"], v[0]),
    "InputFn": lambda n, v: run_input_fn(n.attrs["onnx"], v[0]),
    "TopKOneHot": lambda n, v: top_k_one_hot(v[0], n.attrs["k"], v[1] if len(v) > 1 else None, n.attrs["keep"]),
    "PickChosen": lambda n, v: pick_chosen(v[0], v[1]),
    "QGainL2Scale": lambda n, v: qgain_l2_scale(v[0], n.attrs["axis"], n.attrs["epsilon"], n.attrs["gain"],
                                                n.attrs["max_gain"], n.attrs["scale"], n.attrs["out_scale"]),
    "QGRNScale": lambda n, v: qgrn_scale(v[0], n.attrs["axes"], n.attrs["epsilon"], n.attrs["scale"],
                                         n.attrs["out_scale"]),
    "QSumNormalize": lambda n, v: qsum_normalize(v[0], n.attrs["axis"], n.attrs["epsilon"], n.attrs["scale"],
                                                 n.attrs["out_scale"]),
    "QL2Normalize": lambda n, v: ql2_normalize(v[0], n.attrs["axis"], n.attrs["epsilon"], n.attrs["scale"],
                                               n.attrs["out_scale"], bool(n.attrs.get("inner", False)),
                                               n.attrs.get("zero_point", 0), n.attrs.get("out_zero_point", 0),
                                               n.attrs.get("lo", -128), n.attrs.get("hi", 127)),
    "QReduce": lambda n, v: qreduce(v[0], n.attrs["kind"], n.attrs["axis"], n.attrs["scale"], n.attrs["out_scale"],
                                    n.attrs.get("epsilon", 0.0))
    if "bias" not in n.attrs and "keep" not in n.attrs and len(v) == 1 else
    qmasked_log_sum_exp(v[0], n.attrs["scale"], n.attrs["out_scale"], n.attrs["axis"], n.attrs.get("bias"),
                        n.attrs.get("keep"), n.attrs.get("fill", 0.0), softmax_key(n, v)),
    "QLogSoftmax": lambda n, v: qlog_softmax(v[0], n.attrs["axis"], n.attrs["scale"], n.attrs["out_scale"]),
    "QGridSample": lambda n, v: qgrid_sample(v[0], n.attrs["grid"] if "grid" in n.attrs else v[1], n.attrs["mode"],
                                             n.attrs["padding"], n.attrs["align_corners"], n.attrs["scale"],
                                             n.attrs.get("grid_scale", 1.0), n.attrs["out_scale"]),
    "QCumSum": lambda n, v: qcumsum(v[0], n.attrs["axis"], n.attrs["exclusive"], n.attrs["reverse"], n.attrs["scale"],
                                    n.attrs["out_scale"]),
    "LogSoftmax": lambda n, v: log_softmax(v[0], n.attrs["axis"], n.attrs["scale"]).astype(np.float32),
    "LayerNorm": lambda n, v: layer_norm_real(v[0], n.attrs["scale"], n.attrs["gamma"], n.attrs["beta"],
                                              n.attrs["axis"], n.attrs["epsilon"]).astype(np.float32),
    "MaskFn": lambda n, v: mask_fn(n.attrs["onnx"], v[0]),
    "QMaskPool": lambda n, v: qmask_pool(v[0], v[1], n.attrs["onnx"], n.attrs["axes"], n.attrs["keepdims"],
                                         n.attrs["scale"], n.attrs["out_scale"]),
    "Slice": lambda n, v: slice_take(v[0], n.attrs["axes"], n.attrs["indices"]),
    "Where": lambda n, v: np.where(n.attrs["keep"], v[0], np.int8(n.attrs["fill"])).astype(np.int8),
    "Transpose": lambda n, v: np.ascontiguousarray(np.transpose(v[0], n.attrs["perm"])),
    "Resize": lambda n, v: resize(v[0], n.attrs["mode"], n.attrs["coordinate_transformation_mode"],
                                  n.attrs["nearest_mode"], n.attrs["scales"], n.attrs["sizes"],
                                  n.attrs.get("cubic_coeff_a", -0.75), bool(n.attrs.get("exclude_outside", 0)),
                                  n.attrs.get("multiplier", 1), n.attrs.get("shift", 0)),
    "QuantizeZp": lambda n, v: quantize_zp(v[0], n.attrs["scale"], n.attrs["zero_point"]),
    "DequantizeZp": lambda n, v: dequantize_zp(v[0], n.attrs["scale"], n.attrs["zero_point"]),
    "QAffine": lambda n, v: qaffine(v, n.attrs["multipliers"], n.attrs["offset"], n.attrs["shift"], n.attrs["lo"],
                                    n.attrs["hi"]),
}


def run_node(graph: Graph, node: Node, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """Execute one quantized node on the values of its inputs (taken from ``values`` or the graph's constants)."""
    fn = QOPS.get(node.op)
    if fn is None:
        raise GraphError(f"Node {node.name!r} has op {node.op!r}, which the integer reference does not define; "
                         f"defined ops are {', '.join(QOPS)}.")
    args = [values[name] if name in values else graph.constants[name] for name in node.inputs]
    return fn(node, args)


def run_reference(graph: Graph, inputs: Mapping[str, np.ndarray], *, keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run a quantized graph in the integer reference.

    ``inputs`` maps each of ``graph.inputs`` to an array of its declared shape (float32 for a graph starting with
    Quantize, int8 otherwise). Returns ``{output name: array}``, or every tensor value (inputs and intermediates
    included, constants excluded) when ``keep_all``.
    """
    return execute(graph, inputs, run_node, keep_all=keep_all)


NodeRunner = Callable[[Graph, Node, Mapping[str, np.ndarray]], np.ndarray]


def execute(graph: Graph, inputs: Mapping[str, np.ndarray], runner: NodeRunner, *,
            keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run ``graph`` node by node in order with ``runner`` (this module's :func:`run_node`, or another backend's with
    the same contract), after checking that every input is given with its declared shape; returns the outputs, or
    every tensor value when ``keep_all``."""
    values: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise ValueError(f"Input {name!r} of graph {graph.name!r} is missing; given {sorted(inputs)}.")
        arr = np.asarray(inputs[name])
        if arr.shape != graph.shape(name):
            raise ValueError(f"Input {name!r} has shape {arr.shape}; graph {graph.name!r} expects "
                             f"{graph.shape(name)}.")
        values[name] = arr
    for node in graph.nodes:
        values[node.outputs[0]] = runner(graph, node, values)
    if keep_all:
        return values
    return {name: values[name] for name in graph.outputs}
