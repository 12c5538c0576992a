"""The directed programs of the conformance kit (:mod:`vta.tsim.conform`): one small program per feature of the ISA.

Each program makes its feature observable in DRAM: what a LOAD put in an SRAM buffer reaches the out buffer through
a GEMM or an ALU op and is stored; accumulators are exposed whole (all four bytes of each 32-bit value: the low byte,
then three ``SHR 8`` steps), so a wrong bit anywhere in an accumulator shows. The kit runs every program on the
functional simulator (the spec) and on the core and compares; the expected values are fsim's, not written here.

Features (:func:`feature_programs`): LOADs with padding on all four sides and a row stride to each memory type
(``load uop``, ``load wgt``, ``load inp``, ``load acc``, ``load acc8``), ``gemm`` (two-level loops, every factor,
accumulating) and ``gemm reset``, ``alu <case>`` for every case of :data:`vta.testing.ALU_CASES` (every opcode, with
an immediate and with a vector operand; ``alu req`` at configs with the ``fused_requant`` knob), ``store`` (strided
rows over pre-filled DRAM), ``tokens <src>-><dst>`` for the four token queues (hazards that only the tokens order,
with several tokens in flight) and ``finish`` (FINISH alone).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable

import numpy as np

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.isa import ALU_ADD, ALU_REQ, ALU_SHR, KNOB_ALU_OPS, Uop, requant_imm, requant_word
from vta.program import Allocation, Program, ProgramBuilder
from vta.testing import ALU_CASES

__all__ = ["feature_programs", "features_for", "FEATURES", "FEATURE_KNOBS"]


class _DrainingBuilder(ProgramBuilder):
    """A builder that drains the ``concurrent_alu`` engine after every ALU instruction: the kit's programs reuse acc
    entries right after ALU instructions, which the knob's bank rule allows only once the engine is done."""

    def alu(self, *args: Any, **kwargs: Any) -> int:
        index = super().alu(*args, **kwargs)
        self.drain_alu()
        return index


class _Kit:
    """A program under construction with seeded random pools in DRAM and helpers that expose buffers."""

    def __init__(self, cfg: VTAConfig, seed: int) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(seed)
        self.bld = _DrainingBuilder(cfg) if cfg.concurrent_alu else ProgramBuilder(cfg)
        self.out = self.bld.alloc("out", (128, cfg.batch, cfg.block_out), np.int8)
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
    k.load(MEM_ACC, k.pool("acc", MEM_ACC, 8), sram_base=0, x_size=8)
    k.load(MEM_INP, k.pool("inp", MEM_INP, 5), sram_base=0, x_size=5)
    k.load(MEM_WGT, k.pool("wgt", MEM_WGT, 6), sram_base=0, x_size=6)
    k.bld.dep_push("load", "compute")
    k.bld.dep_pop("load", "compute")
    k.bld.load(MEM_UOP, dram_base=k.bld.elem_addr(kernel, MEM_UOP), **_padded(MEM_UOP))
    k.bld.gemm(uop_bgn=0, uop_end=_PADDED_ENTRIES)
    k.expose_acc(8)
    return k.finish()


def _gemm(cfg: VTAConfig, reset: bool) -> Program:
    """A GEMM with two-level loops and every index factor, accumulating on loaded acc (or resetting it)."""
    k = _Kit(cfg, seed=30 + reset)
    k.load(MEM_ACC, k.pool("acc", MEM_ACC, 24), sram_base=0, x_size=24)
    k.load(MEM_INP, k.pool("inp", MEM_INP, 16), sram_base=0, x_size=16)
    k.load(MEM_WGT, k.pool("wgt", MEM_WGT, 16), sram_base=0, x_size=16)
    k.bld.dep_push("load", "compute")
    k.bld.dep_pop("load", "compute")
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
    "store": _store,
    **{f"tokens {q}": partial(_tokens, queue=q) for q in _QUEUES},
    "finish": _finish,
}
"""Feature name -> the function building its program for a config."""


FEATURE_KNOBS: dict[str, str] = {"alu req": KNOB_ALU_OPS[ALU_REQ]}
"""Features that exist only at configs with a codesign knob on (feature -> the config field)."""


def features_for(cfg: VTAConfig) -> dict[str, Callable[[VTAConfig], Program]]:
    """:data:`FEATURES` that apply at ``cfg``: those of :data:`FEATURE_KNOBS` only with their knob on."""
    return {name: make for name, make in FEATURES.items()
            if name not in FEATURE_KNOBS or getattr(cfg, FEATURE_KNOBS[name])}


def feature_programs(cfg: VTAConfig) -> dict[str, Program]:
    """Every directed program of the kit that applies at ``cfg``, by feature name (see the module docstring)."""
    return {name: make(cfg) for name, make in features_for(cfg).items()}
