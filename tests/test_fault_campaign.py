"""The fault campaign (scripts/fault_campaign.py, docs/robustness.md): a small seeded selection of every probe
family runs by default (fsim only, no tsim build: about 30 subprocesses, 10-30 s), the full campaign is ``slow``.
Each must end with zero in every defect column: no traceback, hang, crash, code execution, silent wrong result, lost
file or orphan."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def _campaign_module():
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location("fault_campaign", SCRIPTS / "fault_campaign.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPTS))


fc = _campaign_module()
from faults.core import DEFECTS, OUTCOMES  # noqa: E402  (on sys.path once the script is loaded)


def test_split_probes_shares_the_total():
    counts = fc.split_probes(220, list(fc.FAMILIES))
    assert sum(counts.values()) == 220 and counts["programs"] > counts["cache"] >= 1
    assert fc.split_probes(6, list(fc.FAMILIES)) == {f: 1 for f in fc.FAMILIES}


def test_fast_subset_has_no_defects(tmp_path):
    """A few probes of each kind: corrupted programs at three configs on fsim, damaged and pickle-carrying
    artefacts and programs, bad configs, bad models and inputs (a pickled input among them), damaged JIT objects
    and zoo models (rebuilt), SIGINT/SIGKILL during ``vta compile -o existing.vtac``."""
    ctx = fc.Context(work=tmp_path / "work", cache=tmp_path / "cache", seed=3, tsim_mode="off", quick=True)
    counts = {"programs": 4, "artefacts": 5, "configs": 4, "models": 4, "cache": 4, "signals": 3}  # SIGINT, SIGKILL
    records = fc.campaign(ctx, counts, jobs=2, progress=False)
    table = fc.tally(records)
    assert set(table) == {*counts, "total"}
    for family, n in counts.items():
        assert sum(table[family].values()) == n + (family == "artefacts")  # + the signed payload-manifest probe
    defects = {r.probe.name: (r.verdict.outcome, r.verdict.note) for r in records if r.verdict.outcome in DEFECTS}
    assert defects == {}, fc.report(records, ctx)
    total = table["total"]
    # both kinds of clean ending occur; how many of each depends on where the seeded corruptions land in the
    # programs and artefacts of the day (a flipped byte a zip member does not depend on reads back identical: ok)
    assert total["clear"] >= 10 and total["ok"] >= 5
    assert all(r.verdict.outcome == "clear" for r in records if r.probe.family == "models")
    assert {r.probe.name.split()[1] for r in records if r.probe.family == "artefacts"} >= {
        "pickle_member", "pickle_extra", "pickle_v1", "raw_pickle"}        # every planted pickle was refused
    assert all(r.verdict.outcome == "ok" for r in records if r.probe.family == "cache")  # rebuilt and ran
    assert list(OUTCOMES[:1]) == ["clear"] and "ok" not in DEFECTS
    assert "| family" in fc.report(records, ctx) and "clear errors" in fc.report(records, ctx)


def test_graphs_that_break_onnx_rules_are_clear_errors(tmp_path):
    """One probe of each graph-level damage (a node input or output dropped, an axis beyond the rank, an attribute
    of the wrong type, a weight of the wrong type or not finite, a huge dimension): each a clear error, no traceback
    and no exit 0."""
    from faults.models import MODEL_DAMAGE, model_probes
    graph_kinds = {"input_dropped", "output_dropped", "bad_axis", "attr_type", "weight_type", "weight_inf", "huge_dim"}
    ctx = fc.Context(work=tmp_path / "work", cache=tmp_path / "cache", seed=5, tsim_mode="off", quick=True)
    ctx.prepare()
    probes = [p for p in model_probes(ctx, np.random.default_rng(5), len(MODEL_DAMAGE))
              if p.name.split()[0] in graph_kinds]
    assert {p.name.split()[0] for p in probes} == graph_kinds
    records = [fc.run_probe(ctx, probe, k) for k, probe in enumerate(probes)]
    outcomes = {r.probe.name: (r.verdict.outcome, r.verdict.note) for r in records}
    assert all(outcome == "clear" for outcome, _ in outcomes.values()), outcomes


def test_a_defect_is_counted(tmp_path):
    """The classifier is not blind: a command that dies by a signal, one that prints a traceback and one that
    overruns its time are counted as such, and a planted marker is a code execution."""
    folder = tmp_path / "p"
    folder.mkdir()
    env = {"PATH": "/usr/bin:/bin"}
    py = sys.executable
    cases = {"crash": [py, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
             "traceback": [py, "-c", "raise RuntimeError('x')"],
             "hang": [py, "-c", "import time; time.sleep(30)"]}
    for outcome, argv in cases.items():
        run = fc.execute(fc.Probe("t", outcome, argv, timeout=2.0), folder, env)
        assert fc.judge_cli(run).outcome == outcome
    run = fc.execute(fc.Probe("t", "m", [py, "-c", "open('PWNED', 'w')"]), folder, env)
    assert run.returncode == 0 and (folder / "PWNED").exists()
    big = fc.execute(fc.Probe("t", "mem", [py, "-c", "b = bytearray(3 << 30)"], mem_mb=1024), folder, env)
    assert big.returncode == 1 and "MemoryError" in big.stderr        # the RLIMIT_AS limit holds in the child


@pytest.mark.slow
def test_full_campaign(tmp_path):
    """The whole campaign (220 probes, tsim models built once into the private cache and reused): exit 0, every
    defect column zero."""
    out = tmp_path / "campaign.json"
    code = fc.main(["--probes", "220", "--jobs", "2", "--work", str(tmp_path / "work"), "--json", str(out)])
    data = json.loads(out.read_text())
    assert sum(data["table"]["total"].values()) >= 200
    assert {d: data["table"]["total"][d] for d in DEFECTS} == {d: 0 for d in DEFECTS}
    assert code == 0
