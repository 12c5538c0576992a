"""The functional simulator's race check (vta.fsim_race): accesses no token orders, and why they matter."""
from __future__ import annotations

import numpy as np
import pytest
from fsim_helpers import CONFIGS, gemm_after_late_load
from helpers import raw_program_after_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vta import fsim
from vta.config import MEM_INP, MEM_UOP
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
    prog = raw_program_after_data(small_cfg, [Gemm(reset=True, push_next=True), Store(pop_prev=True, push_prev=True),
                                              Alu(alu_opcode=ALU_ADD, use_imm=True, imm=1), Finish(pop_next=True)])
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(ALU ADD\) overwrites out entry 0, which instruction 1 "
                       r"\(STORE OUT\) reads, and no dependency token orders the two; the store module must push a "
                       r"token after that instruction which the compute module pops before this one$"):
        fsim.run(prog)


def _load_after_unordered_store(cfg, load):
    """GEMM 0 resets out entry 0; STORE 1 writes it to out element 2 (DRAM bytes [16, 24) at 8-byte elements);
    ``load`` (instruction 2) follows with no store->compute token between them; FINISH 3."""
    return raw_program_after_data(cfg, [Gemm(reset=True, push_next=True), Store(dram_base=2, pop_prev=True), load,
                                        Finish()])


def test_dram_race_between_store_and_load(small_cfg):
    """A LOAD reading what a STORE wrote must be ordered after it through compute (out and inp elements: 8 bytes)."""
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(LOAD INP\) reads DRAM byte 16, which instruction 1 "
                       r"\(STORE OUT\) writes, and no dependency token orders the two; the store module must push a "
                       r"token after that instruction which the load module pops \(through compute\) before this "
                       r"one$"):
        fsim.run(_load_after_unordered_store(small_cfg, Load(mem=MEM_INP, dram_base=2)))
    ordered = raw_program_after_data(small_cfg, [Gemm(reset=True, push_next=True),
                                                 Store(dram_base=2, pop_prev=True, push_prev=True),
                                                 Gemm(uop_end=0, pop_next=True, push_prev=True),
                                                 Load(mem=MEM_INP, dram_base=2, pop_next=True), Finish()])
    fsim.run(ordered)  # FINISH is ordered after the STORE too: through the GEMM, earlier in compute order


def test_finish_not_ordered_after_last_store(small_cfg):
    prog = raw_program_after_data(small_cfg, [Gemm(reset=True, push_next=True), Store(dram_base=2, pop_prev=True),
                                              Finish()])
    with pytest.raises(RaceError, match=r"^race: FINISH \(instruction 2\) is not ordered after instruction 1 "
                       r"\(STORE OUT\), so the accelerator could signal done before that store completes; pop a "
                       r"store->compute token pushed after the last STORE \(ProgramBuilder.finish does this\)$"):
        fsim.run(prog)


def test_strided_store_overwriting_unordered_load_is_a_race(small_cfg):
    """WAR in DRAM: a STORE (rows 3 elements apart) overwrites bytes a LOAD reads, with no token in between."""
    prog = raw_program_after_data(small_cfg, [Load(mem=MEM_INP, dram_base=4, x_size=1),
                                              Gemm(reset=True, push_next=True),
                                              Store(dram_base=1, y_size=2, x_size=1, x_stride=3, pop_prev=True,
                                                    push_prev=True),
                                              Finish(pop_next=True)])
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(STORE OUT\) overwrites DRAM byte 32, which "
                       r"instruction 0 \(LOAD INP\) reads, and no dependency token orders the two; the load module "
                       r"must push a token after that instruction which the store module pops \(through compute\) "
                       r"before this one$"):
        fsim.run(prog)


