"""Checks that a file is a valid ONNX graph before the frontend reads it, so that a malformed file gets one error
naming every problem instead of a traceback from deep in the import (:func:`.onnx_frontend.import_onnx` and
:func:`.prequant.import_model` call them):

- :func:`check_graph`: text fields that decode, a known IR version, initializers whose data fills their dims, and
  every tensor a node reads written by some node outside a cycle (or an input or initializer);
- :func:`check_nodes`: each default-domain node against its operator's schema at the model's opset (input and output
  counts, required inputs, outputs and attributes, attribute types, positive strides, dilations and kernel sizes,
  pads of 0 or more, and the types of the inputs known before any inference: initializers and graph inputs);
- :func:`check_axes`: an ``axis`` attribute within its input's rank, once shape inference knows the rank;
- :func:`folded_elements`: how large a constant the folding would make, so a huge one is left for the size check;
- ``_check_sizes`` and ``_check_shape_constants``: a tensor, or a constant shape input, of more bytes than the
  per-tensor limit, before anything allocates it.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

from .onnx_common import ModelFileError, TensorTooLargeError

__all__ = ["axis_problem", "check_axes", "check_broadcasts", "check_graph", "check_nodes", "folded_elements",
           "index_problem", "node_text"]


def node_text(node: onnx.NodeProto, index: int) -> str:
    """``node 'NAME'``, or for an unnamed node ``node #INDEX`` and the first tensor it writes."""
    if node.name:
        return f"node {node.name!r}"
    return f"node #{index}" + (f" (writes {node.output[0]!r})" if node.output and node.output[0] else "")


def check_graph(model: onnx.ModelProto, label: str) -> None:
    """Raise :class:`ModelFileError` when ``model`` is not a graph onnxruntime would load either: a text field that
    is not UTF-8 (a damaged file), an IR version newer than the installed ``onnx`` knows, an initializer whose data
    does not fill its dims, or a node that reads a tensor no node writes (or only a node in a cycle through it)."""
    try:
        bad = _undecodable(model)
    except UnicodeDecodeError as err:
        bad = err.object[:60] if isinstance(err.object, bytes) else b"?"
    if bad is not None:
        raise ModelFileError(f"The model {label} is damaged: a name or text field is not UTF-8 ({bad!r}).")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelFileError(f"The model {label} has IR version {model.ir_version}; the installed onnx package reads "
                             f"up to {onnx.IR_VERSION}.")
    problems = [p for init in model.graph.initializer if (p := _data_problem(init))]
    given = {vi.name for vi in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    nodes = list(model.graph.node)
    needs = [len({t for t in n.input if t not in given}) for n in nodes]
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for t in {t for t in n.input if t not in given}:
            readers.setdefault(t, []).append(k)
    ready = [k for k, need in enumerate(needs) if need == 0]
    while ready:                                  # Kahn's order, whatever the file's: what never becomes ready
        for t in nodes[ready.pop()].output:
            if t in given:
                continue
            given.add(t)
            for k in readers.get(t, ()):
                needs[k] -= 1
                if needs[k] == 0:
                    ready.append(k)
    for k in [k for k, need in enumerate(needs) if need][:10]:
        missing = [t for t in nodes[k].input if t not in given]
        problems.append(f"{node_text(nodes[k], k)} ({nodes[k].op_type}) reads {', '.join(map(repr, missing))}, "
                        f"which no node writes outside a cycle and which is no input or initializer")
    if problems:
        raise ModelFileError(f"The model {label} is not a valid ONNX graph: {'; '.join(problems[:20])}.")


def _undecodable(message: object) -> bytes | None:
    """The first text field of a protobuf ``message`` (not a tensor's data) that is not UTF-8, as the bytes the
    protobuf runtime hands back for it, or None. (Some runtimes raise UnicodeDecodeError instead.) A tensor's name
    alone is read: listing its fields would copy its data."""
    if isinstance(message, onnx.TensorProto):
        return message.name if isinstance(message.name, bytes) else None
    for field, value in message.ListFields():                      # type: ignore[attr-defined]
        if field.type not in (field.TYPE_MESSAGE, field.TYPE_STRING) or field.name == "raw_data":
            continue
        items = [value] if hasattr(value, "ListFields") or isinstance(value, (str, bytes)) else value
        for item in items:
            if field.type == field.TYPE_MESSAGE:
                found = _undecodable(item)
                if found is not None:
                    return found
            elif field.type == field.TYPE_STRING and isinstance(item, bytes):
                return item
    return None


def _data_problem(init: onnx.TensorProto) -> str | None:
    """Why initializer ``init``'s data does not fill its dims, or None (external data is not checked here)."""
    if init.data_location == onnx.TensorProto.EXTERNAL:
        return None
    count = math.prod(init.dims)
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return f"initializer {init.name!r} has data type {init.data_type}, which ONNX does not define"
    if init.HasField("raw_data"):
        got, want = len(init.raw_data), count * itemsize
        if init.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            want = (count + 1) // 2
        unit = "bytes"
    else:
        try:
            got = len(getattr(init, onnx.helper.tensor_dtype_to_field(init.data_type)))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        want, unit = count, "values"
        if init.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128):
            want = 2 * count
        if got == 0 and count == 0:
            return None
        if init.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1):
            return None
    if got != want:
        shape = "x".join(map(str, init.dims)) or "a scalar"
        return f"initializer {init.name!r} of shape {shape} holds {got} {unit} of data where it needs {want}"
    return None


