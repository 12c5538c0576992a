"""The ALU_PIPELINE knob (``alu_pipeline``, docs/hardware.md "Codesign knobs"): the config, the RTL's extra ALU stage
with its forwarding (back-to-back micro-ops on the same accumulator entry), the cycle model's extra cycle per ALU
instruction, the clock and area models; the Verilator runs are ``slow``."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_tsim_matches_fsim, assert_tsim_matches_reference_and_model

from vta import fsim
from vta.clock import model_clock, path_elements
from vta.config import MEM_ACC, MEM_OUT, ConfigError, VTAConfig, load_config
from vta.cost import ALU_PIPELINE_DRAIN, estimate, estimate_insns
from vta.hw.verilog import verilog_text
from vta.isa import ALU_ADD, ALU_MAX, ALU_MUL, ALU_SHR, Alu, Finish, Gemm, Uop
from vta.program import Program, ProgramBuilder

ROOT = Path(__file__).resolve().parents[1]
KNOB = VTAConfig(alu_pipeline=True)
# a small core with the knob: BATCH 2 x BLOCK 4, small buffers (quick to build and simulate)
SMALL = VTAConfig(log_batch=1, log_block=2, log_uop_buff_size=9, log_inp_buff_size=9, log_wgt_buff_size=10,
                  log_acc_buff_size=12, alu_pipeline=True)


# ---- config ----------------------------------------------------------------------------------------------------------
def test_the_knob_is_a_tagged_config_field_off_by_default() -> None:
    assert VTAConfig().alu_pipeline is False and "ALU_PIPELINE" not in VTAConfig().to_dict()
    assert KNOB.name == "1x16_i8w8a32_15_15_18_17_ap" and KNOB.to_dict()["ALU_PIPELINE"] is True
    assert VTAConfig.from_dict(KNOB.to_dict()) == KNOB
    assert load_config(ROOT / "configs/timing/small1x4_ap.toml").name == "1x4_i8w8a32_15_13_14_15_ap"
    assert load_config(ROOT / "configs/timing/small1x4_rq_ap.toml").name == "1x4_i8w8a32_15_13_14_15_rq_ap"


def test_the_knob_is_refused_with_concurrent_alu_or_a_non_boolean() -> None:
    with pytest.raises(ConfigError, match=r"ALU_PIPELINE and CONCURRENT_ALU cannot both be on: the pipelined ALU is "
                                          r"built into the compute module's own micro-op pipeline, not into "
                                          r"CONCURRENT_ALU's ALU engine; turn one off"):
        VTAConfig(alu_pipeline=True, concurrent_alu=True)
    with pytest.raises(ConfigError, match="ALU_PIPELINE is a knob and must be true or false, not 1"):
        VTAConfig.from_dict({"ALU_PIPELINE": 1})


# ---- RTL ------------------------------------------------------------------------------------------------------------
def test_knob_off_rtl_has_no_operand_registers() -> None:
    """Off, the generator builds VTA's single-stage ALU (no operand registers or forwarding flags); on, they appear."""
    tiny = VTAConfig(log_block=2, log_uop_buff_size=6, log_inp_buff_size=6, log_wgt_buff_size=7, log_acc_buff_size=7)
    off, on = verilog_text(tiny), verilog_text(tiny.replace(alu_pipeline=True))
    names = [re.compile(r"\b" + name + r"\b") for name in ("op_a", "op_b", "fwd_a", "fwd_b", "e_valid")]
    assert not any(n.search(off) for n in names)
    assert all(n.search(on) for n in names)


