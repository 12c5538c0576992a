"""Codesign knobs (config fields beyond VTA's design, off by default): the fused requantize ALU operation (REQ,
``fused_requant``) in the ISA, fsim, the RTL, the compiler and the cycle model; the RTL tests run under ``slow``."""
from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import assert_tsim_matches_fsim, assert_tsim_matches_reference_and_model

from vta import fsim
from vta.compiler import qops
from vta.compiler.lowering.codegen import OUTPUT, ConvLayer, alu_passes, build_conv_program, fused_requant
from vta.compiler.lowering.intrin import intrinsics
from vta.config import MEM_ACC, MEM_INP, MEM_OUT, MEM_WGT, VTAConfig
from vta.cost import estimate
from vta.fsim import InvalidInstructionError, alu_op
from vta.hw.verilog import verilog_text
from vta.isa import ALU_MAX, ALU_MIN, ALU_MUL, ALU_REQ, ALU_SHR, Uop, alu_opcodes, requant_imm, requant_word
from vta.program import Program, ProgramBuilder

KNOB = VTAConfig(fused_requant=True)
# a small core with the knob: BATCH 2 x BLOCK 4, small buffers (quick to build and simulate)
SMALL_KNOB = VTAConfig(log_batch=1, log_block=2, log_uop_buff_size=9, log_inp_buff_size=9, log_wgt_buff_size=10,
                       log_acc_buff_size=12, fused_requant=True)


