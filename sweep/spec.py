"""A sweep file: which designs to measure on which models, and how; validated whole, expanded to points.

A sweep file is TOML::

    [sweep]
    name = "wide"                       # optional; default: the file's stem
    models = ["resnet18", "net.onnx"]   # zoo names or ONNX paths (relative to the sweep file)
    mode = "model"                      # "model": cycle model + analytical area + energy; "exact": tsim cycles
    area = "yosys"                      # optional: "yosys" (per-module synthesis, cached; the default in exact
                                        # mode) or "model" (the analytical area model; the default in model mode)
    timeout = 120                       # seconds per point (compile + measurement), at most MAX_TIMEOUT
    base = "design.toml"                # optional base config file (VTA JSON or TOML), relative to the sweep file
    tech = "my_tech.toml"               # optional technology file for energy (default: the 45 nm table)
    samples = 50                        # optional: draw this many designs at random from the grid ...
    seed = 1                            # ... with this seed (default 0)

    [base]                              # optional: config fields over the base file's (or the defaults)
    CLOCK_MHZ = 200

    [vary]                              # field or knob -> the values to try (every combination: a grid)
    LOG_BLOCK = [3, 4, 5]
    LOG_BATCH = [0, 1]
    FUSED_REQUANT = [false, true]       # codesign knobs are config fields (vta.config.KNOBS)
    policy = ["auto", "accel"]          # compile knobs: policy, double_buffer

Every problem in the file is collected and raised at once (:class:`SweepSpecError`). A combination that makes an
invalid :class:`~vta.config.VTAConfig` is not an error of the file: it becomes a point whose ``error`` says why, which
the runner records as failed. What no point could survive is an error of the file: a ``timeout`` that is not a
finite number of seconds up to :data:`MAX_TIMEOUT`, a ``tech`` file that is not a valid technology file, a TOML date
or time among the values of ``[vary]``, and a sweep of more than :data:`MAX_POINTS` points (designs x models): a
larger grid needs ``samples``.

Expansion is deterministic: the grid's combinations in the order of ``[vary]`` (the last key varies fastest), or with
``samples`` the combinations at ``sorted(random.Random(seed).sample(range(grid size), samples))``; then every model
for each design.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import random
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vta.config import ConfigError, VTAConfig, load_config

__all__ = ["SweepSpec", "Design", "Point", "SweepSpecError", "load_spec", "parse_spec", "MODES", "AREAS", "KNOBS",
           "config_key", "MAX_POINTS", "MAX_TIMEOUT"]

MAX_POINTS = 100_000
"""The most points (designs x models) one sweep file may ask for. A model-mode point takes about a second, so this is
a day of a 2-core machine; a larger grid is refused before any design is built (its designs alone would not fit in
memory past some millions): draw ``samples = N`` designs from it instead."""
MAX_TIMEOUT = 7 * 24 * 3600.0
"""The longest per-point ``timeout``, seconds (one week; the interval timer cannot be set much past 10**11 s)."""

MODES = ("model", "exact")
AREAS = ("model", "yosys")
"""How a point's area is measured: the analytical model (:mod:`vta.area`) or Yosys (:mod:`vta.sweep.synth`)."""
"""``model``: the analytical cycle model (vta.cost), area model and energy model; ``exact``: tsim cycles."""
KNOBS: dict[str, tuple[Any, ...]] = {"policy": ("auto", "accel"), "double_buffer": (True, False)}
"""Compile knobs a sweep may vary, with their allowed values (see vta.compiler.pipeline.compile_model)."""
_DEFAULT_KNOBS: dict[str, Any] = {"policy": "auto", "double_buffer": True}
_SWEEP_KEYS = {"name", "models", "mode", "timeout", "base", "tech", "samples", "seed", "area"}
_TOP_KEYS = {"sweep", "base", "vary"}
_FIELD_NAMES = {f.name for f in dataclasses.fields(VTAConfig)}  # VTA's keys and the codesign knobs (FUSED_REQUANT)


