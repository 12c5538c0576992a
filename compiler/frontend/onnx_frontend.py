"""ONNX -> float graph IR (:mod:`.ir`), with shapes from ``onnx.shape_inference`` and BatchNorm folded into convs.

Supported ONNX operators (see :data:`RULES`): Conv (any kernel, stride, padding, groups; dilation 1), Gemm, MatMul (by a
constant ``[K, O]``: a Dense, or over tokens ``[..., K]`` a 1x1 Conv2d of every token row; else of two activations or a
constant of rank > 2, batched with broadcasting), BatchNormalization (folded into the preceding Conv/Gemm, else a
depthwise 1x1 Conv), Relu, Clip, Add and Mul (of two activations of one shape, or by a constant), Sub/Div by a constant,
Neg (a Mul by -1), MaxPool, AveragePool, GlobalAveragePool (or ReduceMean over H, W), Flatten, Reshape, Squeeze,
Unsqueeze, Pad (constant mode), Concat (constant operands too), Softmax, Sigmoid, HardSigmoid, HardSwish, Transpose,
DepthToSpace (DCR and CRD: a Reshape, a Transpose and a Reshape), Resize (nearest and linear; see
:data:`RESIZE_COORDINATE_MODES`), the no-ops Identity and Dropout, and for transformers LayerNormalization, Gelu, Tanh,
Gather (constant indices; of a constant table by an int64 graph input of token ids, an Embedding), Slice, Split (one
Slice per output) and Where (a constant condition and a scalar fill: a causal mask). Before the rules run, the
decompositions exporters emit for opsets without those operators are fused back into one node
(:func:`_fuse_decompositions`): LayerNorm's ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div (+ Mul gamma, Add beta) over the
last axis, RMSNorm's Pow/ReduceMean/Add/Sqrt/Div (and the other forms of :mod:`.rmsnorm`) over the last axis, Gelu's Erf
and Tanh forms, recognised as any closed element-wise region around an Erf or Tanh that computes Gelu on sample values,
whatever the order of its operands (the fused Gelu keeps the name of the region's last node), and ``x * Sigmoid(x [*
alpha])`` (SiLU, QuickGelu) as one Swish (ONNX's, of opset 24; named as the Mul). Before shape inference, onnxruntime's
contrib operators (domain ``com.microsoft``: SkipLayerNormalization, the Gelu forms, QuickGelu, BiasAdd, FusedMatMul,
Attention, MultiHeadAttention) are rewritten into standard nodes by :mod:`.contrib`; a node of another domain, or one it
cannot rewrite, is refused as ``<domain>.<op>`` with its reason. MaxPool and AveragePool take 1D, 2D and 3D windows: a
1D pool is a 2D pool of one row, a 3D pool a 2D pool over (H, W) then one over D (max and mean are separable; both
between Reshapes). Subgraphs computing constants (shape arithmetic) are evaluated at import.

A model with nodes the rules cannot import raises one :class:`UnsupportedOperatorError` listing every such node (the
op, the node, and the attribute, input or shape that is the problem), not only the first. A tensor whose size
(from shape inference) would exceed :func:`tensor_byte_limit` raises :class:`TensorTooLargeError` naming it and its
size before anything is allocated.

A symbolic (dynamic) first input dimension is the batch and becomes ``batch``; any other symbolic or unknown input
dimension is an error unless ``input_shapes`` gives that input's whole shape. A file that is not an ONNX model
(missing, empty, a folder, not protobuf, truncated) raises :class:`ModelFileError`, and a model whose default-domain
opset lies outside :data:`SUPPORTED_OPSETS` raises :class:`UnsupportedOpsetError`, both naming the file.

Tensor names are ONNX's; a folded BatchNorm keeps the name of its output for the convolution that absorbed it.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from ..ir import Graph, GraphError, Node
from . import contrib, float_ref, indices, masks, rmsnorm

__all__ = ["UnsupportedOperatorError", "UnsupportedModelError", "ModelFileError", "UnsupportedOpsetError",
           "TensorTooLargeError", "import_onnx", "RULES", "SUPPORTED_OPSETS", "RESIZE_COORDINATE_MODES",
           "tensor_byte_limit"]

SUPPORTED_OPSETS = (13, 22)
"""The default-domain (``ai.onnx``) opsets the rules handle, inclusive. Below 13, Softmax flattened its input to 2D
around ``axis`` (the rule implements the opset-13 per-axis form) and Squeeze/Unsqueeze took their axes otherwise;
the rules read every operator form up to opset 22 (ReduceMean's ``axes`` input of 18, the Conv and pooling revisions
of 19 and 22); later revisions are not reviewed."""


def _public_ops() -> list[str]:
    """The ONNX operators the rules import, sorted (without ``KeyMask`` and ``IndexFn``, the lab's own stand-ins for
    a runtime mask's exit, :mod:`.masks`, and indices computed from token ids, :mod:`.indices`, and
    ``RMSNormalization``, which stands in for RMSNorm's decomposition: the operator itself arrives in opset 23, beyond
    :data:`SUPPORTED_OPSETS`)."""
    return sorted(set(RULES) - {"KeyMask", "IndexFn", rmsnorm.FUSED_OP})


class UnsupportedOperatorError(ValueError):
    """An ONNX operator (or an attribute value of it) that the lab cannot compile."""

    def __init__(self, op_type: str, node_name: str, detail: str = "") -> None:
        self.op_type = op_type
        self.node_name = node_name
        self.detail = detail
        why = f": {detail}" if detail else f"; supported operators are {', '.join(_public_ops())}"
        super().__init__(f"ONNX operator {op_type!r} (node {node_name!r}) is not supported by the lab{why}.")


class UnsupportedModelError(UnsupportedOperatorError):
    """Several nodes of one model that the lab cannot compile, each in :attr:`problems` and on a line of the message."""

    def __init__(self, label: str, problems: list[UnsupportedOperatorError]) -> None:
        ValueError.__init__(self, "")
        self.problems = problems
        self.op_type, self.node_name, self.detail = problems[0].op_type, problems[0].node_name, problems[0].detail
        lines = [f"  - {p.op_type} (node {p.node_name!r}): {p.detail or 'no rule for this operator'}"
                 for p in problems]
        tail = f"Supported operators are {', '.join(_public_ops())}." if any(not p.detail for p in problems) else ""
        self.args = (f"The model {label} has {len(problems)} nodes the lab cannot compile:\n" + "\n".join(lines)
                     + (f"\n{tail}" if tail else ""),)


class TensorTooLargeError(ValueError):
    """A tensor of the model (an input, an intermediate or an output) that would not fit in memory."""


class ModelFileError(ValueError):
    """A model file that cannot be read as an ONNX model: missing, empty, a folder, not protobuf, or truncated."""


class UnsupportedOpsetError(ValueError):
    """A model whose ONNX opset the frontend does not handle (outside :data:`SUPPORTED_OPSETS`)."""


_DTYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT8: "int8", onnx.TensorProto.INT32: "int32",
           onnx.TensorProto.INT64: "int64"}


class _Importer:
    """State of one import: the graph being built, ONNX shapes, aliases for removed no-op nodes."""

    def __init__(self, model: onnx.ModelProto, name: str) -> None:
        self.model = model
        self.graph = Graph(name)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.alias: dict[str, str] = {}
        self.consts: dict[str, np.ndarray] = {}
        self.empty: dict[str, tuple[int, ...]] = {}
        """Tensors whose static shape the lab cannot compute: scalars (shape ``()``) and shapes with a dimension of
        size 0, refused by name when used."""
        for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
            tt = vi.type.tensor_type
            dims = tuple(d.dim_value for d in tt.shape.dim)
            if not tt.HasField("shape"):
                continue
            if dims and all(d > 0 for d in dims):
                self.shapes[vi.name] = dims
            elif all(d.HasField("dim_value") for d in tt.shape.dim):  # a scalar, or a dimension of size 0
                self.empty[vi.name] = dims
        for init in model.graph.initializer:
            self.consts[init.name] = numpy_helper.to_array(init)
        self.uses: dict[str, int] = {}
        for node in model.graph.node:
            for tensor in node.input:
                self.uses[tensor] = self.uses.get(tensor, 0) + 1
        self.graph_outputs = {o.name for o in model.graph.output}
        self.token_linear: dict[str, Node] = {}          # output of a MatMul over tokens -> its Conv2d
        self.key_masks: dict[str, masks.KeyMask] = {}     # output of a runtime mask's exit -> how it masks
        self.index_fns: dict[str, indices.IndexRegion] = {}  # indices computed from token ids -> how

    # ---- helpers used by the rules ------------------------------------------------------------------------------
    def name(self, tensor: str) -> str:
        return self.alias.get(tensor, tensor)

    def is_const(self, tensor: str) -> bool:
        return tensor in self.consts

    def const(self, tensor: str) -> np.ndarray:
        return self.consts[tensor]

    def shape(self, tensor: str) -> tuple[int, ...]:
        tensor = self.name(tensor)
        if tensor in self.graph.tensors:
            return self.graph.tensors[tensor].shape
        return self.shapes_of(tensor)

    def use_const(self, tensor: str, value: np.ndarray | None = None) -> str:
        """Register an initializer (or a computed constant) as a float32 graph constant; returns its name."""
        if tensor not in self.graph.constants:
            array = self.consts[tensor] if value is None else value
            self.graph.add_constant(tensor, np.asarray(array, dtype=np.float32))
        return tensor

    def new_const(self, base: str, value: np.ndarray) -> str:
        name = self.graph.unique_name(base)
        self.graph.add_constant(name, np.asarray(value, dtype=np.float32))
        return name

    def emit(self, op: str, node: onnx.NodeProto, inputs: list[str], output: str | None = None, **attrs: Any) -> None:
        out = output or node.output[0]
        self.graph.add_tensor(out, self.shapes_of(out), "float32")
        self.graph.add_node(op, self.graph.unique_name(node.name or f"{node.op_type}_{out}", node=True),
                            [self.name(i) for i in inputs], [out], **attrs)

    def emit_shaped(self, op: str, node: onnx.NodeProto, inputs: list[str], out_shape: tuple[int, ...],
                    **attrs: Any) -> str:
        """Like :meth:`emit`, for an inner node of a decomposition: its output, a new tensor named after the ONNX
        node's output, has ``out_shape``; returns the output's name."""
        out = self.graph.unique_name(f"{node.output[0]}_{op.lower()}")
        self.graph.add_tensor(out, out_shape, "float32")
        self.graph.add_node(op, self.graph.unique_name(f"{node.name or node.op_type}_{op.lower()}", node=True),
                            [self.name(i) for i in inputs], [out], **attrs)
        return out

    def const_input(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray | None:
        """The constant value of input ``index`` of ``node`` (None when absent), or
        :class:`UnsupportedOperatorError` naming the input (``what``) when another node computes it."""
        if len(node.input) <= index or not node.input[index]:
            return None
        if not self.is_const(node.input[index]):
            raise UnsupportedOperatorError(node.op_type, node.name or "<unnamed>",
                                           f"its {what} input {node.input[index]!r} is computed by another node; it "
                                           f"must be a constant initializer")
        return self.const(node.input[index])

    def shapes_of(self, tensor: str) -> tuple[int, ...]:
        if tensor in self.empty and not self.empty[tensor]:
            raise GraphError(f"Tensor {tensor!r} is a scalar computed at run time; the lab computes tensors of rank 1 "
                             f"or more (a scalar parameter, such as Dropout's ratio or Clip's bounds, must be a "
                             f"constant initializer).")
        if tensor in self.empty:
            raise GraphError(f"Tensor {tensor!r} has shape {'x'.join(map(str, self.empty[tensor]))}, with a "
                             f"dimension of size 0: the lab does not compute empty tensors.")
        if tensor not in self.shapes:
            raise GraphError(f"Shape inference found no static shape for tensor {tensor!r}; give the model static "
                             f"input shapes.")
        return self.shapes[tensor]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _nd_pads(imp: _Importer, node: onnx.NodeProto, kernel: tuple[int, ...], strides: tuple[int, ...],
             attrs: dict[str, Any]) -> list[tuple[int, int]]:
    """(begin, end) pads of each spatial axis from ``pads`` or ``auto_pad``."""
    rank = len(kernel)
    auto = _decode(attrs.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", "VALID"):
        p = list(attrs.get("pads", [0] * 2 * rank)) if auto == "NOTSET" else [0] * 2 * rank
        if len(p) != 2 * rank:
            raise UnsupportedOperatorError(node.op_type, node.name, f"pads {p} for a {rank}D window (need "
                                                                    f"{2 * rank} values)")
        return [(int(p[i]), int(p[i + rank])) for i in range(rank)]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"auto_pad {auto!r}")
    pads = []
    for size, k, s in zip(imp.shape(node.input[0])[2:], kernel, strides):
        out = -(-size // s)
        total = max(0, (out - 1) * s + k - size)
        small, big = total // 2, total - total // 2
        pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return pads


def _spatial_pads(imp: _Importer, node: onnx.NodeProto, kernel: tuple[int, ...], strides: tuple[int, ...],
                  attrs: dict[str, Any]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) pads of a 2D window from ``pads`` or ``auto_pad``."""
    if _decode(attrs.get("auto_pad", "NOTSET")) == "NOTSET" and len(attrs.get("pads", [0] * 4)) != 4:
        raise UnsupportedOperatorError(node.op_type, node.name, f"only 2D pads are supported, got "
                                                                f"{list(attrs['pads'])}")
    (top, bottom), (left, right) = _nd_pads(imp, node, kernel, strides, attrs)
    return (top, left, bottom, right)


