"""The lab as an ONNX backend: :class:`VtaBackend` (``onnx.backend.base.Backend``) compiles an ONNX model for the
accelerator and runs it on a target, as onnx's backend tests and tools expect::

    rep = VtaBackend.prepare(model, device="fsim")          # or "cpu", "tsim"; config=VTAConfig(...)
    (y,) = rep.run([x])                                     # float32 outputs in the model's output order

What the backend decides, because an int8 accelerator cannot take an ONNX model as it stands:

* **Calibration.** A float model is quantized on ``calibration=`` (input name -> a batch ``[N, ...]``) when given,
  else on the inputs of its first run: the backend calibrates on the data it is first given. For conformance tests
  that is the honest choice (each case's own input; no other data exists), for a real model it is one sample: give
  ``calibration=``. A pre-quantized model (:mod:`.frontend.prequant`) is compiled with its own scales as it is.
* **Constant inputs.** A graph input at an operator position the frontend takes only as a constant
  (:data:`CONSTANT_INPUTS`: weights, Clip's bounds, Resize's scales...) is frozen to the value of the first run,
  and the model is compiled for it; a later run with another value is refused (:class:`ValueError`).
* **Opsets** above the frontend's (:data:`.frontend.onnx_frontend.SUPPORTED_OPSETS`) are compiled as its highest
  when every node's operator is the same there (same documentation, attributes, inputs and outputs: the later
  revision only widened element types); otherwise the frontend's :class:`UnsupportedOpsetError`.

An unsupported model raises the frontend's own error unchanged (:class:`UnsupportedOperatorError`, one listing
every unsupported node); the model is imported in :meth:`VtaBackend.prepare` unless it needs its first run's values
(constant inputs, dynamic dimensions), then in that run. Results are int8 values read back as float32: they match a
float reference to within the quantization steps :attr:`VtaBackendRep.input_step` and
:attr:`VtaBackendRep.output_steps` name, not to float32's precision.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from vta.backend import backend_info, unavailable_reason
from vta.config import VTAConfig

from .frontend.calibration import _checked
from .frontend.onnx_frontend import SUPPORTED_OPSETS
from .frontend.prequant import complete_partial, import_model
from .frontend.quantize import quantize
from .ir import Graph
from .pipeline import check_inputs, compile_graph
from .runtime.compiled import Compiled
from .runtime.executor import run

__all__ = ["VtaBackend", "VtaBackendRep", "DEVICES", "CONSTANT_INPUTS", "restamp"]

DEVICES = ("fsim", "cpu", "tsim")
"""The targets a model runs on (:mod:`vta.backend`): the functional simulator (accelerator layers, the rest on the
CPU fallback), the CPU alone, or the RTL simulation. onnx's ``"CPU"`` is ``cpu``; case does not matter."""

CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "BatchNormalization": (1, 2, 3, 4),
    "Sub": (1,), "Mul": (1,), "Div": (1,),
    "Clip": (1, 2), "Pad": (1, 2, 3), "Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "ReduceMean": (1,),
    "Resize": (1, 2, 3), "LayerNormalization": (1, 2), "Gather": (1,), "Slice": (1, 2, 3, 4), "Split": (1,),
    "Where": (0,), "GatherElements": (1,), "Expand": (1,), "RMSNormalization": (1,), "RotaryEmbedding": (1, 2),
    "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2), "GatherND": (1,), "CumSum": (1,), "Trilu": (1,),
    "CausalConvWithState": (1, 2), "ConvTranspose": (1, 2), "Col2Im": (1, 2), "LSTM": (1, 2, 3, 4, 7),
    "GRU": (1, 2, 3, 4), "ScatterND": (1,), "ScatterElements": (1,),
    "RNN": (1, 2, 3, 4),
    **{op: (1,) for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceSumSquare",
                           "ReduceLogSum", "ReduceLogSumExp", "ReduceProd")},
}
"""Operator -> the input positions the frontend takes only as constants (weights and biases, the second operand of
Sub/Mul/Div, shapes, axes, pads, bounds, Resize's roi, scales and sizes, indices, Where's condition); a graph input
there is frozen."""

_OPTIONS = ("config", "calibration")


