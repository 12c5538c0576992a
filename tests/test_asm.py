"""Tests of vta/asm.py: exact text, round trips (hypothesis) with the disassembler and with encode/decode, and every
assembler error (line, token, what was expected)."""
from __future__ import annotations

import functools
from dataclasses import fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vta import isa
from vta.asm import (
    AsmError,
    Listing,
    _check_layout,
    assemble,
    assemble_listing,
    assemble_uops,
    disassemble,
    disassemble_uops,
    format_insn,
    format_uop,
)
from vta.config import MEM_ACC, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig

DEFAULT = VTAConfig()
CONFIGS = [DEFAULT, VTAConfig(log_batch=1, log_block=3), VTAConfig(log_block=5), VTAConfig(log_uop_buff_size=18)]
CLASSES = {isa.OP_LOAD: isa.Load, isa.OP_STORE: isa.Store, isa.OP_GEMM: isa.Gemm, isa.OP_ALU: isa.Alu,
           isa.OP_FINISH: isa.Finish}


def field_values(cfg: VTAConfig, opcode: int) -> dict[str, st.SearchStrategy[int | bool]]:
    """Strategies for every field of ``opcode``: any value within its width at ``cfg`` (bools for flag fields)."""
    bools = {f.name for f in fields(CLASSES[opcode]) if f.type in ("bool", bool)}
    parts: dict[str, st.SearchStrategy[int | bool]] = {}
    for f in isa.layout(cfg).fields[opcode]:
        if f.name == "opcode":
            continue
        if f.name in bools:
            parts[f.name] = st.booleans()
        elif f.signed:
            parts[f.name] = st.integers(-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1)
        else:
            parts[f.name] = st.integers(0, (1 << f.width) - 1)
    return parts


@functools.lru_cache(maxsize=None)
def instructions(cfg: VTAConfig) -> st.SearchStrategy[isa.Insn]:
    """Random valid instructions of every kind at ``cfg`` (any value of every field, mem and ALU op included)."""
    return st.one_of([st.builds(cls, **field_values(cfg, op)) for op, cls in CLASSES.items()])


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_round_trips(cfg: VTAConfig, data: st.DataObject) -> None:
    insns = data.draw(st.lists(instructions(cfg), min_size=1, max_size=5))
    for insn in insns:
        assert isa.decode(isa.encode(insn, cfg), cfg) == insn
    text = disassemble(insns, cfg)
    assert assemble(text, cfg) == insns
    assert assemble(text.lower(), cfg) == insns  # mnemonics, names, keys and flags are case-insensitive
    assert assemble(disassemble(insns, cfg, numbered=True), cfg) == insns


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=lambda c: c.name)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_uop_round_trip(cfg: VTAConfig, data: st.DataObject) -> None:
    widths = [f.width for f in isa.layout(cfg).uop_fields]
    uops = data.draw(st.lists(st.builds(isa.Uop, *(st.integers(0, (1 << w) - 1) for w in widths)), max_size=6))
    text = disassemble_uops(uops, cfg)
    assert assemble_uops(text, cfg) == uops
    if uops:
        words = isa.encode_uops([u.dst for u in uops], [u.src for u in uops], [u.wgt for u in uops], cfg)
        assert disassemble_uops(words, cfg) == text


def test_every_field_has_syntax() -> None:
    for cfg in CONFIGS:
        _check_layout(cfg)


