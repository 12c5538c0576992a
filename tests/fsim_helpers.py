"""Programs and configs shared by the functional simulator's test files (tests/test_fsim*.py)."""
from __future__ import annotations

import numpy as np
from conftest import SMALL_CFG
from helpers import raw_program_after_data

from vta.config import MEM_INP, MEM_OUT, MEM_WGT, VTAConfig
from vta.isa import Uop
from vta.program import Program, ProgramBuilder


def sync_store(bld: ProgramBuilder, **store: int) -> None:
    """A compute->store token, then a STORE with ``store`` (the keyword arguments of ``ProgramBuilder.store``)."""
    bld.dep_push("compute", "store")
    bld.dep_pop("compute", "store")
    bld.store(**store)


def finish_with_store(bld: ProgramBuilder, cfg: VTAConfig, n: int = 16) -> Program:
    """Store out entries [0, n) to a new allocation ``"res"`` (n out elements), then finish the program."""
    res = bld.alloc("res", (n, cfg.batch, cfg.block_out), np.int8)
    sync_store(bld, sram_base=0, dram_base=bld.elem_addr(res, MEM_OUT), x_size=n)
    return bld.finish()


def gemm_after_late_load(cfg: VTAConfig, with_token: bool) -> Program:
    """GEMM (index 2) emitted before the LOAD of its input (index 3); only a token makes it wait for the data."""
    bld = ProgramBuilder(cfg)
    inp = bld.alloc("inp", np.ones((1, cfg.batch, cfg.block_in), np.int8))
    wgt = bld.alloc("wgt", np.ones((1, cfg.block_out, cfg.block_in), np.int8))
    bld.load_uops(bld.uop_kernel("k", [Uop(0, 0, 0)]))
    bld.load(MEM_WGT, sram_base=0, dram_base=bld.elem_addr(wgt, MEM_WGT))
    if with_token:
        bld.dep_pop("load", "compute")
    bld.gemm(uop_bgn=0, uop_end=1)
    bld.load(MEM_INP, sram_base=0, dram_base=bld.elem_addr(inp, MEM_INP))
    bld.dep_push("load", "compute")
    if not with_token:
        bld.dep_pop("load", "compute")
    return finish_with_store(bld, cfg, n=1)


raw_program = raw_program_after_data
"""The name tests/test_fsim.py still imports (that file is being edited by someone else); new code uses
:func:`helpers.raw_program_after_data`, which says where the stream goes."""


# ---- configs for random programs -------------------------------------------------------------------------------------
CONFIGS = [SMALL_CFG, VTAConfig(log_block=3, log_uop_buff_size=8, log_inp_buff_size=8, log_wgt_buff_size=11,
                                log_acc_buff_size=10, token_queue_depth=2),
           VTAConfig(log_batch=2, log_block=2, log_uop_buff_size=6, log_inp_buff_size=7, log_wgt_buff_size=8,
                     log_acc_buff_size=8, cmd_queue_depth=3),
           VTAConfig(log_batch=1, log_block=3, log_uop_buff_size=6, log_inp_buff_size=6, log_wgt_buff_size=7,
                     log_acc_buff_size=7, cmd_queue_depth=2, token_queue_depth=2, bus_bytes=32)]  # 2-entry buffers
