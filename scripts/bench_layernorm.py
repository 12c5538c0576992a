"""The integer LayerNorm (``QILayerNorm``) on the tensor ALU with the lane_reduce knob against the float
``QLayerNorm`` on the CPU, per LayerNorm node.

Usage: python scripts/bench_layernorm.py [--model bert_tiny|bert_block] [--no-tsim] [--json FILE]

For each LayerNorm of the model (``bert_tiny`` from the zoo, or ``bert_block``: the BERT-base block of
``scripts/bench_attention.py``), quantized as ``scripts/bench_gelu.py`` does, on ``configs/lane_reduce.toml``, prints:

* the integer LayerNorm's error against float LayerNorm of the same int8 input (unrounded, clipped to int8's range),
  in output steps, on the node's own input for a seeded random model input, beside the float ``QLayerNorm``'s
  (which rounds the float value: at most 0.5 step), and the largest intermediate's bit length (below 31);
* the ALU layer's cycles by the cycle model and, unless ``--no-tsim``, by tsim on that input (checked bit-exact
  against :func:`vta.compiler.qops.ilayernorm`), and the time at the design's clock;
* the CPU time: the median of 20 runs of the CPU backend's float ``QLayerNorm`` and of the integer node, and the
  partitioner's estimates and choice (``--layernorm auto``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def layernorm_rows(model: str, tsim: bool) -> list[dict[str, Any]]:
    """One row of figures per LayerNorm node of ``model`` (see the module docstring)."""
    from bench_gelu import _quantized  # type: ignore[import-not-found]
    from bench_rowwise import measure  # type: ignore[import-not-found]

    from vta.compiler import qops
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.layernorm import LayerNormLayer, build_layernorm_program, integer_layernorm
    from vta.compiler.lowering.layout import pack_activation
    from vta.compiler.pipeline import choose_layernorm, random_inputs
    from vta.config import load_config
    cfg = load_config(ROOT / "configs" / "lane_reduce.toml")
    intr = intrinsics(cfg)
    qgraph = _quantized(model)
    igraph, originals = integer_layernorm(qgraph)
    _, decisions, _ = choose_layernorm(qgraph, intr, "auto")
    values = qops.run_reference(qgraph, random_inputs(qgraph, seed=3), keep_all=True)
    rows = []
    for name, float_node in originals.items():
        node = igraph.node(name)
        a = float_node.attrs
        xin = values[node.inputs[0]]
        p = {k: node.attrs[k] for k in qops.ILAYERNORM_ATTRS}
        trace = qops.ilayernorm_trace(xin, **p)
        xf = xin.astype(np.float64) * a["scale"]
        real = (xf - xf.mean(-1, keepdims=True)) / np.sqrt(xf.var(-1, keepdims=True) + a["epsilon"])
        real = np.clip((real * a["gamma"] + a["beta"]) / a["out_scale"], -128, 127)
        ref = qops.layer_norm(xin, a["scale"], a["gamma"], a["beta"], a["out_scale"], -1, a["epsilon"])
        layer = LayerNormLayer.from_attrs(xin.shape, node.attrs)
        view = layer.shape
        program, code = build_layernorm_program(cfg, layer, pack_activation(xin.reshape(view), batch=intr.batch,
                                                                            block=intr.block_in))
        rows.append(measure(cfg=cfg, program=program, code=code, trace=trace, real=real, ref=ref, xin=xin, view=view,
                            qgraph=qgraph, igraph=igraph, float_node=float_node, node=node,
                            decision=decisions[name], tsim=tsim, extra={"shift": int(p["shift"])}))
    return rows


def main() -> None:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_rowwise import main as bench_main  # type: ignore[import-not-found]
    bench_main("LayerNorm", layernorm_rows, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
