"""2D DMA from DRAM into an SRAM: a reader that turns a block of DRAM elements into a stream of element pieces, and a
walker that lays the pieces out in the SRAM with zero padding (LOAD's semantics in :mod:`vta.isa`).

Elements and bus beats are both powers of two bytes and elements sit at multiples of their own size, so an element
never straddles two beats: an element of ``E`` bytes is ``E/B`` whole beats when ``E >= B``, or one ``E``-byte slice
of a beat when ``E < B``. A *piece* is ``min(E, B)`` bytes: piece ``k`` of an element holds its bytes
``[k*min(E,B), (k+1)*min(E,B))``.
"""
from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from vta.config import MAX_BURST

from .arbiter import read_signature
from .util import byte_fill, check_int, log2_exact, validated_init

__all__ = ["DmaReader", "PadWalker", "piece_write"]


class DmaReader(wiring.Component):
    """Reads ``y`` rows of ``x`` elements of ``elem_bytes`` bytes, row ``r`` starting at element address
    ``base + r*stride`` (byte address = element address * ``elem_bytes``), and emits them as a stream of pieces.

    Ports:
        cmd_valid/cmd_ready, cmd_base (32, elements), cmd_y (16), cmd_x (16), cmd_stride (16): one block, accepted
            while idle (``cmd_ready``); ``cmd_x`` and ``cmd_y`` must be >= 1.
        mem: the read channel (:func:`~vta.hw.arbiter.read_signature`). Each row is requested as bursts of at most
            ``max_burst`` beats (:data:`vta.config.MAX_BURST` unless given), issued as early as the port accepts them.
        out_valid/out_ready, out_data (8*min(E,B) bits), out_idx (piece index in its element), out_last (last piece
            of its element): the pieces in DRAM order; ``out_valid`` follows ``mem.data_valid`` combinationally.
        busy: requests or pieces of the current block remain.
    Every beat requested is consumed as soon as ``out_ready`` allows; bytes of a beat outside the block are dropped.
    """

    @validated_init
    def __init__(self, *, elem_bytes, bus_bytes, max_burst=MAX_BURST):
        self.elem_bytes = check_int("elem_bytes", elem_bytes, lo=1, hi=1 << 16, pow2=True)
        self.bus_bytes = check_int("bus_bytes", bus_bytes, lo=1, hi=128, pow2=True)
        self.max_burst = check_int("max_burst", max_burst, lo=1, hi=1 << 15)
        self.piece_bytes = min(elem_bytes, bus_bytes)
        self.n_pieces = elem_bytes // self.piece_bytes
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "cmd_base": In(32), "cmd_y": In(16), "cmd_x": In(16),
            "cmd_stride": In(16),
            "mem": Out(read_signature(bus_bytes)),
            "out_valid": Out(1), "out_ready": In(1), "out_data": Out(8 * self.piece_bytes),
            "out_idx": Out(range(max(2, self.n_pieces))), "out_last": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        le, lb = log2_exact(self.elem_bytes), log2_exact(self.bus_bytes)
        x = Signal(16)
        stride = Signal(16)
        start = Signal()
        m.d.comb += start.eq(self.cmd_valid & self.cmd_ready)
        with m.If(start):
            m.d.sync += [x.eq(self.cmd_x), stride.eq(self.cmd_stride)]

        # ---- requester: one row at a time, in bursts ------------------------------------------------------------
        r_active = Signal()
        r_setup = Signal()
        r_row = Signal(32)
        r_y = Signal(16)
        r_cur = Signal(32)   # beat index (byte address >> log2 B)
        r_last = Signal(32)  # beat index of the row's last byte
        left = Signal(33)
        m.d.comb += left.eq(r_last - r_cur + 1)
        with m.If(start):
            m.d.sync += [r_active.eq(1), r_setup.eq(1), r_row.eq(self.cmd_base), r_y.eq(self.cmd_y)]
        with m.If(r_active & r_setup):
            first = (r_row << le)[:32]
            m.d.sync += [r_cur.eq(first >> lb), r_last.eq(((first + (x << le))[:32] - 1)[:32] >> lb), r_setup.eq(0)]
        m.d.comb += [
            self.mem.req_valid.eq(r_active & ~r_setup),
            self.mem.req_addr.eq((r_cur << lb)[:32]),
            self.mem.req_len.eq(Mux(left > self.max_burst, self.max_burst, left)),
        ]
        with m.If(self.mem.req_valid & self.mem.req_ready):
            with m.If(left > self.max_burst):
                m.d.sync += r_cur.eq(r_cur + self.max_burst)
            with m.Else():
                m.d.sync += [r_row.eq(r_row + stride), r_y.eq(r_y - 1), r_setup.eq(1)]
                with m.If(r_y == 1):
                    m.d.sync += r_active.eq(0)

        # ---- consumer: beats -> pieces ---------------------------------------------------------------------------
        c_active = Signal()
        c_row = Signal(32)
        c_y = Signal(16)
        c_x = Signal(16)
        epb = self.bus_bytes // self.piece_bytes if self.elem_bytes < self.bus_bytes else 1
        slot = Signal(range(max(2, epb)))
        k = Signal(range(max(2, self.n_pieces)))
        lepb = log2_exact(epb)
        with m.If(start):
            m.d.sync += [c_active.eq(1), c_row.eq(self.cmd_base), c_y.eq(self.cmd_y), c_x.eq(self.cmd_x), k.eq(0)]
            if epb > 1:
                m.d.sync += slot.eq(self.cmd_base[:lepb])
        row_end = Signal()
        m.d.comb += [
            row_end.eq(c_x == 1),
            self.out_valid.eq(c_active & self.mem.data_valid),
            self.out_idx.eq(k),
            self.out_last.eq(k == self.n_pieces - 1),
        ]
        if epb > 1:
            m.d.comb += [self.out_data.eq(self.mem.data.word_select(slot, 8 * self.piece_bytes)),
                         self.mem.data_ready.eq(c_active & self.out_ready & ((slot == epb - 1) | row_end))]
        else:
            m.d.comb += [self.out_data.eq(self.mem.data), self.mem.data_ready.eq(c_active & self.out_ready)]
        fire = Signal()
        m.d.comb += fire.eq(self.out_valid & self.out_ready)
        with m.If(fire):
            if self.n_pieces > 1:
                m.d.sync += k.eq(Mux(self.out_last, 0, k + 1))
            with m.If(self.out_last):
                if epb > 1:
                    m.d.sync += slot.eq(slot + 1)
                m.d.sync += c_x.eq(c_x - 1)
                with m.If(row_end):
                    next_row = c_row + stride
                    m.d.sync += [c_row.eq(next_row), c_x.eq(x), c_y.eq(c_y - 1)]
                    if epb > 1:
                        m.d.sync += slot.eq(next_row[:lepb])
                    with m.If(c_y == 1):
                        m.d.sync += c_active.eq(0)
        m.d.comb += [self.busy.eq(r_active | c_active), self.cmd_ready.eq(~r_active & ~c_active)]
        return m


