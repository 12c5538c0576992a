"""Attention score chains brought to the form the mask import reads: a runtime mask term added just before a Softmax.

Some exporters add an attention mask to the scores in one shape and take the Softmax in another. XGLM and the older
Hugging Face encoder-decoders view the scores ``[B*H, S, L]`` as ``[B, H, S, L]``, add the mask and view them back
before the Softmax; BLOOM adds its ALiBi bias (computed from the attention mask) in ``[B*H, S, L]`` and the padding
and causal mask after a view as ``[B, H, S, L]``. The lab imports a runtime mask only as a term added to the scores
right before the one Softmax it feeds (:mod:`.masks`), so such files were refused. :func:`normalize` rewrites them,
in place and exactly (every value the graph computes is unchanged, but for the one rounding a moved scale
gives a finite nonzero mask entry), in these steps:

- *A Reshape sinks below the Softmax.* A Reshape that keeps the last axis maps rows to rows, so a Softmax over the
  last axis commutes with it, and so does every element-wise node between them: each node takes the Reshape's input
  instead, its other operands are reshaped to match (expanded first along merged axes they broadcast over), and
  the Reshape follows the Softmax. Only a Reshape with a mask term before it in the chain moves: elsewhere the
  chain already has the form the import reads.
- *A constant shift before a Softmax goes* (an Add of a one-element constant, which a Softmax ignores), and so does
  the max shift written out, ``x - ReduceMax(x, -1)`` (a shift by one amount per row).
- *A positive scale after the mask moves before it*: ``(x + m) * c`` becomes ``x * c + m * c`` (CodeGen divides
  the masked scores by the square root of the head size).
- *Two mask terms join.* ``(x + a) + b``, with ``a`` and ``b`` both computed from mask inputs and constants alone,
  becomes ``x + (a + b)``: one term, which the mask import evaluates from the mask at run time.

A *mask term* is a tensor computed from integer or bool graph inputs and constants alone, with no lookup of a float
table of two or more axes (an embedding) on the way: float activations and token embeddings are not.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["normalize", "reshape_groups", "map_operand_shape", "absorb_sinks"]

_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Where", "Clip"})
"""Element-wise nodes with operands besides the chain's (Where's condition and other branch; Clip's bounds)."""

_UNARY = frozenset({"Cast", "Identity", "Neg", "Tanh", "Abs", "Relu", "Sigmoid", "Erf", "Exp", "Sqrt"})
"""Element-wise nodes of one operand a chain may pass through."""

