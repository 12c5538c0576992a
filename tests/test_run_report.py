"""Run reports beyond the table (vta.compiler.report): bytes per memory type from the run's statistics, energy per
layer and per inference from vta.energy, the stacked-bar and roofline figures (legends name only what is drawn),
saved reports read back (`vta report RUN`) and two runs compared (`vta report A B`)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vta.cli import main
from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.report import (
    BYTE_COLUMNS,
    COLUMNS,
    ENERGY_PARTS,
    Report,
    ReportError,
    build_report,
    compare,
    format_comparison,
    load_report,
    roofline_path,
)
from vta.compiler.runtime.compiled import AccelStep
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig
from vta.counters import CYCLE_CLASSES, MODULES
from vta.counts import program_counts
from vta.energy import DEFAULT_TECH, layer_energy, load_tech


@pytest.fixture(scope="module")
def compiled() -> Any:
    return compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2)


@pytest.fixture(scope="module")
def report(compiled: Any) -> Report:
    out = run(compiled, random_inputs(compiled.graph, 0), target="fsim")
    return build_report(compiled, out, model="tiny_cnn")


def test_bytes_per_memory_type_are_the_run_statistics(compiled, report):
    """Each accelerator layer's bytes per memory type add up to its bytes moved and equal the program's counts."""
    programs = {s.node.name: s.program for s in compiled.steps if isinstance(s, AccelStep)}
    accel = [r for r in report.rows if r["where"] == "accel"]
    assert len(accel) == 3
    for row in accel:
        counts = program_counts(programs[row["layer"]])
        assert {k: row[k] for k in BYTE_COLUMNS} == {k: counts[k] for k in BYTE_COLUMNS}
        assert sum(row[k] for k in BYTE_COLUMNS) == row["bytes"] > 0
        assert row["hw_macs"] == counts["macs"] >= row["macs"]  # padded lanes count in the hardware's MACs
        assert row["intensity"] == pytest.approx(row["macs"] / row["bytes"], abs=1e-4)
        assert row["macs_per_cycle"] is None  # fsim measures no cycles
    for row in report.rows:
        if row["where"] != "accel":
            assert all(row[k] is None for k in BYTE_COLUMNS)
    totals = report.totals
    assert sum(totals[k] for k in BYTE_COLUMNS) == totals["bytes"]


def test_energy_per_layer_and_per_inference(compiled, report):
    """An accelerator layer's energy is vta.energy.layer_energy of its statistics; fallback layers cost cpu.mac_pj
    per MAC; the totals are the sums (uJ)."""
    tech, cfg = load_tech(), compiled.cfg
    programs = {s.node.name: s.program for s in compiled.steps if isinstance(s, AccelStep)}
    assert report.tech == tech.name
    for row in report.rows:
        if row["where"] == "accel":
            parts = layer_energy(program_counts(programs[row["layer"]]), cfg, tech)
            for part, pj in parts.items():
                assert row[f"energy_{part}_uj"] == pytest.approx(pj * 1e-6)
            assert row["energy_cpu_uj"] is None
            assert row["energy_uj"] == pytest.approx(sum(parts.values()) * 1e-6) and row["energy_uj"] > 0
        else:
            assert row["energy_cpu_uj"] == pytest.approx(row["macs"] * tech.cpu_mac_pj * 1e-6)
    totals = report.totals
    assert totals["energy_uj"] == pytest.approx(sum(r["energy_uj"] for r in report.rows))
    assert totals["energy_uj"] == pytest.approx(sum(totals[f"energy_{p}_uj"] or 0 for p in ENERGY_PARTS))
    text = report.format()
    assert f"energy per inference: {totals['energy_uj']:,.3f} uJ dynamic (mac " in text
    assert "memory traffic (bytes per memory type)" in text


def test_saved_report_reads_back_whole(report, tmp_path):
    path = tmp_path / "run.json"
    report.write_json(path)
    back = load_report(path)
    assert back.rows == report.rows and back.totals == report.totals
    assert (back.macs_per_cycle, back.bus_bytes, back.config_fields, back.tech) == \
        (256, 8, VTAConfig().to_dict(), report.tech)
    assert back.format() == report.format()
    report.write_csv(tmp_path / "run.csv")
    header = (tmp_path / "run.csv").read_text().splitlines()[0].split(",")
    assert tuple(header) == COLUMNS and "energy_dram_uj" in header and "wgt_bytes_read" in header


def test_energy_recomputed_with_another_tech_file(report, tmp_path):
    text = DEFAULT_TECH.read_text().replace("access_pj = 1300.0", "access_pj = 2600.0")
    (tmp_path / "t.toml").write_text(text.replace('name = "Horowitz', 'name = "doubled DRAM, Horowitz'))
    other = report.with_tech(load_tech(tmp_path / "t.toml"))
    assert other.tech.startswith("doubled DRAM")
    for a, b in zip(report.rows, other.rows):
        if a["where"] == "accel":
            assert b["energy_dram_uj"] == pytest.approx(2 * a["energy_dram_uj"])
            assert b["energy_mac_uj"] == pytest.approx(a["energy_mac_uj"])
    assert report.rows[1]["energy_dram_uj"] != other.rows[1]["energy_dram_uj"]  # the original is unchanged


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"), ("[1, 2]", "not a run report"), ('{"model": "m"}', "no 'config', 'target', 'layers'"),
    ('{"model": "m", "config": "c", "target": "fsim", "layers": [{"layer": "a"}]}', "layer 0 has no op, where, macs"),
])
def test_load_report_errors(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ReportError, match=message) as info:
        load_report(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)
    with pytest.raises(ReportError, match="No such file"):
        load_report(tmp_path / "none.json")


def _row(layer: str, where: str, macs: int, cycles: int | None, **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(layer=layer, op="QConv2d" if where == "accel" else "MaxPool", where=where, macs=macs, gemm_uops=10,
               alu_uops=5, cycles=cycles, bytes=100, ms=1.0, conversions=0, tiling="", reason="", bound="")
    row.update(extra)
    return row


def _tsim_row(layer: str, macs: int, cycles: int, dram: int) -> dict[str, Any]:
    """A layer as tsim reports it: load and compute wait on tokens and memory, nobody waits on memory in store."""
    modules = {f"{m}_{c}": 0 for m in MODULES for c in CYCLE_CLASSES}
    modules.update(fetch_busy=cycles // 10, load_busy=cycles // 2, load_wait_mem=cycles // 4,
                   compute_busy=cycles // 2, compute_wait_token=cycles // 4, store_busy=cycles // 8)
    return _row(layer, "accel", macs, cycles, intensity=macs / dram, **modules, energy_uj=0.5, energy_mac_uj=0.2,
                energy_dram_uj=0.3)


def _labels(ax: Any) -> list[str]:
    return ax.get_legend_handles_labels()[1]


def test_figure_legends_name_only_what_is_drawn():
    import matplotlib.pyplot as plt
    rows = [_tsim_row("conv_1", 25600, 1000, 800), _row("pool_2", "cpu", 0, None, energy_uj=0.0,
                                                        energy_cpu_uj=0.0), _tsim_row("conv_3", 51200, 400, 3200)]
    report = Report("m", "cfg", "tsim", rows, macs_per_cycle=256, bus_bytes=8)
    fig = report.figure()
    axes = fig.axes
    assert len(axes) == 2 + len(MODULES) + 1  # overview, MACs, one per module, energy
    # the CPU layer has no cycles: a grey band says so
    assert _labels(axes[0]) == ["on the fallback (no accelerator cycles)", "accelerator"]
    assert _labels(axes[1]) == ["accelerator"]  # MACs: pool_2 has none
    assert [t.get_color() for t in axes[-1].get_xticklabels()] == ["black", "0.45", "black"]
    module_axes = {ax.get_title().split()[0]: ax for ax in axes[2:2 + len(MODULES)]}
    assert _labels(module_axes["load"]) == ["busy", "wait_mem", "idle"]
    assert _labels(module_axes["compute"]) == ["busy", "wait_token", "idle"]
    assert _labels(module_axes["store"]) == ["busy", "idle"]
    assert _labels(axes[-1]) == ["mac", "dram"]
    plt.close(fig)
    points = report.roofline_points()
    assert [(p["layer"], p["intensity"], p["macs_per_cycle"], p["measured"]) for p in points] == [
        ("conv_1", 32.0, 25.6, True), ("conv_3", 16.0, 128.0, True)]
    fig = report.roofline_figure()
    ax = fig.axes[0]
    assert _labels(ax) == ["bandwidth roof (8 B/cycle)", "compute roof (256 MACs/cycle)", "layers (tsim cycles)"]
    roof = ax.get_lines()[1].get_ydata()
    assert list(roof) == [256, 256]
    assert ax.get_xlim()[0] == pytest.approx(16.0 / 1.5) and ax.get_xlim()[1] == pytest.approx(48.0)  # fitted
    assert [t.get_text() for t in ax.texts] == ["conv_1", "conv_3"]  # labels that do not overprint; pool_2: no MACs
    plt.close(fig)


def test_plots_are_written(report, tmp_path):
    report.plot(tmp_path / "run.png")
    report.plot_roofline(roofline_path(tmp_path / "run.png"))
    assert roofline_path("a/run.png") == "a/run_roofline.png"
    for name in ("run.png", "run_roofline.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_compare_two_runs_layer_by_layer():
    a = Report("m", "cfg_a", "tsim", [_row("conv_1", "accel", 100, 1000, energy_uj=2.0),
                                      _row("conv_2", "accel", 100, 500, energy_uj=1.0)])
    b = Report("m", "cfg_b", "fsim", [_row("conv_1", "accel", 100, None, predicted=800, energy_uj=1.0),
                                      _row("conv_2", "cpu", 100, None, energy_uj=4.0),
                                      _row("conv_9", "accel", 100, 10, energy_uj=0.5)])
    rows = compare(a, b)
    assert [(r["layer"], r["where_a"], r["where_b"], r["cycles_a"], r["cycles_b"], r["cycles_ratio"],
             r["energy_ratio"]) for r in rows] == [
        ("conv_1", "accel", "accel", 1000.0, 800.0, 0.8, 0.5), ("conv_2", "accel", "cpu", 500.0, None, None, 4.0),
        ("conv_9", None, "accel", None, 10.0, None, None)]
    assert rows[0]["cycles_from"] == "tsim/model"
    text = format_comparison(a, b, "a.json", "b.json").splitlines()
    assert text[0] == "A: a.json: m on tsim (cfg_a)"
    assert text[2] == "differs: config cfg_a -> cfg_b, target tsim -> fsim"  # no config fields: by name
    assert text[6].split()[:3] == ["conv_2", "accel/cpu", "500"]
    assert "placed differently: conv_2" in text


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_vta_report_cli(report, tmp_path, capsys):
    run_json = tmp_path / "run.json"
    report.write_json(run_json)
    code, out, _ = _cli(capsys, "report", str(run_json), "--report-csv", str(tmp_path / "again.csv"), "--plot",
                        str(tmp_path / "again.png"))
    assert code == 0 and out.startswith(report.format())
    assert (tmp_path / "again.csv").exists() and (tmp_path / "again_roofline.png").exists()
    data = json.loads(run_json.read_text())
    data["layers"][1]["energy_uj"] = 99.0  # B differs in one layer's energy
    (tmp_path / "b.json").write_text(json.dumps(data))
    code, out, _ = _cli(capsys, "report", str(run_json), str(tmp_path / "b.json"))
    conv = next(line for line in out.splitlines() if line.startswith(report.rows[1]["layer"]))
    assert code == 0 and conv.split()[-1] == f"{99.0 / report.rows[1]['energy_uj']:,.2f}"
    code, _, err = _cli(capsys, "report", str(tmp_path / "none.json"))
    assert code == 2 and "none.json: No such file or directory" in err and "Traceback" not in err
    code, _, err = _cli(capsys, "report", str(run_json), str(run_json), str(run_json))
    assert code == 2 and "one run to re-render or two to compare, not 3" in err
    code, _, err = _cli(capsys, "report", str(run_json), "--plot", str(tmp_path / "x.gif"))
    assert code == 2 and "--plot" in err
    bad = Path(tmp_path / "bad.toml")
    bad.write_text("[source]\nname = 'x'\n")
    code, _, err = _cli(capsys, "report", str(run_json), "--tech", str(bad))
    assert code == 2 and "is missing" in err and len(err.strip().splitlines()) == 1


def test_build_time_is_reported_apart_from_host_time():
    """A tsim run's build (or cache load) is timed before the first step (RunOutput.setup_seconds) and the table
    says so under the host ms it is not part of."""
    report = Report("m", "cfg", "tsim", [_tsim_row("conv_1", 25600, 1000, 800)], extra={"build_seconds": 41.5})
    lines = report.format().splitlines()
    assert "host ms: wall-clock time of each step on this machine (simulation, not the accelerator's time); building " \
           "or loading the simulator took 41.50 s, not in host ms" in lines
    assert not any(line.startswith("build_seconds") for line in lines)
    from vta.backend import Backend
    assert Backend().prepare(None) is None  # nothing to prepare by default


def test_a_measured_layer_is_bound_by_its_counters():
    """On tsim the table's bound is the core's counters' (as the run's), not the cycle model's prediction."""
    from vta.compiler.report import row_bound
    row = dict(_tsim_row("conv_1", 25600, 1000, 800), bound="store")  # the model predicted store
    row.update(compute_busy=900)
    assert row_bound(row) == ("compute", "counters")
    assert row_bound(_row("conv_2", "accel", 100, None, bound="load")) == ("load", "cycle model")
    assert row_bound(_row("pool_3", "cpu", 0, None)) == ("", "")
    line = Report("m", "cfg", "tsim", [row]).format().splitlines()[3]
    assert line.split()[8] == "compute"
