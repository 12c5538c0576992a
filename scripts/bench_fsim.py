"""Functional-simulator speed: a 1024x1024x1024 int8 GEMM program against numpy's float64 matmul of the same size.

Usage: python scripts/bench_fsim.py [--size N] [--config FILE] [--single-buffer]

Builds the program with ``vta.gemm.gemm_program`` (tiled, tokened, requantized), runs it on ``vta.fsim``, checks
the output against numpy exactly, and prints MACs per second for both (and their ratio) as measured in this run.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from vta import fsim
from vta.config import VTAConfig, load_config
from vta.gemm import gemm_program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024, help="m = k = n (default 1024)")
    parser.add_argument("--config", help="VTA config file (default: VTA's default design)")
    parser.add_argument("--single-buffer", action="store_true", help="build without double buffering")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best is reported (default 3)")
    args = parser.parse_args()
    cfg = load_config(args.config) if args.config else VTAConfig()
    n = args.size

    t0 = time.perf_counter()
    program, expected = gemm_program(cfg, n, n, n, double_buffer=not args.single_buffer)
    build = time.perf_counter() - t0

    best_fsim = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = fsim.run(program)
        best_fsim = min(best_fsim, time.perf_counter() - t0)
    if not np.array_equal(program.read("C", result.dram), expected):
        raise SystemExit("MISMATCH: the fsim result differs from numpy")

    a = np.random.default_rng(0).integers(-128, 128, (n, n)).astype(np.float64)
    b = np.random.default_rng(1).integers(-128, 128, (n, n)).astype(np.float64)
    best_np = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        a @ b
        best_np = min(best_np, time.perf_counter() - t0)

    macs = result.stats.macs
    fsim_rate, np_rate = macs / best_fsim, n ** 3 / best_np
    print(f"config {cfg.name}; GEMM {n}x{n}x{n}; {len(program.insns)} instructions; program built in {build:.2f} s")
    print(f"result matches numpy exactly; {macs:,} MACs ({result.stats.gemm_uops:,} GEMM micro-ops)")
    print(f"fsim:                  {best_fsim * 1e3:9.1f} ms  {fsim_rate / 1e9:8.3f} GMAC/s")
    print(f"numpy float64 matmul:  {best_np * 1e3:9.1f} ms  {np_rate / 1e9:8.3f} GMAC/s")
    print(f"fsim / numpy:          {fsim_rate / np_rate:9.3f}")


if __name__ == "__main__":
    main()