def _check_dilations(node: onnx.NodeProto, attrs: dict[str, Any]) -> None:
    if any(d != 1 for d in attrs.get("dilations", [1])):
        raise UnsupportedOperatorError(node.op_type, node.name, f"dilations {list(attrs['dilations'])} (only 1)")


# ---- rules: ONNX op_type -> function(importer, node) ----------------------------------------------------------------
def _conv(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    _check_dilations(node, a)
    if not imp.is_const(node.input[1]):
        raise UnsupportedOperatorError(node.op_type, node.name, "weights must be a constant initializer")
    w = imp.const(node.input[1])
    if w.ndim != 4:
        raise UnsupportedOperatorError(node.op_type, node.name, f"only 2D convolutions, got weights {w.shape}")
    kernel = (w.shape[2], w.shape[3])
    strides = tuple(int(s) for s in a.get("strides", [1, 1]))
    pads = _spatial_pads(imp, node, kernel, strides, a)
    x = node.input[0]
    absorbed = _absorb_pad(imp, x)
    if absorbed is not None:
        x, extra = absorbed
        pads = (pads[0] + extra[0], pads[1] + extra[1], pads[2] + extra[2], pads[3] + extra[3])
    inputs = [x, imp.use_const(node.input[1])]
    if imp.const_input(node, 2, "bias B") is not None:
        inputs.append(imp.use_const(node.input[2]))
    imp.emit("Conv2d", node, inputs, strides=strides, pads=pads, groups=int(a.get("group", 1)))


def _absorb_pad(imp: _Importer, tensor: str) -> tuple[str, tuple[int, int, int, int]] | None:
    """If ``tensor`` comes from a single-use zero Pad of H and W only, remove the Pad and return (its input, its
    (top, left, bottom, right) pads) so the convolution pads instead."""
    src = imp.name(tensor)
    prod = imp.graph.producer(src)
    if prod is None or prod.op != "Pad" or prod.attrs["value"] != 0.0 or imp.uses.get(tensor, 0) != 1:
        return None
    p = prod.attrs["pads"]
    if len(p) != 8 or p[0] or p[1] or p[4] or p[5] or src in imp.graph_outputs:
        return None
    imp.graph.nodes.remove(prod)
    del imp.graph.tensors[src]
    return prod.inputs[0], (p[2], p[3], p[6], p[7])


def _batchnorm(imp: _Importer, node: onnx.NodeProto) -> None:
    if _attrs(node).get("training_mode", 0):
        raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                       "training_mode=1 (batch statistics and running-statistics outputs); the lab "
                                       "runs inference, with the model's mean and var")
    eps = float(_attrs(node).get("epsilon", 1e-5))
    params = [imp.const_input(node, k, what) for k, what in enumerate(("", "scale", "B", "input_mean", "input_var"))
              if k]
    gamma, beta, mean, var = (np.asarray(p, np.float64) for p in params)
    mult = gamma / np.sqrt(var + eps)
    shift = beta - mean * mult
    src = imp.name(node.input[0])
    prod = imp.graph.producer(src)
    single_use = imp.uses.get(node.input[0], 0) == 1 and node.input[0] not in imp.graph_outputs
    if prod is not None and prod.op in ("Conv2d", "Dense") and single_use:
        w = imp.graph.constants[prod.inputs[1]].astype(np.float64)
        b = imp.graph.constants[prod.inputs[2]].astype(np.float64) if len(prod.inputs) > 2 else 0.0
        scale = mult.reshape((-1,) + (1,) * (w.ndim - 1))
        prod.inputs[1:] = [imp.new_const(f"{node.output[0]}_w", w * scale),
                           imp.new_const(f"{node.output[0]}_b", b * mult + shift)]
        imp.graph.rename_tensor(src, node.output[0])
        return
    if len(imp.shape(node.input[0])) != 4:
        raise UnsupportedOperatorError(node.op_type, node.name, "a BatchNormalization of a non-NCHW tensor that "
                                                                "does not follow a Conv or Gemm")
    c = mult.shape[0]
    inputs = [node.input[0], imp.new_const(f"{node.output[0]}_w", mult.reshape(c, 1, 1, 1)),
              imp.new_const(f"{node.output[0]}_b", shift)]
    imp.emit("Conv2d", node, inputs, strides=(1, 1), pads=(0, 0, 0, 0), groups=c)


