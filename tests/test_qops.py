"""The integer reference (compiler/qops.py) against straightforward numpy loops, and the graph executor."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vta.compiler import qops
from vta.compiler.ir import AddRequant, Graph, GraphError, Requant


def _conv_loops(x, w, b, strides, pads, groups):
    n_, c_, h_, w_ = x.shape
    o_, cg, kh, kw = w.shape
    og = o_ // groups
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h_ + pads[0] + pads[2] - kh) // strides[0] + 1
    ow = (w_ + pads[1] + pads[3] - kw) // strides[1] + 1
    out = np.zeros((n_, o_, oh, ow), dtype=np.int64)
    for n in range(n_):
        for o in range(o_):
            g = o // og
            for i in range(oh):
                for j in range(ow):
                    total = int(b[o])
                    for c in range(cg):
                        for ki in range(kh):
                            for kj in range(kw):
                                total += int(xp[n, g * cg + c, i * strides[0] + ki, j * strides[1] + kj]) * int(
                                    w[o, c, ki, kj])
                    out[n, o, i, j] = total
    return out


def _rand8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), groups=st.sampled_from([1, 2, 4]), k=st.integers(1, 3),
       stride=st.integers(1, 2), pad=st.integers(0, 2))
def test_conv2d_acc_matches_loops(seed, groups, k, stride, pad):
    rng = np.random.default_rng(seed)
    x = _rand8(rng, (1, 4, 6, 5))
    w = _rand8(rng, (groups * 2, 4 // groups, k, k))
    b = rng.integers(-(2**20), 2**20, groups * 2).astype(np.int32)
    pads = (pad, pad // 2, pad, pad)
    got = qops.conv2d_acc(x, w, b, (stride, stride), pads, groups)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _conv_loops(x, w, b, (stride, stride), pads, groups))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), kh=st.integers(1, 5), kw=st.integers(1, 5), sh=st.integers(1, 3),
       sw=st.integers(1, 3), pads=st.tuples(*[st.integers(0, 2)] * 4), wide=st.booleans())
def test_depthwise_conv2d_acc_matches_loops(seed, kh, kw, sh, sw, pads, wide):
    # groups == C and one weight channel each: conv2d_acc's tap-by-tap path (int32 for int8 operands, int64 wider)
    rng = np.random.default_rng(seed)
    x = _rand8(rng, (2, 3, 7, 6))
    w = _rand8(rng, (3, 1, kh, kw))
    if wide:  # int32 operands whose products leave int32: the sums must still be exact before the wrap
        x = x.astype(np.int32) * 40000
        w = w.astype(np.int32) * 3
    b = rng.integers(-(2**20), 2**20, 3).astype(np.int32)
    got = qops.conv2d_acc(x, w, b, (sh, sw), pads, 3)
    assert got.dtype == np.int32
    want = _conv_loops(x, w, b, (sh, sw), pads, 3)
    np.testing.assert_array_equal(got, qops.wrap32(want))


def test_conv2d_acc_depthwise_and_rejects_bad_groups():
    rng = np.random.default_rng(1)
    x = _rand8(rng, (2, 3, 5, 5))
    w = _rand8(rng, (3, 1, 3, 3))
    b = np.zeros(3, np.int32)
    np.testing.assert_array_equal(qops.conv2d_acc(x, w, b, (1, 1), (1, 1, 1, 1), 3),
                                  _conv_loops(x, w, b, (1, 1), (1, 1, 1, 1), 3))
    with pytest.raises(ValueError, match=r"Convolution of 3 input channels with weights \(3, 1, 3, 3\) and groups=2"):
        qops.conv2d_acc(x, w, b, (1, 1), (0, 0, 0, 0), 2)


def test_accumulator_wraps_to_32_bits():
    x = np.full((1, 1), 1, np.int8)
    w = np.full((1, 1), 1, np.int8)
    b = np.array([2**31 - 1], np.int32)
    assert qops.dense_acc(x, w, b)[0, 0] == -(2**31)


def test_requantize_exact_values():
    acc = np.array([[1000, -1000, 70000, 5]], np.int32)
    r = Requant(np.array([3, 3, 2, 1]), np.array([4, 4, 10, 0]), lo=-128, hi=127)
    # 1000*3>>4 = 187 -> 127; -3000>>4 = -188 (arithmetic) -> -128; 140000>>10 = 136 -> 127; 5
    np.testing.assert_array_equal(qops.requantize(acc, r), [[127, -128, 127, 5]])
    r2 = Requant(np.array([1, 1, 1, 1]), np.array([4, 4, 12, 0]), lo=0, hi=20)
    np.testing.assert_array_equal(qops.requantize(acc, r2), [[20, 0, 17, 5]])
    # -1000 >> 4 is floor(-62.5) = -63, within a wide clip
    r3 = Requant(np.array([1] * 4), np.array([4] * 4))
    assert qops.requantize(acc, r3)[0, 1] == -63


def test_requantize_product_wraps():
    acc = np.array([[2**20]], np.int32)
    r = Requant(np.array([4096]), np.array([0]))            # 2**32 wraps to 0
    assert qops.requantize(acc, r)[0, 0] == 0


def test_qadd_exact():
    a = np.array([100, -100, 7], np.int8)
    b = np.array([100, 50, -7], np.int8)
    r = AddRequant(ma=3, mb=5, shift=3, lo=0, hi=127)
    # (300+500)>>3=100, (-300+250)>>3=-7 -> 0, (21-35)>>3=-2 -> 0
    np.testing.assert_array_equal(qops.qadd(a, b, r), [100, 0, 0])
    with pytest.raises(ValueError, match=r"QAdd operands have shapes \(3,\) and \(2,\)"):
        qops.qadd(a, b[:2], r)


def test_pools_match_loops():
    rng = np.random.default_rng(3)
    x = _rand8(rng, (1, 2, 5, 6))
    mp = qops.maxpool(x, (3, 3), (2, 2), (1, 1, 1, 1))
    ap = qops.avgpool(x, (3, 3), (2, 2), (1, 1, 1, 1), count_include_pad=False)
    api = qops.avgpool(x, (3, 3), (2, 2), (1, 1, 1, 1), count_include_pad=True)
    assert mp.shape == (1, 2, 3, 3)
    for c in range(2):
        for i in range(3):
            for j in range(3):
                rows = range(max(0, 2 * i - 1), min(5, 2 * i + 2))
                cols = range(max(0, 2 * j - 1), min(6, 2 * j + 2))
                vals = [int(x[0, c, r, q]) for r in rows for q in cols]
                assert mp[0, c, i, j] == max(vals)
                assert ap[0, c, i, j] == (2 * sum(vals) + len(vals)) // (2 * len(vals))
                assert api[0, c, i, j] == (2 * sum(vals) + 9) // 18
    g = qops.global_avgpool(x)
    assert g.shape == (1, 2, 1, 1)
    assert g[0, 1, 0, 0] == (2 * int(x[0, 1].astype(np.int64).sum()) + 30) // 60


def test_rounding_ops():
    np.testing.assert_array_equal(qops.rescale(np.array([5, -5, 6], np.int8), 1, 1), [3, -2, 3])
    np.testing.assert_array_equal(qops.quantize(np.array([0.5, 1.5, -0.5, 1000.0]), 1.0), [0, 2, 0, 127])
    np.testing.assert_array_equal(qops.global_avgpool(np.array([[[[1, 2]]]], np.int8)), [[[[2]]]])
    np.testing.assert_array_equal(qops.pad(np.ones((1, 2), np.int8), [0, 1, 1, 0], 0), [[0, 1, 1], [0, 0, 0]])
    with pytest.raises(ValueError, match="Pad needs 4 pad values for a rank-2 tensor, got 2"):
        qops.pad(np.ones((1, 2), np.int8), [0, 1])
    sm = qops.softmax(np.array([[0, 10]], np.int8), 0.1)
    np.testing.assert_allclose(sm, [[1 / (1 + np.e), np.e / (1 + np.e)]], rtol=1e-6)


def _tiny_qgraph() -> Graph:
    g = Graph("tiny", inputs=["x"], outputs=["y"])
    g.add_tensor("x", (1, 2, 4, 4), "float32")
    g.add_tensor("q", (1, 2, 4, 4), "int8", 0.05)
    g.add_constant("w", np.ones((3, 2, 3, 3), np.int8))
    g.add_constant("b", np.array([0, 8, -8], np.int32))
    g.add_tensor("c", (1, 3, 4, 4), "int8", 0.1)
    g.add_tensor("p", (1, 3, 1, 1), "int8", 0.1)
    g.add_tensor("y", (1, 3, 1, 1), "float32")
    g.add_node("Quantize", "quant", ["x"], ["q"], scale=0.05)
    g.add_node("QConv2d", "conv", ["q", "w", "b"], ["c"], strides=(1, 1), pads=(1, 1, 1, 1), groups=1,
               requant=Requant(np.array([1, 1, 1]), np.array([4, 4, 4]), lo=0, hi=127))
    g.add_node("GlobalAvgPool", "gap", ["c"], ["p"])
    g.add_node("Dequantize", "deq", ["p"], ["y"], scale=0.1)
    g.validate()
    return g


def test_run_reference_end_to_end():
    g = _tiny_qgraph()
    x = np.full((1, 2, 4, 4), 0.8, np.float32)     # quantizes to 16
    out = qops.run_reference(g, {"x": x})
    # interior sum 16*18 = 288 >> 4 = 18; edges 16*12=192 -> 12; corners 16*8=128 -> 8
    # channel 0 average: (4*18 + 8*12 + 4*8)/16 = 12.5 -> 13 (half up)
    np.testing.assert_allclose(out["y"][0, 0, 0, 0], np.float32(13 * 0.1))
    values = qops.run_reference(g, {"x": x}, keep_all=True)
    assert values["c"][0, 0, 1, 1] == 18 and values["c"][0, 1, 1, 1] == (288 + 8) >> 4
    assert values["c"][0, 2, 0, 0] == (128 - 8) >> 4


def test_run_reference_errors():
    g = _tiny_qgraph()
    with pytest.raises(ValueError, match=r"Input 'x' has shape \(1, 2\); graph 'tiny' expects \(1, 2, 4, 4\)"):
        qops.run_reference(g, {"x": np.zeros((1, 2), np.float32)})
    with pytest.raises(ValueError, match="Input 'x' of graph 'tiny' is missing"):
        qops.run_reference(g, {})
    g.nodes[2].op = "Frobnicate"
    with pytest.raises(GraphError, match="Node 'gap' has op 'Frobnicate', which the integer reference does not"):
        qops.run_reference(g, {"x": np.zeros((1, 2, 4, 4), np.float32)})


def test_lut_indexes_its_table_by_the_input_plus_128():
    table = np.arange(127, -129, -1).astype(np.int8)
    assert qops.lut(np.array([-128, -1, 0, 127], np.int8), table).tolist() == [127, 0, -1, -128]


def test_resize_linear_weights_have_8_bits_and_round_once():
    x = np.array([0, 100], np.int8).reshape(1, 1, 1, 2)
    y = qops.resize(x, "linear", "asymmetric", "round_prefer_floor", (1, 1, 1, 4), (1, 1, 1, 8))
    # sources 0, 1/4, 1/2, 3/4, 1, then the edge: (100 * rint(frac * 256) + 128) >> 8
    assert y.reshape(-1).tolist() == [0, (100 * 64 + 128) >> 8, (100 * 128 + 128) >> 8, (100 * 192 + 128) >> 8,
                                      100, 100, 100, 100]
    two_axes = qops.resize(np.array([[0, 0], [0, 100]], np.int8).reshape(1, 1, 2, 2), "linear", "asymmetric",
                           "floor", (1, 1, 2, 2), (1, 1, 4, 4))
    assert two_axes[0, 0, 1, 1] == (100 * 128 * 128 + (1 << 15)) >> 16   # one rounding after both axes


@pytest.mark.parametrize("nearest_mode,expected", [("round_prefer_floor", [10, 10, 20, 20]),
                                                   ("round_prefer_ceil", [10, 20, 20, 20]),
                                                   ("floor", [10, 10, 20, 20]), ("ceil", [10, 20, 20, 20])])
def test_resize_nearest_modes_break_ties_as_onnx(nearest_mode, expected):
    x = np.array([10, 20], np.int8).reshape(1, 1, 1, 2)
    y = qops.resize(x, "nearest", "asymmetric", nearest_mode, (1, 1, 1, 2), (1, 1, 1, 4))  # sources 0, .5, 1, 1.5
    assert y.reshape(-1).tolist() == expected


def test_resize_source_follows_onnx_reference():
    assert qops.resize_source(4, 2, 0.6, "align_corners").tolist() == [0.0, 3 / 1.4]     # scale * length - 1
    assert qops.resize_source(4, 8, 2.0, "half_pixel").tolist()[:2] == [-0.25, 0.25]
    with pytest.raises(ValueError, match="Resize coordinate transformation 'tf_crop_and_resize' is not one the lab"):
        qops.resize_source(4, 8, 2.0, "tf_crop_and_resize")
