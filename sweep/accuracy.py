"""The accuracy objective of a sweep point: the model quantized to the design's widths, on the integer reference.

A design's precision (``LOG_INP_WIDTH``, ``LOG_WGT_WIDTH``) sets how the compiler quantizes the model
(:func:`vta.compiler.frontend.quantize.quantize` with ``act_bits`` / ``wgt_bits``); the design runs that quantized
graph bit-exactly (fsim and tsim match :func:`vta.compiler.qops.run_reference`), so its accuracy is the reference's,
computed here on the fast path (numpy, no simulation) and cached on disk per (model file, widths, calibration,
samples): designs that differ in anything else share one evaluation.

What is measured, by the evaluation data available:

* ``MODEL.eval.npz`` beside an ONNX file (``x``: stacked inputs of the model's first input; ``y``: int labels,
  optional; ``calib``: the inputs to calibrate on, optional, default the first 200 of ``x``; scripts/train_digits.py
  writes one with the digits test split and 200 training images): with ``y``, ``accuracy`` is test accuracy
  in percent and ``accuracy_float`` the float model's; without, top-1 agreement with the float model;
* otherwise ``samples`` seeded random inputs (seed 1000, distinct from calibration's): top-1 agreement (percent) of
  the quantized model's argmax with the float reference's (:func:`vta.compiler.frontend.float_ref.run_float`).

Calibration is shared with the sweep's compile (:func:`calibrated`, once per model in a process): the evaluation
file's ``calib`` where it has one, else the zoo's real images, else 4 seeded random samples; ``method`` (another
calibration method) calibrates again. The float model runs on onnxruntime where there is an ONNX file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from vta.cache import cache_root, file_sha256
from vta.fileio import atomic_write_text

__all__ = ["model_accuracy", "eval_data_path", "calibrated", "four_way_front", "front_table", "plot_accuracy",
           "OBJECTIVES", "ACCURACY_SAMPLES", "ACCURACY_VERSION"]

ACCURACY_SAMPLES = 32
"""Seeded random inputs an accuracy without evaluation data is measured on."""
ACCURACY_VERSION = 3
"""Part of every cache key: bump it when what is measured changes."""


def eval_data_path(model: str) -> Path | None:
    """``MODEL.eval.npz`` beside an ONNX file ``model`` (``digits.onnx`` -> ``digits.eval.npz``), when it exists."""
    if not model.endswith(".onnx"):
        return None
    path = Path(model[:-len(".onnx")] + ".eval.npz")
    return path if path.is_file() else None


def _model_key(model: str) -> str:
    """What identifies the model's weights: a zoo name with the zoo's version, or a file's SHA-256."""
    if model.endswith(".onnx") and os.path.isfile(model):
        return file_sha256(Path(model))[:16]
    from vta.compiler.frontend.zoo import ZOO_VERSION
    return f"{model}.v{ZOO_VERSION}"


def model_accuracy(model: str, act_bits: int, wgt_bits: int, *, method: str | None = None,
                   samples: int = ACCURACY_SAMPLES) -> dict[str, Any]:
    """``{"accuracy": percent, "accuracy_on": what it was measured on, "accuracy_float": percent or None}`` of
    ``model`` (zoo name or ONNX path) quantized to ``act_bits`` / ``wgt_bits`` (8 or 4); see the module docstring.
    Cached in the cache folder ``accuracy``."""
    data = eval_data_path(model)
    key = "_".join([_model_key(model), f"w{wgt_bits}a{act_bits}", method or "minmax",
                    f"eval{file_sha256(data)[:12]}" if data else f"n{samples}", f"v{ACCURACY_VERSION}"])
    folder = cache_root("accuracy")
    path = folder / f"{key.replace('/', '_')}.json"
    if path.is_file():
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass  # a damaged entry is measured again
    result = _measure(model, act_bits, wgt_bits, method, samples, data)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, sort_keys=True) + "\n")
    return result


