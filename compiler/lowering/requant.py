"""The offset start: a shift-only requantization in three ALU passes after a one-pass accumulators' start.

A layer whose every multiplier is 1 (``vta compile --requant shift``, VTA's power-of-two scales) requantizes as
``y = clip((acc + bias) >> S, lo, hi)`` per output channel (the rounding ``2**(S-1)`` is in the bias). Today's
passes are a reset GEMM, ADD bias, SHR S, MAX lo, MIN hi. The offset start moves the bias into the accumulators'
start and lowers the whole window by 256 output units:

* the accumulators start at ``B = bias - 2**(S + 8)`` (per channel);
* after the GEMMs, ``(acc + B) >> S = ((acc + bias) >> S) - 256`` exactly (an arithmetic shift of a value lowered
  by a multiple of ``2**S``), then MAX ``lo - 256`` and MIN ``hi - 256`` leave ``clip(y) - 256``;
* the out buffer keeps the low ``out_width`` bits of each accumulator (``vta.packing.wrap_elements`` in fsim, the
  compute stage's ``res[:out_width]`` in ``hw/compute.py``), and ``2**out_width`` divides 256 for widths up to 8,
  so the stored value is ``clip(y)``, bit for bit the operator contract's (:func:`..qops` is unchanged).

A tile whose accumulator entries still hold the outputs of an earlier tile of the layer (values in
``[lo - 256, hi - 256]``) starts with one ``MIN(acc, B) = B``, valid when ``B <= lo - 256`` for every channel;
elsewhere with the reset and an ADD of ``B``. So a tile costs ``K/16 + 4`` cycles per output vector (MIN start, SHR,
MAX, MIN) instead of ``K/16 + 5``.

Exactness is checked per layer (:func:`offset_start` returns None and the layer keeps the usual passes when one
fails): ``S + 8 <= 30`` for every channel; ``B`` and every accumulator ``B + sum(x * w)`` inside int32 for every
int8 input (``|sum| <= 128 * sum|w|`` per channel); clip bounds inside the out buffer's signed range; the MIN start
only where every channel's start, a pad channel's too (:func:`pad_channel`), is ``<= lo - 256``: the entries a tile
starts from may hold the outputs of other output blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .intrin import Intrinsics
from .layout import PackedWeight, pack_channel_vector
from .schedule import ConvGeometry

__all__ = ["OffsetStart", "RequantLayer", "offset_start", "pad_channel", "OFFSET_BITS", "MAX_OFFSET_EXPONENT"]

OFFSET_BITS = 8
"""The window is lowered by ``2**OFFSET_BITS`` output units (256: a multiple of every out width up to 8 bits)."""
MAX_OFFSET_EXPONENT = 30
"""The largest ``S + OFFSET_BITS``: the offset ``2**(S + 8)`` must itself be an int32 value."""
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


class RequantLayer(Protocol):
    """What :func:`offset_start` reads of a layer (:class:`.codegen.ConvLayer`'s fields, read only)."""

    @property
    def geom(self) -> ConvGeometry: ...
    @property
    def weight(self) -> PackedWeight: ...
    @property
    def bias(self) -> np.ndarray: ...
    @property
    def multiplier(self) -> np.ndarray: ...
    @property
    def shift(self) -> np.ndarray: ...
    @property
    def lo(self) -> int: ...
    @property
    def hi(self) -> int: ...
    @property
    def rounding(self) -> int: ...
    @property
    def weights_as_image(self) -> bool: ...


@dataclass(frozen=True)
class OffsetStart:
    """How a layer's accumulators start and requantize with the offset start (see the module docstring).

    ``start``: int64 ``[O]``, ``B = bias - 2**(S + 8)``; ``min_start``: a tile whose entries hold outputs of an
    earlier tile starts with one MIN of ``B`` (every ``B <= lo - 256``), else always the reset and an ADD;
    ``lo``/``hi``: the lowered clip bounds; ``shift``: int64 ``[O]``; ``per_tensor``: one S (an immediate)."""

    start: np.ndarray
    min_start: bool
    lo: int
    hi: int
    shift: np.ndarray
    per_tensor: bool

    def passes(self) -> list[str]:
        """The ALU passes after the GEMMs: SHR S (none when every S is 0), MAX, MIN."""
        return (["SHR"] if self.shift.any() else []) + ["MAX", "MIN"]

    def slots(self) -> tuple[int, ...]:
        """The per-channel constant rows a tile loads (rows of :meth:`constants`): 0, the start; 2, the shifts when
        they differ by channel."""
        return (0,) if self.per_tensor or not self.shift.any() else (0, 2)

    def constants(self, intr: Intrinsics) -> np.ndarray:
        """The start, ones and the shifts packed as acc elements: int32 ``(3 * O/BO, B, BO)`` (the rows of
        :func:`.codegen.conv_constants`: start in the bias's row, shift in the shift's), pad channels as
        :func:`pad_channel`'s."""
        o, bo = self.start.shape[0], intr.block_out
        pad_start, pad_shift = pad_channel(self.shift, self.per_tensor)
        start, shift = (np.full(-(-o // bo) * bo, v, np.int64) for v in (pad_start, pad_shift))
        start[:o], shift[:o] = self.start, self.shift
        rows = (start, np.ones(o, np.int64), shift)
        return np.concatenate([pack_channel_vector(v.astype(np.int32), batch=intr.batch, block_out=bo)
                               for v in rows], axis=0)


def pad_channel(shift: np.ndarray, per_tensor: bool) -> tuple[int, int]:
    """``(start, S)`` of a pad channel (O not a multiple of the output block; its weights are 0): a channel of bias
    0, ``-2**(S + 8)``, with S the layer's immediate when per tensor, else 1 (its own row). It ends at
    ``clip(0) - 256``, as a pad channel ends at ``clip(0)`` without the offset (a consumer reading the padded channels,
    e.g. as a matrix product's reduction, sees zeros), and its start ``-2**(S + 8) <= -512`` is below ``lo - 256``
    for ``lo >= -256``, so its MIN start is exact too (the entry may hold another output block's value)."""
    s = int(shift[0]) if per_tensor else 1
    return -(1 << (s + OFFSET_BITS)), s


def _product_bound(layer: RequantLayer) -> np.ndarray:
    """Per output channel, the largest ``|sum(x * w)|`` any int8 input gives: ``128 * sum|w|`` (weights bound only
    at run time, ``weights_as_image``: ``128 * 128 * K``)."""
    g = layer.geom
    data = layer.weight.data
    if layer.weights_as_image:
        k = data.shape[1] * data.shape[2] * data.shape[3] * data.shape[5]
        return np.full(g.o, 128 * 128 * k, np.int64)
    per_block = np.abs(data.astype(np.int64)).sum(axis=(1, 2, 3, 5))  # (O/BO, BO)
    return 128 * per_block.reshape(-1)[:g.o]


def offset_start(layer: RequantLayer, intr: Intrinsics) -> OffsetStart | None:
    """The offset start of ``layer`` (a :class:`.codegen.ConvLayer`), or None when it keeps the usual passes: a
    multiplier other than 1, a ``rounding`` (QMatMul's, :func:`.codegen.rounding_start`), the ``fused_requant``
    knob (whether or not the layer's fields fit REQ), ``gemm_overwrite`` or ``concurrent_alu``, an out buffer wider
    than 8 bits or clip bounds outside its signed range, a negative S or ``S + 8 > 30``, or a start or accumulator
    that could leave int32. (A tiling that loads the bias image, ``bias_load``, keeps the usual passes too;
    :func:`.codegen.emit_conv` checks that.)"""
    cfg = intr.cfg
    width = cfg.out_width
    if (layer.rounding or not (layer.multiplier == 1).all() or cfg.fused_requant or cfg.gemm_overwrite
            or cfg.concurrent_alu or width > OFFSET_BITS
            or not -(1 << (width - 1)) <= layer.lo <= layer.hi < 1 << (width - 1)):
        return None
    shift = layer.shift.astype(np.int64)
    if (shift < 0).any() or (shift + OFFSET_BITS > MAX_OFFSET_EXPONENT).any():
        return None
    start = layer.bias.astype(np.int64) - (np.int64(1) << (shift + OFFSET_BITS))
    bound = _product_bound(layer)
    if (start - bound < _INT32_MIN).any() or (start + bound > _INT32_MAX).any():
        return None
    lo, hi = layer.lo - (1 << OFFSET_BITS), layer.hi - (1 << OFFSET_BITS)
    per_tensor = bool((shift == shift[0]).all())
    starts = [int(start.max())] + ([pad_channel(shift, per_tensor)[0]] if layer.geom.o % intr.block_out else [])
    return OffsetStart(start, max(starts) <= lo, lo, hi, shift, per_tensor)