_FLOAT = onnx.TensorProto.FLOAT


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[range, range]] | None:
    """The axes of ``src`` and ``dst`` (shapes of equal element counts) grouped so that a Reshape from one to the
    other maps each group of ``src`` axes onto its group of ``dst`` axes (equal products); None when the counts
    differ or a shape holds a 0."""
    if int(np.prod(src)) != int(np.prod(dst)) or 0 in src or 0 in dst:
        return None
    groups: list[tuple[range, range]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        i0, j0, ps, pd = i, j, 1, 1
        if i < len(src):
            ps, i = ps * src[i], i + 1
        if j < len(dst):
            pd, j = pd * dst[j], j + 1
        while ps != pd:
            if ps < pd and i < len(src):
                ps, i = ps * src[i], i + 1
            elif j < len(dst):
                pd, j = pd * dst[j], j + 1
            else:
                return None
        while i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            i += 1                                      # trailing ones join the group they follow
        while j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            j += 1
        groups.append((range(i0, i), range(j0, j)))
    return groups


def map_operand_shape(shape: tuple[int, ...], out: tuple[int, ...], target: tuple[int, ...]
                      ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """An operand of shape ``shape`` broadcast against ``out`` (a value Reshaped from ``target``), as an operand to
    broadcast against ``target`` instead: ``(expanded, reshaped)``, where the operand Expanded to ``expanded`` (the
    axes of ``out`` it broadcasts over, in a group of axes the Reshape merges or splits together with axes it does
    not broadcast over, made whole) and then Reshaped to ``reshaped`` gives, broadcast to ``target``, the
    operand broadcast to ``out`` Reshaped to ``target``. None when ``shape`` does not broadcast to ``out``."""
    if len(shape) > len(out):
        return None
    aligned = (1,) * (len(out) - len(shape)) + tuple(shape)
    if any(a not in (1, o) for a, o in zip(aligned, out)):
        return None
    groups = reshape_groups(target, out)
    if groups is None:
        return None
    expanded = list(aligned)
    reshaped = [1] * len(target)
    for t_axes, o_axes in groups:
        dims = [aligned[k] for k in o_axes]
        if all(d == 1 for d in dims):
            continue
        if any(aligned[k] != out[k] for k in o_axes):
            for k in o_axes:
                expanded[k] = out[k]
        for k in t_axes:
            reshaped[k] = target[k]
    return tuple(expanded), tuple(reshaped)


class _Graph:
    """Producers, readers, constants and static shapes of a model, for one rewrite."""

    def __init__(self, model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> None:
        self.model = model
        self.consts = {i.name: i for i in model.graph.initializer}
        self.shapes = {**{name: tuple(int(d) for d in init.dims) for name, init in self.consts.items()}, **shapes}
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in model.graph.node:
            for t in n.input:
                self.readers.setdefault(t, []).append(n)
        self.outputs = {o.name for o in model.graph.output}
        self.input_types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input
                            if vi.name not in self.consts}
        self._mask: dict[str, bool] = {}

    def only_reader(self, tensor: str, node: onnx.NodeProto) -> bool:
        return tensor not in self.outputs and [id(n) for n in self.readers.get(tensor, [])] == [id(node)]

    def is_mask_term(self, tensor: str) -> bool:
        """Whether ``tensor`` is computed from integer or bool graph inputs and constants alone, through no lookup
        of a float table of two or more axes, and reads at least one such input (one pass over the graph, in
        order, the first time)."""
        if not self._mask:
            kind = {name: "mask" if t != _FLOAT else "other" for name, t in self.input_types.items()}
            for node in self.model.graph.node:
                kinds = {kind.get(t, "const" if t in self.consts or not t else "other") for t in node.input}
                table = node.input[0] if node.op_type == "Gather" and node.input else ""
                lookup = table in self.consts and len(self.consts[table].dims) >= 2 and \
                    self.consts[table].data_type == _FLOAT
                out = "other" if "other" in kinds or lookup else "mask" if "mask" in kinds else "const"
                kind.update((o, out) for o in node.output)
            self._mask = {name: k == "mask" for name, k in kind.items()}
        return self._mask.get(tensor, False)

    def constant(self, name: str) -> np.ndarray | None:
        init = self.consts.get(name)
        return None if init is None else numpy_helper.to_array(init)


def _softmax_axis_is_last(node: onnx.NodeProto, rank: int) -> bool:
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    return axis in (-1, rank - 1)


def _chain_operand(g: _Graph, node: onnx.NodeProto) -> list[str]:
    """The operands of element-wise ``node`` the chain may come through: not constants, of the output's shape."""
    out = g.shapes.get(node.output[0])
    inputs = list(node.input[1:3] if node.op_type == "Where" else node.input[:1] if node.op_type == "Clip"
                  else node.input)
    return [t for t in inputs if t and t not in g.consts and g.shapes.get(t) == out]


def _find_reshape(g: _Graph, tensor: str, path: list[tuple[onnx.NodeProto, str]]
                  ) -> tuple[onnx.NodeProto, list[tuple[onnx.NodeProto, str]]] | None:
    """Walking back from ``tensor`` through element-wise nodes each read only by the next: the first Reshape that
    keeps the last axis, and the nodes after it (each with the operand the chain enters by), nearest first."""
    node = g.producer.get(tensor)
    if node is None:
        return None
    reader = path[0][0] if path else None
    if reader is not None and not g.only_reader(tensor, reader):
        return None
    if node.op_type == "Reshape":
        src, dst = g.shapes.get(node.input[0]), g.shapes.get(node.output[0])
        if src and dst and src[-1] == dst[-1] and node.input[1] in g.consts:
            return node, path
        return None
    if node.op_type not in _BINARY | _UNARY or len(node.output) != 1:
        return None
    for operand in _chain_operand(g, node):
        found = _find_reshape(g, operand, [(node, operand)] + path)
        if found is not None:
            return found
    return None


def _has_mask_term_before(g: _Graph, tensor: str, depth: int = 8) -> bool:
    """Whether a node among the (at most ``depth``) element-wise or Reshape nodes before ``tensor`` on the chain adds
    a mask term."""
    for _ in range(depth):
        node = g.producer.get(tensor)
        if node is None or node.op_type not in _BINARY | _UNARY | {"Reshape"}:
            return False
        if node.op_type == "Reshape":
            tensor = node.input[0]
            continue
        chain = _chain_operand(g, node)
        if any(t and t not in chain and g.is_mask_term(t) for t in node.input) or \
                (len(chain) == 2 and sum(g.is_mask_term(t) for t in chain) == 1):   # a term of the scores' shape
            return True                                                           # (BLOOM's ALiBi in a decode step)
        if len(chain) != 1:
            return False
        tensor = chain[0]
    return False


def _shape_const(model: onnx.ModelProto, name: str, shape: Iterable[int]) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.array(list(shape), np.int64), name))
    return name


