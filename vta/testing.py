"""Program generators shared by tests, benchmarks and fault campaigns: an ALU exerciser and random valid programs.

Every function takes the config explicitly and works for any valid one (BATCH 1..16, BLOCK 4..64, small buffers).
The ``expected`` array :func:`alu_program` returns equals ``program.read("out", final_dram)`` after a correct run;
:func:`random_program` returns only a program, for co-simulation against :mod:`vta.fsim`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from .isa import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_RMAX, ALU_RSUM, ALU_SHR, Uop
from .program import Program, ProgramBuilder, SlotRing

__all__ = ["alu_program", "random_program", "token_stream_program", "ALU_CASES", "PACES"]


# ---- ALU exerciser ---------------------------------------------------------------------------------------------------
ALU_CASES: tuple[tuple[str, int, int | None], ...] = (
    ("min_imm", ALU_MIN, -5), ("max_imm", ALU_MAX, 7), ("add_imm", ALU_ADD, 32767), ("shr_imm", ALU_SHR, 3),
    ("shl_imm", ALU_SHR, -4), ("mul_imm", ALU_MUL, -32768),
    ("min", ALU_MIN, None), ("max", ALU_MAX, None), ("add", ALU_ADD, None), ("shr", ALU_SHR, None),
    ("mul", ALU_MUL, None),
)
"""(name, ALU opcode, immediate or None for a tensor operand), in the order of ``alu_program``'s output cases."""


def _ref_alu(op: int, a: np.ndarray, b: np.ndarray | np.integer) -> np.ndarray:
    """Reference ALU on int64 holding int32 values, written independently of vta.fsim (Python ints)."""
    out = np.empty(a.shape, np.int64)
    for idx, (x, y) in enumerate(zip(a.reshape(-1).tolist(), np.broadcast_to(b, a.shape).reshape(-1).tolist())):
        if op == ALU_MIN:
            r = min(x, y)
        elif op == ALU_MAX:
            r = max(x, y)
        elif op == ALU_ADD:
            r = x + y
        elif op == ALU_MUL:
            r = x * y
        else:
            n = y & 63
            n = n - 64 if n >= 32 else n
            r = x >> n if n >= 0 else x << -n
        r &= 0xFFFFFFFF
        out.reshape(-1)[idx] = r - (1 << 32) if r >= 1 << 31 else r
    return out


