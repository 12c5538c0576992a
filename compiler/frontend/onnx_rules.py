"""The ONNX import rules of the convolutional and general operators (Conv, BatchNormalization, Gemm, MatMul, Clip,
the binary element-wise ops, pooling, Reshape, Pad, Concat/Softmax axes, Transpose, DepthToSpace, Resize);
:mod:`.onnx_transformer_rules` has the rest and the :data:`RULES` table."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx

from ..ir import GraphError, Node
from .onnx_common import UnsupportedOperatorError, _attrs, _decode, _Importer, same_pads


def _nd_pads(imp: _Importer, node: onnx.NodeProto, kernel: tuple[int, ...], strides: tuple[int, ...],
             attrs: dict[str, Any]) -> list[tuple[int, int]]:
    """(begin, end) pads of each spatial axis from ``pads`` or ``auto_pad``."""
    rank = len(kernel)
    auto = _decode(attrs.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", "VALID"):
        p = list(attrs.get("pads", [0] * 2 * rank)) if auto == "NOTSET" else [0] * 2 * rank
        if len(p) != 2 * rank:
            raise UnsupportedOperatorError(node.op_type, node.name, f"pads {p} for a {rank}D window (need "
                                                                    f"{2 * rank} values)")
        return [(int(p[i]), int(p[i + rank])) for i in range(rank)]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"auto_pad {auto!r}")
    return same_pads(auto, imp.shape(node.input[0])[2:], kernel, strides)


def _spatial_pads(imp: _Importer, node: onnx.NodeProto, kernel: tuple[int, ...], strides: tuple[int, ...],
                  attrs: dict[str, Any]) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) pads of a 2D window from ``pads`` or ``auto_pad``."""
    if _decode(attrs.get("auto_pad", "NOTSET")) == "NOTSET" and len(attrs.get("pads", [0] * 4)) != 4:
        raise UnsupportedOperatorError(node.op_type, node.name, f"only 2D pads are supported, got "
                                                                f"{list(attrs['pads'])}")
    (top, bottom), (left, right) = _nd_pads(imp, node, kernel, strides, attrs)
    return (top, left, bottom, right)


def _check_dilations(node: onnx.NodeProto, attrs: dict[str, Any]) -> None:
    """A Conv still dilated here was left so by :func:`.conv_transpose.undilate_convs`: name why it takes others."""
    if any(d != 1 for d in attrs.get("dilations", [1])):
        raise UnsupportedOperatorError(node.op_type, node.name, f"dilations {list(attrs['dilations'])} (a dilated "
                                                                f"Conv needs constant weights, and strides of 1 or a "
                                                                f"kernel whose zeros cost at most 4 times its MACs)")


def _check_group(imp: _Importer, node: onnx.NodeProto, group: int, w: np.ndarray) -> None:
    """A Conv's ``group`` must be positive and fit its input's channels and its weights ``[O, C / group, ...]``."""
    c = imp.shape(node.input[0])[1] if len(imp.shape(node.input[0])) > 1 else None
    if group < 1 or w.shape[0] % group or (c is not None and c != w.shape[1] * group):
        raise UnsupportedOperatorError(node.op_type, node.name, f"group={group} does not fit its {c} input channels "
                                                                f"and weights of shape {list(w.shape)} (O and C must "
                                                                f"be multiples of a positive group, with weights "
                                                                f"[O, C / group, ...])")


