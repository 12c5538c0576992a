"""Programs: an instruction stream plus the DRAM image it runs on, and a builder that writes them.

A :class:`Program` is everything a backend needs to run: the config, the instructions (the last one is FINISH), the
initial DRAM image (``uint8``, one byte per address) which also holds the encoded instruction stream at
``insn_offset``, and named :class:`Allocation` regions of that image (inputs, weights, outputs, micro-op kernels).

:class:`ProgramBuilder` allocates DRAM, encodes micro-op kernels, emits instructions and inserts dependency tokens the
way VTA's runtime does (``dep_push`` / ``dep_pop`` fold a token flag into a neighbouring instruction, else insert a
token-only LOAD/STORE with ``x_size == 0``). Example::

    b = ProgramBuilder(cfg)
    a = b.alloc("a", np.ones((4, cfg.batch, cfg.block_in), np.int8))
    b.load(MEM_INP, sram_base=0, dram_base=b.elem_addr(a, MEM_INP), x_size=4)
    b.dep_push("load", "compute")
    b.dep_pop("load", "compute")
    ...
    program = b.finish()

Element layouts in DRAM (as VTA's): an inp element is ``BATCH x BLOCK_IN`` int8 row-major, a wgt element
``BLOCK_OUT x BLOCK_IN`` int8, an acc element ``BATCH x BLOCK_OUT`` int32 little-endian, an out / ACC_8BIT element
``BATCH x BLOCK_OUT`` int8, a micro-op one little-endian word of ``cfg.uop_bytes``. On a design with int4 inputs or
weights (``LOG_INP_WIDTH`` / ``LOG_WGT_WIDTH`` = 2) those elements are int4 packed two per byte, element ``2i`` in the
low nibble of byte ``i`` (:mod:`vta.packing`; allocate them with ``dtype="int4"``).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from os import PathLike
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from .config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_NAMES, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from .isa import (
    OP_FINISH,
    TOKEN_POPS,
    TOKEN_PUSHES,
    Alu,
    EncodeError,
    Finish,
    Gemm,
    Insn,
    Load,
    Store,
    Uop,
    decode_stream,
    encode,
    encode_stream,
    encode_uops,
    layout,
    module_of,
)
from .packing import check_element_range, dtype_bits, pack_elements, unpack_elements

__all__ = ["Allocation", "Program", "ProgramBuilder", "SlotRing", "MODULES", "FORMAT_VERSION"]

MODULES = ("load", "compute", "store")
FORMAT_VERSION = 1
_INSN_TYPES = (Load, Store, Gemm, Alu, Finish)
# (src, dst) -> (flag set on the pushing instruction, flag set on the popping instruction), from the ISA's table
_PAIRS = {tuple(queue.split("_to_")): (push, pop)
          for src, pushes in TOKEN_PUSHES.items() for push, queue in pushes.items()
          for pop, popped in TOKEN_POPS[queue.split("_to_")[1]].items() if popped == queue}


@dataclass(frozen=True)
class Allocation:
    """A named region of the DRAM image: ``nbytes`` bytes at byte ``offset``, read as ``shape`` of ``dtype``."""

    name: str
    offset: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "offset": self.offset, "nbytes": self.nbytes, "shape": list(self.shape),
                "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Allocation":
        return cls(str(data["name"]), int(data["offset"]), int(data["nbytes"]), tuple(int(s) for s in data["shape"]),
                   str(data["dtype"]))


def _raw_bytes(data: Any, dtype: str, what: str) -> bytes:
    """The DRAM bytes of ``data`` stored as ``dtype``: a numpy dtype little-endian, or ``"int4"`` packed two
    elements per byte (:mod:`vta.packing`; values checked to lie in [-8, 7])."""
    bits = dtype_bits(dtype)
    if bits is None:
        return np.ascontiguousarray(data, dtype=_le(dtype)).tobytes()
    values = np.asarray(data)
    if values.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers to be stored as {dtype}, not {values.dtype.name}")
    check_element_range(values, bits, what)
    return pack_elements(values, bits).tobytes()


def _le(dtype: str | np.dtype) -> np.dtype:
    """``dtype`` with little-endian byte order (the DRAM image is little-endian)."""
    dt = np.dtype(dtype)
    return dt.newbyteorder("<") if dt.itemsize > 1 else dt


@dataclass(repr=False)
class Program:
    """An instruction stream and its DRAM image. Build one with :class:`ProgramBuilder`.

    Attributes:
        cfg: the accelerator design the program is written for.
        insns: the instructions, in fetch order; the last one is :class:`~vta.isa.Finish`.
        dram: initial DRAM image, ``uint8`` of shape ``(dram_bytes,)``; holds the encoded stream too.
        insn_offset: byte offset of the encoded stream in ``dram`` (multiple of ``cfg.bus_bytes`` and of the
            instruction size); the stream is ``len(insns) * insn_bytes`` bytes.
        allocations: named regions of ``dram``.
    """

    cfg: VTAConfig
    insns: list[Insn]
    dram: np.ndarray
    insn_offset: int
    allocations: dict[str, Allocation] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.cfg, VTAConfig):
            raise TypeError(f"cfg must be a VTAConfig, not {type(self.cfg).__name__}")
        for k, insn in enumerate(self.insns):
            if not isinstance(insn, _INSN_TYPES):
                raise TypeError(f"instruction {k} must be a Load, Store, Gemm, Alu or Finish, not "
                                f"{type(insn).__name__}")
        if not isinstance(self.dram, np.ndarray) or self.dram.dtype != np.uint8 or self.dram.ndim != 1:
            raise TypeError("dram must be a one-dimensional uint8 numpy array (one element per byte)")
        insn_bytes = self.insn_bytes
        align = max(self.cfg.bus_bytes, insn_bytes)
        if self.insn_offset < 0 or self.insn_offset % align:
            raise ValueError(f"insn_offset must be a non-negative multiple of {align} bytes (the bus width and the "
                             f"instruction size), not {self.insn_offset}")
        end = self.insn_offset + len(self.insns) * insn_bytes
        if end > self.dram.size:
            raise ValueError(f"the instruction stream [{self.insn_offset}, {end}) does not fit the {self.dram.size}-"
                             f"byte DRAM image")
        for name, a in self.allocations.items():
            if a.offset < 0 or a.offset + a.nbytes > self.dram.size:
                raise ValueError(f"allocation {name!r} [{a.offset}, {a.offset + a.nbytes}) lies outside the "
                                 f"{self.dram.size}-byte DRAM image")

    def __repr__(self) -> str:
        return (f"Program(cfg={self.cfg.name}, insns={len(self.insns)}, dram={self.dram.size} bytes, "
                f"insn_offset={self.insn_offset}, allocations=[{', '.join(self.allocations)}])")

    @property
    def insn_bytes(self) -> int:
        """Bytes per encoded instruction."""
        return layout(self.cfg).insn_bytes

    def encoded_insns(self) -> np.ndarray:
        """The encoded stream as it sits in ``dram``: ``uint8`` of shape ``(len(insns), insn_bytes)``."""
        nb = self.insn_bytes
        return self.dram[self.insn_offset:self.insn_offset + len(self.insns) * nb].reshape(-1, nb).copy()

    def allocation(self, name: str) -> Allocation:
        """Allocation ``name``; a KeyError naming the known allocations when there is none."""
        if name not in self.allocations:
            known = ", ".join(sorted(self.allocations)) or "none"
            raise KeyError(f"the program has no allocation named {name!r}; known allocations: {known}")
        return self.allocations[name]

    def read(self, name: str, dram: np.ndarray | None = None) -> np.ndarray:
        """Allocation ``name`` as an array of its shape and dtype, from ``dram`` (e.g. a backend's final image) or,
        when ``dram`` is None, from the initial image. Returns a copy."""
        a = self.allocation(name)
        image = self.dram if dram is None else np.asarray(dram)
        if image.dtype != np.uint8 or image.ndim != 1:
            raise TypeError("dram must be a one-dimensional uint8 numpy array")
        if a.offset + a.nbytes > image.size:
            raise ValueError(f"allocation {name!r} ends at byte {a.offset + a.nbytes}, beyond the given "
                             f"{image.size}-byte DRAM image")
        raw = image[a.offset:a.offset + a.nbytes]
        bits = dtype_bits(a.dtype)
        if bits is not None:  # packed narrow elements (vta.packing), read as int8
            return unpack_elements(raw, bits, int(np.prod(a.shape, dtype=np.int64))).reshape(a.shape).copy()
        return np.frombuffer(raw.tobytes(), dtype=_le(a.dtype)).reshape(a.shape).astype(np.dtype(a.dtype))

    # ---- files ------------------------------------------------------------------------------------------------
    def with_data(self, values: Mapping[str, np.ndarray]) -> "Program":
        """A copy whose initial DRAM image holds ``values`` (allocation name -> array) in the named allocations,
        little-endian as :meth:`read` reads them; each value must have the allocation's size in bytes once converted
        to its dtype. Raises KeyError for an unknown allocation, ValueError for a size that differs."""
        dram = self.dram.copy()
        for name, value in values.items():
            a = self.allocation(name)
            raw = _raw_bytes(value, a.dtype, f"value for {name!r}")
            if len(raw) != a.nbytes:
                raise ValueError(f"value for {name!r} has {len(raw)} bytes; the allocation holds {a.nbytes}")
            dram[a.offset:a.offset + a.nbytes] = np.frombuffer(raw, dtype=np.uint8)
        return dataclasses.replace(self, dram=dram)

    ARRAY_NAMES: ClassVar[tuple[str, ...]] = ("meta", "insns", "dram")
    """The arrays of :meth:`to_arrays`: ``meta`` (a 0-d unicode array holding JSON: format, config, insn_offset,
    allocations), ``insns`` (``uint8 [len(insns), insn_bytes]``, the encoded stream) and ``dram`` (``uint8``)."""

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The program as plain numpy arrays (no Python objects), keyed by :attr:`ARRAY_NAMES`; the form
        :meth:`save` writes and compiled-model artefacts embed. :meth:`from_arrays` reads it back."""
        meta = {"format": FORMAT_VERSION, "config": self.cfg.to_dict(), "insn_offset": self.insn_offset,
                "allocations": [a.to_json() for a in self.allocations.values()]}
        return {"meta": np.array(json.dumps(meta)), "insns": self.encoded_insns(), "dram": self.dram}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], *, source: str = "the program") -> "Program":
        """The program held by ``arrays`` (as :meth:`to_arrays` returns); the config is validated again and the
        instructions decoded. ``source`` names the file in error messages."""
        missing = set(cls.ARRAY_NAMES) - set(arrays)
        if missing:
            raise ValueError(f"{source} is not a saved program: it lacks {', '.join(sorted(missing))}")
        meta = json.loads(str(arrays["meta"]))
        encoded = np.asarray(arrays["insns"], dtype=np.uint8)
        dram = np.asarray(arrays["dram"], dtype=np.uint8).copy()
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
            found = meta.get("format") if isinstance(meta, dict) else meta
            raise ValueError(f"{source} has program format {found!r}; this version reads format {FORMAT_VERSION}")
        try:
            cfg = VTAConfig.from_dict(meta["config"], source=source)
            insns = decode_stream(encoded, cfg)
            allocations = {a["name"]: Allocation.from_json(a) for a in meta["allocations"]}
            program = cls(cfg, insns, dram, int(meta["insn_offset"]), allocations)
        except (KeyError, TypeError, IndexError, AttributeError) as err:  # a damaged or crafted metadata record
            raise ValueError(f"{source} is not a valid saved program: its metadata is damaged "
                             f"({type(err).__name__}: {err})") from None
        if not np.array_equal(program.encoded_insns().reshape(-1), encoded.reshape(-1)):
            raise ValueError(f"{source} is inconsistent: the instruction stream in its DRAM image differs from its "
                             f"encoded instructions")
        return program

    def save(self, path: str | PathLike[str]) -> None:
        """Write the program to one ``.npz`` file (the arrays of :meth:`to_arrays`), atomically: a failure leaves
        any previous file at ``path`` intact."""
        from .fileio import atomic_path
        arrays: dict[str, Any] = self.to_arrays()  # Any: savez's stubs type ** as its keyword options
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)

    @classmethod
    def load(cls, path: str | PathLike[str]) -> "Program":
        """Read a file written by :meth:`save`; the config is validated again and the instructions decoded."""
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in cls.ARRAY_NAMES if name in data.files}
        except OSError:
            raise
        except Exception as err:  # damaged or crafted bytes: zipfile, zlib and numpy raise many kinds (BadZipFile,
            # zlib.error, EOFError, ValueError for pickled members, ...), none of them part of a contract
            raise ValueError(f"{path} is not a readable saved program (.npz): it is damaged, truncated or not "
                             f"written by Program.save ({type(err).__name__}: {err})") from None
        return cls.from_arrays(arrays, source=str(path))


