"""A partially quantized ONNX file, completed so that the integer import (:mod:`.prequant`) takes it.

Quantizers leave operators float on purpose or by their rules: onnxruntime's ``quantize_static`` with
``nodes_to_exclude`` (a sensitive first or last layer) or ``op_types_to_quantize`` (only the convolutions), or a
quantizer that skips an operator it does not handle. Such a file has the quantizer's integers almost everywhere, and
*float islands*: a Conv or Gemm whose weights are float, a float activation no QuantizeLinear reads (a graph input
straight into an excluded Conv; a residual Add computed in float; a graph output written by a float Gemm).

The accelerator computes in int8 only, so an island has to be quantized somewhere. Before this module the whole file
fell back to its dequantized float graph, re-quantized at the lab's scales, so the quantizer's own integers were lost
everywhere. :func:`complete` instead quantizes only what the file left float, the way the lab quantizes a float model
(symmetric int8, zero point 0), and leaves every QuantizeLinear/DequantizeLinear of the file as it is:

* a float **weight** of a Conv, Gemm or MatMul (an initializer read as input 1) becomes ``DequantizeLinear`` of int8
  values at one scale per output channel, ``max|w_c| / 127`` (per tensor below opset 13, whose DequantizeLinear has
  no axis); a float bias stays float (the import converts it);
* a float **constant of several values** an ``Add``, ``Sub``, ``Mul`` or ``Div`` reads beside an activation (a
  LayerNorm's gamma and beta written out as Mul and Add, a position table added to the tokens: what a quantizer that
  puts QuantizeLinear/DequantizeLinear pairs only before its matrix products leaves float), or a ``Concat`` joins to
  activations (ViT's class token before the patches), becomes ``DequantizeLinear`` of int8 values at one scale,
  ``max|c| / 127``, as onnxruntime quantizes such an input; a constant of one value stays float (the import folds
  it into the operator's table);
* an integer weight whose values minus its zero point do not fit int8 (uint8 weights of a zero point other than 128,
  onnxruntime's ``weight_type=QUInt8``; a DequantizeLinear's or a QOperator node's own) is re-quantized to
  symmetric int8 from its real values, at the same granularity (per channel or per tensor);
* a float **activation** a node computes, or a float graph input, that some non-QuantizeLinear node reads or that is
  a graph output (but not one a Relu or Clip alone reads: that one's result is quantized instead, as the import
  fuses an operator, its activation and the QuantizeLinear). When the file quantizes it already (a QuantizeLinear
  reads it), its other readers read a DequantizeLinear of that QuantizeLinear; else it gets a
  QuantizeLinear/DequantizeLinear pair at ``absmax / 127``, the largest magnitude :func:`measure_ranges` saw on the
  calibration samples (onnxruntime on the file itself, with the island tensors as extra outputs). A graph output
  keeps its name on the pair's DequantizeLinear.

Values the file quantized already are left alone: DequantizeLinear outputs, and what :data:`ALIAS_OPS` make of them
(the integer import reads those as the same integers). Constants and the shape arithmetic of constants are not
activations, and neither is what integer graph inputs compute with constants alone (an attention mask's
arithmetic, which the integer import computes as the file does: ``prequant._integer_input_regions``). A ``Shape``
or ``Size`` reader keeps reading the float tensor.

Before planning, ``prequant.complete_partial`` fuses each decomposition the file left wholly float (a LayerNorm's
ReduceMean, Sub, Pow, Sqrt, Div...) into the one operator the float import would make of it
(``onnx_fusions._fuse_decompositions``), so it is quantized at its input and output rather than at every step; one
the file quantized in part (onnxruntime at opset 14: the variance and the quotient, not the squares) loses its inner
pairs first (``prequant._unquantize_partial_decompositions``) and is fused the same way.

So the run computes the file's integers wherever the file has them, and the lab's own quantization in the islands
(where onnxruntime computes in float); the report says what the lab quantized (:attr:`Completion.summary`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .contrib import static_shapes
from .dequantize import along_axis

__all__ = ["ALIAS_OPS", "Completion", "plan_completion", "complete", "measure_ranges", "unquantize_infinite",
           "drop_pairs"]

ALIAS_OPS = frozenset({"Relu", "Clip", "MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
                       "Identity", "Dropout"})
"""Operators whose result, of a DequantizeLinear'd value, the integer import reads as the same integers."""