_ORT_SAME_NAME = frozenset({"Attention", "CausalConvWithState", "DequantizeLinear", "GatherND", "Gelu", "GridSample",
                            "LinearAttention", "Pad", "QLinearConv", "QuantizeLinear", "Range", "RotaryEmbedding",
                            "SwiGLU", "Trilu", "Unique"})
"""The operators onnxruntime defines in its contrib domain ``com.microsoft`` under the name of an ONNX operator
(onnxruntime 1.2x's ``get_all_operator_schema``). Any other ONNX operator name in that domain is no operator at all,
which onnxruntime refuses, and which the quantized paths would otherwise read as ONNX's operator of that name."""


def _qdq_problems(node: onnx.NodeProto, index: int, types: dict[str, int],
                  dims: dict[str, tuple[int, ...]]) -> list[str]:
    """What is wrong with a QuantizeLinear or DequantizeLinear ``node`` whose scale and zero point are initializers
    (``types``, ``dims``: the initializers' element types and dims): a zero point with another number of elements
    than the scale (a per-tensor scale of shape [] or [1] takes a zero point of either shape; per-axis and blocked
    ones one of the scale's shape), or a DequantizeLinear whose input and zero point differ in type."""
    what = f"{node_text(node, index)} ({node.op_type})"
    problems = []
    scale, zero = (node.input[k] if len(node.input) > k else "" for k in (1, 2))
    if scale in dims and zero in dims:
        if math.prod(dims[scale]) != math.prod(dims[zero]) or \
                (math.prod(dims[scale]) > 1 and dims[scale] != dims[zero]):
            problems.append(f"{what} has a scale of shape {list(dims[scale])} and a zero point of shape "
                            f"{list(dims[zero])}; they must have the same shape")
    if node.op_type == "DequantizeLinear" and node.input and node.input[0] in types and zero in types and \
            types[node.input[0]] != types[zero]:
        kinds = [onnx.helper.tensor_dtype_to_string(types[t])[len("TensorProto."):].lower()
                 for t in (node.input[0], zero)]
        problems.append(f"{what} dequantizes {node.input[0]!r} of type {kinds[0]} with a zero point of type "
                        f"{kinds[1]}; they must have the same type")
    return problems


