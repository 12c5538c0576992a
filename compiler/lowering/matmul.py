"""A QMatMul of two activations (attention's Q.K^T and P.V) as a grouped 1x1 convolution on the accelerator.

``a [..., M, K] @ b [..., K, N]`` (numpy broadcasting over the leading axes, ``G`` = the product of the broadcast
batch shape, e.g. batch x heads) is one grouped convolution over an image of ``M`` rows and one column:

* the input image is ``[1, G*Kp, M, 1]``: group ``g``'s channels ``g*Kp .. g*Kp+K-1`` at row ``m`` hold
  ``a[g, m, :]``;
* the weights are ``[G*Np, Kp]`` in ``G`` groups: output channel ``g*Np + n`` reads ``b[g, :, n]``;
* the output image ``[1, G*Np, M, 1]`` holds ``out[g, m, n]`` at channel ``g*Np + n``, row ``m``.

``Kp`` and ``Np`` are ``K`` and ``N`` rounded up to the blocks (``BLOCK_IN``, ``BLOCK_OUT``), zero-filled, so no
block straddles two groups and each output block reads exactly ``Kp/BI`` input blocks. The requantization is
QMatMul's (:func:`..qops.qmatmul`): MUL M, an ADD of the rounding ``2**(S-1)``, SHR S, MAX, MIN on the ALU (the
frontend chose ``(M, S)`` so that ``acc * M + r`` fits int32).

The second operand is an activation. It reaches the weight buffer by one of two paths (:data:`WEIGHT_PATHS`):

* ``host`` (what the partitioner lowers): the runtime packs ``b`` into the blocked weight layout (:func:`pack_b`) and
  binds it to the program's weight allocation (:data:`WEIGHT`), as it packs ``a`` (:func:`pack_a`) and unpacks the
  output (:func:`unpack_out`) at the partition boundary; the program loads each step's weights with one LOAD;
* ``load``: ``b`` reaches DRAM as an activation image whose channels are K and rows are N (:func:`pack_b_image`, the
  layout the accelerator's own layers write), and the load unit gathers the weight entries from it, one strided
  LOAD per output block (:attr:`.codegen.ConvLayer.weights_as_image`).

The runtime tells them apart by the shape of the program's weight allocation. A constant ``b`` is packed once, at
compile time, into the program (blocked). Both paths are int8 only (an int4 design keeps QMatMul on the CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir import Graph, Node
from .codegen import ConvLayer
from .intrin import Intrinsics
from .layout import PackedWeight, round_up
from .schedule import ConvGeometry, ScheduleError, plan_conv

__all__ = ["MatMulDims", "matmul_dims", "lower_matmul", "pack_a", "pack_b", "pack_b_image", "image_shape",
           "unpack_out", "WEIGHT", "WEIGHT_PATHS"]

WEIGHT = "w"
"""The allocation holding a layer program's packed weights (:func:`.codegen.emit_conv` with no prefix): the runtime
binds a QMatMul's packed second operand to it."""
WEIGHT_PATHS = ("host", "load")
"""How a QMatMul's activation ``b`` reaches the weight buffer (see the module docstring)."""


@dataclass(frozen=True)
class MatMulDims:
    """The shapes of one QMatMul: ``batch`` the broadcast leading axes (``G`` = their product), ``m, k, n`` the
    matrix sizes, ``kp, np_`` K and N rounded up to the blocks; ``a_shape``/``b_shape``/``out_shape`` the tensors'."""

    a_shape: tuple[int, ...]
    b_shape: tuple[int, ...]
    batch: tuple[int, ...]
    m: int
    k: int
    n: int
    kp: int
    np_: int

    @property
    def groups(self) -> int:
        return int(np.prod(self.batch, dtype=np.int64))

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.batch, self.m, self.n)

    @property
    def image(self) -> tuple[int, int, int, int]:
        """The input image of the grouped convolution, NCHW."""
        return (1, self.groups * self.kp, self.m, 1)


