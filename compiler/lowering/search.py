"""The schedule search: the fastest tiling of a convolution by the cycle model, and its caches.

:func:`search_conv` ranks a layer's candidate tilings (:func:`.schedule.conv_candidates`) by their quick bound,
builds the best few programs (:func:`.codegen.build_conv_program`) and estimates them with the cycle model
(:func:`vta.cost.estimate`); results and candidate plans are cached in memory and on disk.
"""
from __future__ import annotations

import dataclasses
import functools
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
from .requant import offset_start
from .schedule import ConvGeometry, ConvTiling, conv_candidates, plan_conv

__all__ = ["LayerPlan", "plan_program", "SearchResult", "SearchCache", "search_conv", "tiling_to_dict",
           "tiling_from_dict", "SEARCH_KEEP"]


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
    """Candidate programs the search built and estimated (the others' predictions came from the
    :class:`SearchCache`'s candidate plans, :func:`_candidate_key`)."""


def tiling_to_dict(t: ConvTiling) -> dict[str, int | str | bool]:
    """The tile sizes and options of ``t`` as plain JSON-able data (the geometry is the layer's)."""
    return {name: getattr(t, name) for name in _TILING_FIELDS}


def tiling_from_dict(geom: ConvGeometry, data: dict) -> ConvTiling:
    """The :class:`ConvTiling` of ``geom`` that :func:`tiling_to_dict` described."""
    return ConvTiling(geom, **{name: data[name] for name in _TILING_FIELDS})


@functools.cache
def _source_digest() -> str:
    """A digest of the sources the search result depends on (tiling rules, code generation, the micro-op cache, the
    search, the cycle model, event counts): a change to any of them makes every cached result stale."""
    h = hashlib.sha256()
    for name in (f"{__package__}.schedule", f"{__package__}.codegen", f"{__package__}.requant",
                 f"{__package__}.uopcache", __name__,
                 "vta.cost", "vta.counts"):
        module = importlib.import_module(name)
        with open(module.__file__ or "", "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def _passes(layer: ConvLayer, cfg: VTAConfig) -> list[str]:
    """The ALU passes a key names (:func:`~.codegen.alu_passes`), and ``offset`` or ``offset-min`` when the layer
    starts its accumulators at the offset start (:func:`~.requant.offset_start`: its programs differ)."""
    intr = intrinsics(cfg)
    offset = offset_start(layer, intr)
    tag = [] if offset is None else ["offset-min" if offset.min_start else "offset"]
    return alu_passes(layer, fused=fused_requant(layer, intr)) + tag


def _search_key(layer: ConvLayer, cfg: VTAConfig, threads: tuple[int, ...], bias: tuple[bool, ...]) -> str:
    """The cache key of a search: layer geometry, the ALU passes, the weights' layout, the config's fields, the
    options, the sources."""
    g = layer.geom
    data = {"v": _SEARCH_VERSION, "src": _source_digest(), "cfg": dataclasses.asdict(cfg),
            "geom": [g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, list(g.pads), g.groups],
            "alu": _passes(layer, cfg), "per_tensor": layer.per_tensor,
            "threads": list(threads), "bias": list(bias), "weights_as_image": layer.weights_as_image}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


_PLACEMENT_FIELDS = ("log_inp_buff_size", "log_wgt_buff_size", "log_acc_buff_size")
"""Config fields that reach a conv program of a given tiling only as SRAM base addresses (where each virtual
thread's part of the buffer starts), which the cycle model does not read: candidates estimated under one of them
are valid under another (``tests/test_schedule_search.py`` checks it)."""
CANDIDATE_MEMO_SIZE = 20000
"""Candidate estimates a :class:`SearchCache` keeps in memory (least recently used dropped first)."""


def _candidate_key(layer: ConvLayer, cfg: VTAConfig, t: ConvTiling) -> str:
    """The memo key of candidate ``t``'s predicted cycles: the layer, the tiling, and the config without the fields
    of :data:`_PLACEMENT_FIELDS` (the micro-op width they imply is kept: it sets the micro-op kernels' DRAM bytes).
    Designs of a sweep that differ only in buffer sizes share most candidates (ResNet-18 over 12 buffer-size
    combinations: 2,151 candidates, 292 distinct)."""
    g = layer.geom
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _PLACEMENT_FIELDS}
    data = {"v": _SEARCH_VERSION, "src": _source_digest(), "cfg": fields, "uop_bits": cfg.uop_bits,
            "geom": [g.n, g.c, g.h, g.w, g.o, g.kh, g.kw, g.sh, g.sw, list(g.pads), g.groups],
            "alu": _passes(layer, cfg), "per_tensor": layer.per_tensor,
            "tiling": tiling_to_dict(t), "weights_as_image": layer.weights_as_image}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]


