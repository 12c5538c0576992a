"""The GEMM core: BATCH x BLOCK_IN int8 inputs times the transpose of BLOCK_OUT x BLOCK_IN int8 weights, giving
BATCH x BLOCK_OUT int32 dot products, pipelined to take a new pair of operands every cycle."""
from amaranth.hdl import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .util import check_int, validated_init

__all__ = ["GemmCore"]


class GemmCore(wiring.Component):
    """``dot[b][o] = sum_k inp[b][k] * wgt[o][k]`` (signed int8 operands, int32 result).

    Layouts (bit 0 = LSB, little-endian lanes as in DRAM): ``inp`` lane ``b*block_in + k`` is 8 bits at
    ``8*(b*block_in + k)``; ``wgt`` lane ``o*block_in + k``; ``dot`` lane ``b*block_out + o`` is 32 bits at
    ``32*(b*block_out + o)``.

    Timing: operands sampled with ``in_valid`` in cycle t appear on ``dot`` with ``out_valid`` in cycle t+1 (one
    register stage after the multipliers and the adder tree); a new pair is accepted every cycle.
    """

    @validated_init
    def __init__(self, *, batch, block_in, block_out):
        self.batch = check_int("batch", batch, lo=1, hi=1 << 8, pow2=True)
        self.block_in = check_int("block_in", block_in, lo=1, hi=1 << 8, pow2=True)
        self.block_out = check_int("block_out", block_out, lo=1, hi=1 << 8, pow2=True)
        super().__init__({
            "in_valid": In(1), "inp": In(8 * batch * block_in), "wgt": In(8 * block_out * block_in),
            "out_valid": Out(1), "dot": Out(32 * batch * block_out),
        })

    def elaborate(self, platform):
        m = Module()
        bi = self.block_in
        lanes = []
        for b in range(self.batch):
            for o in range(self.block_out):
                terms = [self.inp.word_select(b * bi + k, 8).as_signed() *
                         self.wgt.word_select(o * bi + k, 8).as_signed() for k in range(bi)]
                while len(terms) > 1:  # balanced adder tree
                    terms = [terms[j] + terms[j + 1] for j in range(0, len(terms) - 1, 2)] + terms[len(terms) & ~1:]
                lane = Signal(32, name=f"dot_{b}_{o}")
                m.d.comb += lane.eq(terms[0])
                lanes.append(lane)
        m.d.sync += [self.dot.eq(Cat(*lanes)), self.out_valid.eq(self.in_valid)]
        return m
