"""Tests for vta.compiler.lowering.partition, runtime and report: a hand-built quantized graph compiled, saved, loaded
and run on fsim and the CPU path, bit-exact against the integer reference."""
import json

import numpy as np
import pytest
from helpers import add_random_weights, graph_with_input, toy_graph, toy_inputs

from vta.compiler import qops
from vta.compiler.ir import Requant
from vta.compiler.lowering.partition import partition
from vta.compiler.pipeline import compile_graph
from vta.compiler.report import COLUMNS, build_report
from vta.compiler.runtime.compiled import AccelStep, Compiled, CpuStep
from vta.compiler.runtime.executor import RuntimeFailure, run
from vta.config import VTAConfig

CONV_A_MACS = 20 * 64 * 12 * 9
"""toy_graph's conv_a: 20 output channels x 8x8 pixels x 12 input channels x 3x3 taps."""
CONV_B_MACS = 20 * 64 * 20 * 9
"""toy_graph's conv_b: 20 output channels x 8x8 pixels x 20 input channels x 3x3 taps."""


@pytest.mark.parametrize("cfg", [VTAConfig(), VTAConfig(log_block=3), VTAConfig(log_batch=1)],
                         ids=["default", "block8", "batch2"])
def test_fsim_and_cpu_match_reference(cfg):
    g = toy_graph()
    compiled = compile_graph(g, cfg, policy="accel")
    assert [type(s).__name__ for s in compiled.steps] == ["AccelStep", "AccelStep", "AccelStep", "CpuStep",
                                                          "CpuStep", "AccelStep"]
    ref = qops.run_reference(g, toy_inputs())["y"]
    out = run(compiled, toy_inputs(), target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], ref)
    np.testing.assert_array_equal(run(compiled, toy_inputs(), target="cpu").outputs["y"], ref)
    # packed layout kept between accelerator layers: x packed once, a and b feed conv_b/add packed,
    # s unpacked for the pool, f packed for the dense layer, y unpacked at the end
    assert [layer.conversions for layer in out.layers] == [1, 0, 0, 1, 0, 1]
    assert [layer.where for layer in out.layers] == ["accel", "accel", "accel", "cpu", "cpu", "accel"]
    assert out.layers[0].macs == CONV_A_MACS and out.layers[0].gemm_uops > 0


def test_save_load_round_trip(tmp_path):
    compiled = compile_graph(toy_graph(), VTAConfig(), policy="accel")
    path = tmp_path / "toy.vtac"
    compiled.save(path)
    loaded = Compiled.load(path)
    assert loaded.cfg == compiled.cfg and len(loaded.steps) == len(compiled.steps)
    np.testing.assert_array_equal(run(loaded, toy_inputs()).outputs["y"], run(compiled, toy_inputs()).outputs["y"])
    bad = tmp_path / "bad.vtac"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"bad\.vtac is not a vta-lab compiled model: it is not a zip file \(it "
                                         r"starts with b'not '\); write one with `vta compile MODEL -o FILE\.vtac`$"):
        Compiled.load(bad)


def test_partition_decisions():
    cfg = VTAConfig()
    d = partition(toy_graph(), cfg, policy="accel", force_cpu={"conv_b"})
    assert [(x.node, x.target) for x in d.values()] == [("conv_a", "accel"), ("conv_b", "cpu"), ("add", "accel"),
                                                        ("pool", "cpu"), ("flat", "cpu"), ("fc", "accel")]
    assert d["conv_b"].reason == "forced onto the CPU"
    assert d["pool"].reason == "MaxPool has no accelerator rule"
    assert all(x.target == "cpu" for x in partition(toy_graph(), cfg, policy="cpu").values())
    auto = partition(toy_graph(), cfg)
    assert auto["conv_a"].accel_us is not None and auto["conv_a"].cpu_us is not None
    assert auto["conv_a"].reason.startswith("faster" if auto["conv_a"].target == "accel" else "the CPU is faster")
    unsupported = partition(toy_graph(pads=(1, 16, 1, 1)), cfg, policy="accel")
    assert unsupported["conv_a"].target == "cpu"
    assert unsupported["conv_a"].reason.startswith("not supported on 1x16_i8w8a32_15_15_18_17: padding (1, 16, 1, 1)")
    with pytest.raises(ValueError, match="policy must be one of auto, accel, cpu, not 'gpu'"):
        partition(toy_graph(), cfg, policy="gpu")


def test_run_errors():
    compiled = compile_graph(toy_graph(), VTAConfig(), policy="accel")
    with pytest.raises(ValueError, match=r"^unknown backend 'npu'; known backends are cpu, fsim, gpu, tsim$"):
        run(compiled, toy_inputs(), target="npu")
    with pytest.raises(RuntimeFailure, match="input 'x' is missing; the model takes x"):
        run(compiled, {})
    with pytest.raises(RuntimeFailure, match=r"input 'x' has shape \(1, 12, 8\); the model expects \(1, 12, 8, 8\)"):
        run(compiled, {"x": np.zeros((1, 12, 8), np.int8)})


def test_report_outputs(tmp_path):
    compiled = compile_graph(toy_graph(), VTAConfig(), policy="accel")
    out = run(compiled, toy_inputs())
    report = build_report(compiled, out, model="toy")
    assert [r["layer"] for r in report.rows] == ["conv_a", "conv_b", "add", "pool", "flat", "fc"]
    assert set(report.rows[0]) == set(COLUMNS)
    t = report.totals
    assert t["accel_layers"] == 4 and t["cpu_layers"] == 2 and t["cycles"] is None
    assert t["macs"] == CONV_A_MACS + CONV_B_MACS + 10 * 320
    assert t["gemm_uops"] == sum(layer.gemm_uops for layer in out.layers) > 0
    text = report.format(reasons=True)
    assert text.splitlines()[0] == "toy on fsim (1x16_i8w8a32_15_15_18_17)"
    assert "MaxPool has no accelerator rule" in text
    report.write_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["totals"]["accel_layers"] == 4
    report.write_csv(tmp_path / "r.csv")
    assert (tmp_path / "r.csv").read_text().splitlines()[0] == ",".join(COLUMNS)
    report.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


