"""Post-training quantization (compiler/frontend/quantize.py): requant choice, fusion, overflow safety, accuracy vs
float."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend import zoo
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import (
    accuracy_vs_float,
    calibrate,
    choose_requant,
    compare_outputs,
    float_outputs,
    output_scale,
    prepare,
    quantize,
)
from vta.compiler.ir import Graph, GraphError


def _inputs(g: Graph, n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n,) + g.shape("input")[1:]).astype(np.float32)


def test_choose_requant_exact():
    m, s = choose_requant(np.array([0.001, 0.001, 1e-12, 3.0]), np.array([1000, 1_000_000, 10, 10]))
    assert m.tolist() == [16777, 2097, 1, 24576] and s.tolist() == [24, 21, 31, 13]
    # a bound so large that even S = 0 cannot keep M = round(m) inside int32: the multiplier is clamped
    m, s = choose_requant(np.array([5.0]), np.array([2**30]))
    assert m.tolist() == [1] and s.tolist() == [0]


def test_compare_outputs_exact():
    ref = np.array([[1.0, 2.0], [3.0, 0.0]])
    got = np.array([[1.0, 2.5], [1.0, 2.0]])
    r = compare_outputs(ref, got)
    assert r["top1_agreement"] == 0.5 and r["max_abs_error"] == 2.0
    assert r["snr_db"] == pytest.approx(10 * np.log10(14 / 8.25))


def _quantized(name: str, **kw):
    g = import_onnx(zoo.build_model(name))
    return g, quantize(g, {"input": _inputs(g, 16, 1)}, **kw)


def _check_contract(q: Graph, calib: np.ndarray) -> None:
    """Every accelerator op satisfies the contract and never overflows int32 on the calibration data."""
    for i in range(calib.shape[0]):
        values = qops.run_reference(q, {"input": calib[i:i + 1]}, keep_all=True)
        for node in q.nodes:
            if node.op not in ("QConv2d", "QDense"):
                continue
            assert q.tensors[node.outputs[0]].dtype == "int8"
            assert q.constants[node.inputs[1]].dtype == np.int8 and q.constants[node.inputs[2]].dtype == np.int32
            x, w, b = (values.get(t, q.constants.get(t)) for t in node.inputs)
            if node.op == "QConv2d":
                acc = qops.conv2d_acc(x, w, b, node.attrs["strides"], node.attrs["pads"], node.attrs["groups"])
                peak = np.abs(acc.astype(np.int64)).max(axis=(0, 2, 3))
            else:
                peak = np.abs(qops.dense_acc(x, w, b).astype(np.int64)).max(axis=0)
            assert (peak * node.attrs["requant"].multiplier < 2**31).all(), node.name


@pytest.mark.parametrize("mode,per_channel,pct", [("multiply", True, None), ("multiply", False, None),
                                                  ("shift", True, None), ("multiply", "auto", 99.9)])
def test_mini_resnet_accuracy_and_contract(mode, per_channel, pct):
    g, q = _quantized("mini_resnet", mode=mode, per_channel=per_channel, percentile=pct)
    ops = [n.op for n in q.nodes]
    assert ops == ["Quantize", "QConv2d", "QConv2d", "QConv2d", "QAdd", "QConv2d", "QConv2d", "MaxPool", "Pad",
                   "AvgPool", "QConv2d", "QConcat", "QMul", "GlobalAvgPool", "Reshape", "QDense", "Softmax"]
    convs = [n for n in q.nodes if n.op == "QConv2d"]
    assert [n.attrs["activation"] for n in convs] == ["relu", "relu", "none", "clip", "relu", "relu"]
    assert convs[3].attrs["groups"] == 16 and convs[3].attrs["requant"].lo == 0
    six = int(round(6 / q.tensors[convs[3].outputs[0]].scale))
    assert convs[3].attrs["requant"].hi == min(127, six)
    add = q.node(q.nodes[4].name)
    assert add.attrs["requant"].lo == 0 and add.attrs["activation"] == "relu"
    if mode == "shift":
        assert all(n.attrs["requant"].pure_shift for n in convs)
    if per_channel is False:
        assert all(n.attrs["requant"].per_tensor for n in convs)
    calib = _inputs(g, 16, 1)
    _check_contract(q, calib[:4])
    test = _inputs(g, 32, 2)
    sess = ort.InferenceSession(zoo.build_model("mini_resnet").SerializeToString())
    ref = np.concatenate([sess.run(None, {"input": test[i:i + 1]})[0] for i in range(32)])
    got = np.concatenate([qops.run_reference(q, {"input": test[i:i + 1]})["output"] for i in range(32)])
    acc = compare_outputs(ref, got)
    assert acc["snr_db"] > 24 and acc["top1_agreement"] >= 0.8, acc
    first, source = float_outputs(zoo.build_model("mini_resnet"), g, {"input": test[:1]})
    assert source == "onnxruntime" and np.array_equal(first["output"], ref[:1])


def test_percentile_calibration_exact():
    g = import_onnx(zoo.build_model("tiny_cnn"))
    x = np.random.default_rng(0).uniform(0, 1, (2, 1, 8, 8)).astype(np.float32)
    full = calibrate(g, {"input": x})
    pct = calibrate(g, {"input": x}, percentile=90)
    values = [run_float(g, {"input": x[i:i + 1]}, keep_all=True) for i in range(2)]
    relu = g.nodes[1].outputs[0]
    assert full.absmax[relu] == max(float(np.abs(v[relu]).max()) for v in values)
    assert pct.absmax[relu] == max(float(np.percentile(np.abs(v[relu]), 90)) for v in values) < full.absmax[relu]
    assert pct.absmax["output"] == full.absmax["output"] and pct.absmax["input"] == full.absmax["input"]
    np.testing.assert_array_equal(pct.channel_absmax[relu], full.channel_absmax[relu])


def test_tiny_cnn_rounding_folded_into_bias():
    g, q = _quantized("tiny_cnn")
    assert [n.op for n in q.nodes] == ["Quantize", "QConv2d", "QConv2d", "Reshape", "QDense", "Dequantize"]
    assert q.outputs == ["output"] and q.tensors["output"].dtype == "float32"
    fg = prepare(g)
    first = q.nodes[1]
    r = first.attrs["requant"]
    sx = q.tensors[first.inputs[0]].scale
    sw = first.attrs["w_scale"].astype(np.float64)
    b_float = fg.constants[fg.nodes[0].inputs[2]].astype(np.float64)
    expected = np.rint(b_float / (sx * sw)) + ((1 << (r.shift - 1)) // r.multiplier)
    np.testing.assert_array_equal(q.constants[first.inputs[2]], expected.astype(np.int32))


def _const_model(op_after_relu: str):
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], kernel_shape=[1, 1], name="conv"),
             helper.make_node("Mul", ["c", "k"], ["m"], name="scale"),
             helper.make_node("Relu", ["m"], ["r"], name="relu"),
             helper.make_node(op_after_relu, ["r", "k"], ["output"], name="tail")]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([[[[2.0]], [[-1.0]]]], np.float32), "k")]
    graph = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2, 3, 3])], inits)
    return import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_prepare_folds_constants_and_keeps_values():
    g = _const_model("Mul")
    p = prepare(g)
    assert [n.op for n in p.nodes] == ["Conv2d", "Relu", "Mul"] and p.nodes[0].outputs == ["m"]
    x = np.random.default_rng(3).standard_normal((1, 2, 3, 3)).astype(np.float32)
    np.testing.assert_allclose(run_float(p, {"input": x})["output"], run_float(g, {"input": x})["output"], atol=1e-6)
    q = quantize(g, {"input": x})
    assert [n.op for n in q.nodes] == ["Quantize", "QConv2d", "QMul", "Dequantize"]


def test_errors():
    g = _const_model("Add")
    x = np.zeros((1, 2, 3, 3), np.float32)
    q = quantize(g, {"input": x + 1.0})       # a per-channel add after a Relu: a QAffine with the constant
    assert [n.op for n in q.nodes if n.name == "tail"] == ["QAffine"]
    with pytest.raises(ValueError, match="Requant mode 'round' is unknown; use 'multiply' or 'shift'"):
        quantize(g, {"input": x}, mode="round")
    with pytest.raises(ValueError, match="per_channel='yes' is invalid; use True, False or 'auto'"):
        quantize(g, {"input": x}, per_channel="yes")
    with pytest.raises(ValueError, match="Calibration needs at least one input sample; got none"):
        quantize(g, [])
    with pytest.raises(ValueError, match=r"Calibration percentile 20 must lie in \[50, 100\]"):
        quantize(g, {"input": x}, percentile=20)
    _, q = _quantized("tiny_cnn")
    with pytest.raises(GraphError, match="Graph 'tiny_cnn_int8' is already quantized"):
        quantize(q, {"input": x})


@pytest.mark.slow
def test_resnet18_quantized_tracks_float():
    g = import_onnx(zoo.build_model("resnet18"))
    q = quantize(g, {"input": _inputs(g, 4, 1)})
    assert sum(n.op == "QConv2d" for n in q.nodes) == 20 and sum(n.op == "QAdd" for n in q.nodes) == 8
    x = _inputs(g, 2, 5)
    ref = np.concatenate([run_float(g, {"input": x[i:i + 1]})["output"] for i in range(2)])
    got = np.concatenate([qops.run_reference(q, {"input": x[i:i + 1]})["output"] for i in range(2)])
    assert compare_outputs(ref, got)["snr_db"] > 20


@pytest.mark.slow
def test_digits_cnn_keeps_accuracy_within_one_point():
    import importlib.util
    from pathlib import Path
    pytest.importorskip("sklearn")
    path = Path(__file__).resolve().parents[1] / "scripts" / "train_digits.py"
    spec = importlib.util.spec_from_file_location("train_digits", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = script.evaluate(script.export_onnx(script.train(epochs=12)), "reference")
    assert result["images"] == 450 and result["float_acc"] > 95
    assert result["float_acc"] - result["int8_acc"] <= 1.0, result


def _conv_graph(w: np.ndarray, b: np.ndarray, relu: bool) -> Graph:
    g = Graph("conv", inputs=["input"], outputs=["output"])
    g.add_tensor("input", (1, w.shape[1], 6, 6), "float32")
    g.add_constant("w", w.astype(np.float32))
    g.add_constant("b", b.astype(np.float32))
    g.add_tensor("c", (1, w.shape[0], 6, 6), "float32")
    g.add_node("Conv2d", "conv", ["input", "w", "b"], ["c"], strides=(1, 1), pads=(1, 1, 1, 1), groups=1)
    g.add_tensor("output", (1, w.shape[0], 6, 6), "float32")
    g.add_node("Relu" if relu else "Clip", "act", ["c"], ["output"], **({} if relu else {"min": -3.0, "max": 3.0}))
    return g


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), mode=st.sampled_from(["multiply", "shift"]),
       per_channel=st.sampled_from([True, False, "auto"]), relu=st.booleans(),
       in_scale=st.floats(1e-3, 1e3), w_spread=st.floats(0, 4))
def test_quantized_conv_tracks_float_and_never_overflows(seed, mode, per_channel, relu, in_scale, w_spread):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((5, 3, 3, 3)) * (10.0 ** rng.uniform(-w_spread, 0, (5, 1, 1, 1)))
    b = rng.standard_normal(5) * in_scale * 0.1
    g = _conv_graph(w, b, relu)
    calib = (rng.standard_normal((4, 3, 6, 6)) * in_scale).astype(np.float32)
    q = quantize(g, {"input": calib}, mode=mode, per_channel=per_channel)
    assert [n.op for n in q.nodes] == ["Quantize", "QConv2d", "Dequantize"]
    _check_contract(q, calib)
    conv = q.nodes[1]
    sx, sy = q.tensors[conv.inputs[0]].scale, q.tensors[conv.outputs[0]].scale
    for i in range(4):
        # the float model on the int8 input grid isolates the error of weights and requantization
        x = qops.dequantize(qops.quantize(calib[i:i + 1], sx), sx)
        values = run_float(g, {"input": x}, keep_all=True)
        got = qops.run_reference(q, {"input": calib[i:i + 1]})["output"]
        err = np.abs(got - values["output"]).max()
        assert err <= 0.03 * np.abs(values["c"]).max() + 1.5 * sy, (err, sy)


def test_round_adds_moves_half_an_lsb_into_the_producer_bias():
    g = import_onnx(zoo.build_model("mini_resnet"))
    calib = _inputs(g, 8, 1)
    plain = quantize(g, {"input": calib}, round_adds=False)
    rounded = quantize(g, {"input": calib})
    add = rounded.nodes[4]
    assert add.op == "QAdd"
    conv = rounded.producer(add.inputs[1])                     # the residual branch's last conv (no activation)
    assert conv.attrs["activation"] == "none"
    sx, sy = rounded.tensors[conv.inputs[0]].scale, rounded.tensors[add.outputs[0]].scale
    step = np.rint(0.5 * sy / (sx * conv.attrs["w_scale"].astype(np.float64))).astype(np.int64)
    diff = rounded.constants[conv.inputs[2]].astype(np.int64) - plain.constants[conv.inputs[2]].astype(np.int64)
    np.testing.assert_array_equal(diff, step)
    assert (step > 0).all()
    others = [n for n in rounded.nodes if n.op == "QConv2d" and n is not conv]
    for node in others:
        np.testing.assert_array_equal(rounded.constants[node.inputs[2]], plain.constants[node.inputs[2]])
    test = _inputs(g, 16, 3)
    ref = np.concatenate([run_float(g, {"input": test[i:i + 1]})["output"] for i in range(16)])
    snr = [compare_outputs(ref, np.concatenate([qops.run_reference(q, {"input": test[i:i + 1]})["output"]
                                                for i in range(16)]))["snr_db"] for q in (plain, rounded)]
    assert snr[1] > snr[0] + 2, snr


# ---- calibration memory --------------------------------------------------------------------------------------------
def _calibration_by_definition(g: Graph, x: np.ndarray, percentile: float | None):
    """Every tensor of every sample kept (run_float(keep_all=True)), then reduced: what calibrate() must equal."""
    samples = [run_float(g, {"input": x[i:i + 1]}, keep_all=True) for i in range(x.shape[0])]
    exact = set(g.inputs) | set(g.outputs)
    absmax = {name: max(float(np.abs(s[name]).max()) if percentile is None or name in exact
                        else float(np.percentile(np.abs(s[name]), percentile)) for s in samples)
              for name in samples[0]}
    chan = {name: np.max([np.abs(s[name]).max(axis=tuple(i for i in range(s[name].ndim) if i != 1))
                          for s in samples], axis=0) for name in samples[0] if samples[0][name].ndim >= 2}
    return absmax, chan


@pytest.mark.parametrize("percentile", [None, 99.0])
def test_calibration_equals_its_definition(percentile):
    g = prepare(import_onnx(zoo.build_model("tiny_cnn")))
    x = _inputs(g, 4, 3)
    absmax, chan = _calibration_by_definition(g, x, percentile)
    for calib in ({"input": x}, ({"input": x[i:i + 1]} for i in range(4))):  # stacked, or a generator of samples
        cal = calibrate(g, calib, percentile=percentile)
        assert cal.absmax == absmax
        assert cal.channel_absmax.keys() == chan.keys()
        for name, per in chan.items():
            assert cal.channel_absmax[name].dtype == np.float32 and np.array_equal(cal.channel_absmax[name], per)
            assert not np.signbit(cal.channel_absmax[name]).any()


def test_calibration_memory_does_not_grow_with_samples():
    """200 float64 samples of mini_resnet (4.7 MiB): one batch at a time is converted and only live tensors are kept
    (measured peak 1.7 MiB, 1.4 MiB for one sample, the difference CPython's free lists filling; calibrate used to
    convert the whole input to float32 first and keep every tensor of a sample: 5.4 MiB). A first call is made
    untraced: numpy's one-time allocations and CPython's free lists (objects kept for reuse, bounded, released by a
    full garbage collection) are not the calibration's. The bound is loose (what other tests left in the process
    moves the peak by about a MiB); the growth from 1 to 200 samples is what it checks."""
    import gc
    import tracemalloc
    g = prepare(import_onnx(zoo.build_model("mini_resnet")))
    x = np.random.default_rng(0).standard_normal((200,) + g.shape("input")[1:])
    assert x.dtype == np.float64 and x.nbytes // 2 > 2 << 20
    for samples in (1, 200):                 # warm-ups at both sizes: numpy's and CPython's caches fill first
        calibrate(g, {"input": x[:samples]})
    peaks = []
    for samples in (1, 200):
        gc.collect()
        tracemalloc.start()
        try:
            calibrate(g, {"input": x[:samples]})
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] < 4 << 20 and peaks[1] < peaks[0] + (1 << 20)     # the old way: 5.4 MiB


def test_accuracy_vs_float_exact():
    ref = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0], [8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    got = ref.copy()
    got[0, 7], got[1, 0], got[1, 1] = 6.5, 4.0, 5.0   # row 0: top-1 still 7; row 1: top-1 moves to 1, in top 5
    r = accuracy_vs_float(ref, got, 0.5)
    assert r["max_abs_error_lsb"] == 10.0 and r["mean_abs_error_lsb"] == pytest.approx(10.5 / 16 / 0.5)
    assert r["max_error_pct_of_range"] == 5 / 8 * 100
    assert r["mean_error_pct_of_range"] == pytest.approx(10.5 / 16 / 8 * 100)
    assert r["cosine"] == pytest.approx((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert r["top1_agreement"] == 0.5 and r["top5_agreement"] == 1.0
    flat = accuracy_vs_float(np.ones((1, 3, 2, 2)), np.ones((1, 3, 2, 2)), None)
    assert flat["max_abs_error_lsb"] is None and flat["cosine"] == pytest.approx(1.0) and "top1_agreement" not in flat


def test_float_outputs_without_a_model_runs_the_float_reference():
    g, q = _quantized("tiny_cnn")
    x = {"input": _inputs(g, 1, 3)}
    out, source = float_outputs(None, g, x)
    assert source == "float reference" and np.array_equal(out["output"], run_float(g, x)["output"])
    assert output_scale(q, "output") == q.node("dequantize_output").attrs["scale"]


def test_error_sources_name_the_layer_that_loses_the_accuracy(tmp_path, capsys):
    """Calibrated on inputs 100 times smaller than the run's, the first linear layer's output saturates: that layer
    is named first, its inputs exact (graph input) and its output far from float; the run prints the line and the
    JSON report holds the list."""
    import json

    import onnx

    from vta.cli import main
    from vta.compiler.frontend.quantize import error_sources
    from vta.compiler.report import format_accuracy
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((16, 16)) * 0.3).astype(np.float32), (rng.standard_normal((16, 8)) * 0.3
                                                                        ).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="second")]
    model = helper.make_model(helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")]),
        opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(model)
    calib = {"x": rng.standard_normal((16, 16)).astype(np.float32) * 0.01}
    q = quantize(g, calib)
    x = {"x": rng.standard_normal((4, 16)).astype(np.float32)}
    lost = error_sources(g, q, x)
    assert lost and lost[0]["node"] == "first" and lost[0]["cosine_in"] == 1.0 and lost[0]["cosine_out"] < 0.9
    assert all(a["cosine_in"] - a["cosine_out"] >= b["cosine_in"] - b["cosine_out"] for a, b in zip(lost, lost[1:]))
    text = "\n".join(format_accuracy({"reference": "r", "outputs": {}, "where_lost": lost}))
    assert "where the error arises" in text and "first (" in text
    path = tmp_path / "two.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "cal.npz", x=calib["x"])
    np.save(tmp_path / "x.npy", x["x"])
    assert main(["run", str(path), "--target", "fsim", "--no-progress", "--calibration", str(tmp_path / "cal.npz"),
                 "--input", str(tmp_path / "x.npy"), "--report-json", str(tmp_path / "r.json")]) == 0
    assert "where the error arises" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["accuracy"]["where_lost"][0]["node"] == "first"


def test_values_below_the_scale_floor_are_named_in_a_warning(caplog):
    """A random-weight network whose activations shrink below 1e-6 quantizes them to 0 (HF's tiny MobileNet: cosine
    0 against float); the quantizer says so, naming the first such tensor and its producer."""
    import logging
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 16)) * 1e-8).astype(np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="shrink"), helper.make_node("Relu", ["h"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [numpy_helper.from_array(w, "w")]),
        opset_imports=[helper.make_opsetid("", 17)])
    g = import_onnx(model)
    with caplog.at_level(logging.WARNING, logger="vta"):
        quantize(g, {"x": rng.standard_normal((8, 16)).astype(np.float32)})
    assert "below the 1e-06 the quantizer resolves, so they quantize to 0" in caplog.text
    assert "(written by" in caplog.text and "'shrink'" in caplog.text
    caplog.clear()
    cnn = import_onnx(zoo.build_model("tiny_cnn"))
    with caplog.at_level(logging.WARNING, logger="vta"):
        quantize(cnn, {"input": _inputs(cnn, 2, 1)})
    assert "quantize to 0" not in caplog.text


@pytest.mark.parametrize("mode", ["multiply", "shift"])
def test_a_layer_of_zero_weights_computes_its_bias(mode):
    """A Conv whose weights are all 0 (a pruned or freshly initialized layer) outputs its bias: the weight scale's
    floor is 1/127 there, not 1e-12/127, which put the bias at 1e14 accumulator units, clipped to int32, so the layer
    computed 0 and the run still said it matched the integer reference."""
    from helpers import onnx_model, onnx_op_run
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    bias = np.array([0.5, -0.25, 0.125, 1.0], np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    model = onnx_model(nodes, {"x": x}, [("w", np.zeros((4, 3, 3, 3), np.float32)), ("b", bias)])
    if mode == "multiply":
        *_, got, want = onnx_op_run(model, {"x": x}, atol=1e-6, rtol=1e-6)
    else:
        qg = quantize(import_onnx(model), {"x": x}, mode="shift")
        got = qops.run_reference(qg, {"x": x})[qg.outputs[0]]
        got = got * qg.producer(qg.outputs[0]).attrs["scale"] if got.dtype == np.int8 else got
        want = np.maximum(bias, 0).reshape(1, 4, 1, 1) * np.ones((1, 4, 6, 6), np.float32)
    np.testing.assert_allclose(got, want, atol=1.0 / 127)