class PadWalker(wiring.Component):
    """Walks the SRAM entries of one LOAD: ``y_pad_0 + y_size + y_pad_1`` rows of ``x_pad_0 + x_size + x_pad_1``
    entries from ``sram_base`` on, in order; pad entries are written with zeros (one per cycle), data entries take
    their pieces from the input stream.

    Ports:
        cmd_valid/cmd_ready, sram_base, y_size, x_size (>= 1 each, 16 bits), y_pad_0, y_pad_1, x_pad_0, x_pad_1
            (4 bits): one block, accepted while idle.
        in_valid, in_last (in), in_ready (out): the piece stream (data flows straight to the SRAM write port).
        we (out): write the current entry this cycle; pad (out): the write is of zeros to the whole entry.
        idx (16, out): the current SRAM entry; elem_done (out): a data element's last piece is written this cycle.
        wait_data (out): the walker needs a piece and none is there; busy (out): the block is not finished.
    """

    def __init__(self):
        super().__init__({
            "cmd_valid": In(1), "cmd_ready": Out(1), "sram_base": In(16), "y_size": In(16), "x_size": In(16),
            "y_pad_0": In(4), "y_pad_1": In(4), "x_pad_0": In(4), "x_pad_1": In(4),
            "in_valid": In(1), "in_last": In(1), "in_ready": Out(1),
            "we": Out(1), "pad": Out(1), "idx": Out(16), "elem_done": Out(1), "wait_data": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        active = Signal()
        r = Signal(17)
        c = Signal(17)
        y0, y1, x0, x1 = Signal(17), Signal(17), Signal(17), Signal(17)  # data rows [y0, y1), data cols [x0, x1)
        rows, cols = Signal(17), Signal(17)
        with m.If(self.cmd_valid & self.cmd_ready):
            m.d.sync += [
                active.eq(1), r.eq(0), c.eq(0), self.idx.eq(self.sram_base),
                y0.eq(self.y_pad_0), y1.eq(self.y_pad_0 + self.y_size),
                x0.eq(self.x_pad_0), x1.eq(self.x_pad_0 + self.x_size),
                rows.eq(self.y_pad_0 + self.y_size + self.y_pad_1),
                cols.eq(self.x_pad_0 + self.x_size + self.x_pad_1),
            ]
        is_pad = Signal()
        advance = Signal()
        m.d.comb += [
            is_pad.eq((r < y0) | (r >= y1) | (c < x0) | (c >= x1)),
            self.pad.eq(is_pad),
            self.in_ready.eq(active & ~is_pad),
            self.we.eq(active & (is_pad | self.in_valid)),
            self.elem_done.eq(self.in_ready & self.in_valid & self.in_last),
            advance.eq(active & (is_pad | (self.in_valid & self.in_last))),
            self.wait_data.eq(self.in_ready & ~self.in_valid),
            self.busy.eq(active),
            self.cmd_ready.eq(~active),
        ]
        with m.If(advance):
            m.d.sync += self.idx.eq(self.idx + 1)
            with m.If(c == cols - 1):
                m.d.sync += [c.eq(0), r.eq(r + 1)]
                with m.If(r == rows - 1):
                    m.d.sync += active.eq(0)
            with m.Else():
                m.d.sync += c.eq(c + 1)
        return m


def piece_write(m, walker, *, piece, idx, elem_bytes, piece_bytes, gran_bytes, widen=1, offset_binary=False,
                elem_bits=8):
    """``(data, en)`` for an SRAM write port fed by ``walker`` and a piece stream (``piece``, ``idx``); the address
    is ``walker.idx`` and ``en`` is zero unless ``walker.we``.

    The entry is ``elem_bytes * widen`` bytes, written in granules of ``gran_bytes``; a piece of ``piece_bytes``
    bytes holds values of ``elem_bits`` bits (8, or 4 packed two per byte, low nibble first), each sign-extended to
    ``elem_bits * widen`` bits (ACC_8BIT loads: ``widen = 32 // elem_bits``, int32 lanes), and lands at entry bytes
    ``[idx * piece_bytes * widen, ...)``. Pad writes zero the whole entry.

    ``offset_binary``: every value is written as ``x ^ 0x80`` (``x + 128`` for int8 ``x``), or ``x ^ 0x8`` for int4
    (bytes ``^ 0x88``); pad zeros become 0x80 (0x88): the form the GEMM core takes its operands in (inp and wgt SRAMs).
    """
    wide = piece
    pad_value = 0
    ob_byte = 0x80 if elem_bits == 8 else 0x88
    if offset_binary:
        assert widen == 1, "offset binary is for operand buffers, which are not widened"
        flipped = Signal(len(piece), name="piece_ob")
        m.d.comb += flipped.eq(piece ^ byte_fill(ob_byte, piece_bytes))
        wide = flipped
        pad_value = byte_fill(ob_byte, elem_bytes)
    if widen > 1:
        wide = Cat(*[_sext(piece.word_select(j, elem_bits), elem_bits * widen)
                     for j in range(8 * piece_bytes // elem_bits)])
    wide_bytes = piece_bytes * widen
    entry_bytes = elem_bytes * widen
    copies = entry_bytes // wide_bytes
    n_gran = entry_bytes // gran_bytes
    per_piece = max(1, wide_bytes // gran_bytes)
    en_piece = Signal(n_gran)
    if n_gran > per_piece:
        m.d.comb += en_piece.eq(Const((1 << per_piece) - 1, n_gran) << (idx * per_piece)[:16])
    else:
        m.d.comb += en_piece.eq((1 << n_gran) - 1)
    data = Mux(walker.pad, pad_value, Cat(*([wide] * copies)))
    en = Mux(walker.we, Mux(walker.pad, (1 << n_gran) - 1, en_piece), 0)
    return data, en


def _sext(value, width):
    """``value`` (read as two's complement) sign-extended to ``width`` bits."""
    return Cat(value, *([value[-1]] * (width - len(value))))
