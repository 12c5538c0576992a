"""Tests of vta/isa.py: VTA's bit layout at the default config (docs/vta-reference.md, written out literally), field
widths of other configs, encode/decode errors, the signed immediate, instruction streams and micro-ops.

The property test (random instructions of every kind, decode(encode(x)) == x at several configs) is in test_asm.py,
next to the assembler's round trip.
"""
from __future__ import annotations

import numpy as np
import pytest

from vta import isa
from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig

DEFAULT = VTAConfig()
COMMON = [("opcode", 0, 3), ("pop_prev", 3, 1), ("pop_next", 4, 1), ("push_prev", 5, 1), ("push_next", 6, 1)]


def triples(cfg: VTAConfig, opcode: int) -> list[tuple[str, int, int]]:
    return [(f.name, f.lsb, f.width) for f in isa.layout(cfg).fields[opcode]]


# ---- VTA's layout at the default config -----------------------------------------------------------------------------
def test_opcodes_and_alu_opcodes() -> None:
    assert (isa.OP_LOAD, isa.OP_STORE, isa.OP_GEMM, isa.OP_FINISH, isa.OP_ALU) == (0, 1, 2, 3, 4)
    assert (isa.ALU_MIN, isa.ALU_MAX, isa.ALU_ADD, isa.ALU_SHR, isa.ALU_MUL) == (0, 1, 2, 3, 4)
    assert (MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_OUT, MEM_ACC_8BIT) == (0, 1, 2, 3, 4, 5)


def test_default_insn_and_uop_bits() -> None:
    lay = isa.layout(DEFAULT)
    assert (lay.insn_bits, lay.insn_bytes, lay.uop_bits) == (128, 16, 32)


@pytest.mark.parametrize("opcode", [isa.OP_LOAD, isa.OP_STORE])
def test_default_load_store_layout(opcode: int) -> None:
    # [9:7] mem; [25:10] sram_base; [57:26] dram_base; [79:64] y_size; [95:80] x_size; [111:96] x_stride;
    # [115:112] y_pad_0; [119:116] y_pad_1; [123:120] x_pad_0; [127:124] x_pad_1
    assert triples(DEFAULT, opcode) == COMMON + [
        ("mem", 7, 3), ("sram_base", 10, 16), ("dram_base", 26, 32), ("y_size", 64, 16), ("x_size", 80, 16),
        ("x_stride", 96, 16), ("y_pad_0", 112, 4), ("y_pad_1", 116, 4), ("x_pad_0", 120, 4), ("x_pad_1", 124, 4)]


def test_default_gemm_layout() -> None:
    # [7] reset; [20:8] uop_bgn; [34:21] uop_end; [48:35] iter_out; [62:49] iter_in; [74:64] dst_factor_out;
    # [85:75] dst_factor_in; [96:86] src_factor_out; [107:97] src_factor_in; [117:108] wgt_factor_out;
    # [127:118] wgt_factor_in
    assert triples(DEFAULT, isa.OP_GEMM) == COMMON + [
        ("reset", 7, 1), ("uop_bgn", 8, 13), ("uop_end", 21, 14), ("iter_out", 35, 14), ("iter_in", 49, 14),
        ("dst_factor_out", 64, 11), ("dst_factor_in", 75, 11), ("src_factor_out", 86, 11), ("src_factor_in", 97, 11),
        ("wgt_factor_out", 108, 10), ("wgt_factor_in", 118, 10)]


def test_default_alu_layout() -> None:
    # as GEMM up to bit 107, then [110:108] alu_opcode; [111] use_imm; [127:112] imm (signed)
    assert triples(DEFAULT, isa.OP_ALU) == COMMON + [
        ("reset", 7, 1), ("uop_bgn", 8, 13), ("uop_end", 21, 14), ("iter_out", 35, 14), ("iter_in", 49, 14),
        ("dst_factor_out", 64, 11), ("dst_factor_in", 75, 11), ("src_factor_out", 86, 11), ("src_factor_in", 97, 11),
        ("alu_opcode", 108, 3), ("use_imm", 111, 1), ("imm", 112, 16)]
    assert [f.name for f in isa.layout(DEFAULT).fields[isa.OP_ALU] if f.signed] == ["imm"]


def test_default_finish_and_uop_layout() -> None:
    assert triples(DEFAULT, isa.OP_FINISH) == COMMON
    assert [(f.name, f.lsb, f.width) for f in isa.layout(DEFAULT).uop_fields] == [("dst", 0, 11), ("src", 11, 11),
                                                                                   ("wgt", 22, 10)]


