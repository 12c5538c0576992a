"""The CONCURRENT_ALU knob in fsim's race check (docs/hardware.md, "Codesign knobs"): ALU instructions run on a
second engine of the compute module, so an ALU instruction and a later GEMM or LOAD ACC on the same acc/out bank must
be ordered by a drain (LOAD UOP, FINISH), the front end's wait before a push, or tokens."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL_CFG
from fsim_helpers import CONFIGS, finish_with_store

from vta import fsim
from vta.compiler.lowering.codegen import OUTPUT, AddLayer, ConvLayer, build_add_program, build_conv_program
from vta.compiler.lowering.intrin import intrinsics
from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_WGT, VTAConfig
from vta.fsim import RaceError
from vta.isa import ALU_ADD, Load, Uop
from vta.program import Program, ProgramBuilder
from vta.testing import random_program

ON = SMALL_CFG.replace(concurrent_alu=True)  # BATCH 2, BLOCK 4, 32 acc/out entries: bank 1 is [16, 32)
HALF = ON.acc_depth // 2


def _prologue(cfg: VTAConfig) -> tuple[ProgramBuilder, object]:
    """Micro-ops 0 (dst 0, bank 0) and 1 (dst HALF, bank 1); inputs and weights loaded; both banks reset and
    accumulated once by GEMMs."""
    rng = np.random.default_rng(5)
    bld = ProgramBuilder(cfg)
    inp = bld.alloc("inp", rng.integers(-128, 128, (1, cfg.batch, cfg.block_in)).astype(np.int8))
    wgt = bld.alloc("wgt", rng.integers(-128, 128, (1, cfg.block_out, cfg.block_in)).astype(np.int8))
    kernel = bld.uop_kernel("k", [Uop(0, 0, 0), Uop(cfg.acc_depth // 2, 0, 0)])
    bld.load_uops(kernel)
    bld.load(MEM_INP, sram_base=0, dram_base=bld.elem_addr(inp, MEM_INP))
    bld.load(MEM_WGT, sram_base=0, dram_base=bld.elem_addr(wgt, MEM_WGT))
    bld.dep_push("load", "compute")
    bld.dep_pop("load", "compute")
    bld.gemm(uop_bgn=0, uop_end=2, reset=True)
    bld.gemm(uop_bgn=0, uop_end=2)
    return bld, kernel


def alu_then(cfg: VTAConfig, bank: int, *, between: str = "none", then: str = "gemm",
             alu_pushes: bool = True) -> tuple[Program, int, int]:
    """An ALU ADD on bank 0 (acc[0] += acc[0]), then a GEMM, a LOAD ACC or a padded LOAD ACC_8BIT
    (``then``) on ``bank``; ``between``:
    nothing, a LOAD UOP ("drain") or a token chain ALU -> store -> compute ("tokens"). ``alu_pushes``: the ALU
    pushes a compute->store token (else only the later instruction does). Returns (program, ALU index, index of the
    later instruction); the program stores all out entries."""
    bld, kernel = _prologue(cfg)
    acc = bld.alloc("acc", np.arange(cfg.batch * cfg.block_out, dtype=np.int32).reshape(1, cfg.batch, -1))
    acc8 = bld.alloc("acc8", np.arange(cfg.batch * cfg.block_out, dtype=np.int8).reshape(1, cfg.batch, -1))
    alu = bld.alu(ALU_ADD, uop_bgn=0, uop_end=1)
    if alu_pushes:
        bld.dep_push("compute", "store")
        bld.dep_pop("compute", "store")
    if between == "tokens":
        bld.dep_push("store", "compute")
        bld.dep_pop("store", "compute")
    elif between == "drain":
        bld.load_uops(kernel)
    if then == "gemm":
        later = bld.gemm(uop_bgn=bank, uop_end=bank + 1)
    elif then == "load_acc8_padded":  # its data in the first entry of ``bank``, its padding in the entry before
        later = bld.load(MEM_ACC_8BIT, sram_base=bank * (cfg.acc_depth // 2) - 1,
                         dram_base=bld.elem_addr(acc8, MEM_ACC_8BIT), x_pad_0=1)
    else:
        later = bld.load(MEM_ACC, sram_base=bank * (cfg.acc_depth // 2), dram_base=bld.elem_addr(acc, MEM_ACC))
    return finish_with_store(bld, cfg, n=cfg.out_depth), alu, later


def _bank_race(later: int, name: str, alu: int) -> str:
    return (rf"^race: instruction {later} \({name}\) accesses acc/out bank 0 \(entries \[0, {HALF}\)\), which "
            rf"instruction {alu} \(ALU ADD\) in the ALU engine also accesses, and nothing orders the two: the ALU "
            rf"engine runs concurrently with the GEMMs and LOAD ACCs after it \(CONCURRENT_ALU\); drain the engine "
            rf"between them \(a LOAD UOP\), order them by a token chain from the ALU instruction's pushes, or use the "
            rf"other bank$")


# ---- the bank rule --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("then, bank", [("gemm", 0), ("load_acc", 0), ("load_acc8_padded", 1)])
def test_knob_off_nothing_changes(then: str, bank: int) -> None:
    """Without the knob the ALU runs in program order with the GEMMs: the same-bank programs pass."""
    program, _, _ = alu_then(SMALL_CFG, bank, then=then)
    result = fsim.run(program)
    assert result.stats.alu_uops == 1


@pytest.mark.parametrize("then, bank, name", [("gemm", 0, "GEMM"), ("load_acc", 0, "LOAD ACC"),
                                             ("load_acc8_padded", 1, "LOAD ACC_8BIT")])
def test_same_bank_without_ordering_is_a_race(then: str, bank: int, name: str) -> None:
    """The ALU works on bank 0; so does the GEMM or LOAD ACC after it (the padded LOAD ACC_8BIT through its padding
    entry only)."""
    program, alu, later = alu_then(ON, bank, then=then)
    with pytest.raises(RaceError, match=_bank_race(later, name, alu)) as err:
        fsim.run(program)
    assert err.value.insn_index == later
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("then", ["gemm", "load_acc"])
def test_other_bank_runs_concurrently(then: str) -> None:
    program, _, _ = alu_then(ON, 1, then=then)
    off, _, _ = alu_then(SMALL_CFG, 1, then=then)
    assert program.insns == off.insns
    np.testing.assert_array_equal(fsim.run(program).dram, fsim.run(off).dram)


@pytest.mark.parametrize("between", ["drain", "tokens"])
@pytest.mark.parametrize("then", ["gemm", "load_acc"])
def test_a_drain_or_a_token_chain_orders_the_same_bank(between: str, then: str) -> None:
    program, _, _ = alu_then(ON, 0, between=between, then=then)
    off, _, _ = alu_then(SMALL_CFG, 0, between=between, then=then)
    want = fsim.run(off).dram
    np.testing.assert_array_equal(fsim.run(program).dram, want)
    np.testing.assert_array_equal(fsim.run(program, schedule_seed=3).dram, want)


@pytest.mark.parametrize("wait", [True, False])
def test_a_push_waits_for_the_engines_pushes_to_the_same_queue(wait: bool) -> None:
    """ALU (bank 0, pushes compute->load), GEMM on bank 1, GEMM on bank 0: the second GEMM is ordered after the ALU
    only when the first pushes to compute->load too (the front end waits for the engine's push to that queue)."""
    bld, _ = _prologue(ON)
    alu = bld.alu(ALU_ADD, uop_bgn=0, uop_end=1)
    bld.dep_push("compute", "load")
    bld.dep_push("compute", "store")
    bld.dep_pop("compute", "store")
    bld.dep_pop("compute", "load")
    bld.gemm(uop_bgn=1, uop_end=2)
    if wait:
        bld.dep_push("compute", "load")
        bld.dep_pop("compute", "load")
    later = bld.gemm(uop_bgn=0, uop_end=1)
    program = finish_with_store(bld, ON, n=ON.out_depth)
    if wait:
        fsim.run(program)
    else:
        with pytest.raises(RaceError, match=_bank_race(later, "GEMM", alu)):
            fsim.run(program)


def test_alu_out_writes_reach_the_store_through_the_engines_pushes() -> None:
    """The ALU's out entry 0 is stored; only the GEMM after it (bank 1) pushes to the store: with the knob, that
    token does not cover the ALU still running in the engine."""
    program, alu, _ = alu_then(ON, 1, alu_pushes=False)
    store = next(k for k, insn in enumerate(program.insns) if type(insn).__name__ == "Store" and insn.x_size)
    fsim.run(alu_then(SMALL_CFG, 1, alu_pushes=False)[0])
    with pytest.raises(RaceError, match=rf"^race: instruction {store} \(STORE OUT\) reads out entry 0, which "
                       rf"instruction {alu} \(ALU ADD\) writes, and no dependency token orders the two; the compute "
                       rf"module's ALU engine must push a token after that instruction which the store module pops "
                       rf"before this one$"):
        fsim.run(program)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_random_programs_race_or_compute_the_same(cfg: VTAConfig) -> None:
    """vta.testing's random programs with ``overlap_alu`` order their hazards for the knob-off design only: with the
    knob each one either passes, with the knob-off DRAM on any schedule, or stops at a bank race or an ALU out entry
    the store reads unordered (some of each over these seeds). Without ``overlap_alu`` they drain the engine after
    every ALU instruction and always pass."""
    on = cfg.replace(concurrent_alu=True)
    kinds = set()
    for seed in range(12):
        program = random_program(on, np.random.default_rng(seed), overlap_alu=True)
        off = random_program(cfg, np.random.default_rng(seed))
        want = fsim.run(off).dram
        drained = random_program(on, np.random.default_rng(seed))  # more instructions: compare the stored output
        np.testing.assert_array_equal(drained.read("out", fsim.run(drained).dram), off.read("out", want))
        try:
            got = fsim.run(program).dram
        except RaceError as err:
            assert err.insn_index is not None
            kinds.add("bank" if "acc/out bank" in str(err) else "store" if "ALU engine must push" in str(err)
                      else str(err))
            continue
        kinds.add("pass")
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(fsim.run(program, schedule_seed=seed).dram, want)
    assert kinds <= {"bank", "store", "pass"} and {"bank", "pass"} <= kinds


# ---- the compiler's programs -------------------------------------------------------------------------------------
SMALL_BUFFERS = VTAConfig(log_batch=1, log_block=2, log_uop_buff_size=9, log_inp_buff_size=9, log_wgt_buff_size=10,
                          log_acc_buff_size=12)


def _conv_program(cfg: VTAConfig) -> Program:
    rng = np.random.default_rng(11)
    intr = intrinsics(cfg)
    o = c = 4 * intr.block_out
    layer = ConvLayer.make((cfg.batch, c, 9, 9), rng.integers(-128, 128, (o, c, 3, 3)), rng.integers(-5000, 5000, o),
                           rng.integers(1, 32767, o), rng.integers(10, 24, o), 0, 127, pads=(1, 1, 1, 1), intr=intr)
    x = rng.integers(-128, 128, (1, c // intr.block_in, 9, 9, cfg.batch, intr.block_in)).astype(np.int8)
    return build_conv_program(cfg, layer, x)[0]


def _add_program(cfg: VTAConfig) -> Program:
    rng = np.random.default_rng(12)
    bo = intrinsics(cfg).block_out
    shape = (1, 32 // bo, 9, 9, cfg.batch, bo)
    a, b = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
    return build_add_program(cfg, AddLayer((cfg.batch, 32, 9, 9), 3, 7, 3, 0, 127), a, b)[0]


@pytest.mark.parametrize("base", [VTAConfig(), SMALL_BUFFERS, SMALL_BUFFERS.replace(fused_requant=True)],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("build", [_conv_program, _add_program], ids=["conv", "add"])
def test_compiler_programs_obey_the_rule(base: VTAConfig, build) -> None:
    on = base.replace(concurrent_alu=True)
    off_program, on_program = build(base), build(on)
    # the same program but for the constants: without the knob a tile may read those another part loaded (one
    # LOAD ACC of them fewer), with it only its own part's
    def kinds(p):
        return [type(i).__name__ for i in p.insns if not (isinstance(i, Load) and i.mem == MEM_ACC)]
    assert kinds(on_program) == kinds(off_program)
    if build is _add_program:
        assert on_program.insns == off_program.insns
    want = off_program.read(OUTPUT, fsim.run(off_program).dram)
    got = fsim.run(on_program, check_races=True)
    np.testing.assert_array_equal(on_program.read(OUTPUT, got.dram), want)
    np.testing.assert_array_equal(fsim.run(on_program, schedule_seed=1).dram, got.dram)