def matmul_dims(a_shape: tuple[int, ...], b_shape: tuple[int, ...], intr: Intrinsics) -> MatMulDims:
    """The :class:`MatMulDims` of ``a [..., M, K] @ b [..., K, N]``; ScheduleError when the shapes do not multiply."""
    if len(a_shape) < 2 or len(b_shape) < 2:
        raise ScheduleError(f"the operands have shapes {a_shape} and {b_shape}; the accelerator multiplies operands "
                            f"of rank 2 or more")
    if a_shape[-1] != b_shape[-2]:
        raise ScheduleError(f"the operands have shapes {a_shape} and {b_shape}; a's last axis must equal b's second "
                            f"to last")
    try:
        batch = tuple(int(v) for v in np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2])))
    except ValueError:
        raise ScheduleError(f"the operands' batch axes {a_shape[:-2]} and {b_shape[:-2]} do not broadcast") from None
    m, k, n = int(a_shape[-2]), int(a_shape[-1]), int(b_shape[-1])
    return MatMulDims(tuple(a_shape), tuple(b_shape), batch, m, k, n, round_up(k, intr.block_in),
                      round_up(n, intr.block_out))


def _groups_of(x: np.ndarray, dims: MatMulDims) -> np.ndarray:
    """``x [..., R, C]`` broadcast to the batch shape, as ``[G, R, C]``."""
    x = np.broadcast_to(x, (*dims.batch, *x.shape[-2:]))
    return x.reshape(dims.groups, *x.shape[-2:])


