"""The arrays a user gives in files (``--input``, ``--calibration``), checked from their ``.npy`` headers before any
data is read.

A file of 0 bytes, a header that declares more data than the file holds (a truncated file, or a header edited to
claim ``2**40`` rows), and an ``.npz`` member larger than the memory available are each named in one sentence
(:class:`ArrayFileError`, a ValueError: exit status 2). :func:`npz_declared` reads only each member's header, so a
caller can refuse a member by its name or size before decompressing it (an archive of one small input and an extra
member of 1.6 GB of zeros no longer costs 1.6 GB and seconds before its names are checked).
"""
from __future__ import annotations

import math
import os
import zipfile
from typing import IO

import numpy as np

__all__ = ["ArrayFileError", "check_npy", "npz_declared", "declared_bytes", "available_memory"]


class ArrayFileError(ValueError):
    """An array file that cannot hold what its header says, or that cannot fit in memory."""


def declared_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """The bytes of an array of ``shape`` and ``dtype`` (a Python int: no overflow for any declared shape)."""
    return math.prod(shape) * dtype.itemsize


def _declared(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype] | None:
    """The shape and dtype a ``.npy`` header declares (``stream`` left just after the header), or None when the
    stream does not start with a header numpy's public readers take (``np.load`` then names what it finds)."""
    try:
        version = np.lib.format.read_magic(stream)
        readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        reader = readers.get(version)
        if reader is None:
            return None
        shape, _, dtype = reader(stream)
    except Exception:  # noqa: BLE001 - any header numpy's readers cannot parse (a literal cut short: TokenError)
        return None
    if any(int(d) < 0 for d in shape):
        return None
    return tuple(int(d) for d in shape), np.dtype(dtype)


def available_memory() -> int | None:
    """Bytes of memory available to this process (Linux's ``MemAvailable``), or None where that is not known."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _check_fits(source: str, what: str, shape: tuple[int, ...], dtype: np.dtype, data: int) -> None:
    """ArrayFileError when an array of ``shape``/``dtype`` (``what``: the file or its member) needs more than the
    ``data`` bytes that follow its header, or more than the memory available."""
    need = declared_bytes(shape, dtype)
    if data < need:
        raise ArrayFileError(f"{source} is truncated or damaged: {what} declares an array of shape {shape} and dtype "
                             f"{dtype} ({need:,} bytes), but holds {data:,} bytes of data.")
    free = available_memory()
    if free is not None and need > free:
        raise ArrayFileError(f"{source}: {what} holds an array of shape {shape} ({need / 1e9:.1f} GB), more than "
                             f"the {free / 1e9:.1f} GB of memory available.")


def check_npy(path: str, source: str) -> None:
    """ArrayFileError naming ``source`` when the ``.npy`` file ``path`` is empty, holds less data than its header
    declares, or declares more than the memory available; nothing for a header numpy's public readers do not take
    (``np.load`` names it). OSError when the file cannot be read."""
    size = os.path.getsize(path)
    if size == 0:
        raise ArrayFileError(f"{source} is empty (0 bytes); save an array with numpy.save.")
    with open(path, "rb") as stream:
        found = _declared(stream)
        start = stream.tell()
    if found is not None and not found[1].hasobject:
        _check_fits(source, "its header", found[0], found[1], size - start)


def npz_declared(path: str, source: str) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    """Each member of the ``.npz`` file ``path`` by array name: the shape and dtype its header declares, read from
    the header alone (a few hundred bytes decompressed per member). ArrayFileError naming ``source`` when the file
    is empty or a member holds less data than its header declares or more than the memory available; None when the
    file is not a zip archive numpy wrote (``np.load`` names it), and a member whose header numpy's public readers
    do not take is left out. OSError when the file cannot be read."""
    if os.path.getsize(path) == 0:
        raise ArrayFileError(f"{source} is empty (0 bytes); save the arrays with numpy.savez.")
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    seen: set[str] = set()
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                if name in out or name in seen:
                    raise ArrayFileError(f"{source} holds two arrays named {name!r}; which one is meant is "
                                         f"ambiguous (numpy would read the last)")
                seen.add(name)
                with archive.open(info) as stream:
                    found = _declared(stream)
                    start = stream.tell()
                if found is None or found[1].hasobject:
                    continue
                _check_fits(source, f"its array {name!r}", found[0], found[1], info.file_size - start)
                out[name] = found
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError):
        return None                                      # not a zip numpy wrote, or a damaged one
    return out
