"""The graph IR shared by the whole compiler: one small typed dataflow graph for float and quantized models.

Structure (everything is a plain, picklable dataclass; nothing here depends on the accelerator config):

* :class:`Graph` holds

  - ``tensors``: ``name -> TensorInfo(name, shape, dtype, scale)`` for **every** value (graph inputs, constants,
    intermediates, outputs). Shapes are tuples of ints, activations NCHW (``[N, C, H, W]``) or ``[N, K]``.
    ``dtype`` is one of ``"float32"``, ``"int8"``, ``"int32"``, ``"int64"`` (token ids: a graph input an
    ``Embedding`` reads). ``scale`` is the symmetric per-tensor scale of an
    int8 activation (real value = int value * scale, zero point 0); ``None`` for float tensors and constants.
  - ``constants``: ``name -> np.ndarray`` for weights and biases (float32 in a float graph; int8 weights and int32
    biases in a quantized graph). A constant's name also has an entry in ``tensors``.
  - ``nodes``: a list of :class:`Node` in topological order (every input is a graph input, a constant, or an output
    of an earlier node). ``Node(op, name, inputs, outputs, attrs)``: ``inputs``/``outputs`` are tensor names, ``op``
    a key of :data:`FLOAT_OPS` or :data:`QUANT_OPS`, ``attrs`` a dict whose keys are listed in those tables.
  - ``inputs`` / ``outputs``: names of the graph's runtime inputs and outputs.

* A **float graph** (from :mod:`.onnx_frontend`) uses the ops of :data:`FLOAT_OPS`; BatchNorm is already folded into
  the preceding convolution where there is one.
* A **quantized graph** (from :mod:`.quantize`, or from a pre-quantized ONNX model by :mod:`.frontend.prequant`,
  whose int8 tensors may have a zero point that only the ``QuantizeZp``/``DequantizeZp``/``QAffine`` ops read) uses
  the ops of :data:`QUANT_OPS`. It starts with ``Quantize``
  (float32 input -> int8) and usually ends with ``Dequantize`` (int8 -> float32) or ``Softmax`` (int8 -> float32).
  Its semantics is defined exactly by :mod:`.qops` (``run_reference``). The contract for the accelerator ops:

  - ``QConv2d`` inputs ``[x int8 [N,C,H,W], w int8 [O, C/groups, KH, KW], bias int32 [O]]``, attrs ``strides``
    ``(sh, sw)``, ``pads`` ``(top, left, bottom, right)``, ``groups`` int, ``requant`` :class:`Requant`;
    ``acc = conv(x, w) + bias`` (int32, wrapping), ``y = clip((acc * M[o]) >> S[o], lo, hi)`` per output channel.
  - ``QDense`` inputs ``[x int8 [N,K], w int8 [O,K], bias int32 [O]]``, attr ``requant``; the same with a matmul.
  - ``QAdd`` inputs ``[a int8, b int8]`` (same shape), attr ``requant`` :class:`AddRequant`;
    ``y = clip((a * Ma + b * Mb) >> S, lo, hi)``.
  - The transformer ops (``QMatMul``, ``QSoftmax``, ``QLayerNorm``, ``QRMSNorm``, ``QMulAct``, ``Gather``,
    ``Slice``, ``Where``) run on the CPU; their integer semantics are in :mod:`.qops`. A MatMul over tokens by a
    constant is a ``QConv2d`` (1x1, the token rows as the image's rows), so it reaches the accelerator as a
    convolution.
  - ``*`` wraps to 32 bits, ``>>`` is arithmetic. Rounding is already folded into the bias.

  Extra, informational attrs the quantizer sets: ``w_scale`` (np.ndarray float [O]: weight scale per output channel)
  on QConv2d/QDense and ``activation`` (``"none"``, ``"relu"``, ``"clip"``) on QConv2d/QDense/QAdd.

Helpers: :meth:`Graph.producer`, :meth:`Graph.consumers`, :meth:`Graph.rename_tensor`, :func:`node_macs`,
:meth:`Graph.summary`, and :meth:`Graph.validate`, which checks names, topological order, attributes and, for
QConv2d/QDense/QAdd, the contract above (dtypes, scales, constant weights, one requant entry per output channel).

Executors: :func:`.qops.run_reference` (the integer spec), :func:`.cpu.run_cpu` (llvmlite kernels, bit-exact with
it) and :func:`.float_ref.run_float` (float graphs, for calibration).
"""
from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any, Container, Iterable, Mapping

import numpy as np

__all__ = [
    "DTYPES", "FLOAT_OPS", "QUANT_OPS", "GraphError", "TensorInfo", "Node", "Graph", "Requant", "AddRequant",
    "node_macs", "conv_output_hw", "ACCEL_OPS", "INT8_MIN", "INT8_MAX", "M_MAX", "S_MAX", "value_to_data",
    "value_from_data",
]

DTYPES = ("float32", "int8", "int32", "int64")

INT8_MIN, INT8_MAX = -128, 127
M_MAX = 32767
S_MAX = 31
REQUANT_MODES = ("multiply", "shift")
"""How per-channel scales become integers (:func:`.quantize.quantize`'s ``mode``): an integer multiplier M <= M_MAX
and a shift S <= S_MAX, or a power of two (a shift alone, as VTA's TVM stack)."""

