"""onnx's own backend node test cases (``onnx.backend.test.case.node``, the ``expect(...)`` calls the onnx wheel makes
into ``backend/test/data/node``) for the operators a CNN meets, through the lab's import, quantization and CPU run.

Each case either runs or is refused. A run must equal the integer reference bit for bit and lie within the int8
tolerance of onnx's expected output: ``max |got - expected| <= 2 * s_out + s_in``, where ``s_out`` is the output's
quantization step (its Dequantize scale) and ``s_in`` the largest input step (its Quantize scale): one rounding of
the input, propagated by functions of slope <= 1.5 (HardSwish's steepest), plus the output's rounding and one more
step of rounding inside the node (Resize's weights, a 3D pool's two stages). A refusal must be one of the lab's own
errors (never a crash, never "malformed"), and its message must match the reason the table :data:`REFUSALS` gives
for that case: a refusal no rule expects fails, and so does a case a rule expects refused that now runs.

How the cases are prepared, the same for every case:

* calibration is the case's own input (one sample);
* graph inputs that are an operator's parameters (Clip's min and max, Resize's roi, scales and sizes) become
  initializers with the case's values: the lab compiles a model for fixed parameters;
* a case stamped with an opset above the frontend's 22 only because an operator's later revision widened its
  element types (Transpose-25, DepthToSpace-28, Reshape-25...) is re-stamped 22 when every node's schema at the
  case's opset has the same documentation, attributes, inputs and outputs as at opset 22
  (:func:`vta.compiler.onnx_backend.restamp`, as the lab's ONNX backend does).
"""
from __future__ import annotations

import re
import warnings
from functools import cache

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from vta.compiler import qops
from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, import_onnx
from vta.compiler.frontend.quantize import QuantizationError, quantize
from vta.compiler.ir import GraphError
from vta.compiler.onnx_backend import restamp
from vta.compiler.pipeline import compile_graph
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

FAMILIES = {
    "resize": ("Resize",),
    "transpose": ("Transpose",),
    "activation": ("Sigmoid", "HardSigmoid", "HardSwish"),
    "depth_to_space": ("DepthToSpace",),
    "pool": ("MaxPool", "AveragePool"),
    "concat": ("Concat",),
    "clip": ("Clip",),
}
"""Operator families, one test function each, parametrized over their cases (and the ``*_expanded`` function
decompositions onnx generates for them)."""

PARAMETERS = {"Clip": (1, 2), "Resize": (1, 2, 3)}
"""Inputs (positions) of an operator that are parameters, frozen as initializers; Concat's are all data."""

OPERATOR_REFUSALS: list[tuple[str, str]] = [
    (r"resize_tf_crop_and_resize", r"coordinate_transformation_mode 'tf_crop_and_resize' \(only half_pixel"),
    (r"resize_.*antialias", r"antialias=1 \(only 0\)"),
    (r"resize_.*not_(larger|smaller)", r"keep_aspect_ratio_policy 'not_(larger|smaller)' \(only 'stretch'\)"),
    (r"pool_3d_.*dilations", r"dilations \[2, 2, 2\] \(only 1\)"),     # 2-D ones of strides 1 take the phase form
    (r"maxpool_with_argmax", r"'MaxPool' \(node .*the Indices output"),
]
"""The attribute values of Resize and the pools the lab refuses, and the reason it gives (also the ONNX backend
test's, tests/test_onnx_backend.py)."""

REFUSALS: list[tuple[str, str]] = [
    *OPERATOR_REFUSALS,
    (r"(uint8|int8)", r"Graph input 'x' has ONNX element type (UINT8|INT8); only float32 inputs"),
]
"""(case name pattern, message pattern) for every case the lab refuses, and why (searched with re.search)."""


@cache
def _cases() -> dict[str, list]:
    """family -> onnx's node test cases of its operators, and their ``_expanded`` decompositions."""
    import onnx.backend.test.case.node as node_cases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        everything = node_cases.collect_testcases(None)
    by_name = {case.name: case for case in everything}
    out: dict[str, list] = {}
    for family, ops in FAMILIES.items():
        base = [c for c in everything if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in ops]
        out[family] = base + [by_name[c.name + "_expanded"] for c in base if c.name + "_expanded" in by_name]
    return out


