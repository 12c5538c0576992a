"""On-chip SRAMs: real memories (:class:`amaranth.lib.memory.Memory`, mapped to block RAM by synthesis).

An :class:`Sram` has one write port (with byte-group write enables) and ``n_read`` synchronous read ports. The
modules that use an SRAM see its ports through :func:`write_signature` / :func:`read_signature` members, and the
core connects them, so a module never owns a buffer that another module reads.
"""
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .util import byte_fill, check_int, validated_init

__all__ = ["Sram", "write_signature", "read_signature", "sram_geometry", "sram_write_signature", "sram_read_signature"]


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


def sram_read_signature(cfg, name):
    """Read-port signature of buffer ``name``."""
    width, depth, _ = sram_geometry(cfg, name)
    return read_signature(max(1, (depth - 1).bit_length()), width)
