"""Element-wise regions of one or two activations fused into one function (compiler/frontend/pointwise.py): which
regions fuse (one source and at least two nodes, or two sources; one-element constants; a node no rule takes), which
stay node by node or refused, the float import against onnxruntime, the table (256 or 256 x 256 entries) within the
int8 tolerance, and blocks with the fused function between linear layers bit-exact on fsim."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import onnx_model, onnx_op_run
from helpers import onnx_node as _n
from onnx import helper

from vta.compiler import qops
from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx
from vta.config import VTAConfig

RNG_SEED = 31                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _scalars(**values):
    return [(k, np.array(v, np.float32)) for k, v in values.items()]


def _xielu(x="x", y="y"):
    """Apertus's xIELU as torch's exporter writes it: where(x > 0, ap x^2 + b x, an (exp(min(x, eps)) - 1) - an x +
    b x), every parameter a constant of one value."""
    return [_n("Greater", [x, "zero"], "gt"), _n("Mul", ["ap", x], "m1"), _n("Mul", ["m1", x], "m2"),
            _n("Mul", ["beta", x], "bx"), _n("Add", ["m2", "bx"], "pos"), _n("Min", [x, "eps"], "mn"),
            _n("Exp", ["mn"], "ex"), _n("Sub", ["ex", "one"], "em1"), _n("Sub", ["em1", x], "d"),
            _n("Mul", ["d", "an"], "neg"), _n("Add", ["neg", "bx"], "negb"), _n("Where", ["gt", "pos", "negb"], y)]


XIELU_CONSTS = _scalars(zero=0.0, ap=0.8, beta=0.5, eps=-1e-6, one=1.0, an=0.8)


def _ops(graph):
    return [n.op for n in graph.nodes]


def test_xielu_is_one_function_matching_onnxruntime_and_its_table_within_the_int8_tolerance():
    x = _x(2, 8, 32, spread=2.0)
    graph, qgraph, got, want = onnx_op_run(onnx_model(_xielu(), {"x": x}, XIELU_CONSTS), {"x": x},
                                           atol=1e-5, rtol=1e-5)
    assert _ops(graph) == ["PointwiseFn"] and graph.nodes[0].name == "y_node"
    lut = next(n for n in qgraph.nodes if n.op == "QLut")
    assert lut.attrs["function"] == "PointwiseFn"
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert np.abs(got - want).max() <= 2 * s_out + 2.2 * s_in        # xIELU's slope is at most 2.1 here


@pytest.mark.parametrize("nodes, consts, steps", [
    # a hand-written Elu: where(x < 0, alpha * (exp(x) - 1), x)
    ([_n("Less", ["x", "zero"], "lt"), _n("Exp", ["x"], "e"), _n("Sub", ["e", "one"], "em"),
      _n("Mul", ["em", "alpha"], "el"), _n("Where", ["lt", "el", "x"], "y")], _scalars(zero=0, one=1, alpha=0.7), 3),
    # x * (x > 0) through a Cast: ReLU written as a mask
    ([_n("Greater", ["x", "zero"], "gt"), _n("Cast", ["gt"], "f", to=onnx.TensorProto.FLOAT),
      _n("Mul", ["x", "f"], "y")], _scalars(zero=0), 3),
    # log(1 + x^2) and a quotient of two computed values: x / (1 + |x|)
    ([_n("Mul", ["x", "x"], "sq"), _n("Add", ["sq", "one"], "a"), _n("Log", ["a"], "y")], _scalars(one=1), 3),
    ([_n("Abs", ["x"], "ab"), _n("Add", ["ab", "one"], "den"), _n("Div", ["x", "den"], "y")], _scalars(one=1), 3),
])
def test_regions_no_rule_takes_fuse_and_run_within_the_int8_tolerance(nodes, consts, steps):
    x = _x(2, 6, 16, spread=2.0)
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, consts), {"x": x}, atol=1e-5, rtol=1e-5)
    assert _ops(graph) == ["PointwiseFn"]
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert np.abs(got - want).max() <= steps * s_out + s_in


def test_regions_the_rules_take_node_by_node_compile_as_before():
    """No trigger (x * sigmoid(x) + 1, a Max with a constant): the importer's own rules, no PointwiseFn."""
    x = _x(1, 4, 16)
    nodes = [_n("Sigmoid", ["x"], "s"), _n("Mul", ["x", "s"], "m"), _n("Max", ["m", "lo"], "c"),
             _n("Add", ["c", "one"], "y")]
    graph = import_onnx(onnx_model(nodes, {"x": x}, _scalars(lo=-0.1, one=1.0)))
    assert "PointwiseFn" not in _ops(graph)


