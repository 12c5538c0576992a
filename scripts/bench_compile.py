"""Benchmark: compile time of a model, its fsim run time, and ONNX Runtime's float run time of the same model.

Usage::

    python3 scripts/bench_compile.py [--model resnet18] [--config FILE] [--target fsim] [--repeat 3]

    python3 scripts/bench_compile.py --lstm-steps 32 128   # how the times grow with the graph's size

Prints one table (seconds) and, with ``--json FILE``, writes the same figures. Times are wall clock on this machine:
``frontend`` is ONNX import + quantization (calibration on 4 random samples), ``compile`` is partitioning + tiling +
code generation of every accelerator layer, ``run`` is the whole quantized model on the target (simulation time, not
accelerator time), ``onnxruntime`` is the float model on ONNX Runtime's CPU provider (best of ``--repeat``).

``--lstm-steps`` measures a model of every given sequence length instead: 8 stacked ONNX LSTMs (32 features, seeded
weights), which the frontend unrolls into about 145 layers per step (18,480 at 128 steps). It prints one row per
length and the ratio of each figure to the first row's, beside the ratio of the layer counts: equal ratios mean the
time grows linearly with the graph's size.
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


def _lstm_file(steps: int, path: str, layers: int = 8, width: int = 32) -> str:
    """Write ``layers`` stacked ONNX LSTMs over ``steps`` time steps (batch 1, ``width`` features and hidden units,
    seeded weights) to ``path``; returns it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [numpy_helper.from_array(np.array([1], np.int64), "axis1")], "x"
    for k in range(layers):
        for name, shape, std in ((f"W{k}", (1, 4 * width, width), 0.2), (f"R{k}", (1, 4 * width, width), 0.2),
                                 (f"B{k}", (1, 8 * width), 0.1)):
            inits.append(numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name))
        nodes += [helper.make_node("LSTM", [x, f"W{k}", f"R{k}", f"B{k}"], [f"y{k}"], hidden_size=width),
                  helper.make_node("Squeeze", [f"y{k}", "axis1"], [f"h{k}"])]
        x = f"h{k}"
    graph = helper.make_graph(nodes, f"lstm{layers}x{steps}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [steps, 1, width])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _measure(path: str, cfg, target: str, policy: str, repeat: int) -> dict:
    """The figures of one model file (see the module docstring)."""
    from vta.compiler import qops
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import compile_graph, load_graph, random_inputs
    from vta.compiler.runtime.executor import run

    start = time.perf_counter()
    graph = load_graph(path)
    qgraph = quantize(graph, random_inputs(graph, 1, 4))
    frontend = time.perf_counter() - start
    start = time.perf_counter()
    compiled = compile_graph(qgraph, cfg, policy=policy)
    compile_s = time.perf_counter() - start
    inputs = random_inputs(graph, 0)
    start = time.perf_counter()
    out = run(compiled, inputs, target=target)
    run_s = time.perf_counter() - start
    exact = all(np.array_equal(v, out.outputs[k]) for k, v in qops.run_reference(qgraph, inputs).items())
    ort_s = _onnxruntime_seconds(path, inputs, repeat)
    return {"config": cfg.name, "target": target, "accel_layers": compiled.accel_steps, "layers": len(compiled.steps),
            "frontend_s": round(frontend, 3), "compile_s": round(compile_s, 3), f"{target}_run_s": round(run_s, 3),
            "onnxruntime_float_s": None if ort_s is None else round(ort_s, 4), "bit_exact": exact,
            "gemm_uops": sum(layer.gemm_uops for layer in out.layers),
            "alu_uops": sum(layer.alu_uops for layer in out.layers)}


def _scaling(steps: list[int], cfg, target: str, policy: str, repeat: int) -> list[dict]:
    """:func:`_measure` of :func:`_lstm_file` at each length, printed as a table with ratios to the first row."""
    import tempfile

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in steps:
            rows.append({"steps": n, **_measure(_lstm_file(n, f"{tmp}/lstm{n}.onnx"), cfg, target, policy, repeat)})
    keys = ["layers", "frontend_s", "compile_s", f"{target}_run_s", "onnxruntime_float_s"]
    print(f"{'steps':>6} " + " ".join(f"{k:>20}" for k in keys) + "  bit_exact")
    for row in rows:
        cells = []
        for k in keys:
            first, value = rows[0][k], row[k]
            ratio = f" ({value / first:.1f}x)" if value is not None and first else ""
            cells.append(f"{'-' if value is None else value}{ratio}".rjust(20))
        print(f"{row['steps']:>6} " + " ".join(cells) + f"  {row['bit_exact']}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", help="zoo name or .onnx path (default: resnet18)")
    parser.add_argument("--config", default=None, help="config file (default: VTA's defaults)")
    parser.add_argument("--target", default="fsim", choices=("fsim", "tsim", "cpu"), help="run target")
    parser.add_argument("--policy", default="auto", choices=("auto", "accel", "cpu"))
    parser.add_argument("--repeat", type=int, default=3, help="ONNX Runtime repetitions (best is reported)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--lstm-steps", type=int, nargs="+", metavar="N",
                        help="measure stacked LSTMs of these sequence lengths instead of --model")
    args = parser.parse_args(argv)

    from vta.compiler.frontend import zoo
    from vta.config import VTAConfig, load_config

    cfg = load_config(args.config) if args.config else VTAConfig()
    if args.lstm_steps:
        rows = _scaling(args.lstm_steps, cfg, args.target, args.policy, args.repeat)
        if args.json:
            atomic_write_text(args.json, json.dumps(rows, indent=2))
            print(f"wrote {args.json}")
        return 0 if all(row["bit_exact"] for row in rows) else 1
    path = str(zoo.get_model(args.model)) if args.model in zoo.list_models() else args.model
    figures = {"model": args.model, **_measure(path, cfg, args.target, args.policy, args.repeat)}
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        atomic_write_text(args.json, json.dumps(figures, indent=2))
        print(f"wrote {args.json}")
    return 0 if figures["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
