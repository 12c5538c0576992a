"""MAC utilization of one BERT-base-shaped encoder block on the accelerator, per layer, by the cycle model and tsim.

Usage: python scripts/bench_attention.py [--config FILE] [--tokens T] [--width W] [--heads H] [--mlp F] [--no-tsim]
                                         [--requant multiply|shift] [--json FILE]

Builds one post-LN encoder block as ONNX (opset 17, seeded weights; :func:`bert_block`): the QKV projection
(W -> 3W), Q.K^T and P.V over H heads, the output projection (W -> W), the MLP (W -> F -> W, erf Gelu), two residual
Adds and LayerNorms. Quantizes it (2 seeded random samples), compiles it for the config, and prints per accelerator
layer: MACs, micro-ops, the cycle model's cycles and, unless ``--no-tsim``, the cycles tsim measured, the model's
error, and the MAC utilization ``MACs / (cycles * MACs per cycle)`` by each. The defaults are BERT-base's shape at
sequence 128 (T 128, W 768, H 12, F 3072); on the default design the whole block takes about a minute on tsim.
``--requant shift`` quantizes with power-of-two scales (M = 1, the offset start of the linear layers and products,
:mod:`vta.compiler.lowering.requant`); the block's error against the float model is printed either way.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vta.config import VTAConfig, load_config

ROLES = {"qkv": "QKV", "qk": "Q.K^T", "pv": "P.V", "proj": "attention out", "fc1": "MLP in", "fc2": "MLP out"}


def bert_block(*, tokens: int = 128, width: int = 768, heads: int = 12, mlp: int = 3072,
               seed: int = 27) -> onnx.ModelProto:
    """One post-LN BERT encoder block: ``input [1, tokens, width]`` -> ``output [1, tokens, width]`` (float32).
    Linear layers are MatMul by ``[in, out]`` plus an Add of the bias (weights normal with standard deviation
    ``1/sqrt(in)``); nodes are named by role (``qkv``, ``qk``, ``softmax``, ``pv``, ``proj``, ``fc1``, ``fc2``)."""
    rng = np.random.default_rng(seed)
    dh = width // heads
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], name: str, outputs: list[str] | None = None, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, outputs or [name], name=name, **attrs))
        return (outputs or [name])[0]

    def linear(x: str, cin: int, cout: int, name: str) -> str:
        w = (rng.standard_normal((cin, cout)) / np.sqrt(cin)).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.02).astype(np.float32)
        return node("Add", [node("MatMul", [x, const(f"{name}.w", w)], name), const(f"{name}.b", b)], f"{name}.bias")

    def layer_norm(x: str, name: str) -> str:
        gamma = rng.uniform(0.8, 1.2, width).astype(np.float32)
        beta = (rng.standard_normal(width) * 0.05).astype(np.float32)
        return node("LayerNormalization", [x, const(f"{name}.g", gamma), const(f"{name}.b", beta)], name, axis=-1)

    qkv = linear("input", width, 3 * width, "qkv")
    node("Split", [qkv, const("split", np.array([width] * 3, np.int64))], "split", outputs=["q", "k", "v"], axis=-1)
    shape = const("heads", np.array([1, tokens, heads, dh], np.int64))
    q = node("Transpose", [node("Reshape", ["q", shape], "q.heads")], "q.t", perm=[0, 2, 1, 3])
    k = node("Transpose", [node("Reshape", ["k", shape], "k.heads")], "k.t", perm=[0, 2, 3, 1])
    v = node("Transpose", [node("Reshape", ["v", shape], "v.heads")], "v.t", perm=[0, 2, 1, 3])
    scores = node("Div", [node("MatMul", [q, k], "qk"), const("sqrt_dh", np.array(np.sqrt(dh), np.float32))],
                  "scale")
    context = node("MatMul", [node("Softmax", [scores], "softmax", axis=-1), v], "pv")
    merged = node("Reshape", [node("Transpose", [context], "merge.t", perm=[0, 2, 1, 3]),
                              const("merge.shape", np.array([1, tokens, width], np.int64))], "merge")
    x = layer_norm(node("Add", ["input", linear(merged, width, width, "proj")], "residual1"), "ln1")
    h = linear(x, width, mlp, "fc1")
    erf = node("Erf", [node("Div", [h, const("sqrt2", np.array(np.sqrt(2.0), np.float32))], "gelu.div")], "gelu.erf")
    g = node("Mul", [node("Mul", [h, node("Add", [erf, const("one", np.array(1.0, np.float32))], "gelu.add")],
                          "gelu.mul"), const("half", np.array(0.5, np.float32))], "gelu")
    y = layer_norm(node("Add", [x, linear(g, mlp, width, "fc2")], "residual2"), "ln2")
    node("Identity", [y], "output", outputs=["output"])
    graph = helper.make_graph(nodes, "bert_block", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                  [1, tokens, width])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, tokens, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def role_of(name: str) -> str:
    """The block role of a compiled layer's node name (``qkv_conv2d`` -> ``QKV``), or the name itself."""
    for key, role in ROLES.items():
        if name == key or name.startswith(f"{key}_") or name.startswith(f"{key}."):
            return role
    return name


