"""The integer LayerNorm (``QILayerNorm``, :func:`..qops.ilayernorm`) as an ALU-only layer on designs with the
``lane_reduce`` knob.

The int8 input ``[rows, C]`` (a rank-3 ``[1, tokens, C]`` is viewed as ``[tokens, C]``), packed as an activation
(:mod:`.layout`: a row is ``n = C / 16`` consecutive entries), is loaded twice per tile of rows as ACC_8BIT into the
element regions ``X`` and ``Y`` (``rows * n`` entries each). Per-row scalars live in row regions (one entry per row,
the value in every lane): ``T`` (s1), ``U`` (q), ``M`` (m), ``G`` (g, then the correction), ``P`` (m8), ``F``, ``V``
(sum of squares, w, then the mantissa a), ``W`` (e, then e + 6), ``A`` (2e - 15), ``R`` (y), ``Z`` (Newton's z) and
``H`` (-m8 y). The constants are loaded once as ACC words at the top of the acc buffer: ``MQ`` and ``BQ`` (``n``
entries each, the per-channel multiplier and offset), ``J`` (lane j holds ``min(2j, 31)``) and ``E`` (eps_steps in
every lane). :func:`layernorm_passes` lists the ALU steps, :func:`..qops.ilayernorm_trace`'s, one ALU instruction
each over the tile's rows; ``STORE X`` ends a tile. Tiles alternate between the two acc/out parts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vta.config import VTAConfig
from vta.program import Allocation, Program, ProgramBuilder

from ..ir import Graph, Node
from ..qops import ILAYERNORM_ATTRS, NEWTON_STEPS, RSQRT_GUESS, ilayernorm_params
from .codegen import LayerCode
from .intrin import Intrinsics, intrinsics
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
from .schedule import ScheduleError

__all__ = ["LayerNormLayer", "layernorm_view", "layernorm_passes", "plan_layernorm", "emit_layernorm",
           "build_layernorm_program", "layernorm_accel_cycles", "ELEM_REGIONS", "ROW_REGIONS", "LAYERNORM_MODES",
           "integer_layernorm"]

LAYERNORM_MODES = ("auto", "int", "float")
"""How a LayerNorm (``QLayerNorm``) runs: ``float`` keeps the float64 ``QLayerNorm`` on the CPU; ``int`` makes it
the integer ``QILayerNorm`` (:func:`..qops.ilayernorm`), which the partitioner places on the ALU (designs with
``lane_reduce``) or the CPU by its estimates; ``auto`` (the default) makes it ``QILayerNorm`` only where the
partitioner puts that on the accelerator, and keeps ``QLayerNorm`` elsewhere (so designs without the knob compile
exactly as before)."""

ELEM_REGIONS = ("X", "Y")
ROW_REGIONS = ("T", "U", "M", "G", "P", "F", "V", "W", "A", "R", "Z", "H")
LAYERNORM = RowOp(name="LayerNorm", reduces="RSUM", padded="the row sums", elem=ELEM_REGIONS, row=ROW_REGIONS,
                  channel=("MQ", "BQ"), const=("J", "E"), loaded=ELEM_REGIONS, result="X", consts_alloc="ln_consts")
"""The LayerNorm's regions (:class:`.rowwise.RowOp`): the input loaded into ``X`` and ``Y``, ``X`` stored."""
LayerNormTiling = RowTiling


def layernorm_view(shape: tuple[int, ...]) -> tuple[int, int]:
    """``[rows, C]``: the product of the leading axes and the last axis."""
    if not shape:
        raise ScheduleError("a LayerNorm needs a tensor of rank 1 or more, not a scalar")
    return (int(np.prod(shape[:-1])), int(shape[-1]))


