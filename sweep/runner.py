"""Run a sweep: every point not yet in the results database, on local worker processes or a Dask cluster.

* Resumable: points already recorded (any status; with ``retry``, only ``ok`` ones) are skipped.
* A point that raises or times out is recorded with its reason (:func:`vta.sweep.measure.measure`) and the sweep goes
  on; when a worker process dies, the points in flight are retried on a new pool, and one in flight at two deaths is
  recorded failed.
* Local: :class:`concurrent.futures.ProcessPoolExecutor` with ``workers`` processes (0: in this process, one point at
  a time). Dask: ``scheduler`` is the address of a ``dask.distributed`` scheduler (``tcp://host:8786``) or a
  ``Client`` already connected.
* Designs whose config is invalid are recorded failed at once, without a worker.
"""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .measure import base_row, measure
from .spec import Point, SweepSpec
from .store import STATUSES, ResultStore

__all__ = ["run_sweep", "SweepSummary"]


@dataclass
class SweepSummary:
    """What one run did: points in the sweep, skipped (already recorded), measured now by status, wall seconds."""

    total: int
    skipped: int
    ok: int = 0
    failed: int = 0
    timeout: int = 0
    seconds: float = 0.0

    @property
    def measured(self) -> int:
        return self.ok + self.failed + self.timeout

    @property
    def points_per_minute(self) -> float:
        return 60 * self.measured / self.seconds if self.seconds else 0.0


class _Progress:
    """The points to measure, done, failed and remaining (:class:`vta.progress.Progress`: a bar on a terminal, a line
    per point elsewhere); or nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        from vta.progress import Progress
        self.bar = Progress(total, desc="sweep", unit="point", enabled=enabled)
        self.total, self.done, self.failed = total, 0, 0

    def update(self, status: str, note: str = "") -> None:
        self.done += 1
        self.failed += status != "ok"
        self.bar.update(f"{note} {status}".strip(), failed=self.failed, remaining=self.total - self.done)

    def close(self) -> None:
        self.bar.close()


def run_sweep(spec: SweepSpec, store: ResultStore, *, workers: int = 2, scheduler: Any = None, retry: bool = False,
              progress: bool = False, points: list[Point] | None = None) -> SweepSummary:
    """Measure every point of ``spec`` (or ``points``) not yet in ``store``; see the module docstring."""
    start = time.monotonic()
    todo = points if points is not None else spec.points()
    done = store.finished(("ok",) if retry else STATUSES)
    pending = [p for p in todo if p.key not in done]
    summary = SweepSummary(total=len(todo), skipped=len(todo) - len(pending))
    bar = _Progress(len(pending), progress)

    def record(row: dict[str, Any]) -> None:
        store.put(row)
        setattr(summary, row["status"], getattr(summary, row["status"]) + 1)
        bar.update(row["status"], f"{row['design']} {row['model']}")

    try:
        for p in [p for p in pending if p.design.cfg is None]:
            record(measure(p))
        valid = [p for p in pending if p.design.cfg is not None]
        if scheduler is not None:
            _run_dask(valid, scheduler, record)
        elif workers <= 0:
            for p in valid:
                record(measure(p))
        else:
            _run_local(valid, workers, record)
    finally:
        bar.close()
    summary.seconds = time.monotonic() - start
    return summary


def _ordered(points: list[Point]) -> list[Point]:
    """Points grouped by model, so a worker meets the model it has already loaded again."""
    return sorted(points, key=lambda p: p.model)


def _run_local(points: list[Point], workers: int, record: Callable[[dict[str, Any]], None]) -> None:
    """Keep ``2 * workers`` points in flight on a process pool. When a worker dies, the pool cannot tell whose point
    killed it: every point in flight goes back to the queue on a new pool, and one in flight at two deaths is
    recorded failed."""
    queue = list(reversed(_ordered(points)))
    strikes: dict[tuple[str, str, str], int] = {}
    while queue:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            flying: dict[Future[dict[str, Any]], Point] = {}
            broken = False
            while (queue or flying) and not broken:
                while queue and len(flying) < 2 * workers:
                    try:
                        fut = pool.submit(measure, queue[-1])
                    except BrokenProcessPool:  # a worker died since the last wait: no new work on this pool
                        broken = True
                        break
                    flying[fut] = queue.pop()
                if broken or not flying:
                    break
                finished, _ = wait(flying, return_when=FIRST_COMPLETED)
                if any(isinstance(f.exception(), BrokenProcessPool) for f in finished):
                    break
                for fut in finished:
                    p = flying.pop(fut)
                    try:
                        record(fut.result())
                    except Exception as err:  # noqa: BLE001 - e.g. a result that cannot be unpickled
                        record(_died(p, f"the worker could not return the point: {type(err).__name__}: {err}"))
            for fut, p in flying.items():  # the pool broke
                if fut.done() and fut.exception() is None:
                    record(fut.result())
                    continue
                strikes[p.key] = strikes.get(p.key, 0) + 1
                if strikes[p.key] >= 2:
                    record(_died(p, "the worker process died twice while measuring this point (killed, or out of "
                                    "memory)"))
                else:
                    queue.append(p)


def _died(point: Point, reason: str) -> dict[str, Any]:
    row = base_row(point)
    row.update(status="failed", error=reason)
    return row


def _run_dask(points: Iterable[Point], scheduler: Any, record: Callable[[dict[str, Any]], None]) -> None:
    """Submit every point to a Dask cluster and record results as they complete."""
    from dask.distributed import Client, as_completed
    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    try:
        futures = {client.submit(measure, p, pure=False): p for p in _ordered(list(points))}
        for fut in as_completed(futures):
            try:
                record(fut.result())
            except Exception as err:  # noqa: BLE001 - a lost worker fails the point, not the sweep
                record(_died(futures[fut], f"the Dask task failed: {type(err).__name__}: {err}"))
    finally:
        if client is not scheduler:
            client.close()
