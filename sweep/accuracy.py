"""The accuracy objective of a sweep point: the model quantized to the design's widths, on the integer reference.

A design's precision (``LOG_INP_WIDTH``, ``LOG_WGT_WIDTH``) sets how the compiler quantizes the model
(:func:`vta.compiler.frontend.quantize.quantize` with ``act_bits`` / ``wgt_bits``); the design runs that quantized
graph bit-exactly (fsim and tsim match :func:`vta.compiler.qops.run_reference`), so its accuracy is the reference's,
computed here on the fast path (numpy, no simulation) and cached on disk per (model file, widths, calibration,
evaluation set): designs that differ in anything else share one evaluation.

What it is measured on is the model's evaluation set (:mod:`vta.sweep.evalset`): test accuracy on a
``MODEL.eval.npz`` with labels, else top-1 agreement of the quantized model's argmax with the float model's (ONNX
Runtime on the model's file, else the float reference): on the file's inputs, on EfficientNet-Lite0's 504
photos-derived inputs, or on ``samples`` seeded random inputs.

Work is cut in chunks of the set: the top-1 classes of one chunk at one width pair (and the float model's, shared by
every width pair) are a cache file of their own, computed under a file lock, so two workers never compute one chunk
twice and a second one waits for the first's result. :func:`accuracy_jobs` lists the chunks a sweep still needs (the
runner hands them to its workers before the points, costliest first); :func:`model_accuracy` puts a width pair's
chunks together (computing any that are missing). Per process, each model is calibrated once
(:func:`calibrated`, shared with the sweep's compile) and quantized once per width pair (:func:`quantized`).
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from vta.cache import cache_root, entry_lock, file_sha256
from vta.fileio import atomic_write_bytes, atomic_write_text

from .evalset import EvalSet, calibration_inputs, chunk_inputs, eval_data_path, eval_set

__all__ = ["model_accuracy", "eval_data_path", "calibrated", "quantized", "AccuracyJob", "accuracy_jobs",
           "run_accuracy_job", "four_way_front", "front_table", "plot_accuracy", "OBJECTIVES", "ACCURACY_SAMPLES",
           "ACCURACY_VERSION"]

ACCURACY_SAMPLES = 32
"""Seeded random inputs an accuracy without evaluation data is measured on."""
ACCURACY_VERSION = 4
"""Part of every cache key: bump it when what is measured changes (4: EfficientNet-Lite0 on its photos-derived set,
results in chunks)."""


def _model_key(model: str) -> str:
    """What identifies the model's weights: a zoo name with the zoo's version, or a file's SHA-256."""
    if model.endswith(".onnx") and os.path.isfile(model):
        return file_sha256(Path(model))[:16]
    from vta.compiler.frontend.zoo import ZOO_VERSION
    return f"{model}.v{ZOO_VERSION}"


def _stem(model: str, es: EvalSet, method: str | None) -> str:
    """The cache-file prefix shared by a model's results on ``es`` with calibration ``method``."""
    return "_".join([_model_key(model), method or "minmax", es.key, f"v{ACCURACY_VERSION}"]).replace("/", "_")


def _result_path(model: str, act_bits: int, wgt_bits: int, method: str | None, es: EvalSet) -> Path:
    return cache_root("accuracy") / f"{_stem(model, es, method)}_w{wgt_bits}a{act_bits}.json"


def _chunk_path(model: str, widths: tuple[int, int] | None, method: str | None, es: EvalSet, index: int) -> Path:
    """The top-1 classes of chunk ``index`` at ``widths`` (act_bits, wgt_bits), or of the float model (None)."""
    which = "float" if widths is None else f"w{widths[1]}a{widths[0]}"
    stem = _stem(model, es, None if widths is None else method)
    return cache_root("accuracy") / "chunks" / f"{stem}_{which}_c{index}.npy"


