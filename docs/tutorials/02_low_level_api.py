#!/usr/bin/env python3
# Tutorial 2: the low-level API. A blocked matrix multiply written with explicit loads, micro-op kernels and
# dependency tokens, single- and double-buffered, compared cycle for cycle on the RTL, and disassembled.
#
# Run it:   python docs/tutorials/02_low_level_api.py              (a few seconds once the Verilator model is built)
#           python docs/tutorials/02_low_level_api.py --no-rtl     (fsim only)
#
# Tutorial 1 loaded the whole problem at once. Real layers do not fit the buffers, so they are cut into tiles:
# here the reduction dimension K is cut into tiles of TK blocks, and the N dimension into tiles of one block. For
# every N tile the accumulators are reset, each K tile of A and B is loaded and multiplied in, then the ALU
# requantizes and the store module writes the tile back.
#
# The four modules run concurrently; tokens order them. A token is pushed by one module into a queue towards a
# neighbour and popped by the neighbour before it proceeds. The queues are load->compute, compute->load,
# compute->store and store->compute. The rules used below:
#   load -> compute   "this tile's operands are in the buffer"      (RAW: compute waits for the load)
#   compute -> load   "I am done reading this buffer slot"           (WAR: load waits before overwriting it)
#   compute -> store  "the accumulators hold the finished tile"      (RAW)
#   store -> compute  "the output tile has left the buffer"          (WAR: compute waits before resetting it)
# With one buffer slot ("single buffering") each load must wait for the GEMM before it; with two slots the load of
# tile i+1 goes to the other slot while tile i is multiplied: the load's memory time hides behind compute.
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from vta.asm import disassemble
from vta.backend import get_backend
from vta.config import MEM_INP, MEM_OUT, MEM_WGT, VTAConfig
from vta.gemm import pack_inp, pack_wgt, requantize, unpack_out
from vta.isa import ALU_MAX, ALU_MIN, ALU_SHR, Uop
from vta.program import Program, ProgramBuilder

OUT_DIR = os.path.join("build", "tutorials")