def _sink(g: _Graph, softmax: onnx.NodeProto, reshape: onnx.NodeProto, path: list[tuple[onnx.NodeProto, str]],
          new_nodes: list[tuple[onnx.NodeProto, list[onnx.NodeProto]]]) -> bool:
    """Rewrite ``reshape -> path -> softmax`` as ``path -> softmax -> reshape`` in the Reshape's input shape;
    ``new_nodes`` collects the nodes to insert before each node. False (nothing changed) when an operand does not
    map."""
    src, dst = g.shapes[reshape.input[0]], g.shapes[reshape.output[0]]
    groups = reshape_groups(src, dst)
    if groups is None or groups[-1] != (range(len(src) - 1, len(src)), range(len(dst) - 1, len(dst))):
        return False                                      # the Softmax's rows would not stay rows
    plans: list[tuple[onnx.NodeProto, int, str, tuple[int, ...], tuple[int, ...]]] = []
    for node, operand in path:
        if g.shapes.get(node.output[0]) != dst:
            return False
        for k, t in enumerate(node.input):
            if not t or t == operand or g.shapes.get(t) == ():
                continue                                  # a scalar broadcasts against any shape
            shape = g.shapes.get(t)
            mapped = None if shape is None else map_operand_shape(shape, dst, src)
            if mapped is None:
                return False
            plans.append((node, k, t, *mapped))
    name = reshape.output[0]
    for node, k, t, expanded, reshaped in plans:
        value = g.constant(t)
        fresh = f"{t}_as_{node.name or node.output[0]}"
        if value is not None:
            full = np.broadcast_to(value, (1,) * (len(expanded) - value.ndim) + value.shape)
            g.model.graph.initializer.append(numpy_helper.from_array(
                np.ascontiguousarray(np.broadcast_to(full, expanded).reshape(reshaped)), fresh))
            node.input[k] = fresh
            continue
        before: list[onnx.NodeProto] = []
        x = t
        if expanded != (1,) * (len(expanded) - len(g.shapes[t])) + g.shapes[t]:
            before.append(helper.make_node("Expand", [x, _shape_const(g.model, f"{fresh}_expand_shape", expanded)],
                                           [f"{fresh}_expanded"], name=f"{fresh}_expand"))
            x = f"{fresh}_expanded"
        before.append(helper.make_node("Reshape", [x, _shape_const(g.model, f"{fresh}_shape", reshaped)], [fresh],
                                       name=f"{fresh}_reshape"))
        new_nodes.append((node, before))
        node.input[k] = fresh
    first, operand = path[0] if path else (softmax, softmax.input[0])
    first.input[:] = [reshape.input[0] if t == operand else t for t in first.input]
    out = softmax.output[0]
    softmax.output[0] = f"{out}_rows"
    reshape.input[0] = softmax.output[0]
    reshape.output[0] = out
    del reshape.input[1:]
    reshape.input.append(_shape_const(g.model, f"{name}_after_softmax", dst))
    for attr in list(softmax.attribute):
        if attr.name == "axis":
            softmax.attribute.remove(attr)
    softmax.attribute.append(helper.make_attribute("axis", -1))
    return True