def test_a_tensor_read_outside_the_region_becomes_its_source():
    """h = x + 1 feeds the region and a linear layer: the region starts at h, the Add stays."""
    x = _x(1, 4, 16)
    nodes = [_n("Add", ["x", "one"], "h"), _n("Greater", ["h", "zero"], "gt"), _n("Mul", ["h", "slope"], "hs"),
             _n("Where", ["gt", "h", "hs"], "r"), _n("MatMul", ["h", "w"], "hw"), _n("MatMul", ["r", "w"], "rw"),
             _n("Sub", ["rw", "hw"], "y")]
    graph, *_ = onnx_op_run(onnx_model(nodes, {"x": x}, [*_scalars(one=1, zero=0, slope=0.1), ("w", _x(16, 16))]),
                            {"x": x}, atol=1e-4, rtol=1e-4)
    fn = next(n for n in graph.nodes if n.op == "PointwiseFn")
    assert fn.inputs == ["h"] and fn.outputs == ["r"]
    assert _ops(graph).count("PointwiseFn") == 1 and any(n.op == "Add" and n.outputs == ["h"] for n in graph.nodes)


@pytest.mark.parametrize("nodes, consts, refused", [
    # three activations meet: the condition reads x, the values read z and v (a table of 2**24 entries)
    ([_n("Greater", ["x", "zero"], "gt"), _n("Where", ["gt", "z", "v"], "y")], _scalars(zero=0), "Greater"),
    # a constant of more than one value makes the function depend on the position
    ([_n("Greater", ["x", "c"], "gt"), _n("Where", ["gt", "x", "zero"], "y")],
     [("c", _x(16)), ("zero", np.array(0, np.float32))], "Greater"),
    # one node no rule takes stays refused (onnx's Log cases miss the int8 tolerance near 0)
    ([_n("Log", ["x"], "y")], [], "Log"),
])
def test_regions_that_are_not_one_function_of_one_activation_stay_refused(nodes, consts, refused):
    x = _x(1, 4, 16)
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError)) as err:
        import_onnx(onnx_model(nodes, {"x": x, "z": _x(1, 4, 16), "v": _x(1, 4, 16)}, consts))
    assert f"{refused} (node" in str(err.value) or f"'{refused}'" in str(err.value)


def test_a_pointwisefn_node_of_the_file_itself_is_refused():
    x = _x(1, 4, 16)
    with pytest.raises(UnsupportedOperatorError, match="PointwiseFn"):
        import_onnx(onnx_model([_n("PointwiseFn", ["x"], "y")], {"x": x}))


def test_xielu_between_two_linear_layers_on_fsim_is_bit_exact_with_the_reference(tmp_path, monkeypatch):
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    x = _x(1, 16, 32)
    nodes = [_n("MatMul", ["x", "w1"], "h"), *_xielu("h", "a"), _n("MatMul", ["a", "w2"], "y")]
    path = tmp_path / "xielu.onnx"
    onnx.save(onnx_model(nodes, {"x": x}, [("w1", _x(32, 64, spread=0.2)), ("w2", _x(64, 32, spread=0.2)),
                                          *XIELU_CONSTS]), str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel")
    assert sum(isinstance(s, AccelStep) and s.node.op == "QConv2d" for s in compiled.steps) == 2
    assert any(n.op == "QLut" and n.attrs["function"] == "PointwiseFn" for n in compiled.graph.nodes)
    out = run(compiled, {"x": x}, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, {"x": x})["y"])


