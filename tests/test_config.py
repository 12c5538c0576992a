"""Tests of vta/config.py: defaults and derived values (docs/vta-reference.md), file loading, and every validation
message."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from vta.config import (
    KNOBS,
    MEM_ACC,
    MEM_ACC_8BIT,
    MEM_INP,
    MEM_OUT,
    MEM_UOP,
    MEM_WGT,
    ConfigError,
    VTAConfig,
    load_config,
)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

# VTA's config/vta_config.json as apache/tvm-vta ships it today (HW_VER 0.0.2 added ACC_DEP_DISTANCE).
VTA_JSON_LATEST = """{
  "TARGET" : "sim",
  "HW_VER" : "0.0.2",
  "LOG_INP_WIDTH" : 3,
  "LOG_WGT_WIDTH" : 3,
  "LOG_ACC_WIDTH" : 5,
  "LOG_BATCH" : 0,
  "LOG_BLOCK" : 4,
  "LOG_UOP_BUFF_SIZE" : 15,
  "LOG_INP_BUFF_SIZE" : 15,
  "LOG_WGT_BUFF_SIZE" : 18,
  "LOG_ACC_BUFF_SIZE" : 17,
  "ACC_DEP_DISTANCE" : 3
}
"""


def problems_of(**changes: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        VTAConfig(**changes)  # type: ignore[arg-type]
    return info.value.problems


# ---- defaults and derived values ----------------------------------------------------------------------------------
def test_defaults_are_vta_defaults() -> None:
    cfg = VTAConfig()
    assert (cfg.log_inp_width, cfg.log_wgt_width, cfg.log_acc_width) == (3, 3, 5)
    assert (cfg.log_batch, cfg.log_block) == (0, 4)
    assert (cfg.log_uop_buff_size, cfg.log_inp_buff_size, cfg.log_wgt_buff_size, cfg.log_acc_buff_size) == \
        (15, 15, 18, 17)
    assert (cfg.bus_bytes, cfg.dram_latency, cfg.cmd_queue_depth, cfg.token_queue_depth, cfg.clock_mhz) == \
        (8, 16, 64, 64, 100.0)


def test_default_name() -> None:
    assert VTAConfig().name == "1x16_i8w8a32_15_15_18_17"
    assert str(VTAConfig()) == "1x16_i8w8a32_15_15_18_17"


def test_default_depths_match_reference() -> None:
    cfg = VTAConfig()
    # docs/vta-reference.md: uop 8192 x 32 bits; inp 2048 x 1x16 int8; wgt 1024 x 16x16 int8;
    # acc 2048 x 1x16 int32; out 2048
    assert (cfg.uop_depth, cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth, cfg.out_depth) == (8192, 2048, 1024, 2048,
                                                                                           2048)
    assert [cfg.depth(m) for m in (MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_OUT, MEM_ACC_8BIT)] == \
        [8192, 1024, 2048, 2048, 2048, 2048]
    assert (cfg.log_uop_depth, cfg.log_inp_depth, cfg.log_wgt_depth, cfg.log_acc_depth) == (13, 11, 10, 11)


def test_default_element_sizes() -> None:
    cfg = VTAConfig()
    assert (cfg.uop_bits, cfg.uop_bytes) == (32, 4)
    assert (cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.acc_elem_bytes, cfg.out_elem_bytes) == (16, 256, 64, 16)
    assert [cfg.elem_bytes(m) for m in (MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_OUT, MEM_ACC_8BIT)] == \
        [4, 256, 16, 64, 16, 16]
    assert (cfg.batch, cfg.block_in, cfg.block_out, cfg.macs_per_cycle) == (1, 16, 16, 256)
    assert (cfg.inp_width, cfg.wgt_width, cfg.acc_width, cfg.out_width) == (8, 8, 32, 8)
    assert cfg.log_out_buff_size == 15
    assert cfg.uop_index_bits == (11, 11, 10)


def test_bad_memory_type_for_elem_bytes_and_depth() -> None:
    with pytest.raises(ValueError, match=r"^memory type must be one of \[0, 1, 2, 3, 4, 5\], not 6$"):
        VTAConfig().elem_bytes(6)
    with pytest.raises(ValueError, match=r"^memory type must be one of \[0, 1, 2, 3, 4, 5\], not 'inp'$"):
        VTAConfig().depth("inp")  # type: ignore[arg-type]


def test_derived_values_other_configs() -> None:
    cfg = VTAConfig(log_batch=1, log_block=3)
    assert cfg.name == "2x8_i8w8a32_15_15_18_17"
    assert (cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth) == (2048, 4096, 2048)
    assert cfg.uop_index_bits == (11, 11, 12)
    assert (cfg.uop_bits, cfg.uop_depth) == (64, 4096)  # 34 index bits do not fit 32
    cfg = VTAConfig(log_block=5)
    assert cfg.name == "1x32_i8w8a32_15_15_18_17"
    assert (cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth, cfg.macs_per_cycle) == (1024, 256, 1024, 1024)


def test_name_tags_only_non_default_cosim_fields() -> None:
    assert VTAConfig(bus_bytes=16, dram_latency=32).name == "1x16_i8w8a32_15_15_18_17_bus16_lat32"
    assert VTAConfig(cmd_queue_depth=8, token_queue_depth=4).name == "1x16_i8w8a32_15_15_18_17_cq8_tq4"
    assert VTAConfig(clock_mhz=250.0).name == "1x16_i8w8a32_15_15_18_17"


def test_frozen_and_replace() -> None:
    cfg = VTAConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.log_batch = 1  # type: ignore[misc]
    assert cfg.replace(log_batch=1).name == "2x16_i8w8a32_15_15_18_17"
    with pytest.raises(ConfigError, match=r"LOG_BATCH must be between 0 and 4, not 9"):
        cfg.replace(log_batch=9)


# ---- dicts and files ------------------------------------------------------------------------------------------------
def test_to_dict_from_dict_round_trip() -> None:
    for cfg in (VTAConfig(), VTAConfig(log_batch=1, log_block=3, bus_bytes=32, clock_mhz=150.5)):
        data = cfg.to_dict()
        assert list(data)[:9] == ["LOG_INP_WIDTH", "LOG_WGT_WIDTH", "LOG_ACC_WIDTH", "LOG_BATCH", "LOG_BLOCK",
                                  "LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE", "LOG_ACC_BUFF_SIZE"]
        assert VTAConfig.from_dict(data) == cfg


def test_from_dict_accepts_lower_case_field_names() -> None:
    assert VTAConfig.from_dict({"log_batch": 1, "BUS_BYTES": 16}) == VTAConfig(log_batch=1, bus_bytes=16)


def test_vta_json_loads_unchanged() -> None:
    assert (CONFIGS / "vta_config.json").read_text() == VTA_JSON_LATEST  # byte for byte VTA's file
    assert load_config(CONFIGS / "vta_config.json") == VTAConfig()


def test_vta_json_without_acc_dep_distance(tmp_path: Path) -> None:
    data = json.loads(VTA_JSON_LATEST)
    del data["ACC_DEP_DISTANCE"]
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps(data))
    assert load_config(path) == VTAConfig()


def test_vta_json_old_style_keys_are_ignored(tmp_path: Path) -> None:
    # VTA 0.0.1 files also carried derived keys; they are accepted and ignored.
    data = dict(VTAConfig().to_dict(), TARGET="pynq", HW_VER="0.0.1", LOG_BLOCK_IN=4, LOG_BLOCK_OUT=4,
                LOG_OUT_WIDTH=3, LOG_OUT_BUFF_SIZE=15)
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps(data))
    assert load_config(path) == VTAConfig()


@pytest.mark.parametrize("file, name", [
    ("default.toml", "1x16_i8w8a32_15_15_18_17"),
    ("batch2x16.toml", "2x16_i8w8a32_15_15_18_17"),
    ("small1x8.toml", "1x8_i8w8a32_15_14_16_16"),
    ("large1x32.toml", "1x32_i8w8a32_15_16_20_18_bus32"),
    ("bus16.toml", "1x16_i8w8a32_15_15_18_17_bus16"),
    ("vta_config.json", "1x16_i8w8a32_15_15_18_17"),
])
def test_example_configs_load(file: str, name: str) -> None:
    assert load_config(CONFIGS / file).name == name


def test_default_toml_equals_defaults() -> None:
    assert load_config(CONFIGS / "default.toml") == VTAConfig()


def test_toml_top_level_and_vta_table(tmp_path: Path) -> None:
    top = tmp_path / "top.toml"
    top.write_text("LOG_BATCH = 1\nbus_bytes = 16\n")
    table = tmp_path / "table.toml"
    table.write_text("[vta]\nLOG_BATCH = 1\nBUS_BYTES = 16\n")
    expected = VTAConfig(log_batch=1, bus_bytes=16)
    assert load_config(top) == expected
    assert load_config(table) == expected


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match=re.escape(f"invalid VTA configuration in {path} (1 problem):\n"
                                                    "  - cannot read the config file: No such file or directory")):
        load_config(path)


@pytest.mark.parametrize("name, text, problem", [
    ("bad.json", "{LOG_BATCH: 1}", r"  - the file is not valid JSON: Expecting property name"),
    ("bad.toml", "LOG_BATCH = = 1\n", r"  - the file is not valid TOML: "),
    ("list.json", "[1, 2]", r"  - the file must hold a table of keys, not list$"),
])
def test_load_config_refuses_a_file_that_is_not_a_table_of_keys(tmp_path: Path, name: str, text: str,
                                                                 problem: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=problem):
        load_config(path)


# ---- validation messages --------------------------------------------------------------------------------------------
def test_unknown_key() -> None:
    with pytest.raises(ConfigError) as info:
        VTAConfig.from_dict({"LOG_BATCHES": 1})
    assert info.value.problems == [
        "unknown key 'LOG_BATCHES' (did you mean LOG_BATCH?); known keys are ALU_PIPELINE, BUS_BYTES, CLOCK_MHZ, "
        "CMD_QUEUE_DEPTH, CONCURRENT_ALU, DRAM_LATENCY, FUSED_REQUANT, GEMM_OVERWRITE, LANE_REDUCE, "
        "LOG_ACC_BUFF_SIZE, LOG_ACC_WIDTH, LOG_BATCH, LOG_BLOCK, LOG_INP_BUFF_SIZE, LOG_INP_WIDTH, LOG_UOP_BUFF_SIZE, "
        "LOG_WGT_BUFF_SIZE, LOG_WGT_WIDTH, TOKEN_QUEUE_DEPTH"]


def test_key_given_twice() -> None:
    with pytest.raises(ConfigError) as info:
        VTAConfig.from_dict({"LOG_BATCH": 1, "log_batch": 1})
    assert info.value.problems == ["key 'log_batch' is given twice (as upper and lower case)"]


@pytest.mark.parametrize("changes, message", [
    ({"log_batch": "1"}, "LOG_BATCH must be an integer, not '1'"),
    ({"log_block": 4.0}, "LOG_BLOCK must be an integer, not 4.0"),
    ({"bus_bytes": True}, "BUS_BYTES must be an integer, not True"),
    ({"log_uop_buff_size": None}, "LOG_UOP_BUFF_SIZE must be an integer, not None"),
])
def test_wrong_type(changes: dict[str, object], message: str) -> None:
    assert problems_of(**changes) == [message]


def test_clock_accepts_int_and_float_only() -> None:
    assert VTAConfig(clock_mhz=200).clock_mhz == 200
    assert VTAConfig(clock_mhz=312.5).clock_mhz == 312.5
    assert len(problems_of(clock_mhz=False)) == len(problems_of(clock_mhz="fast")) == 1


@pytest.mark.parametrize("value", ["fast", False])
def test_clock_must_be_a_number(value: object) -> None:
    assert problems_of(clock_mhz=value) == [f"CLOCK_MHZ must be a number, not {value!r}"]


@pytest.mark.parametrize("changes, message", [
    ({"log_batch": 5}, "LOG_BATCH must be between 0 and 4, not 5"),
    ({"log_block": 1}, "LOG_BLOCK must be between 2 and 6, not 1"),
    ({"log_inp_width": 4}, "LOG_INP_WIDTH must be between 2 and 3 (int4 (2) and int8 (3) inputs are supported), not 4"),
    ({"log_wgt_width": 1}, "LOG_WGT_WIDTH must be between 2 and 3 (int4 (2) and int8 (3) weights are supported), "
                           "not 1"),
    ({"log_acc_width": 4},
     "LOG_ACC_WIDTH must be between 5 and 5 (only int32 accumulators (5) are supported), not 4"),
    ({"log_uop_buff_size": 21}, "LOG_UOP_BUFF_SIZE must be between 6 and 20, not 21"),
    ({"bus_bytes": 0}, "BUS_BYTES must be between 1 and 128, not 0"),
    ({"dram_latency": 2000}, "DRAM_LATENCY must be between 1 and 1024, not 2000"),
    ({"cmd_queue_depth": 1}, "CMD_QUEUE_DEPTH must be between 2 and 4096, not 1"),
    ({"token_queue_depth": 5000}, "TOKEN_QUEUE_DEPTH must be between 2 and 4096, not 5000"),
    ({"clock_mhz": 0.5}, "CLOCK_MHZ must be between 1 and 10000, not 0.5"),
])
def test_out_of_range(changes: dict[str, object], message: str) -> None:
    assert problems_of(**changes) == [message]


def test_bus_bytes_power_of_two() -> None:
    assert problems_of(bus_bytes=12) == ["BUS_BYTES must be a power of two, not 12"]


@pytest.mark.parametrize("changes, message", [
    ({"log_wgt_buff_size": 6}, "LOG_WGT_BUFF_SIZE=6 gives 64 bytes, too small for two entries of one BLOCK x BLOCK "
                               "weight tile (256 bytes each); use at least 9"),
    ({"log_inp_buff_size": 6, "log_batch": 1, "log_block": 5},
     "LOG_INP_BUFF_SIZE=6 gives 64 bytes, too small for two entries of one BATCH x BLOCK_IN input tile (64 bytes "
     "each); use at least 7"),
    ({"log_acc_buff_size": 6}, "LOG_ACC_BUFF_SIZE=6 gives 64 bytes, too small for two entries of one BATCH x "
                               "BLOCK_OUT int32 accumulator tile (64 bytes each); use at least 7"),
])
def test_buffer_too_small(changes: dict[str, object], message: str) -> None:
    assert problems_of(**changes) == [message]


def test_buffer_too_deep() -> None:
    assert problems_of(log_inp_buff_size=22) == [
        "LOG_INP_BUFF_SIZE=22 gives 262144 entries, more than the 16-bit sram_base field of LOAD/STORE can address "
        "(65536); use at most 20"]
    assert problems_of(log_uop_buff_size=19) == [
        "LOG_UOP_BUFF_SIZE=19 gives 131072 entries, more than the 16-bit sram_base field of LOAD/STORE can address "
        "(65536); use at most 18"]
    assert VTAConfig(log_uop_buff_size=18).uop_depth == 65536  # exactly addressable


def test_several_problems_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        VTAConfig.from_dict({"LOG_BATCH": 7, "LOG_BLOCK": "4", "BUS_BYTES": 12, "COLOR": "red"}, source="x.toml")
    assert info.value.problems == [
        "unknown key 'COLOR'; known keys are ALU_PIPELINE, BUS_BYTES, CLOCK_MHZ, CMD_QUEUE_DEPTH, CONCURRENT_ALU, "
        "DRAM_LATENCY, FUSED_REQUANT, GEMM_OVERWRITE, LANE_REDUCE, LOG_ACC_BUFF_SIZE, LOG_ACC_WIDTH, LOG_BATCH, "
        "LOG_BLOCK, LOG_INP_BUFF_SIZE, LOG_INP_WIDTH, LOG_UOP_BUFF_SIZE, LOG_WGT_BUFF_SIZE, LOG_WGT_WIDTH, "
        "TOKEN_QUEUE_DEPTH",
        "LOG_BATCH must be between 0 and 4, not 7",
        "LOG_BLOCK must be an integer, not '4'",
        "BUS_BYTES must be a power of two, not 12",
    ]
    assert str(info.value).startswith("invalid VTA configuration in x.toml (4 problems):\n  - unknown key 'COLOR'")


def test_buffer_problems_reported_together() -> None:
    problems = problems_of(log_wgt_buff_size=6, log_acc_buff_size=24, dram_latency=0)
    assert problems == [
        "DRAM_LATENCY must be between 1 and 1024, not 0",
        "LOG_WGT_BUFF_SIZE=6 gives 64 bytes, too small for two entries of one BLOCK x BLOCK weight tile (256 bytes "
        "each); use at least 9",
        "LOG_ACC_BUFF_SIZE=24 gives 262144 entries, more than the 16-bit sram_base field of LOAD/STORE can address "
        "(65536); use at most 22",
    ]


@pytest.mark.parametrize("changes, message", [
    ({"log_inp_buff_size": "15"}, "LOG_INP_BUFF_SIZE must be an integer, not '15'"),
    ({"log_acc_buff_size": -1}, "LOG_ACC_BUFF_SIZE must be between 6 and 24, not -1"),
    ({"log_wgt_buff_size": 2.5}, "LOG_WGT_BUFF_SIZE must be an integer, not 2.5"),
])
def test_bad_buffer_size_reported_not_crashing(changes: dict[str, object], message: str) -> None:
    # the micro-op size depends on the other buffers' depths; a bad one must be reported, not crash the check
    assert problems_of(**changes) == [message]


def test_bad_other_buffer_still_checks_the_rest() -> None:
    assert problems_of(log_inp_buff_size="15", log_wgt_buff_size=6) == [
        "LOG_INP_BUFF_SIZE must be an integer, not '15'",
        "LOG_WGT_BUFF_SIZE=6 gives 64 bytes, too small for two entries of one BLOCK x BLOCK weight tile (256 bytes "
        "each); use at least 9"]


def test_config_error_is_value_error_and_counts() -> None:
    err = ConfigError(["a", "b"], "f.json")
    assert isinstance(err, ValueError)
    assert str(err) == "invalid VTA configuration in f.json (2 problems):\n  - a\n  - b"
    assert str(ConfigError(["only"])) == "invalid VTA configuration (1 problem):\n  - only"


# ---- limits of the hardware generator -------------------------------------------------------------------------------
def test_every_config_file_in_configs_validates() -> None:
    files = sorted(p for p in CONFIGS.iterdir() if p.suffix in (".toml", ".json"))
    assert len(files) >= 6
    for path in files:
        assert load_config(path).name  # raises ConfigError, naming the file, if the generator could not build it


def test_block_64_cannot_be_built() -> None:
    # the generator asserted in Amaranth's netlist after minutes and gigabytes; the config now says why, at once
    assert problems_of(log_block=6, log_wgt_buff_size=15) == [
        "LOG_BLOCK=6 (BLOCK 64) cannot be built: the generator's GEMM core stores a weight tile in one 133120-bit SRAM "
        "word, wider than the 65536 bits an Amaranth netlist value can hold; use LOG_BLOCK at most 5"]


def test_block_64_problem_listed_with_the_others(tmp_path: Path) -> None:
    path = tmp_path / "b64.toml"
    path.write_text("LOG_BLOCK = 6\nBUS_BYTES = 12\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems[0] == "BUS_BYTES must be a power of two, not 12"
    assert info.value.problems[1].startswith("LOG_BLOCK=6 (BLOCK 64) cannot be built: ")
    assert len(info.value.problems) == 2


@pytest.mark.parametrize("log_block", range(2, 7))
def test_packed_wgt_bits_is_the_generators(log_block: int) -> None:
    from vta.config import packed_wgt_bits
    from vta.hw.gemm import PackedWeightLayout
    block = 1 << log_block
    assert packed_wgt_bits(block) == PackedWeightLayout(block, block).bits


def test_every_valid_config_fits_the_netlist() -> None:
    """Every operand, SRAM word and result width the generator derives from a config that validates fits the 65536
    bits of one Amaranth netlist value; BLOCK 64 is the first shape that does not."""
    from vta.hw.gemm import wgt_operand_bits
    for log_batch in range(0, 5):
        for log_block in range(2, 7):
            wide = dict(log_batch=log_batch, log_block=log_block, log_wgt_buff_size=16, log_inp_buff_size=16,
                        log_acc_buff_size=20)
            batch, block = 1 << log_batch, 1 << log_block
            widths = [wgt_operand_bits(block, block, "packed"), wgt_operand_bits(block, block, "array"),
                      32 * batch * block, 8 * batch * block]
            try:
                VTAConfig(**wide)  # type: ignore[arg-type]
            except ConfigError:
                assert max(widths) > 1 << 16, (log_batch, log_block)
            else:
                assert max(widths) <= 1 << 16, (log_batch, log_block)


# ---- codesign knobs -------------------------------------------------------------------------------------------------
def test_knobs_are_off_by_default_and_leave_the_default_design_alone() -> None:
    cfg = VTAConfig()
    assert all(getattr(cfg, knob) is False for knob in KNOBS)
    assert "FUSED_REQUANT" not in cfg.to_dict()  # VTA's keys only, as before the knobs
    assert cfg.name == "1x16_i8w8a32_15_15_18_17"


def test_fused_requant_knob_round_trips_and_tags_the_name(tmp_path: Path) -> None:
    cfg = VTAConfig(fused_requant=True)
    assert cfg.name == "1x16_i8w8a32_15_15_18_17_rq"
    assert cfg.to_dict()["FUSED_REQUANT"] is True
    assert VTAConfig.from_dict(cfg.to_dict()) == cfg
    path = tmp_path / "knobs.toml"
    path.write_text("LOG_BLOCK = 3\nFUSED_REQUANT = true\n")
    assert load_config(path) == VTAConfig(log_block=3, fused_requant=True)
    knobs = load_config(CONFIGS / "knobs.toml")
    assert knobs.fused_requant and knobs.concurrent_alu and knobs.gemm_overwrite


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_knob_values_must_be_booleans(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        VTAConfig.from_dict({"FUSED_REQUANT": value})
    assert info.value.problems == [f"FUSED_REQUANT is a knob and must be true or false, not {value!r}"]
