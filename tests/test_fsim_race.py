"""The functional simulator's race check (vta.fsim_race): accesses no token orders, and why they matter."""
from __future__ import annotations

import numpy as np
import pytest
from fsim_helpers import CONFIGS, gemm_after_late_load, raw_program
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vta import fsim
from vta.config import MEM_INP
from vta.fsim import RaceError
from vta.isa import ALU_ADD, Alu, Finish, Gemm, Load, Store
from vta.testing import random_program


# ---- races -----------------------------------------------------------------------------------------------------------
def test_missing_token_is_a_race(small_cfg):
    prog = gemm_after_late_load(small_cfg, False)
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(GEMM\) reads wgt entry 0, which instruction 1 "
                       r"\(LOAD WGT\) writes, and no dependency token orders the two; the load module must push a "
                       r"token after that instruction which the compute module pops before this one$") as err:
        fsim.run(prog)
    assert err.value.insn_index == 2
    # Unchecked, the simulator's schedule runs the GEMM first, on zeros; the hardware might not.
    assert fsim.run(prog, keep_sram=True, check_races=False).sram["acc"][0, 0, 0] == 0


def test_write_after_read_race_on_out_buffer(small_cfg):
    """A STORE reads out entry 0; a later ALU overwrites it without waiting for a store->compute token."""
    prog = raw_program(small_cfg, [Gemm(reset=True, push_next=True), Store(pop_prev=True, push_prev=True),
                                   Alu(alu_opcode=ALU_ADD, use_imm=True, imm=1), Finish(pop_next=True)])
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(ALU ADD\) overwrites out entry 0, which instruction 1 "
                       r"\(STORE OUT\) reads, and no dependency token orders the two; the store module must push a "
                       r"token after that instruction which the compute module pops before this one$"):
        fsim.run(prog)


def test_dram_race_between_store_and_load(small_cfg):
    """A LOAD reading what a STORE wrote must be ordered after it through compute (out and inp elements: 8 bytes)."""
    racy = raw_program(small_cfg, [Gemm(reset=True, push_next=True), Store(dram_base=2, pop_prev=True),
                                   Load(mem=MEM_INP, dram_base=2), Finish()])
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(LOAD INP\) reads DRAM byte 16, which instruction 1 "
                       r"\(STORE OUT\) writes, and no dependency token orders the two; the store module must push a "
                       r"token after that instruction which the load module pops \(through compute\) before this "
                       r"one$"):
        fsim.run(racy)
    ordered = raw_program(small_cfg, [Gemm(reset=True, push_next=True),
                                      Store(dram_base=2, pop_prev=True, push_prev=True),
                                      Gemm(uop_end=0, pop_next=True, push_prev=True),
                                      Load(mem=MEM_INP, dram_base=2, pop_next=True), Finish()])
    fsim.run(ordered)  # FINISH is ordered after the STORE too: through the GEMM, earlier in compute order


def test_finish_not_ordered_after_last_store(small_cfg):
    prog = raw_program(small_cfg, [Gemm(reset=True, push_next=True), Store(dram_base=2, pop_prev=True), Finish()])
    with pytest.raises(RaceError, match=r"^race: FINISH \(instruction 2\) is not ordered after instruction 1 "
                       r"\(STORE OUT\), so the accelerator could signal done before that store completes; pop a "
                       r"store->compute token pushed after the last STORE \(ProgramBuilder.finish does this\)$"):
        fsim.run(prog)


def test_strided_store_overwriting_unordered_load_is_a_race(small_cfg):
    """WAR in DRAM: a STORE (rows 3 elements apart) overwrites bytes a LOAD reads, with no token in between."""
    prog = raw_program(small_cfg, [Load(mem=MEM_INP, dram_base=4, x_size=1), Gemm(reset=True, push_next=True),
                                   Store(dram_base=1, y_size=2, x_size=1, x_stride=3, pop_prev=True,
                                         push_prev=True),
                                   Finish(pop_next=True)])
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(STORE OUT\) overwrites DRAM byte 32, which "
                       r"instruction 0 \(LOAD INP\) reads, and no dependency token orders the two; the load module "
                       r"must push a token after that instruction which the store module pops \(through compute\) "
                       r"before this one$"):
        fsim.run(prog)


# ---- race-free programs and the schedule -----------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), schedule=st.integers(0, 2 ** 32 - 1), which=st.sampled_from(range(3)))
def test_race_free_programs_do_not_depend_on_the_schedule(seed, schedule, which):
    prog = random_program(CONFIGS[which], np.random.default_rng(seed), n_ops=30)
    assert np.array_equal(fsim.run(prog, schedule_seed=schedule).dram, fsim.run(prog).dram)


def test_racy_program_depends_on_the_schedule(small_cfg):
    """What the race check protects against: without the token, some schedules run the LOAD before the GEMM."""
    prog = gemm_after_late_load(small_cfg, False)
    results = {int(fsim.run(prog, keep_sram=True, check_races=False, schedule_seed=s).sram["acc"][0, 0, 0])
               for s in range(20)}
    assert results == {0, small_cfg.block_in}
