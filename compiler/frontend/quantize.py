"""Post-training quantization: a float graph + calibration inputs -> a quantized graph (the contract of :mod:`.ir`).

Pipeline (:func:`quantize`):

1. :func:`prepare` folds a Mul/Add by a per-channel constant into the preceding Conv2d/Dense.
2. :func:`calibrate` runs the float reference on the calibration inputs and records, per tensor, the largest
   magnitude or optionally a percentile of it (and the per-channel maximum, to bound accumulators).
3. Each float node becomes quantized nodes. Conv2d/Dense followed by Relu/Clip fuse into one QConv2d/QDense; an
   activation Add followed by Relu fuses into one QAdd. Weights get symmetric int8 scales per output channel
   (``per_channel=True``), per tensor (``False``), or per channel only where channel ranges differ by more than
   ``1.5x`` (``"auto"``, so per-tensor layers keep ALU immediates). Requant (M, S) per output channel:

   - ``mode="multiply"``: the largest S <= 31 such that ``M = round(m * 2**S)`` is <= 32767 and ``acc * M`` stays
     inside int32 for every accumulator the layer can produce, not only the calibrated ones: the worst case of
     ``sum(x * w) + bias`` over all inputs ``x`` in the int8 range of the producing layer (its clip range, e.g.
     [0, 127] after a ReLU), plus the rounding below. The requantization product can therefore never wrap, whatever
     data the model is run on (qops and the ALU define ``acc * M`` as wrapping);
   - ``mode="shift"``: M = 1 and per-channel weight scales are powers of two apart so that ``2**-S[o]`` is exact.

   Rounding is folded into the bias: ``bias += 2**(S-1) // M``. Weights are rounded to nearest, or with
   ``weight_rounding="gptq"`` by GPTQ (:mod:`.gptq`: each layer's output error on the calibration inputs is least,
   at the same scales). Pass-through ops (pools, Reshape, Pad, a standalone
   Relu/Clip) keep their input's scale; Concat rescales each input to the output scale.
4. Graph inputs get a Quantize node; int8 graph outputs get a Dequantize node named like the float output.

:func:`compare_outputs` measures accuracy against a float reference (top-1 agreement, max error, SNR);
:func:`float_outputs` runs the float model (ONNX Runtime on the original file, else the float reference) and
:func:`accuracy_vs_float` gives the error ``vta run`` reports (LSBs, % of range, cosine, top-1/top-5 agreement).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

import numpy as np
import onnx

from vta.progress import Progress

from ..ir import M_MAX, REQUANT_MODES, S_MAX, AddRequant, Graph, GraphError, GraphIndex, Node, Requant
from ..qops import KEY_MASK_ATTRS, PRODUCT_BOUND
from ..qops import run_reference as qops_reference
from . import float_ref
from .gptq import MOMENTS_MAX_K, gptq_round, input_moments
from .pointwise import pointwise_values

__all__ = ["QuantizationError", "Calibration", "prepare", "calibrate", "quantize", "choose_requant", "SCORE_WIDTHS",
           "choose_int8_layers", "compare_outputs", "float_outputs", "accuracy_vs_float", "output_scale"]

INT32_MAX = 2**31 - 1
BIAS_LIMIT = 2**30 - 1
"""The largest ``|bias| + max|sum(x * w)|`` of a quantized layer: the bias is clipped so that the accumulator plus the
rounding :func:`choose_requant` adds (at most 2**30) stays inside int32 whatever the input."""


def _dead_floor(per: np.ndarray) -> float:
    """The least weight range ``max|w|`` a channel is quantized at, given every channel's ``per`` ``[O]``: 2**-8 of
    the largest (a dead channel's bias, at the input scale times its weight scale, stays inside int32), and 1.0 when
    every weight is 0 (a layer whose output is its bias: a floor of 1e-12 put the bias at 1e14 units, clipped to
    int32, and the layer computed 0)."""
    top = float(per.max()) if per.size else 0.0
    return max(top * 2**-8, 1e-12) if top > 0 else 1.0


class QuantizationError(ValueError):
    """A node the quantizer cannot express in the quantized operator set (named in the message)."""


@dataclass
class Calibration:
    """Largest magnitude seen per tensor (``absmax``) and per channel of axis 1 (``channel_absmax``); with
    ``calibrate(..., moments=True)`` also, per Conv2d/Dense node name, the second moments of its input patches
    (``moments``: float64 ``[groups, K, K]`` summed over every sample and position, :func:`.gptq.input_moments`),
    which ``quantize(..., weight_rounding="gptq")`` rounds the weights with."""

    absmax: dict[str, float]
    channel_absmax: dict[str, np.ndarray]
    moments: dict[str, np.ndarray] = field(default_factory=dict)

    def scale(self, name: str, qmax: int = 127) -> float:
        """Symmetric scale of tensor ``name``: ``absmax / qmax`` (127 for int8, 7 for int4 activations; a tiny floor
        keeps all-zero tensors legal)."""
        return max(self.absmax[name], SCALE_FLOOR) / qmax


# ---- 1. folding -------------------------------------------------------------------------------------------------
def _per_channel_const(c: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``c`` as a vector of length ``channels`` if it broadcasts along axis 1 only, else None."""
    if c.size == 1:
        return np.full(channels, float(c.reshape(())))
    squeezed = c.reshape(-1)
    expected = {(channels,), (1, channels), (channels, 1, 1), (1, channels, 1, 1)} if rank == 4 else \
        {(channels,), (1, channels)}
    return squeezed.astype(np.float64) if c.shape in expected else None


def prepare(graph: Graph) -> Graph:
    """A copy of ``graph`` with Mul/Add-by-constant folded into a single-use preceding Conv2d/Dense."""
    g = graph.copy()
    changed = True
    while changed:
        changed = False
        for node in g.nodes:
            if node.op not in ("Mul", "Add") or node.inputs[1] not in g.constants:
                continue
            src = node.inputs[0]
            prod = g.producer(src)
            if prod is None or prod.op not in ("Conv2d", "Dense") or len(g.consumers(src)) != 1 or src in g.outputs:
                continue
            o = g.shape(prod.inputs[1])[0]
            c = _per_channel_const(g.constants[node.inputs[1]], o, len(g.shape(src)))
            if c is None:
                continue
            w = g.constants[prod.inputs[1]].astype(np.float64)
            b = g.constants[prod.inputs[2]].astype(np.float64) if len(prod.inputs) > 2 else np.zeros(o)
            if node.op == "Mul":
                w = w * c.reshape((o,) + (1,) * (w.ndim - 1))
                b = b * c
            else:
                b = b + c
            wname = g.unique_name(f"{node.name}_w")
            bname = g.unique_name(f"{node.name}_b")
            g.add_constant(wname, w.astype(np.float32))
            g.add_constant(bname, b.astype(np.float32))
            prod.inputs = [prod.inputs[0], wname, bname]
            g.nodes.remove(node)
            del g.tensors[src]
            prod.outputs = [node.outputs[0]]
            changed = True
            break
    g.prune_constants()
    g.validate()
    return g


# ---- 2. calibration -----------------------------------------------------------------------------------------------
def _samples(graph: Graph, inputs: Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]]) \
        -> Iterator[dict[str, np.ndarray]]:
    """Calibration inputs one graph batch at a time (a stacked dict is sliced and converted to float32 per batch, so
    only one batch is ever converted). Each input of a stacked dict stacks its own first axis: ``n`` samples of an
    input of shape ``[d0, ...]`` are ``[n * d0, ...]`` (``d0`` the batch, or e.g. a ``[T, T]`` mask's rows)."""
    if isinstance(inputs, Mapping):
        name = graph.inputs[0]
        batch = graph.shape(name)[0]
        total = np.shape(inputs[name])[0]
        if total % batch:
            raise ValueError(f"Calibration input {name!r} has {total} samples, not a multiple of the graph's batch "
                             f"{batch}.")
        for j in range(total // batch):
            yield {k: np.asarray(v[j * graph.shape(k)[0]:(j + 1) * graph.shape(k)[0]],
                                 np.int64 if graph.tensors[k].dtype == "int64" else np.float32)
                   for k, v in inputs.items() if k in graph.inputs}     # not an input the import dropped
        return
    for sample in inputs:
        yield dict(sample)


def _run_observed(graph: Graph, sample: Mapping[str, np.ndarray], observe: Callable[[str, np.ndarray], None]) \
        -> None:
    """Run the float reference on one sample, passing every non-constant tensor to ``observe`` as it is produced
    (:func:`.float_ref.run_float`, which keeps only the live tensors)."""
    float_ref.run_float(graph, sample, observe=observe)


def calibrate(graph: Graph, inputs: Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]], *,
              percentile: float | None = None, method: str | None = None, moments: bool = False,
              progress: bool = False) -> Calibration:
    """Run the float reference over the calibration inputs (a dict of stacked samples, or an iterable of dicts, which
    may be a generator), one graph batch at a time.

    ``method`` (:data:`.calibration.METHODS`; default ``percentile`` when ``percentile`` is given, else ``minmax``)
    sets ``absmax``: ``minmax`` the largest magnitude seen; ``percentile`` (default 99.99) the largest per-sample
    percentile of the magnitudes (outliers then saturate); ``entropy`` the KL-divergence threshold of the
    magnitudes' histogram over all samples (:func:`.calibration.entropy_threshold`; a second pass over the inputs).
    Graph inputs and outputs always use the true maximum. ``channel_absmax`` is always the true per-channel maximum.
    ``moments``: also sum the second moments of every Conv2d/Dense's input patches (``Calibration.moments``, for
    GPTQ weight rounding; layers wider than :data:`.gptq.MOMENTS_MAX_K` inputs per output channel are left out).
    ``progress``: a progress display of the batches run (:class:`vta.progress.Progress`; the float reference is most
    of a compile's wait: 12 s of ResNet-18's 14).

    Memory (bytes) is bounded independently of the number of samples: one batch of inputs (converted to float32),
    the float reference's live tensors of that batch, one tensor-sized temporary for a percentile or a histogram,
    the running maxima (one float per tensor, one per channel), for entropy one histogram of 2048 bins per tensor
    (an iterable of dicts is then kept as a list) and, with ``moments``, ``groups * K * K`` float64 per layer.
    """
    from .calibration import HISTOGRAM_BINS, METHODS, entropy_threshold
    method = method or ("percentile" if percentile is not None else "minmax")
    if method not in METHODS:
        raise ValueError(f"Calibration method {method!r} is unknown; use one of {', '.join(METHODS)}.")
    level = 99.99 if percentile is None else percentile
    if method == "percentile" and not 50.0 <= level <= 100.0:
        raise ValueError(f"Calibration percentile {level} must lie in [50, 100].")
    absmax: dict[str, float] = {}
    chan: dict[str, np.ndarray] = {}
    exact = set(graph.inputs) | set(graph.outputs)
    readers = _moment_layers(graph) if moments else {}
    sums: dict[str, np.ndarray] = {}
    if method == "entropy" and not isinstance(inputs, Mapping):
        inputs = list(inputs)

    def observe(name: str, value: np.ndarray) -> None:
        if method != "percentile" or name in exact:  # max |v| without a |v| temporary: max(max v, -min v), exact
            peak = float(max(value.max(), -value.min()))
        else:
            peak = float(np.percentile(np.abs(value), level))
        absmax[name] = max(absmax.get(name, 0.0), peak)
        if value.ndim >= 2:
            axes = tuple(i for i in range(value.ndim) if i != 1)
            per = np.maximum(value.max(axis=axes), -value.min(axis=axes)) + np.float32(0)  # + 0: no -0.0
            chan[name] = np.maximum(chan.get(name, per), per)
        for layer in readers.get(name, ()):
            attrs = layer.attrs
            h = input_moments(value, graph.constants[layer.inputs[1]].shape, strides=attrs.get("strides", (1, 1)),
                              pads=attrs.get("pads", (0, 0, 0, 0)), groups=attrs.get("groups", 1))
            sums[layer.name] = sums[layer.name] + h if layer.name in sums else h

    count = 0
    batches = np.shape(inputs[graph.inputs[0]])[0] // max(graph.shape(graph.inputs[0])[0], 1) \
        if isinstance(inputs, Mapping) and graph.inputs and graph.inputs[0] in inputs else 0
    bar = Progress(batches, desc="calibrate", unit="input", enabled=progress and batches > 1)
    try:
        for sample in _samples(graph, inputs):
            _run_observed(graph, sample, observe)
            count += 1
            bar.update()
    finally:
        bar.close()
    if not count:
        raise ValueError("Calibration needs at least one input sample; got none.")
    if method == "entropy":
        hists: dict[str, np.ndarray] = {}

        def histogram(name: str, value: np.ndarray) -> None:
            if name not in exact and absmax[name] > 0:
                counts, _ = np.histogram(np.abs(value), bins=HISTOGRAM_BINS, range=(0.0, absmax[name]))
                hists[name] = hists.get(name, 0) + counts

        for sample in _samples(graph, inputs):
            _run_observed(graph, sample, histogram)
        for name, counts in hists.items():
            absmax[name] = min(absmax[name], entropy_threshold(counts, absmax[name] / HISTOGRAM_BINS))
    return Calibration(absmax, chan, sums)


