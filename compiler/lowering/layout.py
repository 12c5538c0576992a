"""Layout packing between numpy's NCHW tensors and the accelerator's blocked DRAM layouts.

Activations (int8) are packed as ``(N/B, C/BI, H, W, B, BI)`` with ``B = BATCH`` and ``BI = BLOCK_IN``: the two
innermost axes are exactly one ``inp`` element (and, since BLOCK_OUT == BLOCK_IN, one ``out``/``acc8`` element), so
element ``((nb * C/BI + cb) * H + h) * W + w`` of the DRAM array is the ``(B, BI)`` tile of images
``nb*B .. nb*B+B-1``, channels ``cb*BI .. cb*BI+BI-1`` at pixel ``(h, w)``. N and C are padded with zeros to
multiples of B and BI. Dense activations ``[N, K]`` are packed as ``[N, K, 1, 1]``.

Weights (int8) are packed as ``(O/BO, NIB, KH, KW, BO, BI)``: one ``wgt`` element per ``(ob, j, kh, kw)``.
For an ungrouped convolution ``NIB = C/BI`` and ``j`` is the input channel block, the classic VTA layout
``(O/BO, I/BI, KH, KW, BO, BI)``. For a grouped (e.g. depthwise) convolution only the input blocks an output
block can read are kept: output block ``ob`` reads input blocks ``ib_lo[ob] + j`` for ``j < NIB``, and weights
outside a channel's group are zero inside those blocks (see :class:`PackedWeight`).

Per-channel constants (bias, requant multiplier and shift, int32) are packed as ``(O/BO, B, BO)``: one ``acc``
element per output block, the vector repeated on every batch row.

Every ``pack_*`` has an inverse ``unpack_*`` (tests check the round trip for every config shape).

A layer program holds its packed operands in DRAM allocations named :data:`INPUT` (and :data:`INPUT_B`, a residual
add's second operand) and its packed result in :data:`OUTPUT`: the code generator allocates them, the runtime fills
and reads them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import conv_output_hw

__all__ = ["INPUT", "INPUT_B", "OUTPUT", "ceil_div", "round_up", "pack_activation", "unpack_activation",
           "packed_activation_shape", "PackedWeight", "pack_weight", "unpack_weight", "pack_channel_vector",
           "unpack_channel_vector", "group_block_ranges", "fold_kernel_columns", "fold_weight_columns", "im2col",
           "im2col_weights", "bias_lane_values", "bias_lane_weights", "im2col_packed"]

INPUT, INPUT_B, OUTPUT = "x", "x_b", "y"
"""Allocation names of a layer program's packed input(s) and output."""


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """``a`` rounded up to a multiple of ``b``."""
    return ceil_div(a, b) * b


