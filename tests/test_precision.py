"""Precision as a design axis: int4 / int8 inputs and weights (vta.packing, the config, fsim, the cycle model,
energy; see docs/precision.md)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vta import fsim
from vta.config import MEM_ACC, MEM_OUT, ConfigError, VTAConfig, load_config
from vta.cost import estimate
from vta.counts import program_counts
from vta.energy import layer_energy, load_tech
from vta.gemm import gemm_program
from vta.isa import ALU_ADD, Uop
from vta.packing import (
    alloc_dtype,
    element_range,
    pack_elements,
    packed_nbytes,
    unpack_elements,
    wrap_elements,
)
from vta.program import ProgramBuilder

ROOT = Path(__file__).resolve().parents[1]
W4A8 = load_config(ROOT / "configs" / "w4a8.toml")
W4A4 = load_config(ROOT / "configs" / "w4a4.toml")


# ---- the config -----------------------------------------------------------------------------------------------------
def test_config_names_and_derived_sizes():
    assert W4A8.name == "1x16_i8w4a32_15_15_17_17"
    assert W4A4.name == "1x16_i4w4a32_15_14_17_17"
    assert (W4A8.wgt_elem_bytes, W4A8.inp_elem_bytes, W4A8.out_elem_bytes) == (128, 16, 16)
    assert (W4A4.wgt_elem_bytes, W4A4.inp_elem_bytes, W4A4.out_elem_bytes) == (128, 8, 8)
    default = VTAConfig()
    # halved buffers hold the default's tiles, so the ISA (index fields, micro-op width) is VTA's
    for cfg in (W4A8, W4A4):
        assert (cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth) == (default.inp_depth, default.wgt_depth,
                                                                 default.acc_depth)
        assert cfg.uop_bits == 32


def test_config_rejects_unsupported_widths_in_one_error():
    with pytest.raises(ConfigError) as err:
        VTAConfig(log_inp_width=1, log_wgt_width=4, log_acc_width=4)
    assert err.value.problems == [
        "LOG_INP_WIDTH must be between 2 and 3 (int4 (2) and int8 (3) inputs are supported), not 1",
        "LOG_WGT_WIDTH must be between 2 and 3 (int4 (2) and int8 (3) weights are supported), not 4",
        "LOG_ACC_WIDTH must be between 5 and 5 (only int32 accumulators (5) are supported), not 4",
    ]


# ---- packing --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [4, 8])
def test_pack_round_trip(bits):
    lo, hi = element_range(bits)
    rng = np.random.default_rng(bits)
    for count in (1, 2, 7, 64):
        values = rng.integers(lo, hi + 1, count).astype(np.int8)
        raw = pack_elements(values, bits)
        assert raw.dtype == np.uint8 and raw.size == packed_nbytes(count, bits)
        assert np.array_equal(unpack_elements(raw, bits, count), values)


def test_int4_nibble_order_and_sign_extension():
    # element 2i in the low nibble of byte i, two's complement
    assert pack_elements(np.array([1, -1, -8, 7], np.int8), 4).tolist() == [0xF1, 0x78]
    assert unpack_elements(np.array([0x8F], np.uint8), 4).tolist() == [-1, -8]
    assert wrap_elements(np.array([7, 8, 15, 16, -9, 0x7FFFFFF9]), 4).tolist() == [7, -8, -1, 0, 7, -7]
    assert wrap_elements(np.array([127, 128, -129]), 8).tolist() == [127, -128, 127]


def test_bad_width_is_a_sentence():
    with pytest.raises(ValueError, match="element width must be one of 4, 8 bits, not 2"):
        pack_elements(np.zeros(2, np.int8), 2)


def test_int4_allocation_round_trip_and_range_error():
    b = ProgramBuilder(W4A4)
    values = np.arange(-8, 8, dtype=np.int8).reshape(2, 8)
    a = b.alloc("x", values, "int4")
    assert (a.nbytes, a.dtype, a.shape) == (8, "int4", (2, 8))
    with pytest.raises(ValueError, match=r"allocation 'y' must be int4 values in \[-8, 7\], but element 1 is 8"):
        b.alloc("y", np.array([0, 8], np.int8), "int4")
    prog = b.finish()
    assert np.array_equal(prog.read("x"), values)
    other = prog.with_data({"x": -values - 1})
    assert np.array_equal(other.read("x"), -values - 1)
    assert alloc_dtype(8) == "int8" and alloc_dtype(4) == "int4"


# ---- fsim: the GEMM at every width pair -----------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [W4A8, W4A4, VTAConfig(log_inp_width=2), VTAConfig(log_block=2, log_wgt_width=2,
                                                                                      log_inp_width=2)],
                         ids=["w4a8", "w4a4", "w8a4", "block4_w4a4"])
@pytest.mark.parametrize("dims", [(16, 64, 32), (5, 37, 19)])
def test_fsim_gemm_bit_exact(cfg, dims):
    """The tiled GEMM program (packed operands in DRAM, int4 sign-extended into the GEMM, the output clipped to the
    output width and packed by STORE) leaves exactly requantize(A @ B) in DRAM."""
    program, expected = gemm_program(cfg, *dims, seed=3)
    result = fsim.run(program)
    assert np.array_equal(program.read("C", result.dram), expected)
    lo, hi = element_range(cfg.out_width)
    assert expected.min() >= lo and expected.max() <= hi


def test_fsim_out_buffer_keeps_low_bits_of_acc():
    """Without a clip, STORE writes the low out-width bits of each accumulator (VTA's out buffer semantics)."""
    cfg = W4A4
    b = ProgramBuilder(cfg)
    acc = np.arange(cfg.block_out, dtype=np.int32).reshape(1, 1, cfg.block_out) * 3 - 20
    src = b.alloc("acc", acc)
    out = b.alloc("out", (1, 1, cfg.block_out), "int4")
    b.load_uops(b.uop_kernel("u", [Uop(0, 0, 0)]))
    b.load(MEM_ACC, sram_base=0, dram_base=b.elem_addr(src, MEM_ACC), x_size=1)
    b.alu(ALU_ADD, uop_bgn=0, uop_end=1, use_imm=True, imm=0)
    b.dep_push("compute", "store")
    b.dep_pop("compute", "store")
    b.store(sram_base=0, dram_base=b.elem_addr(out, MEM_OUT), x_size=1)
    prog = b.finish()
    got = prog.read("out", fsim.run(prog).dram)
    assert np.array_equal(got, wrap_elements(acc, 4))


# ---- bytes moved, cycles and energy shrink ------------------------------------------------------------------------
def test_bytes_cycles_and_energy_shrink_with_width():
    dims = (64, 256, 256)
    rows = {}
    tech = load_tech()
    for name, cfg in (("w8a8", VTAConfig()), ("w4a8", W4A8), ("w4a4", W4A4)):
        program, _ = gemm_program(cfg, *dims)
        counts = program_counts(program)
        stats = fsim.run(program).stats.as_dict()
        for key in ("wgt_bytes_read", "inp_bytes_read", "out_bytes_written", "macs"):
            assert counts[key] == stats[key]
        rows[name] = (counts, estimate(program).cycles, sum(layer_energy(counts, cfg, tech).values()))
    (c8, cyc8, e8), (c48, cyc48, e48), (c44, cyc44, e44) = rows["w8a8"], rows["w4a8"], rows["w4a4"]
    assert c48["wgt_bytes_read"] * 2 == c8["wgt_bytes_read"] and c48["inp_bytes_read"] == c8["inp_bytes_read"]
    assert c44["inp_bytes_read"] * 2 == c8["inp_bytes_read"] and c44["out_bytes_written"] * 2 == c8["out_bytes_written"]
    assert c8["macs"] == c48["macs"] == c44["macs"]
    assert cyc44 <= cyc48 < cyc8  # this GEMM is bound by weight traffic
    assert e44 < e48 < e8
    assert tech.mac_pj_at(8, 8) == tech.mac_pj
    assert tech.mac_pj_at(4, 8) == pytest.approx(tech.mult_8b_pj / 2 + tech.add_32b_pj)


# ---- the compiler: quantization to the design's widths, packing, bit-exact on fsim ------------------------------
def _assert_matches_reference(compiled, target: str, *, seed: int) -> None:
    """``compiled`` run on ``target`` for seeded normal float32 inputs gives the integer reference's (qops) outputs
    bit for bit."""
    from vta.compiler import qops
    from vta.compiler.runtime.executor import run
    graph = compiled.graph
    rng = np.random.default_rng(seed)
    x = {n: rng.standard_normal(graph.shape(n)).astype(np.float32) for n in graph.inputs}
    got = run(compiled, x, target=target).outputs
    ref = qops.run_reference(graph, x)
    for name in graph.outputs:
        assert np.array_equal(np.asarray(got[name]), np.asarray(ref[name]))


@pytest.fixture(scope="module")
def tiny_w4a4():
    from vta.compiler.pipeline import compile_model
    return compile_model("tiny_cnn", W4A4, policy="accel", calib=2)


@pytest.mark.parametrize("cfg", [W4A8, W4A4], ids=["w4a8", "w4a4"])
def test_tiny_cnn_bit_exact_on_fsim(cfg, tiny_w4a4):
    """tiny_cnn quantized for the design's widths runs its convolutions and dense layer on the accelerator (fsim)
    and matches the integer reference (qops) bit for bit."""
    from vta.compiler.pipeline import compile_model
    compiled = tiny_w4a4 if cfg is W4A4 else compile_model("tiny_cnn", cfg, policy="accel", calib=2)
    graph = compiled.graph
    accel = [s.node.op for s in compiled.steps if type(s).__name__ == "AccelStep"]
    assert accel == ["QConv2d", "QConv2d", "QDense"]
    for node in graph.nodes:
        if node.op in ("QConv2d", "QDense"):
            w = graph.constants[node.inputs[1]]
            assert w.min() >= -7 and w.max() <= 7          # int4 weights, symmetric
            rq = node.attrs["requant"]
            assert (rq.lo, rq.hi) in ((0, 7), (-8, 7)) if cfg.inp_width == 4 else (rq.lo, rq.hi) in ((0, 127),
                                                                                                   (-128, 127))
    _assert_matches_reference(compiled, "fsim", seed=5)


def test_int8_budget_keeps_the_layers_that_meet_it_on_the_cpu(capsys):
    """int8_budget (vta run --int8-budget): tiny_cnn at w4a4 loses top-1 agreement on held-out calibration samples;
    a budget of 0 points keeps layers at int8 until none is lost, the kept layers run on the CPU, the whole is
    bit-exact on fsim, and the report says which layers and what they cost. Bad uses are refused, saying why."""
    from vta.cli import main
    from vta.compiler.pipeline import compile_model
    w4a4 = load_config(ROOT / "configs" / "w4a4.toml")
    compiled = compile_model("tiny_cnn", w4a4, calib=8, int8_budget=0.0)
    choice = compiled.meta["int8_budget"]
    steps = [s["top1_agreement_pct"] for s in choice["steps"]]
    assert choice["kept"] and steps[-1] == 100.0 and steps[0] < 100.0 and choice["budget_points"] == 0.0
    assert all(compiled.decisions[n].target == "cpu" for n in choice["kept"])
    assert "4 held-out calibration samples" in choice["measured_on"]
    _assert_matches_reference(compiled, "fsim", seed=5)
    loose = compile_model("tiny_cnn", w4a4, calib=8, int8_budget=100.0)
    assert loose.meta["int8_budget"]["kept"] == [] and len(loose.meta["int8_budget"]["steps"]) == 1
    assert "int8_budget" not in compile_model("tiny_cnn", VTAConfig(), calib=2, int8_budget=0.0).meta  # int8 design
    with pytest.raises(ValueError, match="at least two calibration samples"):
        compile_model("tiny_cnn", w4a4, calib=1, int8_budget=1.0)
    with pytest.raises(ValueError, match=r"must lie in \[0, 100\]"):
        compile_model("tiny_cnn", w4a4, int8_budget=-1.0)
    assert main(["run", "tiny_cnn", "--config", str(ROOT / "configs" / "w4a4.toml"), "--target", "fsim",
                 "--calib", "8", "--int8-budget", "0", "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"int8 budget 0 points of top-1 agreement: kept {', '.join(choice['kept'])} at int8 on the CPU" in out
    assert "on 4 held-out calibration samples" in out and "us on the CPU (partitioner's estimate)" in out


def test_mixed_precision_keeps_named_layers_int8_on_the_cpu():
    """keep_int8: the first conv and the dense layer at int8 weights (int8 input and logits) run on the CPU of the
    w4a4 design, the middle conv on the accelerator at int4; the whole is bit-exact on fsim."""
    from vta.compiler import qops
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import compile_graph, load_graph
    from vta.compiler.runtime.executor import run
    graph = load_graph("tiny_cnn")
    rng = np.random.default_rng(0)
    calib = {n: rng.standard_normal((2,) + graph.shape(n)[1:]).astype(np.float32) for n in graph.inputs}
    qg = quantize(graph, calib, act_bits=4, wgt_bits=4, keep_int8=["conv_3", "gemm_12"])
    assert "QClip" not in [n.op for n in qg.nodes][:2]  # the input, read only by an int8 layer, stays int8
    compiled = compile_graph(qg, W4A4, policy="accel")
    where = {s.node.name: type(s).__name__ for s in compiled.steps if s.node.op in ("QConv2d", "QDense")}
    assert where == {"conv_3": "CpuStep", "conv_7": "AccelStep", "gemm_12": "CpuStep"}
    x = {n: rng.standard_normal(graph.shape(n)).astype(np.float32) for n in graph.inputs}
    got, ref = run(compiled, x, target="fsim").outputs, qops.run_reference(qg, x)
    assert all(np.array_equal(np.asarray(got[k]), np.asarray(ref[k])) for k in graph.outputs)
    with pytest.raises(ValueError, match="keep_int8 names nope, which are not Conv2d/Dense nodes"):
        quantize(graph, calib, act_bits=4, keep_int8=["nope"])


def test_int8_graph_stays_on_the_cpu_of_an_int4_design():
    """A graph quantized for int8 on an int4 design: the partitioner keeps its layers on the CPU and says why."""
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.lowering.partition import partition
    from vta.compiler.pipeline import load_graph
    graph = load_graph("tiny_cnn")
    rng = np.random.default_rng(0)
    qg = quantize(graph, {n: rng.standard_normal((2,) + graph.shape(n)[1:]).astype(np.float32)
                          for n in graph.inputs})
    decisions = partition(qg, W4A8, policy="accel")
    conv = [d for d in decisions.values() if d.op == "QConv2d"]
    assert conv and all(d.target == "cpu" for d in conv)
    assert "wider than the design's int4 weights" in conv[0].reason


def test_int8_clipping_ops_are_clipped_to_int4_activations():
    """A MatMul (whose integer semantics clip to int8) at int4 activations is followed by a QClip to [-8, 7]; the
    widths are checked."""
    from vta.compiler import qops
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.ir import Graph
    g = Graph("mm")
    g.add_tensor("a", (1, 4, 8), "float32")
    g.add_tensor("b", (1, 8, 4), "float32")
    g.add_tensor("y", (1, 4, 4), "float32")
    g.inputs += ["a", "b"]
    g.add_node("MatMul", "mm", ["a", "b"], ["y"])
    g.outputs.append("y")
    rng = np.random.default_rng(0)
    data = {"a": rng.standard_normal((1, 4, 8)).astype(np.float32), "b": rng.standard_normal((1, 8, 4))
            .astype(np.float32)}
    qg = quantize(g, data, act_bits=4)
    ops = [n.op for n in qg.nodes]
    assert ops == ["Quantize", "QClip", "Quantize", "QClip", "QMatMul", "QClip", "Dequantize"]
    values = qops.run_reference(qg, data, keep_all=True)
    for node in qg.nodes:
        if node.op == "QClip":
            out = values[node.outputs[0]]
            assert out.min() >= -8 and out.max() <= 7
    with pytest.raises(ValueError, match="act_bits must be 4 or 8, not 5"):
        quantize(g, data, act_bits=5)


# ---- tsim: the RTL at int4 is bit-exact with fsim (slow: a Verilator build per design) -------------------------
SMALL_W4A4 = VTAConfig(log_block=2, log_inp_width=2, log_wgt_width=2, log_uop_buff_size=8, log_inp_buff_size=7,
                       log_wgt_buff_size=9, log_acc_buff_size=10)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [SMALL_W4A4, VTAConfig(log_block=2, log_wgt_width=2, log_uop_buff_size=8,
                                                       log_inp_buff_size=8, log_wgt_buff_size=9,
                                                       log_acc_buff_size=10)], ids=["w4a4", "w4a8"])
def test_tsim_matches_fsim_on_random_programs(cfg):
    """Random programs (strides, padding, ACC_8BIT loads, every ALU op, token patterns) and a GEMM leave the same DRAM
    on the RTL as on fsim at small int4 designs."""
    from vta.testing import random_program
    from vta.tsim.backend import TSimBackend
    tsim = TSimBackend(check="none", progress=False)
    programs = [gemm_program(cfg, 8, 40, 24, seed=1)[0]] + [random_program(cfg, np.random.default_rng(s))
                                                             for s in range(8)]
    for k, program in enumerate(programs):
        assert np.array_equal(tsim.run(program).dram, fsim.run(program).dram), f"program {k}"


@pytest.mark.slow
def test_tiny_cnn_w4a4_bit_exact_on_tsim(tiny_w4a4):
    """`vta run tiny_cnn --config configs/w4a4.toml --target tsim`: the full 1x16 int4 design on Verilator."""
    _assert_matches_reference(tiny_w4a4, "tsim", seed=6)


def test_area_model_follows_the_widths():
    """int4 x int8 keeps a DSP per MAC; int4 x int4 products go to LUTs (as Yosys maps them); buffers shrink."""
    from vta.area import estimate_area
    base, w4a8, w4a4 = (estimate_area(c) for c in (VTAConfig(), W4A8, W4A4))
    assert base.dsp == w4a8.dsp == 305 and w4a4.dsp == 305 - 256
    assert w4a4.lut > base.lut == w4a8.lut
    assert w4a4.bram < w4a8.bram < base.bram


def test_choose_int8_layers_is_greedy_within_a_budget():
    from vta.compiler.frontend.quantize import choose_int8_layers
    from vta.compiler.pipeline import load_graph
    graph = load_graph("tiny_cnn")
    rng = np.random.default_rng(1)
    calib = {"input": rng.standard_normal((4,) + graph.shape("input")[1:]).astype(np.float32)}
    data = {"input": rng.standard_normal((6,) + graph.shape("input")[1:]).astype(np.float32)}
    kept, trail = choose_int8_layers(graph, calib, data, act_bits=4, wgt_bits=4, budget=100.0)
    assert kept == [] and len(trail) == 1 and 0.0 <= trail[0][1] <= 100.0
    kept, trail = choose_int8_layers(graph, calib, data, act_bits=4, wgt_bits=4, budget=-1.0)  # unreachable
    assert kept == ["conv_3", "conv_7", "gemm_12"] and [len(k) for k, _ in trail] == [0, 1, 2, 3]
