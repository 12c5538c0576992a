"""Tests of vta/cli.py: every command in-process through main([...]), exit codes, error messages without
tracebacks, plug-in groups, and one real subprocess (python -m vta) that also checks no heavy module is imported."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vta.cli import main
from vta.config import MEM_INP, VTAConfig
from vta.isa import Finish, Gemm, Load, Uop, encode_stream, encode_uops

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ASM_TEXT = """\
# two instructions and a micro-op
LOAD INP sram=0 dram=64 y=4 x=16 stride=16 pad=0,0,1,1 pop_next push_next
FINISH
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- help and global options ----------------------------------------------------------------------------------------
def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("config", "disasm", "asm", "run"):
        assert f"\n    {command} " in out
    assert "Exit codes: 0 ok, 1 a run failed, 2 bad input." in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "--version")[:2] == (0, "vta-lab 0.1.0\n")


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "frobnicate")
    assert code == 2
    assert "argument COMMAND: invalid choice: 'frobnicate'" in err
    assert run(capsys)[0] == 2  # a command is required
    code, _, err = run(capsys, "config")
    assert code == 2 and "the following arguments are required: {show,check}" in err


# ---- config ---------------------------------------------------------------------------------------------------------
def test_config_show_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "config", "show")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "name        1x16_i8w8a32_15_15_18_17"
    assert lines[1] == "source      defaults (VTAConfig())"
    expected = [
        "  LOG_WGT_BUFF_SIZE   18",
        "  CLOCK_MHZ           100.0",
        "  GEMM core          1 x 16 times 16 x 16 (256 int8 x int8 MACs per micro-op)",
        "  instructions       128 bits (16 bytes)",
        "  micro-ops          32 bits (4 bytes)",
        # buffer, bytes, entry bytes, depth, index bits
        "  uop       32768            4    8192          13",
        "  inp       32768           16    2048          11",
        "  wgt      262144          256    1024          10",
        "  acc      131072           64    2048          11",
        "  out       32768           16    2048          11",
        "  common  opcode[2:0] pop_prev[3:3] pop_next[4:4] push_prev[5:5] push_next[6:6]",
        "  UOP     dst[10:0] src[21:11] wgt[31:22]",
    ]
    assert [line for line in expected if line not in lines] == []
    assert any(line.startswith("  GEMM    reset[7:7] uop_bgn[20:8] uop_end[34:21]") for line in lines)
    assert "imm[127:112](s)" in out
    assert max(len(line) for line in lines) <= 120


