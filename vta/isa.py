"""The instruction set, defined once as data: field layouts derived from a :class:`~vta.config.VTAConfig`.

At the default config every instruction is 128 bits and every field sits exactly where VTA's published layout puts it
(see ``docs/vta-reference.md``). Index fields take their widths from the buffer depths, so a config with deeper buffers
gets wider fields; when an instruction's fields no longer fit 128 bits the instruction grows to 256 bits (the second
half always starts on a 64-bit boundary). Micro-ops are 32 bits while their three indices fit, else 64.

Instructions are small frozen dataclasses (:class:`Load`, :class:`Store`, :class:`Gemm`, :class:`Alu`,
:class:`Finish`); :func:`encode` and :func:`decode` turn them into integers and back, :func:`encode_stream` and
:func:`decode_stream` into little-endian byte arrays (one row per instruction) as they sit in DRAM. The hardware
generator reads the same :class:`Layout` to slice fields, so no bit offset is written twice.

Semantics (what the functional simulator implements):

* LOAD/STORE ``mem`` (``MEM_*`` in :mod:`vta.config`) moves a 2D block: ``y_size`` rows of ``x_size`` elements;
  DRAM element address ``dram_base + y * x_stride + x`` (in elements of that memory type); SRAM entry
  ``sram_base + (y + y_pad_0) * (x_pad_0 + x_size + x_pad_1) + x + x_pad_0``. Padding (LOAD only) writes zeros.
  ``x_size == 0`` moves only tokens.
* GEMM: for ``o < iter_out``, ``i < iter_in``, ``u`` in ``[uop_bgn, uop_end)``:
  ``acc[d] = 0 if reset else acc[d] + inp[s] @ wgt[w].T`` with ``d = uop.dst + o*dst_factor_out + i*dst_factor_in``
  (likewise ``s`` with the src factors and ``w`` with the wgt factors); ``out[d] = low 8 bits of acc[d]``. With the
  ``gemm_overwrite`` knob a reset GEMM writes ``acc[d] = inp[s] @ wgt[w].T`` instead of zeros.
* ALU: the same loops; ``acc[d] = op(acc[d], imm if use_imm else acc[s])`` and ``out[d] = low 8 bits of acc[d]``;
  ``reset`` writes zeros instead, as for GEMM (the wgt factors and the micro-ops' wgt field are unused).
  MIN, MAX, ADD and MUL wrap to 32 bits. SHR takes the shift amount's low 6 bits as a signed number ``n`` in
  [-32, 31]: ``n >= 0`` shifts right arithmetically, ``n < 0`` shifts left by ``-n`` (wrapping). ``imm`` is a 16-bit
  signed value.
* ALU REQ (opcode 5, valid only with the ``fused_requant`` knob, see :data:`KNOB_ALU_OPS`): the fused requantization
  ``acc[d] = min(max(SHR(acc[d] * M, S), lo), hi)``, lane by lane: ``M`` is the low 16 bits of ``acc[s]``'s lane as a
  signed number, ``S`` its bits 16..21 (the shift amount as SHR takes it), the product wraps to 32 bits as MUL's does;
  ``lo`` is the low byte of ``imm`` and ``hi`` its high byte, both signed (:func:`requant_word`,
  :func:`requant_imm`). It always reads ``acc[s]`` and must have ``use_imm`` clear. Equal, bit for bit, to MUL by
  ``M``, SHR by ``S``, MAX ``lo``, MIN ``hi`` in a row.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from operator import attrgetter
from typing import Any, Callable, Iterable, Union

import numpy as np

from .config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig

__all__ = [
    "OP_LOAD", "OP_STORE", "OP_GEMM", "OP_FINISH", "OP_ALU", "OPCODE_NAMES",
    "ALU_MIN", "ALU_MAX", "ALU_ADD", "ALU_SHR", "ALU_MUL", "ALU_REQ", "ALU_RSUM", "ALU_RMAX", "ALU_NAMES",
    "KNOB_ALU_OPS", "alu_opcodes",
    "REQ_SHIFT_LSB", "requant_word", "requant_imm",
    "Field", "Layout", "layout", "EncodeError", "DecodeError",
    "Load", "Store", "Gemm", "Alu", "Finish", "Insn", "Uop",
    "encode", "decode", "encode_stream", "decode_stream", "encode_uops", "decode_uops", "module_of",
    "insn_uops", "insn_macs", "gemm_multiplies", "insn_pops", "insn_pushes",
    "MEMORY_TYPES", "TOKEN_QUEUES", "TOKEN_POPS", "TOKEN_PUSHES",
    "COMMON_FIELDS", "LOOP_OPCODES", "LOAD_TARGETS",
]

OP_LOAD, OP_STORE, OP_GEMM, OP_FINISH, OP_ALU = 0, 1, 2, 3, 4
OPCODE_NAMES = {OP_LOAD: "LOAD", OP_STORE: "STORE", OP_GEMM: "GEMM", OP_FINISH: "FINISH", OP_ALU: "ALU"}
ALU_MIN, ALU_MAX, ALU_ADD, ALU_SHR, ALU_MUL, ALU_REQ, ALU_RSUM, ALU_RMAX = 0, 1, 2, 3, 4, 5, 6, 7
ALU_NAMES = {ALU_MIN: "MIN", ALU_MAX: "MAX", ALU_ADD: "ADD", ALU_SHR: "SHR", ALU_MUL: "MUL", ALU_REQ: "REQ",
             ALU_RSUM: "RSUM", ALU_RMAX: "RMAX"}
KNOB_ALU_OPS = {ALU_REQ: "fused_requant", ALU_RSUM: "lane_reduce", ALU_RMAX: "lane_reduce"}
"""ALU opcodes that exist only in designs with a codesign knob on: opcode -> the config field (VTA's ALU has 0..4)."""

LOOP_BITS = 14
IMM_BITS = 16


def alu_opcodes(cfg: VTAConfig) -> dict[int, str]:
    """The ALU opcodes valid at ``cfg`` -> their names: VTA's five plus those of the knobs that are on."""
    return {op: name for op, name in ALU_NAMES.items() if op not in KNOB_ALU_OPS or getattr(cfg, KNOB_ALU_OPS[op])}


REQ_SHIFT_LSB = 16
"""Bit of an REQ operand lane where the 6-bit shift amount starts (the multiplier is bits 0..15)."""


def requant_word(multiplier: int, shift: int) -> int:
    """The int32 acc lane value REQ reads as (``multiplier``, ``shift``): ``multiplier`` in [-32768, 32767] (16
    bits, signed), ``shift`` in [-32, 31] (SHR's amount: negative shifts left)."""
    if not -(1 << 15) <= multiplier < (1 << 15):
        raise ValueError(f"REQ multiplier {multiplier} does not fit 16 signed bits")
    if not -32 <= shift < 32:
        raise ValueError(f"REQ shift {shift} is outside [-32, 31]")
    word = ((shift & 63) << REQ_SHIFT_LSB) | (multiplier & 0xFFFF)
    return word - (1 << 32) if word >> 31 else word


def requant_imm(lo: int, hi: int) -> int:
    """The 16-bit signed immediate REQ reads as its clip range [``lo``, ``hi``] (each a signed byte)."""
    for name, v in (("lo", lo), ("hi", hi)):
        if not -128 <= v < 128:
            raise ValueError(f"REQ clip bound {name} = {v} does not fit a signed byte")
    value = ((hi & 0xFF) << 8) | (lo & 0xFF)
    return value - (1 << 16) if value >> 15 else value


class EncodeError(ValueError):
    """A value does not fit its instruction field."""


class DecodeError(ValueError):
    """A bit pattern is not a valid instruction."""


@dataclass(frozen=True)
class Field:
    """One instruction field: ``width`` bits starting at bit ``lsb`` (bit 0 = LSB); ``signed`` for two's complement."""

    name: str
    lsb: int
    width: int
    signed: bool = False

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    def fits(self, value: int) -> bool:
        if self.signed:
            return -(1 << (self.width - 1)) <= value < (1 << (self.width - 1))
        return 0 <= value < (1 << self.width)


@dataclass(frozen=True)
class Layout:
    """Field layouts of every instruction for one config.

    ``insn_bits``: 128 or 256. ``fields[opcode]``: the fields of that instruction in bit order (the common
    ``opcode``, ``pop_prev``, ``pop_next``, ``push_prev``, ``push_next`` first). ``uop_fields``: ``dst``, ``src``,
    ``wgt`` of a micro-op of ``uop_bits`` bits.
    """

    insn_bits: int
    fields: dict[int, tuple[Field, ...]]
    uop_bits: int
    uop_fields: tuple[Field, ...]

    @property
    def insn_bytes(self) -> int:
        return self.insn_bits // 8

    def field(self, opcode: int, name: str) -> Field:
        """The field ``name`` of instruction ``opcode``."""
        for f in self.fields[opcode]:
            if f.name == name:
                return f
        raise KeyError(f"{OPCODE_NAMES[opcode]} has no field {name!r}")


_COMMON = [("opcode", 3), ("pop_prev", 1), ("pop_next", 1), ("push_prev", 1), ("push_next", 1)]
COMMON_FIELDS = tuple(name for name, _ in _COMMON)
"""The fields every instruction has, at the same bits in every instruction at every config: ``opcode`` and the four
dependency-token flags (the flags of :data:`TOKEN_POPS` and :data:`TOKEN_PUSHES`)."""


def _place(lower: list[tuple[str, int]], upper: list[tuple[str, int]]) -> tuple[list[Field], int]:
    """Place ``lower`` fields from bit 0 and ``upper`` from the next 64-bit boundary; return fields and end bit."""
    out: list[Field] = []
    bit = 0
    for name, width in lower:
        out.append(Field(name, bit, width))
        bit += width
    bit = max(64, -(-bit // 64) * 64)
    for name, width in upper:
        out.append(Field(name, bit, width, signed=(name == "imm")))
        bit += width
    return out, bit


@lru_cache(maxsize=None)
def layout(cfg: VTAConfig) -> Layout:
    """The instruction and micro-op layouts for ``cfg`` (VTA's exact layout at the default config)."""
    sram_bits = 16
    uop_bgn = cfg.log_uop_depth
    acc, inp, wgt = cfg.log_acc_depth, cfg.log_inp_depth, cfg.log_wgt_depth
    mem_lower = _COMMON + [("mem", 3), ("sram_base", sram_bits), ("dram_base", 32)]
    mem_upper = [("y_size", 16), ("x_size", 16), ("x_stride", 16), ("y_pad_0", 4), ("y_pad_1", 4),
                 ("x_pad_0", 4), ("x_pad_1", 4)]
    loop_lower = _COMMON + [("reset", 1), ("uop_bgn", uop_bgn), ("uop_end", uop_bgn + 1),
                            ("iter_out", LOOP_BITS), ("iter_in", LOOP_BITS)]
    gemm_upper = [("dst_factor_out", acc), ("dst_factor_in", acc), ("src_factor_out", inp),
                  ("src_factor_in", inp), ("wgt_factor_out", wgt), ("wgt_factor_in", wgt)]
    alu_upper = [("dst_factor_out", acc), ("dst_factor_in", acc), ("src_factor_out", acc),
                 ("src_factor_in", acc), ("alu_opcode", 3), ("use_imm", 1), ("imm", IMM_BITS)]
    placed = {
        OP_LOAD: _place(mem_lower, mem_upper),
        OP_STORE: _place(mem_lower, mem_upper),
        OP_GEMM: _place(loop_lower, gemm_upper),
        OP_ALU: _place(loop_lower, alu_upper),
        OP_FINISH: _place(_COMMON, []),
    }
    end = max(bit for _, bit in placed.values())
    insn_bits = 128 if end <= 128 else 256
    if end > 256:  # unreachable for configs that validate; kept as a guard for future fields
        raise ValueError(f"config {cfg.name} needs {end}-bit instructions; at most 256 are supported")
    dst_bits, src_bits, wgt_bits = cfg.uop_index_bits
    uop_fields = (Field("dst", 0, dst_bits), Field("src", dst_bits, src_bits),
                  Field("wgt", dst_bits + src_bits, wgt_bits))
    return Layout(insn_bits, {op: tuple(fs) for op, (fs, _) in placed.items()}, cfg.uop_bits, uop_fields)


# ---- instructions ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class _Deps:
    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False


@dataclass(frozen=True, kw_only=True)
class _Move(_Deps):
    """The fields of LOAD and STORE (``mem_lower`` and ``mem_upper`` in :func:`layout`)."""

    mem: int
    sram_base: int = 0
    dram_base: int = 0
    y_size: int = 1
    x_size: int = 1
    x_stride: int = 1
    y_pad_0: int = 0
    y_pad_1: int = 0
    x_pad_0: int = 0
    x_pad_1: int = 0


@dataclass(frozen=True, kw_only=True)
class Load(_Move):
    """LOAD ``mem`` from DRAM to SRAM. Sizes and addresses in elements of that memory type."""

    opcode = OP_LOAD


@dataclass(frozen=True, kw_only=True)
class Store(_Move):
    """STORE from the out buffer to DRAM (``mem`` must be ``MEM_OUT``); no padding."""

    mem: int = MEM_OUT
    opcode = OP_STORE


@dataclass(frozen=True, kw_only=True)
class _Loop(_Deps):
    """The micro-op loop fields GEMM and ALU share (``loop_lower`` in :func:`layout` and the dst and src factors)."""

    reset: bool = False
    uop_bgn: int = 0
    uop_end: int = 1
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0


@dataclass(frozen=True, kw_only=True)
class Gemm(_Loop):
    """GEMM over micro-ops ``[uop_bgn, uop_end)`` in a two-level loop; ``reset`` writes zeros instead."""

    wgt_factor_out: int = 0
    wgt_factor_in: int = 0
    opcode = OP_GEMM


@dataclass(frozen=True, kw_only=True)
class Alu(_Loop):
    """Tensor ALU op ``alu_opcode`` (``ALU_*``) over micro-ops, with ``imm`` when ``use_imm`` else acc[src]."""

    alu_opcode: int
    use_imm: bool = False
    imm: int = 0
    opcode = OP_ALU


@dataclass(frozen=True, kw_only=True)
class Finish(_Deps):
    """End of the program: the accelerator signals done."""

    opcode = OP_FINISH


Insn = Union[Load, Store, Gemm, Alu, Finish]
_CLASSES: dict[int, type] = {OP_LOAD: Load, OP_STORE: Store, OP_GEMM: Gemm, OP_ALU: Alu, OP_FINISH: Finish}
_CLASS_SET = frozenset(_CLASSES.values())


@dataclass(frozen=True)
class Uop:
    """A micro-op: ``dst`` indexes acc; ``src`` indexes inp (GEMM) or acc (ALU); ``wgt`` indexes wgt."""

    dst: int
    src: int
    wgt: int = 0


TOKEN_QUEUES = ("load_to_compute", "compute_to_load", "compute_to_store", "store_to_compute")
"""The four dependency token queues, each with one writer and one reader (docs/vta-reference.md)."""
TOKEN_POPS = {"load": {"pop_next": "compute_to_load"},
              "compute": {"pop_prev": "load_to_compute", "pop_next": "store_to_compute"},
              "store": {"pop_prev": "compute_to_store"}}
"""module -> instruction flag -> the token queue an instruction of that module pops when the flag is set."""
TOKEN_PUSHES = {"load": {"push_next": "load_to_compute"},
                "compute": {"push_prev": "compute_to_load", "push_next": "compute_to_store"},
                "store": {"push_prev": "store_to_compute"}}
"""module -> instruction flag -> the token queue an instruction of that module pushes when the flag is set."""
LOOP_OPCODES = (OP_GEMM, OP_ALU)
"""The instructions that run the micro-op loop (``uop_bgn``, ``uop_end``, ``iter_out``, ``iter_in``, the factors)."""
LOAD_TARGETS = {"load": (MEM_INP, MEM_WGT), "compute": (MEM_UOP, MEM_ACC, MEM_ACC_8BIT)}
"""module -> the memory types whose LOADs it executes (as :func:`module_of` assigns them)."""


def module_of(insn: Insn) -> str:
    """The module that executes ``insn``: ``'load'`` (LOAD inp/wgt), ``'store'`` (STORE) or ``'compute'`` (rest)."""
    if isinstance(insn, Load) and insn.mem in (MEM_INP, MEM_WGT):
        return "load"
    if isinstance(insn, Store):
        return "store"
    return "compute"


# ---- what one instruction does, counted: the rules every simulator, model and counter takes -----------------------
def insn_uops(insn: Insn) -> int:
    """Micro-op iterations a GEMM or ALU instruction issues: ``iter_out * iter_in * (uop_end - uop_bgn)`` (0 when a
    bound is empty or ``uop_end < uop_bgn``, and for every other instruction). The ``gemm_uops`` / ``alu_uops``
    counters sum it."""
    if isinstance(insn, (Gemm, Alu)):
        return max(0, insn.uop_end - insn.uop_bgn) * insn.iter_out * insn.iter_in
    return 0


def gemm_multiplies(insn: Gemm, cfg: VTAConfig) -> bool:
    """Whether the GEMM ``insn`` multiplies (and counts MACs): a GEMM without ``reset``, or any GEMM with the
    ``gemm_overwrite`` knob (its reset writes the products, ``acc[d] = inp[s] @ wgt[w].T``); a plain reset GEMM
    writes zeros and multiplies nothing."""
    return not insn.reset or cfg.gemm_overwrite


def insn_macs(insn: Insn, cfg: VTAConfig) -> int:
    """Multiply-accumulates ``insn`` performs at ``cfg``: ``BATCH * BLOCK_IN * BLOCK_OUT`` per micro-op iteration of
    a GEMM that multiplies (:func:`gemm_multiplies`), 0 for every other instruction. The ``macs`` statistic sums it."""
    if isinstance(insn, Gemm) and gemm_multiplies(insn, cfg):
        return insn_uops(insn) * cfg.macs_per_cycle
    return 0


def insn_pops(insn: Insn) -> tuple[str, ...]:
    """The token queues (:data:`TOKEN_QUEUES` names) ``insn`` pops, one token each, in :data:`TOKEN_POPS` order: its
    module's pop flags that are set. A flag its module does not pop from (e.g. a LOAD INP's ``pop_prev``) pops
    nothing."""
    return tuple(q for flag, q in TOKEN_POPS[module_of(insn)].items() if getattr(insn, flag))


def insn_pushes(insn: Insn) -> tuple[str, ...]:
    """The token queues ``insn`` pushes, one token each, in :data:`TOKEN_PUSHES` order (as :func:`insn_pops`)."""
    return tuple(q for flag, q in TOKEN_PUSHES[module_of(insn)].items() if getattr(insn, flag))


# ---- encode / decode -----------------------------------------------------------------------------------------------
def encode(insn: Insn, cfg: VTAConfig) -> int:
    """The instruction as an unsigned integer of ``layout(cfg).insn_bits`` bits.

    Raises :class:`EncodeError` naming the field and the value when a value does not fit its field, and
    :class:`TypeError` for something that is not an instruction.
    """
    if type(insn) not in _CLASS_SET:
        raise TypeError(f"expected a Load, Store, Gemm, Alu or Finish instruction, not {type(insn).__name__}")
    opcode = insn.opcode
    word = opcode
    getter, specs = _encoder(cfg)[opcode]
    for value, (name, lsb, lo, hi, mask) in zip(getter(insn), specs):
        if type(value) is not int and type(value) is not bool:
            if not isinstance(value, (int, np.integer)):  # floats and strings are not truncated
                raise TypeError(f"{OPCODE_NAMES[opcode]} field {name} must be an integer, not {value!r}")
            value = int(value)
        if not lo <= value <= hi:
            raise EncodeError(f"{OPCODE_NAMES[opcode]} field {name} = {value} does not fit its "
                              f"{mask.bit_length()}-bit field (allowed {lo}..{hi}) at config {cfg.name}")
        word |= (value & mask) << lsb
    return word


_FieldSpec = tuple[str, int, int, int, int]
"""(name, lsb, lowest value, highest value, mask) of one instruction field, for :func:`encode`."""


@lru_cache(maxsize=64)
def _encoder(cfg: VTAConfig) -> dict[int, tuple[Callable[[Any], tuple[Any, ...]], tuple[_FieldSpec, ...]]]:
    """opcode -> (a getter of the instruction's field values, in order; (name, lsb, lowest, highest, mask) of each
    field but ``opcode`` (bits 0-2)), from :func:`layout`: what :func:`encode` needs, computed once per config."""
    out: dict[int, tuple[Callable[[Any], tuple[Any, ...]], tuple[_FieldSpec, ...]]] = {}
    for opcode, fs in layout(cfg).fields.items():
        specs = []
        for f in fs:
            if f.name == "opcode":
                assert f.lsb == 0 and f.width == 3
                continue
            lo, hi = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed else (0, (1 << f.width) - 1)
            specs.append((f.name, f.lsb, lo, hi, (1 << f.width) - 1))
        names = [spec[0] for spec in specs]
        getter = attrgetter(*names) if len(names) > 1 else (lambda insn, n=names[0]: (getattr(insn, n),))
        out[opcode] = (getter, tuple(specs))
    return out


def decode(word: int, cfg: VTAConfig) -> Insn:
    """The instruction encoded in ``word`` (inverse of :func:`encode`). Bits outside every field are ignored."""
    opcode = word & 0b111
    if opcode not in _CLASSES:
        raise DecodeError(f"unknown opcode {opcode} (known: {', '.join(f'{k}={v}' for k, v in OPCODE_NAMES.items())})")
    values = {}
    for f in layout(cfg).fields[opcode]:
        raw = (word >> f.lsb) & ((1 << f.width) - 1)
        if f.signed and raw >> (f.width - 1):
            raw -= 1 << f.width
        values[f.name] = raw
    del values["opcode"]
    cls = _CLASSES[opcode]
    for attr in fields(cls):
        if attr.type in ("bool", bool) and attr.name in values:
            values[attr.name] = bool(values[attr.name])
    return cls(**values)


def encode_stream(insns: Iterable[Insn], cfg: VTAConfig) -> np.ndarray:
    """Instructions as a ``uint8`` array of shape ``(n, insn_bytes)``, each row little-endian, as in DRAM."""
    nbytes = layout(cfg).insn_bytes
    rows = [encode(insn, cfg).to_bytes(nbytes, "little") for insn in insns]
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), nbytes).copy()


def decode_stream(data: np.ndarray | bytes, cfg: VTAConfig) -> list[Insn]:
    """Inverse of :func:`encode_stream`; ``data`` is bytes or a uint8 array whose size is a multiple of insn_bytes."""
    raw = bytes(np.asarray(data, dtype=np.uint8).reshape(-1)) if not isinstance(data, bytes) else data
    nbytes = layout(cfg).insn_bytes
    if len(raw) % nbytes:
        raise DecodeError(f"an instruction stream must be a multiple of {nbytes} bytes, not {len(raw)}")
    out = []
    for k in range(0, len(raw), nbytes):
        try:
            out.append(decode(int.from_bytes(raw[k:k + nbytes], "little"), cfg))
        except DecodeError as err:
            raise DecodeError(f"instruction {k // nbytes}: {err}") from None
    return out


def encode_uops(dst: np.ndarray | Iterable[int], src: np.ndarray | Iterable[int], wgt: np.ndarray | Iterable[int],
                cfg: VTAConfig) -> np.ndarray:
    """Micro-ops as an array of ``uint32`` (or ``uint64`` for 64-bit micro-ops), one per micro-op."""
    lay = layout(cfg)
    dtype = np.uint32 if lay.uop_bits == 32 else np.uint64
    word = np.zeros(np.broadcast(np.asarray(dst), np.asarray(src), np.asarray(wgt)).shape, dtype=np.uint64)
    for f, values in zip(lay.uop_fields, (dst, src, wgt)):
        arr = np.asarray(values, dtype=np.int64)
        bad = (arr < 0) | (arr >= (1 << f.width))
        if bad.any():
            first = int(arr[bad].flat[0])
            raise EncodeError(f"micro-op field {f.name} = {first} does not fit its {f.width}-bit field "
                              f"(allowed 0..{(1 << f.width) - 1}) at config {cfg.name}")
        word |= arr.astype(np.uint64) << np.uint64(f.lsb)
    return word.astype(dtype)


def decode_uops(words: np.ndarray, cfg: VTAConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dst, src, wgt)`` int64 arrays from micro-op words (inverse of :func:`encode_uops`)."""
    w = np.asarray(words).astype(np.uint64)
    out = []
    for f in layout(cfg).uop_fields:
        out.append(((w >> np.uint64(f.lsb)) & np.uint64((1 << f.width) - 1)).astype(np.int64))
    return out[0], out[1], out[2]


MEMORY_TYPES = {MEM_UOP: "UOP", MEM_WGT: "WGT", MEM_INP: "INP", MEM_ACC: "ACC", MEM_OUT: "OUT",
                MEM_ACC_8BIT: "ACC_8BIT"}
