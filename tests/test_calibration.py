"""Calibration from the user's data (compiler/frontend/calibration.py): .npz batches, folders of .npy files and of
images with their preprocessing, the entropy method, the record a compile keeps of it, and every bad file as one
error naming it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vta.cli import main
from vta.compiler.frontend.calibration import (
    HISTOGRAM_BINS,
    CalibrationError,
    entropy_threshold,
    load_calibration,
)
from vta.compiler.frontend.quantize import calibrate, prepare
from vta.compiler.options import CompileOptions
from vta.compiler.pipeline import calibration_set, compile_model, load_graph
from vta.config import VTAConfig


@pytest.fixture(scope="module")
def tiny():
    return load_graph("tiny_cnn")  # one input [1, 1, 8, 8]


def _samples(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 8, 8)).astype(np.float32)


def test_npz_and_npy_folder(tiny, tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", input=_samples(6))
    data = load_calibration(tmp_path / "d.npz", tiny)
    assert list(data) == ["input"] and data["input"].shape == (6, 1, 8, 8) and data["input"].dtype == np.float32
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", _samples(1)[0])            # one sample
    np.save(folder / "b.npy", _samples(3, 1).astype(np.float64))  # a batch of three
    data = load_calibration(folder, tiny)
    np.testing.assert_array_equal(data["input"][0], _samples(1)[0])
    np.testing.assert_array_equal(data["input"][1:], _samples(3, 1))
    np.save(tmp_path / "stacked.npy", _samples(5, 2))                 # one .npy of a one-input model's samples
    np.testing.assert_array_equal(load_calibration(tmp_path / "stacked.npy", tiny)["input"], _samples(5, 2))


def test_image_folder_and_its_preprocessing(tiny, tmp_path: Path) -> None:
    from PIL import Image
    Image.fromarray(np.full((20, 30), 255, np.uint8)).save(tmp_path / "white.png")
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(tmp_path / "black.jpg")
    raw = load_calibration(tmp_path, tiny, preprocess="raw")["input"]
    assert raw.shape == (2, 1, 8, 8)  # resized to the input's 8 x 8, grey for one channel; black.jpg sorts first
    assert (raw[0] == 0).all() and (raw[1] == 255).all()
    assert (load_calibration(tmp_path, tiny, preprocess="unit")["input"][1] == 1).all()
    imagenet = load_calibration(tmp_path, tiny, preprocess="imagenet")["input"]
    mean, std = np.mean([0.485, 0.456, 0.406]), np.mean([0.229, 0.224, 0.225])
    np.testing.assert_allclose(imagenet[:, 0, 0, 0], [-mean / std, (1 - mean) / std], rtol=1e-5)


@pytest.mark.parametrize("files,message", [
    ({"d.npz": {"images": _samples(2)}}, "d.npz: no array for input 'input'; the model's inputs are 'input' (the "
                                         "archive has 'images')"),
    ({"d.npz": {"input": _samples(2)[:, :, :4]}}, "d.npz: input 'input' has shape (2, 1, 4, 8); it takes [N, 1, 8, "
                                                  "8] (N samples, a multiple of the batch 1)"),
    ({"d.npz": {"input": np.array(["a", "b"])}}, "d.npz: input 'input' has dtype <U1; it takes numbers"),
    ({"d.npz": {"input": np.zeros((0, 1, 8, 8))}}, "d.npz: input 'input' has 0 samples; give a positive multiple "
                                                   "of the batch 1"),
    ({"d.npz": {"input": np.full((1, 1, 8, 8), np.nan)}}, "d.npz: input 'input' holds NaN or infinite values"),
    ({"d.npy": _samples(2)[:, :, :4]}, "d.npy: shape (2, 1, 4, 8); input 'input' takes one sample (1, 8, 8) or a "
                                       "batch [n, 1, 8, 8]"),
])
def test_bad_files_name_the_file_and_the_problem(tiny, tmp_path: Path, files, message: str) -> None:
    for name, content in files.items():
        if isinstance(content, dict):
            np.savez(tmp_path / name, **content)
        else:
            np.save(tmp_path / name, content)
    path = tmp_path / next(iter(files))
    with pytest.raises(CalibrationError) as err:
        load_calibration(path, tiny)
    assert str(err.value) == f"--calibration {tmp_path}/{message}"


def test_a_file_of_another_kind_is_named(tiny, tmp_path: Path) -> None:
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(CalibrationError, match=r"d\.txt: give an \.npz file of named input batches, an \.npy file of "
                                               r"one input's samples, or a folder of \.npy files or images, not a "
                                               r"\.txt file"):
        load_calibration(tmp_path / "d.txt", tiny)


def test_bad_folders(tiny, tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="the folder holds no .npy files and no images"):
        load_calibration(tmp_path, tiny)
    np.save(tmp_path / "a.npy", np.zeros((2, 8, 8)))
    with pytest.raises(CalibrationError) as err:
        load_calibration(tmp_path, tiny)
    assert str(err.value) == (f"--calibration {tmp_path}/a.npy: shape (2, 8, 8); input 'input' takes one sample "
                              f"(1, 8, 8) or a batch [n, 1, 8, 8]")
    (tmp_path / "b.png").write_bytes(b"not a png")
    with pytest.raises(CalibrationError, match="mixes .npy files and images"):
        load_calibration(tmp_path, tiny)


def test_without_pillow_images_are_a_clear_error(tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    (tmp_path / "a.png").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(CalibrationError, match=r"reading images needs Pillow \(pip install pillow\)"):
        load_calibration(tmp_path, tiny)


def test_entropy_threshold_exact() -> None:
    """A decaying bulk in the first 100 bins and one outlier in the last: the threshold keeps the bulk (129 bins)
    rather than stretching 128 levels over the outlier. A flat bulk is represented exactly by 128 levels over the
    whole range (16 bins each), so KL keeps it all: the method measures shape, not error. An empty histogram keeps
    the whole range."""
    hist = np.zeros(HISTOGRAM_BINS)
    hist[:100] = np.round(1000 * np.exp(-np.arange(100) / 30))
    hist[-1] = 1
    assert entropy_threshold(hist, 0.5) == 129 * 0.5
    hist[:100] = 1000
    assert entropy_threshold(hist, 0.5) == HISTOGRAM_BINS * 0.5
    assert entropy_threshold(np.zeros(HISTOGRAM_BINS), 0.5) == HISTOGRAM_BINS * 0.5


def test_entropy_clips_an_outlier_that_minmax_keeps(tiny) -> None:
    fg = prepare(tiny)
    x = _samples(8)
    x[0, 0, 0, 0] = 60.0  # one huge pixel
    minmax, entropy = calibrate(fg, {"input": x}), calibrate(fg, {"input": x}, method="entropy")
    inner = fg.nodes[0].outputs[0]
    assert entropy.absmax[inner] < 0.7 * minmax.absmax[inner]  # 33.7 against 52.6
    assert entropy.absmax["input"] == minmax.absmax["input"] == 60.0  # inputs and outputs keep the true maximum
    with pytest.raises(ValueError, match="Calibration method 'kl' is unknown; use one of minmax, percentile, entropy"):
        calibrate(fg, {"input": x}, method="kl")


def test_the_compile_records_its_calibration(tiny, tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", input=_samples(4))
    options = CompileOptions(calibration=str(tmp_path / "d.npz"), calibration_method="percentile", policy="accel")
    cal = calibration_set("tiny_cnn", tiny, options)
    assert cal.info == {"source": str(tmp_path / "d.npz"), "kind": "npz", "samples": 4, "method": "percentile",
                        "percentile": 99.99} and not cal.random
    assert compile_model("tiny_cnn", VTAConfig(), options).meta["calibration"] == cal.info
    random = calibration_set("tiny_cnn", tiny, CompileOptions(calib=3))
    assert random.random and random.info == {"source": "random normal", "seed": 1, "samples": 3, "method": "minmax"}


def test_cli_calibration_is_recorded_and_bad_data_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", input=_samples(4))
    code = main(["run", "tiny_cnn", "--calibration", str(tmp_path / "d.npz"), "--calibration-method", "entropy",
                 "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""  # no warning: calibrated on data
    assert f"calibration: {tmp_path / 'd.npz'} (npz, 4 samples, entropy)" in out
    np.savez(tmp_path / "bad.npz", x=_samples(4))
    assert main(["compile", "tiny_cnn", "-o", str(tmp_path / "m.vtac"), "--calibration", str(tmp_path / "bad.npz")]) \
        == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"vta: error: --calibration {tmp_path / 'bad.npz'}: no array for input 'input'; the "
                              f"model's inputs are 'input' (the archive has 'x')\n")