# ---- rules: ONNX op_type -> function(importer, node) ----------------------------------------------------------------
def _conv(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    _check_dilations(node, a)
    if not imp.is_const(node.input[1]):
        raise UnsupportedOperatorError(node.op_type, node.name, "weights must be a constant initializer")
    w = imp.const(node.input[1])
    _check_group(imp, node, int(a.get("group", 1)), w)
    if w.ndim == 3:
        _conv1d(imp, node, a, w)
        return
    if w.ndim != 4:
        raise UnsupportedOperatorError(node.op_type, node.name, f"only 1D and 2D convolutions, got weights "
                                                                f"{w.shape}")
    kernel = (w.shape[2], w.shape[3])
    strides = tuple(int(s) for s in a.get("strides", [1, 1]))
    pads = _spatial_pads(imp, node, kernel, strides, a)
    x = node.input[0]
    absorbed = _absorb_pad(imp, x)
    if absorbed is not None:
        x, extra = absorbed
        pads = (pads[0] + extra[0], pads[1] + extra[1], pads[2] + extra[2], pads[3] + extra[3])
    inputs = [x, imp.use_const(node.input[1])]
    if imp.const_input(node, 2, "bias B") is not None:
        inputs.append(imp.use_const(node.input[2]))
    imp.emit("Conv2d", node, inputs, strides=strides, pads=pads, groups=int(a.get("group", 1)))


def _conv1d(imp: _Importer, node: onnx.NodeProto, a: dict[str, Any], w: np.ndarray) -> None:
    """A 1D convolution ``[N, C, L]`` (an audio model's stem, Whisper's two) as a 2D one over ``[N, C, 1, L]`` with
    weights ``[O, C / group, 1, k]``, reshaped back to ``[N, O, L_out]``."""
    n, c, length = imp.shape(node.input[0])
    kernel = (int(w.shape[2]),)
    strides = tuple(int(v) for v in a.get("strides", [1]))
    ((begin, end),) = _nd_pads(imp, node, kernel, strides, a)
    _, o, out = imp.shapes_of(node.output[0])
    rows = imp.emit_shaped("Reshape", node, [node.input[0]], (n, c, 1, length), shape=(n, c, 1, length))
    inputs = [rows, imp.new_const(f"{node.output[0]}_w2d", w.reshape(w.shape[0], w.shape[1], 1, w.shape[2]))]
    if imp.const_input(node, 2, "bias B") is not None:
        inputs.append(imp.use_const(node.input[2]))
    conv = imp.emit_shaped("Conv2d", node, inputs, (n, o, 1, out), strides=(1, strides[0]), pads=(0, begin, 0, end),
                           groups=int(a.get("group", 1)))
    imp.emit("Reshape", node, [conv], shape=(n, o, out))


def _absorb_pad(imp: _Importer, tensor: str) -> tuple[str, tuple[int, int, int, int]] | None:
    """If ``tensor`` comes from a single-use zero Pad of H and W only, remove the Pad and return (its input, its
    (top, left, bottom, right) pads) so the convolution pads instead."""
    src = imp.name(tensor)
    prod = imp.graph.producer(src)
    if prod is None or prod.op != "Pad" or prod.attrs["value"] != 0.0 or imp.uses.get(tensor, 0) != 1:
        return None
    p = prod.attrs["pads"]
    if len(p) != 8 or p[0] or p[1] or p[4] or p[5] or src in imp.graph_outputs:
        return None
    imp.graph.nodes.remove(prod)
    del imp.graph.tensors[src]
    return prod.inputs[0], (p[2], p[3], p[6], p[7])


def _batchnorm(imp: _Importer, node: onnx.NodeProto) -> None:
    if _attrs(node).get("training_mode", 0):
        raise UnsupportedOperatorError(node.op_type, node.name or f"<unnamed, writes {node.output[0]}>",
                                       "training_mode=1 (batch statistics and running-statistics outputs); the lab "
                                       "runs inference, with the model's mean and var")
    eps = float(_attrs(node).get("epsilon", 1e-5))
    params = [imp.const_input(node, k, what) for k, what in enumerate(("", "scale", "B", "input_mean", "input_var"))
              if k]
    gamma, beta, mean, var = (np.asarray(p, np.float64) for p in params)
    mult = gamma / np.sqrt(var + eps)
    shift = beta - mean * mult
    src = imp.name(node.input[0])
    prod = imp.graph.producer(src)
    single_use = imp.uses.get(node.input[0], 0) == 1 and node.input[0] not in imp.graph_outputs
    if prod is not None and prod.op in ("Conv2d", "Dense") and single_use:
        w = imp.graph.constants[prod.inputs[1]].astype(np.float64)
        b = imp.graph.constants[prod.inputs[2]].astype(np.float64) if len(prod.inputs) > 2 else 0.0
        scale = mult.reshape((-1,) + (1,) * (w.ndim - 1))
        prod.inputs[1:] = [imp.new_const(f"{node.output[0]}_w", w * scale),
                           imp.new_const(f"{node.output[0]}_b", b * mult + shift)]
        imp.graph.rename_tensor(src, node.output[0])
        return
    shape = imp.shape(node.input[0])
    c = mult.shape[0]
    if len(shape) < 2 or shape[1] != c:
        raise UnsupportedOperatorError(node.op_type, node.name, f"an input of shape {list(shape)} for {c} channels "
                                                                f"(only [N, C, ...])")
    weights = [imp.new_const(f"{node.output[0]}_w", mult.reshape(c, 1, 1, 1)),
               imp.new_const(f"{node.output[0]}_b", shift)]
    if len(shape) == 4:
        imp.emit("Conv2d", node, [node.input[0], *weights], strides=(1, 1), pads=(0, 0, 0, 0), groups=c)
        return
    # [N, C] or [N, C, ...] (BatchNorm1d after a MatMul, as LeViT's; 3-D): viewed as [N, C, L, 1], per channel
    plane = (shape[0], c, int(np.prod(shape[2:], dtype=np.int64)), 1)
    x = imp.emit_shaped("Reshape", node, [node.input[0]], plane, shape=plane)
    y = imp.emit_shaped("Conv2d", node, [x, *weights], plane, strides=(1, 1), pads=(0, 0, 0, 0), groups=c)
    imp.emit("Reshape", node, [y], shape=tuple(shape))


def _gemm(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    if imp.is_const(node.input[0]) and imp.is_const(node.input[1]) and len(node.input) > 2 and node.input[2] and \
            not imp.is_const(node.input[2]) and float(a.get("beta", 1.0)) == 1.0:
        # a constant product plus a computed C (an unrolled recurrent layer's first step, from its zero state)
        x, w = (imp.const(t).astype(np.float64) for t in node.input[:2])
        product = (x.T if a.get("transA", 0) else x) @ (w.T if a.get("transB", 0) else w) * float(a.get("alpha", 1.0))
        ab = imp.graph.unique_name(f"{node.output[0]}_ab")
        imp.consts[ab] = product.astype(np.float32)
        _binary(imp, onnx.helper.make_node("Add", [ab, node.input[2]], list(node.output),
                                           name=f"{node.name or node.output[0]}_add_c"))
        return
    if a.get("transA", 0) or not imp.is_const(node.input[1]):
        _gemm_of_activations(imp, node, a)
        return
    w = imp.const(node.input[1]).astype(np.float64) * float(a.get("alpha", 1.0))
    w = w if a.get("transB", 0) else w.T
    x_shape = imp.shape(node.input[0])
    if w.ndim != 2 or len(x_shape) != 2 or x_shape[1] != w.shape[1]:
        raise GraphError(f"Gemm node {node.name or node.output[0]!r} multiplies its input A of shape "
                         f"{list(x_shape)} by B of shape {list(imp.const(node.input[1]).shape)} (transB="
                         f"{int(a.get('transB', 0))}): A's columns must equal B's "
                         f"{'columns' if a.get('transB', 0) else 'rows'} (the model is not a valid ONNX graph).")
    inputs = [node.input[0], imp.new_const(f"{node.output[0]}_w", w)]
    if len(node.input) > 2 and node.input[2] and not imp.is_const(node.input[2]):
        _gemm_plus_activation(imp, node, inputs, w.shape[0], float(a.get("beta", 1.0)))
        return
    bias = imp.const_input(node, 2, "bias C")
    if bias is not None:
        c = bias.astype(np.float64).reshape(-1) * float(a.get("beta", 1.0))
        if c.size not in (1, w.shape[0]):
            raise UnsupportedOperatorError(node.op_type, node.name, f"a bias C of {c.size} values for "
                                                                    f"{w.shape[0]} outputs (only per-output biases)")
        bias = np.broadcast_to(c, w.shape[:1])
        inputs.append(imp.new_const(f"{node.output[0]}_b", bias))
    imp.emit("Dense", node, inputs)


def _gemm_of_activations(imp: _Importer, node: onnx.NodeProto, a: dict[str, Any]) -> None:
    """``alpha * A' @ B' + beta * C`` of a Gemm whose B is computed, or whose A is transposed (``transA=1``): ``A'``
    and ``B'`` are ``A [M, K]`` and ``B [K, N]`` or, with ``transA``/``transB``, a Transpose of ``A [K, M]`` and
    ``B [N, K]`` (a constant one transposed at import); their product ``[M, N]`` is a MatMul (of two activations: a
    QMatMul once quantized, as a MatMul's), then a Mul by ``alpha`` when it is not 1, and an Add of ``C`` (a
    constant times ``beta``, or a computed one, times ``beta`` when that is not 1; any shape that broadcasts to
    ``[M, N]``) when ``C`` is given and ``beta`` is not 0 (jax2onnx writes ``beta=0`` with a zero ``C``)."""
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    out = tuple(imp.shapes_of(node.output[0]))
    operands = []
    for k, trans in ((0, bool(a.get("transA", 0))), (1, bool(a.get("transB", 0)))):
        t = node.input[k]
        rank = imp.const(t).ndim if imp.is_const(t) else len(imp.shape(t))
        if rank != 2:
            raise UnsupportedOperatorError(node.op_type, node.name, f"an input {'AB'[k]} of rank {rank} (Gemm "
                                                                    f"multiplies matrices, of rank 2)")
        if imp.is_const(t):
            value = imp.const(t).astype(np.float64)
            operands.append(imp.new_const(f"{node.output[0]}_{'ab'[k]}", value.T if trans else value))
        elif trans:
            rows, cols = imp.shape(t)
            operands.append(imp.emit_shaped("Transpose", node, [t], (cols, rows), perm=(1, 0)))
        else:
            operands.append(t)
    c = node.input[2] if len(node.input) > 2 and node.input[2] and beta != 0.0 else ""
    if alpha == 1.0 and not c:
        imp.emit("MatMul", node, operands)
        return
    product = imp.emit_shaped("MatMul", node, operands, out)
    if alpha != 1.0:
        scale = imp.new_const(f"{node.output[0]}_alpha", np.array([alpha]))
        if not c:
            imp.emit("Mul", node, [product, scale])
            return
        product = imp.emit_shaped("Mul", node, [product, scale], out)
    if imp.is_const(c):
        term = imp.graph.unique_name(f"{node.output[0]}_beta_c")
        imp.consts[term] = (imp.const(c).astype(np.float64) * beta).astype(np.float32)
    elif beta != 1.0:
        term = imp.emit_shaped("Mul", node, [c, imp.new_const(f"{node.output[0]}_beta", np.array([beta]))],
                               tuple(imp.shape(c)))
    else:
        term = c
    _binary(imp, onnx.helper.make_node("Add", [product, term], list(node.output),
                                       name=f"{node.name or node.output[0]}_add_c"))


def _gemm_plus_activation(imp: _Importer, node: onnx.NodeProto, inputs: list[str], outputs: int, beta: float
                          ) -> None:
    """A Gemm whose C is computed (tf2onnx's recurrent step ``h @ R + (x @ W + b)``): the Dense of A and B, then an
    Add of C (``beta`` 1 only), which broadcasts as the binary rules do."""
    if beta != 1.0:
        raise UnsupportedOperatorError(node.op_type, node.name, f"a computed C with beta {beta} (only 1)")
    rows = imp.shape(node.input[0])[0]
    product = imp.emit_shaped("Dense", node, inputs, (rows, outputs))
    _binary(imp, onnx.helper.make_node("Add", [product, node.input[2]], list(node.output),
                                       name=f"{node.name or node.output[0]}_add_c"))


def _reverse_sequence(imp: _Importer, node: onnx.NodeProto) -> None:
    """ReverseSequence with every ``sequence_lens`` the whole time axis (tf2onnx's form of Keras's backward
    recurrent direction, ``ReverseV2``): one Slice of the time axis' indices in reverse order."""
    a = _attrs(node)
    shape = imp.shape(node.input[0])
    time_axis = int(a.get("time_axis", 0))
    lengths = imp.const_input(node, 1, "sequence_lens")
    if lengths is None or np.any(np.asarray(lengths) != shape[time_axis]):
        raise UnsupportedOperatorError(node.op_type, node.name, f"sequence_lens other than the whole time axis "
                                                                f"({shape[time_axis]})")
    imp.emit("Slice", node, [node.input[0]], axes=(time_axis,), indices=(tuple(range(shape[time_axis] - 1, -1, -1)),))


def _matmul(imp: _Importer, node: onnx.NodeProto) -> None:
    """MatMul by a constant ``[K, O]``: a Dense layer for an input ``[N, K]``; for an input ``[..., K]`` of rank > 2
    (tokens), a 1x1 Conv2d over the image ``[1, K, R, 1]`` of all ``R = prod(...)`` token rows (see
    :func:`_token_linear`); any other MatMul (two activations, or a constant of rank > 2 as either operand) is a
    batched, broadcasting MatMul."""
    a, b = node.input[0], node.input[1]
    ranks = [len(imp.shape(t)) if not imp.is_const(t) else imp.const(t).ndim for t in (a, b)]
    if min(ranks) < 2:
        raise UnsupportedOperatorError(node.op_type, node.name, f"operands of rank {ranks[0]} and {ranks[1]}; both "
                                                                f"must have rank 2 or more")
    if imp.is_const(a):            # of rank > 2 (a rank-2 one is a linear layer, onnx_fusions.constant_first_matmuls)
        imp.emit("MatMul", node, [imp.use_const(a), imp.use_const(b) if imp.is_const(b) else b])
        return
    if not imp.is_const(b) or ranks[1] > 2:
        imp.emit("MatMul", node, [a, imp.use_const(b) if imp.is_const(b) else b])
        return
    w = imp.new_const(f"{node.output[0]}_w", imp.const(b).T)
    shape = imp.shape(a)
    if len(shape) == 2:
        imp.emit("Dense", node, [a, w])
        return
    _token_linear(imp, node, a, imp.const(b))


def _token_linear(imp: _Importer, node: onnx.NodeProto, x: str, w: np.ndarray) -> None:
    """``x [..., K] @ w [K, O]`` as a 1x1 convolution whose image is every token row: ``x`` reshaped to ``[R, K]``,
    transposed and viewed as ``[1, K, R, 1]``, the Conv2d, and back to ``[..., O]``. On the accelerator the tokens
    are then the GEMM rows of one image, and the weights are loaded once for all of them (a Dense of ``R`` batch
    rows would load them again for every batch block)."""
    shape = imp.shape(x)
    rows, k, o = int(np.prod(shape[:-1])), shape[-1], w.shape[1]
    flat = imp.emit_shaped("Reshape", node, [x], (rows, k), shape=(rows, k))
    cols = imp.emit_shaped("Transpose", node, [flat], (k, rows), perm=(1, 0))
    image = imp.emit_shaped("Reshape", node, [cols], (1, k, rows, 1), shape=(1, k, rows, 1))
    weight = imp.new_const(f"{node.output[0]}_w", w.T.reshape(o, k, 1, 1))
    conv = imp.emit_shaped("Conv2d", node, [image, weight], (1, o, rows, 1), strides=(1, 1), pads=(0, 0, 0, 0),
                           groups=1)
    back = imp.emit_shaped("Reshape", node, [conv], (o, rows), shape=(o, rows))
    out = imp.emit_shaped("Transpose", node, [back], (rows, o), perm=(1, 0))
    imp.emit("Reshape", node, [out], shape=imp.shapes_of(node.output[0]))
    producer = imp.graph.producer(conv)
    if producer is not None:
        imp.token_linear[node.output[0]] = producer
        last = imp.graph.nodes[-1]
        if node.name and last.name == node.name:     # the compiled layer keeps the ONNX node's name (the report row)
            last.name = imp.graph.unique_name(f"{node.name}_reshape_out", node=True)
            producer.name = node.name


def _dense_bias_target(imp: _Importer, x: str, c: np.ndarray) -> Node | None:
    """The Conv2d of a MatMul over tokens (:func:`_token_linear`) that wrote ``x``, when the constant ``c``
    broadcasts along the last axis only and ``x`` has one use: an Add of ``c`` then folds into its bias."""
    conv = imp.token_linear.get(imp.name(x))
    if conv is None or imp.uses.get(x, 0) != 1 or x in imp.graph_outputs:
        return None
    o = imp.graph.shape(conv.inputs[1])[0]
    if c.size not in (1, o) or (c.ndim and c.shape[-1] != c.size):
        return None
    return conv


def _clip(imp: _Importer, node: onnx.NodeProto) -> None:
    a = _attrs(node)
    lo, hi = a.get("min"), a.get("max")
    lo_input, hi_input = imp.const_input(node, 1, "min"), imp.const_input(node, 2, "max")
    if lo_input is not None:
        lo = float(lo_input.reshape(()))
    if hi_input is not None:
        hi = float(hi_input.reshape(()))
    imp.emit("Clip", node, [node.input[0]], min=None if lo is None else float(lo),
             max=None if hi is None else float(hi))


def broadcast_activation(imp: _Importer, node: onnx.NodeProto, x: str, out: tuple[int, ...], *,
                         final: bool = False) -> str:
    """Activation ``x`` broadcast to the static shape ``out`` (numpy's rules), for ``node``: a Reshape adding the
    leading axes, then for each axis of size 1 broadcast to ``n``, a Concat of ``n`` copies along it. Returns the
    broadcast tensor's name; with ``final``, the last node writes ``node``'s output (a Reshape when nothing is
    broadcast)."""
    src = tuple(imp.shape(x))
    padded = (1,) * (len(out) - len(src)) + src
    axes = [k for k, (a, b) in enumerate(zip(padded, out)) if a != b]
    if final and not axes:
        imp.emit("Reshape", node, [x], shape=tuple(out))
        return node.output[0]
    if len(padded) != len(src):
        x = imp.emit_shaped("Reshape", node, [x], padded, shape=padded)
    current = list(padded)
    for axis in axes:
        current[axis] = out[axis]
        if final and axis == axes[-1]:
            imp.emit("Concat", node, [x] * out[axis], axis=axis)
            return node.output[0]
        x = imp.emit_shaped("Concat", node, [x] * out[axis], tuple(current), axis=axis)
    return x


def _at_shape(imp: _Importer, node: onnx.NodeProto, x: str, out: tuple[int, ...]) -> str:
    """Activation ``x`` as it is when it has the static shape ``out``, else broadcast to it (for ``node``)."""
    return x if tuple(imp.shape(x)) == out else broadcast_activation(imp, node, x, out)


def _one_pass_variance(imp: _Importer, a: str, b: str) -> bool:
    """Whether ``a - b`` is ``ReduceMean(x * x) - ReduceMean(x) ** 2`` (a square as Mul by itself or Pow 2, the same
    ``x`` through Identity and Cast nodes)."""
    producer = imp.producers

    def source(t: str) -> str:
        while t in producer and producer[t].op_type in ("Identity", "Cast"):
            t = producer[t].input[0]
        return t

    def squared(t: str) -> str | None:
        node = producer.get(t)
        if node is not None and node.op_type == "Mul" and node.input[0] == node.input[1]:
            return node.input[0]
        exponent = imp.consts.get(node.input[1]) if node is not None and node.op_type == "Pow" else None
        return node.input[0] if node is not None and exponent is not None and exponent.size == 1 and \
            float(exponent.reshape(())) == 2.0 else None

    mean_sq, sq_mean = producer.get(a), squared(b)
    inner = squared(mean_sq.input[0]) if mean_sq is not None and mean_sq.op_type == "ReduceMean" else None
    mean = producer.get(sq_mean) if sq_mean is not None else None
    return inner is not None and mean is not None and mean.op_type == "ReduceMean" and \
        source(mean.input[0]) == source(inner)


def _binary(imp: _Importer, node: onnx.NodeProto) -> None:
    """Add, Sub or Mul of two activations (each broadcast to the output's shape first where it differs; Sub as an
    Add of the second times -1); Add/Sub/Mul/Div with one constant become Add or Mul by a constant (the activation
    broadcast first where the constant widens it), a constant minus an activation an Add to its product by -1, and
    one value divided by an activation a Mul of its Reciprocal."""
    x, y = node.input[0], node.input[1]
    if imp.is_const(x) and node.op_type in ("Add", "Mul"):
        x, y = y, x
    out = tuple(imp.shapes_of(node.output[0]))
    if imp.is_const(x) and not imp.is_const(y) and (node.op_type == "Sub" or
                                                    (node.op_type == "Div" and imp.const(x).size == 1)):
        y = _at_shape(imp, node, y, out)                  # c - y = (-1) * y + c; c / y = Reciprocal(y) * c
        inner = imp.emit_shaped("Mul", node, [y, imp.new_const(f"{node.output[0]}_minus", np.array([-1.0]))], out) \
            if node.op_type == "Sub" else imp.emit_shaped("Reciprocal", node, [y], out)
        imp.emit("Add" if node.op_type == "Sub" else "Mul", node,
                 [inner, imp.new_const(f"{node.output[0]}_c", imp.const(x).astype(np.float64))])
        return
    if imp.is_const(x):
        raise UnsupportedOperatorError(node.op_type, node.name, "a constant first operand is only allowed for Add, "
                                       "Sub and Mul, and for Div when it is one value")
    if not imp.is_const(y):
        if node.op_type not in ("Add", "Mul", "Sub"):
            raise UnsupportedOperatorError(node.op_type, node.name, "only Add, Sub and Mul take two activations")
        if node.op_type == "Sub" and _one_pass_variance(imp, x, y):
            raise UnsupportedOperatorError(node.op_type, node.name, "a variance written as E[x*x] - E[x]**2 (ONNX's "
                                           "LayerNormalization function): the two int8 means cancel, leaving few "
                                           "of their bits; LayerNormalization itself and the E[(x - E[x])**2] form "
                                           "are taken")
        x, y = (_at_shape(imp, node, t, out) for t in (x, y))
        if node.op_type == "Sub":                              # x - y = x + (-1) * y
            y = imp.emit_shaped("Mul", node, [y, imp.new_const(f"{node.output[0]}_minus", np.array([-1.0]))], out)
        imp.emit("Add" if node.op_type == "Sub" else node.op_type, node, [x, y])
        return
    c = imp.const(y).astype(np.float64)
    op = {"Add": "Add", "Sub": "Add", "Mul": "Mul", "Div": "Mul"}[node.op_type]
    if node.op_type == "Sub":
        c = -c
    elif node.op_type == "Div":
        c = 1.0 / c
    dense = _dense_bias_target(imp, x, c) if op == "Add" else None
    if dense is not None:                                # a MatMul over tokens and its bias: one Conv2d
        o = imp.graph.shape(dense.inputs[1])[0]
        bias = imp.graph.constants[dense.inputs[2]].astype(np.float64) if len(dense.inputs) > 2 else np.zeros(o)
        dense.inputs[2:] = [imp.new_const(f"{node.output[0]}_b", bias + np.broadcast_to(c.reshape(-1), (o,)))]
        imp.alias[node.output[0]] = imp.name(x)
        return
    x = _at_shape(imp, node, x, out)                   # the constant may widen the activation: broadcast it first
    imp.emit(op, node, [x, imp.new_const(f"{node.output[0]}_c", c)])


def _pool(imp: _Importer, node: onnx.NodeProto) -> None:
    """MaxPool/AveragePool of a 1D, 2D or 3D window (see the module docstring for 1D and 3D)."""
    a = _attrs(node)
    kernel = tuple(int(k) for k in a["kernel_shape"])
    rank = len(kernel)
    problems = []
    if any(d != 1 for d in a.get("dilations", [1])):
        problems.append(f"dilations {list(a['dilations'])} (only 1)")
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        problems.append("the Indices output")
    if rank not in (1, 2, 3):
        problems.append(f"a {rank}D window (only 1D, 2D and 3D)")
    if problems:
        raise UnsupportedOperatorError(node.op_type, node.name, "; ".join(problems))
    strides = tuple(int(s) for s in a.get("strides", [1] * rank))
    pads = _nd_pads(imp, node, kernel, strides, a)
    op = "MaxPool" if node.op_type == "MaxPool" else "AvgPool"
    extra: dict[str, Any] = {} if op == "MaxPool" else {"count_include_pad": bool(a.get("count_include_pad", 0))}
    if a.get("ceil_mode", 0):
        kernel, pads = _ceil_pads(imp, node, kernel, strides, pads, extra)
    x, out = node.input[0], node.output[0]
    shape = imp.shape(x)
    if rank == 2:
        imp.emit(op, node, [x], kernel=kernel, strides=strides, pads=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]),
                 **extra)
    elif rank == 1:
        n, c, length = shape
        (begin, end), = pads
        olen = imp.shapes_of(out)[2]
        row = imp.emit_shaped("Reshape", node, [x], (n, c, 1, length), shape=(n, c, 1, length))
        pooled = imp.emit_shaped(op, node, [row], (n, c, 1, olen), kernel=(1, kernel[0]), strides=(1, strides[0]),
                                 pads=(0, begin, 0, end), **extra)
        imp.emit("Reshape", node, [pooled], shape=(n, c, olen))
    else:
        n, c, d, h, w = shape
        od, oh, ow = imp.shapes_of(out)[2:]
        planes = imp.emit_shaped("Reshape", node, [x], (n, c * d, h, w), shape=(n, c * d, h, w))
        hw = imp.emit_shaped(op, node, [planes], (n, c * d, oh, ow), kernel=kernel[1:], strides=strides[1:],
                             pads=(pads[1][0], pads[2][0], pads[1][1], pads[2][1]), **extra)
        cols = imp.emit_shaped("Reshape", node, [hw], (n, c, d, oh * ow), shape=(n, c, d, oh * ow))
        depth = imp.emit_shaped(op, node, [cols], (n, c, od, oh * ow), kernel=(kernel[0], 1), strides=(strides[0], 1),
                                pads=(pads[0][0], 0, pads[0][1], 0), **extra)
        imp.emit("Reshape", node, [depth], shape=(n, c, od, oh, ow))


