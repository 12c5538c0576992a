"""Tests for vta.compiler.lowering.layout: packing NCHW tensors and weights into the accelerator's blocked layouts."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vta.compiler.lowering.layout import (
    group_block_ranges,
    pack_activation,
    pack_channel_vector,
    pack_weight,
    packed_activation_shape,
    unpack_activation,
    unpack_channel_vector,
    unpack_weight,
)

CONFIG_SHAPES = [(1, 16), (1, 8), (1, 32), (2, 16), (4, 4)]  # (BATCH, BLOCK)


def test_pack_activation_exact_positions():
    x = np.arange(2 * 3 * 2 * 2, dtype=np.int64).reshape(2, 3, 2, 2)
    p = pack_activation(x, batch=2, block=2)
    assert p.shape == (1, 2, 2, 2, 2, 2)
    # element (nb=0, cb=1, h=1, w=0) holds images 0,1 and channels 2,3 (3 is padding)
    assert p[0, 1, 1, 0].tolist() == [[x[0, 2, 1, 0], 0], [x[1, 2, 1, 0], 0]]
    assert p[0, 0, 0, 1].tolist() == [[x[0, 0, 0, 1], x[0, 1, 0, 1]], [x[1, 0, 0, 1], x[1, 1, 0, 1]]]


@pytest.mark.parametrize("batch,block", CONFIG_SHAPES)
@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 5), c=st.integers(1, 40), h=st.integers(1, 4), w=st.integers(1, 4))
def test_activation_round_trip(batch, block, n, c, h, w):
    x = np.random.default_rng(n * 1000 + c).integers(-128, 128, size=(n, c, h, w)).astype(np.int8)
    p = pack_activation(x, batch=batch, block=block)
    assert p.shape == packed_activation_shape(x.shape, batch, block)
    assert p.shape[0] * batch >= n and p.shape[1] * block >= c
    assert int(np.abs(p.astype(np.int64)).sum()) == int(np.abs(x.astype(np.int64)).sum())  # padding is zero
    np.testing.assert_array_equal(unpack_activation(p, x.shape), x)


@pytest.mark.parametrize("batch,block", CONFIG_SHAPES)
def test_dense_activation_round_trip(batch, block):
    x = np.arange(3 * 37, dtype=np.int32).reshape(3, 37)
    p = pack_activation(x, batch=batch, block=block)
    assert p.shape[2:4] == (1, 1)
    np.testing.assert_array_equal(unpack_activation(p, x.shape), x)


def test_pack_weight_classic_layout():
    w = np.arange(4 * 4 * 3 * 3).reshape(4, 4, 3, 3)
    p = pack_weight(w, block_out=2, block_in=2)
    assert p.data.shape == (2, 2, 3, 3, 2, 2) and p.nib == 2 and p.ib_lo.tolist() == [0, 0]
    # (ob=1, ib=0, kh=2, kw=1) holds w[2:4, 0:2, 2, 1] as [BO, BI]
    np.testing.assert_array_equal(p.data[1, 0, 2, 1], w[2:4, 0:2, 2, 1])


@pytest.mark.parametrize("block", [4, 8, 16, 32])
@pytest.mark.parametrize("o,c,groups", [(8, 3, 1), (33, 17, 1), (32, 32, 32), (12, 12, 3), (24, 8, 4), (16, 16, 8)])
def test_weight_round_trip(block, o, c, groups):
    w = np.random.default_rng(o * c + groups).integers(-128, 128, size=(o, c // groups, 3, 2)).astype(np.int8)
    p = pack_weight(w, block_out=block, block_in=block, groups=groups)
    assert p.data.shape[0] == -(-o // block)
    assert (p.ib_lo[1:] >= p.ib_lo[:-1]).all() and p.ib_lo.max() + p.nib <= -(-c // block)
    np.testing.assert_array_equal(unpack_weight(p), w)


def test_depthwise_blocks_are_diagonal():
    w = np.arange(1, 33, dtype=np.int8).reshape(32, 1, 1, 1)
    p = pack_weight(w, block_out=16, block_in=16, groups=32)
    assert p.nib == 1 and p.ib_lo.tolist() == [0, 1]
    np.testing.assert_array_equal(p.data[1, 0, 0, 0], np.diag(np.arange(17, 33)).astype(np.int8))


def test_group_block_ranges():
    lo, nib = group_block_ranges(48, 48, 3, 16, 16)
    assert lo.tolist() == [0, 1, 2] and nib == 1
    lo, nib = group_block_ranges(24, 24, 2, 16, 16)  # block 0 spans both groups, block 1 lies in group 1
    assert lo.tolist() == [0, 0] and nib == 2
    with pytest.raises(ValueError, match="groups=5 must divide both the 24 input and 24 output channels"):
        group_block_ranges(24, 24, 5, 16, 16)


@pytest.mark.parametrize("batch,block", CONFIG_SHAPES)
def test_channel_vector_round_trip(batch, block):
    v = np.arange(-20, 17, dtype=np.int32)
    p = pack_channel_vector(v, batch=batch, block_out=block)
    assert p.shape == (-(-37 // block), batch, block) and p.dtype == np.int32
    assert (p[:, -1, :] == p[:, 0, :]).all()
    np.testing.assert_array_equal(unpack_channel_vector(p, 37), v)


def test_layout_errors():
    with pytest.raises(ValueError, match="batch must be a positive integer, not 0"):
        pack_activation(np.zeros((1, 1, 1, 1)), batch=0, block=16)
    with pytest.raises(ValueError, match="must be NCHW \\(4 dimensions\\) or \\[N, K\\] \\(2 dimensions\\), not "
                                         "shape \\(3,\\)"):
        pack_activation(np.zeros(3), batch=1, block=16)
    with pytest.raises(ValueError, match="shape \\(1, 20, 2, 2\\) does not fit the packed activation"):
        unpack_activation(pack_activation(np.zeros((1, 16, 2, 2)), batch=1, block=16), (1, 20, 2, 2))
    with pytest.raises(ValueError, match="weights must be \\[O, C/groups, KH, KW\\] or \\[O, K\\], not shape"):
        pack_weight(np.zeros(3), block_out=16, block_in=16)


@pytest.mark.parametrize("kw,sw,pl,pr", [(7, 2, 3, 3), (3, 1, 1, 1), (5, 3, 0, 2)])
def test_fold_kernel_columns_is_the_same_convolution(kw, sw, pl, pr):
    from vta.compiler import qops
    from vta.compiler.lowering.layout import fold_kernel_columns, fold_weight_columns
    rng = np.random.default_rng(kw)
    x = rng.integers(-128, 128, (2, 3, 9, 13)).astype(np.int8)
    w = rng.integers(-128, 128, (5, 3, 4, kw)).astype(np.int8)
    expected = qops.conv2d_acc(x, w, None, (2, sw), (1, pl, 1, pr))
    folded = fold_kernel_columns(x, kw=kw, sw=sw, pad_left=pl, pad_right=pr)
    assert folded.shape == (2, 3 * kw, 9, expected.shape[3])
    np.testing.assert_array_equal(qops.conv2d_acc(folded, fold_weight_columns(w), None, (2, 1), (1, 0, 1, 0)),
                                  expected)