RESIZE_ATTRS = ("mode", "coordinate_transformation_mode", "nearest_mode", "scales", "sizes")
"""Resize's attributes: ``mode`` 'nearest' or 'linear', ONNX's coordinate transformation and nearest mode names,
``scales`` (a float per axis, as ONNX's ``scales`` or sizes / input sizes) and ``sizes`` (the output shape)."""

# op -> required attribute keys. Optional keys are noted in comments.
FLOAT_OPS: dict[str, tuple[str, ...]] = {
    "Conv2d": ("strides", "pads", "groups"),            # inputs x, w [O, C/g, KH, KW], optional bias [O]
    "Dense": (),                                         # inputs x [N, K], w [O, K], optional bias [O]
    "BatchNorm": ("epsilon",),                           # inputs x, scale, bias, mean, var (unfolded only)
    "Relu": (),
    "Clip": ("min", "max"),                              # floats; None means unbounded
    "Add": (),                                           # two activations, or an activation and a constant
    "Mul": (),                                           # an activation and a constant (broadcast, numpy rules),
                                                         # or two activations of one shape
    "MaxPool": ("kernel", "strides", "pads"),
    "AvgPool": ("kernel", "strides", "pads", "count_include_pad"),
    "GlobalAvgPool": (),
    "Reshape": ("shape",),                               # fully resolved target shape (no -1, no 0)
    "Pad": ("pads", "value"),                            # pads in ONNX order: begins of every axis, then ends
    "Concat": ("axis",),
    "Softmax": ("axis",),                                # optional "sink": float [..., w], logits of w more
                                                         # columns only the denominator counts (last axis)
    "Sigmoid": (),
    "HardSigmoid": ("alpha", "beta"),                    # clip(alpha * x + beta, 0, 1)
    "HardSwish": (),                                     # x * clip(x / 6 + 1 / 2, 0, 1)
    "Swish": ("alpha",),                                 # x * sigmoid(alpha * x): SiLU, QuickGelu (alpha 1.702)
    "Transpose": ("perm",),                              # a permutation of every axis, non-negative
    "Resize": RESIZE_ATTRS,
    "MatMul": (),                                        # a [..., M, K] @ b [..., K, N], numpy broadcasting; either
                                                         # may be a constant, rank >= 2 each
    "LayerNorm": ("axis", "epsilon"),                    # inputs x, gamma, beta (constants of x.shape[axis:])
    "RMSNorm": ("axis", "epsilon"),                      # inputs x, gamma [D] (a constant); the last axis only:
                                                         # x / sqrt(mean(x**2) + epsilon) * gamma, no mean removed
    "Gelu": ("approximate",),                            # "none" (erf) or "tanh", as ONNX's Gelu (opset 20)
    "Tanh": (),
    "Exp": (), "Softplus": (), "Softsign": (), "Abs": (), "Mish": (), "Erf": (),   # element-wise, as ONNX's
    "Sin": (), "Cos": (), "Atan": (), "Sign": (), "Sqrt": (), "Reciprocal": (),   # Sqrt(x < 0): 0 in a table
    "Elu": ("alpha",), "Celu": ("alpha",), "LeakyRelu": ("alpha",), "ThresholdedRelu": ("alpha",),
    "Selu": ("alpha", "gamma"),
    "Pow": ("exponent",),                                # x ** exponent, an integer (float), element-wise
    "Gather": ("axis", "indices"),                       # np.take(x, indices, axis); indices an int64 array
    "GatherAt": ("axis",),                               # inputs x, indices (int64, computed at run time by an
                                                         # IndexFn): np.take(x, indices, axis)
    "PickChosen": (),                                    # onehot [..., k, E] (a TopKOneHot's), data [..., E] ->
                                                         # [..., k]: the chosen entries of data
    "TopKOneHot": ("k", "keep"),                         # x [..., E] (, mask) -> [..., k, E] of 0/1: row j one-hot
                                                         # at the j-th largest of x (ties: lower index); keep "all",
                                                         # or "nonzero"/"zero": only where the mask is, see frontend.moe
    "TakeAlong": ("axis", "indices"),                    # np.take_along_axis(x, indices, axis): GatherElements
    "Embedding": (),                                     # inputs ids (an int64 graph input), table const [V, D]:
                                                         # table[ids], shape ids.shape + (D,)
    "Slice": ("axes", "indices"),                        # per axis of axes, the tuple of kept indices, in order
    "Where": ("keep", "fill"),                           # where(keep, x, fill): keep a bool array broadcast to x
    "IndexFn": ("onnx",),                                # int64 ids -> int64 indices by an ONNX subgraph (base64),
                                                         # see frontend.indices and qops_index.run_index_fn
    "L2Normalize": ("axis", "epsilon"),                  # x / max(||x||_2 along axis, epsilon); with the optional
                                                         # "inner": x / sqrt(sum(x * x) + epsilon)
    "Reduce": ("kind", "axis"),                          # ReduceMin, ReduceL2, ReduceLogSumExp...: qops.REDUCE_KINDS;
                                                         # LayerNormalization's Mean ("mean") and InvStdDev
                                                         # ("inv_std", with "epsilon")
    "LogSoftmax": ("axis",),                             # x - log(sum(exp(x))) along axis
    "GridSample": ("mode", "padding", "align_corners"),  # inputs x [N, C, H, W], grid [N, Ho, Wo, 2] (an activation;
                                                         # or 5-D, grid [..., 3]; a constant grid: attribute "grid"):
                                                         # ONNX's GridSample, qops_pool.grid_sample
    "CumSum": ("axis", "exclusive", "reverse"),          # ONNX CumSum of an activation along one axis
    "SumNormalize": ("axis", "epsilon"),                 # x / (sum(x) along axis + epsilon): 0 where that is 0
    "GainL2Scale": ("axis", "epsilon", "gain", "max_gain"),  # x * min(gain / (||x||_2 + epsilon), max_gain)
    "GRNScale": ("axes", "epsilon"),                     # x * G / (mean(G, last axis) + epsilon), G = ||x||_2 over
                                                         # axes (ConvNeXt-V2's GRN without its gamma, beta, residual)
    "PointwiseFn": ("onnx",),                            # x -> f(x) element by element, f an ONNX subgraph (base64)
                                                         # of element-wise nodes, see frontend.pointwise; or of two
                                                         # inputs a, b (broadcast): f(a, b)
    "InputFn": ("onnx",),                                # a numeric graph input (int64 or float32) -> float32 by
                                                         # an ONNX subgraph (base64) run in float: a timestep's
                                                         # embedding, see frontend.numeric_inputs
    "MaskFn": ("onnx",),                                 # mask (int64 0/1) -> a float32 additive term by an ONNX
                                                         # subgraph (base64), read by an additive KeyMask
    "MaskPool": ("onnx", "axes", "keepdims"),            # inputs x, mask (an int64 graph input of 0/1): a masked
                                                         # pooling ReduceSum(x * W, axes) / D, W and D from the mask
                                                         # by an ONNX subgraph (base64), see frontend.pooling
    "KeyMask": ("expand", "sel", "add", "fill", "additive"),  # inputs x (scores), mask (an int64 graph input of
                                                         # 0/1, or with additive a float32 one): a runtime attention
                                                         # mask, see frontend.masks.KeyMask
}