# ---- regions of two activations: y = f(a, b), a 256 x 256 table ------------------------------------------------
@pytest.mark.parametrize("nodes, consts, steps", [
    # RWKV's and xLSTM's stabilizer: the larger of two activations (one node)
    ([_n("Max", ["a", "b"], "y")], [], 2),
    ([_n("Min", ["a", "b"], "y")], [], 2),
    # a quotient of two activations, the denominator kept away from 0
    ([_n("Abs", ["b"], "ab"), _n("Add", ["ab", "one"], "den"), _n("Div", ["a", "den"], "y")], _scalars(one=1), 3),
    # the condition reads a, the values read a and b
    ([_n("Greater", ["a", "zero"], "gt"), _n("Where", ["gt", "b", "a"], "y")], _scalars(zero=0), 2),
    # a power of two activations, the base kept positive: (1 + |a|) ** (b / 4)
    ([_n("Abs", ["a"], "aa"), _n("Add", ["aa", "one"], "base"), _n("Div", ["b", "four"], "e"),
      _n("Pow", ["base", "e"], "y")], _scalars(one=1, four=4), 3),
])
def test_regions_of_two_activations_fuse_into_one_pair_table_within_the_int8_tolerance(nodes, consts, steps):
    a, b = _x(2, 6, 16, spread=2.0), _x(2, 6, 16, spread=2.0)
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"a": a, "b": b}, consts), {"a": a, "b": b},
                                           atol=1e-5, rtol=1e-5)
    assert _ops(graph) == ["PointwiseFn"] and sorted(graph.nodes[0].inputs) == ["a", "b"]
    lut = next(n for n in qgraph.nodes if n.op == "QLut2")
    assert np.asarray(lut.attrs["table"]).shape == (256, 256)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = max(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert np.abs(got - want).max() <= steps * s_out + s_in


def test_a_pair_table_broadcasts_its_two_activations_as_onnx_does():
    """a [2, 6, 16] over b [2, 6, 1] (a per-token denominator): the output has a's shape, each row divided by its own
    value; the pair table's lookup broadcasts as numpy does."""
    a, b = _x(2, 6, 16, spread=2.0), _x(2, 6, 1, spread=2.0)
    nodes = [_n("Mul", ["b", "b"], "bb"), _n("Add", ["bb", "one"], "den"), _n("Div", ["a", "den"], "y")]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"a": a, "b": b}, _scalars(one=1)), {"a": a, "b": b},
                                           atol=1e-5, rtol=1e-5)
    assert _ops(graph) == ["PointwiseFn"] and got.shape == (2, 6, 16)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = max(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert np.abs(got - want).max() <= 3 * s_out + s_in
    table = np.arange(256 * 256).astype(np.int8).reshape(256, 256)
    qa = np.array([[-128, 0, 127]], np.int8)
    qb = np.array([[5], [-7]], np.int8)
    np.testing.assert_array_equal(qops.lut2(qa, qb, table), table[qa.astype(int) + 128, qb.astype(int) + 128])


def test_two_activations_the_rules_take_stay_node_by_node():
    """a + b, a * sigmoid(b) (no trigger): the importer's own rules, the Add on the accelerator, no pair table."""
    a, b = _x(1, 4, 16), _x(1, 4, 16)
    nodes = [_n("Sigmoid", ["b"], "s"), _n("Mul", ["a", "s"], "g"), _n("Add", ["g", "b"], "y")]
    graph = import_onnx(onnx_model(nodes, {"a": a, "b": b}))
    assert "PointwiseFn" not in _ops(graph)


def test_an_xlstm_style_stabilizer_between_linear_layers_on_fsim_is_bit_exact_with_the_reference(tmp_path,
                                                                                                 monkeypatch):
    """m = max(f + c, i), then exp(i - m) (xLSTM's input gate): the region reads two linear layers' outputs; on
    fsim the whole graph gives the integer reference's bits, and the pair table runs on the CPU."""
    from vta.compiler.pipeline import compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    x = _x(1, 16, 32)
    nodes = [_n("MatMul", ["x", "wf"], "f"), _n("MatMul", ["x", "wi"], "i"), _n("Add", ["f", "c"], "fc"),
             _n("Max", ["fc", "i"], "m"), _n("Sub", ["i", "m"], "d"), _n("Exp", ["d"], "g"),
             _n("MatMul", ["g", "wo"], "y")]
    path = tmp_path / "stabilizer.onnx"
    onnx.save(onnx_model(nodes, {"x": x}, [("wf", _x(32, 32, spread=0.2)), ("wi", _x(32, 32, spread=0.2)),
                                          ("wo", _x(32, 16, spread=0.2)), *_scalars(c=0.5)]), str(path))
    compiled = compile_model(str(path), VTAConfig(), calib=2, policy="accel")
    assert sum(isinstance(s, AccelStep) and s.node.op == "QConv2d" for s in compiled.steps) == 3
    lut = next(n for n in compiled.graph.nodes if n.op == "QLut2")
    assert len(lut.inputs) == 2
    out = run(compiled, {"x": x}, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, {"x": x})["y"])


