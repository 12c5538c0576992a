"""A compiled model part by part, as digests: what pins a compile in a test and compares two compiles.

Two compiles of the same model, config and options (on two machines, or before and after a change) should give the
same ``.vtac`` bytes. When they do not, one digest of the file says only *that* something moved; :func:`fingerprint`
says *what*: each part of a :class:`~.runtime.Compiled` gets its own digest, named so that a reader knows which
layer and which allocation it is and what may legitimately move it (:data:`PART_MEANINGS`):

* ``graph`` -- the quantized graph's structure (nodes, their order, inputs and outputs, non-array attributes);
* ``scales`` -- every tensor's quantization scale and every node's requantization (multipliers, shifts, weight
  scales): these move when calibration or quantization changes;
* ``constant <tensor>`` -- one quantized weight or bias tensor of the graph (for CPU layers and the reference);
* ``decisions`` -- the partition: where each node runs and why;
* ``<layer> instructions`` -- an accelerator layer's instruction stream (the schedule and the code generator);
* ``<layer> <allocation>`` -- one named region of that layer's DRAM image: ``w`` its packed weights, ``consts`` its
  per-channel constants (bias, requantization), ``uops<k>`` its micro-op kernels, ``bias_init`` and ``req``
  constant images, ``x``/``y`` the input and output buffers;
* ``<layer> layout`` -- where those regions and the instruction stream sit in the image;
* ``<layer> schedule`` -- its tiling, bound and predicted cycles, as the artefact records them.

Digests are SHA-256, shortened to 16 hex digits (a reader compares them, nothing relies on their strength).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import numpy as np

from vta.program import Program

from .compiled import AccelStep, Compiled

__all__ = ["PART_MEANINGS", "fingerprint", "program_parts", "differences"]

PART_MEANINGS: dict[str, str] = {
    "graph": "the quantized graph's structure (the frontend or the quantizer's rewrites changed)",
    "scales": "the quantization scales or requantization constants (calibration or quantization changed)",
    "constant": "a quantized weight or bias tensor (the model's weights, calibration or quantization changed)",
    "decisions": "the partition: where a node runs and why (the partitioner or its estimates changed)",
    "instructions": "an accelerator layer's instruction stream (the schedule search or the code generator changed)",
    "w": "a layer's packed weights (quantization or the weight layout changed)",
    "consts": "a layer's per-channel constants: bias and requantization (calibration or quantization changed)",
    "uops": "a layer's micro-op kernels (the code generator changed)",
    "layout": "where a layer's regions sit in its DRAM image (the allocator or a region's size changed)",
    "schedule": "a layer's tiling, bound or predicted cycles (the schedule search or the cycle model changed)",
}
"""What moves each kind of part; :func:`differences` quotes it next to a part that differs."""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _json_digest(value: Any) -> str:
    return _digest(json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def program_parts(program: Program) -> dict[str, str]:
    """``instructions``, one entry per allocation (its bytes in the initial DRAM image) and ``layout`` (the
    instruction stream's offset, each allocation's offset and size), each a digest."""
    parts = {"instructions": _digest(program.encoded_insns().tobytes())}
    for name, alloc in program.allocations.items():
        parts[name] = _digest(program.dram[alloc.offset:alloc.offset + alloc.nbytes].tobytes())
    parts["layout"] = _json_digest({"insn_offset": program.insn_offset, "dram_bytes": int(program.dram.size),
                                    "allocations": [a.to_json() for a in program.allocations.values()]})
    return parts


def _split_scales(graph: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> tuple[Any, Any]:
    """The graph's data without its scales and array attributes, and those scales and attributes on their own."""
    scales: dict[str, Any] = {t["name"]: t["scale"] for t in graph["tensors"]}
    structure = dict(graph, tensors=[dict(t, scale=None) for t in graph["tensors"]])
    for k, node in enumerate(graph["nodes"]):
        prefix = f"nodes/{k}/"
        scales[node["name"]] = {key: _digest(np.ascontiguousarray(value).tobytes())
                                for key, value in sorted(arrays.items()) if key.startswith(prefix)}
    return structure, scales


def fingerprint(compiled: Compiled) -> dict[str, str]:
    """Part name -> digest for every part of ``compiled`` (see the module docstring), in the graph's order."""
    graph_data, graph_arrays = compiled.graph.to_data()
    structure, scales = _split_scales(graph_data, graph_arrays)
    parts = {"graph": _json_digest(structure), "scales": _json_digest(scales)}
    for name, key in graph_data["constants"]:
        parts[f"constant {name}"] = _digest(np.ascontiguousarray(graph_arrays[key]).tobytes())
    parts["decisions"] = _json_digest([vars(d) for d in compiled.decisions.values()])
    for step in compiled.steps:
        if isinstance(step, AccelStep):
            for part, value in program_parts(step.program).items():
                parts[f"{step.node.name} {part}"] = value
            parts[f"{step.node.name} schedule"] = _json_digest(
                {"tiling": step.tiling, "schedule": step.schedule, "predicted_cycles": step.predicted_cycles})
    return parts


def _meaning(part: str) -> str:
    kind = part.rsplit(" ", 1)[-1] if " " in part and not part.startswith("constant ") else part.split(" ")[0]
    kind = "uops" if kind.startswith("uops") else kind
    return PART_MEANINGS.get(kind, "a buffer of the layer's DRAM image")


def differences(a: Mapping[str, str], b: Mapping[str, str], *, names: tuple[str, str] = ("a", "b")) -> list[str]:
    """One sentence per part that differs between fingerprints ``a`` and ``b`` (or exists in one only), naming the
    part and what moves it; empty when they are the same."""
    out = []
    for part in list(a) + [p for p in b if p not in a]:
        if part not in b or part not in a:
            have = names[0] if part in a else names[1]
            out.append(f"{part}: only in {have} ({_meaning(part)})")
        elif a[part] != b[part]:
            out.append(f"{part}: {a[part]} in {names[0]}, {b[part]} in {names[1]} -- {_meaning(part)}")
    return out
