"""The backend interface: lookup by name, the fsim backend, lazy loading of tsim."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vta import fsim
from vta.backend import (
    BACKENDS,
    Backend,
    FallbackChoice,
    FallbackError,
    RunResult,
    RunSummary,
    UnsupportedWorkError,
    available_backends,
    backend_info,
    choose_fallback,
    get_backend,
    operator_backends,
    program_backends,
    register_backend,
    unregister_backend,
)
from vta.clock import design_clock
from vta.config import VTAConfig
from vta.fsim_backend import FsimBackend
from vta.gemm import gemm_program


def test_available_backends():
    assert available_backends() == ["cpu", "fsim", "gpu", "tsim"]
    assert program_backends() == ["fsim", "tsim"]
    assert operator_backends() == ["cpu", "gpu"]
    assert list(BACKENDS) == ["fsim", "tsim", "cpu", "gpu"]
    assert all(info.summary for info in BACKENDS.values())


def test_unknown_backend_lists_known_ones():
    with pytest.raises(ValueError, match=r"^unknown backend 'fpga'; known backends are cpu, fsim, gpu, tsim$"):
        get_backend("fpga")
    with pytest.raises(ValueError, match=r"^unknown backend 'fpga'; known backends are cpu, fsim, gpu, tsim$"):
        backend_info("fpga")


def test_each_registered_backend_loads_from_its_module():
    for name, info in BACKENDS.items():
        cls = info.load()
        assert issubclass(cls, Backend) and cls.name == name
        assert (cls.runs_programs, cls.runs_operators) == (info.runs_programs, info.runs_operators)


def test_work_of_the_wrong_kind_is_refused(small_cfg):
    prog, _ = gemm_program(small_cfg, 4, 4, 4)
    with pytest.raises(UnsupportedWorkError, match=r"^the cpu backend runs graph operators, not accelerator "
                       r"programs; program backends are fsim, tsim$"):
        get_backend("cpu").run(prog)
    with pytest.raises(UnsupportedWorkError, match=r"^the fsim backend runs accelerator programs, not graph "
                       r"operators; operator backends are cpu, gpu$"):
        get_backend("fsim").run_node(None, None, {})
    with pytest.raises(TypeError, match=r"^the cpu backend takes no options, not trace$"):
        get_backend("cpu", trace=True)


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
    with pytest.raises(TypeError, match=r"^the fsim backend takes only the options max_insns, max_uops, check_races, "
                       r"not trace$"):
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
        assert "echo" in available_backends() and "echo" in program_backends()
    finally:
        unregister_backend("echo")
    assert "echo" not in available_backends()
    with pytest.raises(TypeError, match=r"^a backend factory must be callable, not 3$"):
        register_backend("x", 3)
    with pytest.raises(ValueError, match=r"^'fsim' is a built-in backend and cannot be replaced; choose another "
                       r"name$"):
        register_backend("fsim", Echo)
    with pytest.raises(ValueError, match=r"^'cpu' is a built-in backend and cannot be removed$"):
        unregister_backend("cpu")


def test_importing_backend_loads_no_simulator():
    code = ("import sys, vta.backend; print('vta.tsim.backend' in sys.modules, 'vta.fsim' in sys.modules, "
            "'vta.compiler' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False"]


def test_the_cpu_fallback_needs_no_probe():
    assert choose_fallback("fsim") == FallbackChoice("cpu")
    assert choose_fallback("tsim", "cpu") == FallbackChoice("cpu")


def test_fallback_choices_that_do_not_go_with_the_target_are_refused():
    with pytest.raises(FallbackError, match=r"^--emulate-gpu runs the GPU kernels in the SIMT emulator; it goes with "
                                            r"--fallback gpu or --target gpu, not with the cpu fallback$"):
        choose_fallback("fsim", "cpu", emulate_gpu=True)
    with pytest.raises(FallbackError, match=r"^--fallback gpu chooses where an accelerator target's other layers run "
                                            r"\(fsim, tsim\); --target cpu runs every layer itself$"):
        choose_fallback("cpu", "gpu")
    with pytest.raises(FallbackError, match=r"^--fallback tpu is unknown; use one of cpu, gpu, auto$"):
        choose_fallback("fsim", "tpu")


def test_auto_and_gpu_follow_the_probe(monkeypatch):
    monkeypatch.setattr("vta.compiler.kernels.gpu_backend.device_reason", lambda: "no CUDA device: none here")
    assert choose_fallback("fsim", "auto") == FallbackChoice("cpu", None, "cpu (auto: no CUDA device: none here)")
    with pytest.raises(FallbackError, match=r"^--fallback gpu: no CUDA device: none here; nothing was run\."):
        choose_fallback("fsim", "gpu")
    with pytest.raises(FallbackError, match=r"^--target gpu: no CUDA device: none here; nothing was run\."):
        choose_fallback("gpu")
    emulated = choose_fallback("fsim", "gpu", emulate_gpu=True)
    assert emulated.fallback.emulated is True and emulated.target_options is None
    assert choose_fallback("gpu", emulate_gpu=True) == FallbackChoice(
        "cpu", {"emulate": True}, "gpu kernels in the SIMT emulator on the CPU (--emulate-gpu)")
    monkeypatch.setattr("vta.compiler.kernels.gpu_backend.device_reason", lambda: None)
    assert choose_fallback("fsim", "auto") == FallbackChoice("gpu", None, "gpu (auto: a CUDA device)")
    assert choose_fallback("fsim", "gpu") == FallbackChoice("gpu", None, "gpu (a CUDA device)")


def test_a_run_summary_has_the_same_keys_for_every_backend():
    cfg = VTAConfig()
    program, _ = gemm_program(cfg, 16, 16, 16, seed=0)
    result = RunResult("tsim", program.dram.copy(), {"macs": 4096, "gemm_uops": 16}, cycles=292,
                       counters={"cycles": 292})
    summary = RunSummary.of("program p.npz", program, result, layer="conv1")
    clock = design_clock(cfg)  # the design's own clock (the clock model's for the default design)
    assert summary.to_dict() == {
        "workload": "program p.npz", "backend": "tsim", "config": cfg.name, "instructions": len(program.insns),
        "cycles": 292, "correct": None, "summary": {"macs_issued": 4096, "mac_utilization": 0.0548,
                                                     "time_us": round(292 / clock.mhz, 3), "clock_mhz": clock.mhz,
                                                     "clock_source": clock.source},
        "stats": {"macs": 4096, "gemm_uops": 16}, "counters": {"cycles": 292}, "layer": "conv1", "trace": None,
        "check": "none"}
    untimed = RunSummary.of("program p.npz", program, RunResult("fsim", program.dram.copy(), {"macs": np.int64(8)}))
    assert list(untimed.to_dict()) == list(summary.to_dict())
    assert json.loads(untimed.to_json())["summary"] == {"macs_issued": 8}
