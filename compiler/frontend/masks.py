"""Runtime attention masks: a graph input of 0/1 values (an ``attention_mask [batch, keys]``) that reaches the
attention scores through element-wise and shape operations on constants.

Exporters of Hugging Face-style models and of ``torch.nn.functional.scaled_dot_product_attention`` turn a key padding
mask into a short chain on the mask input alone (``Unsqueeze``, ``Cast``, ``Sub`` from 1, ``Mul`` by -10000 or the
float minimum; or ``Not`` and ``Where`` with ``-inf``) that meets the scores in an ``Add`` (an additive mask) or a
``Where`` (a fill). :func:`find_key_masks` finds each such *region* (the nodes whose every input is the mask, a tensor
computed from it, or a constant) and the *exit* nodes where it meets an activation, and describes every exit as one
:class:`KeyMask`: for each of the two mask values, which elements keep the scores (plus an additive term) and the
fill of the others. It evaluates the region with ONNX's reference evaluator at an all-zero and an all-one mask, and
checks on seeded random 0/1 masks that each element of the result depends only on its own mask entry (the mask
reshaped to :attr:`KeyMask.expand` broadcasts against the scores). The importer then drops the region and imports
each exit as a ``KeyMask`` node (:mod:`.onnx_frontend`); the quantizer fuses it into the Softmax it feeds, which
applies it in float at run time (:func:`..qops.softmax`).

:func:`direct_token_ids` runs first: token ids that reach their embedding table through shape changes only (GPT-2's
``input_ids.view(-1, n)``) index the table directly, the lookup's output reshaped instead, so that the importer sees
an int64 input that only indexes a table.

:func:`find_float_masks` finds the other kind: a float32 input that reaches the scores through shape changes alone
and is added to them just before a Softmax (``nn.TransformerDecoderLayer``'s ``tgt_mask`` of 0 and -inf, an
additive mask or a position bias given at run time). It becomes an additive ``KeyMask``: added in float inside the
Softmax, never quantized.

Anything else a mask input feeds (a Mul that pools hidden states, a CumSum for position ids, an op outside
:data:`REGION_OPS`) is refused by :class:`MaskError` naming the node and why.
"""
from __future__ import annotations

import base64
import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..ir import Graph, GraphError
from ..qops import key_mask, reference_evaluator

__all__ = ["KeyMask", "MaskError", "find_key_masks", "find_float_masks", "direct_token_ids", "drop_nan_guards",
           "backward_slice", "region_model", "encode", "live_nodes", "drop_dead_nodes", "mask_inputs",
           "forward_region", "sample_masks", "tensor_readers",
           "is_mask_input", "is_float_mask_input", "is_numeric_input", "NUMERIC_RANGE", "only_input_fns",
           "numeric_input_problem",
           "indexes_a_table", "MASK_TYPES", "REGION_OPS", "token_range"]

MASK_TYPES: dict[int, type] = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32, TensorProto.BOOL: np.bool_,
                               TensorProto.UINT8: np.uint8, TensorProto.INT8: np.int8, TensorProto.FLOAT: np.float32}
"""The element types a mask input may have (ONNX type -> numpy dtype); its values must be 0 and 1. (A float32 input
is a mask only when its use says so: :func:`find_key_masks`.)"""

REGION_OPS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Identity", "Cast", "CastLike",
                        "Sub", "Add", "Mul", "Div", "Neg", "Abs", "Min", "Max", "Clip", "Not", "And", "Or", "Xor",
                        "Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Where", "Transpose", "Gather",
                        "GatherND", "Slice", "CumSum", "Concat", "Pad", "ReduceSum", "BitwiseAnd", "BitwiseOr",
                        "BitwiseXor", "BitwiseNot"})
"""The ops a mask region may contain: element-wise arithmetic, comparisons and logic (bitwise too: CPM-Ant's), shape
changes, and Gather or GatherND (a lookup of the mask's values, as Hugging Face's mask builders write it for the two
exporters; the element-wise check refuses any lookup that moves a mask entry to another key)."""

_EXIT_OPS = frozenset({"Add", "Sub", "Where"})
"""The ops where a mask meets the scores; an integer input that meets activations in none of them is no mask."""

_SAMPLES = 3
"""Seeded random 0/1 masks on which a region must be element-wise in the mask."""


class MaskError(GraphError):
    """A mask input is used in a way the lab does not import (the message names the input, the node and why)."""


@dataclass(frozen=True)
class KeyMask:
    """One exit of a mask region: ``out = where(m, A1, A0)``, ``m`` the mask reshaped to ``expand`` (nonzero:
    True) and ``Av = where(sel[v], x + add[v], fill[v])`` for mask value ``v``; ``x`` the scores.

    ``sel`` bool, ``add`` and ``fill`` float32, each ``[2, *shape]`` with ``shape`` broadcasting against ``x``."""

    node: str
    """The exit node's name (or its output's, when unnamed)."""
    mask: str
    x: str
    out: str
    expand: tuple[int, ...]
    sel: np.ndarray
    add: np.ndarray
    fill: np.ndarray
    additive: bool = False
    """A float32 input added to the scores as it is (``x + mask.reshape(expand)``; :func:`find_float_masks`)."""
    source: str = ""
    """With ``fn``: the mask input the term is computed from (``mask`` is then the term, a new float32 tensor)."""
    fn: str = ""
    """A term not element-wise in one mask entry (DeBERTa's ``mask[q] * mask[k]``): the base64 ONNX model of the
    region computing the additive float32 term ``mask`` from ``source`` at run time (a ``MaskFn`` node); the
    KeyMask is then ``additive``."""

    def apply(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """``out`` for scores ``x`` (any float dtype, computed in it) and the mask's values."""
        return key_mask(x, mask, self.expand, self.sel, self.add, self.fill, self.additive)


_ID_SHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})