def host_layout_seconds(qgraph: Any, node: Any, cfg: VTAConfig, repeats: int = 20) -> dict[str, float]:
    """Median microseconds of a QMatMul's host layout step on random int8 operands of its shapes: ``pack_a``,
    ``pack_b`` and ``unpack_out`` (:mod:`vta.compiler.lowering.matmul`)."""
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.matmul import matmul_dims, pack_a, pack_b, unpack_out
    intr = intrinsics(cfg)
    dims = matmul_dims(qgraph.shape(node.inputs[0]), qgraph.shape(node.inputs[1]), intr)
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, dims.a_shape, dtype=np.int8)
    b = rng.integers(-128, 128, dims.b_shape, dtype=np.int8)
    y = pack_a(rng.integers(-128, 128, (*dims.batch, dims.m, dims.np_), dtype=np.int8),
               dataclasses.replace(dims, a_shape=(*dims.batch, dims.m, dims.np_), k=dims.np_, kp=dims.np_), intr)
    out = {}
    for name, call in (("pack_a", lambda: pack_a(a, dims, intr)), ("pack_b", lambda: pack_b(b, dims, intr)),
                       ("unpack_out", lambda: unpack_out(y, dims, intr))):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out[name] = float(np.median(times)) * 1e6
    return out


def weight_paths(qgraph: Any, node: Any, cfg: VTAConfig, tsim: bool) -> dict[str, dict[str, Any]]:
    """Both ways a QMatMul's activation ``b`` reaches the weight buffer (:data:`vta.compiler.lowering.matmul.
    WEIGHT_PATHS`): per path, the cycle model's cycles of the searched program, tsim's cycles (when ``tsim``, on
    random int8 operands, checked against :func:`vta.compiler.qops.qmatmul`) and the median microseconds of the host
    packing ``b`` needs (:func:`pack_b`, or :func:`pack_b_image` for the load unit's gather)."""
    from vta.backend import get_backend
    from vta.compiler import qops
    from vta.compiler.lowering.codegen import build_conv_program
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.layout import INPUT, OUTPUT
    from vta.compiler.lowering.matmul import WEIGHT, lower_matmul, matmul_dims, pack_a, pack_b, pack_b_image, unpack_out
    from vta.compiler.lowering.search import search_conv
    from vta.cost import estimate
    intr = intrinsics(cfg)
    dims = matmul_dims(qgraph.shape(node.inputs[0]), qgraph.shape(node.inputs[1]), intr)
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, dims.a_shape, dtype=np.int8)
    b = rng.integers(-128, 128, dims.b_shape, dtype=np.int8)
    out: dict[str, dict[str, Any]] = {}
    for path, packer in (("host", pack_b), ("load", pack_b_image)):
        layer = lower_matmul(qgraph, node, intr, weights=path)
        tiling = search_conv(cfg, layer).tiling
        program, _ = build_conv_program(cfg, layer, tiling=tiling)
        est = estimate(program)
        row: dict[str, Any] = {"predicted_cycles": est.cycles, "bound": est.bound,
                               "load_insns": sum(type(i).__name__ == "Load" for i in program.insns),
                               "pack_b_us": _median_us(lambda: packer(b, dims, intr))}  # noqa: B023 (called here)
        if tsim:
            bound = program.with_data({INPUT: pack_a(a, dims, intr), WEIGHT: packer(b, dims, intr)})
            result = get_backend("tsim").run(bound)
            got = unpack_out(bound.read(OUTPUT, result.dram), dims, intr)
            row["tsim_cycles"] = result.cycles
            row["exact"] = bool(np.array_equal(got, qops.qmatmul(a, b, node.attrs["multiplier"],
                                                                 node.attrs["shift"])))
        out[path] = row
    return out


