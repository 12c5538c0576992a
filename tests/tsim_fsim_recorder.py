"""A pytest plugin that records every program the functional simulator runs to completion.

Used by tests/test_tsim_agreement.py to replay the functional simulator's own test programs on the RTL: run
``pytest -p tsim_fsim_recorder tests/test_fsim*.py`` with ``VTA_TSIM_RECORD_DIR`` set, and every program that
``vta.fsim.run`` finishes without error is saved there as ``NNNN.npz`` (``Program.save``).
"""
from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import pytest

_counter = itertools.count()


@pytest.fixture(autouse=True)
def _record_fsim_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    folder = os.environ.get("VTA_TSIM_RECORD_DIR")
    if not folder:
        return
    from vta import fsim
    original = fsim.run

    def recording_run(program: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(program, *args, **kwargs)
        program.save(Path(folder) / f"{next(_counter):05d}.npz")
        return result

    monkeypatch.setattr(fsim, "run", recording_run)
