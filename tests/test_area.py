"""vta.hw.area: the one Yosys pipeline (find Yosys, run a script, read its stat report, cache the counts) that both
``vta hw resources`` and the sweep's per-module synthesis (vta.sweep.synth) run, checked against a stand-in ``yosys``
on PATH that records what it was asked and writes fixed cell counts (real synthesis: the slow tests of
test_hw_verilog.py and test_sweep_exact.py)."""
import json
import logging
import os
import stat
import sys
import textwrap

import pytest

from vta.config import VTAConfig
from vta.hw import area
from vta.hw.verilog import source_hash

FAKE = textwrap.dedent("""\
    #!{python}
    # A stand-in Yosys: logs its arguments, then per `tee -q -o FILE stat -json [MODULE]` writes fixed counts.
    import json, os, re, sys, time
    if sys.argv[1:] == ["-V"]:
        print("Yosys 9.9-rc1 (stand-in)")
        sys.exit(0)
    with open(os.environ["FAKE_YOSYS_LOG"], "a") as log:
        log.write(json.dumps({{"args": sys.argv[1:], "cwd": os.getcwd(),
                              "files": {{n: open(n).read() for n in sorted(os.listdir(".")) if n.endswith(".v")}}}})
                  + "\\n")
    mode = os.environ.get("FAKE_YOSYS_MODE", "ok")
    print("2.1. Executing SYNTH_XILINX pass.", flush=True)
    if mode == "hang":
        time.sleep(30)
    if mode == "fail":
        print("ERROR: stand-in failure", flush=True)
        sys.exit(3)
    script = sys.argv[sys.argv.index("-p") + 1]
    for out, module in re.findall(r"tee -q -o (\\S+) stat -json ?([^;]*)", script):
        module = module.strip() or "vta_core"
        cells = {{"LUT6": len(module), "LUT2": 1, "RAM64M": 2, "FDRE": 16, "DSP48E1": 1, "RAMB18E1": 1}}
        with open(out, "w") as f:  # a trailing comma, as Yosys 0.23 writes at times
            f.write(json.dumps({{"design": {{"num_cells_by_type": cells}},
                                "modules": {{"\\\\" + module: {{"num_cells_by_type": cells}}}}}})[:-1] + ",}}")
""")


@pytest.fixture
def fake_yosys(tmp_path, monkeypatch):
    """A stand-in ``yosys`` first on PATH, the cache in ``tmp_path/cache``; returns a function reading its runs."""
    folder = tmp_path / "bin"
    folder.mkdir()
    exe = folder / "yosys"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "yosys.log"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_YOSYS_LOG", str(log))
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path / "cache"))
    return lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _seed_verilog(cfg, text="module vta_core(input clk);\nendmodule\n"):
    """Put ``text`` where core_verilog caches ``cfg``'s Verilog, so no Amaranth runs."""
    from vta.cache import cache_root
    path = cache_root("area-modules") / "verilog" / f"{cfg.name}-{source_hash()}.v"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return text


# ---- vta hw resources -----------------------------------------------------------------------------------------------
def test_resources_runs_the_flattened_script_once_and_caches_by_config_hash_and_yosys(fake_yosys, tmp_path):
    cfg = VTAConfig()
    verilog = _seed_verilog(cfg)
    lines = []
    counts = area.resources(cfg, progress=lines.append)
    cells = {"LUT6": 8, "LUT2": 1, "RAM64M": 2, "FDRE": 16, "DSP48E1": 1, "RAMB18E1": 1}
    assert {k: counts[k] for k in area.parse_stat(cells)} == area.parse_stat(cells)
    assert (counts["lut"], counts["ff"], counts["bram"]) == (11, 16, 0.5)
    assert (counts["config"], counts["hw_hash"], counts["yosys"]) == (cfg.name, source_hash(), "yosys9.9_rc1")
    path = tmp_path / "cache" / "area" / f"{cfg.name}-{source_hash()}.yosys9.9_rc1.json"
    assert area.cache_path(cfg) == path and json.loads(path.read_text()) == counts
    [run] = fake_yosys()
    assert run["args"] == ["-p", "read_verilog vta_core.v; synth_xilinx -flatten -top vta_core; "
                                 "tee -q -o stat.json stat -json"]
    assert run["files"] == {"vta_core.v": verilog}
    assert any(line.endswith("2.1 SYNTH_XILINX pass.") for line in lines)
    assert area.resources(cfg) == counts and len(fake_yosys()) == 1, "found again in the cache"
    assert area.resources(cfg, force=True)["lut"] == 11 and len(fake_yosys()) == 2


def test_a_failed_synthesis_names_the_config_and_caches_nothing(fake_yosys, monkeypatch):
    cfg = VTAConfig()
    _seed_verilog(cfg)
    monkeypatch.setenv("FAKE_YOSYS_MODE", "fail")
    with pytest.raises(area.AreaError) as err:
        area.resources(cfg)
    assert str(err.value) == (f"yosys failed on config {cfg.name} (exit 3):\n2.1. Executing SYNTH_XILINX pass.\n"
                              "ERROR: stand-in failure\n")
    assert not area.cache_path(cfg).exists()


