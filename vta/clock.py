"""The accelerator's clock: which clock a design's times are given at, where that figure comes from, and a model of
it for designs that were not placed and routed.

A design's clock (:func:`design_clock`), in this order:

* ``user``: ``--clock-mhz`` on ``vta run`` / ``vta report``, or a config whose ``CLOCK_MHZ`` is not the default
  100 MHz (a config that writes 100 explicitly cannot be told apart from one that leaves it out);
* ``place-and-route`` (or ``estimate``, nextpnr's post-placement figure): a cached result of ``vta hw timing`` for
  the config (:mod:`vta.hw.timing`, Yosys ``synth_ecp5`` + nextpnr-ecp5 on an LFE5U-85F, speed grade 6, seed 1) --
  the newest one in ``<cache root>/timing/``, whose RTL digest the note names;
* ``model``: :func:`model_clock`, the clock model below.

The clock model (:func:`model_clock`). Each named register-to-register path of the core has a logic delay summed
from its elements (block-RAM read, multiplier, carry chains, LUT levels; :data:`ELEMENT_NS`, ECP5 speed-6 delays as
nextpnr reports them on the routed designs) and a number of routed hops; a hop's routing delay grows with the
width of the array the path's lanes are spread over: ``hop_ns = a + b * log2(BATCH * BLOCK_OUT)``. ``a`` and ``b``
are fitted (least squares) on the place-and-route results of :data:`CALIBRATION`; the error on held-out designs
(leave-one-out) is :data:`MODEL_ERROR_PCT`. The period is the slowest path's; its unit names the critical path.

On the ground floor: imports only :mod:`vta.config` and :mod:`vta.cache` (reports, sweeps and ``vta hw timing``
share it). Units: MHz, ns.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .cache import cache_root
from .config import VTAConfig

__all__ = ["Clock", "ModelClock", "SOURCES", "DEFAULT_CLOCK_MHZ", "ELEMENT_NS", "CALIBRATION", "path_delays",
           "path_elements", "model_clock", "fit_routing", "leave_one_out", "measured_clock", "design_clock",
           "MODEL_ERROR_PCT", "ROUTING", "clock_from_timing"]

DEFAULT_CLOCK_MHZ = VTAConfig().clock_mhz
"""The config's default clock (100 MHz): a config with another ``clock_mhz`` gives the user's clock."""
SOURCES = ("place-and-route", "estimate", "model", "user")
"""Where a design's clock figure comes from."""


@dataclass(frozen=True)
class Clock:
    """A design's clock: ``mhz``, where the figure comes from (``source``, one of :data:`SOURCES`), what it was
    measured against (``note``, e.g. the tool, device and seed) and the unit its critical path is in (``unit``,
    e.g. ``compute.alu``; empty when unknown)."""

    mhz: float
    source: str
    note: str = ""
    unit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"clock_mhz": self.mhz, "clock_source": self.source, "clock_note": self.note,
                "critical_unit": self.unit}


def clock_from_timing(result: Mapping[str, Any]) -> Clock | None:
    """The :class:`Clock` of a ``vta hw timing`` result (:func:`vta.hw.timing.timing`), None when it has no clock
    (the design did not fit)."""
    if result.get("fmax_mhz") is None or result.get("source") not in ("place-and-route", "estimate"):
        return None
    tools = result.get("tools", {})
    note = (f"{result.get('tools', {}).get('nextpnr', 'nextpnr')} on {result.get('part')} seed {result.get('seed')}, "
            f"Yosys {str(tools.get('yosys', '?')).split(' ')[0]}, RTL digest {result.get('verilog_digest')}")
    path = result.get("critical_path") or {}
    return Clock(float(result["fmax_mhz"]), str(result["source"]), note, str(path.get("unit", "")))


def measured_clock(cfg: VTAConfig, *, device: str = "85k", seed: int = 1,
                   folder: Path | None = None) -> Clock | None:
    """The clock of the newest cached ``vta hw timing`` result for ``cfg`` on ``device`` with ``seed`` (routed
    preferred over a post-placement estimate), None when there is none. ``folder``: default
    ``<cache root>/timing``."""
    folder = folder if folder is not None else cache_root("timing")
    found: list[tuple[int, float, Mapping[str, Any]]] = []
    for path in folder.glob(f"{cfg.name}-*-{device}-seed{seed}-*.json"):
        try:
            result = json.loads(path.read_text())
            mtime = path.stat().st_mtime
        except (OSError, ValueError):
            continue
        if isinstance(result, dict) and result.get("config") == cfg.name:
            found.append((int(result.get("source") == "place-and-route"), mtime, result))
    for _, _, result in sorted(found, key=lambda f: (f[0], f[1]), reverse=True):
        clock = clock_from_timing(result)
        if clock is not None:
            return clock
    return None


