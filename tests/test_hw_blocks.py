"""cocotb testbenches of the hardware blocks (tests/hw/tb_*.py), each run on its own Verilator build per parameter
set, plus the blocks' parameter validation."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "hw"))

import cocotb_build  # noqa: E402

from vta.hw.alu import AluCore  # noqa: E402
from vta.hw.arbiter import MemArbiter  # noqa: E402
from vta.hw.boundary import MemBoundary  # noqa: E402
from vta.hw.gemm import GemmCore, pack_weights, pack_weights_int, wgt_operand_bits  # noqa: E402
from vta.hw.mem import Sram, StagedSram  # noqa: E402
from vta.hw.queues import TokenQueue  # noqa: E402


def run_block(kind, key, factory, module, testcase, env):
    runner, bdir = cocotb_build.build_component(kind, key, factory)
    cocotb_build.run(runner, module, "dut", bdir, env, testcase=testcase)


@pytest.mark.parametrize("form", ["packed", "array"])
@pytest.mark.parametrize("batch,block", [(1, 16), (2, 8), pytest.param(1, 32, marks=pytest.mark.slow)])
def test_gemm_core(batch, block, form):
    run_block("gemm", f"{batch}x{block}-{form}",
              lambda: GemmCore(batch=batch, block_in=block, block_out=block, form=form),
              "tb_blocks", "gemm_core",
              {"TB_BATCH": batch, "TB_BLOCK_IN": block, "TB_BLOCK_OUT": block, "TB_FORM": form})


@pytest.mark.parametrize("inp_bits,wgt_bits,form", [
    (4, 4, "packed"),  # one build in the default suite; the rest (a Verilator build each) are slow-marked
    *[pytest.param(i, w, f, marks=pytest.mark.slow) for i, w, f in
      ((4, 4, "array"), (8, 4, "packed"), (8, 4, "array"), (4, 8, "packed"), (4, 8, "array"))]])
def test_gemm_core_int4(inp_bits, wgt_bits, form):
    """The GEMM core of an int4 design (docs/precision.md): int4 lanes in offset binary, narrower multipliers."""
    run_block("gemm", f"2x8-{form}-i{inp_bits}w{wgt_bits}",
              lambda: GemmCore(batch=2, block_in=8, block_out=8, form=form, inp_bits=inp_bits, wgt_bits=wgt_bits),
              "tb_blocks", "gemm_core",
              {"TB_BATCH": 2, "TB_BLOCK_IN": 8, "TB_BLOCK_OUT": 8, "TB_FORM": form, "TB_INP_BITS": inp_bits,
               "TB_WGT_BITS": wgt_bits})


@pytest.mark.parametrize("block,gran_bytes", [(4, 4), (8, 8)])
def test_staged_sram(block, gran_bytes):
    """The packed form's weight buffer: entries written whole or granule by granule, read back packed."""
    run_block("staged", f"{block}_{gran_bytes}",
              lambda: StagedSram(width=8 * block * block, depth=8, granularity=8 * gran_bytes,
                                 transform=lambda raw: pack_weights(raw, block, block),
                                 stored_width=wgt_operand_bits(block, block, "packed"),
                                 init=pack_weights_int([0x80] * block * block, block, block)),
              "tb_blocks", "staged_sram", {"TB_BLOCK": block, "TB_DEPTH": 8, "TB_GRAN_BYTES": gran_bytes})


@pytest.mark.parametrize("lanes", [16, 4])
def test_tensor_alu(lanes):
    run_block("alu", str(lanes), lambda: AluCore(lanes=lanes), "tb_blocks", "tensor_alu", {"TB_LANES": lanes})


@pytest.mark.parametrize("lanes", [16, 2])
def test_tensor_alu_requant(lanes):
    """The fused_requant knob's ALU (REQ added, the other ops shared with it) against fsim's alu_op."""
    run_block("alu-rq", str(lanes), lambda: AluCore(lanes=lanes, requant=True), "tb_blocks", "tensor_alu_requant",
              {"TB_LANES": lanes})


@pytest.mark.parametrize("lanes,row,requant", [(16, 16, False), (8, 4, True)])
def test_tensor_alu_lane_reduce(lanes, row, requant):
    """The lane_reduce knob's ALU (RSUM and RMAX over rows of ``row`` lanes; with REQ too) against fsim's alu_op."""
    run_block("alu-lr", f"{lanes}_{row}_{int(requant)}", lambda: AluCore(lanes=lanes, requant=requant, reduce=row),
              "tb_blocks", "tensor_alu_reduce", {"TB_LANES": lanes, "TB_ROW": row, "TB_REQUANT": int(requant)})


@pytest.mark.parametrize("depth", [2, 5])
def test_token_queue(depth):
    run_block("tokenq", str(depth), lambda: TokenQueue(depth=depth), "tb_blocks", "token_queue", {"TB_DEPTH": depth})


@pytest.mark.parametrize("readers,bus", [(3, 8), (2, 32)])
def test_arbiter(readers, bus):
    run_block("arbiter", f"{readers}_{bus}", lambda: MemArbiter(n_readers=readers, bus_bytes=bus, max_outstanding=4),
              "tb_arbiter", "arbiter", {"TB_READERS": readers, "TB_BUS": bus})


@pytest.mark.parametrize("bus", [8, 32])
def test_mem_boundary(bus):
    run_block("boundary", str(bus), lambda: MemBoundary(bus_bytes=bus), "tb_boundary", "boundary", {"TB_BUS": bus})


# ---- parameter validation ------------------------------------------------------------------------------------------
def test_block_parameters_are_checked():
    with pytest.raises(ValueError, match="^batch must be a power of two, not 3$"):
        GemmCore(batch=3, block_in=16, block_out=16)
    with pytest.raises(TypeError, match="^block_in must be an integer, not '16'$"):
        GemmCore(batch=1, block_in="16", block_out=16)
    with pytest.raises(ValueError, match="^wgt_bits must be 4 or 8, not 2$"):
        GemmCore(batch=1, block_in=16, block_out=16, wgt_bits=2)
    with pytest.raises(ValueError, match="^lanes must be between 1 and 4096, not 0$"):
        AluCore(lanes=0)
    with pytest.raises(ValueError, match="^reduce must be a power of two, not 3$"):
        AluCore(lanes=12, reduce=3)
    with pytest.raises(ValueError, match="^reduce must be between 0 and 4, not 8$"):
        AluCore(lanes=4, reduce=8)
    with pytest.raises(ValueError, match=r"^reduce must divide lanes \(12\), not 8$"):
        AluCore(lanes=12, reduce=8)
    with pytest.raises(ValueError, match="^depth must be between 1 and 65536, not 0$"):
        TokenQueue(depth=0)
    with pytest.raises(ValueError, match="^bus_bytes must be a power of two, not 12$"):
        MemArbiter(n_readers=2, bus_bytes=12)
    with pytest.raises(ValueError, match="^bus_bytes must be between 1 and 128, not 256$"):
        MemBoundary(bus_bytes=256)
    with pytest.raises(ValueError, match="^granularity must divide the width 64, not 24$"):
        Sram(width=64, depth=16, granularity=24)
    with pytest.raises(TypeError, match="^transparent must be a bool, not 1$"):
        Sram(width=64, depth=16, transparent=1)
