"""``vta report RUN [RUN_B]``: re-render a saved run report, or compare two runs layer by layer.

``RUN`` is a JSON report written by ``vta run MODEL --report-json FILE`` (:mod:`.report`). With one run: the
per-layer table (cycles, MACs, utilization, per-module cycle classes, bytes per memory type, intensity, energy),
and on request the CSV, the JSON again (``--tech`` recomputes the energies with another technology file) and the
plots (per-layer stacked bars and the roofline beside them). With two: A and B side by side per layer (where each
ran, cycles, energy and the ratios B/A) and the totals.

A plug-in group of :mod:`vta.cli` (``PLUGINS``).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register", "report_command", "SWEEP_EXPLORER"]

SWEEP_EXPLORER = "vta.sweep.html:write_sweep_html_from_db"
"""What writes a sweep's explorer (``vta report SWEEP.sqlite --html FILE``), by name: the sweep floor is above the
compiler's, so it is imported on first use, as the CLI's plug-ins are."""


def register(subparsers: Any) -> None:
    """Add ``vta report`` to the ``vta`` command's subparsers."""
    from .cli import add_report_options
    p = subparsers.add_parser("report", help="re-render a saved run report, or compare two runs",
                              description="Re-render a saved run report (RUN: the JSON written by vta run MODEL "
                                          "--report-json FILE), or compare two runs layer by layer (led by what "
                                          "differs between them); or, with --html, write the explorer of a sweep's "
                                          "results database (RUN: a .sqlite written by vta sweep).")
    p.add_argument("runs", metavar="RUN", nargs="+", help="one saved JSON report to re-render, or two to compare "
                                                          "(A then B), or a sweep's .sqlite with --html")
    p.add_argument("--tech", metavar="FILE", help="recompute the energies with this technology file (TOML, as "
                                                  "vta/tech/default_45nm.toml)")
    add_report_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=report_command)


def report_command(args: argparse.Namespace) -> int:
    """Print (and write) the saved report, or the comparison of two; bad input is a CliError (exit 2)."""
    from vta.cliutil import CliError, wrote
    from vta.energy import TechError, load_tech

    from .cli import check_clock, check_output_path
    from .report import ReportError, accuracy_difference, compare, format_comparison, load_report, roofline_path
    if len(args.runs) > 2:
        raise CliError(f"vta report takes one run to re-render or two to compare, not {len(args.runs)}")
    check_clock(args)
    for option, attr in (("--report-json", "report_json"), ("--report-csv", "report_csv"), ("--plot", "plot"),
                         ("--html", "html")):
        if getattr(args, attr, None):
            check_output_path(option, getattr(args, attr))
    if len(args.runs) == 1 and args.runs[0].lower().endswith((".sqlite", ".sqlite3", ".db")):
        return _sweep_report(args)
    try:
        tech = load_tech(args.tech) if args.tech else None
    except TechError as err:
        raise CliError(str(err).splitlines()[0] + " " + "; ".join(err.problems)) from None
    reports = []
    for path in args.runs:
        try:
            report = load_report(path)  # its errors name the file
        except ReportError as err:
            raise CliError(str(err)) from None
        try:
            report = report.with_tech(tech) if tech is not None else report
        except ReportError as err:
            raise CliError(f"{path}: {err}") from None
        if args.clock_mhz is not None:
            report = report.with_clock(args.clock_mhz, "user", "--clock-mhz")
        reports.append(report)
    if len(reports) == 2:
        if args.report_csv or args.plot or args.html:
            raise CliError("--report-csv, --plot and --html render one run; give one RUN (compare writes "
                           "--report-json)")
        a, b = reports
        if args.report_json:
            from vta.fileio import atomic_write_text
            atomic_write_text(args.report_json, json.dumps({"a": args.runs[0], "b": args.runs[1],
                                                            "accuracy": accuracy_difference(a, b),
                                                            "layers": compare(a, b)}, indent=2))
        if args.json:
            print(json.dumps({"a": args.runs[0], "b": args.runs[1], "accuracy": accuracy_difference(a, b),
                              "layers": compare(a, b)}, indent=2))
        else:
            print(format_comparison(a, b, args.runs[0], args.runs[1]))
        return 0
    report = reports[0]
    if args.report_json:
        report.write_json(args.report_json)
    if args.report_csv:
        report.write_csv(args.report_csv)
    if args.plot:
        report.plot(args.plot)
        report.plot_roofline(roofline_path(args.plot))
    if args.html:
        from .html_report import write_run_html
        write_run_html(report, args.html)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.format(reasons=args.reasons, wide=args.wide))
    for path, what in ((args.report_json, "per-layer report, JSON"), (args.report_csv, "per-layer report, CSV"),
                       (args.plot, "per-layer plot"), (args.plot and roofline_path(args.plot), "roofline plot"),
                       (args.html, "HTML report, self-contained")):
        if path and not args.json:
            print(wrote(path, what))
    return 0


def _sweep_report(args: argparse.Namespace) -> int:
    """``vta report SWEEP.sqlite --html FILE``: the sweep explorer of a results database (:mod:`vta.sweep.html`).
    The sweep floor is above the compiler's, so it is reached by name, as the CLI's plug-ins are."""
    import importlib
    import os

    from vta.cliutil import CliError, wrote
    if not args.html:
        raise CliError(f"{args.runs[0]} is a sweep's results database: give --html FILE to write its explorer "
                       f"(vta sweep FILE prints its frontiers)")
    if not os.path.isfile(args.runs[0]):
        raise CliError(f"{args.runs[0]}: no such file")
    module, _, name = SWEEP_EXPLORER.partition(":")
    try:  # the database is read, never written: one that is not a sweep's is refused (a StoreError names it)
        getattr(importlib.import_module(module), name)(args.runs[0], args.html)
    except ValueError as err:
        raise CliError(str(err)) from None
    print(wrote(args.html, "sweep explorer, HTML, self-contained"))
    return 0
