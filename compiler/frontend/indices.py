"""Embedding indices computed from token ids: RoBERTa's position ids (``cumsum(ids != pad) * (ids != pad) + pad``),
a token-type buffer gathered by them, and the like.

A graph input of token ids (int64, used directly as the indices of a Gather from a constant table ``[rows,
width]``) may also feed integer arithmetic on itself and constants (an *index region*: Equal, Not, Cast, CumSum,
Mul, Add, GatherElements of a constant buffer, Expand, ...) whose results index other tables.
:func:`find_index_regions` finds each such result that a table Gather reads, and the region nodes it needs; the
importer drops the region and computes each result with one ``IndexFn`` node, which carries that part of the ONNX
graph and runs it with ONNX's reference evaluator at run time on the CPU (:func:`..qops_index.run_index_fn`). The
table Gather that reads it is an Embedding as for any token ids. Every op of the region must be one of
:data:`INDEX_OPS` (standard integer and shape operators: no control flow, no custom domain); a region value read by
anything but a table Gather as its indices, or with an activation, is refused with :class:`IndexRegionError` naming
the node.
"""
from __future__ import annotations

from typing import Container

import onnx
from onnx import TensorProto, helper

from ..ir import GraphError
from .masks import encode, forward_region, indexes_a_table, region_model

__all__ = ["IndexRegion", "IndexRegionError", "find_index_regions", "find_mask_index_regions", "INDEX_OPS",
           "only_indexes_tables", "index_blocker", "widen_int32_ids", "replace_index_regions"]

INDEX_OPS = frozenset({"Equal", "Not", "Cast", "CumSum", "Mul", "Add", "Sub", "Neg", "Abs", "Min", "Max", "Clip",
                       "Where", "And", "Or", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Unsqueeze",
                       "Squeeze", "Reshape", "Flatten", "Expand", "Identity", "GatherElements", "Gather", "Slice",
                       "Concat", "Tile", "Range", "Mod", "Div", "Pad", "ScatterND", "ReduceSum", "Shape",
                       "ConstantOfShape", "ArgMax", "ArgMin"})
"""The ops an index region may contain (evaluated by ONNX's reference implementation)."""


class IndexRegionError(GraphError):
    """Token ids reach something other than table lookups through integer arithmetic (names the node)."""


class IndexRegion:
    """One computed index tensor: ``out`` (int64, ``shape``) from the token-id input ``ids`` by the ONNX model
    ``model`` (serialized, base64: the region's nodes and constants; one input, one output)."""

    def __init__(self, ids: str, out: str, shape: tuple[int, ...], model: str) -> None:
        self.ids, self.out, self.shape, self.model = ids, out, shape, model


def _tables(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer if len(i.dims) == 2}


def _is_lookup(node: onnx.NodeProto, region: Container[str], tables: set[str], consts: Container[str]) -> bool:
    """Whether ``node`` is a lookup by indices the ``region`` computes: a Gather of a table's rows, or of an
    activation's (CLIP's pooling at the end-of-text token), at indices of the region, from data outside it."""
    return node.op_type == "Gather" and len(node.input) == 2 and node.input[1] in region and \
        node.input[0] not in region and (node.input[0] in tables or node.input[0] not in consts)


def only_indexes_tables(model: onnx.ModelProto, name: str) -> bool:
    """Whether the integer input ``name`` reaches, through :data:`INDEX_OPS` on itself and constants, the indices of
    a Gather from a table ``[rows, width]`` and nothing else (EmbeddingGemma maps special token ids to 0 with
    ``Where(Equal(ids, c) | ..., 0, ids)`` before its lookup): token ids, though no table reads them directly."""
    lookups, blocker = _index_walk(model, name)
    return lookups > 0 and blocker is None


def index_blocker(model: onnx.ModelProto, name: str) -> str | None:
    """Why the integer input ``name``, which reaches a table lookup through index arithmetic, is not token ids
    (:func:`only_indexes_tables`): the first node on its way that is not such arithmetic, or None (no lookup, or
    nothing in the way)."""
    lookups, blocker = _index_walk(model, name)
    return blocker if lookups else None


