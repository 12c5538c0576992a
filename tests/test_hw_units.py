"""cocotb testbenches of the load and store modules (tests/hw/tb_units.py) against a reference model of LOAD/STORE,
with elements smaller than, equal to and larger than a bus beat."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "hw"))

import cocotb_build  # noqa: E402

from vta.config import VTAConfig  # noqa: E402
from vta.hw.load import LoadUnit  # noqa: E402
from vta.hw.store import StoreUnit  # noqa: E402

# (log_batch, log_block, bus bytes): inp/out elements 4 < 8 bytes and wgt 16 > 8; inp 16 = 16 and wgt 256 > 16;
# BATCH 2: inp/out 16 < 32 and wgt 64 > 32.
PARAMS = [(0, 2, 8), (0, 4, 16), (1, 3, 32)]


def _cfg(log_batch, log_block, bus):
    return VTAConfig(log_batch=log_batch, log_block=log_block, bus_bytes=bus, log_inp_buff_size=12,
                     log_wgt_buff_size=14, log_acc_buff_size=13, log_uop_buff_size=10)


def _env(cfg):
    return {"TB_CONFIG": json.dumps(cfg.to_dict())}


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: "b{}_blk{}_bus{}".format(*p))
def test_load_unit(params):
    cfg = _cfg(*params)
    runner, bdir = cocotb_build.build_component("load", cfg.name, lambda: LoadUnit(cfg=cfg))
    cocotb_build.run(runner, "tb_units", "dut", bdir, _env(cfg), testcase="load_unit")


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: "b{}_blk{}_bus{}".format(*p))
def test_store_unit(params):
    cfg = _cfg(*params)
    runner, bdir = cocotb_build.build_component("store", cfg.name, lambda: StoreUnit(cfg=cfg))
    cocotb_build.run(runner, "tb_units", "dut", bdir, _env(cfg), testcase="store_unit")


def test_units_check_their_config():
    with pytest.raises(TypeError, match="^cfg must be a VTAConfig, not dict$"):
        LoadUnit(cfg={})
    with pytest.raises(TypeError, match="^cfg must be a VTAConfig, not NoneType$"):
        StoreUnit(cfg=None)
