"""The GPU kernels (compiler/kernels/gpu.py) through the SIMT emulator (compiler/kernels/simt.py), against the integer
reference, and their PTX through ptxas for sm_80 and sm_90."""
from __future__ import annotations

import re
from typing import Callable

import numpy as np
import pytest

from vta.compiler import qops
from vta.compiler.ir import AddRequant, Requant
from vta.compiler.kernels import gpu, simt

RNG = np.random.default_rng(7)


def _i8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape, dtype=np.int8)


def _requant(o: int, lo: int = -128, hi: int = 127) -> Requant:
    return Requant(RNG.integers(1, 32768, o), RNG.integers(0, 32, o), lo, hi)


Case = tuple[gpu.Kernel, list[np.ndarray], np.ndarray]


def _conv(x_shape: tuple, w_shape: tuple, strides: tuple, pads: tuple, groups: int, lo: int = -128) -> Case:
    x, w = _i8(*x_shape), _i8(*w_shape)
    bias = RNG.integers(-30000, 30000, w_shape[0]).astype(np.int32)
    r = _requant(w_shape[0], lo)
    ref = qops.qconv2d(x, w, bias, r, strides, pads, groups)
    kernel = gpu.qconv_kernel(x.shape, w.shape, strides, pads, groups, r.lo, r.hi)
    return kernel, [x, w, bias, r.multiplier.astype(np.int32), r.shift.astype(np.int32)], ref


def _dense(n: int, k: int, o: int) -> Case:
    x, w = _i8(n, k), _i8(o, k)
    bias = RNG.integers(-2**31, 2**31 - 1, o).astype(np.int32)      # large biases: the accumulator wraps
    r = _requant(o, 0, 127)
    kernel = gpu.qdense_kernel(n, k, o, r.lo, r.hi)
    return kernel, [x, w, bias, r.multiplier.astype(np.int32), r.shift.astype(np.int32)], qops.qdense(x, w, bias, r)


def _qadd(shape: tuple) -> Case:
    a, b = _i8(*shape), _i8(*shape)
    r = AddRequant(ma=23000, mb=171, shift=14, lo=0, hi=100)
    return gpu.qadd_kernel(a.size, r), [a, b], qops.qadd(a, b, r)


def _rescale(shape: tuple, shift: int) -> Case:
    x = _i8(*shape)
    m = RNG.integers(-40000, 40000, shape).astype(np.int32)           # negative multipliers too (QMul)
    return gpu.rescale_kernel(x.size, shift, -128, 127), [x, m], qops.rescale(x, m, shift)


def _concat(shapes: list[tuple], axis: int) -> tuple[list[gpu.Kernel], list[np.ndarray], np.ndarray]:
    xs = [_i8(*s) for s in shapes]
    mults, shifts = [300, 1, 77][:len(xs)], [8, 0, 5][:len(xs)]
    ref = qops.qconcat(xs, axis, mults, shifts)
    axis %= ref.ndim
    outer, inner = int(np.prod(ref.shape[:axis])), int(np.prod(ref.shape[axis + 1:]))
    kernels, offset = [], 0
    for x, m, s in zip(xs, mults, shifts):
        kernels.append(gpu.concat_kernel(outer, x.shape[axis], inner, ref.shape[axis], offset, m, s))
        offset += x.shape[axis]
    return kernels, xs, ref


def _pool(kind: str, shape: tuple, kernel: tuple, strides: tuple, pads: tuple, include: bool = False) -> Case:
    x = _i8(*shape)
    if kind == "max":
        ref = qops.maxpool(x, kernel, strides, pads)
    else:
        ref = qops.avgpool(x, kernel, strides, pads, include)
    k = gpu.pool_kernel(kind, shape[0] * shape[1], shape[2:], ref.shape[2:], kernel, strides, pads, include)
    return k, [x], ref


def _convert(kind: str, shape: tuple) -> Case:
    if kind == "quantize":
        x = (RNG.standard_normal(shape) * 3).astype(np.float32)
        x.flat[:4] = [0.05, -0.05, 0.15, 1e9][:x.size]                 # ties round to even, clipping
        return gpu.quantize_kernel(x.size, 0.1), [x], qops.quantize(x, 0.1)
    x = _i8(*shape)
    return gpu.dequantize_kernel(x.size, 0.0137), [x], qops.dequantize(x, 0.0137)


