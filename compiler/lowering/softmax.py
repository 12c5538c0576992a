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
from typing import Any, Union

import numpy as np

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_OUT, VTAConfig
from vta.isa import Uop
from vta.packing import alloc_dtype
from vta.program import Allocation, Program, ProgramBuilder, SlotRing

from ..ir import Graph, Node
from ..qops import EXP_POLY, ISOFTMAX_ATTRS, RECIP_GUESS, RECIP_NEWTON_STEPS, isoftmax_params
from .codegen import LayerCode, _alu_opcode, _count_uops
from .intrin import Intrinsics, intrinsics
from .layernorm import layernorm_view
from .layout import INPUT, OUTPUT, packed_activation_shape
from .schedule import ScheduleError
from .uopcache import UopCache

__all__ = ["SoftmaxLayer", "softmax_passes", "plan_softmax", "emit_softmax", "build_softmax_program",
           "softmax_accel_cycles", "SOFTMAX_MODES", "integer_softmax", "float_softmax", "softmax_refusal"]

SOFTMAX_MODES = ("auto", "int", "float")
"""How a softmax (``QSoftmax``) runs: ``float`` keeps today's float64 ``QSoftmax`` on the CPU; ``int`` makes every
one over the last axis without a mask the integer ``QISoftmax`` (:func:`..qops.isoftmax`), which the partitioner
places on the ALU (designs with ``lane_reduce``) or the CPU by its estimates; ``auto`` (the default) does so only
where the partitioner puts it on the accelerator, and keeps ``QSoftmax`` elsewhere (so designs without the knob
compile exactly as before)."""

ELEM_REGIONS = ("X", "Y", "Z")
ROW_REGIONS = ("MX", "S", "B", "A", "SA", "R", "U")
CONST_REGIONS = ("M", "P0", "J")
Step = tuple[str, str, Union[int, str], str]
"""``(op, destination region, immediate or source region, mode)``; op an ALU name or ``"RESET"``; mode ``""``
(lane by lane, a row or constant source broadcast as its region's kind says), ``"fold"`` (the op with each of a
row's first ``n - 1`` entries into the row scalar) or ``"last"`` (the op with the row's last entry)."""


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


@dataclass(frozen=True)
class SoftmaxTiling:
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