def _median_us(call: Any, repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="VTA config file (default: VTA's default design)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--mlp", type=int, default=3072)
    parser.add_argument("--no-tsim", action="store_true", help="the cycle model only (no tsim run)")
    parser.add_argument("--requant", choices=("multiply", "shift"), default="multiply",
                        help="the quantizer's requantization (shift: power-of-two scales, M = 1)")
    parser.add_argument("--json", metavar="FILE", help="write the per-layer figures as JSON")
    args = parser.parse_args()

    from vta.compiler import qops
    from vta.compiler.frontend import float_ref
    from vta.compiler.frontend.onnx_frontend import import_onnx
    from vta.compiler.frontend.quantize import accuracy_vs_float, output_scale, quantize
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.pipeline import compile_graph
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run

    cfg = load_config(args.config) if args.config else VTAConfig()
    peak = intrinsics(cfg).gemm.macs
    model = bert_block(tokens=args.tokens, width=args.width, heads=args.heads, mlp=args.mlp)
    rng = np.random.default_rng(0)
    calib = {"input": rng.standard_normal((2, args.tokens, args.width)).astype(np.float32)}
    graph = import_onnx(model)
    qgraph = quantize(graph, calib, mode=args.requant)
    t0 = time.perf_counter()
    compiled = compile_graph(qgraph, cfg)
    print(f"{cfg.name}: {peak} MACs/cycle; compiled in {time.perf_counter() - t0:.1f} s")
    steps = [s for s in compiled.steps if isinstance(s, AccelStep)]
    x_eval = {"input": np.random.default_rng(1).standard_normal((1, args.tokens, args.width)).astype(np.float32)}
    ref_float = float_ref.run_float(graph, x_eval)["output"]
    ref_int = qops.run_reference(qgraph, x_eval)["output"]
    err = accuracy_vs_float(ref_float, ref_int, output_scale(qgraph, "output"))
    print(f"requant {args.requant}: error of the integer model against float on one seeded input: "
          + ", ".join(f"{k} {v:.4g}" for k, v in err.items() if isinstance(v, float)))
    measured: dict[str, tuple[int | None, float, int]] = {}
    if not args.no_tsim:
        x = {"input": rng.standard_normal((1, args.tokens, args.width)).astype(np.float32)}
        t0 = time.perf_counter()
        out = run(compiled, x, target="tsim")
        exact = np.array_equal(out.outputs["output"], qops.run_reference(qgraph, x)["output"])
        print(f"tsim: {time.perf_counter() - t0:.1f} s wall; bit-exact with the integer reference: {exact}")
        measured = {layer.layer: (layer.cycles, layer.seconds, layer.conversions) for layer in out.layers}
    rows = []
    head = f"{'layer':24} {'role':14} {'MACs':>12} {'GEMM uops':>10} {'ALU uops':>9} {'model cyc':>10} " \
           f"{'util model':>10} {'tsim cyc':>10} {'util tsim':>9} {'error':>7}  tiling"
    print(head)
    for s in steps:
        tsim = measured.get(s.node.name, (None, 0.0, 0))[0]
        row = {"layer": s.node.name, "role": role_of(s.node.name), "macs": s.macs, "gemm_uops": s.gemm_uops,
               "alu_uops": s.alu_uops, "predicted_cycles": s.predicted_cycles, "tsim_cycles": tsim,
               "util_model": s.macs / (s.predicted_cycles * peak), "tiling": s.tiling,
               "bound": s.schedule.get("bound", "")}
        line = f"{s.node.name:24} {row['role']:14} {s.macs:>12,} {s.gemm_uops:>10,} {s.alu_uops:>9,} " \
               f"{s.predicted_cycles:>10,} {row['util_model']:>10.1%} "
        if tsim:
            row["util_tsim"] = s.macs / (tsim * peak)
            row["error"] = (s.predicted_cycles - tsim) / tsim
            line += f"{tsim:>10,} {row['util_tsim']:>9.1%} {row['error']:>+7.1%}"
        else:
            line += f"{'':>10} {'':>9} {'':>7}"
        print(line + f"  {s.tiling} ({row['bound']})")
        rows.append(row)
    for s in steps:
        if s.node.op == "QMatMul":
            layout = host_layout_seconds(qgraph, s.node, cfg)
            row = next(r for r in rows if r["layer"] == s.node.name)
            row["host_layout_us"] = layout
            accel_us = s.predicted_cycles / cfg.clock_mhz
            print(f"{s.node.name}: the host layout step (pack a, pack b into the weight layout, unpack the output) "
                  f"takes " + ", ".join(f"{k} {v:.0f} us" for k, v in layout.items())
                  + f" (median of 20, this machine); the accelerator {accel_us:.0f} us at {cfg.clock_mhz:g} MHz")
            paths = weight_paths(qgraph, s.node, cfg, not args.no_tsim)
            row["weight_paths"] = paths
            for path, figures in paths.items():
                print(f"  b by {path:4}: " + ", ".join(f"{k} {v:,}" if isinstance(v, int) and not isinstance(v, bool)
                                                      else f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}"
                                                      for k, v in figures.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg.name, "macs_per_cycle": peak, "layers": rows}, f, indent=1)


if __name__ == "__main__":
    main()
