"""The compiled artefact and the runtime that executes it on a backend.

:func:`.pipeline.compile_graph` turns a quantized :class:`~.ir.Graph` into a :class:`Compiled` artefact: a list of
steps in graph order, each either an :class:`AccelStep` (one accelerator :class:`~vta.program.Program` per layer,
with the bindings of its packed input/output allocations to graph tensors) or a :class:`CpuStep` (a graph node run by
the CPU kernels of :mod:`.cpu`, or by the integer reference :mod:`.qops` where no kernel exists). The artefact is
saved to and loaded from one file (:meth:`Compiled.save`, :meth:`Compiled.load`; the format is
:mod:`.artefact`: plain arrays and a JSON manifest, no pickle).

:func:`run` executes it: ``target`` ``fsim`` or ``tsim`` runs accelerator steps on that backend; ``cpu`` runs every
node on the CPU path (the baseline). Tensors between steps keep the layout their producer wrote: consecutive
accelerator layers pass packed arrays ``(N/B, C/BI, H, W, B, BI)`` straight through, and a tensor is converted
(packed or unpacked) only where a CPU step reads an accelerator output or the reverse: at partition boundaries.
The outputs equal :func:`.qops.run_reference` bit for bit.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Iterable, Mapping

import numpy as np

from vta.backend import Backend, backend_info, get_backend, operator_backends
from vta.config import VTAConfig
from vta.program import Program

from ..ir import Graph, Node, value_from_data, value_to_data
from ..lowering.codegen import INPUT, INPUT_B, OUTPUT, with_inputs
from ..lowering.intrin import intrinsics
from ..lowering.layout import fold_kernel_columns, im2col_packed, pack_activation, unpack_activation
from ..lowering.partition import ColumnFold, Decision
from .artefact import FORMAT_VERSION as ARTEFACT_VERSION
from .artefact import read_artefact, write_artefact

__all__ = ["AccelStep", "CpuStep", "Compiled", "LayerStat", "RunOutput", "run",
           "RuntimeFailure", "ARTEFACT_VERSION", "layer_programs"]



class RuntimeFailure(RuntimeError):
    """A compiled model could not be run (bad inputs, a backend failure); the message names the layer."""


@dataclass
class AccelStep:
    """An accelerator layer: ``program`` reads packed ``inputs`` (graph tensor names bound to allocations ``x`` and
    ``x_b``) and writes packed ``output`` (allocation ``y``). ``node`` is the graph node (for the CPU target).
    ``fold``: the first input's kernel columns (or whole kernel window) are folded into channels before packing
    (see ``ColumnFold``)."""

    node: Node
    program: Program
    inputs: list[str]
    output: str
    macs: int
    gemm_uops: int
    alu_uops: int
    tiles: int
    tiling: str
    fold: ColumnFold | None = None
    schedule: dict[str, Any] = field(default_factory=dict)
    """The tiling the schedule search chose, as plain JSON-able data (tile sizes in blocks/rows/columns, ``threads``,
    loop ``order``, ``bias_load``; a residual add's ``tiles``) and the ``bound`` module the cycle model names."""
    predicted_cycles: int = 0
    """The cycle model's prediction for ``program`` (:func:`.cost.estimate`), cycles."""

    @property
    def where(self) -> str:
        return "accel"


@dataclass
class CpuStep:
    """A node run on the CPU (NCHW tensors)."""

    node: Node
    macs: int

    @property
    def where(self) -> str:
        return "cpu"


Step = AccelStep | CpuStep


@dataclass
class Compiled:
    """A compiled model: the config, the quantized graph (constants for CPU steps), the steps and the decisions.

    ``compile_seconds`` and ``frontend_seconds`` are this process's wall times (seconds) of the compile and of the
    import and quantization before it; they are facts of a run, not of the model, so the artefact does not store
    them (the same model, config and options give the same ``.vtac`` bytes) and a loaded artefact has ``None``."""

    cfg: VTAConfig
    graph: Graph
    steps: list[Step]
    decisions: dict[str, Decision]
    compile_seconds: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    frontend_seconds: float | None = None

    @property
    def accel_steps(self) -> int:
        return sum(isinstance(s, AccelStep) for s in self.steps)

    def save(self, path: str | PathLike[str]) -> None:
        """Write the artefact to one file, atomically (a zip of plain arrays and a JSON manifest, no pickle; see
        :mod:`.artefact`)."""
        body, arrays = self.to_data()
        write_artefact(path, self.cfg, body, arrays)

    @classmethod
    def load(cls, path: str | PathLike[str]) -> "Compiled":
        """Read a file written by :meth:`save`; raises :class:`~.artefact.ArtefactError` (a ValueError) naming the
        file and the problem when it is not an intact artefact of this version."""
        return read_artefact(path, cls.from_data)

    def to_data(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The artefact as JSON-able data plus plain arrays keyed by member name: the graph's (``graph/...``, see
        :meth:`.ir.Graph.to_data`), each accelerator program's (``steps/<k>/program/...``, see
        :meth:`vta.program.Program.to_arrays`) and any array in ``meta`` (``meta/...``). Steps name their node."""
        graph, graph_arrays = self.graph.to_data()
        arrays = {f"graph/{key}": value for key, value in graph_arrays.items()}
        steps = []
        for k, step in enumerate(self.steps):
            if self.graph.node(step.node.name) is not step.node:
                raise ValueError(f"step {k} runs a node {step.node.name!r} that is not the graph's node of that name; "
                                 f"a compiled model's steps must run the nodes of its graph")
            if isinstance(step, CpuStep):
                steps.append({"kind": "cpu", "node": step.node.name, "macs": step.macs})
                continue
            for key, value in step.program.to_arrays().items():
                arrays[f"steps/{k}/program/{key}"] = value
            fold = None if step.fold is None else dataclasses.asdict(step.fold)
            steps.append({"kind": "accel", "node": step.node.name, "program": f"steps/{k}/program",
                          "inputs": list(step.inputs), "output": step.output, "macs": step.macs,
                          "gemm_uops": step.gemm_uops, "alu_uops": step.alu_uops, "tiles": step.tiles,
                          "tiling": step.tiling, "fold": fold, "schedule": dict(step.schedule),
                          "predicted_cycles": int(step.predicted_cycles)})
        meta_arrays: dict[str, np.ndarray] = {}
        meta = value_to_data(dict(self.meta), meta_arrays, "meta")
        arrays.update(meta_arrays)
        body = {"graph": graph, "steps": steps, "decisions": [dataclasses.asdict(d) for d in self.decisions.values()],
                "meta": meta}
        return body, arrays

    @classmethod
    def from_data(cls, body: Mapping[str, Any], arrays: Mapping[str, np.ndarray], cfg: VTAConfig) -> "Compiled":
        """The artefact :meth:`to_data` described, for ``cfg``; raises ``ValueError``, ``KeyError`` or ``TypeError``
        when the data is malformed or a program was written for another config."""
        graph = Graph.from_data(body["graph"], {k[6:]: v for k, v in arrays.items() if k.startswith("graph/")})
        steps: list[Step] = []
        for k, data in enumerate(body["steps"]):
            node = graph.node(data["node"])
            if data["kind"] == "cpu":
                steps.append(CpuStep(node, int(data["macs"])))
                continue
            if data["kind"] != "accel":
                raise ValueError(f"step {k} has kind {data['kind']!r}, not 'accel' or 'cpu'")
            prefix = f"{data['program']}/"
            program = Program.from_arrays({name: arrays[prefix + name] for name in Program.ARRAY_NAMES},
                                          source=f"the program of step {k}")
            if program.cfg != cfg:
                raise ValueError(f"the program of step {k} is written for {program.cfg.name}, not for the artefact's "
                                 f"config {cfg.name}")
            fold = None if data["fold"] is None else ColumnFold(**data["fold"])
            schedule = data["schedule"]
            if not isinstance(schedule, dict):
                raise TypeError(f"the schedule of step {k} is a {type(schedule).__name__}, not a dict")
            steps.append(AccelStep(node, program, [str(name) for name in data["inputs"]], str(data["output"]),
                                   int(data["macs"]), int(data["gemm_uops"]), int(data["alu_uops"]),
                                   int(data["tiles"]), str(data["tiling"]), fold, schedule=schedule,
                                   predicted_cycles=int(data["predicted_cycles"])))
        decisions = {d["node"]: Decision(**d) for d in body["decisions"]}
        meta = value_from_data(body["meta"], arrays)
        if not isinstance(meta, dict):
            raise TypeError(f"the artefact's meta is a {type(meta).__name__}, not a dict")
        return cls(cfg, graph, steps, decisions, None, meta)


def _progress(items: list[Any], enabled: bool, desc: str) -> Iterable[Any]:
    if not enabled:
        return items
    from tqdm import tqdm
    return tqdm(items, desc=desc, unit="layer", leave=False)


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


def layer_programs(path: str | PathLike[str]) -> list[tuple[str, Program]]:
    """``(layer name, program)`` of every accelerator layer of the artefact at ``path``, in graph order (what
    :func:`vta.programfile.read_programs` returns for a ``.vtac``: ``vta disasm`` and ``vta tsim run`` take it)."""
    compiled = Compiled.load(path)
    return [(step.node.name, step.program) for step in compiled.steps if isinstance(step, AccelStep)]


@dataclass
class RunOutput:
    """The outputs of a run (graph output name -> NCHW array) and one :class:`LayerStat` per step."""

    outputs: dict[str, np.ndarray]
    layers: list[LayerStat]
    target: str
    config: str


class _Values:
    """Tensor values in whichever layout they were produced: ``nchw`` arrays or packed arrays."""

    def __init__(self, graph: Graph, cfg: VTAConfig) -> None:
        self.graph = graph
        intr = intrinsics(cfg)
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


def _run_accel(step: AccelStep, values: _Values, backend: Any) -> LayerStat:
    first = step.inputs[0]
    bound = {INPUT: values.get_folded(first, step.fold) if step.fold else values.get_packed(first)}
    if len(step.inputs) > 1:
        bound[INPUT_B] = values.get_packed(step.inputs[1])
    program = with_inputs(step.program, bound)
    try:
        result = backend.run(program)
    except Exception as err:  # a backend failure is reported with the layer that caused it
        raise RuntimeFailure(f"layer {step.node.name!r} ({step.node.op}) failed on {backend.name}: {err}") from err
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
    (``cpu``) runs every node. ``backend_options`` go to the target backend's constructor.
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
    return RunOutput(outputs, layers, target, compiled.cfg.name)
