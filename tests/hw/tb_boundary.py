"""cocotb testbench of the registered memory boundary (vta.hw.boundary.MemBoundary): a driver puts random traffic on
all six handshakes (both sides of the read-request, read-data and write FIFOs), a reference model keeps each FIFO as
a deque of at most two items, and the checker compares every output with the model's state *before* this cycle's
inputs take effect, which pins both the data order and that no output depends on an input in the same cycle. A first
phase with every handshake always ready checks full throughput (one item per cycle per channel)."""
import os
import random
from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly

N = int(os.environ.get("TB_ITEMS", "400"))
STREAM = 40   # cycles of the always-ready phase


class _Channel:
    """One FIFO of the boundary: the push side's valid/ready and (signal, width) fields, the pop side's."""

    def __init__(self, dut, push_valid, push_ready, pop_valid, pop_ready, push_fields, pop_fields):
        self.push_valid, self.push_ready = getattr(dut, push_valid), getattr(dut, push_ready)
        self.pop_valid, self.pop_ready = getattr(dut, pop_valid), getattr(dut, pop_ready)
        self.push_fields = [(getattr(dut, n), w) for n, w in push_fields]
        self.pop_fields = [getattr(dut, n) for n, _ in pop_fields]
        self.items = deque()
        self.moved = 0
        self.offer = None
        self.take = False

    def drive(self, rng, valid_p, ready_p):
        """Driver: a new random item (or none) on the push side, a random ready on the pop side."""
        values = tuple(rng.getrandbits(w) for _, w in self.push_fields)
        self.offer = values if rng.random() < valid_p else None
        self.push_valid.value = int(self.offer is not None)
        for (sig, _), value in zip(self.push_fields, values):
            sig.value = value
        self.take = rng.random() < ready_p
        self.pop_ready.value = int(self.take)

    def check_and_step(self, cycle, name):
        """Checker against the model's state, then the model's transition for this cycle."""
        assert bool(self.push_ready.value) == (len(self.items) < 2), f"cycle {cycle}: {name} ready wrong"
        assert bool(self.pop_valid.value) == bool(self.items), f"cycle {cycle}: {name} valid wrong"
        if self.items:
            got = tuple(int(sig.value) for sig in self.pop_fields)
            assert got == self.items[0], f"cycle {cycle}: {name} shows {got}, model says {self.items[0]}"
        pushed = self.offer is not None and len(self.items) < 2
        if self.take and self.items:
            self.items.popleft()
            self.moved += 1
        if pushed:
            self.items.append(self.offer)


@cocotb.test()
async def boundary(dut):
    bus = int(os.environ["TB_BUS"])
    rng = random.Random(5)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await FallingEdge(dut.clk)
    dut.rst.value = 0
    channels = {
        "read request": _Channel(dut, "rd__req_valid", "rd__req_ready", "mem_rd__req_valid", "mem_rd__req_ready",
                                 [("rd__req_addr", 32), ("rd__req_len", 16)],
                                 [("mem_rd__req_addr", 32), ("mem_rd__req_len", 16)]),
        "read data": _Channel(dut, "mem_rd__data_valid", "mem_rd__data_ready", "rd__data_valid", "rd__data_ready",
                              [("mem_rd__data", 8 * bus)], [("rd__data", 8 * bus)]),
        "write": _Channel(dut, "wr__valid", "wr__ready", "mem_wr__valid", "mem_wr__ready",
                          [("wr__addr", 32), ("wr__data", 8 * bus), ("wr__strb", bus)],
                          [("mem_wr__addr", 32), ("mem_wr__data", 8 * bus), ("mem_wr__strb", bus)]),
    }
    for cycle in range(N):
        await FallingEdge(dut.clk)
        streaming = cycle < STREAM
        bias = 0.7 if (cycle // 50) % 2 == 0 else 0.3   # alternate filling and draining phases
        for ch in channels.values():
            ch.drive(rng, 1.0 if streaming else bias, 1.0 if streaming else 1 - bias)
        await ReadOnly()
        assert bool(dut.idle.value) == all(not ch.items for ch in channels.values()), f"cycle {cycle}: idle wrong"
        for name, ch in channels.items():
            ch.check_and_step(cycle, name)
        if cycle == STREAM - 1:
            for name, ch in channels.items():   # the first item leaves one cycle after it entered
                assert ch.moved == STREAM - 1, f"{name}: {ch.moved} items in {STREAM} always-ready cycles"
    assert all(ch.moved > N // 4 for ch in channels.values())
