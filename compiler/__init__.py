"""vta.compiler: ONNX models to accelerator programs and CPU fallbacks (installed from compiler/)."""
