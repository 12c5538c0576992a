"""GPU kernels of the quantized operators: LLVM IR for ``nvptx64-nvidia-cuda``, one thread per output element.

Every kernel is a :class:`Kernel`: a name, a cache key (the operator, its shapes and constants), the element types
of its pointer parameters, a number of work items and an emitter of the work of one item. :func:`kernel_module`
builds the kernel function around it: the item is ``gid = ctaid.x * ntid.x + tid.x`` (i64), items ``>= threads``
do nothing, so any block size and ``grid = ceil(threads / block)`` blocks cover the work. The work of an item is
emitted by the element bodies of :mod:`.elements`, the same IR the CPU kernels of :mod:`.cpu` run.

The kernel reads its indices through three functions declared in its module, ``vta_tid_x``, ``vta_ctaid_x`` and
``vta_ntid_x`` (``i32 ()``). :func:`ptx_module` defines them with the NVVM intrinsics
(``llvm.nvvm.read.ptx.sreg.*``) and marks the kernel in ``!nvvm.annotations``; :mod:`.simt` defines them as loads
of globals set by a host loop. The kernel function's IR is therefore the same text on both.

:func:`ptx` emits (and caches per process) the PTX of a kernel for an architecture (``sm_80``, ``sm_90``...);
:func:`assemble` runs ``ptxas`` on it (:func:`ptxas_path`: on ``PATH``, else in the ``nvidia-cuda-nvcc-cu12``
wheel). Nothing is initialized at import.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable, Sequence

from llvmlite import ir

from ..ir import AddRequant
from . import elements as el
from .elements import F32, I8, I32, I64

__all__ = ["Kernel", "KernelError", "PtxasError", "TRIPLE", "ARCHS", "INDEX_ACCESSORS", "kernel_module",
           "ptx_module", "ptx", "ptxas_path", "assemble", "cache_info", "quantize_kernel", "dequantize_kernel",
           "qconv_kernel", "qdense_kernel", "qadd_kernel", "rescale_kernel", "concat_kernel", "pool_kernel",
           "pad_kernel"]

TRIPLE = "nvptx64-nvidia-cuda"
ARCHS = ("sm_80", "sm_90")
"""The architectures every kernel is assembled for in the tests (Ampere A100, Hopper H100)."""
INDEX_ACCESSORS = ("vta_tid_x", "vta_ctaid_x", "vta_ntid_x")
"""The kernel's index sources (``i32 ()``): thread in block, block in grid, threads per block."""
_NVVM = {"vta_tid_x": "llvm.nvvm.read.ptx.sreg.tid.x", "vta_ctaid_x": "llvm.nvvm.read.ptx.sreg.ctaid.x",
         "vta_ntid_x": "llvm.nvvm.read.ptx.sreg.ntid.x"}
_TYPES: dict[str, ir.Type] = {"i8": I8, "i32": I32, "f32": F32}

Body = Callable[[ir.IRBuilder, Sequence[ir.Value], ir.Value], None]


class KernelError(ValueError):
    """A kernel was asked for with shapes or constants it cannot take."""


