"""The backend interface: lookup by name, the fsim backend, lazy loading of tsim."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from vta import fsim
from vta.backend import Backend, FsimBackend, RunResult, available_backends, get_backend, register_backend
from vta.gemm import gemm_program


def test_available_backends():
    assert {"fsim", "tsim"} <= set(available_backends())
    assert available_backends() == sorted(available_backends())


def test_unknown_backend_lists_known_ones():
    with pytest.raises(ValueError, match=r"^unknown backend 'fpga'; known backends are fsim, tsim"):
        get_backend("fpga")


def test_fsim_backend_runs_a_program(small_cfg):
    prog, expected = gemm_program(small_cfg, 6, 10, 9)
    backend = get_backend("fsim")
    assert isinstance(backend, FsimBackend) and backend.name == "fsim"
    result = backend.run(prog)
    assert isinstance(result, RunResult)
    assert result.backend == "fsim"
    assert result.cycles is None and result.counters is None
    assert np.array_equal(result.read(prog, "C"), expected)
    assert result.stats == fsim.run(prog).stats.as_dict()
    assert result.stats["macs"] == fsim.run(prog).stats.macs > 0


def test_fsim_backend_options(small_cfg):
    prog, _ = gemm_program(small_cfg, 4, 4, 4)
    with pytest.raises(fsim.RunawayError, match=r"^more than max_insns=2 instructions"):
        get_backend("fsim", max_insns=2).run(prog)
    with pytest.raises(fsim.RunawayError):
        get_backend("fsim").run(prog, max_insns=1)
    with pytest.raises(TypeError, match=r"^the fsim backend takes only the options max_insns, check_races, not "
                       r"trace$"):
        get_backend("fsim").run(prog, trace=True)
    assert get_backend("fsim", check_races=False).run(prog).stats == get_backend("fsim").run(prog).stats


def test_register_backend(small_cfg):
    class Echo(Backend):
        name = "echo"

        def run(self, program, **options):
            return RunResult(self.name, program.dram.copy(), {}, 0, None)

    register_backend("echo", Echo)
    try:
        prog, _ = gemm_program(small_cfg, 4, 4, 4)
        assert get_backend("echo").run(prog).cycles == 0
        assert "echo" in available_backends()
    finally:
        from vta import backend as module
        module._FACTORIES.pop("echo")
    with pytest.raises(TypeError, match=r"^a backend factory must be callable, not 3$"):
        register_backend("x", 3)


def test_importing_backend_loads_no_simulator():
    code = "import sys, vta.backend; print('vta.tsim.backend' in sys.modules, 'vta.fsim' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
