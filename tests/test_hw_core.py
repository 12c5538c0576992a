"""Whole-core co-simulation: programs run on the generated RTL (cocotb + Verilator) must leave DRAM exactly as the
functional simulator does, with counters equal to its statistics, under random memory-port backpressure."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "hw"))

import cases  # noqa: E402
import cocotb_build  # noqa: E402
import numpy as np  # noqa: E402
from memport import PortTiming  # noqa: E402

from vta.config import VTAConfig  # noqa: E402
from vta.gemm import gemm_program  # noqa: E402
from vta.hw.verilog import verilog_text  # noqa: E402
from vta.testing import alu_program, random_program  # noqa: E402

CONFIGS = {
    "default": VTAConfig(),
    "batch2": VTAConfig(log_batch=1),
    # 256-bit instructions and 64-bit micro-ops (the indices of VTA's default buffer sizes at BLOCK 8 need them)
    "block8_bus16": VTAConfig(log_block=3, bus_bytes=16),
    # non-default buffer sizes, elements of 32..4096 bytes on a 32-byte bus
    "block32_bus32": VTAConfig(log_block=5, bus_bytes=32, log_inp_buff_size=13, log_wgt_buff_size=17,
                               log_acc_buff_size=14, dram_latency=8),
}


def run_core(cfg, key, programs, tmp_path):
    """Build the core for ``cfg`` (cached) and run ``programs`` [(name, program, timing)] in one simulation."""
    text = verilog_text(cfg)
    bdir = cocotb_build.build_dir("core", key, text)
    verilog = cocotb_build.write_if_changed(bdir / "rtl" / "vta_core.v", text)
    runner = cocotb_build.build([verilog], "vta_core", bdir)
    return run_cases(runner, "vta_core", bdir, programs, tmp_path)


def run_cases(runner, top, bdir, programs, tmp_path):
    """Run ``programs`` [(name, program, timing)] in one simulation of the built core ``top`` under the whole-core
    testbench (tests/hw/tb_core.py), which checks each against fsim; returns the measured counters by case."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, (name, program, timing) in enumerate(programs):
        path = tmp_path / f"{k}_{name}.npz"
        cases.write_case(path, program, timing=timing, seed=k)
        paths.append(str(path))
    (tmp_path / "cases.json").write_text(json.dumps(paths))
    results = tmp_path / "results.json"
    cocotb_build.run(runner, "tb_core", top, bdir,
                     {"VTA_TB_CASES": tmp_path / "cases.json", "VTA_TB_RESULTS": results})
    return json.loads(results.read_text())


def directed_programs(cfg):
    """The directed cases [(name, program, timing)] every core runs: a GEMM, the feature program and the ALU
    exerciser, the last two under stressed memory-port timing."""
    gemm, _ = gemm_program(cfg, 2 * cfg.batch, 2 * cfg.block_in, 2 * cfg.block_out, seed=1)
    alu, _ = alu_program(cfg, seed=2)
    return [("gemm", gemm, PortTiming()), ("features", cases.feature_program(cfg, seed=3), PortTiming.stressed()),
            ("alu", alu, PortTiming.stressed())]


@pytest.mark.parametrize("key", list(CONFIGS))
def test_core_matches_fsim(key, tmp_path):
    cfg = CONFIGS[key]
    programs = directed_programs(cfg)
    results = run_core(cfg, key, programs, tmp_path)
    assert len(results) == len(programs)


