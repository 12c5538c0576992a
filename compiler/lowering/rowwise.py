"""What the row-wise ALU-only layers share: the integer LayerNorm (:mod:`.layernorm`) and Softmax (:mod:`.softmax`)
on designs with the ``lane_reduce`` knob, and the program skeleton of those two and the integer GELU (:mod:`.gelu`).

A row-wise op (:class:`RowOp`) works on an int8 ``[rows, C]`` tensor packed as an activation (:mod:`.layout`: a row
is ``n = C / BLOCK_OUT`` consecutive entries). Its acc regions are of three kinds: element regions (``n`` entries a
row), row regions (one entry a row, the value in every lane) and constant regions at the top of the acc buffer,
loaded once as ACC words: per-channel ones (``n`` entries each) first, then broadcast ones (one entry each). Below
the constants the acc buffer holds ``threads`` parts; a tile of rows lives in one part, element regions first, and
tiles alternate between the parts. Each op lists its ALU steps (:data:`Step`); :func:`emit_rows` loads a tile into
the op's ``loaded`` element regions, runs one ALU instruction per step over the tile's rows and stores the
``result`` region.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_OUT, VTAConfig
from vta.isa import Uop
from vta.packing import alloc_dtype
from vta.program import Allocation, Program, ProgramBuilder, SlotRing

from ..ir import Graph, Node
from .codegen import LayerCode, _alu_opcode, _count_uops
from .intrin import Intrinsics, intrinsics
from .layout import INPUT, OUTPUT, packed_activation_shape
from .schedule import ScheduleError
from .uopcache import UopCache

__all__ = ["Step", "RowOp", "RowTiling", "plan_rows", "emit_rows", "emit_step", "rows_accel_cycles",
           "build_alu_program", "swap_nodes", "restore_nodes"]

Step = tuple[str, str, Union[int, str], str]
"""``(op, destination region, immediate or source region, mode)``; op an ALU name or ``"RESET"``; mode ``""``
(lane by lane, a row, per-channel or constant source broadcast as its region's kind says), ``"fold"`` (the op with
each of a row's first ``n - 1`` entries into the row scalar) or ``"last"`` (the op with the row's last entry)."""


@dataclass(frozen=True)
class RowOp:
    """A row-wise integer op's layout and the words of its refusals.

    ``name`` ("LayerNorm") and ``reduces`` (the lane_reduce instructions it needs, "RSUM") name it in errors;
    ``padded`` says what padded lanes would spoil ("the row sums"). ``elem``, ``row``, ``channel`` and ``const``
    are its regions by kind (see the module docstring); the input is loaded into each of ``loaded``, the output is
    stored from ``result``; ``consts_alloc`` names the constants' DRAM allocation (after the emit prefix)."""

    name: str
    reduces: str
    padded: str
    elem: tuple[str, ...]
    row: tuple[str, ...]
    const: tuple[str, ...]
    loaded: tuple[str, ...]
    result: str
    consts_alloc: str
    channel: tuple[str, ...] = ()

    def const_entries(self, n: int) -> int:
        """acc entries of the constants for rows of ``n`` entries."""
        return len(self.channel) * n + len(self.const)

    def const_regions(self, cbase: int, n: int) -> dict[str, int]:
        """The constant regions' acc addresses, the constants starting at ``cbase``."""
        region = {name: cbase + k * n for k, name in enumerate(self.channel)}
        region.update({name: cbase + len(self.channel) * n + k for k, name in enumerate(self.const)})
        return region


@dataclass(frozen=True)
class RowTiling:
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


