"""tests for vta/arrayfile.py and the array files the CLI reads (``--input``, ``--calibration``): an empty file, a
header that declares more data than the file holds, and an archive whose extra member would need gigabytes are each
refused in one sentence before any data is read (a 0-byte file gave numpy's EOFError traceback; a header claiming
2**40 rows gave "out of memory"; a 1.6 GB extra member was decompressed before its name was checked)."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from helpers import onnx_model
from onnx import helper

from vta.arrayfile import ArrayFileError, check_npy, npz_declared
from vta.compiler.frontend.calibration import CalibrationError, load_calibration
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.pipeline import InputError, load_input, read_npz_shapes

X = np.ones((1, 3, 4, 4), np.float32)


def _graph():
    return import_onnx(onnx_model([helper.make_node("Relu", ["x"], ["y"])], {"x": X}))


def _lying_npy(path: Path, rows: int) -> None:
    """An .npy file whose header declares ``rows`` rows of 3x4x4 float32 but holds one row (192 bytes)."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (rows, 3, 4, 4)})
        f.write(X.tobytes())


def test_an_empty_or_truncated_npy_is_named_before_it_is_read(tmp_path: Path):
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    with pytest.raises(ArrayFileError, match=r"--input .*empty.npy is empty \(0 bytes\)"):
        load_input(_graph(), str(empty))
    lying = tmp_path / "lying.npy"
    _lying_npy(lying, 2**40)
    with pytest.raises(ArrayFileError, match=r"is truncated or damaged: its header declares an array of shape "
                                             r"\(1099511627776, 3, 4, 4\) .* but holds 192 bytes of data"):
        check_npy(str(lying), "--input lying.npy")
    with pytest.raises(CalibrationError, match=r"is empty \(0 bytes\)"):
        load_calibration(str(empty), _graph())


def test_an_archive_member_is_checked_by_its_header_and_an_extra_one_is_never_decompressed(tmp_path: Path):
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, x=X, big=np.zeros((64, 1024, 1024), np.uint8))     # 64 MB of zeros, 64 kB on disk
    tracemalloc.start()
    try:
        assert read_npz_shapes(str(path)) == {"x": (1, 3, 4, 4), "big": (64, 1024, 1024)}
        with pytest.raises(InputError, match=r"gives 'big', 'x'; the model's inputs are 'x'"):
            load_input(_graph(), str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak                       # the 64 MB member was never read
    np.savez(path, x=X)
    assert npz_declared(str(path), "--input")["x"][0] == (1, 3, 4, 4)
    assert load_input(_graph(), str(path))["x"].shape == (1, 3, 4, 4)


def test_a_header_numpy_cannot_parse_an_encrypted_or_doubled_member_and_a_npy_named_npz(tmp_path: Path):
    """Four files a fuzzer of the new reader found: a header whose Python literal is cut short (tokenize's
    TokenError, a traceback), an archive member flagged encrypted (zipfile's RuntimeError, a traceback), two members
    of one name (the last was read, silently) and a .npy file named .npz (numpy's context-manager error)."""
    import zipfile
    header = tmp_path / "cut.npy"
    header.write_bytes(b"\x93NUMPY\x01\x00" + (118).to_bytes(2, "little") + b"{'descr': '<f4', 'shape': (1, 3" +
                       b" " * 85 + b"\n")
    with pytest.raises(ValueError, match=r"is not a .npy array of numbers"):
        load_input(_graph(), str(header))
    doubled = tmp_path / "doubled.npz"
    np.savez(doubled, x=X)
    with zipfile.ZipFile(doubled, "a") as archive, pytest.warns(UserWarning):
        archive.writestr("x.npy", b"")                                  # a second member named x
    with pytest.raises(ArrayFileError, match=r"holds two arrays named 'x'"):
        load_input(_graph(), str(doubled))
    encrypted = tmp_path / "encrypted.npz"
    np.savez(encrypted, x=X)
    data = bytearray(encrypted.read_bytes())
    for sig, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):       # set the "encrypted" bit in both headers
        k = data.find(sig)
        data[k + flag_at] |= 1
    encrypted.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"is not an .npz archive of number arrays \(File 'x.npy' is encrypted"):
        load_input(_graph(), str(encrypted))
    named = tmp_path / "one.npz"
    np.save(tmp_path / "one.npy", X)
    (tmp_path / "one.npy").rename(named)
    with pytest.raises(ValueError, match=r"holds one .npy array, not an .npz archive"):
        load_input(_graph(), str(named))
