"""Tests for the HTML views: a run's report (vta.compiler.html_report) from a small run's JSON, parsed back; the
sweep explorer (vta.sweep.html) from a results database; both opened in a headless Chromium when one is installed."""
from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from vta.cli import main
from vta.compiler.html_report import LAYER_HEAD, run_html
from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.report import Report, build_report, load_report
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig


class _Page(HTMLParser):
    """What a page holds: tables (id -> head, rows of cell texts), the ids of plot divs, scripts with a src."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict[str, list]] = {}
        self.divs: list[str] = []
        self.sources: list[str] = []
        self.script_chars = 0
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id") or f"table{len(self.tables)}"
            self.tables[self._table] = {"head": [], "rows": []}
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "div" and a.get("id", "").startswith("fig-"):
            self.divs.append(a["id"] or "")
        elif tag == "script":
            self._in_script = True
            if a.get("src"):
                self.sources.append(a["src"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table:
            table = self.tables[self._table]
            (table["rows"] if table["head"] else table["head"]).extend([self._row] if table["head"] else self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._in_script:
            self.script_chars += len(data)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


@pytest.fixture(scope="module")
def report() -> Report:
    compiled = compile_model("tiny_cnn", VTAConfig(), calib=2)
    out = run(compiled, random_inputs(compiled.graph, 0), target="fsim")
    rep = build_report(compiled, out, model="tiny_cnn")
    rep.extra["accuracy"] = {"reference": "onnxruntime on the zoo model tiny_cnn", "outputs": {"output": {
        "max_abs_error_lsb": 1.0, "mean_abs_error_lsb": 0.5, "max_error_pct_of_range": 0.7,
        "mean_error_pct_of_range": 0.3, "cosine": 0.9999, "top1_agreement": 1.0, "top5_agreement": None}}}
    return rep


def test_run_page_from_saved_json(report, tmp_path):
    """The page of a saved run: one row per layer with its shapes and placement, the plots, the accuracy with what
    it was measured against, the config; plotly.js is embedded (no script fetched from anywhere)."""
    path = tmp_path / "run.json"
    report.write_json(path)
    page = _parse(run_html(load_report(path)))
    layers = page.tables["layers"]
    assert layers["head"] == list(LAYER_HEAD)
    assert [r[1] for r in layers["rows"]] == [r["layer"] for r in report.rows]
    conv = next(r for r in layers["rows"] if r[1] == "conv_7")
    assert conv[2:7] == ["QConv2d", "1x8x8x8", "1x16x4x4", "accelerator", "18,432"]
    assert {r[5] for r in layers["rows"]} == {"accelerator", "CPU"}
    assert page.divs == ["fig-layers", "fig-roofline", "fig-energy"]  # fsim: no per-module counters
    assert page.sources == [] and page.script_chars > 1_000_000  # plotly.js inline
    accuracy = page.tables["accuracy"]
    assert accuracy["rows"][0][:2] == ["output", "1"] and accuracy["rows"][0][-1] == "-"
    text = run_html(report)
    assert "Measured against: <b>onnxruntime on the zoo model tiny_cnn</b>" in text
    assert ["BUS_BYTES", "8"] in page.tables["config"]["rows"]
    assert "slowest accelerator layer: <b>" in text


def test_run_page_with_module_counters(report):
    """With the core's counters (a tsim run's), the page has the per-module plot."""
    rows = [dict(r) for r in report.rows]
    for r in rows:
        if r["where"] == "accel":
            r["cycles"] = 1000
            r.update({k: 100 for k in r if k.endswith(("_busy", "_wait_token", "_wait_mem"))})
    tsim = Report.from_dict({**report.to_dict(), "layers": rows, "target": "tsim"})
    page = _parse(run_html(tsim))
    assert page.divs == ["fig-layers", "fig-modules", "fig-roofline", "fig-energy"]


def test_vta_report_html(report, tmp_path, capsys):
    """vta report RUN.json --html FILE writes the page and says so; a wrong suffix is refused before any work."""
    run_json = tmp_path / "run.json"
    report.write_json(run_json)
    out_path = tmp_path / "run.html"
    assert main(["report", str(run_json), "--html", str(out_path)]) == 0
    assert f"wrote {out_path} (HTML report, self-contained)" in capsys.readouterr().out
    assert _parse(out_path.read_text()).tables["layers"]["rows"]
    assert main(["report", str(run_json), "--html", str(tmp_path / "run.htm")]) == 2
    assert "--html" in capsys.readouterr().err
    json.loads(run_json.read_text())  # untouched
