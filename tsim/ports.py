"""The core's top-level ports, derived once from the config, and the check of a Verilog core against them.

:func:`expected_ports` is the port list of ``docs/core-interface.md`` for a config (names, directions, widths): the
one place it is written down in Python. :func:`read_ports` asks Verilator itself for the ports of a top module
(``verilator --json-only``: the elaborated tree, so parameters and width expressions are resolved), :func:`lint`
runs ``verilator --lint-only`` on the files, and :func:`check_core` does both and raises one
:class:`CoreInterfaceError` naming every mismatch (missing port, extra port, wrong direction, wrong width), before
anything is built. ``tests/test_byo_rtl.py`` checks that the generated core (``vta.hw.verilog``) passes.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from vta.config import VTAConfig

from .build import RtlInputError, verilator_env

__all__ = ["Port", "CoreInterfaceError", "expected_ports", "port_problems", "read_ports", "lint", "check_core",
           "TOP_NAME", "LINT_FLAGS"]

TOP_NAME = "vta_core"
"""The top module's name the harness expects by default (a foreign core may name another with ``top``)."""

LINT_FLAGS: tuple[str, ...] = ("-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC")
"""Warnings Verilator reports but does not fail on while linting a foreign core (the build's own waivers); errors
(syntax, unresolved modules, multiple drivers Verilator refuses) fail the lint."""

_DIRECTIONS = {"INPUT": "in", "OUTPUT": "out", "INOUT": "inout", "REF": "ref", "CONSTREF": "ref"}
_KEYWORD_WIDTHS = {"logic": 1, "bit": 1, "reg": 1, "wire": 1, "byte": 8, "shortint": 16, "int": 32, "integer": 32,
                   "longint": 64}


class CoreInterfaceError(RtlInputError):
    """A foreign core does not lint or does not have the ports of ``docs/core-interface.md``. ``problems`` lists
    each mismatch (one sentence each); ``output`` holds Verilator's output when it failed."""

    def __init__(self, message: str, problems: Sequence[str] = (), output: str = "") -> None:
        self.problems = list(problems)
        self.output = output
        super().__init__(message)


@dataclass(frozen=True)
class Port:
    """One port of the top module: ``name``, ``direction`` (``"in"`` or ``"out"``) and ``width`` in bits."""

    name: str
    direction: str
    width: int

    def __str__(self) -> str:
        bits = f" [{self.width - 1}:0]" if self.width > 1 else ""
        return f"{self.direction}put{bits} {self.name}" if self.direction in ("in", "out") else \
            f"{self.direction}{bits} {self.name}"


def expected_ports(cfg: VTAConfig) -> tuple[Port, ...]:
    """The ports a core must have for ``cfg`` (docs/core-interface.md), in the document's order: the clock and
    reset, control, then the memory port (``B = cfg.bus_bytes``: data ``8*B`` bits, strobes ``B`` bits)."""
    if not isinstance(cfg, VTAConfig):
        raise TypeError(f"cfg must be a VTAConfig, not {type(cfg).__name__}")
    from vta.hw.regs import CSR_ADDR_BITS
    b = cfg.bus_bytes
    table = [
        ("clk", "in", 1), ("rst", "in", 1),
        ("start", "in", 1), ("insn_addr", "in", 32), ("insn_count", "in", 32), ("done", "out", 1),
        ("csr_addr", "in", CSR_ADDR_BITS), ("csr_rdata", "out", 64), ("progress", "out", 1),
        ("mem_rd_req_valid", "out", 1), ("mem_rd_req_ready", "in", 1), ("mem_rd_req_addr", "out", 32),
        ("mem_rd_req_len", "out", 16), ("mem_rd_data_valid", "in", 1), ("mem_rd_data_ready", "out", 1),
        ("mem_rd_data", "in", 8 * b),
        ("mem_wr_valid", "out", 1), ("mem_wr_ready", "in", 1), ("mem_wr_addr", "out", 32),
        ("mem_wr_data", "out", 8 * b), ("mem_wr_strb", "out", b),
    ]
    return tuple(Port(name, direction, width) for name, direction, width in table)


def port_problems(expected: Iterable[Port], actual: Iterable[Port]) -> list[str]:
    """Every difference between the ``expected`` and the ``actual`` ports, one sentence each: missing ports, extra
    ports, wrong directions, wrong widths (in the expected order, then the extra ports in the actual order)."""
    want = {p.name: p for p in expected}
    have = {p.name: p for p in actual}
    problems = []
    for name, port in want.items():
        got = have.get(name)
        if got is None:
            problems.append(f"port {name} is missing (expected {port})")
            continue
        if got.direction != port.direction:
            problems.append(f"port {name} is an {got.direction}put, expected an {port.direction}put"
                            if got.direction in ("in", "out") else
                            f"port {name} has direction {got.direction}, expected {port.direction}put")
        if got.width == 0:
            problems.append(f"port {name} is not a packed bit vector (an unpacked array or struct?), expected "
                            f"{port.width} bit{'s' if port.width > 1 else ''}")
        elif got.width != port.width:
            problems.append(f"port {name} is {got.width} bits wide, expected {port.width}")
    for name, port in have.items():
        if name not in want:
            problems.append(f"port {name} ({port}) is not part of the core interface")
    return problems


def _verilator(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["verilator", *args], cwd=cwd, env=verilator_env(), capture_output=True, text=True,
                          check=False)


def _input_args(files: Sequence[Path], include_dirs: Sequence[Path]) -> list[str]:
    """Verilator's arguments for ``files`` and ``include_dirs``, as absolute paths (Verilator runs in a temporary
    folder)."""
    return [*(f"-I{Path(d).resolve()}" for d in include_dirs), *(str(Path(f).resolve()) for f in files)]


