"""Where the lab keeps what it generates (Verilog, Verilator builds, JIT object code, model files, area reports), and
how a cached build stays trustworthy.

One folder, ``$VTA_CACHE_DIR`` (default ``platformdirs.user_cache_dir("vta-lab")``, which is ``~/.cache/vta-lab`` on
Linux), read when asked (never at import), with one sub-folder per kind: ``tsim/``, ``cocotb/``, ``area/``, ``jit/``,
``models/``.

A cached build is a folder ``<root>/<key>/`` made by :func:`cached_build`:

* builds of one key serialize on ``<root>/<key>.lock`` (a :mod:`filelock` lock, released by the kernel when its
  holder dies);
* the build happens in ``<root>/.tmp-<key>-<pid>-<start>/`` (the builder's process id and start time) next to the
  final folder; a ``manifest.json`` listing every file with its size and SHA-256 is written last, then the folder
  is published by one atomic rename (a damaged folder in the way is moved aside and removed first);
* before use the manifest is verified (every file's size and hash); a damaged or incomplete entry is removed with a
  warning on the ``vta`` logger and built again, never used;
* temporary folders of builds that were killed are removed when a later build starts (:func:`clean_stale`): those
  whose process is gone and whose lock is free.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from .fileio import atomic_write_text, fsync_folder

__all__ = ["cache_root", "cached_build", "verify_entry", "write_manifest", "clean_stale", "entry_lock", "temp_dir",
           "remove_entry", "file_sha256", "MANIFEST"]

MANIFEST = "manifest.json"
"""The file of a cached build listing its files (``files``: relative path -> size and sha256), written last."""

log = logging.getLogger("vta")

_TEMP = re.compile(r"^\.(?:tmp|trash)-(?P<key>.+)-(?P<pid>\d+)-(?P<start>\d+)$")
_verified: dict[Path, tuple[tuple[int, int, int], ...]] = {}  # folder -> stat signature when last verified


def cache_root(kind: str = "") -> Path:
    """The cache folder ``$VTA_CACHE_DIR`` (default ``platformdirs.user_cache_dir("vta-lab")``, ``~/.cache/vta-lab``
    on Linux), or its sub-folder ``kind``."""
    env = os.environ.get("VTA_CACHE_DIR")
    if env:
        root = Path(env).expanduser()
    else:
        import platformdirs
        root = Path(platformdirs.user_cache_dir("vta-lab", appauthor=False))
    return root / kind if kind else root


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's contents, as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_lock(root: Path, key: str) -> Any:
    """The lock serializing builds (and removal) of entry ``key`` in ``root``: a ``filelock.FileLock`` on
    ``<root>/<key>.lock``."""
    import filelock
    return filelock.FileLock(str(root / f"{key}.lock"))


def _process_start(pid: int) -> int:
    """The start time of process ``pid`` in clock ticks since boot (Linux), 0 where that is unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[19])


