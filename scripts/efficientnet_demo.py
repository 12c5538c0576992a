#!/usr/bin/env python3
"""EfficientNet-Lite0 (pretrained, ImageNet) end to end on the lab with real photos.

Steps: export the model to ONNX once (cached, see :func:`vta.compiler.frontend.efficientnet.export_onnx`); preprocess
seven real photos that ship with scikit-image and matplotlib; float top-1 with ONNX Runtime; import, quantize to int8
(calibrated on the same photos) and compile for the config; run the int8 model on the integer reference
(``ref``), the CPU path (``cpu``: llvmlite kernels for every layer) and the accelerator (``fsim``, or ``tsim`` when
the RTL backend is built); print one table row per image (float top-1 class and probability, int8 top-1, agreement,
whether the float top-1 is in the int8 top-5, whether every target's output equals the reference bit for bit) and
the compiler's per-layer report of the first accelerator run.

Run (needs the ``efficientnet`` extra: ``pip install torch==2.13.0`` then ``pip install -e ".[efficientnet]"``)::

    python scripts/efficientnet_demo.py                     # ref, cpu and fsim on all seven photos, ~2 min
    python scripts/efficientnet_demo.py --targets ref,fsim --images chelsea,coffee
    python scripts/efficientnet_demo.py --json out/efficientnet.json --report-csv out/efficientnet_layers.csv

The exported file is an ordinary ONNX model, so ``vta run <printed onnx path> --target fsim`` also compiles and runs
it (calibrated on random inputs there, so its accuracy is not meaningful; this script calibrates on real photos).
Exit code 1 when an accelerator or CPU run differs from the integer reference, 2 for a bad option or a missing
package.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from vta.fileio import atomic_write_text

TARGETS = ("ref", "cpu", "fsim", "tsim")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from vta.compiler.ir import REQUANT_MODES
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default="ref,cpu,fsim",
                   help=f"comma-separated int8 targets among {', '.join(TARGETS)} (default: ref,cpu,fsim)")
    p.add_argument("--images", default=None, help="comma-separated sample images (default: all seven)")
    p.add_argument("--config", metavar="FILE", default=None, help="accelerator config (default: VTA's defaults)")
    p.add_argument("--cache-dir", metavar="DIR", default=None, help="where the ONNX export is cached")
    p.add_argument("--per-channel", choices=("true", "false", "auto"), default="true",
                   help="per-channel weight scales (default: true)")
    p.add_argument("--weight-rounding", choices=("gptq", "nearest"), default="gptq",
                   help="weights rounded by GPTQ on the calibration photos (default) or to nearest")
    p.add_argument("--requant", choices=REQUANT_MODES, default="multiply",
                   help="requantization: multiply (an integer multiplier and a shift per channel, default) or shift "
                        "(power-of-two scales as VTA's TVM stack: one fewer ALU micro-op per output vector, slightly "
                        "less accurate)")
    p.add_argument("--json", metavar="FILE", help="write the results (table, timings, per-layer report) as JSON")
    p.add_argument("--report-csv", metavar="FILE", help="write the per-layer report as CSV")
    p.add_argument("--reasons", action="store_true", help="show why each layer runs where it does")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in args.targets if t not in TARGETS]
    if bad or not args.targets:
        p.error(f"--targets takes names among {', '.join(TARGETS)}, not {args.targets!r}")
    return args


def _bar(items: Any, enabled: bool, desc: str) -> Any:
    if not enabled:
        return items
    from tqdm import tqdm
    return tqdm(items, desc=desc, unit="image", leave=False)


def _short(name: str, width: int = 26) -> str:
    first = name.split(",")[0]
    return first if len(first) <= width else first[:width - 1] + "~"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from vta.compiler.frontend import efficientnet as E
    from vta.compiler.pipeline import compile_graph
    from vta.compiler.report import build_report
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig, load_config

    progress = not args.no_progress
    times: dict[str, float] = {}
    if not E.onnx_path(args.cache_dir).exists():
        print("exporting EfficientNet-Lite0 to ONNX with torch (once, about 15 s) ...", flush=True)
    start = time.perf_counter()
    path = E.export_onnx(args.cache_dir)
    times["export_or_cache_s"] = time.perf_counter() - start
    print(f"model: {path}")
    images = E.sample_images(args.images.split(",") if args.images else None)
    batch = E.preprocess_all(images)
    names = E.class_names()

    start = time.perf_counter()
    float_logits = E.onnxruntime_logits(path, batch)
    times["onnxruntime_s_per_image"] = (time.perf_counter() - start) / len(images)

    print(f"importing and quantizing (calibration on {len(images)} photos, a few seconds each) ...", flush=True)
    start = time.perf_counter()
    graph = E.import_model(path)
    per_channel = {"true": True, "false": False, "auto": "auto"}[args.per_channel]
    qgraph = E.quantize_model(graph, batch, per_channel=per_channel, mode=args.requant,
                              weight_rounding=args.weight_rounding)
    times["import_quantize_s"] = time.perf_counter() - start
    cfg = load_config(args.config) if args.config else VTAConfig()
    compiled = compile_graph(qgraph, cfg, progress=progress)
    times["compile_s"] = compiled.compile_seconds or 0.0
    print(f"quantized on {len(images)} photos and compiled for {cfg.name} in "
          f"{times['import_quantize_s'] + times['compile_s']:.1f} s: {compiled.accel_steps} of "
          f"{len(compiled.steps)} layers on the accelerator")

    out_name = qgraph.outputs[0]
    logits: dict[str, list[np.ndarray]] = {t: [] for t in args.targets}
    exact: dict[str, list[bool]] = {t: [] for t in args.targets if t != "ref"}
    seconds: dict[str, float] = {t: 0.0 for t in args.targets}
    report = None
    from vta.compiler.qops import run_reference
    for i in _bar(range(len(images)), progress, "int8"):
        x = {E.INPUT_NAME: batch[i:i + 1]}
        t0 = time.perf_counter()
        ref = run_reference(qgraph, x)[out_name]
        if "ref" in logits:
            seconds["ref"] += time.perf_counter() - t0
            logits["ref"].append(ref)
        for target in (t for t in args.targets if t != "ref"):
            t0 = time.perf_counter()
            result = run(compiled, x, target=target)
            seconds[target] += time.perf_counter() - t0
            got = result.outputs[out_name]
            logits[target].append(got)
            exact[target].append(bool(np.array_equal(got, ref)))
            if report is None and target in ("fsim", "tsim"):
                report = build_report(compiled, result, model=E.MODEL_NAME)
    for t in args.targets:
        times[f"{t}_s_per_image"] = seconds[t] / len(images)

    main_target = next((t for t in ("fsim", "tsim", "ref", "cpu") if t in logits), args.targets[0])
    int8 = np.concatenate(logits[main_target])
    float_top, int8_top = E.top1(float_logits), E.top1(int8)
    int8_top5 = E.topk(int8, 5)
    rows = []
    for i, name in enumerate(images):
        (fc, fp), (qc, qp) = float_top[i], int8_top[i]
        rows.append({"image": name, "float_class": fc, "float_name": names[fc], "float_prob": round(fp, 4),
                     "int8_class": qc, "int8_name": names[qc], "int8_prob": round(qp, 4), "agree": fc == qc,
                     "float_top1_in_int8_top5": bool(fc in int8_top5[i]),
                     **{f"{t}_bit_exact": exact[t][i] for t in exact}})
    _print_table(rows, main_target, list(exact))
    agree = sum(r["agree"] for r in rows)
    print(f"top-1 agreement int8 ({main_target}) vs float: {agree}/{len(rows)}; float top-1 in int8 top-5: "
          f"{sum(r['float_top1_in_int8_top5'] for r in rows)}/{len(rows)}")
    print("times: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))
    if report is not None:
        print()
        print(report.format(reasons=args.reasons))
        if args.report_csv:
            Path(args.report_csv).parent.mkdir(parents=True, exist_ok=True)
            report.write_csv(args.report_csv)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        data = {"model": str(path), "config": cfg.name, "int8_target": main_target, "rows": rows,
                "times": {k: round(v, 3) for k, v in times.items()},
                "report": report.to_dict() if report is not None else None}
        atomic_write_text(args.json, json.dumps(data, indent=2, default=str))
        print(f"wrote {args.json}")
    ok = all(all(v) for v in exact.values())
    if not ok:
        print("ERROR: a target's output differs from the integer reference", file=sys.stderr)
    return 0 if ok else 1


def _print_table(rows: list[dict[str, Any]], int8_target: str, checked: list[str]) -> None:
    head = (f"{'image':<13} {'float top-1':<34} {'prob':>5}  {'int8 top-1 (' + int8_target + ')':<34} {'prob':>5}  "
            f"{'agree':<5} {'top-5':<5}" + "".join(f" {t + '==ref':<9}" for t in checked))
    print(head)
    print("-" * len(head))
    for r in rows:
        fname = f"{r['float_class']} {_short(r['float_name'], 29)}"
        qname = f"{r['int8_class']} {_short(r['int8_name'], 29)}"
        line = (f"{r['image']:<13} {fname:<34} {r['float_prob']:>5.2f}  {qname:<34} {r['int8_prob']:>5.2f}  "
                f"{'yes' if r['agree'] else 'no':<5} {'yes' if r['float_top1_in_int8_top5'] else 'no':<5}")
        line += "".join(f" {'yes' if r[t + '_bit_exact'] else 'NO':<9}" for t in checked)
        print(line)


def _entry() -> int:
    try:
        return main()
    except (ValueError, ImportError) as err:      # a bad option value, a missing package of the extra
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_entry())
