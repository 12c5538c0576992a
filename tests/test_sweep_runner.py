"""vta.sweep.runner, measure and store: rows in SQLite, resume, failures and timeouts recorded, local and Dask
workers."""
from __future__ import annotations

import multiprocessing
import os
import sqlite3

import pytest

from vta.clock import model_clock
from vta.config import VTAConfig
from vta.sweep.runner import run_sweep
from vta.sweep.spec import parse_spec
from vta.sweep.store import ResultStore


def _spec(models, vary, **sweep):
    return parse_spec({"sweep": {"models": models, **sweep}, "vary": vary})


def test_rows_resume_and_retry(tmp_path):
    spec = _spec(["mini_resnet"], {"LOG_BLOCK": [3, 4], "LOG_WGT_BUFF_SIZE": [8, 18]})
    db = tmp_path / "r.sqlite"
    with ResultStore(db) as store:
        first = run_sweep(spec, store, workers=1)
        assert (first.total, first.skipped, first.ok, first.failed, first.timeout) == (4, 0, 3, 1, 0)
        rows = {r["design"]: r for r in store.rows()}
    ok = rows["1x16_i8w8a32_15_15_18_17"]
    assert ok["status"] == "ok" and ok["error"] is None and ok["model"] == "mini_resnet" and ok["mode"] == "model"
    assert ok["config"]["LOG_BLOCK"] == 4 and ok["knobs"] == {"policy": "auto", "double_buffer": True}
    assert ok["cycles"] > 0 and 0 < ok["utilization"] <= 1
    # at the design's clock from the clock model (the config leaves CLOCK_MHZ at its default)
    clock = model_clock(VTAConfig())
    assert (ok["clock_mhz"], ok["clock_source"], ok["critical_unit"]) == (clock.mhz, "model", clock.unit)
    assert ok["inferences_per_s"] == pytest.approx(1e6 / (ok["cycles"] / clock.mhz + ok["cpu_us"]))
    assert (ok["lut"], ok["ff"], ok["dsp"], ok["bram"]) == (14212, 4667, 305, 151.5)
    # energy_uj is the dynamic energy, as a run report's; energy_total_uj adds the static energy
    assert ok["energy_total_uj"] == pytest.approx(sum(ok["energy"].values()))
    assert ok["energy_uj"] == pytest.approx(ok["energy_total_uj"] - ok["energy"]["static"])
    assert ok["energy"]["static"] > 0
    assert ok["started"] <= ok["finished"] and ok["worker"].endswith(tuple("0123456789"))
    assert int(ok["worker"].rsplit(":", 1)[1]) != os.getpid()  # measured in a worker process
    bad = rows["invalid[LOG_BLOCK=4,LOG_WGT_BUFF_SIZE=8]"]
    assert bad["status"] == "failed" and bad["cycles"] is None
    assert bad["error"].startswith("invalid config: LOG_WGT_BUFF_SIZE=8 gives 256 bytes, too small for two entries")

    with ResultStore(db) as store:  # a rerun skips every recorded point
        again = run_sweep(spec, store, workers=0)
        assert (again.skipped, again.measured) == (4, 0)
    con = sqlite3.connect(db)
    with con:
        con.execute("DELETE FROM points WHERE design = '1x8_i8w8a32_15_15_8_17'")
    con.close()
    with ResultStore(db) as store:  # only the missing point is measured again
        resumed = run_sweep(spec, store, workers=0)
        assert (resumed.skipped, resumed.ok) == (3, 1)
        retried = run_sweep(spec, store, workers=0, retry=True)  # retry: failed points again, ok ones skipped
        assert (retried.skipped, retried.failed) == (3, 1)
        assert len(store.rows()) == 4 and store.counts() == {"ok": 3, "failed": 1}


