"""The compile pipeline as a library: load -> quantize -> partition -> lower -> schedule -> codegen -> artefact.

The command line (:mod:`.cli`), the scripts and the tests all compile through these functions.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from vta.config import VTAConfig

from .codegen import ConvLayer, build_add_program, build_conv_program
from .intrin import intrinsics
from .ir import Graph, Node, node_macs
from .layout import packed_activation_shape
from .partition import lower_node, partition
from .runtime import AccelStep, Compiled, CpuStep, Step, _progress

__all__ = ["load_graph", "compile_model", "compile_graph"]


def load_graph(model: str, *, batch: int | None = None) -> Any:
    """The float :class:`~.ir.Graph` of a zoo name or an ONNX path."""
    from . import zoo
    from .onnx_frontend import import_onnx
    if os.path.exists(model):
        path = Path(model)
    elif model in zoo.list_models():
        path = zoo.get_model(model)
    else:
        raise ValueError(f"model {model!r} is neither a file nor a zoo model; zoo models are "
                         f"{', '.join(zoo.list_models())}")
    return import_onnx(path, batch=batch or 1)


def _random_inputs(graph: Any, seed: int, samples: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        shape = graph.shape(name)
        out[name] = rng.standard_normal((shape[0] * samples,) + tuple(shape[1:])).astype(np.float32)
    return out


def _calibration_inputs(model: str, graph: Any, seed: int, samples: int) -> dict[str, np.ndarray]:
    """Real calibration inputs where the zoo has them (real photos for efficientnet_lite0), else seeded random ones."""
    from . import zoo
    real = zoo.calibration_data(model) if model in zoo.list_models() else None
    if real is None or len(graph.inputs) != 1 or graph.shape(graph.inputs[0])[0] != 1:
        return _random_inputs(graph, seed, samples)
    return {graph.inputs[0]: np.ascontiguousarray(real, dtype=np.float32)}


def compile_model(model: str, cfg: Any, *, policy: str = "auto", force_cpu: list[str] | tuple[str, ...] = (),
                  batch: int | None = None, calib: int = 4, seed: int = 0, double_buffer: bool = True,
                  progress: bool = False) -> Any:
    """Import, quantize (on the zoo's real calibration images where it has them, else ``calib`` seeded random
    samples) and compile ``model``; returns the Compiled."""
    from .quantize import quantize
    from .runtime import compile_graph
    start = time.perf_counter()
    graph = load_graph(model, batch=batch)
    qgraph = quantize(graph, _calibration_inputs(model, graph, seed + 1, max(calib, 1)))
    compiled = compile_graph(qgraph, cfg, policy=policy, force_cpu=force_cpu, double_buffer=double_buffer,
                             progress=progress)
    compiled.meta.update({"model": model, "frontend_seconds": round(time.perf_counter() - start -
                                                                    compiled.compile_seconds, 3)})
    return compiled


def _accel_step(graph: Graph, node: Node, cfg: VTAConfig, threads: int) -> AccelStep:
    lowered = lower_node(graph, node, cfg)
    layer = lowered.layer
    if isinstance(layer, ConvLayer):
        program, code = build_conv_program(cfg, layer, threads=threads)
        inputs = [node.inputs[0]]
        t = code.tiling
        tiling = f"oc{t.oc_tile} ic{t.ic_tile} oh{t.oh_tile} ow{t.ow_tile}" if t else ""
        tiling += f" kh{t.kh_tile}" if t and t.kh_tile < t.geom.kh else ""
        tiling += " kw-folded" if lowered.fold else ""
        macs = node_macs(graph, node)
    else:
        intr = intrinsics(cfg)
        program, code = build_add_program(cfg, layer, packed_activation_shape(layer.shape, intr.batch,
                                                                              intr.block_in), threads=threads)
        inputs = list(node.inputs[:2])
        tiling = f"{code.tiles} tiles"
        macs = 0
    return AccelStep(node, program, inputs, node.outputs[0], macs, code.gemm_uops, code.alu_uops, code.tiles,
                     tiling, lowered.fold)


def compile_graph(graph: Graph, cfg: VTAConfig, *, policy: str = "auto", force_cpu: Iterable[str] = (),
                  double_buffer: bool = True, progress: bool = False) -> Compiled:
    """Partition ``graph`` and generate a program for every accelerator node (see :func:`.partition.partition`).

    ``double_buffer=False`` generates single-threaded programs (no latency hiding), to measure what it buys."""
    start = time.perf_counter()
    decisions = partition(graph, cfg, policy=policy, force_cpu=frozenset(force_cpu))
    steps: list[Step] = []
    nodes = _progress(graph.nodes, progress, "compile")
    for node in nodes:
        if decisions[node.name].target == "accel":
            steps.append(_accel_step(graph, node, cfg, 2 if double_buffer else 1))
        else:
            steps.append(CpuStep(node, decisions[node.name].macs))
    return Compiled(cfg, graph, steps, decisions, time.perf_counter() - start, {"double_buffer": double_buffer})