# ---- exact text -----------------------------------------------------------------------------------------------------
EXAMPLE: list[isa.Insn] = [
    isa.Load(mem=MEM_INP, sram_base=0, dram_base=64, y_size=4, x_size=16, x_stride=16, x_pad_0=1, x_pad_1=1,
             pop_next=True, push_next=True),
    isa.Store(dram_base=128, x_size=4, x_stride=4, pop_prev=True, push_prev=True),
    isa.Gemm(reset=True, uop_bgn=0, uop_end=16, iter_out=4, iter_in=2, dst_factor_out=16, dst_factor_in=1,
             src_factor_out=32, src_factor_in=1, wgt_factor_out=0, wgt_factor_in=4),
    isa.Alu(alu_opcode=isa.ALU_SHR, iter_out=8, dst_factor_out=1, src_factor_out=1, use_imm=True, imm=-3,
            pop_prev=True),
    isa.Alu(alu_opcode=isa.ALU_MAX, uop_bgn=2, uop_end=3, src_factor_in=2),
    isa.Finish(),
]
EXAMPLE_TEXT = """\
LOAD INP sram=0 dram=64 y=4 x=16 stride=16 pad=0,0,1,1 pop_next push_next
STORE OUT sram=0 dram=128 y=1 x=4 stride=4 pad=0,0,0,0 pop_prev push_prev
GEMM uop=0:16 iter=4,2 dst=16,1 src=32,1 wgt=0,4 reset
ALU SHR uop=0:1 iter=8,1 dst=1,0 src=1,0 imm=-3 pop_prev
ALU MAX uop=2:3 iter=1,1 dst=0,0 src=0,2
FINISH
"""


def test_disassemble_exact() -> None:
    assert disassemble(EXAMPLE, DEFAULT) == EXAMPLE_TEXT
    assert disassemble([], DEFAULT) == ""
    assert disassemble([isa.Finish(push_prev=True)], DEFAULT, numbered=True) == "FINISH push_prev  # 0\n"


def test_odd_values_print_exactly() -> None:
    assert format_insn(isa.Load(mem=7)) == "LOAD 7 sram=0 dram=0 y=1 x=1 stride=1 pad=0,0,0,0"
    assert format_insn(isa.Alu(alu_opcode=8)) == "ALU 8 uop=0:1 iter=1,1 dst=0,0 src=0,0"  # opcodes 0..7 are named
    assert format_insn(isa.Alu(alu_opcode=isa.ALU_RMAX)) == "ALU RMAX uop=0:1 iter=1,1 dst=0,0 src=0,0"
    assert format_insn(isa.Alu(alu_opcode=isa.ALU_ADD, imm=5)) == \
        "ALU ADD uop=0:1 iter=1,1 dst=0,0 src=0,0 unused_imm=5"
    assert format_insn(isa.Load(mem=MEM_UOP, x_size=0, pop_prev=True, pop_next=True, push_prev=True, push_next=True)) \
        == "LOAD UOP sram=0 dram=0 y=1 x=0 stride=1 pad=0,0,0,0 pop_prev pop_next push_prev push_next"
    assert format_uop(isa.Uop(1, 2, 3)) == "UOP dst=1 src=2 wgt=3"


def test_assemble_example_and_liberal_input() -> None:
    assert assemble(EXAMPLE_TEXT, DEFAULT) == EXAMPLE
    text = """
    # a comment line, then blank lines

    load inp push_next pad=0,0,1,1 stride=0x10 x=16 y=4 dram=0x40 sram=0 pop_next   # keys in any order, hex
    Store Out Dram=128 X=4 Stride=4 Pop_Prev Push_Prev
    gemm RESET uop=0:16 iter=4,2 dst=16,1 src=32,1 wgt=0,4
    alu shr imm=-3 iter=8,1 dst=1,0 src=1,0 pop_prev
    alu 1 uop=2:3 src=0,2
    finish
    """
    assert assemble(text, DEFAULT) == EXAMPLE


def test_defaults_for_missing_keys() -> None:
    assert assemble("LOAD WGT x=4", DEFAULT) == [isa.Load(mem=MEM_WGT, x_size=4)]
    assert assemble("STORE OUT", DEFAULT) == [isa.Store()]
    assert assemble("LOAD ACC_8bit", DEFAULT) == [isa.Load(mem=5)]
    assert assemble("LOAD acc", DEFAULT) == [isa.Load(mem=MEM_ACC)]
    assert assemble("STORE 4", DEFAULT) == [isa.Store(mem=MEM_OUT)]


