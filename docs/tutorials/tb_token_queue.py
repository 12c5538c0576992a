"""A cocotb testbench of one hardware block, vta.hw.queues.TokenQueue (used by docs/tutorials/04_rtl.py).

A cocotb test is an ``async`` function that drives the design's inputs and checks its outputs while a simulator
(here Verilator) runs it. The shape below is the one every testbench of tests/hw/ follows: a driver (random push
and pop requests), a model (a counter bounded by the depth) and a checker (the design's outputs against the model,
every cycle). The queue's depth comes from the environment (TB_DEPTH), as the runner passes it.
"""
import os
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly


@cocotb.test()
async def token_queue(dut):
    depth = int(os.environ["TB_DEPTH"])
    cycles = int(os.environ.get("TB_CYCLES", "400"))
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())   # a 100 MHz clock on the design's `clk`
    dut.rst.value = 1
    dut.push_valid.value = 0
    dut.pop_ready.value = 0
    await FallingEdge(dut.clk)
    await FallingEdge(dut.clk)
    dut.rst.value = 0
    rng = random.Random(1)
    level = pushes = pops = 0
    for k in range(cycles):
        await FallingEdge(dut.clk)                     # change inputs away from the rising edge
        fill = (k // 50) % 2 == 0                      # alternate filling and draining phases
        push = rng.random() < (0.8 if fill else 0.2)
        pop = rng.random() < (0.2 if fill else 0.8)
        dut.push_valid.value = int(push)
        dut.pop_ready.value = int(pop)
        await ReadOnly()                               # let the combinational outputs settle, then check them
        assert int(dut.level.value) == level, f"cycle {k}: level {int(dut.level.value)}, the model says {level}"
        assert bool(dut.push_ready.value) == (level < depth), f"cycle {k}: push_ready wrong at level {level}"
        assert bool(dut.pop_valid.value) == (level > 0), f"cycle {k}: pop_valid wrong at level {level}"
        pushed, popped = push and level < depth, pop and level > 0
        level += int(pushed) - int(popped)
        pushes += int(pushed)
        pops += int(popped)
    dut._log.info("token_queue depth %d: %d cycles checked, %d pushes, %d pops", depth, cycles, pushes, pops)
