"""vta-lab: an accelerator codesign lab for a VTA-like int8 GEMM accelerator.

Sub-packages: ``vta.config`` (the design), ``vta.isa`` (instruction set), ``vta.program`` (programs and DRAM images),
``vta.fsim`` (functional simulator, the spec), ``vta.hw`` (Amaranth RTL), ``vta.tsim`` (Verilator co-simulation),
``vta.compiler`` (ONNX to programs). Importing ``vta`` has no side effects.
"""
__version__ = "0.1.0"
