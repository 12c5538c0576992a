"""Tests for vta.fileio: atomic writes leave either the new file or the previous one, and no temporary file."""
import os

import numpy as np
import pytest

from vta.fileio import atomic_path, atomic_write_bytes, atomic_write_text


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_write_bytes_and_text(tmp_path):
    atomic_write_bytes(tmp_path / "a.bin", b"\x00\x01")
    atomic_write_text(str(tmp_path / "b.txt"), "h\u00e9\n")
    assert (tmp_path / "a.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "b.txt").read_bytes() == "h\u00e9\n".encode()
    atomic_write_bytes(tmp_path / "a.bin", b"new")
    assert (tmp_path / "a.bin").read_bytes() == b"new"
    assert _names(tmp_path) == ["a.bin", "b.txt"]


def test_new_file_gets_the_umask_mode(tmp_path):
    mask = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "a.bin", b"x")
    finally:
        os.umask(mask)
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == 0o644


def test_atomic_path_keeps_the_suffix_for_format_sniffing_writers(tmp_path):
    with atomic_path(tmp_path / "arrays.npz") as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".npz" and tmp.name.startswith(".arrays.npz.")
        np.savez(tmp, x=np.arange(3))  # np.savez would append .npz to a name without it
    with np.load(tmp_path / "arrays.npz") as data:
        assert data["x"].tolist() == [0, 1, 2]
    assert _names(tmp_path) == ["arrays.npz"]


def test_failure_mid_write_keeps_the_previous_file_and_no_temp(tmp_path):
    target = tmp_path / "model.vtac"
    target.write_bytes(b"previous")
    with pytest.raises(RuntimeError, match="^killed$"):
        with atomic_path(target) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"half of the new con")
            raise RuntimeError("killed")
    assert target.read_bytes() == b"previous"
    assert _names(tmp_path) == ["model.vtac"]


def test_failure_in_a_bytes_writer_keeps_the_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "x.txt"
    target.write_text("previous")

    def full_disk(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match=r"^cannot write .*x\.txt: No space left on device\.$") as info:
        atomic_write_text(target, "new")
    assert info.value.errno == 28
    assert target.read_text() == "previous"
    assert _names(tmp_path) == ["x.txt"]


def test_missing_folder_is_named(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=rf"^cannot write {missing}/m\.vtac: the folder {missing} does not "
                                                rf"exist; create it first or choose another path\.$"):
        atomic_write_bytes(missing / "m.vtac", b"")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        with atomic_path(missing / "m.vtac"):
            pass


def test_unwritable_folder_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "keep.txt").write_text("previous")
    real_open = os.open

    def denied(path, flags, *args):  # as chmod 555 would for a user who is not root
        if flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args)
    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(PermissionError, match=rf"^cannot write {folder}/keep\.txt: permission denied in the "
                                              rf"folder {folder}; choose a folder you can write to\.$") as info:
        atomic_write_text(folder / "keep.txt", "new")
    assert info.value.errno == 13
    assert (folder / "keep.txt").read_text() == "previous"
    assert _names(folder) == ["keep.txt"]


def test_a_folder_as_target_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match=r"^cannot write .*/d: it is a folder; give a file name\.$"):
        atomic_write_bytes(tmp_path / "d", b"x")
    assert _names(tmp_path) == ["d"]


def test_wrong_kinds_are_type_errors(tmp_path):
    with pytest.raises(TypeError, match=r"^atomic_write_bytes writes bytes, not str; use atomic_write_text for "
                                        r"text$"):
        atomic_write_bytes(tmp_path / "a", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^atomic_write_text writes a str, not bytes; use atomic_write_bytes for "
                                        r"bytes$"):
        atomic_write_text(tmp_path / "a", b"x")  # type: ignore[arg-type]
    assert _names(tmp_path) == []
