"""The tensor ALU: lane-wise int32 MIN, MAX, ADD, SHR (negative amounts shift left) and MUL (low 32 bits); with the
``fused_requant`` knob also REQ, the fused requantization, and with the ``lane_reduce`` knob RSUM and RMAX, sums and
maxima across the lanes of a row (``vta.isa``)."""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vta.isa import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_REQ, ALU_RMAX, ALU_RSUM, ALU_SHR, REQ_SHIFT_LSB

from .util import check_int, validated_init

__all__ = ["AluCore", "AluLane", "LaneReduce"]


class AluCore(wiring.Component):
    """``res[j] = op(a[j], b[j])`` on ``lanes`` int32 lanes (lane ``j`` at bits ``32*j``), combinational.

    ``op`` is ``vta.isa.ALU_*``: MIN, MAX (signed), ADD and MUL (wrapping to 32 bits), SHR: the low 6 bits of
    ``b[j]`` as a signed amount ``n`` in [-32, 31]; ``n >= 0`` shifts ``a[j]`` right arithmetically, ``n < 0``
    shifts it left by ``-n`` (wrapping). Other opcodes give ``a`` unchanged. ``b`` is the second operand tensor, or
    the sign-extended immediate repeated on every lane (the caller's choice).

    ``requant=True`` (the ``fused_requant`` knob) adds the ``imm`` port (the instruction's 16-bit immediate) and REQ:
    ``clip(SHR(a[j] * M, S), lo, hi)`` with ``M`` = ``b[j]`` bits 0..15 (signed), ``S`` = bits 16..21, ``lo``/``hi``
    the low/high byte of ``imm`` (signed). REQ shares MUL's multiplier and SHR's shifter (operand multiplexers) and
    adds two 32-bit comparators per lane; the whole op is one combinational step like the others.

    ``reduce=w`` (the ``lane_reduce`` knob, ``w`` = BLOCK_OUT, a power of two dividing ``lanes``) adds RSUM and RMAX:
    each row of ``w`` consecutive lanes (a batch row of an acc entry) is reduced by a :class:`LaneReduce` (``reduce0``,
    ``reduce1``, ...) from the lanes' own ADD and MAX results (ports of the lanes, taken before their result select,
    so that no other operation's logic, the multiplier above all, lies on the trees' path): every lane of the row
    gets the row's wrapping sum or signed maximum. Still one combinational step, ``log2(w)`` adder or comparator
    levels longer.

    Each lane is an :class:`AluLane` submodule (``lane0``, ``lane1``, ...): the same logic as one flat module, and the
    lanes' Verilog modules are identical but for their names, so per-module synthesis (``vta.sweep.synth``) maps one
    lane and counts it ``lanes`` times.
    """

    @validated_init
    def __init__(self, *, lanes, requant=False, reduce=0):
        self.lanes = check_int("lanes", lanes, lo=1, hi=1 << 12)
        self.requant = bool(requant)
        self.reduce = check_int("reduce", reduce, lo=0, hi=lanes, pow2=True)
        if self.reduce and lanes % self.reduce:
            raise ValueError(f"reduce must divide lanes ({lanes}), not {reduce}")
        ports = {"op": In(3), "a": In(32 * lanes), "b": In(32 * lanes), "res": Out(32 * lanes)}
        if self.requant:
            ports["imm"] = In(16)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        lanes = []
        for j in range(self.lanes):
            lane = m.submodules[f"lane{j}"] = AluLane(requant=self.requant, reduce=bool(self.reduce))
            m.d.comb += [lane.op.eq(self.op), lane.a.eq(self.a.word_select(j, 32)),
                         lane.b.eq(self.b.word_select(j, 32))]
            if self.requant:
                m.d.comb += lane.imm.eq(self.imm)
            lanes.append(lane)
        out = self._reduced(m, lanes) if self.reduce else [lane.res for lane in lanes]
        m.d.comb += self.res.eq(Cat(*out))
        return m

    def _reduced(self, m, lanes):
        """The results with RSUM or RMAX: each row's reduction of its lanes' ADD or MAX on its lanes, else the lanes'
        own results."""
        is_reduce = Signal(name="is_reduce")
        m.d.comb += is_reduce.eq((self.op == ALU_RSUM) | (self.op == ALU_RMAX))
        result = []
        for r in range(self.lanes // self.reduce):
            row = lanes[r * self.reduce:(r + 1) * self.reduce]
            red = m.submodules[f"reduce{r}"] = LaneReduce(width=self.reduce)
            m.d.comb += [red.is_max.eq(self.op == ALU_RMAX), red.sums.eq(Cat(*(lane.sum for lane in row))),
                         red.maxes.eq(Cat(*(lane.max for lane in row)))]
            result += [Mux(is_reduce, red.res, lane.res) for lane in row]
        return result


class LaneReduce(wiring.Component):
    """``res`` = the signed maximum of the ``width`` int32 lanes of ``maxes`` (``is_max``) or the sum modulo 2**32 of
    those of ``sums`` (lane ``j`` at bits ``32*j``), combinational: a balanced tree of ``log2(width)`` levels of
    32-bit adders and one of comparators with their multiplexers."""

    def __init__(self, *, width):
        self.width = check_int("width", width, lo=1, hi=1 << 12, pow2=True)
        super().__init__({"is_max": In(1), "sums": In(32 * width), "maxes": In(32 * width), "res": Out(32)})

    def elaborate(self, platform):
        m = Module()
        sums = [self.sums.word_select(j, 32) for j in range(self.width)]
        maxes = [self.maxes.word_select(j, 32) for j in range(self.width)]
        level = 0
        while len(sums) > 1:
            nxt_s, nxt_m = [], []
            for k in range(0, len(sums), 2):
                s = Signal(32, name=f"sum{level}_{k // 2}")
                x = Signal(32, name=f"max{level}_{k // 2}")
                a, b = maxes[k].as_signed(), maxes[k + 1].as_signed()
                m.d.comb += [s.eq(sums[k] + sums[k + 1]), x.eq(Mux(a > b, a, b))]
                nxt_s.append(s)
                nxt_m.append(x)
            sums, maxes, level = nxt_s, nxt_m, level + 1
        m.d.comb += self.res.eq(Mux(self.is_max, maxes[0], sums[0]))
        return m


class AluLane(wiring.Component):
    """One int32 lane of :class:`AluCore`: ``res = op(a, b)``, combinational (``imm`` and REQ with ``requant``;
    with ``reduce`` also the ``sum`` and ``max`` ports, ADD's and MAX's results whatever the opcode, for the row's
    :class:`LaneReduce`)."""

    def __init__(self, *, requant=False, reduce=False):
        self.requant = bool(requant)
        self.reduce = bool(reduce)
        ports = {"op": In(3), "a": In(32), "b": In(32), "res": Out(32)}
        if self.requant:
            ports["imm"] = In(16)
        if self.reduce:
            ports["sum"] = Out(32)
            ports["max"] = Out(32)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        a = self.a.as_signed()
        b = self.b.as_signed()
        req = None
        if self.requant:
            shr, mul, req = self._requant_paths(m, a, b)
        else:
            n = b[:6].as_signed()
            shr = Mux(n[5], (a.as_unsigned() << (-n)[:6])[:32], a >> n[:5])
            mul = a * b
        maximum, total = Mux(a > b, a, b), a + b
        if self.reduce:  # the trees read these before the result select
            m.d.comb += [self.max.eq(maximum), self.sum.eq(total)]
            maximum, total = self.max, self.sum
        r = self.res
        with m.Switch(self.op):
            with m.Case(ALU_MIN):
                m.d.comb += r.eq(Mux(a < b, a, b))
            with m.Case(ALU_MAX):
                m.d.comb += r.eq(maximum)
            with m.Case(ALU_ADD):
                m.d.comb += r.eq(total)
            with m.Case(ALU_SHR):
                m.d.comb += r.eq(shr)
            with m.Case(ALU_MUL):
                m.d.comb += r.eq(mul)
            if req is not None:
                with m.Case(ALU_REQ):
                    m.d.comb += r.eq(req)
            with m.Default():
                m.d.comb += r.eq(a)
        return m

    def _requant_paths(self, m, a, b):
        """SHR's, MUL's and REQ's results with REQ: one multiplier and one shifter, their operands chosen by the
        opcode, and the clip."""
        is_req = self.op == ALU_REQ
        lo = self.imm[:8].as_signed()
        hi = self.imm[8:].as_signed()
        mul_b = Signal(32, name="mul_b")
        m.d.comb += mul_b.eq(Mux(is_req, b[:16].as_signed(), b))
        prod = Signal(32, name="prod")
        m.d.comb += prod.eq(a * mul_b.as_signed())
        sh_a = Signal(32, name="sh_a")
        n = Signal(6, name="sh_n")
        m.d.comb += [sh_a.eq(Mux(is_req, prod, a)),
                     n.eq(Mux(is_req, b[REQ_SHIFT_LSB:REQ_SHIFT_LSB + 6], b[:6]))]
        ns = n.as_signed()
        shifted = Signal(32, name="shifted")
        m.d.comb += shifted.eq(Mux(n[5], (sh_a << (-ns)[:6])[:32], sh_a.as_signed() >> n[:5]))
        q = shifted.as_signed()
        floor = Signal(32, name="floor")
        m.d.comb += floor.eq(Mux(q < lo, lo, q))
        return shifted, prod, Mux(floor.as_signed() > hi, hi, floor)
