"""tsim checks what fsim checks, by default: validation on the functional simulator before the RTL runs, the result
compared with fsim's after, a cycle budget derived from the program, a watchdog that names what is stuck, memory
errors that name the instruction, Ctrl-C between slices of the clock loop, and agreement with fsim on random and
mutated programs (the same result, or the same error at the same instruction)."""
from __future__ import annotations

import dataclasses
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SMALL_CFG

from vta import fsim
from vta.cli import main
from vta.config import MEM_INP, MEM_OUT, MEM_WGT, VTAConfig, load_config
from vta.cost import estimate, estimate_insns
from vta.gemm import gemm_program
from vta.isa import Alu, Finish, Gemm, Load, Store, encode_stream
from vta.program import Program
from vta.testing import random_program
from vta.tsim.backend import TSimBackend, cycle_budget
from vta.tsim.bridge import TsimBudgetError, TsimMemoryError, TsimMismatchError, TsimWatchdogError

DEFAULT = VTAConfig()
SMALL1X8 = load_config(Path(__file__).parent.parent / "configs" / "small1x8.toml")


@pytest.fixture(scope="module")
def tsim() -> TSimBackend:
    """The backend with its defaults (check="fsim"); each config's model is built or loaded once."""
    return TSimBackend(progress=False)


def raw_program(cfg: VTAConfig, insns: list, dram_bytes: int = 4096) -> Program:
    """The instructions encoded at byte 0 of a zeroed DRAM image, with no token bookkeeping."""
    dram = np.zeros(dram_bytes, np.uint8)
    stream = encode_stream(insns, cfg).reshape(-1)
    dram[:stream.size] = stream
    return Program(cfg, list(insns), dram, 0, {})


def with_insn(program: Program, k: int, insn: Any) -> Program:
    """``program`` with instruction ``k`` replaced (the encoded stream in its DRAM image too)."""
    insns = list(program.insns)
    insns[k] = insn
    dram = program.dram.copy()
    stream = encode_stream(insns, program.cfg).reshape(-1)
    dram[program.insn_offset:program.insn_offset + stream.size] = stream
    return Program(program.cfg, insns, dram, program.insn_offset, dict(program.allocations))


