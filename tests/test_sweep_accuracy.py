"""vta.sweep.accuracy and vta.sweep.evalset: evaluation sets and their chunks, the accuracy measured once per sweep
(chunk files computed once under a lock, jobs for what the cache lacks), results equal to a direct computation; the
four-way front; the reduced ImageNet precision sweep (slow)."""
from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.sweep import accuracy as A
from vta.sweep.evalset import CHUNK, calibration_inputs, chunk_inputs, eval_set

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    A._CALIBRATED.clear()
    A._QUANTIZED.clear()
    return tmp_path / "cache"


def _classifier(path: Path, labelled: bool, count: int = 100) -> Path:
    """x [1, 4] -> Gemm 4->6 -> Relu -> Gemm 6->3 -> y [1, 3], and ``x.eval.npz`` with ``count`` inputs (labels: the
    float model's class on all but every tenth input, 20 calibration inputs)."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((3, 6)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    x = rng.standard_normal((count, 4)).astype(np.float32)  # stacked along the batch axis of x [1, 4]
    data = {"x": x, "calib": rng.standard_normal((20, 4)).astype(np.float32)}
    if labelled:
        w1, w2 = (numpy_helper.to_array(i) for i in inits)
        y = (np.maximum(x @ w1.T, 0) @ w2.T).argmax(axis=1)
        y[::10] = (y[::10] + 1) % 3
        data["y"] = y
    np.savez(path.with_suffix(".eval.npz"), **data)
    return path


def _direct(model: str, act_bits: int, wgt_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 per input of the whole evaluation set, quantized and float, without chunks or caches: the slow path."""
    import onnxruntime as ort

    from vta.compiler.frontend.quantize import calibrate, prepare, quantize
    from vta.compiler.pipeline import load_graph
    from vta.compiler.qops import run_reference
    graph = load_graph(model)
    es = eval_set(model, A.ACCURACY_SAMPLES)
    qgraph = quantize(graph, {}, act_bits=act_bits, wgt_bits=wgt_bits,
                      calibration=calibrate(prepare(graph), calibration_inputs(model, graph)))
    inputs = [x for i in range(es.chunks) for x in chunk_inputs(es, graph, i)[0]]
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    out = graph.outputs[0]
    q = np.array([run_reference(qgraph, x)[out].argmax() for x in inputs])
    f = np.array([session.run(None, {graph.inputs[0]: x[graph.inputs[0]]})[0].argmax() for x in inputs])
    return q, f


def test_eval_sets_and_chunks(cache: Path, tmp_path: Path) -> None:
    path = _classifier(tmp_path / "m.onnx", labelled=True, count=150)
    es = eval_set(str(path), 32)
    assert (es.kind, es.size, es.chunk, es.chunks, es.labelled) == ("file", 150, CHUNK, 3, True)
    assert es.on == "150 inputs of m.eval.npz (test accuracy, labels)"
    assert [len(es.span(i)) for i in range(3)] == [72, 72, 6] and es.span(2) == range(144, 150)
    with pytest.raises(ValueError, match=r"chunk 3 is not one of the 3 chunks of .*m.onnx's evaluation set "
                                         r"\(150 inputs\)\."):
        es.span(3)
    rnd = eval_set("resnet18", 32)
    assert (rnd.kind, rnd.key, rnd.size, rnd.chunks, rnd.labelled) == ("random", "n32", 32, 1, False)
    assert rnd.on == "top-1 agreement with float32 on 32 seeded random inputs"
    with pytest.raises(ValueError, match=r"samples must be a positive number of random inputs, not 0\."):
        eval_set("resnet18", 0)
    with pytest.raises(ValueError, match=r"'resnet19' is neither an ONNX file nor a zoo model \(bert_base, "):
        eval_set("resnet19", 32)
    photos = eval_set("efficientnet_lite0", 32)
    assert (photos.kind, photos.size, photos.chunk, photos.chunks) == ("photos", 504, 72, 7)
    assert photos.on == ("top-1 agreement with float32 on 504 inputs derived from 7 photos (72 variants each, seed 2; "
                         "calibrated on 14, seed 1)")
    from vta.compiler.pipeline import load_graph
    graph = load_graph(str(path))
    inputs, labels = chunk_inputs(es, graph, 2)
    with np.load(path.with_suffix(".eval.npz")) as npz:
        np.testing.assert_array_equal(np.concatenate([x["x"] for x in inputs]), npz["x"][144:150])
        np.testing.assert_array_equal(labels, npz["y"][144:150])
        np.testing.assert_array_equal(calibration_inputs(str(path), graph)["x"], npz["calib"])


