"""The conformance kit: does a core (the lab's own, or a foreign one) execute the ISA as the functional simulator does?

    vta conform [--rtl FILE... [--top NAME]] [--config FILE] [--seeds N] [--no-model] [--only TEXT] [--json]

It runs, on the core through the ``tsim`` backend with the backend's own fsim check off (``run_raw``), the directed
programs of :mod:`vta.tsim.conform_programs` (every instruction and field: LOADs with padding and strides to each
memory type, GEMM with and without reset, every ALU opcode with an immediate and a vector operand, STORE, the four
token queues, FINISH), then :func:`vta.testing.random_program` at several seeds, then one small model end to end
(``tiny_cnn`` compiled at policy ``accel``, through the compiler, found by name in :data:`MODEL_HOOKS`). Each
program's final DRAM image and statistics are compared with :func:`vta.fsim.run`'s (the spec): a failure names the
first differing byte, its allocation, the STORE that wrote there and both values, and the statistics that differ;
a run that stops making progress is a hang naming the stuck modules (the watchdog's report). The result is a table
by feature; the command exits 1 when any feature does not pass, 2 when the core does not lint or does not have the
interface's ports (:mod:`vta.tsim.ports`), before anything is built.
"""
from __future__ import annotations

import argparse
import importlib
import json
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from vta.config import MEM_OUT, VTAConfig
from vta.program import Program

__all__ = ["Outcome", "run_kit", "check_program", "format_table", "register", "MODEL_HOOKS", "DEFAULT_SEEDS",
           "DEFAULT_MODEL"]

DEFAULT_SEEDS = 4
"""Random programs run by default (seeds 0, 1, ...)."""
DEFAULT_MODEL = "tiny_cnn"
"""The model run end to end by default."""
MODEL_HOOKS = {"compile": "vta.compiler.pipeline:compile_model", "inputs": "vta.compiler.pipeline:random_inputs",
               "run": "vta.compiler.runtime.executor:run"}
"""The compiler's entry points the model case uses, by name (imported on first use: ``vta.tsim`` does not import
the compiler's floor; see docs/architecture.md)."""


@dataclass(frozen=True)
class Outcome:
    """One feature's result: ``status`` is ``pass``, ``fail`` (a result differs from fsim's), ``hang`` (the watchdog
    or the cycle budget stopped the run) or ``error`` (the run failed otherwise, e.g. a memory access outside the
    image); ``detail`` says what differed; ``cycles`` the core's cycles when it finished."""

    feature: str
    status: str
    detail: str = ""
    cycles: int | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def _hook(name: str) -> Callable[..., Any]:
    module, _, attr = MODEL_HOOKS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def _store_of(program: Program, address: int) -> str:
    """The last STORE (in program order) whose DRAM rows contain byte ``address``, as ``instruction k (...)``."""
    from vta.asm import format_insn
    from vta.isa import Store
    eb = program.cfg.elem_bytes(MEM_OUT)
    for k in range(len(program.insns) - 1, -1, -1):
        insn = program.insns[k]
        if not isinstance(insn, Store) or not insn.x_size:
            continue
        for row in range(insn.y_size):
            lo = (insn.dram_base + row * insn.x_stride) * eb
            if lo <= address < lo + insn.x_size * eb:
                return f"instruction {k} ({format_insn(insn)})"
    return "no STORE writes there"


def _unfinished(program: Program, counters: dict[str, int]) -> str:
    """The modules that did not finish their share of ``program`` by the counters (``<module>_insns``), each with
    the instruction it stopped at: ``"compute finished 3 of 5 instructions, stopped at instruction 7 (GEMM ...)"``."""
    from vta.asm import format_insn
    from vta.counters import MODULES
    from vta.isa import module_of
    routed: dict[str, list[int]] = {m: [] for m in MODULES}
    for k, insn in enumerate(program.insns):
        routed["fetch"].append(k)
        routed[module_of(insn)].append(k)
    parts = []
    for module, indices in routed.items():
        done = int(counters.get(f"{module}_insns", 0))
        if done < len(indices):
            k = indices[done]
            parts.append(f"{module} finished {done} of {len(indices)} instructions, stopped at instruction {k} "
                         f"({format_insn(program.insns[k])})")
    return "; ".join(parts) or "every module finished its instructions, yet done never rose"


