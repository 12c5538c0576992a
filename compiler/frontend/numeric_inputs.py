"""Graph inputs that are numbers the model computes with: a diffusion model's timestep, a Fourier-feature input.

A diffusion UNet (diffusers, exported by torch) takes its timestep ``t`` as an int64 (or float32) input ``[batch]``
and embeds it as ``[sin(t * f), cos(t * f)]`` over constant frequencies ``f`` before a small MLP. The lab reads an
int64 input as token ids or as an attention mask of 0 and 1, so the timestep was refused as a mask that reaches a
``Sin``; and a float32 timestep was quantized to int8 before the ``Sin``, where an int8 step of ``1000 / 127``
turns the phases into noise.

:func:`replace_numeric_inputs` finds such an input ``X`` and its *region*: the nodes computed from ``X`` and
constants alone (default domain, no subgraphs), up to the first linear layer (``MatMul``, ``Gemm``, ``Conv``, ...)
that reads a value computed after a :data:`SENSITIVE_OPS` node (a ``Sin`` of ``t * f``), so that the layers after the
embedding stay on the accelerator. (A linear layer before it, as in the rotary embedding's ``positions @ inv_freq``,
is part of the region for an integer input; a float input's region ends before every linear layer, which reads it
quantized as before, but one whose output reaches a Sin or Cos through affine and shape ops alone: Fourier features'
``sin(x @ B)``, SIREN's first layer.) Each tensor of the region that a node outside it reads (an *exit*, float32) is
then computed by one ``InputFn`` node from ``X``: the region, run by ONNX's reference evaluator in float at run time
(:func:`..qops_index.run_region`), exactly as the file computes it for any value of ``X``. The quantizer quantizes
each exit at its calibrated scale, as it does a float input.

Which inputs are taken:

- an integer input (int64, int32, ...) that is no token ids or mask of a pooling (:mod:`.indices`, :mod:`.pooling`
  come first) and whose region holds an op no attention mask passes through (an op outside
  :data:`.masks.REGION_OPS`). Before the masks are looked for, only the inputs the mask rules would refuse: those
  whose values, through any op, meet activations in an Add, Sub or Where (the timestep's embedding is added to the
  activations). The others go to :mod:`.position_tables` first (Llama's ``position_ids``, whose rotary rows meet the
  queries in Muls, stay table lookups), and what it leaves is taken after it (``late``);
- a float32 input whose region holds a ``Sin``, ``Cos`` or ``Tan`` (:data:`TRIG_OPS`): a phase quantized to int8
  is lost, whatever the step.

An exit that is not float32, a region that reaches a graph output, a region whose values at the inputs 0 and 1 are
``-inf`` or below ``-1e3`` (an additive attention mask's fill: the mask checks then name the problem), or an integer
input that a node outside the region also reads, leaves the input to the other checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..qops import reference_evaluator
from .masks import REGION_OPS, encode, forward_region, region_model

__all__ = ["NumericRegion", "replace_numeric_inputs", "SENSITIVE_OPS", "TRIG_OPS", "STOP_OPS", "FUSED_OP"]

FUSED_OP = "InputFn"
"""The op type of an exit's node in the rewritten ONNX graph, and of its float node (attribute ``onnx``)."""

TRIG_OPS = frozenset({"Sin", "Cos", "Tan"})
"""Ops that make a float input a number the model computes with: a phase quantized to int8 is lost."""

STOP_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "LSTM", "GRU", "RNN"})
"""Linear layers: the region ends before one that reads a value computed after a :data:`SENSITIVE_OPS` node."""

SENSITIVE_OPS = frozenset({"Sin", "Cos", "Tan", "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Erf",
                           "Softplus", "Atan", "Asin", "Acos", "Sinh", "Cosh"})
"""Non-linear functions: the values after one are an embedding of the input, which a linear layer may read quantized
(while a value before one, such as ``t`` itself or ``t * f``, must reach it exactly)."""

_INTEGER = frozenset({TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8, TensorProto.UINT8,
                      TensorProto.UINT16, TensorProto.UINT32})
"""The integer input types a numeric input may have (its values are given to the model as int64)."""

_EXIT_OPS = frozenset({"Add", "Sub", "Where"})
"""Where an attention mask meets the scores (:data:`.masks._EXIT_OPS`)."""

