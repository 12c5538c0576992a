"""tests for compiler/onnx_backend.py: the lab as an ONNX backend, and onnx's own node test cases through it.

The conformance part is onnx's conventional one, ``onnx.backend.test.BackendTest(backend, __name__)`` with
``include`` patterns: the node cases of :data:`OPERATORS` and their ``_expanded`` function decompositions, on the
devices ``fsim`` and ``cpu`` (test names end ``_fsim`` and ``_cpu``). onnx 1.23 no longer ships
``onnx/backend/test/data/node``: ``BackendTest`` takes the node cases from ``onnx.backend.test.case.node`` in memory
(``loader.load_node_model_tests``), so nothing is generated on disk.

Each case is prepared and run by :class:`VtaBackend` as any user's model is: calibrated on the case's own input (the
data it is first given), inputs the frontend takes only as constants frozen to the case's values. What is checked,
instead of onnx's float comparison (``rtol=1e-3`` which int8 outputs cannot meet):

* a run lies within the int8 tolerance ``max |got - expected| <= 2 * s_out + s_in`` of onnx's expected output, as
  tests/test_onnx_node_cases.py states it: ``s_out`` the output's quantization step, ``s_in`` the largest input
  step (:attr:`VtaBackendRep.output_steps`, :attr:`VtaBackendRep.input_step`); shapes and dtypes equal;
* a refusal is one of the lab's own errors, never a crash and never "malformed" (the test is then skipped with its
  message); where :data:`REFUSALS` names the case, the message must match the reason it gives. A case a rule names
  that runs must meet the tolerance like any other: the frontend is widened while this test stands (so a rule pins
  *why* a case is refused, not *that* it is; tests/test_onnx_node_cases.py pins both for the CNN operators it owns).
  :data:`KNOWN_DEFECTS` are the cases the frontend refuses wrongly (as a malformed graph); they are expected failures,
  so their fix is noticed.
"""
from __future__ import annotations

import re
import unittest
import warnings
from functools import cache
from typing import Any

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.loader import load_model_tests
from test_onnx_node_cases import OPERATOR_REFUSALS

from vta.compiler.frontend.onnx_frontend import UnsupportedModelError, UnsupportedOperatorError, UnsupportedOpsetError
from vta.compiler.frontend.quantize import QuantizationError
from vta.compiler.ir import GraphError
from vta.compiler.onnx_backend import VtaBackend, VtaBackendRep
from vta.config import VTAConfig

OPERATORS = ("Conv", "Gemm", "MatMul", "BatchNormalization", "Relu", "Clip", "Add", "Sub", "Mul", "Div", "MaxPool",
             "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "ReduceMean", "Pad",
             "Concat", "Softmax", "Sigmoid", "HardSigmoid", "HardSwish", "Transpose", "DepthToSpace", "Resize",
             "Identity", "Dropout", "Constant", "Attention", "RMSNormalization", "SwiGLU", "Einsum", "GatherElements",
             "Expand", "LpNormalization", "RotaryEmbedding", "InstanceNormalization", "GroupNormalization", "GatherND",
             "Exp", "Softplus", "Softsign", "Abs", "Mish", "Erf", "Sin", "Cos", "Atan", "Sign", "Elu", "Celu",
             "LeakyRelu", "ThresholdedRelu", "Selu", "Sqrt", "Reciprocal", "Max", "Min", "Pow", "LogSoftmax",
             "ReduceLogSumExp", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "CumSum",
             "Trilu", "LayerNormalization", "CausalConvWithState", "ConvTranspose", "LSTM", "GRU", "RNN",
             "GlobalMaxPool", "GlobalLpPool", "Loop", "Scan", "PRelu", "GridSample", "Col2Im")
"""The operators of a CNN the frontend imports (the element-wise functions as lookup tables), and ONNX's fused
transformer operators (opsets 23+), whose node cases
the conformance test runs (scripts/onnx_node_table.py covers every operator the frontend knows)."""

DEVICES = ("FSIM", "CPU")

LAB_ERRORS = (UnsupportedOperatorError, UnsupportedOpsetError, QuantizationError, GraphError)

