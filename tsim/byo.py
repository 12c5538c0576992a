"""Bring your own RTL: a foreign core (Verilog/SystemVerilog files, or ``.f`` file lists) as a TSIM generator.

``ForeignCore(files, top=...)`` is a generator for :func:`vta.tsim.build.build` and
:class:`vta.tsim.backend.TSimBackend` (``generator=core, sources=core.sources``; :meth:`ForeignCore.backend_options`
gives both): called with a config and a folder, it lints the files with Verilator, checks the top module's ports
against :func:`vta.tsim.ports.expected_ports` (one :class:`~vta.tsim.ports.CoreInterfaceError` naming every
mismatch, before any build starts), copies the files into the folder and returns a ``.f`` list of the copies, which
the build hands to Verilator with ``--top-module top``. The build is cached by the files' contents (``sources``) and
the top's name. Call :meth:`ForeignCore.check` to run the check on its own (the command line does, before anything
else).

File lists: one entry a line; ``//`` and ``#`` start comments; a relative path is relative to the list's folder;
``+incdir+DIR`` adds an include folder; ``-f OTHER.f`` includes another list. Header files (``.vh``, ``.svh``) are
copied and hashed but not compiled on their own.
"""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any, Sequence

from vta.config import VTAConfig
from vta.fileio import atomic_write_text

from .ports import TOP_NAME, Port, check_core

__all__ = ["ForeignCore", "read_file_list", "SOURCE_SUFFIXES", "HEADER_SUFFIXES"]

SOURCE_SUFFIXES = (".v", ".sv")
"""Suffixes of files compiled as Verilog / SystemVerilog."""
HEADER_SUFFIXES = (".vh", ".svh")
"""Suffixes of include files: copied beside the sources and hashed, not compiled on their own."""


