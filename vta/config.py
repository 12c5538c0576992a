"""The one typed, frozen description of an accelerator design.

A :class:`VTAConfig` carries VTA's own keys (``LOG_INP_WIDTH`` ... ``LOG_ACC_BUFF_SIZE``, as in VTA's
``vta_config.json``) plus what a cycle-level co-simulation needs (memory bus width, DRAM latency, queue depths, clock).
Everything else (buffer depths, element sizes, ISA field widths, the canonical name) is derived as properties.

The config is passed explicitly to the hardware generator, the compiler and the simulators; nothing reads it from
globals or the environment.

Example::

    cfg = VTAConfig()                       # VTA's defaults
    cfg = load_config("vta_config.json")    # VTA's own JSON file, unchanged
    cfg = load_config("design.toml")        # or TOML with the same keys
    cfg.name                                 # '1x16_i8w8a32_15_15_18_17'
"""
from __future__ import annotations

import dataclasses
import reprlib
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

__all__ = ["VTAConfig", "ConfigError", "load_config", "KNOBS", "CLOCK_MHZ_RANGE", "ALU_QUEUE_DEPTH", "MAX_BURST",
           "MAX_OUTSTANDING", "MEM_UOP", "MEM_WGT", "MEM_INP", "MEM_ACC", "MEM_OUT", "MEM_ACC_8BIT", "MEM_NAMES"]

# Memory types, as encoded in LOAD/STORE instructions.
MEM_UOP, MEM_WGT, MEM_INP, MEM_ACC, MEM_OUT, MEM_ACC_8BIT = 0, 1, 2, 3, 4, 5
MEM_NAMES = {MEM_UOP: "uop", MEM_WGT: "wgt", MEM_INP: "inp", MEM_ACC: "acc", MEM_OUT: "out",
             MEM_ACC_8BIT: "acc8"}

# Widths of instruction fields that do not depend on buffer depths (bits); see vta.isa.
_LOOP_BITS = 14
_SRAM_BASE_BITS = 16
_UOP_BITS = 32

# The widest value the hardware generator can build: Amaranth's netlist numbers the bits of a cell's output with 16
# bits (``amaranth.hdl._nir.Net.from_cell`` asserts ``bit in range(1 << 16)``), so no signal, SRAM word or mux may be
# wider than 65536 bits. The generator fails on that assertion only after minutes and gigabytes, so the config
# checks it first (see :func:`_generator_problems`).
_MAX_NETLIST_BITS = 1 << 16


class ConfigError(ValueError):
    """A configuration is invalid. ``problems`` lists every problem found, one sentence each."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid VTA configuration{where} ({len(self.problems)} problem"
                         f"{'s' if len(self.problems) != 1 else ''}):\n{lines}")


# Key in VTA's JSON (upper case) -> field name; ranges are inclusive.
_VTA_KEYS = {
    "LOG_INP_WIDTH": "log_inp_width", "LOG_WGT_WIDTH": "log_wgt_width", "LOG_ACC_WIDTH": "log_acc_width",
    "LOG_BATCH": "log_batch", "LOG_BLOCK": "log_block", "LOG_UOP_BUFF_SIZE": "log_uop_buff_size",
    "LOG_INP_BUFF_SIZE": "log_inp_buff_size", "LOG_WGT_BUFF_SIZE": "log_wgt_buff_size",
    "LOG_ACC_BUFF_SIZE": "log_acc_buff_size",
    "BUS_BYTES": "bus_bytes", "DRAM_LATENCY": "dram_latency", "CMD_QUEUE_DEPTH": "cmd_queue_depth",
    "TOKEN_QUEUE_DEPTH": "token_queue_depth", "CLOCK_MHZ": "clock_mhz",
    "FUSED_REQUANT": "fused_requant", "CONCURRENT_ALU": "concurrent_alu", "GEMM_OVERWRITE": "gemm_overwrite",
    "ALU_PIPELINE": "alu_pipeline", "LANE_REDUCE": "lane_reduce",
}
# Codesign knobs: boolean fields beyond VTA's design, off by default. Off, a knob leaves the design VTA's (same ISA,
# RTL and timing); ``to_dict`` and ``name`` mention a knob only when it is on, so default configs are unchanged.
KNOBS = {"fused_requant": "rq", "concurrent_alu": "ca", "gemm_overwrite": "ow", "alu_pipeline": "ap",
         "lane_reduce": "lr"}
"""knob field -> the tag ``VTAConfig.name`` appends when the knob is on."""
ALU_QUEUE_DEPTH = 4
"""``concurrent_alu``: ALU instructions the compute module's ALU engine holds in its queue besides the one it runs
(the RTL's queue, ``hw/concurrent_alu.py``, and the cycle model's, ``vta/cost.py``)."""
MAX_BURST = 16
"""Beats per DRAM read request at most: a LOAD's rows are requested in bursts of up to this many beats (the RTL's
DMA reader, ``hw/dma.py``, and the cycle model, ``vta/cost.py``)."""
MAX_OUTSTANDING = 8
"""Read requests the memory arbiter tracks at once (its tag FIFO's entries; a tag is freed when the request's last beat
is taken): the RTL's arbiter, ``hw/arbiter.py``, and the cycle model, ``vta/cost.py``."""
# Keys that VTA's own vta_config.json carries but that do not describe the accelerator we generate; accepted and
# ignored so that VTA's files load unchanged. The ones this design derives from its own fields must agree with them
# (``_DERIVED_VTA_KEYS``): a file whose LOG_BLOCK_IN says 32 must not load as a 16-wide core.
_IGNORED_VTA_KEYS = {"TARGET", "HW_VER", "LOG_BLOCK_IN", "LOG_BLOCK_OUT", "LOG_OUT_WIDTH", "LOG_OUT_BUFF_SIZE",
                     "ACC_DEP_DISTANCE"}

