"""Calibration data from the user's files, and the entropy (KL divergence) calibration method.

:func:`load_calibration` reads what ``vta run/compile --calibration FILE|DIR`` names into stacked samples (input name
-> float32 array whose leading axis holds samples, a multiple of the graph's batch), as :func:`.quantize.quantize`
takes them:

* an ``.npz`` archive of named input batches: one array per graph input, each ``[N, *shape[1:]]`` (``N`` samples,
  a multiple of the batch; every input the same ``N``);
* an ``.npy`` file, for a model with one input: its samples stacked, ``[N, *shape[1:]]`` (or one sample);
* a folder of ``.npy`` files, for a model with one input: each one sample (``shape[1:]``) or a batch of them
  (``[n, *shape[1:]]``), read in file-name order;
* a folder of images (``.png``, ``.jpg``, ``.jpeg``; needs Pillow), for a model with one NCHW input of 1 or 3
  channels: each image is converted to RGB (or grey for 1 channel), resized to the input's H x W (bilinear), and
  preprocessed by :data:`PREPROCESS` (``imagenet``, ``unit`` or ``raw``).

Every problem is a :class:`CalibrationError` naming the file and what is wrong (``vta`` prints it as one
``vta: error:`` line, exit 2).

:func:`entropy_threshold` is TensorRT's entropy calibrator (as onnxruntime's ``CalibrationMethod.Entropy``): the
clipping threshold of a tensor whose ``|values|`` histogram is given, chosen to minimise the KL divergence between
the clipped distribution and its 128-level quantization.
"""
from __future__ import annotations

import os
import tokenize
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from vta.arrayfile import ArrayFileError, check_npy, npz_declared

from ..ir import Graph
from .masks import (
    is_float_mask_input,
    is_mask_input,
    is_numeric_input,
    mask_lengths,
    numeric_input_problem,
    only_input_fns,
    token_range,
)

__all__ = ["CalibrationError", "PREPROCESS", "METHODS", "IMAGE_SUFFIXES", "load_calibration", "describe",
           "entropy_threshold", "HISTOGRAM_BINS", "sample_count"]

PREPROCESS = {
    "imagenet": "RGB scaled to [0, 1], then (x - mean) / std per channel with ImageNet's mean (0.485, 0.456, 0.406) "
                "and std (0.229, 0.224, 0.225)",
    "unit": "pixel values scaled to [0, 1]",
    "raw": "pixel values as they are, 0..255",
}
"""How an image becomes a model input, after its resize to the input's H x W."""

METHODS = ("minmax", "percentile", "entropy")
"""Calibration methods: the largest magnitude seen, a percentile of the magnitudes, or the KL-divergence threshold."""

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
HISTOGRAM_BINS = 2048
"""Bins of the ``|value|`` histogram the entropy method collects per tensor (TensorRT's number)."""
_QUANTIZED_BINS = 128
_IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


class CalibrationError(ValueError):
    """Calibration data that cannot calibrate the model: the message names the file and the problem."""


