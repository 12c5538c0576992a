"""Transformer operators (compiler/frontend/onnx_frontend.py, float_ref.py, quantize.py, compiler/qops.py) and the
bert_tiny zoo model: each operator against ONNX Runtime in float and its quantized graph on the CPU path against the
integer reference; the LayerNorm and Gelu decompositions fused into one node; MatMuls over tokens as accelerator
convolutions; bert_tiny end to end on fsim."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend import zoo
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.compiler.ir import node_macs
from vta.config import VTAConfig

RNG_SEED = 27                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _model(nodes, inputs, inits=(), opset=17):
    return onnx_model(nodes, inputs, inits, opset=opset)


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _check(model, feeds, *, steps=3.0):
    """Float import == ONNX Runtime; the quantized graph on the CPU path == the integer reference and within
    ``steps`` output steps of ONNX Runtime. Returns (float graph, quantized graph)."""
    graph, qgraph, got, want = onnx_op_run(model, feeds, atol=2e-5, rtol=1e-4)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= steps * s_out
    return graph, qgraph


def _ops(graph):
    return [n.op for n in graph.nodes]


# ---- MatMul ---------------------------------------------------------------------------------------------------------
def test_matmul_of_two_activations_broadcasts():
    a, b = _x(2, 3, 8, 16), _x(1, 3, 16, 5)
    graph, qgraph = _check(_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a, "b": b}),
                           {"a": a, "b": b})
    assert _ops(graph) == ["MatMul"] and "QMatMul" in _ops(qgraph)
    assert node_macs(graph, graph.nodes[0]) == 2 * 3 * 8 * 5 * 16


def test_matmul_over_tokens_is_a_convolution_with_its_bias():
    x, w, b = _x(2, 6, 16), _x(16, 24, spread=0.3), _x(24)
    model = _model([helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])],
                   {"x": x}, [("w", w), ("b", b)])
    graph, qgraph = _check(model, {"x": x})
    conv = next(n for n in graph.nodes if n.op == "Conv2d")
    assert graph.shape(conv.inputs[0]) == (1, 16, 12, 1) and len(conv.inputs) == 3     # every token row, the bias
    assert "Add" not in _ops(graph) and "QConv2d" in _ops(qgraph)


@pytest.mark.parametrize("rank", [2, 3])
def test_matmul_with_a_constant_first_operand(rank):
    """Learned queries times activations: a rank-2 constant is a linear layer over the transposed activation's rows
    (on the accelerator), a batched one a MatMul with a constant operand."""
    c, x = (_x(6, 16, spread=0.3) if rank == 2 else _x(2, 6, 16, spread=0.3)), _x(2, 16, 10)
    graph, qgraph = _check(_model([helper.make_node("MatMul", ["c", "x"], ["y"])], {"x": x}, [("c", c)]), {"x": x})
    assert ("Conv2d" in _ops(graph)) == (rank == 2) and ("MatMul" in _ops(graph)) == (rank == 3)


def test_matmul_refusals():
    a = _x(4)
    with pytest.raises(UnsupportedOperatorError, match="operands of rank 1 and 2; both must have rank 2 or more"):
        import_onnx(_model([helper.make_node("MatMul", ["a", "w"], ["y"])], {"a": a}, [("w", _x(4, 3))]))


# ---- Gemm of two activations -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("trans_a, trans_b, alpha, beta, c", [
    (0, 0, 1.0, 0.0, "const"),           # jax2onnx's attention scores: Gemm(q, k^T, zeros, beta=0)
    (0, 1, 1.0, 1.0, None),
    (1, 0, 0.5, 1.0, "row"),
    (1, 1, 2.0, 0.25, "const"),
    (0, 1, 1.0, 1.0, "computed"),
    (1, 0, 0.5, 2.0, "computed"),
])
def test_gemm_of_two_activations_is_a_matmul(trans_a, trans_b, alpha, beta, c):
    """A Gemm whose B is computed (or whose A is transposed) imports as what a MatMul of two activations does (a
    QMatMul once quantized), after Transposes of the transposed operands, then a Mul by alpha and an Add of beta * C;
    against onnxruntime within int8 steps."""
    m, k, n = 6, 16, 5
    a, b = _x(*((k, m) if trans_a else (m, k))), _x(*((n, k) if trans_b else (k, n)))
    feeds, inits = {"a": a, "b": b}, []
    if c == "computed":
        feeds["c"] = _x(m, n)
    elif c == "const":
        inits.append(("c", _x(m, n)))
    elif c == "row":
        inits.append(("c", _x(n)))
    node = helper.make_node("Gemm", ["a", "b"] + (["c"] if c else []), ["y"], name="gemm", transA=trans_a,
                            transB=trans_b, alpha=alpha, beta=beta)
    graph, qgraph = _check(_model([node], feeds, inits), feeds, steps=4.0)
    ops = _ops(graph)
    assert ops.count("MatMul") == 1 and "QMatMul" in _ops(qgraph) and "Dense" not in ops
    assert ops.count("Transpose") == trans_a + trans_b and ("Mul" in ops) == (alpha != 1.0 or c == "computed"
                                                                              and beta != 1.0)
    assert ("Add" in ops) == bool(c and beta)


@pytest.mark.parametrize("which", ["A", "B"])
def test_gemm_with_one_constant_and_a_transposed_or_computed_operand(which):
    """transA=1 with a constant B, and a constant A times a computed B: the constant transposed at import, a MatMul
    with one constant operand."""
    x, w = _x(16, 6), _x(16, 5, spread=0.3)
    inputs, inits, attrs = (["x", "w"], [("w", w)], {"transA": 1}) if which == "B" else \
        (["w", "x"], [("w", w.T.copy())], {"transB": 1})
    x = x if which == "B" else x.T.copy()
    graph, qgraph = _check(_model([helper.make_node("Gemm", inputs, ["y"], **attrs)], {"x": x}, inits), {"x": x})
    assert "MatMul" in _ops(graph) and "QMatMul" in _ops(qgraph)


def test_qmatmul_rounds_half_up_in_int64():
    a = np.array([[10, -3], [-10, 3]], np.int8)
    b = np.array([[2], [1]], np.int8)
    assert qops.qmatmul(a, b, 3, 2).tolist() == [[(17 * 3 + 2) >> 2], [(-17 * 3 + 2) >> 2]] == [[13], [-13]]
    assert qops.qmatmul(a, b, 32767, 0).tolist() == [[127], [-128]]
    with pytest.raises(ValueError, match="a's last axis must equal b's second to last"):
        qops.qmatmul(a, b.T, 1, 0)


# ---- LayerNorm and Gelu, and their decompositions -------------------------------------------------------------------
def _layer_norm_decomposed(x, gamma, beta):
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y"])]
    inits = [("two", np.array(2.0, np.float32)), ("eps", np.array(1e-5, np.float32)), ("g", gamma), ("b", beta)]
    return _model(nodes, {"x": x}, inits)


@pytest.mark.parametrize("decomposed", [False, True])
def test_layer_norm(decomposed):
    x, gamma, beta = _x(1, 10, 32, spread=3.0) + 1.0, RNG.uniform(0.5, 1.5, 32).astype(np.float32), _x(32) * 0.1
    if decomposed:
        model = _layer_norm_decomposed(x, gamma, beta)
    else:
        model = _model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)],
                       {"x": x}, [("g", gamma), ("b", beta)])
    graph, qgraph = _check(model, {"x": x})
    assert _ops(graph) == ["LayerNorm"] and "QLayerNorm" in _ops(qgraph)


@pytest.mark.parametrize("form", ["rsqrt", "rms_normalization"])
def test_bias_free_layer_norm_forms_are_one_layer_norm(form):
    """Cohere's LayerNorm without a bias as torch's exporter writes it: the decomposition with ``d * (1 / sqrt)``
    at opset 18, and ``x - mean`` into an RMSNormalization at opset 23."""
    x, gamma = _x(1, 10, 32, spread=3.0) + 1.0, RNG.uniform(0.5, 1.5, 32).astype(np.float32)
    mean = [helper.make_node("ReduceMean", ["x", "axes"], ["m"]), helper.make_node("Sub", ["x", "m"], ["d"])]
    inits = [("axes", np.array([-1], np.int64)), ("g", gamma)]
    if form == "rsqrt":
        nodes = mean + [helper.make_node("Pow", ["d", "two"], ["p"]),
                        helper.make_node("ReduceMean", ["p", "axes"], ["v"]),
                        helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
                        helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["d", "r"], ["n"]),
                        helper.make_node("Mul", ["g", "n"], ["y"])]
        model = _model(nodes, {"x": x}, inits + [("two", np.array(2.0, np.float32)),
                                                 ("eps", np.array(1e-5, np.float32))], opset=18)
    else:
        nodes = mean + [helper.make_node("RMSNormalization", ["d", "g"], ["y"], axis=-1, epsilon=1e-5)]
        model = _model(nodes, {"x": x}, inits, opset=23)
    graph, qgraph = _check(model, {"x": x})
    assert _ops(graph) == ["LayerNorm"] and "QLayerNorm" in _ops(qgraph)


def test_a_slice_that_keeps_everything_is_dropped():
    """XLM's ``input_ids[:, :slen]`` with slen the whole length: token ids through a Slice still index the table."""
    ids = RNG.integers(0, 20, (1, 8)).astype(np.int64)
    nodes = [helper.make_node("Slice", ["ids", "starts", "ends", "axes"], ["cut"]),
             helper.make_node("Gather", ["table", "cut"], ["e"]), helper.make_node("Relu", ["e"], ["y"])]
    graph = helper.make_graph(nodes, "ids", [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 8, 16])],
                              [numpy_helper.from_array(v, k) for k, v in
                               [("table", _x(20, 16)), ("starts", np.array([0], np.int64)),
                                ("ends", np.array([2**62], np.int64)), ("axes", np.array([1], np.int64))]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(model)
    assert _ops(g) == ["Embedding", "Relu"] and g.tensors["ids"].dtype == "int64"
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(run_float(g, {"ids": ids})["y"], want, atol=1e-6)


def test_qops_layer_norm_is_scale_free_but_for_epsilon():
    x = RNG.integers(-128, 128, (3, 16)).astype(np.int8)
    ones, zeros = np.ones(16, np.float32), np.zeros(16, np.float32)
    a = qops.layer_norm(x, 0.5, ones, zeros, 1 / 32, epsilon=0.0)
    assert np.array_equal(a, qops.layer_norm(x, 0.01, ones, zeros, 1 / 32, epsilon=0.0))
    real = x.astype(np.float64)
    want = (real - real.mean(-1, keepdims=True)) / real.std(-1, keepdims=True)
    assert np.abs(a * (1 / 32) - want).max() <= 0.5 / 32 + 1e-9


def _gelu_nodes(tanh):
    if tanh:
        nodes = [helper.make_node("Pow", ["x", "three"], ["c"]), helper.make_node("Mul", ["c", "k"], ["ck"]),
                 helper.make_node("Add", ["x", "ck"], ["s"]), helper.make_node("Mul", ["s", "r"], ["sr"]),
                 helper.make_node("Tanh", ["sr"], ["t"]), helper.make_node("Add", ["t", "one"], ["t1"]),
                 helper.make_node("Mul", ["half", "x"], ["hx"]), helper.make_node("Mul", ["hx", "t1"], ["y"])]
        inits = [("three", 3.0), ("k", 0.044715), ("r", np.sqrt(2 / np.pi)), ("one", 1.0), ("half", 0.5)]
    else:                                                # torch's export: x * 0.5 * (1 + erf(x / sqrt 2))
        nodes = [helper.make_node("Div", ["x", "sq2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["x", "e1"], ["xe"]),
                 helper.make_node("Mul", ["xe", "half"], ["y"])]
        inits = [("sq2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)]
    return nodes, [(k, np.array(v, np.float32)) for k, v in inits]


@pytest.mark.parametrize("form", ["opset20", "erf", "tanh"])
def test_gelu_becomes_one_lookup_table(form):
    x = _x(1, 8, 40, spread=2.0)
    if form == "opset20":
        model = _model([helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")], {"x": x}, opset=20)
    else:
        model = _model(*_gelu_nodes(form == "tanh")[:1], {"x": x}, _gelu_nodes(form == "tanh")[1])
    graph, qgraph = _check(model, {"x": x})
    assert _ops(graph) == ["Gelu"] and _ops(qgraph) == ["Quantize", "QLut", "Dequantize"]
    assert graph.nodes[0].attrs["approximate"] == ("none" if form == "erf" else "tanh")


def test_a_gelu_lookalike_is_not_fused():
    nodes, inits = _gelu_nodes(False)
    inits = [(k, np.array(0.6, np.float32)) if k == "half" else (k, v) for k, v in inits]
    x = _x(1, 4, spread=2.0)
    graph, _ = _check(_model(nodes, {"x": x}, inits), {"x": x})
    assert "Gelu" not in _ops(graph) and "Erf" in _ops(graph)   # the Erf stays, a lookup table of its own


@pytest.mark.parametrize("op, first_const", [("Mul", True), ("Add", False), ("Sub", True), ("Sub", False)])
def test_a_constant_that_widens_the_activation_or_comes_first(op, first_const):
    """Mamba's ``Mul(constant [1, 4, 1, 8], activation [2, 4, 8, 1])``: the output is larger than the activation, which
    is broadcast first (the CPU's rescale used to fail at run time); ``constant - x`` is ``(-1) * x + constant``."""
    x = _x(2, 4, 8, 1, spread=2.0)
    c = ("c", np.linspace(-1, 1, 32, dtype=np.float32).reshape(1, 4, 1, 8))
    inputs = ["c", "x"] if first_const else ["x", "c"]
    _check(_model([helper.make_node(op, inputs, ["y"])], {"x": x}, [c]), {"x": x})


@pytest.mark.parametrize("exponent, ops", [(2.0, ["Mul"]), (3.0, ["Pow"]), (-1.0, ["Pow"]), (0.5, None),
                                            (float("nan"), None)])
def test_pow_by_a_constant_integer(exponent, ops):
    """Pow of an activation by a constant integer (nemotron's squared ReLU as torch's new exporter writes it): x * x
    for 2, a lookup table otherwise; a fractional exponent is refused, saying why."""
    x = _x(1, 4, 16, spread=2.0) + (4.0 if exponent < 0 else 0.0)       # 1/x away from 0
    model = _model([helper.make_node("Pow", ["x", "p"], ["y"], name="pow")], {"x": x},
                   [("p", np.array(exponent, np.float32))])
    if ops is None:
        with pytest.raises(UnsupportedOperatorError, match=r"'Pow' \(node 'pow'\).*the exponent \[(0\.5|nan)\]"):
            import_onnx(model)
        return
    graph, _ = _check(model, {"x": x}, steps=6.0)        # 1/x is steep: the input's step costs output steps
    assert _ops(graph) == ops


@pytest.mark.parametrize("op, first, ops", [("Max", False, ["Clip"]), ("Min", True, ["Clip"]),
                                             ("Div", True, ["Reciprocal", "Mul"]), ("Sqrt", None, ["Sqrt"])])
def test_max_min_by_a_constant_one_over_x_and_sqrt(op, first, ops):
    """Max (Min) of an activation and one constant value is a Clip; one value divided by an activation is its
    Reciprocal (a lookup table) times the value; Sqrt is a lookup table."""
    x = _x(1, 4, 16, spread=1.0) + (3.0 if op in ("Div", "Sqrt") else 0.0)
    inputs = ["x"] if first is None else ["c", "x"] if first else ["x", "c"]
    graph, _ = _check(_model([helper.make_node(op, inputs, ["y"])], {"x": x}, [("c", np.array(0.25, np.float32))]),
                      {"x": x})
    assert _ops(graph) == ops


@pytest.mark.parametrize("with_max", [True, False])
def test_a_softmax_written_as_exp_over_its_sum_is_one_softmax(with_max):
    """``Exp(x - ReduceMax(x)) / ReduceSum(.)`` (the max step optional) over the last axis is one Softmax; an Exp whose
    sum is taken over another axis than its max stays as it is (each element-wise op a lookup table, the Div of two
    activations a table of their pairs)."""
    x = _x(1, 4, 16, spread=2.0)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [-1])
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"])] \
        if with_max else []
    nodes += [helper.make_node("Exp", ["d" if with_max else "x"], ["e"]),
              helper.make_node("ReduceSum", ["e", "axes"], ["s"]), helper.make_node("Div", ["e", "s"], ["y"])]
    model = _model(nodes, {"x": x}, [])
    model.graph.initializer.append(axes)
    graph, _, got, want = onnx_op_run(model, {"x": x}, atol=2e-5, rtol=1e-4)  # the last Softmax stays float
    assert _ops(graph) == ["Softmax"] and graph.nodes[0].attrs["axis"] == 2 and np.abs(got - want).max() < 0.02
    model.graph.initializer[-1].CopyFrom(helper.make_tensor("axes", TensorProto.INT64, [1], [1]))
    if not with_max:                                            # exp(x) / its sum over axis 1: a Softmax there
        assert [(n.op, n.attrs["axis"]) for n in import_onnx(model).nodes] == [("Softmax", 1)]
        return
    ops = _ops(import_onnx(model))                              # the max over another axis than the sum: the
    assert "Softmax" not in ops and ops[-1] == "PointwiseFn"     # Div of two activations a pair table


@pytest.mark.parametrize("alpha", [None, 1.702])
def test_silu_and_scaled_swish_become_one_lookup_table(alpha):
    """torch's SiLU export ``x * Sigmoid(x)``, and ``Sigmoid(x * alpha) * x`` (QuickGelu), fuse into one Swish."""
    x = _x(1, 8, 40, spread=3.0)
    gate = "x" if alpha is None else "xa"
    nodes = [helper.make_node("Mul", ["x", "alpha"], ["xa"])] if alpha else []
    nodes += [helper.make_node("Sigmoid", [gate], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"], name="silu")]
    graph, qgraph = _check(_model(nodes, {"x": x}, [("alpha", np.array(alpha or 1.0, np.float32))]), {"x": x})
    assert _ops(graph) == ["Swish"] and _ops(qgraph) == ["Quantize", "QLut", "Dequantize"]
    assert graph.nodes[0].name == "silu" and graph.nodes[0].attrs["alpha"] == pytest.approx(alpha or 1.0)


def test_a_swish_lookalike_is_not_fused():
    """``Sigmoid(x) * Relu(x)`` is no Swish: it stays a product of two activations (a QMulAct once quantized)."""
    x = np.linspace(-3.0, 3.0, 16, dtype=np.float32).reshape(1, 16)   # a range of outputs like the input's
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "z"], ["y"]),
             helper.make_node("Relu", ["x"], ["z"])]
    graph, qgraph = _check(_model([nodes[2], *nodes[:2]], {"x": x}), {"x": x})
    assert _ops(graph) == ["Relu", "Sigmoid", "Mul"] and "QMulAct" in _ops(qgraph)


# ---- Softmax and masks ----------------------------------------------------------------------------------------------
def _attention_scores(mask_nodes, inits, axis=-1):
    x = _x(1, 2, 6, 6, spread=2.0)
    nodes = mask_nodes + [helper.make_node("Softmax", ["z"], ["p"], axis=axis),
                          helper.make_node("Transpose", ["p"], ["y"], perm=[0, 1, 3, 2])]
    return _model(nodes, {"x": x}, inits), {"x": x}


@pytest.mark.parametrize("axis", [1, 2, -1])
def test_softmax_inside_the_graph_has_an_int8_output(axis):
    model, feeds = _attention_scores([helper.make_node("Identity", ["x"], ["z"])], [], axis)
    _, qgraph = _check(model, feeds)
    node = next(n for n in qgraph.nodes if n.op == "QSoftmax")
    assert qgraph.tensors[node.outputs[0]].dtype == "int8"


def test_a_softmax_output_that_is_also_read_is_int8_and_dequantized_for_the_output(tmp_path, monkeypatch):
    """A Softmax whose probabilities are a graph output and feed the P.V product (a user tapping them): int8 for
    the product, dequantized for the output (this crashed with a bare KeyError); both close to onnxruntime."""
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 16)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("Relu", ["x"], ["r"]), helper.make_node("MatMul", ["p", "r"], ["y"])]
    model = _model(nodes, {"x": x}, [("w", (rng.standard_normal((16, 8)) * 0.5).astype(np.float32))])
    model.graph.output.append(helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, None))
    path = tmp_path / "tap.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2,
                             calibration=CalibrationSet({"x": np.concatenate([x, x])}, {"source": "test"}))
    got = run(compiled, {"x": x}, target="fsim").outputs
    want = dict(zip(["y", "p"], ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})))
    for name in ("y", "p"):
        cosine = float((got[name] * want[name]).sum() / np.linalg.norm(got[name]) / np.linalg.norm(want[name]))
        assert got[name].shape == want[name].shape and cosine > 0.999, (name, cosine)


