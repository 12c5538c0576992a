"""``vta sweep FILE``: run a design-space sweep, print the frontier and name every file written.

A plug-in group of :mod:`vta.cli` (``PLUGINS``); ``scripts/sweep.py`` runs the same :func:`sweep_command`.
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["register", "add_arguments", "sweep_command"]

log = logging.getLogger("vta")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``vta sweep`` (shared with ``scripts/sweep.py``)."""
    parser.add_argument("file", metavar="FILE", help="the sweep file (TOML; see scripts/sweeps/)")
    parser.add_argument("--db", metavar="PATH", help="results database (SQLite; default <FILE stem>.sqlite in the "
                                                     "current folder); a rerun skips the points it holds")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="local worker processes (default: the CPU count; 0: in this process)")
    parser.add_argument("--scheduler", metavar="ADDR", help="run on a Dask distributed cluster at ADDR "
                                                            "(tcp://host:8786) instead of local workers")
    parser.add_argument("--plot-dir", metavar="DIR", help="where to write the frontier plots (default "
                                                          "<FILE stem>-plots in the current folder)")
    parser.add_argument("--retry", action="store_true", help="measure failed and timed-out points again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def register(subparsers: Any) -> None:
    """Add the ``sweep`` command to the top-level ``subparsers`` of ``vta``."""
    parser = subparsers.add_parser("sweep", help="design-space sweep: which accelerator for these models",
                                   description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.set_defaults(func=sweep_command)


def sweep_command(args: argparse.Namespace) -> int:
    """Run the sweep of ``args.file``; print the summary, the frontier tables and the files written. Returns 0 even
    when some points failed or timed out: they are results (recorded with their reasons), not errors of the run."""
    from vta.cliutil import CliError

    from .pareto import SUITE, frontier, frontier_table, plot_frontiers, suite_rows
    from .runner import run_sweep
    from .spec import SweepSpecError, load_spec
    from .store import ResultStore
    try:
        spec = load_spec(args.file)
    except SweepSpecError as err:
        raise CliError(str(err)) from None
    if args.workers < 0:
        raise CliError(f"--workers must be 0 or more, not {args.workers}")
    stem = Path(args.file).stem
    db = Path(args.db or f"{stem}.sqlite")
    if db.suffix.lower() not in (".sqlite", ".sqlite3", ".db"):
        raise CliError(f"--db {db}: the results database is written as .sqlite, .sqlite3 or .db, not "
                       f"{db.suffix or 'a file without a suffix'}")
    plot_dir = Path(args.plot_dir or f"{stem}-plots")
    points = spec.points()
    print(f"sweep {spec.name}: {len(points) // len(spec.models)} designs x {len(spec.models)} models = {len(points)} "
          f"points, mode {spec.mode}")
    with ResultStore(db) as store:
        summary = run_sweep(spec, store, workers=args.workers, scheduler=args.scheduler, retry=args.retry,
                            progress=not args.no_progress)
        keys = {p.key for p in points}
        rows = [r for r in store.rows(mode=spec.mode, status="ok") if (r["design"], r["model"], r["mode"]) in keys]
    print(f"measured {summary.measured} points in {summary.seconds:.1f} s ({summary.points_per_minute:.0f} "
          f"points/min): {summary.ok} ok, {summary.failed} failed, {summary.timeout} timed out; {summary.skipped} "
          f"already in {db}")
    groups = {m: [r for r in rows if r["model"] == m] for m in spec.models}
    if len(spec.models) > 1:
        groups[SUITE] = suite_rows(rows, list(spec.models))
    suite = groups[SUITE] if len(spec.models) > 1 else groups[spec.models[0]]
    name = SUITE if len(spec.models) > 1 else spec.models[0]
    for metric, column, maximize in (("throughput", "inferences_per_s", True), ("energy", "energy_uj", False)):
        front = frontier(suite, "area_clb", column, maximize_y=maximize)
        print(f"\nfrontier, {metric} vs area ({name}, {len(front)} of {len(suite)} designs):")
        print(frontier_table(front, metric))
    written = plot_frontiers(groups, plot_dir, title=f"sweep {spec.name} ({spec.mode} mode)")
    print("\nfiles written:")
    for path in [db, *written]:
        print(f"  {path}")
    return 0
