"""Conformance kit cases that use the host's side of the core (:mod:`vta.tsim.conform`): a reset between programs
on the same core, and DRAM at high addresses through a sparse image. Like every kit case they read only the core's
ports, the DRAM and the counters, so they apply to any core.

* ``corner reset <program>``: one model runs the program to FINISH twice, a reset between (:meth:`Model.run_series
  <vta.tsim.bridge.Model.run_series>`); then, on a second model, :data:`RESET_CUTS` times: the program cut short at a
  fraction of its cycles (the core in the middle of its work: readers busy, tokens queued, counters running), the
  reset, and the program again to FINISH. Every full run must match fsim's, DRAM and statistics: a register whose
  reset is lost carries the cut program's state into the next (a host resets a core between jobs; a fresh model
  starts from the declared initial values, which hide a missing reset under Verilator).
* ``corner addresses high <mem> [bit B]``: the ``corner addresses`` program of ``mem`` (its every-bit offsets,
  strided pairs and stores) with its far region moved up by :data:`HIGH_OFFSET` bytes (``--thorough``: also by
  each single bit of :data:`HIGH_BITS`), served from a window of a sparse DRAM image
  (:meth:`Model.run <vta.tsim.bridge.Model.run>`'s ``windows``); the low copy of the region is overwritten with
  its bitwise complement, so a core that drops a high address bit reads wrong data (or outside the image).
  fsim runs the program at the low address: its semantics do not depend on where a region lies, so the moved
  region's final bytes, copied back, must equal fsim's.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from vta.config import MEM_NAMES, MEM_OUT, VTAConfig
from vta.isa import Load, Store, encode_stream
from vta.program import Program

__all__ = ["RESET_CUTS", "HIGH_OFFSET", "HIGH_BITS", "check_reset", "check_high", "relocate", "host_cases"]

RESET_CUTS = 5
"""Cuts per ``corner reset`` case: at 1/6, 2/6, ... 5/6 of the program's cycles on the core."""
HIGH_OFFSET = 0xF000_0000
"""Bytes the ``corner addresses high`` cases move the far region up by: DRAM byte address bits 28 to 31 all set."""
HIGH_BITS = (28, 29, 30, 31)
"""``--thorough`` also moves the region by each ``2**bit`` alone."""


def _failure(feature: str, err: Exception, started: float, program: Program) -> Any:
    """The :class:`~vta.tsim.conform.Outcome` of a run that raised a :class:`~vta.tsim.bridge.TsimError`."""
    from .bridge import TsimBudgetError, TsimWatchdogError
    from .conform_result import Outcome, _unfinished
    seconds = time.monotonic() - started
    if isinstance(err, TsimWatchdogError):
        stuck = "; ".join(m.summary() for m in err.modules if m.state != "idle") or "no module busy"
        return Outcome(feature, "hang", f"no progress for {err.idle_cycles:,} cycles at cycle {err.cycles:,}: "
                                        f"{stuck}", None, seconds)
    if isinstance(err, TsimBudgetError):
        return Outcome(feature, "hang", f"{str(err).split(' (')[0]}: {_unfinished(program, err.counters)}", None,
                       seconds)
    return Outcome(feature, "error", str(err).splitlines()[0], None, seconds)


