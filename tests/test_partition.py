"""Tests for vta.compiler.lowering.partition: where each node runs under each policy and the reason recorded, force_cpu,
layers the accelerator cannot run staying on the CPU, and each accelerator node lowered exactly once per compile."""
from collections import Counter

import numpy as np
import pytest
from helpers import toy_graph

from vta.compiler.ir import Graph, Requant
from vta.compiler.lowering import partition as P
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.partition import Lowered, lower_node, partition
from vta.compiler.lowering.schedule import ScheduleError
from vta.compiler.pipeline import compile_graph, partition_graph
from vta.config import VTAConfig


def _untileable() -> Graph:
    """One 1x4000 convolution: even a one-pixel tile's weights overflow half of the default wgt buffer."""
    g = Graph("wide")
    g.add_tensor("x", (1, 16, 1, 4000), "int8", 0.05)
    g.inputs.append("x")
    g.add_constant("w", np.ones((16, 16, 1, 4000), np.int8))
    g.add_constant("bias", np.zeros(16, np.int32))
    g.add_tensor("y", (1, 16, 1, 1), "int8", 0.1)
    g.add_node("QConv2d", "wide", ["x", "w", "bias"], ["y"], strides=(1, 1), pads=(0, 0, 0, 0), groups=1,
               requant=Requant(np.full(16, 3), np.full(16, 20)))
    g.outputs.append("y")
    g.validate()
    return g


def _where(decisions):
    return {name: (d.target, d.reason) for name, d in decisions.items()}


def test_accel_policy_offloads_every_supported_node():
    assert _where(partition(toy_graph(), VTAConfig(), policy="accel")) == {
        "conv_a": ("accel", "supported"), "conv_b": ("accel", "supported"), "add": ("accel", "supported"),
        "pool": ("cpu", "MaxPool has no accelerator rule"), "flat": ("cpu", "Reshape has no accelerator rule"),
        "fc": ("accel", "supported")}


def test_cpu_policy_offloads_nothing():
    decisions = partition(toy_graph(), VTAConfig(), policy="cpu")
    assert {d.target for d in decisions.values()} == {"cpu"}
    assert decisions["conv_a"].reason == "the cpu policy offloads nothing"
    assert decisions["pool"].reason == "MaxPool has no accelerator rule"
    assert decisions["conv_a"].accel_us is None


def test_auto_policy_weighs_the_estimates():
    decisions = partition(toy_graph(), VTAConfig(), policy="auto")
    assert [d.node for d in decisions.values()] == ["conv_a", "conv_b", "add", "pool", "flat", "fc"]
    assert _where(decisions) == {
        "conv_a": ("accel", "faster (25 us vs 73 us on the CPU)"),
        "conv_b": ("accel", "faster (36 us vs 120 us on the CPU)"),
        "add": ("cpu", "the CPU is faster (5 us vs 14 us)"),
        "pool": ("cpu", "MaxPool has no accelerator rule"),
        "flat": ("cpu", "Reshape has no accelerator rule"),
        "fc": ("cpu", "the CPU is faster (2 us vs 13 us)")}
    conv_a = decisions["conv_a"]
    macs, outputs = 1 * 20 * 8 * 8 * 12 * 9, 1 * 20 * 8 * 8
    assert conv_a.macs == macs
    # CPU: MACs / 2000 + output elements / 500 + the output converted for the accelerator consumers / 1000 (us)
    assert conv_a.cpu_us == pytest.approx(macs / 2000 + outputs / 500 + outputs / 1000)
    assert conv_a.accel_us < conv_a.cpu_us


def test_force_cpu_keeps_a_node_on_the_cpu():
    decisions = partition(toy_graph(), VTAConfig(), policy="accel", force_cpu={"conv_b"})
    assert (decisions["conv_b"].target, decisions["conv_b"].reason) == ("cpu", "forced onto the CPU")
    assert decisions["conv_a"].target == decisions["add"].target == "accel"


def test_a_layer_no_tiling_fits_stays_on_the_cpu():
    cfg = VTAConfig()
    (decision,) = partition(_untileable(), cfg, policy="accel").values()
    assert decision.target == "cpu"
    assert decision.reason == (f"not supported on {cfg.name}: no tiling fits: even a one-pixel tile breaks these "
                               f"limits: the input tile needs 4000 inp entries, more than half the buffer (1024); "
                               f"the weight tile needs 4000 wgt entries, more than half the buffer (512); "
                               f"the tile needs 4000 GEMM micro-ops, more than a quarter of the uop buffer (2048)")


