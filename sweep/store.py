"""Sweep results in SQLite: one row per (design, model, mode) point.

Only the process running the sweep writes (workers return their rows to it), one transaction per row, so a killed
sweep keeps every point finished before it and a rerun skips them (:meth:`ResultStore.finished`).

Columns (units): ``design`` (unique key: config name, clock, knobs), ``config_name`` (canonical name), ``config``
(VTA keys -> values, JSON), ``knobs`` (JSON), ``model``, ``mode``, ``status`` (``ok``, ``failed``, ``timeout``),
``error`` (the reason, for failed and timed-out points), ``cycles`` (accelerator cycles of one inference, summed over
the accelerator layers), ``cpu_us`` (estimated CPU time of the layers left on the CPU, microseconds), ``latency_us``,
``inferences_per_s`` (at ``clock_mhz``, accelerator and CPU layers in sequence), ``utilization`` (MACs on the
accelerator over cycles x BATCH x BLOCK_IN x BLOCK_OUT), ``macs``, ``accel_macs``, ``accel_layers``, ``cpu_layers``,
``bound`` (the module bounding most accelerator cycles, as a run report's ``totals["bound"]``: each layer's bound is
the module that held an instruction the most cycles -- busy, waiting on a token or on memory --, fetch excluded, from
the cycle model in model mode and from the core's counters in exact mode; :func:`vta.compiler.report.run_bound`),
``lut``,
``ff``, ``dsp``, ``bram`` (RAMB36 units), ``area_clb`` (CLB-equivalents), ``energy_uj`` (dynamic energy per
inference, microjoules: the accelerator layers' events and the CPU layers' MACs, as a run report's
``totals["energy_uj"]``; :func:`vta.compiler.report.step_energy`), ``energy_total_uj`` (``energy_uj`` plus the static
energy of the design's area over the inference's latency: what the energy frontier ranks), ``energy`` (component ->
microjoules, JSON, ``static`` included),
``compile_s``, ``measure_s``, ``seconds`` (wall time of the point), ``worker``, ``started``, ``finished`` (ISO 8601
UTC), ``area_from`` (``model``: the analytical area model; ``yosys``: per-module synthesis, :mod:`vta.sweep.synth`),
``area_s`` (seconds spent on the area; 0 for cached modules and the model), ``layers`` (JSON, one object per layer
in graph order: ``layer``, ``op``, ``where`` (``accel`` or ``cpu``), ``macs``, ``energy_uj``; an accelerator layer's
``cycles`` and ``bound``, a CPU layer's estimated ``cpu_us``: what the sweep explorer shows for a clicked design),
``clock_mhz`` (the design's clock ``latency_us`` is at: the clock model's, :func:`vta.clock.model_clock`, or the
config's CLOCK_MHZ when it is not the default 100), ``clock_source`` (``model`` or ``user``) and ``critical_unit``
(the unit of the model's critical path, e.g. ``compute.alu``; empty for a user's clock), ``accuracy`` (percent: the
model quantized to the design's input/weight widths, on the integer reference; test accuracy with labelled evaluation
data, else top-1 agreement with float32; :mod:`vta.sweep.accuracy`) and ``accuracy_on`` (what it was measured on).
"""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Iterator

__all__ = ["ResultStore", "StoreError", "COLUMNS", "STATUSES", "REQUIRED"]

