"""LLVM IR of the quantized operators' element bodies, shared by the CPU kernels (:mod:`.cpu`) and the GPU kernels
(:mod:`.gpu`).

A body computes one output element (or one output row) of an operator from IR values of its indices; the emitter
around it decides where the indices come from: a host loop nest in :mod:`.cpu`, the thread and block indices of a
SIMT launch in :mod:`.gpu`. Both therefore compute every element with the same instructions, and both equal
:mod:`.qops` bit for bit (the contract of each body is that of its :mod:`.qops` twin).

Conventions: indices and sizes are i64; ``x``, ``w``, ``out``... are pointers to C-contiguous (row-major) arrays
of the element type named in each docstring; shapes are Python ints baked into the IR as constants.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, NamedTuple, Sequence

from llvmlite import ir

from ..ir import AddRequant

__all__ = ["I8", "I32", "I64", "F32", "F64", "const", "loop", "at", "index", "clip", "mac", "requant_value",
           "AddParams", "qadd_value", "rescale_value", "quantize_value", "dequantize_value", "dense_value",
           "conv_value", "pool_value", "lut_value"]

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()


def const(value: int, ty: ir.IntType = I64) -> ir.Constant:
    """An integer constant of type ``ty`` (i64 by default)."""
    return ir.Constant(ty, int(value))


@contextmanager
def loop(b: ir.IRBuilder, stop: int | ir.Value, start: int | ir.Value = 0) -> Iterator[ir.Value]:
    """``for i in range(start, stop)`` (i64); the body is emitted inside the ``with``."""
    start_v = const(start) if isinstance(start, int) else start
    stop_v = const(stop) if isinstance(stop, int) else stop
    pre = b.block
    head, body, done = (b.append_basic_block(t) for t in ("head", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(start_v, pre)
    b.cbranch(b.icmp_signed("<", i, stop_v), body, done)
    b.position_at_end(body)
    yield i
    i.add_incoming(b.add(i, const(1)), b.block)
    b.branch(head)
    b.position_at_end(done)


def at(b: ir.IRBuilder, ptr: ir.Value, idx: ir.Value) -> ir.Value:
    """The address of element ``idx`` of the array at ``ptr``."""
    return b.gep(ptr, [idx])


def index(b: ir.IRBuilder, *terms: tuple[ir.Value | int, int]) -> ir.Value:
    """Sum of ``value * stride`` terms as i64 (a flat row-major index)."""
    total: ir.Value = const(0)
    for value, stride in terms:
        v = const(value) if isinstance(value, int) else value
        total = b.add(total, b.mul(v, const(stride)) if stride != 1 else v)
    return total


def clip(b: ir.IRBuilder, v: ir.Value, lo: int | ir.Value, hi: int | ir.Value) -> ir.Value:
    """``min(max(v, lo), hi)`` in ``v``'s integer type (signed); the bounds are ints or values of that type."""
    ty = v.type
    lo_v = ir.Constant(ty, lo) if isinstance(lo, int) else lo
    hi_v = ir.Constant(ty, hi) if isinstance(hi, int) else hi
    v = b.select(b.icmp_signed("<", v, lo_v), lo_v, v)
    return b.select(b.icmp_signed(">", v, hi_v), hi_v, v)


def mac(b: ir.IRBuilder, acc: ir.Value, x: ir.Value, w: ir.Value) -> ir.Value:
    """``acc + int32(x) * int32(w)`` for int8 ``x``, ``w`` and an int32 ``acc``, wrapping to 32 bits."""
    return b.add(acc, b.mul(b.sext(x, I32), b.sext(w, I32)))


def requant_value(b: ir.IRBuilder, acc: ir.Value, m: ir.Value, s: ir.Value, lo: int, hi: int) -> ir.Value:
    """int8 ``clip((acc * m) >> s, lo, hi)`` of int32 ``acc``, ``m``, ``s`` (``*`` wraps to 32 bits, ``>>`` is
    arithmetic; :func:`.qops.requantize`)."""
    return b.trunc(clip(b, b.ashr(b.mul(acc, m), s), lo, hi), I8)


