"""Pre-quantized ONNX -> the quantized graph IR (:mod:`..ir`), with the model's own scales and zero points.

:func:`is_quantized_model` recognizes a model quantized already (any operator of :data:`QUANTIZED_OPS`);
:func:`import_model` (what :func:`..pipeline.load_graph` calls) then imports it by :func:`import_quantized`, any
other model by :func:`.onnx_frontend.import_onnx`, and the pipeline compiles a quantized result without calibrating
(the model's scales are the quantization).

Formats (as ``onnxruntime.quantization.quantize_static`` writes them):

* **QDQ**: ``QuantizeLinear``/``DequantizeLinear`` pairs around float operators. A ``DequantizeLinear`` of an int
  tensor makes its float output an *alias* of that int tensor (read with the DQ's scale and zero point); Relu, Clip,
  MaxPool, Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Identity and Dropout of an alias are aliases too. Conv,
  Gemm, MatMul, Add, GlobalAveragePool, AveragePool, Concat and Sigmoid of aliases must feed one ``QuantizeLinear``
  (through Relu/Clip at most), whose scale and zero point become their output's. Weights and biases are
  ``DequantizeLinear`` of int8/int32 initializers (per channel or per tensor). A dilated Conv of strides 1 takes
  the phase form first (:func:`_undilate_qdq`).
* **QOperator**: ``QuantizeLinear``, ``DequantizeLinear``, ``QLinearConv``, ``QLinearMatMul`` and, from
  ``com.microsoft``, ``QGemm``, ``QLinearAdd``, ``QLinearGlobalAveragePool``, ``QLinearAveragePool``,
  ``QLinearConcat`` and ``QLinearSigmoid``; Flatten, Reshape, MaxPool, Transpose, Squeeze and Unsqueeze of int
  tensors. ``ConvInteger``, ``MatMulInteger`` and ``DynamicQuantizeLinear`` (dynamic quantization: int32 results
  scaled by float operators, scales computed at run time) are refused with that reason.

How the integers map (every IR int8 tensor has a scale and an int8 zero point ``z``; real = ``(x - z) * scale``):

* **uint8** activations become int8 by subtracting 128 from the values and the zero point (``u`` with zero point
  ``zu`` is ``u - 128`` with ``zu - 128``): the same real values, exactly. uint8 weights are used as ``w - zw`` when
  that fits int8 (else refused).
* **Convolution / dense** (``QConv2d``/``QDense``, which the accelerator runs): the input zero point ``zx`` is exact:
  a padded convolution gets an explicit ``Pad`` with value ``zx`` first (ONNX pads with the real zero), and
  ``-zx * sum(w)`` per output channel is folded into the int32 bias, which is then ``conv(x, w) + bias``, the same
  accumulator as ``conv(x - zx, w) + bias``. The requantization ``x_scale * w_scale / y_scale`` becomes (M, S) by
  :func:`.quantize.choose_requant` with the accumulator bound of every int8 input (no wrap-around for any data),
  and the output zero point plus the rounding become ``floor((2 * zy + 1) * 2**(S-1) / M)`` added to the bias.
  onnxruntime computes ``rint(float32(acc * scale)) + zy`` (round half to even, in float32); the lab computes
  ``floor((acc + bias') * M / 2**S)``: the same but for M's precision (relative error <= 2**-(bits of M)), the bias
  term's floor (< M / 2**S of an output step) and ties. Saturation is the same clip, to [-128, 127] in the int8
  domain (a fused Relu/Clip narrows it: Relu clips at the output zero point).
* **Add**: ``QAffine`` ``(a * Ma + b * Mb + offset) >> S`` with both zero points, the output's and the rounding in
  ``offset`` (int64 on the CPU; S up to 40, M < 2**24): exact round-half-up of the real ratios to 2**-24. When
  every zero point is 0 and one operand comes from a convolution (or dense) that feeds only this add and does not
  clip, it becomes the accelerator's ``QAdd`` (``(a * Ma + b * Mb) >> S``, 15-bit M) and the truncation is
  offset by raising that convolution's bias by half an output step of the add (the rule of
  :mod:`.quantize`): right on average, but an element may differ from onnxruntime's by one step more often.
* **Rescale** (a QuantizeLinear of an alias at other parameters, Concat inputs at other parameters): ``QAffine``
  with one input. **GlobalAveragePool** at the input's parameters: ``GlobalAvgPool`` (zero-point invariant, round
  half up); at other parameters a depthwise ``QConv2d`` with a ones kernel (``x_scale / (y_scale * H * W)``).
  **AveragePool**: ``AvgPool`` at the input's parameters (an explicit Pad with ``zx`` when padding counts), then a
  rescale when the output's differ (rounded twice). **Sigmoid**: a ``QLut`` table from both parameters, exact.
  **MaxPool**, Reshape, Transpose: zero-point invariant. **Relu/Clip**: ``QClip`` at the zero point / the rounded
  bounds, fused into a producing convolution, dense or add that feeds nothing else.
* **QuantizeLinear** of the float input: ``QuantizeZp`` (``Quantize`` when z = 0): ``rint(float64(x) / s) + z``;
  onnxruntime divides in float32 (a rare one-step difference at a rounding boundary). **DequantizeLinear** to a
  graph output: ``DequantizeZp`` (``Dequantize`` when z = 0).

So the lab's result may differ from onnxruntime's int8 execution by one output step at rounding boundaries
(precision of M, ties, float32 against float64, a QAdd's average rounding); the tests hold it to within one step on
at least 99 % of the output elements.
"""
from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, cast

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..ir import INT8_MAX, INT8_MIN, AddRequant, Graph, GraphError, Node, PartialQuantization, Requant, conv_output_hw
from ..qops import reference_evaluator
from . import prequant_tables
from .contrib import static_shapes
from .conv_transpose import SPREAD_LIMIT, _dilated_phase_nodes, _stride1_pads
from .dequantize import qdq_ranges, qdq_to_float, qoperator_to_qdq, undequantized_ops
from .onnx_checks import axis_problem, index_problem
from .onnx_common import tensor_namer
from .onnx_frontend import (
    UnsupportedModelError,
    UnsupportedOperatorError,
    _check_file,
    _check_single_definitions,
    _check_sizes,
    _check_types,
    _fix_inputs,
    _fix_values,
    _fold_constants,
    _infer_shapes,
    _read_model,
    file_conventions,
    import_onnx,
    tensor_byte_limit,
    warn_once,
)
from .onnx_fusions import _fuse_decompositions
from .onnx_rules import resize_attrs
from .onnx_transformer_rules import gather_indices, slice_spec
from .prequant_complete import SUFFIX as COMPLETION_SUFFIX
from .prequant_complete import complete, drop_pairs, measure_ranges, plan_completion, unquantize_infinite
from .quantize import choose_requant

__all__ = ["QUANTIZED_OPS", "is_quantized_model", "import_quantized", "import_model", "complete_partial",
           "normalized"]
T = TypeVar("T")

QUANTIZED_OPS = frozenset({
    "QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
    "DynamicQuantizeLinear", "QGemm", "QLinearAdd", "QLinearGlobalAveragePool", "QLinearAveragePool",
    "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
})
"""ONNX operators that make a model pre-quantized (one is enough)."""

_QUANTIZED_MS_OPS = frozenset({"QLinearMul", "QLinearSoftmax", "QLinearLeakyRelu", "QLinearReduceMean",
                               "QLinearWhere", "QAttention", "QEmbedLayerNormalization", "QOrderedMatMul"})
"""More of onnxruntime's quantized operators (``com.microsoft``): never constant-folded (:func:`_fold_shapes`)."""

_INTEGER_INPUTS = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL})
"""Element types of the integer graph inputs the integer import takes: token ids (read by a Gather of a quantized
table) and attention masks (computed in float up to a QuantizeLinear: :func:`_integer_input_regions`)."""

INT32_MAX = 2**31 - 1
AFFINE_BITS = 24
"""``QAffine`` multipliers stay below ``2**AFFINE_BITS`` (int64 arithmetic: no overflow for int8 inputs)."""


def import_model(model: str | os.PathLike | onnx.ModelProto, *, batch: int = 1, name: str | None = None,
                 input_shapes: dict[str, tuple[int, ...]] | None = None,
                 input_values: dict[str, float] | None = None) -> Graph:
    """Any ONNX model (path or ModelProto) as a validated graph: a pre-quantized one (:func:`is_quantized_model`)
    by :func:`import_quantized`, with :func:`.onnx_frontend.import_onnx`'s checks of the file, the opset, the input
    shapes (``batch``, ``input_shapes``) and the tensor sizes; any other by :func:`.onnx_frontend.import_onnx` (a
    float graph). A QDQ model with operators :func:`import_quantized` refuses is imported as its dequantized float
    graph (:func:`.dequantize.qdq_to_float`), with a warning saying so; when the file has float islands
    (:mod:`.prequant_complete`), that graph carries the file in :attr:`~..ir.Graph.partial` and the warning waits
    for :func:`complete_partial`, which the compile calls once it has calibration samples."""
    is_path = isinstance(model, (str, os.PathLike))
    proto = _read_model(os.fspath(model)) if is_path else model
    if not isinstance(proto, onnx.ModelProto) or not is_quantized_model(proto):
        return import_onnx(model, batch=batch, name=name, input_shapes=input_shapes, input_values=input_values)
    where = os.fspath(model) if is_path else (name or proto.graph.name or "model")
    label = name or (os.path.splitext(os.path.basename(where))[0] if is_path else where)
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    file_conventions(proto)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer (images per inference), not {batch!r}.")
    _check_file(proto, where)
    if input_values:
        _fix_values(proto, input_values, where)
    _fix_inputs(proto, batch, dict(input_shapes or {}), where)
    _check_sizes(proto, where, tensor_byte_limit())
    foreign = [UnsupportedOperatorError(f"{n.domain}.{n.op_type}", n.name or f"#{k}", "an operator of another domain")
               for k, n in enumerate(proto.graph.node) if n.domain not in ("", "ai.onnx", "com.microsoft")]
    if foreign:              # the float import refuses them too; the quantized paths read nodes by op_type alone
        raise foreign[0] if len(foreign) == 1 else UnsupportedModelError(where, foreign)
    _check_types(proto)
    nhwc = [f"{n.op_type} (node {n.name or '#' + str(k)!r})" for k, n in enumerate(proto.graph.node)
            if n.op_type.startswith("Nhwc") or (n.domain == "com.microsoft" and _attrs(n).get("channels_last", 0))]
    if nhwc:
        raise GraphError(f"{where} holds onnxruntime's NHWC layout for the machine that saved it ({', '.join(nhwc[:3])}"
                         f"{', ...' if len(nhwc) > 3 else ''}): it was saved at ORT_ENABLE_ALL, whose file onnxruntime "
                         f"says is for that machine alone. Save the optimized file at ORT_ENABLE_EXTENDED or below, "
                         f"or give the lab the file before optimization.")
    unquantize_infinite(proto, constants_only=True)     # T5's buckets: the float values the file computes from
    proto = normalized(proto)
    _dilated_qlinear_convs_as_qdq(proto)
    _infinite_qoperators_as_qdq(proto)
    _undilate_qdq(proto)
    _check_single_definitions(proto, where)
    try:
        return import_quantized(proto, label)
    except ValueError as err:
        dequantized = qdq_to_float(proto)               # import_quantized reads proto; this works on a copy
        first = " ".join(line.strip() for line in str(err).splitlines()[:2])
        if dequantized is None:
            ops = undequantized_ops(proto)
            if not ops:
                raise
            raise GraphError(f"{where} is quantized with {', '.join(ops)}, which the lab neither imports as "
                             f"integers here ({first}) nor turns back into float: it dequantizes QDQ files and "
                             f"quantize_dynamic's MatMulInteger/ConvInteger chains. Quantize the float model in QDQ "
                             f"format (onnxruntime's quantize_static(..., quant_format=QuantFormat.QDQ)), or give "
                             f"the lab the float model.") from err
    plan = plan_completion(proto)
    if plan.empty:
        _warn_float_graph(where, first)
    try:
        graph = import_onnx(dequantized, batch=batch, name=label, input_shapes=input_shapes)
    except ValueError:
        if not plan.empty:                         # the float graph fails too: first say why it was taken
            _warn_float_graph(where, first)
        raise
    graph.absmax_hints = {name: value for name, value in qdq_ranges(proto).items() if name in graph.tensors}
    if not plan.empty:
        graph.partial = PartialQuantization(proto.SerializeToString(), where, first, bool(plan.ranges))
    return graph


def _warn_float_graph(where: str, refusal: str) -> None:
    logging.getLogger("vta").warning(
        "%s is quantized (QDQ or dynamic) in a form the lab's integer import does not take (%s); it is imported as its "
        "dequantized float graph instead: the weights keep their int8 values, the activations are quantized again "
        "with the lab's own symmetric scales (from the file's ranges, or from --calibration data when given), so the "
        "run is not bit-exact with onnxruntime on the file", where, refusal)


def complete_partial(graph: Graph, samples: Mapping[str, np.ndarray] | None) -> tuple[Graph, str] | None:
    """The quantized graph of the partially quantized file behind the float ``graph`` (its :attr:`~..ir.Graph.partial`
    set by :func:`import_model`): the file's float islands quantized by the lab
    (:mod:`.prequant_complete`; float activations at the largest magnitude onnxruntime computes on the calibration
    ``samples``, input name -> stacked samples), then :func:`import_quantized`; with a line for the report saying what
    the lab quantized. None, after the warning that the float graph is used instead, when the completed file is
    refused too (or onnxruntime cannot run it to measure)."""
    partial = graph.partial
    if partial is None:
        return None
    proto = onnx.ModelProto.FromString(partial.model)
    rows = _fold_per_row_lookups(partial.model)
    forms = list(dict.fromkeys([_unquantize_partial_decompositions(rows).SerializeToString(), rows, partial.model]))
    sources = [onnx.ModelProto.FromString(form) for form in forms]   # the next when one does not import: the file's
    for k, source in enumerate(sources):                              # inner pairs kept, its rows not folded
        try:                                       # float chains: one operator each
            fused = _fuse_decompositions(source)
        except Exception:  # noqa: BLE001 - the fusion only saves roundings: a file it cannot read is completed unfused
            logging.getLogger("vta").debug("%s: the float decompositions were not fused", partial.where,
                                           exc_info=True)
            fused = onnx.ModelProto.FromString(forms[k])
        plan = plan_completion(fused)
        try:
            ranges = measure_ranges(proto, plan.ranges, samples or {}) if plan.ranges else {}
            quantized = import_quantized(complete(fused, plan, ranges), graph.name)
        except (ValueError, RuntimeError) as err:
            if k + 1 < len(sources):
                continue
            why = " ".join(line.strip() for line in str(err).splitlines()[:2])
            _warn_float_graph(partial.where, partial.refusal + (
                "; quantizing the operators it left float does not change that" if why == partial.refusal else
                f"; with the operators it left float quantized by the lab: {why}"))
            return None
        logging.getLogger("vta").info("%s: imported as integers with %s", partial.where, plan.summary)
        return quantized, plan.summary
    return None


def _fold_per_row_lookups(model: bytes) -> bytes:
    """The serialized ``model`` with each DequantizeLinear of an integer table quantized per row (axis 0; NNCF's
    transformer preset) that only Gather nodes at constant ids read (BERT's position and token-type rows, T5's
    relative-attention bias at its buckets) folded with those Gathers into the float rows they give: the integer
    import reads a constant of several values per tensor only, so the completion quantizes them as any float
    constant beside an activation (and says so); a table looked up at token ids stays (:func:`_embedding`)."""
    proto = onnx.ModelProto.FromString(model)
    inits = {init.name: init for init in proto.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    anyway: set[str] = set()
    for node in proto.graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) < 2 or node.input[0] not in inits or \
                node.input[1] not in inits or int(np.prod(inits[node.input[1]].dims)) < 2:
            continue
        users = readers.get(node.output[0], [])
        if users and all(u.op_type == "Gather" and u.input[0] == node.output[0] and len(u.input) > 1 and
                         u.input[1] in inits for u in users):
            anyway.update([node.output[0], *(u.output[0] for u in users)])
    if not anyway:
        return model
    return _fold_constants(proto, keep=QUANTIZED_OPS | _QUANTIZED_MS_OPS,
                           fold_anyway=frozenset(anyway)).SerializeToString()


