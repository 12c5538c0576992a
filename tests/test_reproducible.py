"""Compilation is reproducible: the same model, config and options give the same ``.vtac`` bytes whatever BLAS
kernel (``OPENBLAS_CORETYPE``) and thread count the host's numpy uses, and from one run to the next
(scripts/check_reproducible.py; the float reference's products are exact,
:func:`vta.compiler.frontend.float_ref.exact_matmul`, and the artefact stores no wall times). A difference names the
parts that differ, not only a digest."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from vta.compiler.frontend import float_ref
from vta.compiler.pipeline import compile_model
from vta.config import VTAConfig

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "check_reproducible.py"


def _script():
    spec = importlib.util.spec_from_file_location("check_reproducible", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_cnn_and_mini_resnet_compile_to_the_same_bytes_under_four_blas_kernels(tmp_path):
    """Haswell (2 threads), SkylakeX (1), Prescott (2), Zen (1): each compile in its own process, with its own
    empty cache, so the zoo's model files (whose BatchNorm statistics come from the float reference) are built anew."""
    check = _script()
    results = {env: check.compile_in(env, ["tiny_cnn", "mini_resnet"], tmp_path) for env in check.DEFAULT_ENVS}
    assert len(results) >= 3
    moved = check.compare(results)
    assert not moved, "\n".join(moved)


def test_two_compiles_in_one_process_write_the_same_bytes(tmp_path):
    for k in range(2):
        compile_model("tiny_cnn", VTAConfig(), calib=2).save(tmp_path / f"{k}.vtac")
    assert (tmp_path / "0.vtac").read_bytes() == (tmp_path / "1.vtac").read_bytes()


def test_compare_names_the_parts_that_differ():
    check = _script()
    same = {"sha256": "a", "parts": {"scales": "1", "conv_3 w": "2"}}
    other = {"sha256": "b", "parts": {"scales": "1", "conv_3 w": "3"}}
    lines = check.compare({"Haswell": {"m": same}, "Zen": {"m": same}, "Prescott": {"m": other}})
    assert len(lines) == 1 and lines[0].startswith("m: the .vtac compiled under Prescott differs from Haswell's")
    assert "\n  conv_3 w: 2 in Haswell, 3 in Prescott -- a layer's packed weights" in lines[0]


def test_exact_matmul_is_exact_on_the_rounded_operands():
    """Every product and partial sum is an integer below 2**53, so any summation order gives the same bits; the
    result is within 2**-19 of each row's and column's largest magnitude of the float product."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((5, 40, 4608)) * np.logspace(-3, 3, 4608)).astype(np.float32)
    b = rng.standard_normal((5, 4608, 7)).astype(np.float32)
    got = float_ref.exact_matmul(a, b)
    assert got.dtype == np.float64 and got.shape == (5, 40, 7)
    by_rows = np.stack([float_ref.exact_matmul(a[:, i:i + 1], b)[:, 0] for i in range(40)], axis=1)
    assert np.array_equal(got, by_rows)  # another BLAS call shape, another order: the same bits
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    bound = np.abs(a).max(axis=-1, keepdims=True) * np.abs(b).max(axis=-2, keepdims=True) * 4608 * 2.0 ** -19
    assert (np.abs(got - ref) <= bound).all()


def test_exact_matmul_of_zeros_and_non_finite_values():
    assert np.array_equal(float_ref.exact_matmul(np.zeros((2, 3)), np.ones((3, 4))), np.zeros((2, 4)))
    out = float_ref.exact_matmul(np.array([[np.inf, 1.0]]), np.ones((2, 1)))
    assert out[0, 0] == np.inf
