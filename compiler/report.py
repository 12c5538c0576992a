"""Per-layer reports of a compiled model's run: a text table, JSON, CSV and a plot.

:func:`build_report` joins a :class:`~.runtime.RunOutput` (what each step did) with the
:class:`~.runtime.Compiled` artefact (why each node runs where it does, the tiling chosen) into a :class:`Report`:
one row per layer plus totals. Units: ``macs`` multiply-accumulates; ``gemm_uops``/``alu_uops`` micro-op
iterations (fsim and tsim); ``cycles`` clock cycles (tsim only, else None); ``bytes`` DMA bytes loaded and stored
by the accelerator; ``ms`` wall-clock milliseconds of the step on this machine (simulation time, not accelerator
time); ``util`` the fraction of the GEMM core's peak (``BATCH * BLOCK_IN * BLOCK_OUT`` MACs per cycle) the layer
achieved (tsim only). The totals add ``accel_ms_at_clock``: the accelerator cycles at the config's clock.
"""
from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from os import PathLike
from typing import Any

from .runtime import AccelStep, Compiled, RunOutput

__all__ = ["Report", "build_report", "COLUMNS"]

COLUMNS = ("layer", "op", "where", "macs", "gemm_uops", "alu_uops", "cycles", "util", "bytes", "ms", "conversions",
           "tiling", "reason")


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

    @property
    def totals(self) -> dict[str, Any]:
        """Sums over layers; ``accel_layers``/``cpu_layers`` count placements; ``cycles`` None without tsim."""
        def total(key: str) -> int:
            return int(sum(r[key] or 0 for r in self.rows))
        cycles = [r["cycles"] for r in self.rows if r["cycles"] is not None]
        accel_macs = sum(r["macs"] for r in self.rows if r["where"] == "accel")
        accel_cycles = int(sum(cycles)) if cycles else None
        util = round(accel_macs / (accel_cycles * self.macs_per_cycle), 4) if accel_cycles else None
        at_clock = round(accel_cycles / self.clock_mhz / 1e3, 3) if accel_cycles else None
        return {"layers": len(self.rows), "accel_layers": sum(r["where"] == "accel" for r in self.rows),
                "cpu_layers": sum(r["where"] == "cpu" for r in self.rows), "macs": total("macs"),
                "accel_macs": accel_macs, "gemm_uops": total("gemm_uops"), "alu_uops": total("alu_uops"),
                "cycles": accel_cycles, "util": util, "accel_ms_at_clock": at_clock, "bytes": total("bytes"),
                "ms": round(sum(r["ms"] for r in self.rows), 3), "conversions": total("conversions")}

    # ---- output -------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "config": self.config, "target": self.target, "layers": self.rows,
                "totals": self.totals, **self.extra}

    def write_json(self, path: str | PathLike[str]) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, default=_json_default)

    def write_csv(self, path: str | PathLike[str]) -> None:
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
            writer.writeheader()
            for row in self.rows:
                writer.writerow({k: "" if row[k] is None else row[k] for k in COLUMNS})

    def format(self, *, reasons: bool = False) -> str:
        """The table as text: one line per layer, then totals."""
        head = (f"{'layer':<28} {'op':<13} {'where':<5} {'MACs':>13} {'gemm uops':>11} {'alu uops':>10} "
                f"{'cycles':>11} {'util':>5} {'bytes':>11} {'ms':>9}")
        lines = [f"{self.model} on {self.target} ({self.config})", head, "-" * len(head)]
        for r in self.rows:
            line = (f"{r['layer'][:28]:<28} {r['op'][:13]:<13} {r['where']:<5} {r['macs']:>13,} "
                    f"{r['gemm_uops']:>11,} {r['alu_uops']:>10,} {_opt(r['cycles']):>11} {_pct(r['util']):>5} "
                    f"{r['bytes']:>11,} "
                    f"{r['ms']:>9.2f}")
            if reasons:
                line += f"  {r['reason']}"
            lines.append(line)
        t = self.totals
        lines.append("-" * len(head))
        lines.append(f"{'total':<28} {str(t['accel_layers']) + ' accel':<13} {'':<5} {t['macs']:>13,} "
                     f"{t['gemm_uops']:>11,} {t['alu_uops']:>10,} {_opt(t['cycles']):>11} {_pct(t['util']):>5} "
                     f"{t['bytes']:>11,} "
                     f"{t['ms']:>9.2f}")
        if t["accel_ms_at_clock"] is not None:
            lines.append(f"accelerator time at {self.clock_mhz:g} MHz: {t['accel_ms_at_clock']:,} ms "
                         f"({t['cycles']:,} cycles)")
        lines.append(f"layout conversions at partition boundaries: {t['conversions']}; "
                     f"{t['accel_macs']:,} of {t['macs']:,} MACs on the accelerator")
        for key, value in self.extra.items():
            lines.append(f"{key}: {value}")
        return "\n".join(lines)

    def plot(self, path: str | PathLike[str]) -> None:
        """A bar chart per layer of cycles (tsim) or GEMM + ALU micro-ops (fsim), coloured by placement (PNG/SVG)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        use_cycles = any(r["cycles"] is not None for r in self.rows)
        values = [(r["cycles"] or 0) if use_cycles else r["gemm_uops"] + r["alu_uops"] for r in self.rows]
        colours = ["tab:blue" if r["where"] == "accel" else "tab:gray" for r in self.rows]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.22 * len(self.rows)), 4.0))
        ax.bar(range(len(values)), values, color=colours)
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels([r["layer"] for r in self.rows], rotation=90, fontsize=6)
        ax.set_ylabel("cycles" if use_cycles else "micro-ops (GEMM + ALU)")
        ax.set_title(f"{self.model} on {self.target} ({self.config})\nblue: accelerator, grey: CPU", fontsize=9)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def _opt(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def build_report(compiled: Compiled, out: RunOutput, *, model: str | None = None) -> Report:
    """The :class:`Report` of run ``out`` of ``compiled``."""
    steps = {s.node.name: s for s in compiled.steps}
    cfg = compiled.cfg
    rows = []
    for stat in out.layers:
        step = steps.get(stat.layer)
        decision = compiled.decisions.get(stat.layer)
        row = asdict(stat)
        util = stat.macs / (stat.cycles * cfg.macs_per_cycle) if stat.cycles and stat.macs else None
        rows.append({"layer": stat.layer, "op": stat.op, "where": stat.where, "macs": stat.macs,
                     "gemm_uops": row["gemm_uops"], "alu_uops": row["alu_uops"], "cycles": stat.cycles,
                     "util": None if util is None else round(util, 4),
                     "bytes": stat.bytes_moved, "ms": round(stat.seconds * 1e3, 3), "conversions": stat.conversions,
                     "tiling": step.tiling if isinstance(step, AccelStep) and stat.where == "accel" else "",
                     "reason": decision.reason if decision else ""})
    return Report(model or compiled.graph.name, out.config, out.target, rows, cfg.macs_per_cycle, cfg.clock_mhz)
