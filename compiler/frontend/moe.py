"""Mixture-of-experts routing: a TopK over router scores whose indices pick rows of constant expert stacks.

An MoE layer as exporters write it (transformers' ``batched_mm`` experts: Mixtral, Qwen-MoE, OLMoE, DeepSeek-V3's
descendants, ...): the router's scores ``S [..., E]`` (logits, probabilities or sigmoid scores), ``TopK(S, k)``, the
indices reshaped to one per routed row, ``Gather(W [E, P, Q], idx)`` (or ``GatherND`` by ``idx[..., None]``) of each
expert's weight matrix, a batched MatMul of every routed row by its own expert's matrix, and the chosen scores
(renormalised, or a Softmax over them) weighting the rows' sum. The indices are computed at run time, so no static
program can load "the chosen expert's weights".

:func:`rewrite_topk_routing` rewrites each TopK whose results reach only the forms below, in place, into operators
the lab compiles (any other TopK is left, and the importer refuses it naming the node):

- ``TopKOneHot(S)`` ``[..., k, E]``: row ``j`` one-hot at the ``j``-th largest score, ties to the lower index as in
  TopK, on the CPU. A TopK of ``Where(cond, -inf, x)`` with ``cond`` a float mask ``m != 0`` through Casts to BOOL
  and Nots (DeepSeek-V3's group-limited routing) is ``TopKOneHot(x, m)``, choosing among the entries the fill spares;
- TopK's values, and ``GatherElements(D, idx, axis=-1)``, as ``PickChosen(onehot, D)``: the chosen entries (int8 at
  ``D``'s scale, a move of values);
- values renormalised over the top k, ``v / (ReduceSum(v, -1) [+ c])``: of a Softmax's probabilities, the Softmax
  of the chosen logits (the same numbers, ``exp(l_i) / sum_top exp(l_j)``); of other scores, one ``SumNormalize``;
- ``ScatterElements(zeros, idx, ones)`` (a mask of the chosen entries, group-limited routing's chosen groups) as
  ``ReduceSum(onehot, -2)``;
- a Gather of an expert stack that feeds one MatMul: that MatMul **dense over the experts**, ``sum_e mask_e *
  MatMul(X, W[e])``, with ``mask_e`` the routed rows that chose expert ``e``. Each ``MatMul(X, W[e])`` is a linear
  layer with constant weights over every routed row, so it runs on the accelerator; the lab computes E times the MACs
  of a sparse dispatch, and its reports count them (a static program cannot group rows by expert at run time);
- any other Gather of a constant table by the indices (an expert's bias) as the one-hot rows times the table, a
  MatMul with the constant ``[E, width]``.

The choice is made on int8 scores once quantized: two scores within a step of each other can be chosen otherwise
than in float (the run's error against float shows it).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .masks import drop_dead_nodes, tensor_readers

__all__ = ["ONE_HOT_OP", "SUM_NORMALIZE_OP", "PICK_OP", "rewrite_topk_routing"]

ONE_HOT_OP = "TopKOneHot"
SUM_NORMALIZE_OP = "SumNormalize"
PICK_OP = "PickChosen"
"""The op types the rewrite writes (default domain; the importer takes them only where this module put them)."""

_CHAIN_OPS = frozenset({"Reshape", "Flatten", "Unsqueeze", "Squeeze", "Identity", "Cast"})
"""Ops the indices may pass through on their way to a Gather (each keeps the elements' row-major order)."""


class _Writer:
    """New nodes and constants for one rewrite, named after the TopK node."""

    def __init__(self, model: onnx.ModelProto, base: str) -> None:
        self.model, self.base, self.count = model, base, 0
        self.nodes: list[onnx.NodeProto] = []

    def name(self, what: str) -> str:
        self.count += 1
        return f"{self.base}/moe_{what}_{self.count}"

    def const(self, value: np.ndarray, what: str) -> str:
        name = self.name(what)
        self.model.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], what: str, shape: tuple[int, ...], output: str | None = None,
             name: str | None = None, **attrs) -> str:
        """A node writing ``output`` (a tensor of the file), or a new float32 tensor of static ``shape`` (its
        value_info written, since ONNX's shape inference cannot see through the fused operators already there);
        named ``name`` (the layer's name in reports) or after the TopK."""
        out = output or self.name(what)
        if output is None:
            self.model.graph.value_info.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, list(shape)))
        self.nodes.append(helper.make_node(op, inputs, [out], name=name or self.name(f"{what}_node"), **attrs))
        return out

    def reshape(self, x: str, shape: tuple[int, ...], output: str | None = None) -> str:
        return self.node("Reshape", [x, self.const(np.array(shape, np.int64), "shape")], "reshape", shape, output)

    def pick(self, onehot: str, data: str, shape: tuple[int, ...], k: int, output: str | None = None) -> str:
        """``PickChosen``: the entries of ``data`` (``shape``, ``[..., E]``) at the ``k`` chosen experts,
        ``[..., k]`` (``ReduceSum(onehot * data[..., None, :], -1)``, int8 at ``data``'s scale)."""
        return self.node(PICK_OP, [onehot, data], "values", shape[:-1] + (k,), output)


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default)


