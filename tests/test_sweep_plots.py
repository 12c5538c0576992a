"""Tests for the sweep's PNG frontiers (vta.sweep.pareto.plot_frontiers): axis scales, the one number format, a
parameter to colour by, coincident designs counted and failed points listed."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from vta.sweep.pareto import SUITE, _panel, _scale, figure, plot_frontiers  # noqa: E402


def _row(design: str, block: int, area: float, ips: float) -> dict:
    return {"design": design, "model": "m", "status": "ok", "config": {"LOG_BLOCK": block}, "knobs": {},
            "area_clb": area, "inferences_per_s": ips, "energy_total_uj": 10.0, "lut": 1, "ff": 1, "dsp": 1,
            "bram": 1.0}


def test_axes_are_log_only_over_a_wide_range():
    fig, ax = plt.subplots()
    _scale(ax, "x", [1800.0, 3300.0])
    _scale(ax, "y", [1.0, 500.0])
    assert (ax.get_xscale(), ax.get_yscale()) == ("linear", "log")
    plt.close(fig)


def test_one_number_format():
    assert [figure(v) for v in (37860.4, 27950.03, 703.24, 65.853, 0.18291, None)] == \
        ["37,860", "27,950", "703.2", "65.85", "0.1829", "-"]


def test_panel_counts_coincident_designs_and_colours_by_a_parameter():
    rows = [_row("a", 3, 1000.0, 500.0), _row("b", 3, 1000.0, 500.0), _row("c", 4, 2000.0, 900.0)]
    fig, ax = plt.subplots()
    front = _panel(ax, rows, "inferences_per_s", True, "LOG_BLOCK", ["3", "4"], {})
    assert [r["design"] for r in front] == ["a", "c"]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["LOG_BLOCK = 3", "LOG_BLOCK = 4", "frontier (2)"]
    assert legend.get_title().get_text() == "3 designs, 2 sharing figures (xN)"
    assert "x2" in [t.get_text() for t in ax.texts]
    plt.close(fig)


def test_plot_frontiers_writes_pngs_with_failed_points(tmp_path):
    rows = [_row("a", 3, 1000.0, 500.0), _row("c", 4, 2000.0, 900.0)]
    failed = [{"design": "bad", "model": "m", "status": "failed", "error": "invalid config: LOG_BLOCK=9"}]
    written = plot_frontiers({"m": rows, SUITE: rows}, tmp_path, title="t", failed=failed)
    assert [p.name for p in written] == ["pareto_throughput.png", "pareto_energy.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
