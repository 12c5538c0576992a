"""The functional simulator against plain per-element references: LOAD, STORE, GEMM, ALU, tokens, statistics."""
from __future__ import annotations

import numpy as np
import pytest
from fsim_helpers import CONFIGS, finish_with_store, gemm_after_late_load, raw_program, sync_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vta import fsim
from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.isa import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_SHR, Alu, Finish, Gemm, Load, Store, Uop, layout
from vta.program import Program, ProgramBuilder
from vta.testing import random_program


# ---- a naive reference: program order, one element at a time, Python ints --------------------------------------------
def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >> 31 else v


def _s8(v: int) -> int:
    v &= 0xFF
    return v - 256 if v >> 7 else v


def ref_alu(op: int, a: int, b: int) -> int:
    if op == ALU_MIN:
        return min(a, b)
    if op == ALU_MAX:
        return max(a, b)
    if op == ALU_ADD:
        return _s32(a + b)
    if op == ALU_MUL:
        return _s32(a * b)
    n = b & 63
    n = n - 64 if n >= 32 else n
    return _s32(a >> n if n >= 0 else a << -n)


def ref_run(program: Program) -> np.ndarray:
    """Final DRAM of ``program`` executed in program order (valid for race-free programs), element by element."""
    cfg = program.cfg
    dram = bytearray(program.dram.tobytes())
    b, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
    inp = [[0] * (b * bi) for _ in range(cfg.inp_depth)]
    wgt = [[0] * (bo * bi) for _ in range(cfg.wgt_depth)]
    acc = [[0] * (b * bo) for _ in range(cfg.acc_depth)]
    out = [[0] * (b * bo) for _ in range(cfg.acc_depth)]
    uop = [(0, 0, 0)] * cfg.uop_depth
    ufields = layout(cfg).uop_fields

    def element(mem: int, addr: int) -> object:
        eb = cfg.elem_bytes(mem)
        raw = dram[addr * eb:(addr + 1) * eb]
        if mem == MEM_UOP:
            word = int.from_bytes(raw, "little")
            return tuple((word >> f.lsb) & ((1 << f.width) - 1) for f in ufields)
        if mem == MEM_ACC:
            return [int.from_bytes(raw[j:j + 4], "little", signed=True) for j in range(0, eb, 4)]
        return [_s8(x) for x in raw]

    for insn in program.insns:
        if isinstance(insn, Load) and insn.x_size:
            buf = {MEM_UOP: uop, MEM_WGT: wgt, MEM_INP: inp, MEM_ACC: acc, MEM_ACC_8BIT: acc}[insn.mem]
            width = insn.x_pad_0 + insn.x_size + insn.x_pad_1
            for y in range(insn.y_pad_0 + insn.y_size + insn.y_pad_1):
                for x in range(width):
                    yy, xx = y - insn.y_pad_0, x - insn.x_pad_0
                    inside = 0 <= yy < insn.y_size and 0 <= xx < insn.x_size
                    zero = (0, 0, 0) if insn.mem == MEM_UOP else [0] * len(buf[0])
                    value = element(insn.mem, insn.dram_base + yy * insn.x_stride + xx) if inside else zero
                    buf[insn.sram_base + y * width + x] = value
        elif isinstance(insn, Store) and insn.x_size:
            eb = cfg.out_elem_bytes
            for y in range(insn.y_size):
                for x in range(insn.x_size):
                    addr = (insn.dram_base + y * insn.x_stride + x) * eb
                    dram[addr:addr + eb] = bytes(v & 0xFF for v in out[insn.sram_base + y * insn.x_size + x])
        elif isinstance(insn, (Gemm, Alu)):
            for o in range(insn.iter_out):
                for i in range(insn.iter_in):
                    for u in range(insn.uop_bgn, insn.uop_end):
                        ud, us, uw = uop[u]
                        d = ud + o * insn.dst_factor_out + i * insn.dst_factor_in
                        s = us + o * insn.src_factor_out + i * insn.src_factor_in
                        if insn.reset:
                            acc[d] = [0] * (b * bo)
                        elif isinstance(insn, Gemm):
                            w = uw + o * insn.wgt_factor_out + i * insn.wgt_factor_in
                            acc[d] = [_s32(acc[d][r * bo + c] + sum(inp[s][r * bi + j] * wgt[w][c * bi + j]
                                                                    for j in range(bi)))
                                      for r in range(b) for c in range(bo)]
                        else:
                            acc[d] = [ref_alu(insn.alu_opcode, acc[d][j], insn.imm if insn.use_imm else acc[s][j])
                                      for j in range(b * bo)]
                        out[d] = [_s8(v) for v in acc[d]]
    return np.frombuffer(bytes(dram), np.uint8)