def _replaced(insn: Insn, fields: dict[str, Any]) -> Insn:
    """A copy of ``insn`` with ``fields`` set (names already checked by the caller): the instruction classes are plain
    frozen dataclasses without validation, so their fields are copied directly (``dataclasses.replace`` runs
    ``__init__`` and cost a tenth of a compile)."""
    new = object.__new__(type(insn))
    new.__dict__.update(insn.__dict__)
    new.__dict__.update(fields)
    return new


def _with_flags(insn: Insn, flags: set[str]) -> Insn:
    """A copy of ``insn`` with the token flags ``flags`` (names of boolean fields) set."""
    for flag in flags:
        if flag not in insn.__dict__:
            raise AttributeError(f"{type(insn).__name__} has no token flag {flag!r}")
    return _replaced(insn, {flag: True for flag in flags})


def _flag_lsb(cfg: VTAConfig, flag: str) -> int:
    """The bit of token flag ``flag`` in an encoded instruction (the common fields sit at the same bits in every
    instruction, :data:`vta.isa.COMMON_FIELDS`)."""
    return layout(cfg).field(OP_FINISH, flag).lsb


def _align_up(value: int, align: int) -> int:
    return -(-value // align) * align


class ProgramBuilder:
    """Writes a :class:`Program`: DRAM allocations, micro-op kernels, instructions and dependency tokens.

    Every method that emits an instruction returns its index in the stream. Pops requested with :meth:`dep_pop` are
    folded into the next instruction emitted for the popping module; pushes requested with :meth:`dep_push` into the
    pushing module's last instruction (when it has no pending pops and the flag is still free). Otherwise a
    token-only LOAD (load: INP, compute: UOP) or STORE with ``x_size == 0`` carries the flags.
    """

    def __init__(self, cfg: VTAConfig) -> None:
        if not isinstance(cfg, VTAConfig):
            raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
        self.cfg = cfg
        self.insns: list[Insn] = []
        self._words: list[int] = []  # each of insns encoded (vta.isa.encode), kept in step with insns
        self.allocations: dict[str, Allocation] = {}
        self._image = bytearray()
        self._pending: dict[str, set[str]] = {m: set() for m in MODULES}
        self._last: dict[str, int | None] = {m: None for m in MODULES}
        self._finished = False
        self.default_align = max(max(cfg.elem_bytes(m) for m in MEM_NAMES), cfg.bus_bytes)

    # ---- DRAM -------------------------------------------------------------------------------------------------
    def alloc(self, name: str, data_or_shape: Any, dtype: Any = None, *, align: int | None = None) -> Allocation:
        """Reserve a DRAM region named ``name``.

        ``data_or_shape`` is either a shape (an int or a tuple of ints; the region is zero-filled, ``dtype`` defaults
        to int8) or array data (a numpy array or a list; converted to ``dtype`` when given). ``dtype="int4"`` stores
        int8-valued data in [-8, 7] packed two elements per byte (:mod:`vta.packing`; the allocation reads back as
        int8 values), the DRAM form of an int4 design's inp, wgt and out elements. ``align`` (bytes)
        defaults to :attr:`default_align`: the largest element size of any memory type and the bus width, so the
        region's element address is integral for every memory type.
        """
        self._check_open()
        if not isinstance(name, str) or not name:
            raise TypeError(f"an allocation name must be a non-empty string, not {name!r}")
        if name in self.allocations:
            raise ValueError(f"an allocation named {name!r} already exists; choose another name")
        if align is None:
            align = self.default_align
        if isinstance(align, bool) or not isinstance(align, int) or align < 1:
            raise ValueError(f"align must be a positive number of bytes, not {align!r}")
        if isinstance(data_or_shape, (int, np.integer)) and not isinstance(data_or_shape, bool):
            data_or_shape = (int(data_or_shape),)
        packed = isinstance(dtype, str) and dtype_bits(dtype) is not None
        if isinstance(data_or_shape, tuple):
            if not all(isinstance(s, (int, np.integer)) and s >= 0 for s in data_or_shape):
                raise ValueError(f"a shape must be a tuple of non-negative integers, not {data_or_shape!r}")
            data = np.zeros(tuple(int(s) for s in data_or_shape), dtype=np.dtype("int8" if packed else dtype or "int8"))
        else:
            data = np.asarray(data_or_shape, dtype=None if dtype is None or packed else np.dtype(dtype))
            if data.dtype.kind not in "iub":
                raise TypeError(f"allocation data must be integers (DRAM holds fixed-point values), not "
                                f"{data.dtype.name}")
        offset = _align_up(len(self._image), align)
        dtype_name = str(dtype) if packed else data.dtype.name
        raw = _raw_bytes(data, dtype_name, f"allocation {name!r}")
        self._image.extend(bytes(offset - len(self._image)))
        self._image.extend(raw)
        alloc = Allocation(name, offset, len(raw), tuple(data.shape), dtype_name)
        self.allocations[name] = alloc
        return alloc

    def elem_addr(self, alloc_or_name: Allocation | str, mem: int, byte_offset: int = 0) -> int:
        """DRAM address, in elements of memory type ``mem``, of byte ``byte_offset`` of an allocation."""
        alloc = self._alloc(alloc_or_name)
        eb = self.cfg.elem_bytes(mem)
        addr = alloc.offset + byte_offset
        if addr % eb:
            raise ValueError(f"byte {addr} (allocation {alloc.name!r} + {byte_offset}) is not a multiple of the "
                             f"{eb}-byte {MEM_NAMES[mem]} element; align the allocation or the offset to {eb} bytes")
        return addr // eb

    def uop_kernel(self, name: str, uops: Sequence[Uop]) -> Allocation:
        """Store micro-ops in DRAM as allocation ``name`` (one word of ``cfg.uop_bytes`` each); load them with
        :meth:`load_uops`."""
        uops = list(uops)
        for k, u in enumerate(uops):
            if not isinstance(u, Uop):
                raise TypeError(f"micro-op {k} of kernel {name!r} must be a Uop, not {type(u).__name__}")
        words = encode_uops([u.dst for u in uops], [u.src for u in uops], [u.wgt for u in uops], self.cfg)
        return self.alloc(name, words.reshape(len(uops)))

    def _alloc(self, alloc_or_name: Allocation | str) -> Allocation:
        if isinstance(alloc_or_name, Allocation):
            return alloc_or_name
        if alloc_or_name not in self.allocations:
            known = ", ".join(sorted(self.allocations)) or "none"
            raise KeyError(f"no allocation named {alloc_or_name!r}; known allocations: {known}")
        return self.allocations[alloc_or_name]

    # ---- instructions -----------------------------------------------------------------------------------------
    def load(self, mem: int, *, sram_base: int, dram_base: int, y_size: int = 1, x_size: int = 1,
             x_stride: int | None = None, y_pad_0: int = 0, y_pad_1: int = 0, x_pad_0: int = 0,
             x_pad_1: int = 0) -> int:
        """Emit a LOAD of ``mem``; addresses and sizes in elements, ``x_stride`` defaults to ``x_size``."""
        if mem not in (MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_ACC_8BIT):
            raise ValueError(f"LOAD takes memory type UOP (0), WGT (1), INP (2), ACC (3) or ACC_8BIT (5), not {mem!r}")
        return self.emit(Load(mem=mem, sram_base=sram_base, dram_base=dram_base, y_size=y_size, x_size=x_size,
                              x_stride=x_size if x_stride is None else x_stride, y_pad_0=y_pad_0, y_pad_1=y_pad_1,
                              x_pad_0=x_pad_0, x_pad_1=x_pad_1))

    def load_uops(self, kernel: Allocation, sram_base: int = 0) -> int:
        """Emit a LOAD of a micro-op kernel (from :meth:`uop_kernel`) into the uop buffer at ``sram_base``."""
        n = int(np.prod(kernel.shape))
        return self.load(MEM_UOP, sram_base=sram_base, dram_base=self.elem_addr(kernel, MEM_UOP), x_size=n)

    def store(self, *, sram_base: int, dram_base: int, y_size: int = 1, x_size: int = 1,
              x_stride: int | None = None) -> int:
        """Emit a STORE from the out buffer; addresses and sizes in out elements, ``x_stride`` defaults to x_size."""
        return self.emit(Store(mem=MEM_OUT, sram_base=sram_base, dram_base=dram_base, y_size=y_size, x_size=x_size,
                               x_stride=x_size if x_stride is None else x_stride))

    def gemm(self, *, uop_bgn: int, uop_end: int, iter_out: int = 1, iter_in: int = 1, dst_factor_out: int = 0,
             dst_factor_in: int = 0, src_factor_out: int = 0, src_factor_in: int = 0, wgt_factor_out: int = 0,
             wgt_factor_in: int = 0, reset: bool = False) -> int:
        """Emit a GEMM over micro-ops ``[uop_bgn, uop_end)`` (see :mod:`vta.isa` for the loop semantics)."""
        return self.emit(Gemm(reset=reset, uop_bgn=uop_bgn, uop_end=uop_end, iter_out=iter_out, iter_in=iter_in,
                              dst_factor_out=dst_factor_out, dst_factor_in=dst_factor_in,
                              src_factor_out=src_factor_out, src_factor_in=src_factor_in,
                              wgt_factor_out=wgt_factor_out, wgt_factor_in=wgt_factor_in))

    def alu(self, alu_opcode: int, *, uop_bgn: int, uop_end: int, iter_out: int = 1, iter_in: int = 1,
            dst_factor_out: int = 0, dst_factor_in: int = 0, src_factor_out: int = 0, src_factor_in: int = 0,
            use_imm: bool = False, imm: int = 0, reset: bool = False) -> int:
        """Emit an ALU op (``ALU_*``) over micro-ops ``[uop_bgn, uop_end)``; ``imm`` is 16-bit signed."""
        return self.emit(Alu(alu_opcode=alu_opcode, reset=reset, uop_bgn=uop_bgn, uop_end=uop_end,
                             iter_out=iter_out, iter_in=iter_in, dst_factor_out=dst_factor_out,
                             dst_factor_in=dst_factor_in, src_factor_out=src_factor_out, src_factor_in=src_factor_in,
                             use_imm=use_imm, imm=imm))

    def emit(self, insn: Insn) -> int:
        """Append a raw instruction (pending pops of its module are folded in); returns its index.

        Raises :class:`~vta.isa.EncodeError` (naming the instruction index) when a value does not fit its field.
        """
        self._check_open()
        if not isinstance(insn, _INSN_TYPES):
            raise TypeError(f"expected a Load, Store, Gemm, Alu or Finish instruction, not {type(insn).__name__}")
        module = module_of(insn)
        pending = self._pending[module]
        if pending:
            insn = _with_flags(insn, pending)
        index = len(self.insns)
        try:
            word = encode(insn, self.cfg)
        except EncodeError as err:
            raise EncodeError(f"instruction {index}: {err}") from None
        pending.clear()
        self.insns.append(insn)
        self._words.append(word)
        self._last[module] = index
        return index

    def patch(self, index: int, **fields: int) -> None:
        """Change fields (addresses, sizes) of instruction ``index``, already emitted, keeping its dependency flags;
        for an instruction whose operands are known only later (a LOAD UOP of micro-op kernels placed after it).
        Raises :class:`~vta.isa.EncodeError` (naming the index) when a value does not fit its field."""
        self._check_open()
        if not 0 <= index < len(self.insns):
            raise IndexError(f"instruction {index} does not exist: {len(self.insns)} emitted so far")
        old = self.insns[index]
        for name in fields:
            if name not in old.__dict__ or name in ("pop_prev", "pop_next", "push_prev", "push_next"):
                raise AttributeError(f"{type(old).__name__} has no field {name!r} to patch")
        new = _replaced(old, fields)
        try:
            word = encode(new, self.cfg)
        except EncodeError as err:
            raise EncodeError(f"instruction {index}: {err}") from None
        self.insns[index] = new
        self._words[index] = word

    # ---- dependency tokens ------------------------------------------------------------------------------------
    @staticmethod
    def _pair(src: str, dst: str) -> tuple[str, str]:
        for name in (src, dst):
            if name not in MODULES:
                raise ValueError(f"module must be one of 'load', 'compute', 'store', not {name!r}")
        if (src, dst) not in _PAIRS:
            raise ValueError(f"there is no token queue from {src!r} to {dst!r}; queues exist only between load and "
                             f"compute and between compute and store (both directions)")
        return _PAIRS[(src, dst)]

    def dep_push(self, src: str, dst: str) -> None:
        """Make module ``src`` push a token to ``dst`` after everything emitted for ``src`` so far (VTADepPush)."""
        self._check_open()
        push_flag, _ = self._pair(src, dst)
        last = self._last[src]
        if not self._pending[src] and last is not None and not getattr(self.insns[last], push_flag):
            self.insns[last] = _with_flags(self.insns[last], {push_flag})
            self._words[last] |= 1 << _flag_lsb(self.cfg, push_flag)
            return
        self._noop(src, {push_flag})

    def dep_pop(self, src: str, dst: str) -> None:
        """Make the next instruction emitted for module ``dst`` first pop a token pushed by ``src`` (VTADepPop)."""
        self._check_open()
        _, pop_flag = self._pair(src, dst)
        if pop_flag in self._pending[dst]:
            self._noop(dst, set())
        self._pending[dst].add(pop_flag)

    def drain_alu(self) -> int | None:
        """With the ``concurrent_alu`` knob: emit a token-only LOAD UOP, before which the compute module waits for
        its ALU engine to finish every ALU instruction so far (docs/hardware.md), so that what follows may use any
        acc/out bank; returns its index. Without the knob nothing is emitted (None)."""
        self._check_open()
        return self._noop("compute", set()) if self.cfg.concurrent_alu else None

    def _noop(self, module: str, flags: set[str]) -> int:
        """Emit a token-only instruction for ``module`` carrying its pending pops and ``flags``."""
        kw = {flag: True for flag in flags}
        if module == "store":
            return self.emit(Store(y_size=0, x_size=0, x_stride=0, **kw))
        mem = MEM_INP if module == "load" else MEM_UOP
        return self.emit(Load(mem=mem, y_size=0, x_size=0, x_stride=0, **kw))

    # ---- finish -----------------------------------------------------------------------------------------------
    def finish(self) -> Program:
        """Append FINISH (waiting on the store module so the last STORE is complete), encode the stream into DRAM
        after the allocations and return the validated :class:`Program`. The builder cannot be used afterwards."""
        self._check_open()
        for module in ("load", "store"):
            if self._pending[module]:
                self._noop(module, set())
        self.dep_push("store", "compute")
        self.dep_pop("store", "compute")
        self.emit(Finish())
        self._finished = True
        nbytes = layout(self.cfg).insn_bytes
        if len(self._words) == len(self.insns):  # each instruction was encoded (and checked) as it was emitted
            encoded = np.frombuffer(b"".join(w.to_bytes(nbytes, "little") for w in self._words),
                                    dtype=np.uint8).reshape(len(self._words), nbytes)
        else:
            encoded = encode_stream(self.insns, self.cfg)
        offset = _align_up(len(self._image), max(self.default_align, encoded.shape[1]))
        # The image is a whole number of bus beats: the core reads and writes whole beats.
        dram = np.zeros(_align_up(offset + encoded.size, self.cfg.bus_bytes), dtype=np.uint8)
        dram[:len(self._image)] = np.frombuffer(bytes(self._image), dtype=np.uint8)
        dram[offset:offset + encoded.size] = encoded.reshape(-1)
        return Program(self.cfg, list(self.insns), dram, offset, dict(self.allocations))

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("finish() was already called on this builder; start a new ProgramBuilder")


class SlotRing:
    """Double buffering between two modules, as VTA's runtime does it with virtual threads: a ``producer`` (e.g. load)
    fills buffer parts that a ``consumer`` (e.g. compute) reads, ``slots`` parts used in turn, ordered by dependency
    tokens. The one definition of that protocol; for use ``k`` (0, 1, ...) of the ring:

    * :meth:`claim` before the producer writes part ``k % slots``: from the ``slots``-th use on, the producer first
      pops the token the consumer pushed when it finished with the part (write after read);
    * :meth:`handoff` after the producer's writes: the producer pushes a token and the consumer pops it before it
      reads (read after write); a use may hand off in several pieces;
    * :meth:`release` after the consumer's reads: the consumer pushes the token that use ``k + slots`` pops, unless
      ``total`` (the uses there will be) says no such use comes -- nobody would pop it;
    * :meth:`drain` at the end when ``total`` was not known: the producer pops the tokens nobody popped, so the
      queues end empty.

    ``slots == 1`` is the single-threaded protocol: every use waits for the previous one.
    """

    def __init__(self, builder: "ProgramBuilder", producer: str, consumer: str, slots: int, *,
                 total: int | None = None) -> None:
        if slots < 1:
            raise ValueError(f"a slot ring needs at least one slot, not {slots}")
        self.builder, self.producer, self.consumer = builder, producer, consumer
        self.slots, self.total = slots, total
        self.uses = 0
        """Uses claimed so far; the current use is ``uses - 1``."""

    def claim(self) -> int:
        """Start the next use; returns its part (``k % slots``)."""
        k = self.uses
        if k >= self.slots:
            self.builder.dep_pop(self.consumer, self.producer)
        self.uses += 1
        return k % self.slots

    def handoff(self) -> None:
        """The producer's writes of the current use (or a piece of them) are done: the consumer may read them."""
        self.builder.dep_push(self.producer, self.consumer)
        self.builder.dep_pop(self.producer, self.consumer)

    def release(self) -> None:
        """The consumer is done with the current use's part: the use ``slots`` later may overwrite it."""
        if self.total is None or self.uses - 1 + self.slots < self.total:
            self.builder.dep_push(self.consumer, self.producer)

    def drain(self) -> None:
        """Pop the release tokens no later use popped (only needed when ``total`` was not given)."""
        for _ in range(min(self.uses, self.slots) if self.total is None else 0):
            self.builder.dep_pop(self.consumer, self.producer)

