"""Dependency token queues between the load, compute and store modules.

A token carries no data, so a token queue is an up/down counter of the tokens it holds (``0 .. depth``), with the
handshakes of a FIFO. The instruction (command) queues are :class:`amaranth.lib.fifo.SyncFIFOBuffered` instances,
built in the modules that own them.
"""
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .util import check_int, validated_init

__all__ = ["TokenQueue"]


class TokenQueue(wiring.Component):
    """A queue of up to ``depth`` dependency tokens.

    Ports:
        push_valid (in), push_ready (out): a token enters in a cycle where both are high. ``push_ready`` is high
            while fewer than ``depth`` tokens are held (it does not depend on a pop in the same cycle).
        pop_valid (out), pop_ready (in): a token leaves in a cycle where both are high. ``pop_valid`` is high while
            at least one token is held (a token pushed in cycle t can be popped from cycle t+1).
        level (out): tokens held.
    A push and a pop in the same cycle leave the level unchanged.
    """

    @validated_init
    def __init__(self, *, depth):
        self.depth = check_int("depth", depth, lo=1, hi=1 << 16)
        super().__init__({
            "push_valid": In(1), "push_ready": Out(1),
            "pop_valid": Out(1), "pop_ready": In(1),
            "level": Out(range(depth + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        push = Signal()
        pop = Signal()
        m.d.comb += [
            self.push_ready.eq(self.level < self.depth),
            self.pop_valid.eq(self.level > 0),
            push.eq(self.push_valid & self.push_ready),
            pop.eq(self.pop_valid & self.pop_ready),
        ]
        level = Signal(range(self.depth + 1))
        m.d.comb += self.level.eq(level)
        with m.If(push & ~pop):
            m.d.sync += level.eq(level + 1)
        with m.Elif(pop & ~push):
            m.d.sync += level.eq(level - 1)
        return m
