"""onnxruntime's contrib operators (domain ``com.microsoft``) rewritten into standard ONNX nodes before import.

``onnxruntime.transformers.optimizer.optimize_model`` fuses a transformer's subgraphs into Microsoft operators
(SkipLayerNormalization, BiasGelu, FastGelu, Attention, ...). :func:`rewrite_contrib` replaces each one it supports
by the standard nodes the frontend's rules already import, so the quantizer, the partitioner and the accelerator
lowering see the graph an exporter would have written:

- Gelu, BiasGelu: (an Add of the bias, then) Gelu's Erf form; FastGelu (with or without bias): Gelu's Tanh form.
  Both are written as their element-wise decompositions, which the frontend fuses back into one Gelu node named as
  the contrib node (a Gelu node itself would lose its shape under the opset-17 shape inference).
- QuickGelu: ``x * Sigmoid(x * alpha)``, fused by the frontend into one Swish (as torch's SiLU is).
- SkipLayerNormalization: ``Add(input [+ bias], skip)`` then LayerNormalization over the last axis (at opsets below
  17 its ReduceMean/Sub/Pow/Sqrt/Div decomposition); the bias is added to whichever operand a MatMul writes, so
  it folds into that linear layer. The optional ``input_skip_bias_sum`` output is the Add's output.
- SimplifiedLayerNormalization (RMSNorm; onnxruntime registers it in the default ONNX domain, see
  :data:`ORT_DEFAULT_DOMAIN_OPS`) and SkipSimplifiedLayerNormalization (``Add(input [+ bias], skip)`` then
  RMSNorm): RMSNorm's decomposition over the last axis, fused back by the frontend into one RMSNorm named as the node.
- BiasAdd: two Adds. FusedMatMul: (Transposes,) MatMul (and a Mul by alpha, or alpha folded into a constant B).
- Attention (fused QKV weights ``[D, 3D]``) and MultiHeadAttention (separate Q, K, V ``[B, S, D]``): per-head
  Reshape/Transpose, MatMul of Q by K^T, Mul by the scale, Add of a constant additive mask (1-D end or end and start
  positions, a 2-D ``[B, L]`` or 3-D ``[B, S, L]`` 1/0 key mask, and ``unidirectional`` causal masking) and of
  Attention's ``attention_bias`` (constant, or computed at run time from a mask input), Softmax,
  MatMul by V, Transpose and Reshape back. Attention's three projections become three MatMuls ``[D, D]`` (with
  their biases) on the accelerator.

Everything else is refused, not rewritten: :func:`rewrite_contrib` returns, for every node left in a non-default
domain, a sentence saying what is unsupported (an input, an output, an attribute value, or the operator itself),
which the frontend's rules report with all other refused nodes of the model at once. Node names are kept: the
rewrite's main node (the LayerNormalization, the Gelu, the attention output) carries the contrib node's name and
the others ``<name>_<role>``, so report rows stay recognisable.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

__all__ = ["CONTRIB_DOMAIN", "ORT_DEFAULT_DOMAIN_OPS", "REWRITES", "Rewrite", "rewrite_contrib", "rewrite_nodes",
           "static_shapes", "elem_types", "ATTENTION_ATTRS", "attention_projections", "attend_heads", "MHA_ATTRS",
           "mha_projections", "lengths_mask"]

CONTRIB_DOMAIN = "com.microsoft"
ORT_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})
"""onnxruntime's own operators that it registers in the default ONNX domain (its transformer optimizer writes them
there); rewritten like the ``com.microsoft`` ones (and accepted in that domain too)."""


def _is_ort(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is onnxruntime's: of ``com.microsoft``, or one of :data:`ORT_DEFAULT_DOMAIN_OPS`."""
    return node.domain == CONTRIB_DOMAIN or (node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS)

_REFUSED_OPS: dict[str, str] = {}
"""com.microsoft operators refused with a reason of their own (rather than "no rewrite")."""


class _Refusal(Exception):
    """A contrib node the rewrite does not support; ``args[0]`` says what, in a clause."""


class _NeedsShape(_Refusal):
    """A contrib node whose rewrite needs a static shape not known yet (it may be after another node's rewrite)."""


