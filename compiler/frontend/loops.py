"""ONNX ``Loop`` unrolled while the constants fold: every iteration's body nodes in the graph, one after another.

tf2onnx writes a Keras 3 recurrent layer (LSTM, GRU, SimpleRNN, and each direction of a Bidirectional) as a
``Loop``: a trip count, a condition ``counter < steps and time < steps``, the loop-carried time, states and weights,
and the step's output as a scan output. Once the constants fold, the trip count and every condition are constants,
so the loop can be written out. :func:`_fold_constants <.onnx_frontend._fold_constants>` meets the ``Loop`` in its
walk over the graph and calls :func:`start`: the nodes of the first iteration take the loop's place in the walk,
followed by an :class:`Iteration` marker. The walk folds what it can of those nodes (the counter and the condition
are constants), then reaches the marker, which reads the condition the body computed and puts the next iteration's
nodes and marker in its place, or, once the trip count is reached or the condition is false, the nodes that write
the loop's outputs: the last loop-carried values (``Identity``), and each scan output as its iterations' values
stacked on a new first axis (``Unsqueeze`` and ``Concat``).

torch's exporter writes a scripted loop's list of step outputs as ONNX sequences: a ``SequenceEmpty`` carried
through the loop, a ``SequenceInsert`` in the body, a ``ConcatFromSequence`` after it. The walk keeps such a
sequence as the list of its tensors' names (:func:`sequence_step`), so it writes no node until a
``ConcatFromSequence`` (one ``Concat``, of the tensors each given the new axis by an ``Unsqueeze`` for
``new_axis``) or a ``SequenceAt`` (an ``Identity``) reads it.

A ``Scan`` (:func:`scan_nodes`) runs its body once per slice of its scan inputs along their axes, whose length the
inputs' static shapes give: each step's copy of the body reads the slices (``Gather`` at the step's index, from the
end for a reversed input) and the states, and the scan outputs are stacked on their axes (reversed where asked).

An iteration's copy of the body renames every tensor the body writes (``<loop>/<i>/<name>``), gives the iteration
number as a constant, and reads the outer graph's tensors by their names, as the body does. Refused with the reason:
a trip count or condition that does not fold to a constant, more than :data:`MAX_STEPS` iterations or
:data:`MAX_NODES` unrolled nodes, a body with subgraphs of its own, and scan outputs of a loop that runs no
iteration.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from .onnx_common import UnsupportedOperatorError

__all__ = ["Iteration", "start", "scan_nodes", "sequence_step", "MAX_STEPS", "MAX_NODES", "LOOP_REASON"]

MAX_STEPS = 1024
"""The most iterations a Loop is unrolled to (as the recurrent operators' sequences, :mod:`.recurrent`)."""
MAX_NODES = 200_000
"""The most nodes the iterations of one Loop may add to the graph."""
LOOP_REASON = ("a Loop is unrolled when its trip count and its condition at every iteration fold to constants (a "
               "loop over a static sequence, as tf2onnx writes Keras's recurrent layers); this one's depend on the "
               "inputs' values")
"""Why a Loop left in the graph is refused."""


class Iteration:
    """The marker after one iteration's nodes in the constant-folding walk (module docstring): :meth:`next` gives
    what takes its place once those nodes are folded."""

    def __init__(self, loop: onnx.NodeProto, body: onnx.GraphProto, trips: int, tag: str) -> None:
        self.loop, self.body, self.trips, self.tag = loop, body, trips, tag
        self.carried_count = len(loop.input) - 2
        self.index = 0                               # the iteration whose nodes precede this marker
        self.cond = ""                               # its condition output (renamed)
        self.carried: list[str] = [t for t in loop.input[2:]]
        self.scans: list[list[str]] = [[] for _ in body.output[1 + self.carried_count:]]

    @property
    def name(self) -> str:
        return self.loop.name or self.loop.output[0]

    def refuse(self, why: str) -> UnsupportedOperatorError:
        return UnsupportedOperatorError("Loop", self.name, why)

    def iteration(self, consts: dict[str, Any], cond: str) -> list[Any]:
        """The nodes of iteration :attr:`index` (its number and ``cond`` as the body's first two inputs, the current
        loop-carried values as the rest), then this marker."""
        prefix = f"{self.tag}/{self.index}/"
        iter_name = f"{prefix}iteration"
        consts[iter_name] = np.array(self.index, np.int64)
        nodes, outs = _body_copy(self.body, self.tag, prefix, [iter_name, cond, *self.carried])
        self.cond = outs[0]
        self.carried = outs[1:1 + self.carried_count]
        for scan, name in zip(self.scans, outs[1 + self.carried_count:]):
            scan.append(name)
        return [*nodes, self]

    def next(self, consts: dict[str, Any]) -> list[Any]:
        """After iteration :attr:`index`'s nodes were folded: the next iteration and this marker, or the nodes that
        write the loop's outputs. Raises :class:`UnsupportedOperatorError` when the condition is not a constant."""
        if self.cond not in consts:
            raise self.refuse(f"{LOOP_REASON} (the condition after iteration {self.index} is computed at run time)")
        self.index += 1
        if self.index < self.trips and _true(consts[self.cond]):
            if self.index >= MAX_STEPS:
                raise self.refuse(f"more than {MAX_STEPS} iterations (at most {MAX_STEPS} are unrolled)")
            return self.iteration(consts, self.cond)
        return self.outputs()

    def outputs(self) -> list[onnx.NodeProto]:
        """The nodes writing the loop's outputs: the last loop-carried values, then each scan output stacked."""
        nodes: list[onnx.NodeProto] = []
        outs = list(self.loop.output)
        nodes += _final_states(outs[:self.carried_count], self.carried, self.tag)
        for k, (target, values) in enumerate(zip(outs[self.carried_count:], self.scans)):
            if not target:
                continue
            if not values:
                raise self.refuse("scan outputs of a loop that runs no iteration (a tensor of no elements)")
            nodes += _stacked(values, target, 0, f"{self.tag}/scan{k}")
        return nodes


def _body_copy(body: onnx.GraphProto, tag: str, prefix: str, inputs: list[str]
               ) -> tuple[list[onnx.NodeProto], list[str]]:
    """One iteration's copy of a loop body: its nodes with every tensor they write renamed ``prefix + name``, the
    body's inputs read as ``inputs`` and its initializers as ``tag/name`` (the caller puts those in the constants);
    and the names of the body's outputs in the copy."""
    rename = {t.name: f"{tag}/{t.name}" for t in body.initializer}
    rename.update({vi.name: t for vi, t in zip(body.input, inputs) if vi.name})
    for node in body.node:
        rename.update({out: prefix + out for out in node.output if out})
    nodes = []
    for k, node in enumerate(body.node):
        copy = onnx.NodeProto.FromString(node.SerializeToString())
        copy.input[:] = [rename.get(t, t) if t else t for t in copy.input]
        copy.output[:] = [rename.get(t, t) if t else t for t in copy.output]
        copy.name = f"{prefix}{node.name or k}"
        nodes.append(copy)
    return nodes, [rename.get(o.name, o.name) for o in body.output]


def _final_states(targets: list[str], values: list[str], tag: str) -> list[onnx.NodeProto]:
    """The Identity nodes writing a loop's state outputs ``targets`` (the unused ones empty) from the last
    iteration's ``values``."""
    return [helper.make_node("Identity", [value], [target], name=f"{tag}/out{k}")
            for k, (target, value) in enumerate(zip(targets, values)) if target]


def _stacked(values: list[str], target: str, axis: int, name: str) -> list[onnx.NodeProto]:
    """The nodes writing ``target``: the tensors ``values`` stacked on a new axis ``axis`` (Unsqueeze each, then one
    Concat)."""
    axes = f"{name}/axis"
    nodes = [helper.make_node("Constant", [], [axes], name=axes,
                              value=onnx.numpy_helper.from_array(np.array([axis], np.int64)))]
    for i, value in enumerate(values):
        nodes.append(helper.make_node("Unsqueeze", [value, axes], [f"{name}/{i}"], name=f"{name}/unsqueeze{i}"))
    nodes.append(helper.make_node("Concat", [f"{name}/{i}" for i in range(len(values))], [target], name=name,
                                  axis=axis))
    return nodes


def _true(value: Any) -> bool:
    return bool(np.asarray(value).reshape(-1)[0]) if np.size(value) else False


def start(loop: onnx.NodeProto, consts: dict[str, Any], tag: str) -> list[Any] | None:
    """The nodes that take a ``Loop``'s place in the folding walk (module docstring): its first iteration and an
    :class:`Iteration` marker, or directly its outputs when it runs no iteration; None when its trip count or first
    condition is not (yet) a constant. ``consts`` are the walk's constants
    (the iteration numbers and the body's initializers are added to it); ``tag`` prefixes the new tensors' names.
    Raises :class:`UnsupportedOperatorError` with the reason when it cannot be unrolled."""
    body = next((a.g for a in loop.attribute if a.name == "body"), None)
    name = loop.name or loop.output[0]
    if body is None or len(body.input) != len(loop.input) or \
            len(body.output) < len(loop.input) - 1 or len(loop.output) != len(body.output) - 1:
        raise UnsupportedOperatorError("Loop", name, "a body whose inputs and outputs do not match the Loop's")
    trip, cond = (loop.input[0] if loop.input else ""), (loop.input[1] if len(loop.input) > 1 else "")
    if (trip and trip not in consts) or (cond and cond not in consts):
        return None                    # left in the graph: refused with LOOP_REASON unless a later fold takes it
    trips = int(np.asarray(consts[trip]).reshape(-1)[0]) if trip else MAX_STEPS + 1
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in body.node
           for a in n.attribute):
        raise UnsupportedOperatorError("Loop", name, "a body with subgraphs of its own (a Loop or If inside it)")
    if trip and trips > MAX_STEPS:
        raise UnsupportedOperatorError("Loop", name, f"{trips} iterations (at most {MAX_STEPS} are unrolled)")
    if min(trips, MAX_STEPS) * max(len(body.node), 1) > MAX_NODES:
        raise UnsupportedOperatorError("Loop", name, f"{len(body.node)} body nodes times {min(trips, MAX_STEPS)} "
                                                     f"iterations (at most {MAX_NODES:,} unrolled nodes)")
    marker = Iteration(loop, body, trips, tag)
    for init in body.initializer:
        consts[f"{tag}/{init.name}"] = onnx.numpy_helper.to_array(init)
    first = consts[cond] if cond else np.array(True)
    if trips <= 0 or not _true(first):
        return marker.outputs()
    if not cond:
        consts[f"{tag}/cond"] = np.array(True)
        cond = f"{tag}/cond"
    return marker.iteration(consts, cond)


