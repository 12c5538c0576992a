"""The CUDA driver API through ctypes on ``libcuda.so.1``: a device, its memory, PTX modules and timed launches.

:func:`probe` says whether a CUDA device can be used here (None) or why not (a sentence starting "no CUDA device").
:class:`CudaDevice` is the device interface of :mod:`.gpu_backend` on a real GPU: buffers are :class:`DeviceBuffer`
(device pointer, shape, dtype) in the device's global memory, kernels are loaded from the PTX of :func:`.gpu.ptx`
for the device's compute capability (at most sm_90, the newest architecture every test assembles for; the driver
compiles PTX for newer devices), and each launch is timed with CUDA events (milliseconds on the device).

The library is opened on first use, never at import. This module has only run where no device exists (the probe
and its messages are tested; the launch path is tested only on a machine with a GPU).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .gpu import Kernel, ptx

__all__ = ["CudaError", "probe", "DeviceBuffer", "CudaDevice"]

_LIB: Any = None
_CC_MAJOR, _CC_MINOR = 75, 76          # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error name."""


def _lib() -> Any:
    """``libcuda.so.1`` (OSError when the driver is not installed)."""
    global _LIB
    if _LIB is None:
        _LIB = ctypes.CDLL("libcuda.so.1")
    return _LIB


def _check(call: str, status: int) -> None:
    if status != 0:
        name = ctypes.c_char_p()
        try:
            _lib().cuGetErrorName(status, ctypes.byref(name))
        except (OSError, AttributeError):
            pass
        raise CudaError(f"the CUDA driver call {call} failed with {(name.value or b'error').decode()} ({status})")


def probe() -> str | None:
    """None when CUDA device 0 can be used, else why not: "no CUDA device: libcuda not found", "... cuInit failed
    with ...", "... the driver reports 0 devices"."""
    try:
        lib = _lib()
    except OSError:
        return "no CUDA device: libcuda not found (libcuda.so.1 is installed with the NVIDIA driver)"
    try:
        _check("cuInit", lib.cuInit(0))
        count = ctypes.c_int()
        _check("cuDeviceGetCount", lib.cuDeviceGetCount(ctypes.byref(count)))
    except CudaError as err:
        return f"no CUDA device: {err}"
    if count.value < 1:
        return "no CUDA device: the driver reports 0 devices"
    return None


@dataclass(frozen=True)
class DeviceBuffer:
    """``shape`` elements of ``dtype`` at device address ``ptr`` (C order); views share ``ptr``."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class CudaDevice:
    """Device ``ordinal``'s primary context, its memory and the kernels loaded on it."""

    name = "gpu"

    def __init__(self, *, ordinal: int = 0, block: int = 256) -> None:
        lib = _lib()
        _check("cuInit", lib.cuInit(0))
        self.lib, self.block = lib, block
        self.dev = ctypes.c_int()
        _check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(self.dev), ordinal))
        self.ctx = ctypes.c_void_p()
        _check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev))
        _check("cuCtxSetCurrent", lib.cuCtxSetCurrent(self.ctx))
        major, minor = ctypes.c_int(), ctypes.c_int()
        _check("cuDeviceGetAttribute", lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, self.dev))
        _check("cuDeviceGetAttribute", lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, self.dev))
        self.arch = f"sm_{min(major.value * 10 + minor.value, 90)}"
        label = ctypes.create_string_buffer(256)
        _check("cuDeviceGetName", lib.cuDeviceGetName(label, 256, self.dev))
        self.description = f"{label.value.decode()} (compute capability {major.value}.{minor.value})"
        self.functions: dict[tuple, ctypes.c_void_p] = {}
        self.allocations: list[int] = []
        self.events = (ctypes.c_void_p(), ctypes.c_void_p())
        for event in self.events:
            _check("cuEventCreate", lib.cuEventCreate(ctypes.byref(event), 0))

    def empty(self, shape: Sequence[int], dtype: np.dtype) -> DeviceBuffer:
        buf = DeviceBuffer(0, tuple(int(d) for d in shape), np.dtype(dtype))
        ptr = ctypes.c_uint64()
        _check("cuMemAlloc", self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(buf.nbytes, 1))))
        self.allocations.append(ptr.value)
        return DeviceBuffer(ptr.value, buf.shape, buf.dtype)

    def upload(self, arr: np.ndarray) -> DeviceBuffer:
        host = np.ascontiguousarray(arr)
        buf = self.empty(host.shape, host.dtype)
        _check("cuMemcpyHtoD", self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(buf.ptr), ctypes.c_void_p(host.ctypes.data),
                                                         ctypes.c_size_t(buf.nbytes)))
        return buf

    def download(self, buf: DeviceBuffer) -> np.ndarray:
        host = np.empty(buf.shape, buf.dtype)
        _check("cuMemcpyDtoH", self.lib.cuMemcpyDtoH_v2(ctypes.c_void_p(host.ctypes.data), ctypes.c_uint64(buf.ptr),
                                                         ctypes.c_size_t(buf.nbytes)))
        return host

    def view(self, buf: DeviceBuffer, shape: Sequence[int]) -> DeviceBuffer:
        return DeviceBuffer(buf.ptr, tuple(int(d) for d in shape), buf.dtype)

    def _function(self, kernel: Kernel) -> ctypes.c_void_p:
        fn = self.functions.get(kernel.key)
        if fn is None:
            module, fn = ctypes.c_void_p(), ctypes.c_void_p()
            text = ptx(kernel, self.arch).encode() + b"\0"
            _check("cuModuleLoadData", self.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(text)))
            _check("cuModuleGetFunction", self.lib.cuModuleGetFunction(ctypes.byref(fn), module,
                                                                       kernel.name.encode()))
            self.functions[kernel.key] = fn
        return fn

    def launch(self, kernel: Kernel, bufs: Sequence[DeviceBuffer]) -> float:
        """Run ``kernel`` on ``bufs`` and return its time on the device in milliseconds (CUDA events)."""
        fn = self._function(kernel)
        ptrs = [ctypes.c_uint64(b.ptr) for b in bufs]
        params = (ctypes.c_void_p * len(ptrs))(*(ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in ptrs))
        start, stop = self.events
        _check("cuEventRecord", self.lib.cuEventRecord(start, None))
        _check("cuLaunchKernel", self.lib.cuLaunchKernel(fn, kernel.grid(self.block), 1, 1, self.block, 1, 1, 0,
                                                         None, params, None))
        _check("cuEventRecord", self.lib.cuEventRecord(stop, None))
        _check("cuEventSynchronize", self.lib.cuEventSynchronize(stop))
        ms = ctypes.c_float()
        _check("cuEventElapsedTime", self.lib.cuEventElapsedTime(ctypes.byref(ms), start, stop))
        return float(ms.value)

    def close(self) -> None:
        """Free every allocation and release the context."""
        for ptr in self.allocations:
            self.lib.cuMemFree_v2(ctypes.c_uint64(ptr))
        self.allocations.clear()
        self.lib.cuDevicePrimaryCtxRelease(self.dev)