def design_clock(cfg: VTAConfig, user_mhz: float | None = None, *, measured: bool = True) -> Clock:
    """The clock ``cfg``'s times are given at: ``user_mhz`` when given, else the config's ``clock_mhz`` when it is
    not the default (both ``user``), else a cached place-and-route result (``measured``), else the model."""
    if user_mhz is not None:
        return Clock(float(user_mhz), "user", "--clock-mhz")
    if cfg.clock_mhz != DEFAULT_CLOCK_MHZ:
        return Clock(float(cfg.clock_mhz), "user", "the config's CLOCK_MHZ")
    if measured:
        clock = measured_clock(cfg)
        if clock is not None:
            return clock
    est = model_clock(cfg)
    return Clock(est.mhz, "model", f"clock model (ECP5 LFE5U-85F speed 6), {est.error_pct:.1f} % error on held-out "
                                   f"designs", est.unit)


# ---------------------------------------------------------------------------------------------------------------------
# The clock model

ELEMENT_NS: dict[str, float] = {
    "bram": 5.83,          # a block RAM's (DP16KD) clock to read data
    "bram_setup": 0.218,   # a block RAM's write-data setup
    "ff": 0.525,           # a flip-flop's clock to Q (its setup is 0)
    "mult": 3.927,         # a multiplier (MULT18X18D), operands to product, not registered
    "carry": 1.842,        # the carry chains (CCU2C) summing a 32x32 multiply's partial products
    "carry32": 1.915,      # a 32-bit add (CCU2C chain): operands to sum
    "lut": 0.236,          # one level of LUT4 (or its wide-function multiplexer)
    "compare": 2.70,       # a 32-bit signed comparison: a carry chain with nextpnr's feed-through cells
}
"""Logic delay (ns) of each element of a path on an ECP5 at speed grade 6, as nextpnr-ecp5 0.11.1 times it on routed
paths (``vta hw timing --json``: a critical path's ``elements``). Read off the routed ALU path of the BLOCK 4 core
(``configs/timing/small1x4.toml``: block-RAM read 5.83, multiplier 3.927, the partial-product carry chains 1.842,
LUT4 levels 0.165-0.256, block-RAM setup 0.218), of the same core with FUSED_REQUANT (the clip comparisons 2.59 and
2.81) and two small wrapped designs (a flip-flop's clock to Q 0.525, a 32-bit carry chain 1.915). The ALU path's
logic adds up to 13.47 ns (routed: 13.44) without the knob and 20.05 ns (20.20) with it."""


def path_elements(cfg: VTAConfig) -> dict[str, list[str]]:
    """The elements (keys of :data:`ELEMENT_NS`) of each named register-to-register path of ``cfg``'s core, in
    order; consecutive elements are joined by one routed hop.

    * ``compute.alu``: the tensor ALU's micro-op, as routed in the BLOCK 4 core: the acc block RAM's read (stage C),
      the second operand's select, the 32x32 multiply (a multiplier and the carry chains summing its partial
      products), six LUT levels (the operation select, the result and write-data selects) and the acc write
      (stage D). ``FUSED_REQUANT`` adds, as routed, the multiplier's operand select and after the shifter the two
      clip comparisons with a select after each and two more LUT levels; ``CONCURRENT_ALU`` (not routed yet) the
      bank select on the read and on the write.
      ``ALU_PIPELINE`` starts the path at the ALU's operand registers (a flip-flop instead of the block-RAM read and
      the operand select, which move to ``compute.alu_read``).
    * ``compute.alu_reduce`` (``LANE_REDUCE`` only): RMAX, the lane's MAX followed by the max tree across the
      lanes (:func:`_reduce_path`).
    * ``compute.alu_read`` (``ALU_PIPELINE`` only): the acc block RAM's read, the second operand's select (immediate
      or acc[src]) and the forwarding select, into the operand registers.
    * ``compute.gemm``: the GEMM core's MAC array: the inp/wgt block RAMs' read, the 8x8 multiply, the adder tree
      (``log2(BLOCK_IN)`` 32-bit adds) and the accumulation (one more), the reset select and the acc write;
      ``GEMM_OVERWRITE`` adds the overwrite select.
    """
    alu = ["bram", "lut", "mult", "carry"] + ["lut"] * 6 + ["bram_setup"]
    if cfg.fused_requant:
        alu[2:2] = ["lut"]
        alu[-1:-1] = ["compare", "lut", "compare", "lut", "lut", "lut"]
    if cfg.concurrent_alu:
        alu[1:1] = ["lut"]
        alu[-1:-1] = ["lut"]
    gemm = ["bram", "mult"] + ["carry32"] * (int(math.log2(cfg.block_in)) + 1) + ["lut", "bram_setup"]
    if cfg.gemm_overwrite:
        gemm[-1:-1] = ["lut"]
    paths = {"compute.alu": alu, "compute.gemm": gemm}
    if cfg.lane_reduce:
        paths["compute.alu_reduce"] = _reduce_path(cfg)
    if not cfg.alu_pipeline:
        return paths
    alu[0:2] = ["ff"]
    return {**paths, "compute.alu_read": ["bram", "lut", "lut"]}


