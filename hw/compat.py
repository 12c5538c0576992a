"""Every use of Amaranth's private API in ``vta.hw``, in one place (written against Amaranth 0.5).

Amaranth has no public way to do the four things below, so they reach into its internals here and nowhere else: an
Amaranth upgrade that changes them breaks this file only, and ``tests/test_hw_compat.py`` checks every internal in
:data:`PRIVATE_API` against the installed Amaranth and names the one that changed. Policy (which memories are
uniform, what the Verilog text gets instead) stays with the callers; this module only supplies the mechanism.

1. **Ports with directions** (:func:`convert_component`). ``amaranth.back.verilog.convert_fragment`` is public, but
   its ``ports`` take directions as the private enum ``amaranth.hdl._ir.PortDirection``. We convert a fragment (not
   the component) so that we can add our own ``sync`` domain to it (patch 2). Public replacement:
   ``verilog.convert(component, name=...)``, which takes the ports from the signature, once it accepts the clock
   domains to create.
2. **Synchronous reset in the flops** (:func:`_emit_sync_reset_flop`, replacing the private
   ``amaranth.back.rtlil.ModuleEmitter.emit_flip_flop`` during :func:`convert_component`). Amaranth folds a
   synchronous reset into every register's next-state logic, so the top-level ``rst`` input feeds combinational
   logic and Verilator evaluates all next-state logic in an extra pass on every ``eval`` (about 10 % of the tsim
   model's time per cycle). We elaborate in a ``sync`` domain marked ``async_reset`` only so that Amaranth hands the
   reset to the flop (an ``$adff`` cell), and emit that flop as an ``$sdff`` (synchronous reset to its initial
   value) instead: exactly Amaranth's synchronous reset, with ``rst`` only in ``always @(posedge clk)`` blocks.
   Reads the private netlist cell ``amaranth.hdl._nir.FlipFlop`` and ``amaranth.hdl._nir.Net.from_const``. Public
   replacement: none; it would be an option of the Verilog/RTLIL backend to emit synchronous resets as ``$sdff``
   (or running Yosys ``opt_dff`` on the output, which also restructures the rest of it).
3. **Uniform memory contents left out of the netlist** (:func:`_emit_memory_init`, replacing the private
   ``ModuleEmitter.emit_memory``). Amaranth builds one constant net per bit of a memory's initial contents: minutes
   for megabit buffers whose entries are all equal (zeros, or a fill byte). For such a memory we call the caller's
   ``uniform_memory`` and emit no ``$meminit`` cell; the caller puts a compact loop into the Verilog instead.
   Reads the private ``amaranth.hdl._nir.Memory`` cell and ``ModuleEmitter.memories`` (``MemoryInfo.memid``).
   Public replacement: none; it would be a fast path for uniform ``init`` in ``amaranth.lib.memory.Memory``'s
   conversion.
4. **No "created but never used" warning for a half-built component** (:func:`silence_unused_warning`): a
   component whose ``__init__`` raised was never meant to be elaborated. Sets the private flag
   ``_MustUse__silence`` of ``amaranth._unused.MustUse``. Public replacement: none for one object; the file-wide
   ``# amaranth: UnusedElaboratable=no`` comment would silence it for every object a file creates.
"""
import amaranth
from amaranth.back import rtlil, verilog
from amaranth.hdl import ClockDomain, Const, Fragment, _ir, _nir
from amaranth.lib import wiring

__all__ = ["convert_component", "silence_unused_warning", "PRIVATE_API", "AMARANTH_VERSION"]

AMARANTH_VERSION = amaranth.__version__

