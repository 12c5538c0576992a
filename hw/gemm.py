"""The GEMM core: BATCH x BLOCK_IN int8 inputs times the transpose of BLOCK_OUT x BLOCK_IN int8 weights, giving
BATCH x BLOCK_OUT int32 dot products, pipelined to take a new pair of operands every cycle."""
from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .util import check_int, validated_init

__all__ = ["GemmCore", "packing", "GEMM_FORMS"]

GEMM_FORMS = ("packed", "array")
"""Implementations of :class:`GemmCore`, equal bit for bit: ``packed`` (fast to simulate; the default) and ``array``
(one signed 8x8 multiplier per MAC, what synthesis maps best: area reports use it)."""


def packing(block_in):
    """``(lane_bits, lanes_per_word)`` of the packed multipliers for ``block_in``: a lane holds an unsigned sum of
    ``block_in`` products of two 8-bit values (each below 2**16), and a word of at most 63 bits holds that many
    lanes, so that every multiply and add stays within 64 bits."""
    lane_bits = 16 + (block_in - 1).bit_length()
    return lane_bits, max(1, 63 // lane_bits)


def _tree(m, terms, width=None, name=""):
    """Sum ``terms`` with a balanced adder tree: of ``width``-bit (wrapping) named nodes, or with ``width=None`` as
    one expression that widens as Amaranth's arithmetic does."""
    level = 0
    while len(terms) > 1:
        nxt = []
        for j in range(0, len(terms) - 1, 2):
            node = terms[j] + terms[j + 1]
            if width is not None:
                node_sig = Signal(width, name=f"{name}_s{level}_{j // 2}")
                m.d.comb += node_sig.eq(node)
                node = node_sig
            nxt.append(node)
        terms = nxt + terms[len(terms) & ~1:]
        level += 1
    return terms[0]


class GemmCore(wiring.Component):
    """``dot[b][o] = sum_k inp[b][k] * wgt[o][k]`` (int8 operands, int32 result).

    Operands arrive in offset binary, as the load unit writes them into the inp and wgt SRAMs: each byte holds
    ``x ^ 0x80 = x + 128`` (0..255) for the int8 value ``x``.

    Layouts (bit 0 = LSB, little-endian lanes as in DRAM): ``inp`` lane ``b*block_in + k`` is 8 bits at
    ``8*(b*block_in + k)``; ``wgt`` lane ``o*block_in + k``; ``dot`` lane ``b*block_out + o`` is 32 bits at
    ``32*(b*block_out + o)``.

    Timing: operands sampled with ``in_valid`` in cycle t appear on ``dot`` with ``out_valid`` in cycle t+1 (one
    register stage after the multipliers and the adder tree); a new pair is accepted every cycle.

    Arithmetic: with offset-binary operands (``u = x + 128``) every product is unsigned, and ``lanes_per_word``
    output lanes share one multiplier, each in its own ``lane_bits``-bit field of a packed weight word
    (:func:`packing`: three lanes per 64-bit multiply at BLOCK_IN 16). Then
    ``dot = sum(ua*uw) - 128*(sum(ua) + sum(uw)) + 16384*block_in`` (mod 2**32), which equals the signed dot product.
    That ``form="packed"`` is chosen because a cycle-based simulator (Verilator) evaluates it with a third of the
    multiplies and no sign extension. ``form="array"`` is the same function as a plain array of signed 8x8
    multipliers (operand ``x`` recovered as ``(u ^ 0x80)`` read as signed) and balanced adder trees: synthesis maps it
    with the same DSPs and about 11k fewer LUTs at the default config, so area reports use it
    (:mod:`vta.hw.area`). The cocotb testbench checks both forms.
    """

    @validated_init
    def __init__(self, *, batch, block_in, block_out, form="packed"):
        self.batch = check_int("batch", batch, lo=1, hi=1 << 8, pow2=True)
        self.block_in = check_int("block_in", block_in, lo=1, hi=1 << 8, pow2=True)
        self.block_out = check_int("block_out", block_out, lo=1, hi=1 << 8, pow2=True)
        if form not in GEMM_FORMS:
            raise ValueError(f"form must be one of {', '.join(GEMM_FORMS)}, not {form!r}")
        self.form = form
        super().__init__({
            "in_valid": In(1), "inp": In(8 * batch * block_in), "wgt": In(8 * block_out * block_in),
            "out_valid": Out(1), "dot": Out(32 * batch * block_out),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._array(m) if self.form == "array" else self._packed(m)
        m.d.sync += [self.dot.eq(Cat(*lanes)), self.out_valid.eq(self.in_valid)]
        return m

    def _array(self, m):
        """One signed 8x8 multiplier per MAC and a balanced adder tree per output lane."""
        bi, lanes = self.block_in, []
        for b in range(self.batch):
            for o in range(self.block_out):
                terms = [(self.inp.word_select(b * bi + k, 8) ^ 0x80).as_signed() *
                         (self.wgt.word_select(o * bi + k, 8) ^ 0x80).as_signed() for k in range(bi)]
                lane = Signal(32, name=f"dot_{b}_{o}")
                m.d.comb += lane.eq(_tree(m, terms))
                lanes.append(lane)
        return lanes

    def _packed(self, m):
        """``lanes_per_word`` output lanes per unsigned multiply (see the class docstring)."""
        bi, bo = self.block_in, self.block_out
        lane_bits, per_word = packing(bi)
        groups = [list(range(o, min(o + per_word, bo))) for o in range(0, bo, per_word)]
        bias = (16384 * bi) % (1 << 32)

        # Packed offset-binary weights: word (g, k) holds uw[o][k] for the group's lanes o, lane_bits apart.
        packed, wsums = {}, {}
        for g, outs in enumerate(groups):
            width = (len(outs) - 1) * lane_bits + 8
            for k in range(bi):
                pieces = []
                for j, o in enumerate(outs):
                    pieces.append(self.wgt.word_select(o * bi + k, 8))
                    if j + 1 < len(outs):
                        pieces.append(C(0, lane_bits - 8))
                word = Signal(width, name=f"uw_{g}_{k}")
                m.d.comb += word.eq(Cat(*pieces))
                packed[g, k] = word
            wsums[g] = _tree(m, [packed[g, k] for k in range(bi)], per_word * lane_bits, f"wsum_{g}")

        lanes = []
        for b in range(self.batch):
            ua = [self.inp.word_select(b * bi + k, 8) for k in range(bi)]
            asum = _tree(m, ua, 32, f"asum_{b}")
            row = [None] * bo
            for g, outs in enumerate(groups):
                width = (len(outs) - 1) * lane_bits + 16
                prods = []
                for k in range(bi):
                    p = Signal(width, name=f"p_{b}_{g}_{k}")
                    m.d.comb += p.eq(ua[k] * packed[g, k])
                    prods.append(p)
                total = _tree(m, prods, per_word * lane_bits, f"t_{b}_{g}")
                for j, o in enumerate(outs):
                    field = slice(j * lane_bits, (j + 1) * lane_bits)
                    lane = Signal(32, name=f"dot_{b}_{o}")
                    m.d.comb += lane.eq(total[field] - ((asum + wsums[g][field]) << 7) + bias)
                    row[o] = lane
            lanes.extend(row)
        return lanes