def _reduce_path(cfg: VTAConfig) -> list[str]:
    """``LANE_REDUCE``'s RMAX through the ALU (its elements argued from the RTL, ``hw/alu.py``; not fitted, routed
    at BLOCK 4 after the fit: 24.65 MHz against the model's 23.31, :data:`MODEL_ERROR_PCT`): the acc read and the
    second operand's select, the lane's MAX (a comparison and its select, read by the tree before the lane's result
    select) and one more LUT level, then the max tree, ``log2(BLOCK_OUT)`` levels of a comparison and a select, the
    tree's and the reduction's result selects and the write-data selects (as on ``compute.alu``), the acc write.
    RSUM's adder tree (carry chains of 1.9 ns instead of comparisons of 2.7 ns) is shorter. With ``ALU_PIPELINE`` it
    starts at the operand registers; ``CONCURRENT_ALU`` adds the bank selects."""
    path = ["bram", "lut", "compare", "lut", "lut"] + ["compare", "lut"] * int(math.log2(cfg.block_out))
    path += ["lut"] * 6 + ["bram_setup"]
    if cfg.concurrent_alu:
        path[1:1] = ["lut"]
        path[-1:-1] = ["lut"]
    if cfg.alu_pipeline:
        path[0:2] = ["ff"]
    return path


def _spread(cfg: VTAConfig) -> float:
    """How far a path's lanes are spread: log2 of the lanes (BATCH x BLOCK_OUT) of the acc buffer and the ALU."""
    return math.log2(cfg.batch * cfg.block_out)


def path_delays(cfg: VTAConfig, routing: Sequence[float] | None = None) -> dict[str, float]:
    """Each named path's delay (ns): its elements' logic delays plus ``len(elements) - 1`` routed hops of
    ``hop_ns = a + b * log2(BATCH * BLOCK_OUT)`` each (``routing`` = ``(a, b)``, default the fitted
    :data:`ROUTING`)."""
    a, b = routing if routing is not None else ROUTING
    hop = a + b * _spread(cfg)
    return {name: round(sum(ELEMENT_NS[e] for e in elems) + (len(elems) - 1) * hop, 3)
            for name, elems in path_elements(cfg).items()}


@dataclass(frozen=True)
class ModelClock:
    """The clock model's figure for a design: ``mhz``, ``period_ns``, the critical path's ``unit``, every named
    path's delay (``paths``, ns) and the model's error on held-out designs (``error_pct``, :data:`MODEL_ERROR_PCT`)."""

    mhz: float
    period_ns: float
    unit: str
    paths: dict[str, float]
    error_pct: float


def model_clock(cfg: VTAConfig) -> ModelClock:
    """The clock model's maximum clock for ``cfg``'s core on an ECP5 LFE5U-85F (speed grade 6)."""
    paths = path_delays(cfg)
    unit = max(paths, key=lambda name: paths[name])
    return ModelClock(round(1e3 / paths[unit], 2), paths[unit], unit, paths, MODEL_ERROR_PCT)


