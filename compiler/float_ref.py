"""Float reference of the float graph IR in numpy (float32 activations): calibration and frontend checks.

:func:`run_float` executes a float :class:`~.ir.Graph` (ops of :data:`~.ir.FLOAT_OPS`) and can return every
intermediate tensor, which is what calibration needs. Convolutions use im2col and BLAS (float32).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from .ir import Graph, GraphError, Node

__all__ = ["conv2d", "dense", "maxpool", "avgpool", "FLOAT_FNS", "run_float"]


def _pad_hw(x: np.ndarray, pads: Sequence[int], value: float) -> np.ndarray:
    top, left, bottom, right = (int(p) for p in pads)
    if not (top or left or bottom or right):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def _windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    view = np.lib.stride_tricks.sliding_window_view(x, tuple(kernel), axis=(2, 3))
    return view[:, :, ::strides[0], ::strides[1]]


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, strides: Sequence[int], pads: Sequence[int],
           groups: int) -> np.ndarray:
    """Float grouped convolution ``x [N,C,H,W]``, ``w [O, C/groups, KH, KW]`` -> ``[N, O, OH, OW]`` float32."""
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    win = _windows(_pad_hw(x.astype(np.float32), pads, 0.0), (kh, kw), strides)
    oh, ow = win.shape[2], win.shape[3]
    og = o // groups
    cols = win.reshape(n, groups, cg, oh, ow, kh, kw).transpose(1, 0, 3, 4, 2, 5, 6).reshape(groups, n * oh * ow, -1)
    wmat = w.astype(np.float32).reshape(groups, og, cg * kh * kw).transpose(0, 2, 1)
    out = np.matmul(cols, wmat).reshape(groups, n, oh, ow, og).transpose(1, 0, 4, 2, 3).reshape(n, o, oh, ow)
    if b is not None:
        out = out + b.astype(np.float32).reshape(1, o, 1, 1)
    return out


def dense(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """``x [N, K] @ w[O, K].T + b`` float32."""
    out = x.astype(np.float32) @ w.astype(np.float32).T
    return out + b.astype(np.float32) if b is not None else out


def maxpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int]) -> np.ndarray:
    """Float max pooling (pads are -inf)."""
    return _windows(_pad_hw(x, pads, -np.inf), kernel, strides).max(axis=(4, 5))


def avgpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
            count_include_pad: bool) -> np.ndarray:
    """Float average pooling; the divisor excludes pads unless ``count_include_pad``."""
    total = _windows(_pad_hw(x, pads, 0.0), kernel, strides).sum(axis=(4, 5))
    if count_include_pad:
        return (total / (kernel[0] * kernel[1])).astype(np.float32)
    ones = np.ones((1, 1) + x.shape[2:], np.float32)
    count = _windows(_pad_hw(ones, pads, 0.0), kernel, strides).sum(axis=(4, 5))
    return (total / count).astype(np.float32)


def _clip(x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    return np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    z = np.exp(x - x.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def _pad(x: np.ndarray, pads: Sequence[int], value: float) -> np.ndarray:
    rank = x.ndim
    return np.pad(x, [(pads[i], pads[i + rank]) for i in range(rank)], constant_values=value)


FloatFn = Callable[[Node, list[np.ndarray]], np.ndarray]

FLOAT_FNS: dict[str, FloatFn] = {
    "Conv2d": lambda n, v: conv2d(v[0], v[1], v[2] if len(v) > 2 else None, n.attrs["strides"], n.attrs["pads"],
                                  n.attrs["groups"]),
    "Dense": lambda n, v: dense(v[0], v[1], v[2] if len(v) > 2 else None),
    "Relu": lambda n, v: np.maximum(v[0], 0),
    "Clip": lambda n, v: _clip(v[0], n.attrs["min"], n.attrs["max"]),
    "Add": lambda n, v: v[0] + v[1],
    "Mul": lambda n, v: v[0] * v[1],
    "MaxPool": lambda n, v: maxpool(v[0], n.attrs["kernel"], n.attrs["strides"], n.attrs["pads"]),
    "AvgPool": lambda n, v: avgpool(v[0], n.attrs["kernel"], n.attrs["strides"], n.attrs["pads"],
                                    n.attrs["count_include_pad"]),
    "GlobalAvgPool": lambda n, v: v[0].mean(axis=(2, 3), keepdims=True),
    "Reshape": lambda n, v: v[0].reshape(n.attrs["shape"]),
    "Pad": lambda n, v: _pad(v[0], n.attrs["pads"], n.attrs["value"]),
    "Concat": lambda n, v: np.concatenate(v, axis=n.attrs["axis"]),
    "Softmax": lambda n, v: _softmax(v[0], n.attrs["axis"]),
}


def run_float(graph: Graph, inputs: Mapping[str, np.ndarray], *, keep_all: bool = False) -> dict[str, np.ndarray]:
    """Execute a float graph; returns its outputs, or every non-constant tensor when ``keep_all`` (float32)."""
    values: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        if name not in inputs:
            raise ValueError(f"Input {name!r} of graph {graph.name!r} is missing; given {sorted(inputs)}.")
        values[name] = np.asarray(inputs[name], dtype=np.float32)
        if values[name].shape != graph.shape(name):
            raise ValueError(f"Input {name!r} has shape {values[name].shape}; graph {graph.name!r} expects "
                             f"{graph.shape(name)}.")
    for node in graph.nodes:
        fn = FLOAT_FNS.get(node.op)
        if fn is None:
            raise GraphError(f"Node {node.name!r} has op {node.op!r}, which the float reference does not define.")
        args = [values[i] if i in values else graph.constants[i] for i in node.inputs]
        values[node.outputs[0]] = np.asarray(fn(node, args), dtype=np.float32)
    return values if keep_all else {name: values[name] for name in graph.outputs}
