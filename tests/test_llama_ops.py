"""The operators of Llama- and T5-style blocks (compiler/frontend/rmsnorm.py, onnx_frontend.py, float_ref.py,
quantize.py, compiler/qops_gated.py): RMSNorm's decompositions fused into one RMSNorm node, Neg as a Mul by -1, the
product of two activations (SwiGLU) as QMulAct; each against ONNX Runtime in float and, quantized, on the CPU path
against the integer reference; a tiny Llama block (RMSNorm, rotary embedding, SwiGLU) on fsim bit-exact with the
integer reference and its linear layers on the accelerator."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import TensorProto, helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.lowering.layernorm import integer_layernorm
from vta.config import VTAConfig

RNG = np.random.default_rng(23)


@pytest.fixture(autouse=True)
def _seeded():
    """Each test draws the same values whatever ran before it in its process (xdist spreads them)."""
    global RNG
    RNG = np.random.default_rng(23)


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _ops(graph):
    return [n.op for n in graph.nodes]


def _check(model, feeds, *, steps):
    """Float import == ONNX Runtime; quantized, the CPU path == the integer reference and within ``steps`` output
    steps of ONNX Runtime. Returns (float graph, quantized graph)."""
    graph, qgraph, got, want = onnx_op_run(model, feeds, atol=2e-5, rtol=1e-4)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= steps * s_out
    return graph, qgraph


# ---- RMSNorm --------------------------------------------------------------------------------------------------------
def _const(name, value):
    return (name, np.asarray(value, np.float32))


def _rms_nodes(form, *, weight, cast, out="y"):
    """RMSNorm of ``x`` over the last axis as exporters write it, into ``out``: ``form`` names the inverse root."""
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT)] if cast else []
    x = "xf" if cast else "x"
    square = helper.make_node("Mul", [x, x], ["sq"]) if form == "square_mul" else \
        helper.make_node("Pow", [x, "two"], ["sq"])
    nodes += [square, helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
              helper.make_node("Add", ["ms", "eps"], ["v"])]
    normed = "n" if weight or cast else out
    if form == "pow_half":
        nodes += [helper.make_node("Pow", ["v", "minus_half"], ["r"]), helper.make_node("Mul", ["r", x], [normed])]
    elif form == "div_x":
        nodes += [helper.make_node("Sqrt", ["v"], ["s"]), helper.make_node("Div", [x, "s"], [normed])]
    else:
        nodes.append(helper.make_node("Sqrt", ["v"], ["s"]))
        nodes.append(helper.make_node("Reciprocal", ["s"], ["r"]) if form == "reciprocal" else
                     helper.make_node("Div", ["one", "s"], ["r"]))
        nodes.append(helper.make_node("Mul", [x, "r"], [normed]))
    if cast:
        nodes.append(helper.make_node("Cast", [normed], ["nc" if weight else out], to=TensorProto.FLOAT))
        normed = "nc"
    if weight:
        nodes.append(helper.make_node("Mul", ["w", normed], [out], name="norm_weight"))
    inits = [_const("two", 2.0), _const("eps", 1e-6), _const("one", 1.0), _const("minus_half", -0.5)]
    return nodes, inits


@pytest.mark.parametrize("form", ["div_one", "reciprocal", "div_x", "pow_half", "square_mul"])
@pytest.mark.parametrize("weight, cast", [(True, True), (True, False), (False, False), (False, True)])
def test_rms_norm_decompositions_fuse_into_one_node(form, weight, cast):
    x = _x(2, 5, 24, spread=1.5)
    nodes, inits = _rms_nodes(form, weight=weight, cast=cast)
    inits.append(_const("w", RNG.uniform(0.5, 1.5, 24)))
    graph, qgraph = _check(onnx_model(nodes, {"x": x}, inits), {"x": x}, steps=2.0)
    assert _ops(graph) == ["RMSNorm"] and _ops(qgraph) == ["Quantize", "QRMSNorm", "Dequantize"]
    gamma = graph.constants[graph.nodes[0].inputs[1]]
    np.testing.assert_array_equal(gamma, inits[-1][1] if weight else np.ones(24, np.float32))
    assert graph.nodes[0].attrs["epsilon"] == pytest.approx(1e-6)
    if weight:
        assert graph.nodes[0].name == "norm_weight"          # the report row keeps the last node's name


@pytest.mark.parametrize("form", ["reciprocal", "pow_half"])
def test_an_rms_norm_without_its_eps_add_fuses_with_eps_zero(form):
    """torch's new exporter drops an eps float32 cannot add (Helium's 1e-8): ReduceMean feeds the inverse root
    directly. It is one RMSNorm of epsilon 0."""
    x = _x(2, 5, 24, spread=1.5)
    nodes, inits = _rms_nodes(form, weight=True, cast=False)
    add = next(n for n in nodes if n.op_type == "Add")
    nodes = [n for n in nodes if n is not add]
    for n in nodes:
        n.input[:] = ["ms" if t == "v" else t for t in n.input]
    inits.append(_const("w", RNG.uniform(0.5, 1.5, 24)))
    graph, _ = _check(onnx_model(nodes, {"x": x}, inits), {"x": x}, steps=2.0)
    assert _ops(graph) == ["RMSNorm"] and graph.nodes[0].attrs["epsilon"] == 0.0


def test_an_rms_norm_over_another_axis_is_not_fused():
    x = _x(2, 5, 24)
    nodes, inits = _rms_nodes("div_one", weight=False, cast=False)
    nodes[1] = helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[1])
    assert "RMSNorm" not in [n.op for n in import_onnx(onnx_model(nodes, {"x": x}, inits)).nodes]   # node by node


def test_an_rms_norm_whose_inner_value_is_read_elsewhere_is_not_fused():
    """The mean square also leaves the region (added to the output): fusing would lose it."""
    x = _x(1, 4, 8)
    nodes, inits = _rms_nodes("div_one", weight=False, cast=False, out="n")
    nodes.append(helper.make_node("Add", ["n", "ms"], ["y"]))
    assert "RMSNorm" not in [n.op for n in import_onnx(onnx_model(nodes, {"x": x}, inits)).nodes]   # node by node


def test_qrms_norm_values():
    """y = x / sqrt(mean(x^2) + eps / scale^2) * gamma in steps of out_scale: row [3, 4] has rms sqrt(12.5)."""
    x = np.array([[3, 4], [0, 0]], np.int8)
    got = qops.rms_norm(x, 0.5, np.array([1.0, 2.0]), 0.01, epsilon=0.0)
    rms = np.sqrt(12.5)
    assert got[0].tolist() == [int(np.rint(3 / rms / 0.01)), 127]          # 4 / rms * 2 / 0.01 = 226: clipped
    assert got[1].tolist() == [0, 0]                                      # eps 0 and a zero row: 0 / 0 would be NaN
    big_eps = qops.rms_norm(x, 0.5, np.ones(2), 0.01, epsilon=1.0)        # eps 1.0 real = 4 squared steps
    assert big_eps[0, 0] == int(np.rint(3 / np.sqrt(12.5 + 4.0) / 0.01))


def test_rms_norm_is_not_the_integer_layernorm():
    """The integer LayerNorm replaces plain LayerNorms only: a QRMSNorm stays as it is under layernorm=int."""
    x = _x(1, 6, 16)
    nodes, inits = _rms_nodes("div_one", weight=False, cast=False)
    qgraph = quantize(import_onnx(onnx_model(nodes, {"x": x}, inits)), {"x": x})
    swapped_graph, swapped = integer_layernorm(qgraph)
    assert swapped == {} and _ops(swapped_graph) == _ops(qgraph)


# ---- Neg and the product of two activations -------------------------------------------------------------------------
def test_neg_is_a_mul_by_minus_one():
    x = _x(2, 3, 8)
    graph, qgraph = _check(onnx_model([helper.make_node("Neg", ["x"], ["y"])], {"x": x}), {"x": x}, steps=1.0)
    assert _ops(graph) == ["Mul"] and graph.constants[graph.nodes[0].inputs[1]].tolist() == [-1.0]
    assert _ops(qgraph) == ["Quantize", "QMul", "Dequantize"]


@pytest.mark.parametrize("shape", [(2, 16, 24), (4, 10)])
def test_mul_of_two_activations_is_a_qmulact(shape):
    a, b = _x(*shape, spread=2.0), _x(*shape)
    graph, qgraph = _check(onnx_model([helper.make_node("Mul", ["a", "b"], ["y"])], {"a": a, "b": b}),
                           {"a": a, "b": b}, steps=2.0)
    assert _ops(graph) == ["Mul"] and _ops(qgraph) == ["Quantize", "Quantize", "QMulAct", "Dequantize"]


def test_mul_of_activations_of_two_shapes_broadcasts():
    """The smaller operand is broadcast to the output's shape first (a Concat of copies), then one Mul."""
    a, b = _x(2, 8), _x(1, 8)
    graph = import_onnx(onnx_model([helper.make_node("Mul", ["a", "b"], ["y"])], {"a": a, "b": b}))
    assert [n.op for n in graph.nodes] == ["Concat", "Mul"]
    np.testing.assert_allclose(run_float(graph, {"a": a, "b": b})["y"], a * b, rtol=1e-6)


