"""The directed programs of the conformance kit (:mod:`vta.tsim.conform`): one small program per feature of the ISA.

Each program makes its feature observable in DRAM: what a LOAD put in an SRAM buffer reaches the out buffer through
a GEMM or an ALU op and is stored; accumulators are exposed whole (all four bytes of each 32-bit value: the low byte,
then three ``SHR 8`` steps), so a wrong bit anywhere in an accumulator shows. The kit runs every program on the
functional simulator (the spec) and on the core and compares; the expected values are fsim's, not written here.

Features (:func:`feature_programs`): LOADs with padding on all four sides and a row stride to each memory type
(``load uop``, ``load wgt``, ``load inp``, ``load acc``, ``load acc8``), ``gemm`` (two-level loops, every factor,
accumulating) and ``gemm reset``, ``alu <case>`` for every case of :data:`vta.testing.ALU_CASES` (every opcode, with
an immediate and with a vector operand; ``alu req`` at configs with the ``fused_requant`` knob, ``alu rsum``,
``alu rsum_imm``, ``alu rmax`` and ``alu rmax_imm`` with the ``lane_reduce`` knob), ``store`` (strided
rows over pre-filled DRAM), ``tokens <src>-><dst>`` for the four token queues (hazards that only the tokens order,
with several tokens in flight) and ``finish`` (FINISH alone).

Corner values, by design rather than by luck: ``corner alu <op>`` (every pair of :data:`EDGE_VALUES` as vector
operands and every edge immediate; for SHR every amount at and beyond the lane width in both directions),
``corner gemm extremes`` (int8 operands at their extremes and of mixed signs over a reduction long enough that the
accumulators reach their full width and wrap; accumulators loaded next to the int32 extremes), ``corner loops``
(every loop shape, zero iterations included), ``corner pads <mem>`` (every combination of padded sides, and pads of
15, over entries filled first) and ``corner store`` (STOREs at their shape limits); ``corner addresses <mem>`` (DRAM
address bits, strides, SRAM depth), ``corner long <mem>`` (row and element counts through half the depth),
``corner queue full``, ``corner finish backlog`` (FINISH while load has a full command queue) and ``corner long
run`` (past 2**19 cycles, for the counters' bits). Timing stress: ``stress tokens`` (a long stream of rounds in
which load, compute and store take turns being the slowest, up to four tokens in each queue at once:
:func:`vta.testing.token_stream_program`), which the kit runs at several memory latencies.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.isa import (
    ALU_ADD,
    ALU_MAX,
    ALU_MIN,
    ALU_MUL,
    ALU_REQ,
    ALU_RMAX,
    ALU_RSUM,
    ALU_SHR,
    KNOB_ALU_OPS,
    Uop,
    encode_uops,
    requant_imm,
    requant_word,
)
from vta.packing import alloc_dtype
from vta.program import Allocation, Program, ProgramBuilder
from vta.testing import ALU_CASES, token_stream_program

__all__ = ["feature_programs", "features_for", "stress_program", "FEATURES", "FEATURE_KNOBS", "EDGE_VALUES",
           "EDGE_IMMS", "SHIFT_AMOUNTS", "SHIFT_IMMS", "STRESS_ROUNDS", "THOROUGH_ROUNDS"]


class _DrainingBuilder(ProgramBuilder):
    """A builder that drains the ``concurrent_alu`` engine after every ALU instruction: the kit's programs reuse acc
    entries right after ALU instructions, which the knob's bank rule allows only once the engine is done."""

    def alu(self, *args: Any, **kwargs: Any) -> int:
        index = super().alu(*args, **kwargs)
        self.drain_alu()
        return index


class _Kit:
    """A program under construction with seeded random pools in DRAM and helpers that expose buffers."""

    def __init__(self, cfg: VTAConfig, seed: int, out_rows: int = 128) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self.bld = _DrainingBuilder(cfg) if cfg.concurrent_alu else ProgramBuilder(cfg)
        self.out = self.bld.alloc("out", (out_rows, cfg.batch, cfg.block_out), np.int8)
        self.stored = 0

    def pool(self, name: str, mem: int, n: int) -> Allocation:
        """``n`` random elements of memory type ``mem`` (acc: values over the whole int32 range)."""
        cfg, rng = self.cfg, self.rng
        if mem == MEM_INP:
            data = rng.integers(-128, 128, (n, cfg.batch, cfg.block_in), dtype=np.int8)
        elif mem == MEM_WGT:
            data = rng.integers(-128, 128, (n, cfg.block_out, cfg.block_in), dtype=np.int8)
        elif mem == MEM_ACC:
            data = rng.integers(-(1 << 31), 1 << 31, (n, cfg.batch, cfg.block_out), dtype=np.int64).astype(np.int32)
        else:
            data = rng.integers(-128, 128, (n, cfg.batch, cfg.block_out), dtype=np.int8)
        return self.bld.alloc(name, data)

    def load(self, mem: int, alloc: Allocation, **fields: int) -> None:
        self.bld.load(mem, dram_base=self.bld.elem_addr(alloc, mem), **fields)

    def operands(self, acc: int, inp: int, wgt: int) -> None:
        """Load pools of ``acc``, ``inp`` and ``wgt`` random entries at the start of each buffer (LOAD ACC on the
        compute module, LOAD INP and WGT on the load module, which then hands them to compute: a token)."""
        for mem, name, n in ((MEM_ACC, "acc", acc), (MEM_INP, "inp", inp), (MEM_WGT, "wgt", wgt)):
            self.load(mem, self.pool(name, mem, n), sram_base=0, x_size=n)
        self.bld.dep_push("load", "compute")
        self.bld.dep_pop("load", "compute")

    def uops(self, name: str, uops: list[Uop]) -> None:
        """Load micro-ops ``uops`` into the uop buffer at 0."""
        self.bld.load_uops(self.bld.uop_kernel(name, uops))

    def store(self, n: int) -> None:
        """Store out entries [0, n) to the next free rows of ``out`` (waits for compute, then frees the buffer)."""
        b = self.bld
        b.dep_push("compute", "store")
        b.dep_pop("compute", "store")
        b.store(sram_base=0, dram_base=b.elem_addr(self.out, MEM_OUT) + self.stored, x_size=n)
        self.stored += n
        b.dep_push("store", "compute")
        b.dep_pop("store", "compute")

    def expose_acc(self, n: int, kernel: str = "expose") -> None:
        """Store all four bytes of acc entries [0, n): ADD 0 (writes out), then three SHR 8 steps."""
        loop: dict[str, Any] = {"uop_bgn": 0, "uop_end": 1, "iter_out": n, "dst_factor_out": 1, "src_factor_out": 1}
        self.uops(kernel, [Uop(0, 0, 0)])
        for j in range(4):
            self.bld.alu(ALU_SHR if j else ALU_ADD, **loop, use_imm=True, imm=8 if j else 0)
            self.store(n)

    def finish(self) -> Program:
        return self.bld.finish()