# ---- the instruction stream and micro-ops in DRAM -----------------------------------------------------------------
def _store_into_stream(cfg, **store):
    """GEMM 0 resets out entry 0; STORE 1 waits for GEMM 2 (so instructions 0-2 are known fetched) and writes
    ``store``; FINISH 3. raw_program_after_data puts the stream at byte 4096: instruction j is DRAM bytes
    [4096 + 16 j, +16), out element e is bytes [8 e, 8 e + 8)."""
    return raw_program_after_data(cfg, [Gemm(reset=True), Store(pop_prev=True, push_prev=True, **store),
                                        Gemm(uop_end=0, push_next=True), Finish(pop_next=True)])


def test_store_into_instructions_not_yet_fetched_is_a_race(small_cfg):
    assert small_cfg.out_elem_bytes == 8 and _store_into_stream(small_cfg).insn_bytes == 16
    for store in (dict(dram_base=512 + 2 * 3), dict(dram_base=3, y_size=2, x_size=1, x_stride=512 + 2 * 3 - 3)):
        with pytest.raises(RaceError, match=r"^race: instruction 1 \(STORE OUT\) overwrites DRAM bytes \[4144, 4160\) "
                           r"of instruction 3 \(FINISH\), which fetch may not have read yet \(the last instruction "
                           r"known to be fetched is instruction 2 \(GEMM\)\), so what the accelerator runs would "
                           r"depend on timing; keep STOREs out of the instruction stream \[4096, 4160\) or write "
                           r"only instructions that an earlier, token-ordered instruction shows fetched$") as err:
            fsim.run(_store_into_stream(small_cfg, **store))
        assert err.value.insn_index == 1
    # instruction 2 is known fetched (the STORE waited for its token): overwriting it changes nothing the hardware runs
    prog = _store_into_stream(small_cfg, dram_base=512 + 2 * 2)
    assert prog.dram[4128:4136].any()
    dram = fsim.run(prog).dram
    assert not dram[4128:4136].any() and np.array_equal(dram[4136:], prog.dram[4136:])


def test_store_into_the_stream_with_nothing_fetched_before_it(small_cfg):
    """Only the STORE itself (instruction 0) is known fetched; it writes instruction 1."""
    prog = raw_program_after_data(small_cfg, [Store(dram_base=512 + 2), Finish()])
    with pytest.raises(RaceError, match=r"^race: instruction 0 \(STORE OUT\) overwrites DRAM bytes \[4112, 4128\) of "
                       r"instruction 1 \(FINISH\), which fetch may not have read yet \(the last instruction known to "
                       r"be fetched is instruction 0 \(STORE OUT\)\), "):
        fsim.run(prog)


def test_store_into_micro_ops_a_later_load_reads(small_cfg):
    """Micro-ops are DRAM data read by LOAD UOP (compute): a STORE into them needs a store->compute token."""
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(LOAD UOP\) reads DRAM byte 16, which instruction 1 "
                       r"\(STORE OUT\) writes, and no dependency token orders the two; the store module must push a "
                       r"token after that instruction which the compute module pops before this one$"):
        fsim.run(_load_after_unordered_store(small_cfg, Load(mem=MEM_UOP, dram_base=4)))
    war = raw_program_after_data(small_cfg, [Gemm(reset=True, push_next=True), Load(mem=MEM_UOP, dram_base=4),
                                             Store(dram_base=2, pop_prev=True, push_prev=True), Finish(pop_next=True)])
    with pytest.raises(RaceError, match=r"^race: instruction 2 \(STORE OUT\) overwrites DRAM byte 16, which "
                       r"instruction 1 \(LOAD UOP\) reads, and no dependency token orders the two; "):
        fsim.run(war)
    ordered = raw_program_after_data(small_cfg, [Gemm(reset=True, push_next=True),
                                                 Store(dram_base=2, pop_prev=True, push_prev=True),
                                                 Load(mem=MEM_UOP, dram_base=4, pop_next=True), Finish()])
    ordered.dram[16:20] = 0xFF
    assert fsim.run(ordered, keep_sram=True).sram["uop"][:, 0].tolist() == [0, 0, 0]  # the stored zeros


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
