"""End to end: zoo models (ONNX) imported, quantized, compiled and run on fsim, bit-exact against the integer
reference at several configs; the `vta compile` / `vta run MODEL` command line."""
import numpy as np
import pytest

from vta.cli import main
from vta.compiler import qops
from vta.compiler.pipeline import compile_model
from vta.compiler.runtime.compiled import AccelStep, Compiled
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

CONFIGS = {
    "default": VTAConfig(),
    "block8": VTAConfig(log_block=3),
    "block32": VTAConfig(log_block=5),
    "batch2": VTAConfig(log_batch=1),
}


def _check(model, cfg, policy="accel", batch=None):
    compiled = compile_model(model, cfg, policy=policy, batch=batch, calib=2)
    graph = compiled.graph
    rng = np.random.default_rng(5)
    inputs = {name: rng.standard_normal(graph.shape(name)).astype(np.float32) for name in graph.inputs}
    ref = qops.run_reference(graph, inputs)
    out = run(compiled, inputs, target="fsim")
    for name in ref:
        np.testing.assert_array_equal(out.outputs[name], ref[name])
    return compiled, out


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_mini_resnet_bit_exact(cfg):
    """Residual add, depthwise conv + ReLU6, pointwise conv, pools, concat, dense: every accelerator op kind."""
    compiled, out = _check("mini_resnet", cfg, batch=2 if cfg.batch == 2 else None)
    ops = {s.node.op for s in compiled.steps if isinstance(s, AccelStep)}
    assert ops == {"QConv2d", "QAdd", "QDense"}
    assert sum(layer.where == "accel" for layer in out.layers) == compiled.accel_steps >= 8


@pytest.mark.parametrize("cfg", CONFIGS.values(), ids=CONFIGS.keys())
def test_tiny_cnn_bit_exact(cfg):
    compiled, _ = _check("tiny_cnn", cfg)
    assert compiled.accel_steps == 3


def test_auto_policy_bit_exact():
    compiled, out = _check("mini_resnet", VTAConfig(), policy="auto")
    assert {d.target for d in compiled.decisions.values()} <= {"accel", "cpu"}


def test_cli_run_and_compile(tmp_path, capsys):
    assert main(["run", "tiny_cnn", "--target", "fsim", "--policy", "accel", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "tiny_cnn on fsim (1x16_i8w8a32_15_15_18_17)"
    assert "matches_integer_reference: True" in text
    artefact = tmp_path / "tiny.vtac"
    assert main(["compile", "tiny_cnn", "-o", str(artefact), "--policy", "accel", "--no-progress"]) == 0
    assert "3 of 6 layers on the accelerator" in capsys.readouterr().out
    assert main(["run", str(artefact), "--target", "cpu", "--no-progress", "--report-csv",
                 str(tmp_path / "r.csv")]) == 0
    assert "matches_integer_reference: True" in capsys.readouterr().out
    assert (tmp_path / "r.csv").exists()
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    assert main(["run", str(artefact), "--input", str(tmp_path / "x.npy"), "--no-progress"]) == 0
    assert "matches_integer_reference: True" in capsys.readouterr().out
    np.save(tmp_path / "bad.npy", np.zeros((1, 8, 8), np.float32))
    assert main(["run", str(artefact), "--input", str(tmp_path / "bad.npy"), "--no-progress"]) == 2
    assert "has shape (1, 8, 8); the model's input 'input' has shape (1, 1, 8, 8)" in capsys.readouterr().err
    single = tmp_path / "single.vtac"
    assert main(["compile", "tiny_cnn", "-o", str(single), "--no-double-buffer", "--no-progress"]) == 0
    assert Compiled.load(single).meta["double_buffer"] is False
    capsys.readouterr()
    assert main(["run", "no_such_model", "--no-progress"]) == 2
    assert "model 'no_such_model' is not a zoo model and not a file" in capsys.readouterr().err


@pytest.mark.slow
def test_resnet18_fsim_bit_exact():
    compiled, out = _check("resnet18", VTAConfig(), policy="auto")
    convs = [layer for layer in out.layers if layer.op == "QConv2d"]
    assert len(convs) == 20 and all(layer.where == "accel" for layer in convs)


@pytest.mark.slow
def test_mini_resnet_tsim_bit_exact_and_counts_match_fsim():
    """The RTL runs the same compiled programs bit-exactly, with cycle counts and fsim's micro-op counts."""
    compiled = compile_model("mini_resnet", VTAConfig(), policy="accel", calib=2)
    rng = np.random.default_rng(6)
    inputs = {name: rng.standard_normal(compiled.graph.shape(name)).astype(np.float32)
              for name in compiled.graph.inputs}
    ref = qops.run_reference(compiled.graph, inputs)
    tsim = run(compiled, inputs, target="tsim")
    fsim = run(compiled, inputs, target="fsim")
    for name in ref:
        np.testing.assert_array_equal(tsim.outputs[name], ref[name])
    for t, f in zip(tsim.layers, fsim.layers):
        assert (t.gemm_uops, t.alu_uops, t.bytes_moved) == (f.gemm_uops, f.alu_uops, f.bytes_moved)
        assert (t.cycles is not None and t.cycles > t.gemm_uops) if t.where == "accel" else t.cycles is None
