"""The ONNX importer's shared parts: its errors, the :class:`_Importer` state the rules build the graph with, and
attribute decoding (:mod:`.onnx_frontend` imports a model with them)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir import Graph, GraphError, Node
from . import indices, masks, numeric_inputs

PUBLIC_OPS: list[str] = []
"""The ONNX operators the rules import, sorted: filled by :mod:`.onnx_transformer_rules` from its ``RULES`` table
(without ``KeyMask`` and ``IndexFn``, the lab's own stand-ins for a runtime mask's exit, :mod:`.masks`, and indices
computed from token ids, :mod:`.indices`, and ``RMSNormalization``, which stands in for RMSNorm's decomposition: the
operator itself arrives in opset 23, beyond :data:`.onnx_frontend.SUPPORTED_OPSETS`). The errors below name them."""


def _public_ops() -> list[str]:
    return PUBLIC_OPS


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


class EmptyTensorError(GraphError):
    """A tensor of no elements that a layer would compute on (the message names it and its shape)."""


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
            if 0 in init.dims:                   # an empty constant (an input of no elements) a node still reads
                self.empty.setdefault(init.name, tuple(init.dims))
        self.uses: dict[str, int] = {}
        self.producers: dict[str, onnx.NodeProto] = {}    # ONNX tensor -> the node of the file writing it
        for node in model.graph.node:
            for tensor in node.input:
                self.uses[tensor] = self.uses.get(tensor, 0) + 1
            self.producers.update((out, node) for out in node.output if out)
        self.graph_outputs = {o.name for o in model.graph.output}
        self.token_linear: dict[str, Node] = {}          # output of a MatMul over tokens -> its Conv2d
        self.key_masks: dict[str, masks.KeyMask] = {}     # output of a runtime mask's exit -> how it masks
        self.index_fns: dict[str, indices.IndexRegion] = {}  # indices computed from token ids -> how
        self.mask_pools: set[str] = set()                # outputs of the MaskPool nodes pooling.find_mask_pools wrote
        self.pointwise_fns: dict[str, str] = {}          # output of a fused element-wise region -> its ONNX model
        self.numeric_fns: dict[str, numeric_inputs.NumericRegion] = {}  # exit of a numeric input's region -> how
        self.routing: set[str] = set()                   # outputs of the TopKOneHot/SumNormalize nodes moe.py wrote
        self.sinks: dict[str, np.ndarray | str] = {}     # Softmax node name -> its sink logits, or their tensor
        self.opened: dict[str, str] = {}                 # input -> the sizes the file leaves open, as set here

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

    def open_sizes_hint(self) -> str:
        """A sentence for a shape that does not fit: the input sizes the file leaves open and this import set, which
        an exporter that traced the model at other sizes may have fixed inside it; "" when the file fixes them."""
        if not self.opened:
            return ""
        sizes = "; ".join(f"{name}: {dims}" for name, dims in self.opened.items())
        return (f" The file leaves sizes of its inputs open and this import set them ({sizes}); an exporter that "
                f"traced the model at other sizes can fix them inside it (a Reshape's constant shape): give the sizes "
                f"it was exported at with --input-shape (or --input arrays of those shapes).")

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
            raise EmptyTensorError(f"Tensor {tensor!r} has shape {'x'.join(map(str, self.empty[tensor]))}, with a "
                                   f"dimension of size 0: the lab does not compute empty tensors.")
        if tensor not in self.shapes:
            writer = next((n for n in self.model.graph.node if tensor in n.output), None)
            by = f" (written by {writer.op_type} node {writer.name or '<unnamed>'!r})" if writer is not None else ""
            raise GraphError(f"Shape inference found no static shape for tensor {tensor!r}{by}, although every input "
                             f"of the model has a static shape now: a node before it computes a shape at run time "
                             f"or does not fit its inputs' shapes (a bad axis, perm or shape constant)."
                             + self.open_sizes_hint())
        return self.shapes[tensor]


def tensor_namer(model: onnx.ModelProto) -> Callable[[str], str]:
    """A namer of tensors new to ``model`` (for a rewrite's constants and intermediate results): ``name(base)`` is
    ``base``, else ``base_2``, ``base_3``... the first that no tensor of the model (input, output, initializer,
    value_info, a node's input or output) and no earlier call has. A rewrite that wrote ``<node>_onehot`` without
    asking replaced a tensor of that name the file already had, silently."""
    graph = model.graph
    taken = {vi.name for vi in [*graph.input, *graph.output, *graph.value_info]} | \
        {init.name for init in graph.initializer} | {t for node in graph.node for t in [*node.input, *node.output]}

    def name(base: str) -> str:
        out, k = base, 1
        while out in taken:
            k += 1
            out = f"{base}_{k}"
        taken.add(out)
        return out

    return name


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _decode(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def same_pads(auto: str, sizes: Any, kernel: Any, strides: Any) -> list[tuple[int, int]]:
    """(begin, end) pads of each spatial axis for ``auto_pad`` ``SAME_UPPER`` or ``SAME_LOWER``: the output holds
    ``ceil(size / stride)`` positions, the total pad split in half with the odd one at the end (upper) or the
    beginning (lower). ``kernel``: each axis's window as it spans the input (``(k - 1) * dilation + 1``)."""
    pads = []
    for size, k, s in zip(sizes, kernel, strides):
        total = max(0, (-(-size // s) - 1) * s + k - size)
        small, big = total // 2, total - total // 2
        pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return pads
