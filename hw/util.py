"""Small helpers shared by the hardware blocks: parameter validation, instruction field slicing, FSM state bodies."""
import functools

from amaranth.hdl import Mux

from vta.isa import layout

from .compat import silence_unused_warning

__all__ = ["check_int", "field", "log2_exact", "byte_fill", "IDLE", "BUSY", "WAIT_TOKEN", "WAIT_MEM", "validated_init",
           "take_insn", "wait_engine"]


def check_int(name, value, *, lo, hi=None, pow2=False):
    """Validate a keyword parameter of a hardware block; raise TypeError/ValueError with a whole sentence."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise ValueError(f"{name} must be {bound}, not {value}")
    if pow2 and value & (value - 1):
        raise ValueError(f"{name} must be a power of two, not {value}")
    return value


def log2_exact(n):
    """log2 of a power of two."""
    return n.bit_length() - 1


def byte_fill(byte, nbytes):
    """The ``8*nbytes``-bit integer whose every byte is ``byte`` (e.g. 0x80 in offset binary, the int8 zero)."""
    return int.from_bytes(bytes([byte]) * nbytes, "little")


def field(insn, cfg, opcode, name):
    """The bits of field ``name`` of instruction ``opcode`` (an unsigned slice of the Amaranth value ``insn``), at
    the positions :func:`vta.isa.layout` gives for ``cfg``."""
    f = layout(cfg).field(opcode, name)
    return insn[f.lsb:f.lsb + f.width]


# Per-cycle state of a module, as counted by the performance counters (see vta.hw.regs).
IDLE, BUSY, WAIT_TOKEN, WAIT_MEM = 0, 1, 2, 3


def take_insn(m, unit, queue, insn):
    """Body of a module's ``IDLE`` state: report IDLE (``unit.idle`` while its command ``queue`` is empty), take the
    next instruction from ``queue`` into the register ``insn`` and go to ``TOKENS``."""
    m.d.comb += [unit.state.eq(IDLE), queue.r_en.eq(1), unit.idle.eq(queue.level == 0)]
    with m.If(queue.r_rdy):
        m.d.sync += insn.eq(queue.r_data)
        m.next = "TOKENS"


def wait_engine(m, unit, engine):
    """Body of the state that waits for a DMA ``engine`` to finish: WAIT_MEM while the engine waits on memory, else
    BUSY; go to ``PUSH`` once it is no longer busy."""
    m.d.comb += unit.state.eq(Mux(engine.wait_mem, WAIT_MEM, BUSY))
    with m.If(~engine.busy):
        m.d.comb += unit.state.eq(BUSY)
        m.next = "PUSH"


def validated_init(init):
    """Decorate a component's ``__init__``: when it raises (a parameter failed validation), tell Amaranth not to warn
    that the half-built object was never elaborated."""
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except Exception:
            silence_unused_warning(self)
            raise
    return wrapper
