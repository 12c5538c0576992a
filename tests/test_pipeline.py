"""Tests for vta.compiler.pipeline: the stages compose to the artefact the compiler produced before they were split
(same accelerator steps, identical instruction streams and DRAM images), compiling is deterministic, and the old
import paths still reach the one implementation."""
import numpy as np
import pytest

from vta.compiler.frontend.quantize import quantize
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.partition import lower_node, partition
from vta.compiler.pipeline import (
    accel_step,
    calibration_inputs,
    compile_graph,
    compile_model,
    load_graph,
    partition_graph,
    random_inputs,
)
from vta.compiler.runtime.compiled import AccelStep, Compiled, CpuStep
from vta.compiler.runtime.fingerprint import differences, fingerprint
from vta.config import VTAConfig


def _same_programs(a: Compiled, b: Compiled) -> None:
    assert [(type(s), s.node.name) for s in a.steps] == [(type(s), s.node.name) for s in b.steps]
    for x, y in zip(a.steps, b.steps):
        if isinstance(x, AccelStep):
            assert x.program.insns == y.program.insns
            assert np.array_equal(x.program.dram, y.program.dram)
            assert (x.inputs, x.output, x.macs, x.gemm_uops, x.alu_uops, x.tiles, x.tiling, x.fold) == \
                   (y.inputs, y.output, y.macs, y.gemm_uops, y.alu_uops, y.tiles, y.tiling, y.fold)
    assert a.decisions == b.decisions


@pytest.fixture(scope="module")
def tiny() -> Compiled:
    return compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2)


TINY_CNN_PARTS = {
    "graph": "c6fb028f820e2766",
    "scales": "31c6a94f6d375f61",
    "constant conv_3_wq": "1dab0b8e36e6192d",
    "constant conv_3_bq": "c43daa1863867d90",
    "constant conv_7_wq": "cdda96755de3b090",
    "constant conv_7_bq": "4571820fbaa90a72",
    "constant gemm_12_wq": "e0a21bf0153197fa",
    "constant gemm_12_bq": "5234e69ca7418d7e",
    "decisions": "35dd201b170ce4de",
    "conv_3 instructions": "3fed5559fdf4130e",
    "conv_3 x": "5f70bf18a0860070",
    "conv_3 y": "5f70bf18a0860070",
    "conv_3 w": "73d57e3b1a9249d6",
    "conv_3 consts": "35157c3049d95885",
    "conv_3 uops0": "782cbb081c792413",
    "conv_3 layout": "7ced716d35ee436d",
    "conv_3 schedule": "f83d6a985f4d7b71",
    "conv_7 instructions": "565a4450dd268742",
    "conv_7 x": "5f70bf18a0860070",
    "conv_7 y": "5341e6b2646979a7",
    "conv_7 w": "7d7d2ed45bf2221d",
    "conv_7 consts": "b88fdf6f3878f9a5",
    "conv_7 uops0": "5c8b0bca484887dc",
    "conv_7 layout": "56c2fd9c2e76d41a",
    "conv_7 schedule": "845aa9af147be19a",
    "gemm_12 instructions": "7928421330f9ea92",
    "gemm_12 x": "5341e6b2646979a7",
    "gemm_12 y": "374708fff7719dd5",
    "gemm_12 w": "4171f64d4a29435a",
    "gemm_12 consts": "0a699dcbe013ebe7",
    "gemm_12 bias_init": "05a15e4a75e8c079",
    "gemm_12 uops0": "adfe11d70a41c4bc",
    "gemm_12 layout": "e3d7af99d203cbf3",
    "gemm_12 schedule": "c4c7c8cbdb9f4e81",
}
"""tiny_cnn compiled for the default design (``policy="accel"``, two calibration samples), part by part
(:func:`vta.compiler.runtime.fingerprint.fingerprint`). A change that moves a part on purpose re-pins it here, and the
commit says why; what moves each kind of part is in :data:`~vta.compiler.runtime.fingerprint.PART_MEANINGS`."""


