"""The hardware constants the cycle model mirrors (vta.config.MAX_BURST, MAX_OUTSTANDING) are the ones the RTL is
built with: the core's arbiter and every DMA reader of its load engines, and vta/cost.py imports them rather than
keeping its own copies."""
import ast
from pathlib import Path

import pytest

from vta import config
from vta.config import MAX_BURST, MAX_OUTSTANDING, VTAConfig
from vta.hw.core import VTACore

pytestmark = pytest.mark.usefixtures("unbuilt_parts_are_expected")


def _sub(component, name):
    """The submodule ``name`` of ``component``'s elaborated module."""
    return component.elaborate(None).submodules[name]


def _dma_readers(cfg):
    core = VTACore(cfg=cfg)
    for unit in ("load", "compute"):
        engine = _sub(_sub(core, unit), "engine")
        mod = engine.elaborate(None)
        for target in engine.targets:
            yield mod.submodules[f"reader_{config.MEM_NAMES[target]}"]


def test_core_arbiter_tracks_max_outstanding_requests():
    arb = _sub(VTACore(cfg=VTAConfig()), "arbiter")
    assert arb.max_outstanding == MAX_OUTSTANDING == 8
    assert _sub(arb, "tags").depth == MAX_OUTSTANDING


def test_every_dma_reader_of_the_core_bursts_max_burst_beats():
    readers = list(_dma_readers(VTAConfig(bus_bytes=16)))
    assert len(readers) == 5  # load: inp, wgt; compute: uop, acc, acc8
    assert {r.max_burst for r in readers} == {MAX_BURST} == {16}


def test_cost_model_imports_the_constants_from_the_config():
    from vta import cost
    tree = ast.parse(Path(cost.__file__).read_text())
    imported = {alias.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == "vta.config"
                for alias in node.names}
    assigned = {target.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(target, ast.Name)}
    assert {"MAX_BURST", "MAX_OUTSTANDING"} <= imported
    assert not {"MAX_BURST", "MAX_OUTSTANDING"} & assigned