class PtxasError(RuntimeError):
    """ptxas rejected a generated PTX module (the message holds its diagnostics)."""


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel. ``params``: element types (``"i8"``, ``"i32"``, ``"f32"``) of its pointer parameters, in
    order, outputs last; ``sizes``: the element count of each parameter's array; ``threads``: work items (one per
    output element, or per row); ``body(b, args, gid)`` emits the work of item ``gid`` (i64, ``0 <= gid <
    threads``). ``key`` identifies the IR (the module cache key)."""

    name: str
    key: tuple
    params: tuple[str, ...]
    sizes: tuple[int, ...]
    threads: int
    body: Body = field(compare=False, repr=False)

    def grid(self, block: int) -> int:
        """Blocks of ``block`` threads that cover the work items (at least 1)."""
        return max(1, -(-self.threads // block))


# ---- the kernel function and its two index sources -----------------------------------------------------------------
def kernel_module(kernel: Kernel) -> tuple[ir.Module, ir.Function]:
    """A module holding the kernel function (C calling convention, pointer parameters, no return value) and the
    declarations of its :data:`INDEX_ACCESSORS`."""
    module = ir.Module(kernel.name)
    accessors = {name: ir.Function(module, ir.FunctionType(I32, []), name) for name in INDEX_ACCESSORS}
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [_TYPES[t].as_pointer() for t in kernel.params]),
                     kernel.name)
    for arg in fn.args:
        arg.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    tid, cta, ntid = (b.zext(b.call(accessors[name], []), I64) for name in INDEX_ACCESSORS)
    gid = b.add(b.mul(cta, ntid), tid)
    work, done = fn.append_basic_block("work"), fn.append_basic_block("exit")
    b.cbranch(b.icmp_unsigned("<", gid, el.const(kernel.threads)), work, done)
    b.position_at_end(work)
    kernel.body(b, fn.args, gid)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return module, fn


def ptx_module(kernel: Kernel) -> ir.Module:
    """The kernel's module for ``nvptx64-nvidia-cuda``: index accessors read the PTX special registers (inlined),
    the kernel is marked as an entry point in ``!nvvm.annotations``."""
    module, fn = kernel_module(kernel)
    module.triple = TRIPLE
    for name, intrinsic in _NVVM.items():
        accessor = module.get_global(name)
        sreg = ir.Function(module, ir.FunctionType(I32, []), intrinsic)
        b = ir.IRBuilder(accessor.append_basic_block("entry"))
        b.ret(b.call(sreg, []))
        accessor.linkage = "internal"
        accessor.attributes.add("alwaysinline")
    module.add_named_metadata("nvvm.annotations", [fn, "kernel", el.const(1, I32)])
    return module


# ---- PTX and ptxas -------------------------------------------------------------------------------------------------
_PTX: dict[tuple[tuple, str], str] = {}


def ptx(kernel: Kernel, arch: str = "sm_80") -> str:
    """The kernel's PTX for ``arch`` (``sm_XY``), optimized at -O3; cached per (kernel key, arch) in the process."""
    cached = _PTX.get((kernel.key, arch))
    if cached is not None:
        return cached
    import llvmlite.binding as llvm
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    if not (arch.startswith("sm_") and arch[3:].isdigit()):
        raise KernelError(f"a GPU architecture is named sm_XY (e.g. sm_80), not {arch!r}")
    tm = llvm.Target.from_triple(TRIPLE).create_target_machine(cpu=arch, opt=3)
    mod = llvm.parse_assembly(str(ptx_module(kernel)))
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    text = tm.emit_assembly(mod)
    _PTX[(kernel.key, arch)] = text
    return text


def cache_info() -> int:
    """PTX modules emitted so far in this process."""
    return len(_PTX)


def ptxas_path() -> str | None:
    """``ptxas`` on ``PATH``, else the one in the ``nvidia-cuda-nvcc-cu12`` wheel (``nvidia/cuda_nvcc/bin``), else
    None."""
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvcc")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, "bin", "ptxas")
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def assemble(text: str, arch: str, *, ptxas: str | None = None) -> bytes:
    """Assemble PTX ``text`` for ``arch`` with ptxas and return the cubin (bytes); :class:`PtxasError` with ptxas's
    diagnostics when it fails, FileNotFoundError when there is no ptxas."""
    tool = ptxas or ptxas_path()
    if tool is None:
        raise FileNotFoundError("ptxas was not found on PATH or in the nvidia-cuda-nvcc-cu12 wheel; install the gpu "
                                "extra (in the lab's folder: pip install -e '.[gpu]')")
    with tempfile.TemporaryDirectory(prefix="vta-ptxas-") as folder:
        src, dst = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "kernel.cubin")
        with open(src, "w") as f:
            f.write(text)
        done = subprocess.run([tool, f"-arch={arch}", "-O3", "-o", dst, src], capture_output=True, text=True)
        if done.returncode != 0:
            raise PtxasError(f"ptxas -arch={arch} rejected the kernel (exit {done.returncode}): "
                             f"{(done.stderr or done.stdout).strip()}")
        with open(dst, "rb") as f:
            return f.read()


# ---- the kernels ---------------------------------------------------------------------------------------------------
def _split(b: ir.IRBuilder, gid: ir.Value, shape: Sequence[int]) -> list[ir.Value]:
    """Row-major indices of flat item ``gid`` in ``shape`` (i64 each)."""
    out: list[ir.Value] = []
    rest = gid
    for dim in reversed(shape[1:]):
        out.append(b.urem(rest, el.const(dim)))
        rest = b.udiv(rest, el.const(dim))
    out.append(rest)
    return out[::-1]


