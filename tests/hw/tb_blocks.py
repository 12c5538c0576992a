"""cocotb testbenches of the small blocks: GEMM core, tensor ALU, token queue. Each is a driver of random stimulus
(with random idle cycles), a monitor sampling the outputs, a reference model and a checker. Parameters come from
environment variables set by the pytest runner (tests/test_hw_blocks.py)."""
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly, Timer

from vta.fsim import alu_op
from vta.hw.gemm import pack_weights_int

N = int(os.environ.get("TB_ITEMS", "200"))


def _pack(values, bits):
    """Little-endian lanes of ``bits`` bits -> int."""
    word = 0
    for j, v in enumerate(values):
        word |= (int(v) & ((1 << bits) - 1)) << (bits * j)
    return word


def _unpack(word, bits, n, signed=True):
    out = []
    for j in range(n):
        v = (word >> (bits * j)) & ((1 << bits) - 1)
        if signed and v >> (bits - 1):
            v -= 1 << bits
        out.append(v)
    return np.array(out, dtype=np.int64)


async def _reset(dut):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0


@cocotb.test()
async def gemm_core(dut):
    """Driver: random int8 (or, with TB_INP_BITS / TB_WGT_BITS 4, int4) tiles (extremes included) in offset binary,
    with random idle cycles; monitor: ``dot`` when ``out_valid``; model: numpy matmul; checker: every result, in
    order, and nothing extra."""
    batch, bi, bo = (int(os.environ[k]) for k in ("TB_BATCH", "TB_BLOCK_IN", "TB_BLOCK_OUT"))
    ib, wb = int(os.environ.get("TB_INP_BITS", "8")), int(os.environ.get("TB_WGT_BITS", "8"))
    ilo, ihi, wlo, whi = -(1 << (ib - 1)), (1 << (ib - 1)) - 1, -(1 << (wb - 1)), (1 << (wb - 1)) - 1
    rng = np.random.default_rng(1)
    await _reset(dut)
    expected = []
    seen = 0
    for cycle in range(N + 3):
        await FallingEdge(dut.clk)
        drive = cycle < N and rng.random() < 0.8
        if drive:
            kind = rng.integers(3)
            if kind == 0:
                inp = rng.integers(ilo, ihi + 1, (batch, bi))
                wgt = rng.integers(wlo, whi + 1, (bo, bi))
            else:  # extremes: -128 * -128 (or -8 * -8) summed over the whole block
                inp = np.full((batch, bi), ilo if kind == 1 else ihi)
                wgt = np.full((bo, bi), wlo)
            # the core takes offset-binary values (x ^ 0x80, or x ^ 0x8 for int4), as the load unit writes them
            dut.inp.value = _pack((inp.reshape(-1) & ((1 << ib) - 1)) ^ (1 << (ib - 1)), ib)
            uw = (wgt.reshape(-1) & ((1 << wb) - 1)) ^ (1 << (wb - 1))
            # the packed form takes each weight tile packed, as its weight buffer stores it
            dut.wgt.value = (pack_weights_int(uw, bi, bo, ib, wb) if os.environ["TB_FORM"] == "packed"
                             else _pack(uw, wb))
            expected.append((inp @ wgt.T).reshape(-1))
        dut.in_valid.value = int(drive)
        await ReadOnly()
        if dut.out_valid.value:
            got = _unpack(int(dut.dot.value), 32, batch * bo)
            assert seen < len(expected), "the GEMM core produced a result nobody asked for"
            assert np.array_equal(got, expected[seen]), f"result {seen}: got {got.tolist()}, want {expected[seen]}"
            seen += 1
    assert seen == len(expected), f"{len(expected)} operand pairs went in but {seen} results came out"


def _alu_operands(rng, lanes):
    edge = np.array([0, 1, -1, 31, 32, -32, -33, 63, 2**31 - 1, -2**31, 0x7FFF, -0x8000])
    pick = rng.integers(0, 3, lanes)
    rand = rng.integers(-2**31, 2**31, lanes)
    small = rng.integers(-40, 40, lanes)
    return np.where(pick == 0, rand, np.where(pick == 1, small, rng.choice(edge, lanes)))