def plan_rows(op: RowOp, shape: tuple[int, int], intr: Intrinsics, *, threads: int = 2) -> RowTiling:
    """The tiling of ``op`` over ``[rows, C]`` ``shape`` on ``intr``'s design; ScheduleError when the design or the
    shape cannot run it."""
    cfg = intr.cfg
    rows, c = shape
    if not cfg.lane_reduce:
        raise ScheduleError(f"the integer {op.name} needs the lane_reduce knob ({op.reduces}), which design "
                            f"{cfg.name} does not have")
    if intr.block_out < 16 or intr.block_in != intr.block_out:
        raise ScheduleError(f"the integer {op.name} needs BLOCK_IN == BLOCK_OUT >= 16 (the exponent takes 16 lanes), "
                            f"not BLOCK_IN {intr.block_in}, BLOCK_OUT {intr.block_out}")
    if c % intr.block_out:
        raise ScheduleError(f"the integer {op.name} needs C a multiple of {intr.block_out} (padded lanes would count "
                            f"in {op.padded}), not C = {c}")
    n = c // intr.block_out
    blocks = -(-rows // intr.batch)
    consts = op.const_entries(n)
    part = (intr.capacity("acc") - consts) // threads
    per_row = len(op.elem) * n + len(op.row)
    tile = min(blocks, part // per_row, intr.loop_max // n)
    if tile < 1:
        raise ScheduleError(f"the acc buffer ({intr.capacity('acc')} entries) cannot hold one row of C = {c} "
                            f"({per_row} entries) in each of {threads} parts beside {consts} constant entries")
    return RowTiling(blocks, n, tile, consts, part, threads)


def emit_rows(pb: ProgramBuilder, op: RowOp, plan: RowTiling, steps: list[Step], constants: np.ndarray,
              x: Allocation, y: Allocation, *, prefix: str = "") -> LayerCode:
    """Emit ``steps`` of ``op`` tiled by ``plan`` over packed ``x`` into packed ``y`` (same packed shape), with the
    constant entries ``constants`` (int32 ``(plan.consts, BATCH, BLOCK_OUT)``)."""
    intr = intrinsics(pb.cfg)
    n = plan.n
    first_insn = len(pb.insns)
    uops = UopCache(pb, intr, prefix, preload=True)
    code = LayerCode([x], y, tiles=0)
    cbase = intr.capacity("acc") - plan.consts
    const = op.const_regions(cbase, n)
    consts = pb.alloc(f"{prefix}{op.consts_alloc}", constants)
    pb.load(MEM_ACC, sram_base=cbase, dram_base=pb.elem_addr(consts, MEM_ACC), x_size=plan.consts)
    x_addr, y_addr = pb.elem_addr(x, MEM_ACC_8BIT), pb.elem_addr(y, MEM_OUT)
    tiles = plan.tiles()
    outs = SlotRing(pb, "compute", "store", plan.threads, total=len(tiles))
    for r0, count in tiles:
        base = outs.claim() * plan.part
        region = dict(const)
        for k, name in enumerate(op.elem):
            region[name] = base + k * plan.tile * n
        for k, name in enumerate(op.row):
            region[name] = base + len(op.elem) * plan.tile * n + k * plan.tile
        for name in op.loaded:
            pb.load(MEM_ACC_8BIT, sram_base=region[name], dram_base=x_addr + r0 * n, x_size=count * n)
        for step in steps:
            emit_step(pb, uops, intr, op, step, region, count, n)
        outs.handoff()
        pb.store(sram_base=region[op.result], dram_base=y_addr + r0 * n, x_size=count * n)
        outs.release()
        code.tiles += 1
    uops.close()
    _count_uops(code, pb.insns[first_insn:])
    return code


def _loops(op: RowOp, dst: str, arg: Union[int, str], mode: str, rows: int, n: int) -> dict[str, Any]:
    """The ALU loop fields of one step over ``rows`` rows of ``n`` entries (see :data:`Step`)."""
    elem = dst in op.elem
    if mode == "fold":
        return {"iter_out": rows, "dst_factor_out": 1, "src_factor_out": n, "iter_in": n - 1, "src_factor_in": 1}
    if mode == "last":
        return {"iter_out": rows, "dst_factor_out": 1, "src_factor_out": n}
    if elem and arg in op.row:
        return {"iter_out": rows, "dst_factor_out": n, "src_factor_out": 1, "iter_in": n, "dst_factor_in": 1}
    if elem and arg in op.channel:
        return {"iter_out": rows, "dst_factor_out": n, "iter_in": n, "dst_factor_in": 1, "src_factor_in": 1}
    constant = isinstance(arg, int) or arg in op.const
    return {"iter_out": rows * n if elem else rows, "dst_factor_out": 1, "src_factor_out": 0 if constant else 1}


def emit_step(pb: ProgramBuilder, uops: UopCache, intr: Intrinsics, op: RowOp, step: Step, region: dict[str, int],
              rows: int, n: int) -> None:
    """One ALU instruction of ``step`` over ``rows`` rows of ``n`` entries, regions at ``region``'s addresses."""
    alu, dst, arg, mode = step
    imm = arg if isinstance(arg, int) else None
    src = 0 if isinstance(arg, int) else region[arg] + (n - 1 if mode == "last" else 0)
    loops = _loops(op, dst, arg, mode, rows, n)
    bgn, end = uops.place([Uop(region[dst], src)])
    if alu == "RESET":
        pb.alu(_alu_opcode(intr, "ADD", None), uop_bgn=bgn, uop_end=end, reset=True, **loops)
        return
    pb.alu(_alu_opcode(intr, alu, imm), uop_bgn=bgn, uop_end=end, use_imm=imm is not None, imm=imm or 0, **loops)


def rows_accel_cycles(op: RowOp, plan: RowTiling, steps: list[Step], intr: Intrinsics) -> tuple[int, int]:
    """(compute-module cycles, DMA bytes) of ``steps`` tiled by ``plan``, for the partitioner's estimate, as the
    cycle model counts them: per ALU instruction its micro-ops plus the loop overhead, the constants' ACC load and
    the ACC_8BIT loads of every packed element into ``op.loaded`` at ``cfg.bus_bytes`` per cycle; the DMA bytes are
    those loads and the int8 store."""
    from vta.cost import LOOP_OVERHEAD
    n, per_row = plan.n, 0
    for _, dst, _, mode in steps:
        per_row += n - 1 if mode == "fold" else n if dst in op.elem else 1
    size = plan.rows * n * intr.batch * intr.block_out
    const_bytes = plan.consts * intr.batch * intr.block_out * 4
    cycles = per_row * plan.rows + len(steps) * LOOP_OVERHEAD * len(plan.tiles())
    cycles += (len(op.loaded) * size + const_bytes) // intr.cfg.bus_bytes
    return cycles, len(op.loaded) * size + const_bytes + size


def build_alu_program(cfg: VTAConfig, shape: tuple[int, ...], emit: Callable[[ProgramBuilder, Allocation, Allocation],
                                                                            LayerCode],
                      x_packed: np.ndarray | None = None) -> tuple[Program, LayerCode]:
    """A program of one ALU-only layer over a tensor of ``shape``: input allocation ``x`` (packed as an activation;
    zeros when ``x_packed`` is None), output ``y`` of the same packed shape, the layer emitted by ``emit(pb, x, y)``.
    """
    intr = intrinsics(cfg)
    pb = ProgramBuilder(cfg)
    act = alloc_dtype(cfg.inp_width)
    packed = packed_activation_shape(shape, intr.batch, intr.block_in)
    x = pb.alloc(INPUT, x_packed if x_packed is not None else packed, act)
    y = pb.alloc(OUTPUT, packed, act)
    code = emit(pb, x, y)
    return pb.finish(), code


def swap_nodes(graph: Graph, op: str, attrs: dict[str, dict[str, Any]]) -> tuple[Graph, dict[str, Node]]:
    """``graph`` with each node named in ``attrs`` replaced by an ``op`` node of the same name, inputs and outputs
    and the attributes ``attrs[name]``, and the replaced nodes by name (the integer GELU, LayerNorm and Softmax
    nodes in place of their float forms). ``graph`` itself is unchanged (a copy when anything is replaced)."""
    if not attrs:
        return graph, {}
    new = graph.copy()
    originals: dict[str, Node] = {}
    for k, node in enumerate(new.nodes):
        if node.name in attrs:
            originals[node.name] = graph.node(node.name)
            new.nodes[k] = Node(op, node.name, list(node.inputs), list(node.outputs), dict(attrs[node.name]))
    return new, originals


def restore_nodes(graph: Graph, op: str, originals: dict[str, Node], names: set[str] | frozenset[str]) -> Graph:
    """``graph`` (changed in place, and returned) with the ``op`` nodes named in ``names`` put back as the nodes
    ``originals[name]`` they replaced (:func:`swap_nodes`)."""
    for k, node in enumerate(graph.nodes):
        if node.name in names and node.op == op:
            graph.nodes[k] = originals[node.name]
    return graph
