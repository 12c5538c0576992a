#!/usr/bin/env python3
"""Benchmark the TSIM co-simulation: simulated cycles per second on a GEMM-heavy program, and build times.

Prints, at the default config (or ``--config FILE``):
  * cold build time (a fresh cache folder: Amaranth -> Verilog -> Verilator -> shared library; skip with --no-cold),
  * cached build time (the second ``build()`` with the same design),
  * for a tiled int8 GEMM of at least ``--min-cycles`` cycles (default 10 million): simulated cycles, wall and CPU
    seconds, cycles per second (wall and CPU), the MACs per second that implies (MACs the program performs / time,
    and the peak implied by cycles/s x MACs per cycle), and the fraction of the 1M cycles/s floor,
  * where the time goes: the CPU time per cycle of a bare clock loop on the idle core (model evaluation only)
    against the real run's (model + harness memory service),
  * baselines, the same program in the same process (skip with --no-baseline): the model built without
    profile-guided optimization (``pgo=False``), and that model clocked two-phase (evaluated at both clock edges,
    the harness's reference scheduling), with the default's speed-up over each.

Each program runs ``--repeat`` times (default 3), the default build and the baselines interleaved so that they share
the machine's state; the figures are medians, and the best and every run of the default are printed too.

Wall-clock figures depend on the machine's load; CPU seconds (time.process_time) are the steadier measure on a shared
machine. Usage::

    python scripts/bench_tsim.py [--config FILE] [--min-cycles N] [--no-cold] [--repeat N] [--no-baseline] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

FLOOR = 1_000_000  # cycles per second the issue asks for on one core


def _gemm_shape(min_cycles: int, macs_per_cycle: int, utilization: float = 0.7) -> tuple[int, int, int]:
    """A square-ish GEMM (m, k, n) expected to take at least ``min_cycles`` cycles."""
    macs = min_cycles * macs_per_cycle * utilization / 0.7 * 1.1
    side = int(round(macs ** (1 / 3) / 64 + 0.5)) * 64
    return side, side, side


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="accelerator config file (default: VTA's defaults)")
    parser.add_argument("--min-cycles", type=int, default=10_000_000, help="minimum simulated cycles (default 10M)")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold build (it takes 1-3 minutes)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of the program (and of each baseline), interleaved; the median is reported, "
                             "and the best (default 3)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the baseline runs (no PGO; no PGO and two-phase), which build one more model")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)

    from vta.config import VTAConfig, load_config
    from vta.gemm import gemm_program
    from vta.tsim.backend import TSimBackend
    from vta.tsim.bridge import Model
    from vta.tsim.build import build

    cfg = load_config(args.config) if args.config else VTAConfig()
    out: dict[str, float | int | str] = {"config": cfg.name}

    if not args.no_cold:
        with tempfile.TemporaryDirectory(prefix="vta-bench-cache-") as cold_root:
            saved = os.environ.get("VTA_CACHE_DIR")
            os.environ["VTA_CACHE_DIR"] = cold_root
            try:
                cold = build(cfg, progress=sys.stderr.isatty())
            finally:
                if saved is None:
                    os.environ.pop("VTA_CACHE_DIR", None)
                else:
                    os.environ["VTA_CACHE_DIR"] = saved
        out["cold_build_s"] = round(cold.seconds, 2)
    build(cfg, progress=sys.stderr.isatty())  # make sure the real cache holds it
    cached = build(cfg, progress=False)
    out["cached_build_s"] = round(cached.seconds, 4)

    m, k, n = _gemm_shape(args.min_cycles, cfg.macs_per_cycle)
    while True:
        t0 = time.perf_counter()
        program, _ = gemm_program(cfg, m, k, n, seed=1)
        gen_s = time.perf_counter() - t0
        backend = TSimBackend(check="none", progress=False)  # raw speed: no fsim validation or comparison
        backend.model(cfg)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        result = backend.run(program)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        if result.cycles >= args.min_cycles:
            break
        scale = (args.min_cycles / result.cycles * 1.05) ** (1 / 3)
        m, k, n = (int(v * scale / 16 + 1) * 16 for v in (m, k, n))
    cycles = int(result.cycles)
    model = backend.model(cfg)

    def timed(target: Model, two_phase: bool = False) -> tuple[float, float]:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        _, run = target.run_program(program, two_phase=two_phase)
        assert run.cycles == cycles, f"a repeated run took {run.cycles} cycles, the first {cycles}"
        return time.perf_counter() - wall0, time.process_time() - cpu0

    plain = None if args.no_baseline else Model(build(cfg, pgo=False, progress=sys.stderr.isatty()))
    times: dict[str, list[tuple[float, float]]] = {"default": [(wall, cpu)], "no PGO": [], "no PGO, two-phase": []}
    for r in range(max(1, args.repeat)):
        if r:
            times["default"].append(timed(model))
        if plain is not None:
            times["no PGO"].append(timed(plain))
            times["no PGO, two-phase"].append(timed(plain, two_phase=True))
    median = {k: sorted(v, key=lambda t: t[1])[len(v) // 2] for k, v in times.items() if v}
    wall, cpu = median["default"]
    best_cpu = min(t[1] for t in times["default"])
    idle = min(cycles, 2_000_000)
    idle0 = time.process_time()
    model.idle_cycles(idle)
    idle_cpu = time.process_time() - idle0
    macs = int(result.stats["macs"])  # the MACs the GEMMs performed (a reset GEMM's micro-ops multiply nothing)
    out.update({
        "gemm": f"{m}x{k}x{n}", "program_gen_s": round(gen_s, 2), "instructions": len(program.insns),
        "cycles": cycles, "gemm_uops": int(result.counters["gemm_uops"]),
        "gemm_utilization": round(result.counters["gemm_uops"] / cycles, 4),
        "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
        "runs": len(times["default"]), "cycles_per_s_wall": int(cycles / wall), "cycles_per_s_cpu": int(cycles / cpu),
        "cycles_per_s_cpu_best": int(cycles / best_cpu),
        "cycles_per_s_cpu_all": [int(cycles / t[1]) for t in times["default"]],
        "macs_per_s_cpu": int(macs / cpu), "peak_macs_per_s_cpu": int(cycles / cpu * cfg.macs_per_cycle),
        "floor_fraction_cpu": round(cycles / cpu / FLOOR, 3),
        "idle_cycles_per_s_cpu": int(idle / idle_cpu),
        "model_share_of_run": round(min(1.0, (idle_cpu / idle) / (cpu / cycles)), 3),
    })
    baselines: dict[str, dict[str, float]] = {}
    if plain is not None:
        for label in ("no PGO", "no PGO, two-phase"):
            base_cpu = median[label][1]
            baselines[label] = {"cycles_per_s_cpu": int(cycles / base_cpu), "speedup": round(base_cpu / cpu, 2)}
        out["baselines"] = baselines
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"TSIM benchmark at config {cfg.name}")
    if "cold_build_s" in out:
        print(f"  cold build:   {out['cold_build_s']:8.2f} s (Amaranth -> Verilog -> Verilator -> an instrumented "
              "model, a profiling run, the model compiled with its profile -> libtsim.so)")
    print(f"  cached build: {out['cached_build_s']:8.4f} s")
    print(f"  program:      GEMM {out['gemm']} (int8), {out['instructions']} instructions, "
          f"generated in {out['program_gen_s']} s")
    print(f"  simulated:    {cycles:,} cycles, {out['gemm_uops']:,} GEMM micro-ops "
          f"(GEMM core busy {100 * float(out['gemm_utilization']):.1f}% of cycles)")
    print(f"  time:         {wall:.2f} s wall, {cpu:.2f} s CPU (the median of {out['runs']} runs)")
    print(f"  speed:        {out['cycles_per_s_wall']:,} cycles/s wall, {out['cycles_per_s_cpu']:,} cycles/s CPU "
          f"({100 * float(out['floor_fraction_cpu']):.0f}% of the {FLOOR:,} cycles/s floor); best run "
          f"{out['cycles_per_s_cpu_best']:,}, all runs {', '.join(f'{v:,}' for v in out['cycles_per_s_cpu_all'])}")
    print(f"  MACs:         {out['macs_per_s_cpu']:,} MACs/s simulated (CPU), "
          f"peak implied {out['peak_macs_per_s_cpu']:,} MACs/s at {cfg.macs_per_cycle} MACs/cycle")
    for label, row in baselines.items():
        print(f"  baseline:     {label}: {row['cycles_per_s_cpu']:,} cycles/s CPU; the default is "
              f"{row['speedup']:.2f}x faster")
    print(f"  where:        the bare model clocks {out['idle_cycles_per_s_cpu']:,} idle cycles/s (CPU), so evaluating "
          f"the RTL takes ~{100 * float(out['model_share_of_run']):.0f}% of the run's time; the rest is the harness "
          "(memory service, handshakes, watchdog) and the RTL's extra activity when busy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