STATUSES = ("ok", "failed", "timeout")
COLUMNS: dict[str, str] = {
    "design": "TEXT NOT NULL", "config_name": "TEXT", "config": "TEXT", "knobs": "TEXT", "model": "TEXT NOT NULL",
    "mode": "TEXT NOT NULL", "status": "TEXT NOT NULL", "error": "TEXT", "cycles": "INTEGER", "cpu_us": "REAL",
    "latency_us": "REAL", "inferences_per_s": "REAL", "utilization": "REAL", "macs": "INTEGER",
    "accel_macs": "INTEGER", "accel_layers": "INTEGER", "cpu_layers": "INTEGER", "bound": "TEXT", "lut": "INTEGER",
    "ff": "INTEGER", "dsp": "INTEGER", "bram": "REAL", "area_clb": "REAL", "energy_uj": "REAL", "energy": "TEXT",
    "energy_total_uj": "REAL",
    "compile_s": "REAL", "measure_s": "REAL", "seconds": "REAL", "worker": "TEXT", "started": "TEXT",
    "finished": "TEXT", "area_from": "TEXT", "area_s": "REAL", "layers": "TEXT",
    "clock_mhz": "REAL", "clock_source": "TEXT", "critical_unit": "TEXT",
    "accuracy": "REAL", "accuracy_on": "TEXT",
}
"""Column -> SQLite type of the ``points`` table, in order."""
_JSON = {"config": dict, "knobs": dict, "energy": dict, "layers": list}
"""The columns stored as JSON text -> the kind of value each holds."""
REQUIRED = ("design", "model", "mode", "status")
"""The columns without which a table ``points`` is not a sweep's (a database read with ``readonly``)."""


class StoreError(ValueError):
    """The results database cannot be opened or is not one (its folder is missing, the file is not SQLite, ...):
    the message names the file and the reason."""


