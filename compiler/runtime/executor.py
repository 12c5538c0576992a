"""The runtime: executes a :class:`~.compiled.Compiled` model on a backend.

:func:`run` executes it: ``target`` ``fsim`` or ``tsim`` runs accelerator steps on that backend; ``cpu`` runs every
node on the CPU path (the baseline). Tensors between steps keep the layout their producer wrote: consecutive
accelerator layers pass packed arrays ``(N/B, C/BI, H, W, B, BI)`` straight through, and a tensor is converted
(packed or unpacked) only where a CPU step reads an accelerator output or the reverse: at partition boundaries.
A QMatMul's operands and output are converted to and from its own layouts (:mod:`..lowering.matmul`): ``a`` as an
input image, ``b`` as weights, the output from an image of ``G*N`` channels. So are a QDense's lowered over its rows
(:mod:`..lowering.dense_rows`): its input ``[N, K]`` as the image ``[1, K, N, 1]``, its output from ``[1, O, N, 1]``.
The outputs equal :func:`..qops.run_reference` bit for bit.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from vta.backend import Backend, backend_info, get_backend, operator_backends
from vta.config import VTAConfig

from ..ir import Graph, Node
from ..lowering.dense_rows import pack_rows, reads_rows, unpack_rows
from ..lowering.gelu import gelu_view
from ..lowering.intrin import intrinsics
from ..lowering.layernorm import layernorm_view
from ..lowering.layout import (
    INPUT,
    INPUT_B,
    OUTPUT,
    fold_kernel_columns,
    im2col_packed,
    pack_activation,
    unpack_activation,
)
from ..lowering.matmul import WEIGHT, image_shape, matmul_dims, pack_a, pack_b, pack_b_image, unpack_out
from ..lowering.partition import ColumnFold
from .compiled import AccelStep, Compiled, _progress

__all__ = ["LayerStat", "RunOutput", "run", "RuntimeFailure"]


class RuntimeFailure(RuntimeError):
    """A compiled model could not be run (bad inputs, a backend failure); the message names the layer."""


# ---- running ------------------------------------------------------------------------------------------------------
@dataclass
class LayerStat:
    """What one step did: where it ran, MACs, micro-ops, cycles (tsim), bytes moved (DMA), wall time (seconds)."""

    layer: str
    op: str
    where: str
    macs: int
    gemm_uops: int = 0
    alu_uops: int = 0
    cycles: int | None = None
    bytes_moved: int = 0
    seconds: float = 0.0
    conversions: int = 0
    modules: dict[str, dict[str, int]] | None = None
    """tsim only: module (fetch, load, compute, store) -> cycle class (busy, wait_token, wait_mem) -> cycles, from
    the core's performance counters (see :mod:`vta.counters`)."""
    counters: dict[str, int] | None = None
    """Accelerator layers: the backend's event statistics (names of :mod:`vta.counters`: ``macs``, micro-ops, bytes
    per memory type such as ``wgt_bytes_read``), None on an operator backend."""


@dataclass
class RunOutput:
    """The outputs of a run (graph output name -> NCHW array) and one :class:`LayerStat` per step."""

    outputs: dict[str, np.ndarray]
    layers: list[LayerStat]
    target: str
    config: str
    setup_seconds: float = 0.0
    """Wall-clock seconds the target took to get ready before the first step (:meth:`vta.backend.Backend.prepare`:
    tsim's Verilator build or its load from the cache), apart from every step's seconds."""


class _Values:
    """Tensor values in whichever layout they were produced: ``nchw`` arrays or packed arrays."""

    def __init__(self, graph: Graph, cfg: VTAConfig) -> None:
        self.graph = graph
        intr = intrinsics(cfg)
        self.intr = intr
        self.batch, self.block = intr.batch, intr.block_in
        self.nchw: dict[str, np.ndarray] = {}
        self.packed: dict[str, np.ndarray] = {}
        self.conversions = 0

    def get_nchw(self, name: str) -> np.ndarray:
        if name in self.graph.constants:
            return self.graph.constants[name]
        if name not in self.nchw:
            self.nchw[name] = unpack_activation(self.packed[name], self.graph.shape(name))
            self.conversions += 1
        return self.nchw[name]

    def get_folded(self, name: str, fold: ColumnFold) -> np.ndarray:
        """``name`` with its kernel columns (or whole window: im2col) folded into channels, packed (a conversion,
        cached)."""
        key = f"{name}#fold" + ".".join(str(v) for v in dataclasses.astuple(fold))
        if key not in self.packed:
            if fold.kh:
                self.packed[key] = im2col_packed(self.get_nchw(name), kh=fold.kh, kw=fold.kw, sh=fold.sh, sw=fold.sw,
                                                 pads=(fold.pad_top, fold.pad_left, fold.pad_bottom, fold.pad_right),
                                                 bias_lanes=fold.bias_lanes, batch=self.batch, block=self.block)
            else:
                folded = fold_kernel_columns(self.get_nchw(name), kw=fold.kw, sw=fold.sw, pad_left=fold.pad_left,
                                             pad_right=fold.pad_right)
                self.packed[key] = pack_activation(folded, batch=self.batch, block=self.block)
            self.conversions += 1
        return self.packed[key]

    def get_packed(self, name: str) -> np.ndarray:
        if name not in self.packed:
            self.packed[name] = pack_activation(self.get_nchw(name), batch=self.batch, block=self.block)
            self.conversions += 1
        return self.packed[name]


