"""The rough edges a first-time user hit (issue 16), each pinned: a compiled model (.vtac) accepted wherever a
program is (`vta disasm MODEL.vtac [--layer NAME]`, `vta tsim run MODEL.vtac --layer NAME`), every file a command
writes named on standard output, unknown output suffixes refused before any work, the per-layer plot readable at
ResNet-50 scale."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from vta.asm import assemble
from vta.cli import main
from vta.compiler.report import roofline_path
from vta.config import VTAConfig
from vta.programfile import ProgramFileError, read_program, read_programs


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mini_resnet compiled with every supported layer on the accelerator (several accelerator layers)."""
    path = tmp_path_factory.mktemp("vtac") / "mini.vtac"
    assert main(["compile", "mini_resnet", "--policy", "accel", "--no-progress", "-o", str(path)]) == 0
    return path


def test_read_programs_of_a_model_and_a_program(model: Path, tmp_path: Path) -> None:
    programs = read_programs(model)
    names = [name for name, _ in programs]
    assert len(programs) > 1 and len(set(names)) == len(names)
    name, program = read_program(model, names[1])
    assert name == names[1] and program.insns == programs[1][1].insns
    program.save(tmp_path / "one.npz")
    assert read_program(tmp_path / "one.npz")[0] == "one.npz"
    with pytest.raises(ProgramFileError, match=f"choose one with --layer NAME: {names[0]}, "):
        read_program(model)
    with pytest.raises(ProgramFileError, match="has no accelerator layer 'nope'; its accelerator layers are "):
        read_program(model, "nope")
    with pytest.raises(ProgramFileError, match=r"is not a program file: expected \.npz or \.vtac"):
        read_programs(tmp_path / "model.onnx")


