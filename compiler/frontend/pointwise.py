"""Element-wise regions of one or two activations, fused into one function of each element (one lookup table of
256 or 256 x 256 entries, quantized).

Activations written out of ONNX's element-wise operators (Apertus's xIELU ``where(x > 0, a x^2 + b x, c (exp(min(x,
eps)) - 1) - c x + b x)``, a hand-written Elu or HardSigmoid, ``x * (x > 0)``) use comparisons, ``Where`` and
quotients that no rule imports node by node. Yet every element of such a region's result depends on the same
element of its one input alone, so it is a function ``y = f(x)``, and once quantized a 256-entry table like any
activation.

A *region* here is a set of nodes of :data:`POINTWISE_OPS` (default domain) whose inputs are one activation ``x``
(float32, the *source*), tensors the region computes from it, and constants of one element; every tensor the region
computes has ``x``'s shape, and one of them, float32, is read outside it (the region's *output*; the others are read
only inside). :func:`fuse_pointwise_regions` replaces each region of at least two nodes that holds one of the
*triggers* (a node no rule imports as it stands: :func:`_is_trigger`) by one ``PointwiseFn`` node that carries the
region as an ONNX model (:func:`.masks.region_model`). Regions the importer already takes node by node compile as
before, and a single node no rule takes (``Log``, ``Floor``, ``Round``) stays refused: onnx's own cases of those
miss the int8 tolerance near 0 and at halves (docs/transformers.md). The float reference and the quantizer's table
evaluate the region with ONNX's reference evaluator (:func:`..qops_index.run_region`), the region flattened to a
vector; a NaN (a logarithm of a negative value) is 0 in the table, as for :func:`.float_ref.table_values`.

A region may also read *two* activations (RWKV's and xLSTM's ``max(a, b)`` and ``a / b``, a ``Where(a > b, a, b)``,
``a ** b``): each element of its result is then a function ``y = f(a, b)`` of the elements of ``a`` and ``b`` at
its position (numpy broadcasting, so either may repeat along axes of length 1), and once quantized a table of
``256 x 256`` entries, one per pair of int8 inputs (``QLut2``). Such a region is fused when it holds a trigger, one
node included: the importer takes only Add, Sub and Mul of two activations. Three or more activations stay refused:
their table would have 2**24 entries.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..qops import run_region
from .masks import encode, region_model

__all__ = ["POINTWISE_OPS", "FUSED_OP", "fuse_pointwise_regions", "pointwise_values", "split_variadic"]

FUSED_OP = "PointwiseFn"
"""The op type of a fused region in the rewritten ONNX graph, and of its float node (attribute ``onnx``)."""

POINTWISE_OPS = frozenset({
    "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Softplus", "Softsign", "Abs", "Neg", "Sqrt", "Reciprocal", "Erf", "Sin",
    "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Sign", "Floor", "Ceil", "Round",
    "Elu", "Selu", "Celu", "LeakyRelu", "ThresholdedRelu", "HardSigmoid", "HardSwish", "Mish", "Gelu", "Shrink",
    "Identity", "Cast", "Not", "IsNaN", "IsInf", "Clip", "PRelu", "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
    "Mod", "Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Where"})
"""The element-wise ONNX operators a region may hold (each input an element of the same position, or one value)."""

_TWO_SIDED = frozenset({"Div", "Max", "Min", "Pow", "Mod", "PRelu"})
"""Operators the importer takes with one activation and a constant only: with two region inputs, a trigger."""

_FLOAT = TensorProto.FLOAT


def _is_trigger(node: onnx.NodeProto, region_inputs: int, consts: dict[str, onnx.TensorProto],
                scalars: dict[str, np.ndarray], rules: frozenset[str]) -> bool:
    """Whether the importer would refuse ``node`` as it stands (``region_inputs``: how many of its inputs the region
    computes; ``rules``: the op types it has a rule for): no rule, a computed Where condition, two computed operands
    of an op that takes one, or a Pow by an exponent that is no integer from -8 to 8."""
    if node.op_type not in rules or node.op_type == "Where" and node.input[0] not in consts:
        return True
    if node.op_type in _TWO_SIDED and region_inputs > 1:
        return True
    if node.op_type == "Pow" and len(node.input) > 1 and node.input[1] in consts:
        if node.input[1] not in scalars:
            return True
        e = float(scalars[node.input[1]].astype(np.float64).ravel()[0])
        return not (e == np.round(e) and -8 <= e <= 8)
    return False


def split_variadic(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each Max or Min of one input or of three or more, and each Sum or Mean (ONNX's variadic
    forms; no rule takes them), into an Identity or a chain of two-input nodes, left to right (Sum and Mean as Adds, a
    Mean then a Mul by ``1/n``): the same values, in the forms the rules and the regions of two activations take.
    Returns how many were rewritten."""
    graph = model.graph
    out: list[onnx.NodeProto] = []
    split = 0
    for node in graph.node:
        inputs = [t for t in node.input if t]
        if node.op_type not in ("Max", "Min", "Sum", "Mean") or node.domain not in ("", "ai.onnx") or \
                len(inputs) == 2 and node.op_type in ("Max", "Min") or not inputs:
            out.append(node)
            continue
        split += 1
        name = node.name or node.output[0]
        if len(inputs) == 1:
            out.append(helper.make_node("Identity", inputs, list(node.output), name=name))
            continue
        op = "Add" if node.op_type in ("Sum", "Mean") else node.op_type
        acc = inputs[0]
        for k, t in enumerate(inputs[1:], 1):
            last = k == len(inputs) - 1 and node.op_type != "Mean"
            result = node.output[0] if last else f"{name}_part{k}"
            out.append(helper.make_node(op, [acc, t], [result], name=f"{name}_{k}"))
            acc = result
        if node.op_type == "Mean":
            scale = f"{name}_inverse_count"
            graph.initializer.append(numpy_helper.from_array(np.array(1.0 / len(inputs), np.float32), scale))
            out.append(helper.make_node("Mul", [acc, scale], list(node.output), name=f"{name}_mean"))
    if split:
        del graph.node[:]
        graph.node.extend(out)
    return split


