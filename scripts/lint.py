"""Fast static checks run by ``.ci/run`` before the tests: ruff (lint + import order) and mypy (types).

Usage: ``python3 scripts/lint.py`` (exit 0 when both are clean). Both are configured in ``pyproject.toml``.

mypy needs the installed package layout (``hw/``, ``compiler/`` and ``tsim/`` are installed as ``vta.hw``,
``vta.compiler`` and ``vta.tsim``; the editable install maps them with an import hook that mypy cannot follow), so
this script checks a view of that layout built from symbolic links under ``build/typecheck/`` (ignored by git).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = {"hw": "hw", "compiler": "compiler", "tsim": "tsim", "sweep": "sweep"}
"""Installed name under ``vta`` -> source folder (as ``[tool.setuptools] package-dir`` in pyproject.toml)."""


def package_view(where: Path) -> Path:
    """A folder holding ``vta/`` laid out as installed: links to ``vta/*.py`` and to each subpackage's folder."""
    view = where / "vta"
    if where.exists():
        shutil.rmtree(where)
    view.mkdir(parents=True)
    for path in sorted((ROOT / "vta").glob("*.py")):
        (view / path.name).symlink_to(path)
    for name, folder in SUBPACKAGES.items():
        (view / name).symlink_to(ROOT / folder, target_is_directory=True)
    return where


def main() -> int:
    """Run ruff over the repository and mypy over the package view; return the worse exit code."""
    ruff = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], cwd=ROOT)
    view = package_view(ROOT / "build" / "typecheck")
    mypy = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "vta"],
                          cwd=view)
    for name, result in (("ruff", ruff), ("mypy", mypy)):
        print(f"{name}: {'clean' if result.returncode == 0 else 'FAILED'}")
    return max(ruff.returncode, mypy.returncode)


if __name__ == "__main__":
    sys.exit(main())
