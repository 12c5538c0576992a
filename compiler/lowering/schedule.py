"""Tiling: how a convolution, dense layer or residual add is cut into pieces that fit the config's buffers.

Everything here is pure arithmetic on shapes (no program is built): :mod:`.codegen` walks the tiles a plan yields.

A convolution (dense layers are 1x1 convolutions on a 1x1 image) is described by :class:`ConvGeometry`, in blocks
of the packed layouts of :mod:`.layout`. A :class:`ConvTiling` cuts its output into tiles of ``oc_tile`` output
blocks x ``oh_tile`` rows x ``ow_tile`` columns (one batch block at a time); the reduction over input blocks is cut
into steps of ``ic_tile`` blocks (of the NIB blocks each output block reads) and, when even one block of weights
does not fit, of ``kh_tile`` kernel rows (then ``ic_tile`` is 1). With double buffering the layer's first step, when
it has one input block, comes as its first kernel row and then the others (:meth:`ConvTiling._lead`), so that its
GEMMs start after one row's loads rather than the whole step's. Each buffer is split in two halves, one per virtual
thread (double buffering), so a tile must fit half of each buffer:

* inp: ``in_blocks * in_rows * in_cols`` entries (the input window including the convolution's zero borders, which
  the load unit writes as padding);
* wgt: ``oc_tile * ic_tile * kh_tile * KW`` entries; the same number of GEMM micro-ops;
* acc: ``oc_tile * oh_tile * ow_tile`` entries plus ``3 * oc_tile`` for bias, multiplier and shift.

:func:`plan_conv` applies a few small rules (see its docstring) and picks the feasible tiling that moves the fewest
bytes. :func:`plan_eltwise` tiles the residual add.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Iterator

import numpy as np

from vta.config import VTAConfig

from .intrin import MAX_LOAD_PAD, Intrinsics, intrinsics
from .layout import ceil_div, group_block_ranges

__all__ = ["ScheduleError", "ConvGeometry", "ConvTiling", "ConvTile", "plan_conv", "conv_candidates",
           "EltwiseTiling", "plan_eltwise", "CONST_SLOTS", "ORDERS"]

CONST_SLOTS = 3
"""acc entries reserved per output block of a tile: bias, requant multiplier, requant shift."""
ORDERS = ("oc", "pixel")
"""Tile loop orders: ``oc`` walks output blocks outside rows and columns (weights of a block group reused by
consecutive tiles), ``pixel`` walks rows and columns outside the output blocks (one input window reused)."""


class ScheduleError(ValueError):
    """A layer cannot be tiled for this config (it then runs on the CPU); the message says which limit it hits."""


@dataclass(frozen=True)
class ConvGeometry:
    """A (grouped) 2D convolution in elements and blocks.

    ``n, c, h, w``: input NCHW; ``o``: output channels; ``kh, kw``: kernel; ``sh, sw``: strides; ``pads``: (top,
    left, bottom, right) zero padding; ``groups``. Block counts follow the packed layouts: ``nb = N/B``,
    ``ib = C/BI``, ``ob = O/BO``; ``ib_lo``/``nib`` from :func:`~.layout.group_block_ranges`.
    """

    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    sh: int
    sw: int
    pads: tuple[int, int, int, int]
    groups: int
    batch: int
    block_in: int
    block_out: int

    @classmethod
    def make(cls, x_shape: tuple[int, ...], w_shape: tuple[int, ...], *, strides: tuple[int, int] = (1, 1),
             pads: tuple[int, int, int, int] = (0, 0, 0, 0), groups: int = 1, intr: Intrinsics) -> "ConvGeometry":
        """From NCHW (or ``[N, K]``) input and ``[O, C/groups, KH, KW]`` (or ``[O, K]``) weight shapes."""
        if len(x_shape) == 2:
            x_shape = (x_shape[0], x_shape[1], 1, 1)
        if len(w_shape) == 2:
            w_shape = (w_shape[0], w_shape[1], 1, 1)
        n, c, h, w = (int(v) for v in x_shape)
        o, cg, kh, kw = (int(v) for v in w_shape)
        if cg * groups != c:
            raise ScheduleError(f"weights {tuple(w_shape)} with groups={groups} do not match {c} input channels")
        top, left, bottom, right = (int(p) for p in pads)
        return cls(n, c, h, w, o, kh, kw, int(strides[0]), int(strides[1]), (top, left, bottom, right),
                   int(groups), intr.batch, intr.block_in, intr.block_out)

    @cached_property
    def oh(self) -> int:
        return (self.h + self.pads[0] + self.pads[2] - self.kh) // self.sh + 1

    @cached_property
    def ow(self) -> int:
        return (self.w + self.pads[1] + self.pads[3] - self.kw) // self.sw + 1

    @cached_property
    def nb(self) -> int:
        return ceil_div(self.n, self.batch)

    @cached_property
    def ib(self) -> int:
        return ceil_div(self.c, self.block_in)

    @cached_property
    def ob(self) -> int:
        return ceil_div(self.o, self.block_out)

    @cached_property
    def block_ranges(self) -> tuple[np.ndarray, int]:
        """``(ib_lo [ob], nib)``: the input blocks each output block reads."""
        return group_block_ranges(self.o, self.c, self.groups, self.block_out, self.block_in)

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the layer (the useful ones, not the padded blocks)."""
        return self.n * self.o * self.oh * self.ow * (self.c // self.groups) * self.kh * self.kw


@dataclass(frozen=True)
class ConvTile:
    """One output tile: batch block ``nbi``, output blocks ``[ob0, ob0 + oct)``, rows ``[r0, r0 + toh)``, columns
    ``[c0, c0 + tow)``, and its reduction steps: ``(j0, j1, kh0, kh1)``, ranges of the NIB input blocks and of
    the kernel rows (steps whose input rows all lie in the zero border are left out: they add nothing)."""

    nbi: int
    ob0: int
    oct: int
    r0: int
    toh: int
    c0: int
    tow: int
    steps: tuple[tuple[int, int, int, int], ...]


@dataclass(frozen=True)
class ConvTiling:
    """Tile sizes (maxima; edge tiles are smaller) of a convolution; see the module docstring."""

    geom: ConvGeometry
    oc_tile: int
    ic_tile: int
    oh_tile: int
    ow_tile: int
    kh_tile: int = 0
    threads: int = 2
    order: str = "oc"
    bias_load: bool = False
    """True: each tile's accumulators start as the bias (a LOAD ACC of a bias image) instead of a GEMM reset and
    an ALU ADD of the bias after the reduction."""

    def __post_init__(self) -> None:
        if self.threads not in (1, 2):
            raise ValueError(f"threads must be 1 (no latency hiding) or 2 (double buffering), not {self.threads!r}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {self.order!r}")
        if self.kh_tile == 0:
            object.__setattr__(self, "kh_tile", self.geom.kh)

    @property
    def in_rows(self) -> int:
        """Input rows (with borders) a full tile reads per step: with one kernel row per step and a vertical stride,
        only the rows that kernel row reads (one per output row, the LOAD skipping the others)."""
        if self.kh_tile == 1 and self.geom.sh > 1:
            return self.oh_tile
        return (self.oh_tile - 1) * self.geom.sh + self.kh_tile

    @property
    def in_cols(self) -> int:
        """Input columns (with borders) a full tile reads: the row pitch of the inp tile, entries."""
        return (self.ow_tile - 1) * self.geom.sw + self.geom.kw

    def in_blocks(self, oct: int | None = None, ict: int | None = None) -> int:
        """Largest number of input blocks any tile of ``oct`` output blocks and ``ict`` reduction blocks reads."""
        oct = self.oc_tile if oct is None else oct
        ict = self.ic_tile if ict is None else ict
        if self.geom.groups == 1:
            return ict
        lo, _ = self.geom.block_ranges
        spans = [int(lo[min(b + oct, len(lo)) - 1] - lo[b]) for b in range(0, len(lo), oct)]
        return max(spans) + ict

    @property
    def inp_entries(self) -> int:
        return self.in_blocks() * self.in_rows * self.in_cols

    @property
    def wgt_entries(self) -> int:
        return self.oc_tile * self.ic_tile * self.kh_tile * self.geom.kw

    @property
    def acc_tile(self) -> int:
        """acc entries of one output block of a full tile (``T``): the stride between output blocks."""
        return self.oh_tile * self.ow_tile

    @property
    def acc_entries(self) -> int:
        return self.oc_tile * (self.acc_tile + CONST_SLOTS)

    def tiles(self) -> Iterator[ConvTile]:
        """Every output tile, in execution order: batch block, then output blocks, rows, columns (``order`` "oc")
        or rows, columns, output blocks (``order`` "pixel"); the first tile's first step in parts (:meth:`_lead`)."""
        g = self.geom
        _, nib = g.block_ranges
        steps = [(j, min(j + self.ic_tile, nib), k, min(k + self.kh_tile, g.kh))
                 for j in range(0, nib, self.ic_tile) for k in range(0, g.kh, self.kh_tile)]
        blocks = range(0, g.ob, self.oc_tile)
        pixels = [(r0, c0) for r0 in range(0, g.oh, self.oh_tile) for c0 in range(0, g.ow, self.ow_tile)]
        pairs = [(ob0, px) for ob0 in blocks for px in pixels] if self.order == "oc" else \
            [(ob0, px) for px in pixels for ob0 in blocks]
        live: dict[int, tuple[tuple[int, int, int, int], ...]] = {}
        first = True
        for nbi in range(g.nb):
            for ob0, (r0, c0) in pairs:
                toh = min(self.oh_tile, g.oh - r0)
                if r0 not in live:
                    live[r0] = tuple(st for st in steps if self._has_rows(r0, toh, st[2], st[3]))
                tile_steps = live[r0]
                if first and tile_steps and self.threads > 1:
                    tile_steps = self._lead(r0, toh, tile_steps[0]) + tile_steps[1:]
                first = False
                yield ConvTile(nbi, ob0, min(self.oc_tile, g.ob - ob0), r0, toh, c0, min(self.ow_tile, g.ow - c0),
                               tile_steps)

    def _lead(self, r0: int, toh: int, step: tuple[int, int, int, int]) -> tuple[tuple[int, int, int, int], ...]:
        """The layer's first step as two: its first kernel row, then the others (a part that reads only the zero
        border left out), so that the GEMMs start after one row's loads (the loads before the first GEMM are the
        layer's start-up time) while the other rows load into the other buffer half. Only a step of one input block
        and several kernel rows is cut (a part of several blocks and some of the kernel rows would not be one 2D
        LOAD of weights), and only with double buffering (with one thread the second part would wait for the
        first)."""
        j0, j1, k0, k1 = step
        if j1 - j0 > 1 or k1 - k0 < 2:
            return (step,)
        return tuple(st for st in ((j0, j1, k0, k0 + 1), (j0, j1, k0 + 1, k1)) if self._has_rows(r0, toh, st[2], st[3]))

    def _has_rows(self, r0: int, toh: int, kh0: int, kh1: int) -> bool:
        """True when output rows ``[r0, r0 + toh)`` read some real input row through kernel rows [kh0, kh1)."""
        g = self.geom
        first = r0 * g.sh - g.pads[0] + kh0
        last = (r0 + toh - 1) * g.sh - g.pads[0] + kh1 - 1
        return last >= 0 and first < g.h

    def work_bound(self, intr: Intrinsics, alu_ops: int, const_loads: int) -> int:
        """A quick estimate of the layer's cycles, to rank candidate tilings before building their programs: the
        busiest module's work (compute: constant loads, reset or bias load, GEMM and ``alu_ops`` ALU passes, each
        instruction with its loop overhead; load: input windows and weights, one 16-beat wgt entry per micro-op;
        store: output entries) with double buffering, the sum of the three without; with ``concurrent_alu`` and
        double buffering the ALU passes count apart from the rest of compute (their own engine). ``const_loads``:
        LOAD ACC of per-channel constants per tile. Edge tiles are counted as full tiles, so this is an upper-ish
        estimate."""
        g, cfg = self.geom, intr.cfg
        oc_tile, acc_tile, wgt_entries = self.oc_tile, self.acc_tile, self.wgt_entries
        in_window = self.in_rows * self.in_cols
        tiles = g.nb * -(-g.ob // oc_tile) * -(-g.oh // self.oh_tile) * -(-g.ow // self.ow_tile)
        _, nib = g.block_ranges
        steps = -(-nib // self.ic_tile) * -(-g.kh // self.kh_tile)
        latency = cfg.dram_latency + 8
        pix = oc_tile * acc_tile
        bus, dma = cfg.bus_bytes, intr.dma
        acc_beats = max(1, dma["acc"].elem_bytes // bus)
        # the accumulators' start: the bias loaded, a reset GEMM, or (gemm_overwrite) a split first GEMM
        init = (latency + pix * acc_beats) if self.bias_load else 8 if cfg.gemm_overwrite else (pix + 8)
        compute = tiles * (const_loads * (latency + oc_tile * acc_beats) + init + steps * (wgt_entries * acc_tile + 8))
        tile_alu = alu_ops * (pix + 8)
        # with concurrent_alu the ALU passes run on their own engine beside the GEMMs (two virtual threads only),
        # but the last tile's run after its GEMMs
        overlap = cfg.concurrent_alu and self.threads > 1
        compute = max(compute, tiles * tile_alu) if overlap else compute + tiles * tile_alu
        wgt_beats = max(1, dma["wgt"].elem_bytes // bus)
        inp_beats = max(1, dma["inp"].elem_bytes // bus)
        load = tiles * steps * (self.in_blocks() * (latency + in_window * inp_beats)
                                + latency + wgt_entries * wgt_beats)
        out_beats = max(1, dma["out"].elem_bytes // bus)
        store = tiles * (oc_tile * (3 + acc_tile * out_beats) + 4)
        if self.threads == 1:
            return compute + load + store
        first = latency + in_window * inp_beats + wgt_entries * wgt_beats
        return max(compute, load, store) + first + pix * out_beats + (tile_alu if overlap else 0)

    def dma_bytes(self, intr: Intrinsics) -> int:
        """Estimated bytes loaded and stored by the whole layer (the cost the planner minimizes)."""
        g = self.geom
        n_oc, n_oh, n_ow = ceil_div(g.ob, self.oc_tile), ceil_div(g.oh, self.oh_tile), ceil_div(g.ow, self.ow_tile)
        tiles = g.nb * n_oc * n_oh * n_ow
        _, nib = g.block_ranges
        inp = tiles * ceil_div(nib, self.ic_tile) * ceil_div(g.kh, self.kh_tile) * self.inp_entries * \
            intr.dma["inp"].elem_bytes
        wgt = g.nb * n_oh * n_ow * g.ob * nib * g.kh * g.kw * intr.dma["wgt"].elem_bytes
        out = g.nb * g.ob * g.oh * g.ow * intr.dma["out"].elem_bytes
        steps = ceil_div(nib, self.ic_tile) * ceil_div(g.kh, self.kh_tile)
        insns = tiles * (steps * (self.in_blocks() + 2) + 8 + self.oc_tile)
        return inp + wgt + out + insns * intr.insn_bytes

    @property
    def _part(self) -> str:
        return "half" if self.threads == 2 else "all of"

    def check(self, intr: Intrinsics) -> list[str]:
        """Every buffer or field limit this tiling breaks (empty when it fits)."""
        half = {m: intr.capacity(m) // self.threads for m in ("inp", "wgt", "acc")}
        problems = []
        if self.kh_tile < self.geom.kh and self.ic_tile != 1:
            problems.append(f"splitting kernel rows ({self.kh_tile} of {self.geom.kh}) needs one input block per "
                            f"step, not {self.ic_tile}")
        if self.inp_entries > half["inp"]:
            problems.append(f"the input tile needs {self.inp_entries} inp entries, more than {self._part} the "
                            f"buffer ({half['inp']})")
        if self.wgt_entries > half["wgt"]:
            problems.append(f"the weight tile needs {self.wgt_entries} wgt entries, more than {self._part} the "
                            f"buffer ({half['wgt']})")
        if self.acc_entries > half["acc"]:
            problems.append(f"the output tile needs {self.acc_entries} acc entries, more than {self._part} the "
                            f"buffer ({half['acc']})")
        if self.wgt_entries > intr.uop_depth // 4:
            problems.append(f"the tile needs {self.wgt_entries} GEMM micro-ops, more than a quarter of the uop "
                            f"buffer ({intr.uop_depth // 4})")
        if max(self.acc_tile, self.oh_tile, self.ow_tile) > intr.loop_max:
            problems.append(f"a tile of {self.acc_tile} entries exceeds the {intr.loop_max}-iteration loop limit")
        return problems


def _halvings(n: int) -> list[int]:
    """``n, ceil(n/2), ceil(n/4), ..., 1``."""
    out = [n]
    while out[-1] > 1:
        out.append(ceil_div(out[-1], 2))
    return out


def _reduction_candidates(nib: int, kh: int) -> list[tuple[int, int]]:
    """``(ic_tile, kh_tile)`` pairs: every halving of NIB with all kernel rows, then one block with fewer rows."""
    return [(ict, kh) for ict in _halvings(nib)] + [(1, kht) for kht in _halvings(kh)[1:]]


def _check_geometry(g: ConvGeometry) -> None:
    if max(g.pads) > MAX_LOAD_PAD:
        raise ScheduleError(f"padding {g.pads} exceeds the {MAX_LOAD_PAD} elements the load unit can insert")
    if g.oh < 1 or g.ow < 1:
        raise ScheduleError(f"the convolution produces an empty {g.oh}x{g.ow} output")
    for hi, size, stride, k, pad in ((g.oh, g.h, g.sh, g.kh, g.pads[0]), (g.ow, g.w, g.sw, g.kw, g.pads[1])):
        # An output row whose whole window lies in the padding would need a LOAD of zero real rows.
        if pad >= k or (hi - 1) * stride - pad >= size:
            raise ScheduleError(f"some output pixels read only padding (kernel {k}, stride {stride}, padding {pad} "
                                f"on an input of {size}); the load unit cannot produce them")


def _max_rows(t: ConvTiling, intr: Intrinsics) -> int:
    """The most output rows a tile with ``t``'s other sizes can take (0 when even one row does not fit): the
    largest ``oh_tile`` in ``[1, geom.oh]`` for which :meth:`ConvTiling.check` finds nothing, in closed form (each
    limit of ``check`` that depends on the rows bounds them; the others allow any number or none)."""
    g = t.geom
    half = {m: intr.capacity(m) // t.threads for m in ("inp", "wgt", "acc")}
    if (t.kh_tile < g.kh and t.ic_tile != 1) or t.wgt_entries > half["wgt"] or \
            t.wgt_entries > intr.uop_depth // 4 or t.ow_tile > intr.loop_max:
        return 0
    rows_in = half["inp"] // (t.in_blocks() * t.in_cols)  # input rows of the tile (ConvTiling.in_rows)
    if t.kh_tile == 1 and g.sh > 1:
        by_inp = rows_in  # one loaded row per output row
    else:
        by_inp = (rows_in - t.kh_tile) // g.sh + 1 if rows_in >= t.kh_tile else 0
    by_acc = max(0, half["acc"] // t.oc_tile - CONST_SLOTS) // t.ow_tile  # oc * (oh * ow + CONST_SLOTS) entries
    by_loop = intr.loop_max // t.ow_tile  # oh * ow iterations (and oh) at most loop_max
    return max(0, min(g.oh, by_inp, by_acc, by_loop))


def plan_conv(geom: ConvGeometry, intr: Intrinsics, *, threads: int = 2) -> ConvTiling:
    """The tiling of ``geom`` for ``intr``'s buffers. Rules, applied to every candidate:

    1. output blocks per tile: any count up to 16, or a halving or divisor of all (``oc_tile``);
    2. reduction blocks per step: all NIB, or halved until the weights fit (``ic_tile``); with one block, also the
       kernel rows halved (``kh_tile``);
    3. columns: the whole output width, or halved until the input window fits (``ow_tile``);
    4. rows: as many as fit (``oh_tile``, found by bisection).

    Among the candidates that fit, the one with the fewest estimated DMA bytes (:meth:`ConvTiling.dma_bytes`)
    wins. Raises :class:`ScheduleError` when no candidate fits. ``threads`` 2 splits every buffer in two halves
    (double buffering), 1 gives each tile whole buffers (no latency hiding). Plans are cached per (geometry,
    config, threads).
    """
    if threads not in (1, 2):
        raise ValueError(f"threads must be 1 (no latency hiding) or 2 (double buffering), not {threads!r}")
    return _plan_conv(geom, intr.cfg, threads)


def _oc_candidates(ob: int) -> list[int]:
    """Output blocks per tile to try: every count up to 16, then the halvings and divisors of ``ob``."""
    if ob <= 16:
        return list(range(1, ob + 1))
    divisors = {d for d in range(1, ob + 1) if ob % d == 0}
    return sorted(set(range(1, 9)) | set(_halvings(ob)) | divisors)


@lru_cache(maxsize=4096)
def _plan_conv(geom: ConvGeometry, cfg: VTAConfig, threads: int) -> ConvTiling:
    intr = intrinsics(cfg)
    _check_geometry(geom)
    _, nib = geom.block_ranges
    best: tuple[int, ConvTiling] | None = None
    for oct in _oc_candidates(geom.ob):
        for ict, kht in _reduction_candidates(nib, geom.kh):
            for tow in _halvings(geom.ow):
                cand = ConvTiling(geom, oct, ict, 1, tow, kht, threads)
                rows = _max_rows(cand, intr)
                if rows == 0:
                    continue
                cand = ConvTiling(geom, oct, ict, rows, tow, kht, threads)
                cost = cand.dma_bytes(intr)
                if best is None or cost < best[0]:
                    best = (cost, cand)
    if best is None:
        smallest = ConvTiling(geom, 1, 1, 1, 1, 1, threads)
        raise ScheduleError("no tiling fits: even a one-pixel tile breaks these limits: "
                            + "; ".join(smallest.check(intr)))
    return best[1]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def conv_candidates(geom: ConvGeometry, intr: Intrinsics, *, threads: tuple[int, ...] = (1, 2),
                    bias_load: tuple[bool, ...] = (False, True)) -> list[ConvTiling]:
    """Every tiling the schedule search considers for ``geom``, each fitting ``intr``'s buffers:

    output blocks per tile as in :func:`plan_conv`; reduction steps as in :func:`plan_conv`; columns: the halvings
    and divisors of the output width; rows: the most that fit, and the same number of row tiles with balanced
    heights; each with every ``threads`` and ``bias_load`` option and both loop :data:`ORDERS` (when the layer has
    more than one output-block group and more than one pixel tile). Raises :class:`ScheduleError` when none fits.
    """
    _check_geometry(geom)
    _, nib = geom.block_ranges
    widths = sorted(set(_halvings(geom.ow)) | set(_divisors(geom.ow)), reverse=True)
    out: list[ConvTiling] = []
    for th in threads:
        for oct in _oc_candidates(geom.ob):
            for ict, kht in _reduction_candidates(nib, geom.kh):
                for tow in widths:
                    for bias in bias_load:
                        base = ConvTiling(geom, oct, ict, 1, tow, kht, th, "oc", bias)
                        rows = _max_rows(base, intr)
                        if rows == 0:
                            continue
                        balanced = ceil_div(geom.oh, ceil_div(geom.oh, rows))
                        for oht in sorted({rows, balanced}):
                            out.append(ConvTiling(geom, oct, ict, oht, tow, kht, th, "oc", bias))
                            many = ceil_div(geom.oh, oht) * ceil_div(geom.ow, tow) > 1
                            if many and oct < geom.ob:
                                out.append(ConvTiling(geom, oct, ict, oht, tow, kht, th, "pixel", bias))
    if not out:
        smallest = ConvTiling(geom, 1, 1, 1, 1, 1, min(threads))
        raise ScheduleError("no tiling fits: even a one-pixel tile breaks these limits: "
                            + "; ".join(smallest.check(intr)))
    return out


@dataclass(frozen=True)
class EltwiseTiling:
    """An elementwise op over ``entries`` acc entries (packed activation elements), ``tile`` entries at a time.

    Each tile needs ``2 * tile`` acc entries (both operands) in one half (``threads`` 2) or all of the acc buffer.
    """

    entries: int
    tile: int
    threads: int = 2

    def tiles(self) -> Iterator[tuple[int, int]]:
        """``(first entry, count)`` of every tile."""
        for e0 in range(0, self.entries, self.tile):
            yield e0, min(self.tile, self.entries - e0)


def plan_eltwise(entries: int, intr: Intrinsics, *, threads: int = 2) -> EltwiseTiling:
    """Tiling of a two-operand elementwise op over ``entries`` packed elements (``threads`` as in plan_conv)."""
    if entries < 1:
        raise ScheduleError(f"an elementwise op needs at least one element, not {entries}")
    tile = min(entries, intr.capacity("acc") // (2 * threads), intr.loop_max)
    if tile < 1:
        raise ScheduleError(f"the acc buffer ({intr.capacity('acc')} entries) is too small for two operands in "
                            f"each of two halves")
    return EltwiseTiling(entries, tile, threads)