def hazard_program(cfg: VTAConfig, seed: int = 0) -> tuple[Program, np.ndarray]:
    """ALU instructions whose consecutive micro-ops read what the one before writes (the forward from stage E) or
    the one before that (the block RAM's transparent read): on 8 acc entries of small random values,

    * ADD imm 3, seven times on entry 0 (acc[dst] forwarded);
    * ADD acc[k+1] += acc[k] for k = 0..3 in order (acc[src] forwarded);
    * MUL entry 5 by itself, three times (both operands forwarded);
    * ADD imm 1 alternately on entries 6 and 7, three times each (distance two);
    * MAX imm 0 twice on entry 4, SHR imm 1 twice on entry 1 (forwards through the comparator and the shifter).

    Returns the program and the expected ``out`` (the entries' low bytes, int8, ``(8, BATCH, BLOCK_OUT)``), worked
    out with numpy apart from :mod:`vta.fsim`."""
    rng = np.random.default_rng(seed)
    shape = (8, cfg.batch, cfg.block_out)
    acc = rng.integers(-9, 10, shape).astype(np.int64)
    acc[5] = rng.integers(-3, 4, shape[1:])
    b = ProgramBuilder(cfg)
    acc_al = b.alloc("acc", acc.astype(np.int32))
    out = b.alloc("out", shape, np.int8)
    b.load_uops(b.uop_kernel("uops", [Uop(0, 0), Uop(1, 0), Uop(2, 1), Uop(3, 2), Uop(4, 3), Uop(5, 5), Uop(6, 6),
                                      Uop(7, 7), Uop(4, 4)]))
    b.load(MEM_ACC, sram_base=0, dram_base=b.elem_addr(acc_al, MEM_ACC), x_size=8)
    b.alu(ALU_ADD, uop_bgn=0, uop_end=1, iter_out=7, use_imm=True, imm=3)
    b.alu(ALU_ADD, uop_bgn=1, uop_end=5)
    b.alu(ALU_MUL, uop_bgn=5, uop_end=6, iter_out=3)
    b.alu(ALU_ADD, uop_bgn=6, uop_end=8, iter_out=3, use_imm=True, imm=1)
    b.alu(ALU_MAX, uop_bgn=8, uop_end=9, iter_out=2, use_imm=True, imm=0)
    b.alu(ALU_SHR, uop_bgn=1, uop_end=2, iter_out=2, src_factor_out=0, use_imm=True, imm=1)  # uop (1, 0): dst 1
    b.dep_push("compute", "store")
    b.dep_pop("compute", "store")
    b.store(sram_base=0, dram_base=b.elem_addr(out, MEM_OUT), x_size=8)
    want = acc.copy()
    want[0] += 21
    for k in range(4):
        want[k + 1] += want[k]
    want[5] = want[5] ** 8
    want[6:8] += 3
    want[4] = np.maximum(want[4], 0)
    want[1] >>= 2
    return b.finish(), (want & 0xFF).astype(np.uint8).view(np.int8)


def test_fsim_runs_the_hazard_program() -> None:
    """The reference the RTL is checked against computes what numpy does (the ISA is unchanged by the knob)."""
    for cfg in (SMALL, SMALL.replace(alu_pipeline=False)):
        program, want = hazard_program(cfg)
        np.testing.assert_array_equal(program.read("out", fsim.run(program).dram), want)


