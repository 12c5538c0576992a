"""Tests for vta.cost: exact predictions on tiny programs whose cycles were measured on tsim (default config,
2026-11-24, RTL at commit 508269d) and pinned here; one slow test compares the model with tsim on random programs."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_UOP, MEM_WGT, VTAConfig
from vta.cost import CostModelError, Estimate, estimate, estimate_insns, load_data_cycles
from vta.gemm import gemm_program
from vta.isa import ALU_ADD, Finish, Gemm, Load, Uop
from vta.program import Program, ProgramBuilder

CFG = VTAConfig()


def _load(mem: int, y: int, x: int, pads: tuple[int, int, int, int] = (0, 0, 0, 0)) -> Callable[[ProgramBuilder], None]:
    def build(b: ProgramBuilder) -> None:
        a = b.alloc("a", 1 << 16)
        b.load(mem, sram_base=0, dram_base=b.elem_addr(a, mem), y_size=y, x_size=x, y_pad_0=pads[0],
               y_pad_1=pads[1], x_pad_0=pads[2], x_pad_1=pads[3])
    return build


def _loop(k: int, n: int = 1, alu: bool = False) -> Callable[[ProgramBuilder], None]:
    def build(b: ProgramBuilder) -> None:
        b.load_uops(b.uop_kernel("u", [Uop(0, 0, 0)]))
        for _ in range(n):
            if alu:
                b.alu(ALU_ADD, uop_bgn=0, uop_end=1, iter_in=k, use_imm=True, imm=1)
            else:
                b.gemm(uop_bgn=0, uop_end=1, iter_in=k)
    return build


def _store(y: int, x: int) -> Callable[[ProgramBuilder], None]:
    def build(b: ProgramBuilder) -> None:
        a = b.alloc("o", 1 << 14)
        b.store(sram_base=0, dram_base=b.elem_addr(a, 4), y_size=y, x_size=x)
    return build


# (name, builder, cycles measured on tsim); the builder's program ends with ProgramBuilder.finish()
MEASURED: list[tuple[str, Callable[[ProgramBuilder], None], int]] = [
    ("finish", lambda b: None, 28),
    ("inp 1x1", _load(MEM_INP, 1, 1), 50), ("inp 1x4", _load(MEM_INP, 1, 4), 56), ("inp 4x1", _load(MEM_INP, 4, 1), 56),
    ("inp 8x8", _load(MEM_INP, 8, 8), 176), ("inp 1x16", _load(MEM_INP, 1, 16), 80),
    ("inp 2x2 y_pad_0", _load(MEM_INP, 2, 2, (1, 0, 0, 0)), 56),
    ("wgt 1x1", _load(MEM_WGT, 1, 1), 80), ("wgt 2x1", _load(MEM_WGT, 2, 1), 112),
    ("wgt 4x4", _load(MEM_WGT, 4, 4), 560),
    ("uop 1x1", _load(MEM_UOP, 1, 1), 51), ("uop 1x64", _load(MEM_UOP, 1, 64), 114),
    ("acc 1x4", _load(MEM_ACC, 1, 4), 82), ("acc 4x1", _load(MEM_ACC, 4, 1), 82),
    ("acc8 1x4", _load(MEM_ACC_8BIT, 1, 4), 58),
    ("gemm 1", _loop(1), 59), ("gemm 64", _loop(64), 122), ("alu 8", _loop(8, alu=True), 66),
    ("gemm 8 x4", _loop(8, 4), 111), ("gemm 1 x16", _loop(1, 16), 179),
    ("store 1x1", _store(1, 1), 31), ("store 4x4", _store(4, 4), 61),
]
"""Programs predicted exactly (the model's constants reproduce each of these tsim measurements)."""

MEASURED_APPROX: list[tuple[str, Callable[[ProgramBuilder], None], int]] = [
    ("inp 16x1", _load(MEM_INP, 16, 1), 84),  # the arbiter's 8 outstanding requests: a closed-form approximation
    ("inp 2x2 pads", _load(MEM_INP, 2, 2, (2, 2, 2, 2)), 74),
]


def _program(build: Callable[[ProgramBuilder], None]) -> Program:
    b = ProgramBuilder(CFG)
    build(b)
    return b.finish()


@pytest.mark.parametrize("name,build,cycles", MEASURED, ids=[m[0] for m in MEASURED])
def test_exact_on_measured_programs(name: str, build: Callable[[ProgramBuilder], None], cycles: int) -> None:
    assert estimate(_program(build)).cycles == cycles


@pytest.mark.parametrize("name,build,cycles", MEASURED_APPROX, ids=[m[0] for m in MEASURED_APPROX])
def test_close_on_tag_limited_and_padded_loads(name: str, build: Callable[[ProgramBuilder], None],
                                               cycles: int) -> None:
    assert abs(estimate(_program(build)).cycles - cycles) <= 0.06 * cycles


def test_gemm_programs_within_one_percent() -> None:
    # measured on tsim: 64x64x64 3,464 cycles, 128x128x128 17,560
    for (m, k, n), cycles in (((64, 64, 64), 3464), ((128, 128, 128), 17560)):
        est = estimate(gemm_program(CFG, m, k, n)[0])
        assert abs(est.cycles - cycles) <= 0.01 * cycles
        assert est.bound in ("load", "compute")


def test_module_busy_and_bound() -> None:
    est = estimate(_program(_loop(64)))
    assert isinstance(est, Estimate)
    assert est.work["compute"] == (5 + 19) + (64 + 6) + 2  # uop LOAD, GEMM, FINISH (TOKENS..PUSH each)
    assert est.bound == "compute"
    assert 0 < est.utilization("compute") <= 1
    assert estimate(_program(_load(MEM_WGT, 4, 4))).bound == "load"


def test_load_data_cycles() -> None:  # (the micro-op rule, vta.isa.insn_uops, is tested in tests/test_isa_rules.py)
    assert load_data_cycles(Load(mem=MEM_WGT, y_size=2, x_size=3, x_stride=3), CFG) == (2 * 3 * 32, 2 * 3 * 32)
    assert load_data_cycles(Load(mem=MEM_INP, y_size=1, x_size=2, x_stride=2, x_pad_1=3), CFG) == (4 + 3, 4)


def test_deadlock_is_an_error() -> None:
    insns = [Gemm(pop_prev=True), Finish()]
    with pytest.raises(CostModelError, match="instruction 0 \\(Gemm\\) of the compute module waits for a token"):
        estimate_insns(CFG, insns)


def test_rejects_what_is_not_a_program() -> None:
    with pytest.raises(TypeError, match="estimate takes a vta.program.Program, not list"):
        estimate([])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cfg must be a VTAConfig, not dict"):
        estimate_insns({}, [Finish()])  # type: ignore[arg-type]


@pytest.mark.slow
def test_matches_tsim_on_random_programs() -> None:
    from vta.backend import get_backend
    from vta.testing import random_program
    backend = get_backend("tsim")
    for seed in range(12):
        program = random_program(CFG, np.random.default_rng(seed))
        cycles = backend.run(program).cycles
        assert abs(estimate(program).cycles - cycles) <= 0.06 * cycles, f"seed {seed}"
    for name, build, cycles in MEASURED:  # the pinned measurements still hold on the current RTL
        assert backend.run(_program(build)).cycles == cycles, name
