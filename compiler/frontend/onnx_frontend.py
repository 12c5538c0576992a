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
between Reshapes). Subgraphs computing constants (shape arithmetic) are evaluated at import. Last, a region of
element-wise nodes computed from one activation and one-element constants that holds a node no rule takes (a
comparison, a computed Where, a quotient of two computed values: Apertus's xIELU) becomes one function of each element
(:func:`.pointwise.fuse_pointwise_regions`; a lookup table once quantized).

A model with nodes the rules cannot import raises one :class:`UnsupportedOperatorError` listing every such node (the
op, the node, and the attribute, input or shape that is the problem), not only the first. A tensor whose size
(from shape inference) would exceed :func:`tensor_byte_limit` raises :class:`TensorTooLargeError` naming it and its
size before anything is allocated.

A symbolic (dynamic) first input dimension is the batch and becomes ``batch``; any other symbolic or unknown input
dimension is an error unless ``input_shapes`` gives that input's whole shape. A file that is not an ONNX model
(missing, empty, a folder, not protobuf, truncated) raises :class:`ModelFileError`, and a model whose default-domain
opset lies outside :data:`SUPPORTED_OPSETS` raises :class:`UnsupportedOpsetError`, both naming the file. So does a
graph that breaks ONNX's own rules (:mod:`.onnx_checks`: a node against its schema, an axis outside its input's rank,
operand types the typed first shape inference rejects), listing every problem; a constant shape input asking for a
tensor beyond :func:`tensor_byte_limit` raises :class:`TensorTooLargeError` before shape inference allocates it.

Tensor names are ONNX's; a folded BatchNorm keeps the name of its output for the convolution that absorbed it.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Any, Mapping

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import numpy_helper, shape_inference

from vta.arrayfile import available_memory

from ..ir import Graph, GraphError
from ..qops import reference_evaluator
from . import (
    contrib,
    contrib_decoder,
    half,
    id_masks,
    indices,
    loops,
    mask_fills,
    masks,
    moe,
    numeric_inputs,
    onnx_fused,
    pointwise,
    pooling,
    position_tables,
    score_chains,
)
from .conv3d import rewrite_conv3d
from .conv_transpose import col2im_as_conv_transposes, rewrite_conv_transposes, undilate_convs
from .onnx_checks import (
    _check_shape_constants,
    _check_sizes,
    axis_problem,
    check_axes,
    check_broadcasts,
    check_graph,
    check_nodes,
    folded_elements,
    index_problem,
)
from .onnx_common import (
    _DTYPES,
    EmptyTensorError,
    ModelFileError,
    TensorTooLargeError,
    UnsupportedModelError,
    UnsupportedOperatorError,
    UnsupportedOpsetError,
    _attrs,
    _Importer,
)
from .onnx_fusions import (
    _fuse_decompositions,
    _split_sequences,
    constant_first_matmuls,
    drop_identities,
    tiles_as_expands,
)
from .onnx_rules import RESIZE_COORDINATE_MODES
from .onnx_transformer_rules import RULES
from .recurrent import RECURRENT_OPS, rewrite_recurrent
from .scatter import flatten_scatter_chains, scatters_as_gathers

__all__ = ["UnsupportedOperatorError", "UnsupportedModelError", "ModelFileError", "UnsupportedOpsetError",
           "DynamicShapeError",
           "TensorTooLargeError", "import_onnx", "RULES", "SUPPORTED_OPSETS", "RESIZE_COORDINATE_MODES",
           "tensor_byte_limit"]

SUPPORTED_OPSETS = (13, 28)
"""The default-domain (``ai.onnx``) opsets the rules handle, inclusive. Below 13, Softmax flattened its input to 2D
around ``axis`` (the rule implements the opset-13 per-axis form) and Squeeze/Unsqueeze took their axes otherwise;
the rules read every operator form up to opset 22 (ReduceMean's ``axes`` input of 18, the Conv and pooling revisions
of 19 and 22). Opsets 23 to 28 revise the operators the rules read only by new element types (int4, float4, float8
and the like, which a float32 model does not hold) and Cast's ``round_mode`` for float8; they add fused operators,
which :mod:`.onnx_fused` rewrites (Attention, SwiGLU) or refuses by name, and RMSNormalization, which has a rule."""



def _branch(node: onnx.NodeProto, condition: Any) -> tuple[onnx.GraphProto, list[onnx.NodeProto]] | None:
    """If ``node``'s branch for its constant ``condition`` (an array of one element) and the nodes that replace the
    If: the branch's nodes, then an Identity from each branch output to the If's (None when the condition is empty
    or the branch is missing or of another output count). tf2onnx writes Keras's ``tf.cond`` on a constant so, and a
    branch may read the outer graph's tensors by name; the caller takes the branch's initializers."""
    if not np.size(condition):
        return None
    name = "then_branch" if bool(np.asarray(condition).reshape(-1)[0]) else "else_branch"
    branch = next((a.g for a in node.attribute if a.name == name), None)
    if branch is None or len(branch.output) != len(node.output):
        return None
    return branch, [onnx.NodeProto.FromString(n.SerializeToString()) for n in branch.node] + \
        [onnx.helper.make_node("Identity", [out.name], [target], name=f"{node.name or target}_{k}")
         for k, (out, target) in enumerate(zip(branch.output, node.output))]


