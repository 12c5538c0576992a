"""A SIMT emulator: the GPU kernels of :mod:`.gpu` run on the host CPU, thread by thread.

:func:`emulator_module` takes a kernel's module from :func:`.gpu.kernel_module` (the kernel function is the same IR
that :func:`.gpu.ptx` compiles for the GPU) and defines its index accessors as loads of three globals
(``tid.x``, ``ctaid.x``, ``ntid.x``), plus a host function ``<kernel>_launch(args..., dims)`` that loops over the
blocks ``0 <= ctaid < dims[0]`` and the threads ``0 <= tid < dims[1]``, setting the globals and calling the kernel.
The module is compiled by the host JIT of :mod:`.cpu` (optimized, cached as object code on disk).

The kernels use no shared memory, barriers or atomics (one thread per output element), so running the threads one
after another is a faithful schedule: the results are those of any GPU schedule. :func:`launch` runs one kernel on
numpy arrays; :class:`SimtDevice` is the device interface of :mod:`.gpu_backend` on host memory.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
from llvmlite import ir

from . import elements as el
from .elements import I32, I64
from .gpu import INDEX_ACCESSORS, Kernel, kernel_module

__all__ = ["emulator_module", "launch", "SimtDevice", "DTYPES"]

DTYPES = {"i8": np.dtype(np.int8), "i32": np.dtype(np.int32), "f32": np.dtype(np.float32)}
"""The numpy dtype of each kernel parameter element type."""


def emulator_module(kernel: Kernel) -> tuple[ir.Module, str, int]:
    """The kernel's module for the host: ``(module, launcher name, launcher argument count)``. The launcher takes
    the kernel's pointer arguments and a pointer to ``int64 dims[2]`` = (blocks, threads per block)."""
    module, fn = kernel_module(kernel)
    regs = {}
    for name in INDEX_ACCESSORS:
        reg = ir.GlobalVariable(module, I32, f"{name}_reg")
        reg.linkage = "internal"
        reg.initializer = el.const(0, I32)
        regs[name] = reg
        accessor = module.get_global(name)
        accessor.linkage = "internal"
        b = ir.IRBuilder(accessor.append_basic_block("entry"))
        b.ret(b.load(reg))
    name = f"{kernel.name}_launch"
    launcher = ir.Function(module, ir.FunctionType(ir.VoidType(), [a.type for a in fn.args] + [I64.as_pointer()]),
                           name)
    b = ir.IRBuilder(launcher.append_basic_block("entry"))
    dims = launcher.args[-1]
    grid, block = b.load(el.at(b, dims, el.const(0))), b.load(el.at(b, dims, el.const(1)))
    b.store(b.trunc(block, I32), regs["vta_ntid_x"])
    with el.loop(b, grid) as cta:
        b.store(b.trunc(cta, I32), regs["vta_ctaid_x"])
        with el.loop(b, block) as tid:
            b.store(b.trunc(tid, I32), regs["vta_tid_x"])
            b.call(fn, launcher.args[:-1])
    b.ret_void()
    return module, name, len(launcher.args)


def _launcher(kernel: Kernel) -> Callable[..., None]:
    from .cpu import _kernel  # the host JIT and its object cache
    return _kernel(("simt",) + kernel.key, lambda: emulator_module(kernel))


def launch(kernel: Kernel, arrays: Sequence[np.ndarray], *, block: int = 256, grid: int | None = None) -> None:
    """Run ``kernel`` on ``arrays`` (C-contiguous, one per parameter, of its element type; outputs written in place)
    as ``grid`` blocks (default: enough to cover the work) of ``block`` threads."""
    if len(arrays) != len(kernel.params):
        raise ValueError(f"kernel {kernel.name} takes {len(kernel.params)} arrays, not {len(arrays)}")
    for k, (arr, ty, size) in enumerate(zip(arrays, kernel.params, kernel.sizes)):
        if arr.dtype != DTYPES[ty] or not arr.flags.c_contiguous:
            raise TypeError(f"argument {k} of kernel {kernel.name} must be a C-contiguous {DTYPES[ty]} array, not "
                            f"{'a non-contiguous ' if not arr.flags.c_contiguous else ''}{arr.dtype} array")
        if arr.size != size:
            raise ValueError(f"argument {k} of kernel {kernel.name} must hold {size} elements, not {arr.size}")
    if block < 1:
        raise ValueError(f"a block has at least 1 thread, not {block}")
    dims = np.array([kernel.grid(block) if grid is None else grid, block], np.int64)
    _launcher(kernel)(*(a.ctypes.data for a in arrays), dims.ctypes.data)


class SimtDevice:
    """Host memory and the emulator behind the device interface of :mod:`.gpu_backend`: a buffer is a numpy array;
    :meth:`launch` returns the kernel's wall-clock milliseconds on this CPU."""

    name = "simt"
    description = "the SIMT emulator on the host CPU (no CUDA device)"

    def __init__(self, *, block: int = 256) -> None:
        self.block = block

    def upload(self, arr: np.ndarray) -> np.ndarray:
        return np.array(arr, order="C", copy=True)

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
        return np.empty(tuple(shape), dtype)

    def download(self, buf: np.ndarray) -> np.ndarray:
        return buf.copy()

    def view(self, buf: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return buf.reshape(tuple(shape))

    def launch(self, kernel: Kernel, bufs: Sequence[np.ndarray]) -> float:
        start = time.perf_counter()
        launch(kernel, bufs, block=self.block)
        return (time.perf_counter() - start) * 1e3

    def close(self) -> None:
        pass