def test_a_point_that_raises_is_recorded_and_the_sweep_goes_on(tmp_path):
    import onnx
    from onnx import TensorProto, helper
    junk = tmp_path / "junk.onnx"     # an ONNX model the lab refuses when a point compiles it (a file that is not
    graph = helper.make_graph(        # ONNX at all is refused with the sweep file, before any point)
        [helper.make_node("Unique", ["x"], ["y"])], "junk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), junk)
    spec = _spec([str(junk), "tiny_cnn"], {"LOG_BLOCK": [4]})
    with ResultStore(tmp_path / "r.sqlite") as store:
        summary = run_sweep(spec, store, workers=0)
        rows = {r["model"]: r for r in store.rows()}
    assert (summary.ok, summary.failed) == (1, 1)
    assert rows["tiny_cnn"]["status"] == "ok"
    failed = rows[str(junk)]
    assert failed["status"] == "failed" and "Unique" in failed["error"]
    assert failed["error"].split(":")[0].endswith("Error")  # the exception's type, then its message


def test_a_point_past_its_timeout_is_recorded_as_timeout(tmp_path):
    # resnet18 takes over a second to load, quantize and compile; 0.5 s interrupts it (the interval timer, in a worker
    # process), while tiny_cnn takes ~50 ms (ten times that on a loaded machine). How long the interrupt takes to land
    # depends on the machine (the timer's handler runs between bytecodes, not inside a BLAS call), so the test checks
    # that the point was interrupted, not that it stopped by some wall-clock time: an interrupted point has no
    # measured columns, where one that ran to the end and was then found late would have them.
    spec = _spec(["resnet18", "tiny_cnn"], {"LOG_BLOCK": [4]}, timeout=0.5)
    with ResultStore(tmp_path / "r.sqlite") as store:
        summary = run_sweep(spec, store, workers=1)
        rows = {r["model"]: r for r in store.rows()}
    assert summary.timeout == 1
    assert rows["resnet18"]["status"] == "timeout"
    assert rows["resnet18"]["error"] == "the point ran past its timeout of 0.5 s"
    assert rows["resnet18"]["cycles"] is None and rows["resnet18"]["latency_us"] is None
    assert rows["resnet18"]["seconds"] >= 0.5
    assert rows["tiny_cnn"]["status"] == "ok" and rows["tiny_cnn"]["cycles"] > 0


def test_store_rejects_unknown_columns_and_statuses(tmp_path):
    with ResultStore(tmp_path / "r.sqlite") as store:
        with pytest.raises(ValueError, match=r"unknown result columns \['colour'\]"):
            store.put({"design": "d", "model": "m", "mode": "model", "status": "ok", "colour": 1})
        with pytest.raises(ValueError, match="status must be one of ok, failed, timeout, not 'done'"):
            store.put({"design": "d", "model": "m", "mode": "model", "status": "done"})


def test_dask_local_cluster(tmp_path):
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed (pip install "
                                                                 "vta-lab[sweep])")
    spec = _spec(["tiny_cnn"], {"LOG_BLOCK": [3, 4]})
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
        with distributed.Client(cl) as client, ResultStore(tmp_path / "r.sqlite") as store:
            summary = run_sweep(spec, store, scheduler=client)
            rows = store.rows()
            worker_pids = set(client.run(os.getpid).values())
    assert (summary.ok, summary.failed) == (2, 0)
    assert {int(r["worker"].rsplit(":", 1)[1]) for r in rows} == worker_pids


def test_a_worker_killed_mid_sweep_loses_no_row(tmp_path, monkeypatch):
    """A point whose worker process is killed (SIGKILL, as the OOM killer would) each time it is measured is recorded
    failed with the reason; the points finished before, in flight beside it and after it are all recorded ok. The
    pool's workers are forked, so they inherit the patched measurement."""
    import signal

    import vta.sweep.measure as measure_module
    if multiprocessing.get_start_method() != "fork":
        pytest.skip("the patched measurement reaches the workers only when they are forked")
    evaluate = measure_module._evaluate
    victim = "1x8_i8w8a32_15_15_18_17"

    def kill_on_victim(point, deadline):
        if point.design.key == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        return evaluate(point, deadline)

    monkeypatch.setattr(measure_module, "_evaluate", kill_on_victim)
    spec = _spec(["tiny_cnn"], {"LOG_BLOCK": [3, 4], "LOG_INP_BUFF_SIZE": [14, 15]})
    with ResultStore(tmp_path / "r.sqlite") as store:
        summary = run_sweep(spec, store, workers=1)
        rows = {r["design"]: r for r in store.rows()}
    assert (summary.ok, summary.failed, summary.timeout) == (3, 1, 0)
    assert len(rows) == 4 and rows[victim]["status"] == "failed"
    assert rows[victim]["error"] == ("the worker process died twice while measuring this point (killed, or out of "
                                     "memory)")
    assert all(r["status"] == "ok" and r["cycles"] > 0 for d, r in rows.items() if d != victim)


class _KillOnVictim:
    """A Dask worker plugin (setup on every worker, restarted ones too): the worker's measurement SIGKILLs its own
    process when it meets design ``victim``, as the OOM killer would."""

    def __init__(self, victim: str) -> None:
        self.victim = victim

    def setup(self, worker) -> None:
        import signal

        import vta.sweep.measure as measure_module
        evaluate, victim = measure_module._evaluate, self.victim

        def kill_on_victim(point, deadline):
            if point.design.key == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            return evaluate(point, deadline)

        measure_module._evaluate = kill_on_victim


@pytest.mark.slow  # Dask restarts the killed worker process twice: ~20 s
def test_a_dask_worker_killed_mid_sweep_loses_no_row(tmp_path):
    """On a Dask cluster, a point that kills its worker every time is recorded failed with Dask's reason (after the
    scheduler's allowed retries); every other point is recorded ok."""
    import sys

    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed (pip install "
                                                                 "vta-lab[sweep])")
    import cloudpickle
    import dask
    from distributed.diagnostics.plugin import WorkerPlugin

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    victim = "1x8_i8w8a32_15_15_18_17"
    spec = _spec(["tiny_cnn"], {"LOG_BLOCK": [3, 4], "LOG_INP_BUFF_SIZE": [14, 15]})
    plugin = type("KillOnVictim", (_KillOnVictim, WorkerPlugin), {})(victim)
    # one task per worker at a time (no queued neighbour on the worker that dies: Dask would count the death against
    # it too), one retry before KilledWorker
    settings = {"distributed.scheduler.allowed-failures": 1, "distributed.scheduler.worker-saturation": 1.0}
    with dask.config.set(settings), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client, ResultStore(tmp_path / "r.sqlite") as store:
        client.register_plugin(plugin)
        summary = run_sweep(spec, store, scheduler=client)
        rows = {r["design"]: r for r in store.rows()}
    assert (summary.ok, summary.failed) == (3, 1)
    assert rows[victim]["status"] == "failed" and "KilledWorker" in rows[victim]["error"]
    assert all(r["status"] == "ok" and r["cycles"] > 0 for d, r in rows.items() if d != victim)


def test_buffer_size_variants_are_grouped_for_one_worker(monkeypatch):
    """Designs that differ only in buffer sizes form one task (at most GROUP points), in the order of each family's
    first point; BLOCK (or the model) starts another family."""
    from vta.sweep import runner
    monkeypatch.setattr(runner, "GROUP", 3)
    spec = _spec(["tiny_cnn", "mini_resnet"], {"LOG_BLOCK": [3, 4], "LOG_INP_BUFF_SIZE": [14, 15],
                                               "LOG_WGT_BUFF_SIZE": [17, 18]})
    groups = runner._groups(spec.points())
    described = [(g[0].model, g[0].design.fields["LOG_BLOCK"], len(g)) for g in groups]
    assert described == [("mini_resnet", 3, 3), ("mini_resnet", 3, 1), ("mini_resnet", 4, 3), ("mini_resnet", 4, 1),
                         ("tiny_cnn", 3, 3), ("tiny_cnn", 3, 1), ("tiny_cnn", 4, 3), ("tiny_cnn", 4, 1)]
    assert all(len({runner._family(p) for p in g}) == 1 for g in groups)
    assert sorted(p.key for g in groups for p in g) == sorted(p.key for p in spec.points())


def test_local_workers_are_capped_at_the_tasks(monkeypatch):
    """--workers 100000 with one point starts one process: a pool forks all its workers at once."""
    from concurrent.futures import Future

    from vta.sweep import runner
    pools: list[int] = []

    class Inline:
        """A pool that runs each task at once and records how many workers it was asked for."""

        def __init__(self, max_workers: int, initializer: object = None) -> None:
            pools.append(max_workers)

        def __enter__(self) -> "Inline":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def submit(self, fn, task):
            fut: Future = Future()
            fut.set_result(fn(task))
            return fut

    monkeypatch.setattr(runner, "ProcessPoolExecutor", Inline)
    monkeypatch.setattr(runner, "measure_group", lambda task: [{"design": p.design.key} for p in task])
    recorded: list[dict] = []
    points = _spec(["tiny_cnn"], {"LOG_BLOCK": [4]}).points()
    runner._run_local(points, 100_000, recorded.append)
    assert pools == [1] and recorded == [{"design": points[0].design.key}]
    pools.clear()
    three = _spec(["tiny_cnn", "mini_resnet"], {"LOG_BLOCK": [3, 4]}).points()  # 4 families: 4 tasks
    runner._run_local(three, 2, recorded.append)
    assert pools == [2]
