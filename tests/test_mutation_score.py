"""The mutation score (scripts/mutation_score.py, docs/byo-rtl.md): how mutants are classified and wired into one
netlist (fast), and the muxed flow end to end on three mutants of configs/small1x8.toml (slow: Yosys prepares the
core in about 6 minutes, the one muxed build takes 2-3 minutes; then each mutant runs in a fraction of a second)."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vta.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("mutation_score", ROOT / "scripts" / "mutation_score.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ms = _script()
GEMM = "mutate -mode inv -module vta_core.compute.gemm -cell $add$x -port Y -portbit 3 -src vta_core.v:1.2-3.4"
QUEUE = "mutate -mode const0 -module vta_core.tq_s2c -cell $procmux$7 -port S -portbit 0 -wire \\$4 -wirebit 0"


def test_mutsel_is_wired_from_the_top_to_each_mutated_module() -> None:
    steps = ms.wiring({"vta_core.compute.gemm", "vta_core.tq_s2c"}, 8)
    assert steps == [
        "cd vta_core", "add -input mutsel 8", "cd ..",
        "cd vta_core.compute", "add -input mutsel 8", "cd ..",
        "cd vta_core.compute", "connect -port gemm mutsel mutsel", "cd ..",
        "cd vta_core", "connect -port compute mutsel mutsel", "cd ..",
        "cd vta_core", "connect -port tq_s2c mutsel mutsel", "cd ..",
    ]
    assert ms.wiring({"vta_core"}, 9) == []  # the top's own mutation made its port


def test_mutants_are_classified_equivalent_duplicate_or_candidate_with_their_mutsel_index() -> None:
    commands = [("m000", GEMM), ("m001", QUEUE), ("m002", GEMM + " "), ("m003", QUEUE + " ")]
    digests = {"m000": "a", "m001": "q", "m002": "a", "m003": "b", "base:vta_core.compute.gemm": "g",
               "base:vta_core.tq_s2c": "q"}
    entries = ms.classify(commands, digests)
    assert [(e["status"], e.get("index"), e.get("of")) for e in entries.values()] == [
        ("candidate", 1, None), ("equivalent", None, None), ("duplicate", None, "m000"), ("candidate", 2, None)]
    assert entries["m001"]["site"] == "vta_core.tq_s2c $procmux$7 S[0] (const0; )"


def test_the_score_counts_only_built_non_equivalent_mutants_and_lists_survivors() -> None:
    results = [{"name": "m000", "status": "killed", "feature": "stress tokens 1 latency 3", "site": "a"},
               {"name": "m004", "status": "killed", "feature": "stress tokens 0", "site": "d"},
               {"name": "m001", "status": "killed", "feature": "load uop", "site": "b"},
               {"name": "m002", "status": "equivalent", "site": "c"},
               {"name": "m003", "status": "survived", "site": "vta_core.x $dff$1 Q[2] (inv; v:1)"}]
    assert ms.score(results).splitlines() == [
        "5 mutants: 1 equivalent, 3 killed, 1 survived",
        "mutation score: 3 killed / 4 non-equivalent, built = 75.0%",
        "killed first by: 2 stress tokens, 1 load uop",
        "  survivor m003: vta_core.x $dff$1 Q[2] (inv; v:1)"]


def test_survivors_argued_equivalent_leave_a_second_score_and_a_killed_one_is_a_warning(tmp_path: Path) -> None:
    argued_file = tmp_path / "argued.toml"
    table = '[[argued]]\nname = "{}"\nconfig = "{}"\ndigest = "{}"\nclass = "{}"\nwhy = "{}"\n'
    argued_file.write_text(table.format("m003", "cfg", "d3", "gap", "never read")
                           + table.format("m001", "cfg", "d1", "x", "wrong")
                           + table.format("m009", "other", "d5", "y", "other core"))
    argued = ms.load_argued(argued_file, "cfg")
    assert sorted(argued) == ["d1", "d3"] and ms.load_argued(tmp_path / "none.toml", "cfg") == {}
    results = [{"name": "m000", "status": "killed", "feature": "load uop", "site": "a", "digest": "d0"},
               {"name": "m001", "status": "killed", "feature": "load uop", "site": "b", "digest": "d1"},
               {"name": "m003", "status": "survived", "site": "s3", "digest": "d3"},
               {"name": "m005", "status": "survived", "site": "s5", "digest": "d5"}]
    assert ms.score(results, argued).splitlines() == [
        "4 mutants: 2 killed, 2 survived",
        "mutation score: 2 killed / 4 non-equivalent, built = 50.0%",
        "without the 1 survivors argued equivalent (scripts/mutation_equivalents.toml): 2 killed / 3 = 66.7%",
        "warning: argued equivalent, yet killed (the argument is wrong): m001",
        "killed first by: 2 load uop",
        "  survivor m003: s3",
        "      argued equivalent (gap): never read",
        "  survivor m005: s5"]


def test_the_shipped_arguments_name_survivors_of_the_default_core_with_a_reason() -> None:
    argued = ms.load_argued(ROOT / "scripts" / "mutation_equivalents.toml", load_config(ROOT / "configs" /
                                                                                       "default.toml").name)
    assert len(argued) == 18
    assert all(len(d) == 64 and t["why"] and t["class"] and t["name"].startswith("m") for d, t in argued.items())


def test_the_wrapper_has_the_core_interfaces_ports_and_reads_mutsel_from_its_file(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "small1x8.toml")
    text = ms.mux_top(tmp_path, cfg, 8).read_text()
    assert "module vta_core (" in text and "input wire [63:0] mem_rd_data" in text
    assert f'$fopen("{(tmp_path / "mutsel").resolve()}", "r")' in text and ".mutsel(mutsel)" in text


@pytest.mark.slow
def test_three_mutants_in_one_muxed_build_are_killed(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results.jsonl"
    assert ms.main(["--config", str(ROOT / "configs" / "small1x8.toml"), "--count", "3", "--results",
                    str(results)]) == 0
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["name"], r["status"], r["how"]) for r in rows] == [(f"m00{i}", "killed", "muxed") for i in range(3)]
    assert "mutation score: 3 killed / 3 non-equivalent, built = 100.0%" in out


TINY = """module top(input clk, input we, input sel, input [1:0] wa, input [1:0] ra, input [3:0] a, input [3:0] c,
           output reg [3:0] q);
  reg [3:0] mem [0:3];
  wire [3:0] d = sel ? {1'b0, a[2:0]} : {1'b0, c[2:0]};
  always @(posedge clk) begin
    if (we) mem[wa] <= d;
    q <= mem[ra];
  end
