"""The load module: LOADs of inp and wgt tiles from DRAM into their SRAMs (2D strides, zero padding), and the
:class:`LoadEngine` it shares with the compute module (which loads micro-ops and accumulators the same way).

The inp and wgt SRAMs hold their int8 bytes in offset binary (``x ^ 0x80``; a pad byte is 0x80), the form the GEMM
core multiplies (:class:`vta.hw.gemm.GemmCore`); only the GEMM core reads them."""
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vta.config import MAX_BURST, MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_NAMES, MEM_UOP, MEM_WGT, VTAConfig
from vta.isa import LOAD_TARGETS, OP_LOAD, layout

from . import util
from .arbiter import read_signature
from .dma import DmaReader, PadWalker, piece_write
from .mem import sram_geometry, sram_write_signature
from .util import BUSY, command_queue, field, take_insn, validated_init, wait_engine

__all__ = ["LoadEngine", "LoadUnit"]

_BUFFER = {MEM_UOP: "uop", MEM_INP: "inp", MEM_WGT: "wgt", MEM_ACC: "acc", MEM_ACC_8BIT: "acc"}


def _check_cfg(cfg):
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    return cfg


class LoadEngine(wiring.Component):
    """Executes the data movement of one LOAD instruction whose memory type is one of ``targets``.

    Ports:
        cmd_valid/cmd_ready, cmd_insn (insn_bits): a LOAD with x_size >= 1, accepted while idle (with y_size = 0
            only its pad rows are written).
        mem: the read channel. ``<buf>_wr``: write port of each buffer the targets write (uop, inp, wgt, acc).
        elem_<mem> (one per target, e.g. ``elem_acc8``): one element of that type was written this cycle.
        busy: the LOAD is not finished; wait_mem: busy and stalled for lack of read data.
    Timing: pad entries take one cycle each; data entries one cycle per piece (``min(E, B)`` bytes) once their beat
    is there. Requests for the rows run ahead of the writes, bounded only by the arbiter.
    """

    @validated_init
    def __init__(self, *, cfg, targets, max_burst=MAX_BURST):
        self.cfg = _check_cfg(cfg)
        targets = tuple(targets)
        for t in targets:
            if t not in _BUFFER:
                raise ValueError(f"targets must be memory types among {sorted(_BUFFER)}, not {t!r}")
        if not targets:
            raise ValueError("targets must name at least one memory type")
        self.targets = targets
        self.max_burst = max_burst
        self.buffers = sorted({_BUFFER[t] for t in targets})
        members = {"cmd_valid": In(1), "cmd_ready": Out(1), "cmd_insn": In(layout(cfg).insn_bits),
                   "mem": Out(read_signature(cfg.bus_bytes)), "busy": Out(1), "wait_mem": Out(1)}
        for buf in self.buffers:
            members[f"{buf}_wr"] = Out(sram_write_signature(cfg, buf))
        for t in targets:
            members[f"elem_{MEM_NAMES[t]}"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        insn = self.cmd_insn
        m.submodules.walker = walker = PadWalker()
        readers = {}
        for t in self.targets:
            readers[t] = reader = DmaReader(elem_bytes=cfg.elem_bytes(t), bus_bytes=cfg.bus_bytes,
                                            max_burst=self.max_burst)
            m.submodules[f"reader_{MEM_NAMES[t]}"] = reader
        sel = Signal(3)
        start = Signal()
        mem_f = field(insn, cfg, OP_LOAD, "mem")
        y_size = field(insn, cfg, OP_LOAD, "y_size")
        rows = y_size + field(insn, cfg, OP_LOAD, "y_pad_0") + field(insn, cfg, OP_LOAD, "y_pad_1")
        m.d.comb += [
            start.eq(self.cmd_valid & self.cmd_ready),
            walker.cmd_valid.eq(start & (rows != 0)),
        ]
        ready_all = walker.cmd_ready
        for reader in readers.values():
            ready_all = ready_all & reader.cmd_ready
        m.d.comb += self.cmd_ready.eq(ready_all)
        for name in ("sram_base", "y_size", "x_size", "y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"):
            m.d.comb += getattr(walker, name).eq(field(insn, cfg, OP_LOAD, name))
        with m.If(start):
            m.d.sync += sel.eq(mem_f)
        busy = walker.busy
        for t, reader in readers.items():
            busy = busy | reader.busy
            m.d.comb += [
                reader.cmd_valid.eq(start & (mem_f == t) & (y_size != 0)),
                reader.cmd_base.eq(field(insn, cfg, OP_LOAD, "dram_base")),
                reader.cmd_y.eq(field(insn, cfg, OP_LOAD, "y_size")),
                reader.cmd_x.eq(field(insn, cfg, OP_LOAD, "x_size")),
                reader.cmd_stride.eq(field(insn, cfg, OP_LOAD, "x_stride")),
                reader.mem.req_ready.eq(self.mem.req_ready & (sel == t)),
                reader.mem.data_valid.eq(self.mem.data_valid & (sel == t)),
                reader.mem.data.eq(self.mem.data),
                reader.out_ready.eq(walker.in_ready & (sel == t)),
                getattr(self, f"elem_{MEM_NAMES[t]}").eq(walker.elem_done & (sel == t)),
            ]
            with m.If(sel == t):
                m.d.comb += [
                    self.mem.req_valid.eq(reader.mem.req_valid), self.mem.req_addr.eq(reader.mem.req_addr),
                    self.mem.req_len.eq(reader.mem.req_len), self.mem.data_ready.eq(reader.mem.data_ready),
                    walker.in_valid.eq(reader.out_valid), walker.in_last.eq(reader.out_last),
                ]
        m.d.comb += [self.busy.eq(busy), self.wait_mem.eq(walker.wait_data)]
        for buf in self.buffers:
            port = getattr(self, f"{buf}_wr")
            _, _, gran = sram_geometry(cfg, buf)
            m.d.comb += port.addr.eq(walker.idx)
            for t in self.targets:
                if _BUFFER[t] != buf:
                    continue
                reader = readers[t]
                bits = {MEM_INP: cfg.inp_width, MEM_WGT: cfg.wgt_width}.get(t, cfg.out_width)
                widen = cfg.acc_width // bits if t == MEM_ACC_8BIT else 1
                data, en = piece_write(m, walker, piece=reader.out_data, idx=reader.out_idx,
                                       elem_bytes=cfg.elem_bytes(t), piece_bytes=reader.piece_bytes,
                                       gran_bytes=gran // 8, widen=widen,
                                       offset_binary=t in (MEM_INP, MEM_WGT), elem_bits=bits)
                with m.If(sel == t):
                    m.d.comb += [port.data.eq(data), port.en.eq(en)]
        return m


class LoadUnit(wiring.Component):
    """The load module: runs LOADs of inp and wgt from its command queue, in order.

    Ports:
        cmd_valid/cmd_ready, cmd_data (insn_bits): the command queue's write side (``cmd_queue_depth`` entries).
        pop_next_valid/pop_next_ready: the compute->load token queue; push_next_valid/push_next_ready: load->compute.
        mem: read channel; inp_wr, wgt_wr: SRAM write ports.
        idle: no instruction held or queued.
        state (2): IDLE/BUSY/WAIT_TOKEN/WAIT_MEM this cycle (:mod:`vta.hw.util`); insn_done: an instruction
        completed this cycle; elem_inp, elem_wgt: an element of that type was written this cycle.
    An instruction waits for its pop token (WAIT_TOKEN), pops it, moves its data (BUSY or WAIT_MEM; nothing when
    x_size is 0), then waits until its push token fits (WAIT_TOKEN) and pushes it.
    """

    @validated_init
    def __init__(self, *, cfg):
        self.cfg = _check_cfg(cfg)
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(layout(cfg).insn_bits),
            **util.token_members("load"),
            "mem": Out(read_signature(cfg.bus_bytes)),
            "inp_wr": Out(sram_write_signature(cfg, "inp")), "wgt_wr": Out(sram_write_signature(cfg, "wgt")),
            "state": Out(2), "idle": Out(1), "insn_done": Out(1), "elem_inp": Out(1), "elem_wgt": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        queue = command_queue(m, self, cfg)
        m.submodules.engine = engine = LoadEngine(cfg=cfg, targets=LOAD_TARGETS["load"])
        wiring.connect(m, wiring.flipped(self.mem), engine.mem)
        wiring.connect(m, wiring.flipped(self.inp_wr), engine.inp_wr)
        wiring.connect(m, wiring.flipped(self.wgt_wr), engine.wgt_wr)
        m.d.comb += [self.elem_inp.eq(engine.elem_inp), self.elem_wgt.eq(engine.elem_wgt)]

        insn = Signal(layout(cfg).insn_bits)
        m.d.comb += engine.cmd_insn.eq(insn)
        pops = util.pop_flags(insn, cfg, "load")
        pushes = util.push_flags(insn, cfg, "load")
        empty = field(insn, cfg, OP_LOAD, "x_size") == 0
        with m.FSM():
            with m.State("IDLE"):
                take_insn(m, self, queue, insn)
            with m.State("TOKENS"), util.pop_state(m, self, pops):
                m.next = "START"
                with m.If(empty):
                    m.next = "PUSH"
            with m.State("START"):
                m.d.comb += [self.state.eq(BUSY), engine.cmd_valid.eq(1)]
                m.next = "RUN"
            with m.State("RUN"):
                wait_engine(m, self, engine)
            with m.State("PUSH"):
                util.push_state(m, self, pushes)
        return m