def _default_folder() -> Path | None:
    """``schedules/`` in the cache folder (:func:`vta.cache.cache_root`), or None when none can be determined."""
    try:
        return Path(cache_root("schedules"))
    except (OSError, ImportError):
        return None


SearchHit = tuple[dict, int, LayerPlan | None]
"""A cached search result: the tiling (:func:`tiling_to_dict`), its predicted cycles, its plan (None for a disk
entry written before plans were stored)."""


class SearchCache:
    """The schedule search's caches, one object that whoever compiles creates and passes down (the pipeline makes
    one per compile unless given one; a sweep's worker keeps one for all its points; a test makes its own).

    * search results (:func:`_search_key` -> :data:`SearchHit`) in memory and as JSON files in ``folder``;
    * candidate plans (:func:`_candidate_key` -> :class:`LayerPlan`) in memory, at most ``memo_size`` (least recently
      used dropped first), and in ``folder/candidates/``, shared by configs that differ only in buffer sizes and by
      the processes of a sweep.

    ``folder``: where the JSON files live (default: ``schedules/`` in the cache folder); ``disk=False``: memory only.
    A damaged or unreadable file counts as absent (searched again and rewritten); a read-only folder only costs
    searches.
    """

    def __init__(self, folder: Path | str | None = None, *, disk: bool = True,
                 memo_size: int = CANDIDATE_MEMO_SIZE) -> None:
        self.folder: Path | None = None if not disk else _default_folder() if folder is None else Path(folder)
        self.memo_size = memo_size
        self.results: dict[str, SearchHit] = {}
        self.candidates: OrderedDict[str, LayerPlan] = OrderedDict()

    def _path(self, key: str, sub: str = "") -> Path | None:
        return None if self.folder is None else self.folder / sub / f"{key}.json"

    def _load(self, path: Path | None, key: str) -> dict[str, Any] | None:
        """The JSON entry at ``path`` written for ``key``, or None when absent or unreadable."""
        if path is None or not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("key") == key else None

    def _store(self, path: Path | None, data: dict[str, Any]) -> None:
        """Write ``data`` to ``path`` atomically (JSON); a read-only cache only costs the next compile a search."""
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(data, sort_keys=True))
        except OSError:
            pass

    def result(self, key: str) -> tuple[SearchHit, str] | None:
        """Search ``key``'s cached result and where it was found (``"memory"`` or ``"disk"``), or None."""
        hit = self.results.get(key)
        if hit is not None:
            return hit, "memory"
        data = self._load(self._path(key), key)
        if data is None:
            return None
        try:
            plan = LayerPlan.from_data(data["plan"]) if "plan" in data else None
            hit = dict(data["tiling"]), int(data["predicted_cycles"]), plan
        except (ValueError, KeyError, TypeError, AttributeError):  # a damaged entry is searched again and rewritten
            return None
        self.results[key] = hit
        return hit, "disk"

    def store_result(self, key: str, hit: SearchHit, *, disk: bool = True) -> None:
        """Keep search ``key``'s result in memory and (``disk``) in the folder."""
        self.results[key] = hit
        if disk:
            data: dict[str, Any] = {"key": key, "tiling": hit[0], "predicted_cycles": hit[1]}
            if hit[2] is not None:
                data["plan"] = hit[2].to_data()
            self._store(self._path(key), data)

    def candidate(self, ckey: str) -> LayerPlan | None:
        """Candidate ``ckey``'s plan from memory or the folder (another process may have estimated it), or None."""
        plan = self.candidates.get(ckey)
        if plan is not None:
            self.candidates.move_to_end(ckey)
            return plan
        data = self._load(self._path(ckey, "candidates"), ckey)
        try:
            plan = LayerPlan.from_data(data["plan"]) if data is not None else None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if plan is not None:
            self._remember(ckey, plan)
        return plan

    def store_candidate(self, ckey: str, plan: LayerPlan, *, disk: bool = True) -> None:
        """Keep candidate ``ckey``'s plan in memory and (``disk``) in the folder."""
        self._remember(ckey, plan)
        if disk:
            self._store(self._path(ckey, "candidates"), {"key": ckey, "plan": plan.to_data()})

    def _remember(self, ckey: str, plan: LayerPlan) -> None:
        self.candidates[ckey] = plan
        while len(self.candidates) > self.memo_size:
            self.candidates.popitem(last=False)


