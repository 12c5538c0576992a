"""The core's control/status register map and performance counters, as data shared by the RTL and the TSIM bridge.

The top-level core exposes a read port ``csr_addr`` (in) / ``csr_rdata`` (out, 64 bits, combinational); register
``k`` is ``COUNTERS[k]``. All counters reset to zero on ``start`` and saturate at 2**64 - 1.

Per-module cycle classes: every cycle after ``start`` and before ``done``, each of the modules fetch, load, compute
and store is in exactly one of: idle (no instruction), ``wait_token`` (holds an instruction whose token pops are not
available, or whose token pushes find the queue full; for fetch: the target command queue is full), ``wait_mem``
(waiting for a memory request to be accepted or for read data), ``busy`` (anything else: it is doing its work).
Byte counters count useful element bytes moved (``y_size * x_size * element bytes`` per LOAD/STORE, and
``insn_bytes`` per fetched instruction), not whole bus beats, so they equal the functional simulator's statistics.
"""
from __future__ import annotations

MODULES = ("fetch", "load", "compute", "store")
CYCLE_CLASSES = ("busy", "wait_token", "wait_mem")

COUNTERS: tuple[str, ...] = (
    "cycles",
    *(f"{m}_{c}" for m in MODULES for c in CYCLE_CLASSES),
    "gemm_uops",          # GEMM micro-op iterations executed (iter_out * iter_in * (uop_end - uop_bgn) per GEMM)
    "alu_uops",           # ALU micro-op iterations executed
    "insn_bytes_read",    # instruction bytes fetched
    # LOAD bytes by memory type (acc_bytes_read includes ACC_8BIT loads, counted in their int8 DRAM bytes)
    "uop_bytes_read", "wgt_bytes_read", "inp_bytes_read", "acc_bytes_read",
    "out_bytes_written",  # STORE bytes
    *(f"{m}_insns" for m in MODULES),  # instructions completed by each module (fetch: dispatched)
)
"""Counter names in CSR order: ``csr_addr = COUNTERS.index(name)``."""

CSR_ADDR_BITS = 6
assert len(COUNTERS) <= 1 << CSR_ADDR_BITS
