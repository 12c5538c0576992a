#!/usr/bin/env python3
"""Accuracy of EfficientNet-Lite0 at the accelerator's precisions, against its float model, on photos-derived inputs.

For each precision (``w8a8``: int8 weights and activations, VTA's default; ``w4a8``: int4 weights; ``w8a4``,
``w4a4``) the pretrained model is quantized to those widths (one calibration, on a calibration part of the derived
set disjoint from the evaluation part; weights rounded by GPTQ on that calibration part unless
``--weight-rounding nearest``) and run on the integer reference (:func:`vta.compiler.qops.run_reference`,
which fsim and tsim match bit for bit); its logits are compared with ONNX Runtime's float logits
(:func:`vta.compiler.frontend.derived_photos.agreement`: top-1 and top-5 agreement, mean KL divergence).
The inputs: :func:`vta.compiler.frontend.derived_photos.derived_inputs` of the seven sample photos.

Logits are cached per (model file, quantized graph, evaluation set) in the cache folder
``accuracy``; ``--tsim N`` compiles each precision for its design (``w8a8``: the default config; ``w4a8``:
configs/w4a8.toml; ...) and checks N evaluation inputs on tsim against the reference, bit for bit.

    python3 scripts/precision_accuracy.py --model efficientnet_lite0 --precision w8a8,w4a8 --tsim 2
"""
from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PRECISIONS = {"w8a8": (8, 8), "w4a8": (8, 4), "w8a4": (4, 8), "w4a4": (4, 4)}
"""name -> (act_bits, wgt_bits)."""
CONFIGS = {"w8a8": None, "w4a8": "configs/w4a8.toml", "w4a4": "configs/w4a4.toml"}
"""The design each precision runs on for the tsim check (None: the default config)."""
CACHE_VERSION = 2
"""Version of the cached calibration (2: with the layers' input moments) and integer-reference logits."""
FLOAT_CACHE_VERSION = 1

_QGRAPH: Any = None
"""The quantized graph the worker processes run (inherited through fork)."""
_BATCH: np.ndarray | None = None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="efficientnet_lite0", choices=["efficientnet_lite0"])
    ap.add_argument("--precision", default="w8a8,w4a8",
                    help=f"comma-separated precisions among {', '.join(PRECISIONS)} (default w8a8,w4a8)")
    ap.add_argument("--per-photo", type=int, default=72, help="evaluation inputs per photo (default 72: 504 inputs)")
    ap.add_argument("--calib-per-photo", type=int, default=2, help="calibration inputs per photo (default 2: 14)")
    ap.add_argument("--workers", type=int, default=2, help="processes running the integer reference (default 2)")
    ap.add_argument("--tsim", type=int, default=0, metavar="N",
                    help="check the first N evaluation inputs on tsim against the reference (default 0: no check)")
    ap.add_argument("--weight-rounding", default="gptq", choices=["gptq", "nearest"],
                    help="how weights are rounded: GPTQ on the calibration inputs (default) or to nearest")
    ap.add_argument("--keep-int8", default="", metavar="NODES",
                    help="comma-separated Conv/Dense nodes kept at int8 on the CPU at narrow precisions")
    ap.add_argument("--json", metavar="FILE", help="write the figures as JSON to FILE")
    args = ap.parse_args(argv)
    bad = [p for p in args.precision.split(",") if p not in PRECISIONS]
    if bad:
        ap.error(f"unknown precision {bad[0]!r}; choose among {', '.join(PRECISIONS)}")
    for opt in ("per_photo", "calib_per_photo", "workers"):
        if getattr(args, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be at least 1, not {getattr(args, opt)}")
    if args.tsim < 0:
        ap.error(f"--tsim must be 0 or more inputs, not {args.tsim}")
    return args


def _digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]


def _graph_digest(qgraph: Any) -> str:
    """A digest of the quantized graph's constants and node attributes (so a changed quantizer misses the cache)."""
    h = hashlib.sha256()
    for name in sorted(qgraph.constants):
        h.update(name.encode() + np.ascontiguousarray(qgraph.constants[name]).tobytes())
    for node in qgraph.nodes:
        h.update(repr((node.op, node.name, node.inputs, node.outputs, sorted(node.attrs.items()))).encode())
    return h.hexdigest()[:16]


