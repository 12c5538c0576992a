"""vta.hw.compat: every private Amaranth internal it relies on still exists with the shape it expects, and the
patched conversion gives the expected Verilog on a tiny design."""
import gc
import importlib
import inspect
import re
import warnings

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Fragment, Module, Signal, UnusedElaboratable
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from vta.hw import compat
from vta.hw.compat import AMARANTH_VERSION, PRIVATE_API, convert_component, silence_unused_warning


def _resolve(module, name):
    """The object ``module.name`` (``name`` may be dotted), or pytest.fail naming the part that is missing."""
    where = f"vta.hw.compat relies on {module}.{name}"
    try:
        obj = importlib.import_module(module)
    except ImportError as err:
        pytest.fail(f"{where}, but Amaranth {AMARANTH_VERSION} has no module {module} ({err}); update hw/compat.py")
    for part in name.split("."):
        if not hasattr(obj, part):
            pytest.fail(f"{where}, but Amaranth {AMARANTH_VERSION} has no {part!r} there; update hw/compat.py")
        obj = getattr(obj, part)
    return obj


def _in_order(names, params):
    """Whether ``names`` occur in ``params`` in this order (other parameters may come between)."""
    rest = iter(params)
    return all(name in rest for name in names)


@pytest.mark.parametrize("module, name, params, needs", PRIVATE_API, ids=[f"{m}.{n}" for m, n, _, _ in PRIVATE_API])
def test_private_amaranth_internal_is_still_there(module, name, params, needs):
    obj = _resolve(module, name)
    where = f"vta.hw.compat relies on {module}.{name}"
    if params is None:
        missing = [member for member in needs if not hasattr(obj, member)]
        assert not missing, f"{where} having {missing}, which Amaranth {AMARANTH_VERSION} lacks; update hw/compat.py"
        return
    have = list(inspect.signature(obj).parameters)
    assert _in_order(params, have), (f"{where}{tuple(params)}, but in Amaranth {AMARANTH_VERSION} its parameters "
                                     f"are {tuple(have)}; update hw/compat.py")
    source = inspect.getsource(obj)
    missing = [line for line in needs if line not in source]
    assert not missing, (f"{where} containing {missing}, which its source in Amaranth {AMARANTH_VERSION} no longer "
                         f"does; update hw/compat.py")


def test_the_checks_name_a_missing_internal_and_the_version():
    with pytest.raises(pytest.fail.Exception, match=rf"amaranth\.hdl\._nir\.NoSuchCell.*Amaranth "
                                                    rf"{re.escape(AMARANTH_VERSION)} has no 'NoSuchCell'"):
        _resolve("amaranth.hdl._nir", "NoSuchCell.__init__")


def test_every_private_name_the_module_uses_is_listed():
    """A private name used in hw/compat.py but missing from PRIVATE_API would escape the checks above."""
    source = inspect.getsource(compat)
    code = source[source.index('"""', source.index('"""') + 3) + 3:]   # after the module docstring
    listed = " ".join(f"{module}.{name}" for module, name, _, _ in PRIVATE_API)
    for used in sorted(set(re.findall(r"\b_(?:ir|nir)\.(\w+(?:\.\w+)?)", code))):
        assert used.split(".")[0] in listed, f"hw/compat.py uses {used} but PRIVATE_API does not list it"
    for method in sorted(set(re.findall(r"ModuleEmitter\.(\w+)", code))):
        assert f"ModuleEmitter.{method}" in listed, f"hw/compat.py uses ModuleEmitter.{method} unlisted"


class _Tiny(wiring.Component):
    """A register with an initial value of 5, a memory whose entries all start as 0x80 and one that counts up."""

    def __init__(self):
        super().__init__({"a": In(8), "addr": In(2), "q": Out(8), "flat_data": Out(8), "ramp_data": Out(8)})

    def elaborate(self, platform):
        m = Module()
        reg = Signal(8, init=5)
        m.d.sync += reg.eq(reg + self.a)
        m.d.comb += self.q.eq(reg)
        m.submodules.flat = flat = Memory(shape=8, depth=4, init=[0x80] * 4)
        m.submodules.ramp = ramp = Memory(shape=8, depth=4, init=[1, 2, 3, 4])
        for mem, out in ((flat, self.flat_data), (ramp, self.ramp_data)):
            port = mem.read_port()
            m.d.comb += [port.addr.eq(self.addr), out.eq(port.data)]
        return m


def test_patched_conversion_of_a_tiny_design():
    calls = []
    text = convert_component(_Tiny(), name="tiny", uniform_memory=lambda *args: calls.append(args))
    ports = re.search(r"^module tiny\((.*)\);$", text, re.M).group(1).split(", ")
    assert sorted(ports) == ["a", "addr", "clk", "flat_data", "q", "ramp_data", "rst"]
    # patch 2: the reset sits in the flop (a synchronous reset to the initial value), not in combinational logic
    assert re.search(r"always @\(posedge clk\)\n\s*if \(rst\) q <= 8'h05;\n\s*else q <= ", text)
    uses = [line for line in text.splitlines() if re.search(r"\brst\b", line) and not line.startswith("module ")]
    assert uses == ["  input rst;", "  wire rst;", "    if (rst) q <= 8'h05;"]
    # patch 3: the uniform memory goes to the callback, without initial contents; the other keeps its own
    assert calls == [("\\flat", 8, 0x80)]
    assert "reg [7:0] flat [3:0];" in text and not re.search(r"flat\[\d\] =", text)
    assert [int(v, 16) for v in re.findall(r"ramp\[\d\] = 8'h(\w+);", text)] == [1, 2, 3, 4]


def test_conversion_restores_amaranths_emitters_even_when_the_callback_raises():
    original = (rtlil.ModuleEmitter.emit_memory, rtlil.ModuleEmitter.emit_flip_flop)

    def refuse(memid, width, row):
        raise AssertionError(f"no contents for {memid}")
    with pytest.raises(AssertionError, match=r"no contents for \\flat"):
        convert_component(_Tiny(), name="tiny", uniform_memory=refuse)
    assert (rtlil.ModuleEmitter.emit_memory, rtlil.ModuleEmitter.emit_flip_flop) == original


def test_a_silenced_component_does_not_warn_that_it_was_never_used():
    Fragment.get(_Tiny(), None)   # Amaranth warns only once something has been elaborated
    with pytest.warns(UnusedElaboratable, match="created but never used"):
        _Tiny()
        gc.collect()               # Amaranth's record of where the object was made refers back to it
    with warnings.catch_warnings(record=True) as caught:   # a warning raised in __del__ would only be printed
        warnings.simplefilter("always")
        silence_unused_warning(_Tiny())
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, UnusedElaboratable)] == []
