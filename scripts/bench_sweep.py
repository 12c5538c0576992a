"""Benchmark the sweep: points per minute in each mode.

Usage: python scripts/bench_sweep.py [--mode model|exact|both] [--model NAME] [--designs N] [--workers N]

Measures ``--designs`` designs (default: 24 in model mode, 2 in exact mode) on ``--model`` (default resnet18), drawn
with a fixed seed from the wide sweep's grid (BLOCK 8/16/32 without 32 in exact mode, BATCH 1/2, buffer sizes, bus
width), into a fresh temporary database, and prints the points per minute, the seconds per point and the failed and
timed-out points. Model mode: the cycle model, the analytical area and the 45 nm energy model; it runs twice side by
side, first with an empty cache folder (``VTA_CACHE_DIR`` a fresh temporary folder: every schedule searched, as on a
new machine) and then again with that folder warm (schedules cached), and prints the ratio. Exact mode: tsim (a
Verilator build per design, cached across runs) and per-module Yosys area (cached across runs; see
scripts/bench_area.py for cold figures); use --area model to time tsim alone.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

VARY: dict[str, list[Any]] = {"LOG_BLOCK": [3, 4, 5], "LOG_BATCH": [0, 1], "LOG_INP_BUFF_SIZE": [15, 16],
                              "LOG_WGT_BUFF_SIZE": [18, 19, 20], "LOG_ACC_BUFF_SIZE": [17, 18],
                              "BUS_BYTES": [8, 16, 32]}


def bench(mode: str, model: str, designs: int, workers: int, area: str | None) -> dict[str, Any]:
    """Run one sweep of ``designs`` sampled designs in ``mode``; its summary figures."""
    from vta.sweep.runner import run_sweep
    from vta.sweep.spec import parse_spec
    from vta.sweep.store import ResultStore
    vary = dict(VARY)
    sweep: dict[str, Any] = {"models": [model], "mode": mode, "samples": designs, "seed": 1, "timeout": 7200}
    if mode == "exact":
        vary["LOG_BLOCK"] = [3, 4]  # BLOCK 32 makes a GEMM core that takes Verilator very long to build
        if area:
            sweep["area"] = area
    spec = parse_spec({"sweep": sweep, "vary": vary})
    with tempfile.TemporaryDirectory(prefix="vta-bench-sweep-") as tmp, \
            ResultStore(Path(tmp) / "bench.sqlite") as store:
        summary = run_sweep(spec, store, workers=workers)
        rows = store.rows()
    return {"mode": mode, "points": summary.measured, "ok": summary.ok, "failed": summary.failed,
            "timeout": summary.timeout, "seconds": summary.seconds, "per_minute": summary.points_per_minute,
            "errors": sorted({r["error"] for r in rows if r["error"]})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("model", "exact", "both"), default="both")
    parser.add_argument("--model", default="resnet18", help="a zoo model or ONNX file (default resnet18)")
    parser.add_argument("--designs", type=int, help="designs to measure (default 24 model, 2 exact)")
    parser.add_argument("--workers", type=int, default=2, help="local worker processes (default 2)")
    parser.add_argument("--area", choices=("yosys", "model"), help="exact mode's area (default yosys)")
    args = parser.parse_args(argv)
    for mode in ("model", "exact") if args.mode == "both" else (args.mode,):
        designs = args.designs or (24 if mode == "model" else 2)
        if mode == "exact":
            _report(mode, args, bench(mode, args.model, designs, args.workers, args.area))
            continue
        saved = os.environ.get("VTA_CACHE_DIR")
        with tempfile.TemporaryDirectory(prefix="vta-bench-cache-") as cache:
            os.environ["VTA_CACHE_DIR"] = cache  # the workers inherit it
            try:
                cold = _report("model", args, bench(mode, args.model, designs, args.workers, None), "cold")
                warm = _report("model", args, bench(mode, args.model, designs, args.workers, None), "warm")
            finally:
                if saved is None:
                    os.environ.pop("VTA_CACHE_DIR", None)
                else:
                    os.environ["VTA_CACHE_DIR"] = saved
        print(f"model  cold / warm: {cold / max(warm, 1e-9):.2f}x the time (the schedule search per new design)")
    return 0


def _report(mode: str, args: argparse.Namespace, r: dict[str, Any], label: str = "") -> float:
    """Print one bench's line (and its errors); its seconds."""
    print(f"{mode:<6} {args.model}{' ' + label if label else ''}: {r['points']} points in {r['seconds']:.1f} s = "
          f"{r['per_minute']:.2f} points/min ({r['seconds'] / max(1, r['points']):.2f} s per point, "
          f"{args.workers} workers); {r['ok']} ok, {r['failed']} failed, {r['timeout']} timed out", flush=True)
    for error in r["errors"]:
        print(f"    {error}")
    return float(r["seconds"])


if __name__ == "__main__":
    raise SystemExit(main())
