"""Plain helpers shared by several test files: a toy quantized graph and raw instruction programs in the two DRAM
layouts the tests rely on. (Fixtures live in tests/conftest.py; the functional simulator's own programs in
tests/fsim_helpers.py.)"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vta.compiler.ir import AddRequant, Graph, Requant
from vta.config import VTAConfig
from vta.isa import Insn, encode_stream
from vta.program import Program


# ---- graphs ----------------------------------------------------------------------------------------------------------
def graph_with_input(name: str, shape: tuple[int, ...]) -> Graph:
    """An empty graph ``name`` whose one input is the int8 tensor ``x`` of ``shape`` (scale 0.05)."""
    g = Graph(name)
    g.add_tensor("x", shape, "int8", 0.05)
    g.inputs.append("x")
    return g


def add_random_weights(g: Graph, rng: np.random.Generator, weight: str, bias: str, shape: tuple[int, ...]) -> None:
    """Constants ``weight`` (int8 in [-60, 60), ``shape``) and ``bias`` (int32 in [-900, 900), one per output channel,
    ``shape[0]``), drawn from ``rng`` in that order."""
    g.add_constant(weight, rng.integers(-60, 60, shape).astype(np.int8))
    g.add_constant(bias, rng.integers(-900, 900, shape[0]).astype(np.int32))


def toy_graph(pads: tuple[int, int, int, int] = (1, 1, 1, 1)) -> Graph:
    """x (1x12x8x8) -> conv a (relu, ``pads``) -> conv b -> add(a, b) -> maxpool -> reshape -> dense y (1x10).

    Every layer kind the partitioner decides on: two convolutions and an add the accelerator runs, a pool and a
    reshape it has no rule for, and a dense layer. conv_a's requant has per-channel multipliers and shifts."""
    rng = np.random.default_rng(0)
    g = graph_with_input("toy", (1, 12, 8, 8))
    add_random_weights(g, rng, "wa", "ba", (20, 12, 3, 3))
    add_random_weights(g, rng, "wb", "bb", (20, 20, 3, 3))
    add_random_weights(g, rng, "wd", "bd", (10, 320))
    for name, shape in [("a", (1, 20, 8, 8)), ("b", (1, 20, 8, 8)), ("s", (1, 20, 8, 8)), ("p", (1, 20, 4, 4)),
                        ("f", (1, 320)), ("y", (1, 10))]:
        g.add_tensor(name, shape, "int8", 0.1)
    g.add_node("QConv2d", "conv_a", ["x", "wa", "ba"], ["a"], strides=(1, 1), pads=pads, groups=1,
               requant=Requant(rng.integers(1, 100, 20), rng.integers(10, 14, 20), 0, 127))
    g.add_node("QConv2d", "conv_b", ["a", "wb", "bb"], ["b"], strides=(1, 1), pads=(1, 1, 1, 1), groups=1,
               requant=Requant(np.full(20, 5), np.full(20, 12)))
    g.add_node("QAdd", "add", ["a", "b"], ["s"], requant=AddRequant(3, 5, 3, 0, 127))
    g.add_node("MaxPool", "pool", ["s"], ["p"], kernel=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0))
    g.add_node("Reshape", "flat", ["p"], ["f"], shape=(1, 320))
    g.add_node("QDense", "fc", ["f", "wd", "bd"], ["y"], requant=Requant(np.full(10, 7), np.full(10, 13)))
    g.outputs.append("y")
    g.validate()
    return g


def toy_inputs() -> dict[str, np.ndarray]:
    """The input of :func:`toy_graph`: random int8 ``x`` (seed 1)."""
    return {"x": np.random.default_rng(1).integers(-128, 128, (1, 12, 8, 8)).astype(np.int8)}


# ---- raw programs: instructions as given, no builder, no token bookkeeping, no FINISH synchronisation ---------------
def raw_program_after_data(cfg: VTAConfig, insns: Sequence[Insn], data_bytes: int = 4096) -> Program:
    """``insns`` encoded after ``data_bytes`` zero bytes: DRAM bytes [0, data_bytes) are data, the stream starts at
    byte ``data_bytes`` (instruction j at ``data_bytes + j * insn_bytes``) and the image ends with it."""
    stream = encode_stream(list(insns), cfg).reshape(-1)
    dram = np.zeros(data_bytes + stream.size, np.uint8)
    dram[data_bytes:] = stream
    return Program(cfg, list(insns), dram, data_bytes)