def test_config_show_lists_the_knobs_as_true_or_false(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every field, the codesign knobs too when off; booleans as the TOML and JSON spell them."""
    code, out, _ = run(capsys, "config", "show")
    lines = out.splitlines()
    assert code == 0
    assert lines[lines.index("fields") + 15:lines.index("fields") + 18] == [
        "  FUSED_REQUANT       false", "  CONCURRENT_ALU      false", "  GEMM_OVERWRITE      false"]
    path = tmp_path / "k.toml"
    path.write_text("CONCURRENT_ALU = true\n")
    code, out, _ = run(capsys, "config", "show", "--config", str(path))
    assert "  CONCURRENT_ALU      true" in out.splitlines() and "True" not in out
    code, out, _ = run(capsys, "config", "show", "--json", "--config", str(path))
    assert {k: v for k, v in json.loads(out)["fields"].items() if k in ("FUSED_REQUANT", "CONCURRENT_ALU")} == {
        "FUSED_REQUANT": False, "CONCURRENT_ALU": True}


def test_every_subcommand_has_a_description() -> None:
    """Each help page a user can reach (`vta GROUP COMMAND --help`) opens with a description."""
    from vta.cli import PLUGINS, build_parser

    def pages(parser: argparse.ArgumentParser) -> Any:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    if sub.add_help:  # not a plug-in's placeholder
                        yield sub
                        yield from pages(sub)
    seen = {p.prog: p.description for command in ["run", *PLUGINS] for p in pages(build_parser(command))}
    assert {"vta hw verilog", "vta tsim cache", "vta sweep", "vta config show"} <= set(seen)
    assert [prog for prog, description in seen.items() if not description] == []


def test_config_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "config", "show", "--json", "--config", str(CONFIGS / "batch2x16.toml"))
    assert code == 0
    facts = json.loads(out)
    assert facts["name"] == "2x16_i8w8a32_15_15_18_17"
    assert facts["fields"]["LOG_BATCH"] == 1
    assert facts["derived"]["macs_per_cycle"] == 512
    assert facts["buffers"]["inp"] == {"bytes": 32768, "entry_bytes": 32, "depth": 1024, "index_bits": 10}
    # acc depth 1024: 10-bit ALU factors (4 x 10 bits from 64), then alu_opcode[106:104], use_imm[107], imm[123:108]
    assert facts["isa"]["ALU"]["imm"] == {"lsb": 108, "msb": 123, "width": 16, "signed": True}
    assert facts["isa"]["LOAD"]["dram_base"] == {"lsb": 26, "msb": 57, "width": 32, "signed": False}


def test_config_show_256_bit_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "b2.toml"
    path.write_text("LOG_BATCH = 1\nLOG_BLOCK = 3\n")
    code, out, _ = run(capsys, "config", "show", "--config", str(path))
    assert code == 0
    assert "name        2x8_i8w8a32_15_15_18_17" in out
    assert "  instructions       256 bits (32 bytes)" in out
    assert "wgt_factor_in[131:120]" in out


def test_config_show_vta_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "config", "show", "--config", str(CONFIGS / "vta_config.json"))
    assert code == 0 and out.startswith("name        1x16_i8w8a32_15_15_18_17\nsource      ")


def test_config_show_bad_config_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"LOG_BATCH": 9, "BUS_BYTES": 12}')
    code, out, err = run(capsys, "config", "show", "--config", str(path))
    assert (code, out) == (2, "")
    assert err == (f"vta: error: invalid VTA configuration in {path} (2 problems):\n"
                   "  - LOG_BATCH must be between 0 and 4, not 9\n"
                   "  - BUS_BYTES must be a power of two, not 12\n")


def test_config_check(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "config", "check", str(CONFIGS / "bus16.toml"))
    assert (code, out) == (0, f"{CONFIGS / 'bus16.toml'}: valid; canonical name 1x16_i8w8a32_15_15_18_17_bus16\n")
    missing = tmp_path / "none.toml"
    code, _, err = run(capsys, "config", "check", str(missing))
    assert code == 2
    assert err == (f"vta: error: invalid VTA configuration in {missing} (1 problem):\n"
                   "  - cannot read the config file: No such file or directory\n")


def test_debug_shows_traceback(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "--debug", "config", "check", str(tmp_path / "none.toml"))
    assert code == 2
    assert err.startswith("Traceback (most recent call last):")
    assert "vta.config.ConfigError: invalid VTA configuration" in err
    code, _, err = run(capsys, "config", "check", str(tmp_path / "none.toml"), "--debug")  # after the command too
    assert code == 2 and err.startswith("Traceback (most recent call last):")


# ---- asm / disasm ---------------------------------------------------------------------------------------------------
def test_asm_then_disasm_raw(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "prog.s"
    src.write_text(ASM_TEXT)
    binary = tmp_path / "prog.bin"
    code, out, _ = run(capsys, "asm", str(src), "-o", str(binary))
    assert (code, out) == (0, f"wrote {binary} (2 instructions, 32 bytes, 1x16_i8w8a32_15_15_18_17)\n")
    expected = encode_stream([Load(mem=MEM_INP, dram_base=64, y_size=4, x_size=16, x_stride=16, x_pad_0=1,
                                   x_pad_1=1, pop_next=True, push_next=True), Finish()], VTAConfig())
    assert binary.read_bytes() == expected.tobytes()
    code, out, _ = run(capsys, "disasm", "--raw", str(binary))
    assert (code, out) == (0, "# config 1x16_i8w8a32_15_15_18_17, 2 instructions\n" + ASM_TEXT.split("\n", 1)[1])
    code, out, _ = run(capsys, "disasm", "--raw", "-n", str(binary))
    assert out.splitlines()[2] == "FINISH  # 1"


def test_asm_256_bit_config(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "p.s"
    src.write_text("GEMM wgt=0,4095\nFINISH\n")
    cfg_file = tmp_path / "b2.toml"
    cfg_file.write_text("LOG_BATCH = 1\nLOG_BLOCK = 3\n")
    binary = tmp_path / "p.bin"
    code, _, _ = run(capsys, "asm", str(src), "-o", str(binary), "--config", str(cfg_file))
    assert code == 0 and binary.stat().st_size == 64
    code, out, _ = run(capsys, "disasm", "--raw", str(binary), "--config", str(cfg_file))
    assert out.splitlines()[1] == "GEMM uop=0:1 iter=1,1 dst=0,0 src=0,0 wgt=0,4095"
    code, _, err = run(capsys, "asm", str(src), "-o", str(binary))  # 12-bit value at the default config
    assert code == 2
    assert err.startswith("vta: error: line 1, token 'wgt=0,4095': GEMM field wgt_factor_in = 4095 does not fit")


def test_asm_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "bad.s"
    src.write_text("FINISH\nLOAD INP x=1 y=\n")
    code, out, err = run(capsys, "asm", str(src), "-o", str(tmp_path / "x.bin"))
    assert (code, out) == (2, "")
    assert err == "vta: error: line 2, token 'y=': y value must be an integer (decimal or 0x hex), not ''\n"
    assert not (tmp_path / "x.bin").exists()
    code, _, err = run(capsys, "asm", str(tmp_path / "none.s"), "-o", str(tmp_path / "x.bin"))
    assert code == 2 and err == f"vta: error: cannot read {tmp_path / 'none.s'}: No such file or directory\n"
    code, _, err = run(capsys, "asm", str(src))
    assert code == 2 and "the following arguments are required: -o/--output" in err


def test_asm_uop_lines(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = tmp_path / "k.s"
    src.write_text("UOP dst=1 src=2 wgt=3\nUOP dst=4 src=5\nGEMM uop=0:2\nFINISH\n")
    code, _, err = run(capsys, "asm", str(src), "-o", str(tmp_path / "k.bin"))
    assert code == 2
    assert err == f"vta: error: {src} has 2 UOP lines; give --uop-output FILE to write them\n"
    code, out, _ = run(capsys, "asm", str(src), "-o", str(tmp_path / "k.bin"), "--uop-output",
                       str(tmp_path / "u.bin"))
    assert code == 0
    assert out.splitlines()[1] == f"wrote {tmp_path / 'u.bin'} (2 micro-ops, 8 bytes, little-endian)"
    cfg = VTAConfig()
    assert (tmp_path / "u.bin").read_bytes() == encode_uops([1, 4], [2, 5], [3, 0], cfg).tobytes()
    assert (tmp_path / "k.bin").read_bytes() == encode_stream([Gemm(uop_end=2), Finish()], cfg).tobytes()


def test_disasm_raw_bad_size(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "odd.bin"
    path.write_bytes(bytes(20))
    code, _, err = run(capsys, "disasm", "--raw", str(path))
    assert code == 2
    assert err == "vta: error: an instruction stream must be a multiple of 16 bytes, not 20\n"
    code, _, err = run(capsys, "disasm", "--raw", "--uops", str(path))
    assert err == "vta: error: --uops needs a saved program (.npz): a raw instruction binary has no DRAM image\n"


def saved_program(tmp_path: Path) -> Path:
    from vta.program import ProgramBuilder
    builder = ProgramBuilder(VTAConfig())
    kernel = builder.uop_kernel("kernel", [Uop(1, 2, 3), Uop(4, 5, 6)])
    builder.load_uops(kernel, 8)
    builder.gemm(uop_bgn=8, uop_end=10, iter_out=2)
    path = tmp_path / "p.npz"
    builder.finish().save(path)
    return path


def test_disasm_saved_program_with_uops(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = saved_program(tmp_path)
    code, out, _ = run(capsys, "disasm", str(path), "--uops")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("# config 1x16_i8w8a32_15_15_18_17, ")
    assert lines[1].startswith("LOAD UOP sram=8 dram=")
    assert lines[2] == "GEMM uop=8:10 iter=2,1 dst=0,0 src=0,0 wgt=0,0"
    assert lines[-3:] == ["# micro-ops loaded by instruction 0 (to uop sram 8)", "UOP dst=1 src=2 wgt=3  # sram 8",
                          "UOP dst=4 src=5 wgt=6  # sram 9"]
    out_file = tmp_path / "p.s"
    assert run(capsys, "disasm", str(path), "-o", str(out_file))[:2] == (0, f"wrote {out_file} (4 instructions as "
                                                                            f"text)\n")
    from vta.asm import assemble
    from vta.program import Program
    assert assemble(out_file.read_text(), VTAConfig()) == Program.load(path).insns


def test_disasm_program_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "disasm", str(tmp_path / "none.npz"))
    assert code == 2 and err == f"vta: error: cannot read {tmp_path / 'none.npz'}: no such file\n"
    path = saved_program(tmp_path)
    code, _, err = run(capsys, "disasm", str(path), "--config", str(CONFIGS / "bus16.toml"))
    assert code == 2
    assert err == "vta: error: --config is only for --raw binaries; a saved program carries its own config\n"
    not_npz = tmp_path / "junk.npz"
    not_npz.write_bytes(b"not a zip file")
    code, _, err = run(capsys, "disasm", str(not_npz))
    assert code == 2 and err.startswith("vta: error: ")


# ---- run ------------------------------------------------------------------------------------------------------------
def test_run_gemm_fsim(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "run", "--m", "32", "--k", "48", "--n", "16")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("gemm 32x48x16 on fsim (1x16_i8w8a32_15_15_18_17, ")
    assert lines[1] == "  result                       correct (matches numpy)"
    assert lines[2] == "  cycles                       n/a (this backend does not count cycles)"
    assert "  useful_macs                  24,576" in lines
    assert "  macs                         24,576" in lines
    assert "  out_bytes_written            512" in lines  # 32 x 16 int8


def test_run_gemm_json_and_config(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "run", "--m", "20", "--k", "20", "--n", "20", "--json", "--config",
                       str(CONFIGS / "batch2x16.toml"))
    assert code == 0
    report = json.loads(out)
    assert (report["workload"], report["backend"], report["config"]) == ("gemm 20x20x20", "fsim",
                                                                         "2x16_i8w8a32_15_15_18_17")
    assert report["correct"] is True and report["cycles"] is None
    assert report["summary"] == {"useful_macs": 8000, "macs_issued": 10 * 2 * 2 * 512}  # 20 -> 2 blocks of 16
    # A (20 x 20, padded to 10 x 2 elements of 2x16 int8) is loaded once; C is 10 x 2 out elements of 2x16 int8
    assert (report["stats"]["inp_bytes_read"], report["stats"]["out_bytes_written"]) == (10 * 2 * 32, 10 * 2 * 32)


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.iterdir() if p.is_file()))
def test_run_gemm_every_example_config(capsys: pytest.CaptureFixture[str], config: str) -> None:
    code, out, _ = run(capsys, "run", "--m", "24", "--k", "40", "--n", "36", "--json", "--config",
                       str(CONFIGS / config))
    assert code == 0
    assert json.loads(out)["correct"] is True


def test_run_saved_program(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = saved_program(tmp_path)
    code, out, _ = run(capsys, "run", str(path), "--json")
    assert code == 0
    report = json.loads(out)
    assert (report["workload"], report["backend"], report["correct"]) == (f"program {path}", "fsim", None)
    assert report["stats"]["gemm_uops"] == 4  # 2 micro-ops x iter_out 2
    assert report["summary"] == {"macs_issued": 4 * 256}
    code, out, _ = run(capsys, "run", str(path))
    assert out.splitlines()[1] == "  result                       not checked (no reference for a saved program)"
    code, _, err = run(capsys, "run", str(path), "--config", str(CONFIGS / "bus16.toml"))
    assert code == 2
    assert err == "vta: error: --config does not apply to a saved program (.npz): it carries its own config\n"


def test_run_deadlocking_program_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from vta.program import ProgramBuilder
    builder = ProgramBuilder(VTAConfig())
    builder.emit(Gemm(pop_prev=True))  # waits for a load->compute token nobody pushes
    path = tmp_path / "dead.npz"
    builder.finish().save(path)
    code, out, err = run(capsys, "run", str(path))
    assert (code, out) == (1, "")
    assert err == ("vta: error: the program deadlocks: compute module: instruction 0 (GEMM) waits for a "
                   "load->compute token (pop_prev)\n")


@pytest.mark.slow
def test_run_gemm_tsim(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "run", "--target", "tsim", "--m", "32", "--k", "32", "--n", "32", "--json")
    assert code == 0
    report = json.loads(out)
    assert (report["backend"], report["correct"]) == ("tsim", True)
    assert report["cycles"] == report["counters"]["cycles"] > 0
    assert report["summary"]["mac_utilization"] == round(32 ** 3 / (report["cycles"] * 256), 4)
    assert report["counters"]["gemm_uops"] == report["stats"]["gemm_uops"]


def test_run_wrong_result_exit_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import vta.backend
    from vta.backend import RunResult

    class Broken(vta.backend.Backend):
        name = "broken"

        def run(self, program: Any, **options: Any) -> RunResult:
            return RunResult("broken", program.dram.copy(), {"gemm_uops": 1}, 100, {"cycles": 100})  # C stays zero

    monkeypatch.setattr(vta.backend, "get_backend", lambda name: Broken())
    code, out, err = run(capsys, "run", "--m", "16", "--k", "16", "--n", "16")
    assert code == 1
    assert out.splitlines()[1:3] == ["  result                       WRONG (differs from numpy)",
                                     "  cycles                       100"]
    assert "  mac_utilization              16.0%" in out.splitlines()  # 4096 MACs / (100 cycles x 256)
    from vta.clock import design_clock
    from vta.config import VTAConfig
    clock = design_clock(VTAConfig())  # 100 cycles at the design's clock (the clock model's)
    assert f"  time_us                      {100 / clock.mhz:.3f}" in out.splitlines()
    assert f"  clock_source                 {clock.source}" in out.splitlines()
    assert err == "vta: ERROR: the GEMM output differs from the numpy reference\n"


def test_run_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "run", "--m", "0")
    assert code == 2 and err == "vta: error: --m must be a positive number of elements, not 0\n"
    code, _, err = run(capsys, "run", "--target", "npu")
    assert code == 2 and "argument --target: invalid choice: 'npu'" in err


def test_run_gemm_cpu_is_the_same_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    """`vta run --target cpu` without a model runs the GEMM benchmark too: the same A, B and shift as the program
    fsim runs, as one QDense operator, checked against the same numpy reference."""
    code, out, err = run(capsys, "run", "--target", "cpu", "--m", "20", "--k", "40", "--n", "24", "--json")
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["workload"], report["backend"], report["correct"]) == ("gemm 20x40x24", "cpu", True)
    assert (report["instructions"], report["cycles"], report["stats"]) == (None, None, {})
    from vta.gemm import gemm_program
    from vta.isa import ALU_SHR, Alu
    program, _ = gemm_program(VTAConfig(), 20, 40, 24)
    shift = next(i.imm for i in program.insns if isinstance(i, Alu) and i.alu_opcode == ALU_SHR)
    assert (report["summary"]["useful_macs"], report["summary"]["shift"]) == (20 * 40 * 24, shift)
    assert report["summary"]["wall_time_us"] > 0
    code, out, _ = run(capsys, "run", "--target", "cpu", "--m", "16", "--k", "16", "--n", "16")
    assert code == 0
    assert out.splitlines()[:3] == [
        "gemm 16x16x16 on cpu (1x16_i8w8a32_15_15_18_17, one graph operator, no accelerator program)",
        "  result                       correct (matches numpy)",
        "  cycles                       n/a (this backend does not count cycles)"]


def test_run_gemm_cpu_wrong_result_exit_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from vta.compiler.kernels.cpu_backend import CpuBackend
    monkeypatch.setattr(CpuBackend, "run_node", lambda self, graph, node, values: np.zeros((16, 16), np.int8))
    code, out, err = run(capsys, "run", "--target", "cpu", "--m", "16", "--k", "16", "--n", "16")
    assert code == 1
    assert out.splitlines()[1] == "  result                       WRONG (differs from numpy)"
    assert err == "vta: ERROR: the GEMM output differs from the numpy reference\n"


def test_run_model_without_compiler(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vta.compiler.cli", None)  # makes `import vta.compiler.cli` fail
    code, _, err = run(capsys, "run", "resnet18")
    assert code == 1
    assert err.startswith("vta: error: running a model (resnet18) needs vta.compiler.cli.run_model, which is not "
                          "available (")


def test_run_model_delegates(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def add_run_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--flavour", default="plain")

    def run_model(args: argparse.Namespace) -> int:
        calls.append((args.model, args.target, args.flavour))
        return 3

    fake = types.ModuleType("vta.compiler.cli")
    fake.add_run_arguments = add_run_arguments  # type: ignore[attr-defined]
    fake.run_model = run_model  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vta.compiler.cli", fake)
    assert run(capsys, "run", "m.onnx", "--target", "cpu", "--flavour", "spicy")[0] == 3
    assert calls == [("m.onnx", "cpu", "spicy")]


# ---- plug-in groups -------------------------------------------------------------------------------------------------
def test_plugin_group_registers_and_dispatches(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def register(subparsers: object) -> None:
        parser = subparsers.add_parser("hw", help="hardware")  # type: ignore[attr-defined]
        parser.add_argument("what")
        parser.set_defaults(func=lambda args: print(f"hw {args.what}"))

    fake = types.ModuleType("vta.hw.cli")
    fake.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vta.hw.cli", fake)
    assert run(capsys, "hw", "verilog")[:2] == (0, "hw verilog\n")
    code, out, _ = run(capsys, "--help")
    assert "    hw " in out


def test_missing_plugin_group_is_absent(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vta.tsim.cli", None)
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "    tsim " not in out
    code, _, err = run(capsys, "tsim", "build")
    assert code == 2 and "argument COMMAND: invalid choice: 'tsim'" in err


def test_plugin_with_missing_dependency(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import vta.cli

    def import_module(name: str) -> types.ModuleType:
        raise ModuleNotFoundError("No module named 'amaranth'", name="amaranth")

    monkeypatch.setattr(vta.cli.importlib, "import_module", import_module)
    code, _, err = run(capsys, "hw", "verilog")
    assert code == 2
    assert err == "vta: error: the `vta hw` commands cannot start: No module named 'amaranth'\n"


def test_library_domain_error_exit_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    class SimulationError(Exception):
        pass

    SimulationError.__module__ = "vta.fsim"

    def register(subparsers: object) -> None:
        parser = subparsers.add_parser("hw")  # type: ignore[attr-defined]
        parser.set_defaults(func=lambda args: (_ for _ in ()).throw(SimulationError("deadlock at instruction 3")))

    fake = types.ModuleType("vta.hw.cli")
    fake.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vta.hw.cli", fake)
    assert run(capsys, "hw") == (1, "", "vta: error: deadlock at instruction 3\n")


# ---- a real process -------------------------------------------------------------------------------------------------
def test_subprocess_config_show_imports_nothing_heavy() -> None:
    code = ("import sys\n"
            "from vta.cli import main\n"
            "assert main(['config', 'show']) == 0\n"
            "assert main(['--help']) == 0\n"
            "heavy = sorted(m for m in sys.modules\n"
            "               if m.split('.')[0] in ('amaranth', 'onnx', 'llvmlite', 'onnxruntime'))\n"
            "print('HEAVY', heavy)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


def test_subprocess_python_m_vta_exit_codes(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("LOG_BLOCK = 9\n")
    proc = subprocess.run([sys.executable, "-m", "vta", "config", "check", str(bad)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (f"vta: error: invalid VTA configuration in {bad} (1 problem):\n"
                           "  - LOG_BLOCK must be between 2 and 6, not 9\n")
    ok = subprocess.run([sys.executable, "-m", "vta", "config", "show", "--json"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["name"] == "1x16_i8w8a32_15_15_18_17"


def test_run_of_a_saved_program_prints_a_run_summary(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`vta run PROGRAM.npz --json` prints vta.backend.RunSummary's keys, the same as `vta tsim run --json`."""
    from vta.backend import RunSummary
    from vta.gemm import gemm_program
    path = tmp_path / "gemm.npz"
    gemm_program(VTAConfig(), 16, 16, 16, seed=0)[0].save(path)
    code, out, _ = run(capsys, "run", str(path), "--json")
    report = json.loads(out)
    assert code == 0 and list(report) == list(RunSummary("", "", "", None, None).to_dict())
    assert (report["workload"], report["backend"], report["layer"], report["trace"], report["check"]) == (
        f"program {path}", "fsim", None, None, "none")


def test_compile_options_come_from_the_arguments_with_the_dataclass_defaults() -> None:
    from vta.cli import build_parser
    from vta.compiler.cli import compile_options
    from vta.compiler.options import CompileOptions
    args = build_parser("run").parse_args(["run", "tiny_cnn", "--calib", "2", "--force-cpu", "a", "--input-shape",
                                           "x=1x3x8x8", "--no-progress"])
    options = compile_options(args)
    assert options == CompileOptions(force_cpu=("a",), input_shapes=(("x", (1, 3, 8, 8)),), calib=2)
    assert options.changed() == ["force_cpu", "input_shapes", "calib"]
    assert compile_options(build_parser("compile").parse_args(["compile", "m", "-o", "m.vtac"])) == CompileOptions(
        progress=True)


def test_the_zoo_decode_step_runs_on_the_accelerator_unless_a_policy_is_given(capsys: pytest.CaptureFixture) -> None:
    from vta.cli import build_parser
    from vta.compiler.cli import compile_options
    parse = build_parser("run").parse_args
    assert compile_options(parse(["run", "gpt2_decode"])).policy == "accel"
    assert "policy accel: the zoo's default for gpt2_decode" in capsys.readouterr().err
    assert compile_options(parse(["run", "gpt2_decode", "--policy", "auto"])).policy == "auto"
    assert compile_options(parse(["run", "gpt2_prefill"])).policy == "auto"
    assert compile_options(parse(["run", "some/gpt2_decode.onnx"])).policy == "auto"
    assert capsys.readouterr().err == ""


def test_compile_options_reject_unknown_keywords_and_values() -> None:
    from vta.compiler.options import CompileOptions
    from vta.compiler.pipeline import compile_model
    with pytest.raises(TypeError, match=r"^unknown compile option calb; the options are policy, force_cpu, "):
        compile_model("tiny_cnn", VTAConfig(), calb=2)
    with pytest.raises(ValueError, match=r"^policy='fast' is unknown; use one of auto, accel, cpu$"):
        CompileOptions(policy="fast")
    assert CompileOptions.build(CompileOptions(calib=2), policy="accel") == CompileOptions(policy="accel", calib=2)


def test_run_of_an_artefact_compiled_with_input_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A file with dynamic axes, compiled with --input-shape, then run from its .vtac: the accuracy step imports the
    float model at the shapes the artefact was compiled for (it asked for --input-shape, which a run of an
    artefact refuses)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((16, 16)) * 0.3).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "dyn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens", 16])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path, artefact = tmp_path / "dyn.onnx", tmp_path / "dyn.vtac"
    onnx.save(model, str(path))
    assert run(capsys, "compile", str(path), "--input-shape", "x=2x8x16", "-o", str(artefact), "--no-progress")[0] == 0
    code, out, err = run(capsys, "run", str(artefact), "--target", "fsim", "--no-progress")
    assert code == 0, err
    assert "matches_integer_reference: True" in out and "error against the float model (onnxruntime on" in out
