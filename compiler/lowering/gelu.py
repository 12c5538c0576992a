"""The integer GELU (``QGelu``, :func:`..qops.igelu`) as an ALU-only accelerator layer.

The int8 input (packed as an activation, :mod:`.layout`) is loaded three times per tile as ACC_8BIT (int8 widened
to int32) into three regions of one acc part, ``X``, ``V`` and ``D`` (``tile`` entries each), and the tensor ALU
runs :func:`..qops.igelu_trace`'s steps, one ALU instruction per step over the tile's entries::

    V: MUL -1; MAX X                                   v = |q|
    D: MUL -1; MAX X; [MUL 2**f]; [MIN qb]; ADD -qb;   d  (MIN only when qb < 128 * 2**f: else never reached)
       MUL D                                           d*d
       [SHR k1]; ADD qc; MUL V                         v * l
    X: MUL qc                                          q * qc
    D: ADD X; [SHR k2]; MUL multiplier; rounding; MAX -128; MIN 127
    STORE D

The rounding is ``ADD 2**(shift-1); SHR shift`` or, for ``shift > 15``, ``SHR shift-15; ADD 2**14; SHR 15``. Every
constant is an immediate; the steps in brackets are left out when their amount is 0. A tensor of rank other than 2
and 4 is viewed as ``[rows, last axis]`` (:func:`gelu_view`): an element-wise op does not care about the layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vta.config import MEM_ACC_8BIT, MEM_OUT, VTAConfig
from vta.isa import Uop
from vta.program import Allocation, Program, ProgramBuilder, SlotRing

from ..ir import Graph, Node
from ..qops import IGELU_ATTRS, igelu_params
from .codegen import LayerCode, _alu_opcode, _count_uops
from .intrin import Intrinsics, intrinsics
from .layout import packed_activation_shape
from .rowwise import build_alu_program, swap_nodes
from .schedule import EltwiseTiling, ScheduleError
from .uopcache import UopCache

__all__ = ["GeluLayer", "gelu_view", "gelu_passes", "emit_gelu", "build_gelu_program", "REGIONS", "GELU_MODES",
           "integer_gelu"]

GELU_MODES = ("auto", "int", "table")
"""How a Gelu (quantized as a ``QLut`` table of ``function`` ``"Gelu"``) runs: ``table`` keeps the float table on
the CPU; ``int`` makes it I-BERT's integer ``QGelu`` (the partitioner places it, on the accelerator's ALU or the
CPU, by its estimates); ``auto`` (the default) makes it ``QGelu`` where the partitioner places that on the
accelerator and keeps the table elsewhere (on the CPU the table is as fast and exact to the float rounding)."""

REGIONS = 3
"""acc regions per tile (X, V, D), each ``tile`` entries."""


def gelu_view(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The NCHW or ``[N, K]`` shape the accelerator sees a tensor of ``shape`` as: itself at rank 2 or 4, else
    ``[product of the leading axes, last axis]``."""
    if len(shape) in (2, 4):
        return tuple(shape)
    if not shape:
        return (1, 1)
    return (int(np.prod(shape[:-1])), int(shape[-1]))


@dataclass(frozen=True)
class GeluLayer:
    """An integer GELU over an int8 tensor seen as NCHW or ``[N, K]`` ``shape`` (:func:`gelu_view`), with the
    constants of :func:`..qops.igelu_params` (``qb``, ``f``, ``k1``, ``qc``, ``k2``, ``multiplier``, ``shift``)."""

    shape: tuple[int, ...]
    qb: int
    f: int
    k1: int
    qc: int
    k2: int
    multiplier: int
    shift: int

    @classmethod
    def from_attrs(cls, shape: tuple[int, ...], attrs: dict[str, object]) -> "GeluLayer":
        """From a ``QGelu`` node's attributes and its tensor's shape (any rank)."""
        values = [int(attrs[k]) for k in IGELU_ATTRS]  # type: ignore[call-overload]
        return cls(gelu_view(tuple(shape)), *values)


def gelu_passes(layer: GeluLayer) -> list[tuple[str, str, int | str]]:
    """The ALU steps as ``(op, destination region, immediate or source region)``, regions ``"X"``, ``"V"``,
    ``"D"``; :func:`..qops.igelu_trace`'s order (see the module docstring)."""
    steps: list[tuple[str, str, int | str]] = [("MUL", "V", -1), ("MAX", "V", "X"), ("MUL", "D", -1),
                                                ("MAX", "D", "X")]
    if layer.f:
        steps.append(("MUL", "D", 1 << layer.f))
    if layer.qb < 128 << layer.f:
        steps.append(("MIN", "D", layer.qb))
    steps += [("ADD", "D", -layer.qb), ("MUL", "D", "D")]
    if layer.k1:
        steps.append(("SHR", "D", layer.k1))
    steps += [("ADD", "D", layer.qc), ("MUL", "D", "V"), ("MUL", "X", layer.qc), ("ADD", "D", "X")]
    if layer.k2:
        steps.append(("SHR", "D", layer.k2))
    steps.append(("MUL", "D", layer.multiplier))
    if layer.shift > 15:
        steps += [("SHR", "D", layer.shift - 15), ("ADD", "D", 1 << 14), ("SHR", "D", 15)]
    elif layer.shift > 0:
        steps += [("ADD", "D", 1 << (layer.shift - 1)), ("SHR", "D", layer.shift)]
    steps += [("MAX", "D", -128), ("MIN", "D", 127)]
    return steps


