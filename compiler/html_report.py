"""The HTML view of a run report: one self-contained file (plotly.js embedded, no network) a person opens in a browser.

:func:`run_html` renders a :class:`~.report.Report` (a run's, or one read back from its JSON by
:func:`~.report.load_report`, so ``vta report RUN.json --html FILE`` works on saved runs) as a page with: a summary
(the slowest layer and what bounds it, totals, host and accelerator time), a per-layer table sortable by any column
(names, shapes, where it ran, MACs, cycles measured and predicted, utilization, bound, DRAM bytes, energy, host
milliseconds, why it runs where it does), per-layer bars of cycles and MACs coloured by where each layer ran (CPU
layers included), where the accelerator's cycles went per module (from the core's counters, tsim only), the roofline
with every figure in the hover instead of printed labels, energy by component (one distinct colour each), the error
against the float model (and which float model it was measured against), and the config.

The page helpers (:func:`page`, :func:`html_table`, :func:`plotly_div`) are shared with the sweep explorer
(:mod:`vta.sweep.html`). Every figure on the page says what it was measured against; absent figures are ``-``.
"""
from __future__ import annotations

import html
import json
import math
from os import PathLike
from typing import Any, Iterable, Mapping, Sequence

from vta.counters import CYCLE_CLASSES, MODULES
from vta.fileio import atomic_write_text

from .report import BYTE_COLUMNS, ENERGY_PARTS, Report
from .report import row_bound as _bound

__all__ = ["run_html", "write_run_html", "page", "html_table", "plotly_div", "json_script", "ENERGY_COLOURS",
           "WHERE_COLOURS"]

ENERGY_COLOURS = {"mac": "#1f77b4", "alu": "#17becf", "sram_uop": "#ff7f0e", "sram_inp": "#2ca02c",
                  "sram_wgt": "#9467bd", "sram_acc": "#8c564b", "sram_out": "#e377c2", "dram": "#d62728",
                  "cpu": "#7f7f7f"}
