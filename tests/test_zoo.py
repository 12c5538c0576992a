"""The model zoo (compiler/frontend/zoo.py): structure, determinism, caching, and agreement with ONNX Runtime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from vta.compiler.frontend import zoo
from vta.compiler.frontend.float_ref import run_float
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.ir import node_macs


def test_list_and_unknown():
    assert zoo.list_models() == ["bert_base", "bert_tiny", "efficientnet_lite0", "gpt2_decode", "gpt2_prefill",
                                 "mini_resnet", "resnet18", "resnet34", "resnet50", "tiny_cnn", "vit_digits",
                                 "vit_tiny"]
    with pytest.raises(ValueError, match="Unknown zoo model 'vgg16'; known models are bert_base, bert_tiny, "
                                         "efficientnet_lite0"):
        zoo.get_model("vgg16")


def test_cache_dir_and_caching(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = zoo.get_model("tiny_cnn")
    assert path == tmp_path / "models" / f"tiny_cnn.v{zoo.ZOO_VERSION}.onnx" and path.exists()
    stamp = path.stat().st_mtime_ns
    assert zoo.get_model("tiny_cnn").stat().st_mtime_ns == stamp        # reused, not rebuilt
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [path.name, path.name + ".sha256"]
    g = import_onnx(path, batch=2)                                          # the batch dimension is dynamic
    assert g.shape("input") == (2, 1, 8, 8) and g.shape("output") == (2, 10)
    x = np.random.default_rng(0).uniform(0, 1, (2, 1, 8, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(run_float(g, {"input": x})["output"], ref, atol=1e-5)


def test_damaged_cached_model_is_rebuilt(tmp_path, monkeypatch, caplog):
    """A truncated or altered cached model (found by the fault campaign) is built again, not reported forever as
    the user's bad ONNX file; so is one without its recorded SHA-256 (an older cache or a kill before it)."""
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = zoo.get_model("tiny_cnn")
    good = path.read_bytes()
    for damage in (lambda: path.write_bytes(good[:100]), lambda: path.write_bytes(good[:-1] + b"x"),
                   lambda: path.with_name(path.name + ".sha256").unlink()):
        damage()
        caplog.clear()
        assert zoo.get_model("tiny_cnn") == path and path.read_bytes() == good
        assert zoo.get_model("tiny_cnn").read_bytes() == good
    assert "damaged (no recorded SHA-256); building it again" in caplog.text
    path.unlink()
    caplog.clear()
    assert zoo.get_model("tiny_cnn").read_bytes() == good and "damaged" not in caplog.text   # missing: no warning


@pytest.mark.parametrize("name", ["tiny_cnn", "mini_resnet"])
def test_small_models_match_onnxruntime(name):
    model = zoo.build_model(name)
    assert model.SerializeToString() == zoo.build_model(name).SerializeToString()     # deterministic
    g = import_onnx(model)
    x = np.random.default_rng(0).standard_normal(g.shape("input")).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, {"input": x})[0]
    np.testing.assert_allclose(run_float(g, {"input": x})["output"], ref, atol=1e-5)
    ops = {n.op for n in g.nodes}
    if name == "mini_resnet":
        assert {"Add", "Clip", "Pad", "Concat", "Mul", "MaxPool", "AvgPool", "Softmax"} <= ops
        assert any(n.op == "Conv2d" and n.attrs["groups"] == 16 for n in g.nodes)


def test_resnet18_structure_and_macs():
    model = zoo.build_model("resnet18")
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    assert counts == {"Conv": 20, "BatchNormalization": 20, "Relu": 17, "MaxPool": 1, "Add": 8,
                      "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1, "Identity": 1}
    g = import_onnx(model)
    convs = [n for n in g.nodes if n.op == "Conv2d"]
    assert len(convs) == 20 and g.shape("output") == (1, 1000)
    # docs/vta-reference.md: the convolutions other than the first do 1,695,547,392 MACs.
    assert sum(node_macs(g, n) for n in convs[1:]) == 1_695_547_392
    assert node_macs(g, convs[0]) == 112 * 112 * 64 * 3 * 7 * 7  # the stem: 112x112x64 outputs, 3x7x7 taps each


@pytest.mark.slow
@pytest.mark.parametrize("name,convs,adds", [("resnet34", 36, 16), ("resnet50", 53, 16)])
def test_deep_resnets_stay_in_range(name, convs, adds, tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = zoo.get_model(name)
    model = onnx.load(path)
    assert sum(n.op_type == "Conv" for n in model.graph.node) == convs
    g = import_onnx(path)
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    values = run_float(g, {"input": x}, keep_all=True)
    peaks = [float(np.abs(values[n.outputs[0]]).max()) for n in g.nodes if n.op == "Add"]
    assert len(peaks) == adds and max(peaks) < 50 and min(peaks) > 0.5
    ref = ort.InferenceSession(str(path)).run(None, {"input": x})[0]
    np.testing.assert_allclose(values["output"], ref, atol=1e-4)


def test_calibration_data():
    assert zoo.calibration_data("resnet18") is None
    with pytest.raises(ValueError, match="Unknown zoo model 'lenet'"):
        zoo.calibration_data("lenet")


@pytest.mark.slow
def test_efficientnet_lite0_int8_tracks_float_top1(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("skimage")
    from vta.compiler.frontend.quantize import quantize
    from vta.compiler.kernels import cpu
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = zoo.get_model("efficientnet_lite0")
    assert path == tmp_path / "models" / "efficientnet_lite0.onnx"
    g = import_onnx(path)
    assert sum(n.op == "Conv2d" for n in g.nodes) == 49 and any(n.attrs.get("groups", 1) > 1 for n in g.nodes)
    images = zoo.calibration_data("efficientnet_lite0")
    assert images.shape[0] >= 5 and images.shape[1:] == (3, 224, 224)
    q = quantize(g, {"input": images})
    sess = ort.InferenceSession(str(path))
    float_top = [int(sess.run(None, {"input": images[i:i + 1]})[0].argmax()) for i in range(len(images))]
    int8_top = [int(cpu.run_cpu(q, {"input": images[i:i + 1]})["output"].argmax()) for i in range(len(images))]
    # chelsea (index 0) is a tabby cat: ImageNet classes 281-285 are cats; the two models may rank two cats apart
    assert 281 <= float_top[0] <= 285 and 281 <= int8_top[0] <= 285
    assert sum(f == i for f, i in zip(float_top, int8_top)) >= len(images) - 2, (float_top, int8_top)