# ---- helpers ---------------------------------------------------------------------------------------------------------
def _acc_pool(bld: ProgramBuilder, cfg: VTAConfig, values: np.ndarray, name: str = "accs"):
    return bld.alloc(name, np.asarray(values, np.int32).reshape(-1, cfg.batch, cfg.block_out))


# ---- LOAD ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mem", [MEM_INP, MEM_WGT, MEM_ACC, MEM_ACC_8BIT, MEM_UOP])
def test_load_padded_strided_every_memory_type(small_cfg, mem):
    cfg = small_cfg
    rng = np.random.default_rng(mem)
    bld = ProgramBuilder(cfg)
    shape = {MEM_INP: (cfg.batch, cfg.block_in), MEM_WGT: (cfg.block_out, cfg.block_in),
             MEM_ACC: (cfg.batch, cfg.block_out), MEM_ACC_8BIT: (cfg.batch, cfg.block_out)}
    if mem == MEM_UOP:
        pool = bld.uop_kernel("pool", [Uop(k % 16, (3 * k) % 16, k % 8) for k in range(12)])
        data = np.array([[k % 16, (3 * k) % 16, k % 8] for k in range(12)]).T
    else:
        dtype = np.int32 if mem == MEM_ACC else np.int8
        lo, hi = (-(1 << 31), 1 << 31) if mem == MEM_ACC else (-128, 128)
        data = rng.integers(lo, hi, (12,) + shape[mem]).astype(dtype)
        pool = bld.alloc("pool", data)
    # 2 rows of 3 elements, row stride 5, padding top 1, bottom 2, left 1, right 2 -> 5 x 6 block at entry 1
    bld.load(mem, sram_base=1, dram_base=bld.elem_addr(pool, mem) + 2, y_size=2, x_size=3, x_stride=5,
             y_pad_0=1, y_pad_1=2, x_pad_0=1, x_pad_1=2)
    result = fsim.run(bld.finish(), keep_sram=True)
    buf = {MEM_INP: "inp", MEM_WGT: "wgt", MEM_ACC: "acc", MEM_ACC_8BIT: "acc", MEM_UOP: "uop"}[mem]
    sram = result.sram[buf]
    if mem == MEM_UOP:
        expected = np.full((3, sram.shape[1]), -1, np.int64)
        got = sram.copy()
        for y in range(5):
            for x in range(6):
                inside = 1 <= y < 3 and 1 <= x < 4
                expected[:, 1 + y * 6 + x] = data[:, 2 + (y - 1) * 5 + (x - 1)] if inside else 0
        assert np.array_equal(got[:, 1:31], expected[:, 1:31])
        assert np.array_equal(got[:, [0, 31]], np.zeros((3, 2)))
    else:
        expected = np.zeros_like(sram)
        for y in range(5):
            for x in range(6):
                if 1 <= y < 3 and 1 <= x < 4:
                    expected[1 + y * 6 + x] = data[2 + (y - 1) * 5 + (x - 1)]
        assert np.array_equal(sram[:31], expected[:31])
    assert result.sram["out"].any() == False  # noqa: E712  (LOAD never writes the out buffer)
    nbytes = 6 * cfg.elem_bytes(mem)
    key = {MEM_INP: "inp_bytes_read", MEM_WGT: "wgt_bytes_read", MEM_ACC: "acc_bytes_read",
           MEM_ACC_8BIT: "acc_bytes_read", MEM_UOP: "uop_bytes_read"}[mem]
    assert getattr(result.stats, key) == nbytes