def _padded(mem: int) -> dict[str, int]:
    """LOAD fields with padding on every side and a row stride: 2 rows of 3 elements, stride 5; 4 x 6 with pads."""
    del mem
    return {"sram_base": 0, "y_size": 2, "x_size": 3, "x_stride": 5, "y_pad_0": 1, "y_pad_1": 1, "x_pad_0": 2,
            "x_pad_1": 1}


_PADDED_ENTRIES = (1 + 2 + 1) * (2 + 3 + 1)
"""SRAM entries a :func:`_padded` LOAD writes."""


def _load_operand(cfg: VTAConfig, mem: int) -> Program:
    """LOAD of inp or wgt with padding and stride, read by a GEMM over every entry written, accumulators exposed."""
    k = _Kit(cfg, seed=10 + mem)
    n = _PADDED_ENTRIES
    other = MEM_WGT if mem == MEM_INP else MEM_INP
    k.load(mem, k.pool("padded", mem, 12), **_padded(mem))
    k.load(other, k.pool("plain", other, 4), sram_base=0, x_size=4)
    k.bld.dep_push("load", "compute")
    k.bld.dep_pop("load", "compute")
    uops = [Uop(i, i if mem == MEM_INP else i % 4, i if mem == MEM_WGT else i % 4) for i in range(n)]
    k.uops("gemm", uops)
    k.bld.gemm(uop_bgn=0, uop_end=n, reset=True)
    k.bld.gemm(uop_bgn=0, uop_end=n)
    k.expose_acc(n)
    return k.finish()


def _load_acc(cfg: VTAConfig, mem: int) -> Program:
    """LOAD ACC or ACC_8BIT with padding and stride; every entry written exposed."""
    k = _Kit(cfg, seed=10 + mem)
    k.load(mem, k.pool("padded", mem, 12), **_padded(mem))
    k.expose_acc(_PADDED_ENTRIES)
    return k.finish()


def _load_uop(cfg: VTAConfig) -> Program:
    """LOAD UOP with padding and stride (padded micro-ops are zeros: dst 0, src 0, wgt 0), run by a GEMM."""
    k = _Kit(cfg, seed=20)
    words = [Uop(1 + (i % 7), i % 5, (3 * i) % 6) for i in range(12)]
    kernel = k.bld.uop_kernel("padded", words)
    k.operands(acc=8, inp=5, wgt=6)
    k.bld.load(MEM_UOP, dram_base=k.bld.elem_addr(kernel, MEM_UOP), **_padded(MEM_UOP))
    k.bld.gemm(uop_bgn=0, uop_end=_PADDED_ENTRIES)
    k.expose_acc(8)
    return k.finish()


def _gemm(cfg: VTAConfig, reset: bool) -> Program:
    """A GEMM with two-level loops and every index factor, accumulating on loaded acc (or resetting it)."""
    k = _Kit(cfg, seed=30 + reset)
    k.operands(acc=24, inp=16, wgt=16)
    k.uops("gemm", [Uop(0, 0, 0), Uop(1, 2, 1), Uop(2, 1, 3)])
    k.bld.gemm(uop_bgn=0, uop_end=3, iter_out=3, iter_in=2, dst_factor_out=6, dst_factor_in=3, src_factor_out=4,
               src_factor_in=1, wgt_factor_out=1, wgt_factor_in=5, reset=reset)
    k.expose_acc(24)
    return k.finish()


_RIGHT_SHIFTS = (1, 7, 31, -40)
"""Vector SHR amounts paired with negative values (-40's low 6 bits are +24): arithmetic right shifts that a
logical shift gets wrong."""
_LEFT_SHIFTS = (-1, -17, 0, 40)
"""Vector SHR amounts paired with non-negative values (40's low 6 bits are -24): left shifts and none."""


