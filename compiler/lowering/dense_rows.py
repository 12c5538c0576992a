"""A QDense of several rows as a 1x1 convolution over its rows, the way a linear layer over tokens runs.

``x [N, K] @ w.T`` with ``N > 1`` rows on a design of BATCH 1 (the default) is lowered as the 1x1 convolution over
the image ``[1, K, N, 1]``: channel ``k`` at row ``n`` holds ``x[n, k]``, the weights are ``[O, K, 1, 1]``, and the
output image ``[1, O, N, 1]`` holds ``y[n, o]`` at channel ``o``, row ``n``. The rows are then the GEMM rows of one
image and each weight block is loaded once per output-block group, as for the ``[batch, tokens, features]`` linear
layers the frontend writes as a Conv2d (:func:`..frontend.onnx_rules._token_linear`). As a dense layer of ``N``
batch blocks, the weights would be loaded again for every batch block.

This is the case of a 2-D Gemm after a Reshape to ``[tokens, features]``, as ``torch.onnx.export`` writes the output
projection of ``nn.MultiheadAttention``. The graph keeps its QDense node (so the integer reference and the CPU path
are unchanged); only the accelerator layer and the host's layout conversions differ:

* the runtime packs ``x`` as the image, ``(1, K/BI, N, 1, 1, BI)`` (:func:`pack_rows`), instead of the dense layout
  ``(N, K/BI, 1, 1, 1, BI)``, and unpacks the output image back to ``[N, O]`` (:func:`unpack_rows`): one conversion
  each way, whichever side the tensors come from or go to;
* it tells such a program from a dense one by the shape of its input allocation (:func:`reads_rows`).

On a design with BATCH > 1 a QDense stays a dense layer of batch blocks: the image's single batch row would leave
``B - 1`` of every GEMM's ``B`` rows unused.
"""
from __future__ import annotations

import numpy as np

from vta.program import Program

from .intrin import Intrinsics
from .layout import INPUT, pack_activation, packed_activation_shape, unpack_activation

__all__ = ["rows_image", "pack_rows", "unpack_rows", "reads_rows"]


def rows_image(x_shape: tuple[int, ...], intr: Intrinsics) -> tuple[int, int, int, int] | None:
    """The NCHW image ``(1, K, N, 1)`` a QDense of input shape ``x_shape`` (``[N, K]``) is lowered over, or None
    when it stays a dense layer: an input that is not 2-D, a single row, or a design with BATCH > 1."""
    if len(x_shape) != 2 or x_shape[0] < 2 or intr.batch != 1:
        return None
    n, k = (int(v) for v in x_shape)
    return (1, k, n, 1)


def pack_rows(x: np.ndarray, intr: Intrinsics) -> np.ndarray:
    """``x [N, K]`` (int8) as the packed input image ``(1, K/BI, N, 1, 1, BI)`` of its 1x1 convolution."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"a QDense input over rows is 2-D [N, K], not of shape {x.shape}")
    n, k = x.shape
    image = np.ascontiguousarray(x.T).reshape(1, k, n, 1)
    return pack_activation(image, batch=intr.batch, block=intr.block_in)


def unpack_rows(packed: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    """The ``[N, O]`` output of :func:`pack_rows`'s convolution from its packed output image
    ``(1, O/BO, N, 1, 1, BO)``."""
    if len(out_shape) != 2:
        raise ValueError(f"a QDense output over rows is 2-D [N, O], not of shape {tuple(out_shape)}")
    n, o = (int(v) for v in out_shape)
    image = unpack_activation(packed, (1, o, n, 1))
    return np.ascontiguousarray(image.reshape(o, n).T)


def reads_rows(program: Program, x_shape: tuple[int, ...], intr: Intrinsics) -> bool:
    """True when ``program`` (a QDense's layer program) reads its input ``x_shape`` as the image of its rows
    (:func:`rows_image`), told by the shape of its :data:`~.layout.INPUT` allocation."""
    image = rows_image(x_shape, intr)
    if image is None:
        return False
    return tuple(program.allocation(INPUT).shape) == packed_activation_shape(image, intr.batch, intr.block_in)