# Random programs may read buffer entries they never loaded (fsim's start from zeros), so each runs first in a fresh
# simulation: SRAM contents survive between the cases of one simulation.
@pytest.mark.parametrize("key", list(CONFIGS))
def test_random_program_matches_fsim(key, tmp_path):
    cfg = CONFIGS[key]
    program = random_program(cfg, np.random.default_rng(100), n_ops=24)
    run_core(cfg, key, [("random", program, PortTiming.stressed())], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("key", list(CONFIGS))
@pytest.mark.parametrize("seed", range(8))
def test_many_random_programs_match_fsim(key, seed, tmp_path):
    cfg = CONFIGS[key]
    program = random_program(cfg, np.random.default_rng(1000 + seed), n_ops=48)
    timing = PortTiming.stressed() if seed % 2 else PortTiming()
    run_core(cfg, key, [("random", program, timing)], tmp_path)


# CONCURRENT_ALU and GEMM_OVERWRITE: the compiler's conv and residual-add programs run their ALU passes on the second
# engine while the next tile's constant loads and GEMMs use the other acc bank, and start each tile with an overwriting
# GEMM; under memory backpressure the DRAM and the counters (instructions, micro-ops, bytes) must still be fsim's.
CONCURRENT = VTAConfig(log_block=3, log_uop_buff_size=10, log_inp_buff_size=11, log_wgt_buff_size=13,
                       log_acc_buff_size=12, concurrent_alu=True, gemm_overwrite=True)


def test_concurrent_alu_core_matches_fsim(tmp_path):
    from vta.compiler.lowering.codegen import AddLayer, ConvLayer, build_add_program, build_conv_program
    from vta.compiler.lowering.intrin import intrinsics
    cfg = CONCURRENT
    rng = np.random.default_rng(5)
    intr = intrinsics(cfg)
    o = c = 4 * intr.block_out
    programs = []
    for per_tensor in (True, False):
        mult = np.full(o, 1234) if per_tensor else rng.integers(1, 32767, o)
        shift = np.full(o, 17) if per_tensor else rng.integers(10, 24, o)
        layer = ConvLayer.make((1, c, 9, 9), rng.integers(-128, 128, (o, c, 3, 3)), rng.integers(-5000, 5000, o),
                               mult, shift, 0, 127, pads=(1, 1, 1, 1), intr=intr)
        x = rng.integers(-128, 128, (1, c // intr.block_in, 9, 9, 1, intr.block_in)).astype(np.int8)
        programs.append((f"conv_{per_tensor}", build_conv_program(cfg, layer, x)[0], PortTiming.stressed()))
    a = rng.integers(-128, 128, (1, 2, 9, 9, 1, intr.block_out)).astype(np.int8)
    add = build_add_program(cfg, AddLayer((1, 2 * intr.block_out, 9, 9), 3, 7, 3, 0, 127), a, a[:, ::-1])[0]
    programs.append(("add", add, PortTiming.stressed()))
    gemm, _ = gemm_program(cfg, 2, 2 * cfg.block_in, 2 * cfg.block_out, seed=1)
    programs.append(("gemm", gemm, PortTiming()))
    results = run_core(cfg, "concurrent_alu", programs, tmp_path)
    assert len(results) == len(programs)


def test_random_programs_with_every_knob_match_fsim(tmp_path):
    """Random programs whose ALU instructions overlap what follows (``overlap_alu``) that fsim accepts at a core with
    CONCURRENT_ALU and GEMM_OVERWRITE (most break the bank rule and are rejected: the first two of the seeds that
    pass, each with ALU instructions), each in a fresh simulation under backpressure."""
    from vta import fsim
    from vta.isa import Alu
    cfg = CONCURRENT.replace(fused_requant=True)
    kept = []
    for seed in range(200):
        program = random_program(cfg, np.random.default_rng(2000 + seed), n_ops=24, overlap_alu=True)
        try:
            fsim.run(program)
        except fsim.SimulationError:
            continue
        if any(isinstance(insn, Alu) for insn in program.insns):
            kept.append(program)
        if len(kept) == 2:
            break
    assert len(kept) == 2
    for k, program in enumerate(kept):
        (tmp_path / str(k)).mkdir()
        run_core(cfg, "concurrent_alu_rq", [("random", program, PortTiming.stressed())], tmp_path / str(k))


def test_token_queues_are_the_links_of_vta_isa_token_tables():
    """The core's token queues come from vta.isa's TOKEN_QUEUES, TOKEN_PUSHES and TOKEN_POPS: (submodule name without
    tq_, writer, its push flag, reader, its pop flag), in TOKEN_QUEUES' order."""
    from vta.hw.core import _token_links
    assert _token_links() == [("l2c", "load", "push_next", "compute", "pop_prev"),
                              ("c2l", "compute", "push_prev", "load", "pop_next"),
                              ("c2s", "compute", "push_next", "store", "pop_prev"),
                              ("s2c", "store", "push_prev", "compute", "pop_next")]