def pack_a(a: np.ndarray, dims: MatMulDims, intr: Intrinsics) -> np.ndarray:
    """The first operand ``a [..., M, K]`` (int8) as the packed input image ``(1, G*Kp/BI, M, 1, B, BI)``
    (:func:`.layout.pack_activation`'s layout of :attr:`MatMulDims.image`); zeros in the padding."""
    bi = intr.block_in
    ag = _groups_of(np.asarray(a, np.int8), dims)
    out = np.zeros((1, dims.groups * dims.kp // bi, dims.m, 1, intr.batch, bi), np.int8)
    padded = np.zeros((dims.groups, dims.m, dims.kp), np.int8)
    padded[:, :, :dims.k] = ag
    blocks = padded.reshape(dims.groups, dims.m, dims.kp // bi, bi).transpose(0, 2, 1, 3)
    out[0, :, :, 0, 0, :] = blocks.reshape(dims.groups * dims.kp // bi, dims.m, bi)
    return out


def pack_b(b: np.ndarray, dims: MatMulDims, intr: Intrinsics) -> np.ndarray:
    """The second operand ``b [..., K, N]`` (int8) as packed grouped weights ``(G*Np/BO, Kp/BI, 1, 1, BO, BI)``
    (:func:`.layout.pack_weight`'s layout: output block ``g*Np/BO + j`` reads input blocks ``g*Kp/BI + i``)."""
    bi, bo = intr.block_in, intr.block_out
    bg = _groups_of(np.asarray(b, np.int8), dims)
    padded = np.zeros((dims.groups, dims.kp, dims.np_), np.int8)
    padded[:, :dims.k, :dims.n] = bg
    blocks = padded.reshape(dims.groups, dims.kp // bi, bi, dims.np_ // bo, bo).transpose(0, 3, 1, 4, 2)
    return np.ascontiguousarray(blocks).reshape(dims.groups * dims.np_ // bo, dims.kp // bi, 1, 1, bo, bi)


def image_shape(dims: MatMulDims, intr: Intrinsics) -> tuple[int, ...]:
    """The packed shape of ``b`` as an activation image (:func:`pack_b_image`): ``(1, G*Kp/BI, Np, 1, 1, BI)``."""
    return (1, dims.groups * dims.kp // intr.block_in, dims.np_, 1, 1, intr.block_in)


def pack_b_image(b: np.ndarray, dims: MatMulDims, intr: Intrinsics) -> np.ndarray:
    """The second operand ``b [..., K, N]`` (int8) as the packed activation image ``(1, G*Kp/BI, Np, 1, 1, BI)`` of
    the NCHW image ``[1, G*Kp, Np, 1]`` (channel ``g*Kp + k``, row ``n`` holds ``b[g, k, n]``): what the ``load``
    path's program gathers its weight entries from (16 consecutive rows of one channel block are one entry)."""
    bi = intr.block_in
    bg = _groups_of(np.asarray(b, np.int8), dims)
    padded = np.zeros((dims.groups, dims.kp, dims.np_), np.int8)
    padded[:, :dims.k, :dims.n] = bg
    blocks = padded.reshape(dims.groups, dims.kp // bi, bi, dims.np_).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(blocks).reshape(image_shape(dims, intr))


def unpack_out(y: np.ndarray, dims: MatMulDims, intr: Intrinsics) -> np.ndarray:
    """The packed output image ``(1, G*Np/BO, M, 1, B, BO)`` as ``out [..., M, N]`` (int8)."""
    bo = intr.block_out
    blocks = np.asarray(y)[0, :, :, 0, 0, :].reshape(dims.groups, dims.np_ // bo, dims.m, bo)
    out = blocks.transpose(0, 2, 1, 3).reshape(dims.groups, dims.m, dims.np_)[:, :, :dims.n]
    return np.ascontiguousarray(out).reshape(dims.out_shape)


def lower_matmul(graph: Graph, node: Node, intr: Intrinsics, *, weights: str = "host") -> ConvLayer:
    """The grouped 1x1 convolution computing QMatMul ``node`` (see the module docstring); its weights are ``b``
    when ``b`` is a constant, else zeros that the runtime replaces by the packed activation, reaching the weight
    buffer by path ``weights`` (:data:`WEIGHT_PATHS`). Raises :class:`ScheduleError` when the shapes do not multiply,
    the design is not int8 (or, for ``load``, not batch 1) or no tiling fits."""
    if weights not in WEIGHT_PATHS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHT_PATHS)}, not {weights!r}")
    cfg = intr.cfg
    if cfg.inp_width != 8 or cfg.wgt_width != 8:
        raise ScheduleError(f"the host layout step packs int8 operands; this design has int{cfg.inp_width} inputs and "
                            f"int{cfg.wgt_width} weights")
    a_name, b_name = node.inputs[0], node.inputs[1]
    image = weights == "load" and b_name not in graph.constants
    if image and intr.batch != 1:
        raise ScheduleError(f"the load unit gathers weight entries from an activation image at batch 1 only, not "
                            f"{intr.batch}")
    dims = matmul_dims(graph.shape(a_name), graph.shape(b_name), intr)
    shift, o, m = int(node.attrs["shift"]), dims.groups * dims.np_, int(node.attrs["multiplier"])
    rounding = (1 << (shift - 1)) if shift > 0 else 0
    geom = ConvGeometry.make(dims.image, (o, dims.kp, 1, 1), groups=dims.groups, intr=intr)
    # M = 1 (``--requant shift``): the rounding is a bias, (acc + r) >> S, so the offset start can take it
    bias, rounding = (np.full(o, rounding, np.int32), 0) if m == 1 else (np.zeros(o, np.int32), rounding)
    layer = ConvLayer(geom, _packed_weight(graph.constants.get(b_name), dims, intr), bias,
                      np.full(o, m, np.int64), np.full(o, shift, np.int64), -128, 127, rounding, image)
    plan_conv(geom, intr)  # raises ScheduleError when it cannot be tiled
    return layer


def _packed_weight(b: np.ndarray | None, dims: MatMulDims, intr: Intrinsics) -> PackedWeight:
    """The grouped convolution's weights: a constant ``b`` packed (:func:`pack_b`), else zeros of that shape (the
    runtime binds the activation); output block ``ob`` reads input blocks from ``ib_lo[ob]`` = its group's first.
    Packed directly rather than by :func:`.layout.pack_weight`, which builds the dense ``[G*Np, G*Kp]`` matrix."""
    bi, bo = intr.block_in, intr.block_out
    obs = dims.groups * dims.np_ // bo
    data = pack_b(b, dims, intr) if b is not None else np.zeros((obs, dims.kp // bi, 1, 1, bo, bi), np.int8)
    ib_lo = (np.arange(obs, dtype=np.int64) // (dims.np_ // bo)) * (dims.kp // bi)
    return PackedWeight(data, ib_lo, (dims.groups * dims.np_, dims.kp, 1, 1), dims.groups * dims.kp, dims.groups)
