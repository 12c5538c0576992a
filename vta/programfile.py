"""Program files: the files a command that takes a program (``vta disasm``, ``vta tsim run``, ``vta run``) accepts.

* a saved program (``.npz``, :meth:`vta.program.Program.save`): one program, named after the file;
* a compiled model (``.vtac``, ``vta compile``): one program per accelerator layer, named after the layer's graph
  node; the reader lives on the compiler's floor and is reached by name through :data:`READERS` (imported on first
  use, like the backend registry), so this ground-floor module imports nothing above it.

:func:`read_programs` returns every program of a file, :func:`read_program` the one a ``--layer`` names. Every
problem (no such file, an unknown suffix, an unknown layer, a model with no accelerator layer) is a
:class:`ProgramFileError` (a ValueError) whose message is one sentence naming the file.
"""
from __future__ import annotations

import importlib
from os import PathLike
from pathlib import Path
from typing import Callable

from .program import Program

__all__ = ["ProgramFileError", "READERS", "SUFFIXES", "read_programs", "read_program"]


class ProgramFileError(ValueError):
    """A program file that cannot be read, or a layer it does not have."""


READERS: dict[str, str] = {".vtac": "vta.compiler.runtime.compiled:layer_programs"}
"""Suffix -> ``"module:function"`` returning ``[(layer name, Program), ...]`` for a file of that kind."""

SUFFIXES = (".npz", *READERS)
"""Every suffix a program file may have."""


def _reader(spec: str) -> Callable[[str], list[tuple[str, Program]]]:
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ProgramFileError(f"reading this file needs {module}, which is not available ({err})") from None


def read_programs(path: str | PathLike[str]) -> list[tuple[str, Program]]:
    """Every program in ``path`` as ``(name, program)``: one for a ``.npz`` (its file name), one per accelerator
    layer in graph order for a ``.vtac``."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise ProgramFileError(f"{p} is not a program file: expected {' or '.join(SUFFIXES)} (a saved program or a "
                               f"model compiled with `vta compile`), not {suffix or 'a file without a suffix'}")
    if not p.is_file():
        raise ProgramFileError(f"cannot read {p}: no such file")
    if suffix == ".npz":
        return [(p.name, Program.load(p))]
    programs = _reader(READERS[suffix])(str(p))
    if not programs:
        raise ProgramFileError(f"{p} has no accelerator layers (every layer runs on the CPU), so no program to "
                               f"read; compile it with --policy accel to put its layers on the accelerator")
    return programs


def read_program(path: str | PathLike[str], layer: str | None = None) -> tuple[str, Program]:
    """The program of layer ``layer`` in ``path`` (``None``: the file's only program). A ``.vtac`` with several
    accelerator layers needs ``layer``; a ``.npz`` takes none."""
    programs = read_programs(path)
    names = [name for name, _ in programs]
    if layer is None:
        if len(programs) == 1:
            return programs[0]
        raise ProgramFileError(f"{path} has {len(programs)} accelerator layers; choose one with --layer NAME: "
                               f"{_listing(names)}")
    if Path(path).suffix.lower() == ".npz":
        raise ProgramFileError(f"--layer names a layer of a compiled model (.vtac); {path} is a single program")
    for name, program in programs:
        if name == layer:
            return name, program
    raise ProgramFileError(f"{path} has no accelerator layer {layer!r}; its accelerator layers are {_listing(names)}")


def _listing(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")
