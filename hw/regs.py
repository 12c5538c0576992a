"""The core's control/status register map: the RTL specifics of the counters named in :mod:`vta.counters`.

The top-level core exposes a read port ``csr_addr`` (in, :data:`CSR_ADDR_BITS` bits) / ``csr_rdata`` (out, 64 bits,
combinational); register ``k`` is ``COUNTERS[k]``. All counters reset to zero on ``start`` and saturate at
2**64 - 1. What each counter counts, and its unit, is in :mod:`vta.counters` (the cycle classes of each module, the
byte counters' element bytes).
"""
from __future__ import annotations

from vta.counters import CSR_COUNTERS, CYCLE_CLASSES, MODULES

__all__ = ["COUNTERS", "CSR_ADDR_BITS", "CYCLE_CLASSES", "MODULES"]

COUNTERS: tuple[str, ...] = CSR_COUNTERS
"""Counter names in CSR order: ``csr_addr = COUNTERS.index(name)``."""

CSR_ADDR_BITS = 6
"""Width of the ``csr_addr`` port (bits): room for 64 counters."""

if len(COUNTERS) > 1 << CSR_ADDR_BITS:
    raise ValueError(f"{len(COUNTERS)} counters do not fit the {CSR_ADDR_BITS}-bit CSR address space "
                     f"({1 << CSR_ADDR_BITS} registers); widen CSR_ADDR_BITS.")
