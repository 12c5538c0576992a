"""The functional simulator: the executable definition of every instruction (see :mod:`vta.isa` for the semantics).

:func:`run` executes a :class:`~vta.program.Program` and returns the final DRAM image and event counts. Every other
backend (the RTL co-simulation, fallbacks) must produce the same DRAM image bit for bit.

Module model (enough to catch token errors): fetch dispatches instructions in program order into three command queues
(load, compute, store) of ``cfg.cmd_queue_depth`` entries each, an instruction holding its entry until it retires,
and blocks while the target queue is full. Each module runs its queue in order: the head instruction first pops its
tokens (all its pops at once, blocking until every one is available), executes, then pushes (all at once, blocking
while any target token queue holds ``cfg.token_queue_depth`` tokens). The schedule is deterministic: at each step the
runnable head instruction with the smallest program index advances. Each token queue has one writer and one reader,
so whether a program deadlocks does not depend on the schedule: a program that completes here completes on the RTL
(which may free a command-queue entry when an instruction starts rather than when it retires: more capacity never
turns a completing program into a deadlocking one).

FINISH (compute) retires the program; other modules must have no instructions left then (a module still waiting
would finish after ``done``, so its effect would depend on timing); :meth:`vta.program.ProgramBuilder.finish` makes
FINISH wait for the store module.

Races: the schedule above may happen to order two modules' accesses to the same data correctly even when no token
does, while the hardware, running the modules concurrently, might not. ``run(..., check_races=True)`` (the default)
therefore tracks which instruction last wrote and read every shared SRAM entry and DRAM byte and raises
:class:`RaceError` for any cross-module access pair that no chain of tokens orders, and when FINISH is not ordered
after every STORE (see :mod:`vta.fsim_race`). A program that passes is deterministic on any timing.

CONCURRENT_ALU (``cfg.concurrent_alu``): ALU instructions still execute when the compute module takes them, but the
race check treats them as run by a second engine (a fourth agent with its own vector clock, handed each ALU
instruction after its pops): an ALU instruction's acc/out accesses and any GEMM's or LOAD ACC/ACC_8BIT's to the same
bank (``index >= acc_depth // 2``) must be ordered by a drain (LOAD UOP, FINISH), by the front end's wait before
pushing to a queue the engine pushes to, or by tokens; the ALU's out writes reach the store through its own pushes.

Statistics (:class:`Stats`) use the hardware counters' names (``vta.hw.regs.COUNTERS``) and meaning: byte counts are
element bytes ``y_size * x_size * elem_bytes`` (padding reads nothing; ACC_8BIT loads count their int8 DRAM bytes
under ``acc_bytes_read``); micro-op counts are ``iter_out * iter_in * (uop_end - uop_bgn)`` per GEMM/ALU
(:func:`vta.isa.insn_uops`); ``macs`` counts ``BATCH * BLOCK_IN * BLOCK_OUT`` per GEMM micro-op, except for reset
GEMMs, which count micro-ops but no MACs (they multiply nothing; with ``gemm_overwrite`` a reset GEMM writes its
products and counts them: :func:`vta.isa.insn_macs`); tokens are counted as :func:`vta.isa.insn_pops` and
:func:`vta.isa.insn_pushes` name them. FINISH counts as a compute instruction.

Speed: LOAD/STORE are strided numpy copies; GEMM groups the accumulator entries by the sequence of (input, weight)
tiles they reduce over and runs one float BLAS matmul per group (exact: float32 while a dot product has at most 1024
terms, float64 beyond, both far from rounding for int8 x int8 products); ALU ops are vectorized, falling back to an
exact element-order path only when a source entry is overwritten earlier in the same instruction. The kernels live
in :mod:`vta.fsim_kernels`; a GEMM's evaluation plan is cached per (instruction, chunk, micro-op contents)
in an LRU cache of at most ``_PLAN_CACHE_BYTES``. Loops run in chunks of at most ``_CHUNK_ITERS`` iterations, so memory
is proportional to the buffers and the DRAM image, never to the loop extents.

Element widths (``LOG_INP_WIDTH`` / ``LOG_WGT_WIDTH`` 2: int4, :mod:`vta.packing`): LOAD INP/WGT unpacks two int4
elements per byte (element ``2i`` in the low nibble) and sign-extends them, LOAD ACC_8BIT sign-extends out-width
elements into int32, GEMM multiplies the sign-extended values as at int8, every out-buffer write keeps the low
out-width bits of the accumulator (read back signed), and STORE packs them; byte counts are the packed bytes. The
buffers here hold the unpacked values (``keep_sram`` returns them as int8 arrays).

Range checks: every buffer entry an instruction reads or writes must be below the buffer's depth. Indices of buffers
an instruction does not read are not checked (src and wgt of a reset GEMM without ``gemm_overwrite``, src of an ALU
op with an immediate or a reset). A LOAD/STORE with ``x_size == 0`` moves only tokens and checks nothing; a LOAD
with ``y_size == 0`` and ``x_size > 0`` reads nothing and writes only its padding rows (zeros).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import numpy as np

from .config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_NAMES, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from .fsim_kernels import GemmPlan, alu_hazard, alu_op, blas_single_thread, nbytes_of, occurrence_rounds, wrap32
from .fsim_race import MODULE_INDEX, RaceTracker
from .isa import (
    ALU_NAMES,
    ALU_REQ,
    KNOB_ALU_OPS,
    MEMORY_TYPES,
    TOKEN_POPS,
    TOKEN_PUSHES,
    TOKEN_QUEUES,
    Alu,
    Finish,
    Gemm,
    Insn,
    Load,
    Store,
    alu_opcodes,
    decode_uops,
    insn_macs,
    insn_pops,
    insn_pushes,
    insn_uops,
    module_of,
)
from .packing import pack_elements, unpack_elements, wrap_elements
from .program import MODULES, Program

__all__ = ["run", "FsimResult", "Stats", "SimulationError", "DeadlockError", "SramRangeError", "DramRangeError",
           "InvalidInstructionError", "RunawayError", "RaceError", "TOKEN_QUEUES", "alu_op", "DEFAULT_MAX_INSNS",
           "DEFAULT_MAX_UOPS"]

_POPS, _PUSHES = TOKEN_POPS, TOKEN_PUSHES
_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")
_CHUNK_ELEMS = 1 << 23  # bound on gathered elements per GEMM/ALU chunk (memory ~32-64 MB)
_CHUNK_ITERS = 1 << 19  # bound on loop iterations per chunk (index arrays: a few int64 arrays of this many elements)
_PLAN_CACHE_BYTES = 1 << 27  # bound on the bytes of cached evaluation plans and their keys (128 MiB)

DEFAULT_MAX_INSNS = 10_000_000
"""Default bound on instructions executed by :func:`run` (ResNet-18 needs ~10^5)."""
DEFAULT_MAX_UOPS = 2 ** 32
"""Default bound on GEMM and ALU micro-op iterations executed by :func:`run` (``iter_out * iter_in * (uop_end -
uop_bgn)`` summed; ResNet-18 needs ~7.4 million per inference, ResNet-50 a few times that)."""


# ---- errors ---------------------------------------------------------------------------------------------------------
class SimulationError(RuntimeError):
    """A program cannot run to FINISH. ``insn_index`` is the instruction at fault (None when none is)."""

    def __init__(self, message: str, insn_index: int | None = None) -> None:
        super().__init__(message)
        self.insn_index = insn_index


class DeadlockError(SimulationError):
    """No module can make progress and work remains (or FINISH would retire while other modules still wait)."""


class SramRangeError(SimulationError):
    """An instruction addresses an on-chip buffer entry beyond the buffer's depth."""