def _pad_by_index(imp: _Importer, node: onnx.NodeProto, mode: str, pads: list[int]) -> None:
    """Pad in ``reflect``, ``edge`` or ``wrap`` mode as one Slice: along each padded axis of ``n`` elements, the index
    list ``numpy.pad(arange(n), pads, mode)`` (``symmetric`` is not ONNX's; reflect excludes the edge), a negative pad
    cropping it. Reflecting more than ``n - 1`` elements is refused, as onnxruntime refuses it."""
    shape = imp.shape(node.input[0])
    rank = len(shape)
    axes, indices = [], []
    for axis, n in enumerate(shape):
        begin, end = pads[axis], pads[axis + rank]
        if begin == 0 and end == 0:
            continue
        if mode == "reflect" and max(begin, end) > n - 1:
            raise UnsupportedOperatorError(node.op_type, node.name, f"reflect pads {pads} of {max(begin, end)} on "
                                                                    f"axis {axis} of {n} elements (at most {n - 1})")
        grown = np.pad(np.arange(n), (max(begin, 0), max(end, 0)), mode=mode)  # type: ignore[call-overload]
        kept = grown[max(-begin, 0):len(grown) - max(-end, 0)]
        if kept.size == 0:
            raise UnsupportedOperatorError(node.op_type, node.name, f"pads {pads} that leave axis {axis} empty")
        axes.append(axis)
        indices.append(tuple(int(i) for i in kept))
    if not axes:
        imp.alias[node.output[0]] = imp.name(node.input[0])
        return
    imp.emit("Slice", node, [node.input[0]], axes=tuple(axes), indices=tuple(indices))