async def _check_alu(dut, lanes, op, a, b, imm=None, row=None):
    """Driver: ``op`` on lanes ``a`` and ``b`` (and the 16-bit immediate ``imm`` of the requant ALU, when given);
    checker: every lane of the result against ``vta.fsim.alu_op`` (the ALU is combinational: sampled after it
    settles), with the lanes as rows of ``row`` (BLOCK_OUT) for the lane_reduce knob's RSUM and RMAX."""
    dut.op.value = op
    dut.a.value = _pack(a, 32)
    dut.b.value = _pack(b, 32)
    if imm is not None:
        dut.imm.value = imm & 0xFFFF
    await Timer(1, unit="ns")
    await ReadOnly()
    got = _unpack(int(dut.res.value), 32, lanes)
    shape = (-1,) if row is None else (lanes // row, row)
    a2, b2 = a.reshape(shape), b.reshape(shape)
    want = (alu_op(op, a2, b2) if imm is None else alu_op(op, a2, b2, imm)).astype(np.int64).reshape(-1)
    bad = np.flatnonzero(got != want)
    given = "" if imm is None else f" imm={imm}"
    assert bad.size == 0, (f"op {op}, lane {bad[0]}: a={a[bad[0]]} b={b[bad[0]]}{given} gave {got[bad[0]]}, "
                           f"want {want[bad[0]]}")
    await Timer(1, unit="ns")


@cocotb.test()
async def tensor_alu(dut):
    """Driver: every opcode on random, small and edge-case int32 lanes; model: ``vta.fsim.alu_op``; checker:
    every lane of every result (the ALU is combinational: sampled after it settles)."""
    lanes = int(os.environ["TB_LANES"])
    rng = np.random.default_rng(2)
    for k in range(N):
        op = k % 5
        await _check_alu(dut, lanes, op, _alu_operands(rng, lanes), _alu_operands(rng, lanes))


@cocotb.test()
async def tensor_alu_requant(dut):
    """The ALU built with the fused_requant knob: every opcode including REQ (5), with a random immediate; REQ's
    operand lanes are random words or packed (multiplier, shift) pairs. Model: ``vta.fsim.alu_op``."""
    lanes = int(os.environ["TB_LANES"])
    rng = np.random.default_rng(5)
    for k in range(N):
        op = k % 6
        a, b = _alu_operands(rng, lanes), _alu_operands(rng, lanes)
        if op == 5 and k % 12 < 6:  # realistic requant words: 16-bit multiplier, shift in [-32, 31]
            b = (rng.integers(-32, 32, lanes) & 63) << 16 | (rng.integers(-2**15, 2**15, lanes) & 0xFFFF)
        await _check_alu(dut, lanes, op, a, b, imm=int(rng.integers(-2**15, 2**15)))


@cocotb.test()
async def tensor_alu_reduce(dut):
    """The ALU built with the lane_reduce knob (and fused_requant when TB_REQUANT is 1): every opcode including RSUM
    (6) and RMAX (7) over rows of TB_ROW lanes, on random, small and edge-case lanes, some rows of equal or extreme
    values (sums that wrap, maxima tied). Model: ``vta.fsim.alu_op`` on the lanes as (rows, TB_ROW)."""
    lanes, row = int(os.environ["TB_LANES"]), int(os.environ["TB_ROW"])
    requant = os.environ["TB_REQUANT"] == "1"
    rng = np.random.default_rng(11)
    ops = [0, 1, 2, 3, 4, 6, 7] + ([5] if requant else [])
    for k in range(N):
        op = ops[k % len(ops)]
        a, b = _alu_operands(rng, lanes), _alu_operands(rng, lanes)
        if k % 5 == 1:  # extremes in every lane: sums wrap, maxima tie
            a = rng.choice(np.array([2**31 - 1, -2**31, -1]), lanes)
        await _check_alu(dut, lanes, op, a, b, imm=int(rng.integers(-2**15, 2**15)) if requant else None, row=row)


@cocotb.test()
async def token_queue(dut):
    """Driver: random push and pop attempts; model: a counter bounded by the depth; checker: push_ready, pop_valid
    and level every cycle, including pushes into a full queue and pops from an empty one."""
    depth = int(os.environ["TB_DEPTH"])
    rng = random.Random(3)
    await _reset(dut)
    level = 0
    for k in range(N * 4):
        await FallingEdge(dut.clk)
        bias = 0.7 if (k // 64) % 2 == 0 else 0.3   # alternate filling and draining phases
        push, pop = rng.random() < bias, rng.random() < 1 - bias
        dut.push_valid.value = int(push)
        dut.pop_ready.value = int(pop)
        await ReadOnly()
        assert int(dut.level.value) == level, f"cycle {k}: level {int(dut.level.value)}, model says {level}"
        assert bool(dut.push_ready.value) == (level < depth), f"cycle {k}: push_ready wrong at level {level}"
        assert bool(dut.pop_valid.value) == (level > 0), f"cycle {k}: pop_valid wrong at level {level}"
        level += int(push and level < depth) - int(pop and level > 0)


@cocotb.test()
async def staged_sram(dut):
    """Driver: random whole-entry writes, entries written granule by granule in ascending order (with random gaps),
    and a read every cycle at a random address; model: a dict of the stored (packed) entries, an entry stored when
    its last granule is written; checker: every read returns the packed entry, reading through the cycle's write."""
    block, depth = int(os.environ["TB_BLOCK"]), int(os.environ["TB_DEPTH"])
    n_bytes = block * block
    gran = int(os.environ["TB_GRAN_BYTES"])
    n_gran = n_bytes // gran
    rng = np.random.default_rng(3)
    stored = {a: pack_weights_int([0x80] * n_bytes, block, block) for a in range(depth)}
    dut.w__en.value = 0
    await _reset(dut)
    pending = None  # (address, bytes, next granule) of an entry being written granule by granule
    last_read = None
    for _ in range(N * 4):
        await FallingEdge(dut.clk)
        await ReadOnly()
        if last_read is not None:
            got = int(dut.r0__data.value)
            assert got == stored[last_read], f"entry {last_read}: got {got:#x}, want {stored[last_read]:#x}"
        await FallingEdge(dut.clk)
        en, addr, data = 0, 0, [0] * n_bytes
        if pending is None and rng.random() < 0.2:  # a whole entry at once
            addr, data = int(rng.integers(depth)), rng.integers(0, 256, n_bytes).tolist()
            en = (1 << n_gran) - 1
            stored[addr] = pack_weights_int(data, block, block)
        elif pending is None and rng.random() < 0.3:
            pending = [int(rng.integers(depth)), rng.integers(0, 256, n_bytes).tolist(), 0]
        if pending is not None and rng.random() < 0.7:
            addr, data, k = pending
            en = 1 << k
            pending[2] += 1
            if k == n_gran - 1:
                stored[addr] = pack_weights_int(data, block, block)
                pending = None
            # the granule's bytes sit in their place; the other bytes are noise the buffer must ignore
            noise = rng.integers(0, 256, n_bytes).tolist()
            data = [d if i // gran == k else x for i, (d, x) in enumerate(zip(data, noise))]
        dut.w__addr.value, dut.w__en.value, dut.w__data.value = addr, en, _pack(data, 8)
        last_read = int(rng.integers(depth))
        dut.r0__addr.value, dut.r0__en.value = last_read, 1
