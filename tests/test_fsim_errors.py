"""The functional simulator's errors: deadlocks, invalid instructions, out-of-range addresses, runaway programs."""
from __future__ import annotations

import pytest
from helpers import raw_program_after_data

from vta import fsim
from vta.config import MEM_INP, MEM_OUT, MEM_UOP
from vta.fsim import (
    DeadlockError,
    DramRangeError,
    InvalidInstructionError,
    RunawayError,
    SimulationError,
    SramRangeError,
)
from vta.isa import ALU_ADD, Alu, Finish, Gemm, Load, Store


# ---- deadlocks -------------------------------------------------------------------------------------------------------
def test_deadlock_names_every_blocked_module(small_cfg):
    prog = raw_program_after_data(small_cfg, [Load(mem=MEM_INP, x_size=0, pop_next=True), Gemm(pop_prev=True),
                                              Store(x_size=0, pop_prev=True), Finish()])
    with pytest.raises(DeadlockError, match=r"^the program deadlocks: load module: instruction 0 \(LOAD INP\) waits "
                       r"for a compute->load token \(pop_next\); compute module: instruction 1 \(GEMM\) waits for a "
                       r"load->compute token \(pop_prev\); store module: instruction 2 \(STORE OUT\) waits for a "
                       r"compute->store token \(pop_prev\)$") as err:
        fsim.run(prog)
    assert err.value.insn_index == 0


def test_deadlock_on_full_token_queue_and_full_command_queue(small_cfg):
    # token queues hold 2: the third push blocks; compute never pops; fetch then fills the load command queue.
    pushes = [Load(mem=MEM_INP, x_size=0, push_next=True) for _ in range(3)]
    prog = raw_program_after_data(small_cfg, pushes + [Load(mem=MEM_INP, x_size=0)] * 2 + [Finish()])
    with pytest.raises(DeadlockError, match=r"^the program deadlocks: load module: instruction 2 \(LOAD INP\) waits "
                       r"for room in the full load->compute token queue \(2 tokens\); fetch: instruction 4 waits for "
                       r"room in the full load command queue \(2 instructions\)$") as err:
        fsim.run(prog)
    assert err.value.insn_index == 2


def test_finish_while_a_store_still_waits(small_cfg):
    prog = raw_program_after_data(small_cfg, [Store(x_size=0, pop_prev=True), Finish()])
    with pytest.raises(DeadlockError, match=r"^FINISH \(instruction 1\) cannot end the program: store module: "
                       r"instruction 0 \(STORE OUT\) waits for a compute->store token \(pop_prev\); make FINISH "
                       r"wait for them"):
        fsim.run(prog, check_races=False)


# ---- errors ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("insn, message", [
    (Load(mem=MEM_OUT), r"instruction 0 is a LOAD of memory type 4 \(OUT\); LOAD takes UOP, WGT, INP, ACC or "
                        r"ACC_8BIT \(the out buffer is written only by GEMM and ALU\)"),
    (Store(mem=MEM_INP), r"instruction 0 is a STORE of memory type 2 \(INP\); STORE reads only OUT \(4\)"),
    (Store(x_pad_1=2), r"instruction 0 is a STORE with padding \(y_pad_0, y_pad_1, x_pad_0, x_pad_1\) = "
                       r"\(0, 0, 0, 2\); STORE takes no padding"),
    (Gemm(uop_bgn=5, uop_end=3), r"instruction 0 \(GEMM\) has uop_end 3 < uop_bgn 5; the micro-op range "
                                 r"\[uop_bgn, uop_end\) must not be negative"),
    (Load(mem=MEM_INP, pop_prev=True), r"instruction 0 \(LOAD INP\) sets pop_prev, which the load module does not "
                                       r"have; its token flags are pop_next, push_next"),
    (Store(push_next=True), r"instruction 0 \(STORE OUT\) sets push_next, which the store module does not have; "
                            r"its token flags are pop_prev, push_prev"),
])
def test_invalid_instructions(small_cfg, insn, message):
    with pytest.raises(InvalidInstructionError, match="^" + message + "$") as err:
        fsim.run(raw_program_after_data(small_cfg, [insn, Finish()]))
    assert err.value.insn_index == 0


def test_instruction_after_finish_and_missing_finish(small_cfg):
    with pytest.raises(InvalidInstructionError, match=r"^instruction 2 \(GEMM\) follows FINISH \(instruction 1\); "
                       r"FINISH must be the last instruction$"):
        fsim.run(raw_program_after_data(small_cfg, [Gemm(uop_end=0), Finish(), Gemm(uop_end=0)]))
    with pytest.raises(InvalidInstructionError, match=r"^the program has no FINISH instruction; its last "
                       r"instruction \(index 0\) must be FINISH$"):
        fsim.run(raw_program_after_data(small_cfg, [Gemm(uop_end=0)]))
    with pytest.raises(InvalidInstructionError, match=r"^the program has no instructions; it must end with FINISH$"):
        fsim.run(raw_program_after_data(small_cfg, []))