CLOCK_MHZ_RANGE = (1.0, 10000.0)
"""The clocks a design may give (``CLOCK_MHZ``) and ``--clock-mhz`` may ask for, MHz, inclusive."""
_RANGES: dict[str, tuple[float, float]] = {
    "log_inp_width": (2, 3), "log_wgt_width": (2, 3), "log_acc_width": (5, 5),
    "log_batch": (0, 4), "log_block": (2, 6),
    "log_uop_buff_size": (6, 20), "log_inp_buff_size": (6, 22), "log_wgt_buff_size": (6, 24),
    "log_acc_buff_size": (6, 24),
    "bus_bytes": (1, 128), "dram_latency": (1, 1024), "cmd_queue_depth": (2, 4096),
    "token_queue_depth": (2, 4096), "clock_mhz": CLOCK_MHZ_RANGE, "fused_requant": (0, 1),
    "concurrent_alu": (0, 1), "gemm_overwrite": (0, 1), "alu_pipeline": (0, 1),
    "lane_reduce": (0, 1),
}
_WHY = {
    "log_inp_width": "int4 (2) and int8 (3) inputs are supported",
    "log_wgt_width": "int4 (2) and int8 (3) weights are supported",
    "log_acc_width": "only int32 accumulators (5) are supported",
}