def _moment_layers(graph: Graph) -> dict[str, list[Node]]:
    """Input tensor name -> the Conv2d/Dense nodes reading it whose weights are constant and at most
    :data:`.gptq.MOMENTS_MAX_K` wide per output channel (the layers GPTQ can round)."""
    readers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        if node.op not in ("Conv2d", "Dense") or node.inputs[1] not in graph.constants:
            continue
        if int(np.prod(graph.constants[node.inputs[1]].shape[1:])) <= MOMENTS_MAX_K:
            readers.setdefault(node.inputs[0], []).append(node)
    return readers


# ---- 3. requant parameters ----------------------------------------------------------------------------------------
def choose_requant(m: np.ndarray, acc_bound: np.ndarray, *, rounding: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(M, S) per channel for real multipliers ``m`` (> 0) with ``|acc| <= acc_bound`` (int32 overflow-free).

    S is the largest value <= 31 with ``M = round(m * 2**S) <= 32767`` and ``M * (acc_bound + r) <= 2**31 - 1``, where
    ``r`` is the rounding :func:`quantize` folds into the bias, ``2**(S-1) // M`` (with ``rounding``; else 0): then
    ``acc * M`` cannot wrap for any accumulator within the bound. When no S fits, S = 0 and M is the largest
    multiplier that does (at least 1; a bound beyond int32 leaves M = 1, whose product is the accumulator itself).
    """
    bad = ~(np.isfinite(m) & (m > 0) & (m < 2.0**62))
    if bad.any():
        raise QuantizationError(f"a requantization ratio (input scale x weight scale / output scale) is "
                                f"{float(m[bad][0]):g}, not a positive number a 32-bit multiplier and shift can "
                                f"hold: the model's weights or activations are infinite, NaN, or near float32's "
                                f"limit (1e38)")
    mult = np.ones(m.shape, np.int64)
    shift = np.zeros(m.shape, np.int64)
    for o, (mo, bound) in enumerate(zip(m.astype(np.float64), acc_bound)):
        bound = int(bound)
        for s in range(S_MAX, -1, -1):
            value = max(int(round(mo * 2.0**s)), 1)
            r = (1 << (s - 1)) // value if rounding and s > 0 else 0
            if value <= M_MAX and value * (bound + r) <= INT32_MAX:
                mult[o], shift[o] = value, s
                break
        else:
            mult[o], shift[o] = max(1, min(M_MAX, INT32_MAX // (bound + 1))), 0
    return mult, shift


def _clip_range(activation: Node | None, sy: float, qmin: int = -128, qmax: int = 127) -> tuple[int, int, str]:
    """``(lo, hi, kind)`` of a fused activation in the activation range ``[qmin, qmax]``."""
    if activation is None:
        return qmin, qmax, "none"
    if activation.op == "Relu":
        return 0, qmax, "relu"
    lo_f, hi_f = activation.attrs["min"], activation.attrs["max"]
    lo = qmin if lo_f is None else int(np.clip(np.round(lo_f / sy), qmin, qmax))
    hi = qmax if hi_f is None else int(np.clip(np.round(hi_f / sy), qmin, qmax))
    return min(lo, hi), hi, "clip"          # min > max: every value becomes max, as ONNX's Clip (numpy's clip)


WEIGHT_ROUNDINGS = ("nearest", "gptq")
"""How :func:`quantize` rounds weights to integers (its ``weight_rounding``)."""

SCORE_WIDTHS = ("int8", "int32")
"""What :func:`quantize` makes of attention score products (its ``scores``): int8 as any MatMul, or exact int32."""

WEIGHT_CLIP_GRID = np.linspace(0.5, 1.0, 26)
"""Fractions of a weight range tried by :func:`_mse_scales` (int4 weights)."""


def _mse_scales(w: np.ndarray, scales: np.ndarray, wmax: int, per_channel: bool) -> np.ndarray:
    """Symmetric scales for narrow weights ``w`` (``[O, K]``): for each output channel (or the whole tensor), the
    fraction of the absmax scale ``scales`` in :data:`WEIGHT_CLIP_GRID` whose quantized weights
    ``s * clip(rint(w / s), -wmax, wmax)`` have the least squared error; the largest wins a tie, so a range that
    clipping does not help keeps the absmax scale."""
    best = scales.copy()
    rows = [np.arange(w.shape[0])] if not per_channel else [np.array([o]) for o in range(w.shape[0])]
    for idx in rows:
        base = float(scales[idx[0]])
        errors = []
        for frac in WEIGHT_CLIP_GRID:
            sc = base * frac
            q = np.clip(np.rint(w[idx] / sc), -wmax, wmax) * sc
            errors.append(float(((w[idx] - q) ** 2).sum()))
        err = np.asarray(errors)
        pick = int(np.flatnonzero(err <= err.min() * (1 + 1e-12))[-1])
        best[idx] = base * WEIGHT_CLIP_GRID[pick]
    return best


class _Quantizer:
    """State of one quantization: the float graph, calibration, options and the quantized graph being built."""

    def __init__(self, fg: Graph, cal: Calibration, per_channel: bool | str, mode: str, round_adds: bool,
                 act_bits: int = 8, wgt_bits: int = 8, keep_int8: Iterable[str] = (),
                 weight_rounding: str = "nearest", scores: str = "int8") -> None:
        self.fg, self.cal, self.per_channel, self.mode = fg, cal, per_channel, mode
        self.fx = GraphIndex(fg)               # the float graph's producers and consumers: it does not change here
        self.scores = scores                   # "int32": attention scores kept exact into their softmax
        self.aliases: dict[str, str] = {}      # a folded scalar Mul's output -> the int32 scores it scales
        self.weight_rounding = weight_rounding
        self.round_adds = round_adds
        self.act_bits, self.wgt_bits = act_bits, wgt_bits
        self.qmin, self.qmax = -(1 << (act_bits - 1)), (1 << (act_bits - 1)) - 1  # activation range
        self.wmax = (1 << (wgt_bits - 1)) - 1                                       # weights: [-wmax, wmax]
        self.keep_int8 = frozenset(keep_int8)  # Conv2d/Dense kept at int8 weights (and int8 graph inputs/outputs)
        narrow = act_bits != 8 or wgt_bits != 8
        self.qg = Graph(fg.name + (f"_w{wgt_bits}a{act_bits}" if narrow else "_int8"))
        self.pending_clips: list[tuple[str, str, float]] = []  # (int8 tensor, clipped name, scale): see wide_out
        self.scales: dict[str, float] = {}
        self.skip: set[str] = set()
        self.masks: dict[str, tuple[str, dict[str, Any]]] = {}
        self.key_masks: dict[str, tuple[str, str, dict[str, Any]]] = {}  # KeyMask out -> (scores, mask, key_* attrs)
        self._q_producers: dict[str, Node] = {}                 # q_producer's index of qg.nodes[:self._q_indexed]
        self._q_indexed = 0

    def q_producer(self, name: str) -> Node | None:
        """``self.qg.producer(name)``, from an index extended by the nodes appended since the last call (the
        quantizer only appends to ``qg``)."""
        for node in self.qg.nodes[self._q_indexed:]:
            for out in node.outputs:
                self._q_producers.setdefault(out, node)
        self._q_indexed = len(self.qg.nodes)
        return self._q_producers.get(name)

    def fused_activation(self, node: Node) -> Node | None:
        out = node.outputs[0]
        users = self.fx.consumers(out)
        if len(users) == 1 and users[0].op in ("Relu", "Clip") and out not in self.fg.outputs:
            return users[0]
        return None

    def finite(self, node: Node, name: str, value: np.ndarray | None = None) -> np.ndarray:
        """The float64 value of constant ``name`` that ``node`` reads (``value`` when the caller already read it), or
        :class:`QuantizationError` naming both when it holds a NaN or an infinity, which no integer constant can hold
        (a mask's infinities never reach here: the Softmax they feed applies them in float)."""
        c = self.fg.constants[name].astype(np.float64) if value is None else value
        bad = int(np.count_nonzero(~np.isfinite(c)))
        if bad:
            why = "(is the file damaged?)"
            if not np.isnan(c).any() and (c[np.isinf(c)] < 0).all():
                why = ("(the lab takes -inf only as a mask's fill added on the way into a Softmax, which applies "
                       "it in float; here it is not)")
            raise QuantizationError(f"Node {node.name!r} ({node.op}) reads the constant {name!r}, which holds {bad} "
                                    f"NaN or infinite value(s) of {c.size}; an integer weight cannot hold them {why}")
        return c

    def act_scale(self, name: str) -> float:
        """The calibrated scale of activation ``name`` at the activation width: ``absmax / qmax``;
        :class:`QuantizationError` naming the tensor and its producer when the float model computed an infinity or
        NaN there on the calibration inputs (a division by zero, an overflow), which no int8 scale represents."""
        if not np.isfinite(self.cal.absmax.get(name, 0.0)):
            prod = self.fx.producer(name)
            by = ""
            if prod is not None:
                consts = [c for c in prod.inputs if c in self.fg.constants]
                for const in consts:
                    self.finite(prod, const)          # a damaged weight is the cause: say so, naming it
                if any(np.abs(self.fg.constants[c]).max(initial=0.0) > 1e30 for c in consts):
                    return self.cal.scale(name, self.qmax)  # a weight near float32's limit: its requantization says so
                by = f" (written by {prod.op} node {prod.name!r})"
            raise QuantizationError(f"Tensor {name!r}{by} holds non-finite values (an infinity or NaN) on the "
                                    f"calibration inputs: the float model divides by zero or overflows there, and "
                                    f"no int8 scale represents that; calibrate on inputs for which it is finite.")
        return self.cal.scale(name, self.qmax)

    def wide_out(self, name: str, scale: float) -> str:
        """The output tensor of an op whose integer semantics clip to int8 (QMul, QMulAct, QMatMul, QSoftmax,
        QLayerNorm, QRMSNorm, Embedding): ``name`` itself at int8 activations; at int4 a temporary int8 tensor that
        :meth:`run` clips to the activation range into ``name`` (a QClip after the op), so every activation stays
        within [-8, 7]."""
        if self.act_bits == 8:
            return self.out_tensor(name, scale)
        wide = self.qg.unique_name(f"{name}_q8")
        self.qg.add_tensor(wide, self.fg.shape(name), "int8", scale)
        self.pending_clips.append((wide, name, scale))
        return wide

    def out_tensor(self, name: str, scale: float) -> str:
        self.qg.add_tensor(name, self.fg.shape(name), "int8", scale)
        self.scales[name] = scale
        return name

    def int8_range(self, name: str) -> tuple[int, int]:
        """The values the int8 tensor ``name`` can hold: its producer's clip range, through pools, Reshape and Pad
        (whose pad value widens it); the activation range ([-128, 127], or [-8, 7] at int4) after any other op."""
        prod = self.q_producer(name)
        if prod is None:
            return self.qmin, self.qmax
        if prod.op in ("QConv2d", "QDense", "QAdd"):
            return prod.attrs["requant"].lo, prod.attrs["requant"].hi
        if prod.op == "QClip":
            return prod.attrs["lo"], prod.attrs["hi"]
        if prod.op == "Quantize":  # an int8 graph input (at int4 activations a QClip follows unless kept int8)
            return -128, 127
        if prod.op in ("MaxPool", "AvgPool", "GlobalAvgPool", "Reshape", "Pad"):
            lo, hi = self.int8_range(prod.inputs[0])
            pad = prod.attrs.get("value", lo) if prod.op == "Pad" else lo
            return min(lo, pad), max(hi, pad)
        return self.qmin, self.qmax

    def product_bound(self, wq: np.ndarray, x: str) -> np.ndarray:
        """Per output channel, the largest ``|sum(x * w)|`` any input ``x`` can give: every input at the end of its
        int8 range (:meth:`int8_range`, zero included for a convolution's padding) that makes the sum largest."""
        lo, hi = self.int8_range(x)
        lo, hi = min(lo, 0), max(hi, 0)
        w = wq.reshape(wq.shape[0], -1).astype(np.int64)
        pos, neg = np.where(w > 0, w, 0).sum(axis=1), np.where(w < 0, w, 0).sum(axis=1)
        return np.maximum(pos * hi + neg * lo, -(pos * lo + neg * hi))

    def weight_scales(self, w: np.ndarray, wmax: int) -> np.ndarray:
        per = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float64)
        per = np.maximum(per, _dead_floor(per))          # dead channels: keep the bias inside int32
        use_channel = self.per_channel is True or (self.per_channel == "auto" and per.max() > 1.5 * per.min())
        scales = (per if use_channel else np.full_like(per, per.max())) / float(wmax)
        if wmax < 127:  # int4: clip each channel's (or the tensor's) range where that lowers the error
            scales = _mse_scales(w.reshape(w.shape[0], -1).astype(np.float64), scales, wmax, use_channel)
        return scales

    def linear(self, node: Node) -> None:
        """Conv2d or Dense (+ fused Relu/Clip) -> QConv2d/QDense."""
        act = self.fused_activation(node)
        out = act.outputs[0] if act is not None else node.outputs[0]
        x = node.inputs[0]
        keep = node.name in self.keep_int8
        wide_out = keep and out in self.fg.outputs  # a kept layer's graph output stays int8
        wmax = 127 if keep else self.wmax
        sx, sy = self.scales[x], (self.cal.scale(out) if wide_out else self.act_scale(out))
        w = self.finite(node, node.inputs[1])
        o = w.shape[0]
        b = self.finite(node, node.inputs[2]) if len(node.inputs) > 2 else np.zeros(o)
        shift_mode = self.mode == "shift"
        if shift_mode:
            sw, mult, shift = self._shift_weights(w, sx, sy, wmax)
        else:
            sw = self.weight_scales(w, wmax)
        wq = self.round_weights(node.name, w, sw, wmax)
        products = self.product_bound(wq, x)
        cap = np.maximum(BIAS_LIMIT - products, 0)
        bq = np.clip(np.rint(b / (sx * sw)), -cap, cap)
        if not shift_mode:
            bound = products + np.abs(bq)                  # every accumulator the int8 input can produce
            if (sw == sw[0]).all():
                bound = np.full(o, bound.max())            # per-tensor weights: one (M, S) for every channel
            mult, shift = choose_requant(sx * sw / sy, bound, rounding=True)
        rounding = np.where(shift > 0, (np.int64(1) << np.maximum(shift - 1, 0)) // mult, 0)
        bq = (bq + rounding).astype(np.int32)
        lo, hi, kind = _clip_range(act, sy) if wide_out else _clip_range(act, sy, self.qmin, self.qmax)
        tag = node.name
        wname, bname = self.qg.unique_name(f"{tag}_wq"), self.qg.unique_name(f"{tag}_bq")
        self.qg.add_constant(wname, wq)
        self.qg.add_constant(bname, bq)
        requant = Requant(mult, shift, lo, hi)
        attrs = dict(requant=requant, w_scale=sw.astype(np.float32), activation=kind)
        if node.op == "Conv2d":
            attrs.update(strides=tuple(node.attrs["strides"]), pads=tuple(node.attrs["pads"]),
                         groups=int(node.attrs["groups"]))
        self.qg.add_node("QConv2d" if node.op == "Conv2d" else "QDense", node.name, [x, wname, bname],
                         [self.out_tensor(out, sy)], **attrs)
        if act is not None:
            self.skip.add(act.name)

    def round_weights(self, layer: str, w: np.ndarray, sw: np.ndarray, wmax: int) -> np.ndarray:
        """int8 weights of ``layer`` (``w`` float ``[O, ...]`` at per-channel scales ``sw`` ``[O]``, values in
        ``[-wmax, wmax]``): GPTQ (:func:`.gptq.gptq_round`) with ``weight_rounding="gptq"`` where calibration
        measured the layer's input moments, else each weight rounded to nearest."""
        o = w.shape[0]
        if self.weight_rounding == "gptq" and layer in self.cal.moments:
            q = gptq_round(w.reshape(o, -1), sw, self.cal.moments[layer], wmax)
            return q.reshape(w.shape).astype(np.int8)
        return np.clip(np.rint(w / sw.reshape((o,) + (1,) * (w.ndim - 1))), -wmax, wmax).astype(np.int8)

    def _shift_weights(self, w: np.ndarray, sx: float, sy: float, qmax: int) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray]:
        """Pure-shift requant: per-channel weight scales ``sy / (sx * 2**S[o])`` (M = 1), each the smallest on that
        grid at or above the usual ``max|w[o]| / qmax`` (dead channels floored as :meth:`weight_scales` floors them),
        so less than twice it (unless S is held in [0, S_MAX]); weights in [-qmax, qmax]."""
        o = w.shape[0]
        per = np.abs(w.reshape(o, -1)).max(axis=1).astype(np.float64)
        usual = np.maximum(per, _dead_floor(per)) / qmax
        shift = np.floor(np.log2(sy / (sx * usual))).astype(np.int64)
        shift -= (sy / (sx * 2.0**shift) < usual)  # a rounding of log2 just above a power of two
        shift = np.clip(shift, 0, S_MAX)
        return sy / (sx * 2.0**shift), np.ones(o, np.int64), shift

    def softmax_mask(self, node: Node, mask: dict[str, Any]) -> bool:
        """When ``node`` (an Add of a constant or a Where) feeds only a Softmax (directly, or through a runtime mask,
        :meth:`key_mask`), record ``mask`` for that Softmax,
        which applies it in float (an additive -10000 or a -inf fill would otherwise set the int8 scale); True if
        so."""
        users = self.fx.consumers(node.outputs[0])
        if len(users) == 1 and users[0].op == "KeyMask" and users[0].inputs[0] == node.outputs[0]:
            users = self.fx.consumers(users[0].outputs[0])      # a runtime mask after it, fused into the same one
        if not self._mask_readers(users) or node.outputs[0] in self.fg.outputs:
            return False
        self.masks[node.outputs[0]] = (self.aliases.get(node.inputs[0], node.inputs[0]), mask)
        return True

    def _mask_readers(self, users: list[Node]) -> bool:
        """Whether ``users`` can apply a mask in float: one Softmax, or Softmaxes and log-sum-exps over the last
        axis (Granite's sliding-window attention reads its masked scores in both)."""
        if len(users) == 1 and users[0].op == "Softmax":
            return True
        return bool(users) and all((u.op == "Softmax" or u.op == "Reduce" and u.attrs["kind"] == "log_sum_exp") and
                                   u.attrs["axis"] == len(self.fg.shape(u.inputs[0])) - 1 for u in users)

    def add_constant(self, node: Node) -> None:
        """Add of a constant the frontend could not fold into a Dense bias: a Softmax mask, or a QAffine of the
        activation and the constant quantized at its own scale (broadcast to the activation's shape)."""
        x, const = (node.inputs[0], node.inputs[1]) if node.inputs[1] in self.fg.constants else node.inputs[::-1]
        c = self.fg.constants[const].astype(np.float64)
        if self.softmax_mask(Node(node.op, node.name, [x, const], node.outputs), {"bias": c}):
            return
        c = self.finite(node, const, c)                     # a mask's -inf is applied by its Softmax; not here
        shape = self.qg.shape(x)
        out = node.outputs[0]
        sx, sy = self.scales[x], self.act_scale(out)
        sc = max(float(np.abs(c).max()), 1e-6) / 127.0
        mult, shift = choose_requant(np.array([sx / sy, sc / sy]), np.array([128, 128]))
        s = int(min(shift))
        cname = self.qg.unique_name(f"{node.name}_cq")
        cq = np.clip(np.rint(c / sc), -127, 127).astype(np.int8)
        self.qg.add_constant(cname, np.ascontiguousarray(np.broadcast_to(cq, shape)))
        self.qg.add_node("QAffine", node.name, [x, cname], [self.out_tensor(out, sy)],
                         multipliers=[int(np.clip(round(m * 2**s), 1, M_MAX)) for m in (sx / sy, sc / sy)],
                         offset=(1 << (s - 1)) if s > 0 else 0, shift=s, lo=self.qmin, hi=self.qmax)

    def add(self, node: Node) -> None:
        """Add of two activations (+ fused Relu/Clip) -> QAdd."""
        if any(i in self.fg.constants for i in node.inputs):
            self.add_constant(node)
            return
        act = self.fused_activation(node)
        out = act.outputs[0] if act is not None else node.outputs[0]
        a, b = node.inputs
        sy = self.act_scale(out)
        ma, mb = self.scales[a] / sy, self.scales[b] / sy
        mult, shift = choose_requant(np.array([ma, mb]), np.array([128, 128]))
        s = int(min(shift))
        ma_i = int(np.clip(round(ma * 2**s), 1, M_MAX))
        mb_i = int(np.clip(round(mb * 2**s), 1, M_MAX))
        lo, hi, kind = _clip_range(act, sy, self.qmin, self.qmax)
        self.qg.add_node("QAdd", node.name, [a, b], [self.out_tensor(out, sy)],
                         requant=AddRequant(ma_i, mb_i, s, lo, hi), activation=kind)
        if act is not None:
            self.skip.add(act.name)
        if self.round_adds and not self._round_add_through_producer(a, 0.5 * sy):
            self._round_add_through_producer(b, 0.5 * sy)

    def _round_add_through_producer(self, operand: str, shift_real: float) -> bool:
        """QAdd truncates (``>>``): on average its output sits half an LSB low. When ``operand`` comes from a QConv2d
        or QDense without activation that feeds only this add, raise that layer's bias by half an output LSB of the
        add (``shift_real`` in real units), which cancels the truncation on average. True when done."""
        prod = self.q_producer(operand)
        if prod is None or prod.op not in ("QConv2d", "QDense") or prod.attrs["activation"] != "none":
            return False
        if len(self.fx.consumers(operand)) != 1 or operand in self.fg.outputs:
            return False
        sx = self.scales[prod.inputs[0]]
        sw = prod.attrs["w_scale"].astype(np.float64)
        bias = self.qg.constants[prod.inputs[2]].astype(np.int64) + np.rint(shift_real / (sx * sw)).astype(np.int64)
        self.qg.constants[prod.inputs[2]] = np.clip(bias, -(2**31), INT32_MAX).astype(np.int32)
        return True

    def mul(self, node: Node) -> None:
        """Mul by a constant -> QMul with an int multiplier array; of two activations -> QMulAct; nothing for a
        scalar Mul of int32 attention scores (folded into their scale by :meth:`matmul`)."""
        if node.outputs[0] in self.aliases:
            return
        if node.inputs[1] not in self.fg.constants:
            self.mul_act(node)
            return
        c = self.finite(node, node.inputs[1])
        x, out = node.inputs[0], node.outputs[0]
        sy = self.act_scale(out)
        m = c * self.scales[x] / sy
        peak = max(float(np.abs(m).max()), 1e-12)
        s = int(np.clip(np.floor(np.log2(M_MAX / peak)), 0, S_MAX))
        mult = np.rint(m * 2.0**s).astype(np.int32)
        self.qg.add_node("QMul", node.name, [x], [self.wide_out(out, sy)], multiplier=mult, shift=s)

    def mul_act(self, node: Node) -> None:
        """Mul of two int8 activations of one shape -> QMulAct (:func:`.qops_gated.qmul_act`): one (M, S) for
        ``sa * sb / sy`` such that ``a * b * M + r`` stays inside int32 for any int8 operands."""
        a, b = node.inputs
        out = node.outputs[0]
        if self.qg.shape(a) != self.qg.shape(b):
            raise QuantizationError(f"Node {node.name!r} multiplies activations of shapes {self.qg.shape(a)} and "
                                    f"{self.qg.shape(b)}; QMulAct needs one shape.")
        sy = self.act_scale(out)
        mult, shift = choose_requant(np.array([self.scales[a] * self.scales[b] / sy]), np.array([PRODUCT_BOUND]),
                                     rounding=True)
        self.qg.add_node("QMulAct", node.name, [a, b], [self.wide_out(out, sy)], multiplier=int(mult[0]),
                         shift=int(shift[0]))

    def concat(self, node: Node) -> None:
        """Concat -> QConcat at the largest input scale; a constant operand becomes an int8 constant at that scale."""
        out = node.outputs[0]
        consts = {i: self.finite(node, i) for i in node.inputs if i in self.fg.constants}
        scales = {i: max(float(np.abs(c).max()), 1e-6) / 127.0 for i, c in consts.items()}
        scales.update({i: self.scales[i] for i in node.inputs if i not in consts})
        sy = max(scales.values())
        inputs = list(node.inputs)
        mults, shifts = [], []
        for k, name in enumerate(node.inputs):
            if name in consts:
                inputs[k] = self.qg.unique_name(f"{name}_q")
                self.qg.add_constant(inputs[k], np.clip(np.rint(consts[name] / sy), self.qmin, self.qmax)
                                     .astype(np.int8))
            ratio = 1.0 if name in consts else scales[name] / sy
            if ratio == 1.0:
                mults.append(1)
                shifts.append(0)
            else:
                mults.append(int(round(ratio * 2**14)))
                shifts.append(14)
        self.qg.add_node("QConcat", node.name, inputs, [self.out_tensor(out, sy)], axis=node.attrs["axis"],
                         multipliers=mults, shifts=shifts)

    def lut(self, node: Node) -> None:
        """An element-wise activation (Sigmoid, HardSigmoid, HardSwish) -> QLut: its table maps each int8 input q
        to ``clip(rint(f(q * s_in) / s_out))``, ``f`` the float reference's own function."""
        x, out = node.inputs[0], node.outputs[0]
        sy = self.act_scale(out)
        real = float_ref.table_values(node.op, np.arange(-128, 128, dtype=np.float64) * self.scales[x], node.attrs)
        table = np.clip(np.rint(real / sy), self.qmin, self.qmax).astype(np.int8)
        self.qg.add_node("QLut", node.name, [x], [self.out_tensor(out, sy)], table=table, function=node.op)

    def top_k_one_hot(self, node: Node) -> None:
        """TopKOneHot (an MoE router's choice of experts) -> the same op on the int8 scores: int8 0/1 at scale 1, so
        that a product by it keeps or zeroes the other operand exactly. The order of int8 scores can tie where the
        float ones do not; the error against float shows it."""
        self.qg.add_node("TopKOneHot", node.name, list(node.inputs), [self.out_tensor(node.outputs[0], 1.0)],
                         k=int(node.attrs["k"]), keep=str(node.attrs["keep"]))

    def pick_chosen(self, node: Node) -> None:
        """PickChosen (the entries an MoE router chose) -> the same op on int8: a move of the data's values, at its
        scale."""
        onehot, data = node.inputs
        self.qg.add_node("PickChosen", node.name, [onehot, data], [self.out_tensor(node.outputs[0],
                                                                                 self.scales[data])])

    def pointwise(self, node: Node) -> None:
        """PointwiseFn (an element-wise region of one activation) -> QLut: its table is the region evaluated at the
        real values of the 256 int8 inputs (:func:`.pointwise.pointwise_values`), a NaN as 0. Of two activations
        ``a``, ``b`` -> QLut2: the region at the 256 x 256 pairs of their int8 values, row ``a``, column ``b``."""
        out = node.outputs[0]
        sy = self.act_scale(out)
        grid = [np.arange(-128, 128, dtype=np.float64) * self.scales[x] for x in node.inputs]
        if len(grid) == 2:
            grid = [grid[0][:, None], grid[1][None, :]]
        real = pointwise_values(node.attrs["onnx"], *grid)
        with np.errstate(invalid="ignore", over="ignore"):
            table = np.clip(np.rint(np.where(np.isnan(real), 0.0, real) / sy), self.qmin, self.qmax).astype(np.int8)
        op = "QLut" if len(grid) == 1 else "QLut2"
        self.qg.add_node(op, node.name, list(node.inputs), [self.out_tensor(out, sy)], table=table,
                         function=node.op)

    def gather_at(self, node: Node) -> None:
        """GatherAt (an activation's entries at indices computed at run time): int8 moves at the data's scale."""
        x, idx = node.inputs
        self.qg.add_node("GatherAt", node.name, [x, idx], [self.out_tensor(node.outputs[0], self.scales[x])],
                         **node.attrs)

    def resize(self, node: Node) -> None:
        """Resize: nearest and linear keep the input scale (their outputs lie within the input's range); cubic's
        overshoot does not, so it requantizes to its calibrated output scale: the int64 sum of its taps times
        ``M = round(s_in / s_out * 2**14)``, shifted by its weights' bits and 14 (:func:`.qops.resize`)."""
        if node.attrs.get("mode") != "cubic":
            self.passthrough(node)
            return
        x, out = node.inputs[0], node.outputs[0]
        sy = self.act_scale(out)
        ratio = self.scales[x] / sy
        self.qg.add_node("Resize", node.name, [x], [self.wide_out(out, sy)], **node.attrs,
                         multiplier=int(round(ratio * 2**14)), shift=14)

    def passthrough(self, node: Node) -> None:
        """Ops whose int8 output keeps the input scale."""
        x, out = node.inputs[0], node.outputs[0]
        sx = self.scales[x]
        attrs = dict(node.attrs)
        op = node.op
        if op == "Relu":
            op, attrs = "QClip", {"lo": 0, "hi": self.qmax}
        elif op == "Clip":
            lo, hi, _ = _clip_range(node, sx, self.qmin, self.qmax)
            op, attrs = "QClip", {"lo": lo, "hi": hi}
        elif op == "Pad":
            attrs["value"] = int(np.clip(np.rint(node.attrs["value"] / sx), self.qmin, self.qmax))
        elif op == "Where":
            attrs["fill"] = int(np.clip(np.rint(node.attrs["fill"] / sx), self.qmin, self.qmax))
        self.qg.add_node(op, node.name, [x], [self.out_tensor(out, sx)], **attrs)

    def key_mask(self, node: Node) -> None:
        """KeyMask (a runtime attention mask, :mod:`.masks`): fused into the Softmax it feeds, after a constant mask
        fused before it; a QuantizationError when it feeds anything else (its fill would set an int8 scale)."""
        users = self.fx.consumers(node.outputs[0])
        if not self._mask_readers(users) or node.outputs[0] in self.fg.outputs:
            feeds = ", ".join(f"{u.name} ({u.op})" for u in users) or "a graph output"
            term = self.fx.producer(node.inputs[1])          # a MaskFn: a term computed from the mask input
            source = f"computed from graph input {term.inputs[0]!r}" if term is not None and term.op == "MaskFn" \
                else f"graph input {node.inputs[1]!r}"
            raise QuantizationError(f"The runtime mask {node.name!r} ({source}) feeds {feeds}; the lab applies a "
                                    f"runtime mask inside the one Softmax it feeds (or Softmaxes and log-sum-exps "
                                    f"over the last axis).")
        scores, mask = node.inputs
        src, const = self.masks.pop(scores, (self.aliases.get(scores, scores), {}))
        self.masks[node.outputs[0]] = (src, {**const, **{f"key_{k}": node.attrs[k] for k in KEY_MASK_ATTRS}})
        self.key_masks[node.outputs[0]] = (src, mask, {})

    def softmax(self, node: Node) -> None:
        """Softmax -> float32 Softmax at a graph output no node reads, else QSoftmax (int8 at its calibrated scale;
        dequantized where it is also a graph output); a mask fused
        into it (:meth:`softmax_mask`, :meth:`key_mask`) goes along as attributes (a runtime mask also as input
        1)."""
        out = node.outputs[0]
        src, inputs, mask = self._masked(node.inputs[0])
        if node.attrs.get("sink") is not None:                # attention sinks: logits only the denominator counts
            mask = {**mask, "sink": np.asarray(node.attrs["sink"], np.float32)}
        if node.attrs.get("sink_input"):                     # sinks computed from the activations: the last input
            inputs.append(node.inputs[1])
            mask = {**mask, "sink_scale": self.scales[node.inputs[1]]}
        if out in self.fg.outputs and not self.fx.consumers(out):     # else int8, dequantized for the output
            self.qg.add_tensor(out, self.fg.shape(out), "float32")
            self.qg.add_node("Softmax", node.name, inputs, [out], axis=node.attrs["axis"], scale=self.scales[src],
                             **mask)
            return
        self.qg.add_node("QSoftmax", node.name, inputs, [self.wide_out(out, self.act_scale(out))],
                         axis=node.attrs["axis"], scale=self.scales[src], out_scale=self.act_scale(out), **mask)

    def _masked(self, scores: str) -> tuple[str, list[str], dict[str, Any]]:
        """The masks fused into a reader of ``scores`` (:meth:`softmax_mask`, :meth:`key_mask`; several readers may
        share them): the scores before them, the reader's inputs (a runtime mask as input 1) and the mask
        attributes."""
        src, mask = self.masks.get(scores, (self.aliases.get(scores, scores), {}))
        runtime = self.key_masks.get(scores)
        return src, [src] if runtime is None else [src, runtime[1]], mask

    def reduce(self, node: Node) -> None:
        """Reduce -> QReduce (:meth:`row_norm`); a log-sum-exp of masked scores takes their masks as a Softmax does
        (:meth:`_masked`): attributes, a runtime mask also as input 1."""
        if node.inputs[0] not in self.masks:
            self.row_norm(node)
            return
        src, inputs, mask = self._masked(node.inputs[0])
        out = node.outputs[0]
        sy = self.act_scale(out)
        self.qg.add_node("QReduce", node.name, inputs, [self.wide_out(out, sy)], **node.attrs, scale=self.scales[src],
                         out_scale=sy, **mask)

    def log_softmax(self, node: Node) -> None:
        """LogSoftmax -> float32 LogSoftmax of the int8 input at a graph output no node reads (a classifier's last
        layer), else QLogSoftmax (int8 at its calibrated scale)."""
        x, out = node.inputs[0], node.outputs[0]
        if out in self.fg.outputs and not self.fx.consumers(out):
            self.qg.add_tensor(out, self.fg.shape(out), "float32")
            self.qg.add_node("LogSoftmax", node.name, [x], [out], axis=node.attrs["axis"], scale=self.scales[x])
            return
        self.row_norm(node)

    def where(self, node: Node) -> None:
        """Where (a constant mask and fill): fused into a following Softmax, else int8 at the input's scale."""
        if not self.softmax_mask(node, {"keep": node.attrs["keep"], "fill": float(node.attrs["fill"])}):
            self.passthrough(node)

    def matmul(self, node: Node) -> None:
        """MatMul of two operands (activations, or an int8 constant at its own per-tensor scale) -> QMatMul with
        one (M, S) chosen so that ``acc * M + r`` stays inside int32 for any int8 operands. With ``mode="shift"``,
        M = 1 and the output's scale is the smallest ``s_a * s_b * 2**S`` at or above the calibrated one (less than
        twice it unless S is held in [0, S_MAX]), so the accelerator skips the MUL pass."""
        operands, scales = [], []
        for name in node.inputs:
            if name in self.fg.constants:
                c = self.finite(node, name)
                sc = max(float(np.abs(c).max()), 1e-6) / 127.0
                qname = self.qg.unique_name(f"{name}_q")
                self.qg.add_constant(qname, np.clip(np.rint(c / sc), -127, 127).astype(np.int8))
                operands.append(qname)
                scales.append(sc)
            else:
                operands.append(name)
                scales.append(self.scales[name])
        out = node.outputs[0]
        factor = self.wide_scores(node) if self.scores == "int32" and len(scales) == 2 and \
            not any(name in self.fg.constants for name in node.inputs) else None
        if factor is not None:            # exact int32 scores, read by their softmax at s_a * s_b * (scalar Muls)
            scale = scales[0] * scales[1] * factor
            self.qg.add_tensor(out, self.fg.shape(out), "int32", scale)
            self.scales[out] = scale
            self.qg.add_node("QMatMulWide", node.name, operands, [out])
            return
        sy = self.act_scale(out)
        depth = self.qg.shape(operands[0])[-1]
        if self.mode == "shift":  # M = 1: the output scale rounded up to the operands' scale times a power of two
            shift = np.array([min(max(int(np.ceil(np.log2(sy / (scales[0] * scales[1])))), 0), S_MAX)])
            mult, sy = np.ones(1, np.int64), scales[0] * scales[1] * 2.0 ** int(shift[0])
        else:
            mult, shift = choose_requant(np.array([scales[0] * scales[1] / sy]), np.array([depth * 128 * 128]),
                                         rounding=True)
        self.qg.add_node("QMatMul", node.name, operands, [self.wide_out(out, sy)], multiplier=int(mult[0]),
                         shift=int(shift[0]))

    def wide_scores(self, node: Node) -> float | None:
        """For a MatMul of two activations whose output reaches only softmaxes (Softmax, a masked log-sum-exp)
        through Muls by one positive constant, then at most one constant mask (an Add or a Where) and one runtime
        mask (a KeyMask): the product of those constants, recording each Mul's output as an alias of the scores (the
        Muls then emit nothing); else None (the scores are requantized to int8 as any MatMul's output)."""
        out, factor, muls = node.outputs[0], 1.0, []
        users = self.fx.consumers(out)
        while len(users) == 1 and users[0].op == "Mul" and users[0].inputs[0] == out and out not in self.fg.outputs:
            c = self.fg.constants.get(users[0].inputs[1])
            if c is None or c.size != 1 or not np.isfinite(c).all() or float(c.reshape(-1)[0]) <= 0:
                return None
            factor *= float(c.reshape(-1)[0])
            muls.append(users[0].outputs[0])
            out = users[0].outputs[0]
            users = self.fx.consumers(out)
        tail = out
        for ops in (("Add", "Where"), ("KeyMask",)):
            if len(users) == 1 and users[0].op in ops and users[0].inputs[0] == tail and tail not in self.fg.outputs:
                if users[0].op == "Add" and users[0].inputs[1] not in self.fg.constants:
                    return None
                tail = users[0].outputs[0]
                users = self.fx.consumers(tail)
        if tail in self.fg.outputs or not self._mask_readers(users):
            return None
        for name in muls:
            self.aliases[name] = node.outputs[0]
        return factor

    def index_fn(self, node: Node) -> None:
        """IndexFn (indices computed from token ids): the same int64 node."""
        out = node.outputs[0]
        self.qg.add_tensor(out, self.fg.shape(out), "int64")
        self.qg.add_node("IndexFn", node.name, list(node.inputs), [out], **node.attrs)

    def embedding(self, node: Node) -> None:
        """Embedding (token ids into a float table) -> Embedding of the int8 table, per-tensor, at its own scale
        (the output's: a row lookup does not rescale)."""
        ids, table = node.inputs
        c = self.finite(node, table)
        sc = max(float(np.abs(c).max()), 1e-6) / 127.0
        qname = self.qg.unique_name(f"{table}_q")
        self.qg.add_constant(qname, np.clip(np.rint(c / sc), -127, 127).astype(np.int8))
        self.qg.add_node("Embedding", node.name, [ids, qname], [self.wide_out(node.outputs[0], sc)])

    def input_fn(self, node: Node) -> None:
        """InputFn (values computed from a numeric graph input, in float: :mod:`.numeric_inputs`): the same float32
        node, then a Quantize at the output's calibrated scale, as for a float graph input."""
        out = node.outputs[0]
        raw = self.qg.unique_name(f"{out}_f")
        self.qg.add_tensor(raw, self.fg.shape(out), "float32")
        self.qg.add_node("InputFn", node.name, list(node.inputs), [raw], **node.attrs)
        scale = self.act_scale(out)
        self.qg.add_node("Quantize", self.qg.unique_name(f"quantize_{out}"), [raw], [self.wide_out(out, scale)],
                         scale=scale)

    def mask_fn(self, node: Node) -> None:
        """MaskFn (a runtime mask's term from the mask): the same float32 node, read by the Softmax it masks."""
        out = node.outputs[0]
        self.qg.add_tensor(out, self.fg.shape(out), "float32")
        self.qg.add_node("MaskFn", node.name, list(node.inputs), [out], **node.attrs)

    def mask_pool(self, node: Node) -> None:
        """MaskPool (a masked pooling over tokens) -> QMaskPool (:func:`.qops_pool.qmask_pool`) at the output's
        calibrated scale."""
        x, mask = node.inputs
        out = node.outputs[0]
        sy = self.act_scale(out)
        self.qg.add_node("QMaskPool", node.name, [x, mask], [self.wide_out(out, sy)], onnx=node.attrs["onnx"],
                         axes=tuple(node.attrs["axes"]), keepdims=bool(node.attrs["keepdims"]),
                         scale=self.scales[x], out_scale=sy)

    def row_norm(self, node: Node) -> None:
        """A norm over rows computed in float64 from the int8 input (L2Normalize, SumNormalize, GRNScale,
        GainL2Scale, Reduce, LogSoftmax) -> the op of that name prefixed Q (:mod:`.qops_pool`), its attributes
        as they are, with the input's scale and the output's calibrated scale."""
        x, out = node.inputs[0], node.outputs[0]
        sy = self.act_scale(out)
        self.qg.add_node(f"Q{node.op}", node.name, [x], [self.wide_out(out, sy)], **node.attrs, scale=self.scales[x],
                         out_scale=sy)

    def layer_norm(self, node: Node) -> None:
        """LayerNorm -> QLayerNorm (float64 from the int8 input, see :func:`.qops.layer_norm`)."""
        x, out = node.inputs[0], node.outputs[0]
        gamma, beta = (self.finite(node, name).astype(np.float32) for name in node.inputs[1:3])
        sy = self.act_scale(out)
        self.qg.add_node("QLayerNorm", node.name, [x], [self.wide_out(out, sy)], axis=node.attrs["axis"],
                         epsilon=float(node.attrs["epsilon"]), scale=self.scales[x], gamma=gamma, beta=beta,
                         out_scale=sy)

    def grid_sample(self, node: Node) -> None:
        """GridSample -> QGridSample (float64 from the int8 input and grid, :func:`..qops_pool.qgrid_sample`) at the
        output's calibrated scale."""
        x = node.inputs[0]
        out = node.outputs[0]
        sy = self.act_scale(out)
        grid = {"grid": node.attrs["grid"], "grid_scale": 1.0} if "grid" in node.attrs else \
            {"grid_scale": self.scales[node.inputs[1]]}    # a constant grid stays float: its values, exactly
        self.qg.add_node("QGridSample", node.name, list(node.inputs), [self.wide_out(out, sy)],
                         mode=node.attrs["mode"], padding=node.attrs["padding"],
                         align_corners=bool(node.attrs["align_corners"]), scale=self.scales[x], out_scale=sy, **grid)

    def rms_norm(self, node: Node) -> None:
        """RMSNorm -> QRMSNorm (float64 from the int8 input, see :func:`.qops_gated.rms_norm`)."""
        x, out = node.inputs[0], node.outputs[0]
        gamma = self.finite(node, node.inputs[1]).astype(np.float32)
        sy = self.act_scale(out)
        self.qg.add_node("QRMSNorm", node.name, [x], [self.wide_out(out, sy)], axis=node.attrs["axis"],
                         epsilon=float(node.attrs["epsilon"]), scale=self.scales[x], gamma=gamma, out_scale=sy)

    def run(self) -> Graph:
        fg, qg = self.fg, self.qg
        for name in fg.inputs:
            qg.add_tensor(name, fg.shape(name), fg.tensors[name].dtype)
            qg.inputs.append(name)
            if fg.tensors[name].dtype == "int64" or _raw_mask(fg, name) or _numeric_only(fg, name):
                continue                             # token ids, masks, numbers InputFn reads: read as they are
            qname = f"{name}_q"
            users = self.fx.consumers(name)
            wide_input = bool(users) and all(u.name in self.keep_int8 for u in users)  # read only by int8 layers
            scale = self.cal.scale(name) if wide_input else self.act_scale(name)
            if self.act_bits == 8 or wide_input:
                qg.add_tensor(qname, fg.shape(name), "int8", scale)
                qg.add_node("Quantize", f"quantize_{name}", [name], [qname], scale=scale)
            else:  # Quantize to int8 at the narrow scale, then clip to the activation range
                wide = f"{name}_q8"
                qg.add_tensor(wide, fg.shape(name), "int8", scale)
                qg.add_node("Quantize", f"quantize_{name}", [name], [wide], scale=scale)
                qg.add_tensor(qname, fg.shape(name), "int8", scale)
                qg.add_node("QClip", f"clip_{name}", [wide], [qname], lo=self.qmin, hi=self.qmax)
            self.scales[qname] = scale
        renamed = {name: f"{name}_q" for name in fg.inputs
                   if fg.tensors[name].dtype != "int64" and not _raw_mask(fg, name) and not _numeric_only(fg, name)}
        for node in fg.nodes:
            node = Node(node.op, node.name, [i if node.op == "InputFn" else renamed.get(i, i) for i in node.inputs],
                        node.outputs, node.attrs)
            if node.name in self.skip:
                continue
            handler = _HANDLERS.get(node.op)
            if handler is None:
                raise QuantizationError(f"Node {node.name!r} has op {node.op!r}, which the quantizer does not handle.")
            try:
                handler(self, node)
            except QuantizationError as err:
                if repr(node.name) in str(err):
                    raise
                raise QuantizationError(f"Node {node.name!r} ({node.op}): {err}") from None
            for wide, name, scale in self.pending_clips:  # int4 activations: clip an int8-clipping op's output
                self.qg.add_node("QClip", self.qg.unique_name(f"{node.name}_clip"), [wide],
                                 [self.out_tensor(name, scale)], lo=self.qmin, hi=self.qmax)
            self.pending_clips.clear()
        for name in fg.outputs:
            if qg.tensors[name].dtype == "int8":
                qname = qg.unique_name(f"{name}_q")
                qg.rename_tensor(name, qname)
                qg.add_tensor(name, fg.shape(name), "float32")
                scale = self.scales.pop(name)
                self.scales[qname] = scale
                qg.add_node("Dequantize", f"dequantize_{name}", [qname], [name], scale=scale)
            qg.outputs.append(name)
        qg.validate()
        return qg


_HANDLERS = {
    "Conv2d": _Quantizer.linear, "Dense": _Quantizer.linear, "Add": _Quantizer.add, "Mul": _Quantizer.mul,
    "Concat": _Quantizer.concat, "Softmax": _Quantizer.softmax, "MatMul": _Quantizer.matmul,
    "LayerNorm": _Quantizer.layer_norm, "RMSNorm": _Quantizer.rms_norm, "Where": _Quantizer.where,
    "Embedding": _Quantizer.embedding, "KeyMask": _Quantizer.key_mask, "IndexFn": _Quantizer.index_fn,
    "MaskPool": _Quantizer.mask_pool, "MaskFn": _Quantizer.mask_fn, "InputFn": _Quantizer.input_fn,
    "GridSample": _Quantizer.grid_sample,
    "PointwiseFn": _Quantizer.pointwise,
    "TopKOneHot": _Quantizer.top_k_one_hot, "PickChosen": _Quantizer.pick_chosen,
    **{op: _Quantizer.row_norm for op in ("L2Normalize", "SumNormalize", "GRNScale", "GainL2Scale")},
    "Reduce": _Quantizer.reduce,
    "LogSoftmax": _Quantizer.log_softmax,
    "CumSum": _Quantizer.row_norm,
    **{op: _Quantizer.passthrough for op in ("Relu", "Clip", "MaxPool", "AvgPool", "GlobalAvgPool", "Reshape", "Pad",
                                             "Transpose", "Gather", "TakeAlong", "Slice")},
    "Resize": _Quantizer.resize,
    "GatherAt": _Quantizer.gather_at,
    **{op: _Quantizer.lut for op in float_ref.ACTIVATIONS},
}


def quantize(graph: Graph, calib_inputs: Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]], *,
             per_channel: bool | Literal["auto"] = True, mode: Literal["multiply", "shift"] = "multiply",
             percentile: float | None = None, round_adds: bool = True, method: str | None = None,
             act_bits: int = 8, wgt_bits: int = 8, keep_int8: Iterable[str] = (),
             calibration: Calibration | None = None,
             weight_rounding: Literal["nearest", "gptq"] = "nearest",
             absmax_hints: Mapping[str, float] | None = None,
             scores: Literal["int8", "int32"] = "int8", progress: bool = False) -> Graph:
    """Quantize a float graph; ``calib_inputs`` is a dict of stacked samples (leading axis a multiple of the batch)
    or a list of input dicts; ``method`` (minmax, percentile, entropy) and ``percentile`` select the calibration
    (see :func:`calibrate`); ``round_adds``
    cancels QAdd's truncation on average through the bias of a producing convolution. Returns a validated quantized
    :class:`~.ir.Graph` named ``<name>_int8`` (``<name>_w<wgt_bits>a<act_bits>`` at a narrower width).

    ``act_bits`` / ``wgt_bits`` (8 or 4; a design's ``inp_width`` / ``wgt_width``): int4 activations get scales
    ``absmax / 7`` and every requantization (convolutions, dense layers, adds, clips, the input's Quantize) clips to
    [-8, 7] (ReLU: [0, 7]); int4 weights of Conv2d/Dense get symmetric scales ``absmax / 7`` (per output channel with
    ``per_channel``) and values in [-7, 7]. Tensors stay int8 arrays holding int4 values, so the integer reference
    (qops) computes at those widths unchanged. The output of an op whose integer semantics clip to int8 (Mul,
    MatMul, LayerNorm, Embedding, an inner Softmax) is followed by a QClip to the activation range at int4.
    ``calibration``: ranges already measured by ``calibrate(prepare(graph), calib_inputs, ...)``, reused instead of
    calibrating again (one calibration serves every width pair of a sweep; ``calib_inputs`` is then not read).
    ``keep_int8`` names Conv2d/Dense nodes kept at int8 weights (mixed precision): a graph input read only by such
    layers stays int8, as does such a layer's graph output; on a narrow design the partitioner then runs them on the
    CPU (their values do not fit the design's widths).
    ``weight_rounding``: ``"nearest"`` rounds each weight to its nearest integer; ``"gptq"`` rounds the weights of
    each Conv2d/Dense so that its output error on the calibration inputs is least (:mod:`.gptq`; same scales, same
    integer operators, so the accelerator stays bit-exact with the integer reference); it needs the input moments
    that ``calibrate(..., moments=True)`` measures (collected here when ``calibration`` is not given).
    ``absmax_hints``: largest magnitudes by tensor name that replace the calibrated ones (a QDQ file's own ranges,
    :attr:`.ir.Graph.absmax_hints`). ``scores``: ``"int32"`` keeps each attention score product (a MatMul of two
    activations read only by softmaxes, through scalar Muls and masks) exact: a ``QMatMulWide`` to int32 that its
    softmax reads at ``s_a * s_b`` times the Muls' constants, on the CPU (the accelerator writes int8); ``"int8"``
    requantizes it as any MatMul's output."""
    for what, bits in (("act_bits", act_bits), ("wgt_bits", wgt_bits)):
        if bits not in (4, 8):
            raise ValueError(f"{what} must be 4 or 8, not {bits!r}")
    if mode not in REQUANT_MODES:
        raise ValueError(f"Requant mode {mode!r} is unknown; use 'multiply' or 'shift'.")
    if per_channel not in (True, False, "auto"):
        raise ValueError(f"per_channel={per_channel!r} is invalid; use True, False or 'auto'.")
    if scores not in SCORE_WIDTHS:
        raise ValueError(f"scores={scores!r} is unknown; use one of {', '.join(SCORE_WIDTHS)}.")
    if weight_rounding not in WEIGHT_ROUNDINGS:
        raise ValueError(f"weight_rounding={weight_rounding!r} is unknown; use one of {', '.join(WEIGHT_ROUNDINGS)}.")
    if graph.is_quantized:
        raise GraphError(f"Graph {graph.name!r} is already quantized.")
    fg = prepare(graph)
    gptq = weight_rounding == "gptq"
    cal = calibration if calibration is not None else calibrate(fg, calib_inputs, percentile=percentile,
                                                                  method=method, moments=gptq, progress=progress)
    if absmax_hints:                                   # ranges the model file states replace the measured ones
        cal = Calibration({**cal.absmax, **{k: float(v) for k, v in absmax_hints.items() if k in cal.absmax}},
                          cal.channel_absmax, cal.moments)
    cal = _kept_ranges(fg, cal)
    _warn_vanishing(fg, cal)
    if gptq and not cal.moments and _moment_layers(fg):
        raise ValueError("weight_rounding='gptq' needs the input moments of the layers; the calibration given has "
                         "none: make it with calibrate(prepare(graph), inputs, moments=True).")
    keep = set(keep_int8)
    known = {n.name for n in fg.nodes if n.op in ("Conv2d", "Dense")}
    if keep - known:
        raise ValueError(f"keep_int8 names {', '.join(sorted(keep - known))}, which are not Conv2d/Dense nodes of "
                         f"the graph; its Conv2d/Dense nodes are {', '.join(sorted(known))}")
    return _Quantizer(fg, cal, per_channel, mode, round_adds, act_bits, wgt_bits, keep, weight_rounding,
                      scores).run()