def test_load_acc_8bit_sign_extends(small_cfg):
    bld = ProgramBuilder(small_cfg)
    vals = np.array([-128, -1, 0, 127, 5, -7, 100, -100] * 2, np.int8).reshape(2, 2, 4)
    pool = bld.alloc("p", vals)
    bld.load(MEM_ACC_8BIT, sram_base=3, dram_base=bld.elem_addr(pool, MEM_ACC_8BIT), x_size=2)
    res = fsim.run(bld.finish(), keep_sram=True)
    assert res.sram["acc"].dtype == np.int32
    assert np.array_equal(res.sram["acc"][3:5], vals.astype(np.int32))
    assert res.stats.acc_bytes_read == 16


def test_token_only_load_moves_nothing(small_cfg):
    bld = ProgramBuilder(small_cfg)
    bld.emit(Load(mem=MEM_INP, sram_base=0, dram_base=10 ** 6, y_size=5, x_size=0, y_pad_0=3))
    res = fsim.run(bld.finish(), keep_sram=True)
    assert not res.sram["inp"].any()
    assert res.stats.inp_bytes_read == 0
    assert res.stats.load_insns == 1


# ---- STORE -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stride", [3, 5, 1])  # exact, gaps, overlapping rows (later rows win)
def test_store_strided(small_cfg, stride):
    cfg = small_cfg
    bld = ProgramBuilder(cfg)
    accs = _acc_pool(bld, cfg, np.arange(6 * 8) * 37 - 500)
    dst = bld.alloc("dst", np.full((16, 2, 4), 99, np.int8))
    uop = bld.uop_kernel("k", [Uop(2, 0)])
    bld.load_uops(uop)
    bld.load(MEM_ACC, sram_base=2, dram_base=bld.elem_addr(accs, MEM_ACC), x_size=6)
    bld.alu(ALU_ADD, uop_bgn=0, uop_end=1, iter_out=6, dst_factor_out=1, use_imm=True, imm=0)
    sync_store(bld, sram_base=2, dram_base=bld.elem_addr(dst, MEM_OUT) + 1, y_size=2, x_size=3, x_stride=stride)
    prog = bld.finish()
    res = fsim.run(prog)
    got = prog.read("dst", res.dram)
    values = (np.arange(6 * 8) * 37 - 500).astype(np.int32).astype(np.int8).reshape(6, 2, 4)
    expected = np.full((16, 2, 4), 99, np.int8)
    for y in range(2):
        for x in range(3):
            expected[1 + y * stride + x] = values[y * 3 + x]
    assert np.array_equal(got, expected)
    assert np.array_equal(got, prog.read("dst", ref_run(prog)))
    assert res.stats.out_bytes_written == 6 * cfg.out_elem_bytes


# ---- GEMM ------------------------------------------------------------------------------------------------------------
def _gemm_setup(cfg: VTAConfig, rng: np.random.Generator, acc_init: np.ndarray | None = None):
    """Builder with random inp (8 entries), wgt (8 entries) and acc (16 entries) loaded; returns the builder."""
    bld = ProgramBuilder(cfg)
    inp = bld.alloc("inp", rng.integers(-128, 128, (8, cfg.batch, cfg.block_in), dtype=np.int8))
    wgt = bld.alloc("wgt", rng.integers(-128, 128, (8, cfg.block_out, cfg.block_in), dtype=np.int8))
    accs = _acc_pool(bld, cfg, rng.integers(-1000, 1000, 16 * cfg.batch * cfg.block_out) if acc_init is None
                     else acc_init)
    bld.load(MEM_INP, sram_base=0, dram_base=bld.elem_addr(inp, MEM_INP), x_size=8)
    bld.load(MEM_WGT, sram_base=0, dram_base=bld.elem_addr(wgt, MEM_WGT), x_size=8)
    bld.dep_push("load", "compute")
    bld.dep_pop("load", "compute")
    bld.load(MEM_ACC, sram_base=0, dram_base=bld.elem_addr(accs, MEM_ACC), x_size=16)
    return bld