def test_additive_mask_is_applied_in_float():
    mask = np.where(np.tril(np.ones((6, 6))) > 0, 0.0, -10000.0).astype(np.float32).reshape(1, 1, 6, 6)
    model, feeds = _attention_scores([helper.make_node("Add", ["x", "mask"], ["z"])], [("mask", mask)])
    _, qgraph = _check(model, feeds)
    node = next(n for n in qgraph.nodes if n.op == "QSoftmax")
    assert "bias" in node.attrs and "Add" not in _ops(qgraph)
    out = qops.run_reference(qgraph, feeds, keep_all=True)[node.outputs[0]]
    assert (out[0, 0][mask[0, 0] < 0] == 0).all()


def test_causal_where_mask():
    keep = np.tril(np.ones((1, 1, 6, 6), bool))
    model, feeds = _attention_scores([helper.make_node("Where", ["keep", "x", "fill"], ["z"])],
                                     [("keep", keep), ("fill", np.array(-np.inf, np.float32))])
    graph, qgraph = _check(model, feeds)
    assert "Where" in _ops(graph) and "Where" not in _ops(qgraph)


def test_where_refusals():
    """A constant array of two values where the condition drops the activation is refused; of one value there it is
    that fill (tests/test_window_attention_forms.py)."""
    x = _x(1, 4)
    model = _model([helper.make_node("Where", ["keep", "x", "fill"], ["y"])], {"x": x},
                   [("keep", np.array([True, False, True, False])), ("fill", np.arange(4, dtype=np.float32))])
    with pytest.raises(UnsupportedOperatorError, match=r"a constant of shape \(4,\) \(only a scalar, or one value"):
        import_onnx(model)