SEQUENCE_BUILDERS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "Identity"})
"""The operators that make a sequence :func:`sequence_step` follows; the walk keeps them in the graph (a later walk
follows them again) until nothing reads their output (:func:`drop_unread_sequences`)."""


def drop_unread_sequences(nodes: list[onnx.NodeProto], seqs: dict[str, list[str]], outputs: set[str]
                          ) -> list[onnx.NodeProto]:
    """``nodes`` (in graph order) without the sequence builders (:data:`SEQUENCE_BUILDERS` writing a sequence of
    ``seqs``) whose output no other node and no graph output (``outputs``) reads, once those readers are gone too:
    one pass from the end, as a builder's readers come after it."""
    if not seqs:
        return nodes
    reads: dict[str, int] = {}
    for node in nodes:
        for t in node.input:
            reads[t] = reads.get(t, 0) + 1
    dropped: set[int] = set()
    for k in range(len(nodes) - 1, -1, -1):
        node = nodes[k]
        out = node.output[0] if node.output else ""
        if node.op_type in SEQUENCE_BUILDERS and out in seqs and not reads.get(out) and out not in outputs:
            dropped.add(k)
            for t in node.input:
                reads[t] -= 1
    return [node for k, node in enumerate(nodes) if k not in dropped]


def sequence_step(node: onnx.NodeProto, seqs: dict[str, list[str]], consts: dict[str, Any]
                  ) -> list[onnx.NodeProto] | None:
    """The nodes that replace a sequence operator in the folding walk when its sequence is known as a list of tensor
    names (``seqs``, updated; a ``SequenceEmpty`` or ``SequenceConstruct`` starts one), or None when ``node`` is no
    such operator or its sequence or position is not known. A sequence's length is a constant (``consts``). The
    builders (:data:`SEQUENCE_BUILDERS`) give no node: the caller keeps them as they are."""
    op, ins = node.op_type, list(node.input)
    out = node.output[0] if node.output else ""
    if op == "SequenceEmpty":
        seqs[out] = []
        return []
    if op == "SequenceConstruct":
        seqs[out] = ins
        return []
    if not ins or ins[0] not in seqs:
        return None
    items = seqs[ins[0]]
    position = None
    if op in ("SequenceAt", "SequenceErase") and len(ins) > 1 and ins[1]:
        if ins[1] not in consts:
            return None
        position = int(np.asarray(consts[ins[1]]).reshape(-1)[0])
    if op == "Identity":
        seqs[out] = items
        return []
    if op == "SequenceLength":
        consts[out] = np.array(len(items), np.int64)
        return []
    if op == "SequenceInsert" and len(ins) > 1:
        at = len(items) if len(ins) < 3 or not ins[2] else (
            int(np.asarray(consts[ins[2]]).reshape(-1)[0]) if ins[2] in consts else None)
        if at is None or not -len(items) <= at <= len(items):
            return None
        at = at + len(items) if at < 0 else at
        seqs[out] = items[:at] + [ins[1]] + items[at:]
        return []
    if op == "SequenceErase":
        at = len(items) - 1 if position is None else position
        if not -len(items) <= at < len(items):
            return None
        seqs[out] = [t for k, t in enumerate(items) if k != at % len(items)]
        return []
    if op == "SequenceAt" and position is not None and -len(items) <= position < len(items):
        return [helper.make_node("Identity", [items[position]], [out], name=node.name or f"{out}_at")]
    if op == "ConcatFromSequence" and items:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axis, new_axis, name = int(attrs["axis"]), int(attrs.get("new_axis", 0)), node.name or f"{out}_concat"
        if not new_axis:
            return [helper.make_node("Concat", items, [out], name=name, axis=axis)]
        return _stacked(items, out, axis, name)
    return None


