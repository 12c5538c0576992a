"""Command-line helpers shared by ``vta.cli`` and its plug-in groups (``vta.hw.cli``, ``vta.compiler.cli``,
``vta.tsim.cli``): the error type that becomes an exit code, the one ``--config`` option, the "did you mean"
suggestion of a close name, the one form of the ``wrote PATH (what)`` line of a command that writes a file, and the
checks of options several commands share (``--clock-mhz``, an output file's folder).

It lives on the ground floor so that plug-ins never import ``vta.cli`` (which imports them): no import cycle.
"""
from __future__ import annotations

import argparse
import inspect
import os
from typing import Any

__all__ = ["CliError", "add_config_option", "config_from_args", "command_doc", "wrote", "clock_option",
           "check_output_folder"]


class CliError(Exception):
    """A problem with the command's input; printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """Add the one ``--config FILE`` option every command that takes a config uses."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="accelerator config: VTA's vta_config.json or a TOML file with the same keys "
                             "(default: VTA's defaults, 1x16_i8w8a32_15_15_18_17)")


def config_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~vta.config.VTAConfig` named by ``args.config`` (defaults when not given)."""
    from .config import VTAConfig, load_config
    path = getattr(args, "config", None)
    return load_config(path) if path else VTAConfig()


def wrote(path: str | os.PathLike[str], what: str) -> str:
    """The one line a command prints for a file it wrote: ``wrote PATH (what)``."""
    return f"wrote {os.fspath(path)} ({what})"


def command_doc(handler: Any) -> str:
    """The first paragraph of ``handler``'s docstring on one line: a subcommand's ``--help`` description, written
    once where the command is implemented."""
    return " ".join((inspect.getdoc(handler) or "").split("\n\n")[0].split())



def clock_option(args: argparse.Namespace) -> float | None:
    """The ``--clock-mhz`` of ``args`` (None when not given or not an option of the command), checked: a clock the
    config accepts (``CLOCK_MHZ``, 1 to 10000 MHz), else a :class:`CliError` (nan and inf are outside too)."""
    from .config import CLOCK_MHZ_RANGE
    mhz = getattr(args, "clock_mhz", None)
    if mhz is None:
        return None
    lo, hi = CLOCK_MHZ_RANGE
    if not lo <= mhz <= hi:
        raise CliError(f"--clock-mhz {mhz:g}: the clock must be between {lo:g} and {hi:g} MHz")
    return float(mhz)


def check_output_folder(option: str, path: str | os.PathLike[str], suffix: str = "") -> None:
    """Before any work: ``path`` (given to ``option``) is not a folder, and its folder exists and is writable (no
    folder is created); else a :class:`CliError` saying which (``suffix``: the one the file name should end with)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliError(f"{option} {path}: that is a folder; give a file name" + (f" ending {suffix}" if suffix else ""))
    if not os.path.isdir(folder):
        raise CliError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"{option} {path}: the folder {folder} is not writable")