def quantize_kernel(size: int, scale: float) -> Kernel:
    """float32 ``x [size]`` -> int8 ``out [size]`` (:func:`.elements.quantize_value`)."""
    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        b.store(el.quantize_value(b, b.load(el.at(b, args[0], gid)), scale), el.at(b, args[1], gid))
    return Kernel("quantize", ("quantize", size, float(scale)), ("f32", "i8"), (size, size), size, body)


def dequantize_kernel(size: int, scale: float) -> Kernel:
    """int8 ``x [size]`` -> float32 ``out [size]`` (:func:`.elements.dequantize_value`)."""
    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        b.store(el.dequantize_value(b, b.load(el.at(b, args[0], gid)), scale), el.at(b, args[1], gid))
    return Kernel("dequantize", ("dequantize", size, float(scale)), ("i8", "f32"), (size, size), size, body)


def qconv_kernel(x_shape: Sequence[int], w_shape: Sequence[int], strides: Sequence[int], pads: Sequence[int],
                 groups: int, lo: int, hi: int) -> Kernel:
    """Quantized convolution, one thread per output element: int8 ``x [N, C, H, W]`` (unpadded), int8 ``w [O,
    C/groups, KH, KW]``, int32 ``bias [O]``, ``multiplier [O]``, ``shift [O]`` -> int8 ``out [N, O, OH, OW]``."""
    x_t, w_t = tuple(int(v) for v in x_shape), tuple(int(v) for v in w_shape)
    s_t, p_t = tuple(int(v) for v in strides), tuple(int(v) for v in pads)
    if x_t[1] != w_t[1] * groups or w_t[0] % groups:
        raise KernelError(f"Convolution of {x_t[1]} input channels with weights {w_t} and groups={groups} is "
                          f"inconsistent: need C == C/groups * groups and O divisible by groups.")
    oh = (x_t[2] + p_t[0] + p_t[2] - w_t[2]) // s_t[0] + 1
    ow = (x_t[3] + p_t[1] + p_t[3] - w_t[3]) // s_t[1] + 1
    out_shape = (x_t[0], w_t[0], oh, ow)

    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        x, w, bias, mult, shift, out = args
        index = _split(b, gid, out_shape)
        acc = el.conv_value(b, x, w, bias, index, x_shape=x_t, w_shape=w_t, strides=s_t, pads=p_t, groups=groups)
        o = index[1]
        b.store(el.requant_value(b, acc, b.load(el.at(b, mult, o)), b.load(el.at(b, shift, o)), lo, hi),
                el.at(b, out, gid))
    o_ = w_t[0]
    return Kernel("qconv", ("qconv", x_t, w_t, s_t, p_t, groups, lo, hi), ("i8", "i8", "i32", "i32", "i32", "i8"),
                  (prod(x_t), prod(w_t), o_, o_, o_, prod(out_shape)), prod(out_shape), body)


def qdense_kernel(n_: int, k_: int, o_: int, lo: int, hi: int) -> Kernel:
    """Quantized dense layer, one thread per output: int8 ``x [N, K]``, int8 ``w [O, K]``, int32 ``bias [O]``,
    ``multiplier [O]``, ``shift [O]`` -> int8 ``out [N, O]``."""
    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        x, w, bias, mult, shift, out = args
        n, o = _split(b, gid, (n_, o_))
        acc = el.dense_value(b, x, w, bias, n, o, k_)
        b.store(el.requant_value(b, acc, b.load(el.at(b, mult, o)), b.load(el.at(b, shift, o)), lo, hi),
                el.at(b, out, gid))
    return Kernel("qdense", ("qdense", n_, k_, o_, lo, hi), ("i8", "i8", "i32", "i32", "i32", "i8"),
                  (n_ * k_, o_ * k_, o_, o_, o_, n_ * o_), n_ * o_, body)


def qadd_kernel(size: int, r: AddRequant) -> Kernel:
    """Quantized add: int8 ``a [size]``, int8 ``b [size]`` -> int8 ``out [size]``."""
    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        a, c, out = args
        b.store(el.qadd_value(b, b.load(el.at(b, a, gid)), b.load(el.at(b, c, gid)), r), el.at(b, out, gid))
    return Kernel("qadd", ("qadd", size, r.ma, r.mb, r.shift, r.lo, r.hi), ("i8", "i8", "i8"), (size,) * 3, size,
                  body)


