"""An evaluation set derived from real photos, and the metrics that compare a quantized model with its float model.

No labelled ImageNet data ships offline, so a quantized classifier is judged by its agreement with the float model
on inputs derived from the real photos that ship in installed packages
(:func:`vta.compiler.frontend.efficientnet.sample_images`: seven photos from scikit-image and matplotlib).

:func:`derived_inputs` makes ``per_photo`` variants of each photo, each from its own seeded generator
``numpy.random.default_rng([seed, photo index, variant index])``, applied in this order:

1. rotation by an angle uniform in [-10, 10] degrees about the centre (bicubic; the corners that leave the photo
   are cut away by step 2 where the crop allows, else filled with grey 127);
2. a square crop of a fraction uniform in [0.5, 1.0] of the short side (the scaling), at a uniform position;
3. a horizontal flip with probability 1/2;
4. brightness, contrast and saturation each scaled by a factor uniform in [0.8, 1.2] (PIL ``ImageEnhance``);
5. a bicubic resize to ``size`` x ``size`` and ``(pixel - 127) / 128``, as
   :func:`~vta.compiler.frontend.efficientnet.preprocess` does.

Different seeds give disjoint sets (the calibration set and the evaluation set use seeds 1 and 2).
:func:`agreement` gives top-1 and top-5 agreement and the mean KL divergence of the softmax.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["derived_inputs", "derived_variant", "describe_set", "agreement", "CALIB_SEED", "EVAL_SEED"]

CALIB_SEED = 1
"""Seed of the calibration part of the derived set."""
EVAL_SEED = 2
"""Seed of the evaluation part of the derived set (disjoint from calibration's)."""


def derived_variant(img: np.ndarray, rng: np.random.Generator, size: int) -> tuple[np.ndarray, str]:
    """One derived input ``float32 [3, size, size]`` of ``img`` ``uint8 [H, W, 3]`` and a description of it, drawn from
    ``rng`` (what :func:`derived_inputs` makes for each sample, with its generator)."""
    from PIL import Image, ImageEnhance
    angle = float(rng.uniform(-10.0, 10.0))
    fraction = float(rng.uniform(0.5, 1.0))
    pos_y, pos_x = float(rng.random()), float(rng.random())
    flip = bool(rng.random() < 0.5)
    bright, contrast, colour = (float(v) for v in rng.uniform(0.8, 1.2, size=3))
    pil = Image.fromarray(np.ascontiguousarray(img[..., :3]))
    pil = pil.rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=(127, 127, 127))
    h, w = img.shape[:2]
    side = max(1, int(round(min(h, w) * fraction)))
    top, left = int(round((h - side) * pos_y)), int(round((w - side) * pos_x))
    pil = pil.crop((left, top, left + side, top + side))
    if flip:
        pil = pil.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pil = ImageEnhance.Brightness(pil).enhance(bright)
    pil = ImageEnhance.Contrast(pil).enhance(contrast)
    pil = ImageEnhance.Color(pil).enhance(colour)
    pixels = np.asarray(pil.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32)
    what = (f"rot {angle:+.1f} deg, crop {fraction:.2f} at ({top},{left}), {'flip, ' if flip else ''}"
            f"bright {bright:.2f} contrast {contrast:.2f} colour {colour:.2f}")
    return ((pixels - 127.0) / 128.0).transpose(2, 0, 1).copy(), what


def derived_inputs(images: Mapping[str, np.ndarray], per_photo: int, *, seed: int,
                   size: int = 224) -> tuple[np.ndarray, list[str]]:
    """``per_photo`` derived inputs of each photo of ``images`` (name -> ``uint8 [H, W, 3]``), photo by photo in the
    mapping's order: ``float32 [len(images) * per_photo, 3, size, size]`` and one description per input
    (``"chelsea #3: rot ..."``). Deterministic in (photos, ``per_photo``, ``seed``, ``size``); see the module
    docstring for the transformations."""
    if isinstance(per_photo, bool) or not isinstance(per_photo, int) or per_photo < 1:
        raise ValueError(f"per_photo must be a positive number of inputs per photo, not {per_photo!r}.")
    if not images:
        raise ValueError("derived_inputs needs at least one photo; got none.")
    out = np.empty((len(images) * per_photo, 3, size, size), np.float32)
    notes = []
    for p, (name, img) in enumerate(images.items()):
        arr = np.asarray(img)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] < 3:
            raise ValueError(f"photo {name!r} must be uint8 [H, W, 3], not {arr.dtype} {arr.shape}.")
        for k in range(per_photo):
            rng = np.random.default_rng([seed, p, k])
            out[p * per_photo + k], what = derived_variant(arr, rng, size)
            notes.append(f"{name} #{k}: {what}")
    return out, notes


def describe_set(names: list[str], per_photo: int, seed: int) -> str:
    """The set in one line, e.g. ``"7 photos x 72 variants (seed 2)"``, for reports and cache keys."""
    return f"{len(names)} photos ({', '.join(names)}) x {per_photo} variants (seed {seed})"


def _softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def agreement(float_logits: np.ndarray, quant_logits: np.ndarray) -> dict[str, Any]:
    """How far the quantized logits ``[N, C]`` are from the float logits ``[N, C]`` of the same N inputs:

    * ``top1_agreement``: percent of inputs whose quantized top-1 class is the float model's top-1;
    * ``top5_agreement``: percent whose float top-1 class is among the quantized model's 5 best (ties: lower index);
    * ``mean_kl``: mean over inputs of KL(float softmax || quantized softmax), in nats (float64);
    * ``inputs``: N."""
    f = np.asarray(float_logits, np.float64)
    q = np.asarray(quant_logits, np.float64)
    f = f.reshape(f.shape[0], -1)
    q = q.reshape(q.shape[0], -1)
    if f.shape != q.shape or f.shape[0] == 0:
        raise ValueError(f"agreement needs float and quantized logits of one non-empty shape [N, C]; got "
                         f"{f.shape} and {q.shape}.")
    k = min(5, f.shape[1])
    ftop = f.argmax(axis=1)
    qtop5 = np.argsort(-q, axis=1, kind="stable")[:, :k]
    pf, pq = _softmax(f), _softmax(q)
    kl = np.sum(pf * (np.log(np.maximum(pf, 1e-300)) - np.log(np.maximum(pq, 1e-300))), axis=1)
    return {"top1_agreement": 100.0 * float((q.argmax(axis=1) == ftop).mean()),
            "top5_agreement": 100.0 * float((qtop5 == ftop[:, None]).any(axis=1).mean()),
            "mean_kl": float(kl.mean()), "inputs": int(f.shape[0])}
