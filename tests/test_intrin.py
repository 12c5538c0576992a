"""Tests for vta.compiler.lowering.intrin: the tensor intrinsics derived from the config."""
import pytest

from vta.compiler.lowering.intrin import MAX_LOAD_PAD, intrinsics
from vta.config import MEM_ACC_8BIT, MEM_INP, VTAConfig
from vta.isa import ALU_MUL, ALU_SHR


def test_default_config_intrinsics():
    intr = intrinsics(VTAConfig())
    assert intr.gemm.inp_shape == (1, 16)
    assert intr.gemm.wgt_shape == (16, 16)
    assert intr.gemm.acc_shape == (1, 16)
    assert intr.gemm.macs == 256
    assert intr.dma["inp"].depth == 2048 and intr.dma["inp"].elem_bytes == 16 and intr.dma["inp"].mem == MEM_INP
    assert intr.dma["wgt"].depth == 1024 and intr.dma["wgt"].elem_bytes == 256
    assert intr.dma["acc"].depth == 2048 and intr.dma["acc"].elem_bytes == 64
    assert intr.dma["acc8"].elem_bytes == 16 and intr.dma["acc8"].mem == MEM_ACC_8BIT
    assert intr.dma["out"].max_pad == 0 and intr.dma["inp"].max_pad == MAX_LOAD_PAD == 15
    assert intr.uop_depth == 8192 and intr.dma["uop"].elem_bytes == 4
    assert intr.loop_max == 16383 and intr.insn_bytes == 16
    assert intr.factor_max("acc") == 2047


def test_alu_intrinsics():
    intr = intrinsics(VTAConfig(log_batch=1, log_block=3))
    assert set(intr.alu) == {"MIN", "MAX", "ADD", "SHR", "MUL"}
    assert intr.alu["MUL"].opcode == ALU_MUL and intr.alu["SHR"].opcode == ALU_SHR
    assert intr.alu["MUL"].shape == (2, 8)
    assert intr.alu["MUL"].wraps and not intr.alu["MIN"].wraps
    assert intr.alu["MUL"].imm_fits(32767) and not intr.alu["MUL"].imm_fits(32768)
    assert intr.alu["SHR"].imm_fits(-32768) and not intr.alu["SHR"].imm_fits(-32769)


@pytest.mark.parametrize("log_batch,log_block", [(0, 3), (0, 4), (0, 5), (1, 4), (2, 2)])
def test_shapes_follow_config(log_batch, log_block):
    cfg = VTAConfig(log_batch=log_batch, log_block=log_block)
    intr = intrinsics(cfg)
    b, blk = 1 << log_batch, 1 << log_block
    assert intr.gemm.macs == b * blk * blk
    assert intr.dma["inp"].elem_shape == (b, blk) and intr.dma["wgt"].elem_shape == (blk, blk)
    assert intr.capacity("wgt") == cfg.wgt_depth and intr.capacity("acc") == cfg.acc_depth
    assert intrinsics(cfg) is intr


def test_errors():
    with pytest.raises(TypeError, match="intrinsics\\(\\) needs a VTAConfig, not dict"):
        intrinsics({})
    with pytest.raises(ValueError, match="memory type must be one of uop, wgt, inp, acc, acc8, out, not 'foo'"):
        intrinsics(VTAConfig()).capacity("foo")