endmodule
"""


def test_prove_equivalent_proves_a_dead_bit_and_refuses_live_ones_and_memory_ports(tmp_path: Path) -> None:
    """A memory whose write data's bit 3 is always 0: forcing that bit to 0 before the memory is proved equivalent;
    inverting bit 0 there, or bit 3 at the memory's write port (cut out of the proof), is not proved."""
    if shutil.which(ms.YOSYS) is None:
        pytest.skip(f"{ms.YOSYS} is not installed (`pip install -e \".[dev]\"` installs it)")
    (tmp_path / "top.v").write_text(TINY)
    ms._yosys("read_verilog top.v; prep -top top; write_rtlil design.il", tmp_path)
    dump = subprocess.run([ms.YOSYS, "-p", "read_rtlil design.il; dump t:$mux t:$mem_v2"], cwd=tmp_path,
                          capture_output=True, text=True, check=True).stdout
    cells = {block.split()[1]: block for block in dump.split("\n  cell ")[1:]}  # name -> its dump
    data = next(name for name, block in cells.items() if "_DATA" in block.split("connect \\Y")[-1].split()[0])
    mem = next(name for name, block in cells.items() if "WR_DATA" in block)
    cases = {"dead": ("const0", data, "B", 3), "live": ("inv", data, "B", 0), "memory port": ("inv", mem, "WR_DATA", 3)}
    verdicts = {case: ms.prove_equivalent(tmp_path, {"command": f"mutate -mode {mode} -module top -cell {cell} "
                                                                f"-port {port} -portbit {bit}"}, 120)["proof"]
                for case, (mode, cell, port, bit) in cases.items()}
    assert verdicts == {"dead": "proved", "live": "not proved", "memory port": "not proved"}