SCALE_FLOOR = 1e-6
"""The smallest range (largest magnitude) the quantizer gives a tensor (:meth:`Calibration.scale`): an all-zero one
stays legal; smaller values quantize to 0."""


def _warn_vanishing(fg: Graph, cal: Calibration) -> None:
    """A warning naming the first tensor (and the count) whose values on the calibration data are nonzero but all
    below :data:`SCALE_FLOOR` in magnitude: it and what is computed from it quantize to 0, which the run's error then
    shows with no other word on why (a random-weight network whose activations shrink layer by layer)."""
    tiny = [t for t in (o for n in fg.nodes for o in n.outputs) if 0.0 < cal.absmax.get(t, 0.0) < SCALE_FLOOR]
    if tiny:
        prod = fg.producer(tiny[0])
        logging.getLogger("vta").warning(
            "%d tensor(s) hold values no larger than %.3g on the calibration data, below the %g the quantizer "
            "resolves, so they quantize to 0; the first is %r (written by %s %r)", len(tiny), cal.absmax[tiny[0]],
            SCALE_FLOOR, tiny[0], prod.op if prod else "input", prod.name if prod else tiny[0])


def _kept_ranges(fg: Graph, cal: Calibration) -> Calibration:
    """``cal`` with the range of each tensor that only a Where of a constant mask and a finite fill reads (through
    Reshapes and Transposes read by one node) narrowed to the Where's output range, where that is smaller: the
    entries the mask drops (a causal mask's upper triangle of a product, a linear attention's future keys) no longer
    set the int8 scale of the ones it keeps; the dropped ones may clip, which changes nothing."""
    narrowed: dict[str, float] = {}
    for node in fg.nodes:
        if node.op != "Where" or not np.isfinite(float(node.attrs["fill"])) or node.outputs[0] not in cal.absmax:
            continue
        bound = max(cal.absmax[node.outputs[0]], abs(float(node.attrs["fill"])))
        tensor = node.inputs[0]
        while tensor in cal.absmax and tensor not in fg.outputs and len(fg.consumers(tensor)) == 1 and \
                bound < narrowed.get(tensor, cal.absmax[tensor]):
            narrowed[tensor] = bound
            prod = fg.producer(tensor)
            if prod is None or prod.op not in ("Reshape", "Transpose"):
                break
            tensor = prod.inputs[0]
    if not narrowed:
        return cal
    return Calibration({**cal.absmax, **narrowed}, cal.channel_absmax, cal.moments)


