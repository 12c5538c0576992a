"""Every performance counter and event statistic, named once with its unit and meaning.

Two sources:

- ``hardware`` counters are registers of the core (``hw/``), read through its CSR port at ``csr_addr =
  CSR_COUNTERS.index(name)`` (:func:`csr_address`); they reset to zero on ``start`` and saturate at 2**64 - 1. Those
  that do not depend on timing (micro-ops, bytes, instructions) are also statistics of the functional simulator,
  equal to the hardware's on the same program (:data:`HARDWARE_STATISTICS`).
- ``stream`` statistics are not counted by the RTL: they follow from the instruction stream (MACs, token pushes and
  pops). The functional simulator counts them; the RTL backend derives them from the program that ran.

Per-module cycle classes: every cycle after ``start`` and before ``done``, each of the modules fetch, load, compute
and store is in exactly one of: idle (no instruction), ``wait_token`` (holds an instruction whose token pops are not
available, or whose token pushes find the queue full; for fetch: the target command queue is full), ``wait_mem``
(waiting for a memory request to be accepted or for read data), ``busy`` (anything else: it is doing its work).
Byte counters count useful element bytes moved (``y_size * x_size * element bytes`` per LOAD/STORE, and
``insn_bytes`` per fetched instruction), not whole bus beats, so they equal the functional simulator's statistics.

This module is on the ground floor: it imports only the standard library and :mod:`vta.isa`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .isa import TOKEN_QUEUES

__all__ = ["Counter", "HARDWARE", "STREAM", "SOURCES", "UNITS", "MODULES", "CYCLE_CLASSES", "CATALOGUE",
           "CSR_COUNTERS", "MODULE_CYCLE_COUNTERS", "UOP_COUNTERS", "BYTE_COUNTERS", "INSN_COUNTERS",
           "TOKEN_COUNTERS", "STAT_COUNTERS", "HARDWARE_STATISTICS", "STREAM_STATISTICS", "STATISTICS", "counter",
           "csr_address"]

HARDWARE = "hardware"
"""Source of a counter the RTL keeps in a register readable through the CSR port."""
STREAM = "stream"
"""Source of a statistic the RTL does not count: it follows from the instruction stream."""
SOURCES = (HARDWARE, STREAM)

UNITS = ("cycles", "micro-ops", "bytes", "instructions", "MACs", "tokens")
"""The units counters are counted in."""

MODULES = ("fetch", "load", "compute", "store")
"""The core's modules, each with its cycle classes and its instruction counter."""
CYCLE_CLASSES = ("busy", "wait_token", "wait_mem")
"""The counted cycle classes of a module; a module's idle cycles are ``cycles`` minus the three."""

_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class Counter:
    """One counter or statistic.

    name: its name in the CSR map, in :class:`vta.fsim.Stats` and in reports. unit: one of :data:`UNITS`. meaning:
    what one count is, as a sentence. source: :data:`HARDWARE` (an RTL register) or :data:`STREAM` (derived from
    the instruction stream). statistic: whether the functional simulator counts it too (every stream statistic
    does; of the hardware counters, those that do not depend on timing).
    """

    name: str
    unit: str
    meaning: str
    source: str
    statistic: bool

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"Counter name {self.name!r} is not a lower-case identifier such as 'gemm_uops'.")
        if self.unit not in UNITS:
            raise ValueError(f"Counter {self.name!r} has unit {self.unit!r}; units are {', '.join(UNITS)}.")
        if not isinstance(self.meaning, str) or not self.meaning.strip():
            raise ValueError(f"Counter {self.name!r} has an empty meaning; say what one count is.")
        if self.source not in SOURCES:
            raise ValueError(f"Counter {self.name!r} has source {self.source!r}; sources are {', '.join(SOURCES)}.")
        if self.source == STREAM and not self.statistic:
            raise ValueError(f"Counter {self.name!r} comes from the instruction stream, so it must be a statistic.")


def _hw(name: str, unit: str, meaning: str, *, statistic: bool = True) -> Counter:
    return Counter(name, unit, meaning, HARDWARE, statistic)


def _stream(name: str, unit: str, meaning: str) -> Counter:
    return Counter(name, unit, meaning, STREAM, True)


_CLASS_MEANING = {
    "busy": "doing its work (not idle, not waiting for tokens or memory)",
    "wait_token": "holding an instruction whose token pops are not available or whose token pushes find the queue "
                  "full",
    "wait_mem": "waiting for a memory request to be accepted or for read data",
}
_FETCH_WAIT_TOKEN = "holding an instruction whose target command queue is full"


def _class_meaning(module: str, cycle_class: str) -> str:
    what = _FETCH_WAIT_TOKEN if (module, cycle_class) == ("fetch", "wait_token") else _CLASS_MEANING[cycle_class]
    return f"Cycles the {module} module spends {what}."


# ---- the counters, in groups; the CSR map and the statistics are orders of these groups -----------------------------
_CYCLES = (_hw("cycles", "cycles", "Clock cycles from start to done.", statistic=False),)
_MODULE_CYCLES = tuple(_hw(f"{m}_{c}", "cycles", _class_meaning(m, c), statistic=False)
                       for m in MODULES for c in CYCLE_CLASSES)
