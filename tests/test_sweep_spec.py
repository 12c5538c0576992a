"""vta.sweep.spec: sweep files validated whole, expanded deterministically, invalid configs kept as failed points."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from vta.config import VTAConfig
from vta.sweep.spec import SweepSpecError, config_key, load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent


def _spec(vary: dict, **sweep: object):
    return parse_spec({"sweep": {"models": ["tiny_cnn"], **sweep}, "vary": vary})


def test_grid_expands_in_file_order_last_key_fastest():
    spec = _spec({"LOG_BLOCK": [3, 4], "bus_bytes": [8, 16, 32]})
    designs = spec.designs()
    assert [(d.cfg.log_block, d.cfg.bus_bytes) for d in designs] == list(itertools.product([3, 4], [8, 16, 32]))
    assert designs[1].key == "1x8_i8w8a32_15_15_18_17_bus16"
    assert spec.grid_size == 6


def test_points_are_every_design_on_every_model():
    spec = parse_spec({"sweep": {"models": ["tiny_cnn", "mini_resnet"], "timeout": 5}, "vary": {"LOG_BATCH": [0, 1]}})
    points = spec.points()
    assert [(p.design.cfg.log_batch, p.model, p.timeout) for p in points] == [
        (0, "tiny_cnn", 5.0), (0, "mini_resnet", 5.0), (1, "tiny_cnn", 5.0), (1, "mini_resnet", 5.0)]


def test_random_samples_are_deterministic_distinct_and_from_the_grid():
    vary = {"LOG_BLOCK": [3, 4, 5], "LOG_BATCH": [0, 1], "BUS_BYTES": [8, 16, 32, 64]}
    a = [d.key for d in _spec(vary, samples=7, seed=3).designs()]
    b = [d.key for d in _spec(vary, samples=7, seed=3).designs()]
    c = [d.key for d in _spec(vary, samples=7, seed=4).designs()]
    grid = [d.key for d in _spec(vary).designs()]
    assert a == b and a != c
    assert len(set(a)) == 7 and set(a) <= set(grid)
    assert a == [k for k in grid if k in set(a)]  # in grid order
    assert len(_spec(vary, samples=1000).designs()) == 24  # more samples than designs: the whole grid


def test_invalid_combination_becomes_a_design_with_its_reason():
    designs = _spec({"LOG_BLOCK": [4], "LOG_WGT_BUFF_SIZE": [8, 18]}).designs()
    bad, good = designs
    assert bad.cfg is None and bad.key == "invalid[LOG_BLOCK=4,LOG_WGT_BUFF_SIZE=8]"
    assert "LOG_WGT_BUFF_SIZE=8 gives 256 bytes, too small for two entries" in bad.error
    assert bad.fields["LOG_WGT_BUFF_SIZE"] == 8
    assert good.cfg == VTAConfig()


def test_base_table_and_knobs_in_the_key():
    spec = parse_spec({"sweep": {"models": ["tiny_cnn"]}, "base": {"CLOCK_MHZ": 200},
                       "vary": {"policy": ["auto", "accel"], "double_buffer": [True, False]}})
    keys = [d.key for d in spec.designs()]
    assert keys == ["1x16_i8w8a32_15_15_18_17_clk200", "1x16_i8w8a32_15_15_18_17_clk200+double_buffer=false",
                    "1x16_i8w8a32_15_15_18_17_clk200+policy=\"accel\"",
                    "1x16_i8w8a32_15_15_18_17_clk200+double_buffer=false+policy=\"accel\""]
    assert config_key(VTAConfig(), {"policy": "auto", "double_buffer": True}) == "1x16_i8w8a32_15_15_18_17"


def test_base_file_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "design.toml").write_text("LOG_BLOCK = 3\nBUS_BYTES = 16\n")
    (tmp_path / "s.toml").write_text('[sweep]\nmodels = ["tiny_cnn"]\nbase = "design.toml"\n[vary]\nLOG_BATCH = [1]\n')
    spec = load_spec(tmp_path / "s.toml")
    assert spec.name == "s"
    assert spec.designs()[0].cfg == VTAConfig(log_block=3, bus_bytes=16, log_batch=1)


def test_every_problem_is_listed_at_once(tmp_path):
    with pytest.raises(SweepSpecError) as info:
        parse_spec({"sweep": {"models": ["no_such_net", 3], "mode": "fast", "timeout": 0, "samples": -1,
                              "seed": "x", "colour": 1, "base": "missing.toml"},
                    "base": {"LOG_BLOCK": 9, "SPEED": 1},
                    "vary": {"LOG_BLOK": [3], "LOG_BATCH": [], "BUS_BYTES": [8, 8], "policy": ["fast"]},
                    "extra": {}}, base_dir=tmp_path, source="s.toml")
    problems = info.value.problems
    expected = [
        "unknown table or key [extra]; a sweep file has [sweep], [base] and [vary]",
        "unknown key 'colour' in [sweep]; known keys are area, base, mode, models, name, samples, seed, tech, timeout",
        "models: 'no_such_net' is neither a zoo model",
        "models: 3 is not a string",
        "mode must be one of 'model', 'exact', not 'fast'",
        "timeout must be a positive number of seconds, not 0",
        "samples must be a positive integer (designs drawn at random), not -1",
        "seed must be an integer, not 'x'",
        "base must name an existing file (relative to the sweep file), not 'missing.toml'",
        "[base]: unknown config field 'SPEED'",
        "[base]: LOG_BLOCK must be between 2 and 6, not 9",
        "[vary]: 'LOG_BLOK' is neither a config field",
        "[vary]: LOG_BATCH must be a non-empty list of values, not []",
        "[vary]: BUS_BYTES lists a value twice: [8, 8]",
        "[vary]: policy values must be among ['auto', 'accel'], not ['fast']",
    ]
    assert len(problems) == len(expected)
    for want, got in zip(expected, problems):
        assert got.startswith(want), (want, got)
    assert str(info.value).startswith("invalid sweep file s.toml (15 problems):\n  - unknown table")


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SweepSpecError, match="cannot read the file"):
        load_spec(tmp_path / "none.toml")
    (tmp_path / "bad.toml").write_text("[sweep\n")
    with pytest.raises(SweepSpecError, match="the file is not valid TOML"):
        load_spec(tmp_path / "bad.toml")


def test_example_sweep_files_are_valid():
    wide = load_spec(ROOT / "scripts" / "sweeps" / "wide.toml")
    assert wide.grid_size >= 200 and wide.models == ("resnet18", "mini_resnet")
    assert all(d.cfg is not None for d in wide.designs())
    small = load_spec(ROOT / "scripts" / "sweeps" / "small.toml")
    assert [d.cfg is None for d in small.designs()] == [False, False, True, False]


def test_area_defaults_by_mode_and_is_checked():
    assert _spec({"LOG_BLOCK": [4]}).points()[0].area == "model"
    assert _spec({"LOG_BLOCK": [4]}, mode="exact").points()[0].area == "yosys"
    assert _spec({"LOG_BLOCK": [4]}, mode="exact", area="model").points()[0].area == "model"
    with pytest.raises(SweepSpecError, match="area must be one of 'model', 'yosys', not 'abc'"):
        _spec({"LOG_BLOCK": [4]}, area="abc")
    exact = load_spec(ROOT / "scripts" / "sweeps" / "exact.toml")
    assert (exact.mode, exact.area, len(exact.designs()), exact.models) == ("exact", "yosys", 12, ("resnet18",))


# ---- what no point could survive is an error of the file -----------------------------------------------------------
HUGE = {name: list(range(1, 40)) for name in ("DRAM_LATENCY", "CMD_QUEUE_DEPTH", "TOKEN_QUEUE_DEPTH", "BUS_BYTES",
                                              "LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE",
                                              "LOG_ACC_BUFF_SIZE")}
"""8 fields of 39 values: a grid of 5.35e12 designs, whose list alone would not fit in memory."""


def test_a_grid_above_the_limit_is_refused_and_suggests_samples():
    from vta.sweep.spec import MAX_POINTS
    with pytest.raises(SweepSpecError) as info:
        parse_spec({"sweep": {"models": ["tiny_cnn", "mini_resnet"]}, "vary": HUGE}, source="huge.toml")
    assert info.value.problems == [
        "[vary] makes a grid of 39 x 39 x 39 x 39 x 39 x 39 x 39 x 39 = 5,352,009,260,481 designs, 10,704,018,520,962 "
        "points on 2 models: more than the 100,000 points a sweep may measure; give samples = N in [sweep] to measure "
        "N designs drawn at random from the grid (N at most 50,000 with 2 models), or vary fewer values"]
    assert str(info.value).startswith("invalid sweep file huge.toml (1 problem)")
    with pytest.raises(SweepSpecError, match=r"^invalid sweep file \(1 problem\):\n  - samples = 100,001 makes "
                                             r"100,001 points on 1 model: more than the 100,000 points a sweep may "
                                             r"measure; give samples of at most 100,000$"):
        _spec(HUGE, samples=MAX_POINTS + 1)
    limit = _spec({"LOG_BLOCK": [3, 4]}, samples=MAX_POINTS)  # samples above the grid: the grid, 2 designs
    assert limit.design_count == 2


def test_samples_from_a_huge_grid_are_drawn_without_building_it():
    """5.35e12 designs, and 39**13 (past sys.maxsize, where random.sample cannot take the range) with 13 fields."""
    spec = _spec(HUGE, samples=3, seed=5)
    designs = spec.designs()
    assert len(designs) == 3 and [d.key for d in designs] == [d.key for d in _spec(HUGE, samples=3, seed=5).designs()]
    wider = {**HUGE, **{name: list(range(1, 40)) for name in ("LOG_BATCH", "LOG_BLOCK", "LOG_INP_WIDTH",
                                                               "LOG_WGT_WIDTH", "LOG_ACC_WIDTH")}}
    spec = _spec(wider, samples=4, seed=1)
    assert spec.grid_size == 39 ** 13 and len(spec.designs()) == 4
    assert [d.fields for d in spec.designs()] == [d.fields for d in _spec(wider, samples=4, seed=1).designs()]


def test_designs_of_a_spec_built_past_the_validation_refuse_a_huge_grid():
    from vta.sweep.spec import SweepSpec
    spec = SweepSpec("huge", ("tiny_cnn",), VTAConfig().to_dict(), {k: tuple(v) for k, v in HUGE.items()},
                     source="made.toml")
    with pytest.raises(SweepSpecError, match=r"invalid sweep file made.toml \(1 problem\):\n  - \[vary\] makes a grid"):
        spec.designs()


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -float("inf"), 604_801, 10 ** 30])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_up_to_a_week_is_refused(timeout):
    with pytest.raises(SweepSpecError) as info:
        _spec({"LOG_BLOCK": [4]}, timeout=timeout)
    assert info.value.problems == [f"timeout must be a positive number of seconds, not {timeout!r} (a finite number, "
                                   f"at most 604,800: one week)"]
    assert _spec({"LOG_BLOCK": [4]}, timeout=604_800).timeout == 604_800.0


def test_a_tech_file_that_is_not_one_is_refused_up_front(tmp_path):
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07\x12\x04junk")
    (tmp_path / "half.toml").write_text("[mac]\n")
    (tmp_path / "deep.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    for name, why in (("junk.onnx", "tech file junk.onnx: "), ("half.toml", "tech file half.toml: [")):
        with pytest.raises(SweepSpecError) as info:
            parse_spec({"sweep": {"models": ["tiny_cnn"], "tech": name}, "vary": {"LOG_BLOCK": [4]}},
                       base_dir=tmp_path, source="s.toml")
        assert all(p.startswith(why) for p in info.value.problems), info.value.problems
    with pytest.raises(SweepSpecError) as info:
        parse_spec({"sweep": {"models": ["tiny_cnn"], "tech": "deep.toml"}, "vary": {"LOG_BLOCK": [4]}},
                   base_dir=tmp_path)
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith("tech file deep.toml: ")
    assert "nested too deeply" in info.value.problems[0]
    tech = ROOT / "vta" / "tech" / "default_45nm.toml"
    assert _spec({"LOG_BLOCK": [4]}, tech=str(tech)).tech == str(tech)


def test_a_toml_date_in_vary_is_refused_naming_the_key(tmp_path):
    (tmp_path / "date.toml").write_text('[sweep]\nmodels = ["tiny_cnn"]\n[vary]\nLOG_BLOCK = [1979-05-27]\n'
                                        'LOG_BATCH = [[0, 07:32:00]]\n')
    with pytest.raises(SweepSpecError) as info:
        load_spec(tmp_path / "date.toml")
    assert str(info.value) == (
        f"invalid sweep file {tmp_path / 'date.toml'} (2 problems):\n"
        "  - [vary]: LOG_BLOCK holds a TOML date or time (1979-05-27); a config field takes numbers or true/false, a "
        "knob one of its names\n"
        "  - [vary]: LOG_BATCH holds a TOML date or time (07:32:00); a config field takes numbers or true/false, a "
        "knob one of its names")


def test_a_file_nested_too_deeply_or_not_utf8_is_refused_naming_it(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text('[sweep]\nmodels = ["tiny_cnn"]\n[vary]\nLOG_BLOCK = ' + "[" * 100_000 + "\n")
    with pytest.raises(SweepSpecError, match=rf"^invalid sweep file {deep} \(1 problem\):\n  - the file is nested too "
                                             r"deeply to read \(arrays or tables inside one another past Python's "
                                             r"recursion limit\); a sweep file needs two levels$"):
        load_spec(deep)
    (tmp_path / "base.json").write_text("[" * 100_000)
    (tmp_path / "s.toml").write_text('[sweep]\nmodels = ["tiny_cnn"]\nbase = "base.json"\n[vary]\nLOG_BLOCK = [4]\n')
    with pytest.raises(SweepSpecError) as info:
        load_spec(tmp_path / "s.toml")
    assert len(info.value.problems) == 1 and info.value.problems[0].startswith("base config base.json: ")
    assert "nested too deeply" in info.value.problems[0]
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[sweep]\nname = "\xff"\n')
    with pytest.raises(SweepSpecError, match=rf"^invalid sweep file {latin} \(1 problem\):\n  - the file is not UTF-8 "
                                             r"text: byte 0xff at position 16 cannot be decoded; save it as UTF-8$"):
        load_spec(latin)


def test_a_zoo_model_whose_extra_is_missing_is_refused_up_front(monkeypatch):
    """scripts/sweeps/precision_imagenet.toml without the efficientnet extra ran 134 s and failed every one of its
    64 EfficientNet points, exit 0; the sweep file is now refused before any point, naming the package and the
    extra to install."""
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "skimage" else real(name, *a))
    with pytest.raises(SweepSpecError, match=r"models: 'efficientnet_lite0': EfficientNet-Lite0 needs the package "
                                             r"'skimage', which is not installed; install the optional extra"):
        parse_spec({"sweep": {"models": ["tiny_cnn", "efficientnet_lite0"]}, "vary": {"LOG_BLOCK": [4]}})


def test_a_model_file_that_is_not_onnx_is_refused_up_front(tmp_path):
    """A sweep listing a file that is not an ONNX model failed every one of its points; it is named before any."""
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all \xff\xfe")
    (tmp_path / "s.toml").write_text('[sweep]\nmodels = ["junk.onnx"]\n[vary]\nLOG_BLOCK = [4]\n')
    with pytest.raises(SweepSpecError, match=r"models: 'junk.onnx' is not an ONNX model, or it is truncated"):
        load_spec(tmp_path / "s.toml")
