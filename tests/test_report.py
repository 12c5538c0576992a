"""Tests for vta.compiler.report: the rows and totals of tiny_cnn run on fsim (exact values), the JSON and CSV
round trips, the text table, and totals with cycle counts (as tsim reports them)."""
import csv
import json

import pytest

from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.report import BYTE_COLUMNS, COLUMNS, ENERGY_COLUMNS, MODULE_COLUMNS, Report, build_report, load_report
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

KEYS = ("layer", "op", "where", "macs", "gemm_uops", "alu_uops", "cycles", "util", "bytes", "conversions", "tiling",
        "reason")
EXPECTED_ROWS = [
    ("quantize_input", "Quantize", "cpu", 0, 0, 0, None, None, 0, 0, "", "Quantize has no accelerator rule"),
    ("conv_3", "QConv2d", "accel", 4608, 128, 256, None, None, 3052, 1, "oc1 ic1 oh8 ow4 im2col",
     "supported; im2col by the fastest estimate, time relative to it: direct 2.18x (15 uops/vector, 1,024 host "
     "bytes), kw-folded 1.39x (9 uops/vector, 1,024 host bytes), im2col 1.00x (6 uops/vector, 1,024 host bytes)"),
    ("conv_7", "QConv2d", "accel", 18432, 160, 80, None, None, 4036, 0, "oc1 ic1 oh4 ow4 1thread", "supported"),
    ("flatten_9", "Reshape", "cpu", 0, 0, 0, None, None, 0, 1, "", "Reshape has no accelerator rule"),
    ("gemm_12", "QDense", "accel", 2560, 16, 4, None, None, 5068, 1, "oc1 ic16 oh1 ow1 1thread bias-load",
     "supported"),
    ("dequantize_output", "Dequantize", "cpu", 0, 0, 0, None, None, 0, 1, "", "Dequantize has no accelerator rule"),
]


@pytest.fixture(scope="module")
def report() -> Report:
    compiled = compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2)
    out = run(compiled, random_inputs(compiled.graph, 0), target="fsim")
    return build_report(compiled, out, model="tiny_cnn")


def test_rows_of_tiny_cnn_on_fsim(report):
    assert (report.model, report.config, report.target) == ("tiny_cnn", VTAConfig().name, "fsim")
    assert [tuple(row[k] for k in KEYS) for row in report.rows] == EXPECTED_ROWS
    # the cycle model's prediction and bounding module of each accelerator layer (any target), none on the CPU
    assert [(row["predicted"], row["bound"]) for row in report.rows] == [
        (None, ""), (680, "compute"), (834, "load"), (None, ""), (1075, "load"), (None, "")]
    assert all(set(row) == set(COLUMNS) for row in report.rows)
    assert all(row[c] is None for row in report.rows for c in MODULE_COLUMNS)  # fsim has no counters
    assert all(row["ms"] >= 0 for row in report.rows)


def test_totals_of_tiny_cnn_on_fsim(report):
    totals = dict(report.totals)
    assert totals.pop("ms") >= 0
    for key in BYTE_COLUMNS + ENERGY_COLUMNS + ("intensity", "energy_static_uj", "energy_total_uj"):
        totals.pop(key)  # checked by the energy tests and test_static_energy_...
    assert totals == {"layers": 6, "accel_layers": 3, "cpu_layers": 3, "macs": 25600, "accel_macs": 25600,
                      "gemm_uops": 304, "alu_uops": 340, "cycles": None, "util": None, "predicted": 2589,
                      "accel_ms_at_clock": None, "latency_us": round(2589 / report.clock_mhz, 3),
                      "latency_cycles": "predicted",
                      "inferences_per_s": round(1e6 / round(2589 / report.clock_mhz, 3), 3),
                      "bound": "load", "bytes": 12156, "conversions": 4}
    assert report.module_breakdown() is None and report.format_modules() == []


