"""Graph inputs that are numbers the model computes with (compiler/frontend/numeric_inputs.py): a diffusion UNet's
timestep, int64 or float32, embedded as ``[sin(t * f), cos(t * f)]`` and fed to a small MLP whose output is added to
the activations. Each case against onnxruntime at a timestep the calibration never saw, the compiled model on fsim
bit-exact with the integer reference; the inputs' checks; and the forms left to the other rules (a mask's fill,
positions)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.calibration import CalibrationError, load_calibration
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.masks import is_numeric_input
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import float_outputs
from vta.compiler.pipeline import InputError, check_inputs, random_inputs
from vta.config import VTAConfig

HALF, WIDTH, TOKENS = 8, 32, 16


def _unet_step(t_type: int = TensorProto.INT64, t_shape: tuple[int, ...] = (1,)) -> onnx.ModelProto:
    """``x [1, TOKENS, WIDTH]`` plus an MLP of the timestep's sinusoidal embedding (diffusers'
    ``get_timestep_embedding``, then Linear, SiLU, Linear), then a Linear of the sum: ``y``."""
    rng = np.random.default_rng(0)
    freqs = np.exp(-np.log(10000.0) * np.arange(HALF) / HALF).astype(np.float32)
    inits = [numpy_helper.from_array(freqs.reshape(1, HALF), "freqs"),
             numpy_helper.from_array(np.array([-1, 1], np.int64), "col"),
             numpy_helper.from_array((rng.standard_normal((2 * HALF, WIDTH)) * 0.3).astype(np.float32), "W1"),
             numpy_helper.from_array((rng.standard_normal(WIDTH) * 0.1).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) * 0.2).astype(np.float32), "W2"),
             numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) * 0.2).astype(np.float32), "W3"),
             numpy_helper.from_array(np.array([1, 1, WIDTH], np.int64), "row")]
    nodes = [helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("Reshape", ["tf", "col"], ["tcol"]),
             helper.make_node("Mul", ["tcol", "freqs"], ["phase"]),
             helper.make_node("Sin", ["phase"], ["s"]),
             helper.make_node("Cos", ["phase"], ["c"]),
             helper.make_node("Concat", ["c", "s"], ["emb"], axis=-1),
             helper.make_node("Gemm", ["emb", "W1", "b1"], ["h1"]),
             helper.make_node("Sigmoid", ["h1"], ["g1"]),
             helper.make_node("Mul", ["h1", "g1"], ["a1"]),
             helper.make_node("MatMul", ["a1", "W2"], ["temb"]),
             helper.make_node("Reshape", ["temb", "row"], ["temb3"]),
             helper.make_node("Add", ["x", "temb3"], ["xt"]),
             helper.make_node("MatMul", ["xt", "W3"], ["y"])]
    graph = helper.make_graph(nodes, "unet_step", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, WIDTH]),
        helper.make_tensor_value_info("t", t_type, list(t_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _feeds(t, dtype, samples: int = 1, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((samples, TOKENS, WIDTH)).astype(np.float32), "t": np.asarray(t, dtype)}


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.ravel(a) @ np.ravel(b) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("t_type, dtype, t_shape", [(TensorProto.INT64, np.int64, (1,)),
                                                    (TensorProto.INT32, np.int32, (1,)),
                                                    (TensorProto.FLOAT, np.float32, (1,)),
                                                    (TensorProto.FLOAT, np.float32, ())])
def test_a_timestep_is_embedded_in_float_and_the_mlp_runs_on_the_accelerator(t_type, dtype, t_shape, tmp_path):
    """The embedding (Cast, Mul, Sin, Cos, Concat) becomes one InputFn; its Gemm and the layers after it stay
    linear layers. Calibrated on 8 timesteps, run at t = 937 (never seen): equal to onnxruntime within int8's error,
    and on fsim bit-exact with the integer reference. A scalar timestep (optimum's) is taken as ``[1]``."""
    from vta.compiler.pipeline import CalibrationSet, check_inputs, compile_model
    from vta.compiler.runtime.executor import run
    model = _unet_step(t_type, t_shape)
    graph = import_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert ops.count("InputFn") == 1 and not {"Sin", "Cos", "Lut"} & set(ops)
    assert graph.tensors["t"].dtype == ("float32" if t_type == TensorProto.FLOAT else "int64")
    assert graph.shape("t") == (1,)
    feeds = _feeds(np.full(t_shape, 937), dtype)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(run_float(graph, check_inputs(graph, feeds))["y"], want, atol=1e-5, rtol=1e-5)
    path = tmp_path / "unet_step.onnx"
    onnx.save(model, str(path))
    calib = _feeds(np.random.default_rng(2).integers(0, 1000, 8), dtype, samples=8)
    compiled = compile_model(str(path), VTAConfig(), calib=8, calibration=CalibrationSet(calib, {"source": "test"}))
    qops_used = {n.op for n in compiled.graph.nodes}
    assert "InputFn" in qops_used and "QDense" in qops_used
    given = check_inputs(compiled.graph, feeds)
    got = run(compiled, given, target="fsim").outputs["y"]
    np.testing.assert_array_equal(got, qops.run_reference(compiled.graph, given)["y"])
    assert _cosine(got, want) > 0.995
    np.testing.assert_allclose(float_outputs(str(path), compiled.graph, given)[0]["y"], want, rtol=1e-6)


def test_an_integer_number_through_a_function_no_mask_takes_is_a_number():
    """``x + sqrt(float(n))`` with ``n`` an int64 input: no Sin, but a Sqrt, which no mask passes through, and an Add
    to the activations, where a mask would meet the scores: the number's function, in float, is an activation.
    (``x * float(n)`` alone is a mask's pooling, :mod:`.pooling`; a row-wise function that meets the activations in a
    Mul is a table of positions, :mod:`.position_tables`.)"""
    nodes = [helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Sqrt", ["nf"], ["root"]),
             helper.make_node("Add", ["x", "root"], ["y"])]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]),
                                                helper.make_tensor_value_info("n", TensorProto.INT64, [1, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    fg = import_onnx(model)
    assert is_numeric_input(fg, "n")
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 4, 8)).astype(np.float32),
             "n": np.array([[[3]]], np.int64)}
    np.testing.assert_allclose(run_float(fg, feeds)["y"], feeds["x"] + np.sqrt(3), rtol=1e-6)


