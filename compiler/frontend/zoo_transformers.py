"""The zoo's transformers, built here as ONNX (opset 17) with seeded weights: ViT, a BERT encoder, GPT-2 prefill and
decode.

Each builder takes the model's shape as keyword arguments, so the tests build small variants of the very same graph;
:data:`MODELS` gives the full-size ones the zoo (:mod:`.zoo`) serves by name:

* ``vit_tiny`` -- DeiT-Tiny's shape: ``pixel_values [1, 3, 224, 224]`` -> a 16x16 stride-16 patch convolution, the
  class token by Concat, a learned position embedding (Add), 12 pre-LN blocks of width 192 with 3 heads and an MLP of
  768 (Gelu), a final LayerNorm, the class token (Gather) and a 1000-way classifier: ``logits [1, 1000]``. The batch
  is fixed at 1: the class token is a constant ``[1, 1, 192]`` joined by Concat (an exporter broadcasts it to the
  batch with Expand, which the lab does not import).
* ``bert_base`` -- BERT-base's shape at sequence 128: ``input_ids [N, 128]`` (int64 token ids) -> the word embedding
  (Gather from a ``[30522, 768]`` table), the position embedding plus the token-type-0 embedding (one Add of a
  constant: every token is of type 0), LayerNorm, 12 post-LN blocks of width 768 with 12 heads and an MLP of 3072,
  the pooler (the first token, a 768x768 Gemm, Tanh) and a 2-way classifier: ``logits [N, 2]``. No padding mask:
  every token is real.
* ``gpt2_prefill`` -- GPT-2 small's shape over a prompt of 128 tokens: ``input_ids [N, 128]`` -> the token embedding
  (Gather from ``wte [50257, 768]``) plus the position embedding (``wpe [1024, 768]``), 12 pre-LN blocks of width 768
  with 12 heads, a causal mask (Where) and an MLP of 3072, ``ln_f`` and the LM head (MatMul by ``wte``'s transpose,
  GPT-2's tied weights) on the last token only: ``logits [N, 50257]`` (what generation needs; a training graph would
  compute all 128 rows), and ``present.{i}.key`` / ``present.{i}.value [N, 12, 128, 64]`` of every block (the KV
  cache).
* ``gpt2_decode`` -- one decoding step after those 128 tokens: ``input_ids [N, 1]`` and ``past.{i}.key`` /
  ``past.{i}.value [N, 12, 128, 64]`` -> ``logits [N, 50257]`` and ``present.{i}.key`` / ``present.{i}.value
  [N, 12, 129, 64]``, each the Concat of the past and the new token's keys or values (axis 2). Same weights as
  ``gpt2_prefill`` (the same seed; no weight depends on the sequence length).

Node names say block and role, as PyTorch's module paths do: ``blocks.3.attn.qkv`` (the QKV projection),
``blocks.3.attn.qk`` (Q.K^T), ``blocks.3.attn.softmax``, ``blocks.3.attn.pv`` (P.V), ``blocks.3.attn.proj``,
``blocks.3.mlp.fc1``, ``blocks.3.mlp.gelu``, ``blocks.3.mlp.fc2``, ``blocks.3.ln1``; the frontend keeps them for the
compiled layers, so the run report's rows carry them. Linear layers are MatMul by a ``[in, out]`` weight plus an Add
of the bias (``<name>.add_bias``), as exporters write them; Gelu is the Erf form opset-17 exporters emit.

Weights: normal with standard deviation ``1/sqrt(fan_in)`` for linear layers (so activations keep their range through
the blocks), LayerNorm gamma in [0.8, 1.2] and small betas, biases 0.02, embeddings 0.1 (positions 0.02).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["vit", "bert", "gpt2", "MODELS", "OPSET"]

OPSET = 17


class _Net:
    """An ONNX graph built node by node: every node is named, and names its (first) output after itself."""

    def __init__(self, name: str, seed: int, weights: dict[str, np.ndarray] | None = None) -> None:
        self.name = name
        self.weights = dict(weights or {})
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.shared: dict[str, str] = {}

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer called ``name``: ``value``, or the given weight of that name (trained; same shape)."""
        given = self.weights.pop(name, None)
        if given is not None:
            if given.shape != np.shape(value):
                raise ValueError(f"weight {name!r} has shape {given.shape}; the graph needs {np.shape(value)}.")
            value = np.asarray(given, np.float32)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def shared_const(self, name: str, value: np.ndarray) -> str:
        """An initializer many nodes read (a shape, a scalar): written once under ``name``."""
        if name not in self.shared:
            self.shared[name] = self.const(name, value)
        return self.shared[name]

    def node(self, op: str, inputs: list[str], name: str, outputs: list[str] | None = None, **attrs: Any) -> str:
        """Append node ``name``; its output is called ``name`` unless ``outputs`` are given. Returns the first."""
        outs = outputs or [name]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0]

    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    def linear(self, x: str, cin: int, cout: int, name: str) -> str:
        """``x [..., cin] @ W [cin, cout] + b`` as MatMul (node ``name``) and Add (``name.add_bias``)."""
        w = self.const(f"{name}.weight", self.normal((cin, cout), 1.0 / np.sqrt(cin)))
        b = self.const(f"{name}.bias", self.normal((cout,), 0.02))
        return self.node("Add", [self.node("MatMul", [x, w], name), b], f"{name}.add_bias")

    def layer_norm(self, x: str, width: int, name: str) -> str:
        gamma = self.const(f"{name}.weight", self.rng.uniform(0.8, 1.2, width).astype(np.float32))
        beta = self.const(f"{name}.bias", self.normal((width,), 0.05))
        return self.node("LayerNormalization", [x, gamma, beta], name, axis=-1, epsilon=1e-5)

    def gelu(self, x: str, name: str) -> str:
        """Gelu as opset-17 exporters write it, ``x * (erf(x / sqrt 2) + 1) * 0.5``; the frontend fuses it into one
        Gelu node named ``name``."""
        sqrt2 = self.shared_const("gelu.sqrt2", np.array(np.sqrt(2.0), np.float32))
        one = self.shared_const("gelu.one", np.array(1.0, np.float32))
        half = self.shared_const("gelu.half", np.array(0.5, np.float32))
        erf = self.node("Erf", [self.node("Div", [x, sqrt2], f"{name}.div")], f"{name}.erf")
        inner = self.node("Mul", [x, self.node("Add", [erf, one], f"{name}.add")], f"{name}.mul")
        return self.node("Mul", [inner, half], name)

    def add_input(self, name: str, elem: int, shape: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def add_output(self, name: str, shape: list[int | str]) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))

    def finish(self) -> onnx.ModelProto:
        if self.weights:
            raise ValueError(f"weights {', '.join(sorted(self.weights))} are not initializers of {self.name}.")
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="vta-lab")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _attention(net: _Net, x: str, p: str, *, tokens: int, width: int, heads: int, causal: bool, past: int = 0,
               cache: tuple[str, str] | None = None) -> tuple[str, str, str]:
    """Multi-head self-attention of ``x [N, tokens, width]`` (block prefix ``p``, e.g. ``blocks.3.attn``): the QKV
    projection, Split, heads by Reshape/Transpose to ``[N, heads, tokens, width/heads]``; with a ``cache`` (the
    past keys and values, ``[N, heads, past, width/heads]`` each), the keys and values are the Concat of the past and
    the new ones on axis 2 (nodes ``p.cache_k``, ``p.cache_v``, writing ``cache`` outputs named by the caller's
    ``present`` names through ``p``); Q.K^T (``p.qk``) divided by sqrt(width/heads), a causal mask (Where; token ``i``
    sees positions ``<= past + i``), Softmax, P.V (``p.pv``), heads merged, the output projection (``p.proj``).
    Returns (output ``[N, tokens, width]``, keys ``[N, heads, past + tokens, dh]``, values likewise)."""
    dh = width // heads
    q, k, v = f"{p}.q", f"{p}.k", f"{p}.v"
    split = net.shared_const(f"attn.split.{width}", np.array([width] * 3, np.int64))
    net.node("Split", [net.linear(x, width, 3 * width, f"{p}.qkv"), split], f"{p}.split", outputs=[q, k, v], axis=-1)
    shape = net.shared_const(f"attn.heads.{tokens}", np.array([0, tokens, heads, dh], np.int64))
    q, k, v = (net.node("Transpose", [net.node("Reshape", [t, shape], f"{t}.heads")], f"{t}.t", perm=[0, 2, 1, 3])
               for t in (q, k, v))
    if cache is not None:
        k = net.node("Concat", [cache[0], k], f"{p}.cache_k", axis=2)
        v = net.node("Concat", [cache[1], v], f"{p}.cache_v", axis=2)
    kt = net.node("Transpose", [k], f"{p}.k_t", perm=[0, 1, 3, 2])
    root = net.shared_const(f"attn.sqrt.{dh}", np.array(np.sqrt(dh), np.float32))
    scores = net.node("Div", [net.node("MatMul", [q, kt], f"{p}.qk"), root], f"{p}.scale")
    if causal:
        keep = np.arange(past + tokens)[None, :] <= past + np.arange(tokens)[:, None]
        mask = net.shared_const(f"attn.causal.{tokens}.{past}", keep.reshape(1, 1, tokens, past + tokens))
        neg = net.shared_const("attn.neg_inf", np.array(-np.inf, np.float32))
        scores = net.node("Where", [mask, scores, neg], f"{p}.causal_mask")
    probs = net.node("Softmax", [scores], f"{p}.softmax", axis=-1)
    context = net.node("Transpose", [net.node("MatMul", [probs, v], f"{p}.pv")], f"{p}.merge_heads",
                       perm=[0, 2, 1, 3])
    merge = net.shared_const(f"attn.merge.{tokens}", np.array([0, tokens, width], np.int64))
    merged = net.node("Reshape", [context, merge], f"{p}.merge")
    return net.linear(merged, width, width, f"{p}.proj"), k, v


