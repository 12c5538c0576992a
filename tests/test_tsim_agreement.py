"""The RTL (Verilator co-simulation of vta.hw) agrees with the functional simulator, the spec, bit for bit.

Every program must give the same final DRAM image on both, and the hardware counters for micro-ops, bytes moved and
instructions must equal the functional simulator's statistics. Programs: the workload generators, every program the
functional simulator's own tests run (recorded by tests/tsim_fsim_recorder.py), and random programs from
``vta.testing.random_program`` (random strides, padding, micro-op loops, ALU ops and token patterns), at the default
config and four others. One Verilator build per config is shared by the whole session (and cached across runs).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL_CFG
from helpers import raw_program_at_byte_0
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vta import fsim
from vta.cli import main
from vta.config import MEM_INP, VTAConfig
from vta.gemm import gemm_program
from vta.isa import Finish, Gemm, Load
from vta.program import Program
from vta.testing import alu_program, random_program
from vta.tsim.backend import STAT_COUNTERS, TSimBackend
from vta.tsim.bridge import TsimError, TsimMemoryError, TsimWatchdogError
from vta.tsim.compare import compare_dram, locate

DEFAULT = VTAConfig()
# The functional simulator's random-test configs (BLOCK 8 with tiny token queues; BATCH 4 x BLOCK 4 with tiny command
# queues) and the default design on a wider, slower bus.
BLOCK8_CFG = VTAConfig(log_block=3, log_uop_buff_size=8, log_inp_buff_size=8, log_wgt_buff_size=11,
                       log_acc_buff_size=10, token_queue_depth=2)
BATCH4_CFG = VTAConfig(log_batch=2, log_block=2, log_uop_buff_size=6, log_inp_buff_size=7, log_wgt_buff_size=8,
                       log_acc_buff_size=8, cmd_queue_depth=3)
WIDE_BUS_CFG = VTAConfig(bus_bytes=16, dram_latency=40)
CHECKED = STAT_COUNTERS + ("fetch_insns", "load_insns", "compute_insns", "store_insns")
HYPOTHESIS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@pytest.fixture(scope="session")
def tsim() -> TSimBackend:
    """One backend for the session: each config's model is built (or loaded from the cache) once. It runs the RTL
    alone (``check="none"``): :func:`check_agreement` compares with fsim itself (tests/test_tsim_checks.py tests
    the backend's own check)."""
    return TSimBackend(check="none", progress=False)


def check_agreement(tsim: TSimBackend, program: Program, what: str = "") -> int:
    """Run ``program`` on both simulators; fail naming the first differing DRAM byte or counter. Returns cycles."""
    expected = fsim.run(program)
    label = f"{what} at config {program.cfg.name}"
    try:
        actual = tsim.run(program)
    except TsimError as err:
        pytest.fail(f"{label}: the functional simulator finished it, the RTL stopped: {err}")
    mismatch = compare_dram(expected.dram, actual.dram)
    if mismatch is not None:
        pytest.fail(f"{label}: {mismatch}; {locate(mismatch.address, program.allocations)}")
    stats = expected.stats.as_dict()
    wrong = {name: (stats[name], actual.counters[name]) for name in CHECKED if stats[name] != actual.counters[name]}
    if wrong:
        pytest.fail(f"{label}: counters differ from the functional simulator's statistics (fsim, tsim): {wrong}")
    if actual.stats != stats:
        keys = sorted(stats.keys() | actual.stats.keys())
        differ = {k: (stats.get(k), actual.stats.get(k)) for k in keys if stats.get(k) != actual.stats.get(k)}
        pytest.fail(f"{label}: the tsim backend's stats differ from fsim's (fsim, tsim): {differ}")
    assert actual.cycles is not None and actual.cycles > 0
    return actual.cycles


# ---- workloads ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("m, k, n", [(1, 16, 16), (16, 64, 48), (5, 40, 33)])
def test_gemm_workloads(tsim: TSimBackend, m: int, k: int, n: int) -> None:
    program, expected_c = gemm_program(DEFAULT, m, k, n, seed=m + k + n)
    check_agreement(tsim, program, f"gemm {m}x{k}x{n}")
    np.testing.assert_array_equal(tsim.run(program).read(program, "C"), expected_c)
    _, out = tsim.run_raw(program)
    assert out.cycles == out.counters["cycles"], "the harness and the core's cycle counter agree"
    assert out.counters["gemm_uops"] <= out.cycles


@pytest.mark.parametrize("cfg", [DEFAULT, SMALL_CFG], ids=lambda c: c.name)
def test_alu_workload(tsim: TSimBackend, cfg: VTAConfig) -> None:
    program, expected = alu_program(cfg, seed=3)
    check_agreement(tsim, program, "alu_program")
    np.testing.assert_array_equal(tsim.run(program).read(program, "out"), expected)


def test_single_buffered_gemm_on_the_small_config(tsim: TSimBackend) -> None:
    program, _ = gemm_program(SMALL_CFG, 6, 20, 10, double_buffer=False)
    check_agreement(tsim, program, "single-buffered gemm")


# ---- the functional simulator's own test programs --------------------------------------------------------------------
@pytest.fixture(scope="session")
def fsim_suite_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    """Every program tests/test_fsim*.py run to completion, saved as .npz files, grouped by config name."""
    folder = tmp_path_factory.mktemp("fsim-programs")
    tests = Path(__file__).parent
    env = dict(os.environ, VTA_TSIM_RECORD_DIR=str(folder),
               PYTHONPATH=os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tsim_fsim_recorder",
                          *sorted(str(path) for path in tests.glob("test_fsim*.py"))], env=env, capture_output=True,
                         text=True, cwd=tests.parent)
    paths = sorted(folder.glob("*.npz"))
    if not paths:
        pytest.fail(f"recording the functional simulator's test programs produced none:\n{out.stdout[-3000:]}")
    groups: dict[str, list[Path]] = {}
    for path in paths:
        groups.setdefault(Program.load(path).cfg.name, []).append(path)
    return groups