def check_program(backend: Any, program: Program, feature: str) -> Outcome:
    """Run ``program`` on fsim and on ``backend``'s core (no check inside the backend) and compare."""
    from vta import fsim

    from .backend import stats_from_counters
    from .bridge import TsimBudgetError, TsimError, TsimWatchdogError
    from .compare import compare_dram, locate
    started = time.monotonic()
    expected = fsim.run(program)
    try:
        dram, out = backend.run_raw(program)
    except TsimWatchdogError as err:
        stuck = "; ".join(m.summary() for m in err.modules if m.state != "idle") or "no module busy"
        return Outcome(feature, "hang", f"no progress for {err.idle_cycles:,} cycles at cycle {err.cycles:,}: "
                                        f"{stuck}", None, time.monotonic() - started)
    except TsimBudgetError as err:
        return Outcome(feature, "hang", f"{str(err).split(' (')[0]}: {_unfinished(program, err.counters)}", None,
                       time.monotonic() - started)
    except TsimError as err:
        return Outcome(feature, "error", str(err).splitlines()[0], None, time.monotonic() - started)
    stats = stats_from_counters(out.counters, program)
    want = expected.stats.as_dict()
    problems = []
    mismatch = compare_dram(expected.dram, dram)
    if mismatch is not None:
        problems.append(f"{mismatch}, in {locate(mismatch.address, program.allocations)}, written by "
                        f"{_store_of(program, mismatch.address)}")
    differing = [f"{k} {want.get(k, 0):,} vs {stats.get(k, 0):,}" for k in sorted(want.keys() | stats.keys())
                 if want.get(k, 0) != stats.get(k, 0)]
    if differing:
        problems.append("statistics differ (fsim vs core): " + ", ".join(differing))
    seconds = time.monotonic() - started
    cycles = int(out.counters.get("cycles", out.cycles))
    return Outcome(feature, "fail" if problems else "pass", "; ".join(problems), cycles, seconds)


def check_model(backend_options: dict[str, Any], cfg: VTAConfig, model: str | Any) -> Outcome:
    """``model`` (a zoo name or ONNX file, or a model the compiler already compiled) compiled at policy ``accel``
    and run end to end on fsim and on the core: outputs and each layer's micro-ops and bytes compared."""
    from .bridge import TsimBudgetError, TsimWatchdogError
    started = time.monotonic()
    compiled = _hook("compile")(model, cfg, policy="accel") if isinstance(model, str) else model
    feature = f"model {compiled.meta.get('model', compiled.graph.name)}"
    inputs = _hook("inputs")(compiled.graph, 0)
    run = _hook("run")
    want = run(compiled, inputs, target="fsim")
    try:
        got = run(compiled, inputs, target="tsim", backend_options={**backend_options, "check": "none"})
    except Exception as err:  # noqa: BLE001 - a layer's failure is the runtime's RuntimeFailure naming the layer
        cause = err.__cause__
        status = "hang" if isinstance(cause, (TsimWatchdogError, TsimBudgetError)) else "error"
        return Outcome(feature, status, str(err).splitlines()[0], None, time.monotonic() - started)
    problems = []
    for w, g in zip(want.layers, got.layers):
        fields = [f for f in ("gemm_uops", "alu_uops", "bytes_moved") if getattr(w, f) != getattr(g, f)]
        if fields and g.where == "accel":
            problems.append(f"layer {w.layer} ({w.op}) first differs: " + ", ".join(
                f"{f} {getattr(w, f):,} vs {getattr(g, f):,}" for f in fields))
            break
    for name, array in want.outputs.items():
        other = np.asarray(got.outputs[name])
        if not np.array_equal(array, other):
            bad = np.argwhere(array != other)
            idx = tuple(int(i) for i in bad[0])
            problems.append(f"output {name!r} differs at {idx}: expected {array[idx]}, got {other[idx]} "
                            f"({len(bad)} of {array.size} values differ)")
    cycles = sum(layer.cycles or 0 for layer in got.layers)
    return Outcome(feature, "fail" if problems else "pass", "; ".join(problems), cycles,
                   time.monotonic() - started)