def plan_softmax(layer: SoftmaxLayer, intr: Intrinsics, *, threads: int = 2) -> SoftmaxTiling:
    """The tiling of ``layer`` on ``intr``'s design; ScheduleError when the design or the shape cannot run it."""
    cfg = intr.cfg
    rows, c = layer.shape
    if not cfg.lane_reduce:
        raise ScheduleError(f"the integer Softmax needs the lane_reduce knob (RMAX, RSUM), which design {cfg.name} "
                            f"does not have")
    if intr.block_out < 16 or intr.block_in != intr.block_out:
        raise ScheduleError(f"the integer Softmax needs BLOCK_IN == BLOCK_OUT >= 16 (the exponent takes 16 lanes), "
                            f"not BLOCK_IN {intr.block_in}, BLOCK_OUT {intr.block_out}")
    if c % intr.block_out:
        raise ScheduleError(f"the integer Softmax needs C a multiple of {intr.block_out} (padded lanes would count "
                            f"in the row max and sum), not C = {c}")
    n = c // intr.block_out
    blocks = -(-rows // intr.batch)
    consts = len(CONST_REGIONS)
    part = (intr.capacity("acc") - consts) // threads
    per_row = len(ELEM_REGIONS) * n + len(ROW_REGIONS)
    tile = min(blocks, part // per_row, intr.loop_max // n)
    if tile < 1:
        raise ScheduleError(f"the acc buffer ({intr.capacity('acc')} entries) cannot hold one row of C = {c} "
                            f"({per_row} entries) in each of {threads} parts beside {consts} constant entries")
    return SoftmaxTiling(blocks, n, tile, consts, part, threads)


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
    n = plan.n
    first_insn = len(pb.insns)
    uops = UopCache(pb, intr, prefix, preload=True)
    code = LayerCode([x], y, tiles=0)
    cbase = intr.capacity("acc") - plan.consts
    const = {name: cbase + k for k, name in enumerate(CONST_REGIONS)}
    consts = pb.alloc(f"{prefix}sm_consts", _constants(layer, intr))
    pb.load(MEM_ACC, sram_base=cbase, dram_base=pb.elem_addr(consts, MEM_ACC), x_size=plan.consts)
    x_addr, y_addr = pb.elem_addr(x, MEM_ACC_8BIT), pb.elem_addr(y, MEM_OUT)
    tiles = plan.tiles()
    outs = SlotRing(pb, "compute", "store", threads, total=len(tiles))
    steps = softmax_passes(layer, n)
    for r0, count in tiles:
        base = outs.claim() * plan.part
        region = dict(const)
        for k, name in enumerate(ELEM_REGIONS):
            region[name] = base + k * plan.tile * n
        for k, name in enumerate(ROW_REGIONS):
            region[name] = base + len(ELEM_REGIONS) * plan.tile * n + k * plan.tile
        pb.load(MEM_ACC_8BIT, sram_base=region["X"], dram_base=x_addr + r0 * n, x_size=count * n)
        for step in steps:
            _emit_step(pb, uops, intr, step, region, count, n)
        outs.handoff()
        pb.store(sram_base=region["Z"], dram_base=y_addr + r0 * n, x_size=count * n)
        outs.release()
        code.tiles += 1
    uops.close()
    _count_uops(code, pb.insns[first_insn:])
    return code


def _loops(dst: str, arg: Union[int, str], mode: str, rows: int, n: int) -> dict[str, Any]:
    """The ALU loop fields of one step over ``rows`` rows of ``n`` entries (see :data:`Step`)."""
    elem = dst in ELEM_REGIONS
    if mode == "fold":
        return {"iter_out": rows, "dst_factor_out": 1, "src_factor_out": n, "iter_in": n - 1, "src_factor_in": 1}
    if mode == "last":
        return {"iter_out": rows, "dst_factor_out": 1, "src_factor_out": n}
    if elem and arg in ROW_REGIONS:
        return {"iter_out": rows, "dst_factor_out": n, "src_factor_out": 1, "iter_in": n, "dst_factor_in": 1}
    constant = isinstance(arg, int) or arg in CONST_REGIONS
    return {"iter_out": rows * n if elem else rows, "dst_factor_out": 1, "src_factor_out": 0 if constant else 1}


def _emit_step(pb: ProgramBuilder, uops: UopCache, intr: Intrinsics, step: Step, region: dict[str, int],
               rows: int, n: int) -> None:
    """One ALU instruction of ``step`` over ``rows`` rows of ``n`` entries."""
    op, dst, arg, mode = step
    imm = arg if isinstance(arg, int) else None
    src = 0 if isinstance(arg, int) else region[arg] + (n - 1 if mode == "last" else 0)
    loops = _loops(dst, arg, mode, rows, n)
    bgn, end = uops.place([Uop(region[dst], src)])
    if op == "RESET":
        pb.alu(_alu_opcode(intr, "ADD", None), uop_bgn=bgn, uop_end=end, reset=True, **loops)
        return
    pb.alu(_alu_opcode(intr, op, imm), uop_bgn=bgn, uop_end=end, use_imm=imm is not None, imm=imm or 0, **loops)


def build_softmax_program(cfg: VTAConfig, layer: SoftmaxLayer, x_packed: np.ndarray | None = None, *,
                          threads: int = 2) -> tuple[Program, LayerCode]:
    """A program computing one integer Softmax: input allocation ``x`` (packed ``[rows, C]``; zeros when
    ``x_packed`` is None), output ``y`` of the same packed shape."""
    intr = intrinsics(cfg)
    pb = ProgramBuilder(cfg)
    act = alloc_dtype(cfg.inp_width)
    shape = packed_activation_shape(layer.shape, intr.batch, intr.block_in)
    x = pb.alloc(INPUT, x_packed if x_packed is not None else shape, act)
    y = pb.alloc(OUTPUT, shape, act)
    code = emit_softmax(pb, layer, x, y, threads=threads)
    return pb.finish(), code


def softmax_accel_cycles(layer: SoftmaxLayer, intr: Intrinsics) -> tuple[int, int]:
    """(compute-module cycles, DMA bytes) of the layer, for the partitioner's estimate, as the cycle model counts
    them: per ALU instruction its micro-ops plus the loop overhead, the constants' ACC load and the ACC_8BIT load of
    every packed element at ``cfg.bus_bytes`` per cycle; the DMA bytes are those loads and the int8 store."""
    from vta.cost import LOOP_OVERHEAD
    plan = plan_softmax(layer, intr)
    n, per_row = plan.n, 0
    steps = softmax_passes(layer, n)
    for _, dst, _, mode in steps:
        per_row += n - 1 if mode == "fold" else n if dst in ELEM_REGIONS else 1
    size = plan.rows * n * intr.batch * intr.block_out
    const_bytes = plan.consts * intr.batch * intr.block_out * 4
    cycles = per_row * plan.rows + len(steps) * LOOP_OVERHEAD * len(plan.tiles())
    cycles += (size + const_bytes) // intr.cfg.bus_bytes
    return cycles, size + const_bytes + size


def softmax_refusal(graph: Graph, node: Node) -> str | None:
    """Why ``node`` (a ``QSoftmax``) has no integer form, or None when it has one."""
    shape = graph.shape(node.inputs[0])
    if node.attrs.get("bias") is not None or node.attrs.get("keep") is not None:
        return (f"softmax {node.name} has a fused mask (bias or keep/fill), which the integer Softmax does not take: "
                f"it stays a QSoftmax on the CPU")
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
    if not found:
        return graph, {}
    new = graph.copy()
    originals: dict[str, Node] = {}
    for k, node in enumerate(new.nodes):
        if node.name in found:
            originals[node.name] = graph.node(node.name)
            new.nodes[k] = Node("QISoftmax", node.name, list(node.inputs), list(node.outputs), found[node.name])
    return new, originals


def float_softmax(graph: Graph, originals: dict[str, Node], names: set[str] | frozenset[str]) -> Graph:
    """``graph`` (changed in place, and returned) with the ``QISoftmax`` nodes named in ``names`` put back as their
    ``QSoftmax`` nodes ``originals[name]`` (from :func:`integer_softmax`)."""
    for k, node in enumerate(graph.nodes):
        if node.name in names and node.op == "QISoftmax":
            graph.nodes[k] = originals[node.name]
    return graph
