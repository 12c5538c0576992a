"""The ``concurrent_alu`` knob's compute module: ALU instructions run on a second micro-op engine, beside the GEMMs.

:class:`ConcurrentAluCompute` is :class:`vta.hw.compute.ComputeUnit` with the hooks that attach :class:`AluEngine`
filled in: the front end pops an ALU instruction's tokens and hands it to the engine, which runs it with the micro-op
loop's timing and makes its pushes; the front end's pipeline runs GEMMs only. docs/hardware.md ("Codesign knobs")
gives the ordering rules.
"""
import functools
import operator
from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from vta.config import ALU_QUEUE_DEPTH, MEM_UOP
from vta.isa import OP_ALU, OP_FINISH, OP_GEMM, OP_LOAD, TOKEN_PUSHES, layout

from .compute import ComputeUnit, _alu_stage, _loop_stages
from .load import _check_cfg
from .mem import sram_read_signature, sram_write_signature
from .util import field, push_flags, push_tokens, pushes_blocked, validated_init

__all__ = ["ConcurrentAluCompute", "AluEngine"]


class ConcurrentAluCompute(ComputeUnit):
    """The compute module with ``cfg.concurrent_alu`` on.

    Ports: those of :class:`~vta.hw.compute.ComputeUnit`, but ALU instructions run on :class:`AluEngine` (a submodule,
    ``alu_engine``), whose SRAM ports are alu_uop_rd, alu_acc_rd0, alu_acc_rd1, alu_acc_wr, alu_out_wr (the core banks
    acc and out so that both engines reach them in one cycle); there is no acc_rd1 (GEMMs read acc[dst] only, with
    ``en`` only while stage C holds a micro-op), alu_insn_done pulses when the engine retires an instruction
    (insn_done counts the others) and alu_uop comes from the engine. ``state`` is the front end's.
    """

    concurrent_alu = True
    engine_done_ports = ("alu_insn_done",)

    def _members(self, cfg):
        members = super()._members(cfg)
        del members["acc_rd1"]
        return {**members, **_engine_ports(cfg)}

    def _acc_reads(self, m, c_valid, c_src):
        # the acc banks give acc_rd0's bank to the ALU engine while no GEMM micro-op reads it
        m.d.comb += self.acc_rd0.en.eq(c_valid)

    def _result(self, m, insn, opcode, dot, summed):
        # this pipeline runs GEMMs only: a reset writes zeros (with gemm_overwrite the products)
        return Mux(field(insn, self.cfg, OP_GEMM, "reset"), dot if self.cfg.gemm_overwrite else 0, summed)

    def _alu_uops(self, d_valid, opcode):
        return []  # the engine's (see _attach_engine)

    def _attach_engine(self, m, insn, opcode, is_load, pushes):
        hand_off = Signal()  # an ALU instruction goes to the engine
        wait_alu = Signal()  # the front end waits for the engine before this instruction's pops or pushes
        m.submodules.alu_engine = eng = AluEngine(cfg=self.cfg)
        for port in ("uop_rd", "acc_rd0", "acc_rd1", "acc_wr", "out_wr"):
            wiring.connect(m, wiring.flipped(getattr(self, f"alu_{port}")), getattr(eng, port))
        m.d.comb += [eng.cmd_data.eq(insn), eng.cmd_valid.eq(hand_off), self.alu_uop.eq(eng.alu_uop),
                     self.alu_insn_done.eq(eng.insn_done)]
        for flag in TOKEN_PUSHES["compute"]:  # the engine pushes only to queues the front end is not pushing to
            m.d.comb += getattr(eng, f"{flag}_ready").eq(getattr(self, f"{flag}_ready"))
        is_uop_load = is_load & (field(insn, self.cfg, OP_LOAD, "mem") == MEM_UOP)
        return _EngineLink(engine=eng, hand_off=hand_off, wait_alu=wait_alu,
                           drain=is_uop_load | (opcode == OP_FINISH),
                           push_wait=[pushes[flag] & getattr(eng, f"pending_{flag}")
                                      for flag in TOKEN_PUSHES["compute"]])

    def _wait_before_pops(self, m, link, opcode):
        # before a LOAD UOP or FINISH the engine must be empty; an ALU waits for room in its queue
        eng = link.engine
        m.d.comb += link.wait_alu.eq(Mux(opcode == OP_ALU, ~eng.cmd_ready, link.drain & ~eng.idle))
        return link.wait_alu

    def _hand_off(self, m, link, opcode, loop_init):
        with m.If(opcode == OP_ALU):  # the engine runs it, pushes its tokens and counts it
            m.d.comb += [link.hand_off.eq(1), loop_init.eq(0)]
            m.next = "IDLE"

    def _wait_before_pushes(self, m, link):
        # pushes to a queue the engine still pushes to wait until it has
        m.d.comb += link.wait_alu.eq(functools.reduce(operator.or_, link.push_wait))
        return link.wait_alu

    def _merge_engine(self, m, link):
        for flag in TOKEN_PUSHES["compute"]:
            with m.If(getattr(link.engine, f"{flag}_valid")):
                m.d.comb += getattr(self, f"{flag}_valid").eq(1)
        with m.If(~link.engine.idle):
            m.d.comb += self.idle.eq(0)


