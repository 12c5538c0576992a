"""Probe family of bad models and model inputs: empty, garbage and truncated ONNX files, an unsupported operator, a
symbolic dimension, an unknown opset, graphs that break ONNX's rules (a node input or output dropped, an axis
beyond the rank, an attribute of the wrong type, a weight of the wrong type or not finite, a huge dimension); NaN,
infinite, wrong-shape, object-dtype (a pickle payload) and integer ``--input`` arrays; unknown ``--force-cpu``
names; report and plot paths that cannot be written."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from .context import Context
from .core import Probe, Run, Verdict, judge_cli, vta_argv
from .inputs import MARKER, Payload

MODEL_DAMAGE = ("empty", "nan", "object", "garbage", "input_dropped", "force_cpu", "symbolic", "report_missing",
                "truncated", "inf", "bad_axis", "unsupported_op", "shape", "weight_type", "plot_suffix", "opset",
                "weight_inf", "int_dtype", "report_dir", "output_dropped", "scalar", "huge_dim", "plot_dir",
                "attr_type")
"""The kinds of bad model or input, in the order the probes cycle through them (varied from the first probes on).
The graph-level kinds (``input_dropped``, ``output_dropped``, ``bad_axis``, ``attr_type``, ``weight_type``,
``weight_inf``, ``huge_dim``) are the mutations of exporter files that crashed the import before its schema
checks (``compiler/frontend/onnx_checks.py``)."""
REFUSED_EXIT0 = {"nan", "inf", "shape", "object", "scalar", "force_cpu", "report_dir", "report_missing",
                 "plot_suffix", "plot_dir", "empty", "garbage", "truncated", "unsupported_op", "opset",
                 "input_dropped", "output_dropped", "bad_axis", "attr_type", "weight_type", "weight_inf", "huge_dim"}
"""Kinds whose input nothing can run: exit 0 is a silent wrong answer (the rest may run)."""


def _onnx_model(kind: str, original: bytes, rng: np.random.Generator) -> bytes:
    """The bytes of a bad ``.onnx`` file of the given kind."""
    import onnx
    if kind == "empty":
        return b""
    if kind == "garbage":
        return bytes(rng.integers(0, 256, int(rng.integers(1, 4096)), dtype=np.uint8))
    if kind == "truncated":
        return original[:int(rng.integers(1, len(original)))]
    model = onnx.load_from_string(original)
    if kind == "unsupported_op":
        node = model.graph.node[int(rng.integers(len(model.graph.node)))]
        node.op_type = str(rng.choice(["Einsum", "LSTM", "NonMaxSuppression", "MadeUpOp"]))
    elif kind == "symbolic":
        dims = model.graph.input[0].type.tensor_type.shape.dim
        dims[int(rng.integers(1, len(dims)))].dim_param = "h"
    elif kind == "opset":
        model.opset_import[0].version = int(rng.choice([1, 3, 99, 10000]))
    elif kind in ("input_dropped", "output_dropped"):
        nodes = [n for n in model.graph.node if n.op_type != "Identity"]
        node = nodes[int(rng.integers(len(nodes)))]
        names = node.input if kind == "input_dropped" else node.output
        del names[int(rng.integers(min(2, len(names)))) if kind == "input_dropped" else 0:]   # a required one
    elif kind == "bad_axis":
        flatten = next(n for n in model.graph.node if n.op_type == "Flatten")
        del flatten.attribute[:]
        flatten.attribute.append(onnx.helper.make_attribute("axis", int(rng.choice([5, 9, -6]))))
    elif kind == "attr_type":
        conv = next(n for n in model.graph.node if n.op_type == "Conv")
        kept = [a for a in conv.attribute if a.name != "strides"]
        del conv.attribute[:]
        conv.attribute.extend(kept + [onnx.helper.make_attribute("strides", [1.5, 1.0])])
    elif kind in ("weight_type", "weight_inf"):
        init = model.graph.initializer[int(rng.integers(len(model.graph.initializer)))]
        if kind == "weight_type":
            init.data_type = int(rng.choice([onnx.TensorProto.INT32, onnx.TensorProto.UINT32]))
        else:
            value = onnx.numpy_helper.to_array(init).copy()
            value.reshape(-1)[int(rng.integers(value.size))] = rng.choice([np.inf, -np.inf, np.nan])
            init.CopyFrom(onnx.numpy_helper.from_array(value, init.name))
    elif kind == "huge_dim":
        dims = model.graph.input[0].type.tensor_type.shape.dim
        dims[int(rng.integers(2, len(dims)))].dim_value = int(rng.choice([10**9, 2**40]))
    return model.SerializeToString()


def _input_array(kind: str, rng: np.random.Generator) -> Any:
    x: Any = rng.standard_normal((1, 1, 8, 8)).astype(np.float32)
    if kind == "nan":
        x.reshape(-1)[rng.integers(0, x.size, 3)] = np.nan
    elif kind == "inf":
        x.reshape(-1)[int(rng.integers(x.size))] = rng.choice([np.inf, -np.inf])
    elif kind == "shape":
        shapes = [(1, 8, 8), (2, 1, 8, 8), (1, 1, 7, 8)]
        x = rng.standard_normal(shapes[int(rng.integers(len(shapes)))])
    elif kind == "object":
        x = np.array([Payload()], dtype=object)
    elif kind == "int_dtype":
        x = rng.integers(-3, 3, (1, 1, 8, 8)).astype(np.int32)
    elif kind == "scalar":
        x = np.float32(1.0)
    return x


def model_probes(ctx: Context, rng: np.random.Generator, count: int) -> list[Probe]:
    """Bad models and inputs to ``vta run`` (tiny_cnn or a damaged copy of its ONNX file)."""
    original = ctx.refs["onnx"].read_bytes()
    probes = []
    for k in range(count):
        kind = MODEL_DAMAGE[k % len(MODEL_DAMAGE)]
        sub = np.random.default_rng(rng.integers(1 << 31))
        args = ["run", "model.onnx", "--no-progress"]
        files: dict[str, Any] = {"model.onnx": original}
        if kind in ("empty", "garbage", "truncated", "unsupported_op", "symbolic", "opset", "input_dropped",
                    "output_dropped", "bad_axis", "attr_type", "weight_type", "weight_inf", "huge_dim"):
            files["model.onnx"] = _onnx_model(kind, original, sub)
        elif kind in ("nan", "inf", "shape", "object", "int_dtype", "scalar"):
            files["x.npy"] = _input_array(kind, sub)
            args += ["--input", "x.npy"]
        elif kind == "force_cpu":
            args += ["--force-cpu", str(sub.choice(["conv_99", "", "../etc", "conv_3;rm"]))]
        elif kind == "report_dir":
            args += ["--report-json", "."]
        elif kind == "report_missing":
            args += ["--report-json", str(sub.choice(["no/such/dir/r.json", "/proc/self/r.json"]))]
        elif kind == "plot_suffix":
            args += ["--plot", str(sub.choice(["p.exe", "p", "p.png/"]))]
        elif kind == "plot_dir":
            args += ["--plot", "no/such/dir/p.png"]
        probes.append(Probe("models", f"{kind} #{k}", vta_argv(*args), setup=_write_files(files), marker=MARKER,
                            judge=_model_judge(kind), timeout=120))
    return probes


def _write_files(files: dict[str, Any]) -> Callable[[Path], None]:
    def setup(folder: Path) -> None:
        for name, content in files.items():
            if isinstance(content, bytes):
                (folder / name).write_bytes(content)
            else:
                np.save(folder / name, content, allow_pickle=True)
    return setup


def _model_judge(kind: str) -> Callable[[Run], Verdict]:
    def on_success(run: Run) -> Verdict:
        if kind in REFUSED_EXIT0:
            return Verdict("wrong", f"exit 0 on an input that cannot run ({kind})")
        if "matches_integer_reference: True" not in run.stdout:
            return Verdict("wrong", "exit 0 without a bit-exact result")
        return Verdict("ok", "ran, bit-exact")
    return lambda run: judge_cli(run, on_success)
