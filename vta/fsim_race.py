"""Race detection for the functional simulator: every cross-module data dependency must be ordered by tokens.

The modules run concurrently on the hardware, so a program is only correct when each pair of accesses to the same
data by two different modules (a write and a read, in either order) is ordered by a chain of dependency tokens. The
simulator's own schedule may happen to run them in the right order; this tracker checks the ordering itself, with
vector clocks: ``vc[m]`` is the number of instructions of module m known to have completed (``m`` indexes
``("load", "compute", "store", "alu")``; "alu" only with CONCURRENT_ALU, see below), merged through every token
popped. Instruction X of module m is the ``vc[m]``-th of its module; W happened before X exactly when W's number
within its module is ``<= vc_X[module of W]``.

Shared data (writer module -> reader module): inp and wgt entries (load -> compute), out entries (compute -> store),
DRAM bytes (store -> load for INP/WGT loads, store -> compute for UOP/ACC loads, so a STORE into micro-ops that a
LOAD UOP reads must be ordered by tokens like any other DRAM data). Ordering through the command queues' capacity is
deliberately not counted: it depends on the config and is no substitute for a token.

The instruction stream: fetch reads the encoded instructions from DRAM in order, as far ahead as the command queues
allow, and pops no tokens. The simulator runs the decoded ``program.insns``; the hardware runs what it reads. So a
STORE may write the bytes of instruction j only when j is certainly fetched already: j is at or before the STORE
itself or before an instruction that happened before the STORE (by the vector clocks). Any other write into the
stream is a race (what the hardware runs would depend on how far fetch had got).

CONCURRENT_ALU (``cfg.concurrent_alu``, docs/hardware.md "Codesign knobs"): the compute module's ALU engine is a
fourth agent, ``"alu"``: ALU instructions are numbered within it, not within compute. The scheduler (vta.fsim) gives
the engine its own clock: at the hand-off it takes the front end's clock (after the ALU instruction's pops) and counts
one more ALU instruction; the ALU's accesses are checked with it and its pushes carry it. The front end merges the
engine's clock before a LOAD UOP and FINISH (drains), and before the pushes of a non-ALU instruction to queue Q the
engine's clock as it was after the last ALU instruction pushing to Q. The acc and out buffers are then two banks
(``index >= acc_depth // 2``) shared by the two agents: every acc/out access by one (GEMM acc/out entries, LOAD
ACC/ACC_8BIT entries with padding, ALU destinations and sources) must be ordered after the other's last access to the
same bank. One table covers both buffers: every out access comes with an acc access to the same index by the same
instruction, so tracking acc/out banks apart would find the same pairs. Out entries written by the engine are tracked
towards the store module like the front end's (a second last-writer array).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .config import VTAConfig
from .isa import Alu, Insn, Store, module_of
from .program import Program

__all__ = ["RaceTracker", "MODULE_INDEX"]

MODULE_INDEX = {"load": 0, "compute": 1, "store": 2, "alu": 3}
_SRAM = {"inp": ("load", "compute"), "wgt": ("load", "compute"), "out": ("compute", "store")}


def _who(agent: str, pushes: bool) -> str:
    """How a message names an agent: the ALU engine (CONCURRENT_ALU) pushes an ALU instruction's tokens, while the
    compute module's front end pops them."""
    if agent == "alu":
        return "compute module's ALU engine" if pushes else "compute module"
    return f"{agent} module"