def _id_step(node: onnx.NodeProto, tensor: str) -> bool:
    """Whether ``node`` passes token ids ``tensor`` on unchanged in value: a shape op of :data:`_ID_SHAPE_OPS`, or a
    Cast to int32 or int64 (tf2onnx's ``Cast(int64 -> int32)`` before the lookup)."""
    if not node.input or node.input[0] != tensor:
        return False
    if node.op_type == "Cast":
        return any(a.name == "to" and a.i in (TensorProto.INT32, TensorProto.INT64) for a in node.attribute)
    return node.op_type in _ID_SHAPE_OPS


def indexes_a_table(model: onnx.ModelProto, name: str, *, through: bool = True) -> bool:
    """Whether tensor ``name`` (token ids) is, directly or (``through``) through :func:`_id_step` nodes, the indices
    of a Gather from an initializer table ``[rows, width]`` (a lookup in a 1-D table is a mask's; its other uses are
    not looked at: they must be index arithmetic, :mod:`.indices`)."""
    tables = {i.name for i in model.graph.initializer if len(i.dims) == 2}
    users = tensor_readers(model)
    frontier, seen = [name], set()
    while frontier:
        tensor = frontier.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        for node in users.get(tensor, []):
            if node.op_type == "Gather" and node.input[1:2] == [tensor] and node.input[0] in tables:
                return True
            if through and _id_step(node, tensor):
                frontier.append(node.output[0])
    return False


def tensor_readers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes that read it, in graph order."""
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for t in node.input:
            users.setdefault(t, []).append(node)
    return users


def direct_token_ids(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
    """In place: for every int64 graph input whose uses are chains of :func:`_id_step` nodes each ending in a Gather
    on axis 0 of an initializer table ``[rows, width]``, make each such Gather read the input itself and reshape its
    output to the shape it had (``shapes``: the static shapes of the model's values; an input with a lookup whose
    output shape is unknown is left alone). The chains' nodes go (only the chains and the lookups read them)."""
    inits = {i.name for i in model.graph.initializer}
    tables = {i.name for i in model.graph.initializer if len(i.dims) == 2}
    users = tensor_readers(model)
    for vi in model.graph.input:
        if vi.name in inits or vi.type.tensor_type.elem_type != TensorProto.INT64:
            continue
        chain: list[onnx.NodeProto] = []
        gathers: list[onnx.NodeProto] = []
        frontier, ok = [vi.name], True
        while frontier and ok:
            tensor = frontier.pop()
            for node in users.get(tensor, []):
                if _id_step(node, tensor):
                    chain.append(node)
                    frontier.append(node.output[0])
                elif node.op_type == "Gather" and node.input[0] in tables and node.input[1] == tensor and \
                        not any(a.name == "axis" and a.i != 0 for a in node.attribute):
                    gathers.append(node)
                else:
                    ok = False
        if not ok or not chain or not all(g.output[0] in shapes for g in gathers):
            continue
        producer = {n.output[0]: n for n in chain}
        paths = {id(g): _id_path(producer, g.input[1], vi.name) for g in gathers}
        if any(p is None or any(n.op_type == "Transpose" and not all(n.output[0] in shapes for n in p) for n in p)
               for p in paths.values()):
            continue                       # a transposed chain replays its steps: their shapes must be known
        rewired = {id(g) for g in gathers if g.input[1] != vi.name}
        new_nodes: list[onnx.NodeProto] = []
        for node in model.graph.node:
            if any(node is c for c in chain):
                continue
            if id(node) in rewired:
                out = node.output[0]
                looked = f"{out}_by_ids"
                table = next(i for i in model.graph.initializer if i.name == node.input[0])
                ids_shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                model.graph.value_info.append(helper.make_tensor_value_info(
                    looked, table.data_type, ids_shape + list(table.dims[1:])))
                new_nodes.append(helper.make_node("Gather", [node.input[0], vi.name], [looked], name=node.name,
                                                  axis=0))
                new_nodes += _replayed(model, paths[id(node)] or [], looked, out, shapes, list(table.dims[1:]),
                                       tuple(ids_shape + list(table.dims[1:])), table.data_type)
                continue
            new_nodes.append(node)
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)


def _id_path(producer: dict[str, onnx.NodeProto], tensor: str, source: str) -> list[onnx.NodeProto] | None:
    """The chain nodes from the input ``source`` to ``tensor``, in order (None when ``tensor`` is not reached from
    it through them alone)."""
    path: list[onnx.NodeProto] = []
    while tensor != source:
        node = producer.get(tensor)
        if node is None:
            return None
        path.append(node)
        tensor = node.input[0]
    return path[::-1]


def _replayed(model: onnx.ModelProto, path: list[onnx.NodeProto], looked: str, out: str,
              shapes: dict[str, tuple[int, ...]], width: list[int], dims: tuple[int, ...], elem: int
              ) -> list[onnx.NodeProto]:
    """The nodes giving ``out`` (a lookup by the ids after ``path``) from ``looked`` (the lookup by the ids
    themselves, of shape ``dims`` and element type ``elem``): one Reshape to ``out``'s shape when ``path`` only
    reshapes or casts, else each step again on the looked-up rows (a Transpose keeps the table's axes last, a shape
    step reshapes to its output's shape and ``width``)."""
    steps: list[tuple[str, tuple[int, ...]]] = []
    if any(n.op_type == "Transpose" for n in path):
        for n in path:
            if n.op_type == "Transpose":
                rank = len(shapes[n.input[0]]) if n.input[0] in shapes else len(shapes[n.output[0]])
                perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), list(range(rank))[::-1])
                steps.append(("Transpose", tuple(int(p) % rank for p in perm) + tuple(range(rank, rank + len(width)))))
            elif n.op_type != "Cast" and n.op_type != "Identity":
                steps.append(("Reshape", tuple(shapes[n.output[0]]) + tuple(width)))
    if not steps or steps[-1][0] == "Transpose":
        steps.append(("Reshape", tuple(shapes[out])))
    nodes: list[onnx.NodeProto] = []
    current = looked
    for k, (op, value) in enumerate(steps):
        target = out if k == len(steps) - 1 else f"{out}_step{k}"
        if op == "Transpose":
            nodes.append(helper.make_node("Transpose", [current], [target], name=f"{out}_transpose{k}", perm=value))
            dims = tuple(dims[p] for p in value)
        else:
            shape_name = f"{out}_shape{k}"
            model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), shape_name))
            nodes.append(helper.make_node("Reshape", [current, shape_name], [target], name=f"{out}_reshape{k}"))
            dims = value
        if target != out:                   # no shape inference runs after this step: its value info
            model.graph.value_info.append(helper.make_tensor_value_info(target, elem, list(dims)))
        current = target
    return nodes


