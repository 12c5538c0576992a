"""cocotb testbenches of the load and store modules.

Drivers: random LOAD/STORE instructions into the command queue, random token availability, the DRAM port
(:class:`memport.MemPortDriver`, with backpressure and latency) and, for store, a model of the out SRAM read port.
Monitors: the SRAM write ports (load) and token handshakes. Reference model: :func:`ref_load` / :func:`ref_store`,
written from the semantics in ``vta.isa``. Checker: SRAM (load) or DRAM (store) contents, token counts, element
pulses. Parameters come from environment variables set by ``tests/test_hw_units.py``.
"""
import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly
from memport import MemPortDriver, PortTiming

from vta.config import MEM_INP, MEM_WGT, VTAConfig
from vta.isa import Load, Store, encode

N = int(os.environ.get("TB_ITEMS", "12"))


def ref_load(sram, dram, insn, eb):
    """LOAD semantics (vta.isa): padded rows of entries from sram_base, zeros in the padding."""
    if insn.x_size == 0:
        return
    idx = insn.sram_base
    for r in range(insn.y_pad_0 + insn.y_size + insn.y_pad_1):
        for c in range(insn.x_pad_0 + insn.x_size + insn.x_pad_1):
            y, x = r - insn.y_pad_0, c - insn.x_pad_0
            if 0 <= y < insn.y_size and 0 <= x < insn.x_size:
                a = (insn.dram_base + y * insn.x_stride + x) * eb
                sram[idx] = dram[a:a + eb]
            else:
                sram[idx] = 0
            idx += 1


def ref_store(dram, sram, insn, eb):
    """STORE semantics: element (y, x) from out entry sram_base + y*x_size + x to DRAM element
    dram_base + y*x_stride + x."""
    for y in range(insn.y_size):
        for x in range(insn.x_size):
            a = (insn.dram_base + y * insn.x_stride + x) * eb
            dram[a:a + eb] = sram[insn.sram_base + y * insn.x_size + x]


def _cfg():
    return VTAConfig.from_dict(json.loads(os.environ["TB_CONFIG"]))


async def _reset(dut):
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    dut.cmd_valid.value = 0
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0