def rescale_kernel(size: int, shift: int, lo: int, hi: int) -> Kernel:
    """Rescale (QMul, QClip): int8 ``x [size]``, int32 ``multiplier [size]`` -> int8 ``out [size]``."""
    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        x, mult, out = args
        v = el.rescale_value(b, b.load(el.at(b, x, gid)), b.load(el.at(b, mult, gid)), shift, lo, hi)
        b.store(v, el.at(b, out, gid))
    return Kernel("rescale", ("rescale", size, shift, lo, hi), ("i8", "i32", "i8"), (size,) * 3, size, body)


def concat_kernel(outer: int, length: int, inner: int, total: int, offset: int, multiplier: int,
                  shift: int) -> Kernel:
    """One QConcat input rescaled into its slice of the output: int8 ``x [outer, length, inner]`` -> int8 ``out
    [outer, total, inner]`` at ``[:, offset:offset+length, :]`` (the concatenation axis is the middle one)."""
    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        x, out = args
        i, j, k = _split(b, gid, (outer, length, inner))
        v = el.rescale_value(b, b.load(el.at(b, x, gid)), el.const(multiplier, I32), shift, -128, 127)
        b.store(v, el.at(b, out, el.index(b, (i, total * inner), (b.add(j, el.const(offset)), inner), (k, 1))))
    return Kernel("concat", ("concat", outer, length, inner, total, offset, multiplier, shift), ("i8", "i8"),
                  (outer * length * inner, outer * total * inner), outer * length * inner, body)


def pool_kernel(kind: str, planes: int, hw: Sequence[int], out_hw: Sequence[int], kernel: Sequence[int],
                strides: Sequence[int], pads: Sequence[int], include_pad: bool) -> Kernel:
    """Max (``kind`` 'max') or average ('avg') pooling, one thread per output: int8 ``x [planes, H, W]`` -> int8
    ``out [planes, OH, OW]`` (:func:`.elements.pool_value`)."""
    hw_t, out_t, k_t = tuple(int(v) for v in hw), tuple(int(v) for v in out_hw), tuple(int(v) for v in kernel)
    s_t, p_t = tuple(int(v) for v in strides), tuple(int(v) for v in pads)

    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        x, out = args
        p, oh, ow = _split(b, gid, (planes,) + out_t)
        v = el.pool_value(b, kind, x, p, oh, ow, hw=hw_t, kernel=k_t, strides=s_t, pads=p_t, include_pad=include_pad)
        b.store(v, el.at(b, out, gid))
    n_out = planes * out_t[0] * out_t[1]
    return Kernel("pool", ("pool", kind, planes, hw_t, out_t, k_t, s_t, p_t, bool(include_pad)), ("i8", "i8"),
                  (planes * hw_t[0] * hw_t[1], n_out), n_out, body)


def pad_kernel(shape: Sequence[int], pads: Sequence[int], value: int) -> Kernel:
    """Constant padding of an int8 tensor of any rank, one thread per output element; ``pads`` in ONNX order (the
    begins of every axis, then the ends)."""
    rank = len(shape)
    begins = [int(p) for p in pads[:rank]]
    out_shape = tuple(int(d) + int(pads[i]) + int(pads[i + rank]) for i, d in enumerate(shape))
    strides = [prod(shape[i + 1:]) for i in range(rank)]
    if not -128 <= value <= 127:
        raise KernelError(f"an int8 tensor is padded with a value in [-128, 127], not {value}")

    def body(b: ir.IRBuilder, args: Sequence[ir.Value], gid: ir.Value) -> None:
        x, out = args
        inside: Any = ir.Constant(ir.IntType(1), 1)
        terms = []
        for axis, o in enumerate(_split(b, gid, out_shape)):
            i = b.sub(o, el.const(begins[axis]))
            ok = b.and_(b.icmp_signed(">=", i, el.const(0)), b.icmp_signed("<", i, el.const(shape[axis])))
            inside = b.and_(inside, ok)
            terms.append((i, strides[axis]))
        k = b.select(inside, el.index(b, *terms), el.const(0))
        b.store(b.select(inside, b.load(el.at(b, x, k)), el.const(value, I8)), el.at(b, out, gid))
    return Kernel("pad", ("pad", tuple(int(d) for d in shape), tuple(int(p) for p in pads), value), ("i8", "i8"),
                  (prod(shape), prod(out_shape)), prod(out_shape), body)
