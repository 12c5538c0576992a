"""The fault campaign's machinery: a probe, running it in a limited subprocess, classifying what happened, the table.

A :class:`Probe` is one command (a ``vta`` invocation or a :mod:`worker` task) with an optional ``setup`` that
writes its inputs into the probe's own folder, an optional signal sent at a time after the start, and a ``judge``
that turns the finished :class:`Run` into a :class:`Verdict`: one outcome from :data:`OUTCOMES`, plus a note. After
every probe, the campaign's protected files (:class:`Guard`) are checksummed: a change is a lost file.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

OUTCOMES: tuple[str, ...] = ("clear", "traceback", "hang", "crash", "code_exec", "wrong", "lost", "orphans", "ok")
"""What a probe can come to, in the table's column order: a clear error, the defects, then ``ok`` (the command ran
and its result was verified)."""

COLUMNS: dict[str, str] = {"clear": "clear errors", "traceback": "tracebacks", "hang": "hangs",
                           "crash": "crashes by signal", "code_exec": "code executions",
                           "wrong": "silent wrong results", "lost": "files lost", "orphans": "orphans", "ok": "ran ok"}
"""Table headings of :data:`OUTCOMES`."""

DEFECTS: tuple[str, ...] = ("traceback", "hang", "crash", "code_exec", "wrong", "lost", "orphans")
"""The outcomes whose count must stay zero (the floor)."""

WORKER = Path(__file__).with_name("worker.py")
RESULT_PREFIX = "FAULT-RESULT "


@dataclass
class Run:
    """A finished probe process: exit code (negative: killed by that signal), output, wall time, whether it timed
    out, and the probe's folder."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    folder: Path
    sent_signal: int | None = None
    signal_seconds: float | None = None

    def result(self) -> dict[str, Any] | None:
        """The worker's ``FAULT-RESULT`` JSON, or None when it printed none."""
        for line in self.stdout.splitlines():
            if line.startswith(RESULT_PREFIX):
                return dict(json.loads(line[len(RESULT_PREFIX):]))
        return None

    def excerpt(self, lines: int = 4) -> str:
        """The last few lines of the output, for the report."""
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " | ".join(line.strip()[:200] for line in text[-lines:])


@dataclass
class Verdict:
    """A probe's outcome (one of :data:`OUTCOMES`) and a note saying why."""

    outcome: str
    note: str = ""


@dataclass
class Probe:
    """One probe. ``argv``: the command (run in ``folder``); ``setup(folder)`` prepares its inputs;
    ``judge(run) -> Verdict`` classifies it (default :func:`judge_cli`); ``send`` = (signal, seconds after the
    start) to interrupt it; ``marker``: a file name in the folder that a planted payload would create."""

    family: str
    name: str
    argv: list[str]
    setup: Callable[[Path], None] | None = None
    judge: Callable[[Run], Verdict] | None = None
    timeout: float = 90.0
    mem_mb: int = 4096
    send: tuple[int, float] | None = None
    marker: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Record:
    """A probe's run and verdict, as the report lists it."""

    probe: Probe
    run: Run
    verdict: Verdict


def vta_argv(*args: str) -> list[str]:
    """The ``vta`` command line, run as ``python -m vta`` with this interpreter."""
    return [sys.executable, "-m", "vta", *args]


def worker_argv(task: str, payload: dict[str, Any]) -> list[str]:
    """The command line of a :mod:`worker` task."""
    return [sys.executable, str(WORKER), task, json.dumps(payload)]


def _limits(mem_mb: int) -> Callable[[], None]:
    """What the child does before it starts the command: the memory limit, no core files, and SIGINT back to its
    default (a campaign started in the background, e.g. under nohup, inherits SIGINT ignored, and Python then never
    raises KeyboardInterrupt: the SIGINT probes would test nothing)."""
    def apply() -> None:
        limit = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    return apply


