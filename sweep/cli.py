"""``vta sweep FILE``: run a design-space sweep, print the frontier and name every file written (``wrote PATH``).

A plug-in group of :mod:`vta.cli` (``PLUGINS``); ``scripts/sweep.py`` runs the same :func:`sweep_command`.
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["register", "add_arguments", "sweep_command", "check_model", "MAX_WORKERS"]

log = logging.getLogger("vta")

DEFAULT_DIR = Path("build")
"""Where the results database and the plots go unless ``--db`` and ``--plot-dir`` say otherwise (relative to the
current folder; created when needed)."""
MAX_WORKERS = 256
"""The most local worker processes ``--workers`` may ask for: each holds a model, its compiler and schedule caches in
memory (hundreds of MB). A run starts no more workers than it has tasks (points, in groups) to give them."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``vta sweep`` (shared with ``scripts/sweep.py``)."""
    parser.add_argument("file", metavar="FILE", help="the sweep file (TOML; see scripts/sweeps/)")
    parser.add_argument("--db", metavar="PATH", help="results database (SQLite; default build/<FILE stem>.sqlite, "
                                                     "build/ created if needed); a rerun skips the points it holds")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                        help=f"local worker processes (default: the CPU count; 0: in this process; at most "
                             f"{MAX_WORKERS}, and no more are started than there are points to measure)")
    parser.add_argument("--scheduler", metavar="ADDR", help="run on a Dask distributed cluster at ADDR "
                                                            "(tcp://host:8786) instead of local workers")
    parser.add_argument("--plot-dir", metavar="DIR", help="where to write the frontier plots (default "
                                                          "build/<FILE stem>-plots)")
    parser.add_argument("--html", metavar="FILE", help="write the sweep explorer: one self-contained HTML page (opens "
                                                      "offline) of every design, its Pareto fronts, filters and "
                                                      "per-layer breakdowns, and the failed points")
    parser.add_argument("--retry", action="store_true", help="measure failed and timed-out points again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--check", type=int, default=0, metavar="N",
                        help="model mode: measure N of the ok points (seeded sample) again in exact mode (tsim cycles; "
                             "area as --check-area) and print the model's error (default 0)")
    parser.add_argument("--check-area", choices=("model", "yosys"), default="yosys",
                        help="area of the --check points: Yosys per-module synthesis (default) or the model")


def register(subparsers: Any) -> None:
    """Add the ``sweep`` command to the top-level ``subparsers`` of ``vta``."""
    from vta.cliutil import command_doc
    parser = subparsers.add_parser("sweep", help="design-space sweep: which accelerator for these models",
                                   description=command_doc(sweep_command))
    add_arguments(parser)
    parser.set_defaults(func=sweep_command)


SHOWN_FAILURES = 5
"""Failed points whose reasons ``vta sweep`` prints (every one is in the database's ``error`` column)."""


def _failures(rows: list[dict[str, Any]]) -> list[str]:
    """Lines naming the points of ``rows`` that did not end ok and why (the first line of each error), the first
    :data:`SHOWN_FAILURES` of them; none when there are none."""
    if not rows:
        return []
    lines = [f"points not measured ({len(rows)}; the reasons are the database's error column):"]
    for row in rows[:SHOWN_FAILURES]:
        why = str(row.get("error") or row.get("status") or "").strip().splitlines()
        lines.append(f"  {row['design']} {row['model']}: {row['status']}: {why[0][:200] if why else '(no reason)'}")
    if len(rows) > SHOWN_FAILURES:
        lines.append(f"  ... and {len(rows) - SHOWN_FAILURES} more")
    return lines