_FILL = -1e3
"""Values at or below this (or ``-inf``) at the inputs 0 and 1 mark an additive attention mask, not a number."""


@dataclass(frozen=True)
class NumericRegion:
    """One exit ``out`` (float32, ``shape``) computed from the graph input ``source`` by the base64 ONNX model
    ``model`` (the region's nodes and constants: one input, one output)."""

    source: str
    out: str
    shape: tuple[int, ...]
    model: str


_PHASE_OPS = frozenset({"Mul", "Add", "Sub", "Div", "Neg", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "Flatten",
                        "Expand", "Cast", "Identity", "Concat", "Slice", "Split"})
"""Ops that carry a phase to a Sin or Cos unchanged in kind (affine and shape ops): a linear layer whose output
reaches a trigonometric op through these alone computes a phase (Fourier features' ``x @ B``)."""


def _phase_tensors(model: onnx.ModelProto) -> set[str]:
    """The tensors from which a :data:`TRIG_OPS` node is reached through :data:`_PHASE_OPS` alone."""
    phases: set[str] = set()
    for node in reversed(model.graph.node):
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in TRIG_OPS or (node.op_type in _PHASE_OPS and any(o in phases for o in node.output)):
            phases.update(t for t in node.input if t)
    return phases


def _walk(model: onnx.ModelProto, source: str, consts: set[str], phases: set[str] | None = None
          ) -> tuple[list[onnx.NodeProto], set[str]]:
    """The region of ``source`` (module docstring): its nodes in graph order and the tensors they compute. With
    ``phases`` (a float input, which the accelerator's layers read quantized; :func:`_phase_tensors`), it ends before
    every linear layer but one whose output is a phase (it reaches a Sin or Cos through affine and shape ops alone:
    Fourier features' ``x @ B``, SIREN's first layer)."""
    region = {source}
    after: set[str] = set()                                   # tensors computed after a SENSITIVE_OPS node
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        touched = [t for t in node.input if t in region]
        if not touched or node.domain not in ("", "ai.onnx") or \
                any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute) or \
                not all(not t or t in region or t in consts for t in node.input):
            continue
        late = any(t in after for t in touched)
        if node.op_type in STOP_OPS and (late or (phases is not None and not any(o in phases for o in node.output))):
            continue
        nodes.append(node)
        region.update(o for o in node.output if o)
        if late or node.op_type in SENSITIVE_OPS:
            after.update(o for o in node.output if o)
    return nodes, region


def _types(model: onnx.ModelProto) -> dict[str, int]:
    return {vi.name: vi.type.tensor_type.elem_type
            for vi in (*model.graph.value_info, *model.graph.input, *model.graph.output)}


def _fill_like(model: onnx.ModelProto, nodes: list[onnx.NodeProto], vi: onnx.ValueInfoProto, exits: list[str],
               consts: dict[str, onnx.TensorProto]) -> bool:
    """Whether an exit holds ``-inf`` or values at or below :data:`_FILL` at the all-0 or the all-1 input (or the
    region cannot be evaluated there): an attention mask's additive fill."""
    shape = [max(1, d.dim_value) for d in vi.type.tensor_type.shape.dim]
    dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
    sub = region_model(model, nodes, vi, exits,
                       [helper.make_tensor_value_info(t, TensorProto.UNDEFINED, None) for t in exits], consts)
    try:
        run = reference_evaluator(sub)
        for value in (0, 1):
            with np.errstate(all="ignore"):
                outs = run.run(None, {vi.name: np.full(shape, value, dtype)})
            if any(np.any(np.asarray(o, np.float64) <= _FILL) for o in outs):
                return True
    except Exception:  # noqa: BLE001 - the evaluator's own errors on a user's file: not ours to take
        return True
    return False


