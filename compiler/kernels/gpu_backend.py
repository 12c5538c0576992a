"""The ``gpu`` backend: graph operators as GPU kernels (:mod:`.gpu`), on a CUDA device or in the SIMT emulator.

With a CUDA device (:func:`.cuda_driver.probe`) the kernels run there through the driver API; without one,
constructing the backend raises :class:`GpuUnavailableError` unless ``emulate=True`` asks for the SIMT emulator
(:mod:`.simt`: the same kernel IR compiled for the host). Outputs equal :func:`.qops.run_node` bit for bit.

Where each operator runs: QConv2d, QDense, QAdd, QMul, QConcat, QClip, MaxPool, AvgPool, GlobalAvgPool, Quantize,
Dequantize and int8 Pad are kernels; Reshape is a view of the device buffer; Softmax (float, whose last bits the
device's ``exp`` would not reproduce) and anything else runs the integer reference on the host. After each
:meth:`GpuBackend.run_node`, :attr:`GpuBackend.where_ran` says which ("gpu", "simt" or "cpu"; the runtime's
per-layer report shows it).

Data movement: a backend instance serves one model run. Constants (weights, biases, requantization tables) are
uploaded once per graph; a node's output stays on the device, and a later node reading that same array (the object
this backend returned) uses the device copy, so activations are uploaded only where they come from elsewhere (the
accelerator, the host). Each output is also downloaded, because the runtime's contract is host arrays; the counts
are in :attr:`GpuBackend.transfers` and the kernels' times (device milliseconds from CUDA events, or the
emulator's wall clock) in :attr:`GpuBackend.kernel_ms`.
"""
from __future__ import annotations

import weakref
from math import prod
from typing import Any, Callable, Mapping

import numpy as np

from vta.backend import Backend

from .. import qops
from ..ir import Graph, GraphError, Node
from . import gpu

__all__ = ["GpuBackend", "GpuUnavailableError", "KERNEL_OPS", "HOST_OPS", "device_reason"]

HOST_OPS = frozenset({"Softmax"})
"""Ops run by the integer reference on the host even on the GPU path (float results the device would not
reproduce bit for bit)."""


class GpuUnavailableError(RuntimeError):
    """The GPU was asked for on a machine without a usable CUDA device."""


def device_reason() -> str | None:
    """None when a CUDA device can be used, else why not (a sentence starting "no CUDA device")."""
    from .cuda_driver import probe
    return probe()


def unavailable_message(reason: str) -> str:
    """The :class:`GpuUnavailableError` text: what was missing and where the work can run instead."""
    return (f"the gpu backend cannot run: {reason}; run the operators on the CPU instead (--fallback cpu, or "
            f"--target cpu), or emulate the GPU kernels on the CPU with emulate=True (--emulate-gpu)")


Values = Mapping[str, np.ndarray]
Handler = Callable[["GpuBackend", Graph, Node, Values, list[np.ndarray]], Any]


