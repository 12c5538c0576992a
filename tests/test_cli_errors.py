"""User errors reach the user as one plain line and exit code 2, before any work starts: the `vta` command's error
mapping (vta/cli.py main) for bad configs, model files, inputs, --force-cpu names and output paths."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from vta.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


RANDOM_CALIBRATION = "vta: warning: calibrated on 4 samples of RANDOM normal data (no --calibration)"
"""The start of the one line a run calibrated on random data prints on standard error."""


@pytest.fixture
def no_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiling is the work that must not start: any call fails the test."""
    def fail(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("compile_model was called before the input was checked")
    monkeypatch.setattr("vta.compiler.pipeline.compile_model", fail)


def relu_model(path: Path, shape: tuple[Any, ...] = ("N", 3)) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu_1")], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


# ---- configs ---------------------------------------------------------------------------------------------------------
def test_config_check_block_64(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "b64.toml"
    path.write_text("LOG_BLOCK = 6\nLOG_WGT_BUFF_SIZE = 15\n")
    assert run(capsys, "config", "check", str(path)) == (2, "", (
        f"vta: error: invalid VTA configuration in {path} (1 problem):\n"
        "  - LOG_BLOCK=6 (BLOCK 64) cannot be built: the generator's GEMM core stores a weight tile in one "
        "133120-bit SRAM word, wider than the 65536 bits an Amaranth netlist value can hold; use LOG_BLOCK at most "
        "5\n"))


# ---- model files -----------------------------------------------------------------------------------------------------
def test_empty_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    assert run(capsys, "run", str(path)) == (
        2, "", f"vta: error: The model {path} is empty (0 bytes), not an ONNX model file (.onnx).\n")


def test_not_a_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "notes.onnx"
    path.write_text("hello\n" * 10)
    code, out, err = run(capsys, "compile", str(path), "-o", str(tmp_path / "m.vtac"))
    assert code == 2 and out == ""
    assert err.startswith(f"vta: error: The model {path} is not an ONNX model file (.onnx), or it is truncated: its "
                          f"60 bytes do not decode as an ONNX protobuf (")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_model_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(capsys, "run", str(tmp_path)) == (
        2, "", f"vta: error: The model {tmp_path} is a folder, not an ONNX model file (.onnx).\n")


def test_missing_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A word that looks like a path (a suffix or a slash) is a missing file; the path is named."""
    assert run(capsys, "run", str(tmp_path / "nope.onnx")) == (
        2, "", f"vta: error: model file {tmp_path / 'nope.onnx'} does not exist\n")
    assert run(capsys, "compile", "model.vtac", "-o", str(tmp_path / "m.vtac")) == (
        2, "", "vta: error: model file model.vtac does not exist\n")
    assert run(capsys, "run", "models/resnet")[2] == "vta: error: model file models/resnet does not exist\n"


def test_unknown_zoo_model_suggests_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    from vta.compiler.frontend.zoo import list_models
    zoo = ", ".join(list_models())
    assert run(capsys, "run", "resnet81") == (
        2, "", f"vta: error: model 'resnet81' is not a zoo model (did you mean resnet18?) and not a file; zoo models "
               f"are {zoo}\n")
    assert run(capsys, "run", "frobnicate")[2] == (f"vta: error: model 'frobnicate' is not a zoo model and not a file; "
                                                   f"zoo models are {zoo}\n")


def test_unknown_config_key_suggests_the_closest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("LOG_BLOK = 4\nlog_batches = 0\n")
    code, out, err = run(capsys, "config", "check", str(path))
    assert (code, out) == (2, "")
    assert "  - unknown key 'LOG_BLOK' (did you mean LOG_BLOCK?); known keys are ALU_PIPELINE, BUS_BYTES, " in err
    assert "  - unknown key 'log_batches' (did you mean log_batch?); known keys are ALU_PIPELINE, BUS_BYTES, " in err


def test_a_mistyped_option_shows_the_subcommand_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """A subcommand's unknown option: that subcommand's usage, then one `vta: error:` line with the closest option."""
    code, out, err = run(capsys, "run", "--taget", "tsim")
    assert (code, out) == (2, "")
    assert err.startswith("usage: vta run [-h] [--target {")
    assert err.splitlines()[-1] == "vta: error: unrecognized arguments: --taget (did you mean --target?)"
    code, _, err = run(capsys, "config", "show", "--jsn")
    assert (code, err) == (2, "usage: vta config show [-h] [--config FILE] [--json]\n"
                              "vta: error: unrecognized arguments: --jsn (did you mean --json?)\n")
    code, _, err = run(capsys, "config", "show", "--zzz")
    assert err.splitlines()[-1] == "vta: error: unrecognized arguments: --zzz"


def test_unsupported_opset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = relu_model(tmp_path / "m.onnx")
    model = onnx.load(path)
    model.opset_import[0].version = 6
    onnx.save(model, path)
    assert run(capsys, "run", str(path)) == (
        2, "", f"vta: error: The model {path} uses ONNX opset 6; the frontend supports opsets 13 to 28 (convert it, "
               f"e.g. with onnx.version_converter.convert_version).\n")


def test_symbolic_dims_need_input_shape(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = relu_model(tmp_path / "m.onnx", ("N", 3, "H", "W"))
    assert run(capsys, "run", str(path), "--no-progress") == (
        2, "", f"vta: error: The model {path} has input 'x' of shape Nx3xHxW, with symbolic or unknown dimensions "
               f"(H, W) besides the batch; give its whole shape, e.g. --input-shape x=1x3x224x224.\n")
    code, out, err = run(capsys, "run", str(path), "--no-progress", "--input-shape", "x=1x3x4x5")
    assert (code, err.count("\n")) == (0, 1) and err.startswith(RANDOM_CALIBRATION)
    assert "matches_integer_reference: True" in out


def test_input_shape_syntax(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "compile", "tiny_cnn", "-o", str(tmp_path / "m.vtac"), "--input-shape", "x=1x3xH")
    assert code == 2
    assert err.endswith("argument --input-shape: 'x=1x3xH' is not NAME=SHAPE with dimensions of 0 or more joined by "
                        "x, e.g. images=1x3x224x224 (0 only for an input the graph may leave unread, such as a "
                        "prompt's empty KV cache past_key_values.0.key=1x8x0x64)\n")


# ---- inputs ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    (np.array([[1.0, np.nan, np.inf]], np.float32), "holds 1 NaN and 1 infinite values; the model's input 'x' must "
                                                    "be finite."),
    (np.array([[1e39, 0.0, 0.0]]), "holds 0 NaN and 1 infinite values (values beyond float32's range become "
                                   "infinite); the model's input 'x' must be finite."),
    (np.array([["a", "b", "c"]]), "has dtype <U1; the model's input 'x' takes numbers (bool, integer or float, "
                                  "converted to float32)."),
    (np.zeros((2, 3), np.float32), "has shape (2, 3); the model's input 'x' has shape (1, 3)."),
])
def test_bad_input_arrays(capsys: pytest.CaptureFixture[str], tmp_path: Path, no_compile: None, value: np.ndarray,
                          message: str) -> None:
    model = relu_model(tmp_path / "m.onnx")
    path = tmp_path / "in.npy"
    np.save(path, value)
    assert run(capsys, "run", str(model), "--input", str(path)) == (2, "", f"vta: error: --input {path} {message}\n")


def test_object_array_input_is_not_unpickled(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             no_compile: None) -> None:
    model = relu_model(tmp_path / "m.onnx")
    path = tmp_path / "in.npy"
    np.save(path, np.array([[1, "a", None]], dtype=object), allow_pickle=True)
    assert run(capsys, "run", str(model), "--input", str(path)) == (
        2, "", f"vta: error: --input {path} is not a .npy array of numbers (Object arrays cannot be loaded when "
               f"allow_pickle=False); save one with numpy.save.\n")


def test_input_file_missing_or_npz(capsys: pytest.CaptureFixture[str], tmp_path: Path, no_compile: None) -> None:
    model = relu_model(tmp_path / "m.onnx")
    assert run(capsys, "run", str(model), "--input", str(tmp_path / "no.npy")) == (
        2, "", f"vta: error: Cannot read --input {tmp_path / 'no.npy'}: No such file or directory.\n")
    npz = tmp_path / "in.npz"                   # an .npz gives the inputs by name (a multi-input model's way)
    np.savez(npz, images=np.zeros((1, 3)))
    assert run(capsys, "run", str(model), "--input", str(npz)) == (
        2, "", f"vta: error: --input {npz} gives 'images'; the model's inputs are 'x'.\n")
    renamed = tmp_path / "in.npy"                # an .npz archive under a .npy name
    npz.rename(renamed)
    assert run(capsys, "run", str(model), "--input", str(renamed)) == (
        2, "", f"vta: error: --input {renamed} is an .npz archive; give a .npy file holding one array (numpy.save).\n")


def test_random_inputs_are_finite() -> None:
    from vta.compiler.pipeline import load_graph, random_inputs
    graph = load_graph("tiny_cnn")
    for seed in range(5):
        assert all(np.isfinite(v).all() for v in random_inputs(graph, seed, samples=3).values())


# ---- --force-cpu -----------------------------------------------------------------------------------------------------
def test_force_cpu_unknown_node(capsys: pytest.CaptureFixture[str], no_compile: None) -> None:
    assert run(capsys, "run", "tiny_cnn", "--force-cpu", "conv3") == (
        2, "", "vta: error: --force-cpu conv3: the model has no node named 'conv3'; the closest are conv_3, conv_7.\n")
    code, _, err = run(capsys, "run", "tiny_cnn", "--force-cpu", "zzzz")
    assert code == 2
    assert err == ("vta: error: --force-cpu zzzz: the model has no node named 'zzzz'; its nodes are conv_3, relu_4, "
                   "conv_7, relu_8, flatten_9, gemm_12.\n")
    code, _, err = run(capsys, "run", "tiny_cnn", "--force-cpu", "conv3", "--force-cpu", "relu_4", "--force-cpu", "")
    assert code == 2 and err.count("the model has no node named") == 2      # every bad name, not the first only


# ---- output paths ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("option, name, message", [
    ("--plot", "x.jpg", "a plot is written as .png, .svg or .pdf, not .jpg"),
    ("--plot", "x", "a plot is written as .png, .svg or .pdf, not a file without suffix"),
    ("--report-json", "r.txt", "a JSON report is written as .json, not .txt"),
    ("--report-csv", "r.json", "a CSV report is written as .csv, not .json"),
])
def test_output_suffix(capsys: pytest.CaptureFixture[str], tmp_path: Path, no_compile: None, option: str, name: str,
                       message: str) -> None:
    path = tmp_path / name
    assert run(capsys, "run", "tiny_cnn", option, str(path)) == (2, "", f"vta: error: {option} {path}: {message}\n")


def test_output_folder_missing_or_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                           no_compile: None) -> None:
    path = tmp_path / "nowhere" / "r.json"
    assert run(capsys, "run", "tiny_cnn", "--report-json", str(path)) == (
        2, "", f"vta: error: --report-json {path}: the folder {tmp_path / 'nowhere'} does not exist; create it first\n")
    folder = tmp_path / "d.csv"
    folder.mkdir()
    assert run(capsys, "run", "tiny_cnn", "--report-csv", str(folder)) == (
        2, "", f"vta: error: --report-csv {folder}: that is a folder; give a file name ending .csv\n")


def test_output_folder_not_writable(capsys: pytest.CaptureFixture[str], tmp_path: Path, no_compile: None,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.access", lambda path, mode: False)  # root may write anywhere; pretend it may not
    path = tmp_path / "p.svg"
    assert run(capsys, "run", "tiny_cnn", "--plot", str(path)) == (
        2, "", f"vta: error: --plot {path}: the folder {tmp_path} is not writable\n")


def test_compile_output_suffix(capsys: pytest.CaptureFixture[str], tmp_path: Path, no_compile: None) -> None:
    path = tmp_path / "m.onnx"
    assert run(capsys, "compile", "tiny_cnn", "-o", str(path)) == (
        2, "", f"vta: error: -o {path}: a compiled artefact is written as .vtac, not .onnx\n")


def test_compile_bad_batch_and_calib(capsys: pytest.CaptureFixture[str], tmp_path: Path, no_compile: None) -> None:
    out = str(tmp_path / "m.vtac")
    assert run(capsys, "compile", "tiny_cnn", "-o", out, "--batch", "0") == (
        2, "", "vta: error: --batch must be at least 1 (images per inference), not 0\n")
    assert run(capsys, "compile", "tiny_cnn", "-o", out, "--calib", "-1") == (
        2, "", "vta: error: --calib must be at least 1 (calibration samples), not -1\n")
    missing = tmp_path / "nope.npz"
    assert run(capsys, "compile", "tiny_cnn", "-o", out, "--calibration", str(missing)) == (
        2, "", f"vta: error: --calibration {missing}: no such file or folder\n")
    assert run(capsys, "compile", "tiny_cnn", "-o", out, "--calibration-percentile", "20") == (
        2, "", "vta: error: calibration_percentile=20.0 must lie in [50, 100] (a percentile of the magnitudes, e.g. "
               "99.99)\n")


# ---- the mapping itself ----------------------------------------------------------------------------------------------
def test_os_error_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(args: Any) -> int:
        raise PermissionError(13, "Permission denied", "/x/out.v")
    monkeypatch.setattr("vta.cli._cmd_config_show", fail)
    assert run(capsys, "config", "show") == (2, "", "vta: error: /x/out.v: Permission denied\n")


def test_a_bug_still_shows_its_traceback(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(args: Any) -> int:
        return [][1]  # type: ignore[no-any-return]
    monkeypatch.setattr("vta.cli._cmd_config_show", fail)
    code, _, err = run(capsys, "config", "show")
    assert code == 1 and "Traceback" in err and err.rstrip().endswith("IndexError: list index out of range")


def test_compile_options_on_an_artefact_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`vta run MODEL.vtac` with a compile option changed: exit 2 naming the options (the artefact keeps its own
    choices; ignoring the option silently would report a run that was not asked for); without one it runs."""
    artefact = tmp_path / "m.vtac"
    assert run(capsys, "compile", "tiny_cnn", "-o", str(artefact), "--no-progress")[0] == 0
    code, out, err = run(capsys, "run", str(artefact), "--requant", "shift")
    assert (code, out) == (2, "")
    assert err.startswith(f"vta: error: --requant is a compile option: {artefact} was compiled already")
    code, _, err = run(capsys, "run", str(artefact), "--stem", "im2col", "--force-cpu", "conv_3")
    assert code == 2 and err.startswith("vta: error: --stem, --force-cpu are compile options:")
    code, _, err = run(capsys, "run", str(artefact), "--calibration-method", "entropy")
    assert code == 2 and err.startswith("vta: error: --calibration-method is a compile option:")
    code, out, err = run(capsys, "run", str(artefact), "--no-progress")
    assert code == 0 and "matches_integer_reference: True" in out and err.startswith(RANDOM_CALIBRATION)


def test_a_closed_pipe_is_not_bad_input(monkeypatch, capsys):
    """`vta config show | head -1`: the reader stops, the next write raises BrokenPipeError. That is no user error:
    exit 141 (128 + SIGPIPE, as a shell reports it), nothing on standard error (it said `vta: error: Broken pipe`
    and exited 2, which the exit-code table reserves for bad input)."""
    import sys

    class Closed:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["config", "show"]) == 141
    assert capsys.readouterr().err == ""