def _errors(output: str) -> str:
    """Verilator's error lines (``%Error``...), or its whole output when it printed none."""
    lines = [line for line in output.splitlines() if line.startswith("%Error")]
    return "\n".join(lines[:20]) if lines else output.strip()


def lint(files: Sequence[Path], top: str = TOP_NAME, *, include_dirs: Sequence[Path] = ()) -> None:
    """``verilator --lint-only`` on ``files`` with top module ``top``; :class:`CoreInterfaceError` with Verilator's
    errors when it fails (warnings are allowed, :data:`LINT_FLAGS`)."""
    with tempfile.TemporaryDirectory(prefix="vta-lint-") as tmp:
        out = _verilator(["--lint-only", *LINT_FLAGS, "--top-module", top, *_input_args(files, include_dirs)],
                         Path(tmp))
    if out.returncode != 0:
        text = out.stdout + out.stderr
        raise CoreInterfaceError(f"Verilator's lint (--lint-only) of top module {top} in "
                                 f"{', '.join(Path(f).name for f in files)} failed:\n{_errors(text)}", output=text)


def read_ports(files: Sequence[Path], top: str = TOP_NAME, *, include_dirs: Sequence[Path] = ()) -> tuple[Port, ...]:
    """The ports of module ``top`` as Verilator elaborates them (``--json-only``), in declaration order. A port whose
    type has no plain bit width (an unpacked array, a struct) gets width 0, which never matches."""
    with tempfile.TemporaryDirectory(prefix="vta-ports-") as tmp:
        out = _verilator(["--json-only", *LINT_FLAGS, "--top-module", top, "-Mdir", tmp,
                          *_input_args(files, include_dirs)], Path(tmp))
        text = out.stdout + out.stderr
        trees = sorted(Path(tmp).glob("*.tree.json"))
        if out.returncode != 0 or not trees:
            raise CoreInterfaceError(f"Verilator could not elaborate top module {top} (--json-only):\n"
                                     f"{_errors(text)}", output=text)
        tree = json.loads(trees[0].read_text())
    return _ports_of(tree, top)


def _ports_of(tree: dict[str, Any], top: str) -> tuple[Port, ...]:
    index: dict[str, dict[str, Any]] = {}
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "addr" in node:
                index[node["addr"]] = node
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(node)
    modules = [m for m in tree.get("modulesp", []) if m.get("type") == "MODULE"]
    module = next((m for m in modules if m.get("level") == 1), None) or next(
        (m for m in modules if m.get("origName") == top), None)
    if module is None:
        raise CoreInterfaceError(f"Verilator's tree holds no top module {top}")
    ports = []
    for var in module.get("stmtsp", []):
        if var.get("type") != "VAR" or not var.get("isPrimaryIO"):
            continue
        direction = _DIRECTIONS.get(str(var.get("direction")), str(var.get("direction")).lower())
        ports.append(Port(str(var.get("origName") or var["name"]), direction, _width(index, var.get("dtypep"))))
    return tuple(ports)


def _width(index: dict[str, dict[str, Any]], addr: Any, depth: int = 0) -> int:
    """Bit width of the data type at ``addr`` in Verilator's tree: a basic type's ``range`` (``"hi:lo"``) or its
    keyword's width, a packed array's element width times its length, a packed struct's members summed (a packed
    union's widest); typedefs, members and enums followed to their types; 0 for anything else (an unpacked array,
    an unpacked struct), which never matches a port of the interface."""
    dtype = index.get(str(addr))
    if dtype is None or depth > 32:
        return 0
    kind = dtype.get("type")
    if kind == "BASICDTYPE":
        rng = dtype.get("range")
        if rng:
            hi, lo = (int(v) for v in str(rng).split(":"))
            return abs(hi - lo) + 1
        return _KEYWORD_WIDTHS.get(str(dtype.get("keyword")), 0)
    sub = dtype.get("refDTypep") or dtype.get("subDTypep")
    if kind in ("REFDTYPE", "TYPEDEFDTYPE", "MEMBERDTYPE", "ENUMDTYPE"):
        return _width(index, sub, depth + 1) if sub and sub != "UNLINKED" else 0
    if kind == "PACKARRAYDTYPE":
        first, _, last = str(dtype.get("declRange", "")).strip("[]").partition(":")
        try:
            length = abs(int(first) - int(last)) + 1
        except ValueError:
            return 0
        return length * _width(index, sub, depth + 1) if sub and sub != "UNLINKED" else 0
    if kind in ("STRUCTDTYPE", "UNIONDTYPE") and dtype.get("packed"):
        widths = [_width(index, m.get("addr"), depth + 1) for m in dtype.get("membersp", [])]
        if not widths or 0 in widths:
            return 0
        return sum(widths) if kind == "STRUCTDTYPE" else max(widths)
    return 0


def check_core(cfg: VTAConfig, files: Sequence[Path], top: str = TOP_NAME, *,
               include_dirs: Sequence[Path] = ()) -> tuple[Port, ...]:
    """Lint ``files`` and check that module ``top`` has exactly :func:`expected_ports` for ``cfg``; returns its
    ports. Raises :class:`CoreInterfaceError` naming every mismatch at once, or Verilator's errors."""
    lint(files, top, include_dirs=include_dirs)
    ports = read_ports(files, top, include_dirs=include_dirs)
    problems = port_problems(expected_ports(cfg), ports)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise CoreInterfaceError(f"the core {top} ({', '.join(Path(f).name for f in files)}) does not match the core "
                                 f"interface of config {cfg.name} (docs/core-interface.md): {len(problems)} "
                                 f"problem{'s' if len(problems) != 1 else ''}:\n{listed}", problems)
    return ports
