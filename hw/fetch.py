"""The fetch module: reads the instruction stream from DRAM and routes each instruction to its module's queue."""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from vta.isa import OP_STORE, layout

from .arbiter import read_signature
from .load import _check_cfg
from .util import BUSY, IDLE, WAIT_MEM, WAIT_TOKEN, common_field, is_load_of, log2_exact, validated_init

__all__ = ["FetchUnit"]


class FetchUnit(wiring.Component):
    """Fetches ``insn_count`` instructions of ``insn_bytes`` bytes from byte address ``insn_addr``.

    Ports:
        start (in): one-cycle pulse while idle (every instruction dispatched, as after reset); latches
            ``insn_addr`` (a multiple of the bus width and of the instruction size) and ``insn_count``, and begins
            fetching. No output depends on it combinationally.
        mem: read channel. Requests cover ``chunk`` instructions (the last one fewer) and are issued only while the
            internal buffer has room for every instruction requested, so fetch never holds up the shared port.
        load_cmd_*, compute_cmd_*, store_cmd_* (valid/ready/data): the three command queues. STORE goes to store,
            LOAD of inp/wgt to load, everything else (LOAD uop/acc, GEMM, ALU, FINISH) to compute.
        state (2): IDLE (all dispatched), WAIT_TOKEN (the head instruction's queue is full), WAIT_MEM (no
            instruction fetched yet to dispatch), BUSY (dispatching). idle: every instruction is dispatched.
            insn_done: an instruction was dispatched.
    Timing: one instruction dispatched per cycle at most.
    """

    @validated_init
    def __init__(self, *, cfg):
        self.cfg = _check_cfg(cfg)
        bits = layout(cfg).insn_bits
        self.insn_bytes = bits // 8
        self.chunk = max(4, cfg.bus_bytes // self.insn_bytes)
        self.buffer_depth = 2 * self.chunk
        members = {"start": In(1), "insn_addr": In(32), "insn_count": In(32),
                   "mem": Out(read_signature(cfg.bus_bytes)), "state": Out(2), "idle": Out(1), "insn_done": Out(1)}
        for unit in ("load", "compute", "store"):
            members.update({f"{unit}_cmd_valid": Out(1), f"{unit}_cmd_ready": In(1), f"{unit}_cmd_data": Out(bits)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        e, b = self.insn_bytes, cfg.bus_bytes
        bits = 8 * e
        m.submodules.buf = buf = SyncFIFOBuffered(width=bits, depth=self.buffer_depth)
        count = Signal(32)
        req_idx = Signal(32)     # next instruction to request
        push_idx = Signal(32)    # next instruction to enter the buffer
        sent = Signal(32)        # instructions dispatched
        inflight = Signal(range(self.buffer_depth + self.chunk + 1))
        with m.If(self.start):
            m.d.sync += [count.eq(self.insn_count), req_idx.eq(0), push_idx.eq(0), sent.eq(0)]
        base = Signal(32)
        with m.If(self.start):
            m.d.sync += base.eq(self.insn_addr)

        # ---- requests ------------------------------------------------------------------------------------------
        remaining = Signal(32)
        n = Signal(range(self.chunk + 1))
        m.d.comb += [remaining.eq(count - req_idx), n.eq(Mux(remaining > self.chunk, self.chunk, remaining))]
        room = buf.level + inflight + self.chunk <= self.buffer_depth
        m.d.comb += [
            # idle when start comes, so req_idx == count: no request goes out with the previous stream's state
            self.mem.req_valid.eq((req_idx != count) & room),
            self.mem.req_addr.eq((base + (req_idx << log2_exact(e)))[:32]),
            self.mem.req_len.eq(((n << log2_exact(e)) + b - 1) >> log2_exact(b)),
        ]
        req_fire = self.mem.req_valid & self.mem.req_ready
        push = Signal()
        with m.If(req_fire):
            m.d.sync += req_idx.eq(req_idx + n)
        m.d.sync += inflight.eq(inflight + Mux(req_fire, n, 0) - push)

        # ---- beats -> instructions into the buffer -------------------------------------------------------------
        if e >= b:
            n_pieces = e // b
            k = Signal(range(max(2, n_pieces)))
            parts = Signal(max(1, bits - 8 * b))
            last = k == n_pieces - 1
            m.d.comb += [
                self.mem.data_ready.eq(buf.w_rdy),
                buf.w_data.eq(Cat(parts, self.mem.data) if n_pieces > 1 else self.mem.data),
                push.eq(self.mem.data_valid & buf.w_rdy & last),
            ]
            with m.If(self.mem.data_valid & self.mem.data_ready):
                if n_pieces > 1:
                    m.d.sync += [k.eq(Mux(last, 0, k + 1)), parts.word_select(k, 8 * b).eq(self.mem.data)]
        else:
            per_beat = b // e
            slot = Signal(range(per_beat))
            m.d.comb += [
                buf.w_data.eq(self.mem.data.word_select(slot, bits)),
                push.eq(self.mem.data_valid & buf.w_rdy),
                self.mem.data_ready.eq(push & ((slot == per_beat - 1) | (push_idx == count - 1))),
            ]
            with m.If(push):
                m.d.sync += slot.eq(Mux(self.mem.data_ready, 0, slot + 1))
        m.d.comb += buf.w_en.eq(push)
        with m.If(push):
            m.d.sync += push_idx.eq(push_idx + 1)

        # ---- dispatch ------------------------------------------------------------------------------------------
        head = buf.r_data
        to_load = is_load_of(head, cfg, "load")
        to_store = common_field(head, cfg, "opcode") == OP_STORE
        to_compute = ~to_load & ~to_store
        target_ready = Mux(to_load, self.load_cmd_ready, Mux(to_store, self.store_cmd_ready, self.compute_cmd_ready))
        for unit, sel in (("load", to_load), ("compute", to_compute), ("store", to_store)):
            m.d.comb += [getattr(self, f"{unit}_cmd_data").eq(head),
                         getattr(self, f"{unit}_cmd_valid").eq(buf.r_rdy & sel)]
        m.d.comb += [buf.r_en.eq(target_ready), self.insn_done.eq(buf.r_rdy & target_ready)]
        with m.If(self.insn_done):
            m.d.sync += sent.eq(sent + 1)
        with m.If(sent == count):
            m.d.comb += [self.state.eq(IDLE), self.idle.eq(1)]
        with m.Elif(~buf.r_rdy):
            m.d.comb += self.state.eq(WAIT_MEM)
        with m.Elif(~target_ready):
            m.d.comb += self.state.eq(WAIT_TOKEN)
        with m.Else():
            m.d.comb += self.state.eq(BUSY)
        return m
