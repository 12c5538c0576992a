"""Requantization at the int32 extremes: the quantizer's (M, S) never let ``acc * M`` wrap, whatever the input
(compiler/frontend/quantize.py ``choose_requant`` and the worst-case accumulator bound), and every requantization path
of the accelerator -- MUL + SHR per channel and per tensor, SHR alone (``--requant shift``), the fused REQ of the
``fused_requant`` knob, a residual add's MUL/ADD/SHR -- equals the integer reference (qops) on fsim with
accumulators and multipliers at their extremes; one small case on the RTL (tsim)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vta.compiler import qops
from vta.compiler.frontend.quantize import BIAS_LIMIT, INT32_MAX, choose_requant, quantize
from vta.compiler.ir import M_MAX, AddRequant, Graph, Requant
from vta.compiler.pipeline import compile_graph
from vta.compiler.runtime.compiled import AccelStep
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig
from vta.isa import ALU_MUL, ALU_REQ, ALU_SHR, Alu

C, OUT, HW = 16, 16, 4
K = C * 3 * 3


def _extreme_graph(mult: np.ndarray, shift: np.ndarray, bias: np.ndarray, *, weight: int = 127) -> Graph:
    """x (int8 1x16x4x4) -> conv a (3x3, weights +-``weight`` by channel parity, ``bias``, requant (mult, shift))
    -> add(a, x) with the largest multipliers -> y."""
    g = Graph("extremes")
    g.add_tensor("x", (1, C, HW, HW), "int8", 0.05)
    g.inputs.append("x")
    sign = np.where(np.arange(OUT) % 2 == 0, 1, -1).reshape(OUT, 1, 1, 1)
    g.add_constant("w", (sign * np.full((OUT, C, 3, 3), weight)).astype(np.int8))
    g.add_constant("b", bias.astype(np.int32))
    g.add_tensor("a", (1, OUT, HW, HW), "int8", 0.1)
    g.add_tensor("y", (1, OUT, HW, HW), "int8", 0.1)
    g.add_node("QConv2d", "conv", ["x", "w", "b"], ["a"], strides=(1, 1), pads=(1, 1, 1, 1), groups=1,
               requant=Requant(mult, shift))
    g.add_node("QAdd", "add", ["a", "x"], ["y"], requant=AddRequant(M_MAX, M_MAX, 16))
    g.outputs.append("y")
    g.validate()
    return g


def _inputs() -> list[dict[str, np.ndarray]]:
    """Inputs driving every accumulator to its extremes: all 127, all -128, and alternating."""
    alt = np.where(np.indices((1, C, HW, HW)).sum(axis=0) % 2 == 0, 127, -128)
    return [{"x": np.full((1, C, HW, HW), v, np.int8)} for v in (127, -128)] + [{"x": alt.astype(np.int8)}]


def _products(g: Graph, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """``acc * M`` of the convolution in int64 (what wraps if it leaves int32)."""
    acc = qops.conv2d_acc(inputs["x"], g.constants["w"], g.constants["b"], (1, 1), (1, 1, 1, 1))
    return acc.astype(np.int64) * g.node("conv").attrs["requant"].multiplier.reshape(1, OUT, 1, 1)


def _requant_case(kind: str) -> tuple[Graph, VTAConfig]:
    """The graph and config of one requantization path, its multipliers chosen by the quantizer's rule for the
    worst-case accumulator (so ``acc * M`` comes within a factor 2 of int32's limit without crossing it)."""
    worst = np.full(OUT, 127 * 128 * K + BIAS_LIMIT // 1024)
    bias = np.where(np.arange(OUT) % 2 == 0, 1, -1) * (BIAS_LIMIT // 1024)
    m = np.linspace(0.0001, 0.05, OUT)
    if kind == "shift":
        mult, shift = np.ones(OUT, np.int64), np.arange(OUT) + 12
    elif kind == "per_tensor":
        mult, shift = choose_requant(np.full(OUT, 0.003), worst, rounding=True)
    else:
        mult, shift = choose_requant(m, worst, rounding=True)
    cfg = VTAConfig(fused_requant=True) if kind == "fused" else VTAConfig()
    return _extreme_graph(mult, shift, bias), cfg


@pytest.mark.parametrize("kind", ["per_channel", "per_tensor", "shift", "fused"])
def test_every_requant_path_at_the_extremes_equals_qops_on_fsim(kind: str) -> None:
    g, cfg = _requant_case(kind)
    compiled = compile_graph(g, cfg, policy="accel")
    steps = {s.node.name: s for s in compiled.steps if isinstance(s, AccelStep)}
    assert set(steps) == {"conv", "add"}
    ops = {insn.alu_opcode for insn in steps["conv"].program.insns if isinstance(insn, Alu)}
    want = {"fused": {ALU_REQ}, "shift": {ALU_SHR}}.get(kind, {ALU_MUL, ALU_SHR})
    assert want <= ops and (ALU_MUL not in ops if kind in ("shift", "fused") else True), ops
    peaks = []
    for inputs in _inputs():
        product = np.abs(_products(g, inputs))
        assert product.max() <= INT32_MAX  # the quantizer's bound holds: no wrap anywhere
        peaks.append(product.max())
        ref = qops.run_reference(g, inputs)
        out = run(compiled, inputs, target="fsim")
        np.testing.assert_array_equal(out.outputs["y"], ref["y"])
    if kind != "shift":
        assert max(peaks) > 2**30  # the test reaches the top bit of int32
    # the add's products at their extremes: 128 * 32767 twice, well inside int32 (a QAdd cannot wrap)
    assert 2 * 128 * M_MAX < INT32_MAX


def test_the_reference_wraps_where_the_old_rule_let_it() -> None:
    """What the issue saw: a multiplier chosen for twice the calibrated range (the old rule) and an input beyond it
    wrap the product; fsim and qops agree on the wrapped value, and the quantizer's rule now refuses that M."""
    acc_calibrated = 2 * 127 * 40 * K // 10  # a random-data calibration sees a tenth of the worst case
    m_old, _ = choose_requant(np.full(OUT, 0.002), np.full(OUT, acc_calibrated))
    g = _extreme_graph(m_old, np.full(OUT, 24), np.zeros(OUT))
    inputs = _inputs()[0]
    assert np.abs(_products(g, inputs)).max() > INT32_MAX  # the old choice wraps on an all-127 input
    out = run(compile_graph(g, VTAConfig(), policy="accel"), inputs, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(g, inputs)["y"])
    m_new, _ = choose_requant(np.full(OUT, 0.002), np.full(OUT, 127 * 127 * K), rounding=True)
    assert (m_new * 127 * 127 * K <= INT32_MAX).all() and (m_new < m_old).all()


@settings(max_examples=200, deadline=None)
@given(st.floats(1e-9, 8.0), st.integers(0, 2**31 - 2))
def test_choose_requant_never_lets_the_product_wrap(m: float, bound: int) -> None:
    mult, shift = choose_requant(np.array([m]), np.array([bound]), rounding=True)
    M, S = int(mult[0]), int(shift[0])
    rounding = (1 << (S - 1)) // M if S > 0 else 0
    assert 1 <= M <= M_MAX and 0 <= S <= 31
    assert M * (bound + rounding) <= INT32_MAX or (M == 1 and S == 0)


def _float_conv(weights: np.ndarray) -> Graph:
    g = Graph("one_conv")
    g.add_tensor("input", (1, 3, 8, 8), "float32")
    g.inputs.append("input")
    g.add_constant("w", weights.astype(np.float32))
    g.add_constant("b", np.zeros(weights.shape[0], np.float32))
    g.add_tensor("output", (1, weights.shape[0], 8, 8), "float32")
    g.add_node("Conv2d", "conv", ["input", "w", "b"], ["output"], strides=(1, 1), pads=(1, 1, 1, 1), groups=1)
    g.outputs.append("output")
    g.validate()
    return g


def test_input_beyond_the_calibration_saturates_instead_of_wrapping() -> None:
    """The issue's case: calibrated on random normal data, run on a bright image (every pixel at the calibrated
    maximum): the float output is far beyond the calibrated range, so the int8 output must sit at 127, not wrap."""
    rng = np.random.default_rng(0)
    g = _float_conv(np.abs(rng.standard_normal((4, 3, 3, 3))) + 0.5)
    calib = rng.standard_normal((8, 3, 8, 8)).astype(np.float32)
    q = quantize(g, {"input": calib})
    bright = {"input": np.full((1, 3, 8, 8), float(np.abs(calib).max()), np.float32)}
    values = qops.run_reference(q, bright, keep_all=True)
    conv = next(n for n in q.nodes if n.op == "QConv2d")
    assert values[conv.outputs[0]][:, :, 1:-1, 1:-1].min() == 127  # saturated, as the float output is out of range


def test_extreme_requant_on_the_rtl_equals_qops() -> None:
    """One case on the Verilator model of the default core: the per-channel MUL + SHR at the extremes and the add
    with the largest multipliers, bit for bit as the integer reference."""
    g, cfg = _requant_case("per_channel")
    compiled = compile_graph(g, cfg, policy="accel")
    inputs = _inputs()[2]
    out = run(compiled, inputs, target="tsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(g, inputs)["y"])
