"""``--input-value``: one-element inputs compiled as constants, so that an If they decide becomes the branch taken
(optimum's merged decoders choose theirs by ``use_cache_branch``). The import against onnxruntime for each value, the
empty placeholder outputs left out, the value read from ``--input``'s .npz, a mismatching array refused, and bad
values listed."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx

RNG = np.random.default_rng(5)
node = helper.make_node


def _merged(fused: bool = False) -> onnx.ModelProto:
    """A merged decoder in optimum's form: ``If(use_cache_branch)``; the cache branch concatenates the past before
    the new rows and writes an empty placeholder for ``enc``; the other computes ``enc`` and ignores the past.
    ``fused``: the cache branch normalizes with onnxruntime's SimplifiedLayerNormalization, as its optimizer writes
    inside the branches of optimum's ``--optimize`` files."""
    w = numpy_helper.from_array((RNG.standard_normal((8, 8)) * 0.5).astype(np.float32), "w")
    norm = [node("SimplifiedLayerNormalization", ["h_c0", "gamma"], ["h_c"], axis=-1, epsilon=1e-6)] if fused \
        else [node("Identity", ["h_c0"], ["h_c"])]
    cache = helper.make_graph(
        [node("Concat", ["past", "x"], ["present_c"], axis=1), node("MatMul", ["present_c", "w"], ["h_c0"]), *norm,
         node("ReduceMean", ["h_c"], ["out_c"], axes=[1], keepdims=1),
         node("Constant", [], ["enc_c"], value=numpy_helper.from_array(np.zeros((1, 0, 8), np.float32)))],
        "cache", [], [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                      for n in ("out_c", "present_c", "enc_c")])
    fresh = helper.make_graph(
        [node("MatMul", ["x", "w"], ["h_f"]), node("ReduceMean", ["h_f"], ["out_f"], axes=[1], keepdims=1),
         node("Tanh", ["x"], ["present_f"]), node("Relu", ["h_f"], ["enc_f"])],
        "fresh", [], [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                      for n in ("out_f", "present_f", "enc_f")])
    graph = helper.make_graph(
        [node("If", ["use_cache_branch"], ["out", "present", "enc"], then_branch=cache, else_branch=fresh)],
        "merged",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]),
         helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, 3, 8]),
         helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "present", "enc")],
        [w, numpy_helper.from_array((1 + 0.1 * RNG.standard_normal(8)).astype(np.float32), "gamma")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _feeds(cache: bool) -> dict[str, np.ndarray]:
    return {"x": RNG.standard_normal((1, 4, 8)).astype(np.float32),
            "past": RNG.standard_normal((1, 3, 8)).astype(np.float32), "use_cache_branch": np.array([cache])}


@pytest.mark.parametrize("cache, fused", [(True, False), (False, False), (True, True)])
def test_each_value_compiles_its_branch_as_onnxruntime_computes_it(cache, fused):
    """Each value gives its branch, onnxruntime's fused operators inside it rewritten as anywhere else."""
    model, feeds = _merged(fused), _feeds(cache)
    want = dict(zip(("out", "present", "enc"), ort.InferenceSession(model.SerializeToString()).run(None, feeds)))
    graph = import_onnx(model, input_values={"use_cache_branch": float(cache)})
    assert "use_cache_branch" not in graph.inputs
    assert graph.outputs == (["out", "present"] if cache else ["out", "present", "enc"])   # the placeholder left out
    got = run_float(graph, {k: v for k, v in feeds.items() if k in graph.inputs})
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)


def test_without_a_value_the_if_is_refused_saying_how_to_give_one():
    with pytest.raises(UnsupportedOperatorError, match=r"--input-value use_cache_branch=1"):
        import_onnx(_merged())


def test_bad_values_are_listed_together():
    with pytest.raises(ValueError) as err:
        import_onnx(_merged(), input_values={"nope": 1, "x": 0, "use_cache_branch": 2})
    text = str(err.value)
    assert "'nope' is not an input" in text and "input 'x' has shape 1x4x8" in text and \
        "input 'use_cache_branch' is bool, which cannot hold 2" in text


def test_vta_run_takes_the_value_from_the_input_npz_and_refuses_a_mismatch(tmp_path, capsys, monkeypatch):
    from vta.cli import main
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    path, data = tmp_path / "merged.onnx", tmp_path / "step.npz"
    onnx.save(_merged(), str(path))
    np.savez(data, **_feeds(True))
    assert main(["run", str(path), "--input", str(data), "--target", "fsim", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "input values from --input" in captured.err and "use_cache_branch=1" in captured.err
    assert "matches_integer_reference: True" in captured.out
    assert f"error against the float model (onnxruntime on {path})" in captured.out
    assert main(["run", str(path), "--input", str(data), "--input-value", "use_cache_branch=false", "--target",
                 "fsim", "--no-progress"]) == 2
    assert "compiled with it the constant 0" in capsys.readouterr().err


def test_vta_compile_fixes_the_value_and_the_artefact_refuses_another(tmp_path, capsys, monkeypatch):
    from vta.cli import main
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    path, art = tmp_path / "merged.onnx", tmp_path / "merged.vtac"
    onnx.save(_merged(), str(path))
    assert main(["compile", str(path), "--input-value", "use_cache_branch=true", "-o", str(art), "--no-progress"]) == 0
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    np.savez(good, **_feeds(True))
    np.savez(bad, **_feeds(False))
    capsys.readouterr()
    assert main(["run", str(art), "--input", str(good), "--target", "fsim", "--no-progress"]) == 0
    assert "matches_integer_reference: True" in capsys.readouterr().out
    assert main(["run", str(art), "--input", str(bad), "--target", "fsim", "--no-progress"]) == 2
    assert "was compiled with it the constant 1" in capsys.readouterr().err