_CALIBRATED: dict[str, tuple[Any, Any]] = {}
"""model -> (its float graph, its Calibration), measured once per process (see :func:`calibrated`)."""
_FLOAT_TOP: dict[tuple[str, str], np.ndarray] = {}
"""(model, evaluation set) -> the float model's top-1 per input, once per process."""


def calibrated(model: str) -> tuple[Any, Any]:
    """``model``'s float graph and its calibration (:func:`vta.compiler.frontend.quantize.calibrate` of the prepared
    graph), once per process: on the evaluation file's ``calib`` inputs (or its first 200 ``x``), else as the compile
    always did (the zoo's real images, else 4 seeded random samples). Every width pair quantizes from it
    (``quantize(..., calibration=...)``), the sweep's compile and this accuracy alike."""
    if model not in _CALIBRATED:
        from vta.compiler.frontend.quantize import calibrate, prepare
        from vta.compiler.pipeline import calibration_inputs, load_graph
        graph = load_graph(model)
        data = eval_data_path(model)
        inputs = None
        if data is not None:
            with np.load(data) as npz:
                calib = npz["calib"] if "calib" in npz.files else npz["x"][:200]
                inputs = {graph.inputs[0]: np.asarray(calib, np.float32)}
        if inputs is None:
            inputs = calibration_inputs(model, graph, 1, 4)
        _CALIBRATED[model] = (graph, calibrate(prepare(graph), inputs))
    return _CALIBRATED[model]


def _onnx_path(model: str) -> str | None:
    """The ONNX file of ``model`` (a path, or the zoo's cached file), for onnxruntime; None when there is none."""
    if model.endswith(".onnx"):
        return model
    try:
        from vta.compiler.frontend.zoo import get_model
        return str(get_model(model))
    except (ValueError, OSError):
        return None


def _float_top(model: str, graph: Any, inputs: list[dict[str, np.ndarray]], key: str) -> np.ndarray:
    """Top-1 of the float model per input: onnxruntime on the model's file where there is one (fast), else the
    float reference; once per (model, evaluation set) in a process."""
    if (model, key) not in _FLOAT_TOP:
        from vta.compiler.frontend.quantize import float_outputs
        path = _onnx_path(model)
        out = graph.outputs[0]
        tops = []
        for sample in inputs:
            values, _ = float_outputs(path, graph, sample)
            tops.append(int(np.asarray(values[out]).reshape(-1).argmax()))
        _FLOAT_TOP[(model, key)] = np.asarray(tops)
    return _FLOAT_TOP[(model, key)]


def _measure(model: str, act_bits: int, wgt_bits: int, method: str | None, samples: int,
             data: Path | None) -> dict[str, Any]:
    from vta.compiler.frontend.quantize import calibrate, prepare, quantize
    from vta.compiler.pipeline import random_inputs
    from vta.compiler.qops import run_reference
    graph, calibration = calibrated(model)
    labels: np.ndarray | None = None
    if data is not None:
        with np.load(data) as npz:
            x = np.asarray(npz["x"], np.float32)
            labels = np.asarray(npz["y"]) if "y" in npz.files else None
        name = graph.inputs[0]
        inputs = [{name: x[i:i + 1]} for i in range(len(x))]
        on = f"{len(x)} inputs of {data.name}" + (" (test accuracy, labels)" if labels is not None else
                                                  " (top-1 agreement with float32)")
    else:
        stacked = random_inputs(graph, 1000, samples)
        batch = graph.shape(graph.inputs[0])[0]
        inputs = [{k: v[i * batch:(i + 1) * batch] for k, v in stacked.items()} for i in range(samples)]
        on = f"top-1 agreement with float32 on {samples} seeded random inputs"
    if method is not None:  # another calibration method than the shared (minmax) one
        from vta.compiler.pipeline import calibration_inputs
        calibration = calibrate(prepare(graph), calibration_inputs(model, graph, 1, 4), method=method)
    qgraph = quantize(graph, {}, act_bits=act_bits, wgt_bits=wgt_bits, calibration=calibration)
    out = graph.outputs[0]
    q = np.asarray([np.asarray(run_reference(qgraph, sample)[out]).reshape(-1).argmax() for sample in inputs])
    f = _float_top(model, graph, inputs, on)
    if labels is not None:
        return {"accuracy": 100.0 * float((q == labels[:len(q)]).mean()), "accuracy_on": on,
                "accuracy_float": 100.0 * float((f == labels[:len(f)]).mean())}
    return {"accuracy": 100.0 * float((q == f).mean()), "accuracy_on": on, "accuracy_float": None}


