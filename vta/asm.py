"""A readable text form of the instruction set, round-trip exact with :mod:`vta.isa`.

One instruction per line; every field is shown, in a fixed order, as ``key=value`` or as a flag::

    LOAD INP sram=0 dram=64 y=4 x=16 stride=16 pad=0,0,1,1 pop_next push_next
    STORE OUT sram=0 dram=128 y=1 x=4 stride=4 pad=0,0,0,0 pop_prev push_prev
    GEMM uop=0:16 iter=4,2 dst=16,1 src=32,1 wgt=0,4 reset
    ALU SHR uop=0:1 iter=8,1 dst=1,0 src=1,0 imm=-3 pop_prev
    FINISH

Keys and what they hold (sizes and addresses in elements of the memory type, as in :mod:`vta.isa`):

* LOAD/STORE ``MEM`` (``UOP``, ``WGT``, ``INP``, ``ACC``, ``OUT``, ``ACC_8BIT`` or a number): ``sram`` = sram_base,
  ``dram`` = dram_base, ``y`` = y_size, ``x`` = x_size, ``stride`` = x_stride,
  ``pad`` = y_pad_0,y_pad_1,x_pad_0,x_pad_1.
* GEMM: ``uop=BGN:END`` (half-open micro-op range), ``iter=OUT,IN``, and the index factors ``dst=OUT,IN``,
  ``src=OUT,IN``, ``wgt=OUT,IN``.
* ALU ``OP`` (``MIN``, ``MAX``, ``ADD``, ``SHR``, ``MUL`` or a number): ``uop``, ``iter``, ``dst``, ``src`` as GEMM;
  ``imm=N`` means use_imm with the signed immediate N. A word whose use_imm bit is clear but whose imm field is not
  zero prints as ``unused_imm=N`` so that nothing is lost.
* Flags, printed only when set, in this order: ``reset`` (GEMM/ALU), ``pop_prev``, ``pop_next``, ``push_prev``,
  ``push_next``.

The assembler accepts what :func:`disassemble` prints, plus: comments from ``#`` to the end of the line, blank lines,
mnemonics, names, keys and flags in any case, keys in any order, numbers in decimal or ``0x`` hex. A key left out takes
the instruction dataclass's default (e.g. ``y=1``, ``stride=1``). Every instruction is checked against the field
widths of the config, and every error names the line, the token and what was expected (:class:`AsmError`).

Micro-op kernels have their own lines, ``UOP dst=D src=S wgt=W`` (:func:`assemble_uops`, :func:`disassemble_uops`);
:func:`assemble_listing` reads a text that mixes both kinds of line.

`vta asm` reads a UTF-8 text of at most :data:`MAX_SOURCE_BYTES` (64 MiB), from a file or standard input.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, Sequence

import numpy as np

from .config import VTAConfig
from .isa import (
    ALU_NAMES,
    MEMORY_TYPES,
    OP_ALU,
    OP_FINISH,
    OP_GEMM,
    OP_LOAD,
    OP_STORE,
    OPCODE_NAMES,
    Alu,
    EncodeError,
    Field,
    Finish,
    Gemm,
    Insn,
    Load,
    Store,
    Uop,
    decode_uops,
    encode,
    encode_uops,
    layout,
)

__all__ = ["AsmError", "Listing", "assemble", "disassemble", "assemble_uops", "disassemble_uops", "assemble_listing",
           "format_insn", "format_uop", "MAX_SOURCE_BYTES"]

MAX_SOURCE_BYTES = 64 << 20
"""The largest assembly text `vta asm` reads, from a file or standard input: 64 MiB, about a million instructions
(assembling that many takes about 40 s and 600 MB)."""


class AsmError(ValueError):
    """A line of assembly text is wrong. ``line`` is 1-based; ``token`` is the offending token (or None)."""

    def __init__(self, line: int, token: str | None, message: str) -> None:
        self.line = line
        self.token = token
        self.reason = message
        where = f"line {line}" + (f", token {token!r}" if token is not None else "")
        super().__init__(f"{where}: {message}")


# key -> (fields it holds, separator between values) per instruction kind, in printing order.
_MEM_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "sram": (("sram_base",), ","), "dram": (("dram_base",), ","), "y": (("y_size",), ","),
    "x": (("x_size",), ","), "stride": (("x_stride",), ","),
    "pad": (("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"), ","),
}
_LOOP_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "uop": (("uop_bgn", "uop_end"), ":"), "iter": (("iter_out", "iter_in"), ","),
    "dst": (("dst_factor_out", "dst_factor_in"), ","), "src": (("src_factor_out", "src_factor_in"), ","),
}
_GEMM_KEYS = {**_LOOP_KEYS, "wgt": (("wgt_factor_out", "wgt_factor_in"), ",")}
_ALU_KEYS = {**_LOOP_KEYS, "imm": (("imm",), ","), "unused_imm": (("imm",), ",")}
_UOP_KEYS: dict[str, tuple[tuple[str, ...], str]] = {"dst": (("dst",), ","), "src": (("src",), ","),
                                                     "wgt": (("wgt",), ",")}
_KEYS = {OP_LOAD: _MEM_KEYS, OP_STORE: _MEM_KEYS, OP_GEMM: _GEMM_KEYS, OP_ALU: _ALU_KEYS, OP_FINISH: {}}
_DEP_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")
_FLAGS = {OP_LOAD: _DEP_FLAGS, OP_STORE: _DEP_FLAGS, OP_GEMM: ("reset",) + _DEP_FLAGS,
          OP_ALU: ("reset",) + _DEP_FLAGS, OP_FINISH: _DEP_FLAGS}
_CLASSES: dict[int, type] = {OP_LOAD: Load, OP_STORE: Store, OP_GEMM: Gemm, OP_ALU: Alu, OP_FINISH: Finish}
_MNEMONICS = {name: op for op, name in OPCODE_NAMES.items()}
_MEM_BY_NAME = {name: mem for mem, name in MEMORY_TYPES.items()}
_ALU_BY_NAME = {name: op for op, name in ALU_NAMES.items()}


# ---- disassembler ---------------------------------------------------------------------------------------------------
def format_insn(insn: Insn) -> str:
    """One instruction as one line of text (no config needed: values are printed as they are)."""
    if type(insn) not in _CLASSES.values():
        raise TypeError(f"expected a Load, Store, Gemm, Alu or Finish instruction, not {type(insn).__name__}")
    op = insn.opcode
    words = [OPCODE_NAMES[op]]
    if isinstance(insn, (Load, Store)):
        words.append(MEMORY_TYPES.get(insn.mem, str(insn.mem)))
    elif isinstance(insn, Alu):
        words.append(ALU_NAMES.get(insn.alu_opcode, str(insn.alu_opcode)))
    for key, (names, sep) in _KEYS[op].items():
        if key in ("imm", "unused_imm"):
            continue
        words.append(f"{key}=" + sep.join(str(int(getattr(insn, n))) for n in names))
    if isinstance(insn, Alu):
        if insn.use_imm:
            words.append(f"imm={int(insn.imm)}")
        elif insn.imm:
            words.append(f"unused_imm={int(insn.imm)}")
    words.extend(flag for flag in _FLAGS[op] if getattr(insn, flag))
    return " ".join(words)


def disassemble(insns: Iterable[Insn], cfg: VTAConfig, *, numbered: bool = False) -> str:
    """The instructions as text, one per line (ending with a newline when not empty).

    Each instruction is first checked to fit the field widths of ``cfg`` (:class:`~vta.isa.EncodeError` naming the
    instruction index otherwise), so the text always assembles back to the same instructions. ``numbered`` appends the
    instruction index as a comment (``  # 12``).
    """
    lines = []
    for index, insn in enumerate(insns):
        try:
            encode(insn, cfg)
        except EncodeError as err:
            raise EncodeError(f"instruction {index}: {err}") from None
        line = format_insn(insn)
        lines.append(f"{line}  # {index}" if numbered else line)
    return "".join(line + "\n" for line in lines)


def format_uop(uop: Uop) -> str:
    """One micro-op as ``UOP dst=D src=S wgt=W``."""
    if not isinstance(uop, Uop):
        raise TypeError(f"expected a Uop, not {type(uop).__name__}")
    return f"UOP dst={int(uop.dst)} src={int(uop.src)} wgt={int(uop.wgt)}"


def disassemble_uops(uops: Sequence[Uop] | np.ndarray, cfg: VTAConfig, *, numbered: bool = False) -> str:
    """Micro-ops as text, one ``UOP`` line each. ``uops`` is a sequence of :class:`~vta.isa.Uop` or an array of
    encoded micro-op words (as :func:`vta.isa.encode_uops` returns); either is checked against ``cfg``."""
    if isinstance(uops, np.ndarray):
        dst, src, wgt = decode_uops(uops.reshape(-1), cfg)
        items = [Uop(int(d), int(s), int(w)) for d, s, w in zip(dst, src, wgt)]
    else:
        items = list(uops)
        for uop in items:
            if not isinstance(uop, Uop):
                raise TypeError(f"expected a sequence of Uop, found a {type(uop).__name__}")
        if items:
            encode_uops([u.dst for u in items], [u.src for u in items], [u.wgt for u in items], cfg)
    lines = [format_uop(u) + (f"  # {i}" if numbered else "") for i, u in enumerate(items)]
    return "".join(line + "\n" for line in lines)


# ---- assembler ------------------------------------------------------------------------------------------------------
def _lines(text: str) -> Iterable[tuple[int, list[str]]]:
    """(1-based line number, tokens) of every line that is not blank or a comment."""
    if not isinstance(text, str):
        raise TypeError(f"assembly text must be a str, not {type(text).__name__}")
    for number, line in enumerate(text.splitlines(), start=1):
        tokens = line.split("#", 1)[0].split()
        if tokens:
            yield number, tokens


def _int(line: int, token: str, text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise AsmError(line, token, f"{what} must be an integer (decimal or 0x hex), not {text!r}") from None


def _operand(line: int, token: str, names: dict[str, int], what: str) -> int:
    upper = token.upper()
    if upper in names:
        return names[upper]
    try:
        return int(token, 0)
    except ValueError:
        raise AsmError(line, token, f"expected {what}: one of {', '.join(names)} or a number") from None


def _parse_keys(line: int, tokens: list[str], keys: dict[str, tuple[tuple[str, ...], str]],
                flags: tuple[str, ...], what: str, origin: dict[str, str]) -> dict[str, int]:
    """Field values from ``key=value`` tokens and flags; each key or flag at most once.

    ``origin`` is filled with field name -> the token that gave it (for error messages).
    """
    values: dict[str, int] = {}
    seen: set[str] = set()
    for token in tokens:
        key, eq, rest = token.partition("=")
        key = key.lower()
        if not eq:
            if key not in flags:
                raise AsmError(line, token, f"expected key=value or a flag of {what}; keys: {', '.join(keys) or 'none'}"
                                            f"; flags: {', '.join(flags)}")
            value_of = {key: 1}
        elif key not in keys:
            raise AsmError(line, token, f"unknown key {key!r} for {what}; expected one of {', '.join(keys) or 'none'}")
        else:
            names, sep = keys[key]
            parts = rest.split(sep)
            if len(parts) != len(names):
                shape = sep.join(n.upper() for n in names)
                raise AsmError(line, token, f"{key} takes {len(names)} value{'s' if len(names) > 1 else ''} "
                                            f"({key}={shape}), got {len(parts)}")
            value_of = {n: _int(line, token, p, f"{key} value") for n, p in zip(names, parts)}
        if key in seen:
            raise AsmError(line, token, f"{key} is given twice on one line")
        if key in ("imm", "unused_imm") and seen & {"imm", "unused_imm"}:
            raise AsmError(line, token, "imm= and unused_imm= exclude each other; give one of them")
        seen.add(key)
        if key == "imm":
            values["use_imm"] = 1
        values.update(value_of)
        origin.update({name: token for name in value_of})
    return values


def _check_fields(line: int, fields_: Iterable[Field], values: dict[str, int], origin: dict[str, str],
                  cfg: VTAConfig, what: str) -> None:
    """Raise :class:`AsmError` naming the token whose value does not fit its field at ``cfg``."""
    for f in fields_:
        if f.name in values and not f.fits(values[f.name]):
            lo, hi = (-(1 << (f.width - 1)), (1 << (f.width - 1)) - 1) if f.signed else (0, (1 << f.width) - 1)
            raise AsmError(line, origin.get(f.name), f"{what} field {f.name} = {values[f.name]} does not fit its "
                                                     f"{f.width}-bit field (allowed {lo}..{hi}) at config {cfg.name}")


def _assemble_line(number: int, tokens: list[str], cfg: VTAConfig) -> Insn:
    mnemonic = tokens[0].upper()
    if mnemonic not in _MNEMONICS:
        hint = " (micro-ops are read by assemble_uops or assemble_listing)" if mnemonic == "UOP" else ""
        raise AsmError(number, tokens[0], f"unknown mnemonic; expected one of {', '.join(_MNEMONICS)}{hint}")
    op = _MNEMONICS[mnemonic]
    cls = _CLASSES[op]
    rest = tokens[1:]
    origin: dict[str, str] = {}
    values: dict[str, int] = {}
    if op in (OP_LOAD, OP_STORE, OP_ALU):
        what, names, field = (("an ALU operation", _ALU_BY_NAME, "alu_opcode") if op == OP_ALU
                              else ("a memory type", _MEM_BY_NAME, "mem"))
        if not rest or "=" in rest[0]:
            raise AsmError(number, rest[0] if rest else None,
                           f"{mnemonic} needs {what} after the mnemonic ({', '.join(names)})")
        values[field] = _operand(number, rest[0], names, what)
        origin[field] = rest[0]
        rest = rest[1:]
    values.update(_parse_keys(number, rest, _KEYS[op], _FLAGS[op], mnemonic, origin))
    _check_fields(number, layout(cfg).fields[op], values, origin, cfg, mnemonic)
    bools = {f.name for f in fields(cls) if f.type in ("bool", bool)}
    return cls(**{name: bool(v) if name in bools else v for name, v in values.items()})


def _assemble_uop(number: int, tokens: list[str], cfg: VTAConfig) -> Uop:
    origin: dict[str, str] = {}
    values = _parse_keys(number, tokens[1:], _UOP_KEYS, (), "UOP", origin)
    missing = [k for k in ("dst", "src") if k not in values]
    if missing:
        raise AsmError(number, None, f"UOP needs {' and '.join(k + '=' for k in missing)} (wgt= defaults to 0)")
    _check_fields(number, layout(cfg).uop_fields, values, origin, cfg, "micro-op")
    return Uop(values["dst"], values["src"], values.get("wgt", 0))


def assemble(text: str, cfg: VTAConfig) -> list[Insn]:
    """The instructions written in ``text`` (the inverse of :func:`disassemble`); raises :class:`AsmError`."""
    return [_assemble_line(number, tokens, cfg) for number, tokens in _lines(text)]


def assemble_uops(text: str, cfg: VTAConfig) -> list[Uop]:
    """The micro-ops written in ``text``, one ``UOP dst=D src=S wgt=W`` line each; raises :class:`AsmError`."""
    out = []
    for number, tokens in _lines(text):
        if tokens[0].upper() != "UOP":
            raise AsmError(number, tokens[0], "expected a UOP line (UOP dst=D src=S wgt=W)")
        out.append(_assemble_uop(number, tokens, cfg))
    return out


@dataclass(frozen=True)
class Listing:
    """What :func:`assemble_listing` reads: instructions and micro-ops, each in the order written."""

    insns: list[Insn]
    uops: list[Uop]


def assemble_listing(text: str, cfg: VTAConfig) -> Listing:
    """A text mixing instruction lines and ``UOP`` lines, split into the two streams (each in text order)."""
    insns: list[Insn] = []
    uops: list[Uop] = []
    for number, tokens in _lines(text):
        if tokens[0].upper() == "UOP":
            uops.append(_assemble_uop(number, tokens, cfg))
        else:
            insns.append(_assemble_line(number, tokens, cfg))
    return Listing(insns, uops)


def _check_layout(cfg: VTAConfig) -> None:
    """Every field of the layout has a key or flag here (guards this module against new ISA fields)."""
    lay = layout(cfg)
    for op, keys in _KEYS.items():
        covered = {n for names, _ in keys.values() for n in names} | set(_FLAGS[op]) | {"opcode", "mem", "alu_opcode",
                                                                                         "use_imm"}
        missing = [f.name for f in lay.fields[op] if f.name not in covered]
        if missing:
            raise RuntimeError(f"the assembler has no syntax for {OPCODE_NAMES[op]} fields {missing}")
