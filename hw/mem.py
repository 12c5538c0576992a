"""On-chip SRAMs: real memories (:class:`amaranth.lib.memory.Memory`, mapped to block RAM by synthesis).

An :class:`Sram` has one write port (with byte-group write enables) and ``n_read`` synchronous read ports. The
modules that use an SRAM see its ports through :func:`write_signature` / :func:`read_signature` members, and the
core connects them, so a module never owns a buffer that another module reads.
"""
import hashlib

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .util import byte_fill, check_int, validated_init

__all__ = ["Sram", "StagedSram", "BankedSram", "write_signature", "read_signature", "sram_geometry",
           "sram_write_signature", "sram_read_signature", "uniform_row_key"]


def write_signature(addr_bits, data_bits, granules):
    """Write port as seen by the writer: entry ``addr`` gets ``data`` in the granules whose ``en`` bit is set."""
    return wiring.Signature({"addr": Out(addr_bits), "data": Out(data_bits), "en": Out(granules)})


def read_signature(addr_bits, data_bits):
    """Read port as seen by the reader: with ``en`` high in cycle t, ``data`` holds entry ``addr`` from cycle t+1
    (it holds its value while ``en`` is low)."""
    return wiring.Signature({"addr": Out(addr_bits), "en": Out(1), "data": In(data_bits)})