@pytest.mark.parametrize("which", [pytest.param("default and small"), pytest.param("others", marks=pytest.mark.slow)])
def test_every_fsim_test_program(tsim: TSimBackend, fsim_suite_programs: dict[str, list[Path]], which: str) -> None:
    quick = {DEFAULT.name, SMALL_CFG.name}
    names = [n for n in fsim_suite_programs if (n in quick) == (which == "default and small")]
    checked = 0
    for name in names:
        for path in fsim_suite_programs[name]:
            program = Program.load(path)
            try:  # programs the tests ran with checks off (e.g. deliberate races) have no timing-free result
                fsim.run(program)
            except fsim.SimulationError:
                continue
            check_agreement(tsim, program, f"fsim test program {path.name}")
            checked += 1
    if which == "default and small":
        assert checked >= 20, f"only {checked} recorded programs at {sorted(quick)}; the recorder is broken"


# ---- random programs ------------------------------------------------------------------------------------------------
@settings(HYPOTHESIS, max_examples=200)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(1, 40), alu_hazards=st.booleans())
def test_random_programs_default_config(tsim: TSimBackend, seed: int, n_ops: int, alu_hazards: bool) -> None:
    program = random_program(DEFAULT, np.random.default_rng(seed), n_ops=n_ops, alu_hazards=alu_hazards)
    check_agreement(tsim, program, f"random program seed={seed} n_ops={n_ops}")


@settings(HYPOTHESIS, max_examples=100)
@given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(1, 40))
def test_random_programs_small_config(tsim: TSimBackend, seed: int, n_ops: int) -> None:
    program = random_program(SMALL_CFG, np.random.default_rng(seed), n_ops=n_ops)
    check_agreement(tsim, program, f"random program seed={seed} n_ops={n_ops}")


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [BLOCK8_CFG, BATCH4_CFG, WIDE_BUS_CFG], ids=lambda c: c.name)
def test_random_programs_other_configs(tsim: TSimBackend, cfg: VTAConfig) -> None:
    @settings(HYPOTHESIS, max_examples=100)
    @given(seed=st.integers(0, 2**32 - 1), n_ops=st.integers(1, 60), max_index=st.sampled_from([8, 32, 64]))
    def check(seed: int, n_ops: int, max_index: int) -> None:
        program = random_program(cfg, np.random.default_rng(seed), n_ops=n_ops, max_index=max_index)
        check_agreement(tsim, program, f"random program seed={seed} n_ops={n_ops} max_index={max_index}")

    check()