@pytest.mark.parametrize("order, cond_shape", [("x first", (1, 4)), ("fill first", (1, 4)), ("x first", (3, 1, 4))])
def test_where_of_an_all_true_condition_is_the_activation_and_never_its_nan_fill(order, cond_shape):
    """jax's ``jnp.var`` writes ``Where(n - ddof > 0, var, NaN)``, a constant condition that keeps the activation
    everywhere: the Where is the activation (broadcast where the condition widens it), the NaN never imported."""
    x = _x(2, 4)
    keep = np.ones(cond_shape, bool) if order == "x first" else np.zeros(cond_shape, bool)
    fill = np.full((2, 4), np.nan, np.float32)
    branches = ["r", "fill"] if order == "x first" else ["fill", "r"]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Where", ["keep", *branches], ["w"]),
             helper.make_node("Mul", ["w", "two"], ["y"])]
    graph, qgraph = _check(_model(nodes, {"x": x}, [("keep", keep), ("fill", fill),
                                                    ("two", np.array(2.0, np.float32))]), {"x": x})
    assert "Where" not in _ops(graph) and graph.shape("y") == (*cond_shape[:-2], 2, 4)
    assert not any(isinstance(v, float) and np.isnan(v) for n in qgraph.nodes for v in n.attrs.values())


