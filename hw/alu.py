"""The tensor ALU: lane-wise int32 MIN, MAX, ADD, SHR (negative amounts shift left) and MUL (low 32 bits)."""
from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vta.isa import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_SHR

from .util import check_int, validated_init

__all__ = ["AluCore"]


class AluCore(wiring.Component):
    """``res[j] = op(a[j], b[j])`` on ``lanes`` int32 lanes (lane ``j`` at bits ``32*j``), combinational.

    ``op`` is ``vta.isa.ALU_*``: MIN, MAX (signed), ADD and MUL (wrapping to 32 bits), SHR: the low 6 bits of
    ``b[j]`` as a signed amount ``n`` in [-32, 31]; ``n >= 0`` shifts ``a[j]`` right arithmetically, ``n < 0``
    shifts it left by ``-n`` (wrapping). Other opcodes give ``a`` unchanged. ``b`` is the second operand tensor, or
    the sign-extended immediate repeated on every lane (the caller's choice).
    """

    @validated_init
    def __init__(self, *, lanes):
        self.lanes = check_int("lanes", lanes, lo=1, hi=1 << 12)
        super().__init__({"op": In(3), "a": In(32 * lanes), "b": In(32 * lanes), "res": Out(32 * lanes)})

    def elaborate(self, platform):
        m = Module()
        out = []
        for j in range(self.lanes):
            a = self.a.word_select(j, 32).as_signed()
            b = self.b.word_select(j, 32).as_signed()
            n = b[:6].as_signed()
            r = Signal(32, name=f"res_{j}")
            with m.Switch(self.op):
                with m.Case(ALU_MIN):
                    m.d.comb += r.eq(Mux(a < b, a, b))
                with m.Case(ALU_MAX):
                    m.d.comb += r.eq(Mux(a > b, a, b))
                with m.Case(ALU_ADD):
                    m.d.comb += r.eq(a + b)
                with m.Case(ALU_SHR):
                    m.d.comb += r.eq(Mux(n[5], (a.as_unsigned() << (-n)[:6])[:32], a >> n[:5]))
                with m.Case(ALU_MUL):
                    m.d.comb += r.eq(a * b)
                with m.Default():
                    m.d.comb += r.eq(a)
            out.append(r)
        m.d.comb += self.res.eq(Cat(*out))
        return m