class SweepSpecError(ValueError):
    """A sweep file is invalid. ``problems`` lists every problem found, one sentence each."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        where = f" {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        count = f"{len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}"
        super().__init__(f"invalid sweep file{where} ({count}):\n{lines}")


@dataclass(frozen=True)
class Design:
    """One accelerator design: a config (None when the combination is invalid) and the compile knobs.

    ``fields``: the config's VTA keys -> values (for an invalid combination, the base's keys with the varied ones
    over them, as written). ``key``: a unique name (config name, clock and any knob that differs from its default).
    ``error``: why the combination is not a valid config (empty when it is).
    """

    key: str
    fields: dict[str, Any]
    knobs: dict[str, Any]
    cfg: VTAConfig | None
    error: str = ""


@dataclass(frozen=True)
class Point:
    """One measurement: a design on a model, measured in ``mode`` within ``timeout`` seconds."""

    design: Design
    model: str
    mode: str
    timeout: float
    tech: str | None = None
    area: str = "model"
    """How the area is measured: one of :data:`AREAS`."""

    @property
    def key(self) -> tuple[str, str, str]:
        """(design key, model, mode): what identifies the point's row in the results database."""
        return (self.design.key, self.model, self.mode)


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file: ``models`` (zoo names or absolute ONNX paths), the ``base`` config fields, ``vary``
    (field or knob -> values), the mode, the per-point ``timeout`` (seconds), optional random ``samples`` and
    ``seed``, the technology file ``tech`` (None: the default 45 nm table)."""

    name: str
    models: tuple[str, ...]
    base: dict[str, Any]
    vary: dict[str, tuple[Any, ...]]
    mode: str = "model"
    timeout: float = 120.0
    samples: int | None = None
    seed: int = 0
    tech: str | None = None
    source: str | None = field(default=None, compare=False)
    area: str = "model"

    @property
    def grid_size(self) -> int:
        """Designs in the full grid (the product of the value counts)."""
        return math.prod(len(values) for values in self.vary.values())

    @property
    def design_count(self) -> int:
        """Designs the sweep measures: the grid's, or ``samples`` of them (at most the grid's)."""
        return self.grid_size if self.samples is None else min(self.samples, self.grid_size)

    def designs(self) -> list[Design]:
        """The designs, in the deterministic order described in the module docstring; :class:`SweepSpecError`
        (before any is built) when they are more than :data:`MAX_POINTS` points."""
        problem = _size_problem(self.vary, self.samples, len(self.models))
        if problem:
            raise SweepSpecError([problem], self.source)
        names = list(self.vary)
        combos = itertools.product(*self.vary.values()) if self.samples is None else self._sampled()
        return [make_design(self.base, dict(zip(names, combo))) for combo in combos]

    def _sampled(self) -> list[tuple[Any, ...]]:
        count, grid = self.design_count, self.grid_size
        rng = random.Random(self.seed)
        if grid <= sys.maxsize:
            picks = sorted(rng.sample(range(grid), count))
        else:  # random.sample needs len(range(grid)); count <= MAX_POINTS is a sliver of such a grid
            chosen: set[int] = set()
            while len(chosen) < count:
                chosen.add(rng.randrange(grid))
            picks = sorted(chosen)
        return [_combo_at(list(self.vary.values()), index) for index in picks]

    def points(self) -> list[Point]:
        """Every (design, model) point: each design on each model, designs in order."""
        return [Point(d, m, self.mode, self.timeout, self.tech, self.area) for d in self.designs()
                for m in self.models]


def _size_problem(vary: dict[str, tuple[Any, ...]], samples: int | None, models: int) -> str:
    """The sentence saying that the sweep asks for more than :data:`MAX_POINTS` points, or "" when it does not."""
    grid = math.prod(len(values) for values in vary.values())
    designs = grid if samples is None else min(samples, grid)
    models = max(models, 1)
    if designs * models <= MAX_POINTS:
        return ""
    on = f"{models} model{'s' if models != 1 else ''}"
    most = f"more than the {MAX_POINTS:,} points a sweep may measure"
    if samples is None:
        sizes = " x ".join(str(len(values)) for values in vary.values())
        return (f"[vary] makes a grid of {sizes} = {designs:,} designs, {designs * models:,} points on {on}: {most}; "
                f"give samples = N in [sweep] to measure N designs drawn at random from the grid (N at most "
                f"{MAX_POINTS // models:,} with {on}), or vary fewer values")
    return (f"samples = {samples:,} makes {designs * models:,} points on {on}: {most}; give samples of at most "
            f"{MAX_POINTS // models:,}")


def _combo_at(values: list[tuple[Any, ...]], index: int) -> tuple[Any, ...]:
    """The ``index``-th combination of ``itertools.product(*values)`` without building the product."""
    out = []
    for vals in reversed(values):
        index, digit = divmod(index, len(vals))
        out.append(vals[digit])
    return tuple(reversed(out))


def config_key(cfg: VTAConfig, knobs: dict[str, Any]) -> str:
    """A design's unique key: the config's canonical name, its clock when not 100 MHz (the canonical name leaves the
    clock out) and every knob that differs from its default, e.g. ``1x16_i8w8a32_15_15_18_17_clk200+policy=accel``."""
    key = cfg.name
    if cfg.clock_mhz != VTAConfig().clock_mhz:
        key += f"_clk{cfg.clock_mhz:g}"
    for name, value in sorted(knobs.items()):
        if value != _DEFAULT_KNOBS[name]:
            key += f"+{name}={json.dumps(value)}"
    return key


def make_design(base: dict[str, Any], changes: dict[str, Any]) -> Design:
    """The design of ``base`` config fields with ``changes`` (config fields and knobs) applied."""
    knobs = dict(_DEFAULT_KNOBS)
    fields = dict(base)
    for name, value in changes.items():
        if name in KNOBS:
            knobs[name] = value
        else:
            fields[_upper(name)] = value
    try:
        cfg = VTAConfig.from_dict(fields)
    except ConfigError as err:
        varied = ",".join(f"{_upper(k)}={v}" for k, v in changes.items() if k not in KNOBS)
        return Design(f"invalid[{varied}]" + _knob_suffix(knobs), fields, knobs, None, "; ".join(err.problems))
    return Design(config_key(cfg, knobs), cfg.to_dict(), knobs, cfg)


def _knob_suffix(knobs: dict[str, Any]) -> str:
    return "".join(f"+{k}={json.dumps(v)}" for k, v in sorted(knobs.items()) if v != _DEFAULT_KNOBS[k])


def _upper(name: str) -> str:
    return name.upper()


# ---- loading and validation -----------------------------------------------------------------------------------------
def load_spec(path: str | os.PathLike[str]) -> SweepSpec:
    """Read and validate the sweep file at ``path`` (see the module docstring); :class:`SweepSpecError` lists every
    problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SweepSpecError([f"cannot read the file: {err.strerror}"], str(path)) from None
    except UnicodeDecodeError as err:
        raise SweepSpecError([f"the file is not UTF-8 text: byte {err.object[err.start]:#04x} at position "
                              f"{err.start} cannot be decoded; save it as UTF-8"], str(path)) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SweepSpecError([f"the file is not valid TOML: {err}"], str(path)) from None
    except RecursionError:
        raise SweepSpecError([_TOO_DEEP], str(path)) from None
    return parse_spec(data, base_dir=path.parent, name=path.stem, source=str(path))


