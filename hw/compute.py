"""The compute module: micro-op and accumulator LOADs, GEMM and ALU micro-op loops, FINISH.

The micro-op loop is a four-stage pipeline that issues one micro-op every cycle and never stalls:

* A: loop counters ``o < iter_out``, ``i < iter_in``, ``u`` in ``[uop_bgn, uop_end)``; read ``uop[u]``.
* B: indices ``d, s, w`` = micro-op fields + ``o*factor_out + i*factor_in`` (wrapping to the buffer depth);
  read ``inp[s]`` and ``wgt[w]``.
* C: the GEMM core multiplies (registered into D); read ``acc[d]`` and ``acc[s]``.
* D: ``acc[d] = 0 | acc[d] + dot | alu(acc[d], imm or acc[s])``, ``out[d]`` = its low 8 bits per lane.

Stage C reads the accumulator through ports transparent to stage D's write, so a micro-op that reads what the one
before it writes sees the new value: no hazards, no stalls.

With the ``alu_pipeline`` knob an ALU micro-op takes one more stage (GEMM micro-ops are unchanged):

* D: the ALU's operands, ``acc[d]`` and the immediate or ``acc[s]``, are registered (nothing is written);
* E: ``acc[d] = alu(a, b)``, ``out[d]`` its low 8 bits per lane.

A micro-op in D reading the entry the micro-op in E writes takes E's result instead of the (older) block-RAM data:
the forward costs no cycle. One micro-op later the transparent read sees the write, as without the knob.

This is VTA's compute module, where GEMM and ALU instructions share the pipeline. The ``concurrent_alu`` knob's
variant, which hands ALU instructions to a second engine, is :mod:`vta.hw.concurrent_alu`: a subclass that fills in
the hooks (``_acc_reads`` ... ``_merge_engine``) this class leaves empty.
"""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vta.isa import LOAD_TARGETS, LOOP_OPCODES, OP_ALU, OP_FINISH, OP_GEMM, OP_LOAD, layout

from . import util
from .alu import AluCore
from .arbiter import read_signature
from .gemm import GemmCore, wgt_operand_bits
from .load import LoadEngine, _check_cfg
from .mem import sram_read_signature, sram_write_signature
from .util import BUSY, any_of, command_queue, common_field, field, is_load_of, take_insn, validated_init, wait_engine

__all__ = ["ComputeUnit"]