def _global_average_pool(imp: _Importer, node: onnx.NodeProto) -> None:
    """GlobalAveragePool: over H and W at rank 4; at rank 3 or 5 (torch's ``AdaptiveAvgPool1d(1)``, as Swin's pooler
    writes it, and 3D pools) the spatial axes are viewed as one ``[N, C, L, 1]`` plane, pooled, and viewed back as
    ``[N, C, 1, ...]``."""
    x = node.input[0]
    shape = imp.shape(x)
    if len(shape) == 4:
        imp.emit("GlobalAvgPool", node, [x])
        return
    if len(shape) < 3:
        raise UnsupportedOperatorError(node.op_type, node.name, f"an input of rank {len(shape)} (it pools the axes "
                                                                f"after N and C)")
    n, c = shape[:2]
    length = int(np.prod(shape[2:]))
    plane = imp.emit_shaped("Reshape", node, [x], (n, c, length, 1), shape=(n, c, length, 1))
    pooled = imp.emit_shaped("GlobalAvgPool", node, [plane], (n, c, 1, 1))
    out = (n, c) + (1,) * (len(shape) - 2)
    imp.emit("Reshape", node, [pooled], shape=out)


def _ceil_pads(imp: _Importer, node: onnx.NodeProto, kernel: tuple[int, ...], strides: tuple[int, ...],
               pads: list[tuple[int, int]], extra: dict[str, Any]
               ) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """``ceil_mode=1`` as more end padding: each axis padded at its end until the windows of the output's size
    (shape inference's) fit, the last partial window then pooling the input elements it covers (onnxruntime's and
    torch's ceil mode). An AveragePool counts only input elements then, so a ``count_include_pad=1`` with pads of
    its own is refused (its real pads would count, the added ones not); with no pads it is the same as 0. A last
    window starting past the input and its begin pad is refused. An axis of one window longer than its padded input
    (EfficientNet's ``AvgPool2d(1280, ceil_mode=True)`` on a small image) takes the padded input's length as its
    window, which covers the same elements, instead of padding by the window's length. Returns the kernel and the
    pads ``(begin, end)`` per axis."""
    shape = imp.shape(node.input[0])[2:]
    out = imp.shapes_of(node.output[0])[2:]
    grown, kernel = [], tuple(size + begin + end if o == 1 and k > size + begin + end else k
                              for size, k, (begin, end), o in zip(shape, kernel, pads, out))
    for size, k, s, (begin, end), o in zip(shape, kernel, strides, pads, out):
        if (o - 1) * s >= size + begin:
            raise UnsupportedOperatorError(node.op_type, node.name, f"ceil_mode=1 with a last window that starts "
                                                                    f"in the end padding (output {o} of {size})")
        grown.append((begin, max(end, (o - 1) * s + k - size - begin)))
    if grown != pads and extra.get("count_include_pad"):
        if any(b or e for b, e in pads):
            raise UnsupportedOperatorError(node.op_type, node.name, "ceil_mode=1 with count_include_pad=1 and pads "
                                                                    "of its own")
        extra["count_include_pad"] = False
    return kernel, grown