def _check_block(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")


def _as_nchw(x: np.ndarray, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 2:
        return x.reshape(x.shape[0], x.shape[1], 1, 1)
    if x.ndim != 4:
        raise ValueError(f"{what} must be NCHW (4 dimensions) or [N, K] (2 dimensions), not shape {x.shape}")
    return x


def packed_activation_shape(shape: tuple[int, ...], batch: int, block: int) -> tuple[int, int, int, int, int, int]:
    """The packed shape ``(N/B, C/BI, H, W, B, BI)`` of an NCHW (or ``[N, K]``) activation of ``shape``."""
    if len(shape) == 2:
        shape = (shape[0], shape[1], 1, 1)
    if len(shape) != 4:
        raise ValueError(f"an activation shape must have 2 or 4 dimensions, not {tuple(shape)}")
    n, c, h, w = shape
    return (ceil_div(n, batch), ceil_div(c, block), h, w, batch, block)


def pack_activation(x: np.ndarray, *, batch: int, block: int) -> np.ndarray:
    """NCHW (or ``[N, K]``) -> ``(N/B, C/BI, H, W, B, BI)``, zero-padding N and C; dtype kept."""
    _check_block("batch", batch)
    _check_block("block", block)
    x = _as_nchw(x, "the activation")
    n, c, h, w = x.shape
    nb, cb = ceil_div(n, batch), ceil_div(c, block)
    padded = np.zeros((nb * batch, cb * block, h, w), dtype=x.dtype)
    padded[:n, :c] = x
    return np.ascontiguousarray(padded.reshape(nb, batch, cb, block, h, w).transpose(0, 2, 4, 5, 1, 3))


def unpack_activation(packed: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Inverse of :func:`pack_activation`: the NCHW (or ``[N, K]``) tensor of ``shape``, padding dropped."""
    packed = np.asarray(packed)
    if packed.ndim != 6:
        raise ValueError(f"a packed activation has 6 dimensions (N/B, C/BI, H, W, B, BI), not shape {packed.shape}")
    nb, cb, h, w, b, bi = packed.shape
    full = (shape[0], shape[1], 1, 1) if len(shape) == 2 else tuple(shape)
    if len(full) != 4 or full[2:] != (h, w) or full[0] > nb * b or full[1] > cb * bi:
        raise ValueError(f"shape {tuple(shape)} does not fit the packed activation of shape {packed.shape}")
    x = packed.transpose(0, 4, 1, 5, 2, 3).reshape(nb * b, cb * bi, h, w)[:full[0], :full[1]]
    return np.ascontiguousarray(x.reshape(shape))


def group_block_ranges(out_channels: int, in_channels: int, groups: int, block_out: int,
                       block_in: int) -> tuple[np.ndarray, int]:
    """For each output block: the first input block it reads (``ib_lo``, int64 [O/BO]) and the common count NIB.

    Output channel ``o`` reads input channels of group ``o // (O / groups)``. ``ib_lo`` never decreases with the
    output block and ``ib_lo + NIB <= C/BI``, so a run of output blocks reads one contiguous run of input blocks.
    """
    if groups < 1 or out_channels % groups or in_channels % groups:
        raise ValueError(f"groups={groups} must divide both the {in_channels} input and {out_channels} output "
                         f"channels")
    ob_count, ib_count = ceil_div(out_channels, block_out), ceil_div(in_channels, block_in)
    og, cg = out_channels // groups, in_channels // groups
    lo = np.zeros(ob_count, dtype=np.int64)
    hi = np.zeros(ob_count, dtype=np.int64)
    for ob in range(ob_count):
        o_first, o_last = ob * block_out, min((ob + 1) * block_out, out_channels) - 1
        lo[ob] = (o_first // og) * cg // block_in
        hi[ob] = ceil_div((o_last // og + 1) * cg, block_in)
    nib = int((hi - lo).max())
    lo = np.minimum(lo, ib_count - nib)
    return lo, nib


@dataclass(frozen=True, eq=False)
class PackedWeight:
    """Packed weights ``data`` of shape ``(O/BO, NIB, KH, KW, BO, BI)`` (int8) and each output block's first input
    block ``ib_lo`` (int64 [O/BO]); ``shape`` is the original ``[O, C/groups, KH, KW]`` and ``in_channels`` is C."""

    data: np.ndarray
    ib_lo: np.ndarray
    shape: tuple[int, int, int, int]
    in_channels: int
    groups: int

    @property
    def nib(self) -> int:
        """Input blocks per output block."""
        return int(self.data.shape[1])


def pack_weight(w: np.ndarray, *, block_out: int, block_in: int, groups: int = 1,
                in_channels: int | None = None) -> PackedWeight:
    """``[O, C/groups, KH, KW]`` (or dense ``[O, K]``) -> :class:`PackedWeight` (see the module docstring)."""
    _check_block("block_out", block_out)
    _check_block("block_in", block_in)
    w = np.asarray(w)
    if w.ndim == 2:
        w = w.reshape(w.shape[0], w.shape[1], 1, 1)
    if w.ndim != 4:
        raise ValueError(f"weights must be [O, C/groups, KH, KW] or [O, K], not shape {w.shape}")
    o, cg, kh, kw = w.shape
    c = cg * groups if in_channels is None else in_channels
    if c != cg * groups:
        raise ValueError(f"in_channels={c} does not equal C/groups={cg} times groups={groups}")
    ib_lo, nib = group_block_ranges(o, c, groups, block_out, block_in)
    ob_count = ceil_div(o, block_out)
    dense = np.zeros((ob_count * block_out, ceil_div(c, block_in) * block_in, kh, kw), dtype=w.dtype)
    og = o // groups
    for g in range(groups):
        dense[g * og:(g + 1) * og, g * cg:(g + 1) * cg] = w[g * og:(g + 1) * og]
    blocks = dense.reshape(ob_count, block_out, -1, block_in, kh, kw).transpose(0, 2, 4, 5, 1, 3)
    index = ib_lo[:, None] + np.arange(nib)[None, :]
    data = blocks[np.arange(ob_count)[:, None], index]
    return PackedWeight(np.ascontiguousarray(data), ib_lo, (o, cg, kh, kw), c, groups)


def unpack_weight(packed: PackedWeight) -> np.ndarray:
    """Inverse of :func:`pack_weight`: the ``[O, C/groups, KH, KW]`` weights."""
    o, cg, kh, kw = packed.shape
    ob_count, nib, _, _, bo, bi = packed.data.shape
    ib_count = ceil_div(packed.in_channels, bi)
    dense = np.zeros((ob_count, ib_count, kh, kw, bo, bi), dtype=packed.data.dtype)
    for ob in range(ob_count):
        dense[ob, packed.ib_lo[ob]:packed.ib_lo[ob] + nib] = packed.data[ob]
    full = dense.transpose(0, 4, 1, 5, 2, 3).reshape(ob_count * bo, ib_count * bi, kh, kw)
    og = o // packed.groups
    out = np.zeros((o, cg, kh, kw), dtype=packed.data.dtype)
    for g in range(packed.groups):
        out[g * og:(g + 1) * og] = full[g * og:(g + 1) * og, g * cg:(g + 1) * cg]
    return out


def pack_channel_vector(v: np.ndarray, *, batch: int, block_out: int) -> np.ndarray:
    """A per-channel int32 vector ``[O]`` -> ``(O/BO, B, BO)`` int32, zero-padded and repeated over batch rows."""
    _check_block("batch", batch)
    _check_block("block_out", block_out)
    v = np.asarray(v)
    if v.ndim != 1:
        raise ValueError(f"a per-channel vector must have 1 dimension, not shape {v.shape}")
    ob_count = ceil_div(v.shape[0], block_out)
    padded = np.zeros(ob_count * block_out, dtype=np.int32)
    padded[:v.shape[0]] = v
    return np.ascontiguousarray(np.repeat(padded.reshape(ob_count, 1, block_out), batch, axis=1))


def unpack_channel_vector(packed: np.ndarray, channels: int) -> np.ndarray:
    """Inverse of :func:`pack_channel_vector` (reads batch row 0)."""
    return np.ascontiguousarray(np.asarray(packed)[:, 0, :].reshape(-1)[:channels])


def fold_kernel_columns(x: np.ndarray, *, kw: int, sw: int, pad_left: int, pad_right: int) -> np.ndarray:
    """Fold a convolution's kernel columns into channels: NCHW ``x`` -> ``[N, C*KW, H, OW]``.

    ``out[n, c*KW + k, h, j] = x_padded[n, c, h, j*sw + k]`` (zero padding ``pad_left``/``pad_right`` on W), so a
    ``KH x KW`` convolution with column stride ``sw`` on ``x`` equals a ``KH x 1`` convolution with column stride 1
    on the result, with weights from :func:`fold_weight_columns`. Used for layers with few input channels (a
    network's first convolution), where it cuts the GEMM work by up to ``KW`` times.
    """
    x = np.asarray(x)
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (0, 0), (pad_left, pad_right)))
    ow = (w + pad_left + pad_right - kw) // sw + 1
    cols = np.arange(ow)[:, None] * sw + np.arange(kw)[None, :]           # [OW, KW]
    folded = xp[:, :, :, cols]                                            # N, C, H, OW, KW
    return np.ascontiguousarray(folded.transpose(0, 1, 4, 2, 3).reshape(n, c * kw, h, ow))


def fold_weight_columns(w: np.ndarray) -> np.ndarray:
    """``[O, C, KH, KW]`` -> ``[O, C*KW, KH, 1]``: the weights matching :func:`fold_kernel_columns`."""
    w = np.asarray(w)
    o, c, kh, kw = w.shape
    return np.ascontiguousarray(w.transpose(0, 1, 3, 2).reshape(o, c * kw, kh, 1))


def _pad_hw(x: np.ndarray, pads: tuple[int, int, int, int]) -> np.ndarray:
    """``x`` (N, C, H, W) with zero rows and columns around its pixels: ``pads`` = top, left, bottom, right."""
    top, left, bottom, right = pads
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))


def im2col(x: np.ndarray, *, kh: int, kw: int, sh: int, sw: int, pads: tuple[int, int, int, int],
           bias_lanes: int = 0) -> np.ndarray:
    """Fold a convolution's whole kernel window into channels: NCHW ``x`` -> ``[N, C*KH*KW + L, OH, OW]``.

    ``out[n, (c*KH + i)*KW + j, r, q] = x_padded[n, c, r*sh + i, q*sw + j]`` (zero padding ``pads`` = top, left,
    bottom, right), so the convolution equals a 1x1 convolution with stride 1 on the result, with weights from
    :func:`im2col_weights`. The last ``L = bias_lanes`` channels hold the constants of :func:`bias_lane_values`
    (the lanes that carry the bias through the GEMM). Used for a network's first convolution (3 input channels),
    where it fills the reduction lanes that a per-tap GEMM would leave empty; the cost is host time and ``KH*KW``
    times the input bytes.
    """
    x = np.asarray(x)
    n, c, h, w = x.shape
    xp = _pad_hw(x, pads)
    oh, ow = conv_output_hw(h, w, (kh, kw), (sh, sw), pads)
    out = np.empty((n, c * kh * kw + bias_lanes, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, i * kw + j:c * kh * kw:kh * kw] = xp[:, :, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw]
    if bias_lanes:
        out[:, c * kh * kw:] = bias_lane_values(bias_lanes).astype(x.dtype)[None, :, None, None]
    return out


def im2col_packed(x: np.ndarray, *, kh: int, kw: int, sh: int, sw: int, pads: tuple[int, int, int, int],
                  bias_lanes: int = 0, batch: int, block: int) -> np.ndarray:
    """``pack_activation(im2col(x, ...), batch=batch, block=block)`` built in two copies instead of ``KH*KW`` slice
    copies plus the packing's two (the host time of the im2col lowering: about 2.3 ms for ResNet-18's 3x224x224
    input against 3.9 ms, numpy on one core)."""
    from numpy.lib.stride_tricks import sliding_window_view
    _check_block("batch", batch)
    _check_block("block", block)
    x = np.asarray(x)
    n, c, h, w = x.shape
    xp = _pad_hw(x, pads)
    oh, ow = conv_output_hw(h, w, (kh, kw), (sh, sw), pads)
    k = c * kh * kw
    kp, nb = round_up(k + bias_lanes, block), ceil_div(n, batch)
    out = np.zeros((nb * batch, oh, ow, kp), dtype=x.dtype)               # channels last
    win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, :(oh - 1) * sh + 1:sh, :(ow - 1) * sw + 1:sw]
    out[:n, :, :, :k] = win.transpose(0, 2, 3, 1, 4, 5).reshape(n, oh, ow, k)
    if bias_lanes:
        out[:n, :, :, k:k + bias_lanes] = bias_lane_values(bias_lanes).astype(x.dtype)
    return np.ascontiguousarray(out.reshape(nb, batch, oh, ow, kp // block, block).transpose(0, 4, 2, 3, 1, 5))


def im2col_weights(w: np.ndarray, lane_weights: np.ndarray | None = None) -> np.ndarray:
    """``[O, C, KH, KW]`` -> ``[O, C*KH*KW + L, 1, 1]``: the weights matching :func:`im2col`; ``lane_weights``
    (int8 ``[O, L]``, from :func:`bias_lane_weights`) go to the ``L`` bias lanes."""
    w = np.asarray(w)
    o = w.shape[0]
    flat = w.reshape(o, -1)
    if lane_weights is not None:
        flat = np.concatenate([flat, np.asarray(lane_weights, dtype=w.dtype).reshape(o, -1)], axis=1)
    return np.ascontiguousarray(flat.reshape(o, -1, 1, 1))


def bias_lane_values(lanes: int) -> np.ndarray:
    """The input value of each of ``lanes`` bias lanes (int8): 127 on every lane but the last, 1 on the last."""
    if lanes < 1:
        raise ValueError(f"bias lanes must be at least 1, not {lanes}")
    return np.array([127] * (lanes - 1) + [1], dtype=np.int8)


def bias_lane_weights(bias: np.ndarray, lanes: int) -> np.ndarray | None:
    """int8 weights ``[O, lanes]`` with ``sum(bias_lane_values(lanes) * w[o]) == bias[o]`` for every channel, so a
    GEMM over the bias lanes adds the bias (no ALU ADD); None when some bias is out of their reach (about
    ``127 * 128 * (lanes - 1)``)."""
    b = np.asarray(bias, dtype=np.int64).reshape(-1)
    if lanes < 1:
        return None
    out = np.zeros((b.size, lanes), dtype=np.int64)
    rest = ((b + 63) % 127) - 63 if lanes > 1 else b        # the last lane (value 1) takes a remainder in [-63, 63]
    q = (b - rest) // 127                                   # the lanes of value 127 share the quotient
    for k in range(lanes - 1):
        out[:, k] = np.clip(q, -128, 127)
        q = q - out[:, k]
    out[:, lanes - 1] = rest
    values = bias_lane_values(lanes).astype(np.int64)
    if (q != 0).any() or (out < -128).any() or (out > 127).any() or not np.array_equal(out @ values, b):
        return None
    return out.astype(np.int8)
