"""The top-level core ``vta_core``: fetch, load, compute and store, their token queues, the SRAMs, the memory
arbiter and the control/status registers, with exactly the ports of ``docs/core-interface.md``."""
import functools
import operator

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vta.isa import TOKEN_POPS, TOKEN_PUSHES, TOKEN_QUEUES

from .arbiter import MemArbiter
from .boundary import MemBoundary
from .compute import ComputeUnit
from .concurrent_alu import ConcurrentAluCompute
from .fetch import FetchUnit
from .gemm import pack_weights, pack_weights_int, wgt_operand_bits
from .load import LoadUnit, _check_cfg
from .mem import BankedSram, Sram, StagedSram, sram_geometry
from .queues import TokenQueue
from .regs import COUNTERS, CSR_ADDR_BITS, CYCLE_CLASSES, MODULES
from .store import StoreUnit
from .util import BUSY, WAIT_MEM, WAIT_TOKEN, validated_init

__all__ = ["VTACore"]

_CLASS_CODE = {"busy": BUSY, "wait_token": WAIT_TOKEN, "wait_mem": WAIT_MEM}

# What cfg.concurrent_alu changes in the core (off, on): the compute module's class, the SRAMs' read ports, and who
# reaches which SRAM port. The ALU engine of concurrent_alu reads micro-ops through a second port and needs the acc and
# out buffers banked (BankedSram: two writers, each read port reading the bank its read_map entry names) so that both
# engines reach them in the same cycle.
_COMPUTE = {False: ComputeUnit, True: ConcurrentAluCompute}
_SRAM_READS = {
    # SRAM -> its read ports: how many (Sram), or, for a BankedSram, the bank each one reads (its read_map)
    False: {"uop": 1, "inp": 1, "wgt": 1, "acc": 2, "out": 1},
    True: {"uop": 2, "inp": 1, "wgt": 1, "acc": (0, 0, 1), "out": (0,)},
}
_SRAM_LINKS = {
    # (module.port, SRAM.port), in the order they are connected (the order shapes the generated Verilog)
    False: (("load.inp_wr", "inp.w"), ("load.wgt_wr", "wgt.w"),
            ("compute.uop_wr", "uop.w"), ("compute.uop_rd", "uop.r0"), ("compute.inp_rd", "inp.r0"),
            ("compute.wgt_rd", "wgt.r0"),
            ("compute.acc_wr", "acc.w"), ("compute.acc_rd0", "acc.r0"), ("compute.acc_rd1", "acc.r1"),
            ("compute.out_wr", "out.w"),
            ("store.out_rd", "out.r0")),
    True: (("load.inp_wr", "inp.w"), ("load.wgt_wr", "wgt.w"),
           ("compute.uop_wr", "uop.w"), ("compute.uop_rd", "uop.r0"), ("compute.inp_rd", "inp.r0"),
           ("compute.wgt_rd", "wgt.r0"), ("compute.alu_uop_rd", "uop.r1"),
           # acc[dst] of a GEMM and of an ALU micro-op share bank reader 0 (r0, r1); the ALU's acc[src] is r2
           ("compute.acc_wr", "acc.w0"), ("compute.alu_acc_wr", "acc.w1"), ("compute.acc_rd0", "acc.r0"),
           ("compute.alu_acc_rd0", "acc.r1"), ("compute.alu_acc_rd1", "acc.r2"),
           ("compute.out_wr", "out.w0"), ("compute.alu_out_wr", "out.w1"),
           ("store.out_rd", "out.r0")),
}