_UOPS = (
    _hw("gemm_uops", "micro-ops", "GEMM micro-op iterations executed: iter_out * iter_in * (uop_end - uop_bgn) per "
                                  "GEMM, reset GEMMs included."),
    _hw("alu_uops", "micro-ops", "ALU micro-op iterations executed: iter_out * iter_in * (uop_end - uop_bgn) per ALU "
                                 "instruction."),
)
_BYTES = (
    _hw("insn_bytes_read", "bytes", "Instruction bytes fetched (insn_bytes per instruction)."),
    _hw("uop_bytes_read", "bytes", "Micro-op bytes loaded: y_size * x_size * micro-op bytes per UOP load."),
    _hw("wgt_bytes_read", "bytes", "Weight bytes loaded: y_size * x_size * weight-tile bytes per WGT load."),
    _hw("inp_bytes_read", "bytes", "Input bytes loaded: y_size * x_size * input-tile bytes per INP load (padding "
                                   "reads nothing)."),
    _hw("acc_bytes_read", "bytes", "Accumulator bytes loaded: y_size * x_size * tile bytes per ACC load; ACC_8BIT "
                                   "loads count their int8 DRAM bytes."),
    _hw("out_bytes_written", "bytes", "Output bytes stored: y_size * x_size * output-tile bytes per STORE."),
)
_INSN_MEANING = {
    "fetch": "Instructions dispatched by the fetch module.",
    "load": "Instructions completed by the load module.",
    "compute": "Instructions completed by the compute module (FINISH counts as compute).",
    "store": "Instructions completed by the store module.",
}
_INSNS = tuple(_hw(f"{m}_insns", "instructions", _INSN_MEANING[m]) for m in MODULES)
_MACS = (_stream("macs", "MACs", "Multiply-accumulates: BATCH * BLOCK_IN * BLOCK_OUT per micro-op of a non-reset "
                                 "GEMM (of every GEMM with the gemm_overwrite knob)."),)
_TOKEN_VERB = {"pushes": "pushed to", "pops": "popped from"}
_TOKENS = tuple(_stream(f"{q}_{kind}", "tokens", f"Tokens {_TOKEN_VERB[kind]} the {q} queue: one per flag set on "
                                                 "an executed instruction.")
                for q in TOKEN_QUEUES for kind in ("pushes", "pops"))

def _names(*groups: tuple[Counter, ...]) -> tuple[str, ...]:
    return tuple(c.name for group in groups for c in group)


CSR_COUNTERS: tuple[str, ...] = _names(_CYCLES, _MODULE_CYCLES, _UOPS, _BYTES, _INSNS)
"""The hardware counters in CSR order: register ``k`` of the core is ``CSR_COUNTERS[k]``. Append only: the order
is the register map."""
STATISTICS: tuple[str, ...] = _names(_BYTES, _UOPS, _MACS, _INSNS, _TOKENS)
"""The functional simulator's statistics, in the field order of :class:`vta.fsim.Stats`."""

CATALOGUE: dict[str, Counter] = {c.name: c for c in (*_CYCLES, *_MODULE_CYCLES, *_UOPS, *_BYTES, *_INSNS, *_MACS,
                                                     *_TOKENS)}
"""Every counter and statistic by name: the hardware ones in CSR order, then the stream ones."""

MODULE_CYCLE_COUNTERS: tuple[str, ...] = _names(_MODULE_CYCLES)
"""``{module}_{class}`` for every module and cycle class, module by module (the report's per-module columns)."""
UOP_COUNTERS: tuple[str, ...] = _names(_UOPS)
"""Micro-op counters (GEMM, ALU)."""
BYTE_COUNTERS: dict[str, str] = {c.name.split("_")[0]: c.name for c in _BYTES}
"""The byte counter of each kind of memory traffic: ``insn``, ``uop``, ``wgt``, ``inp``, ``acc`` (ACC_8BIT loads
included), ``out``."""
INSN_COUNTERS: tuple[str, ...] = _names(_INSNS)
"""Instructions per module, in :data:`MODULES` order."""
TOKEN_COUNTERS: tuple[str, ...] = _names(_TOKENS)
"""Pushes and pops of each token queue (:data:`vta.isa.TOKEN_QUEUES` order)."""
STAT_COUNTERS: tuple[str, ...] = UOP_COUNTERS + tuple(BYTE_COUNTERS.values())
"""The micro-op and byte counters, in CSR order: hardware counters the functional simulator counts too."""
HARDWARE_STATISTICS: tuple[str, ...] = tuple(n for n in CSR_COUNTERS if CATALOGUE[n].statistic)
"""Every hardware counter that equals a functional-simulator statistic on the same program, in CSR order
(:data:`STAT_COUNTERS` then :data:`INSN_COUNTERS`)."""
STREAM_STATISTICS: tuple[str, ...] = tuple(n for n, c in CATALOGUE.items() if c.source == STREAM)
"""The statistics the RTL does not count (MACs, token pushes and pops)."""


def counter(name: str) -> Counter:
    """The counter or statistic called ``name``; KeyError naming the known ones when there is none."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(f"unknown counter {name!r}; counters are {', '.join(CATALOGUE)}") from None


def csr_address(name: str) -> int:
    """The CSR address of hardware counter ``name``; KeyError naming the hardware counters when it is not one."""
    try:
        return CSR_COUNTERS.index(name)
    except ValueError:
        raise KeyError(f"unknown counter {name!r}; counters are {', '.join(CSR_COUNTERS)}") from None
