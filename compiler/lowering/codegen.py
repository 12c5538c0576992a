"""Code generation: one quantized layer (conv2d, dense, residual add) -> accelerator instructions.

The layer's tensors live in DRAM in the packed layouts of :mod:`.layout`; the tiling comes from :mod:`.schedule`.
Each buffer (inp, wgt, acc/out) is split in two halves used alternately, and dependency tokens order the modules the
way VTA's runtime does with two virtual threads:

* reduction step ``k`` (a load of inputs and weights, then its GEMMs) uses inp/wgt half ``k % 2``: load pushes
  load->compute after its loads and compute pops before the GEMMs; compute pushes compute->load after them and the
  load of step ``k + 2`` (same half) pops it, so loads run ahead while the GEMMs work on the other half;
* output tile ``j`` uses acc/out half ``j % 2``: compute pushes compute->store after the requantization and the store
  pops it; the store pushes store->compute after its STOREs and compute pops it before tile ``j + 2``.

Per output tile of a convolution (all indices in entries of the named buffer)::

    LOAD ACC bias[, multiplier, shift]     per-channel constants, one acc entry per output block (each only when
                                           its ALU pass is emitted; none when a tile of the same output blocks left
                                           them in either part, or in its own part with concurrent_alu)
    [LOAD UOP]                             first tile: every micro-op kernel of the layer, while they fit together
    GEMM reset                             zero the tile (none with the gemm_overwrite knob: the first step's
                                           reset GEMM writes each output block's first products instead)
    [ALU ADD v | ALU MIN/MAX v]            a layer with a rounding (QMatMul): the accumulators start at v, the
                                           rounding divided by M modulo 2**32 (:func:`rounding_start`): an ADD
                                           after the reset, or, where the tile's entries still hold the clipped
                                           outputs of an earlier tile of the layer, one MIN (MAX) instead of both;
                                           a layer whose multipliers are all 1 starts at bias - 2**(S+8) the same
                                           way (:mod:`.requant`, the offset start: then SHR, MAX, MIN only)
    per reduction step: LOAD INP (one per input block, borders as load padding), LOAD WGT, [LOAD UOP], GEMM
    ALU ADD bias; [MUL M]; [RND]; SHR S; MAX lo; MIN hi     (M and S as immediates when per tensor, else tensors;
                                           RND, an ADD of the rounding, only when it did not fold into the start)
    STORE (one per output block)

A step over a single kernel row of a vertically strided convolution loads only the input rows that row reads (the
LOAD's row stride is the convolution's: a 1x1 stride-2 convolution loads half its input window). The last tile
requantizes and stores its output blocks in up to :data:`LAST_TILE_PARTS` groups (ALU passes, a token, the group's
STOREs), so that only the last group's stores follow the layer's last ALU pass.

A residual add loads both operands as ACC_8BIT (int8 widened), then ALU MUL Ma, MUL Mb, ADD, SHR, MAX, MIN, STORE.

With ``threads=1`` (no latency hiding, for comparison) each buffer is used whole and every step waits for the
previous one: the same protocol with distance 1 instead of 2.

Micro-op kernels are cached (:class:`UopCache`): a kernel is stored once in DRAM, and a layer's kernels are loaded
by one LOAD UOP at its start when they fit the uop buffer together (else in batches, each loaded where its first
kernel is needed). The layer's first reduction step comes in two parts (:meth:`.schedule.ConvTiling.tiles`), so that
the first GEMM waits for less than a whole step's loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_WGT, VTAConfig
from vta.isa import OP_LOAD, Alu, Gemm, Insn, Uop, insn_uops, layout, requant_imm, requant_word
from vta.packing import alloc_dtype
from vta.program import Allocation, Program, ProgramBuilder, SlotRing

from .intrin import Intrinsics, intrinsics
from .layout import INPUT, INPUT_B, OUTPUT, PackedWeight, pack_channel_vector, pack_weight
from .requant import OffsetStart, offset_start
from .schedule import ConvGeometry, ConvTile, ConvTiling, EltwiseTiling, plan_conv, plan_eltwise
from .uopcache import UopCache

__all__ = ["ConvLayer", "AddLayer", "LayerCode", "emit_conv", "emit_add", "build_conv_program", "build_add_program",
           "alu_passes", "fused_requant", "bias_image", "rounding_start", "LAST_TILE_PARTS"]



@dataclass(frozen=True, eq=False)
class ConvLayer:
    """A quantized convolution or dense layer, ready for the accelerator.

    ``geom``: shapes and blocks; ``weight``: packed weights; ``bias``: int32 [O] (rounding folded in);
    ``multiplier``/``shift``: int [O] requantization, ``lo``/``hi`` the clip range (per the operator contract).
    ``rounding``: a constant added after the multiplication and before the shift (0: none), QMatMul's rescale
    ``clip((acc * M + rounding) >> S)`` (:func:`..qops.rescale`); an ALU ADD of a constant acc entry (``RND``).
    ``weights_as_image``: the weights reach DRAM not blocked but as the packed activation image
    ``(1, NIB*groups, O/groups, 1, 1, BI)`` whose channels are the reduction and whose rows are a group's output
    channels (:func:`.matmul.pack_b_image`, the layout the accelerator's own layers write); the load unit gathers
    each output block's weight entries from it (one strided LOAD per output block). 1x1 kernels, batch 1 only.
    """

    geom: ConvGeometry
    weight: PackedWeight
    bias: np.ndarray
    multiplier: np.ndarray
    shift: np.ndarray
    lo: int
    hi: int
    rounding: int = 0
    weights_as_image: bool = False

    @classmethod
    def make(cls, x_shape: tuple[int, ...], w: np.ndarray, bias: np.ndarray, multiplier: np.ndarray,
             shift: np.ndarray, lo: int, hi: int, *, strides: tuple[int, int] = (1, 1),
             pads: tuple[int, int, int, int] = (0, 0, 0, 0), groups: int = 1, intr: Intrinsics,
             rounding: int = 0) -> "ConvLayer":
        """From NCHW (or ``[N, K]``) input shape and unpacked weights ``[O, C/groups, KH, KW]`` (or ``[O, K]``)."""
        geom = ConvGeometry.make(x_shape, np.shape(w), strides=strides, pads=pads, groups=groups, intr=intr)
        o = geom.o
        weight = pack_weight(np.asarray(w, dtype=np.int8), block_out=intr.block_out, block_in=intr.block_in,
                             groups=groups, in_channels=geom.c)
        vec = [np.broadcast_to(np.asarray(v, dtype=np.int64), (o,)) for v in (bias, multiplier, shift)]
        return cls(geom, weight, vec[0].astype(np.int32), vec[1], vec[2], int(lo), int(hi), int(rounding))

    @property
    def per_tensor(self) -> bool:
        """True when one (M, S) serves every channel (the ALU takes them as immediates)."""
        return bool((self.multiplier == self.multiplier[0]).all() and (self.shift == self.shift[0]).all())

    @property
    def out_shape(self) -> tuple[int, int, int, int]:
        """NCHW output shape."""
        return (self.geom.n, self.geom.o, self.geom.oh, self.geom.ow)


@dataclass(frozen=True)
class AddLayer:
    """A quantized residual add of two int8 tensors of NCHW ``shape``: ``clip((a*ma + b*mb) >> shift, lo, hi)``."""

    shape: tuple[int, ...]
    ma: int
    mb: int
    shift: int
    lo: int
    hi: int


@dataclass
class LayerCode:
    """What emitting a layer produced: the allocations of its tensors and compile-time counts.

    ``gemm_uops``/``alu_uops``: micro-op iterations the instructions will execute; ``tiles``: output tiles;
    ``tiling``: the plan (None for elementwise ops).
    """

    inputs: list[Allocation]
    output: Allocation
    gemm_uops: int = 0
    alu_uops: int = 0
    tiles: int = 0
    tiling: ConvTiling | None = None
    notes: dict[str, int] = field(default_factory=dict)


LAST_TILE_PARTS = 4
"""Groups of output blocks a conv's last tile is requantized and stored in (each group its ALU passes, a token,
its STOREs): the stores of one overlap the ALU passes of the next."""
# ---- convolution ------------------------------------------------------------------------------------------------
@dataclass
class _ConvState:
    """Emission state shared by the helpers of :func:`emit_conv`."""

    pb: ProgramBuilder
    intr: Intrinsics
    layer: ConvLayer
    t: ConvTiling
    uops: UopCache
    x: Allocation
    y: Allocation
    w: Allocation
    consts: Allocation
    code: LayerCode
    steps: SlotRing = field(init=False)
    """The inp/wgt parts: load -> compute, one use per reduction step."""
    outs: SlotRing = field(init=False)
    """The acc/out parts: compute -> store, one use per output tile."""
    bias_image: Allocation | None = None
    resident: dict[int, tuple[int, int]] = field(default_factory=dict)
    """acc part (virtual thread) -> ``(ob0, oct)`` of the per-channel constants it holds: a tile of the same output
    blocks reads them there instead of loading them again (from its own part only with ``concurrent_alu``, whose
    ALU engine may still be reading a part's constants while the front end loads the next tile's into it)."""
    fused: bool = False
    """Requantize with one ALU REQ (:func:`fused_requant`)."""
    const_slots: tuple[int, ...] = ()
    """The per-channel constants a tile loads (:func:`_const_slots`)."""
    max_pad: int = 0
    """The largest padding a LOAD's x_pad fields hold at this config."""
    gemm_kernels: dict[tuple, tuple[list[Uop], bytes]] = field(default_factory=dict)
    """The GEMM micro-op kernels built so far and their :meth:`UopCache.kernel_key`, by what determines them (see
    :func:`_gemm_kernel`): most tiles of a layer repeat a few kernels."""
    start: tuple[str, int] | None = None
    """``(MIN or MAX, v)``: the accumulators start at ``v`` (:func:`rounding_start`), else None."""
    offset: OffsetStart | None = None
    """The offset start (:func:`.requant.offset_start`), else None."""
    clipped: dict[int, list[int]] = field(default_factory=dict)
    """acc part base -> per output block of a tile, how many of its first entries hold a requantized output of this
    layer (in ``[lo, hi]``, lowered by 256 with the offset start): a tile whose entries all do starts with one MIN
    (MAX) of ``v``."""

    @property
    def half(self) -> dict[str, int]:
        """Entries of each buffer part a virtual thread owns (half with double buffering, else all)."""
        return {m: self.intr.capacity(m) // self.t.threads for m in ("inp", "wgt", "acc")}


def _row_pitch(s: _ConvState, kh0: int, kh1: int) -> int:
    """Input rows from one loaded row of a step's window to the next: the vertical stride when the step covers one
    kernel row (only every stride-th input row is read: the LOAD skips the others), else 1 (every row of the window
    is read by some kernel row, or rows come in groups a 2D LOAD cannot pick out)."""
    sh = s.layer.geom.sh
    return sh if kh1 - kh0 == 1 and sh > 1 else 1


def _tile_in_window(s: _ConvState, tile: ConvTile, kh0: int, kh1: int) -> tuple[int, int, int, int]:
    """``(row0, rows, col0, cols)`` of the input window a tile reads through kernel rows ``[kh0, kh1)``: first row
    and column (negative inside the top/left border) and the counts of rows (loaded rows, :func:`_row_pitch` input
    rows apart) and columns including borders. One input block takes ``rows * cols`` entries."""
    g = s.layer.geom
    row0 = tile.r0 * g.sh - g.pads[0] + kh0
    col0 = tile.c0 * g.sw - g.pads[1]
    rows = tile.toh if _row_pitch(s, kh0, kh1) > 1 else (tile.toh - 1) * g.sh + kh1 - kh0
    cols = (tile.tow - 1) * g.sw + g.kw
    return row0, rows, col0, cols


def _emit_loads(s: _ConvState, tile: ConvTile, step: tuple[int, int, int, int], inp_base: int,
                wgt_base: int) -> int:
    """LOAD INP (one per input block, borders as padding) and LOAD WGT of one reduction step; returns the first
    input block loaded."""
    g, pb = s.layer.geom, s.pb
    j0, j1, kh0, kh1 = step
    ib_lo = s.layer.weight.ib_lo
    first = int(ib_lo[tile.ob0]) + j0
    last = int(ib_lo[tile.ob0 + tile.oct - 1]) + j1
    row0, rows, col0, cols = _tile_in_window(s, tile, kh0, kh1)
    pitch = _row_pitch(s, kh0, kh1)
    block_entries = rows * cols
    # loaded row r < rows sits at input row row0 + r * pitch: those above row 0 or below the last are padding
    r0 = min(rows, -(-max(0, -row0) // pitch))
    r1 = max(r0, min(rows, -(-(g.h - row0) // pitch)))
    y0 = row0 + r0 * pitch
    x0, x1 = max(col0, 0), min(col0 + cols, g.w)
    x_addr = pb.elem_addr(s.x, MEM_INP)
    for k, ib in enumerate(range(first, last)):
        pb.load(MEM_INP, sram_base=inp_base + k * block_entries,
                dram_base=x_addr + ((tile.nbi * g.ib + ib) * g.h + max(y0, 0)) * g.w + x0,
                y_size=r1 - r0, x_size=x1 - x0, x_stride=g.w * pitch, y_pad_0=r0, y_pad_1=rows - r1,
                x_pad_0=x0 - col0, x_pad_1=col0 + cols - x1)
    # (ob, j, kh, kw) weights: a step's kernel rows of one block are contiguous, as are all rows of its blocks
    nib = s.layer.weight.nib
    if s.layer.weights_as_image:
        _emit_image_weight_loads(s, tile, j0, j1, wgt_base)
        return first
    pb.load(MEM_WGT, sram_base=wgt_base,
            dram_base=pb.elem_addr(s.w, MEM_WGT) + ((tile.ob0 * nib + j0) * g.kh + kh0) * g.kw,
            y_size=tile.oct, x_size=(j1 - j0) * (kh1 - kh0) * g.kw, x_stride=nib * g.kh * g.kw)
    return first


def _emit_image_weight_loads(s: _ConvState, tile: ConvTile, j0: int, j1: int, wgt_base: int) -> None:
    """LOAD WGT of a step from weights laid out as an activation image (:attr:`ConvLayer.weights_as_image`): output
    block ``ob``'s reduction block ``j`` is the wgt entry ``(ib_lo[ob] + j) * per + ob % per`` (``per`` output blocks
    per group: 16 image rows of one channel block make one 256-byte entry), so one LOAD per output block takes its
    ``j1 - j0`` entries ``per`` apart, into the step's usual ``[output block][reduction block]`` order."""
    g, ib_lo = s.layer.geom, s.layer.weight.ib_lo
    per = g.ob // g.groups
    w_addr = s.pb.elem_addr(s.w, MEM_WGT)
    for obl in range(tile.oct):
        ob = tile.ob0 + obl
        s.pb.load(MEM_WGT, sram_base=wgt_base + obl * (j1 - j0),
                  dram_base=w_addr + (int(ib_lo[ob]) + j0) * per + ob % per, y_size=j1 - j0, x_size=1, x_stride=per)


def _gemm_uops(s: _ConvState, tile: ConvTile, step: tuple[int, int, int, int], first: int, inp_base: int,
               wgt_base: int, acc_base: int) -> list[Uop]:
    """One GEMM micro-op per (output block, reduction block, kernel tap) of a step, at output pixel (0, 0)."""
    g = s.layer.geom
    j0, j1, kh0, kh1 = step
    _, rows, _, cols = _tile_in_window(s, tile, kh0, kh1)
    block_entries = rows * cols
    ib_lo = s.layer.weight.ib_lo
    kw_, nj = g.kw, j1 - j0
    taps = (kh1 - kh0) * kw_
    window = [kh * cols + kw for kh in range(kh1 - kh0) for kw in range(kw_)]  # tap -> inp offset in a block
    out = []
    for obl in range(tile.oct):
        dst = acc_base + obl * s.t.acc_tile
        inp0 = inp_base + (int(ib_lo[tile.ob0 + obl]) - first) * block_entries
        for j in range(j0, j1):
            src = inp0 + j * block_entries
            wgt = wgt_base + (obl * nj + j - j0) * taps
            out.extend([Uop(dst, src + off, wgt + tap) for tap, off in enumerate(window)])
    return out


def _gemm_kernel(s: _ConvState, tile: ConvTile, step: tuple[int, int, int, int], first: int, inp_base: int,
                 wgt_base: int, acc_base: int, overwrite: bool = False) -> tuple[list[Uop], bytes]:
    """:func:`_gemm_uops` and its kernel key, built once per distinct (input blocks each output block reads, step,
    window, bases). ``overwrite``: the micro-op that starts each output block first (``tile.oct`` of them, for a
    ``gemm_overwrite`` reset GEMM), then the others in their order."""
    _, rows, _, cols = _tile_in_window(s, tile, step[2], step[3])
    ib_lo = s.layer.weight.ib_lo
    key = (tuple(int(ib_lo[tile.ob0 + obl]) - first for obl in range(tile.oct)), step, rows, cols, inp_base,
           wgt_base, acc_base, overwrite)
    hit = s.gemm_kernels.get(key)
    if hit is None:
        uops = _gemm_uops(s, tile, step, first, inp_base, wgt_base, acc_base)
        if overwrite:  # each output block's micro-ops are contiguous, as many for every block
            per = len(uops) // tile.oct
            uops = uops[::per] + [u for k, u in enumerate(uops) if k % per]
        hit = s.gemm_kernels[key] = (uops, UopCache.kernel_key(uops))
    return hit


def _tile_uops(s: _ConvState, tile: ConvTile, acc_base: int, src_base: int | None) -> list[Uop]:
    """One micro-op per output block: dst = the block's first acc entry; src = ``src_base + block`` (or 0)."""
    return [Uop(acc_base + obl * s.t.acc_tile, 0 if src_base is None else src_base + obl)
            for obl in range(tile.oct)]


def _tile_loop(tile: ConvTile) -> tuple[int, int, int, int]:
    """``(iter_out, iter_in, dst_factor_out, dst_factor_in)`` walking a tile's rows and columns (acc entries)."""
    return tile.toh, tile.tow, tile.tow if tile.toh > 1 else 0, 1 if tile.tow > 1 else 0


def _alu_opcode(intr: Intrinsics, name: str, imm: int | None) -> int:
    """The opcode of ALU intrinsic ``name``, checking that ``imm`` fits its immediate."""
    op = intr.alu[name]
    if imm is not None and not op.imm_fits(imm):
        raise ValueError(f"ALU {name} immediate {imm} does not fit [{op.imm_min}, {op.imm_max}]")
    return op.opcode


def _emit_alu(s: _ConvState, tile: ConvTile, name: str, acc_base: int, blocks: tuple[int, int], *,
              imm: int | None = None, src_base: int | None = None) -> None:
    """ALU intrinsic ``name`` over the output blocks ``[b0, b1)`` of the tile, with the per-block acc operand
    ``src_base + block`` or else the immediate ``imm`` (REQ has both: its operand words and its clip range in the
    immediate field, ``use_imm`` clear)."""
    opcode = _alu_opcode(s.intr, "ADD" if name == "RND" else name, imm)
    bgn, _ = s.uops.place(_tile_uops(s, tile, acc_base, src_base))  # the whole tile's kernel; its blocks' part
    iter_out, iter_in, dst_out, dst_in = _tile_loop(tile)
    s.pb.alu(opcode, uop_bgn=bgn + blocks[0], uop_end=bgn + blocks[1], iter_out=iter_out, iter_in=iter_in,
             dst_factor_out=dst_out, dst_factor_in=dst_in, use_imm=src_base is None, imm=0 if imm is None else imm)


def _tile_prologue(s: _ConvState, tile: ConvTile) -> tuple[int, int]:
    """Start an output tile; returns ``(acc_base, const_base)``.

    Token protocol: claims the tile's acc/out part from the store module (:class:`~vta.program.SlotRing` ``s.outs``,
    compute -> store; from the ``threads``-th tile on, compute first pops the token the store pushed when it had
    stored the part's previous tile). Then, on the compute module: the per-channel constants (unless a tile of the
    same output blocks left them in a part it may read), the requantization's micro-op kernels made resident, and
    the accumulators' start (a reset GEMM, the bias image, or nothing with ``gemm_overwrite``; with a rounding that
    folds into the start, :func:`rounding_start`, one MIN/MAX of ``v`` where every entry of the tile holds a clipped
    output of an earlier tile of the layer, else the reset and an ADD of ``v``)."""
    half, threads = s.half, s.t.threads
    part = s.outs.claim()
    acc_base = part * half["acc"]
    # no GEMM/ALU writes the constants' entries; without concurrent_alu the compute module runs every instruction in
    # order, so a part's constants are read by the tiles before the next load into that part
    holders = [part] if s.intr.cfg.concurrent_alu else [part, *range(threads)]
    held = next((p for p in holders if s.resident.get(p) == (tile.ob0, tile.oct)), None)
    const_base = (part if held is None else held) * half["acc"] + s.t.oc_tile * s.t.acc_tile
    if held is None:
        _load_consts(s, tile, const_base)
        s.resident[part] = (tile.ob0, tile.oct)
    # the requantization's micro-op kernels are made resident now: a LOAD UOP just before the ALU passes would wait
    # for the previous tile's passes to finish with concurrent_alu
    for _, _, src_base in _requant_passes(s, const_base):
        s.uops.place(_tile_uops(s, tile, acc_base, src_base))
    if s.t.bias_load:
        _emit_bias_init(s, tile, acc_base)
        return acc_base, const_base
    slot, one_pass = (_CONST_SLOT["RND"], s.start[0]) if s.start is not None else \
        (_CONST_SLOT["ADD"], "MIN" if s.offset.min_start else None) if s.offset is not None else (None, None)
    start = None if slot is None else const_base + s.const_slots.index(slot) * s.t.oc_tile
    clipped = s.clipped.get(acc_base, [])
    if one_pass is not None and all(obl < len(clipped) and clipped[obl] >= tile.toh * tile.tow
                                    for obl in range(tile.oct)):
        # MIN(y, v) = v for y in [lo, hi] and v <= lo (MAX: v >= hi); the offset start's y and lo are lowered by 256
        _emit_alu(s, tile, one_pass, acc_base, (0, tile.oct), src_base=start)
        return acc_base, const_base
    if not _overwrites(s):
        bgn, end = s.uops.place(_tile_uops(s, tile, acc_base, None))
        iter_out, iter_in, dst_out, dst_in = _tile_loop(tile)
        s.pb.gemm(uop_bgn=bgn, uop_end=end, reset=True, iter_out=iter_out, iter_in=iter_in, dst_factor_out=dst_out,
                  dst_factor_in=dst_in)
    if start is not None:
        _emit_alu(s, tile, "ADD", acc_base, (0, tile.oct), src_base=start)
    return acc_base, const_base


def _overwrites(s: _ConvState) -> bool:
    """With ``gemm_overwrite`` (and no bias image): the first step's first micro-op per output block writes its
    products instead of accumulating, so no reset GEMM starts the tile."""
    return s.intr.cfg.gemm_overwrite and not s.t.bias_load


def _reduction_step(s: _ConvState, tile: ConvTile, step: tuple[int, int, int, int], acc_base: int,
                    starts: bool) -> None:
    """One reduction step of a tile: its inputs and weights loaded, then its GEMMs (``starts``: the tile's first
    step with ``gemm_overwrite``, whose first micro-op per output block overwrites).

    Token protocol (:class:`~vta.program.SlotRing` ``s.steps``, load -> compute): the load module claims the step's
    inp/wgt part (from the ``threads``-th step on it pops the token compute pushed when its GEMMs had read the part),
    loads, and hands off (pushes; compute pops before its GEMMs); after the GEMMs compute releases the part (pushes
    the token the step ``threads`` later pops, unless no such step comes)."""
    g, pb, half = s.layer.geom, s.pb, s.half
    part = s.steps.claim()
    inp_base, wgt_base = part * half["inp"], part * half["wgt"]
    first = _emit_loads(s, tile, step, inp_base, wgt_base)
    s.steps.handoff()
    bgn, end = s.uops.place(*_gemm_kernel(s, tile, step, first, inp_base, wgt_base, acc_base, starts))
    cols = _tile_in_window(s, tile, step[2], step[3])[3]
    row_step = g.sh // _row_pitch(s, step[2], step[3]) * cols  # inp entries from one output row to the next
    loops: dict[str, Any] = dict(iter_out=tile.toh, iter_in=tile.tow,
                                 dst_factor_out=tile.tow if tile.toh > 1 else 0,
                                 dst_factor_in=1 if tile.tow > 1 else 0,
                                 src_factor_out=row_step if tile.toh > 1 else 0,
                                 src_factor_in=g.sw if tile.tow > 1 else 0)
    if starts:
        pb.gemm(uop_bgn=bgn, uop_end=bgn + tile.oct, reset=True, **loops)
    if not starts or end > bgn + tile.oct:
        pb.gemm(uop_bgn=bgn + tile.oct if starts else bgn, uop_end=end, **loops)
    s.steps.release()


def _tile_epilogue(s: _ConvState, tile: ConvTile, acc_base: int, const_base: int, last: bool) -> None:
    """Requantize the tile and store it.

    Token protocol (``s.outs``, compute -> store): after each group's ALU passes compute hands the group to the
    store module (pushes; the store pops before its STOREs); after the STOREs the store releases the part (pushes
    the token the tile ``threads`` later pops, unless no such tile comes). The ``last`` tile goes in up to
    :data:`LAST_TILE_PARTS` groups of output blocks, so that a group's stores overlap the next group's ALU passes
    and only the last group's stores follow the layer's last ALU pass; other tiles in one group."""
    g, pb = s.layer.geom, s.pb
    n_parts = min(tile.oct, LAST_TILE_PARTS) if last else 1
    cuts = [tile.oct * p // n_parts for p in range(n_parts + 1)]
    out_addr = pb.elem_addr(s.y, MEM_OUT)
    clipped = s.clipped.setdefault(acc_base, [])
    clipped += [0] * (tile.oct - len(clipped))
    for obl in range(tile.oct):
        clipped[obl] = max(clipped[obl], tile.toh * tile.tow)
    for blocks in zip(cuts[:-1], cuts[1:]):
        _emit_requant(s, tile, acc_base, const_base, blocks)
        s.outs.handoff()
        for obl in range(*blocks):
            pb.store(sram_base=acc_base + obl * s.t.acc_tile,
                     dram_base=out_addr + ((tile.nbi * g.ob + tile.ob0 + obl) * g.oh + tile.r0) * g.ow + tile.c0,
                     y_size=tile.toh, x_size=tile.tow, x_stride=g.ow)
    s.outs.release()


def _load_consts(s: _ConvState, tile: ConvTile, const_base: int) -> None:
    """LOAD ACC the per-channel constants of the tile's output blocks: the ``k``-th of :attr:`_ConvState.const_slots`
    (DRAM row ``slot`` of :func:`conv_constants`) at ``const_base + k * oc_tile``. One 2D LOAD of a row per slot when
    the slots' DRAM rows are evenly spaced upwards and an edge tile's missing blocks fit the LOAD's x_pad_1 field (the
    padding writes zeros into entries no pass reads), else one LOAD per slot."""
    slots, oc, g = s.const_slots, s.t.oc_tile, s.layer.geom
    addr = s.pb.elem_addr(s.consts, MEM_ACC)
    gap = slots[1] - slots[0] if len(slots) > 1 else 0
    pad = oc - tile.oct
    if len(slots) > 1 and gap > 0 and all(b - a == gap for a, b in zip(slots, slots[1:])) and pad <= s.max_pad:
        s.pb.load(MEM_ACC, sram_base=const_base, dram_base=addr + slots[0] * g.ob + tile.ob0,
                  y_size=len(slots), x_size=tile.oct, x_stride=gap * g.ob, x_pad_1=pad)
        return
    for k, slot in enumerate(slots):
        s.pb.load(MEM_ACC, sram_base=const_base + k * oc, dram_base=addr + slot * g.ob + tile.ob0,
                  x_size=tile.oct)


def _emit_bias_init(s: _ConvState, tile: ConvTile, acc_base: int) -> None:
    """Start the tile's accumulators at the bias: LOAD ACC from the bias image (each output block's bias repeated
    for the ``acc_tile`` entries of a full tile); one LOAD for a full tile, one per output block for an edge tile
    (whose blocks are ``acc_tile`` entries apart but hold fewer pixels)."""
    assert s.bias_image is not None
    addr = s.pb.elem_addr(s.bias_image, MEM_ACC)
    per_block = tile.toh * tile.tow
    t_entries = s.t.acc_tile
    if per_block == t_entries:
        s.pb.load(MEM_ACC, sram_base=acc_base, dram_base=addr + tile.ob0 * t_entries, y_size=tile.oct,
                  x_size=t_entries, x_stride=t_entries)
        return
    for obl in range(tile.oct):
        s.pb.load(MEM_ACC, sram_base=acc_base + obl * t_entries, dram_base=addr + (tile.ob0 + obl) * t_entries,
                  x_size=per_block)


def fused_requant(layer: ConvLayer, intr: Intrinsics) -> bool:
    """True when ``layer`` requantizes with one ALU REQ: the config has the ``fused_requant`` knob and every M, S,
    lo and hi fits REQ's fields (16-bit signed M, S in [-32, 31], signed-byte clip bounds). A layer with a
    ``rounding`` (per tensor only) then requantizes with MUL M, RND and REQ with M = 1 (REQ has no rounding term)."""
    return ("REQ" in intr.alu and (not layer.rounding or layer.per_tensor)
            and bool((np.abs(layer.multiplier) < 1 << 15).all())
            and bool(((layer.shift >= -32) & (layer.shift < 32)).all())
            and -128 <= layer.lo <= layer.hi < 128)


def alu_passes(layer: ConvLayer, *, bias_load: bool = False, fused: bool = False, start: bool = False,
               offset: bool = False) -> list[str]:
    """The ALU intrinsics the requantization of ``layer`` applies to every output entry, in order: ADD bias
    (unless the bias was loaded as the accumulators' start, is zero, e.g. carried by im2col's bias lanes, or is part
    of the offset start, ``offset``: :func:`.requant.offset_start`, whose MAX and MIN bounds are lowered), MUL M,
    RND (an ADD of the layer's ``rounding``, when it has one and ``start`` did not fold it into the accumulators'
    start, :func:`rounding_start`), SHR S (MUL and SHR skipped when the identity), MAX lo, MIN hi; or with ``fused``
    (:func:`fused_requant`) ADD bias (unless loaded) and one REQ (a layer with a ``rounding``: MUL M, RND, and REQ
    with M = 1 doing SHR, MAX and MIN)."""
    ops = [] if bias_load or offset or not layer.bias.any() else ["ADD"]
    if fused:
        return ops + (["MUL", "RND", "REQ"] if layer.rounding else ["REQ"])
    if layer.per_tensor:
        ops += ["MUL"] if int(layer.multiplier[0]) != 1 else []
        ops += ["SHR"] if int(layer.shift[0]) != 0 else []
    else:
        ops += ["MUL"] if not (layer.multiplier == 1).all() else []
        ops += ["SHR"] if (layer.shift != 0).any() else []
    if layer.rounding and not start:
        ops.insert(len(ops) - (ops[-1:] == ["SHR"]), "RND")
    return ops + ["MAX", "MIN"]


def rounding_start(layer: ConvLayer, intr: Intrinsics) -> tuple[str, int] | None:
    """``(MIN or MAX, v)`` when the rounding of ``layer`` folds into its accumulators' start, else None.

    The rescale ``(acc * M + r) >> S`` (QMatMul's) equals ``((acc + v) * M) >> S`` for ``v`` with
    ``v * M = r (mod 2**32)``: the ALU and the GEMM core compute modulo 2**32, so the start ``v`` gives the same
    ``acc * M + r`` bits as the reset and the RND pass, for every input. Such a ``v`` exists when ``2**k`` (the power
    of two dividing M) divides ``r = 2**(S-1)``: ``v = (r / 2**k) * (M / 2**k)**-1 (mod 2**(32-k))``, the inverse of
    an odd number modulo a power of two, plus any multiple of ``2**(32-k)``. A tile starts at ``v`` with one pass
    where its entries still hold clipped outputs ``y`` in ``[lo, hi]`` of an earlier tile: ``MIN(y, v) = v`` for a
    ``v <= lo`` (``MAX`` for ``v >= hi``); elsewhere with the reset and an ADD. None (the RND pass stays) for a
    layer without a rounding or with per-channel (M, S), with ``fused_requant`` (REQ), ``gemm_overwrite`` or
    ``concurrent_alu``, or when no ``v`` lies outside ``(lo, hi)`` (M odd and ``v`` one of the 254 values inside:
    about one layer in 2**24)."""
    cfg = intr.cfg
    if not layer.rounding or not layer.per_tensor or fused_requant(layer, intr) or cfg.gemm_overwrite \
            or cfg.concurrent_alu:
        return None
    m, r = int(layer.multiplier[0]), int(layer.rounding)
    k = (m & -m).bit_length() - 1
    if r % (1 << k):
        return None
    period = 1 << (32 - k)
    first = (r >> k) * pow(m >> k, -1, period) % period
    for t in range(1 << k):
        v = (first + t * period) % (1 << 32)
        v -= (1 << 32) if v >= 1 << 31 else 0
        if v <= layer.lo:
            return "MIN", v
        if v >= layer.hi:
            return "MAX", v
    return None


_CONST_SLOT = {"ADD": 0, "REQ": 1, "MUL": 1, "SHR": 2, "RND": 3}
"""The slot of the per-channel constant an ALU pass reads (:func:`conv_constants`): 0 bias, 1 multiplier or REQ's
(M, S) word, 2 shift, 3 rounding."""


def _per_channel(layer: ConvLayer, name: str) -> bool:
    """Whether ALU pass ``name`` reads a per-channel constant (an acc operand); per-tensor multipliers and shifts
    are immediates, as are the clip bounds."""
    return name in ("ADD", "REQ", "RND") or (name in ("MUL", "SHR") and not layer.per_tensor)


def _const_slots(layer: ConvLayer, bias_load: bool, fused: bool, start: bool = False) -> tuple[int, ...]:
    """The slots of the per-channel constants a tile loads (:data:`_CONST_SLOT`): those of the ALU passes it emits
    (:func:`alu_passes`) that read a per-channel operand, and the rounding's slot for the accumulators' start
    (``start``, :func:`rounding_start`: it holds ``v`` then)."""
    slots = tuple(_CONST_SLOT[op] for op in alu_passes(layer, bias_load=bias_load, fused=fused, start=start)
                  if _per_channel(layer, op))
    return slots + (_CONST_SLOT["RND"],) if start else slots


def _requant_passes(s: _ConvState, const_base: int) -> list[tuple[str, int | None, int | None]]:
    """``(ALU intrinsic, immediate, per-block operand base)`` of each requantization pass of :func:`alu_passes`, in
    order: ADD bias, MUL M, SHR S, MAX lo, MIN hi (M and S immediates when per tensor); or ADD and one REQ (its
    immediate the clip range, its operand the (M, S) words)."""
    layer, oc = s.layer, s.t.oc_tile
    imms = {"REQ": requant_imm(layer.lo, layer.hi), "MAX": layer.lo, "MIN": layer.hi}
    if s.offset is not None:
        imms = {"MAX": s.offset.lo, "MIN": s.offset.hi}
    if layer.per_tensor:
        imms |= {"MUL": int(layer.multiplier[0]), "SHR": int(layer.shift[0])}
    return [(op, imms.get(op), const_base + s.const_slots.index(_CONST_SLOT[op]) * oc
             if _per_channel(layer, op) else None)
            for op in alu_passes(layer, bias_load=s.t.bias_load, fused=s.fused, start=s.start is not None,
                                 offset=s.offset is not None)]


def _emit_requant(s: _ConvState, tile: ConvTile, acc_base: int, const_base: int, blocks: tuple[int, int]) -> None:
    """The requantization passes (:func:`_requant_passes`, the operator contract's) over the output blocks
    ``[b0, b1)`` of the tile."""
    for name, imm, src_base in _requant_passes(s, const_base):
        _emit_alu(s, tile, name, acc_base, blocks, imm=imm, src_base=src_base)


def conv_constants(layer: ConvLayer, intr: Intrinsics, start: int | None = None) -> np.ndarray:
    """Bias, multiplier and shift packed as acc elements: int32 ``(3 * O/BO, B, BO)`` in that order; when the layer
    uses REQ (:func:`fused_requant`), bias and REQ's (M, S) words (:func:`vta.isa.requant_word`): ``(2 * O/BO, B,
    BO)``; a layer with ``rounding`` adds it as a fourth row (``(4 * O/BO, B, BO)``; with REQ the words are of
    M = 1 and the third row is unused), or instead the accumulators' start ``start`` (:func:`rounding_start`)."""
    rows: tuple[np.ndarray, ...]
    if fused_requant(layer, intr) and layer.rounding:  # MUL M and RND first, then REQ's (1, S): rows 0, 1, -, 3
        words = np.array([requant_word(1, int(sh)) for sh in layer.shift], np.int64)
        rows = (layer.bias, words, np.zeros(layer.geom.o, np.int64), np.full(layer.geom.o, layer.rounding, np.int64))
    elif fused_requant(layer, intr):
        words = np.array([requant_word(int(m), int(sh)) for m, sh in zip(layer.multiplier, layer.shift)], np.int64)
        rows = (layer.bias, words)
    else:
        rows = (layer.bias, layer.multiplier, layer.shift)
        if layer.rounding:
            rows += (np.full(layer.geom.o, layer.rounding if start is None else start, np.int64),)
    vecs = [pack_channel_vector(v.astype(np.int64).astype(np.int32), batch=intr.batch, block_out=intr.block_out)
            for v in rows]
    return np.concatenate(vecs, axis=0)


def bias_image(layer: ConvLayer, intr: Intrinsics, entries: int) -> np.ndarray:
    """The bias of every output block repeated ``entries`` times, as acc elements: int32 ``(O/BO * entries, B,
    BO)`` (what a tile's accumulators start at when the tiling loads the bias)."""
    packed = pack_channel_vector(layer.bias.astype(np.int32), batch=intr.batch, block_out=intr.block_out)
    return np.repeat(packed, entries, axis=0)


def emit_conv(pb: ProgramBuilder, layer: ConvLayer, x: Allocation, y: Allocation, *, prefix: str = "",
              tiling: ConvTiling | None = None, threads: int = 2) -> LayerCode:
    """Emit a whole convolution/dense layer reading packed ``x`` and writing packed ``y`` (allocations of ``pb``).

    Weights and constants are allocated in ``pb`` as ``{prefix}w`` and ``{prefix}consts``. ``threads``: 2 virtual
    threads (double buffering, latency hiding) or 1 (each step waits for the previous one); ignored when
    ``tiling`` is given (it carries its own).
    """
    intr = intrinsics(pb.cfg)
    first_insn = len(pb.insns)
    t = tiling or plan_conv(layer.geom, intr, threads=threads)
    wdata = layer.weight.data
    if layer.weights_as_image:  # the same bytes, shaped as the activation image the runtime binds
        g = layer.geom
        wdata = np.zeros((1, g.ib, g.o // g.groups, 1, 1, intr.block_in), np.int8)
    w = pb.alloc(f"{prefix}w", wdata, alloc_dtype(pb.cfg.wgt_width))  # int4 packed on a w4 design
    start = None if t.bias_load else rounding_start(layer, intr)
    offset = None if t.bias_load else offset_start(layer, intr)
    consts = pb.alloc(f"{prefix}consts", offset.constants(intr) if offset is not None else
                      conv_constants(layer, intr, None if start is None else start[1]))
    tiles = list(t.tiles())
    code = LayerCode([x], y, tiles=len(tiles), tiling=t)
    fused = fused_requant(layer, intr)
    s = _ConvState(pb, intr, layer, t, UopCache(pb, intr, prefix, preload=True), x, y, w, consts, code, fused=fused,
                   const_slots=offset.slots() if offset is not None else
                   _const_slots(layer, t.bias_load, fused, start is not None), start=start, offset=offset,
                   max_pad=(1 << layout(intr.cfg).field(OP_LOAD, "x_pad_1").width) - 1)
    if t.bias_load:
        s.bias_image = pb.alloc(f"{prefix}bias_init", bias_image(layer, intr, t.acc_tile))
    s.steps = SlotRing(pb, "load", "compute", t.threads, total=sum(len(tile.steps) for tile in tiles))
    s.outs = SlotRing(pb, "compute", "store", t.threads, total=len(tiles))
    for index, tile in enumerate(tiles):
        acc_base, const_base = _tile_prologue(s, tile)
        for si, step in enumerate(tile.steps):
            _reduction_step(s, tile, step, acc_base, starts=si == 0 and _overwrites(s))
        _tile_epilogue(s, tile, acc_base, const_base, last=index == len(tiles) - 1)
    s.uops.close()
    s.code.notes["uop_loads"] = s.uops.loads
    _count_uops(s.code, pb.insns[first_insn:])
    return s.code


# ---- residual add -----------------------------------------------------------------------------------------------
def _add_fuses(layer: AddLayer, intr: Intrinsics) -> bool:
    """True when a residual add's SHR, MAX, MIN can be one REQ (M = 1): the knob is on and S, lo, hi fit REQ."""
    return "REQ" in intr.alu and -32 <= layer.shift < 32 and -128 <= layer.lo <= layer.hi < 128


def emit_add(pb: ProgramBuilder, layer: AddLayer, a: Allocation, b: Allocation, y: Allocation, *,
             prefix: str = "", threads: int = 2) -> LayerCode:
    """Emit a residual add over packed ``a`` and ``b`` into packed ``y`` (same packed shape); ``threads`` as in
    :func:`emit_conv`. With the ``fused_requant`` knob the SHR, MAX, MIN after the ADD are one REQ (M = 1)."""
    intr = intrinsics(pb.cfg)
    first_insn = len(pb.insns)
    entries = int(np.prod(a.shape[:4]))
    plan = plan_eltwise(entries, intr, threads=threads)
    uops = UopCache(pb, intr, prefix, preload=True)
    code = LayerCode([a, b], y, tiles=0)
    half = intr.capacity("acc") // threads
    fused = _add_fuses(layer, intr)
    req = None
    if fused:  # SHR, MAX, MIN as one REQ (M = 1): its operand entry sits after b's, so a tile may need one entry less
        if 2 * plan.tile + 1 > half:
            plan = EltwiseTiling(entries, plan.tile - 1, threads)
        word = np.full((1, intr.batch, intr.block_out), requant_word(1, layer.shift), np.int32)
        req = pb.elem_addr(pb.alloc(f"{prefix}req", word), MEM_ACC)
    tiles = list(plan.tiles())
    a_addr, b_addr = pb.elem_addr(a, MEM_ACC_8BIT), pb.elem_addr(b, MEM_ACC_8BIT)
    outs = SlotRing(pb, "compute", "store", threads, total=len(tiles))  # acc/out parts, as a convolution's tiles
    for e0, count in tiles:
        base_a = outs.claim() * half
        base_b = base_a + plan.tile
        pb.load(MEM_ACC_8BIT, sram_base=base_a, dram_base=a_addr + e0, x_size=count)
        pb.load(MEM_ACC_8BIT, sram_base=base_b, dram_base=b_addr + e0, x_size=count)
        ops: list[tuple[str, int, int | None]] = []
        if layer.ma != 1:
            ops.append(("MUL", base_a, layer.ma))
        if layer.mb != 1:
            ops.append(("MUL", base_b, layer.mb))
        ops.append(("ADD", base_a, None))
        if req is None:
            if layer.shift:
                ops.append(("SHR", base_a, layer.shift))
            ops += [("MAX", base_a, layer.lo), ("MIN", base_a, layer.hi)]
        else:
            pb.load(MEM_ACC, sram_base=base_b + plan.tile, dram_base=req, x_size=1)
        for name, dst, imm in ops:
            bgn, end = uops.place([Uop(dst, 0 if imm is not None else base_b)])
            pb.alu(_alu_opcode(intr, name, imm), uop_bgn=bgn, uop_end=end, iter_out=count, dst_factor_out=1,
                   src_factor_out=0 if imm is not None else 1, use_imm=imm is not None, imm=imm or 0)
        if req is not None:  # every entry reads the one REQ word entry (src factor 0)
            bgn, end = uops.place([Uop(base_a, base_b + plan.tile)])
            pb.alu(intr.alu["REQ"].opcode, uop_bgn=bgn, uop_end=end, iter_out=count, dst_factor_out=1,
                   imm=requant_imm(layer.lo, layer.hi))
        outs.handoff()
        pb.store(sram_base=base_a, dram_base=pb.elem_addr(y, MEM_OUT) + e0, x_size=count)
        outs.release()
        code.tiles += 1
    uops.close()
    _count_uops(code, pb.insns[first_insn:])
    return code


def _count_uops(code: LayerCode, insns: list[Insn]) -> None:
    """Set ``code``'s micro-op counts from the layer's instructions (:func:`vta.isa.insn_uops`)."""
    code.gemm_uops = sum(insn_uops(i) for i in insns if isinstance(i, Gemm))
    code.alu_uops = sum(insn_uops(i) for i in insns if isinstance(i, Alu))


# ---- whole programs for one layer -------------------------------------------------------------------------------
def build_conv_program(cfg: VTAConfig, layer: ConvLayer, x_packed: np.ndarray | None = None,
                       tiling: ConvTiling | None = None, *, threads: int = 2) -> tuple[Program, LayerCode]:
    """A program computing one conv/dense layer: input allocation ``x`` (packed; zeros when ``x_packed`` is None),
    output ``y`` (packed ``(N/B, O/BO, OH, OW, B, BO)`` int8)."""
    intr = intrinsics(cfg)
    g = layer.geom
    pb = ProgramBuilder(cfg)
    act = alloc_dtype(cfg.inp_width)  # activations: int8, or int4 packed two per byte (vta.packing)
    x = pb.alloc(INPUT, x_packed if x_packed is not None else (g.nb, g.ib, g.h, g.w, intr.batch, intr.block_in), act)
    y = pb.alloc(OUTPUT, (g.nb, g.ob, g.oh, g.ow, intr.batch, intr.block_out), act)
    code = emit_conv(pb, layer, x, y, tiling=tiling, threads=threads)
    return pb.finish(), code


def build_add_program(cfg: VTAConfig, layer: AddLayer, a_packed: np.ndarray | tuple[int, ...],
                      b_packed: np.ndarray | None = None, *, threads: int = 2) -> tuple[Program, LayerCode]:
    """A program computing one residual add: inputs ``x`` and ``x_b``, output ``y`` (all packed, same shape).

    ``a_packed`` is the packed data of ``a`` or just its packed shape (inputs zero-filled)."""
    pb = ProgramBuilder(cfg)
    act = alloc_dtype(cfg.inp_width)  # activations: int8, or int4 packed two per byte (vta.packing)
    if isinstance(a_packed, tuple):
        a = pb.alloc(INPUT, a_packed, act)
        b = pb.alloc(INPUT_B, a_packed, act)
        shape = a_packed
    else:
        a = pb.alloc(INPUT, a_packed, act)
        b = pb.alloc(INPUT_B, b_packed if b_packed is not None else np.zeros_like(a_packed), act)
        shape = a_packed.shape
    y = pb.alloc(OUTPUT, tuple(shape), act)
    code = emit_add(pb, layer, a, b, y, threads=threads)
    return pb.finish(), code
