"""The fault campaign's shared state: its folders, private cache, reference files and the tsim builds it may use.

Everything the campaign writes lives under ``work`` (one folder per probe) and the private cache ``cache`` (passed to
every probe as ``VTA_CACHE_DIR``). Reference files (a compiled ``tiny_cnn``, saved programs) are made once by
:meth:`Context.prepare` and protected by the :class:`~core.Guard`.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .core import Guard, Probe, execute, sha256_file, vta_argv, worker_argv

REPO = Path(__file__).resolve().parent.parent.parent
CONFIGS: dict[str, str] = {"default": "default", "small1x8": str(REPO / "configs" / "small1x8.toml"),
                           "batch2x16": str(REPO / "configs" / "batch2x16.toml")}
"""The configs the program family co-simulates at: name -> path (``default``: VTA's defaults)."""


@dataclass
class Context:
    """Folders, environment, reference files and the set of configs with a usable tsim build."""

    work: Path
    cache: Path
    seed: int
    tsim_mode: str = "cached"
    quick: bool = False
    env: dict[str, str] = field(default_factory=dict)
    guard: Guard = field(default_factory=Guard)
    tsim_configs: list[str] = field(default_factory=list)
    refs: dict[str, Path] = field(default_factory=dict)
    digests: dict[str, str] = field(default_factory=dict)
    tsim_entries: dict[str, Path] = field(default_factory=dict)
    jit_objects: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        self.env = {**os.environ, "VTA_CACHE_DIR": str(self.cache), "VTA_TSIM_PGO": "0", "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": path}  # the checkout under test, whatever the installed copy points at
        self.env.pop("VTA_DEBUG", None)

    def folder(self, family: str, index: int) -> Path:
        """A fresh folder for one probe."""
        path = self.work / f"{family}-{index:03d}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def run_helper(self, argv: list[str], timeout: float = 600.0) -> Any:
        """Run a preparation command (not a probe) and return its worker result or raise with its output."""
        run = execute(Probe("setup", "setup", argv, timeout=timeout, mem_mb=8192), self.work, self.env)
        if run.returncode != 0 or run.timed_out:
            raise RuntimeError(f"campaign setup failed: {' '.join(argv[2:])}: {run.excerpt(8)}")
        return run.result()

    # ---- preparation -----------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Make the reference files, find (or build) the tsim models, and protect all of it."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.cache.mkdir(parents=True, exist_ok=True)
        refs = self.work / "refs"
        refs.mkdir(exist_ok=True)
        self.refs["vtac"] = refs / "tiny_accel.vtac"
        self.run_helper(vta_argv("compile", "tiny_cnn", "--policy", "accel", "--no-progress", "-o",
                                 str(self.refs["vtac"])))
        self.refs["onnx"] = next((self.cache / "models").glob("tiny_cnn*.onnx"))
        jit = self.cache / "jit"
        shutil.rmtree(jit, ignore_errors=True)  # what is left holds exactly the objects the reference run uses:
        self.run_helper(vta_argv("run", str(self.refs["vtac"]), "--no-progress"))
        self.jit_objects = sorted(jit.glob("*.o"))  # the cache probes damage these; that run must repair them
        self.guard.add_check("JIT objects", _jit_check(self.jit_objects))
        script = ("import numpy as np, sys; from vta.config import VTAConfig, load_config; "
                  "from vta.testing import random_program; "
                  "cfg = VTAConfig() if sys.argv[2] == 'default' else load_config(sys.argv[2]); "
                  "random_program(cfg, np.random.default_rng(int(sys.argv[3]))).save(sys.argv[1])")
        for name, path in (("npz", "default"), ("npz_small", CONFIGS["small1x8"])):
            self.refs[name] = refs / f"{name}.npz"
            self.run_helper([sys.executable, "-c", script, str(self.refs[name]), path, str(self.seed)])
        for name in ("vtac", "npz", "npz_small"):
            kind = "vtac" if name == "vtac" else "npz"
            result = self.run_helper(worker_argv("digest", {"path": str(self.refs[name]), "kind": kind}))
            self.digests[name] = result["digest"]
        for ref in self.refs.values():
            self.guard.add(ref)
        self._find_tsim()

    def _find_tsim(self) -> None:
        """The configs whose tsim model is in the private cache: built now (``tsim_mode="build"``), copied read-only
        from the user's cache when the exact build is there (``"cached"``), or none (``"off"``)."""
        if self.tsim_mode == "off":
            self.notes.append("tsim probes skipped: --tsim off")
            return
        keys = self.run_helper([sys.executable, "-c", _KEYS_SCRIPT, json.dumps(CONFIGS)])
        user_root = _user_cache() / "tsim"
        for name, key in keys.items():
            entry = self.cache / "tsim" / key
            if not entry.is_dir() and (user_root / key).is_dir():
                shutil.copytree(user_root / key, entry)  # a read-only copy of the one build folder we need
            problem = self.run_helper(worker_argv("verify", {"folder": str(entry), "required": ["libtsim.so"]}))
            if problem["problem"] is not None and self.tsim_mode == "build":  # missing or damaged: (re)build it
                self.run_helper([sys.executable, "-c", _BUILD_SCRIPT, CONFIGS[name]], timeout=1800)
                problem = self.run_helper(worker_argv("verify", {"folder": str(entry), "required": ["libtsim.so"]}))
            if problem["problem"] is None:
                self.tsim_configs.append(name)
                self.tsim_entries[name] = entry
                self.guard.add_check(f"tsim cache entry {key}", _entry_check(entry))
            else:
                self.notes.append(f"tsim probes at {name} skipped: no build {key} in the private cache "
                                  f"(run with --tsim build)")


JIT_MAGIC = b"vta-jit-object sha256 "
"""The header of a cached JIT object (compiler/kernels/cpu.py): this, the object code's SHA-256 in hex, a newline."""


def jit_object_problem(path: Path) -> str | None:
    """None when the cached JIT object ``path`` is missing (rebuilt on next use) or whole; otherwise what is wrong."""
    import hashlib
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    head, _, obj = data.partition(b"\n")
    if not head.startswith(JIT_MAGIC) or head[len(JIT_MAGIC):] != hashlib.sha256(obj).hexdigest().encode():
        return f"{path.name} is damaged ({len(data)} bytes, header and object code do not match)"
    return None


def _jit_check(objects: list[Path]) -> Any:
    def check() -> str | None:
        problems = [p for p in map(jit_object_problem, objects) if p is not None]
        return "; ".join(problems) if problems else None
    return check


def _entry_check(entry: Path) -> Any:
    def check() -> str | None:
        from vta.cache import verify_entry
        return verify_entry(entry, ["libtsim.so"])
    return check


def _user_cache() -> Path:
    """The user's own cache root (read, never written, by the campaign): ``$VTA_CACHE_DIR`` as the campaign was
    started, else the default."""
    from vta.cache import cache_root
    return cache_root()


_KEYS_SCRIPT = """
import json, sys
from vta.config import VTAConfig, load_config
from vta.tsim import build as b
gen, src = b.resolve_generator(None, None)
configs = json.loads(sys.argv[1])
keys = {}
for name, path in configs.items():
    cfg = VTAConfig() if path == "default" else load_config(path)
    keys[name] = f"{cfg.name}-fast-{b._source_hash(cfg, src, 'none')}"
print("FAULT-RESULT " + json.dumps(keys))
"""

_BUILD_SCRIPT = """
import sys
from vta.config import VTAConfig, load_config
from vta.tsim.build import build
build(VTAConfig() if sys.argv[1] == "default" else load_config(sys.argv[1]), progress=False, pgo=False)
print("FAULT-RESULT {}")
"""


def file_digest(path: Path) -> str:
    """The SHA-256 of a file (re-exported for the families)."""
    return sha256_file(path)
