"""Model-local functions (``ModelProto.functions``: onnxscript's, torch's ``export_modules_as_functions``) are inlined
before the import's checks (compiler/frontend/onnx_frontend.py, ``_inline_functions``): the rules see their nodes,
nested calls and attribute references included; a function the inliner cannot expand is a clear error."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import ModelFileError, import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.kernels import cpu

RNG = np.random.default_rng(71)
D = 16


def _layer_norm_fn() -> onnx.FunctionProto:
    """``custom.MyLayerNorm(x, g, b)`` over the last axis, its epsilon an attribute (default 1e-5)."""
    eps = helper.make_node("Constant", [], ["eps"])
    eps.attribute.append(onnx.AttributeProto(name="value_float", ref_attr_name="epsilon",
                                             type=onnx.AttributeProto.FLOAT))
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["c"]),
             helper.make_node("Mul", ["c", "c"], ["sq"]), helper.make_node("ReduceMean", ["sq"], ["v"], axes=[-1]),
             eps, helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["c", "s"], ["n"]), helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y"])]
    fn = helper.make_function("custom", "MyLayerNorm", ["x", "g", "b"], ["y"], nodes, [helper.make_opsetid("", 17)],
                              attributes=[])
    fn.attribute_proto.append(helper.make_attribute("epsilon", 1e-5))
    return fn


def _block_fn() -> onnx.FunctionProto:
    """``custom.Block(x, w, g, b)``: a linear layer, then MyLayerNorm (a call of another local function)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Add", ["h", "x"], ["r"]),
             helper.make_node("MyLayerNorm", ["r", "g", "b"], ["y"], domain="custom", epsilon=1e-3)]
    return helper.make_function("custom", "Block", ["x", "w", "g", "b"], ["y"], nodes,
                                [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])


def _model(functions: list[onnx.FunctionProto]) -> onnx.ModelProto:
    nodes = [helper.make_node("Block", ["x", "w1", "g", "b"], ["h1"], domain="custom", name="block_0"),
             helper.make_node("Block", ["h1", "w2", "g", "b"], ["y"], domain="custom", name="block_1")]
    inits = [numpy_helper.from_array((RNG.standard_normal((D, D)) * 0.3).astype(np.float32), n) for n in ("w1", "w2")]
    inits += [numpy_helper.from_array((1 + RNG.standard_normal(D) * 0.1).astype(np.float32), "g"),
              numpy_helper.from_array((RNG.standard_normal(D) * 0.1).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "functions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)],
                              functions=functions)
    model.ir_version = 9
    return model


def test_local_functions_are_inlined_nested_calls_and_attribute_references_included():
    model = _model([_layer_norm_fn(), _block_fn()])
    x = RNG.standard_normal((1, 8, D)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    graph = import_onnx(model)
    ops = [n.op for n in graph.nodes]
    assert ops.count("LayerNorm") == 2 and ops.count("Conv2d") + ops.count("Dense") == 2, ops
    norms = [n for n in graph.nodes if n.op == "LayerNorm"]
    assert all(n.attrs["epsilon"] == pytest.approx(1e-3) for n in norms)    # the caller's attribute, not the default
    np.testing.assert_allclose(run_float(graph, {"x": x})["y"], want, atol=1e-4, rtol=1e-4)
    qgraph = quantize(graph, {"x": x})
    np.testing.assert_array_equal(cpu.run_cpu(qgraph, {"x": x})["y"], qops.run_reference(qgraph, {"x": x})["y"])


def test_a_call_of_a_function_the_model_does_not_define_is_refused_by_name():
    with pytest.raises(Exception, match="custom.MyLayerNorm") as err:
        import_onnx(_model([_block_fn()]))
    assert "Traceback" not in str(err.value)


@pytest.mark.parametrize("case, words", [("recursive", "Cycle detected in model-local function references"),
                                          ("arity", "Number of actual parameters cannot exceed")])
def test_a_function_the_inliner_cannot_expand_is_a_model_file_error(case, words):
    if case == "recursive":
        fn = helper.make_function("custom", "Block", ["x", "w", "g", "b"], ["y"],
                                  [helper.make_node("Block", ["x", "w", "g", "b"], ["y"], domain="custom")],
                                  [helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
        functions = [fn]
    else:
        fn = _block_fn()
        del fn.input[3]                                  # called with 4 inputs, it declares 3
        functions = [_layer_norm_fn(), fn]
    with pytest.raises(ModelFileError, match=r"defines local functions \(custom.Block") as err:
        import_onnx(_model(functions))
    assert words in str(err.value)