def test_where_refuses_a_nan_fill_it_selects():
    x = _x(1, 4)
    model = _model([helper.make_node("Where", ["keep", "x", "fill"], ["y"], name="var_guard")], {"x": x},
                   [("keep", np.array([True, False, True, False])), ("fill", np.array(np.nan, np.float32))])
    with pytest.raises(UnsupportedOperatorError, match=r"^ONNX operator 'Where' \(node 'var_guard'\) is not supported "
                                                       r"by the lab: its constant 'fill' is NaN at 2 of the 4 output "
                                                       r"elements its constant condition takes from it \(the lab "
                                                       r"computes finite values"):
        import_onnx(model)


def test_softmax_where_a_runtime_mask_fills_scores_and_probabilities():
    """``jax.nn.softmax(s, where=m)`` as jax2onnx writes it, ``Where(m, Softmax(Where(m, s, -inf)), 0)`` with ``m``
    a graph input: the second Where changes nothing the lab's masked softmax does not give (0 at masked keys, 0 for
    a row masked out whole, where onnxruntime's NaN is filled with 0), so it goes and the first is a runtime mask;
    against onnxruntime in float, bit-exact with the integer reference on the CPU path."""
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.kernels import cpu
    x = _x(2, 6, 16)
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Cast", ["m"], ["mb"], to=TensorProto.BOOL),
             helper.make_node("Unsqueeze", ["mb", "axis1"], ["keep"]),
             helper.make_node("Where", ["keep", "s", "minus_inf"], ["z"]),
             helper.make_node("Softmax", ["z"], ["p0"], axis=-1),
             helper.make_node("Where", ["keep", "p0", "zero"], ["p"], name="probs_fill"),
             helper.make_node("MatMul", ["p", "x"], ["y"])]
    model = _model(nodes, {"x": x}, [("wq", _x(16, 16, spread=0.3)), ("wk", _x(16, 16, spread=0.3)),
                                     ("axis1", np.array([1], np.int64)),
                                     ("minus_inf", np.array(-np.inf, np.float32)), ("zero", np.array(0.0, np.float32))])
    model.graph.input.append(helper.make_tensor_value_info("m", TensorProto.INT64, [2, 6]))
    graph = import_onnx(model)
    assert "Where" not in _ops(graph) and _ops(graph).count("KeyMask") == 1
    mask = np.ones((2, 6), np.int64)
    mask[0, 4:] = 0
    session = ort.InferenceSession(model.SerializeToString())
    for m in (mask, np.stack([mask[0], np.zeros(6, np.int64)])):      # the second: a batch row masked out whole
        feeds = {"x": x, "m": m}
        want = session.run(None, feeds)[0]
        np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=2e-5)
    feeds = {"x": x, "m": mask}
    qgraph = quantize(graph, feeds)
    got = cpu.run_cpu(qgraph, feeds)["y"]
    np.testing.assert_array_equal(got, qops.run_reference(qgraph, feeds)["y"])
    want = session.run(None, feeds)[0]
    assert float((got * want).sum() / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99


def test_masked_softmax_rows_sum_to_one():
    x = RNG.integers(-128, 128, (2, 5)).astype(np.int8)
    keep = np.array([True, True, False, True, False])
    p = qops.softmax(x, 0.05, -1, keep=keep, fill=-np.inf)
    assert np.allclose(p.sum(-1), 1.0) and (p[:, ~keep] == 0).all()


# ---- token and head axes --------------------------------------------------------------------------------------------
def test_split_slice_concat_over_heads():
    x = _x(1, 8, 12)
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=-1),
             helper.make_node("Slice", ["b", "starts", "ends", "axes", "steps"], ["s"]),
             helper.make_node("Concat", ["c", "s", "a"], ["y0"], axis=1),
             helper.make_node("Reshape", ["y0", "heads"], ["y1"]),
             helper.make_node("Transpose", ["y1"], ["y"], perm=[0, 2, 1, 3])]
    inits = [("sizes", np.array([4, 4, 4], np.int64)), ("starts", np.array([-1], np.int64)),
             ("ends", np.array([-100], np.int64)), ("axes", np.array([1], np.int64)),
             ("steps", np.array([-2], np.int64)),
             ("heads", np.array([0, 20, 2, 2], np.int64))]
    graph, _ = _check(_model(nodes, {"x": x}, inits), {"x": x})
    assert _ops(graph).count("Slice") == 4