def _alu(cfg: VTAConfig, op: int, imm: int | None) -> Program:
    """One ALU case over 8 entries with two-level loops: a = acc[0:8] op (imm or acc[8:16]); a exposed. In every
    lane half of a's values are negative (entries of one parity); a vector SHR shifts those right and the others
    left (:data:`_RIGHT_SHIFTS`, :data:`_LEFT_SHIFTS`)."""
    k = _Kit(cfg, seed=40 + 2 * op + (imm is None))
    entries = np.arange(8).reshape(8, 1, 1)
    lanes = np.arange(cfg.batch * cfg.block_out).reshape(1, cfg.batch, cfg.block_out)
    negative = (entries + lanes) % 2 == 0
    data = np.abs(k.rng.integers(-(1 << 31) + 1, 1 << 31, (8, cfg.batch, cfg.block_out), dtype=np.int64))
    k.load(MEM_ACC, k.bld.alloc("a", np.where(negative, -data, data).astype(np.int32)), sram_base=0, x_size=8)
    if imm is None:
        if op == ALU_SHR:
            turn = (entries // 2 + lanes) % 4
            shifts = np.where(negative, np.take(_RIGHT_SHIFTS, turn), np.take(_LEFT_SHIFTS, turn)).astype(np.int32)
            k.load(MEM_ACC, k.bld.alloc("b", shifts), sram_base=8, x_size=8)
        else:
            k.load(MEM_ACC, k.pool("b", MEM_ACC, 8), sram_base=8, x_size=8)
    k.uops("alu", [Uop(0, 8, 0), Uop(1, 9, 0)])
    k.bld.alu(op, uop_bgn=0, uop_end=2, iter_out=2, iter_in=2, dst_factor_out=4, dst_factor_in=2, src_factor_out=4,
              src_factor_in=2, use_imm=imm is not None, imm=0 if imm is None else imm)
    k.expose_acc(8)
    return k.finish()


def _alu_req(cfg: VTAConfig) -> Program:
    """ALU REQ (the ``fused_requant`` knob) over 8 entries with two-level loops: a = clip(SHR(a * M, S), lo, hi)
    with per-lane multipliers and shifts (right on the negative values, left and none on the others) and a clip
    range that both ends cut; a exposed."""
    k = _Kit(cfg, seed=48)
    entries = np.arange(8).reshape(8, 1, 1)
    lanes = np.arange(cfg.batch * cfg.block_out).reshape(1, cfg.batch, cfg.block_out)
    negative = (entries + lanes) % 2 == 0
    shape = (8, cfg.batch, cfg.block_out)
    data = np.abs(k.rng.integers(-(1 << 20), 1 << 20, shape, dtype=np.int64))
    k.load(MEM_ACC, k.bld.alloc("a", np.where(negative, -data, data).astype(np.int32)), sram_base=0, x_size=8)
    turn = (entries // 2 + lanes) % 4
    shifts = np.where(negative, np.take((1, 7, 12, 31), turn), np.take((-1, 0, 9, 20), turn))
    multipliers = k.rng.integers(-(1 << 15), 1 << 15, shape)
    words = np.vectorize(requant_word)(multipliers, shifts).astype(np.int32)
    k.load(MEM_ACC, k.bld.alloc("b", words), sram_base=8, x_size=8)
    k.uops("alu", [Uop(0, 8, 0), Uop(1, 9, 0)])
    k.bld.alu(ALU_REQ, uop_bgn=0, uop_end=2, iter_out=2, iter_in=2, dst_factor_out=4, dst_factor_in=2,
              src_factor_out=4, src_factor_in=2, imm=requant_imm(-100, 90))
    k.expose_acc(8)
    return k.finish()


def _store(cfg: VTAConfig) -> Program:
    """A strided STORE of 3 rows of 3 entries (stride 5: each row's start follows from the one before) over DRAM
    pre-filled with a pattern."""
    k = _Kit(cfg, seed=50)
    target = k.bld.alloc("target", np.full((16, cfg.batch, cfg.block_out), 0x5A, np.int8))
    k.load(MEM_ACC_8BIT, k.pool("acc8", MEM_ACC_8BIT, 9), sram_base=0, x_size=9)
    k.uops("alu", [Uop(0, 0, 0)])
    k.bld.alu(ALU_ADD, uop_bgn=0, uop_end=1, iter_out=9, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=1)
    k.bld.dep_push("compute", "store")
    k.bld.dep_pop("compute", "store")
    k.bld.store(sram_base=0, dram_base=k.bld.elem_addr(target, MEM_OUT) + 1, y_size=3, x_size=3, x_stride=5)
    return k.finish()


_QUEUES = ("load->compute", "compute->load", "compute->store", "store->compute")
"""The four token queues, as the features name them."""


def _tokens(cfg: VTAConfig, queue: str) -> Program:
    """Rounds in which the named token queue orders a hazard, with two tokens of it in flight at once where it
    can: loads refill the same inp/wgt entries (compute->load: write after read), GEMMs read them (load->compute:
    read after write), stores read the out buffer (compute->store) that the next round's GEMM overwrites
    (store->compute). Every round needs all four queues; the load<->compute features run one store per round, the
    compute<->store features two (two tokens in flight each way), each with its own data."""
    k = _Kit(cfg, seed=60 + _QUEUES.index(queue))
    b = k.bld
    inp, wgt = k.pool("inp", MEM_INP, 12), k.pool("wgt", MEM_WGT, 12)
    k.uops("gemm", [Uop(i, i, i) for i in range(4)])
    for r in range(3):
        if r:
            b.dep_pop("compute", "load")  # the previous round's GEMMs have read entries [0, 4)
        for half in range(2):
            b.load(MEM_INP, dram_base=b.elem_addr(inp, MEM_INP) + 4 * r + 2 * half, sram_base=2 * half, x_size=2)
            b.load(MEM_WGT, dram_base=b.elem_addr(wgt, MEM_WGT) + 4 * r + 2 * half, sram_base=2 * half, x_size=2)
            b.dep_push("load", "compute")  # two tokens in flight when compute is slower
        for half in range(2):
            b.dep_pop("load", "compute")
            b.gemm(uop_bgn=2 * half, uop_end=2 * half + 2, reset=r == 0)
        b.dep_push("compute", "load")
        if queue in ("compute->store", "store->compute"):  # two stores per round: two tokens each way
            k.store(1)
            k.store(4)
        else:
            k.store(4)
    b.dep_pop("compute", "load")
    return k.finish()


def _finish(cfg: VTAConfig) -> Program:
    """FINISH alone (with the store->compute token ProgramBuilder adds)."""
    return ProgramBuilder(cfg).finish()


# ---- corner values ------------------------------------------------------------------------------------------------
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
EDGE_VALUES = (INT32_MIN, INT32_MIN + 1, -46341, -32769, -32768, -1, 0, 1, 32767, 32768, 46341, INT32_MAX - 1,
               INT32_MAX)
"""Accumulator values at the edges: the int32 extremes and their neighbours, 0 and +-1, the 16-bit immediate's range
and the square roots where MUL starts to overflow (46341 ** 2 > INT32_MAX)."""
EDGE_IMMS = (-32768, -32767, -1, 0, 1, 32766, 32767)
"""Immediates at the edges of their 16-bit range."""
SHIFT_AMOUNTS = (*range(-64, 64), -65, 64, 65, -32768, 32767, INT32_MIN, INT32_MAX)
"""SHR amounts: every 6-bit amount (right 0..31, left 1..32) with the values that wrap into it from beyond the lane
width in both directions (-64..-33 and 32..63 as written), and far beyond."""
SHIFT_IMMS = (-64, -40, -33, -32, -31, -1, 0, 1, 30, 31, 32, 33, 40, 63, 64, -32768, 32767)
"""SHR immediates: amounts at and beyond the lane width in both directions."""
SHIFTED_VALUES = (INT32_MIN, -1, 0, 1, INT32_MAX, 0x12345678, -0x12345679)
"""Values a corner SHR shifts: the extremes, 0, +-1 and two with bits everywhere."""


def _rows_of(values: list[int], lanes: int) -> np.ndarray:
    """``values`` laid out ``lanes`` to an entry (the last entry filled by repeating from the start)."""
    n = -(-len(values) // lanes)
    return np.resize(np.asarray(values, np.int64), n * lanes).reshape(n, lanes)


def _alu_corner(cfg: VTAConfig, op: int) -> Program:
    """Operand pairs at the edges of their ranges for ALU opcode ``op``: every pair of :data:`EDGE_VALUES` (for SHR:
    every value of :data:`SHIFTED_VALUES` with every amount of :data:`SHIFT_AMOUNTS`) as a vector operation, then the
    edge values with each immediate of :data:`EDGE_IMMS` (:data:`SHIFT_IMMS`); every result exposed whole."""
    lanes = cfg.batch * cfg.block_out
    left, right, imms = (SHIFTED_VALUES, SHIFT_AMOUNTS, SHIFT_IMMS) if op == ALU_SHR else \
        (EDGE_VALUES, EDGE_VALUES, EDGE_IMMS)
    pairs = [(a, b) for a in left for b in right]
    a_vec, b_vec = _rows_of([a for a, _ in pairs], lanes), _rows_of([b for _, b in pairs], lanes)
    a_imm = _rows_of(list(left), lanes)
    vec, per = len(a_vec), len(a_imm)
    total = vec + len(imms) * per  # result entries: [0, vec) vector, then one region per immediate
    k = _Kit(cfg, seed=70 + op, out_rows=4 * total)
    shape = (cfg.batch, cfg.block_out)
    a = np.concatenate([a_vec] + [a_imm] * len(imms)).reshape((total, *shape))
    k.load(MEM_ACC, k.bld.alloc("a", a.astype(np.int32)), sram_base=0, x_size=total)
    k.load(MEM_ACC, k.bld.alloc("b", b_vec.reshape((vec, *shape)).astype(np.int32)), sram_base=total, x_size=vec)
    k.uops("alu", [Uop(0, total, 0)] + [Uop(vec + j * per, 0, 0) for j in range(len(imms))])
    k.bld.alu(op, uop_bgn=0, uop_end=1, iter_out=vec, dst_factor_out=1, src_factor_out=1)
    for j, imm in enumerate(imms):
        k.bld.alu(op, uop_bgn=1 + j, uop_end=2 + j, iter_out=per, dst_factor_out=1, use_imm=True,
                  imm=int(np.clip(imm, -32768, 32767)))
    k.expose_acc(total)
    return k.finish()


def _gemm_corner(cfg: VTAConfig) -> Program:
    """GEMM with operands at the extremes of the design's widths (int8: -128 and 127; int4: -8 and 7) over a
    reduction long enough that the accumulators reach their full width and wrap: all min x min (the largest dot
    product), min x max (the smallest), max x max and two mixed-sign patterns, each accumulated
    ``2**31 / (BLOCK_IN * min_inp * min_wgt) + 1`` times by one GEMM's loops (at most 2**16 times, for the kit's
    time: int4's products would need 2**21, so at int4 only the single products below wrap); then single extreme
    dot products added to accumulators loaded next to INT32_MAX and INT32_MIN (wrapping at once, or landing on
    INT32_MAX exactly). int4 operands are loaded packed (two per byte), as the design reads them."""
    bi, bo, batch = cfg.block_in, cfg.block_out, cfg.batch
    i_lo, i_hi = -(1 << (cfg.inp_width - 1)), (1 << (cfg.inp_width - 1)) - 1
    w_lo, w_hi = -(1 << (cfg.wgt_width - 1)), (1 << (cfg.wgt_width - 1)) - 1
    largest = bi * i_lo * w_lo  # the largest dot product (int8: BLOCK_IN << 14)
    k = _Kit(cfg, seed=80, out_rows=4 * 10)
    sign = np.where((np.arange(bi) + np.arange(batch)[:, None]) % 2 == 0, i_lo, i_hi)
    inp = np.stack([np.full((batch, bi), i_lo), np.full((batch, bi), i_hi), sign])
    mixed = np.where((np.arange(bi) + np.arange(bo)[:, None]) % 3 == 0, w_hi, w_lo)
    wgt = np.stack([np.full((bo, bi), w_lo), np.full((bo, bi), w_hi), mixed])
    k.load(MEM_INP, k.bld.alloc("inp", inp.astype(np.int8), alloc_dtype(cfg.inp_width)), sram_base=0,
           x_size=3)
    k.load(MEM_WGT, k.bld.alloc("wgt", wgt.astype(np.int8), alloc_dtype(cfg.wgt_width)), sram_base=0,
           x_size=3)
    near = np.array([INT32_MAX - 5, INT32_MIN + 5, INT32_MAX, INT32_MIN, INT32_MAX - largest])
    k.load(MEM_ACC, k.bld.alloc("acc", np.broadcast_to(near[:, None, None], (5, batch, bo)).astype(np.int32)),
           sram_base=5, x_size=5)
    k.bld.dep_push("load", "compute")
    k.bld.dep_pop("load", "compute")
    long = [Uop(0, 0, 0), Uop(1, 0, 1), Uop(2, 1, 1), Uop(3, 2, 2), Uop(4, 0, 2)]
    once = [Uop(5, 0, 0), Uop(6, 0, 0), Uop(7, 2, 2), Uop(8, 1, 0), Uop(9, 0, 0)]
    k.uops("gemm", long + once)
    reps = min((1 << 31) // largest + 1, 1 << 16)
    inner = min(reps, (1 << 14) - 1)
    k.bld.gemm(uop_bgn=0, uop_end=5, reset=True)
    k.bld.gemm(uop_bgn=0, uop_end=5, iter_out=-(-reps // inner), iter_in=inner)
    k.bld.gemm(uop_bgn=5, uop_end=10)
    k.expose_acc(10)
    return k.finish()


def _loops_corner(cfg: VTAConfig) -> Program:
    """GEMM and ALU (ADD of an immediate) with every loop shape: 0, 1 or 3 micro-ops, outer and inner iterations
    each, on loaded accumulators; every accumulator exposed."""
    k = _Kit(cfg, seed=85, out_rows=4 * 24)
    k.operands(acc=24, inp=4, wgt=4)
    k.uops("loops", [Uop(0, 1, 2), Uop(1, 3, 0), Uop(2, 2, 1)])
    factors = {"dst_factor_out": 8, "dst_factor_in": 3, "src_factor_out": 0, "src_factor_in": 1}
    for uops in (0, 1, 3):
        for outer in (0, 1, 2):
            for inner in (0, 1, 2):
                loop: dict[str, Any] = {"uop_bgn": 0, "uop_end": uops, "iter_out": outer, "iter_in": inner,
                                        **factors}
                k.bld.gemm(**loop, wgt_factor_out=1, wgt_factor_in=0)
                k.bld.alu(ALU_ADD, **loop, use_imm=True, imm=uops + 3 * outer + 9 * inner + 1)
    k.expose_acc(24)
    return k.finish()


PAD_MAX = 15
"""The largest pad a LOAD's 4-bit pad fields hold."""


def _pad_loads(cfg: VTAConfig, mem: int) -> list[dict[str, int]]:
    """LOAD shapes with every combination of padded sides (pads of 1 and 2, 2 rows of 2 elements, stride 3), then
    one with every pad at :data:`PAD_MAX` around a single element (two opposite corners' pads where the buffer is too
    small for all four)."""
    loads = []
    for c in range(16):
        p = 1 + c % 2
        loads.append({"y_size": 2, "x_size": 2, "x_stride": 3, "y_pad_0": p * (c & 1), "y_pad_1": p * (c >> 1 & 1),
                      "x_pad_0": p * (c >> 2 & 1), "x_pad_1": p * (c >> 3 & 1)})
    depth = {MEM_INP: cfg.inp_depth, MEM_WGT: cfg.wgt_depth, MEM_UOP: cfg.uop_depth}.get(mem, cfg.acc_depth)
    room = min(depth, cfg.acc_depth // 2)
    for pads in ((PAD_MAX,) * 4, (PAD_MAX, 0, 0, PAD_MAX)):  # all four sides; else two, where the buffer is small
        if (1 + pads[0] + pads[1]) * (1 + pads[2] + pads[3]) <= room:
            loads.append({"y_size": 1, "x_size": 1, "x_stride": 1, **dict(zip(_PADS, pads))})
            break
    return loads


_PADS = ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1")


def _entries(load: dict[str, int]) -> int:
    return (load["y_pad_0"] + load["y_size"] + load["y_pad_1"]) * (load["x_pad_0"] + load["x_size"] + load["x_pad_1"])


def _pads_corner(cfg: VTAConfig, mem: int) -> Program:
    """Every pad combination (and the largest pads) for LOADs to ``mem``, each into its own SRAM range filled with
    other (random, non-zero) data first, so a pad that is not written shows; what they wrote is exposed (acc, acc8
    directly; inp, wgt through GEMMs over every entry, in as many phases as the buffer needs; uop by running the
    loaded micro-ops)."""
    loads = _pad_loads(cfg, mem)
    sizes = [_entries(load) for load in loads]
    exposed = sum(sizes) if mem in (MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_WGT) else 8
    k = _Kit(cfg, seed=90 + mem, out_rows=4 * exposed)
    b = k.bld
    if mem == MEM_UOP:
        kernel = b.uop_kernel("padded", [Uop(1 + i % 7, i % 5, (3 * i) % 6) for i in range(8)])
        k.operands(acc=8, inp=5, wgt=6)
        most = max(sizes)
        k.uops("fill", [Uop(1 + (3 * i) % 7, 1 + i % 4, 1 + i % 5) for i in range(most)])
        for j, load in enumerate(loads):
            b.load(MEM_UOP, sram_base=0, dram_base=b.elem_addr(kernel, MEM_UOP) + j % 3, **load)
            b.gemm(uop_bgn=0, uop_end=_entries(load))
        k.expose_acc(8)
        return k.finish()
    pool = k.pool("padded", mem, 8)
    if mem in (MEM_ACC, MEM_ACC_8BIT):
        k.load(mem, k.pool("fill", mem, exposed), sram_base=0, x_size=exposed)
        base = 0
        for j, load in enumerate(loads):
            b.load(mem, sram_base=base, dram_base=b.elem_addr(pool, mem) + j % 3, **load)
            base += _entries(load)
        k.expose_acc(exposed)
        return k.finish()
    other = MEM_WGT if mem == MEM_INP else MEM_INP
    k.load(other, k.pool("plain", other, 4), sram_base=0, x_size=4)
    depth = cfg.inp_depth if mem == MEM_INP else cfg.wgt_depth
    done = 0
    fill = k.pool("fill", mem, depth)
    phases: list[list[int]] = [[]]
    for j, n in enumerate(sizes):
        if sum(sizes[i] for i in phases[-1]) + n > depth:
            phases.append([])
        phases[-1].append(j)
    for p, phase in enumerate(phases):
        if p:
            b.dep_pop("compute", "load")  # the previous phase's GEMMs have read the buffer
        k.load(mem, fill, sram_base=0, x_size=sum(sizes[j] for j in phase))
        base = 0
        for j in phase:
            b.load(mem, sram_base=base, dram_base=b.elem_addr(pool, mem) + j % 3, **loads[j])
            base += sizes[j]
        b.dep_push("load", "compute")
        b.dep_pop("load", "compute")
        k.uops(f"gemm{p}", [Uop(done + i, i if mem == MEM_INP else i % 4, i if mem == MEM_WGT else i % 4)
                            for i in range(base)])
        b.gemm(uop_bgn=0, uop_end=base, reset=True)
        b.gemm(uop_bgn=0, uop_end=base)
        if p + 1 < len(phases):
            b.dep_push("compute", "load")
        done += base
    k.expose_acc(exposed)
    return k.finish()


def _store_corner(cfg: VTAConfig) -> Program:
    """STOREs at their shape limits over pre-filled DRAM: one element, a contiguous block (stride = row), rows
    overlapping in DRAM (stride < row: the later row wins) and a single long row."""
    k = _Kit(cfg, seed=95)
    n = 24
    target = k.bld.alloc("target", np.full((64, cfg.batch, cfg.block_out), 0x5A, np.int8))
    k.load(MEM_ACC_8BIT, k.pool("acc8", MEM_ACC_8BIT, n), sram_base=0, x_size=n)
    k.uops("alu", [Uop(0, 0, 0)])
    k.bld.alu(ALU_ADD, uop_bgn=0, uop_end=1, iter_out=n, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=3)
    k.bld.dep_push("compute", "store")
    k.bld.dep_pop("compute", "store")
    at = k.bld.elem_addr(target, MEM_OUT)
    for sram, dram, y, x, stride in ((5, 0, 1, 1, 1), (0, 2, 3, 4, 4), (1, 16, 3, 5, 2), (0, 30, 1, n, n)):
        k.bld.store(sram_base=sram, dram_base=at + dram, y_size=y, x_size=x, x_stride=stride)
    return k.finish()


FAR_BITS = 23
"""The ``corner addresses`` programs reach DRAM byte addresses up to ``2**FAR_BITS`` (an 8 MB region)."""


def _far_loads(cfg: VTAConfig, mem: int, first: int, base: int = 0) -> list[dict[str, int]]:
    """LOADs of one element each (two for a strided pair) from a ``2**FAR_BITS``-byte region, into SRAM entries
    ``first``, ``first + 1``, ...: at every power-of-two byte offset of the region and its last element, and
    two-row LOADs with every power-of-two row stride that fits, from the region's start and from the element of its
    first half whose address has every bit below the half's set (``dram_base`` relative to the region, which
    starts at element address ``base``)."""
    eb = cfg.elem_bytes(mem)
    size = (1 << FAR_BITS) // eb
    loads = [{"dram_base": (1 << k) // eb, "x_size": 1} for k in range(eb.bit_length() - 1, FAR_BITS)]
    loads.append({"dram_base": size - 1, "x_size": 1})
    loads += [{"dram_base": 0, "y_size": 2, "x_size": 1, "x_stride": 1 << s} for s in range(16) if (1 << s) < size]
    start = (base | (size // 2 - 1)) - base  # every address bit below the half set: each bit of the row start counts
    loads += [{"dram_base": start, "y_size": 2, "x_size": 1, "x_stride": 1 << s} for s in range(16)
              if start + (1 << s) < size]
    entry = first
    for load in loads:
        load["sram_base"] = entry
        entry += load.get("y_size", 1)
    return loads


def _addresses_corner(cfg: VTAConfig, mem: int) -> Program:
    """LOADs to ``mem`` from DRAM addresses with every address bit up to ``FAR_BITS`` set, two-row LOADs with every
    power-of-two stride, and LOADs into SRAM entries at every power of two of the buffer's depth (read back through
    a GEMM or the ALU into low entries); the results exposed, then STOREs of them to every power-of-two offset and
    stride of the same region."""
    n = len(_far_loads(cfg, mem, 0)) + 16 + 16  # entries the LOADs below write, at most (the pairs two each)
    depth = cfg.depth(mem)
    high = [1 << j for j in range(n.bit_length(), depth.bit_length() - 1)] + [depth - 1]
    k = _Kit(cfg, seed=120 + mem, out_rows=4 * (n + len(high)))
    b = k.bld
    far = b.alloc("far", k.rng.integers(-128, 128, 1 << FAR_BITS, dtype=np.int8))
    base = b.elem_addr(far, mem)
    loads = _far_loads(cfg, mem, 0, base)
    n = loads[-1]["sram_base"] + loads[-1].get("y_size", 1)
    for load in loads:
        b.load(mem, **{**load, "dram_base": base + load["dram_base"]})
    for i, entry in enumerate(high):  # entries at the buffer's high addresses, from the region's start
        b.load(mem, sram_base=entry, dram_base=base + i, x_size=1)
    total = n + len(high)
    if mem in (MEM_INP, MEM_WGT):
        other = MEM_WGT if mem == MEM_INP else MEM_INP
        k.load(other, k.pool("plain", other, 1), sram_base=0, x_size=1)
        b.dep_push("load", "compute")
        b.dep_pop("load", "compute")
        index = list(range(n)) + high
        k.uops("gemm", [Uop(i, index[i] if mem == MEM_INP else 0, index[i] if mem == MEM_WGT else 0)
                        for i in range(total)])
        b.gemm(uop_bgn=0, uop_end=total, reset=True)
        b.gemm(uop_bgn=0, uop_end=total)
    else:  # acc: the high entries added to zeroed low entries
        k.uops("zero", [Uop(n + i, 0, 0) for i in range(len(high))] + [Uop(n + i, e, 0) for i, e in enumerate(high)])
        b.gemm(uop_bgn=0, uop_end=len(high), reset=True)
        b.alu(ALU_ADD, uop_bgn=len(high), uop_end=2 * len(high))
    k.expose_acc(total)
    b.dep_push("compute", "store")
    b.dep_pop("compute", "store")
    at = b.elem_addr(far, MEM_OUT)
    for store in _far_loads(cfg, MEM_OUT, 0, at):
        b.store(**{**store, "sram_base": store["sram_base"] % total, "dram_base": at + store["dram_base"]})
    return k.finish()


LONG_SPARE = 64
"""SRAM entries below the ``corner long`` programs' LOADs, for the read-back."""


def _long_samples(first: int, count: int) -> list[int]:
    """The entries read back of a LOAD that wrote ``count`` entries from ``first``: its first two, each side of
    every power of two of the offset, and its last."""
    offsets = {0, 1, count - 1} | {o for j in range(1, count.bit_length()) for o in ((1 << j) - 1, 1 << j)}
    return [first + o for o in sorted(offsets) if o < count]


def _long_corner(cfg: VTAConfig, mem: int) -> Program:
    """LOADs to ``mem`` whose row and element counters pass through every value below half the buffer's depth: one
    LOAD of ``depth // 2 - LONG_SPARE`` rows of one element (row stride 2) into the lower half, one of a single row
    of ``depth // 2 - 1`` elements into the upper half; entries of each (the first, each side of every power of two,
    the last) read back through a GEMM (inp, wgt) or the ALU (acc, acc8) and exposed. A row or element count cut or
    stretched, or a row address wrong after many rows, moves or loses the later entries."""
    half = cfg.depth(mem) // 2
    rows, elems = half - LONG_SPARE, half - 1
    samples = _long_samples(LONG_SPARE, rows) + _long_samples(half, elems)
    t = len(samples)
    k = _Kit(cfg, seed=160 + mem, out_rows=4 * t)
    b = k.bld
    pool = k.pool("long", mem, 2 * rows + elems)
    at = b.elem_addr(pool, mem)
    b.load(mem, sram_base=LONG_SPARE, dram_base=at, y_size=rows, x_size=1, x_stride=2)
    b.load(mem, sram_base=half, dram_base=at + 2 * rows, x_size=elems)
    if mem in (MEM_INP, MEM_WGT):
        other = MEM_WGT if mem == MEM_INP else MEM_INP
        k.load(other, k.pool("plain", other, 1), sram_base=0, x_size=1)
        b.dep_push("load", "compute")
        b.dep_pop("load", "compute")
        k.uops("gemm", [Uop(i, e if mem == MEM_INP else 0, e if mem == MEM_WGT else 0) for i, e in enumerate(samples)])
        b.gemm(uop_bgn=0, uop_end=t, reset=True)
        b.gemm(uop_bgn=0, uop_end=t)
    else:  # acc: the sampled entries added to zeroed spare entries
        k.uops("zero", [Uop(i, 0, 0) for i in range(t)] + [Uop(i, e, 0) for i, e in enumerate(samples)])
        b.gemm(uop_bgn=0, uop_end=t, reset=True)
        b.alu(ALU_ADD, uop_bgn=t, uop_end=2 * t)
    k.expose_acc(t)
    return k.finish()


UOP_FAR_BITS = 20
"""``corner addresses uop`` reads micro-ops from DRAM byte addresses up to ``2**UOP_FAR_BITS`` (a 1 MB region)."""


def _uop_addresses_corner(cfg: VTAConfig) -> Program:
    """Micro-ops LOADed from a ``2**UOP_FAR_BITS``-byte region of random valid micro-ops (8 accumulators, 4 inputs
    and 4 weights): one from every power-of-two byte offset and the last, then two-row LOADs from an address with
    every low bit set, with every power-of-two row stride that fits, into uop entries 0, 1, ...; each entry is then
    run alone as a GEMM on loaded operands and the accumulators exposed (a micro-op read from a wrong address or row
    accumulates other operands, or into another accumulator)."""
    k = _Kit(cfg, seed=140)
    b = k.bld
    eb, n = cfg.uop_bytes, 8
    size = (1 << UOP_FAR_BITS) // eb
    dst, src, wgt = k.rng.integers(0, n, size), k.rng.integers(0, n // 2, size), k.rng.integers(0, n // 2, size)
    far = b.alloc("uops far", encode_uops(dst, src, wgt, cfg))
    k.operands(acc=n, inp=n // 2, wgt=n // 2)
    base, entry = b.elem_addr(far, MEM_UOP), 0
    start = (base | (size // 2 - 1)) - base  # every address bit below the region's half set
    loads = [{"dram_base": (1 << j) // eb} for j in range(eb.bit_length() - 1, UOP_FAR_BITS)] + [
        {"dram_base": size - 1}] + [{"dram_base": start, "y_size": 2, "x_stride": 1 << s}
                                    for s in range(16) if start + (1 << s) < size]
    for load in loads:
        b.load(MEM_UOP, sram_base=entry, x_size=1, **{**load, "dram_base": base + load["dram_base"]})
        entry += load.get("y_size", 1)
    for j in range(entry):
        b.gemm(uop_bgn=j, uop_end=j + 1)
    k.expose_acc(n)
    return k.finish()


def _queue_full(cfg: VTAConfig) -> Program:
    """The load->compute token queue and load's command queue filled past their depths: compute first runs a long
    GEMM, while load runs ``token_queue_depth + 4`` one-element LOADs that each push a token (load must wait for
    room once the queue is full, and its later LOADs wait in its command queue); then compute pops them one GEMM
    each, and the results are exposed."""
    k = _Kit(cfg, seed=130)
    b = k.bld
    n = cfg.token_queue_depth + 4
    inp, wgt = k.pool("inp", MEM_INP, n + 1), k.pool("wgt", MEM_WGT, 1)
    k.load(MEM_WGT, wgt, sram_base=0, x_size=1)
    b.load(MEM_INP, sram_base=n, dram_base=b.elem_addr(inp, MEM_INP) + n, x_size=1)  # the long GEMM's operand
    b.dep_push("load", "compute")
    b.dep_pop("load", "compute")
    k.uops("gemm", [Uop(0, n, 0)] + [Uop(1 + i % 8, i, 0) for i in range(n)])
    b.gemm(uop_bgn=0, uop_end=1, iter_out=4 * n, iter_in=64, reset=True)  # long: load runs ahead
    for i in range(n):
        b.load(MEM_INP, sram_base=i, dram_base=b.elem_addr(inp, MEM_INP) + i, x_size=1)
        b.dep_push("load", "compute")
    for i in range(n):
        b.dep_pop("load", "compute")
        b.gemm(uop_bgn=1 + i, uop_end=2 + i)
    k.expose_acc(9)
    return k.finish()


def _finish_backlog(cfg: VTAConfig) -> Program:
    """FINISH while load still has a backlog: ``cmd_queue_depth + 4`` LOADs of 8 inp rows each that nothing waits
    for (their data stays in the SRAM, unread), then FINISH at once. fsim executes every instruction before FINISH,
    so ``done`` must wait until load has emptied its command queue, through every level from full to empty (a core
    that takes a level for empty, or forgets load, stops early: its instruction and byte counters fall short)."""
    k = _Kit(cfg, seed=150)
    n = cfg.cmd_queue_depth + 4
    rows = 8
    pool = k.pool("inp", MEM_INP, rows * n)
    base = k.bld.elem_addr(pool, MEM_INP)
    for i in range(n):
        k.bld.load(MEM_INP, sram_base=(i * rows) % (cfg.inp_depth - rows + 1), dram_base=base + i, y_size=rows,
                   x_size=1, x_stride=n)
    return k.finish()


LONG_RUN_UOPS = 600 * 1000
"""Micro-op iterations of the ``corner long run`` GEMM: more than 2**19 cycles at one a cycle."""


def _long_run(cfg: VTAConfig) -> Program:
    """A run longer than 2**19 cycles: one GEMM of :data:`LONG_RUN_UOPS` micro-op iterations while store holds the
    STORE waiting for its result, so the cycle counters (store's wait_token, fetch's and store's classes together,
    :func:`vta.tsim.conform_timing.covering_problems`) count past bit 19; the accumulator, wrapped many times,
    exposed."""
    k = _Kit(cfg, seed=170)
    k.operands(acc=1, inp=1, wgt=1)
    k.uops("gemm", [Uop(0, 0, 0)])
    k.bld.gemm(uop_bgn=0, uop_end=1, iter_out=LONG_RUN_UOPS // 1000, iter_in=1000)
    k.expose_acc(1)
    return k.finish()


# ---- timing stress ------------------------------------------------------------------------------------------------
STRESS_ROUNDS = 64
"""Rounds of the default ``stress tokens`` programs (``--thorough``: :data:`THOROUGH_ROUNDS`)."""
THOROUGH_ROUNDS = 128
STRESS_SLOTS = 4
"""Parts of each ring: tokens each queue may hold at once in the stress programs."""


def stress_program(cfg: VTAConfig, seed: int, rounds: int = STRESS_ROUNDS) -> Program:
    """:func:`vta.testing.token_stream_program`: a long stream at changing paces (see there)."""
    return token_stream_program(cfg, np.random.default_rng(seed), rounds=rounds, slots=STRESS_SLOTS)


FEATURES: dict[str, Callable[[VTAConfig], Program]] = {
    "load uop": _load_uop,
    "load wgt": partial(_load_operand, mem=MEM_WGT),
    "load inp": partial(_load_operand, mem=MEM_INP),
    "load acc": partial(_load_acc, mem=MEM_ACC),
    "load acc8": partial(_load_acc, mem=MEM_ACC_8BIT),
    "gemm": partial(_gemm, reset=False),
    "gemm reset": partial(_gemm, reset=True),
    **{f"alu {name}": partial(_alu, op=op, imm=imm) for name, op, imm in ALU_CASES},
    "alu req": _alu_req,
    "alu rsum": partial(_alu, op=ALU_RSUM, imm=None),
    "alu rsum_imm": partial(_alu, op=ALU_RSUM, imm=-300),
    "alu rmax": partial(_alu, op=ALU_RMAX, imm=None),
    "alu rmax_imm": partial(_alu, op=ALU_RMAX, imm=-7),
    "store": _store,
    **{f"tokens {q}": partial(_tokens, queue=q) for q in _QUEUES},
    "finish": _finish,
    **{f"corner alu {name}": partial(_alu_corner, op=op) for name, op in
       (("min", ALU_MIN), ("max", ALU_MAX), ("add", ALU_ADD), ("shr", ALU_SHR), ("mul", ALU_MUL))},
    "corner gemm extremes": _gemm_corner,
    "corner loops": _loops_corner,
    **{f"corner pads {name}": partial(_pads_corner, mem=mem) for name, mem in
       (("uop", MEM_UOP), ("wgt", MEM_WGT), ("inp", MEM_INP), ("acc", MEM_ACC), ("acc8", MEM_ACC_8BIT))},
    "corner store": _store_corner,
    **{f"corner addresses {name}": partial(_addresses_corner, mem=mem) for name, mem in
       (("wgt", MEM_WGT), ("inp", MEM_INP), ("acc", MEM_ACC), ("acc8", MEM_ACC_8BIT))},
    "corner addresses uop": _uop_addresses_corner,
    **{f"corner long {name}": partial(_long_corner, mem=mem) for name, mem in
       (("wgt", MEM_WGT), ("inp", MEM_INP), ("acc", MEM_ACC), ("acc8", MEM_ACC_8BIT))},
    "corner queue full": _queue_full,
    "corner finish backlog": _finish_backlog,
    "corner long run": _long_run,
    "stress tokens": partial(stress_program, seed=0),
}
"""Feature name -> the function building its program for a config."""


FEATURE_KNOBS: dict[str, str] = {"alu req": KNOB_ALU_OPS[ALU_REQ],
                                 **{f"alu {name}": KNOB_ALU_OPS[op] for op, name in
                                    ((ALU_RSUM, "rsum"), (ALU_RSUM, "rsum_imm"), (ALU_RMAX, "rmax"),
                                     (ALU_RMAX, "rmax_imm"))}}
"""Features that exist only at configs with a codesign knob on (feature -> the config field)."""


def features_for(cfg: VTAConfig) -> dict[str, Callable[[VTAConfig], Program]]:
    """:data:`FEATURES` that apply at ``cfg``: those of :data:`FEATURE_KNOBS` only with their knob on."""
    return {name: make for name, make in FEATURES.items()
            if name not in FEATURE_KNOBS or getattr(cfg, FEATURE_KNOBS[name])}


def feature_programs(cfg: VTAConfig) -> dict[str, Program]:
    """Every directed program of the kit that applies at ``cfg``, by feature name (see the module docstring)."""
    return {name: make(cfg) for name, make in features_for(cfg).items()}
