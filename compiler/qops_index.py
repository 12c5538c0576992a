"""The integer reference of ``IndexFn``: embedding indices computed from token ids by a part of the model's ONNX graph
(:mod:`.frontend.indices`), run by ONNX's reference evaluator on the CPU."""
from __future__ import annotations

import base64
from functools import lru_cache
from typing import Any

import numpy as np
import onnx

__all__ = ["run_index_fn"]


@lru_cache(maxsize=64)
def _evaluator(encoded: str) -> Any:
    """ONNX's reference evaluator of the base64 ONNX model ``encoded`` (one per region, reused)."""
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(onnx.ModelProto.FromString(base64.b64decode(encoded)))


def run_index_fn(encoded: str, ids: np.ndarray) -> np.ndarray:
    """The int64 indices an ``IndexFn`` node (attribute ``onnx``: the region's base64 ONNX model, one input, one
    output) computes from the token ids ``ids``."""
    run = _evaluator(encoded)
    try:
        (out,) = run.run(None, {run.input_names[0]: np.asarray(ids, np.int64)})
    except Exception as err:  # noqa: BLE001 - the evaluator's own errors, on the model's index arithmetic
        raise ValueError(f"the indices computed from the token ids failed on these ids ({type(err).__name__}: "
                         f"{err})") from None
    return np.asarray(out).astype(np.int64)
