"""Run a sweep: every point not yet in the results database, on local worker processes or a Dask cluster.

* Resumable: points already recorded (any status; with ``retry``, only ``ok`` ones) are skipped.
* A point that raises or times out is recorded with its reason (:func:`vta.sweep.measure.measure`) and the sweep goes
  on; when a worker process dies, the points in flight are retried on a new pool, and one in flight at two deaths is
  recorded failed.
* Local: :class:`concurrent.futures.ProcessPoolExecutor` with ``workers`` processes (0: in this process, one point at
  a time; never more processes than tasks to give them). Designs that differ only in buffer sizes go to one worker
  as a group (up to :data:`GROUP` points, measured one after the other), so the schedule candidates one finds serve
  the next in that worker's memory instead of two workers searching the same layers at once. Dask: ``scheduler`` is
  the address of a ``dask.distributed`` scheduler (``tcp://host:8786``) or a ``Client`` already connected.
* Designs whose config is invalid are recorded failed at once, without a worker.
* The accuracy objective (:mod:`vta.sweep.accuracy`) is measured once per sweep, not once per worker: the chunks of
  the models' evaluation sets that the points need and the cache lacks go to the workers first, costliest first
  (:func:`vta.sweep.accuracy.accuracy_jobs`), then the points, which find their accuracy cached (or wait on the
  lock of a chunk still being computed). A job that fails is logged; its points measure what is missing
  themselves and record any error in ``accuracy_on``.
"""
from __future__ import annotations

import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Iterable, cast

from .accuracy import AccuracyJob, accuracy_jobs, run_accuracy_job
from .measure import base_row, measure
from .spec import Point, SweepSpec
from .store import STATUSES, ResultStore

__all__ = ["run_sweep", "SweepSummary", "GROUP"]

GROUP = 8
"""Points of one model whose designs differ only in buffer sizes that a local worker measures in one task."""

log = logging.getLogger("vta")


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
        _fetch_models(valid)
        jobs = _accuracy_jobs(valid)
        if scheduler is not None:
            _run_dask(valid, scheduler, record, jobs)
        elif workers <= 0:
            for job in jobs:
                _job_done(job, _call(run_accuracy_job, job))
            for p in valid:
                record(measure(p))
        else:
            _run_local(valid, workers, record, jobs)
    finally:
        bar.close()
    summary.seconds = time.monotonic() - start
    return summary


def _fetch_models(points: list[Point]) -> None:
    """Build (or export) each zoo model of ``points`` into the cache here, once, before the workers load it (two
    workers would otherwise both export EfficientNet-Lite0 with torch). A model that cannot be built is left to
    its points, which record why."""
    from vta.compiler.frontend.zoo import get_model, list_models
    for model in sorted({p.model for p in points} & set(list_models())):
        try:
            get_model(model)
        except Exception as err:  # noqa: BLE001 - reported by each point of the model
            log.debug("zoo model %s not built before the sweep: %s: %s", model, type(err).__name__, err)


def _accuracy_jobs(points: list[Point]) -> list[AccuracyJob]:
    """The accuracy chunks ``points`` need that the cache lacks (none when the cache cannot be read: the points
    measure their accuracy themselves)."""
    needed = {(p.model, p.design.cfg.inp_width, p.design.cfg.wgt_width) for p in points if p.design.cfg is not None}
    try:
        jobs, problems = accuracy_jobs(sorted(needed))
    except Exception as err:  # noqa: BLE001 - the accuracy is an objective, not a reason to stop the sweep
        log.warning("the accuracy objective cannot be planned (%s: %s); each point measures its own",
                    type(err).__name__, err)
        return []
    for model, why in problems.items():
        log.warning("no evaluation set for %s (%s); its points record why their accuracy is empty", model, why)
    return jobs


def _call(fn: Callable[[Any], Any], arg: Any) -> BaseException | None:
    """``fn(arg)`` in this process; the exception it raised, else None."""
    try:
        fn(arg)
    except Exception as err:  # noqa: BLE001 - reported by _job_done
        return err
    return None


def _job_done(job: AccuracyJob, error: BaseException | None) -> None:
    """Log an accuracy job that failed (its points measure the missing chunk again and record the error)."""
    if error is not None:
        log.warning("the accuracy of %s (chunk %d of its evaluation set) failed: %s: %s", job.model, job.chunk,
                    type(error).__name__, error)


def _ordered(points: list[Point]) -> list[Point]:
    """Points grouped by model, so a worker meets the model it has already loaded again."""
    return sorted(points, key=lambda p: p.model)


def _family(point: Point) -> tuple[Any, ...]:
    """What a point's schedule search depends on but buffer sizes: model, mode, knobs, every other config field."""
    fields = tuple(sorted((k, v) for k, v in point.design.fields.items() if not k.endswith("_BUFF_SIZE")))
    return (point.model, point.mode, json.dumps(point.design.knobs, sort_keys=True), fields)