@dataclass(frozen=True)
class _EngineLink:
    """What the front end's hooks need of the engine (made by ``_attach_engine`` while elaborating)."""
    engine: "AluEngine"
    hand_off: Signal     # the front end hands the instruction it holds to the engine this cycle
    wait_alu: Signal     # the front end waits for the engine before this instruction's pops or pushes
    drain: Value         # the instruction it holds needs an empty engine first (a LOAD UOP or FINISH)
    push_wait: list      # per push flag: the instruction pushes there and an engine instruction still has to


def _engine_ports(cfg):
    """The ComputeUnit members that reach its :class:`AluEngine` (``concurrent_alu``)."""
    return {"alu_uop_rd": Out(sram_read_signature(cfg, "uop")), "alu_acc_rd0": Out(sram_read_signature(cfg, "acc")),
            "alu_acc_rd1": Out(sram_read_signature(cfg, "acc")), "alu_acc_wr": Out(sram_write_signature(cfg, "acc")),
            "alu_out_wr": Out(sram_write_signature(cfg, "out")), "alu_insn_done": Out(1)}


class AluEngine(wiring.Component):
    """The second micro-op engine of ``concurrent_alu``: runs the ALU instructions the compute module's front end
    hands it (tokens already popped), in order, each with the micro-op loop's timing (stages A-D, one micro-op per
    cycle, then the drain), then makes the instruction's pushes and retires it.

    Ports:
        cmd_valid/cmd_ready, cmd_data (insn_bits): its instruction queue (:data:`vta.config.ALU_QUEUE_DEPTH` entries).
        push_prev_*, push_next_*: token pushes (the compute module ORs them with its front end's).
        pending_prev, pending_next: an instruction queued or running pushes to that queue (the front end does not
            push there until it has).
        uop_rd, acc_rd0 (acc[dst]), acc_rd1 (acc[src]), acc_wr, out_wr: SRAM ports; the reads are enabled only
            while a micro-op needs them (the acc banks share a port with the GEMMs).
        idle: nothing queued or running. insn_done, alu_uop: one-cycle pulses.
    """

    @validated_init
    def __init__(self, *, cfg):
        self.cfg = _check_cfg(cfg)
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(layout(cfg).insn_bits),
            **{f"{flag}_{hs}": (Out(1) if hs == "valid" else In(1)) for flag in TOKEN_PUSHES["compute"]
               for hs in ("valid", "ready")},
            **{f"pending_{flag}": Out(1) for flag in TOKEN_PUSHES["compute"]},
            "uop_rd": Out(sram_read_signature(cfg, "uop")), "acc_rd0": Out(sram_read_signature(cfg, "acc")),
            "acc_rd1": Out(sram_read_signature(cfg, "acc")), "acc_wr": Out(sram_write_signature(cfg, "acc")),
            "out_wr": Out(sram_write_signature(cfg, "out")),
            "idle": Out(1), "insn_done": Out(1), "alu_uop": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = layout(cfg)
        m.submodules.queue = queue = SyncFIFOBuffered(width=lay.insn_bits, depth=ALU_QUEUE_DEPTH)
        m.d.comb += [queue.w_data.eq(self.cmd_data), queue.w_en.eq(self.cmd_valid), self.cmd_ready.eq(queue.w_rdy)]
        insn = Signal(lay.insn_bits)
        pushes = push_flags(insn, cfg, "compute")
        # instructions queued or running that push to each queue: +1 as one is queued, -1 as it pushes
        taken = push_flags(self.cmd_data, cfg, "compute")
        for flag in TOKEN_PUSHES["compute"]:
            count = Signal(range(ALU_QUEUE_DEPTH + 2), name=f"pending_{flag}_count")
            up = self.cmd_valid & self.cmd_ready & taken[flag]
            down = getattr(self, f"{flag}_valid") & getattr(self, f"{flag}_ready")
            m.d.sync += count.eq(count + up - down)
            m.d.comb += getattr(self, f"pending_{flag}").eq(count != 0)

        bgn = field(insn, cfg, OP_GEMM, "uop_bgn")
        end = field(insn, cfg, OP_GEMM, "uop_end")
        loop_empty = ((field(insn, cfg, OP_GEMM, "iter_out") == 0) | (field(insn, cfg, OP_GEMM, "iter_in") == 0)
                      | (end <= bgn))
        issue = Signal()
        loop_init = Signal()
        last_iter, b_valid, idx = _loop_stages(m, cfg, insn, OP_ALU, issue, loop_init, self.uop_rd, ("dst", "src"))
        c_valid = Signal()
        c_dst = Signal(16)
        c_src = Signal(16)
        m.d.sync += [c_valid.eq(b_valid), c_dst.eq(idx["dst"]), c_src.eq(idx["src"])]
        m.d.comb += [self.acc_rd0.addr.eq(c_dst), self.acc_rd0.en.eq(c_valid),
                     self.acc_rd1.addr.eq(c_src), self.acc_rd1.en.eq(c_valid)]
        d_valid = Signal()
        d_dst = Signal(16)
        m.d.sync += [d_valid.eq(c_valid), d_dst.eq(c_dst)]
        lanes = cfg.batch * cfg.block_out
        res = Signal(32 * lanes)
        m.d.comb += res.eq(Mux(field(insn, cfg, OP_GEMM, "reset"), 0,
                               _alu_stage(m, cfg, insn, self.acc_rd0.data, self.acc_rd1.data)))
        m.d.comb += [
            self.acc_wr.addr.eq(d_dst), self.acc_wr.data.eq(res), self.acc_wr.en.eq(Mux(d_valid, -1, 0)),
            self.out_wr.addr.eq(d_dst), self.out_wr.en.eq(d_valid),
            self.out_wr.data.eq(Cat(*[res.word_select(j, 32)[:cfg.out_width] for j in range(lanes)])),
            self.alu_uop.eq(d_valid),
        ]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [queue.r_en.eq(1), self.idle.eq(queue.level == 0)]
                with m.If(queue.r_rdy):
                    m.d.sync += insn.eq(queue.r_data)
                    m.next = "START"
            with m.State("START"):
                m.next = "PUSH"
                with m.If(~loop_empty):
                    m.d.comb += loop_init.eq(1)
                    m.next = "LOOP"
            with m.State("LOOP"):
                m.d.comb += issue.eq(1)
                with m.If(last_iter):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(~(b_valid | c_valid | d_valid)):
                    m.next = "PUSH"
            with m.State("PUSH"):
                with m.If(~pushes_blocked(self, pushes)):
                    m.d.comb += [*push_tokens(self, pushes), self.insn_done.eq(1)]
                    m.next = "IDLE"
        return m
