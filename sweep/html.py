"""The sweep explorer: one self-contained HTML page (plotly.js embedded, no network) of a sweep's results database.

:func:`sweep_html` turns the rows of a :class:`~.store.ResultStore` into a page with: the Pareto front of each
objective of :data:`.pareto.METRICS` against area (the same objectives, columns and axis names as the sweep's text
tables), every measured design drawn (designs with identical figures are spread a little along the area axis and
the hover says how many share them), the points coloured by any swept parameter and filtered by the values of each,
a hover with the design's fields and figures, a click showing the design's per-layer breakdown (the ``layers`` column:
where each layer ran, its cycles, bound, MACs, energy), a sortable table of the designs shown, and every failed or
timed-out point with its error. ``all models`` (:data:`.pareto.SUITE`) is one inference of each model in sequence:
latency and energy summed, inferences/s = 1e6 / the summed latency in microseconds; only designs measured ok on every
model are in it.

``vta sweep FILE --html FILE`` and ``vta report SWEEP.sqlite --html FILE`` write it; ``PAGE#design=NAME&model=M``
opens that design's detail.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from vta.compiler.html_report import ENERGY_COLOURS, html_table, json_script, page
from vta.fileio import atomic_write_text

from .pareto import AREA, METRICS, SUITE, json_key, suite_rows, swept_parameters
from .store import ResultStore

__all__ = ["sweep_html", "write_sweep_html", "write_sweep_html_from_db", "FIGURES"]

FIGURES = {"area_clb": "area (CLB-equivalents)", "inferences_per_s": "inferences/s", "latency_us": "latency (us)",
           "cycles": "accelerator cycles", "cpu_us": "CPU time (us)", "utilization": "utilization",
           "energy_uj": "dynamic energy (uJ)", "energy_total_uj": "energy, static included (uJ)",
           "lut": "LUT", "ff": "FF", "dsp": "DSP", "bram": "BRAM (RAMB36)", "bound": "bound by",
           "accel_layers": "accelerator layers", "cpu_layers": "CPU layers", "clock_mhz": "clock (MHz)",
           "clock_source": "clock from", "critical_unit": "critical path in", "area_from": "area from"}
"""Column -> its name in hovers and tables; a column a row lacks (an older database) is left out."""


def _point(r: dict[str, Any], params: Sequence[str]) -> dict[str, Any]:
    """The page's record of one ok row: its design, model, parameters, figures and layers."""
    fields = {**(r.get("config") or {}), **(r.get("knobs") or {})}
    return {"design": r["design"], "model": r["model"], "params": {p: json_key(fields.get(p, "-")) for p in params},
            "figures": {k: r.get(k) for k in FIGURES if r.get(k) is not None},
            "layers": r.get("layers") or []}


def sweep_html(rows: Sequence[dict[str, Any]], *, title: str = "sweep") -> str:
    """The explorer page of a sweep's ``rows`` (:meth:`.store.ResultStore.rows`: every mode and status)."""
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    models = list(dict.fromkeys(r["model"] for r in ok))
    params = swept_parameters(rows)
    points = [_point(r, list(params)) for r in ok]
    modes = sorted({r["mode"] for r in rows})
    if len(models) > 1:
        for mode in modes:
            mine = [r for r in ok if r["mode"] == mode]
            by_design = {r["design"]: r for r in mine}
            for s in suite_rows(mine, models):
                base = by_design[s["design"]]
                points.append(_point({**base, **s, "layers": []}, list(params)))
    data = {"points": points, "params": params, "models": models + ([SUITE] if len(models) > 1 else []),
            "metrics": {k: {"column": c, "maximize": m, "label": label} for k, (c, m, label) in METRICS.items()},
            "area": {"column": AREA[0], "label": AREA[1]}, "figures": FIGURES, "suite": SUITE,
            "energyColours": ENERGY_COLOURS}
    body = [f"<h1>{_esc(title)}</h1>",
            f"<p>{len({r['design'] for r in rows})} designs x {len(models)} models, mode {', '.join(modes)}: "
            f"{len(ok)} points ok, {len(failed)} failed or timed out (listed at the end). A design is on the front "
            f"when no other shown design has at most its area and a better objective. <b>{SUITE}</b>: one "
            f"inference of each model in sequence (latency and energy summed; inferences/s = 1e6 / the summed "
            f"latency in us); only designs ok on every model.</p>",
            '<div id="controls"></div>', '<div id="fig-pareto" style="height:560px"></div>',
            '<p class="note" id="shown"></p>',
            "<h2>Clicked design</h2>", '<div id="detail"><p class="note">Click a point to see the design\'s fields '
                                       'and its per-layer breakdown.</p></div>',
            "<h2>Designs shown</h2>", '<div id="designs"></div>',
            "<h2>Failed and timed-out points</h2>", _failed_table(failed)]
    return page(title, "\n".join(body), script=json_script("DATA", data) + _script())


def _esc(text: Any) -> str:
    import html
    return html.escape(str(text))


def _failed_table(failed: Sequence[dict[str, Any]]) -> str:
    if not failed:
        return '<p class="note">None: every point was measured.</p>'
    return html_table(["design", "model", "mode", "status", "error"],
                      [[r["design"], r["model"], r["mode"], r["status"], r.get("error") or ""] for r in failed],
                      table_id="failed")


def write_sweep_html(rows: Sequence[dict[str, Any]], path: str | os.PathLike[str], *, title: str = "sweep") -> None:
    """Write :func:`sweep_html` of ``rows`` to ``path``, atomically."""
    atomic_write_text(path, sweep_html(rows, title=title))


def write_sweep_html_from_db(db: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """The explorer of the results database ``db`` written to ``path`` (``vta report SWEEP.sqlite --html FILE``).
    ``db`` is opened read-only: :class:`~.store.StoreError` (naming it) when it is not a sweep's, and never changed."""
    with ResultStore(db, readonly=True) as store:
        rows = store.rows()
    write_sweep_html(rows, path, title=f"sweep {os.path.splitext(os.path.basename(os.fspath(db)))[0]}")


def _script() -> str:
    """The explorer's script (explorer.js beside this module: controls, the Pareto plot, the click detail)."""
    return (Path(__file__).parent / "explorer.js").read_text()
