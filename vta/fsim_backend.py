"""The ``fsim`` backend: runs a :class:`~vta.program.Program` on the functional simulator (:mod:`vta.fsim`), the spec.

Registered in :data:`vta.backend.BACKENDS`; use ``vta.backend.get_backend("fsim")``.
"""
from __future__ import annotations

from typing import Any

from .backend import Backend, RunResult
from .program import Program

__all__ = ["FsimBackend"]


class FsimBackend(Backend):
    """The functional simulator (:mod:`vta.fsim`): exact results and event counts, no cycles.

    Options (to the constructor or to :meth:`run`): ``max_insns`` (int or None): raise
    :class:`vta.fsim.RunawayError` past that many instructions; ``check_races`` (bool, default True): raise
    :class:`vta.fsim.RaceError` for data accesses of two modules that no dependency token orders.
    """

    name = "fsim"
    OPTIONS = ("max_insns", "check_races")

    def __init__(self, *, max_insns: int | None = None, check_races: bool = True) -> None:
        self.max_insns = max_insns
        self.check_races = check_races

    def run(self, program: Program, **options: Any) -> RunResult:
        from . import fsim

        unknown = set(options) - set(self.OPTIONS)
        if unknown:
            raise TypeError(f"the fsim backend takes only the options {', '.join(self.OPTIONS)}, not "
                            f"{', '.join(sorted(unknown))}")
        result = fsim.run(program, max_insns=options.get("max_insns", self.max_insns),
                          check_races=options.get("check_races", self.check_races))
        return RunResult(self.name, result.dram, result.stats.as_dict(), None, None)