def check_nodes(model: onnx.ModelProto, label: str) -> None:
    """Raise :class:`ModelFileError` listing every node of the default domain whose inputs, outputs or attributes do
    not fit its operator's schema at the model's opset: too few or too many inputs or outputs, a required input or
    output left empty, a required attribute missing, an attribute of the wrong type. Operators ONNX does not define
    at that opset are left to the rules (which refuse them by name, or take onnxruntime's default-domain ones)."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    problems: list[str] = []
    known = {i.name: i.data_type for i in model.graph.initializer}          # types known before any inference
    dims = {i.name: tuple(i.dims) for i in model.graph.initializer}
    known.update({vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input
                  if vi.type.HasField("tensor_type") and vi.name not in known})
    for k, node in enumerate(model.graph.node):
        if node.domain == "com.microsoft" and onnx.defs.has(node.op_type) and node.op_type not in _ORT_SAME_NAME:
            problems.append(f"{node_text(node, k)} is a {node.op_type} of domain com.microsoft, which has no "
                            f"{node.op_type} (onnxruntime's contrib domain; ONNX's own is the default domain '')")
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.domain in ("", "ai.onnx", "com.microsoft"):
            problems += _qdq_problems(node, k, known, dims)
        if node.domain not in ("", "ai.onnx") or not onnx.defs.has(node.op_type):
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset)
        except onnx.defs.SchemaError:
            continue
        what = f"{node_text(node, k)} ({node.op_type})"
        for kind, names, lo, hi, params in (("input", node.input, schema.min_input, schema.max_input, schema.inputs),
                                            ("output", node.output, schema.min_output, schema.max_output,
                                             schema.outputs)):
            count = len(names)
            while count and not names[count - 1]:
                count -= 1                                  # trailing empty names: omitted optional ones
            if not lo <= count <= hi:
                span = f"{lo}" if lo == hi else f"{lo} to {hi if hi < 2**31 - 1 else 'any number of'}"
                problems.append(f"{what} has {count} {kind}(s); {node.op_type} takes {span} at opset {opset}")
                continue
            for i, param in enumerate(params[:count]):
                single = param.option == onnx.defs.OpSchema.FormalParameterOption.Single
                if single and not names[i]:
                    problems.append(f"{what} leaves its required {kind} {i} ({param.name}) empty")
            if kind == "output":
                continue
            allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
            for i, name in enumerate(names[:count]):
                param = params[min(i, len(params) - 1)]
                types = allowed.get(param.type_str)
                if name in known and types and known[name]:
                    text = f"tensor({onnx.helper.tensor_dtype_to_string(known[name])[len('TensorProto.'):].lower()})"
                    if text not in types:
                        problems.append(f"{what} reads {name!r} of type {text} as its input {i} ({param.name}), "
                                        f"which takes {', '.join(sorted(types))}")
        weight = {"Conv": 1, "ConvTranspose": 1, "ConvInteger": 1, "QLinearConv": 3}.get(node.op_type)
        kernel = next((list(a.ints) for a in node.attribute if a.name == "kernel_shape"), None)
        if weight is not None and kernel and len(node.input) > weight and node.input[weight] in dims and \
                list(dims[node.input[weight]][2:]) != kernel:
            problems.append(f"{what} has kernel_shape {kernel}, but its weight {node.input[weight]!r} has shape "
                            f"{list(dims[node.input[weight]])}")
        for name, attr in schema.attributes.items():
            if attr.required and not any(a.name == name for a in node.attribute):
                problems.append(f"{what} lacks its required attribute {name!r}")
        if node.op_type == "Constant" and sum(a.name.startswith("value") or a.name == "sparse_value"
                                              for a in node.attribute) != 1:
            problems.append(f"{what} has {len(node.attribute)} value attributes; a Constant takes exactly one")
        for a in node.attribute:
            floats = [a.f] if a.type == onnx.AttributeProto.FLOAT else \
                list(a.floats) if a.type == onnx.AttributeProto.FLOATS else []
            if any(v != v for v in floats):
                problems.append(f"{what} has attribute {a.name!r} NaN")
            elif a.name == "epsilon" and floats and not 0 <= floats[0] < math.inf:
                problems.append(f"{what} has epsilon {floats[0]:g}; it must be 0 or more and finite")
            if a.name in ("strides", "dilations", "kernel_shape", "pads") and a.type == onnx.AttributeProto.INTS:
                low = 0 if a.name == "pads" else 1
                if any(v < low for v in a.ints):
                    problems.append(f"{what} has {a.name} {list(a.ints)}; each must be "
                                    f"{'0 or more' if low == 0 else 'positive'}")
            expected = schema.attributes.get(a.name)
            if expected is not None and a.type != expected.type:
                got = onnx.AttributeProto.AttributeType.Name(a.type)
                want = onnx.AttributeProto.AttributeType.Name(expected.type)
                problems.append(f"{what} has attribute {a.name!r} of type {got}; {node.op_type} takes {want}")
    if problems:
        shown = "; ".join(problems[:20]) + (f"; and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise ModelFileError(f"The model {label} is not a valid ONNX graph: {shown}.")


_AXIS_OPS = frozenset({"Concat", "Softmax", "LogSoftmax", "Hardmax", "Gather", "GatherElements", "Split",
                       "LayerNormalization", "ArgMax", "ArgMin", "Flatten"})
"""Operators whose ``axis`` attribute indexes their first input's dimensions (Flatten's may also equal the rank)."""


def axis_problem(node: onnx.NodeProto, index: int, rank: int | None) -> str | None:
    """What is wrong with the ``axis`` of ``node`` (a default-domain node of :data:`_AXIS_OPS`, ``index`` in its
    graph) for a first input of ``rank`` dimensions, or None (also when the rank is unknown)."""
    if node.op_type not in _AXIS_OPS or node.domain not in ("", "ai.onnx") or rank is None:
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis" and a.type == onnx.AttributeProto.INT), None)
    top = rank if node.op_type == "Flatten" else rank - 1
    if axis is None or -rank <= axis <= top:
        return None
    return f"{node_text(node, index)} ({node.op_type}) has axis {axis}, outside [-{rank}, {top}] for its rank-{rank} " \
        f"input {node.input[0]!r}"


def check_axes(model: onnx.ModelProto, label: str) -> None:
    """Raise :class:`ModelFileError` listing every node of :data:`_AXIS_OPS` whose ``axis`` lies outside its first
    input's rank (``[-r, r-1]``, Flatten ``[-r, r]``), where shape inference knows that rank."""
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim)
             for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]
             if vi.type.tensor_type.HasField("shape")}
    ranks.update({init.name: len(init.dims) for init in model.graph.initializer})
    problems = [p for k, node in enumerate(model.graph.node)
                if node.input and (p := axis_problem(node, k, ranks.get(node.input[0]))) is not None]
    if problems:
        raise ModelFileError(f"The model {label} is not a valid ONNX graph: {'; '.join(problems[:20])}.")