def _fold_constants(model: onnx.ModelProto, keep: frozenset[str] = frozenset(),
                    fold_anyway: frozenset[str] = frozenset()) -> onnx.ModelProto:
    """Replace every node whose inputs are all constants (the shape arithmetic exporters emit, Constant nodes, and
    Shape of a tensor whose shape inference already fixed) by initializers, evaluated with ONNX's reference
    evaluator, so shape inference sees constant pads and shapes. An If on a constant condition is replaced by the
    nodes of the branch it takes (:func:`_branch`), which fold in turn where they can. Nodes whose op type is in
    ``keep`` are never folded (a pre-quantized model's DequantizeLinear of an int8 weight stays one), unless they
    write a tensor of ``fold_anyway``."""
    consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    shapes = contrib.static_shapes(model)
    graph_outputs = {o.name for o in model.graph.output}
    kept = []
    types = contrib.elem_types(model)
    todo = list(model.graph.node)
    largest = tensor_byte_limit() // 8          # elements of a folded constant, left to the size check beyond it
    seqs: dict[str, list[str]] = {}               # ONNX sequences of known tensors (loops.sequence_step)
    changed = False
    while todo:
        node = todo.pop(0)
        if isinstance(node, loops.Iteration):    # a Loop's iteration folded: the next one, or the loop's outputs
            todo[:0] = node.next(consts)
            continue
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and \
                (unrolled := loops.start(node, consts, node.name or node.output[0])) is not None:
            todo[:0] = unrolled
            changed = True
            continue
        if node.op_type == "Scan" and node.domain in ("", "ai.onnx") and \
                (unrolled := loops.scan_nodes(node, consts, shapes, node.name or node.output[0])) is not None:
            todo[:0] = unrolled
            changed = True
            continue
        if node.domain in ("", "ai.onnx") and (replaced := loops.sequence_step(node, seqs, consts)) is not None:
            todo[:0] = replaced            # a sequence of known tensors, followed as their names
            if node.op_type in loops.SEQUENCE_BUILDERS:
                kept.append(node)          # until nothing reads it (below)
            changed = True
            continue
        inputs = [t for t in node.input if t]
        taken = _branch(node, consts[inputs[0]]) if node.op_type == "If" and inputs and inputs[0] in consts \
            else None
        if taken is not None:
            consts.update({init.name: numpy_helper.to_array(init) for init in taken[0].initializer})
            todo[:0] = taken[1]
            changed = True                 # the branch taken, whose nodes may read the outer graph's tensors
            continue
        standard = node.domain in ("", "ai.onnx")
        if standard and node.op_type in _RANDOM_OPS:                   # never folded into one draw
            raise UnsupportedOperatorError(node.op_type, node.name or "<unnamed>", _RANDOM_REASON)
        if standard and node.op_type == "CastLike" and inputs[0] in consts and types.get(inputs[1]) and \
                not graph_outputs.intersection(node.output):   # only the second input's type is read
            dtype = onnx.helper.tensor_dtype_to_np_dtype(types[inputs[1]])
            consts[node.output[0]] = np.asarray(consts[inputs[0]]).astype(dtype)
            continue
        if standard and node.op_type == "Shape" and inputs[0] in shapes and not graph_outputs.intersection(node.output):
            a = _attrs(node)
            dims = shapes[inputs[0]]
            consts[node.output[0]] = np.array(dims[a.get("start", 0):a.get("end", len(dims))], np.int64)
            continue
        if standard and node.op_type == "Concat" and (empty := _empty_parts(node, consts, shapes)) and \
                len(empty) < len(node.input):   # a constant of no rows on the axis, as a KV cache at step 0
            node = onnx.NodeProto.FromString(node.SerializeToString())
            kept_inputs = [t for k, t in enumerate(node.input) if k not in empty]
            del node.input[:]
            node.input.extend(kept_inputs)
            inputs = kept_inputs
            changed = True
        foldable = standard and all(t in consts for t in inputs) and \
            (node.op_type not in keep or bool(fold_anyway.intersection(node.output))) and \
            (inputs or node.op_type == "Constant") and not graph_outputs.intersection(node.output)
        if not foldable or folded_elements(node, consts) > largest:
            kept.append(node)              # too large a constant: left for the size check to name
            continue
        if inputs and (problem := axis_problem(node, 0, np.ndim(consts[inputs[0]]))) is not None:
            raise ModelFileError(f"The model is not a valid ONNX graph: {problem}.")    # before the evaluator reads it
        if (problem := index_problem(node, 0, consts)) is not None:
            raise ModelFileError(f"The model cannot run at these input shapes: {problem}.")
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():  # a mean of no elements (an empty
                warnings.simplefilter("ignore", RuntimeWarning)          # input's pool): the checks after name it
                results = reference_evaluator(node).run(None, {t: consts[t] for t in inputs})
        except Exception as err:  # an op the reference evaluator lacks
            if node.op_type in RULES:
                kept.append(node)
                continue
            raise UnsupportedOperatorError(node.op_type, node.name or "<unnamed>",
                                           f"constant folding failed ({err})") from err
        for name, value in zip(node.output, results):
            consts[name] = np.asarray(value)
    kept = loops.drop_unread_sequences(kept, seqs, graph_outputs)
    if len(kept) == len(model.graph.node) and not changed:
        return model
    initial = {init.name for init in model.graph.initializer}
    used = {t for node in kept for t in (*node.input, *_subgraph_reads(node))}
    del model.graph.node[:]
    model.graph.node.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items()
                                   if k not in initial and k in used)
    return model


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """The tensors the subgraphs of ``node`` (a Loop's or Scan's body, an If's branches, nested) read: the outer
    graph's among them must stay, even when only a subgraph reads them."""
    reads: set[str] = set()
    for attr in node.attribute:
        for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else
                      list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []):
            for inner in graph.node:
                reads.update(t for t in inner.input if t)
                reads |= _subgraph_reads(inner)
    return reads


def _empty_parts(node: onnx.NodeProto, consts: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> set[int]:
    """Positions of a Concat's constant inputs that hold no elements along its axis (and so add nothing to it), each
    of the other inputs' shape off the axis: a part whose other dimensions disagree, or whose fellow inputs' shapes
    are not known yet, stays (for shape inference to judge)."""
    axis = _attrs(node).get("axis", 0)
    others = [tuple(np.shape(consts[t])) if t in consts else shapes.get(t) for t in node.input]
    found = set()
    for k, t in enumerate(node.input):
        if t not in consts or not (a := np.asarray(consts[t])).ndim or not -a.ndim <= axis < a.ndim or \
                a.shape[axis] != 0:
            continue
        full = [o for j, o in enumerate(others) if j != k and o is not None and 0 not in o]
        off = [d for i, d in enumerate(a.shape) if i != axis % a.ndim]
        if full and all(len(o) == a.ndim and [d for i, d in enumerate(o) if i != axis % a.ndim] == off for o in full):
            found.add(k)
    return found


def _empty_concat_inputs(model: onnx.ModelProto) -> bool:
    """Whether a Concat of ``model`` reads an initializer of no elements (a KV cache given empty for a prompt), which
    :func:`_fold_constants` drops once the Concat's other inputs have static shapes."""
    empty = {i.name for i in model.graph.initializer if 0 in i.dims}
    return bool(empty) and any(n.op_type == "Concat" and empty.intersection(n.input) for n in model.graph.node)


_RANDOM_OPS = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial",
                         "Bernoulli"})
_RANDOM_REASON = ("a random operator: its output differs on every run, and the lab compiles one fixed computation "
                  "(folding it would freeze one draw); export the model without it (ViTMAE's random masking draws one)")


