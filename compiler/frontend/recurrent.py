"""LSTM, GRU and RNN unrolled over their (static) sequence into the nodes the lab imports.

ONNX's recurrent operators run one cell per time step. With the sequence length fixed by the input's shape, each
becomes, per direction:

- the input projection of every step at once: ``X [L, B, I] x W^T [I, G*H]`` plus both biases (one linear layer over
  ``L * B`` rows, on the accelerator);
- per step ``t``: that step's rows (a Slice), plus ``h_{t-1} x R^T`` (a linear layer of ``B`` rows) when there is a
  previous state, the gates cut from the sum by Slices, and the cell's element-wise equations (Sigmoid, Tanh, products
  of two activations, sums), exactly as ONNX states them (gate orders ``i o f c`` for LSTM, ``z r h`` for GRU);
- the states of every step concatenated as ``Y``, the last one as ``Y_h`` (and ``Y_c``).

A reverse direction runs the steps from the last; ``bidirectional`` runs both and stacks them on ``Y``'s direction
axis. ``layout=1`` (batch first) transposes ``X`` in and the outputs back. Supported: the activations of
:data:`_ACTIVATIONS` (the defaults, and DeepSpeech's ``Relu``), an ``initial_h``/``initial_c`` given or zero, LSTM's
peepholes ``P``, GRU's ``linear_before_reset``, ``clip`` (a Clip of the gates' pre-activations), ``input_forget``;
refused with the reason: activations that take an alpha or beta, a ``sequence_lens`` that is not every sequence's
full length, a weight that is not a constant, a sequence of more than :data:`MAX_STEPS` steps.
Every value is the same float computation as onnxruntime's, in its order of operations up to the sums' association
(:func:`rewrite_recurrent`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .onnx_common import _attrs, _decode

__all__ = ["rewrite_recurrent", "RECURRENT_OPS"]

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
"""The operators :func:`rewrite_recurrent` unrolls."""

MAX_STEPS = 1024
"""The longest sequence (steps times directions) :func:`rewrite_recurrent` unrolls; a longer one is refused (its
graph would hold tens of thousands of nodes)."""

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}

_ACTIVATIONS = frozenset({"Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"})
"""The activations a cell may name (ONNX's ``f``, ``g``, ``h`` per direction) that take no ``activation_alpha`` or
``activation_beta``: each is the ONNX operator of that name (DeepSpeech's RNN of ``Relu``)."""


def _activations(node: onnx.NodeProto, dirs: int) -> list[list[str]]:
    """Each direction's activations (``f``, ``g``, ``h`` of an LSTM; ``f``, ``g`` of a GRU; ``f`` of an RNN), ONNX's
    defaults when the node names none; the names as ONNX spells its operators (``relu`` is ``Relu``)."""
    default = _DEFAULT_ACTIVATIONS[node.op_type]
    acts = [_decode(v) for v in _attrs(node).get("activations", [])] or default * dirs
    spelled = {name.lower(): name for name in _ACTIVATIONS}
    acts = [spelled.get(act.lower(), act) for act in acts]
    return [acts[d * len(default):(d + 1) * len(default)] for d in range(dirs)]


class _Builder:
    """Nodes and constants of one unrolled operator, named after it."""

    def __init__(self, model: onnx.ModelProto, name: str) -> None:
        self.model, self.name, self.count = model, name, 0
        self.nodes: list[onnx.NodeProto] = []
        self.consts: dict[tuple[str, tuple[int, ...], bytes], str] = {}

    def fresh(self, what: str) -> str:
        self.count += 1
        return f"{self.name}_{what}_{self.count}"

    def const(self, what: str, value: np.ndarray) -> str:
        """An initializer of ``value``; one per distinct value, so every step reads the same recurrent weights and
        slice bounds instead of a copy each."""
        value = np.ascontiguousarray(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self.consts:
            self.consts[key] = self.fresh(what)
            self.model.graph.initializer.append(numpy_helper.from_array(value, self.consts[key]))
        return self.consts[key]

    def op(self, op_type: str, inputs: list[str], what: str, output: str | None = None, **attrs: Any) -> str:
        out = output or self.fresh(what)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(op_type.lower()), **attrs))
        return out

    def rows(self, x: str, start: int, stop: int, axis: int) -> str:
        """``x[start:stop]`` along ``axis``."""
        return self.op("Slice", [x, self.const("start", np.array([start], np.int64)),
                                 self.const("stop", np.array([stop], np.int64)),
                                 self.const("axis", np.array([axis], np.int64))], "slice")


def _refusal(node: onnx.NodeProto, consts: dict[str, np.ndarray], x_shape: tuple[int, ...] | None) -> str | None:
    kind = node.op_type
    if x_shape is None or len(x_shape) != 3:
        return "an input X of unknown or non-3-D shape"
    a = _attrs(node)
    direction = _decode(a.get("direction", "forward"))
    dirs = 2 if direction == "bidirectional" else 1
    acts = [_decode(v) for v in a.get("activations", [])]
    if acts and (len(acts) != len(_DEFAULT_ACTIVATIONS[kind]) * dirs or
                 any(act not in _ACTIVATIONS for per in _activations(node, dirs) for act in per)):
        return (f"activations {acts} (per direction {len(_DEFAULT_ACTIVATIONS[kind])} of "
                f"{', '.join(sorted(_ACTIVATIONS))}: those that take no alpha or beta)")
    if direction not in ("forward", "reverse", "bidirectional"):
        return f"direction {direction!r}"
    layout = int(a.get("layout", 0))
    steps = (x_shape[1] if layout else x_shape[0]) * dirs
    if steps > MAX_STEPS:
        return f"a sequence of {steps} steps over its directions (the lab unrolls at most {MAX_STEPS})"
    inputs = list(node.input) + [""] * 8
    for k, role in ((1, "W"), (2, "R"), (3, "B"), (7 if kind == "LSTM" else 99, "P")):
        if k < len(node.input) and node.input[k] and node.input[k] not in consts:
            return f"its {role} input {node.input[k]!r} is computed at run time (the lab needs constant weights)"
    lens = inputs[4]
    if lens:
        value = consts.get(lens)
        length = x_shape[1] if layout else x_shape[0]
        if value is None or not (np.asarray(value) == length).all():
            return "a sequence_lens shorter than the input's sequence, or computed at run time"
    return None


def rewrite_recurrent(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """In place: every LSTM, GRU and RNN whose X has a static shape and whose weights are constants becomes its
    unrolled nodes (module docstring). Returns ``{first output: reason}`` for those refused (the caller reports them
    when no rule takes the node); the caller infers the new tensors' shapes when anything changed."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes: list[onnx.NodeProto] = []
    refused: dict[str, str] = {}
    changed = False
    for node in model.graph.node:
        if node.op_type not in RECURRENT_OPS or node.domain not in ("", "ai.onnx"):
            nodes.append(node)
            continue
        reason = _refusal(node, consts, shapes.get(node.input[0]))
        if reason is not None:
            refused[next((o for o in node.output if o), node.name)] = reason
            nodes.append(node)
            continue
        build = _Builder(model, node.name or next(o for o in node.output if o))
        _unroll(build, node, consts, shapes[node.input[0]])
        nodes += build.nodes
        changed = True
    if changed:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return refused


def _unroll(b: _Builder, node: onnx.NodeProto, consts: dict[str, np.ndarray], x_shape: tuple[int, ...]) -> None:
    kind = node.op_type
    gates = _GATES[kind]
    inputs = list(node.input) + [""] * (8 - len(node.input))
    a = _attrs(node)
    layout = int(a.get("layout", 0))
    direction = _decode(a.get("direction", "forward"))
    seq, batch = (x_shape[1], x_shape[0]) if layout else (x_shape[0], x_shape[1])
    w, r = consts[inputs[1]].astype(np.float32), consts[inputs[2]].astype(np.float32)
    dirs, hidden = w.shape[0], r.shape[-1]
    bias = consts[inputs[3]].astype(np.float32) if inputs[3] else np.zeros((dirs, 2 * gates * hidden), np.float32)
    x = inputs[0] if not layout else b.op("Transpose", [inputs[0]], "x_seq_first", perm=[1, 0, 2])
    init_h = inputs[5] if inputs[5] else None
    init_c = inputs[6] if kind == "LSTM" and inputs[6] else None
    if layout and init_h:
        init_h = b.op("Transpose", [init_h], "h0", perm=[1, 0, 2])
    if layout and init_c:
        init_c = b.op("Transpose", [init_c], "c0", perm=[1, 0, 2])
    peep = consts[inputs[7]].astype(np.float32) if kind == "LSTM" and inputs[7] else None
    clip = a.get("clip")
    acts = _activations(node, dirs)
    ys: list[str] = []
    hs: list[str | None] = []
    cs: list[str | None] = []
    for d in range(dirs):
        reverse = direction == "reverse" or (direction == "bidirectional" and d == 1)
        wb, rb = bias[d, :gates * hidden], bias[d, gates * hidden:]
        if kind == "GRU" and int(a.get("linear_before_reset", 0)):
            proj_bias = wb.copy()                 # R's bias of the candidate stays inside r * (h R^T + Rb_h)
            proj_bias[:2 * hidden] += rb[:2 * hidden]
            r_bias = np.concatenate([np.zeros(2 * hidden, np.float32), rb[2 * hidden:]])
        else:
            proj_bias, r_bias = wb + rb, None
        xw = b.op("MatMul", [x, b.const("w_t", w[d].T.copy())], "xw")            # [L, B, G*H]
        xw = b.op("Add", [xw, b.const("bias", proj_bias)], "xwb")
        h = _state(b, init_h, d) if init_h else None
        c = _state(b, init_c, d) if init_c else None
        outs: list[str] = [""] * seq
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            step = b.op("Reshape", [b.rows(xw, t, t + 1, 0), b.const("shape", np.array([batch, gates * hidden],
                                                                                      np.int64))], "step")
            h, c = _cell(b, kind, node, step, h, c, r[d], r_bias, peep[d] if peep is not None else None, hidden,
                         clip, acts[d])
            outs[t] = h
        ys.append(b.op("Concat", [b.op("Unsqueeze", [o, b.const("axes", np.array([0], np.int64))], "y_t")
                                  for o in outs], "y_dir", axis=0))                 # [L, B, H]
        hs.append(h)
        cs.append(c)
    _outputs(b, node, ys, hs, cs, layout)


def _state(b: _Builder, init: str, d: int) -> str:
    """Direction ``d``'s initial state ``[B, H]`` of ``init`` ``[dirs, B, H]``."""
    return b.op("Squeeze", [b.rows(init, d, d + 1, 0), b.const("axes", np.array([0], np.int64))], "state")


def _gate(b: _Builder, pre: str, clip: float | None, act: str) -> str:
    if clip is not None:
        pre = b.op("Clip", [pre, b.const("lo", np.array(-clip, np.float32)), b.const("hi", np.array(clip,
                                                                                                    np.float32))],
                   "clipped")
    return b.op(act, [pre], act.lower())


def _cell(b: _Builder, kind: str, node: onnx.NodeProto, step: str, h: str | None, c: str | None, r: np.ndarray,
          r_bias: np.ndarray | None, peep: np.ndarray | None, hidden: int, clip: float | None,
          acts: Sequence[str]) -> tuple[str, str | None]:
    """One time step: the new ``h`` (and LSTM's ``c``) from the step's projected input ``[B, G*H]``; ``acts`` the
    direction's activations (``f``, ``g``, ``h``: the gates', the candidate's, the cell output's)."""
    def cut(x: str, k: int) -> str:
        return b.rows(x, k * hidden, (k + 1) * hidden, 1)

    if kind == "GRU":
        linear_before_reset = int(_attrs(node).get("linear_before_reset", 0))
        rows = r if linear_before_reset else r[:2 * hidden]          # h R^T for the gates (and the candidate)
        hr = b.op("MatMul", [h, b.const("r_t", rows.T.copy())], "hr") if h else None
        pre_zr = b.rows(step, 0, 2 * hidden, 1)
        if hr is not None:
            pre_zr = b.op("Add", [pre_zr, b.rows(hr, 0, 2 * hidden, 1)], "pre_zr")
        z = _gate(b, b.rows(pre_zr, 0, hidden, 1), clip, acts[0])
        rg = _gate(b, b.rows(pre_zr, hidden, 2 * hidden, 1), clip, acts[0])
        cand = cut(step, 2)
        if linear_before_reset:                      # r * (h R_h^T + Rb_h); h R_h^T is 0 without a state
            rb_h = b.const("rb_h", np.asarray(r_bias)[2 * hidden:])
            rec = b.op("Add", [cut(hr, 2), rb_h], "rec") if hr is not None else rb_h
            cand = b.op("Add", [cand, b.op("Mul", [rg, rec], "r_rec")], "pre_h")
        elif h is not None:                          # (r * h) R_h^T
            rh = b.op("Mul", [rg, h], "rh")
            cand = b.op("Add", [cand, b.op("MatMul", [rh, b.const("rh_t", r[2 * hidden:].T.copy())], "rhr")],
                        "pre_h")
        hc = _gate(b, cand, clip, acts[1])
        one_minus = b.op("Sub", [b.const("one", np.ones(1, np.float32)), z], "one_minus_z")
        new = b.op("Mul", [one_minus, hc], "zh")
        if h is not None:
            new = b.op("Add", [new, b.op("Mul", [z, h], "zprev")], "h")
        return new, None
    pre = step
    if h is not None:
        pre = b.op("Add", [pre, b.op("MatMul", [h, b.const("r_t", r.T.copy())], "hr")], "pre")
    if kind == "RNN":
        return _gate(b, pre, clip, acts[0]), None
    i_pre, o_pre, f_pre, c_pre = (cut(pre, k) for k in range(4))
    if peep is not None and c is not None:
        i_pre = b.op("Add", [i_pre, b.op("Mul", [c, b.const("p_i", peep[:hidden])], "pic")], "i_pre")
    i = _gate(b, i_pre, clip, acts[0])
    if int(_attrs(node).get("input_forget", 0)):
        f = b.op("Sub", [b.const("one", np.ones(1, np.float32)), i], "f_coupled")
    else:
        if peep is not None and c is not None:
            f_pre = b.op("Add", [f_pre, b.op("Mul", [c, b.const("p_f", peep[2 * hidden:])], "pfc")], "f_pre")
        f = _gate(b, f_pre, clip, acts[0])
    cand = _gate(b, c_pre, clip, acts[1])
    new_c = b.op("Mul", [i, cand], "ic")
    if c is not None:
        new_c = b.op("Add", [b.op("Mul", [f, c], "fc"), new_c], "c")
    if peep is not None:
        o_pre = b.op("Add", [o_pre, b.op("Mul", [new_c, b.const("p_o", peep[hidden:2 * hidden])], "poc")], "o_pre")
    o = _gate(b, o_pre, clip, acts[0])
    return b.op("Mul", [o, b.op(acts[2], [new_c], "h_c")], "h"), new_c


def _outputs(b: _Builder, node: onnx.NodeProto, ys: Sequence[str], hs: Sequence[str | None],
             cs: Sequence[str | None], layout: int) -> None:
    """``Y [L, dirs, B, H]``, ``Y_h [dirs, B, H]`` and ``Y_c`` (batch first with ``layout=1``) from the directions'
    ``[L, B, H]`` sequences and last states, written to the node's output names."""
    outputs = list(node.output) + [""] * (3 - len(node.output))
    axes = b.const("axes", np.array([1], np.int64))
    if outputs[0]:
        stacked = [b.op("Unsqueeze", [y, axes], "y_axis") for y in ys]
        y = stacked[0] if len(stacked) == 1 else b.op("Concat", stacked, "y_dirs", axis=1)
        if layout:
            b.op("Transpose", [y], "y", output=outputs[0], perm=[2, 0, 1, 3])
        else:
            b.op("Identity", [y], "y", output=outputs[0])
    for out, states in ((outputs[1], hs), (outputs[2], cs)):
        if not out:
            continue
        zero = b.const("axes0", np.array([0], np.int64))
        parts = [b.op("Unsqueeze", [s, zero], "state_axis") for s in states if s is not None]
        joined = parts[0] if len(parts) == 1 else b.op("Concat", parts, "states", axis=0)
        if layout:
            b.op("Transpose", [joined], "state", output=out, perm=[1, 0, 2])
        else:
            b.op("Identity", [joined], "state", output=out)
