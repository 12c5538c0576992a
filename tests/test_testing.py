"""The shared program generators: the ALU exerciser and random valid programs."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL_CFG, TINY

from vta import fsim
from vta.config import VTAConfig
from vta.fsim_kernels import alu_hazard
from vta.isa import Alu, Gemm, Load, Store
from vta.testing import ALU_CASES, alu_program, random_program


@pytest.mark.parametrize("config", [VTAConfig(), SMALL_CFG, TINY], ids=lambda c: c.name)
def test_alu_program(config):
    prog, expected = alu_program(config, seed=3)
    assert expected.shape[:2] == (len(ALU_CASES), 4)
    result = fsim.run(prog)
    assert np.array_equal(prog.read("out", result.dram), expected)
    assert {op for _, op, _ in ALU_CASES} == {0, 1, 2, 3, 4}
    assert {imm is None for _, _, imm in ALU_CASES} == {True, False}


@pytest.mark.parametrize("config", [VTAConfig(), SMALL_CFG, TINY], ids=lambda c: c.name)
def test_random_programs_are_valid_and_varied(config):
    seen = set()
    for seed in range(15):
        prog = random_program(config, np.random.default_rng(seed))
        fsim.run(prog)  # no deadlock, nothing out of range
        for insn in prog.insns:
            seen.add(type(insn).__name__)
            if isinstance(insn, Load) and insn.x_size:
                seen.add(f"load{insn.mem}")
                if insn.y_pad_0 and insn.x_pad_1:
                    seen.add("padded")
                if insn.x_stride > insn.x_size:
                    seen.add("strided")
            if isinstance(insn, Alu) and insn.use_imm:
                seen.add("alu_imm")
            if isinstance(insn, Alu) and not insn.use_imm and not insn.reset:
                seen.add("alu_tensor")
            if isinstance(insn, (Alu, Gemm)) and insn.iter_in > 1 and insn.uop_end - insn.uop_bgn > 1:
                seen.add("loops")
            if isinstance(insn, Store) and insn.x_size and insn.x_stride != insn.x_size:
                seen.add("store_strided")
            if insn.pop_prev or insn.pop_next:
                seen.add("tokens")
    assert seen >= {"Load", "Store", "Gemm", "Alu", "Finish", "load0", "load1", "load2", "load3", "load5", "padded",
                    "strided", "alu_imm", "alu_tensor", "loops", "store_strided", "tokens"}


def test_random_program_is_deterministic():
    a = random_program(SMALL_CFG, np.random.default_rng(11))
    b = random_program(SMALL_CFG, np.random.default_rng(11))
    assert a.insns == b.insns and np.array_equal(a.dram, b.dram)
    with pytest.raises(TypeError, match=r"^rng must be a numpy.random.Generator \(np.random.default_rng\(seed\)\), "
                       r"not int$"):
        random_program(SMALL_CFG, 11)


def _alu_hazards(monkeypatch: pytest.MonkeyPatch, alu_hazards: bool) -> list[bool]:
    """Run 20 random programs; for each ALU tensor op fsim plans, whether it reads an entry the same instruction
    writes (``vta.fsim_kernels.alu_hazard``, the test fsim uses to fall back to element order)."""
    seen: list[bool] = []

    def spy(d: np.ndarray, s: np.ndarray, depth: int) -> bool:
        seen.append(alu_hazard(d, s, depth))
        return seen[-1]

    monkeypatch.setattr(fsim, "alu_hazard", spy)
    for seed in range(20):
        fsim.run(random_program(SMALL_CFG, np.random.default_rng(seed), alu_hazards=alu_hazards))
    return seen


def test_random_program_without_alu_hazards(monkeypatch):
    without = _alu_hazards(monkeypatch, alu_hazards=False)
    assert without and not any(without)
    assert any(_alu_hazards(monkeypatch, alu_hazards=True))  # the check sees hazards where they are allowed


@pytest.mark.slow
def test_many_random_programs_are_race_free_and_schedule_independent():
    """The random programs the co-simulation relies on: valid on every config, same result on every schedule."""
    configs = [VTAConfig(), SMALL_CFG, TINY, VTAConfig(log_block=5, log_wgt_buff_size=13, token_queue_depth=2)]
    for config in configs:
        for seed in range(60):
            prog = random_program(config, np.random.default_rng(seed), n_ops=40, alu_hazards=bool(seed % 2))
            reference = fsim.run(prog).dram
            for schedule in range(2):
                assert np.array_equal(fsim.run(prog, schedule_seed=schedule).dram, reference), (config.name, seed)


def test_programs_with_gemm_overwrite_read_only_loaded_operands():
    """With GEMM_OVERWRITE a reset GEMM multiplies its inp and wgt entries: the random programs order those reads
    after the LOADs (fsim's race check passes, on every schedule), and the token stream loads every entry its reset
    GEMMs read before the first, so its result does not depend on the SRAM's contents at start (the conformance kit
    runs it again after a reset, on SRAM the first run left)."""
    from vta.isa import MEM_INP, MEM_WGT
    from vta.testing import token_stream_program
    cfg = SMALL_CFG.replace(gemm_overwrite=True)
    for seed in range(16):
        prog = random_program(cfg, np.random.default_rng(seed), n_ops=40)
        reference = fsim.run(prog).dram
        assert np.array_equal(fsim.run(prog, schedule_seed=1).dram, reference), seed
    stream = token_stream_program(cfg, np.random.default_rng(0), rounds=8)
    first = [i for i in stream.insns if isinstance(i, (Load, Gemm))][:4]
    assert [type(i).__name__ for i in first] == ["Load", "Load", "Load", "Load"]  # uops, then all of inp and wgt
    assert {i.mem for i in first[1:3]} == {MEM_INP, MEM_WGT}
    fsim.run(stream)
    plain = token_stream_program(SMALL_CFG, np.random.default_rng(0), rounds=8)
    assert len(stream.insns) == len(plain.insns) + 2