def search_conv(cfg: VTAConfig, layer: ConvLayer, *, threads: tuple[int, ...] = (1, 2),
                bias_load: tuple[bool, ...] = (False, True), keep: int = SEARCH_KEEP,
                use_cache: bool = True, cache: SearchCache | None = None) -> SearchResult:
    """The fastest tiling of ``layer`` by the cycle model (:func:`vta.cost.estimate`): every candidate of
    :func:`~.schedule.conv_candidates` is ranked by its quick bound, the ``keep`` best (and
    :func:`~.schedule.plan_conv`'s tiling) get their programs built and estimated, and the fewest predicted cycles
    win (ties: fewer DMA bytes). Results are cached per (layer shape, ALU passes, config, options) and each
    candidate's plan (predicted cycles, bounding module, event counts) per :func:`_candidate_key`, in ``cache``
    (:class:`SearchCache`; None: a new one, which still finds what earlier processes left in the cache folder).
    ``use_cache=False`` searches afresh: nothing is read, and nothing is written to the folder."""
    cache = SearchCache() if cache is None else cache
    key = _search_key(layer, cfg, threads, bias_load)
    found = cache.result(key) if use_cache else None
    if found is not None:
        hit, source = found
        return SearchResult(tiling_from_dict(layer.geom, hit[0]), hit[1], 0, source, plan=hit[2])
    intr = intrinsics(cfg)
    fused = fused_requant(layer, intr)
    n_alu = len(alu_passes(layer, fused=fused))
    consts = 2 if fused else 1 if layer.per_tensor else 3
    offset = offset_start(layer, intr)
    cands = conv_candidates(layer.geom, intr, threads=threads, bias_load=bias_load)
    work = [t.work_bound(intr, n_alu - t.bias_load, consts - t.bias_load) if offset is None or t.bias_load else
            t.work_bound(intr, len(offset.passes()), len(offset.slots()))  # the start takes the reset's place
            for t in cands]
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
        plan = cache.candidate(ckey) if use_cache else None
        if plan is None:
            made = build_conv_program(cfg, layer, None, t)
            plan = plan_program(made[0])
            built += 1
            cache.store_candidate(ckey, plan, disk=use_cache)
        rank = (plan.cycles, t.dma_bytes(intr))
        if best is None or rank < best[:2]:
            best = (plan.cycles, rank[1], t, plan, made)
    assert best is not None
    cache.store_result(key, (tiling_to_dict(best[2]), best[0], best[3]), disk=use_cache)
    return SearchResult(best[2], best[0], len(chosen), "search", best[4], best[3], built)