def _order(model: onnx.ModelProto, moved: list[onnx.NodeProto],
           inserted: list[tuple[onnx.NodeProto, list[onnx.NodeProto]]]) -> None:
    """Put each node of ``moved`` right after the Softmax it now follows and each inserted node before its reader."""
    after = {id(n): n for n in moved}
    before: dict[int, list[onnx.NodeProto]] = {}
    for node, new in inserted:
        before.setdefault(id(node), []).extend(new)
    softmax_of = {n.input[0]: n for n in moved}
    nodes = []
    for node in model.graph.node:
        if id(node) in after:
            continue
        nodes.extend(before.get(id(node), []))
        nodes.append(node)
        for out in node.output:
            if out in softmax_of:
                nodes.append(softmax_of[out])
    del model.graph.node[:]
    model.graph.node.extend(nodes)


def _join_terms(g: _Graph) -> bool:
    """``(x + a) + b`` -> ``x + (a + b)`` where ``a`` and ``b`` are mask terms and ``x + a`` has no other reader."""
    changed = False
    for node in list(g.model.graph.node):
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        for k in (0, 1):
            inner = g.producer.get(node.input[k])
            b = node.input[1 - k]
            if inner is None or inner.op_type != "Add" or not g.only_reader(node.input[k], node) \
                    or not g.is_mask_term(b):
                continue
            terms = [t for t in inner.input if g.is_mask_term(t)]
            if len(terms) != 1 or len(inner.input) != 2:
                continue
            a = terms[0]
            x = inner.input[1] if inner.input[0] == a else inner.input[0]
            if g.is_mask_term(x) or g.shapes.get(x) != g.shapes.get(node.output[0]):
                continue
            inner.input[:] = [a, b]                       # inner now computes a + b
            node.input[:] = [x, inner.output[0]]
            changed = True
            break
    return changed


def _scale_after_mask(g: _Graph) -> bool:
    """``Softmax((x + m) * c)`` (or ``/ c``), ``m`` a mask term and ``c`` a positive one-element constant ->
    ``Softmax(x * c + m * c)``: the mask term then feeds the Softmax directly, with the scale applied to it as to the
    scores (CodeGen adds its mask before dividing by the square root of the head size). Kept entries (``m = 0``) are
    bit for bit unchanged; a finite nonzero ``m`` moves by at most one float32 rounding."""
    changed = False
    for add in list(g.model.graph.node):
        if add.op_type != "Add" or len(add.input) != 2 or add.output[0] in g.outputs:
            continue
        readers = g.readers.get(add.output[0], [])
        scale = readers[0] if len(readers) == 1 else None
        if scale is None or scale.op_type not in ("Mul", "Div") or len(scale.input) != 2 or \
                scale.output[0] in g.outputs:
            continue
        k = 0 if scale.input[0] == add.output[0] else 1
        c = g.constant(scale.input[1 - k])
        softmax = g.readers.get(scale.output[0], [])
        if (scale.op_type == "Div" and k != 0) or scale.input[1 - k] == add.output[0] or c is None or \
                c.size != 1 or not float(c.reshape(-1)[0]) > 0 or len(softmax) != 1 or \
                softmax[0].op_type != "Softmax":
            continue
        terms = [t for t in add.input if g.is_mask_term(t)]
        if len(terms) != 1:
            continue
        m = terms[0]
        x = add.input[1] if add.input[0] == m else add.input[0]
        if g.shapes.get(x) is None or g.shapes.get(x) != g.shapes.get(add.output[0]):
            continue
        scaled_mask = f"{add.output[0]}_scaled_term"
        inputs = list(scale.input)
        inputs[k] = m
        g.model.graph.node.append(helper.make_node(scale.op_type, inputs, [scaled_mask],
                                                   name=f"{scale.name or scaled_mask}_term"))
        scale.input[k] = x
        add.input[:] = [scale.output[0], scaled_mask]
        softmax[0].input[0] = add.output[0]
        changed = True
    return changed


