"""The store module: STOREs of out-buffer tiles to DRAM (2D, strided), one write beat at a time."""
from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vta.isa import OP_STORE, layout

from . import util
from .arbiter import write_signature
from .load import _check_cfg
from .mem import sram_read_signature
from .util import BUSY, WAIT_MEM, command_queue, field, log2_exact, take_insn, validated_init

__all__ = ["StoreUnit"]


class StoreUnit(wiring.Component):
    """The store module: runs STOREs from its command queue, in order.

    Ports:
        cmd_valid/cmd_ready, cmd_data (insn_bits): the command queue's write side (``cmd_queue_depth`` entries).
        pop_prev_valid/pop_prev_ready: compute->store tokens; push_prev_valid/push_prev_ready: store->compute.
        wr: write channel (:func:`~vta.hw.arbiter.write_signature`); out_rd: out-buffer read port.
        idle: no instruction held or queued.
        state (2): IDLE/BUSY/WAIT_TOKEN/WAIT_MEM; insn_done, elem_out (an element was fully written): pulses.
    Element ``(y, x)`` comes from out entry ``sram_base + (y + y_pad_0)*(x_pad_0 + x_size + x_pad_1) + x_pad_0 + x``
    and goes to DRAM element ``dram_base + y*x_stride + x``: ``E/B`` full beats when ``E >= B``, else one beat whose
    strobes cover its ``E`` bytes. Timing: one cycle to read the first element, then one beat per cycle while the port
    accepts (the next element is read during the last beat of the previous one). A cycle whose beat the port does not
    accept counts as WAIT_MEM.
    """

    @validated_init
    def __init__(self, *, cfg):
        self.cfg = _check_cfg(cfg)
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(layout(cfg).insn_bits),
            **util.token_members("store"),
            "wr": Out(write_signature(cfg.bus_bytes)), "out_rd": Out(sram_read_signature(cfg, "out")),
            "state": Out(2), "idle": Out(1), "insn_done": Out(1), "elem_out": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = layout(cfg)
        e, b = cfg.out_elem_bytes, cfg.bus_bytes
        queue = command_queue(m, self, cfg)
        insn = Signal(lay.insn_bits)
        pops = util.pop_flags(insn, cfg, "store")
        pushes = util.push_flags(insn, cfg, "store")
        f = {name: field(insn, cfg, OP_STORE, name) for name in
             ("sram_base", "dram_base", "y_size", "x_size", "x_stride", "y_pad_0", "x_pad_0", "x_pad_1")}
        width = Signal(17)   # padded row width in entries
        m.d.comb += width.eq(f["x_pad_0"] + f["x_size"] + f["x_pad_1"])
        x = Signal(16)
        y = Signal(16)
        srow = Signal(16)    # out entry of the padded row start
        sidx = Signal(16)
        drow = Signal(32)    # DRAM element address of the row start
        delem = Signal(32)
        n_pieces = max(1, e // b)
        k = Signal(range(max(2, n_pieces)))
        last_piece = k == n_pieces - 1
        row_end = x == f["x_size"] - 1
        last_elem = row_end & (y == f["y_size"] - 1)
        next_sidx = Mux(row_end, srow + width + f["x_pad_0"], sidx + 1)[:16]
        fire = Signal()
        m.d.comb += fire.eq(self.wr.valid & self.wr.ready)

        # ---- write beat ------------------------------------------------------------------------------------------
        byte_addr = (delem << log2_exact(e))[:32]
        data = self.out_rd.data
        if e >= b:
            m.d.comb += [self.wr.addr.eq((byte_addr + (k << log2_exact(b)))[:32]),
                         self.wr.data.eq(data.word_select(k, 8 * b)), self.wr.strb.eq(-1)]
        else:
            offset = byte_addr[:log2_exact(b)]
            m.d.comb += [self.wr.addr.eq(Cat(Const(0, log2_exact(b)), byte_addr[log2_exact(b):])),
                         self.wr.data.eq(Cat(*([data] * (b // e)))),
                         self.wr.strb.eq(Const((1 << e) - 1, b) << offset)]

        with m.FSM():
            with m.State("IDLE"):
                take_insn(m, self, queue, insn)
            with m.State("TOKENS"), util.pop_state(m, self, pops):
                first = (f["sram_base"] + f["y_pad_0"] * width)[:16]
                m.d.sync += [x.eq(0), y.eq(0), k.eq(0), srow.eq(first), sidx.eq(first + f["x_pad_0"]),
                             drow.eq(f["dram_base"]), delem.eq(f["dram_base"])]
                m.next = "PUSH"
                with m.If((f["x_size"] != 0) & (f["y_size"] != 0)):
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += [self.state.eq(BUSY), self.out_rd.addr.eq(sidx), self.out_rd.en.eq(1)]
                m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += [self.wr.valid.eq(1), self.state.eq(Mux(self.wr.ready, BUSY, WAIT_MEM)),
                             self.out_rd.addr.eq(next_sidx), self.out_rd.en.eq(fire & last_piece)]
                with m.If(fire):
                    m.d.sync += k.eq(Mux(last_piece, 0, k + 1))
                    with m.If(last_piece):
                        m.d.comb += self.elem_out.eq(1)
                        m.d.sync += [sidx.eq(next_sidx), x.eq(x + 1), delem.eq(delem + 1)]
                        with m.If(row_end):
                            m.d.sync += [x.eq(0), y.eq(y + 1), srow.eq(srow + width), drow.eq(drow + f["x_stride"]),
                                         delem.eq(drow + f["x_stride"])]
                        with m.If(last_elem):
                            m.next = "PUSH"
            with m.State("PUSH"):
                util.push_state(m, self, pushes)
        return m