def test_listing_and_uops() -> None:
    text = "UOP dst=1 src=2 wgt=3\nGEMM uop=0:2\nuop DST=4 src=5  # wgt defaults to 0\nFINISH\n"
    assert assemble_listing(text, DEFAULT) == Listing([isa.Gemm(uop_end=2), isa.Finish()],
                                                      [isa.Uop(1, 2, 3), isa.Uop(4, 5, 0)])
    assert disassemble_uops([isa.Uop(1, 2, 3)], DEFAULT, numbered=True) == "UOP dst=1 src=2 wgt=3  # 0\n"
    words = isa.encode_uops([7], [8], [9], DEFAULT)
    assert disassemble_uops(words, DEFAULT) == "UOP dst=7 src=8 wgt=9\n"
    assert disassemble_uops(np.zeros(0, dtype=np.uint32), DEFAULT) == ""


# ---- errors ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("FROB x=1", r"^line 1, token 'FROB': unknown mnemonic; expected one of LOAD, STORE, GEMM, FINISH, ALU$"),
    ("FINISH\nUOP dst=0 src=0", r"^line 2, token 'UOP': unknown mnemonic; expected one of LOAD, STORE, GEMM, "
                                r"FINISH, ALU \(micro-ops are read by assemble_uops or assemble_listing\)$"),
    ("LOAD", r"^line 1: LOAD needs a memory type after the mnemonic \(UOP, WGT, INP, ACC, OUT, ACC_8BIT\)$"),
    ("\n\nLOAD x=1", r"^line 3, token 'x=1': LOAD needs a memory type after the mnemonic"),
    ("LOAD FOO", r"^line 1, token 'FOO': expected a memory type: one of UOP, WGT, INP, ACC, OUT, ACC_8BIT or a "
                 r"number$"),
    ("ALU PLUS", r"^line 1, token 'PLUS': expected an ALU operation: one of MIN, MAX, ADD, SHR, MUL, REQ, RSUM, "
                 r"RMAX or a number$"),
    ("ALU", r"^line 1: ALU needs an ALU operation after the mnemonic \(MIN, MAX, ADD, SHR, MUL, REQ, RSUM, "
            r"RMAX\)$"),
    ("LOAD INP q=1", r"^line 1, token 'q=1': unknown key 'q' for LOAD; expected one of sram, dram, y, x, stride, "
                     r"pad$"),
    ("LOAD INP bogus", r"^line 1, token 'bogus': expected key=value or a flag of LOAD; keys: sram, dram, y, x, "
                       r"stride, pad; flags: pop_prev, pop_next, push_prev, push_next$"),
    ("LOAD INP reset", r"^line 1, token 'reset': expected key=value or a flag of LOAD"),
    ("FINISH x=1", r"^line 1, token 'x=1': unknown key 'x' for FINISH; expected one of none$"),
    ("GEMM uop=1", r"^line 1, token 'uop=1': uop takes 2 values \(uop=UOP_BGN:UOP_END\), got 1$"),
    ("GEMM uop=0,1", r"^line 1, token 'uop=0,1': uop takes 2 values \(uop=UOP_BGN:UOP_END\), got 1$"),
    ("LOAD INP pad=1,2", r"^line 1, token 'pad=1,2': pad takes 4 values \(pad=Y_PAD_0,Y_PAD_1,X_PAD_0,X_PAD_1\), "
                         r"got 2$"),
    ("GEMM iter=1,x", r"^line 1, token 'iter=1,x': iter value must be an integer \(decimal or 0x hex\), not 'x'$"),
    ("LOAD INP x=", r"^line 1, token 'x=': x value must be an integer \(decimal or 0x hex\), not ''$"),
    ("LOAD INP x=1 x=2", r"^line 1, token 'x=2': x is given twice on one line$"),
    ("GEMM reset reset", r"^line 1, token 'reset': reset is given twice on one line$"),
    ("ALU ADD imm=1 unused_imm=2", r"^line 1, token 'unused_imm=2': imm= and unused_imm= exclude each other; give "
                                   r"one of them$"),
    ("LOAD INP x=65536", r"^line 1, token 'x=65536': LOAD field x_size = 65536 does not fit its 16-bit field "
                         r"\(allowed 0\.\.65535\) at config 1x16_i8w8a32_15_15_18_17$"),
    ("LOAD 8", r"^line 1, token '8': LOAD field mem = 8 does not fit its 3-bit field \(allowed 0\.\.7\)"),
    ("STORE OUT dram=-1", r"^line 1, token 'dram=-1': STORE field dram_base = -1 does not fit its 32-bit field"),
    ("ALU ADD imm=32768", r"^line 1, token 'imm=32768': ALU field imm = 32768 does not fit its 16-bit field "
                          r"\(allowed -32768\.\.32767\)"),
    ("GEMM wgt=0,1024", r"^line 1, token 'wgt=0,1024': GEMM field wgt_factor_in = 1024 does not fit its 10-bit "
                        r"field \(allowed 0\.\.1023\)"),
])
def test_assemble_errors(text: str, message: str) -> None:
    with pytest.raises(AsmError, match=message):
        assemble(text, DEFAULT)