_DYNAMIC = frozenset({"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "MatMulIntegerToFloat",
                      "DynamicQuantizeMatMul", "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized",
                      "DynamicQuantizeLSTM"})
"""Dynamic and weight-only quantization: scales computed at run time or weights alone quantized, no static ranges to
complete (the float import takes such files)."""
_SHAPE_READERS = frozenset({"Shape", "Size"})
_QUANT = frozenset({"QuantizeLinear", "DequantizeLinear"})
_WEIGHTED = {"Conv": 0, "Gemm": None, "MatMul": 1}
"""Operators whose input 1 may be a float weight, and the weight's output-channel axis (Gemm: by ``transB``)."""
_BINARY = frozenset({"Add", "Sub", "Mul", "Div"})
"""Element-wise operators whose float constant operand of several values is quantized per tensor."""

SUFFIX = "__lab"
"""Names of the tensors and nodes :func:`complete` adds end ``SUFFIX`` and a tag."""


@dataclass
class Completion:
    """What :func:`complete` would change in a file (:func:`plan_completion`).

    ``ranges``: the float activations that need a calibrated range (a new QuantizeLinear/DequantizeLinear pair each),
    in graph order; ``reused``: float activations the file quantizes already, read float elsewhere (their other
    readers then read the file's quantization); ``weights``: ``(node index, weight name, axis or None)`` of the float
    weights and element-wise constants to quantize (``None``: per tensor)."""

    ranges: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    weights: list[tuple[int, str, int | None]] = field(default_factory=list)
    narrowed: list[int] = field(default_factory=list)
    """Indices of the nodes reading integer weights whose values minus their zero point do not fit int8 (a uint8
    weight of zero point 100 holds up to 155): a DequantizeLinear, or a QOperator node's own weights
    (:data:`_WEIGHT_SLOTS`); re-quantized to symmetric int8 from their real values."""

    @property
    def empty(self) -> bool:
        return not (self.ranges or self.reused or self.weights or self.narrowed)

    @property
    def summary(self) -> str:
        """What the lab quantizes, for the report: ``"2 float weights and 3 float activations quantized by the lab"``
        (and how many float reads of activations the file quantizes take its quantization)."""
        parts = []
        if self.weights:
            parts.append(f"{len(self.weights)} float weight{'s' * (len(self.weights) != 1)}")
        if self.ranges:
            parts.append(f"{len(self.ranges)} float activation{'s' * (len(self.ranges) != 1)}")
        text = " and ".join(parts) + " quantized by the lab" if parts else ""
        if self.narrowed:
            one = len(self.narrowed) == 1
            more = (f"{len(self.narrowed)} integer weight{'' if one else 's'} re-quantized to int8 "
                    f"({'its values minus its zero point do' if one else 'their values minus zero point do'} not fit "
                    f"int8)")
            text = f"{text}; {more}" if text else more
        if self.reused:
            more = (f"{len(self.reused)} activation{'s' * (len(self.reused) != 1)} the file quantizes, read "
                    f"float elsewhere, read through its quantization")
            text = f"{text}; {more}" if text else more
        return text