"""One distinct colour per energy component (plotly's D3 palette): no two SRAM buffers in shades of one hue."""
WHERE_COLOURS = {"accel": "#1f77b4", "cpu": "#7f7f7f", "gpu": "#bcbd22", "simt": "#17becf"}
WHERE_LABELS = {"accel": "accelerator", "cpu": "CPU", "gpu": "GPU", "simt": "GPU kernels (SIMT emulator)"}
CLASS_COLOURS = {"busy": "#2ca02c", "wait_token": "#ff7f0e", "wait_mem": "#d62728", "idle": "#c7c7c7"}

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1400px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 2px 6px; }
th { background: #f3f3f3; cursor: pointer; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td { vertical-align: top; } td.text { min-width: 5em; } td.long { min-width: 34em; }
.scroll { overflow-x: auto; }
tr.cpu td { color: #555; background: #fafafa; }
.note { color: #555; font-size: 0.9em; }
.summary li { margin: 0.2em 0; }
"""

_SORT_JS = """
function sortTable(th) {
  const table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
  const up = th.dataset.dir !== 'up'; th.dataset.dir = up ? 'up' : 'down';
  const key = td => { const v = td.dataset.v; return v === undefined ? td.textContent : v; };
  const rows = Array.from(body.rows);
  rows.sort((a, b) => {
    const x = key(a.cells[col]), y = key(b.cells[col]);
    const nx = parseFloat(x), ny = parseFloat(y);
    const r = (!isNaN(nx) && !isNaN(ny)) ? nx - ny
      : (isNaN(nx) === isNaN(ny) ? x.localeCompare(y) : (isNaN(nx) ? 1 : -1));
    return up ? r : -r;
  });
  rows.forEach(r => body.appendChild(r));
}
"""


def page(title: str, body: str, *, script: str = "") -> str:
    """A whole HTML document: ``title``, the ``body`` markup, plotly.js embedded (no network needed), the table
    sorter and ``script`` (run after the body)."""
    from plotly.offline import get_plotlyjs
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script><script>{_SORT_JS}</script></head>\n"
            f"<body>\n{body}\n<script>{script}</script>\n</body></html>\n")


def plotly_div(fig: Any, div_id: str) -> str:
    """``fig`` (a plotly figure) as a ``<div>`` drawn by the page's embedded plotly.js."""
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def html_table(head: Sequence[str], rows: Iterable[Sequence[Any]], *, table_id: str = "",
               row_classes: Sequence[str] | None = None, titles: Sequence[str] | None = None) -> str:
    """A table sortable by clicking a column's head. A cell is text, or a number (shown with thousands separators,
    sorted by value), or None (``-``, sorted last); ``titles`` are the heads' tooltips."""
    ident = f' id="{table_id}"' if table_id else ""
    cells = []
    for i, name in enumerate(head):
        tip = f' title="{html.escape(titles[i])}"' if titles and titles[i] else ""
        cells.append(f'<th onclick="sortTable(this)"{tip}>{html.escape(name)}</th>')
    out = [f"<table{ident}><thead><tr>{''.join(cells)}</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        out.append(f"<tr{cls}>" + "".join(_cell(v) for v in row) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _cell(value: Any) -> str:
    if value is None:
        return '<td class="num" data-v="">-</td>'
    if isinstance(value, bool):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, int):
        return f'<td class="num" data-v="{value}">{value:,}</td>'
    if isinstance(value, float):
        return f'<td class="num" data-v="{value!r}">{_fmt(value)}</td>'
    text = str(value)
    return f'<td class="{"long" if len(text) > 60 else "text"}">{html.escape(text)}</td>'


def _fmt(value: float) -> str:
    """A float with about four significant digits, thousands separated: 27,950, 1.28, 0.0123."""
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def _esc(text: Any) -> str:
    return html.escape(str(text))


# ---- the run report ------------------------------------------------------------------------------------------------
def _cycles(row: Mapping[str, Any]) -> tuple[float | None, str]:
    """A layer's cycles: measured (tsim) else the cycle model's, and which."""
    if row.get("cycles") is not None:
        return float(row["cycles"]), "tsim"
    if row.get("predicted") is not None:
        return float(row["predicted"]), "cycle model"
    return None, ""


def _dram_bytes(row: Mapping[str, Any]) -> int | None:
    values = [row.get(k) for k in BYTE_COLUMNS]
    return None if all(v is None for v in values) else int(sum(v or 0 for v in values))


def _summary(report: Report) -> str:
    """The page's opening list: what ran where, the slowest accelerator layer and its bound, the totals."""
    t = report.totals
    items = [f"{t['layers']} layers: {t['accel_layers']} on the accelerator, {t['layers'] - t['accel_layers']} on the "
             f"{report.target if report.target in ('cpu', 'gpu') else 'fallback (CPU)'}; {t['accel_macs']:,} of "
             f"{t['macs']:,} MACs on the accelerator"]
    timed = [(r, *_cycles(r)) for r in report.rows if r["where"] == "accel"]
    timed = [x for x in timed if x[1] is not None]
    if timed:
        row, cycles, source = max(timed, key=lambda x: x[1] or 0.0)
        share = 100 * (cycles or 0) / max(1.0, sum(x[1] or 0 for x in timed))
        util = f", {100 * row['util']:.0f}% of the GEMM core's peak" if row.get("util") is not None else ""
        items.append(f"slowest accelerator layer: <b>{_esc(row['layer'])}</b> ({_esc(row['op'])}"
                     f"{', ' + _esc(row['out_shape']) if row.get('out_shape') else ''}): {cycles:,.0f} cycles "
                     f"({source}), {share:.0f}% of the accelerator's cycles, bound by "
                     f"<b>{_esc(_bound(row)[0] or '-')}</b> ({_bound(row)[1] or '-'}){util}")
    clock = report.clock_mhz
    clock_source = getattr(report, "clock_note", "") or getattr(report, "clock_source", "") or \
        report.extra.get("clock_note") or report.extra.get("clock_source")
    clock_text = f"{clock:g} MHz" + (f" ({_esc(clock_source)})" if clock_source else " (the config's CLOCK_MHZ)")
    if t.get("cycles"):
        items.append(f"accelerator: {t['cycles']:,} cycles measured on {report.target}, {t['accel_ms_at_clock']} ms at "
                     f"{clock_text}; run bound by {_esc(t.get('bound') or '-')}")
    elif t.get("predicted"):
        items.append(f"accelerator: {t['predicted']:,} cycles predicted by the cycle model (no cycle-accurate run: "
                     f"target {report.target}), {t['predicted'] / clock / 1e3:.3f} ms at {clock_text}")
    if t.get("latency_us"):
        ips = f", {t['inferences_per_s']:,.1f} inferences/s" if t.get("inferences_per_s") else ""
        items.append(f"one inference: {t['latency_us']:,.3f} us of accelerator time at {clock_text} (from "
                     f"{_esc(t.get('latency_cycles') or 'its')} cycles; CPU layers not counted){ips}")
    if t.get("energy_uj"):
        static = t.get("energy_static_uj")
        items.append(f"energy per inference: {t['energy_uj']:,.3f} uJ dynamic ({_esc(report.tech)})" + (
            f"; static {static:,.3f} uJ ({report.static_mw:,.2f} mW over the accelerator time, analytical area "
            f"{report.area_clb:,.0f} CLB-equivalents); total {t['energy_total_uj']:,.3f} uJ" if static is not None
            else "; static energy not known (no area recorded in this report)"))
    host = f"host time: {t['ms']:,.1f} ms over all layers (wall clock of the simulation on this machine, not the " \
           f"accelerator's time)"
    if report.extra.get("build_seconds"):
        host += f"; building or loading the simulator took {report.extra['build_seconds']:,.2f} s, not in host ms"
    items.append(host)
    exact = report.extra.get("matches_integer_reference")
    if exact is not None:
        items.append("output " + ("matches the integer reference bit for bit" if exact else
                                  "<b>differs from the integer reference</b>"))
    return "<ul class=\"summary\">" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


LAYER_HEAD = ("#", "layer", "op", "input shape", "output shape", "where", "MACs", "cycles", "cycles from",
              "predicted", "time us", "util %", "bound", "DRAM bytes", "MACs/byte", "energy uJ", "host ms", "tiling",
              "why here")
LAYER_TITLES = ("order in the graph", "the node's name", "operator", "first input's shape", "output's shape",
                "where it ran", "multiply-accumulates", "cycles (measured on tsim, else the cycle model's)",
                "tsim: measured; cycle model: predicted", "the cycle model's cycles for this program",
                "microseconds at the design's clock (its cycles over the clock; accelerator layers)",
                "MACs over cycles x the GEMM core's MACs per cycle", "the module that held an instruction the most "
                "cycles (fetch excluded): from the core's counters where measured (tsim), else the cycle model's",
                "DMA bytes loaded and stored, all memory types",
                "operational intensity: MACs per DRAM byte", "dynamic energy, microjoules",
                "wall-clock milliseconds of the step on this machine (simulation time, not the accelerator's)",
                "the schedule's tiling", "why the partitioner put it here")


def layer_rows(report: Report) -> list[list[Any]]:
    """The per-layer table's cells (:data:`LAYER_HEAD`)."""
    out = []
    for i, r in enumerate(report.rows):
        cycles, source = _cycles(r)
        out.append([i, r["layer"], r["op"], r.get("in_shape") or None, r.get("out_shape") or None,
                    WHERE_LABELS.get(r["where"], r["where"]), r["macs"],
                    None if cycles is None else int(cycles), source or None, r.get("predicted"), r.get("time_us"),
                    None if r.get("util") is None else round(100 * r["util"], 1), _bound(r)[0] or None,
                    _dram_bytes(r), r.get("intensity"), r.get("energy_uj"), r.get("ms"), r.get("tiling") or None,
                    r.get("reason") or None])
    return out


def _layer_figure(report: Report) -> Any:
    """Per-layer bars: cycles (measured, else predicted) and MACs, coloured by where each layer ran, hover with its
    figures. CPU layers have no accelerator cycles; they show in the MACs panel."""
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=("cycles per layer (accelerator layers; tsim if measured, else the cycle "
                                        "model)", "MACs per layer (every layer, wherever it ran)"))
    names = [r["layer"] for r in report.rows]
    for where in dict.fromkeys(r["where"] for r in report.rows):
        sel = [i for i, r in enumerate(report.rows) if r["where"] == where]
        label = WHERE_LABELS.get(where, where)
        hover = [_hover(report.rows[i]) for i in sel]
        cyc = [_cycles(report.rows[i])[0] for i in sel]
        if any(c is not None for c in cyc):
            fig.add_bar(x=[names[i] for i in sel], y=cyc, name=f"{label}: cycles", marker_color=WHERE_COLOURS.get(
                where, "#9467bd"), hovertext=hover, hoverinfo="text", row=1, col=1, legendgroup=where)
        fig.add_bar(x=[names[i] for i in sel], y=[report.rows[i]["macs"] for i in sel], name=f"{label}: MACs",
                    marker_color=WHERE_COLOURS.get(where, "#9467bd"), hovertext=hover, hoverinfo="text", row=2,
                    col=1, legendgroup=where, opacity=0.85)
    fig.update_xaxes(categoryorder="array", categoryarray=names, tickangle=-60)
    fig.update_yaxes(title_text="cycles", row=1, col=1)
    fig.update_yaxes(title_text="MACs", row=2, col=1)
    fig.update_layout(height=560, margin={"t": 40, "b": 120}, barmode="group")
    return fig


def _hover(r: Mapping[str, Any]) -> str:
    cycles, source = _cycles(r)
    parts = [f"<b>{_esc(r['layer'])}</b> ({_esc(r['op'])}, {WHERE_LABELS.get(r['where'], r['where'])})"]
    if r.get("in_shape") or r.get("out_shape"):
        parts.append(f"{_esc(r.get('in_shape') or '?')} -> {_esc(r.get('out_shape') or '?')}")
    parts.append(f"MACs {r['macs']:,}")
    if cycles is not None:
        parts.append(f"cycles {cycles:,.0f} ({source})")
    if r.get("util") is not None:
        parts.append(f"utilization {100 * r['util']:.1f}%")
    bound, by = _bound(r)
    if bound:
        parts.append(f"bound by {_esc(bound)} ({by})")
    if _dram_bytes(r) is not None:
        parts.append(f"DRAM bytes {_dram_bytes(r):,}")
    if r.get("energy_uj") is not None:
        parts.append(f"energy {r['energy_uj']:.4g} uJ")
    parts.append(f"host {r.get('ms') or 0:,.2f} ms")
    return "<br>".join(parts)


def _module_figure(report: Report) -> Any | None:
    """Where the accelerator's cycles went: per module, its busy, waiting-on-a-token, waiting-on-memory and idle
    cycles summed over layers (tsim's counters); None without them."""
    breakdown = report.module_breakdown()
    if breakdown is None:
        return None
    import plotly.graph_objects as go
    fig = go.Figure()
    total = max(1, sum(breakdown["compute"].values()))
    for c in (*CYCLE_CLASSES, "idle"):
        values = [breakdown[m][c] for m in MODULES]
        fig.add_bar(y=list(MODULES), x=values, name=c.replace("_", " "), orientation="h",
                    marker_color=CLASS_COLOURS[c], text=[f"{100 * v / total:.0f}%" for v in values],
                    hovertemplate="%{y}: %{x:,} cycles " + c.replace("_", " ") + " (%{text})<extra></extra>")
    fig.update_layout(barmode="stack", height=260, margin={"t": 30}, xaxis_title="accelerator cycles (tsim "
                      "counters, all layers)", title="where the accelerator's cycles went, per module")
    return fig


def _roofline_figure(report: Report) -> Any:
    """The roofline: each accelerator layer a point (hover: its name and figures), the bandwidth and compute roofs;
    linear-in-log2 axes fitted to the points and the ridge."""
    import plotly.graph_objects as go
    points = report.roofline_points()
    rows = {r["layer"]: r for r in report.rows}
    peak, bus = report.macs_per_cycle, report.bus_bytes
    ridge = peak / bus
    xs = [p["intensity"] for p in points] or [ridge]
    lo, hi = min(min(xs), ridge) / 1.5, max(max(xs), ridge) * 1.5
    fig = go.Figure()
    fig.add_scatter(x=[lo, ridge, hi], y=[bus * lo, peak, peak], mode="lines", name=f"roofs: {bus} B/cycle bus, "
                    f"{peak} MACs/cycle", line={"color": "#d62728"}, hoverinfo="skip")
    for measured, symbol, label in ((True, "circle", "layers (tsim cycles)"), (False, "triangle-up",
                                                                               "layers (cycle model)")):
        sel = [p for p in points if p["measured"] is measured]
        if sel:
            fig.add_scatter(x=[p["intensity"] for p in sel], y=[p["macs_per_cycle"] for p in sel], mode="markers",
                            name=label, marker={"symbol": symbol, "size": 10, "color": "#1f77b4"},
                            hovertext=[_hover(rows[p["layer"]]) for p in sel], hoverinfo="text")
    cpu = [r for r in report.rows if r["where"] != "accel" and r["macs"]]
    if cpu:  # not on the roofline: no accelerator cycles or DRAM bytes; named so that they are not missed
        fig.add_annotation(text="not on the roofline (ran on the " + ", ".join(sorted({WHERE_LABELS.get(
            r["where"], r["where"]) for r in cpu})) + ", no accelerator cycles): " + ", ".join(
            f"{_esc(r['layer'])} ({r['macs']:,} MACs)" for r in cpu[:8]) + (" ..." if len(cpu) > 8 else ""),
            xref="paper", yref="paper", x=0, y=-0.22, showarrow=False, align="left", font={"size": 11})
    two = math.log10(2)  # ticks at powers of two, as the roofs are
    fig.update_xaxes(type="log", title="operational intensity (MACs per DRAM byte)", range=_log_range(lo, hi),
                     dtick=two, tickformat=".3~g")
    fig.update_yaxes(type="log", title="achieved MACs per cycle", dtick=two, tickformat=".3~g", range=_log_range(
        min([p["macs_per_cycle"] for p in points] + [bus * lo]) / 1.5, peak * 1.5))
    fig.update_layout(height=480, margin={"b": 110}, title=f"roofline ({report.config})")
    return fig


def _log_range(lo: float, hi: float) -> list[float]:
    return [math.log10(max(lo, 1e-9)), math.log10(max(hi, 1e-9))]


def _energy_figure(report: Report) -> Any | None:
    """Per-layer stacked energy by component (one distinct colour each); None without energies."""
    if not any(r.get("energy_uj") for r in report.rows):
        return None
    import plotly.graph_objects as go
    fig = go.Figure()
    names = [r["layer"] for r in report.rows]
    for part in ENERGY_PARTS:
        values = [r.get(f"energy_{part}_uj") or 0.0 for r in report.rows]
        if any(values):
            fig.add_bar(x=names, y=values, name=part.replace("_", " "), marker_color=ENERGY_COLOURS[part],
                        hovertemplate="%{x}: %{y:.4g} uJ " + part + "<extra></extra>")
    fig.update_layout(barmode="stack", height=420, margin={"b": 120}, yaxis_title="dynamic energy (uJ)",
                      title=f"energy by component ({report.tech})", xaxis={"tickangle": -60})
    return fig


def _accuracy(report: Report) -> str:
    acc = report.extra.get("accuracy")
    if not isinstance(acc, dict):
        return "<p class=\"note\">No accuracy was recorded for this run.</p>"
    head = ["output", "max error (LSB)", "mean error (LSB)", "max error, % of range", "mean error, % of range",
            "cosine", "top-1 agreement %", "top-5 agreement %"]
    rows = []
    for name, m in (acc.get("outputs") or {}).items():
        rows.append([name, m.get("max_abs_error_lsb"), m.get("mean_abs_error_lsb"), m.get("max_error_pct_of_range"),
                     m.get("mean_error_pct_of_range"), m.get("cosine"),
                     None if m.get("top1_agreement") is None else 100 * m["top1_agreement"],
                     None if m.get("top5_agreement") is None else 100 * m["top5_agreement"]])
        kept = m.get("kept_tokens")
        if isinstance(kept, dict):
            rows.append([f"{name}: the {kept.get('tokens')} of {kept.get('of')} positions where "
                         f"{kept.get('mask', 'the mask')} is 1",
                         kept.get("max_abs_error_lsb"), kept.get("mean_abs_error_lsb"),
                         kept.get("max_error_pct_of_range"), kept.get("mean_error_pct_of_range"), kept.get("cosine"),
                         None, None])
    out = f"<p>Measured against: <b>{_esc(acc.get('reference'))}</b>, on the run's input.</p>"
    out += html_table(head, rows, table_id="accuracy")
    lost = acc.get("where_lost")
    if isinstance(lost, list) and lost:
        out += ("<p>Where the error arises: the layers that lose most cosine similarity against the float model's "
                "same tensor, on the run's input.</p>")
        out += html_table(["layer", "op", "cosine of its inputs", "cosine of its output"],
                          [[e.get("node"), e.get("op"), e.get("cosine_in"), e.get("cosine_out")] for e in lost],
                          table_id="where_lost")
    cal = report.extra.get("calibration")
    if isinstance(cal, dict):
        from .report import format_calibration
        out += f"<p class=\"note\">{_esc(format_calibration(cal))}</p>"
    return out


def _config(report: Report) -> str:
    fields = dict(report.config_fields or {})
    rows: list[list[Any]] = [[k, v] for k, v in fields.items()]
    rows.append(["clock (MHz)", report.clock_mhz])
    for key, value in report.extra.items():
        if "clock" in key and key != "clock_mhz":
            rows.append([key, value if isinstance(value, (int, float)) else str(value)])
    rows.append(["technology file", report.tech or None])
    for key in ("requant", "fallback", "rtl_core", "compile_seconds", "run_seconds"):
        if key in report.extra:
            rows.append([key, report.extra[key]])
    return f"<p>{_esc(report.config)} (canonical name)</p>" + html_table(["field", "value"], rows,
                                                                         table_id="config")


def run_html(report: Report) -> str:
    """The run report as one self-contained HTML page (see the module's docstring)."""
    title = f"{report.model} on {report.target} ({report.config})"
    parts = [f"<h1>{_esc(title)}</h1>", _summary(report), "<h2>Layers</h2>",
             "<p class=\"note\">Click a column's head to sort by it (again to reverse); hover a head for its meaning. "
             "CPU layers are grey: they have MACs and host time but no accelerator cycles or DRAM bytes.</p>",
             '<div class="scroll">' + html_table(LAYER_HEAD, layer_rows(report), table_id="layers",
                                                 row_classes=["" if r["where"] == "accel" else "cpu"
                                                              for r in report.rows], titles=LAYER_TITLES) + "</div>",
             "<h2>Cycles and MACs per layer</h2>", plotly_div(_layer_figure(report), "fig-layers"),
             "<h2>Where the accelerator's cycles went</h2>"]
    modules = _module_figure(report)
    parts.append(plotly_div(modules, "fig-modules") if modules is not None else
                 f"<p class=\"note\">No per-module counters: this run was on {_esc(report.target)}; run on tsim for "
                 f"the core's busy and waiting cycles per module. The cycle model's bound per layer is in the "
                 f"table.</p>")
    parts += ["<h2>Roofline</h2>", plotly_div(_roofline_figure(report), "fig-roofline")]
    energy = _energy_figure(report)
    parts += ["<h2>Energy by component</h2>", plotly_div(energy, "fig-energy") if energy is not None else
              "<p class=\"note\">No energies in this report.</p>"]
    parts += ["<h2>Accuracy against the float model</h2>", _accuracy(report), "<h2>Config</h2>", _config(report)]
    return page(title, "\n".join(parts))


def write_run_html(report: Report, path: str | PathLike[str]) -> None:
    """Write :func:`run_html` of ``report`` to ``path``, atomically."""
    atomic_write_text(path, run_html(report))


def json_script(name: str, data: Any) -> str:
    """``const name = data;`` for a page's script (``</`` escaped so that data cannot close the script)."""
    return f"const {name} = " + json.dumps(data, default=str).replace("</", "<\\/") + ";\n"
