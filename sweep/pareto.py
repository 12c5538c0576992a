"""Pareto frontiers of sweep results: inferences/s against area, energy per inference against area.

A design is on the frontier when no other design is at least as good on both axes and better on one (smaller area;
more inferences/s, or less energy). Of designs with identical values on both axes only the first is kept.

Over several models, a design's ``suite`` figures are one inference of each model in sequence: latency and energy
summed; only designs measured ``ok`` on every model enter the suite.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from vta.fileio import atomic_path

__all__ = ["frontier", "suite_rows", "frontier_table", "plot_frontiers", "swept_parameters", "json_key", "figure",
           "METRICS", "SUITE"]

SUITE = "all models"
"""The model name of suite rows (:func:`suite_rows`)."""
METRICS = {
    "throughput": ("inferences_per_s", True, "inferences/s"),
    "energy": ("energy_total_uj", False, "energy per inference, static included (uJ)"),
}
"""Plot name -> (column, larger is better, axis label); the x axis is always ``area_clb``."""
AREA = ("area_clb", "area (CLB-equivalents, 7-series)")


def frontier(rows: Iterable[dict[str, Any]], x: str, y: str, *, maximize_y: bool) -> list[dict[str, Any]]:
    """The rows not dominated in (smaller ``x``, larger ``y`` when ``maximize_y`` else smaller ``y``), sorted by
    ``x``; rows missing either value are ignored."""
    sign = -1 if maximize_y else 1
    valid = [r for r in rows if r.get(x) is not None and r.get(y) is not None]
    ordered = sorted(enumerate(valid), key=lambda item: (item[1][x], sign * item[1][y], item[0]))
    out: list[dict[str, Any]] = []
    best: float | None = None
    for _, row in ordered:
        value = sign * row[y]
        if best is None or value < best:
            out.append(row)
            best = value
    return out


def suite_rows(rows: Iterable[dict[str, Any]], models: Sequence[str]) -> list[dict[str, Any]]:
    """One row per design measured ``ok`` on every one of ``models``: its area columns, the summed
    ``latency_us``, ``energy_uj``, ``energy_total_uj`` (None when a model's row lacks it) and ``cycles``,
    ``inferences_per_s`` = 1e6 / latency; model :data:`SUITE`."""
    by_design: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["status"] == "ok":
            by_design.setdefault(r["design"], {})[r["model"]] = r
    out = []
    for per_model in by_design.values():
        if not all(m in per_model for m in models):
            continue
        first = per_model[models[0]]
        latency = sum(per_model[m]["latency_us"] for m in models)
        row = {k: first[k] for k in ("design", "config_name", "lut", "ff", "dsp", "bram", "area_clb")}
        row.update({k: first.get(k) for k in ("clock_mhz", "clock_source", "critical_unit")})
        row.update(model=SUITE, status="ok", latency_us=latency, inferences_per_s=1e6 / latency if latency else None,
                   energy_uj=sum(per_model[m]["energy_uj"] for m in models),
                   energy_total_uj=_total(per_model[m].get("energy_total_uj") for m in models),
                   cycles=sum(per_model[m]["cycles"] for m in models))
        out.append(row)
    return out


def _total(values: Iterable[float | None]) -> float | None:
    """The sum of ``values``; None when any is None."""
    items = list(values)
    return None if any(v is None for v in items) else sum(v for v in items if v is not None)


def frontier_table(rows: Sequence[dict[str, Any]], metric: str) -> str:
    """A text table of frontier ``rows`` for ``metric`` (a key of :data:`METRICS`); figures in the one format of
    :func:`figure`, units in the heads."""
    column, _, label = METRICS[metric]
    head = (f"{'design':44s} {'area CLB':>9s} {'LUT':>7s} {'FF':>6s} {'DSP':>5s} {'BRAM':>6s} {'MHz':>6s} "
            f"{'critical path':<13s} {label:>26s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        value = r[column]
        mhz = "-" if r.get("clock_mhz") is None else f"{r['clock_mhz']:.1f}"
        lines.append(f"{r['design']:44s} {figure(r['area_clb']):>9s} {r['lut']:7,} {r['ff']:6,} {r['dsp']:5,} "
                     f"{r['bram']:6.1f} {mhz:>6s} {r.get('critical_unit') or '-':<13s} {figure(value):>26s}")
    clocks = {str(r["clock_source"]) for r in rows if r.get("clock_source")}
    if clocks:
        lines.append(f"MHz: each design's clock ({', '.join(sorted(clocks))}: the clock model of vta.clock unless "
                     f"the design sets CLOCK_MHZ); inferences/s at that clock")
    return "\n".join(lines)


def swept_parameters(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """The config fields and knobs whose value differs between ``rows`` -> their values, sorted: what the explorer
    colours and filters by."""
    values: dict[str, set[str]] = {}
    for r in rows:
        for k, v in {**(r.get("config") or {}), **(r.get("knobs") or {})}.items():
            values.setdefault(k, set()).add(json_key(v))
    return {k: sorted(vs, key=_order) for k, vs in values.items() if len(vs) > 1}


def json_key(value: Any) -> str:
    """A parameter's value as the text the page filters on."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _order(text: str) -> tuple[int, float, str]:
    try:
        return 0, float(text), ""
    except ValueError:
        return 1, 0.0, text


def figure(value: float | None) -> str:
    """A figure in the sweep's one number format: thousands separated with no decimals from 1,000 up (37,860),
    four significant digits below (703.2, 65.85, 0.1829); ``-`` for None."""
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


LOG_SPAN = 20.0
"""An axis is logarithmic only when its values span more than this factor; a narrower range reads better linear."""


def _scale(ax: Any, axis: str, values: Sequence[float]) -> None:
    """Log scale on ``axis`` (``"x"`` or ``"y"``) of ``ax`` when ``values`` span more than :data:`LOG_SPAN`, else
    linear with plain, thousands-separated tick labels."""
    from matplotlib.ticker import FuncFormatter
    positive = [v for v in values if v > 0]
    log = bool(positive) and max(positive) / min(positive) > LOG_SPAN
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log" if log else "linear")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(FuncFormatter(lambda v, _: figure(v)))


def _params_of(row: dict[str, Any], by_design: dict[str, dict[str, Any]]) -> dict[str, str]:
    """A row's config fields and knobs as text (suite rows take their design's from ``by_design``)."""
    source = row if row.get("config") is not None else by_design.get(row["design"], {})
    return {k: json_key(v) for k, v in {**(source.get("config") or {}), **(source.get("knobs") or {})}.items()}


_PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
            "tab:gray")