def _drop_shifts(g: _Graph) -> bool:
    """Remove an Add (or Sub) of a one-element constant whose output only a Softmax reads: a Softmax does not change
    when every input moves by one amount (Hugging Face's TF ``stable_softmax`` adds 1e-9 so)."""
    changed = False
    for node in list(g.model.graph.node):
        if node.op_type not in ("Add", "Sub") or len(node.input) != 2 or \
                not g.only_reader(node.output[0], g.readers.get(node.output[0], [node])[0]):
            continue
        reader = g.readers[node.output[0]][0]
        k = next((i for i, t in enumerate(node.input) if t in g.consts and
                  int(np.prod(g.consts[t].dims, dtype=np.int64)) == 1), None)
        if reader.op_type != "Softmax" or k is None or (node.op_type == "Sub" and k == 0) or \
                node.input[1 - k] in g.consts:
            continue
        reader.input[0] = node.input[1 - k]
        g.model.graph.node.remove(node)
        changed = True
    return changed


def _drop_max_shifts(g: _Graph) -> bool:
    """Remove a ``Sub(x, ReduceMax(x, [-1], keepdims=1))`` whose output only a Softmax over the last axis reads (the
    max shift written out before a Softmax, GPT-OSS's and MiMo's attention): the Softmax reads ``x``, as it gives the
    same values."""
    changed = False
    for node in list(g.model.graph.node):
        if node.op_type != "Sub" or len(node.input) != 2 or node.output[0] in g.outputs:
            continue
        readers = g.readers.get(node.output[0], [])
        peak = g.producer.get(node.input[1])
        rank = len(g.shapes.get(node.input[0], ()))
        if len(readers) != 1 or readers[0].op_type != "Softmax" or not rank or \
                not _softmax_axis_is_last(readers[0], rank) or peak is None or peak.op_type != "ReduceMax" or \
                peak.input[0] != node.input[0] or not _reduces_last(g, peak, rank):
            continue
        readers[0].input[0] = node.input[0]
        g.model.graph.node.remove(node)
        if not g.readers.get(peak.output[0], [])[1:] and peak.output[0] not in g.outputs:
            g.model.graph.node.remove(peak)
        changed = True
    return changed


def _reduces_last(g: _Graph, node: onnx.NodeProto, rank: int) -> bool:
    """``node`` (a ReduceMax) reduces the last axis alone and keeps it (axes an attribute, or an input of opset 18)."""
    axes = _reduce_axes_of(g, node)
    return _keeps_dims(node) and axes is not None and [a % rank for a in axes] == [rank - 1]


