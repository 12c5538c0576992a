"""ResNet-18 (224x224, batch 1) on the default design: per-layer cycles, utilization and the schedule search's
choices, against the targets of the issue "codesign for speed".

Usage: python scripts/bench_resnet18.py [--model-only] [--no-resnet50] [--config FILE]

Compiles ResNet-18 (the schedule search picks each conv/dense tiling by the cycle model; results cached under the
cache folder), runs it on tsim (per-layer cycles from the core's counters; ~2 min) unless ``--model-only`` (the cycle
model's predictions only, a few seconds), and prints per accelerator layer: cycles, GEMM utilization, predicted
cycles and error, the bounding module and the schedule. Then the totals: convolutions including the first (target
<= 7,800,000 cycles), convolutions after the first (target <= 7,200,000), residual adds apart, the median per-layer
GEMM utilization of the convolutions, every 1x1 convolution's utilization, and ResNet-50's overall utilization by
the cycle model.
"""
from __future__ import annotations

import argparse
import statistics
import time

from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.runtime import AccelStep, Compiled, run
from vta.config import VTAConfig, load_config

TARGET_CONVS = 7_800_000
TARGET_AFTER_FIRST = 7_200_000


def _kernel(compiled: Compiled, step: AccelStep) -> tuple[int, int]:
    """(KH, KW) of a convolution step's weights (1x1 for dense layers)."""
    shape = compiled.graph.shape(step.node.inputs[1])
    return (int(shape[2]), int(shape[3])) if len(shape) == 4 else (1, 1)


def _layer_cycles(compiled: Compiled, model_only: bool) -> dict[str, int]:
    """Accelerator layer name -> cycles: tsim's counters, or the cycle model's prediction with ``model_only``."""
    steps = [s for s in compiled.steps if isinstance(s, AccelStep)]
    if model_only:
        return {s.node.name: s.predicted_cycles for s in steps}
    out = run(compiled, random_inputs(compiled.graph, 0), target="tsim")
    return {layer.layer: int(layer.cycles) for layer in out.layers if layer.where == "accel" and layer.cycles}


def _utilization(step: AccelStep, cycles: int, macs_per_cycle: int) -> float:
    return step.macs / (cycles * macs_per_cycle) if cycles else 0.0


def report_resnet18(cfg: VTAConfig, model_only: bool) -> None:
    t0 = time.perf_counter()
    compiled = compile_model("resnet18", cfg)
    print(f"compiled resnet18 in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    cycles = _layer_cycles(compiled, model_only)
    source = "model" if model_only else "tsim"
    print(f"{source} in {time.perf_counter() - t0:.1f} s")
    print(f"{'layer':10s} {'kernel':>6s} {source:>9s} {'util':>5s} {'model':>9s} {'error':>7s} {'bound':8s} schedule")
    convs: list[tuple[AccelStep, int]] = []
    adds = 0
    for step in compiled.steps:
        if not isinstance(step, AccelStep) or step.node.name not in cycles:
            continue
        c = cycles[step.node.name]
        err = (step.predicted_cycles - c) / c * 100 if c else 0.0
        util = _utilization(step, c, cfg.macs_per_cycle)
        kh, kw = _kernel(compiled, step) if step.macs else (0, 0)
        print(f"{step.node.name:10s} {f'{kh}x{kw}' if step.macs else '':>6s} {c:9,d} {util * 100:4.0f}% "
              f"{step.predicted_cycles:9,d} {err:6.2f}% {step.schedule.get('bound', ''):8s} {step.tiling}")
        if step.node.op == "QConv2d":
            convs.append((step, c))
        elif step.macs == 0:
            adds += c
    conv_total = sum(c for _, c in convs)
    after_first = sum(c for _, c in convs[1:])
    print(f"convolutions incl. the first ({len(convs)}): {conv_total:,} cycles (target <= {TARGET_CONVS:,}: "
          f"{'met' if conv_total <= TARGET_CONVS else 'missed'})")
    print(f"convolutions after the first: {after_first:,} cycles (target <= {TARGET_AFTER_FIRST:,}: "
          f"{'met' if after_first <= TARGET_AFTER_FIRST else 'missed'})")
    first, first_cycles = convs[0]
    print(f"first convolution: {first_cycles:,} cycles, {_utilization(first, first_cycles, cfg.macs_per_cycle):.0%}")
    print(f"residual adds: {adds:,} cycles")
    utils = [_utilization(s, c, cfg.macs_per_cycle) for s, c in convs]
    print(f"median per-layer GEMM utilization of the convolutions: {statistics.median(utils):.1%}")
    ones = [(s.node.name, _utilization(s, c, cfg.macs_per_cycle)) for s, c in convs if _kernel(compiled, s) == (1, 1)]
    print("1x1 convolutions: " + ", ".join(f"{name} {u:.1%}" for name, u in ones))


def report_resnet50(cfg: VTAConfig) -> None:
    t0 = time.perf_counter()
    compiled = compile_model("resnet50", cfg)
    steps = [s for s in compiled.steps if isinstance(s, AccelStep)]
    cycles = sum(s.predicted_cycles for s in steps)
    macs = sum(s.macs for s in steps)
    print(f"resnet50 (cycle model, compiled in {time.perf_counter() - t0:.1f} s): {cycles:,} accelerator cycles, "
          f"overall GEMM utilization {macs / (cycles * cfg.macs_per_cycle):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="VTA config file (default: VTA's default design)")
    parser.add_argument("--model-only", action="store_true", help="the cycle model's predictions only (no tsim)")
    parser.add_argument("--no-resnet50", action="store_true", help="skip ResNet-50")
    args = parser.parse_args()
    cfg = load_config(args.config) if args.config else VTAConfig()
    report_resnet18(cfg, args.model_only)
    if not args.no_resnet50:
        report_resnet50(cfg)


if __name__ == "__main__":
    main()
