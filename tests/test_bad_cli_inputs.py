"""Bad input on the command line: every case is refused with one message naming the file or option (exit 2), or the
option given is used; none is silently ignored, none ends in a traceback. Argument-level and fsim only (no builds)."""
from __future__ import annotations

import io
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from vta.cli import main
from vta.config import ConfigError, VTAConfig, load_config
from vta.energy import TechError, load_tech
from vta.textfile import TextFileError, read_stream

DEEP_JSON = "[" * 100_000 + "]" * 100_000
DEEP_TOML = "LOG_BLOCK = " + "[" * 3000 + "]" * 3000 + "\n"
DEEP_INLINE_TOML = "a = " + "{b = " * 3000 + "1" + "}" * 3000 + "\n"
TOO_DEEP = "the file is nested too deeply (arrays or tables inside one another beyond what the parser can follow)"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def config_error(path: Path, problem: str) -> str:
    return f"vta: error: invalid VTA configuration in {path} (1 problem):\n  - {problem}\n"


# ---- nesting too deep for the parsers -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, text", [("deep.json", DEEP_JSON), ("deepobj.json", '{"a":' * 100_000 + "1"
                                         + "}" * 100_000), ("deep.toml", DEEP_TOML),
                                        ("deepinline.toml", DEEP_INLINE_TOML)])
def test_a_config_nested_too_deeply_is_refused_naming_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                               name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert run(capsys, "config", "check", str(path)) == (2, "", config_error(path, TOO_DEEP))


@pytest.mark.parametrize("argv", [("run", "--m", "16", "--k", "16", "--n", "16"), ("disasm", "--raw", "x.bin"),
                                  ("tsim", "build"), ("asm", "x.s", "-o", "x.bin"), ("config", "show")])
def test_every_command_with_a_config_refuses_a_deep_one(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                        argv: tuple[str, ...]) -> None:
    path = tmp_path / "deep.json"
    path.write_text(DEEP_JSON)
    assert run(capsys, *argv, "--config", str(path)) == (2, "", config_error(path, TOO_DEEP))


def test_a_value_nested_almost_too_deeply_is_shown_short(tmp_path: Path) -> None:
    path = tmp_path / "nested.json"
    path.write_text('{"LOG_BLOCK": ' + "[" * 900 + "]" * 900 + ', "CLOCK_MHZ": "' + "x" * 500 + '"}')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == ["LOG_BLOCK must be an integer, not [[[[...]]]]",
                                   "CLOCK_MHZ must be a number, not '" + "x" * 27 + "..." + "x" * 28 + "'"]


@pytest.mark.parametrize("text", [DEEP_TOML, DEEP_INLINE_TOML])
def test_a_tech_file_nested_too_deeply_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep_tech.toml"
    path.write_text(text)
    with pytest.raises(TechError) as info:
        load_tech(path)
    assert str(info.value) == f"invalid technology file {path} (1 problem):\n  - {TOO_DEEP}"


# ---- keys that would be dropped -------------------------------------------------------------------------------------
def test_toml_keys_beside_a_vta_table_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "mixed.toml"
    path.write_text("LOG_BLOCK = 3\nBUS_BYTES = 16\n[vta]\nLOG_BATCH = 1\n")
    assert run(capsys, "config", "check", str(path)) == (2, "", config_error(
        path, "the keys LOG_BLOCK, BUS_BYTES outside the [vta] table would be ignored; put every key under [vta], "
              "or none"))
    path.write_text("[vta]\nLOG_BATCH = 1\n")  # the table alone, as configs/bus16.toml
    assert load_config(path) == VTAConfig(log_batch=1)


@pytest.mark.parametrize("data, problems", [
    ({"LOG_BLOCK_IN": 5, "LOG_BLOCK_OUT": 3},
     ["LOG_BLOCK_IN=5 and LOG_BLOCK_OUT=3 differ, but this GEMM core is square (BLOCK_IN = BLOCK_OUT = "
      "2**LOG_BLOCK); give one LOG_BLOCK instead"]),
    ({"LOG_BLOCK_IN": 5, "LOG_BLOCK_OUT": 5},
     ["LOG_BLOCK_IN=5 and LOG_BLOCK_OUT=5 disagree with LOG_BLOCK=4 (the default: the file gives no LOG_BLOCK), "
      "which alone sets the block (BLOCK_IN = BLOCK_OUT = 2**LOG_BLOCK); give LOG_BLOCK = 5 instead"]),
    ({"LOG_BLOCK": 3, "LOG_BLOCK_IN": 5},
     ["LOG_BLOCK_IN=5 disagrees with LOG_BLOCK=3, which alone sets the block (BLOCK_IN = BLOCK_OUT = "
      "2**LOG_BLOCK); make it equal or leave it out"]),
    ({"LOG_OUT_WIDTH": 4, "LOG_OUT_BUFF_SIZE": 3},
     ["LOG_OUT_WIDTH=4 disagrees with LOG_INP_WIDTH=3: the output width is the input width here; make it 3 or "
      "leave it out",
      "LOG_OUT_BUFF_SIZE=3 disagrees with the design: the output buffer is derived as LOG_ACC_BUFF_SIZE + "
      "LOG_INP_WIDTH - LOG_ACC_WIDTH = 15; make it 15 or leave it out"]),
])
def test_vta_keys_that_disagree_with_the_design_are_refused(tmp_path: Path, data: dict[str, int],
                                                            problems: list[str]) -> None:
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == problems


