#!/usr/bin/env python3
"""Train a small CNN on scikit-learn's 8x8 digits in plain numpy, export ONNX, quantize, compare float vs int8.

Model (``[N, 1, 8, 8]`` pixels scaled to [0, 1] -> 10 logits): Conv 3x3 (8) + ReLU, Conv 3x3 stride 2 (16) + ReLU,
Flatten, Gemm (10). Trained with Adam on a fixed 75/25 split of the 1797 images (seeded, so runs repeat exactly).
The int8 model is calibrated on 200 training images and evaluated on the whole test split with the integer
reference (``--target reference``, default), the llvmlite CPU path (``cpu``) or the accelerator through the compiler
runtime (``fsim`` / ``tsim``, default config). Prints float (ONNX Runtime) and int8 test accuracy; exits 1 when the
int8 accuracy is more than 1 point below float. While it trains (and evaluates) it shows a progress bar (tqdm) on
standard error when that is a terminal, else (a log, ``| tee``) a plain line every quarter of the epochs;
``--no-progress`` turns both off.

Usage: ``python scripts/train_digits.py [--epochs 40] [--target reference|cpu|fsim|tsim] [--out digits.onnx]
[--precision w8a8,w4a8,w4a4] [--calibration-method minmax|percentile|entropy] [--keep-int8 fc] [--no-progress]``

The test split is written beside the model as ``<model>.eval.npz`` (``x`` images, ``y`` labels, ``calib`` the 200
training images the quantizer calibrates on), which
``vta sweep`` reads for its accuracy objective (test accuracy of the model quantized to each design's widths).
``--precision`` evaluates the model quantized to each listed weight/activation width (int4 weights per output
channel, int4 activations with their own requantization clip; docs/precision.md) on the accelerator design of those
widths.
Needs scikit-learn (``pip install scikit-learn``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Iterable, TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def load_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test); images ``[N, 1, 8, 8]`` float32 in [0, 1], labels int64: the seeded 75/25
    split the zoo's vit_digits trains on (one definition, :func:`vta.compiler.frontend.digits_vit.load_split`)."""
    from vta.compiler.frontend.digits_vit import load_split
    return load_split(seed)


