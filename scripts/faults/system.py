"""Probe families of a damaged environment: corrupted cache files (tsim builds, JIT objects, zoo models) and signals
(SIGINT, SIGKILL) at random points of a compile, a tsim build and a long tsim run."""
from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .context import CONFIGS, Context
from .core import Probe, Run, Verdict, execute, judge_cli, judge_process, vta_argv, worker_argv

TSIM_DAMAGE = ("so_truncate", "so_flip", "so_delete", "manifest_garbage", "manifest_digest")
OTHER_DAMAGE = ("jit_flip", "jit_truncate", "zoo_truncate", "zoo_garbage")


# ---- corrupted cache files ---------------------------------------------------------------------------------------
def _damage_file(path: Path, kind: str, rng: np.random.Generator) -> None:
    data = bytearray(path.read_bytes())
    if kind.endswith("truncate"):
        path.write_bytes(bytes(data[:int(rng.integers(0, max(1, len(data))))]))
    elif kind.endswith("flip"):
        for spot in rng.integers(0, len(data), size=int(rng.integers(1, 17))):
            data[int(spot)] ^= 0xFF
        path.write_bytes(bytes(data))
    elif kind.endswith("delete"):
        path.unlink()
    elif kind.endswith("garbage"):
        path.write_bytes(bytes(rng.integers(0, 256, 300, dtype=np.uint8)))


def _tsim_damage(entry: Path, kind: str, rng: np.random.Generator) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        if kind.startswith("so_"):
            _damage_file(entry / "libtsim.so", kind, rng)
        elif kind == "manifest_garbage":
            _damage_file(entry / "manifest.json", kind, rng)
        else:
            manifest = json.loads((entry / "manifest.json").read_text())
            files = manifest.get("files", {})
            if files:
                first = sorted(files)[0]
                files[first]["sha256"] = "0" * 64
            (entry / "manifest.json").write_text(json.dumps(manifest))
    return setup


def _cache_damage(ctx: Context, kind: str, rng: np.random.Generator) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        if kind.startswith("jit"):
            present = [p for p in ctx.jit_objects if p.exists()]
            _damage_file(present[int(rng.integers(len(present)))], kind, rng)
        else:
            _damage_file(ctx.refs["onnx"], kind, rng)
    return setup


def _repaired(run: Run) -> Verdict:
    """A command that met a damaged cache file must repair it and succeed: a clear error is a lost cache entry (the
    campaign's guard then checks that the entry is whole again)."""
    verdict = judge_cli(run)
    if verdict.outcome == "clear":
        return Verdict("lost", f"the damaged cache entry was not rebuilt: {verdict.note}")
    return verdict


