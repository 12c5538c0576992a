"""Integer inputs whose every use is a function of each entry alone, as table lookups: Llama's ``position_ids``.

optimum exports a Llama-style model with ``position_ids [B, S]`` (int64) as a graph input. The rotary embedding
computes, from each position alone, the row ``cos(p * inv_freq)`` (and ``sin``), through Unsqueeze, Cast, a MatMul
by the constant frequencies, Transpose, Concat, Cos, Sin, and meets the queries and keys in Muls. The lab computes
activations from float inputs and looks token ids up in tables, so the input was refused for its type.

:func:`tabulate_inputs` finds such an input ``X`` and the tensors of its *region* (computed from ``X`` and constants
alone) that activations read (the exits). Where each exit holds, for every entry of ``X``, a row that depends on
that entry's value alone, laid out in ``X``'s order (``exit == T[X].reshape(exit.shape)`` for a table ``T [P,
row]``), the exit becomes ``Reshape(Gather(T, X))``: ``X`` is then token ids into constant tables, which the lab
imports (an Embedding on the CPU), and the product with the queries is the usual product of two activations.

The table has one row per value in ``[0, P)``, ``P`` the largest static dimension among the graph's inputs (the
attention mask's length, past and new tokens, bounds the positions a generation step gives). It is computed with
ONNX's reference evaluator on the region itself, ``S`` rows per run (the positions laid along one row of ``X``), and
checked on three seeded random inputs, all zeros, all ``P - 1`` and the positions reversed (a row's maximum, minimum
or sum of random values in ``[0, P)`` is often the same on every sample): an exit that is not such a function (one
reading two entries, or the whole input) leaves the input as it was, refused as before. A value outside ``[0, P)`` at
run time is refused by the token-id range check with the table's size.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..qops import reference_evaluator
from .masks import backward_slice, forward_region, region_model

__all__ = ["tabulate_inputs"]

_INTEGER: dict[int, type] = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32}

_SAMPLES = 3
"""Seeded random inputs the tables are checked on."""

_MAX_TABLE = 1 << 22
"""The most values (rows times row width) a table may hold, 16 MiB of float32: a region whose rows are wider (a whole
mask per batch entry) is left, and refused as before."""


def _exits(model: onnx.ModelProto, region: set[str], nodes: list[onnx.NodeProto]) -> list[str]:
    """The region's tensors that a node outside it (or the graph's outputs) reads, in graph order."""
    inside = {id(n) for n in nodes}
    read = {t for n in model.graph.node if id(n) not in inside for t in n.input}
    read |= {o.name for o in model.graph.output}
    return [t for n in nodes for t in n.output if t in region and t in read]


def _table(model: onnx.ModelProto, nodes: list[onnx.NodeProto], vi: onnx.ValueInfoProto, exits: list[str],
           consts: dict[str, Any], rows: int) -> dict[str, np.ndarray] | None:
    """Each exit's table ``[rows, row]`` when it is a row-wise function of the input's entries (module docstring),
    else None."""
    shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    dtype = _INTEGER[vi.type.tensor_type.elem_type]
    keep, needed = backward_slice(nodes, exits)
    if any(t not in consts and t != vi.name and not any(t in n.output for n in keep) for t in needed):
        return None                                           # the region reads another input
    sub = region_model(model, keep, vi, exits,
                       [helper.make_tensor_value_info(t, TensorProto.UNDEFINED, None) for t in exits], consts)
    try:
        run = reference_evaluator(sub)
        size = int(np.prod(shape))
        tables: dict[str, list[np.ndarray]] = {t: [] for t in exits}
        for start in range(0, rows, size):
            values = (np.arange(size) + start) % rows
            got = run.run(None, {vi.name: values.reshape(shape).astype(dtype)})
            for t, value in zip(exits, got):
                if np.asarray(value).dtype.kind != "f" or np.asarray(value).size % size or \
                        np.asarray(value).size // size * rows > _MAX_TABLE:
                    return None                               # an index, not one row per entry, or too wide
                tables[t].append(np.asarray(value, np.float64).reshape(size, -1)[: min(size, rows - start)])
        table = {t: np.concatenate(parts) for t, parts in tables.items()}
        rng = np.random.default_rng(27)
        samples: list[np.ndarray] = [rng.integers(0, rows, shape) for _ in range(_SAMPLES)]
        samples += [np.zeros(shape), np.full(shape, rows - 1),     # an exit reading a row's max, min or sum
                    ((rows - 1 - np.arange(size)) % rows).reshape(shape)]   # gives itself away on these
        for raw in samples:
            sample: np.ndarray = raw.astype(dtype)
            for t, value in zip(exits, run.run(None, {vi.name: sample})):
                value = np.asarray(value, np.float64)
                want = table[t][sample.reshape(-1)].reshape(value.shape)
                if not np.allclose(value, want, rtol=1e-6, atol=1e-6):
                    return None
    except Exception:  # noqa: BLE001 - the evaluator's own errors on a user's file: no table, the input stays
        return None
    return table


def tabulate_inputs(model: onnx.ModelProto, skip: set[str]) -> set[str]:
    """In place: every integer graph input not in ``skip`` (token ids, masks) whose region's exits are row-wise
    functions of its entries reads constant tables instead (module docstring). Returns the inputs rewritten."""
    inits = {i.name for i in model.graph.initializer}
    dims = [d.dim_value for vi in model.graph.input if vi.name not in inits
            for d in vi.type.tensor_type.shape.dim if d.dim_value > 0]
    if not dims:
        return set()
    rows = max(dims)
    consts = {i.name: i for i in model.graph.initializer}
    done: set[str] = set()
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name in inits or vi.name in skip or vi.type.tensor_type.elem_type not in _INTEGER or \
                not shape or min(shape) < 1:
            continue
        region, nodes = forward_region(model, vi.name, consts)
        exits = _exits(model, region, nodes)
        shapes = [_shape_of(model, t) for t in exits]
        if not nodes or not exits or vi.name in exits or any(s is None for s in shapes):
            continue
        table = _table(model, nodes, vi, exits, consts, rows)
        if table is None:
            continue
        lookups: list[onnx.NodeProto] = []
        for k, (t, out_shape) in enumerate(zip(exits, shapes)):
            name = f"{vi.name}_table{k}"
            width = table[t].shape[1]
            model.graph.initializer.extend([
                numpy_helper.from_array(table[t].astype(np.float32), name),
                numpy_helper.from_array(np.array(out_shape, np.int64), f"{name}_shape")])
            model.graph.value_info.append(helper.make_tensor_value_info(f"{name}_rows", TensorProto.FLOAT,
                                                                        shape + [width]))
            lookups += [helper.make_node("Gather", [name, vi.name], [f"{name}_rows"], name=f"{name}_lookup", axis=0),
                        helper.make_node("Reshape", [f"{name}_rows", f"{name}_shape"], [t], name=f"{name}_view")]
        region_nodes = {id(n) for n in nodes}
        kept = [n for n in model.graph.node if id(n) not in region_nodes]
        del model.graph.node[:]
        model.graph.node.extend(lookups + kept)
        done.add(vi.name)
    return done


def _shape_of(model: onnx.ModelProto, tensor: str) -> list[int] | None:
    """The static shape the model's value infos give ``tensor`` (None when unknown)."""
    for vi in list(model.graph.value_info) + list(model.graph.output):
        if vi.name == tensor:
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            return dims if dims and min(dims) > 0 else None
    return None