class AddParams(NamedTuple):
    """A QAdd's constants as i32 IR values (read at run time, so that one kernel serves every QAdd of a size)."""

    ma: ir.Value
    mb: ir.Value
    shift: ir.Value
    lo: ir.Value
    hi: ir.Value


def qadd_value(b: ir.IRBuilder, a: ir.Value, c: ir.Value, r: AddRequant | AddParams) -> ir.Value:
    """int8 ``clip((a * Ma + c * Mb) >> S, lo, hi)`` of int8 ``a``, ``c`` in 32-bit arithmetic (:func:`.qops.qadd`);
    the constants baked in (an :class:`~..ir.AddRequant`) or i32 values (:class:`AddParams`)."""
    def i32(v: int | ir.Value) -> ir.Value:
        return const(v, I32) if isinstance(v, int) else v

    av = b.mul(b.sext(a, I32), i32(r.ma))
    cv = b.mul(b.sext(c, I32), i32(r.mb))
    return b.trunc(clip(b, b.ashr(b.add(av, cv), i32(r.shift)), r.lo, r.hi), I8)


def rescale_value(b: ir.IRBuilder, x: ir.Value, m: ir.Value, shift: int, lo: int, hi: int) -> ir.Value:
    """int8 ``clip((x * m + r) >> shift, lo, hi)`` of int8 ``x`` and int32 ``m`` in 64-bit arithmetic, ``r`` =
    ``2**(shift-1)`` (0 when ``shift`` is 0; :func:`.qops.rescale`)."""
    rnd = (1 << (shift - 1)) if shift > 0 else 0
    v = b.mul(b.sext(x, I64), b.sext(m, I64))
    return b.trunc(clip(b, b.ashr(b.add(v, const(rnd)), const(shift)), lo, hi), I8)


def lut_value(b: ir.IRBuilder, x: ir.Value, table: ir.Value) -> ir.Value:
    """int8 ``table[x + 128]`` of int8 ``x`` and a pointer to 256 int8 values (:func:`.qops.lut`)."""
    return b.load(at(b, table, b.add(b.sext(x, I64), const(128))))


def quantize_value(b: ir.IRBuilder, v: ir.Value, scale: float) -> ir.Value:
    """int8 ``clip(rint(float64(v) / scale), -128, 127)`` of float32 ``v`` (:func:`.qops.quantize`)."""
    rint = b.module.declare_intrinsic("llvm.rint", [F64])
    q = b.call(rint, [b.fdiv(b.fpext(v, F64), ir.Constant(F64, scale))])
    q = b.select(b.fcmp_ordered("<", q, ir.Constant(F64, -128.0)), ir.Constant(F64, -128.0), q)
    q = b.select(b.fcmp_ordered(">", q, ir.Constant(F64, 127.0)), ir.Constant(F64, 127.0), q)
    return b.trunc(b.fptosi(q, I32), I8)


def dequantize_value(b: ir.IRBuilder, v: ir.Value, scale: float) -> ir.Value:
    """float32 ``float32(float64(v) * scale)`` of int8 ``v`` (:func:`.qops.dequantize`)."""
    return b.fptrunc(b.fmul(b.sitofp(v, F64), ir.Constant(F64, scale)), F32)


def _slot(b: ir.IRBuilder, ty: ir.Type) -> ir.Value:
    """A stack slot in the function's entry block (promoted to a register by the optimizer)."""
    with b.goto_entry_block():
        return b.alloca(ty)


def dense_value(b: ir.IRBuilder, x: ir.Value, w: ir.Value, bias: ir.Value, n: ir.Value, o: ir.Value,
                k_: int) -> ir.Value:
    """int32 ``bias[o] + sum_k x[n, k] * w[o, k]`` (wrapping) for int8 ``x [N, K]``, ``w [O, K]``, int32
    ``bias [O]`` (:func:`.qops.dense_acc`)."""
    acc_p = _slot(b, I32)
    b.store(b.load(at(b, bias, o)), acc_p)
    with loop(b, k_) as k:
        xv = b.load(at(b, x, index(b, (n, k_), (k, 1))))
        wv = b.load(at(b, w, index(b, (o, k_), (k, 1))))
        b.store(mac(b, b.load(acc_p), xv, wv), acc_p)
    return b.load(acc_p)


