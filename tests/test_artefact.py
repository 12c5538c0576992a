"""Tests for vta.compiler.runtime.artefact and Compiled.save/load: round trips of real models, every strictness check
with its message, a pickle member refused without unpickling, and single-byte flips that must load identical or fail."""
import gzip
import io
import json
import pickle
import zipfile

import numpy as np
import pytest

from vta.cli import main
from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.runtime.artefact import FORMAT_NAME, FORMAT_VERSION, ArtefactError, read_artefact, write_artefact
from vta.compiler.runtime.compiled import AccelStep, Compiled
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig


@pytest.fixture(scope="module")
def tiny():
    return compile_model("tiny_cnn", VTAConfig(), policy="accel")


@pytest.fixture
def saved(tmp_path, tiny):
    path = tmp_path / "model.vtac"
    tiny.save(path)
    return path


def _same_data(a: Compiled, b: Compiled) -> None:
    """Every JSON value and every array (dtype, shape, bytes) of the two artefacts are identical."""
    body_a, arrays_a = a.to_data()
    body_b, arrays_b = b.to_data()
    assert json.dumps(body_a, sort_keys=True) == json.dumps(body_b, sort_keys=True)
    assert sorted(arrays_a) == sorted(arrays_b)
    for name, arr in arrays_a.items():
        other = arrays_b[name]
        assert (arr.dtype, arr.shape, arr.tobytes()) == (other.dtype, other.shape, other.tobytes()), name


# ---- round trips ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["tiny_cnn", "mini_resnet"])
def test_round_trip_is_identical_and_runs_the_same(tmp_path, model):
    compiled = compile_model(model, VTAConfig(), policy="accel")
    path = tmp_path / f"{model}.vtac"
    compiled.save(path)
    loaded = Compiled.load(path)
    assert loaded.cfg == compiled.cfg and loaded.meta == compiled.meta
    assert loaded.decisions == compiled.decisions
    assert compiled.compile_seconds is not None and loaded.compile_seconds is None  # a run's fact, not stored
    assert [type(s) for s in loaded.steps] == [type(s) for s in compiled.steps]
    assert loaded.accel_steps == compiled.accel_steps > 0
    for a, b in zip(compiled.steps, loaded.steps):
        assert b.node is loaded.graph.node(a.node.name) and b.macs == a.macs
        if isinstance(a, AccelStep):
            assert b.program.insns == a.program.insns
            assert np.array_equal(b.program.dram, a.program.dram) and b.program.dram.dtype == np.uint8
            assert b.program.allocations == a.program.allocations
            assert (b.inputs, b.output, b.fold, b.tiling, b.tiles) == (a.inputs, a.output, a.fold, a.tiling, a.tiles)
            assert (b.schedule, b.predicted_cycles) == (a.schedule, a.predicted_cycles)
            assert a.schedule and a.predicted_cycles > 0  # the schedule search's choice survives the round trip
    for name, value in compiled.graph.constants.items():
        assert loaded.graph.constants[name].dtype == value.dtype and np.array_equal(loaded.graph.constants[name], value)
    for a, b in zip(compiled.graph.nodes, loaded.graph.nodes):
        assert (a.op, a.name, a.inputs, a.outputs, sorted(a.attrs)) == (b.op, b.name, b.inputs, b.outputs,
                                                                         sorted(b.attrs))
        for key, value in a.attrs.items():
            assert type(b.attrs[key]) is type(value), key
    assert loaded.graph.tensors == compiled.graph.tensors
    _same_data(compiled, loaded)
    inputs = random_inputs(compiled.graph, 0)
    want = run(compiled, inputs, target="fsim").outputs
    got = run(loaded, inputs, target="fsim").outputs
    assert all(np.array_equal(want[k], got[k]) for k in want)


