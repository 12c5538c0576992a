"""The GEMM core: BATCH x BLOCK_IN int8 (or int4) inputs times the transpose of BLOCK_OUT x BLOCK_IN int8 (or int4)
weights, giving
BATCH x BLOCK_OUT int32 dot products, pipelined to take a new pair of operands every cycle."""
from amaranth.hdl import C, Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .util import check_int, validated_init

__all__ = ["GemmCore", "packing", "GEMM_FORMS", "PackedWeightLayout", "pack_weights",
           "pack_weights_int", "wgt_operand_bits"]

GEMM_FORMS = ("packed", "array")
"""Implementations of :class:`GemmCore`, equal bit for bit: ``packed`` (fast to simulate; the default) and ``array``
(one signed 8x8 multiplier per MAC, what synthesis maps best: area reports use it)."""


def packing(block_in, inp_bits=8, wgt_bits=8):
    """``(lane_bits, lanes_per_word)`` of the packed multipliers for ``block_in``: a lane holds an unsigned sum of
    ``block_in`` products of an ``inp_bits``-bit and a ``wgt_bits``-bit value (each below
    ``2**(inp_bits + wgt_bits)``), and a word of at most 63 bits holds that many lanes, so that every multiply and
    add stays within 64 bits (int8 x int8 at BLOCK_IN 16: three 20-bit lanes; int4 x int4: five 12-bit lanes)."""
    lane_bits = inp_bits + wgt_bits + (block_in - 1).bit_length()
    return lane_bits, max(1, 63 // lane_bits)


class PackedWeightLayout:
    """Where the packed GEMM core finds its weights (``form="packed"``): one weight tile (``block_out x block_in``
    offset-binary elements of ``wgt_bits`` bits) as ``n_words`` 64-bit words plus one 64-bit weight sum per lane
    group.

    ``groups[g]`` lists the output lanes ``o`` sharing multiplier group ``g`` (``lanes_per_word`` consecutive lanes).
    Word ``g * block_in + k`` (bits ``64 * (g * block_in + k)``) holds ``uw[o][k]`` of the group's ``j``-th lane at
    bit ``j * lane_bits``; word ``n_words + g`` holds ``sum_k`` of group ``g``'s words (each lane field the sum of
    that lane's ``block_in`` weights: below ``2**lane_bits``, so lanes never carry into each other). Total:
    ``bits = 64 * (n_words + len(groups))``.
    """

    def __init__(self, block_in, block_out, inp_bits=8, wgt_bits=8):
        self.block_in, self.block_out = block_in, block_out
        self.inp_bits, self.wgt_bits = inp_bits, wgt_bits
        self.lane_bits, per_word = packing(block_in, inp_bits, wgt_bits)
        self.lanes_per_word = per_word
        self.groups = [list(range(o, min(o + per_word, block_out))) for o in range(0, block_out, per_word)]
        self.word_bits = (per_word - 1) * self.lane_bits + wgt_bits
        self.n_words = len(self.groups) * block_in
        self.bits = 64 * (self.n_words + len(self.groups))


def wgt_operand_bits(block_in, block_out, form, inp_bits=8, wgt_bits=8):
    """Width in bits of :class:`GemmCore`'s ``wgt`` operand: the raw tile (``wgt_bits * block_out * block_in``) for
    ``form="array"``, its :class:`PackedWeightLayout` for ``form="packed"``."""
    if form == "packed":
        return PackedWeightLayout(block_in, block_out, inp_bits, wgt_bits).bits
    return wgt_bits * block_out * block_in


def pack_weights(raw, block_in, block_out, inp_bits=8, wgt_bits=8):
    """The packed form (:class:`PackedWeightLayout`) of ``raw``, a weight tile of offset-binary elements (lane
    ``o * block_in + k`` at bit ``wgt_bits * (o * block_in + k)``), as one Amaranth expression (no named nodes, so
    that a simulator evaluates it only where it is used)."""
    lay = PackedWeightLayout(block_in, block_out, inp_bits, wgt_bits)
    w = wgt_bits
    words, sums = [], []
    for outs in lay.groups:
        for k in range(block_in):
            words.append(_lanes([raw.word_select(o * block_in + k, w) for o in outs], lay.lane_bits))
        sums.append(_lanes([_sum([raw.word_select(o * block_in + k, w) for k in range(block_in)]) for o in outs],
                           lay.lane_bits))
    return Cat(*words, *sums)


def pack_weights_int(raw_bytes, block_in, block_out, inp_bits=8, wgt_bits=8):
    """:func:`pack_weights` on plain integers: ``raw_bytes`` (``block_out * block_in`` offset-binary elements of
    ``wgt_bits`` bits, lane order) -> the packed tile as an int (for testbenches and initial memory contents)."""
    lay = PackedWeightLayout(block_in, block_out, inp_bits, wgt_bits)
    value, pos = 0, 0
    words = []
    for outs in lay.groups:
        for k in range(block_in):
            words.append(sum(int(raw_bytes[o * block_in + k]) << (j * lay.lane_bits) for j, o in enumerate(outs)))
    for outs in lay.groups:
        words.append(sum(sum(int(raw_bytes[o * block_in + k]) for k in range(block_in)) << (j * lay.lane_bits)
                         for j, o in enumerate(outs)))
    for w in words:
        value |= w << pos
        pos += 64
    return value


def _lanes(values, lane_bits):
    """A 64-bit word holding ``values[j]`` (each narrower than ``lane_bits``) at bit ``j * lane_bits``."""
    pieces = []
    for v in values:
        pieces += [v, C(0, lane_bits - len(v))]
    word = Cat(*pieces)
    return Cat(word, C(0, 64 - len(word))) if len(word) < 64 else word[:64]


def _sum(terms):
    """A balanced sum of ``terms`` as one expression."""
    while len(terms) > 1:
        terms = [terms[j] + terms[j + 1] for j in range(0, len(terms) - 1, 2)] + terms[len(terms) & ~1:]
    return terms[0]


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
    """``dot[b][o] = sum_k inp[b][k] * wgt[o][k]`` (int8 or int4 operands, int32 result).

    Operands arrive in offset binary, as the load unit writes them into the inp and wgt SRAMs: each byte holds
    ``x ^ 0x80 = x + 128`` (0..255) for the int8 value ``x``. With ``inp_bits`` or ``wgt_bits`` 4 (an int4 design)
    that operand's lanes are 4 bits wide, packed two per byte, each ``x ^ 0x8 = x + 8`` (0..15); the multipliers
    narrow with them and every formula below holds with 128 replaced by ``2**(bits - 1)`` of each operand.

    Layouts (bit 0 = LSB, little-endian lanes as in DRAM): ``inp`` lane ``b*block_in + k`` is 8 bits at
    ``8*(b*block_in + k)``; ``wgt`` (``form="array"``) lane ``o*block_in + k``, or (``form="packed"``) the tile
    packed as :class:`PackedWeightLayout` says, which is how the packed design's weight buffer stores it
    (:func:`pack_weights`, :class:`vta.hw.mem.StagedSram`); ``dot`` lane ``b*block_out + o`` is 32 bits at
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
    def __init__(self, *, batch, block_in, block_out, form="packed", inp_bits=8, wgt_bits=8):
        self.batch = check_int("batch", batch, lo=1, hi=1 << 8, pow2=True)
        self.block_in = check_int("block_in", block_in, lo=1, hi=1 << 8, pow2=True)
        self.block_out = check_int("block_out", block_out, lo=1, hi=1 << 8, pow2=True)
        if form not in GEMM_FORMS:
            raise ValueError(f"form must be one of {', '.join(GEMM_FORMS)}, not {form!r}")
        for name, bits in (("inp_bits", inp_bits), ("wgt_bits", wgt_bits)):
            if bits not in (4, 8):
                raise ValueError(f"{name} must be 4 or 8, not {bits!r}")
        self.form = form
        self.inp_bits, self.wgt_bits = inp_bits, wgt_bits
        wgt = wgt_operand_bits(block_in, block_out, form, inp_bits, wgt_bits)
        super().__init__({
            "in_valid": In(1), "inp": In(inp_bits * batch * block_in), "wgt": In(wgt),
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
        ib, wb = self.inp_bits, self.wgt_bits
        for b in range(self.batch):
            for o in range(self.block_out):
                terms = [(self.inp.word_select(b * bi + k, ib) ^ (1 << (ib - 1))).as_signed() *
                         (self.wgt.word_select(o * bi + k, wb) ^ (1 << (wb - 1))).as_signed() for k in range(bi)]
                lane = Signal(32, name=f"dot_{b}_{o}")
                m.d.comb += lane.eq(_tree(m, terms))
                lanes.append(lane)
        return lanes

    def _packed(self, m):
        """``lanes_per_word`` output lanes per unsigned multiply (see the class docstring); the weights arrive packed
        (:class:`PackedWeightLayout`), with their sums."""
        bi, bo = self.block_in, self.block_out
        ib, wb = self.inp_bits, self.wgt_bits
        lay = PackedWeightLayout(bi, bo, ib, wb)
        bias = ((1 << (ib - 1)) * (1 << (wb - 1)) * bi) % (1 << 32)
        lanes = []
        for b in range(self.batch):
            ua = [self.inp.word_select(b * bi + k, ib) for k in range(bi)]
            asum = _tree(m, ua, 32, f"asum_{b}")
            row = [None] * bo
            for g, outs in enumerate(lay.groups):
                # nodes no wider than 64 bits, so that a cycle-based simulator adds them in one machine word
                width = (len(outs) - 1) * lay.lane_bits + ib + wb
                prods = []
                for k in range(bi):
                    p = Signal(width, name=f"p_{b}_{g}_{k}")
                    m.d.comb += p.eq(ua[k] * self.wgt.word_select(g * bi + k, 64)[:lay.word_bits])
                    prods.append(p)
                total = _tree(m, prods, lay.lanes_per_word * lay.lane_bits, f"t_{b}_{g}")
                wsum = self.wgt.word_select(lay.n_words + g, 64)
                for j, o in enumerate(outs):
                    field = slice(j * lay.lane_bits, (j + 1) * lay.lane_bits)
                    lane = Signal(32, name=f"dot_{b}_{o}")
                    # x - y (mod 2**32) as x + ~y + 1: unsigned all the way (no sign extension to simulate)
                    if ib == wb:
                        offsets = (asum + wsum[field]) << (ib - 1)
                    else:  # each sum times the other operand's offset
                        offsets = (asum << (wb - 1)) + (wsum[field] << (ib - 1))
                    m.d.comb += lane.eq(total[field] + (bias + 1) + ~offsets[:32])
                    row[o] = lane
            lanes.extend(row)
        return lanes
