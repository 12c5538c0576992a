"""The analytical cycle model (vta.cost) against tsim on every accelerator layer of ResNet-18.

Usage: python scripts/bench_cost.py [--config FILE] [--no-tsim]

Compiles ResNet-18 for the config, runs it on tsim (per-layer cycles from the core's counters), estimates each
layer's program with the model, and prints per layer: tsim cycles, predicted cycles, error %, the bounding module;
then the totals, the worst error, the model's time for the whole network and tsim's wall time. A few minutes on the
2-core machine (compile ~5 s, tsim ~2 min of simulation including the CPU layers).
"""
from __future__ import annotations

import argparse
import time

from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.runtime.compiled import AccelStep
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig, load_config
from vta.cost import estimate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="VTA config file (default: VTA's default design)")
    parser.add_argument("--no-tsim", action="store_true", help="only time the model (no tsim run)")
    args = parser.parse_args()
    cfg = load_config(args.config) if args.config else VTAConfig()
    compiled = compile_model("resnet18", cfg)
    steps = [s for s in compiled.steps if isinstance(s, AccelStep)]
    t0 = time.perf_counter()
    estimates = {s.node.name: estimate(s.program) for s in steps}
    model_s = time.perf_counter() - t0
    uops = sum(s.gemm_uops + s.alu_uops for s in steps)
    print(f"model: {len(steps)} accelerator layers, {uops:,} micro-ops estimated in {model_s * 1e3:.1f} ms")
    if args.no_tsim:
        return
    t0 = time.perf_counter()
    out = run(compiled, random_inputs(compiled.graph, 0), target="tsim")
    tsim_s = time.perf_counter() - t0
    accel_s = sum(layer.seconds for layer in out.layers if layer.where == "accel")
    print(f"{'layer':10s} {'tsim':>9s} {'model':>9s} {'error':>8s}  bound")
    total_t = total_m = 0
    worst = 0.0
    for layer in out.layers:
        if layer.where != "accel" or layer.cycles is None:
            continue
        est = estimates[layer.layer]
        err = (est.cycles - layer.cycles) / layer.cycles * 100
        worst = max(worst, abs(err))
        total_t += layer.cycles
        total_m += est.cycles
        print(f"{layer.layer:10s} {layer.cycles:9d} {est.cycles:9d} {err:7.2f}%  {est.bound} "
              f"({est.utilization(est.bound) * 100:.0f}%)")
    print(f"{'total':10s} {total_t:9d} {total_m:9d} {(total_m - total_t) / total_t * 100:7.2f}%  worst layer "
          f"{worst:.2f}%")
    print(f"model {model_s:.3f} s for the network; tsim {accel_s:.1f} s on the accelerator layers ({tsim_s:.1f} s "
          f"wall for the whole run)")


if __name__ == "__main__":
    main()