@pytest.mark.parametrize("op, count, ops", [
    ("Max", 3, ["PointwiseFn", "PointwiseFn"]),        # max(max(a, b), c): two pair tables
    ("Min", 4, ["PointwiseFn"] * 3),
    ("Sum", 3, ["Add", "Add"]),
    ("Sum", 2, ["Add"]),                               # ONNX's Gelu function adds with a Sum of two
    ("Mean", 3, ["Add", "Add", "Mul"]),
])
def test_variadic_max_min_sum_and_mean_split_into_two_input_chains(op, count, ops):
    feeds = {f"x{k}": _x(2, 8) for k in range(count)}
    graph, qgraph, got, want = onnx_op_run(onnx_model([_n(op, list(feeds), "y")], feeds), feeds, atol=1e-5,
                                           rtol=1e-5)
    assert _ops(graph) == ops
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = max(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert np.abs(got - want).max() <= (count - 1) * (2 * s_out + s_in)


def test_onnx_layer_normalization_function_body_fuses_with_its_statistics():
    """(x - E[x]) / sqrt(E[x*x] - E[x]**2 + eps), E[x] and 1 / sqrt(.) also outputs (ONNX's LayerNormalization
    function body): one LayerNormalization with its Mean and InvStdDev outputs, within the int8 tolerance."""
    x = _x(2, 4, 8)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), _n("Mul", ["x", "x"], "sq"),
             helper.make_node("ReduceMean", ["sq"], ["msq"], axes=[-1]), _n("Mul", ["m", "m"], "m2"),
             _n("Sub", ["msq", "m2"], "var"), _n("Add", ["var", "eps"], "ve"), _n("Sqrt", ["ve"], "sd"),
             _n("Sub", ["x", "m"], "d"), _n("Div", ["d", "sd"], "y"), _n("Reciprocal", ["sd"], "inv")]
    model = onnx_model(nodes, {"x": x}, _scalars(eps=1e-5))
    model.graph.output.extend([helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None) for t in ("m", "inv")])
    graph = import_onnx(model)
    assert _ops(graph).count("LayerNorm") == 1 and [n.attrs["kind"] for n in graph.nodes if n.op == "Reduce"] == \
        ["mean", "inv_std"]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes[:-1], {"x": x}, _scalars(eps=1e-5)), {"x": x},
                                           atol=1e-4, rtol=1e-4)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert _ops(graph) == ["LayerNorm"] and np.abs(got - want).max() <= 2 * s_out + s_in