def test_photo_chunks_are_the_derived_set() -> None:
    pytest.importorskip("skimage")
    from vta.compiler.frontend.derived_photos import EVAL_SEED, derived_inputs
    from vta.compiler.frontend.efficientnet import sample_images
    from vta.sweep.evalset import _photo_variants
    whole, _ = derived_inputs(sample_images(), 2, seed=EVAL_SEED)
    for photo in (0, 6):  # one photo's variants made alone equal its rows of the whole set
        np.testing.assert_array_equal(_photo_variants(photo, range(2)), whole[2 * photo:2 * photo + 2])


@pytest.mark.parametrize("labelled", [True, False])
def test_accuracy_equals_the_direct_computation_and_is_cached(cache: Path, tmp_path: Path, labelled: bool) -> None:
    model = str(_classifier(tmp_path / "m.onnx", labelled=labelled, count=150))
    q, f = _direct(model, 8, 4)
    got = A.model_accuracy(model, 8, 4)
    if labelled:
        with np.load(tmp_path / "m.eval.npz") as npz:
            y = npz["y"]
        assert got == {"accuracy": 100 * float((q == y).mean()), "accuracy_float": 90.0,
                       "accuracy_on": "150 inputs of m.eval.npz (test accuracy, labels)"}
    else:
        assert got == {"accuracy": 100 * float((q == f).mean()), "accuracy_float": None,
                       "accuracy_on": "150 inputs of m.eval.npz (top-1 agreement with float32)"}
    chunks = sorted(p.name.rsplit("_", 2)[-2:][0] + "_" + p.name.rsplit("_", 1)[1]
                    for p in (cache / "accuracy" / "chunks").glob("*.npy"))
    assert chunks == ["float_c0.npy", "float_c1.npy", "float_c2.npy", "w4a8_c0.npy", "w4a8_c1.npy", "w4a8_c2.npy"]
    A._CALIBRATED.clear()  # the result file answers without a graph
    assert A.model_accuracy(model, 8, 4) == got and model not in A._CALIBRATED


def test_jobs_list_what_the_cache_lacks(cache: Path, tmp_path: Path) -> None:
    model = str(_classifier(tmp_path / "m.onnx", labelled=False, count=150))
    jobs, problems = A.accuracy_jobs([(model, 8, 8), (model, 4, 4), (model, 8, 8), ("resnet18", 8, 8),
                                      ("nope.onnx", 8, 8)])
    assert [(j.model, j.chunk, j.widths, j.inputs) for j in jobs] == [
        (model, 0, ((4, 4), (8, 8)), 72), (model, 1, ((4, 4), (8, 8)), 72), ("resnet18", 0, ((8, 8),), 32),
        (model, 2, ((4, 4), (8, 8)), 6)]
    assert problems == {"nope.onnx": "ValueError: the model file nope.onnx does not exist, so it has no evaluation "
                                     "set."}
    A.run_accuracy_job(jobs[1])
    jobs, _ = A.accuracy_jobs([(model, 8, 8), (model, 4, 4)])
    assert [j.chunk for j in jobs] == [0, 2]
    A.model_accuracy(model, 8, 8)  # the result file: no job at all for that pair
    jobs, _ = A.accuracy_jobs([(model, 8, 8), (model, 4, 4)])
    assert [(j.chunk, j.widths) for j in jobs] == [(0, ((4, 4),)), (2, ((4, 4),))]


def _compute_slowly(path: str, out: str) -> None:
    import time

    def compute() -> np.ndarray:
        with open(out, "a") as f:
            f.write("computed\n")
        time.sleep(0.5)
        return np.arange(5)

    A._cached_array(Path(path), compute)


def test_a_chunk_is_computed_once_across_processes(tmp_path: Path) -> None:
    path, log = tmp_path / "c" / "x.npy", tmp_path / "log.txt"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_compute_slowly, args=(str(path), str(log))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert log.read_text() == "computed\n"  # the second process waited for the first's result
    np.testing.assert_array_equal(np.load(path), np.arange(5))
    path.write_bytes(b"damaged")  # a damaged entry is computed again
    np.testing.assert_array_equal(A._cached_array(path, lambda: np.arange(3)), np.arange(3))


