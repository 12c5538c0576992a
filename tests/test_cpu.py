"""The llvmlite CPU kernels (compiler/kernels/cpu.py): bit-exact with the integer reference (compiler/qops.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vta.compiler import qops
from vta.compiler.frontend import zoo
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.ir import AddRequant, GraphError, Requant
from vta.compiler.kernels import cpu


def _rand8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31), groups=st.sampled_from([1, 3]), k=st.integers(1, 3), stride=st.integers(1, 2),
       pads=st.tuples(*[st.integers(0, 2)] * 4))
def test_conv_matches_reference(seed, groups, k, stride, pads):
    rng = np.random.default_rng(seed)
    x = _rand8(rng, (2, 6, 7, 6))
    w = _rand8(rng, (6, 6 // groups, k, k))
    b = rng.integers(-(2**31), 2**31, 6).astype(np.int32)          # large biases exercise 32-bit wrap-around
    got = cpu.conv2d_acc(x, w, b, (stride, stride), pads, groups)
    np.testing.assert_array_equal(got, qops.conv2d_acc(x, w, b, (stride, stride), pads, groups))
    r = Requant(rng.integers(1, 32768, 6), rng.integers(0, 32, 6), lo=-100, hi=90)
    np.testing.assert_array_equal(cpu.qconv2d(x, w, b, r, (stride, stride), pads, groups),
                                  qops.qconv2d(x, w, b, r, (stride, stride), pads, groups))


def test_dense_requant_add_rescale_clip():
    rng = np.random.default_rng(4)
    x, w = _rand8(rng, (3, 70)), _rand8(rng, (9, 70))
    b = rng.integers(-(2**20), 2**20, 9).astype(np.int32)
    r = Requant(rng.integers(1, 32768, 9), rng.integers(0, 32, 9))
    np.testing.assert_array_equal(cpu.dense_acc(x, w, b), qops.dense_acc(x, w, b))
    np.testing.assert_array_equal(cpu.qdense(x, w, b, r), qops.qdense(x, w, b, r))
    a, c = _rand8(rng, (1, 4, 5, 5)), _rand8(rng, (1, 4, 5, 5))
    ar = AddRequant(ma=20000, mb=32767, shift=15, lo=0, hi=127)
    np.testing.assert_array_equal(cpu.qadd(a, c, ar), qops.qadd(a, c, ar))
    m = rng.integers(-32768, 32768, (1, 4, 1, 1))
    np.testing.assert_array_equal(cpu.rescale(a, m, 9), qops.rescale(a, m, 9))
    np.testing.assert_array_equal(cpu.rescale(a, 3, 0), qops.rescale(a, 3, 0))
    np.testing.assert_array_equal(cpu.qclip(a, 0, 48), np.clip(a, 0, 48))
    with pytest.raises(ValueError, match=r"QAdd operands have shapes \(1, 4, 5, 5\) and \(4, 5, 5\)"):
        cpu.qadd(a, c[0], ar)
    with pytest.raises(ValueError, match=r"Dense input has 70 features but weights \(9, 69\) expect 69"):
        cpu.dense_acc(x, w[:, :69], b)


@pytest.mark.parametrize("kernel,strides,pads,include", [((3, 3), (2, 2), (1, 1, 1, 1), False),
                                                         ((2, 3), (1, 2), (0, 1, 1, 0), False),
                                                         ((3, 3), (1, 1), (1, 1, 1, 1), True)])
def test_pools(kernel, strides, pads, include):
    x = _rand8(np.random.default_rng(5), (2, 3, 7, 8))
    np.testing.assert_array_equal(cpu.maxpool(x, kernel, strides, pads), qops.maxpool(x, kernel, strides, pads))
    np.testing.assert_array_equal(cpu.avgpool(x, kernel, strides, pads, include),
                                  qops.avgpool(x, kernel, strides, pads, include))
    np.testing.assert_array_equal(cpu.global_avgpool(x), qops.global_avgpool(x))


def test_float_boundary_ops():
    rng = np.random.default_rng(6)
    f = (rng.standard_normal((2, 3, 4, 5)) * 4).astype(np.float32)
    f[0, 0, 0, :3] = [0.25, 0.75, -0.25]                  # halves: rint rounds to even, like numpy
    np.testing.assert_array_equal(cpu.quantize(f, 0.5), qops.quantize(f, 0.5))
    np.testing.assert_array_equal(cpu.quantize(f, 0.0137), qops.quantize(f, 0.0137))
    x = _rand8(rng, (2, 3, 4, 5))
    np.testing.assert_array_equal(cpu.dequantize(x, 0.0137), qops.dequantize(x, 0.0137))
    got = cpu.softmax(x, 0.05, axis=1)
    np.testing.assert_allclose(got, qops.softmax(x, 0.05, axis=1), rtol=1e-6, atol=0)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=1e-6)


def test_one_qadd_kernel_serves_every_requantization_of_a_size():
    """A QAdd's constants are arguments of its kernel, not part of it: a graph of thousands of adds (an unrolled
    recurrent network) compiles one kernel per size, and each add still equals qops'."""
    rng = np.random.default_rng(9)
    a, c = _rand8(rng, (3, 37)), _rand8(rng, (3, 37))
    cpu.qadd(a, c, AddRequant(ma=1, mb=1, shift=0))
    before = cpu.cache_info()
    for ma, mb, shift, lo, hi in [(20000, 32767, 15, 0, 127), (1, 3, 1, -128, 127), (32767, 1, 31, -5, 5),
                                  (12345, 23456, 20, -128, 0)]:
        r = AddRequant(ma=ma, mb=mb, shift=shift, lo=lo, hi=hi)
        np.testing.assert_array_equal(cpu.qadd(a, c, r), qops.qadd(a, c, r))
    assert cpu.cache_info() == before