def _panel(ax: Any, rows: list[dict[str, Any]], column: str, maximize: bool, colour_by: str | None,
           values: list[str], by_design: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One model's panel: every design (coloured by ``colour_by``'s value; designs with identical figures drawn
    once, larger, with their count), the frontier numbered; returns the frontier."""
    from vta.compiler.report import uncrowded_labels
    pts = [r for r in rows if r.get(column) is not None and r.get(AREA[0]) is not None]
    front = frontier(pts, AREA[0], column, maximize_y=maximize)
    groups: dict[tuple[float, float], list[dict[str, Any]]] = {}
    for r in pts:
        groups.setdefault((r[AREA[0]], r[column]), []).append(r)
    for i, value in enumerate(values or [""]):
        sel = [(xy, g) for xy, g in groups.items() if not colour_by or _params_of(g[0], by_design).get(colour_by) ==
               value]
        if sel:
            ax.scatter([xy[0] for xy, _ in sel], [xy[1] for xy, _ in sel], s=[14 + 10 * (len(g) - 1) for _, g in sel],
                       c=_PALETTE[i % len(_PALETTE)], alpha=0.75, linewidths=0,
                       label=f"{colour_by} = {value}" if colour_by else "designs")
    ax.step([r[AREA[0]] for r in front], [r[column] for r in front], where="post", c="tab:red", lw=1)
    ax.scatter([r[AREA[0]] for r in front], [r[column] for r in front], s=60, facecolors="none",
               edgecolors="tab:red", linewidths=1.2, label=f"frontier ({len(front)})")
    _scale(ax, "x", [r[AREA[0]] for r in pts])
    _scale(ax, "y", [r[column] for r in pts])
    ax.autoscale_view()
    for (x, y), text in uncrowded_labels([((r[AREA[0]], r[column]), str(k)) for k, r in enumerate(front, 1)], ax):
        ax.annotate(text, (x, y), fontsize=7, color="tab:red", xytext=(-3, 5), textcoords="offset points", ha="right")
    counts = [((x, y), f"x{len(g)}") for (x, y), g in groups.items() if len(g) > 1]
    for (x, y), text in uncrowded_labels(counts, ax, merge=False):
        ax.annotate(text, (x, y), fontsize=6, xytext=(4, -8), textcoords="offset points", color="0.3")
    coincident = sum(len(g) for g in groups.values() if len(g) > 1)
    ax.legend(fontsize=7, title=f"{len(pts)} designs" + (f", {coincident} sharing figures (xN)" if coincident else
                                                        ""), title_fontsize=7)
    return front


def plot_frontiers(groups: dict[str, list[dict[str, Any]]], folder: str | os.PathLike[str],
                   title: str = "", *, failed: Sequence[dict[str, Any]] = (),
                   colour_by: str | None = None) -> list[Path]:
    """One PNG per metric of :data:`METRICS` in ``folder``: a panel per group (model name -> ok rows; :data:`SUITE`
    is one inference of each model in sequence, as the panel's title says), every design drawn and coloured by the
    swept parameter ``colour_by`` (default: the first of :func:`swept_parameters`), designs with identical figures
    drawn once with their count, the frontier in red and numbered, its designs named under the panel by their full
    names (as the tables name them); ``failed`` rows (status failed or timeout) listed with their errors under the
    panels. An axis is logarithmic only where its values span more than :data:`LOG_SPAN`. Returns the files
    written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    every = [r for rows in groups.values() for r in rows]
    by_design = {r["design"]: r for r in every if r.get("config") is not None}
    params = swept_parameters(list(by_design.values()))
    colour_by = colour_by if colour_by in params else next(iter(params), None)
    values = params.get(colour_by, []) if colour_by else []
    written = []
    for metric, (column, maximize, label) in METRICS.items():
        n = len(groups)
        fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 5.5), squeeze=False)
        longest = 0
        for ax, (model, rows) in zip(axes[0], groups.items()):
            front = _panel(ax, rows, column, maximize, colour_by, values, by_design)
            longest = max(longest, len(front))
            ax.set_xlabel(AREA[1])
            ax.set_ylabel(label)
            name = model if len(model) < 40 else "..." + model[-37:]
            ax.set_title(f"{name}: one inference of each model in sequence" if model == SUITE else name, fontsize=10)
            ax.grid(True, which="major", lw=0.3)
            key = "\n".join(f"{k}: {r['design']}  ({r[AREA[0]]:,.0f} CLB, {figure(r[column])})"
                            for k, r in enumerate(front, 1))
            ax.text(0.0, -0.14, "frontier:\n" + key, transform=ax.transAxes, va="top", fontsize=7, family="monospace")
        if failed:  # under the longest frontier key, from the first panel's left edge
            lines = [f"{r['design']} on {r['model']}: {r['status']}: {(r.get('error') or '')[:160]}"
                     for r in failed[:12]]
            more = f"\n... and {len(failed) - 12} more (the results database lists all)" if len(failed) > 12 else ""
            axes[0][0].annotate(f"{len(failed)} failed or timed-out points, not drawn:\n" + "\n".join(lines) + more,
                                (0.0, -0.14), xycoords="axes fraction", xytext=(0, -8.5 * (longest + 3)),
                                textcoords="offset points", va="top", fontsize=7, family="monospace",
                                annotation_clip=False)
        if title:
            fig.suptitle(title)
        fig.subplots_adjust(left=0.06, right=0.98, wspace=0.22)  # the keys below are kept by bbox_inches="tight"
        path = folder / f"pareto_{metric}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    return written
