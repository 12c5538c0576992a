"""Fault campaign: a few hundred generated bad inputs and interruptions, each in a subprocess of its own, counted by
what came of them (issue 12's acceptance; see docs/robustness.md).

Usage::

    python3 scripts/fault_campaign.py [--probes 220] [--seed 0] [--quick] [--jobs 1] [--json OUT]
                                      [--families programs,artefacts,...] [--tsim {build,cached,off}]
                                      [--work DIR] [--cache DIR]

Families: ``programs`` (corrupted random programs from :func:`vta.testing.random_program` on fsim and on tsim at
three configs, which must agree), ``artefacts`` (flipped, truncated, reordered and pickle-carrying ``.vtac`` and
``.npz`` files), ``configs`` (out-of-range, mistyped, unknown and unparsable configs), ``models`` (bad ONNX files, bad
``--input`` arrays, bad node names and output paths), ``cache`` (damaged tsim builds, JIT objects and zoo models,
which must be rebuilt) and ``signals`` (SIGINT and SIGKILL at random times of ``vta compile``, a tsim build and a
long tsim run).

Every probe runs under a memory limit (``RLIMIT_AS``, 4 GiB; 8 GiB for tsim builds) and a wall-clock limit, with
``VTA_CACHE_DIR`` pointing at the campaign's private cache (default: a folder under the system's temp folder, kept
between runs so the three tsim models are built once and then reused). The table counts per family: clear errors
(exit 1 or 2 with one ``vta: error:`` line, or a documented exception from the library), then the defects whose
count must be zero: tracebacks, hangs, crashes by signal, code executions (a planted payload's marker file
appeared), silent wrong results (exit 0 with a result that differs from the original or the reference, or fsim and
tsim disagree), files lost (a protected artefact, program or cache entry damaged after a probe, or a damaged cache
entry not rebuilt) and orphans (processes or temporary folders an interrupted build left behind); the last column
counts the probes that ran with a verified result. Exit status: 0 when every defect column is zero, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from faults.context import REPO, Context  # noqa: E402
from faults.core import COLUMNS, DEFECTS, Probe, Record, Verdict, execute, format_table, judge_cli, tally  # noqa: E402
from faults.inputs import artefact_probes, config_probes, program_probes  # noqa: E402
from faults.models import model_probes  # noqa: E402
from faults.system import cache_probes, signal_probes  # noqa: E402

if str(REPO) not in sys.path:  # the checkout under test, for the guard's checks (vta.cache) in this process
    sys.path.insert(1, str(REPO))

FAMILIES: dict[str, Callable[[Context, np.random.Generator, int], list[Probe]]] = {
    "programs": program_probes, "artefacts": artefact_probes, "configs": config_probes, "models": model_probes,
    "cache": cache_probes, "signals": signal_probes}
"""Probe families in the order they run."""

SHARE: dict[str, float] = {"programs": 0.28, "artefacts": 0.18, "configs": 0.14, "models": 0.16, "cache": 0.10,
                           "signals": 0.14}
"""Each family's share of ``--probes``."""

SERIAL = ("cache", "signals")
"""Families that damage the shared private cache or time their signals: run one probe at a time, whatever --jobs."""

DEFAULT_PROBES = 220


def split_probes(total: int, families: list[str]) -> dict[str, int]:
    """``total`` probes shared among ``families`` by :data:`SHARE` (at least one each; the sum is ``total`` when
    ``total`` is at least the number of families)."""
    weights = np.array([SHARE[f] for f in families])
    exact = weights / weights.sum() * total
    counts = np.maximum(1, np.floor(exact)).astype(int)
    for i in np.argsort(-(exact - np.floor(exact))):  # the remainder to the largest fractions
        if counts.sum() >= total:
            break
        counts[i] += 1
    return {f: int(c) for f, c in zip(families, counts)}


def run_probe(ctx: Context, probe: Probe, index: int) -> Record:
    """Set up, run and judge one probe, then check the marker and the protected files."""
    folder = ctx.folder(probe.family, index)
    if probe.setup is not None:
        probe.setup(folder)
    run = execute(probe, folder, ctx.env)
    verdict = (probe.judge or judge_cli)(run)
    if probe.marker and (folder / probe.marker).exists():
        verdict = Verdict("code_exec", f"the payload's marker {probe.marker} appeared")
    damage = ctx.guard.damage()
    if damage and verdict.outcome in ("ok", "clear"):
        verdict = Verdict("lost", "; ".join(damage))
    return Record(probe, run, verdict)