class ComputeUnit(wiring.Component):
    """The compute module of VTA's design (``cfg.concurrent_alu`` off; on, it is
    :class:`vta.hw.concurrent_alu.ConcurrentAluCompute`).

    Ports:
        cmd_valid/cmd_ready, cmd_data (insn_bits): the command queue's write side (``cmd_queue_depth`` entries).
        pop_prev_* (load->compute), pop_next_* (store->compute), push_prev_* (compute->load), push_next_*
            (compute->store): token handshakes (``*_valid``/``*_ready``).
        mem: read channel (micro-op and accumulator loads).
        uop_wr, uop_rd, inp_rd, wgt_rd, acc_wr, acc_rd0, acc_rd1 (transparent to acc_wr), out_wr: SRAM ports.
        idle: no instruction held or queued.
        state (2): IDLE/BUSY/WAIT_TOKEN/WAIT_MEM; insn_done, finish (FINISH retired), gemm_uop, alu_uop (a micro-op
            wrote its result), elem_uop, elem_acc, elem_acc8 (an element was loaded): one-cycle pulses.
    """

    concurrent_alu = False
    """The value of ``cfg.concurrent_alu`` this class builds."""
    engine_done_ports: tuple[str, ...] = ()
    """Ports pulsing when an engine other than the front end retires an instruction (``insn_done`` counts the
    front end's)."""

    @validated_init
    def __init__(self, *, cfg, gemm_form="packed"):
        self.cfg = _check_cfg(cfg)
        if cfg.concurrent_alu != self.concurrent_alu:
            right = "vta.hw.concurrent_alu.ConcurrentAluCompute" if cfg.concurrent_alu else "vta.hw.compute.ComputeUnit"
            raise ValueError(f"cfg.concurrent_alu is {cfg.concurrent_alu} (config {cfg.name}): its compute module is "
                             f"{right}, not {type(self).__module__}.{type(self).__name__}")
        self.gemm_form = gemm_form  # GemmCore checks it
        super().__init__(self._members(cfg))

    def _members(self, cfg):
        """The signature members (see the class docstring)."""
        return {
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_data": In(layout(cfg).insn_bits),
            **util.token_members("compute"),
            "mem": Out(read_signature(cfg.bus_bytes)),
            "uop_wr": Out(sram_write_signature(cfg, "uop")), "uop_rd": Out(sram_read_signature(cfg, "uop")),
            "inp_rd": Out(sram_read_signature(cfg, "inp")),
            "wgt_rd": Out(sram_read_signature(cfg, "wgt", wgt_operand_bits(cfg.block_in, cfg.block_out,
                                                                            self.gemm_form, cfg.inp_width,
                                                                            cfg.wgt_width))),
            "acc_wr": Out(sram_write_signature(cfg, "acc")), "acc_rd0": Out(sram_read_signature(cfg, "acc")),
            "acc_rd1": Out(sram_read_signature(cfg, "acc")),
            "out_wr": Out(sram_write_signature(cfg, "out")),
            "state": Out(2), "idle": Out(1), "insn_done": Out(1), "finish": Out(1), "gemm_uop": Out(1),
            "alu_uop": Out(1),
            "elem_uop": Out(1), "elem_acc": Out(1), "elem_acc8": Out(1),
        }

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        lay = layout(cfg)
        queue = command_queue(m, self, cfg)
        m.submodules.engine = engine = LoadEngine(cfg=cfg, targets=LOAD_TARGETS["compute"])
        wiring.connect(m, wiring.flipped(self.mem), engine.mem)
        wiring.connect(m, wiring.flipped(self.uop_wr), engine.uop_wr)
        m.d.comb += [self.elem_uop.eq(engine.elem_uop), self.elem_acc.eq(engine.elem_acc),
                     self.elem_acc8.eq(engine.elem_acc8)]

        insn = Signal(lay.insn_bits)
        m.d.comb += engine.cmd_insn.eq(insn)
        opcode = common_field(insn, cfg, "opcode")
        pops = util.pop_flags(insn, cfg, "compute")
        pushes = util.push_flags(insn, cfg, "compute")
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
                                            form=self.gemm_form, inp_bits=cfg.inp_width, wgt_bits=cfg.wgt_width)
        m.d.comb += [gemm.in_valid.eq(c_valid), gemm.inp.eq(self.inp_rd.data), gemm.wgt.eq(self.wgt_rd.data),
                     self.acc_rd0.addr.eq(c_dst)]
        self._acc_reads(m, c_valid, c_src)

        # ---- stage D: accumulate / ALU, acc and out writes -----------------------------------------------------
        d_valid = Signal()
        d_dst = Signal(16)
        m.d.sync += [d_valid.eq(c_valid), d_dst.eq(c_dst)]
        lanes = cfg.batch * cfg.block_out
        summed = Cat(*[(self.acc_rd0.data.word_select(j, 32) + gemm.dot.word_select(j, 32))[:32]
                       for j in range(lanes)])
        res = Signal(32 * lanes)
        d_res = self._result(m, insn, opcode, gemm.dot, summed)
        wr_valid, wr_dst, last_valid, alu_uops = d_valid, d_dst, d_valid, self._alu_uops(d_valid, opcode)
        if cfg.alu_pipeline:  # ---- stage E (ALU micro-ops only): ALU operation, acc and out writes ---------------
            e_valid, e_dst, e_res = _alu_pipeline(m, cfg, insn, opcode, (c_dst, c_src), (d_valid, d_dst),
                                                  (self.acc_rd0.data, self.acc_rd1.data))
            d_res = Mux(e_valid, e_res, d_res)
            wr_valid = Signal()
            wr_dst = Signal(16)
            m.d.comb += [wr_valid.eq(e_valid | (d_valid & (opcode != OP_ALU))), wr_dst.eq(Mux(e_valid, e_dst, d_dst))]
            last_valid = d_valid | e_valid
            alu_uops = [self.alu_uop.eq(e_valid)]
        m.d.comb += res.eq(d_res)
        with m.If(wr_valid):
            m.d.comb += [self.acc_wr.addr.eq(wr_dst), self.acc_wr.data.eq(res), self.acc_wr.en.eq(-1)]
        with m.Else():
            m.d.comb += [self.acc_wr.addr.eq(engine.acc_wr.addr), self.acc_wr.data.eq(engine.acc_wr.data),
                         self.acc_wr.en.eq(engine.acc_wr.en)]
        m.d.comb += [
            self.out_wr.addr.eq(wr_dst), self.out_wr.en.eq(wr_valid),
            self.out_wr.data.eq(Cat(*[res.word_select(j, 32)[:cfg.out_width] for j in range(lanes)])),
            self.gemm_uop.eq(d_valid & (opcode == OP_GEMM)),
            *alu_uops,
            pipe_busy.eq(b_valid | c_valid | last_valid),
        ]
        link = self._attach_engine(m, insn, opcode, is_load, pushes)

        with m.FSM():
            with m.State("IDLE"):
                take_insn(m, self, queue, insn)
            with m.State("TOKENS"), util.pop_state(m, self, pops, hold=self._wait_before_pops(m, link, opcode)):
                m.next = "PUSH"
                with m.If(is_load & ~load_empty):
                    m.next = "LOAD"
                with m.If(is_loop & ~loop_empty):
                    m.d.comb += loop_init.eq(1)
                    m.next = "LOOP"
                self._hand_off(m, link, opcode, loop_init)
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
                util.push_state(m, self, pushes, hold=self._wait_before_pushes(m, link),
                           done=[self.finish.eq(opcode == OP_FINISH)])
        self._merge_engine(m, link)
        return m

    # ---- hooks: VTA's design here; vta.hw.concurrent_alu.ConcurrentAluCompute overrides them -----------------------
    # Each runs at its place in elaborate(), and the order of the statements it adds is part of the generated Verilog.
    def _acc_reads(self, m, c_valid, c_src):
        """Stage C's accumulator reads besides acc_rd0's address (acc[dst]): both ports always on, acc_rd1 reads
        acc[src] (an ALU operand)."""
        m.d.comb += [self.acc_rd0.en.eq(1), self.acc_rd1.addr.eq(c_src), self.acc_rd1.en.eq(1)]

    def _result(self, m, insn, opcode, dot, summed):
        """Stage D's result (``BATCH * BLOCK_OUT`` lanes of 32 bits) from the GEMM core's ``dot`` and ``summed``
        (acc[dst] + dot): an ALU's, a GEMM's sum, or a reset's zeros (with gemm_overwrite a GEMM's reset writes its
        products instead)."""
        cfg = self.cfg
        if cfg.alu_pipeline:  # stage D writes GEMM results only; the ALU's are stage E's (_alu_pipeline)
            return Mux(field(insn, cfg, OP_GEMM, "reset"), dot if cfg.gemm_overwrite else 0, summed)
        alu_res = _alu_stage(m, cfg, insn, self.acc_rd0.data, self.acc_rd1.data)
        reset = field(insn, cfg, OP_GEMM, "reset")
        cleared = Mux(opcode == OP_ALU, 0, dot) if cfg.gemm_overwrite else 0
        return Mux(reset, cleared, Mux(opcode == OP_ALU, alu_res, summed))

    def _alu_uops(self, d_valid, opcode):
        """Statements driving ``alu_uop``: stage D holds an ALU micro-op."""
        return [self.alu_uop.eq(d_valid & (opcode == OP_ALU))]

    def _attach_engine(self, m, insn, opcode, is_load, pushes):
        """Add a second micro-op engine for ALU instructions; returns what the hooks below need of it (VTA's design
        has none: ``None``)."""
        return None

    def _wait_before_pops(self, m, link, opcode):
        """In TOKENS, a signal holding the instruction (state BUSY) once its pops are not blocked, or ``None``."""
        return None

    def _hand_off(self, m, link, opcode, loop_init):
        """In TOKENS, once its pops are made: the statements that send the instruction elsewhere."""

    def _wait_before_pushes(self, m, link):
        """In PUSH, a signal blocking the pushes (state WAIT_TOKEN) besides full queues, or ``None``."""
        return None

    def _merge_engine(self, m, link):
        """After the front end's FSM: merge the engine's token pushes and idleness into the module's."""


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
    return _alu_core(m, cfg, insn, acc_d, _alu_operand_b(cfg, insn, acc_s))


