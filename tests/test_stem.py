"""The first convolution's lowerings (compiler.partition.STEMS): im2col with the bias in spare lanes, the kernel-column
fold, none; each bit-exact through fsim, and the choice and its estimates in the decision's reason."""
import numpy as np
import pytest

from vta.compiler import qops
from vta.compiler.ir import Graph
from vta.compiler.lowering.layout import (
    bias_lane_values,
    bias_lane_weights,
    im2col,
    im2col_packed,
    im2col_weights,
    pack_activation,
)
from vta.compiler.pipeline import compile_graph
from vta.compiler.qops import Requant
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig


def test_bias_lane_weights_exact_or_none():
    rng = np.random.default_rng(0)
    bias = rng.integers(-190_000, 190_000, 500)
    w = bias_lane_weights(bias, 13)
    assert w is not None and w.dtype == np.int8 and w.shape == (500, 13)
    np.testing.assert_array_equal(w.astype(np.int64) @ bias_lane_values(13).astype(np.int64), bias)
    assert bias_lane_weights(np.array([10 ** 7]), 13) is None          # beyond 12 lanes of 127 x 128
    np.testing.assert_array_equal(bias_lane_weights(np.array([5, -128]), 1), [[5], [-128]])
    assert bias_lane_weights(np.array([300]), 1) is None


def test_im2col_is_the_convolution():
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (2, 3, 11, 9)).astype(np.int8)
    w = rng.integers(-128, 128, (5, 3, 3, 5)).astype(np.int8)
    b = rng.integers(-30_000, 30_000, 5).astype(np.int32)  # within 2 lanes of 127 x 128 plus the last lane
    lanes = 3
    cols = im2col(x, kh=3, kw=5, sh=2, sw=1, pads=(1, 2, 0, 2), bias_lanes=lanes)
    wk = im2col_weights(w, bias_lane_weights(b, lanes))
    assert cols.shape == (2, 45 + lanes, 5, 9) and wk.shape == (5, 45 + lanes, 1, 1)
    got = np.einsum("nkhw,ok->nohw", cols.astype(np.int64), wk[:, :, 0, 0].astype(np.int64))
    np.testing.assert_array_equal(got, qops.conv2d_acc(x, w, b, (2, 1), (1, 2, 0, 2), 1))


@pytest.mark.parametrize("batch,block", [(1, 16), (2, 8), (1, 32)])
def test_im2col_packed_equals_packing_im2col(batch, block):
    x = np.random.default_rng(3).integers(-128, 128, (3, 3, 13, 10)).astype(np.int8)
    kwargs = dict(kh=7, kw=5, sh=2, sw=3, pads=(3, 2, 1, 2))
    lanes = -(3 * 35) % block
    np.testing.assert_array_equal(im2col_packed(x, bias_lanes=lanes, batch=batch, block=block, **kwargs),
                                  pack_activation(im2col(x, bias_lanes=lanes, **kwargs), batch=batch, block=block))


def _stem_graph(bias_range: int) -> Graph:
    rng = np.random.default_rng(4)
    g = Graph("stem")
    g.add_tensor("x", (1, 3, 20, 20), "int8", 0.05)
    g.inputs.append("x")
    g.add_constant("w", rng.integers(-60, 60, (16, 3, 7, 7)).astype(np.int8))
    g.add_constant("b", rng.integers(-bias_range, bias_range, 16).astype(np.int32))
    g.add_tensor("y", (1, 16, 10, 10), "int8", 0.1)
    g.add_node("QConv2d", "stem", ["x", "w", "b"], ["y"], strides=(2, 2), pads=(3, 3, 3, 3), groups=1,
               requant=Requant(rng.integers(1, 100, 16), rng.integers(10, 14, 16), 0, 127))
    g.outputs.append("y")
    return g


@pytest.mark.parametrize("stem", ["im2col", "columns", "direct", "auto"])
def test_stem_lowerings_bit_exact(stem):
    g = _stem_graph(90_000)
    compiled = compile_graph(g, VTAConfig(), policy="accel", stem=stem)
    step = compiled.steps[0]
    x = np.random.default_rng(9).integers(-128, 128, (1, 3, 20, 20)).astype(np.int8)
    out = run(compiled, {"x": x})
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(g, {"x": x})["y"])
    reason = compiled.decisions["stem"].reason
    assert "im2col" in reason and "kw-folded" in reason and "uops/vector" in reason
    if stem == "im2col":
        # 147 taps x channels in 10 blocks: reset + 10 GEMM micro-ops per pixel; the bias rides in the 13 spare
        # lanes, so the ALU runs MUL, SHR, MAX, MIN (no ADD)
        assert step.fold is not None and step.fold.kh == 7 and step.fold.bias_lanes == 13
        assert step.tiling.endswith("im2col") and step.gemm_uops == 100 + 10 * 100 and step.alu_uops == 4 * 100
    elif stem == "direct":
        assert step.fold is None


def test_im2col_keeps_the_add_when_the_bias_is_out_of_reach():
    g = _stem_graph(100_000_000)
    compiled = compile_graph(g, VTAConfig(), policy="accel", stem="im2col")
    step = compiled.steps[0]
    assert step.fold is not None and step.fold.bias_lanes == 0 and step.alu_uops == 5 * 100
    x = np.random.default_rng(2).integers(-128, 128, (1, 3, 20, 20)).astype(np.int8)
    np.testing.assert_array_equal(run(compiled, {"x": x}).outputs["y"], qops.run_reference(g, {"x": x})["y"])


@pytest.mark.parametrize("knobs", [{}, {"fused_requant": True, "gemm_overwrite": True}, {"concurrent_alu": True}])
@pytest.mark.parametrize("bias_range", [90_000, 100_000_000])
def test_stem_estimates_count_the_micro_ops_each_lowering_issues(knobs, bias_range):
    """The micro-ops per output vector that the stem's estimate counts (in the partition's reason) are the ones the
    compiled layer issues, for every lowering and with the knobs that change them (REQ for four passes, no reset
    micro-op with gemm_overwrite), the bias in im2col's spare lanes or out of their reach."""
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.partition import stem_costs
    cfg = VTAConfig(**knobs)
    g = _stem_graph(bias_range)
    costs = stem_costs(g, g.nodes[0], intrinsics(cfg))
    for stem, name in (("im2col", "im2col"), ("columns", "columns"), ("direct", "direct")):
        step = compile_graph(g, cfg, policy="accel", stem=stem).steps[0]
        vectors = 100  # 10x10 output pixels, one output block
        issued = step.gemm_uops + step.alu_uops
        assert costs[name][1] * vectors == issued, (stem, costs[name][1], issued / vectors)


def test_unknown_stem():
    with pytest.raises(ValueError, match="stem must be one of auto, im2col, columns, direct, not 'x'"):
        compile_graph(_stem_graph(10), VTAConfig(), policy="accel", stem="x")


def test_cli_stem_option(tmp_path):
    """vta compile --stem columns keeps tiny_cnn's first convolution kw-folded (auto takes im2col)."""
    from vta.cli import main
    from vta.compiler.runtime.compiled import AccelStep, Compiled
    labels = {}
    for stem in ("columns", "auto"):
        out = tmp_path / f"{stem}.vtac"
        assert main(["compile", "tiny_cnn", "--policy", "accel", "--calib", "1", "--no-progress", "--stem", stem,
                     "-o", str(out)]) == 0
        first = next(s for s in Compiled.load(out).steps if isinstance(s, AccelStep))
        labels[stem] = first.tiling.split()[-1]
    assert labels == {"columns": "kw-folded", "auto": "im2col"}
