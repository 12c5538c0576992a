#!/usr/bin/env python3
# Tutorial 5: codesign. Change one thing about the accelerator, compare the two reports layer by layer, then let a
# small sweep try many designs and draw the Pareto frontier of speed and energy against area.
#
# Run it:   python docs/tutorials/05_codesign.py                        (mini_resnet, ~10 s)
#           python docs/tutorials/05_codesign.py --model resnet18       (~40 s)
# The model can also be given in the environment: VTA_TUTORIAL_MODEL=tiny_cnn.
#
# The same on the command line:
#   vta run mini_resnet --report-json build/tutorials/a.json
#   vta run mini_resnet --config configs/bus16.toml --report-json build/tutorials/b.json
#   vta report build/tutorials/a.json build/tutorials/b.json     (layer by layer: cycles and energy, B/A)
#   vta sweep scripts/sweeps/small.toml      (a sweep file; prints the frontier, writes the plots)
from __future__ import annotations

import argparse
import os
import sys

from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.report import Report, build_report, compare, format_comparison
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig
from vta.sweep.pareto import frontier, frontier_table, plot_frontiers
from vta.sweep.runner import run_sweep
from vta.sweep.spec import load_spec
from vta.sweep.store import ResultStore

OUT_DIR = os.path.join("build", "tutorials")

SWEEP = """\
# Which memory bus and weight buffer for {model}? 3 x 3 = 9 designs, each compiled and predicted by the cycle
# model (mode "model": seconds per design; "exact" runs each on its Verilator build, minutes per design).
[sweep]
name = "tutorial"
models = ["{model}"]
mode = "model"
timeout = 60

[vary]
BUS_BYTES = [8, 16, 32]            # a 64-, 128- or 256-bit memory bus
LOG_WGT_BUFF_SIZE = [16, 17, 18]   # a 64, 128 or 256 KiB weight buffer
"""


def report_for(model: str, cfg: VTAConfig) -> Report:
    """Compile ``model`` for ``cfg``, run it on fsim and return the report. fsim counts events but not cycles, so
    the report's cycles are the cycle model's prediction for each accelerator layer (`--target tsim` measures)."""
    compiled = compile_model(model, cfg)
    out = run(compiled, random_inputs(compiled.graph, seed=0), target="fsim")
    return build_report(compiled, out, model=model)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Tutorial 5: compare two designs, then sweep")
    parser.add_argument("--model", default=os.environ.get("VTA_TUTORIAL_MODEL", "mini_resnet"))
    args = parser.parse_args(argv)
    os.makedirs(OUT_DIR, exist_ok=True)

    # 1. One change: a memory bus twice as wide (BUS_BYTES 8 -> 16). Any field of VTAConfig can change the same way
    #    (buffer sizes log_*_buff_size, the GEMM shape log_batch/log_block, dram_latency, ...); replace() checks
    #    the new design whole.
    base = VTAConfig()
    wide = base.replace(bus_bytes=16)
    a, b = report_for(args.model, base), report_for(args.model, wide)
    paths = [os.path.join(OUT_DIR, f"{args.model}_{tag}.json") for tag in ("bus8", "bus16")]
    a.write_json(paths[0])
    b.write_json(paths[1])
    print(format_comparison(a, b, "8-byte bus", "16-byte bus"))
    rows = compare(a, b)
    faster = [r["layer"] for r in rows if r["cycles_ratio"] is not None and r["cycles_ratio"] < 1]
    print(f"{len(faster)} layers got faster with the wider bus; wrote {paths[0]} and {paths[1]} "
          f"(`vta report {paths[0]} {paths[1]}` prints the same table)")

    # 2. A small sweep. A sweep file names the models, the fields to vary and the mode; every point (design x model)
    #    becomes one row of an SQLite database, so a second run only measures what is missing.
    spec_path = os.path.join(OUT_DIR, "sweep.toml")
    with open(spec_path, "w") as f:
        f.write(SWEEP.format(model=args.model))
    spec = load_spec(spec_path)
    db = os.path.join(OUT_DIR, "sweep.sqlite")
    with ResultStore(db) as store:
        summary = run_sweep(spec, store, workers=0)    # 0: in this process; N: N worker processes
        results = store.rows(mode=spec.mode, status="ok")
    keys = {p.key for p in spec.points()}
    results = [r for r in results if (r["design"], r["model"], r["mode"]) in keys]
    print(f"sweep: {summary.ok} designs measured, {summary.skipped} already in {db}, {summary.failed} failed")

    # 3. The Pareto frontier: the designs no other design beats on both area (smaller) and inferences per second
    #    (higher); the same for energy per inference (lower). Plots: every design in grey, the frontier in red.
    front = frontier(results, "area_clb", "inferences_per_s", maximize_y=True)
    print(frontier_table(front, "throughput"))
    plots = plot_frontiers({args.model: results}, os.path.join(OUT_DIR, "sweep-plots"), title="tutorial sweep")
    for path in plots:
        print(f"wrote {path}")
    return {"a": a, "b": b, "compare": rows, "paths": paths, "summary": summary, "results": results,
            "front": front, "plots": plots}


if __name__ == "__main__":
    main(sys.argv[1:])
