"""The accelerator's tensor intrinsics, declared once as data derived from a :class:`~vta.config.VTAConfig`.

Everything the lowering needs to know about the hardware lives here, so that no other compiler file reads a config
field directly or writes a magic number:

* :class:`GemmIntrinsic`: one GEMM micro-op computes ``acc[BATCH, BLOCK_OUT] += inp[BATCH, BLOCK_IN] @
  wgt[BLOCK_OUT, BLOCK_IN].T`` (int8 x int8 -> int32, wrapping), i.e. ``BATCH * BLOCK_IN * BLOCK_OUT`` MACs.
* :class:`AluIntrinsic`: one ALU micro-op applies MIN/MAX/ADD/SHR/MUL to one acc entry (``BATCH x BLOCK_OUT``
  int32) with an immediate (16-bit signed) or another acc entry; with the ``fused_requant`` knob also REQ (the
  requantization in one micro-op, see :mod:`vta.isa`).
* :class:`DmaShape`: per memory type, the element (one SRAM entry) shape and dtype, its bytes in DRAM, the buffer
  depth in elements and the largest padding a LOAD can insert (4-bit pad fields).
* :class:`Intrinsics`: all of the above for one config, built by :func:`intrinsics` (cached per config).

Example::

    intr = intrinsics(VTAConfig())
    intr.gemm.macs                 # 256
    intr.dma["inp"].depth          # 2048 entries of 1x16 int8
    intr.alu["SHR"].opcode         # vta.isa.ALU_SHR
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from vta.config import MEM_ACC, MEM_ACC_8BIT, MEM_INP, MEM_OUT, MEM_UOP, MEM_WGT, VTAConfig
from vta.isa import ALU_ADD, ALU_MUL, IMM_BITS, LOOP_BITS, alu_opcodes, layout

__all__ = ["GemmIntrinsic", "AluIntrinsic", "DmaShape", "Intrinsics", "intrinsics", "MAX_LOAD_PAD"]

MAX_LOAD_PAD = 15
"""Largest padding (elements) one LOAD can insert on each side: the pad fields are 4 bits wide."""


@dataclass(frozen=True)
class GemmIntrinsic:
    """``acc[batch, block_out] (+)= inp[batch, block_in] @ wgt[block_out, block_in].T``, int8 x int8 -> int32.

    Shapes are in elements: ``inp_shape = (batch, block_in)``, ``wgt_shape = (block_out, block_in)``,
    ``acc_shape = (batch, block_out)``. ``macs`` is the multiply-accumulates of one micro-op.
    """

    batch: int
    block_in: int
    block_out: int
    inp_dtype: str = "int8"
    wgt_dtype: str = "int8"
    acc_dtype: str = "int32"

    @property
    def inp_shape(self) -> tuple[int, int]:
        return (self.batch, self.block_in)

    @property
    def wgt_shape(self) -> tuple[int, int]:
        return (self.block_out, self.block_in)

    @property
    def acc_shape(self) -> tuple[int, int]:
        return (self.batch, self.block_out)

    @property
    def macs(self) -> int:
        """Multiply-accumulates per micro-op."""
        return self.batch * self.block_in * self.block_out


@dataclass(frozen=True)
class AluIntrinsic:
    """One tensor-ALU operation on an acc entry of shape ``shape`` (int32): ``acc = op(acc, imm or acc[src])``.

    ``imm_min``/``imm_max`` bound the immediate (16-bit signed). ``wraps`` is True for the 32-bit wrapping ops.
    """

    name: str
    opcode: int
    shape: tuple[int, int]
    imm_min: int
    imm_max: int
    wraps: bool

    def imm_fits(self, value: int) -> bool:
        """True when ``value`` can be this op's immediate."""
        return self.imm_min <= value <= self.imm_max


@dataclass(frozen=True)
class DmaShape:
    """What one LOAD/STORE element of memory type ``name`` is.

    ``elem_shape``/``dtype``: the element as an array (``uop`` elements are single micro-op words). ``elem_bytes``:
    bytes of one element in DRAM (``acc8`` elements are int8 in DRAM, int32 once in the acc buffer). ``depth``: the
    on-chip buffer's entries. ``max_pad``: largest LOAD padding per side (0 for memory types that cannot be padded).
    """

    name: str
    mem: int
    elem_shape: tuple[int, ...]
    dtype: str
    elem_bytes: int
    depth: int
    max_pad: int


@dataclass(frozen=True)
class Intrinsics:
    """The tensor intrinsics of one config (see the module docstring)."""

    cfg: VTAConfig
    gemm: GemmIntrinsic
    alu: dict[str, AluIntrinsic]
    dma: dict[str, DmaShape]
    uop_depth: int
    loop_max: int
    insn_bytes: int

    @property
    def batch(self) -> int:
        return self.gemm.batch

    @property
    def block_in(self) -> int:
        return self.gemm.block_in

    @property
    def block_out(self) -> int:
        return self.gemm.block_out

    def factor_max(self, mem: str) -> int:
        """Largest loop factor (elements) an instruction can hold for an index into buffer ``mem``."""
        return self.dma[mem].depth - 1

    def capacity(self, mem: str) -> int:
        """Entries of the on-chip buffer behind ``mem`` (``inp``, ``wgt``, ``acc``, ``out`` or ``uop``)."""
        if mem not in self.dma:
            raise ValueError(f"memory type must be one of {', '.join(self.dma)}, not {mem!r}")
        return self.dma[mem].depth


def intrinsics(cfg: VTAConfig) -> Intrinsics:
    """The intrinsics of ``cfg`` (cached: one object per config)."""
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"intrinsics() needs a VTAConfig, not {type(cfg).__name__}")
    return _intrinsics(cfg)


@lru_cache(maxsize=None)
def _intrinsics(cfg: VTAConfig) -> Intrinsics:
    b, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
    gemm = GemmIntrinsic(batch=b, block_in=bi, block_out=bo)
    imm_lo, imm_hi = -(1 << (IMM_BITS - 1)), (1 << (IMM_BITS - 1)) - 1
    alu = {name: AluIntrinsic(name=name, opcode=code, shape=(b, bo), imm_min=imm_lo, imm_max=imm_hi,
                              wraps=code in (ALU_ADD, ALU_MUL))
           for code, name in alu_opcodes(cfg).items()}
    dma = {
        "uop": DmaShape("uop", MEM_UOP, (1,), "uint32" if cfg.uop_bits == 32 else "uint64", cfg.uop_bytes,
                        cfg.uop_depth, 0),
        "wgt": DmaShape("wgt", MEM_WGT, (bo, bi), "int8", cfg.wgt_elem_bytes, cfg.wgt_depth, MAX_LOAD_PAD),
        "inp": DmaShape("inp", MEM_INP, (b, bi), "int8", cfg.inp_elem_bytes, cfg.inp_depth, MAX_LOAD_PAD),
        "acc": DmaShape("acc", MEM_ACC, (b, bo), "int32", cfg.acc_elem_bytes, cfg.acc_depth, MAX_LOAD_PAD),
        "acc8": DmaShape("acc8", MEM_ACC_8BIT, (b, bo), "int8", cfg.out_elem_bytes, cfg.acc_depth, MAX_LOAD_PAD),
        "out": DmaShape("out", MEM_OUT, (b, bo), "int8", cfg.out_elem_bytes, cfg.out_depth, 0),
    }
    return Intrinsics(cfg=cfg, gemm=gemm, alu=alu, dma=dma, uop_depth=cfg.uop_depth,
                      loop_max=(1 << LOOP_BITS) - 1, insn_bytes=layout(cfg).insn_bytes)
