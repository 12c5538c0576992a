"""Accuracy on every run (compiler/cli.py, compiler/report.py): `vta run` states its error against the float model
(ONNX Runtime on the ONNX file), saves the outputs with --output, fails an --accuracy-budget with exit 1, and
`vta report` shows the same figures again (also reading the old key bit_exact_vs_reference)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.cli import main
from vta.compiler.report import budget_failure, parse_budget


def small_classifier(path: Path) -> Path:
    """x [1, 3, 8, 8] -> Conv 3->16 3x3 -> Relu -> GlobalAveragePool -> Flatten -> Gemm 16->10 -> y [1, 10]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b1"),
             numpy_helper.from_array(rng.standard_normal((10, 16)).astype(np.float32) * 0.3, "w2"),
             numpy_helper.from_array(rng.standard_normal(10).astype(np.float32) * 0.1, "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("acc")
    rng = np.random.default_rng(1)
    np.savez(folder / "data.npz", x=rng.uniform(0, 1, (16, 3, 8, 8)).astype(np.float32))
    np.save(folder / "x.npy", rng.uniform(0, 1, (1, 3, 8, 8)).astype(np.float32))
    return {"model": small_classifier(folder / "model.onnx"), "data": folder / "data.npz", "x": folder / "x.npy",
            "folder": folder}


def test_run_states_the_error_against_float_and_saves_outputs(capsys: pytest.CaptureFixture[str],
                                                               files: dict[str, Path]) -> None:
    folder = files["folder"]
    code = main(["run", str(files["model"]), "--calibration", str(files["data"]), "--input", str(files["x"]),
                 "--output", str(folder / "out.npz"), "--report-json", str(folder / "r.json"), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    assert f"error against the float model (onnxruntime on {files['model']}):" in out
    report = json.loads((folder / "r.json").read_text())
    acc = report["accuracy"]
    assert acc["reference"] == f"onnxruntime on {files['model']}" and list(acc["outputs"]) == ["y"]
    y = acc["outputs"]["y"]
    assert set(y) == {"max_abs_error_lsb", "mean_abs_error_lsb", "max_error_pct_of_range", "mean_error_pct_of_range",
                      "cosine", "top1_agreement", "top5_agreement"}
    assert y["cosine"] > 0.99 and y["max_error_pct_of_range"] < 5 and y["top1_agreement"] == 1.0
    assert report["matches_integer_reference"] is True
    assert report["calibration"] == {"source": str(files["data"]), "kind": "npz", "samples": 16, "method": "minmax"}
    saved = np.load(folder / "out.npz")
    assert list(saved) == ["y"] and saved["y"].shape == (1, 10)
    import onnxruntime as ort
    want = ort.InferenceSession(str(files["model"])).run(None, {"x": np.load(files["x"])})[0]
    assert np.abs(saved["y"] - want).max() == pytest.approx(y["max_error_pct_of_range"] / 100 * np.ptp(want))
    code = main(["report", str(folder / "r.json")])
    again = capsys.readouterr().out
    assert code == 0 and f"  y: max {y['max_abs_error_lsb']:.3g} LSB" in again
    old = dict(report)  # a report written before the rename has only the old key
    old["bit_exact_vs_reference"] = old.pop("matches_integer_reference")
    (folder / "old.json").write_text(json.dumps(old))
    assert main(["report", str(folder / "old.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["matches_integer_reference"] is True


def test_an_exceeded_budget_exits_1(capsys: pytest.CaptureFixture[str], files: dict[str, Path]) -> None:
    args = ["run", str(files["model"]), "--calibration", str(files["data"]), "--input", str(files["x"]),
            "--no-progress", "--accuracy-budget"]
    assert main(args + ["0.001%"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vta: error: accuracy budget exceeded on output 'y': max error ") and \
        err.endswith(f"% of the float output's range > 0.001% (against onnxruntime on {files['model']})\n")
    assert main(args + ["cosine>=0.5"]) == 0
    capsys.readouterr()
    assert main(args + ["cosine>0.5"]) == 2
    assert capsys.readouterr().err == (
        "vta: error: --accuracy-budget 'cosine>0.5' is not a budget; give the largest error as % of the float output's "
        "range (e.g. 2 or 2%), or cosine>=V, top1>=V or top5>=V with V in [0, 1] (e.g. cosine>=0.99)\n")


def test_budget_syntax() -> None:
    assert parse_budget("2") == parse_budget("2 %") == ("max_error_pct_of_range", 2.0)
    assert parse_budget("Cosine>=0.99") == ("cosine", 0.99) and parse_budget("top5>=1") == ("top5_agreement", 1.0)
    for bad in ("-1", "top1>=2", "snr>=3", ""):
        with pytest.raises(ValueError, match="is not a budget"):
            parse_budget(bad)
    acc = {"reference": "r", "outputs": {"y": {"max_error_pct_of_range": 1.0, "cosine": 0.9}}}
    assert budget_failure(acc, "1") is None
    assert budget_failure(acc, "cosine>=0.95") == "accuracy budget exceeded on output 'y': cosine 0.9 < 0.95 " \
                                                  "(against r)"
    with pytest.raises(ValueError, match="no output has top1_agreement"):
        budget_failure(acc, "top1>=0.5")