def test_the_tiny_cnn_artefact_is_unchanged(tiny):
    """What the compiler makes of tiny_cnn: the steps, the readable figures of each accelerator layer, then every
    part of the artefact by digest, so that a failure names the parts that moved (a layer's instructions, its
    micro-ops, its weights, the scales) and what moves them."""
    assert [(type(s).__name__, s.node.name) for s in tiny.steps] == [
        ("CpuStep", "quantize_input"), ("AccelStep", "conv_3"), ("AccelStep", "conv_7"), ("CpuStep", "flatten_9"),
        ("AccelStep", "gemm_12"), ("CpuStep", "dequantize_output")]
    accel = [s for s in tiny.steps if isinstance(s, AccelStep)]
    assert [len(s.program.insns) for s in accel] == [21, 13, 27]
    assert [(s.gemm_uops, s.alu_uops, s.tiling) for s in accel] == [
        (128, 256, "oc1 ic1 oh8 ow4 im2col"), (160, 80, "oc1 ic1 oh4 ow4 1thread"),
        (16, 4, "oc1 ic16 oh1 ow1 1thread bias-load")]
    assert [s.predicted_cycles for s in accel] == [680, 834, 1075]
    assert [s.schedule["bound"] for s in accel] == ["compute", "load", "load"]
    assert tiny.meta["model"] == "tiny_cnn" and tiny.meta["double_buffer"] is True
    moved = differences(TINY_CNN_PARTS, fingerprint(tiny), names=("the pin", "this compile"))
    assert not moved, "parts of tiny_cnn's artefact moved:\n" + "\n".join(moved)


def test_the_stages_compose_to_compile_model(tiny):
    graph = load_graph("tiny_cnn")
    qgraph = quantize(graph, calibration_inputs("tiny_cnn", graph, 1, 2))
    _same_programs(compile_graph(qgraph, VTAConfig(), policy="accel"), tiny)


def test_reusing_the_partition_layers_equals_lowering_again(tiny):
    """What compile_graph did before: partition, then lower every accelerator node a second time."""
    graph, cfg = tiny.graph, tiny.cfg
    intr = intrinsics(cfg)
    decisions = partition(graph, cfg, policy="accel")
    steps = [accel_step(graph, node, lower_node(graph, node, intr), intr) if decisions[node.name].target == "accel"
             else CpuStep(node, decisions[node.name].macs) for node in graph.nodes]
    _same_programs(Compiled(cfg, graph, steps, decisions), tiny)


@pytest.mark.parametrize("policy", ["accel", "auto"])
def test_mini_resnet_compiles_deterministically(policy):
    first = compile_model("mini_resnet", VTAConfig(), policy=policy, calib=2)
    second = compile_model("mini_resnet", VTAConfig(), policy=policy, calib=2)
    _same_programs(first, second)
    assert (first.accel_steps, len(first.steps)) == ((8, 17) if policy == "accel" else (6, 17))
    if policy == "accel":
        assert sum(len(s.program.insns) for s in first.steps if isinstance(s, AccelStep)) == 431  # im2col stem


def test_single_threaded_programs():
    qgraph = load_graph("tiny_cnn")
    qgraph = quantize(qgraph, random_inputs(qgraph, 1, 2))
    double = compile_graph(qgraph, VTAConfig(), policy="accel")
    single = compile_graph(qgraph, VTAConfig(), policy="accel", double_buffer=False)
    assert (double.meta, single.meta) == ({"double_buffer": True}, {"double_buffer": False})
    assert [s.where for s in double.steps] == [s.where for s in single.steps]


def test_partition_graph_lowers_only_accelerator_nodes(tiny):
    decisions, lowered = partition_graph(tiny.graph, intrinsics(tiny.cfg), policy="accel", force_cpu=["conv_7"])
    assert sorted(lowered) == ["conv_3", "gemm_12"]
    assert decisions["conv_7"].reason == "forced onto the CPU"


def test_random_inputs_are_seeded_and_shaped():
    graph = load_graph("tiny_cnn")
    one = random_inputs(graph, 3)
    assert list(one) == ["input"] and one["input"].shape == (1, 1, 8, 8) and one["input"].dtype == np.float32
    assert np.array_equal(one["input"], random_inputs(graph, 3)["input"])
    assert not np.array_equal(one["input"], random_inputs(graph, 4)["input"])
    assert random_inputs(graph, 3, samples=4)["input"].shape == (4, 1, 8, 8)


def test_calibration_inputs_are_random_without_real_data():
    graph = load_graph("tiny_cnn")
    assert np.array_equal(calibration_inputs("tiny_cnn", graph, 1, 2)["input"], random_inputs(graph, 1, 2)["input"])


def test_load_graph_names_the_zoo():
    with pytest.raises(ValueError, match=r"^model 'no_such_net' is not a zoo model and not a file; zoo models are "
                                         r".*tiny_cnn"):
        load_graph("no_such_net")


def test_load_graph_batch():
    assert load_graph("tiny_cnn", batch=2).shape("input") == (2, 1, 8, 8)