def _index_walk(model: onnx.ModelProto, name: str) -> tuple[int, str | None]:
    """The table lookups the integer input ``name`` reaches through :data:`INDEX_OPS` on itself and constants, and
    the first thing in the way (a node outside those ops or reading another activation, or a graph output)."""
    consts = {i.name for i in model.graph.initializer}
    tables = _tables(model)
    region, lookups = {name}, 0
    blocker: str | None = None
    for node in model.graph.node:
        if not any(t in region for t in node.input):
            continue
        if _is_lookup(node, region, tables, consts):
            lookups += 1
            continue
        if node.op_type not in INDEX_OPS or node.domain not in ("", "ai.onnx"):
            blocker = blocker or f"node {node.name or node.output[0]!r} ({node.op_type}) computes with it, an op " \
                                 f"the index arithmetic does not include"
        elif not all(not t or t in region or t in consts for t in node.input):
            blocker = blocker or f"node {node.name or node.output[0]!r} ({node.op_type}) meets it with an activation"
        region.update(node.output)                       # followed on past a blocker, to find the lookups it feeds
    outputs = region & {o.name for o in model.graph.output}
    if outputs and blocker is None:
        blocker = f"graph output {sorted(outputs)[0]!r} is computed from it"
    return lookups, blocker


def find_index_regions(model: onnx.ModelProto, token_ids: set[str], shapes: dict[str, tuple[int, ...]],
                       stops: frozenset[str] | set[str] = frozenset()) -> tuple[list[IndexRegion], set[int]]:
    """For the token-id inputs ``token_ids`` of ``model`` (shapes inferred, constants folded; ``shapes`` the static
    shapes): every tensor computed from one of them and constants alone that a Gather from a table ``[rows, width]``
    reads as its indices, as an :class:`IndexRegion`, and the indices in ``model.graph.node`` of the region nodes (to
    drop). A tensor of ``stops`` (a mask computed from the ids, :func:`.id_masks.cut_id_masks`) is a result too, and
    the region ends there. :class:`IndexRegionError` for a region op outside :data:`INDEX_OPS` or a region value read
    otherwise."""
    consts = {i.name: i for i in model.graph.initializer}
    tables = _tables(model)
    region: dict[str, str] = {name: name for name in token_ids}      # tensor -> its token-id input
    nodes: list[tuple[int, onnx.NodeProto]] = []
    wanted: dict[str, str] = {}
    outputs = {o.name for o in model.graph.output}
    for index, node in enumerate(model.graph.node):
        touched = [t for t in node.input if t in region]
        if not touched:
            continue
        where = f"node {node.name or node.output[0]!r} ({node.op_type})"
        if _is_lookup(node, region, tables, consts):
            if node.input[1] not in token_ids:
                wanted[node.input[1]] = region[node.input[1]]
            continue
        ids = region[touched[0]]
        if not all(not t or t in region or t in consts for t in node.input):
            raise IndexRegionError(f"the token ids {ids!r} reach {where} together with an activation; token ids "
                                   f"(and integers computed from them) may only index constant tables")
        if node.op_type not in INDEX_OPS or node.domain not in ("", "ai.onnx"):
            raise IndexRegionError(f"the token ids {ids!r} reach {where}, which the lab does not compute on token "
                                   f"ids: the ops it runs on them are {', '.join(sorted(INDEX_OPS))}")
        if len({region[t] for t in touched}) > 1:
            raise IndexRegionError(f"two token-id inputs meet in {where}; the lab computes indices from one")
        nodes.append((index, node))
        if node.output[0] in stops:
            wanted[node.output[0]] = ids
            continue
        for out in node.output:
            region[out] = ids
    leaked = sorted(t for t in region if t in outputs and t not in token_ids)
    if leaked:
        raise IndexRegionError(f"graph output(s) {', '.join(map(repr, leaked))} are computed from token ids alone; "
                               f"the lab computes outputs from activations")
    found = []
    for out, ids in wanted.items():
        if out not in shapes:
            raise IndexRegionError(f"the indices {out!r} computed from the token ids {ids!r} have no static shape")
        found.append(IndexRegion(ids, out, shapes[out], _submodel(model, [n for _, n in nodes], ids, out, consts)))
    return found, {index for index, _ in nodes}