def _reference(a: np.ndarray, mult: np.ndarray, shift: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """MUL M, SHR S, MAX lo, MIN hi on Python ints, each step wrapping to 32 bits (written apart from vta.fsim)."""
    def wrap(v: int) -> int:
        v &= 0xFFFFFFFF
        return v - (1 << 32) if v >> 31 else v
    out = []
    for x, m, s in zip(a.reshape(-1).tolist(), np.broadcast_to(mult, a.shape).reshape(-1).tolist(),
                       np.broadcast_to(shift, a.shape).reshape(-1).tolist()):
        p = wrap(x * m)
        p = wrap(p >> s) if s >= 0 else wrap(p << -s)
        out.append(min(max(p, lo), hi))
    return np.array(out, np.int64).reshape(a.shape)


# ---- the operation --------------------------------------------------------------------------------------------------
def test_req_is_mul_shr_max_min_in_one_step() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(-2**31, 2**31, 4000)
    a[:6] = [-2**31, 2**31 - 1, -1, 0, 1, 12345]
    mult = rng.integers(-2**15, 2**15, 4000)
    shift = rng.integers(-32, 32, 4000)
    words = np.array([requant_word(int(m), int(s)) for m, s in zip(mult, shift)])
    for lo, hi in ((-128, 127), (0, 127), (-7, 3)):
        got = alu_op(ALU_REQ, a, words, requant_imm(lo, hi))
        np.testing.assert_array_equal(got, _reference(a, mult, shift, lo, hi))
        steps = alu_op(ALU_MIN, alu_op(ALU_MAX, alu_op(ALU_SHR, alu_op(ALU_MUL, a, mult), shift), lo), hi)
        np.testing.assert_array_equal(got, steps)


def test_req_ignores_the_operand_bits_above_the_shift() -> None:
    a = np.array([1000, -1000, 77])
    word = requant_word(3, 2)
    noisy = word | (0x3FF << 22) - (1 << 32)   # bits 22..31 set: not part of REQ's fields
    imm = requant_imm(-100, 100)
    np.testing.assert_array_equal(alu_op(ALU_REQ, a, word, imm), alu_op(ALU_REQ, a, noisy, imm))
    np.testing.assert_array_equal(alu_op(ALU_REQ, a, word, imm), [100, -100, 57])


def test_requant_fields_are_checked() -> None:
    assert requant_word(-1, 0) == 0xFFFF and requant_word(1, -1) == (63 << 16) | 1
    assert requant_imm(-128, 127) == 0x7F80 and requant_imm(0, -1) == -256
    with pytest.raises(ValueError, match="^REQ multiplier 32768 does not fit 16 signed bits$"):
        requant_word(32768, 0)
    with pytest.raises(ValueError, match=r"^REQ shift 32 is outside \[-32, 31\]$"):
        requant_word(1, 32)
    with pytest.raises(ValueError, match="^REQ clip bound hi = 128 does not fit a signed byte$"):
        requant_imm(0, 128)


def test_req_is_an_opcode_only_with_the_knob() -> None:
    assert ALU_REQ not in alu_opcodes(VTAConfig()) and alu_opcodes(KNOB)[ALU_REQ] == "REQ"
    assert "REQ" not in intrinsics(VTAConfig()).alu and intrinsics(KNOB).alu["REQ"].opcode == ALU_REQ


# ---- fsim -----------------------------------------------------------------------------------------------------------
def requant_program(cfg: VTAConfig, *, seed: int = 0, entries: int = 6, use_imm: bool = False,
                    opcode: int = ALU_REQ) -> tuple[Program, np.ndarray]:
    """LOAD ACC of random accumulators and of per-lane (M, S) words, one ALU REQ over them, STORE. Returns the
    program and the expected ``out`` allocation (int8, ``(entries, BATCH, BLOCK_OUT)``)."""
    rng = np.random.default_rng(seed)
    shape = (entries, cfg.batch, cfg.block_out)
    a = rng.integers(-2**31, 2**31, shape)
    mult = rng.integers(1, 2**15, shape)
    shift = rng.integers(0, 32, shape)
    words = np.vectorize(lambda m, s: requant_word(int(m), int(s)))(mult, shift)
    lo, hi = -20, 90
    b = ProgramBuilder(cfg)
    a_al, w_al = b.alloc("a", a.astype(np.int32)), b.alloc("w", words.astype(np.int32))
    out = b.alloc("out", shape, np.int8)
    b.load_uops(b.uop_kernel("uops", [Uop(0, entries, 0)]))
    b.load(MEM_ACC, sram_base=0, dram_base=b.elem_addr(a_al, MEM_ACC), x_size=entries)
    b.load(MEM_ACC, sram_base=entries, dram_base=b.elem_addr(w_al, MEM_ACC), x_size=entries)
    b.alu(opcode, uop_bgn=0, uop_end=1, iter_out=entries, dst_factor_out=1, src_factor_out=1, use_imm=use_imm,
          imm=requant_imm(lo, hi))
    b.dep_push("compute", "store")
    b.dep_pop("compute", "store")
    b.store(sram_base=0, dram_base=b.elem_addr(out, MEM_OUT), x_size=entries)
    return b.finish(), _reference(a, mult, shift, lo, hi).astype(np.int8)


@pytest.mark.parametrize("cfg", [KNOB, SMALL_KNOB], ids=lambda c: c.name)
def test_fsim_runs_req(cfg: VTAConfig) -> None:
    program, expected = requant_program(cfg, seed=cfg.block_out)
    result = fsim.run(program)
    np.testing.assert_array_equal(program.read("out", result.dram), expected)
    assert result.stats.alu_uops == 6


def test_fsim_rejects_req_without_the_knob_or_with_use_imm() -> None:
    bare, _ = requant_program(VTAConfig(), opcode=ALU_REQ)
    with pytest.raises(InvalidInstructionError, match=r"^instruction 3 has ALU opcode 5 \(REQ needs the "
                       r"fused_requant knob, off in 1x16_i8w8a32_15_15_18_17\); known opcodes are MIN=0, MAX=1, "
                       r"ADD=2, SHR=3, MUL=4$"):
        fsim.run(bare)
    with_imm, _ = requant_program(KNOB, use_imm=True)
    with pytest.raises(InvalidInstructionError, match=r"^instruction 3 \(ALU REQ\) sets use_imm; REQ reads"):
        fsim.run(with_imm)


# ---- compiler and cycle model ---------------------------------------------------------------------------------------
def _conv(cfg: VTAConfig, per_tensor: bool, seed: int = 1) -> tuple[ConvLayer, np.ndarray]:
    rng = np.random.default_rng(seed)
    intr = intrinsics(cfg)
    o = c = 4 * intr.block_out
    mult = np.full(o, 1234) if per_tensor else rng.integers(1, 32767, o)
    shift = np.full(o, 17) if per_tensor else rng.integers(10, 24, o)
    layer = ConvLayer.make((cfg.batch, c, 9, 9), rng.integers(-128, 128, (o, c, 3, 3)), rng.integers(-5000, 5000, o),
                           mult, shift, 0, 127, pads=(1, 1, 1, 1), intr=intr)
    x = rng.integers(-128, 128, (1, c // intr.block_in, 9, 9, cfg.batch, intr.block_in)).astype(np.int8)
    return layer, x


@pytest.mark.parametrize("per_tensor", [True, False], ids=["per_tensor", "per_channel"])
def test_conv_with_req_is_bit_exact_and_faster(per_tensor: bool) -> None:
    outs, counts = [], []
    for cfg in (VTAConfig(), KNOB):
        layer, x = _conv(cfg, per_tensor)
        program, code = build_conv_program(cfg, layer, x)
        outs.append(program.read(OUTPUT, fsim.run(program).dram))
        counts.append((code.alu_uops, estimate(program).cycles))
        assert fused_requant(layer, intrinsics(cfg)) == cfg.fused_requant
        assert alu_passes(layer, fused=cfg.fused_requant)[-1] == ("REQ" if cfg.fused_requant else "MIN")
    np.testing.assert_array_equal(outs[0], outs[1])
    (alu_off, cyc_off), (alu_on, cyc_on) = counts
    assert alu_on * 5 == alu_off * 2   # ADD + REQ instead of ADD, MUL, SHR, MAX, MIN
    assert cyc_on < cyc_off


def test_layers_whose_constants_do_not_fit_req_keep_the_alu_sequence() -> None:
    layer, _ = _conv(KNOB, True)
    wide = ConvLayer(layer.geom, layer.weight, layer.bias, layer.multiplier * 0 + 40000, layer.shift, 0, 127)
    assert fused_requant(layer, intrinsics(KNOB)) and not fused_requant(wide, intrinsics(KNOB))
    assert not fused_requant(ConvLayer(layer.geom, layer.weight, layer.bias, layer.multiplier, layer.shift, 0, 255),
                             intrinsics(KNOB))


# ---- RTL ------------------------------------------------------------------------------------------------------------
def test_knob_off_rtl_has_no_req_logic() -> None:
    """Off, the generator builds VTA's ALU unchanged (no REQ multiplexers or clip comparators); on, they appear."""
    tiny = VTAConfig(log_block=2, log_uop_buff_size=6, log_inp_buff_size=6, log_wgt_buff_size=7, log_acc_buff_size=7)
    off, on = verilog_text(tiny), verilog_text(tiny.replace(fused_requant=True))
    names = [re.compile(r"\b" + name + r"\b") for name in ("mul_b", "floor")]  # the REQ lane's operand mux, clip
    assert not any(n.search(off) for n in names)
    assert all(n.search(on) for n in names)


@pytest.mark.slow
def test_tsim_runs_req_programs_bit_exact() -> None:
    """A REQ program, a requantized convolution and a residual add on the Verilator model of a small core with the
    knob: the same DRAM and micro-op counts as fsim, and the cycle model's prediction within 5 %."""
    from vta.tsim.backend import TSimBackend
    tsim = TSimBackend(check="none", progress=False)
    from vta.compiler.lowering.codegen import AddLayer, build_add_program
    layer, x = _conv(SMALL_KNOB, False)
    add = build_add_program(SMALL_KNOB, AddLayer((2, 8, 9, 9), 3, 7, 3, 0, 127), x[:, :2])[0]
    for program in (requant_program(SMALL_KNOB)[0], build_conv_program(SMALL_KNOB, layer, x)[0], add):
        assert_tsim_matches_fsim(tsim, program, tolerance=0.05)


@pytest.mark.slow
def test_tiny_model_on_tsim_with_the_knob_is_bit_exact() -> None:
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.executor import run
    compiled = compile_model("tiny_cnn", SMALL_KNOB, policy="accel", calib=2)
    rng = np.random.default_rng(7)
    inputs = {name: rng.standard_normal(compiled.graph.shape(name)).astype(np.float32)
              for name in compiled.graph.inputs}
    ref = qops.run_reference(compiled.graph, inputs)
    tsim, fs = run(compiled, inputs, target="tsim"), run(compiled, inputs, target="fsim")
    for name in ref:
        np.testing.assert_array_equal(tsim.outputs[name], ref[name])
        np.testing.assert_array_equal(fs.outputs[name], ref[name])
    assert sum(layer.alu_uops for layer in tsim.layers) == sum(layer.alu_uops for layer in fs.layers) > 0


# ---- sweep ----------------------------------------------------------------------------------------------------------
def test_a_sweep_varies_the_knob_and_its_area_model_counts_it() -> None:
    from vta.area import REQ_LANE_LUTS, config_from_name, estimate_area
    from vta.sweep.spec import parse_spec
    spec = parse_spec({"sweep": {"models": ["tiny_cnn"]}, "vary": {"FUSED_REQUANT": [False, True]}})
    cfgs = [d.cfg for d in spec.designs()]
    assert [c.fused_requant for c in cfgs if c is not None] == [False, True]
    assert [d.key for d in spec.designs()] == ["1x16_i8w8a32_15_15_18_17", "1x16_i8w8a32_15_15_18_17_rq"]
    off, on = estimate_area(VTAConfig()), estimate_area(KNOB)
    assert (on.lut - off.lut, on.ff - off.ff, on.dsp - off.dsp, on.bram - off.bram) == (16 * REQ_LANE_LUTS, 0, 0, 0)
    assert config_from_name(KNOB.name) == KNOB


@pytest.mark.parametrize("ma, mb, shift", [(3, 5, 4), (1, 1, 0), (700, 21000, 14)])
def test_residual_add_with_req_is_bit_exact(ma: int, mb: int, shift: int) -> None:
    from vta.compiler.lowering.codegen import AddLayer, build_add_program
    rng = np.random.default_rng(ma)
    layer = AddLayer((1, 64, 30, 30), ma, mb, shift, -128, 127)
    outs, alu = [], []
    shape = (1, 4, 30, 30, 1, 16)   # both configs are 1x16
    a, b = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
    for cfg in (VTAConfig(), KNOB):
        program, code = build_add_program(cfg, layer, a, b)
        outs.append(program.read(OUTPUT, fsim.run(program).dram))
        alu.append(code.alu_uops)
    np.testing.assert_array_equal(outs[0], outs[1])
    passes = (ma != 1) + (mb != 1) + 1
    assert (alu[0], alu[1]) == (900 * 4 * (passes + 2 + (shift != 0)), 900 * 4 * (passes + 1))


# ---- GEMM_OVERWRITE ------------------------------------------------------------------------------------------------
OVERWRITE = VTAConfig(gemm_overwrite=True)


def overwrite_program(cfg: VTAConfig, seed: int = 0) -> tuple[Program, dict[str, np.ndarray]]:
    """LOAD INP, WGT and ACC (random), a reset GEMM of three micro-ops (two write acc entry 0, one entry 1), an ALU
    reset of entry 2, STORE of out entries 0..3 (entry 3 is never computed). Returns the program and its operands."""
    rng = np.random.default_rng(seed)
    bt, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
    data = {"inp": rng.integers(-128, 128, (3, bt, bi)), "wgt": rng.integers(-128, 128, (3, bo, bi)),
            "acc": rng.integers(-1000, 1000, (4, bt, bo))}
    b = ProgramBuilder(cfg)
    inp, wgt = b.alloc("inp", data["inp"].astype(np.int8)), b.alloc("wgt", data["wgt"].astype(np.int8))
    acc, out = b.alloc("acc", data["acc"].astype(np.int32)), b.alloc("out", (4, bt, bo), np.int8)
    b.load(MEM_INP, sram_base=0, dram_base=b.elem_addr(inp, MEM_INP), x_size=3)
    b.load(MEM_WGT, sram_base=0, dram_base=b.elem_addr(wgt, MEM_WGT), x_size=3)
    b.dep_push("load", "compute")
    b.load_uops(b.uop_kernel("uops", [Uop(0, 0, 0), Uop(1, 1, 2), Uop(0, 2, 1), Uop(2, 0, 0)]))
    b.load(MEM_ACC, sram_base=0, dram_base=b.elem_addr(acc, MEM_ACC), x_size=4)
    b.dep_pop("load", "compute")
    b.gemm(uop_bgn=0, uop_end=3, reset=True)
    b.alu(ALU_MAX, uop_bgn=3, uop_end=4, reset=True, use_imm=True, imm=0)
    b.dep_push("compute", "store")
    b.dep_pop("compute", "store")
    b.store(sram_base=0, dram_base=b.elem_addr(out, MEM_OUT), x_size=4)
    return b.finish(), data


def test_gemm_overwrite_reset_writes_the_products() -> None:
    """With the knob a reset GEMM's micro-op writes inp[s] @ wgt[w].T (the last one to a destination wins); an ALU
    reset still writes zeros; without the knob both write zeros. Expected values computed here with numpy."""
    for cfg in (VTAConfig(), OVERWRITE):
        program, d = overwrite_program(cfg)
        result = fsim.run(program)
        got = program.read("out", result.dram).astype(np.int64)
        want = np.zeros_like(d["acc"])  # out entries 2 (ALU reset) and 3 (not computed) stay zero
        if cfg.gemm_overwrite:
            want[0] = d["inp"][2] @ d["wgt"][1].T
            want[1] = d["inp"][1] @ d["wgt"][2].T
        np.testing.assert_array_equal(got, ((want + 128) % 256) - 128)
        assert result.stats.macs == (3 * cfg.macs_per_cycle if cfg.gemm_overwrite else 0)


@pytest.mark.parametrize("per_tensor", [True, False], ids=["per_tensor", "per_channel"])
def test_conv_with_gemm_overwrite_is_bit_exact_without_zeroing_gemms(per_tensor: bool) -> None:
    """The compiler starts each tile with the first step's overwriting GEMM instead of a zeroing one: same output,
    same MACs, one GEMM micro-op fewer per output entry (this small layer is load-bound: its cycles barely move)."""
    from vta.compiler.lowering.schedule import plan_conv
    from vta.compiler.lowering.search import plan_program
    results = []
    for cfg in (VTAConfig(), OVERWRITE):
        layer, x = _conv(cfg, per_tensor)
        tiling = plan_conv(layer.geom, intrinsics(cfg), threads=2)  # the same tiling for both
        program, code = build_conv_program(cfg, layer, x, tiling)
        run = fsim.run(program)
        results.append((program.read(OUTPUT, run.dram), run.stats.macs, run.stats.gemm_uops,
                        estimate(program).cycles, plan_program(program).counts["macs"]))
    (out0, macs0, gemm0, cyc0, counted0), (out1, macs1, gemm1, cyc1, counted1) = results
    np.testing.assert_array_equal(out0, out1)
    assert macs0 == macs1 == counted0 == counted1
    entries = layer.geom.ob * layer.geom.oh * layer.geom.ow
    assert gemm0 - gemm1 == entries and abs(cyc1 - cyc0) < 0.01 * cyc0


def test_the_area_model_and_names_cover_every_knob() -> None:
    """Every knob's tag round-trips through vta.area.config_from_name; CONCURRENT_ALU's banks, second uop read port
    and engine cost LUTs, FFs and block RAM in the analytical model (it measured +5,209 LUT, +1,954 FF, +6.5 BRAM with
    native Yosys), no DSP."""
    import itertools

    from vta.area import config_from_name, estimate_area
    from vta.config import KNOBS
    for flags in itertools.product((False, True), repeat=len(KNOBS)):
        knobs = dict(zip(KNOBS, flags))
        if knobs["alu_pipeline"] and knobs["concurrent_alu"]:  # refused (tests/test_alu_pipeline.py)
            continue
        cfg = VTAConfig(**knobs)
        assert config_from_name(cfg.name) == cfg
    off, on = estimate_area(VTAConfig()), estimate_area(VTAConfig(concurrent_alu=True))
    assert on.lut > off.lut and on.ff > off.ff and on.bram > off.bram and on.dsp == off.dsp


@pytest.mark.slow
def test_tsim_runs_every_knob_bit_exact_and_the_model_follows() -> None:
    """tiny_cnn and mini_resnet on a small core with every knob (FUSED_REQUANT, CONCURRENT_ALU, GEMM_OVERWRITE):
    tsim's outputs equal the integer reference and fsim's, and the cycle model is within 5 % on every layer."""
    from vta.compiler.pipeline import compile_model
    cfg = SMALL_KNOB.replace(concurrent_alu=True, gemm_overwrite=True)
    for model in ("tiny_cnn", "mini_resnet"):
        assert_tsim_matches_reference_and_model(compile_model(model, cfg, policy="accel", calib=2), seed=3)
