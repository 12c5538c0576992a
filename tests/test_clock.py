"""Tests for vta.clock: the clock model, its calibration and error, and which clock a design's times are given at."""
import json

import pytest

from vta.clock import (
    CALIBRATION,
    DEFAULT_CLOCK_MHZ,
    ELEMENT_NS,
    MODEL_ERROR_PCT,
    ROUTING,
    Clock,
    clock_from_timing,
    design_clock,
    fit_routing,
    leave_one_out,
    measured_clock,
    model_clock,
    path_delays,
    path_elements,
)
from vta.config import VTAConfig


def test_paths_follow_the_config():
    """The ALU path gains the requantization's levels with FUSED_REQUANT and the bank selects with CONCURRENT_ALU;
    the GEMM path one carry chain per doubling of BLOCK_IN."""
    base = path_elements(VTAConfig())
    assert base["compute.alu"][0] == "bram" and base["compute.alu"][-1] == "bram_setup"
    rq = path_elements(VTAConfig(fused_requant=True))["compute.alu"]
    assert len(rq) == len(base["compute.alu"]) + 7 and rq.count("compare") == 2
    assert len(path_elements(VTAConfig(concurrent_alu=True))["compute.alu"]) == len(base["compute.alu"]) + 2
    assert path_elements(VTAConfig(log_block=3))["compute.gemm"].count("carry32") == 4
    assert base["compute.gemm"].count("carry32") == 5
    delays = path_delays(VTAConfig())
    assert path_delays(VTAConfig(fused_requant=True))["compute.alu"] > delays["compute.alu"]
    wide = (0.5, 0.25)  # hops that grow with the lanes: the ALU path of BLOCK 4 is shorter than BLOCK 16's
    assert path_delays(VTAConfig(log_block=2), wide)["compute.alu"] < path_delays(VTAConfig(), wide)["compute.alu"]


def test_model_clock_names_its_critical_path():
    est = model_clock(VTAConfig())
    assert est.unit == max(est.paths, key=lambda p: est.paths[p]) and est.period_ns == est.paths[est.unit]
    assert est.mhz == round(1e3 / est.period_ns, 2) and est.error_pct == MODEL_ERROR_PCT
    assert model_clock(VTAConfig(fused_requant=True)).mhz < est.mhz


def test_fit_recovers_a_known_routing():
    """Points made from hop = 0.5 + 0.25 * log2(lanes) give back (0.5, 0.25); leave-one-out is then exact."""
    cfgs = [VTAConfig(log_block=b, fused_requant=True) for b in (2, 3, 4)]  # the ALU path is critical in each
    points = [(cfg, 1e3 / max(path_delays(cfg, (0.5, 0.25)).values())) for cfg in cfgs]
    a, b = fit_routing(points)
    assert a == pytest.approx(0.5) and b == pytest.approx(0.25)
    assert max(abs(e) for e in leave_one_out(points)) < 0.1


def test_calibration_and_stated_error():
    """The routing is the fit of the calibration points, and MODEL_ERROR_PCT is its largest leave-one-out error."""
    points = [(VTAConfig.from_dict(fields), mhz) for fields, mhz, _ in CALIBRATION]
    assert len(points) >= 2 and all(v > 0 for v in ELEMENT_NS.values())
    assert fit_routing(points) == pytest.approx(ROUTING, abs=1e-3)
    assert max(abs(e) for e in leave_one_out(points)) == pytest.approx(MODEL_ERROR_PCT, abs=0.1)


def test_design_clock_order(tmp_path, monkeypatch):
    """--clock-mhz, then a config's own CLOCK_MHZ, then a cached place-and-route result, then the model."""
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    cfg = VTAConfig(log_block=2)
    assert design_clock(cfg, 150.0) == Clock(150.0, "user", "--clock-mhz")
    assert design_clock(VTAConfig(log_block=2, clock_mhz=42.0)).source == "user"
    model = design_clock(cfg)
    assert (model.source, model.mhz, model.unit) == ("model", model_clock(cfg).mhz, model_clock(cfg).unit)
    result = {"config": cfg.name, "source": "place-and-route", "fmax_mhz": 36.5, "seed": 1, "part": "LFE5U-85F",
              "verilog_digest": "abc", "tools": {"yosys": "0.70", "nextpnr": "nextpnr-0.11.1"},
              "critical_path": {"unit": "compute.alu"}}
    folder = tmp_path / "timing"
    folder.mkdir()
    (folder / f"{cfg.name}-abc-85k-seed1-0123abcd.json").write_text(json.dumps(result))
    (folder / f"{cfg.name}-abc-85k-seed2-0123abcd.json").write_text(json.dumps({**result, "fmax_mhz": 1.0}))
    clock = design_clock(cfg)
    assert (clock.mhz, clock.source, clock.unit) == (36.5, "place-and-route", "compute.alu")
    assert "LFE5U-85F seed 1" in clock.note and "abc" in clock.note
    assert design_clock(cfg, measured=False).source == "model"
    assert measured_clock(VTAConfig()) is None and DEFAULT_CLOCK_MHZ == 100.0


def test_a_design_that_did_not_fit_has_no_measured_clock():
    assert clock_from_timing({"config": "x", "source": "none", "fmax_mhz": None}) is None