def plan_gelu(entries: int, intr: Intrinsics, *, threads: int = 2) -> EltwiseTiling:
    """Tiles of ``entries`` packed elements: each tile holds :data:`REGIONS` regions in one acc part."""
    if entries < 1:
        raise ScheduleError(f"an elementwise op needs at least one element, not {entries}")
    tile = min(entries, intr.capacity("acc") // (REGIONS * threads), intr.loop_max)
    if tile < 1:
        raise ScheduleError(f"the acc buffer ({intr.capacity('acc')} entries) is too small for {REGIONS} regions in "
                            f"each of {threads} parts")
    return EltwiseTiling(entries, tile, threads)


def emit_gelu(pb: ProgramBuilder, layer: GeluLayer, x: Allocation, y: Allocation, *, prefix: str = "",
              threads: int = 2) -> LayerCode:
    """Emit the integer GELU of packed ``x`` into packed ``y`` (same packed shape); ``threads`` as in
    :func:`.codegen.emit_conv` (2: tiles alternate between the two halves of acc/out)."""
    intr = intrinsics(pb.cfg)
    first_insn = len(pb.insns)
    entries = int(np.prod(x.shape[:4]))
    plan = plan_gelu(entries, intr, threads=threads)
    uops = UopCache(pb, intr, prefix, preload=True)
    code = LayerCode([x], y, tiles=0)
    half = intr.capacity("acc") // threads
    tiles = list(plan.tiles())
    x_addr = pb.elem_addr(x, MEM_ACC_8BIT)
    outs = SlotRing(pb, "compute", "store", threads, total=len(tiles))
    steps = gelu_passes(layer)
    for e0, count in tiles:
        base = outs.claim() * half
        region = {"X": base, "V": base + plan.tile, "D": base + 2 * plan.tile}
        for name in ("X", "V", "D"):
            pb.load(MEM_ACC_8BIT, sram_base=region[name], dram_base=x_addr + e0, x_size=count)
        for op, dst, arg in steps:
            imm = arg if isinstance(arg, int) else None
            src = 0 if isinstance(arg, int) else region[arg]
            bgn, end = uops.place([Uop(region[dst], src)])
            pb.alu(_alu_opcode(intr, op, imm), uop_bgn=bgn, uop_end=end, iter_out=count, dst_factor_out=1,
                   src_factor_out=0 if imm is not None else 1, use_imm=imm is not None, imm=imm or 0)
        outs.handoff()
        pb.store(sram_base=region["D"], dram_base=pb.elem_addr(y, MEM_OUT) + e0, x_size=count)
        outs.release()
        code.tiles += 1
    uops.close()
    _count_uops(code, pb.insns[first_insn:])
    return code


def build_gelu_program(cfg: VTAConfig, layer: GeluLayer, x_packed: np.ndarray | None = None, *,
                       threads: int = 2) -> tuple[Program, LayerCode]:
    """A program computing one integer GELU: input allocation ``x`` (packed ``(N/B, C/BI, H, W, B, BI)``; zeros when
    ``x_packed`` is None), output ``y`` of the same packed shape."""
    return build_alu_program(cfg, layer.shape, lambda pb, x, y: emit_gelu(pb, layer, x, y, threads=threads),
                             x_packed)


def gelu_accel_uops(layer: GeluLayer, intr: Intrinsics) -> tuple[int, int]:
    """(compute-module cycles, DMA bytes) of the layer, for the partitioner's estimate: one ALU micro-op per step
    and packed entry, plus the three ACC_8BIT loads of every packed element, which the compute module runs at
    ``cfg.bus_bytes`` per cycle; the DMA bytes are those loads and the int8 store."""
    entries = int(np.prod(packed_activation_shape(layer.shape, intr.batch, intr.block_in)[:4]))
    size = entries * intr.batch * intr.block_in
    return len(gelu_passes(layer)) * entries + REGIONS * size // intr.cfg.bus_bytes, (REGIONS + 1) * size


def integer_gelu(graph: Graph) -> tuple[Graph, dict[str, Node]]:
    """``graph`` with every Gelu table (``QLut`` of ``function`` ``"Gelu"``) replaced by a ``QGelu`` node of the
    same name, inputs, outputs and scales (constants by :func:`..qops.igelu_params`; a table whose scales the
    integer GELU cannot take is kept), and the replaced table nodes by name. ``graph`` itself is unchanged (a copy
    when anything is replaced)."""
    found: dict[str, dict[str, int]] = {}
    for node in graph.nodes:
        if node.op != "QLut" or node.attrs.get("function") != "Gelu":
            continue
        s_in, s_out = graph.tensors[node.inputs[0]].scale, graph.tensors[node.outputs[0]].scale
        if s_in is None or s_out is None:
            continue
        try:
            found[node.name] = igelu_params(s_in, s_out)
        except ValueError:
            continue
    return swap_nodes(graph, "QGelu", found)