def _alu_operand_b(cfg, insn, acc_s):
    """The ALU's second operand for ``insn``: its immediate, sign-extended and repeated on every lane, when
    ``use_imm`` is set, else ``acc_s`` (acc[src], ``BATCH * BLOCK_OUT`` lanes of 32 bits)."""
    imm = field(insn, cfg, OP_ALU, "imm")
    imm32 = Cat(imm, *([imm[-1]] * (32 - len(imm))))
    return Mux(field(insn, cfg, OP_ALU, "use_imm"), Cat(*([imm32] * (cfg.batch * cfg.block_out))), acc_s)


def _alu_core(m, cfg, insn, a, b):
    """The tensor ALU (submodule ``alu``) running ``insn``'s ALU opcode on operands ``a`` and ``b`` (``BATCH *
    BLOCK_OUT`` lanes of 32 bits, ``b`` already the immediate or acc[src]); returns its result, combinational."""
    m.submodules.alu = alu = AluCore(lanes=cfg.batch * cfg.block_out, requant=cfg.fused_requant,
                                     reduce=cfg.block_out if cfg.lane_reduce else 0)
    if cfg.fused_requant:  # REQ's clip range; its (multiplier, shift) lanes come through b as acc[src]
        m.d.comb += alu.imm.eq(field(insn, cfg, OP_ALU, "imm"))
    m.d.comb += [alu.op.eq(field(insn, cfg, OP_ALU, "alu_opcode")), alu.a.eq(a), alu.b.eq(b)]
    return alu.res


