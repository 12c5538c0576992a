"""Verilog generation: ``generate_verilog(cfg, out_dir)`` writes ``vta_core.v`` for a config.

The output is deterministic (same config and same ``hw/`` sources give the same bytes), so builds can be cached by
its hash. Generated files belong in an ignored folder (``out/``, ``.cache/``, ``build/``) or a folder the user names.
"""
import hashlib
import re
from pathlib import Path

from amaranth.back import rtlil, verilog
from amaranth.hdl import ClockDomain, Const, Fragment, _ir, _nir
from amaranth.lib import wiring

from vta.config import VTAConfig

from .mem import uniform_row_key
from .util import byte_fill

__all__ = ["generate_verilog", "verilog_text", "source_hash", "TOP_NAME", "LINT_WAIVERS"]

TOP_NAME = "vta_core"

# Verilator lint categories waived for the generated file (docs/hardware.md explains each). All come from the form of
# Amaranth/Yosys output, not from design choices: Amaranth's arithmetic widens and truncates by its own (well-defined)
# rules, unused bits of sliced values and unused memory read data are left as wires, registers get initial values
# and are also reset, switches without a default case leave the value unchanged, and every module of the hierarchy
# goes into one file.
LINT_WAIVERS = ("UNUSEDSIGNAL", "WIDTHEXPAND", "WIDTHTRUNC", "PROCASSINIT", "CASEINCOMPLETE", "DECLFILENAME")


# Sources that do not shape the RTL (command line, synthesis driver) stay out of the hash, so editing them does not
# invalidate Verilator builds and area results.
_NOT_RTL = {"__init__.py", "cli.py", "area.py"}


