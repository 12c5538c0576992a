"""The integer LayerNorm (``QILayerNorm``): I-BERT's integer-only LayerNorm, every step an operation of VTA's tensor
ALU on int32 lanes with the ``lane_reduce`` knob (RSUM for the row sums and for the exponent of ``1/sqrt``).

Re-exported by :mod:`.qops`, which is the spec of every quantized operator; this module holds the one operator so
that :mod:`.qops` stays one screenful per concept. :func:`ilayernorm_trace` is the definition, step by step in the
order the ALU layer (:mod:`.lowering.layernorm`) computes it; :func:`ilayernorm_params` chooses its constants.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ILAYERNORM_ATTRS", "ilayernorm_params", "ilayernorm_trace", "ilayernorm", "round_shift",
           "NEWTON_STEPS", "RSQRT_GUESS"]

ILAYERNORM_ATTRS = ("channels", "k", "mc", "k2", "mc2", "eps_steps", "shift", "mq", "bq")
"""The constants of a ``QILayerNorm`` node (:func:`ilayernorm_params`), in the order :func:`ilayernorm` takes them."""
NEWTON_STEPS = 3
RSQRT_GUESS = (17449, -9912)
"""The linear first guess of ``2**13 / sqrt(a / 2**15)`` for ``a`` in ``[2**13, 2**15)``:
``((a * -9912) >> 15) + 17449``, within 8.8 %."""
_IMM = 32767  # the ALU's 16-bit signed immediate (vta.isa.IMM_BITS)
_MAX_CHANNELS = 4096
_BQ_MAX = 1 << 29


def round_shift(v: np.ndarray, s: int) -> np.ndarray:
    """``(v + 2**(s-1)) >> s`` as the ALU computes it with 16-bit immediates: for ``s > 15``
    ``((v >> (s - 15)) + 2**14) >> 15`` (the same value), for ``s == 0`` ``v``."""
    if s > 15:
        return ((v >> (s - 15)) + (1 << 14)) >> 15
    if s > 0:
        return (v + (1 << (s - 1))) >> s
    return v


def ilayernorm_params(s_in: float, s_out: float, gamma: Any, beta: Any, eps: float, channels: int
                      ) -> dict[str, Any]:
    """The constants of :func:`ilayernorm` for rows of ``channels`` int8 features of scale ``s_in``, output scale
    ``s_out``, per-channel ``gamma``/``beta`` (float arrays of ``channels``) and ``eps``:

    - ``k`` (19 to 23) and ``mc = rint(2**k / channels)``, the mean's multiplier: the largest ``k <= 23`` with
      ``mc <= 32767``, so that ``|S1 * mc| <= 128 C (2**k / C + 1/2) < 2**31``;
    - ``k2 <= k`` and ``mc2 = rint(2**k2 / C)``, the multiplier of ``g*g / C`` (the correction from the integer
      ``m`` to the mean), the largest ``k2`` with ``(0.36 C**2 + 2 C) mc2 < 2**30``;
    - ``eps_steps = rint(C * eps / s_in**2)``: epsilon in squared input steps, times C (at most ``2**30``);
    - ``shift`` S and per-channel ``mq = rint(sqrt(C) gamma / s_out * 2**(S-15))``,
      ``bq = rint(beta / s_out * 2**S) + 2**(S-1)`` (int32 arrays): S is the largest in [0, 30] with
      ``max |mq| <= 32767`` and ``max |bq| <= 2**29``.

    Raises ValueError for scales that are not positive and finite, ``channels`` outside [1, 4096], gamma or beta of
    another length, an epsilon of more than ``2**30`` steps, or a gamma/beta too large for S = 0."""
    if not all(v > 0 and math.isfinite(v) for v in (s_in, s_out)):
        raise ValueError(f"the integer LayerNorm needs positive finite scales, not s_in={s_in!r}, s_out={s_out!r}")
    if not 1 <= channels <= _MAX_CHANNELS:
        raise ValueError(f"the integer LayerNorm takes 1 to {_MAX_CHANNELS} channels, not {channels}")
    g = np.asarray(gamma, np.float64).reshape(-1)
    b = np.asarray(beta, np.float64).reshape(-1)
    if g.size != channels or b.size != channels:
        raise ValueError(f"gamma and beta need {channels} values each, not {g.size} and {b.size}")
    if not (eps >= 0 and math.isfinite(eps)):
        raise ValueError(f"the integer LayerNorm needs a finite epsilon >= 0, not {eps!r}")
    k = 23
    while round(2.0 ** k / channels) > _IMM:
        k -= 1
    mc = int(round(2.0 ** k / channels))
    k2 = k
    while (channels * channels * 0.36 + 2 * channels) * round(2.0 ** k2 / channels) >= 1 << 30:
        k2 -= 1
    mc2 = int(round(2.0 ** k2 / channels))
    eps_steps = int(round(channels * eps / (s_in * s_in)))
    if eps_steps > 1 << 30:
        raise ValueError(f"the integer LayerNorm's epsilon is {eps_steps} squared input steps (eps {eps!r}, input "
                         f"scale {s_in:.4g}), more than 2**30")
    ratio = math.sqrt(channels) * g / s_out
    for shift in range(30, -1, -1):
        mq = np.rint(ratio * 2.0 ** (shift - 15))
        bq = np.rint(b / s_out * 2.0 ** shift) + (1 << shift >> 1)
        if np.abs(mq).max() <= _IMM and np.abs(bq).max() <= _BQ_MAX:
            return {"channels": channels, "k": k, "mc": mc, "k2": k2, "mc2": mc2, "eps_steps": eps_steps,
                    "shift": shift, "mq": mq.astype(np.int32), "bq": bq.astype(np.int32)}
    raise ValueError(f"the integer LayerNorm's gamma / beta are too large for the output scale {s_out:.4g}: "
                     f"max |gamma| {np.abs(g).max():.4g}, max |beta| {np.abs(b).max():.4g}")


def ilayernorm_trace(x: np.ndarray, channels: int, k: int, mc: int, k2: int, mc2: int, eps_steps: int, shift: int,
                     mq: Any, bq: Any) -> dict[str, np.ndarray]:
    """Every intermediate of :func:`ilayernorm` (int64; per-row values with a last axis of 1), in the ALU's order.

    Per row of ``C = channels`` int8 values ``x``: ``s1 = sum x``, ``q = sum x*x`` (ADD and RSUM);
    ``pm = s1 * mc``; ``m = round_shift(pm, k)`` (the mean rounded to an integer, within 0.51);
    ``g = s1 - C m``; ``m8 = 256 m + round_shift(g * mc, k - 8)`` (the mean with 8 fraction bits);
    ``sumsq = q - (g + s1) m``, exactly ``sum (x - m)**2``; ``corr = -round_shift(g * g * mc2, k2)`` (``-g**2 / C``,
    so that ``sumsq + corr ~ sum (x - mean)**2``); ``w = max(sumsq + corr + eps_steps, 1)``.
    The exponent ``e = sum_{j<16} min(w >> 2j, 1)`` (SHR by a constant entry whose lane j holds 2j, MIN 1, RSUM),
    so ``4**(e-1) <= w < 4**e``; the mantissa ``a = SHR(w, 2e - 15)`` in
    ``[2**13, 2**15)`` (a left shift when ``2e < 15``). Then ``y ~ 2**13 / sqrt(a / 2**15)``: ``y = ((a * -9912)
    >> 15) + 17449`` and :data:`NEWTON_STEPS` times ``z = (((y*y) >> 13) * a) >> 15``, ``y = (y * (24576 - z)) >>
    14``, so that ``y / 2**(13 + e) ~ 1 / sqrt(w)``. Per element: ``c = x * 256y - m8 y`` (``(256x - m8) y``),
    ``p = c >> (e + 6)`` (``(x - mean) / sqrt(w) * 2**15``), ``o = p * mq + bq``, ``r = o >> shift``,
    ``out = clip(r, -128, 127)``. ``>>`` is arithmetic."""
    xi = np.asarray(x).astype(np.int64)
    if xi.shape[-1] != channels:
        raise ValueError(f"the integer LayerNorm's rows have {channels} channels, not {xi.shape[-1]}")
    t: dict[str, np.ndarray] = {"x": xi}
    t["s1"] = s1 = xi.sum(axis=-1, keepdims=True)
    t["q"] = q = (xi * xi).sum(axis=-1, keepdims=True)
    t["pm"] = pm = s1 * mc
    t["m"] = m = round_shift(pm, k)
    t["g"] = g = m * -channels + s1
    t["gm"] = gm = g * mc
    t["m8"] = m8 = m * 256 + round_shift(gm, k - 8)
    t["gs"] = gs = (g + s1) * m * -1
    t["sumsq"] = sumsq = gs + q
    t["gg"] = gg = g * g * mc2
    t["corr"] = corr = round_shift(gg, k2) * -1
    t["w"] = w = np.maximum(sumsq + corr + eps_steps, 1)
    lanes = np.minimum(2 * np.arange(16, dtype=np.int64), 31)
    t["e"] = e = np.minimum(w >> lanes, 1).sum(axis=-1, keepdims=True)
    amount = 2 * e - 15
    t["a"] = a = np.where(amount >= 0, w >> np.maximum(amount, 0), w << np.maximum(-amount, 0))
    y = ((a * RSQRT_GUESS[1]) >> 15) + RSQRT_GUESS[0]
    t["y0"] = y
    for step in range(NEWTON_STEPS):
        t[f"yy{step}"] = yy = y * y
        t[f"za{step}"] = za = (yy >> 13) * a
        t[f"z{step}"] = z = 24576 - (za >> 15)
        t[f"yz{step}"] = yz = y * z
        t[f"y{step + 1}"] = y = yz >> 14
    t["my"] = my = m8 * y * -1
    t["c"] = c = xi * (256 * y) + my
    t["p"] = p = c >> (e + 6)
    t["o"] = o = p * np.asarray(mq, np.int64) + np.asarray(bq, np.int64)
    t["r"] = r = o >> shift
    t["out"] = np.clip(r, -128, 127)
    return t


def ilayernorm(x: np.ndarray, channels: int, k: int, mc: int, k2: int, mc2: int, eps_steps: int, shift: int,
               mq: Any, bq: Any) -> np.ndarray:
    """The integer LayerNorm over the last axis of an int8 tensor, as int8 (:func:`ilayernorm_trace`'s steps).

    **The int32 bound**, for every int8 row with :func:`ilayernorm_params`' constants (``C <= 4096``):
    ``|s1| <= 128 C <= 2**19``; ``q <= 2**14 C <= 2**26``; ``|pm| <= 128 C mc <= 2**30 + 64 C`` (``mc <= 2**k / C
    + 1/2``, ``k <= 23``); ``|m| <= 128``; ``|g| = |s1 - C m| <= 0.6 C``, so ``|g mc| < 2**30`` and ``g*g*mc2 <
    2**30`` (``k2`` is chosen for it); ``|m8| <= 2**15 + 154``; ``0 <= sumsq = sum (x - m)**2 <= 2**16 C <= 2**28``
    and ``w <= sumsq + 2**30``; ``a < 2**15``; ``y <= 16383`` after the guess and after every Newton step (all 24,576
    mantissas, ``test_rsqrt_newton_exhaustive``), so ``y*y < 2**28`` and ``(y*y >> 13) * a < 2**30``; ``|m8 y| <
    2**29.1``; ``|c| = |256 x - m8| y <= 65281 * 16383 < 2**30``; ``|p| <= 2**15`` up to the Newton error (one
    element's deviation from ``m8 / 256`` is at most ``sqrt(w)`` but for ``C (mean - m8/256)**2``), so ``|p * mq| <=
    1.01 * 2**30`` and ``|o| < 1.52 * 2**30``. ``tests/test_qops_layernorm.py`` checks every intermediate below 2**31
    over adversarial rows (all -128, all 127, alternating, one outlier, constant rows, one 1 among zeros) at C = 16 to
    4096 and several scales.

    **Error against float LayerNorm** (of the int8 input, clipped to the int8 range): at most 0.64 output steps over
    rows of spread at least 5 input steps (``test_ilayernorm_within_stated_error_of_float``). Rows of almost no spread
    err more: epsilon is rounded to whole squared input steps and the mean to 1/256 of a step, both of which count
    when ``sum (x - mean)**2`` is a few squared steps (one 1 among zeros: up to 10 output steps at C = 64); the float
    result of such a row is itself mostly quantization noise of its input."""
    return ilayernorm_trace(x, channels, k, mc, k2, mc2, eps_steps, shift, mq, bq)["out"].astype(np.int8)
