"""The conformance kit's checks of the timing counters (:mod:`vta.tsim.conform`).

fsim has no timing, so the kit cannot compare the cycle counters with it; it checks them against their definitions
(:mod:`vta.counters`, docs/hardware.md "Counters"), relations that hold on any correct core, whatever its timing:

* ``cycles`` counts the cycles from start to done: at most the host's count of them and at least that minus
  :data:`CYCLES_SLACK` (a wrapper's register stages may finish after its inner core's ``done``);
* every cycle each module is in at most one of its cycle classes, so its ``busy``, ``wait_token`` and ``wait_mem``
  cycles add up to at most ``cycles``;
* a module holds each instruction it executes for at least one cycle, and is not idle while it holds one, so a
  module that executed an instruction (fetch: dispatched one) has ``busy + wait_token + wait_mem >= 1``;
* a module that read DRAM (fetch always; load for a LOAD of inp or wgt, compute for a LOAD of uop, acc or acc8 that
  reads at least one element) cannot have its first read's data before the memory's read latency has passed after
  it asked for it, and it holds the instruction meanwhile, so at a read latency of :data:`WAIT_MEM_LATENCY` cycles or
  more its ``wait_mem`` is at least 1;
* fetch is idle only once it has dispatched every instruction, and a module with an instruction queued or held is
  not idle (but for a cycle between taking one and the next), so until the last instruction of a module completes,
  fetch or that module is busy, waiting for a token or waiting for memory in every cycle. When compute's last
  instruction before FINISH (but token-only ones) hands a token to a module that hands FINISH the token FINISH
  waits for with its last instruction (:meth:`vta.program.ProgramBuilder.finish` after a STORE of compute's
  results), compute has nothing to do meanwhile but FINISH, which retires shortly after that module's last
  instruction, and is idle after it; so fetch's and that module's counted cycles add up to at least compute's, but for
  :data:`FINISH_TAIL` and one cycle per instruction of the module (:func:`covering_problems`).

A counter read at another counter's address, or one stuck at zero, breaks the last two on most programs; the first
two catch a counter that counts too much.

And ``done`` itself (docs/core-interface.md): it rises once compute has retired FINISH and every other module is
idle, so nothing progresses after it (:func:`progress_after_done`; the harness keeps clocking after ``done`` until
the core has been quiet for a while, and counts those cycles).
"""
from __future__ import annotations

from typing import Any

__all__ = ["CYCLES_SLACK", "WAIT_MEM_LATENCY", "FINISH_TAIL", "timing_counter_problems", "modules_that_read_dram",
           "covering_problems", "progress_after_done"]

CYCLES_SLACK = 64
"""Cycles the core's ``cycles`` counter may trail the host's count from start to done (a wrapper's extra register
stages finish after the inner core's ``done``; the generated core's counter equals the host's count)."""
WAIT_MEM_LATENCY = 2
"""The read latency (cycles) from which a module that reads DRAM must count at least one ``wait_mem`` cycle (at a
latency of 1 the request's cycle and the data's may be back to back)."""
FINISH_TAIL = 1_000
"""Cycles allowed from the completion of the instruction whose token FINISH pops to FINISH's retirement (the token
passing to compute; the generated core takes a few)."""


def modules_that_read_dram(program: Any) -> set[str]:
    """The modules (of :data:`vta.counters.MODULES`) that read DRAM when ``program`` (a :class:`vta.program.Program`)
    runs: fetch always, load and compute when they execute a LOAD of at least one element (padding reads nothing)."""
    from vta.isa import Load, module_of
    readers = {"fetch"}
    for insn in program.insns:
        if isinstance(insn, Load) and insn.x_size and insn.y_size:
            readers.add(module_of(insn))
    return readers


