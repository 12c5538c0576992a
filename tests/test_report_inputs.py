"""Bad input to `vta report`: saved run reports whose fields have the wrong type or value, files that are not JSON
reports, and files that are not a sweep's results database (read-only: never written). Each is one exit-2 line (or
one sentence per problem) naming the file and the field; none is a traceback."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from vta.cli import main
from vta.compiler.report import COLUMNS, Report, ReportError, load_report
from vta.config import VTAConfig
from vta.sweep.store import ResultStore, StoreError

ROOT = Path(__file__).resolve().parent.parent
TECH = ROOT / "vta" / "tech" / "default_45nm.toml"


def _row(layer: str, where: str, macs: int, cycles: int | None) -> dict[str, Any]:
    row = dict.fromkeys(COLUMNS)
    row.update(layer=layer, op="QConv2d" if where == "accel" else "MaxPool", where=where, macs=macs, gemm_uops=10,
               alu_uops=5, cycles=cycles, predicted=cycles, bytes=100, ms=1.25, conversions=1, tiling="", reason="")
    return row


def _saved() -> dict[str, Any]:
    """A saved run report as vta run --report-json writes it, with accuracy, calibration and an int8 budget."""
    figures = {"max_abs_error_lsb": 2.0, "mean_abs_error_lsb": 0.5, "max_error_pct_of_range": 1.5,
               "mean_error_pct_of_range": 0.25, "cosine": 0.999, "top1_agreement": 1.0}
    extra = {"accuracy": {"reference": "onnxruntime on m.onnx", "outputs": {"y": figures},
                          "where_lost": [{"node": "conv", "op": "QConv2d", "cosine_in": 1.0, "cosine_out": 0.98}]},
             "calibration": {"source": "data.npz", "kind": "npz", "samples": 8, "method": "percentile",
                             "percentile": 99.9},
             "int8_budget": {"budget_points": 1.0, "kept": ["a"], "steps": [{"top1_agreement_pct": 90.0}],
                             "measured_on": "8 inputs", "cpu_us_of_kept": 12.5},
             "build_seconds": 0.5}
    report = Report("m.onnx", "cfg", "fsim", [_row("a", "accel", 2560, 100), _row("b", "cpu", 40, None)],
                    macs_per_cycle=256, clock_mhz=100.0, extra=extra, config_fields=VTAConfig().to_dict())
    return json.loads(json.dumps(report.to_dict()))


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_a_saved_report_round_trips(tmp_path, capsys):
    path = _write(tmp_path / "good.json", _saved())
    assert load_report(path).extra["accuracy"]["outputs"]["y"]["cosine"] == 0.999
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "y: max 2 LSB, mean 0.5 LSB; max 1.5% of range, mean 0.25%; cosine 0.999000" in out
    assert "int8 budget 1 points of top-1 agreement: kept a at int8 on the CPU" in out


def _set(path: str, value: Any) -> Any:
    """A change to a saved report: ``value`` at the dotted ``path`` (``layers.0.cycles``)."""
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return change


WRONG = [
    ("accuracy.outputs", 5, "accuracy.outputs must be an object (output name -> its figures), not 5"),
    ("accuracy", "x", 'accuracy must be an object, not "x"'),
    ("accuracy.outputs.y", [1], "accuracy.outputs.y must be an object of figures, not an array"),
    ("accuracy.outputs.y.cosine", "high", 'accuracy.outputs.y.cosine must be a number, not "high"'),
    ("accuracy.where_lost", {}, "accuracy.where_lost must be an array of layers, not an object"),
    ("accuracy.where_lost.0", 5, "accuracy.where_lost[0] must be an object, not 5"),
    ("accuracy.where_lost.0.cosine_in", "x", 'accuracy.where_lost[0].cosine_in must be a number, not "x"'),
    ("calibration.percentile", "x", 'calibration.percentile must be a number, not "x"'),
    ("int8_budget.kept", "a", 'int8_budget.kept must be an array of layer names, not "a"'),
    ("int8_budget.kept.0", 3, "int8_budget.kept[0] must be a string, not 3"),
    ("int8_budget.budget_points", "1", 'int8_budget.budget_points must be a number, not "1"'),
    ("int8_budget.steps.0", 90, "int8_budget.steps[0] must be an object, not 90"),
    ("build_seconds", "slow", 'build_seconds must be a number, not "slow"'),
    ("config_fields", "x", 'config_fields must be an object, not "x"'),
    ("model", 5, "model must be a string, not 5"),
    ("clock_source", False, "clock_source must be a string, not false"),
    ("clock_mhz", "fast", 'clock_mhz must be a number, not "fast"'),
    ("clock_mhz", 0, "clock_mhz must be above 0, not 0"),
    ("macs_per_cycle", 2.5, "macs_per_cycle must be an integer, not 2.5"),
    ("bus_bytes", -8, "bus_bytes must be above 0, not -8"),
    ("area_clb", float("nan"), "area_clb must be a finite number of magnitude at most 1e+18, not NaN"),
    ("layers.0.cycles", "many", 'layers[0].cycles must be a number, not "many"'),
    ("layers.0.cycles", 10 ** 400, "layers[0].cycles must be a finite number of magnitude at most 1e+18, not 1000"),
    ("layers.1.ms", float("inf"), "layers[1].ms must be a finite number of magnitude at most 1e+18, not Infinity"),
    ("layers.0.macs", -5, "layers[0].macs must be 0 or more, not -5"),
    ("layers.0.gemm_uops", None, "layers[0].gemm_uops must be a number, not null (or missing)"),
    ("layers.0.where", True, "layers[0].where must be a string, not true"),
    ("layers.0.tiling", 3, "layers[0].tiling must be a string, not 3"),
]


@pytest.mark.parametrize("field, value, problem", WRONG, ids=[f"{w[0]}={w[1]!r}"[:40] for w in WRONG])
def test_a_field_of_the_wrong_type_or_value_is_refused_naming_the_file_and_the_field(tmp_path, capsys, field, value,
                                                                                     problem):
    """A saved report's field that no vta run writes: ReportError naming the file and the field, exit 2 when
    rendered, compared (it raised AttributeError or "argument of type 'int' is not iterable") or re-costed."""
    data = _saved()
    _set(field, value)(data)
    path = _write(tmp_path / "bad.json", data)
    good = _write(tmp_path / "good.json", _saved())
    with pytest.raises(ReportError) as info:
        load_report(path)
    message = str(info.value)
    if problem.endswith("not 1000"):  # a 401-digit integer is cut to 60 characters
        problem = problem[:-4] + "1" + "0" * 56 + "..."
    assert message == f"{path}: not a run report as vta run --report-json writes one (1 problem):\n  - {problem}"
    for argv in (["report", str(path)], ["report", str(good), str(path)], ["report", str(path), "--html",
                                                                           str(tmp_path / "r.html")],
                 ["report", str(path), "--tech", str(TECH)]):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == f"vta: error: {message}\n"
    assert not (tmp_path / "r.html").exists()


def test_every_problem_is_counted_and_the_first_ten_listed(tmp_path):
    data = _saved()
    data["layers"] = [{**data["layers"][0], "layer": f"l{i}", "cycles": "many"} for i in range(12)]
    with pytest.raises(ReportError) as info:
        Report.from_dict(data, source="r.json")
    lines = str(info.value).splitlines()
    assert lines[0] == "r.json: not a run report as vta run --report-json writes one (12 problems):"
    assert lines[1:] == [f'  - layers[{i}].cycles must be a number, not "many"' for i in range(10)] + \
        ["  - and 2 more"]


def test_accuracy_measured_on_non_finite_outputs_and_partial_figures_still_render(tmp_path, capsys):
    """NaN is what accuracy_vs_float records for an output holding NaN or infinities; a figure left out prints -."""
    data = _saved()
    data["accuracy"]["outputs"]["y"] = {"cosine": float("nan"), "max_error_pct_of_range": float("nan"),
                                        "top1_agreement": None}
    data["accuracy"]["where_lost"] = [{"node": "conv", "op": "QConv2d"}]
    data["int8_budget"] = {"kept": []}
    path = _write(tmp_path / "nan.json", data)
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\n  y: max nan% of range, mean -%; cosine nan\n" in out and "conv\n    (QConv2d) - -> -\n" in out
    assert "int8 budget - points of top-1 agreement: kept no layer at int8" in out
    assert main(["report", str(path), str(path)]) == 0


def test_a_report_that_is_not_utf8_or_nested_too_deeply_is_refused_naming_it(tmp_path, capsys):
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"model": "\xff"}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    expected = {latin: f"{latin}: not UTF-8 text (byte 0xff at position 11); a run report is JSON written by vta run "
                       f"--report-json",
                deep: f"{deep}: nested too deeply to read (arrays or objects inside one another past Python's "
                      f"recursion limit); a run report is JSON written by vta run --report-json"}
    for path, message in expected.items():
        with pytest.raises(ReportError) as info:
            load_report(path)
        assert str(info.value) == message
        assert main(["report", str(path)]) == 2
        assert capsys.readouterr().err == f"vta: error: {message}\n"


def test_tech_on_a_report_whose_config_fields_are_not_a_config_names_the_file(tmp_path, capsys):
    data = _saved()
    data["config_fields"] = {"LOG_BLOCK": 99}
    path = _write(tmp_path / "cfg.json", data)
    assert main(["report", str(path)]) == 0  # rendering does not need the config
    capsys.readouterr()
    assert main(["report", str(path), "--tech", str(TECH)]) == 2
    assert capsys.readouterr().err == (f"vta: error: {path}: config_fields is not a valid config (LOG_BLOCK must be "
                                       f"between 2 and 6, not 99), so the energy cannot be computed again\n")


# ---- vta report SWEEP.sqlite --html FILE: read-only ----------------------------------------------------------------
def _sqlite(path: Path, *statements: str) -> Path:
    db = sqlite3.connect(path)
    with db:
        for sql in statements:
            db.execute(sql)
    db.close()
    return path


def _not_databases(tmp_path: Path) -> dict[Path, str]:
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    text = tmp_path / "text.sqlite"
    text.write_text("my notes, not a database\n" * 100)
    return {
        empty: "it holds no tables (an empty file?)",
        _sqlite(tmp_path / "foo.sqlite", "CREATE TABLE foo (x)"): "it has no table points (its tables: foo)",
        _sqlite(tmp_path / "other.sqlite", "CREATE TABLE points (x)", "CREATE TABLE bar (y)"):
            "its table points lacks the columns design, model, mode, status",
        text: "(file is not a database)",
    }


def test_a_file_that_is_not_a_sweep_database_is_refused_and_left_unchanged(tmp_path, capsys):
    """It was given a points table (and exit 0): the report must never write into its input."""
    for db, why in _not_databases(tmp_path).items():
        before = db.read_bytes()
        out = tmp_path / "out.html"
        assert main(["report", str(db), "--html", str(out)]) == 2
        sep = " " if why.startswith("(") else ": "
        assert capsys.readouterr().err == f"vta: error: {db}: not a results database of vta sweep{sep}{why}\n"
        assert db.read_bytes() == before and not out.exists()
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(db.name)) == [db.name]  # no -wal


def test_a_sweep_database_is_read_without_being_written(tmp_path, capsys):
    db = tmp_path / "s.sqlite"
    with ResultStore(db) as store:
        store.put({"design": "d1", "model": "tiny_cnn", "mode": "model", "status": "failed", "error": "why"})
    before = db.read_bytes()
    db.chmod(0o444)
    try:
        assert main(["report", str(db), "--html", str(tmp_path / "s.html")]) == 0
    finally:
        db.chmod(0o644)
    assert capsys.readouterr().out == f"wrote {tmp_path / 's.html'} (sweep explorer, HTML, self-contained)\n"
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s.html", "s.sqlite"]
    with ResultStore(db, readonly=True) as store:
        assert [(r["design"], r["error"]) for r in store.rows()] == [("d1", "why")]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.put({"design": "d2", "model": "tiny_cnn", "mode": "model", "status": "ok"})


def test_an_older_database_reads_its_missing_columns_as_none_and_bad_json_is_refused(tmp_path):
    db = _sqlite(tmp_path / "old.sqlite", "CREATE TABLE points (id INTEGER PRIMARY KEY, design TEXT, model TEXT, "
                                          "mode TEXT, status TEXT, config TEXT)",
                 "INSERT INTO points (design, model, mode, status, config) VALUES ('d', 'm', 'model', 'ok', "
                 "'{\"LOG_BLOCK\": 4}')")
    with ResultStore(db, readonly=True) as store:
        (row,) = store.rows()
    assert row["config"] == {"LOG_BLOCK": 4} and row["accuracy"] is None and row["layers"] is None
    _sqlite(db, "INSERT INTO points (design, model, mode, status, config) VALUES ('e', 'm', 'model', 'ok', '[1')")
    with ResultStore(db, readonly=True) as store, pytest.raises(StoreError) as info:
        store.rows()
    assert str(info.value) == (f"{db}: row 2 (e): column config is not a JSON object, as a results database of vta "
                               f"sweep holds")