def _token_links():
    """``(name, writer, push flag, reader, pop flag)`` of each dependency token queue of :data:`vta.isa.TOKEN_QUEUES`,
    in that order, from :data:`vta.isa.TOKEN_PUSHES` and :data:`~vta.isa.TOKEN_POPS`; ``name`` is the queue's
    submodule name without ``tq_`` (``l2c`` for load_to_compute)."""
    links = []
    for queue in TOKEN_QUEUES:
        (src, push), = [(unit, f) for unit, flags in TOKEN_PUSHES.items() for f, q in flags.items() if q == queue]
        (dst, pop), = [(unit, f) for unit, flags in TOKEN_POPS.items() for f, q in flags.items() if q == queue]
        links.append((f"{src[0]}2{dst[0]}", src, push, dst, pop))
    return links


def core_signature(cfg):
    """The ports of ``vta_core`` (see docs/core-interface.md); ``clk`` and ``rst`` come from the sync domain."""
    b = cfg.bus_bytes
    return wiring.Signature({
        "start": In(1), "insn_addr": In(32), "insn_count": In(32), "done": Out(1),
        "csr_addr": In(CSR_ADDR_BITS), "csr_rdata": Out(64), "progress": Out(1),
        "mem_rd_req_valid": Out(1), "mem_rd_req_ready": In(1), "mem_rd_req_addr": Out(32), "mem_rd_req_len": Out(16),
        "mem_rd_data_valid": In(1), "mem_rd_data_ready": Out(1), "mem_rd_data": In(8 * b),
        "mem_wr_valid": Out(1), "mem_wr_ready": In(1), "mem_wr_addr": Out(32), "mem_wr_data": Out(8 * b),
        "mem_wr_strb": Out(b),
    })