def parse_spec(data: dict[str, Any], *, base_dir: str | os.PathLike[str] = ".", name: str = "sweep",
               source: str | None = None) -> SweepSpec:
    """Validate the parsed TOML ``data`` of a sweep file; paths in it are relative to ``base_dir``."""
    from vta.compiler.frontend.zoo import list_models
    problems: list[str] = []
    base_dir = Path(base_dir)
    problems += [f"unknown table or key [{k}]; a sweep file has [sweep], [base] and [vary]"
                 for k in data if k not in _TOP_KEYS]
    sweep = _table(data, "sweep", problems)
    problems += [f"unknown key {k!r} in [sweep]; known keys are {', '.join(sorted(_SWEEP_KEYS))}"
                 for k in sweep if k not in _SWEEP_KEYS]
    models = _models(sweep.get("models"), base_dir, set(list_models()), problems)
    mode = sweep.get("mode", "model")
    if mode not in MODES:
        problems.append(f"mode must be one of {', '.join(repr(m) for m in MODES)}, not {mode!r}")
    timeout = sweep.get("timeout", 120.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        problems.append(f"timeout must be a positive number of seconds, not {timeout!r} (a finite number, at most "
                        f"{MAX_TIMEOUT:,.0f}: one week)")
    samples = sweep.get("samples")
    samples_ok = samples is None or (not isinstance(samples, bool) and isinstance(samples, int) and samples >= 1)
    if not samples_ok:
        problems.append(f"samples must be a positive integer (designs drawn at random), not {samples!r}")
    seed = sweep.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        problems.append(f"seed must be an integer, not {seed!r}")
    tech = _tech(sweep.get("tech"), base_dir, problems)
    area = sweep.get("area", "yosys" if mode == "exact" else "model")
    if area not in AREAS:
        problems.append(f"area must be one of {', '.join(repr(a) for a in AREAS)}, not {area!r}")
    base = _base(sweep.get("base"), _table(data, "base", problems), base_dir, problems)
    vary = _vary(_table(data, "vary", problems), problems)
    too_many = _size_problem(vary, samples, len(models)) if samples_ok else ""
    if too_many:
        problems.append(too_many)
    spec_name = sweep.get("name", name)
    if not isinstance(spec_name, str) or not spec_name:
        problems.append(f"name must be a non-empty string, not {spec_name!r}")
    if problems:
        raise SweepSpecError(problems, source)
    return SweepSpec(spec_name, tuple(models), base, vary, mode, float(timeout), samples, seed, tech, source, area)


_TOO_DEEP = ("the file is nested too deeply to read (arrays or tables inside one another past Python's recursion "
             "limit); a sweep file needs two levels")


def _dates(value: Any) -> list[Any]:
    """The TOML dates, times and date-times in ``value`` (a list or table of values, any depth): values JSON cannot
    hold, so no config field or knob takes them."""
    import datetime
    found: list[Any] = []
    stack = [value]
    while stack:  # iterative: a value nested deeper than the recursion limit is walked too
        item = stack.pop()
        if isinstance(item, (datetime.date, datetime.time)):
            found.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return found


def _table(data: dict[str, Any], key: str, problems: list[str]) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        problems.append(f"[{key}] must be a table, not {value!r}")
        return {}
    return value


def _model_file_problem(path: Path) -> str | None:
    """Why the file ``path`` is no ONNX model a point could compile (checked once here, not failed in every point):
    it does not decode as an ONNX protobuf, or holds no graph with nodes and outputs; None when it does."""
    import onnx
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and whatever a damaged file makes onnx raise
        return f"is not an ONNX model, or it is truncated ({type(err).__name__})"
    if not model.HasField("graph") or not model.graph.node or not model.graph.output:
        return "holds no ONNX graph with nodes and outputs"
    return None


def _efficientnet_missing() -> str | None:
    """:func:`vta.compiler.frontend.efficientnet.missing_extra`: the zoo model that needs an optional extra."""
    from vta.compiler.frontend.efficientnet import missing_extra
    return missing_extra()


def _models(value: Any, base_dir: Path, zoo: set[str], problems: list[str]) -> list[str]:
    if not isinstance(value, list) or not value:
        problems.append(f"models must be a non-empty list of zoo names or ONNX paths, not {value!r}")
        return []
    out: list[str] = []
    for m in value:
        if not isinstance(m, str):
            problems.append(f"models: {m!r} is not a string")
        elif m in zoo:
            out.append(m)
            if m == "efficientnet_lite0" and (missing := _efficientnet_missing()) is not None:
                problems.append(f"models: {m!r}: {missing}")
        elif (base_dir / m).is_file():
            out.append(str((base_dir / m).resolve()))
            if (problem := _model_file_problem(base_dir / m)) is not None:
                problems.append(f"models: {m!r} {problem}")
        else:
            problems.append(f"models: {m!r} is neither a zoo model ({', '.join(sorted(zoo))}) nor an existing file")
    if len(set(out)) != len(out):
        problems.append("models: a model is listed twice")
    return out


def _path(value: Any, key: str, base_dir: Path, problems: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not (base_dir / value).is_file():
        problems.append(f"{key} must name an existing file (relative to the sweep file), not {value!r}")
        return None
    return str((base_dir / value).resolve())


def _tech(value: Any, base_dir: Path, problems: list[str]) -> str | None:
    """The technology file's absolute path, read and checked now (:func:`vta.energy.load_tech`): a file that is not
    one would otherwise fail every point."""
    from vta.energy import TechError, load_tech
    path = _path(value, "tech", base_dir, problems)
    if path is None:
        return None
    try:
        load_tech(path)
    except TechError as err:
        problems.extend(f"tech file {value}: {p}" for p in err.problems)
    except (OSError, ValueError) as err:      # vta.textfile's errors too: not UTF-8, nested too deeply
        problems.append(f"tech file {value}: {err}")
    return path


def _base(file: Any, table: dict[str, Any], base_dir: Path, problems: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = VTAConfig().to_dict()
    path = _path(file, "base", base_dir, problems)
    if path is not None:
        try:
            fields = load_config(path).to_dict()
        except ConfigError as err:
            problems.extend(f"base config {file}: {p}" for p in err.problems)
        except (OSError, ValueError) as err:  # vta.textfile's errors too: not UTF-8, nested too deeply
            problems.append(f"base config {file}: {err}")
    for key, value in table.items():
        if key.lower() not in _FIELD_NAMES:
            problems.append(f"[base]: unknown config field {key!r}; fields are {', '.join(sorted(fields))}")
        else:
            fields[key.upper()] = value
    try:
        VTAConfig.from_dict(fields)
    except ConfigError as err:
        problems.extend(f"[base]: {p}" for p in err.problems)
    return fields


def _vary(table: dict[str, Any], problems: list[str]) -> dict[str, tuple[Any, ...]]:
    out: dict[str, tuple[Any, ...]] = {}
    for key, values in table.items():
        name = key if key in KNOBS else key.upper()
        if key not in KNOBS and key.lower() not in _FIELD_NAMES:
            known = ", ".join(sorted(f.upper() for f in _FIELD_NAMES))
            problems.append(f"[vary]: {key!r} is neither a config field ({known}) nor a knob ({', '.join(KNOBS)})")
            continue
        if not isinstance(values, list) or not values:
            problems.append(f"[vary]: {key} must be a non-empty list of values, not {values!r}")
            continue
        dates = _dates(values)
        if dates:
            problems.append(f"[vary]: {key} holds a TOML date or time ({', '.join(map(str, dates))}); a config field "
                            f"takes numbers or true/false, a knob one of its names")
            continue
        if len(set(map(json.dumps, values))) != len(values):
            problems.append(f"[vary]: {key} lists a value twice: {values!r}")
        if key in KNOBS:
            bad = [v for v in values if v not in KNOBS[key] or isinstance(v, bool) != isinstance(KNOBS[key][0], bool)]
            if bad:
                problems.append(f"[vary]: {key} values must be among {list(KNOBS[key])}, not {bad!r}")
        if name in out:
            problems.append(f"[vary]: {key} is given twice (as upper and lower case)")
        out[name] = tuple(values)
    return out
