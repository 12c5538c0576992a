"""Bounded work and memory of the functional simulator: max_insns / max_uops (RunawayError), chunked loops, the plan
cache's byte bound, the fsim backend's and `vta run`'s limit options."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import raw_program_after_data

from vta import fsim
from vta.backend import get_backend
from vta.cli import main
from vta.config import VTAConfig
from vta.fsim import DEFAULT_MAX_INSNS, DEFAULT_MAX_UOPS, RunawayError, Stats
from vta.fsim_kernels import GemmPlan, nbytes_of, unique_rows
from vta.gemm import gemm_program
from vta.isa import ALU_ADD, Alu, Finish, Gemm


# ---- max_uops ------------------------------------------------------------------------------------------------------
def test_max_uops_is_checked_before_the_instruction_runs(small_cfg):
    prog = raw_program_after_data(small_cfg, [Gemm(reset=True, iter_out=3, uop_end=2),  # 6 uops
                                              Alu(alu_opcode=ALU_ADD, use_imm=True, iter_in=4, uop_end=1),  # 4 uops
                                              Finish()])
    stats = fsim.run(prog, max_uops=10).stats
    assert stats.gemm_uops + stats.alu_uops == 10
    with pytest.raises(RunawayError, match=r"^more than max_uops=9 GEMM/ALU micro-op iterations executed: instruction "
                       r"1 \(ALU ADD\) would execute 4 \(iter_out 1 x iter_in 4 x 1 micro-ops\) after 6; raise the "
                       r"limit \(max_uops=N, vta run --max-uops N; None or 'none' for no limit\) if the program is "
                       r"meant to do this much work$") as err:
        fsim.run(prog, max_uops=9)
    assert err.value.insn_index == 1
    # before it executes: an instruction past the limit that would also address out of range reports the limit
    bad = raw_program_after_data(small_cfg, [Gemm(reset=True, iter_out=1000, dst_factor_out=1), Finish()])
    with pytest.raises(RunawayError, match=r"^more than max_uops=999 "):
        fsim.run(bad, max_uops=999)
    with pytest.raises(fsim.SramRangeError):
        fsim.run(bad, max_uops=1000)


def test_limit_arguments(small_cfg):
    prog = raw_program_after_data(small_cfg, [Finish()])
    for name in ("max_insns", "max_uops"):
        for bad in (-1, 1.5, True, "10"):
            with pytest.raises(ValueError, match=rf"^{name} must be None or a non-negative integer, not {bad!r}$"):
                fsim.run(prog, **{name: bad})
    assert fsim.run(prog, max_insns=None, max_uops=None).stats.compute_insns == 1
    assert fsim.run(prog, max_uops=0).stats.compute_insns == 1


def _huge_gemm_program(cfg: VTAConfig) -> fsim.Program:
    """A 2-instruction program whose GEMM runs 16383 x 16383 x (the whole micro-op buffer) iterations."""
    return raw_program_after_data(cfg, [Gemm(iter_out=16383, iter_in=16383, uop_bgn=0, uop_end=cfg.uop_depth),
                                        Finish()], 1024)


def test_default_limits_stop_a_huge_gemm_before_it_runs():
    assert (DEFAULT_MAX_INSNS, DEFAULT_MAX_UOPS) == (10_000_000, 2 ** 32)
    cfg = VTAConfig()
    with pytest.raises(RunawayError, match=r"^more than max_uops=4294967296 GEMM/ALU micro-op iterations executed: "
                       r"instruction 0 \(GEMM\) would execute 2198754828288 \(iter_out 16383 x iter_in 16383 x 8192 "
                       r"micro-ops\) after 0; "):
        fsim.run(_huge_gemm_program(cfg))


_MEMORY_CHILD = textwrap.dedent("""
    import resource, signal, sys
    limit = 1 << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.path.insert(0, {tests!r})
    from test_fsim_limits import _huge_gemm_program
    from vta import fsim
    from vta.config import VTAConfig

    class Stop(Exception):
        pass

    def stop(*_):
        raise Stop()

    signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, {seconds})
    try:
        fsim.run(_huge_gemm_program(VTAConfig()), max_uops=None)
        print("completed")
    except Stop:
        print("still running")
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
""")


@pytest.mark.slow
def test_memory_does_not_grow_with_loop_extents(tmp_path):
    """With no micro-op limit, the huge GEMM runs chunk after chunk inside a 1 GiB address space (it used to build
    a list of ~9e7 chunks first: MemoryError after ~2 s) and its peak RSS stays ~200 MiB (measured 201 MiB after 5 s
    and 202 MiB after 60 s)."""
    from pathlib import Path
    code = _MEMORY_CHILD.format(tests=str(Path(__file__).parent), seconds=6)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    state, peak_mib = proc.stdout.split("\n")[:2]
    assert state == "still running"
    assert int(peak_mib) < 512


# ---- chunking and the plan cache -------------------------------------------------------------------------------------
def test_chunks_are_lazy_and_bounded():
    cfg = VTAConfig()
    machine = fsim._Machine(_huge_gemm_program(cfg), Stats())
    chunks = machine._chunks(Gemm(iter_out=16383, iter_in=16383, uop_end=cfg.uop_depth), 272)
    first = [next(chunks) for _ in range(3)]
    assert first == [(0, 24576), (24576, 49152), (49152, 73728)]  # 3 rows of 8192 micro-ops: 30840 iterations max
    alu = list(machine._chunks(Alu(alu_opcode=ALU_ADD, iter_out=3, iter_in=1 << 19, uop_end=1), 1))  # 1 elem/iter
    assert alu[:2] == [(0, 1 << 19), (1 << 19, 2 << 19)] and len(alu) == 3  # capped by _CHUNK_ITERS


def test_plan_cache_is_bounded_in_bytes(small_cfg, monkeypatch):
    monkeypatch.setattr(fsim, "_PLAN_CACHE_BYTES", 10_000)
    machine = fsim._Machine(raw_program_after_data(small_cfg, [Finish()]), Stats())
    plans = [np.zeros(300, np.int64) for _ in range(4)]  # 2400 + 64 bytes each, keys 64 + 64 * 2: 2656 a plan
    for i, plan in enumerate(plans[:3]):
        machine._remember(("key", i), plan)
    assert machine._plan_bytes == 3 * 2656
    assert machine._recall(("key", 0)) is plans[0]  # now the most recently used
    machine._remember(("key", 3), plans[3])  # a fourth would exceed 10000 bytes: the least recently used goes
    assert [k[1] for k in machine._plans] == [2, 0, 3] and machine._plan_bytes == 3 * 2656
    big = np.zeros(2000, np.int64)
    assert machine._remember(("big",), big) is big and machine._recall(("big",)) is None  # too large: not kept
    assert machine._recall(("key", 1)) is None


def test_nbytes_of_counts_plans():
    d = np.array([0, 0, 1, 1])
    plan = GemmPlan(d, np.array([0, 1, 0, 1]), np.array([0, 0, 1, 1]), 4)
    assert nbytes_of(plan) > d.nbytes * 6
    assert nbytes_of((np.zeros(10, np.int8), b"abc", 7)) == 64 + 74 + 67 + 64


def test_unique_rows_of_long_rows():
    """Rows longer than the hash's 4096 terms go through a lexicographic sort (same result as np.unique)."""
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2, (40, 5000))[rng.integers(0, 6, 40)]
    uniq, inverse = unique_rows(a)
    expected, expected_inverse = np.unique(a, axis=0, return_inverse=True)
    assert np.array_equal(uniq, expected) and np.array_equal(inverse, expected_inverse.reshape(-1))
    assert np.array_equal(uniq[inverse], a)