def _stat_bytes(stats: Mapping[str, int]) -> int:
    return int(sum(v for k, v in stats.items() if k.endswith("_bytes_read") or k.endswith("_bytes_written")
                   or k.endswith("bytes_loaded") or k.endswith("bytes_stored")))


def _matmul_operands(step: AccelStep, values: _Values) -> dict[str, np.ndarray]:
    """A QMatMul's operands in its program's layouts (:mod:`..lowering.matmul`): ``a`` as the input image, ``b``
    (unless a constant, packed at compile time) as the blocked weights or, for a program whose load unit gathers
    them, as an activation image: two conversions."""
    graph, intr = values.graph, values.intr
    a_name, b_name = step.node.inputs[0], step.node.inputs[1]
    dims = matmul_dims(graph.shape(a_name), graph.shape(b_name), intr)
    bound = {INPUT: pack_a(values.get_nchw(a_name), dims, intr)}
    values.conversions += 1
    if b_name not in graph.constants:  # the weight allocation's shape says which path the program takes
        as_image = step.program.allocation(WEIGHT).shape == image_shape(dims, intr)
        bound[WEIGHT] = (pack_b_image if as_image else pack_b)(values.get_nchw(b_name), dims, intr)
        values.conversions += 1
    return bound


def _gelu_view(step: AccelStep, values: _Values) -> tuple[int, ...] | None:
    """The 2-D shape a QGelu step's tensor is packed as when its rank is not 2 or 4
    (:func:`..lowering.gelu.gelu_view`), or a QILayerNorm's or QISoftmax's when its rank is not 2
    (:func:`..lowering.layernorm.layernorm_view`), else None."""
    shape = values.graph.shape(step.inputs[0])
    if step.node.op in ("QILayerNorm", "QISoftmax") and len(shape) != 2:  # rows over the last axis, any rank
        return layernorm_view(shape)
    if step.node.op != "QGelu" or len(shape) in (2, 4):
        return None
    return gelu_view(shape)


def _run_accel(step: AccelStep, values: _Values, backend: Any) -> LayerStat:
    first = step.inputs[0]
    matmul = step.node.op == "QMatMul"
    view = _gelu_view(step, values)
    rows = step.node.op == "QDense" and reads_rows(step.program, values.graph.shape(first), values.intr)
    if matmul:
        bound = _matmul_operands(step, values)
    elif rows:  # a QDense over its rows: its input as the image [1, K, N, 1]
        bound = {INPUT: pack_rows(values.get_nchw(first), values.intr)}
        values.conversions += 1
    elif view is not None:  # a QGelu over a tensor of rank 3 (or 1, 5, ...): packed as its 2-D view
        bound = {INPUT: pack_activation(values.get_nchw(first).reshape(view), batch=values.batch,
                                        block=values.block)}
        values.conversions += 1
    else:
        bound = {INPUT: values.get_folded(first, step.fold) if step.fold else values.get_packed(first)}
    if len(step.inputs) > 1:
        bound[INPUT_B] = values.get_packed(step.inputs[1])
    program = step.program.with_data(bound)
    try:
        result = backend.run(program)
    except Exception as err:  # a backend failure is reported with the layer that caused it
        raise RuntimeFailure(f"layer {step.node.name!r} ({step.node.op}) failed on {backend.name}: {err}") from err
    if matmul:
        dims = matmul_dims(values.graph.shape(step.node.inputs[0]), values.graph.shape(step.node.inputs[1]),
                           values.intr)
        values.nchw[step.output] = unpack_out(program.read(OUTPUT, result.dram), dims, values.intr)
        values.conversions += 1
    elif rows:
        values.nchw[step.output] = unpack_rows(program.read(OUTPUT, result.dram), values.graph.shape(step.output))
        values.conversions += 1
    elif view is not None:
        out = unpack_activation(program.read(OUTPUT, result.dram), view)
        values.nchw[step.output] = out.reshape(values.graph.shape(step.output))
        values.conversions += 1
    else:
        values.packed[step.output] = program.read(OUTPUT, result.dram)
    stats = dict(result.stats)
    return LayerStat(step.node.name, step.node.op, "accel", step.macs,
                     int(stats.get("gemm_uops", step.gemm_uops)), int(stats.get("alu_uops", step.alu_uops)),
                     result.cycles, _stat_bytes(stats), modules=_module_cycles(result.counters),
                     counters={k: int(v) for k, v in stats.items()})


