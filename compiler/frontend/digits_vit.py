"""``vit_digits``: a tiny ViT the lab trains on real data it ships, scikit-learn's 8x8 handwritten digits.

The model is :func:`.zoo_transformers.vit`'s graph at a small shape: ``pixel_values [1, 1, 8, 8]`` (pixels / 16, in
[0, 1]) -> 2x2 patches (a stride-2 convolution: 16 tokens of width 32), the class token, a position embedding, two
pre-LN blocks with 2 heads and an MLP of 64 (Gelu), LayerNorm, the class token, ``logits [1, 10]``. It is trained
here in numpy (forward and backward written out; Adam on softmax cross-entropy, seeded) on a fixed 75/25 split of the
1,797 images (the split of ``scripts/train_digits.py``), well under a minute on one core (26 s measured on the
lab's 2-core machine under a load average of 16), then exported with the trained weights; :mod:`.zoo` caches the
ONNX file like every zoo model. :func:`test_set` gives the 450 held-out images and labels that ``vta run vit_digits``
measures float and int8 accuracy on; :func:`calibration_images` the training images it calibrates on. Needs
scikit-learn (which ships the data set).

Training uses a rational approximation of erf (Abramowitz and Stegun 7.1.26, error below 1.5e-7) for speed; the
exported graph computes Gelu exactly (Erf), so the trained network and the exported one differ by less than that.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from . import zoo_transformers

__all__ = ["SHAPE", "load_split", "train", "accuracy", "build", "test_set", "calibration_images"]

SHAPE: dict[str, Any] = {"image": 8, "patch": 2, "channels": 1, "width": 32, "depth": 2, "heads": 2, "mlp": 64,
                         "classes": 10}
"""The model's shape, as :func:`.zoo_transformers.vit`'s keyword arguments."""
EPOCHS = 30
SEED = 0


def load_split(seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): images ``[N, 1, 8, 8]`` float32 in [0, 1], labels int64; a seeded 75/25
    split of scikit-learn's digits (1,347 training and 450 test images). ImportError naming scikit-learn when it is
    not installed."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise ImportError("the zoo model vit_digits trains on scikit-learn's digits data set; install it with "
                          "`pip install scikit-learn`") from err
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(0.75 * len(y))
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def test_set() -> tuple[np.ndarray, np.ndarray]:
    """The held-out images ``[450, 1, 8, 8]`` and labels ``[450]``."""
    _, _, x, y = load_split()
    return x, y


def calibration_images(count: int = 200) -> np.ndarray:
    """The first ``count`` training images ``[count, 1, 8, 8]``: what the int8 model is calibrated on."""
    return load_split()[0][:count]


# ---- the network in numpy: forward with caches, backward ------------------------------------------------------------
def _erf(x: np.ndarray) -> np.ndarray:
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def _ln(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, tuple]:
    mu = x.mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    xhat = (x - mu) * inv
    return xhat * g + b, (xhat, inv, g)


def _ln_back(dy: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xhat, inv, g = cache
    axes = tuple(range(dy.ndim - 1))
    dxhat = dy * g
    dx = inv * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum(axes), dy.sum(axes)


def _patches(x: np.ndarray, patch: int) -> np.ndarray:
    """``[B, 1, S, S]`` -> ``[B, (S/p)^2, p*p]`` in the convolution's order (token = row-major patch, then pixel)."""
    b, _, s, _ = x.shape
    g = s // patch
    return x.reshape(b, g, patch, g, patch).transpose(0, 1, 3, 2, 4).reshape(b, g * g, patch * patch)


