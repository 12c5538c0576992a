"""Small helpers shared by the hardware blocks: parameter validation, instruction field slicing, FSM state bodies."""
import functools
import operator
from contextlib import contextmanager

from amaranth.hdl import Mux
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from vta.isa import COMMON_FIELDS, LOAD_TARGETS, OP_LOAD, TOKEN_POPS, TOKEN_PUSHES, layout

from .compat import silence_unused_warning

__all__ = ["check_int", "field", "common_field", "any_of", "is_load_of", "token_members", "pop_flags", "push_flags",
           "pops_blocked", "pushes_blocked", "pop_tokens", "push_tokens", "log2_exact", "byte_fill", "IDLE", "BUSY",
           "WAIT_TOKEN", "WAIT_MEM", "validated_init", "command_queue", "take_insn", "pop_state", "push_state",
           "wait_engine"]


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


def common_field(insn, cfg, name):
    """The bits of ``name``, one of the fields every instruction has at the same bits (:data:`vta.isa.COMMON_FIELDS`:
    ``opcode`` and the token flags), of the Amaranth value ``insn``."""
    if name not in COMMON_FIELDS:
        raise ValueError(f"name must be one of the fields every instruction has {COMMON_FIELDS}, not {name!r}")
    lay = layout(cfg)
    placed = {lay.field(opcode, name) for opcode in lay.fields}
    if len(placed) != 1:  # guards against a vta.isa layout that moves a common field in some instructions
        raise ValueError(f"field {name} sits at different bits in different instructions at config {cfg.name}")
    (f,) = placed
    return insn[f.lsb:f.lsb + f.width]


def any_of(value, choices):
    """``value == c0 | value == c1 | ...``: whether the Amaranth ``value`` is one of ``choices`` (in their order)."""
    return functools.reduce(operator.or_, [value == c for c in choices])


def is_load_of(insn, cfg, unit):
    """Whether ``insn`` is a LOAD that module ``unit`` executes (its memory type in :data:`vta.isa.LOAD_TARGETS`)."""
    return (common_field(insn, cfg, "opcode") == OP_LOAD) & any_of(field(insn, cfg, OP_LOAD, "mem"),
                                                                    LOAD_TARGETS[unit])


# Dependency tokens of a module, by the flags of vta.isa.TOKEN_POPS/TOKEN_PUSHES: each flag ``f`` of module ``unit``
# is a handshake ``f_valid``/``f_ready`` with its token queue (the queue drives ``valid`` for a pop, ``ready`` for a
# push), and the instruction's flag bit says whether to pop or push.
def token_members(unit):
    """Signature members of the token handshakes of module ``unit`` (``"load"``, ``"compute"`` or ``"store"``)."""
    members = {}
    for flag in TOKEN_POPS[unit]:
        members[f"{flag}_valid"], members[f"{flag}_ready"] = In(1), Out(1)
    for flag in TOKEN_PUSHES[unit]:
        members[f"{flag}_valid"], members[f"{flag}_ready"] = Out(1), In(1)
    return members


def pop_flags(insn, cfg, unit):
    """``{flag: bit}``: the pop flags of module ``unit`` in the instruction ``insn``."""
    return {flag: common_field(insn, cfg, flag) for flag in TOKEN_POPS[unit]}


def push_flags(insn, cfg, unit):
    """``{flag: bit}``: the push flags of module ``unit`` in the instruction ``insn``."""
    return {flag: common_field(insn, cfg, flag) for flag in TOKEN_PUSHES[unit]}


def pops_blocked(component, flags):
    """Whether an instruction with pop ``flags`` (of :func:`pop_flags`) must wait: a flag is set, its queue empty."""
    return functools.reduce(operator.or_, [bit & ~getattr(component, f"{flag}_valid") for flag, bit in flags.items()])


def pushes_blocked(component, flags):
    """Whether an instruction with push ``flags`` (of :func:`push_flags`) must wait: a flag is set, its queue full."""
    return functools.reduce(operator.or_, [bit & ~getattr(component, f"{flag}_ready") for flag, bit in flags.items()])


def pop_tokens(component, flags):
    """Statements popping a token from the queue of each set pop flag (for the cycle no pop is blocked)."""
    return [getattr(component, f"{flag}_ready").eq(bit) for flag, bit in flags.items()]


def push_tokens(component, flags):
    """Statements pushing a token to the queue of each set push flag (for the cycle no push is blocked)."""
    return [getattr(component, f"{flag}_valid").eq(bit) for flag, bit in flags.items()]


# Per-cycle state of a module, as counted by the performance counters (see vta.hw.regs).
IDLE, BUSY, WAIT_TOKEN, WAIT_MEM = 0, 1, 2, 3


def command_queue(m, unit, cfg):
    """Add a module's command queue (``cfg.cmd_queue_depth`` instructions) to ``m`` as submodule ``queue``, its write
    side driven by ``unit``'s ``cmd_valid``/``cmd_ready``/``cmd_data``; return it (:func:`take_insn` reads it)."""
    m.submodules.queue = queue = SyncFIFOBuffered(width=layout(cfg).insn_bits, depth=cfg.cmd_queue_depth)
    m.d.comb += [queue.w_data.eq(unit.cmd_data), queue.w_en.eq(unit.cmd_valid), unit.cmd_ready.eq(queue.w_rdy)]
    return queue


def take_insn(m, unit, queue, insn):
    """Body of a module's ``IDLE`` state: report IDLE (``unit.idle`` while its command ``queue`` is empty), take the
    next instruction from ``queue`` into the register ``insn`` and go to ``TOKENS``."""
    m.d.comb += [unit.state.eq(IDLE), queue.r_en.eq(1), unit.idle.eq(queue.level == 0)]
    with m.If(queue.r_rdy):
        m.d.sync += insn.eq(queue.r_data)
        m.next = "TOKENS"


@contextmanager
def pop_state(m, unit, pops, *, hold=None):
    """Body of a module's ``TOKENS`` state, for the flags ``pops`` (of :func:`pop_flags`): WAIT_TOKEN while a pop is
    blocked; else BUSY while ``hold`` (a signal, or ``None`` for none) is high; else BUSY, pop the tokens and run the
    ``with`` block (which chooses the next state)."""
    with m.If(pops_blocked(unit, pops)):
        m.d.comb += unit.state.eq(WAIT_TOKEN)
    if hold is not None:
        with m.Elif(hold):
            m.d.comb += unit.state.eq(BUSY)
    with m.Else():
        m.d.comb += [unit.state.eq(BUSY), *pop_tokens(unit, pops)]
        yield


def push_state(m, unit, pushes, *, hold=None, done=()):
    """Body of a module's ``PUSH`` state, for the flags ``pushes`` (of :func:`push_flags`): WAIT_TOKEN while a push is
    blocked or ``hold`` (a signal, or ``None`` for none) is high; else BUSY, push the tokens, pulse ``insn_done``
    with the statements ``done`` and go to ``IDLE``."""
    blocked = pushes_blocked(unit, pushes)
    if hold is not None:
        blocked = blocked | hold
    with m.If(blocked):
        m.d.comb += unit.state.eq(WAIT_TOKEN)
    with m.Else():
        m.d.comb += [unit.state.eq(BUSY), *push_tokens(unit, pushes), unit.insn_done.eq(1), *done]
        m.next = "IDLE"


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