def _pad(shape: tuple, pads: tuple, value: int) -> Case:
    x = _i8(*shape)
    return gpu.pad_kernel(shape, pads, value), [x], qops.pad(x, pads, value)


CASES: dict[str, Callable[[], Case]] = {
    "conv3x3": lambda: _conv((1, 5, 7, 9), (6, 5, 3, 3), (1, 1), (1, 1, 1, 1), 1),
    "conv_strided_asym_pad": lambda: _conv((2, 6, 7, 5), (4, 3, 3, 3), (2, 1), (1, 0, 1, 2), 2, lo=0),
    "conv_depthwise": lambda: _conv((1, 8, 6, 6), (8, 1, 3, 3), (2, 2), (1, 1, 0, 0), 8),
    "conv_1x1_one_element": lambda: _conv((1, 1, 1, 1), (1, 1, 1, 1), (1, 1), (0, 0, 0, 0), 1),
    "dense": lambda: _dense(3, 37, 11),
    "dense_one_element": lambda: _dense(1, 1, 1),
    "qadd": lambda: _qadd((2, 3, 5, 7)),
    "qadd_one_element": lambda: _qadd((1,)),
    "rescale": lambda: _rescale((3, 257), 9),
    "rescale_no_shift": lambda: _rescale((5,), 0),
    "maxpool": lambda: _pool("max", (2, 3, 7, 6), (3, 3), (2, 2), (1, 1, 1, 1)),
    "avgpool": lambda: _pool("avg", (1, 3, 7, 7), (3, 2), (2, 1), (1, 0, 1, 1)),
    "avgpool_include_pad": lambda: _pool("avg", (1, 2, 5, 5), (3, 3), (1, 1), (1, 1, 1, 1), True),
    "global_avgpool": lambda: _pool("avg", (2, 5, 3, 3), (3, 3), (1, 1), (0, 0, 0, 0), True),
    "quantize": lambda: _convert("quantize", (2, 3, 11)),
    "dequantize": lambda: _convert("dequantize", (257,)),
    "pad": lambda: _pad((1, 3, 4, 5), (0, 1, 2, 0, 0, 0, 1, 3), -7),
}


def _run(kernel: gpu.Kernel, inputs: list[np.ndarray], out_like: np.ndarray, block: int,
         out: np.ndarray | None = None) -> np.ndarray:
    if out is None:
        out = np.full(out_like.shape, 99, out_like.dtype)
    simt.launch(kernel, inputs + [out], block=block)
    return out


@pytest.mark.parametrize("block", [1, 7, 32, 256])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_equal_the_reference(name, block):
    kernel, inputs, ref = CASES[name]()
    out = _run(kernel, inputs, ref, block)
    assert out.dtype == ref.dtype
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("axis", [1, 2, -1])
def test_concat_kernels_write_their_slices(axis):
    kernels, xs, ref = _concat([(2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 5)], axis)
    out = np.zeros(ref.shape, np.int8)
    for kernel, x in zip(kernels, xs):
        simt.launch(kernel, [x, out], block=13)
    np.testing.assert_array_equal(out, ref)


def test_threads_beyond_the_work_do_nothing():
    kernel, inputs, ref = CASES["qadd"]()
    out = np.full(ref.shape, 99, np.int8)
    simt.launch(kernel, inputs + [out], block=64, grid=5)       # 320 threads for 210 items
    np.testing.assert_array_equal(out, ref)
    partial = np.full(ref.shape, 99, np.int8)
    simt.launch(kernel, inputs + [partial], block=100, grid=1)  # too few threads: the rest is untouched
    np.testing.assert_array_equal(partial.reshape(-1)[:100], ref.reshape(-1)[:100])
    assert (partial.reshape(-1)[100:] == 99).all()


def test_kernel_grid_covers_the_work():
    kernel = CASES["rescale"]()[0]
    assert kernel.threads == 3 * 257
    assert [kernel.grid(b) for b in (1, 256, 771, 772)] == [771, 4, 1, 1]