def test_static_energy_is_the_designs_static_power_over_the_accelerator_time(report, tmp_path):
    from vta.area import estimate_area
    from vta.energy import load_tech
    t = report.totals
    area = estimate_area(VTAConfig()).area_clb
    assert report.area_clb == area
    assert report.static_mw == pytest.approx(load_tech().static_mw_per_kclb * area / 1000)
    assert t["energy_static_uj"] == pytest.approx(report.static_mw * t["latency_us"] * 1e-3, rel=1e-6)  # mW x us
    assert t["energy_total_uj"] == pytest.approx(t["energy_uj"] + t["energy_static_uj"])
    assert f"static {t['energy_static_uj']:,.3f} uJ" in " ".join(" ".join(report.format_traffic()).split())
    report.write_json(tmp_path / "r.json")
    again = load_report(tmp_path / "r.json")
    assert (again.area_clb, again.static_mw, again.totals["energy_static_uj"]) == (
        report.area_clb, report.static_mw, t["energy_static_uj"])
    slower = report.with_clock(report.clock_mhz / 2)  # twice the time, twice the static energy
    assert slower.totals["energy_static_uj"] == pytest.approx(2 * t["energy_static_uj"], rel=1e-4)
    data = json.loads((tmp_path / "r.json").read_text())
    del data["area_clb"], data["static_mw"]  # a report saved before static energy was recorded
    old = Report.from_dict(data)
    assert old.totals["energy_static_uj"] is None and old.totals["energy_total_uj"] is None
    text = " ".join(" ".join(old.format_traffic()).split())
    assert "static energy: not known (no area recorded in this report)" in text


def test_json_round_trip(report, tmp_path):
    path = tmp_path / "report.json"
    report.extra["run_seconds"] = 1.5
    try:
        report.write_json(path)
    finally:
        del report.extra["run_seconds"]
    data = json.loads(path.read_text())
    assert (data["model"], data["config"], data["target"], data["run_seconds"]) == ("tiny_cnn", VTAConfig().name,
                                                                                     "fsim", 1.5)
    assert data["layers"] == report.rows
    assert data["totals"] == report.totals


