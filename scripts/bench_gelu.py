"""The integer GELU (I-BERT, ``QGelu``) on the tensor ALU against the float table on the CPU, per Gelu node.

Usage: python scripts/bench_gelu.py [--model bert_tiny|bert_block] [--no-tsim] [--json FILE] [--block-error]

For each Gelu of the model (``bert_tiny`` from the zoo, or ``bert_block``: the BERT-base block of
``scripts/bench_attention.py``, sequence 128, MLP 3072), quantized as the pipeline does (``bert_tiny``: 4 seeded random
calibration samples, as ``vta run``; ``bert_block``: 2, as bench_attention), prints:

* the integer GELU's constants (:func:`vta.compiler.qops.igelu_params`), its ALU steps, and the largest magnitude of
  any intermediate over all 256 int8 inputs (must stay below 2**31);
* its error against float GELU (``x/2 * (1 + erf(x/sqrt 2))``, clipped to the output's int8 range) over all 256
  inputs, in output steps, beside the float table's (which rounds the float value: at most 0.5 step);
* the ALU layer's cycles by the cycle model and, unless ``--no-tsim``, by tsim on random int8 inputs (checked
  bit-exact against :func:`vta.compiler.qops.igelu`), and the time at the design's clock;
* the CPU time it replaces: the median of 20 runs of the CPU backend's table lookup (``QLut``) and of the integer
  GELU on the CPU, plus the partitioner's estimates (accelerator with its layout conversions, and CPU).

``--block-error`` also prints the BERT-base block's output error against float with each GELU (:func:`block_error`).
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

import numpy as np

from vta.config import VTAConfig


def _quantized(model: str) -> Any:
    """The quantized graph of ``model`` as the pipeline (``bert_tiny``) or bench_attention (``bert_block``) makes it."""
    from vta.compiler.frontend.quantize import quantize
    if model == "bert_block":
        from bench_attention import bert_block  # type: ignore[import-not-found]

        from vta.compiler.frontend.onnx_frontend import import_onnx
        rng = np.random.default_rng(0)
        return quantize(import_onnx(bert_block()), {"input": rng.standard_normal((2, 128, 768)).astype(np.float32)})
    from vta.compiler.options import CompileOptions
    from vta.compiler.pipeline import calibration_set, load_graph
    graph = load_graph(model)
    return quantize(graph, calibration_set(model, graph, CompileOptions()).inputs)


def _median_us(call: Any, repeats: int = 20) -> float:
    """The median host time of ``call()`` over ``repeats`` runs, in microseconds (bench_attention's measure)."""
    from bench_attention import _median_us as median_us  # type: ignore[import-not-found]
    return float(median_us(call, repeats))


def gelu_rows(model: str, cfg: VTAConfig, tsim: bool) -> list[dict[str, Any]]:
    """One row of figures per Gelu node of ``model`` (see the module docstring)."""
    from vta.backend import get_backend
    from vta.compiler import qops
    from vta.compiler.lowering.gelu import build_gelu_program, gelu_passes, integer_gelu
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.layout import OUTPUT, pack_activation, unpack_activation
    from vta.compiler.pipeline import partition_graph
    from vta.cost import estimate
    qgraph = _quantized(model)
    igraph, tables = integer_gelu(qgraph)
    intr = intrinsics(cfg)
    decisions, lowered = partition_graph(igraph, intr, policy="auto")
    cpu = get_backend("cpu")
    rows = []
    q = np.arange(-128, 128, dtype=np.int8)
    for name, table_node in tables.items():
        node = igraph.node(name)
        s_in = qgraph.tensors[node.inputs[0]].scale
        s_out = qgraph.tensors[node.outputs[0]].scale
        p = {k: int(node.attrs[k]) for k in qops.IGELU_ATTRS}
        trace = qops.igelu_trace(q, **p)
        x = q.astype(np.float64) * s_in
        real = 0.5 * x * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
        real = np.clip(real / s_out, -128, 127)
        layer = lowered[name].layer if name in lowered else None
        from vta.compiler.lowering.gelu import GeluLayer
        layer = layer if isinstance(layer, GeluLayer) else GeluLayer.from_attrs(igraph.shape(node.inputs[0]), p)
        program, code = build_gelu_program(cfg, layer)
        row: dict[str, Any] = {
            "node": name, "shape": list(igraph.shape(node.inputs[0])), "in_scale": s_in, "out_scale": s_out,
            "params": p, "alu_steps": len(gelu_passes(layer)), "alu_uops": code.alu_uops,
            "max_intermediate_bits": max(int(np.abs(v).max()) for v in trace.values()).bit_length(),
            "int_err_steps_max": float(np.abs(trace["y"] - real).max()),
            "int_err_steps_mean": float(np.abs(trace["y"] - real).mean()),
            "table_err_steps_max": float(np.abs(table_node.attrs["table"].astype(np.float64) - real).max()),
            "predicted_cycles": estimate(program).cycles,
            "placement_auto": decisions[name].target, "reason": decisions[name].reason,
            "estimate_accel_us": decisions[name].accel_us, "estimate_cpu_us": decisions[name].cpu_us,
        }
        rng = np.random.default_rng(3)
        xin = rng.integers(-128, 128, igraph.shape(node.inputs[0]), dtype=np.int8)
        values = {node.inputs[0]: xin}
        row["cpu_table_us"] = _median_us(lambda: cpu.run_node(qgraph, table_node, values))  # noqa: B023
        row["cpu_int_us"] = _median_us(lambda: cpu.run_node(igraph, node, values))  # noqa: B023
        if tsim:
            view = layer.shape
            bound = program.with_data({"x": pack_activation(xin.reshape(view), batch=intr.batch,
                                                            block=intr.block_in)})
            result = get_backend("tsim").run(bound)
            got = unpack_activation(bound.read(OUTPUT, result.dram), view).reshape(xin.shape)
            row["tsim_cycles"] = result.cycles
            row["tsim_exact"] = bool(np.array_equal(got, qops.igelu(xin, **p)))
        cycles = row.get("tsim_cycles", row["predicted_cycles"])
        row["accel_us_at_clock"] = cycles / cfg.clock_mhz
        rows.append(row)
    return rows


def block_error(samples: int = 2) -> dict[str, dict[str, Any]]:
    """The BERT-base block's output against float (onnxruntime on :func:`bench_attention.bert_block`) with the integer
    GELU and with the table, on ``samples`` seeded random inputs (seed 5), both run on the CPU target (the integer
    reference's bits: the same outputs fsim and tsim give); :func:`vta.compiler.frontend.quantize.accuracy_vs_float`'s
    figures per mode."""
    from bench_attention import bert_block

    from vta.compiler.frontend.onnx_frontend import import_onnx
    from vta.compiler.frontend.quantize import accuracy_vs_float, float_outputs, output_scale
    from vta.compiler.pipeline import compile_graph
    from vta.compiler.runtime.executor import run
    model = bert_block()
    qgraph = _quantized("bert_block")
    fgraph = import_onnx(model)
    rng = np.random.default_rng(5)
    xs = [{"input": rng.standard_normal((1, 128, 768)).astype(np.float32)} for _ in range(samples)]
    refs = [float_outputs(model, fgraph, x)[0]["output"] for x in xs]
    out = {}
    for mode in ("int", "table"):
        compiled = compile_graph(qgraph, VTAConfig(), policy="cpu", gelu=mode)
        got = np.concatenate([run(compiled, x, target="cpu").outputs["output"] for x in xs])
        out[mode] = accuracy_vs_float(np.concatenate(refs), got, output_scale(compiled.graph, "output"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("bert_tiny", "bert_block"), default="bert_tiny")
    parser.add_argument("--no-tsim", action="store_true", help="the cycle model only (no tsim run)")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--block-error", action="store_true",
                        help="also the BERT-base block's output error against float, integer GELU vs table")
    args = parser.parse_args()
    cfg = VTAConfig()
    if args.block_error:
        for mode, fig in block_error().items():
            print(f"block output vs float (onnxruntime), gelu={mode}: max {fig['max_abs_error_lsb']:.1f} LSB, mean "
                  f"{fig['mean_abs_error_lsb']:.2f} LSB, max {fig['max_error_pct_of_range']:.2f}% of range, "
                  f"cosine {fig['cosine']:.6f}")
    rows = gelu_rows(args.model, cfg, not args.no_tsim)
    for r in rows:
        print(f"{r['node']} {r['shape']}: scales {r['in_scale']:.5f} -> {r['out_scale']:.5f}; constants {r['params']}")
        print(f"  {r['alu_steps']} ALU steps, {r['alu_uops']:,} ALU micro-ops; largest intermediate < 2**"
              f"{r['max_intermediate_bits']}")
        print(f"  error against float GELU over all 256 inputs: integer max {r['int_err_steps_max']:.2f} steps "
              f"(mean {r['int_err_steps_mean']:.3f}); table max {r['table_err_steps_max']:.2f}")
        tsim = f"tsim {r['tsim_cycles']:,} (bit-exact {r['tsim_exact']}), " if "tsim_cycles" in r else ""
        print(f"  cycles: {tsim}predicted {r['predicted_cycles']:,}; {r['accel_us_at_clock']:.1f} us at "
              f"{cfg.clock_mhz} MHz")
        print(f"  CPU (median of 20): table {r['cpu_table_us']:.1f} us, integer {r['cpu_int_us']:.1f} us; "
              f"partitioner: {r['placement_auto']} ({r['reason']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