def _infer_shapes(model: onnx.ModelProto, *, check_type: bool = False) -> onnx.ModelProto:
    """ONNX's shape inference on ``model`` from its inputs and constants alone: the value infos already there (the
    exporter's, or an earlier pass's from before the inputs were fixed or constants folded) are dropped first, since
    inference keeps a symbolic dimension they hold where broadcasting a 1 against it cannot resolve it (a batch-1
    run of a file exported with dynamic axes kept ``[unk, 16, 64]`` for ``[1, 16, 64] + [1, 16, 64]``). With data
    propagation, so that a Reshape to a shape computed by Shape, Gather and Concat has a static output, and the
    Shape nodes after it fold in the next pass. ``check_type``: also refuse inputs whose types disagree (an int32
    weight of a float MatMul), as the file's first inference does; a failure is a :class:`ModelFileError`. The
    outputs' declared shapes are inferred too: where the fixed dimensions disagree with what the nodes compute, the
    computed shape wins with a warning, as in onnxruntime (the declared one would reshape the result it names)."""
    del model.graph.value_info[:]
    declared = {}                  # the outputs' shapes as the file states them, which inference would keep
    for out in model.graph.output:
        if out.type.HasField("tensor_type") and out.type.tensor_type.HasField("shape"):
            declared[out.name] = onnx.TensorShapeProto.FromString(out.type.tensor_type.shape.SerializeToString())
            out.type.tensor_type.ClearField("shape")
    shapes_computed = any(node.op_type == "Shape" for node in model.graph.node)
    try:
        inferred = shape_inference.infer_shapes(model, data_prop=shapes_computed, check_type=check_type)
    except EncodeError:                 # protobuf holds at most 2 GiB: the folded constants passed it
        raise TensorTooLargeError(_too_large_to_hold(model)) from None
    except shape_inference.InferenceError as err:   # a node whose inputs' types or shapes it cannot take
        text = " ".join(str(err).split())
        raise ModelFileError(f"The model is not a valid ONNX graph: ONNX's shape inference rejects it: {text}"
                             ) from None
    for out in inferred.graph.output:
        if out.name not in declared:
            continue
        stated = declared[out.name]
        if not out.type.tensor_type.HasField("shape"):
            out.type.tensor_type.shape.CopyFrom(stated)       # inference found none: the file's
            continue
        got = [d.dim_value if d.HasField("dim_value") else None for d in out.type.tensor_type.shape.dim]
        want = [d.dim_value if d.HasField("dim_value") else None for d in stated.dim]
        if len(got) != len(want) or any(a is not None and b is not None and a != b for a, b in zip(got, want)):
            logging.getLogger("vta").warning(
                "The model's output %r is declared of shape %s, but its nodes compute %s at these input shapes; the "
                "lab takes %s, as onnxruntime does.", out.name, _dims(want), _dims(got), _dims(got))
            continue
        for dim, value in zip(out.type.tensor_type.shape.dim, want):     # what inference left open, the file's
            if value is not None and not dim.HasField("dim_value"):
                dim.Clear()
                dim.dim_value = value
    return inferred


