"""LSTM, GRU and RNN unrolled over their steps (compiler/frontend/recurrent.py): against onnxruntime over random
directions, sizes, initial states, biases, peepholes, clip, input_forget and linear_before_reset; batch-first layout
against ONNX's reference evaluator (onnxruntime refuses it); a keyword-spotting-style model on fsim bit-exact with
the integer reference, its projections on the accelerator; the refusals with their reasons."""
from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from vta.compiler import qops
from vta.compiler.frontend.contrib import static_shapes
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.compiler.frontend.recurrent import rewrite_recurrent
from vta.config import VTAConfig

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


ACTIVATIONS = ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus")


def _random_cell(rng, layout=0, extras=True, activations=False):
    """A random recurrent node's model and feeds: kind, direction, sizes, optional bias, initial states, peepholes,
    clip, input_forget, linear_before_reset; with ``activations``, each direction's ``f``, ``g``, ``h`` drawn from
    :data:`ACTIVATIONS`."""
    kind = str(rng.choice(list(GATES)))
    gates = GATES[kind]
    direction = str(rng.choice(["forward", "reverse", "bidirectional"]))
    dirs = 2 if direction == "bidirectional" else 1
    seq, batch, size, hidden = (int(v) for v in rng.integers(1, 5, 4))
    attrs = {"hidden_size": hidden, "direction": direction, "layout": layout}
    if activations:
        per = {"LSTM": 3, "GRU": 2, "RNN": 1}[kind]
        attrs["activations"] = [str(a) for a in rng.choice(ACTIVATIONS, per * dirs)]
    inits = [numpy_helper.from_array((rng.standard_normal((dirs, gates * hidden, size)) * 0.7).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((dirs, gates * hidden, hidden)) * 0.7).astype(np.float32),
                                     "R")]
    names = ["X", "W", "R", "", ""]
    if rng.random() < 0.7:
        inits.append(numpy_helper.from_array((rng.standard_normal((dirs, 2 * gates * hidden)) * 0.3)
                                             .astype(np.float32), "B"))
        names[3] = "B"
    x_shape = [batch, seq, size] if layout else [seq, batch, size]
    state = [batch, dirs, hidden] if layout else [dirs, batch, hidden]
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    feeds = {"X": rng.standard_normal(x_shape).astype(np.float32)}
    for name in (["h0", "c0"] if kind == "LSTM" else ["h0"]):
        if rng.random() < 0.5:
            names.append(name)
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state))
            feeds[name] = rng.standard_normal(state).astype(np.float32)
        else:
            names.append("")
    if extras:
        if kind == "LSTM" and rng.random() < 0.4:
            names += [""] * (7 - len(names)) + ["P"]
            inits.append(numpy_helper.from_array(rng.standard_normal((dirs, 3 * hidden)).astype(np.float32), "P"))
        if kind == "LSTM" and rng.random() < 0.2:
            attrs["input_forget"] = 1
        if kind == "GRU" and rng.random() < 0.5:
            attrs["linear_before_reset"] = 1
        if rng.random() < 0.2:
            attrs["clip"] = float(rng.uniform(0.5, 2.0))
    while names[-1] == "":
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if kind == "LSTM" else [])
    graph = helper.make_graph([helper.make_node(kind, names, outputs, name="rnn", **attrs)], "rnn", graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model, feeds


def _unrolled(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    assert rewrite_recurrent(inferred, static_shapes(inferred)) == {}
    assert not {"LSTM", "GRU", "RNN"} & {n.op_type for n in inferred.graph.node}
    return inferred


def test_the_unrolled_cells_compute_what_onnxruntime_does():
    rng = np.random.default_rng(21)
    for _ in range(80):
        model, feeds = _random_cell(rng)
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        got = ort.InferenceSession(_unrolled(model).SerializeToString()).run(None, feeds)
        for w, g in zip(want, got):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_cells_of_other_activations_compute_what_onnxruntime_does():
    """Activations other than the defaults (DeepSpeech's RNN of Relu), per direction, against onnxruntime."""
    rng = np.random.default_rng(23)
    for _ in range(40):
        model, feeds = _random_cell(rng, activations=True)
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        got = ort.InferenceSession(_unrolled(model).SerializeToString()).run(None, feeds)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_batch_first_layout_computes_what_the_onnx_reference_does():
    """onnxruntime refuses ``layout=1``; ONNX's reference evaluator runs it (without clip and input_forget, which
    it does not implement)."""
    rng = np.random.default_rng(22)
    for _ in range(30):
        model, feeds = _random_cell(rng, layout=1, extras=False)
        want = ReferenceEvaluator(model).run(None, feeds)
        got = ReferenceEvaluator(_unrolled(model)).run(None, feeds)
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_a_keyword_spotting_model_runs_on_fsim_bit_exact_with_its_projections_on_the_accelerator(tmp_path):
    """Features [T, 1, 16] -> LSTM(32) -> GRU(24, bidirectional) -> the last state's classifier: the float import
    against onnxruntime; the compiled model equal to the integer reference on fsim and close to onnxruntime."""
    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.pipeline import CalibrationSet, compile_model
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    rng = np.random.default_rng(5)

    def w(*shape, spread=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * spread).astype(np.float32))

    inits = [w(1, 128, 16), w(1, 128, 32), w(1, 256, spread=0.1), w(2, 72, 32), w(2, 72, 24), w(2, 144, spread=0.1),
             w(48, 6)]
    for init, name in zip(inits, ["W1", "R1", "B1", "W2", "R2", "B2", "fc"]):
        init.name = name
    nodes = [helper.make_node("LSTM", ["x", "W1", "R1", "B1"], ["y1"], hidden_size=32),
             helper.make_node("Squeeze", ["y1", "one"], ["s1"]),
             helper.make_node("GRU", ["s1", "W2", "R2", "B2"], ["", "h2"], hidden_size=24,
                              direction="bidirectional", linear_before_reset=1),
             helper.make_node("Transpose", ["h2"], ["t2"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t2", "flat"], ["f2"]),
             helper.make_node("MatMul", ["f2", "fc"], ["y"])]
    inits += [numpy_helper.from_array(np.array([1], np.int64), "one"),
              numpy_helper.from_array(np.array([1, 48], np.int64), "flat")]
    graph = helper.make_graph(nodes, "kws", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [12, 1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((12, 1, 16)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(import_onnx(model), feeds)["y"], want, atol=1e-4, rtol=1e-4)
    path = tmp_path / "kws.onnx"
    onnx.save(model, str(path))
    compiled = compile_model(str(path), VTAConfig(), policy="accel",
                             calibration=CalibrationSet(feeds, {"source": "test"}))
    got = run(compiled, feeds, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, feeds)["y"])
    assert float(np.ravel(got) @ np.ravel(want) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.95
    assert sum(isinstance(s, AccelStep) for s in compiled.steps) >= 12


@pytest.mark.parametrize("change, reason", [
    ({"activations": ["HardSigmoid", "Tanh", "Tanh"]}, "activations ['HardSigmoid', 'Tanh', 'Tanh'] (per direction 3 "
                                                       "of Relu, Sigmoid, Softplus, Softsign, Tanh"),
    ({"lens": np.array([2], np.int32)}, "a sequence_lens shorter than the input's sequence"),
    ({"runtime_w": True}, "its W input 'W' is computed at run time"),
    ({"steps": 1025}, "a sequence of 1025 steps over its directions (the lab unrolls at most 1024)"),
])
def test_what_the_unrolling_cannot_take_is_refused_with_the_reason(change, reason):
    attrs = {"hidden_size": 4, **({"activations": change["activations"]} if "activations" in change else {})}
    inputs = ["X", "W", "R", "", "lens" if "lens" in change else ""]
    inits = [numpy_helper.from_array(np.ones((1, 16, 4), np.float32), "R")]
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [change.get("steps", 3), 1, 2])]
    if change.get("runtime_w"):
        graph_inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [1, 16, 2]))
    else:
        inits.append(numpy_helper.from_array(np.ones((1, 16, 2), np.float32), "W"))
    if "lens" in change:
        inits.append(numpy_helper.from_array(change["lens"], "lens"))
    while inputs[-1] == "":
        inputs.pop()
    graph = helper.make_graph([helper.make_node("LSTM", inputs, ["Y"], name="rnn", **attrs)], "rnn", graph_inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    with pytest.raises((UnsupportedOperatorError, ValueError), match=re.escape(reason)):
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]))
