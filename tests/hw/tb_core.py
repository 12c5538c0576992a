"""cocotb testbench of the whole core: runs programs and checks DRAM and counters against the functional simulator.

Structure: the driver is :class:`memport.MemPortDriver` (DRAM served with latency and random backpressure); the
reference model is ``vta.fsim`` (run by the pytest side, which writes each case's expected DRAM and statistics into
the case file); the monitor reads the counters over the CSR port after ``done``; the checker compares both.

Cases come from ``$VTA_TB_CASES`` (a JSON list of ``.npz`` case files written by ``tests/hw/cases.py``); measured
counters of every case are written to ``$VTA_TB_RESULTS`` (JSON).
"""
import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly, RisingEdge
from memport import MemPortDriver, PortTiming

from vta.counters import CSR_COUNTERS, HARDWARE_STATISTICS, MODULE_CYCLE_COUNTERS, MODULES, counter, csr_address

CYCLES = counter("cycles").name
"""The cycle counter (a KeyError naming every counter here, should vta.counters rename it)."""
CLASS_COUNTERS = {m: [name for name in MODULE_CYCLE_COUNTERS if name.startswith(f"{m}_")] for m in MODULES}
"""Each module's busy/wait cycle counters."""


async def reset(dut):
    await FallingEdge(dut.clk)
    dut.start.value = 0
    dut.insn_addr.value = 0
    dut.insn_count.value = 0
    dut.csr_addr.value = 0
    dut.mem_rd_req_ready.value = 0
    dut.mem_rd_data_valid.value = 0
    dut.mem_rd_data.value = 0
    dut.mem_wr_ready.value = 0
    dut.rst.value = 1
    await ClockCycles(dut.clk, 3)
    await FallingEdge(dut.clk)
    dut.rst.value = 0


async def read_counters(dut):
    """Monitor: every counter, read over the CSR port (combinational read)."""
    values = {}
    for name in CSR_COUNTERS:
        await FallingEdge(dut.clk)
        dut.csr_addr.value = csr_address(name)
        await ReadOnly()
        values[name] = int(dut.csr_rdata.value)
    return values


def check_case(name, dram, expected, counters, stats):
    """Checker: DRAM bit for bit, counters equal to fsim statistics, cycle classes within the cycle count."""
    got = np.frombuffer(bytes(dram), dtype=np.uint8)
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, (f"case {name}: {bad.size} DRAM bytes differ from fsim, first at byte {bad[0]} "
                           f"(got {got[bad[0]]}, want {expected[bad[0]]}); differing bytes {bad[:16].tolist()}")
    wrong = [f"{key} = {counters[key]} (fsim {stats[key]})" for key in HARDWARE_STATISTICS
             if counters[key] != stats[key]]
    assert not wrong, f"case {name}: counters differ from fsim: {'; '.join(wrong)}"
    for mod, classes in CLASS_COUNTERS.items():
        total = sum(counters[c] for c in classes)
        assert total <= counters[CYCLES], (f"case {name}: {mod} spent {total} cycles in busy/wait classes, more "
                                           f"than the {counters[CYCLES]} cycles of the run")
    assert counters[CYCLES] > 0, f"case {name}: the cycle counter did not count"


@cocotb.test()
async def run_programs(dut):
    with open(os.environ["VTA_TB_CASES"]) as f:
        cases = json.load(f)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    results = {}
    for path in cases:
        case = np.load(path)
        name = os.path.basename(path)
        meta = json.loads(str(case["meta"]))
        dram = bytearray(case["dram"].tobytes())
        timing = PortTiming(**meta["timing"])
        driver = MemPortDriver(dut, dram, bus_bytes=meta["bus_bytes"], latency=meta["latency"], timing=timing,
                               rng=random.Random(meta["seed"]))
        await reset(dut)
        driver.start()
        await FallingEdge(dut.clk)
        dut.insn_addr.value = meta["insn_offset"]
        dut.insn_count.value = meta["insn_count"]
        dut.start.value = 1
        await FallingEdge(dut.clk)
        dut.start.value = 0
        for _ in range(meta["max_cycles"]):
            await RisingEdge(dut.clk)
            await ReadOnly()
            if driver.error is not None or dut.done.value:
                break
        driver._task.cancel()
        assert driver.error is None, f"case {name}: {driver.error}"
        assert dut.done.value, f"case {name}: no done within {meta['max_cycles']} cycles"
        counters = await read_counters(dut)
        results[name] = {"counters": counters, "port": driver.stats}
        dut._log.info("case %s: %d cycles, %s", name, counters[CYCLES], driver.stats)
        check_case(name, dram, case["expected"], counters, meta["stats"])
    if os.environ.get("VTA_TB_RESULTS"):
        with open(os.environ["VTA_TB_RESULTS"], "w") as f:
            json.dump(results, f, indent=1)
