"""The CPU fallback: llvmlite-JIT kernels for every quantized operator, bit-exact with :mod:`.qops`.

Each kernel is generated as LLVM IR with the operator's shapes and constants baked in, optimized at ``-O3`` for the
host CPU, and cached per (kernel, shapes, constants) for the life of the process (:func:`cache_info`) and as object
code on disk (``$VTA_CACHE_DIR/jit``). Nothing is initialized at import: the JIT engine is created on the first
kernel request.

Public entry points:

* one function per operator (:func:`conv2d_acc`, :func:`dense_acc`, :func:`requantize`, :func:`qconv2d`,
  :func:`qdense`, :func:`qadd`, :func:`rescale`, :func:`maxpool`, :func:`avgpool`, :func:`global_avgpool`,
  :func:`qclip`, :func:`lut`, :func:`quantize`, :func:`dequantize`, :func:`softmax`) with the same arguments as its
  :mod:`.qops` twin;
* :data:`CPU_OPS` / :func:`run_node`: the op table, with the same signature as :func:`.qops.run_node`, for a runtime
  that sends some nodes to the CPU;
* :func:`run_cpu`: the ``cpu`` target, the whole quantized graph on this path.

Data movement (Reshape, Pad, Transpose, Concat's final copy) uses numpy; all arithmetic runs in JIT code but
Resize's, which is the integer reference's numpy code (:func:`.qops.resize`: gathers and a few integer products per
element), and the zero-point ops of pre-quantized models (``QuantizeZp``, ``DequantizeZp``, ``QAffine``), also the
reference's. Softmax (float) may differ from numpy's in the last bits of float32; every integer op is bit-exact.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from llvmlite import ir

from vta.cache import cache_root

from .. import qops
from ..ir import AddRequant, Graph, GraphError, Node, Requant
from . import elements as el
from .elements import F32, F64, I8, I32

__all__ = ["conv2d_acc", "dense_acc", "requantize", "qconv2d", "qdense", "qadd", "rescale", "qclip", "lut", "maxpool",
           "avgpool", "global_avgpool", "quantize", "dequantize", "softmax", "CPU_OPS", "run_node", "run_cpu",
           "cache_info"]

_OBJ_MAGIC = b"vta-jit-object sha256 "
"""The start of every cached object file, followed by the SHA-256 of the object code in hex and a newline."""

# The IR helpers shared with the GPU kernels (:mod:`.elements`), under this module's historical names.
_c, _range, _at, _idx, _clip = el.const, el.loop, el.at, el.index, el.clip


# ---- the JIT engine -------------------------------------------------------------------------------------------------
class _Jit:
    """One MCJIT engine; modules are added as kernels are first requested.

    Compiled object code is also kept on disk under ``$VTA_CACHE_DIR/jit`` (default ``~/.cache/vta-lab/jit``), keyed
    by a hash of the kernel's IR, the host CPU and the llvmlite version, so later processes skip optimization and
    code generation. Each file holds a header with the SHA-256 of its object code (:data:`_OBJ_MAGIC`, the hash in
    hex, a newline) and is written whole by a rename; a file whose object code does not match its hash (truncated,
    corrupted) is never handed to LLVM, which would abort the process: it is removed with a warning on the ``vta``
    logger and the kernel is compiled again.
    """

    def __init__(self) -> None:
        import llvmlite
        import llvmlite.binding as llvm
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        self.llvm = llvm
        target = llvm.Target.from_default_triple()
        cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        self.tm = target.create_target_machine(opt=3, cpu=cpu, features=features, jit=True)
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm)
        self.host = f"{cpu};{features};{llvmlite.__version__};obj-v2"
        self.cache_dir = cache_root("jit")
        self.engine.set_object_cache(self._notify, self._getbuffer)
        self.kernels: dict[tuple, Callable[..., None]] = {}
        self.disk_hits = 0
        self._loaded: dict[str, bytes] = {}       # key -> verified object code, for _getbuffer

    def _path(self, key: str) -> Path:
        return self.cache_dir / f"{key}.o"

    def _notify(self, module: Any, buffer: bytes) -> None:
        if len(module.name) != 40:                # the engine's initial empty module is not a kernel
            return
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(_OBJ_MAGIC + hashlib.sha256(buffer).hexdigest().encode() + b"\n" + buffer)
            os.replace(tmp, self._path(module.name))
        except OSError:
            pass                                  # a read-only cache only costs compile time

    def _read_verified(self, key: str) -> bytes | None:
        """The cached object code of kernel ``key`` when its file exists and matches its hash; a damaged file is
        removed with a warning (None: compile the kernel)."""
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        head, obj = data[:len(_OBJ_MAGIC) + 65], data[len(_OBJ_MAGIC) + 65:]
        if head.startswith(_OBJ_MAGIC) and head.endswith(b"\n") and \
                head[len(_OBJ_MAGIC):-1] == hashlib.sha256(obj).hexdigest().encode():
            return obj
        logging.getLogger("vta").warning("the cached JIT object code %s is damaged (%d bytes, its hash does not "
                                         "match); removing it and compiling the kernel again", path, len(data))
        path.unlink(missing_ok=True)
        return None

    def _getbuffer(self, module: Any) -> bytes | None:
        data = self._loaded.pop(module.name, None)
        if data is not None:
            self.disk_hits += 1
        return data

    def compile(self, module: ir.Module, name: str, nargs: int) -> Callable[..., None]:
        llvm = self.llvm
        module.triple = llvm.get_process_triple()
        text = str(module)
        key = hashlib.sha256((self.host + "\n" + text).encode()).hexdigest()[:40]
        mod = llvm.parse_assembly(text)
        mod.name = key
        cached = self._read_verified(key)
        if cached is not None:
            self._loaded[key] = cached
        else:
            mod.verify()
            pto = llvm.create_pipeline_tuning_options(speed_level=3)
            pto.loop_vectorization = True
            pto.slp_vectorization = True
            pb = llvm.create_pass_builder(self.tm, pto)
            pb.getModulePassManager().run(mod, pb)
        self.engine.add_module(mod)
        self.engine.finalize_object()
        addr = self.engine.get_function_address(name)
        return ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs))(addr)


_JIT: _Jit | None = None


def _kernel(key: tuple, build: Callable[[], tuple[ir.Module, str, int]]) -> Callable[..., None]:
    """The compiled kernel for ``key``, building it with ``build() -> (module, function name, arg count)`` once."""
    global _JIT
    if _JIT is None:
        _JIT = _Jit()
    fn = _JIT.kernels.get(key)
    if fn is None:
        fn = _JIT.compile(*build())
        _JIT.kernels[key] = fn
    return fn


def cache_info() -> int:
    """Number of kernels loaded so far in this process (compiled, or read from the on-disk object cache)."""
    return 0 if _JIT is None else len(_JIT.kernels)


def _function(name: str, argtypes: Sequence[ir.Type]) -> tuple[ir.Module, ir.Function, ir.IRBuilder]:
    module = ir.Module(name)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), list(argtypes)), name)
    for arg in fn.args:
        arg.add_attribute("noalias")
    return module, fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _call(fn: Callable[..., None], *arrays: np.ndarray) -> None:
    """Call a kernel on C-contiguous arrays; ``arrays`` keeps temporaries alive for the whole call."""
    for a in arrays:
        if not a.flags.c_contiguous:
            raise ValueError("Kernel arguments must be C-contiguous arrays.")
    fn(*(a.ctypes.data for a in arrays))


# ---- convolution and dense ----------------------------------------------------------------------------------------
def _build_conv(x_shape: tuple, w_shape: tuple, strides: tuple, groups: int, out_hw: tuple):
    n_, c_, hp, wp = x_shape
    o_, cg, kh_, kw_ = w_shape
    oh_, ow_ = out_hw
    og = o_ // groups
    module, fn, b = _function("conv", [I8.as_pointer(), I8.as_pointer(), I32.as_pointer(), I32.as_pointer()])
    x, w, bias, out = fn.args
    with _range(b, n_) as n, _range(b, o_) as o:
        g = b.udiv(o, _c(og))
        bo = b.load(_at(b, bias, o))
        with _range(b, oh_) as oh:
            row = _idx(b, (n, o_ * oh_ * ow_), (o, oh_ * ow_), (oh, ow_))
            with _range(b, ow_) as ow:
                b.store(bo, _at(b, out, b.add(row, ow)))
            with _range(b, cg) as c, _range(b, kh_) as kh, _range(b, kw_) as kw:
                wv = b.load(_at(b, w, _idx(b, (o, cg * kh_ * kw_), (c, kh_ * kw_), (kh, kw_), (kw, 1))))
                ih = b.add(b.mul(oh, _c(strides[0])), kh)
                base = _idx(b, (n, c_ * hp * wp), (g, cg * hp * wp), (c, hp * wp), (ih, wp), (kw, 1))
                with _range(b, ow_) as ow:
                    xv = b.load(_at(b, x, b.add(base, b.mul(ow, _c(strides[1])))))
                    slot = _at(b, out, b.add(row, ow))
                    b.store(el.mac(b, b.load(slot), xv, wv), slot)
    b.ret_void()
    return module, "conv", 4


def conv2d_acc(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, strides: Sequence[int] = (1, 1),
               pads: Sequence[int] = (0, 0, 0, 0), groups: int = 1) -> np.ndarray:
    """int32 accumulator of a grouped convolution (see :func:`.qops.conv2d_acc`), wrapping like the hardware."""
    o_, cg, kh, kw = w.shape
    if x.shape[1] != cg * groups or o_ % groups:
        raise ValueError(f"Convolution of {x.shape[1]} input channels with weights {w.shape} and groups={groups} is "
                         f"inconsistent: need C == C/groups * groups and O divisible by groups.")
    top, left, bottom, right = (int(p) for p in pads)
    xp = np.ascontiguousarray(np.pad(x.astype(np.int8), ((0, 0), (0, 0), (top, bottom), (left, right))))
    oh = (xp.shape[2] - kh) // strides[0] + 1
    ow = (xp.shape[3] - kw) // strides[1] + 1
    strides_t = (int(strides[0]), int(strides[1]))
    fn = _kernel(("conv", xp.shape, w.shape, strides_t, groups),
                 lambda: _build_conv(xp.shape, w.shape, strides_t, groups, (oh, ow)))
    b = np.zeros(o_, np.int32) if bias is None else np.ascontiguousarray(bias, np.int32)
    out = np.empty((x.shape[0], o_, oh, ow), np.int32)
    _call(fn, xp, np.ascontiguousarray(w, np.int8), b, out)
    return out


def _build_dense(n_: int, k_: int, o_: int):
    module, fn, b = _function("dense", [I8.as_pointer(), I8.as_pointer(), I32.as_pointer(), I32.as_pointer()])
    x, w, bias, out = fn.args
    with _range(b, n_) as n, _range(b, o_) as o:
        b.store(el.dense_value(b, x, w, bias, n, o, k_), _at(b, out, _idx(b, (n, o_), (o, 1))))
    b.ret_void()
    return module, "dense", 4


def dense_acc(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """int32 accumulator ``x @ w.T + bias`` (see :func:`.qops.dense_acc`)."""
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"Dense input has {x.shape[1]} features but weights {w.shape} expect {w.shape[1]}.")
    n_, k_ = x.shape
    o_ = w.shape[0]
    fn = _kernel(("dense", n_, k_, o_), lambda: _build_dense(n_, k_, o_))
    b = np.zeros(o_, np.int32) if bias is None else np.ascontiguousarray(bias, np.int32)
    out = np.empty((n_, o_), np.int32)
    _call(fn, np.ascontiguousarray(x, np.int8), np.ascontiguousarray(w, np.int8), b, out)
    return out


# ---- requantization and elementwise ops ---------------------------------------------------------------------------
def _build_requant(outer: int, channels: int, inner: int, lo: int, hi: int):
    module, fn, b = _function("requant", [I32.as_pointer(), I32.as_pointer(), I32.as_pointer(), I8.as_pointer()])
    acc, mult, shift, out = fn.args
    with _range(b, outer) as n, _range(b, channels) as o:
        m = b.load(_at(b, mult, o))
        s = b.load(_at(b, shift, o))
        with _range(b, inner) as i:
            k = _idx(b, (n, channels * inner), (o, inner), (i, 1))
            b.store(el.requant_value(b, b.load(_at(b, acc, k)), m, s, lo, hi), _at(b, out, k))
    b.ret_void()
    return module, "requant", 4


def requantize(acc: np.ndarray, requant: Requant, axis: int = 1) -> np.ndarray:
    """``clip((acc * M[o]) >> S[o], lo, hi)`` as int8 with channels along ``axis`` (see :func:`.qops.requantize`)."""
    outer = int(np.prod(acc.shape[:axis], dtype=np.int64))
    inner = int(np.prod(acc.shape[axis + 1:], dtype=np.int64))
    channels = acc.shape[axis]
    fn = _kernel(("requant", outer, channels, inner, requant.lo, requant.hi),
                 lambda: _build_requant(outer, channels, inner, requant.lo, requant.hi))
    out = np.empty(acc.shape, np.int8)
    _call(fn, np.ascontiguousarray(acc, np.int32), requant.multiplier.astype(np.int32),
          requant.shift.astype(np.int32), out)
    return out


def qconv2d(x: np.ndarray, w: np.ndarray, bias: np.ndarray, requant: Requant, strides: Sequence[int] = (1, 1),
            pads: Sequence[int] = (0, 0, 0, 0), groups: int = 1) -> np.ndarray:
    """Quantized convolution (see :func:`.qops.qconv2d`)."""
    return requantize(conv2d_acc(x, w, bias, strides, pads, groups), requant, axis=1)


def qdense(x: np.ndarray, w: np.ndarray, bias: np.ndarray, requant: Requant) -> np.ndarray:
    """Quantized dense layer (see :func:`.qops.qdense`)."""
    return requantize(dense_acc(x, w, bias), requant, axis=1)


def _build_qadd(size: int):
    """The QAdd of ``size`` elements; its constants (Ma, Mb, S, lo, hi) are the fourth argument, five int32."""
    module, fn, b = _function("qadd", [I8.as_pointer(), I8.as_pointer(), I8.as_pointer(), I32.as_pointer()])
    a, bb, out, params = fn.args
    r = el.AddParams(*(b.load(_at(b, params, el.const(k))) for k in range(5)))
    with _range(b, size) as i:
        b.store(el.qadd_value(b, b.load(_at(b, a, i)), b.load(_at(b, bb, i)), r), _at(b, out, i))
    b.ret_void()
    return module, "qadd", 4


def qadd(a: np.ndarray, b: np.ndarray, requant: AddRequant) -> np.ndarray:
    """Quantized add (see :func:`.qops.qadd`)."""
    if a.shape != b.shape:
        raise ValueError(f"QAdd operands have shapes {a.shape} and {b.shape}; they must be equal.")
    r = requant
    fn = _kernel(("qadd", a.size), lambda: _build_qadd(a.size))
    out = np.empty(a.shape, np.int8)
    params = np.array([r.ma, r.mb, r.shift, r.lo, r.hi], np.int32)
    _call(fn, np.ascontiguousarray(a, np.int8), np.ascontiguousarray(b, np.int8), out, params)
    return out


def _build_rescale(size: int, shift: int, lo: int, hi: int):
    module, fn, b = _function("rescale", [I8.as_pointer(), I32.as_pointer(), I8.as_pointer()])
    x, mult, out = fn.args
    with _range(b, size) as i:
        b.store(el.rescale_value(b, b.load(_at(b, x, i)), b.load(_at(b, mult, i)), shift, lo, hi), _at(b, out, i))
    b.ret_void()
    return module, "rescale", 3


def rescale(x: np.ndarray, multiplier: np.ndarray | int, shift: int) -> np.ndarray:
    """``clip((x * M + r) >> S, -128, 127)`` (see :func:`.qops.rescale`); ``M`` broadcasts against ``x``."""
    shift = int(shift)
    m = np.ascontiguousarray(np.broadcast_to(np.asarray(multiplier, np.int32), x.shape))
    fn = _kernel(("rescale", x.size, shift, -128, 127), lambda: _build_rescale(x.size, shift, -128, 127))
    out = np.empty(x.shape, np.int8)
    _call(fn, np.ascontiguousarray(x, np.int8), m, out)
    return out


def qclip(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """int8 clip to ``[lo, hi]`` (a standalone ReLU/ReLU6)."""
    fn = _kernel(("rescale", x.size, 0, int(lo), int(hi)), lambda: _build_rescale(x.size, 0, int(lo), int(hi)))
    out = np.empty(x.shape, np.int8)
    _call(fn, np.ascontiguousarray(x, np.int8), np.ones(x.shape, np.int32), out)
    return out


def _build_lut(size: int):
    module, fn, b = _function("lut", [I8.as_pointer(), I8.as_pointer(), I8.as_pointer()])
    x, table, out = fn.args
    with _range(b, size) as i:
        b.store(el.lut_value(b, b.load(_at(b, x, i)), table), _at(b, out, i))
    b.ret_void()
    return module, "lut", 3


def lut(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """int8 table lookup ``table[x + 128]`` (see :func:`.qops.lut`)."""
    fn = _kernel(("lut", x.size), lambda: _build_lut(x.size))
    out = np.empty(x.shape, np.int8)
    _call(fn, np.ascontiguousarray(x, np.int8), np.ascontiguousarray(table, np.int8), out)
    return out


def _build_lut2(size: int):
    module, fn, b = _function("lut2", [I8.as_pointer()] * 4)
    a, c, table, out = fn.args
    with _range(b, size) as i:
        row = b.add(b.sext(b.load(_at(b, a, i)), el.I64), el.const(128))
        col = b.add(b.sext(b.load(_at(b, c, i)), el.I64), el.const(128))
        b.store(b.load(_at(b, table, b.add(b.mul(row, el.const(256)), col))), _at(b, out, i))
    b.ret_void()
    return module, "lut2", 4


def lut2(a: np.ndarray, c: np.ndarray, table: np.ndarray) -> np.ndarray:
    """int8 lookup of a pair ``table[a + 128, c + 128]``, ``a`` and ``c`` broadcast (see :func:`.qops.lut2`): the
    operands expanded to their common shape, then one pass of the JIT kernel."""
    a, c = (np.ascontiguousarray(v, np.int8) for v in np.broadcast_arrays(a, c))
    fn = _kernel(("lut2", a.size), lambda: _build_lut2(a.size))
    out = np.empty(a.shape, np.int8)
    _call(fn, a, c, np.ascontiguousarray(table, np.int8).reshape(-1), out)
    return out


# ---- pooling ------------------------------------------------------------------------------------------------------
def _build_pool(kind: str, planes: int, hw: tuple, out_hw: tuple, kernel: tuple, strides: tuple, pads: tuple,
                include_pad: bool):
    module, fn, b = _function("pool", [I8.as_pointer(), I8.as_pointer()])
    x, out = fn.args
    oh_, ow_ = out_hw
    with _range(b, planes) as p, _range(b, oh_) as oh, _range(b, ow_) as ow:
        v = el.pool_value(b, kind, x, p, oh, ow, hw=hw, kernel=kernel, strides=strides, pads=pads,
                          include_pad=include_pad)
        b.store(v, _at(b, out, _idx(b, (p, oh_ * ow_), (oh, ow_), (ow, 1))))
    b.ret_void()
    return module, "pool", 2


def _pool(kind: str, x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
          include_pad: bool) -> np.ndarray:
    n_, c_, h_, w_ = x.shape
    kernel_t, strides_t, pads_t = (tuple(int(v) for v in t) for t in (kernel, strides, pads))
    oh = (h_ + pads_t[0] + pads_t[2] - kernel_t[0]) // strides_t[0] + 1
    ow = (w_ + pads_t[1] + pads_t[3] - kernel_t[1]) // strides_t[1] + 1
    key = ("pool", kind, n_ * c_, (h_, w_), kernel_t, strides_t, pads_t, bool(include_pad))
    fn = _kernel(key, lambda: _build_pool(kind, n_ * c_, (h_, w_), (oh, ow), kernel_t, strides_t, pads_t,
                                          bool(include_pad)))
    out = np.empty((n_, c_, oh, ow), np.int8)
    _call(fn, np.ascontiguousarray(x, np.int8), out)
    return out


def maxpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int]) -> np.ndarray:
    """int8 max pooling (see :func:`.qops.maxpool`)."""
    return _pool("max", x, kernel, strides, pads, False)


def avgpool(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
            count_include_pad: bool = False) -> np.ndarray:
    """int8 average pooling rounded half up (see :func:`.qops.avgpool`)."""
    return _pool("avg", x, kernel, strides, pads, count_include_pad)


def global_avgpool(x: np.ndarray) -> np.ndarray:
    """int8 global average pooling (see :func:`.qops.global_avgpool`)."""
    return _pool("avg", x, x.shape[2:], (1, 1), (0, 0, 0, 0), True)


# ---- float boundary ops -------------------------------------------------------------------------------------------
def _build_convert(kind: str, size: int, scale: float):
    src, dst = (F32, I8) if kind == "quantize" else (I8, F32)
    module, fn, b = _function(kind, [src.as_pointer(), dst.as_pointer()])
    x, out = fn.args
    value = el.quantize_value if kind == "quantize" else el.dequantize_value
    with _range(b, size) as i:
        b.store(value(b, b.load(_at(b, x, i)), scale), _at(b, out, i))
    b.ret_void()
    return module, kind, 2


def quantize(x: np.ndarray, scale: float) -> np.ndarray:
    """float32 -> int8 ``clip(rint(x / scale))`` (see :func:`.qops.quantize`)."""
    x = np.ascontiguousarray(x, np.float32)
    fn = _kernel(("quantize", x.size, float(scale)), lambda: _build_convert("quantize", x.size, float(scale)))
    out = np.empty(x.shape, np.int8)
    _call(fn, x, out)
    return out


def dequantize(x: np.ndarray, scale: float) -> np.ndarray:
    """int8 -> float32 ``x * scale`` (see :func:`.qops.dequantize`)."""
    fn = _kernel(("dequantize", x.size, float(scale)), lambda: _build_convert("dequantize", x.size, float(scale)))
    out = np.empty(x.shape, np.float32)
    _call(fn, np.ascontiguousarray(x, np.int8), out)
    return out


def _build_softmax(rows: int, length: int, scale: float):
    module, fn, b = _function("softmax", [I8.as_pointer(), F32.as_pointer()])
    x, out = fn.args
    exp = module.declare_intrinsic("llvm.exp", [F64])
    with b.goto_entry_block():
        peak_p, sum_p = b.alloca(F64), b.alloca(F64)
    sc = ir.Constant(F64, scale)

    def z(r: ir.Value, i: ir.Value) -> ir.Value:
        return b.fmul(b.sitofp(b.load(_at(b, x, _idx(b, (r, length), (i, 1)))), F64), sc)

    with _range(b, rows) as r:
        b.store(ir.Constant(F64, -np.inf), peak_p)
        b.store(ir.Constant(F64, 0.0), sum_p)
        with _range(b, length) as i:
            v, peak = z(r, i), b.load(peak_p)
            b.store(b.select(b.fcmp_ordered(">", v, peak), v, peak), peak_p)
        with _range(b, length) as i:
            b.store(b.fadd(b.load(sum_p), b.call(exp, [b.fsub(z(r, i), b.load(peak_p))])), sum_p)
        with _range(b, length) as i:
            e = b.call(exp, [b.fsub(z(r, i), b.load(peak_p))])
            b.store(b.fptrunc(b.fdiv(e, b.load(sum_p)), F32), _at(b, out, _idx(b, (r, length), (i, 1))))
    b.ret_void()
    return module, "softmax", 2


def softmax(x: np.ndarray, scale: float, axis: int = -1) -> np.ndarray:
    """float32 softmax of the dequantized int8 input along ``axis`` (see :func:`.qops.softmax`)."""
    moved = np.ascontiguousarray(np.moveaxis(x.astype(np.int8), axis, -1))
    length = moved.shape[-1]
    rows = moved.size // length
    fn = _kernel(("softmax", rows, length, float(scale)), lambda: _build_softmax(rows, length, float(scale)))
    out = np.empty(moved.shape, np.float32)
    _call(fn, moved, out)
    return np.moveaxis(out, -1, axis)


# ---- the cpu target -----------------------------------------------------------------------------------------------
CPU_OPS: dict[str, Callable[[Node, list[np.ndarray]], np.ndarray]] = {
    **qops.QOPS,                                # the reference where no kernel exists, bit-exact by definition
    **qops.kernel_ops(sys.modules[__name__]),   # the JIT kernels, bound to nodes as the reference's are
    "QLut2": lambda n, v: lut2(v[0], v[1], n.attrs["table"]),
    "Softmax": lambda n, v: qops.QOPS["Softmax"](n, v) if "bias" in n.attrs or "keep" in n.attrs or
    "sink" in n.attrs or len(v) > 1 or v[0].dtype != np.int8 else
    softmax(v[0], n.attrs["scale"], n.attrs["axis"]),
}
"""Every quantized op: the JIT kernels of this module where they exist (:func:`.qops.kernel_ops`, and the softmax
kernel for an unmasked Softmax), else the integer reference (:mod:`.qops`), bit-exact by construction: the
transformer operators, Resize, Transpose, the pre-quantized models' zero-point ops, a masked Softmax (the kernel
has no mask) or one of int32 scores (the kernel reads int8)."""


def run_node(graph: Graph, node: Node, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """Execute one quantized node on the CPU path (same contract as :func:`.qops.run_node`)."""
    fn = CPU_OPS.get(node.op)
    if fn is None:
        raise GraphError(f"Node {node.name!r} has op {node.op!r}, which the CPU backend does not implement; "
                         f"implemented ops are {', '.join(CPU_OPS)}.")
    return fn(node, [values[t] if t in values else graph.constants[t] for t in node.inputs])


def run_cpu(graph: Graph, inputs: Mapping[str, np.ndarray], *, keep_all: bool = False) -> dict[str, np.ndarray]:
    """The ``cpu`` target: run a whole quantized graph with JIT kernels; outputs equal :func:`.qops.run_reference`."""
    return qops.execute(graph, inputs, run_node, keep_all=keep_all)
