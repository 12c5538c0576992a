"""The tutorials of docs/tutorials/ run here, so they never rot: each one's main() in a fresh folder (they write to
build/tutorials/ under the current folder), with its printed text and its returned values checked against the
numpy reference, the functional simulator and the files it says it wrote. Small models by default (the tutorials
take --model; tutorial 3 is about ResNet-18, run on the RTL under -m slow)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from vta.asm import assemble
from vta.compiler.report import load_report
from vta.program import Program

TUTORIALS = Path(__file__).resolve().parents[1] / "docs" / "tutorials"
PNG = b"\x89PNG\r\n\x1a\n"


def tutorial(name: str) -> ModuleType:
    """Import docs/tutorials/<name>.py as a module (the file names start with digits)."""
    spec = importlib.util.spec_from_file_location(f"tutorial_{name}", TUTORIALS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_every_tutorial_is_tested() -> None:
    scripts = sorted(p.stem for p in TUTORIALS.glob("[0-9][0-9]_*.py"))
    assert scripts == ["01_getting_started", "02_low_level_api", "03_compile_a_model", "04_rtl", "05_codesign"]
    source = Path(__file__).read_text()
    assert all(f'tutorial("{name}")' in source for name in scripts)


def test_01_getting_started(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = tutorial("01_getting_started").main([])
    out = capsys.readouterr().out
    m, n = r["expected"].shape
    assert np.array_equal(r["c_fsim"], r["expected"]) and np.array_equal(r["c_tsim"], r["expected"])
    fsim, tsim, program = r["fsim"], r["tsim"], r["program"]
    assert fsim.stats["macs"] == 4 * 64 * 32                       # m * k * n: one tile, no padding
    assert fsim.stats["gemm_uops"] == 4 * 2 * (4 + 1)              # rows x N blocks x (K blocks + the reset)
    assert tsim.stats == fsim.stats                                # the RTL's counters agree with the spec
    assert tsim.cycles == tsim.counters["cycles"] > 0
    assert tsim.counters["fetch_insns"] == len(program.insns)
    for module in ("fetch", "load", "compute", "store"):
        spent = sum(tsim.counters[f"{module}_{c}"] for c in ("busy", "wait_token", "wait_mem"))
        assert 0 < spent <= tsim.cycles
    assert f"tsim: result equals numpy; {tsim.cycles} cycles" in out
    assert (m, n) == (4, 32)


def test_01_runs_as_a_script_without_the_rtl(workdir: Path) -> None:
    done = subprocess.run([sys.executable, str(TUTORIALS / "01_getting_started.py"), "--no-rtl"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fsim: result equals numpy; 40 GEMM micro-ops, 8192 MACs" in done.stdout and "tsim" not in done.stdout


def test_02_low_level_api(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = tutorial("02_low_level_api").main([])
    out = capsys.readouterr().out
    single, double = r["tsim"][1], r["tsim"][2]
    for slots in (1, 2):
        assert r["tsim"][slots].stats == r["fsim"][slots].stats
        assert r["fsim"][slots].stats["compute_to_load_pushes"] == r["fsim"][slots].stats["compute_to_load_pops"]
    assert double.cycles < single.cycles                          # double buffering hides load time
    assert double.counters["load_wait_token"] < single.counters["load_wait_token"]
    assert f"double buffering: {single.cycles} -> {double.cycles} cycles" in out
    saved = Program.load(workdir / r["path"])
    assert saved.insns == r["programs"][2].insns
    assert assemble(r["text"], saved.cfg) == saved.insns           # the disassembly reads back
    assert f"wrote {r['path']}" in out


def test_03_compile_a_model(workdir: Path, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTA_TUTORIAL_MODEL", "mini_resnet")       # the text's model is ResNet-18 (see the slow test)
    r = tutorial("03_compile_a_model").main([])
    out = capsys.readouterr().out
    _check_model_tutorial(r, out, workdir, "mini_resnet", "fsim")


@pytest.mark.slow
def test_03_resnet18_on_the_rtl(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = tutorial("03_compile_a_model").main(["--model", "resnet18", "--target", "tsim"])
    out = capsys.readouterr().out
    _check_model_tutorial(r, out, workdir, "resnet18", "tsim")
    accel = [row for row in r["report"].rows if row["where"] == "accel"]
    assert all(row["cycles"] and row["cycles"] > 0 for row in accel)


def _check_model_tutorial(r: dict, out: str, workdir: Path, model: str, target: str) -> None:
    compiled, report = r["compiled"], r["report"]
    assert r["exact"] is True and f"ran on {target}: output equals the integer reference: True" in out
    assert compiled.accel_steps > 0
    assert [row["layer"] for row in report.rows] == [s.node.name for s in compiled.steps]
    assert sum(row["where"] == "accel" for row in report.rows) == compiled.accel_steps
    for path in r["files"].values():
        assert f"wrote {path}" in out and (workdir / path).stat().st_size > 0
    assert (workdir / r["files"]["plot"]).read_bytes()[:8] == PNG
    saved = load_report(workdir / r["files"]["json"])
    assert saved.totals["macs"] == report.totals["macs"] > 0
    assert json.loads((workdir / r["files"]["json"]).read_text())["model"] == model
    step = next(s for s in compiled.steps if s.node.name == r["layer"])
    assert assemble(r["text"], compiled.cfg) == step.program.insns
    assert (workdir / r["vtac"]).is_file() and f"wrote {r['vtac']}" in out


def test_04_rtl(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = tutorial("04_rtl").main([])
    out = capsys.readouterr().out
    verilog = r["verilog"]
    assert verilog["cfg"].name == "1x8_i8w8a32_15_14_16_16" and verilog["lint_returncode"] == 0
    assert "vta_core" in verilog["modules"] and (workdir / verilog["verilog"]).stat().st_size > 0
    assert "verilator --lint-only -Wall: clean" in out
    cocotb = r["cocotb"]
    assert cocotb["failures"] == 0 and 'name="token_queue"' in cocotb["xml"]
    assert "cocotb: tb_token_queue on TokenQueue(depth=4): passed" in out
    wave = r["waveform"]
    text = (workdir / wave["wave"]).read_text(errors="replace")
    assert "$enddefinitions" in text and " clk $end" in text
    assert wave["cycles"] > 0 and wave["signals"] > 100 and wave["changes"] > wave["cycles"]
    assert wave["result"].counters["cycles"] == wave["cycles"]


def test_05_codesign(workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VTA_TUTORIAL_MODEL", "tiny_cnn")
    r = tutorial("05_codesign").main([])
    out = capsys.readouterr().out
    a, b = r["a"], r["b"]
    assert a.config == "1x16_i8w8a32_15_15_18_17" and b.config == "1x16_i8w8a32_15_15_18_17_bus16"
    ratios = [row["cycles_ratio"] for row in r["compare"] if row["cycles_ratio"] is not None]
    assert ratios and all(x <= 1 for x in ratios)                 # a wider bus never costs cycles here
    for path in r["paths"]:
        assert load_report(workdir / path).model == "tiny_cnn"
    assert r["summary"].ok == 9 and r["summary"].failed == 0 and len(r["results"]) == 9
    front = r["front"]
    assert front and {row["design"] for row in front} <= {row["design"] for row in r["results"]}
    best = max(r["results"], key=lambda row: row["inferences_per_s"])
    assert best["design"] in {row["design"] for row in front}      # the fastest design is on the frontier
    for path in r["plots"]:
        assert Path(path).read_bytes()[:8] == PNG and f"wrote {path}" in out


def test_the_readme_quick_start_links_every_tutorial() -> None:
    import re
    readme = (TUTORIALS.parents[1] / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## Install")]
    links = re.findall(r"\]\((docs/tutorials/[^)]+)\)", quick)
    scripts = sorted(p.name for p in TUTORIALS.glob("[0-9][0-9]_*.py"))
    assert sorted(Path(link).name for link in links if link.endswith(".py")) == scripts
    assert all((TUTORIALS.parents[1] / link).is_file() for link in links)
    index = (TUTORIALS / "README.md").read_text()
    assert all(f"]({name})" in index for name in scripts)