def test_core_verilog_is_generated_once(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(area, "verilog_text", lambda cfg, gemm_form: calls.append(gemm_form) or "module m;\n")
    assert area.core_verilog(VTAConfig(), tmp_path) == "module m;\n"
    assert area.core_verilog(VTAConfig(), tmp_path) == "module m;\n" and calls == ["array"]
    assert (tmp_path / f"{VTAConfig().name}-{source_hash()}.v").read_text() == "module m;\n"


# ---- run_yosys, read_stat, the cache files --------------------------------------------------------------------------
def test_run_yosys_stops_at_its_timeout_and_checks_its_outputs(fake_yosys, monkeypatch, tmp_path):
    command = area.yosys_command()
    monkeypatch.setenv("FAKE_YOSYS_MODE", "hang")
    with pytest.raises(area.AreaError, match=r"^yosys ran past 0.5 s on module leaf$"):
        area.run_yosys(command, "stat", tmp_path, what="module leaf", timeout=0.5)
    monkeypatch.setenv("FAKE_YOSYS_MODE", "ok")
    with pytest.raises(area.AreaError, match=r"^yosys failed on module leaf \(exit 0\):\n2.1. Executing"):
        area.run_yosys(command, "stat", tmp_path, what="module leaf", outputs=["stat.json"], quiet=True)
    assert fake_yosys()[-1]["args"] == ["-q", "-p", "stat"]


def test_read_stat_forgives_a_trailing_comma_and_names_a_bad_report(tmp_path):
    path = tmp_path / "stat.json"
    path.write_text('{"modules": {"\\\\m": {"num_cells_by_type": {"LUT6": 1},}}}')
    assert area.read_stat(path, "module m") == {"modules": {"\\m": {"num_cells_by_type": {"LUT6": 1}}}}
    path.write_text('{"modules":\n  {"m": oops}}')
    with pytest.raises(area.AreaError) as err:
        area.read_stat(path, "module m")
    assert str(err.value) == ("yosys' stat -json report of module m is not JSON (Expecting value at line 2: "
                              "'{\"m\": oops}}')")


def test_write_cached_then_read_cached_and_a_damaged_file_is_removed(tmp_path, caplog):
    path = tmp_path / "sub" / "r.json"
    assert area.read_cached(path, ("lut",)) is None  # no file: no warning
    area.write_cached(path, {"lut": 3, "ff": 2})
    assert area.read_cached(path, ("lut", "ff")) == {"lut": 3, "ff": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]
    with caplog.at_level(logging.WARNING, logger="vta"):
        assert area.read_cached(path, ("lut", "dsp")) is None and not path.exists()
    assert caplog.messages == [f"the cached area result {path} is damaged: it lacks dsp; removing it and "
                               "synthesizing again"]


# ---- the sweep's per-module synthesis on the same pipeline -----------------------------------------------------------
TWO = "module leaf(input [7:0] a, output [7:0] p);\n  assign p = a;\nendmodule\n" \
      "module top(input clk, input [7:0] x, output [7:0] q);\n  leaf u(.a(x), .p(q));\nendmodule\n"


def test_synth_modules_runs_quiet_scripts_and_caches_each_module(fake_yosys, tmp_path, caplog):
    from vta.sweep.synth import module_key, split_modules, synth_modules
    modules = split_modules(TWO)
    first = synth_modules("two", modules, jobs=1, cache=tmp_path / "m")
    assert sorted(first.synthesized) == ["leaf", "top"] and first.cached == []
    assert first.modules["leaf"]["lut"] == 4 + 1 + 2 and first.modules["top"]["lut"] == 3 + 1 + 2
    assert (first.lut, first.ff, first.dsp, first.bram) == (13, 32, 2, 1.0)
    runs = fake_yosys()
    assert all(run["args"][:2] == ["-q", "-p"] for run in runs)
    assert any("read_verilog -lib lib.v; read_verilog top.v; synth_xilinx -noiopad -noclkbuf -top top; "
               "tee -q -o stat0.json stat -json top" == run["args"][2] for run in runs)
    command = area.yosys_command()
    leaf = tmp_path / "m" / f"{module_key('leaf', modules['leaf'], command)}.json"
    assert json.loads(leaf.read_text())["module"] == "leaf"
    again = synth_modules("two", modules, cache=tmp_path / "m")
    assert again.synthesized == [] and len(fake_yosys()) == len(runs)
    leaf.write_text("{")
    with caplog.at_level(logging.WARNING, logger="vta"):
        third = synth_modules("two", modules, cache=tmp_path / "m")
    assert third.synthesized == ["leaf"] and (third.lut, third.ff) == (13, 32)
    assert caplog.messages[0].startswith(f"the cached area result {leaf} is damaged: it cannot be read")


def test_synth_modules_reports_a_failure_as_a_synth_error(fake_yosys, monkeypatch, tmp_path):
    from vta.sweep.synth import SynthError, split_modules, synth_modules
    monkeypatch.setenv("FAKE_YOSYS_MODE", "fail")
    with pytest.raises(SynthError, match=r"(?s)^yosys failed on module leaf \(exit 3\):\n.*stand-in failure"):
        synth_modules("one", split_modules(TWO.split("module top")[0]), cache=tmp_path)
