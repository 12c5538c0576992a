"""The micro-op cache of a layer program: which micro-op kernels sit in the uop buffer, and when they are loaded.

:class:`UopCache` places each kernel a layer's instructions need in the uop buffer (stored in DRAM once) and emits
the LOAD UOP instructions that bring them in: by default in one preload at the layer's start.
"""
from __future__ import annotations

import hashlib

import numpy as np

from vta.config import MEM_UOP
from vta.isa import Uop
from vta.program import Allocation, ProgramBuilder

from .intrin import Intrinsics

__all__ = ["UopCache"]


class UopCache:
    """Micro-op kernels resident in the uop buffer (bump allocation, flushed when full).

    With ``preload`` (what layers use) kernels are loaded in batches: the first kernel placed emits a LOAD UOP that,
    once :meth:`close` sizes it, loads every kernel placed after it too, for as long as they fit the buffer together.
    A layer's kernels thus arrive in one load at its start, while the compute module waits for its first inputs
    anyway, instead of a LOAD UOP each on the compute module's path later (a DRAM latency and a few cycles apiece,
    and with ``concurrent_alu`` a drain of the ALU engine). A kernel that does not fit closes the batch and flushes
    the buffer; it starts the next batch, loaded where it is placed. Without ``preload`` a kernel is loaded when it
    is placed and not resident. Each kernel is stored in DRAM once (a batch's kernels together).

    The uop buffer is written only by the compute module, in program order, so overwriting a kernel that earlier
    GEMM/ALU instructions used is safe.
    """

    def __init__(self, pb: ProgramBuilder, intr: Intrinsics, prefix: str, *, preload: bool = False) -> None:
        self.pb = pb
        self.depth = intr.uop_depth
        self.prefix = prefix
        self._dram: dict[bytes, Allocation] = {}
        self._resident: dict[bytes, int] = {}
        self._next = 0
        self.loads = 0
        """LOAD UOP instructions emitted (one per preload batch)."""
        self._preload = preload
        self._batch: list[Uop] = []
        """The open batch's micro-ops, in buffer order from entry 0 (a batch starts on an empty buffer)."""
        self._batches = 0
        self._batch_insn: int | None = None
        """Index of the open batch's LOAD UOP (its size is set by :meth:`close`), else None."""

    @staticmethod
    def kernel_key(uops: list[Uop]) -> bytes:
        """The identity of a kernel's contents (a digest of its micro-ops' fields)."""
        return hashlib.sha1(np.array([(u.dst, u.src, u.wgt) for u in uops], dtype=np.int64).tobytes()).digest()

    def place(self, uops: list[Uop], key: bytes | None = None) -> tuple[int, int]:
        """``(uop_bgn, uop_end)`` of ``uops`` in the uop buffer, loaded before any instruction emitted after this
        call (by the open preload or by a LOAD UOP emitted now). ``key``: :meth:`kernel_key` of ``uops`` when the
        caller has it."""
        if not uops or len(uops) > self.depth:
            raise ValueError(f"a micro-op kernel must hold 1 to {self.depth} micro-ops, not {len(uops)}")
        key = self.kernel_key(uops) if key is None else key
        if key in self._resident:
            bgn = self._resident[key]
            return bgn, bgn + len(uops)
        if self._next + len(uops) > self.depth:
            self.close()
            self._resident.clear()
            self._next = 0
        bgn = self._next
        if self._preload:
            if self._batch_insn is None:  # sized by close(), when every preloaded kernel is known
                self._batch_insn = self.pb.load(MEM_UOP, sram_base=bgn, dram_base=0, x_size=len(uops))
                self.loads += 1
            self._batch.extend(uops)
        else:
            if key not in self._dram:
                self._dram[key] = self.pb.uop_kernel(f"{self.prefix}uop{len(self._dram)}", uops)
            self.pb.load_uops(self._dram[key], sram_base=bgn)
            self.loads += 1
        self._resident[key] = bgn
        self._next += len(uops)
        return bgn, bgn + len(uops)

    def close(self) -> None:
        """Store the open batch's kernels in DRAM (one allocation, ``{prefix}uops{n}`` for the ``n``-th batch) and
        size its LOAD UOP to them; the next kernel placed starts a new batch. Call once the layer is emitted; nothing
        to do without an open batch."""
        if self._batch_insn is None:
            return
        kernel = self.pb.uop_kernel(f"{self.prefix}uops{self._batches}", self._batch)
        self._batches += 1
        self.pb.patch(self._batch_insn, dram_base=self.pb.elem_addr(kernel, MEM_UOP), x_size=len(self._batch))
        self._batch_insn = None
        self._batch = []
