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

__all__ = ["frontier", "suite_rows", "frontier_table", "plot_frontiers", "swept_parameters", "json_key", "METRICS",
           "SUITE"]

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
    """A text table of frontier ``rows`` for ``metric`` (a key of :data:`METRICS`)."""
    column, _, label = METRICS[metric]
    head = f"{'design':44s} {'area CLB':>9s} {'LUT':>7s} {'FF':>6s} {'DSP':>5s} {'BRAM':>6s} {label:>26s}"
    lines = [head, "-" * len(head)]
    for r in rows:
        value = r[column]
        lines.append(f"{r['design']:44s} {r['area_clb']:9.0f} {r['lut']:7d} {r['ff']:6d} {r['dsp']:5d} "
                     f"{r['bram']:6.1f} {value:26.4g}")
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


def _short(design: str) -> str:
    """A design key without the fixed int8/int32 widths, for labels."""
    return design.replace("_i8w8a32", "")


def _spaced(front: list[dict[str, Any]], column: str, gap: float = 1.1) -> list[dict[str, Any]]:
    """The frontier designs to label: each at least ``gap`` times the last labelled one away on an axis (the rest
    crowd it; the frontier table lists every one)."""
    out: list[dict[str, Any]] = []
    for r in front:
        if not out:
            out.append(r)
            continue
        x0, y0, x, y = out[-1][AREA[0]], out[-1][column], r[AREA[0]], r[column]
        if x >= gap * x0 or max(y, y0) >= gap * min(y, y0):
            out.append(r)
    return out


def plot_frontiers(groups: dict[str, list[dict[str, Any]]], folder: str | os.PathLike[str],
                   title: str = "") -> list[Path]:
    """One PNG per metric of :data:`METRICS` in ``folder``: a panel per group (model name -> ok rows), every design
    in grey and the frontier in red, its designs labelled where there is room. Returns the files written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for metric, (column, maximize, label) in METRICS.items():
        n = len(groups)
        fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 5.5), squeeze=False)
        for ax, (model, rows) in zip(axes[0], groups.items()):
            pts = [r for r in rows if r.get(column) is not None]
            front = frontier(pts, AREA[0], column, maximize_y=maximize)
            ax.scatter([r[AREA[0]] for r in pts], [r[column] for r in pts], s=10, c="0.7", label=f"{len(pts)} designs")
            ax.step([r[AREA[0]] for r in front], [r[column] for r in front], where="post", c="tab:red", lw=1)
            ax.scatter([r[AREA[0]] for r in front], [r[column] for r in front], s=24, c="tab:red",
                       label=f"frontier ({len(front)})")
            for r in _spaced(front, column):
                ax.annotate(_short(r["design"]), (r[AREA[0]], r[column]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(AREA[1])
            ax.set_ylabel(label)
            ax.set_title(model if len(model) < 40 else "..." + model[-37:])
            ax.grid(True, which="both", lw=0.3)
            ax.legend(fontsize=8)
        if title:
            fig.suptitle(title)
        fig.tight_layout()
        path = folder / f"pareto_{metric}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
