"""The integer reference of ``IndexFn``: embedding indices computed from token ids by a part of the model's ONNX graph
(:mod:`.frontend.indices`), run by ONNX's reference evaluator on the CPU."""
from __future__ import annotations

import base64
from functools import lru_cache
from typing import Any

import numpy as np
import onnx

__all__ = ["run_index_fn", "reference_evaluator", "take_along"]


def _gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    """ONNX GatherElements: ``out[..., i, ...] = data[..., indices[..., i, ...], ...]`` along ``axis``, negative
    indices counted from the end; ``indices`` no larger than ``data`` on the other axes."""
    axis %= data.ndim
    index = np.asarray(indices, np.int64)
    index = np.where(index < 0, index + data.shape[axis], index)
    window = tuple(slice(None) if k == axis else slice(0, n) for k, n in enumerate(index.shape))
    return np.take_along_axis(data[window], index, axis=axis)


def take_along(x: np.ndarray, indices: np.ndarray, axis: int) -> np.ndarray:
    """ONNX GatherElements of ``x`` by constant non-negative ``indices`` along ``axis`` (no larger than ``x`` on
    the other axes): the ``TakeAlong`` op, a move of values, float or int8 alike."""
    return np.ascontiguousarray(_gather_elements(np.asarray(x), np.asarray(indices, np.int64), int(axis)))


def reference_evaluator(proto: onnx.ModelProto | onnx.NodeProto) -> Any:
    """ONNX's reference evaluator of ``proto``, with GatherElements computed by :func:`_gather_elements`: onnx
    1.23's own gives one element per row when the gathered axis has more than 32 entries (``np.choose``'s limit),
    e.g. BERT's ``token_type_ids`` buffer of 512 gathered by ``arange``."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):
        op_domain = ""

        def _run(self, data: np.ndarray, indices: np.ndarray, axis: int | None = None) -> tuple[np.ndarray]:
            return (_gather_elements(data, indices, 0 if axis is None else axis),)

    return ReferenceEvaluator(proto, new_ops=[GatherElements])


@lru_cache(maxsize=64)
def _evaluator(encoded: str) -> Any:
    """ONNX's reference evaluator of the base64 ONNX model ``encoded`` (one per region, reused)."""
    return reference_evaluator(onnx.ModelProto.FromString(base64.b64decode(encoded)))


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
