"""The zoo's transformers (compiler/frontend/zoo_transformers.py) and their plumbing: small variants of each builder
import, quantize and run bit-exact on fsim with their layers named by block and role; GPT-2's decode step against its
prefill (the cache output is the Concat of the past and the new keys and values); token-id inputs (an Embedding) in
the frontend, the random inputs, the input checks and ``--input FILE.npz``."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from vta.compiler import qops
from vta.compiler.frontend import zoo
from vta.compiler.frontend import zoo_transformers as zt
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.pipeline import check_inputs, compile_graph, load_input, random_inputs, token_range
from vta.compiler.report import build_report
from vta.compiler.runtime.compiled import AccelStep
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

SMALL = {"width": 32, "depth": 2, "heads": 2, "mlp": 64}
TEXT = {**SMALL, "vocab": 100, "max_positions": 32}
BUILDERS = {
    "vit": lambda: zt.vit(image=32, patch=8, classes=10, **SMALL),
    "bert": lambda: zt.bert(tokens=16, **TEXT),
    "gpt2_prefill": lambda: zt.gpt2(tokens=8, past=0, **TEXT),
    "gpt2_decode": lambda: zt.gpt2(tokens=1, past=8, **TEXT),
}
ROLES = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


def _session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_small_variant_runs_bit_exact_on_fsim_with_named_layers(kind):
    model = BUILDERS[kind]()
    assert model.SerializeToString() == BUILDERS[kind]().SerializeToString()        # seeded: the same bytes
    graph = import_onnx(model)
    qgraph = quantize(graph, random_inputs(graph, 1, 2))
    compiled = compile_graph(qgraph, VTAConfig(), policy="accel")
    accel = {s.node.name for s in compiled.steps if isinstance(s, AccelStep)}
    assert {f"blocks.{b}.{role}" for b in range(2) for role in ROLES} <= accel     # every linear layer, by name
    inputs = random_inputs(graph, 0)
    out = run(compiled, inputs, target="fsim")
    # the compiled graph's integer reference: under policy="accel" --gelu auto makes each Gelu the integer QGelu
    assert {s.node.op for s in compiled.steps if s.node.name.endswith("mlp.gelu")} <= {"QGelu", "QLut"}
    ref = qops.run_reference(compiled.graph, inputs)
    assert set(ref) == set(graph.outputs)
    for name in ref:
        np.testing.assert_array_equal(out.outputs[name], ref[name])
    rows = {r["layer"]: r for r in build_report(compiled, out).rows}
    assert rows["blocks.1.mlp.fc1"]["where"] == "accel" and rows["blocks.1.mlp.fc1"]["macs"] > 0
    assert {"blocks.0.attn.qk", "blocks.0.attn.pv", "blocks.0.attn.softmax", "blocks.0.mlp.gelu"} <= set(rows)


def test_decode_continues_the_prefill_and_its_cache_is_the_concat_of_past_and_new():
    past = 8
    ids = np.random.default_rng(3).integers(0, TEXT["vocab"], (1, past + 1), dtype=np.int64)
    full = _session(zt.gpt2(tokens=past + 1, past=0, **TEXT)).run(None, {"input_ids": ids})
    prompt = _session(zt.gpt2(tokens=past, past=0, **TEXT)).run(None, {"input_ids": ids[:, :past]})
    decode = zt.gpt2(tokens=1, past=past, **TEXT)
    names = [i.name for i in decode.graph.input]
    assert names[:3] == ["input_ids", "past.0.key", "past.0.value"]
    feeds = {"input_ids": ids[:, past:], **{name: value for name, value in zip(names[1:], prompt[1:])}}
    step = _session(decode).run(None, feeds)
    outs = [o.name for o in decode.graph.output]
    assert outs[:3] == ["logits", "present.0.key", "present.0.value"]
    for k in range(1, len(outs)):
        assert step[k].shape == (1, SMALL["heads"], past + 1, SMALL["width"] // SMALL["heads"])
        np.testing.assert_array_equal(step[k][:, :, :past], prompt[k])             # the past, unchanged
        np.testing.assert_allclose(step[k], full[k], atol=1e-5)                    # + the new token's key/value
    np.testing.assert_allclose(step[0], full[0], atol=1e-4)                        # the same next-token logits


def test_decode_cache_output_in_int8_is_the_concat_of_the_quantized_past_and_new():
    model = BUILDERS["gpt2_decode"]()
    graph = import_onnx(model)
    qgraph = quantize(graph, random_inputs(graph, 1, 2))
    inputs = random_inputs(graph, 0)
    values = qops.run_reference(qgraph, inputs, keep_all=True)
    concat = qgraph.node("blocks.0.attn.cache_k")
    assert concat.op == "QConcat"
    past, new = (values[name] for name in concat.inputs)
    joined = values[concat.outputs[0]]
    assert joined.shape[2] == past.shape[2] + new.shape[2] == 9
    np.testing.assert_array_equal(joined, qops.run_node(qgraph, concat, values))
    if concat.attrs["multipliers"][1] == 1 and concat.attrs["shifts"][1] == 0:     # the new keys at the cache scale
        np.testing.assert_array_equal(joined[:, :, 8:], new)


def test_token_ids_are_an_embedding_with_valid_random_inputs_and_checked_values(tmp_path):
    graph = import_onnx(BUILDERS["bert"]())
    assert graph.tensors["input_ids"].dtype == "int64" and token_range(graph, "input_ids") == TEXT["vocab"]
    assert graph.node("embeddings.word").op == "Embedding"
    ids = random_inputs(graph, 5, samples=3)["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (3, 16) and 0 <= ids.min() and ids.max() < TEXT["vocab"]
    qgraph = quantize(graph, random_inputs(graph, 1, 2))
    assert "quantize_input_ids" not in {n.name for n in qgraph.nodes}              # ids are read as they are
    assert qgraph.node("embeddings.word").op == "Embedding"
    assert qgraph.constants[qgraph.node("embeddings.word").inputs[1]].dtype == np.int8
    good = np.arange(16).reshape(1, 16)
    assert check_inputs(graph, {"input_ids": good})["input_ids"].dtype == np.int64
    with pytest.raises(ValueError, match=r"holds 1 token ids outside \[0, 99\]"):
        check_inputs(graph, {"input_ids": np.where(good == 3, 100, good)})
    with pytest.raises(TypeError, match="takes integer token ids"):
        check_inputs(graph, {"input_ids": good.astype(np.float32)})
    path = tmp_path / "ids.npz"
    np.savez(path, input_ids=good)
    np.testing.assert_array_equal(load_input(graph, str(path))["input_ids"], good)
    np.savez(path, tokens=good)
    with pytest.raises(ValueError, match="gives 'tokens'; the model's inputs are 'input_ids'"):
        load_input(graph, str(path))


def test_multi_input_decode_loads_every_input_from_an_npz(tmp_path):
    graph = import_onnx(BUILDERS["gpt2_decode"]())
    assert len(graph.inputs) == 1 + 2 * SMALL["depth"]
    values = random_inputs(graph, 2)
    path = tmp_path / "step.npz"
    np.savez(path, **values)
    loaded = load_input(graph, str(path))
    assert set(loaded) == set(graph.inputs)
    assert all(np.array_equal(loaded[k], values[k]) for k in values)
    from vta.compiler.runtime.compiled import Compiled
    qgraph = quantize(graph, random_inputs(graph, 1, 2))
    compile_graph(qgraph, VTAConfig(), policy="accel").save(str(tmp_path / "decode.vtac"))
    compiled = Compiled.load(str(tmp_path / "decode.vtac"))                     # int64 ids survive the artefact
    assert compiled.graph.tensors["input_ids"].dtype == "int64"
    out = run(compiled, loaded, target="fsim").outputs
    ref = qops.run_reference(compiled.graph, loaded)                            # its integer reference (QGelu)
    assert all(np.array_equal(out[k], ref[k]) for k in ref)


def test_the_zoo_serves_the_full_size_transformers_by_name():
    assert {"vit_tiny", "bert_base", "gpt2_prefill", "gpt2_decode"} <= set(zoo.list_models())
    assert set(zt.MODELS) == {"vit_tiny", "bert_base", "gpt2_prefill", "gpt2_decode"}
    with pytest.raises(ValueError, match="exceeds max_positions 32"):
        zt.gpt2(tokens=30, past=8, **TEXT)


# ---- vit_digits: a transformer trained on real data ----------------------------------------------------------------
def test_vit_digits_backward_matches_finite_differences():
    from vta.compiler.frontend import digits_vit as dv
    params = dv._initial()
    x = dv.load_split()[0][:3].astype(np.float64)
    labels = np.array([0, 1, 2])

    def loss(p):
        logits, caches = dv._forward(p, x)
        e = np.exp(logits - logits.max(1, keepdims=True))
        prob = e / e.sum(1, keepdims=True)
        return -np.log(prob[np.arange(3), labels]).sum(), prob, caches

    _, prob, caches = loss(params)
    prob[np.arange(3), labels] -= 1.0
    grads = dv._backward(params, caches, prob)
    assert set(grads) == set(params)
    rng = np.random.default_rng(0)
    for name in ("patch_embed.weight", "pos_embed.value", "blocks.0.attn.qkv.weight", "blocks.1.mlp.fc1.bias",
                 "blocks.0.ln1.weight", "norm.bias", "head.weight"):
        flat = params[name].reshape(-1)
        for k in rng.choice(flat.size, 3, replace=False):
            keep = flat[k]
            flat[k] = keep + 1e-5
            up = loss(params)[0]
            flat[k] = keep - 1e-5
            down = loss(params)[0]
            flat[k] = keep
            assert abs((up - down) / 2e-5 - grads[name].reshape(-1)[k]) <= 1e-4 + 1e-3 * abs((up - down) / 2e-5)


def test_vit_digits_accuracy_is_measured_on_the_held_out_digits():
    """The zoo's trained tiny ViT (trained on first use into the cache, then reused): float and int8 accuracy on the
    450 held-out images, which `vta run vit_digits` prints."""
    from vta.compiler.pipeline import compile_model
    compiled = compile_model("vit_digits", VTAConfig())
    assert compiled.meta["calibration"]["source"] == "zoo images"
    found = zoo.test_accuracy("vit_digits", compiled.graph)
    assert found is not None and found["images"] == 450
    assert found["float"] >= 90.0 and found["int8"] >= 88.0 and found["agreement"] >= 95.0
    assert zoo.test_accuracy("bert_tiny", compiled.graph) is None


def test_calibration_file_of_token_ids_is_checked_and_kept_integer(tmp_path):
    from vta.compiler.frontend.calibration import CalibrationError, load_calibration
    graph = import_onnx(BUILDERS["bert"]())
    ids = np.random.default_rng(4).integers(0, TEXT["vocab"], (3, 16))
    np.savez(tmp_path / "ids.npz", input_ids=ids)
    loaded = load_calibration(tmp_path / "ids.npz", graph)
    assert loaded["input_ids"].dtype == np.int64 and np.array_equal(loaded["input_ids"], ids)
    quantize(graph, loaded)                                                        # calibrates on the real ids
    np.savez(tmp_path / "bad.npz", input_ids=ids + TEXT["vocab"])
    with pytest.raises(CalibrationError, match=r"input 'input_ids' takes token ids, integers in \[0, 99\]"):
        load_calibration(tmp_path / "bad.npz", graph)


def test_a_sweep_takes_the_transformers_and_a_decode_step_of_token_ids_and_a_kv_cache(tmp_path):
    import onnx

    from vta.sweep.runner import run_sweep
    from vta.sweep.spec import parse_spec
    from vta.sweep.store import ResultStore
    names = ["vit_tiny", "bert_base", "gpt2_prefill", "gpt2_decode", "vit_digits"]
    assert parse_spec({"sweep": {"models": names}, "vary": {"LOG_BLOCK": [4]}}).models == tuple(names)
    path = tmp_path / "decode.onnx"
    onnx.save(BUILDERS["gpt2_decode"](), path)
    spec = parse_spec({"sweep": {"models": [str(path)]}, "vary": {"LOG_BLOCK": [3, 4]}})
    with ResultStore(tmp_path / "r.sqlite") as store:
        summary = run_sweep(spec, store, workers=0)
        rows = store.rows()
    assert summary.ok == 2 and all(r["status"] == "ok" and r["cycles"] > 0 for r in rows)
