"""The shift-only requantization (``requant="shift"``): the quantizer's power-of-two weight scales
(compiler/frontend/quantize.py) and the codegen's offset start (compiler/lowering/requant.py), checked on fsim bit for
bit against the integer reference (vta.compiler.qops); on tsim in the slow tests."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_tsim_matches_fsim

from vta.backend import get_backend
from vta.compiler import qops
from vta.compiler.frontend.quantize import quantize
from vta.compiler.ir import Graph, Requant
from vta.compiler.lowering.codegen import OUTPUT, ConvLayer, LayerCode, alu_passes, build_conv_program
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.layout import pack_activation, unpack_activation
from vta.compiler.lowering.requant import offset_start, pad_channel
from vta.compiler.lowering.schedule import ConvTiling
from vta.config import VTAConfig
from vta.isa import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_SHR, Alu, Gemm
from vta.program import Program


# ---- the quantizer: power-of-two weight scales ---------------------------------------------------------------------
def _linear_graph(w: np.ndarray, b: np.ndarray) -> Graph:
    g = Graph("linear", inputs=["input"], outputs=["output"])
    g.add_tensor("input", (4, w.shape[1]), "float32")
    g.add_constant("w", w.astype(np.float32))
    g.add_constant("b", b.astype(np.float32))
    g.add_tensor("output", (4, w.shape[0]), "float32")
    g.add_node("Dense", "fc", ["input", "w", "b"], ["output"])
    return g


def test_shift_scales_are_on_the_grid_at_or_above_the_usual_and_below_twice_it() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 64)) * 10.0 ** rng.uniform(-1.5, 0, (40, 1))
    w[7] = 0.0                                     # a dead channel: floored as the usual scales floor it
    g = _linear_graph(w, rng.standard_normal(40))
    calib = {"input": rng.standard_normal((8, 64)).astype(np.float32)}
    q = quantize(g, calib, mode="shift")
    node = next(n for n in q.nodes if n.op == "QDense")
    rq, sw = node.attrs["requant"], node.attrs["w_scale"].astype(np.float64)
    sx, sy = q.tensors[node.inputs[0]].scale, q.tensors[node.outputs[0]].scale
    assert (rq.multiplier == 1).all() and (rq.shift >= 0).all() and len(set(rq.shift.tolist())) > 3
    np.testing.assert_allclose(sw, sy / sx * 2.0 ** -rq.shift.astype(np.float64), rtol=1e-6)
    per = np.abs(w).max(axis=1)
    usual = np.maximum(per, per.max() * 2**-8) / 127
    assert (sw >= usual * (1 - 1e-6)).all() and (sw < 2 * usual).all()
    assert rq.shift[7] == rq.shift[np.argmax(per)] + 8   # 2**-8 of the largest channel's range, on the grid
    # the weights and the bias at that scale, the rounding 2**(S-1) folded into the bias
    wq, bq = q.constants[node.inputs[1]], q.constants[node.inputs[2]]
    np.testing.assert_array_equal(wq, np.clip(np.rint(w / sw[:, None]), -127, 127))
    b = g.constants["b"].astype(np.float64)
    rounded = bq - (1 << (rq.shift - 1)) - b / (sx * sw)    # within half an LSB (the scales' float32 rounding aside)
    assert (np.abs(rounded) <= 0.5 + 1e-3).all()


# ---- the codegen: offset start on fsim ----------------------------------------------------------------------------
def _layer(o: int = 56, *, per_channel: bool = True, bias: int = 20000, shift: tuple[int, int] = (8, 14),
           lo: int = -128, hi: int = 127, seed: int = 1) -> tuple[np.ndarray, np.ndarray, ConvLayer, Requant]:
    """A 1x1 layer, 48 -> ``o`` channels over 60 rows, M = 1, random int8 data."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 48, 60, 1)).astype(np.int8)
    w = rng.integers(-128, 128, (o, 48, 1, 1)).astype(np.int8)
    sh = rng.integers(*shift, o) if per_channel else np.full(o, shift[0])
    b = rng.integers(-bias, bias, o).astype(np.int32)
    rq = Requant(np.ones(o, np.int64), sh, lo, hi)
    layer = ConvLayer.make(x.shape, w, b, rq.multiplier, rq.shift, lo, hi, intr=intrinsics(VTAConfig()))
    return x, b, layer, rq