_TYPE = r"Graph input '\w+' has ONNX element type [A-Z0-9]+; only float32 inputs"
REFUSALS: list[tuple[str, str]] = [
    (r"_u?int(8|16|32|64)|_sequence|_opt$|^test_(edge|reflect|wrap)_pad", _TYPE),
    *OPERATOR_REFUSALS,
    (r"^test_gemm_default_matrix_bias", r"a bias C of 12 values for 4 outputs \(only per-output biases\)"),
    (r"^test_matmul_(3d|4d|bcast|1d)", r"only \[N, K\] x constant \[K, O\]|both must have rank 2 or more"),
    (r"^test_constant_pad_(negative_)?axes", r"'Pad' .*the axes input"),
    (r"^test_dropout_default_mask$", r"its mask output 'z' is used; the lab runs Dropout in inference mode"),
    # a scalar graph input (Dropout's ratio, Clip's bounds read by Less/Where) or a 0-sized dimension
    (r"^test_(training_)?dropout_.*(ratio|mask)$|^test_training_dropout(_default)?$|^test_clip(_.*)?_expanded$",
     r"Tensor '(r|min|max)' is a scalar computed at run time; the lab computes tensors of rank 1 or more"),
    (r"^test_reshape_allowzero_reordered", r"Tensor 'reshaped' has shape 3x4x0, with a dimension of size 0"),
    (r"^test_constant$", r"graph output\(s\) 'values' that are constants .*the lab compiles computations only"),
    (r"^test_batchnorm_.*_training_mode$", r"training_mode=1 .*the lab runs inference"),
]
"""(case name pattern, message pattern): why the lab refuses a case when it does (searched with re.search, the first
name pattern that matches)."""

KNOWN_DEFECTS: tuple[str, ...] = ()
"""Valid models the frontend reports wrongly (as malformed): expected failures until fixed. None today: a Constant
node as the graph output, Dropout's mask and BatchNormalization's training mode are refused with their reasons."""

INT8_MISSES: tuple[str, ...] = (r"^test_pow_(cpu|fsim)$", r"^test_layer_normalization_2d_axis_negative_2_expanded_",
                                r"^test_gridsample_zeros_padding_(cpu|fsim)$")
"""Cases that run but miss the int8 tolerance for a reason of int8 itself: expected failures, so that a change of
their accuracy is noticed. ``test_pow``, ``x ** y`` of two activations with ``x`` from 0 to 59: the base's int8 step
(0.46) times the power's slope (``y * x ** (y - 1)``, up to several hundred) is beyond ``2 * s_out + s_in``; the
lab runs it as a table of the pairs of int8 values (frontend/pointwise.py) and reports its error.
``test_layer_normalization_2d_axis_negative_2_expanded``: ONNX's LayerNormalization function fuses into one
LayerNormalization (onnx_fusions._match_one_pass_layer_norm), but its scale and bias are graph inputs, so
activations: the normalised values times the int8 scale, plus the int8 bias, add two roundings that the tolerance
does not count (0.057 against 0.046; the 18 other expanded cases meet it). ``test_gridsample_zeros_padding``: its grid
is a graph input, so an int8 activation; its step moves the sample positions by up to a quarter pixel at that size,
and a bilinear sample moves with them (0.147 against 0.106; the grid of a model, computed at run time, is int8 as
well; a constant grid stays exact, and the 19 other 2-D cases meet the tolerance)."""


@cache
def _node_cases() -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in load_model_tests(kind="node")}


def _case_names() -> list[str]:
    """The node cases of :data:`OPERATORS` (one node of such an operator) and their ``_expanded`` forms."""
    cases = _node_cases()
    base = [name for name, case in cases.items()
            if len(case.model.graph.node) == 1 and case.model.graph.node[0].op_type in OPERATORS]
    return base + [name + "_expanded" for name in base if name + "_expanded" in cases]


def _expected_refusal(name: str) -> str | None:
    return next((why for pattern, why in REFUSALS if re.search(pattern, name)), None)


_LAST: dict[str, VtaBackendRep] = {}
"""The rep of the case running now (one at a time per process), whose quantization steps bound the comparison."""


class _CheckedRep:
    """A case's model, prepared and run by :class:`VtaBackend` on ``run``, its refusal checked against
    :data:`REFUSALS`."""

    def __init__(self, model: onnx.ModelProto, device: str) -> None:
        self.model, self.device = model, device

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        name = self.model.graph.name
        why = _expected_refusal(name)
        try:
            rep = VtaBackend.prepare(self.model, self.device)
            outputs = rep.run(inputs, **kwargs)
        except LAB_ERRORS as err:
            assert "malformed" not in str(err), f"{name}: a valid model is reported as malformed: {err}"
            assert why is None or re.search(why, str(err)), f"{name} is refused for another reason than {why!r}: {err}"
            raise unittest.SkipTest(f"refused: {err}") from None
        _LAST["rep"] = rep
        return outputs


class _Checked(VtaBackend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "fsim", **kwargs: Any) -> Any:
        assert not kwargs, kwargs
        return _CheckedRep(model, device)


