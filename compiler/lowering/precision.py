"""Whether a quantized layer's values fit the design's element widths (int4 or int8 inputs and weights).

An accelerator layer reads its activations as inp elements (``cfg.inp_width`` bits), its constant operand as wgt
elements (``cfg.wgt_width`` bits) and writes outputs of the out width (``cfg.out_width`` = the input width). The
quantizer (:func:`..frontend.quantize.quantize` with ``act_bits`` / ``wgt_bits``) produces graphs whose values fit a
narrow design; a graph quantized for wider elements (e.g. an int8 graph on an int4 design, or an op that clips to
int8) is kept on the CPU by the partitioner, with the reason :func:`width_problem` gives.
"""
from __future__ import annotations

import numpy as np

from vta.config import VTAConfig
from vta.packing import element_range

from ..ir import Graph, Node

__all__ = ["value_range", "width_problem"]

_KEEPS_RANGE = ("MaxPool", "AvgPool", "GlobalAvgPool", "Reshape", "Transpose", "Slice", "Gather", "GatherAt",
                "TakeAlong", "Pad", "Resize")
"""Ops whose output values lie within their input's range (Pad adds its pad value)."""


def value_range(graph: Graph, name: str) -> tuple[int, int]:
    """The integer range ``(lo, hi)`` an int8 tensor ``name`` of the quantized ``graph`` can hold: its producer's
    clip range (requantizing layers, QClip, QAffine), through range-keeping ops; int8's full range otherwise."""
    if name in graph.constants:
        c = np.asarray(graph.constants[name])
        return (int(c.min()), int(c.max())) if c.size else (0, 0)
    prod = graph.producer(name)
    if prod is None:
        return -128, 127
    rq = prod.attrs.get("requant")
    if prod.op in ("QConv2d", "QDense", "QAdd") and rq is not None:
        return int(rq.lo), int(rq.hi)
    if prod.op in ("QClip", "QAffine"):
        return int(prod.attrs.get("lo", -128)), int(prod.attrs.get("hi", 127))
    if prod.op in _KEEPS_RANGE and prod.inputs:
        lo, hi = value_range(graph, prod.inputs[0])
        if prod.op == "Pad":
            pad = int(prod.attrs.get("value", 0))
            lo, hi = min(lo, pad), max(hi, pad)
        return lo, hi
    return -128, 127


def _fits(rng: tuple[int, int], bits: int) -> bool:
    lo, hi = element_range(bits)
    return lo <= rng[0] and rng[1] <= hi


def width_problem(graph: Graph, node: Node, cfg: VTAConfig) -> str | None:
    """Why ``node`` cannot run on ``cfg`` at its element widths (one sentence), or None when its values fit: every
    activation input within ``inp_width`` bits, a constant (weight) operand within ``wgt_width`` bits, the output's
    clip range within ``out_width`` bits. Always None on an int8 design."""
    if cfg.inp_width == 8 and cfg.wgt_width == 8:
        return None
    for k, name in enumerate(node.inputs):
        if node.op in ("QConv2d", "QDense") and k == 2:  # the bias: an int32 acc operand
            continue
        weight = name in graph.constants or (node.op == "QMatMul" and k == 1)
        bits, what = (cfg.wgt_width, "weights") if weight else (cfg.inp_width, "inputs")
        rng = value_range(graph, name)
        if not _fits(rng, bits):
            return (f"its {what} {name!r} hold values in [{rng[0]}, {rng[1]}], wider than the design's int{bits} "
                    f"{what} (a layer kept at int8, or a graph quantized for wider elements)")
    for out in node.outputs:
        rng = value_range(graph, out)
        if not _fits(rng, cfg.out_width):
            return (f"its output {out!r} is clipped to [{rng[0]}, {rng[1]}], wider than the design's "
                    f"int{cfg.out_width} outputs")
    return None