@pytest.mark.parametrize("floor, fused", [(0.0, True), (-1.0, True), (1e-3, False)])
def test_a_one_pass_variance_clamped_at_zero_fuses(floor, fused):
    """Flax's LayerNorm (``use_fast_variance``, as jax2onnx writes it) clamps the one-pass variance first,
    ``Max(E[x*x] - E[x]**2, 0)``, then scales and shifts: one LayerNormalization, within the int8 tolerance (it was
    refused as a variance whose two int8 means cancel). A floor above 0 changes the variance: no fusion into one
    LayerNormalization, the variance made two-pass (``E[(x - E[x])**2]``) and the clamp kept."""
    x = _x(2, 4, 8)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), _n("Sub", ["x", "m"], "d"),
             _n("Mul", ["x", "x"], "sq"), helper.make_node("ReduceMean", ["sq"], ["msq"], axes=[-1]),
             _n("Mul", ["m", "m"], "m2"), _n("Sub", ["msq", "m2"], "var"), _n("Max", ["var", "floor"], "vc"),
             _n("Add", ["vc", "eps"], "ve"), _n("Sqrt", ["ve"], "sd"), _n("Div", ["d", "sd"], "n"),
             _n("Mul", ["n", "gamma"], "g"), _n("Add", ["g", "beta"], "y")]
    consts = [*_scalars(eps=1e-5, floor=floor), ("gamma", _x(8, spread=0.5) + 1.0), ("beta", _x(8, spread=0.1))]
    model = onnx_model(nodes, {"x": x}, consts)
    graph, qgraph, got, want = onnx_op_run(model, {"x": x}, atol=1e-4, rtol=1e-4)
    if not fused:
        assert "LayerNorm" not in _ops(graph) and "Max" in {n.op_type for n in model.graph.node}
        assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.99
        return
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert _ops(graph).count("LayerNorm") == 1 and np.abs(got - want).max() <= 2 * s_out + s_in


@pytest.mark.parametrize("double", [True, False])
def test_jax2onnx_layer_norm_with_a_constant_row_guard_fuses(double):
    """Equinox's LayerNorm (Flax's with ``use_fast_variance=False``) as jax2onnx writes it: the centred values
    guarded where the row is constant, ``Where(And(Equal(ReduceMin(x), ReduceMax(x)), Equal(m - m, 0)), 0, x - m)``,
    and the squares averaged in float64 (``Cast -> ReduceMean -> Cast``): one LayerNormalization, within the int8
    tolerance. Equal and And were refused before ("no rule"), and the Where's condition was not a constant."""
    x = _x(2, 4, 8)
    mean_axes = helper.make_node("ReduceMean", ["sq"], ["vm"], axes=[-1])
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), _n("Sub", ["x", "m"], "d"),
             helper.make_node("ReduceMin", ["x"], ["lo"], axes=[-1]), helper.make_node("ReduceMax", ["x"], ["hi"],
                                                                                       axes=[-1]),
             _n("Equal", ["lo", "hi"], "flat"), _n("Sub", ["m", "m"], "delta"), _n("Equal", ["delta", "zero"], "fin"),
             _n("And", ["flat", "fin"], "const_row"), _n("Where", ["const_row", "zero", "d"], "dc"),
             _n("Mul", ["dc", "dc"], "sq0")]
    if double:
        nodes += [helper.make_node("Cast", ["sq0"], ["sq"], to=onnx.TensorProto.DOUBLE), mean_axes,
                  helper.make_node("Cast", ["vm"], ["var"], to=onnx.TensorProto.FLOAT)]
    else:
        nodes += [helper.make_node("ReduceMean", ["sq0"], ["var"], axes=[-1])]
    nodes += [_n("Add", ["var", "eps"], "ve"), _n("Sqrt", ["ve"], "sd"), _n("Div", ["dc", "sd"], "n"),
              _n("Mul", ["n", "gamma"], "g"), _n("Add", ["g", "beta"], "y")]
    consts = [*_scalars(eps=1e-5, zero=0.0), ("gamma", _x(8, spread=0.5) + 1.0), ("beta", _x(8, spread=0.1))]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, consts), {"x": x}, atol=1e-4, rtol=1e-4)
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    s_in = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    assert _ops(graph) == ["LayerNorm"] and np.abs(got - want).max() <= 2 * s_out + s_in


