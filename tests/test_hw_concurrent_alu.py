"""hw/concurrent_alu.py: the compute module of the concurrent_alu knob is ComputeUnit with the ALU engine attached,
and each class builds only its own value of the knob."""

import pytest

from vta.config import VTAConfig
from vta.hw.compute import ComputeUnit
from vta.hw.concurrent_alu import AluEngine, ConcurrentAluCompute
from vta.hw.core import VTACore

CA = VTAConfig(concurrent_alu=True)


pytestmark = pytest.mark.usefixtures("unbuilt_parts_are_expected")


def test_compute_unit_refuses_a_concurrent_alu_config():
    with pytest.raises(ValueError, match=r"^cfg\.concurrent_alu is True \(config 1x16_i8w8a32_15_15_18_17_ca\): its "
                                         r"compute module is vta\.hw\.concurrent_alu\.ConcurrentAluCompute, not "
                                         r"vta\.hw\.compute\.ComputeUnit$"):
        ComputeUnit(cfg=CA)


def test_concurrent_alu_compute_refuses_vtas_design():
    with pytest.raises(ValueError, match=r"^cfg\.concurrent_alu is False \(config 1x16_i8w8a32_15_15_18_17\): its "
                                         r"compute module is vta\.hw\.compute\.ComputeUnit, not "
                                         r"vta\.hw\.concurrent_alu\.ConcurrentAluCompute$"):
        ConcurrentAluCompute(cfg=VTAConfig())


def test_ports_differ_by_the_engine_only():
    base = set(ComputeUnit(cfg=VTAConfig()).signature.members)
    ca = set(ConcurrentAluCompute(cfg=CA).signature.members)
    assert base - ca == {"acc_rd1"}
    assert ca - base == {"alu_uop_rd", "alu_acc_rd0", "alu_acc_rd1", "alu_acc_wr", "alu_out_wr", "alu_insn_done"}


@pytest.mark.parametrize("cfg, cls", [(VTAConfig(), ComputeUnit), (CA, ConcurrentAluCompute)])
def test_core_builds_the_compute_module_of_its_config(cfg, cls):
    assert type(VTACore(cfg=cfg).elaborate(None).submodules["compute"]) is cls


def test_the_alu_engine_is_a_submodule():
    assert type(ConcurrentAluCompute(cfg=CA).elaborate(None).submodules["alu_engine"]) is AluEngine