def _run(x: np.ndarray, b: np.ndarray, layer: ConvLayer, rq: Requant,
         cfg: VTAConfig | None = None) -> tuple[list[Alu], Program, LayerCode]:
    """Run the layer (2 output blocks x 16 rows per tile: 8 tiles); assert bit-exact with qops and pad channels 0."""
    cfg = cfg or VTAConfig()
    w = layer.weight.data.transpose(0, 4, 1, 5, 2, 3).reshape(-1, 48)[:layer.geom.o].reshape(-1, 48, 1, 1)
    program, code = build_conv_program(cfg, layer, pack_activation(x, batch=1, block=16),
                                       ConvTiling(layer.geom, 2, 3, 16, 1))
    assert code.tiles == 8
    result = get_backend("fsim").run(program)
    raw = program.read(OUTPUT, result.dram)
    expected = qops.qconv2d(x, w, b, rq, (1, 1), (0, 0, 0, 0), 1)
    np.testing.assert_array_equal(unpack_activation(raw, expected.shape), expected)
    pads = raw[:, -1, ..., layer.geom.o % 16:] if layer.geom.o % 16 else np.zeros(1)
    assert not pads.any()                          # a pad channel stays 0, as without the offset start
    return [i for i in program.insns if isinstance(i, Alu)], program, code


def _count(alus: list[Alu], op: int, imm: bool | None = None) -> int:
    return sum(i.alu_opcode == op and (imm is None or i.use_imm == imm) for i in alus)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_offset_start_is_bit_exact_with_min_starts_and_no_mul(per_channel: bool) -> None:
    x, b, layer, rq = _layer(per_channel=per_channel)
    offset = offset_start(layer, intrinsics(VTAConfig()))
    assert offset is not None and offset.min_start and offset.per_tensor == (not per_channel)
    np.testing.assert_array_equal(offset.start, b.astype(np.int64) - (1 << (rq.shift + 8)))
    alus, program, code = _run(x, b, layer, rq)
    # two acc parts: the first tile of each starts with the reset and an ADD of the start, the 6 others with a MIN
    assert sum(isinstance(i, Gemm) and i.reset for i in program.insns) == 2
    assert _count(alus, ALU_ADD) == 2 and _count(alus, ALU_MIN, imm=False) == code.tiles - 2
    assert _count(alus, ALU_MUL) == 0
    assert _count(alus, ALU_SHR, imm=not per_channel) == _count(alus, ALU_SHR)
    assert {i.imm for i in alus if i.alu_opcode == ALU_MAX} == {-128 - 256}
    assert {i.imm for i in alus if i.alu_opcode == ALU_MIN and i.use_imm} == {127 - 256}
    # per output entry: SHR, MAX, MIN, and one start pass (the 2 resets are GEMMs, their ADDs ALU passes)
    assert code.alu_uops == 60 * 4 * 4


def test_a_bias_above_the_window_keeps_the_reset_and_add_start() -> None:
    x, b, layer, rq = _layer(bias=1 << 17, shift=(8, 9))    # bias up to 2**17 > 2**(8 + 8) - 384: no MIN start
    offset = offset_start(layer, intrinsics(VTAConfig()))
    assert offset is not None and not offset.min_start
    alus, program, code = _run(x, b, layer, rq)
    assert sum(isinstance(i, Gemm) and i.reset for i in program.insns) == code.tiles
    assert _count(alus, ALU_ADD) == code.tiles and _count(alus, ALU_MIN, imm=False) == 0