def _base_node(case) -> onnx.NodeProto:
    """The one node of ``case``, or of the case it expands (``<name>_expanded``)."""
    if case.name.endswith("_expanded"):
        family = next(f for f, cases in _cases().items() if case in cases)
        case = next(c for c in _cases()[family] if c.name == case.name[:-len("_expanded")])
    return case.model.graph.node[0]


def _names(family: str) -> list[str]:
    return [case.name for case in _cases()[family]]


def _prepare(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """(model with frozen parameters, the data inputs by name, the expected outputs)."""
    model = restamp(onnx.ModelProto.FromString(case.model.SerializeToString()))
    inputs, expected = case.data_sets[0]
    names = [vi.name for vi in model.graph.input]
    values = {name: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)
              for name, v in zip(names, inputs)}
    node = _base_node(case)                             # an expansion reads the graph inputs of its base case
    frozen = {node.input[k] for k in PARAMETERS.get(node.op_type, ()) if k < len(node.input) and node.input[k]}
    for name in [n for n in names if n in frozen]:
        model.graph.initializer.append(numpy_helper.from_array(values.pop(name), name))
        kept = [vi for vi in model.graph.input if vi.name != name]
        del model.graph.input[:]
        model.graph.input.extend(kept)
    return model, values, [numpy_helper.to_array(e) if isinstance(e, onnx.TensorProto) else np.asarray(e)
                           for e in expected]


def _expected_refusal(name: str) -> str | None:
    return next((why for pattern, why in REFUSALS if re.search(pattern, name)), None)


LAB_ERRORS = (UnsupportedOperatorError, QuantizationError, GraphError)
"""What a refusal may raise: the lab's own errors, each naming the node or tensor (UnsupportedOpsetError does not
occur: every case's opset is within the supported range after :func:`vta.compiler.onnx_backend.restamp`)."""


def _check_case(family: str, name: str) -> str:
    """Run case ``name`` and check it; returns "ran" or "refused"."""
    case = next(c for c in _cases()[family] if c.name == name)
    model, inputs, expected = _prepare(case)
    why = _expected_refusal(name)
    try:
        graph = import_onnx(model)
        qgraph = quantize(graph, inputs)
    except LAB_ERRORS as err:
        assert "malformed" not in str(err), f"{name}: a valid model is reported as malformed: {err}"
        assert why is not None, f"{name} is refused and no rule of REFUSALS expects it: {err}"
        assert re.search(why, str(err)), f"{name} is refused for another reason than {why!r}: {err}"
        return "refused"
    assert why is None, f"{name} runs, but REFUSALS expects it refused ({why!r}); update the table"
    compiled = compile_graph(qgraph, VTAConfig(), policy="cpu")
    got = run(compiled, inputs, target="cpu").outputs
    reference = qops.run_reference(qgraph, inputs)
    s_in = max(n.attrs["scale"] for n in qgraph.nodes if n.op == "Quantize")
    for out, want in zip(qgraph.outputs, expected):
        np.testing.assert_array_equal(got[out], reference[out], err_msg=f"{name}: the CPU run differs from qops")
        s_out = next((n.attrs["scale"] for n in qgraph.nodes if n.op == "Dequantize" and n.outputs[0] == out), 0.0)
        error = float(np.abs(got[out].astype(np.float64) - want).max())
        assert got[out].shape == want.shape, f"{name}: shape {got[out].shape}, expected {want.shape}"
        assert error <= 2 * s_out + s_in, f"{name}: max error {error:.4g} > 2 * {s_out:.4g} + {s_in:.4g}"
    return "ran"


@pytest.mark.parametrize("family,name", [(family, name) for family in FAMILIES for name in _names(family)])
def test_node_cases(family, name):
    """Every case of every operator family runs within the tolerance or is refused naming what is missing."""
    _check_case(family, name)


def test_every_refusal_rule_names_some_case():
    names = [name for family in FAMILIES for name in _names(family)]
    assert sum(len(n) for n in _cases().values()) > 100
    dead = [pattern for pattern, _ in REFUSALS if not any(re.search(pattern, name) for name in names)]
    assert not dead, f"REFUSALS rules that match no case: {dead}"