def _region(model: onnx.ModelProto, vi: onnx.ValueInfoProto, consts: dict[str, onnx.TensorProto],
            types: dict[str, int], shapes: dict[str, tuple[int, ...]], outputs: set[str], phases: set[str]
            ) -> tuple[list[NumericRegion], list[onnx.NodeProto]] | None:
    """The exits of input ``vi`` when it is a number the model computes with (module docstring), and its region's
    nodes; else None. ``phases``: :func:`_phase_tensors` of ``model``, read for a float input."""
    kind = vi.type.tensor_type.elem_type
    nodes, region = _walk(model, vi.name, set(consts), phases if kind == TensorProto.FLOAT else None)
    ops = {n.op_type for n in nodes}
    if not nodes or (ops.isdisjoint(TRIG_OPS) if kind == TensorProto.FLOAT else ops <= REGION_OPS):
        return None
    inside = {id(n) for n in nodes}
    read = {t for n in model.graph.node if id(n) not in inside for t in n.input}
    if region & outputs or (kind != TensorProto.FLOAT and vi.name in read):
        return None
    exits = [o for n in nodes for o in n.output if o in read]
    if not exits or any(types.get(t) != TensorProto.FLOAT or t not in shapes for t in exits):
        return None
    if kind != TensorProto.FLOAT and _fill_like(model, nodes, vi, exits, consts):
        return None
    return [NumericRegion(vi.name, t, shapes[t], encode(_one_element_input(region_model(
        model, nodes, vi, [t], [helper.make_tensor_value_info(t, TensorProto.FLOAT, None)], consts))))
        for t in exits], nodes


def _one_element_input(region: onnx.ModelProto) -> onnx.ModelProto:
    """``region`` taking its scalar input as ``[1]`` (the lab computes tensors of rank 1 or more; optimum writes a
    diffusion UNet's ``timestep`` as a scalar): a Reshape to ``[]`` first. Other inputs as they are."""
    source = region.graph.input[0]
    if source.type.tensor_type.HasField("shape") and len(source.type.tensor_type.shape.dim) == 0:
        name = source.name
        wide = f"{name}_one"
        source.name = wide
        source.type.tensor_type.shape.dim.add().dim_value = 1
        region.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(0, np.int64), f"{name}_scalar"))
        region.graph.node.insert(0, helper.make_node("Reshape", [wide, f"{name}_scalar"], [name]))
    return region


def _masks_refuse(model: onnx.ModelProto, source: str, consts: set[str]) -> bool:
    """Whether :func:`.masks.find_key_masks` would refuse integer input ``source``: its values (through any op on
    them and constants) meet an activation in an Add, Sub or Where, and pass an op outside
    :data:`.masks.REGION_OPS` on the way."""
    region, nodes = forward_region(model, source, dict.fromkeys(consts))
    if {n.op_type for n in nodes} <= REGION_OPS:
        return False
    inside = {id(n) for n in nodes}
    return any(id(n) not in inside and n.op_type in _EXIT_OPS and any(t in region for t in n.input)
               for n in model.graph.node)


def replace_numeric_inputs(model: onnx.ModelProto, skip: set[str], shapes: dict[str, tuple[int, ...]], *,
                           late: bool) -> dict[str, NumericRegion]:
    """In place: every graph input not in ``skip`` that is a number the model computes with (module docstring;
    ``late``: after the masks and positions were taken, so float inputs too, and not only those the mask rules
    would refuse) has its region's
    nodes replaced by one ``InputFn`` node per exit, at the graph's start. ``shapes``: the static shapes. Returns the
    regions by exit."""
    consts: dict[str, Any] = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    types = _types(model)
    names = set(consts)
    phases = _phase_tensors(model) if late else set()   # an input's region leaves the others' phases as they were
    found: dict[str, NumericRegion] = {}
    for vi in list(model.graph.input):
        kind = vi.type.tensor_type.elem_type
        if vi.name in names or vi.name in skip or not (kind in _INTEGER or (late and kind == TensorProto.FLOAT)) or \
                not (late or _masks_refuse(model, vi.name, names)):
            continue
        taken = _region(model, vi, consts, types, shapes, outputs, phases)
        if taken is None:
            continue
        regions, nodes = taken
        drop = {id(n) for n in nodes}
        new = [helper.make_node(FUSED_OP, [vi.name], [r.out], name=f"{r.out}_from_{vi.name}") for r in regions]
        kept = [n for n in model.graph.node if id(n) not in drop]
        del model.graph.node[:]
        model.graph.node.extend(new + kept)
        found.update({r.out: r for r in regions})
        if vi.type.tensor_type.HasField("shape") and len(vi.type.tensor_type.shape.dim) == 0:
            vi.type.tensor_type.shape.dim.add().dim_value = 1      # a scalar: one element, as the region takes it
    return found
