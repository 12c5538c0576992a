"""A tiled GEMM benchmark program (int8, or int4 operands on a design with int4 inputs or weights) and the packing
helpers for its operands.

Every function takes the config explicitly and works for any valid one (BATCH 1..16, BLOCK 4..64, small buffers).
The returned ``expected`` array equals ``program.read("C", final_dram)`` after a correct run, so a check is::

    program, expected = gemm_program(cfg, 64, 64, 64)
    result = vta.fsim.run(program)
    assert np.array_equal(program.read("C", result.dram), expected)

DRAM layouts (VTA's packed layouts): the GEMM's A (m x k) is stored as inp elements ``(M/BATCH, K/BLOCK_IN, BATCH,
BLOCK_IN)``, B (k x n) as wgt elements ``(N/BLOCK_OUT, K/BLOCK_IN, BLOCK_OUT, BLOCK_IN)`` (i.e. B transposed) and C as
out elements ``(M/BATCH, N/BLOCK_OUT, BATCH, BLOCK_OUT)``, each dimension padded with zeros to whole blocks;
:func:`pack_inp`, :func:`pack_wgt` and :func:`unpack_out` convert.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import MEM_INP, MEM_OUT, MEM_WGT, VTAConfig
from .isa import ALU_MAX, ALU_MIN, ALU_SHR, Uop
from .packing import alloc_dtype, element_range
from .program import Program, ProgramBuilder, SlotRing

__all__ = ["gemm_program", "GemmTiling", "gemm_tiling", "pack_inp", "pack_wgt", "unpack_out", "requantize"]


def _blocks(n: int, size: int) -> int:
    return -(-n // size)


def _tiles(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """(r, c) int8 -> (R/rows, rows, C/cols, cols): zero-padded to multiples of ``rows`` x ``cols``, cut into tiles
    (not yet in element order)."""
    r, c = a.shape
    rb, cb = _blocks(r, rows), _blocks(c, cols)
    padded = np.zeros((rb * rows, cb * cols), np.int8)
    padded[:r, :c] = a
    return padded.reshape(rb, rows, cb, cols)


def pack_inp(a: np.ndarray, cfg: VTAConfig) -> np.ndarray:
    """(m, k) int8 -> inp elements (M/BATCH, K/BLOCK_IN, BATCH, BLOCK_IN), zero-padded."""
    return _tiles(a, cfg.batch, cfg.block_in).transpose(0, 2, 1, 3).copy()


def pack_wgt(b: np.ndarray, cfg: VTAConfig) -> np.ndarray:
    """(k, n) int8 -> wgt elements (N/BLOCK_OUT, K/BLOCK_IN, BLOCK_OUT, BLOCK_IN), zero-padded."""
    return _tiles(b, cfg.block_in, cfg.block_out).transpose(2, 0, 3, 1).copy()


def unpack_out(c: np.ndarray, m: int, n: int) -> np.ndarray:
    """Out elements (M/BATCH, N/BLOCK_OUT, BATCH, BLOCK_OUT) -> (m, n)."""
    mb, nb, b, bo = c.shape
    return c.transpose(0, 2, 1, 3).reshape(mb * b, nb * bo)[:m, :n].copy()


def requantize(acc: np.ndarray, shift: int, bits: int = 8) -> np.ndarray:
    """int32 accumulators -> ``bits``-bit outputs (int8 array) as the GEMM program's ALU does: arithmetic shift
    right, clip to the signed range ([-128, 127] for int8, [-8, 7] for int4)."""
    lo, hi = element_range(bits)
    return np.clip(np.asarray(acc, np.int64) >> shift, lo, hi).astype(np.int8)


@dataclass(frozen=True)
class GemmTiling:
    """Tile sizes in blocks: ``tm`` rows of BATCH, ``tk`` blocks of BLOCK_IN, ``tn`` blocks of BLOCK_OUT; ``slots``
    buffers for inp/wgt tiles and ``acc_slots`` for acc/out tiles (2 each when double buffering)."""

    tm: int
    tk: int
    tn: int
    slots: int
    acc_slots: int


def gemm_tiling(cfg: VTAConfig, m: int, k: int, n: int, *, double_buffer: bool = True) -> GemmTiling:
    """The largest tiles (most MACs per GEMM instruction) that fit the config's buffers."""
    mb, kb, nb = _blocks(m, cfg.batch), _blocks(k, cfg.block_in), _blocks(n, cfg.block_out)
    slots = acc_slots = 2 if double_buffer else 1
    inp_cap, wgt_cap, acc_cap = cfg.inp_depth // slots, cfg.wgt_depth // slots, cfg.acc_depth // acc_slots
    uop_cap = (cfg.uop_depth - 2 * acc_slots) // (slots * acc_slots)  # GEMM kernels + reset and ALU micro-ops
    best: tuple[int, int, GemmTiling] | None = None
    for tk in range(1, min(kb, uop_cap, inp_cap, wgt_cap, 256) + 1):
        tn = min(nb, wgt_cap // tk, acc_cap)
        tm = min(mb, inp_cap // tk, acc_cap // tn)
        key = (tm * tn * tk, tk)
        if best is None or key > best[:2]:
            best = (*key, GemmTiling(tm, tk, tn, slots, acc_slots))
    if best is None:
        raise ValueError(f"config {cfg.name} has too few micro-op entries ({cfg.uop_depth}) for a "
                         f"{'double' if double_buffer else 'single'}-buffered GEMM; use double_buffer=False or a "
                         f"larger LOG_UOP_BUFF_SIZE")
    return best[2]


def _default_shift(k: int, cfg: VTAConfig | None = None) -> int:
    """A shift that brings dot products of length k of the config's operands (int8 x int8 without a config) to
    roughly the output range."""
    a = -element_range(cfg.inp_width)[0] if cfg else 128
    b = -element_range(cfg.wgt_width)[0] if cfg else 128
    out = -element_range(cfg.out_width)[0] if cfg else 128
    std = np.sqrt(max(k, 1)) * a * b / 3
    return max(0, int(np.ceil(np.log2(std / (48 * out / 128)))))


def gemm_program(cfg: VTAConfig, m: int, k: int, n: int, *, seed: int = 0, double_buffer: bool = True,
                 shift: int | None = None) -> tuple[Program, np.ndarray]:
    """C = requantize(A @ B) for random A (m x k) and B (k x n) drawn from ``seed``: int8, or int4 where the config's
    input or weight width is 4 (stored packed, :mod:`vta.packing`); C has the output (input) width.

    Tiled to the config's buffers (:func:`gemm_tiling`), with dependency tokens as VTA's runtime emits them; with
    ``double_buffer`` the load of the next inp/wgt tiles and the store of the previous output tile overlap the GEMM.
    Requantization: ALU SHR by ``shift`` (default from k), MIN 127, MAX -128. Returns the program and the expected
    contents of allocation ``"C"`` (packed out elements; :func:`unpack_out` gives m x n). Allocations: ``A``, ``B``,
    ``C``, ``uops``.
    """
    for name, v in (("m", m), ("k", k), ("n", n)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, not {v!r}")
    rng = np.random.default_rng(seed)
    (a_lo, a_hi), (b_lo, b_hi) = element_range(cfg.inp_width), element_range(cfg.wgt_width)
    out_lo, out_hi = element_range(cfg.out_width)
    a = rng.integers(a_lo, a_hi + 1, (m, k), dtype=np.int8)
    b = rng.integers(b_lo, b_hi + 1, (k, n), dtype=np.int8)
    shift = _default_shift(k, cfg) if shift is None else shift
    if not 0 <= shift <= 31:
        raise ValueError(f"shift must be between 0 and 31, not {shift}")
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.int64)
    expected_mn = requantize(exact.astype(np.int32), shift, cfg.out_width)
    t = gemm_tiling(cfg, m, k, n, double_buffer=double_buffer)
    mb, kb, nb = _blocks(m, cfg.batch), _blocks(k, cfg.block_in), _blocks(n, cfg.block_out)
    inp_slot, wgt_slot, acc_slot = cfg.inp_depth // t.slots, cfg.wgt_depth // t.slots, cfg.acc_depth // t.acc_slots

    bld = ProgramBuilder(cfg)
    a_al = bld.alloc("A", pack_inp(a, cfg), alloc_dtype(cfg.inp_width))
    b_al = bld.alloc("B", pack_wgt(b, cfg), alloc_dtype(cfg.wgt_width))
    c_al = bld.alloc("C", (mb, nb, cfg.batch, cfg.block_out), alloc_dtype(cfg.out_width))
    uops: list[Uop] = []
    gemm_base = {}
    for s in range(t.slots):
        for r in range(t.acc_slots):
            gemm_base[s, r] = len(uops)
            uops += [Uop(r * acc_slot, s * inp_slot + j, s * wgt_slot + j) for j in range(t.tk)]
    reset_base = len(uops)
    uops += [Uop(r * acc_slot, 0, 0) for r in range(t.acc_slots)]
    alu_base = len(uops)
    uops += [Uop(r * acc_slot, r * acc_slot, 0) for r in range(t.acc_slots)]
    bld.load_uops(bld.uop_kernel("uops", uops))
    a_addr, b_addr = bld.elem_addr(a_al, MEM_INP), bld.elem_addr(b_al, MEM_WGT)
    c_addr = bld.elem_addr(c_al, MEM_OUT)

    steps = SlotRing(bld, "load", "compute", t.slots)   # inp/wgt parts: loaded, then read by the GEMMs
    outs = SlotRing(bld, "compute", "store", t.acc_slots)  # acc/out parts: computed, then stored
    for m0 in range(0, mb, t.tm):
        tm = min(t.tm, mb - m0)
        for n0 in range(0, nb, t.tn):
            tn = min(t.tn, nb - n0)
            r = outs.claim()  # waits until the out tile last in this part has been stored
            if not cfg.gemm_overwrite:  # with the knob the first step's first micro-op overwrites instead
                bld.gemm(uop_bgn=reset_base + r, uop_end=reset_base + r + 1, iter_out=tm, iter_in=tn,
                         dst_factor_out=tn * (tm > 1), dst_factor_in=int(tn > 1), reset=True)
            for k0 in range(0, kb, t.tk):
                tk = min(t.tk, kb - k0)
                s = steps.claim()  # waits until the GEMM that read this part is done
                bld.load(MEM_INP, sram_base=s * inp_slot, dram_base=a_addr + m0 * kb + k0, y_size=tm, x_size=tk,
                         x_stride=kb)
                bld.load(MEM_WGT, sram_base=s * wgt_slot, dram_base=b_addr + n0 * kb + k0, y_size=tn, x_size=tk,
                         x_stride=kb)
                steps.handoff()
                g = gemm_base[s, r]
                # a factor is irrelevant when its loop runs once: 0 then, so it fits even a 1-entry-per-slot field
                loops: dict[str, Any] = dict(iter_out=tm, iter_in=tn, dst_factor_out=tn * (tm > 1),
                                             dst_factor_in=int(tn > 1), src_factor_out=tk * (tm > 1),
                                             wgt_factor_in=tk * (tn > 1))
                if cfg.gemm_overwrite and k0 == 0:  # acc = the first block's products, then accumulate the rest
                    bld.gemm(uop_bgn=g, uop_end=g + 1, reset=True, **loops)
                    if tk > 1:
                        bld.gemm(uop_bgn=g + 1, uop_end=g + tk, **loops)
                else:
                    bld.gemm(uop_bgn=g, uop_end=g + tk, **loops)
                steps.release()
            for op, imm in ((ALU_SHR, shift), (ALU_MIN, out_hi), (ALU_MAX, out_lo)):
                bld.alu(op, uop_bgn=alu_base + r, uop_end=alu_base + r + 1, iter_out=tm, iter_in=tn,
                        dst_factor_out=tn * (tm > 1), dst_factor_in=int(tn > 1), use_imm=True, imm=imm)
            outs.handoff()
            bld.store(sram_base=r * acc_slot, dram_base=c_addr + m0 * nb + n0, y_size=tm, x_size=tn, x_stride=nb)
            outs.release()
    steps.drain()  # the release tokens nobody waits for, so the queues end empty
    outs.drain()
    program = bld.finish()
    c_packed = np.zeros((mb * cfg.batch, nb * cfg.block_out), np.int8)
    c_packed[:m, :n] = expected_mn
    expected = c_packed.reshape(mb, cfg.batch, nb, cfg.block_out).transpose(0, 2, 1, 3).copy()
    return program, expected