def execute(probe: Probe, folder: Path, env: dict[str, str]) -> Run:
    """Run ``probe``'s command in ``folder`` under its memory limit (RLIMIT_AS) and wall-clock timeout, in a session
    of its own; send its signal when due. A probe past its timeout is killed with its whole process group."""
    started = time.monotonic()
    proc = subprocess.Popen(probe.argv, cwd=folder, env={**env, **probe.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_limits(probe.mem_mb),
                            start_new_session=True)
    timed_out = False
    sent_at = None
    if probe.send is not None:
        signum, delay = probe.send
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            sent_at = time.monotonic() - started
            proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=max(1.0, probe.timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    ended = time.monotonic() - started
    return Run(proc.returncode, out, err, ended, timed_out, folder,
               probe.send[0] if sent_at is not None and probe.send else None,
               None if sent_at is None else ended - sent_at)


def judge_cli(run: Run, on_success: Callable[[Run], Verdict] | None = None) -> Verdict:
    """The common verdict of a ``vta`` command: hang, crash, traceback, a clear error (exit 1 or 2 and one
    ``vta: error:`` line), or on exit 0 ``on_success(run)`` (default: ok)."""
    early = judge_process(run)
    if early is not None:
        return early
    if run.returncode == 0:
        return on_success(run) if on_success else Verdict("ok")
    errors = [line for line in run.stderr.splitlines() if line.startswith("vta: error:")]
    if run.returncode in (1, 2) and errors:
        return Verdict("clear", errors[0][:160])
    return Verdict("traceback", f"exit {run.returncode} without a 'vta: error:' line")


def judge_process(run: Run) -> Verdict | None:
    """Hang, crash or traceback, whatever the command; None when the process ended by itself without one."""
    if run.timed_out:
        return Verdict("hang", f"no exit within {run.seconds:.0f} s")
    if run.returncode < 0 and run.returncode != -(run.sent_signal or 0):
        return Verdict("crash", f"killed by signal {-run.returncode} ({signal.Signals(-run.returncode).name})")
    if "Traceback (most recent call last)" in run.stderr:
        return Verdict("traceback", "a Python traceback on stderr")
    return None


def judge_worker(run: Run, on_result: Callable[[dict[str, Any]], Verdict]) -> Verdict:
    """The verdict of a worker task: process-level problems first, then ``on_result`` of its JSON result."""
    early = judge_process(run)
    if early is not None:
        return early
    result = run.result()
    if run.returncode != 0 or result is None:
        return Verdict("traceback", f"worker exit {run.returncode} without a result")
    return on_result(result)


def sha256_file(path: Path) -> str:
    """The SHA-256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Guard:
    """Files that no probe may damage: each is checksummed at :meth:`add` and compared after every probe. A check
    may also be a callable returning None (intact) or a problem (e.g. a cache entry's manifest check)."""

    def __init__(self) -> None:
        self.files: dict[Path, str] = {}
        self.checks: dict[str, Callable[[], str | None]] = {}

    def add(self, path: Path) -> None:
        """Protect ``path`` as it is now."""
        self.files[path] = sha256_file(path)

    def add_check(self, name: str, check: Callable[[], str | None]) -> None:
        """Protect something ``check`` verifies."""
        self.checks[name] = check

    def damage(self) -> list[str]:
        """What changed since :meth:`add`: one line per damaged file or failed check."""
        problems = []
        for path, digest in self.files.items():
            if not path.exists():
                problems.append(f"{path} is gone")
            elif sha256_file(path) != digest:
                problems.append(f"{path} changed")
        for name, check in self.checks.items():
            problem = check()
            if problem is not None:
                problems.append(f"{name}: {problem}")
        return problems


def tally(records: list[Record]) -> dict[str, dict[str, int]]:
    """Counts of each outcome per family, and over all (``"total"``)."""
    table: dict[str, dict[str, int]] = {}
    for rec in records:
        for row in (rec.probe.family, "total"):
            table.setdefault(row, {name: 0 for name in OUTCOMES})[rec.verdict.outcome] += 1
    if "total" in table:
        table["total"] = table.pop("total")
    return table


def format_table(table: dict[str, dict[str, int]]) -> str:
    """The campaign's table as Markdown: one row per family, the probe count and one column per outcome."""
    head = ["family", "probes", *COLUMNS.values()]
    rows = [[fam, str(sum(counts.values())), *(str(counts[o]) for o in OUTCOMES)] for fam, counts in table.items()]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(head, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join(lines)