def test_disasm_a_model_whole_and_one_layer(model: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    programs = read_programs(model)
    code, out, err = run(capsys, "disasm", str(model))
    assert code == 0 and err == ""
    assert [line[len("# layer "):] for line in out.splitlines() if line.startswith("# layer ")] == \
        [name for name, _ in programs]
    name, program = programs[-1]
    code, out, _ = run(capsys, "disasm", str(model), "--layer", name)
    assert code == 0 and out.splitlines()[0] == f"# layer {name}"
    assert assemble(out, VTAConfig()) == program.insns  # the text reassembles to the layer's instructions
    text = tmp_path / "layer.s"
    code, out, _ = run(capsys, "disasm", str(model), "--layer", name, "-o", str(text))
    assert (code, out) == (0, f"wrote {text} ({len(program.insns)} instructions as text)\n")
    assert assemble(text.read_text(), VTAConfig()) == program.insns
    code, out, err = run(capsys, "disasm", str(model), "--layer", "nope")
    assert code == 2 and out == "" and err.startswith(f"vta: error: {model} has no accelerator layer 'nope'")
    code, _, err = run(capsys, "disasm", "--raw", str(text), "--layer", name)
    assert code == 2 and err == "vta: error: --layer picks a layer of a compiled model (.vtac), not of a raw binary\n"


def test_tsim_run_refuses_before_any_build(model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Errors that need no Verilator model: a missing --layer, an unknown layer, a waveform suffix."""
    code, _, err = run(capsys, "tsim", "run", str(model))
    assert code == 2 and "accelerator layers; choose one with --layer NAME: " in err
    name = read_programs(model)[0][0]
    code, _, err = run(capsys, "tsim", "run", str(model), "--layer", name, "--trace", "wave.png")
    assert (code, err) == (2, "vta: error: --trace wave.png: a waveform is written as .vcd or .fst, not .png\n")


def test_tsim_run_one_layer_of_a_model_with_a_waveform(model: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`vta tsim run MODEL.vtac --layer NAME --trace F.vcd`: the layer on the RTL, checked against fsim (uses the
    default config's VCD build, shared with docs/tutorials/04_rtl.py)."""
    name, program = read_programs(model)[0]
    wave = tmp_path / "layer.vcd"
    code, out, err = run(capsys, "tsim", "run", str(model), "--layer", name, "--trace", str(wave), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["layer"] == name and report["cycles"] > 0 and report["trace"] == str(wave)
    assert report["counters"]["fetch_insns"] == len(program.insns)
    assert wave.read_text(errors="replace").startswith("$") and "$enddefinitions" in wave.read_text(errors="replace")


def test_run_names_every_file_it_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = {"--report-json": tmp_path / "r.json", "--report-csv": tmp_path / "r.csv", "--plot": tmp_path / "p.svg"}
    argv = ["run", "tiny_cnn", "--no-progress"] + [str(x) for pair in files.items() for x in pair]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    roofline = Path(roofline_path(str(files["--plot"])))
    assert out.splitlines()[-4:] == [f"wrote {files['--report-json']} (per-layer report, JSON)",
                                     f"wrote {files['--report-csv']} (per-layer report, CSV)",
                                     f"wrote {files['--plot']} (per-layer plot)",
                                     f"wrote {roofline} (roofline plot)"]
    assert all(path.stat().st_size > 0 for path in [*files.values(), roofline])
    code, out, err = run(capsys, *argv, "--json")  # stdout stays one JSON document; the names go to stderr
    assert code == 0 and json.loads(out)["model"] and f"wrote {files['--plot']} (per-layer plot)" in err


def test_the_per_layer_plot_is_readable_at_resnet50_scale() -> None:
    """ResNet-50's report has ~75 rows: every layer name gets a label of at least 8 points, rotated upright, and no
    two labels overlap (measured on the rendered figure)."""
    import dataclasses

    from vta.compiler.pipeline import compile_model, random_inputs
    from vta.compiler.report import build_report
    from vta.compiler.runtime.executor import run as run_compiled

    compiled = compile_model("tiny_cnn", VTAConfig())
    report = build_report(compiled, run_compiled(compiled, random_inputs(compiled.graph, seed=0)))
    rows = [dict(row, layer=f"{row['layer']}_{k:03d}") for k in range(13) for row in report.rows]
    assert len(rows) >= 75
    fig = dataclasses.replace(report, rows=rows).figure()
    fig.canvas.draw()
    labels = [t for t in fig.axes[-1].get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in labels] == [row["layer"] for row in rows]
    assert all(t.get_fontsize() >= 8 and t.get_rotation() == 90 for t in labels)
    boxes = [t.get_window_extent() for t in labels]
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), "x labels overlap"
    assert fig.get_size_inches()[0] >= 0.28 * len(rows)
    import matplotlib.pyplot as plt
    plt.close(fig)


@pytest.mark.parametrize("argv,message", [
    (["disasm", "{dir}/p.npz", "-o", "{dir}/p.npz"], "-o {dir}/p.npz: assembly text is written as .s or .asm or .txt, "
                                                    "not .npz"),
    (["asm", "{dir}/p.s", "-o", "{dir}/p.txt"],
     "-o {dir}/p.txt: a raw instruction binary is written as .bin, not .txt"),
    (["asm", "{dir}/p.s", "-o", "{dir}/p.bin", "--uop-output", "{dir}/u"],
     "--uop-output {dir}/u: a raw micro-op binary is written as .bin, not a file without a suffix"),
    (["sweep", "{sweep}", "--db", "{dir}/s.csv"], "--db {dir}/s.csv: the results database is written as .sqlite, "
                                                  ".sqlite3 or .db, not .csv"),
])
def test_an_unknown_output_suffix_is_refused_before_any_work(argv: list[str], message: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    sweep = Path(__file__).resolve().parents[1] / "scripts" / "sweeps" / "small.toml"
    argv = [a.format(dir=tmp_path, sweep=sweep) for a in argv]
    code, out, err = run(capsys, *argv)
    assert (code, out, err) == (2, "", f"vta: error: {message.format(dir=tmp_path)}\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing read, nothing written


def test_a_build_waiting_on_another_process_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A second builder of the same cache entry logs that it waits for the lock's holder, then uses its build."""
    import threading

    from vta.cache import cached_build, entry_lock

    def make(folder: Path) -> dict:
        (folder / "lib.so").write_bytes(b"built")
        return {}

    holder = entry_lock(tmp_path, "k1")
    holder.acquire()
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(cached_build(tmp_path, "k1", make, required=["lib.so"],
                                                                         what="Verilator model")))
    with caplog.at_level(logging.WARNING, logger="vta"):
        waiter.start()
        for _ in range(200):
            if "another process is building" in caplog.text:
                break
            waiter.join(0.01)
        assert waiter.is_alive()                                   # still waiting, and said so
        holder.release()
        waiter.join(10)
    assert (f"another process is building the Verilator model k1 (its lock {tmp_path / 'k1.lock'} is held); "
            f"waiting for it to finish, then using its build") in caplog.text
    assert result and result[0][0] == tmp_path / "k1" and (tmp_path / "k1" / "lib.so").read_bytes() == b"built"


def test_the_legend_names_no_series_too_small_to_see() -> None:
    """mini_resnet's CPU layers use ~0.1% of the largest layer's energy: their grey bars cannot be seen, so the
    energy panel's legend leaves 'cpu' out; every entry it has belongs to bars at least 0.5% of the tallest stack."""
    from vta.compiler.pipeline import compile_model, random_inputs
    from vta.compiler.report import build_report
    from vta.compiler.runtime.executor import run as run_compiled

    compiled = compile_model("mini_resnet", VTAConfig())
    report = build_report(compiled, run_compiled(compiled, random_inputs(compiled.graph, seed=0)))
    cpu = [row.get("energy_cpu_uj") or 0.0 for row in report.rows]
    totals = [row.get("energy_uj") or 0.0 for row in report.rows]
    assert 0 < max(cpu) < 0.005 * max(totals)                      # drawn, but under a pixel
    fig = report.figure()
    energy_axes = fig.axes[-1]
    labels = energy_axes.get_legend_handles_labels()[1]
    assert "cpu" not in labels and "dram" in labels and "sram_wgt" in labels
    for label in labels:
        key = f"energy_{label}_uj"
        assert max(row.get(key) or 0.0 for row in report.rows) >= 0.005 * max(totals)
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_hw_verilog_refuses_a_file_name_for_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "hw", "verilog", "-o", str(tmp_path / "core.v"))
    assert (code, out) == (2, "")
    assert err == (f"vta: error: -o {tmp_path / 'core.v'}: -o names the folder vta_core.v is written into, not a "
                   f"Verilog file; e.g. -o {tmp_path / 'rtl'}\n")
    assert not (tmp_path / "core.v").exists()
