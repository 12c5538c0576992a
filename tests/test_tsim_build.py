"""Building and caching TSIM models (vta.tsim.build), DRAM comparison (vta.tsim.compare) and the `vta tsim` CLI."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tsim_standin import generate_standin

from vta.cli import main
from vta.config import VTAConfig
from vta.tsim.build import BuildError, _lz4_flags, _source_hash, build, cache_root
from vta.tsim.cli import parse_window
from vta.tsim.compare import DramMismatchError, Mismatch, assert_dram_equal, compare_dram, locate

CFG = VTAConfig()
SOURCES = [Path(__file__).with_name("tsim_standin.py")]


# ---- cache keys and errors (no compiler run) -------------------------------------------------------------------------
def test_the_cache_key_follows_sources_config_and_trace(tmp_path: Path) -> None:
    src = tmp_path / "rtl.py"
    src.write_text("a = 1\n")
    first = _source_hash(CFG, [src], "none")
    assert _source_hash(CFG, [src], "none") == first
    assert _source_hash(CFG, [src], "vcd") != first
    assert _source_hash(CFG.replace(dram_latency=17), [src], "none") != first
    src.write_text("a = 2\n")
    assert _source_hash(CFG, [src], "none") != first
    assert len(first) == 16


def test_cache_root_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path / "tsim"
    monkeypatch.delenv("VTA_CACHE_DIR")
    assert cache_root() == Path("~/.cache/vta-lab/tsim").expanduser()


def test_bad_build_arguments() -> None:
    with pytest.raises(TypeError, match=r"cfg must be a VTAConfig, not dict"):
        build({})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"trace must be one of none, vcd, fst, not 'gif'"):
        build(CFG, trace="gif")
    with pytest.raises(ValueError, match=r"a custom generator needs sources="):
        build(CFG, generator=generate_standin)


def test_a_failing_generator_is_a_build_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))

    def broken(cfg: VTAConfig, out: Path) -> Path:
        raise RuntimeError("no RTL today")

    with pytest.raises(BuildError, match=r"generating Verilog for config 1x16_i8w8a32_15_15_18_17 failed: "
                                         r"RuntimeError: no RTL today"):
        build(CFG, generator=broken, sources=SOURCES, progress=False)
    assert [p.name for p in (tmp_path / "tsim").iterdir() if not p.name.endswith(".lock")] == []


def test_bad_verilog_is_a_build_error_with_the_compiler_output(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))

    def bad_verilog(cfg: VTAConfig, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        (out / "vta_core.v").write_text("module vta_core(input clk);\n  wire x = ;\nendmodule\n")
        return out / "vta_core.v"

    with pytest.raises(BuildError, match=r"Verilator failed on the Verilog for config 1x16_i8w8a32_15_15_18_17 "
                                         r"\(exit status \d+\)") as info:
        build(CFG, generator=bad_verilog, sources=SOURCES, progress=False)
    assert "%Error" in info.value.output and "%Error" in str(info.value)
    assert not any(p.is_dir() for p in (tmp_path / "tsim").iterdir()), "no half-built folder is left behind"


@pytest.mark.skipif(_lz4_flags() is not None, reason="LZ4 is installed, so FST builds work")
def test_fst_without_lz4_names_the_fix() -> None:
    with pytest.raises(BuildError, match=r"FST traces need the LZ4 library \(Debian package liblz4-1, or "
                                         r"liblz4-dev\).*VCD"):
        build(CFG, trace="fst", generator=generate_standin, sources=SOURCES)


# ---- cache behaviour (stand-in builds) -------------------------------------------------------------------------------
def test_a_second_build_is_a_cache_hit() -> None:
    first = build(CFG, generator=generate_standin, sources=SOURCES, progress=False)
    second = build(CFG, generator=generate_standin, sources=SOURCES, progress=False)
    assert second.compiled is False
    assert second.library == first.library and second.library.is_file()
    assert second.verilog.read_text().startswith("\nmodule vta_core")
    manifest = json.loads((second.directory / "manifest.json").read_text())
    assert manifest["key"] == second.key and manifest["config"]["BUS_BYTES"] == 8


_CONCURRENT = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from tsim_standin import generate_standin
from vta.config import VTAConfig
from vta.tsim.build import build
b = build(VTAConfig(dram_latency=9), generator=generate_standin, sources=[Path({src!r})], progress=False)
print(b.compiled, b.library)
"""


