"""Scatters with constant indices, as moves of values the lab imports: a Concat and a Gather by constant indices.

Exporters write Python's slice assignment into a preallocated tensor (``q[..., :n] = a; q[..., n:] = b``,
MiniCPM3's attention) as ``ScatterND`` into a constant, the indices computed from shapes and folded to a constant.
With constant indices a scatter moves values only: every element of the output is an element of the data or of the
updates, at a position known before the run. :func:`scatters_as_gathers` rewrites each ``ScatterND`` and
``ScatterElements`` with constant indices and no reduction (static shapes) as ``Gather(Concat([flat(data),
flat(updates)]), perm)`` reshaped back to the data's shape, ``perm`` the constant source of every output element
(an update written twice: the later one, as ONNX's reference implementation applies them in order). A Gather by
constant indices and a Concat are moves the lab imports on the CPU, int8 alike. Indices outside the data are left
alone, for the importer to refuse the scatter by name.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["scatters_as_gathers", "scatter_sources"]


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
    nodes: list[onnx.NodeProto] = []
    changed = False
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        data, index, updates = (list(node.input) + ["", "", ""])[:3]
        plain = node.op_type in ("ScatterND", "ScatterElements") and node.domain in ("", "ai.onnx") and \
            attrs.get("reduction", b"none") in (b"none", "none") and index in consts and \
            data in shapes and updates in shapes
        sources = scatter_sources(node.op_type, shapes[data], numpy_helper.to_array(consts[index]), shapes[updates],
                                  int(attrs.get("axis", 0))) if plain else None
        if sources is None:
            nodes.append(node)
            continue
        changed = True
        name = node.name or node.output[0]
        inits = model.graph.initializer
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), f"{name}_flat"))
        inits.append(numpy_helper.from_array(sources, f"{name}_sources"))
        inits.append(numpy_helper.from_array(np.array(shapes[data], np.int64), f"{name}_shape"))
        for part in (data, updates):            # a constant flattened here, an activation by a Reshape
            role = "data" if part == data else "updates"
            if part in consts:
                inits.append(numpy_helper.from_array(numpy_helper.to_array(consts[part]).reshape(-1),
                                                     f"{name}_{role}_flat"))
            else:
                nodes.append(helper.make_node("Reshape", [part, f"{name}_flat"], [f"{name}_{role}_flat"],
                                              name=f"{name}_{role}_flat"))
        nodes += [helper.make_node("Concat", [f"{name}_data_flat", f"{name}_updates_flat"], [f"{name}_both"],
                                   name=f"{name}_both", axis=0),
                  helper.make_node("Gather", [f"{name}_both", f"{name}_sources"], [f"{name}_moved"],
                                   name=f"{name}_moved", axis=0),
                  helper.make_node("Reshape", [f"{name}_moved", f"{name}_shape"], [node.output[0]], name=name)]
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return changed
