"""Where the lab keeps what it generates: Verilog, Verilator builds, JIT object code, model files, area reports.

One folder, ``$VTA_CACHE_DIR`` (default ``~/.cache/vta-lab``), read when asked (never at import), with one
sub-folder per kind: ``tsim/``, ``cocotb/``, ``area/``, ``jit/``, ``models/``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root(kind: str = "") -> Path:
    """The cache folder ``$VTA_CACHE_DIR`` (default ``~/.cache/vta-lab``), or its sub-folder ``kind``."""
    root = Path(os.environ.get("VTA_CACHE_DIR", "~/.cache/vta-lab")).expanduser()
    return root / kind if kind else root