def test_vta_keys_that_agree_with_the_design_are_still_ignored(tmp_path: Path) -> None:
    path = tmp_path / "vta_config.json"
    path.write_text(json.dumps({"LOG_BLOCK": 5, "LOG_BLOCK_IN": 5, "LOG_BLOCK_OUT": 5, "LOG_INP_WIDTH": 2,
                                "LOG_OUT_WIDTH": 2, "LOG_ACC_BUFF_SIZE": 18, "LOG_OUT_BUFF_SIZE": 15}))
    assert load_config(path) == VTAConfig(log_block=5, log_inp_width=2, log_acc_buff_size=18)


@pytest.mark.parametrize("text, key", [('{"LOG_BLOCK": 5, "LOG_BLOCK": 3}', "LOG_BLOCK"),
                                       ('{"LOG_BATCH": 1, "x": {"a": 1, "a": 2}}', "a")])
def test_a_json_key_given_twice_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str,
                                           key: str) -> None:
    path = tmp_path / "dup.json"
    path.write_text(text)
    assert run(capsys, "config", "check", str(path)) == (2, "", config_error(
        path, f"the key {key!r} is given twice in one object; give each key once"))


# ---- files that are not UTF-8, or too large -------------------------------------------------------------------------
NOT_UTF8 = ("the file is not UTF-8 text: byte 0xff at position 16 cannot be decoded (invalid start byte); save it as "
            "UTF-8")


@pytest.mark.parametrize("name", ["bad.toml", "bad.json"])
def test_a_config_that_is_not_utf8_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"LOG_BLOCK = 3\n# \xff\n")
    assert run(capsys, "config", "check", str(path)) == (2, "", config_error(path, NOT_UTF8))


def test_a_tech_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "tech.toml"
    path.write_bytes(b"LOG_BLOCK = 3\n# \xff\n")
    with pytest.raises(TechError) as info:
        load_tech(path)
    assert info.value.problems == [NOT_UTF8]


def test_an_assembly_file_that_is_not_utf8_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bad.s"
    path.write_bytes(b"FINISH\nFINISH\n# \xff\n")
    assert run(capsys, "asm", str(path), "-o", str(tmp_path / "x.bin")) == (2, "", f"vta: error: {path}: {NOT_UTF8}\n")
    assert not (tmp_path / "x.bin").exists()


def test_a_config_larger_than_the_limit_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "huge.toml"
    path.write_text("LOG_BLOCK = 3\n" + "#" * (1 << 20) + "\n")
    assert run(capsys, "config", "check", str(path)) == (2, "", config_error(
        path, "the file holds more than 1,048,576 bytes, the most that is read; give a smaller one"))


def test_the_position_of_a_bad_byte_counts_across_chunks() -> None:
    data = b"a" * ((1 << 20) - 1) + "é".encode() + b"\xff"  # é split across the first 1 MiB chunk's end
    with pytest.raises(TextFileError) as info:
        read_stream(io.BytesIO(data), "in", limit=None)
    assert "byte 0xff at position 1048577 cannot be decoded" in str(info.value)


class Endless(io.RawIOBase):
    """A standard input that never ends: ``byte`` again and again; counts what was read."""

    def __init__(self, byte: bytes) -> None:
        self.byte, self.read_bytes = byte, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        assert size > 0, "read everything of an endless stream"
        self.read_bytes += size
        return self.byte * size


def test_asm_stops_an_endless_stream_of_invalid_bytes_at_the_first(capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    stdin = Endless(b"\xff")
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=stdin))
    assert run(capsys, "asm", "-", "-o", str(tmp_path / "x.bin")) == (2, "", (
        "vta: error: standard input: the input is not UTF-8 text: byte 0xff at position 0 cannot be decoded "
        "(invalid start byte); save it as UTF-8\n"))
    assert stdin.read_bytes <= 1 << 20


def test_asm_stops_an_endless_stream_at_its_documented_maximum(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import vta.asm
    assert vta.asm.MAX_SOURCE_BYTES == 64 << 20  # the documented maximum (vta asm --help, vta.asm)
    monkeypatch.setattr(vta.asm, "MAX_SOURCE_BYTES", 1000)
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=Endless(b"\n")))
    assert run(capsys, "asm", "-", "-o", str(tmp_path / "x.bin")) == (2, "", (
        "vta: error: standard input: the input holds more than 1,000 bytes, the most that is read; give a smaller "
        "one\n"))


def test_asm_reads_standard_input(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(b"FINISH\n")))
    code, out, _ = run(capsys, "asm", "-", "-o", str(tmp_path / "x.bin"))
    assert code == 0 and out.startswith(f"wrote {tmp_path / 'x.bin'} (1 instructions, 16 bytes")