@pytest.mark.parametrize("reset", [False, True])
def test_gemm_loops_match_reference(small_cfg, reset):
    cfg = small_cfg
    bld = _gemm_setup(cfg, np.random.default_rng(1))
    kernel = bld.uop_kernel("k", [Uop(0, 1, 2), Uop(1, 0, 3), Uop(0, 2, 0)])  # dst 0 accumulates twice
    bld.load_uops(kernel, sram_base=4)
    bld.gemm(uop_bgn=4, uop_end=7, iter_out=3, iter_in=2, dst_factor_out=4, dst_factor_in=2, src_factor_out=1,
             src_factor_in=3, wgt_factor_out=2, wgt_factor_in=1, reset=reset)
    prog = finish_with_store(bld, cfg)
    res = fsim.run(prog, keep_sram=True)
    assert np.array_equal(res.dram, ref_run(prog))
    assert res.stats.gemm_uops == 18
    assert res.stats.macs == (0 if reset else 18 * cfg.batch * cfg.block_in * cfg.block_out)
    touched = sorted({u + o * 4 + i * 2 for u in (0, 1) for o in range(3) for i in range(2)})
    assert touched == list(range(12))
    assert np.array_equal(res.sram["out"][:12], res.sram["acc"][:12].astype(np.int8))
    assert not res.sram["out"][12:].any()  # LOAD ACC does not write the out buffer


def test_gemm_wraps_around_32_bits(small_cfg):
    cfg = small_cfg
    big = np.full(16 * cfg.batch * cfg.block_out, (1 << 31) - 5, np.int64)
    bld = _gemm_setup(cfg, np.random.default_rng(2), acc_init=big)
    bld.load_uops(bld.uop_kernel("k", [Uop(0, 0, 0)]))
    bld.gemm(uop_bgn=0, uop_end=1, iter_out=8, dst_factor_out=1, src_factor_out=1, wgt_factor_out=1)
    prog = finish_with_store(bld, cfg)
    res = fsim.run(prog, keep_sram=True)
    inp = prog.read("inp").astype(np.int64)
    wgt = prog.read("wgt").astype(np.int64)
    expect = (np.einsum("nbi,noi->nbo", inp, wgt) + (1 << 31) - 5 + (1 << 31)) % (1 << 32) - (1 << 31)
    assert np.array_equal(res.sram["acc"][:8], expect.astype(np.int32))
    assert (res.sram["acc"][:8] < 0).any()  # some sums did wrap
    assert np.array_equal(res.dram, ref_run(prog))


def test_gemm_large_reduction_uses_exact_path(cfg):
    """2048 terms per dot product (beyond float32's exact range): still exact."""
    rng = np.random.default_rng(3)
    bld = ProgramBuilder(cfg)
    inp = bld.alloc("inp", np.full((128, 1, 16), -128, np.int8))
    wgt = bld.alloc("wgt", np.full((128, 16, 16), -128, np.int8))
    bld.load(MEM_INP, sram_base=0, dram_base=bld.elem_addr(inp, MEM_INP), x_size=128)
    bld.load(MEM_WGT, sram_base=0, dram_base=bld.elem_addr(wgt, MEM_WGT), x_size=128)
    bld.dep_push("load", "compute")
    bld.dep_pop("load", "compute")
    bld.load_uops(bld.uop_kernel("k", [Uop(0, j, j) for j in range(128)] + [Uop(1, 0, 0)]))
    bld.gemm(uop_bgn=0, uop_end=128)
    bld.gemm(uop_bgn=0, uop_end=128, iter_out=3)  # acc[0] gets 4 x 128 x 16 products of 2^14 = 2^25
    res = fsim.run(bld.finish(), keep_sram=True)
    assert res.sram["acc"][0, 0, 0] == 4 * 128 * 16 * 16384
    assert rng is not None


# ---- ALU -------------------------------------------------------------------------------------------------------------
ALU_OPS = [ALU_MIN, ALU_MAX, ALU_ADD, ALU_SHR, ALU_MUL]