def _opset(model: onnx.ModelProto) -> int:
    return next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type by tensor name, where the file (after shape inference) states one."""
    types: dict[str, int] = {}
    for vi in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def plan_completion(model: onnx.ModelProto) -> Completion:
    """What :func:`complete` changes in ``model`` (shapes inferred, constants folded: as :mod:`.prequant` imports
    it); an empty :class:`Completion` when the file has no float island, or is not statically quantized. One pass in
    graph order: a float activation that gets a quantization is a quantized value for the nodes after it (a Reshape
    of it is an alias, not another island)."""
    graph = model.graph
    initializers = _initializers(model)
    types = _elem_types(model)
    shapes = static_shapes(model)
    consts = set(initializers)                # every value of constants alone: shape arithmetic, DequantizeLinear
    for node in graph.node:                   # of initializers (graph order: inputs before their readers)
        data = [name for name in node.input if name]
        if node.op_type == "Constant" or (data and all(name in consts for name in data)):
            consts.update(o for o in node.output if o)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                readers.setdefault(name, []).append(node)
    if any(node.op_type in _DYNAMIC for node in graph.node) or \
            not any(node.op_type == "QuantizeLinear" and node.input[0] not in initializers for node in graph.node):
        return Completion()                   # not statically quantized: nothing of the quantizer's to keep
    outputs = {o.name for o in graph.output}
    quantized: set[str] = set()          # float values quantized: DequantizeLinear outputs, aliases, completed ones
    dequantized: dict[str, int] = {}     # DequantizeLinear output of an initializer -> that node's index
    plan = Completion()

    def activation(name: str, producer: onnx.NodeProto | None = None) -> None:
        if name in consts or name in quantized or types.get(name) != TensorProto.FLOAT:
            return
        users = readers.get(name, [])
        if producer is not None and producer.op_type == "MatMul" and name not in outputs and len(users) == 1 and \
                _is_bias(users[0], name, consts, shapes):
            return                    # a Linear's bias Add: the import takes the bias into the MatMul, as a Gemm's
        float_users = [u for u in users if u.op_type not in _SHAPE_READERS and
                       not (u.op_type == "QuantizeLinear" and u.input[0] == name)]
        if not float_users and name not in outputs:
            return
        if name not in outputs and len(users) == 1 and users[0].op_type in ("Relu", "Clip"):
            return                    # quantized after the activation, as the import fuses Conv -> Relu -> Q
        quantized.add(name)
        if any(u.op_type == "QuantizeLinear" and u.input[0] == name for u in users):
            plan.reused.append(name)
        else:
            plan.ranges.append(name)

    derived = {vi.name for vi in graph.input if types.get(vi.name) not in (None, TensorProto.FLOAT)}
    masks: set[str] = set()              # the file's quantization of them: QuantizeLinear, DequantizeLinear outputs
    for vi in graph.input:
        if vi.name not in initializers:
            activation(vi.name)
    for k, node in enumerate(graph.node):
        data = [name for name in node.input if name]
        if node.op_type == "QuantizeLinear" and data and data[0] in derived or \
                node.op_type == "DequantizeLinear" and data and data[0] in masks:
            masks.update(o for o in node.output if o)            # a mask the file quantizes
        lookup = _lookup(node, initializers, dequantized, graph)
        if lookup == "integers" and node.input[1] in derived:
            quantized.update(o for o in node.output if o)        # the import's Embedding of the table's integers
            continue
        if node.op_type not in _QUANT and any(name in derived for name in data) and \
                all(name in derived or name in consts for name in data) and lookup is None:
            derived.update(o for o in node.output if o)          # an attention mask's arithmetic: the import's
            continue
        if node.op_type == "DequantizeLinear" and data and data[0] in initializers:
            dequantized[node.output[0]] = k                      # a weight (or bias) the file quantized
        if node.op_type == "Constant" or (data and all(name in consts for name in data)):
            continue                                             # shape arithmetic of constants
        if node.op_type == "DequantizeLinear" or (node.op_type in ALIAS_OPS and data and data[0] in quantized):
            quantized.update(o for o in node.output if o)
            continue
        axis = _WEIGHTED.get(node.op_type, -1)
        if node.domain in ("", "ai.onnx") and axis != -1 and len(node.input) > 1 and node.input[1] in dequantized:
            k_dq = dequantized[node.input[1]]
            if k_dq not in plan.narrowed and _too_wide(graph.node[k_dq], initializers):
                plan.narrowed.append(k_dq)
        if node.op_type in _WEIGHT_SLOTS and node.op_type != "DequantizeLinear" and _too_wide(node, initializers):
            plan.narrowed.append(k)                              # a QOperator node's own weights
        if node.domain in ("", "ai.onnx") and axis != -1 and len(node.input) > 1:
            w = initializers.get(node.input[1])
            if w is not None and w.data_type == TensorProto.FLOAT:
                if node.op_type == "Gemm":
                    axis = 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
                if (node.op_type != "Conv" and len(w.dims) != 2) or _opset(model) < 13:
                    axis = None                                 # a batched MatMul constant: per tensor
                plan.weights.append((k, node.input[1], axis))
        if node.domain in ("", "ai.onnx") and node.op_type in _BINARY and len(data) == 2:
            for name, other in (data, data[::-1]):
                c = initializers.get(name)
                if c is not None and c.data_type == TensorProto.FLOAT and int(np.prod(c.dims)) > 1 and \
                        other not in consts:
                    plan.weights.append((k, name, None))      # a gamma, a beta, a position table: per tensor
        if node.domain in ("", "ai.onnx") and node.op_type == "Concat" and any(name not in consts for name in data):
            for name in dict.fromkeys(data):                         # ViT's class token before the patches
                c = initializers.get(name)
                if c is not None and c.data_type == TensorProto.FLOAT and int(np.prod(c.dims)) > 1:
                    plan.weights.append((k, name, None))
        if _masked_scores(node, derived | masks, readers):
            continue                  # scores plus a mask: float into the Softmax, which takes the mask as a term
        if node.op_type not in _QUANT:
            for name in node.output:
                if name:
                    activation(name, node)
    return plan


def _lookup(node: onnx.NodeProto, initializers: Mapping[str, onnx.TensorProto], dequantized: Mapping[str, int],
            graph: onnx.GraphProto) -> str | None:
    """How ``node`` looks rows up in a table, its result an activation and not a mask's arithmetic though its ids
    may come from an integer input: ``"float"`` in a float table of rank 2 or more (an embedding a quantizer left
    float) or a DequantizeLinear of an integer table per row (NNCF's transformer preset), which the completion
    quantizes after the lookup; ``"integers"`` in a table dequantized per tensor (the import's Embedding of its
    integers as they are, quantized already); None for anything else."""
    if node.op_type != "Gather" or len(node.input) < 2:
        return None
    if node.input[0] in dequantized:
        dq = graph.node[dequantized[node.input[0]]]
        scale = initializers.get(dq.input[1]) if len(dq.input) > 1 else None
        if scale is None:
            return None
        return "float" if int(np.prod(scale.dims)) > 1 else "integers"
    table = initializers.get(node.input[0])
    return "float" if table is not None and table.data_type == TensorProto.FLOAT and len(table.dims) >= 2 else None


def _masked_scores(node: onnx.NodeProto, derived: set[str], readers: Mapping[str, list[onnx.NodeProto]]) -> bool:
    """``node`` adds an attention mask (a value computed from integer inputs and constants alone: ``derived``) to
    activations (the scores), and only Softmax nodes read the sum: the sum stays float, since its range holds the
    mask's fill (-inf, or float32's lowest), which no scale of int8 keeps beside the scores. The integer import takes
    it as the Softmax's additive mask term (``prequant._qdq_softmax``)."""
    if node.op_type != "Add" or len(node.input) != 2 or node.domain not in ("", "ai.onnx"):
        return False
    masks = [name for name in node.input if name in derived]
    users = readers.get(node.output[0], [])
    return len(masks) == 1 and bool(users) and all(u.op_type == "Softmax" for u in users)


