"""Programs for the whole-core testbench and the case files that carry them (with fsim's expected results) into the
cocotb simulation. Importable from pytest (no cocotb import here)."""
import json
from dataclasses import asdict

import numpy as np
from memport import PortTiming

import vta.fsim
from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_WGT
from vta.isa import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_SHR, Uop
from vta.program import ProgramBuilder


def write_case(path, program, *, timing=None, seed=0, max_cycles=200_000):
    """Run ``program`` in fsim and write a case file (``.npz``) for ``tb_core``; returns fsim's result."""
    result = vta.fsim.run(program)
    meta = {"insn_offset": program.insn_offset, "insn_count": len(program.insns), "bus_bytes": program.cfg.bus_bytes,
            "latency": program.cfg.dram_latency, "timing": asdict(timing or PortTiming()), "seed": seed,
            "max_cycles": max_cycles, "stats": result.stats.as_dict()}
    np.savez(path, dram=program.dram, expected=result.dram, meta=np.array(json.dumps(meta)))
    return result


def _rand(rng, shape, lo=-128, hi=127, dtype=np.int8):
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


def feature_program(cfg, seed=0):
    """Exercises what the GEMM and ALU workloads do not: LOADs with padding on all four sides and row strides (inp,
    acc), ACC_8BIT loads, GEMM loops with every index factor, reset GEMM and ALU, ALU ops with tensor and immediate
    operands, and a strided 2D STORE. Needs at least 24 inp, 6 wgt, 36 acc and 32 uop entries."""
    rng = np.random.default_rng(seed)
    b = ProgramBuilder(cfg)
    bt, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
    ys, xs, stride = 2, 3, 5                       # inp block: 2 rows of 3 elements, rows 5 elements apart
    pads = dict(y_pad_0=1, y_pad_1=1, x_pad_0=1, x_pad_1=2)  # -> 4 rows of 6 entries = 24 inp entries
    inp = b.alloc("inp", _rand(rng, (ys * stride, bt, bi)))
    wgt = b.alloc("wgt", _rand(rng, (6, bo, bi)))
    acc8 = b.alloc("acc8", _rand(rng, (24, bt, bo)))
    acc = b.alloc("acc", _rand(rng, (2 * 4, bt, bo), -(1 << 20), 1 << 20, np.int32))
    out = b.alloc("out", (4 * 7, bt, bo))
    k_gemm = b.uop_kernel("k_gemm", [Uop(dst=e, src=e, wgt=e % 4) for e in range(24)])
    k_loop = b.uop_kernel("k_loop", [Uop(dst=e, src=e, wgt=e % 2) for e in range(4)])
    k_alu = b.uop_kernel("k_alu", [Uop(dst=e, src=24 + e % 12) for e in range(4)])

    b.load(MEM_INP, sram_base=0, dram_base=b.elem_addr(inp, MEM_INP), y_size=ys, x_size=xs, x_stride=stride, **pads)
    b.load(MEM_WGT, sram_base=0, dram_base=b.elem_addr(wgt, MEM_WGT), x_size=6)
    b.dep_push("load", "compute")
    b.load_uops(k_gemm, 0)
    b.load_uops(k_loop, 24)
    b.load_uops(k_alu, 28)
    b.load(MEM_ACC_8BIT, sram_base=0, dram_base=b.elem_addr(acc8, MEM_ACC_8BIT), x_size=24)
    b.load(MEM_ACC, sram_base=24, dram_base=b.elem_addr(acc, MEM_ACC), y_size=2, x_size=3, x_stride=4,
           y_pad_0=0, y_pad_1=1, x_pad_0=1, x_pad_1=0)  # 3 rows of 4 entries: acc 24..35
    b.dep_pop("load", "compute")
    b.gemm(uop_bgn=0, uop_end=24)                                  # acc[e] += inp[e] . wgt[e % 4]
    b.gemm(uop_bgn=24, uop_end=28, iter_out=2, iter_in=3, dst_factor_out=12, dst_factor_in=4,
           src_factor_out=3, src_factor_in=5, wgt_factor_out=1, wgt_factor_in=1)
    b.gemm(uop_bgn=24, uop_end=25, iter_out=1, iter_in=2, dst_factor_in=7, reset=True)   # acc 0 and 7 = 0
    b.alu(ALU_ADD, uop_bgn=28, uop_end=32, iter_out=3, iter_in=2, dst_factor_out=8, dst_factor_in=4,
          src_factor_out=1, src_factor_in=2)
    b.alu(ALU_MUL, uop_bgn=28, uop_end=32, iter_out=2, dst_factor_out=4, src_factor_out=3)
    b.alu(ALU_SHR, uop_bgn=28, uop_end=32, iter_out=6, dst_factor_out=4, use_imm=True, imm=3)
    b.alu(ALU_SHR, uop_bgn=28, uop_end=29, iter_out=2, dst_factor_out=9, use_imm=True, imm=-2)
    b.alu(ALU_MAX, uop_bgn=28, uop_end=32, iter_out=6, dst_factor_out=4, use_imm=True, imm=-100)
    b.alu(ALU_MIN, uop_bgn=28, uop_end=32, iter_out=6, dst_factor_out=4, src_factor_out=1)
    b.alu(ALU_MIN, uop_bgn=28, uop_end=29, iter_out=3, dst_factor_out=5, reset=True)
    b.dep_push("compute", "store")
    b.dep_pop("compute", "store")
    b.store(sram_base=0, dram_base=b.elem_addr(out, MEM_OUT), y_size=4, x_size=6,
            x_stride=7)
    return b.finish()
