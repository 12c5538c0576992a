"""The package layering of docs/architecture.md: which package may import which, no import cycles, and every module
importable on its own.

The rule is checked on the source (every ``import`` statement, at module level or inside a function), so a lazy
import does not hide a dependency. Names given to ``importlib`` as strings (the backend registry in
``vta.backend``, the CLI's plug-in table) are the one sanctioned way for a lower floor to reach a higher one.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"vta": ROOT / "vta", "vta.hw": ROOT / "hw", "vta.compiler": ROOT / "compiler", "vta.tsim": ROOT / "tsim",
            "vta.sweep": ROOT / "sweep"}
"""Installed package name -> source folder (pyproject.toml maps hw/, compiler/, tsim/ under vta)."""

GROUND = "vta"
MAY_IMPORT = {
    "vta": {"vta"},
    "vta.hw": {"vta", "vta.hw"},
    "vta.compiler": {"vta", "vta.compiler"},
    "vta.tsim": {"vta", "vta.hw", "vta.tsim"},
    "vta.sweep": {"vta", "vta.compiler", "vta.hw", "vta.tsim", "vta.sweep"},
}
"""Floor -> the floors its modules may import. ``vta.cli``, the one front door, may import every floor."""

FRONT_DOOR = {"vta.cli", "vta.__main__"}


COMPILER_SHARED = {"vta.compiler.ir", "vta.compiler.qops"}
"""The compiler's graph IR and its integer semantics: every part of the compiler may use them."""
COMPILER_PARTS = {
    "vta.compiler.frontend": {"vta.compiler.frontend"},
    "vta.compiler.lowering": {"vta.compiler.lowering"},
    "vta.compiler.kernels": {"vta.compiler.kernels"},
    "vta.compiler.runtime": {"vta.compiler.runtime", "vta.compiler.lowering"},
}
"""A part of the compiler -> the parts it may import besides :data:`COMPILER_SHARED` and the ground floor; the
compiler's top-level modules (pipeline, report, the CLI plug-ins) compose the parts and may import them all."""


def _modules() -> dict[str, Path]:
    """Every module of the project by dotted name (packages as their ``__init__``), sub-packages included."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if not any(name.startswith(other + ".") or name == other
                       for other in PACKAGES if other != package and other.startswith(package + ".")):
                out[name] = path
    return out


def _part(module: str) -> str | None:
    """The part of the compiler ``module`` belongs to (None outside the parts)."""
    return next((part for part in COMPILER_PARTS if module == part or module.startswith(part + ".")), None)


def _floor(module: str) -> str:
    """The package (floor) ``module`` belongs to."""
    for package in sorted(PACKAGES, key=len, reverse=True):
        if module == package or module.startswith(package + "."):
            return package
    raise AssertionError(f"{module} is not a project module")


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that ``module`` imports anywhere in its source."""
    is_package = path.stem == "__init__"
    base = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                anchor = ".".join(parts[:len(parts) - node.level + 1])
                source = f"{anchor}.{node.module}" if node.module else anchor
            else:
                source = node.module or ""
            names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source
                     for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {module: _imports(module, path, known) for module, path in modules.items()}


def test_every_import_follows_the_floor_rule():
    bad = []
    for module, targets in _graph().items():
        if module in FRONT_DOOR:
            continue
        allowed = MAY_IMPORT[_floor(module)]
        bad += [f"{module} imports {target}" for target in sorted(targets) if _floor(target) not in allowed]
        if module != "vta.cli":
            bad += [f"{module} imports the front door vta.cli" for target in targets if target == "vta.cli"]
    assert not bad, "imports that break the layering of docs/architecture.md:\n" + "\n".join(bad)


def test_each_part_of_the_compiler_imports_only_the_parts_it_builds_on():
    graph = _graph()
    parts = {_part(m) for m in graph} - {None}
    assert parts == set(COMPILER_PARTS)
    bad = []
    for module, targets in graph.items():
        part = _part(module)
        if part is None:
            continue
        for target in sorted(targets):
            if _floor(target) != "vta.compiler" or target in COMPILER_SHARED:
                continue
            if _part(target) not in COMPILER_PARTS[part]:
                bad.append(f"{module} imports {target}")
    assert not bad, "compiler parts that reach past the parts they build on (docs/architecture.md):\n" + "\n".join(bad)


def test_there_is_no_import_cycle():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_checker_sees_lazy_and_relative_imports():
    graph = _graph()
    assert "vta.config" in graph["vta.isa"]                  # module-level relative import
    assert "vta.compiler.cli" in graph["vta.cli"]            # an import inside a function
    assert "vta.cliutil" in graph["vta.hw.cli"]
    assert "vta.hw" in graph["vta.tsim.build"] or "vta.hw.verilog" in graph["vta.tsim.build"]
    assert _floor("vta.hw.core") == "vta.hw" and _floor("vta.cli") == "vta"


def test_every_module_imports_on_its_own():
    """Each project module imported first in a clean set of project modules: an import cycle that only bites in
    some import order fails here. Third-party packages stay loaded between modules, which keeps this fast."""
    code = "\n".join([
        "import importlib, sys, traceback",
        f"names = {sorted(_modules())!r}",
        "failed = []",
        "for name in names:",
        "    for loaded in [m for m in sys.modules if m == 'vta' or m.startswith('vta.')]:",
        "        del sys.modules[loaded]",
        "    try:",
        "        importlib.import_module(name)",
        "    except Exception:",
        "        failed.append(name + ':\\n' + traceback.format_exc(limit=3))",
        "print('\\n'.join(failed))",
        "sys.exit(1 if failed else 0)",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"modules that fail to import on their own:\n{result.stdout}{result.stderr}"
