"""Scatters with constant indices, as moves of values the lab imports: a Concat and a Gather by constant indices.

Exporters write Python's slice assignment into a preallocated tensor (``q[..., :n] = a; q[..., n:] = b``,
MiniCPM3's attention) as ``ScatterND`` into a constant, the indices computed from shapes and folded to a constant.
With constant indices a scatter moves values only: every element of the output is an element of the data or of the
updates, at a position known before the run. :func:`scatters_as_gathers` rewrites each ``ScatterND`` and
``ScatterElements`` with constant indices and no reduction (static shapes) as ``Gather(Concat([flat(data),
flat(updates)]), perm)`` reshaped back to the data's shape, ``perm`` the constant source of every output element
(an update written twice: the later one, as ONNX's reference implementation applies them in order); a scatter of no
update is an ``Identity`` of the data, and the branch that computed its empty updates is dropped unread (X-MOD's
adapter of a language the input is not in: the rows a constant mask selects, none). A Gather by
constant indices and a Concat are moves the lab imports on the CPU, int8 alike. Indices outside the data are left
alone, for the importer to refuse the scatter by name. :func:`flatten_scatter_chains` then makes a chain of them
(one in-place assignment after another) read the tensors no scatter wrote, so that no int8 tensor mixes values of
different ranges.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_common import tensor_namer

__all__ = ["scatters_as_gathers", "scatter_sources", "flatten_scatter_chains"]


def scatter_sources(op: str, data_shape: tuple[int, ...], indices: np.ndarray, updates_shape: tuple[int, ...],
                    axis: int = 0) -> np.ndarray | None:
    """For each element of the output (flat, row-major), its source in ``concat(flat(data), flat(updates))`` of a
    ``ScatterND`` (``op``) or ``ScatterElements`` (on ``axis``) by ``indices``; None when an index lies outside the
    data or the shapes do not fit."""
    size = int(np.prod(data_shape, dtype=np.int64))
    rank = len(data_shape)
    idx = np.asarray(indices, np.int64)
    if op == "ScatterND":
        depth = int(np.shape(idx)[-1]) if idx.ndim else 0
        if not 1 <= depth <= rank:
            return None
        lead = np.asarray(data_shape[:depth], np.int64)
        flat = idx.reshape(-1, depth)
        flat = np.where(flat < 0, flat + lead, flat)
        if (flat < 0).any() or (flat >= lead).any():
            return None
        inner = int(np.prod(data_shape[depth:], dtype=np.int64))
        base = np.asarray(np.ravel_multi_index(tuple(flat.T), tuple(data_shape[:depth])), np.int64).reshape(-1) \
            * inner if flat.size else np.zeros(0, np.int64)
        targets = (base[:, None] + np.arange(inner)[None, :]).reshape(-1)
    else:
        if idx.ndim != rank:
            return None
        axis %= rank
        fixed = np.where(idx < 0, idx + data_shape[axis], idx)
        if (fixed < 0).any() or (fixed >= data_shape[axis]).any() or \
                any(n > d for k, (n, d) in enumerate(zip(idx.shape, data_shape)) if k != axis):
            return None
        coords = [np.asarray(c) for c in np.indices(idx.shape)]
        coords[axis] = fixed
        targets = np.ravel_multi_index(tuple(c.reshape(-1) for c in coords), data_shape)
    if targets.size != int(np.prod(updates_shape, dtype=np.int64)) or \
            (op == "ScatterElements" and tuple(idx.shape) != tuple(updates_shape)):
        return None
    sources = np.arange(size, dtype=np.int64)
    sources[targets] = size + np.arange(targets.size, dtype=np.int64)    # in order: a later write wins
    return sources


def scatters_as_gathers(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Rewrite, in place, every ScatterND / ScatterElements of constant indices, no reduction and static shapes as
    the module docstring says. True when any changed (the caller infers the new tensors' shapes)."""
    consts = {init.name: init for init in model.graph.initializer}
    shapes = {**{name: tuple(int(d) for d in init.dims) for name, init in consts.items()}, **shapes}
    fresh = tensor_namer(model)
    nodes: list[onnx.NodeProto] = []
    changed = False
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        data, index, updates = (list(node.input) + ["", "", ""])[:3]
        plain = node.op_type in ("ScatterND", "ScatterElements") and node.domain in ("", "ai.onnx") and \
            attrs.get("reduction", b"none") in (b"none", "none") and index in consts and data in shapes
        idx = numpy_helper.to_array(consts[index]) if plain else np.zeros(1)
        name = node.name or node.output[0]
        if plain and idx.size == 0 and (node.op_type == "ScatterElements" or (idx.ndim and idx.shape[-1] >= 1)):
            nodes.append(helper.make_node("Identity", [data], [node.output[0]], name=name))   # no update (a mask's
            changed = True                    # rows, when it selects none): the data, its updates' branch unread
            continue
        sources = scatter_sources(node.op_type, shapes[data], idx, shapes[updates], int(attrs.get("axis", 0))) \
            if plain and updates in shapes else None
        if sources is None:
            nodes.append(node)
            continue
        changed = True
        t = {part: fresh(f"{name}_{part}") for part in ("flat", "sources", "shape", "data_flat", "updates_flat",
                                                        "both", "moved")}          # names the file does not use
        inits = model.graph.initializer
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), t["flat"]))
        inits.append(numpy_helper.from_array(sources, t["sources"]))
        inits.append(numpy_helper.from_array(np.array(shapes[data], np.int64), t["shape"]))
        for part in (data, updates):            # a constant flattened here, an activation by a Reshape
            role = "data" if part == data else "updates"
            if part in consts:
                inits.append(numpy_helper.from_array(numpy_helper.to_array(consts[part]).reshape(-1),
                                                     t[f"{role}_flat"]))
            else:
                nodes.append(helper.make_node("Reshape", [part, t["flat"]], [t[f"{role}_flat"]],
                                              name=f"{name}_{role}_flat"))
        nodes += [helper.make_node("Concat", [t["data_flat"], t["updates_flat"]], [t["both"]],
                                   name=f"{name}_both", axis=0),
                  helper.make_node("Gather", [t["both"], t["sources"]], [t["moved"]], name=f"{name}_moved", axis=0),
                  helper.make_node("Reshape", [t["moved"], t["shape"]], [node.output[0]], name=name)]
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return changed


