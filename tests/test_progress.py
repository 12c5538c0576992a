"""Tests for vta.progress: a bar on a terminal, one plain line per step elsewhere, nothing when disabled."""
from __future__ import annotations

import io

from vta.progress import Progress, on_terminal, progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_one_line_per_step_when_not_a_terminal():
    out = io.StringIO()
    assert not on_terminal(out)
    items = list(progress(["conv_1", "pool_2"], desc="tsim", unit="layer", name=str, stream=out))
    assert items == ["conv_1", "pool_2"]
    assert out.getvalue() == "tsim: 1/2 layers conv_1\ntsim: 2/2 layers pool_2\n"
    bar = Progress(3, desc="sweep", unit="point", stream=out)
    bar.update("d1 m ok", failed=0, remaining=2)
    assert out.getvalue().splitlines()[-1] == "sweep: 1/3 points d1 m ok (failed 0, remaining 2)"
    assert "\r" not in out.getvalue()


def test_a_bar_on_a_terminal_and_nothing_when_disabled():
    term = _Terminal()
    list(progress(range(3), desc="compile", unit="layer", stream=term))
    assert "\r" in term.getvalue() and "compile" in term.getvalue()
    quiet = io.StringIO()
    list(progress(range(3), desc="compile", unit="layer", enabled=False, stream=quiet))
    assert quiet.getvalue() == ""


def test_off_a_terminal_lines_come_at_most_once_a_second_after_the_first(monkeypatch):
    """A graph of thousands of layers gives a line a second in a log, plus the first and the last step's."""
    clock = iter([0.0, 0.2, 0.5, 1.3, 1.4, 1.5])
    monkeypatch.setattr("vta.progress.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = Progress(6, desc="compile", unit="layer", stream=out)
    for k in range(6):
        bar.update(f"layer_{k}")
    assert out.getvalue().splitlines() == ["compile: 1/6 layers layer_0", "compile: 4/6 layers layer_3",
                                           "compile: 6/6 layers layer_5"]