def _module_cycles(counters: Mapping[str, int] | None) -> dict[str, dict[str, int]] | None:
    """Per-module cycle classes from the hardware counters, or None when the backend has no counters (fsim)."""
    from vta.counters import CYCLE_CLASSES, MODULES
    if not counters:
        return None
    return {m: {c: int(counters[f"{m}_{c}"]) for c in CYCLE_CLASSES} for m in MODULES}


def _run_operator(graph: Graph, node: Node, values: _Values, macs: int, backend: Backend) -> LayerStat:
    """Run ``node`` on an operator backend (the fallback, or every node with ``--target cpu``)."""
    args = {name: values.get_nchw(name) for name in node.inputs if name not in graph.constants}
    values.nchw[node.outputs[0]] = np.asarray(backend.run_node(graph, node, args))
    return LayerStat(node.name, node.op, getattr(backend, "where_ran", backend.name), macs)  # gpu: gpu/simt/cpu


def run(compiled: Compiled, inputs: Mapping[str, np.ndarray], *, target: str = "fsim", progress: bool = False,
        backend_options: Mapping[str, Any] | None = None, fallback: str | Backend = "cpu") -> RunOutput:
    """Execute ``compiled`` on backend ``target`` for graph inputs ``inputs`` (NCHW arrays by input name).

    A program backend (``fsim``, ``tsim``; :func:`vta.backend.program_backends`) runs the accelerator steps and
    ``fallback`` (an operator backend's name, default ``cpu``, or a constructed one such as
    ``GpuBackend(emulate=True)``) runs the rest; an operator backend given as ``target``
    (``cpu``) runs every node. ``backend_options`` go to the target backend's constructor. The target is prepared
    before the first step (a build, timed apart as ``setup_seconds``), so no step's seconds include it.
    """
    info = backend_info(target)
    graph = compiled.graph
    values = _Values(graph, compiled.cfg)
    for name in graph.inputs:
        if name not in inputs:
            raise RuntimeFailure(f"input {name!r} is missing; the model takes {', '.join(graph.inputs)}")
        arr = np.asarray(inputs[name])
        if arr.shape != graph.shape(name):
            raise RuntimeFailure(f"input {name!r} has shape {arr.shape}; the model expects {graph.shape(name)}")
        values.nchw[name] = arr
    accel = None
    if info.runs_operators:
        operators = get_backend(target, **dict(backend_options or {}))
    else:
        if isinstance(fallback, Backend):
            operators = fallback
        elif not backend_info(fallback).runs_operators:
            raise ValueError(f"the fallback must be an operator backend ({', '.join(operator_backends())}), "
                             f"not {fallback!r}")
        else:
            operators = get_backend(fallback)
        if compiled.accel_steps:
            accel = get_backend(target, **dict(backend_options or {}))
    setup = time.perf_counter()
    if accel is not None:
        accel.prepare(compiled.cfg)
    setup_seconds = time.perf_counter() - setup
    layers = []
    for step in _progress(compiled.steps, progress, target):
        before = values.conversions
        start = time.perf_counter()
        if isinstance(step, AccelStep) and accel is not None:
            stat = _run_accel(step, values, accel)
        else:
            stat = _run_operator(graph, step.node, values, step.macs, operators)
        stat.seconds = time.perf_counter() - start
        stat.conversions = values.conversions - before
        layers.append(stat)
    outputs = {name: values.get_nchw(name) for name in graph.outputs}
    return RunOutput(outputs, layers, target, compiled.cfg.name, setup_seconds)