def test_qmul_act_rounds_half_up_in_int64():
    a = np.array([-128, 127, 10, -10], np.int8)
    b = np.array([-128, 127, 3, 3], np.int8)
    assert qops.qmul_act(a, b, 3, 10).tolist() == [(16384 * 3 + 512) >> 10, (16129 * 3 + 512) >> 10, 0, 0]
    assert qops.qmul_act(a, b, 1, 0).tolist() == [127, 127, 30, -30]
    assert qops.qmul_act(a[2:], b[2:], 7, 2).tolist() == [(210 + 2) >> 2, (-210 + 2) >> 2] == [53, -52]
    with pytest.raises(ValueError, match="QMulAct operands have shapes"):
        qops.qmul_act(a, b[:2], 1, 0)


# ---- a Llama block on fsim ------------------------------------------------------------------------------------------
TOKENS, WIDTH, HEADS, FFN = 16, 32, 2, 64
HEAD = WIDTH // HEADS


def _rotary(name, t):
    """``t * cos + rotate_half(t) * sin`` of ``t [1, H, L, d]`` (rotate_half: Slice, Neg, Concat)."""
    half = HEAD // 2
    return [helper.make_node("Slice", [t, "half", "end", "minus1"], [f"{name}_hi"]),
            helper.make_node("Slice", [t, "zero", "half", "minus1"], [f"{name}_lo"]),
            helper.make_node("Neg", [f"{name}_hi"], [f"{name}_neg"], name=f"{name}_neg"),
            helper.make_node("Concat", [f"{name}_neg", f"{name}_lo"], [f"{name}_rot"], axis=-1),
            helper.make_node("Mul", [t, "cos"], [f"{name}_c"]), helper.make_node("Mul", [f"{name}_rot", "sin"],
                                                                                  [f"{name}_s"]),
            helper.make_node("Add", [f"{name}_c", f"{name}_s"], [f"{name}_r"])], half


