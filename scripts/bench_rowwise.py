"""What ``scripts/bench_layernorm.py`` and ``scripts/bench_softmax.py`` share: one row of figures for an integer
ALU-only node (on ``configs/lane_reduce.toml``) against its float form on the CPU, the table that prints the rows,
and the command line. Each script supplies its op's node rewrite, trace and float reference."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np


def measure(*, cfg: Any, program: Any, code: Any, trace: dict[str, np.ndarray], real: np.ndarray,
            ref: np.ndarray, xin: np.ndarray, view: tuple[int, ...], qgraph: Any, igraph: Any, float_node: Any,
            node: Any, decision: Any, tsim: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row: the node's scales (and ``extra`` fields after them), the ALU micro-ops, the largest intermediate's
    bit length, the integer (``trace["out"]``) and float (``ref``) errors in output steps against ``real`` (the
    unrounded float result, clipped to int8), the cycle model's cycles of ``program`` and, with ``tsim``, tsim's
    (checked bit-exact against the trace), the partitioner's decision and estimates, the CPU backend's median times
    of the float node and the integer node, and the time at the config's clock."""
    from bench_gelu import _median_us  # type: ignore[import-not-found]

    from vta.backend import get_backend
    from vta.compiler.lowering.layout import OUTPUT, unpack_activation
    from vta.cost import estimate
    a = float_node.attrs
    row: dict[str, Any] = {
        "node": node.name, "shape": list(xin.shape), "in_scale": a["scale"], "out_scale": a["out_scale"],
        **(extra or {}), "alu_uops": code.alu_uops,
        "max_intermediate_bits": max(int(np.abs(v).max()) for v in trace.values()).bit_length(),
        "int_err_steps_max": float(np.abs(trace["out"] - real).max()),
        "int_err_steps_mean": float(np.abs(trace["out"] - real).mean()),
        "float_err_steps_max": float(np.abs(ref - real).max()),
        "predicted_cycles": estimate(program).cycles,
        "placement_auto": decision.target, "op_auto": decision.op, "reason": decision.reason,
        "estimate_accel_us": decision.accel_us, "estimate_cpu_us": decision.cpu_us,
    }
    cpu = get_backend("cpu")
    inputs = {node.inputs[0]: xin}
    row["cpu_float_us"] = _median_us(lambda: cpu.run_node(qgraph, float_node, inputs))
    row["cpu_int_us"] = _median_us(lambda: cpu.run_node(igraph, node, inputs))
    if tsim:
        result = get_backend("tsim").run(program)
        got = unpack_activation(program.read(OUTPUT, result.dram), view).reshape(xin.shape)
        row["tsim_cycles"] = result.cycles
        row["tsim_exact"] = bool(np.array_equal(got, trace["out"]))
    row["accel_us_at_clock"] = row.get("tsim_cycles", row["predicted_cycles"]) / cfg.clock_mhz
    return row


def main(label: str, rows_of: Callable[[str, bool], list[dict[str, Any]]], description: str) -> None:
    """The command line (``--model``, ``--no-tsim``, ``--json``) and the table of ``rows_of(model, tsim)``, its first
    column headed ``label``; a row with ``refused`` prints the reason alone."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", choices=("bert_tiny", "bert_block"), default="bert_tiny")
    ap.add_argument("--no-tsim", action="store_true", help="the cycle model only")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = rows_of(args.model, not args.no_tsim)
    print(f"| {label} | shape | scales in -> out | integer error max / mean (steps) | float max | ALU micro-ops "
          "| tsim cycles | predicted | time at clock | CPU float | CPU integer | estimate accel vs CPU: choice |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "refused" in r:
            print(f"| `{r['node']}` | refused: {r['refused']} |")
            continue
        tsim = f"{r['tsim_cycles']:,}{'' if r['tsim_exact'] else ' (NOT exact)'}" if "tsim_cycles" in r else "-"
        err = 100.0 * (r["predicted_cycles"] / r["tsim_cycles"] - 1) if "tsim_cycles" in r else None
        pred = f"{r['predicted_cycles']:,}" + (f" ({err:+.1f}%)" if err is not None else "")
        print(f"| `{r['node']}` | {r['shape']} | {r['in_scale']:.4g} -> {r['out_scale']:.4g} | "
              f"{r['int_err_steps_max']:.2f} / {r['int_err_steps_mean']:.3f} | {r['float_err_steps_max']:.2f} | "
              f"{r['alu_uops']:,} | {tsim} | {pred} | {r['accel_us_at_clock']:.0f} us | {r['cpu_float_us']:.1f} us "
              f"| {r['cpu_int_us']:.1f} us | {r['estimate_accel_us']:.0f} us vs {r['estimate_cpu_us']:.0f} us: "
              f"{r['placement_auto']} ({r['op_auto']}) |")
        print(f"  max intermediate {r['max_intermediate_bits']} bits; reason: {r['reason']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float))