def _random_mem_insn(rng, cls, mem, eb, dram_bytes, depth, pads):
    x = rng.choice([0, 1, 2, 3, 5]) if cls is Load else rng.randint(1, 5)
    y = rng.choice([0, 1, 2, 3]) if cls is Load else rng.randint(1, 3)
    stride = x + rng.randint(0, 3)
    p = [rng.randint(0, 2) for _ in range(4)] if pads else [0, 0, 0, 0]
    used = (p[0] + y + p[1]) * (p[2] + x + p[3]) if x else 0
    sram_base = rng.randrange(0, depth - used + 1)
    span = (max(y, 1) - 1) * stride + x
    dram_base = rng.randrange(0, dram_bytes // eb - span)
    kw = dict(sram_base=sram_base, dram_base=dram_base, y_size=y, x_size=x, x_stride=stride,
              y_pad_0=p[0], y_pad_1=p[1], x_pad_0=p[2], x_pad_1=p[3])
    return cls(mem=mem, **kw) if cls is Load else cls(**kw)


async def _issue_and_serve_tokens(dut, cfg, insns, pop, push, rng, until):
    """Drive the command queue and random token availability; count token handshakes until ``until()``."""
    pops = pushes = 0
    k = 0
    for cycle in range(100000):
        await FallingEdge(dut.clk)
        dut.cmd_valid.value = int(k < len(insns))
        if k < len(insns):
            dut.cmd_data.value = encode(insns[k], cfg)
        getattr(dut, f"{pop}_valid").value = int(rng.random() < 0.5)
        getattr(dut, f"{push}_ready").value = int(rng.random() < 0.5)
        await ReadOnly()
        if k < len(insns) and dut.cmd_ready.value:
            k += 1
        if getattr(dut, f"{pop}_valid").value and getattr(dut, f"{pop}_ready").value:
            pops += 1
        if getattr(dut, f"{push}_ready").value and getattr(dut, f"{push}_valid").value:
            pushes += 1
        if until(k, cycle):
            return pops, pushes
    raise AssertionError("the unit did not finish its instructions in 100000 cycles")


@cocotb.test()
async def load_unit(dut):
    cfg = _cfg()
    rng = random.Random(int(os.environ.get("TB_SEED", "5")))
    await _reset(dut)
    dram = bytearray(rng.getrandbits(8) for _ in range(4096))
    driver = MemPortDriver(dut, dram, bus_bytes=cfg.bus_bytes, latency=cfg.dram_latency, timing=PortTiming.stressed(),
                           rng=rng, rd_prefix="mem__", wr_prefix=None)
    driver.start()
    ebs = {MEM_INP: cfg.inp_elem_bytes, MEM_WGT: cfg.wgt_elem_bytes}
    depth = {MEM_INP: min(cfg.inp_depth, 64), MEM_WGT: min(cfg.wgt_depth, 64)}
    insns = []
    for _ in range(N):
        mem = rng.choice([MEM_INP, MEM_WGT])
        insn = _random_mem_insn(rng, Load, mem, ebs[mem], len(dram), depth[mem], pads=True)
        insns.append(Load(**{**insn.__dict__, "pop_next": rng.random() < 0.5, "push_next": rng.random() < 0.5}))
    model = {m: np.zeros((depth[m], ebs[m]), np.uint8) for m in ebs}
    got = {m: np.zeros((depth[m], ebs[m]), np.uint8) for m in ebs}
    for insn in insns:
        ref_load(model[insn.mem], np.frombuffer(bytes(dram), np.uint8), insn, ebs[insn.mem])
    done = {"insns": 0, "elems": 0}

    async def monitor():
        ports = {MEM_INP: "inp_wr__", MEM_WGT: "wgt_wr__"}
        while True:
            await FallingEdge(dut.clk)
            await ReadOnly()
            done["insns"] += int(dut.insn_done.value)
            done["elems"] += int(dut.elem_inp.value) + int(dut.elem_wgt.value)
            for mem, prefix in ports.items():
                en = int(getattr(dut, prefix + "en").value)
                if not en:
                    continue
                addr = int(getattr(dut, prefix + "addr").value)
                data = int(getattr(dut, prefix + "data").value).to_bytes(ebs[mem], "little")
                g = max(1, ebs[mem] // len(getattr(dut, prefix + "en")))
                for j in range(len(getattr(dut, prefix + "en"))):
                    if en >> j & 1:
                        # the inp and wgt SRAMs take offset-binary bytes (x ^ 0x80), the GEMM core's operand form
                        got[mem][addr, j * g:(j + 1) * g] = np.frombuffer(data[j * g:(j + 1) * g], np.uint8) ^ 0x80

    cocotb.start_soon(monitor())
    pops, pushes = await _issue_and_serve_tokens(dut, cfg, insns, "pop_next", "push_next", rng,
                                                 lambda k, c: done["insns"] == len(insns))
    assert driver.error is None, str(driver.error)
    assert pops == sum(i.pop_next for i in insns), f"{pops} tokens popped, want {sum(i.pop_next for i in insns)}"
    assert pushes == sum(i.push_next for i in insns), f"{pushes} pushed, want {sum(i.push_next for i in insns)}"
    want_elems = sum(i.x_size * i.y_size for i in insns)
    assert done["elems"] == want_elems, f"{done['elems']} element pulses, want {want_elems}"
    for mem in ebs:
        bad = np.flatnonzero((got[mem] != model[mem]).any(axis=1))
        assert bad.size == 0, f"memory {mem}: entries {bad.tolist()} differ from the reference model"


@cocotb.test()
async def store_unit(dut):
    cfg = _cfg()
    eb = cfg.out_elem_bytes
    rng = random.Random(int(os.environ.get("TB_SEED", "6")))
    await _reset(dut)
    depth = min(cfg.out_depth, 64)
    sram = np.array([[rng.getrandbits(8) for _ in range(eb)] for _ in range(depth)], np.uint8)
    dram = bytearray(4096)
    want = np.zeros(len(dram), np.uint8)
    driver = MemPortDriver(dut, dram, bus_bytes=cfg.bus_bytes, latency=cfg.dram_latency, timing=PortTiming.stressed(),
                           rng=rng, rd_prefix=None, wr_prefix="wr__")
    driver.start()
    insns = []
    for _ in range(N):
        insn = _random_mem_insn(rng, Store, 4, eb, len(dram), depth, pads=False)
        insns.append(Store(**{**insn.__dict__, "pop_prev": rng.random() < 0.5, "push_prev": rng.random() < 0.5}))
        ref_store(want, sram, insns[-1], eb)
    done = {"insns": 0, "elems": 0}

    async def out_sram():  # the out buffer's synchronous read port, and a monitor of the unit's pulses
        pending = None
        while True:
            await FallingEdge(dut.clk)
            if pending is not None:
                dut.out_rd__data.value = int.from_bytes(sram[pending].tobytes(), "little")
            await ReadOnly()
            pending = int(dut.out_rd__addr.value) % depth if dut.out_rd__en.value else None
            done["insns"] += int(dut.insn_done.value)
            done["elems"] += int(dut.elem_out.value)

    cocotb.start_soon(out_sram())
    pops, pushes = await _issue_and_serve_tokens(dut, cfg, insns, "pop_prev", "push_prev", rng,
                                                 lambda k, c: done["insns"] == len(insns))
    assert driver.error is None, str(driver.error)
    assert pops == sum(i.pop_prev for i in insns) and pushes == sum(i.push_prev for i in insns), "token counts"
    assert done["elems"] == sum(i.x_size * i.y_size for i in insns), "element pulses"
    got = np.frombuffer(bytes(dram), np.uint8)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} DRAM bytes differ from the reference model, first at {bad[0]}"