class VtaBackendRep(BackendRep):
    """A model prepared for one target; :meth:`run` compiles it on its first call when it could not be compiled
    in :meth:`VtaBackend.prepare` (calibration on that call's inputs, constant inputs frozen to its values)."""

    def __init__(self, model: onnx.ModelProto, *, target: str, cfg: VTAConfig,
                 calibration: Mapping[str, np.ndarray] | None) -> None:
        self.target = target
        self.cfg = cfg
        self._model = model
        initializers = {init.name for init in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in initializers]
        """The model's inputs, in the order :meth:`run` takes a sequence of arrays."""
        self.output_names = [vi.name for vi in model.graph.output]
        declared = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
        self._output_dtypes = [onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
                               if vi.type.tensor_type.elem_type in declared else np.dtype(np.float32)
                               for vi in model.graph.output]
        """What :meth:`run` returns each output as: the model's float16, bfloat16 or float64, else float32."""
        self.frozen = _constant_inputs(model, self.input_names)
        """Input name -> its frozen value (None until the first run gives it)."""
        self._calibration = calibration
        self._graph: Graph | None = None
        self._compiled: Compiled | None = None
        if not self.frozen and all(_static(vi) for vi in model.graph.input):
            self._graph = import_model(model)
            if self._graph.is_quantized or calibration is not None:
                self._compile(None)

    @property
    def compiled(self) -> Compiled | None:
        """The compiled model (its quantized graph, steps and config); None before it is compiled."""
        return self._compiled

    @property
    def input_step(self) -> float:
        """The largest quantization step of the model's inputs (their Quantize scale), in input units."""
        return max(node.attrs["scale"] for node in self._quantized().nodes if node.op in ("Quantize", "QuantizeZp"))

    @property
    def output_steps(self) -> list[float]:
        """Each output's quantization step (its Dequantize scale), in output units, in the model's output order;
        0.0 for an output that is not dequantized (it is exact)."""
        graph = self._quantized()
        steps = {node.outputs[0]: node.attrs["scale"] for node in graph.nodes
                 if node.op in ("Dequantize", "DequantizeZp")}
        return [float(steps.get(name, 0.0)) for name in graph.outputs]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """The outputs (float32 arrays, or the model's float16/bfloat16/float64, in the model's output order, also by
        name) for ``inputs``: a sequence of arrays in :attr:`input_names` order, a mapping name -> array, or one
        array for a one-input model."""
        if kwargs:
            raise TypeError(f"VtaBackendRep.run takes no options, not {', '.join(sorted(kwargs))}")
        values = self._named(inputs)
        if self._compiled is None:
            self._compile(values)
        assert self._compiled is not None
        self._check_frozen(values)
        graph = self._compiled.graph
        data = check_inputs(graph, {name: values[name] for name in graph.inputs}, "the input")
        outputs = run(self._compiled, data, target=self.target).outputs
        arrays = [np.asarray(outputs[name], dtype=dtype) for name, dtype in zip(graph.outputs, self._output_dtypes)]
        return namedtupledict("Outputs", self.output_names)(*arrays)

    # ---- the first run ----------------------------------------------------------------------------------------------
    def _named(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            named = dict(inputs)
        elif isinstance(inputs, np.ndarray):
            named = dict(zip(self.input_names, [inputs]))
        elif isinstance(inputs, Sequence):
            if len(inputs) != len(self.input_names):
                raise ValueError(f"run got {len(inputs)} arrays; the model takes {len(self.input_names)} inputs "
                                 f"({', '.join(self.input_names)})")
            named = dict(zip(self.input_names, inputs))
        else:
            raise TypeError(f"run takes a list of arrays, a dict name -> array or one array, not "
                            f"{type(inputs).__name__}")
        missing = [name for name in self.input_names if name not in named]
        extra = sorted(set(named) - set(self.input_names))
        if missing or extra:
            raise ValueError(f"run got inputs {', '.join(map(repr, sorted(named))) or 'none'}; the model's inputs are "
                             f"{', '.join(map(repr, self.input_names))}")
        return {name: np.asarray(value) for name, value in named.items()}

    def _compile(self, values: dict[str, np.ndarray] | None) -> None:
        """Import (when :meth:`__init__` could not), quantize (calibrating on ``values`` without ``calibration``)
        and compile."""
        if self._graph is None:
            assert values is not None
            for name in self.frozen:
                self.frozen[name] = values[name]
            shapes = {vi.name: values[vi.name].shape for vi in self._model.graph.input
                      if vi.name in values and vi.name not in self.frozen and vi.type.HasField("tensor_type")
                      and not _static(vi)}
            self._graph = import_model(_freeze(self._model, self.frozen), input_shapes=shapes or None)
        graph = self._graph
        if not graph.is_quantized:
            if self._calibration is not None:
                samples = _checked(graph, {k: np.asarray(v) for k, v in self._calibration.items()}, "calibration=")
            else:
                assert values is not None
                samples = check_inputs(graph, {name: values[name] for name in graph.inputs}, "the first run's input")
            done = complete_partial(graph, samples) if graph.partial is not None else None   # the file's integers
            graph = done[0] if done is not None else quantize(graph, samples)
        elif self._calibration is not None:
            raise ValueError("calibration= is given, but the model is pre-quantized: it is compiled with its own "
                             "scales; drop calibration=")
        self._compiled = compile_graph(graph, self.cfg)

    def _check_frozen(self, values: dict[str, np.ndarray]) -> None:
        for name, value in self.frozen.items():
            if not np.array_equal(values[name], value):
                raise ValueError(f"input {name!r} is a constant of the compiled model (an operator's weight or "
                                 f"parameter, frozen at the first run to {_short(value)}); this run gives "
                                 f"{_short(values[name])}. Prepare the model again for other values.")

    def _quantized(self) -> Graph:
        if self._compiled is None:
            raise RuntimeError("the model is not compiled yet: its quantization steps are known after the first run "
                               "(or prepare it with calibration=)")
        return self._compiled.graph


class VtaBackend(Backend):
    """The lab as an ONNX backend (see the module doc). ``prepare``'s keywords: ``config`` (a
    :class:`vta.config.VTAConfig`, default VTA's) and ``calibration`` (input name -> ``[N, ...]`` batch)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "fsim", **kwargs: Any) -> VtaBackendRep:
        """``model`` ready to run on ``device`` (:data:`DEVICES`); imported now when it can be (an unsupported
        model raises the frontend's error here), compiled now when its calibration is known."""
        unknown = sorted(set(kwargs) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"VtaBackend.prepare got unknown option{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(unknown)}; its options are {', '.join(_OPTIONS)}")
        if not isinstance(model, onnx.ModelProto):
            raise TypeError(f"VtaBackend.prepare takes an onnx.ModelProto, not {type(model).__name__}")
        cfg = kwargs.get("config") or VTAConfig()
        if not isinstance(cfg, VTAConfig):
            raise TypeError(f"config must be a VTAConfig, not {type(cfg).__name__}")
        calibration = kwargs.get("calibration")
        if calibration is not None and not isinstance(calibration, Mapping):
            raise TypeError(f"calibration must be a dict input name -> [N, ...] array, not "
                            f"{type(calibration).__name__}")
        target = _target(device)
        return VtaBackendRep(restamp(onnx.ModelProto.FromString(model.SerializeToString())), target=target,
                             cfg=cfg, calibration=calibration)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "fsim", **kwargs: Any) -> tuple[Any, ...]:
        """``prepare(model, device, **kwargs).run(inputs)``."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "fsim",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """One node run on ``inputs`` (one array per input of the node, in order): a one-node model at opset
        ``opset_version`` (default the frontend's highest), calibrated on ``inputs``."""
        opset = int(kwargs.pop("opset_version", SUPPORTED_OPSETS[1]))
        super().run_node(node, inputs, device, outputs_info, opset_version=opset)  # type: ignore[arg-type]  # onnx types **kwargs as dicts
        arrays = [np.asarray(value) for value in inputs]
        names = [name for name in node.input if name]
        graph_inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype),
                                                           value.shape) for name, value in zip(names, arrays)]
        graph_outputs = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                         for name in node.output if name]
        graph = onnx.helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        return cls.run_model(model, dict(zip(names, arrays)), device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True for a device of :data:`DEVICES` (or onnx's ``"CPU"``) that can run on this machine."""
        try:
            target = _target(device)
        except ValueError:
            return False
        return unavailable_reason(target) is None


def _target(device: str) -> str:
    """The target (a :mod:`vta.backend` name) of an onnx device string, or ValueError naming the devices."""
    name = device.split(":")[0].lower() if isinstance(device, str) else ""
    if name not in DEVICES:
        raise ValueError(f"device {device!r} is not one of the lab's: {', '.join(DEVICES)} (onnx's 'CPU' is cpu)")
    backend_info(name)
    return name


def _static(vi: onnx.ValueInfoProto) -> bool:
    dims = vi.type.tensor_type.shape.dim
    return vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims)


def _constant_inputs(model: onnx.ModelProto, inputs: list[str]) -> dict[str, Any]:
    """The graph inputs that some node takes at a position of :data:`CONSTANT_INPUTS`, each -> None; but not int64
    token ids that a Gather looks up in a table ``[rows, width]`` (an embedding, which reads them at run time)."""
    tables = {i.name for i in model.graph.initializer if len(i.dims) == 2}
    ids = {vi.name for vi in model.graph.input if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64}
    found: dict[str, Any] = {}
    for node in model.graph.node:
        for k in CONSTANT_INPUTS.get(node.op_type, ()):
            embedding = node.op_type == "Gather" and k == 1 and node.input[0] in tables and node.input[k] in ids
            if k < len(node.input) and node.input[k] in inputs and not embedding:
                found[node.input[k]] = None
    return found


def _freeze(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs in ``values`` are initializers of those values."""
    if not values:
        return model
    out = onnx.ModelProto.FromString(model.SerializeToString())
    kept = [vi for vi in out.graph.input if vi.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name) for name, v in values.items())
    return out


def restamp(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` stamped with the frontend's highest opset when its own (above it) names the same operators (see
    the module doc); else ``model`` unchanged."""
    hi = SUPPORTED_OPSETS[1]
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version <= hi:
        return model
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            return model
        try:
            new, old = onnx.defs.get_schema(node.op_type, opset.version), onnx.defs.get_schema(node.op_type, hi)
        except onnx.defs.SchemaError:
            return model
        if new.doc != old.doc or sorted(new.attributes) != sorted(old.attributes) or \
                [i.name for i in new.inputs] != [i.name for i in old.inputs] or \
                [o.name for o in new.outputs] != [o.name for o in old.outputs]:
            return model
    opset.version = hi
    return model


def _short(value: np.ndarray) -> str:
    """A value for a message: the array when small, else its shape and a digest of its contents."""
    value = np.asarray(value)
    if value.size <= 8:
        return np.array2string(value.ravel(), precision=4)
    return f"a {value.shape} array with sum {float(value.astype(np.float64).sum()):.6g}"