def drop_nan_guards(model: onnx.ModelProto) -> None:
    """In place: ``Where(IsNaN(p), 0, p)`` with ``p`` a Softmax's output (the guard torch's exporter puts after a
    masked ``scaled_dot_product_attention`` for rows masked out whole) becomes ``Identity(p)``: the lab's softmax
    gives such rows 0 itself (:func:`..qops.softmax`). The IsNaN goes when nothing else reads it. So does
    ``Where(c, 0, Softmax(Where(c, -inf, s)))``, the same condition ``c`` filling the scores with -inf and then
    their probabilities with 0 (CPM-Ant; and ``Where(c, Softmax(Where(c, s, -inf)), 0)``, ``jax.nn.softmax(s,
    where=c)`` as jax2onnx writes it): the probabilities are 0 there already; and ``Where(ReduceMax(B, -1) ==
    -inf, 0, Softmax(s + B))``, rows whose additive mask ``B`` is -inf throughout (ONNX's Attention function): the
    lab's softmax gives them 0 itself. The ReduceMax and the test go when nothing else reads them."""
    producer = {o: n for n in model.graph.node for o in n.output}
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    readers = tensor_readers(model)
    floats = {vi.name for vi in model.graph.input if vi.type.tensor_type.elem_type == TensorProto.FLOAT}
    nodes = list(model.graph.node)
    guards: dict[int, onnx.NodeProto] = {}
    dropped: set[str] = set()
    for index, node in enumerate(nodes):
        if node.op_type != "Where" or len(node.input) != 3:
            continue
        test = producer.get(node.input[0])
        zero_at = next((k for k in (1, 2) if _is_zero(consts.get(node.input[k]))), None)
        if zero_at is None:
            continue
        probs = node.input[3 - zero_at]
        source = producer.get(_through_casts(producer, probs))
        if source is None or source.op_type != "Softmax":
            continue
        if zero_at == 2:                    # jax.nn.softmax(where=c): Where(c, Softmax(Where(c, s, -inf)), 0)
            if not _filled_before(producer, consts, source, node.input[0], fill_at=2):
                continue
        elif not (test is not None and test.op_type == "IsNaN" and test.input[0] == probs) and \
                not _filled_before(producer, consts, source, node.input[0]) and \
                not _masked_rows(nodes, producer, consts, source, test, floats):
            continue
        guards[index] = helper.make_node("Identity", [probs], list(node.output), name=node.name)
        if test is not None and test.op_type == "IsNaN" and len(readers.get(node.input[0], [])) == 1:
            dropped.add(test.output[0])
    if not guards:
        return
    kept = [guards.get(k, node) for k, node in enumerate(model.graph.node)
            if not (node.op_type == "IsNaN" and node.output[0] in dropped)]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    drop_dead_nodes(model)                      # a row-max test nothing reads any more


def _through_casts(producer: dict[str, onnx.NodeProto], name: str, float_only: bool = False) -> str:
    """``name`` followed back through Identity, Cast and CastLike nodes to the tensor they convert (with
    ``float_only``, through Identity nodes and Casts to float32 alone)."""
    node = producer.get(name)
    while node is not None and (node.op_type == "Identity" or node.op_type == "CastLike" and not float_only or
                                node.op_type == "Cast" and (not float_only or any(
                                    a.name == "to" and a.i == TensorProto.FLOAT for a in node.attribute))):
        name = node.input[0]
        node = producer.get(name)
    return name


def _masked_rows(nodes: list[onnx.NodeProto], producer: dict[str, onnx.NodeProto], consts: dict[str, np.ndarray],
                 softmax: onnx.NodeProto, test: onnx.NodeProto | None, floats: set[str]) -> bool:
    """Whether ``test`` is ``ReduceMax(B, last axis) == -inf`` and ``softmax`` reads ``s + B`` (through identity
    conversions), ``B`` computed by ``nodes`` (the graph's, in order) from constants and the float32 graph inputs
    ``floats`` alone: the test holds exactly on rows the mask fills with -inf throughout."""
    if test is None or test.op_type != "Equal":
        return False
    sides = [_through_casts(producer, t) for t in test.input]
    inf = [k for k, t in enumerate(sides) if t in consts and consts[t].size == 1 and
           bool(np.isneginf(consts[t].astype(np.float64).reshape(())))]
    if len(inf) != 1:
        return False
    reduce = producer.get(sides[1 - inf[0]])
    if reduce is None or reduce.op_type != "ReduceMax":
        return False
    axes = [a.ints for a in reduce.attribute if a.name == "axes"]
    keep = [a.i for a in reduce.attribute if a.name == "keepdims"]
    if len(reduce.input) > 1 and reduce.input[1]:
        if reduce.input[1] not in consts:
            return False
        axes = [consts[reduce.input[1]].reshape(-1).tolist()]
    if not axes or len(axes[0]) != 1 or axes[0][0] != -1 or (keep and keep[0] == 0):
        return False
    add = producer.get(_through_casts(producer, softmax.input[0]))
    softmax_axis = [a.i for a in softmax.attribute if a.name == "axis"]
    if add is None or add.op_type != "Add" or reduce.input[0] not in add.input or \
            (softmax_axis and softmax_axis[0] != -1):
        return False
    # a float mask only: a mask computed from integers (a KV cache's lengths) is read by the mask import, which
    # takes 0/1 masks alone and refuses this one with its reason
    _, upstream = backward_slice(nodes, [reduce.input[0]])
    return all(t in consts or t in producer or t in floats for t in upstream)