# ---- a tiny numpy autograd-free CNN ---------------------------------------------------------------------------------
def _im2col(x: np.ndarray, k: int, stride: int, pad: int) -> tuple[np.ndarray, int, int]:
    """``x [N, C, H, W]`` -> columns ``[N*OH*OW, C*k*k]``."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::stride, ::stride]
    n, c, oh, ow = win.shape[:4]
    return win.transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, c * k * k), oh, ow


def _col2im(cols: np.ndarray, shape: tuple[int, ...], k: int, stride: int, pad: int, oh: int, ow: int) -> np.ndarray:
    n, c, h, w = shape
    out = np.zeros((n, c, h + 2 * pad, w + 2 * pad), cols.dtype)
    cols = cols.reshape(n, oh, ow, c, k, k)
    for i in range(k):
        for j in range(k):
            patch = cols[:, :, :, :, i, j].transpose(0, 3, 1, 2)
            out[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += patch
    return out[:, :, pad:pad + h, pad:pad + w]


LAYERS = [("conv", 1, 8, 1), ("conv", 8, 16, 2)]        # kind, in channels, out channels, stride (3x3, pad 1)


def init_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """He-initialized weights: ``w0 [8,1,3,3]``, ``w1 [16,8,3,3]``, ``fc [10, 256]`` and biases."""
    p: dict[str, np.ndarray] = {}
    for i, (_, cin, cout, _) in enumerate(LAYERS):
        p[f"w{i}"] = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (cin * 9))).astype(np.float32)
        p[f"b{i}"] = np.zeros(cout, np.float32)
    p["fc"] = (rng.standard_normal((10, 256)) * np.sqrt(1 / 256)).astype(np.float32)
    p["fcb"] = np.zeros(10, np.float32)
    return p


def forward(p: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, list]:
    """Logits ``[N, 10]`` and the cache for :func:`backward`."""
    cache = []
    h = x
    for i, (_, _, cout, stride) in enumerate(LAYERS):
        cols, oh, ow = _im2col(h, 3, stride, 1)
        z = cols @ p[f"w{i}"].reshape(cout, -1).T + p[f"b{i}"]
        cache.append((h.shape, cols, z, oh, ow, stride))
        h = np.maximum(z, 0).reshape(h.shape[0], oh, ow, cout).transpose(0, 3, 1, 2)
    flat = h.reshape(h.shape[0], -1)
    cache.append(flat)
    return flat @ p["fc"].T + p["fcb"], cache


def backward(p: dict[str, np.ndarray], cache: list, dlogits: np.ndarray) -> dict[str, np.ndarray]:
    """Gradients of every parameter given d(loss)/d(logits)."""
    g: dict[str, np.ndarray] = {}
    flat = cache[-1]
    g["fc"] = dlogits.T @ flat
    g["fcb"] = dlogits.sum(axis=0)
    dh = (dlogits @ p["fc"]).reshape(flat.shape[0], 16, 4, 4)
    for i in reversed(range(len(LAYERS))):
        shape, cols, z, oh, ow, stride = cache[i]
        cout = LAYERS[i][2]
        dz = dh.transpose(0, 2, 3, 1).reshape(-1, cout) * (z > 0)
        g[f"w{i}"] = (dz.T @ cols).reshape(p[f"w{i}"].shape)
        g[f"b{i}"] = dz.sum(axis=0)
        if i:
            dh = _col2im(dz @ p[f"w{i}"].reshape(cout, -1), shape, 3, stride, 1, oh, ow)
    return g


T = TypeVar("T")


def stderr_is_tty() -> bool:
    """Whether standard error is a terminal (progress bars are drawn only there)."""
    return sys.stderr.isatty()


def _bar(items: Iterable[T], enabled: bool, **options: object) -> Iterable[T]:
    """``items``, wrapped in a tqdm progress bar on standard error when ``enabled``."""
    if not enabled:
        return items
    from tqdm import tqdm
    return tqdm(items, file=sys.stderr, **options)


def train(epochs: int = 40, seed: int = 0, lr: float = 3e-3, batch: int = 64,
          progress: bool = False, lines: int = 0) -> dict[str, np.ndarray]:
    """Adam on softmax cross-entropy; returns the parameters. ``progress``: a bar over the epochs showing the last
    epoch's mean training loss; else ``lines`` > 0: a plain line with it on standard error every ``lines`` epochs
    (for logs, where a bar cannot redraw)."""
    from vta.compiler.frontend.digits_vit import adam_deltas
    x, y, _, _ = load_data(seed)
    rng = np.random.default_rng(seed)
    p = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    step = 0
    bar = _bar(range(epochs), progress, desc="train", unit="epoch")
    for epoch in bar:
        order = rng.permutation(len(y))
        loss = 0.0
        for i in range(0, len(y), batch):
            idx = order[i:i + batch]
            logits, cache = forward(p, x[idx])
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            prob = e / e.sum(axis=1, keepdims=True)
            loss += float(-np.log(prob[np.arange(len(idx)), y[idx]] + 1e-12).sum())
            prob[np.arange(len(idx)), y[idx]] -= 1
            grads = backward(p, cache, prob / len(idx))
            step += 1
            for k, delta in adam_deltas(grads, m, v, step, lr).items():
                p[k] = (p[k] - delta).astype(np.float32)
        if progress:
            bar.set_postfix(loss=f"{loss / len(y):.4f}")  # type: ignore[attr-defined]
        elif lines and (epoch + 1) % lines == 0:
            print(f"train: epoch {epoch + 1}/{epochs}, mean loss {loss / len(y):.4f}", file=sys.stderr, flush=True)
    return p


def export_onnx(p: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The trained CNN as ONNX (opset 17) with a dynamic batch dimension ``N``."""
    nodes = [helper.make_node("Conv", ["input", "w0", "b0"], ["c0"], kernel_shape=[3, 3], pads=[1] * 4, name="conv0"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2],
                              name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Flatten", ["r1"], ["f"], axis=1, name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["output"], transB=1, name="fc")]
    inits = [numpy_helper.from_array(p[k], k) for k in ("w0", "b0", "w1", "b1", "fc", "fcb")]
    graph = helper.make_graph(nodes, "digits_cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                  ["N", 1, 8, 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="vta-lab")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def int8_runner(qgraph, target: str, act_bits: int = 8, wgt_bits: int = 8) -> Callable[[np.ndarray], np.ndarray]:
    """A function mapping one image ``[1, 1, 8, 8]`` to quantized-model logits on ``target`` (the accelerator
    targets use the default design at the given input / weight widths)."""
    if target == "reference":
        from vta.compiler.qops import run_reference
        return lambda img: run_reference(qgraph, {"input": img})["output"]
    if target == "cpu":
        from vta.compiler.kernels.cpu import run_cpu
        return lambda img: run_cpu(qgraph, {"input": img})["output"]
    from vta.compiler.pipeline import compile_graph
    from vta.compiler.runtime.executor import run
    from vta.config import VTAConfig
    cfg = VTAConfig(log_inp_width=act_bits.bit_length() - 1, log_wgt_width=wgt_bits.bit_length() - 1)
    # policy="accel": on 8x8 images the cost model would keep every layer on the CPU; the point here is the accelerator.
    compiled = compile_graph(qgraph, cfg, policy="accel")
    return lambda img: run(compiled, {"input": img}, target=target).outputs["output"]


def evaluate(model: onnx.ModelProto, target: str = "reference", epochs_note: str = "", limit: int | None = None,
             seed: int = 0, progress: bool = False, requant: str = "multiply", act_bits: int = 8,
             wgt_bits: int = 8, method: str | None = None, keep_int8: tuple[str, ...] | str = ()) -> dict[str, Any]:
    """Float (ONNX Runtime) and quantized test accuracy in percent (key ``int8_acc`` whatever the widths), on the
    first ``limit`` test images (all if None); ``progress``: a bar over the test images run quantized; ``requant``:
    the quantizer's mode (``multiply`` or ``shift``, power-of-two scales); ``act_bits`` / ``wgt_bits``: the
    activation and weight widths (8 or 4) the model is quantized to; ``method``: the calibration method (minmax,
    percentile, entropy; default minmax); ``keep_int8``: Conv2d/Dense nodes kept at int8 weights (on the CPU of a
    narrow design; see :func:`vta.compiler.frontend.quantize.quantize`), or ``"auto"``: the fewest layers that bring
    the accuracy within 1 point of float on 500 held-out training images (:func:`~vta.compiler.frontend.quantize.
    choose_int8_layers`); the result's ``kept`` names them and ``cost`` gives each one's estimated CPU and
    accelerator microseconds (the partitioner's estimates on the default design at these widths)."""
    import onnxruntime as ort

    from vta.compiler.frontend.onnx_frontend import import_onnx
    from vta.compiler.frontend.quantize import choose_int8_layers, quantize
    x_train, y_train, x_test, y_test = load_data(seed)
    if limit is not None:
        x_test, y_test = x_test[:limit], y_test[:limit]
    sess = ort.InferenceSession(model.SerializeToString())
    float_pred = sess.run(None, {"input": x_test})[0].argmax(axis=1)
    graph = import_onnx(model, batch=1)
    if keep_int8 == "auto":  # chosen on training images the calibration does not use, never on the test split
        keep_int8, _ = choose_int8_layers(graph, {"input": x_train[:200]}, {"input": x_train[200:700]},
                                          act_bits=act_bits, wgt_bits=wgt_bits, budget=1.0,
                                          labels=y_train[200:700], method=method)
    qgraph = quantize(graph, {"input": x_train[:200]}, mode="shift" if requant == "shift" else "multiply",
                      act_bits=act_bits, wgt_bits=wgt_bits, method=method, keep_int8=keep_int8)
    runner = int8_runner(qgraph, target, act_bits, wgt_bits)
    name = "int8" if (wgt_bits, act_bits) == (8, 8) else f"w{wgt_bits}a{act_bits}"
    images = _bar(range(len(y_test)), progress, desc=f"{name} on {target}", unit="image")
    int8_pred = np.array([runner(x_test[i:i + 1]).argmax() for i in images])
    cost = {}
    if keep_int8:  # what keeping them costs in time: the partitioner's estimates for each kept layer
        from vta.compiler.lowering.partition import partition
        from vta.config import VTAConfig
        cfg = VTAConfig(log_inp_width=act_bits.bit_length() - 1, log_wgt_width=wgt_bits.bit_length() - 1)
        plain = quantize(graph, {"input": x_train[:200]}, act_bits=act_bits, wgt_bits=wgt_bits, method=method)
        decisions = partition(plain, cfg, policy="accel")
        cost = {n: (decisions[n].cpu_us, decisions[n].accel_us) for n in keep_int8}
    return {"float_acc": 100.0 * float((float_pred == y_test).mean()),
            "int8_acc": 100.0 * float((int8_pred == y_test).mean()),
            "agreement": 100.0 * float((float_pred == int8_pred).mean()), "images": float(len(y_test)),
            "kept": list(keep_int8), "cost": cost}


def main(argv: list[str] | None = None) -> int:
    from vta.compiler.ir import REQUANT_MODES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40, help="training epochs (default 40)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="reference", choices=["reference", "cpu", "fsim", "tsim"],
                        help="where the int8 model runs (default: the integer reference)")
    parser.add_argument("--limit", type=int, default=None, help="evaluate on the first LIMIT test images only")
    parser.add_argument("--requant", choices=REQUANT_MODES, default="multiply",
                        help="requantization: multiply (an integer multiplier and a shift per channel, default) or "
                             "shift (power-of-two scales as VTA's TVM stack: one fewer ALU micro-op per output "
                             "vector, slightly less accurate)")
    parser.add_argument("--precision", default="w8a8",
                        help="comma-separated weight/activation widths to evaluate, e.g. w8a8,w4a8,w4a4 (default "
                             "w8a8); each within the 1-point budget of float or the exit code is 1, except w4a4, "
                             "which is reported only")
    parser.add_argument("--calibration-method", choices=["minmax", "percentile", "entropy"], default=None,
                        help="how activation ranges are calibrated (default minmax)")
    parser.add_argument("--keep-int8", default="", metavar="NODES",
                        help="comma-separated Conv/Gemm nodes (conv0, conv1, fc) kept at int8 weights on the CPU "
                             "when the precision is narrower (mixed precision), e.g. fc or conv0,fc; auto: the fewest "
                             "that keep held-out training accuracy within 1 point of float")
    parser.add_argument("--out", default=None, help="write the trained ONNX model here (default: the cache folder)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress (a bar when standard error is a terminal, else a line per quarter of the "
                             "epochs)")
    args = parser.parse_args(argv)
    progress = not args.no_progress and stderr_is_tty()
    lines = 0 if args.no_progress or progress else max(1, args.epochs // 4)  # off a terminal: 4 plain lines
    start = time.perf_counter()
    params = train(args.epochs, args.seed, progress=progress, lines=lines)
    model = export_onnx(params)
    out = args.out or os.path.join(os.path.expanduser(os.environ.get("VTA_CACHE_DIR", "~/.cache/vta-lab")),
                                   "models", "digits_cnn.onnx")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    onnx.save(model, out)
    x_train, _, x_test, y_test = load_data(args.seed)  # beside the model: vta sweep's accuracy objective
    np.savez(out[:-len(".onnx")] + ".eval.npz" if out.endswith(".onnx") else out + ".eval.npz", x=x_test, y=y_test,
             calib=x_train[:200])
    trained = time.perf_counter() - start
    widths = [_parse_precision(p) for p in args.precision.split(",")]
    print(f"trained {args.epochs} epochs in {trained:.1f} s; model written to {out}")
    code = 0
    for wgt_bits, act_bits in widths:
        result = evaluate(model, args.target, limit=args.limit, seed=args.seed, progress=progress,
                          requant=args.requant, act_bits=act_bits, wgt_bits=wgt_bits, method=args.calibration_method,
                          keep_int8=_keep(args.keep_int8) if (wgt_bits, act_bits) != (8, 8) else ())
        name = "int8" if (wgt_bits, act_bits) == (8, 8) else f"w{wgt_bits}a{act_bits}"
        print(f"test images: {int(result['images'])}  float32 accuracy: {result['float_acc']:.2f}%  "
              f"{name} accuracy ({args.target}, {args.requant}): {result['int8_acc']:.2f}%  "
              f"prediction agreement: {result['agreement']:.2f}%")
        drop = result["float_acc"] - result["int8_acc"]
        checked = (wgt_bits, act_bits) != (4, 4)
        verdict = ("within" if drop <= 1.0 else "OUTSIDE") + " the 1-point budget" if checked else "reported only"
        print(f"{name} - float: {-drop:+.2f} points ({verdict})")
        if result["kept"]:
            costs = ", ".join(f"{n} (CPU {c:.1f} us, accelerator {a:.1f} us estimated)" if a is not None else
                              f"{n} (CPU {c:.1f} us estimated)" for n, (c, a) in result["cost"].items())
            print(f"  kept at int8 on the CPU: {costs}")
        if checked and drop > 1.0:
            code = 1
    return code


def _keep(text: str) -> tuple[str, ...] | str:
    """``--keep-int8``: ``auto``, or comma-separated node names."""
    return "auto" if text == "auto" else tuple(k for k in text.split(",") if k)


def _parse_precision(text: str) -> tuple[int, int]:
    """``"w4a8"`` -> (weight bits, activation bits) = (4, 8); SystemExit(2) naming the bad entry otherwise."""
    import re
    match = re.fullmatch(r"w([48])a([48])", text.strip())
    if match is None:
        raise SystemExit(f"train_digits.py: error: --precision entry {text!r} is not w8a8, w4a8, w8a4 or w4a4")
    return int(match.group(1)), int(match.group(2))


if __name__ == "__main__":
    sys.exit(main())
