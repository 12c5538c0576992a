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
import io
import json
from dataclasses import asdict, dataclass, field
from os import PathLike
from typing import Any

from vta.counters import CYCLE_CLASSES, MODULES
from vta.fileio import atomic_path, atomic_write_text

from .runtime import AccelStep, Compiled, RunOutput

__all__ = ["Report", "build_report", "COLUMNS", "MODULE_COLUMNS"]

MODULE_COLUMNS = tuple(f"{m}_{c}" for m in MODULES for c in CYCLE_CLASSES)
"""Per-module cycle classes from the core's counters (tsim only, else None): e.g. ``compute_busy``,
``load_wait_token``, ``store_wait_mem``; a module's idle cycles are the layer's cycles minus the three."""
COLUMNS = ("layer", "op", "where", "macs", "gemm_uops", "alu_uops", "cycles", "util", "predicted", "bound", "bytes",
           "ms", "conversions", "tiling", "reason") + MODULE_COLUMNS
"""``predicted``: the cycle model's cycles for an accelerator layer's program (any target; None on the CPU);
``bound``: the module the model says bounds it (``load``, ``compute``, ``store``; empty on the CPU)."""


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
        predicted = [r["predicted"] for r in self.rows if r.get("predicted") is not None]
        util = round(accel_macs / (accel_cycles * self.macs_per_cycle), 4) if accel_cycles else None
        at_clock = round(accel_cycles / self.clock_mhz / 1e3, 3) if accel_cycles else None
        return {"layers": len(self.rows), "accel_layers": sum(r["where"] == "accel" for r in self.rows),
                "cpu_layers": sum(r["where"] == "cpu" for r in self.rows), "macs": total("macs"),
                "accel_macs": accel_macs, "gemm_uops": total("gemm_uops"), "alu_uops": total("alu_uops"),
                "cycles": accel_cycles, "util": util, "predicted": int(sum(predicted)) if predicted else None,
                "accel_ms_at_clock": at_clock, "bytes": total("bytes"),
                "ms": round(sum(r["ms"] for r in self.rows), 3), "conversions": total("conversions")}

    # ---- output -------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "config": self.config, "target": self.target, "layers": self.rows,
                "totals": self.totals, **self.extra}

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

    def format(self, *, reasons: bool = False) -> str:
        """The table as text: one line per layer, then totals."""
        head = (f"{'layer':<28} {'op':<13} {'where':<5} {'MACs':>13} {'gemm uops':>11} {'alu uops':>10} "
                f"{'cycles':>11} {'util':>5} {'predicted':>11} {'bound':<7} {'bytes':>11} {'ms':>9}")
        lines = [f"{self.model} on {self.target} ({self.config})", head, "-" * len(head)]
        for r in self.rows:
            line = (f"{r['layer'][:28]:<28} {r['op'][:13]:<13} {r['where']:<5} {r['macs']:>13,} "
                    f"{r['gemm_uops']:>11,} {r['alu_uops']:>10,} {_opt(r['cycles']):>11} {_pct(r['util']):>5} "
                    f"{_opt(r['predicted']):>11} {r['bound'] or '-':<7} {r['bytes']:>11,} "
                    f"{r['ms']:>9.2f}")
            if reasons:
                line += f"  {r['reason']}"
            lines.append(line)
        t = self.totals
        lines.append("-" * len(head))
        lines.append(f"{'total':<28} {str(t['accel_layers']) + ' accel':<13} {'':<5} {t['macs']:>13,} "
                     f"{t['gemm_uops']:>11,} {t['alu_uops']:>10,} {_opt(t['cycles']):>11} {_pct(t['util']):>5} "
                     f"{_opt(t['predicted']):>11} {'':<7} {t['bytes']:>11,} "
                     f"{t['ms']:>9.2f}")
        if t["accel_ms_at_clock"] is not None:
            lines.append(f"accelerator time at {self.clock_mhz:g} MHz: {t['accel_ms_at_clock']:,} ms "
                         f"({t['cycles']:,} cycles)")
        lines.append(f"layout conversions at partition boundaries: {t['conversions']}; "
                     f"{t['accel_macs']:,} of {t['macs']:,} MACs on the accelerator")
        lines.extend(self.format_modules())
        for key, value in self.extra.items():
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

    def plot(self, path: str | PathLike[str]) -> None:
        """A bar chart per layer of cycles (tsim) or GEMM + ALU micro-ops (fsim), coloured by placement (PNG/SVG by
        ``path``'s suffix), written atomically."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        use_cycles = any(r["cycles"] is not None for r in self.rows)
        values = [(r["cycles"] or 0) if use_cycles else r["gemm_uops"] + r["alu_uops"] for r in self.rows]
        colours = ["tab:blue" if r["where"] == "accel" else "tab:gray" for r in self.rows]
        per_module = self.module_breakdown() is not None
        width = max(6.0, 0.22 * len(self.rows))
        fig, axes = plt.subplots(2 if per_module else 1, 1, figsize=(width, 7.0 if per_module else 4.0),
                                 sharex=True, squeeze=False)
        ax = axes[0][0]
        ax.bar(range(len(values)), values, color=colours)
        ax.set_ylabel("cycles" if use_cycles else "micro-ops (GEMM + ALU)")
        ax.set_title(f"{self.model} on {self.target} ({self.config})\nblue: accelerator, grey: CPU", fontsize=9)
        if per_module:
            self._plot_compute_classes(axes[1][0])
        bottom = axes[-1][0]
        bottom.set_xticks(range(len(values)))
        bottom.set_xticklabels([r["layer"] for r in self.rows], rotation=90, fontsize=6)
        fig.tight_layout()
        try:
            with atomic_path(path) as tmp:  # the temporary name keeps the suffix that picks the format
                fig.savefig(tmp)
        finally:
            plt.close(fig)


    def _plot_compute_classes(self, ax: Any) -> None:
        """Stacked bars: each accelerator layer's cycles split into the compute module's busy/wait/idle cycles."""
        x = range(len(self.rows))
        bottom = [0.0] * len(self.rows)
        colours = {"busy": "tab:green", "wait_token": "tab:orange", "wait_mem": "tab:red", "idle": "lightgray"}
        for c, colour in colours.items():
            heights = []
            for r in self.rows:
                if r["cycles"] is None or r.get("compute_busy") is None:
                    heights.append(0.0)
                elif c == "idle":
                    heights.append(max(0, r["cycles"] - sum(r[f"compute_{k}"] for k in CYCLE_CLASSES)))
                else:
                    heights.append(r[f"compute_{c}"])
            ax.bar(x, heights, bottom=bottom, color=colour, label=f"compute {c}")
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_ylabel("cycles")
        ax.set_title("compute module: busy, waiting on a token, waiting on memory, idle", fontsize=9)
        ax.legend(fontsize=7)


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
        accel = step if isinstance(step, AccelStep) and stat.where == "accel" else None
        util = stat.macs / (stat.cycles * cfg.macs_per_cycle) if stat.cycles and stat.macs else None
        rows.append({"layer": stat.layer, "op": stat.op, "where": stat.where, "macs": stat.macs,
                     "gemm_uops": row["gemm_uops"], "alu_uops": row["alu_uops"], "cycles": stat.cycles,
                     "util": None if util is None else round(util, 4),
                     "predicted": accel.predicted_cycles if accel else None,
                     "bound": accel.schedule.get("bound", "") if accel else "",
                     "bytes": stat.bytes_moved, "ms": round(stat.seconds * 1e3, 3), "conversions": stat.conversions,
                     "tiling": step.tiling if isinstance(step, AccelStep) and stat.where == "accel" else "",
                     "reason": decision.reason if decision else "",
                     **{f"{m}_{c}": stat.modules[m][c] if stat.modules else None
                        for m in MODULES for c in CYCLE_CLASSES}})
    return Report(model or compiled.graph.name, out.config, out.target, rows, cfg.macs_per_cycle, cfg.clock_mhz)
