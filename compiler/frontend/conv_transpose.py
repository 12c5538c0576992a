"""ConvTranspose as the nodes the lab imports: one Conv of every output phase, the phases interleaved, the pads cut.

A transposed convolution of stride ``s`` writes output position ``y`` (before its pads are cut) from the inputs
``j`` and taps ``k`` with ``y = s * j + k``. Splitting ``y = s * q + r`` into a *phase* ``r`` (``0 <= r < s``) and a
block ``q``, each phase is an ordinary correlation of the input with the taps ``k = s * m + r`` taken in reverse
order: ``out[s * q + r] = sum_t x[q - (T - 1) + t] * W[s * (T - 1 - t) + r]``, ``T = ceil(K / s)`` taps (a tap
beyond ``K`` is zero). So a ConvTranspose of ``C_in -> C_out`` channels becomes:

1. one ``Conv`` with ``C_out * s_h * s_w`` output channels (channel ``c * s_h * s_w + r_h * s_w + r_w`` is phase
   ``(r_h, r_w)`` of channel ``c``), kernel ``T_h x T_w``, the input padded by ``T - 1`` on each side (and more at
   the end where ``output_padding`` asks for it), the same groups, the bias repeated per phase;
2. the phases interleaved: ``Reshape [N, C_out, s_h, s_w, H', W']``, ``Transpose`` to ``[N, C_out, H', s_h, W',
   s_w]``, ``Reshape [N, C_out, H' * s_h, W' * s_w]``;
3. a ``Slice`` that cuts the begin pads and keeps the output's length.

Every output value is the same sum of products as onnxruntime's (in another order, so float results differ by
rounding), the Conv is an ordinary layer the accelerator runs, and no zeros are inserted between the inputs (the
zero-insertion form would spend ``s_h * s_w`` times the MACs). 1-D, 2-D and 3-D windows (a 3-D phase Conv then runs
over its frames, :mod:`.conv3d`), any strides, pads, ``output_padding``, ``output_shape``, ``auto_pad`` ``VALID`` and
``SAME_UPPER``, groups, and dilations (below); ``SAME_LOWER`` (whose output length onnxruntime computes otherwise
than the ONNX text at some shapes)
and ``SAME_UPPER`` with ``output_padding`` (onnxruntime and ONNX's shape inference disagree on its length) are refused
with the reason, and so is ``SAME_UPPER`` with a kernel shorter than its stride (onnxruntime's length differs from the
ONNX text's again) (:func:`rewrite_conv_transposes`). An ``output_shape`` longer than the full output puts the
extra positions at the end (zeros plus the bias), as onnxruntime does (it clamps the total padding at 0).

A dilated ``Conv`` (:func:`undilate_convs`, before the rewrite above) of strides 1 takes the *phase form*, TF's
space-to-batch: output ``y[d * q + r]`` (``r`` the phase, ``0 <= r < d``) is ``sum_t w[t] x'[d * (q + t) + r]``, an
undilated correlation of the phase's subsequence ``x'[d * m + r]`` of the padded input. So the input is padded (to
whole phases: zeros at the end change no output kept), reshaped to ``[N, C, H'/d_h, d_h, W'/d_w, d_w]`` and
transposed to put the ``d_h * d_w`` phases into the batch; one undilated ``Conv`` (the same weights, groups and
bias; no pads) runs over that batch on the accelerator at the kernel's own MACs; the phases are put back
(``Reshape``, ``Transpose`` to ``[N, C_out, H_q, d_h, W_q, d_w]``, ``Reshape``) and a ``Slice`` keeps the output's
length. DeepLab's ASPP (3x3 at dilation 12 to 36) so costs 9 taps a position, not up to 73 x 73. A dilated
``MaxPool`` or ``AveragePool`` of strides 1 and no pads (1-D or 2-D) takes the same form with the undilated pool in
place of the Conv (the zeros added at the end to whole phases lie in no kept window). A dilated Conv of
another stride, and a dilated ``ConvTranspose``, take the kernel with ``d - 1`` zeros between its taps (``(K - 1) * d
+ 1`` taps; the same sums for every pad mode, stride and output length), where that costs at most
:data:`SPREAD_LIMIT` times the MACs (the accelerator multiplies the zeros too, and the report counts them); beyond it
they are refused with the reason.

``Col2Im`` (torch's ``F.fold``: MobileViTV2 folds its patches back into an image) is a ConvTranspose
(:func:`col2im_as_conv_transposes`, before the rest): the column ``c * kh * kw + i * kw + j`` of block ``l`` adds to
pixel ``(i, j)`` of the window at block ``l``, which is a grouped ConvTranspose of the columns viewed as ``[N,
C * kh * kw, oh, ow]`` by one-hot weights ``[C * kh * kw, 1, kh, kw]`` (group ``C``) at the fold's strides, pads and
dilations. Overlapping windows sum, as Col2Im sums them; a fold of windows that tile the image (stride = block)
moves values only."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_common import _attrs, _decode, tensor_namer

__all__ = ["rewrite_conv_transposes", "phase_weights", "undilate_convs", "col2im_as_conv_transposes"]


def phase_weights(weight: np.ndarray, strides: tuple[int, ...], group: int) -> np.ndarray:
    """The Conv weights ``[C_out * prod(s), C_in / group, T...]`` of a ConvTranspose's ``weight`` ``[C_in, C_out /
    group, K...]`` (see the module docstring): output channel ``c * prod(s) + r`` (``r`` the phase, row-major over the
    axes), input channel ``i`` of its group, tap ``t`` holds ``weight[g * C_in/group + i, c - g * C_out/group,
    s * (T - 1 - t) + r]``, zero beyond the kernel."""
    c_in, c_og = weight.shape[:2]
    kernel = weight.shape[2:]
    rank = len(kernel)
    taps = tuple(math.ceil(k / s) for k, s in zip(kernel, strides))
    padded = np.zeros((c_in, c_og) + tuple(t * s for t, s in zip(taps, strides)), weight.dtype)
    padded[(slice(None), slice(None)) + tuple(slice(0, k) for k in kernel)] = weight
    split = padded.reshape((c_in, c_og) + tuple(v for t, s in zip(taps, strides) for v in (t, s)))   # tap s*m + r
    flipped = split[(slice(None), slice(None)) + (slice(None, None, -1), slice(None)) * rank]        # m -> T-1-t
    order = [1] + [3 + 2 * a for a in range(rank)] + [0] + [2 + 2 * a for a in range(rank)]
    per = flipped.transpose(order).reshape((c_og * int(np.prod(strides)), c_in) + taps)
    c_in_g = c_in // group
    return np.ascontiguousarray(np.concatenate([per[:, g * c_in_g:(g + 1) * c_in_g] for g in range(group)], axis=0))


def _plan(node: onnx.NodeProto, x_shape: tuple[int, ...], kernel: tuple[int, ...]
          ) -> tuple[tuple[int, ...], list[int], list[int]] | str:
    """``(strides, begin pads, output lengths)`` per spatial axis, or why the node is refused."""
    rank = len(kernel)
    if rank not in (1, 2, 3):
        return f"a {rank}-D window (only 1-D, 2-D and 3-D)"
    a = _attrs(node)
    dilations = [int(d) for d in a.get("dilations", [1] * rank)]
    if any(d != 1 for d in dilations):
        return (f"dilations {dilations} (a dilated ConvTranspose needs constant weights and a kernel whose zeros cost "
                f"at most {SPREAD_LIMIT:g} times its MACs)")
    strides = tuple(int(s) for s in a.get("strides", [1] * rank))
    out_pad = [int(p) for p in a.get("output_padding", [0] * rank)]
    pads = [int(p) for p in a.get("pads", [0] * (2 * rank))]
    auto_pad = str(_decode(a.get("auto_pad", "NOTSET")))
    shape = [int(v) for v in a.get("output_shape", [])]
    if len(strides) != rank or len(out_pad) != rank or len(pads) != 2 * rank or min(strides) < 1:
        return f"strides {list(strides)}, output_padding {out_pad}, pads {pads} for a {rank}-D window"
    sizes = x_shape[2:]
    full = [s * (n - 1) + o + k for s, n, o, k in zip(strides, sizes, out_pad, kernel)]
    if auto_pad == "SAME_LOWER":
        return ("auto_pad SAME_LOWER (onnxruntime's output length differs from the ONNX text's at some shapes); give "
                "explicit pads")
    if auto_pad == "SAME_UPPER" and any(out_pad):
        return ("auto_pad SAME_UPPER with output_padding (onnxruntime and ONNX's shape inference disagree on the "
                "output length); give explicit pads")
    if auto_pad == "SAME_UPPER" and not shape and any(k < st for k, st in zip(kernel, strides)):
        return ("auto_pad SAME_UPPER with a kernel shorter than its stride (onnxruntime's output length differs from "
                "the ONNX text's); give explicit pads")
    if auto_pad == "SAME_UPPER" and not shape:
        shape = [n * s for n, s in zip(sizes, strides)]
    if shape:
        shape = shape[-rank:]
        total = [f - o for f, o in zip(full, shape)]
        upper = auto_pad == "SAME_UPPER"
        begin = [0 if t < 0 else t // 2 if upper else t - t // 2 for t in total]   # longer: zeros at the end, as
        end = [t - b for t, b in zip(total, begin)]                                # onnxruntime clamps the padding
    elif auto_pad == "VALID":
        begin, end = [0] * rank, [0] * rank
    else:
        begin, end = pads[:rank], pads[rank:]
    lengths = [f - b - e for f, b, e in zip(full, begin, end)]
    if min(lengths) < 1:
        return f"pads {begin + end} that leave no output (lengths {lengths})"
    if any(o >= s for o, s in zip(out_pad, strides)):
        return f"output_padding {out_pad} not below the strides {list(strides)}"
    return strides, begin, lengths


def rewrite_conv_transposes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """In place: every ConvTranspose with a constant weight (and bias) and a static input shape becomes the nodes
    the module docstring describes. Returns ``{first output: reason}`` for those refused (the caller reports them
    when no rule takes the node); the caller infers the new tensors' shapes when anything changed."""
    consts = {init.name: init for init in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    refused: dict[str, str] = {}
    changed = False
    for node in model.graph.node:
        if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        x_shape = shapes.get(node.input[0])
        w_init = consts.get(node.input[1]) if len(node.input) > 1 else None
        b_name = node.input[2] if len(node.input) > 2 else ""
        if x_shape is None or w_init is None or (b_name and b_name not in consts):
            refused[node.output[0]] = "a weight or bias computed at run time, or an input of unknown shape"
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(w_init).astype(np.float32)
        group = int(_attrs(node).get("group", 1))
        kernel = tuple(int(k) for k in weight.shape[2:])
        plan = _plan(node, x_shape, kernel)
        if isinstance(plan, str):
            refused[node.output[0]] = plan
            nodes.append(node)
            continue
        strides, begin, lengths = plan
        if group < 1 or x_shape[1] != weight.shape[0] or weight.shape[0] % group:
            refused[node.output[0]] = f"group {group} for {x_shape[1]} input channels and weights {weight.shape}"
            nodes.append(node)
            continue
        changed = True
        nodes += _phase_nodes(model, node, x_shape, weight, group, strides, begin, lengths,
                              numpy_helper.to_array(consts[b_name]).astype(np.float32) if b_name else None)
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return refused


def _phase_nodes(model: onnx.ModelProto, node: onnx.NodeProto, x_shape: tuple[int, ...], weight: np.ndarray,
                 group: int, strides: tuple[int, ...], begin: list[int], lengths: list[int],
                 bias: np.ndarray | None) -> list[onnx.NodeProto]:
    """The Conv, interleave and Slice nodes of one ConvTranspose (module docstring): the output's ``lengths`` per
    axis from ``begin`` on, ``output_padding``'s positions included (the phases cover them with zeros)."""
    name = node.name or node.output[0]
    rank = len(strides)
    c_out = weight.shape[1] * group
    kernel = weight.shape[2:]
    taps = [math.ceil(k / s) for k, s in zip(kernel, strides)]
    sizes = x_shape[2:]
    # a negative begin pad (zeros before the full output): ``early`` more blocks of padding before the input
    early = [math.ceil(max(0, -b) / s) for b, s in zip(begin, strides)]
    starts_at = [b + s * e for b, s, e in zip(begin, strides, early)]
    # the end pad: at least T - 1 (every full position), more while s * blocks falls short of the cut's end
    late = [max(t - 1, math.ceil((a + length) / s) - n - e) for t, a, length, s, n, e in
            zip(taps, starts_at, lengths, strides, sizes, early)]
    blocks = [n + e + pad for n, e, pad in zip(sizes, early, late)]
    conv_pads = [t - 1 + e for t, e in zip(taps, early)] + late
    phases = int(np.prod(strides))

    def const(suffix: str, value: np.ndarray) -> str:
        tensor = f"{name}_{suffix}"
        model.graph.initializer.append(numpy_helper.from_array(value, tensor))
        return tensor

    conv_inputs = [node.input[0], const("phase_weight", phase_weights(weight, strides, group))]
    if bias is not None:
        conv_inputs.append(const("phase_bias", np.repeat(bias.reshape(-1), phases).astype(np.float32)))
    phased = f"{name}_phases"
    out = [helper.make_node("Conv", conv_inputs, [phased], name=f"{name}_phase_conv", group=group,
                            kernel_shape=taps, pads=conv_pads, strides=[1] * rank)]
    n = x_shape[0]
    split = const("phase_split", np.array([n, c_out, *strides, *blocks], np.int64))
    perm = [0, 1] + [v for a in range(rank) for v in (2 + rank + a, 2 + a)]
    joined = const("phase_join", np.array([n, c_out, *[b * s for b, s in zip(blocks, strides)]], np.int64))
    starts = const("cut_starts", np.array(starts_at, np.int64))
    ends = const("cut_ends", np.array([a + length for a, length in zip(starts_at, lengths)], np.int64))
    axes = const("cut_axes", np.arange(2, 2 + rank, dtype=np.int64))
    out += [helper.make_node("Reshape", [phased, split], [f"{name}_split"], name=f"{name}_split"),
            helper.make_node("Transpose", [f"{name}_split"], [f"{name}_interleaved"], name=f"{name}_interleave",
                             perm=perm),
            helper.make_node("Reshape", [f"{name}_interleaved", joined], [f"{name}_joined"], name=f"{name}_join"),
            helper.make_node("Slice", [f"{name}_joined", starts, ends, axes], [node.output[0]], name=f"{name}_cut")]
    return out


SPREAD_LIMIT = 4.0
"""The most MACs, as a multiple of the dilated kernel's own, that a kernel with its zeros may cost (a stride other
than 1, or a ConvTranspose; a stride-1 Conv takes the phase form whatever its dilation)."""


def undilate_convs(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """In place: every Conv and ConvTranspose with dilations other than 1 and a constant weight (an initializer)
    loses its dilations (module docstring): a Conv of strides 1 and a static input shape (``shapes``) as the phase
    form, any other as the kernel with its zeros where that costs at most :data:`SPREAD_LIMIT` times the MACs.
    Returns ``{first output: reason}`` for those left dilated (the caller reports them when no rule takes the
    node)."""
    consts = {init.name: init for init in model.graph.initializer}
    refused: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    fresh = tensor_namer(model)
    for node in model.graph.node:
        nodes.append(node)
        if node.op_type in ("MaxPool", "AveragePool") and node.domain in ("", "ai.onnx"):
            pool = _dilated_pool(node, shapes)
            if pool is not None:
                nodes[-1:] = _dilated_phase_nodes(model, node, *pool, pool[0][1], fresh)   # its channels stay
            continue
        if node.op_type not in ("Conv", "ConvTranspose") or node.domain not in ("", "ai.onnx") or \
                len(node.input) < 2 or node.input[1] not in consts:
            continue
        attr = next((a for a in node.attribute if a.name == "dilations"), None)
        if attr is None or all(d == 1 for d in attr.ints) or len(attr.ints) != len(consts[node.input[1]].dims) - 2 or \
                min(attr.ints) < 1:
            continue                       # the weights of every other Conv stay unread
        weight = numpy_helper.to_array(consts[node.input[1]])
        dilations = [int(d) for d in attr.ints]
        kernel = [int(k) for k in weight.shape[2:]]
        a = _attrs(node)
        x_shape = shapes.get(node.input[0])
        if node.op_type == "Conv" and all(int(v) == 1 for v in a.get("strides", [1] * len(kernel))) and \
                len(kernel) in (1, 2) and x_shape is not None and len(x_shape) == 2 + len(kernel):
            pads = _stride1_pads(a, kernel, dilations)
            out_len = [] if pads is None else [n + b + e - (k - 1) * d for n, b, e, k, d in
                                               zip(x_shape[2:], pads[:len(kernel)], pads[len(kernel):], kernel,
                                                   dilations)]
            if pads is not None and min(pads) >= 0 and min(out_len) >= 1:    # else the kernel with its zeros
                nodes[-1:] = _dilated_phase_nodes(model, node, x_shape, kernel, dilations, pads, out_len,
                                                  int(weight.shape[0]), fresh)
                continue
        spread_shape = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
        growth = float(np.prod(spread_shape)) / float(np.prod(kernel))
        if growth > SPREAD_LIMIT:
            refused[node.output[0]] = (f"dilations {dilations} of a {'x'.join(map(str, kernel))} kernel with strides "
                                       f"{list(a.get('strides', []))}: its kernel with the zeros would cost "
                                       f"{growth:.1f} times the MACs (the phase form takes a Conv of strides 1)")
            continue
        spread = np.zeros((*weight.shape[:2], *spread_shape), weight.dtype)
        spread[(slice(None), slice(None), *(slice(None, None, d) for d in dilations))] = weight
        name = f"{node.input[1]}_dilated_{'x'.join(map(str, dilations))}"
        if name not in consts:
            consts[name] = numpy_helper.from_array(spread, name)
            model.graph.initializer.append(consts[name])
        node.input[1] = name
        node.attribute.remove(attr)
        kernel_attr = next((k for k in node.attribute if k.name == "kernel_shape"), None)
        if kernel_attr is not None:
            kernel_attr.ints[:] = spread_shape
    if len(nodes) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return refused


def _dilated_pool(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]
                  ) -> tuple[tuple[int, ...], list[int], list[int], list[int], list[int]] | None:
    """For a dilated MaxPool or AveragePool the phase form takes (1-D or 2-D, strides 1, no pads, a static input, no
    Indices output): its input shape, kernel, dilations, pads (zeros) and output lengths; else None (the pool rule
    then names the dilations)."""
    a = _attrs(node)
    kernel = [int(k) for k in a.get("kernel_shape", [])]
    dilations = [int(d) for d in a.get("dilations", [1] * len(kernel))]
    x_shape = shapes.get(node.input[0])
    if len(kernel) not in (1, 2) or len(dilations) != len(kernel) or all(d == 1 for d in dilations) or \
            min(dilations) < 1 or any(int(v) != 1 for v in a.get("strides", [1] * len(kernel))) or \
            any(int(p) for p in a.get("pads", [])) or _decode(a.get("auto_pad", "NOTSET")) not in ("NOTSET", "VALID") \
            or x_shape is None or len(x_shape) != 2 + len(kernel) or (len(node.output) > 1 and node.output[1]):
        return None
    out_len = [n - (k - 1) * d for n, k, d in zip(x_shape[2:], kernel, dilations)]
    return (x_shape, kernel, dilations, [0] * (2 * len(kernel)), out_len) if min(out_len) >= 1 else None


def _stride1_pads(a: dict, kernel: list[int], dilations: list[int]) -> list[int] | None:
    """A stride-1 Conv's pads ``[begins..., ends...]`` from ``pads`` or ``auto_pad``; None for an unknown mode."""
    mode = _decode(a.get("auto_pad", "NOTSET"))
    rank = len(kernel)
    if mode in ("NOTSET", ""):
        return [int(p) for p in a.get("pads", [0] * (2 * rank))]
    if mode == "VALID":
        return [0] * (2 * rank)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        return None
    total = [(k - 1) * d for k, d in zip(kernel, dilations)]
    small = [t // 2 for t in total]
    big = [t - h for t, h in zip(total, small)]
    return small + big if mode == "SAME_UPPER" else big + small


def _dilated_phase_nodes(model: onnx.ModelProto, node: onnx.NodeProto, x_shape: tuple[int, ...], kernel: list[int],
                         dilations: list[int], pads: list[int], out_len: list[int], c_out: int,
                         new: Callable[[str], str]) -> list[onnx.NodeProto]:
    """The nodes of a stride-1 dilated Conv (or pool) in the phase form (module docstring): pad (to whole phases),
    split each axis into its ``d`` phases and move them into the batch, the undilated Conv (``c_out`` output
    channels) or pool, the phases back, the cut. New tensors are named by ``new`` (one
    :func:`.onnx_common.tensor_namer` of ``model`` for the whole pass: node names need not be unique)."""
    name = node.name or node.output[0]
    made: dict[str, str] = {}

    def t(suffix: str) -> str:
        """The tensor ``<name>_<suffix>`` of this node's nodes, a name no other tensor has."""
        if suffix not in made:
            made[suffix] = new(f"{name}_{suffix}")
        return made[suffix]

    rank = len(kernel)
    n, c = x_shape[:2]
    padded = [size + b + e for size, b, e in zip(x_shape[2:], pads[:rank], pads[rank:])]
    blocks = [math.ceil(p / d) for p, d in zip(padded, dilations)]
    grown = [q * d - p for q, d, p in zip(blocks, dilations, padded)]        # zeros after the end: whole phases
    blocks_out = [q - k + 1 for q, k in zip(blocks, kernel)]
    phases = int(np.prod(dilations))
    a = _attrs(node)
    group = int(a.get("group", 1))

    def const(suffix: str, value: np.ndarray) -> str:
        tensor = t(suffix)
        model.graph.initializer.append(numpy_helper.from_array(value, tensor))
        return tensor

    out: list[onnx.NodeProto] = []
    x = node.input[0]
    if any(pads) or any(grown):
        pad_values = const("phase_pads", np.array([0, 0, *pads[:rank], 0, 0,
                                                   *[e + g for e, g in zip(pads[rank:], grown)]], np.int64))
        out.append(helper.make_node("Pad", [x, pad_values], [t("padded")], name=f"{name}_pad"))
        x = t("padded")
    split = [n, c] + [v for q, d in zip(blocks, dilations) for v in (q, d)]
    to_front = [3 + 2 * k for k in range(rank)] + [0, 1] + [2 + 2 * k for k in range(rank)]
    batched = [phases * n, c, *blocks]
    if node.op_type == "Conv":
        inputs = [t("phased_in"), node.input[1]] + ([node.input[2]] if len(node.input) > 2 and node.input[2]
                                                     else [])
        core = helper.make_node("Conv", inputs, [t("phased_out")], name=f"{name}_phase_conv", group=group,
                                kernel_shape=kernel, strides=[1] * rank, pads=[0] * (2 * rank))
    else:                                          # a pool of no pads: the same window over each phase
        core = helper.make_node(node.op_type, [t("phased_in")], [t("phased_out")], name=f"{name}_phase_pool",
                                kernel_shape=kernel, strides=[1] * rank)
    out += [helper.make_node("Reshape", [x, const("phase_split", np.array(split, np.int64))], [t("split")],
                             name=f"{name}_split"),
            helper.make_node("Transpose", [t("split")], [t("phases_first")], name=f"{name}_to_batch",
                             perm=to_front),
            helper.make_node("Reshape", [t("phases_first"), const("phase_batch", np.array(batched, np.int64))],
                             [t("phased_in")], name=f"{name}_batch"),
            core]
    unbatched = [*dilations, n, c_out, *blocks_out]
    back = [rank, rank + 1] + [v for k in range(rank) for v in (rank + 2 + k, k)]
    joined = [n, c_out, *[q * d for q, d in zip(blocks_out, dilations)]]
    out += [helper.make_node("Reshape", [t("phased_out"), const("phase_unbatch", np.array(unbatched, np.int64))],
                             [t("unbatched")], name=f"{name}_unbatch"),
            helper.make_node("Transpose", [t("unbatched")], [t("interleaved")], name=f"{name}_interleave",
                             perm=back),
            helper.make_node("Reshape", [t("interleaved"), const("phase_join", np.array(joined, np.int64))],
                             [t("joined")], name=f"{name}_join"),
            helper.make_node("Slice", [t("joined"), const("cut_starts", np.zeros(rank, np.int64)),
                                       const("cut_ends", np.array(out_len, np.int64)),
                                       const("cut_axes", np.arange(2, 2 + rank, dtype=np.int64))],
                             [node.output[0]], name=f"{name}_cut")]
    return out


def col2im_as_conv_transposes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """In place: every 2-D ``Col2Im`` with constant ``image_shape`` and ``block_shape`` and a static input
    ``[N, C * kh * kw, L]`` becomes a ``Reshape`` to ``[N, C * kh * kw, oh, ow]`` and the grouped ConvTranspose of
    one-hot weights the module docstring describes (its output length set by ``output_padding``); ``shapes`` gains
    the reshaped tensor. Returns ``{output: reason}`` for those left (the importer then names the node)."""
    consts = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    fresh = tensor_namer(model)
    nodes: list[onnx.NodeProto] = []
    refused: dict[str, str] = {}
    changed = False
    for node in model.graph.node:
        if node.op_type != "Col2Im" or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        plan = _col2im_plan(node, shapes.get(node.input[0]), consts)
        if isinstance(plan, str):
            refused[node.output[0]] = plan
            nodes.append(node)
            continue
        x4, weight, group, attrs = plan
        name = node.name or node.output[0]
        grid, onehot, blocks = fresh(f"{name}_grid"), fresh(f"{name}_onehot"), fresh(f"{name}_blocks")
        model.graph.initializer.extend([numpy_helper.from_array(np.array(x4, np.int64), grid),
                                        numpy_helper.from_array(weight, onehot)])
        shapes[blocks] = x4
        nodes += [helper.make_node("Reshape", [node.input[0], grid], [blocks], name=f"{name}_blocks"),
                  helper.make_node("ConvTranspose", [blocks, onehot], [node.output[0]], name=name, group=group,
                                   **attrs)]
        changed = True
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return refused


def _col2im_plan(node: onnx.NodeProto, x_shape: tuple[int, ...] | None, consts: dict[str, np.ndarray]
                 ) -> tuple[tuple[int, ...], np.ndarray, int, dict[str, Any]] | str:
    """``(the columns' 4-D view, the one-hot weights, group, the ConvTranspose's attributes)`` of a Col2Im, or why
    it is left."""
    if len(node.input) < 3 or node.input[1] not in consts or node.input[2] not in consts or x_shape is None:
        return "an image or block shape computed at run time, or an input of unknown shape"
    image = [int(v) for v in np.asarray(consts[node.input[1]]).reshape(-1)]
    block = [int(v) for v in np.asarray(consts[node.input[2]]).reshape(-1)]
    a = _attrs(node)
    strides = [int(v) for v in a.get("strides", [1, 1])]
    dilations = [int(v) for v in a.get("dilations", [1, 1])]
    pads = [int(v) for v in a.get("pads", [0, 0, 0, 0])]
    if len(image) != 2 or len(block) != 2 or len(x_shape) != 3 or len(strides) != 2 or len(dilations) != 2 or \
            len(pads) != 4 or min(block + strides + dilations) < 1 or min(pads) < 0 or min(image) < 1:
        return (f"image shape {image}, block shape {block}, strides {strides}, dilations {dilations} and pads "
                f"{pads} for an input of shape {list(x_shape)} (only 2-D folds of [N, C * kh * kw, L])")
    kh, kw = block
    grid = [(n + p0 + p1 - d * (k - 1) - 1) // s + 1
            for n, p0, p1, d, k, s in zip(image, pads[:2], pads[2:], dilations, block, strides)]
    batch, columns, length = x_shape
    if min(grid) < 1 or grid[0] * grid[1] != length or columns % (kh * kw):
        return (f"its input {list(x_shape)} does not hold {kh * kw}-column blocks over the {grid[0]} x {grid[1]} "
                f"windows of image shape {image}")
    out_pad = [n - ((g - 1) * s + d * (k - 1) + 1 - p0 - p1)
               for n, g, s, d, k, p0, p1 in zip(image, grid, strides, dilations, block, pads[:2], pads[2:])]
    weight = np.zeros((columns, 1, kh, kw), np.float32)
    rows = np.arange(columns)
    weight[rows, 0, (rows % (kh * kw)) // kw, rows % kw] = 1.0
    attrs: dict[str, Any] = {"strides": strides, "pads": pads, "dilations": dilations, "kernel_shape": block}
    if any(out_pad):
        attrs["output_padding"] = out_pad
    return (batch, columns, grid[0], grid[1]), weight, columns // (kh * kw), attrs