def test_asm_error_attributes() -> None:
    with pytest.raises(AsmError) as info:
        assemble("FINISH\n# c\nGEMM iter=1", DEFAULT)
    assert (info.value.line, info.value.token) == (3, "iter=1")
    assert info.value.reason == "iter takes 2 values (iter=ITER_OUT,ITER_IN), got 1"
    assert isinstance(info.value, ValueError)


def test_field_width_follows_config() -> None:
    cfg = VTAConfig(log_batch=1, log_block=3)  # wgt factors are 12 bits there
    assert assemble("GEMM wgt=0,4095", cfg) == [isa.Gemm(wgt_factor_in=4095)]
    with pytest.raises(AsmError, match=r"at config 1x16_i8w8a32_15_15_18_17$"):
        assemble("GEMM wgt=0,4095", DEFAULT)


@pytest.mark.parametrize("text, message", [
    ("UOP dst=1", r"^line 1: UOP needs src= \(wgt= defaults to 0\)$"),
    ("UOP wgt=1", r"^line 1: UOP needs dst= and src= \(wgt= defaults to 0\)$"),
    ("UOP dst=2048 src=0", r"^line 1, token 'dst=2048': micro-op field dst = 2048 does not fit its 11-bit field "
                           r"\(allowed 0\.\.2047\) at config 1x16_i8w8a32_15_15_18_17$"),
    ("UOP dst=0 src=0 idx=1", r"^line 1, token 'idx=1': unknown key 'idx' for UOP; expected one of dst, src, wgt$"),
    ("UOP dst=0 src=0 reset", r"^line 1, token 'reset': expected key=value or a flag of UOP"),
    ("GEMM", r"^line 1, token 'GEMM': expected a UOP line \(UOP dst=D src=S wgt=W\)$"),
])
def test_assemble_uop_errors(text: str, message: str) -> None:
    with pytest.raises(AsmError, match=message):
        assemble_uops(text, DEFAULT)


def test_disassemble_checks_fields_and_types() -> None:
    with pytest.raises(isa.EncodeError,
                       match=r"^instruction 1: GEMM field uop_bgn = 8192 does not fit its 13-bit field"):
        disassemble([isa.Finish(), isa.Gemm(uop_bgn=8192)], DEFAULT)
    with pytest.raises(TypeError, match=r"^expected a Load, Store, Gemm, Alu or Finish instruction, not Uop$"):
        disassemble([isa.Uop(0, 0)], DEFAULT)  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"^expected a sequence of Uop, found a Finish$"):
        disassemble_uops([isa.Finish()], DEFAULT)  # type: ignore[list-item]
    with pytest.raises(isa.EncodeError, match=r"^micro-op field wgt = 1024 does not fit"):
        disassemble_uops([isa.Uop(0, 0, 1024)], DEFAULT)
    with pytest.raises(TypeError, match=r"^assembly text must be a str, not bytes$"):
        assemble(b"FINISH", DEFAULT)  # type: ignore[arg-type]