def choose_int8_layers(graph: Graph, calib_inputs: Mapping[str, np.ndarray], eval_inputs: Mapping[str, np.ndarray],
                       *, act_bits: int, wgt_bits: int, budget: float, labels: np.ndarray | None = None,
                       method: str | None = None) -> tuple[list[str], list[tuple[list[str], float]]]:
    """Sensitive layers to keep at int8 (``keep_int8`` of :func:`quantize`) so that the model at ``act_bits`` /
    ``wgt_bits`` loses at most ``budget`` points of top-1 accuracy (percent) against float on ``eval_inputs``
    (stacked samples of the graph's one input; against ``labels`` when given, else agreement with the float model).

    Greedy: while over budget, try keeping each remaining Conv2d/Dense at int8 as well and keep the one that helps
    most (ties: the earlier layer). Returns (the chosen layer names, the trail: each step's kept layers and accuracy
    in percent, the first with none kept). Choose on data held out from the test set."""
    from ..qops import run_reference
    name = graph.inputs[0]
    x = np.asarray(eval_inputs[name])
    batch = graph.shape(name)[0]
    out = graph.outputs[0]
    float_top = np.concatenate([float_ref.run_float(graph, {name: x[i:i + batch]})[out].reshape(batch, -1)
                                .argmax(axis=1) for i in range(0, len(x), batch)])
    target = float_top if labels is None else np.asarray(labels)
    reference = 100.0 * float((float_top == target).mean())

    def accuracy(keep: list[str]) -> float:
        qg = quantize(graph, calib_inputs, act_bits=act_bits, wgt_bits=wgt_bits, keep_int8=keep, method=method)
        top = np.concatenate([np.asarray(run_reference(qg, {name: x[i:i + batch]})[out]).reshape(batch, -1)
                              .argmax(axis=1) for i in range(0, len(x), batch)])
        return 100.0 * float((top == target).mean())

    layers = [n.name for n in graph.nodes if n.op in ("Conv2d", "Dense")]
    kept: list[str] = []
    trail: list[tuple[list[str], float]] = [([], accuracy([]))]
    while reference - trail[-1][1] > budget and len(kept) < len(layers):
        tries = [(accuracy(kept + [n]), -k, n) for k, n in enumerate(layers) if n not in kept]
        best, _, layer = max(tries)
        kept = [n for n in layers if n in kept + [layer]]
        trail.append((list(kept), best))
    return kept, trail


