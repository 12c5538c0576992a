"""Compare two DRAM images byte for byte and report the first difference.

Used to check the RTL (TSIM) against the functional simulator, the spec: a mismatch names the first differing byte
address with its expected and actual values, and how many bytes differ in all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

__all__ = ["Mismatch", "DramMismatchError", "compare_dram", "assert_dram_equal", "locate"]


@dataclass(frozen=True)
class Mismatch:
    """The first difference between two DRAM images: byte ``address``, ``expected`` and ``actual`` byte values
    (0..255), and ``count``, the number of differing bytes in all."""

    address: int
    expected: int
    actual: int
    count: int

    def __str__(self) -> str:
        return (f"DRAM differs at byte address {self.address:#x}: expected {self.expected:#04x}, got "
                f"{self.actual:#04x} ({self.count} differing byte{'s' if self.count != 1 else ''} in all)")


class DramMismatchError(AssertionError):
    """Two DRAM images differ; ``mismatch`` holds the first difference."""

    def __init__(self, mismatch: Mismatch, context: str = "") -> None:
        self.mismatch = mismatch
        super().__init__(f"{context}: {mismatch}" if context else str(mismatch))


def _as_bytes(name: str, image: np.ndarray) -> np.ndarray:
    if not isinstance(image, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, not {type(image).__name__}")
    if image.dtype != np.uint8:
        raise TypeError(f"{name} must be a uint8 array (a DRAM image), not {image.dtype}")
    return image.reshape(-1)


def compare_dram(expected: np.ndarray, actual: np.ndarray) -> Mismatch | None:
    """The first difference between two uint8 DRAM images, or None when they are equal.

    Raises ValueError when the images differ in size (a size difference is a harness bug, not a result).
    """
    exp = _as_bytes("expected", expected)
    act = _as_bytes("actual", actual)
    if exp.size != act.size:
        raise ValueError(f"DRAM images differ in size: expected {exp.size} bytes, actual {act.size} bytes")
    diff = np.flatnonzero(exp != act)
    if diff.size == 0:
        return None
    first = int(diff[0])
    return Mismatch(first, int(exp[first]), int(act[first]), int(diff.size))


def assert_dram_equal(expected: np.ndarray, actual: np.ndarray, context: str = "") -> None:
    """Raise :class:`DramMismatchError` (an AssertionError, so pytest shows it) naming the first difference."""
    mismatch = compare_dram(expected, actual)
    if mismatch is not None:
        raise DramMismatchError(mismatch, context)


def locate(address: int, allocations: Mapping[str, Any]) -> str:
    """Where byte ``address`` lies among a program's allocations (objects with ``offset`` and ``nbytes``), e.g.
    ``"allocation 'out' + 12"``, or ``"outside every allocation"``."""
    for name, alloc in allocations.items():
        if alloc.offset <= address < alloc.offset + alloc.nbytes:
            return f"allocation {name!r} + {address - alloc.offset}"
    return "outside every allocation"
