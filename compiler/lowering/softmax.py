"""The integer Softmax (``QISoftmax``, :func:`..qops.isoftmax`) as an ALU-only layer on designs with the
``lane_reduce`` knob.

The int8 input ``[rows, C]`` (any rank, viewed as ``[product of the leading axes, C]``), packed as an activation
(:mod:`.layout`: a row is ``n = C / 16`` consecutive entries), is loaded once per tile of rows as ACC_8BIT into the
element region ``X``; ``Y`` (z, then ``min(z, 31)``) and ``Z`` (the polynomial, the exps, then the output) are the
other element regions. Per-row scalars live in row regions (one entry per row, the value in every lane): ``MX`` (the
row max, then its negation), ``S`` (the sum), ``B`` (its exponent b, then ``b + 11``), ``A`` (``b + g - 3``, the
mantissa's shift), ``SA`` (the mantissa a), ``R`` (the reciprocal y) and ``U`` (Newton's ``2**15 - u``). The
constants are loaded once as ACC words at the top of the acc buffer: ``M`` (m), ``P0`` (``2**(14+g)``) and ``J``
(lane j holds j), each in every lane. :func:`softmax_passes` lists the ALU steps, :func:`..qops.isoftmax_trace`'s,
one ALU instruction each over the tile's rows; ``STORE Z`` ends a tile. Tiles alternate between the two acc/out parts.
A softmax with a mask (``bias``, ``keep``/``fill``) is never a ``QISoftmax`` (:func:`integer_softmax` keeps it a
``QSoftmax`` on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vta.config import VTAConfig
from vta.program import Allocation, Program, ProgramBuilder

from ..ir import Graph, Node
from ..qops import EXP_POLY, ISOFTMAX_ATTRS, RECIP_GUESS, RECIP_NEWTON_STEPS, isoftmax_params
from .codegen import LayerCode
from .intrin import Intrinsics, intrinsics
from .layernorm import layernorm_view
from .rowwise import (
    RowOp,
    RowTiling,
    Step,
    build_alu_program,
    emit_rows,
    plan_rows,
    rows_accel_cycles,
    swap_nodes,
)

__all__ = ["SoftmaxLayer", "softmax_passes", "plan_softmax", "emit_softmax", "build_softmax_program",
           "softmax_accel_cycles", "SOFTMAX_MODES", "integer_softmax", "softmax_refusal"]

SOFTMAX_MODES = ("auto", "int", "float")
"""How a softmax (``QSoftmax``) runs: ``float`` keeps the float64 ``QSoftmax`` on the CPU; ``int`` makes every
one over the last axis without a mask the integer ``QISoftmax`` (:func:`..qops.isoftmax`), which the partitioner
places on the ALU (designs with ``lane_reduce``) or the CPU by its estimates; ``auto`` (the default) does so only
where the partitioner puts it on the accelerator, and keeps ``QSoftmax`` elsewhere (so designs without the knob
compile exactly as before)."""

ELEM_REGIONS = ("X", "Y", "Z")
ROW_REGIONS = ("MX", "S", "B", "A", "SA", "R", "U")
CONST_REGIONS = ("M", "P0", "J")
SOFTMAX = RowOp(name="Softmax", reduces="RMAX, RSUM", padded="the row max and sum", elem=ELEM_REGIONS,
                row=ROW_REGIONS, const=CONST_REGIONS, loaded=("X",), result="Z", consts_alloc="sm_consts")
"""The Softmax's regions (:class:`.rowwise.RowOp`): the input loaded into ``X``, ``Z`` stored."""
SoftmaxTiling = RowTiling


@dataclass(frozen=True)
class SoftmaxLayer:
    """An integer Softmax over the last axis of an int8 tensor seen as ``[rows, C]`` ``shape``, with the constants
    of :func:`..qops.isoftmax_params`."""

    shape: tuple[int, int]
    channels: int
    k: int
    m: int
    g: int
    mq: int
    shift: int

    @classmethod
    def from_attrs(cls, shape: tuple[int, ...], attrs: dict[str, object]) -> "SoftmaxLayer":
        """From a ``QISoftmax`` node's attributes and its tensor's shape (any rank)."""
        values = (int(attrs[a]) for a in ISOFTMAX_ATTRS)  # type: ignore[call-overload]
        return cls(layernorm_view(tuple(shape)), *values)


