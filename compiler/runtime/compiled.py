"""The compiled artefact's data model: what :func:`.pipeline.compile_graph` produces and a ``.vtac`` file holds.

A :class:`Compiled` is a list of steps in graph order, each either an :class:`AccelStep` (one accelerator
:class:`~vta.program.Program` per layer, with the bindings of its packed input/output allocations to graph tensors)
or a :class:`CpuStep` (a graph node run by the CPU kernels of :mod:`..kernels.cpu`, or by the integer reference
:mod:`..qops` where no kernel exists). It is saved to and loaded from one file (:meth:`Compiled.save`,
:meth:`Compiled.load`; the format is :mod:`.artefact`: plain arrays and a JSON manifest, no pickle). The executor
(:mod:`.executor`) runs it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, Iterable, Mapping

import numpy as np

from vta.config import VTAConfig
from vta.program import Program

from ..ir import Graph, Node, value_from_data, value_to_data
from ..lowering.partition import ColumnFold, Decision
from .artefact import FORMAT_VERSION as ARTEFACT_VERSION
from .artefact import read_artefact, write_artefact

__all__ = ["AccelStep", "CpuStep", "Step", "Compiled", "ARTEFACT_VERSION", "layer_programs"]


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
    """``items`` with a progress display (:func:`vta.progress.progress`: a bar on a terminal, a line per layer
    at most once a second elsewhere) when ``enabled``."""
    if not enabled:
        return items
    from vta.progress import progress
    return progress(items, desc=desc, unit="layer")


def layer_programs(path: str | PathLike[str]) -> list[tuple[str, Program]]:
    """``(layer name, program)`` of every accelerator layer of the artefact at ``path``, in graph order (what
    :func:`vta.programfile.read_programs` returns for a ``.vtac``: ``vta disasm`` and ``vta tsim run`` take it)."""
    compiled = Compiled.load(path)
    return [(step.node.name, step.program) for step in compiled.steps if isinstance(step, AccelStep)]