def _alu_prog(cfg: VTAConfig, op: int, *, use_imm: bool, imm: int = 0, a=None, b=None, uops=None, loops=None):
    rng = np.random.default_rng(op)
    n = cfg.batch * cfg.block_out
    a = rng.integers(-(1 << 31), 1 << 31, 8 * n) if a is None else np.asarray(a)
    b = rng.integers(-40, 41, 8 * n) if b is None else np.asarray(b)
    bld = ProgramBuilder(cfg)
    accs = _acc_pool(bld, cfg, np.concatenate([a, b]))
    bld.load(MEM_ACC, sram_base=0, dram_base=bld.elem_addr(accs, MEM_ACC), x_size=16)
    bld.load_uops(bld.uop_kernel("k", uops or [Uop(0, 8)]))
    loops = loops or {"uop_bgn": 0, "uop_end": 1, "iter_out": 8, "dst_factor_out": 1, "src_factor_out": 1}
    bld.alu(op, **loops, use_imm=use_imm, imm=imm)
    return finish_with_store(bld, cfg), a, b


@pytest.mark.parametrize("op", ALU_OPS)
@pytest.mark.parametrize("use_imm", [True, False])
def test_alu_every_op(small_cfg, op, use_imm):
    imm = {ALU_MIN: -3, ALU_MAX: 5, ALU_ADD: -32768, ALU_SHR: -7, ALU_MUL: 32767}[op]
    prog, a, b = _alu_prog(small_cfg, op, use_imm=use_imm, imm=imm)
    res = fsim.run(prog, keep_sram=True)
    operand = np.full_like(a, imm) if use_imm else b
    expected = np.array([ref_alu(op, int(x), int(y)) for x, y in zip(a, operand)], np.int64)
    assert np.array_equal(res.sram["acc"][:8].reshape(-1), expected.astype(np.int32))
    assert np.array_equal(res.sram["out"][:8].reshape(-1), expected.astype(np.int32).astype(np.int8))
    assert np.array_equal(res.dram, ref_run(prog))
    assert res.stats.alu_uops == 8


@pytest.mark.parametrize("amount, value, expected", [
    (3, -17, -3), (31, -1, -1), (31, 1 << 30, 0), (0, 12345, 12345),
    (-1, 0x40000000, -(1 << 31)), (-4, 0x12345678, 0x23456780), (-32, 123, 0), (-31, 3, -(1 << 31)),
    (64 + 2, 16, 4), (32, 5, 0), (-33, -5, -1),  # low 6 bits as signed: 66 -> 2, 32 -> -32, -33 -> 31
])
def test_alu_shr_amounts(small_cfg, amount, value, expected):
    n = small_cfg.batch * small_cfg.block_out
    prog, _, _ = _alu_prog(small_cfg, ALU_SHR, use_imm=False, a=[value] * 8 * n, b=[amount] * 8 * n)
    res = fsim.run(prog, keep_sram=True)
    assert res.sram["acc"][0, 0, 0] == expected
    assert ref_alu(ALU_SHR, value, amount) == expected


def test_alu_repeated_destination_with_immediate(small_cfg):
    """acc[0] += 1000 four times (same destination in every iteration), then SHR 1 twice."""
    n = small_cfg.batch * small_cfg.block_out
    prog, _, _ = _alu_prog(small_cfg, ALU_ADD, use_imm=True, imm=1000, a=[7] * 8 * n, b=[0] * 8 * n,
                           loops={"uop_bgn": 0, "uop_end": 1, "iter_out": 4, "iter_in": 1})
    res = fsim.run(prog, keep_sram=True)
    assert (res.sram["acc"][0] == 4007).all()
    assert (res.sram["acc"][1:8] == 7).all()