@dataclass(frozen=True)
class LayerNormLayer:
    """An integer LayerNorm over the last axis of an int8 tensor seen as ``[rows, C]`` ``shape``, with the constants
    of :func:`..qops.ilayernorm_params` (``mq``, ``bq`` as tuples of ``C`` ints)."""

    shape: tuple[int, int]
    channels: int
    k: int
    mc: int
    k2: int
    mc2: int
    eps_steps: int
    shift: int
    mq: tuple[int, ...]
    bq: tuple[int, ...]

    @classmethod
    def from_attrs(cls, shape: tuple[int, ...], attrs: dict[str, object]) -> "LayerNormLayer":
        """From a ``QILayerNorm`` node's attributes and its tensor's shape (any rank)."""
        channels, k, mc, k2, mc2, eps_steps, shift = (int(attrs[a])  # type: ignore[call-overload]
                                                       for a in ILAYERNORM_ATTRS[:-2])
        mq, bq = (tuple(int(v) for v in np.asarray(attrs[a]).reshape(-1)) for a in ("mq", "bq"))
        return cls(layernorm_view(tuple(shape)), channels, k, mc, k2, mc2, eps_steps, shift, mq, bq)


def _copy(dst: str, src: str) -> list[Step]:
    steps: list[Step] = [("RESET", dst, 0, ""), ("ADD", dst, src, "")]
    return steps


def _round_shift(dst: str, s: int) -> list[Step]:
    """:func:`..qops_layernorm.round_shift` with 16-bit immediates."""
    steps: list[Step] = []
    if s > 15:
        steps += [("SHR", dst, s - 15, ""), ("ADD", dst, 1 << 14, ""), ("SHR", dst, 15, "")]
    elif s > 0:
        steps += [("ADD", dst, 1 << (s - 1), ""), ("SHR", dst, s, "")]
    return steps


def _row_sum(dst: str, src: str, n: int) -> list[Step]:
    steps: list[Step] = [("RESET", dst, 0, "")]
    if n > 1:
        steps.append(("ADD", dst, src, "fold"))
    return steps + [("RSUM", dst, src, "last")]


def layernorm_passes(layer: LayerNormLayer, n: int) -> list[Step]:
    """The ALU steps for rows of ``n`` entries, in :func:`..qops.ilayernorm_trace`'s order."""
    steps: list[Step] = _row_sum("T", "X", n) + [("MUL", "Y", "Y", "")] + _row_sum("U", "Y", n)
    steps += _copy("M", "T") + [("MUL", "M", layer.mc, "")] + _round_shift("M", layer.k)
    steps += _copy("G", "M") + [("MUL", "G", -layer.channels, ""), ("ADD", "G", "T", "")]
    steps += _copy("P", "G") + [("MUL", "P", layer.mc, "")] + _round_shift("P", layer.k - 8)
    steps += _copy("F", "M") + [("MUL", "F", 256, ""), ("ADD", "P", "F", "")]
    steps += _copy("V", "G") + [("ADD", "V", "T", ""), ("MUL", "V", "M", ""), ("MUL", "V", -1, ""),
                                ("ADD", "V", "U", "")]
    steps += [("MUL", "G", "G", ""), ("MUL", "G", layer.mc2, "")]
    steps += _round_shift("G", layer.k2)
    steps += [("MUL", "G", -1, ""), ("ADD", "V", "G", ""), ("ADD", "V", "E", ""), ("MAX", "V", 1, "")]
    steps += _copy("W", "V") + [("SHR", "W", "J", ""), ("MIN", "W", 1, ""), ("RSUM", "W", 0, "")]
    steps += _copy("A", "W") + [("MUL", "A", 2, ""), ("ADD", "A", -15, ""), ("SHR", "V", "A", ""),
                                ("ADD", "W", 6, "")]
    steps += _copy("R", "V") + [("MUL", "R", RSQRT_GUESS[1], ""), ("SHR", "R", 15, ""),
                                ("ADD", "R", RSQRT_GUESS[0], "")]
    for _ in range(NEWTON_STEPS):
        steps += _copy("Z", "R") + [("MUL", "Z", "R", ""), ("SHR", "Z", 13, ""), ("MUL", "Z", "V", ""),
                                    ("SHR", "Z", 15, ""), ("MUL", "Z", -1, ""), ("ADD", "Z", 24576, ""),
                                    ("MUL", "R", "Z", ""), ("SHR", "R", 14, "")]
    steps += _copy("H", "P") + [("MUL", "H", "R", ""), ("MUL", "H", -1, ""), ("MUL", "R", 256, "")]
    steps += [("MUL", "X", "R", ""), ("ADD", "X", "H", ""), ("SHR", "X", "W", ""), ("MUL", "X", "MQ", ""),
              ("ADD", "X", "BQ", "")]
    if layer.shift:
        steps.append(("SHR", "X", layer.shift, ""))
    return steps + [("MAX", "X", -128, ""), ("MIN", "X", 127, "")]