def test_a_shift_too_large_or_a_bias_overflowing_falls_back_to_todays_passes() -> None:
    intr = intrinsics(VTAConfig())
    x, b, layer, rq = _layer(shift=(20, 24))                 # S + 8 > 30 for some channel
    assert offset_start(layer, intr) is None
    alus, _, code = _run(x, b, layer, rq)
    assert {i.imm for i in alus if i.alu_opcode == ALU_MAX} == {-128}
    assert _count(alus, ALU_ADD) == code.tiles + 1           # ADD bias after the GEMMs (the last tile in 2 groups)
    x, b, layer, rq = _layer(bias=100, shift=(8, 9))
    b[5] = -(2**31 - 2**18)                                   # inside int32 with the products, not with the offset
    layer = ConvLayer.make(x.shape, layer.weight.data.transpose(0, 4, 1, 5, 2, 3).reshape(-1, 48)[:56, :, None, None],
                           b, rq.multiplier, rq.shift, -128, 127, intr=intr)
    assert offset_start(layer, intr) is None
    _run(x, b, layer, rq)


def test_where_the_offset_start_does_not_apply() -> None:
    _, _, layer, _ = _layer()
    for knob in ("fused_requant", "gemm_overwrite", "concurrent_alu"):
        cfg = VTAConfig(**{knob: True})
        assert offset_start(layer, intrinsics(cfg)) is None, knob
    intr = intrinsics(VTAConfig())
    g = layer.geom
    w = np.zeros((g.o, 48, 1, 1), np.int8)
    assert offset_start(ConvLayer.make((1, 48, 60, 1), w, 0, 3, 10, -128, 127, intr=intr), intr) is None  # M = 3
    assert offset_start(ConvLayer.make((1, 48, 60, 1), w, 0, 1, 10, -128, 127, intr=intr, rounding=512),
                        intr) is None                                                            # QMatMul's
    assert offset_start(ConvLayer.make((1, 48, 60, 1), w, 0, 1, -1, -128, 127, intr=intr), intr) is None  # S < 0
    assert pad_channel(np.array([9, 9]), True) == (-(1 << 17), 9) and pad_channel(np.array([3, 9]), False) == (-512, 1)


def test_the_pass_count_the_estimates_use() -> None:
    _, _, layer, _ = _layer()
    assert alu_passes(layer) == ["ADD", "SHR", "MAX", "MIN"]
    assert alu_passes(layer, offset=True) == ["SHR", "MAX", "MIN"]
    assert offset_start(layer, intrinsics(VTAConfig())).passes() == ["SHR", "MAX", "MIN"]


def test_the_cli_flag_says_what_shift_does_and_costs(capsys: pytest.CaptureFixture[str]) -> None:
    from vta.cli import main
    for command in ("run", "compile"):
        assert main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "--requant {multiply,shift}" in text
        assert "K/16 + 4 cycles per output vector instead of K/16 + 6" in text
        assert "up to one bit of weight precision per channel" in text


# ---- tsim ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
def test_offset_start_on_tsim_is_bit_exact_and_the_cycle_model_within_5_percent(per_channel: bool) -> None:
    from vta.tsim.backend import TSimBackend
    x, b, layer, rq = _layer(per_channel=per_channel)
    _, program, _ = _run(x, b, layer, rq)
    assert_tsim_matches_fsim(TSimBackend(check="none", progress=False), program, tolerance=0.05)


@pytest.mark.slow
def test_bert_tiny_with_shift_on_tsim_is_bit_exact_and_the_cycle_model_within_5_percent() -> None:
    from vta.compiler.pipeline import compile_model, random_inputs
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    compiled = compile_model("bert_tiny", VTAConfig(), requant="shift")
    steps = {s.node.name: s for s in compiled.steps if isinstance(s, AccelStep)}
    linear = [s for s in steps.values() if s.node.op == "QConv2d"]
    assert linear and all(ALU_MUL not in {i.alu_opcode for i in s.program.insns if isinstance(i, Alu)}
                          for s in linear)
    inputs = random_inputs(compiled.graph, 0)
    out = run(compiled, inputs, target="tsim")
    for name, value in qops.run_reference(compiled.graph, inputs).items():
        np.testing.assert_array_equal(out.outputs[name], value)
    measured = {layer.layer: layer.cycles for layer in out.layers if layer.layer in steps}
    assert set(measured) == set(steps)
    for name, cycles in measured.items():
        assert abs(steps[name].predicted_cycles - cycles) <= 0.05 * cycles, name