def run_kit(cfg: VTAConfig, *, backend_options: dict[str, Any] | None = None, seeds: int = DEFAULT_SEEDS,
            model: str | None = DEFAULT_MODEL, only: Sequence[str] = (),
            on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run the kit on the core for ``cfg`` (``backend_options`` for :class:`~vta.tsim.backend.TSimBackend`:
    ``generator``/``sources`` of a foreign core; default the generated core) and return one :class:`Outcome` per
    feature: the directed programs, ``random <seed>`` for ``seeds`` seeds, and ``model <model>`` unless ``model``
    is None. ``only``: run just the features whose names contain one of these texts. ``on_outcome`` is called as
    each finishes."""
    from vta.testing import random_program

    from .backend import TSimBackend
    from .conform_programs import features_for
    options = dict(backend_options or {})
    backend = TSimBackend(check="none", watchdog_cycles=20_000, **options)

    def wanted(name: str) -> bool:
        return not only or any(text in name for text in only)

    cases: list[tuple[str, Callable[[], Outcome]]] = [
        (name, partial(_program_case, backend, partial(make, cfg), name)) for name, make in features_for(cfg).items()]
    cases += [(f"random {seed}", partial(_program_case, backend,
                                         partial(random_program, cfg, np.random.default_rng(seed)), f"random {seed}"))
              for seed in range(seeds)]
    if model and wanted(f"model {model}"):  # compiled first: a model the compiler refuses stops the kit at once
        compiled = _hook("compile")(model, cfg, policy="accel")
        cases.append((f"model {model}", partial(check_model, options, cfg, compiled)))
    outcomes = []
    for name, case in cases:
        if not wanted(name):
            continue
        outcome = case()
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return outcomes


def _program_case(backend: Any, make: Callable[[], Program], feature: str) -> Outcome:
    """:func:`check_program` on the program ``make()`` builds (built when the case runs)."""
    return check_program(backend, make(), feature)


def format_table(outcomes: Iterable[Outcome]) -> str:
    """The outcomes as a table: feature, result, the core's cycles, and the first difference for a failure."""
    rows = list(outcomes)
    width = max([len(o.feature) for o in rows] + [7])
    lines = [f"{'feature':<{width}}  {'result':<6}  {'cycles':>9}  detail"]
    for o in rows:
        cycles = f"{o.cycles:,}" if o.cycles is not None else "-"
        lines.append(f"{o.feature:<{width}}  {o.status:<6}  {cycles:>9}  {o.detail}".rstrip())
    failed = [o for o in rows if not o.passed]
    lines.append(f"{len(rows) - len(failed)} of {len(rows)} features pass" +
                 (f"; failing: {', '.join(o.feature for o in failed)}" if failed else ""))
    return "\n".join(lines)


def register(subparsers: Any) -> None:
    """Add ``vta conform`` to the ``vta`` command's subparsers."""
    from vta.cliutil import add_config_option

    from .cli import add_rtl_options
    p = subparsers.add_parser("conform", help="conformance kit: run a core against the functional simulator",
                              description="Run the conformance kit on a core (the generated one, or a foreign core "
                                          "given with --rtl) and print a table by feature. Exit 1 when a feature "
                                          "fails or hangs, 2 when the core does not lint or its ports do not match "
                                          "the interface (before anything is built); docs/byo-rtl.md.")
    add_rtl_options(p)
    add_config_option(p)
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, metavar="N",
                   help=f"random programs to run (seeds 0..N-1; default {DEFAULT_SEEDS})")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model run end to end (default {DEFAULT_MODEL})")
    p.add_argument("--no-model", action="store_true", help="skip the end-to-end model")
    p.add_argument("--only", metavar="TEXT", action="append", default=[],
                   help="run only the features whose names contain TEXT (repeatable)")
    p.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    p.set_defaults(func=_cmd_conform)


def _cmd_conform(args: argparse.Namespace) -> int:
    from vta.cliutil import CliError, config_from_args

    from .cli import foreign_core
    if args.seeds < 0:
        raise CliError(f"--seeds must be a number of random programs >= 0, not {args.seeds}")
    cfg = config_from_args(args)
    core = foreign_core(args, cfg)  # lint and ports checked here, before any build
    what = str(core) if core else "the generated core"
    if not args.json:
        print(f"conformance of {what} at config {cfg.name}", flush=True)

    def show(outcome: Outcome) -> None:
        if not args.json:
            print(f"  {outcome.feature}: {outcome.status} ({outcome.seconds:.1f} s)", flush=True)

    outcomes = run_kit(cfg, backend_options=core.backend_options() if core else None, seeds=args.seeds,
                       model=None if args.no_model else args.model, only=args.only, on_outcome=show)
    if not outcomes:
        raise CliError(f"--only {' '.join(args.only)} matches no feature of the kit")
    if args.json:
        print(json.dumps({"config": cfg.name, "core": what, "outcomes": [asdict(o) for o in outcomes]}, indent=1))
    else:
        print(format_table(outcomes))
    return 0 if all(o.passed for o in outcomes) else 1
