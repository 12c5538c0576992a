"""Partitioning: for each node of a quantized graph, run it on the accelerator or on the CPU, and say why.

A node goes to the accelerator when a rule of :data:`ACCEL_RULES` lowers it (the op is one the accelerator runs and
the layer can be tiled for the config) **and** the accelerator is estimated to be faster than the CPU, each side
charged with the layout conversions its choice causes (inputs produced on the other side, an output read by the
other side). Every decision is a :class:`Decision` that names the reason, so the report can show it.

The estimates are deliberately simple and documented here:

* accelerator time = ``max(GEMM + ALU micro-op iterations, DMA bytes / bus bytes per cycle)`` cycles at
  ``cfg.clock_mhz``, plus :data:`ACCEL_LAUNCH_US` per layer (program launch);
* CPU time = MACs / :data:`CPU_MACS_PER_US` (the llvmlite kernels) plus output elements at the operator's measured
  rate (:data:`CPU_ELEMS_PER_US_BY_OP`: the softmax, LayerNorm, GELU and copy kernels) or else
  :data:`CPU_ELEMS_PER_US` (:func:`cpu_estimate_us`);
* a layout conversion (pack or unpack) costs bytes / :data:`CONVERT_BYTES_PER_US`.

One exception under the ``auto`` policy: when the estimates would leave the accelerator with nothing to run (a small
model such as ``tiny_cnn``, where the launch cost outweighs every layer), the supported layer where the accelerator
comes closest (the smallest ratio of accelerator to CPU time) is placed on it all the same, and the later nodes are
decided again around it. A model that already puts a layer on the accelerator is partitioned as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from vta.config import VTAConfig

from ..ir import Graph, GraphIndex, Node, node_macs
from .codegen import AddLayer, ConvLayer, alu_passes, fused_requant, rounding_start
from .dense_rows import rows_image
from .gelu import GeluLayer, gelu_accel_uops
from .intrin import Intrinsics, intrinsics
from .layernorm import LayerNormLayer, layernorm_accel_cycles, plan_layernorm
from .layout import bias_lane_weights, ceil_div, fold_weight_columns, im2col_weights, packed_activation_shape, round_up
from .matmul import lower_matmul
from .precision import width_problem
from .requant import offset_start
from .schedule import ScheduleError, plan_conv
from .softmax import SoftmaxLayer, plan_softmax, softmax_accel_cycles

__all__ = ["Decision", "Lowered", "ColumnFold", "partition", "lower_node", "ACCEL_RULES", "POLICIES", "STEMS",
           "ACCEL_LAUNCH_US", "CPU_MACS_PER_US", "CPU_ELEMS_PER_US", "CPU_ELEMS_PER_US_BY_OP", "CONVERT_BYTES_PER_US",
           "block_utilization", "cpu_estimate_us"]

ACCEL_LAUNCH_US = 5.0
CPU_MACS_PER_US = 2000.0
CPU_ELEMS_PER_US = 500.0
CPU_ELEMS_PER_US_BY_OP: dict[str, float] = {
    "QSoftmax": 24.0, "QLayerNorm": 290.0, "QISoftmax": 125.0, "QILayerNorm": 275.0, "QLut": 4000.0,
    "QMul": 5000.0, "Quantize": 4300.0, "Dequantize": 8200.0, "Slice": 2100.0, "Transpose": 4400.0,
    "Reshape": 86000.0, "QLut2": 2500.0}
"""Output elements per microsecond of the CPU backend's kernels that :data:`CPU_ELEMS_PER_US` misjudges most,
measured on BERT-base's block (sequence 128, width 768: each kind's elements over its nodes' summed time, on the
2-core development machine; ``python3 scripts/bench_cpu_rates.py`` prints them beside the estimates). Row-wise
kernels are slower than the default rate (the float softmax calls ``exp`` one element at a time) and copies are
faster. Small tensors run
below these rates: each kernel call costs microseconds of its own, which no estimate here counts. Two measured rates
are left out on purpose: QAdd (8,900) would move the CNNs' residual adds to the CPU, and QGelu (110) a decode step's
GELU to the ALU, decisions that also rest on the layout conversions' and the GELU table's costs, which need their own
measurement first. QLut2 (a table of pairs, :func:`..kernels.cpu.lut2`'s JIT kernel) is measured alone, on 262,144
and 1,048,576 random pairs: 2,600 to 2,700 elements per microsecond (numpy's two-index lookup, the integer
reference: about 280)."""
CONVERT_BYTES_PER_US = 1000.0
STEMS = ("auto", "im2col", "columns", "direct")
"""Lowerings of a convolution whose few-channel input comes from the CPU side (a network's first convolution):
``im2col`` folds the whole kernel window and the channels into the reduction (a 1x1 GEMM; bias in spare lanes),
``columns`` folds the kernel columns only, ``direct`` folds nothing; ``auto`` picks the fastest by
:func:`stem_costs`."""
POLICIES = ("auto", "accel", "cpu")
"""``auto``: accelerator where supported and faster (and at least one layer there when it can run any);
``accel``: wherever supported; ``cpu``: nothing offloaded."""


@dataclass(frozen=True)
class Decision:
    """Where node ``node`` runs (``target`` is ``"accel"`` or ``"cpu"``) and why; estimates in microseconds."""

    node: str
    op: str
    target: str
    reason: str
    macs: int = 0
    accel_us: float | None = None
    cpu_us: float | None = None


@dataclass(frozen=True)
class ColumnFold:
    """The input transform of a first convolution, done on the host before packing: with ``kh == 0``,
    :func:`~.layout.fold_kernel_columns` (kernel width, column stride, W paddings; the layer becomes ``KH x 1``);
    with ``kh > 0``, :func:`~.layout.im2col` of the whole ``kh x kw`` window (row stride ``sh``, H paddings too;
    the layer becomes a 1x1 GEMM) with ``bias_lanes`` constant lanes that carry the bias (0: the bias stays an ALU
    ADD)."""

    kw: int
    sw: int
    pad_left: int
    pad_right: int
    kh: int = 0
    sh: int = 1
    pad_top: int = 0
    pad_bottom: int = 0
    bias_lanes: int = 0

    @property
    def label(self) -> str:
        """``im2col`` or ``kw-folded``: the lowering's name in reports."""
        return "im2col" if self.kh else "kw-folded"


@dataclass(frozen=True)
class Lowered:
    """An accelerator layer and the transform (if any) its first input needs on the CPU side first. ``own_layout``:
    the layer reads and writes layouts of its own (a QDense over its rows, :mod:`.dense_rows`), so its input and
    output are converted whichever side they come from or go to."""

    layer: ConvLayer | AddLayer | GeluLayer | LayerNormLayer | SoftmaxLayer
    fold: ColumnFold | None = None
    own_layout: bool = False


def stem_costs(graph: Graph, node: Node, intr: Intrinsics) -> dict[str, tuple[float, int, int]]:
    """For a convolution whose input comes from the CPU side: lowering (:data:`STEMS` but ``auto``) -> (estimated
    microseconds, micro-ops per output vector, host bytes packed). The estimate is the accelerator's micro-ops
    (GEMM per reduction block and tap, one reset unless ``gemm_overwrite`` makes it a MAC micro-op, the layer's ALU
    passes (:func:`~.codegen.alu_passes`: ADD bias unless the bias rides in spare im2col lanes, MUL, SHR, MAX, MIN,
    or REQ with ``fused_requant``) at ``cfg.clock_mhz`` plus the host's im2col/fold and packing bytes at
    :data:`CONVERT_BYTES_PER_US`. Empty when no fold applies: grouped, an accelerator producer, or folding the
    kernel columns into channels would not need fewer GEMM micro-ops (``ceil(C*KW/BI) * KH`` against
    ``ceil(C/BI) * KH * KW`` per output pixel: the input has many channels or the kernel one column)."""
    if node.op != "QConv2d" or int(node.attrs.get("groups", 1)) != 1:
        return {}
    producer = graph.producer(node.inputs[0])
    if producer is not None and producer.op in ACCEL_RULES:
        return {}
    n, c, h, w = graph.shape(node.inputs[0])
    o, _, kh, kw = graph.shape(node.inputs[1])
    bi, cfg = intr.block_in, intr.cfg
    if kw == 1 or ceil_div(c * kw, bi) * kh >= ceil_div(c, bi) * kh * kw:  # only few channels gain from a fold
        return {}
    _, _, oh, ow = graph.shape(node.outputs[0])
    vectors = ceil_div(n, intr.batch) * intr.batch * ceil_div(o, intr.block_out) * oh * ow
    k = c * kh * kw
    lanes = round_up(k, bi) - k
    bias = graph.constants[node.inputs[2]] if len(node.inputs) > 2 else np.zeros(o, np.int32)
    int8 = cfg.inp_width == 8 and cfg.wgt_width == 8  # bias lanes hold int8 values (127): int8 designs only
    carried = not np.asarray(bias).any() or (int8 and lanes > 0 and bias_lane_weights(bias, lanes) is not None)
    rq = node.attrs["requant"]
    a = node.attrs
    layer = ConvLayer.make((n, c, h, w), graph.constants[node.inputs[1]], bias, rq.multiplier, rq.shift, rq.lo, rq.hi,
                           strides=tuple(a.get("strides", (1, 1))), pads=tuple(a.get("pads", (0, 0, 0, 0))), intr=intr)
    offset = offset_start(layer, intr)  # the bias in a one-pass start instead of the reset (MIN, or reset and ADD)
    passes = alu_passes(layer, fused=fused_requant(layer, intr), offset=offset is not None)
    other = (0 if cfg.gemm_overwrite else 1) + len(passes)  # the reset and the ALU passes, per output vector
    per = {"direct": ceil_div(c, bi) * kh * kw + other, "columns": ceil_div(c * kw, bi) * kh + other,
           "im2col": ceil_div(k, bi) + other - (carried and "ADD" in passes)}
    packed = {"direct": round_up(c, bi) * h * w, "columns": round_up(c * kw, bi) * h * ow,
              "im2col": round_up(k, bi) * oh * ow}
    return {name: (per[name] * vectors / (intr.batch * cfg.clock_mhz) + n * packed[name] / CONVERT_BYTES_PER_US,
                   per[name], n * packed[name]) for name in per}


def _fold_rule(graph: Graph, node: Node, intr: Intrinsics, stem: str = "auto") -> ColumnFold | None:
    """The host-side fold of a convolution's few-channel input from the CPU side (see :data:`STEMS`): ``auto``
    takes the lowering :func:`stem_costs` estimates fastest (so the fold is used only when it pays for its host
    time); None keeps the layer as it is."""
    costs = stem_costs(graph, node, intr)
    if not costs:
        return None
    choice = min(costs, key=lambda name: costs[name][0]) if stem == "auto" else stem
    if choice == "direct":
        return None
    _, c, _, _ = graph.shape(node.inputs[0])
    o, _, kh, kw = graph.shape(node.inputs[1])
    pads = tuple(int(p) for p in node.attrs.get("pads", (0, 0, 0, 0)))
    sh, sw = (int(v) for v in node.attrs.get("strides", (1, 1)))
    if choice == "columns":
        return ColumnFold(kw, sw, pads[1], pads[3])
    k = c * kh * kw
    lanes = round_up(k, intr.block_in) - k
    bias = graph.constants[node.inputs[2]] if len(node.inputs) > 2 else np.zeros(o, np.int32)
    int8 = intr.cfg.inp_width == 8 and intr.cfg.wgt_width == 8  # bias lanes hold int8 values: int8 designs only
    carry = np.asarray(bias).any() and int8 and lanes > 0 and bias_lane_weights(bias, lanes) is not None
    return ColumnFold(kw, sw, pads[1], pads[3], kh, sh, pads[0], pads[2], lanes if carry else 0)


def _lower_conv(graph: Graph, node: Node, intr: Intrinsics, stem: str = "auto") -> Lowered:
    a = node.attrs
    rq = a["requant"]
    x_shape = graph.shape(node.inputs[0])
    w = graph.constants[node.inputs[1]]
    bias = graph.constants[node.inputs[2]] if len(node.inputs) > 2 else np.zeros(w.shape[0], np.int32)
    strides = tuple(a.get("strides", (1, 1)))
    pads = tuple(a.get("pads", (0, 0, 0, 0)))
    fold = _fold_rule(graph, node, intr, stem)
    image = rows_image(x_shape, intr) if node.op == "QDense" else None
    if image is not None:  # a QDense of several rows: a 1x1 convolution over its rows (.dense_rows)
        x_shape, w = image, w.reshape(w.shape[0], w.shape[1], 1, 1)
    elif fold is not None and fold.kh:
        n, c, _, _ = x_shape
        _, _, oh, ow = graph.shape(node.outputs[0])
        lane_w = bias_lane_weights(bias, fold.bias_lanes) if fold.bias_lanes else None
        w = im2col_weights(w, lane_w)
        if lane_w is not None:
            bias = np.zeros_like(bias)
        x_shape, strides, pads = (n, w.shape[1], oh, ow), (1, 1), (0, 0, 0, 0)
    elif fold is not None:
        n, c, h, _ = x_shape
        ow = graph.shape(node.outputs[0])[3]
        x_shape, w = (n, c * fold.kw, h, ow), fold_weight_columns(w)
        strides, pads = (strides[0], 1), (pads[0], 0, pads[2], 0)
    layer = ConvLayer.make(x_shape, w, bias, rq.multiplier, rq.shift, rq.lo, rq.hi, strides=strides, pads=pads,
                           groups=int(a.get("groups", 1)), intr=intr)
    plan_conv(layer.geom, intr)  # raises ScheduleError when it cannot be tiled
    return Lowered(layer, fold, own_layout=image is not None)


def _lower_add(graph: Graph, node: Node, intr: Intrinsics) -> Lowered:
    sa, sb = graph.shape(node.inputs[0]), graph.shape(node.inputs[1])
    if sa != sb:
        raise ScheduleError(f"the operands have shapes {sa} and {sb}; the accelerator adds equal shapes only")
    if len(sa) not in (2, 4):
        raise ScheduleError(f"the operands have {len(sa)} dimensions; the accelerator adds NCHW or [N, K] tensors")
    rq = node.attrs["requant"]
    return Lowered(AddLayer(tuple(sa), int(rq.ma), int(rq.mb), int(rq.shift), int(rq.lo), int(rq.hi)))


def _loads_int8(intr: Intrinsics, what: str) -> None:
    """ScheduleError unless the design's inputs are int8: the integer ``what`` (an ALU-only layer) loads its int8
    input as ACC_8BIT."""
    if intr.cfg.inp_width != 8:
        raise ScheduleError(f"the integer {what} loads int8 inputs; this design's inputs are int{intr.cfg.inp_width}")


def _lower_gelu(graph: Graph, node: Node, intr: Intrinsics) -> Lowered:
    """QGelu (I-BERT's integer GELU) as an ALU-only layer (:mod:`.gelu`): int8 designs only (ACC_8BIT loads)."""
    _loads_int8(intr, "GELU")
    return Lowered(GeluLayer.from_attrs(graph.shape(node.inputs[0]), node.attrs))


def _lower_layernorm(graph: Graph, node: Node, intr: Intrinsics) -> Lowered:
    """QILayerNorm (the integer LayerNorm) as an ALU-only layer (:mod:`.layernorm`): int8 designs with the
    ``lane_reduce`` knob, rows of a multiple of BLOCK_OUT features that fit the acc buffer."""
    _loads_int8(intr, "LayerNorm")
    layer = LayerNormLayer.from_attrs(graph.shape(node.inputs[0]), node.attrs)
    plan_layernorm(layer, intr)
    return Lowered(layer)


def _lower_softmax(graph: Graph, node: Node, intr: Intrinsics) -> Lowered:
    """QISoftmax (the integer Softmax) as an ALU-only layer (:mod:`.softmax`): int8 designs with the
    ``lane_reduce`` knob, rows of a multiple of BLOCK_OUT features that fit the acc buffer."""
    _loads_int8(intr, "Softmax")
    layer = SoftmaxLayer.from_attrs(graph.shape(node.inputs[0]), node.attrs)
    plan_softmax(layer, intr)
    return Lowered(layer)


def _lower_matmul(graph: Graph, node: Node, intr: Intrinsics) -> Lowered:
    """QMatMul (two activations, or an activation and a constant) as a grouped 1x1 convolution
    (:mod:`.matmul`); one with zero points (a pre-quantized model's) stays on the CPU."""
    if any(node.attrs.get("zero_points", ())):
        raise ScheduleError(f"{node.name} multiplies activations with zero points {tuple(node.attrs['zero_points'])}"
                            f" (a pre-quantized model's); the accelerator's matrix product takes zero points of 0")
    return Lowered(lower_matmul(graph, node, intr))


def _refuse_wide_matmul(graph: Graph, node: Node, intr: Intrinsics) -> Lowered:
    raise ScheduleError(f"{node.name} keeps its attention scores exact in int32 (--attention-scores int32); the "
                        f"accelerator writes int8 outputs")


ACCEL_RULES: dict[str, Callable[[Graph, Node, Intrinsics], Lowered]] = {
    "QConv2d": _lower_conv,
    "QDense": _lower_conv,
    "QAdd": _lower_add,
    "QMatMul": _lower_matmul,
    "QMatMulWide": _refuse_wide_matmul,
    "QGelu": _lower_gelu,
    "QILayerNorm": _lower_layernorm,
    "QISoftmax": _lower_softmax,
}
"""op -> rule lowering a node to an accelerator layer (raises :class:`ScheduleError` when it cannot)."""


def lower_node(graph: Graph, node: Node, intr: Intrinsics, stem: str = "auto") -> Lowered:
    """The accelerator layer for ``node`` on the config of ``intr``; :class:`ScheduleError` when no rule lowers it
    (including a layer no tiling fits). ``stem``: the lowering of a first convolution (:data:`STEMS`)."""
    if stem not in STEMS:
        raise ValueError(f"stem must be one of {', '.join(STEMS)}, not {stem!r}")
    if not isinstance(intr, Intrinsics):
        raise TypeError(f"lower_node() needs the Intrinsics of a config (see intrinsics(cfg)), not "
                        f"{type(intr).__name__}")
    rule = ACCEL_RULES.get(node.op)
    if rule is None:
        raise ScheduleError(f"the accelerator has no rule for op {node.op}")
    narrow = width_problem(graph, node, intr.cfg)  # int4 designs: values must fit the element widths
    if narrow is not None:
        raise ScheduleError(narrow)
    if stem != "auto" and rule is _lower_conv:
        return _lower_conv(graph, node, intr, stem)
    return rule(graph, node, intr)


def _accel_us(layer: ConvLayer | AddLayer | GeluLayer | LayerNormLayer | SoftmaxLayer, intr: Intrinsics) -> float:
    cfg = intr.cfg
    if isinstance(layer, ConvLayer):
        t = plan_conv(layer.geom, intr)
        g = layer.geom
        _, nib = g.block_ranges
        uops = g.nb * g.ob * nib * g.kh * g.kw * g.oh * g.ow + _other_uops(layer, intr) * g.nb * g.ob * g.oh * g.ow
        dma = t.dma_bytes(intr)
    elif isinstance(layer, GeluLayer):
        uops, dma = gelu_accel_uops(layer, intr)
    elif isinstance(layer, LayerNormLayer):
        uops, dma = layernorm_accel_cycles(layer, intr)
    elif isinstance(layer, SoftmaxLayer):
        uops, dma = softmax_accel_cycles(layer, intr)
    else:
        entries = int(np.prod(packed_activation_shape(layer.shape, intr.batch, intr.block_in)[:4]))
        uops = 6 * entries
        dma = 3 * int(np.prod(layer.shape))
    cycles = max(uops, dma / cfg.bus_bytes)
    return cycles / cfg.clock_mhz + ACCEL_LAUNCH_US


def _other_uops(layer: ConvLayer, intr: Intrinsics) -> int:
    """The micro-ops a convolution or linear layer spends per output vector besides its GEMMs: the accumulators'
    reset (unless ``gemm_overwrite``) and its ALU passes as its program applies them (:func:`~.codegen.alu_passes`
    with the offset start, the rounding start and ``fused_requant`` as the code generator decides them)."""
    offset = offset_start(layer, intr) is not None
    passes = alu_passes(layer, fused=fused_requant(layer, intr), offset=offset,
                        start=offset or rounding_start(layer, intr) is not None)
    return (0 if intr.cfg.gemm_overwrite else 1) + len(passes)


def cpu_estimate_us(graph: Graph, node: Node) -> float:
    """The estimated CPU time of ``node`` in microseconds: its MACs at :data:`CPU_MACS_PER_US` plus its output
    elements at its operator's rate (:data:`CPU_ELEMS_PER_US_BY_OP`, else :data:`CPU_ELEMS_PER_US`)."""
    macs = node_macs(graph, node)
    elems = sum(graph.tensors[name].size for name in node.outputs)
    return macs / CPU_MACS_PER_US + elems / CPU_ELEMS_PER_US_BY_OP.get(node.op, CPU_ELEMS_PER_US)


def _convert_us(graph: Graph, index: GraphIndex, node: Node, placement: dict[str, str], target: str, *,
                own_layout: bool = False) -> float:
    """Layout conversions placing ``node`` on ``target`` adds: inputs produced on the other side are converted, and
    so is the output when a consumer will likely run on the other side (it has no accelerator rule, or has one).
    ``own_layout``: the accelerator layer reads and writes layouts of its own (a QDense over its rows,
    :mod:`.dense_rows`), so on the accelerator every input and the output are converted, whatever side they are
    on. ``index`` is ``graph``'s."""
    cost = 0.0
    for name in node.inputs:
        if name in graph.constants:
            continue
        producer = index.producer(name)
        source = placement.get(producer.name, "cpu") if producer is not None else "cpu"
        if source != target or own_layout:
            cost += graph.tensors[name].size / CONVERT_BYTES_PER_US
    for consumer in index.consumers(node.outputs[0]):
        likely = "accel" if consumer.op in ACCEL_RULES else "cpu"
        if likely != target or own_layout:
            cost += graph.tensors[node.outputs[0]].size / CONVERT_BYTES_PER_US
            break
    return cost


def partition(graph: Graph, cfg: VTAConfig, *, policy: str = "auto",
              force_cpu: frozenset[str] | set[str] = frozenset(),
              lowered: dict[str, Lowered] | None = None, stem: str = "auto") -> dict[str, Decision]:
    """A :class:`Decision` for every node of the quantized ``graph`` (in graph order).

    ``policy`` is one of :data:`POLICIES`; ``force_cpu`` names nodes that must stay on the CPU. When ``lowered`` is
    given, it receives the :class:`Lowered` layer of every node placed on the accelerator (node name -> layer), so
    code generation can use it instead of lowering the node again. ``stem``: how a first convolution is lowered
    (:data:`STEMS`; ``auto`` picks the fastest and the decision's reason says which and why).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    intr = intrinsics(cfg)
    if stem not in STEMS:
        raise ValueError(f"stem must be one of {', '.join(STEMS)}, not {stem!r}")
    decisions, layers = _place(graph, intr, policy, force_cpu, frozenset(), stem)
    if policy == "auto" and all(d.target == "cpu" for d in decisions.values()):
        closest = _closest_call(decisions)
        if closest is not None:
            decisions, layers = _place(graph, intr, policy, force_cpu, frozenset({closest}), stem)
    if lowered is not None:
        lowered.update(layers)
    return decisions


def _place(graph: Graph, intr: Intrinsics, policy: str, force_cpu: frozenset[str] | set[str],
           prefer: frozenset[str], stem: str = "auto") -> tuple[dict[str, Decision], dict[str, Lowered]]:
    """Decide every node in graph order (each decision sees where its producers went); ``prefer`` names nodes placed
    on the accelerator whatever the estimates say. Returns the decisions and the lowered accelerator layers."""
    decisions: dict[str, Decision] = {}
    placement: dict[str, str] = {}
    layers: dict[str, Lowered] = {}
    index = GraphIndex(graph)
    for node in graph.nodes:
        macs = node_macs(graph, node)
        decision, layer = _decide(graph, index, node, intr, policy, force_cpu, placement, macs, prefer, stem)
        decisions[node.name] = decision
        placement[node.name] = decision.target
        if layer is not None and decision.target == "accel":
            layers[node.name] = layer
    return decisions, layers


def _closest_call(decisions: dict[str, Decision]) -> str | None:
    """The node the accelerator was estimated to run closest to the CPU's time (smallest accelerator / CPU ratio),
    among the nodes it could run; None when it could run none."""
    candidates = [d for d in decisions.values() if d.accel_us is not None and d.cpu_us]
    if not candidates:
        return None
    return min(candidates, key=lambda d: (d.accel_us or 0.0) / (d.cpu_us or 1.0)).node


def _decide(graph: Graph, index: GraphIndex, node: Node, intr: Intrinsics, policy: str,
            force_cpu: frozenset[str] | set[str], placement: dict[str, str], macs: int,
            prefer: frozenset[str] = frozenset(), stem: str = "auto") -> tuple[Decision, Lowered | None]:
    """The decision for ``node`` and its lowered layer (None when the node was not lowered); ``index`` is
    ``graph``'s."""
    cfg = intr.cfg
    cpu_us = cpu_estimate_us(graph, node)
    if node.op not in ACCEL_RULES:
        return Decision(node.name, node.op, "cpu", f"{node.op} has no accelerator rule", macs, None, cpu_us), None
    if policy == "cpu":
        return Decision(node.name, node.op, "cpu", "the cpu policy offloads nothing", macs, None, cpu_us), None
    if node.name in force_cpu:
        return Decision(node.name, node.op, "cpu", "forced onto the CPU", macs, None, cpu_us), None
    try:
        layer = lower_node(graph, node, intr, stem)
    except ScheduleError as err:
        return Decision(node.name, node.op, "cpu", f"not supported on {cfg.name}: {err}", macs, None, cpu_us), None
    accel_us = _accel_us(layer.layer, intr) + _convert_us(graph, index, node, placement, "accel",
                                                          own_layout=layer.own_layout)
    cpu_us += _convert_us(graph, index, node, placement, "cpu")
    if node.name in prefer:
        why = (f"the accelerator's closest call ({accel_us:.0f} us vs {cpu_us:.0f} us on the CPU): the auto policy "
               f"puts at least one layer on the accelerator")
        return Decision(node.name, node.op, "accel", why, macs, accel_us, cpu_us), layer
    if policy == "accel" or accel_us < cpu_us:
        why = "supported" if policy == "accel" else f"faster ({accel_us:.0f} us vs {cpu_us:.0f} us on the CPU)"
        why += _stem_reason(graph, node, intr, layer, stem) + _matmul_reason(graph, node, layer)
        return Decision(node.name, node.op, "accel", why, macs, accel_us, cpu_us), layer
    return Decision(node.name, node.op, "cpu", f"the CPU is faster ({cpu_us:.0f} us vs {accel_us:.0f} us)", macs,
                    accel_us, cpu_us), layer


def _matmul_reason(graph: Graph, node: Node, layer: Lowered) -> str:
    """``; <G> groups of a grouped 1x1 convolution, ...``: how a QMatMul runs (nothing for other ops)."""
    if node.op != "QMatMul" or not isinstance(layer.layer, ConvLayer):
        return ""
    how = "b packed at compile time" if node.inputs[1] in graph.constants else "b packed into the weight layout " \
        "by the host"
    return f"; a grouped 1x1 convolution of {layer.layer.geom.groups} groups, {how}"


def _stem_reason(graph: Graph, node: Node, intr: Intrinsics, layer: Lowered, stem: str) -> str:
    """``; <lowering> by ...``: which first-convolution lowering was taken and what it was chosen by: each
    lowering's estimated time relative to the taken one's (so the reason quotes one absolute estimate, the
    placement's), its micro-ops per output vector and host bytes (nothing when ``auto`` kept the layer as it is)."""
    costs = stem_costs(graph, node, intr)
    if not costs:
        return ""
    if layer.fold is None and stem == "auto":
        return ""
    taken = layer.fold.label if layer.fold is not None else "direct"
    names = {"im2col": "im2col", "columns": "kw-folded", "direct": "direct"}
    base = costs[taken][0] if taken in costs and costs[taken][0] else 1.0
    parts = ", ".join(f"{names[k]} {v[0] / base:.2f}x ({v[1]} uops/vector, {v[2]:,} host bytes)"
                      for k, v in costs.items())
    how = "the fastest estimate" if stem == "auto" else f"stem={stem}"
    return f"; {names.get(taken, taken)} by {how}, time relative to it: {parts}"


def block_utilization(layer: ConvLayer) -> float:
    """Fraction of the GEMM core's MACs that are useful for ``layer`` (channel padding and grouping waste)."""
    g = layer.geom
    _, nib = g.block_ranges
    issued = g.nb * g.batch * g.ob * g.block_out * nib * g.block_in * g.kh * g.kw * g.oh * g.ow
    return g.macs / issued if issued else 0.0