@pytest.mark.slow
def test_two_processes_building_the_same_design_share_one_build(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    code = _CONCURRENT.format(tests=str(Path(__file__).parent), src=str(SOURCES[0]))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    results = [out.split() for out, _ in outs]
    assert sorted(r[0] for r in results) == ["False", "True"], "exactly one process compiled"
    assert results[0][1] == results[1][1]


# ---- compare ---------------------------------------------------------------------------------------------------------
def test_compare_dram_finds_the_first_difference() -> None:
    a = np.arange(64, dtype=np.uint8)
    b = a.copy()
    assert compare_dram(a, b) is None
    b[[9, 40]] = [200, 0]
    mismatch = compare_dram(a, b)
    assert mismatch == Mismatch(address=9, expected=9, actual=200, count=2)
    assert str(mismatch) == "DRAM differs at byte address 0x9: expected 0x09, got 0xc8 (2 differing bytes in all)"
    with pytest.raises(DramMismatchError, match=r"^gemm: DRAM differs at byte address 0x9") as info:
        assert_dram_equal(a, b, "gemm")
    assert info.value.mismatch.address == 9


def test_compare_dram_rejects_bad_images() -> None:
    with pytest.raises(ValueError, match=r"DRAM images differ in size: expected 4 bytes, actual 5 bytes"):
        compare_dram(np.zeros(4, np.uint8), np.zeros(5, np.uint8))
    with pytest.raises(TypeError, match=r"actual must be a uint8 array \(a DRAM image\), not int32"):
        compare_dram(np.zeros(4, np.uint8), np.zeros(4, np.int32))
    with pytest.raises(TypeError, match=r"expected must be a numpy array, not bytes"):
        compare_dram(b"abcd", np.zeros(4, np.uint8))  # type: ignore[arg-type]


def test_locate_names_the_allocation() -> None:
    class Alloc:
        def __init__(self, offset: int, nbytes: int) -> None:
            self.offset, self.nbytes = offset, nbytes

    allocs = {"inp": Alloc(0, 64), "out": Alloc(64, 32)}
    assert locate(70, allocs) == "allocation 'out' + 6"
    assert locate(0, allocs) == "allocation 'inp' + 0"
    assert locate(96, allocs) == "outside every allocation"


# ---- CLI -------------------------------------------------------------------------------------------------------------
def test_parse_window() -> None:
    assert parse_window("10:20") == (10, 20)
    with pytest.raises(Exception, match=r"a trace window needs 0 <= FIRST < END, not '5:5'"):
        parse_window("5:5")
    with pytest.raises(Exception, match=r"a trace window is FIRST:END in cycles, e.g. 100:200, not 'x'"):
        parse_window("x")


def test_cli_cache_lists_and_clears(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    (tmp_path / "tsim" / "cfgA-fast-0123").mkdir(parents=True)
    (tmp_path / "tsim" / "cfgA-fast-0123" / "libtsim.so").write_bytes(b"x" * 1000)
    assert main(["tsim", "cache"]) == 0
    out = capsys.readouterr().out
    assert "cfgA-fast-0123  0.0 MB" in out and "1 cached builds in" in out
    assert main(["tsim", "cache", "--clear"]) == 0
    assert "removed 1 cached builds" in capsys.readouterr().out
    assert not (tmp_path / "tsim" / "cfgA-fast-0123").exists()


def test_cli_run_needs_an_existing_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tsim", "run", "/nonexistent/program.npz"]) == 2
    assert "cannot read /nonexistent/program.npz: no such file" in capsys.readouterr().err
