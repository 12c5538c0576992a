"""Tests for vta.compiler.lowering.schedule: every plan fits the buffers of its config (configs/*.toml), covers the
output exactly once, has the exact tile sizes pinned for known layers, and the errors name the limit."""
from pathlib import Path

import pytest

from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.schedule import ConvGeometry, ConvTiling, ScheduleError, plan_conv, plan_eltwise
from vta.config import VTAConfig, load_config

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
CONFIGS = {path.stem: load_config(path) for path in sorted(CONFIG_DIR.glob("*.toml"))}

LAYERS = {
    # name: (input NCHW or [N, K], weights [O, C/groups, KH, KW] or [O, K], strides, pads, groups)
    "stem7x7s2": ((1, 3, 224, 224), (64, 3, 7, 7), (2, 2), (3, 3, 3, 3), 1),
    "res3x3": ((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "down3x3s2": ((1, 128, 28, 28), (256, 128, 3, 3), (2, 2), (1, 1, 1, 1), 1),
    "proj1x1s2": ((1, 256, 14, 14), (512, 256, 1, 1), (2, 2), (0, 0, 0, 0), 1),
    "deep3x3": ((1, 512, 7, 7), (512, 512, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "depthwise": ((1, 32, 16, 16), (32, 1, 3, 3), (1, 1), (1, 1, 1, 1), 32),
    "dense": ((1, 512), (1000, 512), (1, 1), (0, 0, 0, 0), 1),
    "batch2": ((2, 16, 8, 8), (32, 16, 3, 3), (1, 1), (1, 1, 1, 1), 1),
}


def _geom(layer: str, cfg: VTAConfig) -> ConvGeometry:
    x, w, strides, pads, groups = LAYERS[layer]
    return ConvGeometry.make(x, w, strides=strides, pads=pads, groups=groups, intr=intrinsics(cfg))


def test_the_config_folder_has_the_small_and_batch2_configs():
    assert {"small1x8", "batch2x16", "default"} <= set(CONFIGS)
    assert (CONFIGS["small1x8"].block_in, CONFIGS["batch2x16"].batch) == (8, 2)


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("name", CONFIGS)
def test_plans_fit_the_buffers(name, layer, threads):
    cfg = CONFIGS[name]
    intr = intrinsics(cfg)
    t = plan_conv(_geom(layer, cfg), intr, threads=threads)
    assert t.check(intr) == []
    assert t.inp_entries <= intr.capacity("inp") // threads
    assert t.wgt_entries <= intr.capacity("wgt") // threads
    assert t.acc_entries <= intr.capacity("acc") // threads
    assert t.wgt_entries <= intr.uop_depth // 4
    assert max(t.acc_tile, t.oh_tile, t.ow_tile) <= intr.loop_max


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("name", ["default", "small1x8", "batch2x16"])
def test_tiles_cover_every_output_entry_once(name, layer):
    cfg = CONFIGS[name]
    g = _geom(layer, cfg)
    covered = set()
    for tile in plan_conv(g, intrinsics(cfg)).tiles():
        for entry in ((tile.nbi, b, r, c) for b in range(tile.ob0, tile.ob0 + tile.oct)
                      for r in range(tile.r0, tile.r0 + tile.toh) for c in range(tile.c0, tile.c0 + tile.tow)):
            assert entry not in covered
            covered.add(entry)
    assert len(covered) == g.nb * g.ob * g.oh * g.ow


@pytest.mark.parametrize("name, threads, expected", [
    # (oc_tile, ic_tile, oh_tile, ow_tile, kh_tile, estimated DMA bytes, tiles)
    ("default", 2, (4, 2, 9, 28, 3, 1016960, 14)),
    ("default", 1, (4, 2, 9, 56, 3, 746816, 7)),
    ("small1x8", 2, (4, 2, 9, 28, 3, 1320704, 28)),
    ("small1x8", 1, (5, 4, 14, 28, 3, 993536, 16)),
    ("batch2x16", 2, (4, 2, 8, 14, 3, 2016000, 28)),
])
def test_exact_plan_of_a_resnet_layer(name, threads, expected):
    """ResNet-18's 3x3 convolution of layer1 (64 -> 64 channels, 56x56)."""
    cfg = CONFIGS[name]
    intr = intrinsics(cfg)
    t = plan_conv(_geom("res3x3", cfg), intr, threads=threads)
    got = (t.oc_tile, t.ic_tile, t.oh_tile, t.ow_tile, t.kh_tile, t.dma_bytes(intr), len(list(t.tiles())))
    assert got == expected


def test_exact_plan_of_a_small_layer():
    """A 16 -> 32 channel 3x3 convolution on 8x8 fits one tile at the default config."""
    intr = intrinsics(VTAConfig())
    g = ConvGeometry.make((1, 16, 8, 8), (32, 16, 3, 3), pads=(1, 1, 1, 1), intr=intr)
    t = plan_conv(g, intr)
    assert (g.ib, g.ob, g.oh, g.ow, g.macs) == (1, 2, 8, 8, 8 * 8 * 32 * 16 * 3 * 3)
    assert (t.oc_tile, t.ic_tile, t.oh_tile, t.ow_tile, t.kh_tile) == (2, 1, 8, 8, 3)
    assert (t.in_rows, t.in_cols, t.inp_entries, t.wgt_entries, t.acc_entries) == (10, 10, 100, 18, 134)
    assert t.dma_bytes(intr) == 8464
    (tile,) = t.tiles()
    assert tile.steps == ((0, 1, 0, 1), (0, 1, 1, 3))  # the layer's first (only) step: its first kernel row, the rest


def test_eltwise_tiles():
    intr = intrinsics(VTAConfig())
    plan = plan_eltwise(1000, intr)
    assert plan.tile == 512  # 2048 acc entries: two operands in each of two halves
    assert list(plan.tiles()) == [(0, 512), (512, 488)]
    assert plan_eltwise(1000, intrinsics(CONFIGS["batch2x16"])).tile == 256
    assert plan_eltwise(1000, intr, threads=1).tile == 1000


def test_eltwise_needs_an_element():
    with pytest.raises(ScheduleError, match=r"^an elementwise op needs at least one element, not 0$"):
        plan_eltwise(0, intrinsics(VTAConfig()))


def test_no_tiling_fits_names_the_limits():
    intr = intrinsics(VTAConfig())
    g = ConvGeometry.make((1, 16, 1, 4000), (16, 16, 1, 4000), intr=intr)
    with pytest.raises(ScheduleError, match=r"^no tiling fits: even a one-pixel tile breaks these limits: the input "
                                            r"tile needs 4000 inp entries, more than half the buffer \(1024\)"):
        plan_conv(g, intr)


def test_threads_must_be_one_or_two():
    intr = intrinsics(VTAConfig())
    g = _geom("dense", VTAConfig())
    message = r"^threads must be 1 \(no latency hiding\) or 2 \(double buffering\), not 3$"
    with pytest.raises(ValueError, match=message):
        plan_conv(g, intr, threads=3)
    with pytest.raises(ValueError, match=message):
        ConvTiling(g, 1, 1, 1, 1, threads=3)


def test_weights_must_match_the_channels():
    with pytest.raises(ScheduleError, match=r"^weights \(8, 3, 3, 3\) with groups=1 do not match 4 input channels$"):
        ConvGeometry.make((1, 4, 8, 8), (8, 3, 3, 3), intr=intrinsics(VTAConfig()))


def _max_rows_by_search(t: ConvTiling, intr) -> int:
    """The reference for schedule._max_rows: the largest row count ConvTiling.check accepts, by bisection."""
    from dataclasses import replace
    best, lo, hi = 0, 1, t.geom.oh
    while lo <= hi:
        mid = (lo + hi) // 2
        if replace(t, oh_tile=mid).check(intr):
            hi = mid - 1
        else:
            best, lo = mid, mid + 1
    return best


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_max_rows_closed_form_matches_the_checks(name):
    """The closed-form row limit the candidate enumeration uses equals the largest row count check() accepts, for
    every layer, output-block, reduction, width, thread and bias option (the rows of each tiling)."""
    import random

    from vta.compiler.lowering.schedule import _halvings, _max_rows, _reduction_candidates
    cfg = CONFIGS[name]
    intr = intrinsics(cfg)
    rng = random.Random(0)
    compared = 0
    for layer in LAYERS:
        g = _geom(layer, cfg)
        _, nib = g.block_ranges
        for th in (1, 2):
            for oct in _halvings(g.ob):
                for ict, kht in _reduction_candidates(nib, g.kh):
                    for tow in sorted({*_halvings(g.ow), rng.randint(1, g.ow)}):
                        for bias in (False, True):
                            t = ConvTiling(g, oct, ict, 1, tow, kht, th, "oc", bias)
                            assert _max_rows(t, intr) == _max_rows_by_search(t, intr), t
                            compared += 1
    assert compared > 100