def test_alu_source_written_earlier_gives_sequential_result(small_cfg):
    """acc[i+1] = acc[i+1] + acc[i] for i = 0..6: a running sum, only right when executed in element order."""
    n = small_cfg.batch * small_cfg.block_out
    a = np.arange(1, 9).repeat(n)
    prog, _, _ = _alu_prog(small_cfg, ALU_ADD, use_imm=False, a=a, b=[0] * 8 * n, uops=[Uop(1, 0)],
                           loops={"uop_bgn": 0, "uop_end": 1, "iter_out": 7, "dst_factor_out": 1,
                                  "src_factor_out": 1})
    res = fsim.run(prog, keep_sram=True)
    assert np.array_equal(res.sram["acc"][:8, 0, 0], np.cumsum(np.arange(1, 9)))
    assert np.array_equal(res.dram, ref_run(prog))


def test_alu_max_pool_pattern(small_cfg):
    """Destination repeated, sources distinct (max over a window): vectorized rounds, same as element order."""
    n = small_cfg.batch * small_cfg.block_out
    rng = np.random.default_rng(5)
    a = rng.integers(-1000, 1000, 8 * n)
    prog, _, _ = _alu_prog(small_cfg, ALU_MAX, use_imm=False, a=a, b=rng.integers(-1000, 1000, 8 * n),
                           uops=[Uop(0, 8), Uop(1, 12)],
                           loops={"uop_bgn": 0, "uop_end": 2, "iter_out": 4, "src_factor_out": 1})
    res = fsim.run(prog, keep_sram=True)
    assert np.array_equal(res.dram, ref_run(prog))


# ---- tokens and the schedule -----------------------------------------------------------------------------------------
def test_pop_waits_for_a_later_push(small_cfg):
    res = fsim.run(gemm_after_late_load(small_cfg, True), keep_sram=True)
    assert res.sram["acc"][0, 0, 0] == small_cfg.block_in


def test_token_counts_and_stats_exact(small_cfg):
    cfg = small_cfg
    prog = gemm_after_late_load(cfg, True)
    stats = fsim.run(prog).stats.as_dict()
    n = len(prog.insns)
    assert stats == {
        "insn_bytes_read": n * 16, "uop_bytes_read": 4, "wgt_bytes_read": cfg.wgt_elem_bytes,
        "inp_bytes_read": cfg.inp_elem_bytes, "acc_bytes_read": 0, "out_bytes_written": cfg.out_elem_bytes,
        "gemm_uops": 1, "alu_uops": 0, "macs": cfg.macs_per_cycle, "fetch_insns": n, "load_insns": 2,
        "compute_insns": 3, "store_insns": 1, "load_to_compute_pushes": 1, "load_to_compute_pops": 1,
        "compute_to_load_pushes": 0, "compute_to_load_pops": 0, "compute_to_store_pushes": 1,
        "compute_to_store_pops": 1, "store_to_compute_pushes": 1, "store_to_compute_pops": 1}
    assert n == 6  # LOAD UOP, LOAD WGT, GEMM, LOAD INP, STORE, FINISH: every token folded into an instruction


def test_pop_before_push_of_same_module_completes(small_cfg):
    """Pops happen before execution and pushes after: a compute instruction may pop and push in one go."""
    prog = raw_program(small_cfg, [Load(mem=MEM_INP, x_size=0, push_next=True),
                                   Gemm(uop_end=0, pop_prev=True, push_prev=True),
                                   Load(mem=MEM_INP, x_size=0, pop_next=True), Finish()])
    stats = fsim.run(prog).stats
    assert (stats.load_to_compute_pops, stats.compute_to_load_pops) == (1, 1)


# ---- run() leaves the program alone ----------------------------------------------------------------------------------
def test_run_does_not_modify_the_program(small_cfg):
    prog = finish_with_store(_gemm_setup(small_cfg, np.random.default_rng(0)), small_cfg)
    before = prog.dram.copy()
    res = fsim.run(prog)
    assert np.array_equal(prog.dram, before)
    assert res.dram is not prog.dram


# ---- random programs against the reference ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), which=st.sampled_from(range(len(CONFIGS))), n_ops=st.integers(1, 30),
       alu_hazards=st.booleans(), max_index=st.sampled_from([4, 32]))