# ---- asm: one file for two outputs ----------------------------------------------------------------------------------
def test_asm_refuses_one_file_for_instructions_and_micro_ops(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "k.s"
    src.write_text("UOP dst=0 src=0 wgt=0\nFINISH\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    code, out, err = run(capsys, "asm", str(src), "-o", "same.bin", "--uop-output", "sub/../same.bin")
    assert (code, out) == (2, "")
    assert err == ("vta: error: -o same.bin and --uop-output sub/../same.bin are the same file: the micro-ops would "
                   "overwrite the instructions; give two different files\n")
    assert not (tmp_path / "same.bin").exists()


# ---- run: --seed and --clock-mhz ------------------------------------------------------------------------------------
def test_run_names_a_negative_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "run", "--seed", "-1") == (2, "", "vta: error: --seed must be a non-negative integer, not -1\n")


class Timed:
    """fsim's result with 1000 cycles, as a backend that counts cycles would give."""

    name = "timed"

    def run(self, program: Any, **options: Any) -> Any:
        from vta.fsim_backend import FsimBackend
        result = FsimBackend().run(program)
        result.cycles = 1000
        return result


@pytest.fixture
def saved_program(tmp_path: Path) -> Path:
    from vta.gemm import gemm_program
    path = tmp_path / "p.npz"
    gemm_program(VTAConfig(), 16, 16, 16, seed=0, double_buffer=True)[0].save(path)
    return path


@pytest.mark.parametrize("workload", ["gemm", "program"])
def test_run_gives_the_time_at_clock_mhz(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                         saved_program: Path, workload: str) -> None:
    import vta.backend
    monkeypatch.setattr(vta.backend, "get_backend", lambda name, **options: Timed())
    what = ["--m", "16", "--k", "16", "--n", "16"] if workload == "gemm" else [str(saved_program)]
    code, out, _ = run(capsys, "run", *what, "--clock-mhz", "50", "--json")
    summary = json.loads(out)["summary"]
    assert code == 0
    assert (summary["time_us"], summary["clock_mhz"], summary["clock_source"]) == (20.0, 50.0, "user")


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-5", "0.5", "10001"])
@pytest.mark.parametrize("workload", ["gemm", "program", "model"])
def test_run_refuses_a_clock_outside_the_configs_range_before_any_work(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, saved_program: Path, value: str,
        workload: str) -> None:
    import vta.backend

    def no_work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no backend before the options are checked")

    monkeypatch.setattr(vta.backend, "get_backend", no_work)
    what = {"gemm": [], "program": [str(saved_program)], "model": ["no_such_model.onnx"]}[workload]
    code, out, err = run(capsys, "run", *what, "--clock-mhz", value)
    shown = f"{float(value):g}"
    assert (code, out, err) == (2, "", f"vta: error: --clock-mhz {shown}: the clock must be between 1 and 10000 MHz\n")


@pytest.mark.parametrize("workload", ["gemm", "program"])
def test_run_refuses_clock_mhz_on_a_backend_without_cycles(capsys: pytest.CaptureFixture[str],
                                                           saved_program: Path, workload: str) -> None:
    what = ["--m", "16", "--k", "16", "--n", "16"] if workload == "gemm" else [str(saved_program)]
    assert run(capsys, "run", *what, "--clock-mhz", "50") == (2, "", (
        "vta: error: --clock-mhz turns cycles into time, and the fsim backend counts no cycles; leave it out, or run "
        "on a backend that counts cycles (--target tsim)\n"))


# ---- tsim run --trace: no folders made ------------------------------------------------------------------------------
def test_tsim_run_refuses_a_trace_in_a_missing_folder(capsys: pytest.CaptureFixture[str], saved_program: Path,
                                                      tmp_path: Path) -> None:
    trace = tmp_path / "no" / "such" / "t.vcd"
    code, out, err = run(capsys, "tsim", "run", str(saved_program), "--trace", str(trace))
    assert (code, out) == (2, "")
    assert err == f"vta: error: --trace {trace}: the folder {trace.parent} does not exist; create it first\n"
    assert not (tmp_path / "no").exists()


def test_tsim_run_refuses_a_folder_as_the_trace(capsys: pytest.CaptureFixture[str], saved_program: Path,
                                                tmp_path: Path) -> None:
    trace = tmp_path / "t.vcd"
    trace.mkdir()
    code, _, err = run(capsys, "tsim", "run", str(saved_program), "--trace", str(trace))
    assert code == 2 and re.fullmatch(rf"vta: error: --trace {re.escape(str(trace))}: that is a folder; give a file "
                                      r"name\n", err)


def test_run_refuses_clock_mhz_on_an_operator_backend(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import vta.backend

    def no_work(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no backend for an option that is refused")

    monkeypatch.setattr(vta.backend, "get_backend", no_work)
    assert run(capsys, "run", "--m", "16", "--k", "16", "--n", "16", "--target", "cpu", "--clock-mhz", "50") == (
        2, "", "vta: error: --clock-mhz turns cycles into time, and the cpu backend counts no cycles (it runs the GEMM "
               "as one graph operator); leave it out, or run on a backend that counts cycles (--target tsim)\n")
