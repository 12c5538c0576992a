#!/usr/bin/env python3
# Tutorial 1: getting started. A config, one GEMM written instruction by instruction with the ProgramBuilder, run
# on the functional simulator (fsim, the spec) and on the RTL (tsim, the generated Verilog in Verilator), and the
# counters read back.
#
# Run it:   python docs/tutorials/01_getting_started.py            (about 2 s, plus the first Verilator build)
#           python docs/tutorials/01_getting_started.py --no-rtl   (fsim only: no C++ compiler needed)
#
# What you need to know first: the accelerator multiplies int8 matrices in fixed-size blocks. With the default
# config one GEMM micro-op computes a BATCH x BLOCK_IN row times a BLOCK_IN x BLOCK_OUT block (1 x 16 times
# 16 x 16: 256 MACs) into int32 accumulators; an ALU then turns the accumulators back into int8 (shift, clip).
# Data moves between DRAM and four on-chip buffers (inp, wgt, acc/out, uop) with LOAD and STORE instructions, and
# four modules (fetch, load, compute, store) run in parallel, ordered by dependency tokens.
from __future__ import annotations

import argparse
import sys

import numpy as np

from vta.backend import get_backend
from vta.config import MEM_INP, MEM_OUT, MEM_WGT, VTAConfig
from vta.gemm import pack_inp, pack_wgt, requantize, unpack_out
from vta.isa import ALU_MAX, ALU_MIN, ALU_SHR, Uop
from vta.program import Program, ProgramBuilder


