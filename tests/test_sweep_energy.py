"""vta.counts and vta.energy: counters from the program equal fsim's; energies from the 45 nm table."""
from __future__ import annotations

import dataclasses

import pytest

from vta import fsim
from vta.compiler.pipeline import compile_model
from vta.compiler.runtime.compiled import AccelStep
from vta.config import VTAConfig
from vta.counters import CATALOGUE
from vta.counts import COUNTED, program_counts
from vta.energy import DEFAULT_TECH, TechError, layer_energy, load_tech, sram_pj_per_byte, static_pj


@pytest.mark.parametrize("cfg", [VTAConfig(), VTAConfig(log_batch=1, log_block=3, bus_bytes=16)], ids=str)
def test_program_counts_equal_the_functional_simulators_statistics(cfg):
    compiled = compile_model("tiny_cnn", cfg, policy="accel")
    steps = [s for s in compiled.steps if isinstance(s, AccelStep)]
    assert steps
    for step in steps:
        stats = dataclasses.asdict(fsim.run(step.program).stats)
        counts = program_counts(step.program)
        assert counts == {k: stats[k] for k in COUNTED}
        assert counts["macs"] > 0 or counts["alu_uops"] > 0
    assert all(name in CATALOGUE for name in COUNTED)


def test_default_tech_is_the_horowitz_table():
    tech = load_tech()
    assert tech.mac_pj == pytest.approx(0.2 + 0.1)
    assert tech.dram_pj_per_byte == pytest.approx(1300 / 8)
    assert sram_pj_per_byte(tech, 8192) == pytest.approx(10 / 8)
    assert sram_pj_per_byte(tech, 32768) == pytest.approx(20 / 8)
    assert sram_pj_per_byte(tech, 1 << 20) == pytest.approx(100 / 8)
    # log-linear between the points: 256 KB is 3/5 of the way from 32 KB to 1 MB
    assert sram_pj_per_byte(tech, 1 << 18) == pytest.approx((20 + 80 * 3 / 5) / 8)
    # below 8 KB: extrapolated from the first two points, never negative
    assert sram_pj_per_byte(tech, 4096) == pytest.approx(5 / 8)
    assert sram_pj_per_byte(tech, 64) == 0.0


def test_layer_energy_by_hand():
    cfg = VTAConfig()  # 16 x 16 MACs a micro-op; inp 16 B, wgt 256 B, acc 64 B, out 16 B entries
    tech = load_tech()
    counts = dict.fromkeys(COUNTED, 0)
    counts.update(gemm_uops=10, macs=8 * 256, alu_uops=3, inp_bytes_read=100, out_bytes_written=50,
                  insn_bytes_read=16)
    e = layer_energy(counts, cfg, tech)
    inp, wgt = sram_pj_per_byte(tech, 1 << 15), sram_pj_per_byte(tech, 1 << 18)
    acc, out, uop = sram_pj_per_byte(tech, 1 << 17), sram_pj_per_byte(tech, 1 << 15), sram_pj_per_byte(tech, 1 << 15)
    assert e["mac"] == pytest.approx(8 * 256 * 0.3)
    assert e["alu"] == pytest.approx(3 * 16 * 0.1)
    assert e["sram_inp"] == pytest.approx((8 * 16 + 100) * inp)
    assert e["sram_wgt"] == pytest.approx(8 * 256 * wgt)
    assert e["sram_acc"] == pytest.approx(((8 + 2 * 3) + (8 + 2 + 3)) * 64 * acc)
    assert e["sram_out"] == pytest.approx((50 + 13 * 16) * out)
    assert e["sram_uop"] == pytest.approx(13 * 4 * uop)
    assert e["dram"] == pytest.approx((100 + 50 + 16) * 1300 / 8)
    assert static_pj(tech, 1000.0, 1e-3) == pytest.approx(5.0 * 1e-3 * 1e9)


def test_user_tech_file_and_its_problems(tmp_path):
    text = DEFAULT_TECH.read_text().replace("access_pj = 1300.0", "access_pj = 2600.0")
    (tmp_path / "t.toml").write_text(text)
    assert load_tech(tmp_path / "t.toml").dram_pj_per_byte == pytest.approx(2600 / 8)
    bad = text.replace("mult_8b_pj = 0.2", "mult_8b_pj = -1").replace("size_bytes = [8192, 32768, 1048576]",
                                                                       "size_bytes = [8192, 32768]")
    bad = bad.replace("[cpu]\n", "[cpux]\n")
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(TechError) as info:
        load_tech(tmp_path / "bad.toml")
    assert info.value.problems == [
        "[compute] mult_8b_pj must be a positive number, not -1",
        "[cpu] mac_pj is missing",
        "[sram] size_bytes must be at least two increasing sizes, one per access_pj value",
    ]
    with pytest.raises(TechError, match="cannot read the file"):
        load_tech(tmp_path / "none.toml")
