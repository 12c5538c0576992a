"""Bring your own RTL (vta.tsim.ports, vta.tsim.byo, --rtl/--top on the command line): the expected ports are the
generated core's, a core with wrong ports or one that does not lint is refused before any build naming every
problem, file lists, and a foreign core built, run and checked against fsim from the command line."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import SMALL1X8_TOML

from vta.cli import main
from vta.config import VTAConfig, load_config
from vta.hw.verilog import generate_verilog
from vta.tsim import build as build_module
from vta.tsim.byo import ForeignCore, read_file_list
from vta.tsim.ports import CoreInterfaceError, Port, check_core, expected_ports, port_problems, read_ports

ROOT = Path(__file__).resolve().parent.parent

BAD_CORE = """
module vta_core (
    input clk, input rst, input start, input [31:0] insn_addr, input [15:0] insn_count,
    output done, input [5:0] csr_addr, output [63:0] csr_rdata,
    output mem_rd_req_valid, input mem_rd_req_ready, output [31:0] mem_rd_req_addr, output [15:0] mem_rd_req_len,
    input mem_rd_data_valid, output mem_rd_data_ready, input [63:0] mem_rd_data,
    output mem_wr_valid, output mem_wr_ready, output [31:0] mem_wr_addr, output [31:0] mem_wr_data,
    output [7:0] mem_wr_strb, output debug
);
    assign done = 1'b0;