def fuse_pointwise_regions(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], rules: frozenset[str]
                           ) -> dict[str, str]:
    """Replace, in place, each element-wise region of one activation (module docstring) that holds a node no rule
    takes by one ``PointwiseFn`` node reading its source and writing its output. ``model`` has inferred shapes
    (``shapes``, static) and folded constants; ``rules`` are the op types the importer has a rule for. Returns each
    fused region's output -> its ONNX model (base64), for the importer's rule."""
    graph = model.graph
    consts = {i.name: i for i in graph.initializer}          # not read whole: a model's weights can be large
    scalars = {name: numpy_helper.to_array(i) for name, i in consts.items() if int(np.prod(i.dims)) == 1}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*graph.input, *graph.value_info, *graph.output]}
    types.update({i.name: i.data_type for i in graph.initializer})
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    readers: dict[str, set[int]] = {}
    for k, node in enumerate(graph.node):
        for t in node.input:
            readers.setdefault(t, set()).add(k)
    outputs = {o.name for o in graph.output}

    def scalar(t: str) -> bool:
        return t in scalars

    def elementwise(k: int) -> bool:
        """Whether node ``k`` may stand in a region: an element-wise op whose constant operands hold one value (a
        bias of one value per channel makes the function depend on the position: that node's output is a source
        instead, as torch's dynamo export of Mamba's ``softplus(x @ W + b)`` needs)."""
        node = graph.node[k]
        return node.op_type in POINTWISE_OPS and node.domain in ("", "ai.onnx") and len(node.output) == 1 and \
            not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute) and \
            not any(t in consts and t not in scalars for t in node.input)

    is_elementwise = [elementwise(k) for k in range(len(graph.node))]
    # Whether a region ending at node k can hold a node the importer refuses: a superset of the regions' nodes (its
    # element-wise ancestors) and of their inputs (all of a node's), so the regions of no such node are not searched.
    refusable = [False] * len(graph.node)
    for k, node in enumerate(graph.node):
        if is_elementwise[k]:
            refusable[k] = _is_trigger(node, len(node.input), consts, scalars, rules) or any(
                j is not None and (j >= k or refusable[j]) for j in map(producer.get, node.input))
    fused: set[int] = set()
    found: dict[str, str] = {}
    replaced: dict[int, onnx.NodeProto] = {}
    for k in reversed(range(len(graph.node))):
        if k in fused or not refusable[k]:
            continue
        out = graph.node[k].output[0]
        if types.get(out) != _FLOAT or out not in shapes:
            continue
        region = _cone(graph, k, producer, readers, outputs, is_elementwise.__getitem__, scalar, fused)
        if region is None:                  # three or more sources: node k alone, when it reads two activations
            region = _lone(graph.node[k], k, scalar)
        if region is None:
            continue
        nodes, sources = region
        if len(nodes) < 3 - len(sources) or not _shapes_fit(sources, nodes, out, graph, shapes, types, consts):
            continue
        inside = {graph.node[j].output[0] for j in nodes} | set(sources)
        if not any(_is_trigger(graph.node[j], sum(t in inside for t in graph.node[j].input), consts, scalars, rules)
                   for j in nodes):
            continue
        ordered = [graph.node[j] for j in sorted(nodes)]
        vi_in = [helper.make_tensor_value_info(t, _FLOAT, None) for t in sources]
        vi_out = helper.make_tensor_value_info(out, _FLOAT, None)
        found[out] = encode(region_model(model, ordered, vi_in, [out], [vi_out], consts))
        fused |= nodes
        replaced[k] = helper.make_node(FUSED_OP, list(sources), [out], name=graph.node[k].name or f"{out}_pointwise")
    if found:
        kept = [replaced.get(k, node) for k, node in enumerate(graph.node) if k not in fused or k in replaced]
        del graph.node[:]
        graph.node.extend(kept)
    return found