def _groups(points: list[Point]) -> list[tuple[Point, ...]]:
    """``points`` (in :func:`_ordered` order) in groups of at most :data:`GROUP` of one :func:`_family`, in the order
    of each family's first point."""
    families: dict[tuple[Any, ...], list[list[Point]]] = {}
    for p in _ordered(points):
        chunks = families.setdefault(_family(p), [[]])
        if len(chunks[-1]) == GROUP:
            chunks.append([])
        chunks[-1].append(p)
    return [tuple(chunk) for chunks in families.values() for chunk in chunks]


def measure_group(points: tuple[Point, ...]) -> list[dict[str, Any]]:
    """:func:`vta.sweep.measure.measure` of each point in turn (each within its own timeout), in one worker."""
    return [measure(p) for p in points]


def _run_local(points: list[Point], workers: int, record: Callable[[dict[str, Any]], None],
               jobs: list[AccuracyJob] | None = None) -> None:
    """Keep two tasks per worker process in flight on a pool of ``workers`` processes (fewer when fewer tasks are
    left): the accuracy ``jobs`` first, then the points in :func:`_groups`. When a worker dies, the pool cannot tell
    whose task killed it: every point in flight goes back to the queue on a new pool, a group's points each alone,
    and one in flight alone at two deaths is recorded failed
    (an accuracy job in flight is dropped: its points measure what it lacked)."""
    queue: list[tuple[Point, ...] | AccuracyJob] = [*reversed(_groups(points)), *reversed(jobs or [])]
    strikes: dict[tuple[str, str, str], int] = {}
    while queue:
        processes = min(workers, len(queue))  # a pool forks all its workers at once: no idle ones
        with ProcessPoolExecutor(max_workers=processes, initializer=_one_blas_thread) as pool:
            flying: dict[Future[Any], tuple[Point, ...] | AccuracyJob] = {}
            broken = False
            while (queue or flying) and not broken:
                while queue and len(flying) < 2 * processes:
                    task = queue[-1]
                    try:
                        if isinstance(task, AccuracyJob):
                            fut: Future[Any] = pool.submit(run_accuracy_job, task)
                        else:
                            fut = pool.submit(measure_group, task)
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
                    task = flying.pop(fut)
                    if isinstance(task, AccuracyJob):
                        _job_done(task, fut.exception())
                        continue
                    try:
                        rows = cast(list[dict[str, Any]], fut.result())
                    except Exception as err:  # noqa: BLE001 - e.g. a result that cannot be unpickled
                        why = f"the worker could not return the point: {type(err).__name__}: {err}"
                        rows = [_died(p, why) for p in task]
                    for row in rows:
                        record(row)
            for fut, task in flying.items():  # the pool broke
                if isinstance(task, AccuracyJob):
                    continue
                if fut.done() and fut.exception() is None:
                    for row in cast(list[dict[str, Any]], fut.result()):
                        record(row)
                    continue
                if len(task) > 1:  # which of the group killed the worker is unknown: each is tried alone
                    queue.extend((p,) for p in reversed(task))
                    continue
                for p in task:
                    strikes[p.key] = strikes.get(p.key, 0) + 1
                    if strikes[p.key] >= 2:
                        record(_died(p, "the worker process died twice while measuring this point (killed, or out "
                                        "of memory)"))
                    else:
                        queue.append((p,))


def _one_blas_thread() -> None:
    """A worker's BLAS (numpy's OpenBLAS: the integer reference's and calibration's matrix products) runs on one
    thread: the workers already fill the cores, and OpenBLAS threads that wait for a core spin (on the loaded 2-core
    machine, 2 threads per worker took 6x the CPU time and 5x the wall time of one for ResNet-18's reference)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


def _died(point: Point, reason: str) -> dict[str, Any]:
    row = base_row(point)
    row.update(status="failed", error=reason)
    return row


def _run_dask(points: Iterable[Point], scheduler: Any, record: Callable[[dict[str, Any]], None],
              jobs: list[AccuracyJob] | None = None) -> None:
    """Submit the accuracy ``jobs`` (at a higher priority) and every point to a Dask cluster and record the points'
    results as they complete."""
    from dask.distributed import Client, as_completed
    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    try:
        accuracy = {client.submit(run_accuracy_job, job, pure=False, priority=1): job for job in jobs or []}
        futures = {client.submit(measure, p, pure=False): p for p in _ordered(list(points))}
        for fut in as_completed([*accuracy, *futures]):
            if fut in accuracy:
                _job_done(accuracy[fut], fut.exception())
                continue
            try:
                record(fut.result())
            except Exception as err:  # noqa: BLE001 - a lost worker fails the point, not the sweep
                record(_died(futures[fut], f"the Dask task failed: {type(err).__name__}: {err}"))
    finally:
        if client is not scheduler:
            client.close()