class GpuBackend(Backend):
    """Graph operators as GPU kernels. Options: ``emulate`` (run the kernels in the SIMT emulator on the host
    instead of a device; default False: a device is required), ``block`` (threads per block, default 256),
    ``device`` (the CUDA device ordinal, default 0)."""

    name = "gpu"
    runs_programs = False
    runs_operators = True

    def __init__(self, *, emulate: bool = False, block: int = 256, device: int = 0) -> None:
        if not isinstance(block, int) or not 1 <= block <= 1024:
            raise ValueError(f"block is the threads per block, 1 to 1024, not {block!r}")
        if emulate:
            from .simt import SimtDevice
            self.device: Any = SimtDevice(block=block)
        else:
            reason = device_reason()
            if reason is not None:
                raise GpuUnavailableError(unavailable_message(reason))
            from .cuda_driver import CudaDevice
            self.device = CudaDevice(ordinal=device, block=block)
        self.emulated = bool(emulate)
        self.where_ran = self.device.name
        self.kernel_ms: list[tuple[str, str, float]] = []
        """(node name, kernel name, milliseconds) per launch."""
        self.kernels: dict[tuple, gpu.Kernel] = {}
        """Every kernel launched, by key."""
        self.transfers = {"uploads": 0, "upload_bytes": 0, "downloads": 0, "download_bytes": 0}
        self._resident: dict[str, tuple[np.ndarray, Any]] = {}
        self._constants: dict[tuple[int, str], tuple[Any, Any]] = {}
        self._finalizer = weakref.finalize(self, self.device.close)

    @property
    def description(self) -> str:
        """Where the kernels run, in words (the device's name, or the emulator)."""
        return str(self.device.description)

    # ---- data movement ------------------------------------------------------------------------------------------
    def _upload(self, arr: np.ndarray) -> Any:
        self.transfers["uploads"] += 1
        self.transfers["upload_bytes"] += arr.nbytes
        return self.device.upload(arr)

    def constant(self, graph: Graph, key: str, make: Callable[[], np.ndarray]) -> Any:
        """The device copy of a per-graph constant ``key`` (uploaded on first use: ``make()``)."""
        entry = self._constants.get((id(graph), key))
        if entry is None or entry[0] is not graph:
            entry = (graph, self._upload(np.ascontiguousarray(make())))
            self._constants[(id(graph), key)] = entry
        return entry[1]

    def tensor(self, graph: Graph, name: str, values: Mapping[str, np.ndarray], dtype: Any) -> Any:
        """The device copy of tensor ``name`` as ``dtype``: a constant, the output this backend produced (when
        ``values[name]`` is the array it returned), else uploaded from ``values``."""
        if name in graph.constants:
            return self.constant(graph, name, lambda: np.asarray(graph.constants[name], dtype))
        host = values[name]
        entry = self._resident.get(name)
        if entry is not None and entry[0] is host and host.dtype == dtype:
            return entry[1]
        buf = self._upload(np.ascontiguousarray(host, dtype))
        self._resident[name] = (host, buf)
        return buf

    def _launch(self, node: Node, kernel: gpu.Kernel, bufs: list[Any]) -> None:
        self.kernels.setdefault(kernel.key, kernel)
        self.kernel_ms.append((node.name, kernel.name, self.device.launch(kernel, bufs)))

    # ---- the Backend interface ----------------------------------------------------------------------------------
    def run_node(self, graph: Any, node: Any, values: Mapping[str, np.ndarray]) -> np.ndarray:
        handler = KERNEL_OPS.get(node.op)
        if handler is None or node.op in HOST_OPS:
            if node.op not in qops.QOPS:
                raise GraphError(f"Node {node.name!r} has op {node.op!r}, which the gpu backend does not implement; "
                                 f"implemented ops are {', '.join(sorted(set(KERNEL_OPS) | HOST_OPS))}.")
            self.where_ran = "cpu"
            return np.asarray(qops.run_node(graph, node, values))
        inputs = [np.asarray(values[t] if t in values else graph.constants[t]) for t in node.inputs]
        if not _kernel_takes(node, inputs):
            self.where_ran = "cpu"
            return np.asarray(qops.run_node(graph, node, values))
        buf = handler(self, graph, node, values, inputs)
        self.where_ran = self.device.name
        host = self.device.download(buf)
        self.transfers["downloads"] += 1
        self.transfers["download_bytes"] += host.nbytes
        self._resident[node.outputs[0]] = (host, buf)
        return host


def _kernel_takes(node: Node, inputs: list[np.ndarray]) -> bool:
    """Whether the op's kernel computes exactly what the reference would on these inputs: float32 into Quantize,
    int8 activations elsewhere (Reshape: any), a non-empty Pad input."""
    x = inputs[0]
    if node.op == "Reshape":
        return True
    if node.op == "Quantize":
        return x.dtype == np.float32
    if node.op == "Pad" and x.size == 0:
        return False
    return all(v.dtype == np.int8 for v in inputs[:1 if node.op in ("QConv2d", "QDense") else len(inputs)])