def test_layout_field_lookup() -> None:
    assert isa.layout(DEFAULT).field(isa.OP_GEMM, "iter_in") == isa.Field("iter_in", 49, 14)
    assert isa.layout(DEFAULT).field(isa.OP_ALU, "imm").msb == 127
    with pytest.raises(KeyError, match=r"GEMM has no field 'imm'"):
        isa.layout(DEFAULT).field(isa.OP_GEMM, "imm")


def test_default_encodings_exact() -> None:
    insn = isa.Load(mem=MEM_INP, sram_base=3, dram_base=64, y_size=4, x_size=16, x_stride=16, x_pad_0=1, x_pad_1=2,
                    pop_next=True, push_next=True)
    expected = (0 | 1 << 4 | 1 << 6 | 2 << 7 | 3 << 10 | 64 << 26 | 4 << 64 | 16 << 80 | 16 << 96 | 1 << 120
                | 2 << 124)
    assert isa.encode(insn, DEFAULT) == expected
    gemm = isa.Gemm(reset=True, uop_bgn=5, uop_end=9, iter_out=2, iter_in=3, dst_factor_out=1, dst_factor_in=2,
                    src_factor_out=3, src_factor_in=4, wgt_factor_out=5, wgt_factor_in=6, pop_prev=True)
    assert isa.encode(gemm, DEFAULT) == (2 | 1 << 3 | 1 << 7 | 5 << 8 | 9 << 21 | 2 << 35 | 3 << 49 | 1 << 64 | 2 << 75
                                         | 3 << 86 | 4 << 97 | 5 << 108 | 6 << 118)
    assert isa.encode(isa.Finish(), DEFAULT) == 3
    assert isa.encode(isa.Store(x_size=1, push_prev=True), DEFAULT) == (1 | 1 << 5 | 4 << 7 | 1 << 64 | 1 << 80
                                                                        | 1 << 96)


def test_signed_imm_twos_complement() -> None:
    alu = isa.Alu(alu_opcode=isa.ALU_SHR, use_imm=True, imm=-1)
    word = isa.encode(alu, DEFAULT)
    assert word >> 112 == 0xFFFF
    assert (word >> 108) & 0b111 == isa.ALU_SHR
    assert (word >> 111) & 1 == 1
    assert isa.decode(word, DEFAULT) == alu
    for imm in (-32768, -2, 0, 1, 32767):
        assert isa.decode(isa.encode(isa.Alu(alu_opcode=isa.ALU_ADD, use_imm=True, imm=imm), DEFAULT), DEFAULT) == \
            isa.Alu(alu_opcode=isa.ALU_ADD, use_imm=True, imm=imm)


def test_decode_gives_bools_and_exact_class() -> None:
    insn = isa.decode(isa.encode(isa.Gemm(reset=True, push_next=True), DEFAULT), DEFAULT)
    assert type(insn) is isa.Gemm
    assert insn.reset is True and insn.push_next is True and insn.pop_prev is False


# ---- errors ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("insn, message", [
    (isa.Load(mem=MEM_INP, x_size=65536), r"^LOAD field x_size = 65536 does not fit its 16-bit field \(allowed "
                                          r"0\.\.65535\) at config 1x16_i8w8a32_15_15_18_17$"),
    (isa.Load(mem=MEM_WGT, dram_base=-1), r"^LOAD field dram_base = -1 does not fit its 32-bit field \(allowed "
                                          r"0\.\.4294967295\)"),
    (isa.Store(y_pad_0=16), r"^STORE field y_pad_0 = 16 does not fit its 4-bit field \(allowed 0\.\.15\)"),
    (isa.Gemm(uop_bgn=8192), r"^GEMM field uop_bgn = 8192 does not fit its 13-bit field \(allowed 0\.\.8191\)"),
    (isa.Gemm(uop_end=16384), r"^GEMM field uop_end = 16384 does not fit its 14-bit field \(allowed 0\.\.16383\)"),
    (isa.Gemm(wgt_factor_in=1024), r"^GEMM field wgt_factor_in = 1024 does not fit its 10-bit field"),
    (isa.Alu(alu_opcode=8), r"^ALU field alu_opcode = 8 does not fit its 3-bit field \(allowed 0\.\.7\)"),
    (isa.Alu(alu_opcode=isa.ALU_ADD, imm=32768), r"^ALU field imm = 32768 does not fit its 16-bit field \(allowed "
                                                 r"-32768\.\.32767\)"),
    (isa.Alu(alu_opcode=isa.ALU_ADD, imm=-32769), r"^ALU field imm = -32769 does not fit its 16-bit field"),
])
def test_field_overflow_names_field_and_value(insn: object, message: str) -> None:
    with pytest.raises(isa.EncodeError, match=message):
        isa.encode(insn, DEFAULT)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1.9, "7"])
