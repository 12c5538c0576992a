"""Command-line helpers shared by ``vta.cli`` and its plug-in groups (``vta.hw.cli``, ``vta.compiler.cli``,
``vta.tsim.cli``): the error type that becomes an exit code, the one ``--config`` option, the "did you mean"
suggestion of a close name and the one form of the ``wrote PATH (what)`` line of a command that writes a file.

It lives on the ground floor so that plug-ins never import ``vta.cli`` (which imports them): no import cycle.
"""
from __future__ import annotations

import argparse
import inspect
import os
from typing import Any

__all__ = ["CliError", "add_config_option", "config_from_args", "command_doc", "wrote"]


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

