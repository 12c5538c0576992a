"""Tensors of no elements (compiler/frontend/onnx_frontend.py): a Concat part that is an empty constant (Inkling's
MLP input, a KV cache of past length 0 written into the file) drops out; a model input with a dimension of 0 is the
empty constant it must be, so ``vta run`` takes its (empty) array and onnxruntime, on the file, still gets it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import onnx_model, onnx_op_run
from onnx import TensorProto, helper, numpy_helper

from vta.compiler.frontend.onnx_frontend import import_onnx

RNG_SEED = 53                             # a fresh RNG of this seed in each test (conftest.py)
RNG = np.random.default_rng(RNG_SEED)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _past_model(*, fixed: bool) -> onnx.ModelProto:
    """``y = Concat([past, x], 1) @ w`` with ``past [1, 0, 8]`` a graph input: of fixed size 0 (``fixed``) or of a
    symbolic past length."""
    past = [1, 0, 8] if fixed else [1, "past", 8]
    nodes = [helper.make_node("Concat", ["past", "x"], ["c"], axis=1), helper.make_node("MatMul", ["c", "w"], ["y"])]
    graph = helper.make_graph(nodes, "past0", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8]),
                                               helper.make_tensor_value_info("past", TensorProto.FLOAT, past)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])],
                              [numpy_helper.from_array(_x(8, 16), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_an_empty_constant_part_of_a_concat_drops_out():
    x = _x(2, 3, 4)
    nodes = [helper.make_node("Concat", ["none", "x", "x"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["y"])]
    graph, _, got, want = onnx_op_run(onnx_model(nodes, {"x": x}, [("none", np.zeros((2, 0, 4), np.float32))]),
                                      {"x": x}, atol=1e-6, rtol=1e-6)
    assert graph.shape("y") == (2, 6, 4) and "none" not in graph.tensors
    assert np.abs(got - want).max() <= np.abs(want).max() / 127


def test_an_empty_part_of_another_shape_off_the_axis_is_not_dropped():
    """``Concat([x [2, 3, 4], e [2, 0, 5]], 1)`` is no valid graph (onnxruntime refuses it): the empty part stays, and
    the import names the Concat whose output has no shape."""
    from vta.compiler.ir import GraphError
    x = _x(2, 3, 4)
    model = onnx_model([helper.make_node("Concat", ["x", "e"], ["y"], axis=1)], {"x": x},
                       [("e", np.zeros((2, 0, 5), np.float32))])
    with pytest.raises(GraphError, match="no static shape for tensor 'y'"):
        import_onnx(model)


def test_an_input_of_no_elements_is_a_constant_of_the_import():
    for fixed in (True, False):
        graph = import_onnx(_past_model(fixed=fixed), input_shapes={"x": (1, 4, 8), "past": (1, 0, 8)})
        assert graph.inputs == ["x"] and graph.shape("y") == (1, 4, 16)


def test_vta_run_takes_the_empty_array_and_gives_it_to_onnxruntime(tmp_path, monkeypatch, capsys):
    from vta.cli import main
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    for fixed in (True, False):
        path = tmp_path / f"past{int(fixed)}.onnx"
        onnx.save(_past_model(fixed=fixed), str(path))
        np.savez(tmp_path / "in.npz", x=_x(1, 4, 8), past=np.zeros((1, 0, 8), np.float32))
        assert main(["run", str(path), "--target", "fsim", "--input", str(tmp_path / "in.npz"), "--no-progress"]) == 0
        out = capsys.readouterr().out
        assert "matches_integer_reference: True" in out and f"onnxruntime on {path}" in out
        np.savez(tmp_path / "bad.npz", x=_x(1, 4, 8), past=np.zeros((1, 2, 8), np.float32))   # not empty
        code = main(["run", str(path), "--target", "fsim", "--input", str(tmp_path / "bad.npz"), "--no-progress"])
        err = capsys.readouterr().err
        assert "Traceback" not in err
        if fixed:                    # the file fixes past's length at 0
            assert code == 2 and "'past'" in err
        else:                        # a past of 2: the file's output shape, stated for 0, gives way
            assert code == 0 and "output 'y' is declared of shape 1x4x16, but its nodes compute 1x6x16" in err


def test_an_output_declared_of_another_shape_than_computed_takes_the_computed_one(caplog):
    """A file whose output states ``[4, 2]`` for a product of ``[2, 4]``: the product's shape, with a warning (as
    onnxruntime), not a reshape of the result to the stated one."""
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "bad",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
                              [numpy_helper.from_array(_x(3, 4), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert import_onnx(model).shape("y") == (2, 4)
    assert "output 'y' is declared of shape 4x2, but its nodes compute 2x4" in caplog.text