def raw_program_at_byte_0(cfg: VTAConfig, insns: Sequence[Insn], image_bytes: int = 4096) -> Program:
    """``insns`` encoded at byte 0 of a zeroed DRAM image of exactly ``image_bytes`` bytes: data addresses share the
    image with the stream, and an access at or past ``image_bytes`` is out of range."""
    dram = np.zeros(image_bytes, np.uint8)
    stream = encode_stream(list(insns), cfg).reshape(-1)
    dram[:stream.size] = stream
    return Program(cfg, list(insns), dram, 0, {})


# ---- ONNX models -----------------------------------------------------------------------------------------------------
def onnx_model(nodes: list, inputs: dict[str, np.ndarray], inits: Sequence = (), *, opset: int = 17):
    """An ONNX model of ``nodes`` at ``opset`` (IR version 9): float inputs named and shaped as ``inputs``, the
    initializers ``inits`` ((name, value) pairs, or TensorProtos as they are) and one float output ``y`` of unknown
    shape."""
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(nodes, "ops", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
                                             for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [i if isinstance(i, TensorProto) else numpy_helper.from_array(np.asarray(i[1]), i[0])
                               for i in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


def onnx_node(op: str, inputs: Sequence[str], output: str, **attrs: object):
    """One ONNX node of ``op`` reading ``inputs`` and writing ``output``, named ``<output>_node``."""
    from onnx import helper
    return helper.make_node(op, list(inputs), [output], name=f"{output}_node", **attrs)


def onnx_op_run(model, feeds: dict[str, np.ndarray], *, rtol: float, atol: float):
    """``model`` (one float output ``y``) through the lab against ONNX Runtime: the float import agrees with it within
    ``rtol``/``atol``, the quantized graph (calibrated on ``feeds``) runs on the CPU path bit-exact with the integer
    reference. Returns ``(float graph, quantized graph, the CPU path's y, ONNX Runtime's y)`` for the caller's
    tolerance check."""
    import onnxruntime as ort

    from vta.compiler import qops
    from vta.compiler.frontend.float_ref import run_float
    from vta.compiler.frontend.onnx_frontend import import_onnx
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.kernels import cpu
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    graph = import_onnx(model)
    np.testing.assert_allclose(run_float(graph, feeds)["y"], want, atol=atol, rtol=rtol)
    qgraph = quantize(graph, feeds)
    got = cpu.run_cpu(qgraph, feeds)["y"]
    np.testing.assert_array_equal(got, qops.run_reference(qgraph, feeds)["y"])
    return graph, qgraph, got, want



# ---- programs and compiled models on the RTL -------------------------------------------------------------------------
def assert_tsim_matches_reference_and_model(compiled, *, seed: int, tolerance: float = 0.05) -> None:
    """``compiled`` run on tsim for seeded normal float32 inputs gives the integer reference's (qops) outputs bit for
    bit, and the cycle model's prediction of every accelerator layer is within ``tolerance`` (a fraction) of tsim's
    cycles."""
    from vta.compiler import qops
    from vta.compiler.runtime.executor import run
    rng = np.random.default_rng(seed)
    inputs = {name: rng.standard_normal(compiled.graph.shape(name)).astype(np.float32)
              for name in compiled.graph.inputs}
    ref = qops.run_reference(compiled.graph, inputs)
    tsim = run(compiled, inputs, target="tsim")
    for name in ref:
        np.testing.assert_array_equal(tsim.outputs[name], ref[name])
    predicted = {step.node.name: step.predicted_cycles for step in compiled.steps if step.where == "accel"}
    layers = [layer for layer in tsim.layers if layer.where == "accel"]
    assert layers and all(abs(predicted[layer.layer] - layer.cycles) <= tolerance * layer.cycles for layer in layers)


def assert_tsim_matches_fsim(tsim, program: Program, *, tolerance: float) -> None:
    """``program`` on the ``tsim`` backend leaves fsim's DRAM image and ALU micro-op count, and the cycle model's
    prediction is within ``tolerance`` (a fraction) of the core's cycles."""
    from vta import fsim
    from vta.cost import estimate
    want, got = fsim.run(program), tsim.run(program)
    np.testing.assert_array_equal(got.dram, want.dram)
    assert got.counters["alu_uops"] == want.stats.alu_uops
    assert abs(estimate(program).cycles - got.cycles) <= tolerance * got.cycles
