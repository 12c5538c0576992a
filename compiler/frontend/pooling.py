"""Masked pooling over tokens: a sentence encoder's mean of the token embeddings that the attention mask keeps.

sentence-transformers (and the hand-written pooling its users export) writes ``sum(h * m, 1) / clamp(sum(m, 1),
min=1e-9)`` with ``m`` the attention mask unsqueezed, expanded and cast to float. In the ONNX graph that is
``Div(ReduceSum(Mul(h, W), axes), D)``, where ``W`` and ``D`` are computed from the mask input alone (Unsqueeze,
Expand, Cast; ReduceSum, Clip, Cast for ``D``) and ``h`` is an activation.

:func:`find_mask_pools` replaces each such Mul, ReduceSum and Div by one ``MaskPool`` node of ``h`` and the mask
input. Its attribute ``onnx`` carries the part of the graph computing ``W`` and ``D`` from the mask (base64, run by
ONNX's reference evaluator at run time, :func:`..qops_pool.mask_pool`), ``axes`` and ``keepdims`` the ReduceSum's.
The nodes that only fed it are dropped. A mask read this way is a mask input as one the attention reads is
(:func:`.masks.is_mask_input`); one the pooling and the attention both read is both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..qops import pool_terms
from .masks import encode, forward_region, live_nodes, mask_inputs, region_model, sample_masks

__all__ = ["MaskPool", "find_mask_pools", "POOL_REGION_OPS"]

POOL_REGION_OPS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Identity", "Cast", "CastLike",
                             "ReduceSum", "ReduceMean", "Clip", "Max", "Min", "Add", "Sub", "Mul", "Div", "Equal",
                             "Not", "Where", "Greater", "Less", "Transpose", "Slice"})
"""The ops that may compute a pooling's weights and divisor from the mask (ONNX's reference evaluator runs them)."""


@dataclass(frozen=True)
class MaskPool:
    """One masked pooling: ``out = ReduceSum(x * W, axes, keepdims) / D``, ``W`` and ``D`` (float32) computed from
    the graph input ``mask`` by the base64 ONNX model ``model`` (input ``mask``, outputs ``W`` then ``D``)."""

    name: str
    x: str
    mask: str
    out: str
    axes: tuple[int, ...]
    keepdims: bool
    model: str


def _axes(node: onnx.NodeProto, consts: dict[str, onnx.TensorProto], rank: int) -> tuple[int, ...] | None:
    """The ReduceSum's axes (its input from opset 13, else its attribute), non-negative and sorted; every axis when
    none are given; None when they are computed at run time or ``noop_with_empty_axes`` makes it an identity."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] not in consts:
            return None
        axes = [int(v) for v in np.ravel(numpy_helper.to_array(consts[node.input[1]]))]
    else:
        axes = [int(v) for v in attrs.get("axes", [])]
    if not axes:
        return None if attrs.get("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted(a % rank for a in axes))


def _submodel(model: onnx.ModelProto, nodes: list[onnx.NodeProto], mask: onnx.ValueInfoProto, wanted: list[str],
              consts: dict[str, onnx.TensorProto]) -> str:
    """The base64 region model computing the float32 tensors ``wanted`` from ``mask``."""
    outs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in wanted]
    return encode(region_model(model, nodes, mask, wanted, outs, consts))


def _zero_one(encoded: str, mask: onnx.ValueInfoProto) -> bool:
    """Whether the region model ``encoded`` gives weights of 0 and 1 only, on an all-zero, an all-one and three
    seeded random 0/1 masks."""
    shape = tuple(d.dim_value for d in mask.type.tensor_type.shape.dim)
    if not shape or min(shape) < 1:
        return False
    for sample in sample_masks(shape, np.int64):
        try:
            weights, _ = pool_terms(encoded, sample)
        except ValueError:
            return False
        if not np.isin(weights, (0.0, 1.0)).all():
            return False
    return True