_BROADCAST_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "Where", "Equal",
                             "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift"})
"""Operators whose inputs broadcast against each other (numpy's rules); Expand's input broadcasts against the shape its
second input holds."""


def check_broadcasts(model: onnx.ModelProto, label: str) -> None:
    """Raise :class:`ModelFileError` naming the first node of :data:`_BROADCAST_OPS` whose inputs have static shapes
    that do not broadcast, after shape inference (which leaves such a node's output without a shape, so that the
    import would fail later, far from the cause). The common cause is an input longer than a table the model slices:
    a sequence past the model's learned positions."""
    shapes = {vi.name: tuple(d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim)
              for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]
              if vi.type.tensor_type.HasField("shape")}
    shapes.update({init.name: tuple(init.dims) for init in model.graph.initializer})
    consts = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer
              if init.data_type == onnx.TensorProto.INT64 and len(init.dims) == 1 and init.dims[0] <= 64}
    for k, node in enumerate(model.graph.node):
        if node.op_type not in _BROADCAST_OPS | {"Expand"} or node.domain not in ("", "ai.onnx"):
            continue
        found = [shapes.get(t) for t in node.input if t]
        if node.op_type == "Expand" and len(node.input) == 2:          # the second input's value is the shape
            value = consts.get(node.input[1])
            found[1:] = [tuple(int(v) for v in value.reshape(-1))] if value is not None and value.ndim == 1 else [None]
        known = [s for s in found if s is not None and -1 not in s]
        if len(known) < 2 or len(known) < len(found):
            continue
        try:
            np.broadcast_shapes(*known)
        except ValueError:
            text = " and ".join("x".join(map(str, s)) if s else "a scalar" for s in known)
            raise ModelFileError(
                f"The model {label} cannot run at these input shapes: {node_text(node, k)} ({node.op_type}) reads "
                f"shapes {text}, which do not broadcast. An input longer than a table the model slices gives this "
                f"(a sequence past the model's learned positions): check the --input-shape and --input sizes against "
                f"the model's limits.") from None