def read_file_list(path: Path, _seen: tuple[Path, ...] = ()) -> tuple[list[Path], list[Path]]:
    """The files and include folders a ``.f`` list names (see the module docstring); ValueError naming the list and
    each bad line."""
    path = Path(path).resolve()
    if path in _seen:
        raise ValueError(f"the file list {path} includes itself (through {' -> '.join(str(p) for p in _seen)})")
    files: list[Path] = []
    incdirs: list[Path] = []
    problems = []
    words: list[tuple[int, str]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("//", 1)[0].split("#", 1)[0]
        words.extend((number, word) for word in shlex.split(line))
    k = 0
    while k < len(words):
        number, word = words[k]
        k += 1
        if word.startswith("+incdir+"):
            incdirs.extend(path.parent / d for d in word[len("+incdir+"):].split("+") if d)
        elif word in ("-f", "-F"):
            if k >= len(words):
                problems.append(f"line {number}: -f needs a file list after it")
                continue
            sub_files, sub_dirs = read_file_list(path.parent / words[k][1], (*_seen, path))
            k += 1
            files += sub_files
            incdirs += sub_dirs
        elif word.startswith(("-", "+")):
            problems.append(f"line {number}: option {word!r} is not supported (only file names, +incdir+DIR and -f "
                            "LIST)")
        else:
            files.append(path.parent / word)
    if problems:
        raise ValueError(f"the file list {path} has {len(problems)} problem{'s' if len(problems) > 1 else ''}: "
                         + "; ".join(problems))
    return files, incdirs


class ForeignCore:
    """A core from the user's files, used as a TSIM generator (see the module docstring).

    ``files``: Verilog (``.v``), SystemVerilog (``.sv``), header (``.vh``, ``.svh``) files or ``.f`` lists.
    ``top``: the top module's name (default ``vta_core``). Raises ValueError naming every missing or unknown file
    (and duplicate base names, which the copies would not keep apart) at once.
    """

    def __init__(self, files: Sequence[str | Path], *, top: str | None = None) -> None:
        if isinstance(files, (str, Path)):
            files = [files]
        if not files:
            raise ValueError("a foreign core needs at least one Verilog file (.v, .sv) or file list (.f)")
        top = TOP_NAME if top is None else top
        if not isinstance(top, str) or not top.isidentifier():
            raise ValueError(f"top must be a Verilog module name, not {top!r}")
        self.top = top
        problems: list[str] = []
        self.lists: list[Path] = []
        paths: list[Path] = []
        include_dirs: list[Path] = []
        for given in files:
            path = Path(given)
            if not path.is_file():
                problems.append(f"{path}: no such file")
            elif path.suffix == ".f":
                self.lists.append(path.resolve())
                try:
                    listed, dirs = read_file_list(path)
                except (OSError, ValueError) as err:
                    problems.append(str(err))
                    continue
                paths += listed
                include_dirs += dirs
            else:
                paths.append(path)
        seen: dict[str, Path] = {}
        self.files: list[Path] = []
        for path in paths:
            if not path.is_file():
                problems.append(f"{path}: no such file")
                continue
            if path.suffix not in SOURCE_SUFFIXES + HEADER_SUFFIXES:
                problems.append(f"{path}: not a Verilog or SystemVerilog file (.v, .sv, .vh, .svh) or a file list "
                                "(.f)")
                continue
            path = path.resolve()
            if path.name in seen and seen[path.name] != path:
                problems.append(f"{path} and {seen[path.name]} have the same name; rename one")
                continue
            if path.name not in seen:
                seen[path.name] = path
                self.files.append(path)
        self.include_dirs = include_dirs
        for folder in include_dirs:
            self.files += sorted(p.resolve() for p in folder.glob("*") if p.suffix in HEADER_SUFFIXES
                                 and p.name not in seen)
        if problems:
            raise ValueError(f"the foreign core's files have {len(problems)} problem"
                             f"{'s' if len(problems) > 1 else ''}: " + "; ".join(problems))
        if not self.compiled_files:
            raise ValueError("the foreign core's files hold no Verilog or SystemVerilog file (.v, .sv) to compile")

    @property
    def compiled_files(self) -> list[Path]:
        """The files Verilator compiles (not the headers), in the order given."""
        return [p for p in self.files if p.suffix in SOURCE_SUFFIXES]

    @property
    def sources(self) -> list[Path]:
        """The files whose contents key the build cache: every file of the core and this module (how it is
        built)."""
        return [*self.files, Path(__file__).resolve()]

    def backend_options(self) -> dict[str, Any]:
        """Keyword arguments for :class:`vta.tsim.backend.TSimBackend` (and :func:`vta.backend.get_backend`)."""
        return {"generator": self, "sources": self.sources}

    def check(self, cfg: VTAConfig) -> tuple[Port, ...]:
        """Lint the files and check the top module's ports for ``cfg``; returns the ports, or raises
        :class:`~vta.tsim.ports.CoreInterfaceError` naming every problem."""
        return check_core(cfg, self.compiled_files, self.top, include_dirs=self._include_folders())

    def _include_folders(self) -> list[Path]:
        folders = [*self.include_dirs, *(p.parent for p in self.files)]
        return list(dict.fromkeys(Path(f).resolve() for f in folders))

    def __call__(self, cfg: VTAConfig, out_dir: Path) -> Path:
        """Check the core for ``cfg``, copy its files into ``out_dir`` and return a ``.f`` list of the copies (what
        :func:`vta.tsim.build.build` compiles)."""
        self.check(cfg)
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        copies = []
        for path in self.files:
            shutil.copyfile(path, out_dir / path.name)
            copies.append(out_dir / path.name)
        listing = out_dir / "core.f"
        lines = [f"+incdir+{out_dir.resolve()}", *(str(p.resolve()) for p in copies if p.suffix in SOURCE_SUFFIXES)]
        atomic_write_text(listing, "\n".join(lines) + "\n")
        return listing

    def __str__(self) -> str:
        return f"{self.top} ({', '.join(p.name for p in self.compiled_files)})"

    def __repr__(self) -> str:
        return f"ForeignCore({[str(p) for p in self.compiled_files]}, top={self.top!r})"