def model_accuracy(model: str, act_bits: int, wgt_bits: int, *, method: str | None = None,
                   samples: int = ACCURACY_SAMPLES) -> dict[str, Any]:
    """``{"accuracy": percent, "accuracy_on": what it was measured on, "accuracy_float": percent or None}`` of
    ``model`` (zoo name or ONNX path) quantized to ``act_bits`` / ``wgt_bits`` (8 or 4) with calibration ``method``
    (None: the shared minmax one); see the module docstring. Cached in the cache folder ``accuracy``."""
    es = eval_set(model, samples)
    path = _result_path(model, act_bits, wgt_bits, method, es)
    if path.is_file():
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass  # a damaged entry is measured again
    quant = np.concatenate([_chunk_tops(model, (act_bits, wgt_bits), method, es, i) for i in range(es.chunks)])
    floats = np.concatenate([_chunk_tops(model, None, None, es, i) for i in range(es.chunks)])
    if es.labelled:
        assert es.path is not None
        with np.load(es.path) as npz:
            labels = np.asarray(npz["y"])[:es.size]
        result = {"accuracy": 100.0 * float((quant == labels).mean()), "accuracy_on": es.on,
                  "accuracy_float": 100.0 * float((floats == labels).mean())}
    else:
        result = {"accuracy": 100.0 * float((quant == floats).mean()), "accuracy_on": es.on, "accuracy_float": None}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, sort_keys=True) + "\n")
    return result


@dataclass(frozen=True)
class AccuracyJob:
    """One chunk of ``model``'s evaluation set to evaluate at each of ``widths`` ((act_bits, wgt_bits) pairs) and
    on the float model: ``inputs`` inputs, ``samples`` as :func:`model_accuracy` takes it."""

    model: str
    chunk: int
    widths: tuple[tuple[int, int], ...]
    inputs: int
    samples: int = ACCURACY_SAMPLES


def accuracy_jobs(needed: Iterable[tuple[str, int, int]], *,
                  samples: int = ACCURACY_SAMPLES) -> tuple[list[AccuracyJob], dict[str, str]]:
    """The chunks still to evaluate for the (model, act_bits, wgt_bits) accuracies ``needed``, one job per chunk
    with every width pair it lacks, costliest (inputs x width pairs) first; and per model whose evaluation set
    cannot be named, why (its points then report the error themselves). Cheap: reads only the cache folder."""
    pairs: dict[str, set[tuple[int, int]]] = {}
    for model, act_bits, wgt_bits in needed:
        pairs.setdefault(model, set()).add((act_bits, wgt_bits))
    jobs: list[AccuracyJob] = []
    problems: dict[str, str] = {}
    for model, widths in pairs.items():
        try:
            es = eval_set(model, samples)
        except (ValueError, OSError) as err:
            problems[model] = f"{type(err).__name__}: {err}"
            continue
        todo = sorted(w for w in widths if not _result_path(model, w[0], w[1], None, es).is_file())
        for index in range(es.chunks):
            missing = tuple(w for w in todo if not _chunk_path(model, w, None, es, index).is_file())
            if missing:
                jobs.append(AccuracyJob(model, index, missing, len(es.span(index)), samples))
    jobs.sort(key=lambda j: -j.inputs * len(j.widths))
    return jobs, problems


def run_accuracy_job(job: AccuracyJob) -> AccuracyJob:
    """Evaluate ``job``'s chunk on the float model and at each of its widths (each result cached; one a worker is
    already computing is waited for, not computed again). Returns ``job``."""
    es = eval_set(job.model, job.samples)
    memo: dict[str, list[dict[str, np.ndarray]]] = {}
    _chunk_tops(job.model, None, None, es, job.chunk, memo)
    for widths in job.widths:
        _chunk_tops(job.model, widths, None, es, job.chunk, memo)
    return job


