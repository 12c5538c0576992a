"""Scatters with constant indices as moves of values (compiler/frontend/scatter.py): MiniCPM3's slice assignment
into a constant, a ScatterND of rows, ScatterElements with negative indices, each against onnxruntime in float and
the integer reference on the CPU path; the sources against ONNX's reference implementation; what stays refused."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import helper
from onnx.reference import ReferenceEvaluator

from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, import_onnx
from vta.compiler.frontend.scatter import scatter_sources

RNG_SEED = 41                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _slice_indices(shape, lo, hi):
    """ScatterND indices writing ``[..., lo:hi]`` of a tensor of ``shape`` (as torch writes ``q[..., lo:hi] = u``)."""
    grid = np.indices(tuple(shape[:-1]) + (hi - lo,))
    grid[-1] += lo
    return np.moveaxis(grid, 0, -1).astype(np.int64)


def test_a_slice_assignment_into_a_constant_is_a_move_matching_onnxruntime():
    """MiniCPM3: ``q = zeros; q[..., :4] = a; q[..., 4:] = b`` (two ScatterNDs), then a product."""
    shape = (2, 3, 8)
    a, b = _x(2, 3, 4), _x(2, 3, 4)
    nodes = [helper.make_node("ScatterND", ["zeros", "lo", "a"], ["q1"]),
             helper.make_node("ScatterND", ["q1", "hi", "b"], ["q"]),
             helper.make_node("Mul", ["q", "q"], ["y"])]
    inits = [("zeros", np.zeros(shape, np.float32)), ("lo", _slice_indices(shape, 0, 4)),
             ("hi", _slice_indices(shape, 4, 8))]
    graph, _, got, want = onnx_op_run(onnx_model(nodes, {"a": a, "b": b}, inits), {"a": a, "b": b},
                                      atol=1e-6, rtol=1e-6)
    ops = [n.op for n in graph.nodes]
    assert "ScatterND" not in ops and ops.count("Gather") == 2
    assert np.abs(got - want).max() <= 3 * np.abs(want).max() / 127


@pytest.mark.parametrize("op, indices, updates_shape, attrs", [
    ("ScatterND", np.array([[1], [3]], np.int64), (2, 5), {}),                     # two rows
    ("ScatterND", np.array([[0, -1], [2, 0]], np.int64), (2,), {}),               # two elements, one negative
    ("ScatterElements", np.array([[1, 0, -1]] * 4, np.int64), (4, 3), {"axis": 1}),
    ("ScatterElements", np.array([[3, 1, 0, 2, 0]], np.int64), (1, 5), {"axis": 0}),
])
def test_scatters_of_constant_indices_import_as_moves(op, indices, updates_shape, attrs):
    x, u = _x(4, 5), _x(*updates_shape)
    nodes = [helper.make_node(op, ["x", "idx", "u"], ["s"], **attrs), helper.make_node("Relu", ["s"], ["y"])]
    graph, *_ = onnx_op_run(onnx_model(nodes, {"x": x, "u": u}, [("idx", indices)]), {"x": x, "u": u},
                            atol=1e-6, rtol=1e-6)
    assert op not in [n.op for n in graph.nodes]


def test_a_scatter_of_rows_a_constant_mask_selects_none_is_its_data():
    """X-MOD's adapter of a language the input is not in (torch's export of ``x[mask] = adapter(x[mask])``): NonZero
    of a constant mask that selects no row, a GatherND of no row, a MatMul over it and a ScatterND of no update. The
    scatter is its data, and the branch of empty tensors is dropped unread (it was refused: the lab computes no
    empty tensor)."""
    x = _x(1, 6, 8)
    nodes = [helper.make_node("NonZero", ["sel"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx"], ["rows"]),
             helper.make_node("MatMul", ["rows", "w"], ["upd"]),
             helper.make_node("ScatterND", ["x", "idx", "upd"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["y"])]
    inits = [("sel", np.zeros((1, 6), bool)), ("w", _x(8, 8))]
    graph, *_ = onnx_op_run(onnx_model(nodes, {"x": x}, inits), {"x": x}, atol=1e-5, rtol=1e-5)
    ops = [n.op for n in graph.nodes]
    assert "ScatterND" not in ops and "GatherND" not in ops and ops.count("Conv2d") == 1, ops   # one product


@pytest.mark.parametrize("op, data_shape, indices, updates_shape, axis", [
    ("ScatterND", (3, 4, 2), np.array([[[0, 1], [2, 3]]], np.int64), (1, 2, 2), 0),
    ("ScatterND", (3, 4), np.array([[1], [1]], np.int64), (2, 4), 0),           # a row written twice: the later
    ("ScatterElements", (3, 4), np.array([[0, 2], [1, 1]], np.int64), (2, 2), 0),
])
def test_the_sources_move_what_onnx_reference_implementation_writes(op, data_shape, indices, updates_shape, axis):
    data, updates = _x(*data_shape), _x(*updates_shape)
    attrs = {"axis": axis} if op == "ScatterElements" else {}
    want = ReferenceEvaluator(helper.make_node(op, ["d", "i", "u"], ["o"], **attrs)).run(
        None, {"d": data, "i": indices, "u": updates})[0]
    sources = scatter_sources(op, data_shape, indices, updates_shape, axis)
    assert sources is not None
    np.testing.assert_array_equal(np.concatenate([data.ravel(), updates.ravel()])[sources].reshape(data_shape), want)


@pytest.mark.parametrize("nodes, inits", [
    ([helper.make_node("ScatterND", ["x", "idx", "u"], ["y"])], [("idx", np.array([[7]], np.int64))]),  # outside x
    ([helper.make_node("ScatterND", ["x", "idx", "u"], ["y"], reduction="add")], [("idx", np.array([[1]], np.int64))]),
])
def test_scatters_that_are_no_move_stay_refused_by_name(nodes, inits):
    """Refused naming the node and what it lacks (it said only "not supported"): an index outside the data, or a
    reduction."""
    x, u = _x(4, 5), _x(1, 5)
    with pytest.raises((UnsupportedModelError, UnsupportedOperatorError),
                       match=r"ScatterND.*(do not fit its data of shape \[4, 5\]|reduction='add')"):
        import_onnx(onnx_model(nodes, {"x": x, "u": u}, inits, opset=18))


@pytest.mark.parametrize("permuted", [False, True])
def test_a_chain_of_in_place_assignments_reads_its_leaves(permuted):
    """MONAI's warp normalizes a voxel grid one channel at a time, ``g[..., k] = g[..., k] * 2 / (n - 1) - 1``: three
    ScatterNDs (torch's dynamo export puts Transposes between them). Each scatter's tensor mixes normalized channels
    (range 1) and raw ones (range 15), so one int8 scale rounded the normalized ones at a 15th of their range; the
    moves now read the leaves (the raw grid and each update): against onnxruntime in float, and after quantization
    the grid within a few of its own int8 steps."""
    from onnx import numpy_helper
    n = 16
    nodes, inits = [], [numpy_helper.from_array(np.array(2.0 / (n - 1), np.float32), "two"),
                        numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    current = "g"
    for k in range(3):
        if permuted:          # the channel axis first and back, as the dynamo export's permutes
            nodes += [helper.make_node("Transpose", [current], [f"t{k}"], perm=[4, 1, 2, 3, 0]),
                      helper.make_node("Transpose", [f"t{k}"], [f"b{k}"], perm=[4, 1, 2, 3, 0])]
            current = f"b{k}"
        inits.append(numpy_helper.from_array(np.array([k], np.int64), f"k{k}"))
        inits.append(numpy_helper.from_array(_slice_indices((1, n, n, n, 3), k, k + 1), f"i{k}"))
        nodes += [helper.make_node("Gather", [current, f"k{k}"], [f"c{k}"], axis=4),
                  helper.make_node("Mul", [f"c{k}", "two"], [f"m{k}"]),
                  helper.make_node("Sub", [f"m{k}", "one"], [f"u{k}"]),
                  helper.make_node("ScatterND", [current, f"i{k}", f"u{k}"], [f"s{k}"])]
        current = f"s{k}"
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    x = np.random.default_rng(3).uniform(0, n - 1, (1, n, n, n, 3)).astype(np.float32)
    model = onnx_model(nodes, {"g": x}, [(i.name, numpy_helper.to_array(i)) for i in inits], opset=17)
    graph, qgraph, got, want = onnx_op_run(model, {"g": x}, atol=1e-5, rtol=1e-5)
    assert np.abs(want).max() <= 1.0 + 1e-6
    step = max(n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize")
    assert np.abs(got - want).max() <= 2.5 * step and step < 1.1 / 127 + 1e-9    # it was 8 steps


def test_a_rewrite_never_takes_a_name_the_file_uses():
    """A ScatterND node ``s`` beside a Gather whose indices the file named ``s_sources``, the name the rewrite gave
    its own constant: the file's tensor was replaced, and the run still said it matched the integer reference
    (cosine 0.37 against onnxruntime). The rewrite's names are now ones the file does not use."""
    x = _x(4, 5)
    nodes = [helper.make_node("ScatterND", ["x", "idx", "u"], ["t"], name="s"),
             helper.make_node("Gather", ["t", "s_sources"], ["y"], axis=1)]
    inits = [("idx", np.array([[1], [3]], np.int64)), ("u", _x(2, 5)), ("s_sources", np.array([4, 0, 2], np.int64))]
    onnx_op_run(onnx_model(nodes, {"x": x}, inits), {"x": x}, atol=1e-5, rtol=1e-5)
