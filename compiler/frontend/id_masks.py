"""Attention masks computed from the token ids inside the graph: ``mask = ids != pad`` (fairseq-style models and
hand-written encoders that take no ``attention_mask`` input).

A comparison of a token-id input with constants (``Equal``, ``Greater``, ...; through shape ops, Cast and Not) gives
a 0/1 tensor. Where that tensor then reaches the activations only as a mask does (not as indices of a table),
:func:`cut_id_masks` cuts the graph after the comparison: ``m = Cast(cmp, INT64)`` is computed from the ids by an
``IndexFn`` node (:mod:`.indices`, which stops at ``m``), and the rest of the region reads ``Cast(m, BOOL)``, so
:func:`.masks.find_key_masks` (and :func:`.pooling.find_mask_pools`) take ``m`` as a mask input of 0 and 1. Nothing
changes in what the graph computes.
"""
from __future__ import annotations

import onnx
from onnx import TensorProto, helper

__all__ = ["cut_id_masks", "COMPARISONS"]

COMPARISONS = frozenset({"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"})
"""The ops whose boolean output of token ids may be a mask."""

_PASS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Identity", "Transpose"})
"""Shape ops a token-id tensor may pass through before the comparison."""


def cut_id_masks(model: onnx.ModelProto, token_ids: set[str], shapes: dict[str, tuple[int, ...]]
                 ) -> dict[str, onnx.ValueInfoProto]:
    """Cut each mask computed from a token-id input after its comparison, in place (see the module docstring).
    Returns the cut tensors (int64, the comparison's shape) by name, each with its token-id input as ``doc_string``
    of the value info."""
    consts = {i.name for i in model.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    tables = {i.name for i in model.graph.initializer if len(i.dims) == 2}
    cuts: dict[str, tuple[str, onnx.NodeProto]] = {}
    for ids in sorted(token_ids):
        ready = {ids}
        derived = _from_ids(model, ids, consts, tables)
        for node in model.graph.node:
            if not any(t in ready for t in node.input) or not all(not t or t in ready or t in consts
                                                                  for t in node.input):
                continue
            if node.op_type in _PASS:
                ready.update(node.output)
            elif node.op_type in COMPARISONS and node.output[0] in shapes and _mask_like(node.output[0], readers,
                                                                                          tables, consts | derived):
                cuts[node.output[0]] = (ids, node)
    found: dict[str, onnx.ValueInfoProto] = {}
    if not cuts:
        return found
    kept: list[onnx.NodeProto] = []
    rename: dict[str, str] = {}
    for node in model.graph.node:
        node.input[:] = [rename.get(t, t) for t in node.input]
        kept.append(node)
        if node.output and node.output[0] in cuts:
            out = node.output[0]
            ids, _ = cuts[out]
            wide, back = f"{out}_id_mask", f"{out}_id_mask_bool"
            kept.append(helper.make_node("Cast", [out], [wide], name=wide, to=TensorProto.INT64))
            kept.append(helper.make_node("Cast", [wide], [back], name=back, to=TensorProto.BOOL))
            rename[out] = back
            vi = helper.make_tensor_value_info(wide, TensorProto.INT64, list(shapes[out]))
            vi.doc_string = ids
            found[wide] = vi
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return found


def _from_ids(model: onnx.ModelProto, ids: str, consts: set[str], tables: set[str]) -> set[str]:
    """The tensors computed from the token ids ``ids`` and constants alone (a table lookup's rows are activations)."""
    derived = {ids}
    for node in model.graph.node:
        if any(t in derived for t in node.input) and all(not t or t in derived or t in consts for t in node.input) \
                and not (node.op_type == "Gather" and node.input[0] in tables):
            derived.update(node.output)
    return derived


def _mask_like(tensor: str, readers: dict[str, list[onnx.NodeProto]], tables: set[str], consts: set[str]) -> bool:
    """Whether the values computed from ``tensor`` (with ``consts``: constants, and the other values computed from
    the same token ids) meet an activation somewhere and never index a table (a Gather from a constant ``[rows,
    width]`` table, or CumSum, ArgMax or ArgMin: an index computation)."""
    region, frontier, meets = {tensor}, [tensor], False
    while frontier:
        for node in readers.get(frontier.pop(), []):
            if node.op_type == "Gather" and node.input[0] in tables and node.input[1] in region:
                return False
            if node.op_type in ("CumSum", "ArgMax", "ArgMin"):     # an index computation (CLIP's end-of-text row)
                return False
            if all(not t or t in region or t in consts for t in node.input):
                for out in node.output:
                    if out not in region:
                        region.add(out)
                        frontier.append(out)
            else:
                meets = True
    return meets