def cache_probes(ctx: Context, rng: np.random.Generator, count: int) -> list[Probe]:
    """Damage a file in the private cache, then run what uses it: it must rebuild it (with a warning) and succeed,
    and the entry must verify afterwards (the guard). Each tsim kind runs once (each rebuilds the small config's
    model, ~1-2 min); ``ctx.quick`` skips them; the rest damage JIT objects and the cached zoo model."""
    kinds: list[str] = []
    if ctx.tsim_entries and not ctx.quick:
        kinds = list(TSIM_DAMAGE)[:max(0, count // 2)]
    elif ctx.tsim_entries:
        ctx.notes.append("cache: tsim entry damage skipped (--quick; each rebuilds a model)")
    kinds += [OTHER_DAMAGE[k % len(OTHER_DAMAGE)] for k in range(count - len(kinds))]
    probes = []
    small = "small1x8" if "small1x8" in ctx.tsim_entries else next(iter(ctx.tsim_entries), None)
    for k, kind in enumerate(kinds):
        sub = np.random.default_rng(rng.integers(1 << 31))
        if kind in TSIM_DAMAGE and small is not None:
            prog = "npz_small" if small == "small1x8" else "npz"
            argv = vta_argv("run", str(ctx.refs[prog]), "--target", "tsim")  # the program carries its config
            setup, timeout = _tsim_damage(ctx.tsim_entries[small], kind, sub), 1200.0
        elif kind.startswith("jit"):
            argv, setup, timeout = vta_argv("run", str(ctx.refs["vtac"]), "--no-progress"), _cache_damage(
                ctx, kind, sub), 120.0
        else:
            argv, setup, timeout = vta_argv("compile", "tiny_cnn", "-o", "out.vtac", "--no-progress"), _cache_damage(
                ctx, kind, sub), 120.0
        probes.append(Probe("cache", f"{kind} #{k}", argv, setup=setup, timeout=timeout, judge=_repaired,
                            mem_mb=8192 if kind in TSIM_DAMAGE else 4096))
    return probes


# ---- signals -----------------------------------------------------------------------------------------------------
def _own_processes(tag: str) -> list[int]:
    """Processes whose environment carries ``FAULT_PROBE_ID=tag`` (a probe's descendants)."""
    needle = f"FAULT_PROBE_ID={tag}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _reap(pids: list[int]) -> None:
    """Stop processes this campaign started (found by their probe tag), by id."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def signal_probes(ctx: Context, rng: np.random.Generator, count: int) -> list[Probe]:
    """SIGINT and SIGKILL at random times during ``vta compile -o existing.vtac``, a tsim build (of a variant not
    in the cache, in the private cache) and a long ``vta run --target tsim``."""
    makers = [_compile_probe, _compile_probe]
    if ctx.tsim_entries and not ctx.quick:
        makers += [_build_probe, _long_run_probe]
    elif ctx.tsim_entries:
        makers += [_long_run_probe]
        ctx.notes.append("signals: tsim build interruption skipped (--quick)")
    probes = []
    for k in range(count):
        signum = (signal.SIGINT, signal.SIGKILL)[(k // len(makers)) % 2]
        probes.append(makers[k % len(makers)](ctx, np.random.default_rng(rng.integers(1 << 31)), signum, k))
    return probes


def _compile_probe(ctx: Context, rng: np.random.Generator, signum: int, k: int) -> Probe:
    """Interrupt ``vta compile -o existing.vtac``: the old file survives intact, or a complete new one replaces it."""
    model = str(rng.choice(["tiny_cnn", "mini_resnet"]))
    delay = float(rng.uniform(0.2, 1.5 if model == "tiny_cnn" else 2.5))  # mostly before the command ends
    old = ctx.refs["vtac"].read_bytes()

    def setup(folder: Path) -> None:
        (folder / "existing.vtac").write_bytes(old)

    def judge(run: Run) -> Verdict:
        early = _signal_exit(run)
        if early is not None:
            return early
        target = run.folder / "existing.vtac"
        if target.exists() and target.read_bytes() == old:
            return Verdict("ok", f"{signal.Signals(signum).name} at {delay:.1f} s; the old artefact is intact")
        again = execute(Probe("check", "digest", worker_argv("digest", {"path": str(target), "kind": "vtac"})),
                        run.folder, ctx.env)
        result = again.result() or {}
        if "digest" in result:
            return Verdict("ok", f"{signal.Signals(signum).name} at {delay:.1f} s; a complete new artefact")
        return Verdict("lost", f"{signal.Signals(signum).name} at {delay:.1f} s: existing.vtac is damaged: {result}")
    return Probe("signals", f"compile {model} {signal.Signals(signum).name} at {delay:.1f}s",
                 vta_argv("compile", model, "--policy", "accel", "--no-progress", "-o", "existing.vtac"),
                 setup=setup, judge=judge, send=(signum, delay), timeout=120)


def _signal_exit(run: Run) -> Verdict | None:
    """A process we signalled: exit 130 with 'vta: interrupted' (SIGINT), killed by the signal sent (SIGKILL, or a
    SIGINT that arrives after the command's work, while the interpreter shuts down: Python then ends by the signal,
    as Unix asks, with no traceback), or 0 (finished first)."""
    early = judge_process(run)
    if early is not None:
        return early
    if run.sent_signal == signal.SIGINT and run.returncode not in (0, 130, -signal.SIGINT):
        return Verdict("traceback", f"exit {run.returncode} after SIGINT (expected 130)")
    if run.sent_signal == signal.SIGINT and run.returncode == 130 and "vta: interrupted" not in run.stderr:
        return Verdict("traceback", "exit 130 without 'vta: interrupted'")
    return None


LINGER_LIMIT = 240.0
"""Seconds a SIGKILL'ed build's compiler processes may run on to the end of their step before they count as
orphans (a small config's whole Verilator compile takes about a minute)."""


def _build_probe(ctx: Context, rng: np.random.Generator, signum: int, k: int) -> Probe:
    """Interrupt a tsim build (small config, VCD variant: never in the cache): no process of it may survive
    (after the build's own cleanup time on SIGINT), and the next start removes its temporary folder."""
    delay = float(rng.uniform(1.0, 15.0))
    tag = f"build-{ctx.seed}-{k}"
    root = ctx.cache / "tsim"

    def judge(run: Run) -> Verdict:
        early = _signal_exit(run)
        if early is not None:
            return early
        began = time.monotonic()
        if signum == signal.SIGINT:
            time.sleep(6.0)  # the build stops its process group itself (kill_group's grace is 3 s)
        else:  # SIGKILL cannot be handled: the compile step's processes (a session of their own) may run to the
            while _own_processes(tag) and time.monotonic() - began < LINGER_LIMIT:  # end of that step, no longer
                time.sleep(1.0)
        lingered = time.monotonic() - began
        survivors = _own_processes(tag)
        _reap(survivors)
        execute(Probe("check", "clean", worker_argv("clean_stale", {"root": str(root)})), run.folder, ctx.env)
        left = sorted(p.name for p in root.glob(".tmp-*"))
        for path in root.glob("1x8_*-vcd-*"):  # a build that finished before the signal: remove it, it is ours
            shutil.rmtree(path, ignore_errors=True)
        if survivors:
            return Verdict("orphans", f"{signal.Signals(signum).name} at {delay:.1f} s: {len(survivors)} build "
                                      f"processes still alive {lingered:.0f} s after the build's process ended")
        if left:
            return Verdict("orphans", f"temporary folders left after the next start: {left}")
        return Verdict("ok" if run.returncode == 0 else "clear", f"{signal.Signals(signum).name} at {delay:.1f} s; "
                       f"its processes gone after {lingered:.0f} s; no temporary folder after the next start")
    return Probe("signals", f"tsim build {signal.Signals(signum).name} at {delay:.1f}s",
                 vta_argv("tsim", "build", "--config", CONFIGS["small1x8"], "--trace", "vcd"), judge=judge,
                 send=(signum, delay), timeout=600, mem_mb=8192, env={"FAULT_PROBE_ID": tag})


def _long_run_probe(ctx: Context, rng: np.random.Generator, signum: int, k: int) -> Probe:
    """Interrupt a long ``vta run --target tsim`` (a 1024^3 GEMM at a built config) with SIGINT: exit 130 within
    two seconds."""
    delay = float(rng.uniform(1.0, 8.0))
    config = "small1x8" if "small1x8" in ctx.tsim_entries else next(iter(ctx.tsim_entries))
    args = ["run", "--target", "tsim", "--m", "1024", "--k", "1024", "--n", "1024"]
    if config != "default":
        args += ["--config", CONFIGS[config]]

    def judge(run: Run) -> Verdict:
        early = _signal_exit(run)
        if early is not None:
            return early
        if run.returncode == 130 and (run.signal_seconds or 0.0) > 2.0:
            return Verdict("hang", f"SIGINT at {delay:.1f} s: exit 130 only after {run.signal_seconds:.1f} s")
        if run.returncode == 0:
            return judge_cli(run)
        return Verdict("clear", f"SIGINT at {delay:.1f} s: exit 130 after {run.signal_seconds or 0:.2f} s")
    return Probe("signals", f"long tsim run at {config} SIGINT at {delay:.1f}s", vta_argv(*args), judge=judge,
                 send=(signal.SIGINT, delay), timeout=300)
