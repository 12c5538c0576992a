"""The cache folder and its self-repairing build entries (vta/cache.py)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import filelock
import pytest

from vta import cache
from vta.cache import cache_root, cached_build, clean_stale, entry_lock, temp_dir, verify_entry


class Maker:
    """A stand-in build step: writes ``lib.so`` and ``sub/data.txt``, counts its calls."""

    def __init__(self, payload: bytes = b"\x7fELF" + bytes(range(256)) * 40) -> None:
        self.payload = payload
        self.calls = 0

    def __call__(self, out: Path) -> dict[str, Any]:
        self.calls += 1
        (out / "lib.so").write_bytes(self.payload)
        (out / "sub").mkdir()
        (out / "sub" / "data.txt").write_text("data\n")
        return {"what": "test"}


def _build(root: Path, maker: Maker) -> tuple[Path, bool]:
    return cached_build(root, "k1", maker, required=["lib.so"], what="test library")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---- the cache folder ------------------------------------------------------------------------------------------------
def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path and cache_root("jit") == tmp_path / "jit"
    monkeypatch.setenv("VTA_CACHE_DIR", "")
    import platformdirs
    assert cache_root("tsim") == Path(platformdirs.user_cache_dir("vta-lab")) / "tsim"


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG default is Linux's")
def test_the_default_is_where_it_was_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VTA_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == Path("~/.cache/vta-lab").expanduser()


# ---- build, hit, manifest --------------------------------------------------------------------------------------------
def test_a_build_records_a_manifest_and_a_second_call_is_a_hit(tmp_path: Path) -> None:
    maker = Maker()
    folder, built = _build(tmp_path, maker)
    assert (folder, built, maker.calls) == (tmp_path / "k1", True, 1)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["key"] == "k1" and manifest["what"] == "test"
    assert sorted(manifest["files"]) == ["lib.so", "sub/data.txt"]
    assert manifest["files"]["lib.so"] == {"size": len(maker.payload),
                                           "sha256": cache.file_sha256(folder / "lib.so")}
    assert _build(tmp_path, maker) == (folder, False) and maker.calls == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k1", "k1.lock"], "no temporary folder is left"


# ---- damaged entries are rebuilt with a warning ----------------------------------------------------------------------
def _damage_and_rebuild(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any) -> str:
    maker = Maker()
    folder, _ = _build(tmp_path, maker)
    damage(folder)
    with caplog.at_level(logging.WARNING, logger="vta"):
        assert _build(tmp_path, maker) == (folder, True)
    assert maker.calls == 2
    assert verify_entry(folder, ["lib.so"]) is None
    assert (folder / "lib.so").read_bytes() == maker.payload
    [record] = [r for r in caplog.records if r.name == "vta"]
    assert record.levelno == logging.WARNING
    return record.getMessage()


def test_a_truncated_library_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def truncate(folder: Path) -> None:
        with open(folder / "lib.so", "r+b") as f:
            f.truncate(100)

    message = _damage_and_rebuild(tmp_path, caplog, truncate)
    assert message == (f"the cached test library in {tmp_path / 'k1'} is damaged: lib.so is 100 bytes, the manifest "
                       "says 10244; removing it and building it again")


def test_a_library_deleted_from_its_folder_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    message = _damage_and_rebuild(tmp_path, caplog, lambda folder: (folder / "lib.so").unlink())
    assert message.endswith("is damaged: lib.so is missing; removing it and building it again")


def test_same_size_other_content_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def flip(folder: Path) -> None:
        data = bytearray((folder / "lib.so").read_bytes())
        data[5000] ^= 0xFF
        (folder / "lib.so").write_bytes(bytes(data))

    message = _damage_and_rebuild(tmp_path, caplog, flip)
    assert "is damaged: lib.so's SHA-256 differs from the manifest's;" in message


def test_a_folder_without_manifest_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    message = _damage_and_rebuild(tmp_path, caplog, lambda folder: (folder / "manifest.json").unlink())
    assert "is damaged: it has no manifest.json (an unfinished or old-format build);" in message


def test_verify_entry_names_what_is_wrong(tmp_path: Path) -> None:
    assert verify_entry(tmp_path / "nothing") == "it does not exist"
    folder, _ = _build(tmp_path, Maker())
    assert verify_entry(folder, ["lib.so"]) is None
    assert verify_entry(folder, ["lib.so", "other.so"]) == "its manifest.json does not list other.so"
    (folder / "manifest.json").write_text("{not json")
    assert verify_entry(folder).startswith("its manifest.json cannot be read (JSONDecodeError: ")
    (folder / "manifest.json").write_text('{"files": []}')
    assert verify_entry(folder) == "its manifest.json cannot be read (TypeError: files is not a mapping)"


def test_an_interrupted_build_leaves_nothing(tmp_path: Path) -> None:
    def interrupted(out: Path) -> dict[str, Any]:
        (out / "lib.so").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_build(tmp_path, "k1", interrupted, required=["lib.so"], what="test library")
    assert [p.name for p in tmp_path.iterdir()] == ["k1.lock"]


# ---- stale temporary folders -----------------------------------------------------------------------------------------
def test_stale_temp_folders_are_cleaned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dead = _dead_pid()
    stale = tmp_path / f".tmp-k1-{dead}-12345"
    stale_trash = tmp_path / f".trash-k2-{dead}-0"
    locked = tmp_path / f".tmp-k3-{dead}-12345"           # its process is gone but someone holds k3's lock
    mine = temp_dir(tmp_path, "k4")                      # a live build: this process
    other = tmp_path / ".cache-of-something-else"
    for path in (stale, stale_trash, locked, mine, other):
        (path / "obj").mkdir(parents=True)
        (path / "obj" / "big.o").write_bytes(b"x" * 1000)
    with entry_lock(tmp_path, "k3"), caplog.at_level(logging.INFO, logger="vta"):
        assert clean_stale(tmp_path) == [stale, stale_trash]
    assert not stale.exists() and not stale_trash.exists()
    assert locked.exists() and mine.exists() and other.exists()
    assert f"removed {stale} (0.0 MB), left by a build that was stopped (process {dead})" in caplog.messages
    assert clean_stale(tmp_path) == [locked], "once its lock is free"


def test_a_build_cleans_stale_folders_first(tmp_path: Path) -> None:
    stale = tmp_path / f".tmp-k1-{_dead_pid()}-1"
    stale.mkdir(parents=True)
    _build(tmp_path, Maker())
    assert not stale.exists()


def test_a_pid_reused_by_another_process_is_not_the_builder(tmp_path: Path) -> None:
    start = cache._process_start(os.getpid())
    if start == 0:
        pytest.skip("process start times are not readable here")
    reused = tmp_path / f".tmp-k1-{os.getpid()}-{start + 1}"
    reused.mkdir()
    assert clean_stale(tmp_path) == [reused]


def test_a_held_lock_is_seen_as_held(tmp_path: Path) -> None:
    with entry_lock(tmp_path, "k1"):
        with pytest.raises(filelock.Timeout):
            entry_lock(tmp_path, "k1").acquire(timeout=0)


# ---- area results (one JSON file each) -------------------------------------------------------------------------------
def test_a_damaged_area_result_is_removed_and_redone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    from vta.config import VTAConfig
    from vta.hw import area
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    cfg = VTAConfig()
    path = area.cache_path(cfg)
    path.parent.mkdir(parents=True)
    good = {**area.parse_stat({"LUT6": 3, "FDRE": 2}), "config": cfg.name, "hw_hash": "h", "seconds": 1.0}
    path.write_text(json.dumps(good))
    assert area.resources(cfg) == good, "a sound result is a cache hit (no synthesis)"
    with caplog.at_level(logging.WARNING, logger="vta"):
        path.write_text(json.dumps(good)[:40])
        assert area._read_cached(path) is None and not path.exists()
        path.write_text(json.dumps({k: v for k, v in good.items() if k not in ("ff", "dsp")}))
        assert area._read_cached(path) is None and not path.exists()
    assert caplog.messages[0].startswith(f"the cached area result {path} is damaged: it cannot be read "
                                         "(JSONDecodeError: ")
    assert caplog.messages[1] == (f"the cached area result {path} is damaged: it lacks ff, dsp; removing it and "
                                  "synthesizing again")