def _gemm(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    if a.get("transA", 0) or not imp.is_const(node.input[1]):
        raise UnsupportedOperatorError(node.op_type, node.name, "needs transA=0 and a constant B")
    w = imp.const(node.input[1]).astype(np.float64) * float(a.get("alpha", 1.0))
    w = w if a.get("transB", 0) else w.T
    inputs = [node.input[0], imp.new_const(f"{node.output[0]}_w", w)]
    bias = imp.const_input(node, 2, "bias C")
    if bias is not None:
        c = bias.astype(np.float64).reshape(-1) * float(a.get("beta", 1.0))
        if c.size not in (1, w.shape[0]):
            raise UnsupportedOperatorError(node.op_type, node.name, f"a bias C of {c.size} values for "
                                                                    f"{w.shape[0]} outputs (only per-output biases)")
        bias = np.broadcast_to(c, w.shape[:1])
        inputs.append(imp.new_const(f"{node.output[0]}_b", bias))
    imp.emit("Dense", node, inputs)


def _matmul(imp: _Importer, node: onnx.NodeProto) -> None:
    """MatMul by a constant ``[K, O]``: a Dense layer for an input ``[N, K]``; for an input ``[..., K]`` of rank > 2
    (tokens), a 1x1 Conv2d over the image ``[1, K, R, 1]`` of all ``R = prod(...)`` token rows (see
    :func:`_token_linear`); any other MatMul (two activations, or a constant of rank > 2) is a batched,
    broadcasting MatMul."""
    a, b = node.input[0], node.input[1]
    ranks = [len(imp.shape(t)) if not imp.is_const(t) else imp.const(t).ndim for t in (a, b)]
    if min(ranks) < 2:
        raise UnsupportedOperatorError(node.op_type, node.name, f"operands of rank {ranks[0]} and {ranks[1]}; both "
                                                                f"must have rank 2 or more")
    if imp.is_const(a):
        raise UnsupportedOperatorError(node.op_type, node.name, "a constant first operand (only the second may be "
                                                                "a constant)")
    if not imp.is_const(b) or ranks[1] > 2:
        imp.emit("MatMul", node, [a, imp.use_const(b) if imp.is_const(b) else b])
        return
    w = imp.new_const(f"{node.output[0]}_w", imp.const(b).T)
    shape = imp.shape(a)
    if len(shape) == 2:
        imp.emit("Dense", node, [a, w])
        return
    _token_linear(imp, node, a, imp.const(b))


def _token_linear(imp: _Importer, node: onnx.NodeProto, x: str, w: np.ndarray) -> None:
    """``x [..., K] @ w [K, O]`` as a 1x1 convolution whose image is every token row: ``x`` reshaped to ``[R, K]``,
    transposed and viewed as ``[1, K, R, 1]``, the Conv2d, and back to ``[..., O]``. On the accelerator the tokens
    are then the GEMM rows of one image, and the weights are loaded once for all of them (a Dense of ``R`` batch
    rows would load them again for every batch block)."""
    shape = imp.shape(x)
    rows, k, o = int(np.prod(shape[:-1])), shape[-1], w.shape[1]
    flat = imp.emit_shaped("Reshape", node, [x], (rows, k), shape=(rows, k))
    cols = imp.emit_shaped("Transpose", node, [flat], (k, rows), perm=(1, 0))
    image = imp.emit_shaped("Reshape", node, [cols], (1, k, rows, 1), shape=(1, k, rows, 1))
    weight = imp.new_const(f"{node.output[0]}_w", w.T.reshape(o, k, 1, 1))
    conv = imp.emit_shaped("Conv2d", node, [image, weight], (1, o, rows, 1), strides=(1, 1), pads=(0, 0, 0, 0),
                           groups=1)
    back = imp.emit_shaped("Reshape", node, [conv], (o, rows), shape=(o, rows))
    out = imp.emit_shaped("Transpose", node, [back], (rows, o), perm=(1, 0))
    imp.emit("Reshape", node, [out], shape=imp.shapes_of(node.output[0]))
    producer = imp.graph.producer(conv)
    if producer is not None:
        imp.token_linear[node.output[0]] = producer
        last = imp.graph.nodes[-1]
        if node.name and last.name == node.name:     # the compiled layer keeps the ONNX node's name (the report row)
            last.name = imp.graph.unique_name(f"{node.name}_reshape_out", node=True)
            producer.name = node.name


def _dense_bias_target(imp: _Importer, x: str, c: np.ndarray) -> Node | None:
    """The Conv2d of a MatMul over tokens (:func:`_token_linear`) that wrote ``x``, when the constant ``c``
    broadcasts along the last axis only and ``x`` has one use: an Add of ``c`` then folds into its bias."""
    conv = imp.token_linear.get(imp.name(x))
    if conv is None or imp.uses.get(x, 0) != 1 or x in imp.graph_outputs:
        return None
    o = imp.graph.shape(conv.inputs[1])[0]
    if c.size not in (1, o) or (c.ndim and c.shape[-1] != c.size):
        return None
    return conv


def _clip(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    lo, hi = a.get("min"), a.get("max")
    lo_input, hi_input = imp.const_input(node, 1, "min"), imp.const_input(node, 2, "max")
    if lo_input is not None:
        lo = float(lo_input.reshape(()))
    if hi_input is not None:
        hi = float(hi_input.reshape(()))
    imp.emit("Clip", node, [node.input[0]], min=None if lo is None else float(lo),
             max=None if hi is None else float(hi))


def _binary(imp: _Importer, node: onnx.NodeProto) -> None:
    """Add or Mul of two activations of one shape; Add/Sub/Mul/Div with one constant become Add or Mul by a
    constant."""
    x, y = node.input[0], node.input[1]
    if imp.is_const(x) and node.op_type in ("Add", "Mul"):
        x, y = y, x
    if imp.is_const(x):
        raise UnsupportedOperatorError(node.op_type, node.name, "a constant first operand is only allowed for Add/Mul")
    if not imp.is_const(y):
        if node.op_type not in ("Add", "Mul"):
            raise UnsupportedOperatorError(node.op_type, node.name, "only Add and Mul take two activations")
        if imp.shape(x) != imp.shape(y):
            raise UnsupportedOperatorError(node.op_type, node.name, f"{node.op_type} operands must have equal shapes")
        imp.emit(node.op_type, node, [x, y])
        return
    c = imp.const(y).astype(np.float64)
    op = {"Add": "Add", "Sub": "Add", "Mul": "Mul", "Div": "Mul"}[node.op_type]
    if node.op_type == "Sub":
        c = -c
    elif node.op_type == "Div":
        c = 1.0 / c
    dense = _dense_bias_target(imp, x, c) if op == "Add" else None
    if dense is not None:                                # a MatMul over tokens and its bias: one Conv2d
        o = imp.graph.shape(dense.inputs[1])[0]
        bias = imp.graph.constants[dense.inputs[2]].astype(np.float64) if len(dense.inputs) > 2 else np.zeros(o)
        dense.inputs[2:] = [imp.new_const(f"{node.output[0]}_b", bias + np.broadcast_to(c.reshape(-1), (o,)))]
        imp.alias[node.output[0]] = imp.name(x)
        return
    imp.emit(op, node, [x, imp.new_const(f"{node.output[0]}_c", c)])


def _pool(imp: _Importer, node: onnx.NodeProto) -> None:
    """MaxPool/AveragePool of a 1D, 2D or 3D window (see the module docstring for 1D and 3D)."""
    a = _attrs(node)
    kernel = tuple(int(k) for k in a["kernel_shape"])
    rank = len(kernel)
    problems = []
    if any(d != 1 for d in a.get("dilations", [1])):
        problems.append(f"dilations {list(a['dilations'])} (only 1)")
    if a.get("ceil_mode", 0):
        problems.append("ceil_mode=1 (only 0)")
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        problems.append("the Indices output")
    if rank not in (1, 2, 3):
        problems.append(f"a {rank}D window (only 1D, 2D and 3D)")
    if problems:
        raise UnsupportedOperatorError(node.op_type, node.name, "; ".join(problems))
    strides = tuple(int(s) for s in a.get("strides", [1] * rank))
    pads = _nd_pads(imp, node, kernel, strides, a)
    op = "MaxPool" if node.op_type == "MaxPool" else "AvgPool"
    extra: dict[str, Any] = {} if op == "MaxPool" else {"count_include_pad": bool(a.get("count_include_pad", 0))}
    x, out = node.input[0], node.output[0]
    shape = imp.shape(x)
    if rank == 2:
        imp.emit(op, node, [x], kernel=kernel, strides=strides, pads=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]),
                 **extra)
    elif rank == 1:
        n, c, length = shape
        (begin, end), = pads
        olen = imp.shapes_of(out)[2]
        row = imp.emit_shaped("Reshape", node, [x], (n, c, 1, length), shape=(n, c, 1, length))
        pooled = imp.emit_shaped(op, node, [row], (n, c, 1, olen), kernel=(1, kernel[0]), strides=(1, strides[0]),
                                 pads=(0, begin, 0, end), **extra)
        imp.emit("Reshape", node, [pooled], shape=(n, c, olen))
    else:
        n, c, d, h, w = shape
        od, oh, ow = imp.shapes_of(out)[2:]
        planes = imp.emit_shaped("Reshape", node, [x], (n, c * d, h, w), shape=(n, c * d, h, w))
        hw = imp.emit_shaped(op, node, [planes], (n, c * d, oh, ow), kernel=kernel[1:], strides=strides[1:],
                             pads=(pads[1][0], pads[2][0], pads[1][1], pads[2][1]), **extra)
        cols = imp.emit_shaped("Reshape", node, [hw], (n, c, d, oh * ow), shape=(n, c, d, oh * ow))
        depth = imp.emit_shaped(op, node, [cols], (n, c, od, oh * ow), kernel=(kernel[0], 1), strides=(strides[0], 1),
                                pads=(pads[0][0], 0, pads[0][1], 0), **extra)
        imp.emit("Reshape", node, [depth], shape=(n, c, od, oh, ow))


