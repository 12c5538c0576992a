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

__all__ = ["Iteration", "start", "sequence_step", "MAX_STEPS", "MAX_NODES", "LOOP_REASON"]

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
        i = self.index
        prefix = f"{self.tag}/{i}/"
        rename = {t.name: f"{self.tag}/{t.name}" for t in self.body.initializer}
        iter_name = f"{prefix}iteration"
        consts[iter_name] = np.array(i, np.int64)
        inputs = [iter_name, cond, *self.carried]
        rename.update({vi.name: t for vi, t in zip(self.body.input, inputs) if vi.name})
        for node in self.body.node:
            rename.update({out: prefix + out for out in node.output if out})
        nodes: list[Any] = []
        for k, node in enumerate(self.body.node):
            copy = onnx.NodeProto.FromString(node.SerializeToString())
            copy.input[:] = [rename.get(t, t) if t else t for t in copy.input]
            copy.output[:] = [rename.get(t, t) if t else t for t in copy.output]
            copy.name = f"{prefix}{node.name or k}"
            nodes.append(copy)
        outs = [rename.get(o.name, o.name) for o in self.body.output]
        self.cond = outs[0]
        self.carried = outs[1:1 + self.carried_count]
        for scan, name in zip(self.scans, outs[1 + self.carried_count:]):
            scan.append(name)
        return nodes + [self]

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
        for k, (target, value) in enumerate(zip(outs[:self.carried_count], self.carried)):
            if target:
                nodes.append(helper.make_node("Identity", [value], [target], name=f"{self.tag}/out{k}"))
        axes = f"{self.tag}/axis0"
        for k, (target, values) in enumerate(zip(outs[self.carried_count:], self.scans)):
            if not target:
                continue
            if not values:
                raise self.refuse("scan outputs of a loop that runs no iteration (a tensor of no elements)")
            stacked = []
            for i, value in enumerate(values):
                stacked.append(f"{self.tag}/scan{k}/{i}")
                nodes.append(helper.make_node("Unsqueeze", [value, axes], [stacked[-1]],
                                              name=f"{self.tag}/scan{k}/unsqueeze{i}"))
            nodes.append(helper.make_node("Concat", stacked, [target], name=f"{self.tag}/scan{k}", axis=0))
        if any(n.op_type == "Unsqueeze" for n in nodes):
            nodes.insert(0, helper.make_node("Constant", [], [axes], name=axes,
                                             value=onnx.numpy_helper.from_array(np.array([0], np.int64))))
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
        raise UnsupportedOperatorError("Loop", name, f"{len(body.node)} body nodes times {trips} iterations (at most "
                                                     f"{MAX_NODES:,} unrolled nodes)")
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
    """``nodes`` without the sequence builders (:data:`SEQUENCE_BUILDERS` writing a sequence of ``seqs``) whose
    output no other node and no graph output (``outputs``) reads, repeatedly."""
    while True:
        read = {t for n in nodes for t in n.input} | outputs
        kept = [n for n in nodes if not (n.op_type in SEQUENCE_BUILDERS and n.output and n.output[0] in seqs and
                                         n.output[0] not in read)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


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
        axes = f"{name}/axis"
        nodes = [helper.make_node("Constant", [], [axes], name=axes,
                                  value=onnx.numpy_helper.from_array(np.array([axis], np.int64)))]
        for k, item in enumerate(items):
            nodes.append(helper.make_node("Unsqueeze", [item, axes], [f"{name}/{k}"], name=f"{name}/unsqueeze{k}"))
        nodes.append(helper.make_node("Concat", [f"{name}/{k}" for k in range(len(items))], [out], name=name,
                                      axis=axis))
        return nodes
    return None
