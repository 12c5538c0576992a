"""Vectorized datapath kernels of the functional simulator: ALU arithmetic and GEMM micro-op loops as matmuls.

Exact integer semantics (see :mod:`vta.isa`): int32 results wrap; GEMM sums are computed in float32 while a dot
product has at most 1024 int8 x int8 terms (every partial sum is then an integer below 2**24) and float64 beyond.
"""
from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Any

import numpy as np

from .isa import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_NAMES, ALU_REQ, ALU_RMAX, ALU_RSUM, ALU_SHR, REQ_SHIFT_LSB

__all__ = ["alu_op", "wrap32", "GemmPlan", "occurrence_rounds", "alu_hazard", "unique_rows", "blas_single_thread",
           "nbytes_of"]

_OBJECT_BYTES = 64  # rough cost of one Python object (header, list slot) counted by nbytes_of


def wrap32(x: np.ndarray) -> np.ndarray:
    """Low 32 bits of an int64 array, as int32 (two's complement wrap-around)."""
    return x.astype(np.int32)


def _shr(a: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """SHR: ``amount``'s low 6 bits as a signed shift in [-32, 31]; right arithmetic, or left (wrapping) when
    negative; int32 result."""
    n = ((amount & 63) ^ 32) - 32
    right = a >> np.maximum(n, 0)
    left = ((a & 0xFFFFFFFF).astype(np.uint64) << np.clip(-n, 0, 32).astype(np.uint64)) & np.uint64(0xFFFFFFFF)
    return np.where(n >= 0, wrap32(right), wrap32(left.astype(np.int64)))


def alu_op(opcode: int, a: np.ndarray, b: np.ndarray | int, imm: int = 0) -> np.ndarray:
    """The ALU result ``op(a, b)`` as int32; ``a`` and ``b`` hold int32 values (any integer dtype). For REQ, ``b``
    holds the (multiplier, shift) lanes and ``imm`` the instruction's immediate (the clip range); see vta.isa. RSUM and
    RMAX reduce ``a + b`` or ``max(a, b)`` over the last axis (an entry's BLOCK_OUT lanes, ``a`` of shape ``(...,
    BATCH, BLOCK_OUT)``) and broadcast the row's result to its lanes."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    if opcode == ALU_MIN:
        return wrap32(np.minimum(a, b))
    if opcode == ALU_MAX:
        return wrap32(np.maximum(a, b))
    if opcode == ALU_ADD:
        return wrap32(a + b)
    if opcode == ALU_MUL:
        return wrap32(a * b)
    if opcode == ALU_SHR:
        return _shr(a, b)
    if opcode in (ALU_RSUM, ALU_RMAX):
        v = a + b if opcode == ALU_RSUM else np.maximum(a, b)
        row = np.sum(v, axis=-1, keepdims=True) if opcode == ALU_RSUM else np.max(v, axis=-1, keepdims=True)
        return np.broadcast_to(wrap32(row), v.shape).copy()
    if opcode == ALU_REQ:
        mult = ((b & 0xFFFF) ^ 0x8000) - 0x8000
        shifted = _shr(wrap32(a * mult).astype(np.int64), b >> REQ_SHIFT_LSB).astype(np.int64)
        lo, hi = ((imm & 0xFF) ^ 0x80) - 0x80, (((imm >> 8) & 0xFF) ^ 0x80) - 0x80
        return wrap32(np.minimum(np.maximum(shifted, lo), hi))
    raise ValueError(f"ALU opcode must be one of {sorted(ALU_NAMES)}, not {opcode!r}")


def occurrence_rounds(d: np.ndarray) -> list[np.ndarray | None]:
    """Index sets of iterations: round r holds the r-th occurrence of each value in ``d`` ([None] if all unique)."""
    order = np.argsort(d, kind="stable")
    ds = d[order]
    if ds.size < 2 or np.all(ds[1:] != ds[:-1]):
        return [None]
    starts = np.r_[True, ds[1:] != ds[:-1]]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(ds.size), 0))
    rank = np.arange(ds.size) - group_start
    return [np.sort(order[rank == r]) for r in range(int(rank.max()) + 1)]


def alu_hazard(d: np.ndarray, s: np.ndarray, depth: int) -> bool:
    """True when vectorized rounds would not be exact. With distinct destinations: some iteration reads an entry
    written by an earlier iteration. With repeated destinations: some iteration reads an entry (other than its own
    destination) that this instruction writes at all."""
    first_write = np.full(depth, np.iinfo(np.int64).max, np.int64)
    first_write[d[::-1]] = np.arange(d.size - 1, -1, -1)  # reversed: the earliest write of an entry lands last
    if np.unique(d).size == d.size:
        return bool(np.any(first_write[s] < np.arange(s.size)))
    return bool(np.any((first_write[s] < d.size) & (s != d)))


_HASH_TERMS = 1 << 12


@lru_cache(maxsize=1)
def _hash_weights() -> np.ndarray:
    """Fixed odd 64-bit multipliers for hashing rows of up to _HASH_TERMS indices."""
    return np.random.default_rng(0x5EED).integers(1, 1 << 63, _HASH_TERMS, dtype=np.uint64) | np.uint64(1)


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of the 2D int array ``a`` and, per row, the index of its distinct row (fast path: a 64-bit
    hash of each row, verified exactly; np.unique(axis=0) when the hash collides or rows are very long)."""
    if a.shape[1] <= _HASH_TERMS:
        with np.errstate(over="ignore"):
            keys = (a.astype(np.uint64) * _hash_weights()[:a.shape[1]]).sum(axis=1, dtype=np.uint64)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        uniq = a[first]
        inverse = inverse.reshape(-1)
        if np.array_equal(uniq[inverse], a):
            return uniq, inverse
    return _unique_rows_sorted(a)


def _unique_rows_sorted(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What ``np.unique(a, axis=0, return_inverse=True)`` returns (rows in lexicographic order), by a lexicographic
    sort: np.unique(axis=0) builds a structured dtype with one field per column, which numpy does not free (measured:
    ~1 KB kept per column per call with numpy 2.4, so long rows leaked memory on every GEMM chunk)."""
    if a.shape[0] == 0:
        return a.copy(), np.zeros(0, np.intp)
    order = np.lexsort(a.T[::-1])
    ordered = a[order]
    new = np.r_[True, np.any(ordered[1:] != ordered[:-1], axis=1)]
    inverse = np.empty(a.shape[0], np.intp)
    inverse[order] = np.cumsum(new) - 1
    return ordered[new], inverse


class GemmPlan:
    """How to compute one chunk of a GEMM: the destinations ``du`` (unique) and the tile gathers and matmuls that give
    ``sum inp[s] @ wgt[w].T`` per destination. Depends only on the instruction and the micro-ops, so it is cached.

    Kinds: ``product`` (destinations sharing input sequences and weight sequences: one matmul of the distinct input
    sequences by the distinct weight sequences), ``groups`` (one matmul per distinct weight sequence), ``batched``
    (one small matmul per destination), ``uneven`` (destinations with different numbers of terms: one product per
    iteration, summed per destination).
    """

    def __init__(self, d: np.ndarray, s: np.ndarray, w: np.ndarray, bi: int) -> None:
        if d.size > 1 and np.any(d[1:] < d[:-1]):
            order = np.argsort(d, kind="stable")
            d, s, w = d[order], s[order], w[order]
        starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])
        self.du = d[starts]
        self.reads = (np.unique(s), np.unique(w))  # inp and wgt entries read (for race checks)
        rows = starts.size
        terms = d.size // rows
        if rows * terms != d.size or not np.array_equal(starts, np.arange(rows) * terms):
            self.kind, self.s, self.w, self.starts = "uneven", s, w, starts
            return
        self.terms = terms
        self.ftype = np.float32 if terms * bi <= 1024 else np.float64  # |partial sums| <= terms*bi*2^14: exact
        self.S, self.W = s.reshape(rows, terms), w.reshape(rows, terms)
        self.s_u, self.sid = unique_rows(self.S)
        self.w_u, self.wid = unique_rows(self.W)
        if len(self.s_u) * len(self.w_u) <= 2 * rows:
            self.kind = "product"
        elif len(self.w_u) <= 64:
            self.kind = "groups"
            self.groups = [np.flatnonzero(self.wid == g) for g in range(len(self.w_u))]
        else:
            self.kind = "batched"

    def sums(self, inp: np.ndarray, wgt: np.ndarray) -> np.ndarray:
        """int64 of shape (len(du), BATCH, BLOCK_OUT)."""
        b, bi = inp.shape[1:]
        bo = wgt.shape[1]
        if self.kind == "uneven":
            x = inp[self.s].astype(np.float32)
            y = np.matmul(x, wgt[self.w].astype(np.float32).transpose(0, 2, 1))  # BLOCK_IN terms: exact in float32
            return np.add.reduceat(y.astype(np.int64), self.starts, axis=0)
        terms, ftype = self.terms, self.ftype

        def lhs(seqs: np.ndarray) -> np.ndarray:  # (n, terms) -> (n*B, terms*BI)
            return inp[seqs].transpose(0, 2, 1, 3).reshape(len(seqs) * b, terms * bi).astype(ftype)

        def rhs(seqs: np.ndarray) -> np.ndarray:  # (n, terms) -> (terms*BI, n*BO)
            return wgt[seqs].transpose(1, 3, 0, 2).reshape(terms * bi, len(seqs) * bo).astype(ftype)

        if self.kind == "product":
            p = (lhs(self.s_u) @ rhs(self.w_u)).reshape(len(self.s_u), b, len(self.w_u), bo)
            return p[self.sid, :, self.wid, :].astype(np.int64)
        if self.kind == "groups":
            result = np.empty((len(self.du), b, bo), np.int64)
            for g, sel in enumerate(self.groups):
                result[sel] = (lhs(self.S[sel]) @ rhs(self.w_u[g:g + 1])).reshape(len(sel), b, bo)
            return result
        x = inp[self.S].transpose(0, 2, 1, 3).reshape(len(self.du), b, terms * bi).astype(ftype)
        y = wgt[self.W].transpose(0, 1, 3, 2).reshape(len(self.du), terms * bi, bo).astype(ftype)
        return np.matmul(x, y).astype(np.int64)


def nbytes_of(obj: object) -> int:
    """Approximate bytes held by ``obj``: array and bytes buffers plus ``_OBJECT_BYTES`` per object, through tuples,
    lists and :class:`GemmPlan` attributes (what the simulator's plan cache holds; other objects count as one)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes + _OBJECT_BYTES
    if isinstance(obj, (bytes, bytearray)):
        return len(obj) + _OBJECT_BYTES
    if isinstance(obj, (tuple, list)):
        return _OBJECT_BYTES + sum(nbytes_of(item) for item in obj)
    if isinstance(obj, GemmPlan):
        return _OBJECT_BYTES + sum(nbytes_of(value) for value in vars(obj).values())
    return _OBJECT_BYTES


def blas_single_thread() -> contextlib.AbstractContextManager[object]:
    """Limit BLAS to one thread while simulating: the matmuls here are small, and a multi-threaded BLAS on a shared
    machine spends ~100x longer spinning than computing them (measured: 70 ms vs 0.5 ms for a 44x368x352 matmul)."""
    controller = _threadpool_controller()
    return contextlib.nullcontext() if controller is None else controller.limit(limits=1, user_api="blas")


@lru_cache(maxsize=1)
def _threadpool_controller() -> Any:
    """threadpoolctl's controller (finding the BLAS libraries takes ~2 ms, so once), or None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # optional: without it BLAS keeps its own thread count
        return None
    return ThreadpoolController()
