"""Driver side of the core's memory port for cocotb testbenches: a DRAM model that serves read requests after the
config's latency, in order, with random request backpressure and random gaps between data beats, and accepts writes
with random backpressure. Everything is decided in one coroutine per cycle (drive at the falling edge, sample the
core's outputs once they settle), which keeps Python-driven simulation as fast as it gets.
"""
from collections import deque
from dataclasses import dataclass

import cocotb
from cocotb.triggers import FallingEdge, ReadOnly


class MemPortError(AssertionError):
    """The core put an invalid request on the memory port (out of the image, misaligned, zero length)."""


@dataclass
class PortTiming:
    """Random timing of the host side: probabilities per cycle (0..1) and extra latency (cycles)."""

    req_ready: float = 1.0      # the host accepts a pending read request
    data_gap: float = 0.0       # the host withholds the next beat this cycle
    wr_ready: float = 1.0       # the host accepts a pending write
    extra_latency: int = 0      # up to this many cycles added to each request's latency

    @classmethod
    def stressed(cls):
        return cls(req_ready=0.6, data_gap=0.3, wr_ready=0.6, extra_latency=8)


@dataclass
class _Read:
    addr: int
    beats: int
    ready_at: int


class MemPortDriver:
    """Serves ``dut``'s memory port from ``dram`` (a ``bytearray``, modified in place by writes).

    ``latency``: cycles from a request's acceptance to its first beat at the earliest; ``timing``: a
    :class:`PortTiming`; ``rng``: a ``random.Random``. ``stats`` counts beats and requests (a monitor of the port).
    """

    def __init__(self, dut, dram, *, bus_bytes, latency, timing, rng, rd_prefix="mem_rd_", wr_prefix="mem_wr_"):
        self.dut = dut
        rd_names = ("req_valid", "req_ready", "req_addr", "req_len", "data_valid", "data_ready", "data")
        self.rd = {n: getattr(dut, rd_prefix + n) for n in rd_names} if rd_prefix else None
        self.wr = {n: getattr(dut, wr_prefix + n) for n in ("valid", "ready", "addr", "data", "strb")} \
            if wr_prefix else None
        self.dram = dram
        self.bus = bus_bytes
        self.latency = latency
        self.timing = timing
        self.rng = rng
        self.reads = deque()
        self.cycle = 0
        self.stats = {"read_requests": 0, "read_beats": 0, "write_beats": 0}
        self.error = None
        self._offered = False
        self._task = None

    def start(self):
        self._task = cocotb.start_soon(self._run())

    def _check(self, addr, nbytes, what):
        """Whole beats are always moved, so a beat that starts inside the image may run past its end (an image
        whose size is not a multiple of the bus width): the missing bytes read as zero."""
        if addr % self.bus:
            raise MemPortError(f"{what} address {addr:#x} is not a multiple of the {self.bus}-byte bus")
        end = -(-len(self.dram) // self.bus) * self.bus
        if addr + nbytes > end:
            raise MemPortError(f"{what} [{addr:#x}, {addr + nbytes:#x}) lies outside the {len(self.dram)}-byte DRAM")

    async def _run(self):
        dut, t, rng, b, rd, wr = self.dut, self.timing, self.rng, self.bus, self.rd, self.wr
        while True:
            await FallingEdge(dut.clk)
            self.cycle += 1
            if rd:
                req_ready = rng.random() < t.req_ready
                rd["req_ready"].value = int(req_ready)
                head = self.reads[0] if self.reads else None
                offer = head is not None and head.ready_at <= self.cycle and (self._offered or
                                                                              rng.random() >= t.data_gap)
                self._offered = offer
                rd["data_valid"].value = int(offer)
                if offer:
                    rd["data"].value = int.from_bytes(self.dram[head.addr:head.addr + b], "little")  # short at the end
            if wr:
                wr_ready = rng.random() < t.wr_ready
                wr["ready"].value = int(wr_ready)
            await ReadOnly()
            try:
                if rd and req_ready and rd["req_valid"].value:
                    addr, beats = int(rd["req_addr"].value), int(rd["req_len"].value)
                    if beats < 1:
                        raise MemPortError(f"read request at {addr:#x} has length 0")
                    self._check(addr, beats * b, "read")
                    extra = rng.randint(0, t.extra_latency) if t.extra_latency else 0
                    self.reads.append(_Read(addr, beats, self.cycle + self.latency + extra))
                    self.stats["read_requests"] += 1
                if rd and offer and rd["data_ready"].value:
                    self._offered = False
                    self.stats["read_beats"] += 1
                    head.addr += b
                    head.beats -= 1
                    if head.beats == 0:
                        self.reads.popleft()
                if wr and wr_ready and wr["valid"].value:
                    addr = int(wr["addr"].value)
                    self._check(addr, b, "write")
                    data = int(wr["data"].value).to_bytes(b, "little")
                    strb = int(wr["strb"].value)
                    for j in range(b):
                        if strb >> j & 1:
                            if addr + j >= len(self.dram):
                                raise MemPortError(f"write of byte {addr + j:#x} outside the {len(self.dram)}-byte "
                                                   f"DRAM")
                            self.dram[addr + j] = data[j]
                    self.stats["write_beats"] += 1
            except MemPortError as err:
                self.error = err
                return
