"""Narrow integer elements packed into bytes: the one definition of how an int4 (or int8) element sits in DRAM and in
an SRAM entry.

An element of ``bits`` bits (4 or 8) is stored little-endian within the byte stream: element ``j`` of a row occupies
bits ``[bits*j, bits*j + bits)`` counting from bit 0 of byte 0, so with ``bits=4`` element ``2i`` is the low nibble
of byte ``i`` and element ``2i+1`` the high nibble, as the RTL's ``word_select(j, 4)`` reads it. Values are two's
complement; unpacking sign-extends. With ``bits=8`` packing is the identity on the int8 bytes, so the default (int8)
design's DRAM images are unchanged.

Used by the functional simulator (LOAD, STORE, the out buffer's low bits), the program builder's ``int4``
allocations (:meth:`vta.program.ProgramBuilder.alloc`) and the compiler's layouts.
"""
from __future__ import annotations

import numpy as np

__all__ = ["ELEMENT_BITS", "packed_nbytes", "pack_elements", "unpack_elements", "wrap_elements", "element_range",
           "check_element_range", "dtype_bits", "alloc_dtype"]

ELEMENT_BITS = (4, 8)
"""Element widths (bits) that can be packed: int4 and int8."""


def _check_bits(bits: int) -> None:
    if bits not in ELEMENT_BITS:
        raise ValueError(f"element width must be one of {', '.join(map(str, ELEMENT_BITS))} bits, not {bits!r}")


def element_range(bits: int) -> tuple[int, int]:
    """The signed range ``(lo, hi)`` of a ``bits``-bit element: (-8, 7) for int4, (-128, 127) for int8."""
    _check_bits(bits)
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def packed_nbytes(count: int, bits: int) -> int:
    """Bytes that ``count`` elements of ``bits`` bits occupy (a trailing half byte is padded with zero bits)."""
    _check_bits(bits)
    return (count * bits + 7) // 8


def check_element_range(values: np.ndarray, bits: int, what: str = "values") -> None:
    """Raise ValueError naming the first value of ``values`` outside the signed ``bits``-bit range."""
    lo, hi = element_range(bits)
    v = np.asarray(values)
    bad = (v < lo) | (v > hi)
    if bad.any():
        j = int(np.argmax(bad.ravel()))
        raise ValueError(f"{what} must be int{bits} values in [{lo}, {hi}], but element {j} is "
                         f"{int(v.ravel()[j])}")


def wrap_elements(values: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of each integer of ``values``, read as a signed ``bits``-bit value (int8 array): what
    an out-buffer lane keeps of an int32 accumulator."""
    _check_bits(bits)
    v = np.asarray(values)
    if bits == 8:
        return v.astype(np.int8)
    mask, sign = (1 << bits) - 1, 1 << (bits - 1)
    return (((v.astype(np.int64) & mask) ^ sign) - sign).astype(np.int8)


def pack_elements(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` (signed integers in range, any shape, read in C order) -> packed ``uint8`` bytes (1-D, of length
    :func:`packed_nbytes`). The values are not range-checked here (:func:`check_element_range` does that); bits
    above ``bits`` are dropped."""
    _check_bits(bits)
    flat = np.ascontiguousarray(values).reshape(-1)
    if bits == 8:
        return flat.astype(np.int8).view(np.uint8).copy()
    nib = (flat.astype(np.int64) & 0xF).astype(np.uint8)
    if nib.size % 2:
        nib = np.concatenate([nib, np.zeros(1, np.uint8)])
    return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8)


def unpack_elements(raw: np.ndarray, bits: int, count: int | None = None) -> np.ndarray:
    """Packed bytes ``raw`` (``uint8``, any shape: read in C order) -> the first ``count`` (default: all)
    sign-extended elements, as a 1-D int8 array."""
    _check_bits(bits)
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if bits == 8:
        out = b.view(np.int8)
    else:
        out = np.empty(2 * b.size, np.int8)
        out[0::2] = ((b & 0xF) ^ 8).astype(np.int8) - 8
        out[1::2] = ((b >> 4) ^ 8).astype(np.int8) - 8
    return out if count is None else out[:count]


def alloc_dtype(bits: int) -> str:
    """The :meth:`vta.program.ProgramBuilder.alloc` dtype of ``bits``-bit elements: ``"int4"`` (packed) or
    ``"int8"``."""
    _check_bits(bits)
    return "int4" if bits == 4 else "int8"


def dtype_bits(dtype: str) -> int | None:
    """Bits per element of a packed allocation dtype (``"int4"`` -> 4); None for a numpy dtype name."""
    return 4 if dtype == "int4" else None
