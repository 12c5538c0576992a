"""Weight rounding that minimizes each layer's output error on calibration data (GPTQ, Frantar et al. 2022).

Rounding every weight to its nearest integer minimizes the weight error, not the layer's output error: the rounding
errors of one output channel add up over its inputs, and where the inputs are strongly correlated (the pixels of a
depthwise window, the channels of a ReLU6 activation whose mean is far from 0) they add up systematically.
GPTQ rounds the inputs of each output channel one at a time and spreads each rounding error over the inputs not yet
rounded, weighted by the calibration inputs' second moments ``H = sum(x x^T)``, so that ``||(W_q - W) x||`` stays
small for the inputs seen in calibration (its mean included, so it also does what a bias correction does).

:func:`input_moments` accumulates ``H`` of a Conv2d/Dense from its float input (``[groups, K, K]``, K = the inputs of
one output channel: ``C/groups * KH * KW`` in the (c, kh, kw) order of the weights, or the Dense's features);
:func:`gptq_round` rounds the weights with it at given per-channel scales (the scales stay as the quantizer chose).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .float_ref import _pad_hw, _windows

__all__ = ["MOMENTS_MAX_K", "DAMPING", "input_moments", "gptq_round"]

MOMENTS_MAX_K = 2048
"""The widest layer (inputs per output channel) whose moments calibration collects: ``H`` holds ``groups * K * K``
float64 (32 MB at K = 2048); a wider layer keeps round-to-nearest weights."""
DAMPING = 0.01
"""Fraction of the mean diagonal of ``H`` added to its diagonal before inversion (GPTQ's dampening): it keeps ``H``
invertible when the calibration inputs do not span every direction and limits how far errors are pushed."""


def input_moments(x: np.ndarray, weight_shape: Sequence[int], *, strides: Sequence[int] = (1, 1),
                  pads: Sequence[int] = (0, 0, 0, 0), groups: int = 1) -> np.ndarray:
    """``sum(p p^T)`` over every input patch ``p`` a layer reads: float64 ``[groups, K, K]``.

    ``x``: the layer's float input, ``[N, C, H, W]`` for a convolution (``weight_shape`` ``[O, C/groups, KH, KW]``,
    ``pads`` top, left, bottom, right; the zero padding counts as input) or ``[N, K]`` for a Dense layer
    (``weight_shape`` ``[O, K]``, one group)."""
    if len(weight_shape) == 2:
        flat = np.asarray(x, np.float64).reshape(x.shape[0], -1)
        return (flat.T @ flat)[None]
    _, cg, kh, kw = (int(d) for d in weight_shape)
    win = _windows(_pad_hw(np.asarray(x, np.float32), pads, 0.0), (kh, kw), strides)
    n, _, oh, ow = win.shape[:4]
    cols = win.reshape(n, groups, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6)
    cols = cols.reshape(groups, n * oh * ow, cg * kh * kw).astype(np.float64)
    return np.matmul(cols.transpose(0, 2, 1), cols)


def gptq_round(w: np.ndarray, scales: np.ndarray, moments: np.ndarray, wmax: int, *,
               damping: float = DAMPING) -> np.ndarray:
    """Integer weights ``[O, K]`` (int64 in ``[-wmax, wmax]``) of float weights ``w`` ``[O, K]`` at per-channel
    ``scales`` ``[O]``, rounded by GPTQ with the input moments ``moments`` ``[G, K, K]`` (:func:`input_moments`;
    output channel ``o`` belongs to group ``o // (O / G)``).

    Inputs no calibration sample reached (a zero diagonal of ``H``) are rounded to nearest and pass no error on.
    A channel whose error spreading would leave the weight range is clipped there, as nearest rounding clips."""
    o, k = w.shape
    g = moments.shape[0]
    if moments.shape != (g, k, k) or o % g:
        raise ValueError(f"GPTQ moments of shape {moments.shape} do not fit weights of shape {w.shape}: they must be "
                         f"[G, {k}, {k}] with G dividing {o}.")
    rows = np.asarray(w, np.float64).reshape(g, o // g, k).copy()
    step = np.asarray(scales, np.float64).reshape(g, o // g)
    upper = np.empty((g, k, k))
    for i in range(g):
        h = moments[i].astype(np.float64, copy=True)
        live = np.diag(h) > 0
        if not live.any():
            upper[i] = np.eye(k)
            continue
        h[~live, ~live] = 1.0
        h[np.ix_(~live, live)] = 0.0
        h[np.ix_(live, ~live)] = 0.0
        h[np.diag_indices(k)] += damping * float(np.diag(h)[live].mean())
        upper[i] = np.linalg.cholesky(np.linalg.inv(h)).T   # inv(H) = U^T U, U upper triangular
    q = np.empty_like(rows)
    for j in range(k):
        q[:, :, j] = np.clip(np.rint(rows[:, :, j] / step), -wmax, wmax)
        err = (rows[:, :, j] - q[:, :, j] * step) / upper[:, j, j][:, None]
        rows[:, :, j + 1:] -= err[:, :, None] * upper[:, None, j, j + 1:]
    return q.reshape(o, k).astype(np.int64)