def rewrite_topk_routing(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """Rewrite every MoE routing of ``model`` (shapes inferred: ``shapes``; constants folded) as the module
    docstring says, in place, with the value_info of every tensor it adds. Returns the outputs of the
    ``TopKOneHot`` and ``SumNormalize`` nodes written (for the importer's rules); when there are any, the caller
    sorts the nodes (the new ones stand where the TopK stood)."""
    written: set[str] = set()
    for first_output in [n.output[0] for n in model.graph.node if n.op_type == "TopK" and n.domain in ("", "ai.onnx")]:
        # each rewrite copies the node list anew: find the TopK in the current one
        topk = next(n for n in model.graph.node if n.op_type == "TopK" and n.output[0] == first_output)
        written |= _rewrite_one(model, topk, shapes)
    if written:
        drop_dead_nodes(model)
    return written


def _rewrite_one(model: onnx.ModelProto, topk: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """One TopK's routing rewritten (the outputs of the routing nodes written), or nothing changed (empty)."""
    graph = model.graph
    consts = {i.name: i for i in graph.initializer}
    users = tensor_readers(model)
    outputs = {o.name for o in graph.output}
    scores = topk.input[0]
    if len(topk.input) < 2 or topk.input[1] not in consts or scores not in shapes or scores in consts:
        return set()
    k_value = numpy_helper.to_array(consts[topk.input[1]]).ravel()
    rank = len(shapes[scores])
    if k_value.size != 1 or _attr(topk, "largest", 1) != 1 or _attr(topk, "axis", -1) % rank != rank - 1:
        return set()
    k, experts = int(k_value[0]), shapes[scores][-1]
    values = topk.output[0] if topk.output and topk.output[0] else None
    indices = topk.output[1] if len(topk.output) > 1 and topk.output[1] else None
    if not 1 <= k <= experts or indices in outputs:
        return set()
    # the indices' readers, through order-keeping shape changes: Gathers of constant stacks, GatherElements, and
    # ScatterElements of ones into zeros (a mask of the chosen entries)
    gathers: list[onnx.NodeProto] = []
    elements: list[onnx.NodeProto] = []
    scatters: list[onnx.NodeProto] = []
    stack, seen = [indices] if indices else [], set()
    while stack:
        tensor = stack.pop()
        for user in users.get(tensor, []):
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.op_type in _CHAIN_OPS and user.input[0] == tensor and user.output[0] not in outputs:
                stack.append(user.output[0])
            elif user.op_type in ("Gather", "GatherND") and list(user.input[1:]) == [tensor] and \
                    user.input[0] in consts and _gathers_rows(user, shapes, tensor) and \
                    consts[user.input[0]].dims[:1] == [experts] and user.output[0] in shapes:
                gathers.append(user)
            elif user.op_type == "GatherElements" and tensor == indices and list(user.input[1:]) == [indices] and \
                    _attr(user, "axis", 0) % rank == rank - 1 and shapes.get(user.input[0]) == shapes[scores]:
                elements.append(user)
            elif tensor == indices and _marks_chosen(user, indices, consts, shapes[scores], rank):
                scatters.append(user)
            else:
                return set()
    if not (gathers or elements or scatters or values and (users.get(values) or values in outputs)):
        return set()
    producer = {o: n for n in graph.node for o in n.output}
    w = _Writer(model, topk.name or indices or scores)
    source, mask, keep = _masked_scores(scores, producer, consts, shapes)
    onehot = w.node(ONE_HOT_OP, [source] + ([mask] if mask else []), "onehot", shapes[scores][:-1] + (k, experts),
                    k=k, keep=keep)
    rows_of_k = shapes[scores][:-1] + (k,)
    replaced: set[int] = {id(topk)}
    for node in scatters:
        w.node("ReduceSum", [onehot, w.const(np.array([-2], np.int64), "axes")], "chosen", shapes[scores],
               node.output[0], keepdims=0)
        replaced.add(id(node))
    if values:
        _values(w, topk, onehot, values, users, shapes, producer, consts, replaced, values in outputs)
    for node in elements:
        w.pick(onehot, node.input[0], shapes[scores], k, node.output[0])
        replaced.add(id(node))
        _sum_normalize(w, node.output[0], users, producer, consts, rows_of_k, replaced)
    for node in gathers:
        _expert_gather(w, node, onehot, rows_of_k, experts, consts, users, shapes, outputs, replaced)
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        if id(node) == id(topk):
            kept.extend(w.nodes)
        elif id(node) not in replaced:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    return {n.output[0] for n in w.nodes if n.op_type in (ONE_HOT_OP, SUM_NORMALIZE_OP, PICK_OP)}


def _marks_chosen(node: onnx.NodeProto, indices: str, consts: dict[str, onnx.TensorProto], shape: tuple[int, ...],
                  rank: int) -> bool:
    """``node`` is ``ScatterElements(zeros, indices, ones, axis=-1)`` (no reduction), the zeros of the scores'
    ``shape``: 1 at the chosen entries (distinct, so exactly ``ReduceSum(onehot, -2)``)."""
    if node.op_type != "ScatterElements" or len(node.input) != 3 or node.input[1] != indices or \
            _attr(node, "axis", 0) % rank != rank - 1 or any(a.name == "reduction" and a.s not in (b"", b"none")
                                                              for a in node.attribute):
        return False
    data, updates = (consts.get(t) for t in (node.input[0], node.input[2]))
    if data is None or updates is None:
        return False
    zeros, ones = numpy_helper.to_array(data), numpy_helper.to_array(updates)
    return zeros.shape == tuple(shape) and not zeros.any() and bool((ones == 1).all())


def _masked_scores(scores: str, producer: dict[str, onnx.NodeProto], consts: dict[str, onnx.TensorProto],
                   shapes: dict[str, tuple[int, ...]]) -> tuple[str, str | None, str]:
    """The scores the choice is made on, and the mask that excludes some: a TopK of ``Where(cond, -inf, x)`` (or
    ``Where(cond, x, -inf)``) chooses among the entries of ``x`` the fill spares, ties and all, when ``cond`` is
    ``m != 0`` of a float ``m`` through Casts to BOOL and Nots. Returns ``(x, m, keep)``, keep "nonzero" or "zero"
    (where ``m`` keeps an entry), or ``(scores, None, "all")``."""
    where = producer.get(scores)
    if where is None or where.op_type != "Where" or len(where.input) != 3:
        return scores, None, "all"
    for fill_at, x in ((1, where.input[2]), (2, where.input[1])):
        fill = consts.get(where.input[fill_at])
        if fill is None or shapes.get(x) != shapes.get(scores):
            continue
        value = numpy_helper.to_array(fill)
        if value.size != 1 or not np.isneginf(value).all():
            continue
        flips, cond = 0 if fill_at == 1 else 1, where.input[0]     # keep where the condition is false (true)
        while True:
            node = producer.get(cond)
            if node is None or node.op_type not in ("Not", "Cast"):
                return scores, None, "all"
            if node.op_type == "Not":
                flips, cond = flips + 1, node.input[0]
                continue
            if _attr(node, "to", 0) != TensorProto.BOOL:
                return scores, None, "all"
            below = producer.get(node.input[0])
            if below is not None and (below.op_type == "Not" or below.op_type == "Cast" and
                                      _attr(below, "to", 0) == TensorProto.BOOL):
                cond = node.input[0]
                continue
            m = node.input[0]
            if shapes.get(m) != shapes.get(scores) or m in consts:
                return scores, None, "all"
            # cond = (m != 0) xor (flips odd) with the fill where cond holds: keep = not cond
            return x, m, "nonzero" if flips % 2 == 1 else "zero"
    return scores, None, "all"


def _gathers_rows(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]], index: str) -> bool:
    """A Gather on axis 0, or a GatherND (batch_dims 0) whose indices end in one coordinate: rows of the stack."""
    if node.op_type == "Gather":
        return _attr(node, "axis", 0) == 0
    return _attr(node, "batch_dims", 0) == 0 and shapes.get(index, (0,))[-1:] == (1,)


