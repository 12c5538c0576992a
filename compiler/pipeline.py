"""The compile pipeline as a library: load -> quantize -> partition -> lower -> schedule -> codegen -> artefact.

Each stage is a public function; the command line (:mod:`.cli`), the scripts and the tests all compile through them:

* :func:`load_graph`: a zoo name or an ONNX path -> the float :class:`~.ir.Graph`;
* :func:`calibration_inputs` / :func:`random_inputs` and :func:`.quantize.quantize`: the float graph -> the
  quantized graph;
* :func:`partition_graph`: a :class:`~.partition.Decision` for every node, and the lowered accelerator layer
  (:class:`~.partition.Lowered`, with its tiling checked by :func:`.schedule.plan_conv`) of every node placed on the
  accelerator: each such node is lowered exactly once per compile;
* :func:`accel_step`: one lowered layer -> its tiling (:mod:`.schedule`) and program (:mod:`.codegen`), an
  :class:`~.runtime.AccelStep`;
* :func:`compile_graph`: a quantized graph -> the :class:`~.runtime.Compiled` artefact; :func:`compile_model` runs
  every stage from a model name.

The intrinsics of the config (:func:`.intrin.intrinsics`) are derived once per config and passed down the stages.

Example::

    compiled = compile_model("tiny_cnn", VTAConfig(), policy="accel")
    out = run(compiled, random_inputs(compiled.graph, seed=0), target="fsim")
"""
from __future__ import annotations

import os
import time
import tokenize
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from vta.arrayfile import ArrayFileError, check_npy, declared_bytes, npz_declared
from vta.config import VTAConfig
from vta.cost import estimate
from vta.suggest import close_matches, did_you_mean

from .frontend.masks import (
    NUMERIC_RANGE,
    is_float_mask_input,
    is_mask_input,
    is_numeric_input,
    mask_lengths,
    numeric_input_problem,
    only_input_fns,
    token_range,
)
from .ir import REQUANT_MODES, Graph, Node, node_macs
from .lowering.codegen import ConvLayer, build_add_program, build_conv_program
from .lowering.gelu import GELU_MODES, GeluLayer, build_gelu_program, integer_gelu
from .lowering.intrin import Intrinsics, intrinsics
from .lowering.layernorm import (
    LAYERNORM_MODES,
    LayerNormLayer,
    build_layernorm_program,
    integer_layernorm,
)
from .lowering.layout import packed_activation_shape
from .lowering.partition import Decision, Lowered, partition
from .lowering.rowwise import restore_nodes
from .lowering.schedule import ConvTiling
from .lowering.search import LayerPlan, SearchCache, plan_program, search_conv, tiling_to_dict
from .lowering.softmax import SOFTMAX_MODES, SoftmaxLayer, build_softmax_program, integer_softmax
from .options import CompileOptions
from .runtime.compiled import AccelStep, Compiled, CpuStep, Step, _progress

__all__ = ["load_graph", "load_input", "check_inputs", "InputError", "InputTypeError", "check_force_cpu", "token_range",
           "read_npz_shapes",
           "is_mask_input", "is_float_mask_input", "random_mask", "float_mask",
           "random_inputs", "calibration_inputs", "calibration_set", "CalibrationSet", "partition_graph", "choose_gelu",
           "choose_layernorm", "choose_softmax",
    "accel_step",
           "compile_graph",
           "compile_model", "CompileOptions", "plan_graph", "Planned", "PlannedLayer", "REQUANT_MODES"]


def load_graph(model: str, *, batch: int | None = None,
               input_shapes: dict[str, tuple[int, ...]] | None = None,
               input_values: dict[str, float] | None = None) -> Graph:
    """The float :class:`~.ir.Graph` of ``model``: a zoo name (see :func:`.zoo.list_models`) or an ONNX path (a
    pre-quantized ONNX model gives its quantized graph, :mod:`.frontend.prequant`; :func:`compile_model` then skips
    calibration).

    ``batch``: images per inference for a model whose batch dimension is dynamic (default 1). ``input_shapes``:
    input name -> whole shape, for inputs with other dynamic dimensions (an error without it). ``input_values``:
    input name -> value, for one-element inputs compiled as constants (an If they decide becomes its branch). A file
    that is not an ONNX model raises :class:`.onnx_frontend.ModelFileError` naming it."""
    from .frontend import zoo
    from .frontend.prequant import import_model
    name = None
    if os.path.exists(model):
        path = Path(model)
    elif model in zoo.list_models():
        path, name = zoo.get_model(model), model  # named by the zoo, not by its cache file (<name>.v<N>.onnx)
    elif _looks_like_path(model):
        raise FileNotFoundError(f"model file {model} does not exist")
    else:
        names = zoo.list_models()
        raise ValueError(f"model {model!r} is not a zoo model{did_you_mean(model, names)} and not a file; zoo models "
                         f"are {', '.join(names)}")
    return import_model(path, batch=batch or 1, name=name, input_shapes=input_shapes, input_values=input_values)


def _looks_like_path(model: str) -> bool:
    """Whether ``model`` is meant as a file: it has a suffix (.onnx, .vtac, .npz, ...) or a folder separator."""
    return bool(Path(model).suffix) or "/" in model or os.sep in model