# ---- clock scheduling -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [DEFAULT, SMALL_CFG], ids=lambda c: c.name)
def test_one_evaluation_per_cycle_matches_two_phase_exactly(tsim: TSimBackend, cfg: VTAConfig) -> None:
    """The harness evaluates the model once per cycle, deciding handshakes from the outputs of the previous edge;
    that is exact only while the core's memory-port outputs do not depend combinationally on its inputs. Check it
    against the two-phase reference (clock low, outputs read, clock high) cycle count, counters, memory traffic and
    DRAM, on random programs and a GEMM."""
    model = tsim.model(cfg)
    assert model.one_eval, "this Verilator's clock-edge detector was not found: every run is two-phase (slower)"
    if os.environ.get("VTA_TSIM_PGO", "1") != "0":  # the default build is profile-guided; results must not change
        assert "-pgo-" in model.build.key
    rng = np.random.default_rng(11)
    programs = [random_program(cfg, rng, n_ops=int(rng.integers(1, 40))) for _ in range(30)]
    programs.append(gemm_program(cfg, 16, 64, 48, seed=3)[0])
    for i, program in enumerate(programs):
        runs = [model.run_program(program, two_phase=two) for two in (False, True)]
        (fast_dram, fast), (ref_dram, ref) = runs
        assert fast == ref, f"program {i}: one evaluation per cycle gave {fast}, two-phase {ref}"
        assert np.array_equal(fast_dram, ref_dram), f"program {i}: DRAM differs between the schedulings"


def test_a_mismatch_names_the_first_differing_address(tsim: TSimBackend) -> None:
    program = random_program(DEFAULT, np.random.default_rng(7), n_ops=10)
    expected = fsim.run(program).dram
    actual = tsim.run(program).dram.copy()
    out = program.allocations["out"]
    actual[out.offset + 3] ^= 0x5A
    mismatch = compare_dram(expected, actual)
    assert mismatch is not None
    assert (mismatch.address, mismatch.expected, mismatch.actual) == (out.offset + 3, int(expected[out.offset + 3]),
                                                                      int(expected[out.offset + 3]) ^ 0x5A)
    assert locate(mismatch.address, program.allocations) == "allocation 'out' + 3"


# ---- failures on the real core ---------------------------------------------------------------------------------------
def test_a_deadlock_stops_at_the_watchdog_with_each_modules_state(tsim: TSimBackend) -> None:
    program = raw_program_at_byte_0(DEFAULT, [Gemm(pop_prev=True), Finish()])
    with pytest.raises(fsim.DeadlockError):
        fsim.run(program)
    with pytest.raises(TsimWatchdogError, match=r"no module made progress for 2000 cycles") as info:
        tsim.run(program, watchdog_cycles=2000)
    states = {m.module: m for m in info.value.modules}
    assert states["compute"].state == "wait_token"
    assert states["compute"].last_insn is not None and states["compute"].last_insn.startswith("instruction 0 (GEMM")
    assert states["load"].state == "idle" and states["store"].state == "idle"


def test_a_load_outside_the_image_names_the_address(tsim: TSimBackend) -> None:
    dram_base = 4096 // DEFAULT.inp_elem_bytes  # the first inp element past the 4096-byte image
    program = raw_program_at_byte_0(DEFAULT, [Load(mem=MEM_INP, dram_base=dram_base, x_size=2), Finish()])
    with pytest.raises(fsim.DramRangeError):
        fsim.run(program)
    with pytest.raises(TsimMemoryError, match=r"a read of \d+ bytes at byte address 0x1000 .*outside the 4096-byte "
                                              r"DRAM image") as info:
        tsim.run(program)
    assert (info.value.address, info.value.write) == (0x1000, False)


def test_the_cli_runs_and_checks_a_saved_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program, _ = gemm_program(DEFAULT, 4, 32, 32, seed=5)
    path = tmp_path / "gemm.npz"
    program.save(path)
    assert main(["tsim", "run", str(path), "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"] == {"dram": "equal", "counters_differing": {}}
    assert report["cycles"] > 0
    assert report["counters"]["gemm_uops"] == fsim.run(program).stats.gemm_uops