@dataclass(frozen=True)
class VTAConfig:
    """One accelerator design. All fields are keyword-only; sizes are log2 of bytes unless stated.

    VTA's keys:
        log_inp_width, log_wgt_width, log_acc_width: log2 of element widths in bits (2 = int4, 3 = int8,
            5 = int32). Inputs and weights may be int4 or int8 (the output buffer has the input width); int4
            elements are packed two per byte in DRAM and in SRAM entries (``vta.packing``; docs/precision.md).
        log_batch: log2 of BATCH, the rows of the GEMM core's input tile.
        log_block: log2 of BLOCK_IN = BLOCK_OUT, the GEMM core's reduction and output width.
        log_uop_buff_size, log_inp_buff_size, log_wgt_buff_size, log_acc_buff_size: log2 of SRAM sizes in bytes.
    Co-simulation:
        bus_bytes: memory bus data width in bytes per cycle (power of two; 8 = VTA's 64-bit AXI).
        dram_latency: cycles from a read request to its first data beat.
        cmd_queue_depth: entries in each module's instruction (command) queue.
        token_queue_depth: dependency tokens each of the four token queues can hold.
        clock_mhz: clock frequency, used only to turn cycles into time in reports.
    Codesign knobs (booleans, off by default; ``KNOBS``):
        fused_requant: the tensor ALU gains REQ (``vta.isa.ALU_REQ``), one micro-op computing
            ``clip((acc * M) >> S, lo, hi)`` with per-lane M and S from an acc operand and lo/hi from the immediate;
            the compiler requantizes with one ALU pass instead of MUL, SHR, MAX, MIN.
        concurrent_alu: ALU instructions run on a second micro-op engine of the compute module, concurrently with
            the GEMMs and LOAD ACCs after them; the acc and out buffers become two banks (top index bit), and a
            program must order any access to a bank the running ALU instructions touch (fsim's race check, see
            docs/hardware.md).
        gemm_overwrite: a GEMM with its reset flag set writes its products, ``acc[d] = inp[s] @ wgt[w].T``, instead
            of zeros (an ALU reset still writes zeros); the compiler starts each output tile with it instead of a
            reset GEMM before the accumulating ones.
        alu_pipeline: the tensor ALU's micro-op takes two pipeline stages instead of one (its operands are registered
            after the accumulator read, the operation and the write-back follow a cycle later): a shorter critical
            path for one more cycle per ALU instruction; a micro-op reading the entry the one before it writes gets
            the result forwarded, so the ISA and every result are unchanged. Not built with ``concurrent_alu``.
        lane_reduce: the tensor ALU gains RSUM and RMAX (``vta.isa.ALU_RSUM``, ``vta.isa.ALU_RMAX``), one micro-op
            each: every lane of a batch row becomes the sum (wrapping) or the signed maximum over the row's BLOCK_OUT
            lanes of ``dst + src`` or ``max(dst, src)``; an adder tree and a max tree across the ALU's lanes. The
            row reductions of LayerNorm and Softmax take one pass instead of a GEMM with ones and DRAM round trips.
    """

    log_inp_width: int = 3
    log_wgt_width: int = 3
    log_acc_width: int = 5
    log_batch: int = 0
    log_block: int = 4
    log_uop_buff_size: int = 15
    log_inp_buff_size: int = 15
    log_wgt_buff_size: int = 18
    log_acc_buff_size: int = 17
    bus_bytes: int = 8
    dram_latency: int = 16
    cmd_queue_depth: int = 64
    token_queue_depth: int = 64
    clock_mhz: float = 100.0
    fused_requant: bool = False
    concurrent_alu: bool = False
    gemm_overwrite: bool = False
    alu_pipeline: bool = False
    lane_reduce: bool = False

    def __post_init__(self) -> None:
        problems = _check(self)
        if problems:
            raise ConfigError(problems)

    def __hash__(self) -> int:
        """The hash of the fields, computed once: configs key many caches (layouts, intrinsics, plans) on hot paths.
        Derived values (``uop_bits``, element sizes) are likewise computed once per config (``cached_property``)."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            self.__dict__["_hash"] = h
        return int(h)

    # ---- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> "VTAConfig":
        """Build from a mapping with VTA's upper-case keys or our lower-case field names.

        Unknown keys, bad types, out-of-range values and VTA keys this design derives but that disagree with it
        (``_IGNORED_VTA_KEYS``) are all collected and raised at once as :class:`ConfigError`.
        """
        problems: list[str] = []
        kwargs: dict[str, Any] = {}
        names = {f.name for f in fields(cls)}
        for key, value in data.items():
            if key in _IGNORED_VTA_KEYS:
                continue
            name = _VTA_KEYS.get(key, key if key in names else None)
            if name is None:
                from .suggest import did_you_mean
                hint = did_you_mean(key, _VTA_KEYS if key.isupper() else sorted(names))
                problems.append(f"unknown key {key!r}{hint}; known keys are {', '.join(sorted(_VTA_KEYS))}")
                continue
            if name in kwargs:
                problems.append(f"key {key!r} is given twice (as upper and lower case)")
                continue
            kwargs[name] = value
        problems.extend(_ignored_key_problems(data, kwargs))
        try:
            cfg = cls(**kwargs)
        except ConfigError as err:
            problems.extend(err.problems)
        if problems:
            raise ConfigError(problems, source)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """VTA-style upper-case keys -> values; ``VTAConfig.from_dict(cfg.to_dict()) == cfg``. Knobs appear only when
        on, so a design without knobs has exactly VTA's keys."""
        inverse = {v: k for k, v in _VTA_KEYS.items()}
        return {inverse[f.name]: getattr(self, f.name) for f in fields(self)
                if f.name not in KNOBS or getattr(self, f.name)}

    def replace(self, **changes: Any) -> "VTAConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ---- derived values -----------------------------------------------------------------------------------------
    @property
    def batch(self) -> int:
        """Rows of the input tile (BATCH)."""
        return 1 << self.log_batch

    @property
    def block_in(self) -> int:
        """Reduction width of the GEMM core (BLOCK_IN), elements."""
        return 1 << self.log_block

    @property
    def block_out(self) -> int:
        """Output width of the GEMM core (BLOCK_OUT), elements."""
        return 1 << self.log_block

    @property
    def inp_width(self) -> int:
        """Input element width, bits."""
        return 1 << self.log_inp_width

    @property
    def wgt_width(self) -> int:
        """Weight element width, bits."""
        return 1 << self.log_wgt_width

    @property
    def acc_width(self) -> int:
        """Accumulator element width, bits."""
        return 1 << self.log_acc_width

    @property
    def out_width(self) -> int:
        """Output element width, bits (equal to the input width, as in VTA)."""
        return self.inp_width

    @property
    def log_out_buff_size(self) -> int:
        """log2 of the output buffer size in bytes: one out entry per acc entry."""
        return self.log_acc_buff_size + self.log_inp_width - self.log_acc_width

    @property
    def macs_per_cycle(self) -> int:
        """Multiply-accumulates the GEMM core performs per micro-op: BATCH x BLOCK_IN x BLOCK_OUT."""
        return self.batch * self.block_in * self.block_out

    # Element = one SRAM entry: inp is BATCH x BLOCK_IN, wgt BLOCK_OUT x BLOCK_IN, acc/out BATCH x BLOCK_OUT.
    @cached_property
    def uop_index_bits(self) -> tuple[int, int, int]:
        """Widths in bits of a micro-op's (dst, src, wgt) index fields: acc index, inp-or-acc index, wgt index."""
        inp = (1 << self.log_inp_buff_size) // self.inp_elem_bytes
        acc = (1 << self.log_acc_buff_size) // self.acc_elem_bytes
        wgt = (1 << self.log_wgt_buff_size) // self.wgt_elem_bytes
        return _log2(acc), max(_log2(inp), _log2(acc)), _log2(wgt)

    @cached_property
    def uop_bits(self) -> int:
        """Bits per micro-op: 32 as in VTA when the three indices fit, else 64."""
        return _UOP_BITS if sum(self.uop_index_bits) <= _UOP_BITS else 2 * _UOP_BITS

    @cached_property
    def uop_bytes(self) -> int:
        """Bytes per micro-op."""
        return self.uop_bits // 8

    @cached_property
    def inp_elem_bytes(self) -> int:
        """Bytes per inp buffer entry (BATCH x BLOCK_IN elements of ``inp_width`` bits, packed)."""
        return self.batch * self.block_in * self.inp_width // 8

    @cached_property
    def wgt_elem_bytes(self) -> int:
        """Bytes per wgt buffer entry (BLOCK_OUT x BLOCK_IN elements of ``wgt_width`` bits, packed)."""
        return self.block_out * self.block_in * self.wgt_width // 8

    @cached_property
    def acc_elem_bytes(self) -> int:
        """Bytes per acc buffer entry (BATCH x BLOCK_OUT int32)."""
        return self.batch * self.block_out * self.acc_width // 8

    @cached_property
    def out_elem_bytes(self) -> int:
        """Bytes per out buffer entry (BATCH x BLOCK_OUT elements of ``out_width`` bits, packed)."""
        return self.batch * self.block_out * self.out_width // 8

    def elem_bytes(self, mem: int) -> int:
        """Bytes of one element of memory type ``mem`` (``MEM_*``) as laid out in DRAM.

        ``MEM_ACC_8BIT`` elements are BATCH x BLOCK_OUT out-width values in DRAM (int8, or int4 packed at
        ``inp_width`` 4), sign-extended into the acc buffer.
        """
        table = self._elem_table
        if mem not in table:
            raise ValueError(f"memory type must be one of {sorted(table)}, not {mem!r}")
        return table[mem]

    @cached_property
    def _elem_table(self) -> dict[int, int]:
        """Memory type -> bytes per DRAM element (:meth:`elem_bytes`), computed once per config."""
        return {MEM_UOP: self.uop_bytes, MEM_WGT: self.wgt_elem_bytes, MEM_INP: self.inp_elem_bytes,
                MEM_ACC: self.acc_elem_bytes, MEM_OUT: self.out_elem_bytes, MEM_ACC_8BIT: self.out_elem_bytes}

    @property
    def uop_depth(self) -> int:
        """Micro-op buffer entries."""
        return (1 << self.log_uop_buff_size) // self.uop_bytes

    @property
    def inp_depth(self) -> int:
        """Input buffer entries."""
        return (1 << self.log_inp_buff_size) // self.inp_elem_bytes

    @property
    def wgt_depth(self) -> int:
        """Weight buffer entries."""
        return (1 << self.log_wgt_buff_size) // self.wgt_elem_bytes

    @property
    def acc_depth(self) -> int:
        """Accumulator buffer entries (and output buffer entries: one int8 copy per acc entry)."""
        return (1 << self.log_acc_buff_size) // self.acc_elem_bytes

    @property
    def out_depth(self) -> int:
        """Output buffer entries (equal to ``acc_depth``)."""
        return self.acc_depth

    def depth(self, mem: int) -> int:
        """Entries of the on-chip buffer that memory type ``mem`` addresses."""
        table = {MEM_UOP: self.uop_depth, MEM_WGT: self.wgt_depth, MEM_INP: self.inp_depth,
                 MEM_ACC: self.acc_depth, MEM_OUT: self.out_depth, MEM_ACC_8BIT: self.acc_depth}
        if mem not in table:
            raise ValueError(f"memory type must be one of {sorted(table)}, not {mem!r}")
        return table[mem]

    # Index field widths (bits) used by the ISA.
    @property
    def log_uop_depth(self) -> int:
        return _log2(self.uop_depth)

    @property
    def log_inp_depth(self) -> int:
        return _log2(self.inp_depth)

    @property
    def log_wgt_depth(self) -> int:
        return _log2(self.wgt_depth)

    @property
    def log_acc_depth(self) -> int:
        return _log2(self.acc_depth)

    @property
    def name(self) -> str:
        """Canonical name, as VTA's: ``{BATCH}x{BLOCK}_i{inp}w{wgt}a{acc}_{uop}_{inp}_{wgt}_{acc}``.

        Co-simulation fields are appended only where they differ from the defaults, so VTA's names are unchanged:
        e.g. ``1x16_i8w8a32_15_15_18_17`` or ``1x16_i8w8a32_15_15_18_17_bus16_lat32``.
        """
        base = (f"{self.batch}x{self.block_in}_i{self.inp_width}w{self.wgt_width}a{self.acc_width}_"
                f"{self.log_uop_buff_size}_{self.log_inp_buff_size}_{self.log_wgt_buff_size}_{self.log_acc_buff_size}")
        default = VTAConfig.__dataclass_fields__
        tags = [("bus", "bus_bytes"), ("lat", "dram_latency"), ("cq", "cmd_queue_depth"),
                ("tq", "token_queue_depth")]
        for tag, field in tags:
            if getattr(self, field) != default[field].default:
                base += f"_{tag}{getattr(self, field)}"
        for field, tag in KNOBS.items():
            if getattr(self, field):
                base += f"_{tag}"
        return base

    def __str__(self) -> str:
        return self.name


