"""Tests for vta.compiler.lowering.codegen and schedule: single layers lowered to programs, checked on vta.fsim bit
for bit against the integer reference (vta.compiler.qops) at several configs and tilings."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vta.backend import get_backend
from vta.compiler import qops
from vta.compiler.ir import AddRequant, Requant
from vta.compiler.lowering.codegen import OUTPUT, AddLayer, ConvLayer, build_add_program, build_conv_program
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.layout import pack_activation, unpack_activation
from vta.compiler.lowering.schedule import ConvGeometry, ConvTiling, ScheduleError, plan_conv, plan_eltwise
from vta.compiler.lowering.uopcache import UopCache
from vta.config import MEM_ACC, MEM_INP, VTAConfig
from vta.isa import Alu, Gemm, Load, Uop
from vta.program import ProgramBuilder

CONFIGS = {
    "default": VTAConfig(),
    "block8": VTAConfig(log_block=3),
    "block32": VTAConfig(log_block=5),
    "batch2": VTAConfig(log_batch=1),
}


def _conv_case(cfg, n, c, h, w, o, k, s, p, g, *, per_channel=True, lo=-128, hi=127, seed=0, tiles=None,
               threads=2):
    """Run one quantized conv on fsim; return (got, expected, code, stats)."""
    rng = np.random.default_rng(seed)
    intr = intrinsics(cfg)
    x = rng.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    wt = rng.integers(-128, 128, (o, c // g, k, k)).astype(np.int8)
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    m = rng.integers(1, 300, o) if per_channel else np.full(o, 3)
    sh = rng.integers(8, 16, o) if per_channel else np.full(o, 11)
    expected = qops.qconv2d(x, wt, bias, Requant(m, sh, lo, hi), (s, s), (p, p, p, p), g)
    layer = ConvLayer.make(x.shape, wt, bias, m, sh, lo, hi, strides=(s, s), pads=(p, p, p, p), groups=g, intr=intr)
    tiling = ConvTiling(layer.geom, *tiles) if tiles else None
    program, code = build_conv_program(cfg, layer, pack_activation(x, batch=intr.batch, block=intr.block_in), tiling,
                                       threads=threads)
    result = get_backend("fsim").run(program)
    got = unpack_activation(program.read(OUTPUT, result.dram), expected.shape)
    return got, expected, code, result.stats


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("case", [
    (1, 20, 9, 9, 24, 3, 1, 1, 1),      # 3x3 same padding, channels not block multiples
    (1, 3, 17, 17, 20, 7, 2, 3, 1),     # ResNet stem shape: 7x7 stride 2 pad 3
    (1, 32, 8, 8, 40, 1, 2, 0, 1),      # 1x1 stride 2 (downsample)
    (1, 24, 9, 9, 24, 3, 1, 1, 24),     # depthwise
    (3, 24, 6, 7, 48, 3, 2, 1, 3),      # grouped, batch not a multiple of BATCH=2
], ids=["3x3", "7x7s2", "1x1s2", "depthwise", "grouped"])
def test_conv_matches_reference(cfg, case):
    got, expected, code, stats = _conv_case(cfg, *case)
    np.testing.assert_array_equal(got, expected)
    assert stats["gemm_uops"] == code.gemm_uops and stats["alu_uops"] == code.alu_uops


@pytest.mark.parametrize("tiles", [(1, 1, 2, 3), (2, 2, 2, 3), (3, 1, 4, 4), (1, 2, 11, 10), (2, 1, 11, 5, 1),
                                   (1, 1, 3, 10, 2)])
def test_conv_forced_tilings(tiles):
    """Many tiles, edge tiles, split reductions (over input blocks and kernel rows): double buffering and tokens
    must keep results exact."""
    got, expected, code, stats = _conv_case(VTAConfig(), 1, 40, 11, 10, 40, 3, 1, 1, 1, tiles=tiles, seed=3)
    np.testing.assert_array_equal(got, expected)
    n_tiles = -(-3 // tiles[0]) * -(-11 // tiles[2]) * -(-10 // tiles[3])
    assert code.tiles == n_tiles
    kh_steps = -(-3 // tiles[4]) if len(tiles) > 4 else 1
    # steps whose rows are all top/bottom border are skipped: with one-row kernel steps and tiles of whole height,
    # none is; with 3-row tiles and 2-row kernel steps neither (every tile reads real rows through each step)
    # the first tile's first step comes as its first kernel row and the others when it has one input block
    lead = 1 if tiles[1] > 1 or (len(tiles) > 4 and tiles[4] == 1) else 2
    steps = n_tiles * -(-3 // tiles[1]) * kh_steps + lead - 1
    assert stats["load_to_compute_pops"] == steps
    assert stats["compute_to_load_pops"] == max(steps - 2, 0)


def test_single_thread_programs():
    """threads=1: whole buffers, every step waits for the previous one (distance-1 tokens); still exact."""
    got, expected, code, stats = _conv_case(VTAConfig(), 1, 40, 11, 10, 40, 3, 1, 1, 1, tiles=(1, 1, 2, 3, 3, 1),
                                            seed=3)
    np.testing.assert_array_equal(got, expected)
    steps = 3 * 6 * 4 * 3  # one thread: the first step is not cut into kernel rows
    assert stats["load_to_compute_pops"] == steps and stats["compute_to_load_pops"] == steps - 1
    assert stats["store_to_compute_pops"] == 3 * 6 * 4  # tiles - 1 in the program, + 1 before FINISH
    got, expected, code, _ = _conv_case(VTAConfig(), 1, 20, 9, 9, 24, 3, 1, 1, 1, threads=1)
    np.testing.assert_array_equal(got, expected)
    assert code.tiling.threads == 1
    with pytest.raises(ValueError, match="threads must be 1 \\(no latency hiding\\) or 2 \\(double buffering\\), "
                                         "not 3"):
        plan_conv(code.tiling.geom, intrinsics(VTAConfig()), threads=3)


def test_depthwise_and_grouped_tiled_batch2():
    cfg = VTAConfig(log_batch=1, log_block=3)
    got, expected, _, _ = _conv_case(cfg, 3, 24, 9, 8, 24, 3, 2, 1, 24, tiles=(2, 1, 2, 3), seed=5)
    np.testing.assert_array_equal(got, expected)
    got, expected, _, _ = _conv_case(cfg, 2, 24, 7, 7, 36, 3, 1, 1, 6, tiles=(1, 1, 3, 7), seed=6)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("per_channel,lo,hi", [(False, 0, 127), (False, 0, 48), (True, -128, 127)])
def test_requant_variants(per_channel, lo, hi):
    got, expected, code, stats = _conv_case(VTAConfig(), 1, 16, 5, 5, 16, 3, 1, 1, 1, per_channel=per_channel,
                                            lo=lo, hi=hi, seed=7)
    np.testing.assert_array_equal(got, expected)
    assert got.min() >= lo and got.max() <= hi
    # per tensor: ADD, MUL imm, SHR imm, MAX, MIN = 5 ALU passes over 25 pixels of one output block
    if not per_channel:
        assert code.alu_uops == 5 * 25


@settings(max_examples=12, deadline=None)
@given(c=st.integers(1, 40), o=st.integers(1, 40), hw=st.integers(1, 9), k=st.sampled_from([1, 3, 5]),
       s=st.integers(1, 2), p=st.integers(0, 2), seed=st.integers(0, 1000))
def test_conv_random_shapes(c, o, hw, k, s, p, seed):
    cfg = VTAConfig(log_block=3)
    if hw + 2 * p < k or p >= k:
        return
    got, expected, _, _ = _conv_case(cfg, 1, c, hw, hw, o, k, s, p, 1, seed=seed)
    np.testing.assert_array_equal(got, expected)


def test_tiny_buffers_split_kernel_rows():
    """32-entry buffers and a 32-entry uop buffer: a 3x3 layer only fits one kernel row per step."""
    from conftest import SMALL_CFG
    intr = intrinsics(SMALL_CFG)
    t = plan_conv(ConvGeometry.make((2, 20, 7, 7), (20, 20, 3, 3), pads=(1,) * 4, intr=intr), intr)
    assert t.kh_tile < 3 and t.ic_tile == 1 and t.check(intr) == []
    got, expected, _, _ = _conv_case(SMALL_CFG, 2, 20, 7, 7, 20, 3, 1, 1, 1, seed=8)
    np.testing.assert_array_equal(got, expected)
    got, expected, _, _ = _conv_case(SMALL_CFG, 2, 8, 7, 7, 8, 3, 2, 1, 8, seed=9)  # depthwise
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case, tiles", [
    ((1, 32, 13, 12, 32, 1, 2, 0, 1), (2, 1, 3, 6)),        # 1x1 stride 2: every step one kernel row
    ((1, 16, 11, 12, 32, 3, 2, 1, 1), (1, 1, 2, 6, 1)),     # 3x3 stride 2, one kernel row per step, padded rows
    ((1, 16, 10, 9, 16, 3, 3, 2, 1), (1, 1, 1, 3, 1)),      # stride 3, pad 2: rows of padding at both ends
], ids=["1x1s2", "3x3s2_kh1", "3x3s3_kh1"])
def test_strided_one_row_steps_load_only_the_rows_they_read(case, tiles):
    """A step over one kernel row of a stride-s convolution loads one input row per output row, s rows apart in
    DRAM (padding rows included as load padding), and the results stay exact."""
    got, expected, code, stats = _conv_case(VTAConfig(), *case, tiles=tiles, seed=11)
    np.testing.assert_array_equal(got, expected)
    n, c, h, w, o, k, s, p, g = case
    intr = intrinsics(VTAConfig())
    layer = ConvLayer.make((n, c, h, w), np.zeros((o, c, k, k), np.int8), np.zeros(o, np.int32), np.ones(o),
                           np.zeros(o), -128, 127, strides=(s, s), pads=(p,) * 4, intr=intr)
    program, _ = build_conv_program(VTAConfig(), layer, None, ConvTiling(layer.geom, *tiles))
    inp_loads = [i for i in program.insns if isinstance(i, Load) and i.mem == MEM_INP]
    assert inp_loads and all(i.x_stride == w * s for i in inp_loads if i.y_size > 1)
    # rows loaded per input block: one per output row of the tile (oh_tile of a full tile), not (oh - 1) * s + 1
    assert max(i.y_pad_0 + i.y_size + i.y_pad_1 for i in inp_loads) == tiles[2]


def test_steps_in_the_border_are_skipped():
    """One-row kernel steps of a one-row tile at the top: the step through the top border row reads nothing."""
    intr = intrinsics(VTAConfig())
    geom = ConvGeometry.make((1, 16, 4, 4), (16, 16, 3, 3), pads=(1,) * 4, intr=intr)
    tiles = list(ConvTiling(geom, 1, 1, 1, 4, 1).tiles())
    assert [len(t.steps) for t in tiles] == [2, 3, 3, 2]
    assert [st[2] for st in tiles[0].steps] == [1, 2] and [st[2] for st in tiles[3].steps] == [0, 1]


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_dense_matches_reference(cfg):
    intr = intrinsics(cfg)
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (3, 100)).astype(np.int8)
    w = rng.integers(-128, 128, (37, 100)).astype(np.int8)
    bias = rng.integers(-5000, 5000, 37).astype(np.int32)
    m, sh = rng.integers(1, 200, 37), rng.integers(8, 16, 37)
    expected = qops.qdense(x, w, bias, Requant(m, sh))
    layer = ConvLayer.make(x.shape, w, bias, m, sh, -128, 127, intr=intr)
    program, _ = build_conv_program(cfg, layer, pack_activation(x, batch=intr.batch, block=intr.block_in))
    result = get_backend("fsim").run(program)
    np.testing.assert_array_equal(unpack_activation(program.read(OUTPUT, result.dram), expected.shape), expected)


@pytest.mark.parametrize("cfg", list(CONFIGS.values()) + [VTAConfig(log_acc_buff_size=10)],
                         ids=list(CONFIGS.keys()) + ["small_acc"])
def test_add_matches_reference(cfg):
    intr = intrinsics(cfg)
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, (3, 20, 9, 9)).astype(np.int8)
    b = rng.integers(-128, 128, (3, 20, 9, 9)).astype(np.int8)
    expected = qops.qadd(a, b, AddRequant(300, 7000, 13, 0, 127))
    pa, pb = (pack_activation(v, batch=intr.batch, block=intr.block_in) for v in (a, b))
    program, code = build_add_program(cfg, AddLayer(a.shape, 300, 7000, 13, 0, 127), pa, pb)
    result = get_backend("fsim").run(program)
    np.testing.assert_array_equal(unpack_activation(program.read(OUTPUT, result.dram), expected.shape), expected)
    assert code.tiles == -(-pa[..., 0, 0].size // plan_eltwise(pa[..., 0, 0].size, intr).tile)


def test_program_structure_default():
    """The lowering emits exactly: the constants' LOAD ACC, one LOAD UOP, the reset GEMM, inp/wgt loads and a GEMM
    for the first kernel row, then for the other two (the layer's first step in two parts), 5 ALU ops per tile."""
    intr = intrinsics(VTAConfig())
    layer = ConvLayer.make((1, 16, 4, 4), np.ones((16, 16, 3, 3), np.int8), np.arange(-8, 8, dtype=np.int32),
                           np.arange(1, 17), np.full(16, 4), 0, 127, pads=(1, 1, 1, 1), intr=intr)
    program, code = build_conv_program(VTAConfig(), layer)
    gemms = [i for i in program.insns if isinstance(i, Gemm)]
    alus = [i for i in program.insns if isinstance(i, Alu)]
    assert [g.reset for g in gemms] == [True, False, False]
    assert [(g.iter_out, g.iter_in, g.uop_end - g.uop_bgn) for g in gemms[1:]] == [(4, 4, 3), (4, 4, 6)]
    assert len(alus) == 5 and code.alu_uops == 5 * 16 and code.gemm_uops == 16 + 9 * 16
    assert [i.mem for i in program.insns if isinstance(i, Load) and i.mem in (MEM_ACC, 0)] == [MEM_ACC, 0]
    inp = [i for i in program.insns if isinstance(i, Load) and i.mem == 2]
    # kernel row 0 reads input rows -1 .. 2 (the top one padding), rows 1 and 2 read rows 0 .. 4 (the last padding)
    assert [(i.y_size, i.x_size, i.y_pad_0, i.y_pad_1, i.x_pad_0, i.x_pad_1) for i in inp] == [
        (3, 4, 1, 0, 1, 1), (4, 4, 0, 1, 1, 1)]


def test_plan_fits_buffers_resnet_layers():
    for cfg in CONFIGS.values():
        intr = intrinsics(cfg)
        for xs, ws, s, p, g in [((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1), ((1, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1),
                                ((1, 512, 7, 7), (512, 1, 3, 3), 1, 1, 512)]:
            t = plan_conv(ConvGeometry.make(xs, ws, strides=(s, s), pads=(p,) * 4, groups=g, intr=intr), intr)
            assert t.check(intr) == []
            assert t.inp_entries <= intr.capacity("inp") // 2 and t.acc_entries <= intr.capacity("acc") // 2


def test_schedule_errors():
    intr = intrinsics(VTAConfig())
    with pytest.raises(ScheduleError, match=r"padding \(16, 16, 16, 16\) exceeds the 15 elements"):
        plan_conv(ConvGeometry.make((1, 16, 40, 40), (16, 16, 33, 33), pads=(16,) * 4, intr=intr), intr)
    with pytest.raises(ScheduleError, match="some output pixels read only padding"):
        plan_conv(ConvGeometry.make((1, 16, 4, 4), (16, 16, 1, 1), pads=(2,) * 4, intr=intr), intr)
    small = VTAConfig(log_inp_buff_size=6, log_wgt_buff_size=11)
    sintr = intrinsics(small)
    with pytest.raises(ScheduleError, match="no tiling fits: even a one-pixel tile breaks these limits: the input "
                                            "tile needs 3 inp entries, more than half the buffer \\(2\\)"):
        plan_conv(ConvGeometry.make((1, 16, 8, 8), (16, 16, 3, 3), intr=sintr), sintr)
    with pytest.raises(ScheduleError, match="weights \\(16, 8, 3, 3\\) with groups=1 do not match 16 input"):
        ConvGeometry.make((1, 16, 8, 8), (16, 8, 3, 3), intr=intr)


def test_uop_cache_reuses_and_flushes():
    cfg = VTAConfig(log_uop_buff_size=6)  # 16 micro-ops
    pb = ProgramBuilder(cfg)
    cache = UopCache(pb, intrinsics(cfg), "t")
    a = [Uop(i, i, 0) for i in range(10)]
    b = [Uop(i, 0, 0) for i in range(10)]
    assert cache.place(a) == (0, 10)
    assert cache.place(a) == (0, 10) and cache.loads == 1
    assert cache.place(b) == (0, 10) and cache.loads == 2  # flushed: a and b do not both fit
    assert cache.place(a) == (0, 10) and cache.loads == 3
    assert len([k for k in pb.allocations if k.startswith("tuop")]) == 2  # each kernel stored in DRAM once
    with pytest.raises(ValueError, match="a micro-op kernel must hold 1 to 16 micro-ops, not 17"):
        cache.place([Uop(0, 0, 0)] * 17)


def test_uop_cache_preload():
    """With preload the first kernel's LOAD UOP loads, once closed, every kernel placed while they fit the buffer
    together (one allocation in placement order); a kernel that does not fit flushes the buffer and starts the next
    batch."""
    from vta.isa import decode_uops
    cfg = VTAConfig(log_uop_buff_size=6)  # 16 micro-ops
    pb = ProgramBuilder(cfg)
    cache = UopCache(pb, intrinsics(cfg), "t", preload=True)
    a, b, c = ([Uop(i, k, 0) for i in range(n)] for k, n in ((1, 6), (2, 8), (3, 4)))
    assert cache.place(a) == (0, 6) and cache.place(b) == (6, 14) and cache.place(a) == (0, 6)
    assert cache.loads == 1 and len(pb.insns) == 1
    assert cache.place(c) == (0, 4) and cache.loads == 2  # 14 + 4 > 16: the batch closes, c starts the next
    assert cache.place(a) == (4, 10) and cache.loads == 2    # a was flushed: it joins c's batch
    cache.close()
    first, second = pb.insns
    assert (first.x_size, first.sram_base, second.x_size, second.sram_base) == (14, 0, 10, 0)
    program = pb.finish()
    for insn, name, kernels in ((first, "tuops0", a + b), (second, "tuops1", c + a)):
        assert insn.dram_base == program.allocations[name].offset // cfg.uop_bytes
        dst, src, _ = decode_uops(program.read(name), cfg)
        assert list(zip(dst.tolist(), src.tolist())) == [(u.dst, u.src) for u in kernels]


@pytest.mark.parametrize("ic_tile, lead", [(2, ((0, 2, 0, 3),)), (1, ((0, 1, 0, 1), (0, 1, 1, 3)))])
def test_layers_preload_their_kernels_and_start_with_a_part_of_a_step(ic_tile, lead):
    """A layer's micro-op kernels arrive in one LOAD UOP; its first tile's first step comes as its first kernel row
    and then the others when it reads one input block (not two: a 2D LOAD of weights cannot pick some kernel rows of
    several blocks), so that the GEMMs start after one row's loads; the result stays exact."""
    tiles = (2, ic_tile, 5, 9)
    got, expected, code, _ = _conv_case(VTAConfig(), 1, 32, 9, 9, 48, 3, 1, 1, 1, tiles=tiles, seed=13)
    np.testing.assert_array_equal(got, expected)
    assert code.notes["uop_loads"] == 1
    intr = intrinsics(VTAConfig())
    geom = ConvGeometry.make((1, 32, 9, 9), (48, 32, 3, 3), pads=(1,) * 4, intr=intr)
    steps = [t.steps for t in ConvTiling(geom, *tiles).tiles()]
    rest = tuple((j, j + ic_tile, 0, 3) for j in range(0, 2, ic_tile))
    assert steps[0] == lead + rest[1:] and all(st == rest for st in steps[1:])
    single = ConvTiling(geom, *tiles, 3, 1)  # one thread: no parts
    assert all(t.steps == rest for t in single.tiles())


@pytest.mark.parametrize("concurrent_alu", [False, True])
def test_tiles_share_resident_constants(concurrent_alu):
    """Tiles of the same output blocks read the per-channel constants another part loaded (one LOAD ACC of them
    per layer), except with concurrent_alu, whose ALU engine may still read a part's constants when the next tile's
    are loaded there (one per part); exact either way."""
    cfg = VTAConfig(concurrent_alu=concurrent_alu)
    got, expected, code, _ = _conv_case(cfg, 1, 16, 8, 8, 32, 3, 1, 1, 1, tiles=(2, 1, 2, 8), seed=14)
    np.testing.assert_array_equal(got, expected)
    intr = intrinsics(cfg)
    layer = ConvLayer.make((1, 16, 8, 8), np.zeros((32, 16, 3, 3), np.int8), np.ones(32, np.int32), np.ones(32),
                           np.full(32, 2), -128, 127, pads=(1,) * 4, intr=intr)
    program, _ = build_conv_program(cfg, layer, None, ConvTiling(layer.geom, 2, 1, 2, 8))
    const_loads = [i for i in program.insns if isinstance(i, Load) and i.mem == MEM_ACC]
    assert len(const_loads) == (2 if concurrent_alu else 1)


def test_the_last_tile_is_stored_in_parts():
    """The last tile requantizes and stores its output blocks in up to LAST_TILE_PARTS groups, one compute->store
    token each (the other tiles one each); exact either way."""
    from vta.compiler.lowering.codegen import LAST_TILE_PARTS
    for oc_tile, parts in ((5, min(5, LAST_TILE_PARTS)), (4, 1), (1, 1)):  # 5 output blocks: last tiles of 5, 1, 1
        got, expected, code, stats = _conv_case(VTAConfig(), 1, 32, 9, 9, 80, 3, 1, 1, 1,
                                                tiles=(oc_tile, 2, 5, 9), seed=12)
        np.testing.assert_array_equal(got, expected)
        assert stats["compute_to_store_pushes"] == code.tiles - 1 + parts
        assert stats["alu_uops"] == code.alu_uops


# ---- the accumulators' start for a rescale with rounding (QMatMul's) ------------------------------------------------
def _rounded_layer(cfg, m, s, *, oh=60, lo=-128, hi=127, per_channel=False):
    """A 1x1 layer (32 -> 64 channels over ``oh`` rows) with QMatMul's rescale ``clip((acc * M + 2**(S-1)) >> S)``."""
    intr = intrinsics(cfg)
    mult = np.full(64, m) if not per_channel else np.arange(64) + m
    return ConvLayer.make((1, 32, oh, 1), np.zeros((64, 32, 1, 1), np.int8), 0, mult, np.full(64, s), lo, hi,
                          intr=intr, rounding=1 << (s - 1))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 32767), st.integers(1, 31))
def test_rounding_start_is_the_rounding_over_m_modulo_2_32(m, s):
    from vta.compiler.lowering.codegen import rounding_start
    intr = intrinsics(VTAConfig())
    start = rounding_start(_rounded_layer(VTAConfig(), m, s), intr)
    k = (m & -m).bit_length() - 1
    if k > s - 1:                       # 2**k does not divide the rounding 2**(S-1): no v with v * M = r (mod 2**32)
        assert start is None
        return
    if start is None:                   # M odd and its one v inside (lo, hi), e.g. M = 1, S = 1: v = r = 1
        v = (1 << (s - 1)) * pow(m, -1, 1 << 32) % (1 << 32)
        assert k == 0 and -128 < v - ((1 << 32) if v >= 1 << 31 else 0) < 127
        return
    op, v = start
    assert (v * m - (1 << (s - 1))) % (1 << 32) == 0 and -(1 << 31) <= v < 1 << 31
    assert (op == "MIN" and v <= -128) or (op == "MAX" and v >= 127)


def test_rounding_start_exact_values_and_where_it_does_not_apply():
    from vta.compiler.lowering.codegen import rounding_start
    intr = intrinsics(VTAConfig())
    assert rounding_start(_rounded_layer(VTAConfig(), 1001, 18), intr) == ("MAX", 145883136)
    assert rounding_start(_rounded_layer(VTAConfig(), 12345, 22), intr) == ("MIN", -1054867456)
    assert rounding_start(_rounded_layer(VTAConfig(), 4, 2), intr) is None          # 4 does not divide 2
    assert rounding_start(_rounded_layer(VTAConfig(), 1001, 18, per_channel=True), intr) is None
    for knob in ("fused_requant", "gemm_overwrite", "concurrent_alu"):
        cfg = VTAConfig(**{knob: True})
        assert rounding_start(_rounded_layer(cfg, 1001, 18), intrinsics(cfg)) is None
    layer = ConvLayer.make((1, 32, 8, 1), np.zeros((64, 32, 1, 1), np.int8), 0, 1001, 18, -128, 127, intr=intr)
    assert rounding_start(layer, intr) is None                                       # no rounding (a convolution)


@pytest.mark.parametrize("m, s", [(1001, 18), (1000, 18), (12345, 22)], ids=["odd-max", "even", "odd-min"])
def test_a_rounded_layer_starts_its_later_tiles_with_one_pass(m, s):
    """The first tile of each acc part starts with the reset and an ADD of v; the others, whose entries hold clipped
    outputs, with one MIN or MAX of v (the last row tile an edge of 12 rows); no RND pass; bit-exact with the
    rescale in int64 (the GEMM core and the ALU computing modulo 2**32)."""
    from vta.compiler.lowering.codegen import rounding_start
    from vta.isa import ALU_ADD, ALU_MAX, ALU_MIN
    cfg, rng = VTAConfig(), np.random.default_rng(s)
    intr = intrinsics(cfg)
    x = rng.integers(-128, 128, (1, 32, 60, 1)).astype(np.int8)
    w = rng.integers(-128, 128, (64, 32, 1, 1)).astype(np.int8)
    layer = ConvLayer.make(x.shape, w, 0, m, s, -128, 127, intr=intr, rounding=1 << (s - 1))
    program, code = build_conv_program(cfg, layer, pack_activation(x, batch=1, block=16),
                                       ConvTiling(layer.geom, 2, 2, 16, 1))
    assert code.tiles == 8
    result = get_backend("fsim").run(program)
    got = unpack_activation(program.read(OUTPUT, result.dram), (1, 64, 60, 1))
    np.testing.assert_array_equal(got, qops.rescale(qops.conv2d_acc(x, w, None).astype(np.int64), m, s))
    op = {"MIN": ALU_MIN, "MAX": ALU_MAX}[rounding_start(layer, intr)[0]]
    alus = [i for i in program.insns if isinstance(i, Alu)]
    assert sum(isinstance(i, Gemm) and i.reset for i in program.insns) == 2
    assert sum(i.alu_opcode == ALU_ADD and not i.use_imm for i in alus) == 2            # ADD v after the resets
    assert sum(i.alu_opcode == op and not i.use_imm for i in alus) == code.tiles - 2     # MIN/MAX v
    assert code.alu_uops == 60 * 4 * 4 + 60 * 4                                          # MUL, SHR, MAX, MIN + start
