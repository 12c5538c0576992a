"""Per-layer reports of a compiled model's run: a text table, JSON, CSV and a plot.

:func:`build_report` joins a :class:`~.runtime.RunOutput` (what each step did) with the
:class:`~.runtime.Compiled` artefact (why each node runs where it does, the tiling chosen) into a :class:`Report`:
one row per layer plus totals. Units: ``macs`` multiply-accumulates; ``gemm_uops``/``alu_uops`` micro-op
iterations (fsim and tsim); ``cycles`` clock cycles (tsim only, else None); ``bytes`` DMA bytes loaded and stored
by the accelerator; ``ms`` wall-clock milliseconds of the step on this machine (simulation time, not accelerator
time); ``util`` the fraction of the GEMM core's peak (``BATCH * BLOCK_IN * BLOCK_OUT`` MACs per cycle) the layer
achieved (tsim only). ``time_us`` is an accelerator layer's time in microseconds at the design's clock (its measured
cycles, else the cycle model's). The totals add ``accel_ms_at_clock`` (the measured accelerator cycles at that
clock), ``latency_us`` (one inference's accelerator time: the measured cycles where every accelerator layer has
them, else the predicted ones, ``latency_cycles`` says which; CPU layers not counted) and ``inferences_per_s``. The
clock is the report's ``clock_mhz`` with ``clock_source`` (``place-and-route``, ``estimate``, ``model``, ``user``;
:func:`vta.clock.design_clock`) and ``clock_note`` (what it was measured against).

Memory traffic and energy: ``insn_bytes_read`` ... ``out_bytes_written`` are an accelerator layer's bytes per memory
type from the backend's statistics (:data:`vta.counters.BYTE_COUNTERS`; None on the CPU); ``intensity`` its MACs per
DRAM byte; ``macs_per_cycle`` the MACs per cycle it achieved (measured cycles, tsim only). ``energy_uj`` and the
``energy_<part>_uj`` columns are microjoules from :mod:`vta.energy` and a technology file (default the 45 nm table):
accelerator layers from their statistics (MACs, ALU lanes, SRAM bytes per buffer, DRAM bytes), layers on a CPU or
GPU fallback at the file's ``cpu.mac_pj`` per MAC. ``energy_uj`` is dynamic energy. Static energy (leakage and clock
tree): the totals' ``energy_static_uj`` is the report's ``static_mw`` (the technology file's ``static.mw_per_kclb``
times the design's analytical area in CLB-equivalents, :func:`vta.area.estimate_area`, kept as ``area_clb``) over
``latency_us``, the accelerator's time at the report's clock (CPU layers not counted); ``energy_total_uj`` is the sum.

:meth:`Report.plot` draws per-layer stacked bars of where the cycles (per module, from the counters) and the energy
went; :meth:`Report.plot_roofline` the roofline (operational intensity against achieved MACs per cycle, the compute
roof ``BATCH * BLOCK_IN * BLOCK_OUT`` and the bus's ``BUS_BYTES`` per cycle). :func:`load_report` reads a saved JSON
report back (``vta report RUN``) and :func:`compare` puts two runs side by side, layer by layer.
"""
from __future__ import annotations

import csv
import io
import json
import os
import textwrap
from dataclasses import asdict, dataclass, field
from os import PathLike
from typing import Any, Iterable, Mapping

from vta.area import estimate_area
from vta.clock import Clock, design_clock
from vta.config import ConfigError, VTAConfig
from vta.counters import BYTE_COUNTERS, CYCLE_CLASSES, MODULES
from vta.energy import BUFFERS, Tech, layer_energy, load_tech, static_pj
from vta.fileio import atomic_path, atomic_write_text

from .runtime.compiled import AccelStep, Compiled
from .runtime.executor import RunOutput

__all__ = ["Report", "build_report", "COLUMNS", "MODULE_COLUMNS", "BYTE_COLUMNS", "ENERGY_PARTS", "ENERGY_COLUMNS",
           "ReportError", "load_report", "compare", "format_comparison", "roofline_path", "layer_bound", "run_bound",
           "module_demand", "step_energy", "config_difference", "accuracy_difference", "format_accuracy_difference",
           "parse_budget", "budget_failure", "format_accuracy", "format_calibration", "format_int8_budget",
           "row_bound", "uncrowded_labels"]

MODULE_COLUMNS = tuple(f"{m}_{c}" for m in MODULES for c in CYCLE_CLASSES)
"""Per-module cycle classes from the core's counters (tsim only, else None): e.g. ``compute_busy``,
``load_wait_token``, ``store_wait_mem``; a module's idle cycles are the layer's cycles minus the three."""
BYTE_COLUMNS = tuple(BYTE_COUNTERS.values())
"""Bytes per memory type an accelerator layer moved (``insn_bytes_read``, ``uop_bytes_read``, ``wgt_bytes_read``,
``inp_bytes_read``, ``acc_bytes_read``, ``out_bytes_written``), None on the CPU."""
ENERGY_PARTS = ("mac", "alu", *(f"sram_{b}" for b in BUFFERS), "dram", "cpu")
"""The components of a layer's energy: :func:`vta.energy.layer_energy`'s, and ``cpu`` for fallback layers."""
ENERGY_COLUMNS = ("energy_uj",) + tuple(f"energy_{p}_uj" for p in ENERGY_PARTS)
"""A layer's energy (microjoules) and its components (None where a component does not apply)."""
COLUMNS = ("layer", "op", "in_shape", "out_shape", "where", "macs", "gemm_uops", "alu_uops", "cycles", "util",
           "predicted", "bound", "bytes", "ms", "conversions", "tiling", "reason") + MODULE_COLUMNS + BYTE_COLUMNS + (
    "hw_macs", "intensity", "macs_per_cycle") + ENERGY_COLUMNS + ("time_us",)
"""``in_shape``/``out_shape``: the layer's first input's and its output's shapes as ``1x16x8x8`` (empty in reports
written before they were recorded); ``ms``: host milliseconds (wall clock of the step on this machine, not the
accelerator's time); ``predicted``: the cycle model's cycles for an accelerator layer's program (any target; None on
the CPU);
``bound``: the module the model says bounds it (``load``, ``compute``, ``store``, ``alu`` with the concurrent ALU
engine; by :func:`layer_bound`'s rule; empty on the CPU); ``hw_macs``: the MACs the GEMM core performed including
padding lanes (the statistics' ``macs``; what costs energy)."""


def layer_bound(occupancy: Mapping[str, int]) -> str:
    """The module that bounds a layer: of ``occupancy`` (module -> cycles; for a measured layer its
    :func:`module_demand`), the one with the most cycles, ``fetch`` excluded (it dispatches; it never does a layer's
    work); ties go to the first in ``occupancy``'s order; ``""`` when there is none. The cycle model's
    :attr:`vta.cost.Estimate.bound` is this rule over its predicted occupancy; a tsim run's is this rule over the
    core's counters (:func:`module_demand`: work and memory waits, not token waits)."""
    modules = [m for m in occupancy if m != "fetch"]
    return max(modules, key=lambda m: occupancy[m]) if modules else ""


