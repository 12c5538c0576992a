"""Tests for scripts/train_digits.py's progress: bars on standard error when it is a terminal, over the training
epochs (with the loss) and the int8 test images; plain lines off a terminal; nothing with --no-progress."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_digits.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    pytest.importorskip("sklearn")
    spec = importlib.util.spec_from_file_location("train_digits", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _main(script: ModuleType, tmp_path: Path, *extra: str) -> int:
    return int(script.main(["--epochs", "2", "--limit", "5", "--out", str(tmp_path / "digits.onnx"), *extra]))


def test_a_terminal_gets_bars_over_epochs_and_images(script: ModuleType, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script, "stderr_is_tty", lambda: True)
    _main(script, tmp_path)
    out, err = capsys.readouterr()
    assert "train: 100%" in err and "2/2" in err and "epoch" in err and "loss=" in err
    assert "int8 on reference: 100%" in err and "5/5" in err
    assert out.splitlines()[0] == f"trained 2 epochs in {out.split(' in ')[1].split(' s;')[0]} s; model written to " \
                                  f"{tmp_path / 'digits.onnx'}"
    assert "%" not in out.splitlines()[0]  # the bars stay on standard error


def test_no_progress_turns_the_bars_off(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script, "stderr_is_tty", lambda: True)
    _main(script, tmp_path, "--no-progress")
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("trained 2 epochs in ")


def test_plain_lines_when_standard_error_is_not_a_terminal(script: ModuleType, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert script.stderr_is_tty() is False  # pytest's capture is not a terminal
    assert script.main(["--epochs", "8", "--limit", "5", "--out", str(tmp_path / "digits.onnx")]) in (0, 1)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"train: epoch {k}/8" for k in (2, 4, 6, 8)]
    losses = [float(line.rsplit(" ", 1)[1]) for line in lines]
    assert all(0 < x < 3 for x in losses) and losses[-1] < losses[0]  # the loss falls as it trains
    assert "%|" not in err and out.startswith("trained 8 epochs in ")


def test_requant_shift_is_used_and_named(script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """--requant shift quantizes with power-of-two scales (every requant multiplier 1) and the summary names it."""
    from vta.compiler.frontend import quantize as quantize_module
    modes: list[str] = []
    real = quantize_module.quantize

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        modes.append(kwargs.get("mode", "multiply"))
        qgraph = real(*args, **kwargs)
        multipliers = [n.attrs["requant"].multiplier for n in qgraph.nodes if n.op in ("QConv2d", "QDense")]
        assert multipliers and all((m == 1).all() for m in multipliers)
        return qgraph

    monkeypatch.setattr(quantize_module, "quantize", spy)
    assert _main(script, tmp_path, "--no-progress", "--requant", "shift") in (0, 1)
    assert modes == ["shift"]
    assert "int8 accuracy (reference, shift)" in capsys.readouterr().out