class _Constants:
    """Initializers (each converted to an array when first read: a large model's weights are not copied on every
    rewrite round) and the values of Constant nodes, by tensor name."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.protos = {init.name: init for init in model.graph.initializer}
        self.arrays: dict[str, np.ndarray] = {}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.attribute and \
                    node.attribute[0].name == "value":
                self.arrays[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)

    def __contains__(self, name: object) -> bool:
        return name in self.arrays or name in self.protos

    def get(self, name: str) -> np.ndarray | None:
        if name not in self.arrays and name in self.protos:
            self.arrays[name] = numpy_helper.to_array(self.protos[name])
        return self.arrays.get(name)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {**{k: tuple(p.dims) for k, p in self.protos.items()}, **{k: v.shape for k, v in self.arrays.items()}}


class _Context:
    """The model being rewritten: its constants, the static shapes known before the rewrite, tensor producers, the
    names in use, and the nodes written for the contrib node at hand."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.consts = _Constants(model)
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self.producer = {out: node for node in model.graph.node for out in node.output}
        self.used = {t for node in model.graph.node for t in node.input} | {o.name for o in model.graph.output}
        self.names = set(self.producer) | set(self.consts.protos) | {i.name for i in model.graph.input}
        self.names |= {node.name for node in model.graph.node}
        shapes, self.types = _known_shapes(model)
        self.shapes = {**self.consts.shapes(), **shapes}
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.names:
            name, k = f"{base}_{k}", k + 1
        self.names.add(name)
        return name

    def const(self, base: str, value: np.ndarray | np.generic) -> str:
        name = self.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        self.consts.arrays[name] = np.asarray(value)
        return name

    def emit(self, op: str, inputs: list[str], name: str, output: str | None = None, **attrs: Any) -> str:
        """Append a default-domain node ``name`` (made unique); its output is ``output`` or a new tensor named after
        the node. Returns the output."""
        out = output or self.fresh(name)
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.fresh(name) if output else out, **attrs))
        return out

    def constant(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray | None:
        """Input ``index`` of ``node`` as an array (None when absent); refused when a node or the caller computes
        it."""
        if len(node.input) <= index or not node.input[index]:
            return None
        value = self.consts.get(node.input[index])
        if value is None:
            raise _Refusal(f"its {what} input {node.input[index]!r} is computed at run time; the lab needs it as a "
                           f"constant initializer")
        return value.astype(np.float64)

    def written_by_matmul(self, tensor: str) -> bool:
        node = self.producer.get(tensor)
        return node is not None and node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx")


Rewrite = Callable[[_Context, onnx.NodeProto], None]
"""A rewrite: appends the standard nodes that replace the node to ``ctx.nodes`` (and their constants to
``ctx.inits``), or raises :class:`_Refusal` saying what it does not support."""


_SMALL = 4096
"""Initializers of more elements (weights) are given to shape inference by type and shape only, not copied."""


def _known_shapes(model: onnx.ModelProto) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Static shapes ONNX's shape inference finds before the rewrite (none after a contrib node), and the element
    types (``onnx.TensorProto`` codes) it finds, inferred on a copy of the graph whose weights are declared inputs,
    so a rewrite round does not copy a large model's weights."""
    light = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    declared = {vi.name for vi in model.graph.input}
    for init in model.graph.initializer:
        if int(np.prod(init.dims)) <= _SMALL:
            graph.initializer.append(init)
        elif init.name not in declared:
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    try:
        inferred = shape_inference.infer_shapes(light)
    except Exception:  # noqa: BLE001 - a model ONNX cannot infer: no shapes, the rules say what is wrong later
        return {}, {}
    return static_shapes(inferred), elem_types(inferred)


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Value name -> ONNX element type, where the model (its inputs, outputs, value infos and initializers) says."""
    types = {vi.name: vi.type.tensor_type.elem_type for vi in
             list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
    types.update({i.name: i.data_type for i in model.graph.initializer})
    return types


def static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every value, input and output of ``model`` whose shape is known and fully static (every
    dimension a positive number): what shape inference left in the graph."""
    shapes = {}
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        dims = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
        if vi.type.tensor_type.HasField("shape") and all(d > 0 for d in dims):
            shapes[vi.name] = dims
    return shapes


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _check_attrs(node: onnx.NodeProto, known: set[str]) -> dict[str, Any]:
    a = _attrs(node)
    other = sorted(set(a) - known)
    if other:
        raise _Refusal(f"attribute{'s' if len(other) > 1 else ''} {', '.join(other)} (the rewrite reads "
                       f"{', '.join(sorted(known)) or 'none'})")
    return a


def _only_inputs(node: onnx.NodeProto, names: tuple[str, ...]) -> None:
    """Refuse inputs past ``names`` (the ones the rewrite reads), naming the first one given."""
    for k in range(len(names), len(node.input)):
        if node.input[k]:
            raise _Refusal(f"input {k} ({node.input[k]!r}); the rewrite reads {', '.join(names)}")


def _only_outputs(ctx: _Context, node: onnx.NodeProto, names: tuple[str, ...]) -> None:
    """Refuse an output past ``names`` that a node or the graph reads."""
    for k in range(len(names), len(node.output)):
        if node.output[k] and node.output[k] in ctx.used:
            raise _Refusal(f"output {k} ({node.output[k]!r}) is read; the rewrite computes only {', '.join(names)}")


def _main_name(node: onnx.NodeProto) -> str:
    return node.name or f"{node.op_type}_{node.output[0]}"


def _add_bias(ctx: _Context, node: onnx.NodeProto, x: str, index: int) -> str:
    """``x`` plus the node's constant bias input ``index`` (a ``[C]`` vector), or ``x`` without one."""
    if ctx.constant(node, index, "bias") is None:
        return x
    return ctx.emit("Add", [x, node.input[index]], f"{_main_name(node)}_bias")


# ---- Gelu ------------------------------------------------------------------------------------------------------------
def _gelu(ctx: _Context, x: str, node: onnx.NodeProto, approximate: str) -> None:
    """ONNX's Gelu of ``x`` into ``node``'s output, as the decomposition the frontend fuses back into one Gelu (its
    last node, and so the fused Gelu, named as ``node``)."""
    name = _main_name(node)
    f32 = np.float32
    if approximate == "tanh":
        cube = ctx.emit("Pow", [x, ctx.const(f"{name}_three", f32(3.0))], f"{name}_cube")
        cubic = ctx.emit("Mul", [cube, ctx.const(f"{name}_c", f32(0.044715))], f"{name}_cubic")
        inner = ctx.emit("Add", [x, cubic], f"{name}_inner")
        scaled = ctx.emit("Mul", [inner, ctx.const(f"{name}_k", f32(math.sqrt(2.0 / math.pi)))], f"{name}_scaled")
        core = ctx.emit("Tanh", [scaled], f"{name}_tanh")
    else:
        scaled = ctx.emit("Mul", [x, ctx.const(f"{name}_k", f32(1.0 / math.sqrt(2.0)))], f"{name}_scaled")
        core = ctx.emit("Erf", [scaled], f"{name}_erf")
    plus = ctx.emit("Add", [core, ctx.const(f"{name}_one", f32(1.0))], f"{name}_plus")
    half = ctx.emit("Mul", [x, plus], f"{name}_times")
    ctx.nodes.append(helper.make_node("Mul", [half, ctx.const(f"{name}_half", f32(0.5))], [node.output[0]],
                                      name=name))


def _quick_gelu(ctx: _Context, node: onnx.NodeProto) -> None:
    """QuickGelu: ``x * sigmoid(alpha * x)`` (alpha 1.702 by default), which the frontend fuses into one Swish."""
    a = _check_attrs(node, {"alpha"})
    _only_inputs(node, ("X",))
    name, x = _main_name(node), node.input[0]
    alpha = float(a.get("alpha", 1.702))
    scaled = x if alpha == 1.0 else ctx.emit("Mul", [x, ctx.const(f"{name}_alpha", np.float32(alpha))],
                                             f"{name}_scaled")
    gate = ctx.emit("Sigmoid", [scaled], f"{name}_sigmoid")
    ctx.nodes.append(helper.make_node("Mul", [x, gate], [node.output[0]], name=name))


def _gelu_rule(approximate: str, inputs: tuple[str, ...]) -> Callable[[_Context, onnx.NodeProto], None]:
    def rule(ctx: _Context, node: onnx.NodeProto) -> None:
        _check_attrs(node, set())
        _only_inputs(node, inputs)
        x = _add_bias(ctx, node, node.input[0], 1) if len(inputs) > 1 else node.input[0]
        _gelu(ctx, x, node, approximate)
    return rule


# ---- normalisation and adds ------------------------------------------------------------------------------------------
def _layer_norm(ctx: _Context, node: onnx.NodeProto, x: str, epsilon: float, gamma_index: int = 2) -> None:
    """LayerNormalization of ``x`` over the last axis by the node's gamma (input ``gamma_index``) and beta (the next
    input) into its output 0; below opset 17 the decomposition the frontend fuses into one."""
    gamma = ctx.constant(node, gamma_index, "gamma")
    beta = ctx.constant(node, gamma_index + 1, "beta")
    if gamma is None or gamma.ndim != 1 or (beta is not None and beta.shape != gamma.shape):
        raise _Refusal("gamma and beta must be 1-D vectors of the hidden size")
    name, out = _main_name(node), node.output[0]
    gamma_name = node.input[gamma_index]
    beta_name = node.input[gamma_index + 1] if beta is not None else \
        ctx.const(f"{name}_beta", np.zeros(gamma.shape, np.float32))
    if ctx.opset >= 17:
        ctx.nodes.append(helper.make_node("LayerNormalization", [x, gamma_name, beta_name], [out], name=name,
                                          axis=-1, epsilon=epsilon))
        return
    mean = ctx.emit("ReduceMean", [x], f"{name}_mean", axes=[-1])
    centred = ctx.emit("Sub", [x, mean], f"{name}_centred")
    square = ctx.emit("Pow", [centred, ctx.const(f"{name}_two", np.float32(2.0))], f"{name}_square")
    var = ctx.emit("ReduceMean", [square], f"{name}_var", axes=[-1])
    shifted = ctx.emit("Add", [var, ctx.const(f"{name}_eps", np.float32(epsilon))], f"{name}_shifted")
    std = ctx.emit("Sqrt", [shifted], f"{name}_std")
    normed = ctx.emit("Div", [centred, std], f"{name}_normed")
    scaled = ctx.emit("Mul", [normed, gamma_name], f"{name}_scaled")
    ctx.emit("Add", [scaled, beta_name], f"{name}_shift", output=out)


def _skip_layer_norm(ctx: _Context, node: onnx.NodeProto) -> None:
    """input + skip (+ bias), LayerNorm over the last axis; outputs mean and inv_std_var refused when read."""
    a = _check_attrs(node, {"epsilon"})
    _only_inputs(node, ("input", "skip", "gamma", "beta", "bias"))
    _layer_norm(ctx, node, _skip_sum(ctx, node, 4, "LayerNorm"), float(a.get("epsilon", 1e-12)))


def _embed_layer_norm(ctx: _Context, node: onnx.NodeProto) -> None:
    """EmbedLayerNormalization: the word embeddings of the int32 ``input_ids``, plus the position embeddings (of
    ``position_ids`` when given, else of positions ``0..S-1``), plus the segment embeddings of ``segment_ids`` when
    given; LayerNorm of the sum. ``embedding_sum`` is the sum; ``mask_index`` (read by an Attention) each row's count
    of nonzero ``mask`` entries, as onnxruntime computes it (for either ``mask_index_type``)."""
    a = _check_attrs(node, {"epsilon", "mask_index_type"})
    names = ("input_ids", "segment_ids", "word_embedding", "position_embedding", "segment_embedding", "gamma",
             "beta", "mask", "position_ids")
    given = dict(zip(names, list(node.input) + [""] * (len(names) - len(node.input))))
    _only_inputs(node, names)
    name = _main_name(node)
    ids_shape = ctx.shapes.get(given["input_ids"])
    if ids_shape is None:
        raise _NeedsShape(f"input_ids {given['input_ids']!r} whose static shape [batch, tokens] is not known")
    if len(ids_shape) != 2:
        raise _Refusal(f"input_ids of shape {list(ids_shape)} (only [batch, tokens])")
    tables = {}
    for role in ("word_embedding", "position_embedding", "segment_embedding"):
        table = ctx.constant(node, names.index(role), role)
        if table is not None and table.ndim != 2:
            raise _Refusal(f"a {role} of shape {list(table.shape)} (only [rows, hidden])")
        tables[role] = table
    if tables["word_embedding"] is None or tables["position_embedding"] is None:
        raise _Refusal("no word_embedding or position_embedding input")
    if bool(given["segment_ids"]) != bool(given["segment_embedding"]):
        raise _Refusal("segment_ids without segment_embedding or the reverse")
    tokens = ids_shape[1]
    total = ctx.emit("Gather", [given["word_embedding"], given["input_ids"]], f"{name}_words")
    if given["position_ids"]:
        positions = ctx.emit("Gather", [given["position_embedding"], given["position_ids"]], f"{name}_positions")
    else:
        if tables["position_embedding"].shape[0] < tokens:
            raise _Refusal(f"{tokens} tokens for a position_embedding of {tables['position_embedding'].shape[0]} rows")
        positions = ctx.const(f"{name}_positions", tables["position_embedding"][None, :tokens].astype(np.float32))
    total = ctx.emit("Add", [total, positions], f"{name}_add_positions")
    if given["segment_ids"]:
        segments = ctx.emit("Gather", [given["segment_embedding"], given["segment_ids"]], f"{name}_segments")
        total = ctx.emit("Add", [total, segments], f"{name}_add_segments")
    if len(node.output) > 2 and node.output[2] and node.output[2] in ctx.used:
        ctx.nodes.append(helper.make_node("Identity", [total], [node.output[2]], name=ctx.fresh(f"{name}_sum")))
    if len(node.output) > 1 and node.output[1] and node.output[1] in ctx.used:
        if not given["mask"]:
            raise _Refusal("its mask_index output is read but it has no mask input (onnxruntime gives zeros)")
        nonzero = ctx.emit("Cast", [ctx.emit("Cast", [given["mask"]], f"{name}_mask_bool", to=TensorProto.BOOL)],
                           f"{name}_mask_ones", to=TensorProto.INT32)
        axis = ctx.const(f"{name}_mask_axis", np.array([1], np.int64))
        ctx.nodes.append(helper.make_node("ReduceSum", [nonzero, axis], [node.output[1]],
                                          name=ctx.fresh(f"{name}_mask_index"), keepdims=0))
    _layer_norm(ctx, node, total, float(a.get("epsilon", 1e-12)), gamma_index=5)


def _skip_sum(ctx: _Context, node: onnx.NodeProto, bias_index: int, norm: str) -> str:
    """A Skip(Simplified)LayerNormalization's ``input + skip (+ bias)`` (the bias, input ``bias_index``, folded
    into the linear layer that writes one of them when it can), written to output 3 when that is named; its mean
    and inv_std_var outputs refused when read (the lab's ``norm`` writes only Y)."""
    for k, what in ((1, "mean"), (2, "inv_std_var")):
        if len(node.output) > k and node.output[k] and node.output[k] in ctx.used:
            raise _Refusal(f"its {what} output {node.output[k]!r} is read (the lab's {norm} writes only Y)")
    x, skip = node.input[0], node.input[1]
    if ctx.written_by_matmul(skip) and not ctx.written_by_matmul(x):
        x, skip = skip, x                                # the bias folds into the linear layer that writes x
    biased = _add_bias(ctx, node, x, bias_index)
    total = node.output[3] if len(node.output) > 3 and node.output[3] else None
    return ctx.emit("Add", [biased, skip], f"{_main_name(node)}_skip", output=total)


def _rms_norm(ctx: _Context, node: onnx.NodeProto, x: str, gamma_index: int, epsilon: float) -> None:
    """RMSNorm of ``x`` over the last axis by the node's gamma (input ``gamma_index``) into its output 0, as the
    decomposition ``x / Sqrt(ReduceMean(x**2) + eps) * gamma`` that the frontend fuses back into one RMSNorm named as
    the node (:mod:`.rmsnorm`; no opset up to 22 has an RMSNorm operator)."""
    gamma = ctx.constant(node, gamma_index, "gamma")
    if gamma is None or gamma.ndim != 1:
        raise _Refusal("gamma must be a 1-D vector of the hidden size")
    name = _main_name(node)
    square = ctx.emit("Pow", [x, ctx.const(f"{name}_two", np.float32(2.0))], f"{name}_square")
    if ctx.opset >= 18:                                  # ReduceMean's axes: an input from opset 18
        mean = ctx.emit("ReduceMean", [square, ctx.const(f"{name}_axes", np.array([-1], np.int64))], f"{name}_mean")
    else:
        mean = ctx.emit("ReduceMean", [square], f"{name}_mean", axes=[-1])
    shifted = ctx.emit("Add", [mean, ctx.const(f"{name}_eps", np.float32(epsilon))], f"{name}_shifted")
    normed = ctx.emit("Div", [x, ctx.emit("Sqrt", [shifted], f"{name}_rms")], f"{name}_normed")
    ctx.emit("Mul", [normed, node.input[gamma_index]], name, output=node.output[0])
    ctx.nodes[-1].name = name                            # the fused RMSNorm takes the last node's name


def _simplified_layer_norm(ctx: _Context, node: onnx.NodeProto) -> None:
    """SimplifiedLayerNormalization: RMSNorm over the last axis; its inv_std_var output refused when read."""
    a = _check_attrs(node, {"axis", "epsilon", "stash_type"})
    _only_inputs(node, ("X", "scale"))
    _only_outputs(ctx, node, ("Y",))
    if int(a.get("axis", -1)) != -1:
        raise _Refusal(f"axis {a['axis']} (only -1, the last axis)")
    _rms_norm(ctx, node, node.input[0], 1, float(a.get("epsilon", 1e-5)))


def _skip_simplified_layer_norm(ctx: _Context, node: onnx.NodeProto) -> None:
    """input + skip (+ bias), RMSNorm over the last axis; outputs mean and inv_std_var refused when read."""
    a = _check_attrs(node, {"epsilon"})
    _only_inputs(node, ("input", "skip", "gamma", "bias"))
    _rms_norm(ctx, node, _skip_sum(ctx, node, 3, "RMSNorm"), 2, float(a.get("epsilon", 1e-12)))


def _bias_add(ctx: _Context, node: onnx.NodeProto) -> None:
    """BiasAdd: ``X + bias + skip``."""
    _check_attrs(node, set())
    _only_inputs(node, ("X", "bias", "skip"))
    biased = _add_bias(ctx, node, node.input[0], 1)
    ctx.emit("Add", [biased, node.input[2]], _main_name(node), output=node.output[0])
    ctx.nodes[-1].name = _main_name(node)


# ---- products ------------------------------------------------------------------------------------------------------
def _fused_matmul_perm(rank: int, trans: bool, trans_batch: bool) -> list[int] | None:
    """The axes order FusedMatMul reads an operand of ``rank`` axes in (None: as it is). ``trans_batch`` moves the
    first axis to just before the last (``[d1 .. d(r-2), d0, d(r-1)]``, measured against onnxruntime 1.32's kernel),
    then ``trans`` swaps the last two."""
    perm = list(range(rank))
    if trans_batch and rank > 2:
        perm = [*perm[1:rank - 1], 0, rank - 1]
    if trans:
        perm[-2:] = perm[-1], perm[-2]
    return None if perm == list(range(rank)) else perm


def _fused_matmul(ctx: _Context, node: onnx.NodeProto) -> None:
    """FusedMatMul: ``alpha * op(A) @ op(B)``, ``op`` reordering the axes where transA / transB (the last two
    swapped) or transBatchA / transBatchB (the first axis moved among the batch axes, :func:`_fused_matmul_perm`)
    is set. A constant operand is transposed (and B scaled by alpha) at import; an activation gets a Transpose, and
    alpha a Mul by a constant after the MatMul (named ``<node>_alpha``); the MatMul keeps the node's name."""
    a = _check_attrs(node, {"alpha", "transA", "transB", "transBatchA", "transBatchB"})
    _only_inputs(node, ("A", "B"))
    name, alpha, operands = _main_name(node), float(a.get("alpha", 1.0)), []
    for k, role in enumerate("AB"):
        flags = bool(a.get(f"trans{role}", 0)), bool(a.get(f"transBatch{role}", 0))
        tensor = node.input[k]
        value = ctx.consts.get(tensor)
        scale = alpha if k == 1 and value is not None else 1.0
        if value is not None and (any(flags) or scale != 1.0):
            perm = _fused_matmul_perm(value.ndim, *flags)
            value = np.transpose(value, perm) if perm else value
            tensor = ctx.const(f"{name}_{role.lower()}", (value * scale).astype(np.float32))
        elif any(flags):
            shape = ctx.shapes.get(tensor)
            if shape is None:
                raise _NeedsShape(f"trans{role} or transBatch{role} on an operand whose static shape is not known")
            perm = _fused_matmul_perm(len(shape), *flags)
            if perm:
                tensor = ctx.emit("Transpose", [tensor], f"{name}_{role.lower()}_t", perm=perm)
        operands.append(tensor)
    folded = node.input[1] in ctx.consts
    if alpha == 1.0 or folded:
        ctx.nodes.append(helper.make_node("MatMul", operands, [node.output[0]], name=name))
        return
    product = ctx.fresh(f"{name}_product")
    ctx.nodes.append(helper.make_node("MatMul", operands, [product], name=name))
    ctx.emit("Mul", [product, ctx.const(f"{name}_alpha", np.float32(alpha))], f"{name}_alpha", output=node.output[0])


# ---- attention -------------------------------------------------------------------------------------------------------
def _heads(ctx: _Context, x: str, name: str, heads: int, head_size: int, perm: list[int]) -> str:
    """``x [B, S, heads * head_size]`` as ``[B, S, heads, head_size]`` transposed by ``perm``."""
    split = ctx.emit("Reshape", [x, ctx.const(f"{name}_shape", np.array([0, 0, heads, head_size], np.int64))],
                     f"{name}_heads")
    return ctx.emit("Transpose", [split], f"{name}_t", perm=perm)


def _key_mask(mask: np.ndarray, batch: int, queries: int, keys: int) -> np.ndarray:
    """Which keys each query may attend to, ``[B or 1, 1, S or 1, L]``, from an Attention ``mask_index`` or a
    MultiHeadAttention ``key_padding_mask``: 1-D ``[B]`` end positions (keys ``j < end``), 1-D ``[2B]`` end then
    start positions, 2-D ``[B, L]`` or 3-D ``[B, S, L]`` of 1 (keep) and 0."""
    j = np.arange(keys)
    if mask.ndim == 1 and mask.size in (batch, 2 * batch):
        end = mask[:batch, None]
        start = mask[batch:, None] if mask.size == 2 * batch else np.zeros_like(end)
        return ((start <= j) & (j < end))[:, None, None, :]
    if mask.ndim == 2 and mask.shape[1] == keys:
        return mask[:, None, None, :] != 0
    if mask.ndim == 3 and mask.shape[1:] == (queries, keys):
        return mask[:, None, :, :] != 0
    raise _Refusal(f"a mask of shape {mask.shape} for batch {batch}, {queries} queries and {keys} keys (only 1-D "
                   f"[batch] or [2 * batch] positions, 2-D [batch, keys] and 3-D [batch, queries, keys] masks of 1 "
                   f"and 0)")


def _mask(ctx: _Context, node: onnx.NodeProto, index: int, causal: bool, fill: float, queries: str, keys: str,
          past: int = 0) -> np.ndarray | str | None:
    """The additive mask ``[B or 1, 1, S, L]`` (``fill`` where masked, else 0) of the node's key mask input
    ``index`` (see :func:`_key_mask`) and causal masking, or None for neither; ``queries`` and ``keys`` are the
    tensors ``[B, S, .]`` and ``[B, L - past, .]`` that give the lengths, ``past`` the cached keys before the new
    ones. A key mask computed at run time gives the name of a tensor computed from it (:func:`_runtime_mask`)."""
    given = node.input[index] if len(node.input) > index else ""
    if given and given not in ctx.consts:
        return _runtime_mask(ctx, node, given, causal, fill, queries, keys, past)
    mask = ctx.constant(node, index, "mask")
    if mask is None and not causal:
        return None
    q_shape, k_shape = ctx.shapes.get(queries), ctx.shapes.get(keys)
    if q_shape is None or k_shape is None or len(q_shape) != 3 or len(k_shape) != 3:
        raise _NeedsShape(f"a mask or unidirectional=1 on inputs {queries!r} and {keys!r} whose static shapes "
                          f"[batch, tokens, hidden] are not known")
    s, length = q_shape[1], past + k_shape[1]
    keep = np.ones((1, 1, s, length), bool)
    if mask is not None:
        keep = keep & _key_mask(mask, q_shape[0], s, length)
    if causal:
        keep = keep & _causal(s, length, past)
    return np.where(keep, 0.0, fill).astype(np.float32)


def _causal(s: int, length: int, past: int = 0) -> np.ndarray:
    """Which keys each query may attend to under ``unidirectional=1``, ``[1, 1, s, length]``: with no past, refused
    unless there are as many queries as keys; after ``past`` cached keys, aligned at the bottom right (query ``i``
    sees keys ``j <= i + length - s``)."""
    if not past and s != length:
        raise _Refusal(f"unidirectional=1 with {s} queries and {length} keys (only as many of each)")
    return np.tril(np.ones((s, length), bool), length - s)[None, None]


def lengths_mask(ctx: _Context, name: str, lengths: str, index: np.ndarray, fill: float) -> str:
    """The additive mask ``[B, 1, Q, L]`` (``index`` ``[Q, L]``, Q often 1) of per-sequence lengths computed at run
    time (``lengths``: ``B`` integers, of any shape): 0 where ``index < lengths[b]``, else ``fill``."""
    ends = ctx.emit("Reshape", [ctx.emit("Cast", [lengths], f"{name}_lengths64", to=TensorProto.INT64),
                                ctx.const(f"{name}_lengths_shape", np.array([-1, 1, 1, 1], np.int64))],
                    f"{name}_lengths")
    keep = ctx.emit("Less", [ctx.const(f"{name}_key_index", np.asarray(index, np.int64)[None, None]), ends],
                    f"{name}_keep")
    return ctx.emit("Where", [keep, ctx.const(f"{name}_zero", np.float32(0.0)),
                              ctx.const(f"{name}_fill", np.float32(fill))], f"{name}_lengths_mask")


def _runtime_mask(ctx: _Context, node: onnx.NodeProto, given: str, causal: bool, fill: float, queries: str,
                  keys: str, past: int = 0) -> str:
    """The additive mask ``[B, 1, 1 or S, L]`` of a key mask computed at run time, as nodes on it (which the runtime
    mask import then reads from the graph's mask input): a 1-D ``[B]`` ``mask_index`` of end positions (onnxruntime's
    optimizer writes ``ReduceSum(attention_mask, 1)``) keeps the keys before it, a 2-D ``[B, L]`` 0/1 mask the keys
    it marks 1; ``fill`` elsewhere, and above the diagonal too when ``causal`` (``L`` counts ``past`` cached keys
    before those of ``keys``, as :func:`_mask`)."""
    q_shape, k_shape, m_shape = ctx.shapes.get(queries), ctx.shapes.get(keys), ctx.shapes.get(given)
    if q_shape is None or k_shape is None or m_shape is None or len(q_shape) != 3 or len(k_shape) != 3:
        raise _NeedsShape(f"a mask computed at run time on inputs {queries!r} and {keys!r} whose static shapes "
                          f"are not known")
    batch, s, length = q_shape[0], q_shape[1], past + k_shape[1]
    name = _main_name(node)
    if m_shape == (batch,):
        mask = lengths_mask(ctx, f"{name}_mask", given, np.arange(length)[None], fill)
    elif m_shape == (batch, length):
        keep = ctx.emit("Cast", [given], f"{name}_mask_keep", to=TensorProto.BOOL)
        additive = ctx.emit("Where", [keep, ctx.const(f"{name}_mask_zero", np.float32(0.0)),
                                      ctx.const(f"{name}_mask_fill", np.float32(fill))], f"{name}_mask_add")
        mask = ctx.emit("Reshape", [additive, ctx.const(f"{name}_mask_shape", np.array([batch, 1, 1, length],
                                                                                       np.int64))], f"{name}_mask")
    else:
        raise _Refusal(f"a mask input {given!r} of shape {m_shape} computed at run time (only [batch] end positions "
                       f"or a [batch, keys] 0/1 mask)")
    if causal:
        upper = np.where(_causal(s, length, past), 0.0, fill).astype(np.float32)
        mask = ctx.emit("Add", [mask, ctx.const(f"{name}_causal", upper)], f"{name}_mask_causal")
    return mask


def _attend(ctx: _Context, node: onnx.NodeProto, qkv: list[str], heads: int, size: tuple[int, int], scale: float,
            mask: np.ndarray | str | None) -> None:
    """softmax(Q K^T * scale + mask) V per head, into ``node``'s output 0 ``[B, S, heads * v_head]`` (``mask``: a
    constant, or the name of a tensor computed at run time)."""
    name = _main_name(node)
    q, k, v = qkv
    qk_head, v_head = size
    qh = _heads(ctx, q, f"{name}_q", heads, qk_head, [0, 2, 1, 3])
    kt = _heads(ctx, k, f"{name}_k", heads, qk_head, [0, 2, 3, 1])
    vh = _heads(ctx, v, f"{name}_v", heads, v_head, [0, 2, 1, 3])
    attend_heads(ctx, node, qh, kt, vh, heads * v_head, scale, mask)


def attend_heads(ctx: _Context, node: onnx.NodeProto, qh: str, kt: str, vh: str, width: int, scale: float,
                 mask: np.ndarray | str | None) -> None:
    """softmax(``qh [B, N, S, H]`` @ ``kt [B, N, H, L]`` * scale + mask) @ ``vh [B, N, L, Hv]``, heads merged into
    ``node``'s output 0 ``[B, S, width]`` (named as the node; ``mask`` as :func:`_attend` takes it)."""
    name = _main_name(node)
    scores = ctx.emit("MatMul", [qh, kt], f"{name}_scores")
    scores = ctx.emit("Mul", [scores, ctx.const(f"{name}_scale", np.float32(scale))], f"{name}_scaled")
    if mask is not None:
        scores = ctx.emit("Add", [scores, mask if isinstance(mask, str) else ctx.const(f"{name}_mask", mask)],
                          f"{name}_masked")
    probs = ctx.emit("Softmax", [scores], f"{name}_softmax", axis=-1)
    context = ctx.emit("MatMul", [probs, vh], f"{name}_context")
    merged = ctx.emit("Transpose", [context], f"{name}_merge", perm=[0, 2, 1, 3])
    ctx.nodes.append(helper.make_node(
        "Reshape", [merged, ctx.const(f"{name}_out_shape", np.array([0, 0, width], np.int64))],
        [node.output[0]], name=name))


def _num_heads(node: onnx.NodeProto, a: dict[str, Any], widths: tuple[int, ...]) -> int:
    heads = int(a.get("num_heads", 0))
    if heads < 1 or any(w % heads for w in widths):
        raise _Refusal(f"num_heads {heads} does not divide the widths {', '.join(map(str, widths))}")
    return heads


ATTENTION_ATTRS = {"num_heads", "unidirectional", "qkv_hidden_sizes", "mask_filter_value", "scale", "do_rotary",
                   "past_present_share_buffer", "rotary_embedding_dim"}
"""The attributes of com.microsoft's Attention the rewrites read."""


def _attention(ctx: _Context, node: onnx.NodeProto) -> None:
    """Attention: input ``[B, S, D]`` times constant weights ``[D, Dq + Dk + Dv]`` (+ bias), split into Q, K, V."""
    a = _check_attrs(node, ATTENTION_ATTRS)
    _only_inputs(node, ("input", "weights", "bias", "mask_index", "past", "attention_bias"))
    if len(node.input) > 4 and node.input[4]:
        raise _Refusal(f"input 4 ({node.input[4]!r}, a past state); this rewrite reads input, weights, bias, "
                       f"mask_index, attention_bias")
    _only_outputs(ctx, node, ("output",))
    parts, heads, head_sizes = attention_projections(ctx, node, a)
    mask = _mask(ctx, node, 3, bool(a.get("unidirectional", 0)), float(a.get("mask_filter_value", -10000.0)),
                 node.input[0], node.input[0])
    mask = _with_attention_bias(ctx, node, 5, mask, heads)
    _attend(ctx, node, parts, heads, head_sizes, float(a.get("scale", 1.0 / math.sqrt(head_sizes[0]))), mask)


def _with_attention_bias(ctx: _Context, node: onnx.NodeProto, index: int, mask: np.ndarray | str | None,
                         heads: int) -> np.ndarray | str | None:
    """``mask`` (as :func:`_mask` gives it) plus the node's ``attention_bias`` input ``index``, the additive term
    ``[B or 1, heads or 1, S, L]`` onnxruntime adds to the scaled scores before the softmax (onnxscript's
    ``ort_fusions`` pass the padding mask so, as ``Where(mask, 0, min)``): the bias itself without a mask, else an
    Add of the two. Constant or computed at run time (a runtime mask's nodes end in it); ``mask`` without one."""
    if len(node.input) <= index or not node.input[index]:
        return mask
    bias, shape, scores = node.input[index], ctx.shapes.get(node.input[index]), ctx.shapes.get(node.input[0])
    if shape is None or scores is None:
        raise _NeedsShape(f"an attention_bias {bias!r} or an input {node.input[0]!r} whose static shape is not "
                          f"known")
    want = (scores[0], heads, scores[1], scores[1])
    if len(shape) != 4 or any(d not in (1, w) for d, w in zip(shape, want)) or shape[2:] != want[2:]:
        raise _Refusal(f"an attention_bias {bias!r} of shape {list(shape)} (only [batch or 1, heads or 1, queries, "
                       f"keys] = [{want[0]} or 1, {heads} or 1, {want[2]}, {want[3]}])")
    if mask is None:
        return bias
    name = _main_name(node)
    return ctx.emit("Add", [bias, mask if isinstance(mask, str) else ctx.const(f"{name}_mask", mask)],
                    f"{name}_bias_mask")


def attention_projections(ctx: _Context, node: onnx.NodeProto, a: dict[str, Any]
                          ) -> tuple[list[str], int, tuple[int, int]]:
    """An Attention's Q, K and V ``[B, S, width]`` (three MatMuls by its constant weights, and their biases), its
    head count and its (Q/K, V) head sizes."""
    if a.get("do_rotary", 0):
        raise _Refusal("do_rotary=1 (rotary embeddings)")
    weights = ctx.constant(node, 1, "weights")
    bias = ctx.constant(node, 2, "bias")
    if weights is None:
        raise _Refusal("no weights input")
    sizes = [int(s) for s in a.get("qkv_hidden_sizes", [weights.shape[1] // 3] * 3)]
    if weights.ndim != 2 or len(sizes) != 3 or sum(sizes) != weights.shape[1] or sizes[0] != sizes[1] or \
            (bias is not None and bias.shape != (weights.shape[1],)):
        raise _Refusal(f"weights of shape {weights.shape} with qkv_hidden_sizes {sizes} (Q and K of one width, "
                       f"a bias of their sum)")
    heads = _num_heads(node, a, tuple(sizes))
    name, begin, parts = _main_name(node), 0, []
    for role, width in zip("qkv", sizes):
        w = ctx.const(f"{name}_{role}_weight", weights[:, begin:begin + width].astype(np.float32))
        part = ctx.emit("MatMul", [node.input[0], w], f"{name}_{role}")
        if bias is not None:
            b = ctx.const(f"{name}_{role}_b", bias[begin:begin + width].astype(np.float32))
            part = ctx.emit("Add", [part, b], f"{name}_{role}_bias")
        parts.append(part)
        begin += width
    return parts, heads, (sizes[0] // heads, sizes[2] // heads)


MHA_ATTRS = {"num_heads", "unidirectional", "mask_filter_value", "scale"}
"""The attributes of com.microsoft's MultiHeadAttention the rewrites read."""


def _multi_head_attention(ctx: _Context, node: onnx.NodeProto) -> None:
    """MultiHeadAttention of separate 3-D query ``[B, S, D]``, key ``[B, L, D]`` and value ``[B, L, Dv]``."""
    a = _check_attrs(node, MHA_ATTRS)
    _only_inputs(node, ("query", "key", "value", "bias", "key_padding_mask"))
    _only_outputs(ctx, node, ("output",))
    parts, heads, head_sizes = mha_projections(ctx, node, a)
    mask = _mask(ctx, node, 4, bool(a.get("unidirectional", 0)), float(a.get("mask_filter_value", -10000.0)),
                 node.input[0], node.input[1])
    _attend(ctx, node, parts, heads, head_sizes, float(a.get("scale", 1.0 / math.sqrt(head_sizes[0]))), mask)


def mha_projections(ctx: _Context, node: onnx.NodeProto, a: dict[str, Any]) -> tuple[list[str], int, tuple[int, int]]:
    """A MultiHeadAttention's Q, K and V ``[B, S or L, width]`` (its 3-D inputs plus their parts of the bias), its
    head count and its (Q/K, V) head sizes."""
    if len(node.input) < 3 or not node.input[1] or not node.input[2]:
        raise _Refusal("packed QKV or packed KV inputs (only separate query, key and value)")
    shapes = [ctx.shapes.get(t) for t in node.input[:3]]
    for role, shape in zip(("query", "key", "value"), shapes):
        if shape is None:
            raise _NeedsShape(f"a {role} whose static shape is not known")
        if len(shape) != 3:
            raise _Refusal(f"a {role} of shape {shape} (only 3-D [batch, tokens, hidden] query, key and value)")
    widths = tuple(s[-1] for s in shapes if s is not None)
    if widths[0] != widths[1]:
        raise _Refusal(f"query and key of widths {widths[0]} and {widths[1]}")
    heads = _num_heads(node, a, widths)
    bias = ctx.constant(node, 3, "bias")
    name, parts, begin = _main_name(node), [], 0
    for role, tensor, width in zip("qkv", node.input[:3], widths):
        if bias is not None:
            b = ctx.const(f"{name}_{role}_b", bias[begin:begin + width].astype(np.float32))
            tensor = ctx.emit("Add", [tensor, b], f"{name}_{role}_bias")
        parts.append(tensor)
        begin += width
    if bias is not None and bias.shape != (begin,):
        raise _Refusal(f"a bias of shape {bias.shape} for Q, K and V of widths {widths}")
    return parts, heads, (widths[0] // heads, widths[2] // heads)


REWRITES: dict[str, Rewrite] = {
    "Gelu": _gelu_rule("none", ("X",)),
    "BiasGelu": _gelu_rule("none", ("A", "B")),
    "FastGelu": _gelu_rule("tanh", ("X", "bias")),
    "QuickGelu": _quick_gelu,
    "SkipLayerNormalization": _skip_layer_norm,
    "EmbedLayerNormalization": _embed_layer_norm,
    "SimplifiedLayerNormalization": _simplified_layer_norm,
    "SkipSimplifiedLayerNormalization": _skip_simplified_layer_norm,
    "BiasAdd": _bias_add,
    "FusedMatMul": _fused_matmul,
    "Attention": _attention,
    "MultiHeadAttention": _multi_head_attention,
}
"""The com.microsoft operators :func:`rewrite_contrib` rewrites, each into standard ONNX nodes."""


LAB_DOMAIN = "vta.lab"
"""The domain of the ONNX fused operators (opset 23's Attention, RotaryEmbedding) a rewrite writes as steps of its
own: :func:`rewrite_contrib` rewrites them in turn with the ``steps`` it is given (the frontend's: ONNX's fused
operators' rewrites), whatever the model's opset (their default-domain counterparts may not exist at it)."""


def _refusal_of_other(node: onnx.NodeProto, rewrites: Mapping[str, Rewrite]) -> str:
    supported = ", ".join(sorted(rewrites))
    if node.domain == CONTRIB_DOMAIN:
        return _REFUSED_OPS.get(node.op_type, f"no rewrite for this {CONTRIB_DOMAIN} operator (the lab rewrites "
                                              f"{supported})")
    return (f"an operator of domain {node.domain!r}; the lab imports the default ONNX domain and, from "
            f"{CONTRIB_DOMAIN}, {supported}")


def rewrite_contrib(model: onnx.ModelProto, extra: Mapping[str, Rewrite] | None = None,
                    steps: Mapping[str, Rewrite] | None = None) -> dict[str, str]:
    """Replace, in place, every supported ``com.microsoft`` node of ``model`` by standard ONNX nodes.

    Returns, for each node left in a non-default domain, keyed by its first output, why it is refused: a clause
    naming the unsupported input, output, attribute or operator (the frontend names the node, op and domain). A
    rewrite that needs a static shape computed after another contrib node is tried again once that one is
    rewritten.

    ``extra``: more com.microsoft rewrites (the frontend gives :data:`.contrib_decoder.DECODER_REWRITES`);
    ``steps``: the rewrites of the :data:`LAB_DOMAIN` nodes rewrites write (the frontend gives
    :data:`.onnx_fused.FUSED_REWRITES`). Both are given by the caller, as those modules import this one."""
    rewrites, lab_steps = {**REWRITES, **(extra or {})}, steps or {}
    def rule_of(node: onnx.NodeProto) -> Rewrite | None:
        if node.domain in ("", "ai.onnx") and not _is_ort(node):
            return None
        if node.domain == LAB_DOMAIN:
            return lab_steps.get(node.op_type) or _refuse(f"no rewrite for the lab's own step {node.op_type}")
        rule = rewrites.get(node.op_type) if node.domain == CONTRIB_DOMAIN else \
            REWRITES.get(node.op_type) if _is_ort(node) else None
        return rule or _refuse(_refusal_of_other(node, rewrites))
    model.opset_import.append(helper.make_opsetid(LAB_DOMAIN, 1))    # for shape inference to pass over its steps
    try:
        return rewrite_nodes(model, rule_of)
    finally:
        kept = [o for o in model.opset_import if o.domain != LAB_DOMAIN]
        if any(node.domain == LAB_DOMAIN for node in model.graph.node):
            kept.append(helper.make_opsetid(LAB_DOMAIN, 1))
        del model.opset_import[:]
        model.opset_import.extend(kept)


def _refuse(why: str) -> Rewrite:
    def rule(ctx: _Context, node: onnx.NodeProto) -> None:
        raise _Refusal(why)
    return rule


def rewrite_nodes(model: onnx.ModelProto, rule_of: Callable[[onnx.NodeProto], Rewrite | None]) -> dict[str, str]:
    """Replace, in place, every node for which ``rule_of`` gives a rewrite by the nodes the rewrite writes; the
    mechanism of :func:`rewrite_contrib`, also used for ONNX's own fused operators (:mod:`.onnx_fused`).

    Returns why each node left is refused, keyed by its first output. A rewrite that needs a static shape computed
    after another rewritten node is tried again once that one is rewritten, and the nodes a rewrite writes in
    :data:`LAB_DOMAIN` are rewritten in the next round."""
    refused: dict[str, str] = {}
    while any(rule_of(node) is not None for node in model.graph.node):
        refused, waiting, done = _rewrite_round(model, rule_of)
        if not done or not (waiting or any(node.domain == LAB_DOMAIN for node in model.graph.node)):
            break
    return refused


def _rewrite_round(model: onnx.ModelProto, rule_of: Callable[[onnx.NodeProto], Rewrite | None]
                   ) -> tuple[dict[str, str], bool, bool]:
    """One pass over the nodes: (the refusals, whether a node waits for a shape, whether any node was rewritten)."""
    ctx = _Context(model)
    refused: dict[str, str] = {}
    kept: list[onnx.NodeProto] = []
    waiting = done = False
    for node in model.graph.node:
        rule = rule_of(node)
        if rule is None:
            kept.append(node)
            continue
        ctx.nodes, ctx.inits = [], []
        try:
            rule(ctx, node)
        except _Refusal as why:
            refused[node.output[0]] = str(why)
            waiting = waiting or isinstance(why, _NeedsShape)
            kept.append(node)
            continue
        done = True
        kept.extend(ctx.nodes)
        model.graph.initializer.extend(ctx.inits)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return refused, waiting, done
