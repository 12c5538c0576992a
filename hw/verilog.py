"""Verilog generation: ``generate_verilog(cfg, out_dir)`` writes ``vta_core.v`` for a config.

The output is deterministic (same config and same ``hw/`` sources give the same bytes), so builds can be cached by
its hash. Generated files belong in an ignored folder (``out/``, ``.cache/``, ``build/``) or a folder the user names.
"""
import hashlib
import re
from pathlib import Path

from vta import config as config_module
from vta.config import VTAConfig
from vta.fileio import atomic_write_text

from .compat import convert_component
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
_NOT_RTL = {"__init__.py", "cli.py", "area.py", "timing.py"}


# The ground-floor modules the RTL is derived from: the config, the instruction layout, the counter register map.
_GROUND_RTL_SOURCES = ("config.py", "isa.py", "counters.py")


def rtl_sources():
    """The Python files whose contents shape the generated RTL, in a fixed order: ``hw/*.py`` (less ``_NOT_RTL``)
    and the ``vta/`` modules it derives from (``_GROUND_RTL_SOURCES``)."""
    hw_dir = Path(__file__).resolve().parent
    ground = Path(config_module.__file__).resolve().parent
    return [*sorted(p for p in hw_dir.glob("*.py") if p.name not in _NOT_RTL),
            *(ground / name for name in _GROUND_RTL_SOURCES)]


def source_hash():
    """SHA-256 (hex, first 16 characters) of :func:`rtl_sources`, in order: keys generated artefacts (Verilog,
    Verilator builds, area results)."""
    digest = hashlib.sha256()
    for path in rtl_sources():
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _uniform_memory(memid, width, row):
    """``uniform_memory`` for :func:`vta.hw.compat.convert_component`: the memory ``memid`` (every entry ``row``, of
    ``width`` bits) gets its contents from :func:`_fill_init`, by its name: ``mem_rowKEY`` (the key of
    :func:`vta.hw.mem.uniform_row_key`, remembered here), ``mem_fillXX`` (the byte 0xXX in every byte) or else zeros.
    Amaranth would build one constant net per bit of them: minutes for megabit buffers."""
    keyed = _ROW_NAME.search(memid)
    if keyed:
        if keyed.group(1) != uniform_row_key(row, width):
            raise AssertionError(f"memory {memid}: uniform initial contents {row:#x} do not match its name's key")
        _UNIFORM_ROWS[keyed.group(1)] = (width, row)
        return
    fill = _FILL_NAME.search(memid)
    byte = int(fill.group(1), 16) if fill else 0
    if row != byte_fill(byte, width // 8) or (byte and width % 8):
        raise AssertionError(f"memory {memid}: uniform initial contents {row:#x} do not match its name's fill byte")


_FILL_NAME = re.compile(r"mem_fill([0-9a-f]{2})$")
_ROW_NAME = re.compile(r"mem_row([0-9a-f]{12})$")
# key of vta.hw.mem.uniform_row_key -> (width, row), filled while a design is converted
_UNIFORM_ROWS: dict[str, tuple[int, int]] = {}
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


def verilog_text(cfg, *, gemm_form="packed"):
    """The Verilog of the whole core for ``cfg`` (top module ``vta_core``, one clock ``clk``, reset ``rst``).
    ``gemm_form``: the GEMM core's implementation (:data:`vta.hw.gemm.GEMM_FORMS`; the same function either way)."""
    from .core import VTACore
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    text = _fill_init(convert_component(VTACore(cfg=cfg, gemm_form=gemm_form), name=TOP_NAME,
                                         uniform_memory=_uniform_memory))
    header = (f"// Generated by vta.hw from config {cfg.name} (hw sources {source_hash()}, GEMM core {gemm_form}); "
              "do not edit.\n")
    waivers = "".join(f"/* verilator lint_off {w} */\n" for w in LINT_WAIVERS)
    return header + waivers + text


def generate_verilog(cfg, out_dir, *, gemm_form="packed"):
    """Write ``<out_dir>/vta_core.v`` for ``cfg`` (``gemm_form`` as in :func:`verilog_text`) and return its path. The
    folder is created if needed; the file is rewritten only when its contents change (so its timestamp keys
    make-style caches), and then whole (:mod:`vta.fileio`: :class:`OSError` naming the path when it cannot be)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{TOP_NAME}.v"
    text = verilog_text(cfg, gemm_form=gemm_form)
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)
    return path