def _unquantize_partial_decompositions(model: bytes) -> onnx.ModelProto:
    """The serialized ``model`` without the QuantizeLinear/DequantizeLinear pairs inside a decomposition (a
    LayerNorm's ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div...) that the file quantized in part: onnxruntime at
    opset 14 quantizes a LayerNorm's variance, its division and its scale, and leaves the mean, the difference and
    the squares float. Completed step by step, the squares took one int8 scale for every row, and a row of small
    values (ViT's class token) lost its variance (cosine 0.74 against onnxruntime on that row). Without its inner
    pairs the decomposition is wholly float and :func:`.onnx_fusions._fuse_decompositions` makes it one operator,
    quantized at the file's pairs on its input and output. Found by fusing a copy without any activation pairs: a
    fused decomposition some of whose inner tensors the file left float loses its inner pairs; one the file
    quantized at every step keeps them (the file's integers). (:func:`complete_partial` falls back to the model as
    it was when the stripped one does not import.)"""
    probe = onnx.ModelProto.FromString(model)
    _strip_activation_pairs(probe, None)
    try:
        probe = _fuse_decompositions(_fold_constants(probe))  # an epsilon, a gamma the file quantized: constants
    except Exception:  # noqa: BLE001 - nothing is stripped where the fusion cannot read the file
        return onnx.ModelProto.FromString(model)
    original = onnx.ModelProto.FromString(model)
    kept = {o for node in probe.graph.node for o in node.output}
    producer = {o: node for node in original.graph.node for o in node.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in original.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    inner: dict[str, str] = {}                     # a fused tensor's name -> the fused node's output (its group)
    for node in probe.graph.node:
        if node.op_type not in ("LayerNormalization", "RMSNormalization"):
            continue
        group: set[str] = set()
        front, seen = [node.output[0]], set()
        while front:                       # back from the output to the input (or constants), through the original
            t = front.pop()
            made = producer.get(t)
            if made is None or t in seen or t == node.input[0] or (t != node.output[0] and t in kept):
                continue
            seen.add(t)
            group.update(o for o in made.output if o and o != node.output[0])
            front.extend(i for i in made.input if i)
        inner.update({t: node.output[0] for t in group})
    mixed = {inner[t] for t in inner if producer[t].op_type not in ("QuantizeLinear", "DequantizeLinear") and
               any(r.op_type != "QuantizeLinear" for r in readers.get(t, []))}      # a step the file left float
    if not mixed:
        return original
    strip = {t for t, name in inner.items() if name in mixed}
    return _stripped(model, strip, strip | mixed)


def _stripped(model: bytes, strip: set[str], members: set[str]) -> onnx.ModelProto:
    """The serialized ``model`` without the activation pairs of the tensors ``strip``, and with the quantization
    pairs of constants that only nodes writing ``members`` read (an epsilon, a gamma) folded to their float
    values (:func:`_unquantize_partial_decompositions`)."""
    out = onnx.ModelProto.FromString(model)
    _strip_activation_pairs(out, strip)
    users: dict[str, list[onnx.NodeProto]] = {}
    for node in out.graph.node:
        for t in node.input:
            users.setdefault(t, []).append(node)
    const = {init.name for init in out.graph.initializer}
    pairs: dict[str, onnx.NodeProto] = {}
    for node in out.graph.node:                    # the quantization nodes of constants alone (an epsilon's pair)
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and all(not t or t in const for t in node.input):
            const.update(node.output)
            pairs.update({o: node for o in node.output})
    anyway: set[str] = set()                       # those the decompositions alone read: folded to their values
    for name, node in pairs.items():
        if node.op_type == "DequantizeLinear" and users.get(name) and \
                all(u.output and u.output[0] in members for u in users[name]):
            anyway.add(name)
            if node.input[0] in pairs and all(u.op_type == "DequantizeLinear" for u in users.get(node.input[0], [])):
                anyway.add(node.input[0])
    if anyway:
        out = _fold_constants(out, keep=QUANTIZED_OPS | _QUANTIZED_MS_OPS, fold_anyway=frozenset(anyway))
    return out


def _strip_activation_pairs(model: onnx.ModelProto, only: set[str] | None) -> None:
    """In place: each QuantizeLinear of an activation (with ``only``, of a tensor in it) whose readers are all
    DequantizeLinear goes with them, and their readers read its float input."""
    consts = {init.name for init in model.graph.initializer}
    drop_pairs(model, lambda node: node.input[0] not in consts and (only is None or node.input[0] in only))


def _fold_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with the nodes of constants alone folded (the shape arithmetic an exporter writes: Shape, Gather,
    Cast, Div of a channel count; Identity of a shared bias), as the float import does, but for the quantization
    operators, whose integer weights the import reads: a DequantizeLinear of an int8 constant stays one. Shape
    inference runs between passes, so Shape of an activation folds once its shape is known."""
    proto = _infer_shapes(proto)
    microsoft = any(node.domain == "com.microsoft" for node in proto.graph.node)
    for _ in range(8):
        if microsoft:                               # shape inference drops them each pass
            _borrow_shapes(proto)
        before = len(proto.graph.node)
        proto = _infer_shapes(_fold_constants(proto, keep=QUANTIZED_OPS | _QUANTIZED_MS_OPS,
                                              fold_anyway=_constant_region_quantizations(proto)))
        if len(proto.graph.node) == before:
            break
    return proto


def _constant_region_quantizations(proto: onnx.ModelProto) -> frozenset[str]:
    """The outputs of the standard quantization nodes (QuantizeLinear, DequantizeLinear) of constants whose values
    reach no activation's operator except through arithmetic on constants alone: a quantizer's pair around a
    constant table that feeds a computation of constants only (Swinv2's continuous position bias, a small MLP over
    a table of relative coordinates, added to the scores). They fold with the rest of that computation as ONNX
    defines them (the file's rounding of the table kept). A weight's DequantizeLinear, which reaches the operator
    of an activation through moves alone (:data:`_CONST_MOVES`: a Transpose, another quantization pair), stays, for
    the import to read its integers."""
    const = {init.name for init in proto.graph.initializer}
    outputs = {o.name for o in proto.graph.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type not in ("If", "Loop", "Scan") and \
                all(not t or t in const for t in node.input):
            const.update(o for o in node.output if o)
        for t in node.input:
            readers.setdefault(t, []).append(node)
    seen: dict[str, bool] = {}

    def reaches_activation(t: str) -> bool:
        if t not in seen:
            seen[t] = True                          # a cycle in an invalid file: kept
            seen[t] = t in outputs or not readers.get(t) or any(
                r.domain not in ("", "ai.onnx") or r.op_type in ("If", "Loop", "Scan") or
                any(u and u not in const for u in r.input) or
                (r.op_type in _CONST_MOVES and any(reaches_activation(o) for o in r.output if o))
                for r in readers[t])
        return seen[t]

    return frozenset(node.output[0] for node in proto.graph.node
                     if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.domain in ("", "ai.onnx")
                     and node.output[0] in const and not reaches_activation(node.output[0]))


_CONST_MOVES = frozenset({"Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten", "Gather", "Slice",
                          "Split", "Expand", "Tile", "Concat", "Cast", "QuantizeLinear", "DequantizeLinear"})
"""Operators through which a constant's integers still reach an activation's operator as a weight's
(:func:`_constant_region_quantizations`)."""


def _borrow_shapes(proto: onnx.ModelProto) -> None:
    """In place: the shapes ONNX's shape inference cannot give the outputs of ``com.microsoft`` operators (a QOperator
    file's QLinearAdd, QLinearSoftmax...; everything after them, so a transformer's ``Shape`` of a head's activation
    would not fold; AMD Quark's com.microsoft DequantizeLinear of a mask's fill values, so the mask region had no
    types), taken from the same file written as QDQ (:func:`.dequantize.qoperator_to_qdq`: standard operators, the
    tensors' names kept; com.microsoft's QuantizeLinear and DequantizeLinear read by ONNX's schema), added to
    ``proto``'s value_info."""
    standard = onnx.ModelProto.FromString(proto.SerializeToString())
    qoperator_to_qdq(standard)
    for node in standard.graph.node:          # com.microsoft's QuantizeLinear, DequantizeLinear: ONNX's schema
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and node.domain == "com.microsoft":
            node.domain = ""
    known = static_shapes(proto)
    written = {o for node in proto.graph.node for o in node.output}
    borrowed = [vi for vi in _infer_shapes(standard).graph.value_info if vi.name in written and vi.name not in known]
    names = {vi.name for vi in borrowed}
    kept = [vi for vi in proto.graph.value_info if vi.name not in names]   # their type alone, no shape
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept + borrowed)


def normalized(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` (input shapes fixed) as the integer import and the dequantizer read it: shapes inferred and the shape
    arithmetic of constants folded (:func:`_fold_shapes`), Casts to a tensor's own type dropped
    (:func:`_drop_identity_casts`), onnxruntime's fused static integer MatMuls unfused
    (:func:`_unfuse_static_matmuls`)."""
    proto = _fold_shapes(proto)
    _drop_identity_casts(proto)
    if _unfuse_static_matmuls(proto):
        proto = _infer_shapes(proto)
    if any(node.domain == "com.microsoft" for node in proto.graph.node):
        _borrow_shapes(proto)                       # the last inference dropped them again
    return proto


def _drop_identity_casts(proto: onnx.ModelProto) -> None:
    """In place: a ``Cast`` to the type its input has already (torch's export of a quantized model writes
    ``QuantizeLinear -> Cast(to=UINT8) -> DequantizeLinear`` for every quantized tensor) is removed and its readers
    read its input; one that writes a graph output is kept."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*proto.graph.input, *proto.graph.value_info]
             if vi.type.HasField("tensor_type")}
    types.update({init.name: init.data_type for init in proto.graph.initializer})
    outputs = {o.name for o in proto.graph.output}
    alias: dict[str, str] = {}
    kept = []
    for node in proto.graph.node:
        node.input[:] = [alias.get(t, t) for t in node.input]
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and node.output[0] not in outputs and \
                types.get(node.input[0]) == int(_attrs(node).get("to", 0)) != 0:
            alias[node.output[0]] = node.input[0]
            continue
        kept.append(node)
    if alias:
        del proto.graph.node[:]
        proto.graph.node.extend(kept)


_INT_MOVES = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Split", "Slice"})
"""Operators that move a quantized tensor's integers (onnxruntime moves them before a fused integer MatMul)."""


def _unfuse_static_matmuls(proto: onnx.ModelProto) -> bool:
    """In place: each ``com.microsoft`` ``MatMulIntegerToFloat`` whose A and B are statically quantized (an int8 or
    uint8 initializer, or the result of a ``QuantizeLinear``, ``QGemm`` or ``QLinear*`` node, through the moves of
    :data:`_INT_MOVES`) and whose scales and zero points are constants becomes
    ``MatMul(DequantizeLinear(A), DequantizeLinear(B))`` (plus ``Add`` of its bias): what onnxruntime's extended
    optimization fused of a QDQ file's MatMul with a float result (attention's scores before a float Softmax), which
    the integer import then reads as the QDQ file it was. B's scale may hold one value per column. A node of dynamic
    quantization (A from ``DynamicQuantizeLinear``) is left for :mod:`.dequantize`. True when any changed."""
    inits = {i.name: i for i in proto.graph.initializer}
    producers = {o: n for n in proto.graph.node for o in n.output if o}
    nodes: list[onnx.NodeProto] = []
    changed = False
    new = tensor_namer(proto)

    def static(t: str) -> bool:
        quant = producers.get(t)
        while quant is not None and quant.op_type in _INT_MOVES and quant.domain in ("", "ai.onnx"):
            t, quant = quant.input[0], producers.get(quant.input[0])      # a head split of the integers
        return (t in inits and inits[t].data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)) or \
            (quant is not None and (quant.op_type in ("QuantizeLinear", "QGemm") or
                                    quant.op_type.startswith("QLinear")))   # static quantization's integers

    for node in proto.graph.node:
        names = list(node.input) + [""] * (7 - len(node.input))
        a, b, sa, sb, za, zb, bias = names[:7]
        if node.op_type != "MatMulIntegerToFloat" or node.domain != "com.microsoft" or not (static(a) and static(b)) \
                or any(t and t not in inits for t in (sa, sb, za, zb)):
            nodes.append(node)
            continue
        label = node.name or node.output[0]
        b_axis: dict[str, Any] = {"axis": -1} if int(np.prod(inits[sb].dims)) > 1 else {}   # per column of B
        float_a, float_b = new(f"{label}_a"), new(f"{label}_b")
        nodes.append(helper.make_node("DequantizeLinear", [a, sa] + ([za] if za else []), [float_a],
                                      name=f"{label}_a"))
        nodes.append(helper.make_node("DequantizeLinear", [b, sb] + ([zb] if zb else []), [float_b],
                                      name=f"{label}_b", **b_axis))
        product = new(f"{label}_product") if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [float_a, float_b], [product], name=label))
        if bias:
            nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{label}_bias"))
        changed = True
    if changed:
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
    return changed


def _dilated_qlinear_convs_as_qdq(proto: onnx.ModelProto) -> None:
    """In place: a dilated ``QLinearConv`` of strides 1 becomes the QDQ nodes it stands for
    (:func:`.dequantize.qoperator_to_qdq`: DequantizeLinear of its input and weights, its int32 bias dequantized, the
    float ``Conv``, QuantizeLinear at its output's parameters), which :func:`_undilate_qdq` then puts in the phase
    form: a QOperator file's dilated convolution (DeepLab's) runs as integers, as the QDQ file's does. Every output
    element is the same requantized accumulator."""
    def dilated(node: onnx.NodeProto) -> bool:
        a = _attrs(node)
        return node.op_type == "QLinearConv" and node.domain in ("", "ai.onnx") and \
            any(int(d) != 1 for d in a.get("dilations", [])) and all(int(v) == 1 for v in a.get("strides", []))

    qoperator_to_qdq(proto, only=dilated)


def _infinite_qoperators_as_qdq(proto: onnx.ModelProto) -> None:
    """In place: a QOperator node with a scale of inf or NaN among its constant inputs (onnxruntime's QLinearAdd of
    an attention mask's -inf and the QLinearSoftmax after it) becomes the QDQ nodes it stands for
    (:func:`.dequantize.qoperator_to_qdq`), which the QDQ rules then read as a float mask
    (:func:`_unquantized_mask`), as in the QDQ file of the same model."""
    inits = {init.name: init for init in proto.graph.initializer}

    def infinite(node: onnx.NodeProto) -> bool:
        return node.op_type.startswith("QLinear") and any(
            name in inits and inits[name].data_type == onnx.TensorProto.FLOAT and
            not np.isfinite(numpy_helper.to_array(inits[name])).all() for name in node.input)

    if any(infinite(node) for node in proto.graph.node):
        qoperator_to_qdq(proto, only=infinite)


def _undilate_qdq(proto: onnx.ModelProto) -> None:
    """In place: a dilated ``Conv`` of strides 1 (1-D or 2-D, static input shape) whose weights are DequantizeLinear
    of an initializer and whose result feeds one QuantizeLinear (through Relu/Clip at most) takes the float import's
    phase form (:func:`.conv_transpose.undilate_convs`: pad, the phases into the batch, one undilated Conv, the phases
    back, the cut), with a QuantizeLinear/DequantizeLinear pair at that QuantizeLinear's parameters right after the
    undilated Conv. Each output element is the same accumulator requantized at the same parameters, so the result is
    the dilated Conv's; the moves after it are zero-point invariant, and the original QuantizeLinear then quantizes at
    its own parameters again (the identity). Any other dilated Conv is left for the Conv rule to name."""
    shapes = static_shapes(proto)
    consts = {init.name: init for init in proto.graph.initializer}
    producers = {o: n for n in proto.graph.node for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in proto.graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)
    outputs = {o.name for o in proto.graph.output}
    nodes: list[onnx.NodeProto] = []
    new = tensor_namer(proto)
    for node in proto.graph.node:
        nodes.append(node)
        a = _attrs(node)
        dilations = [int(d) for d in a.get("dilations", [])]
        wq = producers.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        if node.domain not in ("", "ai.onnx") or wq is None or wq.op_type != "DequantizeLinear" or \
                wq.input[0] not in consts or all(d == 1 for d in dilations) or min(dilations) < 1:
            continue
        w_shape = [int(d) for d in consts[wq.input[0]].dims]
        # a DequantizeLinear's result has its input's shape, which inference may not give past onnxruntime's ops
        x_source = producers.get(node.input[0])
        kernel = w_shape[2:]
        x_shape = shapes.get(node.input[0]) or (
            shapes.get(x_source.input[0]) if x_source is not None and x_source.op_type == "DequantizeLinear" else None)
        if len(kernel) not in (1, 2) or len(dilations) != len(kernel) or x_shape is None or \
                len(x_shape) != 2 + len(kernel) or any(int(v) != 1 for v in a.get("strides", [])):
            continue
        tensor, quant = node.output[0], None
        while tensor not in outputs and len(readers.get(tensor, [])) == 1:
            user = readers[tensor][0]
            if user.op_type == "QuantizeLinear":
                quant = user
                break
            if user.op_type not in ("Relu", "Clip"):
                break
            tensor = user.output[0]
        pads = _stride1_pads(a, kernel, dilations)
        if quant is None or pads is None or min(pads) < 0:
            continue
        out_len = [n + b + e - (k - 1) * d for n, b, e, k, d in zip(x_shape[2:], pads[:len(kernel)],
                                                                     pads[len(kernel):], kernel, dilations)]
        if min(out_len) < 1:
            continue
        phase = _dilated_phase_nodes(proto, node, x_shape, kernel, dilations, pads, out_len, w_shape[0], new)
        at = next(k for k, n in enumerate(phase) if n.op_type == "Conv")
        raw = phase[at].output[0]
        params = list(quant.input[1:])
        quantized, dequantized = new(f"{raw}_quantized"), new(f"{raw}_dequantized")
        pair = [onnx.helper.make_node("QuantizeLinear", [raw, *params], [quantized],
                                      name=f"{phase[at].name}_quantize"),
                onnx.helper.make_node("DequantizeLinear", [quantized, *params], [dequantized],
                                      name=f"{phase[at].name}_dequantize")]
        for later in phase[at + 1:]:
            later.input[:] = [dequantized if name == raw else name for name in later.input]
        nodes[-1:] = phase[:at + 1] + pair + phase[at + 1:]
    if len(nodes) != len(proto.graph.node):
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)


def is_quantized_model(model: onnx.ModelProto) -> bool:
    """True when ``model`` uses an operator of :data:`QUANTIZED_OPS` (it carries its own quantization)."""
    return any(node.op_type in QUANTIZED_OPS for node in model.graph.node)


@dataclass(frozen=True)
class _Act:
    """An IR int8 tensor read with ``scale`` and int8-domain zero point ``zp``."""

    name: str
    scale: float
    zp: int


@dataclass(frozen=True)
class _Out:
    """Where a quantized operator writes: the ONNX int tensor, its scale and int8-domain zero point, whether ONNX
    holds it as uint8, and the clip range (int8 domain) of a fused Relu/Clip."""

    name: str
    scale: float
    zp: int
    unsigned: bool
    lo: int = INT8_MIN
    hi: int = INT8_MAX


class _Refused(Exception):
    """A node read a tensor a refused node would have written (reported once, at the refused node)."""


class _Importer:
    """State of one import: the IR graph being built and what each ONNX tensor is."""

    def __init__(self, model: onnx.ModelProto, label: str) -> None:
        self.model = model
        self.graph = Graph(label)
        self.consts: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.ints: dict[str, str] = {}            # ONNX int tensor -> IR int8 tensor (values shifted to int8)
        self.unsigned: dict[str, bool] = {}
        self.floats: dict[str, _Act] = {}         # ONNX float tensor that is DequantizeLinear of an int tensor
        self.pending: dict[str, tuple[_Act, Callable[[np.ndarray], np.ndarray]]] = {}   # float function of one
        self.weights: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}  # DQ of a constant: (int64, scale, axis)
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in model.graph.output}
        self.skip: set[int] = set()
        self.deferred: dict[str, tuple[str, float, int]] = {}      # int tensor -> (float alias, scale, zero point)
        self.float_outputs: set[str] = set()      # graph outputs a rule wrote as float32 itself
        self.refused: set[str] = set()
        self.int_inputs: set[str] = set()         # integer graph inputs: token ids, attention masks
        self.input_fns: set[str] = set()          # float32 IR tensors an InputFn computes from an integer input
        self.tables: dict[str, tuple[np.ndarray, float, int]] = {}  # DQ of an int table: (int8 values, scale, zp)
        # onnxruntime's infinite scales on an attention mask (:func:`_unquantized_mask`): a QuantizeLinear or
        # DequantizeLinear output at scale inf -> the float tensor it stands for, unquantized; and the masked scores
        # (an Add of scores and such a mask) -> (the scores, the float32 mask term)
        self.unquantized: dict[str, str] = {}
        self.masked_scores: dict[str, tuple[_Act, str]] = {}
        # a mask the file quantizes (QuantizeLinear of a region's float exit), by its QuantizeLinear and
        # DequantizeLinear outputs: an Add of scores and its DequantizeLinear that only Softmax nodes read (the file
        # left the sum float) takes it as the Softmax's additive term, dequantized
        self.masks: set[str] = set()

    # ---- reading parameters -------------------------------------------------------------------------------------
    def const(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray:
        if index >= len(node.input) or not node.input[index]:
            raise UnsupportedOperatorError(node.op_type, node.name, f"its {what} is missing")
        name = node.input[index]
        if name not in self.consts:
            raise UnsupportedOperatorError(node.op_type, node.name, f"its {what} {name!r} is not a constant")
        value = self.consts[name]
        if what.endswith("scale") and value.dtype.kind == "f" and not (np.isfinite(value) & (value > 0)).all():
            bad = value.reshape(-1)[~(np.isfinite(value) & (value > 0)).reshape(-1)][0]
            why = "" if np.isfinite(bad) else (
                " (onnxruntime's quantizer writes inf where its calibration saw an infinite value, such as an "
                "attention mask's -inf: onnxruntime's own run of the file dequantizes that tensor to NaN, so its "
                "results from there on are not the model's; exclude the mask's nodes from quantization, or mask with "
                "a finite value such as -1e4)")
            raise UnsupportedOperatorError(node.op_type, node.name, f"its {what} {name!r} holds {bad}; a "
                                           f"quantization scale must be finite and positive{why}")
        return value

    def scalar_scale(self, node: onnx.NodeProto, index: int) -> float:
        scale = self.const(node, index, "scale").astype(np.float64).reshape(-1)
        if scale.size != 1:
            raise UnsupportedOperatorError(node.op_type, node.name, f"its activation scale has {scale.size} values; "
                                           f"activations must be quantized per tensor")
        return float(scale[0])

    def zero_point(self, node: onnx.NodeProto, index: int, unsigned: bool | None = None) -> tuple[int, bool]:
        """(int8-domain zero point, ONNX type is uint8) of input ``index`` (absent: 0 of ``unsigned``'s type)."""
        if index >= len(node.input) or not node.input[index]:
            unsigned = True if unsigned is None else unsigned
            return (-128 if unsigned else 0), unsigned
        zp = self.const(node, index, "zero point")
        if zp.dtype not in (np.uint8, np.int8) or zp.size != 1:
            raise UnsupportedOperatorError(node.op_type, node.name, f"its activation zero point is {zp.size} "
                                           f"{zp.dtype} values; the lab takes one int8 or uint8 value")
        is_unsigned = zp.dtype == np.uint8
        return int(zp.reshape(-1)[0]) - (128 if is_unsigned else 0), is_unsigned

    def act(self, node: onnx.NodeProto, index: int, scale_index: int, zp_index: int) -> _Act:
        """An int input of a QOperator node with its scale and zero point."""
        name = node.input[index]
        ir = self.int_tensor(node, name)
        zp, _ = self.zero_point(node, zp_index, self.unsigned[name])
        return _Act(ir, self.scalar_scale(node, scale_index), zp)

    def out(self, node: onnx.NodeProto, output: str, scale_index: int, zp_index: int) -> _Out:
        zp, unsigned = self.zero_point(node, zp_index)
        return _Out(output, self.scalar_scale(node, scale_index), zp, unsigned)

    def defer_alias(self, out: _Out, alias: str) -> None:
        """Once a rule has written ``out``'s int tensor, record float tensor ``alias`` as DequantizeLinear of it
        (:meth:`settle`)."""
        self.deferred[out.name] = (alias, out.scale, out.zp)

    def settle(self) -> None:
        """Record the aliases :meth:`defer_alias` asked for, of the int tensors written since."""
        for out in [o for o in self.deferred if o in self.ints]:
            alias, scale, zp = self.deferred.pop(out)
            self.floats[alias] = _Act(self.ints[out], scale, zp)

    def int_tensor(self, node: onnx.NodeProto, name: str) -> str:
        return self._known(self.ints, node, name, "is not a quantized activation the lab computed")

    def alias(self, node: onnx.NodeProto, name: str) -> _Act:
        return self._known(self.floats, node, name, "is a float value that is not DequantizeLinear of a quantized "
                                                    "activation")

    def _known(self, table: dict[str, T], node: onnx.NodeProto, name: str, otherwise: str) -> T:
        """``table[name]``; :class:`_Refused` when ``name`` comes from a refused node (that node's refusal is the
        one reported), else an UnsupportedOperatorError saying that input ``name`` ``otherwise``."""
        if name in self.refused:
            raise _Refused
        if name not in table:
            raise UnsupportedOperatorError(node.op_type, node.name, f"its input {name!r} {otherwise}")
        return table[name]

    def real_constant(self, name: str) -> np.ndarray | None:
        """The values of constant ``name`` (float64 arrays of float32 values): DequantizeLinear of an integer
        initializer (its integers times its scale, rounded to float32 as ONNX's DequantizeLinear computes it: a
        Pow's exponent ``255 * fl32(2 / 255)`` is 2.0, not 2.000000118, whose power of a negative value is NaN), or
        a float initializer; None for anything else."""
        if name in self.weights:
            values, scale, _ = self.weights[name]
            return (values.astype(np.float32) * np.asarray(scale, np.float32)).astype(np.float64)
        if name in self.consts and self.consts[name].dtype.kind == "f":
            return self.consts[name].astype(np.float64)
        return None

    def weight(self, node: onnx.NodeProto, name: str) -> tuple[np.ndarray, np.ndarray, int]:
        if name not in self.weights:
            raise UnsupportedOperatorError(node.op_type, node.name, f"its weight {name!r} is not DequantizeLinear "
                                           f"of an integer constant")
        return self.weights[name]

    # ---- building ---------------------------------------------------------------------------------------------
    def tensor(self, base: str, shape: tuple[int, ...], scale: float) -> str:
        name = self.graph.unique_name(base)
        self.graph.add_tensor(name, shape, "int8", scale)
        return name

    def emit(self, op: str, base: str, inputs: list[str], output: str, **attrs: Any) -> Node:
        return self.graph.add_node(op, self.graph.unique_name(base or op, node=True), inputs, [output], **attrs)

    def emit_out(self, op: str, base: str, inputs: list[str], out: _Out, shape: tuple[int, ...], /,
                 **attrs: Any) -> str:
        """Emit a node writing ``out`` (an ONNX int tensor) of ``shape``; returns the IR tensor name. ``shape`` is
        positional only: a Reshape's attributes hold a ``shape`` of their own."""
        name = self.tensor(out.name, shape, out.scale)
        self.emit(op, base, inputs, name, **attrs)
        self.ints[out.name] = name
        self.unsigned[out.name] = out.unsigned
        return name

    def constant(self, base: str, value: np.ndarray) -> str:
        name = self.graph.unique_name(base)
        self.graph.add_constant(name, value)
        return name

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.shape(name)


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        value = onnx.helper.get_attribute_value(a)
        out[a.name] = value.decode() if isinstance(value, bytes) else value
    return out


# ---- emitters shared by both formats ------------------------------------------------------------------------------
def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy's broadcast of ``shapes``, or None when they do not broadcast."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _rescale(imp: _Importer, base: str, src: _Act, out: _Out, shape: tuple[int, ...]) -> str:
    """``QAffine`` of one input: ``round((x - zx) * sx / sy) + zy`` (half up), clipped to ``out``'s range."""
    return _affine(imp, base, [src], out, shape)


def _wide_multipliers(ratios: list[float], max_shift: int) -> tuple[list[int], int]:
    """Integer multipliers below ``2**AFFINE_BITS`` and one shift (at most ``max_shift``) with ``M / 2**S`` each real
    ratio (the largest sets S): the CPU's int64 requantization of ``QAffine`` and of a ``QMatMul`` with zero
    points."""
    shift = int(np.clip(np.floor(np.log2((2**AFFINE_BITS - 1) / max(max(ratios), 2.0**-40))), 0, max_shift))
    return [int(round(r * 2.0**shift)) for r in ratios], shift


def _affine(imp: _Importer, base: str, srcs: list[_Act], out: _Out, shape: tuple[int, ...]) -> str:
    ratios = [s.scale / out.scale for s in srcs]
    mults, shift = _wide_multipliers(ratios, 40)
    half = (1 << (shift - 1)) if shift else 0
    offset = (out.zp << shift) + half - sum(m * s.zp for m, s in zip(mults, srcs))
    return imp.emit_out("QAffine", base, [s.name for s in srcs], out, shape, multipliers=tuple(mults), offset=offset,
                        shift=shift, lo=out.lo, hi=out.hi, ratios=tuple(ratios), zero_points=tuple(
                            [s.zp for s in srcs] + [out.zp]))


def _product_bound(w: np.ndarray) -> np.ndarray:
    """Per output channel, the largest ``|sum(x * w)|`` of any int8 input ``x``."""
    flat = w.reshape(w.shape[0], -1).astype(np.int64)
    pos, neg = np.where(flat > 0, flat, 0).sum(axis=1), np.where(flat < 0, flat, 0).sum(axis=1)
    return np.maximum(pos * INT8_MAX + neg * INT8_MIN, -(pos * INT8_MIN + neg * INT8_MAX))


def _linear(imp: _Importer, node: onnx.NodeProto, x: _Act, w: np.ndarray, sw: np.ndarray, bias: np.ndarray,
            out: _Out, conv: dict[str, Any] | None) -> None:
    """QConv2d (``conv``: strides, pads, groups) or QDense of ``x``: int weights ``w`` [O, ...] (zero point
    removed), weight scales ``sw`` [O], ``bias`` [O] in accumulator units (scale ``sx * sw``)."""
    o = w.shape[0]
    if w.min() < INT8_MIN or w.max() > INT8_MAX:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its weights minus their zero point span "
                                       f"[{w.min()}, {w.max()}], outside int8")
    src, n_shape = x.name, imp.shape(x.name)
    if conv is not None and x.zp != 0 and any(conv["pads"]):
        top, left, bottom, right = conv["pads"]
        n, c, h, wd = n_shape
        n_shape = (n, c, h + top + bottom, wd + left + right)
        padded = imp.tensor(f"{x.name}_pad", n_shape, x.scale)
        imp.emit("Pad", f"{node.name}_pad", [src], padded, pads=(0, 0, top, left, 0, 0, bottom, right), value=x.zp)
        src, conv = padded, dict(conv, pads=(0, 0, 0, 0))
    bad = (~np.isfinite(bias) | (np.abs(np.nan_to_num(bias)) > INT32_MAX)).reshape(-1)
    if bad.any():
        worst = bias.reshape(-1)[bad][0]
        raise UnsupportedOperatorError(node.op_type, node.name, f"its bias holds {worst:g} in accumulator units "
                                       f"(input scale x weight scale); a bias must be finite and fit int32")
    b = np.rint(bias).astype(np.int64) - x.zp * w.reshape(o, -1).sum(axis=1)
    m = x.scale * sw / out.scale
    products = _product_bound(w)
    bound = products + np.abs(b) + np.ceil(abs(out.zp) / m).astype(np.int64) + 2
    if (sw == sw[0]).all():
        bound = np.full(o, bound.max())                    # per-tensor weights: one (M, S) for every channel
    mult, shift = choose_requant(m, bound, rounding=True)
    half = np.left_shift(np.int64(1), np.maximum(shift - 1, 0))
    offset = np.where(shift > 0, np.floor_divide((2 * out.zp + 1) * half, mult), np.rint(out.zp / mult))
    bq = b + offset.astype(np.int64)
    if ((products + np.abs(bq)) * mult > INT32_MAX).any():
        raise UnsupportedOperatorError(node.op_type, node.name, "its accumulator with the zero points folded in "
                                       "cannot be requantized inside int32")
    wname = imp.constant(f"{node.name or out.name}_wq", w.astype(np.int8))
    bname = imp.constant(f"{node.name or out.name}_bq", bq.astype(np.int32))
    kind = "none" if (out.lo, out.hi) == (INT8_MIN, INT8_MAX) else "clip"
    attrs: dict[str, Any] = dict(requant=Requant(mult, shift, out.lo, out.hi), w_scale=sw.astype(np.float32),
                                 activation=kind)
    if conv is not None:
        n, _, h, wd = n_shape
        oh, ow = _output_hw(h, wd, w.shape[2:], conv["strides"], conv["pads"])
        attrs.update(strides=tuple(conv["strides"]), pads=tuple(conv["pads"]), groups=int(conv["groups"]))
        imp.emit_out("QConv2d", node.name, [src, wname, bname], out, (n, o, oh, ow), **attrs)
    else:
        imp.emit_out("QDense", node.name, [src, wname, bname], out, (n_shape[0], o), **attrs)


def _output_hw(h: int, w: int, kernel: tuple[int, ...], strides: tuple[int, ...],
               pads: tuple[int, ...]) -> tuple[int, int]:
    return conv_output_hw(h, w, (kernel[0], kernel[1]), (strides[0], strides[1]), (pads[0], pads[1], pads[2], pads[3]))


def _bias_units(imp: _Importer, node: onnx.NodeProto, name: str | None, o: int, sx: float,
                sw: np.ndarray) -> np.ndarray:
    """A bias in accumulator units (scale ``sx * sw``): int32 as given (QOperator), or a DequantizeLinear'd or float
    constant converted (QDQ)."""
    if not name:
        return np.zeros(o)
    if name in imp.weights:
        values, scale, _ = imp.weights[name]
        real = values.astype(np.float64) * scale
    elif name in imp.consts and imp.consts[name].dtype.kind in "iu":
        if imp.consts[name].dtype != np.int32:
            raise UnsupportedOperatorError(node.op_type, node.name, f"its bias {name!r} is "
                                           f"{imp.consts[name].dtype}; a quantized operator's bias is int32")
        return imp.consts[name].astype(np.float64).reshape(o)      # QOperator: int32 at scale sx * sw already
    elif name in imp.consts:
        real = imp.consts[name].astype(np.float64)
    else:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its bias {name!r} is not a constant")
    return real.reshape(o) / (sx * sw)


def _channel_scale(scale: np.ndarray, o: int, axis: int, want_axis: int, node: onnx.NodeProto) -> np.ndarray:
    scale = np.asarray(scale, np.float64).reshape(-1)
    if scale.size == 1:
        return np.full(o, scale[0])
    if scale.size != o or axis != want_axis:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its weight scale has {scale.size} values along "
                                       f"axis {axis}; the lab takes one per tensor or one per output channel")
    return scale


def _conv_attrs(node: onnx.NodeProto, kernel: tuple[int, ...], group: int = 1) -> dict[str, Any]:
    """The strides, pads (top, left, bottom, right) and groups of a 2D ``node``, or of a 1D one (``kernel`` of one
    size) as the 2D convolution over ``[N, C, 1, L]`` that computes it."""
    a = _attrs(node)
    rank = len(kernel)
    if rank not in (1, 2):
        raise UnsupportedOperatorError(node.op_type, node.name, f"it has a {rank}D kernel; the lab takes 1D and 2D")
    dilations = [int(d) for d in a.get("dilations", [1] * rank)]
    if len(dilations) != rank or min(dilations) < 1:
        raise UnsupportedOperatorError(node.op_type, node.name, f"dilations={dilations} for its {rank}D kernel")
    spread = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if math.prod(spread) > SPREAD_LIMIT * math.prod(kernel):
        raise UnsupportedOperatorError(node.op_type, node.name, f"dilations={dilations} of a "
                                       f"{'x'.join(map(str, kernel))} kernel: its kernel with the zeros would cost "
                                       f"{math.prod(spread) / math.prod(kernel):.1f} times the MACs (the phase form "
                                       f"takes a QDQ Conv of strides 1)")
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"auto_pad={a['auto_pad']} (give explicit pads)")
    pads = tuple(int(p) for p in a.get("pads", [0] * (2 * rank)))
    strides = tuple(int(s) for s in a.get("strides", [1] * rank))
    if len(pads) != 2 * rank or len(strides) != rank:
        raise UnsupportedOperatorError(node.op_type, node.name, f"pads={list(pads)} and strides={list(strides)} do "
                                       f"not fit its {rank}D kernel")
    if rank == 1:
        pads, strides, dilations = (0, pads[0], 0, pads[1]), (1, strides[0]), [1, dilations[0]]
    return {"strides": strides, "pads": pads, "groups": int(a.get("group", group)), "dilations": tuple(dilations)}


def _conv(imp: _Importer, node: onnx.NodeProto, x: _Act, w_name: str, w: np.ndarray, wz: np.ndarray,
          w_scale: np.ndarray, w_axis: int, bias: str | None, out: _Out) -> None:
    """QConv2d of ``x`` by the integer weights ``w`` ``[O, C / group, kh, kw]`` (zero points ``wz``); a 1D
    convolution (``x`` ``[N, C, L]``, ``w`` ``[O, C / group, k]``: an audio model's stem) runs as the 2D one over
    ``[N, C, 1, L]`` between two Reshapes, which move integers only."""
    o = w.shape[0]
    conv = _conv_attrs(node, tuple(w.shape[2:]))
    shape = imp.shape(x.name)
    if len(shape) != w.ndim:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its input {list(shape)} and weights "
                                       f"{list(w.shape)} differ in rank")
    one_d = w.ndim == 3
    if one_d:
        flat = imp.tensor(f"{x.name}_2d", (shape[0], shape[1], 1, shape[2]), x.scale)
        imp.emit("Reshape", f"{node.name}_2d", [x.name], flat, shape=(shape[0], shape[1], 1, shape[2]))
        x, w = _Act(flat, x.scale, x.zp), w.reshape(o, w.shape[1], 1, w.shape[2])
    wq = w.astype(np.int64) - np.asarray(wz, np.int64).reshape((-1,) + (1,) * (w.ndim - 1))
    dilations = conv.pop("dilations")
    if any(d != 1 for d in dilations):      # the kernel with d - 1 zero taps between its own: the same sums
        spread = np.zeros((*wq.shape[:2], *((k - 1) * d + 1 for k, d in zip(wq.shape[2:], dilations))), np.int64)
        spread[(slice(None), slice(None), *(slice(None, None, d) for d in dilations))] = wq
        wq = spread
    sw = _channel_scale(w_scale, o, w_axis, 0, node)
    c, g = imp.shape(x.name)[1], conv["groups"]
    if g < 1 or o % g or c != w.shape[1] * g:
        raise UnsupportedOperatorError(node.op_type, node.name, f"group={g} does not fit its {c} input channels and "
                                       f"weights of shape {list(w.shape)}")
    _linear(imp, node, x, wq, sw, _bias_units(imp, node, bias, o, x.scale, sw), out, conv)
    if one_d:
        n, _, _, length = imp.shape(imp.ints[out.name])
        back = imp.tensor(f"{out.name}_1d", (n, o, length), out.scale)
        imp.emit("Reshape", f"{node.name}_1d", [imp.ints[out.name]], back, shape=(n, o, length))
        imp.ints[out.name] = back


def _dense(imp: _Importer, node: onnx.NodeProto, x: _Act, w: np.ndarray, wz: np.ndarray, w_scale: np.ndarray,
           w_axis: int, transposed: bool, bias: str | None, out: _Out) -> None:
    """``x @ w`` (``w`` [K, O]) or ``x @ w.T`` (``transposed``: [O, K]) as QDense. An input of rank 3 or more
    (a transformer's ``[batch, tokens, features]``, a MatMul's only) is a Reshape to ``[rows, K]``, the QDense, and a
    Reshape back to ``[..., O]``: zero-point invariant."""
    shape = imp.shape(x.name)
    if len(shape) < 2 or w.ndim != 2 or (len(shape) > 2 and node.op_type not in ("MatMul", "QLinearMatMul")):
        raise UnsupportedOperatorError(node.op_type, node.name, f"it multiplies a {shape} input by {w.shape} "
                                       f"weights; the lab takes a [..., K] input and [K, O] weights")
    wz = np.asarray(wz, np.int64).reshape(-1)
    wq = w.astype(np.int64) - (wz.reshape(1, -1) if not transposed and wz.size > 1 else wz.reshape(-1, 1))
    wq = wq if transposed else wq.T
    o = wq.shape[0]
    sw = _channel_scale(w_scale, o, w_axis, 0 if transposed else 1, node)
    lead = shape[:-1]
    if len(shape) > 2:
        rows = (int(np.prod(lead, dtype=np.int64)), shape[-1])
        flat = imp.tensor(f"{x.name}_rows", rows, x.scale)
        imp.emit("Reshape", f"{node.name}_rows", [x.name], flat, shape=rows)
        x = _Act(flat, x.scale, x.zp)
    _linear(imp, node, x, wq, sw, _bias_units(imp, node, bias, o, x.scale, sw), out, None)
    if len(shape) > 2:
        back = imp.tensor(f"{out.name}_unrows", (*lead, o), out.scale)
        imp.emit("Reshape", f"{node.name}_unrows", [imp.ints[out.name]], back, shape=(*lead, o))
        imp.ints[out.name] = back


def _gap(imp: _Importer, node: onnx.NodeProto, x: _Act, out: _Out) -> None:
    n, c, h, w = imp.shape(x.name)
    if (x.scale, x.zp) == (out.scale, out.zp) and (out.lo, out.hi) == (INT8_MIN, INT8_MAX):
        imp.emit_out("GlobalAvgPool", node.name, [x.name], out, (n, c, 1, 1))
        return
    # a kernel of k, not 1: the rounding and zero-point offset is added in accumulator units of M / 2**S output
    # steps (about x_scale / (H W y_scale): nearly a whole step for a pool to a similar scale), then 1/k of that, at
    # most 1/64 step; a larger k than needed would cost the multiplier bits (the accumulator's bound grows k times)
    k = int(np.clip(np.ceil(64 * x.scale / (h * w * out.scale)), 1, INT8_MAX))
    _linear(imp, node, x, np.full((c, 1, h, w), k, np.int64), np.full(c, 1.0 / (h * w * k)), np.zeros(c), out,
            {"strides": (1, 1), "pads": (0, 0, 0, 0), "groups": c})


def _avgpool(imp: _Importer, node: onnx.NodeProto, x: _Act, out: _Out) -> None:
    a = _attrs(node)
    kernel = tuple(int(k) for k in a.get("kernel_shape", []))
    if len(kernel) != 2 or a.get("ceil_mode", 0) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or \
            a.get("channels_last", 0) or any(d != 1 for d in a.get("dilations", [1, 1])):
        raise UnsupportedOperatorError(node.op_type, node.name, "the lab takes 2D NCHW average pools without "
                                       "ceil_mode, auto_pad or dilations")
    strides = tuple(int(s) for s in a.get("strides", [1, 1]))
    pads = tuple(int(p) for p in a.get("pads", [0, 0, 0, 0]))
    count_pad = bool(a.get("count_include_pad", 0))
    src, (n, c, h, w) = x.name, imp.shape(x.name)
    if count_pad and any(pads) and x.zp != 0:
        top, left, bottom, right = pads
        h, w = h + top + bottom, w + left + right
        src = imp.tensor(f"{x.name}_pad", (n, c, h, w), x.scale)
        imp.emit("Pad", f"{node.name}_pad", [x.name], src, pads=(0, 0, top, left, 0, 0, bottom, right), value=x.zp)
        pads = (0, 0, 0, 0)
    oh, ow = _output_hw(h, w, kernel, strides, pads)
    same = (x.scale, x.zp) == (out.scale, out.zp)
    mid = _Out(out.name if same else f"{out.name}_avg", x.scale, x.zp, out.unsigned, out.lo if same else INT8_MIN,
               out.hi if same else INT8_MAX)
    pooled = imp.emit_out("AvgPool", node.name, [src], mid, (n, c, oh, ow), kernel=kernel, strides=strides,
                          pads=pads, count_include_pad=count_pad)
    if not same:
        _rescale(imp, f"{node.name}_rescale", _Act(pooled, x.scale, x.zp), out, (n, c, oh, ow))
    elif (out.lo, out.hi) != (INT8_MIN, INT8_MAX):
        _clip_to(imp, node.name, out)


def _clip_to(imp: _Importer, base: str, out: _Out) -> None:
    """A QClip of ``out``'s tensor to its range (the op wrote the full range)."""
    src = imp.ints[out.name]
    imp.emit_out("QClip", f"{base}_clip", [src], _Out(f"{out.name}_clip", out.scale, out.zp, out.unsigned),
                 imp.shape(src), lo=out.lo, hi=out.hi)
    imp.ints[out.name] = imp.ints.pop(f"{out.name}_clip")


def _add(imp: _Importer, node: onnx.NodeProto, a: _Act, b: _Act, out: _Out) -> None:
    if imp.shape(a.name) != imp.shape(b.name):
        raise UnsupportedOperatorError(node.op_type, node.name, f"it adds shapes {imp.shape(a.name)} and "
                                       f"{imp.shape(b.name)}; the lab adds equal shapes")
    _affine(imp, node.name, [a, b], out, imp.shape(a.name))


def _concat(imp: _Importer, node: onnx.NodeProto, xs: list[_Act], axis: int, out: _Out) -> None:
    shapes = [imp.shape(x.name) for x in xs]
    axis = axis % len(shapes[0])
    names = []
    for k, x in enumerate(xs):
        if (x.scale, x.zp) == (out.scale, out.zp):
            names.append(x.name)
        else:
            tmp = _Out(f"{out.name}_in{k}", out.scale, out.zp, out.unsigned)
            names.append(_rescale(imp, f"{node.name}_in{k}", x, tmp, shapes[k]))
    shape = list(shapes[0])
    shape[axis] = sum(s[axis] for s in shapes)
    imp.emit_out("QConcat", node.name, names, _Out(out.name, out.scale, out.zp, out.unsigned), tuple(shape),
                 axis=axis, multipliers=tuple([1] * len(xs)), shifts=tuple([0] * len(xs)))
    if (out.lo, out.hi) != (INT8_MIN, INT8_MAX):
        _clip_to(imp, node.name, out)


def _sigmoid(imp: _Importer, node: onnx.NodeProto, x: _Act, out: _Out) -> None:
    table = prequant_tables.function_table(lambda real: 1.0 / (1.0 + np.exp(-real)), x.scale, x.zp, out.scale,
                                           out.zp, out.lo, out.hi)
    imp.emit_out("QLut", node.name, [x.name], out, imp.shape(x.name), table=table, function="Sigmoid")


def _activation(op: str) -> Callable[[_Importer, onnx.NodeProto, _Act, _Out], None]:
    """An element-wise function of :data:`.prequant_tables.UNARY_DEFAULTS` (LeakyRelu, Tanh, HardSwish, Gelu...) as
    a QLut: each int8 input dequantized at the file's scale, the function in float64 (the node's attributes, ONNX's
    defaults), rounded to the output's scale and zero point, clipped to its range."""
    def fn(imp: _Importer, node: onnx.NodeProto, x: _Act, out: _Out) -> None:
        table = prequant_tables.unary_table(op, _attrs(node), x.scale, x.zp, out.scale, out.zp, out.lo, out.hi)
        imp.emit_out("QLut", node.name, [x.name], out, imp.shape(x.name), table=table, function=op)
    return fn


# ---- QDQ: float operators between DequantizeLinear and QuantizeLinear ---------------------------------------------
def _quantized_output(imp: _Importer, node: onnx.NodeProto) -> _Out:
    """The QuantizeLinear a float operator's output feeds (through Relu/Clip at most), as an :class:`_Out` with the
    clip of the activation; those nodes are then skipped. A result read only by QuantizeLinear nodes of one scale and
    zero point, directly or through moves, is quantized once (:func:`_shared_quantization`)."""
    tensor = node.output[0]
    acts: list[onnx.NodeProto] = []
    while True:
        users = imp.consumers.get(tensor, [])
        if tensor in imp.outputs or len(users) != 1:
            shared = _shared_quantization(imp, node) if not acts else None
            if shared is not None:
                return shared
            raise UnsupportedOperatorError(node.op_type, node.name, f"its float result {tensor!r} is not quantized "
                                           f"(it must feed exactly one QuantizeLinear, through Relu/Clip at most)")
        user = users[0]
        if user.op_type in ("Relu", "Clip"):
            acts.append(user)
            tensor = user.output[0]
            continue
        if user.op_type != "QuantizeLinear":
            shared = _shared_quantization(imp, node) if not acts else None
            if shared is not None:
                return shared
            raise UnsupportedOperatorError(node.op_type, node.name, f"its float result {tensor!r} feeds "
                                           f"{user.op_type}, not QuantizeLinear")
        break
    out = imp.out(user, user.output[0], 1, 2)
    lo, hi = INT8_MIN, INT8_MAX
    for act in acts:
        a_lo, a_hi = _activation_range(imp, act, out.scale, out.zp)
        lo, hi = max(lo, a_lo), min(hi, a_hi)
        imp.skip.add(id(act))
    imp.skip.add(id(user))
    return _Out(out.name, out.scale, out.zp, out.unsigned, lo, max(lo, hi))


_FLOAT_MOVES = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
"""Float operators that move elements without changing them: quantizing before or after them is the same."""


def _shared_quantization(imp: _Importer, node: onnx.NodeProto) -> _Out | None:
    """When ``node``'s float result reaches only QuantizeLinear nodes, all of one scale and zero point, directly or
    through :data:`_FLOAT_MOVES` (a QOperator file's LayerNorm read by three QLinearMatMuls, or transposed first):
    the output at those parameters, under a name of its own, with the float result recorded as its alias
    (:meth:`_Importer.defer_alias`). The moves and QuantizeLinear nodes then import as usual, each QuantizeLinear as
    the identity. Else None."""
    todo, params = [node.output[0]], set()
    while todo:
        tensor = todo.pop()
        users = imp.consumers.get(tensor, [])
        if tensor in imp.outputs or not users:
            return None
        for user in users:
            if user.op_type == "QuantizeLinear" and user.input[0] == tensor:
                try:
                    out = imp.out(user, user.output[0], 1, 2)
                except UnsupportedOperatorError:
                    return None
                params.add((out.scale, out.zp, out.unsigned))
            elif user.op_type in _FLOAT_MOVES and user.input[0] == tensor:
                todo.extend(o for o in user.output if o)
            else:
                return None
    if len(params) != 1:
        return None
    scale, zp, unsigned = params.pop()
    out = _Out(f"{node.output[0]}_quantized_once", scale, zp, unsigned)
    imp.defer_alias(out, node.output[0])
    return out


def _activation_range(imp: _Importer, node: onnx.NodeProto, scale: float, zp: int) -> tuple[int, int]:
    """The int8 range (at ``scale``, ``zp``) a Relu or Clip leaves."""
    if node.op_type == "Relu":
        return zp, INT8_MAX
    a = _attrs(node)
    lo_f, hi_f = a.get("min"), a.get("max")
    if len(node.input) > 1 and node.input[1]:
        lo_f = float(imp.const(node, 1, "min").reshape(()))
    if len(node.input) > 2 and node.input[2]:
        hi_f = float(imp.const(node, 2, "max").reshape(()))
    lo = INT8_MIN if lo_f is None else int(np.clip(np.rint(lo_f / scale) + zp, INT8_MIN, INT8_MAX))
    hi = INT8_MAX if hi_f is None else int(np.clip(np.rint(hi_f / scale) + zp, INT8_MIN, INT8_MAX))
    return lo, hi


def _qdq_conv(imp: _Importer, node: onnx.NodeProto) -> None:
    x = imp.alias(node, node.input[0])
    w, scale, axis = imp.weight(node, node.input[1])
    _conv(imp, node, x, node.input[1], w, np.zeros(1), scale, axis, node.input[2] if len(node.input) > 2 else None,
          _quantized_output(imp, node))


def _qdq_gemm(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        raise UnsupportedOperatorError(node.op_type, node.name, "the lab takes Gemm with transA=0, alpha=beta=1")
    x = imp.alias(node, node.input[0])
    w, scale, axis = imp.weight(node, node.input[1])
    bias = node.input[2] if len(node.input) > 2 else None
    _dense(imp, node, x, w, np.zeros(1), scale, axis, bool(a.get("transB", 0)), bias or None,
           _quantized_output(imp, node))


def _qdq_matmul(imp: _Importer, node: onnx.NodeProto) -> None:
    x = imp.alias(node, node.input[0])
    if node.input[1] in imp.floats or node.input[1] in imp.refused:
        _matmul(imp, node, x, imp.alias(node, node.input[1]), _quantized_output(imp, node))
        return
    w, scale, axis = imp.weight(node, node.input[1])
    fused = _bias_add(imp, node, int(w.shape[-1]))
    if fused is not None:                       # torch's Linear: Add(bias, MatMul(x, W^T)), then QuantizeLinear
        add, bias, out = fused
        imp.skip.add(id(add))
        _dense(imp, node, x, w, np.zeros(1), scale, axis, False, bias, out)
        return
    _dense(imp, node, x, w, np.zeros(1), scale, axis, False, None, _quantized_output(imp, node))


def _bias_add(imp: _Importer, node: onnx.NodeProto, o: int) -> tuple[onnx.NodeProto, str, _Out] | None:
    """The ``Add`` of a constant bias of ``o`` values (DequantizeLinear of int32, torch's, or float) that alone reads
    a MatMul's float result, itself quantized (:func:`_quantized_output`): ``(add, bias, out)``, for the MatMul to
    take the bias as a Gemm does; None for any other reader."""
    users = imp.consumers.get(node.output[0], [])
    if node.output[0] in imp.outputs or len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
        return None
    add = users[0]
    bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
    if bias == node.output[0]:
        return None
    if bias not in imp.weights and bias not in imp.consts:  # its DequantizeLinear written after the MatMul: read now
        later = next((n for n in imp.model.graph.node if bias in n.output), None)
        if later is not None and later.op_type == "DequantizeLinear" and id(later) not in imp.skip and \
                all(not t or t in imp.consts for t in later.input):
            _dequantize_linear(imp, later)
            imp.skip.add(id(later))
    value = imp.weights[bias][0] if bias in imp.weights else imp.consts.get(bias)
    if value is None or (bias not in imp.weights and value.dtype.kind != "f") or value.size != o or \
            (value.ndim and value.shape[-1] != o):
        return None
    try:
        return add, bias, _quantized_output(imp, add)
    except UnsupportedOperatorError:
        return None


def _matmul(imp: _Importer, node: onnx.NodeProto, a: _Act, b: _Act, out: _Out) -> None:
    """MatMul of two quantized activations (attention's ``Q K^T`` and ``P V``; any rank of at least 2, leading axes
    broadcast) as ``QMatMul``: ``clip(((((a - za) @ (b - zb)) * M + r) >> S) + zy)`` exact in int64, with ``M / 2**S``
    the real ratio ``sa * sb / sy`` to ``2**-AFFINE_BITS`` (round half up). With every zero point 0 the multiplier
    comes from :func:`.quantize.choose_requant` (``acc * M + r`` inside int32) and the accelerator runs it; with
    zero points it runs on the CPU."""
    sa, sb = imp.shape(a.name), imp.shape(b.name)
    if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
        raise UnsupportedOperatorError(node.op_type, node.name, f"it multiplies shapes {sa} and {sb}; the lab takes "
                                       f"[..., M, K] by [..., K, N]")
    lead = _broadcast(sa[:-2], sb[:-2])
    if lead is None:
        raise UnsupportedOperatorError(node.op_type, node.name, f"the leading axes of {sa} and {sb} do not "
                                       f"broadcast")
    ratio = a.scale * b.scale / out.scale
    zero_points = (a.zp, b.zp, out.zp)
    if any(zero_points):
        (mult,), shift = _wide_multipliers([ratio], 62)
        attrs: dict[str, Any] = {"zero_points": zero_points}
    else:
        m, s = choose_requant(np.array([ratio]), np.array([sa[-1] * 128 * 128]), rounding=True)
        mult, shift, attrs = int(m[0]), int(s[0]), {}
    imp.emit_out("QMatMul", node.name, [a.name, b.name], out, (*lead, sa[-2], sb[-1]), multiplier=mult,
                 shift=shift, **attrs)
    if (out.lo, out.hi) != (INT8_MIN, INT8_MAX):
        _clip_to(imp, node.name, out)


def _qdq_unary(fn: Callable[[_Importer, onnx.NodeProto, _Act, _Out], None]) -> Callable[[_Importer,
                                                                                           onnx.NodeProto], None]:
    def rule(imp: _Importer, node: onnx.NodeProto) -> None:
        fn(imp, node, imp.alias(node, node.input[0]), _quantized_output(imp, node))
    return rule


def _qdq_concat(imp: _Importer, node: onnx.NodeProto) -> None:
    xs = [_dequantized_operand(imp, name) or imp.alias(node, name)   # ViT's class token: a constant first
          for name in node.input]
    _concat(imp, node, xs, int(_attrs(node)["axis"]), _quantized_output(imp, node))


def _operand(imp: _Importer, node: onnx.NodeProto, name: str) -> _Act | float:
    """An operand of an element-wise operator of two inputs: a quantized activation (DequantizeLinear of one), or a
    constant of one value (float, or DequantizeLinear of an integer)."""
    real = imp.real_constant(name)
    if real is not None and real.size == 1:
        return float(real.reshape(-1)[0])
    if name in imp.floats or name in imp.refused:
        return imp.alias(node, name)
    constant = _dequantized_operand(imp, name)
    if constant is not None:
        return constant
    raise UnsupportedOperatorError(node.op_type, node.name, f"its input {name!r} is neither DequantizeLinear of a "
                                   f"quantized activation, nor a constant of one value, nor DequantizeLinear of an "
                                   f"integer constant (per tensor)")


def _dequantized_operand(imp: _Importer, name: str) -> _Act | None:
    """DequantizeLinear ``name`` of an integer constant quantized per tensor, as :func:`_constant_operand`; None for
    anything else."""
    if name not in imp.weights or imp.weights[name][1].size != 1:
        return None
    values, scale, _ = imp.weights[name]
    return _constant_operand(imp, name, values, float(scale.reshape(-1)[0]))


def _constant_operand(imp: _Importer, name: str, values: np.ndarray, scale: float) -> _Act:
    """An integer constant of several values read per tensor, ``values`` its integers minus their zero point (a
    bias a QDQ file adds after its MatMul, quantized as the Add's input; DequantizeLinear's ``scale``): an IR int8
    constant and an int8 zero point that hold ``values`` exactly, ``values + z`` in ``[-128, 127]``."""
    low, high = int(values.min()), int(values.max())
    zp = 0 if low >= INT8_MIN and high <= INT8_MAX else INT8_MIN - low
    if high + zp > INT8_MAX:
        raise UnsupportedOperatorError("DequantizeLinear", name, f"its integers minus their zero point span "
                                       f"[{low}, {high}], more than 256 values")
    const = imp.constant(f"{name}_int8", (values + zp).astype(np.int8))
    return _Act(const, scale, zp)


def _binary(imp: _Importer, node: onnx.NodeProto, a: _Act | float, b: _Act | float, out: _Out) -> None:
    """Add, Sub, Mul or Div of two quantized activations (broadcast as numpy does) or of one and a constant, as a
    table (:mod:`.prequant_tables`): ``QLut2`` of the pair; ``QLut`` when one operand is a constant, or a ``QLut``
    of the other (SiLU's ``x * sigmoid(x)``: one lookup of ``x``). An Add of two activations of one shape stays the
    exact ``QAffine`` (:func:`_add`), which may become the accelerator's QAdd."""
    op = node.op_type.removeprefix("QLinear")
    if isinstance(a, float) and isinstance(b, float):
        raise UnsupportedOperatorError(node.op_type, node.name, "both inputs are constants")
    if isinstance(a, float) or isinstance(b, float):
        x = b if isinstance(a, float) else a
        assert isinstance(x, _Act)
        const = a if isinstance(a, float) else b
        assert isinstance(const, float)
        table = prequant_tables.constant_table(op, (x.scale, x.zp), const, isinstance(a, float), out.scale,
                                               out.zp, out.lo, out.hi)
        imp.emit_out("QLut", node.name, [x.name], out, imp.shape(x.name), table=table, function=op)
        return
    sa, sb = imp.shape(a.name), imp.shape(b.name)
    if op == "Add" and sa == sb:
        _add(imp, node, a, b, out)
        return
    shape = _broadcast(sa, sb)
    if shape is None:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its inputs' shapes {sa} and {sb} do not "
                                       f"broadcast")
    pair = prequant_tables.binary_table(op, (a.scale, a.zp), (b.scale, b.zp), out.scale, out.zp, out.lo, out.hi)
    for x, other, inner_first in ((a, b, False), (b, a, True)):
        prod = imp.graph.producer(other.name)
        if prod is not None and prod.op == "QLut" and prod.inputs[0] == x.name and sa == sb:
            table = prequant_tables.composed_table(pair, prod.attrs["table"], inner_first)
            imp.emit_out("QLut", node.name, [x.name], out, shape, table=table, function=op)
            return
    imp.emit_out("QLut2", node.name, [a.name, b.name], out, shape, table=pair)


def _qdq_binary(imp: _Importer, node: onnx.NodeProto) -> None:
    masks = [name for name in node.input[:2] if name in imp.unquantized]
    if node.op_type == "Add" and len(masks) == 1 and len(node.input) == 2:     # scores + a mask at scale inf
        scores = imp.alias(node, node.input[1] if node.input[0] == masks[0] else node.input[0])
        imp.masked_scores[node.output[0]] = (scores, imp.unquantized[masks[0]])
        return
    quantized_masks = [name for name in node.input[:2] if name in imp.masks]
    readers = imp.consumers.get(node.output[0], [])
    if node.op_type == "Add" and len(quantized_masks) == 1 and len(node.input) == 2 and readers and \
            all(r.op_type == "Softmax" for r in readers):       # scores + the file's mask, the sum left float
        mask = imp.alias(node, quantized_masks[0])
        scores = imp.alias(node, node.input[1] if node.input[0] == quantized_masks[0] else node.input[0])
        term = imp.graph.unique_name(f"{quantized_masks[0]}_float")
        imp.graph.add_tensor(term, imp.shape(mask.name), "float32")
        imp.emit("DequantizeZp" if mask.zp else "Dequantize", f"{node.name}_mask", [mask.name], term,
                 scale=mask.scale, **({"zero_point": mask.zp} if mask.zp else {}))
        imp.masked_scores[node.output[0]] = (scores, term)
        return
    reals = [imp.real_constant(name) for name in node.input[:2]]
    first, second = reals
    if first is not None and second is not None:          # shape arithmetic of quantized constants (GPT-2's
        with np.errstate(all="ignore"):                     # attention scale): a float constant
            imp.consts[node.output[0]] = prequant_tables.BINARY_FNS[node.op_type](first, second).astype(np.float32)
        return
    if any(name in imp.pending for name in node.input[:2]) or _feeds_elementwise(imp, node):
        scalar = [k for k, r in enumerate(reals) if r is not None and r.size == 1]
        if len(scalar) != 1:
            raise UnsupportedOperatorError(node.op_type, node.name, "it computes a float value, not quantized, of "
                                           "two non-constant inputs (the lab takes chains of one activation and "
                                           "one-value constants between DequantizeLinear and QuantizeLinear)")
        k = scalar[0]
        x, pre = _function_of(imp, node, node.input[1 - k])
        const = float(reals[k].reshape(-1)[0])                     # type: ignore[union-attr]
        own = prequant_tables.constant_function(node.op_type, const, k == 0)
        _function_result(imp, node, x, lambda real: own(pre(real)))
        return
    _binary(imp, node, _operand(imp, node, node.input[0]), _operand(imp, node, node.input[1]),
            _quantized_output(imp, node))


def _qdq_activation(op: str) -> Callable[[_Importer, onnx.NodeProto], None]:
    """The rule of an element-wise function of :data:`.prequant_tables.UNARY_DEFAULTS` in a QDQ file: a QLut of its
    quantized input (:func:`_activation`), or a link of a float chain (:func:`_function_result`)."""
    plain = _qdq_unary(_activation(op))

    def rule(imp: _Importer, node: onnx.NodeProto) -> None:
        if node.input[0] not in imp.pending and not _feeds_elementwise(imp, node):
            plain(imp, node)
            return
        x, pre = _function_of(imp, node, node.input[0])
        own = prequant_tables.unary_function(op, _attrs(node))
        _function_result(imp, node, x, lambda real: own(pre(real)))
    return rule


def _feeds_elementwise(imp: _Importer, node: onnx.NodeProto) -> bool:
    """Whether ``node``'s float result is not quantized but read by one element-wise function or by one operator
    of it and a one-value constant (exporters' GELU: ``Erf`` of ``x / sqrt(2)``, the Div left float)."""
    users = imp.consumers.get(node.output[0], [])
    if node.output[0] in imp.outputs or len(users) != 1:
        return False
    user = users[0]
    if user.op_type in prequant_tables.UNARY_DEFAULTS and user.op_type not in ("Relu", "Clip"):
        return True
    if user.op_type == "Cast":                     # to float (else its rule says so): the chain goes on
        return True
    if user.op_type == "Where":                    # a mask's: its rule reads the chain
        return user.input[0] in imp.consts and node.output[0] in user.input[1:3]
    if user.op_type not in prequant_tables.BINARY_FNS or len(user.input) != 2:
        return False
    other = user.input[1] if user.input[0] == node.output[0] else user.input[0]
    real = imp.real_constant(other)
    return real is not None and real.size == 1


def _function_of(imp: _Importer, node: onnx.NodeProto, name: str) -> tuple[_Act, Callable[[np.ndarray],
                                                                                            np.ndarray]]:
    """The quantized activation a float value is an element-wise function of, and that function (of real values)."""
    if name in imp.pending:
        return imp.pending[name]
    return imp.alias(node, name), lambda real: real


def _function_result(imp: _Importer, node: onnx.NodeProto, x: _Act, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    """``node``'s result, ``fn`` of the quantized activation ``x``: kept as a float function of ``x`` while the chain
    goes on (:func:`_feeds_elementwise`), else one ``QLut`` of ``x`` at the QuantizeLinear it feeds (the whole chain
    in float64, as onnxruntime runs it in float32)."""
    if _feeds_elementwise(imp, node):
        imp.pending[node.output[0]] = (x, fn)
        return
    out = _quantized_output(imp, node)
    table = prequant_tables.function_table(fn, x.scale, x.zp, out.scale, out.zp, out.lo, out.hi)
    imp.emit_out("QLut", node.name, [x.name], out, imp.shape(x.name), table=table, function=node.op_type)


def _qdq_softmax(imp: _Importer, node: onnx.NodeProto) -> None:
    masked = imp.masked_scores.get(imp.unquantized.get(node.input[0], node.input[0]))
    if masked is not None:                                  # Softmax(scores + a mask onnxruntime scaled by inf)
        scores, mask = masked
        _softmax(imp, node, scores, int(_attrs(node).get("axis", -1)), _quantized_output(imp, node), mask)
        return
    _softmax(imp, node, imp.alias(node, node.input[0]), int(_attrs(node).get("axis", -1)),
             _quantized_output(imp, node))


def _unquantized_mask(imp: _Importer, node: onnx.NodeProto) -> bool:
    """Whether the QuantizeLinear ``node`` is onnxruntime's quantization of an attention mask (or of scores plus
    one) at scale inf, which the import then leaves float: its calibration saw the mask's -inf. onnxruntime's own run
    of such a file dequantizes it to NaN; what the model computes is the softmax of the scores plus the mask, which
    the Softmax it reaches then takes with the mask as a runtime additive term (the mask from the integer inputs
    alone, :func:`_integer_input_regions`). Any other reader of the unquantized tensor refuses it."""
    x, scale = node.input[0], node.input[1] if len(node.input) > 1 else ""
    if scale not in imp.consts or np.isfinite(imp.consts[scale]).all() or \
            (x not in imp.input_fns and x not in imp.masked_scores):
        return False
    imp.unquantized[node.output[0]] = x
    return True


def _softmax(imp: _Importer, node: onnx.NodeProto, x: _Act, axis: int, out: _Out, mask: str | None = None) -> None:
    """Softmax of a quantized activation: the lab's float Softmax of ``x * scale`` (a softmax ignores the input's
    zero point, a constant shift of every entry), then QuantizeZp at the output's scale and zero point. ``mask``: a
    float32 term added to the scores before it (a runtime additive mask; its -inf entries mask out)."""
    shape = imp.shape(x.name)
    probs = imp.graph.unique_name(f"{out.name}_float")
    imp.graph.add_tensor(probs, shape, "float32")
    if mask is not None:
        terms = imp.graph.shape(mask)
        if _broadcast(shape, terms) != tuple(shape):
            raise UnsupportedOperatorError(node.op_type, node.name, f"its mask of shape {list(terms)} does not "
                                           f"broadcast to its scores {list(shape)}")
        unused = np.zeros((2, 1), np.float32)
        imp.emit("Softmax", node.name, [x.name, mask], probs, axis=axis % len(shape), scale=x.scale,
                 key_expand=list(terms), key_sel=unused.astype(bool), key_add=unused, key_fill=unused,
                 key_additive=True)
    else:
        imp.emit("Softmax", node.name, [x.name], probs, axis=axis % len(shape), scale=x.scale)
    imp.emit_out("QuantizeZp", f"{node.name}_quantize", [probs], out, shape, scale=out.scale, zero_point=out.zp)
    if (out.lo, out.hi) != (INT8_MIN, INT8_MAX):
        _clip_to(imp, node.name, out)


def _layer_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """LayerNormalization between DequantizeLinear and QuantizeLinear (a quantizer leaves it float): ``QLayerNorm``
    (:func:`..qops.layer_norm`, float64 of the exact integer sums), with the file's float or dequantized ``gamma``
    and ``beta``. The input's zero point cancels exactly (the row's mean is subtracted from integers); the output's
    rides in ``beta`` (``beta + zy * sy``, so ``rint(y / sy) + zy``), clipped to the output's range. A LayerNorm
    whose result is the graph's float output (QOperator files leave the last one float) is the quantized graph's
    float ``LayerNorm``: the same float64 ``y``, unrounded, as float32."""
    a = _attrs(node)
    if any(node.output[1:]):
        raise UnsupportedOperatorError(node.op_type, node.name, "its mean and inverse deviation outputs are read")
    x = imp.alias(node, node.input[0])
    shape = imp.shape(x.name)
    axis = int(a.get("axis", -1)) % len(shape)
    gamma = imp.real_constant(node.input[1]) if len(node.input) > 1 else None
    beta = imp.real_constant(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
    if gamma is None or beta is None:
        raise UnsupportedOperatorError(node.op_type, node.name, "its scale or bias is not a constant")
    row = shape[axis:]
    try:
        gamma, beta = np.broadcast_to(gamma, row).copy(), np.broadcast_to(beta, row).copy()
    except ValueError:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its scale {gamma.shape} or bias {beta.shape} does "
                                       f"not broadcast to the normalized axes {row}") from None
    epsilon = float(a.get("epsilon", 1e-5))
    y = node.output[0]
    if y in imp.outputs and not imp.consumers.get(y):     # a QOperator file's last LayerNorm: the float output
        imp.graph.add_tensor(y, shape, "float32")
        imp.emit("LayerNorm", node.name, [x.name], y, axis=axis, epsilon=epsilon, scale=x.scale, gamma=gamma,
                 beta=beta)
        imp.float_outputs.add(y)
        return
    out = _quantized_output(imp, node)
    imp.emit_out("QLayerNorm", node.name, [x.name], out, shape, axis=axis, epsilon=epsilon, scale=x.scale,
                 gamma=gamma, beta=beta + out.zp * out.scale, out_scale=out.scale)
    if (out.lo, out.hi) != (INT8_MIN, INT8_MAX):
        _clip_to(imp, node.name, out)


def _rms_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """RMSNormalization between DequantizeLinear and QuantizeLinear (opset 23's operator, or the node the completion
    fuses RMSNorm's decomposition into when a quantizer left it float, :mod:`.prequant_complete`): ``QRMSNorm``
    (:func:`..qops_gated.rms_norm`, float64 of the exact integer sum of squares) with the file's float or dequantized
    scale. No mean is subtracted, so the input's zero point does not cancel: the op subtracts it (exact, in int64)
    and adds the output's after the rounding."""
    a = _attrs(node)
    if any(node.output[1:]):
        raise UnsupportedOperatorError(node.op_type, node.name, "its inverse deviation output is read")
    x = imp.alias(node, node.input[0])
    shape = imp.shape(x.name)
    axis = int(a.get("axis", -1))
    if not -len(shape) <= axis < len(shape):
        raise UnsupportedOperatorError(node.op_type, node.name, f"axis {axis} of a rank-{len(shape)} input")
    axis %= len(shape)
    gamma = imp.real_constant(node.input[1]) if len(node.input) > 1 and node.input[1] else np.ones(1)
    if gamma is None:
        raise UnsupportedOperatorError(node.op_type, node.name, "its scale is not a constant")
    row = shape[axis:]
    try:
        gamma = np.broadcast_to(gamma, row).copy()
    except ValueError:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its scale {gamma.shape} does not broadcast to "
                                       f"the normalized axes {row}") from None
    out = _quantized_output(imp, node)
    imp.emit_out("QRMSNorm", node.name, [x.name], out, shape, axis=axis, epsilon=float(a.get("epsilon", 1e-5)),
                 scale=x.scale, gamma=gamma, out_scale=out.scale, in_zero_point=x.zp, zero_point=out.zp)
    if (out.lo, out.hi) != (INT8_MIN, INT8_MAX):
        _clip_to(imp, node.name, out)


def _l2_normalize(imp: _Importer, node: onnx.NodeProto) -> None:
    """``x / max(||x||_2, eps)`` along one axis between DequantizeLinear and QuantizeLinear (torch's
    ``F.normalize``, which quantizers leave float: Swinv2's cosine attention, a sentence encoder's last step), fused
    into the lab's ``L2Normalize`` (:func:`.onnx_fusions._match_l2_normalize`), or ONNX's ``LpNormalization`` with
    ``p = 2``: ``QL2Normalize`` at the file's scales and zero points (:func:`..qops.ql2_normalize`: the squares of
    ``x - zx`` summed exactly, the divide in float64)."""
    a = _attrs(node)
    if int(a.get("p", 2)) != 2:
        raise UnsupportedOperatorError(node.op_type, node.name, f"p={a['p']} (only the L2 norm, p=2)")
    x = imp.alias(node, node.input[0])
    shape = imp.shape(x.name)
    out = _quantized_output(imp, node)
    imp.emit_out("QL2Normalize", node.name, [x.name], out, shape, axis=int(a.get("axis", -1)) % len(shape),
                 epsilon=float(a.get("epsilon", 0.0)), scale=x.scale, out_scale=out.scale,
                 inner=bool(a.get("inner", 0)), zero_point=x.zp, out_zero_point=out.zp, lo=out.lo, hi=out.hi)


def _batch_norm(imp: _Importer, node: onnx.NodeProto) -> None:
    """A BatchNormalization the quantizer left between DequantizeLinear and QuantizeLinear (DenseNet's, after a
    Concat; its float parameters): per channel ``y = a x + b`` with ``a = gamma / sqrt(var + eps)``, ``b = beta -
    mean a``, as a depthwise 1x1 QConv2d for the accelerator: weight ``127 sign(a)`` at scale ``|a| / 127`` (so the
    bias, in accumulator units, rounds to 1/127 of an input step), bias ``b``."""
    x = imp.alias(node, node.input[0])
    shape = imp.shape(x.name)
    if len(shape) != 4 or _attrs(node).get("training_mode", 0) or len(node.output) > 1:
        raise UnsupportedOperatorError(node.op_type, node.name, "the lab takes an inference BatchNormalization of "
                                       "an NCHW activation")
    params = []
    for k, what in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "variance")):
        real = imp.real_constant(node.input[k])
        params.append((imp.const(node, k, what).astype(np.float64) if real is None else real).reshape(-1))
    gamma, beta, mean, var = params
    a = gamma / np.sqrt(var + float(_attrs(node).get("epsilon", 1e-5)))
    b = beta - mean * a
    c = shape[1]
    w = np.where(a < 0, -INT8_MAX, np.where(a > 0, INT8_MAX, 0)).astype(np.int64).reshape(c, 1, 1, 1)
    sw = np.where(a != 0, np.abs(a) / INT8_MAX, 1.0 / INT8_MAX)
    _linear(imp, node, x, w, sw, b / (x.scale * sw), _quantized_output(imp, node),
            {"strides": (1, 1), "pads": (0, 0, 0, 0), "groups": c})


def _qdq_resize(imp: _Importer, node: onnx.NodeProto) -> None:
    """Resize of a quantized activation by constant scales or sizes, nearest or linear: the IR Resize, whose integer
    weights sum to one, so it commutes with the zero point exactly; then a rescale where the output's parameters
    differ. Cubic interpolation (its overshoot requantizes) is refused."""
    x = imp.alias(node, node.input[0])
    shape = imp.shape(x.name)
    given = imp.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    sizes = imp.consts.get(node.input[3]) if len(node.input) > 3 and node.input[3] else None
    if (len(node.input) > 2 and node.input[2] and given is None) or (len(node.input) > 3 and node.input[3] and
                                                                    sizes is None):
        raise UnsupportedOperatorError(node.op_type, node.name, "scales or sizes computed at run time")
    attrs = resize_attrs(node, shape, given, sizes)
    if attrs["mode"] == "cubic":
        raise UnsupportedOperatorError(node.op_type, node.name, "cubic interpolation of a quantized activation "
                                       "(nearest and linear only)")
    out_shape = tuple(int(np.floor(d * s)) for d, s in zip(shape, attrs["scales"])) if sizes is None else \
        tuple(int(round(d * s)) for d, s in zip(shape, attrs["scales"]))
    out = _quantized_output(imp, node)
    same = (x.scale, x.zp) == (out.scale, out.zp)
    mid = _Out(out.name if same else f"{out.name}_resized", x.scale, x.zp, out.unsigned)
    resized = imp.emit_out("Resize", node.name, [x.name], mid, out_shape, sizes=out_shape, **attrs)
    if not same:
        _rescale(imp, f"{node.name}_rescale", _Act(resized, x.scale, x.zp), out, out_shape)
    elif (out.lo, out.hi) != (INT8_MIN, INT8_MAX):
        _clip_to(imp, node.name, out)


def _reduce_mean(imp: _Importer, node: onnx.NodeProto) -> None:
    """ReduceMean of a quantized NCHW activation over its two spatial axes: a global average pool (keepdims=0: then
    a Reshape to [N, C])."""
    x = imp.alias(node, node.input[0])
    a = _attrs(node)
    axes = imp.const(node, 1, "axes").reshape(-1).tolist() if len(node.input) > 1 and node.input[1] else \
        a.get("axes")
    rank = len(imp.shape(x.name))
    if axes is not None and rank >= 2 and [int(k) % rank for k in axes] == [rank - 1]:
        _mean_last_axis(imp, node, x, _quantized_output(imp, node), bool(a.get("keepdims", 1)))
        return
    if rank != 4 or axes is None or sorted(int(k) % rank for k in axes) != [2, 3]:
        raise UnsupportedOperatorError(node.op_type, node.name, f"it averages axes {axes} of a rank-{rank} tensor "
                                       f"(the lab takes the last axis, or the spatial axes [2, 3] of NCHW)")
    out = _quantized_output(imp, node)
    if a.get("keepdims", 1):
        _gap(imp, node, x, out)
        return
    pooled = _Out(f"{out.name}_pooled", out.scale, out.zp, out.unsigned, out.lo, out.hi)
    _gap(imp, node, x, pooled)
    n, c = imp.shape(x.name)[:2]
    flat = imp.tensor(out.name, (n, c), out.scale)
    imp.emit("Reshape", f"{node.name}_flat", [imp.ints.pop(pooled.name)], flat, shape=(n, c))
    imp.ints[out.name], imp.unsigned[out.name] = flat, out.unsigned


def _mean_last_axis(imp: _Importer, node: onnx.NodeProto, x: _Act, out: _Out, keepdims: bool) -> None:
    """The mean over the last axis (a LayerNorm decomposed by an exporter: its two ReduceMeans) as a dense layer of
    ones at the weight scale ``1 / K``: rows ``[prod(lead), K]``, a ``QDense`` to one output (zero points exact, as
    any linear layer's), reshaped to ``[..., 1]`` (or ``[...]`` without ``keepdims``)."""
    shape = imp.shape(x.name)
    lead, k = shape[:-1], shape[-1]
    rows = (int(np.prod(lead, dtype=np.int64)), k)
    flat = imp.tensor(f"{x.name}_rows", rows, x.scale)
    imp.emit("Reshape", f"{node.name}_rows", [x.name], flat, shape=rows)
    _linear(imp, node, _Act(flat, x.scale, x.zp), np.ones((1, k), np.int64), np.array([1.0 / k]), np.zeros(1), out,
            None)
    back = (*lead, 1) if keepdims else tuple(lead)
    moved = imp.tensor(f"{out.name}_unrows", back, out.scale)
    imp.emit("Reshape", f"{node.name}_unrows", [imp.ints[out.name]], moved, shape=back)
    imp.ints[out.name] = moved


# ---- QOperator ----------------------------------------------------------------------------------------------------
def _weight_const(imp: _Importer, node: onnx.NodeProto, index: int) -> np.ndarray:
    w = imp.const(node, index, "weight")
    if w.dtype not in (np.int8, np.uint8):
        raise UnsupportedOperatorError(node.op_type, node.name, f"its weights are {w.dtype}; int8 or uint8 expected")
    return w


def _qlinear_conv(imp: _Importer, node: onnx.NodeProto) -> None:
    x = imp.act(node, 0, 1, 2)
    w = _weight_const(imp, node, 3)
    wz = imp.const(node, 5, "weight zero point")
    bias = node.input[8] if len(node.input) > 8 and node.input[8] else None
    _conv(imp, node, x, node.input[3], w, wz, imp.const(node, 4, "weight scale"), 0, bias,
          imp.out(node, node.output[0], 6, 7))


def _qlinear_matmul(imp: _Importer, node: onnx.NodeProto) -> None:
    x = imp.act(node, 0, 1, 2)
    if len(node.input) > 3 and node.input[3] not in imp.consts:             # two activations
        _matmul(imp, node, x, imp.act(node, 3, 4, 5), imp.out(node, node.output[0], 6, 7))
        return
    w = _weight_const(imp, node, 3)
    _dense(imp, node, x, w, imp.const(node, 5, "weight zero point"), imp.const(node, 4, "weight scale"), 1, False,
           None, imp.out(node, node.output[0], 6, 7))


def _qgemm(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or len(node.input) < 8 or not node.input[7]:
        raise UnsupportedOperatorError(node.op_type, node.name, "the lab takes QGemm with transA=0, alpha=1 and a "
                                       "quantized output (y_scale)")
    x = imp.act(node, 0, 1, 2)
    w = _weight_const(imp, node, 3)
    transposed = bool(a.get("transB", 0))
    _dense(imp, node, x, w, imp.const(node, 5, "weight zero point"), imp.const(node, 4, "weight scale"),
           0 if transposed else 1, transposed, node.input[6] or None, imp.out(node, node.output[0], 7, 8))


def _qlinear_constants(imp: _Importer, node: onnx.NodeProto) -> bool:
    """A QLinearAdd or QLinearMul of two integer constants (GPT-2's attention scale, which the quantizer did not
    fold): the constant it computes, ``clip(rint(op(a, b) / y_scale) + y_zero_point)`` in the output zero point's
    type, as onnxruntime computes it in float; True when done."""
    names = (node.input[0], node.input[3])
    if not all(n in imp.consts and imp.consts[n].dtype.kind in "iu" and n not in imp.ints for n in names):
        return False
    reals = []
    for k in (0, 3):
        zp = imp.const(node, k + 2, "zero point").astype(np.float64)
        reals.append((imp.consts[node.input[k]].astype(np.float64) - zp) * imp.scalar_scale(node, k + 1))
    zero = imp.const(node, 7, "zero point") if len(node.input) > 7 and node.input[7] else np.zeros((), np.uint8)
    value = prequant_tables.BINARY_FNS[node.op_type.removeprefix("QLinear")](*reals)
    imp.consts[node.output[0]] = _quantize_as_onnx(value, imp.scalar_scale(node, 6), zero)
    return True


def _qlinear_add(imp: _Importer, node: onnx.NodeProto) -> None:
    if _qlinear_constants(imp, node):
        return
    a, b = _qlinear_operand(imp, node, 0), _qlinear_operand(imp, node, 3)
    out = imp.out(node, node.output[0], 6, 7)
    if imp.shape(a.name) != imp.shape(b.name):
        _binary(imp, node, a, b, out)               # a bias added after a QLinearMatMul: broadcast, a QLut2
        return
    _add(imp, node, a, b, out)


def _qlinear_binary(imp: _Importer, node: onnx.NodeProto) -> None:
    """com.microsoft's QLinearMul (and QLinearAdd of broadcast shapes): A, its scale and zero point, B, its, C's."""
    if _qlinear_constants(imp, node):
        return
    _binary(imp, node, _qlinear_operand(imp, node, 0), _qlinear_operand(imp, node, 3),
            imp.out(node, node.output[0], 6, 7))


def _qlinear_operand(imp: _Importer, node: onnx.NodeProto, index: int) -> _Act:
    """Input ``index`` of a QOperator node of two operands (its scale and zero point next): a quantized activation,
    or an integer constant (a bias the quantizer quantized as the Add's input), as :func:`_constant_operand`."""
    name = node.input[index]
    if name in imp.consts and imp.consts[name].dtype.kind in "iu" and name not in imp.ints:
        zp = imp.const(node, index + 2, "zero point").astype(np.int64).reshape(-1)
        values = imp.consts[name].astype(np.int64) - (int(zp[0]) if zp.size == 1 else zp)
        return _constant_operand(imp, name, values, imp.scalar_scale(node, index + 1))
    return imp.act(node, index, index + 1, index + 2)


def _qlinear_softmax(imp: _Importer, node: onnx.NodeProto) -> None:
    """com.microsoft's QLinearSoftmax (X, its scale and zero point, Y's): opset-13 semantics, or any opset's along
    the last axis (where the older flattening is the same)."""
    a = _attrs(node)
    x = imp.act(node, 0, 1, 2)
    rank = len(imp.shape(x.name))
    axis = int(a.get("axis", -1)) % rank
    if int(a.get("opset", 13)) < 13 and axis != rank - 1:
        raise UnsupportedOperatorError(node.op_type, node.name, f"opset {a.get('opset')}'s Softmax on axis {axis} "
                                       f"of {rank} (it flattens the axes after it; the lab takes the last axis)")
    _softmax(imp, node, x, axis, imp.out(node, node.output[0], 3, 4))


def _qlinear_pool(fn: Callable[[_Importer, onnx.NodeProto, _Act, _Out], None]) -> Callable[[_Importer,
                                                                                              onnx.NodeProto], None]:
    def rule(imp: _Importer, node: onnx.NodeProto) -> None:
        if _attrs(node).get("channels_last", 0):
            raise UnsupportedOperatorError(node.op_type, node.name, "channels_last=1 (the lab takes NCHW)")
        fn(imp, node, imp.act(node, 0, 1, 2), imp.out(node, node.output[0], 3, 4))
    return rule


def _qlinear_concat(imp: _Importer, node: onnx.NodeProto) -> None:
    out = imp.out(node, node.output[0], 0, 1)
    xs = [_qlinear_operand(imp, node, k) for k in range(2, len(node.input), 3)]
    _concat(imp, node, xs, int(_attrs(node)["axis"]), out)


def _refuse_dynamic(imp: _Importer, node: onnx.NodeProto) -> None:
    raise UnsupportedOperatorError(node.op_type, node.name, "dynamic quantization (int32 results scaled by float "
                                   "operators, activation scales computed at run time) is not supported; quantize "
                                   "the model statically (QDQ or QOperator)")


# ---- QuantizeLinear / DequantizeLinear and the shape-only operators -----------------------------------------------
def _quantize_linear(imp: _Importer, node: onnx.NodeProto) -> None:
    x, y = node.input[0], node.output[0]
    if _attrs(node).get("output_dtype", 0) or _attrs(node).get("saturate", 1) != 1:
        raise UnsupportedOperatorError(node.op_type, node.name, "output_dtype and saturate=0 are not supported")
    real = imp.real_constant(x)
    if real is not None:
        imp.consts[y] = _quantized_constant(imp, node, real)
        return
    if _unquantized_mask(imp, node):
        return
    out = imp.out(node, y, 1, 2)
    if x in imp.floats:
        src = imp.floats[x]
        if (src.scale, src.zp) == (out.scale, out.zp):
            imp.ints[y], imp.unsigned[y] = src.name, out.unsigned
        else:
            _rescale(imp, node.name or f"{y}_rescale", src, out, imp.shape(src.name))
        return
    if x not in imp.graph.inputs and x not in imp.input_fns:
        if x in imp.refused:
            raise _Refused
        raise UnsupportedOperatorError(node.op_type, node.name, f"it quantizes {x!r}, a float value the lab does "
                                       f"not compute (only graph inputs, values computed from integer inputs alone "
                                       f"and DequantizeLinear results)")
    if out.zp == 0:
        imp.emit_out("Quantize", node.name or f"{y}_quantize", [x], out, imp.shape(x), scale=out.scale)
    else:
        imp.emit_out("QuantizeZp", node.name or f"{y}_quantize", [x], out, imp.shape(x), scale=out.scale,
                     zero_point=out.zp)
    if x in imp.input_fns:
        imp.masks.add(y)


def _quantized_constant(imp: _Importer, node: onnx.NodeProto, real: np.ndarray) -> np.ndarray:
    """QuantizeLinear of a constant (a float initializer, or DequantizeLinear of one: a BatchNormalization's
    statistics an exporter shares through Identity, which the quantizer then quantizes as an activation), as
    onnxruntime computes it: ``clip(rint(x / scale) + zero_point)`` in the zero point's type, per tensor or along
    ``axis``; the DequantizeLinear after it reads it as any quantized constant. ``real``: the constant's values."""
    scale = imp.const(node, 1, "scale").astype(np.float64)
    zp = imp.const(node, 2, "zero point") if len(node.input) > 2 and node.input[2] else np.zeros(1, np.uint8)
    if scale.size > 1:
        shape = [1] * real.ndim
        shape[int(_attrs(node).get("axis", 1)) % real.ndim] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return _quantize_as_onnx(real, scale, zp)


def _quantize_as_onnx(real: np.ndarray, scale: np.ndarray | float, zp: np.ndarray) -> np.ndarray:
    """``clip(rint(real / scale) + zp)`` in ``zp``'s integer type (broadcast): QuantizeLinear of a constant."""
    info = np.iinfo(zp.dtype)
    return np.clip(np.rint(real / scale) + zp.astype(np.int64), info.min, info.max).astype(zp.dtype)


def _dequantize_linear(imp: _Importer, node: onnx.NodeProto) -> None:
    x, y = node.input[0], node.output[0]
    block = int(_attrs(node).get("block_size", 0))
    if block:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its scales are per block of {block} values "
                                       f"(blocked quantization): the lab's integer layers take one scale per tensor "
                                       f"or per output channel")
    if x in imp.consts:
        values = imp.consts[x]
        wzp = imp.const(node, 2, "zero point") if len(node.input) > 2 and node.input[2] else \
            np.zeros(1, values.dtype)
        axis = int(_attrs(node).get("axis", 1))
        scale = imp.const(node, 1, "scale").astype(np.float64)
        shape = [1] * values.ndim
        if scale.size > 1:
            shape[axis % values.ndim] = -1
        wzp = np.asarray(wzp).astype(np.int64)
        imp.weights[y] = (values.astype(np.int64) - wzp.reshape(shape if wzp.size > 1 else [1] * values.ndim),
                          scale.reshape(shape) if scale.size > 1 else scale.reshape(-1),
                          axis % values.ndim if values.ndim else 0)
        if scale.size == 1 and wzp.size == 1 and values.dtype in (np.uint8, np.int8):   # an embedding table's
            shift = 128 if values.dtype == np.uint8 else 0
            imp.tables[y] = ((values.astype(np.int64) - shift).astype(np.int8), float(scale.reshape(-1)[0]),
                             int(wzp.reshape(-1)[0]) - shift)
        return
    if x in imp.unquantized:                              # the mask's pair at scale inf: the float mask itself
        imp.unquantized[y] = imp.unquantized[x]
        return
    src = imp.int_tensor(node, x)
    zp, _ = imp.zero_point(node, 2, imp.unsigned[x])
    imp.floats[y] = _Act(src, imp.scalar_scale(node, 1), zp)
    if x in imp.masks:
        imp.masks.add(y)


def _reshape_shape(imp: _Importer, node: onnx.NodeProto, shape: tuple[int, ...]) -> tuple[int, ...]:
    op = node.op_type
    if op == "Flatten":
        axis = int(_attrs(node).get("axis", 1)) % (len(shape) + 1)
        return (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))
    if op == "Reshape":
        target = [int(v) for v in imp.const(node, 1, "shape").reshape(-1)]
        target = [shape[k] if v == 0 else v for k, v in enumerate(target)]
        if -1 in target:
            known = int(np.prod([v for v in target if v != -1], dtype=np.int64))
            target[target.index(-1)] = int(np.prod(shape, dtype=np.int64)) // known
        return tuple(target)
    axes_in: Any = imp.const(node, 1, "axes").reshape(-1) if len(node.input) > 1 and node.input[1] else \
        _attrs(node).get("axes")
    if op == "Squeeze":
        axes = {int(a) % len(shape) for a in axes_in} if axes_in is not None else \
            {k for k, d in enumerate(shape) if d == 1}
        return tuple(d for k, d in enumerate(shape) if k not in axes)
    rank = len(shape) + len(axes_in)
    axes = {int(a) % rank for a in axes_in}
    it = iter(shape)
    return tuple(1 if k in axes else next(it) for k in range(rank))


def _moved_source(imp: _Importer, node: onnx.NodeProto) -> tuple[_Act, bool | None]:
    """The input of a shape-only or order-preserving operator: an alias (DequantizeLinear of an activation; the
    second value None) or an int tensor (its scale, zero point 0: raw integers, whose zero point the move ignores;
    the second value whether ONNX holds it as uint8)."""
    x = node.input[0]
    if x in imp.refused:
        raise _Refused
    if x in imp.floats:
        return imp.floats[x], None
    if x in imp.ints and node.op_type not in ("Relu", "Clip"):    # raw integers: zero point irrelevant
        return _Act(imp.ints[x], imp.graph.tensors[imp.ints[x]].scale or 1.0, 0), imp.unsigned[x]
    raise UnsupportedOperatorError(node.op_type, node.name, f"its input {x!r} is neither a quantized activation "
                                   f"nor DequantizeLinear of one")


def _moved(imp: _Importer, y: str, name: str, src: _Act, unsigned: bool | None) -> None:
    """Record ONNX tensor ``y`` as IR tensor ``name``, which holds ``src``'s values moved (an alias again when the
    input was one)."""
    if unsigned is None:
        imp.floats[y] = _Act(name, src.scale, src.zp)
    else:
        imp.ints[y], imp.unsigned[y] = name, unsigned


def _passthrough(imp: _Importer, node: onnx.NodeProto) -> None:
    """Shape-only and order-preserving operators of an int tensor or of an alias: the same scale and zero point. An
    Identity of a DequantizeLinear'd constant (a bias an exporter shares between layers) is that constant again."""
    x, y = node.input[0], node.output[0]
    if node.op_type in ("Identity", "Dropout") and x in imp.weights:
        imp.weights[y] = imp.weights[x]
        return
    if node.op_type in ("Identity", "Dropout") and x in imp.consts:
        imp.consts[y] = imp.consts[x]
        return
    if _moved_constant(imp, node):
        return
    if x in imp.graph.inputs and node.op_type in _FLOAT_MOVES:
        _moved_input(imp, node)
        return
    src, unsigned = _moved_source(imp, node)
    shape = imp.shape(src.name)
    op, attrs, out_shape = _passthrough_op(imp, node, shape, src)
    if op is None:
        name = src.name
    else:
        name = imp.tensor(y, out_shape, src.scale)
        imp.emit(op, node.name or f"{y}_{op}", [src.name], name, **attrs)
    _moved(imp, y, name, src, unsigned)


def _moved_input(imp: _Importer, node: onnx.NodeProto) -> None:
    """A move of a float graph input ahead of its first QuantizeLinear (torch's encoder of ``batch_first=False``
    transposes its input first): the input quantized at the parameters of the QuantizeLinear nodes the moved value
    reaches (:func:`_shared_quantization`: one scale and zero point), then the move of the integers. Quantizing is
    element-wise, so it gives the same values before the move as after."""
    out = _shared_quantization(imp, node)
    if out is None:
        raise UnsupportedOperatorError(node.op_type, node.name, f"it moves the float input {node.input[0]!r}, and "
                                       f"the result is not quantized once (QuantizeLinear nodes of one scale and "
                                       f"zero point, through moves)")
    x = node.input[0]
    shape = imp.shape(x)
    quantized = imp.tensor(f"{x}_quantized", shape, out.scale)
    if out.zp == 0:
        imp.emit("Quantize", f"{x}_quantize", [x], quantized, scale=out.scale)
    else:
        imp.emit("QuantizeZp", f"{x}_quantize", [x], quantized, scale=out.scale, zero_point=out.zp)
    op, attrs, moved = _passthrough_op(imp, node, shape, _Act(quantized, out.scale, out.zp))
    if op is None:
        imp.ints[out.name], imp.unsigned[out.name] = quantized, out.unsigned
    else:
        imp.emit_out(op, node.name, [quantized], out, moved, **attrs)


def _slices(imp: _Importer, node: onnx.NodeProto) -> None:
    """Slice and Split of a quantized activation (ShuffleNet's channel halves; constant starts, ends and sizes once
    the shape arithmetic folded), and Gather of it by constant indices: IR Slice and Gather, zero-point invariant.
    A Gather of a quantized table by token ids (an integer graph input) is an :func:`_embedding`."""
    if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in imp.int_inputs:
        _embedding(imp, node)
        return
    if _moved_constant(imp, node):
        return
    src, unsigned = _moved_source(imp, node)
    shape = imp.shape(src.name)
    rank = len(shape)
    parts: list[tuple[str, str, dict[str, Any], tuple[int, ...]]] = []
    if node.op_type == "Gather":
        axis = int(_attrs(node).get("axis", 0)) % rank
        idx = gather_indices(node, imp.const(node, 1, "indices"), shape[axis])
        out = shape[:axis] + idx.shape + shape[axis + 1:]
        parts.append((node.output[0], "Gather", {"axis": axis, "indices": idx}, out))
    elif node.op_type == "Slice":
        given = [imp.const(node, k, what) if len(node.input) > k and node.input[k] else None
                 for k, what in ((3, "axes"), (4, "steps"))]
        axes, indices = slice_spec(node, shape, imp.const(node, 1, "starts"), imp.const(node, 2, "ends"), *given)
        out = tuple(len(indices[axes.index(k)]) if k in axes else d for k, d in enumerate(shape))
        parts.append((node.output[0], "Slice", {"axes": axes, "indices": indices}, out))
    else:                                                    # Split
        a = _attrs(node)
        axis = int(a.get("axis", 0)) % rank
        if len(node.input) > 1 and node.input[1]:
            sizes = [int(v) for v in imp.const(node, 1, "split").reshape(-1)]
        elif "split" in a:
            sizes = [int(v) for v in a["split"]]
        else:
            count = len(node.output)
            step = -(-shape[axis] // count)
            sizes = [min(step, shape[axis] - k * step) for k in range(count)]
        if sum(sizes) != shape[axis] or len(sizes) != len(node.output) or min(sizes) < 0:
            raise UnsupportedOperatorError(node.op_type, node.name, f"sizes {sizes} for {len(node.output)} outputs "
                                           f"of an axis of {shape[axis]}")
        begin = 0
        for y, size in zip(node.output, sizes):
            out = tuple(size if k == axis else d for k, d in enumerate(shape))
            if y:
                parts.append((y, "Slice", {"axes": (axis,), "indices": (tuple(range(begin, begin + size)),)}, out))
            begin += size
    for y, op, attrs, out in parts:
        name = imp.tensor(y, out, src.scale)
        imp.emit(op, node.name or f"{y}_{op}", [src.name], name, **attrs)
        _moved(imp, y, name, src, unsigned)


_CONSTANT_MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Split", "Gather",
                             "Expand", "Identity", "Dropout"})
"""Operators that move a constant's elements: of a DequantizeLinear'd integer constant, they move its integers."""


def _embedding(imp: _Importer, node: onnx.NodeProto) -> None:
    """``Gather(DequantizeLinear(table), ids)`` on axis 0, ``ids`` an integer graph input: the IR ``Embedding`` of the
    table's int8 values (uint8 shifted to int8 with its zero point), its output the same integers at the table's
    scale and zero point (a row lookup requantizes nothing). In QOperator form, ``Gather(table, ids)`` of the int
    table itself: the same Embedding, the integers at the scale its first reader gives them. ``Gather(float table,
    ids)`` followed by a QuantizeLinear (a table a quantizer left float, whose lookup the completion quantizes,
    :mod:`.prequant_complete`; or a table dequantized per row, as NNCF's transformer preset writes it): the
    Embedding of the table's float values quantized as that QuantizeLinear quantizes them (float32, row by row: the
    same integers as quantizing the rows looked up)."""
    table, ids = node.input[0], node.input[1]
    raw = imp.consts.get(table)
    readers = imp.consumers.get(node.output[0], [])
    if int(_attrs(node).get("axis", 0)) == 0 and raw is not None and raw.dtype in (np.uint8, np.int8) and readers:
        # QOperator: the int table itself; its scale is the first reader's, the input after it (DequantizeLinear,
        # QLinearAdd...)
        shift = 128 if raw.dtype == np.uint8 else 0
        name = imp.constant(f"{table}_int8", (raw.astype(np.int64) - shift).astype(np.int8))
        first = readers[0]
        scale = imp.scalar_scale(first, list(first.input).index(node.output[0]) + 1)
        out = imp.tensor(node.output[0], imp.shape(ids) + raw.shape[1:], scale)
        imp.emit("Embedding", node.name, [ids, name], out)
        imp.ints[node.output[0]], imp.unsigned[node.output[0]] = out, raw.dtype == np.uint8
        return
    real = None
    if table in imp.weights and table not in imp.tables:      # per row (NNCF's transformer preset), or int16
        real = cast(np.ndarray, imp.real_constant(table)).astype(np.float32)
    elif table not in imp.weights and table in imp.consts and imp.consts[table].dtype == np.float32:
        real = imp.consts[table]
    if int(_attrs(node).get("axis", 0)) == 0 and real is not None and real.ndim >= 1:
        at = _quantized_output(imp, node)           # a float table (the completion quantizes what the Gather gives)
        with np.errstate(all="ignore"):            # QuantizeLinear of the rows it looks up, row by row: the same
            q = np.rint(real / np.float32(at.scale)) + at.zp        # integers, as ONNX computes it in float32
        values = np.clip(np.nan_to_num(q, nan=0.0), at.lo, at.hi).astype(np.int8)
        name = imp.constant(f"{table}_int8", values)
        imp.emit_out("Embedding", node.name, [ids, name], at, imp.shape(ids) + real.shape[1:])
        return
    if int(_attrs(node).get("axis", 0)) != 0 or table not in imp.tables:
        raise UnsupportedOperatorError(node.op_type, node.name, f"it looks up token ids {ids!r} in {table!r}; the lab "
                                       f"takes a per-tensor DequantizeLinear of an int8 or uint8 table, on axis 0")
    values, scale, zp = imp.tables[table]
    name = imp.constant(f"{table}_int8", values)
    out = imp.tensor(node.output[0], imp.shape(ids) + values.shape[1:], scale)
    imp.emit("Embedding", node.name, [ids, name], out)
    imp.floats[node.output[0]] = _Act(out, scale, zp)


def _computed_constants(model: onnx.ModelProto, consts: dict[str, np.ndarray], ops: frozenset[str] | set[str]
                        ) -> dict[str, np.ndarray]:
    """The values of the nodes of ``ops`` (default domain) that compute from ``consts`` alone and write a tensor some
    node reads beside a value that is no constant (T5's position bias: a DequantizeLinear of the QuantizeLinear of
    a table's rows at constant buckets, which its mask's Where reads), in graph order, as ONNX's reference evaluator
    computes them (a node it cannot evaluate is left out)."""
    known = dict(consts)
    needed: dict[str, onnx.NodeProto] = {}
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ops and node.input and \
                all(not t or t in known for t in node.input) and not all(o in known for o in node.output if o):
            known.update({o: np.empty(0) for o in node.output if o})      # placeholders: constant, not yet valued
            needed.update({o: node for o in node.output if o})
    mixed = {t for node in model.graph.node if any(t not in known for t in node.input if t)
             for t in node.input if t in needed}
    wanted: set[int] = set()
    stack = [needed[t] for t in mixed]
    while stack:
        node = stack.pop()
        if id(node) not in wanted:
            wanted.add(id(node))
            stack.extend(needed[t] for t in node.input if t in needed)
    out: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        if id(node) not in wanted:
            continue
        feed = {t: out.get(t, consts.get(t)) for t in node.input if t}
        if any(v is None for v in feed.values()):
            continue
        try:
            results = reference_evaluator(node).run(None, feed)
        except Exception:  # noqa: BLE001 - a node the evaluator refuses stays what it is: not a region's constant
            continue
        out.update({o: np.asarray(v) for o, v in zip(node.output, results) if o})
    return out


def _integer_input_regions(imp: _Importer, model: onnx.ModelProto) -> None:
    """Before the nodes import: what each integer graph input computes in float with constants alone (a Hugging Face
    attention mask's Unsqueeze, Cast, Sub and Where into an additive fill), up to the QuantizeLinear nodes that read
    it, becomes one ``MaskFn`` (an input of rank 2 or more: the run checks it holds 0s and 1s) or ``InputFn`` (the
    region as an ONNX model, run by ONNX's reference evaluator as the file computes it), writing a float32 tensor
    those QuantizeLinear nodes then quantize; integer indices it computes for Gather nodes alone (RoBERTa's position
    ids, a cumulative sum of ``input_ids != pad``) become one ``IndexFn`` each, the Gathers then
    :func:`_embedding`; the region's nodes are skipped. An input whose region reaches anything else is left to the
    rules (the input itself may still be read by a Gather: token ids). A value of constants alone in the region (a
    mask's fill value, which AMD Quark quantizes too; T5's position bias, a table's rows at constant buckets that
    the quantizer quantizes as an activation: :func:`_computed_constants`) is the constant it computes, and a mask
    the file left float, added to scores it left float too, is the Softmax's additive term (``term``).
    ``Gather`` nodes that look rows up in a table (int8, or float of rank 2 or more) are no region nodes, nor is
    what reads their rows."""
    from .dequantize import dequantized_constants
    from .masks import REGION_OPS, encode, forward_region, region_model
    if not imp.int_inputs:                         # no integer input (an image model): no region, no constants
        return
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*model.graph.value_info, *model.graph.output]}
    shapes = static_shapes(model)
    consts = dict(imp.consts)          # and DequantizeLinear of constants: a fill, T5's position bias (a lookup in
    consts.update(dequantized_constants(model, imp.consts))      # a table is no region node: ``lookups`` below)
    consts.update(_computed_constants(model, consts, REGION_OPS | {"QuantizeLinear", "DequantizeLinear"}))

    def kind(e: str) -> str | None:
        """How the region's exit ``e`` leaves it: ``float`` (read by QuantizeLinear nodes alone), ``term`` (float,
        read by Adds alone, each of the scores of Softmax nodes alone: a mask the file left float, into scores it
        left float too, :func:`.prequant_complete._masked_scores`), ``index`` (an integer read as the indices of
        Gather nodes alone), else None."""
        users = imp.consumers.get(e, [])
        if e in imp.outputs or not users or shapes.get(e) is None:
            return None
        if types.get(e) == onnx.TensorProto.FLOAT and \
                all(u.op_type == "QuantizeLinear" and u.input[0] == e for u in users):
            return "float"                               # a mask's additive term, quantized by the file
        if types.get(e) == onnx.TensorProto.FLOAT and all(
                u.op_type == "Add" and len(u.input) == 2 and list(u.input).count(e) == 1 and
                imp.consumers.get(u.output[0]) and all(s.op_type == "Softmax" for s in imp.consumers[u.output[0]])
                for u in users):
            return "term"                                # added float to the scores of a Softmax (a float island)
        if types.get(e) in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and \
                all(u.op_type == "Gather" and list(u.input[1:]) == [e] for u in users):
            return "index"                               # RoBERTa's position ids: a cumulative sum of the mask
        return None

    for vi in model.graph.input:
        if vi.name not in imp.int_inputs:
            continue
        region, nodes = forward_region(model, vi.name, consts, REGION_OPS)
        lookups = {id(n) for n in nodes if n.op_type == "Gather" and n.input[0] in consts and
                   (consts[n.input[0]].dtype in (np.uint8, np.int8) or       # QOperator: a table's ints by the ids
                    (consts[n.input[0]].dtype == np.float32 and consts[n.input[0]].ndim >= 2))}  # a float table
        if lookups:                              # and what reads their rows: the region without them
            region, kept = {vi.name}, []
            for n in nodes:
                if id(n) not in lookups and all(not t or t in region or t in consts for t in n.input):
                    kept.append(n)
                    region.update(n.output)
            nodes = kept
        inside = {id(n) for n in nodes}
        exits = sorted(({t for n in model.graph.node if id(n) not in inside for t in n.input if t in region} |
                        {t for t in imp.outputs if t in region}) - {vi.name})
        kinds = {e: kind(e) for e in exits}
        if not nodes or not exits or None in kinds.values():
            continue
        for e, k in kinds.items():
            shape = list(shapes[e])
            value = onnx.helper.make_tensor_value_info(e, onnx.TensorProto.FLOAT if k != "index" else types[e], shape)
            fn = encode(region_model(model, nodes, vi, [e], [value], consts))
            if k == "index":
                imp.graph.add_tensor(e, tuple(shape), "int64")
                imp.emit("IndexFn", f"{e}_fn", [vi.name], e, onnx=fn)
                imp.int_inputs.add(e)
                continue
            imp.graph.add_tensor(e, tuple(shape), "float32")
            rank = len(imp.shape(vi.name))      # [batch, tokens]: an attention mask's term (the run checks 0s and 1s)
            imp.emit("MaskFn" if rank >= 2 else "InputFn", f"{e}_fn", [vi.name], e, onnx=fn)
            imp.input_fns.add(e)
            if k == "term":                              # the Softmax takes it float (:func:`_qdq_binary`)
                imp.unquantized[e] = e
        imp.skip.update(inside)


def _moved_constant(imp: _Importer, node: onnx.NodeProto) -> bool:
    """A move of :data:`_CONSTANT_MOVES` of DequantizeLinear of an integer constant quantized per tensor, its other
    inputs constants (BERT's position embeddings gathered at constant ids, ViT's class token expanded to the batch):
    the moved integers, evaluated by ONNX's reference evaluator, at the same scale; True when done."""
    x = node.input[0] if node.input else ""
    if node.op_type == "Transpose" and x in imp.weights and imp.weights[x][1].size != 1:
        values, scale, axis = imp.weights[x]              # per channel: torch's Linear, DQ(W [O, K]) -> W^T
        perm = [int(p) for p in _attrs(node).get("perm", range(values.ndim)[::-1])]
        if sorted(perm) != list(range(values.ndim)) or scale.ndim != values.ndim:
            raise UnsupportedOperatorError(node.op_type, node.name, f"perm {perm} does not permute its "
                                           f"rank-{values.ndim} quantized constant")
        imp.weights[node.output[0]] = (values.transpose(perm), scale.transpose(perm), perm.index(axis))
        return True
    if x not in imp.weights or imp.weights[x][1].size != 1 or node.op_type not in _CONSTANT_MOVES or \
            any(t and t not in imp.consts for t in node.input[1:]):
        return False
    values, scale, _ = imp.weights[x]
    feed = {x: values.astype(np.int64), **{t: imp.consts[t] for t in node.input[1:] if t}}
    problem = axis_problem(node, 0, values.ndim) or index_problem(node, 0, feed)    # the float fold's checks
    if problem is not None:
        raise UnsupportedOperatorError(node.op_type, node.name, problem)
    try:
        results = reference_evaluator(node).run(None, feed)
    except Exception as err:  # noqa: BLE001 - any failure of the evaluator on a bad file: said, not raised
        raise UnsupportedOperatorError(node.op_type, node.name, f"it cannot be evaluated on its quantized constant "
                                       f"({type(err).__name__}: {err})") from None
    for name, value in zip(node.output, results):
        if name:
            imp.weights[name] = (np.asarray(value, np.int64), scale, 0)
    return True


def _expand(imp: _Importer, node: onnx.NodeProto) -> None:
    """Expand of a quantized constant (ViT's class token to the batch; :func:`_moved_constant`), or of an
    activation: the same tensor when it leaves the shape as it is, else a Reshape adding the leading axes and, for
    each axis of size 1 it widens to ``n``, a QConcat of ``n`` copies at the same parameters (grouped-query
    attention's ``repeat_kv``: keys and values ``[B, kv, 1, T, D]`` to ``[B, kv, g, T, D]``). The values are moved,
    not changed."""
    if _moved_constant(imp, node):
        return
    src, unsigned = _moved_source(imp, node)
    shape = imp.shape(src.name)
    target = tuple(int(d) for d in imp.const(node, 1, "shape").reshape(-1))
    full = _broadcast(shape, target)
    if full is None:
        raise UnsupportedOperatorError(node.op_type, node.name, f"it expands an activation of shape {shape} to "
                                       f"{target}, which do not broadcast")
    name = src.name
    padded = (1,) * (len(full) - len(shape)) + tuple(shape)
    if padded != tuple(shape):
        name, before = imp.tensor(f"{node.output[0]}_ranked", padded, src.scale), name
        imp.emit("Reshape", f"{node.name}_ranked", [before], name, shape=padded)
    current = list(padded)
    for axis in [k for k, (a, b) in enumerate(zip(padded, full)) if a != b]:
        current[axis] = full[axis]
        name, before = imp.tensor(f"{node.output[0]}_copies{axis}", tuple(current), src.scale), name
        imp.emit("QConcat", f"{node.name}_copies{axis}", [before] * full[axis], name, axis=axis,
                 multipliers=(1,) * full[axis], shifts=(0,) * full[axis])
    _moved(imp, node.output[0], name, src, unsigned)


def _cast(imp: _Importer, node: onnx.NodeProto) -> None:
    """A Cast to a float type of a float value (an exporter's ``Cast`` of attention scores or probabilities to
    float32, which they are): that value again, whether a quantized activation, a constant, or a float chain of one."""
    to = int(_attrs(node).get("to", 0))
    x, y = node.input[0], node.output[0]
    if to not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
        raise UnsupportedOperatorError(node.op_type, node.name, f"it casts to {onnx.TensorProto.DataType.Name(to)} "
                                       f"(the lab takes a Cast of a float value to float)")
    if x in imp.floats:
        imp.floats[y] = imp.floats[x]
    elif x in imp.pending:
        imp.pending[y] = imp.pending[x]
    elif x in imp.weights:
        imp.weights[y] = imp.weights[x]
    elif x in imp.consts and imp.consts[x].dtype.kind == "f":
        imp.consts[y] = imp.consts[x].astype(np.float32)
    elif x in imp.refused:
        raise _Refused
    else:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its input {x!r} is not a quantized activation or a "
                                       f"constant")


def _never_nan(imp: _Importer, node: onnx.NodeProto) -> None:
    """IsNaN or IsInf of a DequantizeLinear result (torch's scaled-dot-product attention zeroes the NaN rows of a
    fully masked softmax: ``Where(IsNaN(p), 0, p)``): integers at a finite scale are never NaN nor infinite, so it
    is a constant of False, and the Where after it keeps the activation."""
    x = imp.alias(node, node.input[0])
    imp.consts[node.output[0]] = np.zeros(imp.shape(x.name), np.bool_)


def _where(imp: _Importer, node: onnx.NodeProto) -> None:
    """Where of a constant condition (a causal mask), a quantized activation (or a float chain of one) and a
    constant fill of one value (GPT-2's ``Where(mask, scores, lowest)``, or the fill first): at the QuantizeLinear
    it feeds, the activation's values (a QLut when a chain or other parameters make one), then the IR ``Where`` with
    the fill quantized at the output's parameters (clipped to its range, as onnxruntime's QuantizeLinear does)."""
    cond = imp.consts.get(node.input[0]) if node.input else None
    fills = [imp.real_constant(name) for name in node.input[1:3]]
    which = [k for k, f in enumerate(fills) if f is not None and f.size == 1]
    if cond is None or len(which) != 1 or cond.dtype != np.bool_:
        raise UnsupportedOperatorError(node.op_type, node.name, "the lab takes Where of a constant condition, one "
                                       "activation and one constant of one value")
    k = which[0]
    x, fn = _function_of(imp, node, node.input[2 - k])
    out = _quantized_output(imp, node)
    shape = imp.shape(x.name)
    if _broadcast(cond.shape, shape) != shape:
        raise UnsupportedOperatorError(node.op_type, node.name, f"its condition {cond.shape} does not broadcast to "
                                       f"its activation's shape {shape}")
    table = prequant_tables.function_table(fn, x.scale, x.zp, out.scale, out.zp, out.lo, out.hi)
    kept = _Out(f"{out.name}_kept", out.scale, out.zp, out.unsigned)
    src = imp.emit_out("QLut", f"{node.name}_values", [x.name], kept, shape, table=table, function="Where")
    fill = prequant_tables.requantize(np.asarray(fills[k], np.float64).reshape(1), out.scale, out.zp, out.lo,
                                      out.hi)[0]
    keep = np.broadcast_to(cond if k == 1 else ~cond, shape).copy()
    imp.emit_out("Where", node.name, [src], out, shape, keep=keep, fill=int(fill))


def _passthrough_op(imp: _Importer, node: onnx.NodeProto, shape: tuple[int, ...],
                    src: _Act) -> tuple[str | None, dict[str, Any], tuple[int, ...]]:
    op = node.op_type
    if op in ("Identity", "Dropout"):
        return None, {}, shape
    if op in ("Relu", "Clip"):
        lo, hi = _activation_range(imp, node, src.scale, src.zp)
        return "QClip", {"lo": lo, "hi": max(lo, hi)}, shape
    if op == "Transpose":
        perm = tuple(int(p) for p in _attrs(node).get("perm", range(len(shape) - 1, -1, -1)))
        if sorted(perm) != list(range(len(shape))):
            raise UnsupportedOperatorError(op, node.name, f"perm {list(perm)} does not permute the axes of its "
                                           f"rank-{len(shape)} input")
        return "Transpose", {"perm": perm}, tuple(shape[p] for p in perm)
    if op == "MaxPool":
        a = _attrs(node)
        kernel = tuple(int(k) for k in a["kernel_shape"])
        if len(kernel) != 2 or a.get("storage_order", 0) or len(node.output) > 1 or \
                a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") or any(d != 1 for d in a.get("dilations",
                                                                                                     [1, 1])):
            raise UnsupportedOperatorError(op, node.name, "the lab takes 2D max pools without auto_pad, dilations "
                                           "or indices")
        strides = tuple(int(s) for s in a.get("strides", [1, 1]))
        pads = tuple(int(p) for p in a.get("pads", [0, 0, 0, 0]))
        if a.get("ceil_mode", 0):
            pads = _ceil_mode_pads(shape[2:], kernel, strides, pads)
        oh, ow = _output_hw(shape[2], shape[3], kernel, strides, pads)
        return "MaxPool", {"kernel": kernel, "strides": strides, "pads": pads}, (shape[0], shape[1], oh, ow)
    if op == "Pad":
        return _pad_op(imp, node, shape, src)
    new = _reshape_shape(imp, node, shape)
    if int(np.prod(new, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
        raise UnsupportedOperatorError(op, node.name, f"it reshapes {shape} to {new}, another number of elements")
    return "Reshape", {"shape": new}, new


def _ceil_mode_pads(hw: tuple[int, ...], kernel: tuple[int, ...], strides: tuple[int, ...],
                    pads: tuple[int, ...]) -> tuple[int, ...]:
    """A 2-D max pool's ``ceil_mode=1`` as more end padding (which holds -128 and never wins): the output size
    ``ceil((H + pads - k) / s) + 1``, one less where that last window would start past the input and its begin pad
    (onnxruntime's and torch's rule); each end pad grown until those windows fit. ``pads`` and the result are
    ONNX's ``(top, left, bottom, right)``."""
    ends = list(pads[2:])
    for axis, (size, k, s) in enumerate(zip(hw, kernel, strides)):
        begin = pads[axis]
        out = -(-(size + begin + pads[2 + axis] - k) // s) + 1
        if (out - 1) * s >= size + begin:
            out -= 1
        ends[axis] = max(ends[axis], (out - 1) * s + k - size - begin)
    return (pads[0], pads[1], ends[0], ends[1])


def _pad_op(imp: _Importer, node: onnx.NodeProto, shape: tuple[int, ...],
            src: _Act) -> tuple[str, dict[str, Any], tuple[int, ...]]:
    """A constant-mode Pad of a quantized activation (Keras's ZeroPadding2D in a TFLite model): its value at the
    activation's own scale and zero point, ``value / scale + zp``, which must be an int8 (0 is the zero point)."""
    a = _attrs(node)
    mode = str(a.get("mode", "constant"))              # _attrs decodes it
    rank = len(shape)
    if "pads" in a:                                        # opsets before 11: attributes
        pads, value, axes = [int(p) for p in a["pads"]], float(a.get("value", 0.0)), list(range(rank))
    else:
        if len(node.input) < 2 or node.input[1] not in imp.consts or \
                any(t and t not in imp.consts for t in node.input[2:4]):
            raise UnsupportedOperatorError(node.op_type, node.name, "pads, a value or axes computed at run time")
        pads = [int(p) for p in imp.consts[node.input[1]].reshape(-1)]
        value = float(imp.consts[node.input[2]].reshape(-1)[0]) if len(node.input) > 2 and node.input[2] else 0.0
        axes = [int(k) % rank for k in imp.consts[node.input[3]].reshape(-1)] if len(node.input) > 3 and \
            node.input[3] else list(range(rank))
    q = value / src.scale + src.zp
    if mode != "constant" or len(pads) != 2 * len(axes) or min(pads) < 0 or abs(q - round(q)) > 1e-6 or \
            not INT8_MIN <= round(q) <= INT8_MAX:
        raise UnsupportedOperatorError(node.op_type, node.name, f"mode {mode!r}, pads {pads}, value {value:g} (only "
                                       f"a constant pad whose value is an int8 at the input's scale)")
    full = [0] * (2 * rank)
    for k, axis in enumerate(axes):
        full[axis], full[rank + axis] = pads[k], pads[len(axes) + k]
    out = tuple(n + b + e for n, b, e in zip(shape, full[:rank], full[rank:]))
    return "Pad", {"pads": tuple(full), "value": int(round(q))}, out


def _constant(imp: _Importer, node: onnx.NodeProto) -> None:
    imp.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)


RULES: dict[str, Callable[[_Importer, onnx.NodeProto], None]] = {
    "QuantizeLinear": _quantize_linear,
    "DequantizeLinear": _dequantize_linear,
    "Constant": _constant,
    "Conv": _qdq_conv,
    "Gemm": _qdq_gemm,
    "MatMul": _qdq_matmul,
    "Add": _qdq_binary,
    "GlobalAveragePool": _qdq_unary(_gap),
    "AveragePool": _qdq_unary(_avgpool),
    "Sigmoid": _qdq_unary(_sigmoid),
    "Concat": _qdq_concat,
    "QLinearConv": _qlinear_conv,
    "QLinearMatMul": _qlinear_matmul,
    "QGemm": _qgemm,
    "QLinearAdd": _qlinear_add,
    "QLinearGlobalAveragePool": _qlinear_pool(_gap),
    "QLinearAveragePool": _qlinear_pool(_avgpool),
    "QLinearSigmoid": _qlinear_pool(_sigmoid),
    "QLinearConcat": _qlinear_concat,
    "QLinearLeakyRelu": _qlinear_pool(_activation("LeakyRelu")),
    "QLinearMul": _qlinear_binary,
    "QLinearSoftmax": _qlinear_softmax,
    **{op: _qdq_activation(op) for op in prequant_tables.UNARY_DEFAULTS},
    **{op: _qdq_binary for op in ("Sub", "Mul", "Div", "Pow")},
    "Cast": _cast,
    "Expand": _expand,
    "Where": _where,
    "IsNaN": _never_nan,
    "IsInf": _never_nan,
    "Softmax": _qdq_softmax,
    "ReduceMean": _reduce_mean,
    "Resize": _qdq_resize,
    "BatchNormalization": _batch_norm,
    "LayerNormalization": _layer_norm,
    "RMSNormalization": _rms_norm,
    "L2Normalize": _l2_normalize,
    "LpNormalization": _l2_normalize,
    "ConvInteger": _refuse_dynamic,
    "MatMulInteger": _refuse_dynamic,
    "DynamicQuantizeLinear": _refuse_dynamic,
    **{op: _passthrough for op in ("Relu", "Clip", "MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                   "Transpose", "Identity", "Dropout", "Pad")},
    **{op: _slices for op in ("Slice", "Split", "Gather")},
}
"""ONNX op type -> rule importing one node of a pre-quantized model."""


# ---- whole-graph passes -------------------------------------------------------------------------------------------
def _fuse_clips(g: Graph) -> None:
    """A QClip whose input comes from a QConv2d/QDense/QAffine feeding nothing else narrows that node's range."""
    for clip in [n for n in g.nodes if n.op == "QClip"]:
        prod = g.producer(clip.inputs[0])
        if prod is None or prod.op not in ("QConv2d", "QDense", "QAffine") or len(g.consumers(prod.outputs[0])) != 1 \
                or prod.outputs[0] in g.outputs:
            continue
        if prod.op == "QAffine":
            lo, hi = prod.attrs["lo"], prod.attrs["hi"]
        else:
            lo, hi = prod.attrs["requant"].lo, prod.attrs["requant"].hi
        lo = max(lo, clip.attrs["lo"])
        hi = max(lo, min(hi, clip.attrs["hi"]))
        if prod.op == "QAffine":
            prod.attrs.update(lo=lo, hi=hi)
        else:
            rq = prod.attrs["requant"]
            prod.attrs.update(requant=Requant(rq.multiplier, rq.shift, lo, hi), activation="clip")
        old = prod.outputs[0]
        prod.outputs = [clip.outputs[0]]
        g.nodes.remove(clip)
        del g.tensors[old]


def _accelerate_adds(g: Graph) -> None:
    """A two-input QAffine with every zero point 0 whose one operand comes from an unclipped QConv2d/QDense feeding
    only it becomes the accelerator's QAdd, that producer's bias raised by half an output step of the add (the
    truncation's average)."""
    for node in [n for n in g.nodes if n.op == "QAffine" and len(n.inputs) == 2]:
        if any(node.attrs["zero_points"]) or node.inputs[0] == node.inputs[1]:
            continue
        ra, rb = node.attrs["ratios"]
        mult, shift = choose_requant(np.array([ra, rb]), np.array([128, 128]))
        s = int(min(shift))
        ma, mb = int(np.clip(round(ra * 2**s), 1, 32767)), int(np.clip(round(rb * 2**s), 1, 32767))
        sy = g.tensors[node.outputs[0]].scale or 1.0
        if not any(_raise_bias(g, operand, 0.5 * sy) for operand in node.inputs):
            continue
        node.op = "QAdd"
        kind = "none" if (node.attrs["lo"], node.attrs["hi"]) == (INT8_MIN, INT8_MAX) else "clip"
        node.attrs = {"requant": AddRequant(ma, mb, s, node.attrs["lo"], node.attrs["hi"]), "activation": kind}


def _raise_bias(g: Graph, operand: str, real: float) -> bool:
    """Raise the bias of the unclipped QConv2d/QDense writing ``operand`` (read by one node only) by ``real``
    (real units) when its accumulator stays requantizable inside int32; True when done."""
    prod = g.producer(operand)
    if prod is None or prod.op not in ("QConv2d", "QDense") or len(g.consumers(operand)) != 1 or operand in g.outputs:
        return False
    rq = prod.attrs["requant"]
    if (rq.lo, rq.hi) != (INT8_MIN, INT8_MAX):
        return False
    sx = g.tensors[prod.inputs[0]].scale or 1.0
    sw = prod.attrs["w_scale"].astype(np.float64)
    bias = g.constants[prod.inputs[2]].astype(np.int64) + np.rint(real / (sx * sw)).astype(np.int64)
    if ((_product_bound(g.constants[prod.inputs[1]]) + np.abs(bias)) * rq.multiplier > INT32_MAX).any():
        return False
    g.constants[prod.inputs[2]] = bias.astype(np.int32)
    return True


def _drop_unread(g: Graph) -> None:
    """Drop the nodes whose outputs nothing reads and that write no graph output (a Sigmoid table whose one reader,
    SiLU's product, became one lookup of its input), last first."""
    readers = Counter(t for node in g.nodes for t in node.inputs)
    for node in reversed(list(g.nodes)):
        if not any(t in g.outputs or readers[t] for t in node.outputs):
            g.nodes.remove(node)
            readers.subtract(node.inputs)
            for t in node.outputs:
                g.tensors.pop(t, None)


def _dequantize_outputs(imp: _Importer) -> None:
    for out in imp.model.graph.output:
        if out.name in imp.float_outputs:
            imp.graph.outputs.append(out.name)
            continue
        if out.name in imp.floats:
            src = imp.floats[out.name]
            if src.name == out.name:       # a Relu, Clip or reshape after the last DequantizeLinear wrote the int8
                inner = f"{out.name}_int8"            # tensor under the output's name: it takes another one
                imp.graph.rename_tensor(out.name, inner)
                imp.floats = {k: _Act(inner, a.scale, a.zp) if a.name == out.name else a for k, a in imp.floats.items()}
                imp.ints = {k: inner if v == out.name else v for k, v in imp.ints.items()}
                src = imp.floats[out.name]
            if src.zp == 0:
                imp.emit("Dequantize", f"{out.name}_dequantize", [src.name], out.name, scale=src.scale)
            else:
                imp.emit("DequantizeZp", f"{out.name}_dequantize", [src.name], out.name, scale=src.scale,
                         zero_point=src.zp)
            imp.graph.add_tensor(out.name, imp.shape(src.name), "float32")
        elif out.name not in imp.refused:
            raise UnsupportedOperatorError("output", out.name, "a graph output must be DequantizeLinear of a "
                                           "quantized activation (the lab's graphs output float32)")
        imp.graph.outputs.append(out.name)


HUGE_SCALE = 1e30
"""A QuantizeLinear scale above which the file's calibration saw a mask's fill (float32's lowest, -3.4e38): every
value of the tensor but the fill then rounds to the zero point (:func:`_warn_huge_scales`)."""


def _warn_huge_scales(imp: _Importer, model: onnx.ModelProto, label: str) -> None:
    """One warning naming the activations ``model`` quantizes at a finite scale above :data:`HUGE_SCALE`: its
    quantizer calibrated them on a mask filled with float32's lowest (AMD Quark's files; onnxruntime's on T5, whose
    mask carries the position bias). The lab runs them as the file defines them, as onnxruntime does, so the scores
    or the bias such a tensor holds are lost to the rounding and the error against the float model shows it. A
    second warning names those of the completion's own pairs (:mod:`.prequant_complete`), whose measured ranges
    held such a fill."""
    huge = [node.input[0] for node in model.graph.node if node.op_type == "QuantizeLinear" and len(node.input) > 1
            and node.input[1] in imp.consts and node.input[0] not in imp.consts and
            np.isfinite(imp.consts[node.input[1]]).all() and float(np.max(imp.consts[node.input[1]])) > HUGE_SCALE]
    mine = [t for t in huge if COMPLETION_SUFFIX in t]     # the completion's own pairs: ranges it measured
    for names, who, where in ((sorted(set(huge) - set(mine)), f"{label} quantizes", "in onnxruntime as here; "
                               "calibrate the quantizer with the mask's fill clipped (-1e4, as older exporters wrote "
                               "it) to keep them"),
                              (mine, "the lab's completion of the float operators quantizes", "the error against the "
                               "float model shows what that costs")):
        message = (f"{who} {len(names)} activation(s) at a scale above {HUGE_SCALE:.0e} "
                   f"({', '.join(repr(t) for t in names[:2])}{', ...' if len(names) > 2 else ''}): their range holds "
                   f"a mask's fill (float32's lowest), so every other value of them rounds to the zero point, {where}")
        if names:
            warn_once(message)


def import_quantized(model: onnx.ModelProto, label: str, *, accel_adds: bool = True) -> Graph:
    """The quantized :class:`~..ir.Graph` of the pre-quantized ``model`` (static input shapes already fixed), with its
    own scales and zero points (see the module docstring). ``accel_adds``: turn the adds that allow it into the
    accelerator's QAdd (False: every add stays an exact ``QAffine`` on the CPU). Raises
    :class:`.onnx_frontend.UnsupportedOperatorError` (one :class:`.onnx_frontend.UnsupportedModelError` listing every
    node when several) for what it cannot take."""
    imp = _Importer(model, label)
    init = set(imp.consts)
    for vi in model.graph.input:
        if vi.name in init:
            continue
        kind = vi.type.tensor_type.elem_type
        if kind != onnx.TensorProto.FLOAT and kind not in _INTEGER_INPUTS:
            raise GraphError(f"Graph input {vi.name!r} of the quantized model {label} is "
                             f"{onnx.TensorProto.DataType.Name(kind)}; the lab's quantized graphs take float32 inputs "
                             f"(quantized by a QuantizeLinear) and integer ones (token ids, attention masks).")
        shape = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        imp.graph.add_tensor(vi.name, shape, "float32" if kind == onnx.TensorProto.FLOAT else "int64")
        imp.graph.inputs.append(vi.name)
        if kind != onnx.TensorProto.FLOAT:
            imp.int_inputs.add(vi.name)
    _integer_input_regions(imp, model)
    problems: list[UnsupportedOperatorError] = []
    for node in model.graph.node:
        if id(node) in imp.skip:
            continue
        rule = RULES.get(node.op_type)
        try:
            if rule is None or node.domain not in ("", "ai.onnx", "com.microsoft"):
                raise UnsupportedOperatorError(node.op_type, node.name, "no rule imports it in a quantized model")
            rule(imp, node)
            imp.settle()
        except UnsupportedOperatorError as err:
            problems.append(err)
            imp.refused.update(node.output)
        except _Refused:
            imp.refused.update(node.output)
    try:
        _dequantize_outputs(imp)
    except UnsupportedOperatorError as err:
        problems.append(err)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise UnsupportedModelError(label, problems)
    _warn_huge_scales(imp, model, label)
    _fuse_clips(imp.graph)
    _drop_unread(imp.graph)
    if accel_adds:
        _accelerate_adds(imp.graph)
    imp.graph.prune_constants()
    imp.graph.validate()
    return imp.graph
