"""The schedule search: the fastest tiling of a convolution by the cycle model, and its caches.

:func:`search_conv` ranks a layer's candidate tilings (:func:`.schedule.conv_candidates`) by their quick bound,
builds the best few programs (:func:`.codegen.build_conv_program`) and estimates them with the cycle model
(:func:`vta.cost.estimate`); results and candidate plans are cached in memory and on disk.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vta.cache import cache_root
from vta.config import VTAConfig
from vta.fileio import atomic_write_text
from vta.program import Program

from .codegen import ConvLayer, LayerCode, alu_passes, build_conv_program, fused_requant
from .intrin import intrinsics
from .schedule import ConvGeometry, ConvTiling, conv_candidates, plan_conv

__all__ = ["LayerPlan", "plan_program", "SearchResult", "search_conv", "tiling_to_dict", "tiling_from_dict",
           "SEARCH_KEEP"]


SEARCH_KEEP = 8
"""Candidates per layer whose programs are built and estimated by the cycle model (the best by
:meth:`~.schedule.ConvTiling.work_bound`, plus :func:`~.schedule.plan_conv`'s choice)."""
_SEARCH_VERSION = 1
_TILING_FIELDS = ("oc_tile", "ic_tile", "oh_tile", "ow_tile", "kh_tile", "threads", "order", "bias_load")


@dataclass(frozen=True)
class LayerPlan:
    """What a layer's program costs, without the program: the cycle model's prediction, the module that bounds it,
    and the program's event counts (:func:`.counts.program_counts`: micro-ops, MACs, bytes per memory type). It does
    not depend on where the buffers' parts start, so it is shared as :func:`_candidate_key` says."""

    cycles: int
    bound: str
    counts: dict[str, int]

    def to_data(self) -> dict[str, Any]:
        return {"cycles": self.cycles, "bound": self.bound, "counts": dict(self.counts)}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "LayerPlan":
        return cls(int(data["cycles"]), str(data["bound"]), {str(k): int(v) for k, v in data["counts"].items()})


def plan_program(program: Program) -> LayerPlan:
    """The :class:`LayerPlan` of a built program (:func:`.cost.estimate`, :func:`.counts.program_counts`)."""
    from vta.cost import estimate
    from vta.counts import program_counts
    est = estimate(program)
    return LayerPlan(est.cycles, est.bound, program_counts(program))


@dataclass(frozen=True)
class SearchResult:
    """The tiling the search chose, the cycle model's prediction for its program (cycles) and how many candidate
    programs were estimated (0 when the choice came from a cache)."""

    tiling: ConvTiling
    predicted_cycles: int
    evaluated: int
    source: str
    built: tuple[Program, LayerCode] | None = field(default=None, compare=False, repr=False)
    """The chosen tiling's program and code (``build_conv_program(cfg, layer, None, tiling)``) as the search built
    them, so the compile does not build them again (their cost is :attr:`plan`); None when the choice came from a
    cache."""
    plan: LayerPlan | None = field(default=None, compare=False)
    """The chosen tiling's cost (cycles, bounding module, event counts), so a model-mode sweep needs no program
    (:func:`.pipeline.plan_graph`); None only for a disk cache entry written before plans were stored."""
    built_programs: int = 0
    """Candidate programs the search built and estimated (the others' predictions came from the per-process memo of
    candidates, :func:`_candidate_key`)."""


def tiling_to_dict(t: ConvTiling) -> dict[str, int | str | bool]:
    """The tile sizes and options of ``t`` as plain JSON-able data (the geometry is the layer's)."""
    return {name: getattr(t, name) for name in _TILING_FIELDS}


def tiling_from_dict(geom: ConvGeometry, data: dict) -> ConvTiling:
    """The :class:`ConvTiling` of ``geom`` that :func:`tiling_to_dict` described."""
    return ConvTiling(geom, **{name: data[name] for name in _TILING_FIELDS})


_memory: dict[str, tuple[dict, int, LayerPlan | None]] = {}


def _source_digest() -> str:
    """A digest of the sources the search result depends on (tiling rules, code generation, cycle model, event
    counts)."""
    h = hashlib.sha256()
    for name in (f"{__package__}.schedule", f"{__package__}.codegen", "vta.cost", "vta.counts"):
        module = importlib.import_module(name)
        with open(module.__file__ or "", "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


_DIGEST: list[str] = []


def _search_key(layer: ConvLayer, cfg: VTAConfig, threads: tuple[int, ...], bias: tuple[bool, ...]) -> str:
    """The cache key of a search: layer geometry, the ALU passes, the config's fields, the options, the sources."""
    if not _DIGEST:
        _DIGEST.append(_source_digest())
    g = layer.geom
    data = {"v": _SEARCH_VERSION, "src": _DIGEST[0], "cfg": dataclasses.asdict(cfg),
            "geom": [g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, list(g.pads), g.groups],
            "alu": alu_passes(layer, fused=fused_requant(layer, intrinsics(cfg))), "per_tensor": layer.per_tensor,
            "threads": list(threads), "bias": list(bias)}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


_PLACEMENT_FIELDS = ("log_inp_buff_size", "log_wgt_buff_size", "log_acc_buff_size")
"""Config fields that reach a conv program of a given tiling only as SRAM base addresses (where each virtual
thread's part of the buffer starts), which the cycle model does not read: candidates estimated under one of them
are valid under another (``tests/test_schedule_search.py`` checks it)."""
CANDIDATE_MEMO_SIZE = 20000
"""Candidate estimates kept per process (least recently used dropped first)."""
_candidates: OrderedDict[str, LayerPlan] = OrderedDict()


def _candidate_key(layer: ConvLayer, cfg: VTAConfig, t: ConvTiling) -> str:
    """The memo key of candidate ``t``'s predicted cycles: the layer, the tiling, and the config without the fields
    of :data:`_PLACEMENT_FIELDS` (the micro-op width they imply is kept: it sets the micro-op kernels' DRAM bytes).
    Designs of a sweep that differ only in buffer sizes share most candidates (ResNet-18 over 12 buffer-size
    combinations: 2,151 candidates, 292 distinct)."""
    if not _DIGEST:
        _DIGEST.append(_source_digest())
    g = layer.geom
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _PLACEMENT_FIELDS}
    data = {"v": _SEARCH_VERSION, "src": _DIGEST[0], "cfg": fields, "uop_bits": cfg.uop_bits,
            "geom": [g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, list(g.pads), g.groups],
            "alu": alu_passes(layer, fused=fused_requant(layer, intrinsics(cfg))), "per_tensor": layer.per_tensor,
            "tiling": tiling_to_dict(t)}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


def _disk_path(key: str, folder: str = "") -> Path | None:
    """The JSON file of ``key`` under ``schedules/`` (search results) or ``schedules/<folder>/`` (``candidates``:
    candidate plans) in the cache folder, or None when no cache folder can be determined."""
    try:
        return Path(cache_root("schedules")) / folder / f"{key}.json"
    except (OSError, ImportError):
        return None


def _cache_load(path: Path | None, key: str) -> dict[str, Any] | None:
    """The JSON entry at ``path`` written for ``key``, or None when absent or unreadable (searched again)."""
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def _cache_store(path: Path | None, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, then os.replace; JSON); a read-only cache only costs
    the next compile a search."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(data, sort_keys=True))
    except OSError:
        pass


def _disk_read(key: str) -> tuple[dict, int, LayerPlan | None] | None:
    """The cached (tiling, predicted cycles, plan or None) of search ``key``, or None when absent or damaged."""
    data = _cache_load(_disk_path(key), key)
    if data is None:
        return None
    try:
        plan = LayerPlan.from_data(data["plan"]) if "plan" in data else None
        return dict(data["tiling"]), int(data["predicted_cycles"]), plan
    except (ValueError, KeyError, TypeError, AttributeError):  # a damaged entry is searched again and rewritten
        return None


def _candidate_read(ckey: str) -> LayerPlan | None:
    """Candidate ``ckey``'s plan from the disk cache (another process of a sweep may have estimated it), or None
    when absent or damaged (estimated again and rewritten)."""
    data = _cache_load(_disk_path(ckey, "candidates"), ckey)
    try:
        return LayerPlan.from_data(data["plan"]) if data is not None else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _disk_write(key: str, tiling: dict, cycles: int, plan: LayerPlan | None) -> None:
    """Store search ``key``'s result (:func:`_cache_store`)."""
    data: dict[str, Any] = {"key": key, "tiling": tiling, "predicted_cycles": cycles}
    if plan is not None:
        data["plan"] = plan.to_data()
    _cache_store(_disk_path(key), data)


def search_conv(cfg: VTAConfig, layer: ConvLayer, *, threads: tuple[int, ...] = (1, 2),
                bias_load: tuple[bool, ...] = (False, True), keep: int = SEARCH_KEEP,
                use_cache: bool = True) -> SearchResult:
    """The fastest tiling of ``layer`` by the cycle model (:func:`.cost.estimate`): every candidate of
    :func:`~.schedule.conv_candidates` is ranked by its quick bound, the ``keep`` best (and
    :func:`~.schedule.plan_conv`'s tiling) get their programs built and estimated, and the fewest predicted cycles
    win (ties: fewer DMA bytes). Results are cached per (layer shape, ALU passes, config, options) in memory and as
    JSON under ``vta.cache.cache_root("schedules")``; each candidate's plan (predicted cycles, bounding module, event
    counts) is kept in a per-process memo and on disk (``schedules/candidates/``), shared by configs that differ only
    in buffer sizes (:func:`_candidate_key`) and by the processes of a sweep. ``use_cache=False`` searches afresh."""
    key = _search_key(layer, cfg, threads, bias_load)
    if use_cache:
        hit = _memory.get(key)
        source = "memory"
        if hit is None:
            hit = _disk_read(key)
            source = "disk"
        if hit is not None:
            _memory[key] = hit
            return SearchResult(tiling_from_dict(layer.geom, hit[0]), hit[1], 0, source, plan=hit[2])
    intr = intrinsics(cfg)
    fused = fused_requant(layer, intr)
    n_alu = len(alu_passes(layer, fused=fused))
    consts = 2 if fused else 1 if layer.per_tensor else 3
    cands = conv_candidates(layer.geom, intr, threads=threads, bias_load=bias_load)
    work = [t.work_bound(intr, n_alu - t.bias_load, consts - t.bias_load) for t in cands]
    # the keep best by (work bound, DMA bytes), in the candidates' order among equals; DMA bytes are computed only
    # for the candidates whose bound could place them among the keep
    cutoff = sorted(work)[min(keep, len(work)) - 1]
    near = [(w, t.dma_bytes(intr), k) for k, (w, t) in enumerate(zip(work, cands)) if w <= cutoff]
    chosen = [cands[k] for _, _, k in sorted(near)[:keep]]
    default = plan_conv(layer.geom, intr, threads=max(threads))
    if default not in chosen:
        chosen.append(default)
    best: tuple[int, int, ConvTiling, LayerPlan, tuple[Program, LayerCode] | None] | None = None
    built = 0
    for t in chosen:
        ckey = _candidate_key(layer, cfg, t)
        made: tuple[Program, LayerCode] | None = None
        plan = _candidates.get(ckey) if use_cache else None
        if plan is not None:
            _candidates.move_to_end(ckey)
        else:
            plan = _candidate_read(ckey) if use_cache else None
            if plan is None:
                made = build_conv_program(cfg, layer, None, t)
                plan = plan_program(made[0])
                built += 1
                if use_cache:
                    _cache_store(_disk_path(ckey, "candidates"), {"key": ckey, "plan": plan.to_data()})
            _candidates[ckey] = plan
            while len(_candidates) > CANDIDATE_MEMO_SIZE:
                _candidates.popitem(last=False)
        rank = (plan.cycles, t.dma_bytes(intr))
        if best is None or rank < best[:2]:
            best = (plan.cycles, rank[1], t, plan, made)
    assert best is not None
    result = (tiling_to_dict(best[2]), best[0], best[3])
    _memory[key] = result
    if use_cache:
        _disk_write(key, *result)
    return SearchResult(best[2], best[0], len(chosen), "search", best[4], best[3], built)
