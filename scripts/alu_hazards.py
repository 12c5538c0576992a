"""Count a compiled model's back-to-back dependent ALU micro-ops: what a stall would cost the ALU_PIPELINE knob.

    python3 scripts/alu_hazards.py --config configs/timing/small1x4_ap.toml [MODEL]     (default MODEL: resnet18)

Compiles MODEL for the config with every layer on the accelerator (``policy="accel"``), replays each layer's program's
micro-op loads and expands each ALU instruction's loops, and counts the micro-ops that read (as acc[dst], or as
acc[src] without the immediate) the entry the micro-op just before them writes. With ALU_PIPELINE such a micro-op gets
the result forwarded (no cycle); a design that stalled instead would lose one cycle for each (docs/hardware.md,
"Codesign knobs").
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from vta.compiler.pipeline import compile_model
from vta.config import MEM_UOP, VTAConfig, load_config
from vta.isa import Alu, Load, decode_uops
from vta.program import Program


def dependent_pairs(program: Program) -> tuple[int, int]:
    """``(pairs, alu_uops)``: the ALU micro-ops of ``program`` reading the acc entry the micro-op just before them in
    the same instruction writes, and all its ALU micro-ops (loop iterations)."""
    cfg = program.cfg
    dst_buf = np.zeros(cfg.uop_depth, np.int64)
    src_buf = np.zeros(cfg.uop_depth, np.int64)
    word = {4: np.uint32, 8: np.uint64}[cfg.uop_bytes]
    pairs = uops = 0
    for insn in program.insns:
        if isinstance(insn, Load) and insn.mem == MEM_UOP and insn.x_size:
            for row in range(insn.y_size):  # micro-op loads have no padding
                base = (insn.dram_base + row * insn.x_stride) * cfg.uop_bytes
                dst, src, _ = decode_uops(program.dram[base:base + insn.x_size * cfg.uop_bytes].view(word), cfg)
                at = insn.sram_base + row * insn.x_size
                dst_buf[at:at + insn.x_size] = dst
                src_buf[at:at + insn.x_size] = src
        elif isinstance(insn, Alu) and insn.uop_end > insn.uop_bgn and insn.iter_out and insn.iter_in:
            o, i, u = (a.ravel() for a in np.meshgrid(np.arange(insn.iter_out), np.arange(insn.iter_in),
                                                       np.arange(insn.uop_bgn, insn.uop_end), indexing="ij"))
            dst = (dst_buf[u] + o * insn.dst_factor_out + i * insn.dst_factor_in) % cfg.acc_depth
            src = (src_buf[u] + o * insn.src_factor_out + i * insn.src_factor_in) % cfg.acc_depth
            hit = dst[1:] == dst[:-1]
            if not insn.use_imm:
                hit |= src[1:] == dst[:-1]
            pairs += int(hit.sum())
            uops += dst.size
    return pairs, uops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="resnet18", help="zoo name or ONNX file (default resnet18)")
    parser.add_argument("--config", help="accelerator config file (default: VTA's defaults)")
    args = parser.parse_args()
    cfg = load_config(args.config) if args.config else VTAConfig()
    start = time.perf_counter()
    compiled = compile_model(args.model, cfg, policy="accel")
    pairs = uops = 0
    for step in compiled.steps:
        if step.where == "accel":
            p, u = dependent_pairs(step.program)
            pairs, uops = pairs + p, uops + u
    print(f"{args.model} on {cfg.name}: {pairs:,} back-to-back dependent ALU micro-ops of {uops:,} "
          f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
