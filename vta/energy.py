"""An energy model: per-event energies of a technology file times the event counts of each layer.

The technology file (TOML, default ``tech/default_45nm.toml``: Horowitz, ISSCC 2014, 45 nm) gives pJ per 8-bit
multiply and 32-bit add, pJ per SRAM access by SRAM size, pJ per DRAM access, pJ per CPU MAC and static power per
area. Events per accelerator layer follow from its counters (a run's statistics, or
:func:`vta.counts.program_counts` without a run; names of :mod:`vta.counters`) and the config:

* each MAC (``macs``): one multiply of the design's input x weight widths + one 32-bit add; a narrower multiply
  costs the 8-bit one times ``(inp_bits * wgt_bits) / 64`` (an array multiplier's partial products; the table's own
  8-bit and 32-bit multiplies, 0.2 and 3.1 pJ, scale as the width squared within 3%), so int4 x int8 is half and
  int4 x int4 a quarter of the 8-bit multiply;
* each GEMM micro-op: reads one inp entry, one wgt entry, one micro-op, reads and writes one acc entry and writes one
  out entry (a reset GEMM: only the micro-op read and the acc and out writes);
* each ALU micro-op: BATCH x BLOCK_OUT 32-bit adds, reads two acc entries and a micro-op, writes one acc and one out
  entry;
* each byte loaded (``*_bytes_read``): one DRAM byte read and one SRAM byte written; ``insn_bytes_read``: DRAM only;
  each byte stored (``out_bytes_written``): one out-buffer byte read and one DRAM byte written.

SRAM energy per byte is the file's access energy at the buffer's size (interpolated in log2 of the size) divided by
the access width in bytes. CPU layers cost ``cpu.mac_pj`` per MAC; static energy is ``static.mw_per_kclb`` times the
design's area (CLB-equivalents, :mod:`vta.area`) times the inference's time. All energies are pJ.

On the ground floor (it imports only :mod:`vta.config` and :mod:`vta.textfile`): the sweep (:mod:`vta.sweep.measure`)
and the per-run reports (:mod:`vta.compiler.report`) use the same model.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .config import VTAConfig

__all__ = ["Tech", "load_tech", "DEFAULT_TECH", "layer_energy", "sram_pj_per_byte", "TechError", "BUFFERS"]

DEFAULT_TECH = Path(__file__).with_name("tech") / "default_45nm.toml"
"""The default technology file (45 nm, Horowitz ISSCC 2014)."""
BUFFERS = ("uop", "inp", "wgt", "acc", "out")
"""The on-chip buffers whose SRAM energy is counted separately."""


class TechError(ValueError):
    """A technology file is invalid; ``problems`` lists every problem, one sentence each."""

    def __init__(self, problems: list[str], source: str) -> None:
        self.problems = problems
        super().__init__(f"invalid technology file {source} ({len(problems)} problem"
                         f"{'s' if len(problems) != 1 else ''}):\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class Tech:
    """Per-event energies (pJ) and static power (mW per 1000 CLB-equivalents) of one technology."""

    name: str
    mult_8b_pj: float
    add_8b_pj: float
    add_32b_pj: float
    sram_access_bits: int
    sram_size_bytes: tuple[int, ...]
    sram_access_pj: tuple[float, ...]
    sram_write_factor: float
    dram_access_bits: int
    dram_access_pj: float
    cpu_mac_pj: float
    static_mw_per_kclb: float

    @property
    def mac_pj(self) -> float:
        """One MAC of the GEMM core: an 8-bit multiply and a 32-bit accumulate."""
        return self.mult_8b_pj + self.add_32b_pj

    def mac_pj_at(self, inp_bits: int, wgt_bits: int) -> float:
        """One MAC of ``inp_bits`` x ``wgt_bits`` operands: the 8-bit multiply scaled by ``inp_bits * wgt_bits / 64``
        (see the module docstring) and a 32-bit accumulate; equals :attr:`mac_pj` at 8 x 8."""
        return self.mult_8b_pj * (inp_bits * wgt_bits) / 64 + self.add_32b_pj

    @property
    def dram_pj_per_byte(self) -> float:
        """DRAM energy per byte moved (pJ)."""
        return self.dram_access_pj / (self.dram_access_bits / 8)


_FIELDS = {  # (table, key) -> Tech field
    ("source", "name"): "name", ("compute", "mult_8b_pj"): "mult_8b_pj", ("compute", "add_8b_pj"): "add_8b_pj",
    ("compute", "add_32b_pj"): "add_32b_pj", ("sram", "access_bits"): "sram_access_bits",
    ("sram", "size_bytes"): "sram_size_bytes", ("sram", "access_pj"): "sram_access_pj",
    ("sram", "write_factor"): "sram_write_factor", ("dram", "access_bits"): "dram_access_bits",
    ("dram", "access_pj"): "dram_access_pj", ("cpu", "mac_pj"): "cpu_mac_pj",
    ("static", "mw_per_kclb"): "static_mw_per_kclb",
}
_cache: dict[str, Tech] = {}


def load_tech(path: str | os.PathLike[str] | None = None) -> Tech:
    """Read and validate a technology file (default :data:`DEFAULT_TECH`); every problem is listed in one
    :class:`TechError`."""
    path = Path(path) if path is not None else DEFAULT_TECH
    if str(path) in _cache:
        return _cache[str(path)]
    from .textfile import TextFileError, parse_toml, read_text
    try:
        data = parse_toml(read_text(path), str(path))
    except OSError as err:
        raise TechError([f"cannot read the file: {err.strerror or err}"], str(path)) from None
    except TextFileError as err:  # not UTF-8, too large, not TOML, nested too deeply
        raise TechError([err.reason], str(path)) from None
    problems: list[str] = []
    values: dict[str, Any] = {}
    for (table, key), name in _FIELDS.items():
        value = data.get(table, {}).get(key) if isinstance(data.get(table), dict) else None
        if value is None:
            problems.append(f"[{table}] {key} is missing")
        elif name == "name":
            values[name] = str(value)
        elif name in ("sram_size_bytes", "sram_access_pj"):
            if not isinstance(value, list) or not all(_positive(v) for v in value):
                problems.append(f"[{table}] {key} must be a list of positive numbers, not {value!r}")
            else:
                values[name] = tuple(value)
        elif not _positive(value) and not (value == 0 and name == "static_mw_per_kclb"):
            problems.append(f"[{table}] {key} must be a positive number, not {value!r}")
        else:
            values[name] = value
    sizes, energies = values.get("sram_size_bytes", ()), values.get("sram_access_pj", ())
    if sizes and energies and (len(sizes) != len(energies) or len(sizes) < 2 or list(sizes) != sorted(set(sizes))):
        problems.append("[sram] size_bytes must be at least two increasing sizes, one per access_pj value")
    if problems:
        raise TechError(problems, str(path))
    tech = Tech(**values)
    _cache[str(path)] = tech
    return tech


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0


def sram_pj_per_byte(tech: Tech, size_bytes: int) -> float:
    """Read energy per byte (pJ) of an SRAM of ``size_bytes``: the access energy interpolated linearly in log2(size)
    between the file's two nearest sizes (extrapolated from the end pairs), over the access width in bytes."""
    xs = [math.log2(s) for s in tech.sram_size_bytes]
    x = math.log2(size_bytes)
    k = 1
    while k < len(xs) - 1 and x > xs[k]:
        k += 1
    x0, x1, y0, y1 = xs[k - 1], xs[k], tech.sram_access_pj[k - 1], tech.sram_access_pj[k]
    access = max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)
    return access / (tech.sram_access_bits / 8)


