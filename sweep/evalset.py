"""What a sweep's accuracy objective is measured on: a model's evaluation set, cut in chunks a worker evaluates alone.

The first kind that applies to the model:

* ``file``: ``MODEL.eval.npz`` beside an ONNX file (``x``: stacked inputs of the model's first input; ``y``: int
  labels, optional; ``calib``: the inputs to calibrate on, optional, default the first 200 of ``x``;
  scripts/train_digits.py writes one). With ``y`` the accuracy is test accuracy, else top-1 agreement with float32.
* ``photos``: the zoo's pretrained ``efficientnet_lite0``: the 504 inputs derived from the seven sample photos
  (:func:`vta.compiler.frontend.derived_photos.derived_inputs`, 7 photos x 72 variants, seed 2), calibrated on 14
  more (2 variants per photo, seed 1, disjoint): the set, calibration and top-1 agreement of docs/precision.md and
  scripts/precision_accuracy.py. A chunk is one photo's 72 variants.
* ``random``: ``samples`` seeded random inputs (seed 1000, distinct from calibration's), calibrated as the compile
  always did (the zoo's real images, else 4 seeded random samples): top-1 agreement with float32.

Chunks hold :data:`CHUNK` inputs (the last one fewer); a chunk's inputs are made without making the others', so the
chunks of one set run on different workers at once (:mod:`vta.sweep.accuracy`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EvalSet", "eval_set", "eval_data_path", "chunk_inputs", "calibration_inputs", "CHUNK", "PHOTO_MODELS",
           "PHOTO_VARIANTS", "PHOTO_CALIB_VARIANTS"]

CHUNK = 72
"""Inputs per chunk of a ``file`` or ``random`` set (a ``photos`` set: one photo's variants)."""
RANDOM_SEED = 1000
"""Seed of the ``random`` set's inputs (calibration uses seed 1)."""
PHOTO_MODELS = ("efficientnet_lite0",)
"""Zoo models measured on the photos-derived set."""
PHOTO_VARIANTS = 72
"""Evaluation variants per sample photo (7 photos: 504 inputs, the >= 500 of the issue's accuracy target)."""
PHOTO_CALIB_VARIANTS = 2
"""Calibration variants per sample photo (14 inputs)."""


@dataclass(frozen=True)
class EvalSet:
    """A model's evaluation set: ``kind`` (``file``, ``photos``, ``random``), ``key`` (its part of cache keys: the
    file's hash, or the set's construction), ``size`` inputs in chunks of ``chunk``, ``labelled`` (labels: test
    accuracy; else top-1 agreement with float32), ``on`` (what the sweep's ``accuracy_on`` column says) and ``path``
    (the ``.eval.npz`` of a ``file`` set)."""

    model: str
    kind: str
    key: str
    size: int
    chunk: int
    labelled: bool
    on: str
    path: Path | None = None

    @property
    def chunks(self) -> int:
        """How many chunks the set has."""
        return -(-self.size // self.chunk)

    def span(self, index: int) -> range:
        """Indices (into the whole set) of the inputs of chunk ``index``."""
        if not 0 <= index < self.chunks:
            raise ValueError(f"chunk {index} is not one of the {self.chunks} chunks of {self.model}'s evaluation "
                             f"set ({self.size} inputs).")
        return range(index * self.chunk, min(self.size, (index + 1) * self.chunk))


def eval_data_path(model: str) -> Path | None:
    """``MODEL.eval.npz`` beside an ONNX file ``model`` (``digits.onnx`` -> ``digits.eval.npz``), when it exists."""
    if not model.endswith(".onnx"):
        return None
    path = Path(model[:-len(".onnx")] + ".eval.npz")
    return path if path.is_file() else None


def eval_set(model: str, samples: int) -> EvalSet:
    """The evaluation set of ``model`` (zoo name or ONNX path); ``samples`` inputs when it is a ``random`` one. Cheap:
    nothing is loaded but an evaluation file's array shapes. Raises ValueError for a missing file or an unknown zoo
    name."""
    from vta.cache import file_sha256
    from vta.compiler.frontend.zoo import list_models
    if model.endswith(".onnx") and not Path(model).is_file():
        raise ValueError(f"the model file {model} does not exist, so it has no evaluation set.")
    if not model.endswith(".onnx") and model not in list_models():
        raise ValueError(f"{model!r} is neither an ONNX file nor a zoo model ({', '.join(list_models())}).")
    data = eval_data_path(model)
    if data is not None:
        with np.load(data) as npz:
            size = int(npz["x"].shape[0])
            labelled = "y" in npz.files
        on = f"{size} inputs of {data.name}" + (" (test accuracy, labels)" if labelled else
                                                " (top-1 agreement with float32)")
        return EvalSet(model, "file", f"eval{file_sha256(data)[:12]}", size, CHUNK, labelled, on, data)
    if model in PHOTO_MODELS:
        from vta.compiler.frontend.derived_photos import CALIB_SEED, EVAL_SEED
        from vta.compiler.frontend.efficientnet import SAMPLE_IMAGE_NAMES
        photos = len(SAMPLE_IMAGE_NAMES)
        size = photos * PHOTO_VARIANTS
        on = (f"top-1 agreement with float32 on {size} inputs derived from {photos} photos ({PHOTO_VARIANTS} "
              f"variants each, seed {EVAL_SEED}; calibrated on {photos * PHOTO_CALIB_VARIANTS}, seed {CALIB_SEED})")
        key = f"photos{photos}x{PHOTO_VARIANTS}s{EVAL_SEED}c{PHOTO_CALIB_VARIANTS}s{CALIB_SEED}"
        return EvalSet(model, "photos", key, size, PHOTO_VARIANTS, False, on)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive number of random inputs, not {samples!r}.")
    on = f"top-1 agreement with float32 on {samples} seeded random inputs"
    return EvalSet(model, "random", f"n{samples}", samples, CHUNK, False, on)


def chunk_inputs(es: EvalSet, graph: Any, index: int) -> tuple[list[dict[str, np.ndarray]], np.ndarray | None]:
    """The inputs of chunk ``index`` of ``es``, one ``{input name: array of the graph's input shape}`` per input, and
    their labels (None for an unlabelled set). ``graph`` is the model's float graph."""
    span = es.span(index)
    if es.kind == "file":
        assert es.path is not None
        with np.load(es.path) as npz:
            x = np.asarray(npz["x"][span.start:span.stop], np.float32)
            labels = np.asarray(npz["y"][span.start:span.stop]) if es.labelled else None
        return [{graph.inputs[0]: x[i:i + 1]} for i in range(len(x))], labels
    if es.kind == "photos":
        return [{graph.inputs[0]: x[None]} for x in _photo_variants(index, span)], None
    from vta.compiler.pipeline import random_inputs
    stacked = random_inputs(graph, RANDOM_SEED, es.size)
    batch = graph.shape(graph.inputs[0])[0]
    return [{k: v[i * batch:(i + 1) * batch] for k, v in stacked.items()} for i in span], None


def _photo_variants(photo: int, span: range) -> np.ndarray:
    """The evaluation variants of sample photo ``photo`` (chunk ``photo`` of a ``photos`` set, ``span`` its rows),
    ``float32 [72, 3, 224, 224]``: rows ``span`` of ``derived_inputs(sample_images(), 72, seed=EVAL_SEED)``, made
    without the other photos' variants, each from its generator ``default_rng([EVAL_SEED, photo, k])`` as
    ``derived_inputs`` makes it (``derived_photos.derived_variant``; tests/test_sweep_accuracy.py checks the two
    agree)."""
    from vta.compiler.frontend import derived_photos
    from vta.compiler.frontend.efficientnet import IMAGE_SIZE, sample_images
    img = np.asarray(list(sample_images().values())[photo])
    out = np.empty((len(span), 3, IMAGE_SIZE, IMAGE_SIZE), np.float32)
    for k in range(len(span)):
        rng = np.random.default_rng([derived_photos.EVAL_SEED, photo, k])
        out[k], _ = derived_photos.derived_variant(img, rng, IMAGE_SIZE)
    return out


def calibration_inputs(model: str, graph: Any) -> dict[str, np.ndarray]:
    """The stacked inputs (input name -> array) ``model`` is calibrated on: an evaluation file's ``calib`` (or its
    first 200 ``x``), the photos-derived calibration part, else the compile's (the zoo's real images, else 4 seeded
    random samples)."""
    data = eval_data_path(model)
    if data is not None:
        with np.load(data) as npz:
            calib = npz["calib"] if "calib" in npz.files else npz["x"][:200]
            return {graph.inputs[0]: np.asarray(calib, np.float32)}
    if model in PHOTO_MODELS:
        from vta.compiler.frontend.derived_photos import CALIB_SEED, derived_inputs
        from vta.compiler.frontend.efficientnet import sample_images
        calib, _ = derived_inputs(sample_images(), PHOTO_CALIB_VARIANTS, seed=CALIB_SEED)
        return {graph.inputs[0]: calib}
    from vta.compiler.pipeline import calibration_inputs as compile_calibration
    return compile_calibration(model, graph, 1, 4)