def _too_large_to_hold(model: onnx.ModelProto) -> str:
    """Why ``model`` cannot be serialized: its constants (once folded at these input shapes), with the largest."""
    sizes = sorted(((int(np.prod(init.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(
        init.data_type).itemsize, init.name, tuple(init.dims)) for init in model.graph.initializer), reverse=True)
    total = sum(size for size, _, _ in sizes)
    largest = ", ".join(f"{name!r} {'x'.join(map(str, dims))} ({size / 2 ** 20:,.0f} MiB)"
                        for size, name, dims in sizes[:3])
    return (f"The model's constants take {total / 2 ** 30:.1f} GiB once the import computes those that depend on the "
            f"input shapes alone (largest: {largest}), past the 2 GiB an ONNX graph can hold (protobuf's limit). "
            f"Run it at smaller input sizes (--input-shape, or a smaller --input), where those tables are smaller.")


def _dims(dims: list[int | None]) -> str:
    """``1x?x16`` for ``[1, None, 16]``."""
    return "x".join("?" if d is None else str(d) for d in dims) or "a scalar"


def _sort_nodes(model: onnx.ModelProto) -> None:
    """Put the graph's nodes in an order where each reads only what earlier nodes write, in place, keeping the file's
    order where it already does (onnxruntime's float16 converter appends the Casts of the inputs at the end, and
    onnxruntime runs such files). A node in a cycle or reading a value nothing writes stays after the others, for
    the validation to name."""
    given = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    ready = set(given)
    for node in model.graph.node:
        if any(t not in ready for t in node.input):
            break
        ready.update(node.output)
    else:
        return
    ready = set(given)
    ordered: list[onnx.NodeProto] = []
    waiting = list(model.graph.node)
    while waiting:                                       # one pass per level of nodes found out of order
        left = []
        for node in waiting:
            if all(t in ready for t in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                left.append(node)
        if len(left) == len(waiting):
            ordered.extend(left)
            break
        waiting = left
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def _rewrite_contrib(model: onnx.ModelProto) -> dict[str, str]:
    """:func:`.contrib.rewrite_contrib` with the decoder operators and the rewrites of ONNX's fused operators."""
    return contrib.rewrite_contrib(model, extra=contrib_decoder.DECODER_REWRITES, steps=onnx_fused.FUSED_REWRITES)


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
        proto = onnx.load(path, load_external_data=False)
    except OSError as err:
        raise ModelFileError(f"Cannot read the model {path}: {err.strerror}.") from None
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and whatever a damaged file makes onnx raise
        raise ModelFileError(f"The model {path} is not {what}, or it is truncated: its {size} bytes do not decode as "
                             f"an ONNX protobuf ({err}).") from None
    if not proto.HasField("graph") or not proto.graph.node or not proto.graph.output:
        raise ModelFileError(f"The model {path} holds no ONNX graph with nodes and outputs; it is not {what}, or it "
                             f"is truncated.")
    weights = size + _external_bytes(proto, os.path.dirname(path))
    if weights >= PROTOBUF_LIMIT:
        raise ModelFileError(f"The model {path} holds {weights / 1e9:.2f} GB with its external data; the lab's ONNX "
                             f"passes (shape inference, constant folding, the float reference) hold a model as one "
                             f"protobuf message, which cannot exceed 2 GB (2,147,483,647 bytes), so models up to that "
                             f"size are supported.")
    _check_memory(path, weights)
    try:
        onnx.external_data_helper.load_external_data_for_model(proto, os.path.dirname(path) or ".")
    except OSError as err:
        raise ModelFileError(f"Cannot read the external data of the model {path}: {err.strerror or err}.") from None
    except Exception as err:  # noqa: BLE001 - onnx's checks of the external data's locations and bounds
        raise ModelFileError(f"Cannot read the external data of the model {path}: {err}.") from None
    file_conventions(proto)
    return proto


def file_conventions(proto: onnx.ModelProto) -> None:
    """In place, on a file as read: inputs whose initializers are defaults (:func:`_defaults_as_inputs`), and an
    unset IR version (0, as a file written by hand leaves it) set to the one its opsets need, as onnxruntime reads
    such a file; an IR version 3 file whose initializers are not all among its inputs (as IR 3 requires) read as IR
    4, whose rule it follows (shape inference refused it: "Invalid tensor data type 0"); an initializer name given
    twice read as its last definition, as onnxruntime reads it (:func:`_last_initializers`)."""
    _last_initializers(proto)
    _defaults_as_inputs(proto)
    listed = {vi.name for vi in proto.graph.input}
    unlisted = proto.ir_version == 3 and any(init.name not in listed for init in proto.graph.initializer)
    if (proto.ir_version < 3 or unlisted) and proto.opset_import:  # IR 3 lists every initializer among the inputs:
        try:                                                        # a file that does not is read as IR 4 and up
            proto.ir_version = max(4 if unlisted else 0,
                                   onnx.helper.find_min_ir_version_for(list(proto.opset_import), ignore_unknown=True))
        except (ValueError, TypeError):
            pass                                        # an opset onnx does not know: the checks name it


def _last_initializers(proto: onnx.ModelProto) -> None:
    """In place: an initializer name the main graph gives twice or more keeps its last definition, as onnxruntime
    takes it (ONNX asks for unique names; Intel's Neural Compressor writes ``<bias>_scale`` once per layer for a bias
    torch shares between layers). A warning names those whose definitions differ."""
    seen: dict[str, int] = {}
    for k, init in enumerate(proto.graph.initializer):
        seen[init.name] = k
    if len(seen) == len(proto.graph.initializer):
        return
    groups: dict[str, list[bytes]] = {}
    for init in proto.graph.initializer:
        groups.setdefault(init.name, []).append(init.SerializeToString())
    differ = sorted(name for name, defs in groups.items() if len(set(defs)) > 1)
    kept = [init for k, init in enumerate(proto.graph.initializer) if seen[init.name] == k]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    message = (f"the model defines initializer(s) {', '.join(map(repr, differ[:5]))}{' ...' if len(differ) > 5 else ''}"
               f" more than once, with different values (ONNX asks for unique names); the lab takes the last "
               f"definition of each, as onnxruntime does")
    if differ:
        warn_once(message)


def warn_once(message: str) -> None:
    """Log ``message`` as the lab's warning the first time this process gives it (a run reads the file again for its
    accuracy step, which would repeat a warning about the file)."""
    if message not in _WARNED:
        _WARNED.add(message)
        logging.getLogger("vta").warning("%s", message)


_WARNED: set[str] = set()
"""Warnings :func:`warn_once` gave in this process."""


def _defaults_as_inputs(proto: onnx.ModelProto) -> None:
    """In place: when *every* graph input also has an initializer, the initializers are the inputs' default values
    (ONNX since IR version 4; onnxruntime takes the value fed instead) and are removed, so the inputs stay inputs.
    Elsewhere an input with an initializer is a constant, as the lab reads it throughout (IR version 3 lists every
    weight among the inputs, beside the data input that has none); here the graph would otherwise have no input
    and compute one constant."""
    inits = {init.name for init in proto.graph.initializer}
    names = {vi.name for vi in proto.graph.input}
    if names and names <= inits:
        kept = [init for init in proto.graph.initializer if init.name not in names]
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(kept)


PROTOBUF_LIMIT = 2**31 - 1
"""The largest protobuf message, in bytes; a model with its external data read in cannot be serialized beyond it."""

MEMORY_FACTOR = 5
"""Peak resident memory of ``vta run`` over the bytes of a model's weights, rounded up from the 5.3 measured on a
1.08 GB file (EmbeddingGemma at Gemma 3n's default size: 5.8 GB peak, fsim): the weights in float32 and float64,
their int8 copies, and onnxruntime's own copy for the float reference."""


def _external_bytes(proto: onnx.ModelProto, base: str) -> int:
    """The bytes of ``proto``'s initializers stored outside the file (their ``length``, else the size of their
    file, each file counted once); 0 when there are none."""
    def tensors(graph: onnx.GraphProto) -> Any:
        yield from graph.initializer
        for node in graph.node:
            for attr in node.attribute:
                yield from ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    yield from tensors(sub)
    total, files = 0, set()
    for tensor in tensors(proto.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        if info.get("length", "").isdigit():
            total += int(info["length"])
        elif info.get("location") and info["location"] not in files:
            files.add(info["location"])
            try:
                total += os.path.getsize(os.path.join(base, info["location"]))
            except OSError:
                pass                                     # a missing file is reported when it is read
    return total


def _available_memory() -> int | None:
    """Bytes of memory available to a new process (:func:`vta.arrayfile.available_memory`), or None where that is
    not known (a seam the tests replace)."""
    return available_memory()


def _check_memory(path: str, weight_bytes: int) -> None:
    """:class:`ModelFileError` when the model's weights (``weight_bytes``, the file and its external data) need more
    memory than the machine has available (:data:`MEMORY_FACTOR` times them), instead of the run being killed for
    lack of memory partway. ``VTA_SKIP_MEMORY_CHECK=1`` skips the check."""
    if os.environ.get("VTA_SKIP_MEMORY_CHECK") == "1":
        return
    available = _available_memory()
    need = MEMORY_FACTOR * weight_bytes
    if available is None or need <= available:
        return
    gb = 1e9
    raise ModelFileError(f"The model {path} holds {weight_bytes / gb:.1f} GB of weights; a run needs about "
                         f"{MEMORY_FACTOR} times that in memory ({need / gb:.1f} GB: the weights in float32 and "
                         f"float64, their int8 copies and onnxruntime's copy), and this machine has "
                         f"{available / gb:.1f} GB available. Run it where there is more memory, or set "
                         f"VTA_SKIP_MEMORY_CHECK=1 to try anyway.")


def _check_file(model: onnx.ModelProto, label: str) -> None:
    """What both imports check of a file before reading it: the opset (:func:`_check_opset`), then, the model's
    local functions inlined (:func:`_inline_functions`), the graph and every node against ONNX's rules
    (:func:`.onnx_checks.check_graph`, :func:`.onnx_checks.check_nodes`)."""
    _convert_old_opset(model, label)
    _check_opset(model, label)
    _inline_functions(model, label)
    check_graph(model, label)
    check_nodes(model, label)


def _inline_functions(model: onnx.ModelProto, label: str) -> None:
    """In place: every call of a model-local function (``model.functions``: onnxscript's, torch's
    ``export_modules_as_functions``) replaced by the function's nodes (ONNX's inliner), so the rules see the nodes;
    a :class:`ModelFileError` naming the functions when the inliner cannot expand them."""
    if not model.functions:
        return
    import onnx.inliner
    try:
        inlined = onnx.inliner.inline_local_functions(model)
    except Exception as err:  # noqa: BLE001 - the inliner's own errors on a malformed function
        names = ", ".join(sorted({f"{f.domain}.{f.name}" for f in model.functions}))
        raise ModelFileError(f"The model {label} defines local functions ({names}) that ONNX's inliner cannot "
                             f"expand: {str(err).splitlines()[0][:300]}") from None
    model.CopyFrom(inlined)


def _normalize_perms(model: onnx.ModelProto) -> None:
    """Each Transpose's negative ``perm`` entries counted from the end (torch exports Mamba2's ``x.permute(0, -2,
    -1, 1)`` as written): onnxruntime takes them, but ONNX's shape inference leaves the output without a shape."""
    for node in model.graph.node:
        if node.op_type != "Transpose":
            continue
        for attr in node.attribute:
            if attr.name == "perm" and any(p < 0 for p in attr.ints):
                rank = len(attr.ints)
                fixed = [p % rank for p in attr.ints]
                del attr.ints[:]
                attr.ints.extend(fixed)


def _check_types(model: onnx.ModelProto) -> None:
    """Raise :class:`ModelFileError` when ONNX's typed shape inference rejects ``model`` (operand types that
    disagree), leaving ``model`` as it is (the inference runs on a copy)."""
    _infer_shapes(onnx.ModelProto.FromString(model.SerializeToString()), check_type=True)


OLDEST_CONVERTED = 7
"""The oldest default-domain opset :func:`_convert_old_opset` takes (onnx's version converter's adapters start near
it; older files are refused as before)."""


def _convert_old_opset(model: onnx.ModelProto, label: str) -> None:
    """In place: a model of opset :data:`OLDEST_CONVERTED` to 12 (the ONNX model zoo's files, older exporters')
    converted to the oldest supported opset by onnx's version converter, with a warning naming both. The adapters
    rewrite the operators whose form changed (Upsample to Resize, Clip's and Pad's attributes to inputs, Softmax's
    2-D coercion, Squeeze's axes); onnxruntime still runs the original file for the error against float. A model the
    converter cannot take is refused by :func:`_check_opset`, with the converter's reason."""
    lo = SUPPORTED_OPSETS[0]
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions or not OLDEST_CONVERTED <= versions[0] < lo:
        return
    from onnx import version_converter
    try:
        converted = version_converter.convert_version(model, lo)
    except Exception as err:  # noqa: BLE001 - the converter's own errors: an operator it has no adapter for
        reason = " ".join(str(err).split())[:300]
        raise UnsupportedOpsetError(f"The model {label} uses ONNX opset {versions[0]}; the frontend supports opsets "
                                    f"{lo} to {SUPPORTED_OPSETS[1]}, and onnx's version converter could not convert "
                                    f"it to {lo} ({reason}).") from None
    logging.getLogger("vta").warning("%s uses ONNX opset %d; the lab converted it to opset %d with onnx's version "
                                     "converter (the error against float is measured on the original file)",
                                     label, versions[0], lo)
    model.CopyFrom(converted)


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


def _dim_text(dim: Any) -> str:
    return str(dim.dim_value) if dim.HasField("dim_value") else (dim.dim_param or "?")


class DynamicShapeError(ValueError):
    """A graph input has a symbolic or unknown dimension besides the batch and no shape was given for it (``vta
    run`` then takes the shapes of its ``--input`` arrays)."""


def _inline_constant_ifs(model: onnx.ModelProto) -> None:
    """Replace every If whose condition is a constant (an initializer, or a Constant node's value) by the nodes of
    the branch it takes, in place and at its position, the branch's outputs passed on by Identity nodes (nested Ifs
    too). Done before the rewrites of fused operators (:func:`_rewrite_contrib`) so that they see a branch's nodes:
    onnxruntime's optimizer fuses inside the branches of optimum's merged decoders. :func:`_fold_constants` still
    inlines an If whose condition only folding makes constant."""
    for _ in range(64):                                   # nested branches: one level per pass
        conditions = {n.input[0] for n in model.graph.node if n.op_type == "If" and n.input}
        if not conditions:
            return
        consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name in conditions}
        for n in model.graph.node:                        # only the conditions: a model's weights stay protobuf
            if n.op_type == "Constant" and n.output and n.output[0] in conditions and n.attribute and \
                    n.attribute[0].name == "value":
                consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        nodes, changed = [], False
        for n in model.graph.node:
            taken = _branch(n, consts[n.input[0]]) if n.op_type == "If" and n.input and n.input[0] in consts \
                else None
            if taken is None:
                nodes.append(n)
                continue
            model.graph.initializer.extend(taken[0].initializer)
            nodes += taken[1]
            changed = True
        if not changed:
            return
        del model.graph.node[:]
        model.graph.node.extend(nodes)


def _fix_values(model: onnx.ModelProto, values: Mapping[str, float], label: str) -> None:
    """Make each one-element input named in ``values`` (``--input-value``) the constant of that value in its own type
    (an initializer, no longer an input), so that an If it decides is inlined as the branch it takes (optimum's merged
    decoders choose theirs by ``use_cache_branch``). ValueError naming every name that is not an input, every input
    of more than one element, and every value its type cannot hold."""
    inits = {i.name for i in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    problems = []
    fixed = []
    for name, value in values.items():
        vi = inputs.get(name)
        if vi is None:
            problems.append(f"{name!r} is not an input of the model (its inputs are "
                            f"{', '.join(map(repr, inputs))})")
            continue
        dims = vi.type.tensor_type.shape.dim
        if any(d.HasField("dim_value") and d.dim_value != 1 for d in dims):
            problems.append(f"input {name!r} has shape {'x'.join(_dim_text(d) for d in dims)}: only an input of one "
                            f"element takes a value")
            continue
        elem = vi.type.tensor_type.elem_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype(np.float32)
        number = float(value)
        if dtype == np.bool_:
            ok = number in (0.0, 1.0)
        elif dtype.kind in "iu":
            info = np.iinfo(dtype.type)
            ok = number.is_integer() and info.min <= number <= info.max
        else:
            ok = dtype.kind == "f" and np.isfinite(number)
        if not ok:
            problems.append(f"input {name!r} is {dtype.name}, which cannot hold {float(value):g}")
            continue
        fixed.append((vi, np.full([1] * len(dims), number).astype(dtype)))
    if problems:
        raise ValueError(f"--input-value does not fit the model {label}: " + "; ".join(problems) + ".")
    for vi, array in fixed:
        model.graph.input.remove(vi)
        model.graph.initializer.append(numpy_helper.from_array(array, vi.name))


class ConstantOutputError(GraphError):
    """A graph output that is a constant: the model computes nothing for it."""


def _check_single_definitions(model: onnx.ModelProto, label: str) -> None:
    """GraphError when, after the rewrites before import, a tensor is defined twice (two initializers of one name, an
    initializer a node also writes, two nodes writing one name): a rewrite gave a new tensor a name the file uses,
    which would replace the file's tensor silently (a wrong answer); the file itself was checked whole before."""
    seen: set[str] = set()
    twice: list[str] = []
    for init in model.graph.initializer:                # an initializer may shadow an input (IR 3 lists them all)
        if init.name in seen:
            twice.append(init.name)
        seen.add(init.name)
    seen |= {vi.name for vi in model.graph.input}
    for name in (o for node in model.graph.node for o in node.output if o):
        if name in seen:
            twice.append(name)
        seen.add(name)
    if twice:
        raise GraphError(f"The model {label} could not be imported: the lab's rewrites defined tensor(s) "
                         f"{', '.join(map(repr, sorted(set(twice))[:5]))} twice (a name the file already uses); "
                         f"this is a defect of the lab, not of the file: please report it with the file.")


def _empty_inputs_problem(empties: dict[str, tuple[int, ...]], err: GraphError) -> GraphError:
    """``err`` (a graph the inputs of no elements ``empties`` left malformed: name -> shape; made empty constants, as
    an empty KV cache a Concat drops) with its cause said after it: an input the model computes on was given no
    elements (an image of height 0), so its layers folded into constants the lab cannot compute on."""
    shapes = ", ".join(f"{name!r} {'x'.join(map(str, shape))}" for name, shape in sorted(empties.items()))
    return GraphError(f"{err} The cause: inputs of no elements ({shapes}), which the layers cannot compute on; the "
                      f"lab takes an input of no elements as an empty KV cache, which a Concat drops: give the others "
                      f"a length of 1 or more (--input-shape).")


def _fix_inputs(model: onnx.ModelProto, batch: int, input_shapes: dict[str, tuple[int, ...]], label: str
                ) -> dict[str, str]:
    """Give every graph input a static shape: ``input_shapes[name]`` where given (it must agree with the model's
    rank and fixed dimensions); else a symbolic dimension named like one of a given input (``sequence`` of
    ``input_ids`` and of ``attention_mask``) takes that input's value, a symbolic or unknown first (batch) dimension
    becomes ``batch``, and any other symbolic or unknown dimension raises ValueError naming it and the
    ``--input-shape`` that would fix it. An input of no elements (a KV cache of past length 0) becomes the empty
    constant it is: it holds no data (:func:`.pipeline.without_empty` lets its array through).

    Returns, for each input with dimensions the file leaves open, those dimensions as this import set them
    (``"batch=1, height=32"``), for the errors of a model whose export fixed them inside (a Reshape's constant)."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    named: dict[str, int] = {}                       # a symbolic dimension's name -> its value in a given shape
    for vi in inputs:
        given = input_shapes.get(vi.name)
        dims = vi.type.tensor_type.shape.dim
        if given is not None and len(given) == len(dims):
            for d, v in zip(dims, given):
                if d.HasField("dim_param") and d.dim_param:
                    named.setdefault(d.dim_param, v)
    unknown = sorted(set(input_shapes) - {vi.name for vi in inputs})
    if unknown:
        verb = "is" if len(unknown) == 1 else "are"
        names = ", ".join(repr(vi.name) for vi in inputs)
        raise ValueError(f"--input-shape names {', '.join(map(repr, unknown))}, which {verb} not an input of the model "
                         f"{label}; its inputs are {names}.")
    opened: dict[str, str] = {}
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        text = "x".join(_dim_text(d) for d in dims)
        given = input_shapes.get(vi.name)
        open_dims = [(k, d.dim_param or f"dimension {k}") for k, d in enumerate(dims) if not d.HasField("dim_value")]
        if given is not None:
            fixed = [(k, d.dim_value) for k, d in enumerate(dims) if d.HasField("dim_value")]   # 0 too, as ORT
            if len(given) != len(dims) or any(given[k] != v for k, v in fixed):
                raise ValueError(f"--input-shape {vi.name}={'x'.join(map(str, given))} does not fit the model "
                                 f"{label}, whose input {vi.name!r} has shape {text}; give {len(dims)} dimensions "
                                 f"that keep the fixed ones.")
            values = list(given)
        else:
            for d in dims:
                if d.HasField("dim_param") and d.dim_param in named:
                    value = named[d.dim_param]
                    d.Clear()
                    d.dim_value = value
            free = [k for k, d in enumerate(dims) if k > 0 and not d.HasField("dim_value")]
            if free:
                names = ", ".join(_dim_text(dims[k]) for k in free)
                example = "x".join(str(batch) if k == 0 else "224" if k in free else _dim_text(d)
                                   for k, d in enumerate(dims))
                raise DynamicShapeError(f"The model {label} has input {vi.name!r} of shape {text}, with symbolic or "
                                        f"unknown dimensions ({names}) besides the batch; give its whole shape, e.g. "
                                        f"--input-shape {vi.name}={example}.")
            values = [batch if k == 0 and not d.HasField("dim_value") else d.dim_value
                      for k, d in enumerate(dims)]
        if any(v < 0 for v in values):
            raise ValueError(f"The model {label} has input {vi.name!r} of shape {'x'.join(map(str, values))}: a "
                             f"dimension cannot be negative.")
        for d, v in zip(dims, values):
            d.Clear()
            d.dim_value = v
        if open_dims:
            opened[vi.name] = ", ".join(f"{name}={values[k]}" for k, name in open_dims)
    for vi in inputs:          # an input of no elements holds no data: the empty constant it must be
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if 0 in dims and vi.type.tensor_type.elem_type:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            model.graph.input.remove(vi)
            model.graph.initializer.append(numpy_helper.from_array(np.zeros(dims, dtype), vi.name))
    return opened


_IF_REASON = ("a condition computed at run time or given as an input (an If on a constant is inlined); optimum's "
              "merged decoder (decoder_model_merged.onnx) chooses its branch by the input use_cache_branch: give "
              "its value (--input-value use_cache_branch=1, or in the --input .npz) to compile that branch, or "
              "compile decoder_model.onnx or decoder_with_past_model.onnx, which optimum writes beside it")
"""Why an If is refused."""

_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
"""Operators with subgraphs, which no rule takes."""


_NOT_ONNX_HINTS = {"Erfc": "tf2onnx writes it for Keras 3's exact GELU, 0.5 x erfc(-x / sqrt 2): export with "
                           "gelu(approximate=True), or write 1 - Erf(x) in its place"}
"""What writes an operator ONNX does not define, and the way around it."""

_VALUE_SHAPED = {"NonZero", "NonMaxSuppression", "Unique", "Compress", "RoiAlign", "MaxRoiPool"}
_VALUE_SHAPED_REASON = ("its output's size depends on the values it reads (a detector's score threshold, "
                        "non-maximum suppression or box crops), and the lab compiles tensors of static shapes: "
                        "export the network without its post-processing (its raw boxes and scores) and run that "
                        "part on the host")
"""Operators whose output shape (or the region read) is decided by activation values at run time."""


def _refusal(node: onnx.NodeProto, refused: dict[str, str]) -> str:
    """Why ``node``, which no rule takes, is refused: a rewrite's reason by its first output, else :data:`_IF_REASON`
    for an If, :data:`_VALUE_SHAPED_REASON` for a detector's post-processing, else that ONNX does not define the
    operator (with :data:`_NOT_ONNX_HINTS`' way around it), else nothing more."""
    if node.output[0] in refused:
        return refused[node.output[0]]
    if node.op_type == "If":
        return _IF_REASON
    if node.op_type in _VALUE_SHAPED and node.domain in ("", "ai.onnx"):
        return _VALUE_SHAPED_REASON
    if node.op_type == "Loop":
        return loops.LOOP_REASON
    if node.op_type == "Scan":
        return "a Scan is unrolled when its scan inputs have static shapes; this one's do not"
    if not onnx.defs.has(node.op_type):
        hint = _NOT_ONNX_HINTS.get(node.op_type)
        return (f"ONNX defines no operator {node.op_type!r}, so onnx.checker and onnxruntime refuse this file too"
                + (f" ({hint})" if hint else ""))
    return ""


def _raise_refused(model: onnx.ModelProto, label: str, refused: dict[str, str]) -> None:
    """Raise the refusals of the nodes the rewrites before import left (:func:`.contrib.rewrite_contrib`,
    :func:`.onnx_fused.rewrite_onnx_fused`) and of control flow (:data:`_CONTROL_FLOW`), if any, as
    :func:`_apply_rules` would name them (called before another refusal, an input's type, which such a node may
    cause: an If hides how its branches use a mask input)."""
    problems = [UnsupportedOperatorError(node.op_type if node.domain in ("", "ai.onnx") else
                                         f"{node.domain}.{node.op_type}",
                                         node.name or f"<unnamed, writes {node.output[0]}>", _refusal(node, refused))
                for node in model.graph.node if node.output and (node.output[0] in refused or (
                    node.domain in ("", "ai.onnx") and node.op_type in _CONTROL_FLOW))]
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise UnsupportedModelError(label, problems)


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
                raise UnsupportedOperatorError(node.op_type, node.name, _refusal(node, refused))
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
            if mask.fn:                                  # a term computed from the mask at run time
                kept.append(onnx.helper.make_node("MaskFn", [mask.source], [mask.mask], name=f"{mask.mask}_fn"))
            node = onnx.helper.make_node("KeyMask", [mask.x, mask.mask], [mask.out], name=node.name)
        kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)


def import_onnx(model: str | os.PathLike | onnx.ModelProto, *, batch: int = 1, name: str | None = None,
                input_shapes: dict[str, tuple[int, ...]] | None = None, max_tensor_bytes: int | None = None,
                input_values: Mapping[str, float] | None = None) -> Graph:
    """Import an ONNX model (path or ModelProto) as a validated float :class:`~.ir.Graph`.

    A dynamic first (batch) input dimension becomes ``batch``; ``input_shapes`` (input name -> whole shape) fixes
    inputs with other dynamic dimensions, which are an error otherwise. Raises :class:`ModelFileError` for a file
    that is not an ONNX model, :class:`UnsupportedOpsetError` for an opset outside :data:`SUPPORTED_OPSETS` and
    :class:`UnsupportedOperatorError` for an operator outside :data:`RULES` (naming the op type and node; one
    :class:`UnsupportedModelError` listing them all when several nodes are refused) and :class:`TensorTooLargeError`
    for a tensor of more than ``max_tensor_bytes`` (default :func:`tensor_byte_limit`), before allocating anything.
    ``input_values`` (input name -> value) makes one-element inputs constants (:func:`_fix_values`): the If nodes
    they decide are compiled for those values.
    """
    empties: dict[str, tuple[int, ...]] = {}
    try:
        return _import_onnx(model, batch=batch, name=name, input_shapes=input_shapes, max_tensor_bytes=max_tensor_bytes,
                            input_values=input_values, empties=empties)
    except GraphError as err:
        if empties and not isinstance(err, (EmptyTensorError, ConstantOutputError)):   # those say it already;
            raise _empty_inputs_problem(empties, err) from None
        raise


def _import_onnx(model: str | os.PathLike | onnx.ModelProto, *, batch: int, name: str | None,
                 input_shapes: dict[str, tuple[int, ...]] | None, max_tensor_bytes: int | None,
                 input_values: Mapping[str, float] | None, empties: dict[str, tuple[int, ...]]) -> Graph:
    """:func:`import_onnx`, which it wraps; ``empties`` gains the inputs of no elements made empty constants."""
    if isinstance(model, (str, os.PathLike)):
        label = name or os.path.splitext(os.path.basename(os.fspath(model)))[0]
        where = os.fspath(model)
        proto = _read_model(where)
    elif isinstance(model, onnx.ModelProto):
        label = name or model.graph.name or "model"
        where = label
        proto = onnx.ModelProto.FromString(model.SerializeToString())
        file_conventions(proto)
    else:
        raise TypeError(f"import_onnx takes a path or an onnx.ModelProto, not {type(model).__name__}.")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer (images per inference), not {batch!r}.")
    _check_file(proto, where)
    onnx_fused.check_equations(proto)                   # before any shape inference, which some hang
    limit = tensor_byte_limit() if max_tensor_bytes is None else max_tensor_bytes
    if input_values:
        _fix_values(proto, input_values, where)
    _inline_constant_ifs(proto)                         # before the widening and the rewrites, which read nodes
    if half.holds_half(proto) or half.holds_double(proto):   # types that disagree (a float16 input of a float32
        _check_types(proto)                                    # graph), before widening
    if half.widen_half(proto, where, limit // 2):       # float16/bfloat16 files: float32, exactly
        _check_sizes(proto, where, limit)
    half.narrow_double(proto, where)                    # float64 files: float32, rounded
    _sort_nodes(proto)
    _normalize_perms(proto)
    initialized = {init.name for init in proto.graph.initializer}
    opened = _fix_inputs(proto, batch, dict(input_shapes or {}), where)
    empties.update({init.name: tuple(init.dims) for init in proto.graph.initializer if init.name not in initialized})
    _check_sizes(proto, where, limit)                   # the inputs' own sizes, before any rewrite reads them
    _check_shape_constants(proto, where, limit)
    refused = _rewrite_contrib(proto)                   # onnxruntime's com.microsoft operators, as standard nodes
    refused.update(onnx_fused.rewrite_onnx_fused(proto))  # ONNX's own fused operators of opsets 23+ (Attention)
    _check_sizes(proto, where, limit)
    model = _infer_shapes(_fold_constants(proto), check_type=True)
    check_axes(model, where)
    for _ in range(64):           # Shape, CastLike and Scan fold (unroll) once their inputs have static shapes, types,
        if not any(n.op_type in ("Shape", "CastLike", "Scan") for n in model.graph.node) and \
                not _empty_concat_inputs(model):   # an empty cache's Concat once its fellow input's shape is known
            break
        before = len(model.graph.node)
        model = _infer_shapes(_fold_constants(model))
        if len(model.graph.node) == before:
            break
    check_broadcasts(model, where)
    if refused:               # rewrites that needed a static shape only the folding gives (a position Slice by Shape)
        refused = {**_rewrite_contrib(model), **onnx_fused.rewrite_onnx_fused(model)}
        model = _infer_shapes(_fold_constants(model))
    _check_sizes(model, where, limit)
    masks.drop_dead_nodes(model)            # what a rewrite left unread (GroupQueryAttention's seqlens_k in a prompt)
    indices.widen_int32_ids(model)
    _split_sequences(model)
    drop_identities(model)
    if pointwise.split_variadic(model):        # Max/Min/Sum/Mean of one or of 3+ inputs, Sum/Mean of 2: two-input
        model = _infer_shapes(model)           # chains (ONNX's Gelu function adds with Sum)
    shapes = contrib.static_shapes(model)      # tiles_as_expands changes no shape constant_first_matmuls reads
    refused.update(col2im_as_conv_transposes(model, shapes))  # F.fold: a grouped ConvTranspose of one-hot weights
    rewritten = {next((o for o in n.output if o), "") for n in model.graph.node
                 if n.op_type in ("ConvTranspose", *RECURRENT_OPS)}
    volumes = {n.output[0] for n in model.graph.node if n.op_type == "Conv" and len(shapes.get(n.input[0], ())) == 5}
    refused.update(rewrite_conv3d(model, shapes))             # one 2-D Conv over the frames (video, volumes)
    rewritten |= volumes
    dilated = {n.output[0] for n in model.graph.node if n.op_type in ("Conv", "MaxPool", "AveragePool") and
               any(a.name == "dilations" and any(d != 1 for d in a.ints) for a in n.attribute)}
    refused.update(undilate_convs(model, shapes))             # the phase form (pools too), or the kernel's zeros
    rewritten |= dilated
    refused.update(rewrite_conv_transposes(model, shapes))    # one Conv of the output phases, interleaved
    refused.update(rewrite_conv3d(model, shapes))             # a 3-D ConvTranspose's phase Conv, over its frames
    refused.update(rewrite_recurrent(model, shapes))          # LSTM, GRU, RNN unrolled over their steps
    if rewritten - set(refused):              # their nodes of a constant (a zero initial state) fold
        model = _infer_shapes(_fold_constants(_infer_shapes(model)))
        shapes = contrib.static_shapes(model)
    if tiles_as_expands(model, shapes) | constant_first_matmuls(model, shapes) | scatters_as_gathers(model, shapes):
        masks.drop_dead_nodes(model)         # the empty updates of a scatter of none
        model = _infer_shapes(model)
        if flatten_scatter_chains(model, contrib.static_shapes(model)):   # chains of in-place assignments
            masks.drop_dead_nodes(model)
            model = _infer_shapes(model)
    sinks = score_chains.absorb_sinks(model, contrib.static_shapes(model))     # GPT-OSS's attention sinks
    log_softmaxes = score_chains.fuse_log_softmax(model, contrib.static_shapes(model))   # z - ReduceLogSumExp(z)
    if sinks or log_softmaxes:
        _sort_nodes(model)                 # a computed sink's nodes may come after the Softmax that now reads them
        model = _infer_shapes(model)
    for _ in range(16):                    # a mask added in one shape of the scores, the Softmax taken in another
        if not score_chains.normalize(model, contrib.static_shapes(model)):
            break
        _sort_nodes(model)
        model = _infer_shapes(model)
    model = _fuse_decompositions(model)
    routing = moe.rewrite_topk_routing(model, contrib.static_shapes(model))   # MoE routers' TopK
    if routing:
        _sort_nodes(model)
    shapes = contrib.static_shapes(model)      # the steps below add tensors and drop nodes, but change no shape
    masks.direct_token_ids(model, shapes)
    masks.drop_nan_guards(model)
    init_names = {i.name for i in model.graph.initializer}
    token_ids = {vi.name for vi in model.graph.input if vi.name not in init_names
                 and vi.type.tensor_type.elem_type == onnx.TensorProto.INT64
                 and (masks.indexes_a_table(model, vi.name, through=False) or
                      indices.only_indexes_tables(model, vi.name))}
    derived = id_masks.cut_id_masks(model, token_ids, shapes)     # ids != pad: a mask computed from the ids
    shapes.update({name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim) for name, vi in derived.items()})
    index_regions, index_nodes = indices.find_index_regions(model, token_ids, shapes, set(derived))
    indices.replace_index_regions(model, index_regions, index_nodes)
    mask_indices = indices.find_mask_index_regions(model, set(masks.mask_inputs(model, token_ids, integer=True)),
                                                   shapes)                 # OPT's cumsum(mask) positions
    if mask_indices:
        outs = {r.out for r in mask_indices}
        indices.replace_index_regions(model, mask_indices, {k for k, n in enumerate(model.graph.node)
                                                     if n.output and n.output[0] in outs})
        masks.drop_dead_nodes(model)
        index_regions += mask_indices
    pool_masks = pooling.find_mask_pools(model, token_ids, shapes, derived)
    taken = token_ids | set(pool_masks) | {r.ids for r in mask_indices}
    numeric = numeric_inputs.replace_numeric_inputs(model, taken, shapes, late=False)    # a diffusion timestep
    key_masks, region, mask_types = masks.find_key_masks(model, token_ids | {r.source for r in numeric.values()},
                                                         derived)
    mask_types = {**pool_masks, **mask_types}
    float_masks, float_region = masks.find_float_masks(model, shapes)
    key_masks, region = key_masks + float_masks, region | float_region
    _replace_mask_regions(model, key_masks, region)
    numeric_names = {r.source for r in numeric.values()}
    token_ids |= position_tables.tabulate_inputs(model, token_ids | set(mask_types) | numeric_names)  # position_ids
    numeric.update(numeric_inputs.replace_numeric_inputs(     # any other integer number; float inputs through a Sin
        model, token_ids | set(mask_types) | numeric_names | {m.source or m.mask for m in key_masks}, shapes,
        late=True))
    numeric_names = {r.source for r in numeric.values()}
    fused_regions = pointwise.fuse_pointwise_regions(model, shapes, frozenset(RULES))   # xIELU and the like
    score_chains.sink_outputs(model, sinks)
    _check_single_definitions(model, where)
    imp = _Importer(model, label)
    imp.opened = opened
    imp.pointwise_fns = fused_regions
    imp.routing = routing
    imp.sinks = sinks
    imp.key_masks = {m.out: m for m in key_masks}
    imp.index_fns = {r.out: r for r in index_regions}
    imp.numeric_fns = numeric
    imp.mask_pools = {n.output[0] for n in model.graph.node if n.op_type == "MaskPool"}
    g = imp.graph
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        unread = not any(vi.name in n.input for n in model.graph.node)   # an optional input the graph ignores
        integer = vi.name in mask_types or vi.name in token_ids or \
            (vi.name in numeric_names and vi.type.tensor_type.elem_type != onnx.TensorProto.FLOAT) or \
            (unread and vi.type.tensor_type.elem_type in masks.MASK_TYPES and
             vi.type.tensor_type.elem_type != onnx.TensorProto.FLOAT)
        if not integer and _DTYPES.get(vi.type.tensor_type.elem_type) != "float32":
            _raise_refused(model, where, refused)       # a refused fused node may be why a mask reaches no scores
            kind = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
            blocker = indices.index_blocker(model, vi.name)
            raise GraphError(f"Graph input {vi.name!r} has ONNX element type {kind}; only float32 inputs, int64 "
                             f"token ids that only index a constant embedding table (Gather), and attention masks "
                             f"of 0 and 1 (int64, int32, int8, uint8 or bool) that reach the attention scores "
                             f"through an Add or a Where are supported." +
                             (f" It reaches a table lookup, but {blocker}." if blocker else ""))
        g.add_tensor(vi.name, imp.shapes_of(vi.name), "int64" if integer else "float32")
        g.inputs.append(vi.name)
    _apply_rules(imp, model, where, refused)
    empty = [o for o in model.graph.output if imp.name(o.name) in imp.consts and
             np.asarray(imp.consts[imp.name(o.name)]).size == 0]
    if empty and len(empty) == len(model.graph.output):
        raise GraphError(f"The model {where} has no output with elements to compute: every graph output has a "
                         f"dimension of 0 (an input with a dimension of 0 gives that); give inputs of at least one "
                         f"element (--input-shape).")
    if empty:                  # an inlined If branch's placeholders (optimum's merged decoder with its cache)
        logging.getLogger("vta").warning("%s: graph output%s %s of no elements, constant in the branch compiled; "
                                         "the compiled model leaves %s out", where, "s" if len(empty) > 1 else "",
                                         ", ".join(repr(o.name) for o in empty), "them" if len(empty) > 1 else "it")
    for out in empty:
        model.graph.output.remove(out)
    constant = [o.name for o in model.graph.output if imp.name(o.name) in imp.consts]
    if constant:
        raise ConstantOutputError(f"The model {where} has graph output(s) {', '.join(map(repr, constant))} that are "
                                  f"constants (an initializer or a Constant node): it computes nothing for them, and "
                                  f"the lab compiles computations only.")
    g.outputs = [imp.name(o.name) for o in model.graph.output]
    for k, out in enumerate(model.graph.output):
        target = imp.name(out.name)
        if target != out.name and target not in g.inputs and g.outputs.count(target) == 1:
            g.rename_tensor(target, out.name)          # keep the ONNX output names for aliased outputs
        elif target in g.inputs and out.name not in g.tensors:    # an output that is an input unchanged (an
            info = g.tensors[target]                               # Identity, a scatter of no update): a copy of it
            g.add_tensor(out.name, info.shape, info.dtype, info.scale)   # under the output's own name
            g.add_node("Reshape", g.unique_name(f"{out.name}_copy", node=True), [target], [out.name],
                       shape=tuple(info.shape))
            g.outputs[k] = out.name
    mask_fills.lift_mask_fills(g)                  # Doge's dynamic mask: its fill applied by the Softmax
    g.prune_constants()
    g.validate()
    return g