def conv_value(b: ir.IRBuilder, x: ir.Value, w: ir.Value, bias: ir.Value, out_index: Sequence[ir.Value], *,
               x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
               groups: int) -> ir.Value:
    """int32 accumulator of output element ``(n, o, oh, ow)`` of a grouped convolution (wrapping; zero padding read
    as zeros, :func:`.qops.conv2d_acc`): int8 ``x [N, C, H, W]`` (not padded), int8 ``w [O, C/groups, KH, KW]``,
    int32 ``bias [O]``; ``pads`` are (top, left, bottom, right)."""
    n, o, oh, ow = out_index
    _, c_, h_, w_ = x_shape
    o_, cg, kh_, kw_ = w_shape
    g = b.udiv(o, const(o_ // groups))
    acc_p = _slot(b, I32)
    b.store(b.load(at(b, bias, o)), acc_p)
    with loop(b, cg) as c, loop(b, kh_) as kh:
        ih = b.add(b.mul(oh, const(strides[0])), b.sub(kh, const(pads[0])))
        row_in = b.and_(b.icmp_signed(">=", ih, const(0)), b.icmp_signed("<", ih, const(h_)))
        with loop(b, kw_) as kw:
            iw = b.add(b.mul(ow, const(strides[1])), b.sub(kw, const(pads[1])))
            inside = b.and_(row_in, b.and_(b.icmp_signed(">=", iw, const(0)), b.icmp_signed("<", iw, const(w_))))
            k = b.select(inside, index(b, (n, c_ * h_ * w_), (g, cg * h_ * w_), (c, h_ * w_), (ih, w_), (iw, 1)),
                         const(0))
            xv = b.select(inside, b.load(at(b, x, k)), const(0, I8))
            wv = b.load(at(b, w, index(b, (o, cg * kh_ * kw_), (c, kh_ * kw_), (kh, kw_), (kw, 1))))
            b.store(mac(b, b.load(acc_p), xv, wv), acc_p)
    return b.load(acc_p)


def pool_value(b: ir.IRBuilder, kind: str, x: ir.Value, p: ir.Value, oh: ir.Value, ow: ir.Value, *,
               hw: Sequence[int], kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
               include_pad: bool) -> ir.Value:
    """int8 output ``(oh, ow)`` of plane ``p`` of a max (``kind`` 'max', padding never wins) or average ('avg',
    ``floor((2 * sum + count) / (2 * count))``) pooling of int8 ``x [planes, H, W]``; ``pads`` are (top, left, ...)
    (:func:`.qops.maxpool`, :func:`.qops.avgpool`)."""
    h_, w_ = hw
    acc_p, cnt_p = _slot(b, I64), _slot(b, I64)
    b.store(const(-128 if kind == "max" else 0), acc_p)
    b.store(const(0), cnt_p)
    with loop(b, kernel[0]) as kh, loop(b, kernel[1]) as kw:
        ih = b.add(b.mul(oh, const(strides[0])), b.sub(kh, const(pads[0])))
        iw = b.add(b.mul(ow, const(strides[1])), b.sub(kw, const(pads[1])))
        inside = b.and_(b.and_(b.icmp_signed(">=", ih, const(0)), b.icmp_signed("<", ih, const(h_))),
                        b.and_(b.icmp_signed(">=", iw, const(0)), b.icmp_signed("<", iw, const(w_))))
        k = b.select(inside, index(b, (p, h_ * w_), (ih, w_), (iw, 1)), const(0))
        v = b.sext(b.load(at(b, x, k)), I64)
        acc = b.load(acc_p)
        new = b.select(b.icmp_signed(">", v, acc), v, acc) if kind == "max" else b.add(acc, v)
        b.store(b.select(inside, new, acc), acc_p)
        b.store(b.add(b.load(cnt_p), b.zext(inside, I64)), cnt_p)
    res = b.load(acc_p)
    if kind == "avg":
        count = const(kernel[0] * kernel[1]) if include_pad else b.load(cnt_p)
        num = b.add(b.mul(res, const(2)), count)
        den = b.mul(count, const(2))
        q = b.sdiv(num, den)
        res = b.select(b.icmp_signed("<", b.srem(num, den), const(0)), b.sub(q, const(1)), q)   # floor division
    return b.trunc(clip(b, res, -128, 127), I8)