def normalize(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> bool:
    """One step of the rewrite the module docstring describes, in place, on ``model`` with its static ``shapes``:
    every Reshape that can sink below its Softmax does, else mask terms join. True when anything changed: the caller
    then sorts the nodes, infers the shapes again and calls it again, until it returns False."""
    g = _Graph(model, shapes)
    if _drop_shifts(g) or _drop_max_shifts(g) or _scale_after_mask(g):
        return True
    moved: list[onnx.NodeProto] = []
    inserted: list[tuple[onnx.NodeProto, list[onnx.NodeProto]]] = []
    for softmax in [n for n in model.graph.node if n.op_type == "Softmax"]:
        rank = len(shapes.get(softmax.input[0], ()))
        if not rank or not _softmax_axis_is_last(softmax, rank) or not g.only_reader(softmax.input[0], softmax):
            continue
        found = _find_reshape(g, softmax.input[0], [])
        if found is None:
            continue
        reshape, path = found
        if not g.only_reader(reshape.output[0], path[0][0] if path else softmax) \
                or not _has_mask_term_before(g, reshape.input[0]):
            continue
        if _sink(g, softmax, reshape, path, inserted):
            moved.append(reshape)
    if moved:
        _order(model, moved, inserted)
        return True
    return _join_terms(g)


def absorb_sinks(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray | str]:
    """Attention sinks (GPT-OSS, MiMo, FLINT): ``Slice(Softmax(Concat([x, C], -1)), [0, n), -1)``, ``C [..., w]``
    a constant, ``n`` x's last axis (identity Casts allowed between the Softmax and the Slice), rewritten in place
    as one Softmax of ``x`` writing the Slice's output, so that a mask added to ``x`` reaches the Softmax as the mask
    import reads it. Returns each such Softmax's node name (made unique) -> ``C``, its sink logits (float32), which
    the Softmax's denominator counts (:func:`..qops.sink_softmax`); or, for sinks computed from the activations
    (``C`` a tensor of the graph whose rows broadcast against ``x``'s, Inkling-2), ``C``'s name, made a graph output
    meanwhile so that no pass drops its nodes (:func:`sink_outputs` names them for the import). The max shift
    written out before such a Softmax goes first (:func:`_drop_max_shifts`)."""
    while _drop_max_shifts(_Graph(model, shapes)):
        pass
    g = _Graph(model, shapes)
    names = [n.name for n in model.graph.node]
    sinks: dict[str, np.ndarray | str] = {}
    for softmax in [n for n in model.graph.node if n.op_type == "Softmax"]:
        before: list[onnx.NodeProto] = []
        concat = g.producer.get(softmax.input[0])
        while concat is not None and _is_identity(concat) and g.only_reader(concat.output[0], (before or
                                                                                               [softmax])[-1]):
            before.append(concat)
            concat = g.producer.get(concat.input[0])
        rank = len(shapes.get(softmax.input[0], ()))
        if concat is None or concat.op_type != "Concat" or len(concat.input) != 2 or not rank or \
                not _softmax_axis_is_last(softmax, rank) or \
                not g.only_reader(concat.output[0], (before or [softmax])[-1]):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in concat.attribute}
        x, c = concat.input
        sink: np.ndarray | str | None = g.constant(c)
        if sink is None and c in shapes and len(shapes[c]) == rank and _rows_fit(shapes[c], shapes.get(x, ())):
            sink = c                        # computed from the activations (Inkling-2's per-query sink projection)
        if int(attrs.get("axis", 0)) % rank != rank - 1 or sink is None or x in g.consts or x not in shapes:
            continue
        tail, between = softmax.output[0], []
        while len(g.readers.get(tail, [])) == 1 and tail not in g.outputs and _is_identity(g.readers[tail][0]):
            between.append(g.readers[tail][0])
            tail = between[-1].output[0]
        readers = g.readers.get(tail, [])
        if tail in g.outputs or len(readers) != 1 or not _keeps_first(g, readers[0], shapes[x][-1], rank):
            continue
        if names.count(softmax.name) != 1 or not softmax.name:
            softmax.name = f"{readers[0].output[0]}_softmax"
        softmax.input[0] = x
        softmax.output[0] = readers[0].output[0]
        moved = onnx.NodeProto.FromString(softmax.SerializeToString())   # where the Slice was: after a computed sink
        model.graph.node.insert(list(model.graph.node).index(readers[0]), moved)
        for node in [softmax, concat, *before, *between, readers[0]]:
            model.graph.node.remove(node)
        sinks[moved.name] = sink if isinstance(sink, str) else sink.astype(np.float32)
        if isinstance(sink, str) and sink not in g.outputs:   # live while no ONNX node reads it (dropped at import)
            model.graph.output.append(helper.make_tensor_value_info(sink, _FLOAT, None))
            g.outputs.add(sink)
    return sinks


