"""Tests for the schedule search ranked by the cycle model (vta.compiler.lowering.search.search_conv): candidates fit
the buffers, the new tiling options (bias loaded as the accumulators' start, pixel-outer loop order) stay bit-exact on
fsim, the search is never worse than plan_conv by the model, and its results are cached in memory and on disk."""
import json

import numpy as np
import pytest
from test_codegen import _conv_case

from vta.compiler.lowering import search
from vta.compiler.lowering.codegen import ConvLayer, alu_passes, build_conv_program
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.schedule import ConvTiling, conv_candidates, plan_conv
from vta.compiler.lowering.search import SearchCache, search_conv, tiling_from_dict, tiling_to_dict
from vta.compiler.pipeline import compile_model
from vta.compiler.runtime.compiled import AccelStep
from vta.config import VTAConfig
from vta.cost import estimate


def _layer(c: int = 40, hw: int = 11, o: int = 40, k: int = 3, seed: int = 0) -> ConvLayer:
    rng = np.random.default_rng(seed)
    intr = intrinsics(VTAConfig())
    w = rng.integers(-128, 128, (o, c, k, k)).astype(np.int8)
    return ConvLayer.make((1, c, hw, hw), w, rng.integers(-5000, 5000, o), rng.integers(1, 300, o),
                          rng.integers(8, 16, o), 0, 127, pads=(k // 2,) * 4, intr=intr)


@pytest.mark.parametrize("tiles", [(1, 1, 2, 3, 3, 2, "oc", True), (2, 2, 4, 5, 3, 2, "pixel", True),
                                   (1, 2, 11, 10, 3, 1, "pixel", True), (3, 1, 3, 4, 3, 2, "pixel", False),
                                   (1, 1, 3, 10, 2, 2, "oc", True)])
def test_bias_load_and_pixel_order_are_exact(tiles):
    got, expected, code, stats = _conv_case(VTAConfig(), 1, 40, 11, 10, 40, 3, 1, 1, 1, tiles=tiles, seed=3)
    np.testing.assert_array_equal(got, expected)
    assert stats["gemm_uops"] == code.gemm_uops and stats["alu_uops"] == code.alu_uops
    outputs = 3 * 11 * 10  # output blocks x pixels: one ALU pass fewer and no reset when the bias is loaded
    assert code.alu_uops == outputs * (4 if tiles[7] else 5)


def test_alu_passes():
    layer = _layer()
    assert alu_passes(layer) == ["ADD", "MUL", "SHR", "MAX", "MIN"]
    assert alu_passes(layer, bias_load=True) == ["MUL", "SHR", "MAX", "MIN"]


def test_candidates_fit_and_include_the_byte_planner():
    intr = intrinsics(VTAConfig())
    layer = _layer(64, 14, 64)
    cands = conv_candidates(layer.geom, intr)
    assert all(not t.check(intr) for t in cands)
    assert {t.threads for t in cands} == {1, 2} and {t.order for t in cands} == {"oc", "pixel"}
    assert {t.bias_load for t in cands} == {False, True}
    assert plan_conv(layer.geom, intr) in cands
    assert {t.threads for t in conv_candidates(layer.geom, intr, threads=(1,))} == {1}


def test_search_beats_or_equals_plan_conv_and_reports_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    cfg = VTAConfig()
    layer = _layer(64, 14, 64)
    result = search_conv(cfg, layer, use_cache=False)
    program, _ = build_conv_program(cfg, layer, None, result.tiling)
    assert estimate(program).cycles == result.predicted_cycles
    baseline, _ = build_conv_program(cfg, layer)
    assert result.predicted_cycles <= estimate(baseline).cycles
    assert result.evaluated >= 2 and result.source == "search"


def test_search_cache_in_memory_and_on_disk(tmp_path):
    cache = SearchCache(tmp_path / "schedules")
    cfg = VTAConfig()
    layer = _layer(32, 9, 48, seed=1)
    first = search_conv(cfg, layer, cache=cache)
    files = list((tmp_path / "schedules").glob("*.json"))
    assert len(files) == 1 and first.source == "search"
    data = json.loads(files[0].read_text())
    assert tiling_from_dict(layer.geom, data["tiling"]) == first.tiling
    assert data["predicted_cycles"] == first.predicted_cycles
    assert search_conv(cfg, layer, cache=cache).source == "memory"
    cache.results.clear()
    again = search_conv(cfg, layer, cache=cache)
    assert (again.source, again.tiling, again.predicted_cycles) == ("disk", first.tiling, first.predicted_cycles)
    files[0].write_text("{not json")  # a damaged entry is searched again and rewritten
    cache.results.clear()
    assert search_conv(cfg, layer, cache=cache).source == "search"
    assert json.loads(files[0].read_text())["tiling"] == tiling_to_dict(first.tiling)
    left = [p for p in (tmp_path / "schedules").rglob("*") if p.is_file() and p.suffix != ".json"]
    assert not left  # no temporary files left
    assert len(list((tmp_path / "schedules" / "candidates").glob("*.json"))) == first.built_programs
    # another process (a new cache: empty memory) searching afresh finds every candidate's plan on disk
    files[0].unlink()
    other = search_conv(cfg, layer, cache=SearchCache(tmp_path / "schedules"))
    assert (other.source, other.tiling, other.predicted_cycles) == ("search", first.tiling, first.predicted_cycles)
    assert other.built_programs == 0 and other.plan == first.plan


def test_tiling_dict_round_trip():
    layer = _layer()
    t = ConvTiling(layer.geom, 2, 1, 4, 5, 3, 1, "pixel", True)
    data = json.loads(json.dumps(tiling_to_dict(t)))
    assert tiling_from_dict(layer.geom, data) == t
    with pytest.raises(ValueError, match="order must be one of oc, pixel, not 'rows'"):
        ConvTiling(layer.geom, 1, 1, 1, 1, order="rows")


def test_steps_record_schedule_and_prediction(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    compiled = compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2)
    for step in compiled.steps:
        if isinstance(step, AccelStep):
            est = estimate(step.program)
            assert step.predicted_cycles == est.cycles and step.schedule["bound"] == est.bound
            json.dumps(step.schedule)  # plain data, for the artefact
    single = compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2, double_buffer=False)
    assert all(s.schedule["threads"] == 1 for s in single.steps if isinstance(s, AccelStep) and s.macs)


def test_buffer_sizes_reach_a_tiling_only_as_sram_bases(tmp_path):
    """The candidate memo (search._candidate_key) shares predictions between configs that differ only in the inp,
    wgt and acc buffer sizes: for one tiling their programs differ only in SRAM base addresses and micro-op words,
    and the cycle model predicts the same cycles; a search under the second config with the memo filled by the first
    picks what a fresh search picks."""
    import dataclasses

    from vta.isa import Alu, Gemm
    cache = SearchCache(tmp_path)
    small = VTAConfig(log_inp_buff_size=14, log_wgt_buff_size=17, log_acc_buff_size=16)
    big = VTAConfig()  # the same 32-bit micro-ops: larger buffers would need 64-bit ones (another key)
    assert small.uop_bits == big.uop_bits
    layer = _layer(64, 14, 64, seed=2)
    for t in conv_candidates(layer.geom, intrinsics(small))[::97]:
        a, _ = build_conv_program(small, layer, None, t)
        b, _ = build_conv_program(big, layer, None, t)
        strip = [dataclasses.replace(i, sram_base=0) if hasattr(i, "sram_base") else i for i in a.insns]
        assert strip == [dataclasses.replace(i, sram_base=0) if hasattr(i, "sram_base") else i for i in b.insns]
        assert any(isinstance(i, (Gemm, Alu)) for i in a.insns)
        assert estimate(a).cycles == estimate(b).cycles
        assert search._candidate_key(layer, small, t) == search._candidate_key(layer, big, t)
    search_conv(small, layer, use_cache=False, cache=cache)
    fresh = search_conv(big, layer, use_cache=False, cache=cache)
    cache.results.clear()
    search_conv(small, layer, cache=cache)
    memo = search_conv(big, layer, cache=cache)
    assert (memo.tiling, memo.predicted_cycles) == (fresh.tiling, fresh.predicted_cycles)
    assert memo.built_programs < memo.evaluated


@pytest.mark.parametrize("cfg", [VTAConfig(), VTAConfig(log_block=3, bus_bytes=16, log_acc_buff_size=16)],
                         ids=["default", "block8"])
def test_plan_graph_predicts_what_compile_graph_builds(cfg, tmp_path):
    """plan_graph (a model-mode sweep's compile, without programs) gives each accelerator layer the schedule,
    predicted cycles, bounding module and event counts of compile_graph's program, from a cold cache and again
    from a warm one."""
    from vta.compiler.pipeline import compile_graph, plan_graph
    from vta.counts import program_counts
    from vta.sweep.measure import _quantized
    cache = SearchCache(tmp_path)
    graph = _quantized("mini_resnet", cfg)
    planned = plan_graph(graph, cfg, search_cache=cache)
    compiled = compile_graph(graph, cfg, search_cache=cache)
    steps = [s for s in compiled.steps if isinstance(s, AccelStep)]
    assert len(steps) == len(planned.layers) == compiled.accel_steps > 0
    assert [s.node.name for s in compiled.steps if s.where == "cpu"] == [s.node.name for s in planned.cpu]
    for step, layer in zip(steps, planned.layers):
        assert (layer.node.name, layer.macs, layer.schedule) == (step.node.name, step.macs, step.schedule)
        assert (layer.plan.cycles, layer.plan.bound) == (step.predicted_cycles, step.schedule["bound"])
        assert layer.plan.counts == program_counts(step.program)
    cache.results.clear()
    again = plan_graph(graph, cfg, search_cache=cache)
    assert [(x.plan, x.schedule) for x in again.layers] == [(x.plan, x.schedule) for x in planned.layers]