def module_occupancy(classes: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Module -> cycles it held an instruction (the sum of its :data:`vta.counters.CYCLE_CLASSES`), from the core's
    per-module cycle classes (a tsim run's :attr:`~.runtime.executor.LayerStat.modules`)."""
    return {m: int(sum(c.get(k, 0) for k in CYCLE_CLASSES)) for m, c in classes.items()}


BOUND_CLASSES = ("busy", "wait_mem")
"""The cycle classes that count towards a module's claim to bound a layer: its work and its waits on memory. A
module waiting for another's token (``wait_token``) is held up by that module, which is the bound."""


def module_demand(classes: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """Module -> cycles it worked or waited on memory (:data:`BOUND_CLASSES`), from the core's per-module cycle
    classes: what :func:`layer_bound` weighs for a measured layer. (A decode step's compute module holds its GEMM
    instructions nearly every cycle, but waiting for the load module's weight tokens: the load module bounds it.)"""
    return {m: int(sum(c.get(k, 0) or 0 for k in BOUND_CLASSES)) for m, c in classes.items()}


def run_bound(layers: Iterable[tuple[str, int]]) -> str:
    """The module that bounds a whole run: over ``layers`` as (the layer's bound, :func:`layer_bound`; its cycles),
    the bound of the most cycles (ties: the first seen); ``""`` without accelerator layers. The run report's
    ``totals["bound"]`` and the sweep's ``bound`` column."""
    cycles: dict[str, int] = {}
    for bound, n in layers:
        if bound:
            cycles[bound] = cycles.get(bound, 0) + int(n)
    return max(cycles, key=lambda b: cycles[b]) if cycles else ""


def step_energy(where: str, counts: Mapping[str, int] | None, macs: int, cfg: VTAConfig,
                tech: Tech) -> dict[str, float] | None:
    """Dynamic energy (pJ) of one layer by component: on the accelerator (``where == "accel"``) from its event
    ``counts`` (:func:`vta.energy.layer_energy`; None without counts), elsewhere (a CPU or GPU fallback) ``macs`` at
    ``tech.cpu_mac_pj`` as ``{"cpu": pJ}``. A run's ``energy_uj`` and a sweep point's are the sum over layers; static
    energy (area x time) is not in it (the sweep reports it apart: ``energy_total_uj``)."""
    if where == "accel":
        return None if counts is None else layer_energy(counts, cfg, tech)
    return {"cpu": macs * tech.cpu_mac_pj}


@dataclass
class Report:
    """Rows (one dict per layer, keys :data:`COLUMNS`) and totals of one run of one model."""

    model: str
    config: str
    target: str
    rows: list[dict[str, Any]]
    macs_per_cycle: int = 1
    clock_mhz: float = 100.0
    extra: dict[str, Any] = field(default_factory=dict)
    bus_bytes: int = 8
    """The DMA bus width in bytes per cycle: the roofline's bandwidth roof."""
    config_fields: dict[str, Any] | None = None
    """The config's fields (:meth:`vta.config.VTAConfig.to_dict`), so a saved report can be re-rendered."""
    tech: str = ""
    """The technology file's name its energies come from."""
    clock_source: str = "user"
    """Where ``clock_mhz`` comes from (:data:`vta.clock.SOURCES`)."""
    clock_note: str = ""
    """What the clock was measured against (tool, device, seed; or the model and its error)."""
    area_clb: float | None = None
    """The design's area in CLB-equivalents of the analytical model (:func:`vta.area.estimate_area`), None in a
    report saved before it was recorded."""
    static_mw: float | None = None
    """The design's static power in milliwatts (``tech``'s ``static.mw_per_kclb`` times ``area_clb`` / 1000)."""

    def __post_init__(self) -> None:
        for row in self.rows:  # each accelerator layer's time at this report's clock
            cycles = row.get("cycles") if row.get("cycles") is not None else row.get("predicted")
            row["time_us"] = round(cycles / self.clock_mhz, 3) if row.get("where") == "accel" and cycles else None

    def with_clock(self, mhz: float, source: str = "user", note: str = "") -> "Report":
        """The same report with its times at another clock (``mhz``, from ``source``)."""
        return Report(self.model, self.config, self.target, [dict(r) for r in self.rows], self.macs_per_cycle, mhz,
                      dict(self.extra), self.bus_bytes, self.config_fields, self.tech, source, note, self.area_clb,
                      self.static_mw)

    @property
    def totals(self) -> dict[str, Any]:
        """Sums over layers; ``accel_layers``/``cpu_layers`` count placements; ``cycles`` None without tsim."""
        def total(key: str) -> int:
            return int(sum(r[key] or 0 for r in self.rows))
        cycles = [r["cycles"] for r in self.rows if r["cycles"] is not None]
        accel_macs = sum(r["macs"] for r in self.rows if r["where"] == "accel")
        accel_cycles = int(sum(cycles)) if cycles else None
        predicted = [r["predicted"] for r in self.rows if r.get("predicted") is not None]
        util = round(accel_macs / (accel_cycles * self.macs_per_cycle), 4) if accel_cycles else None
        at_clock = round(accel_cycles / self.clock_mhz / 1e3, 3) if accel_cycles else None
        accel = [r for r in self.rows if r["where"] == "accel"]
        measured = bool(accel) and all(r["cycles"] is not None for r in accel)
        latency = sum(r["cycles"] if measured else r.get("predicted") or 0 for r in accel)
        latency_us = round(latency / self.clock_mhz, 3) if latency else None
        traffic = self._traffic_totals()
        static = round(self.static_mw * latency_us * 1e-3, 6) if self.static_mw is not None and latency_us else None
        dynamic = traffic.get("energy_uj")
        return {"layers": len(self.rows), "accel_layers": sum(r["where"] == "accel" for r in self.rows),
                "cpu_layers": sum(r["where"] == "cpu" for r in self.rows), "macs": total("macs"),
                "accel_macs": accel_macs, "gemm_uops": total("gemm_uops"), "alu_uops": total("alu_uops"),
                "cycles": accel_cycles, "util": util, "predicted": int(sum(predicted)) if predicted else None,
                "accel_ms_at_clock": at_clock, "latency_us": latency_us,
                "latency_cycles": ("measured" if measured else "predicted") if latency_us else None,
                "inferences_per_s": round(1e6 / latency_us, 3) if latency_us else None,
                "bound": self._bound(), "bytes": total("bytes"),
                "ms": round(sum(r["ms"] for r in self.rows), 3), "conversions": total("conversions"),
                **traffic, "energy_static_uj": static,
                "energy_total_uj": round(dynamic + static, 6) if dynamic is not None and static is not None else None}

    def _bound(self) -> str:
        """:func:`run_bound` over the accelerator layers: each layer's bound from the core's counters where the run
        has them (tsim), else the cycle model's, weighted by its cycles (measured, else predicted)."""
        layers = []
        for r in self.rows:
            if r["where"] != "accel":
                continue
            measured = r["cycles"] is not None and r.get("compute_busy") is not None
            bound = row_bound(r)[0] if measured else r.get("bound") or ""
            layers.append((bound, r["cycles"] if r["cycles"] is not None else r.get("predicted") or 0))
        return run_bound(layers)

    def _traffic_totals(self) -> dict[str, Any]:
        """Bytes per memory type, intensity and energy (microjoules) summed over layers; None where no layer has
        them."""
        out: dict[str, Any] = {}
        for key in BYTE_COLUMNS + ENERGY_COLUMNS:
            values = [r[key] for r in self.rows if r.get(key) is not None]
            out[key] = (round(sum(values), 6) if key.startswith("energy") else int(sum(values))) if values else None
        dram = sum(out[k] or 0 for k in BYTE_COLUMNS)
        accel_macs = sum(r["macs"] for r in self.rows if r["where"] == "accel")
        out["intensity"] = round(accel_macs / dram, 4) if dram else None
        return out

    # ---- output -------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "config": self.config, "target": self.target, "macs_per_cycle":
                self.macs_per_cycle, "clock_mhz": self.clock_mhz, "clock_source": self.clock_source,
                "clock_note": self.clock_note, "bus_bytes": self.bus_bytes, "area_clb": self.area_clb,
                "static_mw": self.static_mw,
                "config_fields": self.config_fields, "tech": self.tech, "layers": self.rows, "totals": self.totals,
                **self.extra}

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the report") -> "Report":
        """The report :meth:`to_dict` (a saved JSON report) describes; :class:`ReportError` naming ``source`` when
        ``data`` is not one: the first missing part, else every field of a wrong type or value
        (:func:`report_problems`, the first :data:`_SHOWN_PROBLEMS` listed)."""
        if not isinstance(data, dict):
            raise ReportError(f"{source}: not a run report (a JSON object written by vta run --report-json)")
        missing = [k for k in ("model", "config", "target", "layers") if k not in data]
        if missing:
            raise ReportError(f"{source}: not a run report written by vta run --report-json (no "
                              f"{', '.join(repr(k) for k in missing)})")
        if not isinstance(data["layers"], list) or not all(isinstance(r, dict) for r in data["layers"]):
            raise ReportError(f"{source}: 'layers' is not a list of rows")
        for i, row in enumerate(data["layers"]):
            lacking = [k for k in ("layer", "op", "where", "macs") if k not in row]
            if lacking:
                raise ReportError(f"{source}: layer {i} has no {', '.join(lacking)}")
        problems = report_problems(data)
        if problems:
            more = f"\n  - and {len(problems) - _SHOWN_PROBLEMS} more" if len(problems) > _SHOWN_PROBLEMS else ""
            raise ReportError(f"{source}: not a run report as vta run --report-json writes one ({len(problems)} "
                              f"problem{'s' if len(problems) != 1 else ''}):\n"
                              + "\n".join(f"  - {p}" for p in problems[:_SHOWN_PROBLEMS]) + more)
        rows = [{k: row.get(k, "" if k in _ROW_OPTIONAL_TEXT else 0 if k in _ROW_COUNTS else None) for k in COLUMNS}
                for row in data["layers"]]
        known = {"model", "config", "target", "macs_per_cycle", "clock_mhz", "bus_bytes", "config_fields", "tech",
                 "clock_source", "clock_note", "area_clb", "static_mw", "layers", "totals"}
        if "bit_exact_vs_reference" in data and "matches_integer_reference" not in data:  # a report before the rename
            data = {**data, "matches_integer_reference": data["bit_exact_vs_reference"]}
        try:
            return cls(str(data["model"]), str(data["config"]), str(data["target"]), rows,
                       int(data.get("macs_per_cycle") or 1), float(data.get("clock_mhz") or 100.0),
                       {k: v for k, v in data.items() if k not in known}, int(data.get("bus_bytes") or 8),
                       data.get("config_fields"), str(data.get("tech") or ""),
                       str(data.get("clock_source") or "user"), str(data.get("clock_note") or ""),
                       _optional_float(data.get("area_clb")), _optional_float(data.get("static_mw")))
        except (TypeError, ValueError) as err:
            raise ReportError(f"{source}: a report field has the wrong type ({err})") from None

    def with_tech(self, tech: Tech) -> "Report":
        """The same report with every layer's energy computed again from its statistics with ``tech``; needs the
        config's fields (reports written since they are saved)."""
        if not self.config_fields:
            raise ReportError(f"the report of {self.model} does not hold its config's fields (config_fields); run it "
                              f"again to recompute its energy")
        try:
            cfg = VTAConfig.from_dict(self.config_fields)
        except ConfigError as err:
            raise ReportError(f"config_fields is not a valid config ({'; '.join(err.problems)}), so the energy "
                              f"cannot be computed again") from None
        rows = [dict(r) for r in self.rows]
        for row in rows:
            _fill_energy(row, cfg, tech)
        area = estimate_area(cfg).area_clb
        return Report(self.model, self.config, self.target, rows, self.macs_per_cycle, self.clock_mhz,
                      dict(self.extra), self.bus_bytes, self.config_fields, tech.name, self.clock_source,
                      self.clock_note, area, _static_mw(tech, area))

    def write_json(self, path: str | PathLike[str]) -> None:
        """Write :meth:`to_dict` as JSON, atomically (a failure leaves any previous file intact)."""
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, default=_json_default))

    def write_csv(self, path: str | PathLike[str]) -> None:
        """Write the rows as CSV (columns :data:`COLUMNS`, None as an empty cell), atomically."""
        out = io.StringIO(newline="")
        writer = csv.DictWriter(out, fieldnames=list(COLUMNS))
        writer.writeheader()
        for row in self.rows:
            writer.writerow({k: "" if row[k] is None else row[k] for k in COLUMNS})
        atomic_write_text(path, out.getvalue())

    def format(self, *, reasons: bool = False, wide: bool = False) -> str:
        """The table as text: one line per layer, then totals. By default it fits 120 columns (:data:`NARROW`);
        ``wide`` adds the input shapes and micro-op counts and keeps names whole (:data:`WIDE`); ``reasons`` appends
        why each layer runs where it does."""
        spec = WIDE if wide else NARROW
        head = " ".join(_cell(label, width) for label, width, _ in spec)
        lines = [f"{self.model} on {self.target} ({self.config})", head, "-" * len(head)]
        for r in self.rows:
            line = " ".join(_cell(_TABLE_CELLS[key](r), width) for _, width, key in spec)
            if reasons:
                line += f"  {r['reason']}"
            lines.append(line)
        t = self.totals
        lines.append("-" * len(head))
        total = {**t, "layer": "total", "op": f"{t['accel_layers']} accel", "where": "", "in_shape": "",
                 "out_shape": ""}
        lines.append(" ".join(_cell(_TABLE_CELLS[key](total), width) for _, width, key in spec))
        lines.append("host ms: wall-clock time of each step on this machine (simulation, not the accelerator's time)"
                     + (f"; building or loading the simulator took {self.extra['build_seconds']:,.2f} s, not in "
                        f"host ms" if self.extra.get("build_seconds") else ""))
        if t["latency_us"] is not None:
            lines.append(f"accelerator time at {self.clock_mhz:.4g} MHz ({self.clock_source}): "
                         f"{t['latency_us'] / 1e3:,.3f} ms per inference ({t['latency_cycles']} cycles), "
                         f"{t['inferences_per_s']:,.2f} inferences/s")
            if self.clock_note:
                lines.extend(textwrap.wrap(f"clock: {self.clock_note}", 120, subsequent_indent="  "))
        lines.append(f"layout conversions at partition boundaries: {t['conversions']}; "
                     f"{t['accel_macs']:,} of {t['macs']:,} MACs on the accelerator")
        if reasons:
            lines.extend(textwrap.wrap(_REASONS_NOTE.format(mhz=(self.config_fields or {}).get("CLOCK_MHZ", 100.0)),
                                       120, subsequent_indent="  "))
        lines.extend(self.format_modules())
        lines.extend(self.format_traffic())
        for key, value in self.extra.items():
            if key == "accuracy" and isinstance(value, dict):
                lines.extend(format_accuracy(value))
            elif key == "calibration" and isinstance(value, dict):
                lines.append(format_calibration(value))
            elif key == "int8_budget" and isinstance(value, dict):
                lines.extend(textwrap.wrap(format_int8_budget(value), 120, subsequent_indent="  "))
            elif key != "build_seconds":
                lines.append(f"{key}: {value}")
        return "\n".join(lines)

    def module_breakdown(self) -> dict[str, dict[str, int]] | None:
        """Accelerator cycles summed over layers, per module and class (busy, wait_token, wait_mem, idle); None
        without cycle counts (fsim, cpu)."""
        rows = [r for r in self.rows if r["cycles"] is not None and r.get("compute_busy") is not None]
        if not rows:
            return None
        cycles = sum(r["cycles"] for r in rows)
        out = {}
        for m in MODULES:
            classes = {c: int(sum(r[f"{m}_{c}"] for r in rows)) for c in CYCLE_CLASSES}
            classes["idle"] = max(0, cycles - sum(classes.values()))
            out[m] = classes
        return out

    def format_modules(self) -> list[str]:
        """Where the accelerator's cycles went, per module, as text lines (empty without cycle counts)."""
        breakdown = self.module_breakdown()
        if breakdown is None:
            return []
        total = max(1, sum(breakdown["compute"].values()))
        lines = ["where the accelerator's cycles went (share of all accelerator cycles, from the core's counters):",
                 f"  {'module':<8} {'busy':>7} {'wait_token':>11} {'wait_mem':>9} {'idle':>7}"]
        for m, classes in breakdown.items():
            lines.append(f"  {m:<8} " + " ".join(f"{100 * classes[c] / total:>{w}.1f}%" for c, w in
                                                  (("busy", 6), ("wait_token", 10), ("wait_mem", 8), ("idle", 6))))
        return lines

    def format_traffic(self) -> list[str]:
        """Bytes per memory type, intensity, achieved MACs per cycle and energy of each layer, as text lines (empty
        when no layer has statistics or energy: reports written before they were recorded)."""
        if not any(r.get("energy_uj") is not None or r.get(BYTE_COLUMNS[0]) is not None for r in self.rows):
            return []
        head = (f"  {'layer':<22} {'where':<5} " + " ".join(f"{k.split('_')[0]:>9}" for k in BYTE_COLUMNS)
                + f" {'MAC/B':>7} {'MAC/cyc':>7} {'energy uJ':>10}")
        lines = [f"memory traffic (bytes per memory type), intensity (MACs per DRAM byte) and energy ({self.tech}):",
                 head]
        for r in self.rows:
            lines.append(f"  {_cell(r['layer'], -22)} {r['where']:<5} "
                         + " ".join(f"{_opt(r.get(k)):>9}" for k in BYTE_COLUMNS)
                         + f" {_num(r.get('intensity'), 2):>7} {_num(r.get('macs_per_cycle'), 1):>7} "
                         f"{_num(r.get('energy_uj'), 3):>10}")
        t = self.totals
        lines.append(f"  {'total':<22} {'':<5} " + " ".join(f"{_opt(t.get(k)):>9}" for k in BYTE_COLUMNS)
                     + f" {_num(t.get('intensity'), 2):>7} {'':>7} {_num(t.get('energy_uj'), 3):>10}")
        if t.get("energy_uj"):
            parts = [(p, t.get(f"energy_{p}_uj") or 0.0) for p in ENERGY_PARTS]
            shares = ", ".join(f"{p} {100 * v / t['energy_uj']:.1f}%" for p, v in parts if v)
            lines.extend(textwrap.wrap(f"energy per inference: {t['energy_uj']:,.3f} uJ dynamic ({shares})"
                                       + self._static_text(), 120, subsequent_indent="  "))
        return lines

    def _static_text(self) -> str:
        """``; static ... uJ ..., total ... uJ`` for the energy line, or a note on why static energy is absent."""
        t = self.totals
        if t.get("energy_static_uj") is None:
            return "; static energy: not known (no area recorded in this report)" if self.static_mw is None else ""
        return (f"; static {t['energy_static_uj']:,.3f} uJ ({self.static_mw:,.2f} mW over {t['latency_us']:,.1f} us "
                f"of accelerator time at {self.clock_mhz:.4g} MHz; analytical area {self.area_clb:,.0f} "
                f"CLB-equivalents); total {t['energy_total_uj']:,.3f} uJ")

    def plot(self, path: str | PathLike[str]) -> None:
        """:meth:`figure` written to ``path`` (PNG/SVG/PDF by its suffix), atomically."""
        _save(self.figure(), path)

    def plot_roofline(self, path: str | PathLike[str]) -> None:
        """:meth:`roofline_figure` written to ``path`` (PNG/SVG/PDF by its suffix), atomically."""
        _save(self.roofline_figure(), path)

    def figure(self) -> Any:
        """A matplotlib figure of per-layer bars of where the cycles and the energy went. Top: each layer's cycles
        (tsim), else the cycle model's prediction, else its micro-ops, coloured by where it ran; then, with the
        core's counters, one panel per module stacking its busy, waiting-on-a-token, waiting-on-memory and idle
        cycles (they add up to the layer's cycles); then the energy by component. A legend names only what is
        drawn."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        per_module = self.module_breakdown() is not None
        energy = any(r.get("energy_uj") for r in self.rows)
        panels = 2 + (len(MODULES) if per_module else 0) + int(energy)
        width = max(6.0, _INCHES_PER_LAYER * len(self.rows))  # room for every label at ResNet-50's ~75 layers
        fig, axes = plt.subplots(panels, 1, figsize=(width, 2.2 + 2.0 * panels), sharex=True, squeeze=False)
        x = list(range(len(self.rows)))
        self._plot_overview(axes[0][0], x)
        self._plot_macs(axes[1][0], x)
        k = 2
        if per_module:
            for m in MODULES:
                self._plot_module(axes[k][0], x, m)
                k += 1
        if energy:
            series = {p: [r.get(f"energy_{p}_uj") or 0.0 for r in self.rows] for p in ENERGY_PARTS}
            _stacked(axes[k][0], x, series, _ENERGY_COLOURS)
            axes[k][0].set_ylabel("energy (uJ)")
            axes[k][0].set_title(f"energy by component ({self.tech})", fontsize=9)
        bottom = axes[-1][0]
        bottom.set_xticks(x)
        bottom.set_xticklabels([r["layer"] for r in self.rows], rotation=90, fontsize=_LABEL_POINTS)
        for label, r in zip(bottom.get_xticklabels(), self.rows):
            label.set_color("black" if r["where"] == "accel" else "0.45")
        bottom.set_xlim(-0.6, len(self.rows) - 0.4)
        fig.tight_layout()
        return fig

    def _plot_overview(self, ax: Any, x: list[int]) -> None:
        """Bars of each layer's cycles, predicted cycles or micro-ops, coloured by where it ran."""
        if any(r["cycles"] is not None for r in self.rows):
            values, what = [float(r["cycles"] or 0) for r in self.rows], "cycles (tsim)"
        elif any(r.get("predicted") is not None for r in self.rows):
            values, what = [float(r.get("predicted") or 0) for r in self.rows], "cycles (cycle model)"
        else:
            values, what = [float(r["gemm_uops"] + r["alu_uops"]) for r in self.rows], "micro-ops (GEMM + ALU)"
        for where in dict.fromkeys(r["where"] for r in self.rows):
            heights = [v if r["where"] == where else 0.0 for v, r in zip(values, self.rows)]
            if any(heights):
                ax.bar(x, heights, color=_WHERE_COLOURS.get(where, "tab:purple"), label=_WHERE_LABELS.get(where,
                                                                                                      where))
        fallback = [i for i, r in zip(x, self.rows) if r["where"] != "accel"]
        for k, i in enumerate(fallback):  # a layer with no accelerator cycles is shown as a grey band, not a gap
            ax.axvspan(i - 0.4, i + 0.4, color="0.88", zorder=0,
                       label="on the fallback (no accelerator cycles)" if k == 0 else None)
        ax.set_ylabel(what)
        ax.set_title(f"{self.model} on {self.target} ({self.config})", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    def _plot_macs(self, ax: Any, x: list[int]) -> None:
        """Bars of every layer's MACs coloured by where it ran: the layers on a CPU or GPU fallback, which have no
        accelerator cycles, are seen here."""
        for where in dict.fromkeys(r["where"] for r in self.rows):
            heights = [float(r["macs"]) if r["where"] == where else 0.0 for r in self.rows]
            if any(heights):
                ax.bar(x, heights, color=_WHERE_COLOURS.get(where, "tab:purple"), label=_WHERE_LABELS.get(where,
                                                                                                      where))
        ax.set_ylabel("MACs")
        ax.set_title("MACs per layer, wherever it ran", fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    def _plot_module(self, ax: Any, x: list[int], module: str) -> None:
        """Stacked bars: each layer's cycles split into ``module``'s busy, wait_token, wait_mem and idle cycles."""
        series: dict[str, list[float]] = {}
        for c in (*CYCLE_CLASSES, "idle"):
            heights = []
            for r in self.rows:
                if r["cycles"] is None or r.get(f"{module}_busy") is None:
                    heights.append(0.0)
                elif c == "idle":
                    heights.append(max(0.0, r["cycles"] - sum(r[f"{module}_{k}"] for k in CYCLE_CLASSES)))
                else:
                    heights.append(float(r[f"{module}_{c}"]))
            series[c] = heights
        _stacked(ax, x, series, _CLASS_COLOURS)
        ax.set_ylabel("cycles")
        ax.set_title(f"{module} module: busy, waiting on a token, waiting on memory, idle", fontsize=9)

    def roofline_points(self) -> list[dict[str, Any]]:
        """One point per accelerator layer with MACs and traffic: ``layer``, ``intensity`` (MACs per DRAM byte),
        ``macs_per_cycle`` achieved (MACs over measured cycles, else over the cycle model's) and ``measured``."""
        points = []
        for r in self.rows:
            cycles, measured = (r["cycles"], True) if r["cycles"] else (r.get("predicted"), False)
            if r["where"] != "accel" or not r.get("intensity") or not cycles:
                continue
            points.append({"layer": r["layer"], "intensity": r["intensity"], "macs_per_cycle": r["macs"] / cycles,
                           "measured": measured})
        return points

    def roofline_figure(self) -> Any:
        """A matplotlib figure of the run's roofline: each accelerator layer a point at its
        operational intensity (MACs per DRAM byte) and achieved MACs per cycle (measured cycles, else the cycle
        model's: the legend says which), under the compute roof (``macs_per_cycle``) and the bandwidth roof
        (``bus_bytes`` per cycle times the intensity)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        points = self.roofline_points()
        fig, ax = plt.subplots(figsize=(7.0, 5.0))
        ridge = self.macs_per_cycle / self.bus_bytes
        xs = [p["intensity"] for p in points] or [ridge]
        lo, hi = min(min(xs), ridge) / 1.5, max(max(xs), ridge) * 1.5
        ax.plot([lo, ridge], [self.bus_bytes * lo, self.macs_per_cycle], color="tab:red",
                label=f"bandwidth roof ({self.bus_bytes} B/cycle)")
        ax.plot([ridge, hi], [self.macs_per_cycle] * 2, color="tab:blue",
                label=f"compute roof ({self.macs_per_cycle} MACs/cycle)")
        for measured, marker, label in ((True, "o", "layers (tsim cycles)"), (False, "^", "layers (cycle model)")):
            sel = [p for p in points if p["measured"] is measured]
            if sel:
                ax.scatter([p["intensity"] for p in sel], [p["macs_per_cycle"] for p in sel], marker=marker,
                           color="black", zorder=3, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlim(lo, hi)
        labels = uncrowded_labels([((p["intensity"], p["macs_per_cycle"]), p["layer"]) for p in points], ax,
                                  merge=False, pixels=12.0)
        for xy, text in labels:
            ax.annotate(text, xy, fontsize=6, xytext=(3, 3), textcoords="offset points")
        hidden = len(points) - len(labels)
        cpu = [r["layer"] for r in self.rows if r["where"] != "accel" and r["macs"]]
        notes = ([f"{hidden} labels left out where they would overprint (vta run --html: every layer on hover)"]
                 if hidden else []) + ([f"not on the roofline (ran on the fallback, no accelerator cycles): "
                                        f"{', '.join(cpu[:6])}{' ...' if len(cpu) > 6 else ''}"] if cpu else [])
        if notes:
            ax.annotate("\n".join(notes), (0.0, -0.16), xycoords="axes fraction", va="top", fontsize=7,
                        annotation_clip=False)
        ax.set_xlabel("operational intensity (MACs per DRAM byte)")
        ax.set_ylabel("achieved MACs per cycle")
        ax.set_title(f"roofline: {self.model} on {self.target} ({self.config})", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        return fig


_WHERE_COLOURS = {"accel": "tab:blue", "cpu": "tab:gray", "gpu": "tab:olive", "simt": "tab:cyan"}
_WHERE_LABELS = {"accel": "accelerator", "cpu": "CPU", "gpu": "GPU", "simt": "GPU kernels (SIMT emulator)"}
_CLASS_COLOURS = {"busy": "tab:green", "wait_token": "tab:orange", "wait_mem": "tab:red", "idle": "lightgray"}
_ENERGY_COLOURS = {"mac": "tab:blue", "alu": "tab:cyan", "sram_uop": "tab:orange", "sram_inp": "tab:green",
                   "sram_wgt": "tab:purple", "sram_acc": "tab:brown", "sram_out": "tab:pink", "dram": "tab:red",
                   "cpu": "tab:gray"}
"""One distinct colour per energy component (the SRAM buffers were once shades of one purple)."""


def uncrowded_labels(items: list[tuple[tuple[float, float], str]], ax: Any, *, merge: bool = True,
                     pixels: float = 16.0) -> list[tuple[tuple[float, float], str]]:
    """Labels (data point, text) that do not overprint on ``ax`` (its scales and limits set): with ``merge``, a run
    of consecutive labels within ``pixels`` of the run's first becomes one label ``first-last`` at the first;
    without it, a label within ``pixels`` of one already kept is dropped (its point still drawn)."""
    out: list[tuple[tuple[float, float], str]] = []
    anchors: list[Any] = []
    for xy, text in items:
        here = ax.transData.transform(xy)
        near = [i for i, a in enumerate(anchors) if abs(a[0] - here[0]) < pixels and abs(a[1] - here[1]) < pixels]
        if merge and near and near[-1] == len(anchors) - 1:
            out[-1] = (out[-1][0], f"{out[-1][1].split('-')[0]}-{text}")
            continue
        if not merge and near:
            continue
        out.append((xy, text))
        anchors.append(here)
    return out


_LABEL_POINTS = 8
"""The per-layer plot's x labels (layer names), points: readable on screen and in print."""
_INCHES_PER_LAYER = 0.3
"""The per-layer plot's width per layer (inches): one label of :data:`_LABEL_POINTS` each without overlap."""


_VISIBLE = 0.005
"""A stacked series whose tallest bar is below this fraction of the tallest stack (under a pixel on a 2-inch panel)
is drawn but left out of the legend: a legend entry with no bar to be seen reads as a bug."""


def _stacked(ax: Any, x: list[int], series: dict[str, list[float]], colours: dict[str, str]) -> None:
    """Stacked bars of ``series`` (label -> heights); a series of zeros is neither drawn nor in the legend, one too
    small to see (:data:`_VISIBLE`) is drawn but not in the legend."""
    bottom = [0.0] * len(x)
    tallest = max((sum(column) for column in zip(*series.values())), default=0.0)
    for label, heights in series.items():
        if not any(heights):
            continue
        shown = max(heights) >= _VISIBLE * tallest
        ax.bar(x, heights, bottom=bottom, color=colours.get(label), label=label if shown else "_" + label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def _save(fig: Any, path: str | PathLike[str]) -> None:
    import matplotlib.pyplot as plt
    try:
        with atomic_path(path) as tmp:  # the temporary name keeps the suffix that picks the format
            fig.savefig(tmp, bbox_inches="tight")  # notes under the axes kept
    finally:
        plt.close(fig)


def roofline_path(path: str | PathLike[str]) -> str:
    """Where the roofline goes beside the bar chart ``path``: ``run.png`` -> ``run_roofline.png``."""
    root, suffix = os.path.splitext(os.fspath(path))
    return f"{root}_roofline{suffix}"


class ReportError(ValueError):
    """A saved report cannot be read or re-rendered; the message names the file and the problem."""


def load_report(path: str | PathLike[str]) -> Report:
    """The :class:`Report` saved at ``path`` by ``vta run --report-json`` (or ``vta report --report-json``);
    :class:`ReportError` when it cannot be read or is not a report (:func:`report_problems`)."""
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except OSError as err:
        raise ReportError(f"{os.fspath(path)}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ReportError(f"{os.fspath(path)}: not UTF-8 text (byte {err.object[err.start]:#04x} at position "
                          f"{err.start}); a run report is JSON written by vta run --report-json") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportError(f"{os.fspath(path)}: not JSON ({err})") from None
    except RecursionError:
        raise ReportError(f"{os.fspath(path)}: nested too deeply to read (arrays or objects inside one another past "
                          f"Python's recursion limit); a run report is JSON written by vta run --report-json") from None
    return Report.from_dict(data, source=os.fspath(path))


# ---- what a saved report's fields may hold ---------------------------------------------------------------------------
MAX_FIGURE = 1e18
"""The largest magnitude of a number in a saved report (cycles, MACs, bytes, milliseconds, MHz, ...): far above any
run's figures, low enough that their sums over layers stay finite."""
_ROW_TEXT = ("layer", "op", "where")
_ROW_OPTIONAL_TEXT = ("bound", "tiling", "reason", "in_shape", "out_shape")
_ROW_COUNTS = ("macs", "gemm_uops", "alu_uops", "bytes", "ms", "conversions")
"""A layer's figures that are numbers in every report (given as null they are refused; left out, 0 but ``macs``)."""
_ROW_FIGURES = tuple(k for k in COLUMNS if k not in _ROW_TEXT + _ROW_OPTIONAL_TEXT)
_ACCURACY_FIGURES = ("max_abs_error_lsb", "mean_abs_error_lsb", "max_error_pct_of_range", "mean_error_pct_of_range",
                     "cosine", "top1_agreement", "top5_agreement")
"""An output's accuracy figures (:func:`.frontend.quantize.accuracy_vs_float`): numbers, NaN when the output held a
NaN or an infinity, or null."""
_SHOWN_PROBLEMS = 10


def report_problems(data: Mapping[str, Any]) -> list[str]:
    """Every field of a saved report ``data`` (a JSON object with ``model``, ``config``, ``target`` and ``layers``, a
    list of objects) whose type or value no report of ``vta run --report-json`` has, one sentence each naming the field
    (``layers[3].cycles``, ``accuracy.outputs``); empty when there is none. Numbers are JSON numbers (not strings, not
    true/false), finite, at most :data:`MAX_FIGURE` in magnitude and not negative; ``totals`` is not read (it is
    recomputed from the layers)."""
    problems: list[str] = []
    for key in ("model", "config", "target"):
        problems += _text_problem(key, data[key], optional=False)
    for key in ("tech", "clock_source", "clock_note"):
        problems += _text_problem(key, data.get(key))
    for key in ("macs_per_cycle", "bus_bytes"):
        problems += _figure_problem(key, data.get(key), integer=True, positive=True)
    problems += _figure_problem("clock_mhz", data.get("clock_mhz"), positive=True)
    for key in ("area_clb", "static_mw", "build_seconds"):
        problems += _figure_problem(key, data.get(key))
    for key in ("config_fields", "calibration", "int8_budget", "accuracy"):
        problems += _kind_problem(key, data.get(key), dict)
    for i, row in enumerate(data["layers"]):
        for key in _ROW_TEXT + _ROW_OPTIONAL_TEXT:
            problems += _text_problem(f"layers[{i}].{key}", row.get(key), optional=key not in _ROW_TEXT)
        for key in _ROW_FIGURES:
            problems += _figure_problem(f"layers[{i}].{key}", row.get(key),
                                        optional=key not in _ROW_COUNTS or key not in row)
    if isinstance(data.get("accuracy"), dict):
        problems += _accuracy_problems(data["accuracy"])
    if isinstance(data.get("calibration"), dict):
        problems += _figure_problem("calibration.percentile", data["calibration"].get("percentile"), signed=True)
    if isinstance(data.get("int8_budget"), dict):
        problems += _int8_budget_problems(data["int8_budget"])
    return problems


def _accuracy_problems(accuracy: Mapping[str, Any]) -> list[str]:
    """The problems of a saved report's ``accuracy`` (:func:`format_accuracy`'s data)."""
    outputs = accuracy.get("outputs")
    problems = _kind_problem("accuracy.outputs", outputs, dict, "(output name -> its figures)")
    for name, figures in outputs.items() if isinstance(outputs, dict) else ():
        where = f"accuracy.outputs.{name}"
        more = _kind_problem(where, figures, dict, "of figures", optional=False)
        if more:
            problems += more
            continue
        problems += _figures_problems(where, figures)
        kept = figures.get("kept_tokens")
        problems += _kind_problem(f"{where}.kept_tokens", kept, dict)
        if isinstance(kept, dict):
            problems += _figures_problems(f"{where}.kept_tokens", kept)
            for key in ("tokens", "of"):
                problems += _figure_problem(f"{where}.kept_tokens.{key}", kept.get(key), integer=True)
    own = accuracy.get("file_own_cosine")
    problems += _kind_problem("accuracy.file_own_cosine", own, dict, "(output name -> cosine)")
    for name, cosine in own.items() if isinstance(own, dict) else ():
        problems += _figure_problem(f"accuracy.file_own_cosine.{name}", cosine, nan=True, signed=True)
    lost = accuracy.get("where_lost")
    problems += _kind_problem("accuracy.where_lost", lost, list, "of layers")
    for i, entry in enumerate(lost if isinstance(lost, list) else ()):
        more = _kind_problem(f"accuracy.where_lost[{i}]", entry, dict, optional=False)
        for key in ("cosine_in", "cosine_out"):
            more = more or _figure_problem(f"accuracy.where_lost[{i}].{key}", entry.get(key), nan=True, signed=True)
        problems += more
    return problems


def _figures_problems(where: str, figures: Mapping[str, Any]) -> list[str]:
    """The problems of one output's accuracy figures (also those of its ``kept_tokens``) at ``where``."""
    return [p for key in _ACCURACY_FIGURES
            for p in _figure_problem(f"{where}.{key}", figures.get(key), nan=True, signed=True)]


def _int8_budget_problems(choice: Mapping[str, Any]) -> list[str]:
    """The problems of a saved report's ``int8_budget`` (:func:`format_int8_budget`'s data)."""
    problems = _figure_problem("int8_budget.budget_points", choice.get("budget_points"))
    problems += _figure_problem("int8_budget.cpu_us_of_kept", choice.get("cpu_us_of_kept"))
    kept, steps = choice.get("kept"), choice.get("steps")
    problems += _kind_problem("int8_budget.kept", kept, list, "of layer names")
    for i, name in enumerate(kept if isinstance(kept, list) else ()):
        problems += _text_problem(f"int8_budget.kept[{i}]", name, optional=False)
    problems += _kind_problem("int8_budget.steps", steps, list)
    for i, step in enumerate(steps if isinstance(steps, list) else ()):
        problems += _kind_problem(f"int8_budget.steps[{i}]", step, dict, optional=False)
    return problems


def _text_problem(name: str, value: Any, *, optional: bool = True) -> list[str]:
    """``[sentence]`` when ``value`` is not a string (null allowed when ``optional``), else ``[]``."""
    if isinstance(value, str) or (value is None and optional):
        return []
    return [f"{name} must be a string, not {_shown(value)}"]


def _kind_problem(name: str, value: Any, kind: type, what: str = "", *, optional: bool = True) -> list[str]:
    """``[sentence]`` when ``value`` is not a JSON object (``kind`` dict) or array (list), null allowed when
    ``optional``; else ``[]``."""
    if isinstance(value, kind) or (value is None and optional):
        return []
    return [f"{name} must be {'an object' if kind is dict else 'an array'}{' ' + what if what else ''}, not "
            f"{_shown(value)}"]


def _figure_problem(name: str, value: Any, *, optional: bool = True, integer: bool = False, positive: bool = False,
                    signed: bool = False, nan: bool = False) -> list[str]:
    """``[sentence]`` when ``value`` is not the number a report field holds, else ``[]``: a JSON number (an integer
    with ``integer``; null when ``optional``), finite and at most :data:`MAX_FIGURE` in magnitude (NaN too with
    ``nan``: an accuracy measured on non-finite outputs), 0 or more (above 0 with ``positive``, any sign with
    ``signed``)."""
    if value is None:
        return [] if optional else [f"{name} must be a number, not null (or missing)"]
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        return [f"{name} must be {kind}, not {_shown(value)}"]
    if nan and value != value:
        return []
    if not -MAX_FIGURE <= value <= MAX_FIGURE:  # also NaN and the infinities
        return [f"{name} must be a finite number of magnitude at most {MAX_FIGURE:g}, not {_shown(value)}"]
    if positive and value <= 0:
        return [f"{name} must be above 0, not {_shown(value)}"]
    if not (positive or signed) and value < 0:
        return [f"{name} must be 0 or more, not {_shown(value)}"]
    return []


def _shown(value: Any) -> str:
    """``value`` as JSON spells it, cut to 60 characters; an object or an array by its kind alone."""
    if isinstance(value, (dict, list)):
        return f"an {'object' if isinstance(value, dict) else 'array'}"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _cost(row: dict[str, Any] | None) -> tuple[float | None, str]:
    """A layer's cycles (measured, else predicted) and which it is."""
    if row is None:
        return None, ""
    if row.get("cycles") is not None:
        return float(row["cycles"]), "tsim"
    if row.get("predicted") is not None:
        return float(row["predicted"]), "model"
    return None, ""


def compare(a: Report, b: Report) -> list[dict[str, Any]]:
    """Two runs layer by layer, matched by layer name (A's order, then layers only B has): where each ran, cycles
    (measured, else the cycle model's), energy (uJ) and the ratios B/A (None when either side lacks the value)."""
    rows_b = {r["layer"]: r for r in b.rows}
    names = [r["layer"] for r in a.rows] + [r["layer"] for r in b.rows if r["layer"] not in
                                             {x["layer"] for x in a.rows}]
    rows_a = {r["layer"]: r for r in a.rows}
    out = []
    for name in names:
        ra, rb = rows_a.get(name), rows_b.get(name)
        ca, kind_a = _cost(ra)
        cb, kind_b = _cost(rb)
        ea = ra.get("energy_uj") if ra else None
        eb = rb.get("energy_uj") if rb else None
        out.append({"layer": name, "op": (ra or rb or {}).get("op", ""), "where_a": ra["where"] if ra else None,
                    "where_b": rb["where"] if rb else None, "cycles_a": ca, "cycles_b": cb,
                    "cycles_from": "/".join(k for k in (kind_a, kind_b) if k),
                    "cycles_ratio": round(cb / ca, 4) if ca and cb is not None else None,
                    "energy_uj_a": ea, "energy_uj_b": eb,
                    "energy_ratio": round(eb / ea, 4) if ea and eb is not None else None})
    return out


def config_difference(a: Report, b: Report) -> str:
    """One line saying what differs between the designs and runs of ``a`` and ``b``: ``differs: BUS_BYTES 8 -> 16,
    target fsim -> tsim``, or that nothing does. Config fields come from the reports' ``config_fields`` (reports
    written before they were saved compare by canonical name only)."""
    changes = []
    fa, fb = a.config_fields or {}, b.config_fields or {}
    if fa and fb:
        changes += [f"{k} {fa.get(k, '-')} -> {fb.get(k, '-')}" for k in dict.fromkeys([*fa, *fb])
                    if fa.get(k) != fb.get(k)]
    elif a.config != b.config:
        changes.append(f"config {a.config} -> {b.config}")
    if not (fa and fb) and a.clock_mhz != b.clock_mhz:
        changes.append(f"clock {a.clock_mhz:g} -> {b.clock_mhz:g} MHz")
    unrecorded = []
    for what, va, vb in (("model", a.model, b.model), ("target", a.target, b.target), ("tech", a.tech, b.tech),
                         ("requant", a.extra.get("requant"), b.extra.get("requant"))):
        if what == "requant" and (va is None or vb is None):   # a report written by the Python API records none
            if va != vb:
                unrecorded.append(what)
        elif va != vb:
            changes.append(f"{what} {va or '-'} -> {vb or '-'}")
    note = f" ({', '.join(unrecorded)} recorded by one report only)" if unrecorded else ""
    return ("differs: " + ", ".join(changes) if changes else
            "differs: nothing in the config, model, target or technology (the same design run twice)") + note


ACCURACY_FIGURES = (("top1_agreement", "top-1 agreement", 100.0, "%"),
                    ("top5_agreement", "top-5 agreement", 100.0, "%"),
                    ("test_accuracy", "test accuracy", 100.0, "%"),
                    ("cosine", "cosine", 1.0, ""),
                    ("max_error_pct_of_range", "max error", 1.0, "% of range"))
"""(metric key, label, scale to print, unit) of the accuracy figures :func:`accuracy_difference` compares."""


def accuracy_difference(a: Report, b: Report) -> list[dict[str, Any]]:
    """The accuracy figures against the float model that both runs recorded (``extra["accuracy"]``, written by
    ``vta run``), per output and metric: ``{"output", "metric", "a", "b", "b_minus_a"}`` (fractions as recorded:
    agreements in [0, 1], the max error in % of the float output's range). Empty when either run has none."""
    out_a = (a.extra.get("accuracy") or {}).get("outputs", {})
    out_b = (b.extra.get("accuracy") or {}).get("outputs", {})
    rows = []
    for name in [n for n in out_a if n in out_b]:
        for key, *_ in ACCURACY_FIGURES:
            va, vb = out_a[name].get(key), out_b[name].get(key)
            if va is not None and vb is not None:
                rows.append({"output": name, "metric": key, "a": float(va), "b": float(vb),
                             "b_minus_a": float(vb) - float(va)})
    return rows


def format_accuracy_difference(rows: list[dict[str, Any]]) -> list[str]:
    """:func:`accuracy_difference` as lines, one per output: ``accuracy (output 'y', against float): top-1
    agreement 100% -> 94% (-6 points), ...``; nothing when there are no rows."""
    labels = {key: (label, scale, unit) for key, label, scale, unit in ACCURACY_FIGURES}
    by_output: dict[str, list[str]] = {}
    for r in rows:
        label, scale, unit = labels[r["metric"]]
        delta = scale * r["b_minus_a"]
        if unit:
            text = f"{label} {scale * r['a']:.4g}% -> {scale * r['b']:.4g}{unit} ({delta:+.3g} points)"
        else:
            text = f"{label} {r['a']:.6f} -> {r['b']:.6f} ({delta:+.3g})"
        by_output.setdefault(r["output"], []).append(text)
    return [line for name, parts in by_output.items()
            for line in textwrap.wrap(f"accuracy of output {name!r} against the float model, A -> B: "
                                      + "; ".join(parts), 120, subsequent_indent="    ")]


def format_comparison(a: Report, b: Report, label_a: str = "A", label_b: str = "B") -> str:
    """:func:`compare` as a text table with totals."""
    rows = compare(a, b)
    head = (f"{'layer':<28} {'where A/B':<11} {'cycles A':>11} {'cycles B':>11} {'B/A':>6} {'uJ A':>9} "
            f"{'uJ B':>9} {'B/A':>6}")
    lines = [f"A: {label_a}: {a.model} on {a.target} ({a.config})",
             f"B: {label_b}: {b.model} on {b.target} ({b.config})", config_difference(a, b),
             *format_accuracy_difference(accuracy_difference(a, b)), head, "-" * len(head)]
    for r in rows:
        where = f"{r['where_a'] or '-'}/{r['where_b'] or '-'}"
        lines.append(f"{r['layer'][:28]:<28} {where:<11} {_num(r['cycles_a'], 0):>11} {_num(r['cycles_b'], 0):>11} "
                     f"{_num(r['cycles_ratio'], 2):>6} {_num(r['energy_uj_a'], 3):>9} {_num(r['energy_uj_b'], 3):>9} "
                     f"{_num(r['energy_ratio'], 2):>6}")
    ca = sum(r["cycles_a"] or 0 for r in rows)
    cb = sum(r["cycles_b"] or 0 for r in rows)
    ea, eb = a.totals.get("energy_uj"), b.totals.get("energy_uj")
    lines.append("-" * len(head))
    lines.append(f"{'total':<28} {'':<11} {_num(ca, 0):>11} {_num(cb, 0):>11} "
                 f"{_num(cb / ca if ca else None, 2):>6} {_num(ea, 3):>9} {_num(eb, 3):>9} "
                 f"{_num(eb / ea if ea and eb is not None else None, 2):>6}")
    kinds = {k for r in rows for k in r["cycles_from"].split("/") if k}
    lines.append("cycles: " + (" and ".join(sorted(kinds)) if kinds else "none recorded")
                 + " (tsim: measured; model: the cycle model's prediction)")
    if a.model != b.model:
        lines.append(f"note: A ran {a.model} and B ran {b.model}; layers are matched by name")
    moved = [r["layer"] for r in rows if r["where_a"] and r["where_b"] and r["where_a"] != r["where_b"]]
    if moved:
        lines.append(f"placed differently: {', '.join(moved)}")
    return "\n".join(lines)


# ---- accuracy against the float model ------------------------------------------------------------------------------
BUDGET_METRICS = {"cosine": "cosine", "top1": "top1_agreement", "top5": "top5_agreement"}
"""``--accuracy-budget METRIC>=V`` names -> the :func:`.frontend.quantize.accuracy_vs_float` key they bound."""


def parse_budget(text: str) -> tuple[str, float]:
    """``--accuracy-budget``'s text -> (metric key, limit): ``X`` or ``X%`` bounds the largest error as % of the float
    output's range (``max_error_pct_of_range <= X``); ``cosine>=V``, ``top1>=V`` or ``top5>=V`` (V in [0, 1]) bound
    the cosine similarity or the top-1/top-5 agreement from below. ValueError naming the text otherwise."""
    spec = text.replace(" ", "").lower()
    name, sep, value = spec.partition(">=")
    try:
        if not sep:
            limit = float(spec.removesuffix("%"))
            if limit >= 0:
                return "max_error_pct_of_range", limit
        elif name in BUDGET_METRICS and 0.0 <= float(value) <= 1.0:
            return BUDGET_METRICS[name], float(value)
    except ValueError:
        pass
    raise ValueError(f"--accuracy-budget {text!r} is not a budget; give the largest error as % of the float output's "
                     f"range (e.g. 2 or 2%), or cosine>=V, top1>=V or top5>=V with V in [0, 1] (e.g. cosine>=0.99)")


def budget_failure(accuracy: Mapping[str, Any], budget: str) -> str | None:
    """The sentence saying how the run's ``accuracy`` (:func:`format_accuracy`'s data) exceeds ``budget``
    (:func:`parse_budget`), for the first output that does; None when every output keeps it. ValueError when no
    output has the budget's metric (top-1 of an output that is not ``[N, C]``)."""
    key, limit = parse_budget(budget)
    outputs = accuracy.get("outputs", {})
    measured = [(name, m[key]) for name, m in outputs.items() if m.get(key) is not None]
    if not measured:
        raise ValueError(f"--accuracy-budget {budget}: no output has {key} (top-1/top-5 need a classifier output "
                         f"[N, C]); bound the error instead, e.g. --accuracy-budget 2")
    for name, value in measured:
        if value != value:                                  # NaN: a NaN or an infinity in an output
            return (f"accuracy budget not met on output {name!r}: its {key} is not a number, since the float model's "
                    f"or the run's output holds NaN or infinite values (against {accuracy.get('reference')})")
        worse = value > limit if key == "max_error_pct_of_range" else value < limit
        if worse:
            what = f"max error {value:.3g}% of the float output's range > {limit:g}%" if \
                key == "max_error_pct_of_range" else f"{key} {value:.5g} < {limit:g}"
            return f"accuracy budget exceeded on output {name!r}: {what} (against {accuracy.get('reference')})"
    return None


def format_accuracy(accuracy: Mapping[str, Any]) -> list[str]:
    """The text lines of a run's error against the float model: ``accuracy`` is ``{"reference": which float model
    ran, "outputs": {output name: accuracy_vs_float's metrics}}``."""
    reference = str(accuracy.get("reference"))
    what = "the quantized file's own float computation" if reference.startswith("onnxruntime on the dequantized") \
        else "the quantized model as given" if "the quantized file" in reference else "the float model"
    lines = [f"error against {what} ({reference}):"]
    for name, m in accuracy.get("outputs", {}).items():
        lsb = "" if m.get("max_abs_error_lsb") is None else \
            f"max {_g(m['max_abs_error_lsb'])} LSB, mean {_g(m.get('mean_abs_error_lsb'))} LSB; "
        line = (f"  {name}: {lsb}max {_g(m.get('max_error_pct_of_range'))}% of range, mean "
                f"{_g(m.get('mean_error_pct_of_range'))}%; cosine {_g(m.get('cosine'), '.6f')}")
        for key, label in (("top1_agreement", "top-1"), ("top5_agreement", "top-5")):
            if m.get(key) is not None:
                line += f"; {label} agreement {100 * m[key]:.0f}%"
        kept = m.get("kept_tokens")
        if kept:
            lsb = "" if kept.get("max_abs_error_lsb") is None else f"max {_g(kept['max_abs_error_lsb'])} LSB, "
            line += (f"; on the {kept.get('tokens')} of {kept.get('of')} positions where {kept.get('mask', 'the mask')}"
                     f" is 1: {lsb}max {_g(kept.get('max_error_pct_of_range'))}% of range, cosine "
                     f"{_g(kept.get('cosine'), '.6f')}")
        lines.extend(textwrap.wrap(line, 120, subsequent_indent="    "))
    own = accuracy.get("file_own_cosine")
    if own:
        line = ("  for scale, the file's own quantization error: onnxruntime on the quantized file against its "
                "dequantized float graph (onnxruntime too), " + "; ".join(f"{name}: cosine {_g(c, '.6f')}"
                                                                        for name, c in own.items())
                + " (where this is low, two integer runs of the file that round differently land that far apart)")
        lines.extend(textwrap.wrap(line, 120, subsequent_indent="    "))
    lost = accuracy.get("where_lost")
    if lost:
        line = ("  where the error arises (the layers losing most cosine against the float model's same tensor, on "
                "the run's input): " + "; ".join(f"{e.get('node')} ({e.get('op')}) {_g(e.get('cosine_in'), '.4f')} "
                                                 f"-> {_g(e.get('cosine_out'), '.4f')}" for e in lost))
        lines.extend(textwrap.wrap(line, 120, subsequent_indent="    "))
    return lines


def format_int8_budget(choice: Mapping[str, Any]) -> str:
    """One line on the layers ``--int8-budget`` kept at int8 (:func:`vta.compiler.pipeline.compile_model`'s
    ``meta["int8_budget"]``): the budget, the layers, the agreement before and after and what it was measured on, and
    the kept layers' CPU time by the partitioner's estimate."""
    steps = choice.get("steps") or []
    kept = choice.get("kept") or []
    first = steps[0].get("top1_agreement_pct") if steps else None
    last = steps[-1].get("top1_agreement_pct") if steps else None
    what = (f"kept {', '.join(kept)} at int8 on the CPU" if kept else "kept no layer at int8 (the narrow model is "
            "within the budget)")
    cost = choice.get("cpu_us_of_kept")
    return (f"int8 budget {_g(choice.get('budget_points'), 'g')} points of top-1 agreement: {what}; agreement "
            f"{first}% -> {last}% on {choice.get('measured_on')}"
            + (f"; the kept layers take {cost:,.1f} us on the CPU (partitioner's estimate)" if kept and cost else ""))


def format_calibration(info: Mapping[str, Any]) -> str:
    """One line saying what the model was calibrated on (an artefact's ``meta["calibration"]``)."""
    method = str(info.get("method", "minmax")) + (f" {info['percentile']:g}" if "percentile" in info else "")
    kind = f"{info['kind']}, " if "kind" in info else ""
    pre = f", preprocess {info['preprocess']}" if "preprocess" in info else ""
    note = " -- NOT your data: the error above says nothing about real inputs" if \
        info.get("source") == "random normal" else ""
    if info.get("completed"):
        note += (f"; a pre-quantized file run on its own integers, with {info['completed']} (the activations' "
                 f"ranges from these samples)")
    if info.get("ranges_from_file"):
        note = (f"; {info['ranges_from_file']} activation ranges taken from the quantized file (its own "
                f"calibration), the rest from random data")
    count = info.get("samples")
    return f"calibration: {info.get('source')} ({kind}{count} sample{'' if count == 1 else 's'}, {method}{pre}){note}"


NARROW = (("layer", -22, "layer"), ("op", -10, "op"), ("where", -5, "where"), ("out shape", 11, "out_shape"),
          ("MACs", 11, "macs"), ("cycles", 11, "cycles"), ("util", 4, "util"), ("predicted", 11, "predicted"),
          ("bound", -7, "bound"), ("bytes", 10, "bytes"), ("host ms", 8, "ms"))
"""The default per-layer table's columns (label, width: negative left-aligned, row key): 120 columns."""
WIDE = (("layer", -40, "layer"), ("op", -13, "op"), ("where", -5, "where"), ("in shape", 14, "in_shape"),
        ("out shape", 14, "out_shape"), ("MACs", 13, "macs"), ("gemm uops", 11, "gemm_uops"),
        ("alu uops", 10, "alu_uops"), ("cycles", 11, "cycles"), ("util", 4, "util"), ("predicted", 11, "predicted"),
        ("bound", -7, "bound"), ("bytes", 11, "bytes"), ("host ms", 9, "ms"))
"""``--wide``: every column of the per-layer table, names whole up to 40 characters."""
_TABLE_CELLS = {
    "layer": lambda r: r["layer"], "op": lambda r: r["op"], "where": lambda r: r["where"],
    "in_shape": lambda r: r.get("in_shape") or "-", "out_shape": lambda r: r.get("out_shape") or "-",
    "macs": lambda r: f"{r['macs']:,}", "gemm_uops": lambda r: f"{r['gemm_uops']:,}",
    "alu_uops": lambda r: f"{r['alu_uops']:,}", "cycles": lambda r: _opt(r["cycles"]),
    "util": lambda r: _pct(r["util"]),
    "predicted": lambda r: _opt(r["predicted"]), "bound": lambda r: row_bound(r)[0] or "-",
    "bytes": lambda r: f"{r['bytes']:,}", "ms": lambda r: f"{r['ms']:,.2f}"}


_REASONS_NOTE = ("reasons: the partitioner's estimates, not measurements: the accelerator's micro-ops or DMA bytes "
                 "at the config's CLOCK_MHZ ({mhz:g} MHz, not the design clock above) plus 5 us a launch; the CPU at "
                 "2,000 MACs and 500 elements per us, or the operator's measured rate where it differs most (the float "
                 "softmax 24, the LayerNorm 290, copies 2,100-86,000); layout conversions at 1,000 bytes per us "
                 "(compiler/lowering/partition.py)")
"""The line ``format(reasons=True)`` adds: what the reasons' microseconds are (:mod:`.lowering.partition`'s
constants, checked equal by a test)."""


def row_bound(row: Mapping[str, Any]) -> tuple[str, str]:
    """A layer's bounding module and what it comes from: ``"counters"`` (:func:`layer_bound` over the core's cycle
    classes of :data:`BOUND_CLASSES`, where the row has them: tsim) or ``"cycle model"`` (the row's predicted
    ``bound``); ``("", "")`` for a layer with neither (CPU). The run's ``totals["bound"]`` weighs these per layer."""
    if row.get("cycles") is not None and row.get("compute_busy") is not None:
        return layer_bound({m: sum(row.get(f"{m}_{c}") or 0 for c in BOUND_CLASSES) for m in MODULES}), "counters"
    return (str(row["bound"]), "cycle model") if row.get("bound") else ("", "")


def _cell(text: str, width: int) -> str:
    """``text`` in ``abs(width)`` characters (left-aligned when ``width`` < 0); a longer number is written with an SI
    prefix (``1,813,561,344`` -> ``1.814 G``), a longer text keeps its start and its end (``conv_1..ock.3.conv``:
    layer names differ most at the end)."""
    n = abs(width)
    if len(text) > n:
        text = _si(text, n)
    if len(text) > n:
        keep = n - 2
        text = text[:keep // 2] + ".." + text[len(text) - (keep - keep // 2):]
    return f"{text:<{n}}" if width < 0 else f"{text:>{n}}"


def _si(text: str, width: int) -> str:
    """A number written with thousands separators (``1,813,561,344``) in at most ``width`` characters with an SI
    prefix (``1.814 G``); any other text unchanged."""
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return text
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            for digits in (3, 2, 1, 0):
                short = f"{value / scale:.{digits}f} {prefix}"
                if len(short) <= width:
                    return short
    return text


def _g(value: float | None, spec: str = ".3g") -> str:
    """A saved figure formatted with ``spec``; ``-`` for None (a figure the report does not hold)."""
    return "-" if value is None else format(value, spec)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _optional_float(value: Any) -> float | None:
    """``value`` as a float, None kept (a saved report's optional number)."""
    return None if value is None else float(value)


def _static_mw(tech: Tech, area_clb: float) -> float:
    """Static power (mW) of a design of ``area_clb`` CLB-equivalents in ``tech``: :func:`vta.energy.static_pj` over
    one millisecond, in nanojoules, is milliwatts."""
    return round(static_pj(tech, area_clb, 1e-3) * 1e-6, 6)


def _opt(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def build_report(compiled: Compiled, out: RunOutput, *, model: str | None = None,
                 tech: Tech | None = None, clock: Clock | None = None) -> Report:
    """The :class:`Report` of run ``out`` of ``compiled``; energies from ``tech`` (default: the 45 nm table); times
    at ``clock`` (default :func:`vta.clock.design_clock` of the config)."""
    clock = clock if clock is not None else design_clock(compiled.cfg)
    tech = tech if tech is not None else load_tech()
    steps = {s.node.name: s for s in compiled.steps}
    cfg = compiled.cfg
    rows = []
    for stat in out.layers:
        step = steps.get(stat.layer)
        decision = compiled.decisions.get(stat.layer)
        row = asdict(stat)
        accel = step if isinstance(step, AccelStep) and stat.where == "accel" else None
        util = stat.macs / (stat.cycles * cfg.macs_per_cycle) if stat.cycles and stat.macs else None
        rows.append({"layer": stat.layer, "op": stat.op, **_shapes(compiled, step), "where": stat.where,
                     "macs": stat.macs,
                     "gemm_uops": row["gemm_uops"], "alu_uops": row["alu_uops"], "cycles": stat.cycles,
                     "util": None if util is None else round(util, 4),
                     "predicted": accel.predicted_cycles if accel else None,
                     "bound": accel.schedule.get("bound", "") if accel else "",
                     "bytes": stat.bytes_moved, "ms": round(stat.seconds * 1e3, 3), "conversions": stat.conversions,
                     "tiling": step.tiling if isinstance(step, AccelStep) and stat.where == "accel" else "",
                     "reason": decision.reason if decision else "",
                     **{f"{m}_{c}": stat.modules[m][c] if stat.modules else None
                        for m in MODULES for c in CYCLE_CLASSES},
                     **_traffic(stat.counters, stat.macs, stat.cycles)})
        _fill_energy(rows[-1], cfg, tech)
    area = estimate_area(cfg).area_clb
    return Report(model or compiled.graph.name, out.config, out.target, rows, cfg.macs_per_cycle, clock.mhz,
                  bus_bytes=cfg.bus_bytes, config_fields=cfg.to_dict(), tech=tech.name, clock_source=clock.source,
                  clock_note=clock.note, area_clb=area, static_mw=_static_mw(tech, area))


def _shapes(compiled: Compiled, step: Any) -> dict[str, str]:
    """A layer's ``in_shape`` (its first input's) and ``out_shape`` as ``1x16x8x8``; empty where unknown."""
    def text(name: str) -> str:
        try:
            return "x".join(str(d) for d in compiled.graph.shape(name))
        except (KeyError, ValueError):
            return ""
    node = getattr(step, "node", None)
    if node is None:
        return {"in_shape": "", "out_shape": ""}
    return {"in_shape": text(node.inputs[0]) if node.inputs else "",
            "out_shape": text(node.outputs[0]) if node.outputs else ""}


def _traffic(counters: dict[str, int] | None, macs: int, cycles: int | None) -> dict[str, Any]:
    """The byte, ``hw_macs``, ``intensity`` and ``macs_per_cycle`` columns of a layer from its statistics."""
    if not counters:
        return {k: None for k in BYTE_COLUMNS + ("hw_macs", "intensity", "macs_per_cycle")}
    out: dict[str, Any] = {k: int(counters.get(k, 0)) for k in BYTE_COLUMNS}
    dram = sum(out.values())
    out.update(hw_macs=int(counters.get("macs", macs)), intensity=round(macs / dram, 4) if dram else None,
               macs_per_cycle=round(macs / cycles, 3) if cycles else None)
    return out


def _fill_energy(row: dict[str, Any], cfg: VTAConfig, tech: Tech) -> None:
    """Set ``row``'s energy columns (microjoules): an accelerator layer's from its statistics, a fallback layer's at
    ``tech.cpu_mac_pj`` per MAC; None for an accelerator layer without statistics."""
    row.update(dict.fromkeys(ENERGY_COLUMNS))
    counts = None
    if row["where"] == "accel" and row.get(BYTE_COLUMNS[0]) is not None:
        counts = {k: int(row[k]) for k in BYTE_COLUMNS}
        counts.update(macs=int(row.get("hw_macs") or row["macs"]), gemm_uops=int(row["gemm_uops"]),
                      alu_uops=int(row["alu_uops"]))
    parts = step_energy(row["where"], counts, row["macs"], cfg, tech)
    if parts is None:
        return
    for part, pj in parts.items():
        row[f"energy_{part}_uj"] = round(pj * 1e-6, 9)
    row["energy_uj"] = round(sum(parts.values()) * 1e-6, 9)