class DramRangeError(SimulationError):
    """A LOAD or STORE touches bytes outside the DRAM image."""


class InvalidInstructionError(SimulationError):
    """An instruction no module can execute (bad memory type, STORE padding, bad token flag, ...)."""


class RunawayError(SimulationError):
    """The program would execute more instructions than ``max_insns`` or more GEMM/ALU micro-op iterations than
    ``max_uops`` (raised before the instruction that would exceed the limit executes)."""


class RaceError(SimulationError):
    """Two modules access the same data (SRAM entry or DRAM byte) with no dependency token ordering them, so the
    result would depend on timing (see :mod:`vta.fsim_race`)."""


# ---- results --------------------------------------------------------------------------------------------------------
@dataclass
class Stats:
    """Event counts of one run: bytes, micro-ops, MACs, instructions, tokens. The fields are
    :data:`vta.counters.STATISTICS`, in that order; each one's unit and meaning is in :data:`vta.counters.CATALOGUE`
    (``tests/test_counters.py`` checks that they agree)."""

    insn_bytes_read: int = 0
    uop_bytes_read: int = 0
    wgt_bytes_read: int = 0
    inp_bytes_read: int = 0
    acc_bytes_read: int = 0
    out_bytes_written: int = 0
    gemm_uops: int = 0
    alu_uops: int = 0
    macs: int = 0
    fetch_insns: int = 0
    load_insns: int = 0
    compute_insns: int = 0
    store_insns: int = 0
    load_to_compute_pushes: int = 0
    load_to_compute_pops: int = 0
    compute_to_load_pushes: int = 0
    compute_to_load_pops: int = 0
    compute_to_store_pushes: int = 0
    compute_to_store_pops: int = 0
    store_to_compute_pushes: int = 0
    store_to_compute_pops: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain ``{name: int}`` dict."""
        return {k: int(v) for k, v in asdict(self).items()}


@dataclass
class FsimResult:
    """``dram``: the final DRAM image (``uint8``, a copy owned by the caller); ``stats``: event counts; ``sram``: with
    ``run(..., keep_sram=True)``, the final on-chip buffers: ``inp`` (depth, BATCH, BLOCK_IN) int8, ``wgt`` (depth,
    BLOCK_OUT, BLOCK_IN) int8, ``acc`` (depth, BATCH, BLOCK_OUT) int32, ``out`` like acc but int8, ``uop`` (3, depth)
    int64 rows dst, src, wgt; else None."""

    dram: np.ndarray
    stats: Stats
    sram: dict[str, np.ndarray] | None = None


# ---- helpers --------------------------------------------------------------------------------------------------------
def _name(insn: Insn) -> str:
    if isinstance(insn, (Load, Store)):
        return f"{type(insn).__name__.upper()} {MEMORY_TYPES.get(insn.mem, insn.mem)}"
    if isinstance(insn, Alu):
        return f"ALU {ALU_NAMES.get(insn.alu_opcode, insn.alu_opcode)}"
    return type(insn).__name__.upper()


def _check_insn(k: int, insn: Insn, cfg: VTAConfig) -> None:
    """Static checks of one instruction; raises :class:`InvalidInstructionError`."""
    module = module_of(insn)
    for flag in _FLAGS:
        if getattr(insn, flag) and flag not in _POPS[module] and flag not in _PUSHES[module]:
            valid = ", ".join(sorted([*_POPS[module], *_PUSHES[module]]))
            raise InvalidInstructionError(f"instruction {k} ({_name(insn)}) sets {flag}, which the {module} module "
                                          f"does not have; its token flags are {valid}", k)
    if isinstance(insn, Load) and insn.mem not in (MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_ACC_8BIT):
        raise InvalidInstructionError(f"instruction {k} is a LOAD of memory type {insn.mem} "
                                      f"({MEMORY_TYPES.get(insn.mem, 'unknown')}); LOAD takes UOP, WGT, INP, ACC or "
                                      f"ACC_8BIT (the out buffer is written only by GEMM and ALU)", k)
    if isinstance(insn, Store):
        if insn.mem != MEM_OUT:
            raise InvalidInstructionError(f"instruction {k} is a STORE of memory type {insn.mem} "
                                          f"({MEMORY_TYPES.get(insn.mem, 'unknown')}); STORE reads only OUT (4)", k)
        pads = (insn.y_pad_0, insn.y_pad_1, insn.x_pad_0, insn.x_pad_1)
        if any(pads):
            raise InvalidInstructionError(f"instruction {k} is a STORE with padding (y_pad_0, y_pad_1, x_pad_0, "
                                          f"x_pad_1) = {pads}; STORE takes no padding", k)
    if isinstance(insn, (Gemm, Alu)) and insn.uop_end < insn.uop_bgn:
        raise InvalidInstructionError(f"instruction {k} ({_name(insn)}) has uop_end {insn.uop_end} < uop_bgn "
                                      f"{insn.uop_bgn}; the micro-op range [uop_bgn, uop_end) must not be negative", k)
    if isinstance(insn, Alu) and insn.alu_opcode not in alu_opcodes(cfg):
        knob = KNOB_ALU_OPS.get(insn.alu_opcode)
        extra = f" ({ALU_NAMES[insn.alu_opcode]} needs the {knob} knob, off in {cfg.name})" if knob else ""
        raise InvalidInstructionError(f"instruction {k} has ALU opcode {insn.alu_opcode}{extra}; known opcodes are "
                                      f"{', '.join(f'{v}={n}' for n, v in alu_opcodes(cfg).items())}", k)
    if isinstance(insn, Alu) and insn.alu_opcode == ALU_REQ and insn.use_imm:
        raise InvalidInstructionError(f"instruction {k} (ALU REQ) sets use_imm; REQ reads its multiplier and shift "
                                      f"from acc[src] and its clip range from imm, so use_imm must be clear", k)


# ---- the datapath ---------------------------------------------------------------------------------------------------
class _Machine:
    """SRAMs, DRAM and the execution of single instructions (token handling is the scheduler's)."""

    def __init__(self, program: Program, stats: Stats) -> None:
        cfg = self.cfg = program.cfg
        self.stats = stats
        self.dram = program.dram.copy()
        b, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
        self.inp = np.zeros((cfg.inp_depth, b, bi), np.int8)
        self.wgt = np.zeros((cfg.wgt_depth, bo, bi), np.int8)
        self.acc = np.zeros((cfg.acc_depth, b, bo), np.int32)
        self.out = np.zeros((cfg.acc_depth, b, bo), np.int8)
        self.uop = np.zeros((3, cfg.uop_depth), np.int64)  # rows: dst, src, wgt
        self._plans: OrderedDict[tuple[object, ...], tuple[Any, int]] = OrderedDict()  # (plan, bytes) by
        self._plan_bytes = 0  # (insn, chunk, micro-op contents), least recently used first; total bytes
        self.race: RaceTracker | None = None  # set by run() when checking races
        self.vc: tuple[int, ...] = (0,) * len(MODULE_INDEX)  # vector clock of the executing instruction (fsim_race)
        self.banked = cfg.concurrent_alu  # CONCURRENT_ALU: acc/out bank accesses by the front end and the ALU engine
        self.elem_shape = {MEM_INP: (b, bi), MEM_WGT: (bo, bi), MEM_ACC: (b, bo), MEM_ACC_8BIT: (b, bo)}

    def _recall(self, key: tuple[object, ...]) -> Any:
        """The cached plan of ``key`` (None when there is none)."""
        entry = self._plans.get(key)
        if entry is None:
            return None
        self._plans.move_to_end(key)
        return entry[0]

    def _remember(self, key: tuple[object, ...], plan: Any) -> Any:
        """Cache an evaluation plan; the least recently used plans go while the cache would exceed
        ``_PLAN_CACHE_BYTES`` (plan arrays plus the key's micro-op bytes); a plan larger than that is not cached."""
        size = nbytes_of(plan) + nbytes_of(key)
        if size > _PLAN_CACHE_BYTES:
            return plan
        while self._plans and self._plan_bytes + size > _PLAN_CACHE_BYTES:
            self._plan_bytes -= self._plans.popitem(last=False)[1][1]
        self._plans[key] = (plan, size)
        self._plan_bytes += size
        return plan

    def _check(self, k: int, message: str | None) -> None:
        if message is not None:
            raise RaceError(message, k)

    def execute(self, k: int, insn: Insn) -> None:
        if isinstance(insn, Load):
            self._load(k, insn)
        elif isinstance(insn, Store):
            self._store(k, insn)
        elif isinstance(insn, Gemm):
            self._gemm(k, insn)
        elif isinstance(insn, Alu):
            self._alu(k, insn)

    # -- LOAD / STORE
    def _dram_range(self, k: int, insn: Load | Store, eb: int) -> tuple[int, int]:
        lo = insn.dram_base * eb
        hi = (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb
        if insn.y_size > 0 and (lo < 0 or insn.x_stride < 0 or hi > self.dram.size):
            verb = "reads" if isinstance(insn, Load) else "writes"
            raise DramRangeError(f"instruction {k} ({_name(insn)}) {verb} DRAM bytes [{lo}, {hi}), outside the "
                                 f"{self.dram.size}-byte DRAM image", k)
        return lo, hi

    def _rows(self, lo: int, y: int, x_bytes: int, stride_bytes: int, writeable: bool = False) -> np.ndarray:
        """A (y, x_bytes) strided view of DRAM starting at byte ``lo``."""
        return np.lib.stride_tricks.as_strided(self.dram[lo:], shape=(y, x_bytes), strides=(stride_bytes, 1),
                                               writeable=writeable)

    def _load(self, k: int, insn: Load) -> None:
        if insn.x_size == 0:
            return
        cfg, mem = self.cfg, insn.mem
        eb = cfg.elem_bytes(mem)
        height = insn.y_pad_0 + insn.y_size + insn.y_pad_1
        width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
        depth = cfg.depth(mem)
        end = insn.sram_base + height * width
        if end > depth:
            buf = MEM_NAMES[MEM_ACC if mem == MEM_ACC_8BIT else mem]
            raise SramRangeError(f"instruction {k} ({_name(insn)}) writes {buf} entries [{insn.sram_base}, {end}), "
                                 f"but the {buf} buffer has {depth} entries (index {end - 1} >= depth {depth})", k)
        lo, _ = self._dram_range(k, insn, eb)
        if self.race is not None:
            module = "load" if mem in (MEM_INP, MEM_WGT) else "compute"
            self._check(k, self.race.dram_read(k, module, lo, insn.y_size, insn.x_size * eb, insn.x_stride * eb,
                                               self.vc))
            if module == "load":
                self._check(k, self.race.sram_write(k, MEM_NAMES[mem], slice(insn.sram_base, end), self.vc))
            elif self.banked and mem in (MEM_ACC, MEM_ACC_8BIT):
                self._check(k, self.race.bank_access(k, "compute", slice(insn.sram_base, end), self.vc))
        raw = np.ascontiguousarray(self._rows(lo, insn.y_size, insn.x_size * eb, insn.x_stride * eb))
        nbytes = insn.y_size * insn.x_size * eb
        y0, x0 = insn.y_pad_0, insn.x_pad_0
        ys, xs = slice(y0, y0 + insn.y_size), slice(x0, x0 + insn.x_size)
        if mem == MEM_UOP:
            self.stats.uop_bytes_read += nbytes
            words = raw.view("<u4" if cfg.uop_bytes == 4 else "<u8").reshape(insn.y_size, insn.x_size)
            block = np.zeros((3, height, width), np.int64)
            for row, field in enumerate(decode_uops(words, cfg)):
                block[row, ys, xs] = field
            self.uop[:, insn.sram_base:end] = block.reshape(3, height * width)
            return
        shape = self.elem_shape[mem]
        data: np.ndarray
        target: np.ndarray
        if mem == MEM_ACC:
            self.stats.acc_bytes_read += nbytes
            data, target = raw.view("<i4").astype(np.int32), self.acc
        elif mem == MEM_ACC_8BIT:
            self.stats.acc_bytes_read += nbytes
            data, target = unpack_elements(raw, cfg.out_width).astype(np.int32), self.acc
        elif mem == MEM_INP:
            self.stats.inp_bytes_read += nbytes
            data, target = unpack_elements(raw, cfg.inp_width), self.inp
        else:
            self.stats.wgt_bytes_read += nbytes
            data, target = unpack_elements(raw, cfg.wgt_width), self.wgt
        data = data.reshape((insn.y_size, insn.x_size) + shape)
        if height == insn.y_size and width == insn.x_size:
            target[insn.sram_base:end] = data.reshape((-1,) + shape)
            return
        block = np.zeros((height, width) + shape, target.dtype)
        block[ys, xs] = data
        target[insn.sram_base:end] = block.reshape((-1,) + shape)

    def _store(self, k: int, insn: Store) -> None:
        if insn.x_size == 0:
            return
        cfg = self.cfg
        eb = cfg.out_elem_bytes
        end = insn.sram_base + insn.y_size * insn.x_size
        if end > cfg.out_depth:
            raise SramRangeError(f"instruction {k} ({_name(insn)}) reads out entries [{insn.sram_base}, {end}), but "
                                 f"the out buffer has {cfg.out_depth} entries (index {end - 1} >= depth "
                                 f"{cfg.out_depth})", k)
        lo, _ = self._dram_range(k, insn, eb)
        if self.race is not None:
            self._check(k, self.race.sram_read(k, "out", slice(insn.sram_base, end), self.vc))
            self._check(k, self.race.dram_write(k, lo, insn.y_size, insn.x_size * eb, insn.x_stride * eb, self.vc))
        data = pack_elements(self.out[insn.sram_base:end], cfg.out_width).reshape(insn.y_size, insn.x_size * eb)
        self.stats.out_bytes_written += insn.y_size * insn.x_size * eb
        if insn.x_stride >= insn.x_size or insn.y_size == 1:
            self._rows(lo, insn.y_size, insn.x_size * eb, insn.x_stride * eb, writeable=True)[...] = data
        else:  # rows overlap: later rows win, as in element order
            for y in range(insn.y_size):
                start = lo + y * insn.x_stride * eb
                self.dram[start:start + insn.x_size * eb] = data[y]

    # -- GEMM / ALU loops
    def _chunks(self, insn: Gemm | Alu, width: int) -> Iterator[tuple[int, int]]:
        """Flat iteration ranges [t0, t1), in order, of at most ``_CHUNK_ITERS`` iterations and ~``_CHUNK_ELEMS``
        gathered elements (``width`` elements per iteration), cut at iter_out boundaries where possible. A generator:
        memory does not grow with the loop extents."""
        nu = insn.uop_end - insn.uop_bgn
        total = insn_uops(insn)
        limit = max(1, min(_CHUNK_ELEMS // width, _CHUNK_ITERS))
        per_o = insn.iter_in * nu
        if 0 < per_o <= limit:
            step = (limit // per_o) * per_o
        elif 0 < nu <= limit:
            step = (limit // nu) * nu
        else:
            step = limit
        for t in range(0, total, step):
            yield t, min(t + step, total)

    def _indices(self, k: int, insn: Gemm | Alu, t0: int, t1: int,
                 targets: list[tuple[int, str, str]]) -> list[np.ndarray]:
        """Buffer indices of iterations [t0, t1): per target (uop row name, uop row, factor prefix, buffer)."""
        nu = insn.uop_end - insn.uop_bgn
        t = np.arange(t0, t1, dtype=np.int64)
        u = insn.uop_bgn + t % nu
        i = (t // nu) % insn.iter_in
        o = t // (nu * insn.iter_in)
        out = []
        for row, prefix, buf in targets:
            factor_out, factor_in = getattr(insn, f"{prefix}_factor_out"), getattr(insn, f"{prefix}_factor_in")
            idx = self.uop[row][u] + o * factor_out + i * factor_in
            depth = getattr(self.cfg, f"{buf}_depth")
            bad = idx >= depth
            if bad.any():
                j = int(np.argmax(bad))
                raise SramRangeError(f"instruction {k} ({_name(insn)}) addresses {buf} entry {int(idx[j])} "
                                     f"(iteration o={int(o[j])}, i={int(i[j])}, micro-op {int(u[j])}), but the {buf} "
                                     f"buffer has {depth} entries", k)
            out.append(idx)
        return out

    def _check_uops(self, k: int, insn: Gemm | Alu) -> int:
        if insn.uop_end > self.cfg.uop_depth:
            raise SramRangeError(f"instruction {k} ({_name(insn)}) reads micro-ops [{insn.uop_bgn}, {insn.uop_end}), "
                                 f"but the uop buffer has {self.cfg.uop_depth} entries", k)
        return insn_uops(insn)

    def _gemm(self, k: int, insn: Gemm) -> None:
        total = self._check_uops(k, insn)
        cfg = self.cfg
        self.stats.gemm_uops += total
        self.stats.macs += insn_macs(insn, cfg)
        overwrite = insn.reset and cfg.gemm_overwrite  # the knob's reset writes the products instead of zeros
        targets = [(0, "dst", "acc"), (1, "src", "inp"), (2, "wgt", "wgt")]
        uops = self.uop[:, insn.uop_bgn:insn.uop_end].tobytes()
        for t0, t1 in self._chunks(insn, cfg.batch * cfg.block_in + cfg.block_out * cfg.block_in):
            key = (insn, t0, t1, uops)
            plan = self._recall(key)
            if overwrite:
                if plan is None:
                    d, s, w = self._indices(k, insn, t0, t1, targets)
                    # each destination ends with the products of the last micro-op that writes it
                    _, rev = np.unique(d[::-1], return_index=True)
                    last = d.size - 1 - rev
                    plan = GemmPlan(d[last], s[last], w[last], cfg.block_in)
                    plan.reads = (np.unique(s), np.unique(w))  # every micro-op reads its operands
                    plan = self._remember(key, plan)
                self._gemm_checks(k, plan)
                new = wrap32(plan.sums(self.inp, self.wgt))
                self.acc[plan.du] = new
                self.out[plan.du] = wrap_elements(new, cfg.out_width)
                continue
            if insn.reset:  # reads neither inp nor wgt: only dst indices are computed and checked
                if plan is None:
                    plan = self._remember(key, self._indices(k, insn, t0, t1, targets[:1])[0])
                if self.race is not None:
                    self._check(k, self.race.sram_write(k, "out", plan, self.vc))
                    if self.banked:
                        self._check(k, self.race.bank_access(k, "compute", plan, self.vc))
                self.acc[plan] = 0
                self.out[plan] = 0
                continue
            if plan is None:
                d, s, w = self._indices(k, insn, t0, t1, targets)
                plan = self._remember(key, GemmPlan(d, s, w, cfg.block_in))
            du = plan.du
            self._gemm_checks(k, plan)
            new = wrap32(self.acc[du].astype(np.int64) + plan.sums(self.inp, self.wgt))
            self.acc[du] = new
            self.out[du] = wrap_elements(new, cfg.out_width)

    def _gemm_checks(self, k: int, plan: GemmPlan) -> None:
        """Race checks of a GEMM chunk that reads inp/wgt (``plan.reads``) and writes acc/out ``plan.du``."""
        if self.race is not None:
            self._check(k, self.race.sram_read(k, "inp", plan.reads[0], self.vc))
            self._check(k, self.race.sram_read(k, "wgt", plan.reads[1], self.vc))
            self._check(k, self.race.sram_write(k, "out", plan.du, self.vc))
            if self.banked:
                self._check(k, self.race.bank_access(k, "compute", plan.du, self.vc))

    def _alu(self, k: int, insn: Alu) -> None:
        total = self._check_uops(k, insn)
        cfg = self.cfg
        self.stats.alu_uops += total
        uops = self.uop[:, insn.uop_bgn:insn.uop_end].tobytes()
        for t0, t1 in self._chunks(insn, cfg.batch * cfg.block_out):
            key = (insn, t0, t1, uops)
            plan = self._recall(key)
            if plan is None:
                plan = self._remember(key, self._alu_plan(k, insn, t0, t1))
            mode, d, steps = plan
            if self.race is not None:
                self._check(k, self.race.sram_write(k, "out", d, self.vc, self.banked))
                if self.banked:  # the engine's destinations, then its sources (acc entries it reads)
                    self._check(k, self.race.bank_access(k, "alu", d, self.vc))
                    for _, ss in steps:
                        if ss is not None and ss.size:
                            self._check(k, self.race.bank_access(k, "alu", ss, self.vc))
            if mode == "reset":
                self.acc[d] = 0
                self.out[d] = 0
            elif mode == "sequential":
                self._alu_sequential(insn, *steps[0])
            else:
                for dd, ss in steps:  # round r: the r-th occurrence of every destination (all distinct)
                    new = alu_op(insn.alu_opcode, self.acc[dd], insn.imm if ss is None else self.acc[ss], insn.imm)
                    self.acc[dd] = new
                    self.out[dd] = wrap_elements(new, cfg.out_width)

    def _alu_plan(self, k: int, insn: Alu, t0: int, t1: int) -> tuple[str, np.ndarray, list[tuple[Any, Any]]]:
        """(mode, destinations, steps) for iterations [t0, t1): 'reset'; 'rounds' (vectorized, exact when no source
        is an entry written earlier by this instruction); or 'sequential' (element order)."""
        reads_src = not (insn.reset or insn.use_imm)  # src indices are computed and checked only when read
        d, *rest = self._indices(k, insn, t0, t1, [(0, "dst", "acc"), (1, "src", "acc")][:1 + reads_src])
        s = rest[0] if rest else None
        if insn.reset:
            return "reset", d, []
        if s is not None and alu_hazard(d, s, self.cfg.acc_depth):
            return "sequential", d, [(d, s)]
        steps = []
        for sel in occurrence_rounds(d):
            if sel is None:
                steps.append((d, s))
            else:
                steps.append((d[sel], None if s is None else s[sel]))
        return "rounds", d, steps

    def _alu_sequential(self, insn: Alu, d: np.ndarray, s: np.ndarray) -> None:
        """Element order, one iteration at a time (sources overwritten earlier in the same instruction)."""
        acc, out, op = self.acc, self.out, insn.alu_opcode
        for dj, sj in zip(d.tolist(), s.tolist()):
            acc[dj] = alu_op(op, acc[dj], acc[sj], insn.imm)
            out[dj] = wrap_elements(acc[dj], self.cfg.out_width)


def _check_limit(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be None or a non-negative integer, not {value!r}")


def run(program: Program, *, max_insns: int | None = DEFAULT_MAX_INSNS, max_uops: int | None = DEFAULT_MAX_UOPS,
        keep_sram: bool = False, check_races: bool = True, schedule_seed: int | None = None) -> FsimResult:
    """Run ``program`` to FINISH; returns the final DRAM image (a copy), statistics and, with ``keep_sram``, the
    final on-chip buffers.

    Raises a :class:`SimulationError` subclass (with ``insn_index``) when the program is invalid, addresses memory
    out of range, deadlocks, lacks FINISH, would execute more than ``max_insns`` instructions or more than
    ``max_uops`` GEMM/ALU micro-op iterations (:class:`RunawayError`, before the instruction that would exceed the
    limit executes; None means no limit) or, with ``check_races``, lets two modules access the same data without a
    dependency token ordering them (:class:`RaceError`).

    Memory: the DRAM image (a copy), the config's buffers, the race tracker's arrays (proportional to both) and the
    working arrays of one chunk of a GEMM/ALU loop (at most ``_CHUNK_ITERS`` iterations), plus a plan cache of at most
    ``_PLAN_CACHE_BYTES``; none of it grows with the loop extents.

    ``schedule_seed`` (for testing) replaces the smallest-index-first schedule by a seeded random choice among the
    runnable head instructions: a program that passes the race check ends with the same DRAM image on every schedule.
    """
    if not isinstance(program, Program):
        raise TypeError(f"run() takes a Program, not {type(program).__name__}")
    _check_limit("max_insns", max_insns)
    _check_limit("max_uops", max_uops)
    cfg, insns = program.cfg, program.insns
    finish_at = None
    for k, insn in enumerate(insns):
        if finish_at is not None:
            raise InvalidInstructionError(f"instruction {k} ({_name(insn)}) follows FINISH (instruction {finish_at}); "
                                          f"FINISH must be the last instruction", k)
        _check_insn(k, insn, cfg)
        if isinstance(insn, Finish):
            finish_at = k
    if not insns:
        raise InvalidInstructionError("the program has no instructions; it must end with FINISH", None)
    if finish_at is None:
        raise InvalidInstructionError(f"the program has no FINISH instruction; its last instruction (index "
                                      f"{len(insns) - 1}) must be FINISH", len(insns) - 1 if insns else None)
    stats = Stats()
    machine = _Machine(program, stats)
    if check_races:
        machine.race = RaceTracker.for_program(program, _name)
    with blas_single_thread():
        _Scheduler(program, machine, stats, max_insns, max_uops, schedule_seed).run()
    sram: dict[str, np.ndarray] | None = None
    if keep_sram:
        sram = {"inp": machine.inp, "wgt": machine.wgt, "acc": machine.acc, "out": machine.out, "uop": machine.uop}
    return FsimResult(machine.dram, stats, sram)


class _Scheduler:
    """Fetch, three command queues, four token queues; see the module docstring for the rules."""

    def __init__(self, program: Program, machine: _Machine, stats: Stats, max_insns: int | None,
                 max_uops: int | None, schedule_seed: int | None = None) -> None:
        self.rng = None if schedule_seed is None else np.random.default_rng(schedule_seed)
        self.insns = program.insns
        self.cfg = program.cfg
        self.machine = machine
        self.stats = stats
        self.max_insns = max_insns
        self.max_uops = max_uops
        self.uops = 0  # GEMM/ALU micro-op iterations executed
        self.insn_bytes = program.insn_bytes
        self.modules = [module_of(i) for i in self.insns]
        self.pops = [insn_pops(i) for i in self.insns]
        self.pushes = [insn_pushes(i) for i in self.insns]
        self.queues: dict[str, deque[int]] = {m: deque() for m in MODULES}
        self.executed = {m: False for m in MODULES}  # head has popped and executed; waits to push
        self.tokens = dict.fromkeys(TOKEN_QUEUES, 0)
        self.fetched = 0
        self.count = 0
        # vector clocks (see fsim_race): per module, and carried by every token in flight
        self.vc = {m: [0] * len(MODULE_INDEX) for m in MODULES}
        self.token_vcs: dict[str, deque[tuple[int, ...]]] = {q: deque() for q in TOKEN_QUEUES}
        # CONCURRENT_ALU: the ALU engine's clock, and per token queue its clock right after the last ALU
        # instruction pushing to that queue (the front end waits for that one before pushing there itself)
        self.concurrent_alu = self.cfg.concurrent_alu
        self.engine = [0] * len(MODULE_INDEX)
        self.engine_pushed: dict[str, tuple[int, ...]] = {}

    def _fetch(self) -> None:
        depth = self.cfg.cmd_queue_depth
        while self.fetched < len(self.insns):
            q = self.queues[self.modules[self.fetched]]
            if len(q) >= depth:
                return
            q.append(self.fetched)
            self.fetched += 1
            self.stats.fetch_insns += 1
            self.stats.insn_bytes_read += self.insn_bytes

    def _ready(self, module: str) -> bool:
        k = self.queues[module][0]
        if self.executed[module]:
            limit = self.cfg.token_queue_depth
            return all(self.tokens[q] < limit for q in self.pushes[k])
        return all(self.tokens[q] > 0 for q in self.pops[k])

    def _pick(self) -> tuple[int, str]:
        """The head instruction to advance: the runnable one with the smallest index or, with a schedule seed, a
        random runnable one (FINISH only when nothing else can run). (-1, '') when none can run."""
        ready = [(self.queues[m][0], m) for m in MODULES if self.queues[m] and self._ready(m)]
        if not ready:
            return -1, ""
        if self.rng is None:
            return min(ready)
        others = [r for r in ready if not isinstance(self.insns[r[0]], Finish)]
        choices = others or ready
        return choices[int(self.rng.integers(len(choices)))]

    def run(self) -> None:
        stats = self.stats
        while True:
            self._fetch()
            best, best_module = self._pick()
            if best < 0:
                raise DeadlockError(self._blocked_message("the program deadlocks"), self._first_blocked())
            insn = self.insns[best]
            if not self.executed[best_module]:
                vc = self.vc[best_module]
                for q in self.pops[best]:
                    self.tokens[q] -= 1
                    vc[:] = map(max, vc, self.token_vcs[q].popleft())
                    setattr(stats, f"{q}_pops", getattr(stats, f"{q}_pops") + 1)
                self._count_work(best, insn)
                if self.concurrent_alu and best_module == "compute":
                    self.machine.vc = self._front_end(best, insn, vc)
                else:
                    vc[MODULE_INDEX[best_module]] += 1
                    self.machine.vc = tuple(vc)
                if isinstance(insn, Finish) and self.machine.race is not None:
                    self.machine._check(best, self.machine.race.finish(best, vc))
                self.machine.execute(best, insn)
                if self.concurrent_alu and best_module == "compute" and not isinstance(insn, Alu):
                    for q in self.pushes[best]:  # wait for the engine's instructions pushing to q
                        if q in self.engine_pushed:
                            vc[:] = map(max, vc, self.engine_pushed[q])
                self.executed[best_module] = True
                if not self._ready(best_module):
                    continue
            # an ALU instruction's pushes carry the engine's clock (still this ALU's: compute hands off no other
            # instruction before these pushes are made)
            clock = self.engine if self.concurrent_alu and isinstance(insn, Alu) else self.vc[best_module]
            for q in self.pushes[best]:
                self.tokens[q] += 1
                self.token_vcs[q].append(tuple(clock))
                setattr(stats, f"{q}_pushes", getattr(stats, f"{q}_pushes") + 1)
            self.executed[best_module] = False
            self.queues[best_module].popleft()
            setattr(stats, f"{best_module}_insns", getattr(stats, f"{best_module}_insns") + 1)
            if isinstance(insn, Finish):
                if any(self.queues.values()):
                    raise DeadlockError(self._blocked_message(f"FINISH (instruction {best}) cannot end the program")
                                        + "; make FINISH wait for them (ProgramBuilder.finish does this for store)",
                                        self._first_blocked())
                return

    def _front_end(self, k: int, insn: Insn, vc: list[int]) -> tuple[int, ...]:
        """CONCURRENT_ALU: the happens-before bookkeeping of compute instruction ``k`` (its pops are already in
        ``vc``, the front end's clock); returns the clock its accesses are checked with. An ALU instruction is handed
        to the engine (the engine's clock takes the front end's and counts one more ALU instruction; the front end's
        count does not move); a LOAD UOP or FINISH first drains the engine (the front end takes the engine's clock)."""
        engine = self.engine
        if isinstance(insn, Alu):
            engine[:] = map(max, engine, vc)
            engine[MODULE_INDEX["alu"]] += 1
            clock = tuple(engine)
            for q in self.pushes[k]:
                self.engine_pushed[q] = clock
            return clock
        if isinstance(insn, Finish) or (isinstance(insn, Load) and insn.mem == MEM_UOP):
            vc[:] = map(max, vc, engine)
        vc[MODULE_INDEX["compute"]] += 1
        return tuple(vc)

    def _count_work(self, k: int, insn: Insn) -> None:
        """Count instruction ``k`` and its micro-ops; :class:`RunawayError` (before it executes) past a limit."""
        self.count += 1
        if self.max_insns is not None and self.count > self.max_insns:
            raise RunawayError(f"more than max_insns={self.max_insns} instructions executed (instruction {k} would "
                               f"be number {self.count}); raise the limit (max_insns=N, vta run --max-insns N; None "
                               f"or 'none' for no limit) if the program is meant to be this long", k)
        if not isinstance(insn, (Gemm, Alu)):
            return
        n = insn_uops(insn)
        if self.max_uops is not None and self.uops + n > self.max_uops:
            raise RunawayError(f"more than max_uops={self.max_uops} GEMM/ALU micro-op iterations executed: "
                               f"instruction {k} ({_name(insn)}) would execute {n} (iter_out {insn.iter_out} x "
                               f"iter_in {insn.iter_in} x {insn.uop_end - insn.uop_bgn} micro-ops) after {self.uops}; "
                               f"raise the limit (max_uops=N, vta run --max-uops N; None or 'none' for no limit) if "
                               f"the program is meant to do this much work", k)
        self.uops += n

    def _first_blocked(self) -> int | None:
        heads = [q[0] for q in self.queues.values() if q]
        if self.fetched < len(self.insns):
            heads.append(self.fetched)
        return min(heads) if heads else None

    def _blocked_message(self, what: str) -> str:
        parts = []
        for m in MODULES:
            if not self.queues[m]:
                continue
            k = self.queues[m][0]
            name = _name(self.insns[k])
            if self.executed[m]:
                full = [q for q in self.pushes[k] if self.tokens[q] >= self.cfg.token_queue_depth]
                waits = " and ".join(f"room in the full {q.replace('_to_', '->')} token queue "
                                     f"({self.cfg.token_queue_depth} tokens)" for q in full)
            else:
                flags = {q: f for f, q in _POPS[m].items()}
                empty = [q for q in self.pops[k] if self.tokens[q] == 0]
                waits = " and ".join(f"a {q.replace('_to_', '->')} token ({flags[q]})" for q in empty)
            waits = waits or "nothing (it could run only after FINISH)"
            parts.append(f"{m} module: instruction {k} ({name}) waits for {waits}")
        if self.fetched < len(self.insns):
            m = self.modules[self.fetched]
            parts.append(f"fetch: instruction {self.fetched} waits for room in the full {m} command queue "
                         f"({self.cfg.cmd_queue_depth} instructions)")
        return f"{what}: " + "; ".join(parts)
