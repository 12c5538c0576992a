"""cocotb testbench of the memory arbiter: requester drivers issue random bursts and take beats with random
backpressure, a DRAM model serves the shared port with latency and gaps, monitors record the beats each requester
receives, and the checker compares them with the reference (each requester gets exactly its own bursts' beats, in
order). The write channel is driven at random and checked to pass through unchanged."""
import os
import random
from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly


def beat_value(addr, bus):
    """A beat whose bytes name its address, so misrouted or reordered beats show up."""
    return int.from_bytes(bytes((addr + j) * 7 % 251 for j in range(bus)), "little")


@cocotb.test()
async def arbiter(dut):
    n, bus = int(os.environ["TB_READERS"]), int(os.environ["TB_BUS"])
    bursts = int(os.environ.get("TB_ITEMS", "40"))
    rng = random.Random(4)
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns").start())
    dut.rst.value = 1
    await FallingEdge(dut.clk)
    dut.rst.value = 0
    todo = [deque((rng.randrange(0, 1 << 12) * bus, rng.randint(1, 8)) for _ in range(bursts)) for _ in range(n)]
    want = [[beat_value(a + k * bus, bus) for a, ln in q for k in range(ln)] for q in todo]
    got = [[] for _ in range(n)]
    rd = [{name: getattr(dut, f"rd_{k}__{name}") for name in
           ("req_valid", "req_ready", "req_addr", "req_len", "data_valid", "data_ready", "data")} for k in range(n)]
    pending = deque()   # [addr, beats left, ready cycle]
    offered = False
    for cycle in range(20000):
        await FallingEdge(dut.clk)
        for k in range(n):
            if todo[k]:
                rd[k]["req_valid"].value = 1
                rd[k]["req_addr"].value, rd[k]["req_len"].value = todo[k][0]
            else:
                rd[k]["req_valid"].value = 0
            rd[k]["data_ready"].value = int(rng.random() < 0.7)
        req_ready = rng.random() < 0.7
        dut.mem_rd__req_ready.value = int(req_ready)
        head = pending[0] if pending else None
        offered = head is not None and head[2] <= cycle and (offered or rng.random() < 0.8)
        dut.mem_rd__data_valid.value = int(offered)
        if offered:
            dut.mem_rd__data.value = beat_value(head[0], bus)
        wr = (rng.randrange(1 << 16) * bus, rng.getrandbits(8 * bus), rng.getrandbits(bus), rng.random() < 0.5)
        dut.wr_0__addr.value, dut.wr_0__data.value, dut.wr_0__strb.value, dut.wr_0__valid.value = wr
        wr_ready = rng.random() < 0.5
        dut.mem_wr__ready.value = int(wr_ready)
        await ReadOnly()
        assert (int(dut.mem_wr__addr.value), int(dut.mem_wr__data.value), int(dut.mem_wr__strb.value),
                bool(dut.mem_wr__valid.value)) == wr, f"cycle {cycle}: the write channel did not pass through"
        assert bool(dut.wr_0__ready.value) == wr_ready, f"cycle {cycle}: write ready did not pass through"
        granted = [k for k in range(n) if rd[k]["req_ready"].value]
        assert len(granted) <= 1, f"cycle {cycle}: requesters {granted} were granted at once"
        if dut.mem_rd__req_valid.value and req_ready:
            assert len(granted) == 1 and todo[granted[0]], f"cycle {cycle}: a request was forwarded without a grant"
            addr, ln = todo[granted[0]].popleft()
            assert (int(dut.mem_rd__req_addr.value), int(dut.mem_rd__req_len.value)) == (addr, ln)
            pending.append([addr, ln, cycle + rng.randint(1, 6)])
        else:
            assert not granted, f"cycle {cycle}: requester {granted} saw ready without the port accepting"
        if offered and dut.mem_rd__data_ready.value:
            owners = [k for k in range(n) if rd[k]["data_valid"].value]
            assert len(owners) == 1, f"cycle {cycle}: beat routed to {owners}"
            got[owners[0]].append(int(rd[owners[0]]["data"].value))
            offered = False
            head[0] += bus
            head[1] -= 1
            if head[1] == 0:
                pending.popleft()
        if not pending and not any(todo):
            break
    for k in range(n):
        assert got[k] == want[k], f"requester {k} got {len(got[k])} beats, want {len(want[k])} (or wrong ones)"