def alu_program(cfg: VTAConfig, *, seed: int = 0, entries: int = 4) -> tuple[Program, np.ndarray]:
    """Every ALU op with an immediate and with a tensor operand (:data:`ALU_CASES`) on random int32 accumulators.

    For each case: LOAD ACC operand a (``entries`` acc entries, values spread over the whole int32 range) and, for
    tensor cases, operand b (shift amounts in [-40, 40] for SHR, to exercise the 6-bit amount); run the op; then store
    all four bytes of each 32-bit result (out = low 8 bits; three SHR-by-8 steps expose the upper bytes).
    Returns the program and the expected contents of allocation ``"out"``: int8 of shape
    ``(len(ALU_CASES), 4, entries, BATCH, BLOCK_OUT)`` (byte j of every result in ``[:, j]``).
    """
    entries = max(1, min(entries, cfg.acc_depth // 2))
    rng = np.random.default_rng(seed)
    shape = (entries, cfg.batch, cfg.block_out)
    n_cases = len(ALU_CASES)
    a = rng.integers(-(1 << 31), 1 << 31, (n_cases,) + shape, dtype=np.int64)
    a[:, 0, 0, :4] = [-(1 << 31), (1 << 31) - 1, -1, 0][:min(4, cfg.block_out)]
    b = rng.integers(-(1 << 31), 1 << 31, (n_cases,) + shape, dtype=np.int64)
    for c, (_, op, imm) in enumerate(ALU_CASES):
        if op == ALU_SHR and imm is None:
            b[c] = rng.integers(-40, 41, shape)
    bld = ProgramBuilder(cfg)
    a_al = bld.alloc("a", a.astype(np.int32))
    b_al = bld.alloc("b", b.astype(np.int32))
    out_al = bld.alloc("out", (n_cases, 4) + shape, np.int8)
    kernel = bld.uop_kernel("uops", [Uop(0, entries, 0)])  # dst: entries [0, entries), src: [entries, 2*entries)
    bld.load_uops(kernel)
    expected = np.zeros((n_cases, 4) + shape, np.int8)
    loops: dict[str, Any] = {"uop_bgn": 0, "uop_end": 1, "iter_out": entries, "dst_factor_out": 1,
                             "src_factor_out": 1}
    for c, (_, op, imm) in enumerate(ALU_CASES):
        if c:
            bld.dep_pop("store", "compute")  # the previous case's bytes are stored: the out buffer may change
        bld.load(MEM_ACC, sram_base=0, dram_base=bld.elem_addr(a_al, MEM_ACC) + c * entries, x_size=entries)
        if imm is None:
            bld.load(MEM_ACC, sram_base=entries, dram_base=bld.elem_addr(b_al, MEM_ACC) + c * entries,
                     x_size=entries)
            bld.alu(op, **loops)
            result = _ref_alu(op, a[c], b[c])
        else:
            bld.alu(op, **loops, use_imm=True, imm=imm)
            result = _ref_alu(op, a[c], np.int64(imm))
        for j in range(4):
            if j:
                bld.dep_pop("store", "compute")
                bld.alu(ALU_SHR, **loops, use_imm=True, imm=8)
            bld.dep_push("compute", "store")
            bld.dep_pop("compute", "store")
            bld.store(sram_base=0, dram_base=bld.elem_addr(out_al, MEM_OUT) + (c * 4 + j) * entries, x_size=entries)
            bld.dep_push("store", "compute")
            expected[c, j] = (result >> (8 * j)).astype(np.int8)
    bld.dep_pop("store", "compute")  # consume the last store's token so the queues end empty
    return bld.finish(), expected


# ---- random programs ------------------------------------------------------------------------------------------------
class _RandomGen:
    """State of :func:`random_program`: what each buffer entry holds and which cross-module hazards are open."""

    def __init__(self, cfg: VTAConfig, rng: np.random.Generator, max_index: int, alu_hazards: bool) -> None:
        self.cfg, self.rng, self.alu_hazards = cfg, rng, alu_hazards
        self.drain = False  # drain the concurrent_alu engine after every ALU instruction
        self.cap = {"inp": min(cfg.inp_depth, max_index), "wgt": min(cfg.wgt_depth, max_index),
                    "acc": min(cfg.acc_depth, max_index), "uop": min(cfg.uop_depth, max_index)}
        self.uops = np.zeros((3, self.cap["uop"]), np.int64)  # dst, src, wgt of the uop buffer's first entries
        self.flags = {name: np.zeros(self.cap[buf], bool) for name, buf in
                      (("inp_dirty", "inp"), ("inp_read", "inp"), ("wgt_dirty", "wgt"), ("wgt_read", "wgt"),
                       ("out_dirty", "acc"), ("out_read", "acc"))}
        self.bld = ProgramBuilder(cfg)
        b = self.bld
        pool = 24
        self.pools = {
            MEM_INP: (b.alloc("inp_pool", rng.integers(-128, 128, (pool, cfg.batch, cfg.block_in), dtype=np.int8)),
                      pool),
            MEM_WGT: (b.alloc("wgt_pool", rng.integers(-128, 128, (pool, cfg.block_out, cfg.block_in),
                                                       dtype=np.int8)), pool),
            MEM_ACC: (b.alloc("acc_pool", self._acc_values((pool, cfg.batch, cfg.block_out))), pool),
            MEM_ACC_8BIT: (b.alloc("acc8_pool", rng.integers(-128, 128, (pool, cfg.batch, cfg.block_out),
                                                             dtype=np.int8)), pool),
        }
        src_cap = min(self.cap["inp"], self.cap["acc"])
        self.uop_pool = np.stack([rng.integers(0, self.cap["acc"], pool), rng.integers(0, src_cap, pool),
                                  rng.integers(0, self.cap["wgt"], pool)])
        self.pools[MEM_UOP] = (b.uop_kernel("uop_pool", [Uop(*map(int, u)) for u in self.uop_pool.T]), pool)
        self.out_pool = 48
        self.out = b.alloc("out", rng.integers(-128, 128, (self.out_pool, cfg.batch, cfg.block_out), dtype=np.int8))

    def _acc_values(self, shape: tuple[int, ...]) -> np.ndarray:
        small = self.rng.integers(-1000, 1000, shape)
        big = self.rng.integers(-(1 << 31), 1 << 31, shape)
        return np.where(self.rng.random(shape) < 0.7, small, big).astype(np.int32)

    def sync(self, src: str, dst: str) -> None:
        self.bld.dep_push(src, dst)
        self.bld.dep_pop(src, dst)
        cleared = {("load", "compute"): ("inp_dirty", "wgt_dirty"), ("compute", "load"): ("inp_read", "wgt_read"),
                   ("compute", "store"): ("out_dirty",), ("store", "compute"): ("out_read",)}[(src, dst)]
        for name in cleared:
            self.flags[name][:] = False

    def _ri(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def _block(self, cap: int, pool: int, pad: bool) -> dict[str, int] | None:
        """Random 2D LOAD/STORE shape that fits ``cap`` SRAM entries and a ``pool``-element DRAM region."""
        for _ in range(20):
            y, x = self._ri(1, 3), self._ri(1, 4)
            stride = self._ri(x, x + 3) if self.rng.random() < 0.85 else self._ri(0, x)
            pads = [self._ri(0, 2) if pad and self.rng.random() < 0.5 else 0 for _ in range(4)]
            height, width = pads[0] + y + pads[1], pads[2] + x + pads[3]
            span = (y - 1) * stride + x
            if height * width <= cap and span <= pool:
                return {"sram_base": self._ri(0, cap - height * width), "dram_base": self._ri(0, pool - span),
                        "y_size": y, "x_size": x, "x_stride": stride, "y_pad_0": pads[0], "y_pad_1": pads[1],
                        "x_pad_0": pads[2], "x_pad_1": pads[3]}
        return None

    def op_load(self, mem: int) -> None:
        buf = {MEM_INP: "inp", MEM_WGT: "wgt", MEM_UOP: "uop", MEM_ACC: "acc", MEM_ACC_8BIT: "acc"}[mem]
        alloc, pool = self.pools[mem]
        blk = self._block(self.cap[buf], pool, pad=True)
        if blk is None:
            return
        n = (blk["y_pad_0"] + blk["y_size"] + blk["y_pad_1"]) * (blk["x_pad_0"] + blk["x_size"] + blk["x_pad_1"])
        entries = slice(blk["sram_base"], blk["sram_base"] + n)
        if buf in ("inp", "wgt"):
            if self.flags[f"{buf}_read"][entries].any():
                self.sync("compute", "load")
            self.flags[f"{buf}_dirty"][entries] = True
        if mem == MEM_UOP:
            block = np.zeros((3, n // (blk["x_pad_0"] + blk["x_size"] + blk["x_pad_1"]),
                              blk["x_pad_0"] + blk["x_size"] + blk["x_pad_1"]), np.int64)
            for y in range(blk["y_size"]):
                start = blk["dram_base"] + y * blk["x_stride"]
                block[:, blk["y_pad_0"] + y, blk["x_pad_0"]:blk["x_pad_0"] + blk["x_size"]] = \
                    self.uop_pool[:, start:start + blk["x_size"]]
            self.uops[:, entries] = block.reshape(3, n)
        blk["dram_base"] += self.bld.elem_addr(alloc, mem)
        self.bld.load(mem, **blk)

    def _loops(self, kind: str) -> dict[str, int]:
        """Random micro-op loop whose indices stay inside the buffers."""
        bgn = self._ri(0, self.cap["uop"] - 1)
        end = min(self.cap["uop"], bgn + self._ri(0 if self.rng.random() < 0.05 else 1, 4))
        loops = {"uop_bgn": bgn, "uop_end": end, "iter_out": self._ri(1, 3), "iter_in": self._ri(1, 3)}
        if self.rng.random() < 0.05:
            loops["iter_in"] = 0
        names = [("dst", 0, "acc"), ("src", 1, "inp" if kind == "gemm" else "acc")]
        if kind == "gemm":
            names.append(("wgt", 2, "wgt"))
        for name, row, buf in names:
            top = int(self.uops[row, bgn:end].max()) if end > bgn else 0
            most = min(3, getattr(self.cfg, f"{buf}_depth") - 1)  # the factor field holds depth - 1 at most
            fo, fi = self._ri(0, most), self._ri(0, most)
            if top + (loops["iter_out"] - 1) * fo + max(loops["iter_in"] - 1, 0) * fi >= self.cap[buf]:
                fo = fi = 0
            loops[f"{name}_factor_out"], loops[f"{name}_factor_in"] = fo, fi
        return loops

    def _indices(self, loops: dict[str, int], name: str, row: int) -> np.ndarray:
        o, i, u = np.meshgrid(np.arange(loops["iter_out"]), np.arange(loops["iter_in"]),
                              np.arange(loops["uop_bgn"], loops["uop_end"]), indexing="ij")
        return (self.uops[row][u] + o * loops[f"{name}_factor_out"] + i * loops[f"{name}_factor_in"]).reshape(-1)

    def _write_out(self, d: np.ndarray) -> None:
        if self.flags["out_read"][d].any():
            self.sync("store", "compute")
        self.flags["out_dirty"][d] = True

    def op_gemm(self) -> None:
        loops = self._loops("gemm")
        reset = bool(self.rng.random() < 0.15)
        d = self._indices(loops, "dst", 0)
        if not reset or self.cfg.gemm_overwrite:  # the knob's reset GEMM multiplies: it reads inp and wgt too
            s, w = self._indices(loops, "src", 1), self._indices(loops, "wgt", 2)
            if self.flags["inp_dirty"][s].any() or self.flags["wgt_dirty"][w].any():
                self.sync("load", "compute")
            self.flags["inp_read"][s] = True
            self.flags["wgt_read"][w] = True
        self._write_out(d)
        self.bld.gemm(**loops, reset=reset)

    def op_alu(self) -> None:
        reduce = [ALU_RSUM, ALU_RMAX] if self.cfg.lane_reduce else []  # the lane_reduce knob's ops
        op = int(self.rng.choice([ALU_MIN, ALU_MAX, ALU_ADD, ALU_SHR, ALU_MUL, *reduce]))
        loops = self._loops("alu")
        d, s = self._indices(loops, "dst", 0), self._indices(loops, "src", 1)
        use_imm = bool(self.rng.random() < 0.5)
        if not use_imm and not self.alu_hazards:
            written = np.zeros(self.cap["acc"], bool)
            written[d] = True
            use_imm = bool(np.any(written[s] & (s != d)))
        imm = self._ri(-40, 40) if op == ALU_SHR and self.rng.random() < 0.8 else self._ri(-(1 << 15), (1 << 15) - 1)
        self._write_out(d)
        self.bld.alu(op, **loops, use_imm=use_imm, imm=imm if use_imm else 0, reset=bool(self.rng.random() < 0.05))
        if self.drain:
            self.bld.drain_alu()

    def op_store(self) -> None:
        blk = self._block(self.cap["acc"], self.out_pool, pad=False)
        if blk is None:
            return
        entries = slice(blk["sram_base"], blk["sram_base"] + blk["y_size"] * blk["x_size"])
        if self.flags["out_dirty"][entries].any():
            self.sync("compute", "store")
        self.flags["out_read"][entries] = True
        for key in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"):
            del blk[key]
        blk["dram_base"] += self.bld.elem_addr(self.out, MEM_OUT)
        self.bld.store(**blk)


def random_program(cfg: VTAConfig, rng: np.random.Generator, *, n_ops: int = 24, alu_hazards: bool = True,
                   max_index: int = 32, overlap_alu: bool = False) -> Program:
    """A random but valid program of about ``n_ops`` operations (for co-simulation against :mod:`vta.fsim`).

    Operations: LOADs of every memory type with random sizes, strides (some overlapping) and padding on all four
    sides; GEMMs and ALU ops (every opcode, immediates and tensor operands, resets; RSUM and RMAX with the
    ``lane_reduce`` knob, REQ never) over random micro-op loops; STOREs
    with random strides. Buffer indices stay below ``max_index`` so operations collide often. Dependency tokens are
    inserted where a cross-module hazard exists (load->compute and compute->load on inp/wgt entries, compute->store
    and store->compute on out entries), plus a few random extra ones, so modules overlap wherever the data allow and
    the final DRAM image does not depend on timing; tokens never exceed two per queue in program order, so no valid
    config deadlocks.
    ``alu_hazards=False`` avoids ALU tensor ops that read an entry written earlier by the same instruction.
    With the ``concurrent_alu`` knob every ALU instruction is followed by a drain (``ProgramBuilder.drain_alu``), so the
    program keeps the knob's bank rule; ``overlap_alu=True`` leaves them out (most such programs break the rule, which
    fsim reports).
    Allocations: ``inp_pool``, ``wgt_pool``, ``acc_pool``, ``acc8_pool``, ``uop_pool`` (inputs) and ``out``.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), not {type(rng).__name__}")
    gen = _RandomGen(cfg, rng, max_index, alu_hazards)
    gen.drain = cfg.concurrent_alu and not overlap_alu
    gen.op_load(MEM_UOP)
    pairs = [("load", "compute"), ("compute", "load"), ("compute", "store"), ("store", "compute")]
    ops = [lambda: gen.op_load(MEM_INP), lambda: gen.op_load(MEM_WGT), lambda: gen.op_load(MEM_UOP),
           lambda: gen.op_load(MEM_ACC), lambda: gen.op_load(MEM_ACC_8BIT), gen.op_gemm, gen.op_alu, gen.op_store,
           lambda: gen.sync(*pairs[int(rng.integers(len(pairs)))])]  # a token no hazard needs: more token patterns
    weights = np.array([3, 2, 1, 1, 1, 3, 3, 3, 1], float)
    for _ in range(n_ops):
        ops[int(rng.choice(len(ops), p=weights / weights.sum()))]()
    gen.op_store()
    return gen.bld.finish()


# ---- long token streams ---------------------------------------------------------------------------------------------
PACES = ("load", "compute", "store")
"""The module a stretch of :func:`token_stream_program`'s rounds makes the slowest."""


def token_stream_program(cfg: VTAConfig, rng: np.random.Generator, *, rounds: int = 32, slots: int = 3,
                         stretch: int = 4) -> Program:
    """A pipelined stream of ``rounds`` rounds in which load, compute and store run at different paces, ordered
    only by dependency tokens (for timing stress: a lost, duplicated or reordered token shows as a hang or as wrong
    data).

    Round r: load fills part ``r % slots`` of inp and wgt (1-3 rows of 1-4 elements, a row stride), compute runs a
    GEMM of 1-4 micro-ops over it into part ``r % slots`` of acc/out (reset on the part's first use, then
    accumulating), store writes that part to the next free rows of allocation ``out``. The parts are two
    :class:`~vta.program.SlotRing` rings (load->compute, compute->store), so a module may run up to ``slots``
    rounds ahead of the next one and each of the four token queues holds up to ``slots`` tokens. Every ``stretch``
    rounds another module (:data:`PACES`, in a random order) is made the slowest: long LOADs (more rows and
    elements), long GEMMs (up to 16 x 8 iterations) or long STOREs. Allocations ``inp``, ``wgt`` (inputs), ``out``.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), not {type(rng).__name__}")
    if rounds < 1 or slots < 1 or stretch < 1:
        raise ValueError(f"rounds, slots and stretch must be at least 1, not {rounds}, {slots}, {stretch}")
    slots = min(slots, cfg.token_queue_depth)
    part = max(1, min(cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth) // slots)
    rows, elems = min(3, part), 1
    elems = max(1, min(4, part // rows))
    size = rows * elems  # SRAM entries of a part the loads fill
    pool = 64
    b = ProgramBuilder(cfg)
    inp = b.alloc("inp", rng.integers(-128, 128, (pool, cfg.batch, cfg.block_in), dtype=np.int8))
    wgt = b.alloc("wgt", rng.integers(-128, 128, (pool, cfg.block_out, cfg.block_in), dtype=np.int8))
    out = b.alloc("out", np.zeros((rounds * size, cfg.batch, cfg.block_out), np.int8))
    kernel = b.uop_kernel("uops", [Uop(i, i, i) for i in range(slots * size)])  # part p: [p * size, +size)
    b.load_uops(kernel)
    if cfg.gemm_overwrite:  # the knob's reset GEMM multiplies the part's entries, loaded or not: load them all first,
        for mem, alloc in ((MEM_INP, inp), (MEM_WGT, wgt)):  # so no result depends on the SRAM's state at start
            b.load(mem, sram_base=0, dram_base=b.elem_addr(alloc, mem), y_size=1, x_size=slots * size,
                   x_stride=slots * size)
    operands = SlotRing(b, "load", "compute", slots, total=rounds)
    results = SlotRing(b, "compute", "store", slots, total=rounds)
    order = [PACES[int(i)] for i in rng.permutation(len(PACES))]
    stored = 0
    for r in range(rounds):
        slow = order[(r // stretch) % len(order)]
        base = operands.claim() * size
        y, x = (int(rng.integers(1, rows + 1)), int(rng.integers(1, elems + 1))) if slow == "load" else (1, 1)
        stride = x + int(rng.integers(0, 3))
        for mem, alloc in ((MEM_INP, inp), (MEM_WGT, wgt)):
            start = int(rng.integers(0, pool - (y - 1) * stride - x + 1))
            b.load(mem, sram_base=base, dram_base=b.elem_addr(alloc, mem) + start, y_size=y, x_size=x,
                   x_stride=stride)
        operands.handoff()
        results.claim()  # the same part as the operands': both rings turn once a round
        uops = int(rng.integers(1, y * x + 1))
        iters = (int(rng.integers(4, 17)), int(rng.integers(2, 9))) if slow == "compute" else (1, 1)
        b.gemm(uop_bgn=base, uop_end=base + size, reset=True)
        b.gemm(uop_bgn=base, uop_end=base + uops, iter_out=iters[0], iter_in=iters[1])
        operands.release()
        results.handoff()
        n = size if slow == "store" else uops
        b.store(sram_base=base, dram_base=b.elem_addr(out, MEM_OUT) + stored, x_size=n)
        stored += n
        results.release()
    return b.finish()