def timing_counter_problems(counters: dict[str, int], host_cycles: int, program: Any = None,
                            latency: int | None = None) -> list[str]:
    """The timing counters' contradictions of their definitions (see the module docstring): ``counters`` by name (as
    read after the run), ``host_cycles`` the harness's count of cycles from start to done. With ``program`` (the
    :class:`vta.program.Program` that ran; its instructions say which modules executed some and which read DRAM) the
    lower bounds are checked too, the ``wait_mem`` one only when ``latency`` (the run's read latency, cycles) is at
    least :data:`WAIT_MEM_LATENCY`. Each problem is a sentence naming the counters."""
    from vta.counters import CYCLE_CLASSES, MODULES
    from vta.isa import module_of
    problems = []
    cycles = int(counters.get("cycles", 0))
    if not host_cycles - CYCLES_SLACK <= cycles <= host_cycles:
        problems.append(f"the cycles counter reads {cycles:,}, the host counted {host_cycles:,} cycles from start to "
                        "done")
    held: set[str] = set()
    readers: set[str] = set()
    if program is not None and program.insns:
        held = {"fetch"} | {module_of(insn) for insn in program.insns}
        if (latency or 0) >= WAIT_MEM_LATENCY:
            readers = modules_that_read_dram(program)
    for module in MODULES:
        classes = [int(counters.get(f"{module}_{c}", 0)) for c in CYCLE_CLASSES]
        if sum(classes) > cycles:
            problems.append(f"{module}'s busy, wait_token and wait_mem cycles ({' + '.join(f'{n:,}' for n in classes)})"
                            f" exceed the cycles counter ({cycles:,})")
        if module in held and sum(classes) == 0:
            problems.append(f"{module}'s busy, wait_token and wait_mem cycles are all 0, yet it executed instructions "
                            "(a module holding an instruction is not idle)")
        if module in readers and classes[CYCLE_CLASSES.index("wait_mem")] == 0:
            problems.append(f"{module}'s wait_mem counter reads 0, yet it read DRAM at a read latency of {latency} "
                            "cycles (it holds the instruction while the data is on its way)")
    return problems + (covering_problems(counters, program) if program is not None else [])


def _finish_waits_for(program: Any) -> list[str]:
    """The modules ``m`` whose instructions FINISH waits for while compute has nothing else to do: compute's last
    instruction before FINISH that is not token-only (a LOAD of no element) pushes the last ``compute_to_m`` token,
    a later instruction of ``m`` pops it, and ``m``'s last instruction pushes the last ``m_to_compute`` token, which
    FINISH pops (each queue's pushes and pops balanced)."""
    from vta.isa import Finish, Load, insn_pops, insn_pushes, module_of
    insns = program.insns
    if not insns or not isinstance(insns[-1], Finish):
        return []
    work = [i for i in insns[:-1] if module_of(i) == "compute" and not (isinstance(i, Load) and not i.x_size)]

    def balanced(queue: str) -> bool:
        return sum(insn_pushes(i).count(queue) for i in insns) == sum(insn_pops(i).count(queue) for i in insns)
    waited = []
    for queue in insn_pops(insns[-1]):
        module = queue.split("_to_")[0]
        back = f"compute_to_{module}"
        own = [insn for insn in insns if module_of(insn) == module]
        if own and work and queue in insn_pushes(own[-1]) and back in insn_pushes(work[-1]) \
                and any(back in insn_pops(i) for i in own) and balanced(queue) and balanced(back):
            waited.append(module)
    return waited


def covering_problems(counters: dict[str, int], program: Any) -> list[str]:
    """For each module of :func:`_finish_waits_for` (its last instructions run between compute's last one before
    FINISH and FINISH, each waiting for the other's token): fetch's and that
    module's busy, wait_token and wait_mem cycles together are at least compute's, but for :data:`FINISH_TAIL` and
    one cycle per instruction of the module (see the module docstring); a counter that lost counts falls short."""
    from vta.counters import CYCLE_CLASSES
    from vta.isa import module_of

    def counted(module: str) -> int:
        return sum(int(counters.get(f"{module}_{c}", 0)) for c in CYCLE_CLASSES)
    problems = []
    for module in _finish_waits_for(program):
        both, compute = counted("fetch") + counted(module), counted("compute")
        slack = FINISH_TAIL + sum(module_of(insn) == module for insn in program.insns)
        if both < compute - slack:
            problems.append(f"fetch's and {module}'s busy, wait_token and wait_mem cycles add up to {both:,}, fewer "
                            f"than compute's ({compute:,}), yet one of them holds an instruction until {module}'s last "
                            "one completes, shortly before FINISH retires (compute has only FINISH left meanwhile)")
    return problems


def progress_after_done(drain_cycles: int, latency: int) -> str | None:
    """The problem, if any, with a run that the harness clocked ``drain_cycles`` cycles after ``done`` at a read
    latency of ``latency`` cycles: it stops once the core has made no progress for
    :func:`vta.tsim.bridge.default_drain_cycles` cycles in a row, so more cycles than that mean some module still
    completed an instruction or moved a memory beat after ``done`` rose (``done`` came too early)."""
    from .bridge import default_drain_cycles
    quiet = default_drain_cycles(latency)
    if drain_cycles <= quiet:
        return None
    return (f"the core still made progress after done rose (the harness clocked {drain_cycles:,} cycles after done, "
            f"a run that stops at done is quiet after {quiet:,}): done must wait until every module is idle")