def _copy(dst: str, src: str) -> list[Step]:
    return [("RESET", dst, 0, ""), ("ADD", dst, src, "")]


def _row_fold(op: str, dst: str, src: str, n: int, init: int) -> list[Step]:
    """``dst`` = the row's ``op``-reduction (ADD/MAX, then RSUM/RMAX over the lanes) of ``src`` from ``init``."""
    steps: list[Step] = [("RESET", dst, 0, "")]
    if init:
        steps.append(("ADD", dst, init, ""))
    if n > 1:
        steps.append((op, dst, src, "fold"))
    return steps + [("RSUM" if op == "ADD" else "RMAX", dst, src, "last")]


def softmax_passes(layer: SoftmaxLayer, n: int) -> list[Step]:
    """The ALU steps for rows of ``n`` entries, in :func:`..qops.isoftmax_trace`'s order."""
    g = layer.g
    steps = _row_fold("MAX", "MX", "X", n, -128) + [("MUL", "MX", -1, ""), ("ADD", "X", "MX", "")]
    steps += [("MUL", "X", "M", ""), ("SHR", "X", layer.k - 15, "")]
    steps += _copy("Y", "X") + [("SHR", "Y", 15, ""), ("MUL", "Y", -1, "")]
    steps += _copy("Z", "Y") + [("SHR", "Z", -15, ""), ("ADD", "X", "Z", "")]
    steps += _copy("Z", "X") + [("MUL", "Z", EXP_POLY[1], ""), ("SHR", "Z", 15, ""), ("ADD", "Z", EXP_POLY[0], ""),
                                ("MUL", "Z", "X", ""), ("SHR", "Z", 16 - g, ""), ("ADD", "Z", "P0", "")]
    steps += [("MIN", "Y", 31, ""), ("SHR", "Z", "Y", "")]
    steps += _row_fold("ADD", "S", "Z", n, 0)
    steps += _copy("B", "S") + [("SHR", "B", g + 12, ""), ("SHR", "B", "J", ""), ("MIN", "B", 1, ""),
                                ("RSUM", "B", 0, "")]
    steps += _copy("A", "B") + [("ADD", "A", g - 3, "")] + _copy("SA", "S") + [("SHR", "SA", "A", "")]
    half = RECIP_GUESS[0] // 2
    steps += _copy("R", "SA") + [("MUL", "R", RECIP_GUESS[1], ""), ("SHR", "R", 15, ""), ("MUL", "R", -1, ""),
                                 ("ADD", "R", half, ""), ("ADD", "R", RECIP_GUESS[0] - half, "")]
    for _ in range(RECIP_NEWTON_STEPS):
        steps += _copy("U", "SA") + [("MUL", "U", "R", ""), ("SHR", "U", 15, ""), ("MUL", "U", -1, ""),
                                     ("ADD", "U", 1 << 14, ""), ("ADD", "U", 1 << 14, ""), ("MUL", "R", "U", ""),
                                     ("SHR", "R", 14, "")]
    steps += [("ADD", "B", 11, ""), ("SHR", "Z", g, ""), ("MUL", "Z", "R", ""), ("SHR", "Z", "B", ""),
              ("MUL", "Z", layer.mq, "")]
    if layer.shift:
        steps.append(("SHR", "Z", layer.shift, ""))
    return steps + [("ADD", "Z", 1 << 14, ""), ("SHR", "Z", 15, ""), ("MAX", "Z", -128, ""), ("MIN", "Z", 127, "")]


def plan_softmax(layer: SoftmaxLayer, intr: Intrinsics, *, threads: int = 2) -> RowTiling:
    """The tiling of ``layer`` on ``intr``'s design; ScheduleError when the design or the shape cannot run it."""
    return plan_rows(SOFTMAX, layer.shape, intr, threads=threads)