def _rows_fit(sink: tuple[int, ...], x: tuple[int, ...]) -> bool:
    """A sink tensor of shape ``sink`` broadcasts against the rows of ``x`` (every axis but the last)."""
    try:
        return len(sink) == len(x) and np.broadcast_shapes(sink[:-1], x[:-1]) == tuple(x[:-1])
    except ValueError:
        return False


def _is_identity(node: onnx.NodeProto) -> bool:
    """An Identity, or a Cast to FLOAT (of float32 values, an identity)."""
    return node.op_type == "Identity" or node.op_type == "Cast" and \
        any(a.name == "to" and a.i == _FLOAT for a in node.attribute)


def _keeps_first(g: _Graph, node: onnx.NodeProto, n: int, rank: int) -> bool:
    """``node`` is a Slice of the last axis from 0 to ``n`` (of ``n + w``), step 1."""
    if node.op_type != "Slice" or len(node.input) < 3:
        return False
    starts, ends = g.constant(node.input[1]), g.constant(node.input[2])
    axes = g.constant(node.input[3]) if len(node.input) > 3 and node.input[3] else np.arange(rank)
    steps = g.constant(node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(1, np.int64)
    if starts is None or ends is None or axes is None or steps is None or axes.size != 1 or \
            int(axes.ravel()[0]) % rank != rank - 1 or int(starts.ravel()[0]) != 0 or int(steps.ravel()[0]) != 1:
        return False
    full = g.shapes.get(node.input[0], (0,))[-1]
    end = int(ends.ravel()[0])
    return (end + full if end < 0 else min(end, full)) == n < full


def fuse_log_softmax(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """Log-softmax forms, rewritten in place into the operators they compute (the same values, without the int8
    roundings between their steps); returns how many nodes it wrote:

    * ``Log(ReduceSum(Exp(z), axes, keepdims))`` (ONNX's expansion of ReduceLogSumExp) as ``ReduceLogSumExp``;
    * ``Sub(z, ReduceLogSumExp(z, one axis, keepdims=1))`` as ``LogSoftmax(z, axis)``, and ``Exp`` of that, read by
      nothing else, as ``Softmax(z, axis)`` (Inkling's router renormalises its weights so);
    * ``LogSoftmax(Sub(x, ReduceMax(x, its axis, keepdims=1)))`` as ``LogSoftmax(x)`` (ONNX's expansion of
      LogSoftmax shifts by the max first), when the Sub has no other reader."""
    count = _fuse_log_sum_exps(model, shapes)
    g = _Graph(model, shapes)
    for lse in [n for n in model.graph.node if n.op_type == "ReduceLogSumExp"]:
        z = lse.input[0]
        rank = len(shapes.get(z, ()))
        axes = _reduce_axes_of(g, lse)
        readers = g.readers.get(lse.output[0], [])
        if not rank or axes is None or len(axes) != 1 or not _keeps_dims(lse) or lse.output[0] in g.outputs or \
                len(readers) != 1 or readers[0].op_type != "Sub" or list(readers[0].input) != [z, lse.output[0]]:
            continue
        sub, axis = readers[0], axes[0] % rank
        after = g.readers.get(sub.output[0], [])
        exp = after[0] if len(after) == 1 and after[0].op_type == "Exp" and sub.output[0] not in g.outputs else None
        last = exp or sub
        source, peak = z, None
        shift = g.producer.get(z)
        if exp is None and shift is not None and shift.op_type == "Sub" and z not in g.outputs and \
                len(g.readers.get(z, [])) == 2:          # the Sub and this ReduceLogSumExp
            peak = g.producer.get(shift.input[1])
            peak_axes = _reduce_axes_of(g, peak) if peak is not None and peak.op_type == "ReduceMax" else None
            if peak is not None and peak_axes is not None and [a % rank for a in peak_axes] == [axis] and \
                    peak.input[0] == shift.input[0] and _keeps_dims(peak) and \
                    g.readers.get(peak.output[0]) == [shift] and peak.output[0] not in g.outputs:
                source = shift.input[0]
        fused = helper.make_node("Softmax" if exp is not None else "LogSoftmax", [source], [last.output[0]],
                                 name=last.name or last.output[0], axis=axis)
        model.graph.node.insert(list(model.graph.node).index(last), fused)
        dropped = [lse, sub] + ([exp] if exp is not None else []) + \
            ([shift, peak] if source != z and shift is not None and peak is not None else [])
        for node in dropped:
            model.graph.node.remove(node)
        count += 1
    return count


def _reduce_axes_of(g: _Graph, node: onnx.NodeProto) -> list[int] | None:
    """A reduction's axes (an attribute, or a constant input of opset 18), None when computed or absent."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if "axes" in attrs:
        return [int(a) for a in attrs["axes"]]
    if len(node.input) > 1 and node.input[1]:
        value = g.constant(node.input[1])
        return None if value is None else [int(a) for a in value.ravel()]
    return None


def _keeps_dims(node: onnx.NodeProto) -> bool:
    """A reduction that keeps its reduced axes (``keepdims``, 1 by default)."""
    return bool(next((a.i for a in node.attribute if a.name == "keepdims"), 1))


def _fuse_log_sum_exps(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> int:
    """``Log(ReduceSum(Exp(z), axes, keepdims))``, each step read only by the next, as one ReduceLogSumExp (its
    axes as an attribute below opset 18, as an input from 18)."""
    g = _Graph(model, shapes)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    count = 0
    for log in [n for n in model.graph.node if n.op_type == "Log"]:
        total = g.producer.get(log.input[0])
        if total is None or total.op_type != "ReduceSum":
            continue
        exp = g.producer.get(total.input[0])
        if exp is None or exp.op_type != "Exp" or not g.only_reader(total.output[0], log) or \
                not g.only_reader(exp.output[0], total):
            continue
        axes = _reduce_axes_of(g, total)
        attrs = {a.name: helper.get_attribute_value(a) for a in total.attribute}
        if axes is None or not axes or attrs.get("noop_with_empty_axes", 0):
            continue
        keep = int(attrs.get("keepdims", 1))
        if opset >= 18:
            axes_name = f"{log.output[0]}_axes"
            model.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), axes_name))
            fused = helper.make_node("ReduceLogSumExp", [exp.input[0], axes_name], [log.output[0]],
                                     name=log.name or log.output[0], keepdims=keep)
        else:
            fused = helper.make_node("ReduceLogSumExp", [exp.input[0]], [log.output[0]],
                                     name=log.name or log.output[0], axes=axes, keepdims=keep)
        model.graph.node.insert(list(model.graph.node).index(log), fused)
        for node in (exp, total, log):
            model.graph.node.remove(node)
        count += 1
    return count


def sink_outputs(model: onnx.ModelProto, sinks: dict[str, np.ndarray | str]) -> None:
    """Make the graph outputs :func:`absorb_sinks` added for computed sinks (the Softmax reads them now) value infos
    again, in place."""
    added = {s for s in sinks.values() if isinstance(s, str)}
    kept = [o for o in model.graph.output if o.name not in added]
    if len(kept) != len(model.graph.output):
        model.graph.value_info.extend(o for o in model.graph.output if o.name in added)     # their inferred shapes
        del model.graph.output[:]
        model.graph.output.extend(kept)