class Progress:
    """One line per finished probe on stderr: ``[k/n] family outcome (seconds) name``, defects with their note."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done = total, enabled, 0
        self.lock = threading.Lock()

    def __call__(self, rec: Record) -> None:
        with self.lock:
            self.done += 1
            if not self.enabled:
                return
            note = f": {rec.verdict.note[:160]}" if rec.verdict.outcome in DEFECTS else ""
            print(f"[{self.done:>{len(str(self.total))}}/{self.total}] {rec.probe.family:<9} "
                  f"{rec.verdict.outcome:<9} {rec.run.seconds:6.1f} s  {rec.probe.name}{note}", file=sys.stderr,
                  flush=True)


def campaign(ctx: Context, counts: dict[str, int], *, jobs: int = 1, progress: bool = True) -> list[Record]:
    """Prepare the context and run ``counts[family]`` probes of each family (the families in :data:`SERIAL` one at a
    time, the others on ``jobs`` threads, each probe a subprocess); returns the records in probe order."""
    if progress:
        print(f"preparing: reference artefact and programs, tsim models ({ctx.tsim_mode}) in {ctx.cache}",
              file=sys.stderr, flush=True)
    ctx.prepare()
    rng = np.random.default_rng(ctx.seed)
    seeds = {family: int(rng.integers(1 << 31)) for family in FAMILIES}  # one stream per family, whatever runs
    planned = [(family, FAMILIES[family](ctx, np.random.default_rng(seeds[family]), n)) for family, n in
               counts.items()]
    show = Progress(sum(len(probes) for _, probes in planned), progress)
    records: list[Record] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for family, probes in planned:
            if family in SERIAL or jobs <= 1:
                done = []
                for k, probe in enumerate(probes):
                    done.append(run_probe(ctx, probe, k))
                    show(done[-1])
            else:
                futures = [pool.submit(run_probe, ctx, probe, k) for k, probe in enumerate(probes)]
                for future in futures:
                    future.add_done_callback(lambda f: show(f.result()))
                done = [future.result() for future in futures]
            records += done
    return records


def report(records: list[Record], ctx: Context) -> str:
    """The table, the notes (what was skipped) and every probe with a defect, with its command and output."""
    lines = [format_table(tally(records))]
    lines += [f"note: {note}" for note in ctx.notes]
    bad = [r for r in records if r.verdict.outcome in DEFECTS]
    if bad:
        lines.append(f"\n{len(bad)} probes with a defect:")
    for rec in bad:
        lines.append(f"- [{rec.probe.family}] {rec.verdict.outcome}: {rec.probe.name}: {rec.verdict.note}")
        lines.append(f"    command: {' '.join(rec.probe.argv[1:])[:300]}  (in {rec.run.folder})")
        lines.append(f"    output: {rec.run.excerpt()[:600]}")
    return "\n".join(lines)


def to_json(records: list[Record], ctx: Context, seconds: float) -> dict[str, Any]:
    """The campaign as data: options, the table (counts per family and outcome), the notes and every probe."""
    return {"seed": ctx.seed, "seconds": round(seconds, 1), "columns": COLUMNS, "defects": list(DEFECTS),
            "table": tally(records), "notes": ctx.notes, "work": str(ctx.work), "cache": str(ctx.cache),
            "probes": [{"family": r.probe.family, "name": r.probe.name, "outcome": r.verdict.outcome,
                        "note": r.verdict.note, "argv": r.probe.argv[1:], "returncode": r.run.returncode,
                        "seconds": round(r.run.seconds, 2), "folder": str(r.run.folder)} for r in records]}


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the campaign, print the report; exit 1 when any defect column is non-zero."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=DEFAULT_PROBES,
                        help="number of probes, shared among the families (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every generated probe (default: 0)")
    parser.add_argument("--quick", action="store_true",
                        help="no tsim build at all: use only tsim models already in the private cache (or the "
                             "exact build copied from your cache) and skip the probes that rebuild or interrupt a "
                             "tsim build")
    parser.add_argument("--jobs", type=int, default=1,
                        help="probes run at once in the families that allow it (default: 1)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the table and every probe to OUT (JSON)")
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated families (default: all)")
    parser.add_argument("--tsim", choices=("build", "cached", "off"),
                        help="tsim models: build the missing ones into the private cache, use only those already "
                             "there, or skip tsim (default: build; cached with --quick)")
    parser.add_argument("--work", type=Path, help="folder for the probes' files (default: a new temp folder)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "vta-fault-cache",
                        help="the private cache (VTA_CACHE_DIR of every probe; default: %(default)s)")
    args = parser.parse_args(argv)
    families = [f for f in args.families.split(",") if f]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {', '.join(unknown)}; known: {', '.join(FAMILIES)}")
    if args.probes < len(families):
        parser.error(f"--probes must be at least the number of families ({len(families)})")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.json is not None and not args.json.resolve().parent.is_dir():
        parser.error(f"--json: the folder of {args.json} does not exist")
    work = args.work or Path(tempfile.mkdtemp(prefix="vta-faults-"))
    ctx = Context(work=work, cache=args.cache, seed=args.seed, tsim_mode=args.tsim or ("cached" if args.quick
                                                                                        else "build"),
                  quick=args.quick)
    began = time.monotonic()
    records = campaign(ctx, split_probes(args.probes, families), jobs=args.jobs)
    seconds = time.monotonic() - began
    print(report(records, ctx))
    print(f"\n{len(records)} probes in {seconds:.0f} s; seed {args.seed}; probe folders in {work}; private cache "
          f"{args.cache}")
    if args.json is not None:
        from vta.fileio import atomic_write_text
        atomic_write_text(args.json, json.dumps(to_json(records, ctx, seconds), indent=1) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(r.verdict.outcome in DEFECTS for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