class RaceTracker:
    """Last writer and reader (numbered within their module) of every shared datum; methods return an error
    sentence when an access is not ordered after a conflicting one, else None.

    ``module_insns[m]``: global indices of module m's instructions in order (static); ``name(k)``: how to name
    instruction k; ``store_span``: the DRAM byte range any STORE may write (DRAM outside it is never tracked);
    ``insn_stream``: (byte offset, number of instructions, bytes per instruction) of the encoded instruction stream.
    """

    def __init__(self, cfg: VTAConfig, module_insns: dict[str, list[int]], name: Callable[[int], str],
                 store_span: tuple[int, int] | None, insn_stream: tuple[int, int, int] = (0, 0, 1)) -> None:
        self.module_insns, self.name = module_insns, name
        self.stream = insn_stream  # (byte offset, instructions, bytes per instruction) of the encoded stream
        depth = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "out": cfg.out_depth}
        self.written = {buf: np.zeros(depth[buf], np.int64) for buf in _SRAM}
        self.read = {buf: np.zeros(depth[buf], np.int64) for buf in _SRAM}
        self.grain = min(cfg.uop_bytes, cfg.inp_elem_bytes, cfg.out_elem_bytes)  # every DRAM access is aligned to it
        self.span = store_span
        self._span = store_span or (0, 0)
        # CONCURRENT_ALU: out entries' last writer within "alu"; per acc/out bank, the last access by each agent
        self.alu_written = np.zeros(cfg.out_depth, np.int64) if cfg.concurrent_alu else None
        self.half = cfg.acc_depth // 2  # first entry of bank 1
        self.bank_last = [[0] * len(MODULE_INDEX) for _ in range(2)]
        if store_span is not None:
            n = -(-(store_span[1] - store_span[0]) // self.grain)
            self.dram_written = np.zeros(n, np.int64)
            self.dram_readers = {"load": np.zeros(n, np.int64), "compute": np.zeros(n, np.int64)}

    @classmethod
    def for_program(cls, program: Program, name: Callable[[Insn], str]) -> "RaceTracker":
        """A tracker for ``program``; ``name(insn)`` names an instruction in messages."""
        module_insns: dict[str, list[int]] = {m: [] for m in MODULE_INDEX}
        starts, ends = [], []
        eb = program.cfg.out_elem_bytes
        alu_agent = program.cfg.concurrent_alu
        for k, insn in enumerate(program.insns):
            module_insns["alu" if alu_agent and isinstance(insn, Alu) else module_of(insn)].append(k)
            if isinstance(insn, Store) and insn.x_size and insn.y_size:
                starts.append(max(insn.dram_base * eb, 0))
                ends.append(min((insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb,
                                program.dram.size))
        span = (min(starts), max(ends)) if starts and max(ends) > min(starts) else None
        stream = (program.insn_offset, len(program.insns), program.insn_bytes)
        return cls(program.cfg, module_insns, lambda k: name(program.insns[k]), span, stream)

    def _insn(self, module: str, number: int) -> str:
        k = self.module_insns[module][number - 1]
        return f"instruction {k} ({self.name(k)})"

    def _conflict(self, last: np.ndarray, other: str, vc: Sequence[int]) -> int | None:
        """Position of the first entry whose last access by module ``other`` is not ordered before ``vc``."""
        bad = last > vc[MODULE_INDEX[other]]
        return int(np.argmax(bad)) if bad.any() else None

    def _message(self, k: int, verb: str, what: str, module: str, other: str, number: int, other_verb: str) -> str:
        via = " (through compute)" if {other, module} == {"load", "store"} else ""
        return (f"race: instruction {k} ({self.name(k)}) {verb} {what}, which {self._insn(other, number)} "
                f"{other_verb}, and no dependency token orders the two; the {_who(other, True)} must push a token "
                f"after that instruction which the {_who(module, False)} pops{via} before this one")

    # ---- on-chip buffers ---------------------------------------------------------------------------------------
    def sram_write(self, k: int, buf: str, idx: np.ndarray | slice, vc: Sequence[int],
                   alu: bool = False) -> str | None:
        """A write of ``buf`` entries ``idx`` by instruction ``k``; ``alu``: by the ALU engine (CONCURRENT_ALU;
        only out entries), numbered within "alu"."""
        writer, reader = _SRAM[buf]
        if alu:
            writer = "alu"
        last = np.atleast_1d(self.read[buf][idx])
        j = self._conflict(last, reader, vc)
        if j is not None:
            entry = np.arange(self.read[buf].size)[idx].reshape(-1)[j]
            return self._message(k, "overwrites", f"{buf} entry {entry}", writer, reader, int(last[j]), "reads")
        if alu and self.alu_written is not None:
            self.alu_written[idx] = vc[MODULE_INDEX["alu"]]
        else:
            self.written[buf][idx] = vc[MODULE_INDEX[writer]]
        return None

    def sram_read(self, k: int, buf: str, idx: np.ndarray | slice, vc: Sequence[int]) -> str | None:
        writer, reader = _SRAM[buf]
        writers = [(writer, self.written[buf])]
        if buf == "out" and self.alu_written is not None:
            writers.append(("alu", self.alu_written))
        for who, written in writers:
            last = np.atleast_1d(written[idx])
            j = self._conflict(last, who, vc)
            if j is not None:
                entry = np.arange(written.size)[idx].reshape(-1)[j]
                return self._message(k, "reads", f"{buf} entry {entry}", reader, who, int(last[j]), "writes")
        self.read[buf][idx] = vc[MODULE_INDEX[reader]]
        return None

    def bank_access(self, k: int, agent: str, idx: np.ndarray | slice, vc: Sequence[int]) -> str | None:
        """CONCURRENT_ALU: instruction ``k`` of ``agent`` ("compute": the front end's GEMM or LOAD ACC/ACC_8BIT;
        "alu": the ALU engine) accesses acc/out entries ``idx`` (a non-empty index array or a slice with a stop)
        with vector clock ``vc``; an error sentence when the other agent's last access to one of the banks touched
        is not ordered before it. (An ALU instruction is always ordered after the front end's earlier accesses, by
        the hand-off, so in practice the front end's GEMM or LOAD ACC is the one that finds a race.)"""
        if isinstance(idx, slice):
            lo, hi = idx.start or 0, idx.stop - 1
        else:
            lo, hi = int(idx.min()), int(idx.max())
        if hi < lo:
            return None
        other = "alu" if agent == "compute" else "compute"
        mine, theirs = MODULE_INDEX[agent], MODULE_INDEX[other]
        for bank in range(0 if lo < self.half else 1, 2 if hi >= self.half else 1):
            last = self.bank_last[bank]
            if last[theirs] > vc[theirs]:
                return self._bank_message(k, agent, bank, last[theirs])
            last[mine] = vc[mine]
        return None

    def _bank_message(self, k: int, agent: str, bank: int, number: int) -> str:
        other = "alu" if agent == "compute" else "compute"
        j = self.module_insns[other][number - 1]
        where = {"alu": " in the ALU engine", "compute": ""}
        entries = f"[{bank * self.half}, {(bank + 1) * self.half})"
        return (f"race: instruction {k} ({self.name(k)}){where[agent]} accesses acc/out bank {bank} (entries "
                f"{entries}), which instruction {j} ({self.name(j)}){where[other]} also accesses, and nothing orders "
                f"the two: the ALU engine runs concurrently with the GEMMs and LOAD ACCs after it (CONCURRENT_ALU); "
                f"drain the engine between them (a LOAD UOP), order them by a token chain from the ALU instruction's "
                f"pushes, or use the other bank")

    # ---- DRAM --------------------------------------------------------------------------------------------------
    def _grains(self, lo: int, rows: int, row_bytes: int, stride_bytes: int) -> np.ndarray | slice | None:
        """Grains of the tracked span that a 2D access touches (None when it touches none)."""
        if self.span is None or rows <= 0 or row_bytes <= 0:
            return None
        hi = lo + (rows - 1) * stride_bytes + row_bytes
        if hi <= self.span[0] or lo >= self.span[1]:
            return None
        if stride_bytes == row_bytes or rows == 1:  # contiguous
            first = max(lo - self.span[0], 0) // self.grain
            return slice(first, min(-(-(hi - self.span[0]) // self.grain), self.dram_written.size))
        starts = lo + np.arange(rows, dtype=np.int64) * stride_bytes - self.span[0]
        idx = (starts[:, None] + np.arange(0, row_bytes, self.grain)[None, :]).reshape(-1) // self.grain
        idx = idx[(idx >= 0) & (idx < self.dram_written.size)]
        return idx if idx.size else None

    @staticmethod
    def _grain_index(idx: np.ndarray | slice, j: int) -> int:
        return idx.start + j if isinstance(idx, slice) else int(idx[j])

    def dram_read(self, k: int, module: str, lo: int, rows: int, row_bytes: int, stride_bytes: int,
                  vc: Sequence[int]) -> str | None:
        idx = self._grains(lo, rows, row_bytes, stride_bytes)
        if idx is None:
            return None
        last = self.dram_written[idx]
        j = self._conflict(last, "store", vc)
        if j is not None:
            byte = self._span[0] + int(self._grain_index(idx, j)) * self.grain
            return self._message(k, "reads", f"DRAM byte {byte}", module, "store", int(last[j]), "writes")
        self.dram_readers[module][idx] = vc[MODULE_INDEX[module]]
        return None

    def fetched(self, vc: Sequence[int]) -> int:
        """The largest instruction index certainly fetched at vector clock ``vc`` (-1 when none is)."""
        known = [self.module_insns[m][vc[i] - 1] for m, i in MODULE_INDEX.items() if vc[i] > 0]
        return max(known, default=-1)

    def insn_write(self, k: int, lo: int, rows: int, row_bytes: int, stride_bytes: int,
                   vc: Sequence[int]) -> str | None:
        """A DRAM write (rows of ``row_bytes`` bytes, ``stride_bytes`` apart, from byte ``lo``) into the encoded
        instruction stream at an instruction that fetch may not have read yet."""
        base, count, size = self.stream
        end = base + count * size
        if rows <= 0 or row_bytes <= 0 or count == 0:
            return None
        starts = lo + np.arange(rows, dtype=np.int64) * stride_bytes
        first = (np.maximum(starts, base) - base) // size  # first and last instruction each row touches
        last = (np.minimum(starts + row_bytes, end) - base - 1) // size
        g = self.fetched(vc)
        touched = (starts < end) & (starts + row_bytes > base) & (last > g)
        if not touched.any():
            return None
        j = int(np.maximum(first[touched], g + 1).min())
        known = f"instruction {g} ({self.name(g)})" if g >= 0 else "none"
        return (f"race: instruction {k} ({self.name(k)}) overwrites DRAM bytes [{base + j * size}, "
                f"{base + (j + 1) * size}) of instruction {j} ({self.name(j)}), which fetch may not have read yet (the "
                f"last instruction known to be fetched is {known}), so what the accelerator runs would depend on "
                f"timing; keep STOREs out of the instruction stream [{base}, {end}) or write only instructions "
                f"that an earlier, token-ordered instruction shows fetched")

    def dram_write(self, k: int, lo: int, rows: int, row_bytes: int, stride_bytes: int,
                   vc: Sequence[int]) -> str | None:
        message = self.insn_write(k, lo, rows, row_bytes, stride_bytes, vc)
        if message is not None:
            return message
        idx = self._grains(lo, rows, row_bytes, stride_bytes)
        if idx is None:
            return None
        for reader in ("load", "compute"):
            last = self.dram_readers[reader][idx]
            j = self._conflict(last, reader, vc)
            if j is not None:
                byte = self._span[0] + int(self._grain_index(idx, j)) * self.grain
                return self._message(k, "overwrites", f"DRAM byte {byte}", "store", reader, int(last[j]), "reads")
        self.dram_written[idx] = vc[MODULE_INDEX["store"]]
        return None

    def finish(self, k: int, vc: Sequence[int]) -> str | None:
        """FINISH must come after every STORE, or ``done`` could rise before the last DRAM write."""
        stores = self.module_insns["store"]
        if vc[MODULE_INDEX["store"]] < len(stores):
            first = stores[vc[MODULE_INDEX["store"]]]
            return (f"race: FINISH (instruction {k}) is not ordered after instruction {first} ({self.name(first)}), "
                    f"so the accelerator could signal done before that store completes; pop a store->compute token "
                    f"pushed after the last STORE (ProgramBuilder.finish does this)")
        return None