def compare_outputs(reference: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Accuracy of ``test`` against ``reference`` (same shape ``[N, classes]`` or any): top-1 agreement (fraction of
    rows whose argmax matches), max absolute error, and signal-to-noise ratio in dB."""
    ref = np.asarray(reference, np.float64).reshape(reference.shape[0], -1)
    got = np.asarray(test, np.float64).reshape(test.shape[0], -1)
    noise = float(((ref - got) ** 2).sum())
    signal = float((ref**2).sum())
    return {
        "top1_agreement": float((ref.argmax(axis=1) == got.argmax(axis=1)).mean()),
        "max_abs_error": float(np.abs(ref - got).max()),
        "snr_db": float(10 * np.log10(signal / noise)) if noise > 0 else float("inf"),
    }


def _raw_mask(fg: Graph, name: str) -> bool:
    """Whether graph input ``name`` is a float mask read only by additive KeyMask nodes (added in float inside the
    Softmax, never quantized)."""
    users = fg.consumers(name)
    return bool(users) and all(u.op == "KeyMask" and u.inputs[1] == name and u.attrs.get("additive") for u in users)


def _numeric_only(fg: Graph, name: str) -> bool:
    """Whether graph input ``name`` is read only by InputFn nodes (a number they compute with, in float)."""
    users = fg.consumers(name)
    return bool(users) and all(u.op == "InputFn" for u in users)


ORT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_,
              "tensor(uint8)": np.uint8, "tensor(int8)": np.int8, "tensor(float16)": np.float16,
              "tensor(double)": np.float64}
"""ONNX Runtime's input type names -> the dtype an input is fed as (float32 otherwise): token ids, masks, and the
inputs of a float16 file."""


def _ort_reason(err: Exception) -> str:
    """onnxruntime's message without its status prefix and source location: its last clause, first line, at most
    200 characters."""
    text = str(err).split(":", 3)[-1].strip().split("\n")[0]
    return text.rsplit(" was false. ", 1)[-1][:200]


def float_outputs(model: "str | os.PathLike[str] | onnx.ModelProto | None", graph: Graph,
                  inputs: Mapping[str, np.ndarray], declared: Mapping[str, Sequence[int]] | None = None,
                  values: Mapping[str, float] | None = None) -> tuple[dict[str, np.ndarray], str]:
    """The float model's outputs for ``inputs`` (input name -> array of the graph's input shape), and which model
    ran: ONNX Runtime on ``model`` (an ONNX file or proto) when onnxruntime is installed and ``model`` is given
    (``"onnxruntime"``), else the lab's float reference :func:`.float_ref.run_float` on the float ``graph``
    (``"float reference"``, followed by onnxruntime's reason when it refused the file; no outputs and ``"none
    (...)"`` when ``graph`` is quantized: a pre-quantized file onnxruntime refuses). Outputs are keyed by
    ``graph``'s output names (ONNX Runtime's in the same order). ``declared``: the whole shapes the caller gave
    inputs (``--input-shape``); a file input the import dropped, declared with a 0 (a prompt's empty KV cache), is
    fed empty. ``values``: the inputs the import made constants (``--input-value``), fed those values. A file with
    float16 or bfloat16 tensors runs in a child process (:func:`_ort_isolated`): onnxruntime 1.32 crashed with a
    segmentation fault optimizing such a file, which would have ended the run with no report."""
    if model is not None:
        try:
            import onnxruntime  # noqa: F401 - only whether it is installed
        except ImportError:
            return float_ref.run_float(graph, inputs), "float reference"
        data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)
        args = (data, list(graph.inputs), dict(inputs), dict(values or {}), {k: tuple(v) for k, v in
                                                                           (declared or {}).items()})
        kind, result = _ort_isolated(*args) if _holds_half(model) else _ort_outputs(*args)
        if kind == "ok":
            names, got = result
            if set(graph.outputs) <= set(names):      # by name: the import may leave an empty placeholder out
                return {name: np.asarray(got[names.index(name)]) for name in graph.outputs}, "onnxruntime"
            return {name: np.asarray(v) for name, v in zip(graph.outputs, got)}, "onnxruntime"
        if kind == "refused" and graph.is_quantized:  # a pre-quantized file imported as integers: no float model
            return {}, (f"none (onnxruntime refused the quantized file: {result}; the file has no other model to "
                        f"measure against)")
        what = {"refused": "refused the file", "failed": "failed to run the file"}.get(kind, "crashed on the file")
        if graph.is_quantized and kind == "crashed":
            return {}, f"none (onnxruntime {what}: {result}; the file has no other model to measure against)"
        return float_ref.run_float(graph, inputs), f"float reference (onnxruntime {what}: {result})"
    return float_ref.run_float(graph, inputs), "float reference"


def _holds_half(model: "str | os.PathLike[str] | onnx.ModelProto") -> bool:
    """Whether the ONNX file or proto ``model`` declares float16 or bfloat16 tensors (read without external data)."""
    from .half import holds_half
    try:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model),
                                                                           load_external_data=False)
        return holds_half(proto)
    except Exception:  # noqa: BLE001 - a file onnx cannot read: onnxruntime will say why
        return False


def _ort_outputs(data: "str | bytes", graph_inputs: list[str], inputs: Mapping[str, np.ndarray],
                 values: Mapping[str, float], declared: Mapping[str, Sequence[int]]
                 ) -> tuple[str, Any]:
    """onnxruntime on the ONNX file path or bytes ``data`` (see :func:`float_outputs` for the feeds):
    ``("ok", (output names, outputs))``, ``("refused", reason)`` when it cannot load the file, ``("failed",
    reason)`` when it cannot run it."""
    import onnxruntime as ort
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 3      # errors only: not its notes on initializers it drops
        sess = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - onnxruntime's own errors: it refuses the file
        return "refused", _ort_reason(err)
    defaults = [i for i in sess.get_overridable_initializers() if i.name in graph_inputs]  # inputs with a default
    file_inputs = [*sess.get_inputs(), *defaults]          # value (an initializer): fed as well
    rest = iter([n for n in graph_inputs if n not in {i.name for i in file_inputs}])
    feed: dict[str, np.ndarray] = {}
    for arg in file_inputs:       # by name (an empty input the import made a constant too), else in order
        dims = arg.shape if isinstance(arg.shape, list) else []
        if arg.name in values:      # a constant of the compile: the value, at the declared rank
            feed[arg.name] = np.full([1] * len(dims), float(values[arg.name])).astype(ORT_TYPES.get(arg.type,
                                                                                                   np.float32))
            continue
        key = arg.name if arg.name in inputs else next(rest, None)
        if key is not None:
            feed[arg.name] = np.asarray(inputs[key], ORT_TYPES.get(arg.type, np.float32))
            if dims == [] and feed[arg.name].size == 1:    # a scalar input the lab takes as [1]
                feed[arg.name] = feed[arg.name].reshape(())
        elif 0 in dims and all(isinstance(d, int) for d in dims):      # declared empty: nothing to give
            feed[arg.name] = np.zeros(dims, ORT_TYPES.get(arg.type, np.float32))
        elif 0 in declared.get(arg.name, ()):                          # given empty: an empty KV cache
            feed[arg.name] = np.zeros(tuple(declared[arg.name]), ORT_TYPES.get(arg.type, np.float32))
    try:
        got = sess.run(None, feed)
    except Exception as err:  # noqa: BLE001 - it loads the file but cannot run it (e.g. a shape it lacks)
        return "failed", _ort_reason(err)
    return "ok", ([o.name for o in sess.get_outputs()], [np.asarray(v) for v in got])


def _ort_child(conn: Any, target: str, *args: Any) -> None:
    """A child process's work for :func:`_ort_isolated`: the function ``target`` (``"module:name"``) of ``args``,
    its result sent on ``conn``."""
    import importlib
    module, _, name = target.partition(":")
    try:
        conn.send(getattr(importlib.import_module(module), name)(*args))
    finally:
        conn.close()


def _ort_isolated(*args: Any, target: str = f"{__name__}:_ort_outputs") -> tuple[str, Any]:
    """:func:`_ort_outputs` of ``args`` (or the function ``target``, ``"module:name"``) in a child process (started
    fresh, not forked: onnxruntime's threads do not survive a fork), so that onnxruntime crashing on a file ends the
    child, not the run: ``("crashed", how)`` then, with the signal or exit code."""
    import multiprocessing
    import signal
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_ort_child, args=(send, target, *args), daemon=True)
    child.start()
    send.close()
    try:
        result = receive.recv()
    except EOFError:                                        # it ended without a result
        result = None
    child.join()
    if result is not None:
        return result
    code = child.exitcode if child.exitcode is not None else 0
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    return "crashed", f"it ended with {how} (a fault of onnxruntime's; run in a child process, the lab went on)"


def accuracy_vs_float(reference: np.ndarray, test: np.ndarray, scale: float | None) -> dict[str, float | None]:
    """How far the quantized model's output ``test`` is from the float model's ``reference`` (same shape):

    ``max_abs_error_lsb`` / ``mean_abs_error_lsb``: absolute error in LSBs of the output's quantization ``scale``
    (None without one, e.g. after a Softmax); ``max_error_pct_of_range`` / ``mean_error_pct_of_range``: absolute
    error as % of the float output's range (max - min); ``cosine``: cosine similarity of the flattened outputs;
    for classifier-shaped outputs (``[N, C]``, ``C >= 2``) ``top1_agreement`` (fraction of rows whose argmax
    matches) and, with ``C > 5``, ``top5_agreement`` (fraction whose float top-1 class is in the quantized top 5).
    Every metric is NaN when either output holds a NaN or an infinity (a budget then fails: nothing was measured).
    """
    ref = np.asarray(reference, np.float64)
    got = np.asarray(test, np.float64)
    finite = bool(np.isfinite(ref).all() and np.isfinite(got).all())
    if not finite:                               # measured on zeros for the keys; every value is NaN below
        ref, got = np.zeros_like(ref), np.zeros_like(got)
    err = np.abs(ref - got)
    span = float(ref.max() - ref.min()) if ref.size else 0.0
    norms = float(np.linalg.norm(ref) * np.linalg.norm(got))
    out: dict[str, float | None] = {
        "max_abs_error_lsb": float(err.max() / scale) if scale else None,
        "mean_abs_error_lsb": float(err.mean() / scale) if scale else None,
        "max_error_pct_of_range": float(100 * err.max() / span) if span > 0 else float(100 * (err.max() > 0)),
        "mean_error_pct_of_range": float(100 * err.mean() / span) if span > 0 else float(100 * (err.mean() > 0)),
        "cosine": float((ref * got).sum() / norms) if norms > 0 else float(np.array_equal(ref, got)),
    }
    if ref.ndim == 2 and ref.shape[1] >= 2:
        best = ref.argmax(axis=1)
        out["top1_agreement"] = float((best == got.argmax(axis=1)).mean())
        if ref.shape[1] > 5:
            top5 = np.argsort(-got, axis=1, kind="stable")[:, :5]
            out["top5_agreement"] = float((top5 == best[:, None]).any(axis=1).mean())
    if not finite:                               # no error is measured against a NaN or an infinity
        return {key: None if value is None else float("nan") for key, value in out.items()}
    return out


_EXACT_OPS = frozenset({"Dequantize", "Reshape", "Transpose", "Identity", "Flatten", "Squeeze", "Unsqueeze"})
"""Ops that move or rescale int8 values without rounding: a loss measured at one is its producer's."""

LOSS_REPORT_BELOW = 0.99
"""Output cosine against float under which a run also says where its error arises (:func:`error_sources`)."""


def error_sources(float_graph: Graph, qgraph: Graph, inputs: Mapping[str, np.ndarray], *, top: int = 3
                  ) -> list[dict[str, Any]]:
    """Where the quantized graph's error against the float one arises, for one set of ``inputs``: the ``top`` nodes
    whose output loses most cosine similarity to the float graph's tensor of the same name, against the least
    similar of their inputs (1.0 for a graph input; a tensor the float graph does not name, such as a linear layer's
    reshaped input, carries its producer's). Each is ``{"node", "op", "cosine_in", "cosine_out"}``, largest
    loss first; only losses of at least 0.001. The integer reference keeps every tensor (int8: small); the float run
    is compared as it goes, so it holds only the live tensors."""
    ref = qops_reference(qgraph, inputs, keep_all=True)
    cosines: dict[str, float] = {}

    def observe(name: str, value: np.ndarray) -> None:
        tensor = qgraph.tensors.get(name)
        if name not in ref or tensor is None or np.shape(ref[name]) != np.shape(value) or not np.size(value):
            return
        if tensor.dtype == "int8" and tensor.scale:
            got = np.asarray(ref[name], np.float64) * float(tensor.scale)
        elif tensor.dtype == "float32":
            got = np.asarray(ref[name], np.float64)
        else:
            return
        want = np.asarray(value, np.float64)
        if not (np.isfinite(want).all() and np.isfinite(got).all()):
            return
        norms = float(np.linalg.norm(want) * np.linalg.norm(got))
        cosines[name] = float((want * got).sum() / norms) if norms > 0 else float(np.array_equal(want, got))

    float_ref.run_float(float_graph, {k: v for k, v in inputs.items() if k in float_graph.inputs}, observe=observe)
    losses: list[dict[str, Any]] = []
    carried = dict(cosines)             # a tensor the float graph has no name for carries its producer's inputs'
    for node in qgraph.nodes:
        cos_in = min((carried.get(t, 1.0) for t in node.inputs if t not in qgraph.constants), default=1.0)
        outs = [cosines[o] for o in node.outputs if o in cosines]
        for o in node.outputs:
            carried.setdefault(o, cos_in)
        if not outs:
            continue
        cos_out = min(outs)
        if cos_in - cos_out >= 1e-3:
            source = node                # a move or a Dequantize loses nothing: the loss is its producer's, unmeasured
            while source.op in _EXACT_OPS and source.inputs:
                before = qgraph.producer(source.inputs[0])
                if before is None:
                    break
                source = before
            losses.append({"node": source.name, "op": source.op, "cosine_in": round(cos_in, 6),
                           "cosine_out": round(cos_out, 6)})
    losses.sort(key=lambda x: x["cosine_out"] - x["cosine_in"])
    return losses[:top]


def output_scale(qgraph: Graph, name: str) -> float | None:
    """The quantization scale of the quantized graph's output ``name`` (the scale its Dequantize multiplies by, or
    an int8 output's own); None for an output computed in float (a Softmax)."""
    prod = qgraph.producer(name)
    if prod is not None and prod.op == "Dequantize":
        return float(prod.attrs["scale"])
    tensor = qgraph.tensors[name]
    return float(tensor.scale) if tensor.dtype == "int8" and tensor.scale else None


def iter_batches(x: np.ndarray, batch: int) -> Iterable[np.ndarray]:
    """Consecutive ``batch``-sized slices of ``x`` along axis 0."""
    for i in range(0, x.shape[0], batch):
        yield x[i:i + batch]