def buffer_bytes(cfg: VTAConfig) -> dict[str, int]:
    """Size in bytes of each on-chip buffer of :data:`BUFFERS`."""
    return {"uop": 1 << cfg.log_uop_buff_size, "inp": 1 << cfg.log_inp_buff_size,
            "wgt": 1 << cfg.log_wgt_buff_size, "acc": 1 << cfg.log_acc_buff_size, "out": 1 << cfg.log_out_buff_size}


def layer_energy(counts: Mapping[str, int], cfg: VTAConfig, tech: Tech) -> dict[str, float]:
    """Dynamic energy (pJ) of one accelerator layer by component: ``mac``, ``alu``, ``sram_<buffer>`` for each of
    :data:`BUFFERS`, ``dram``; from its ``counts`` (:func:`vta.counts.program_counts`) on ``cfg``."""
    per_byte = {b: sram_pj_per_byte(tech, size) for b, size in buffer_bytes(cfg).items()}
    write = tech.sram_write_factor
    gemm = counts["macs"] // cfg.macs_per_cycle
    reset = counts["gemm_uops"] - gemm
    alu = counts["alu_uops"]
    uops = counts["gemm_uops"] + alu
    acc_e, out_e = cfg.acc_elem_bytes, cfg.out_elem_bytes
    sram_bytes = {  # (read bytes, written bytes) per buffer
        "uop": (uops * cfg.uop_bytes, counts["uop_bytes_read"]),
        "inp": (gemm * cfg.inp_elem_bytes, counts["inp_bytes_read"]),
        "wgt": (gemm * cfg.wgt_elem_bytes, counts["wgt_bytes_read"]),
        "acc": ((gemm + 2 * alu) * acc_e, (gemm + reset + alu) * acc_e + counts["acc_bytes_read"]),
        "out": (counts["out_bytes_written"], (gemm + reset + alu) * out_e),
    }
    energy = {"mac": counts["macs"] * tech.mac_pj_at(cfg.inp_width, cfg.wgt_width),
              "alu": alu * cfg.batch * cfg.block_out * tech.add_32b_pj}
    for b, (read, written) in sram_bytes.items():
        energy[f"sram_{b}"] = (read + write * written) * per_byte[b]
    dram = sum(counts[k] for k in ("insn_bytes_read", "uop_bytes_read", "wgt_bytes_read", "inp_bytes_read",
                                   "acc_bytes_read", "out_bytes_written"))
    energy["dram"] = dram * tech.dram_pj_per_byte
    return energy


def static_pj(tech: Tech, area_clb: float, seconds: float) -> float:
    """Static energy (pJ) of a design of ``area_clb`` CLB-equivalents over ``seconds``."""
    return tech.static_mw_per_kclb * area_clb / 1000 * seconds * 1e9