def test_step_kinds():
    compiled = compile_graph(toy_graph(), VTAConfig(), policy="accel")
    conv = compiled.steps[0]
    assert isinstance(conv, AccelStep) and conv.inputs == ["x"] and conv.output == "a"
    add = compiled.steps[2]
    assert isinstance(add, AccelStep) and add.inputs == ["a", "b"]
    assert isinstance(compiled.steps[3], CpuStep) and compiled.steps[3].where == "cpu"


def test_stem_conv_folds_kernel_columns():
    """A first convolution with 3 input channels folds its 7 kernel columns into channels: 3.5x fewer GEMM uops."""
    rng = np.random.default_rng(4)
    g = graph_with_input("stem", (1, 3, 20, 20))
    add_random_weights(g, rng, "w", "b", (16, 3, 7, 7))
    g.add_tensor("y", (1, 16, 10, 10), "int8", 0.1)
    g.add_node("QConv2d", "stem", ["x", "w", "b"], ["y"], strides=(2, 2), pads=(3, 3, 3, 3), groups=1,
               requant=Requant(rng.integers(1, 100, 16), rng.integers(10, 14, 16), 0, 127))
    g.outputs.append("y")
    compiled = compile_graph(g, VTAConfig(), policy="accel")
    step = compiled.steps[0]
    assert step.fold is not None and (step.fold.kw, step.fold.sw, step.fold.pad_left) == (7, 2, 3)
    assert step.tiling.endswith("kw-folded") and step.macs == 16 * 100 * 3 * 49
    assert step.gemm_uops == 100 + 2 * 7 * 100  # reset + (2 folded channel blocks x 7 kernel rows) per pixel
    x = np.random.default_rng(9).integers(-128, 128, (1, 3, 20, 20)).astype(np.int8)
    out = run(compiled, {"x": x})
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(g, {"x": x})["y"])
    assert out.layers[0].conversions == 1  # the input folded and packed once (the final unpack is not a layer's)


def test_report_utilization_with_cycles():
    """With cycle counts (tsim), each layer's utilization is MACs / (cycles * MACs per cycle)."""
    from vta.compiler.runtime.executor import LayerStat, RunOutput
    compiled = compile_graph(toy_graph(), VTAConfig(), policy="accel")
    # 1080 cycles x 256 MACs a cycle = twice conv_a's 138,240 MACs: utilization 0.5
    layers = [LayerStat("conv_a", "QConv2d", "accel", CONV_A_MACS, 100, 50, cycles=1080),
              LayerStat("pool", "MaxPool", "cpu", 0)]
    report = build_report(compiled, RunOutput({}, layers, "tsim", "1x16_i8w8a32_15_15_18_17"))
    assert report.rows[0]["util"] == 0.5 and report.rows[1]["util"] is None
    t = report.totals
    assert (t["cycles"], t["util"], t["accel_ms_at_clock"]) == (1080, 0.5, round(1080 / report.clock_mhz / 1e3, 3))
    text = report.format()
    assert f"accelerator time at {report.clock_mhz:.4g} MHz ({report.clock_source}" in text and " 50% " in text
    assert t["latency_us"] == round(1080 / report.clock_mhz, 3) and t["latency_cycles"] == "measured"


def test_single_thread_compile_is_exact():
    compiled = compile_graph(toy_graph(), VTAConfig(log_acc_buff_size=12), policy="accel", double_buffer=False)
    assert compiled.meta["double_buffer"] is False
    assert all(s.program is not None for s in compiled.steps if isinstance(s, AccelStep))
    ref = qops.run_reference(toy_graph(), toy_inputs())["y"]
    np.testing.assert_array_equal(run(compiled, toy_inputs()).outputs["y"], ref)


def test_report_module_breakdown(tmp_path):
    """tsim layers carry the core's per-module cycle counters; the report sums them and derives idle cycles."""
    from vta.compiler.runtime.executor import LayerStat, RunOutput
    compiled = compile_graph(toy_graph(), VTAConfig(), policy="accel")

    def modules(busy: int, token: int, mem: int) -> dict[str, dict[str, int]]:
        return {m: {"busy": busy, "wait_token": token, "wait_mem": mem} for m in ("fetch", "load", "compute", "store")}
    layers = [LayerStat("conv_a", "QConv2d", "accel", CONV_A_MACS, 100, 50, cycles=1000,
                        modules=modules(600, 200, 100)),
              LayerStat("conv_b", "QConv2d", "accel", CONV_B_MACS, 100, 50, cycles=1000,
                        modules=modules(900, 0, 50)),
              LayerStat("pool", "MaxPool", "cpu", 0)]
    report = build_report(compiled, RunOutput({}, layers, "tsim", "1x16_i8w8a32_15_15_18_17"))
    assert report.rows[0]["compute_busy"] == 600 and report.rows[2]["compute_busy"] is None
    assert report.module_breakdown()["compute"] == {"busy": 1500, "wait_token": 200, "wait_mem": 150, "idle": 150}
    lines = report.format_modules()
    assert lines[2] == "  fetch      75.0%       10.0%      7.5%    7.5%"
    report.plot(tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    fsim_report = build_report(compiled, run(compiled, toy_inputs()))
    assert fsim_report.module_breakdown() is None and fsim_report.format_modules() == []