# ---- the four-way front ---------------------------------------------------------------------------------------------
OBJECTIVES = (("accuracy", True, "accuracy (%)"), ("latency_us", False, "latency (us)"),
              ("energy_total_uj", False, "energy per inference, static included (uJ)"),
              ("area_clb", False, "area (CLB-equivalents, 7-series)"))
"""(column, larger is better, label) of the four objectives a sweep with accuracy ranks designs on."""


def _dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """True when ``a`` is at least as good as ``b`` on every objective and better on one."""
    better = False
    for column, larger, _ in OBJECTIVES:
        x, y = (a[column], b[column]) if larger else (-a[column], -b[column])
        if x < y:
            return False
        better = better or x > y
    return better


def four_way_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``ok`` rows (of one model) that no other row dominates on accuracy, latency, energy and area
    (:data:`OBJECTIVES`), sorted by accuracy (best first) then latency; rows missing an objective are ignored; of rows
    equal on all four only the first is kept."""
    valid = [r for r in rows if r.get("status", "ok") == "ok" and all(r.get(c) is not None for c, _, _ in OBJECTIVES)]
    front: list[dict[str, Any]] = []
    for r in valid:
        if any(_dominates(o, r) for o in valid):
            continue
        if any(all(o[c] == r[c] for c, _, _ in OBJECTIVES) for o in front):
            continue
        front.append(r)
    return sorted(front, key=lambda r: (-r["accuracy"], r["latency_us"]))


def front_table(front: list[dict[str, Any]]) -> str:
    """The four-way front as a text table: design, accuracy, latency, energy, area."""
    head = f"{'design':<44} {'accuracy %':>10} {'latency us':>11} {'energy uJ':>10} {'area CLB':>9}"
    lines = [head, "-" * len(head)]
    for r in front:
        lines.append(f"{r['design']:<44} {r['accuracy']:>10.2f} {r['latency_us']:>11.1f} "
                     f"{r['energy_total_uj']:>10.2f} {r['area_clb']:>9.0f}")
    return "\n".join(lines)


def plot_accuracy(groups: dict[str, list[dict[str, Any]]], folder: str | os.PathLike[str]) -> list[Path]:
    """Per model with accuracy, one PNG ``accuracy_<model>.png``: accuracy against latency, energy and area (the
    four-way front's 2D projections), every design grey and the front's designs marked. Returns the files."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vta.fileio import atomic_path
    written = []
    for model, rows in groups.items():
        valid = [r for r in rows if r.get("accuracy") is not None and r.get("status", "ok") == "ok"]
        if not valid:
            continue
        front = four_way_front(valid)
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
        for ax, (column, _, label) in zip(axes, OBJECTIVES[1:]):
            ax.scatter([r[column] for r in valid], [r["accuracy"] for r in valid], s=12, c="0.7", label="designs")
            ax.scatter([r[column] for r in front], [r["accuracy"] for r in front], s=30, c="C3",
                       label="four-way front")
            ax.set_xlabel(label)
            ax.set_ylabel("accuracy (%)")
            ax.grid(alpha=0.3)
        axes[0].legend(loc="lower right")
        fig.suptitle(f"{Path(model).stem}: accuracy ({valid[0].get('accuracy_on', '')}) against the other objectives")
        fig.tight_layout()
        path = Path(folder) / f"accuracy_{Path(model).stem}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
        plt.close(fig)
        written.append(path)
    return written
