"""The integer reference of the two CPU ops Llama- and T5-style blocks add (:mod:`.qops` registers them):

* ``QRMSNorm`` (:func:`rms_norm`): RMSNorm over the last axes, float64 from the int8 input, int8 out at the
  output's scale, as ``QLayerNorm`` (:func:`.qops.layer_norm`) but with no mean subtracted and no bias;
* ``QMulAct`` (:func:`qmul_act`): the element-wise product of two int8 activations of one shape (SwiGLU's
  ``silu(gate) * up``), requantized in int64: ``clip((a * b * M + r) >> S, -128, 127)``.

Both are exact integer or IEEE-basic float64 arithmetic in a fixed order: the same bits on every machine.
"""
from __future__ import annotations

import numpy as np

__all__ = ["rms_norm", "qmul_act", "PRODUCT_BOUND"]

PRODUCT_BOUND = 128 * 128
"""The largest ``|a * b|`` of two int8 values (``-128 * -128``): the quantizer picks ``QMulAct``'s (M, S) so that
``PRODUCT_BOUND * M + r`` stays inside int32 (:func:`.frontend.quantize.choose_requant`)."""


def rms_norm(x: np.ndarray, scale: float, gamma: np.ndarray, out_scale: float, axis: int = -1,
             epsilon: float = 1e-6, in_zero_point: int = 0, zero_point: int = 0) -> np.ndarray:
    """int8 RMSNorm over the axes ``axis`` to the last, from the int8 input ``x`` of ``scale``.

    With ``D`` elements per row and ``q = sum(x*x)`` (exact int64), in float64: ``n = x / sqrt((q + D * epsilon /
    scale**2) / D)`` (the normalised value: scale cancels but for epsilon), ``y = n * gamma`` (``gamma`` broadcast
    over the normalised axes) and the result ``clip(rint(y / out_scale), -128, 127)`` (a row of zeros with epsilon 0
    gives zeros). Only IEEE basic operations and sqrt, in a fixed order. ``in_zero_point`` and ``zero_point``
    (int8's domain; 0 for the lab's own symmetric quantization): the input is ``x - in_zero_point`` (exact, before
    the squares) and the result ``clip(rint(y / out_scale) + zero_point, -128, 127)``, for a pre-quantized file's
    asymmetric activations (:mod:`.frontend.prequant`)."""
    axis = axis % x.ndim
    axes = tuple(range(axis, x.ndim))
    d = int(np.prod(x.shape[axis:]))
    xi = x.astype(np.int64) - int(in_zero_point)
    squares = (xi * xi).sum(axis=axes, keepdims=True).astype(np.float64)
    rms = np.sqrt((squares + float(d) * epsilon / (scale * scale)) / float(d))
    safe = np.where(rms > 0, rms, 1.0)                      # a zero row with epsilon 0: 0, not 0 / 0
    y = xi.astype(np.float64) / safe * np.asarray(gamma, np.float64)
    return np.clip(np.rint(y / out_scale) + int(zero_point), -128, 127).astype(np.int8)


def qmul_act(a: np.ndarray, b: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    """int8 ``a * b`` element-wise (one shape) requantized: ``clip((a * b * M + r) >> S, -128, 127)`` with
    ``r = 2**(S-1)`` (0 when S == 0), all in int64 (exact: ``|a * b| <= 2**14``)."""
    if a.shape != b.shape:
        raise ValueError(f"QMulAct operands have shapes {a.shape} and {b.shape}; they must be equal.")
    rnd = (1 << (int(shift) - 1)) if shift > 0 else 0
    val = (a.astype(np.int64) * b.astype(np.int64) * np.int64(multiplier) + rnd) >> int(shift)
    return np.clip(val, -128, 127).astype(np.int8)