def test_flax_group_norm_in_one_pass_form_runs():
    """Flax's GroupNorm as jax2onnx writes it: NHWC ``[1, 4, 4, 8]`` reshaped to 2 groups ``[1, 4, 4, 2, 4]``, the
    variance ``Max(E[x*x] - E[x]**2, 0)`` over axes 1, 2 and 4, then a per-channel scale and shift. It was refused
    (the one-pass variance's two int8 means cancel); made two-pass, it runs within the int8 tolerance."""
    x = _x(1, 4, 4, 8)
    nodes = [_n("Reshape", ["x", "groups"], "xg"),
             helper.make_node("ReduceMean", ["xg"], ["m"], axes=[1, 2, 4]), _n("Sub", ["xg", "m"], "d"),
             _n("Mul", ["xg", "xg"], "sq"), helper.make_node("ReduceMean", ["sq"], ["msq"], axes=[1, 2, 4]),
             _n("Mul", ["m", "m"], "m2"), _n("Sub", ["msq", "m2"], "var"), _n("Max", ["var", "zero"], "vc"),
             _n("Add", ["vc", "eps"], "ve"), _n("Sqrt", ["ve"], "sd"), _n("Div", ["d", "sd"], "ng"),
             _n("Reshape", ["ng", "back"], "n"), _n("Mul", ["n", "gamma"], "g"), _n("Add", ["g", "beta"], "y")]
    consts = [*_scalars(eps=1e-5, zero=0.0), ("groups", np.array([1, 4, 4, 2, 4], np.int64)),
              ("back", np.array([1, 4, 4, 8], np.int64)), ("gamma", _x(8, spread=0.5) + 1.0),
              ("beta", _x(8, spread=0.1))]
    graph, _, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, consts), {"x": x}, atol=1e-4, rtol=1e-4)
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.995


def test_a_one_pass_variance_read_otherwise_is_made_two_pass():
    """E[x*x] - E[x]**2 that is no LayerNorm's (a gain times it): its two int8 means would cancel (it was refused,
    naming its Sub); it is made E[(x - E[x])**2], equal in exact arithmetic, and runs within the int8 tolerance."""
    x = _x(2, 4, 8)
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), _n("Mul", ["x", "x"], "sq"),
             helper.make_node("ReduceMean", ["sq"], ["msq"], axes=[-1]), _n("Mul", ["m", "m"], "m2"),
             _n("Sub", ["msq", "m2"], "var"), _n("Mul", ["x", "var"], "y")]
    graph, _, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, []), {"x": x}, atol=1e-4, rtol=1e-4)
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.995


def test_a_region_that_divides_by_zero_on_the_calibration_inputs_is_refused_naming_its_tensor():
    """x / relu(x) is infinite (or NaN) wherever x <= 0: no int8 scale represents it; the quantizer says where."""
    from vta.compiler.frontend.quantize import QuantizationError, quantize
    x = _x(1, 4, 16)
    graph = import_onnx(onnx_model([_n("Relu", ["x"], "r"), _n("Div", ["x", "r"], "y")], {"x": x}))
    with pytest.raises(QuantizationError, match=r"Tensor 'y' \(written by PointwiseFn .*non-finite"):
        quantize(graph, {"x": x})


def test_a_node_with_a_per_channel_constant_is_a_regions_source_not_part_of_it():
    """torch's dynamo export of ``softplus(x @ W + b)`` (Mamba's dt projection): ``h = Add(x @ W, b)`` with ``b``
    one value per channel, then ``Where(h > 20, h, Softplus(h))``. The Add depends on the position, so it stays
    itself (on the accelerator) and the region reads its output."""
    x = _x(1, 4, 16)
    nodes = [_n("MatMul", ["x", "w"], "xw"), _n("Add", ["xw", "b"], "h"), _n("Greater", ["h", "th"], "big"),
             _n("Softplus", ["h"], "sp"), _n("Where", ["big", "h", "sp"], "y")]
    inits = [("w", _x(16, 8, spread=0.3)), ("b", _x(8, spread=0.5)), *_scalars(th=20.0)]
    graph, qgraph, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, inits), {"x": x}, atol=1e-4, rtol=1e-4)
    fn = next(n for n in graph.nodes if n.op == "PointwiseFn")
    assert len(fn.inputs) == 1 and graph.producer(fn.inputs[0]).op != "PointwiseFn"
    s_out = next(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= 3 * s_out