class ResultStore:
    """The results database at ``path`` (created with its table when missing); :class:`StoreError` when the file
    cannot be opened as one, or is another program's SQLite database (tables, but no ``points`` with the
    :data:`REQUIRED` columns): that file is left unchanged.

    With ``readonly`` (``vta report SWEEP.sqlite``) the file is opened read-only and never changed: it must exist and
    hold a ``points`` table with the :data:`REQUIRED` columns (columns a newer version added read as None); nothing
    can be :meth:`put`."""

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.path = os.fspath(path)
        if readonly:
            self._db = self._open_readonly()
            return
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise StoreError(f"{self.path}: the folder {folder} does not exist; create it first")
        try:
            self._db = sqlite3.connect(self.path)
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: cannot open the results database ({err})") from None
        self._db.row_factory = sqlite3.Row
        cols = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
        try:
            foreign = _foreign(self._db)  # before anything is written: another program's database is left alone
            if foreign:
                self._db.close()
                raise StoreError(f"{self.path}: not a results database of vta sweep: {foreign}; give another --db or "
                                 f"move this file away")
            with self._db:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(f"CREATE TABLE IF NOT EXISTS points (id INTEGER PRIMARY KEY, {cols}, "
                                 "UNIQUE (design, model, mode))")
                have = {r[1] for r in self._db.execute("PRAGMA table_info(points)")}
                for name, kind in COLUMNS.items():  # a database from an older version gains the newer columns
                    if name not in have:
                        self._db.execute(f"ALTER TABLE points ADD COLUMN {name} {kind}")
        except sqlite3.Error as err:
            self._db.close()
            raise StoreError(f"{self.path}: not a results database of vta sweep ({err}); give another --db "
                             "or move this file away") from None

    def _open_readonly(self) -> sqlite3.Connection:
        """A read-only connection to an existing results database. Without a write-ahead log beside the file (no
        sweep is writing it) the file is opened immutable, so SQLite creates no ``-wal``/``-shm`` files either."""
        if not os.path.isfile(self.path):
            raise StoreError(f"{self.path}: no such file")
        live = os.path.exists(self.path + "-wal")
        uri = Path(os.path.abspath(self.path)).as_uri() + ("?mode=ro" if live else "?mode=ro&immutable=1")
        try:
            db = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: cannot open the results database ({err})") from None
        try:
            foreign = _foreign(db) or ("" if _tables(db) else "it holds no tables (an empty file?)")
        except sqlite3.Error as err:
            db.close()
            raise StoreError(f"{self.path}: not a results database of vta sweep ({err})") from None
        if foreign:
            db.close()
            raise StoreError(f"{self.path}: not a results database of vta sweep: {foreign}")
        db.row_factory = sqlite3.Row
        return db

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put(self, row: dict[str, Any]) -> None:
        """Insert or replace the row of point (``row["design"]``, ``row["model"]``, ``row["mode"]``) and commit."""
        unknown = set(row) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown result columns {sorted(unknown)}; columns are {', '.join(COLUMNS)}")
        if row.get("status") not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {row.get('status')!r}")
        values = {k: json.dumps(v) if k in _JSON and v is not None else v for k, v in row.items()}
        names = ", ".join(values)
        marks = ", ".join(f":{k}" for k in values)
        with self._db:
            self._db.execute(f"INSERT OR REPLACE INTO points ({names}) VALUES ({marks})", values)

    def finished(self, statuses: tuple[str, ...] = STATUSES) -> set[tuple[str, str, str]]:
        """(design, model, mode) of every point recorded with one of ``statuses``."""
        marks = ", ".join("?" for _ in statuses)
        cur = self._db.execute(f"SELECT design, model, mode FROM points WHERE status IN ({marks})", statuses)
        return {(r[0], r[1], r[2]) for r in cur}

    def rows(self, *, mode: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """Every row (JSON columns decoded), optionally only of ``mode`` and ``status``, in insertion order."""
        return list(self._iter(mode, status))

    def _iter(self, mode: str | None, status: str | None) -> Iterator[dict[str, Any]]:
        where, args = [], []
        for col, value in (("mode", mode), ("status", status)):
            if value is not None:
                where.append(f"{col} = ?")
                args.append(value)
        sql = "SELECT * FROM points" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        try:
            for r in self._db.execute(sql, args):
                row = {**dict.fromkeys(COLUMNS), **dict(r)}  # a column an older database lacks reads as None
                for k, kind in _JSON.items():
                    if row[k] is not None:
                        row[k] = self._decoded(row, k, kind)
                yield _upgrade(row)
        except sqlite3.Error as err:
            raise StoreError(f"{self.path}: cannot read the results ({err})") from None

    def _decoded(self, row: dict[str, Any], column: str, kind: type) -> Any:
        """The JSON text of ``row[column]`` decoded; :class:`StoreError` naming the file, the row and the column when it
        is not JSON of ``kind``."""
        try:
            value = json.loads(row[column])
        except (TypeError, ValueError, RecursionError):
            value = None
        if not isinstance(value, kind):
            raise StoreError(f"{self.path}: row {row.get('id')} ({row.get('design')}): column {column} is not a JSON "
                             f"{'object' if kind is dict else 'array'}, as a results database of vta sweep holds")
        return value

    def counts(self) -> dict[str, int]:
        """Status -> number of rows."""
        return {r[0]: r[1] for r in self._db.execute("SELECT status, COUNT(*) FROM points GROUP BY status")}


def _tables(db: sqlite3.Connection) -> list[str]:
    """The names of the tables in ``db``, sorted."""
    return [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]


def _foreign(db: sqlite3.Connection) -> str:
    """Why ``db`` is another program's database ("" when it is empty or a results database): it has tables but no
    ``points``, or a ``points`` table without the :data:`REQUIRED` columns."""
    tables = _tables(db)
    if tables and "points" not in tables:
        return f"it has no table points (its tables: {', '.join(tables)})"
    have = {r[1] for r in db.execute("PRAGMA table_info(points)")}
    missing = [c for c in REQUIRED if c not in have]
    return f"its table points lacks the columns {', '.join(missing)}" if tables and missing else ""


def _upgrade(row: dict[str, Any]) -> dict[str, Any]:
    """A row written before ``energy_total_uj`` existed, read with today's meanings: its ``energy_uj`` included the
    static energy, so that is its ``energy_total_uj`` and the static part comes off ``energy_uj``."""
    energy = row.get("energy")
    if row.get("energy_total_uj") is None and row.get("energy_uj") is not None and isinstance(energy, dict) and \
            "static" in energy:
        row["energy_total_uj"] = row["energy_uj"]
        row["energy_uj"] = row["energy_uj"] - energy["static"]
    return row