def sweep_command(args: argparse.Namespace) -> int:
    """Run the design-space sweep of FILE (every design of its grid on every model), print the frontier of speed,
    area and energy and name every file written: the results database and the frontier plots, by default in build/
    of the current folder.

    Returns 0 even when some points failed or timed out: they are results (recorded with their reasons), not errors
    of the run."""
    from vta.cliutil import CliError, wrote

    from .pareto import METRICS, SUITE, figure, frontier, frontier_table, plot_frontiers, suite_rows
    from .runner import run_sweep
    from .spec import SweepSpecError, load_spec
    from .store import ResultStore, StoreError
    try:
        spec = load_spec(args.file)
    except SweepSpecError as err:
        raise CliError(str(err)) from None
    if not 0 <= args.workers <= MAX_WORKERS:
        raise CliError(f"--workers must be between 0 and {MAX_WORKERS} local processes, not {args.workers} (each "
                       f"holds a model and its compiler in memory; --scheduler ADDR runs on a Dask cluster)")
    if args.check < 0:
        raise CliError(f"--check must be 0 or more points, not {args.check}")
    if args.html:
        from vta.compiler.cli import check_output_path
        check_output_path("--html", args.html)
    stem = Path(args.file).stem
    db = Path(args.db) if args.db else DEFAULT_DIR / f"{stem}.sqlite"
    if db.suffix.lower() not in (".sqlite", ".sqlite3", ".db"):
        raise CliError(f"--db {db}: the results database is written as .sqlite, .sqlite3 or .db, not "
                       f"{db.suffix or 'a file without a suffix'}")
    plot_dir = Path(args.plot_dir) if args.plot_dir else DEFAULT_DIR / f"{stem}-plots"
    if not args.db:
        DEFAULT_DIR.mkdir(exist_ok=True)
    try:  # before any work: a database that cannot be opened is the user's to fix
        ResultStore(db).close()
    except StoreError as err:
        raise CliError(f"--db {err}") from None
    try:
        points = spec.points()
    except SweepSpecError as err:
        raise CliError(str(err)) from None
    print(f"sweep {spec.name}: {len(points) // len(spec.models)} designs x {len(spec.models)} models = {len(points)} "
          f"points, mode {spec.mode}")
    with ResultStore(db) as store:
        summary = run_sweep(spec, store, workers=args.workers, scheduler=args.scheduler, retry=args.retry,
                            progress=not args.no_progress)
        keys = {p.key for p in points}
        rows = [r for r in store.rows(mode=spec.mode, status="ok") if (r["design"], r["model"], r["mode"]) in keys]
        failed = [r for r in store.rows(mode=spec.mode) if r["status"] != "ok"
                  and (r["design"], r["model"], r["mode"]) in keys]
    print(f"measured {summary.measured} points in {summary.seconds:.1f} s ({figure(summary.points_per_minute)} "
          f"points/min): {summary.ok} ok, {summary.failed} failed, {summary.timeout} timed out; {summary.skipped} "
          f"already in {db}")
    for line in _failures(failed):
        print(line)
    groups = {m: [r for r in rows if r["model"] == m] for m in spec.models}
    if len(spec.models) > 1:
        groups[SUITE] = suite_rows(rows, list(spec.models))
    suite = groups[SUITE] if len(spec.models) > 1 else groups[spec.models[0]]
    name = SUITE if len(spec.models) > 1 else spec.models[0]
    if len(spec.models) > 1:
        print(f"\n{SUITE}: one inference of each of {', '.join(spec.models)} in sequence: latency and energy "
              f"summed,\ninferences/s = 1e6 / the summed latency in us; only designs measured ok on every model")
    for metric, (column, maximize, _) in METRICS.items():
        front = frontier(suite, "area_clb", column, maximize_y=maximize)
        print(f"\nfrontier, {metric} vs area ({name}, {len(front)} of {len(suite)} designs):")
        print(frontier_table(front, metric))
    from .accuracy import four_way_front, front_table, plot_accuracy
    widths = {(r["config"].get("LOG_INP_WIDTH"), r["config"].get("LOG_WGT_WIDTH")) for r in rows if r.get("config")}
    precision = len(widths) > 1  # the sweep varies a width: accuracy is a fourth objective
    for model in spec.models if precision else []:  # the four-way front per model
        front = four_way_front(groups[model])
        if front:
            print(f"\nfour-way front, accuracy ({front[0]['accuracy_on']}), latency, energy, area ({model}, "
                  f"{len(front)} of {len(groups[model])} designs):")
            print(front_table(front))
    if args.check > 0:
        if spec.mode != "model":
            raise CliError("--check measures model-mode points again in exact mode; this sweep is already exact")
        with ResultStore(db) as store:
            print()
            print(check_model(spec, store, rows, args.check, area=args.check_area, workers=args.workers,
                              scheduler=args.scheduler, progress=not args.no_progress))
    with ResultStore(db) as store:
        failed = [r for r in store.rows(mode=spec.mode) if r["status"] != "ok" and
                  (r["design"], r["model"], r["mode"]) in keys]
    written = plot_frontiers(groups, plot_dir, title=f"sweep {spec.name} ({spec.mode} mode)", failed=failed)
    written += plot_accuracy({m: groups[m] for m in spec.models}, plot_dir) if precision else []
    print()
    print(wrote(db, "results database"))
    for path in written:
        print(wrote(path, "frontier plot"))
    if args.html:
        from .html import write_sweep_html
        with ResultStore(db) as store:
            everything = [r for r in store.rows() if (r["design"], r["model"], r["mode"]) in keys]
        write_sweep_html(everything, args.html, title=f"sweep {spec.name} ({spec.mode} mode)")
        print(wrote(args.html, "sweep explorer, HTML, self-contained"))
    return 0