QUANT_OPS: dict[str, tuple[str, ...]] = {
    "Quantize": ("scale",),                              # float32 -> int8: clip(rint(x / scale))
    "Dequantize": ("scale",),                            # int8 -> float32: x * scale
    "QConv2d": ("strides", "pads", "groups", "requant"),
    "QDense": ("requant",),
    "QAdd": ("requant",),
    "QMul": ("multiplier", "shift"),                     # x * constant: clip((x * M + round) >> S), M int32 array
    "QConcat": ("axis", "multipliers", "shifts"),        # each input rescaled: clip((x_i * M_i + round) >> S_i)
    "QClip": ("lo", "hi"),                               # int8 clip (a standalone ReLU/ReLU6)
    "MaxPool": ("kernel", "strides", "pads"),
    "AvgPool": ("kernel", "strides", "pads", "count_include_pad"),
    "GlobalAvgPool": (),
    "Reshape": ("shape",),
    "Pad": ("pads", "value"),                            # value is an int8
    "Softmax": ("axis", "scale"),                        # int8 -> float32 softmax(x * scale); optional masks
                                                         # "bias" (float array) and "keep"/"fill", see qops.softmax,
                                                         # and a runtime mask: input 1 and the "key_*" attributes;
                                                         # "sink" columns as the float op's
    "QSoftmax": ("axis", "scale", "out_scale"),          # int8 -> int8: clip(rint(softmax / out_scale)); same masks
    "QMatMul": ("multiplier", "shift"),                  # int8 a @ int8 b: clip((acc * M + r) >> S), int64;
                                                         # optional zero_points (za, zb, zy): qops.qmatmul
    "QMatMulWide": (),                                   # int8 a @ int8 b -> int32, exact (attention scores read by a
                                                         # softmax at the output's scale; the CPU only)
    "QLayerNorm": ("axis", "epsilon", "scale", "gamma", "beta", "out_scale"),   # float64 from int8, see qops
    "QRMSNorm": ("axis", "epsilon", "scale", "gamma", "out_scale"),  # float64 from int8, qops.rms_norm (optional
                                                         # in_zero_point, zero_point: a pre-quantized file's)
    "QMulAct": ("multiplier", "shift"),                  # int8 a * int8 b (one shape): clip((a*b*M + r) >> S), int64
    "Gather": ("axis", "indices"),
    "GatherAt": ("axis",),                               # int8 data's rows at run-time indices, at its scale
    "TopKOneHot": ("k", "keep"),                         # int8 0/1 at scale 1, as the float op
    "PickChosen": (),                                    # int8 data's entries, at its scale
    "TakeAlong": ("axis", "indices"),
    "Embedding": (),                                     # int8 table [V, D] at the output's scale: table[ids]
    "IndexFn": ("onnx",),                                # as the float op
    "MaskFn": ("onnx",),                                 # as the float op
    "InputFn": ("onnx",),                                # as the float op (float32 out, then a Quantize)
    "QL2Normalize": ("axis", "epsilon", "scale", "out_scale"),  # int64 sum of squares, float64 divide; optional
    # inner, and a pre-quantized file's zero_point, out_zero_point, lo, hi
    "QSumNormalize": ("axis", "epsilon", "scale", "out_scale"),  # int64 sum, float64 divide
    "QReduce": ("kind", "axis", "scale", "out_scale"),   # int64 sums, float64 rest (the C library's exp and log)
    "QLogSoftmax": ("axis", "scale", "out_scale"),       # float64 from int8, the C library's exp and log
    "QGridSample": ("mode", "padding", "align_corners", "scale", "grid_scale", "out_scale"),  # float64 from int8
    "LogSoftmax": ("axis", "scale"),                     # int8 -> float32 log-softmax (at a graph output)
    "LayerNorm": ("axis", "epsilon", "scale", "gamma", "beta"),  # int8 -> float32 (at a graph output):
                                                         # qops.layer_norm_real
    "QCumSum": ("axis", "exclusive", "reverse", "scale", "out_scale"),  # int64 running sums, one rounding
    "QGainL2Scale": ("axis", "epsilon", "gain", "max_gain", "scale", "out_scale"),  # int64 squares, float64 rest
    "QGRNScale": ("axes", "epsilon", "scale", "out_scale"),  # int64 sums of squares, float64 norms and quotient
    "QMaskPool": ("onnx", "axes", "keepdims", "scale", "out_scale"),  # int8 x: int64 sum of x * W, float64 / D
    "Slice": ("axes", "indices"),
    "Where": ("keep", "fill"),                           # fill an int8
    "QLut": ("table",),                                  # y = table[x + 128], table int8 [256]; optional "function"
    "QLut2": ("table",),                                 # y = table[a + 128, b + 128], table int8 [256, 256], a and b
                                                         # broadcast (a PointwiseFn of two inputs)
    "QGelu": ("qb", "f", "k1", "qc", "k2", "multiplier", "shift"),  # I-BERT's integer GELU, qops.igelu (ALU steps)
    "QILayerNorm": ("channels", "k", "mc", "k2", "mc2", "eps_steps", "shift", "mq", "bq"),  # qops.ilayernorm
    "QISoftmax": ("channels", "k", "m", "mq", "shift"),  # int8 -> int8, last axis, no masks: qops.isoftmax
    "Transpose": ("perm",),
    "Resize": RESIZE_ATTRS,                              # int8 in, int8 out (cubic: multiplier, shift to its own)
    "QuantizeZp": ("scale", "zero_point"),               # float32 -> int8: clip(rint(x / scale) + zero_point)
    "DequantizeZp": ("scale", "zero_point"),             # int8 -> float32: (x - zero_point) * scale
    "QAffine": ("multipliers", "offset", "shift", "lo", "hi"),  # clip((sum_i x_i * M_i + offset) >> S), int64
}
"""The ``Zp`` ops and ``QAffine`` carry an int8 zero point (a pre-quantized ONNX model's own,
:mod:`.frontend.prequant`): the real value of such a tensor is ``(x - zero_point) * scale``; every other op assumes
zero point 0 or is zero-point invariant (pools, Reshape, Transpose, MaxPool)."""