_B4 = {"LOG_BLOCK": 2, "LOG_INP_BUFF_SIZE": 13, "LOG_WGT_BUFF_SIZE": 14, "LOG_ACC_BUFF_SIZE": 15}
CALIBRATION: tuple[tuple[dict[str, Any], float, str], ...] = (
    (_B4, 32.38, "vta hw timing --config configs/timing/small1x4.toml"),
    ({**_B4, "FUSED_REQUANT": True}, 20.12, "vta hw timing --config configs/timing/small1x4_rq.toml"),
    ({"LOG_BLOCK": 3, "LOG_INP_BUFF_SIZE": 14, "LOG_WGT_BUFF_SIZE": 16, "LOG_ACC_BUFF_SIZE": 16}, 29.83,
     "vta hw timing --config configs/small1x8.toml"),
)
"""Place-and-route results the model is fitted on: (config fields, fmax in MHz, the command that measures it). Each
routed with seed 1 on an LFE5U-85F (speed 6, router2; Yosys 0.70, nextpnr-ecp5 0.11.1), 2026-11-26."""


def fit_routing(points: Sequence[tuple[VTAConfig, float]]) -> tuple[float, float]:
    """``(a, b)`` of the routing hop (``hop_ns = a + b * spread``) fitting ``points`` (config, fmax MHz) best in the
    least-squares sense of their periods; with one distinct spread, ``b`` is 0."""
    rows = []
    for cfg, mhz in points:
        elems = path_elements(cfg)[_critical_name(cfg)]
        logic = sum(ELEMENT_NS[e] for e in elems)
        rows.append((len(elems) - 1, (len(elems) - 1) * _spread(cfg), 1e3 / mhz - logic))
    n = len(rows)
    sxx = sum(r[0] * r[0] for r in rows)
    sxy = sum(r[0] * r[1] for r in rows)
    syy = sum(r[1] * r[1] for r in rows)
    sxz = sum(r[0] * r[2] for r in rows)
    syz = sum(r[1] * r[2] for r in rows)
    det = sxx * syy - sxy * sxy
    if n < 2 or abs(det) < 1e-9 * max(1.0, sxx * syy):
        return (sxz / sxx if sxx else 0.0, 0.0)
    return ((sxz * syy - syz * sxy) / det, (sxx * syz - sxy * sxz) / det)


def _critical_name(cfg: VTAConfig) -> str:
    """The path the fit attributes a measured period to: the ALU's (every routed design's critical path so far)."""
    return "compute.alu"


def leave_one_out(points: Sequence[tuple[VTAConfig, float]]) -> list[float]:
    """The model's error (percent of the measured clock, signed) on each of ``points`` with the routing fitted on
    the others."""
    errors = []
    for i, (cfg, mhz) in enumerate(points):
        routing = fit_routing([p for j, p in enumerate(points) if j != i])
        period = max(path_delays(cfg, routing).values())
        errors.append(round(100 * (1e3 / period - mhz) / mhz, 1))
    return errors


def _calibration_points() -> list[tuple[VTAConfig, float]]:
    return [(VTAConfig.from_dict(fields), mhz) for fields, mhz, _ in CALIBRATION]


ROUTING: tuple[float, float] = (1.2198, 0.2619)
"""``(a, b)`` of the routing hop fitted on :data:`CALIBRATION` (:func:`fit_routing`): 1.74 ns a hop at BLOCK 4, 2.01
ns at BLOCK 8, 2.27 ns (extrapolated) at BLOCK 16."""
MODEL_ERROR_PCT: float = 8.5
"""The largest leave-one-out error (percent of the clock) of the model on :data:`CALIBRATION`: the BLOCK 8 core
predicted from the two BLOCK 4 designs (32.36 MHz against 29.83 routed). The two BLOCK 4 designs predict each other
within 0.1 %, but they share the array's width and the element delays were read off them. Designs routed after the
fit and not in it: BLOCK 8 with FUSED_REQUANT -5.7 %; BLOCK 4 with ALU_PIPELINE -8.0 % (37.85 MHz, ``compute.gemm``,
against 41.15 routed, whose critical path is the GEMM core's too), and with FUSED_REQUANT as well +6.4 % (23.58 MHz
against 22.17); BLOCK 4 with LANE_REDUCE -5.4 % (23.31 MHz, ``compute.alu_reduce``, against 24.65 routed)."""