def scan_nodes(node: onnx.NodeProto, consts: dict[str, Any], shapes: dict[str, tuple[int, ...]], tag: str
               ) -> list[onnx.NodeProto] | None:
    """The nodes that replace a ``Scan`` (module docstring): every step's copy of the body, then the final states
    (``Identity``) and the stacked scan outputs. None when a scan input's shape is not known; raises
    :class:`UnsupportedOperatorError` with the reason for what cannot be unrolled."""
    attrs = {a.name: a for a in node.attribute}
    name = node.name or node.output[0]
    body = attrs["body"].g if "body" in attrs else None
    count = int(helper.get_attribute_value(attrs["num_scan_inputs"])) if "num_scan_inputs" in attrs else -1
    if body is None or not 0 < count <= len(node.input) or len(body.input) != len(node.input) or \
            len(body.output) != len(node.output):
        raise UnsupportedOperatorError("Scan", name, "a body whose inputs and outputs do not match the Scan's")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in body.node for a in n.attribute):
        raise UnsupportedOperatorError("Scan", name, "a body with subgraphs of its own (a Loop or If inside it)")
    states = len(node.input) - count
    scan_inputs = list(node.input[states:])
    if any(t not in shapes for t in scan_inputs):
        return None
    ranks = [len(shapes[t]) for t in scan_inputs]

    def listed(key: str, n: int) -> list[int]:
        return [int(v) for v in helper.get_attribute_value(attrs[key])] if key in attrs else [0] * n

    in_axes = [a % r for a, r in zip(listed("scan_input_axes", count), ranks)]
    in_dirs = listed("scan_input_directions", count)
    outputs = len(node.output) - states
    out_axes, out_dirs = listed("scan_output_axes", outputs), listed("scan_output_directions", outputs)
    lengths = {shapes[t][a] for t, a in zip(scan_inputs, in_axes)}
    if len(lengths) != 1:
        raise UnsupportedOperatorError("Scan", name, f"scan inputs of lengths {sorted(lengths)} along their axes")
    steps = lengths.pop()
    if steps > MAX_STEPS or steps * max(len(body.node), 1) > MAX_NODES:
        raise UnsupportedOperatorError("Scan", name, f"{steps} steps of {len(body.node)} body nodes (at most "
                                                     f"{MAX_STEPS} steps and {MAX_NODES:,} unrolled nodes)")
    if steps == 0 and outputs:
        raise UnsupportedOperatorError("Scan", name, "scan outputs of a scan of no steps (a tensor of no elements)")
    for init in body.initializer:
        consts[f"{tag}/{init.name}"] = onnx.numpy_helper.to_array(init)
    nodes: list[onnx.NodeProto] = []
    carried = list(node.input[:states])
    collected: list[list[str]] = [[] for _ in range(outputs)]
    for t in range(steps):
        prefix = f"{tag}/{t}/"
        slices = []
        for j, (source, axis, direction) in enumerate(zip(scan_inputs, in_axes, in_dirs)):
            index = f"{prefix}index{j}"
            consts[index] = np.array(steps - 1 - t if direction else t, np.int64)
            slices.append(f"{prefix}slice{j}")
            nodes.append(helper.make_node("Gather", [source, index], [slices[-1]], name=f"{prefix}slice{j}",
                                          axis=axis))
        copied, outs = _body_copy(body, tag, prefix, [*carried, *slices])
        nodes += copied
        carried = outs[:states]
        for values, value in zip(collected, outs[states:]):
            values.append(value)
    nodes += _final_states(list(node.output[:states]), carried, tag)
    for k, (target, values, axis, direction) in enumerate(zip(node.output[states:], collected, out_axes, out_dirs)):
        if target:
            nodes += _stacked(values[::-1] if direction else values, target, axis, f"{tag}/scan{k}")
    return nodes
