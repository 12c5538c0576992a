"""The integer Softmax (``QISoftmax``): I-BERT's integer-only softmax over the last axis, every step an operation of
VTA's tensor ALU on int32 lanes with the ``lane_reduce`` knob (RMAX for the row max, RSUM for the row sum and for the
exponent of the reciprocal).

Re-exported by :mod:`.qops`, which is the spec of every quantized operator. :func:`isoftmax_trace` is the definition,
step by step in the order the ALU layer (:mod:`.lowering.softmax`) computes it; :func:`isoftmax_params` chooses its
constants. A softmax with a mask (``bias``, or ``keep``/``fill``) has no integer form here: it stays a ``QSoftmax``.
"""
from __future__ import annotations

import math

import numpy as np

from .qops_layernorm import round_shift

__all__ = ["ISOFTMAX_ATTRS", "isoftmax_params", "isoftmax_trace", "isoftmax", "EXP_POLY", "RECIP_GUESS",
           "RECIP_NEWTON_STEPS"]

ISOFTMAX_ATTRS = ("channels", "k", "m", "g", "mq", "shift")
"""The constants of a ``QISoftmax`` node (:func:`isoftmax_params`), in the order :func:`isoftmax` takes them."""
EXP_POLY = (21512, 11030)
"""``C1, C2``: ``2**v ~ 1 + v (C1 + C2 v) / 2**15`` for ``v`` in ``[0, 1)`` (0.6565, 0.3366: the ratio of the
largest to the smallest ``(1 + 0.6565 v + 0.3366 v**2) / 2**v`` is 1.0035, the least for a second-order polynomial
with ``c0 = 1``; softmax does not see a common factor)."""
RECIP_GUESS = (46261, 30840)
"""The linear first guess of ``2**29 / a`` for ``a`` in ``[2**14, 2**15)``: ``46261 - ((a * 30840) >> 15)``
(``48/17 - 32/17 x``, within 1/17)."""
RECIP_NEWTON_STEPS = 3
_IMM = 32767  # the ALU's 16-bit signed immediate (vta.isa.IMM_BITS)
_MAX_CHANNELS = 1024


def isoftmax_params(s_in: float, s_out: float, channels: int) -> dict[str, int]:
    """The constants of :func:`isoftmax` for rows of ``channels`` int8 scores of scale ``s_in`` and int8
    probabilities of scale ``s_out``:

    - ``k = 22`` and ``m = rint(s_in / ln2 * 2**k)``: ``(x - max) * m`` is ``(x - max) s_in / ln 2`` with
      ``k`` fraction bits (``255 m < 2**31`` for ``s_in < 1.38``);
    - ``g = min(14, 15 - ceil(log2 C))`` (5 to 14): the exps carry ``14 + g`` fraction bits, so that their sum
      stays below ``2**30`` and its truncation costs at most ``C 2**-(14+g)`` of the row max (0.2 % at C = 1024);
    - ``shift`` L (0 to 16) and ``mq = rint(2**L / s_out)``: L is the largest with ``mq <= 32767``.

    Raises ValueError for scales that are not positive and finite, ``channels`` outside [1, 1024] (longer rows
    would lose more than 0.2 % of the sum to the exps' truncation), an input scale of 1.38 or more or an output
    scale below 1/32767."""
    if not all(v > 0 and math.isfinite(v) for v in (s_in, s_out)):
        raise ValueError(f"the integer Softmax needs positive finite scales, not s_in={s_in!r}, s_out={s_out!r}")
    if not 1 <= channels <= _MAX_CHANNELS:
        raise ValueError(f"the integer Softmax takes 1 to {_MAX_CHANNELS} channels, not {channels}")
    k = 22
    m = int(round(s_in / math.log(2) * 2.0 ** k))
    if 255 * m >= 1 << 31:
        raise ValueError(f"the integer Softmax's input scale {s_in:.4g} is too large (it takes scales below 1.38)")
    if round(1 / s_out) > _IMM:
        raise ValueError(f"the integer Softmax's output scale {s_out:.4g} is too small (it takes 1/32767 or more)")
    shift = 16
    while round(2.0 ** shift / s_out) > _IMM:
        shift -= 1
    g = min(14, 15 - (channels - 1).bit_length())
    return {"channels": channels, "k": k, "m": m, "g": g, "mq": int(round(2.0 ** shift / s_out)), "shift": shift}