def _is_zero(value: np.ndarray | None) -> bool:
    """Whether ``value`` (a constant, or None) is one 0."""
    return value is not None and value.size == 1 and float(value.reshape(())) == 0.0


def _filled_before(producer: dict[str, onnx.NodeProto], consts: dict[str, np.ndarray], softmax: onnx.NodeProto,
                   condition: str, fill_at: int = 1) -> bool:
    """Whether ``softmax`` reads ``Where(condition, -inf, s)`` (through identity Casts): its rows are 0 wherever
    ``condition`` holds; with ``fill_at`` 2, ``Where(condition, s, -inf)``: 0 wherever it does not."""
    fill = producer.get(_through_casts(producer, softmax.input[0], float_only=True))
    value = consts.get(fill.input[fill_at]) if fill is not None and fill.op_type == "Where" and \
        len(fill.input) == 3 else None
    return value is not None and fill is not None and fill.input[0] == condition and value.size == 1 and \
        bool(np.isneginf(value.reshape(())))


def sample_masks(shape: tuple[int, ...], dtype: Any) -> list[np.ndarray]:
    """The masks a region is checked on: all zeros, all ones, and :data:`_SAMPLES` seeded random 0/1 masks."""
    rng = np.random.default_rng(0)
    samples = [np.zeros(shape, dtype), np.ones(shape, dtype)]
    return samples + [rng.integers(0, 2, shape).astype(dtype) for _ in range(_SAMPLES)]


def mask_inputs(model: onnx.ModelProto, embedding_only: set[str], *, integer: bool = False
                ) -> dict[str, onnx.ValueInfoProto]:
    """The graph inputs that may be masks: of a :data:`MASK_TYPES` type (only the integer and bool ones with
    ``integer``), not token ids (``embedding_only``), by name."""
    inits = {i.name for i in model.graph.initializer}
    return {vi.name: vi for vi in model.graph.input
            if vi.name not in inits and vi.name not in embedding_only
            and vi.type.tensor_type.elem_type in MASK_TYPES
            and not (integer and vi.type.tensor_type.elem_type == TensorProto.FLOAT)}


def forward_region(model: onnx.ModelProto, source: str, consts: Mapping[str, Any],
                   ops: frozenset[str] | None = None) -> tuple[set[str], list[onnx.NodeProto]]:
    """The tensors computed from the tensor ``source`` and constants alone (``source`` among them), and those nodes
    in graph order; with ``ops``, only through default-domain nodes of those op types."""
    region: set[str] = {source}
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if ops is not None and (node.op_type not in ops or node.domain not in ("", "ai.onnx")):
            continue
        if any(t in region for t in node.input) and all(not t or t in region or t in consts for t in node.input):
            nodes.append(node)
            region.update(node.output)
    return region, nodes


def find_key_masks(model: onnx.ModelProto, embedding_only: set[str],
                   derived: Mapping[str, onnx.ValueInfoProto] | None = None
                   ) -> tuple[list[KeyMask], set[int], dict[str, str]]:
    """The key masks of ``model`` (shapes inferred, constants folded): a graph input of an integer or bool type of
    :data:`MASK_TYPES`, not in ``embedding_only`` (token ids), whose values meet an activation in an Add, Sub or
    Where is a mask, and must reach activations only through a region ending in exits of the forms above. (Any
    other integer input is no mask: the importer refuses its type.) A float32 input is a 0/1 mask too when its
    region, taken alone, has only :data:`REGION_OPS`, changes values (not only shapes: that is a float mask,
    :func:`find_float_masks`) and meets activations only in Adds or Wheres that feed a Softmax (the scores); else
    it is an activation. Returns the exits as
    :class:`KeyMask` (in graph order), the index of every region node in ``model.graph.node`` (to drop) and the
    mask inputs (name -> ONNX type name). :class:`MaskError` for an integer mask used otherwise. ``derived``: masks
    computed from the token ids (:func:`.id_masks.cut_id_masks`), candidates as the inputs are."""
    candidates = {**mask_inputs(model, embedding_only), **(derived or {})}
    if not candidates:
        return [], set(), {}
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    ints = {n: vi for n, vi in candidates.items() if vi.type.tensor_type.elem_type != TensorProto.FLOAT}
    found, region_index, inputs = _find(model, ints, consts, soft=False) if ints else ([], set(), {})
    for name, vi in candidates.items():
        if name not in ints:
            more, indices, kept = _find(model, {name: vi}, consts, soft=True)
            found, region_index, inputs = found + more, region_index | indices, {**inputs, **kept}
    found.sort(key=lambda m: _position(model, m.out))
    types = {name: TensorProto.DataType.Name(vi.type.tensor_type.elem_type) for name, vi in inputs.items()}
    return found, region_index, types


