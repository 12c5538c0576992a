"""Per-operator time of the GPU fallback against the CPU fallback, and ptxas on every kernel a model uses.

Usage: ``python3 scripts/bench_gpu.py [--model mini_resnet] [--repeat 3]``

Every node of the model's quantized graph runs on the CPU fallback (the llvmlite kernels) and on the gpu backend:
on a CUDA device when one is present (kernel time from CUDA events, milliseconds on the device), else in the SIMT
emulator on this CPU (wall clock; this measures the emulator, not a GPU) and the script says so. Each output is
checked bit for bit against the integer reference. Times are the best of ``--repeat`` runs after a warm-up run (JIT
compilation excluded). ONNX Runtime's time for the whole float model is printed when it is installed. Finally each
kernel's PTX is assembled with ptxas for sm_80 and sm_90 (cubin bytes), or the script says ptxas is missing.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from vta.compiler import qops
from vta.compiler.kernels import gpu
from vta.compiler.kernels.cpu_backend import CpuBackend
from vta.compiler.kernels.gpu_backend import GpuBackend, device_reason
from vta.compiler.pipeline import compile_model, random_inputs
from vta.config import VTAConfig


def _time_nodes(backend: Any, graph: Any, values: dict[str, np.ndarray], repeat: int) -> dict[str, float]:
    """Best wall-clock milliseconds of each node on ``backend`` (inputs from the reference's ``values``)."""
    best: dict[str, float] = {}
    for _ in range(repeat + 1):                                  # the first run compiles the kernels
        for node in graph.nodes:
            args = {t: values[t] for t in node.inputs if t in values}
            start = time.perf_counter()
            out = backend.run_node(graph, node, args)
            ms = (time.perf_counter() - start) * 1e3
            if not np.array_equal(out, values[node.outputs[0]]):
                raise SystemExit(f"{node.name} ({node.op}) on {backend.name} differs from the integer reference")
            best[node.name] = min(best.get(node.name, ms), ms)
    return best


def _device_ms(backend: GpuBackend, repeat: int) -> dict[str, float]:
    """Best device milliseconds per node (sum of its kernels per run), from the backend's CUDA-event times."""
    per_run: dict[str, list[float]] = {}
    for node, _, ms in backend.kernel_ms:
        per_run.setdefault(node, []).append(ms)
    out = {}
    for node, times in per_run.items():
        k = len(times) // (repeat + 1)
        out[node] = min(sum(times[i * k:(i + 1) * k]) for i in range(1, repeat + 1)) if k else float("nan")
    return out


def _onnxruntime_ms(model: str, inputs: dict[str, np.ndarray], repeat: int) -> float | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from vta.compiler.frontend import zoo
    session = ort.InferenceSession(zoo.build_model(model).SerializeToString(), providers=ort.get_available_providers())
    session.run(None, inputs)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, inputs)
        best = min(best, (time.perf_counter() - start) * 1e3)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mini_resnet", help="a model zoo name (default: mini_resnet)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per node after the warm-up (default: 3)")
    args = parser.parse_args()
    reason = device_reason()
    compiled = compile_model(args.model, VTAConfig(), calib=1)
    graph = compiled.graph
    float_inputs = random_inputs(graph, 0)
    values = qops.run_reference(graph, float_inputs, keep_all=True)
    gpu_backend = GpuBackend(emulate=reason is not None)
    print(f"model {args.model}: {len(graph.nodes)} nodes; gpu backend on {gpu_backend.description}")
    if reason is not None:
        print(f"NO GPU WAS PRESENT ({reason}): the 'gpu' column is the SIMT emulator's wall clock on this CPU, "
              f"not a GPU's time")
    cpu_ms = _time_nodes(CpuBackend(), graph, values, args.repeat)
    gpu_wall = _time_nodes(gpu_backend, graph, values, args.repeat)
    gpu_ms = gpu_wall if reason is not None else {**gpu_wall, **_device_ms(gpu_backend, args.repeat)}
    print(f"{'node':<28} {'op':<14} {'cpu ms':>9} {'gpu ms':>9} {'where':>6}")
    for node in graph.nodes:
        where = "host" if node.op == "Softmax" else ("simt" if reason else "gpu")
        print(f"{node.name[:28]:<28} {node.op:<14} {cpu_ms[node.name]:>9.3f} {gpu_ms[node.name]:>9.3f} {where:>6}")
    print(f"{'total':<43} {sum(cpu_ms.values()):>9.3f} {sum(gpu_ms.values()):>9.3f}")
    print("every node's output equals the integer reference bit for bit on both backends")
    print(f"transfers (all runs): {gpu_backend.transfers}")
    ort_ms = _onnxruntime_ms(args.model, float_inputs, args.repeat)
    print("onnxruntime (float model, whole):", "not installed" if ort_ms is None else f"{ort_ms:.3f} ms")
    tool = gpu.ptxas_path()
    if tool is None:
        print("ptxas: not found on PATH or in the nvidia-cuda-nvcc-cu12 wheel; PTX was not assembled")
        return 0
    kernels = list(gpu_backend.kernels.values())
    print(f"ptxas ({tool}) on the {len(kernels)} kernels the model used:")
    for arch in gpu.ARCHS:
        start = time.perf_counter()
        sizes = [len(gpu.assemble(gpu.ptx(kernel, arch), arch)) for kernel in kernels]
        print(f"  {arch}: all {len(sizes)} assembled, cubins {min(sizes)}..{max(sizes)} bytes, "
              f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