def find_mask_index_regions(model: onnx.ModelProto, masks: set[str], shapes: dict[str, tuple[int, ...]]
                            ) -> list[IndexRegion]:
    """Indices computed from an attention mask input (OPT's positions, ``cumsum(mask) * mask - 1``, and the like):
    for each Gather from a table ``[rows, width]`` whose indices are computed from one of ``masks`` and constants
    alone by :data:`INDEX_OPS`, an :class:`IndexRegion` of that mask. The caller replaces the indices' producer by an
    ``IndexFn``; the region's nodes stay where something else (the attention) still reads them."""
    consts = {i.name: i for i in model.graph.initializer}
    tables = _tables(model)
    found: list[IndexRegion] = []
    for mask in sorted(masks):
        region, nodes = forward_region(model, mask, consts, INDEX_OPS)
        for node in model.graph.node:
            if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in tables and \
                    node.input[1] in region and node.input[1] != mask and node.input[1] in shapes:
                out = node.input[1]
                if any(r.out == out for r in found):       # indices several Gathers read (rotary cos and sin)
                    continue
                found.append(IndexRegion(mask, out, shapes[out], _submodel(model, nodes, mask, out, consts)))
    return found


def _submodel(model: onnx.ModelProto, nodes: list[onnx.NodeProto], ids: str, out: str,
              consts: dict[str, onnx.TensorProto]) -> str:
    """The part of the graph computing ``out`` from ``ids``, as a base64 ONNX model (int64 out)."""
    vi = next(v for v in model.graph.input if v.name == ids)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    result, extra = out, []
    if types.get(out, TensorProto.INT64) != TensorProto.INT64:     # int32 indices: the IndexFn gives int64
        result = f"{out}_int64"
        extra.append(helper.make_node("Cast", [out], [result], to=TensorProto.INT64))
    return encode(region_model(model, nodes, vi, [out], [helper.make_tensor_value_info(result, TensorProto.INT64,
                                                                                        None)], consts, extra))


def widen_int32_ids(model: onnx.ModelProto) -> None:
    """In place: an int32 graph input that indexes an embedding table, directly or through shape ops
    (:func:`.masks.indexes_a_table`; tf2onnx writes Keras's token ids so) or through index arithmetic alone
    (:func:`only_indexes_tables`: Keras 3's Embedding first maps a negative id ``i`` to ``i + vocab``) becomes an int64
    input, so that it imports as token ids do; its other readers, if any, read it cast back to int32. Values are
    unchanged: the caller's int32 ids are taken as int64."""
    for vi in model.graph.input:
        if vi.type.tensor_type.elem_type != onnx.TensorProto.INT32 or not (
                indexes_a_table(model, vi.name) or only_indexes_tables(model, vi.name)):
            continue
        vi.type.tensor_type.elem_type = onnx.TensorProto.INT64
        others = [n for n in model.graph.node if vi.name in n.input and
                  not (n.op_type == "Gather" and list(n.input[1:]) == [vi.name])]
        if others:
            narrow = f"{vi.name}_int32"
            for n in others:
                n.input[:] = [narrow if t == vi.name else t for t in n.input]
            model.graph.node.insert(0, onnx.helper.make_node("Cast", [vi.name], [narrow], name=f"{narrow}_cast",
                                                             to=onnx.TensorProto.INT32))


def replace_index_regions(model: onnx.ModelProto, regions: list[IndexRegion], drop: set[int]) -> None:
    """Drop the index regions' nodes (``drop``: their indices in the graph) and compute each region's result with
    one ``IndexFn`` node at the graph's start (it reads a graph input only), in place."""
    if not regions:
        return
    kept = [onnx.helper.make_node("IndexFn", [r.ids], [r.out], name=f"{r.out}_indices") for r in regions]
    kept += [node for index, node in enumerate(model.graph.node) if index not in drop]
    del model.graph.node[:]
    model.graph.node.extend(kept)