def random_mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A seeded padding mask of ``shape`` (int64 0/1): per batch row, the first ``n`` keys (last axis) kept, ``n``
    uniform in ``[ceil(L / 2), L]``, the rest masked out, as a batch of sentences of different lengths padded to
    one length would be."""
    keys = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    kept = rng.integers((keys + 1) // 2, keys + 1, shape[0])
    per_row = np.repeat(kept, rows // max(1, shape[0]))
    return (np.arange(keys)[None, :] < per_row[:, None]).astype(np.int64).reshape(shape)


def float_mask(shape: tuple[int, ...]) -> np.ndarray:
    """The default value of a float mask input (:func:`is_float_mask_input`) of ``shape``: causal (0 on and below the
    diagonal, -inf above) when its last two axes are equal (a decoder's ``tgt_mask [T, T]``), else zeros (nothing
    masked)."""
    if len(shape) >= 2 and shape[-1] == shape[-2]:
        causal = np.where(np.tril(np.ones(shape[-2:], bool)), 0.0, -np.inf).astype(np.float32)
        return np.broadcast_to(causal, shape).copy()
    return np.zeros(shape, np.float32)


def without_empty(graph: Graph, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``values`` without the arrays of no elements that name no input of ``graph``: the import made a model input
    with a dimension of 0 (a KV cache of past length 0) the empty constant it is, so the array for it holds nothing
    the compiled model reads (the float model, run on the file, still takes it)."""
    return {k: v for k, v in values.items()
            if k in graph.inputs or not (isinstance(v, np.ndarray) and v.size == 0)}


class InputError(ValueError):
    """An input array the model cannot take (:func:`check_inputs`): missing, of another shape, not finite, a mask
    value other than 0/1, a token id out of range."""


class InputTypeError(InputError, TypeError):
    """An input array of a type the model cannot take (not a numpy array, not numeric, float token ids)."""


