"""The integer reference of ``IndexFn``: embedding indices computed from token ids by a part of the model's ONNX graph
(:mod:`.frontend.indices`), run by ONNX's reference evaluator on the CPU."""
from __future__ import annotations

import base64
from functools import lru_cache
from typing import Any

import numpy as np
import onnx

__all__ = ["run_index_fn", "run_region", "reference_evaluator", "take_along", "top_k_one_hot", "pick_chosen"]


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


def top_k_one_hot(x: np.ndarray, k: int, mask: np.ndarray | None = None, keep: str = "all") -> np.ndarray:
    """The ``TopKOneHot`` op, float or int8 alike: ``x [..., E]`` -> ``[..., k, E]`` of 0 and 1 in ``x``'s dtype, row
    ``j`` one-hot at the ``j``-th largest entry of ``x``'s last axis; of equal entries the lower index comes first,
    as in ONNX's TopK (an MoE router's choice of experts, :mod:`.frontend.moe`). With ``mask`` (``x``'s shape) and
    ``keep`` "nonzero" ("zero"), the entries where ``mask`` is 0 (not 0) rank after all others, among themselves by
    index: a TopK of ``x`` filled with -inf there."""
    x = np.asarray(x)
    score = -x.astype(np.float64)
    excluded = np.zeros(x.shape, bool)
    if mask is not None and keep != "all":
        excluded = (np.asarray(mask) == 0) if keep == "nonzero" else (np.asarray(mask) != 0)
        score = np.where(excluded, 0.0, score)
    index = np.broadcast_to(np.arange(x.shape[-1]), x.shape)
    order = np.lexsort((index, score, excluded), axis=-1)[..., :int(k)]
    return (order[..., None] == np.arange(x.shape[-1])).astype(x.dtype)


def pick_chosen(onehot: np.ndarray, data: np.ndarray) -> np.ndarray:
    """The ``PickChosen`` op, float or int8 alike: the entries of ``data [..., E]`` a ``TopKOneHot``'s rows
    ``[..., k, E]`` choose, ``[..., k]``, in ``data``'s dtype (a move of values: int8 at ``data``'s scale)."""
    data = np.asarray(data)
    hot = np.asarray(onehot) != 0
    return np.where(hot, np.expand_dims(data, -2), 0).sum(axis=-1).astype(data.dtype)


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
def _evaluator(encoded: str) -> tuple[Any, np.dtype]:
    """ONNX's reference evaluator of the base64 ONNX model ``encoded`` (one per region, reused) and the dtype its one
    input takes."""
    model = onnx.ModelProto.FromString(base64.b64decode(encoded))
    kind = model.graph.input[0].type.tensor_type.elem_type
    return reference_evaluator(model), onnx.helper.tensor_dtype_to_np_dtype(kind)


def run_region(encoded: str, value: np.ndarray, failure: str, *more: np.ndarray) -> list[np.ndarray]:
    """The outputs of the base64 region model ``encoded`` (a part of a model's ONNX graph with one input: token ids
    or a mask; or with one input per value given, ``value`` then ``more``, as an element-wise region of two
    activations) for ``value``, fed in the first input's type; ValueError starting with ``failure`` when the
    evaluator fails on it. The mechanism of ``IndexFn``, ``MaskPool``, ``MaskFn`` and ``PointwiseFn``."""
    run, dtype = _evaluator(encoded)
    feeds = {name: np.asarray(v).astype(dtype) for name, v in zip(run.input_names, (value, *more))}
    try:
        return [np.asarray(out) for out in run.run(None, feeds)]
    except Exception as err:  # noqa: BLE001 - the evaluator's own errors, on the model's own arithmetic
        raise ValueError(f"{failure} ({type(err).__name__}: {err})") from None


def run_index_fn(encoded: str, ids: np.ndarray) -> np.ndarray:
    """The int64 indices an ``IndexFn`` node (attribute ``onnx``: the region's base64 ONNX model, one input, one
    output) computes from the token ids (or the mask) ``ids``."""
    (out,) = run_region(encoded, ids, "the indices computed from the token ids failed on these ids")
    return out.astype(np.int64)


def run_input_fn(encoded: str, value: np.ndarray) -> np.ndarray:
    """The float32 values an ``InputFn`` node (attribute ``onnx``: a region of a numeric graph input, one input, one
    output, :mod:`.frontend.numeric_inputs`) computes from that input's ``value``, in float as the file does."""
    (out,) = run_region(encoded, value, "the values computed from a numeric input failed on these values")
    return np.asarray(out, np.float32)