def _alu_pipeline(m, cfg, insn, opcode, c_idx, d_stage, acc_data):
    """``alu_pipeline``: stages D and E of an ALU micro-op (see the module docstring). ``c_idx``: stage C's
    ``(dst, src)`` indices; ``d_stage``: stage D's ``(valid, dst)``; ``acc_data``: the acc read ports' data in stage
    D, ``(acc[dst], acc[src])``. Stage D registers the operands, taking stage E's result instead of the block RAM's
    for an entry E is writing (whether it is, is worked out from the indices while the micro-op is in C). Returns
    ``(e_valid, e_dst, e_res)``: stage E holds an ALU micro-op, its destination (entries) and the value it writes
    (the ALU's result, zeros for a reset; ``BATCH * BLOCK_OUT`` lanes of 32 bits)."""
    lanes = cfg.batch * cfg.block_out
    (c_dst, c_src), (d_valid, d_dst), (acc_d, acc_s) = c_idx, d_stage, acc_data
    fwd_a = Signal()  # stage D's micro-op reads, as acc[dst], the entry stage E writes
    fwd_b = Signal()  # ... as acc[src] (no immediate)
    use_imm = field(insn, cfg, OP_ALU, "use_imm")
    m.d.sync += [fwd_a.eq(d_valid & (c_dst == d_dst)), fwd_b.eq(d_valid & (c_src == d_dst) & ~use_imm)]
    e_valid = Signal()
    e_dst = Signal(16)
    m.d.sync += [e_valid.eq(d_valid & (opcode == OP_ALU)), e_dst.eq(d_dst)]
    op_a = Signal(32 * lanes)
    op_b = Signal(32 * lanes)
    res = _alu_core(m, cfg, insn, op_a, op_b)
    # within an ALU reset (which writes zeros) the forwarded operand is the ALU's result: no micro-op of the same
    # instruction uses it, and the drain empties stage E before the next instruction
    m.d.sync += [op_a.eq(Mux(fwd_a, res, acc_d)), op_b.eq(Mux(fwd_b, res, _alu_operand_b(cfg, insn, acc_s)))]
    return e_valid, e_dst, Mux(field(insn, cfg, OP_GEMM, "reset"), 0, res)
