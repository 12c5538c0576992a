"""Export the Keras 3 probe set of docs/transformers.md ("Keras 3") with tf2onnx, each with an input .npz.

Usage (TensorFlow and tf2onnx are not dependencies of the lab; install them in a virtual environment of their own)::

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install tensorflow-cpu tf2onnx
    /tmp/tfvenv/bin/python scripts/export_keras3.py OUT_DIR
    for f in OUT_DIR/*.onnx; do vta run $f --input ${f%.onnx}_x.npz --calibration ${f%.onnx}_x.npz; done

Writes ``OUT_DIR/NAME.onnx`` and ``OUT_DIR/NAME_x.npz`` for 13 models of seeded random weights at batch 1, opset 17:
transformer blocks (an encoder, a causal one, a ViT, a token classifier with ``Embedding``), convolutional nets
(dilated, depthwise, separable and transposed convolutions, pooling, resizing, normalizations), Keras's attention
layers, and recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional, ``return_state``, ConvLSTM2D), which tf2onnx
writes as ONNX ``Loop``. GELU is the tanh form: Keras 3's exact GELU makes tf2onnx write ``Erfc``, which ONNX does
not define. Prints one line per model, ``ok NAME`` or ``FAIL NAME: why``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out = Path(args[0])
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf
    import tf2onnx
    from keras import layers

    keras.utils.set_random_seed(0)
    failed = 0

    def gelu(t):
        return keras.activations.gelu(t, approximate=True)

    def save(name: str, model, shape: tuple[int, ...], ids: bool = False) -> None:
        nonlocal failed
        dtype = tf.int32 if ids else tf.float32
        spec = (tf.TensorSpec(shape, dtype, name="ids" if ids else "x"),)
        fn = tf.function(lambda x: model(x, training=False), input_signature=spec)
        try:
            tf2onnx.convert.from_function(fn, input_signature=spec, opset=17, output_path=str(out / f"{name}.onnx"))
        except Exception as err:  # noqa: BLE001 - the converter's own failure, reported per model
            failed += 1
            print(f"FAIL {name}: {type(err).__name__}: {str(err)[:300]}")
            return
        rng = np.random.default_rng(1)
        if ids:
            np.savez(out / f"{name}_x.npz", ids=rng.integers(0, 100, shape).astype(np.int32))
        else:
            np.savez(out / f"{name}_x.npz", x=rng.standard_normal(shape).astype(np.float32))
        print(f"ok {name}")

    def encoder(causal: bool, seq: int = 16, d: int = 64, heads: int = 4):
        x = keras.Input((seq, d), batch_size=1)
        a = layers.MultiHeadAttention(heads, d // heads)(x, x, use_causal_mask=causal)
        h = layers.LayerNormalization(epsilon=1e-6)(x + a)
        f = layers.Dense(d)(layers.Dense(4 * d, activation=gelu)(h))
        return keras.Model(x, layers.LayerNormalization(epsilon=1e-6)(h + f))

    save("keras_encoder", encoder(False), (1, 16, 64))
    save("keras_decoder_causal", encoder(True), (1, 16, 64))

    x = keras.Input((32, 32, 3), batch_size=1)
    p = layers.Reshape((64, 64))(layers.Conv2D(64, 4, strides=4)(x))
    for _ in range(2):
        h = layers.LayerNormalization()(p)
        p = p + layers.MultiHeadAttention(4, 16)(h, h)
        h = layers.LayerNormalization()(p)
        p = p + layers.Dense(64)(layers.Dense(128, activation=gelu)(h))
    p = layers.GlobalAveragePooling1D()(layers.LayerNormalization()(p))
    save("keras_vit", keras.Model(x, layers.Dense(10, activation="softmax")(p)), (1, 32, 32, 3))

    x = keras.Input((12,), batch_size=1, dtype="int32")
    e = layers.Embedding(100, 32)(x)
    h = layers.LayerNormalization()(e + layers.MultiHeadAttention(2, 16)(e, e))
    save("keras_embed", keras.Model(x, layers.Dense(2)(layers.GlobalAveragePooling1D()(h))), (1, 12), ids=True)

    x = keras.Input((32, 32, 3), batch_size=1)
    h = layers.ReLU(6.0)(layers.BatchNormalization()(layers.Conv2D(16, 3, padding="same", use_bias=False)(x)))
    h = layers.Activation("swish")(layers.BatchNormalization()(layers.DepthwiseConv2D(3, strides=2, padding="same")(h)))
    h = layers.Conv2D(32, 1)(h)
    s = layers.Conv2D(8, 1, activation="relu")(layers.GlobalAveragePooling2D(keepdims=True)(h))
    h = h * layers.Conv2D(32, 1, activation="sigmoid")(s)
    h = layers.AveragePooling2D(2, padding="same")(layers.MaxPooling2D(2)(h))
    h = layers.Conv2DTranspose(8, 3, strides=2, padding="same")(layers.UpSampling2D(2, interpolation="bilinear")(h))
    save("keras_cnn", keras.Model(x, layers.Dense(10)(layers.Flatten()(h))), (1, 32, 32, 3))

    x = keras.Input((24, 24, 3), batch_size=1)
    h = layers.Conv2D(8, 3, dilation_rate=2, padding="same", activation="relu")(x)
    h = layers.SeparableConv2D(16, 3, padding="same", activation="elu")(h)
    h = layers.Cropping2D(((1, 0), (1, 1)))(layers.ZeroPadding2D(((1, 2), (0, 1)))(h))
    h = layers.Resizing(16, 16)(layers.UpSampling2D(2, interpolation="nearest")(h))
    h = layers.SpatialDropout2D(0.3)(layers.GroupNormalization(4)(h))
    h = layers.GlobalMaxPooling2D()(layers.Conv2D(8, 1, activation="hard_silu")(h))
    save("keras_cnn2", keras.Model(x, layers.UnitNormalization()(layers.Dense(6, activation="leaky_relu")(h))),
         (1, 24, 24, 3))

    x = keras.Input((64, 8), batch_size=1)
    h = layers.Conv1D(16, 5, padding="causal", dilation_rate=2, activation="relu")(x)
    h = layers.GlobalMaxPooling1D()(layers.SeparableConv1D(16, 3, padding="same")(h))
    save("keras_conv1d", keras.Model(x, layers.Dense(3)(h)), (1, 64, 8))

    x = keras.Input((10, 16), batch_size=1)
    h = layers.LayerNormalization(rms_scaling=True)(layers.Attention(use_scale=True)([x, x]) +
                                                     layers.AdditiveAttention()([x, x]))
    h = layers.TimeDistributed(layers.Dense(8, activation="softplus"))(h)
    save("keras_attention_layers", keras.Model(x, layers.Flatten()(h)), (1, 10, 16))

    for kind, cell in (("lstm", layers.LSTM), ("gru", layers.GRU), ("simple", layers.SimpleRNN)):
        x = keras.Input((20, 12), batch_size=1)
        h = layers.Bidirectional(cell(8))(cell(16, return_sequences=True)(x))
        save(f"keras_{kind}", keras.Model(x, layers.Dense(4)(h)), (1, 20, 12))

    x = keras.Input((12, 8), batch_size=1)
    h = layers.GRU(16, return_sequences=True, reset_after=False)(x)
    h, s1, s2 = layers.LSTM(8, return_sequences=True, return_state=True)(h)
    h = layers.MaxPooling1D(2)(layers.Conv1D(8, 3, padding="causal")(h))
    save("keras_rnn2", keras.Model(x, layers.Concatenate()([layers.Flatten()(h), s1, s2])), (1, 12, 8))

    x = keras.Input((6, 8, 8, 2), batch_size=1)
    save("keras_convlstm", keras.Model(x, layers.Flatten()(layers.ConvLSTM2D(4, 3, padding="same")(x))),
         (1, 6, 8, 8, 2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
