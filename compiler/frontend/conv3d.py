"""3-D convolutions (video models, volumetric UNets) as one 2-D Conv over the frames: the accelerator's GEMM.

A ``Conv`` of a kernel ``[O, C/g, k_t, k_h, k_w]`` over ``x [N, C, T, H, W]`` sums, for output frame ``t``, the
``k_t`` input frames ``t * s_t + j * d_t - p_t`` (``j < k_t``) each convolved in 2-D with its slice of the kernel.
Stacking those ``k_t`` frames on the channel axis makes that sum one 2-D convolution with ``C * k_t`` input
channels, and putting the output frames into the batch makes the whole layer one ``Conv``
(:func:`rewrite_conv3d`):

1. ``Pad`` the time axis by ``p_t`` at each end (zeros, as the 3-D convolution's pads);
2. ``Gather`` the frames ``t * s_t + j * d_t`` (a constant ``[T', k_t]`` of indices) into ``[N, C, T', k_t, H, W]``
   (when ``k_t = 1`` and ``s_t = 1``, as in R(2+1)D's spatial convolutions, nothing is gathered), ``Transpose`` to
   ``[N, T', C, k_t, H, W]`` and ``Reshape`` to ``[N * T', C * k_t, H, W]``: channel ``c * k_t + j``;
3. one 2-D ``Conv`` of the kernel reshaped to ``[O, C/g * k_t, k_h, k_w]`` (the same channel order, so every group
   keeps its own channels), with the spatial strides, pads, dilations, the groups and the bias;
4. ``Reshape`` to ``[N, T', O, H', W']`` and ``Transpose`` to ``[N, O, T', H', W']``.

Every output is the same sum of products as the 3-D convolution's (in another order); the MACs are the layer's own
(the temporal pads' zero frames are multiplied, as a direct 3-D convolution multiplies them); the frames are held
``k_t / s_t`` times in memory. A ``BatchNormalization`` that alone reads the convolution (with constant statistics)
is folded into its weights and bias first, as the 2-D import folds it. ``auto_pad`` ``NOTSET``, ``VALID``,
``SAME_UPPER`` and ``SAME_LOWER`` are taken; a weight computed at run time or an input of unknown shape is refused
with the reason.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_common import _attrs, _decode, same_pads

__all__ = ["rewrite_conv3d"]


def _pads(a: dict, x_shape: tuple[int, ...], kernel: list[int], strides: list[int], dilations: list[int]
          ) -> list[int] | str:
    """The begin and end pads of each of the 3 axes (ONNX's order: begins, then ends), or the reason they are not
    taken."""
    auto = _decode(a.get("auto_pad", "NOTSET"))
    if auto in ("NOTSET", ""):
        pads = [int(p) for p in a.get("pads", [0] * 6)]
        return pads if len(pads) == 6 and min(pads) >= 0 else f"pads {pads}"
    if auto == "VALID":
        return [0] * 6
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        return f"auto_pad {auto!r}"
    spans = same_pads(auto, x_shape[2:], [(k - 1) * d + 1 for k, d in zip(kernel, dilations)], strides)
    return [begin for begin, _ in spans] + [end for _, end in spans]


def _batchnorm_reader(model: onnx.ModelProto, out: str, consts: dict[str, onnx.TensorProto]
                      ) -> onnx.NodeProto | None:
    """The BatchNormalization node that alone reads ``out`` (not a graph output), with constant scale, bias, mean
    and variance and no training mode; else None."""
    readers = [n for n in model.graph.node if out in n.input]
    if len(readers) != 1 or out in {o.name for o in model.graph.output}:
        return None
    bn = readers[0]
    if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or list(bn.input[:1]) != [out] or \
            len(bn.input) < 5 or any(t not in consts for t in bn.input[1:5]) or \
            int(_attrs(bn).get("training_mode", 0)) or len([o for o in bn.output if o]) != 1:
        return None
    return bn


def rewrite_conv3d(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """In place: every ``Conv`` of a 3-D kernel (a constant weight and bias) over an input of static shape becomes
    the nodes the module docstring describes; ``shapes`` gains their tensors' shapes. Returns ``{first output:
    reason}`` for those refused (the caller reports them when no rule takes the node)."""
    consts = {init.name: init for init in model.graph.initializer}
    refused: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    folded: set[int] = set()
    changed = False
    for node in model.graph.node:
        if id(node) in folded:
            continue
        nodes.append(node)
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        w_init = consts.get(node.input[1])
        x_shape = shapes.get(node.input[0])
        rank = len(w_init.dims) if w_init is not None else len(x_shape or ())
        if rank != 5:
            continue
        b_name = node.input[2] if len(node.input) > 2 else ""
        if w_init is None or (b_name and b_name not in consts) or x_shape is None or len(x_shape) != 5:
            refused[node.output[0]] = "a 3-D convolution whose weight or bias is computed at run time, or whose " \
                                      "input has no static shape"
            continue
        weight = numpy_helper.to_array(w_init).astype(np.float64)
        bias = numpy_helper.to_array(consts[b_name]).astype(np.float64) if b_name else np.zeros(weight.shape[0])
        a = _attrs(node)
        kernel = [int(k) for k in weight.shape[2:]]
        strides = [int(s) for s in a.get("strides", [1, 1, 1])]
        dilations = [int(d) for d in a.get("dilations", [1, 1, 1])]
        group = int(a.get("group", 1))
        pads = _pads(a, x_shape, kernel, strides, dilations)
        if isinstance(pads, str) or len(strides) != 3 or len(dilations) != 3 or min(strides + dilations) < 1 or \
                group < 1 or x_shape[1] != weight.shape[1] * group or weight.shape[0] % group:
            refused[node.output[0]] = (f"a 3-D convolution of {pads if isinstance(pads, str) else 'pads ' + str(pads)}"
                                       f", strides {strides}, dilations {dilations}, group {group} for "
                                       f"{x_shape[1]} input channels and weights {list(weight.shape)}")
            continue
        n, c, frames, h, w = x_shape
        padded = frames + pads[0] + pads[3]
        out_t = (padded - ((kernel[0] - 1) * dilations[0] + 1)) // strides[0] + 1
        if out_t < 1:
            refused[node.output[0]] = f"a 3-D convolution whose kernel spans more than its {padded} padded frames"
            continue
        out = node.output[0]
        bn = _batchnorm_reader(model, out, consts)
        if bn is not None:                         # fold it, as the 2-D import folds a BatchNormalization
            gamma, beta, mean, var = (numpy_helper.to_array(consts[t]).astype(np.float64) for t in bn.input[1:5])
            mult = gamma / np.sqrt(var + float(_attrs(bn).get("epsilon", 1e-5)))
            weight = weight * mult.reshape(-1, 1, 1, 1, 1)
            bias = bias * mult + beta - mean * mult
            folded.add(id(bn))
            out = bn.output[0]
        nodes[-1:] = _frame_nodes(model, node, shapes, x_shape, weight, bias, out, kernel, strides, dilations, group,
                                  pads, out_t)
        changed = True
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return refused


def _frame_nodes(model: onnx.ModelProto, node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]],
                 x_shape: tuple[int, ...], weight: np.ndarray, bias: np.ndarray, out: str, kernel: list[int],
                 strides: list[int], dilations: list[int], group: int, pads: list[int], out_t: int
                 ) -> list[onnx.NodeProto]:
    """The nodes of one 3-D convolution as a 2-D one over its frames (module docstring), writing ``out``."""
    n, c, frames, h, w = x_shape
    o = int(weight.shape[0])
    base = out.replace("/", "_")
    made: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        full = f"{base}_{name}"
        model.graph.initializer.append(numpy_helper.from_array(value, full))
        return full

    def add(op: str, inputs: list[str], name: str, shape: tuple[int, ...], **attrs: Any) -> str:
        tensor = f"{base}_{name}"
        made.append(helper.make_node(op, inputs, [tensor], name=f"{node.name or base}_{name}", **attrs))
        shapes[tensor] = shape
        return tensor

    x = node.input[0]
    kt = kernel[0]
    if pads[0] or pads[3]:
        frames += pads[0] + pads[3]
        x = add("Pad", [x, const("time_pads", np.array([0, 0, pads[0], 0, 0, 0, 0, pads[3], 0, 0], np.int64))],
                "time_padded", (n, c, frames, h, w))
    if kt == 1 and strides[0] == 1:
        moved = add("Transpose", [x], "frames_first", (n, frames, c, h, w), perm=[0, 2, 1, 3, 4])
    else:
        index = (np.arange(out_t)[:, None] * strides[0] + np.arange(kt)[None, :] * dilations[0]).astype(np.int64)
        gathered = add("Gather", [x, const("frame_index", index)], "frames", (n, c, out_t, kt, h, w), axis=2)
        moved = add("Transpose", [gathered], "frames_first", (n, out_t, c, kt, h, w), perm=[0, 2, 1, 3, 4, 5])
    rows = add("Reshape", [moved, const("rows_shape", np.array([n * out_t, c * kt, h, w], np.int64))], "rows",
               (n * out_t, c * kt, h, w))
    h_out = (h + pads[1] + pads[4] - ((kernel[1] - 1) * dilations[1] + 1)) // strides[1] + 1
    w_out = (w + pads[2] + pads[5] - ((kernel[2] - 1) * dilations[2] + 1)) // strides[2] + 1
    flat = weight.reshape(o, -1, kernel[1], kernel[2]).astype(np.float32)
    conv = add("Conv", [rows, const("weight2d", flat), const("bias", bias.astype(np.float32))], "conv2d",
               (n * out_t, o, h_out, w_out), kernel_shape=kernel[1:], strides=strides[1:],
               pads=[pads[1], pads[2], pads[4], pads[5]], dilations=dilations[1:], group=group)
    back = add("Reshape", [conv, const("back_shape", np.array([n, out_t, o, h_out, w_out], np.int64))], "per_frame",
               (n, out_t, o, h_out, w_out))
    made.append(helper.make_node("Transpose", [back], [out], name=f"{node.name or base}_channels_first",
                                 perm=[0, 2, 1, 3, 4]))
    shapes[out] = (n, o, out_t, h_out, w_out)
    return made