def _heads(src, dst):
    return [helper.make_node("Reshape", [src, "split"], [f"{dst}_split"]),
            helper.make_node("Transpose", [f"{dst}_split"], [dst], perm=[0, 2, 1, 3])]


def _llama_block():
    """A pre-norm Llama block of width 32, 2 heads of 16, an MLP of 64 (SwiGLU), RMSNorms written as torch does."""
    nodes, inits = [], []
    for norm, src in (("n1", "x"), ("n2", "h")):
        body, constants = _rms_nodes("div_one", weight=True, cast=True, out=f"{norm}_out")
        rename = {t: f"{norm}_{t}" for n in body for t in [*n.input, *n.output] if t not in ("x", "two", "eps", "one")}
        rename.update({"x": src, "w": f"{norm}_w", f"{norm}_out": f"{norm}_out"})
        for k, n in enumerate(body):
            n.input[:] = [rename.get(t, t) for t in n.input]
            n.output[:] = [rename.get(t, t) for t in n.output]
            n.name = f"{norm}/{n.name or f'{n.op_type}_{k}'}"
        nodes += body
        inits += [c for c in constants if c[0] != "minus_half"] if norm == "n1" else []
        inits.append(_const(f"{norm}_w", RNG.uniform(0.8, 1.2, WIDTH)))
    attention = []
    for p in ("q", "k", "v"):
        attention.append(helper.make_node("MatMul", ["n1_out", f"w{p}"], [f"{p}_flat"], name=f"{p}_proj"))
        attention += _heads(f"{p}_flat", p)
        inits.append(_const(f"w{p}", _x(WIDTH, WIDTH, spread=WIDTH ** -0.5)))
    rot_q, half = _rotary("q", "q")
    rot_k, _ = _rotary("k", "k")
    attention += rot_q + rot_k + [
        helper.make_node("Transpose", ["k_r"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q_r", "kt"], ["scores_raw"], name="scores"),
        helper.make_node("Mul", ["scores_raw", "inv_sqrt_d"], ["scores_scaled"]),
        helper.make_node("Softmax", ["scores_scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="context"),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ctx_t", "merge"], ["ctx_flat"]),
        helper.make_node("MatMul", ["ctx_flat", "wo"], ["attn"], name="o_proj"),
        helper.make_node("Add", ["x", "attn"], ["h"])]
    positions = np.arange(TOKENS)[:, None] / 10000.0 ** (np.arange(half) / half)[None, :]
    angles = np.concatenate([positions, positions], axis=1)
    inits += [_const("wo", _x(WIDTH, WIDTH, spread=WIDTH ** -0.5)), _const("cos", np.cos(angles)),
              _const("sin", np.sin(angles)), _const("inv_sqrt_d", HEAD ** -0.5),
              ("split", np.array([1, TOKENS, HEADS, HEAD], np.int64)),
              ("merge", np.array([1, TOKENS, WIDTH], np.int64)),
              ("zero", np.array([0], np.int64)), ("half", np.array([half], np.int64)),
              ("end", np.array([HEAD], np.int64)), ("minus1", np.array([-1], np.int64))]
    mlp = [helper.make_node("MatMul", ["n2_out", "wg"], ["gate"], name="gate_proj"),
           helper.make_node("MatMul", ["n2_out", "wu"], ["up"], name="up_proj"),
           helper.make_node("Sigmoid", ["gate"], ["gate_sig"]), helper.make_node("Mul", ["gate", "gate_sig"], ["silu"]),
           helper.make_node("Mul", ["silu", "up"], ["gated"], name="swiglu"),
           helper.make_node("MatMul", ["gated", "wd"], ["down"], name="down_proj"),
           helper.make_node("Add", ["h", "down"], ["y"])]
    inits += [_const("wg", _x(WIDTH, FFN, spread=WIDTH ** -0.5)), _const("wu", _x(WIDTH, FFN, spread=WIDTH ** -0.5)),
              _const("wd", _x(FFN, WIDTH, spread=FFN ** -0.5))]
    return onnx_model(nodes[:len(nodes) // 2] + attention + nodes[len(nodes) // 2:] + mlp,
                      {"x": _x(1, TOKENS, WIDTH)}, inits)


def test_a_llama_block_on_fsim_is_bit_exact_with_the_reference(tmp_path, monkeypatch):
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    model = _llama_block()
    x = _x(1, TOKENS, WIDTH)
    graph = import_onnx(model)
    assert _ops(graph).count("RMSNorm") == 2 and "Neg" not in _ops(graph)
    assert next(n for n in graph.nodes if n.name == "swiglu").op == "Mul"
    path = tmp_path / "llama_block.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel")
    where = {s.node.name: ("accel" if isinstance(s, AccelStep) else "cpu", s.node.op) for s in compiled.steps}
    linear = {name for name, (_, op) in where.items() if op == "QConv2d"}
    assert linear == {f"{p}_proj" for p in ("q", "k", "v", "o", "gate", "up", "down")}
    assert all(where[name][0] == "accel" for name in linear)
    assert where["swiglu"] == ("cpu", "QMulAct") and where["q_neg"] == ("cpu", "QMul")
    assert sorted(op for side, op in where.values() if op == "QRMSNorm" and side == "cpu") == ["QRMSNorm"] * 2
    out = run(compiled, {"x": x}, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, {"x": x})["y"])
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = out.outputs["y"].astype(np.float64)
    assert float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99