def test_the_hazard_count_finds_every_back_to_back_dependent_micro_op() -> None:
    """scripts/alu_hazards.py (what a stall instead of the forward would cost): on the hazard program, 6 + 3 + 2 + 0 +
    1 + 1 of its 24 ALU micro-ops read the entry the micro-op before them writes."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("alu_hazards", ROOT / "scripts" / "alu_hazards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.dependent_pairs(hazard_program(SMALL)[0]) == (13, 24)


# ---- cycle, clock and area models ------------------------------------------------------------------------------------
def test_the_cycle_model_adds_one_cycle_per_alu_instruction() -> None:
    """Each ALU instruction with micro-ops takes ALU_PIPELINE_DRAIN (1) more cycle; GEMMs and empty ALUs do not."""
    insns = [Alu(alu_opcode=ALU_ADD, uop_bgn=0, uop_end=1, iter_out=5), Gemm(uop_bgn=0, uop_end=1, iter_out=3),
             Alu(alu_opcode=ALU_ADD, uop_bgn=0, uop_end=0), Alu(alu_opcode=ALU_MAX, uop_bgn=0, uop_end=2), Finish()]
    off, on = estimate_insns(VTAConfig(), insns), estimate_insns(KNOB, insns)
    assert ALU_PIPELINE_DRAIN == 1 and on.cycles - off.cycles == 2
    assert estimate(hazard_program(SMALL)[0]).cycles - estimate(hazard_program(SMALL.replace(
        alu_pipeline=False))[0]).cycles == 6  # six ALU instructions


def test_the_clock_model_moves_the_block_ram_read_off_the_alu_path() -> None:
    cfg = load_config(ROOT / "configs/timing/small1x4.toml")
    off, on = path_elements(cfg), path_elements(cfg.replace(alu_pipeline=True))
    assert off["compute.alu"][:2] == ["bram", "lut"] and on["compute.alu"][0] == "ff"
    assert on["compute.alu"][1:] == off["compute.alu"][2:] and on["compute.alu_read"] == ["bram", "lut", "lut"]
    assert "compute.alu_read" not in off and on["compute.gemm"] == off["compute.gemm"]
    assert model_clock(cfg.replace(alu_pipeline=True)).mhz > model_clock(cfg).mhz


def test_the_area_model_counts_the_operand_registers() -> None:
    """The knob's area as measured at BLOCK 4 (vta hw resources: +18 LUT, +311 FF): two operand registers of an acc
    entry each, no DSP or block RAM."""
    from vta.area import config_from_name, estimate_area
    small = load_config(ROOT / "configs/timing/small1x4.toml")
    off, on = estimate_area(small), estimate_area(small.replace(alu_pipeline=True))
    assert (on.lut - off.lut, on.ff - off.ff, on.dsp - off.dsp, on.bram - off.bram) == (18, 311, 0, 0)
    assert estimate_area(KNOB).ff - estimate_area(VTAConfig()).ff == 2 * 512 + 55
    assert config_from_name(KNOB.name) == KNOB


# ---- the RTL on Verilator --------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("requant", [False, True], ids=["ap", "rq_ap"])
def test_tsim_runs_hazards_and_random_programs_bit_exact(requant: bool) -> None:
    """The hazard program and random programs (every ALU opcode, tensor operands reading entries the same instruction
    wrote) on the Verilator model of a small core with the knob: the same DRAM and micro-op counts as fsim; the
    hazard program's cycles are the cycle model's and the knob-off core's plus one per ALU instruction."""
    from vta.testing import random_program
    from vta.tsim.backend import TSimBackend
    tsim = TSimBackend(check="none", progress=False)
    cfg = SMALL.replace(fused_requant=requant)
    program, want = hazard_program(cfg)
    got = tsim.run(program)
    np.testing.assert_array_equal(program.read("out", got.dram), want)
    assert got.counters["alu_uops"] == 7 + 4 + 3 + 6 + 2 + 2
    assert got.cycles == estimate(program).cycles
    if not requant:
        plain = tsim.run(hazard_program(cfg.replace(alu_pipeline=False))[0])
        assert got.cycles - plain.cycles == 6
    for seed in range(4):
        assert_tsim_matches_fsim(tsim, random_program(cfg, np.random.default_rng(seed)), tolerance=0.06)


@pytest.mark.slow
def test_tiny_model_on_tsim_with_the_knob_is_bit_exact_and_the_model_follows() -> None:
    """tiny_cnn compiled for a small core with ALU_PIPELINE and FUSED_REQUANT: tsim's outputs equal the integer
    reference, and the cycle model is within 5 % on every accelerator layer."""
    from vta.compiler.pipeline import compile_model
    compiled = compile_model("tiny_cnn", SMALL.replace(fused_requant=True), policy="accel", calib=2)
    assert_tsim_matches_reference_and_model(compiled, seed=7)