ACCEL_OPS = ("QConv2d", "QDense", "QAdd")


class GraphError(ValueError):
    """A graph is malformed: a dangling tensor, a wrong dtype, a missing attribute, a bad requant parameter."""


@dataclass
class TensorInfo:
    """One value of the graph: ``shape`` in elements, ``dtype`` in :data:`DTYPES`, ``scale`` for int8 activations."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    scale: float | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise GraphError(f"Tensor {self.name!r} has dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}.")
        self.shape = tuple(int(d) for d in self.shape)
        if any(d <= 0 for d in self.shape):
            raise GraphError(f"Tensor {self.name!r} has shape {self.shape}; every dimension must be positive.")

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass
class Node:
    """One operator: ``op`` name, unique ``name``, input and output tensor names, and ``attrs`` (see module doc)."""

    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)


def _int_array(value: Any, what: str) -> np.ndarray:
    arr = np.atleast_1d(np.asarray(value))
    if arr.dtype.kind not in "iu":
        raise GraphError(f"{what} must hold integers, not {arr.dtype} values.")
    return arr.astype(np.int64)


@dataclass(frozen=True, eq=False)
class Requant:
    """Requantization of an int32 accumulator to int8: ``y = clip((acc * multiplier[o]) >> shift[o], lo, hi)``.

    ``multiplier`` and ``shift`` are int64 arrays of length O (one per output channel; a per-tensor requant repeats
    one value), ``multiplier`` in [1, 32767], ``shift`` in [0, 31]; ``-128 <= lo <= hi <= 127``. ``acc * M`` wraps
    to 32 bits, ``>>`` is arithmetic.
    """

    multiplier: np.ndarray
    shift: np.ndarray
    lo: int = INT8_MIN
    hi: int = INT8_MAX

    def __post_init__(self) -> None:
        m = _int_array(self.multiplier, "Requant multiplier")
        s = _int_array(self.shift, "Requant shift")
        if m.shape != s.shape:
            raise GraphError(f"Requant multiplier has shape {m.shape} but shift has {s.shape}; they must match.")
        if m.min() < 1 or m.max() > M_MAX:
            raise GraphError(f"Requant multiplier spans [{m.min()}, {m.max()}]; it must lie in [1, {M_MAX}].")
        if s.min() < 0 or s.max() > S_MAX:
            raise GraphError(f"Requant shift spans [{s.min()}, {s.max()}]; it must lie in [0, {S_MAX}].")
        if not INT8_MIN <= self.lo <= self.hi <= INT8_MAX:
            raise GraphError(f"Requant clip range ({self.lo}, {self.hi}) must satisfy -128 <= lo <= hi <= 127.")
        object.__setattr__(self, "multiplier", m)
        object.__setattr__(self, "shift", s)
        object.__setattr__(self, "lo", int(self.lo))
        object.__setattr__(self, "hi", int(self.hi))

    @property
    def channels(self) -> int:
        """Number of output channels O."""
        return int(self.multiplier.shape[0])

    @property
    def per_tensor(self) -> bool:
        """True when every channel has the same (M, S): the ALU can use immediates."""
        return bool((self.multiplier == self.multiplier[0]).all() and (self.shift == self.shift[0]).all())

    @property
    def pure_shift(self) -> bool:
        """True when every multiplier is 1 (the MUL step can be skipped)."""
        return bool((self.multiplier == 1).all())

    def __repr__(self) -> str:
        if self.per_tensor:
            return f"Requant(M={self.multiplier[0]}, S={self.shift[0]}, lo={self.lo}, hi={self.hi})"
        return f"Requant(M=[{self.channels} per channel], S=[...], lo={self.lo}, hi={self.hi})"


@dataclass(frozen=True)
class AddRequant:
    """Requantized residual add: ``y = clip((a * ma + b * mb) >> shift, lo, hi)``, int32 arithmetic."""

    ma: int
    mb: int
    shift: int
    lo: int = INT8_MIN
    hi: int = INT8_MAX

    def __post_init__(self) -> None:
        for key in ("ma", "mb"):
            value = getattr(self, key)
            if not 1 <= value <= M_MAX:
                raise GraphError(f"AddRequant {key}={value} must lie in [1, {M_MAX}].")
        if not 0 <= self.shift <= S_MAX:
            raise GraphError(f"AddRequant shift={self.shift} must lie in [0, {S_MAX}].")
        if not INT8_MIN <= self.lo <= self.hi <= INT8_MAX:
            raise GraphError(f"AddRequant clip range ({self.lo}, {self.hi}) must satisfy -128 <= lo <= hi <= 127.")


def conv_output_hw(h: int, w: int, kernel: tuple[int, int], strides: tuple[int, int],
                   pads: tuple[int, int, int, int]) -> tuple[int, int]:
    """Output height and width (elements) of a convolution or pool with pads (top, left, bottom, right)."""
    oh = (h + pads[0] + pads[2] - kernel[0]) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - kernel[1]) // strides[1] + 1
    return oh, ow


class GraphIndex:
    """The producers and consumers of a graph's tensors, indexed once: for a pass that reads a graph it does not
    change (:meth:`Graph.producer` and :meth:`Graph.consumers` scan every node on each call)."""

    def __init__(self, graph: "Graph") -> None:
        self._producer: dict[str, Node] = {}
        self._consumers: dict[str, list[Node]] = {}
        for node in graph.nodes:
            for out in node.outputs:
                self._producer.setdefault(out, node)
            for name in dict.fromkeys(node.inputs):
                self._consumers.setdefault(name, []).append(node)

    def producer(self, name: str) -> "Node | None":
        """As :meth:`Graph.producer`: the first node writing tensor ``name``, or None."""
        return self._producer.get(name)

    def consumers(self, name: str) -> list["Node"]:
        """As :meth:`Graph.consumers`: the nodes reading tensor ``name``, in graph order (a new list)."""
        return list(self._consumers.get(name, ()))


_NODE_NAME = operator.attrgetter("name")
"""A node's name."""