def test_random_programs_match_reference(seed, which, n_ops, alu_hazards, max_index):
    prog = random_program(CONFIGS[which], np.random.default_rng(seed), n_ops=n_ops, alu_hazards=alu_hazards,
                          max_index=max_index)
    assert np.array_equal(fsim.run(prog).dram, ref_run(prog))


def test_alu_source_written_later_is_vectorized_exactly(small_cfg):
    """acc[i] = max(acc[i], acc[i+1]) for i = 0..6: each source is overwritten only after it is read."""
    n = small_cfg.batch * small_cfg.block_out
    rng = np.random.default_rng(9)
    prog, a, _ = _alu_prog(small_cfg, ALU_MAX, use_imm=False, a=rng.integers(-99, 99, 8 * n), b=[0] * 8 * n,
                           uops=[Uop(0, 1)], loops={"uop_bgn": 0, "uop_end": 1, "iter_out": 7, "dst_factor_out": 1,
                                                    "src_factor_out": 1})
    res = fsim.run(prog, keep_sram=True)
    a = a.reshape(8, n)
    assert np.array_equal(res.sram["acc"][:7].reshape(7, n), np.maximum(a[:7], a[1:]))
    assert np.array_equal(res.dram, ref_run(prog))


# ---- GEMM evaluation strategies (vta.fsim_kernels.GemmPlan) ----------------------------------------------------------
@pytest.mark.parametrize("kind, uops, loops", [
    ("product", [Uop(0, 0, 0), Uop(0, 1, 1)], {"iter_out": 6, "dst_factor_out": 1, "src_factor_out": 2}),
    ("groups", [Uop(0, 0, 0)], {"iter_out": 6, "dst_factor_out": 1, "src_factor_out": 1, "wgt_factor_out": 1}),
    ("batched", [Uop(0, 0, 0)], {"iter_out": 70, "dst_factor_out": 1, "src_factor_out": 1, "wgt_factor_out": 1}),
    ("uneven", [Uop(0, 0, 0), Uop(0, 1, 1), Uop(1, 2, 2)], {"iter_out": 2, "src_factor_out": 3}),
])
def test_gemm_strategies_match_reference(cfg, kind, uops, loops):
    from vta.fsim_kernels import GemmPlan

    rng = np.random.default_rng(4)
    bld = ProgramBuilder(cfg)
    inp = bld.alloc("inp", rng.integers(-128, 128, (80, 1, 16), dtype=np.int8))
    wgt = bld.alloc("wgt", rng.integers(-128, 128, (80, 16, 16), dtype=np.int8))
    bld.load(MEM_INP, sram_base=0, dram_base=bld.elem_addr(inp, MEM_INP), x_size=80)
    bld.load(MEM_WGT, sram_base=0, dram_base=bld.elem_addr(wgt, MEM_WGT), x_size=80)
    bld.dep_push("load", "compute")
    bld.dep_pop("load", "compute")
    bld.load_uops(bld.uop_kernel("k", uops))
    bld.gemm(uop_bgn=0, uop_end=len(uops), **loops)
    prog = finish_with_store(bld, cfg, n=80)
    assert np.array_equal(fsim.run(prog).dram, ref_run(prog))
    # the strategy the plan picks for this loop structure
    o = np.arange(loops["iter_out"]).repeat(len(uops))
    u = np.tile(np.arange(len(uops)), loops["iter_out"])
    d = np.array([x.dst for x in uops])[u] + o * loops.get("dst_factor_out", 0)
    s = np.array([x.src for x in uops])[u] + o * loops.get("src_factor_out", 0)
    w = np.array([x.wgt for x in uops])[u] + o * loops.get("wgt_factor_out", 0)
    assert GemmPlan(d, s, w, 16).kind == kind


def test_unique_rows_matches_numpy():
    from vta.fsim_kernels import unique_rows

    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, (200, 4))
    uniq, inverse = unique_rows(a)
    assert np.array_equal(uniq[inverse], a)
    assert len(uniq) == len(np.unique(a, axis=0))
    long = rng.integers(0, 2, (10, 5000))  # longer than the hash: falls back to np.unique
    uniq, inverse = unique_rows(long)
    assert np.array_equal(uniq[inverse], long)