def plan_layernorm(layer: LayerNormLayer, intr: Intrinsics, *, threads: int = 2) -> RowTiling:
    """The tiling of ``layer`` on ``intr``'s design; ScheduleError when the design or the shape cannot run it."""
    return plan_rows(LAYERNORM, layer.shape, intr, threads=threads)


def _constants(layer: LayerNormLayer, intr: Intrinsics) -> np.ndarray:
    """The constant entries ``MQ`` (n), ``BQ`` (n), ``J``, ``E`` as int32 ``(2n + 2, BATCH, BLOCK_OUT)``."""
    b, bo = intr.batch, intr.block_out
    lanes = [np.asarray(layer.mq, np.int64).reshape(-1, bo), np.asarray(layer.bq, np.int64).reshape(-1, bo),
             np.minimum(2 * np.arange(bo), 31)[None], np.full((1, bo), layer.eps_steps)]
    return np.repeat(np.concatenate(lanes)[:, None, :], b, axis=1).astype(np.int32)


def emit_layernorm(pb: ProgramBuilder, layer: LayerNormLayer, x: Allocation, y: Allocation, *, prefix: str = "",
                   threads: int = 2) -> LayerCode:
    """Emit the integer LayerNorm of packed ``x`` into packed ``y`` (same packed shape)."""
    intr = intrinsics(pb.cfg)
    plan = plan_layernorm(layer, intr, threads=threads)
    return emit_rows(pb, LAYERNORM, plan, layernorm_passes(layer, plan.n), _constants(layer, intr), x, y,
                     prefix=prefix)


def build_layernorm_program(cfg: VTAConfig, layer: LayerNormLayer, x_packed: np.ndarray | None = None, *,
                            threads: int = 2) -> tuple[Program, LayerCode]:
    """A program computing one integer LayerNorm: input allocation ``x`` (packed ``[rows, C]``; zeros when
    ``x_packed`` is None), output ``y`` of the same packed shape."""
    return build_alu_program(cfg, layer.shape, lambda pb, x, y: emit_layernorm(pb, layer, x, y, threads=threads),
                             x_packed)


def layernorm_accel_cycles(layer: LayerNormLayer, intr: Intrinsics) -> tuple[int, int]:
    """(compute-module cycles, DMA bytes) of the layer, for the partitioner's estimate, as the cycle model counts
    them (:func:`.rowwise.rows_accel_cycles`): the two ACC_8BIT loads of every packed element among them."""
    plan = plan_layernorm(layer, intr)
    return rows_accel_cycles(LAYERNORM, plan, layernorm_passes(layer, plan.n), intr)


def integer_layernorm(graph: Graph) -> tuple[Graph, dict[str, Node]]:
    """``graph`` with every ``QLayerNorm`` over the last axis replaced by a ``QILayerNorm`` node of the same name,
    inputs and outputs (constants by :func:`..qops.ilayernorm_params`; one whose constants cannot be chosen is kept),
    and the replaced nodes by name. ``graph`` itself is unchanged (a copy when anything is replaced)."""
    found: dict[str, dict[str, object]] = {}
    for node in graph.nodes:
        if node.op != "QLayerNorm":
            continue
        shape = graph.shape(node.inputs[0])
        if not shape or int(node.attrs["axis"]) % len(shape) != len(shape) - 1:
            continue
        try:
            found[node.name] = ilayernorm_params(float(node.attrs["scale"]), float(node.attrs["out_scale"]),
                                                 node.attrs["gamma"], node.attrs["beta"],
                                                 float(node.attrs["epsilon"]), int(shape[-1]))
        except ValueError:
            continue
    return swap_nodes(graph, "QILayerNorm", found)
