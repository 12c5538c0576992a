"""An analytical cycle model of the RTL core (``hw/``): predicts the cycles from ``start`` to ``done`` of a
:class:`~vta.program.Program` without simulating it.

The model is an event-driven schedule over the instruction list, O(instructions): fetch dispatches instructions in
order into the three command queues; the load, compute and store modules each take their queue in order; an
instruction starts when its module is free, it has been dispatched, and the tokens it pops have been pushed; its
duration follows from its fields (rows, elements, padding, micro-ops) and the shared DRAM read port, which delivers one
bus beat per cycle to whichever requester holds it. Every constant below is the timing of an RTL state machine
(``hw/load.py``, ``hw/dma.py``, ``hw/compute.py``, ``hw/concurrent_alu.py``, ``hw/store.py``, ``hw/fetch.py``,
``hw/arbiter.py``, ``hw/boundary.py``), confirmed by the tsim measurements pinned in ``tests/test_cost.py``.

Units: cycles of the core clock; ``B`` = ``cfg.bus_bytes`` bytes per beat; ``L`` = ``cfg.dram_latency`` cycles.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from vta.config import ALU_QUEUE_DEPTH, MAX_BURST, MAX_OUTSTANDING, MEM_UOP, VTAConfig
from vta.isa import (
    TOKEN_QUEUES,
    Alu,
    Finish,
    Gemm,
    Insn,
    Load,
    Store,
    insn_pops,
    insn_pushes,
    insn_uops,
    layout,
    module_of,
)
from vta.program import Program

__all__ = ["Estimate", "estimate", "estimate_insns", "CostModelError", "MODULES"]

MODULES = ("fetch", "load", "compute", "store")
"""The modules whose busy cycles an :class:`Estimate` reports; with ``concurrent_alu`` also ``alu``, the ALU engine
(the compute module's ``busy`` is then its front end's)."""

# ---- constants, each the timing of one RTL path ---------------------------------------------------------------------
TAKE = 2
"""Cycles from a module's PUSH (last cycle of an instruction) to TOKENS of its next queued one: the PUSH cycle itself
ends the instruction, the IDLE state takes the next from the command queue (``take_insn``), TOKENS follows."""
LOOP_OVERHEAD = 6
"""GEMM/ALU, TOKENS to PUSH inclusive, beyond one cycle per micro-op: TOKENS (1), then LOOP issues one micro-op per
cycle, DRAIN waits for the B, C, D stages to empty (3) plus the cycle that sees them empty (1), PUSH (1)."""
ALU_PIPELINE_DRAIN = 1
"""``alu_pipeline``: the cycles an ALU instruction with micro-ops takes beyond :data:`LOOP_OVERHEAD` + one per micro-op:
its last micro-op leaves the pipeline through one more stage (E). Dependent back-to-back micro-ops get the result
forwarded, so there is no stall."""
EMPTY = 2
"""An instruction with nothing to do (x_size 0, zero micro-ops, FINISH): TOKENS then PUSH."""
STORE_OVERHEAD = 3
"""STORE, TOKENS to PUSH inclusive, beyond one cycle per write beat: TOKENS (1), READ of the first element (1), PUSH
(1); write beats leave one per cycle (the memory boundary's write FIFO moves one per cycle, the host takes every
one)."""
REQ_TO_DATA = 3
"""Cycles from a read request leaving a requester to its first beat reaching it, beyond ``L``: the request crosses the
boundary's request FIFO (1), the host answers ``L`` cycles after taking it, the beat crosses the data FIFO (1) and is
taken the cycle it shows (1)."""
LOAD_FIRST_REQ = 2
"""LOAD: cycles from TOKENS to the first read request: START hands the command to the engine, the DMA reader
computes the row's beat range (setup), then requests. Fitted with FETCH_TO_QUEUE to the measurements (the counters
show TOKENS..PUSH of a 2-beat LOAD as 25 cycles; the split between this and FETCH_TO_QUEUE is not observable in the
total)."""
LOAD_TAIL = 2
"""LOAD: cycles after the last element is written: the engine is seen idle (1, state BUSY), PUSH (1)."""
FETCH_FIRST_REQ = 1
"""Cycle of fetch's first instruction request after ``start`` (fetch is idle and requests as soon as it has a count)."""
FETCH_TO_QUEUE = 4
"""Cycles from an instruction's dispatch to its module's TOKENS state at the earliest: through the module's buffered
command queue (SyncFIFOBuffered: write, then its output register), IDLE takes it, TOKENS (fitted, see
LOAD_FIRST_REQ)."""
DONE_FINISH = 0
"""Cycles counted after FINISH's PUSH: ``done`` rises the cycle after it; the counters stop the cycle before."""
DONE = 1
"""Cycles counted after the PUSH of another module's last instruction: that module reports idle the cycle after
(IDLE with an empty queue), ``done`` rises the cycle after that."""
HAND_OFF = 1
"""``concurrent_alu``: the front end's cycles for an ALU instruction, TOKENS to its hand-off inclusive (the hand-off is
the TOKENS cycle: pops and the write into the engine's queue together)."""
ENGINE_START = 3
"""``concurrent_alu``: cycles from the hand-off to the engine's START state (its TOKENS) when the engine is idle: the
queue (SyncFIFOBuffered: write, output register), IDLE takes it, START."""


