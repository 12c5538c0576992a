"""Element-wise regions of one activation fused into one function (compiler/frontend/pointwise.py): which regions
fuse (one source, one-element constants, a node no rule takes, at least two nodes), which stay node by node or
refused, the float import against onnxruntime, the table within the int8 tolerance, and a block with the fused
activation between two linear layers bit-exact on fsim."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper

from vta.compiler import qops
from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx
from vta.config import VTAConfig

RNG_SEED = 31                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape, spread=1.0):
    return (RNG.standard_normal(shape) * spread).astype(np.float32)


def _n(op, inputs, output, **attrs):
    return helper.make_node(op, list(inputs), [output], name=f"{output}_node", **attrs)


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
    """h = x + 1 feeds the region and a product with another input z: the region starts at h, the Add stays."""
    x, z = _x(1, 4, 16), _x(1, 4, 16)
    nodes = [_n("Add", ["x", "one"], "h"), _n("Greater", ["h", "zero"], "gt"), _n("Mul", ["h", "slope"], "hs"),
             _n("Where", ["gt", "h", "hs"], "r"), _n("Mul", ["h", "z"], "hz"), _n("Add", ["r", "hz"], "y")]
    graph, *_ = onnx_op_run(onnx_model(nodes, {"x": x, "z": z}, _scalars(one=1, zero=0, slope=0.1)),
                            {"x": x, "z": z}, atol=1e-5, rtol=1e-5)
    fn = next(n for n in graph.nodes if n.op == "PointwiseFn")
    assert fn.inputs == ["h"] and fn.outputs == ["r"]
    assert _ops(graph).count("PointwiseFn") == 1 and _ops(graph).count("Add") == 2


@pytest.mark.parametrize("nodes, consts, refused", [
    # two activations meet: the condition reads x, the values read z
    ([_n("Greater", ["x", "zero"], "gt"), _n("Where", ["gt", "z", "x"], "y")], _scalars(zero=0), "Greater"),
    # a constant of more than one value makes the function depend on the position
    ([_n("Greater", ["x", "c"], "gt"), _n("Where", ["gt", "x", "zero"], "y")],
     [("c", _x(16)), ("zero", np.array(0, np.float32))], "Greater"),
    # one node no rule takes stays refused (onnx's Log cases miss the int8 tolerance near 0)
    ([_n("Log", ["x"], "y")], [], "Log"),
])
def test_regions_that_are_not_one_function_of_one_activation_stay_refused(nodes, consts, refused):
    x = _x(1, 4, 16)
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError)) as err:
        import_onnx(onnx_model(nodes, {"x": x, "z": _x(1, 4, 16)}, consts))
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