def test_gather_a_token_and_refuse_computed_indices():
    x = _x(1, 8, 12)
    model = _model([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)], {"x": x}, [("i", np.array(-8))])
    graph, _ = _check(model, {"x": x})
    assert graph.shape("y") == (1, 12) and graph.nodes[0].attrs["indices"] == 0
    ids = _model([helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT64),
                  helper.make_node("Gather", ["table", "xi"], ["y"])], {"x": x}, [("table", _x(10, 4))])
    with pytest.raises(UnsupportedOperatorError, match="an embedding lookup of computed indices"):
        import_onnx(ids)


# ---- the zoo model, end to end ---------------------------------------------------------------------------------------
def test_bert_tiny_imports_every_pattern_and_matches_onnxruntime():
    model = zoo.build_model("bert_tiny")
    assert model.SerializeToString() == zoo.build_model("bert_tiny").SerializeToString()
    x = _x(1, 32, 64)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input": x})[0]
    graph = import_onnx(model)
    np.testing.assert_allclose(run_float(graph, {"input": x})["output"], want, atol=1e-4)
    ops = _ops(graph)
    assert ops.count("LayerNorm") == 5 and ops.count("Gelu") == 2 and ops.count("Conv2d") == 8
    assert ops.count("MatMul") == 4 and ops.count("Where") == 1 and ops.count("Gather") == 1


def test_bert_tiny_on_fsim_puts_the_linear_layers_on_the_accelerator(tmp_path, monkeypatch):
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    compiled = compile_model("bert_tiny", VTAConfig(), calib=2)
    accel = [s for s in compiled.steps if isinstance(s, AccelStep)]
    assert len(accel) == 12 and {s.node.op for s in accel} == {"QConv2d", "QMatMul"}   # 8 linear, 4 attention
    assert all(s.predicted_cycles > 0 for s in accel)
    graph = compiled.graph
    x = {"input": _x(1, 32, 64)}
    out = run(compiled, x, target="fsim")
    np.testing.assert_array_equal(out.outputs["output"], qops.run_reference(graph, x)["output"])
    assert sum(layer.where == "accel" for layer in out.layers) == 12