def _chunk_tops(model: str, widths: tuple[int, int] | None, method: str | None, es: EvalSet, index: int,
                memo: dict[str, list[dict[str, np.ndarray]]] | None = None) -> np.ndarray:
    """Top-1 class per input of chunk ``index`` of ``es``: quantized to ``widths`` (act_bits, wgt_bits) on the
    integer reference, or the float model's (None). Cached (``accuracy/chunks/``) and computed under the entry's
    file lock. ``memo`` keeps the chunk's inputs (key ``inputs``) for the job's next call."""
    path = _chunk_path(model, widths, method, es, index)

    def compute() -> np.ndarray:
        graph, _ = calibrated(model)
        if memo is not None and "inputs" in memo:
            inputs = memo["inputs"]
        else:
            inputs = chunk_inputs(es, graph, index)[0]
            if memo is not None:
                memo["inputs"] = inputs
        if widths is None:
            return _float_tops(model, graph, inputs)
        from vta.compiler.qops import run_reference
        qgraph = quantized(model, widths[0], widths[1], method)
        out = graph.outputs[0]
        return np.asarray([int(np.asarray(run_reference(qgraph, x)[out]).reshape(-1).argmax()) for x in inputs])

    return _cached_array(path, compute)


def _cached_array(path: Path, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """The int64 array saved at ``path``, else ``compute()``'s, saved there (atomically); computed under a file lock
    on the entry, so a second process waits for the first's result instead of computing it again."""
    def read() -> np.ndarray | None:
        try:
            return np.asarray(np.load(path, allow_pickle=False), np.int64)
        except (OSError, ValueError):
            return None  # missing, or damaged: computed (again)

    found = read() if path.is_file() else None
    if found is not None:
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    with entry_lock(path.parent, path.name):
        found = read() if path.is_file() else None
        if found is not None:
            return found
        values = np.asarray(compute(), np.int64)
        buffer = io.BytesIO()
        np.save(buffer, values, allow_pickle=False)
        atomic_write_bytes(path, buffer.getvalue())
        return values


_CALIBRATED: dict[str, tuple[Any, Any]] = {}
"""model -> (its float graph, its Calibration), measured once per process (see :func:`calibrated`)."""
_QUANTIZED: dict[tuple[str, int, int, str | None], Any] = {}
"""(model, act_bits, wgt_bits, method) -> the quantized graph, once per process (see :func:`quantized`)."""


def calibrated(model: str) -> tuple[Any, Any]:
    """``model``'s float graph and its calibration (:func:`vta.compiler.frontend.quantize.calibrate` of the prepared
    graph on :func:`vta.sweep.evalset.calibration_inputs`), once per process. Every width pair quantizes from it
    (``quantize(..., calibration=...)``), the sweep's compile and this accuracy alike."""
    if model not in _CALIBRATED:
        from vta.compiler.frontend.quantize import calibrate, prepare
        from vta.compiler.pipeline import load_graph
        graph = load_graph(model)
        _CALIBRATED[model] = (graph, calibrate(prepare(graph), calibration_inputs(model, graph)))
    return _CALIBRATED[model]


def quantized(model: str, act_bits: int, wgt_bits: int, method: str | None = None) -> Any:
    """``model`` quantized to ``act_bits`` / ``wgt_bits`` from its :func:`calibrated` ranges (``method``: calibrated
    again with that method on the same inputs), once per process: the graph the sweep compiles and this module
    evaluates."""
    key = (model, act_bits, wgt_bits, method)
    if key not in _QUANTIZED:
        from vta.compiler.frontend.quantize import calibrate, prepare, quantize
        graph, calibration = calibrated(model)
        if method is not None:
            calibration = calibrate(prepare(graph), calibration_inputs(model, graph), method=method)
        _QUANTIZED[key] = quantize(graph, {}, act_bits=act_bits, wgt_bits=wgt_bits, calibration=calibration)
    return _QUANTIZED[key]


def _onnx_path(model: str) -> str | None:
    """The ONNX file of ``model`` (a path, or the zoo's cached file), for onnxruntime; None when there is none."""
    if model.endswith(".onnx"):
        return model
    try:
        from vta.compiler.frontend.zoo import get_model
        return str(get_model(model))
    except (ValueError, OSError):
        return None


def _float_tops(model: str, graph: Any, inputs: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Top-1 of the float model per input: onnxruntime on the model's file where there is one (one session for all
    of ``inputs``), else the float reference."""
    out = graph.outputs[0]
    path = _onnx_path(model)
    session = None
    if path is not None:
        try:
            import onnxruntime as ort
            opts = ort.SessionOptions()
            opts.log_severity_level = 3
            session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        except ImportError:
            session = None
    tops = []
    for sample in inputs:
        if session is not None:
            feed = {i.name: np.asarray(sample[name], np.int64 if i.type == "tensor(int64)" else np.float32)
                    for i, name in zip(session.get_inputs(), graph.inputs)}
            values = session.run(None, feed)[0]
        else:
            from vta.compiler.frontend.float_ref import run_float
            values = run_float(graph, sample)[out]
        tops.append(int(np.asarray(values).reshape(-1).argmax()))
    return np.asarray(tops)


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


def _precision(row: dict[str, Any]) -> str:
    """``w8a8``-style name of a row's widths (``wWGTaINP``), from its config."""
    cfg = row.get("config") or {}
    return f"w{2 ** cfg.get('LOG_WGT_WIDTH', 3)}a{2 ** cfg.get('LOG_INP_WIDTH', 3)}"


def plot_accuracy(groups: dict[str, list[dict[str, Any]]], folder: str | os.PathLike[str]) -> list[Path]:
    """Per model with accuracy, one PNG ``accuracy_<model>.png``: accuracy against latency (ms when the latencies
    reach 10 ms), energy and area (the four-way front's 2D projections), every design grey and the front's designs
    marked, each accuracy level named by the precisions that reach it (``w8a8``). Returns the files."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    from vta.fileio import atomic_path
    written = []
    for model, rows in groups.items():
        valid = [r for r in rows if r.get("accuracy") is not None and r.get("status", "ok") == "ok"]
        if not valid:
            continue
        front = four_way_front(valid)
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
        for ax, (column, _, label) in zip(axes, OBJECTIVES[1:]):
            scale = 1.0
            if column == "latency_us" and max(r[column] for r in valid) >= 10_000:
                scale, label = 1e-3, "latency (ms)"
            ax.scatter([r[column] * scale for r in valid], [r["accuracy"] for r in valid], s=12, c="0.7",
                       label="designs")
            ax.scatter([r[column] * scale for r in front], [r["accuracy"] for r in front], s=30, c="C3",
                       label="four-way front")
            ax.xaxis.set_major_locator(MaxNLocator(6))
            top = max(r[column] * scale for r in valid)
            ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}" if top >= 100 else "{x:,.3g}"))
            ax.set_xlabel(label)
            ax.set_ylabel("accuracy (%)")
            ax.grid(alpha=0.3)
        levels: dict[float, set[str]] = {}
        for r in valid:
            levels.setdefault(r["accuracy"], set()).add(_precision(r))
        low, high = axes[2].get_ylim()
        y = low - high
        for acc in sorted(levels):  # which precisions reach each accuracy, beside the area plot, 5 % apart at least
            y = max(acc, y + 0.05 * (high - low))
            axes[2].annotate(", ".join(sorted(levels[acc], reverse=True)), (1.01, y),
                             xycoords=("axes fraction", "data"), va="center", fontsize=9)
        axes[0].legend(loc="best")
        fig.suptitle(f"{Path(model).stem}: accuracy against the other objectives\naccuracy: "
                     f"{valid[0].get('accuracy_on', '')}", fontsize=11)
        fig.tight_layout()
        path = Path(folder) / f"accuracy_{Path(model).stem}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
        plt.close(fig)
        written.append(path)
    return written
