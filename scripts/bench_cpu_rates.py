"""The partitioner's CPU estimates against the CPU backend's measured time, per operator kind.

Usage: python scripts/bench_cpu_rates.py [--models bert_block,bert_tiny,vit_digits] [--repeats N] [--json FILE]

The partitioner (:mod:`vta.compiler.lowering.partition`) estimates a node's CPU time as ``MACs / CPU_MACS_PER_US +
elements / rate``, where the rate is the node's operator's entry of ``CPU_ELEMS_PER_US_BY_OP`` or else
``CPU_ELEMS_PER_US``. For each quantized node of each model, this script times the CPU backend's kernel on the
node's own inputs (the integer reference's values for a seeded input; the median of ``--repeats`` runs, after one
warm-up run that also compiles the kernel) and prints, per operator kind: the nodes, their elements and MACs, the
measured time, the estimate, and their ratio (measured / estimate: above 1, the estimate is too low). It also prints
the per-element rate each kind without MACs measured (elements per microsecond over all its nodes), the figure
``CPU_ELEMS_PER_US_BY_OP`` holds for the kinds it lists. ``bert_block`` is ``scripts/bench_attention.py``'s
BERT-base block (sequence 128, width 768); ``bert_block`` with the integer LayerNorm, Softmax and Gelu nodes
(``QILayerNorm``, ``QISoftmax``, ``QGelu``) as the ``int`` modes make them is measured as ``bert_block_int``. About
30 s on the 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _graphs(models: list[str]) -> dict[str, Any]:
    """The quantized graph of each model name (``bert_block_int``: the block with the integer row-wise nodes)."""
    from bench_gelu import _quantized  # type: ignore[import-not-found]

    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.pipeline import choose_softmax
    from vta.config import load_config
    out = {}
    for model in models:
        if model == "bert_block_int":
            cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "lane_reduce.toml")
            graph, _, _ = choose_softmax(_quantized("bert_block"), intrinsics(cfg), "int", gelu="int",
                                            layernorm="int")
            out[model] = graph
        else:
            out[model] = _quantized(model)
    return out


def measure(graph: Any, repeats: int) -> list[dict[str, Any]]:
    """One row per node of ``graph``: its op, elements, MACs, the CPU backend's median time and the partitioner's
    estimate (both in microseconds)."""
    from vta.backend import get_backend
    from vta.compiler import qops
    from vta.compiler.ir import node_macs
    from vta.compiler.lowering.partition import cpu_estimate_us
    from vta.compiler.pipeline import random_inputs
    cpu = get_backend("cpu")
    values = qops.run_reference(graph, random_inputs(graph, 0), keep_all=True)
    rows = []
    for node in graph.nodes:
        inputs = {name: values[name] for name in node.inputs if name in values}
        cpu.run_node(graph, node, inputs)                   # warm-up: compiles the kernel
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            cpu.run_node(graph, node, inputs)
            times.append((time.perf_counter() - t0) * 1e6)
        rows.append({"node": node.name, "op": node.op, "elements": sum(graph.tensors[o].size for o in node.outputs),
                     "macs": node_macs(graph, node), "measured_us": statistics.median(times),
                     "estimate_us": cpu_estimate_us(graph, node)})
    return rows


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per operator kind: nodes, elements, MACs, measured and estimated microseconds (sums), their ratio, and (for
    kinds without MACs) the measured elements per microsecond over all its nodes."""
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_op[row["op"]].append(row)
    out = []
    for op, items in sorted(by_op.items(), key=lambda kv: -sum(r["measured_us"] for r in kv[1])):
        measured, est = sum(r["measured_us"] for r in items), sum(r["estimate_us"] for r in items)
        elements = sum(r["elements"] for r in items)
        macs = sum(r["macs"] for r in items)
        out.append({"op": op, "nodes": len(items), "elements": elements, "macs": macs, "measured_us": measured,
                    "estimate_us": est, "ratio": measured / est if est else float("nan"),
                    "elems_per_us": elements / measured if not macs and measured > 0 else None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="bert_block,bert_block_int,bert_tiny,vit_digits",
                        help="comma-separated: bert_block, bert_block_int, or zoo models (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per node (default: %(default)s)")
    parser.add_argument("--json", help="also write the rows and the summary to this JSON file")
    args = parser.parse_args()
    from vta.compiler.lowering.partition import CPU_ELEMS_PER_US, CPU_ELEMS_PER_US_BY_OP, CPU_MACS_PER_US
    print(f"estimate: MACs / {CPU_MACS_PER_US:g} + elements / rate; rate {CPU_ELEMS_PER_US:g} elements/us, except "
          + ", ".join(f"{op} {r:g}" for op, r in sorted(CPU_ELEMS_PER_US_BY_OP.items())))
    report: dict[str, Any] = {}
    for model, graph in _graphs(args.models.split(",")).items():
        rows = measure(graph, args.repeats)
        table = summary(rows)
        report[model] = {"rows": rows, "summary": table}
        print(f"\n{model}: {len(rows)} nodes on the CPU backend (median of {args.repeats} runs each, this machine)")
        print(f"{'op':<16} {'nodes':>5} {'elements':>12} {'MACs':>14} {'measured us':>12} {'estimate us':>12} "
              f"{'measured/est':>12} {'elements/us':>12}")
        for s in table:
            rate = f"{s['elems_per_us']:,.0f}" if s["elems_per_us"] is not None else "-"
            print(f"{s['op']:<16} {s['nodes']:>5} {s['elements']:>12,} {s['macs']:>14,} {s['measured_us']:>12,.0f} "
                  f"{s['estimate_us']:>12,.0f} {s['ratio']:>12.2f} {rate:>12}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=float))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