def _reference_one(i: int) -> np.ndarray:
    from vta.compiler.qops import run_reference
    assert _QGRAPH is not None and _BATCH is not None
    return np.asarray(run_reference(_QGRAPH, {_QGRAPH.inputs[0]: _BATCH[i:i + 1]})[_QGRAPH.outputs[0]])


def _reference_logits(qgraph: Any, batch: np.ndarray, workers: int, cache: Path) -> np.ndarray:
    """The integer reference's logits ``[N, 1000]`` of ``batch``, from ``cache`` when it holds them; computed in
    ``workers`` forked processes, the partial result saved every 16 inputs (an interrupted run resumes)."""
    global _QGRAPH, _BATCH
    done: dict[int, np.ndarray] = {}
    if cache.is_file():
        with np.load(cache) as npz:
            done = {int(i): row for i, row in zip(npz["index"], npz["logits"])}
    todo = [i for i in range(len(batch)) if i not in done]
    if todo:
        _QGRAPH, _BATCH = qgraph, batch
        ctx = multiprocessing.get_context("fork")
        start = time.perf_counter()
        with ctx.Pool(workers) as pool:
            for n, (i, row) in enumerate(zip(todo, pool.imap(_reference_one, todo, chunksize=2)), 1):
                done[i] = row.reshape(-1)
                if n % 16 == 0 or n == len(todo):
                    idx = np.asarray(sorted(done))
                    tmp = cache.with_suffix(".tmp.npz")
                    np.savez(tmp, index=idx, logits=np.stack([done[j] for j in idx]))
                    os.replace(tmp, cache)
                    print(f"  {len(done)}/{len(batch)} inputs, {time.perf_counter() - start:.0f} s", flush=True)
    return np.stack([done[i] for i in range(len(batch))])