def test_launch_checks_its_arrays():
    kernel, inputs, ref = CASES["qadd"]()
    out = np.empty(ref.shape, np.int8)
    with pytest.raises(ValueError, match=r"^kernel qadd takes 3 arrays, not 2$"):
        simt.launch(kernel, inputs)
    with pytest.raises(TypeError, match=r"^argument 1 of kernel qadd must be a C-contiguous int8 array, not int32 "
                                        r"array$"):
        simt.launch(kernel, [inputs[0], inputs[1].astype(np.int32), out])
    with pytest.raises(ValueError, match=r"^argument 2 of kernel qadd must hold 210 elements, not 209$"):
        simt.launch(kernel, inputs + [out.reshape(-1)[:209]])
    with pytest.raises(ValueError, match=r"^a block has at least 1 thread, not 0$"):
        simt.launch(kernel, inputs + [out], block=0)


def test_conv_kernel_rejects_inconsistent_groups():
    with pytest.raises(gpu.KernelError, match=r"^Convolution of 6 input channels with weights \(4, 4, 3, 3\) and "
                                              r"groups=2 is inconsistent"):
        gpu.qconv_kernel((1, 6, 5, 5), (4, 4, 3, 3), (1, 1), (0, 0, 0, 0), 2, -128, 127)


def _function_text(module_text: str, name: str) -> str:
    match = re.search(rf"define [^\n]*@\"?{name}\"?\(.*?\n}}\n", module_text, re.S)
    assert match, f"no definition of {name}"
    return match.group(0)


@pytest.mark.parametrize("name", ["conv_strided_asym_pad", "avgpool", "quantize", "pad"])
def test_emulator_and_ptx_share_the_kernel_ir(name):
    kernel = CASES[name]()[0]
    device, host = str(gpu.ptx_module(kernel)), str(simt.emulator_module(kernel)[0])
    assert _function_text(device, kernel.name) == _function_text(host, kernel.name)
    assert "llvm.nvvm.read.ptx.sreg.tid.x" in device and "nvvm" not in host
    assert '!nvvm.annotations = !{' in device


def test_ptx_reads_the_thread_indices():
    text = gpu.ptx(CASES["qadd"]()[0], "sm_80")
    assert ".target sm_80" in text and ".entry qadd(" in text
    for register in ("%tid.x", "%ctaid.x", "%ntid.x"):
        assert register in text
    with pytest.raises(gpu.KernelError, match=r"^a GPU architecture is named sm_XY \(e.g. sm_80\), not 'ampere'$"):
        gpu.ptx(CASES["qadd"]()[0], "ampere")


PTXAS = gpu.ptxas_path()


@pytest.mark.skipif(PTXAS is None, reason="ptxas not found on PATH or in the nvidia-cuda-nvcc-cu12 wheel "
                                          "(pip install -e '.[gpu]')")
@pytest.mark.parametrize("arch", gpu.ARCHS)
def test_every_kernel_assembles_with_ptxas(arch):
    kernels = [CASES[name]()[0] for name in sorted(CASES)] + _concat([(1, 2, 3), (1, 5, 3)], 1)[0]
    for kernel in kernels:
        cubin = gpu.assemble(gpu.ptx(kernel, arch), arch)
        assert cubin[:4] == b"\x7fELF", kernel.name


@pytest.mark.skipif(PTXAS is None, reason="ptxas not found on PATH or in the nvidia-cuda-nvcc-cu12 wheel")
def test_ptxas_errors_are_reported():
    with pytest.raises(gpu.PtxasError, match=r"^ptxas -arch=sm_80 rejected the kernel \(exit \d+\): "):
        gpu.assemble(".version 7.8\n.target sm_80\n.address_size 64\nnot ptx\n", "sm_80")


def test_missing_ptxas_is_explained(monkeypatch):
    monkeypatch.setattr(gpu, "ptxas_path", lambda: None)
    with pytest.raises(FileNotFoundError, match=r"^ptxas was not found on PATH or in the nvidia-cuda-nvcc-cu12 "
                                                r"wheel; install the gpu extra"):
        gpu.assemble("", "sm_80")