def _reshape(imp: _Importer, node: onnx.NodeProto) -> None:
    """Reshape to the output's inferred shape, which must hold the input's elements (ONNX's shape inference passes a
    constant shape of another size through)."""
    shape, before = imp.shapes_of(node.output[0]), imp.shape(node.input[0])
    if math.prod(shape) != math.prod(before):
        raise GraphError(f"Reshape node {node.name or node.output[0]!r} reshapes tensor {node.input[0]!r} of shape "
                         f"{'x'.join(map(str, before))} ({math.prod(before):,} elements) into "
                         f"{'x'.join(map(str, shape))} ({math.prod(shape):,} elements): its shape does not fit."
                         + imp.open_sizes_hint())
    imp.emit("Reshape", node, [node.input[0]], shape=shape)


def _pad(imp: _Importer, node: onnx.NodeProto) -> None:
    """Pad: ``constant`` as the IR's Pad (negative pads crop with a Slice after it); ``reflect``, ``edge`` and ``wrap``
    as one Slice whose index list per padded axis repeats the input's own elements (numpy's pad of the indices, as
    ONNX's reference computes it; TResNet's anti-aliasing pads by reflection)."""
    a = _attrs(node)
    mode = _decode(a.get("mode", "constant"))
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"mode {mode!r} (only constant, reflect, edge and "
                                                                f"wrap)")
    pads = a.get("pads")
    value = float(a.get("value", 0.0))
    pads_input, value_input = imp.const_input(node, 1, "pads"), imp.const_input(node, 2, "constant_value")
    if pads_input is not None:
        pads = pads_input.tolist()
    if pads is None:
        raise UnsupportedOperatorError(node.op_type, node.name, "no pads given")
    if value_input is not None:
        value = float(value_input.reshape(()))
    x = node.input[0]
    rank = len(imp.shape(x))
    axes_input = imp.const_input(node, 3, "axes")
    if axes_input is not None:               # pads for the listed axes only (opset 18): 0 on the others
        axes = [int(a) % rank for a in axes_input.reshape(-1)]
        if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
            raise UnsupportedOperatorError(node.op_type, node.name, f"{len(pads)} pads for the axes {axes}")
        full = [0] * (2 * rank)
        for k, axis in enumerate(axes):
            full[axis], full[axis + rank] = int(pads[k]), int(pads[k + len(axes)])
        pads = full
    pads = [int(p) for p in pads]
    if len(pads) != 2 * rank:
        raise UnsupportedOperatorError(node.op_type, node.name, f"{len(pads)} pads for a tensor of rank {rank}")
    if mode != "constant":
        _pad_by_index(imp, node, mode, pads)
        return
    if min(pads) >= 0:
        imp.emit("Pad", node, [x], pads=tuple(pads), value=value)
        return
    # negative pads crop (RWKV's time shift, ZeroPad2d((0, 0, 1, -1))): the padding, then a Slice of what stays
    left = [n + pads[i] + pads[i + rank] for i, n in enumerate(imp.shape(x))]
    if min(left) <= 0:
        axis = next(i for i, n in enumerate(left) if n <= 0)
        raise UnsupportedOperatorError(node.op_type, node.name, f"pads {pads} that leave axis {axis} (of "
                                                                f"{imp.shape(x)[axis]}) with {left[axis]} elements")
    grown = tuple(max(p, 0) for p in pads)
    shape = tuple(n + grown[i] + grown[i + rank] for i, n in enumerate(imp.shape(x)))
    if any(grown):
        x = imp.emit_shaped("Pad", node, [x], shape, pads=grown, value=value)
    axes, kept = [], []
    for i, n in enumerate(shape):
        begin, end = -min(pads[i], 0), n + min(pads[i + rank], 0)
        if begin or end != n:
            axes.append(i)
            kept.append(tuple(range(begin, max(end, begin))))
    imp.emit("Slice", node, [x], axes=tuple(axes), indices=tuple(kept))