_TRACE_LIMIT = 1 << 22
"""The most elements of a tensor whose sources :func:`flatten_scatter_chains` traces (int64 arrays of that size)."""

_MOVE_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Gather", "Slice",
                       "GatherND", "GatherElements", "Expand"})
"""Ops that only move elements (their other inputs constants): a moved tensor's sources follow them."""


def flatten_scatter_chains(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> bool:
    """In place, after :func:`scatters_as_gathers`: every node that only moves elements (:data:`_MOVE_OPS` with
    constant side inputs, or a scatter's ``Gather`` of a ``Concat``) and reads, through such moves, a tensor a
    scatter wrote, reads the *leaves* instead: the tensors no scatter wrote, by one ``Gather`` from their
    concatenation. A chain of in-place assignments (``g[..., 0] = f(g[..., 0]); g[..., 1] = ...``: MONAI's warp
    normalizing its voxel grid, through permutes in torch's dynamo export) then holds no tensor that mixes the
    updated slices (of one range) with the ones not yet updated (of another), whose one int8 scale (the larger
    range's) would round the updated values coarsely. The same elements, moved in one step. True when anything
    changed (the caller infers the new tensors' shapes and drops the moves left unread)."""
    from ..qops import reference_evaluator
    producer = {o: n for n in model.graph.node for o in n.output if o}
    consts = {init.name: init for init in model.graph.initializer}
    opsets = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    memo: dict[str, tuple[list[str], np.ndarray, np.ndarray] | None] = {}

    def size(tensor: str) -> int | None:
        shape = shapes.get(tensor)
        return None if shape is None else int(np.prod(shape, dtype=np.int64))

    def concat_move(node: onnx.NodeProto) -> onnx.NodeProto | None:
        """The Concat of flat parts that ``node`` gathers from by constant indices (a scatter's move), or None."""
        parts = producer.get(node.input[0]) if node.op_type == "Gather" else None
        if parts is None or parts.op_type != "Concat" or node.input[1] not in consts or \
                any(a.name == "axis" and a.i != 0 for a in node.attribute) or \
                any(len(shapes.get(t, ())) != 1 for t in (node.input[0], *parts.input)):
            return None
        return parts

    def moved(node: onnx.NodeProto, values: np.ndarray) -> np.ndarray | None:
        """``node``'s output for ``values`` as its first input (int64, its shape), the rest its constants."""
        graph = helper.make_graph([node], "move", [helper.make_tensor_value_info(node.input[0], onnx.TensorProto.INT64,
                                                                                 list(values.shape))],
                                  [helper.make_tensor_value_info(node.output[0], onnx.TensorProto.INT64, None)],
                                  [consts[t] for t in node.input[1:] if t])
        try:
            return np.asarray(reference_evaluator(helper.make_model(graph, opset_imports=opsets)).run(
                None, {node.input[0]: values})[0], np.int64)
        except Exception:  # noqa: BLE001 - an index the evaluator refuses: left for the importer to name
            return None

    def trace(tensor: str) -> tuple[list[str], np.ndarray, np.ndarray] | None:
        """``(leaves, leaf of each element, position in its leaf)`` for ``tensor`` (flat, row-major) when a scatter
        wrote it or a move of one (its elements known to come from other tensors), else None (a leaf)."""
        if tensor in memo:
            return memo[tensor]
        memo[tensor] = None
        node = producer.get(tensor)
        n = size(tensor)
        if node is None or n is None or n > _TRACE_LIMIT or node.domain not in ("", "ai.onnx"):
            return None
        parts = concat_move(node)
        if parts is not None:
            index = numpy_helper.to_array(consts[node.input[1]]).astype(np.int64).reshape(-1)
            leaves: list[str] = []
            leaf_of, position = [], []
            for part in parts.input:
                m = size(part)
                if m is None:
                    return None
                names, which, where = trace(part) or ([part], np.zeros(m, np.int64), np.arange(m, dtype=np.int64))
                for name in names:
                    if name not in leaves:
                        leaves.append(name)
                leaf_of.append(np.array([leaves.index(name) for name in names], np.int64)[which])
                position.append(where)
            which_all, where_all = np.concatenate(leaf_of), np.concatenate(position)
            if index.size != n or (index < 0).any() or index.max(initial=-1) >= which_all.size:
                return None
            memo[tensor] = (leaves, which_all[index], where_all[index])
        elif node.op_type in _MOVE_OPS and all(t in consts for t in node.input[1:] if t) and \
                node.input[0] in shapes and (inner := trace(node.input[0])) is not None:
            leaves, which, where = inner
            shape = tuple(shapes[node.input[0]])
            out_which, out_where = moved(node, which.reshape(shape)), moved(node, where.reshape(shape))
            if out_which is not None and out_where is not None and out_which.size == n:
                memo[tensor] = (leaves, out_which.reshape(-1), out_where.reshape(-1))
        return memo[tensor]

    def rebuild(name: str, leaves: list[str], which: np.ndarray, where: np.ndarray, out: str,
                out_shape: tuple[int, ...]) -> list[onnx.NodeProto]:
        """Nodes that write ``out`` (``out_shape``) as ``Gather(Concat(flat leaves used), indices)``."""
        offsets = np.zeros(len(leaves), np.int64)
        flats, nodes = [], []
        start = 0
        for k in sorted(set(which.tolist())):
            flat = f"{name}_leaf{k}"
            nodes.append(helper.make_node("Reshape", [leaves[k], f"{name}_minus_one"], [flat], name=flat))
            offsets[k] = start
            start += size(leaves[k]) or 0
            flats.append(flat)
        model.graph.initializer.extend([
            numpy_helper.from_array(np.array([-1], np.int64), f"{name}_minus_one"),
            numpy_helper.from_array((offsets[which] + where).reshape(out_shape), f"{name}_leaf_index")])
        source = flats[0]
        if len(flats) > 1:
            source = f"{name}_leaves"
            nodes.append(helper.make_node("Concat", flats, [source], name=source, axis=0))
        nodes.append(helper.make_node("Gather", [source, f"{name}_leaf_index"], [out], name=f"{name}_from_leaves",
                                      axis=0))
        return nodes

    new_nodes: list[onnx.NodeProto] = []
    changed = False
    for node in model.graph.node:
        out = node.output[0] if node.output else ""
        traced = trace(out) if out and out in shapes and node.op_type in _MOVE_OPS else None
        parts = concat_move(node) if traced is not None else None
        rewrite = traced is not None and (set(traced[0]) != set(parts.input) if parts is not None
                                          else trace(node.input[0]) is not None)
        if not rewrite or traced is None:
            new_nodes.append(node)
            continue
        leaves, which, where = traced
        new_nodes += rebuild((node.name or out).replace("/", "_"), leaves, which, where, out, tuple(shapes[out]))
        changed = True
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(new_nodes)
    return changed