def test_policy_must_be_known():
    with pytest.raises(ValueError, match=r"^policy must be one of auto, accel, cpu, not 'gpu'$"):
        partition(toy_graph(), VTAConfig(), policy="gpu")


def test_partition_hands_back_the_lowered_layers():
    intr = intrinsics(VTAConfig())
    decisions, lowered = partition_graph(toy_graph(), intr, policy="accel", force_cpu=["add"])
    assert set(lowered) == {name for name, d in decisions.items() if d.target == "accel"} == {"conv_a", "conv_b",
                                                                                               "fc"}
    assert all(isinstance(layer, Lowered) for layer in lowered.values())
    assert lowered["conv_a"].fold is None  # 12 channels x 3 columns fit one 16-channel block no better than 3 blocks
    assert partition_graph(toy_graph(), intr, policy="cpu")[1] == {}


def test_lower_node_takes_intrinsics():
    g = toy_graph()
    with pytest.raises(TypeError, match=r"^lower_node\(\) needs the Intrinsics of a config \(see intrinsics\(cfg\)\), "
                                        r"not VTAConfig$"):
        lower_node(g, g.nodes[0], VTAConfig())
    with pytest.raises(ScheduleError, match=r"^the accelerator has no rule for op MaxPool$"):
        lower_node(g, g.nodes[3], intrinsics(VTAConfig()))


@pytest.mark.parametrize("policy", ["accel", "auto"])
def test_each_accelerator_node_is_lowered_once_per_compile(monkeypatch, policy):
    calls: Counter[str] = Counter()
    for op, rule in list(P.ACCEL_RULES.items()):
        def counting(graph, node, intr, rule=rule):
            calls[node.name] += 1
            return rule(graph, node, intr)
        monkeypatch.setitem(P.ACCEL_RULES, op, counting)
    compiled = compile_graph(toy_graph(), VTAConfig(), policy=policy)
    accel = [s.node.name for s in compiled.steps if s.where == "accel"]
    assert accel
    assert calls == Counter({name: 1 for name, d in compiled.decisions.items() if d.accel_us is not None})
    assert all(calls[name] == 1 for name in accel)


def _zoo_decisions(model: str) -> dict[str, P.Decision]:
    """The default (auto) partition of zoo ``model`` at the default config, quantized as `vta run` does."""
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import calibration_inputs, load_graph
    graph = load_graph(model)
    return partition(quantize(graph, calibration_inputs(model, graph, 1, 4)), VTAConfig())


def test_auto_puts_one_layer_of_tiny_cnn_on_the_accelerator():
    """Every tiny_cnn layer is estimated faster on the CPU (the launch cost dominates), yet a user of the lab expects
    the default policy to use the accelerator: the closest call (conv_7, 11 us vs 10 us) goes there."""
    decisions = _zoo_decisions("tiny_cnn")
    assert [(d.node, d.target) for d in decisions.values() if d.op in P.ACCEL_RULES] == [
        ("conv_3", "cpu"), ("conv_7", "accel"), ("gemm_12", "cpu")]
    assert decisions["conv_7"].reason == ("the accelerator's closest call (11 us vs 10 us on the CPU): the auto "
                                          "policy puts at least one layer on the accelerator")
    assert decisions["conv_3"].reason == "the CPU is faster (4 us vs 9 us)"  # its estimate with the im2col stem


def test_auto_moves_nothing_when_a_layer_already_runs_on_the_accelerator():
    resnet18 = _zoo_decisions("resnet18")
    assert (sum(d.target == "accel" for d in resnet18.values()), len(resnet18)) == (25, 34)
    assert not any(d.reason.startswith("the accelerator's closest call") for d in partition(toy_graph(), VTAConfig())
                   .values())


def test_auto_needs_a_layer_the_accelerator_can_run():
    """A graph whose only layer no tiling fits stays wholly on the CPU under auto: nothing is forced."""
    (decision,) = partition(_untileable(), VTAConfig()).values()
    assert decision.target == "cpu" and decision.reason.startswith("not supported on ")


def test_auto_lowered_layers_match_the_final_decisions():
    """The lowered layers handed back are those of the second pass: exactly the nodes finally on the accelerator."""
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.pipeline import calibration_inputs, load_graph
    graph = load_graph("tiny_cnn")
    qgraph = quantize(graph, calibration_inputs("tiny_cnn", graph, 1, 4))
    decisions, lowered = partition_graph(qgraph, intrinsics(VTAConfig()))
    assert set(lowered) == {name for name, d in decisions.items() if d.target == "accel"} == {"conv_7"}