class _Runner(onnx.backend.test.BackendTest):
    """onnx's runner on the lab's devices, comparing within the int8 tolerance (see the module doc)."""

    def _add_test(self, category: str, test_name: str, test_func: Any, report_item: Any,  # type: ignore[override]
                  devices: tuple[str, ...] = DEVICES, **kwargs: Any) -> None:
        super()._add_test(category, test_name, test_func, report_item, devices, **kwargs)

    @classmethod
    def assert_similar_outputs(cls, ref_outputs: Any, outputs: Any, rtol: float, atol: float,
                               model_dir: str | None = None) -> None:
        rep = _LAST.pop("rep")
        assert len(outputs) == len(ref_outputs), f"{len(outputs)} outputs, expected {len(ref_outputs)}"
        for k, (got, want, s_out) in enumerate(zip(outputs, ref_outputs, rep.output_steps)):
            assert got.shape == want.shape and got.dtype == want.dtype, \
                f"output {k}: {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
            error = float(np.abs(got.astype(np.float64) - want).max()) if got.size else 0.0
            bound = 2 * s_out + rep.input_step
            assert error <= bound, f"output {k}: max error {error:.4g} > 2 * {s_out:.4g} + {rep.input_step:.4g}"


_backend_test = _Runner(_Checked, __name__)
for _name in _case_names():
    _backend_test.include(rf"^{re.escape(_name)}_({'|'.join(d.lower() for d in DEVICES)})$")
for _pattern in (*KNOWN_DEFECTS, *INT8_MISSES):
    _backend_test.xfail(_pattern)
OnnxBackendNodeModelTest = _backend_test.test_cases["OnnxBackendNodeModelTest"]
"""onnx's node cases (only the node category: the model categories need downloads or take no int8 tolerance)."""


def test_every_refusal_rule_names_some_case():
    names = _case_names()
    assert len(names) > 200
    dead = [pattern for pattern, _ in REFUSALS if not any(re.search(pattern, name) for name in names)]
    assert not dead, f"REFUSALS rules that match no case: {dead}"