def _values(w: _Writer, topk: onnx.NodeProto, onehot: str, values: str, users: dict[str, list[onnx.NodeProto]],
            shapes: dict[str, tuple[int, ...]], producer: dict[str, onnx.NodeProto],
            consts: dict[str, onnx.TensorProto], replaced: set[int], graph_output: bool) -> None:
    """TopK's values as the chosen scores; a renormalisation ``v / ReduceSum(v, -1)`` of a Softmax's probabilities
    as the Softmax of the chosen logits, of other scores as one SumNormalize."""
    source = producer.get(topk.input[0])
    while source is not None and source.op_type == "Cast" and _attr(source, "to", 0) == TensorProto.FLOAT:
        source = producer.get(source.input[0])
    shape = shapes[topk.input[0]]
    rank, k = len(shape), shapes[values][-1]
    softmax = source is not None and source.op_type == "Softmax" and _attr(source, "axis", -1) % rank == rank - 1
    readers = users.get(values, [])
    divs = [u for u in readers if softmax and _renormalises(u, values, producer, consts, rank) == 0.0]
    sums = {id(producer[d.input[1]]) for d in divs}          # their ReduceSums, dead once the Divs go
    if graph_output or any(id(u) not in sums and all(id(u) != id(d) for d in divs) for u in readers):
        w.pick(onehot, topk.input[0], shape, k, values)
    for div in divs:
        assert source is not None
        logits = w.pick(onehot, source.input[0], shape, k)
        w.node("Softmax", [logits], "renormalised", shape[:-1] + (k,), div.output[0], axis=-1)
        replaced.add(id(div))
    _sum_normalize(w, values, users, producer, consts, shape[:-1] + (k,), replaced)