def test_vta_compile_then_run_the_artefact(tmp_path, capsys):
    path = tmp_path / "tiny.vtac"
    assert main(["compile", "tiny_cnn", "-o", str(path), "--policy", "accel", "--no-progress"]) == 0
    assert main(["run", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "tiny_cnn on fsim" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.vtac"]  # no temporary file left behind


def test_save_replaces_an_existing_file_atomically(tmp_path, tiny):
    path = tmp_path / "m.vtac"
    path.write_bytes(b"previous")
    tiny.save(path)
    Compiled.load(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.vtac"]


def test_a_failed_save_keeps_the_previous_artefact(tmp_path, tiny, monkeypatch):
    path = tmp_path / "m.vtac"
    path.write_bytes(b"previous")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(np, "savez_compressed", killed)
    with pytest.raises(KeyboardInterrupt):
        tiny.save(path)
    assert path.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.vtac"]


def test_write_rejects_what_the_format_cannot_hold(tmp_path):
    cfg = VTAConfig()
    with pytest.raises(ValueError, match=r"^member name 'manifest' is reserved or not a valid name; use names like "
                                         r"'graph/0'$"):
        write_artefact(tmp_path / "a.vtac", cfg, {}, {"manifest": np.zeros(1)})
    with pytest.raises(ValueError, match=r"^member x has dtype object; an artefact holds only bool, integer, float "
                                         r"and unicode arrays$"):
        write_artefact(tmp_path / "a.vtac", cfg, {}, {"x": np.array([None])})
    with pytest.raises(TypeError, match=r"^member x must be a numpy array, not list$"):
        write_artefact(tmp_path / "a.vtac", cfg, {}, {"x": [1]})
    assert list(tmp_path.iterdir()) == []


# ---- crafting files -------------------------------------------------------------------------------------------------
def _members(path):
    """The artefact's members as arrays (the manifest decoded to a dict)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    manifest = json.loads(arrays.pop("manifest").tobytes())
    return manifest, arrays


def _digest(manifest):
    import hashlib
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _savez(path, **arrays):
    with open(path, "wb") as f:  # a file object: np.savez would append .npz to a path
        np.savez(f, **arrays)


def _write(path, manifest, arrays, *, redigest=True):
    if redigest:
        manifest["sha256"] = _digest(manifest)
    text = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    _savez(path, manifest=np.frombuffer(text, np.uint8), **arrays)


def _load_error(path):
    with pytest.raises(ArtefactError) as info:
        Compiled.load(path)
    return str(info.value)


# ---- strictness -----------------------------------------------------------------------------------------------------
def test_not_a_zip_truncated_and_old_pickles(tmp_path, saved, tiny):
    bad = tmp_path / "bad.vtac"
    bad.write_bytes(b"not a model")
    assert _load_error(bad) == (f"{bad} is not a vta-lab compiled model: it is not a zip file (it starts with "
                                f"b'not '); write one with `vta compile MODEL -o FILE.vtac`")
    cut = tmp_path / "cut.vtac"
    cut.write_bytes(saved.read_bytes()[:len(saved.read_bytes()) // 2])
    assert _load_error(cut) == (f"{cut} is truncated or damaged: its zip directory cannot be read (File is not a "
                                f"zip file)")
    old = tmp_path / "old.vtac"
    with gzip.open(old, "wb") as f:
        pickle.dump({"magic": "vta-lab compiled model", "version": 1}, f)
    assert _load_error(old) == (f"{old} is a gzip file, as compiled models of artefact version 1 were (a pickle); "
                                f"loading a pickle can run arbitrary code, so this version of vta-lab refuses it; "
                                f"compile the model again with `vta compile`")
    empty = tmp_path / "empty.vtac"
    empty.write_bytes(b"")
    assert "it is not a zip file (it starts with b'')" in _load_error(empty)


def test_manifest_problems(tmp_path, saved):
    manifest, arrays = _members(saved)
    path = tmp_path / "x.vtac"
    _savez(path, **arrays)
    assert _load_error(path) == f"{path} is not a vta-lab compiled model: it has no manifest member"
    _savez(path, manifest=np.frombuffer(b"[1, 2]", np.uint8), **arrays)
    assert _load_error(path) == f"the manifest of {path} is corrupt: it is a JSON list, not an object"
    _savez(path, manifest=np.frombuffer(b"{\xff", np.uint8), **arrays)
    assert _load_error(path).startswith(f"the manifest of {path} is corrupt: it is not UTF-8 JSON (")
    _savez(path, manifest=np.array("{}"), **arrays)
    assert _load_error(path) == (f"the manifest of {path} is corrupt: it is a <U2 array of shape (), not "
                                 f"one-dimensional uint8 bytes")
    _write(path, {**manifest, "format": "something else"}, arrays)
    assert _load_error(path) == (f"{path} is not a vta-lab compiled model: its manifest names format 'something "
                                 f"else', not '{FORMAT_NAME}'")
    _write(path, {**manifest, "version": 99, "vta_lab": "9.0"}, arrays)
    assert _load_error(path) == (f"{path} has artefact version 99 (written by vta-lab 9.0); this vta-lab (0.1.0) "
                                 f"reads version {FORMAT_VERSION}; compile the model again")
    changed = {**manifest, "vta_lab": "0.0.9"}
    _write(path, changed, arrays, redigest=False)
    assert _load_error(path) == (f"the manifest of {path} is corrupt: its SHA-256 is {_digest(changed)}, it "
                                 f"records '{manifest['sha256']}'")
    _write(path, {**manifest, "extra": 1}, arrays)
    assert _load_error(path) == (f"the manifest of {path} does not describe a compiled model: it has fields body, "
                                 f"config, extra, format, members, sha256, version, vta_lab, not body, config, "
                                 f"format, members, sha256, version, vta_lab")


def test_member_set_problems(tmp_path, saved):
    manifest, arrays = _members(saved)
    path = tmp_path / "x.vtac"
    fewer = {k: v for k, v in arrays.items() if k not in ("steps/1/program/dram", "graph/constants/0")}
    _write(path, manifest, fewer)
    assert _load_error(path) == (f"{path} lacks member(s) graph/constants/0, steps/1/program/dram that its manifest "
                                 f"lists; the file is damaged")
    _write(path, manifest, {**arrays, "zz/extra": np.zeros(2)})
    assert _load_error(path) == (f"{path} has member(s) zz/extra that its manifest does not list; an artefact holds "
                                 f"exactly the members its manifest lists")
    with zipfile.ZipFile(path, "a") as zf:  # a member that is not an .npy array at all
        zf.writestr("notes.txt", "hello")
    assert "has member(s) notes.txt, zz/extra that its manifest does not list" in _load_error(path)
    _write(path, manifest, arrays)
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "a") as zf:
        zf.writestr("steps/1/program/dram.npy", b"")
    assert _load_error(path) == (f"{path} is damaged or crafted: member(s) steps/1/program/dram.npy appear more "
                                 f"than once")


def test_member_content_problems(tmp_path, saved):
    manifest, arrays = _members(saved)
    path = tmp_path / "x.vtac"
    name = "steps/1/program/dram"
    dram = arrays[name]
    _write(path, manifest, {**arrays, name: dram.astype(np.int16)})
    assert _load_error(path) == (f"member {name} of {path} has dtype <i2 and shape [{dram.size}]; its manifest "
                                 f"records dtype |u1 and shape [{dram.size}]")
    _write(path, manifest, {**arrays, name: dram[:-1]})
    assert _load_error(path) == (f"member {name} of {path} has dtype |u1 and shape [{dram.size - 1}]; its manifest "
                                 f"records dtype |u1 and shape [{dram.size}]")
    flipped = dram.copy()
    flipped[7] ^= 1
    import hashlib
    _write(path, manifest, {**arrays, name: flipped})
    assert _load_error(path) == (f"member {name} of {path} is corrupt: its SHA-256 is "
                                 f"{hashlib.sha256(flipped.tobytes()).hexdigest()}, the manifest records "
                                 f"{manifest['members'][name]['sha256']}")
    entry = dict(manifest["members"][name], dtype="|O")
    _write(path, {**manifest, "members": {**manifest["members"], name: entry}}, arrays)
    assert _load_error(path) == (f"the manifest of {path} does not describe a compiled model: its entry for member "
                                 f"{name} is {entry!r}, not a plain dtype, shape and sha256")


def test_a_body_that_does_not_decode(tmp_path, saved):
    manifest, arrays = _members(saved)
    path = tmp_path / "x.vtac"
    body = dict(manifest["body"], steps=[{"kind": "gpu", "node": manifest["body"]["steps"][0]["node"]}])
    _write(path, {**manifest, "body": body}, arrays)
    assert _load_error(path) == (f"the manifest of {path} does not describe a compiled model: step 0 has kind "
                                 f"'gpu', not 'accel' or 'cpu'")
    fields = dict(manifest["config"]["fields"], LOG_BLOCK=9)
    _write(path, {**manifest, "config": {"name": manifest["config"]["name"], "fields": fields}}, arrays)
    assert _load_error(path).startswith(f"the config in {path} is not valid: ")
    assert "LOG_BLOCK must be between 2 and 6, not 9" in _load_error(path)
    _write(path, {**manifest, "config": {"name": "other", "fields": manifest["config"]["fields"]}}, arrays)
    assert _load_error(path) == (f"the config in {path} is named 'other' but its fields make "
                                 f"'{VTAConfig().name}'")


def test_read_artefact_wraps_the_decoders_errors(tmp_path):
    path = tmp_path / "x.vtac"
    write_artefact(path, VTAConfig(), {"a": 1}, {"x": np.arange(3)})

    def decode(body, arrays, cfg):
        return body["missing"]
    with pytest.raises(ArtefactError, match=r"^the manifest of .*x\.vtac does not describe a compiled model: "
                                            r"'missing'$"):
        read_artefact(path, decode)
    assert read_artefact(path, lambda body, arrays, cfg: (body, arrays["x"].tolist(), cfg.name)) == (
        {"a": 1}, [0, 1, 2], VTAConfig().name)


class _Evil:
    """Unpickling this writes a marker file: proof that the loader ran code from the artefact."""

    marker = None

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickle_member_is_refused_without_unpickling(tmp_path, saved):
    manifest, arrays = _members(saved)
    marker = tmp_path / "pwned"
    _Evil.marker = marker
    evil = np.empty(1, dtype=object)
    evil[0] = _Evil()
    buf = io.BytesIO()
    np.save(buf, evil, allow_pickle=True)
    path = tmp_path / "x.vtac"
    name = "steps/1/program/dram"
    _write(path, manifest, {k: v for k, v in arrays.items() if k != name})
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(f"{name}.npy", buf.getvalue())
    assert _load_error(path) == (f"member {name} of {path} holds Python objects (dtype object), that is pickled "
                                 f"data; an artefact holds plain arrays only, so it is refused without unpickling")
    assert not marker.exists()
    with np.load(path, allow_pickle=True) as data:  # the file really does unpickle when allowed: the test can fail
        data[name]
    assert marker.exists()


# ---- single-byte flips ----------------------------------------------------------------------------------------------
def _flips(saved, tiny, count, seed):
    original = saved.read_bytes()
    rng = np.random.default_rng(seed)
    outcomes = {"identical": 0, "refused": 0}
    for _ in range(count):
        data = bytearray(original)
        pos = int(rng.integers(len(data)))
        data[pos] ^= int(rng.integers(1, 256))
        saved.write_bytes(bytes(data))
        try:
            loaded = Compiled.load(saved)
        except ArtefactError:
            outcomes["refused"] += 1
            continue
        _same_data(tiny, loaded)  # a flip in zip padding or unused bytes: must load bit-identical
        outcomes["identical"] += 1
    return outcomes


def test_300_single_byte_flips_load_identical_or_are_refused(saved, tiny):
    """About 1 s for the 19 kB tiny_cnn artefact, so all 300 run by default (about 10% land in zip fields nothing
    reads, e.g. timestamps, and must load identical)."""
    outcomes = _flips(saved, tiny, 300, seed=2)
    assert outcomes["refused"] > 200 and sum(outcomes.values()) == 300


# ---- the value encoding of compiler/ir.py ----------------------------------------------------------------------------
def test_values_round_trip_with_their_kinds():
    from vta.compiler.ir import AddRequant, Requant, value_from_data, value_to_data
    value = {"t": (1, 2.5, None, True, "s"), "l": [np.int8(-3), np.float32(0.1)], "a": np.arange(4, dtype=np.int32),
             "r": Requant(np.array([1, 2]), np.array([3, 4]), 0, 100), "q": AddRequant(1, 2, 3)}
    arrays: dict = {}
    data = value_to_data(value, arrays, "v")
    assert sorted(arrays) == ["v/a", "v/r/multiplier", "v/r/shift"]
    back = value_from_data(json.loads(json.dumps(data)), arrays)
    assert back["t"] == value["t"] and type(back["t"]) is tuple
    assert [type(x) for x in back["l"]] == [np.int8, np.float32] and back["l"] == value["l"]
    assert back["a"] is arrays["v/a"] and back["q"] == value["q"]
    assert back["r"].multiplier.tolist() == [1, 2] and (back["r"].lo, back["r"].hi) == (0, 100)


def test_value_encoding_errors():
    from vta.compiler.ir import GraphError, value_from_data, value_to_data
    with pytest.raises(TypeError, match=r"^v is a set, which cannot be stored; attribute values must be None, bool, "
                                        r"int, float, str, list, tuple, dict, numpy arrays or scalars, Requant or "
                                        r"AddRequant\.$"):
        value_to_data({1}, {}, "v")
    with pytest.raises(TypeError, match=r"^v is a dict with keys that are not strings; only string keys can be "
                                        r"stored\.$"):
        value_to_data({1: 2}, {}, "v")
    with pytest.raises(TypeError, match=r"^v is an array of Python objects; only plain numeric arrays can be "
                                        r"stored\.$"):
        value_to_data(np.array([None]), {}, "v")
    with pytest.raises(GraphError, match=r"^A stored value must be a JSON scalar, a list or an object with one key, "
                                         r"not \{\}\.$"):
        value_from_data({}, {})
    with pytest.raises(GraphError, match=r"^A stored value of kind 'pickle' is malformed or unknown: 'x'\.$"):
        value_from_data({"pickle": "x"}, {})
    with pytest.raises(GraphError, match=r"^The data names array 'k', which is not stored\.$"):
        value_from_data({"array": "k"}, {})
    with pytest.raises(GraphError, match=r"^A stored scalar has dtype object; only plain numeric scalars can be "
                                         r"stored\.$"):
        value_from_data({"scalar": ["|O", 1]}, {})
    with pytest.raises(GraphError, match=r"^The data of a Requant must be an object with keys multiplier, shift, lo, "
                                         r"hi, not \['lo'\]\.$"):
        value_from_data({"Requant": {"lo": 0}}, {})


def test_graph_data_errors(tiny):
    from vta.compiler.ir import Graph, GraphError
    data, arrays = tiny.graph.to_data()
    with pytest.raises(GraphError, match=r"^The graph inputs must be a list, not str\.$"):
        Graph.from_data({**data, "inputs": "x"}, arrays)
    with pytest.raises(GraphError, match=r"^A tensor name must be a string, not 3\.$"):
        Graph.from_data({**data, "tensors": [{"name": 3, "shape": [1], "dtype": "int8", "scale": None}]}, arrays)
    with pytest.raises(GraphError, match=r"^The shape of 't' must be a list of integers, not \[1\.5\]\.$"):
        Graph.from_data({**data, "tensors": [{"name": "t", "shape": [1.5], "dtype": "int8", "scale": None}]}, arrays)
    with pytest.raises(GraphError, match=r"^Tensor 't' has scale '1'; expected a float or null\.$"):
        Graph.from_data({**data, "tensors": [{"name": "t", "shape": [1], "dtype": "int8", "scale": "1"}]}, arrays)
    name, key = data["constants"][0]
    with pytest.raises(GraphError, match=rf"^Constant '{name}' is a int16 array of shape"):
        Graph.from_data(data, {**arrays, key: arrays[key].astype(np.int16)})
    nodes = [dict(data["nodes"][0], attrs=[])] + data["nodes"][1:]
    with pytest.raises(GraphError, match=r"^The attributes of node '.*' are a list, not an object\.$"):
        Graph.from_data({**data, "nodes": nodes}, arrays)