@dataclass(frozen=True)
class PartialQuantization:
    """A pre-quantized ONNX file with float islands (:mod:`.frontend.prequant_complete`), kept beside its float graph.

    ``model``: the file serialized (input shapes fixed, constants folded); ``where``: its path or name, for messages;
    ``refusal``: the integer import's first refusal of the file as given; ``needs_ranges``: whether completing it
    measures float activations on calibration samples (False when only float weights are missing)."""

    model: bytes
    where: str
    refusal: str
    needs_ranges: bool


@dataclass
class Graph:
    """A dataflow graph; see the module docstring for the structure and invariants."""

    name: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    absmax_hints: dict[str, float] = field(default_factory=dict)
    """A float graph's activation ranges (largest magnitude, by tensor name) that its model file states: a QDQ file's
    own scales (:func:`.frontend.dequantize.qdq_ranges`). Quantizing on random data uses them instead."""
    partial: PartialQuantization | None = field(default=None, compare=False, repr=False)
    """A float graph imported from a pre-quantized file that the integer import refused for its float islands only:
    what :func:`.frontend.prequant.complete_partial` needs to quantize those islands and import the file's integers
    once calibration samples are at hand (:func:`.pipeline.compile_model`)."""
    _names: tuple[list[Node], int, Node | None, set[str]] | None = field(default=None, init=False, repr=False,
                                                                        compare=False)
    """:meth:`_node_names`' cache: the list, its length, its last node and the names."""

    # ---- building -------------------------------------------------------------------------------------------------
    def add_tensor(self, name: str, shape: Iterable[int], dtype: str, scale: float | None = None) -> TensorInfo:
        """Declare a value; raises :class:`GraphError` when the name is taken."""
        if name in self.tensors:
            raise GraphError(f"Tensor {name!r} is declared twice in graph {self.name!r}.")
        info = TensorInfo(name, tuple(shape), dtype, scale)
        self.tensors[name] = info
        return info

    def add_constant(self, name: str, value: np.ndarray) -> TensorInfo:
        """Declare a constant tensor (its dtype must be float32, int8 or int32)."""
        value = np.asarray(value)
        info = self.add_tensor(name, value.shape if value.ndim else (1,), str(value.dtype))
        self.constants[name] = value.reshape(info.shape)
        return info

    def add_node(self, op: str, name: str, inputs: list[str], outputs: list[str], **attrs: Any) -> Node:
        """Append a node (its output tensors must be declared with :meth:`add_tensor`)."""
        names = self._node_names()
        if name in names:
            raise GraphError(f"Node name {name!r} is used twice in graph {self.name!r}.")
        node = Node(op, name, list(inputs), list(outputs), dict(attrs))
        self.nodes.append(node)
        names.add(name)
        self._names = (self.nodes, len(self.nodes), node, names)
        return node

    def _node_names(self) -> set[str]:
        """The nodes' names, kept from the last call while ``nodes`` is the same list of the same length with the
        same last node (so an append, insert, removal or a new list anywhere rebuilds it; a node replaced in place
        keeps its name in the compiler, and :meth:`validate` reports a name used twice)."""
        last = self.nodes[-1] if self.nodes else None
        cache = self._names
        if cache is not None and cache[0] is self.nodes and cache[1] == len(self.nodes) and cache[2] is last:
            return cache[3]
        names = set(map(_NODE_NAME, self.nodes))
        self._names = (self.nodes, len(self.nodes), last, names)
        return names

    def unique_name(self, base: str, *, node: bool = False) -> str:
        """A tensor name (or a node name when ``node``) starting with ``base`` that is not yet used."""
        taken: Container[str] = self._node_names() if node else self.tensors
        if base not in taken:
            return base
        i = 1
        while f"{base}_{i}" in taken:
            i += 1
        return f"{base}_{i}"

    def rename_tensor(self, old: str, new: str) -> None:
        """Rename a tensor everywhere (its info, constants, node inputs/outputs, graph inputs/outputs)."""
        if new in self.tensors:
            raise GraphError(f"Cannot rename {old!r} to {new!r} in graph {self.name!r}: the name is taken.")
        info = self.tensors.pop(old)
        info.name = new
        self.tensors[new] = info
        if old in self.constants:
            self.constants[new] = self.constants.pop(old)
        for node in self.nodes:
            node.inputs = [new if t == old else t for t in node.inputs]
            node.outputs = [new if t == old else t for t in node.outputs]
        self.inputs = [new if t == old else t for t in self.inputs]
        self.outputs = [new if t == old else t for t in self.outputs]

    def copy(self) -> "Graph":
        """A deep copy (constants copied too)."""
        return copy.deepcopy(self)

    # ---- queries --------------------------------------------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` in elements."""
        return self.tensors[name].shape

    def producer(self, name: str) -> Node | None:
        """The node writing tensor ``name``, or None for graph inputs and constants."""
        for node in self.nodes:
            if name in node.outputs:
                return node
        return None

    def consumers(self, name: str) -> list[Node]:
        """Nodes reading tensor ``name``, in graph order."""
        return [node for node in self.nodes if name in node.inputs]

    def node(self, name: str) -> Node:
        """The node called ``name``; KeyError naming it when absent."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"Graph {self.name!r} has no node named {name!r}.")

    @property
    def is_quantized(self) -> bool:
        """True when the graph uses quantized ops (any op of :data:`QUANT_OPS` not also a float op)."""
        return any(n.op in QUANT_OPS and n.op not in FLOAT_OPS for n in self.nodes)

    # ---- checking -------------------------------------------------------------------------------------------------
    def prune_constants(self) -> None:
        """Drop the constants (and their tensors) that no node reads any more."""
        used = {name for node in self.nodes for name in node.inputs}
        for name in [c for c in self.constants if c not in used]:
            del self.constants[name]
            del self.tensors[name]

    def validate(self) -> None:
        """Check names, topological order, op names and required attributes; raise :class:`GraphError` listing all."""
        problems: list[str] = []
        known = set(self.inputs) | set(self.constants)
        table = QUANT_OPS if self.is_quantized else FLOAT_OPS
        for name in list(self.inputs) + list(self.constants):
            if name not in self.tensors:
                problems.append(f"{name!r} has no TensorInfo")
        named: set[str] = set()
        for node in self.nodes:
            if node.name in named:
                problems.append(f"node name {node.name!r} is used twice")
            named.add(node.name)
            if node.op not in table:
                problems.append(f"node {node.name!r} has op {node.op!r}, not one of {', '.join(table)}")
            else:
                missing = [k for k in table[node.op] if k not in node.attrs]
                if missing:
                    problems.append(f"node {node.name!r} ({node.op}) lacks attribute(s) {', '.join(missing)}")
                elif node.op in ACCEL_OPS and all(t in self.tensors for t in node.inputs + node.outputs):
                    problems.extend(self._accel_problems(node))
            for inp in node.inputs:
                if inp not in known:
                    problems.append(f"node {node.name!r} reads {inp!r} before it is produced")
            for out in node.outputs:
                if out not in self.tensors:
                    problems.append(f"node {node.name!r} writes {out!r}, which has no TensorInfo")
                if out in known:
                    problems.append(f"tensor {out!r} is written twice")
                known.add(out)
        for name in self.outputs:
            if name not in known:
                problems.append(f"graph output {name!r} is never produced")
        if problems:
            raise GraphError(f"Graph {self.name!r} is malformed: " + "; ".join(problems) + ".")

    def _accel_problems(self, node: Node) -> list[str]:
        """Contract checks of a QConv2d/QDense/QAdd node: dtypes, scales, constant operands, requant size."""
        problems = []
        info = [self.tensors[t] for t in node.inputs]
        out = self.tensors[node.outputs[0]]
        where = f"node {node.name!r} ({node.op})"
        if out.dtype != "int8" or out.scale is None:
            problems.append(f"{where} must write an int8 tensor with a scale, not {out.dtype} scale={out.scale}")
        if node.op == "QAdd":
            if len(info) != 2 or any(t.dtype != "int8" for t in info) or info[0].shape != info[-1].shape:
                problems.append(f"{where} needs two int8 operands of equal shape")
            elif not isinstance(node.attrs["requant"], AddRequant):
                problems.append(f"{where} needs an AddRequant, not {type(node.attrs['requant']).__name__}")
            return problems
        want = ("int8", "int8", "int32")
        if len(info) != 3 or tuple(t.dtype for t in info) != want:
            problems.append(f"{where} needs inputs (x int8, w int8, bias int32), got "
                            f"{tuple(t.dtype for t in info)}")
            return problems
        if node.inputs[1] not in self.constants or node.inputs[2] not in self.constants:
            problems.append(f"{where} needs constant weights and bias")
        requant = node.attrs["requant"]
        channels = info[1].shape[0]
        if not isinstance(requant, Requant) or requant.channels != channels or info[2].shape != (channels,):
            problems.append(f"{where} needs a Requant and a bias with {channels} channels (one per output channel)")
        return problems

    # ---- plain data (artefact files) ----------------------------------------------------------------------------
    def to_data(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The graph as JSON-able data plus numpy arrays (no Python objects): constants and array attributes are
        arrays keyed ``constants/<k>`` and ``nodes/<k>/<attr>[/<field>]``, which the data names by key (see
        :func:`value_to_data`). :meth:`from_data` reads it back equal."""
        arrays: dict[str, np.ndarray] = {}
        constants = []
        for k, (name, value) in enumerate(self.constants.items()):
            arrays[f"constants/{k}"] = np.asarray(value)
            constants.append([name, f"constants/{k}"])
        nodes = [{"op": n.op, "name": n.name, "inputs": list(n.inputs), "outputs": list(n.outputs),
                  "attrs": {key: value_to_data(value, arrays, f"nodes/{k}/{key}") for key, value in n.attrs.items()}}
                 for k, n in enumerate(self.nodes)]
        tensors = [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype,
                    "scale": None if t.scale is None else float(t.scale)} for t in self.tensors.values()]
        data = {"name": self.name, "inputs": list(self.inputs), "outputs": list(self.outputs), "tensors": tensors,
                "constants": constants, "nodes": nodes}
        return data, arrays

    @classmethod
    def from_data(cls, data: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> "Graph":
        """The graph :meth:`to_data` described; raises :class:`GraphError` when the data is malformed (an unknown
        field, a missing array, a constant whose shape or dtype differs from its tensor) and validates the graph."""
        _expect_keys(data, ("name", "inputs", "outputs", "tensors", "constants", "nodes"), "the graph")
        graph = cls(_str(data["name"], "the graph name"), _strs(data["inputs"], "the graph inputs"),
                    _strs(data["outputs"], "the graph outputs"))
        for t in _list(data["tensors"], "the graph tensors"):
            _expect_keys(t, ("name", "shape", "dtype", "scale"), "a tensor")
            scale = t["scale"]
            if scale is not None and not isinstance(scale, float):
                raise GraphError(f"Tensor {t['name']!r} has scale {scale!r}; expected a float or null.")
            graph.add_tensor(_str(t["name"], "a tensor name"), _ints(t["shape"], f"the shape of {t['name']!r}"),
                             _str(t["dtype"], f"the dtype of {t['name']!r}"), scale)
        for entry in _list(data["constants"], "the graph constants"):
            name, key = _strs(entry, "a constant entry")
            value = _array(arrays, key)
            info = graph.tensors.get(name)
            if info is None or info.shape != value.shape or info.dtype != str(value.dtype):
                raise GraphError(f"Constant {name!r} is a {value.dtype} array of shape {value.shape}, which its "
                                 f"tensor {info} does not describe.")
            graph.constants[name] = value
        for n in _list(data["nodes"], "the graph nodes"):
            _expect_keys(n, ("op", "name", "inputs", "outputs", "attrs"), "a node")
            if not isinstance(n["attrs"], dict):
                raise GraphError(f"The attributes of node {n['name']!r} are a {type(n['attrs']).__name__}, not an "
                                 f"object.")
            graph.add_node(_str(n["op"], "an op"), _str(n["name"], "a node name"), _strs(n["inputs"], "node inputs"),
                           _strs(n["outputs"], "node outputs"),
                           **{key: value_from_data(value, arrays) for key, value in n["attrs"].items()})
        graph.validate()
        return graph

    # ---- reporting ------------------------------------------------------------------------------------------------
    def summary(self) -> str:
        """One line per node: name, op, output shape and dtype, MACs."""
        lines = [f"graph {self.name}: inputs {self.inputs} outputs {self.outputs}"]
        for node in self.nodes:
            out = self.tensors[node.outputs[0]]
            lines.append(f"  {node.name:<32} {node.op:<14} {str(out.shape):<20} {out.dtype:<8} "
                         f"macs={node_macs(self, node)}")
        return "\n".join(lines)


def node_macs(graph: Graph, node: Node) -> int:
    """Multiply-accumulates of a (Q)Conv2d, (Q)Dense or (Q)MatMul node (0 for every other op)."""
    if node.op in ("Conv2d", "QConv2d"):
        o, cg, kh, kw = graph.shape(node.inputs[1])
        n, _, oh, ow = graph.shape(node.outputs[0])
        return n * o * oh * ow * cg * kh * kw
    if node.op in ("Dense", "QDense"):
        o, k = graph.shape(node.inputs[1])
        n = graph.shape(node.outputs[0])[0]
        return n * o * k
    if node.op in ("MatMul", "QMatMul", "QMatMulWide"):
        return graph.tensors[node.outputs[0]].size * graph.shape(node.inputs[0])[-1]
    return 0


# ---- plain data helpers ---------------------------------------------------------------------------------------------
_SCALARS = (type(None), bool, int, float, str)


def value_to_data(value: Any, arrays: dict[str, np.ndarray], key: str) -> Any:
    """An attribute (or metadata) value as JSON-able data, exactly recoverable by :func:`value_from_data`.

    ``None``, ``bool``, ``int``, ``float`` and ``str`` stay as they are; a list becomes a JSON list; every other kind
    becomes an object with one key naming it: ``{"tuple": [...]}``, ``{"dict": {...}}`` (string keys),
    ``{"scalar": [dtype, value]}`` (a numpy scalar), ``{"array": key}`` (a numpy array, stored in ``arrays`` under
    ``key``), ``{"Requant": {...}}`` and ``{"AddRequant": {...}}``. Raises :class:`TypeError` for any other kind.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError(f"{key} is an array of Python objects; only plain numeric arrays can be stored.")
        arrays[key] = value
        return {"array": key}
    if isinstance(value, np.generic):
        return {"scalar": [value.dtype.str, value.item()]}
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, list):
        return [value_to_data(v, arrays, f"{key}/{k}") for k, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"tuple": [value_to_data(v, arrays, f"{key}/{k}") for k, v in enumerate(value)]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{key} is a dict with keys that are not strings; only string keys can be stored.")
        return {"dict": {k: value_to_data(v, arrays, f"{key}/{k}") for k, v in value.items()}}
    if isinstance(value, Requant):
        return {"Requant": {"multiplier": value_to_data(value.multiplier, arrays, f"{key}/multiplier"),
                            "shift": value_to_data(value.shift, arrays, f"{key}/shift"), "lo": value.lo,
                            "hi": value.hi}}
    if isinstance(value, AddRequant):
        return {"AddRequant": {"ma": value.ma, "mb": value.mb, "shift": value.shift, "lo": value.lo, "hi": value.hi}}
    raise TypeError(f"{key} is a {type(value).__name__}, which cannot be stored; attribute values must be None, "
                    f"bool, int, float, str, list, tuple, dict, numpy arrays or scalars, Requant or AddRequant.")


def value_from_data(data: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    """The value :func:`value_to_data` encoded; raises :class:`GraphError` for data it cannot have written."""
    if isinstance(data, _SCALARS):
        return data
    if isinstance(data, list):
        return [value_from_data(v, arrays) for v in data]
    if not isinstance(data, dict) or len(data) != 1:
        raise GraphError(f"A stored value must be a JSON scalar, a list or an object with one key, not {data!r}.")
    (kind, body), = data.items()
    if kind == "array":
        return _array(arrays, _str(body, "an array key"))
    if kind == "tuple":
        return tuple(value_from_data(v, arrays) for v in _list(body, "a tuple"))
    if kind == "dict" and isinstance(body, dict):
        return {k: value_from_data(v, arrays) for k, v in body.items()}
    if kind == "scalar" and isinstance(body, list) and len(body) == 2:
        dtype = np.dtype(_str(body[0], "a scalar dtype"))
        if dtype.hasobject:
            raise GraphError(f"A stored scalar has dtype {dtype}; only plain numeric scalars can be stored.")
        return dtype.type(body[1])
    if kind == "Requant" and isinstance(body, dict):
        _expect_keys(body, ("multiplier", "shift", "lo", "hi"), "a Requant")
        return Requant(value_from_data(body["multiplier"], arrays), value_from_data(body["shift"], arrays),
                       body["lo"], body["hi"])
    if kind == "AddRequant" and isinstance(body, dict):
        _expect_keys(body, ("ma", "mb", "shift", "lo", "hi"), "an AddRequant")
        return AddRequant(**body)
    raise GraphError(f"A stored value of kind {kind!r} is malformed or unknown: {body!r}.")


def _expect_keys(data: Any, keys: tuple[str, ...], what: str) -> None:
    if not isinstance(data, dict) or set(data) != set(keys):
        found = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise GraphError(f"The data of {what} must be an object with keys {', '.join(keys)}, not {found}.")


def _list(data: Any, what: str) -> list[Any]:
    if not isinstance(data, list):
        raise GraphError(f"{what[0].upper()}{what[1:]} must be a list, not {type(data).__name__}.")
    return data


def _str(data: Any, what: str) -> str:
    if not isinstance(data, str):
        raise GraphError(f"{what[0].upper()}{what[1:]} must be a string, not {data!r}.")
    return data


def _strs(data: Any, what: str) -> list[str]:
    return [_str(v, what) for v in _list(data, what)]


def _ints(data: Any, what: str) -> list[int]:
    values = _list(data, what)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise GraphError(f"{what[0].upper()}{what[1:]} must be a list of integers, not {values!r}.")
    return values


def _array(arrays: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    if key not in arrays:
        raise GraphError(f"The data names array {key!r}, which is not stored.")
    return arrays[key]
