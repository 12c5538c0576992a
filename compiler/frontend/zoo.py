"""A model zoo built here, with no download: ResNet-18/34/50 (torchvision's layer structure) and small CNNs.

Every model is an ONNX file (opset 17, float32, static shapes but for a dynamic batch dimension ``N``, which
:func:`~.onnx_frontend.import_onnx` fixes) written once to ``$VTA_CACHE_DIR/models`` (default
``~/.cache/vta-lab/models``) as ``<name>.v<ZOO_VERSION>.onnx`` and reused. Weights are deterministic: He-normal
convolutions from a seeded generator; every BatchNorm gets non-trivial statistics measured on a seeded random input
as the network is built (perturbed, with random gamma/beta), so activations keep a sane range through 50 layers. The
last BatchNorm of each residual branch has a small gamma, as in trained ResNets.

Models (:func:`list_models`): ``resnet18``, ``resnet34``, ``resnet50`` (``[N, 3, 224, 224]`` -> ``[N, 1000]``),
``tiny_cnn`` (``[N, 1, 8, 8]`` -> ``[N, 10]``), ``mini_resnet`` (``[N, 3, 32, 32]`` -> ``[N, 10]`` softmax; a residual
add, a depthwise conv with ReLU6, Pad, Concat, Mul, Max/Average pooling), ``vit_digits`` (a tiny ViT trained at
first use on scikit-learn's digits, :mod:`.digits_vit`; :func:`test_accuracy` measures it), and the pretrained
``efficientnet_lite0`` (``[1, 3, 224, 224]`` -> ``[1, 1000]`` ImageNet logits, batch fixed at 1; needs the
``efficientnet`` extra), exported once by :mod:`.efficientnet` (which also provides the photos and class names) as
``efficientnet_lite0.onnx`` in the same folder. Transformers: ``bert_tiny`` (built here) and the full-size ones of
:mod:`.zoo_transformers` (``vit_tiny``, ``bert_base``, ``gpt2_prefill``, ``gpt2_decode``). A cached model whose
SHA-256 differs from the one recorded next to it (``<name>.v<ZOO_VERSION>.onnx.sha256``) is built again with a
warning. :func:`calibration_data` gives real
calibration inputs.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vta.cache import cache_root, file_sha256
from vta.fileio import atomic_write_text

from . import digits_vit, float_ref, zoo_transformers

__all__ = ["cache_dir", "list_models", "get_model", "build_model", "OnnxBuilder", "calibration_data",
           "test_accuracy", "default_policy", "ZOO_POLICIES"]

OPSET = 17
ZOO_VERSION = 3          # part of every cached file name: bump it whenever a model's construction changes


def cache_dir() -> Path:
    """The folder holding zoo ONNX files: ``$VTA_CACHE_DIR/models`` or ``~/.cache/vta-lab/models``."""
    return cache_root("models")


class OnnxBuilder:
    """Builds an ONNX graph layer by layer while running it in numpy on a sample input (to set BatchNorm stats).

    Every method takes and returns ``(name, value)`` pairs: the ONNX tensor name and its float32 numpy value for the
    sample input ``[N, C, H, W]``.
    """

    def __init__(self, name: str, sample: np.ndarray, seed: int) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0
        self.input = ("input", sample.astype(np.float32))

    def _fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def _init(self, base: str, value: np.ndarray) -> str:
        name = self._fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def _node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        out = self._fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def conv(self, x: tuple[str, np.ndarray], cout: int, k: int, stride: int = 1, pad: int | None = None,
             groups: int = 1, bias: bool = False) -> tuple[str, np.ndarray]:
        """He-normal k x k convolution (padding ``k // 2`` unless given)."""
        cin = x[1].shape[1]
        pad = k // 2 if pad is None else pad
        fan_in = cin // groups * k * k
        w = (self.rng.standard_normal((cout, cin // groups, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        inputs = [x[0], self._init("w", w)]
        b = None
        if bias:
            b = (self.rng.standard_normal(cout) * 0.1).astype(np.float32)
            inputs.append(self._init("b", b))
        out = self._node("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=groups)
        return out, float_ref.conv2d(x[1], w, b, (stride, stride), (pad,) * 4, groups)

    def bn(self, x: tuple[str, np.ndarray], gamma_range: tuple[float, float] = (0.6, 1.4)) -> tuple[str, np.ndarray]:
        """BatchNorm whose running stats are the sample's per-channel stats, perturbed (inference mode)."""
        c = x[1].shape[1]
        mean = np.asarray(x[1].mean(axis=(0, 2, 3)) + self.rng.normal(0, 0.05, c) * x[1].std(axis=(0, 2, 3)))
        var = np.asarray(x[1].var(axis=(0, 2, 3)) * self.rng.uniform(0.8, 1.25, c) + 1e-3)
        gamma = np.asarray(self.rng.uniform(gamma_range[0], gamma_range[1], size=c))
        beta = np.asarray(self.rng.normal(0, 0.1, size=c))
        params = [self._init(tag, v.astype(np.float32)) for tag, v in
                  (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))]
        out = self._node("BatchNormalization", [x[0]] + params, epsilon=1e-5)
        value = (x[1] - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5)
        return out, (value * gamma[None, :, None, None] + beta[None, :, None, None]).astype(np.float32)

    def relu(self, x: tuple[str, np.ndarray]) -> tuple[str, np.ndarray]:
        return self._node("Relu", [x[0]]), np.maximum(x[1], 0)

    def relu6(self, x: tuple[str, np.ndarray]) -> tuple[str, np.ndarray]:
        lo, hi = self._init("min", np.array(0.0, np.float32)), self._init("max", np.array(6.0, np.float32))
        return self._node("Clip", [x[0], lo, hi]), np.clip(x[1], 0, 6)

    def add(self, a: tuple[str, np.ndarray], b: tuple[str, np.ndarray]) -> tuple[str, np.ndarray]:
        return self._node("Add", [a[0], b[0]]), a[1] + b[1]

    def mul_const(self, x: tuple[str, np.ndarray], c: np.ndarray) -> tuple[str, np.ndarray]:
        return self._node("Mul", [x[0], self._init("c", c.astype(np.float32))]), (x[1] * c).astype(np.float32)

    def maxpool(self, x: tuple[str, np.ndarray], k: int, stride: int, pad: int) -> tuple[str, np.ndarray]:
        out = self._node("MaxPool", [x[0]], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        return out, float_ref.maxpool(x[1], (k, k), (stride, stride), (pad,) * 4)

    def avgpool(self, x: tuple[str, np.ndarray], k: int, stride: int, pad: int) -> tuple[str, np.ndarray]:
        out = self._node("AveragePool", [x[0]], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
        return out, float_ref.avgpool(x[1], (k, k), (stride, stride), (pad,) * 4, False)

    def pad(self, x: tuple[str, np.ndarray], pads: list[int]) -> tuple[str, np.ndarray]:
        out = self._node("Pad", [x[0], self._init("pads", np.array(pads, np.int64))], mode="constant")
        rank = x[1].ndim
        return out, np.pad(x[1], [(pads[i], pads[i + rank]) for i in range(rank)])

    def concat(self, xs: list[tuple[str, np.ndarray]]) -> tuple[str, np.ndarray]:
        return self._node("Concat", [x[0] for x in xs], axis=1), np.concatenate([x[1] for x in xs], axis=1)

    def head(self, x: tuple[str, np.ndarray], classes: int, softmax: bool = False) -> tuple[str, np.ndarray]:
        """GlobalAveragePool, Flatten, Gemm (and Softmax)."""
        pooled = (self._node("GlobalAveragePool", [x[0]]), x[1].mean(axis=(2, 3), keepdims=True))
        flat = (self._node("Flatten", [pooled[0]], axis=1), pooled[1].reshape(pooled[1].shape[0], -1))
        return self.dense(flat, classes, softmax)

    def dense(self, x: tuple[str, np.ndarray], classes: int, softmax: bool = False) -> tuple[str, np.ndarray]:
        """Gemm with transB=1 (weights ``[O, K]``), optionally followed by Softmax."""
        k = x[1].shape[1]
        w = (self.rng.standard_normal((classes, k)) * np.sqrt(1.0 / k)).astype(np.float32)
        b = (self.rng.standard_normal(classes) * 0.05).astype(np.float32)
        out = (self._node("Gemm", [x[0], self._init("fc_w", w), self._init("fc_b", b)], transB=1),
               float_ref.dense(x[1], w, b))
        if softmax:
            z = np.exp(out[1] - out[1].max(axis=1, keepdims=True))
            out = (self._node("Softmax", [out[0]], axis=1), z / z.sum(axis=1, keepdims=True))
        return out

    def finish(self, out: tuple[str, np.ndarray]) -> onnx.ModelProto:
        """The ONNX model with input ``input`` and output ``output``; the batch dimension ``N`` is dynamic (the
        frontend fixes it, 1 by default)."""
        shape: list[int | str] = ["N"] + list(self.input[1].shape[1:])
        self.nodes.append(helper.make_node("Identity", [out[0]], ["output"], name="output"))
        out_shape: list[int | str] = ["N"] + list(out[1].shape[1:])
        graph = helper.make_graph(
            self.nodes, self.name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, out_shape)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="vta-lab")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _conv_bn(b: OnnxBuilder, x: tuple[str, np.ndarray], cout: int, k: int, stride: int = 1, relu: bool = True,
             gamma: tuple[float, float] = (0.6, 1.4)) -> tuple[str, np.ndarray]:
    y = b.bn(b.conv(x, cout, k, stride), gamma)
    return b.relu(y) if relu else y


def _basic_block(b: OnnxBuilder, x: tuple[str, np.ndarray], width: int, stride: int) -> tuple[str, np.ndarray]:
    y = _conv_bn(b, x, width, 3, stride)
    y = _conv_bn(b, y, width, 3, 1, relu=False, gamma=(0.2, 0.5))
    short = _conv_bn(b, x, width, 1, stride, relu=False) if stride != 1 or x[1].shape[1] != width else x
    return b.relu(b.add(y, short))


def _bottleneck(b: OnnxBuilder, x: tuple[str, np.ndarray], width: int, stride: int) -> tuple[str, np.ndarray]:
    y = _conv_bn(b, x, width, 1)
    y = _conv_bn(b, y, width, 3, stride)                  # torchvision v1.5: the stride sits on the 3x3 conv
    y = _conv_bn(b, y, width * 4, 1, relu=False, gamma=(0.2, 0.5))
    need = stride != 1 or x[1].shape[1] != width * 4
    short = _conv_bn(b, x, width * 4, 1, stride, relu=False) if need else x
    return b.relu(b.add(y, short))


def _resnet(name: str, blocks: list[int], bottleneck: bool) -> onnx.ModelProto:
    rng = np.random.default_rng(2024)
    b = OnnxBuilder(name, rng.standard_normal((2, 3, 224, 224)).astype(np.float32),
                    seed=sum(blocks) * 7 + int(bottleneck))
    x = b.maxpool(_conv_bn(b, b.input, 64, 7, 2), 3, 2, 1)
    block = _bottleneck if bottleneck else _basic_block
    for stage, count in enumerate(blocks):
        for i in range(count):
            x = block(b, x, 64 << stage, 2 if i == 0 and stage > 0 else 1)
    return b.finish(b.head(x, 1000))


def _tiny_cnn() -> onnx.ModelProto:
    b = OnnxBuilder("tiny_cnn", np.random.default_rng(1).uniform(0, 1, (8, 1, 8, 8)), seed=11)
    x = b.relu(b.conv(b.input, 8, 3, bias=True))
    x = b.relu(b.conv(x, 16, 3, stride=2, bias=True))
    flat = (b._node("Flatten", [x[0]], axis=1), x[1].reshape(x[1].shape[0], -1))
    return b.finish(b.dense(flat, 10))


def _mini_resnet() -> onnx.ModelProto:
    b = OnnxBuilder("mini_resnet", np.random.default_rng(2).standard_normal((4, 3, 32, 32)), seed=12)
    x = _conv_bn(b, b.input, 16, 3)
    y = _conv_bn(b, _conv_bn(b, x, 16, 3), 16, 3, relu=False, gamma=(0.3, 0.6))
    x = b.relu(b.add(x, y))                                                      # residual add
    x = b.relu6(b.bn(b.conv(x, 16, 3, stride=2, groups=16)))                     # depthwise + ReLU6
    x = _conv_bn(b, x, 24, 1)                                                    # pointwise
    left = b.maxpool(x, 2, 2, 0)
    right = b.avgpool(b.pad(x, [0, 0, 1, 1, 0, 0, 0, 0]), 3, 2, 0)              # explicit Pad, then pool
    x = b.concat([left, b.relu(b.conv(right, 8, 1, bias=True))])
    x = b.mul_const(x, np.linspace(0.5, 1.5, 32, dtype=np.float32).reshape(1, 32, 1, 1))
    return b.finish(b.head(x, 10, softmax=True))


class _Transformer:
    """Builds ``bert_tiny`` node by node with onnx.helper (names only: no BatchNorm statistics to measure)."""

    def __init__(self, seed: int, tokens: int, width: int, heads: int) -> None:
        self.b = OnnxBuilder("bert_tiny", np.zeros((1, tokens, width)), seed)
        self.tokens, self.width, self.heads = tokens, width, heads

    def const(self, base: str, value: np.ndarray) -> str:
        return self.b._init(base, value)

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        return self.b._node(op, inputs, **attrs)

    def linear(self, x: str, cin: int, cout: int) -> str:
        """MatMul by a ``[cin, cout]`` weight and Add of a bias, as exporters write a linear layer over tokens."""
        rng = self.b.rng
        w = (rng.standard_normal((cin, cout)) * np.sqrt(1.0 / cin)).astype(np.float32)
        bias = (rng.standard_normal(cout) * 0.02).astype(np.float32)
        return self.node("Add", [self.node("MatMul", [x, self.const("w", w)]), self.const("b", bias)])

    def layer_norm(self, x: str, decomposed: bool) -> str:
        """LayerNormalization (opset 17), or the ReduceMean/Sub/Pow/Sqrt/Div form older exporters emit."""
        rng = self.b.rng
        gamma = self.const("gamma", rng.uniform(0.8, 1.2, self.width).astype(np.float32))
        beta = self.const("beta", (rng.standard_normal(self.width) * 0.05).astype(np.float32))
        if not decomposed:
            return self.node("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)
        mean = self.node("ReduceMean", [x], axes=[-1])
        d = self.node("Sub", [x, mean])
        var = self.node("ReduceMean", [self.node("Pow", [d, self.const("two", np.array(2.0, np.float32))])], axes=[-1])
        std = self.node("Sqrt", [self.node("Add", [var, self.const("eps", np.array(1e-5, np.float32))])])
        return self.node("Add", [self.node("Mul", [self.node("Div", [d, std]), gamma]), beta])

    def gelu(self, x: str, tanh: bool) -> str:
        """Gelu as opset 17 exporters write it: the erf form, or the tanh approximation."""
        def c(v: float) -> str:
            return self.const("c", np.array(v, np.float32))
        if tanh:
            cube = self.node("Mul", [self.node("Pow", [x, c(3.0)]), c(0.044715)])
            inner = self.node("Mul", [self.node("Add", [x, cube]), c(float(np.sqrt(2.0 / np.pi)))])
            return self.node("Mul", [self.node("Mul", [x, c(0.5)]), self.node("Add", [self.node("Tanh", [inner]),
                                                                                      c(1.0)])])
        erf = self.node("Erf", [self.node("Div", [x, c(float(np.sqrt(2.0)))])])
        return self.node("Mul", [self.node("Mul", [x, self.node("Add", [erf, c(1.0)])]), c(0.5)])

    def attention(self, x: str, causal: bool) -> str:
        """Multi-head self-attention: one QKV MatMul, Split, heads by Reshape/Transpose, softmax of the scaled
        scores with an additive padding mask (or a causal Where mask), P.V, heads merged, output projection."""
        t, d, h = self.tokens, self.width, self.heads
        dh = d // h
        q, k, v = self.b._fresh("q"), self.b._fresh("k"), self.b._fresh("v")
        self.b.nodes.append(helper.make_node("Split", [self.linear(x, d, 3 * d), self.const("split", np.array(
            [d, d, d], np.int64))], [q, k, v], name=self.b._fresh("split"), axis=-1))
        heads = self.const("heads", np.array([0, t, h, dh], np.int64))
        q, k, v = (self.node("Reshape", [y, heads]) for y in (q, k, v))
        q = self.node("Transpose", [q], perm=[0, 2, 1, 3])
        k = self.node("Transpose", [k], perm=[0, 2, 3, 1])
        v = self.node("Transpose", [v], perm=[0, 2, 1, 3])
        scores = self.node("Div", [self.node("MatMul", [q, k]), self.const("sqrt_dh", np.array(np.sqrt(dh),
                                                                                                np.float32))])
        if causal:
            keep = np.tril(np.ones((t, t), bool)).reshape(1, 1, t, t)
            scores = self.node("Where", [self.const("causal", keep), scores,
                                         self.const("neg_inf", np.array(-np.inf, np.float32))])
        else:
            mask = np.zeros((1, 1, 1, t), np.float32)
            mask[..., t - t // 8:] = -10000.0                        # the last eighth of the tokens is padding
            scores = self.node("Add", [scores, self.const("mask", mask)])
        context = self.node("MatMul", [self.node("Softmax", [scores], axis=-1), v])
        merged = self.node("Reshape", [self.node("Transpose", [context], perm=[0, 2, 1, 3]),
                                       self.const("merge", np.array([0, t, d], np.int64))])
        return self.linear(merged, d, d)

    def block(self, x: str, index: int) -> str:
        """A post-LN encoder block; block 1 uses the decomposed LayerNorm, tanh Gelu and a causal mask, so the zoo
        model exercises every import path."""
        other = index % 2 == 1
        x = self.layer_norm(self.node("Add", [x, self.attention(x, causal=other)]), decomposed=other)
        hidden = self.gelu(self.linear(x, self.width, 4 * self.width), tanh=other)
        return self.layer_norm(self.node("Add", [x, self.linear(hidden, 4 * self.width, self.width)]),
                               decomposed=other)


def _bert_tiny() -> onnx.ModelProto:
    """A BERT-style encoder: ``[N, 32, 64]`` token embeddings -> ``[N, 10]`` logits (see the module docstring)."""
    tokens, width, layers, classes = 32, 64, 2, 10
    tb = _Transformer(seed=27, tokens=tokens, width=width, heads=4)
    table = (tb.b.rng.standard_normal((64, width)) * 0.5).astype(np.float32)
    positions = tb.node("Gather", [tb.const("pos_table", table), tb.const("pos_ids", np.arange(tokens))], axis=0)
    x = tb.layer_norm(tb.node("Add", ["input", positions]), decomposed=False)
    for index in range(layers):
        x = tb.block(x, index)
    cls = tb.node("Gather", [x, tb.const("cls", np.array(0, np.int64))], axis=1)   # the first token: [N, width]
    w1 = (tb.b.rng.standard_normal((width, width)) * np.sqrt(1.0 / width)).astype(np.float32)
    pooled = tb.node("Tanh", [tb.node("Gemm", [cls, tb.const("pool_w", w1), tb.const("pool_b", np.zeros(
        width, np.float32))])])
    w2 = (tb.b.rng.standard_normal((classes, width)) * np.sqrt(1.0 / width)).astype(np.float32)
    logits = tb.node("Gemm", [pooled, tb.const("fc_w", w2), tb.const("fc_b", np.zeros(classes, np.float32))],
                     transB=1)
    return tb.b.finish((logits, np.zeros((1, classes), np.float32)))


def _efficientnet_lite0() -> onnx.ModelProto:
    """The pretrained EfficientNet-Lite0, exported by :func:`.efficientnet.export_onnx` (needs the ``efficientnet``
    extra)."""
    from . import efficientnet
    return onnx.load(efficientnet.export_onnx(cache_dir()))


_BUILDERS: dict[str, Callable[[], onnx.ModelProto]] = {
    "resnet18": lambda: _resnet("resnet18", [2, 2, 2, 2], False),
    "resnet34": lambda: _resnet("resnet34", [3, 4, 6, 3], False),
    "resnet50": lambda: _resnet("resnet50", [3, 4, 6, 3], True),
    "tiny_cnn": _tiny_cnn,
    "mini_resnet": _mini_resnet,
    "efficientnet_lite0": _efficientnet_lite0,
    "bert_tiny": _bert_tiny,
    **zoo_transformers.MODELS,
    "vit_digits": digits_vit.build,
}

def calibration_data(name: str) -> np.ndarray | None:
    """Real calibration inputs for a zoo model, stacked ``[count, C, H, W]``, or None when the model has none (random
    weights: seeded random inputs are as good as any). ``efficientnet_lite0`` gets the seven sample photos of
    :mod:`.efficientnet`, preprocessed."""
    if name == "efficientnet_lite0":
        from . import efficientnet
        return efficientnet.preprocess_all(efficientnet.sample_images())
    if name == "vit_digits":
        return digits_vit.calibration_images()
    if name not in _BUILDERS:
        raise ValueError(f"Unknown zoo model {name!r}; known models are {', '.join(list_models())}.")
    return None


def test_accuracy(name: str, qgraph: Any) -> dict[str, Any] | None:
    """Top-1 accuracy in percent on zoo model ``name``'s labelled test set, when it has one (``vit_digits``: the 450
    held-out digits), of the float model (ONNX Runtime on the zoo file when installed, else the float reference)
    and of the quantized graph ``qgraph`` in the integer reference (:func:`..qops.run_reference`, which every
    backend matches bit for bit); None for a model without a test set. Keys: ``float``, ``int8``, ``agreement``
    (percent of images where both predict the same class), ``images``, ``float_reference``, ``source``."""
    if name != "vit_digits":
        return None
    from .. import qops
    from .onnx_frontend import import_onnx
    x, y = digits_vit.test_set()
    path = get_model(name)
    inp, out = qgraph.inputs[0], qgraph.outputs[0]
    try:
        import onnxruntime as ort
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        float_pred = np.array([session.run(None, {inp: x[i:i + 1]})[0].argmax() for i in range(len(y))])
        which = "onnxruntime"
    except ImportError:
        fg = import_onnx(path)
        float_pred = np.array([float_ref.run_float(fg, {inp: x[i:i + 1]})[out].argmax() for i in range(len(y))])
        which = "the lab's float reference"
    int8_pred = np.array([qops.run_reference(qgraph, {inp: x[i:i + 1]})[out].argmax() for i in range(len(y))])
    return {"float": 100.0 * float((float_pred == y).mean()), "int8": 100.0 * float((int8_pred == y).mean()),
            "agreement": 100.0 * float((float_pred == int8_pred).mean()), "images": len(y),
            "float_reference": which, "source": "the held-out 25% of scikit-learn's digits"}


ZOO_POLICIES: dict[str, tuple[str, str]] = {
    "gpt2_decode": ("accel", "the model exists to measure the accelerator's decode step, and for one token row the "
                             "auto estimates put every block's linear layers on the CPU (slower on the accelerator "
                             "at 8 bus bytes per cycle)"),
}
"""Zoo models whose ``vta run`` / ``vta compile`` partitioning policy is not ``auto`` when ``--policy`` is not given:
name -> (policy, why)."""


def default_policy(model: str) -> tuple[str, str] | None:
    """The (policy, reason) ``vta run MODEL`` uses for zoo model ``model`` without ``--policy``; None: ``auto``
    (any other model, or a file path)."""
    return ZOO_POLICIES.get(model)


def list_models() -> list[str]:
    """Names accepted by :func:`get_model`."""
    return sorted(_BUILDERS)


def build_model(name: str) -> onnx.ModelProto:
    """Build zoo model ``name`` in memory (deterministic; no cache)."""
    if name not in _BUILDERS:
        raise ValueError(f"Unknown zoo model {name!r}; known models are {', '.join(list_models())}.")
    return _BUILDERS[name]()


def get_model(name: str) -> Path:
    """Path of zoo model ``name``'s ONNX file, building and caching it on first use (atomic write)."""
    if name not in _BUILDERS:
        raise ValueError(f"Unknown zoo model {name!r}; known models are {', '.join(list_models())}.")
    if name == "efficientnet_lite0":
        from . import efficientnet
        return efficientnet.export_onnx(cache_dir())
    path = cache_dir() / f"{name}.v{ZOO_VERSION}.onnx"
    problem = _damage(path)
    if problem is not None:
        if path.exists():
            logging.getLogger("vta").warning("the cached zoo model %s is damaged (%s); building it again", path,
                                             problem)
        path.parent.mkdir(parents=True, exist_ok=True)
        model = build_model(name)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
        os.close(fd)
        onnx.save(model, tmp)
        digest = file_sha256(Path(tmp))
        os.replace(tmp, path)
        atomic_write_text(_digest_path(path), digest + "\n")  # written last: a kill before it means a rebuild
    return path


def _digest_path(path: Path) -> Path:
    """The file recording the SHA-256 of a cached zoo model (``<name>.v<N>.onnx.sha256``)."""
    return path.with_name(path.name + ".sha256")


def _damage(path: Path) -> str | None:
    """None when the cached model ``path`` exists and has the SHA-256 recorded when it was written; otherwise what
    is wrong (missing, no record, changed), so :func:`get_model` builds it again."""
    if not path.exists():
        return "missing"
    try:
        recorded = _digest_path(path).read_text().strip()
    except OSError:
        return "no recorded SHA-256"
    if file_sha256(path) != recorded:
        return "its SHA-256 differs from the one recorded when it was written"
    return None