class Sram(wiring.Component):
    """``depth`` entries of ``width`` bits, written in granules of ``granularity`` bits.

    Ports: ``w`` (flipped write port), ``r0`` .. ``r<n_read-1>`` (flipped read ports). Read ports listed in
    ``transparent`` return, in cycle t+1, data written to the same entry in cycle t (read-modify-write in one cycle
    without hazards); the others return the old contents. Every byte of every entry starts as ``fill_byte``.
    """

    @validated_init
    def __init__(self, *, width, depth, granularity=None, n_read=1, transparent=False, fill_byte=0):
        self.width = check_int("width", width, lo=1)
        self.depth = check_int("depth", depth, lo=2, hi=1 << 24)
        granularity = width if granularity is None else granularity
        self.granularity = check_int("granularity", granularity, lo=1, hi=width)
        if width % granularity:
            raise ValueError(f"granularity must divide the width {width}, not {granularity}")
        self.n_read = check_int("n_read", n_read, lo=1, hi=8)
        if not isinstance(transparent, bool):
            raise TypeError(f"transparent must be a bool, not {transparent!r}")
        self.transparent = transparent
        self.fill_byte = check_int("fill_byte", fill_byte, lo=0, hi=255)
        if fill_byte and width % 8:
            raise ValueError(f"a fill byte needs a width in whole bytes, not {width} bits")
        self.addr_bits = max(1, (depth - 1).bit_length())
        members = {"w": In(write_signature(self.addr_bits, width, width // granularity))}
        for k in range(n_read):
            members[f"r{k}"] = In(read_signature(self.addr_bits, width))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        init = [byte_fill(self.fill_byte, self.width // 8)] * self.depth
        mem = Memory(shape=self.width, depth=self.depth, init=init if self.fill_byte else [])
        # vta.hw.verilog writes uniform initial contents as a loop, reading the fill from this name
        m.submodules[f"mem_fill{self.fill_byte:02x}" if self.fill_byte else "mem"] = mem
        wp = mem.write_port(granularity=None if self.granularity == self.width else self.granularity)
        m.d.comb += [wp.addr.eq(self.w.addr), wp.data.eq(self.w.data), wp.en.eq(self.w.en)]
        for k in range(self.n_read):
            port = getattr(self, f"r{k}")
            rp = mem.read_port(transparent_for=(wp,) if self.transparent else ())
            m.d.comb += [rp.addr.eq(port.addr), rp.en.eq(port.en), port.data.eq(rp.data)]
        return m


class BankedSram(wiring.Component):
    """An :class:`Sram` (``width`` bits x ``depth`` entries, granules of ``granularity`` bits) built as two banks of
    ``depth / 2`` entries, entries ``[0, depth/2)`` and ``[depth/2, depth)`` (the top index bit), each an
    :class:`Sram` with one write port and ``n_phys`` read ports, so that two writers and more readers reach it in one
    cycle as long as they use different banks (``concurrent_alu``'s acc and out buffers; the program rule that
    fsim checks guarantees it).

    Ports: ``w0`` .. ``w<n_write-1>`` (flipped write ports): in each bank the lowest-numbered writer whose ``en`` is
    not zero and whose address is in the bank writes. ``r0`` .. (flipped read ports), one per entry of ``read_map``:
    reader ``j`` uses physical read port ``read_map[j]`` of the bank its address is in; readers sharing a physical
    port take it in order of ``j`` when their ``en`` is high; ``data`` is that bank's port output from the cycle after
    (valid the cycle after ``en``). ``transparent``: as :class:`Sram`, within a bank.
    """

    @validated_init
    def __init__(self, *, width, depth, granularity=None, n_write=2, read_map=(0,), transparent=False):
        self.width = check_int("width", width, lo=1)
        self.depth = check_int("depth", depth, lo=2, hi=1 << 24)
        if depth & (depth - 1):
            raise ValueError(f"a banked SRAM needs a power-of-two depth, not {depth}")
        self.granularity = width if granularity is None else check_int("granularity", granularity, lo=1, hi=width)
        self.n_write = check_int("n_write", n_write, lo=1, hi=4)
        if not read_map or any(not isinstance(p, int) or p < 0 for p in read_map):
            raise ValueError(f"read_map must list each reader's physical port (ints >= 0), not {read_map!r}")
        self.read_map = tuple(read_map)
        self.n_phys = max(self.read_map) + 1
        if set(self.read_map) != set(range(self.n_phys)):
            raise ValueError(f"read_map must use physical ports 0 .. {self.n_phys - 1}, not {read_map!r}")
        self.transparent = bool(transparent)
        self.addr_bits = (depth - 1).bit_length()
        members = {f"w{k}": In(write_signature(self.addr_bits, width, width // self.granularity))
                   for k in range(n_write)}
        for j in range(len(self.read_map)):
            members[f"r{j}"] = In(read_signature(self.addr_bits, width))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        top = self.addr_bits - 1
        banks = []
        for b in range(2):
            # a bank of one entry (a 2-entry buffer) is an Sram of two with its top entry unused
            m.submodules[f"bank{b}"] = bank = Sram(width=self.width, depth=max(2, self.depth // 2),
                                                   granularity=self.granularity, n_read=self.n_phys,
                                                   transparent=self.transparent)
            banks.append(bank)
            m.d.comb += bank.w.en.eq(0)
            for k in reversed(range(self.n_write)):  # later statements win: the lowest-numbered active writer
                w = getattr(self, f"w{k}")
                with m.If((w.en != 0) & (w.addr[top] == b)):
                    m.d.comb += [bank.w.addr.eq(w.addr[:top]), bank.w.data.eq(w.data), bank.w.en.eq(w.en)]
            for p in range(self.n_phys):
                port = getattr(bank, f"r{p}")
                readers = [getattr(self, f"r{j}") for j, q in enumerate(self.read_map) if q == p]
                m.d.comb += [port.addr.eq(readers[-1].addr[:top]), port.en.eq(0)]
                for r in reversed(readers):  # later statements win: the lowest-numbered enabled reader
                    with m.If(r.en & (r.addr[top] == b)):
                        m.d.comb += [port.addr.eq(r.addr[:top]), port.en.eq(1)]
        for j, p in enumerate(self.read_map):
            r = getattr(self, f"r{j}")
            sel = Signal(name=f"r{j}_bank")
            with m.If(r.en):
                m.d.sync += sel.eq(r.addr[top])
            m.d.comb += r.data.eq(Mux(sel, getattr(banks[1], f"r{p}").data, getattr(banks[0], f"r{p}").data))
        return m


class StagedSram(wiring.Component):
    """An SRAM that stores each entry transformed: written in granules like :class:`Sram` (``width`` bits in
    granules of ``granularity``), it keeps ``transform(entry)`` (``stored_width`` bits) and its read port returns
    that. The simulation-speed form of the GEMM core's weight buffer stores weights packed this way
    (:func:`vta.hw.gemm.pack_weights`), so that the packing is computed once per written tile instead of on every
    read.

    Writes: an entry is written either whole (every ``en`` bit set) or one granule per write, in ascending order, at
    one address; granules before the last are held in a staging buffer, and the entry is stored, transformed, when
    its last granule is written. The writers of the weight buffer (the load unit's DMA) write that way.

    Read port ``r0``: ``data`` is the stored entry at the address taken with ``en`` in the cycle before, read
    through (a write to that entry in the cycle before shows). Every entry starts as ``init`` (an int of
    ``stored_width`` bits, e.g. the transform of the initial contents of the plain buffer).
    """

    @validated_init
    def __init__(self, *, width, depth, granularity, transform, stored_width, init=0):
        self.width = check_int("width", width, lo=1)
        self.depth = check_int("depth", depth, lo=2, hi=1 << 24)
        self.granularity = check_int("granularity", granularity, lo=1, hi=width)
        if width % granularity:
            raise ValueError(f"granularity must divide the width {width}, not {granularity}")
        if not callable(transform):
            raise TypeError(f"transform must be callable, not {transform!r}")
        self.transform = transform
        self.stored_width = check_int("stored_width", stored_width, lo=1)
        self.init = check_int("init", init, lo=0, hi=(1 << stored_width) - 1)
        self.addr_bits = max(1, (depth - 1).bit_length())
        super().__init__({"w": In(write_signature(self.addr_bits, width, width // granularity)),
                          "r0": In(read_signature(self.addr_bits, stored_width))})

    def elaborate(self, platform):
        m = Module()
        n, gb = self.width // self.granularity, self.granularity
        # a uniform initial row is written as a loop by vta.hw.verilog, which finds its value under this name
        name = f"mem_row{uniform_row_key(self.init, self.stored_width)}" if self.init else "mem"
        m.submodules[name] = mem = Memory(shape=self.stored_width, depth=self.depth,
                                          init=[self.init] * self.depth if self.init else [])
        last = self.w.en[n - 1]
        stored = self.transform(self.w.data)
        if n > 1:
            m.submodules.stage = stage = Memory(shape=gb, depth=n - 1, init=[])
            sp = stage.write_port()
            index = Signal(range(n), name="granule")
            for b in range(index.shape().width):  # the set bit's index (one bit is set when a granule is staged)
                m.d.comb += index[b].eq(Cat(*[self.w.en[i] for i in range(n) if i >> b & 1]).any())
            m.d.comb += [sp.addr.eq(index), sp.data.eq(Array(self.w.data.word_select(i, gb) for i in range(n))[index]),
                         sp.en.eq(self.w.en.any() & ~last)]
            held = [stage.read_port(domain="comb") for _ in range(n - 1)]
            for i, rp in enumerate(held):
                m.d.comb += rp.addr.eq(i)
            # the last granule completes a staged entry, unless the write is of the whole entry
            staged = self.transform(Cat(*[rp.data for rp in held], self.w.data.word_select(n - 1, gb)))
            stored = Mux(self.w.en.all(), stored, staged)
        wp = mem.write_port()
        m.d.comb += [wp.addr.eq(self.w.addr), wp.data.eq(stored), wp.en.eq(last)]
        addr = Signal(self.addr_bits, name="rd_addr")
        with m.If(self.r0.en):
            m.d.sync += addr.eq(self.r0.addr)
        rp = mem.read_port(domain="comb")
        m.d.comb += [rp.addr.eq(addr), self.r0.data.eq(rp.data)]
        return m


def uniform_row_key(row, width):
    """A short name-safe key of an initial row value (see :func:`vta.hw.verilog` and :class:`StagedSram`)."""
    return hashlib.sha256(f"{width}:{row:x}".encode()).hexdigest()[:12]


def sram_geometry(cfg, name):
    """``(width_bits, depth, granularity_bits)`` of on-chip buffer ``name`` (``uop``, ``inp``, ``wgt``, ``acc``,
    ``out``) for config ``cfg``: one entry per element; DMA-written buffers are written in granules of
    ``min(element bytes, bus bytes)``."""
    elem = {"uop": cfg.uop_bytes, "inp": cfg.inp_elem_bytes, "wgt": cfg.wgt_elem_bytes, "acc": cfg.acc_elem_bytes,
            "out": cfg.out_elem_bytes}
    depth = {"uop": cfg.uop_depth, "inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth,
             "out": cfg.out_depth}
    if name not in elem:
        raise ValueError(f"buffer name must be one of {', '.join(elem)}, not {name!r}")
    gran = elem[name] if name == "out" else min(elem[name], cfg.bus_bytes)
    return 8 * elem[name], depth[name], 8 * gran


def sram_write_signature(cfg, name):
    """Write-port signature of buffer ``name`` (see :func:`sram_geometry`)."""
    width, depth, gran = sram_geometry(cfg, name)
    return write_signature(max(1, (depth - 1).bit_length()), width, width // gran)


def sram_read_signature(cfg, name, data_bits=None):
    """Read-port signature of buffer ``name``; ``data_bits``: the width of what the port returns when the buffer
    stores its entries transformed (:class:`StagedSram`), default the entry width."""
    width, depth, _ = sram_geometry(cfg, name)
    return read_signature(max(1, (depth - 1).bit_length()), width if data_bits is None else data_bits)