def _before_softmax(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether ``node``'s output feeds only a Softmax, directly or through one more Add or Where (a causal mask)."""
    for _ in range(2):
        users = [n for n in model.graph.node if node.output[0] in n.input]
        if len(users) != 1:
            return False
        if users[0].op_type == "Softmax":
            return True
        if users[0].op_type not in ("Add", "Where"):
            return False
        node = users[0]
    return False


def _position(model: onnx.ModelProto, tensor: str) -> int:
    return next((k for k, n in enumerate(model.graph.node) if tensor in n.output), 0)


def _find(model: onnx.ModelProto, inputs: dict[str, onnx.ValueInfoProto], consts: dict[str, np.ndarray], *,
          soft: bool) -> tuple[list[KeyMask], set[int], dict[str, onnx.ValueInfoProto]]:
    """:func:`find_key_masks` over the candidate mask ``inputs``: the exits, the region nodes' indices and the
    inputs that are masks. ``soft`` (one float input): any problem means it is no mask (empty results), not a
    :class:`MaskError`; and so does a region that only reshapes."""
    region: set[str] = set(inputs)
    walked: list[tuple[int, onnx.NodeProto]] = []
    exits: list[onnx.NodeProto] = []
    problems: dict[str, str] = {}                                # mask input -> the first problem on its path
    source: dict[str, str] = {name: name for name in inputs}     # region tensor -> its mask input
    for index, node in enumerate(model.graph.node):
        touched = [t for t in node.input if t in region]
        if not touched or (node.op_type == "MaskPool" and node.input[1:] == touched) or \
                (node.op_type == "IndexFn" and list(node.input) == touched):  # a pooling, indices read the mask
            continue
        masks = sorted({source[t] for t in touched})
        where = f"node {node.name or node.output[0]!r} ({node.op_type})"
        mask = masks[0]
        if len(masks) > 1:
            for m in masks:
                problems.setdefault(m, f"mask inputs {', '.join(masks)} meet in {where}; each mask must reach the "
                                       f"scores on its own")
        if all(not t or t in region or t in consts for t in node.input):
            if node.op_type not in REGION_OPS:
                problems.setdefault(mask, f"the mask input {mask!r} reaches {where}, which the lab does not import: "
                                          f"a mask may pass only through {', '.join(sorted(REGION_OPS))} on the way "
                                          f"to the attention scores")
            walked.append((index, node))
            for out in node.output:
                region.add(out)
                source[out] = mask
        else:
            exits.append(node)
    for name in sorted(region & {o.name for o in model.graph.output}):
        problems.setdefault(source[name], f"graph output {name!r} is computed from the mask input {source[name]!r} "
                                          f"alone; the lab computes outputs from activations")
    real = {source[t] for e in exits if e.op_type in _EXIT_OPS for t in e.input if t in region}
    if soft and (problems or not real or all(n.op_type in _FLOAT_SHAPE_OPS for _, n in walked)
                 or not all(e.op_type in _EXIT_OPS and _before_softmax(model, e) for e in exits)):
        return [], set(), {}
    for mask in sorted(real):
        if mask in problems:
            raise MaskError(problems[mask])
    inputs = {name: vi for name, vi in inputs.items() if name in real}
    region_nodes = [node for _, node in walked if source[node.output[0]] in real]
    region_index = {index for index, node in walked if source[node.output[0]] in real}
    exits = [e for e in exits if any(source[t] in real for t in e.input if t in region)]
    try:
        found = [_exit(model, node, region, source, region_nodes, inputs, consts) for node in exits]
    except MaskError:
        if soft:
            return [], set(), {}
        raise
    return found, region_index, inputs


def _exit(model: onnx.ModelProto, node: onnx.NodeProto, region: set[str], source: dict[str, str],
          region_nodes: list[onnx.NodeProto], inputs: dict[str, onnx.ValueInfoProto],
          consts: dict[str, np.ndarray]) -> KeyMask:
    """The :class:`KeyMask` of exit ``node``, or :class:`MaskError`."""
    label = node.name or node.output[0]
    where = f"node {label!r} ({node.op_type})"
    mask = next(source[t] for t in node.input if t in region)
    ops = [t for t in node.input if t and t not in region and t not in consts]
    if len(ops) != 1:
        raise MaskError(f"the mask input {mask!r} meets {len(ops)} activations in {where}; a mask meets the scores "
                        f"alone")
    x = ops[0]
    if node.op_type == "Add" and len(node.input) == 2:
        term = node.input[1] if node.input[0] == x else node.input[0]
        parts = {"term": term}
    elif node.op_type == "Sub" and len(node.input) == 2 and node.input[0] == x:
        parts = {"term": node.input[1]}
    elif node.op_type == "Where" and node.input[0] in region and x in node.input[1:]:
        parts = {"cond": node.input[0], "other": node.input[2] if node.input[1] == x else node.input[1]}
    else:
        raise MaskError(f"the mask input {mask!r} reaches the activation {x!r} in {where}; the lab imports a "
                        f"runtime mask only as an additive term (Add, or Sub from the scores) or as the condition "
                        f"of a Where that fills the scores, before a Softmax")
    wanted = [t for t in parts.values() if t in region]
    vi = inputs[mask]
    shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    if not shape or min(shape) < 1:
        raise MaskError(f"the mask input {mask!r} has no static shape; give it with --input-shape {mask}=...")
    dtype = MASK_TYPES[vi.type.tensor_type.elem_type]
    samples = sample_masks(shape, dtype)
    values = _evaluate(model, region_nodes, mask, vi, wanted, consts, samples)
    def at(tensor: str, k: int) -> np.ndarray:
        return values[tensor][k] if tensor in values else consts[tensor]
    sides = []
    for k in range(len(samples)):
        if "term" in parts:
            term = at(parts["term"], k).astype(np.float64)
            term = -term if node.op_type == "Sub" else term
            sides.append((np.ones(term.shape, bool), term, np.zeros(term.shape)))
        else:
            cond = at(parts["cond"], k).astype(bool)
            keep = cond if node.input[1] == x else ~cond
            other = at(parts["other"], k).astype(np.float64)
            sides.append((keep, np.zeros(other.shape), other))
    out_shape = np.broadcast_shapes(*(a.shape for side in sides for a in side))
    sel, add, fill = (np.stack([np.broadcast_to(sides[v][i], out_shape) for v in (0, 1)]) for i in range(3))
    expand = None if len(shape) == 1 else _expand(shape, out_shape, sides, sel, add, fill, samples)
    if expand is None:   # a 1-D input may hold lengths ([batch] valid keys), not 0/1: the region's own nodes run
        return _runtime_term(model, node, parts, x, mask, where, label, region_nodes, vi, consts, sides, out_shape)
    return KeyMask(label, mask, x, node.output[0], expand, sel.astype(bool), add.astype(np.float32),
                   fill.astype(np.float32))


_HUGE = -1e30
"""A Where's fill at or below this (float32's min, -inf) masks out as an added term would: ``x + fill == fill``."""


def _runtime_term(model: onnx.ModelProto, node: onnx.NodeProto, parts: dict[str, str], x: str, mask: str,
                  where: str, label: str, region_nodes: list[onnx.NodeProto], vi: onnx.ValueInfoProto,
                  consts: dict[str, np.ndarray], sides: Sequence[tuple[np.ndarray, ...]],
                  out_shape: tuple[int, ...]) -> KeyMask:
    """The KeyMask of an exit whose term depends on more than one mask entry (each score on its query's and its
    key's, as DeBERTa's ``mask[:, None, None, :] * mask[:, None, :, None]``): an additive float32 term computed
    from the mask at run time by the region's own nodes (``fn``). An Add or Sub gives its term; a Where that fills
    the scores gives ``where(keep, 0, fill)``, only where every fill is at or below :data:`_HUGE` (so that adding it
    masks as filling does)."""
    term = f"{node.output[0]}_mask_term"
    extra: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    if "term" in parts:
        cast = helper.make_node("Cast", [parts["term"]], [f"{term}_f"], to=TensorProto.FLOAT)
        extra.append(cast)
        extra.append(helper.make_node("Neg" if node.op_type == "Sub" else "Identity", [f"{term}_f"], [term]))
        wanted = [parts["term"]]
    else:
        filled = [fill[~keep] for keep, fill in (np.broadcast_arrays(side[0], side[2]) for side in sides)]
        if any((f > _HUGE).any() for f in filled):
            raise MaskError(f"the mask input {mask!r} fills the scores in {where} with values above {_HUGE:g}, "
                            f"from a term that depends on more than one mask entry; the lab takes such a term only "
                            f"as an addition or a fill that masks out (float32's min, -inf)")
        zero = numpy_helper.from_array(np.array(0.0, np.float32), f"{term}_zero")
        inits.append(zero)
        other = parts["other"]
        if other not in consts:
            extra.append(helper.make_node("Cast", [other], [f"{term}_other"], to=TensorProto.FLOAT))
            other = f"{term}_other"
        else:
            inits.append(numpy_helper.from_array(np.asarray(consts[other], np.float32), f"{term}_other"))
            other = f"{term}_other"
        branches = [zero.name, other] if node.input[1] == x else [other, zero.name]
        extra.append(helper.make_node("Where", [parts["cond"], *branches], [term]))
        wanted = [parts["cond"]] + ([parts["other"]] if parts["other"] not in consts else [])
    encoded = encode(region_model(model, region_nodes, vi, wanted,
                                  [helper.make_tensor_value_info(term, TensorProto.FLOAT, list(out_shape))], consts,
                                  extra, inits))
    unused = np.zeros((2, 1), np.float32)
    return KeyMask(label, term, x, node.output[0], tuple(out_shape), unused.astype(bool), unused, unused,
                   additive=True, source=mask, fn=encoded)


def _expand(shape: tuple[int, ...], out_shape: tuple[int, ...], sides: Sequence[tuple[np.ndarray, ...]],
            sel: np.ndarray, add: np.ndarray, fill: np.ndarray, samples: list[np.ndarray]) -> tuple[int, ...] | None:
    """A reshape of the mask (its axes in order, ones between) under which every sample's sides equal the
    all-zero/all-one sides chosen by the sample's entries; None when there is none."""
    rank = len(out_shape)
    for axes in itertools.combinations(range(rank), len(shape)):
        expand = [1] * rank
        for axis, size in zip(axes, shape):
            expand[axis] = size
        if any(e != 1 and o not in (1, e) for e, o in zip(expand, out_shape)):
            continue
        ok = True
        for k in range(2, len(samples)):
            if samples[k].size != math.prod(expand):
                ok = False
                break
            m = samples[k].reshape(expand) != 0
            for got, pair in zip(sides[k], (sel, add, fill)):
                try:                             # the mask's reshape stays within the scores: no axes crossed
                    full = np.broadcast_shapes(tuple(out_shape), np.shape(got), np.shape(pair[0]), np.shape(pair[1]))
                    crossed = np.broadcast_shapes(m.shape, full) != full
                except ValueError:
                    crossed = True
                if crossed:
                    ok = False
                    break
                want = np.where(m, pair[1], pair[0])
                if not np.array_equal(np.broadcast_to(got, want.shape), want):
                    ok = False
                    break
            if not ok:
                break
        if ok:
            return tuple(expand)
    return None


def backward_slice(nodes: list[onnx.NodeProto], wanted: list[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    """The nodes of ``nodes`` (in graph order) that ``wanted`` depends on, in order, and every tensor they and
    ``wanted`` read (graph inputs and constants among them)."""
    needed = set(wanted)
    keep: list[onnx.NodeProto] = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(t for t in node.input if t)
    keep.reverse()
    return keep, needed


def live_nodes(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` without those whose every output nothing reads (repeatedly: a chain that fed only removed nodes);
    ``outputs`` (the graph's) are read."""
    while True:
        read = {t for n in nodes for t in n.input} | outputs
        alive = [n for n in nodes if any(o in read for o in n.output if o)]
        if len(alive) == len(nodes):
            return nodes
        nodes = alive


def drop_dead_nodes(model: onnx.ModelProto) -> None:
    """Drop, in place, the nodes of ``model`` whose outputs nothing reads (:func:`live_nodes`)."""
    kept = live_nodes(list(model.graph.node), {o.name for o in model.graph.output})
    if len(kept) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(kept)


def region_model(model: onnx.ModelProto, nodes: list[onnx.NodeProto],
                 source: onnx.ValueInfoProto | Sequence[onnx.ValueInfoProto], wanted: list[str],
                 outputs: list[onnx.ValueInfoProto], consts: Mapping[str, np.ndarray | onnx.TensorProto],
                 extra: Sequence[onnx.NodeProto] = (), inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """The part of ``model``'s graph that computes ``wanted`` from the graph input ``source`` (or inputs): the nodes of
    ``nodes`` they depend on (:func:`backward_slice`), then ``extra`` nodes, with the constants they read (from
    ``consts``, arrays or initializers) and ``inits``, giving ``outputs``; at the model's default-domain opset (17
    when it names none). What IndexFn, MaskPool and MaskFn nodes carry, and what the region checks evaluate."""
    keep, needed = backward_slice(nodes, wanted)
    tensors = [c if isinstance(c, onnx.TensorProto) else numpy_helper.from_array(np.asarray(c), t)
               for t, c in sorted((t, consts[t]) for t in needed if t in consts)]
    sources = [source] if isinstance(source, onnx.ValueInfoProto) else list(source)
    graph = helper.make_graph(keep + list(extra), "region", sources, outputs, tensors + list(inits))
    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", 17)])


def encode(model: onnx.ModelProto) -> str:
    """``model`` serialized as base64 text (a node attribute)."""
    return base64.b64encode(model.SerializeToString()).decode("ascii")


def _evaluate(model: onnx.ModelProto, nodes: list[onnx.NodeProto], mask: str, vi: onnx.ValueInfoProto,
              wanted: list[str], consts: dict[str, np.ndarray], samples: list[np.ndarray]
              ) -> dict[str, list[np.ndarray]]:
    """The region tensors ``wanted`` (computed from ``mask`` alone) for each sample mask, by ONNX's reference
    evaluator on the region's nodes."""
    if not wanted:
        return {}
    keep, needed = backward_slice(nodes, wanted)
    if any(t not in consts and t != mask and not any(t in n.output for n in keep) for t in needed):
        raise MaskError(f"the region of the mask input {mask!r} reads another graph input")
    sub = region_model(model, keep, vi, wanted,
                       [helper.make_tensor_value_info(t, TensorProto.UNDEFINED, None) for t in wanted], consts)
    try:
        run = reference_evaluator(sub)
        results: list[Any] = [run.run(None, {mask: sample}) for sample in samples]
    except Exception as err:  # noqa: BLE001 - the evaluator's own errors, on a user's file
        raise MaskError(f"the region of the mask input {mask!r} could not be evaluated ({type(err).__name__}: "
                        f"{err})") from None
    return {t: [np.asarray(r[i]) for r in results] for i, t in enumerate(wanted)}


_FLOAT_SHAPE_OPS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Identity", "Cast"})


def find_float_masks(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> tuple[list[KeyMask], set[int]]:
    """The float32 graph inputs of ``model`` whose every use reaches, through :data:`_FLOAT_SHAPE_OPS` on constants
    (a Cast only to FLOAT), an Add with an activation whose one consumer is a Softmax: each such Add as an additive
    :class:`KeyMask` (``expand``: the input reshaped so that it broadcasts as the chain made it), and the indices of
    the chains' nodes in ``model.graph.node``. Any other float input is an activation (left alone)."""
    inits = {i.name for i in model.graph.initializer}
    users = tensor_readers(model)
    index = {id(n): k for k, n in enumerate(model.graph.node)}
    outputs = {o.name for o in model.graph.output}
    found: list[KeyMask] = []
    drop: set[int] = set()
    for vi in model.graph.input:
        if vi.name in inits or vi.type.tensor_type.elem_type != TensorProto.FLOAT or vi.name not in shapes:
            continue
        chain, exits, frontier, ok = [], [], [vi.name], True
        while frontier and ok:
            tensor = frontier.pop()
            if tensor in outputs:
                ok = False
            for node in users.get(tensor, []):
                rest = [t for t in node.input[1:] if t]
                if node.op_type in _FLOAT_SHAPE_OPS and node.input[0] == tensor and all(t in inits for t in rest) \
                        and not (node.op_type == "Cast" and any(a.name == "to" and a.i != TensorProto.FLOAT
                                                                for a in node.attribute)):
                    chain.append(node)
                    frontier.append(node.output[0])
                elif node.op_type == "Add" and len(node.input) == 2 and tensor in node.input and \
                        _feeds_softmax(node, users, outputs):
                    other = node.input[1] if node.input[0] == tensor else node.input[0]
                    ok = ok and other not in inits and other in shapes and shapes[other] == shapes.get(node.output[0])
                    exits.append((node, tensor, other))
                else:
                    ok = False
        if not ok or not exits:
            continue
        expands = [_float_expand(model, chain, vi, term, shapes) for _, term, _ in exits]
        if any(e is None for e in expands):
            continue
        none = np.zeros((2, 1), np.float32)
        found.extend(KeyMask(node.name or node.output[0], vi.name, scores, node.output[0], expand,
                             np.ones((2, 1), bool), none, none, additive=True)
                     for (node, _, scores), expand in zip(exits, expands) if expand is not None)
        drop.update(index[id(n)] for n in chain)
    return found, drop


def _feeds_softmax(node: onnx.NodeProto, users: dict[str, list[onnx.NodeProto]], outputs: set[str]) -> bool:
    """Whether ``node``'s output is read by one Softmax alone, through Identity nodes and Casts to float32 (ONNX's
    Attention function casts the masked scores to the softmax precision)."""
    while True:
        after = users.get(node.output[0], [])
        if node.output[0] in outputs or len(after) != 1:
            return False
        node = after[0]
        if node.op_type == "Softmax":
            return True
        if not (node.op_type == "Identity" or node.op_type == "Cast" and
                all(a.i == TensorProto.FLOAT for a in node.attribute if a.name == "to")):
            return False


def _float_expand(model: onnx.ModelProto, chain: list[onnx.NodeProto], vi: onnx.ValueInfoProto, term: str,
                  shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    """The reshape of the float input ``vi`` under which it broadcasts to ``term`` as the shape chain makes it
    (checked on a probe of distinct values), or None."""
    shape = shapes[vi.name]
    if term == vi.name:
        return tuple(shape)
    probe = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    got = _evaluate(model, chain, vi.name, vi, [term], consts, [probe])[term][0]
    for axes in itertools.combinations(range(got.ndim), len(shape)):
        expand = [1] * got.ndim
        for axis, size in zip(axes, shape):
            expand[axis] = size
        try:
            if np.array_equal(np.broadcast_to(probe.reshape(expand), got.shape), got):
                return tuple(expand)
        except ValueError:
            continue
    flat = got.reshape(-1)
    if got.size == probe.size and np.array_equal(flat, probe.reshape(-1)):
        return tuple(got.shape)
    return None


def is_mask_input(graph: Graph, name: str) -> bool:
    """Whether input ``name`` of ``graph`` is a runtime attention mask of 0 and 1 (int64, read by ``KeyMask`` nodes
    or, quantized, by masked Softmax and log-sum-exp nodes; :mod:`.frontend.masks`; or by a masked pooling,
    :mod:`.pooling`)."""
    return graph.tensors[name].dtype == "int64" and _mask_readers(graph, name)


def is_numeric_input(graph: Graph, name: str) -> bool:
    """Whether input ``name`` of ``graph`` is an integer number the model computes with (int64, read only by
    ``InputFn`` nodes: a diffusion timestep, :mod:`.numeric_inputs`): any integer, no token id or mask."""
    return graph.tensors[name].dtype == "int64" and only_input_fns(graph, name)


def numeric_input_problem(graph: Graph, name: str, value: np.ndarray) -> str | None:
    """Why ``value`` cannot be the integer input ``name`` (:func:`is_numeric_input`), or None: a value that is not an
    integer, or one beyond the type the file declares the input (a timestep declared int32 takes no value beyond
    int32's range). The run's inputs and the calibration's check it alike."""
    if value.dtype.kind == "f" and not (np.isfinite(value).all() and (value == np.rint(value)).all()):
        return f"input {name!r} takes integers (the model computes with them, e.g. a diffusion timestep)"
    region = onnx.ModelProto.FromString(base64.b64decode(graph.consumers(name)[0].attrs["onnx"]))
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(region.graph.input[0].type.tensor_type.elem_type))
    info = np.iinfo(dtype if dtype.kind in "iu" else np.int64)
    if ((value < info.min) | (value > info.max)).any():
        return (f"values outside [{info.min}, {info.max}] for input {name!r}, which the model declares "
                f"{info.dtype.name}")
    return None


def only_input_fns(graph: Graph, name: str) -> bool:
    """Whether ``InputFn`` nodes alone read ``name`` (a number the model computes with, int64 or float32, which may
    be given as a scalar for its one-element shape)."""
    users = graph.consumers(name)
    return bool(users) and all(u.op == "InputFn" for u in users)


NUMERIC_RANGE = 1000
"""Random values of an integer numeric input (:func:`is_numeric_input`) are uniform in ``[0, NUMERIC_RANGE)``: a
diffusion model's training steps, the common case. Give real values with ``--input`` and ``--calibration``."""


def is_float_mask_input(graph: Graph, name: str) -> bool:
    """Whether input ``name`` of ``graph`` is a float term added to attention scores at run time (float32, read by
    additive ``KeyMask`` nodes or, quantized, by masked Softmax nodes as their input 1)."""
    return graph.tensors[name].dtype == "float32" and _mask_readers(graph, name)


def _mask_readers(graph: Graph, name: str) -> bool:
    """Every reader of ``name`` reads it as a mask (input 1 of a mask or a masked op; a term or indices computed from
    it), and one of them masks with it (an input read by IndexFn nodes alone is token ids)."""
    users = graph.consumers(name)
    return bool(users) and all((node.op in ("KeyMask", "Softmax", "QSoftmax", "QReduce", "MaskPool", "QMaskPool") and
                                node.inputs[1:2] == [name]) or (node.op in ("MaskFn", "IndexFn") and
                                                                 node.inputs == [name])
                               for node in users) and any(node.op != "IndexFn" for node in users)


def mask_lengths(graph: Graph, name: str) -> int | None:
    """For a 1-D int64 input of ``graph`` read only by ``MaskFn`` nodes (a ``[batch]`` of valid key counts, such as
    Attention's ``nonpad_kv_seqlen`` or a ``mask_index`` of end positions, whose term the model's own nodes compute
    at run time), the number of keys of the terms (the largest length that means anything); None for any other
    input. Such an input takes any integer: the lab computes exactly what the model does with it."""
    if graph.tensors[name].dtype != "int64" or len(graph.shape(name)) != 1:
        return None
    readers = graph.consumers(name)
    if not readers or any(node.op != "MaskFn" for node in readers):
        return None
    return max(graph.shape(node.outputs[0])[-1] for node in readers)


def token_range(graph: Graph, name: str) -> int | None:
    """For an int64 input of ``graph`` (token ids), the number of rows of the smallest embedding table it indexes,
    directly or, when no table reads it directly, through the indices computed from it (``IndexFn``: EmbeddingGemma
    maps its special ids to 0): valid ids are ``0 <= id < token_range``; None for any other input."""
    if graph.tensors[name].dtype != "int64":
        return None
    readers = graph.consumers(name)
    rows = [graph.shape(node.inputs[1])[0] for node in readers if node.op == "Embedding"]
    if not rows and readers and all(n.op == "IndexFn" for n in readers):      # the lookups' indices only
        rows = [graph.shape(node.inputs[1])[0] for n in readers for node in graph.consumers(n.outputs[0])
                if node.op == "Embedding"]
    return min(rows) if rows else None