def test_encode_rejects_non_integer_values(value: object) -> None:
    with pytest.raises(TypeError, match=r"^LOAD field x_size must be an integer, not "):
        isa.encode(isa.Load(mem=MEM_INP, x_size=value), DEFAULT)  # type: ignore[arg-type]


def test_encode_accepts_numpy_integers() -> None:
    numpy_ints = isa.Load(mem=np.int64(MEM_INP), x_size=np.uint16(3))  # type: ignore[arg-type]
    assert isa.encode(numpy_ints, DEFAULT) == isa.encode(isa.Load(mem=MEM_INP, x_size=3), DEFAULT)


def test_encode_rejects_non_instructions() -> None:
    with pytest.raises(TypeError, match=r"^expected a Load, Store, Gemm, Alu or Finish instruction, not Uop$"):
        isa.encode(isa.Uop(0, 0), DEFAULT)  # type: ignore[arg-type]


def test_decode_unknown_opcode() -> None:
    with pytest.raises(isa.DecodeError,
                       match=r"^unknown opcode 5 \(known: 0=LOAD, 1=STORE, 2=GEMM, 3=FINISH, 4=ALU\)$"):
        isa.decode(5, DEFAULT)


def test_decode_stream_errors() -> None:
    with pytest.raises(isa.DecodeError, match=r"^an instruction stream must be a multiple of 16 bytes, not 17$"):
        isa.decode_stream(bytes(17), DEFAULT)
    data = isa.encode_stream([isa.Finish(), isa.Finish()], DEFAULT)
    data[1, 0] = 7
    with pytest.raises(isa.DecodeError, match=r"^instruction 1: unknown opcode 7"):
        isa.decode_stream(data, DEFAULT)


def test_encode_is_config_dependent() -> None:
    # acc depth 1024 at log_block=5: dst factors are 10 bits there, 11 at the default
    with pytest.raises(isa.EncodeError, match=r"dst_factor_out = 1024 does not fit its 10-bit field .* at config "
                                              r"1x32_i8w8a32_15_15_18_17$"):
        isa.encode(isa.Gemm(dst_factor_out=1024), VTAConfig(log_block=5))
    assert isa.encode(isa.Gemm(dst_factor_out=1024), DEFAULT) == 2 | 1 << 21 | 1 << 35 | 1 << 49 | 1024 << 64


# ---- other configs --------------------------------------------------------------------------------------------------
def test_batch2_block8_needs_256_bits() -> None:
    cfg = VTAConfig(log_batch=1, log_block=3)  # wgt depth 4096 -> 12-bit wgt factors; GEMM upper half ends at 132
    lay = isa.layout(cfg)
    assert (lay.insn_bits, lay.insn_bytes, lay.uop_bits) == (256, 32, 64)
    assert triples(cfg, isa.OP_GEMM)[5:] == [
        ("reset", 7, 1), ("uop_bgn", 8, 12), ("uop_end", 20, 13), ("iter_out", 33, 14), ("iter_in", 47, 14),
        ("dst_factor_out", 64, 11), ("dst_factor_in", 75, 11), ("src_factor_out", 86, 11), ("src_factor_in", 97, 11),
        ("wgt_factor_out", 108, 12), ("wgt_factor_in", 120, 12)]
    assert [(f.name, f.lsb, f.width) for f in lay.uop_fields] == [("dst", 0, 11), ("src", 11, 11), ("wgt", 22, 12)]
    gemm = isa.Gemm(wgt_factor_in=4095, uop_end=4096)
    assert isa.encode(gemm, cfg) >> 128 == 4095 >> 8  # the top bits of wgt_factor_in sit past bit 127
    assert isa.decode(isa.encode(gemm, cfg), cfg) == gemm
    assert isa.encode_stream([gemm], cfg).shape == (1, 32)


