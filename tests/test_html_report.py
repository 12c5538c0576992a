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


# ---- the sweep explorer ---------------------------------------------------------------------------------------------
def _sweep_rows() -> list[dict]:
    """Rows as a results database holds them: two models, four designs (two with identical figures), one failed."""
    def row(design: str, model: str, block: int, area: float, ips: float, **extra) -> dict:
        return {"design": design, "model": model, "mode": "model", "status": "ok", "error": None,
                "config": {"LOG_BLOCK": block, "BUS_BYTES": 8}, "knobs": {"policy": "auto"}, "config_name": design,
                "area_clb": area, "lut": 100, "ff": 100, "dsp": 10, "bram": 1.0, "inferences_per_s": ips,
                "latency_us": 1e6 / ips, "energy_uj": 5.0, "energy_total_uj": 6.0, "cycles": 1000, "cpu_us": 1.0,
                "layers": [{"layer": "conv_1", "op": "QConv2d", "where": "accel", "cycles": 900, "bound": "load",
                            "macs": 4096, "energy_uj": 4.0},
                           {"layer": "gemm_2", "op": "QDense", "where": "cpu", "macs": 100, "cpu_us": 1.0,
                            "energy_uj": 1.0}], **extra}
    rows = []
    for model in ("m1", "m2"):
        rows += [row("1x8_a", model, 3, 1000.0, 500.0), row("1x8_b", model, 3, 1000.0, 500.0),
                 row("1x16", model, 4, 2000.0, 900.0)]
    rows.append({"design": "bad", "model": "m1", "mode": "model", "status": "failed", "config": {"LOG_BLOCK": 9},
                 "knobs": {"policy": "auto"}, "error": "invalid config: LOG_BLOCK=9 is too large"})
    return rows


def test_sweep_page():
    """The explorer holds every ok point (and the all-models suite), the swept parameters, the failed point with
    its error, and the objectives named as the sweep's tables name them."""
    from vta.sweep.html import sweep_html
    from vta.sweep.pareto import METRICS, swept_parameters
    rows = _sweep_rows()
    assert swept_parameters(rows) == {"LOG_BLOCK": ["3", "4", "9"]}
    text = sweep_html(rows, title="sweep t")
    page = _parse(text)
    assert page.tables["failed"]["rows"] == [["bad", "m1", "model", "failed", "invalid config: LOG_BLOCK=9 is too "
                                                                              "large"]]
    data = json.loads(text.split("const DATA = ", 1)[1].split(";\n", 1)[0])
    assert [(p["design"], p["model"]) for p in data["points"]] == [
        ("1x8_a", "m1"), ("1x8_b", "m1"), ("1x16", "m1"), ("1x8_a", "m2"), ("1x8_b", "m2"), ("1x16", "m2"),
        ("1x8_a", "all models"), ("1x8_b", "all models"), ("1x16", "all models")]
    suite = data["points"][-1]
    assert suite["figures"]["latency_us"] == pytest.approx(2 * 1e6 / 900.0)
    assert suite["figures"]["inferences_per_s"] == pytest.approx(450.0)
    assert {k: m["label"] for k, m in data["metrics"].items()} == {k: v[2] for k, v in METRICS.items()}
    assert data["points"][0]["layers"][0]["cycles"] == 900


def test_vta_report_sweep_html(tmp_path, capsys):
    """vta report SWEEP.sqlite --html FILE writes the explorer of a saved database; without --html it says what to
    give."""
    from vta.sweep.store import ResultStore
    db = tmp_path / "s.sqlite"
    with ResultStore(db) as store:
        for r in _sweep_rows():
            store.put(r)
    assert main(["report", str(db), "--html", str(tmp_path / "s.html")]) == 0
    assert "sweep explorer" in capsys.readouterr().out
    assert "const DATA = " in (tmp_path / "s.html").read_text()
    assert main(["report", str(db)]) == 2
    assert "give --html FILE" in capsys.readouterr().err


# ---- in a real browser ----------------------------------------------------------------------------------------------
def _chromium() -> str | None:
    import shutil
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _open(browser: str, url: str) -> tuple[str, list[str]]:
    """The DOM of ``url`` after its scripts ran in headless Chromium, and the console messages it logged (our pages
    log nothing, so any is an error: an exception, a failed load, a plotly warning)."""
    import subprocess
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--virtual-time-budget=10000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def test_pages_render_in_chromium(report, tmp_path):
    """Both pages open in headless Chromium without a console message and their plots render (plotly's SVG roots
    in every figure's div); the explorer opens a linked design's per-layer detail. Skipped where no chromium is
    installed (apt-get install chromium; .ci/run installs it)."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    from vta.compiler.html_report import write_run_html
    from vta.sweep.html import write_sweep_html
    write_run_html(report, tmp_path / "run.html")
    write_sweep_html(_sweep_rows(), tmp_path / "sweep.html")
    dom, console = _open(browser, (tmp_path / "run.html").as_uri())
    assert console == []
    for fig in ("fig-layers", "fig-roofline", "fig-energy"):
        after = dom.split(f'id="{fig}"', 1)[1]
        assert 'class="main-svg"' in after.split('<h2>', 1)[0], fig
    assert dom.count('class="main-svg"') >= 6  # plotly draws two SVG layers per figure
    dom, console = _open(browser, (tmp_path / "sweep.html").as_uri() + "#design=1x16&model=m1")
    assert console == []
    pareto = dom.split('id="fig-pareto"', 1)[1].split("</div></div></div>", 1)[0]
    assert 'class="main-svg"' in pareto and "scatterlayer" in pareto
    assert 'id="detail-layers"' in dom and "conv_1" in dom.split('id="detail-layers"', 1)[1]
    assert 'id="designs-table"' in dom


def test_vta_sweep_html(tmp_path, capsys):
    """vta sweep FILE --html PAGE writes the explorer beside the database and the plots, names it last, and defines
    'all models' in its text; a wrong suffix is refused before any work."""
    from pathlib import Path
    small = Path(__file__).resolve().parent.parent / "scripts" / "sweeps" / "small.toml"
    page = tmp_path / "s.html"
    argv = ["sweep", str(small), "--db", str(tmp_path / "s.sqlite"), "--plot-dir", str(tmp_path / "plots"),
            "--workers", "0", "--no-progress"]
    assert main(argv + ["--html", str(tmp_path / "s.htm")]) == 2
    assert "--html" in capsys.readouterr().err and not (tmp_path / "s.sqlite").exists()
    assert main(argv + ["--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "all models: one inference of each of tiny_cnn, mini_resnet in sequence" in out
    assert out.rstrip().endswith(f"wrote {page} (sweep explorer, HTML, self-contained)")
    data = json.loads(page.read_text().split("const DATA = ", 1)[1].split(";\n", 1)[0])
    assert len([p for p in data["points"] if p["model"] == "all models"]) == 3
    assert all(p["layers"] for p in data["points"] if p["model"] != "all models")
    assert _parse(page.read_text()).tables["failed"]["rows"][0][3] == "failed"
