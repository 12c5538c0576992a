"""Atomic file writes: a file is either the complete new content or the previous file, never half of either.

Every writer goes through a temporary file in the target's own folder (same file system, so the final
:func:`os.replace` is atomic), named ``.<name>.<random>.tmp<suffix>`` so that writers which choose a format by the
file name's suffix (``numpy.savez``, ``matplotlib`` ``savefig``) still see the target's suffix. The temporary file is
flushed and ``fsync``'ed before it replaces the target, and the folder is ``fsync``'ed after (where the platform
allows), so a crash or a kill at any moment leaves the previous file intact; on any failure the temporary file is
removed.

* :func:`atomic_write_bytes` and :func:`atomic_write_text` write a whole ``bytes``/``str`` value.
* :func:`atomic_path` is a context manager yielding the temporary path, for writers that need a file name; the
  target is replaced only when the ``with`` block ends without an exception.
* :func:`fsync_folder` makes a rename in a folder durable, for callers that publish by a rename of their own (the
  build cache, :mod:`vta.cache`).

Errors are :class:`OSError` (of the original subclass, e.g. :class:`PermissionError`, with its ``errno``) whose
message is a sentence naming the path, e.g. ``cannot write out/model.vtac: the folder out does not exist; create it
first or choose another path.``
"""
from __future__ import annotations

import errno
import os
import secrets
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "fsync_folder"]


def _error(err: OSError, target: Path, doing: str = "write") -> OSError:
    """``err`` as the same OSError subclass whose message is a sentence naming ``target``."""
    folder = target.parent
    if isinstance(err, FileNotFoundError) and not folder.is_dir():
        reason = f"the folder {folder} does not exist; create it first or choose another path."
    elif isinstance(err, PermissionError):
        reason = f"permission denied in the folder {folder}; choose a folder you can write to."
    elif isinstance(err, IsADirectoryError) or target.is_dir():
        reason = "it is a folder; give a file name."
    else:
        reason = f"{err.strerror or err}."
    new = type(err)(f"cannot {doing} {target}: {reason}")
    new.errno = err.errno
    return new


def _create_temp(target: Path) -> Path:
    """A new, empty file next to ``target`` (mode from the umask, as an ordinary ``open``)."""
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp{target.suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as err:
            raise _error(err, target) from err
        os.close(fd)
        return tmp


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable; silently skipped where folders cannot be opened (Windows) or file systems
    cannot fsync them (EINVAL, EBADF); any other failure raises its OSError."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF):  # some file systems cannot fsync a folder
            raise
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@contextmanager
def atomic_path(path: str | PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; when the block succeeds, the file written there is ``fsync``'ed
    and atomically replaces ``path``. When the block raises, the temporary file is removed, ``path`` is untouched
    and the exception propagates unchanged.

    Raises :class:`OSError` naming ``path`` when the folder is missing or not writable, or the final replace fails.
    """
    target = Path(path)
    tmp = _create_temp(target)
    try:
        yield tmp
        try:
            _fsync_path(tmp)
            os.replace(tmp, target)
            fsync_folder(target.parent)
        except OSError as err:
            raise _error(err, target) from err
    finally:
        _remove(tmp)  # after a successful replace the temporary name no longer exists


def atomic_write_bytes(path: str | PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`); raises :class:`OSError` naming ``path``."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"atomic_write_bytes writes bytes, not {type(data).__name__}; use atomic_write_text for "
                        f"text")
    target = Path(path)
    with atomic_path(target) as tmp:
        try:
            with open(tmp, "wb") as f:
                f.write(data)
        except OSError as err:
            raise _error(err, target) from err


def atomic_write_text(path: str | PathLike[str], text: str, *, encoding: str = "utf-8") -> None:
    """Write ``text`` to ``path`` atomically, encoded as ``encoding`` (default UTF-8); raises :class:`OSError`
    naming ``path``."""
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text writes a str, not {type(text).__name__}; use atomic_write_bytes for "
                        f"bytes")
    atomic_write_bytes(path, text.encode(encoding))