class CostModelError(ValueError):
    """The instruction stream cannot complete (a pop no push ever satisfies): it would deadlock on the core."""


@dataclass
class Estimate:
    """A prediction for one program.

    cycles: from ``start`` to ``done`` (the core's ``cycles`` counter). busy: module -> cycles it holds an instruction
    (busy, wait_mem and wait_token on the core, summed: its occupancy; fetch: cycles dispatching). work: module ->
    cycles of work alone (no waiting on tokens or memory). bound: the module busy the largest fraction of ``cycles``.
    insn_end: the cycle each instruction ended (its PUSH cycle; fetch-only FINISH included).
    """

    cycles: int
    busy: dict[str, int]
    work: dict[str, int]
    bound: str
    insn_end: list[int] = field(repr=False, default_factory=list)

    def utilization(self, module: str) -> float:
        """Fraction of ``cycles`` the module ``module`` was occupied (0..1)."""
        return self.busy[module] / self.cycles if self.cycles else 0.0


# ---- durations ----------------------------------------------------------------------------------------------------


def _load_shape(insn: Load, cfg: VTAConfig) -> tuple[int, int, int, int, int]:
    """(beats per data row, requests per data row, walker cycles per data row, pad entries before the first data
    element, pad entries after the last one) of a LOAD; walker cycles count data pieces and the row's x padding."""
    e, b = cfg.elem_bytes(insn.mem), cfg.bus_bytes
    cols = insn.x_pad_0 + insn.x_size + insn.x_pad_1
    if e >= b:
        beats = insn.x_size * e // b
        pieces = insn.x_size * e // b
    else:  # several elements per beat: one cycle per element; the beat range depends on the row's alignment
        first = insn.dram_base * e // b
        beats = (insn.dram_base * e + insn.x_size * e - 1) // b - first + 1
        pieces = insn.x_size
    reqs = -(-beats // MAX_BURST)
    walk = pieces + insn.x_pad_0 + insn.x_pad_1
    before = insn.y_pad_0 * cols + insn.x_pad_0
    after = insn.y_pad_1 * cols + insn.x_pad_1
    return beats, reqs, walk, before, after


def load_data_cycles(insn: Load, cfg: VTAConfig) -> tuple[int, int]:
    """(cycles from the first beat's arrival to the last element written, beats read) of a LOAD with data, on an
    otherwise idle port. Rows are requested one after the other (setup 1 + one cycle per burst, ``hw/dma.py``) and at
    most :data:`MAX_OUTSTANDING` requests are in flight; the walker writes a piece or a pad entry per cycle."""
    beats, reqs, walk, before, after = _load_shape(insn, cfg)
    rows = insn.y_size
    lat = cfg.dram_latency + REQ_TO_DATA
    per_row = max(walk, beats)
    req_period: float = 1 + reqs
    # tags: a request's tag returns when its last beat is taken, about lat + beats per request after it left
    tag_period = reqs * (lat + beats / reqs) / MAX_OUTSTANDING
    if rows * reqs > MAX_OUTSTANDING:
        req_period = max(req_period, tag_period)
    # the data end is set either by the data rate from the first row or by the last row's request
    span = max(rows * per_row, (rows - 1) * req_period + per_row)
    # pads before the first data element are written while the first request is in flight
    hidden = max(0, before - (lat + LOAD_FIRST_REQ - 1))
    trailing = after - insn.x_pad_1  # the last data row's x padding is in per_row already
    return int(span + hidden + trailing), rows * beats


# ---- the schedule -------------------------------------------------------------------------------------------------
@dataclass
class _Port:
    """The shared DRAM read port: beats leave one per cycle. ``free``: the first cycle after every reserved beat;
    ``owner``: (module, instruction) of the stream that reserved the last beats."""

    free: int = 0
    owner: tuple[str, int] | None = None

    def first_beat(self, ready: int, window: int) -> int:
        """Cycle the first beat of a new stream arrives when it could arrive at ``ready`` on an idle port: after the
        beats already reserved, but at most ``window`` cycles late (the other stream's outstanding requests; the
        arbiter then alternates between the requesters)."""
        return max(ready, min(self.free, ready + window))


class _Schedule:
    """State of the event-driven schedule of one instruction stream."""

    def __init__(self, cfg: VTAConfig, insns: list[Insn]) -> None:
        self.cfg = cfg
        self.insns = insns
        self.n = len(insns)
        self.mod = [module_of(i) for i in insns]
        self.pops_of = [insn_pops(i) for i in insns]      # the token queues each instruction pops
        self.pushes_of = [insn_pushes(i) for i in insns]  # and pushes
        self.queue: dict[str, list[int]] = {m: [] for m in MODULES[1:]}
        for k, m in enumerate(self.mod):
            self.queue[m].append(k)
        self.pos_in_queue = [0] * self.n
        for idx in self.queue.values():
            for p, k in enumerate(idx):
                self.pos_in_queue[k] = p
        self.next = {m: 0 for m in MODULES[1:]}       # index into queue[m] of the next instruction to run
        self.free = {m: 0 for m in MODULES[1:]}       # earliest TOKENS cycle of the module's next instruction
        self.take = [-1] * self.n                      # TOKENS cycle of each instruction
        self.end = [-1] * self.n                       # PUSH cycle of each instruction
        self.dispatch = [-1] * self.n
        self.dispatched = 0
        self.pushes: dict[str, list[int]] = {q: [] for q in _queues()}
        self.pops: dict[str, list[int]] = {q: [] for q in _queues()}
        self.busy = {m: 0 for m in MODULES}
        self.work = {m: 0 for m in MODULES}
        self.port = _Port()
        self.insn_bytes = layout(cfg).insn_bytes
        self.chunk = max(4, cfg.bus_bytes // self.insn_bytes)
        self.chunk_req: list[tuple[int, int, int]] = []
        self.window = max(0, MAX_OUTSTANDING * MAX_BURST - cfg.dram_latency - REQ_TO_DATA)
        # concurrent_alu: the ALU engine's START cycles (in hand-off order), the cycle after its last PUSH, and per
        # token queue the PUSH cycle of the last ALU instruction handed off that pushes there
        self.engine = cfg.concurrent_alu
        self.engine_starts: list[int] = []
        self.engine_free = 0
        self.engine_push: dict[str, int] = {}
        if self.engine:
            self.busy["alu"] = self.work["alu"] = 0

    # ---- fetch --------------------------------------------------------------------------------------------------
    def _chunk_arrival(self, c: int) -> int | None:
        """Cycle the last instruction of chunk ``c`` reaches fetch's buffer, or None while the buffer has no room."""
        while len(self.chunk_req) <= c:
            k = len(self.chunk_req)
            req = FETCH_FIRST_REQ if k == 0 else self.chunk_req[-1][0] + 1
            if k >= 2:  # room in the buffer (two chunks) once chunk k-2 has been dispatched
                last = min(self.n, (k - 1) * self.chunk) - 1
                if self.dispatch[last] < 0:
                    return None
                req = max(req, self.dispatch[last] + 1)
            n_insns = min(self.chunk, self.n - k * self.chunk)
            beats = -(-n_insns * self.insn_bytes // self.cfg.bus_bytes)
            first = self.port.first_beat(req + self.cfg.dram_latency + REQ_TO_DATA - 1, self.window)
            self.chunk_req.append((req, first, beats))
        _, first, _ = self.chunk_req[c]
        return first

    def _advance_fetch(self) -> None:
        """Dispatch as many instructions as the command queues and fetch's buffer allow."""
        depth = self.cfg.cmd_queue_depth
        while self.dispatched < self.n:
            k = self.dispatched
            first = self._chunk_arrival(k // self.chunk)
            if first is None:
                return
            j = k % self.chunk
            ready = first + -(-(j + 1) * self.insn_bytes // self.cfg.bus_bytes) - 1
            t = max(ready + 1, self.dispatch[k - 1] + 1 if k else 0)
            m = self.mod[k]
            p = self.pos_in_queue[k]
            if p >= depth:  # the command queue has room once the instruction depth places earlier was taken
                older = self.queue[m][p - depth]
                if self.take[older] < 0:
                    return
                t = max(t, self.take[older])
            self.dispatch[k] = t
            self.busy["fetch"] += 1
            self.work["fetch"] += 1
            self.dispatched += 1

    # ---- modules ------------------------------------------------------------------------------------------------
    def _candidate(self, m: str) -> int | None:
        """Earliest TOKENS cycle (pops done) of module ``m``'s next instruction, or None while not known yet."""
        if self.next[m] >= len(self.queue[m]):
            return None
        k = self.queue[m][self.next[m]]
        if self.dispatch[k] < 0:
            return None
        t = max(self.free[m], self.dispatch[k] + FETCH_TO_QUEUE)
        insn = self.insns[k]
        if self.engine and m == "compute":
            if isinstance(insn, Alu):  # room in the engine's queue: the instruction DEPTH+1 before it has started
                n = len(self.engine_starts)
                if n > ALU_QUEUE_DEPTH:
                    t = max(t, self.engine_starts[n - ALU_QUEUE_DEPTH - 1])
            elif isinstance(insn, Finish) or (isinstance(insn, Load) and insn.mem == MEM_UOP):
                t = max(t, self.engine_free)  # the engine must be empty
        for q in self.pops_of[k]:
            idx = len(self.pops[q])
            if idx >= len(self.pushes[q]):
                return None
            t = max(t, self.pushes[q][idx] + 1)
        return t

    def _duration(self, m: str, k: int, insn: Insn, start: int) -> int:
        """Cycles from TOKENS (``start``) to PUSH inclusive; reserves the read port for LOADs."""
        cfg = self.cfg
        if isinstance(insn, (Gemm, Alu)):
            uops = insn_uops(insn)
            if not uops:
                return EMPTY
            return LOOP_OVERHEAD + uops + (ALU_PIPELINE_DRAIN if cfg.alu_pipeline and isinstance(insn, Alu) else 0)
        if isinstance(insn, Store):
            if not insn.x_size or not insn.y_size:
                return EMPTY
            beats = insn.y_size * insn.x_size * max(1, cfg.out_elem_bytes // cfg.bus_bytes)
            return STORE_OVERHEAD + beats
        if isinstance(insn, Load):
            if not insn.x_size:
                return EMPTY
            rows = insn.y_pad_0 + insn.y_size + insn.y_pad_1
            if not insn.y_size:  # pad rows only
                cols = insn.x_pad_0 + insn.x_size + insn.x_pad_1
                return 1 + 1 + rows * cols + LOAD_TAIL
            data, beats = load_data_cycles(insn, cfg)
            ready = start + LOAD_FIRST_REQ + cfg.dram_latency + REQ_TO_DATA - 1
            return self._stream(m, k, ready, data, -(-beats // MAX_BURST)) - start + LOAD_TAIL + 1
        return EMPTY  # FINISH

    def _stream(self, m: str, k: int, ready: int, cycles: int, reqs: int) -> int:
        """Reserve the read port for instruction ``k`` of module ``m``: ``cycles`` cycles of data (``reqs`` requests)
        whose first beat could arrive at ``ready``; returns the cycle after its last element is written. A stream
        that cuts into another module's delays that one by its own length."""
        port = self.port
        first = port.first_beat(ready, self.window)
        overlap = port.free - first
        if overlap > 0 and port.owner is not None and port.owner[0] != m:
            # the requests alternate: this stream waits for one burst of the other between its own bursts
            last = first + cycles + min(overlap, (reqs - 1) * MAX_BURST)
            self._delay(port.owner, cycles)
            port.free += cycles
            return last
        port.free = first + cycles
        port.owner = (m, k)
        return first + cycles

    def _delay(self, owner: tuple[str, int], cycles: int) -> None:
        """Push the end of ``owner``'s instruction (and its token pushes) ``cycles`` later: another stream took
        ``cycles`` of its port time."""
        m, k = owner
        if self.end[k] < 0:
            return
        self.end[k] += cycles
        self.free[m] += cycles
        self.busy[m] += cycles
        for q in self.pushes_of[k]:
            self.pushes[q][-1] += cycles

    def _push_end(self, k: int, end: int) -> int:
        """The PUSH cycle of instruction ``k`` whose work ends at ``end``: when a token queue it pushes to is full,
        the cycle after the pop that makes room; records its pushes."""
        for q in self.pushes_of[k]:
            held = len(self.pushes[q]) - self.cfg.token_queue_depth
            if held >= 0 and held < len(self.pops[q]):  # the queue is full until that pop
                end = max(end, self.pops[q][held] + 1)
            self.pushes[q].append(end)
        return end

    def _hand_off(self, k: int, insn: Alu, start: int) -> None:
        """``concurrent_alu``: the front end hands ALU instruction ``k`` to the engine at ``start``; the engine runs
        it in order after the ones before and makes its pushes."""
        e_start = max(start + ENGINE_START, self.engine_free)
        self.engine_starts.append(e_start)
        dur = self._duration("compute", k, insn, e_start)  # the loop's timing, as on the front end
        end = self._push_end(k, e_start + dur - 1)
        for q in self.pushes_of[k]:
            self.engine_push[q] = end
        self.end[k] = end
        self.engine_free = end + TAKE
        self.busy["alu"] += end - e_start + 1
        self.work["alu"] += dur

    def _run(self, m: str, start: int) -> None:
        k = self.queue[m][self.next[m]]
        insn = self.insns[k]
        for q in self.pops_of[k]:
            self.pops[q].append(start)
        if self.engine and m == "compute" and isinstance(insn, Alu):
            self._hand_off(k, insn, start)
            self.take[k] = start
            self.busy[m] += HAND_OFF
            self.work[m] += HAND_OFF
            self.free[m] = start + HAND_OFF - 1 + TAKE
            self.next[m] += 1
            return
        dur = self._duration(m, k, insn, start)
        end = start + dur - 1
        if self.engine and m == "compute":  # a push waits for the engine's pushes to the same queue
            for q in self.pushes_of[k]:
                if q in self.engine_push:
                    end = max(end, self.engine_push[q] + 1)
        end = self._push_end(k, end)
        self.take[k] = start
        self.end[k] = end
        self.busy[m] += end - start + 1
        self.work[m] += dur
        self.free[m] = end + TAKE
        self.next[m] += 1

    def run(self) -> Estimate:
        mods = MODULES[1:]
        while True:
            self._advance_fetch()
            best: tuple[int, str] | None = None
            for m in mods:
                t = self._candidate(m)
                if t is not None and (best is None or t < best[0]):
                    best = (t, m)
            if best is None:
                break
            self._run(best[1], best[0])
        stuck = [m for m in mods if self.next[m] < len(self.queue[m])]
        if stuck:
            m = stuck[0]
            k = self.queue[m][self.next[m]]
            raise CostModelError(f"instruction {k} ({type(self.insns[k]).__name__}) of the {m} module waits for a "
                                 f"token no instruction pushes: the program would deadlock on the core")
        finish = [self.end[k] for k in range(self.n) if isinstance(self.insns[k], Finish)]
        others = [self.end[k] for k in range(self.n) if not isinstance(self.insns[k], Finish)]
        cycles = max([e + DONE_FINISH for e in finish] + [e + DONE for e in others] + [0])
        self.busy["fetch"] = max(self.dispatch) if self.n else 0
        bound = max((m for m in self.busy if m != "fetch"), key=lambda m: self.busy[m])  # with the engine: alu
        return Estimate(cycles, dict(self.busy), dict(self.work), bound, list(self.end))


def _queues() -> list[str]:
    return sorted(TOKEN_QUEUES)


def estimate_insns(cfg: VTAConfig, insns: list[Insn]) -> Estimate:
    """:func:`estimate` for a bare instruction list at config ``cfg`` (the last instruction should be FINISH)."""
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    return _Schedule(cfg, list(insns)).run()


def estimate(program: Program) -> Estimate:
    """Predicted cycles, per-module occupancy and the bounding module of ``program`` on the RTL core."""
    if not isinstance(program, Program):
        raise TypeError(f"estimate takes a vta.program.Program, not {type(program).__name__}")
    return estimate_insns(program.cfg, program.insns)

