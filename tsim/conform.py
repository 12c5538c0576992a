"""The conformance kit: does a core (the lab's own, or a foreign one) execute the ISA as the functional simulator does?

    vta conform [--rtl FILE... [--top NAME]] [--config FILE] [--seeds N] [--no-model] [--only TEXT] [--thorough]
                [--json]

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

The directed programs include corner values (ALU operands and immediates at their range edges, GEMM with extreme
operands until the accumulators wrap, every loop shape and pad combination) and long token streams run at several
memory read latencies (``stress tokens <seed> [latency L]``) and under seeded random backpressure with extra read
latency on every memory channel (``stress tokens <seed> backpressure``, :class:`vta.tsim.bridge.Stall`);
``--thorough`` runs longer streams at more seeds and latencies, each also under backpressure, and more random
programs, each also under backpressure. The host-side cases of :mod:`vta.tsim.conform_host` reset the core between
programs on the same model (``corner reset ...``) and move DRAM regions to high addresses through a sparse image
(``corner addresses high ...``). :class:`Coverage` records the bins the programs exercised (opcodes x operand
classes, gemm accumulator extremes, loop shapes, pad combinations, token queue depths), printed under the table and
in the JSON, so a pass says what it covered.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from contextlib import contextmanager
from dataclasses import asdict
from functools import partial
from typing import Any, Callable, Iterable, Iterator, Sequence
from unittest.mock import patch

import numpy as np

from vta.config import VTAConfig
from vta.program import Program

from .conform_result import Outcome, _unfinished, result_problems
from .conform_timing import CYCLES_SLACK, timing_counter_problems

__all__ = ["Outcome", "Coverage", "run_kit", "check_program", "format_table", "format_coverage", "token_depths",
           "register", "MODEL_HOOKS", "DEFAULT_SEEDS", "DEFAULT_MODEL", "STRESS_LATENCIES", "THOROUGH_LATENCIES",
           "backpressure", "THOROUGH_SEEDS", "CYCLES_SLACK", "timing_counter_problems", "result_problems"]

DEFAULT_SEEDS = 4
"""Random programs run by default (seeds 0, 1, ...)."""
DEFAULT_MODEL = "tiny_cnn"
"""The model run end to end by default."""
MODEL_HOOKS = {"compile": "vta.compiler.pipeline:compile_model", "inputs": "vta.compiler.pipeline:random_inputs",
               "run": "vta.compiler.runtime.executor:run", "zoo": "vta.compiler.frontend.zoo:list_models"}
"""The compiler's entry points the model case uses, by name (imported on first use: ``vta.tsim`` does not import
the compiler's floor; see docs/architecture.md)."""


# ---- functional coverage --------------------------------------------------------------------------------------------
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_VALUE_CLASSES = ("min", "neg", "-1", "0", "1", "pos", "max")
_SHIFT_CLASSES = tuple(f"{kind}{wrap}" for wrap in ("", " wrapped") for kind in
                       ("0", "right 1-30", "right 31", "left 1-30", "left 31", "left 32"))
"""SHR amounts by their 6-bit value (right 0..31, left 1..32), as written or wrapped from beyond [-32, 31]."""
_ARITH_OPS = ("MIN", "MAX", "ADD", "MUL")
_STALL_BINS = ("rd_req_ready held low", "read beat held back", "wr_ready held low")
"""The backpressure bins of the harness's stall counts (:attr:`vta.tsim.bridge.RunOutput.stalls`), in order."""
_SHAPES = ("0", "1", "many")


