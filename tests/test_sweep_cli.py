"""`vta sweep FILE` (vta.sweep.cli through the vta command) and scripts/sweep.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from vta.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "scripts" / "sweeps" / "small.toml"


def test_vta_sweep_prints_the_frontier_and_names_the_files(tmp_path, capsys):
    db, plots = tmp_path / "s.sqlite", tmp_path / "plots"
    argv = ["sweep", str(SMALL), "--db", str(db), "--plot-dir", str(plots), "--workers", "0", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "sweep small: 4 designs x 2 models = 8 points, mode model" in out
    assert "6 ok, 2 failed, 0 timed out; 0 already in" in out
    assert "frontier, throughput vs area (all models, " in out and "frontier, energy vs area (all models, " in out
    assert "1x16_i8w8a32_15_15_18_17 " in out
    assert out.rstrip().endswith(f"wrote {db} (results database)\nwrote {plots / 'pareto_throughput.png'} (frontier "
                                 f"plot)\nwrote {plots / 'pareto_energy.png'} (frontier plot)")
    assert main(argv) == 0  # a rerun measures nothing
    assert "measured 0 points" in capsys.readouterr().out


def test_vta_sweep_writes_into_build_by_default(tmp_path, monkeypatch, capsys):
    """Without --db and --plot-dir: build/NAME.sqlite and build/NAME-plots/ of the current folder, build/ created."""
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(SMALL), "--workers", "0", "--no-progress"]) == 0
    plots = Path("build") / "small-plots"
    assert capsys.readouterr().out.rstrip().endswith(
        f"wrote {Path('build') / 'small.sqlite'} (results database)\nwrote {plots / 'pareto_throughput.png'} (frontier "
        f"plot)\nwrote {plots / 'pareto_energy.png'} (frontier plot)")
    assert (tmp_path / "build" / "small.sqlite").is_file() and (tmp_path / plots / "pareto_energy.png").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build"]


def test_vta_sweep_reports_every_problem_of_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[sweep]\nmodels = []\nmode = "fast"\n')
    assert main(["sweep", str(bad), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert f"invalid sweep file {bad} (2 problems)" in err
    assert "models must be a non-empty list" in err and "mode must be one of 'model', 'exact', not 'fast'" in err


def test_a_database_that_cannot_be_opened_is_refused_before_any_work(tmp_path, capsys):
    """--db in a missing folder, or a file that is not SQLite: one exit-2 line naming it, the file left as it was."""
    missing = tmp_path / "nope" / "s.sqlite"
    assert main(["sweep", str(SMALL), "--db", str(missing), "--workers", "0", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"vta: error: --db {missing}: the folder {missing.parent} does not exist; create it first\n"
    assert "points, mode" not in captured.out and not missing.parent.exists()
    notes = tmp_path / "notes.sqlite"
    notes.write_text("my notes, not a database\n")
    assert main(["sweep", str(SMALL), "--db", str(notes), "--workers", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vta: error: --db {notes}: not a results database of vta sweep (")
    assert notes.read_text() == "my notes, not a database\n"


def test_script_runs_the_same_command(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "sweep.py"), str(SMALL), "--workers", "0",
                           "--no-progress", "--db", str(tmp_path / "s.sqlite"), "--plot-dir", str(tmp_path / "p")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"wrote {tmp_path / 's.sqlite'} (results database)" in done.stdout
    assert (tmp_path / "p" / "pareto_energy.png").is_file()


def test_check_measures_model_points_again_in_exact_mode(tmp_path, capsys):
    import pytest
    pytest.importorskip("pyverilator")
    sweep = tmp_path / "one.toml"
    sweep.write_text('[sweep]\nmodels = ["tiny_cnn"]\n[vary]\nLOG_BLOCK = [4]\n')
    argv = ["sweep", str(sweep), "--db", str(tmp_path / "s.sqlite"), "--plot-dir", str(tmp_path / "p"),
            "--workers", "0", "--no-progress", "--check", "1", "--check-area", "model"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "exact check of 1 model points (1 measured now, 0 already in the database; area: model):" in out
    line = next(x for x in out.splitlines() if x.startswith("  1x16_i8w8a32_15_15_18_17"))
    model_cycles, tsim_cycles = (int(v.replace(",", "")) for v in line.split()[2:4])
    assert line.split()[4] == f"{100 * (model_cycles - tsim_cycles) / tsim_cycles:+.2f}%"
    assert "cycle model: mean |error|" in out
    assert main(argv) == 0  # the exact point is in the database now
    assert "(0 measured now, 1 already in the database; area: model)" in capsys.readouterr().out
    assert main(argv[:-4] + ["--check", "-1"]) == 2


def test_workers_above_the_maximum_are_refused(tmp_path, capsys):
    from vta.sweep.cli import MAX_WORKERS
    db = tmp_path / "s.sqlite"
    for workers in (MAX_WORKERS + 1, 100_000, -1):
        assert main(["sweep", str(SMALL), "--db", str(db), "--workers", str(workers), "--no-progress"]) == 2
        assert capsys.readouterr().err == (
            f"vta: error: --workers must be between 0 and {MAX_WORKERS} local processes, not {workers} (each holds a "
            f"model and its compiler in memory; --scheduler ADDR runs on a Dask cluster)\n")
    assert not db.exists()


def test_a_grid_too_large_and_a_bad_timeout_are_refused_naming_the_file(tmp_path, capsys):
    """A grid of 5.35e12 designs: exit 2 at once, naming the file and suggesting samples (it ran out of memory)."""
    huge = tmp_path / "huge.toml"
    values = ", ".join(str(v) for v in range(1, 40))
    fields = ("DRAM_LATENCY", "CMD_QUEUE_DEPTH", "TOKEN_QUEUE_DEPTH", "BUS_BYTES", "LOG_UOP_BUFF_SIZE",
              "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE", "LOG_ACC_BUFF_SIZE")
    huge.write_text('[sweep]\nmodels = ["tiny_cnn"]\ntimeout = nan\n[vary]\n'
                    + "".join(f"{f} = [{values}]\n" for f in fields))
    assert main(["sweep", str(huge), "--db", str(tmp_path / "h.sqlite"), "--workers", "0", "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"vta: error: invalid sweep file {huge} (2 problems):\n  - timeout must be a "
                                   f"positive number of seconds, not nan")
    assert "= 5,352,009,260,481 designs, 5,352,009,260,481 points on 1 model: more than the 100,000 points" in \
        captured.err and "give samples = N in [sweep]" in captured.err
    assert captured.out == "" and not (tmp_path / "h.sqlite").exists()


def test_another_programs_database_is_refused_as_db_and_left_unchanged(tmp_path, capsys):
    """--db naming an SQLite file of other tables: it was given a points table (and WAL mode) and the sweep ran."""
    import sqlite3
    notes = tmp_path / "notes.sqlite"
    db = sqlite3.connect(notes)
    with db:
        db.execute("CREATE TABLE foo (x)")
    db.close()
    before = notes.read_bytes()
    assert main(["sweep", str(SMALL), "--db", str(notes), "--workers", "0", "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"vta: error: --db {notes}: not a results database of vta sweep: it has no "
                                       f"table points (its tables: foo); give another --db or move this file away\n")
    assert notes.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["notes.sqlite"]


def test_the_sweep_says_why_points_failed(tmp_path, capsys):
    """scripts/sweeps/small.toml's invalid design: the run names each failed point and the first line of its error
    (it printed "2 failed" and nothing else; the reasons were only in the database)."""
    code = main(["sweep", str(Path(__file__).resolve().parent.parent / "scripts" / "sweeps" / "small.toml"),
                 "--db", str(tmp_path / "s.sqlite"), "--plot-dir", str(tmp_path), "--workers", "0", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "points not measured (2; the reasons are the database's error column):" in out
    assert out.count("failed: invalid config: LOG_WGT_BUFF_SIZE=8 gives 256 bytes") == 2, out