def load_calibration(path: str | os.PathLike[str], graph: Graph, *, preprocess: str = "imagenet",
                     fixed: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """The calibration samples in ``path`` (an ``.npz`` file, an ``.npy`` file of one input's samples, or a folder of
    ``.npy`` files or images) for the float
    ``graph``: input name -> float32 ``[N, *shape[1:]]`` (int64 for token ids), N a positive multiple of the input's
    batch. ``fixed``: inputs compiled as constants (``--input-value``); an array for one must hold that value
    throughout, and is left out."""
    if preprocess not in PREPROCESS:
        raise ValueError(f"preprocess={preprocess!r} is unknown; use one of {', '.join(PREPROCESS)}")
    where = f"--calibration {os.fspath(path)}"
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file())
        arrays = [f for f in files if f.suffix.lower() == ".npy"]
        images = [f for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
        if not arrays and not images:
            raise CalibrationError(f"{where}: the folder holds no .npy files and no images "
                                   f"({', '.join(IMAGE_SUFFIXES)}); give .npy samples, images or an .npz file")
        if arrays and images:
            raise CalibrationError(f"{where}: the folder mixes .npy files and images; keep one kind")
        name = _single_input(graph, where)
        value = _npy_folder(arrays, graph, name) if arrays else _image_folder(images, graph, name, preprocess, where)
        return _checked(graph, {name: value}, where)
    if not p.exists():
        raise CalibrationError(f"{where}: no such file or folder")
    if p.suffix.lower() == ".npy":          # one input's samples stacked, [N, *shape[1:]] (or one sample)
        name = _single_input(graph, where, "an .npy file")
        return _checked(graph, {name: _npy_folder([p], graph, name)}, where)
    if p.suffix.lower() != ".npz":
        raise CalibrationError(f"{where}: give an .npz file of named input batches, an .npy file of one input's "
                               f"samples, or a folder of .npy files or images, not a "
                               f"{p.suffix or 'file without suffix'} file")
    named = _npz(p, where)
    for name, want in (fixed or {}).items():
        if name in named and name not in graph.inputs:
            held = named.pop(name)
            if held.dtype.kind not in "biuf" or not held.size or not (held == want).all():
                raise CalibrationError(f"{where}: array {name!r} holds values other than {want:g}, the constant "
                                       f"the model is compiled with for that input (--input-value)")
    return _checked(graph, named, where)


def describe(path: str | os.PathLike[str]) -> str:
    """What kind of calibration data ``path`` holds: ``npz``, ``npy``, ``npy folder`` or ``image folder``."""
    p = Path(path)
    if not p.is_dir():
        return "npy" if p.suffix.lower() == ".npy" else "npz"
    return "npy folder" if any(f.suffix.lower() == ".npy" for f in p.iterdir()) else "image folder"


def _single_input(graph: Graph, where: str, what: str = "a folder") -> str:
    if len(graph.inputs) != 1:
        raise CalibrationError(f"{where}: {what} calibrates a model with one input, but this one has "
                               f"{len(graph.inputs)} ({', '.join(graph.inputs)}); give an .npz with one array each")
    return graph.inputs[0]


def _load_npy(path: Path) -> np.ndarray:
    try:
        check_npy(str(path), f"--calibration {path}")     # empty, truncated, beyond memory: from its header
        value = np.load(path, allow_pickle=False)
    except ArrayFileError as err:
        raise CalibrationError(str(err).rstrip(".")) from None
    except (OSError, ValueError, EOFError, SyntaxError, tokenize.TokenError) as err:   # a header numpy cannot parse
        raise CalibrationError(f"--calibration {path}: not a .npy array of numbers ({err})") from None
    if not isinstance(value, np.ndarray):
        value.close()
        raise CalibrationError(f"--calibration {path}: an .npz archive inside a folder of .npy files")
    return value


def _npz(path: Path, where: str) -> dict[str, np.ndarray]:
    try:
        npz_declared(str(path), where)                   # each member's header first: nothing decompressed
        with np.load(path, allow_pickle=False) as archive:
            if isinstance(archive, np.ndarray):
                raise CalibrationError(f"{where}: a .npy array in a file named .npz; save the batches with "
                                       f"numpy.savez(FILE, input_name=array, ...)")
            return {name: archive[name] for name in archive.files}
    except ArrayFileError as err:
        raise CalibrationError(str(err).rstrip(".")) from None
    except (OSError, ValueError, EOFError, RuntimeError, SyntaxError, tokenize.TokenError) as err:  # an encrypted
        raise CalibrationError(f"{where}: not a readable .npz archive of numeric arrays ({err})") from None  # member


def _npy_folder(files: list[Path], graph: Graph, name: str) -> np.ndarray:
    sample = tuple(graph.shape(name)[1:])
    parts = []
    for f in files:
        value = _load_npy(f)
        if value.dtype.kind not in "biuf":
            raise CalibrationError(f"--calibration {f}: dtype {value.dtype} is not numeric")
        if value.shape == sample:
            value = value[None]
        elif value.shape[1:] != sample:
            raise CalibrationError(f"--calibration {f}: shape {value.shape}; input {name!r} takes one sample "
                                   f"{sample} or a batch [n, {', '.join(map(str, sample))}]")
        parts.append(value.astype(np.float32))
    return np.concatenate(parts)


def _image_folder(files: list[Path], graph: Graph, name: str, preprocess: str, where: str) -> np.ndarray:
    shape = graph.shape(name)
    if len(shape) != 4 or shape[1] not in (1, 3):
        raise CalibrationError(f"{where}: images calibrate an NCHW input of 1 or 3 channels; input {name!r} has "
                               f"shape {shape}")
    try:
        from PIL import Image
    except ImportError:
        raise CalibrationError(f"{where}: reading images needs Pillow (pip install pillow); or give the samples as "
                               f".npy files or an .npz") from None
    height, width = shape[2], shape[3]
    out = []
    for f in files:
        try:
            with Image.open(f) as img:
                pixels = np.asarray(img.convert("RGB" if shape[1] == 3 else "L")
                                    .resize((width, height), Image.Resampling.BILINEAR), np.float32)
        except OSError as err:
            raise CalibrationError(f"--calibration {f}: not a readable image ({err})") from None
        pixels = pixels.reshape(height, width, shape[1]).transpose(2, 0, 1)
        out.append(_preprocess(pixels, preprocess))
    return np.stack(out)


def _preprocess(pixels: np.ndarray, how: str) -> np.ndarray:
    """``[C, H, W]`` pixels 0..255 -> the model's input values (:data:`PREPROCESS`); grey uses the mean's and std's
    averages."""
    if how == "raw":
        return pixels
    unit = pixels / np.float32(255.0)
    if how == "unit":
        return unit
    mean, std = (_IMAGENET_MEAN, _IMAGENET_STD) if pixels.shape[0] == 3 else \
        (_IMAGENET_MEAN.mean(keepdims=True), _IMAGENET_STD.mean(keepdims=True))
    return (unit - mean.reshape(-1, 1, 1)) / std.reshape(-1, 1, 1)


def _checked(graph: Graph, values: dict[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
    """``values`` checked against ``graph``'s inputs: every input named, numeric, finite, ``[N, *shape[1:]]`` with
    the same positive N (a multiple of the batch) for all; token ids (an int64 input) integers within their
    embedding table, kept as int64."""
    values = {k: v for k, v in values.items() if k in graph.inputs or v.size}     # the empty inputs made constants
    missing = [n for n in graph.inputs if n not in values]
    extra = sorted(set(values) - set(graph.inputs))
    if missing or extra:
        what = f"no array for input {', '.join(map(repr, missing))}" if missing else \
            f"arrays {', '.join(map(repr, extra))} that are not inputs"
        raise CalibrationError(f"{where}: {what}; the model's inputs are {', '.join(map(repr, graph.inputs))} "
                               f"(the archive has {', '.join(map(repr, sorted(values))) or 'no arrays'})")
    counts = set()
    out: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        value, shape = values[name], graph.shape(name)
        if value.dtype.kind not in "biuf":
            raise CalibrationError(f"{where}: input {name!r} has dtype {value.dtype}; it takes numbers")
        if only_input_fns(graph, name) and value.ndim < len(shape) and value.size % max(1, int(np.prod(shape[1:]))) \
                == 0:                                   # scalars the lab takes as [1] (optimum's timestep), stacked
            value = value.reshape((-1, *shape[1:]))
        if value.shape[1:] != tuple(shape[1:]) or value.ndim != len(shape):
            raise CalibrationError(f"{where}: input {name!r} has shape {value.shape}; it takes [N, "
                                   f"{', '.join(map(str, shape[1:]))}] (N samples, a multiple of the batch "
                                   f"{shape[0]})")
        if value.shape[0] == 0 or value.shape[0] % shape[0]:
            raise CalibrationError(f"{where}: input {name!r} has {value.shape[0]} samples; give a positive "
                                   f"multiple of the batch {shape[0]}")
        if (keys := mask_lengths(graph, name)) is not None:   # valid keys per sequence, as the model computes them
            if value.dtype.kind not in "iu":
                raise CalibrationError(f"{where}: input {name!r} takes integer lengths (valid keys per sequence, "
                                       f"up to {keys})")
            counts.add(value.shape[0] // shape[0])
            out[name] = value.astype(np.int64)
            continue
        if is_mask_input(graph, name):                  # an attention mask of 0 and 1
            if ((value != 0) & (value != 1)).any():
                raise CalibrationError(f"{where}: input {name!r} is an attention mask; it takes 0 and 1 only")
            counts.add(value.shape[0] // shape[0])
            out[name] = value.astype(np.int64)
            continue
        if is_numeric_input(graph, name):               # an integer the model computes with (a timestep)
            if (problem := numeric_input_problem(graph, name, value)) is not None:
                raise CalibrationError(f"{where}: {problem}")
            counts.add(value.shape[0] // shape[0])
            out[name] = value.astype(np.int64)
            continue
        if graph.tensors[name].dtype == "int64":        # token ids into an embedding table
            rows = token_range(graph, name)
            if value.dtype.kind not in "iu" or rows is not None and ((value < 0) | (value >= rows)).any():
                raise CalibrationError(f"{where}: input {name!r} takes token ids, integers in [0, "
                                       f"{'...' if rows is None else rows - 1}] (the rows of its embedding table)")
            counts.add(value.shape[0] // shape[0])
            out[name] = value.astype(np.int64)
            continue
        converted = value.astype(np.float32)
        bad = np.isnan(converted) | np.isposinf(converted) if is_float_mask_input(graph, name) else \
            ~np.isfinite(converted)                       # a float mask's -inf masks out
        if bad.any():
            raise CalibrationError(f"{where}: input {name!r} holds NaN or infinite values")
        counts.add(value.shape[0] // shape[0])
        out[name] = converted
    if len(counts) > 1:
        raise CalibrationError(f"{where}: the inputs have different sample counts ({sorted(counts)}); give each "
                               f"the same number")
    return out


def sample_count(values: dict[str, Any]) -> int:
    """Samples in stacked calibration data (the leading axis of its first array)."""
    return int(np.shape(next(iter(values.values())))[0]) if values else 0


def entropy_threshold(hist: np.ndarray, bin_width: float) -> float:
    """The clipping threshold (same unit as ``bin_width``) of a ``|value|`` histogram of :data:`HISTOGRAM_BINS`
    bins over ``[0, bins * bin_width]``: for every candidate ``i`` of 128..bins bins, the reference P is the first
    ``i`` bins with the mass beyond added to the last, Q is P merged into 128 levels and spread back over each
    level's non-empty bins; the ``i`` of the least KL(P || Q) (both smoothed: an empty bin gets 1e-4 of a count)
    gives ``i * bin_width`` (TensorRT's calibrator; MXNet's and TVM's smoothing)."""
    hist = np.asarray(hist, np.float64)
    bins = hist.size
    if hist.sum() == 0 or bins <= _QUANTIZED_BINS:
        return bins * bin_width
    best, best_i = np.inf, bins
    tail = np.cumsum(hist[::-1])[::-1]  # tail[i] = mass of bins i..
    for i in range(_QUANTIZED_BINS, bins + 1):
        p = hist[:i].copy()
        if i < bins:
            p[-1] += tail[i]
        if p.sum() == 0:
            continue
        q = _expand(hist[:i], i)
        kl = _kl(p, q)
        if kl < best:
            best, best_i = kl, i
    return best_i * bin_width


def _expand(p: np.ndarray, i: int) -> np.ndarray:
    """``p`` (``i`` bins) merged into 128 levels, each level's mass spread evenly over its non-empty bins."""
    edges = (np.arange(_QUANTIZED_BINS + 1) * i) // _QUANTIZED_BINS
    level = np.repeat(np.arange(_QUANTIZED_BINS), np.diff(edges))
    nonzero = p > 0
    mass = np.bincount(level, weights=p, minlength=_QUANTIZED_BINS)
    count = np.bincount(level, weights=nonzero, minlength=_QUANTIZED_BINS)
    share = np.divide(mass, count, out=np.zeros_like(mass), where=count > 0)
    return np.where(nonzero, share[level], 0.0)


def _smooth(counts: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """``counts`` with every empty bin given ``eps`` taken evenly from the others (MXNet's and TVM's smoothing of
    the entropy calibrator, so that a bin empty in Q but not in P costs much instead of infinitely); None when the
    histogram is empty or too sparse to give that much."""
    empty = counts == 0
    full = counts.size - int(empty.sum())
    if full == 0:
        return None
    take = eps * int(empty.sum()) / full
    if take >= counts[~empty].min():
        return None
    return counts + np.where(empty, eps, -take)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(P || Q) of two histograms (counts) after :func:`_smooth` and normalising each to 1; infinite when either
    cannot be smoothed."""
    ps, qs = _smooth(p), _smooth(q)
    if ps is None or qs is None:
        return float("inf")
    ps, qs = ps / ps.sum(), qs / qs.sum()
    return float((ps * np.log(ps / qs)).sum())