class Spy:
    """Counts the RTL runs of a backend (calls of ``run_raw``)."""

    def __init__(self, backend: TSimBackend, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = backend.run_raw

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(backend, "run_raw", counted)


# ---- validation before the RTL runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("insns, error, index", [
    ([Load(mem=7, x_size=1), Finish()], fsim.InvalidInstructionError, 0),
    ([Gemm(), Alu(alu_opcode=7), Finish()], fsim.InvalidInstructionError, 1),
    ([Load(mem=MEM_INP, sram_base=2047, x_size=2), Finish()], fsim.SramRangeError, 0),
    ([Gemm(uop_bgn=8190, uop_end=8200), Finish()], fsim.SramRangeError, 0),
    ([Load(mem=MEM_INP, dram_base=4096 // 16, x_size=2), Finish()], fsim.DramRangeError, 0),
    ([Gemm(pop_prev=True), Finish()], fsim.DeadlockError, 0),
], ids=["memory type 7", "ALU opcode 7", "SRAM load past the buffer", "micro-ops past the buffer",
        "DRAM load past the image", "deadlock"])
def test_an_invalid_program_raises_fsims_error_before_any_build(insns: list, error: type, index: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    program = raw_program(DEFAULT, insns)
    with pytest.raises(error) as expected:
        fsim.run(program)
    backend = TSimBackend(progress=False)

    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the RTL model was built or run for a program fsim rejects")

    monkeypatch.setattr(backend, "model", no_build)
    with pytest.raises(error) as raised:
        backend.run(program)
    assert type(raised.value) is type(expected.value)
    assert raised.value.insn_index == expected.value.insn_index == index
    assert str(raised.value) == str(expected.value)


def test_a_wrong_dram_result_raises_a_mismatch_naming_the_allocation(tsim: TSimBackend,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    program, _ = gemm_program(DEFAULT, 4, 32, 32, seed=5)
    good = tsim.run(program)
    np.testing.assert_array_equal(good.dram, fsim.run(program).dram)
    out = program.allocations["C"]
    real = tsim.run_raw

    def corrupted(*args: Any, **kwargs: Any) -> Any:
        dram, run = real(*args, **kwargs)
        dram[out.offset + 3] ^= 0x5A
        return dram, run

    monkeypatch.setattr(tsim, "run_raw", corrupted)
    value = int(good.dram[out.offset + 3])
    with pytest.raises(TsimMismatchError, match=rf"with a result that differs from the functional simulator's \(the "
                                                rf"spec\): DRAM differs at byte address {out.offset + 3:#x}: expected "
                                                rf"{value:#04x}, got {value ^ 0x5A:#04x} \(1 differing byte in all\), "
                                                rf"in allocation 'C' \+ 3$") as info:
        tsim.run(program)
    assert info.value.where == "allocation 'C' + 3" and info.value.stats_differing == {}
    assert tsim.run(program, check="none").dram[out.offset + 3] == value ^ 0x5A, "check='none' compares nothing"


def test_a_wrong_counter_raises_a_mismatch_naming_the_statistic(tsim: TSimBackend,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    program, _ = gemm_program(DEFAULT, 4, 32, 32, seed=5)
    real = tsim.run_raw
    uops = fsim.run(program).stats.gemm_uops

    def miscounted(*args: Any, **kwargs: Any) -> Any:
        dram, run = real(*args, **kwargs)
        run.counters["gemm_uops"] += 1
        return dram, run

    monkeypatch.setattr(tsim, "run_raw", miscounted)
    with pytest.raises(TsimMismatchError, match=rf": statistics differ \(fsim, tsim\): gemm_uops {uops:,} vs "
                                                rf"{uops + 1:,}, macs ") as info:
        tsim.run(program)
    assert info.value.mismatch is None and info.value.stats_differing["gemm_uops"] == (uops, uops + 1)


# ---- the cycle budget ------------------------------------------------------------------------------------------------
def test_the_derived_budget_is_8x_the_predicted_cycles_plus_slack() -> None:
    program = raw_program(DEFAULT, [Load(mem=MEM_INP, y_size=2, x_size=3, x_pad_0=1), Gemm(uop_end=5, iter_out=2),
                                    Store(mem=MEM_OUT, y_size=1, x_size=4), Finish()])
    budget = cycle_budget(program, watchdog_cycles=1000)
    assert (budget.predicted, budget.as_written) == (estimate(program).cycles, True) == (62, True)
    drain = 4 * DEFAULT.dram_latency + 256
    assert budget.cycles == 8 * 62 + 1000 + drain + 10_000
    assert str(budget) == (f"8 x 62 cycles predicted by the cycle model + 1,000 watchdog + {drain} drain + 10,000 "
                           f"slack = {budget.cycles:,} cycles")
    slower = cycle_budget(program, watchdog_cycles=1000, latency=100)
    assert slower.predicted == estimate_insns(DEFAULT.replace(dram_latency=100), program.insns).cycles > 62
    assert slower.drain == 4 * 100 + 256


def test_a_program_the_model_cannot_schedule_is_budgeted_without_its_tokens() -> None:
    # a pop no push satisfies (the model's CostModelError) and a LOAD of memory type 7 (no buffer has one)
    program = raw_program(DEFAULT, [Gemm(pop_prev=True, uop_end=3), Load(mem=7, y_size=2, x_size=3), Finish()])
    budget = cycle_budget(program, watchdog_cycles=1000)
    widest = estimate_insns(DEFAULT, [Gemm(uop_end=3), Load(mem=MEM_WGT, y_size=2, x_size=3), Finish()]).cycles
    assert (budget.predicted, budget.as_written) == (widest, False)
    assert budget.cycles == 8 * widest + 1000 + 4 * DEFAULT.dram_latency + 256 + 10_000
    assert str(budget).startswith(f"8 x {widest:,} cycles predicted by the cycle model for the program with its "
                                  "tokens ignored and unknown memory types taken as the largest element (the model "
                                  "cannot schedule it as written) + 1,000 watchdog + ")


@pytest.mark.parametrize("cfg", [DEFAULT, SMALL_CFG], ids=lambda c: c.name)
def test_real_programs_stay_well_inside_the_budget(tsim: TSimBackend, cfg: VTAConfig) -> None:
    rng = np.random.default_rng(5)
    programs = [random_program(cfg, rng, n_ops=int(rng.integers(5, 40))) for _ in range(8)]
    programs.append(gemm_program(cfg, 16, 64, 48, seed=3)[0])
    for program in programs:
        budget = cycle_budget(program)
        cycles = tsim.run(program).cycles
        # the prediction is close, so the budget (8x it) is at least 7x the run
        assert cycles is not None and cycles <= 1.1 * budget.predicted, f"{cycles} cycles, {budget.predicted} predicted"


def test_a_micro_op_range_past_the_buffer_stops_at_the_derived_budget(tsim: TSimBackend) -> None:
    program = raw_program(DEFAULT, [Gemm(uop_bgn=8190, uop_end=8200), Finish()])
    budget = cycle_budget(program)
    with pytest.raises(TsimBudgetError, match=rf"used its whole budget of {budget.cycles} cycles without reaching "
                                              rf"FINISH \(2 instructions fetched, 0 computed\) \(the default budget "
                                              rf"derived from the program: {re.escape(str(budget))}\); raise "
                                              "max_cycles if the program is simply long"):
        tsim.run(program, check="none")
    with pytest.raises(TsimBudgetError, match=r"used its whole budget of 5000 cycles .* \(max_cycles=5,000\); "):
        tsim.run(program, check="none", max_cycles=5000)


# ---- the watchdog ----------------------------------------------------------------------------------------------------
def test_the_watchdog_names_the_stuck_module_its_instruction_and_the_token_queues(tsim: TSimBackend) -> None:
    program = raw_program(DEFAULT, [Gemm(pop_prev=True), Finish()])
    with pytest.raises(TsimWatchdogError) as info:
        tsim.run(program, check="none", watchdog_cycles=2000)
    err = info.value
    assert re.match(r"no module made progress for 2000 cycles \(at cycle \d+\); the run was stopped\. Stuck: compute "
                    r"holds instruction 0 \(GEMM [^)]*pop_prev\) in wait_token, waiting for a load->compute token "
                    r"\(pop_prev\)\. Token queues \(tokens held of 64\): load->compute 0, compute->load 0, "
                    r"compute->store 0, store->compute 0:\n  fetch: ", str(err)), str(err)
    assert err.stuck == ("compute",)
    assert err.tokens == {"load_to_compute": 0, "compute_to_load": 0, "compute_to_store": 0, "store_to_compute": 0}
    compute = err.modules[2]
    assert (compute.module, compute.insn_index, compute.waits_for) == ("compute", 0, "a load->compute token "
                                                                                     "(pop_prev)")


def test_the_watchdog_names_a_full_token_queue(tsim: TSimBackend) -> None:
    pushes = [Load(mem=MEM_INP, x_size=0, push_next=True) for _ in range(3)]
    program = raw_program(SMALL_CFG, [*pushes, Finish()])
    with pytest.raises(TsimWatchdogError, match=r"\. Stuck: load holds instruction 2 \(LOAD INP [^)]*\) in "
                                                r"wait_token, waiting for room in the full load->compute queue\. "
                                                r"Token queues \(tokens held of 2\): load->compute 2, ") as info:
        tsim.run(program, check="none", watchdog_cycles=1000)
    assert info.value.tokens["load_to_compute"] == 2 and info.value.stuck == ("load",)


# ---- memory errors name the instruction ------------------------------------------------------------------------------
def test_a_load_outside_the_image_names_the_instruction(tsim: TSimBackend) -> None:
    program = raw_program(DEFAULT, [Gemm(), Load(mem=MEM_INP, dram_base=4096 // 16, x_size=2), Finish()])
    with pytest.raises(TsimMemoryError, match=r"a read of 32 bytes at byte address 0x1000 \(up to 0x1020\), outside "
                                              r"the 4096-byte DRAM image at cycle \d+ for instruction 1 \(LOAD INP "
                                              r"[^)]*\) of the load module; the run was stopped") as info:
        tsim.run(program, check="none")
    assert (info.value.insn_index, info.value.address, info.value.write) == (1, 0x1000, False)


def test_a_store_outside_the_image_names_the_instruction(tsim: TSimBackend) -> None:
    program = raw_program(DEFAULT, [Store(mem=MEM_OUT, dram_base=4096 // 16 + 2, x_size=1), Finish()])
    with pytest.raises(TsimMemoryError, match=r"the core made a write of 8 bytes at byte address 0x1020 .* for "
                                              r"instruction 0 \(STORE OUT [^)]*\) of the store module;") as info:
        tsim.run(program, check="none")
    assert (info.value.insn_index, info.value.write) == (0, True)


# ---- Ctrl-C ----------------------------------------------------------------------------------------------------------
def test_ctrl_c_stops_the_clock_loop_within_a_second(tsim: TSimBackend, tmp_path: Path) -> None:
    tsim.model(DEFAULT)  # built (or loaded) here, so the subprocess finds it in the cache
    path = tmp_path / "hang.npz"
    raw_program(DEFAULT, [Gemm(pop_prev=True), Finish()]).save(path)  # never finishes: watchdog off, huge budget
    # SIGINT back to its default in the child: a suite started in the background (nohup, `cmd &` in a script) runs
    # with SIGINT ignored, which the child would inherit, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "vta", "-v", "tsim", "run", str(path), "--check", "none",
                             "--watchdog", "0", "--max-cycles", str(10**12)], stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ), preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stderr is not None
        seen = ""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            deadline = time.monotonic() + 120
            while "running 2 instructions on the RTL" not in seen:
                assert time.monotonic() < deadline and sel.select(timeout=1) is not None, seen
                line = proc.stderr.readline()
                assert line, f"the run ended before the interrupt: {seen}"
                seen += line
        time.sleep(1.5)  # well inside the C++ loop
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = proc.wait(timeout=10)
        took = time.monotonic() - sent
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130 and "vta: interrupted" in rest, rest
    assert took < 1.0, f"the run stopped {took:.2f} s after Ctrl-C"


def test_an_interrupted_model_stays_usable(tsim: TSimBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tsim.model(DEFAULT)
    hang = raw_program(DEFAULT, [Gemm(pop_prev=True), Finish()])
    calls = {"n": 0}
    real = model._lib.tsim_resume

    def interrupt_after_two(*args: Any) -> int:
        calls["n"] += 1
        if calls["n"] > 2:
            raise KeyboardInterrupt
        return int(real(*args))

    monkeypatch.setattr(model._lib, "tsim_resume", interrupt_after_two)
    with pytest.raises(KeyboardInterrupt):
        model.run_program(hang, max_cycles=10**12, watchdog_cycles=0)
    monkeypatch.undo()
    program, _ = gemm_program(DEFAULT, 4, 32, 32, seed=5)
    np.testing.assert_array_equal(tsim.run(program).dram, fsim.run(program).dram)


# ---- the command line ------------------------------------------------------------------------------------------------
def test_the_cli_rejects_max_cycles_for_other_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--target", "fsim", "--max-cycles", "5"]) == 2
    assert ("--max-cycles is a cycle budget for --target tsim, not for --target fsim; leave it out"
            in capsys.readouterr().err)
    assert main(["run", "--target", "tsim", "--max-cycles", "-1"]) == 2
    assert "--max-cycles must be a number of cycles >= 0 (0: derived from the program), not -1" in \
        capsys.readouterr().err


def test_the_cli_passes_max_cycles_and_checks_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program, _ = gemm_program(DEFAULT, 4, 32, 32, seed=5)
    path = tmp_path / "gemm.npz"
    program.save(path)
    assert main(["run", str(path), "--target", "tsim", "--max-cycles", "100"]) == 1
    assert re.search(r"vta: error: the run used its whole budget of 100 cycles .*\(max_cycles=100\)",
                     capsys.readouterr().err)
    assert main(["tsim", "run", str(path), "--max-cycles", "100"]) == 1
    assert "(max_cycles=100)" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    raw_program(DEFAULT, [Load(mem=7, x_size=1), Finish()]).save(bad)
    assert main(["tsim", "run", str(bad)]) == 1
    assert "vta: error: instruction 0 is a LOAD of memory type 7" in capsys.readouterr().err
    assert main(["tsim", "run", str(path), "--check", "none", "--json"]) == 0
    assert '"check": "none"' in capsys.readouterr().out


# ---- agreement with fsim on random and mutated programs -------------------------------------------------------------
def mutate(program: Program, kind: str, rng: np.random.Generator) -> Program | None:
    """``program`` with one instruction corrupted: ``sram_base`` (a LOAD reaching past its buffer), ``mem`` (memory
    type 7), ``alu`` (ALU opcode 7) or ``uop_end`` (a GEMM/ALU micro-op range past the micro-op buffer); None when
    it has no instruction of that kind."""
    cfg = program.cfg
    pick = {"sram_base": lambda i: isinstance(i, Load) and i.mem != 7, "mem": lambda i: isinstance(i, Load),
            "alu": lambda i: isinstance(i, Alu), "uop_end": lambda i: isinstance(i, (Gemm, Alu))}[kind]
    candidates = [k for k, insn in enumerate(program.insns) if pick(insn)]
    if not candidates:
        return None
    k = int(rng.choice(candidates))
    insn = program.insns[k]
    if kind == "sram_base":
        insn = dataclasses.replace(insn, sram_base=cfg.depth(insn.mem) - 1, y_size=max(1, insn.y_size),
                                   x_size=max(2, insn.x_size))
    elif kind == "mem":
        insn = dataclasses.replace(insn, mem=7)
    elif kind == "alu":
        insn = dataclasses.replace(insn, alu_opcode=7)
    else:
        insn = dataclasses.replace(insn, uop_bgn=cfg.uop_depth - 2, uop_end=cfg.uop_depth + 3)
    return with_insn(program, k, insn)


def agree(tsim: TSimBackend, program: Program, what: str, spy: Spy) -> str:
    """The backend gives fsim's error (class, instruction, message) without running the RTL, or fsim's DRAM."""
    runs = spy.calls
    try:
        expected = fsim.run(program)
    except fsim.SimulationError as err:
        with pytest.raises(fsim.SimulationError) as raised:
            tsim.run(program)
        assert (type(raised.value), raised.value.insn_index, str(raised.value)) == (type(err), err.insn_index,
                                                                                   str(err)), what
        assert spy.calls == runs, f"{what}: the RTL ran a program fsim rejects"
        return type(err).__name__
    result = tsim.run(program)
    np.testing.assert_array_equal(result.dram, expected.dram, err_msg=what)
    assert result.stats == expected.stats.as_dict(), what
    assert spy.calls == runs + 1
    return "ok"


def agreement(tsim: TSimBackend, monkeypatch: pytest.MonkeyPatch, seeds: range) -> dict[str, int]:
    spy = Spy(tsim, monkeypatch)
    outcomes: dict[str, int] = {}
    for cfg in (DEFAULT, SMALL1X8):
        for seed in seeds:
            rng = np.random.default_rng(seed)
            program = random_program(cfg, rng, n_ops=int(rng.integers(4, 30)))
            programs = [("valid", program)]
            programs += [(kind, mutate(program, kind, rng)) for kind in ("sram_base", "mem", "alu", "uop_end")]
            for kind, p in programs:
                if p is not None:
                    outcome = agree(tsim, p, f"{kind} program seed={seed} at {cfg.name}", spy)
                    outcomes[f"{kind}: {outcome}"] = outcomes.get(f"{kind}: {outcome}", 0) + 1
    return outcomes


def test_fsim_and_tsim_agree_on_random_and_mutated_programs(tsim: TSimBackend,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = agreement(tsim, monkeypatch, range(3))
    assert outcomes["valid: ok"] == 6
    for kind in ("sram_base: SramRangeError", "mem: InvalidInstructionError", "alu: InvalidInstructionError",
                 "uop_end: SramRangeError"):
        assert outcomes.get(kind, 0) >= 1, outcomes
    assert sum(outcomes.values()) >= 20, outcomes


@pytest.mark.slow
def test_fsim_and_tsim_agree_on_many_random_and_mutated_programs(tsim: TSimBackend,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = agreement(tsim, monkeypatch, range(100, 200))
    assert outcomes["valid: ok"] == 200, outcomes
