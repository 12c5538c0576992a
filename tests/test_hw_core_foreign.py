"""The whole-core cocotb testbench (tests/hw/tb_core.py) on a foreign core's top: the same programs, memory-port
driver with random backpressure and checks against fsim as tests/test_hw_core.py, on a core given as files and a top
module (what ``--rtl``/``--top`` take) instead of the generated ``vta_core``.

By default the core is the byo_core example (examples/byo_core: a hand-written wrapper with a register stage on
each memory channel around the generated core) at configs/small1x8.toml. To test your own core set
``VTA_TB_RTL`` (files or ``.f`` lists, separated by spaces), ``VTA_TB_TOP`` (its top module) and ``VTA_TB_CONFIG``
(the config file it was written for). Slow: one cocotb Verilator build of the whole core (minutes here).
"""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "hw"))

import cocotb_build  # noqa: E402
import numpy as np  # noqa: E402
from memport import PortTiming  # noqa: E402
from test_hw_core import directed_programs, run_cases  # noqa: E402

from vta.config import load_config  # noqa: E402
from vta.testing import random_program  # noqa: E402
from vta.tsim.byo import ForeignCore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _foreign_core(tmp_path_factory):
    """(config, ForeignCore) from VTA_TB_RTL/VTA_TB_TOP/VTA_TB_CONFIG, else the byo_core example at small1x8."""
    if os.environ.get("VTA_TB_RTL"):
        cfg = load_config(os.environ.get("VTA_TB_CONFIG") or ROOT / "configs" / "default.toml")
        return cfg, ForeignCore(os.environ["VTA_TB_RTL"].split(), top=os.environ.get("VTA_TB_TOP"))
    cfg = load_config(ROOT / "configs" / "small1x8.toml")
    spec = importlib.util.spec_from_file_location("byo_make_inner", ROOT / "examples" / "byo_core" / "make_inner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cfg, ForeignCore([module.make_inner(cfg, tmp_path_factory.mktemp("byo"))], top="byo_core")


def run_foreign_core(cfg, core, programs, tmp_path):
    """Verilate ``core`` (cached by its files' contents) under cocotb and run ``programs`` [(name, program, timing)]
    in one simulation; returns the measured counters by case."""
    core.check(cfg)  # the interface first: a clear error instead of a cocotb failure on a missing signal
    text = "".join(path.read_text() for path in core.files)
    bdir = cocotb_build.build_dir(f"foreign-{core.top}", cfg.name, text)
    runner = cocotb_build.build(core.compiled_files, core.top, bdir)
    return run_cases(runner, core.top, bdir, programs, tmp_path)


@pytest.mark.slow
def test_a_foreign_core_matches_fsim_under_the_whole_core_testbench(tmp_path_factory, tmp_path):
    cfg, core = _foreign_core(tmp_path_factory)
    programs = directed_programs(cfg)
    results = run_foreign_core(cfg, core, programs, tmp_path / "directed")
    assert len(results) == len(programs)
    # a random program may read buffer entries it never loaded (fsim's start from zeros): a fresh simulation
    random = random_program(cfg, np.random.default_rng(100), n_ops=24)
    results.update(run_foreign_core(cfg, core, [("random", random, PortTiming.stressed())], tmp_path / "random"))
    assert len(results) == len(programs) + 1
    assert all(r["counters"]["cycles"] > 0 for r in results.values())