endmodule
"""
"""A hand-written core for the small config (bus 8 bytes) with five problems: insn_count 16 bits, progress missing,
mem_wr_ready an output, mem_wr_data 32 bits, an extra port debug."""

BAD_CORE_PROBLEMS = [
    "port insn_count is 16 bits wide, expected 32",
    "port progress is missing (expected output progress)",
    "port mem_wr_ready is an output, expected an input",
    "port mem_wr_data is 32 bits wide, expected 64",
    "port debug (output debug) is not part of the core interface",
]


@pytest.fixture
def bad_core(tmp_path: Path) -> Path:
    path = tmp_path / "bad_core.v"
    path.write_text(BAD_CORE)
    return path


def test_expected_ports_are_the_interface_of_the_document(small_cfg8: VTAConfig) -> None:
    ports = {p.name: p for p in expected_ports(small_cfg8)}
    assert len(ports) == 21
    assert ports["mem_rd_data"] == Port("mem_rd_data", "in", 64)
    assert ports["mem_wr_strb"] == Port("mem_wr_strb", "out", 8)
    assert ports["csr_addr"] == Port("csr_addr", "in", 6)
    assert ports["mem_rd_req_len"] == Port("mem_rd_req_len", "out", 16)
    wide = load_config(ROOT / "configs" / "bus16.toml")
    assert {p.name: p.width for p in expected_ports(wide)}["mem_wr_data"] == 8 * wide.bus_bytes


def test_the_generated_core_has_exactly_the_expected_ports(small_cfg8: VTAConfig, small_core: Path) -> None:
    ports = read_ports([small_core])
    assert sorted(ports, key=lambda p: p.name) == sorted(expected_ports(small_cfg8), key=lambda p: p.name)
    assert check_core(small_cfg8, [small_core]) == ports


def test_the_generated_core_has_the_ports_at_another_bus_width(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "bus16.toml")
    assert port_problems(expected_ports(cfg), read_ports([generate_verilog(cfg, tmp_path)])) == []


def test_a_core_with_wrong_ports_is_refused_naming_every_problem(small_cfg8: VTAConfig, bad_core: Path) -> None:
    with pytest.raises(CoreInterfaceError) as info:
        ForeignCore([bad_core]).check(small_cfg8)
    assert info.value.problems == BAD_CORE_PROBLEMS
    assert str(info.value) == (
        "the core vta_core (bad_core.v) does not match the core interface of config 1x8_i8w8a32_15_14_16_16 "
        "(docs/core-interface.md): 5 problems:\n" + "\n".join(f"  - {p}" for p in BAD_CORE_PROBLEMS))


def test_a_bad_core_is_refused_before_any_build_starts(small_cfg8: VTAConfig, bad_core: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    monkeypatch.setattr(build_module, "_run", lambda *args, **kw: calls.append(args))
    core = ForeignCore([bad_core])
    with pytest.raises(CoreInterfaceError) as info:
        build_module.build(small_cfg8, generator=core, sources=core.sources, progress=False)
    assert info.value.problems == BAD_CORE_PROBLEMS
    assert calls == []  # neither verilator --cc nor the compilers ran


def test_the_command_line_refuses_a_bad_core_with_exit_2(small_cfg8: VTAConfig, bad_core: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    from vta.testing import random_program
    program = tmp_path / "prog.npz"
    random_program(small_cfg8, np.random.default_rng(1)).save(program)  # a saved program: its own config
    for argv in (["tsim", "build", "--rtl", str(bad_core), "--config", str(SMALL1X8_TOML)],
                 ["conform", "--rtl", str(bad_core), "--config", str(SMALL1X8_TOML)],
                 ["run", "--target", "tsim", "--rtl", str(bad_core), "--config", str(SMALL1X8_TOML)],
                 ["run", str(program), "--target", "tsim", "--rtl", str(bad_core)],
                 ["tsim", "run", str(program), "--rtl", str(bad_core)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert all(problem in err for problem in BAD_CORE_PROBLEMS), err
    assert not (tmp_path / "cache" / "tsim").exists() or not any((tmp_path / "cache" / "tsim").iterdir())


def test_a_core_that_does_not_lint_is_refused_with_verilators_error(small_cfg8: VTAConfig, tmp_path: Path) -> None:
    path = tmp_path / "broken.v"
    path.write_text("module vta_core(input clk);\n  assign x = ;\nendmodule\n")
    with pytest.raises(CoreInterfaceError, match=r"Verilator's lint \(--lint-only\) of top module vta_core in "
                                                 r"broken.v failed:\n%Error: .*broken.v:2"):
        ForeignCore([path]).check(small_cfg8)
    path.write_text("module vta_core(input clk);\nendmodule\n")
    with pytest.raises(CoreInterfaceError, match="Specified --top-module 'other' was not found"):
        ForeignCore([path], top="other").check(small_cfg8)


def test_file_lists_and_file_problems(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.v").write_text("module a; endmodule\n")
    (tmp_path / "sub" / "b.sv").write_text("module b; endmodule\n")
    (tmp_path / "sub" / "defs.vh").write_text("`define X 1\n")
    (tmp_path / "inner.f").write_text("sub/b.sv  // the second file\n")
    (tmp_path / "core.f").write_text("# a comment\na.v\n+incdir+sub\n-f inner.f\n")
    files, dirs = read_file_list(tmp_path / "core.f")
    assert files == [tmp_path / "a.v", tmp_path / "sub" / "b.sv"]
    assert dirs == [tmp_path / "sub"]
    core = ForeignCore([tmp_path / "core.f"], top="a")
    assert [p.name for p in core.compiled_files] == ["a.v", "b.sv"]
    assert [p.name for p in core.files] == ["a.v", "b.sv", "defs.vh"]  # the header is hashed, not compiled
    (tmp_path / "bad.f").write_text("a.v\n-DX=1\nmissing.v\n")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ValueError) as info:
        ForeignCore([tmp_path / "bad.f", tmp_path / "nowhere.v", tmp_path / "notes.txt"])
    assert str(info.value) == (
        f"the foreign core's files have 3 problems: the file list {tmp_path / 'bad.f'} has 1 problem: line 2: "
        f"option '-DX=1' is not supported (only file names, +incdir+DIR and -f LIST); {tmp_path / 'nowhere.v'}: "
        f"no such file; {tmp_path / 'notes.txt'}: not a Verilog or SystemVerilog file (.v, .sv, .vh, .svh) or a "
        "file list (.f)")


def test_top_without_rtl_and_rtl_on_another_target_are_refused(small_core: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tsim", "build", "--top", "x"]) == 2
    assert "--top names the top module of a foreign core; give its files with --rtl FILE..." in \
        capsys.readouterr().err
    assert main(["run", "--target", "fsim", "--rtl", str(small_core)]) == 2
    assert "--rtl and --top give a foreign core for --target tsim, not for --target fsim" in capsys.readouterr().err


def test_a_foreign_core_builds_runs_and_matches_fsim_from_the_command_line(
        small_cfg8: VTAConfig, small_core: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vta.testing import random_program
    assert main(["tsim", "build", "--rtl", str(small_core), "--config", str(SMALL1X8_TOML)]) == 0
    out = capsys.readouterr().out
    assert "vta_core: ports match the core interface of 1x8_i8w8a32_15_14_16_16" in out
    program = random_program(small_cfg8, np.random.default_rng(5))
    program.save(tmp_path / "prog.npz")
    assert main(["tsim", "run", str(tmp_path / "prog.npz"), "--rtl", str(small_core)]) == 0
    assert "check against fsim: DRAM equal; counters equal" in capsys.readouterr().out
    assert main(["run", str(tmp_path / "prog.npz"), "--target", "tsim", "--rtl", str(small_core), "--json"]) == 0
    assert '"backend": "tsim"' in capsys.readouterr().out


def test_the_default_builds_cache_key_does_not_depend_on_the_top_option(small_cfg8: VTAConfig,
                                                                        small_core: Path) -> None:
    generator, sources = build_module.resolve_generator(None, None)
    assert build_module._top_of(generator) == "vta_core"
    default = build_module._source_hash(small_cfg8, sources, "none")
    assert build_module._source_hash(small_cfg8, sources, "none", "vta_core") == default
    # a foreign core is keyed by its files' contents and its top's name
    core = ForeignCore([small_core])
    renamed = ForeignCore([small_core], top="vta_core_x")
    keys = {build_module._source_hash(small_cfg8, c.sources, "none", c.top) for c in (core, renamed)}
    assert len(keys) == 2 and default not in keys
    before = build_module._source_hash(small_cfg8, core.sources, "none", core.top)
    small_core.write_text(small_core.read_text() + "\n// an edit\n")
    try:
        assert build_module._source_hash(small_cfg8, core.sources, "none", core.top) != before
    finally:
        small_core.write_text(small_core.read_text().removesuffix("\n// an edit\n"))


def _make_inner() -> object:
    """examples/byo_core/make_inner.py, loaded from its path (the example is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("byo_make_inner", ROOT / "examples" / "byo_core" / "make_inner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_byo_core_example_passes_the_kit_and_runs_a_model_with_its_own_cycles(
        small_cfg8: VTAConfig, small_core: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vta.tsim.conform import run_kit
    listing = _make_inner().make_inner(small_cfg8, tmp_path / "byo")  # type: ignore[attr-defined]
    core = ForeignCore([listing], top="byo_core")
    assert [p.name for p in core.compiled_files] == ["byo_core.v", "vta_core_inner.v"]
    outcomes = run_kit(small_cfg8, backend_options=core.backend_options(), seeds=2)
    assert [o.feature for o in outcomes if not o.passed] == []
    reference = {o.feature: o.cycles for o in run_kit(small_cfg8, backend_options=ForeignCore([small_core])
                                                      .backend_options(), seeds=2)}
    # a register stage on each memory channel: every program takes longer on the wrapper
    assert all(o.cycles is not None and o.cycles >= (reference[o.feature] or 0) for o in outcomes)
    assert sum(o.cycles or 0 for o in outcomes) > sum(c or 0 for c in reference.values())
    assert main(["run", "tiny_cnn", "--target", "tsim", "--config", str(SMALL1X8_TOML), "--rtl", str(listing), "--top",
                 "byo_core", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rtl_core"] == "byo_core (byo_core.v, vta_core_inner.v)"
    assert report["totals"]["cycles"] > 0 and report["matches_integer_reference"] is True


def test_systemverilog_port_types_have_their_bit_widths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.sv").write_text(
        "typedef struct packed { logic [15:0] len; logic [31:0] addr; } req_t;\n"
        "typedef union packed { logic [7:0] b; logic [1:0][3:0] n; } u_t;\n"
        "module t #(parameter int B = 8) (input logic clk, input req_t r, output logic [8*B-1:0] d,\n"
        "    input wire [3:0][7:0] arr, input u_t u, input int i, output logic un [2]);\n"
        "  assign d = {r, 16'h0};\n  assign un[0] = 1'b0;\n  assign un[1] = 1'b0;\nendmodule\n")
    monkeypatch.chdir(tmp_path)  # a relative path: Verilator runs elsewhere
    widths = {p.name: p.width for p in read_ports([Path("t.sv")], "t")}
    assert widths == {"clk": 1, "r": 48, "d": 64, "arr": 32, "u": 8, "i": 32, "un": 0}  # unpacked: no plain width
    assert port_problems([Port("un", "out", 1)], [Port("un", "out", 0)]) == [
        "port un is not a packed bit vector (an unpacked array or struct?), expected 1 bit"]