class VTACore(wiring.Component):
    """The whole accelerator for config ``cfg``.

    ``start`` (a one-cycle pulse while not running) clears the counters and starts fetching; counters count every
    cycle from the one after ``start`` up to and including the one in which compute has retired FINISH, every other
    module is idle and the memory boundary (:class:`vta.hw.boundary.MemBoundary`) holds nothing (usually the cycle
    FINISH retires); ``done`` rises the cycle after that and stays high until the next ``start``. ``csr_rdata``
    shows counter ``csr_addr`` (see :mod:`vta.hw.regs`) combinationally; counters saturate at 2**64 - 1. The clear
    takes effect at the end of the cycle after ``start`` (``csr_rdata`` shows the old values in that cycle).

    Only ``csr_rdata`` depends combinationally on an input (``csr_addr``); the memory port is registered (one more
    cycle of latency each way, see docs/core-interface.md).
    """

    @validated_init
    def __init__(self, *, cfg, gemm_form="packed"):
        self.cfg = _check_cfg(cfg)
        self.gemm_form = gemm_form  # see vta.hw.gemm.GEMM_FORMS
        super().__init__(core_signature(cfg))

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.fetch = fetch = FetchUnit(cfg=cfg)
        m.submodules.load = load = LoadUnit(cfg=cfg)
        m.submodules.compute = compute = _COMPUTE[cfg.concurrent_alu](cfg=cfg, gemm_form=self.gemm_form)
        m.submodules.store = store = StoreUnit(cfg=cfg)
        m.submodules.arbiter = arb = MemArbiter(n_readers=3, bus_bytes=cfg.bus_bytes)
        m.submodules.boundary = bnd = MemBoundary(bus_bytes=cfg.bus_bytes)
        units = {"fetch": fetch, "load": load, "compute": compute, "store": store}
        srams = {}
        for name, reads in _SRAM_READS[cfg.concurrent_alu].items():
            srams[name] = m.submodules[f"{name}_buf"] = _sram(cfg, name, reads, self.gemm_form)
        for port, sram_port in _SRAM_LINKS[cfg.concurrent_alu]:
            unit, member = port.split(".")
            sram, sram_member = sram_port.split(".")
            wiring.connect(m, getattr(units[unit], member), getattr(srams[sram], sram_member))
        wiring.connect(m, fetch.mem, arb.rd_0)
        wiring.connect(m, load.mem, arb.rd_1)
        wiring.connect(m, compute.mem, arb.rd_2)
        wiring.connect(m, store.wr, arb.wr_0)

        # Command queues (inside each module) and token queues.
        for unit, dest in (("load", load), ("compute", compute), ("store", store)):
            m.d.comb += [dest.cmd_valid.eq(getattr(fetch, f"{unit}_cmd_valid")),
                         dest.cmd_data.eq(getattr(fetch, f"{unit}_cmd_data")),
                         getattr(fetch, f"{unit}_cmd_ready").eq(dest.cmd_ready)]
        tq = cfg.token_queue_depth
        for name, writer, push, reader, pop in _token_links():
            src, dst = units[writer], units[reader]
            m.submodules[f"tq_{name}"] = q = TokenQueue(depth=tq)
            m.d.comb += [q.push_valid.eq(getattr(src, f"{push}_valid")), getattr(src, f"{push}_ready").eq(q.push_ready),
                         getattr(dst, f"{pop}_valid").eq(q.pop_valid), q.pop_ready.eq(getattr(dst, f"{pop}_ready"))]

        # Memory port, behind the registered boundary: top-level inputs feed only its FIFOs' flip-flops.
        wiring.connect(m, arb.mem_rd, bnd.rd)
        wiring.connect(m, arb.mem_wr, bnd.wr)
        for name in ("req_valid", "req_addr", "req_len", "data_ready"):
            m.d.comb += getattr(self, f"mem_rd_{name}").eq(getattr(bnd.mem_rd, name))
        for name in ("req_ready", "data_valid", "data"):
            m.d.comb += getattr(bnd.mem_rd, name).eq(getattr(self, f"mem_rd_{name}"))
        for name in ("valid", "addr", "data", "strb"):
            m.d.comb += getattr(self, f"mem_wr_{name}").eq(getattr(bnd.mem_wr, name))
        m.d.comb += bnd.mem_wr.ready.eq(self.mem_wr_ready)

        # Control.
        running = Signal()
        m.d.comb += [fetch.start.eq(self.start & ~running), fetch.insn_addr.eq(self.insn_addr),
                     fetch.insn_count.eq(self.insn_count)]
        # FINISH may retire while load or store still run instructions nothing waits for (fsim runs every instruction
        # before FINISH): done waits for them too, so the counters cover the whole program.
        finished = Signal()
        others_idle = Signal()
        m.d.comb += others_idle.eq(fetch.idle & load.idle & store.idle & bnd.idle)
        with m.If(self.start & ~running):
            m.d.sync += [running.eq(1), self.done.eq(0), finished.eq(0)]
        with m.Elif(running & (compute.finish | finished)):
            m.d.sync += finished.eq(1)
            with m.If(others_idle & (compute.finish | compute.idle)):
                m.d.sync += [running.eq(0), self.done.eq(1), finished.eq(0)]
        # Beats counted where they cross between the boundary and the arbiter: a function of state, not of the
        # host's inputs (the boundary stops taking beats within two cycles when the modules stop).
        rd_beat = bnd.rd.data_valid & bnd.rd.data_ready
        wr_beat = bnd.wr.valid & bnd.wr.ready
        progress = (fetch.insn_done | load.insn_done | compute.insn_done | store.insn_done | compute.gemm_uop |
                    compute.alu_uop | rd_beat | wr_beat)
        # an engine of the compute module (concurrent_alu's ALU engine) retires its instructions on its own
        engines_done = [getattr(compute, name) for name in compute.engine_done_ports]
        m.d.comb += self.progress.eq(functools.reduce(operator.or_, engines_done, progress))

        # Counters.
        inc = {"cycles": running}
        for mod in MODULES:
            for cls in CYCLE_CLASSES:
                inc[f"{mod}_{cls}"] = running & (units[mod].state == _CLASS_CODE[cls])
            inc[f"{mod}_insns"] = units[mod].insn_done
        inc["compute_insns"] = functools.reduce(operator.add, engines_done, compute.insn_done)
        inc.update({
            "gemm_uops": compute.gemm_uop, "alu_uops": compute.alu_uop,
            "insn_bytes_read": Mux(fetch.insn_done, fetch.insn_bytes, 0),
            "uop_bytes_read": Mux(compute.elem_uop, cfg.uop_bytes, 0),
            "wgt_bytes_read": Mux(load.elem_wgt, cfg.wgt_elem_bytes, 0),
            "inp_bytes_read": Mux(load.elem_inp, cfg.inp_elem_bytes, 0),
            "acc_bytes_read": Mux(compute.elem_acc, cfg.acc_elem_bytes, 0) + Mux(compute.elem_acc8,
                                                                               cfg.out_elem_bytes, 0),
            "out_bytes_written": Mux(store.elem_out, cfg.out_elem_bytes, 0),
        })
        missing = set(COUNTERS) - set(inc)
        if missing:  # guards vta/counters.py and this file against drifting apart
            raise ValueError(f"counters {sorted(missing)} of vta.counters have no definition in the core")
        # The clear that start requests is applied one edge late, as "restart from this cycle's increment", so that no
        # counter's next value depends on the start input combinationally. Same counts as clearing at the start edge:
        # both drop the start cycle's increments.
        clear = Signal()
        m.d.sync += clear.eq(self.start & ~running)
        _counters(m, inc, clear, self.csr_addr, self.csr_rdata)
        return m


