"""The compute module: micro-op and accumulator LOADs, GEMM and ALU micro-op loops, FINISH.

The micro-op loop is a four-stage pipeline that issues one micro-op every cycle and never stalls:

* A: loop counters ``o < iter_out``, ``i < iter_in``, ``u`` in ``[uop_bgn, uop_end)``; read ``uop[u]``.
* B: indices ``d, s, w`` = micro-op fields + ``o*factor_out + i*factor_in`` (wrapping to the buffer depth);
  read ``inp[s]`` and ``wgt[w]``.
* C: the GEMM core multiplies (registered into D); read ``acc[d]`` and ``acc[s]``.
* D: ``acc[d] = 0 | acc[d] + dot | alu(acc[d], imm or acc[s])``, ``out[d]`` = its low 8 bits per lane.

Stage C reads the accumulator through ports transparent to stage D's write, so a micro-op that reads what the one
before it writes sees the new value: no hazards, no stalls.
"""
import functools
import operator

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from vta.config import ALU_QUEUE_DEPTH, MEM_UOP
from vta.isa import LOAD_TARGETS, LOOP_OPCODES, OP_ALU, OP_FINISH, OP_GEMM, OP_LOAD, TOKEN_PUSHES, layout

from .alu import AluCore
from .arbiter import read_signature
from .gemm import GemmCore, wgt_operand_bits
from .load import LoadEngine, _check_cfg
from .mem import sram_read_signature, sram_write_signature
from .util import (
    BUSY,
    WAIT_TOKEN,
    any_of,
    common_field,
    field,
    is_load_of,
    pop_flags,
    pop_tokens,
    pops_blocked,
    push_flags,
    push_tokens,
    pushes_blocked,
    take_insn,
    token_members,
    validated_init,
    wait_engine,
)

__all__ = ["ComputeUnit", "AluEngine"]