def _sum_normalize(w: _Writer, values: str, users: dict[str, list[onnx.NodeProto]],
                   producer: dict[str, onnx.NodeProto], consts: dict[str, onnx.TensorProto], shape: tuple[int, ...],
                   replaced: set[int]) -> None:
    """Each ``Div(values, ReduceSum(values, -1) [+ c])`` as one ``SumNormalize`` (a quotient of two activations the
    importer takes in no other form)."""
    for div in users.get(values, []):
        eps = _renormalises(div, values, producer, consts, len(shape))
        if eps is not None and id(div) not in replaced:
            w.node(SUM_NORMALIZE_OP, [values], "renormalised", shape, div.output[0], axis=-1, epsilon=eps)
            replaced.add(id(div))


def _renormalises(node: onnx.NodeProto, values: str, producer: dict[str, onnx.NodeProto],
                  consts: dict[str, onnx.TensorProto], rank: int) -> float | None:
    """The constant ``c`` (0 without one) when ``node`` is ``Div(values, ReduceSum(values, [-1], keepdims=1) [+ c])``
    (``values`` of ``rank``, ``c`` one value), else None."""
    if node.op_type != "Div" or node.input[0] != values:
        return None
    den, eps = producer.get(node.input[1]), 0.0
    if den is not None and den.op_type == "Add" and len(den.input) == 2:
        c = next((numpy_helper.to_array(consts[t]) for t in den.input if t in consts), None)
        if c is None or c.size != 1:
            return None
        eps = float(c.ravel()[0])
        den = next((producer[t] for t in den.input if t in producer), None)
    if den is None or den.op_type != "ReduceSum" or den.input[0] != values or not _attr(den, "keepdims", 1) or \
            len(den.input) < 2 or den.input[1] not in consts:
        return None
    axes = [int(a) % rank for a in numpy_helper.to_array(consts[den.input[1]]).ravel()]
    return eps if axes == [rank - 1] else None


