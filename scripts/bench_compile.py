"""Benchmark: compile time of a model, its fsim run time, and ONNX Runtime's float run time of the same model.

Usage::

    python3 scripts/bench_compile.py [--model resnet18] [--config FILE] [--target fsim] [--repeat 3]

Prints one table (seconds) and, with ``--json FILE``, writes the same figures. Times are wall clock on this machine:
``frontend`` is ONNX import + quantization (calibration on 4 random samples), ``compile`` is partitioning + tiling +
code generation of every accelerator layer, ``run`` is the whole quantized model on the target (simulation time, not
accelerator time), ``onnxruntime`` is the float model on ONNX Runtime's CPU provider (best of ``--repeat``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from vta.fileio import atomic_write_text


def _onnxruntime_seconds(path: str, inputs: dict[str, np.ndarray], repeat: int) -> float | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[name] for i, name in zip(session.get_inputs(), inputs)}
    session.run(None, feed)  # warm-up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, feed)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", help="zoo name or .onnx path (default: resnet18)")
    parser.add_argument("--config", default=None, help="config file (default: VTA's defaults)")
    parser.add_argument("--target", default="fsim", choices=("fsim", "tsim", "cpu"), help="run target")
    parser.add_argument("--policy", default="auto", choices=("auto", "accel", "cpu"))
    parser.add_argument("--repeat", type=int, default=3, help="ONNX Runtime repetitions (best is reported)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    from vta.compiler import qops
    from vta.compiler.frontend import zoo
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import compile_graph, load_graph, random_inputs
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig, load_config

    cfg = load_config(args.config) if args.config else VTAConfig()
    path = str(zoo.get_model(args.model)) if args.model in zoo.list_models() else args.model
    start = time.perf_counter()
    graph = load_graph(path)
    qgraph = quantize(graph, random_inputs(graph, 1, 4))
    frontend = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compile_graph(qgraph, cfg, policy=args.policy)
    compile_s = time.perf_counter() - start
    inputs = random_inputs(graph, 0)
    start = time.perf_counter()
    out = run(compiled, inputs, target=args.target)
    run_s = time.perf_counter() - start
    exact = all(np.array_equal(v, out.outputs[k]) for k, v in qops.run_reference(qgraph, inputs).items())
    ort_s = _onnxruntime_seconds(path, inputs, args.repeat)
    figures = {"model": args.model, "config": cfg.name, "target": args.target,
               "accel_layers": compiled.accel_steps, "layers": len(compiled.steps),
               "frontend_s": round(frontend, 3), "compile_s": round(compile_s, 3),
               f"{args.target}_run_s": round(run_s, 3),
               "onnxruntime_float_s": None if ort_s is None else round(ort_s, 4), "bit_exact": exact,
               "gemm_uops": sum(layer.gemm_uops for layer in out.layers),
               "alu_uops": sum(layer.alu_uops for layer in out.layers)}
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        atomic_write_text(args.json, json.dumps(figures, indent=2))
        print(f"wrote {args.json}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