def check_inputs(graph: Graph, values: dict[str, np.ndarray], source: str = "the input",
                 fixed: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """``values`` as the arrays the model takes, or ValueError/TypeError naming ``source``: every input of ``graph``
    given, each a numeric (bool, integer or float) array of the input's shape with only finite values, converted to
    float32; token ids (an int64 input, :func:`token_range`) integers in the table's range, as int64. Arrays of no
    elements for inputs the import made constants (:func:`without_empty`) pass as they are. ``fixed``: the inputs
    compiled as constants (``--input-value``); an array given for one must hold that value, and is left out."""
    empty = {k: v for k, v in values.items() if k not in without_empty(graph, values)}
    values = without_empty(graph, values)
    for name, want in (fixed or {}).items():
        if name not in values or name in graph.inputs:
            continue
        held = np.asarray(values.pop(name))
        if held.size != 1 or held.dtype.kind not in "biuf" or float(held.reshape(-1)[0]) != want:
            shown = f"{float(held.reshape(-1)[0]):g}" if held.size == 1 and held.dtype.kind in "biuf" else \
                f"an array of shape {held.shape}"
            raise InputError(f"{source} gives input {name!r} as {shown}, but the model was compiled with it the "
                             f"constant {want:g} (an If it decides became that branch); compile again with "
                             f"--input-value {name}={shown if held.size == 1 else 'VALUE'}.")
    missing = [name for name in graph.inputs if name not in values]
    extra = sorted(set(values) - set(graph.inputs))
    if missing or extra:
        given = ", ".join(map(repr, sorted(values))) or "no arrays"
        raise InputError(f"{source} gives {given}; the model's inputs are {', '.join(map(repr, graph.inputs))}.")
    out: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        value = values[name]
        if not isinstance(value, np.ndarray):
            raise InputTypeError(f"{source} for input {name!r} must be a numpy array, not {type(value).__name__}.")
        if value.dtype.kind not in "biuf" and value.dtype.name != "bfloat16":     # ml_dtypes' bfloat16 is a float
            raise InputTypeError(f"{source} has dtype {value.dtype}; the model's input {name!r} takes numbers "
                                 f"(bool, integer or float, converted to float32).")
        if only_input_fns(graph, name) and value.size == int(np.prod(graph.shape(name))):
            value = value.reshape(graph.shape(name))   # a scalar the lab takes as [1] (optimum's timestep)
        if value.shape != graph.shape(name):
            raise InputError(f"{source} has shape {value.shape}; the model's input {name!r} has shape "
                             f"{graph.shape(name)}.")
        if mask_lengths(graph, name) is not None:       # lengths the model's own nodes turn into a mask
            if value.dtype.kind not in "biu":
                raise InputTypeError(f"{source} has dtype {value.dtype}; the model's input {name!r} takes integer "
                                     f"lengths (valid keys per sequence).")
            out[name] = value.astype(np.int64)
            continue
        if is_numeric_input(graph, name):              # an integer the model computes with (a timestep)
            if (problem := numeric_input_problem(graph, name, value)) is not None:
                raise InputError(f"{source}: {problem}.")
            out[name] = value.astype(np.int64)
            continue
        if is_mask_input(graph, name):
            odd = int(((value != 0) & (value != 1)).sum())
            if odd:
                raise InputError(f"{source} holds {odd} values other than 0 and 1 in the attention mask input "
                                 f"{name!r} (1 or True: attend; 0 or False: masked out).")
            out[name] = value.astype(np.int64)
            continue
        rows = token_range(graph, name)
        if rows is not None:
            if value.dtype.kind not in "iu":
                raise InputTypeError(f"{source} has dtype {value.dtype}; the model's input {name!r} takes integer "
                                     f"token ids.")
            outside = int(((value < 0) | (value >= rows)).sum())
            if outside:
                raise InputError(f"{source} holds {outside} token ids outside [0, {rows - 1}], the rows of the "
                                 f"embedding table that input {name!r} indexes.")
            out[name] = value.astype(np.int64)
            continue
        with np.errstate(over="ignore"):
            converted = value.astype(np.float32)
        bad = ~np.isfinite(converted)
        if is_float_mask_input(graph, name):
            bad = np.isnan(converted) | np.isposinf(converted)   # -inf masks out: a mask's own value
        if bad.any():
            nan = int(np.isnan(converted).sum())
            inf = int(bad.sum()) - nan
            big = " (values beyond float32's range become infinite)" if value.dtype.kind == "f" and inf and \
                np.isfinite(value).all() else ""
            raise InputError(f"{source} holds {nan} NaN and {inf} infinite values{big}; the model's input {name!r} "
                             f"must be finite.")
        out[name] = converted
    out.update(empty)              # for the float model, which runs the file; no compiled model reads them
    return out


def load_input(graph: Graph, path: str, fixed: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """The model's one input from the ``.npy`` file ``path``, or its inputs by name from the ``.npz`` file ``path``
    (read without pickles), checked by :func:`check_inputs` (``fixed``: the inputs compiled as constants)."""
    source = f"--input {path}"
    if path.lower().endswith(".npz") and not os.path.isdir(path):
        return check_inputs(graph, _load_npz(path, source, set(graph.inputs) | set(fixed or {})), source, fixed)
    if len(graph.inputs) != 1:
        raise ValueError(f"{source} gives one array but the model takes {len(graph.inputs)} inputs "
                         f"({', '.join(graph.inputs)}).")
    if os.path.isdir(path):
        raise ValueError(f"{source} is a folder; give a .npy file holding one array.")
    try:
        check_npy(path, source)                 # empty, truncated, larger than memory: from the header alone
        value = np.load(path, allow_pickle=False)
    except OSError as err:
        raise ValueError(f"Cannot read {source}: {err.strerror or err}.") from None
    except ArrayFileError:
        raise
    except (ValueError, EOFError, SyntaxError, tokenize.TokenError) as err:  # pickles, object arrays, a bad header
        raise ValueError(f"{source} is not a .npy array of numbers ({err}); save one with numpy.save.") from None
    if not isinstance(value, np.ndarray):  # an .npz archive
        value.close()
        raise ValueError(f"{source} is an .npz archive; give a .npy file holding one array (numpy.save).")
    return check_inputs(graph, {graph.inputs[0]: value}, source)


def _load_npz(path: str, source: str, inputs: set[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` file ``path`` by name (no pickles), or ValueError naming ``source``. Each member's
    header is checked first (:func:`.arrayfile.npz_declared`); with ``inputs`` (the names the model takes), a member
    of another name that holds elements is refused before any member is decompressed."""
    try:
        declared = npz_declared(path, source)
        if declared is not None and inputs is not None:
            extra = [name for name, (shape, dtype) in declared.items()
                     if name not in inputs and declared_bytes(shape, dtype) > 0]
            if extra:
                raise InputError(f"{source} gives {', '.join(map(repr, sorted(declared)))}; the model's inputs are "
                                 f"{', '.join(map(repr, sorted(inputs)))}.")
        archive = np.load(path, allow_pickle=False)
        if isinstance(archive, np.ndarray):
            raise ValueError(f"{source} holds one .npy array, not an .npz archive of named arrays; save the inputs "
                             f"with numpy.savez(FILE, name=array, ...) or name the file .npy")
        with archive:
            return {name: archive[name] for name in archive.files}
    except OSError as err:
        raise ValueError(f"Cannot read {source}: {err.strerror or err}.") from None
    except (ArrayFileError, InputError):
        raise
    except (ValueError, EOFError, RuntimeError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile) as err:
        if "holds one .npy array" in str(err):      # not a zip, cut short, encrypted, a damaged member or header
            raise
        raise ValueError(f"{source} is not an .npz archive of number arrays ({err}); save one with numpy.savez."
                         ) from None


def read_npz_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """The shape of every array of the ``.npz`` file ``path`` by name, from the members' headers where numpy wrote
    them (nothing decompressed), else read without pickles; or ValueError naming it (as ``--input``)."""
    source = f"--input {path}"
    try:
        declared = npz_declared(path, source)
    except OSError as err:
        raise ValueError(f"Cannot read {source}: {err.strerror or err}.") from None
    if declared:
        return {name: shape for name, (shape, _) in declared.items()}
    return {name: tuple(int(d) for d in value.shape) for name, value in _load_npz(path, source).items()}


def check_force_cpu(graph: Graph, names: Iterable[str]) -> None:
    """ValueError unless every name in ``names`` is a node of ``graph``: one line per name that is not, each with
    the closest node names."""
    nodes = [node.name for node in graph.nodes]
    problems = []
    for name in dict.fromkeys(names):
        if name not in nodes:
            close = close_matches(name, nodes, n=5)
            hint = f"the closest are {', '.join(close)}" if close else f"its nodes are {', '.join(nodes[:10])}" + \
                (", ..." if len(nodes) > 10 else "")
            problems.append(f"--force-cpu {name}: the model has no node named {name!r}; {hint}.")
    if problems:
        raise ValueError("\n".join(problems))


def random_inputs(graph: Graph, seed: int, samples: int = 1) -> dict[str, np.ndarray]:
    """Seeded random values for every input of ``graph``: input name -> array of the input's shape with the first
    axis times ``samples``: standard-normal float32, for token ids (:func:`token_range`) int64 ids uniform over the
    embedding table's rows, for lengths (:func:`.frontend.masks.mask_lengths`) integers in ``[ceil(L/2), L]``, for an
    attention mask (:func:`is_mask_input`) a padding mask (:func:`random_mask`), for an integer the model computes
    with (:func:`.frontend.masks.is_numeric_input`, a timestep) integers in ``[0, NUMERIC_RANGE)``, and
    for a float mask (:func:`is_float_mask_input`) :func:`float_mask`, for an int64 input nothing reads (a decoder
    prompt's attention mask once its attention is rewritten) ones. (A KV cache input is float32 like any other:
    keys and values of LayerNormed tokens by weights of standard deviation ``1/sqrt(width)`` are about standard
    normal.)"""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        shape = graph.shape(name)
        full = (shape[0] * samples,) + tuple(shape[1:])
        rows = token_range(graph, name)
        if rows is not None:
            out[name] = rng.integers(0, rows, full, dtype=np.int64)
        elif graph.tensors[name].dtype == "int64" and not graph.consumers(name):
            out[name] = np.ones(full, np.int64)      # an integer input nothing reads: a mask of ones (for onnxruntime)
        elif (keys := mask_lengths(graph, name)) is not None:   # valid keys per sequence: as random_mask's
            out[name] = rng.integers((keys + 1) // 2, keys + 1, full, dtype=np.int64)   # in [L/2, L]
        elif is_mask_input(graph, name):
            out[name] = random_mask(full, rng)
        elif is_numeric_input(graph, name):
            out[name] = rng.integers(0, NUMERIC_RANGE, full, dtype=np.int64)
        elif is_float_mask_input(graph, name):
            out[name] = np.concatenate([float_mask(tuple(shape))] * samples)
        else:
            out[name] = rng.standard_normal(full).astype(np.float32)
    return out


def calibration_inputs(model: str, graph: Graph, seed: int, samples: int) -> dict[str, np.ndarray]:
    """Real calibration inputs where the zoo has them for ``model`` (real photos for efficientnet_lite0), else
    ``samples`` seeded random ones (:func:`random_inputs`)."""
    real = _zoo_images(model, graph)
    return random_inputs(graph, seed, samples) if real is None else real


def _zoo_images(model: str, graph: Graph) -> dict[str, np.ndarray] | None:
    """The zoo's real calibration images of ``model`` as stacked inputs, when it has them and the graph takes one
    image at a time; else None."""
    from .frontend import zoo
    real = zoo.calibration_data(model) if model in zoo.list_models() else None
    if real is None or len(graph.inputs) != 1 or graph.shape(graph.inputs[0])[0] != 1:
        return None
    return {graph.inputs[0]: np.ascontiguousarray(real, dtype=np.float32)}


@dataclass(frozen=True)
class CalibrationSet:
    """The samples a compile calibrates on (input name -> stacked float32 array, as :func:`.quantize.quantize`
    takes) and what they are (``info``: ``source`` -- ``random normal``, ``zoo images`` or the ``--calibration``
    path --, ``samples``, ``method`` and its ``percentile``, an image folder's ``preprocess``), which the artefact's
    ``meta["calibration"]`` and the run report record."""

    inputs: dict[str, np.ndarray]
    info: dict[str, Any]

    @property
    def random(self) -> bool:
        """True when the samples are seeded random values, not data: accuracy on real inputs is then unknown."""
        return self.info.get("source") == "random normal"


def calibration_set(model: str, graph: Graph, options: CompileOptions) -> CalibrationSet:
    """The calibration samples of compiling ``model`` (its float ``graph``) with ``options``: the
    ``options.calibration`` file or folder (:func:`.calibration.load_calibration`; a
    :class:`.calibration.CalibrationError` naming it when it cannot calibrate the model), else
    :func:`calibration_inputs` (the zoo's real images where it has them, else ``calib`` random samples seeded
    ``seed + 1``)."""
    from .frontend.calibration import describe, load_calibration, sample_count
    info: dict[str, Any]
    real = None if options.calibration else _zoo_images(model, graph)
    if options.calibration:
        inputs = load_calibration(options.calibration, graph, preprocess=options.preprocess,
                                  fixed=options.input_value_map())
        info = {"source": str(options.calibration), "kind": describe(options.calibration)}
        if info["kind"] == "image folder":
            info["preprocess"] = options.preprocess
    elif real is not None:
        inputs, info = real, {"source": "zoo images"}
    else:
        inputs = random_inputs(graph, options.seed + 1, max(options.calib, 1))
        info = {"source": "random normal", "seed": options.seed + 1}
    info["samples"] = sample_count(inputs) // graph.shape(graph.inputs[0])[0]
    info["method"] = options.calibration_method
    if options.calibration_method == "percentile":
        info["percentile"] = options.calibration_percentile
    return CalibrationSet(inputs, info)


def partition_graph(graph: Graph, intr: Intrinsics, *, policy: str = "auto",
                    force_cpu: Iterable[str] = (), stem: str = "auto"
                    ) -> tuple[dict[str, Decision], dict[str, Lowered]]:
    """Where every node of the quantized ``graph`` runs (see :func:`.partition.partition`), and the lowered layer of
    every node placed on the accelerator (node name -> :class:`~.partition.Lowered`). ``stem``: a first
    convolution's lowering (:data:`.partition.STEMS`)."""
    lowered: dict[str, Lowered] = {}
    decisions = partition(graph, intr.cfg, policy=policy, force_cpu=frozenset(force_cpu), lowered=lowered, stem=stem)
    return decisions, lowered


def accel_step(graph: Graph, node: Node, lowered: Lowered, intr: Intrinsics, *, threads: int = 2,
               search: bool = True, search_cache: SearchCache | None = None) -> AccelStep:
    """The accelerator step of ``node``: the tiling and program of its ``lowered`` layer on ``intr``'s config.

    ``threads``: 2 (double buffering, latency hiding; the search may still pick one thread for a layer where the
    cycle model says it is faster) or 1 (single-threaded programs only). ``search``: pick a conv/dense tiling by
    the cycle model (:func:`.lowering.search.search_conv`); False keeps :func:`.schedule.plan_conv`'s (fewest
    bytes); ``search_cache``: the search's caches (:class:`.lowering.search.SearchCache`; None: a new one). The step
    records the schedule and the model's predicted cycles of its program."""
    cfg = intr.cfg
    layer = lowered.layer
    cycles: int | None = None
    bound = ""
    if isinstance(layer, ConvLayer):
        found = search_conv(cfg, layer, threads=_search_threads(threads), cache=search_cache) if search else None
        if found is not None and found.built is not None:  # the search built and estimated the chosen program
            program, code = found.built
            assert found.plan is not None
            cycles, bound = found.plan.cycles, found.plan.bound
        else:
            program, code = build_conv_program(cfg, layer, tiling=found.tiling if found else None, threads=threads)
        inputs = [node.inputs[0]]
        t = code.tiling
        tiling = _tiling_label(t) + (f" {lowered.fold.label}" if lowered.fold else "") if t else ""
        schedule = tiling_to_dict(t) if t else {}
        macs = node_macs(graph, node)
    elif isinstance(layer, (GeluLayer, LayerNormLayer, SoftmaxLayer)):
        program, code = _alu_program(cfg, layer, threads)
        inputs = [node.inputs[0]]
        tiling = f"{code.tiles} tiles"
        schedule = {"tiles": code.tiles}
        macs = 0
    else:
        program, code = build_add_program(cfg, layer, packed_activation_shape(layer.shape, intr.batch,
                                                                              intr.block_in), threads=threads)
        inputs = list(node.inputs[:2])
        tiling = f"{code.tiles} tiles"
        schedule = {"tiles": code.tiles}
        macs = 0
    if cycles is None:
        predicted = estimate(program)
        cycles, bound = predicted.cycles, predicted.bound
    schedule["bound"] = bound
    return AccelStep(node, program, inputs, node.outputs[0], macs, code.gemm_uops, code.alu_uops, code.tiles,
                     tiling, lowered.fold, schedule, cycles)


def _alu_program(cfg: VTAConfig, layer: GeluLayer | LayerNormLayer | SoftmaxLayer, threads: int) -> tuple[Any, Any]:
    """The program and code of an ALU-only layer (the integer GELU, LayerNorm or Softmax)."""
    if isinstance(layer, GeluLayer):
        return build_gelu_program(cfg, layer, threads=threads)
    if isinstance(layer, LayerNormLayer):
        return build_layernorm_program(cfg, layer, threads=threads)
    return build_softmax_program(cfg, layer, threads=threads)


def _tiling_label(t: ConvTiling) -> str:
    """A short text of a tiling: tile sizes, then the options that differ from the defaults."""
    label = f"oc{t.oc_tile} ic{t.ic_tile} oh{t.oh_tile} ow{t.ow_tile}"
    label += f" kh{t.kh_tile}" if t.kh_tile < t.geom.kh else ""
    label += " 1thread" if t.threads == 1 else ""
    label += " pixel-outer" if t.order == "pixel" else ""
    label += " bias-load" if t.bias_load else ""
    return label


def _partitioned(graph: Graph, cfg: VTAConfig, policy: str, force_cpu: Iterable[str], stem: str,
                 search_cache: SearchCache | None, gelu: str = "auto", layernorm: str = "auto",
                 softmax: str = "auto") -> tuple[Intrinsics, Graph, dict[str, Decision], dict[str, Lowered],
                                                 SearchCache]:
    """What :func:`compile_graph` and :func:`plan_graph` start from: the config's intrinsics, the graph with its Gelu
    tables chosen by ``gelu``, its LayerNorms by ``layernorm`` and its softmaxes by ``softmax`` (:func:`choose_gelu`),
    its partition
    (:func:`partition_graph`) and the search's caches
    (``search_cache``, else a new one for this call)."""
    intr = intrinsics(cfg)
    graph, decisions, lowered = choose_gelu(graph, intr, gelu, policy=policy, force_cpu=force_cpu, stem=stem,
                                            layernorm=layernorm, softmax=softmax)
    return intr, graph, decisions, lowered, SearchCache() if search_cache is None else search_cache


def choose_gelu(graph: Graph, intr: Intrinsics, gelu: str = "auto", *, policy: str = "auto",
                force_cpu: Iterable[str] = (), stem: str = "auto", layernorm: str = "auto", softmax: str = "auto"
                ) -> tuple[Graph, dict[str, Decision], dict[str, Lowered]]:
    """The graph to compile, its decisions and lowered layers (as :func:`partition_graph`), with each Gelu table run
    as ``gelu`` says (:data:`.lowering.gelu.GELU_MODES`): ``table`` keeps the tables; ``int`` makes every one I-BERT's
    integer ``QGelu`` (:func:`.lowering.gelu.integer_gelu`); ``auto`` does so, partitions, and puts the tables back
    where the partitioner kept the ``QGelu`` on the CPU (its decision's reason says so). Likewise each
    ``QLayerNorm`` over the last axis as ``layernorm`` says (:data:`.lowering.layernorm.LAYERNORM_MODES`, see
    :func:`choose_layernorm`), and each ``QSoftmax`` as ``softmax`` says (:data:`.lowering.softmax.SOFTMAX_MODES`,
    see :func:`choose_softmax`). ``graph`` is not changed."""
    if gelu not in GELU_MODES:
        raise ValueError(f"gelu={gelu!r} is unknown; use one of {', '.join(GELU_MODES)}")
    if layernorm not in LAYERNORM_MODES:
        raise ValueError(f"layernorm={layernorm!r} is unknown; use one of {', '.join(LAYERNORM_MODES)}")
    if softmax not in SOFTMAX_MODES:
        raise ValueError(f"softmax={softmax!r} is unknown; use one of {', '.join(SOFTMAX_MODES)}")
    tables: dict[str, Node] = {}
    if gelu != "table":
        graph, tables = integer_gelu(graph)
    norms: dict[str, Node] = {}
    if layernorm == "int" or (layernorm == "auto" and intr.cfg.lane_reduce):  # auto: only where the ALU can run it
        graph, norms = integer_layernorm(graph)
    softmaxes: dict[str, Node] = {}
    if softmax == "int" or (softmax == "auto" and intr.cfg.lane_reduce):  # auto: only where the ALU can run it
        graph, softmaxes = integer_softmax(graph)
    decisions, lowered = partition_graph(graph, intr, policy=policy, force_cpu=force_cpu, stem=stem)
    # auto: each integer node the partitioner kept on the CPU goes back to its float form, and its reason says so
    for mode, mode_name, swapped, op, float_op, what in (
            (softmax, "softmax", softmaxes, "QISoftmax", "QSoftmax", "the float softmax"),
            (layernorm, "layernorm", norms, "QILayerNorm", "QLayerNorm", "the float LayerNorm"),
            (gelu, "gelu", tables, "QGelu", "QLut", "the float table")):
        back = {name for name in swapped if decisions[name].target == "cpu"} if mode == "auto" else set()
        restore_nodes(graph, op, swapped, back)
        for name in back:
            d = decisions[name]
            decisions[name] = Decision(name, float_op, "cpu", f"{d.reason}; {what} ({mode_name}=auto)", d.macs,
                                       d.accel_us, d.cpu_us)
    return graph, decisions, lowered


def choose_layernorm(graph: Graph, intr: Intrinsics, layernorm: str = "auto", **kwargs: Any
                     ) -> tuple[Graph, dict[str, Decision], dict[str, Lowered]]:
    """:func:`choose_gelu` with ``layernorm`` given first (Gelu tables as ``kwargs["gelu"]``, default ``auto``):
    ``float`` keeps every ``QLayerNorm``; ``int`` makes every one over the last axis the integer ``QILayerNorm``
    (:func:`.lowering.layernorm.integer_layernorm`), placed by the partitioner; ``auto`` does so on designs with
    ``lane_reduce`` and puts ``QLayerNorm`` back where the partitioner kept the integer node on the CPU."""
    gelu = kwargs.pop("gelu", "auto")
    return choose_gelu(graph, intr, gelu, layernorm=layernorm, **kwargs)


def choose_softmax(graph: Graph, intr: Intrinsics, softmax: str = "auto", **kwargs: Any
                   ) -> tuple[Graph, dict[str, Decision], dict[str, Lowered]]:
    """:func:`choose_gelu` with ``softmax`` given first (Gelu tables as ``kwargs["gelu"]``, default ``auto``):
    ``float`` keeps every ``QSoftmax``; ``int`` makes every one over the last axis without a mask the integer
    ``QISoftmax`` (:func:`.lowering.softmax.integer_softmax`), placed by the partitioner; ``auto`` does so on designs
    with ``lane_reduce`` and puts ``QSoftmax`` back where the partitioner kept the integer node on the CPU. A
    softmax with a fused mask always stays a ``QSoftmax`` (:func:`.lowering.softmax.softmax_refusal`)."""
    gelu = kwargs.pop("gelu", "auto")
    return choose_gelu(graph, intr, gelu, softmax=softmax, **kwargs)


def _search_threads(threads: int) -> tuple[int, ...]:
    """The thread counts the schedule search may choose from: both with double buffering (one thread wins where
    the cycle model says so), else one."""
    return (1, 2) if threads == 2 else (1,)


def compile_graph(graph: Graph, cfg: VTAConfig, *, policy: str = "auto", force_cpu: Iterable[str] = (),
                  double_buffer: bool = True, progress: bool = False, stem: str = "auto",
                  search_cache: SearchCache | None = None, gelu: str = "auto", layernorm: str = "auto",
                  softmax: str = "auto") -> Compiled:
    """Partition the quantized ``graph`` and generate a program for every accelerator node (see
    :func:`partition_graph` and :func:`accel_step`); ``policy`` as in :data:`.partition.POLICIES`, ``force_cpu``
    names nodes kept on the CPU.

    ``double_buffer=False`` generates single-threaded programs (no latency hiding), to measure what it buys.
    ``progress`` shows a progress bar (tqdm). ``stem``: a first convolution's lowering (:data:`.partition.STEMS`;
    ``auto``: the fastest estimate). ``search_cache``: the schedule search's caches, shared by every layer
    (:class:`.lowering.search.SearchCache`; None: one for this compile, which reads and adds to the cache folder).
    ``gelu``: how Gelu tables run, ``layernorm`` how LayerNorms run, ``softmax`` how softmaxes run
    (:func:`choose_gelu`); the artefact's graph is the one chosen."""
    start = time.perf_counter()
    intr, graph, decisions, lowered, search_cache = _partitioned(graph, cfg, policy, force_cpu, stem, search_cache,
                                                                 gelu, layernorm, softmax)
    threads = 2 if double_buffer else 1
    steps: list[Step] = []
    for node in _progress(graph.nodes, progress, "compile"):
        if decisions[node.name].target == "accel":
            steps.append(accel_step(graph, node, lowered[node.name], intr, threads=threads,
                                    search_cache=search_cache))
        else:
            steps.append(CpuStep(node, decisions[node.name].macs))
    return Compiled(cfg, graph, steps, decisions, time.perf_counter() - start, {"double_buffer": double_buffer})


@dataclass
class PlannedLayer:
    """An accelerator layer as :func:`plan_graph` predicts it: its node, MACs, the cost of the program
    :func:`compile_graph` would generate (cycles, bounding module, event counts) and its schedule (as
    :attr:`.runtime.AccelStep.schedule`)."""

    node: Node
    macs: int
    plan: LayerPlan
    schedule: dict[str, Any]


@dataclass
class Planned:
    """A model planned for a config without its programs (:func:`plan_graph`): the accelerator layers, the nodes the
    partitioner keeps on the CPU, its decisions, and the planning time in seconds."""

    cfg: VTAConfig
    layers: list[PlannedLayer]
    cpu: list[CpuStep]
    decisions: dict[str, Decision]
    plan_seconds: float = 0.0


def plan_graph(graph: Graph, cfg: VTAConfig, *, policy: str = "auto", force_cpu: Iterable[str] = (),
               double_buffer: bool = True, stem: str = "auto", search_cache: SearchCache | None = None,
               gelu: str = "auto", layernorm: str = "auto", softmax: str = "auto") -> Planned:
    """What :func:`compile_graph` (same arguments) predicts for each accelerator layer -- the same partition, the
    same schedule search, the same predicted cycles, bounding module and event counts -- without keeping programs:
    a convolution's cost comes from the search (:attr:`.lowering.search.SearchResult.plan`, usually from its caches
    without building a program), a residual add's program is built and estimated. What a model-mode sweep needs, several
    times faster than compiling when the schedules are known. ``search_cache``: as in :func:`compile_graph` (a sweep's
    worker passes one for all its points)."""
    start = time.perf_counter()
    intr, graph, decisions, lowered, search_cache = _partitioned(graph, cfg, policy, force_cpu, stem, search_cache,
                                                                 gelu, layernorm, softmax)
    threads = 2 if double_buffer else 1
    layers: list[PlannedLayer] = []
    cpu: list[CpuStep] = []
    for node in graph.nodes:
        if decisions[node.name].target != "accel":
            cpu.append(CpuStep(node, decisions[node.name].macs))
            continue
        layer = lowered[node.name].layer
        if isinstance(layer, ConvLayer):
            found = search_conv(cfg, layer, threads=_search_threads(threads), cache=search_cache)
            plan = found.plan or plan_program(build_conv_program(cfg, layer, tiling=found.tiling)[0])
            schedule: dict[str, Any] = tiling_to_dict(found.tiling)
            macs = node_macs(graph, node)
        elif isinstance(layer, (GeluLayer, LayerNormLayer, SoftmaxLayer)):
            program, code = _alu_program(cfg, layer, threads)
            plan = plan_program(program)
            schedule, macs = {"tiles": code.tiles}, 0
        else:
            program, code = build_add_program(cfg, layer, packed_activation_shape(layer.shape, intr.batch,
                                                                                  intr.block_in), threads=threads)
            plan = plan_program(program)
            schedule, macs = {"tiles": code.tiles}, 0
        schedule["bound"] = plan.bound
        layers.append(PlannedLayer(node, macs, plan, schedule))
    return Planned(cfg, layers, cpu, decisions, time.perf_counter() - start)


def _compile_prequantized(model: str, graph: Graph, cfg: VTAConfig, opts: CompileOptions, start: float) -> Compiled:
    """:func:`compile_model` of a pre-quantized ONNX model, whose ``graph`` :func:`load_graph` imported already
    quantized (:mod:`.frontend.prequant`: the model's own scales and zero points): compiled without calibrating."""
    compiled = compile_graph(graph, cfg, policy=opts.policy, force_cpu=opts.force_cpu,
                             double_buffer=opts.double_buffer, progress=opts.progress, stem=opts.stem,
                             gelu=opts.gelu, layernorm=opts.layernorm, softmax=opts.softmax)
    compiled.meta.update({"model": model, "requant": "multiply", "quantization": "the model's own (pre-quantized)"})
    if opts.input_values:                # one-element inputs compiled as constants (--input-value)
        compiled.meta["input_values"] = dict(opts.input_values)
    compiled.frontend_seconds = time.perf_counter() - start - (compiled.compile_seconds or 0.0)
    return compiled


def _compile_completed(model: str, done: tuple[Graph, str], calibration: CalibrationSet | None, cfg: VTAConfig,
                       opts: CompileOptions, start: float) -> Compiled:
    """:func:`_compile_prequantized` of a partially quantized file completed by :func:`.frontend.prequant.
    complete_partial` (``done``: its graph and what the lab quantized); ``meta`` says so, and with ``calibration``
    (the samples the float activations' ranges came from) records them."""
    graph, note = done
    compiled = _compile_prequantized(model, graph, cfg, opts, start)
    compiled.meta["quantization"] = f"the model's own (pre-quantized), with {note}"
    if calibration is not None:
        compiled.meta["calibration"] = {**calibration.info, "method": "minmax", "completed": note}
    return compiled


def compile_model(model: str, cfg: VTAConfig, options: CompileOptions | None = None, *, graph: Graph | None = None,
                  calibration: CalibrationSet | None = None, **overrides: Any) -> Compiled:
    """Import ``model`` (:func:`load_graph`), quantize it (on the zoo's real calibration images where it has them,
    else ``calib`` random samples seeded ``seed + 1``) and compile it (:func:`compile_graph`); returns the
    :class:`~.runtime.Compiled`, whose ``meta`` names the model and the requantization (its
    ``frontend_seconds`` is the import's and quantization's wall time).

    ``options``: a :class:`~.options.CompileOptions` (default: every field's default); ``overrides``: its fields by
    keyword (``policy="accel", calib=2``), replacing those of ``options``. ``graph``: ``model``'s float graph when the
    caller has already loaded it (to check inputs first). ``requant``: ``"multiply"`` (an integer multiplier and a
    shift per channel) or ``"shift"`` (power-of-two scales, a shift alone, as VTA's TVM stack: one fewer ALU micro-op
    per output vector, slightly less accurate); see :func:`.quantize.quantize`'s ``mode``. ``calibration``: the
    samples to calibrate on when the caller has already read them (:func:`calibration_set`, to check the files
    first); the artefact's ``meta["calibration"]`` says what they were."""
    from .frontend.prequant import complete_partial
    from .frontend.quantize import quantize
    opts = CompileOptions.build(options, **overrides)
    start = time.perf_counter()
    if graph is None:
        graph = load_graph(model, batch=opts.batch, input_shapes=opts.input_shape_map() or None,
                           input_values=opts.input_value_map() or None)
    if graph.is_quantized:  # a pre-quantized ONNX model (frontend/prequant.py): its own scales, nothing to calibrate
        return _compile_prequantized(model, graph, cfg, opts, start)
    if graph.partial is not None and not graph.partial.needs_ranges:   # only float weights to quantize: no samples
        done = complete_partial(graph, None)
        if done is not None:
            return _compile_completed(model, done, None, cfg, opts, start)
    if calibration is None:
        calibration = calibration_set(model, graph, opts)
    if graph.partial is not None and graph.partial.needs_ranges:
        done = complete_partial(graph, calibration.inputs)
        if done is not None:
            return _compile_completed(model, done, calibration, cfg, opts, start)
    narrow = (cfg.inp_width, cfg.wgt_width) != (8, 8)
    keep_int8 = list(opts.keep_int8) if narrow else []
    int8_choice = _choose_int8(graph, calibration, cfg, opts) if narrow and opts.int8_budget is not None else None
    if int8_choice is not None:
        keep_int8 += [n for n in int8_choice["kept"] if n not in keep_int8]
    hints = graph.absmax_hints if calibration.random else {}  # a QDQ file's own ranges beat random data
    if hints:
        calibration = CalibrationSet(calibration.inputs, {**calibration.info, "ranges_from_file": len(hints)})
    qgraph = quantize(graph, calibration.inputs, mode="shift" if opts.requant == "shift" else "multiply",
                      method=opts.calibration_method, percentile=opts.calibration_percentile
                      if opts.calibration_method == "percentile" else None,
                      act_bits=cfg.inp_width, wgt_bits=cfg.wgt_width,  # the design's widths (docs/precision.md)
                      keep_int8=keep_int8,
                      weight_rounding=opts.weight_rounding, absmax_hints=hints,  # type: ignore[arg-type]
                      scores=opts.attention_scores, progress=opts.progress)  # type: ignore[arg-type]
    compiled = compile_graph(qgraph, cfg, policy=opts.policy, force_cpu=opts.force_cpu,
                             double_buffer=opts.double_buffer, progress=opts.progress, stem=opts.stem,
                             gelu=opts.gelu, layernorm=opts.layernorm, softmax=opts.softmax)
    compiled.meta.update({"model": model, "requant": opts.requant, "calibration": dict(calibration.info),
                          "attention_scores": opts.attention_scores})
    if int8_choice is not None:
        compiled.meta["int8_budget"] = int8_choice
    if opts.input_values:                # one-element inputs compiled as constants (--input-value)
        compiled.meta["input_values"] = dict(opts.input_values)
    compiled.frontend_seconds = time.perf_counter() - start - (compiled.compile_seconds or 0.0)
    return compiled


def _choose_int8(graph: Graph, calibration: Any, cfg: VTAConfig, opts: CompileOptions) -> dict[str, Any]:
    """``opts.int8_budget`` met on a narrow design: :func:`.frontend.quantize.choose_int8_layers` calibrated on the
    first half of the calibration samples and measured (top-1 agreement with the float model, percent) on the
    second half; the record the report prints: the budget, the layers kept, each greedy step and what it was
    measured on. A ValueError for a model of several inputs or fewer than two calibration samples."""
    from .frontend.quantize import choose_int8_layers
    if len(graph.inputs) != 1:
        raise ValueError(f"--int8-budget measures top-1 agreement on a one-input model; this one has "
                         f"{len(graph.inputs)} inputs ({', '.join(graph.inputs)}): name the layers with --keep-int8")
    name = graph.inputs[0]
    samples = np.asarray(calibration.inputs[name])
    if len(samples) < 2:
        raise ValueError(f"--int8-budget needs at least two calibration samples (half to calibrate on, half to "
                         f"measure on); there are {len(samples)}: give more with --calib N or --calibration")
    half = (len(samples) + 1) // 2
    kept, trail = choose_int8_layers(graph, {name: samples[:half]}, {name: samples[half:]}, act_bits=cfg.inp_width,
                                     wgt_bits=cfg.wgt_width, budget=float(opts.int8_budget or 0.0),
                                     method=opts.calibration_method)
    return {"budget_points": float(opts.int8_budget or 0.0), "kept": list(kept),
            "steps": [{"kept": list(k), "top1_agreement_pct": round(a, 3)} for k, a in trail],
            "measured_on": f"{len(samples) - half} held-out calibration samples (top-1 agreement with the float "
                           f"model; calibrated on the other {half})"}