def blocked_gemm(cfg: VTAConfig, a: np.ndarray, b: np.ndarray, shift: int, *, tk: int, slots: int) -> Program:
    """C = clip(A @ B >> shift), K cut into tiles of ``tk`` blocks, N into tiles of one block; ``slots`` (1 or 2)
    buffer slots for the inp and wgt tiles."""
    m, k = a.shape
    n = b.shape[1]
    mb, kb, nb = m // cfg.batch, k // cfg.block_in, n // cfg.block_out
    assert kb % tk == 0, "for brevity, K must be a whole number of tiles"
    inp_slot, wgt_slot = cfg.inp_depth // slots, cfg.wgt_depth // slots     # entries per slot
    assert mb * tk <= inp_slot and tk <= wgt_slot and mb <= cfg.acc_depth
    bld = ProgramBuilder(cfg)
    a_addr = bld.elem_addr(bld.alloc("A", pack_inp(a, cfg)), MEM_INP)
    b_addr = bld.elem_addr(bld.alloc("B", pack_wgt(b, cfg)), MEM_WGT)
    c_addr = bld.elem_addr(bld.alloc("C", (mb, nb, cfg.batch, cfg.block_out), np.int8), MEM_OUT)

    # Micro-op kernels, one per slot: micro-op j multiplies inp entry (slot base + j) by wgt entry (slot base + j)
    # into accumulator 0; the GEMM's outer loop adds src_factor_out=tk to the inp index and dst_factor_out=1 to
    # the accumulator index for each of the mb rows. Then a reset and an ALU micro-op. All are loaded once.
    uops: list[Uop] = []
    kernel = {}
    for s in range(slots):
        kernel[s] = len(uops)
        uops += [Uop(0, s * inp_slot + j, s * wgt_slot + j) for j in range(tk)]
    reset, alu = len(uops), len(uops) + 1
    uops += [Uop(0, 0, 0), Uop(0, 0, 0)]
    bld.load_uops(bld.uop_kernel("uops", uops))

    rows = dict(iter_out=mb, iter_in=1, dst_factor_out=1)   # one accumulator per row of A, one N block
    uses = 0
    for n0 in range(nb):
        if n0:
            bld.dep_pop("store", "compute")       # WAR: the previous output tile has been stored
        bld.gemm(uop_bgn=reset, uop_end=reset + 1, reset=True, **rows)
        for k0 in range(0, kb, tk):
            s = uses % slots
            if uses >= slots:
                bld.dep_pop("compute", "load")    # WAR: the GEMM that last read slot s is done
            # explicit loads: mb rows of tk blocks of A (row stride kb), and tk blocks of B's n0 row
            bld.load(MEM_INP, sram_base=s * inp_slot, dram_base=a_addr + k0, y_size=mb, x_size=tk, x_stride=kb)
            bld.load(MEM_WGT, sram_base=s * wgt_slot, dram_base=b_addr + n0 * kb + k0, y_size=1, x_size=tk)
            bld.dep_push("load", "compute")       # RAW: the operands are in slot s
            bld.dep_pop("load", "compute")
            bld.gemm(uop_bgn=kernel[s], uop_end=kernel[s] + tk, src_factor_out=tk, **rows)
            bld.dep_push("compute", "load")       # slot s may be reused
            uses += 1
        for op, imm in ((ALU_SHR, shift), (ALU_MIN, 127), (ALU_MAX, -128)):
            bld.alu(op, uop_bgn=alu, uop_end=alu + 1, src_factor_out=1, use_imm=True, imm=imm, **rows)
        bld.dep_push("compute", "store")          # RAW: the tile is ready
        bld.dep_pop("compute", "store")
        bld.store(sram_base=0, dram_base=c_addr + n0, y_size=mb, x_size=1, x_stride=nb)
        bld.dep_push("store", "compute")
    # A program must end with empty token queues: pop the tokens nobody waited for.
    for _ in range(min(uses, slots)):
        bld.dep_pop("compute", "load")
    bld.dep_pop("store", "compute")
    return bld.finish()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Tutorial 2: a blocked, double-buffered GEMM")
    parser.add_argument("--no-rtl", action="store_true", help="skip the Verilator runs")
    args = parser.parse_args(argv)
    cfg = VTAConfig()
    rng = np.random.default_rng(1)
    m, k, n, shift = 16, 256, 64, 10
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    expected = requantize(a.astype(np.int32) @ b.astype(np.int32), shift)

    programs = {slots: blocked_gemm(cfg, a, b, shift, tk=4, slots=slots) for slots in (1, 2)}
    results: dict = {"expected": expected, "programs": programs, "fsim": {}, "tsim": {}}
    for slots, program in programs.items():
        # fsim checks more than the result: with check_races (the default) it fails when two modules touch the
        # same buffer entries without a token ordering them. Delete a dep_pop above to see it.
        out = get_backend("fsim").run(program)
        c = unpack_out(out.read(program, "C"), m, n)
        assert np.array_equal(c, expected)
        results["fsim"][slots] = out
        print(f"{slots} slot(s): {len(program.insns)} instructions; fsim result equals numpy; "
              f"{out.stats['load_insns']} loads, {out.stats['compute_to_load_pushes']} compute->load tokens")
        if not args.no_rtl:
            rtl = get_backend("tsim").run(program)     # also compared with fsim: DRAM and counters
            assert np.array_equal(unpack_out(rtl.read(program, "C"), m, n), expected)
            results["tsim"][slots] = rtl
            hw = rtl.counters or {}
            print(f"  on the RTL: {rtl.cycles} cycles; compute waited {hw['compute_wait_token']} cycles for tokens, "
                  f"load waited {hw['load_wait_token']}")
    if results["tsim"]:
        single, double = results["tsim"][1].cycles, results["tsim"][2].cycles
        print(f"double buffering: {single} -> {double} cycles ({single / double:.2f}x)")

    # Disassembly: the same text `vta disasm` prints; `vta asm` reads it back. Saved programs (.npz) are what the
    # command-line tools take: `vta disasm build/tutorials/blocked_gemm.npz --uops`, `vta run ... --target tsim`.
    text = disassemble(programs[2].insns, cfg, numbered=True)
    print("the double-buffered program, first 12 instructions:")
    print("\n".join("  " + line for line in text.splitlines()[:12]))
    os.makedirs(OUT_DIR, exist_ok=True)
    path = os.path.join(OUT_DIR, "blocked_gemm.npz")
    programs[2].save(path)
    print(f"wrote {path}")
    results.update(text=text, path=path)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
