"""The integer Softmax (``QISoftmax``) on the tensor ALU with the lane_reduce knob against today's float
``QSoftmax`` on the CPU, per softmax node.

Usage: python scripts/bench_softmax.py [--model bert_tiny|bert_block] [--no-tsim] [--json FILE]

For each softmax of the model (``bert_tiny`` from the zoo, or ``bert_block``: the BERT-base block of
``scripts/bench_attention.py``), quantized as ``scripts/bench_gelu.py`` does, on ``configs/lane_reduce.toml``: a
softmax with a fused mask (bias, keep/fill) has no integer form and is listed with the reason. For the others:

* the integer Softmax's error against float softmax of the same int8 input (unrounded, clipped to int8's range), in
  output steps, on the node's own input for a seeded random model input, beside the float ``QSoftmax``'s (which
  rounds: at most 0.5 step), and the largest intermediate's bit length (below 31);
* the ALU layer's cycles by the cycle model and, unless ``--no-tsim``, by tsim on that input (checked bit-exact
  against :func:`vta.compiler.qops.isoftmax`), and the time at the design's clock;
* the CPU time: the median of 20 runs of the CPU backend's float ``QSoftmax`` and of the integer node, and the
  partitioner's estimates and choice (``--softmax auto``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def softmax_rows(model: str, tsim: bool) -> list[dict[str, Any]]:
    """One row of figures per softmax node of ``model`` (see the module docstring)."""
    from bench_gelu import _median_us, _quantized  # type: ignore[import-not-found]

    from vta.backend import get_backend
    from vta.compiler import qops
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.layout import OUTPUT, pack_activation, unpack_activation
    from vta.compiler.lowering.softmax import SoftmaxLayer, build_softmax_program, integer_softmax, softmax_refusal
    from vta.compiler.pipeline import choose_softmax, random_inputs
    from vta.config import load_config
    from vta.cost import estimate
    cfg = load_config(ROOT / "configs" / "lane_reduce.toml")
    intr = intrinsics(cfg)
    qgraph = _quantized(model)
    igraph, originals = integer_softmax(qgraph)
    _, decisions, _ = choose_softmax(qgraph, intr, "auto")
    values = qops.run_reference(qgraph, random_inputs(qgraph, seed=3), keep_all=True)
    cpu = get_backend("cpu")
    rows: list[dict[str, Any]] = []
    for float_node in qgraph.nodes:
        if float_node.op != "QSoftmax":
            continue
        name, a = float_node.name, float_node.attrs
        if name not in originals:
            rows.append({"node": name, "refused": softmax_refusal(qgraph, float_node)})
            continue
        node = igraph.node(name)
        xin = values[node.inputs[0]]
        p = {k: node.attrs[k] for k in qops.ISOFTMAX_ATTRS}
        trace = qops.isoftmax_trace(xin, **p)
        z = xin.astype(np.float64) * a["scale"]
        e = np.exp(z - z.max(-1, keepdims=True))
        real = np.clip(e / e.sum(-1, keepdims=True) / a["out_scale"], -128, 127)
        ref = qops.qsoftmax(xin, a["scale"], a["out_scale"], -1)
        layer = SoftmaxLayer.from_attrs(xin.shape, node.attrs)
        view = layer.shape
        program, code = build_softmax_program(cfg, layer, pack_activation(xin.reshape(view), batch=intr.batch,
                                                                          block=intr.block_in))
        row: dict[str, Any] = {
            "node": name, "shape": list(xin.shape), "in_scale": a["scale"], "out_scale": a["out_scale"],
            "alu_uops": code.alu_uops,
            "max_intermediate_bits": max(int(np.abs(v).max()) for v in trace.values()).bit_length(),
            "int_err_steps_max": float(np.abs(trace["out"] - real).max()),
            "int_err_steps_mean": float(np.abs(trace["out"] - real).mean()),
            "float_err_steps_max": float(np.abs(ref - real).max()),
            "predicted_cycles": estimate(program).cycles,
            "placement_auto": decisions[name].target, "op_auto": decisions[name].op, "reason": decisions[name].reason,
            "estimate_accel_us": decisions[name].accel_us, "estimate_cpu_us": decisions[name].cpu_us,
        }
        inputs = {node.inputs[0]: xin}
        row["cpu_float_us"] = _median_us(lambda: cpu.run_node(qgraph, float_node, inputs))  # noqa: B023
        row["cpu_int_us"] = _median_us(lambda: cpu.run_node(igraph, node, inputs))  # noqa: B023
        if tsim:
            result = get_backend("tsim").run(program)
            got = unpack_activation(program.read(OUTPUT, result.dram), view).reshape(xin.shape)
            row["tsim_cycles"] = result.cycles
            row["tsim_exact"] = bool(np.array_equal(got, trace["out"]))
        row["accel_us_at_clock"] = row.get("tsim_cycles", row["predicted_cycles"]) / cfg.clock_mhz
        rows.append(row)
    return rows


def main() -> None:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("bert_tiny", "bert_block"), default="bert_tiny")
    ap.add_argument("--no-tsim", action="store_true", help="the cycle model only")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args()
    rows = softmax_rows(args.model, not args.no_tsim)
    print("| Softmax | shape | scales in -> out | integer error max / mean (steps) | float max | ALU micro-ops "
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


if __name__ == "__main__":
    main()