def _alive(pid: int, start: int) -> bool:
    """Whether process ``pid`` that started at ``start`` (0: unknown) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return start == 0 or _process_start(pid) in (0, start)


def temp_dir(root: Path, key: str, kind: str = "tmp") -> Path:
    """A temporary folder name for this process's build (``kind="tmp"``) or removal (``"trash"``) of ``key``:
    ``<root>/.<kind>-<key>-<pid>-<start>``, which :func:`clean_stale` can tell from a live one."""
    pid = os.getpid()
    return root / f".{kind}-{key}-{pid}-{_process_start(pid)}"


def remove_entry(folder: Path) -> None:
    """Remove the cache folder ``folder``: renamed aside first (atomic), so no one sees it half deleted."""
    if not folder.exists():
        return
    trash = temp_dir(folder.parent, folder.name, "trash")
    shutil.rmtree(trash, ignore_errors=True)
    os.rename(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def write_manifest(folder: Path, info: dict[str, Any]) -> None:
    """Write ``folder/manifest.json``: ``info`` plus ``files`` (every file's size and SHA-256), each file flushed to
    disk first, so a manifest only exists for a complete folder."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    atomic_write_text(folder / MANIFEST, json.dumps({**info, "files": files}, indent=1))


def _signature(folder: Path, names: Iterable[str]) -> tuple[tuple[int, int, int], ...]:
    sig = []
    for name in [MANIFEST, *names]:
        st = (folder / name).stat()
        sig.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(sig)


def verify_entry(folder: Path, required: Iterable[str] = ()) -> str | None:
    """None when ``folder`` is a complete cached build: its manifest lists every file in ``required`` and every
    listed file has the recorded size and SHA-256. Otherwise what is wrong, as a phrase for a message. A folder
    verified before in this process, unchanged since (same inode, size and time of its files), is not hashed again."""
    required = list(required)
    manifest_path = folder / MANIFEST
    if not folder.is_dir():
        return "it does not exist"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not a mapping")
    except FileNotFoundError:
        return f"it has no {MANIFEST} (an unfinished or old-format build)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its {MANIFEST} cannot be read ({type(err).__name__}: {err})"
    missing = [name for name in required if name not in files]
    if missing:
        return f"its {MANIFEST} does not list {', '.join(missing)}"
    try:
        signature = _signature(folder, files)
    except OSError:
        signature = ()
    if signature and _verified.get(folder) == signature:
        return None
    for name, record in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != record.get("size"):
            return f"{name} is {size} bytes, the manifest says {record.get('size')}"
        if file_sha256(path) != record.get("sha256"):
            return f"{name}'s SHA-256 differs from the manifest's"
    if signature:
        _verified[folder] = signature
    return None


def clean_stale(root: Path) -> list[Path]:
    """Remove the temporary folders in ``root`` left by builds that were killed: those whose builder process is gone
    and whose lock nobody holds. Returns the folders removed."""
    import filelock
    removed = []
    for path in sorted(root.glob(".*-*")) if root.is_dir() else []:
        match = _TEMP.match(path.name)
        if not match or not path.is_dir() or _alive(int(match["pid"]), int(match["start"])):
            continue
        lock = entry_lock(root, match["key"])
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            continue
        try:
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path, ignore_errors=True)
            log.info("removed %s (%.1f MB), left by a build that was stopped (process %s)", path, size / 1e6,
                     match["pid"])
            removed.append(path)
        finally:
            lock.release()
    return removed


@contextlib.contextmanager
def _held(lock: Any, what: str, key: str) -> Any:
    """``lock`` acquired for the block; when another process holds it (building the same entry), a warning says so
    before waiting, so a run that waits is not silent."""
    import filelock
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        log.warning("another process is building the %s %s (its lock %s is held); waiting for it to finish, then "
                    "using its build", what, key, lock.lock_file)
        lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


def cached_build(root: Path, key: str, make: Callable[[Path], dict[str, Any]], *, required: Iterable[str],
                 what: str) -> tuple[Path, bool]:
    """The verified cache folder ``<root>/<key>``, built now if missing or damaged; returns (folder, built now).

    ``make(tmp)`` fills the empty folder ``tmp`` and returns the information to record in the manifest.
    ``required``: the files (relative paths) that must be in the manifest, e.g. the library to load. ``what`` names
    the build in the warning logged when a damaged entry is replaced. On any exception (KeyboardInterrupt too) the
    temporary folder is removed and nothing is published.
    """
    required = list(required)
    final = root / key
    if verify_entry(final, required) is None:
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    clean_stale(root)
    with _held(entry_lock(root, key), what, key):
        problem = verify_entry(final, required)
        if problem is None:  # another process built it while we waited
            return final, False
        if final.exists():
            log.warning("the cached %s in %s is damaged: %s; removing it and building it again", what, final, problem)
        tmp = temp_dir(root, key)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            info = make(tmp)
            write_manifest(tmp, {"key": key, "built": time.strftime("%Y-%m-%dT%H:%M:%S"), **info})
            remove_entry(final)
            os.rename(tmp, final)
            with contextlib.suppress(OSError):  # best effort: the entry is published and verified before each use
                fsync_folder(root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final, True