def test_the_inputs_of_an_integer_timestep_are_checked(tmp_path):
    """Any integer is a timestep (given as int or as integral floats); a fraction, or a value beyond the type the file
    declares, is refused naming the input, at run time and in the calibration; random inputs draw integers in
    [0, 1000)."""
    graph = import_onnx(_unet_step())
    ok = check_inputs(graph, _feeds([3.0], np.float32))
    assert ok["t"].dtype == np.int64 and ok["t"].tolist() == [3]
    with pytest.raises(InputError, match="'t'.*integers"):
        check_inputs(graph, _feeds([2.5], np.float32))
    np.savez(tmp_path / "calib.npz", **_feeds([0.5, 1.0], np.float32, samples=2))
    with pytest.raises(CalibrationError, match="'t' takes integers"):
        load_calibration(tmp_path / "calib.npz", graph)
    t = random_inputs(graph, seed=0, samples=64)["t"]
    assert t.dtype == np.int64 and 0 <= t.min() and t.max() < 1000 and len(set(t.tolist())) > 10
    narrow = import_onnx(_unet_step(TensorProto.INT32))       # declared int32: no value beyond its range
    assert check_inputs(narrow, _feeds([2 ** 31 - 1], np.int64))["t"].tolist() == [2 ** 31 - 1]
    with pytest.raises(InputError, match=r"outside \[-2147483648, 2147483647\] for input 't'.*int32"):
        check_inputs(narrow, _feeds([2 ** 40], np.int64))
    np.savez(tmp_path / "wide.npz", **_feeds([1, 2 ** 40], np.int64, samples=2))
    with pytest.raises(CalibrationError, match=r"outside \[-2147483648, 2147483647\] for input 't'.*int32"):
        load_calibration(tmp_path / "wide.npz", narrow)


def test_a_huge_fill_stays_a_mask():
    """An int64 input whose region ends in ``(1 - m) * -10000`` is a mask's fill, not a number: the mask rules take
    it as before (here it meets no scores, so it is refused as a mask is)."""
    nodes = [helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Sub", ["one", "mf"], ["inv"]),
             helper.make_node("Mul", ["inv", "big"], ["fill"]),
             helper.make_node("Exp", ["mf"], ["e"]),
             helper.make_node("Add", ["fill", "e"], ["term"]),
             helper.make_node("Add", ["x", "term"], ["y"])]
    inits = [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(-10000.0, np.float32), "big")]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                                helper.make_tensor_value_info("m", TensorProto.INT64, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(Exception, match="mask input 'm'"):
        import_onnx(model)


def test_fourier_features_of_a_float_input_are_computed_in_float():
    """Fourier features, ``[sin(2 pi x @ B), cos(2 pi x @ B)]`` with ``B`` of scale 10 (Tancik et al.'s, NeRF's
    positional encoding): the product by ``B`` is a phase (it reaches the Sin through nothing but shape ops), so it
    joins the InputFn, and the MLP after the features stays linear layers; quantizing ``x`` before ``B`` lost the
    phases (cosine 0.894 on this model before)."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal((3, 16)) * 10).astype(np.float32), "B"),
             numpy_helper.from_array(np.array(2 * np.pi, np.float32), "two_pi"),
             numpy_helper.from_array((rng.standard_normal((32, 8)) * 0.3).astype(np.float32), "W")]
    nodes = [helper.make_node("Mul", ["x", "two_pi"], ["x2"]), helper.make_node("MatMul", ["x2", "B"], ["p"]),
             helper.make_node("Sin", ["p"], ["s"]), helper.make_node("Cos", ["p"], ["c"]),
             helper.make_node("Concat", ["s", "c"], ["f"], axis=-1), helper.make_node("MatMul", ["f", "W"], ["y"])]
    graph = helper.make_graph(nodes, "fourier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    fg = import_onnx(model)
    ops = [n.op for n in fg.nodes]
    assert ops.count("InputFn") == 1 and ops.count("Conv2d") == 1          # the MLP's MatMul: a linear layer
    x = {"x": rng.uniform(0, 1, (1, 64, 3)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString()).run(None, x)[0]
    np.testing.assert_allclose(run_float(fg, x)["y"], want, atol=1e-4, rtol=1e-4)
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.kernels import cpu
    calib = {"x": rng.uniform(0, 1, (8, 64, 3)).astype(np.float32)}
    qg = quantize(fg, calib)
    got = cpu.run_cpu(qg, x)["y"]
    np.testing.assert_array_equal(got, qops.run_reference(qg, x)["y"])
    assert _cosine(got, want) > 0.999