def source_hash():
    """SHA-256 (hex, first 16 characters) of the ``hw/*.py`` sources that generate the RTL, in name order: keys
    generated artefacts (Verilog, Verilator builds, area results)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(__file__).parent.glob("*.py") if p.name not in _NOT_RTL):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _emit_memory_init(self, cell_idx, cell):
    """Replacement for Amaranth's ``ModuleEmitter.emit_memory`` that leaves uniform initial contents (every entry
    equal: zeros, or the fill byte of :class:`vta.hw.mem.Sram`) out of the netlist (Amaranth builds one constant net
    per bit: minutes for megabit buffers); :func:`_fill_init` puts a compact loop into the Verilog instead."""
    if len(set(cell.init)) > 1:
        _ORIGINAL_EMIT_MEMORY(self, cell_idx, cell)
        return
    row = cell.init[0] if len(cell.init) else 0
    memid = str(self.memories[cell_idx].memid)
    keyed = _ROW_NAME.search(memid)
    if keyed:
        if keyed.group(1) != uniform_row_key(row, cell.width):
            raise AssertionError(f"memory {memid}: uniform initial contents {row:#x} do not match its name's key")
        _UNIFORM_ROWS[keyed.group(1)] = (cell.width, row)
        return
    fill = _FILL_NAME.search(memid)
    byte = int(fill.group(1), 16) if fill else 0
    if row != byte_fill(byte, cell.width // 8) or (byte and cell.width % 8):
        raise AssertionError(f"memory {memid}: uniform initial contents {row:#x} do not match its name's fill byte")


_ORIGINAL_EMIT_MEMORY = rtlil.ModuleEmitter.emit_memory
_FILL_NAME = re.compile(r"mem_fill([0-9a-f]{2})$")
_ROW_NAME = re.compile(r"mem_row([0-9a-f]{12})$")
_UNIFORM_ROWS = {}  # key of vta.hw.mem.uniform_row_key -> (width, row), filled while a design is converted
_MEM_DECL = re.compile(r"^(\s*)reg (?:\[(\d+):0\] )?(\S+) \[(\d+):0\];$", re.M)


def _fill_init(text):
    """After each memory declaration ``reg [W:0] name [D:0];`` add a loop that sets it at time 0 to the contents
    every simulator and fsim start from: zeros, or for a memory named ``mem_fillXX`` the byte 0xXX in every byte
    (synthesis maps it to initialized block RAM)."""
    def repl(match):
        indent, top_bit, name, top = match.groups()
        var = f"{name}_init_i"
        fill = _FILL_NAME.search(name)
        keyed = _ROW_NAME.search(name)
        value = f"{{{(int(top_bit or 0) + 1) // 8}{{8'h{fill.group(1)}}}}}" if fill else "0"
        if keyed:
            width, row = _UNIFORM_ROWS[keyed.group(1)]
            value = f"{width}'h{row:x}"
        return (f"{match.group(0)}\n{indent}integer {var};\n{indent}initial for ({var} = 0; {var} <= {top}; "
                f"{var} = {var} + 1) {name}[{var}] = {value};")
    return _MEM_DECL.sub(repl, text)


def _emit_sync_reset_flop(self, cell_idx, cell):
    """Replacement for Amaranth's ``ModuleEmitter.emit_flip_flop`` used by :func:`verilog_text`: a flop with a reset
    net becomes a ``$sdff`` (synchronous reset to its initial value) instead of an ``$adff``. :func:`verilog_text`
    elaborates the core in a ``sync`` domain marked ``async_reset`` only so that Amaranth hands the reset to the flop
    instead of folding ``if (rst) next = init`` into every register's next-state logic; the flop applies it at the
    clock edge, which is exactly Amaranth's synchronous reset (reset wins over every other assignment).

    Why: the Verilog then has ``rst`` only in ``always @(posedge clk)`` blocks. A top-level input read by
    combinational logic makes Verilator evaluate that logic in an extra pass on every ``eval``; with the reset folded
    in, that was all next-state logic of the design (about 10 % of the tsim model's time per cycle)."""
    if cell.arst == _nir.Net.from_const(0):
        _ORIGINAL_EMIT_FLIP_FLOP(self, cell_idx, cell)
        return
    if cell.clk_edge != "pos":
        raise AssertionError(f"flop {cell_idx}: only rising-edge clocks are generated, not {cell.clk_edge!r}")
    ports = {"D": self.sigspec(cell.data), "CLK": self.sigspec(cell.clk), "SRST": self.sigspec(cell.arst),
             "Q": self.cell_wires[cell_idx].name}
    parameters = {"WIDTH": len(cell.data), "CLK_POLARITY": True, "SRST_POLARITY": True,
                  "SRST_VALUE": Const(cell.init, len(cell.data))}
    self.builder.cell("$sdff", ports=ports, parameters=parameters, src_loc=cell.src_loc)


_ORIGINAL_EMIT_FLIP_FLOP = rtlil.ModuleEmitter.emit_flip_flop


def _convert_core(core):
    """Verilog of ``core`` with ports ``clk``, ``rst`` and those of its signature, its ``sync`` domain's reset in the
    flops (see :func:`_emit_sync_reset_flop`) and uniform memory contents left to :func:`_fill_init`."""
    ports = {}
    for path, member, value in core.signature.flatten(core):
        direction = _ir.PortDirection.Input if member.flow == wiring.In else _ir.PortDirection.Output
        ports["__".join(map(str, path))] = (value, direction)
    fragment = Fragment.get(core, None)
    sync = ClockDomain("sync", async_reset=True)
    fragment.add_domains(sync)
    ports["clk"] = (sync.clk, _ir.PortDirection.Input)
    ports["rst"] = (sync.rst, _ir.PortDirection.Input)
    rtlil.ModuleEmitter.emit_memory = _emit_memory_init
    rtlil.ModuleEmitter.emit_flip_flop = _emit_sync_reset_flop
    try:
        text, _ = verilog.convert_fragment(fragment, ports, TOP_NAME, emit_src=False)
    finally:
        rtlil.ModuleEmitter.emit_memory = _ORIGINAL_EMIT_MEMORY
        rtlil.ModuleEmitter.emit_flip_flop = _ORIGINAL_EMIT_FLIP_FLOP
    return text


def verilog_text(cfg, *, gemm_form="packed"):
    """The Verilog of the whole core for ``cfg`` (top module ``vta_core``, one clock ``clk``, reset ``rst``).
    ``gemm_form``: the GEMM core's implementation (:data:`vta.hw.gemm.GEMM_FORMS`; the same function either way)."""
    from .core import VTACore
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    text = _fill_init(_convert_core(VTACore(cfg=cfg, gemm_form=gemm_form)))
    header = (f"// Generated by vta.hw from config {cfg.name} (hw sources {source_hash()}, GEMM core {gemm_form}); "
              "do not edit.\n")
    waivers = "".join(f"/* verilator lint_off {w} */\n" for w in LINT_WAIVERS)
    return header + waivers + text


def generate_verilog(cfg, out_dir, *, gemm_form="packed"):
    """Write ``<out_dir>/vta_core.v`` for ``cfg`` (``gemm_form`` as in :func:`verilog_text`) and return its path. The
    folder is created if needed; the file is rewritten only when its contents change (so its timestamp keys
    make-style caches)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{TOP_NAME}.v"
    text = verilog_text(cfg, gemm_form=gemm_form)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path
