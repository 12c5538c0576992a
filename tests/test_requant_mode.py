"""Tests of compile_model's ``requant`` choice (``vta compile/run --requant``): with ``shift`` (power-of-two scales,
as VTA's TVM stack) the convolutions requantize without an ALU MUL, run bit-exact on fsim against their own integer
reference, are predicted faster than with ``multiply``, and the choice is recorded in the artefact."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vta.cli import main
from vta.compiler import qops
from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.runtime.compiled import AccelStep, Compiled
from vta.compiler.runtime.executor import run
from vta.config import MEM_ACC, VTAConfig
from vta.isa import ALU_MUL, Alu, Load


def _conv_steps(compiled: Compiled) -> list[AccelStep]:
    return [s for s in compiled.steps if isinstance(s, AccelStep) and s.node.op in ("QConv2d", "QDense")]


def _alu_ops(step: AccelStep) -> set[int]:
    return {insn.alu_opcode for insn in step.program.insns if isinstance(insn, Alu)}


@pytest.fixture(scope="module")
def both() -> dict[str, Compiled]:
    return {mode: compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2, requant=mode)
            for mode in ("multiply", "shift")}


def test_shift_has_no_mul_and_is_bit_exact_on_fsim(both: dict[str, Compiled]) -> None:
    shift = both["shift"]
    convs = _conv_steps(shift)
    assert len(convs) == 3  # conv_3 (im2col), conv_7, gemm_12
    for step in convs:
        assert (step.node.attrs["requant"].multiplier == 1).all(), step.node.name
        assert ALU_MUL not in _alu_ops(step), step.node.name
    # multiply mode keeps a MUL somewhere (else the comparison below says nothing)
    assert any(ALU_MUL in _alu_ops(s) for s in _conv_steps(both["multiply"]))
    inputs = random_inputs(shift.graph, 0)
    out = run(shift, inputs, target="fsim")
    ref = qops.run_reference(shift.graph, inputs)
    for name, value in ref.items():
        assert np.array_equal(value, out.outputs[name]), name


def test_shift_is_predicted_faster_with_fewer_alu_uops(both: dict[str, Compiled]) -> None:
    multiply, shift = (_conv_steps(both[m]) for m in ("multiply", "shift"))
    # the same products; with shift a tile whose accumulators hold an earlier tile's outputs starts with one ALU MIN
    # instead of a reset GEMM (the offset start, compiler/lowering/requant.py), so never more GEMM micro-ops
    assert all(s.gemm_uops <= m.gemm_uops for s, m in zip(shift, multiply))
    assert sum(s.gemm_uops for s in shift) < sum(m.gemm_uops for m in multiply)
    assert sum(s.alu_uops for s in shift) < sum(s.alu_uops for s in multiply)
    assert sum(s.predicted_cycles for s in shift) < sum(s.predicted_cycles for s in multiply)
    # nor is the multiplier constant loaded: fewer LOAD ACC where the constants are per channel
    acc_loads = [[sum(isinstance(i, Load) and i.mem == MEM_ACC for i in s.program.insns) for s in steps]
                 for steps in (multiply, shift)]
    assert sum(acc_loads[1]) < sum(acc_loads[0])


def test_requant_is_recorded_and_round_trips(both: dict[str, Compiled], tmp_path: Path) -> None:
    assert both["multiply"].meta["requant"] == "multiply"
    path = tmp_path / "tiny.vtac"
    both["shift"].save(path)
    assert Compiled.load(path).meta["requant"] == "shift"


def test_compile_model_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="requant='round'"):
        compile_model("tiny_cnn", VTAConfig(), requant="round")


def test_cli_bad_value_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["compile", "tiny_cnn", "-o", str(tmp_path / "x.vtac"), "--requant", "round"]) == 2
    assert "--requant: invalid choice: 'round'" in capsys.readouterr().err


def test_cli_run_reports_shift(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "tiny_cnn", "--requant", "shift", "--policy", "accel", "--calib", "2", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "requant: shift" in out and "matches_integer_reference: True" in out
