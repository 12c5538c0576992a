"""vta.sweep.pareto: exact frontiers of hand-made points, suite aggregation, tables and plots."""
from __future__ import annotations

import pytest

from vta.sweep.pareto import SUITE, frontier, frontier_table, plot_frontiers, suite_rows


def _p(name, area, ips=None, energy=None):
    return {"design": name, "area_clb": area, "inferences_per_s": ips, "energy_uj": energy}


POINTS = [_p("a", 10, 5), _p("b", 20, 4), _p("c", 20, 9), _p("d", 30, 9), _p("e", 40, 12), _p("f", 5, 1),
          _p("g", 50, 11), _p("h", 40, 12), _p("i", 60, None)]


def test_throughput_frontier_is_exact():
    # b is beaten by c (same area, faster), d by c (cheaper, as fast), g by e, h duplicates e, i has no value
    assert [r["design"] for r in frontier(POINTS, "area_clb", "inferences_per_s", maximize_y=True)] == \
        ["f", "a", "c", "e"]


def test_energy_frontier_minimizes_both_axes():
    pts = [_p("a", 10, energy=50), _p("b", 20, energy=60), _p("c", 30, energy=20), _p("d", 30, energy=25),
           _p("e", 5, energy=80), _p("f", 50, energy=20)]
    assert [r["design"] for r in frontier(pts, "area_clb", "energy_uj", maximize_y=False)] == ["e", "a", "c"]


def test_frontier_of_nothing_and_of_one():
    assert frontier([], "area_clb", "inferences_per_s", maximize_y=True) == []
    assert frontier([_p("x", 1, 1)], "area_clb", "inferences_per_s", maximize_y=True) == [_p("x", 1, 1)]


def _row(design, model, latency, energy, status="ok"):
    return {"design": design, "model": model, "status": status, "latency_us": latency, "energy_uj": energy,
            "energy_total_uj": energy + 0.5, "cycles": int(latency * 100), "config_name": design, "lut": 1, "ff": 2,
            "dsp": 3, "bram": 4.0, "area_clb": 10.0}


def test_suite_rows_sum_one_inference_of_each_model():
    rows = [_row("x", "m1", 100.0, 1.0), _row("x", "m2", 300.0, 2.0), _row("y", "m1", 50.0, 1.0),
            _row("y", "m2", 1.0, 1.0, status="failed"), _row("z", "m1", 10.0, 1.0)]
    suite = suite_rows(rows, ["m1", "m2"])
    assert len(suite) == 1  # y failed on m2, z was not measured on m2
    assert suite[0]["design"] == "x" and suite[0]["model"] == SUITE
    assert suite[0]["latency_us"] == 400.0 and suite[0]["inferences_per_s"] == pytest.approx(2500.0)
    assert suite[0]["energy_uj"] == 3.0 and suite[0]["energy_total_uj"] == 4.0 and suite[0]["cycles"] == 40000


def test_old_rows_are_read_with_todays_energy_meanings(tmp_path):
    """A row written before energy_total_uj: its energy_uj included the static energy."""
    from vta.sweep.store import ResultStore
    with ResultStore(tmp_path / "r.sqlite") as store:
        store.put({"design": "x", "model": "m", "mode": "model", "status": "ok", "energy_uj": 5.0,
                   "energy": {"mac": 1.0, "dram": 2.5, "cpu": 0.0, "static": 1.5}})
        store.put({"design": "y", "model": "m", "mode": "model", "status": "ok", "energy_uj": 3.5,
                   "energy_total_uj": 5.0, "energy": {"mac": 1.0, "dram": 2.5, "cpu": 0.0, "static": 1.5}})
        rows = store.rows()
    assert [(r["energy_uj"], r["energy_total_uj"]) for r in rows] == [(3.5, 5.0), (3.5, 5.0)]


def test_table_and_plots(tmp_path):
    rows = [dict(_row("1x16_i8w8a32_15_15_18_17", "m", 100.0, 2.0), inferences_per_s=1e4)]
    table = frontier_table(rows, "throughput").splitlines()
    assert table[0].split() == ["design", "area", "CLB", "LUT", "FF", "DSP", "BRAM", "MHz", "critical", "path",
                                "inferences/s"]
    assert table[2].split() == ["1x16_i8w8a32_15_15_18_17", "10", "1", "2", "3", "4.0", "-", "-", "10,000"]
    timed = frontier_table([dict(rows[0], clock_mhz=31.25, clock_source="model", critical_unit="compute.alu")],
                           "throughput").splitlines()
    assert timed[2].split()[6:8] == ["31.2", "compute.alu"] and "model" in timed[3]
    written = plot_frontiers({"m": rows, SUITE: rows}, tmp_path / "plots", title="t")
    assert [p.name for p in written] == ["pareto_throughput.png", "pareto_energy.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