def build_gemm(cfg: VTAConfig, a: np.ndarray, b: np.ndarray, shift: int) -> Program:
    """C = clip(A @ B >> shift) for one tile: A (m x k) and B (k x n) int8, everything fits the buffers at once."""
    m, k = a.shape
    n = b.shape[1]
    mb, kb, nb = m // cfg.batch, k // cfg.block_in, n // cfg.block_out   # sizes in blocks
    bld = ProgramBuilder(cfg)
    # 1. DRAM: the operands in the accelerator's packed layouts (vta.gemm's helpers), and room for the result.
    a_dram = bld.alloc("A", pack_inp(a, cfg))
    b_dram = bld.alloc("B", pack_wgt(b, cfg))
    c_dram = bld.alloc("C", (mb, nb, cfg.batch, cfg.block_out), np.int8)
    # 2. Micro-ops: the inner body of the GEMM. Uop(dst, src, wgt) = acc[dst] += inp[src] x wgt[wgt]. Here one
    #    micro-op per k block; the two loops of the GEMM instruction below walk the m and n blocks by adding
    #    factors to these indices. Two more micro-ops: one to reset, one for the ALU (acc[dst] op= acc[src]).
    gemm_uops = [Uop(0, j, j) for j in range(kb)]
    reset_uop, alu_uop = len(gemm_uops), len(gemm_uops) + 1
    bld.load_uops(bld.uop_kernel("uops", gemm_uops + [Uop(0, 0, 0), Uop(0, 0, 0)]))
    # 3. Loads: A to the inp buffer (mb rows of kb blocks), B to the wgt buffer (nb rows of kb blocks).
    #    Addresses are in elements of each buffer; elem_addr converts a DRAM allocation to those units.
    bld.load(MEM_INP, sram_base=0, dram_base=bld.elem_addr(a_dram, MEM_INP), y_size=mb, x_size=kb)
    bld.load(MEM_WGT, sram_base=0, dram_base=bld.elem_addr(b_dram, MEM_WGT), y_size=nb, x_size=kb)
    # 4. Tokens: the compute module must not read the buffers before the loads are done.
    bld.dep_push("load", "compute")
    bld.dep_pop("load", "compute")
    # 5. Compute: reset the accumulators, then the GEMM. iter_out walks m blocks, iter_in walks n blocks; the factors
    #    say how far each index moves per iteration (acc row = m * nb + n, inp row = m * kb, wgt row = n * kb).
    loops = dict(iter_out=mb, iter_in=nb, dst_factor_out=nb, dst_factor_in=1)
    bld.gemm(uop_bgn=reset_uop, uop_end=reset_uop + 1, reset=True, **loops)
    bld.gemm(uop_bgn=0, uop_end=kb, src_factor_out=kb, wgt_factor_in=kb, **loops)
    # 6. Requantize in place with the ALU: arithmetic shift right, then clip to int8's range.
    for op, imm in ((ALU_SHR, shift), (ALU_MIN, 127), (ALU_MAX, -128)):
        bld.alu(op, uop_bgn=alu_uop, uop_end=alu_uop + 1, use_imm=True, imm=imm, **loops)
    # 7. Store the int8 results after compute says so, and finish (the builder appends FINISH).
    bld.dep_push("compute", "store")
    bld.dep_pop("compute", "store")
    bld.store(sram_base=0, dram_base=bld.elem_addr(c_dram, MEM_OUT), y_size=mb, x_size=nb)
    return bld.finish()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Tutorial 1: a GEMM on fsim and on the RTL")
    parser.add_argument("--no-rtl", action="store_true", help="skip the Verilator run")
    args = parser.parse_args(argv)

    # A config: VTAConfig() is VTA's default design (the same as `vta config show`). A TOML file with the same keys
    # loads with VTAConfig.from_dict(tomllib.load(...)); every derived size is a property.
    cfg = VTAConfig()
    print(f"config {cfg.name}: {cfg.batch}x{cfg.block_in} x {cfg.block_in}x{cfg.block_out} per micro-op, "
          f"{cfg.macs_per_cycle} MACs/cycle, inp buffer {cfg.inp_depth} entries")

    rng = np.random.default_rng(0)
    m, k, n, shift = 4, 64, 32, 8
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    expected = requantize(a.astype(np.int32) @ b.astype(np.int32), shift)   # the numpy reference
    program = build_gemm(cfg, a, b, shift)
    print(f"program: {len(program.insns)} instructions, {program.dram.size} bytes of DRAM")

    # Run on the functional simulator. Every backend returns a RunResult: the final DRAM image and statistics.
    fsim = get_backend("fsim").run(program)
    c_fsim = unpack_out(fsim.read(program, "C"), m, n)
    assert np.array_equal(c_fsim, expected), "fsim disagrees with numpy"
    print(f"fsim: result equals numpy; {fsim.stats['gemm_uops']} GEMM micro-ops, {fsim.stats['macs']} MACs, "
          f"{fsim.stats['alu_uops']} ALU micro-ops (fsim counts events, not cycles: cycles={fsim.cycles})")
    result = {"cfg": cfg, "program": program, "expected": expected, "fsim": fsim, "c_fsim": c_fsim}
    if args.no_rtl:
        return result

    # Run on the RTL. The first call builds the Verilator model of this config (a minute or two, cached after that
    # under ~/.cache/vta-lab/tsim). By default tsim also runs fsim first and compares DRAM and counters with it.
    tsim = get_backend("tsim").run(program)
    c_tsim = unpack_out(tsim.read(program, "C"), m, n)
    assert np.array_equal(c_tsim, expected), "the RTL disagrees with numpy"
    counters = tsim.counters or {}
    print(f"tsim: result equals numpy; {tsim.cycles} cycles")
    # The hardware counters: total cycles, and per module the cycles it was busy, waited for a token, or waited
    # for memory (vta.counters names every one with its unit and meaning).
    for module in ("fetch", "load", "compute", "store"):
        print(f"  {module:8s} busy {counters[f'{module}_busy']:5d}  wait_token {counters[f'{module}_wait_token']:5d}"
              f"  wait_mem {counters[f'{module}_wait_mem']:5d}  instructions {counters[f'{module}_insns']}")
    print(f"  useful MACs per cycle: {fsim.stats['macs'] / counters['cycles']:.1f} of {cfg.macs_per_cycle}")
    result.update(tsim=tsim, c_tsim=c_tsim)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
