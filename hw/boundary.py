"""The registered boundary between the core's memory arbiter and its top-level memory port.

Three small FIFOs, one per direction of traffic (read requests out, read data in, writes out), so that no top-level
output of ``vta_core`` depends combinationally on a top-level input of the memory port and every such input feeds
flip-flops only. Two reasons: timing closure (the host's handshake and data inputs no longer reach the arbiter, the
DMA readers and the SRAM write ports in the same cycle), and simulation speed (Verilator re-evaluates all logic that
depends on a top-level input in an extra pass every evaluation; with the boundary that pass is nearly empty).
"""
from amaranth.hdl import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from .arbiter import ADDR_BITS, LEN_BITS, read_signature, write_signature
from .util import check_int, validated_init

__all__ = ["MemBoundary"]


class MemBoundary(wiring.Component):
    """A 2-entry FIFO on each channel of the memory port: ``rd`` and ``wr`` (flipped read and write channels, from
    the arbiter's ``mem_rd``/``mem_wr``) on one side, ``mem_rd`` and ``mem_wr`` (towards DRAM) on the other.

    Ports:
        rd (read channel, flipped): ``req_ready`` is high while the request FIFO has room; a request transferred in
            cycle t is on ``mem_rd.req_*`` from cycle t+1. ``data_valid``/``data`` show the head of the data FIFO
            and ``data_ready`` pops it.
        mem_rd (read channel): ``req_valid``/``req_addr``/``req_len`` show the head of the request FIFO and
            ``req_ready`` pops it. ``data_ready`` is high while the data FIFO has room; a beat transferred in cycle t
            is on ``rd.data`` from cycle t+1.
        wr (write channel, flipped), mem_wr (write channel): ``wr.ready`` is high while the write FIFO has room; a
            beat transferred in cycle t is on ``mem_wr.*`` from cycle t+1, until ``mem_wr.ready`` pops it.
        idle (out): every FIFO is empty (nothing in flight inside the boundary).
    Every output is a function of the FIFOs' state alone, never of an input in the same cycle. With two entries a
    channel still moves one item per cycle when both of its sides are ready every cycle; the cost is one cycle of
    latency per direction (a read's first beat reaches its requester two cycles later than without the boundary).
    """

    @validated_init
    def __init__(self, *, bus_bytes):
        self.bus_bytes = check_int("bus_bytes", bus_bytes, lo=1, hi=128, pow2=True)
        super().__init__({
            "rd": In(read_signature(bus_bytes)), "wr": In(write_signature(bus_bytes)),
            "mem_rd": Out(read_signature(bus_bytes)), "mem_wr": Out(write_signature(bus_bytes)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        b = self.bus_bytes
        m.submodules.req = req = SyncFIFO(width=ADDR_BITS + LEN_BITS, depth=2)
        m.submodules.data = data = SyncFIFO(width=8 * b, depth=2)
        m.submodules.write = write = SyncFIFO(width=ADDR_BITS + 8 * b + b, depth=2)

        m.d.comb += [
            req.w_en.eq(self.rd.req_valid),
            req.w_data.eq(Cat(self.rd.req_addr, self.rd.req_len)),
            self.rd.req_ready.eq(req.w_rdy),
            self.mem_rd.req_valid.eq(req.r_rdy),
            Cat(self.mem_rd.req_addr, self.mem_rd.req_len).eq(req.r_data),
            req.r_en.eq(self.mem_rd.req_ready),
        ]
        m.d.comb += [
            data.w_en.eq(self.mem_rd.data_valid),
            data.w_data.eq(self.mem_rd.data),
            self.mem_rd.data_ready.eq(data.w_rdy),
            self.rd.data_valid.eq(data.r_rdy),
            self.rd.data.eq(data.r_data),
            data.r_en.eq(self.rd.data_ready),
        ]
        m.d.comb += [
            write.w_en.eq(self.wr.valid),
            write.w_data.eq(Cat(self.wr.addr, self.wr.data, self.wr.strb)),
            self.wr.ready.eq(write.w_rdy),
            self.mem_wr.valid.eq(write.r_rdy),
            Cat(self.mem_wr.addr, self.mem_wr.data, self.mem_wr.strb).eq(write.r_data),
            write.r_en.eq(self.mem_wr.ready),
        ]
        m.d.comb += self.idle.eq(~req.r_rdy & ~data.r_rdy & ~write.r_rdy)
        return m