def _shapes_fit(sources: tuple[str, ...], nodes: set[int], out: str, graph: onnx.GraphProto,
               shapes: dict[str, tuple[int, ...]], types: dict[str, int], consts: dict[str, onnx.TensorProto]) -> bool:
    """Whether a region's sources are float32 activations and its shapes allow evaluating it on flat vectors: with
    one source, every tensor of the region has ``out``'s shape; with two, every one broadcasts to ``out``'s shape
    (and the sources' broadcast is that shape: a constant widens nothing)."""
    want = shapes[out]
    if any(types.get(t) != _FLOAT or t in consts or t not in shapes for t in sources):
        return False
    inner = [shapes.get(graph.node[j].output[0]) for j in nodes]
    if len(sources) == 1:
        return shapes[sources[0]] == want and all(s == want for s in inner)
    try:
        return np.broadcast_shapes(*(shapes[t] for t in sources)) == want and \
            all(s is not None and np.broadcast_shapes(s, want) == want for s in inner)
    except ValueError:
        return False


def _lone(node: onnx.NodeProto, k: int, scalar) -> tuple[set[int], tuple[str, ...]] | None:
    """Node ``k`` alone as a region of its two activations (RWKV's ``Div(num, den)`` whose cone reads five), or
    None when it reads another number of them."""
    sources = tuple(dict.fromkeys(t for t in node.input if t and not scalar(t)))
    return ({k}, sources) if len(sources) == 2 else None


def _cone(graph: onnx.GraphProto, last: int, producer: dict[str, int], readers: dict[str, set[int]],
          outputs: set[str], elementwise, scalar, taken: set[int]) -> tuple[set[int], tuple[str, ...]] | None:
    """The element-wise nodes node ``last``'s output is computed by from one or two tensors (the sources) and
    one-element constants, and those sources in the order the region first reads them; None when it reads three or
    more tensors. A tensor the cone computes that a node outside it (or the graph's output) also reads becomes a
    source instead, its producers cut off (repeatedly)."""
    cut: set[str] = set()
    while True:
        nodes: set[int] = set()
        sources: set[str] = set()
        stack = [last]
        while stack:
            k = stack.pop()
            if k in nodes:
                continue
            nodes.add(k)
            for t in graph.node[k].input:
                if not t or scalar(t):
                    continue
                j = producer.get(t)
                if t in cut or j is None or j in taken or not elementwise(j):
                    sources.add(t)
                else:
                    stack.append(j)
        if not 1 <= len(sources) <= 2:
            return None
        leaked = {graph.node[j].output[0] for j in nodes if j != last} & (
            outputs | {t for j in nodes for t in graph.node[j].output
                       if readers.get(t, set()) - nodes})
        if not leaked:
            order = [t for j in sorted(nodes) for t in graph.node[j].input if t in sources]
            return nodes, tuple(dict.fromkeys(order))
        cut |= leaked


def pointwise_values(encoded: str, x: np.ndarray, *more: np.ndarray) -> np.ndarray:
    """A fused region's output (float64, the shape its inputs broadcast to) at the real values ``x`` (and ``more``,
    a region of two activations): the region run on them, broadcast to one shape, as float32 vectors by ONNX's
    reference evaluator."""
    arrays = np.broadcast_arrays(*(np.asarray(v, np.float32) for v in (x, *more)))
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    (out,) = run_region(encoded, flat[0], "the element-wise region failed on these values", *flat[1:])
    out = np.asarray(out, np.float64)
    if out.size != flat[0].size:
        raise ValueError(f"the element-wise region gave {out.size} values for {flat[0].size}")
    return out.reshape(arrays[0].shape)