# ---- the backend's own contract ------------------------------------------------------------------------------------
def _small_cnn(seed: int = 0) -> onnx.ModelProto:
    """Conv + Relu and a second output through GlobalAveragePool: two outputs, named ``p`` and ``r``."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap")]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 8, 1, 1]),
                               helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _float_outputs(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator
    return list(ReferenceEvaluator(model).run(None, {"x": x}))


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, (1, 3, 8, 8)).astype(np.float32)


@pytest.mark.parametrize("device", ["fsim", "cpu", "CPU"])
def test_outputs_are_float_in_the_models_order_within_the_int8_steps(x, device):
    model = _small_cnn()
    rep = VtaBackend.prepare(model, device)
    outputs = rep.run([x])
    assert outputs._fields == ("p", "r")
    assert outputs["r"] is outputs[1]
    for got, want, step in zip(outputs, _float_outputs(model, x), rep.output_steps):
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.abs(got - want).max() <= 2 * step + rep.input_step
    assert rep.compiled.accel_steps == 1            # the convolution: compiled for the accelerator, run on any target


def test_fsim_and_cpu_agree_bit_for_bit(x):
    model = _small_cnn()
    fsim, cpu = VtaBackend.run_model(model, [x], "fsim"), VtaBackend.run_model(model, {"x": x}, "cpu")
    for a, b in zip(fsim, cpu):
        np.testing.assert_array_equal(a, b)


def test_it_calibrates_on_the_first_run_unless_given_calibration(x):
    model = _small_cnn()
    rep = VtaBackend.prepare(model, "cpu")
    assert rep.compiled is None
    with pytest.raises(RuntimeError, match=r"the model is not compiled yet: its quantization steps are known after"):
        _ = rep.input_step
    rep.run([x])
    assert rep.input_step == pytest.approx(float(np.abs(x).max()) / 127)
    batch = np.random.default_rng(2).uniform(-4, 4, (16, 3, 8, 8)).astype(np.float32)
    given = VtaBackend.prepare(model, "cpu", calibration={"x": batch})
    assert given.compiled is not None
    assert given.input_step == pytest.approx(float(np.abs(batch).max()) / 127)


def test_a_bad_calibration_names_the_input():
    with pytest.raises(ValueError, match=r"calibration=: input 'x' has shape \(4, 3, 4, 4\); it takes \[N, 3, 8, 8\]"):
        VtaBackend.prepare(_small_cnn(), "cpu", calibration={"x": np.zeros((4, 3, 4, 4), np.float32)})


def test_a_constant_input_is_frozen_at_the_first_run(x):
    model = _small_cnn()
    w = numpy_helper.to_array(model.graph.initializer[0])
    del model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)))
    rep = VtaBackend.prepare(model, "fsim")
    assert list(rep.frozen) == ["w"] and rep.input_names == ["x", "w"]
    first = rep.run([x, w])
    np.testing.assert_array_equal(rep.run({"x": x, "w": w})[0], first[0])
    with pytest.raises(ValueError, match=r"input 'w' is a constant of the compiled model \(an operator's weight or "
                                         r"parameter, frozen at the first run to a \(8, 3, 3, 3\) array with sum"):
        rep.run([x, w * 2])


def test_an_unsupported_model_raises_the_frontends_error_unchanged():
    from vta.compiler.frontend.onnx_frontend import import_onnx
    nodes = [helper.make_node("Tan", ["x"], ["b"], name="tan"), helper.make_node("Acos", ["z"], ["c"], name="acos")]
    graph = helper.make_graph(nodes, "trig", [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4])
                                              for t in ("x", "z")],
                              [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4]) for t in ("b", "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(UnsupportedModelError) as direct:
        import_onnx(model)
    with pytest.raises(UnsupportedModelError) as through:
        VtaBackend.prepare(model, "cpu")
    assert str(through.value) == str(direct.value)
    assert [p.node_name for p in through.value.problems] == ["tan", "acos"]


def test_a_prequantized_model_is_used_as_is(x, tmp_path):
    quantization = pytest.importorskip("onnxruntime.quantization")
    model = _small_cnn()

    class Reader(quantization.CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{"x": x}])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.samples, None)
    source, path = str(tmp_path / "float.onnx"), str(tmp_path / "qdq.onnx")
    onnx.save(model, source)
    quantization.quantize_static(source, path, Reader(), quant_format=quantization.QuantFormat.QDQ,
                                 activation_type=quantization.QuantType.QInt8,
                                 weight_type=quantization.QuantType.QInt8)
    quantized = onnx.load(path)
    rep = VtaBackend.prepare(quantized, "fsim")
    assert rep.compiled is not None and rep.compiled.graph.is_quantized   # compiled in prepare, nothing to calibrate
    outputs = rep.run([x])
    assert [o.shape for o in outputs] == [(1, 8, 1, 1), (1, 8, 8, 8)]
    with pytest.raises(ValueError, match=r"calibration= is given, but the model is pre-quantized: it is compiled "
                                         r"with its own scales; drop calibration="):
        VtaBackend.prepare(quantized, "fsim", calibration={"x": x})


def test_the_config_comes_from_config(x, small_cfg):
    rep = VtaBackend.prepare(_small_cnn(), "fsim", config=small_cfg, calibration={"x": x})
    assert rep.compiled.cfg == small_cfg and rep.cfg == small_cfg
    assert VtaBackend.prepare(_small_cnn(), "fsim", calibration={"x": x}).compiled.cfg == VTAConfig()


def test_run_node_runs_one_node_calibrated_on_its_inputs():
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    values = np.linspace(-2, 2, 48, dtype=np.float32).reshape(1, 3, 4, 4)
    (y,) = VtaBackend.run_node(node, [values, np.float32(-1), np.float32(1)], "cpu")
    assert np.abs(y - np.clip(values, -1, 1)).max() <= 2 * (1 / 127) + 2 / 127


def test_devices():
    assert VtaBackend.supports_device("fsim") and VtaBackend.supports_device("CPU")
    assert not VtaBackend.supports_device("CUDA") and not VtaBackend.supports_device("gpu")


@pytest.mark.parametrize("call, error, message", [
    (lambda: VtaBackend.prepare(_small_cnn(), "CUDA"), ValueError,
     r"device 'CUDA' is not one of the lab's: fsim, cpu, tsim \(onnx's 'CPU' is cpu\)"),
    (lambda: VtaBackend.prepare(_small_cnn(), "cpu", seed=1), TypeError,
     r"VtaBackend.prepare got unknown option seed; its options are config, calibration"),
    (lambda: VtaBackend.prepare(_small_cnn(), "cpu", config="default"), TypeError,
     r"config must be a VTAConfig, not str"),
    (lambda: VtaBackend.prepare(_small_cnn(), "cpu", calibration=[1]), TypeError,
     r"calibration must be a dict input name -> \[N, ...\] array, not list"),
    (lambda: VtaBackend.prepare(b"onnx", "cpu"), TypeError, r"VtaBackend.prepare takes an onnx.ModelProto, not bytes"),
    (lambda: VtaBackend.prepare(_small_cnn(), "cpu").run([]), ValueError,
     r"run got 0 arrays; the model takes 1 inputs \(x\)"),
    (lambda: VtaBackend.prepare(_small_cnn(), "cpu").run({"y": 1}), ValueError,
     r"run got inputs 'y'; the model's inputs are 'x'"),
    (lambda: VtaBackend.prepare(_small_cnn(), "cpu").run(3), TypeError,
     r"run takes a list of arrays, a dict name -> array or one array, not int"),
])
def test_errors_name_the_mistake(call, error, message):
    with pytest.raises(error, match=message):
        call()