def test_four_way_front_exact() -> None:
    def row(name: str, acc: float, lat: float, energy: float, area: float) -> dict[str, object]:
        return {"design": name, "accuracy": acc, "latency_us": lat, "energy_total_uj": energy, "area_clb": area,
                "status": "ok"}
    rows = [row("a", 90, 10, 5, 100), row("b", 80, 5, 5, 100), row("c", 80, 12, 6, 100), row("d", 90, 10, 5, 100),
            row("e", 10, 1, 1, 1), {**row("f", 99, 1, 1, 1), "status": "failed"}, {**row("g", 0, 0, 0, 0),
                                                                                     "accuracy": None}]
    assert [r["design"] for r in A.four_way_front(rows)] == ["a", "b", "e"]


def test_plot_accuracy_writes_one_png_per_model_with_accuracy(tmp_path: Path) -> None:
    def row(lat: float, acc: float | None, wgt: int) -> dict[str, object]:
        return {"design": f"d{lat}", "accuracy": acc, "latency_us": lat, "energy_total_uj": lat / 10,
                "area_clb": 1000 + lat / 100, "status": "ok", "config": {"LOG_WGT_WIDTH": wgt, "LOG_INP_WIDTH": 3},
                "accuracy_on": "top-1 agreement with float32 on 32 seeded random inputs"}
    groups = {"resnet18": [row(300_000, 90.6, 3), row(310_000, 53.1, 2), row(1_000_000, 90.6, 3)],
              "mini_resnet": [row(100, None, 3)]}
    written = A.plot_accuracy(groups, tmp_path)
    assert written == [tmp_path / "accuracy_resnet18.png"] and written[0].stat().st_size > 10_000
    assert A._precision(groups["resnet18"][1]) == "w4a8" and A._precision({"config": {}}) == "w8a8"


@pytest.mark.slow
def test_reduced_imagenet_precision_sweep(tmp_path: Path) -> None:
    """scripts/sweeps/precision_imagenet.toml reduced to 2 designs (int8 and int4 weights at BLOCK 16): both models,
    2 workers, a cold cache; the accuracies equal the direct computation (ResNet-18) and the chunk files (EfficientNet
    -Lite0), the front and plots are written."""
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("skimage")
    spec = tmp_path / "p.toml"
    spec.write_text('[sweep]\nmodels = ["resnet18", "efficientnet_lite0"]\nmode = "model"\ntimeout = 900\n'
                    "[vary]\nLOG_WGT_WIDTH = [2, 3]\n")
    env = {**os.environ, "VTA_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "vta", "sweep", str(spec), "--workers", "2", "--no-progress",
                          "--db", str(tmp_path / "p.sqlite"), "--plot-dir", str(tmp_path / "plots")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    con = sqlite3.connect(tmp_path / "p.sqlite")
    rows = {(m, json.loads(c)["LOG_WGT_WIDTH"]): (a, on, s) for m, c, a, on, s in con.execute(
        "SELECT model, config, accuracy, accuracy_on, status FROM points")}
    con.close()
    assert len(rows) == 4 and {s for _, _, s in rows.values()} == {"ok"}
    old = os.environ.get("VTA_CACHE_DIR")
    os.environ["VTA_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        es = eval_set("efficientnet_lite0", 32)
        for log_wgt, widths in ((3, (8, 8)), (2, (8, 4))):
            q, f = _direct_resnet18(*widths)
            assert rows[("resnet18", log_wgt)][0] == 100 * float((q == f).mean())
            chunks = [(np.load(A._chunk_path("efficientnet_lite0", widths, None, es, i)),
                       np.load(A._chunk_path("efficientnet_lite0", None, None, es, i))) for i in range(7)]
            agree = np.concatenate([a == b for a, b in chunks])
            assert len(agree) == 504 and rows[("efficientnet_lite0", log_wgt)][0] == 100 * float(agree.mean())
            assert rows[("efficientnet_lite0", log_wgt)][1] == es.on
    finally:
        if old is None:
            del os.environ["VTA_CACHE_DIR"]
        else:
            os.environ["VTA_CACHE_DIR"] = old
    assert out.count("four-way front") >= 2
    for name in ("accuracy_resnet18.png", "accuracy_efficientnet_lite0.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 10_000


def _direct_resnet18(act_bits: int, wgt_bits: int) -> tuple[np.ndarray, np.ndarray]:
    from vta.compiler.frontend.zoo import get_model
    return _direct(str(get_model("resnet18")), act_bits, wgt_bits)