def _value_class(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Index into :data:`_VALUE_CLASSES` of each value (``lo``/``hi``: the extremes of its range)."""
    return np.select([v == lo, v == hi, v == -1, v == 0, v == 1, v < 0], [0, 6, 2, 3, 4, 1], 5)


def _shift_class(b: np.ndarray) -> np.ndarray:
    """Index into :data:`_SHIFT_CLASSES` of each SHR amount as written (its low 6 bits, signed, are the amount)."""
    n = ((b & 63) ^ 32) - 32
    kind = np.select([n == 0, (n > 0) & (n < 31), n == 31, (n < 0) & (n > -31), n == -31], [0, 1, 2, 3, 4], 5)
    return kind + 6 * ((b < -32) | (b > 31))


class Coverage:
    """Bins of the ISA's features the programs exercised (functional coverage), so that a pass means "passed what was
    covered". Groups (each a set of bin names, of which :meth:`report` counts those hit):

    * ``instructions``: each LOAD memory type, GEMM with and without reset, each ALU opcode with an immediate and
      with a vector operand (REQ: vector only, the ISA has no immediate form), STORE, FINISH;
    * ``alu operands``: opcode x operand form x the classes of both operands (as fsim executed them): min, negative,
      -1, 0, 1, positive, max of int32 (of the 16-bit field for an immediate); for SHR the amount: 0, right 1-30,
      right 31, left 1-30, left 31, left 32, each as written or wrapped from beyond the lane width;
    * ``gemm accumulators``: a GEMM result that wrapped past INT32_MAX, past INT32_MIN, or landed within 2**20 of
      either (the accumulator's full width);
    * ``loop shapes``: GEMM and ALU loops by micro-ops, outer and inner iterations, each 0, 1 or many;
    * ``pads``: each LOAD memory type with each of the 16 combinations of padded sides, and with a pad of 15;
    * ``token depth``: each queue holding 1, 2, 3 or 4+ tokens at once, as far as the program lets it: the depth
      reached when the queue's consumer runs last (a token-only run of the program with in-order fetch and the
      config's queue depths);
    * ``backpressure``: what the host did to the memory port in the runs under random backpressure
      (:class:`vta.tsim.bridge.Stall`, the harness's counts): held ``mem_rd_req_ready`` low, held back a read beat
      that was due, held ``mem_wr_ready`` low, and delayed read requests by an extra latency.
    """

    def __init__(self, cfg: VTAConfig) -> None:
        from vta.config import MEM_NAMES
        from vta.isa import TOKEN_QUEUES, alu_opcodes
        self.cfg = cfg
        loads = [MEM_NAMES[m] for m in (0, 1, 2, 3, 5)]
        ops = list(alu_opcodes(cfg).values())
        self.bins: dict[str, list[str]] = {
            "instructions": [f"LOAD {m}" for m in loads] + ["GEMM", "GEMM reset"]
            + [f"ALU {op} {form}" for op in ops for form in ("imm", "vector") if (op, form) != ("REQ", "imm")]
            + ["STORE", "FINISH"],
            "alu operands": [f"{op} {form} {a} x {b}" for op in _ARITH_OPS for form in ("imm", "vector")
                             for a in _VALUE_CLASSES for b in _VALUE_CLASSES]
            + [f"SHR {form} {a} x {b}" for form in ("imm", "vector") for a in _VALUE_CLASSES for b in _SHIFT_CLASSES],
            "gemm accumulators": ["wraps up", "wraps down", "near max", "near min"],
            "loop shapes": [f"{kind} uops {u} out {o} in {i}" for kind in ("GEMM", "ALU") for u in _SHAPES
                            for o in _SHAPES for i in _SHAPES],
            "pads": [f"{m} {combo}" for m in loads for combo in
                     [("".join(side for bit, side in zip(range(4), ("T", "B", "L", "R")) if c >> bit & 1) or "none")
                      for c in range(16)] + ["pad 15"]],
            "token depth": [f"{q.replace('_to_', '->')} {d}" for q in TOKEN_QUEUES for d in ("1", "2", "3", "4+")],
            "backpressure": list(_STALL_BINS) + ["extra read latency"],
        }
        self.hit: set[str] = set()
        self.deepest: dict[str, int] = dict.fromkeys((q.replace("_to_", "->") for q in TOKEN_QUEUES), 0)

    # -- what fsim executes (values) --
    def alu(self, opcode: int, a: Any, b: Any, use_imm: bool) -> None:
        from vta.isa import ALU_NAMES
        name = ALU_NAMES.get(opcode, "")
        if name not in _ARITH_OPS and name != "SHR":
            return
        a64 = np.asarray(a, np.int64)
        b64 = np.broadcast_to(np.asarray(b, np.int64), a64.shape).reshape(-1)
        a64 = a64.reshape(-1)
        form = "imm" if use_imm else "vector"
        ca = _value_class(a64, _INT32_MIN, _INT32_MAX)
        if name == "SHR":
            cb, names = _shift_class(b64), _SHIFT_CLASSES
        else:
            lo, hi = (-32768, 32767) if use_imm else (_INT32_MIN, _INT32_MAX)
            cb, names = _value_class(b64, lo, hi), _VALUE_CLASSES
        for pair in np.unique(ca * len(names) + cb):
            self.hit.add(f"{name} {form} {_VALUE_CLASSES[pair // len(names)]} x {names[pair % len(names)]}")

    def gemm_results(self, values: Any) -> None:
        v = np.asarray(values, np.int64)
        near = 1 << 20
        for bin_, mask in (("wraps up", v > _INT32_MAX), ("wraps down", v < _INT32_MIN),
                           ("near max", (v > _INT32_MAX - near) & (v <= _INT32_MAX)),
                           ("near min", (v < _INT32_MIN + near) & (v >= _INT32_MIN))):
            if mask.any():
                self.hit.add(bin_)

    # -- what the program holds (instructions) --
    def program(self, program: Program) -> None:
        from vta.config import MEM_NAMES
        from vta.isa import ALU_NAMES, Alu, Finish, Gemm, Load, Store
        for insn in program.insns:
            if isinstance(insn, Load) and insn.mem in MEM_NAMES and insn.x_size:
                mem = MEM_NAMES[insn.mem]
                self.hit.add(f"LOAD {mem}")
                pads = (insn.y_pad_0, insn.y_pad_1, insn.x_pad_0, insn.x_pad_1)
                self.hit.add(f"{mem} " + ("".join(s for p, s in zip(pads, "TBLR") if p) or "none"))
                if max(pads) == 15:
                    self.hit.add(f"{mem} pad 15")
            elif isinstance(insn, Store) and insn.x_size:
                self.hit.add("STORE")
            elif isinstance(insn, Finish):
                self.hit.add("FINISH")
            elif isinstance(insn, (Gemm, Alu)):
                kind = "GEMM" if isinstance(insn, Gemm) else "ALU"
                if isinstance(insn, Gemm):
                    self.hit.add("GEMM reset" if insn.reset else "GEMM")
                else:
                    self.hit.add(f"ALU {ALU_NAMES.get(insn.alu_opcode)} {'imm' if insn.use_imm else 'vector'}")
                shape = [_SHAPES[min(n, 2)] for n in (insn.uop_end - insn.uop_bgn, insn.iter_out, insn.iter_in)]
                self.hit.add(f"{kind} uops {shape[0]} out {shape[1]} in {shape[2]}")
        for queue, depth in token_depths(program).items():
            name = queue.replace("_to_", "->")
            self.deepest[name] = max(self.deepest[name], depth)
            for d in range(1, min(depth, 4) + 1):
                self.hit.add(f"{name} {'4+' if d == 4 else d}")

    # -- what the host did (a run under random backpressure) --
    def stalls(self, stall: Any, out: Any) -> None:
        """A run under ``stall`` (:class:`vta.tsim.bridge.Stall`) that finished with ``out``
        (:class:`vta.tsim.bridge.RunOutput`)."""
        self.hit.update(name for name, count in zip(_STALL_BINS, out.stalls) if count)
        if stall.extra_latency and out.rd_requests:
            self.hit.add("extra read latency")

    def report(self) -> dict[str, dict[str, Any]]:
        """Per group: bins ``hit`` of ``total`` and the ``missed`` bins' names."""
        out: dict[str, dict[str, Any]] = {}
        for group, names in self.bins.items():
            missed = [n for n in names if n not in self.hit]
            out[group] = {"hit": len(names) - len(missed), "total": len(names), "missed": missed}
        out["token depth"]["deepest"] = dict(self.deepest)
        return out


def token_depths(program: Program) -> dict[str, int]:
    """For each token queue, the most tokens it holds at once when its consumer runs last: a token-only run of the
    program (fetch in program order into command queues of ``cmd_queue_depth``, each module in order, a pop waits for
    a token, a push for room below ``token_queue_depth``) that runs every other module before the consumer."""
    from vta.isa import TOKEN_QUEUES, Finish, insn_pops, insn_pushes, module_of
    cfg = program.cfg
    consumers = {"load_to_compute": "compute", "compute_to_load": "load", "compute_to_store": "store",
                 "store_to_compute": "compute"}
    insns = [i for i in program.insns if not isinstance(i, Finish)]
    depths = {}
    for queue in TOKEN_QUEUES:
        level = dict.fromkeys(TOKEN_QUEUES, 0)
        pending: dict[str, list[Any]] = {"load": [], "compute": [], "store": []}
        fetched, deepest = 0, 0
        order = [m for m in ("load", "compute", "store") if m != consumers[queue]] + [consumers[queue]]
        while True:
            while fetched < len(insns) and len(pending[module_of(insns[fetched])]) < cfg.cmd_queue_depth:
                pending[module_of(insns[fetched])].append(insns[fetched])
                fetched += 1
            for module in order:
                if pending[module]:
                    head = pending[module][0]
                    pops, pushes = insn_pops(head), insn_pushes(head)
                    if all(level[q] > 0 for q in pops) and all(level[q] < cfg.token_queue_depth for q in pushes):
                        for q in pops:
                            level[q] -= 1
                        for q in pushes:
                            level[q] += 1
                        pending[module].pop(0)
                        deepest = max(deepest, level[queue])
                        break
            else:
                break
        depths[queue] = deepest
    return depths


@contextmanager
def _observing(coverage: Coverage | None) -> Iterator[None]:
    """While fsim runs, record the ALU operands and GEMM results it computes in ``coverage`` (fsim's own kernels,
    wrapped: the values are the spec's)."""
    if coverage is None:
        yield
        return
    from vta import fsim
    alu_op, wrap32 = fsim.alu_op, fsim.wrap32

    def observed_alu(opcode: int, a: Any, b: Any, imm: int = 0) -> Any:
        coverage.alu(opcode, a, b, np.ndim(b) == 0)
        return alu_op(opcode, a, b, imm)

    def observed_wrap(values: Any) -> Any:  # fsim wraps GEMM results (and nothing else) with it
        coverage.gemm_results(values)
        return wrap32(values)

    with patch.object(fsim, "alu_op", observed_alu), patch.object(fsim, "wrap32", observed_wrap):
        yield


def _hook(name: str) -> Callable[..., Any]:
    module, _, attr = MODEL_HOOKS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def check_program(backend: Any, program: Program, feature: str, *, latency: int | None = None,
                  coverage: Coverage | None = None, stall: Any = None) -> Outcome:
    """Run ``program`` on fsim and on ``backend``'s core (no check inside the backend) and compare. ``latency``: the
    memory's read latency in cycles for this run (default the config's ``dram_latency``). ``coverage``: record the
    bins the program exercises there. ``stall``: random backpressure and extra read latency for the run
    (:class:`vta.tsim.bridge.Stall`; None: none), named in the outcome's detail when the run fails."""
    from vta import fsim

    from .backend import cycle_budget
    from .bridge import TsimBudgetError, TsimError, TsimWatchdogError
    started = time.monotonic()
    with _observing(coverage):
        expected = fsim.run(program)
    if coverage is not None:
        coverage.program(program)
    under = f" (under {stall})" if stall is not None else ""
    try:
        if latency is None and stall is None:
            dram, out = backend.run_raw(program)
        else:
            latency = program.cfg.dram_latency if latency is None else latency
            extra = stall.extra_latency if stall is not None else 0  # the budget allows the longest extra latency
            budget = cycle_budget(program, watchdog_cycles=backend.watchdog_cycles, latency=latency + extra)
            dram, out = backend.model(program.cfg).run_program(
                program, max_cycles=budget.cycles, watchdog_cycles=backend.watchdog_cycles, latency=latency,
                budget_note=f" (the default budget derived from the program: {budget})", stall=stall)
    except TsimWatchdogError as err:
        stuck = "; ".join(m.summary() + _queues_popped(program, m) for m in err.modules if m.state != "idle") \
            or "no module busy"
        return Outcome(feature, "hang", f"no progress for {err.idle_cycles:,} cycles at cycle {err.cycles:,}: "
                                        f"{stuck}{under}", None, time.monotonic() - started)
    except TsimBudgetError as err:
        return Outcome(feature, "hang", f"{str(err).split(' (')[0]}: {_unfinished(program, err.counters)}{under}",
                       None, time.monotonic() - started)
    except TsimError as err:
        return Outcome(feature, "error", str(err).splitlines()[0] + under, None, time.monotonic() - started)
    if coverage is not None and stall is not None:
        coverage.stalls(stall, out)
    problems = result_problems(program, expected, dram, out, latency)
    seconds = time.monotonic() - started
    cycles = int(out.counters.get("cycles", out.cycles))
    return Outcome(feature, "fail" if problems else "pass", "; ".join(problems) + (under if problems else ""),
                   cycles, seconds)


def _queues_popped(program: Program, module: Any) -> str:
    """For a module stuck waiting for a token: the queues its instruction pops, e.g. `` (it pops load->compute)``;
    when the token counts say the tokens were pushed, one of these queues lost a token."""
    from vta.isa import insn_pops
    if module.state != "wait_token" or module.insn_index is None:
        return ""
    queues = [q.replace("_to_", "->") for q in insn_pops(program.insns[module.insn_index])]
    return f" (it pops {' and '.join(queues)})" if queues else ""


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


STRESS_LATENCIES = (None, 1, 3, 100)
"""Read latencies (cycles; None: the config's) the ``stress tokens`` programs run at by default."""
STRESS_STREAMS = 2
"""``stress tokens`` streams (seeds 0, 1, ...) run by default, each at every latency."""
THOROUGH_LATENCIES = (None, 1, 2, 3, 5, 7, 64, 257)
THOROUGH_SEEDS = 16
"""Random programs (and ``stress tokens`` seeds: a quarter as many) that ``--thorough`` runs."""


def backpressure(seed: int, *, heavy: bool = False) -> Any:
    """The random backpressure the kit runs programs under (:class:`vta.tsim.bridge.Stall`), seeded by ``seed``:
    each memory channel (read requests, read data, writes) stalled in a quarter of the cycles and up to 16 extra
    read cycles; ``heavy`` (``--thorough``): half the cycles and up to 64."""
    from .bridge import Stall
    if heavy:
        return Stall(seed=seed, rd_req=0.5, rd_data=0.5, wr=0.5, extra_latency=64)
    return Stall(seed=seed)


def run_kit(cfg: VTAConfig, *, backend_options: dict[str, Any] | None = None, seeds: int = DEFAULT_SEEDS,
            model: str | None = DEFAULT_MODEL, only: Sequence[str] = (), thorough: bool = False,
            coverage: Coverage | None = None, on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run the kit on the core for ``cfg`` (``backend_options`` for :class:`~vta.tsim.backend.TSimBackend`:
    ``generator``/``sources`` of a foreign core; default the generated core) and return one :class:`Outcome` per
    feature: the directed programs (corner values, and :data:`STRESS_STREAMS` ``stress tokens <seed>`` streams at
    each latency of :data:`STRESS_LATENCIES` and once under :func:`backpressure`, ``stress tokens <seed>
    backpressure``), ``random <seed>`` for ``seeds`` seeds, and ``model <model>`` unless ``model`` is None.
    ``thorough``: the stress streams :data:`~vta.tsim.conform_programs.THOROUGH_ROUNDS` long, at four seeds and the
    latencies of :data:`THOROUGH_LATENCIES`, each also under heavy backpressure (``... backpressure``), and at least
    :data:`THOROUGH_SEEDS` random programs, each also under backpressure. ``only``: run just
    the features whose names contain one of these texts. ``coverage``: a :class:`Coverage` the programs that run are
    recorded in. ``on_outcome`` is called as each finishes."""
    from vta.testing import random_program

    from .backend import TSimBackend
    from .conform_host import host_cases
    from .conform_programs import STRESS_ROUNDS, THOROUGH_ROUNDS, features_for, stress_program
    options = dict(backend_options or {})
    backend = TSimBackend(check="none", watchdog_cycles=20_000, **options)

    def wanted(name: str) -> bool:
        return not only or any(text in name for text in only)

    def case(name: str, make: Callable[[], Program], latency: int | None = None,
             stall: Any = None) -> tuple[str, Callable[[], Outcome]]:
        return name, partial(_program_case, backend, make, name, latency, coverage, stall)

    if thorough:
        seeds = max(seeds, THOROUGH_SEEDS)
    cases = [case(name, partial(make, cfg)) for name, make in features_for(cfg).items() if name != "stress tokens"]
    cases += host_cases(cfg, backend, thorough=thorough)
    latencies = THOROUGH_LATENCIES if thorough else STRESS_LATENCIES
    for seed in range(max(seeds // 4, STRESS_STREAMS) if thorough else STRESS_STREAMS):
        make = partial(stress_program, cfg, seed, THOROUGH_ROUNDS if thorough else STRESS_ROUNDS)
        for k, latency in enumerate(latencies):
            name = f"stress tokens {seed}" + (f" latency {latency}" if latency is not None else "")
            cases.append(case(name, make, latency))
            if thorough:
                cases.append(case(f"{name} backpressure", make, latency, backpressure(100 * seed + k, heavy=True)))
        if not thorough:
            cases.append(case(f"stress tokens {seed} backpressure", make, None, backpressure(seed)))
    for seed in range(seeds):
        make = partial(random_program, cfg, np.random.default_rng(seed))
        cases.append(case(f"random {seed}", make))
        if thorough:
            cases.append(case(f"random {seed} backpressure", make, None, backpressure(seed)))
    if model and wanted(f"model {model}"):  # compiled first: a model the compiler refuses stops the kit at once
        compiled = _hook("compile")(model, cfg, policy="accel")
        cases.append((f"model {model}", partial(check_model, options, cfg, compiled)))
    outcomes = []
    for name, run in cases:
        if not wanted(name):
            continue
        outcome = run()
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return outcomes


def _program_case(backend: Any, make: Callable[[], Program], feature: str, latency: int | None,
                  coverage: Coverage | None, stall: Any = None) -> Outcome:
    """:func:`check_program` on the program ``make()`` builds (built when the case runs)."""
    return check_program(backend, make(), feature, latency=latency, coverage=coverage, stall=stall)


def format_coverage(report: dict[str, dict[str, Any]], *, shown: int = 4) -> str:
    """:meth:`Coverage.report` as lines: each group's bins hit of its total, and the first ``shown`` it missed."""
    lines = ["coverage (bins the programs exercised; the model run is not counted):"]
    for group, entry in report.items():
        line = f"  {group:<18} {entry['hit']:>4} of {entry['total']:<4}"
        if group == "token depth":
            line += "  deepest: " + ", ".join(f"{q} {d}" for q, d in entry["deepest"].items())
        missed = entry["missed"]
        if missed:
            line += f"  missed: {', '.join(missed[:shown])}" + (f" and {len(missed) - shown} more"
                                                                 if len(missed) > shown else "")
        lines.append(line.rstrip())
    return "\n".join(lines)


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
    from vta.cliutil import add_config_option, command_doc

    from .cli import add_rtl_options
    p = subparsers.add_parser("conform", help="conformance kit: run a core against the functional simulator",
                              description=command_doc(_cmd_conform))
    add_rtl_options(p)
    add_config_option(p)
    p.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, metavar="N",
                   help=f"random programs to run (seeds 0..N-1; default {DEFAULT_SEEDS})")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model run end to end (default {DEFAULT_MODEL})")
    p.add_argument("--no-model", action="store_true", help="skip the end-to-end model")
    p.add_argument("--only", metavar="TEXT", action="append", default=[],
                   help="run only the features whose names contain TEXT (repeatable)")
    p.add_argument("--thorough", action="store_true",
                   help=f"the full stress: token streams of more rounds at more seeds and read latencies, at least "
                        f"{THOROUGH_SEEDS} random programs (minutes)")
    p.add_argument("--json", action="store_true", help="print the outcomes and the coverage as JSON")
    p.set_defaults(func=_cmd_conform)


def _cmd_conform(args: argparse.Namespace) -> int:
    """Run the conformance kit on a core (the generated one, or a foreign core given with --rtl) and print a table
    by feature. Exit 1 when a feature fails or hangs, 2 when the core does not lint or its ports do not match the
    interface (before anything is built); docs/byo-rtl.md."""
    from vta.cliutil import CliError, config_from_args

    from .cli import foreign_core
    if args.seeds < 0:
        raise CliError(f"--seeds must be a number of random programs >= 0, not {args.seeds}")
    cfg = config_from_args(args)
    if not args.no_model and args.model not in _hook("zoo")() and not os.path.isfile(args.model):
        raise CliError(f"--model {args.model}: neither a zoo model ({', '.join(_hook('zoo')())}) nor an ONNX file; "
                       f"the kit's end-to-end case runs it (--no-model leaves that case out)")
    core = foreign_core(args, cfg)  # lint and ports checked here, before any build
    what = str(core) if core else "the generated core"
    if not args.json:
        print(f"conformance of {what} at config {cfg.name}", flush=True)

    def show(outcome: Outcome) -> None:
        if not args.json:
            print(f"  {outcome.feature}: {outcome.status} ({outcome.seconds:.1f} s)", flush=True)

    coverage = Coverage(cfg)
    outcomes = run_kit(cfg, backend_options=core.backend_options() if core else None, seeds=args.seeds,
                       model=None if args.no_model else args.model, only=args.only, thorough=args.thorough,
                       coverage=coverage, on_outcome=show)
    if not outcomes:
        raise CliError(f"--only {' '.join(args.only)} matches no feature of the kit")
    if args.json:
        print(json.dumps({"config": cfg.name, "core": what, "outcomes": [asdict(o) for o in outcomes],
                          "coverage": coverage.report()}, indent=1))
    else:
        print(format_table(outcomes))
        print(format_coverage(coverage.report()))
    return 0 if all(o.passed for o in outcomes) else 1
