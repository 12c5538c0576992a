"""The integer Softmax (``QISoftmax``) on the tensor ALU with the lane_reduce knob against the float
``QSoftmax`` on the CPU, per softmax node.

Usage: python scripts/bench_softmax.py [--model bert_tiny|bert_block] [--no-tsim] [--json FILE]

For each softmax of the model (``bert_tiny`` from the zoo, or ``bert_block``: the BERT-base block of
``scripts/bench_attention.py``), quantized as ``scripts/bench_gelu.py`` does, on ``configs/lane_reduce.toml``: a
softmax with a fused mask (bias, keep/fill) has no integer form and is listed with the reason. For the others:

* the integer Softmax's error against float softmax of the same int8 input (unrounded, clipped to int8's range), in
  output steps, on the node's own input for a seeded random model input, beside the float ``QSoftmax``'s (which
  rounds: at most 0.5 step), and the largest intermediate's bit length (below 31);
* the ALU layer's cycles by the cycle model and, unless ``--no-tsim``, by tsim on that input (checked bit-exact
  against :func:`vta.compiler.qops.isoftmax`), and the time at the design's clock;
* the CPU time: the median of 20 runs of the CPU backend's float ``QSoftmax`` and of the integer node, and the
  partitioner's estimates and choice (``--softmax auto``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def softmax_rows(model: str, tsim: bool) -> list[dict[str, Any]]:
    """One row of figures per softmax node of ``model`` (see the module docstring)."""
    from bench_gelu import _quantized  # type: ignore[import-not-found]
    from bench_rowwise import measure  # type: ignore[import-not-found]

    from vta.compiler import qops
    from vta.compiler.lowering.intrin import intrinsics
    from vta.compiler.lowering.layout import pack_activation
    from vta.compiler.lowering.softmax import SoftmaxLayer, build_softmax_program, integer_softmax, softmax_refusal
    from vta.compiler.pipeline import choose_softmax, random_inputs
    from vta.config import load_config
    cfg = load_config(ROOT / "configs" / "lane_reduce.toml")
    intr = intrinsics(cfg)
    qgraph = _quantized(model)
    igraph, originals = integer_softmax(qgraph)
    _, decisions, _ = choose_softmax(qgraph, intr, "auto")
    values = qops.run_reference(qgraph, random_inputs(qgraph, seed=3), keep_all=True)
    rows: list[dict[str, Any]] = []
    for float_node in qgraph.nodes:
        if float_node.op != "QSoftmax":
            continue
        name, a = float_node.name, float_node.attrs
        if name not in originals:
            rows.append({"node": name, "refused": softmax_refusal(qgraph, float_node)})
            continue
        node = igraph.node(name)
        xin = values[node.inputs[0]]
        p = {k: node.attrs[k] for k in qops.ISOFTMAX_ATTRS}
        trace = qops.isoftmax_trace(xin, **p)
        z = xin.astype(np.float64) * a["scale"]
        e = np.exp(z - z.max(-1, keepdims=True))
        real = np.clip(e / e.sum(-1, keepdims=True) / a["out_scale"], -128, 127)
        ref = qops.qsoftmax(xin, a["scale"], a["out_scale"], -1)
        layer = SoftmaxLayer.from_attrs(xin.shape, node.attrs)
        view = layer.shape
        program, code = build_softmax_program(cfg, layer, pack_activation(xin.reshape(view), batch=intr.batch,
                                                                          block=intr.block_in))
        rows.append(measure(cfg=cfg, program=program, code=code, trace=trace, real=real, ref=ref, xin=xin, view=view,
                            qgraph=qgraph, igraph=igraph, float_node=float_node, node=node,
                            decision=decisions[name], tsim=tsim))
    return rows


def main() -> None:
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_rowwise import main as bench_main  # type: ignore[import-not-found]
    bench_main("Softmax", softmax_rows, __doc__.splitlines()[0])


if __name__ == "__main__":
    main()