def index_problem(node: onnx.NodeProto, index: int, consts: dict[str, np.ndarray]) -> str | None:
    """What is wrong with a Gather of constants (``node``, ``index`` in its graph) that reads past its table: the
    index and the table's length on the axis, or None."""
    if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    data, where = (np.asarray(consts[t]) if t in consts else None for t in node.input[:2])
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if data is None or where is None or where.size == 0 or where.dtype.kind not in "iu" or \
            not -data.ndim <= axis < data.ndim:
        return None
    n = data.shape[axis]
    bad = where[(where >= n) | (where < -n)]
    if not bad.size:
        return None
    return f"{node_text(node, index)} (Gather) reads index {int(bad.reshape(-1)[0])} of {node.input[0]!r}, which has " \
        f"{n} entries on axis {axis}. An input longer than the table gives this (a sequence past the model's " \
        f"learned positions): check the --input-shape and --input sizes against the model's limits"


def folded_elements(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> int:
    """An upper bound on the elements of the output of ``node`` (whose inputs are all constants) for the operators
    that make a large tensor from small constants (ConstantOfShape, Expand, Tile, Range, Pad); 0 for others."""
    def ints(name: str) -> list[int]:
        return [int(v) for v in np.asarray(consts[name]).reshape(-1)]

    def dims(name: str) -> list[int]:
        return [int(d) for d in np.shape(consts[name])]

    try:
        if node.op_type == "ConstantOfShape":
            return math.prod(max(v, 0) for v in ints(node.input[0]))
        if node.op_type == "Expand":
            shape, want = dims(node.input[0]), ints(node.input[1])
            rank = max(len(shape), len(want))
            shape, want = [1] * (rank - len(shape)) + shape, [1] * (rank - len(want)) + want
            return math.prod(max(a, abs(b)) for a, b in zip(shape, want))
        if node.op_type == "Tile":
            return math.prod(dims(node.input[0])) * math.prod(max(v, 0) for v in ints(node.input[1]))
        if node.op_type == "Range":
            start, limit, delta = (float(np.asarray(consts[t]).reshape(-1)[0]) for t in node.input[:3])
            return int(abs((limit - start) / delta)) + 1 if delta else 0
        if node.op_type == "Pad" and len(node.input) > 1 and node.input[1]:
            shape, pads = dims(node.input[0]), [max(v, 0) for v in ints(node.input[1])]
            half = len(pads) // 2
            return math.prod(d + pads[k] + pads[k + half] for k, d in enumerate(shape))
    except (IndexError, KeyError, TypeError, ValueError, OverflowError):
        return 0
    return 0


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


_SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0}
"""Operators whose output shape is given by a constant input (its index)."""


def _check_shape_constants(model: onnx.ModelProto, label: str, limit: int) -> None:
    """Raise :class:`TensorTooLargeError` naming the first node of :data:`_SHAPE_INPUTS` whose constant shape input
    asks for a tensor of more than ``limit`` bytes (as float32), before shape inference allocates for it, and
    :class:`ModelFileError` for a Reshape to a shape with an entry below -1 or two -1s."""
    consts = {i.name: i for i in model.graph.initializer}
    values = {n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant" and n.output
              for a in n.attribute if a.name == "value"}
    for k, node in enumerate(model.graph.node):
        index = _SHAPE_INPUTS.get(node.op_type)
        if index is None or len(node.input) <= index:
            continue
        tensor = consts.get(node.input[index]) or values.get(node.input[index])
        if tensor is None or tensor.data_type != onnx.TensorProto.INT64 or len(tensor.dims) != 1 or \
                tensor.dims[0] > 64:
            continue
        dims = [int(v) for v in numpy_helper.to_array(tensor)]
        if node.op_type == "Reshape" and (min(dims, default=0) < -1 or dims.count(-1) > 1):
            raise ModelFileError(f"The model {label} is not a valid ONNX graph: {node_text(node, k)} (Reshape) asks "
                                 f"for shape {dims}; each entry must be -1 (at most one), 0 or positive.")
        nbytes = 4 * int(np.prod([v for v in dims if v > 0], dtype=object))
        if nbytes > limit:
            raise TensorTooLargeError(
                f"The model {label} has {node_text(node, k)} ({node.op_type}) whose shape input asks for "
                f"{'x'.join(map(str, dims))}, which would take {_size_text(nbytes)}; the lab allows "
                f"{_size_text(limit)} per tensor on this machine (a quarter of its memory).")