def _tsim_check(qgraph: Any, precision: str, batch: np.ndarray, ref: np.ndarray, n: int) -> dict[str, Any]:
    from vta.compiler.pipeline import compile_graph
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig, load_config
    cfg_path = CONFIGS.get(precision)
    if precision not in CONFIGS:
        return {"tsim_checked": 0, "tsim_note": f"no design for {precision} in this script"}
    cfg = load_config(cfg_path) if cfg_path else VTAConfig()
    compiled = compile_graph(qgraph, cfg, progress=False)
    same = 0
    start = time.perf_counter()
    for i in range(n):
        got = run(compiled, {qgraph.inputs[0]: batch[i:i + 1]}, target="tsim").outputs[qgraph.outputs[0]]
        same += int(np.array_equal(np.asarray(got).reshape(-1), ref[i]))
    return {"tsim_checked": n, "tsim_equal": same, "tsim_design": cfg.name, "tsim_accel_layers": compiled.accel_steps,
            "tsim_s": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from vta.cache import cache_root, file_sha256
    from vta.compiler.frontend import efficientnet as E
    from vta.compiler.frontend.derived_photos import CALIB_SEED, EVAL_SEED, agreement, derived_inputs, describe_set
    from vta.compiler.frontend.quantize import calibrate, prepare, quantize

    path = E.export_onnx()
    photos = E.sample_images()
    names = list(photos)
    calib, _ = derived_inputs(photos, args.calib_per_photo, seed=CALIB_SEED)
    evals, notes = derived_inputs(photos, args.per_photo, seed=EVAL_SEED)
    digests = {_digest(x) for x in evals}
    overlap = digests & {_digest(x) for x in calib}
    if len(digests) != len(evals) or overlap:
        print(f"error: the derived set is not made of distinct inputs ({len(digests)} distinct of {len(evals)}, "
              f"{len(overlap)} shared with calibration)", file=sys.stderr)
        return 1
    eval_desc = describe_set(names, args.per_photo, EVAL_SEED)
    calib_desc = describe_set(names, args.calib_per_photo, CALIB_SEED)
    print(f"evaluation: {len(evals)} inputs = {eval_desc}; calibration (minmax, {args.weight_rounding} weights): "
          f"{len(calib)} inputs = {calib_desc}")
    model_key = file_sha256(path)[:16]
    folder = cache_root("accuracy")
    folder.mkdir(parents=True, exist_ok=True)
    eval_key = f"eval{args.per_photo}s{EVAL_SEED}"
    calib_key = f"calib{args.calib_per_photo}s{CALIB_SEED}"

    float_cache = folder / f"{args.model}_{model_key}_float_{eval_key}_v{FLOAT_CACHE_VERSION}.npz"
    if float_cache.is_file():
        with np.load(float_cache) as npz:
            float_logits = npz["logits"]
    else:
        float_logits = E.onnxruntime_logits(path, evals)
        np.savez(float_cache, logits=float_logits)

    graph = E.import_model(path)
    cal_cache = folder / f"{args.model}_{model_key}_{calib_key}_v{CACHE_VERSION}.calibration.pkl"
    if cal_cache.is_file():
        calibration = pickle.loads(cal_cache.read_bytes())
    else:
        start = time.perf_counter()
        calibration = calibrate(prepare(graph), {graph.inputs[0]: calib}, moments=True)
        cal_cache.write_bytes(pickle.dumps(calibration))
        print(f"calibrated in {time.perf_counter() - start:.0f} s")

    keep = [k for k in args.keep_int8.split(",") if k]
    results: list[dict[str, Any]] = []
    for precision in args.precision.split(","):
        act_bits, wgt_bits = PRECISIONS[precision]
        kept = keep if (act_bits, wgt_bits) != (8, 8) else []
        qgraph = quantize(graph, {}, act_bits=act_bits, wgt_bits=wgt_bits, calibration=calibration,
                          keep_int8=kept, weight_rounding=args.weight_rounding)
        qkey = _graph_digest(qgraph)
        cache = folder / f"{args.model}_{model_key}_{precision}_{qkey}_{eval_key}_v{CACHE_VERSION}.npz"
        start = time.perf_counter()
        print(f"{precision}: integer reference on {len(evals)} inputs ({cache.name}) ...", flush=True)
        ref = _reference_logits(qgraph, evals, args.workers, cache)
        row: dict[str, Any] = {"precision": precision, "weight_rounding": args.weight_rounding, "kept_int8": kept,
                               **agreement(float_logits, ref),
                               "reference_s": round(time.perf_counter() - start, 1)}
        if args.tsim:
            row.update(_tsim_check(qgraph, precision, evals, ref, args.tsim))
        results.append(row)
        print(f"  top-1 agreement {row['top1_agreement']:.2f} %, top-5 {row['top5_agreement']:.2f} %, "
              f"mean KL {row['mean_kl']:.4f} nats" + (f"; tsim == reference on {row['tsim_equal']}/"
                                                      f"{row['tsim_checked']} inputs ({row['tsim_design']})"
                                                      if "tsim_equal" in row else ""), flush=True)

    print(f"\nEfficientNet-Lite0 against ONNX Runtime float32 on {len(evals)} derived inputs ({eval_desc}):")
    print("| precision | kept int8 | top-1 agreement | top-5 agreement | mean KL (nats) | tsim == reference |")
    print("|---|---|---|---|---|---|")
    for r in results:
        tsim = f"{r['tsim_equal']}/{r['tsim_checked']} ({r['tsim_design']})" if "tsim_equal" in r else "not checked"
        print(f"| {r['precision']} | {', '.join(r['kept_int8']) or '(none)'} | {r['top1_agreement']:.2f} % | "
              f"{r['top5_agreement']:.2f} % | {r['mean_kl']:.4f} | {tsim} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": args.model, "evaluation": eval_desc,
                                               "calibration": f"minmax on {calib_desc}, {args.weight_rounding} "
                                                              f"weights", "results": results,
                                               "first_inputs": notes[:3]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