def isoftmax_trace(x: np.ndarray, channels: int, k: int, m: int, g: int, mq: int, shift: int) -> dict[str, np.ndarray]:
    """Every intermediate of :func:`isoftmax` (int64; per-row values with a last axis of 1), in the ALU's order.

    Per row of ``C = channels`` int8 values ``x``: ``mx = max x`` (MAX and RMAX); ``d = x - mx`` (in ``[-255, 0]``);
    ``t = (d * m) >> (k - 15)``, the power of two ``d s_in / ln 2`` with 15 fraction bits; ``z = -(t >> 15)``, the
    negated floor (I-BERT's ``floor(-(x - max) / ln2)``, at least 0); ``f = t + (z << 15)`` in ``[0, 2**15)``, the
    fraction (I-BERT's ``r``, in units of ``ln 2 / 2**15``); the polynomial ``h = ((f * C2) >> 15) + C1``,
    ``p = ((h * f) >> (16 - g)) + 2**(14+g)`` (``2**(14+g) * 2**(f / 2**15)``, :data:`EXP_POLY`);
    ``ex = p >> min(z, 31)`` (SHR by each lane's own amount), so that ``ex ~ 2**(14+g) exp((x - mx) s_in)``. The row
    sum ``s = sum ex`` (ADD and RSUM), at least ``2**(14+g)``. Its exponent ``b = sum_{j<16} min((s >> (g + 12)) >>
    j, 1)`` (SHR by a constant entry whose lane j holds j, MIN 1, RSUM), so ``2**(b+g+11) <= s < 2**(b+g+12)``; the
    mantissa ``a = SHR(s, b + g - 3)`` in ``[2**14, 2**15)``; ``y ~ 2**29 / a`` by :data:`RECIP_GUESS` and
    :data:`RECIP_NEWTON_STEPS` times ``u = (a * y) >> 15``, ``y = (y * (2**15 - u)) >> 14``. Per element:
    ``q = ((ex >> g) * y) >> (b + 11)`` (``ex / s * 2**15``), ``o = q * mq``, ``r = round_shift(o, shift + 15)``,
    ``out = clip(r, -128, 127)``.
    ``>>`` is arithmetic."""
    xi = np.asarray(x).astype(np.int64)
    if xi.shape[-1] != channels:
        raise ValueError(f"the integer Softmax's rows have {channels} channels, not {xi.shape[-1]}")
    t: dict[str, np.ndarray] = {"x": xi}
    t["mx"] = mx = xi.max(axis=-1, keepdims=True)
    t["d"] = d = xi - mx
    t["dm"] = dm = d * m
    t["t"] = tt = dm >> (k - 15)
    t["z"] = z = (tt >> 15) * -1
    t["zs"] = zs = z << 15
    t["f"] = f = tt + zs
    t["fc"] = fc = f * EXP_POLY[1]
    t["h"] = h = (fc >> 15) + EXP_POLY[0]
    t["hf"] = hf = h * f
    t["p"] = p = (hf >> (16 - g)) + (1 << (14 + g))
    t["ex"] = ex = p >> np.minimum(z, 31)
    t["s"] = s = ex.sum(axis=-1, keepdims=True)
    t["b"] = b = np.minimum((s >> (g + 12)) >> np.arange(16, dtype=np.int64), 1).sum(axis=-1, keepdims=True)
    amount = b + g - 3
    t["a"] = a = np.where(amount >= 0, s >> np.maximum(amount, 0), s << np.maximum(-amount, 0))
    t["ya"] = ya = a * RECIP_GUESS[1]
    y = RECIP_GUESS[0] - (ya >> 15)
    t["y0"] = y
    for step in range(RECIP_NEWTON_STEPS):
        t[f"ay{step}"] = ay = a * y
        t[f"u{step}"] = u = (1 << 15) - (ay >> 15)
        t[f"yu{step}"] = yu = y * u
        t[f"y{step + 1}"] = y = yu >> 14
    t["e14"] = e14 = ex >> g
    t["ey"] = ey = e14 * y
    t["q"] = q = ey >> (b + 11)
    t["o"] = o = q * mq
    t["r"] = r = round_shift(o, shift + 15)
    t["out"] = np.clip(r, -128, 127)
    return t


def isoftmax(x: np.ndarray, channels: int, k: int, m: int, g: int, mq: int, shift: int) -> np.ndarray:
    """The integer Softmax over the last axis of an int8 tensor, as int8 (:func:`isoftmax_trace`'s steps).

    **The int32 bound**, for every int8 row with :func:`isoftmax_params`' constants (``C <= 1024``):
    ``|d| <= 255`` and ``255 m < 2**31`` (``k`` is chosen for it), so ``|d m| < 2**31`` and ``|t| < 2**24``;
    ``0 <= z <= 2**9``, ``z << 15 < 2**25``; ``0 <= f < 2**15``, ``f C2 < 2**29``, ``h < 2**15``, ``h f < 2**30``;
    ``2**(14+g) <= p < 2**(15+g) <= 2**29``; ``0 <= ex <= p``; ``2**(14+g) <= s < C 2**(15+g) <= 2**30`` (``g``
    is chosen for it), so ``s >> (g + 12) < 2**15`` and ``3 <= b <= 15``; ``a < 2**15``, ``a * 30840 < 2**30``;
    ``y <= 2**15`` after the guess and every Newton step (all 16,384 mantissas, ``test_recip_newton_exhaustive``),
    so ``a y < 2**30`` and ``y (2**15 - u) < 2**30``; ``(ex >> g) y < 2**30``; ``q <= 2**15 (1 + 2**-12)``
    (``ex <= s``); ``|q mq| < 2**31``. ``tests/test_qops_softmax.py`` checks every intermediate below 2**31 over
    adversarial rows (all equal, one huge, all -128, all 127, two levels) at C = 1 to 1024 and scales 0.001 to 1.

    **Error against float softmax** (of the int8 input, ``p / s_out`` clipped to int8's range, unrounded): the
    exponent is exact to ``2**-15`` of a power of two, the polynomial within +-0.18 %, the sum within
    ``C 2**-(14+g)`` of the row max, the reciprocal to ``2**-13`` and ``q`` has 15 fraction bits, so
    ``|out - p / s_out| <= 0.5 + 0.0075 p / s_out + 2**-13 / s_out``; measured: at most 0.59 output steps at
    ``s_out`` 1/255 and 1/127 over input scales 0.001 to 1 and C = 16 to 768, 0.52-0.56 at the scales of bert_tiny's
    two softmaxes and the BERT-base block's (``test_isoftmax_within_stated_error``: the bound, and 0.6)."""
    return isoftmax_trace(x, channels, k, m, g, mq, shift)["out"].astype(np.int8)
