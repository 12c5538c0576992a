"""The interactive pyverilator-mm session (vta.tsim.session), on the stand-in core."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tsim_standin import generate_standin

from vta.config import MEM_INP, VTAConfig
from vta.isa import Finish, Insn, Load, encode_stream

pytest.importorskip("pyverilator")

from vta.tsim.session import Session  # noqa: E402

CFG = VTAConfig()
SOURCES = [Path(__file__).with_name("tsim_standin.py")]


@pytest.fixture(scope="module")
def session() -> Session:
    return Session(CFG, generator=generate_standin, sources=SOURCES)


def test_ports_peek_poke_and_counters(session: Session) -> None:
    assert {"clk", "rst", "start", "done", "csr_addr", "csr_rdata", "progress", "mem_rd_req_valid",
            "mem_wr_strb"} <= set(session.ports)
    session.reset()
    assert session.peek("done") == 0
    session.poke("csr_addr", 0)
    before = session.cycle
    session.tick(3)
    assert session.cycle == before + 3
    assert session.counter("cycles") == 0, "not started: the stand-in does not count"


def test_run_program_serves_memory_from_python(session: Session) -> None:
    insns: list[Insn] = [Load(mem=MEM_INP, dram_base=64, x_size=4, x_stride=128), Finish()]
    dram = np.zeros(4096, np.uint8)
    dram[512:544] = np.arange(32)
    dram[:32] = encode_stream(insns, CFG).reshape(-1)
    cycles = session.run_program(dram, insn_addr=0, insn_count=2)
    assert list(dram[1024:1056]) == list(range(32))
    assert session.counter("inp_bytes_read") == 32
    assert session.counter("cycles") == cycles == 63  # as the C++ harness counts the same program


def test_session_errors(session: Session) -> None:
    with pytest.raises(KeyError, match=r"'done' is not an input port of the core; inputs are clk, rst"):
        session.poke("done", 1)
    with pytest.raises(KeyError, match=r"the core has no port or signal 'nope'"):
        session.peek("nope")
    with pytest.raises(KeyError, match=r"unknown counter 'bogus'"):
        session.counter("bogus")
    with pytest.raises(ValueError, match=r"cycles must be a non-negative integer, not -1"):
        session.tick(-1)
    insns: list[Insn] = [Load(mem=MEM_INP, dram_base=600, x_size=4, x_stride=128), Finish()]
    dram = np.zeros(4096, np.uint8)
    dram[:32] = encode_stream(insns, CFG).reshape(-1)
    with pytest.raises(IndexError, match=r"read of 32 bytes at byte address 0x12c0 is outside the 4096-byte DRAM"):
        session.run_program(dram, insn_addr=0, insn_count=2)


def test_two_sessions_in_one_process_are_independent(session: Session) -> None:
    other = Session(CFG, generator=generate_standin, sources=SOURCES)
    other.reset()
    session.reset()
    session.tick(2)
    assert other.cycle != session.cycle or other.sim is not session.sim
    assert other.peek("done") == 0
