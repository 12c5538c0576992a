"""The GEMM benchmark program against numpy on several configs, its tiling and the packing helpers."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import SMALL_CFG, TINY

from vta import fsim
from vta.config import VTAConfig
from vta.gemm import gemm_program, gemm_tiling, pack_inp, pack_wgt, requantize, unpack_out
from vta.isa import Load


def test_gemm_128_matches_numpy(cfg):
    prog, expected = gemm_program(cfg, 128, 128, 128, seed=7, shift=10)
    result = fsim.run(prog)
    c = prog.read("C", result.dram)
    assert np.array_equal(c, expected)
    rng = np.random.default_rng(7)
    a = rng.integers(-128, 128, (128, 128), dtype=np.int8)
    b = rng.integers(-128, 128, (128, 128), dtype=np.int8)
    exact = a.astype(np.int64) @ b.astype(np.int64)
    assert np.array_equal(unpack_out(c, 128, 128), requantize(exact, 10))
    assert result.stats.macs == 128 ** 3
    assert 0.01 < (np.abs(unpack_out(c, 128, 128).astype(int)) >= 127).mean() < 0.1  # requantized, not all clipped


@pytest.mark.parametrize("config", [SMALL_CFG, TINY, VTAConfig(log_block=5, log_wgt_buff_size=13),
                                    VTAConfig(log_batch=1, log_block=5)], ids=lambda c: c.name)
@pytest.mark.parametrize("double_buffer", [True, False])
def test_gemm_any_config_and_shape(config, double_buffer):
    prog, expected = gemm_program(config, 37, 70, 45, seed=1, double_buffer=double_buffer)
    result = fsim.run(prog)
    assert np.array_equal(prog.read("C", result.dram), expected)
    s = result.stats
    assert s.load_to_compute_pushes == s.load_to_compute_pops
    assert s.compute_to_load_pushes == s.compute_to_load_pops  # the builder drains WAR tokens
    assert s.store_to_compute_pushes == s.store_to_compute_pops


def test_gemm_tiling_fits_buffers():
    t = gemm_tiling(VTAConfig(), 1024, 1024, 1024)
    cfg = VTAConfig()
    assert (t.tm, t.tk, t.tn, t.slots, t.acc_slots) == (44, 23, 22, 2, 2)
    assert t.tm * t.tk <= cfg.inp_depth // 2 and t.tn * t.tk <= cfg.wgt_depth // 2 and t.tm * t.tn <= cfg.acc_depth // 2
    single = gemm_tiling(TINY, 16, 16, 16, double_buffer=False)
    assert single.slots == single.acc_slots == 1


def test_gemm_double_buffering_overlaps_load_with_compute():
    """With two slots the load of the next k-tile needs no token from the GEMM before it."""
    prog, _ = gemm_program(TINY, 8, 64, 8, double_buffer=True)
    loads = [i for i in prog.insns if isinstance(i, Load) and i.mem in (1, 2) and i.x_size]
    assert len(loads) >= 4
    assert not loads[0].pop_next and not loads[2].pop_next  # first two tiles go to fresh slots
    single, _ = gemm_program(TINY, 8, 64, 8, double_buffer=False)
    loads1 = [i for i in single.insns if isinstance(i, Load) and i.mem == 2 and i.x_size]
    assert all(i.pop_next for i in loads1[1:])


def test_gemm_errors(cfg):
    with pytest.raises(ValueError, match=r"^m must be a positive integer, not 0$"):
        gemm_program(cfg, 0, 4, 4)
    with pytest.raises(ValueError, match=r"^shift must be between 0 and 31, not 40$"):
        gemm_program(cfg, 4, 4, 4, shift=40)


def test_pack_unpack():
    a = np.arange(5 * 7).reshape(5, 7).astype(np.int8)
    p = pack_inp(a, SMALL_CFG)
    assert p.shape == (3, 2, 2, 4)
    assert p[1, 1, 0].tolist() == [a[2, 4], a[2, 5], a[2, 6], 0]
    w = pack_wgt(a, SMALL_CFG)  # k=5, n=7
    assert w.shape == (2, 2, 4, 4)
    assert w[1, 0, 2, 3] == a[3, 6]
    c = np.arange(2 * 3 * 2 * 4).reshape(2, 3, 2, 4)
    assert unpack_out(c, 3, 10)[2, 9] == c[1, 2, 0, 1]