def test_deep_uop_buffer_moves_upper_half_to_bit_128() -> None:
    cfg = VTAConfig(log_uop_buff_size=18)  # 65536 micro-ops: the lower loop fields need 69 bits
    assert isa.layout(cfg).insn_bits == 256
    assert triples(cfg, isa.OP_GEMM)[5:10] == [("reset", 7, 1), ("uop_bgn", 8, 16), ("uop_end", 24, 17),
                                               ("iter_out", 41, 14), ("iter_in", 55, 14)]
    assert isa.layout(cfg).field(isa.OP_GEMM, "dst_factor_out").lsb == 128
    assert isa.layout(cfg).field(isa.OP_ALU, "imm").lsb == 128 + 44 + 4
    assert isa.layout(cfg).field(isa.OP_LOAD, "y_size").lsb == 64  # LOAD/STORE keep VTA's layout


def test_block32_keeps_128_bits() -> None:
    cfg = VTAConfig(log_block=5)
    lay = isa.layout(cfg)
    assert (lay.insn_bits, lay.uop_bits) == (128, 32)
    assert triples(cfg, isa.OP_GEMM)[-6:] == [("dst_factor_out", 64, 10), ("dst_factor_in", 74, 10),
                                              ("src_factor_out", 84, 10), ("src_factor_in", 94, 10),
                                              ("wgt_factor_out", 104, 8), ("wgt_factor_in", 112, 8)]


# ---- streams, micro-ops, routing ------------------------------------------------------------------------------------
def test_stream_round_trip_and_byte_order() -> None:
    insns: list[isa.Insn] = [isa.Load(mem=MEM_UOP, x_size=4), isa.Gemm(uop_end=4), isa.Finish()]
    data = isa.encode_stream(insns, DEFAULT)
    assert data.dtype == np.uint8 and data.shape == (3, 16)
    assert list(data[2]) == [3] + [0] * 15  # little-endian: the opcode is in byte 0
    assert isa.decode_stream(data, DEFAULT) == insns
    assert isa.decode_stream(data.tobytes(), DEFAULT) == insns
    assert isa.encode_stream([], DEFAULT).shape == (0, 16)


def test_uops_encode_decode() -> None:
    words = isa.encode_uops([1, 2047], [3, 0], [5, 1023], DEFAULT)
    assert words.dtype == np.uint32
    assert list(words) == [1 | 3 << 11 | 5 << 22, 2047 | 1023 << 22]
    dst, src, wgt = isa.decode_uops(words, DEFAULT)
    assert (list(dst), list(src), list(wgt)) == ([1, 2047], [3, 0], [5, 1023])


def test_uops_64_bit() -> None:
    cfg = VTAConfig(log_batch=1, log_block=3)
    words = isa.encode_uops([2047], [2047], [4095], cfg)
    assert words.dtype == np.uint64
    assert int(words[0]) == 2047 | 2047 << 11 | 4095 << 22
    assert [int(a[0]) for a in isa.decode_uops(words, cfg)] == [2047, 2047, 4095]


@pytest.mark.parametrize("dst, src, wgt, message", [
    ([2048], [0], [0], r"^micro-op field dst = 2048 does not fit its 11-bit field \(allowed 0\.\.2047\) at config "
                       r"1x16_i8w8a32_15_15_18_17$"),
    ([0], [-1], [0], r"^micro-op field src = -1 does not fit its 11-bit field"),
    ([0, 0], [0, 0], [3, 1024], r"^micro-op field wgt = 1024 does not fit its 10-bit field \(allowed 0\.\.1023\)"),
])
def test_uop_overflow(dst: list[int], src: list[int], wgt: list[int], message: str) -> None:
    with pytest.raises(isa.EncodeError, match=message):
        isa.encode_uops(dst, src, wgt, DEFAULT)


def test_module_of_routes_as_vta_fetch() -> None:
    assert [isa.module_of(isa.Load(mem=m)) for m in (MEM_INP, MEM_WGT, MEM_UOP, MEM_ACC, MEM_ACC_8BIT)] == \
        ["load", "load", "compute", "compute", "compute"]
    assert isa.module_of(isa.Store()) == "store"
    assert [isa.module_of(i) for i in (isa.Gemm(), isa.Alu(alu_opcode=isa.ALU_MAX), isa.Finish())] == ["compute"] * 3


def test_field_fits() -> None:
    assert isa.Field("imm", 0, 4, signed=True).fits(-8) and not isa.Field("imm", 0, 4, signed=True).fits(8)
    assert isa.Field("x", 0, 4).fits(15) and not isa.Field("x", 0, 4).fits(-1)
    assert isa.Field("x", 5, 4).msb == 8


def test_alu_min_mul_encodable() -> None:
    for op in (isa.ALU_MIN, isa.ALU_MUL):
        alu = isa.Alu(alu_opcode=op, src_factor_in=7)
        assert isa.decode(isa.encode(alu, DEFAULT), DEFAULT) == alu