def _expert_gather(w: _Writer, node: onnx.NodeProto, onehot: str, rows_of_k: tuple[int, ...], experts: int,
                   consts: dict[str, onnx.TensorProto], users: dict[str, list[onnx.NodeProto]],
                   shapes: dict[str, tuple[int, ...]], outputs: set[str], replaced: set[int]) -> None:
    """One Gather of a constant stack ``W [E, ...]`` by the (reshaped) indices: dense over the experts when it feeds
    one MatMul as a stack of matrices, else the one-hot rows times the table."""
    table = numpy_helper.to_array(consts[node.input[0]])
    gathered = node.output[0]
    rows = shapes[gathered][:len(shapes[gathered]) - (table.ndim - 1)]
    readers = users.get(gathered, [])
    replaced.add(id(node))
    matmul = readers[0] if len(readers) == 1 and readers[0].op_type == "MatMul" else None
    if table.ndim == 3 and matmul is not None and gathered not in outputs and matmul.output[0] in shapes:
        other = matmul.input[1] if matmul.input[0] == gathered else matmul.input[0]
        if other != gathered and other in shapes and len(shapes[other]) == len(shapes[gathered]):
            _dense_experts(w, matmul, gathered, other, table, onehot, rows, rows_of_k, experts, shapes)
            replaced.add(id(matmul))
            return
    flat = w.reshape(onehot, tuple(rows) + (experts,))
    width = int(np.prod(table.shape[1:]))
    product = w.node("MatMul", [flat, w.const(table.reshape(experts, width).astype(np.float32), "table")], "rows",
                     tuple(rows) + (width,))
    w.reshape(product, shapes[gathered], gathered)


def _dense_experts(w: _Writer, matmul: onnx.NodeProto, gathered: str, other: str, table: np.ndarray, onehot: str,
                   rows: tuple[int, ...], rows_of_k: tuple[int, ...], experts: int,
                   shapes: dict[str, tuple[int, ...]]) -> None:
    """``MatMul`` of the gathered matrices ``[R.., P, Q]`` and ``other`` as ``sum_e mask_e * MatMul(., W[e])``, each
    product a linear layer with constant weights over the rows (``other`` transposed when the stack came first)."""
    out_shape = shapes[matmul.output[0]]
    out_rank = len(out_shape)
    first = matmul.input[0] == gathered
    swap = list(range(out_rank - 2)) + [out_rank - 1, out_rank - 2]
    if first:
        x = w.node("Transpose", [other], "rows_t", tuple(shapes[other][p] for p in swap), perm=swap)
    else:
        x = other
    product_shape = tuple(out_shape[p] for p in swap) if first else out_shape
    terms = []
    for e in range(experts):
        weight = (table[e].T if first else table[e]).astype(np.float32)
        product = w.node("MatMul", [x, w.const(np.ascontiguousarray(weight), f"expert{e}")], f"expert{e}",
                         product_shape, name=f"{matmul.name or matmul.output[0]}/expert{e}")
        chosen = w.node("Slice", [onehot, w.const(np.array([e], np.int64), "start"),
                                  w.const(np.array([e + 1], np.int64), "end"),
                                  w.const(np.array([-1], np.int64), "axis")], f"chose{e}", rows_of_k + (1,))
        mask = w.reshape(chosen, tuple(rows) + (1,) * (out_rank - len(rows)))
        terms.append(w.node("Mul", [product, mask], f"routed{e}", product_shape))
    total = terms[0]
    for k, term in enumerate(terms[1:]):
        last = k == len(terms) - 2
        total = w.node("Add", [total, term], "sum", product_shape, None if not last or first else matmul.output[0])
    if first:
        w.node("Transpose", [total], "out_t", out_shape, matmul.output[0], perm=swap)
    elif len(terms) == 1:
        w.node("Identity", [total], "out", out_shape, matmul.output[0])