def _axis_op(op: str) -> Callable[[_Importer, onnx.NodeProto], None]:
    def rule(imp: _Importer, node: onnx.NodeProto) -> None:
        rank = len(imp.shapes_of(node.output[0]))       # the output's: the first input may be a constant
        axis = int(_attrs(node).get("axis", -1 if op in ("Softmax", "LogSoftmax") else 0))
        inputs = [imp.use_const(t) if imp.is_const(t) else t for t in node.input]   # Concat of a constant
        imp.emit(op, node, inputs, axis=axis % rank)
    return rule


def _transpose(imp: _Importer, node: onnx.NodeProto) -> None:
    rank = len(imp.shape(node.input[0]))
    perm = tuple(int(p) % rank for p in _attrs(node).get("perm", range(rank - 1, -1, -1)))
    imp.emit("Transpose", node, [node.input[0]], perm=perm)


def _depth_to_space(imp: _Importer, node: onnx.NodeProto) -> None:
    """DepthToSpace as ONNX defines it: Reshape to 6D, Transpose, Reshape."""
    a = _attrs(node)
    mode, bs = _decode(a.get("mode", "DCR")), int(a["blocksize"])
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOperatorError(node.op_type, node.name, f"mode {mode!r} (only 'DCR' and 'CRD')")
    n, c, h, w = imp.shape(node.input[0])
    if mode == "DCR":
        split, perm = (n, bs, bs, c // bs**2, h, w), (0, 3, 4, 1, 5, 2)
    else:
        split, perm = (n, c // bs**2, bs, bs, h, w), (0, 1, 4, 2, 5, 3)
    blocks = imp.emit_shaped("Reshape", node, [node.input[0]], split, shape=split)
    moved = imp.emit_shaped("Transpose", node, [blocks], tuple(split[p] for p in perm), perm=perm)
    imp.emit("Reshape", node, [moved], shape=(n, c // bs**2, h * bs, w * bs))


RESIZE_COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
"""Resize's coordinate transformations the lab implements (with modes ``nearest`` and ``linear``); ONNX's other one,
``tf_crop_and_resize`` (a region of interest, an extrapolation value), is refused by name, as are ``cubic``,
``antialias=1`` and a ``keep_aspect_ratio_policy`` other than ``stretch``."""


def resize_attrs(node: onnx.NodeProto, in_shape: tuple[int, ...], given: np.ndarray | None,
                 sizes: np.ndarray | None) -> dict[str, Any]:
    """The IR Resize's attributes but ``sizes`` (the output shape, which the caller knows) of ONNX Resize ``node`` of
    an input of ``in_shape``, with its constant ``scales`` (``given``) or ``sizes`` input; UnsupportedOperatorError
    listing every attribute the lab does not take."""
    a = _attrs(node)
    mode = _decode(a.get("mode", "nearest"))
    coord = _decode(a.get("coordinate_transformation_mode", "half_pixel"))
    policy = _decode(a.get("keep_aspect_ratio_policy", "stretch"))
    problems = []
    if mode not in ("nearest", "linear", "cubic"):
        problems.append(f"mode {mode!r} (only 'nearest', 'linear' and 'cubic')")
    if coord not in RESIZE_COORDINATE_MODES:
        problems.append(f"coordinate_transformation_mode {coord!r} (only {', '.join(RESIZE_COORDINATE_MODES)})")
    if a.get("antialias", 0):
        problems.append("antialias=1 (only 0)")
    if policy != "stretch":
        problems.append(f"keep_aspect_ratio_policy {policy!r} (only 'stretch')")
    nearest = _decode(a.get("nearest_mode", "round_prefer_floor"))
    if mode == "nearest" and nearest not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        problems.append(f"nearest_mode {nearest!r}")
    if problems:
        raise UnsupportedOperatorError(node.op_type, node.name, "; ".join(problems))
    rank = len(in_shape)
    axes = [int(x) % rank for x in a.get("axes", range(rank))]
    scales = [1.0] * rank
    if given is not None and given.size:
        for axis, value in zip(axes, given.reshape(-1).tolist()):
            scales[axis] = float(value)
    elif sizes is not None:
        for axis, value in zip(axes, sizes.reshape(-1).tolist()):
            scales[axis] = int(value) / in_shape[axis]
    else:
        raise UnsupportedOperatorError(node.op_type, node.name, "neither scales nor sizes is given")
    cubic: dict[str, Any] = {"cubic_coeff_a": float(a.get("cubic_coeff_a", -0.75)),
                             "exclude_outside": int(a.get("exclude_outside", 0))} if mode == "cubic" else {}
    return {"mode": mode, "coordinate_transformation_mode": coord, "nearest_mode": nearest, "scales": tuple(scales),
            **cubic}


def _resize(imp: _Importer, node: onnx.NodeProto) -> None:
    attrs = resize_attrs(node, imp.shape(node.input[0]), imp.const_input(node, 2, "scales"),
                         imp.const_input(node, 3, "sizes"))
    imp.emit("Resize", node, [node.input[0]], sizes=tuple(imp.shapes_of(node.output[0])), **attrs)
