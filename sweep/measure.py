"""Measure one sweep point in a worker: compile the model for the design, then predict or simulate it.

``model`` mode: :func:`vta.compiler.pipeline.plan_graph` for the config (the model is loaded and quantized once per
worker: quantization does not depend on the config): the compile's partition and schedule search with the cycle model's
prediction (:func:`vta.cost.estimate`) and event counts of every accelerator layer's program, without keeping
programs; :func:`vta.area.estimate_area` and :mod:`vta.energy` over the layers' counters. ``exact`` mode:
:func:`vta.compiler.pipeline.compile_graph`, then :func:`vta.compiler.runtime.executor.run` on the ``tsim`` target
(Verilator; cycles from the core's counters; a build per config, minutes each). A point's area is the analytical
model's, or with ``area = "yosys"`` (the default in exact mode) the sum of its modules' Yosys counts
(:func:`vta.sweep.synth.synth_design`, each distinct module synthesized once and cached). In both modes the layers the
partitioner leaves on the CPU are charged the partitioner's own CPU-time estimate (``Decision.cpu_us``), run in sequence
with the accelerator layers; conversions between layouts and program launches are not charged.

Timeouts: in a process's main thread (local worker processes) an interval timer interrupts the point after
``timeout`` seconds; elsewhere (Dask worker threads) the deadline is checked between compile and each layer's
measurement, and a point that finishes late is still recorded as timed out.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any, Iterator

from vta.area import Area, estimate_area
from vta.clock import design_clock
from vta.config import VTAConfig
from vta.counts import program_counts
from vta.energy import load_tech, static_pj

from .spec import Point

__all__ = ["measure", "PointTimeout", "COMPILE_CACHE_SIZE"]

COMPILE_CACHE_SIZE = 8
"""Compiled models each worker keeps (least recently used dropped first), keyed by (model, config name, knobs)."""

_compiled: OrderedDict[tuple[str, str, str], Any] = OrderedDict()
_search: list[Any] = []
"""The worker's one :class:`vta.compiler.lowering.search.SearchCache`, made on first use: the schedule searches and
candidate plans of one point serve the next (designs that differ only in buffer sizes share most candidates)."""


def _search_cache() -> Any:
    if not _search:
        from vta.compiler.lowering.search import SearchCache
        _search.append(SearchCache())
    return _search[0]


class PointTimeout(BaseException):
    """A point ran past its timeout. A BaseException, as KeyboardInterrupt is, so that the interval timer's raise
    goes through libraries' ``except Exception`` (the ONNX loader would report it as a bad model file)."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class _Deadline:
    """The point's deadline: an interval timer where signals can be used, and :meth:`check` everywhere."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout
        self._armed = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
        self._old: Any = None

    def __enter__(self) -> "_Deadline":
        if self._armed:
            self._old = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old)

    def _fire(self, signum: int, frame: Any) -> None:
        raise PointTimeout(f"the point ran past its timeout of {self.timeout:g} s")

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise PointTimeout(f"the point ran past its timeout of {self.timeout:g} s")


def _quantized(model: str, cfg: VTAConfig) -> Any:
    """The quantized graph of ``model`` at ``cfg``'s input and weight widths (:func:`vta.sweep.accuracy.quantized`:
    one calibration per model in a worker, one quantization per width pair, shared with the accuracy objective)."""
    from .accuracy import quantized
    return quantized(model, cfg.inp_width, cfg.wgt_width)


def _compile(model: str, cfg: VTAConfig, knobs: dict[str, Any], mode: str) -> tuple[Any, float]:
    """(the compiled model -- in ``model`` mode its plan, :func:`vta.compiler.pipeline.plan_graph`, without
    programs --, compile seconds; 0 when it came from the worker's cache)."""
    from vta.compiler.pipeline import compile_graph, plan_graph
    key = (model, cfg.name, json.dumps(knobs, sort_keys=True) + mode)
    if key in _compiled:
        _compiled.move_to_end(key)
        return _compiled[key], 0.0
    start = time.perf_counter()
    build = plan_graph if mode == "model" else compile_graph
    compiled = build(_quantized(model, cfg), cfg, policy=knobs["policy"], double_buffer=knobs["double_buffer"],
                     search_cache=_search_cache())
    _compiled[key] = compiled
    while len(_compiled) > COMPILE_CACHE_SIZE:
        _compiled.popitem(last=False)
    return compiled, time.perf_counter() - start


def _layer_costs(compiled: Any, mode: str, deadline: _Deadline) -> Iterator[tuple[Any, int, str, dict[str, int]]]:
    """(the graph node, cycles, bounding module, event counts) of each accelerator layer: in ``model`` mode the plan's
    prediction, in ``exact`` mode tsim's cycles and the bound of the core's counters by the same rule
    (:func:`vta.compiler.report.layer_bound` over :func:`vta.compiler.report.module_demand`: the module working or
    waiting on memory the most cycles, fetch excluded) with
    the program's counts."""
    if mode == "model":
        for layer in compiled.layers:
            deadline.check()
            yield layer.node, layer.plan.cycles, layer.plan.bound, layer.plan.counts
        return
    from vta.compiler.pipeline import random_inputs
    from vta.compiler.report import layer_bound, module_demand
    from vta.compiler.runtime.compiled import AccelStep
    from vta.compiler.runtime.executor import run
    steps = [s for s in compiled.steps if isinstance(s, AccelStep)]
    # built without PGO: a sweep runs each model once, where PGO's second compile costs more than it saves
    out = run(compiled, random_inputs(compiled.graph, seed=0), target="tsim", backend_options={"pgo": False})
    by_name = {layer.layer: layer for layer in out.layers}
    for step in steps:
        layer = by_name[step.node.name]
        bound = layer_bound(module_demand(layer.modules or {}))
        yield step.node, int(layer.cycles or 0), bound, program_counts(step.program)


def _evaluate(point: Point, deadline: _Deadline) -> dict[str, Any]:
    """The measured columns of an ok point (see :mod:`vta.sweep.store`): ``bound`` and ``energy_uj`` by the run
    report's definitions (:func:`vta.compiler.report.run_bound`, :func:`vta.compiler.report.step_energy`: dynamic
    energy), ``energy_total_uj`` with the static energy."""
    from vta.compiler.report import run_bound, step_energy
    cfg = point.design.cfg
    assert cfg is not None
    tech = load_tech(point.tech)
    compiled, compile_s = _compile(point.model, cfg, point.design.knobs, point.mode)
    deadline.check()
    start = time.perf_counter()
    cycles = accel_macs = 0
    energy: dict[str, float] = {}
    bounds: list[tuple[str, int]] = []
    layers: dict[str, dict[str, Any]] = {}
    for node, layer_cycles, bound, counts in _layer_costs(compiled, point.mode, deadline):
        cycles += layer_cycles
        bounds.append((bound, layer_cycles))
        accel_macs += counts["macs"]
        parts = step_energy("accel", counts, counts["macs"], cfg, tech) or {}
        for part, pj in parts.items():
            energy[part] = energy.get(part, 0.0) + pj
        layers[node.name] = {"layer": node.name, "op": node.op, "where": "accel", "cycles": layer_cycles,
                             "bound": bound, "macs": counts["macs"], "energy_uj": sum(parts.values()) * 1e-6}
    area = estimate_area(cfg)
    area_s = 0.0
    if point.area == "yosys":
        area, area_s = _yosys_area(cfg, deadline)
    cpu = compiled.cpu if point.mode == "model" else [s for s in compiled.steps if s.where == "cpu"]
    cpu_us = sum(compiled.decisions[s.node.name].cpu_us or 0.0 for s in cpu)
    cpu_macs = sum(s.macs for s in cpu)
    clock = design_clock(cfg, measured=False)  # every point's clock from the model (or the spec's CLOCK_MHZ)
    latency_us = cycles / clock.mhz + cpu_us
    energy["cpu"] = 0.0
    for step in cpu:  # at the fallback's cost per MAC, as in a run report
        pj = (step_energy(step.where, None, step.macs, cfg, tech) or {}).get("cpu", 0.0)
        energy["cpu"] += pj
        layers[step.node.name] = {"layer": step.node.name, "op": step.node.op, "where": "cpu", "macs": step.macs,
                                  "cpu_us": compiled.decisions[step.node.name].cpu_us, "energy_uj": pj * 1e-6}
    dynamic = sum(energy.values())
    energy["static"] = static_pj(tech, area.area_clb, latency_us * 1e-6)
    accel_layers = len(compiled.layers) if point.mode == "model" else compiled.accel_steps
    from .accuracy import model_accuracy  # the quantized model's accuracy at the design's widths (cached)
    try:
        accuracy = model_accuracy(point.model, cfg.inp_width, cfg.wgt_width)
    except Exception as err:  # noqa: BLE001 - the point's other figures stand; the column says why it is empty
        accuracy = {"accuracy": None, "accuracy_on": f"not measured: {type(err).__name__}: {err}"}
    return {
        "accuracy": accuracy["accuracy"], "accuracy_on": accuracy["accuracy_on"],
        "cycles": cycles, "cpu_us": round(cpu_us, 3), "latency_us": round(latency_us, 3),
        "inferences_per_s": 1e6 / latency_us if latency_us else None,
        "clock_mhz": clock.mhz, "clock_source": clock.source, "critical_unit": clock.unit,
        "utilization": accel_macs / (cycles * cfg.macs_per_cycle) if cycles else 0.0,
        "macs": accel_macs + cpu_macs, "accel_macs": accel_macs, "accel_layers": accel_layers,
        "cpu_layers": len(cpu), "bound": run_bound(bounds),
        "lut": area.lut, "ff": area.ff, "dsp": area.dsp, "bram": area.bram, "area_clb": area.area_clb,
        "energy_uj": dynamic * 1e-6, "energy_total_uj": sum(energy.values()) * 1e-6,
        "energy": {k: v * 1e-6 for k, v in sorted(energy.items())},
        "compile_s": round(compile_s, 4), "measure_s": round(time.perf_counter() - start, 4),
        "area_from": point.area, "area_s": round(area_s, 2),
        "layers": [layers[name] for name in compiled.decisions if name in layers],
    }


def _yosys_area(cfg: VTAConfig, deadline: _Deadline) -> tuple[Area, float]:
    """``cfg``'s area from per-module Yosys synthesis (:func:`vta.sweep.synth.synth_design`) and its seconds. One
    process of the sweep synthesizes at a time (a lock in the module cache's folder), with every core: the designs of a
    sweep share most modules, and two workers starting cold would otherwise both synthesize them. A point runs its
    simulation first, so a worker waiting here has already done the rest of its work."""
    from vta.cache import cache_root, entry_lock

    from .synth import synth_design
    folder = cache_root("area-modules")
    folder.mkdir(parents=True, exist_ok=True)
    with entry_lock(folder, "synth"):
        deadline.check()
        synthesized = synth_design(cfg, jobs=None, timeout=max(1.0, deadline.end - time.monotonic()))
    deadline.check()
    return Area(synthesized.lut, synthesized.ff, synthesized.dsp, synthesized.bram,
                synthesized.area_clb), synthesized.seconds


def base_row(point: Point) -> dict[str, Any]:
    """The identifying columns of ``point``'s row."""
    d = point.design
    return {"design": d.key, "config_name": d.cfg.name if d.cfg else None, "config": d.fields, "knobs": d.knobs,
            "model": point.model, "mode": point.mode}


def measure(point: Point) -> dict[str, Any]:
    """Measure ``point`` and return its whole row; never raises for a failure of the point itself: a point that
    raises is ``failed`` with the error, one past its timeout is ``timeout``."""
    row = base_row(point)
    row.update(started=_now(), worker=f"{socket.gethostname()}:{os.getpid()}")
    start = time.monotonic()
    if point.design.cfg is None:
        row.update(status="failed", error=f"invalid config: {point.design.error}")
    else:
        deadline = _Deadline(point.timeout)
        try:
            with deadline:
                row.update(_evaluate(point, deadline), status="ok")
            deadline.check()
        except PointTimeout as err:
            row.update(status="timeout", error=str(err))
        except Exception as err:  # noqa: BLE001 - any failure of one point is recorded and the sweep goes on
            row.update(status="failed", error=f"{type(err).__name__}: {err}")
    row.update(seconds=round(time.monotonic() - start, 4), finished=_now())
    return row