def test_csv_round_trip(report, tmp_path):
    path = tmp_path / "report.csv"
    report.write_csv(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = list(reader)
    assert len(rows) == len(report.rows)
    for got, row in zip(rows, report.rows):
        assert got == {k: "" if row[k] is None else str(row[k]) for k in COLUMNS}
    assert [int(r["gemm_uops"]) for r in rows] == [0, 128, 160, 0, 16, 0]


def test_text_table(report):
    """The default table fits 120 columns (output shapes, no micro-op columns); host time is labelled as such."""
    text = report.format(reasons=True)
    lines = text.splitlines()
    assert lines[0] == f"tiny_cnn on fsim ({VTAConfig().name})"
    assert lines[1].split() == ["layer", "op", "where", "out", "shape", "MACs", "cycles", "util", "predicted", "bound",
                                "bytes", "host", "ms"]
    assert lines[4].split()[:8] == ["conv_3", "QConv2d", "accel", "1x8x8x8", "4,608", "-", "-", "680"]
    assert lines[4].split()[8] == "compute"
    assert lines[3].split()[:3] == ["quantize_input", "Quantize", "cpu"]
    assert lines[4].endswith("im2col 1.00x (6 uops/vector, 1,024 host bytes)")
    total = lines[10].split()
    assert total[:10] == ["total", "3", "accel", "-", "25,600", "-", "-", "2,589", "load", "12,156"]
    assert "layout conversions at partition boundaries: 4; 25,600 of 25,600 MACs on the accelerator" in lines
    assert lines[11].startswith("host ms: wall-clock time of each step on this machine")
    plain = report.format()
    assert max(len(line) for line in plain.splitlines()) <= 120


def test_wide_table(report):
    """--wide: input and output shapes, micro-ops, whole names; a narrow table shortens a long name in the middle."""
    lines = report.format(wide=True).splitlines()
    assert lines[1].split() == ["layer", "op", "where", "in", "shape", "out", "shape", "MACs", "gemm", "uops", "alu",
                                "uops", "cycles", "util", "predicted", "bound", "bytes", "host", "ms"]
    assert lines[4].split()[:8] == ["conv_3", "QConv2d", "accel", "1x1x8x8", "1x8x8x8", "4,608", "128", "256"]
    from vta.compiler.report import _cell
    assert _cell("blocks.11.attn.softmax_scores", -22) == "blocks.11...max_scores"
    assert _cell("conv_3", 8) == "  conv_3"


def test_config_difference_leads_a_comparison(report):
    """vta report A B says first what differs between the two designs and runs."""
    from vta.compiler.report import config_difference, format_comparison
    b = Report.from_dict({**report.to_dict(), "config_fields": {**report.config_fields, "BUS_BYTES": 16},
                          "target": "tsim"})
    assert config_difference(report, b) == "differs: BUS_BYTES 8 -> 16, target fsim -> tsim"
    assert format_comparison(report, b).splitlines()[2] == "differs: BUS_BYTES 8 -> 16, target fsim -> tsim"
    assert config_difference(report, report).startswith("differs: nothing in the config")
    with_requant = Report.from_dict({**report.to_dict(), "requant": "multiply"})
    without = Report.from_dict({k: v for k, v in report.to_dict().items() if k != "requant"})
    assert config_difference(with_requant, without) == \
        "differs: nothing in the config, model, target or technology (the same design run twice) (requant recorded " \
        "by one report only)"    # a report the Python API wrote records no requant: not "multiply -> -"


def test_accuracy_difference_follows_the_config_difference(report):
    """vta report A B shows how the accuracy against float moved when both runs recorded it (vta run's
    extra["accuracy"]); nothing when one run has none."""
    from vta.compiler.report import accuracy_difference, format_comparison

    def with_accuracy(top1: float, err: float) -> Report:
        acc = {"reference": "onnxruntime", "outputs": {"y": {"top1_agreement": top1, "top5_agreement": None,
                                                             "cosine": 0.99, "max_error_pct_of_range": err}}}
        return Report.from_dict({**report.to_dict(), "accuracy": acc})

    a, b = with_accuracy(1.0, 2.0), with_accuracy(0.75, 5.5)
    rows = accuracy_difference(a, b)
    assert [(r["metric"], r["a"], r["b"], r["b_minus_a"]) for r in rows] == [
        ("top1_agreement", 1.0, 0.75, -0.25), ("cosine", 0.99, 0.99, 0.0), ("max_error_pct_of_range", 2.0, 5.5, 3.5)]
    lines = format_comparison(a, b).splitlines()
    joined = " ".join(line.strip() for line in lines[3:5])
    assert joined == ("accuracy of output 'y' against the float model, A -> B: top-1 agreement 100% -> 75% "
                      "(-25 points); cosine 0.990000 -> 0.990000 (+0); max error 2% -> 5.5% of range (+3.5 points)")
    assert lines[5].startswith("layer")
    assert accuracy_difference(a, report) == []
    assert format_comparison(a, report).splitlines()[3] == format_comparison(report, report).splitlines()[3]


def _row(layer: str, where: str, macs: int, cycles: int | None) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(layer=layer, op="QConv2d" if where == "accel" else "MaxPool", where=where, macs=macs, gemm_uops=10,
               alu_uops=5, cycles=cycles, bytes=100, ms=1.25, conversions=1, tiling="", reason="")
    return row


def test_totals_with_cycles():
    """Utilization is accelerator MACs over cycles x peak MACs per cycle; the time at the config's clock in ms."""
    report = Report("m", "cfg", "tsim", [_row("a", "accel", 2560, 100), _row("b", "cpu", 40, None),
                                         _row("c", "accel", 1280, 200)], macs_per_cycle=256, clock_mhz=100.0)
    totals = report.totals
    assert (totals["cycles"], totals["util"], totals["accel_ms_at_clock"]) == (300, 0.05, 0.003)
    assert (totals["macs"], totals["accel_macs"], totals["gemm_uops"], totals["bytes"], totals["ms"]) == \
        (3880, 3840, 30, 300, 3.75)
    assert (totals["latency_us"], totals["latency_cycles"], totals["inferences_per_s"]) == \
        (3.0, "measured", 333333.333)
    assert [r["time_us"] for r in report.rows] == [1.0, None, 2.0]
    assert "accelerator time at 100 MHz (user): 0.003 ms per inference (measured cycles), 333,333.33 inferences/s" in \
        report.format().splitlines()


def test_report_at_another_clock():
    """--clock-mhz: the same report with its times at the user's clock, labelled so, kept through JSON."""
    report = Report("m", "cfg", "tsim", [_row("a", "accel", 2560, 100), _row("c", "accel", 1280, None)],
                    macs_per_cycle=256, clock_mhz=100.0, clock_source="model", clock_note="clock model")
    report.rows[0]["predicted"], report.rows[1]["predicted"] = 100, 300  # one layer unmeasured: predicted cycles
    fast = report.with_clock(250.0, "user", "--clock-mhz")
    assert (fast.clock_mhz, fast.clock_source, fast.clock_note) == (250.0, "user", "--clock-mhz")
    assert [r["time_us"] for r in fast.rows] == [0.4, 1.2] and fast.totals["latency_cycles"] == "predicted"
    assert fast.totals["latency_us"] == 1.6 and fast.totals["inferences_per_s"] == 625000.0
    back = Report.from_dict(json.loads(json.dumps(fast.to_dict())))
    assert (back.clock_mhz, back.clock_source, back.totals["latency_us"]) == (250.0, "user", 1.6)
    assert "accelerator time at 250 MHz (user): 0.002 ms per inference (predicted cycles), 625,000.00 " \
        "inferences/s" in fast.format().splitlines() and "clock: --clock-mhz" in fast.format().splitlines()


def test_bounds_one_rule_for_layers_and_runs():
    from vta.compiler.report import layer_bound, module_demand, module_occupancy, run_bound
    # occupancy counts the waits; a bound weighs work and memory waits, not token waits; fetch never bounds a layer
    classes = {"fetch": {"busy": 900, "wait_token": 0, "wait_mem": 0},
               "load": {"busy": 100, "wait_token": 0, "wait_mem": 300},
               "compute": {"busy": 350, "wait_token": 10, "wait_mem": 0}, "store": {"busy": 5}}
    assert module_occupancy(classes) == {"fetch": 900, "load": 400, "compute": 360, "store": 5}
    assert layer_bound(module_demand(classes)) == "load" and module_demand(classes)["compute"] == 350
    streaming = {"load": {"busy": 295392, "wait_token": 0, "wait_mem": 7738},   # a decode step's linear layer
                 "compute": {"busy": 15950, "wait_token": 282027, "wait_mem": 6653}}
    assert layer_bound(module_occupancy(streaming)) == "compute" and layer_bound(module_demand(streaming)) == "load"
    assert layer_bound({"fetch": 3}) == "" and run_bound([]) == ""
    # a run's bound bounds the most cycles, not the most layers
    assert run_bound([("compute", 680), ("load", 834), ("", 50), ("load", 1075)]) == "load"
    assert run_bound([("compute", 3000), ("load", 834), ("load", 1075)]) == "compute"


def test_vta_report_clock_mhz(tmp_path, capsys):
    """vta report RUN --clock-mhz MHZ: the saved run's times at the user's clock; a clock out of range is bad input."""
    from vta.cli import main
    report = Report("m", "cfg", "tsim", [_row("a", "accel", 2560, 100)], macs_per_cycle=256, clock_mhz=32.38,
                    clock_source="place-and-route", clock_note="nextpnr-0.11.1 on LFE5U-85F seed 1")
    path = tmp_path / "run.json"
    report.write_json(path)
    assert main(["report", str(path), "--clock-mhz", "50", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["clock_mhz"], data["clock_source"], data["totals"]["latency_us"]) == (50.0, "user", 2.0)
    assert main(["report", str(path)]) == 0
    assert "accelerator time at 32.38 MHz (place-and-route): 0.003 ms per inference" in capsys.readouterr().out
    assert main(["report", str(path), "--clock-mhz", "0"]) == 2
    assert "--clock-mhz 0: the clock must be between 1 and 10000 MHz" in capsys.readouterr().err


def test_a_number_too_wide_for_its_column_gets_an_si_prefix_not_cut():
    """The 120-column table's MACs column: ResNet-18's total (1,813,561,344) read ``1,81..3,344``."""
    from vta.compiler.report import _cell
    assert _cell("1,813,561,344", 11) == "    1.814 G"
    assert _cell("12,345", 11) == "     12,345"
    assert _cell("blocks.11.attn.qkv", 12) == "block..n.qkv"


def test_the_reasons_say_what_their_microseconds_are():
    """--reasons ends with the partitioner's rates and clock, which are partition.py's constants."""
    from vta.compiler.lowering import partition as P
    from vta.compiler.report import _REASONS_NOTE
    note = _REASONS_NOTE.format(mhz=100.0)
    assert f"plus {P.ACCEL_LAUNCH_US:g} us a launch" in note and f"{P.CPU_MACS_PER_US:,.0f} MACs" in note
    assert f"{P.CPU_ELEMS_PER_US:g} elements per us" in note and f"{P.CONVERT_BYTES_PER_US:,.0f} bytes" in note
    rates = P.CPU_ELEMS_PER_US_BY_OP
    assert f"softmax {rates['QSoftmax']:,.0f}, the LayerNorm {rates['QLayerNorm']:,.0f}" in note
    assert f"copies {min(rates['Slice'], rates['Transpose']):,.0f}-{rates['Reshape']:,.0f}" in note
    assert "CLOCK_MHZ (100 MHz, not the design clock above)" in note
