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
from typing import Any, Union

import numpy as np

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_OUT, VTAConfig
from vta.isa import Uop
from vta.packing import alloc_dtype
from vta.program import Allocation, Program, ProgramBuilder, SlotRing

from ..ir import Graph, Node
from ..qops import ILAYERNORM_ATTRS, NEWTON_STEPS, RSQRT_GUESS, ilayernorm_params
from .codegen import LayerCode, _alu_opcode, _count_uops
from .intrin import Intrinsics, intrinsics
from .layout import INPUT, OUTPUT, packed_activation_shape
from .schedule import ScheduleError
from .uopcache import UopCache

__all__ = ["LayerNormLayer", "layernorm_view", "layernorm_passes", "plan_layernorm", "emit_layernorm",
           "build_layernorm_program", "layernorm_accel_cycles", "ELEM_REGIONS", "ROW_REGIONS", "LAYERNORM_MODES",
           "integer_layernorm", "float_layernorm"]

LAYERNORM_MODES = ("auto", "int", "float")
"""How a LayerNorm (``QLayerNorm``) runs: ``float`` keeps today's float64 ``QLayerNorm`` on the CPU; ``int`` makes it
the integer ``QILayerNorm`` (:func:`..qops.ilayernorm`), which the partitioner places on the ALU (designs with
``lane_reduce``) or the CPU by its estimates; ``auto`` (the default) makes it ``QILayerNorm`` only where the
partitioner puts that on the accelerator, and keeps ``QLayerNorm`` elsewhere (so designs without the knob compile
exactly as before)."""

ELEM_REGIONS = ("X", "Y")
ROW_REGIONS = ("T", "U", "M", "G", "P", "F", "V", "W", "A", "R", "Z", "H")
Step = tuple[str, str, Union[int, str], str]
"""``(op, destination region, immediate or source region, mode)``; op an ALU name or ``"RESET"``; mode ``""``
(lane by lane, a row or per-channel source broadcast as its region's kind says), ``"sum"`` (ADD of a row's first
``n - 1`` entries into the row scalar) or ``"last"`` (the op with the row's last entry)."""


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
        steps.append(("ADD", dst, src, "sum"))
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


@dataclass(frozen=True)
class LayerNormTiling:
    """``rows`` packed row blocks (of BATCH rows each), ``tile`` at a time; ``n`` entries a row; ``consts`` acc
    entries of constants at the top of the acc buffer, below them ``threads`` parts of ``part`` entries."""

    rows: int
    n: int
    tile: int
    consts: int
    part: int
    threads: int = 2

    def tiles(self) -> list[tuple[int, int]]:
        """``(first row, rows)`` of every tile."""
        return [(r0, min(self.tile, self.rows - r0)) for r0 in range(0, self.rows, self.tile)]


