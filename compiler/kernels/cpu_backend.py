"""The ``cpu`` backend: runs graph operators on the CPU with the llvmlite kernels of :mod:`.cpu`.

It is the fallback for what the accelerator does not run, and with ``--target cpu`` it runs every node of a model
(the baseline). Registered in :data:`vta.backend.BACKENDS`; use ``vta.backend.get_backend("cpu")``. Outputs equal
:func:`.qops.run_node` bit for bit: ops without a kernel, and :data:`REFERENCE_OPS`, run the integer reference.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from vta.backend import Backend

from .. import qops
from ..ir import Graph, Node

__all__ = ["CpuBackend", "REFERENCE_OPS"]

REFERENCE_OPS = frozenset({"Softmax"})
"""Ops run by the integer reference even on the CPU path: the JIT softmax may differ from numpy's in the last bits
of float32, and the run's outputs must equal :func:`.qops.run_reference` bit for bit."""


def _cpu_runner(op: str) -> Callable[[Graph, Node, Mapping[str, np.ndarray]], np.ndarray]:
    """``run_node(graph, node, values)`` for ``op``: the llvmlite kernels of :mod:`.cpu`, else :mod:`.qops`."""
    if op in REFERENCE_OPS:
        return qops.run_node
    try:
        from . import cpu
    except ImportError:
        return qops.run_node
    return getattr(cpu, "run_node", qops.run_node)


class CpuBackend(Backend):
    """Graph operators on the CPU (llvmlite JIT kernels, the integer reference where there is no kernel)."""

    name = "cpu"
    runs_programs = False
    runs_operators = True

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"the cpu backend takes no options, not {', '.join(sorted(options))}")

    def run_node(self, graph: Any, node: Any, values: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.asarray(_cpu_runner(node.op)(graph, node, values))