PRIVATE_API = (
    ("amaranth.hdl._ir", "PortDirection", None, ("Input", "Output")),
    ("amaranth.hdl._nir", "Net.from_const", ("val",), ()),
    ("amaranth.hdl._nir", "FlipFlop.__init__",
     ("self", "module_idx", "data", "init", "clk", "clk_edge", "arst", "attributes", "src_loc"), ()),
    ("amaranth.hdl._nir", "Memory.__init__",
     ("self", "module_idx", "width", "depth", "init", "name", "attributes", "src_loc"), ()),
    ("amaranth.back.rtlil", "ModuleEmitter.__init__", ("self", "builder"),
     ("self.builder = builder", "self.memories = {}", "self.cell_wires = {}")),
    ("amaranth.back.rtlil", "ModuleEmitter.emit_cells", ("self",),
     ("self.emit_flip_flop(cell_idx, cell)", "self.emit_memory(cell_idx, cell)")),
    ("amaranth.back.rtlil", "ModuleEmitter.emit_flip_flop", ("self", "cell_idx", "cell"), ('"$adff"',)),
    ("amaranth.back.rtlil", "ModuleEmitter.emit_memory", ("self", "cell_idx", "cell"), ('"$meminit_v2"',)),
    ("amaranth.back.rtlil", "ModuleEmitter.sigspec", ("self", "parts"), ()),
    ("amaranth.back.rtlil", "MemoryInfo.__init__", ("self", "memid"), ("self.memid = memid",)),
    ("amaranth.back.rtlil", "Module.cell", ("self", "kind", "name"), ()),
    ("amaranth.back.rtlil", "convert_fragment", ("fragment", "ports", "name", "emit_src"), ()),
    ("amaranth._unused", "MustUse.__del__", ("self",), ("if self._MustUse__silence:",)),
)
"""Every private Amaranth name this module relies on, as ``(module, name in it, parameters, requirements)``, which
``tests/test_hw_compat.py`` checks against the installed Amaranth. ``parameters``: the names the signature must
have, in this order (other parameters may come between), or ``None`` for a class; ``requirements``: for a class,
members it must have; for a function, lines of code its source must contain (an attribute it sets or reads, a call
the patches rely on)."""


def _emit_sync_reset_flop(self, cell_idx, cell):
    """Replacement for ``ModuleEmitter.emit_flip_flop`` (patch 2): a flop with a reset net becomes a ``$sdff``
    (synchronous reset to its initial value) instead of an ``$adff``; a flop without one is emitted as before."""
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


def _memory_emitter(uniform_memory):
    """Replacement for ``ModuleEmitter.emit_memory`` (patch 3): a memory whose entries all start equal is handed to
    ``uniform_memory(memid, width, row)`` and gets no ``$meminit`` cell; any other memory is emitted as before."""
    def _emit_memory_init(self, cell_idx, cell):
        if len(set(cell.init)) > 1:
            _ORIGINAL_EMIT_MEMORY(self, cell_idx, cell)
            return
        row = cell.init[0] if len(cell.init) else 0
        uniform_memory(str(self.memories[cell_idx].memid), cell.width, row)
    return _emit_memory_init


_ORIGINAL_EMIT_MEMORY = rtlil.ModuleEmitter.emit_memory
_ORIGINAL_EMIT_FLIP_FLOP = rtlil.ModuleEmitter.emit_flip_flop


def convert_component(component, *, name, uniform_memory):
    """Verilog of the ``wiring.Component`` ``component`` as module ``name``, with ports ``clk``, ``rst`` and those of
    its signature (path parts joined by ``__``), its ``sync`` domain's reset in the flops (patch 2) and the initial
    contents of uniform memories left to the caller (patch 3): ``uniform_memory(memid, width, row)`` is called for
    each memory whose every entry starts as the ``width``-bit integer ``row`` (``memid``: its RTLIL name, ending in
    the memory's Amaranth name), and must raise if it cannot provide those contents."""
    ports = {}
    for path, member, value in component.signature.flatten(component):
        direction = _ir.PortDirection.Input if member.flow == wiring.In else _ir.PortDirection.Output
        ports["__".join(map(str, path))] = (value, direction)
    fragment = Fragment.get(component, None)
    sync = ClockDomain("sync", async_reset=True)
    fragment.add_domains(sync)
    ports["clk"] = (sync.clk, _ir.PortDirection.Input)
    ports["rst"] = (sync.rst, _ir.PortDirection.Input)
    rtlil.ModuleEmitter.emit_memory = _memory_emitter(uniform_memory)
    rtlil.ModuleEmitter.emit_flip_flop = _emit_sync_reset_flop
    try:
        text, _ = verilog.convert_fragment(fragment, ports, name, emit_src=False)
    finally:
        rtlil.ModuleEmitter.emit_memory = _ORIGINAL_EMIT_MEMORY
        rtlil.ModuleEmitter.emit_flip_flop = _ORIGINAL_EMIT_FLIP_FLOP
    return text


def silence_unused_warning(obj):
    """Tell Amaranth not to warn that the elaboratable ``obj`` was created but never used (patch 4)."""
    obj._MustUse__silence = True