def _forward(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, list]:
    """Logits ``[B, 10]`` of images ``x [B, 1, 8, 8]`` and the caches of :func:`_backward`."""
    width, heads, patch = SHAPE["width"], SHAPE["heads"], SHAPE["patch"]
    dh = width // heads
    b = x.shape[0]
    pat = _patches(x, patch)
    emb = pat @ p["patch_embed.weight"].reshape(width, -1).T + p["patch_embed.bias"]
    h = np.concatenate([np.broadcast_to(p["cls_token.value"], (b, 1, width)), emb], axis=1) + p["pos_embed.value"]
    caches: list = [pat]
    t = h.shape[1]
    for i in range(SHAPE["depth"]):
        k = f"blocks.{i}"
        a_in, ln1 = _ln(h, p[f"{k}.ln1.weight"], p[f"{k}.ln1.bias"])
        qkv = a_in @ p[f"{k}.attn.qkv.weight"] + p[f"{k}.attn.qkv.bias"]
        q, kk, v = (qkv[..., j * width:(j + 1) * width].reshape(b, t, heads, dh).transpose(0, 2, 1, 3)
                    for j in range(3))
        s = q @ kk.transpose(0, 1, 3, 2) / np.sqrt(dh)
        e = np.exp(s - s.max(-1, keepdims=True))
        prob = e / e.sum(-1, keepdims=True)
        ctx = (prob @ v).transpose(0, 2, 1, 3).reshape(b, t, width)
        h = h + ctx @ p[f"{k}.attn.proj.weight"] + p[f"{k}.attn.proj.bias"]
        m_in, ln2 = _ln(h, p[f"{k}.ln2.weight"], p[f"{k}.ln2.bias"])
        f = m_in @ p[f"{k}.mlp.fc1.weight"] + p[f"{k}.mlp.fc1.bias"]
        cdf = 0.5 * (1.0 + _erf(f / np.sqrt(2.0)))
        g = f * cdf
        h = h + g @ p[f"{k}.mlp.fc2.weight"] + p[f"{k}.mlp.fc2.bias"]
        caches.append((a_in, ln1, q, kk, v, prob, ctx, m_in, ln2, f, cdf, g))
    out, ln = _ln(h, p["norm.weight"], p["norm.bias"])
    caches.append((out, ln))
    return out[:, 0] @ p["head.weight"].T + p["head.bias"], caches