def test_sram_range_errors(small_cfg):
    with pytest.raises(SramRangeError, match=r"^instruction 0 \(LOAD INP\) writes inp entries \[30, 36\), but the inp "
                       r"buffer has 32 entries \(index 35 >= depth 32\)$") as err:
        fsim.run(raw_program_after_data(small_cfg, [Load(mem=MEM_INP, sram_base=30, x_size=2, x_pad_1=1, y_size=2),
                                                    Finish()]))
    assert err.value.insn_index == 0
    with pytest.raises(SramRangeError, match=r"^instruction 1 \(GEMM\) addresses wgt entry 32 \(iteration o=2, i=0, "
                       r"micro-op 0\), but the wgt buffer has 32 entries$"):
        fsim.run(raw_program_after_data(small_cfg, [Load(mem=MEM_UOP, x_size=0), Gemm(iter_out=3, wgt_factor_out=16),
                                                    Finish()]))
    with pytest.raises(SramRangeError, match=r"^instruction 0 \(ALU ADD\) reads micro-ops \[30, 33\), but the uop "
                       r"buffer has 32 entries$"):
        fsim.run(raw_program_after_data(small_cfg, [Alu(alu_opcode=ALU_ADD, uop_bgn=30, uop_end=33), Finish()]))
    with pytest.raises(SramRangeError, match=r"^instruction 0 \(STORE OUT\) reads out entries \[31, 33\), but the out "
                       r"buffer has 32 entries \(index 32 >= depth 32\)$"):
        fsim.run(raw_program_after_data(small_cfg, [Store(sram_base=31, x_size=2), Finish()]))


def test_unread_indices_are_not_checked(small_cfg):
    """A reset GEMM reads neither inp nor wgt; an ALU op with an immediate reads no src: indices past the 32 entries
    of the buffers (20 * 2 = 40 in the last iteration) are fine there, and every iteration runs."""
    stats = fsim.run(raw_program_after_data(small_cfg, [
        Gemm(reset=True, iter_out=3, src_factor_out=20, wgt_factor_out=20),
        Alu(alu_opcode=ALU_ADD, use_imm=True, iter_out=3, src_factor_out=20), Finish()])).stats
    assert (stats.gemm_uops, stats.alu_uops) == (3, 3)
    for reads, what in [(Gemm(iter_out=3, src_factor_out=20), r"\(GEMM\) addresses inp"),
                        (Alu(alu_opcode=ALU_ADD, iter_out=3, src_factor_out=20), r"\(ALU ADD\) addresses acc")]:
        with pytest.raises(SramRangeError, match=rf"^instruction 0 {what} entry 40 \(iteration o=2, i=0, micro-op 0\), "
                                                 r"but the \w+ buffer has 32 entries$"):
            fsim.run(raw_program_after_data(small_cfg, [reads, Finish()]))


def test_dram_range_errors(small_cfg):
    prog = raw_program_after_data(small_cfg, [Load(mem=MEM_INP, dram_base=500, y_size=3, x_stride=10), Finish()], 4096)
    assert prog.dram.size == 4128  # 4096 bytes of data, then two 16-byte instructions
    with pytest.raises(DramRangeError, match=r"^instruction 0 \(LOAD INP\) reads DRAM bytes \[4000, 4168\), outside "
                       r"the 4128-byte DRAM image$") as err:
        fsim.run(prog)
    assert err.value.insn_index == 0
    with pytest.raises(DramRangeError, match=r"^instruction 0 \(STORE OUT\) writes DRAM bytes \[8000000, 8000008\), "
                       r"outside the 4128-byte DRAM image$"):
        fsim.run(raw_program_after_data(small_cfg, [Store(dram_base=10 ** 6), Finish()], 4096))


def test_runaway(small_cfg):
    prog = raw_program_after_data(small_cfg, [Gemm(uop_end=0)] * 5 + [Finish()])
    assert fsim.run(prog, max_insns=6).stats.compute_insns == 6
    with pytest.raises(RunawayError, match=r"^more than max_insns=4 instructions executed \(instruction 4 would be "
                       r"number 5\); raise the limit \(max_insns=N, vta run --max-insns N; None or 'none' for no "
                       r"limit\) if the program is meant to be this long$") as err:
        fsim.run(prog, max_insns=4)
    assert err.value.insn_index == 4
    assert issubclass(RunawayError, SimulationError)


def test_run_rejects_wrong_arguments(small_cfg):
    with pytest.raises(TypeError, match=r"^run\(\) takes a Program, not str$"):
        fsim.run("program")
    with pytest.raises(ValueError, match=r"^max_insns must be None or a non-negative integer, not -1$"):
        fsim.run(raw_program_after_data(small_cfg, [Finish()]), max_insns=-1)
