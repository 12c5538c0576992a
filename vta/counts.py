"""Event counts of a program without running it: the functional simulator's statistics, named as in
:mod:`vta.counters`.

A VTA program has no branches: every instruction runs once, so each statistic is a sum over the instruction list
(``y_size * x_size * element bytes`` per LOAD and STORE; micro-ops, MACs and tokens per instruction by the rules of
:mod:`vta.isa`: :func:`~vta.isa.insn_uops`, :func:`~vta.isa.insn_macs`, :func:`~vta.isa.insn_pushes`,
:func:`~vta.isa.insn_pops`). ``tests/test_sweep_energy.py`` checks them against :func:`vta.fsim.run` on compiled
layers.
"""
from __future__ import annotations

from typing import Iterable

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_UOP, MEM_WGT
from vta.counters import BYTE_COUNTERS, TOKEN_COUNTERS
from vta.isa import Alu, Gemm, Insn, Load, Store, insn_macs, insn_pops, insn_pushes, insn_uops
from vta.program import Program

__all__ = ["program_counts", "token_counts", "COUNTED"]

COUNTED = ("gemm_uops", "alu_uops", "macs", *BYTE_COUNTERS.values())
"""The statistics :func:`program_counts` returns (names of :data:`vta.counters.CATALOGUE`)."""

_LOAD_COUNTER = {MEM_UOP: BYTE_COUNTERS["uop"], MEM_WGT: BYTE_COUNTERS["wgt"], MEM_INP: BYTE_COUNTERS["inp"],
                 MEM_ACC: BYTE_COUNTERS["acc"], MEM_ACC_8BIT: BYTE_COUNTERS["acc"]}


def program_counts(program: Program) -> dict[str, int]:
    """Counter name -> count (micro-ops, MACs, bytes) of one run of ``program``; see :data:`COUNTED`."""
    cfg = program.cfg
    counts = dict.fromkeys(COUNTED, 0)
    counts[BYTE_COUNTERS["insn"]] = len(program.insns) * program.insn_bytes
    for insn in program.insns:
        if isinstance(insn, Load):
            counts[_LOAD_COUNTER[insn.mem]] += insn.y_size * insn.x_size * cfg.elem_bytes(insn.mem)
        elif isinstance(insn, Store):
            counts[BYTE_COUNTERS["out"]] += insn.y_size * insn.x_size * cfg.elem_bytes(insn.mem)
        elif isinstance(insn, Gemm):
            counts["gemm_uops"] += insn_uops(insn)
            counts["macs"] += insn_macs(insn, cfg)
        elif isinstance(insn, Alu):
            counts["alu_uops"] += insn_uops(insn)
    return counts


def token_counts(insns: Iterable[Insn]) -> dict[str, int]:
    """Token pushes and pops per queue of one run of ``insns`` to FINISH (every instruction runs once), named as
    :data:`vta.counters.TOKEN_COUNTERS` (``<queue>_pushes``, ``<queue>_pops``): :func:`vta.isa.insn_pushes` and
    :func:`vta.isa.insn_pops` summed."""
    counts = dict.fromkeys(TOKEN_COUNTERS, 0)
    for insn in insns:
        for q in insn_pushes(insn):
            counts[f"{q}_pushes"] += 1
        for q in insn_pops(insn):
            counts[f"{q}_pops"] += 1
    return counts
