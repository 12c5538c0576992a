"""The ``fsim`` backend: runs a :class:`~vta.program.Program` on the functional simulator (:mod:`vta.fsim`), the spec.

Registered in :data:`vta.backend.BACKENDS`; use ``vta.backend.get_backend("fsim")``.
"""
from __future__ import annotations

from typing import Any

from .backend import Backend, RunResult
from .fsim import DEFAULT_MAX_INSNS, DEFAULT_MAX_UOPS
from .program import Program

__all__ = ["FsimBackend"]


class FsimBackend(Backend):
    """The functional simulator (:mod:`vta.fsim`): exact results and event counts, no cycles.

    Options (to the constructor or to :meth:`run`): ``max_insns`` (int or None, default
    :data:`vta.fsim.DEFAULT_MAX_INSNS`) and ``max_uops`` (int or None, default :data:`vta.fsim.DEFAULT_MAX_UOPS`
    GEMM/ALU micro-op iterations): raise :class:`vta.fsim.RunawayError` before the instruction that would execute
    more, None for no limit; ``check_races`` (bool, default True): raise :class:`vta.fsim.RaceError` for data
    accesses of two modules that no dependency token orders.
    """

    name = "fsim"
    OPTIONS = ("max_insns", "max_uops", "check_races")

    def __init__(self, *, max_insns: int | None = DEFAULT_MAX_INSNS, max_uops: int | None = DEFAULT_MAX_UOPS,
                 check_races: bool = True) -> None:
        self.max_insns = max_insns
        self.max_uops = max_uops
        self.check_races = check_races

    def run(self, program: Program, **options: Any) -> RunResult:
        from . import fsim

        unknown = set(options) - set(self.OPTIONS)
        if unknown:
            raise TypeError(f"the fsim backend takes only the options {', '.join(self.OPTIONS)}, not "
                            f"{', '.join(sorted(unknown))}")
        result = fsim.run(program, max_insns=options.get("max_insns", self.max_insns),
                          max_uops=options.get("max_uops", self.max_uops),
                          check_races=options.get("check_races", self.check_races))
        return RunResult(self.name, result.dram, result.stats.as_dict(), None, None)