def check_model(spec: Any, store: Any, rows: list[dict[str, Any]], count: int, *, area: str = "yosys",
                workers: int = 0, scheduler: Any = None, progress: bool = False, seed: int = 0) -> str:
    """Measure ``count`` of the ok model-mode ``rows`` (a seeded sample) in exact mode (into ``store``, so a rerun
    reuses them) and return a table of the model's errors: cycles (cycle model vs tsim) and, with Yosys area, LUT,
    FF and CLB-equivalents (area model vs per-module Yosys), in percent of the exact figure."""
    import random
    from dataclasses import replace

    from .runner import run_sweep
    by_key = {(p.design.key, p.model): p for p in spec.points()}
    chosen = random.Random(seed).sample(rows, min(count, len(rows)))
    points = [replace(by_key[(r["design"], r["model"])], mode="exact", area=area) for r in chosen
              if (r["design"], r["model"]) in by_key]
    summary = run_sweep(spec, store, workers=workers, scheduler=scheduler, progress=progress, points=points)
    exact = {(r["design"], r["model"]): r for r in store.rows(mode="exact")}
    head = f"  {'design':<34} {'model':<12} {'cycles model':>13} {'tsim':>13} {'error':>7}"
    if area == "yosys":
        head += f" {'LUT err':>8} {'FF err':>7} {'CLB err':>8}"
    lines = [f"exact check of {len(points)} model points ({summary.measured} measured now, {summary.skipped} "
             f"already in the database; area: {area}):", head]
    errors: list[float] = []
    for r in chosen:
        e = exact.get((r["design"], r["model"]))
        if e is None or e["status"] != "ok":
            lines.append(f"  {r['design'][:34]:<34} {r['model'][:12]:<12} exact point "
                         f"{'missing' if e is None else e['status']}: {e and e['error']}")
            continue
        err = 100.0 * (r["cycles"] - e["cycles"]) / e["cycles"] if e["cycles"] else float("nan")
        errors.append(abs(err))
        line = f"  {r['design'][:34]:<34} {r['model'][:12]:<12} {r['cycles']:>13,} {e['cycles']:>13,} {err:>+6.2f}%"
        if area == "yosys":
            line += " " + " ".join(f"{100.0 * (r[k] - e[k]) / e[k]:>+{w}.1f}%" if e[k] else f"{'-':>{w + 1}}"
                                   for k, w in (("lut", 7), ("ff", 6), ("area_clb", 7)))
        lines.append(line)
    if errors:
        lines.append(f"cycle model: mean |error| {sum(errors) / len(errors):.2f}%, worst {max(errors):.2f}% over "
                     f"{len(errors)} points")
    return "\n".join(lines)