def check_reset(backend: Any, program: Program, feature: str, *, cuts: int = RESET_CUTS) -> Any:
    """``corner reset``: ``program`` to FINISH, a reset, ``program`` again on the same model; then ``cuts`` times
    the program cut at ``k / (cuts + 1)`` of its cycles, a reset, the program to FINISH, all on a second model.
    Each full run is compared with fsim's; the outcome's detail names the run that differs first."""
    from vta import fsim

    from .backend import cycle_budget
    from .bridge import TsimError
    from .conform_result import Outcome, result_problems
    started = time.monotonic()
    expected = fsim.run(program)
    model = backend.model(program.cfg)
    budget = cycle_budget(program, watchdog_cycles=backend.watchdog_cycles).cycles
    options = {"max_cycles": budget, "watchdog_cycles": backend.watchdog_cycles}
    try:
        runs = model.run_series([program, program], **options)
        labels = ["the first run", "the run after a reset at FINISH"]
        cycles = runs[0][1].cycles
        at = [max(1, cycles * k // (cuts + 1)) for k in range(1, cuts + 1)]
        later = model.run_series([program] * (2 * cuts), cuts=[c for cut in at for c in (cut, None)], **options)
        runs += later[1::2]
        labels += [f"the run after a reset at cycle {cut:,} of an earlier run" for cut in at]
    except TsimError as err:
        return _failure(feature, err, started, program)
    for label, run in zip(labels, runs):
        assert run is not None  # every second program of the series ran to FINISH
        problems = result_problems(program, expected, run[0], run[1], None)
        if problems:
            return Outcome(feature, "fail", f"{label}: " + "; ".join(problems), None, time.monotonic() - started)
    return Outcome(feature, "pass", "", cycles, time.monotonic() - started)


def _dram_rows(cfg: VTAConfig, insn: Load | Store) -> tuple[int, int]:
    """The byte range [lo, hi) an instruction's DRAM rows span (empty for a LOAD or STORE of no element)."""
    if insn.y_size == 0 or insn.x_size == 0:
        return 0, 0
    eb = cfg.elem_bytes(MEM_OUT if isinstance(insn, Store) else insn.mem)
    lo = insn.dram_base * eb
    return lo, lo + ((insn.y_size - 1) * insn.x_stride + insn.x_size) * eb


def relocate(program: Program, name: str, offset: int) -> tuple[list[Any], np.ndarray, tuple[int, np.ndarray]]:
    """``program`` with its allocation ``name`` moved up by ``offset`` bytes: the instructions (each LOAD and STORE
    whose DRAM rows lie in the allocation addresses the moved copy), the DRAM image holding them, in which the
    allocation's bytes are complemented (a read of the old place gives wrong data), and the window (byte address,
    bytes) that holds the allocation at its new place. ValueError when an instruction's rows straddle the
    allocation's edge, or ``offset`` is not a multiple of the bus width and of every element size."""
    cfg = program.cfg
    alloc = program.allocation(name)
    lo, hi = alloc.offset, alloc.offset + alloc.nbytes
    sizes = [cfg.bus_bytes] + [cfg.elem_bytes(m) for m in MEM_NAMES]
    if offset <= 0 or any(offset % size for size in sizes) or lo % cfg.bus_bytes:
        raise ValueError(f"cannot move allocation {name!r} (at byte {lo:#x}) by {offset:#x} bytes: both must be "
                         f"multiples of the bus width and of every element size")
    insns: list[Any] = []
    for k, insn in enumerate(program.insns):
        if isinstance(insn, (Load, Store)):
            first, end = _dram_rows(cfg, insn)
            if first < end and first < hi and lo < end:
                if not (lo <= first and end <= hi):
                    raise ValueError(f"instruction {k} reads or writes bytes [{first:#x}, {end:#x}), across the edge "
                                     f"of allocation {name!r} [{lo:#x}, {hi:#x})")
                eb = cfg.elem_bytes(MEM_OUT if isinstance(insn, Store) else insn.mem)
                insn = _moved(insn, offset // eb)
        insns.append(insn)
    image = program.dram.copy()
    encoded = encode_stream(insns, cfg).reshape(-1)
    image[program.insn_offset:program.insn_offset + encoded.size] = encoded
    window = program.dram[lo:hi].copy()
    image[lo:hi] = ~window
    return insns, image, (lo + offset, window)


def _moved(insn: Load | Store, elements: int) -> Load | Store:
    import dataclasses
    return dataclasses.replace(insn, dram_base=insn.dram_base + elements)


_FAR = {"inp": "far", "wgt": "far", "acc": "far", "acc8": "far", "uop": "uops far"}
"""The allocation each ``corner addresses`` program reads its far region from."""


def check_high(backend: Any, program: Program, region: str, offset: int, feature: str) -> Any:
    """``corner addresses high``: ``program`` with allocation ``region`` moved up by ``offset`` bytes
    (:func:`relocate`) run on the core from a sparse DRAM (the image and one window), the window copied back to
    the region's place and the whole compared with fsim's run of ``program``."""
    from vta import fsim

    from .backend import cycle_budget
    from .bridge import TsimError
    from .conform_result import Outcome, result_problems
    started = time.monotonic()
    expected = fsim.run(program)
    insns, image, (base, window) = relocate(program, region, offset)
    budget = cycle_budget(program, watchdog_cycles=backend.watchdog_cycles)
    image_stream = image[program.insn_offset:program.insn_offset + len(insns) * program.insn_bytes].copy()
    try:
        dram, out = backend.model(program.cfg).run(
            image, insn_addr=program.insn_offset, insn_count=len(insns), insns=insns, max_cycles=budget.cycles,
            watchdog_cycles=backend.watchdog_cycles, in_place=True, windows=[(base, window)])
    except TsimError as err:
        return _failure(feature, err, started, program)
    alloc = program.allocation(region)
    dram[alloc.offset:alloc.offset + alloc.nbytes] = window
    stream = slice(program.insn_offset, program.insn_offset + len(insns) * program.insn_bytes)
    problems = [] if np.array_equal(dram[stream], image_stream) else ["the core wrote into the instruction stream"]
    dram[stream] = program.dram[stream]  # the moved stream back to fsim's, for the comparison
    problems += result_problems(program, expected, dram, out, None)
    detail = "; ".join(problems) + (f" (the region {region!r} at byte {base:#x})" if problems else "")
    return Outcome(feature, "fail" if problems else "pass", detail, int(out.counters.get("cycles", out.cycles)),
                   time.monotonic() - started)


def host_cases(cfg: VTAConfig, backend: Any, *, thorough: bool = False) -> list[tuple[str, Callable[[], Any]]]:
    """The kit's host-side cases for ``cfg`` as (feature, run) pairs, each ``run()`` returning an
    :class:`~vta.tsim.conform.Outcome`; the programs are built when a case runs."""
    from .conform_programs import FEATURES

    def reset(name: str) -> tuple[str, Callable[[], Any]]:
        feature = f"corner reset {name.removeprefix('corner ')}"
        return feature, lambda: check_reset(backend, FEATURES[name](cfg), feature)

    def high(mem: str, offset: int, suffix: str = "") -> tuple[str, Callable[[], Any]]:
        feature = f"corner addresses high {mem}{suffix}"
        return feature, lambda: check_high(backend, FEATURES[f"corner addresses {mem}"](cfg), _FAR[mem], offset,
                                           feature)

    cases = [reset("corner long acc8"), reset("stress tokens")]
    cases += [high(mem, HIGH_OFFSET) for mem in _FAR]
    if thorough:
        cases += [high(mem, 1 << bit, f" bit {bit}") for bit in HIGH_BITS for mem in _FAR]
    return cases