def _mlp(net: _Net, x: str, p: str, width: int, hidden: int) -> str:
    return net.linear(net.gelu(net.linear(x, width, hidden, f"{p}.fc1"), f"{p}.gelu"), hidden, width, f"{p}.fc2")


def vit(*, name: str = "vit_tiny", image: int = 224, patch: int = 16, channels: int = 3, width: int = 192,
        depth: int = 12, heads: int = 3, mlp: int = 768, classes: int = 1000, seed: int = 2701,
        weights: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A ViT (DeiT-Tiny's layout, pre-LN): ``pixel_values [1, channels, image, image]`` -> ``logits [1, classes]``
    (see the module docstring). ``weights``: trained values of initializers by name (the rest seeded)."""
    net = _Net(name, seed, weights)
    grid = image // patch
    tokens = grid * grid + 1
    x = net.add_input("pixel_values", TensorProto.FLOAT, [1, channels, image, image])
    fan_in = channels * patch * patch
    w = net.const("patch_embed.weight", net.normal((width, channels, patch, patch), np.sqrt(2.0 / fan_in)))
    b = net.const("patch_embed.bias", net.normal((width,), 0.02))
    x = net.node("Conv", [x, w, b], "patch_embed", kernel_shape=[patch, patch], strides=[patch, patch])
    x = net.node("Reshape", [x, net.const("patch_embed.shape", np.array([1, width, grid * grid], np.int64))],
                 "patch_embed.flatten")
    x = net.node("Transpose", [x], "patch_embed.tokens", perm=[0, 2, 1])
    cls = net.const("cls_token.value", net.normal((1, 1, width), 0.5))
    x = net.node("Concat", [cls, x], "cls_token", axis=1)
    x = net.node("Add", [x, net.const("pos_embed.value", net.normal((1, tokens, width), 0.5))], "pos_embed")
    for i in range(depth):
        p = f"blocks.{i}"
        a, _, _ = _attention(net, net.layer_norm(x, width, f"{p}.ln1"), f"{p}.attn", tokens=tokens, width=width,
                             heads=heads, causal=False)
        x = net.node("Add", [x, a], f"{p}.attn.residual")
        x = net.node("Add", [x, _mlp(net, net.layer_norm(x, width, f"{p}.ln2"), f"{p}.mlp", width, mlp)],
                     f"{p}.mlp.residual")
    x = net.layer_norm(x, width, "norm")
    pooled = net.node("Gather", [x, net.const("cls_pool.index", np.array(0, np.int64))], "cls_pool", axis=1)
    wh = net.const("head.weight", net.normal((classes, width), 1.0 / np.sqrt(width)))
    bh = net.const("head.bias", net.normal((classes,), 0.02))
    net.node("Gemm", [pooled, wh, bh], "head", outputs=["logits"], transB=1)
    net.add_output("logits", [1, classes])
    return net.finish()


def bert(*, name: str = "bert_base", tokens: int = 128, width: int = 768, depth: int = 12, heads: int = 12,
         mlp: int = 3072, vocab: int = 30522, max_positions: int = 512, classes: int = 2,
         seed: int = 2702) -> onnx.ModelProto:
    """A BERT encoder (post-LN): ``input_ids [N, tokens]`` (int64) -> ``logits [N, classes]`` (see the module
    docstring)."""
    net = _Net(name, seed)
    ids = net.add_input("input_ids", TensorProto.INT64, ["N", tokens])
    word = net.const("embeddings.word.weight", net.normal((vocab, width), 0.1))
    positions = net.normal((max_positions, width), 0.02)
    token_type = net.normal((2, width), 0.02)
    x = net.node("Gather", [word, ids], "embeddings.word", axis=0)
    extra = (positions[:tokens] + token_type[0]).reshape(1, tokens, width)
    x = net.node("Add", [x, net.const("embeddings.position_and_type.value", extra)], "embeddings.position_and_type")
    x = net.layer_norm(x, width, "embeddings.norm")
    for i in range(depth):
        p = f"blocks.{i}"
        a, _, _ = _attention(net, x, f"{p}.attn", tokens=tokens, width=width, heads=heads, causal=False)
        x = net.layer_norm(net.node("Add", [x, a], f"{p}.attn.residual"), width, f"{p}.ln1")
        h = _mlp(net, x, f"{p}.mlp", width, mlp)
        x = net.layer_norm(net.node("Add", [x, h], f"{p}.mlp.residual"), width, f"{p}.ln2")
    first = net.node("Gather", [x, net.const("pooler.index", np.array(0, np.int64))], "pooler.first_token", axis=1)
    wp = net.const("pooler.weight", net.normal((width, width), 1.0 / np.sqrt(width)))
    bp = net.const("pooler.bias", net.normal((width,), 0.02))
    pooled = net.node("Tanh", [net.node("Gemm", [first, wp, bp], "pooler.dense", transB=1)], "pooler")
    wc = net.const("classifier.weight", net.normal((classes, width), 1.0 / np.sqrt(width)))
    bc = net.const("classifier.bias", net.normal((classes,), 0.02))
    net.node("Gemm", [pooled, wc, bc], "classifier", outputs=["logits"], transB=1)
    net.add_output("logits", ["N", classes])
    return net.finish()


def gpt2(*, name: str = "gpt2_prefill", tokens: int = 128, past: int = 0, width: int = 768, depth: int = 12,
         heads: int = 12, mlp: int = 3072, vocab: int = 50257, max_positions: int = 1024,
         seed: int = 2703) -> onnx.ModelProto:
    """A GPT-2 decoder step over ``tokens`` new tokens after ``past`` cached ones (prefill: ``past=0``; decode:
    ``tokens=1``): ``input_ids [N, tokens]`` (int64) and, when ``past``, ``past.{i}.key`` / ``past.{i}.value``
    ``[N, heads, past, width/heads]`` -> ``logits [N, vocab]`` of the last token and ``present.{i}.key`` /
    ``present.{i}.value [N, heads, past + tokens, width/heads]`` (see the module docstring). The weights do not depend
    on ``tokens`` or ``past``."""
    if past + tokens > max_positions:
        raise ValueError(f"past + tokens = {past + tokens} exceeds max_positions {max_positions}.")
    net = _Net(name, seed)
    dh = width // heads
    ids = net.add_input("input_ids", TensorProto.INT64, ["N", tokens])
    wte_value = net.normal((vocab, width), 0.1)
    wte = net.const("wte.weight", wte_value)
    wpe = net.normal((max_positions, width), 0.02)
    x = net.node("Gather", [wte, ids], "wte", axis=0)
    x = net.node("Add", [x, net.const("wpe.value", wpe[past:past + tokens].reshape(1, tokens, width))], "wpe")
    for i in range(depth):
        p = f"blocks.{i}"
        cache = None
        if past:
            cache = (net.add_input(f"past.{i}.key", TensorProto.FLOAT, ["N", heads, past, dh]),
                     net.add_input(f"past.{i}.value", TensorProto.FLOAT, ["N", heads, past, dh]))
        a, k, v = _attention(net, net.layer_norm(x, width, f"{p}.ln1"), f"{p}.attn", tokens=tokens, width=width,
                             heads=heads, causal=tokens > 1, past=past, cache=cache)
        for kind, tensor in (("key", k), ("value", v)):
            net.node("Identity", [tensor], f"present.{i}.{kind}")
            net.add_output(f"present.{i}.{kind}", ["N", heads, past + tokens, dh])
        x = net.node("Add", [x, a], f"{p}.attn.residual")
        x = net.node("Add", [x, _mlp(net, net.layer_norm(x, width, f"{p}.ln2"), f"{p}.mlp", width, mlp)],
                     f"{p}.mlp.residual")
    x = net.layer_norm(x, width, "ln_f")
    last = net.node("Gather", [x, net.const("last_token.index", np.array(tokens - 1, np.int64))], "last_token",
                    axis=1)
    head = net.node("Transpose", [wte], "lm_head.weight", perm=[1, 0])    # tied: folded to a constant at import
    net.node("MatMul", [last, head], "lm_head", outputs=["logits"])
    net.outputs.insert(0, helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", vocab]))
    del wte_value
    return net.finish()


MODELS = {
    "vit_tiny": lambda: vit(),
    "bert_base": lambda: bert(),
    "gpt2_prefill": lambda: gpt2(name="gpt2_prefill", tokens=128, past=0),
    "gpt2_decode": lambda: gpt2(name="gpt2_decode", tokens=1, past=128),
}
"""The full-size transformers of the zoo: name -> builder."""