class ComputeUnit(wiring.Component):
    """The compute module.

    Ports:
        cmd_valid/cmd_ready, cmd_data (insn_bits): the command queue's write side (``cmd_queue_depth`` entries).
        pop_prev_* (load->compute), pop_next_* (store->compute), push_prev_* (compute->load), push_next_*
            (compute->store): token handshakes (``*_valid``/``*_ready``).
        mem: read channel (micro-op and accumulator loads).
        uop_wr, uop_rd, inp_rd, wgt_rd, acc_wr, acc_rd0, acc_rd1 (transparent to acc_wr), out_wr: SRAM ports.
        idle: no instruction held or queued.
        state (2): IDLE/BUSY/WAIT_TOKEN/WAIT_MEM; insn_done, finish (FINISH retired), gemm_uop, alu_uop (a micro-op
            wrote its result), elem_uop, elem_acc, elem_acc8 (an element was loaded): one-cycle pulses.
        With ``cfg.concurrent_alu``: ALU instructions run on :class:`AluEngine` (a submodule), whose SRAM ports are
            alu_uop_rd, alu_acc_rd0, alu_acc_rd1, alu_acc_wr, alu_out_wr (the core banks acc and out so that both
            engines reach them in one cycle); there is no acc_rd1 (GEMMs read acc[dst] only, with ``en`` only while
            stage C holds a micro-op), alu_insn_done pulses when the engine retires an instruction (insn_done counts
            the others) and alu_uop comes from the engine. ``state`` is the front end's.
    """

    @validated_init
    def __init__(self, *, cfg, gemm_form="packed"):
        self.cfg = _check_cfg(cfg)
        self.gemm_form = gemm_form  # GemmCore checks it
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(layout(cfg).insn_bits), **token_members("compute"),
            "mem": Out(read_signature(cfg.bus_bytes)),
            "uop_wr": Out(sram_write_signature(cfg, "uop")), "uop_rd": Out(sram_read_signature(cfg, "uop")),
            "inp_rd": Out(sram_read_signature(cfg, "inp")),
            "wgt_rd": Out(sram_read_signature(cfg, "wgt", wgt_operand_bits(cfg.block_in, cfg.block_out, gemm_form))),
            "acc_wr": Out(sram_write_signature(cfg, "acc")), "acc_rd0": Out(sram_read_signature(cfg, "acc")),
            **({} if cfg.concurrent_alu else {"acc_rd1": Out(sram_read_signature(cfg, "acc"))}),
            "out_wr": Out(sram_write_signature(cfg, "out")),
            "state": Out(2), "idle": Out(1), "insn_done": Out(1), "finish": Out(1), "gemm_uop": Out(1),
            "alu_uop": Out(1),
            "elem_uop": Out(1), "elem_acc": Out(1), "elem_acc8": Out(1),
            **(_engine_ports(cfg) if cfg.concurrent_alu else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = layout(cfg)
        ca = cfg.concurrent_alu
        m.submodules.queue = queue = SyncFIFOBuffered(width=lay.insn_bits, depth=cfg.cmd_queue_depth)
        m.submodules.engine = engine = LoadEngine(cfg=cfg, targets=LOAD_TARGETS["compute"])
        m.d.comb += [queue.w_data.eq(self.cmd_data), queue.w_en.eq(self.cmd_valid), self.cmd_ready.eq(queue.w_rdy)]
        wiring.connect(m, wiring.flipped(self.mem), engine.mem)
        wiring.connect(m, wiring.flipped(self.uop_wr), engine.uop_wr)
        m.d.comb += [self.elem_uop.eq(engine.elem_uop), self.elem_acc.eq(engine.elem_acc),
                     self.elem_acc8.eq(engine.elem_acc8)]

        insn = Signal(lay.insn_bits)
        m.d.comb += engine.cmd_insn.eq(insn)
        opcode = common_field(insn, cfg, "opcode")
        pops = pop_flags(insn, cfg, "compute")
        pushes = push_flags(insn, cfg, "compute")
        is_load = is_load_of(insn, cfg, "compute")
        load_empty = field(insn, cfg, OP_LOAD, "x_size") == 0
        is_loop = any_of(opcode, LOOP_OPCODES)
        bgn = field(insn, cfg, OP_GEMM, "uop_bgn")
        end = field(insn, cfg, OP_GEMM, "uop_end")
        iter_out = field(insn, cfg, OP_GEMM, "iter_out")
        iter_in = field(insn, cfg, OP_GEMM, "iter_in")
        loop_empty = (iter_out == 0) | (iter_in == 0) | (end <= bgn)
        pipe_busy = Signal()
        issue = Signal()
        loop_init = Signal()

        # ---- stages A and B: loop counters, micro-op read, indices; inp/wgt reads ---------------------------------
        last_iter, b_valid, idx = _loop_stages(m, cfg, insn, opcode, issue, loop_init, self.uop_rd,
                                               ("dst", "src", "wgt"))
        m.d.comb += [self.inp_rd.addr.eq(idx["src"]), self.inp_rd.en.eq(1),
                     self.wgt_rd.addr.eq(idx["wgt"]), self.wgt_rd.en.eq(1)]

        # ---- stage C: GEMM core, acc reads ---------------------------------------------------------------------
        c_valid = Signal()
        c_dst = Signal(16)
        c_src = Signal(16)
        m.d.sync += [c_valid.eq(b_valid), c_dst.eq(idx["dst"]), c_src.eq(idx["src"])]
        m.submodules.gemm = gemm = GemmCore(batch=cfg.batch, block_in=cfg.block_in, block_out=cfg.block_out,
                                                 form=self.gemm_form)
        m.d.comb += [gemm.in_valid.eq(c_valid), gemm.inp.eq(self.inp_rd.data), gemm.wgt.eq(self.wgt_rd.data),
                     self.acc_rd0.addr.eq(c_dst)]
        if ca:  # the acc banks give acc_rd0's bank to the ALU engine while no GEMM micro-op reads it
            m.d.comb += self.acc_rd0.en.eq(c_valid)
        else:
            m.d.comb += [self.acc_rd0.en.eq(1), self.acc_rd1.addr.eq(c_src), self.acc_rd1.en.eq(1)]

        # ---- stage D: accumulate / ALU, acc and out writes -----------------------------------------------------
        d_valid = Signal()
        d_dst = Signal(16)
        m.d.sync += [d_valid.eq(c_valid), d_dst.eq(c_dst)]
        lanes = cfg.batch * cfg.block_out
        if not ca:
            alu_res = _alu_stage(m, cfg, insn, self.acc_rd0.data, self.acc_rd1.data)
        summed = Cat(*[(self.acc_rd0.data.word_select(j, 32) + gemm.dot.word_select(j, 32))[:32]
                       for j in range(lanes)])
        reset = field(insn, cfg, OP_GEMM, "reset")
        res = Signal(32 * lanes)
        # a reset writes zeros; with gemm_overwrite a GEMM's reset writes its products instead
        if ca:  # this pipeline runs GEMMs only
            m.d.comb += res.eq(Mux(reset, gemm.dot if cfg.gemm_overwrite else 0, summed))
        else:
            cleared = Mux(opcode == OP_ALU, 0, gemm.dot) if cfg.gemm_overwrite else 0
            m.d.comb += res.eq(Mux(reset, cleared, Mux(opcode == OP_ALU, alu_res, summed)))
        with m.If(d_valid):
            m.d.comb += [self.acc_wr.addr.eq(d_dst), self.acc_wr.data.eq(res), self.acc_wr.en.eq(-1)]
        with m.Else():
            m.d.comb += [self.acc_wr.addr.eq(engine.acc_wr.addr), self.acc_wr.data.eq(engine.acc_wr.data),
                         self.acc_wr.en.eq(engine.acc_wr.en)]
        m.d.comb += [
            self.out_wr.addr.eq(d_dst), self.out_wr.en.eq(d_valid),
            self.out_wr.data.eq(Cat(*[res.word_select(j, 32)[:8] for j in range(lanes)])),
            self.gemm_uop.eq(d_valid & (opcode == OP_GEMM)),
            *([] if ca else [self.alu_uop.eq(d_valid & (opcode == OP_ALU))]),  # else from the engine
            pipe_busy.eq(b_valid | c_valid | d_valid),
        ]
        if ca:
            hand_off = Signal()  # an ALU instruction goes to the engine
            wait_alu = Signal()  # the front end waits for the engine before this instruction's pops or pushes
            m.submodules.alu_engine = eng = AluEngine(cfg=self.cfg)
            for port in ("uop_rd", "acc_rd0", "acc_rd1", "acc_wr", "out_wr"):
                wiring.connect(m, wiring.flipped(getattr(self, f"alu_{port}")), getattr(eng, port))
            m.d.comb += [eng.cmd_data.eq(insn), eng.cmd_valid.eq(hand_off), self.alu_uop.eq(eng.alu_uop),
                         self.alu_insn_done.eq(eng.insn_done)]
            for flag in TOKEN_PUSHES["compute"]:  # the engine pushes only to queues the front end is not pushing to
                m.d.comb += getattr(eng, f"{flag}_ready").eq(getattr(self, f"{flag}_ready"))
            is_uop_load = is_load & (field(insn, cfg, OP_LOAD, "mem") == MEM_UOP)
            drain = is_uop_load | (opcode == OP_FINISH)
            push_wait = [pushes[flag] & getattr(eng, f"pending_{flag}") for flag in TOKEN_PUSHES["compute"]]

        with m.FSM():
            with m.State("IDLE"):
                take_insn(m, self, queue, insn)
            with m.State("TOKENS"):
                if ca:  # before a LOAD UOP or FINISH the engine must be empty; an ALU waits for room in its queue
                    m.d.comb += wait_alu.eq(Mux(opcode == OP_ALU, ~eng.cmd_ready, drain & ~eng.idle))
                with m.If(pops_blocked(self, pops)):
                    m.d.comb += self.state.eq(WAIT_TOKEN)
                if ca:
                    with m.Elif(wait_alu):
                        m.d.comb += self.state.eq(BUSY)
                with m.Else():
                    m.d.comb += [self.state.eq(BUSY), *pop_tokens(self, pops)]
                    m.next = "PUSH"
                    with m.If(is_load & ~load_empty):
                        m.next = "LOAD"
                    with m.If(is_loop & ~loop_empty):
                        m.d.comb += loop_init.eq(1)
                        m.next = "LOOP"
                    if ca:  # the engine runs it, pushes its tokens and counts it
                        with m.If(opcode == OP_ALU):
                            m.d.comb += [hand_off.eq(1), loop_init.eq(0)]
                            m.next = "IDLE"
            with m.State("LOAD"):
                m.d.comb += [self.state.eq(BUSY), engine.cmd_valid.eq(1)]
                m.next = "LOAD_RUN"
            with m.State("LOAD_RUN"):
                wait_engine(m, self, engine)
            with m.State("LOOP"):
                m.d.comb += [self.state.eq(BUSY), issue.eq(1)]
                with m.If(last_iter):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += self.state.eq(BUSY)
                with m.If(~pipe_busy):
                    m.next = "PUSH"
            with m.State("PUSH"):
                blocked = pushes_blocked(self, pushes)
                if ca:  # pushes to a queue the engine still pushes to wait until it has
                    m.d.comb += wait_alu.eq(functools.reduce(operator.or_, push_wait))
                    blocked = blocked | wait_alu
                with m.If(blocked):
                    m.d.comb += self.state.eq(WAIT_TOKEN)
                with m.Else():
                    m.d.comb += [self.state.eq(BUSY), *push_tokens(self, pushes), self.insn_done.eq(1),
                                 self.finish.eq(opcode == OP_FINISH)]
                    m.next = "IDLE"
        if ca:
            for flag in TOKEN_PUSHES["compute"]:
                with m.If(getattr(eng, f"{flag}_valid")):
                    m.d.comb += getattr(self, f"{flag}_valid").eq(1)
            with m.If(~eng.idle):
                m.d.comb += self.idle.eq(0)
        return m


def _loop_stages(m, cfg, insn, opcode, issue, loop_init, uop_rd, names):
    """Stages A and B of a micro-op loop over the GEMM/ALU instruction ``insn`` (see the module docstring): the loop
    counters (reset by ``loop_init``, advanced by ``issue``), the micro-op read through ``uop_rd`` and, one cycle
    later, the indices of the micro-op fields in ``names`` plus the loop offsets. Returns ``(last_iter, b_valid,
    idx)``: ``last_iter`` is high while stage A holds the last iteration, ``b_valid`` while stage B holds an issued
    one, ``idx[name]`` (16 bits, entries) its indices."""
    lay = layout(cfg)
    bgn = field(insn, cfg, OP_GEMM, "uop_bgn")
    end = field(insn, cfg, OP_GEMM, "uop_end")
    iter_out = field(insn, cfg, OP_GEMM, "iter_out")
    iter_in = field(insn, cfg, OP_GEMM, "iter_in")
    o = Signal(len(iter_out))
    i = Signal(len(iter_in))
    u = Signal(len(bgn))
    fac = {}
    for nm in names:  # ALU and GEMM place the dst/src factors differently; wgt factors are GEMM only
        pair = []
        for suffix in ("out", "in"):
            gemm_f = field(insn, cfg, OP_GEMM, f"{nm}_factor_{suffix}")
            if nm == "wgt":
                pair.append(gemm_f)
            else:
                pair.append(Mux(opcode == OP_ALU, field(insn, cfg, OP_ALU, f"{nm}_factor_{suffix}"), gemm_f))
        fac[nm] = tuple(pair)
    base_o = {nm: Signal(16, name=f"{nm}_base_o") for nm in names}   # o * factor_out
    off = {nm: Signal(16, name=f"{nm}_off") for nm in names}         # o * factor_out + i * factor_in
    last_u = u == end - 1
    last_i = i == iter_in - 1
    last_o = o == iter_out - 1
    last_iter = Signal()
    m.d.comb += last_iter.eq(last_u & last_i & last_o)
    with m.If(loop_init):
        m.d.sync += [o.eq(0), i.eq(0), u.eq(bgn)]
        m.d.sync += [base_o[nm].eq(0) for nm in names] + [off[nm].eq(0) for nm in names]
    with m.If(issue):
        m.d.sync += u.eq(u + 1)
        with m.If(last_u):
            m.d.sync += [u.eq(bgn), i.eq(i + 1)]
            m.d.sync += [off[nm].eq(off[nm] + fac[nm][1]) for nm in names]
            with m.If(last_i):
                m.d.sync += [i.eq(0), o.eq(o + 1)]
                m.d.sync += [base_o[nm].eq(base_o[nm] + fac[nm][0]) for nm in names]
                m.d.sync += [off[nm].eq(base_o[nm] + fac[nm][0]) for nm in names]
    m.d.comb += [uop_rd.addr.eq(u), uop_rd.en.eq(1)]

    b_valid = Signal()
    b_off = {nm: Signal(16, name=f"b_{nm}_off") for nm in names}
    m.d.sync += b_valid.eq(issue)
    m.d.sync += [b_off[nm].eq(off[nm]) for nm in names]
    uop = uop_rd.data
    idx = {}
    for f in lay.uop_fields:
        if f.name in names:
            idx[f.name] = Signal(16, name=f"b_{f.name}")
            m.d.comb += idx[f.name].eq(uop[f.lsb:f.lsb + f.width] + b_off[f.name])
    return last_iter, b_valid, idx


def _alu_stage(m, cfg, insn, acc_d, acc_s):
    """The tensor ALU of stage D for the ALU instruction ``insn`` (submodule ``alu``): operands ``acc_d`` (acc[dst])
    and the immediate or ``acc_s`` (acc[src]); returns its result (``BATCH * BLOCK_OUT`` lanes of 32 bits)."""
    lanes = cfg.batch * cfg.block_out
    m.submodules.alu = alu = AluCore(lanes=lanes, requant=cfg.fused_requant)
    imm = field(insn, cfg, OP_ALU, "imm")
    if cfg.fused_requant:  # REQ's clip range; its (multiplier, shift) lanes come through b as acc[src]
        m.d.comb += alu.imm.eq(imm)
    imm32 = Cat(imm, *([imm[-1]] * (32 - len(imm))))
    use_imm = field(insn, cfg, OP_ALU, "use_imm")
    m.d.comb += [alu.op.eq(field(insn, cfg, OP_ALU, "alu_opcode")), alu.a.eq(acc_d),
                 alu.b.eq(Mux(use_imm, Cat(*([imm32] * lanes)), acc_s))]
    return alu.res


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
            self.out_wr.data.eq(Cat(*[res.word_select(j, 32)[:8] for j in range(lanes)])),
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
