"""The memory port: read/write channel signatures and the arbiter that lets several modules share one DRAM port.

Read channel (from the requester's side; ``B`` = bus bytes):

* ``req_valid``/``req_ready``/``req_addr``/``req_len``: a request for ``req_len`` (>= 1) beats starting at byte
  address ``req_addr`` (a multiple of ``B``); transferred in a cycle where both valid and ready are high.
* ``data_valid``/``data_ready``/``data``: beats of ``8*B`` bits, little-endian, returned in request order; a beat is
  transferred in a cycle where both valid and ready are high (the sender holds it otherwise).

Write channel: ``valid``/``ready``/``addr``/``data``/``strb``: one beat of ``B`` bytes at byte address ``addr`` (a
multiple of ``B``) with byte enables ``strb``, transferred when valid and ready are both high.
"""
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from vta.config import MAX_OUTSTANDING

from .util import check_int, validated_init

__all__ = ["read_signature", "write_signature", "MemArbiter"]

ADDR_BITS = 32
LEN_BITS = 16


def read_signature(bus_bytes):
    """Read channel as seen by a requester (requests out, data in)."""
    return wiring.Signature({
        "req_valid": Out(1), "req_ready": In(1), "req_addr": Out(ADDR_BITS), "req_len": Out(LEN_BITS),
        "data_valid": In(1), "data_ready": Out(1), "data": In(8 * bus_bytes),
    })


def write_signature(bus_bytes):
    """Write channel as seen by a writer."""
    return wiring.Signature({
        "valid": Out(1), "ready": In(1), "addr": Out(ADDR_BITS), "data": Out(8 * bus_bytes), "strb": Out(bus_bytes),
    })


class MemArbiter(wiring.Component):
    """Shares one memory port among ``n_readers`` read requesters and one writer.

    Ports: ``rd_<k>`` (flipped read channel of requester ``k``), ``wr_0`` (flipped write channel), ``mem_rd`` and
    ``mem_wr`` (towards DRAM).

    Timing: requests are granted round-robin, at most one per cycle, combinationally (a requester's ``req_ready`` is
    high in the cycle its request is forwarded and accepted by ``mem_rd``). The arbiter remembers the requester and
    length of up to ``max_outstanding`` (:data:`vta.config.MAX_OUTSTANDING` unless given) accepted requests and
    routes the returning beats, in order, to their requester: ``data_valid``/``data_ready`` pass through
    combinationally. A requester must consume every beat it asked for without waiting on anything but itself, or the
    port stalls for everyone. The write channel passes straight through (there is one writer, the store module).
    """

    @validated_init
    def __init__(self, *, n_readers, bus_bytes, max_outstanding=MAX_OUTSTANDING):
        self.n_readers = check_int("n_readers", n_readers, lo=1, hi=16)
        self.bus_bytes = check_int("bus_bytes", bus_bytes, lo=1, hi=128, pow2=True)
        self.max_outstanding = check_int("max_outstanding", max_outstanding, lo=1, hi=256)
        members = {f"rd_{k}": In(read_signature(bus_bytes)) for k in range(n_readers)}
        members["wr_0"] = In(write_signature(bus_bytes))
        members["mem_rd"] = Out(read_signature(bus_bytes))
        members["mem_wr"] = Out(write_signature(bus_bytes))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n = self.n_readers
        rds = [getattr(self, f"rd_{k}") for k in range(n)]
        id_bits = max(1, (n - 1).bit_length())
        m.submodules.tags = tags = SyncFIFO(width=id_bits + LEN_BITS, depth=self.max_outstanding)

        # Round-robin grant: the first valid requester after the last granted one.
        last = Signal(range(n), init=n - 1)
        grant = Signal(range(n))
        any_valid = Signal()
        for off in reversed(range(1, n + 1)):
            for k in range(n):
                with m.If(last == k):
                    idx = (k + off) % n
                    with m.If(rds[idx].req_valid):
                        m.d.comb += [grant.eq(idx), any_valid.eq(1)]
        fire = Signal()
        m.d.comb += [
            self.mem_rd.req_valid.eq(any_valid & tags.w_rdy),
            fire.eq(self.mem_rd.req_valid & self.mem_rd.req_ready),
            tags.w_en.eq(fire),
            tags.w_data.eq(grant | (self.mem_rd.req_len << id_bits)),
        ]
        for k in range(n):
            with m.If(grant == k):
                m.d.comb += [self.mem_rd.req_addr.eq(rds[k].req_addr), self.mem_rd.req_len.eq(rds[k].req_len)]
            m.d.comb += rds[k].req_ready.eq(fire & (grant == k))
        with m.If(fire):
            m.d.sync += last.eq(grant)

        # Return path: beats go to the requester at the head of the tag FIFO.
        head_id = tags.r_data[:id_bits]
        head_len = tags.r_data[id_bits:]
        count = Signal(LEN_BITS)
        beat = Signal()
        m.d.comb += beat.eq(self.mem_rd.data_valid & self.mem_rd.data_ready)
        for k in range(n):
            m.d.comb += [rds[k].data.eq(self.mem_rd.data),
                         rds[k].data_valid.eq(self.mem_rd.data_valid & tags.r_rdy & (head_id == k))]
            with m.If(tags.r_rdy & (head_id == k)):
                m.d.comb += self.mem_rd.data_ready.eq(rds[k].data_ready)
        with m.If(beat):
            with m.If(count + 1 == head_len):
                m.d.sync += count.eq(0)
                m.d.comb += tags.r_en.eq(1)
            with m.Else():
                m.d.sync += count.eq(count + 1)

        for name in ("valid", "addr", "data", "strb"):
            m.d.comb += getattr(self.mem_wr, name).eq(getattr(self.wr_0, name))
        m.d.comb += self.wr_0.ready.eq(self.mem_wr.ready)
        return m
