"""The ``vta tsim`` commands (registered by ``vta.cli``): build the Verilator model, run a saved program, trace.

    vta tsim build [--config FILE] [--trace {none,vcd,fst}] [--rtl FILE... [--top NAME]]
                                                                build (or find in the cache) the model; print its path
    vta tsim run PROGRAM.npz [--trace out.vcd --trace-window A:B] [--max-cycles N] [--watchdog N]
                 [--check {fsim,none}] [--json] [--rtl FILE... [--top NAME]]
    vta tsim cache [--clear [--wait]]                           list (or delete) cached builds

``run`` prints the cycles and every hardware counter. By default (``--check fsim``) the program first runs on the
functional simulator, which rejects an invalid program (exit 1, fsim's error naming the instruction), and the RTL's
final DRAM image and counters are compared with fsim's (exit 1 naming the first differing address when they differ);
``--check none`` runs the RTL alone. ``--max-cycles 0`` (the default) derives the cycle budget from the program.

``--rtl FILE...`` (Verilog, SystemVerilog or ``.f`` lists) swaps in a foreign core (:mod:`vta.tsim.byo`), with top
module ``--top`` (default ``vta_core``): it is linted and its ports checked against the core interface of the config
before anything is built (exit 2 naming every mismatch); docs/byo-rtl.md.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vta.cliutil import wrote

__all__ = ["register", "parse_window", "add_rtl_options", "foreign_core"]


def register(subparsers: Any) -> None:
    """Add the ``tsim`` group and its commands to the top-level ``subparsers`` of ``vta``."""
    from vta.cliutil import add_config_option, command_doc
    tsim = subparsers.add_parser("tsim", help="Verilator co-simulation: build, run, trace",
                                 description="Co-simulate the core's RTL with Verilator: build (and cache) the model "
                                             "of a config's core, run programs on it, trace waveforms.")
    sub = tsim.add_subparsers(dest="tsim_command", metavar="COMMAND", required=True)

    build = sub.add_parser("build", help="build (or find in the cache) the Verilator model of a config's core",
                           description=command_doc(_cmd_build))
    add_config_option(build)
    build.add_argument("--trace", choices=("none", "vcd", "fst"), default="none",
                       help="build with waveform support (slower simulation); default none")
    build.add_argument("--no-pgo", action="store_true",
                       help="skip profile-guided optimization (a faster build, a ~30%% slower model; also "
                            "VTA_TSIM_PGO=0)")
    add_rtl_options(build)
    build.set_defaults(func=_cmd_build)

    run = sub.add_parser("run", help="run a saved program (.npz) or a compiled model's layer (.vtac) on the RTL",
                         description="Run a saved program (.npz) or one accelerator layer of a compiled model "
                                     "(.vtac) on the Verilator model of its config's core, checked against the "
                                     "functional simulator; print the cycles and counters.")
    run.add_argument("program", metavar="PROGRAM",
                     help="a program saved with Program.save (.npz), or a model compiled by `vta compile` (.vtac)")
    run.add_argument("--layer", metavar="NAME", default=None,
                     help="with a .vtac: the accelerator layer to run (needed when it has more than one; "
                          "`vta disasm MODEL.vtac` lists them)")
    run.add_argument("--trace", metavar="FILE", help="write a waveform (.vcd, or .fst when lz4 headers exist)")
    run.add_argument("--trace-window", metavar="A:B", type=parse_window,
                     help="record only cycles A (inclusive) to B (exclusive); default all")
    run.add_argument("--max-cycles", type=int, default=0, metavar="N",
                     help="cycle budget (default 0: derived from the program, 8x the cycle model's prediction plus "
                          "the watchdog window, the drain and 10,000 slack)")
    run.add_argument("--watchdog", type=int, default=100_000, metavar="N",
                     help="stop after N cycles without progress (default 100000; 0: off)")
    run.add_argument("--check", nargs="?", const="fsim", default="fsim", choices=("fsim", "none"),
                     help="fsim (default): validate on the functional simulator first and compare the result with "
                          "its; none: run the RTL alone")
    run.add_argument("--json", action="store_true",
                     help="print the run summary as JSON: cycles, counters, statistics and the check, the same keys "
                          "as `vta run PROGRAM.npz --json` (vta.backend.RunSummary)")
    add_rtl_options(run)
    run.set_defaults(func=_cmd_run)

    cache = sub.add_parser("cache", help="list the cached Verilator builds",
                           description="List the cached Verilator builds with their sizes, or delete them "
                                       "(--clear).")
    cache.add_argument("--clear", action="store_true",
                       help="delete every cached build; builds in progress are skipped (named) unless --wait")
    cache.add_argument("--wait", action="store_true",
                       help="with --clear: wait for builds in progress, then delete them")
    cache.set_defaults(func=_cmd_cache)


def add_rtl_options(parser: argparse.ArgumentParser) -> None:
    """``--rtl FILE...`` and ``--top NAME``: a foreign core instead of the generated one (docs/byo-rtl.md)."""
    parser.add_argument("--rtl", metavar="FILE", nargs="+", default=None,
                        help="a foreign core: Verilog (.v), SystemVerilog (.sv) files or file lists (.f) "
                             "(docs/byo-rtl.md)")
    parser.add_argument("--top", metavar="NAME", default=None, help="with --rtl: the top module (default vta_core)")


def foreign_core(args: argparse.Namespace, cfg: Any = None) -> Any:
    """The :class:`~vta.tsim.byo.ForeignCore` of ``--rtl``/``--top`` (None without ``--rtl``); with ``cfg`` it is
    linted and its ports checked now, before anything is built (CoreInterfaceError naming every mismatch)."""
    from vta.cliutil import CliError

    from .byo import ForeignCore
    if getattr(args, "rtl", None) is None:
        if getattr(args, "top", None) is not None:
            raise CliError("--top names the top module of a foreign core; give its files with --rtl FILE...")
        return None
    core = ForeignCore(args.rtl, top=args.top)
    if cfg is not None:
        core.check(cfg)
    return core


def parse_window(text: str) -> tuple[int, int]:
    """``"A:B"`` -> ``(A, B)`` cycles with ``0 <= A < B``; argparse shows the error otherwise."""
    try:
        first, end = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a trace window is FIRST:END in cycles, e.g. 100:200, not {text!r}") from None
    if not 0 <= first < end:
        raise argparse.ArgumentTypeError(f"a trace window needs 0 <= FIRST < END, not {text!r}")
    return first, end


def _cmd_build(args: argparse.Namespace) -> int:
    """Build the Verilator model of the config's core (or of a foreign core, --rtl), or find it in the cache; print
    the library's path."""
    from vta.cliutil import config_from_args

    from .build import build
    cfg = config_from_args(args)
    core = foreign_core(args, cfg)
    if core is not None:
        print(f"{core.top}: ports match the core interface of {cfg.name}")
    options = {} if core is None else core.backend_options()
    built = build(cfg, trace=args.trace, pgo=False if args.no_pgo else None, **options)
    state = f"built in {built.build_seconds:.1f} s" if built.compiled else f"cached, checked in {built.seconds:.3f} s"
    print(f"{built.library} ({cfg.name}, {state})")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vta.backend import RunSummary
    from vta.cliutil import CliError, check_output_folder
    from vta.programfile import read_program

    from .backend import TSimBackend
    path = Path(args.program)
    if args.trace_window and not args.trace:
        raise CliError("--trace-window needs --trace FILE")
    if args.trace and Path(args.trace).suffix.lower() not in (".vcd", ".fst"):
        raise CliError(f"--trace {args.trace}: a waveform is written as .vcd or .fst, not "
                       f"{Path(args.trace).suffix or 'a file without a suffix'}")
    if args.trace:
        check_output_folder("--trace", args.trace)  # as `vta compile -o`: no folder is created for it
    layer, program = read_program(path, args.layer)  # a .npz, or one accelerator layer of a .vtac
    if args.max_cycles < 0:
        raise CliError(f"--max-cycles must be a number of cycles >= 0 (0: derived from the program), not "
                       f"{args.max_cycles}")
    core = foreign_core(args, program.cfg)
    backend = TSimBackend(check=args.check, **({} if core is None else core.backend_options()))
    options: dict[str, Any] = {"max_cycles": args.max_cycles, "watchdog_cycles": args.watchdog}
    if args.trace:
        options.update(trace=args.trace, trace_window=args.trace_window)
    result = backend.run(program, **options)  # raises fsim's error, or TsimMismatchError, when the check fails
    counters: dict[str, int] = result.counters or {}
    report = RunSummary.of(f"program {args.program}", program, result, layer=None if layer == path.name else layer,
                           trace=str(args.trace) if args.trace else None,
                           check={"dram": "equal", "counters_differing": {}} if args.check == "fsim" else "none")
    if args.json:
        print(report.to_json(indent=1))
    else:
        print(f"{path.name if layer == path.name else f'{path.name}, layer {layer}'}: {result.cycles:,} cycles at "
              f"config {program.cfg.name}")
        for name, value in counters.items():
            print(f"  {name:22s} {value:>14,}")
        if args.trace:
            print(f"  {wrote(args.trace, 'waveform')}")
        print("  check against fsim: DRAM equal; counters equal" if args.check == "fsim" else
              "  not checked against fsim (--check none)")
    return 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from vta.cliutil import CliError

    from .build import cache_root
    if args.wait and not args.clear:
        raise CliError("--wait only applies with --clear (wait for builds in progress, then delete them)")
    root = cache_root()
    entries = sorted(p for p in root.glob("*") if p.is_dir() and not p.name.startswith(".")) if root.exists() else []
    if args.clear:
        return _clear(root, wait=args.wait)
    for entry in entries:
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        print(f"{entry.name}  {size / 1e6:.1f} MB")
    print(f"{len(entries)} cached builds in {root}")
    return 0


def _clear(root: Path, *, wait: bool) -> int:
    """Delete every cached build in ``root`` (and its lock file) while holding its lock; a build in progress (its
    lock held) is skipped with a message naming it, or waited for when ``wait``. Stale temporary folders go too."""
    import filelock

    from vta.cache import clean_stale, entry_lock, remove_entry
    if not root.exists():
        print(f"removed 0 cached builds from {root}")
        return 0
    keys = sorted({p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")} |
                  {p.name[:-len(".lock")] for p in root.glob("*.lock")})
    removed, skipped = 0, []
    for key in keys:
        lock = entry_lock(root, key)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            if not wait:
                skipped.append(key)
                continue
            print(f"waiting for the build of {key} to finish ...", flush=True)
            lock.acquire()
        try:
            if (root / key).is_dir():
                remove_entry(root / key)
                removed += 1
            (root / f"{key}.lock").unlink(missing_ok=True)  # while held: a waiter re-checks the file it locked
        finally:
            lock.release()
    clean_stale(root)
    print(f"removed {removed} cached builds from {root}")
    for key in skipped:
        print(f"skipped {key}: a build of it is in progress (its lock is held); `vta tsim cache --clear --wait` waits "
              "for it")
    return 0