def _constants(layer: SoftmaxLayer, intr: Intrinsics) -> np.ndarray:
    """The constant entries ``M``, ``P0``, ``J`` as int32 ``(3, BATCH, BLOCK_OUT)``."""
    b, bo = intr.batch, intr.block_out
    lanes = np.stack([np.full(bo, layer.m), np.full(bo, 1 << (14 + layer.g)), np.arange(bo)])
    return np.repeat(lanes[:, None, :], b, axis=1).astype(np.int32)


def emit_softmax(pb: ProgramBuilder, layer: SoftmaxLayer, x: Allocation, y: Allocation, *, prefix: str = "",
                 threads: int = 2) -> LayerCode:
    """Emit the integer Softmax of packed ``x`` into packed ``y`` (same packed shape)."""
    intr = intrinsics(pb.cfg)
    plan = plan_softmax(layer, intr, threads=threads)
    return emit_rows(pb, SOFTMAX, plan, softmax_passes(layer, plan.n), _constants(layer, intr), x, y, prefix=prefix)


def build_softmax_program(cfg: VTAConfig, layer: SoftmaxLayer, x_packed: np.ndarray | None = None, *,
                          threads: int = 2) -> tuple[Program, LayerCode]:
    """A program computing one integer Softmax: input allocation ``x`` (packed ``[rows, C]``; zeros when
    ``x_packed`` is None), output ``y`` of the same packed shape."""
    return build_alu_program(cfg, layer.shape, lambda pb, x, y: emit_softmax(pb, layer, x, y, threads=threads),
                             x_packed)


def softmax_accel_cycles(layer: SoftmaxLayer, intr: Intrinsics) -> tuple[int, int]:
    """(compute-module cycles, DMA bytes) of the layer, for the partitioner's estimate, as the cycle model counts
    them (:func:`.rowwise.rows_accel_cycles`): the one ACC_8BIT load of every packed element among them."""
    plan = plan_softmax(layer, intr)
    return rows_accel_cycles(SOFTMAX, plan, softmax_passes(layer, plan.n), intr)


def softmax_refusal(graph: Graph, node: Node) -> str | None:
    """Why ``node`` (a ``QSoftmax``) has no integer form, or None when it has one."""
    shape = graph.shape(node.inputs[0])
    if graph.tensors[node.inputs[0]].dtype != "int8":
        return (f"softmax {node.name} reads {graph.tensors[node.inputs[0]].dtype} scores (exact attention scores), "
                f"which the integer Softmax does not take: it stays a QSoftmax on the CPU")
    if node.attrs.get("bias") is not None or node.attrs.get("keep") is not None or len(node.inputs) > 1:
        return (f"softmax {node.name} has a fused mask (bias, keep/fill or a runtime mask input), which the integer "
                f"Softmax does not take: it stays a QSoftmax on the CPU")
    if node.attrs.get("sink") is not None or "sink_scale" in node.attrs:
        return (f"softmax {node.name} has sink columns (logits only its denominator counts), which the integer "
                f"Softmax does not take: it stays a QSoftmax on the CPU")
    if not shape or int(node.attrs["axis"]) % len(shape) != len(shape) - 1:
        return f"softmax {node.name} is not over the last axis of {shape}: it stays a QSoftmax on the CPU"
    try:
        isoftmax_params(float(node.attrs["scale"]), float(node.attrs["out_scale"]), int(shape[-1]))
    except ValueError as err:
        return f"softmax {node.name}: {err}; it stays a QSoftmax on the CPU"
    return None


def integer_softmax(graph: Graph) -> tuple[Graph, dict[str, Node]]:
    """``graph`` with every ``QSoftmax`` that has an integer form (:func:`softmax_refusal`: over the last axis, no
    mask, constants that can be chosen) replaced by a ``QISoftmax`` node of the same name, inputs and outputs, and
    the replaced nodes by name. ``graph`` itself is unchanged (a copy when anything is replaced)."""
    found: dict[str, dict[str, object]] = {}
    for node in graph.nodes:
        if node.op == "QSoftmax" and softmax_refusal(graph, node) is None:
            found[node.name] = dict(isoftmax_params(float(node.attrs["scale"]), float(node.attrs["out_scale"]),
                                                    int(graph.shape(node.inputs[0])[-1])))
    return swap_nodes(graph, "QISoftmax", found)
