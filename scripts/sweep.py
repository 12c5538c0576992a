"""Run a design-space sweep, as `vta sweep FILE` does: print the frontier tables and name every file written.

Usage: python scripts/sweep.py FILE [--db out.sqlite] [--workers N] [--scheduler ADDR] [--plot-dir DIR] [--retry]

Example: python scripts/sweep.py scripts/sweeps/wide.toml --workers 2 (216 designs x 2 models in model mode).
"""
from __future__ import annotations

import argparse
import sys

from vta.cliutil import CliError
from vta.sweep.cli import add_arguments, sweep_command


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        return sweep_command(parser.parse_args())
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code


if __name__ == "__main__":
    sys.exit(main())
