"""Profile-guided optimization of a TSIM build: the training run.

:func:`vta.tsim.build.build` compiles the Verilated model once with ``-fprofile-generate``, runs this module in a
subprocess against that instrumented library, then compiles the model again with ``-fprofile-use``. The compiler then
lays out the model's (large, straight-line) evaluation code by what a real run executes: the model evaluates about
30% faster. The profile only steers optimization; results are the same with or without it.

The training workload is a tiled GEMM and the ALU test program on the library's own config, about
:data:`TRAIN_GEMM_UOPS` GEMM micro-ops (well under a second of simulation). Usage (by the build)::

    python -m vta.tsim.pgo LIBRARY CONFIG_JSON
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from vta.config import VTAConfig

__all__ = ["TRAIN_GEMM_UOPS", "train", "gemm_shape"]

TRAIN_GEMM_UOPS = 60_000
"""GEMM micro-ops the training GEMM performs (its cycles are a little more)."""


def gemm_shape(cfg: VTAConfig, uops: int = TRAIN_GEMM_UOPS) -> tuple[int, int, int]:
    """A cube GEMM (m, k, n) of about ``uops`` GEMM micro-ops at ``cfg``, each side a multiple of the block sizes."""
    side = round((uops * cfg.macs_per_cycle) ** (1 / 3))
    step = max(cfg.batch, cfg.block_in, cfg.block_out)
    side = max(step, side // step * step)
    return side, side, side


def train(library: Path, cfg: VTAConfig) -> dict[str, int | float]:
    """Run the training workload on the (instrumented) ``library`` built for ``cfg``; returns what ran. The profile
    is written when the process exits, next to the model's object files."""
    from vta.gemm import gemm_program
    from vta.testing import alu_program
    from vta.tsim.bridge import Model
    from vta.tsim.build import Build

    model = Model(Build(cfg, Path(library), Path(library).parent, "pgo-train", "none", True, 0.0))
    m, k, n = gemm_shape(cfg)
    cycles = 0
    started = time.perf_counter()
    for program, _ in (gemm_program(cfg, m, k, n, seed=1), alu_program(cfg, seed=1)):
        cycles += model.run_program(program)[1].cycles
    return {"gemm": m, "cycles": cycles, "seconds": round(time.perf_counter() - started, 3)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__.split("Usage")[0].strip(), file=sys.stderr)
        print("usage: python -m vta.tsim.pgo LIBRARY CONFIG_JSON", file=sys.stderr)
        return 2
    cfg = VTAConfig.from_dict(json.loads(Path(args[1]).read_text()))
    print(json.dumps(train(Path(args[0]), cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