def _sram(cfg, name, reads, gemm_form):
    """The SRAM ``name`` (``uop``, ``inp``, ``wgt``, ``acc`` or ``out``) with the read ports ``reads`` of
    :data:`_SRAM_READS`; acc's reads are transparent to its write (stage C reads what stage D writes)."""
    width, depth, gran = sram_geometry(cfg, name)
    transparent = name == "acc"
    # inp and wgt hold offset-binary values (x ^ 0x80, or x ^ 0x8 per int4 nibble, see vta.hw.load): 0x80 (0x88)
    # is the zero they start as
    bits = {"inp": cfg.inp_width, "wgt": cfg.wgt_width}.get(name, 8)
    fill = (0x80 if bits == 8 else 0x88) if name in ("inp", "wgt") else 0
    if name == "wgt" and gemm_form == "packed":
        # the packed GEMM core reads weight tiles packed: packed once as they are stored
        bi, bo = cfg.block_in, cfg.block_out
        widths = {"inp_bits": cfg.inp_width, "wgt_bits": cfg.wgt_width}
        return StagedSram(width=width, depth=depth, granularity=gran,
                          transform=functools.partial(pack_weights, block_in=bi, block_out=bo, **widths),
                          stored_width=wgt_operand_bits(bi, bo, "packed", **widths),
                          init=pack_weights_int([1 << (cfg.wgt_width - 1)] * (bi * bo), bi, bo, **widths))
    if isinstance(reads, tuple):
        return BankedSram(width=width, depth=depth, granularity=gran, transparent=transparent, read_map=reads)
    return Sram(width=width, depth=depth, granularity=gran, n_read=reads, transparent=transparent, fill_byte=fill)


def _counters(m, inc, clear, csr_addr, csr_rdata):
    """The 64-bit saturating counters of :data:`vta.hw.regs.COUNTERS` (``cnt_<name>``), each adding ``inc[name]``
    every cycle (restarting from it in a cycle ``clear`` is high), and the read mux ``csr_rdata`` = counter
    ``csr_addr``."""
    counters = []
    for name in COUNTERS:
        cnt = Signal(64, name=f"cnt_{name}")
        with m.If(clear):
            m.d.sync += cnt.eq(inc[name])
        with m.Elif(cnt != (1 << 64) - 1):
            m.d.sync += cnt.eq(cnt + inc[name])
        counters.append(cnt)
    with m.Switch(csr_addr):
        for k, cnt in enumerate(counters):
            with m.Case(k):
                m.d.comb += csr_rdata.eq(cnt)
