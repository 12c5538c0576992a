"""Lookup tables for the element-wise operators of a pre-quantized model (:mod:`.prequant`), at the file's own scales
and zero points.

A quantized element-wise operator of one int8 activation is a function of that activation's 256 values, and one of
two activations a function of their 65,536 pairs. So each is imported as a table (``QLut``, ``QLut2``) computed the
way onnxruntime runs a QDQ ``DequantizeLinear -> op -> QuantizeLinear`` chain: the int8 inputs dequantized
(``(q - z) * s``), the float operator, then ``rint(y / s_out) + z_out`` clipped to the output's range (its fused
Relu/Clip). The tables are float64; onnxruntime computes in float32, so an output may differ by one step where the
real result lies within float32's rounding of a rounding boundary.

All values are in the int8 domain (a uint8 tensor is its values minus 128, with its zero point minus 128, as
:mod:`.prequant` holds it). Shapes: a table of one input is ``[256]`` (entry ``q + 128``); of two, ``[256, 256]``
(row ``a + 128``, column ``b + 128``).
"""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..ir import INT8_MAX, INT8_MIN
from . import float_ref

__all__ = ["BINARY_FNS", "UNARY_DEFAULTS", "unary_table", "binary_table", "constant_table", "composed_table",
           "int8_values", "unary_function", "constant_function", "function_table", "requantize"]

BINARY_FNS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
}
"""The element-wise operators of two inputs the tables take, on float64 real values (numpy's broadcasting)."""

UNARY_DEFAULTS: dict[str, Mapping[str, object]] = {
    **float_ref.ACTIVATION_DEFAULTS,
    "Tanh": {}, "HardSwish": {}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "Gelu": {"approximate": "none"},
    "Swish": {"alpha": 1.0}, "Neg": {},
}
"""The element-wise operators of one input the tables take (those of :data:`.float_ref.ACTIVATIONS` that a
quantizer writes between DequantizeLinear and QuantizeLinear), with ONNX's default of each attribute."""


def int8_values() -> np.ndarray:
    """The 256 int8 values, -128 to 127, as float64."""
    return np.arange(INT8_MIN, INT8_MAX + 1, dtype=np.float64)


def requantize(real: np.ndarray, out_scale: float, out_zp: int, lo: int, hi: int) -> np.ndarray:
    """``clip(rint(real / out_scale) + out_zp, lo, hi)`` as int8; NaN (0 / 0, the root of a negative value) as the
    zero point, an infinity clipped to the range's end."""
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.rint(np.where(np.isnan(real), 0.0, real) / out_scale) + out_zp
    return np.clip(np.nan_to_num(q, nan=float(out_zp), posinf=hi, neginf=lo), lo, hi).astype(np.int8)


def unary_table(op: str, attrs: Mapping[str, object], scale: float, zp: int, out_scale: float, out_zp: int,
                lo: int = INT8_MIN, hi: int = INT8_MAX) -> np.ndarray:
    """``[256]`` int8: ``op`` (of :data:`UNARY_DEFAULTS`, attributes ``attrs`` over its defaults) of each int8 input
    read at ``scale`` and ``zp``, requantized at ``out_scale`` and ``out_zp`` to ``[lo, hi]``."""
    full = {**UNARY_DEFAULTS[op], **attrs}
    with np.errstate(all="ignore"):
        real = float_ref.table_values(op, (int8_values() - zp) * scale, full)
    return requantize(real, out_scale, out_zp, lo, hi)


def binary_table(op: str, a: tuple[float, int], b: tuple[float, int], out_scale: float, out_zp: int,
                 lo: int = INT8_MIN, hi: int = INT8_MAX) -> np.ndarray:
    """``[256, 256]`` int8: ``op`` of :data:`BINARY_FNS` of each pair of int8 values, ``a`` and ``b`` each read at
    its ``(scale, zero point)``, requantized at ``out_scale`` and ``out_zp`` to ``[lo, hi]``."""
    ra = (int8_values() - a[1]) * a[0]
    rb = (int8_values() - b[1]) * b[0]
    with np.errstate(all="ignore"):
        real = BINARY_FNS[op](ra[:, None], rb[None, :])
    return requantize(real, out_scale, out_zp, lo, hi)


def constant_table(op: str, x: tuple[float, int], const: float, const_first: bool, out_scale: float, out_zp: int,
                   lo: int = INT8_MIN, hi: int = INT8_MAX) -> np.ndarray:
    """``[256]`` int8: ``op`` of :data:`BINARY_FNS` of each int8 value (read at ``x``'s ``(scale, zero point)``) and
    the real constant ``const`` (``const_first``: ``const op value``), requantized at ``out_scale`` and ``out_zp``
    to ``[lo, hi]``."""
    rx = (int8_values() - x[1]) * x[0]
    with np.errstate(all="ignore"):
        c = np.full(rx.shape, const, np.float64)
        real = BINARY_FNS[op](c, rx) if const_first else BINARY_FNS[op](rx, c)
    return requantize(real, out_scale, out_zp, lo, hi)


def unary_function(op: str, attrs: Mapping[str, object]) -> Callable[[np.ndarray], np.ndarray]:
    """``op`` (of :data:`UNARY_DEFAULTS`, attributes ``attrs`` over its defaults) on float64 real values."""
    full = {**UNARY_DEFAULTS[op], **attrs}
    return lambda real: float_ref.table_values(op, real, full)


def constant_function(op: str, const: float, const_first: bool) -> Callable[[np.ndarray], np.ndarray]:
    """``op`` of :data:`BINARY_FNS` of real values and the real constant ``const`` (``const_first``: ``const op
    value``)."""
    fn = BINARY_FNS[op]
    return (lambda real: fn(np.full(real.shape, const), real)) if const_first else (
        lambda real: fn(real, np.full(real.shape, const)))


def function_table(fn: Callable[[np.ndarray], np.ndarray], scale: float, zp: int, out_scale: float, out_zp: int,
                   lo: int = INT8_MIN, hi: int = INT8_MAX) -> np.ndarray:
    """``[256]`` int8: ``fn`` (float64 real values to real values: a chain of element-wise operators a quantizer
    left unquantized between two activations, such as GELU's ``Div`` then ``Erf``) of each int8 value read at
    ``scale`` and ``zp``, requantized at ``out_scale`` and ``out_zp`` to ``[lo, hi]``."""
    with np.errstate(all="ignore"):
        real = fn((int8_values() - zp) * scale)
    return requantize(real, out_scale, out_zp, lo, hi)


def composed_table(pair: np.ndarray, inner: np.ndarray, inner_first: bool) -> np.ndarray:
    """``[256]`` int8: the pair table ``pair`` read at ``(x, inner[x])`` (``inner_first``: at ``(inner[x], x)``) for
    each int8 ``x``: the product of an activation and a function of it (SiLU's ``x * sigmoid(x)`` in a quantized
    file, both operands int8) as one lookup of ``x``."""
    rows = np.arange(256)
    cols = np.asarray(inner, np.int64).reshape(256) + 128
    return (pair[cols, rows] if inner_first else pair[rows, cols]).astype(np.int8)