def _ignored_key_problems(data: Mapping[str, Any], kwargs: Mapping[str, Any]) -> list[str]:
    """A sentence for each ignored VTA key of ``data`` that disagrees with the design ``kwargs`` describes (field
    name -> value; a field left out takes its default): LOG_BLOCK_IN and LOG_BLOCK_OUT must equal LOG_BLOCK,
    LOG_OUT_WIDTH the input width and LOG_OUT_BUFF_SIZE the output buffer derived from the acc buffer. Skipped when a
    field they depend on is not an integer (that field's own problem is reported)."""
    values = {f.name: kwargs.get(f.name, f.default) for f in fields(VTAConfig)}
    if any(isinstance(v, bool) or not isinstance(v, int) for k, v in values.items() if k.startswith("log_")):
        return []
    problems = []
    log_block = values["log_block"]
    blocks = {key: data[key] for key in ("LOG_BLOCK_IN", "LOG_BLOCK_OUT") if key in data}
    if any(value != log_block for value in blocks.values()):
        listing = " and ".join(f"{key}={value!r}" for key, value in blocks.items())
        if len(set(map(repr, blocks.values()))) > 1:
            problems.append(f"{listing} differ, but this GEMM core is square (BLOCK_IN = BLOCK_OUT = 2**LOG_BLOCK); "
                            f"give one LOG_BLOCK instead")
        else:
            value = next(iter(blocks.values()))
            given = "LOG_BLOCK" in data or "log_block" in data
            where = f"LOG_BLOCK={log_block}" + ("" if given else " (the default: the file gives no LOG_BLOCK)")
            them = "them" if len(blocks) > 1 else "it"
            fix = f"make {them} equal or leave {them} out" if given else f"give LOG_BLOCK = {value!r} instead"
            problems.append(f"{listing} {'disagrees' if len(blocks) == 1 else 'disagree'} with {where}, which alone "
                            f"sets the block (BLOCK_IN = BLOCK_OUT = 2**LOG_BLOCK); {fix}")
    out_width = values["log_inp_width"]
    if "LOG_OUT_WIDTH" in data and data["LOG_OUT_WIDTH"] != out_width:
        problems.append(f"LOG_OUT_WIDTH={data['LOG_OUT_WIDTH']!r} disagrees with LOG_INP_WIDTH={out_width}: the "
                        f"output width is the input width here; make it {out_width} or leave it out")
    out_buff = values["log_acc_buff_size"] + values["log_inp_width"] - values["log_acc_width"]
    if "LOG_OUT_BUFF_SIZE" in data and data["LOG_OUT_BUFF_SIZE"] != out_buff:
        problems.append(f"LOG_OUT_BUFF_SIZE={data['LOG_OUT_BUFF_SIZE']!r} disagrees with the design: the output "
                        f"buffer is derived as LOG_ACC_BUFF_SIZE + LOG_INP_WIDTH - LOG_ACC_WIDTH = {out_buff}; make it "
                        f"{out_buff} or leave it out")
    return problems