def _reshape(imp: _Importer, node: onnx.NodeProto) -> None:
    imp.emit("Reshape", node, [node.input[0]], shape=imp.shapes_of(node.output[0]))


def _pad(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    if _decode(a.get("mode", "constant")) != "constant":
        raise UnsupportedOperatorError(node.op_type, node.name, f"mode {_decode(a['mode'])!r} (only 'constant')")
    pads = a.get("pads")
    value = float(a.get("value", 0.0))
    pads_input, value_input = imp.const_input(node, 1, "pads"), imp.const_input(node, 2, "constant_value")
    if pads_input is not None:
        pads = pads_input.tolist()
    if pads is None:
        raise UnsupportedOperatorError(node.op_type, node.name, "no pads given")
    if value_input is not None:
        value = float(value_input.reshape(()))
    if len(node.input) > 3 and node.input[3]:
        raise UnsupportedOperatorError(node.op_type, node.name, "the axes input")
    imp.emit("Pad", node, [node.input[0]], pads=tuple(int(p) for p in pads), value=value)


def _axis_op(op: str) -> Callable[[_Importer, onnx.NodeProto], None]:
    def rule(imp: _Importer, node: onnx.NodeProto) -> None:
        rank = len(imp.shapes_of(node.output[0]))       # the output's: the first input may be a constant
        axis = int(_attrs(node).get("axis", -1 if op == "Softmax" else 0))
        inputs = [imp.use_const(t) if imp.is_const(t) else t for t in node.input]   # Concat of a constant
        imp.emit(op, node, inputs, axis=axis % rank)
    return rule


def _transpose(imp: _Importer, node: onnx.NodeProto) -> None:
    rank = len(imp.shape(node.input[0]))
    perm = tuple(int(p) % rank for p in _attrs(node).get("perm", range(rank - 1, -1, -1)))
    imp.emit("Transpose", node, [node.input[0]], perm=perm)


def _depth_to_space(imp: _Importer, node: onnx.NodeProto) -> None:
    """DepthToSpace as ONNX defines it: Reshape to 6D, Transpose, Reshape."""
    a = _attrs(node)
    mode, bs = _decode(a.get("mode", "DCR")), int(a["blocksize"])
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"mode {mode!r} (only 'DCR' and 'CRD')")
    n, c, h, w = imp.shape(node.input[0])
    if mode == "DCR":
        split, perm = (n, bs, bs, c // bs**2, h, w), (0, 3, 4, 1, 5, 2)
    else:
        split, perm = (n, c // bs**2, bs, bs, h, w), (0, 1, 4, 2, 5, 3)
    blocks = imp.emit_shaped("Reshape", node, [node.input[0]], split, shape=split)
    moved = imp.emit_shaped("Transpose", node, [blocks], tuple(split[p] for p in perm), perm=perm)
    imp.emit("Reshape", node, [moved], shape=(n, c // bs**2, h * bs, w * bs))


RESIZE_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
"""Resize's coordinate transformations the lab implements (with modes ``nearest`` and ``linear``); ONNX's other one,
``tf_crop_and_resize`` (a region of interest, an extrapolation value), is refused by name, as are ``cubic``,
``antialias=1`` and a ``keep_aspect_ratio_policy`` other than ``stretch``."""


def _resize(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    mode = _decode(a.get("mode", "nearest"))
    coord = _decode(a.get("coordinate_transformation_mode", "half_pixel"))
    policy = _decode(a.get("keep_aspect_ratio_policy", "stretch"))
    problems = []
    if mode not in ("nearest", "linear"):
        problems.append(f"mode {mode!r} (only 'nearest' and 'linear')")
    if coord not in RESIZE_COORDINATE_MODES:
        problems.append(f"coordinate_transformation_mode {coord!r} (only {', '.join(RESIZE_COORDINATE_MODES)})")
    if a.get("antialias", 0):
        problems.append("antialias=1 (only 0)")
    if policy != "stretch":
        problems.append(f"keep_aspect_ratio_policy {policy!r} (only 'stretch')")
    nearest = _decode(a.get("nearest_mode", "round_prefer_floor"))
    if mode == "nearest" and nearest not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        problems.append(f"nearest_mode {nearest!r}")
    if problems:
        raise UnsupportedOperatorError(node.op_type, node.name, "; ".join(problems))
    in_shape, out_shape = imp.shape(node.input[0]), imp.shapes_of(node.output[0])
    rank = len(in_shape)
    axes = [int(x) % rank for x in a.get("axes", range(rank))]
    given = imp.const_input(node, 2, "scales")
    sizes = imp.const_input(node, 3, "sizes")
    scales = [1.0] * rank
    if given is not None and given.size:
        for axis, value in zip(axes, given.reshape(-1).tolist()):
            scales[axis] = float(value)
    elif sizes is not None:
        for axis, value in zip(axes, sizes.reshape(-1).tolist()):
            scales[axis] = int(value) / in_shape[axis]
    else:
        raise UnsupportedOperatorError(node.op_type, node.name, "neither scales nor sizes is given")
    imp.emit("Resize", node, [node.input[0]], mode=mode, coordinate_transformation_mode=coord,
             nearest_mode=nearest, scales=tuple(scales),
             sizes=tuple(out_shape))


def _reduce_mean(imp: _Importer, node: onnx.NodeProto) -> None:
    """ReduceMean over H and W of an NCHW tensor (how exporters often write global average pooling)."""
    a = _attrs(node)
    axes = a.get("axes")
    axes_input = imp.const_input(node, 1, "axes")
    if axes_input is not None:
        axes = axes_input.tolist()
    rank = len(imp.shape(node.input[0]))
    if rank != 4 or axes is None or sorted(int(x) % rank for x in axes) != [2, 3]:
        raise UnsupportedOperatorError(node.op_type, node.name, f"only the mean over axes (2, 3) of an NCHW tensor, "
                                                                f"got axes {axes}")
    if a.get("keepdims", 1):
        imp.emit("GlobalAvgPool", node, [node.input[0]])
        return
    pooled = imp.graph.unique_name(f"{node.output[0]}_pooled")
    n, c = imp.shape(node.input[0])[:2]
    imp.graph.add_tensor(pooled, (n, c, 1, 1), "float32")
    imp.graph.add_node("GlobalAvgPool", imp.graph.unique_name(pooled, node=True), [imp.name(node.input[0])], [pooled])
    imp.emit("Reshape", node, [pooled], shape=(n, c))


def _layer_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """LayerNormalization (opset 17) with constant scale and bias; only its first output."""
    a = _attrs(node)
    shape = imp.shape(node.input[0])
    axis = int(a.get("axis", -1)) % len(shape)
    if any(out for out in node.output[1:]):
        raise UnsupportedOperatorError(node.op_type, node.name, "the Mean and InvStdDev outputs (only Y)")
    gamma = imp.const_input(node, 1, "Scale")
    beta = imp.const_input(node, 2, "B")
    normed = shape[axis:]
    params = []
    for what, value, default in (("Scale", gamma, 1.0), ("B", beta, 0.0)):
        value = np.full(normed, default) if value is None else value
        try:
            params.append(np.broadcast_to(value, normed))
        except ValueError:
            raise UnsupportedOperatorError(node.op_type, node.name, f"a {what} of shape {value.shape} for "
                                                                    f"normalised shape {normed}") from None
    imp.emit("LayerNorm", node, [node.input[0], imp.new_const(f"{node.output[0]}_gamma", params[0]),
                                 imp.new_const(f"{node.output[0]}_beta", params[1])],
             axis=axis, epsilon=float(a.get("epsilon", 1e-5)))


def _rms_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """RMSNormalization over the last axis with a constant scale (opset 23's operator, which is also the node
    :func:`_fuse_decompositions` puts in place of RMSNorm's decomposition, :mod:`.rmsnorm`)."""
    a = _attrs(node)
    shape = imp.shape(node.input[0])
    axis = int(a.get("axis", -1)) % len(shape)
    if axis != len(shape) - 1:
        raise UnsupportedOperatorError(node.op_type, node.name, f"axis {a.get('axis')} of a rank-{len(shape)} "
                                                                f"input (only the last axis)")
    scale = imp.const_input(node, 1, "scale")
    value = np.ones(shape[-1]) if scale is None else scale
    if value.size not in (1, shape[-1]) or (value.ndim and value.shape[-1] != value.size):
        raise UnsupportedOperatorError(node.op_type, node.name, f"a scale of shape {value.shape} for normalised "
                                                                f"width {shape[-1]} (only one value per channel)")
    gamma = np.broadcast_to(value.reshape(-1), (shape[-1],))
    imp.emit("RMSNorm", node, [node.input[0], imp.new_const(f"{node.output[0]}_gamma", gamma)], axis=axis,
             epsilon=float(a.get("epsilon", 1e-5)))


def _neg(imp: _Importer, node: onnx.NodeProto) -> None:
    """Neg of an activation: a Mul by the constant -1 (rotary embeddings' ``rotate_half``)."""
    imp.emit("Mul", node, [node.input[0], imp.new_const(f"{node.output[0]}_c", np.array([-1.0]))])


def _gelu(imp: _Importer, node: onnx.NodeProto) -> None:
    approximate = _decode(_attrs(node).get("approximate", "none"))
    if approximate not in ("none", "tanh"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"approximate {approximate!r} (only 'none', 'tanh')")
    imp.emit("Gelu", node, [node.input[0]], approximate=approximate)


def _gather(imp: _Importer, node: onnx.NodeProto) -> None:
    """Gather of constant indices from an activation (a token, a head, the class token); Gather on axis 0 of a
    constant table by an int64 graph input (token ids) is an Embedding."""
    if imp.is_const(node.input[0]) and not imp.is_const(node.input[1]):
        ids = imp.name(node.input[1])
        axis = int(_attrs(node).get("axis", 0)) % max(imp.const(node.input[0]).ndim, 1)
        if ids not in imp.graph.tensors or imp.graph.tensors[ids].dtype != "int64" or axis != 0 or \
                imp.const(node.input[0]).ndim != 2:
            raise UnsupportedOperatorError(node.op_type, node.name, "an embedding lookup of computed indices (only "
                                                                    "an int64 graph input of token ids can index a "
                                                                    "constant table [rows, width] on axis 0)")
        imp.emit("Embedding", node, [ids, imp.use_const(node.input[0])])
        return
    indices = imp.const_input(node, 1, "indices")
    rank = len(imp.shape(node.input[0]))
    axis = int(_attrs(node).get("axis", 0)) % rank
    size = imp.shape(node.input[0])[axis]
    idx = np.asarray(indices, np.int64)
    if idx.size and (idx.min() < -size or idx.max() >= size):
        raise UnsupportedOperatorError(node.op_type, node.name, f"indices outside [-{size}, {size - 1}]")
    imp.emit("Gather", node, [node.input[0]], axis=axis, indices=np.where(idx < 0, idx + size, idx))


def _slice_indices(dim: int, start: int, end: int, step: int) -> tuple[int, ...]:
    """The indices ONNX's Slice keeps of an axis of ``dim`` elements (its clamping rules)."""
    start, end = (v + dim if v < 0 else v for v in (start, end))
    if step > 0:
        return tuple(range(min(max(start, 0), dim), min(max(end, 0), dim), step))
    return tuple(range(min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step))


def _slice(imp: _Importer, node: onnx.NodeProto) -> None:
    shape = imp.shape(node.input[0])
    starts = imp.const_input(node, 1, "starts")
    ends = imp.const_input(node, 2, "ends")
    if starts is None or ends is None:
        raise UnsupportedOperatorError(node.op_type, node.name, "no starts and ends inputs (opset 10 or later)")
    axes = imp.const_input(node, 3, "axes")
    steps = imp.const_input(node, 4, "steps")
    axes_list = [int(v) % len(shape) for v in (range(len(starts)) if axes is None else axes.reshape(-1))]
    steps_list = [1] * len(axes_list) if steps is None else [int(v) for v in steps.reshape(-1)]
    if 0 in steps_list:
        raise UnsupportedOperatorError(node.op_type, node.name, "a step of 0")
    indices = tuple(_slice_indices(shape[ax], int(b), int(e), st)
                    for ax, b, e, st in zip(axes_list, starts.reshape(-1), ends.reshape(-1), steps_list))
    imp.emit("Slice", node, [node.input[0]], axes=tuple(axes_list), indices=indices)


def _split(imp: _Importer, node: onnx.NodeProto) -> None:
    """Split: one Slice per output, sizes from shape inference."""
    shape = imp.shape(node.input[0])
    axis = int(_attrs(node).get("axis", 0)) % len(shape)
    begin = 0
    for out in node.output:
        size = imp.shapes_of(out)[axis]
        if out:
            imp.emit("Slice", node, [node.input[0]], output=out, axes=(axis,), indices=(tuple(range(begin,
                                                                                                  begin + size)),))
        begin += size


def _where(imp: _Importer, node: onnx.NodeProto) -> None:
    """Where with a constant condition, an activation and a constant scalar (a causal mask)."""
    cond, x, y = node.input
    keep = imp.const_input(node, 0, "condition")
    if imp.is_const(x) == imp.is_const(y):
        raise UnsupportedOperatorError(node.op_type, node.name, "needs one activation and one constant value")
    src, fill = (y, x) if imp.is_const(x) else (x, y)
    value = imp.const(fill)
    keep = np.asarray(keep, bool) if src == x else ~np.asarray(keep, bool)
    if value.size != 1 or imp.shapes_of(node.output[0]) != imp.shape(src):
        raise UnsupportedOperatorError(node.op_type, node.name, f"a constant of shape {value.shape} (only a scalar) "
                                                                f"or an output larger than the activation")
    imp.emit("Where", node, [src], keep=keep, fill=float(value.reshape(())))


def _key_mask(imp: _Importer, node: onnx.NodeProto) -> None:
    """The exit of a runtime mask's region (:func:`.masks.find_key_masks` put it here; a KeyMask node of the file
    itself is refused as unknown)."""
    mask = imp.key_masks.get(node.output[0])
    if mask is None:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.emit("KeyMask", node, [mask.x, mask.mask], expand=list(mask.expand), sel=mask.sel, add=mask.add,
             fill=mask.fill, additive=mask.additive)


def _cast(imp: _Importer, node: onnx.NodeProto) -> None:
    """Cast of an activation to float32 (activations are float32 already): an identity. Any other cast of an
    activation changes its values, and is refused."""
    to = int(_attrs(node).get("to", 0))
    if to != onnx.TensorProto.FLOAT:
        raise UnsupportedOperatorError(node.op_type, node.name, f"a cast of an activation to "
                                                                f"{onnx.TensorProto.DataType.Name(to)} (only to "
                                                                f"FLOAT, an identity on the lab's float32 values)")
    _alias(imp, node)


def _index_fn(imp: _Importer, node: onnx.NodeProto) -> None:
    """Indices computed from token ids (:func:`.indices.find_index_regions` put the node here; an IndexFn node of the
    file itself is refused as unknown)."""
    region = imp.index_fns.get(node.output[0])
    if region is None:
        raise UnsupportedOperatorError(node.op_type, node.name)
    imp.graph.add_tensor(region.out, region.shape, "int64")
    imp.graph.add_node("IndexFn", imp.graph.unique_name(node.name, node=True), [region.ids], [region.out],
                       onnx=region.model)


def _alias(imp: _Importer, node: onnx.NodeProto) -> None:
    imp.alias[node.output[0]] = imp.name(node.input[0])


def _dropout(imp: _Importer, node: onnx.NodeProto) -> None:
    """Dropout in inference mode: an identity. Its mask output and training mode have no inference meaning."""
    training = imp.const_input(node, 2, "training_mode")
    if training is not None and bool(np.asarray(training).any()):
        raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                       "training_mode is true; the lab runs inference, where Dropout is an identity")
    if len(node.output) > 1 and node.output[1] and (imp.uses.get(node.output[1], 0)
                                                   or node.output[1] in imp.graph_outputs):
        raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                       f"its mask output {node.output[1]!r} is used; the lab runs Dropout in "
                                       f"inference mode, as an identity, and computes no mask")
    _alias(imp, node)


def _constant(imp: _Importer, node: onnx.NodeProto) -> None:
    imp.consts[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])


RULES: dict[str, Callable[[_Importer, onnx.NodeProto], None]] = {
    "Conv": _conv,
    "BatchNormalization": _batchnorm,
    "Gemm": _gemm,
    "MatMul": _matmul,
    "Relu": lambda imp, node: imp.emit("Relu", node, [node.input[0]]),
    "Clip": _clip,
    "Add": _binary, "Sub": _binary, "Mul": _binary, "Div": _binary,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "GlobalAveragePool": lambda imp, node: imp.emit("GlobalAvgPool", node, [node.input[0]]),
    "Flatten": _reshape,
    "Reshape": _reshape,
    "Squeeze": _reshape,
    "Unsqueeze": _reshape,
    "ReduceMean": _reduce_mean,
    "Pad": _pad,
    "Concat": _axis_op("Concat"),
    "Softmax": _axis_op("Softmax"),
    "Sigmoid": lambda imp, node: imp.emit("Sigmoid", node, [node.input[0]]),
    "HardSigmoid": lambda imp, node: imp.emit("HardSigmoid", node, [node.input[0]],
                                              alpha=float(_attrs(node).get("alpha", 0.2)),
                                              beta=float(_attrs(node).get("beta", 0.5))),
    "HardSwish": lambda imp, node: imp.emit("HardSwish", node, [node.input[0]]),
    "Transpose": _transpose,
    "DepthToSpace": _depth_to_space,
    "Resize": _resize,
    "LayerNormalization": _layer_norm,
    "Gelu": _gelu,
    rmsnorm.FUSED_OP: _rms_norm,
    "Neg": _neg,
    "Swish": lambda imp, node: imp.emit("Swish", node, [node.input[0]], alpha=float(_attrs(node).get("alpha", 1.0))),
    "Tanh": lambda imp, node: imp.emit("Tanh", node, [node.input[0]]),
    "Gather": _gather,
    "Slice": _slice,
    "Split": _split,
    "Where": _where,
    "KeyMask": _key_mask,
    "IndexFn": _index_fn,
    "Identity": _alias,
    "Cast": _cast,
    "Dropout": _dropout,
    "Constant": _constant,
}


# ---- decompositions exporters emit, fused back into one node before the rules run ---------------------------------
class _OnnxGraph:
    """Producers, consumers and constants of an ONNX graph's tensors, for the pattern matchers."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for out in node.output:
                self.producer[out] = node
            for inp in node.input:
                self.consumers.setdefault(inp, []).append(node)
        self.outputs = {o.name for o in model.graph.output}

    def only_user(self, tensor: str, op: str) -> onnx.NodeProto | None:
        """The single consumer of ``tensor`` when it has op ``op`` and ``tensor`` is not a graph output."""
        users = self.consumers.get(tensor, [])
        if len(users) == 1 and users[0].op_type == op and tensor not in self.outputs:
            return users[0]
        return None

    def other_input(self, node: onnx.NodeProto, tensor: str) -> str:
        return node.input[1] if node.input[0] == tensor else node.input[0]

    def scalar(self, node: onnx.NodeProto, tensor: str) -> float | None:
        """The value of ``node``'s other (constant, one-element) operand."""
        other = self.other_input(node, tensor)
        value = self.consts.get(other)
        return float(value.reshape(())) if value is not None and value.size == 1 else None


def _reduce_axes(g: _OnnxGraph, node: onnx.NodeProto) -> list[int] | None:
    a = _attrs(node)
    axes = a.get("axes")
    if len(node.input) > 1 and node.input[1]:
        axes = g.consts[node.input[1]].tolist() if node.input[1] in g.consts else None
    return None if axes is None or not a.get("keepdims", 1) else [int(v) for v in axes]


def _match_layer_norm(g: _OnnxGraph, mean: onnx.NodeProto, rank: int
                      ) -> tuple[list[onnx.NodeProto], dict[str, Any]] | None:
    """``ReduceMean(x) -> Sub(x, mean) -> Pow 2 (or Mul by itself) -> ReduceMean -> Add eps -> Sqrt -> Div`` over
    the last axis, then an optional Mul by gamma and Add of beta: the nodes and the LayerNormalization's parts."""
    axes = _reduce_axes(g, mean)
    if axes is None or [v % rank for v in axes] != [rank - 1]:
        return None
    x = mean.input[0]
    sub = g.only_user(mean.output[0], "Sub")
    if sub is None or list(sub.input) != [x, mean.output[0]]:
        return None
    d = sub.output[0]
    users = g.consumers.get(d, [])
    div = next((u for u in users if u.op_type == "Div" and list(u.input[:1]) == [d]), None)
    sq = next((u for u in users if u is not div), None)
    if len(users) != 2 or div is None or sq is None or d in g.outputs:
        return None
    if not ((sq.op_type == "Pow" and g.scalar(sq, d) == 2.0) or (sq.op_type == "Mul" and list(sq.input) == [d, d])):
        return None
    var = g.only_user(sq.output[0], "ReduceMean")
    if var is None or _reduce_axes(g, var) != axes:
        return None
    add = g.only_user(var.output[0], "Add")
    eps = None if add is None else g.scalar(add, var.output[0])
    sqrt = None if add is None else g.only_user(add.output[0], "Sqrt")
    if add is None or eps is None or sqrt is None or list(div.input) != [d, sqrt.output[0]] or \
            g.consumers.get(sqrt.output[0], []) != [div]:
        return None
    nodes: list[onnx.NodeProto] = [mean, sub, sq, var, add, sqrt, div]
    out, parts = div.output[0], {"x": x, "epsilon": eps}
    for op, key in (("Mul", "gamma"), ("Add", "beta")):
        nxt = g.only_user(out, op)
        other = None if nxt is None else g.other_input(nxt, out)
        if nxt is None or other is None or other not in g.consts or \
                (g.consts[other].ndim and g.consts[other].shape[-1] != g.consts[other].size):
            continue
        nodes.append(nxt)
        parts[key], out = g.consts[other].reshape(-1), nxt.output[0]
    parts["out"] = out
    return nodes, parts


_ELEMENTWISE: dict[str, Callable[..., Any]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power, "Sqrt": np.sqrt,
    "Erf": np.vectorize(math.erf), "Tanh": np.tanh}


def _region(g: _OnnxGraph, source: str, end: onnx.NodeProto, order: dict[int, int]) -> list[onnx.NodeProto] | None:
    """The nodes on the paths from tensor ``source`` to node ``end`` when they form a closed element-wise region:
    each reads ``source``, another region node's output or a one-element constant, and only ``end``'s output leaves
    it."""
    forward: set[int] = set()
    todo = [source]
    for _ in range(10):                                  # nodes up to 10 steps after the source
        users = [u for t in todo for u in g.consumers.get(t, []) if id(u) not in forward]
        forward.update(id(u) for u in users)
        todo = [out for u in users for out in u.output]
    region: dict[int, onnx.NodeProto] = {}
    todo_nodes = [end]
    while todo_nodes:
        node = todo_nodes.pop()
        if id(node) not in forward or id(node) in region:
            continue
        region[id(node)] = node
        todo_nodes.extend(g.producer[t] for t in node.input if t in g.producer)
    if id(end) not in region:
        return None
    inside = {out for node in region.values() for out in node.output}
    for node in region.values():
        if node.op_type not in _ELEMENTWISE:
            return None
        for t in node.input:
            if t != source and t not in inside and not (t in g.consts and g.consts[t].size == 1):
                return None
        for out in node.output:
            if node is not end and (out in g.outputs or any(id(u) not in region for u in g.consumers.get(out, []))):
                return None
    return sorted(region.values(), key=lambda n: order[id(n)])


def _gelu_kind(g: _OnnxGraph, source: str, nodes: list[onnx.NodeProto]) -> str | None:
    """``"none"`` or ``"tanh"`` when the element-wise ``nodes`` compute ONNX's Gelu of ``source`` (checked on 81
    values in [-6, 6]), else None."""
    x = np.linspace(-6.0, 6.0, 81)
    values = {source: x}
    with np.errstate(all="ignore"):
        for node in nodes:
            args = [values[t] if t in values else g.consts[t].astype(np.float64).reshape(()) for t in node.input]
            values[node.output[0]] = _ELEMENTWISE[node.op_type](*args)
    got = values[nodes[-1].output[0]]
    for kind in ("none", "tanh"):
        want = float_ref.ACTIVATIONS["Gelu"](x, {"approximate": kind})
        if np.all(np.isfinite(got)) and np.abs(got - want).max() < 1e-4:
            return kind
    return None


def _match_gelu(g: _OnnxGraph, core: onnx.NodeProto, order: dict[int, int]
                ) -> tuple[list[onnx.NodeProto], str, str] | None:
    """The element-wise region around an Erf or Tanh node that computes Gelu: (its nodes, source, approximate)."""
    sources: list[str] = []
    frontier = [core]
    for _ in range(5):                                  # the source: up to 5 steps before the core
        frontier = [g.producer[t] for n in frontier for t in n.input if t in g.producer]
        sources.extend(t for n in frontier for t in n.input if t not in g.consts and t not in sources)
    sources = [t for t in core.input] + sources
    ends, frontier = [core], [core]
    for _ in range(4):                                  # the end: up to 4 steps after it
        frontier = [u for n in frontier for u in g.consumers.get(n.output[0], [])]
        ends.extend(frontier)
    for end in reversed(ends):
        for source in sources:
            nodes = _region(g, source, end, order)
            kind = None if nodes is None or len(nodes) < 4 else _gelu_kind(g, source, nodes)
            if nodes is not None and kind is not None:
                return nodes, source, kind
    return None


def _match_swish(g: _OnnxGraph, sigmoid: onnx.NodeProto) -> tuple[list[onnx.NodeProto], str, float] | None:
    """``x * Sigmoid(x)`` or ``x * Sigmoid(x * alpha)`` (SiLU, QuickGelu; either operand order): (its nodes, x,
    alpha)."""
    inner, alpha, nodes = sigmoid.input[0], 1.0, [sigmoid]
    scale = g.producer.get(inner)
    if scale is not None and scale.op_type == "Mul" and g.consumers.get(inner) == [sigmoid] and \
            inner not in g.outputs:
        x = next((t for t in scale.input if t not in g.consts), None)
        value = None if x is None else g.scalar(scale, x)
        if value is not None:
            inner, alpha, nodes = x, value, [scale, sigmoid]
    mul = g.only_user(sigmoid.output[0], "Mul")
    if mul is None or sorted(mul.input) != sorted([inner, sigmoid.output[0]]):
        return None
    return [*nodes, mul], inner, alpha


def _fuse_decompositions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace the LayerNorm and Gelu decompositions exporters emit (ReduceMean/Sub/Pow/Sqrt/Div; the Erf and Tanh
    forms of Gelu) by one LayerNormalization or Gelu node writing the decomposition's output, so each imports as
    one operator. Shapes are already inferred; the fused nodes keep the output names."""
    g = _OnnxGraph(model)
    shapes = contrib.static_shapes(model)
    order = {id(n): k for k, n in enumerate(model.graph.node)}
    removed: set[int] = set()
    replacement: dict[int, onnx.NodeProto] = {}
    for node in model.graph.node:
        if id(node) in removed:
            continue
        if node.op_type == "ReduceMean" and node.input[0] in shapes:
            found = _match_layer_norm(g, node, len(shapes[node.input[0]]))
            if found is None:
                found_rms = rmsnorm.match_rms_norm(g, node, shapes)
                if found_rms is None:
                    continue
                nodes, parts = found_rms
                name = f"{parts['out']}_rms_weight"
                model.graph.initializer.append(numpy_helper.from_array(parts["weight"].astype(np.float32), name))
                fused = onnx.helper.make_node(rmsnorm.FUSED_OP, [parts["x"], name], [parts["out"]],
                                              name=nodes[-1].name or f"{parts['out']}_rmsnorm", axis=-1,
                                              epsilon=parts["epsilon"])
                removed.update(id(n) for n in nodes)
                replacement[id(nodes[-1])] = fused
                continue
            nodes, parts = found
            width = shapes[parts["x"]][-1]
            names = []
            for key, default in (("gamma", 1.0), ("beta", 0.0)):
                name = f"{parts['out']}_ln_{key}"
                value = np.broadcast_to(parts.get(key, np.float32(default)), (width,)).astype(np.float32)
                model.graph.initializer.append(numpy_helper.from_array(value, name))
                names.append(name)
            fused = onnx.helper.make_node("LayerNormalization", [parts["x"], *names], [parts["out"]],
                                          name=f"{parts['out']}_layernorm", axis=-1, epsilon=parts["epsilon"])
        elif node.op_type in ("Erf", "Tanh"):
            found_gelu = _match_gelu(g, node, order)
            if found_gelu is None:
                continue
            nodes, source, kind = found_gelu
            fused = onnx.helper.make_node("Gelu", [source], [nodes[-1].output[0]],
                                          name=nodes[-1].name or f"{nodes[-1].output[0]}_gelu", approximate=kind)
        elif node.op_type == "Sigmoid":
            found_swish = _match_swish(g, node)
            if found_swish is None:
                continue
            nodes, source, alpha = found_swish
            fused = onnx.helper.make_node("Swish", [source], [nodes[-1].output[0]],
                                          name=nodes[-1].name or f"{nodes[-1].output[0]}_swish", alpha=alpha)
        else:
            continue
        removed.update(id(n) for n in nodes)
        replacement[id(nodes[-1])] = fused
    if not replacement:
        return model
    kept = [replacement.get(id(n), n) for n in model.graph.node if id(n) not in removed or id(n) in replacement]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


def _fold_constants(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace every node whose inputs are all constants (the shape arithmetic exporters emit, Constant nodes, and
    Shape of a tensor whose shape inference already fixed) by initializers, evaluated with ONNX's reference
    evaluator, so shape inference sees constant pads and shapes."""
    from onnx.reference import ReferenceEvaluator
    consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    shapes = contrib.static_shapes(model)
    graph_outputs = {o.name for o in model.graph.output}
    kept = []
    for node in model.graph.node:
        inputs = [t for t in node.input if t]
        if node.op_type == "Shape" and inputs[0] in shapes and not graph_outputs.intersection(node.output):
            a = _attrs(node)
            dims = shapes[inputs[0]]
            consts[node.output[0]] = np.array(dims[a.get("start", 0):a.get("end", len(dims))], np.int64)
            continue
        foldable = node.domain in ("", "ai.onnx") and all(t in consts for t in inputs) and \
            (inputs or node.op_type == "Constant") and not graph_outputs.intersection(node.output)
        if not foldable:
            kept.append(node)
            continue
        try:
            results = ReferenceEvaluator(node).run(None, {t: consts[t] for t in inputs})
        except Exception as err:  # an op the reference evaluator lacks
            if node.op_type in RULES:
                kept.append(node)
                continue
            raise UnsupportedOperatorError(node.op_type, node.name or "<unnamed>",
                                           f"constant folding failed ({err})") from err
        for name, value in zip(node.output, results):
            consts[name] = np.asarray(value)
    if len(kept) == len(model.graph.node):
        return model
    initial = {init.name for init in model.graph.initializer}
    used = {t for node in kept for t in node.input}
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items()
                                   if k not in initial and k in used)
    return model


def _read_model(path: str) -> onnx.ModelProto:
    """The ModelProto in the file ``path``, or :class:`ModelFileError` saying in one sentence why there is none."""
    what = "an ONNX model file (.onnx)"
    if os.path.isdir(path):
        raise ModelFileError(f"The model {path} is a folder, not {what}.")
    try:
        size = os.path.getsize(path)
    except OSError as err:
        raise ModelFileError(f"Cannot read the model {path}: {err.strerror}.") from None
    if size == 0:
        raise ModelFileError(f"The model {path} is empty (0 bytes), not {what}.")
    try:
        proto = onnx.load(path)
    except OSError as err:
        raise ModelFileError(f"Cannot read the model {path}: {err.strerror}.") from None
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and whatever a damaged file makes onnx raise
        raise ModelFileError(f"The model {path} is not {what}, or it is truncated: its {size} bytes do not decode as "
                             f"an ONNX protobuf ({err}).") from None
    if not proto.HasField("graph") or not proto.graph.node or not proto.graph.output:
        raise ModelFileError(f"The model {path} holds no ONNX graph with nodes and outputs; it is not {what}, or it "
                             f"is truncated.")
    return proto


def _check_opset(model: onnx.ModelProto, label: str) -> None:
    """Raise :class:`UnsupportedOpsetError` unless the default-domain opset is within :data:`SUPPORTED_OPSETS`."""
    lo, hi = SUPPORTED_OPSETS
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise UnsupportedOpsetError(f"The model {label} imports no ai.onnx opset; the frontend supports opsets {lo} "
                                    f"to {hi}.")
    if not lo <= versions[0] <= hi:
        raise UnsupportedOpsetError(f"The model {label} uses ONNX opset {versions[0]}; the frontend supports opsets "
                                    f"{lo} to {hi} (convert it, e.g. with onnx.version_converter.convert_version).")


def tensor_byte_limit() -> int:
    """The most bytes one tensor of a model may take: a quarter of the machine's physical memory (``os.sysconf``;
    8 GiB when the system does not say). A quarter, because running a model holds a node's inputs and outputs at once,
    calibration keeps float64 temporaries of a tensor, and the integer reference keeps every tensor of the graph."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        total = 32 << 30
    return max(total, 1 << 20) // 4


def _size_text(nbytes: int) -> str:
    for unit, factor in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f} {unit}"
    return f"{nbytes} bytes"


def _check_sizes(model: onnx.ModelProto, label: str, limit: int) -> None:
    """Raise :class:`TensorTooLargeError` naming the first tensor (inputs first, then in graph order) whose static
    shape would take more than ``limit`` bytes as float32 (the float reference's type) or its own wider type."""
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        dims = [d.dim_value for d in tt.shape.dim]
        if not tt.HasField("shape") or not all(d > 0 for d in dims):
            continue
        try:
            width = max(4, onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).itemsize)
        except (KeyError, TypeError, ValueError):
            width = 4
        nbytes = int(np.prod(dims, dtype=object)) * width
        if nbytes > limit:
            raise TensorTooLargeError(
                f"The model {label} has tensor {vi.name!r} of shape {'x'.join(map(str, dims))}, which would take "
                f"{_size_text(nbytes)}; the lab allows {_size_text(limit)} per tensor on this machine (a quarter of "
                f"its memory); give a smaller batch or input shape.")


def _dim_text(dim: Any) -> str:
    return str(dim.dim_value) if dim.HasField("dim_value") else (dim.dim_param or "?")


def _fix_inputs(model: onnx.ModelProto, batch: int, input_shapes: dict[str, tuple[int, ...]], label: str) -> None:
    """Give every graph input a static shape: ``input_shapes[name]`` where given (it must agree with the model's
    rank and fixed dimensions), else a symbolic or unknown first (batch) dimension becomes ``batch``; any other
    symbolic or unknown dimension raises ValueError naming it and the ``--input-shape`` that would fix it."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    unknown = sorted(set(input_shapes) - {vi.name for vi in inputs})
    if unknown:
        verb = "is" if len(unknown) == 1 else "are"
        names = ", ".join(repr(vi.name) for vi in inputs)
        raise ValueError(f"--input-shape names {', '.join(map(repr, unknown))}, which {verb} not an input of the model "
                         f"{label}; its inputs are {names}.")
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        text = "x".join(_dim_text(d) for d in dims)
        given = input_shapes.get(vi.name)
        if given is not None:
            fixed = [(k, d.dim_value) for k, d in enumerate(dims) if d.HasField("dim_value") and d.dim_value > 0]
            if len(given) != len(dims) or any(given[k] != v for k, v in fixed):
                raise ValueError(f"--input-shape {vi.name}={'x'.join(map(str, given))} does not fit the model "
                                 f"{label}, whose input {vi.name!r} has shape {text}; give {len(dims)} dimensions "
                                 f"that keep the fixed ones.")
            values = list(given)
        else:
            free = [k for k, d in enumerate(dims) if k > 0 and not (d.HasField("dim_value") and d.dim_value > 0)]
            if free:
                names = ", ".join(_dim_text(dims[k]) for k in free)
                example = "x".join(str(batch) if k == 0 else "224" if k in free else _dim_text(d)
                                   for k, d in enumerate(dims))
                raise ValueError(f"The model {label} has input {vi.name!r} of shape {text}, with symbolic or unknown "
                                 f"dimensions ({names}) besides the batch; give its whole shape, e.g. --input-shape "
                                 f"{vi.name}={example}.")
            values = [batch if k == 0 and not (d.HasField("dim_value") and d.dim_value > 0) else d.dim_value
                      for k, d in enumerate(dims)]
        for d, v in zip(dims, values):
            d.Clear()
            d.dim_value = v


def _apply_rules(imp: _Importer, model: onnx.ModelProto, label: str, refused: dict[str, str]) -> None:
    """Import every node by its rule; raise one error naming every node no rule takes (after a refused node, its
    outputs stand in with their inferred shapes so that the later nodes are checked too). A node of another domain
    is named ``<domain>.<op>``, with the reason :func:`.contrib.rewrite_contrib` gave in ``refused`` (by its first
    output)."""
    problems: list[UnsupportedOperatorError] = []
    for node in model.graph.node:
        rule = RULES.get(node.op_type)
        try:
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedOperatorError(f"{node.domain}.{node.op_type}", node.name,
                                               refused.get(node.output[0], "an operator of another domain"))
            if rule is None:                             # onnxruntime's own default-domain ops: the rewrite's reason
                raise UnsupportedOperatorError(node.op_type, node.name, refused.get(node.output[0], ""))
            rule(imp, node)
        except UnsupportedOperatorError as err:
            if not node.name:                            # name an unnamed node by its output
                err = UnsupportedOperatorError(err.op_type, f"<unnamed, writes {node.output[0]}>", err.detail)
            problems.append(err)
        except GraphError:
            if not problems:
                raise
        else:
            continue
        for out in node.output:                          # stand-ins: the later rules read their shapes
            if out and out in imp.shapes and out not in imp.graph.tensors:
                imp.graph.add_tensor(out, imp.shapes[out], "float32")
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise UnsupportedModelError(label, problems)


def _replace_mask_regions(model: onnx.ModelProto, key_masks: list[masks.KeyMask], region: set[int]) -> None:
    """Drop the nodes of runtime mask regions (``region``: their indices in the graph) and make each exit a
    ``KeyMask`` node of the scores and the mask input (:func:`.masks.find_key_masks`), in place."""
    if not key_masks:
        return
    exits = {m.out: m for m in key_masks}
    kept = []
    for index, node in enumerate(model.graph.node):
        if index in region:
            continue
        if node.output and node.output[0] in exits:
            mask = exits[node.output[0]]
            node = onnx.helper.make_node("KeyMask", [mask.x, mask.mask], [mask.out], name=node.name)
        kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)


def _indexes_a_table(model: onnx.ModelProto, name: str) -> bool:
    """Whether the graph input ``name`` is token ids: some use of it is as the indices of a Gather from an
    initializer table ``[rows, width]`` (a lookup in a 1-D table is a mask's, :mod:`.masks`; its other uses must be
    index arithmetic, :mod:`.indices`)."""
    tables = {i.name for i in model.graph.initializer if len(i.dims) == 2}
    return any(node.op_type == "Gather" and node.input[1:2] == [name] and node.input[0] in tables
               for node in model.graph.node)


def _replace_index_regions(model: onnx.ModelProto, regions: list[indices.IndexRegion], drop: set[int]) -> None:
    """Drop the index regions' nodes (``drop``: their indices in the graph) and compute each region's result with
    one ``IndexFn`` node at the graph's start (it reads a graph input only), in place."""
    if not regions:
        return
    kept = [onnx.helper.make_node("IndexFn", [r.ids], [r.out], name=f"{r.out}_indices") for r in regions]
    kept += [node for index, node in enumerate(model.graph.node) if index not in drop]
    del model.graph.node[:]
    model.graph.node.extend(kept)


def import_onnx(model: str | os.PathLike | onnx.ModelProto, *, batch: int = 1, name: str | None = None,
                input_shapes: dict[str, tuple[int, ...]] | None = None, max_tensor_bytes: int | None = None) -> Graph:
    """Import an ONNX model (path or ModelProto) as a validated float :class:`~.ir.Graph`.

    A dynamic first (batch) input dimension becomes ``batch``; ``input_shapes`` (input name -> whole shape) fixes
    inputs with other dynamic dimensions, which are an error otherwise. Raises :class:`ModelFileError` for a file
    that is not an ONNX model, :class:`UnsupportedOpsetError` for an opset outside :data:`SUPPORTED_OPSETS` and
    :class:`UnsupportedOperatorError` for an operator outside :data:`RULES` (naming the op type and node; one
    :class:`UnsupportedModelError` listing them all when several nodes are refused) and :class:`TensorTooLargeError`
    for a tensor of more than ``max_tensor_bytes`` (default :func:`tensor_byte_limit`), before allocating anything.
    """
    if isinstance(model, (str, os.PathLike)):
        label = name or os.path.splitext(os.path.basename(os.fspath(model)))[0]
        where = os.fspath(model)
        proto = _read_model(where)
    elif isinstance(model, onnx.ModelProto):
        label = name or model.graph.name or "model"
        where = label
        proto = onnx.ModelProto.FromString(model.SerializeToString())
    else:
        raise TypeError(f"import_onnx takes a path or an onnx.ModelProto, not {type(model).__name__}.")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer (images per inference), not {batch!r}.")
    _check_opset(proto, where)
    _fix_inputs(proto, batch, dict(input_shapes or {}), where)
    refused = contrib.rewrite_contrib(proto)            # onnxruntime's com.microsoft operators, as standard nodes
    limit = tensor_byte_limit() if max_tensor_bytes is None else max_tensor_bytes
    _check_sizes(proto, where, limit)
    model = shape_inference.infer_shapes(_fold_constants(proto))
    for _ in range(4):                                  # Shape nodes fold once their inputs have static shapes
        if not any(n.op_type == "Shape" for n in model.graph.node):
            break
        model = shape_inference.infer_shapes(_fold_constants(model))
    _check_sizes(model, where, limit)
    model = _fuse_decompositions(model)
    masks.direct_token_ids(model, contrib.static_shapes(model))
    masks.drop_nan_guards(model)
    init_names = {i.name for i in model.graph.initializer}
    token_ids = {vi.name for vi in model.graph.input if vi.name not in init_names
                 and vi.type.tensor_type.elem_type == onnx.TensorProto.INT64 and _indexes_a_table(model, vi.name)}
    index_regions, index_nodes = indices.find_index_regions(model, token_ids, contrib.static_shapes(model))
    _replace_index_regions(model, index_regions, index_nodes)
    key_masks, region, mask_types = masks.find_key_masks(model, token_ids)
    float_masks, float_region = masks.find_float_masks(model, contrib.static_shapes(model))
    key_masks, region = key_masks + float_masks, region | float_region
    _replace_mask_regions(model, key_masks, region)
    imp = _Importer(model, label)
    imp.key_masks = {m.out: m for m in key_masks}
    imp.index_fns = {r.out: r for r in index_regions}
    g = imp.graph
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        integer = vi.name in mask_types or vi.name in token_ids
        if not integer and _DTYPES.get(vi.type.tensor_type.elem_type) != "float32":
            kind = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
            raise GraphError(f"Graph input {vi.name!r} has ONNX element type {kind}; only float32 inputs, int64 "
                             f"token ids that only index a constant embedding table (Gather), and attention masks "
                             f"of 0 and 1 (int64, int32, int8, uint8 or bool) that reach the attention scores "
                             f"through an Add or a Where are supported.")
        g.add_tensor(vi.name, imp.shapes_of(vi.name), "int64" if integer else "float32")
        g.inputs.append(vi.name)
    _apply_rules(imp, model, where, refused)
    constant = [o.name for o in model.graph.output if imp.name(o.name) in imp.consts]
    if constant:
        raise GraphError(f"The model {where} has graph output(s) {', '.join(map(repr, constant))} that are constants "
                         f"(an initializer or a Constant node): it computes nothing for them, and the lab compiles "
                         f"computations only.")
    g.outputs = [imp.name(o.name) for o in model.graph.output]
    for out in model.graph.output:
        target = imp.name(out.name)
        if target != out.name and target not in g.inputs and g.outputs.count(target) == 1:
            g.rename_tensor(target, out.name)          # keep the ONNX output names for aliased outputs
    g.prune_constants()
    g.validate()
    return g