# ---- the backend and the command line ------------------------------------------------------------------------------
def test_backend_limits(small_cfg):
    prog, _ = gemm_program(small_cfg, 4, 4, 4)
    total = fsim.run(prog).stats
    uops = total.gemm_uops + total.alu_uops
    backend = get_backend("fsim")
    assert (backend.max_insns, backend.max_uops) == (DEFAULT_MAX_INSNS, DEFAULT_MAX_UOPS)
    assert get_backend("fsim", max_uops=uops).run(prog).stats["gemm_uops"] == total.gemm_uops
    with pytest.raises(RunawayError, match=rf"^more than max_uops={uops - 1} "):
        get_backend("fsim", max_uops=uops - 1).run(prog)
    with pytest.raises(RunawayError, match=r"^more than max_uops=0 "):
        get_backend("fsim", max_uops=None).run(prog, max_uops=0)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_limit_options(capsys):
    gemm = ("run", "--m", "16", "--k", "16", "--n", "16")
    code, _, err = _cli(capsys, *gemm, "--max-uops", "3")
    assert code == 1
    assert err.startswith("vta: error: more than max_uops=3 GEMM/ALU micro-op iterations executed: instruction 1 "
                          "(GEMM) would execute 16 ")
    assert _cli(capsys, *gemm, "--max-insns", "5")[0] == 1
    code, out, _ = _cli(capsys, *gemm, "--max-insns", "none", "--max-uops", "100", "--json")
    assert code == 0 and '"correct": true' in out
    code, _, err = _cli(capsys, *gemm, "--max-uops", "-2")
    assert code == 2 and "argument --max-uops: expected a non-negative integer or 'none', not '-2'" in err
    code, _, err = _cli(capsys, *gemm, "--max-insns", "x")
    assert code == 2 and "argument --max-insns: expected a non-negative integer or 'none', not 'x'" in err
    code, _, err = _cli(capsys, *gemm, "--max-insns", "9", "--max-uops", "9", "--target", "tsim")
    assert code == 2
    assert err == "vta: error: --max-insns, --max-uops apply only to the fsim backend, not to --target tsim; leave " \
                  "them out\n"
    code, _, err = _cli(capsys, "run", "tiny_cnn", "--max-uops", "9")
    assert code == 2
    assert err == "vta: error: --max-uops apply to the GEMM benchmark and to saved programs (.npz), not yet to " \
                  "models (tiny_cnn); leave them out\n"


def test_cli_limit_options_on_a_saved_program(capsys, tmp_path, small_cfg):
    prog, _ = gemm_program(small_cfg, 4, 4, 4)
    path = tmp_path / "p.npz"
    prog.save(path)
    code, _, err = _cli(capsys, "run", str(path), "--max-uops", "0")
    assert code == 1 and err.startswith("vta: error: more than max_uops=0 ")
    assert _cli(capsys, "run", str(path), "--max-uops", "none")[0] == 0