def _log2(n: int) -> int:
    return max(n - 1, 0).bit_length()


def _check_type(name: str, value: Any) -> list[str]:
    if name in KNOBS:
        if not isinstance(value, bool):
            return [f"{_upper(name)} is a knob and must be true or false, not {_show(value)}"]
        return []
    if name == "clock_mhz":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return [f"{_upper(name)} must be a number, not {_show(value)}"]
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        return [f"{_upper(name)} must be an integer, not {_show(value)}"]
    return []


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 6, 6, 60, 60, 80


def _show(value: Any) -> str:
    """``repr(value)`` cut short where it would be long or deeply nested (a value of a bad type in a message)."""
    return _REPR.repr(value)


def _upper(name: str) -> str:
    return {v: k for k, v in _VTA_KEYS.items()}[name]


def _check(cfg: VTAConfig) -> list[str]:
    """Every problem with ``cfg``, one sentence each (empty when valid)."""
    problems: list[str] = []
    bad: set[str] = set()
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        type_problems = _check_type(f.name, value)
        problems.extend(type_problems)
        if type_problems:
            bad.add(f.name)
            continue
        lo, hi = _RANGES[f.name]
        if not lo <= value <= hi:
            why = f" ({_WHY[f.name]})" if f.name in _WHY else ""
            problems.append(f"{_upper(f.name)} must be between {lo:g} and {hi:g}{why}, not {value!r}")
            bad.add(f.name)
        elif f.name == "bus_bytes" and value & (value - 1):
            problems.append(f"BUS_BYTES must be a power of two, not {value}")
    if bad & {"log_inp_width", "log_wgt_width", "log_acc_width", "log_batch", "log_block"}:
        return problems
    # Every buffer must hold at least two entries (double buffering needs two), and no index may exceed the 16-bit
    # sram_base field of LOAD/STORE.
    # The micro-op size depends on the other three buffers' depths, so it is known only when they are valid.
    uop_bytes = None if bad & {"log_inp_buff_size", "log_wgt_buff_size", "log_acc_buff_size"} else cfg.uop_bytes
    buffers = [("log_uop_buff_size", uop_bytes, f"a {uop_bytes}-byte micro-op"),
               ("log_inp_buff_size", cfg.inp_elem_bytes, "one BATCH x BLOCK_IN input tile"),
               ("log_wgt_buff_size", cfg.wgt_elem_bytes, "one BLOCK x BLOCK weight tile"),
               ("log_acc_buff_size", cfg.acc_elem_bytes, "one BATCH x BLOCK_OUT int32 accumulator tile")]
    for name, elem, what in buffers:
        if name in bad or elem is None:
            continue
        log_size = getattr(cfg, name)
        depth = (1 << log_size) // elem
        if depth < 2:
            problems.append(f"{_upper(name)}={log_size} gives {1 << log_size} bytes, too small for two entries of "
                            f"{what} ({elem} bytes each); use at least {_log2(2 * elem)}")
        elif depth > 1 << _SRAM_BASE_BITS:
            problems.append(f"{_upper(name)}={log_size} gives {depth} entries, more than the 16-bit sram_base field "
                            f"of LOAD/STORE can address (65536); use at most {_log2(elem << _SRAM_BASE_BITS)}")
    problems.extend(_generator_problems(cfg))
    return problems