def find_mask_pools(model: onnx.ModelProto, token_ids: set[str], shapes: dict[str, tuple[int, ...]],
                    derived: dict[str, onnx.ValueInfoProto] | None = None) -> dict[str, str]:
    """Replace each masked pooling of ``model`` (shapes inferred, constants folded; ``shapes`` the static ones) by
    a ``MaskPool`` node, in place, and drop the nodes left without readers. Returns the mask inputs it reads (name
    -> ONNX type name). ``derived``: masks computed from the token ids (:func:`.id_masks.cut_id_masks`), taken as
    inputs are."""
    masks = {**mask_inputs(model, token_ids, integer=True), **(derived or {})}
    if not masks:
        return {}
    consts = {i.name: i for i in model.graph.initializer}      # read as arrays only where needed
    producer = {out: node for node in model.graph.node for out in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    outputs = {o.name for o in model.graph.output}
    pools: list[tuple[MaskPool, list[onnx.NodeProto]]] = []
    used: dict[str, str] = {}
    for mask, vi in masks.items():
        region, nodes = forward_region(model, mask, consts, POOL_REGION_OPS)
        tainted, _ = forward_region(model, mask, consts)        # never an activation a pooling reads
        for div in model.graph.node:
            if div.op_type != "Div" or len(div.input) != 2 or div.input[1] not in region or div.input[0] in region:
                continue
            reduce = producer.get(div.input[0])
            if reduce is None or reduce.op_type != "ReduceSum" or len(readers.get(reduce.output[0], [])) != 1 or \
                    reduce.output[0] in outputs:
                continue
            mul = producer.get(reduce.input[0])
            if mul is None or mul.op_type != "Mul" or len(readers.get(mul.output[0], [])) != 1 or \
                    mul.output[0] in outputs or sum(t in region for t in mul.input) != 1:
                continue
            weight = next(t for t in mul.input if t in region)
            x = next(t for t in mul.input if t not in region)
            if x in consts or x in tainted or mul.output[0] not in shapes or div.output[0] not in shapes:
                continue
            axes = _axes(reduce, consts, len(shapes[mul.output[0]]))
            if axes is None:
                continue
            keepdims = bool(next((helper.get_attribute_value(a) for a in reduce.attribute if a.name == "keepdims"),
                                 1))
            pool = MaskPool(div.name or f"{div.output[0]}_pool", x, mask, div.output[0], axes, keepdims,
                            _submodel(model, nodes, vi, [weight, div.input[1]], consts))
            pools.append((pool, [mul, reduce, div]))
            used[mask] = TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
        taken = {id(n) for _, group in pools for n in group}
        for mul in model.graph.node:                    # a plain product by the mask (DeBERTa's embeddings)
            if mul.op_type != "Mul" or id(mul) in taken or len(mul.input) != 2 or \
                    sum(t in region for t in mul.input) != 1:
                continue
            weight = next(t for t in mul.input if t in region)
            x = next(t for t in mul.input if t not in region)
            if x in consts or x in tainted or shapes.get(x) is None or shapes.get(x) != shapes.get(mul.output[0]):
                continue
            encoded = _submodel(model, nodes, vi, [weight], consts)
            if not _zero_one(encoded, vi):
                continue
            pool = MaskPool(mul.name or f"{mul.output[0]}_masked", x, mask, mul.output[0], (), True, encoded)
            pools.append((pool, [mul]))
            used[mask] = TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
    if not pools:
        return {}
    replaced = {id(group[-1]): pool for pool, group in pools}
    dropped = {id(n) for _, group in pools for n in group}
    kept = []
    for node in model.graph.node:
        if id(node) in replaced:
            pool = replaced[id(node)]
            node = helper.make_node("MaskPool", [pool.x, pool.mask], [pool.out], name=pool.name, onnx=pool.model,
                                    keepdims=int(pool.keepdims))
            node.attribute.append(helper.make_attribute("axes", list(pool.axes), attr_type=onnx.AttributeProto.INTS))
            kept.append(node)
        elif id(node) not in dropped:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(live_nodes(kept, outputs))
    return used

