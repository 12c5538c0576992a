"""ONNX Loop and Scan unrolled while the constants fold (compiler/frontend/loops.py); a Loop as tf2onnx writes Keras
3's recurrent layers: a trip count, a condition the body computes from a loop-carried counter, states and a scan
output; each case against onnxruntime, the quantized graph on the CPU path against the integer reference; the
refusals with their reasons. Also the two forms those files hold around the loop: ReverseSequence of the whole time
axis (the backward direction) and a Gemm whose C is computed (``h @ R + (x @ W + b)``)."""
from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.loops import LOOP_REASON, MAX_STEPS
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.kernels import cpu

STEPS, WIDTH = 6, 5


def _rnn_loop(trips: int | None = STEPS, stop_at: int = STEPS, first_cond: bool = True, scan: bool = True,
              trip_input: bool = False):
    """``x [STEPS, 1, WIDTH]`` through a Loop whose body computes ``h = tanh(x[t] @ W + h @ R + b)``, ``t`` a
    loop-carried counter, its condition ``t + 1 < stop_at`` (and the body's iteration number below the trip count,
    as tf2onnx writes both); outputs the last ``h`` (``y``) and the stacked ``h`` of every step (``seq``)."""
    rng = np.random.default_rng(3)
    w, r = (rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.5 for _ in range(2))
    b = rng.standard_normal(WIDTH).astype(np.float32) * 0.1
    body_nodes = [
        helper.make_node("Add", ["t_in", "one"], ["t_out"]),
        helper.make_node("Gather", ["x", "t_in"], ["xt"], axis=0),
        helper.make_node("Gemm", ["xt", "W", "b"], ["xw"]),
        helper.make_node("Gemm", ["h_in", "R", "xw"], ["pre"]),
        helper.make_node("Tanh", ["pre"], ["h_out"]),
        helper.make_node("Identity", ["h_out"], ["h_scan"]),
        helper.make_node("Less", ["t_out", "stop"], ["more"]),
        helper.make_node("Cast", ["i"], ["i32"], to=TensorProto.INT32),
        helper.make_node("Less", ["i32", "trip_minus_one"], ["within"]),
        helper.make_node("And", ["more", "within"], ["cond_out"]),
    ]
    outputs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
               helper.make_tensor_value_info("t_out", TensorProto.INT32, []),
               helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, WIDTH])]
    if scan:
        outputs.append(helper.make_tensor_value_info("h_scan", TensorProto.FLOAT, [1, WIDTH]))
    body = helper.make_graph(body_nodes, "body", [
        helper.make_tensor_value_info("i", TensorProto.INT64, []),
        helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        helper.make_tensor_value_info("t_in", TensorProto.INT32, []),
        helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, WIDTH])], outputs,
        [numpy_helper.from_array(np.array(1, np.int32), "one"),
         numpy_helper.from_array(np.array(stop_at, np.int32), "stop"),
         numpy_helper.from_array(np.array((trips or MAX_STEPS + 5) - 1, np.int32), "trip_minus_one")])
    loop_outputs = ["t_last", "y"] + (["seq"] if scan else [])
    trip_name = "trip_in" if trip_input else ("trip" if trips is not None else "")
    nodes = [helper.make_node("Loop", [trip_name, "cond0", "t0", "h0"], loop_outputs, name="rnn", body=body)]
    inits = [numpy_helper.from_array(np.array(first_cond), "cond0"),
             numpy_helper.from_array(np.array(0, np.int32), "t0"),
             numpy_helper.from_array(np.zeros((1, WIDTH), np.float32), "h0"), numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(r, "R"), numpy_helper.from_array(b, "b")]
    if trips is not None and not trip_input:
        inits.append(numpy_helper.from_array(np.array(trips, np.int64), "trip"))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [STEPS, 1, WIDTH])]
    if trip_input:
        inputs.append(helper.make_tensor_value_info("trip_in", TensorProto.INT64, []))
    graph_outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if scan:
        graph_outputs.append(helper.make_tensor_value_info("seq", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "loop", inputs, graph_outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _x():
    return {"x": np.random.default_rng(4).standard_normal((STEPS, 1, WIDTH)).astype(np.float32)}


@pytest.mark.parametrize("trips, stop_at", [(STEPS, STEPS), (STEPS, 3), (4, STEPS), (None, 5), (1, STEPS)])
def test_an_unrolled_loop_computes_what_onnxruntime_does(trips, stop_at):
    """The trip count reached, the condition turning false first, and no trip count at all (the condition alone):
    the last state and every step's state stacked equal onnxruntime's; the quantized graph on the CPU path equals the
    integer reference."""
    model, x = _rnn_loop(trips, stop_at), _x()
    want = dict(zip(["y", "seq"], ort.InferenceSession(model.SerializeToString()).run(None, x)))
    fg = import_onnx(model)
    assert "Loop" not in {n.op for n in fg.nodes}
    got = run_float(fg, x)
    for name in ("y", "seq"):
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5)
    qg = quantize(fg, x)
    for name in ("y", "seq"):
        np.testing.assert_array_equal(cpu.run_cpu(qg, x)[name], qops.run_reference(qg, x)[name])


def test_a_loop_that_runs_no_iteration_passes_its_states_through():
    """A first condition of false: the loop's states are its initial values (here added to the first step's input,
    so that the graph computes something)."""
    model, x = _rnn_loop(STEPS, STEPS, first_cond=False, scan=False), _x()
    model.graph.node.extend([helper.make_node("Gather", ["x", "zero"], ["x0"], axis=0),
                             helper.make_node("Add", ["y", "x0"], ["z"])])
    model.graph.initializer.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    np.testing.assert_allclose(run_float(import_onnx(model), x)["z"], want, atol=1e-6)


@pytest.mark.parametrize("change, reason", [
    ({"trip_input": True}, LOOP_REASON),
    ({"trips": MAX_STEPS + 1}, f"{MAX_STEPS + 1} iterations (at most {MAX_STEPS} are unrolled)"),
    ({"trips": None, "stop_at": MAX_STEPS + 10}, f"more than {MAX_STEPS} iterations"),
    ({"first_cond": False}, "scan outputs of a loop that runs no iteration"),
])
def test_what_the_unrolling_cannot_take_is_refused_with_the_reason(change, reason):
    with pytest.raises(UnsupportedOperatorError, match=r"'Loop' \(node 'rnn'\).*" + re.escape(reason)):
        import_onnx(_rnn_loop(**change))


def test_reverse_sequence_of_the_whole_time_axis_and_a_gemm_of_a_computed_c():
    """tf2onnx's backward direction reverses the sequence with ReverseSequence (every length the whole axis), and a
    step's ``h @ R + xw`` is a Gemm whose C is an activation (at the first step, ``h`` is the zero state: a constant
    product): both as onnxruntime computes them."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("ReverseSequence", ["x", "lens"], ["rev"], time_axis=0, batch_axis=1),
             helper.make_node("Reshape", ["rev", "flat"], ["rows"]),
             helper.make_node("Gemm", ["rows", "W"], ["xw"]),
             helper.make_node("Gemm", ["rows", "R", "xw"], ["mixed"], transB=1),
             helper.make_node("Gemm", ["h0", "R", "mixed"], ["y"])]
    inits = [numpy_helper.from_array(np.full(2, STEPS, np.int64), "lens"),
             numpy_helper.from_array(np.array([STEPS * 2, WIDTH], np.int64), "flat"),
             numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), "R"),
             numpy_helper.from_array(rng.standard_normal((STEPS * 2, WIDTH)).astype(np.float32), "h0")]
    graph = helper.make_graph(nodes, "rev", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [STEPS, 2, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = {"x": rng.standard_normal((STEPS, 2, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    np.testing.assert_allclose(run_float(import_onnx(model), x)["y"], want, atol=1e-4, rtol=1e-5)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array([STEPS, STEPS - 1], np.int64), "lens"))
    with pytest.raises(UnsupportedOperatorError, match=r"sequence_lens other than the whole time axis \(6\)"):
        import_onnx(model)


def test_sequences_of_known_tensors_through_a_loop_and_outside_one():
    """torch's export of a scripted loop: a SequenceEmpty carried through the Loop, a SequenceInsert in the body, a
    ConcatFromSequence with ``new_axis`` after it; and outside a loop SequenceConstruct, SequenceInsert at a position,
    SequenceErase, SequenceAt and SequenceLength: the sequence is followed as its tensors, as onnxruntime computes
    it."""
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["xt"], axis=1),
         helper.make_node("Add", ["xt", "h_in"], ["pre"]), helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("SequenceInsert", ["seq_in", "h_out"], ["seq_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [1, WIDTH]),
         helper.make_tensor_sequence_value_info("seq_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, WIDTH]),
         helper.make_tensor_sequence_value_info("seq_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
             helper.make_node("Loop", ["trip", "true", "h0", "empty"], ["h_last", "steps"], name="scripted", body=body),
             helper.make_node("ConcatFromSequence", ["steps"], ["stacked"], axis=1, new_axis=1),
             helper.make_node("SequenceConstruct", ["h_last", "h0", "h_last"], ["three"]),
             helper.make_node("SequenceInsert", ["three", "h_last", "zero"], ["four"]),
             helper.make_node("SequenceErase", ["four", "one"], ["again_three"]),
             helper.make_node("SequenceAt", ["again_three", "minus_one"], ["picked"]),
             helper.make_node("SequenceLength", ["again_three"], ["count"]),
             helper.make_node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["picked", "count_f"], ["y"])]
    inits = [numpy_helper.from_array(np.array(STEPS, np.int64), "trip"),
             numpy_helper.from_array(np.array(True), "true"),
             numpy_helper.from_array(np.full((1, WIDTH), 0.1, np.float32), "h0"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(-1, np.int64), "minus_one")]
    graph = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, STEPS, WIDTH])],
                              [helper.make_tensor_value_info("stacked", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = {"x": np.random.default_rng(8).standard_normal((1, STEPS, WIDTH)).astype(np.float32)}
    want = dict(zip(["stacked", "y"], ort.InferenceSession(model.SerializeToString()).run(None, x)))
    fg = import_onnx(model)
    assert not {n.op for n in fg.nodes} & {"Loop", "SequenceInsert", "ConcatFromSequence"}
    got = run_float(fg, x)
    for name in ("stacked", "y"):
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5)


def test_a_scan_is_unrolled_over_its_inputs_axes_and_directions():
    """A Scan of two states and two scan inputs (one along axis 1, one read from the end) with two scan outputs (one
    stacked on axis 1, one reversed): what onnxruntime computes; the quantized graph on the CPU path equals the
    integer reference."""
    rng = np.random.default_rng(9)
    w = rng.standard_normal((WIDTH, WIDTH)).astype(np.float32) * 0.4
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["hw"]), helper.make_node("Add", ["hw", "a_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]), helper.make_node("Add", ["s_in", "b_t"], ["s_out"]),
         helper.make_node("Mul", ["h_out", "b_t"], ["o1"]), helper.make_node("Identity", ["s_out"], ["o2"])], "body",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, WIDTH]) for n in ("h_in", "s_in", "a_t", "b_t")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, WIDTH]) for n in ("h_out", "s_out", "o1", "o2")],
        [numpy_helper.from_array(w, "W")])
    node = helper.make_node("Scan", ["h0", "s0", "a", "b"], ["h", "s", "y1", "y2"], name="scan", body=body,
                            num_scan_inputs=2, scan_input_axes=[1, 0], scan_input_directions=[0, 1],
                            scan_output_axes=[1, 0], scan_output_directions=[1, 0])
    graph = helper.make_graph([node, helper.make_node("Add", ["h", "s"], ["y"])], "scan",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, STEPS, WIDTH]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [STEPS, 1, WIDTH])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "y1", "y2")],
                              [numpy_helper.from_array(np.zeros((1, WIDTH), np.float32), "h0"),
                               numpy_helper.from_array(np.full((1, WIDTH), 0.5, np.float32), "s0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = {"a": rng.standard_normal((1, STEPS, WIDTH)).astype(np.float32),
         "b": rng.standard_normal((STEPS, 1, WIDTH)).astype(np.float32)}
    want = dict(zip(["y", "y1", "y2"], ort.InferenceSession(model.SerializeToString()).run(None, x)))
    fg = import_onnx(model)
    got = run_float(fg, x)
    for name in want:
        assert got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=1e-5)
    qg = quantize(fg, x)
    for name in want:
        np.testing.assert_array_equal(cpu.run_cpu(qg, x)[name], qops.run_reference(qg, x)[name])


def test_an_outer_constant_only_a_body_reads_survives_the_folds_before_the_unrolling():
    """The first fold walks the graph before shape inference, so it cannot unroll a Scan over a computed tensor yet
    (a later fold, after the shapes are inferred, does); it folds the outer Constant node that only the body reads.
    That constant must stay for the unrolled body (onnx's LinearAttention functions, expanded, read their axes so)."""
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["x_t", "axes"], ["col"]), helper.make_node("Squeeze", ["col", "axes"], ["b"]),
         helper.make_node("Add", ["s_in", "b"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [1, WIDTH]),
         helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [1, WIDTH]),
         helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [1, WIDTH])])
    nodes = [helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([-1], np.int64))),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]),
             helper.make_node("Scan", ["s0", "xt"], ["s", "ys"], name="scan", body=body, num_scan_inputs=1),
             helper.make_node("Add", ["ys", "ys"], ["y"])]
    graph = helper.make_graph(nodes, "outer",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, STEPS, WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.zeros((1, WIDTH), np.float32), "s0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    x = {"x": np.random.default_rng(10).standard_normal((1, STEPS, WIDTH)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    np.testing.assert_allclose(run_float(import_onnx(model), x)["y"], want, atol=1e-5, rtol=1e-5)