def plan_layernorm(layer: LayerNormLayer, intr: Intrinsics, *, threads: int = 2) -> LayerNormTiling:
    """The tiling of ``layer`` on ``intr``'s design; ScheduleError when the design or the shape cannot run it."""
    cfg = intr.cfg
    rows, c = layer.shape
    if not cfg.lane_reduce:
        raise ScheduleError(f"the integer LayerNorm needs the lane_reduce knob (RSUM), which design {cfg.name} "
                            f"does not have")
    if intr.block_out < 16 or intr.block_in != intr.block_out:
        raise ScheduleError(f"the integer LayerNorm needs BLOCK_IN == BLOCK_OUT >= 16 (the exponent takes 16 lanes), "
                            f"not BLOCK_IN {intr.block_in}, BLOCK_OUT {intr.block_out}")
    if c % intr.block_out:
        raise ScheduleError(f"the integer LayerNorm needs C a multiple of {intr.block_out} (padded lanes would count "
                            f"in the row sums), not C = {c}")
    n = c // intr.block_out
    blocks = -(-rows // intr.batch)
    consts = 2 * n + 2
    part = (intr.capacity("acc") - consts) // threads
    tile = min(blocks, part // (len(ELEM_REGIONS) * n + len(ROW_REGIONS)), intr.loop_max // n)
    if tile < 1:
        raise ScheduleError(f"the acc buffer ({intr.capacity('acc')} entries) cannot hold one row of C = {c} "
                            f"({len(ELEM_REGIONS) * n + len(ROW_REGIONS)} entries) in each of {threads} parts "
                            f"beside {consts} constant entries")
    return LayerNormTiling(blocks, n, tile, consts, part, threads)


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
    n = plan.n
    first_insn = len(pb.insns)
    uops = UopCache(pb, intr, prefix, preload=True)
    code = LayerCode([x], y, tiles=0)
    cbase = intr.capacity("acc") - plan.consts
    const = {"MQ": cbase, "BQ": cbase + n, "J": cbase + 2 * n, "E": cbase + 2 * n + 1}
    consts = pb.alloc(f"{prefix}ln_consts", _constants(layer, intr))
    pb.load(MEM_ACC, sram_base=cbase, dram_base=pb.elem_addr(consts, MEM_ACC), x_size=plan.consts)
    x_addr, y_addr = pb.elem_addr(x, MEM_ACC_8BIT), pb.elem_addr(y, MEM_OUT)
    tiles = plan.tiles()
    outs = SlotRing(pb, "compute", "store", threads, total=len(tiles))
    steps = layernorm_passes(layer, n)
    for r0, count in tiles:
        base = outs.claim() * plan.part
        region = dict(const)
        for k, name in enumerate(ELEM_REGIONS):
            region[name] = base + k * plan.tile * n
        for k, name in enumerate(ROW_REGIONS):
            region[name] = base + len(ELEM_REGIONS) * plan.tile * n + k * plan.tile
        for name in ELEM_REGIONS:
            pb.load(MEM_ACC_8BIT, sram_base=region[name], dram_base=x_addr + r0 * n, x_size=count * n)
        for step in steps:
            _emit_step(pb, uops, intr, step, region, count, n)
        outs.handoff()
        pb.store(sram_base=region["X"], dram_base=y_addr + r0 * n, x_size=count * n)
        outs.release()
        code.tiles += 1
    uops.close()
    _count_uops(code, pb.insns[first_insn:])
    return code


def _emit_step(pb: ProgramBuilder, uops: UopCache, intr: Intrinsics, step: Step, region: dict[str, int],
               rows: int, n: int) -> None:
    """One ALU instruction of ``step`` over ``rows`` rows of ``n`` entries (see :data:`Step`)."""
    op, dst, arg, mode = step
    elem = dst in ELEM_REGIONS
    imm = arg if isinstance(arg, int) else None
    src = 0 if isinstance(arg, int) else region[arg]
    loops: dict[str, Any] = {"iter_out": rows * n if elem else rows, "dst_factor_out": 1,
                             "src_factor_out": 0 if imm is not None else 1}
    if mode == "sum":
        loops = {"iter_out": rows, "dst_factor_out": 1, "src_factor_out": n, "iter_in": n - 1, "src_factor_in": 1}
    elif mode == "last":
        src += n - 1
        loops = {"iter_out": rows, "dst_factor_out": 1, "src_factor_out": n}
    elif elem and arg in ROW_REGIONS:
        loops = {"iter_out": rows, "dst_factor_out": n, "src_factor_out": 1, "iter_in": n, "dst_factor_in": 1}
    elif elem and arg in ("MQ", "BQ"):
        loops = {"iter_out": rows, "dst_factor_out": n, "iter_in": n, "dst_factor_in": 1, "src_factor_in": 1}
    elif arg in ("J", "E"):
        loops["src_factor_out"] = 0
    bgn, end = uops.place([Uop(region[dst], src)])
    if op == "RESET":
        pb.alu(_alu_opcode(intr, "ADD", None), uop_bgn=bgn, uop_end=end, reset=True, **loops)
        return
    pb.alu(_alu_opcode(intr, op, imm), uop_bgn=bgn, uop_end=end, use_imm=imm is not None, imm=imm or 0, **loops)


def build_layernorm_program(cfg: VTAConfig, layer: LayerNormLayer, x_packed: np.ndarray | None = None, *,
                            threads: int = 2) -> tuple[Program, LayerCode]:
    """A program computing one integer LayerNorm: input allocation ``x`` (packed ``[rows, C]``; zeros when
    ``x_packed`` is None), output ``y`` of the same packed shape."""
    intr = intrinsics(cfg)
    pb = ProgramBuilder(cfg)
    act = alloc_dtype(cfg.inp_width)
    shape = packed_activation_shape(layer.shape, intr.batch, intr.block_in)
    x = pb.alloc(INPUT, x_packed if x_packed is not None else shape, act)
    y = pb.alloc(OUTPUT, shape, act)
    code = emit_layernorm(pb, layer, x, y, threads=threads)
    return pb.finish(), code


def layernorm_accel_cycles(layer: LayerNormLayer, intr: Intrinsics) -> tuple[int, int]:
    """(compute-module cycles, DMA bytes) of the layer, for the partitioner's estimate, as the cycle model counts
    them: per ALU instruction its micro-ops plus the loop overhead, the constants' ACC load and the two ACC_8BIT
    loads of every packed element at ``cfg.bus_bytes`` per cycle; the DMA bytes are those loads and the int8
    store."""
    from vta.cost import LOOP_OVERHEAD
    plan = plan_layernorm(layer, intr)
    n, per_row = plan.n, 0
    steps = layernorm_passes(layer, n)
    for _, dst, _, mode in steps:
        per_row += n - 1 if mode == "sum" else n if dst in ELEM_REGIONS else 1
    size = plan.rows * n * intr.batch * intr.block_out
    const_bytes = plan.consts * intr.batch * intr.block_out * 4
    cycles = per_row * plan.rows + len(steps) * LOOP_OVERHEAD * len(plan.tiles())
    cycles += (len(ELEM_REGIONS) * size + const_bytes) // intr.cfg.bus_bytes
    return cycles, len(ELEM_REGIONS) * size + const_bytes + size


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
    if not found:
        return graph, {}
    new = graph.copy()
    originals: dict[str, Node] = {}
    for k, node in enumerate(new.nodes):
        if node.name in found:
            originals[node.name] = graph.node(node.name)
            new.nodes[k] = Node("QILayerNorm", node.name, list(node.inputs), list(node.outputs),
                                dict(found[node.name]))
    return new, originals


def float_layernorm(graph: Graph, originals: dict[str, Node], names: set[str] | frozenset[str]) -> Graph:
    """``graph`` (changed in place, and returned) with the ``QILayerNorm`` nodes named in ``names`` put back as their
    ``QLayerNorm`` nodes ``originals[name]`` (from :func:`integer_layernorm`)."""
    for k, node in enumerate(graph.nodes):
        if node.name in names and node.op == "QILayerNorm":
            graph.nodes[k] = originals[node.name]
    return graph
