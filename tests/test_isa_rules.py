"""The per-instruction counting rules of :mod:`vta.isa` (micro-ops, MACs, tokens) and their sums in
:mod:`vta.counts`: exact values, and the functional simulator's statistics equal to them on random programs."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL_CFG

from vta import fsim
from vta.config import MEM_ACC, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.counters import TOKEN_COUNTERS
from vta.counts import COUNTED, program_counts, token_counts
from vta.isa import (
    Alu,
    Finish,
    Gemm,
    Load,
    Store,
    gemm_multiplies,
    insn_macs,
    insn_pops,
    insn_pushes,
    insn_uops,
)
from vta.testing import random_program

OVERWRITE = SMALL_CFG.replace(gemm_overwrite=True)


def test_micro_ops_are_the_loop_extents_times_the_range() -> None:
    assert insn_uops(Gemm(uop_bgn=2, uop_end=5, iter_out=3, iter_in=4)) == 36
    assert insn_uops(Alu(alu_opcode=0, uop_bgn=1, uop_end=3, iter_out=5)) == 10
    assert insn_uops(Gemm(uop_bgn=5, uop_end=5, iter_out=3)) == 0
    assert insn_uops(Gemm(uop_bgn=5, uop_end=2, iter_out=3)) == 0  # a negative range issues nothing
    assert insn_uops(Gemm(uop_end=4, iter_in=0)) == 0
    assert [insn_uops(i) for i in (Load(mem=MEM_INP, x_size=3), Store(mem=MEM_OUT, x_size=2), Finish())] == [0, 0, 0]


def test_a_reset_gemm_counts_macs_only_with_gemm_overwrite() -> None:
    gemm, reset = Gemm(uop_end=3, iter_out=2), Gemm(uop_end=3, iter_out=2, reset=True)
    per_uop = SMALL_CFG.macs_per_cycle
    assert per_uop == 2 * 4 * 4
    assert (insn_macs(gemm, SMALL_CFG), insn_macs(reset, SMALL_CFG)) == (6 * per_uop, 0)
    assert (insn_macs(gemm, OVERWRITE), insn_macs(reset, OVERWRITE)) == (6 * per_uop, 6 * per_uop)
    assert (gemm_multiplies(reset, SMALL_CFG), gemm_multiplies(reset, OVERWRITE)) == (False, True)
    assert insn_macs(Alu(alu_opcode=2, uop_end=3, iter_out=2), OVERWRITE) == 0
    assert insn_macs(Load(mem=MEM_WGT, x_size=4), SMALL_CFG) == 0


def test_tokens_follow_the_module_and_its_flags() -> None:
    every = dict(pop_prev=True, pop_next=True, push_prev=True, push_next=True)
    assert (insn_pops(Load(mem=MEM_INP, **every)), insn_pushes(Load(mem=MEM_INP, **every))) == (
        ("compute_to_load",), ("load_to_compute",))
    assert (insn_pops(Load(mem=MEM_UOP, **every)), insn_pushes(Load(mem=MEM_ACC, **every))) == (
        ("load_to_compute", "store_to_compute"), ("compute_to_load", "compute_to_store"))
    assert (insn_pops(Store(mem=MEM_OUT, **every)), insn_pushes(Store(mem=MEM_OUT, **every))) == (
        ("compute_to_store",), ("store_to_compute",))
    assert (insn_pops(Gemm(pop_next=True)), insn_pushes(Finish(push_prev=True))) == (("store_to_compute",),
                                                                                     ("compute_to_load",))
    assert insn_pops(Load(mem=MEM_WGT, pop_prev=True)) == ()  # a flag its module does not pop from pops nothing
    assert insn_pushes(Alu(alu_opcode=0)) == ()


def test_token_counts_sum_the_rules() -> None:
    insns = [Load(mem=MEM_INP, x_size=1, push_next=True), Load(mem=MEM_INP, x_size=1, push_next=True),
             Gemm(pop_prev=True, push_next=True), Gemm(pop_prev=True), Store(mem=MEM_OUT, pop_prev=True), Finish()]
    counts = token_counts(insns)
    assert tuple(counts) == TOKEN_COUNTERS
    assert {k: v for k, v in counts.items() if v} == {"load_to_compute_pushes": 2, "load_to_compute_pops": 2,
                                                      "compute_to_store_pushes": 1, "compute_to_store_pops": 1}


@pytest.mark.parametrize("cfg", [VTAConfig(), SMALL_CFG, OVERWRITE], ids=lambda c: c.name)
def test_fsim_statistics_equal_the_summed_rules(cfg: VTAConfig) -> None:
    checked = 0
    for seed in range(12):
        program = random_program(cfg, np.random.default_rng(seed), n_ops=30)
        try:
            stats = fsim.run(program).stats.as_dict()
        except fsim.SimulationError:
            continue
        assert {k: stats[k] for k in COUNTED} == program_counts(program), f"seed {seed}"
        assert {k: stats[k] for k in TOKEN_COUNTERS} == token_counts(program.insns), f"seed {seed}"
        checked += 1
    assert checked >= 8