def _backward(p: dict[str, np.ndarray], caches: list, dlogits: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of every parameter given d(loss)/d(logits)."""
    width, heads = SHAPE["width"], SHAPE["heads"]
    dh = width // heads
    grads: dict[str, np.ndarray] = {}
    out, ln = caches[-1]
    b, t, _ = out.shape
    grads["head.weight"] = dlogits.T @ out[:, 0]
    grads["head.bias"] = dlogits.sum(0)
    dout = np.zeros_like(out)
    dout[:, 0] = dlogits @ p["head.weight"]
    dh_, grads["norm.weight"], grads["norm.bias"] = _ln_back(dout, ln)
    for i in reversed(range(SHAPE["depth"])):
        k = f"blocks.{i}"
        a_in, ln1, q, kk, v, prob, ctx, m_in, ln2, f, cdf, g = caches[1 + i]
        grads[f"{k}.mlp.fc2.weight"] = g.reshape(-1, g.shape[-1]).T @ dh_.reshape(-1, width)
        grads[f"{k}.mlp.fc2.bias"] = dh_.sum((0, 1))
        dg = dh_ @ p[f"{k}.mlp.fc2.weight"].T
        df = dg * (cdf + f * np.exp(-0.5 * f * f) / np.sqrt(2.0 * np.pi))
        grads[f"{k}.mlp.fc1.weight"] = m_in.reshape(-1, width).T @ df.reshape(-1, df.shape[-1])
        grads[f"{k}.mlp.fc1.bias"] = df.sum((0, 1))
        dm, grads[f"{k}.ln2.weight"], grads[f"{k}.ln2.bias"] = _ln_back(df @ p[f"{k}.mlp.fc1.weight"].T, ln2)
        dh_ = dh_ + dm
        grads[f"{k}.attn.proj.weight"] = ctx.reshape(-1, width).T @ dh_.reshape(-1, width)
        grads[f"{k}.attn.proj.bias"] = dh_.sum((0, 1))
        dctx = (dh_ @ p[f"{k}.attn.proj.weight"].T).reshape(b, t, heads, dh).transpose(0, 2, 1, 3)
        dprob = dctx @ v.transpose(0, 1, 3, 2)
        dv = prob.transpose(0, 1, 3, 2) @ dctx
        ds = prob * (dprob - (dprob * prob).sum(-1, keepdims=True)) / np.sqrt(dh)
        dq = ds @ kk
        dk = ds.transpose(0, 1, 3, 2) @ q
        dqkv = np.concatenate([d.transpose(0, 2, 1, 3).reshape(b, t, width) for d in (dq, dk, dv)], axis=-1)
        grads[f"{k}.attn.qkv.weight"] = a_in.reshape(-1, width).T @ dqkv.reshape(-1, 3 * width)
        grads[f"{k}.attn.qkv.bias"] = dqkv.sum((0, 1))
        da, grads[f"{k}.ln1.weight"], grads[f"{k}.ln1.bias"] = _ln_back(dqkv @ p[f"{k}.attn.qkv.weight"].T, ln1)
        dh_ = dh_ + da
    grads["pos_embed.value"] = dh_.sum(0, keepdims=True)
    grads["cls_token.value"] = dh_[:, :1].sum(0, keepdims=True)
    demb = dh_[:, 1:]
    pat = caches[0]
    grads["patch_embed.weight"] = (demb.reshape(-1, width).T @ pat.reshape(-1, pat.shape[-1])).reshape(
        p["patch_embed.weight"].shape)
    grads["patch_embed.bias"] = demb.sum((0, 1))
    return grads


def _initial() -> dict[str, np.ndarray]:
    """The seeded initial weights: those of the untrained graph, by initializer name."""
    model = zoo_transformers.vit(name="vit_digits", seed=SEED, **SHAPE)
    shapes = {"patch_embed.weight", "patch_embed.bias", "cls_token.value", "pos_embed.value", "norm.weight",
              "norm.bias", "head.weight", "head.bias"}
    return {i.name: onnx.numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer
            if i.name in shapes or i.name.startswith("blocks.") and i.name.endswith((".weight", ".bias"))}


def train(epochs: int = EPOCHS, lr: float = 2e-3, batch: int = 32) -> dict[str, np.ndarray]:
    """Adam on softmax cross-entropy over the training split, seeded; returns the weights by initializer name. BLAS
    runs on one thread: these products are small, and more threads only contend (on a loaded machine, tenfold)."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1, user_api="blas"):
        return _train(epochs, lr, batch)


def _train(epochs: int, lr: float, batch: int) -> dict[str, np.ndarray]:
    x, y, _, _ = load_split()
    x = x.astype(np.float64)
    p = _initial()
    p["cls_token.value"] *= 0.04        # the builder's embeddings suit random inputs; start these small
    p["pos_embed.value"] *= 0.04
    rng = np.random.default_rng(SEED)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    s = {k: np.zeros_like(v) for k, v in p.items()}
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for i in range(0, len(y), batch):
            idx = order[i:i + batch]
            logits, caches = _forward(p, x[idx])
            e = np.exp(logits - logits.max(1, keepdims=True))
            prob = e / e.sum(1, keepdims=True)
            prob[np.arange(len(idx)), y[idx]] -= 1.0
            grads = _backward(p, caches, prob / len(idx))
            step += 1
            for k, delta in adam_deltas(grads, m, s, step, lr).items():
                p[k] -= delta
    return {k: v.astype(np.float32) for k, v in p.items()}


def adam_deltas(grads: dict[str, np.ndarray], m: dict[str, np.ndarray], v: dict[str, np.ndarray], step: int,
                lr: float) -> dict[str, np.ndarray]:
    """One Adam step (beta1 0.9, beta2 0.999, epsilon 1e-8): updates the moment estimates ``m`` and ``v`` in place
    from ``grads`` and returns, per parameter, what to subtract from it at step ``step`` (1 for the first)."""
    deltas = {}
    for k, g in grads.items():
        m[k] = 0.9 * m[k] + 0.1 * g
        v[k] = 0.999 * v[k] + 0.001 * g ** 2
        deltas[k] = lr * (m[k] / (1 - 0.9**step)) / (np.sqrt(v[k] / (1 - 0.999**step)) + 1e-8)
    return deltas


def accuracy(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """Top-1 accuracy (0..1) of weights ``p`` in the numpy network on images ``x``, labels ``y``."""
    logits, _ = _forward({k: v.astype(np.float64) for k, v in p.items()}, x.astype(np.float64))
    return float((logits.argmax(1) == y).mean())


def build() -> onnx.ModelProto:
    """Train the network and export it: :func:`.zoo_transformers.vit`'s graph with the trained weights."""
    return zoo_transformers.vit(name="vit_digits", seed=SEED, weights=train(), **SHAPE)