def _is_bias(add: onnx.NodeProto, name: str, consts: set[str], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """``add`` adds to the MatMul result ``name`` a constant of one value per output feature (shape ``[O]``, or
    ``[1, ..., O]``): a bias, which the integer import takes into the MatMul (``prequant._bias_add``)."""
    if add.op_type != "Add" or len(add.input) != 2:
        return False
    other = add.input[1] if add.input[0] == name else add.input[0]
    x, b = shapes.get(name), shapes.get(other)
    return other != name and other in consts and x is not None and b is not None and len(b) >= 1 and \
        b[-1] == x[-1] and int(np.prod(b)) == x[-1]


def _initializers(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The initializers by name, and the integers of each QuantizeLinear of a constant at constant per-tensor
    parameters (what onnxruntime's quantizer writes for a weight several layers share, ALBERT's: ``Identity`` of the
    dequantized weight, quantized again as if it were an activation), under that QuantizeLinear's output name:
    computed as ONNX defines it (round half to even, saturated to the output type). A constant is a float
    initializer, a DequantizeLinear of initializers, or an Identity of a constant."""
    inits = {init.name: init for init in model.graph.initializer}
    reals = {name: numpy_helper.to_array(t).astype(np.float64) for name, t in inits.items()
             if t.data_type == TensorProto.FLOAT}
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input[0] in reals:
            reals[node.output[0]] = reals[node.input[0]]
            continue
        if node.op_type == "DequantizeLinear":
            params = _slot_params(node, inits)
            if params is not None:
                reals[node.output[0]] = (params[0] - params[2]) * params[1]
            continue
        names = list(node.input) + [""] * (3 - len(node.input))
        if node.op_type != "QuantizeLinear" or names[0] not in reals or names[1] not in inits or \
                (names[2] and names[2] not in inits) or any(a.name == "axis" for a in node.attribute):
            continue
        scale = numpy_helper.to_array(inits[names[1]]).astype(np.float64)
        zero = numpy_helper.to_array(inits[names[2]]) if names[2] else np.zeros((), np.uint8)
        if scale.size != 1 or zero.size != 1 or zero.dtype not in (np.uint8, np.int8) or \
                not (np.isfinite(scale) & (scale > 0)).all():
            continue
        info = np.iinfo(zero.dtype)
        q = np.clip(np.rint(reals[names[0]] / float(scale.reshape(-1)[0])) + int(zero.reshape(-1)[0]), info.min,
                    info.max)
        inits[node.output[0]] = numpy_helper.from_array(q.astype(zero.dtype), node.output[0])
    return inits


_WEIGHT_SLOTS = {"DequantizeLinear": 0, "QLinearConv": 3, "QLinearMatMul": 3, "QGemm": 3}
"""Where an operator reads integer weights, their scale and zero point (three inputs in a row)."""
_BIAS_SLOTS = {"QLinearConv": 8, "QGemm": 6}
"""Where an operator of :data:`_WEIGHT_SLOTS` reads its int32 bias, at its input's scale times its weights'."""


def _slot_params(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """(int64 values, float64 scale, int64 zero point, axis) of the integer weights ``node`` reads (a
    DequantizeLinear's input, or a QOperator node's weight input: :data:`_WEIGHT_SLOTS`), the scale and zero point
    shaped to broadcast against the values (blocked ones, opset 21's ``block_size``, repeated to the values' shape);
    None when they are not initializers, or their blocks do not fit the values."""
    at = _WEIGHT_SLOTS[node.op_type]
    names = list(node.input[at:at + 3]) + [""] * (3 - len(node.input[at:at + 3]))
    if names[0] not in inits or names[1] not in inits or (names[2] and names[2] not in inits):
        return None
    values = numpy_helper.to_array(inits[names[0]]).astype(np.int64)
    scale = numpy_helper.to_array(inits[names[1]]).astype(np.float64)
    zero = numpy_helper.to_array(inits[names[2]]).astype(np.int64) if names[2] else np.zeros_like(scale, np.int64)
    if node.op_type == "DequantizeLinear":
        axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 1)
    elif node.op_type == "QGemm":
        axis = 0 if any(a.name == "transB" and a.i for a in node.attribute) else 1
    else:
        axis = 0 if node.op_type == "QLinearConv" else -1
    axis %= max(values.ndim, 1)
    block = next((int(a.i) for a in node.attribute if a.name == "block_size"), 0) \
        if node.op_type == "DequantizeLinear" else 0
    params = along_axis(values.shape, scale, zero, axis, block)   # opset 21's blocks: one per `block` values
    if params is None:
        return None
    return values, params[0], params[1], axis


def _too_wide(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> bool:
    """Whether the integer weights ``node`` reads, minus their zero point, leave int8."""
    params = _slot_params(node, inits)
    if params is None or params[0].ndim < 2:
        return False
    centred = params[0] - params[2]
    return bool(centred.min(initial=0) < -128 or centred.max(initial=0) > 127)


def measure_ranges(model: onnx.ModelProto, names: list[str],
                   samples: Mapping[str, np.ndarray] | Iterable[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """The largest magnitude of each float tensor ``names`` over the calibration ``samples`` (input name -> stacked
    samples along axis 0, fed one model batch at a time; or an iterable of such dicts), computed by onnxruntime on
    ``model`` itself with those tensors as extra outputs, its QuantizeLinear/DequantizeLinear pairs of an infinite
    scale left out (:func:`unquantize_infinite`: onnxruntime would compute NaN from an attention mask's pair on, so
    every range after it would be garbage). Raises RuntimeError (naming onnxruntime's reason) when onnxruntime
    cannot run the file."""
    import onnxruntime as ort
    probe = onnx.ModelProto.FromString(model.SerializeToString())
    unquantize_infinite(probe)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names
                              if n not in have)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 -- onnxruntime raises its own exception types
        raise RuntimeError(f"onnxruntime could not load the file to measure its float activations: "
                           f"{str(err).splitlines()[0][:300]}") from err
    from .quantize import ORT_TYPES
    feeds = {i.name: i.shape for i in session.get_inputs()}
    types = {i.name: ORT_TYPES.get(i.type, np.float32) for i in session.get_inputs()}
    batches = [samples] if isinstance(samples, Mapping) else samples
    absmax = dict.fromkeys(names, 0.0)
    for batch in batches:
        arrays: dict[str, np.ndarray] = {k: np.asarray(v, types[k]) for k, v in batch.items() if k in feeds}
        count = len(next(iter(arrays.values()))) if arrays else 0
        step = max(1, int(feeds[next(iter(arrays))][0]) if arrays and isinstance(feeds[next(iter(arrays))][0], int)
                   else 1)
        for start in range(0, count, step):
            try:
                got = session.run(names, {k: v[start:start + step] for k, v in arrays.items()})
            except Exception as err:  # noqa: BLE001
                raise RuntimeError(f"onnxruntime could not run the file to measure its float activations: "
                                   f"{str(err).splitlines()[0][:300]}") from err
            for name, value in zip(names, got):
                value = np.asarray(value, np.float64)
                if value.size:
                    absmax[name] = max(absmax[name], float(np.abs(value[np.isfinite(value)]).max(initial=0.0)))
    return absmax


def unquantize_infinite(model: onnx.ModelProto, constants_only: bool = False) -> None:
    """In place: each QuantizeLinear whose scale holds inf or NaN and whose readers are all DequantizeLinear goes,
    with those readers, whose readers then read its float input: the tensor stays float, as the integer import
    leaves onnxruntime's quantization of an attention mask (``prequant._unquantized_mask``). ``constants_only``:
    only where the quantized tensor is computed from initializers alone (T5's relative-position buckets, whose
    ``log(0) = -inf`` onnxruntime's calibration saw: folded at scale inf, the bucket indices were garbage)."""
    from .dequantize import _constant
    from .onnx_fusions import _OnnxGraph
    g = _OnnxGraph(model)

    def infinite(node: onnx.NodeProto) -> bool:
        scale = g.consts.get(node.input[1]) if len(node.input) > 1 else None
        return scale is not None and scale.dtype == np.float32 and not np.isfinite(scale).all() and \
            (not constants_only or _constant(node.input[0], g.producer, set(g.consts)))

    drop_pairs(model, infinite)


def drop_pairs(model: onnx.ModelProto, which: Callable[[onnx.NodeProto], bool]) -> None:
    """In place: each QuantizeLinear ``which`` accepts whose readers are all DequantizeLinear (none a graph output)
    goes with them, and their readers read its float input."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for t in node.input:
            readers.setdefault(t, []).append(node)
    outputs = {o.name for o in model.graph.output}
    rename: dict[str, str] = {}
    gone: set[str] = set()
    for node in model.graph.node:
        if node.op_type != "QuantizeLinear" or not which(node):
            continue
        users = readers.get(node.output[0], [])
        if not users or any(u.op_type != "DequantizeLinear" or u.output[0] in outputs for u in users):
            continue
        gone.update([node.output[0], *(u.output[0] for u in users)])
        rename.update({u.output[0]: node.input[0] for u in users})
    if not gone:
        return
    kept = [onnx.NodeProto.FromString(n.SerializeToString()) for n in model.graph.node
            if not (n.output and n.output[0] in gone)]
    for node in kept:
        node.input[:] = [rename.get(t, t) for t in node.input]
    del model.graph.node[:]
    model.graph.node.extend(kept)


def _scale_init(name: str, values: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def _topological(nodes: list[onnx.NodeProto], ready: set[str]) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each reads only tensors written before it (or in ``ready``): passes over the
    nodes left, each taking those whose inputs are written, in their given order. A node that never becomes ready
    (a dangling input) goes last, for the import to name."""
    order: list[onnx.NodeProto] = []
    have, left = set(ready), list(nodes)
    while left:
        rest = []
        for node in left:
            if all(not name or name in have for name in node.input):
                order.append(node)
                have.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(left):
            return order + rest
        left = rest
    return order


def complete(model: onnx.ModelProto, plan: Completion, absmax: Mapping[str, float]) -> onnx.ModelProto:
    """A copy of ``model`` with ``plan`` carried out (see the module docstring): ``absmax`` gives the range of each
    tensor of ``plan.ranges`` (a range of 0, a tensor that was always 0, takes the scale 1/127). Raises ValueError
    naming a tensor whose range is missing or not finite."""
    bad = [n for n in plan.ranges if not np.isfinite(absmax.get(n, np.nan))]
    if bad:
        raise ValueError(f"no finite range was measured for the float tensor(s) {', '.join(map(repr, bad[:5]))}")
    out = onnx.ModelProto.FromString(model.SerializeToString())
    graph = out.graph
    inits = _initializers(out)
    zero = numpy_helper.from_array(np.zeros((), np.int8), f"zero{SUFFIX}")
    extra: list[onnx.TensorProto] = [zero]
    added: list[onnx.NodeProto] = []
    for k, name, axis in plan.weights:
        w = numpy_helper.to_array(inits[name]).astype(np.float64)
        if axis is None:
            peak = np.array(np.abs(w).max(initial=0.0))
        else:
            peak = np.abs(np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)).max(axis=1, initial=0.0)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        shape = [1] * w.ndim
        if axis is not None:
            shape[axis] = -1
        q = np.clip(np.rint(w / scale.reshape(shape).astype(np.float64)), -127, 127).astype(np.int8)
        base = f"{name}{SUFFIX}_w{k}"
        extra += [numpy_helper.from_array(q, f"{base}_int8"), _scale_init(f"{base}_scale", scale),
                  numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{base}_zero")]
        dq = helper.make_node("DequantizeLinear", [f"{base}_int8", f"{base}_scale", f"{base}_zero"], [base],
                              name=f"{base}_dequantize")
        if axis is not None:
            dq.attribute.append(helper.make_attribute("axis", int(axis)))
        added.append(dq)
        node = graph.node[k]
        for i, read in enumerate(node.input):
            if read == name:
                node.input[i] = base
    for k in plan.narrowed:
        node = graph.node[k]
        params = _slot_params(node, inits)
        assert params is not None
        values, scale, zp, axis = params
        real = (values - zp) * scale
        per = scale.size > 1
        peak = np.abs(np.moveaxis(real, axis, 0).reshape(real.shape[axis], -1)).max(axis=1) if per else \
            np.array(np.abs(real).max())
        new_scale = np.where(peak > 0, peak / 127.0, 1.0)
        shape = [1] * real.ndim
        if per:
            shape[axis] = -1
        q = np.clip(np.rint(real / new_scale.reshape(shape)), -127, 127).astype(np.int8)
        base = f"{node.output[0]}{SUFFIX}_n{k}"
        extra += [numpy_helper.from_array(q, f"{base}_int8"), _scale_init(f"{base}_scale", new_scale),
                  numpy_helper.from_array(np.zeros(new_scale.shape, np.int8), f"{base}_zero")]
        at = _WEIGHT_SLOTS[node.op_type]
        node.input[at:at + 3] = [f"{base}_int8", f"{base}_scale", f"{base}_zero"]
        slot = _BIAS_SLOTS.get(node.op_type)     # an int32 bias is in units of input scale x weight scale: rescaled
        if slot is not None and len(node.input) > slot and node.input[slot] in inits:
            bias = numpy_helper.to_array(inits[node.input[slot]]).astype(np.float64)
            ratio = (np.asarray(scale, np.float64).reshape(-1) / new_scale.reshape(-1)).reshape(-1)
            moved = np.clip(np.rint(bias * (ratio if ratio.size == bias.size or ratio.size == 1 else ratio[0])),
                            -2**31, 2**31 - 1).astype(np.int32)
            extra.append(numpy_helper.from_array(moved, f"{base}_bias"))
            node.input[slot] = f"{base}_bias"
    inputs = {vi.name for vi in graph.input}
    producer = {o: node for node in graph.node for o in node.output if o}
    alias: dict[str, str] = {}                  # graph input -> the DequantizeLinear output its readers take
    floats: dict[str, str] = {}                 # produced tensor -> its float value's new name (the DQ takes the old)
    for name in [*plan.reused, *plan.ranges]:
        if name in inputs:
            alias[name] = f"{name}{SUFFIX}_dq"
        else:
            floats[name] = f"{name}{SUFFIX}_float"
            node = producer[name]
            node.output[:] = [floats[name] if o == name else o for o in node.output]
    quantizers: dict[str, onnx.NodeProto] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            keep_float = node.op_type in _SHAPE_READERS or (node.op_type == "QuantizeLinear" and i == 0)
            if name in floats and keep_float:
                node.input[i] = floats[name]
            elif name in alias and not keep_float:
                node.input[i] = alias[name]
            if node.op_type == "QuantizeLinear" and i == 0 and name in plan.reused:
                quantizers.setdefault(name, node)
    for name in plan.reused:
        quant = quantizers[name]
        dq = helper.make_node("DequantizeLinear", [quant.output[0], *quant.input[1:]], [alias.get(name, name)],
                              name=f"{name}{SUFFIX}_reuse")
        dq.attribute.extend(a for a in quant.attribute if a.name == "axis")
        added.append(dq)
    for name in plan.ranges:
        top = float(absmax[name])
        scale_init = _scale_init(f"{name}{SUFFIX}_scale", np.array(top / 127.0 if top > 0 else 1.0 / 127.0))
        extra.append(scale_init)
        q_out = f"{name}{SUFFIX}_q"
        added += [helper.make_node("QuantizeLinear", [floats.get(name, name), scale_init.name, zero.name], [q_out],
                                   name=f"{name}{SUFFIX}_quantize"),
                  helper.make_node("DequantizeLinear", [q_out, scale_init.name, zero.name], [alias.get(name, name)],
                                   name=f"{name}{SUFFIX}_dequantize")]
    ready = inputs | {init.name for init in graph.initializer} | {init.name for init in extra}
    nodes = _topological([*added, *graph.node], ready)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(extra)
    return out
