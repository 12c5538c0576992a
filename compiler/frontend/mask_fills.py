"""Mask fills carried by a data term added to the attention scores, moved into the Softmax.

Doge's dynamic mask adds to the scores a term computed from the activations whose masked entries hold a huge
negative fill: ``scores + expand(Where(causal, exp(A * softplus(dt)), finfo.min))``. Quantized as it stands, the
fill becomes -128 at the term's int8 scale, a few units below the data: the masked keys get real weight in the
Softmax (a first-layer cosine of 0.85 on a tiny random Doge). The Softmax applies a mask's keep and fill in float
when they reach it directly (:meth:`.quantize._Quantizer.softmax_mask`), so :func:`lift_mask_fills` rewrites, in the
float graph,

    ``Softmax(s + moves(Where(keep, d, F)))``  ->  ``Softmax(Where(keep', s + moves(Where(keep, d, 0)), F))``

where ``moves`` is a chain of Reshape, Transpose, Slice and Concat of one tensor repeated (an Expand), each read by
the next alone, and ``keep'`` is ``keep`` carried through the same moves and broadcast to the scores' shape. The
Softmax's output is unchanged: a masked score was ``s + F``, which is ``F`` in float32 for a fill at or below
:data:`FILL_LIMIT` (``|s|`` is far below ``|F|`` times float32's precision for any score a Softmax sees), and is now
``F``; the kept scores are ``s + d`` as before. The data term, free of its fill, is quantized at the scale of its
data alone.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .float_ref import FLOAT_FNS

__all__ = ["FILL_LIMIT", "lift_mask_fills"]

FILL_LIMIT = -1e4
"""The largest fill read as a mask's: BERT's -10000 and below (``finfo(float32).min``, ``-inf``)."""

_MOVES = frozenset({"Reshape", "Transpose", "Slice", "Concat"})


def _chain(graph: Graph, where: Node) -> tuple[list[Node], Node] | None:
    """The moves from ``where``'s output to the Add that reads it, and that Add; None when the path forks, ends
    elsewhere, or a Concat joins other tensors."""
    moves: list[Node] = []
    tensor = where.outputs[0]
    while True:
        if tensor in graph.outputs:
            return None
        users = graph.consumers(tensor)
        if len(users) != 1:
            return None
        user = users[0]
        if user.op == "Add":
            return moves, user
        if user.op not in _MOVES or any(t != tensor for t in user.inputs):
            return None
        moves.append(user)
        tensor = user.outputs[0]


def _softmax_readers(graph: Graph, tensor: str) -> bool:
    users = graph.consumers(tensor)
    rank = len(graph.shape(tensor))
    return bool(users) and tensor not in graph.outputs and \
        all(u.op == "Softmax" and u.attrs["axis"] % rank == rank - 1 and not u.attrs.get("sink_input") and
            u.inputs[0] == tensor for u in users)


def lift_mask_fills(graph: Graph) -> int:
    """Move each mask fill of a data term added to Softmax scores into a Where before the Softmax (module
    docstring), in place; returns how many moved."""
    lifted = 0
    for where in [n for n in graph.nodes if n.op == "Where"]:
        fill = float(where.attrs["fill"])
        if not fill <= FILL_LIMIT:
            continue
        found = _chain(graph, where)
        if found is None:
            continue
        moves, add = found
        term = moves[-1].outputs[0] if moves else where.outputs[0]
        scores = next((t for t in add.inputs if t != term), None)
        if scores is None or scores in graph.constants or add.inputs.count(term) != 1 or \
                not _softmax_readers(graph, add.outputs[0]):
            continue
        out_shape = graph.shape(add.outputs[0])
        keep = np.broadcast_to(np.asarray(where.attrs["keep"], bool), graph.shape(where.outputs[0]))
        carried = keep.astype(np.float32)
        for node in moves:
            carried = np.asarray(FLOAT_FNS[node.op](node, [carried] * len(node.inputs)))
        try:
            keep_scores = np.ascontiguousarray(np.broadcast_to(carried > 0.5, out_shape))
        except ValueError:
            continue
        where.attrs["fill"] = 0.0
        masked = graph.unique_name(f"{add.outputs[0]}_masked")
        graph.add_tensor(masked, out_shape, "float32")
        for user in graph.consumers(add.outputs[0]):
            user.inputs = [masked if t == add.outputs[0] else t for t in user.inputs]
        node = graph.add_node("Where", graph.unique_name(f"{add.name}_mask", node=True), [add.outputs[0]], [masked],
                              keep=keep_scores, fill=fill)
        graph.nodes.remove(node)
        graph.nodes.insert(graph.nodes.index(add) + 1, node)
        lifted += 1
    return lifted