def packed_wgt_bits(block: int, inp_bits: int = 8, wgt_bits: int = 8) -> int:
    """Bits of one BLOCK x BLOCK weight tile as the generator's packed GEMM core stores it in one weight SRAM word.

    The same arithmetic as ``vta.hw.gemm.PackedWeightLayout`` (which tests compare against): a lane holds the sum of
    ``block`` products of an input and a weight (``inp_bits + wgt_bits + log2(block)`` bits), a 64-bit multiplier
    word holds ``63 // lane_bits`` lanes, and the tile takes ``block`` words plus one weight-sum word per group of
    lanes.
    """
    lane_bits = inp_bits + wgt_bits + (block - 1).bit_length()
    per_word = max(1, 63 // lane_bits)
    groups = -(-block // per_word)
    return 64 * (groups * block + groups)


def _generator_problems(cfg: VTAConfig) -> list[str]:
    """Limits of the hardware generator (``vta.hw``) that the ranges alone do not express, one sentence each.

    Every SRAM word, operand and result of the core must fit one Amaranth netlist value (``_MAX_NETLIST_BITS``).
    The weight word of the packed GEMM core (:func:`packed_wgt_bits`) grows fastest; within the ranges every other
    word fits (the widest, a 16 x 64 int32 accumulator word, is 32768 bits; tests/test_config.py checks each).
    """
    problems: list[str] = []
    if cfg.alu_pipeline is True and cfg.concurrent_alu is True:
        problems.append("ALU_PIPELINE and CONCURRENT_ALU cannot both be on: the pipelined ALU is built into the "
                        "compute module's own micro-op pipeline, not into CONCURRENT_ALU's ALU engine; turn one off")
    widths = (cfg.inp_width, cfg.wgt_width)
    wgt_bits = packed_wgt_bits(cfg.block_in, *widths)
    if wgt_bits > _MAX_NETLIST_BITS:
        top = max(b for b in range(int(_RANGES["log_block"][1]) + 1)
                  if packed_wgt_bits(1 << b, *widths) <= _MAX_NETLIST_BITS)
        problems.append(f"LOG_BLOCK={cfg.log_block} (BLOCK {cfg.block_in}) cannot be built: the generator's GEMM core "
                        f"stores a weight tile in one {wgt_bits}-bit SRAM word, wider than the "
                        f"{_MAX_NETLIST_BITS} bits an Amaranth netlist value can hold; use LOG_BLOCK at most {top}")
    return problems


def load_config(path: str | Path) -> VTAConfig:
    """Read a config file: VTA's ``vta_config.json`` (unchanged) or a TOML file with the same keys.

    A TOML file may put the keys at the top level or under a ``[vta]`` table, not both. The file must be UTF-8, at
    most :data:`vta.textfile.MAX_DOCUMENT_BYTES` long, and give each key once.
    """
    from .textfile import TextFileError, parse_json, parse_toml, read_text
    path = Path(path)
    toml = path.suffix.lower() == ".toml"
    try:
        text = read_text(path)
        data = parse_toml(text, str(path)) if toml else parse_json(text, str(path))
    except OSError as err:
        raise ConfigError([f"cannot read the config file: {err.strerror or err}"], str(path)) from None
    except TextFileError as err:
        raise ConfigError([err.reason], str(path)) from None
    if toml and isinstance(data.get("vta"), dict):
        outside = [key for key in data if key != "vta"]
        if outside:
            raise ConfigError([f"{_plural(outside, 'key')} {', '.join(outside)} outside the [vta] table would be "
                               f"ignored; put every key under [vta], or none"], str(path))
        data = data["vta"]
    if not isinstance(data, dict):
        raise ConfigError([f"the file must hold a table of keys, not {type(data).__name__}"], str(path))
    return VTAConfig.from_dict(data, source=str(path))


def _plural(items: list[str], noun: str) -> str:
    return f"the {noun}" if len(items) == 1 else f"the {noun}s"