def test_kernels_are_cached_per_shape():
    x = _rand8(np.random.default_rng(7), (1, 2, 5, 5))
    cpu.maxpool(x, (2, 2), (2, 2), (0, 0, 0, 0))
    before = cpu.cache_info()
    cpu.maxpool(x + 1, (2, 2), (2, 2), (0, 0, 0, 0))
    assert cpu.cache_info() == before
    cpu.maxpool(x, (3, 3), (2, 2), (0, 0, 0, 0))
    assert cpu.cache_info() == before + 1


@pytest.mark.parametrize("name", ["tiny_cnn", "mini_resnet"])
def test_cpu_target_is_bit_exact(name):
    g = import_onnx(zoo.build_model(name))
    rng = np.random.default_rng(8)
    q = quantize(g, {"input": rng.standard_normal((4,) + g.shape("input")[1:]).astype(np.float32)})
    x = rng.standard_normal(g.shape("input")).astype(np.float32)
    got = cpu.run_cpu(q, {"input": x}, keep_all=True)
    ref = qops.run_reference(q, {"input": x}, keep_all=True)
    assert set(got) == set(ref)
    for tensor in ref:
        if q.tensors[tensor].dtype != "float32" or tensor == "input":
            np.testing.assert_array_equal(got[tensor], ref[tensor], err_msg=tensor)
    np.testing.assert_allclose(got["output"], ref["output"], rtol=1e-6)


def test_run_errors():
    g = import_onnx(zoo.build_model("tiny_cnn"))
    q = quantize(g, {"input": np.zeros((1, 1, 8, 8), np.float32)})
    with pytest.raises(ValueError, match=r"Input 'input' has shape \(8, 8\); graph 'tiny_cnn_int8' expects"):
        cpu.run_cpu(q, {"input": np.zeros((8, 8), np.float32)})
    q.nodes[1].op = "QFancy"
    with pytest.raises(GraphError, match="Node 'conv_3' has op 'QFancy', which the CPU backend does not implement"):
        cpu.run_cpu(q, {"input": np.zeros((1, 1, 8, 8), np.float32)})


@pytest.mark.slow
def test_resnet18_cpu_target_bit_exact():
    g = import_onnx(zoo.build_model("resnet18"))
    rng = np.random.default_rng(9)
    q = quantize(g, {"input": rng.standard_normal((2, 3, 224, 224)).astype(np.float32)})
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.testing.assert_array_equal(cpu.run_cpu(q, {"input": x})["output"], qops.run_reference(q, {"input": x})["output"])


def test_object_code_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    build = lambda: cpu._build_rescale(10, 2, -128, 127)         # noqa: E731
    x = np.arange(-5, 5, dtype=np.int8)
    m = np.full(10, 3, np.int32)
    results = []
    for _ in range(2):
        jit = cpu._Jit()                                         # a fresh engine, as in a new process
        fn = jit.compile(*build())
        out = np.empty(10, np.int8)
        cpu._call(fn, x, m, out)
        results.append((out.tolist(), jit.disk_hits))
    expected = qops.rescale(x, m, 2).tolist()
    assert results == [(expected, 0), (expected, 1)]
    assert len(list((tmp_path / "jit").glob("*.o"))) == 1


def test_a_corrupted_cached_object_is_recompiled(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    build = lambda: cpu._build_rescale(12, 3, -128, 127)         # noqa: E731
    x = np.arange(-6, 6, dtype=np.int8)
    m = np.full(12, 5, np.int32)
    expected = qops.rescale(x, m, 3).tolist()

    def run():
        jit = cpu._Jit()                                         # a fresh engine, as in a new process
        out = np.empty(12, np.int8)
        cpu._call(jit.compile(*build()), x, m, out)
        return out.tolist(), jit.disk_hits

    assert run() == (expected, 0)
    [path] = (tmp_path / "jit").glob("*.o")
    good = path.read_bytes()
    for damaged in (good[:len(good) // 2],                                        # truncated
                    good[:200] + bytes(b ^ 0x5A for b in good[200:400]) + good[400:],  # corrupted, same size
                    good[len(cpu._OBJ_MAGIC) + 65:]):                              # no header
        path.write_bytes(damaged)
        caplog.clear()
        with caplog.at_level("WARNING", logger="vta"):
            assert run() == (expected, 0), "recompiled, never handed to LLVM"
        assert caplog.messages == [f"the cached JIT object code {path} is damaged ({len(damaged)} bytes, its hash "
                                   "does not match); removing it and compiling the kernel again"]
        assert path.read_bytes() == good, "the recompiled object replaced the damaged one"
    assert run() == (expected, 1)


def test_lut_matches_reference():
    rng = np.random.default_rng(5)
    x = np.arange(-128, 128, dtype=np.int8).reshape(2, 8, 16)
    table = _rand8(rng, (256,))
    np.testing.assert_array_equal(cpu.lut(x, table), qops.lut(x, table))


def test_pair_lut_matches_reference_on_every_pair_and_broadcasts():
    rng = np.random.default_rng(6)
    table = _rand8(rng, (256, 256))
    a, b = np.meshgrid(np.arange(-128, 128), np.arange(-128, 128), indexing="ij")
    np.testing.assert_array_equal(cpu.lut2(a.astype(np.int8), b.astype(np.int8), table),
                                  qops.lut2(a.astype(np.int8), b.astype(np.int8), table))
    a, b = _rand8(rng, (2, 6, 16)), _rand8(rng, (2, 6, 1))
    np.testing.assert_array_equal(cpu.lut2(a, b, table), qops.lut2(a, b, table))