# ---- one handler per op: device buffers in, the output's device buffer out ---------------------------------------
def _requant_tables(be: GpuBackend, graph: Graph, node: Node) -> list[Any]:
    r = node.attrs["requant"]
    return [be.constant(graph, f"{node.name}#multiplier", lambda: r.multiplier.astype(np.int32)),
            be.constant(graph, f"{node.name}#shift", lambda: r.shift.astype(np.int32))]


def _qconv(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
    a, r = node.attrs, node.attrs["requant"]
    x, w = inputs[0], inputs[1]
    kernel = gpu.qconv_kernel(x.shape, w.shape, a["strides"], a["pads"], a["groups"], r.lo, r.hi)
    out = be.device.empty(_conv_out_shape(x.shape, w.shape, a["strides"], a["pads"]), np.int8)
    bufs = [be.tensor(graph, node.inputs[0], values, np.int8), be.tensor(graph, node.inputs[1], values, np.int8),
            _operand_i32(be, graph, node, values, w.shape[0])] + _requant_tables(be, graph, node) + [out]
    be._launch(node, kernel, bufs)
    return out


def _operand_i32(be: GpuBackend, graph: Graph, node: Node, values: Mapping[str, np.ndarray], channels: int) -> Any:
    """The bias operand (input 2) as int32, zeros when the node has none."""
    if len(node.inputs) < 3:
        return be.constant(graph, f"{node.name}#bias", lambda: np.zeros(channels, np.int32))
    return be.tensor(graph, node.inputs[2], values, np.int32)


def _conv_out_shape(x_shape: tuple, w_shape: tuple, strides: Any, pads: Any) -> tuple[int, ...]:
    oh = (x_shape[2] + pads[0] + pads[2] - w_shape[2]) // strides[0] + 1
    ow = (x_shape[3] + pads[1] + pads[3] - w_shape[3]) // strides[1] + 1
    return (x_shape[0], w_shape[0], oh, ow)


def _qdense(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
    r = node.attrs["requant"]
    (n_, k_), o_ = inputs[0].shape, inputs[1].shape[0]
    if inputs[1].shape[1] != k_:
        raise ValueError(f"Dense input has {k_} features but weights {inputs[1].shape} expect {inputs[1].shape[1]}.")
    out = be.device.empty((n_, o_), np.int8)
    bufs = [be.tensor(graph, node.inputs[0], values, np.int8), be.tensor(graph, node.inputs[1], values, np.int8),
            _operand_i32(be, graph, node, values, o_)] + _requant_tables(be, graph, node) + [out]
    be._launch(node, gpu.qdense_kernel(n_, k_, o_, r.lo, r.hi), bufs)
    return out


def _qadd(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
    if inputs[0].shape != inputs[1].shape:
        raise ValueError(f"QAdd operands have shapes {inputs[0].shape} and {inputs[1].shape}; they must be equal.")
    out = be.device.empty(inputs[0].shape, np.int8)
    bufs = [be.tensor(graph, t, values, np.int8) for t in node.inputs[:2]] + [out]
    be._launch(node, gpu.qadd_kernel(inputs[0].size, node.attrs["requant"]), bufs)
    return out


def _rescale(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray],
             multiplier: Any, shift: int, lo: int, hi: int) -> Any:
    shape = inputs[0].shape
    mult = be.constant(graph, f"{node.name}#multiplier",
                       lambda: np.broadcast_to(np.asarray(multiplier, np.int32), shape).copy())
    out = be.device.empty(shape, np.int8)
    bufs = [be.tensor(graph, node.inputs[0], values, np.int8), mult, out]
    be._launch(node, gpu.rescale_kernel(int(np.prod(shape, dtype=np.int64)), int(shift), int(lo), int(hi)), bufs)
    return out


def _qconcat(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
    a = node.attrs
    axis = a["axis"] % inputs[0].ndim
    shape = list(inputs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in inputs)
    out = be.device.empty(shape, np.int8)
    outer, inner, offset = prod(shape[:axis]), prod(shape[axis + 1:]), 0
    for name, x, m, s in zip(node.inputs, inputs, a["multipliers"], a["shifts"]):
        kernel = gpu.concat_kernel(outer, x.shape[axis], inner, shape[axis], offset, int(m), int(s))
        be._launch(node, kernel, [be.tensor(graph, name, values, np.int8), out])
        offset += x.shape[axis]
    return out


def _pool(kind: str, global_: bool = False) -> Handler:
    def handler(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
        n_, c_, h_, w_ = inputs[0].shape
        a = node.attrs
        if global_:
            kernel_hw, strides, pads, include = (h_, w_), (1, 1), (0, 0, 0, 0), True
        else:
            kernel_hw, strides, pads = a["kernel"], a["strides"], a["pads"]
            include = bool(a.get("count_include_pad", False))
        oh = (h_ + pads[0] + pads[2] - kernel_hw[0]) // strides[0] + 1
        ow = (w_ + pads[1] + pads[3] - kernel_hw[1]) // strides[1] + 1
        out = be.device.empty((n_, c_, oh, ow), np.int8)
        kernel = gpu.pool_kernel(kind, n_ * c_, (h_, w_), (oh, ow), kernel_hw, strides, pads, include)
        be._launch(node, kernel, [be.tensor(graph, node.inputs[0], values, np.int8), out])
        return out
    return handler


def _convert(kind: str) -> Handler:
    def handler(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
        src, dst = (np.float32, np.int8) if kind == "quantize" else (np.int8, np.float32)
        out = be.device.empty(inputs[0].shape, dst)
        make = gpu.quantize_kernel if kind == "quantize" else gpu.dequantize_kernel
        kernel = make(int(np.prod(inputs[0].shape, dtype=np.int64)), float(node.attrs["scale"]))
        be._launch(node, kernel, [be.tensor(graph, node.inputs[0], values, src), out])
        return out
    return handler


def _reshape(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
    shape = inputs[0].reshape(node.attrs["shape"]).shape          # numpy's rules (-1, 0-sized) and its errors
    return be.device.view(be.tensor(graph, node.inputs[0], values, inputs[0].dtype), shape)


def _pad(be: GpuBackend, graph: Graph, node: Node, values: Values, inputs: list[np.ndarray]) -> Any:
    x, pads, value = inputs[0], node.attrs["pads"], node.attrs["value"]
    if len(pads) != 2 * x.ndim:
        raise ValueError(f"Pad needs {2 * x.ndim} pad values for a rank-{x.ndim} tensor, got {len(pads)}.")
    kernel = gpu.pad_kernel(x.shape, pads, int(np.asarray(value).astype(np.int8)))
    out_shape = tuple(d + int(pads[i]) + int(pads[i + x.ndim]) for i, d in enumerate(x.shape))
    out = be.device.empty(out_shape, np.int8)
    be._launch(node, kernel, [be.tensor(graph, node.inputs[0], values, np.int8), out])
    return out


KERNEL_OPS: dict[str, Handler] = {
    "Quantize": _convert("quantize"),
    "Dequantize": _convert("dequantize"),
    "QConv2d": _qconv,
    "QDense": _qdense,
    "QAdd": _qadd,
    "QMul": lambda be, g, n, v, x: _rescale(be, g, n, v, x, n.attrs["multiplier"], n.attrs["shift"], -128, 127),
    "QConcat": _qconcat,
    "QClip": lambda be, g, n, v, x: _rescale(be, g, n, v, x, 1, 0, n.attrs["lo"], n.attrs["hi"]),
    "MaxPool": _pool("max"),
    "AvgPool": _pool("avg"),
    "GlobalAvgPool": _pool("avg", global_=True),
    "Reshape": _reshape,
    "Pad": _pad,
}
"""Op -> ``handler(backend, graph, node, values, input arrays)`` returning the output's device buffer (input arrays
in the node's input order, constants included)."""
