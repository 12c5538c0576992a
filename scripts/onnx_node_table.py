"""onnx's node test cases for every operator the frontend knows, through the lab's ONNX backend, on each target.

Runs the cases of ``onnx.backend.test.case.node`` whose one node is an operator of the frontend's rules
(:data:`vta.compiler.frontend.onnx_frontend.RULES`) or of the fused operators rewritten before import
(:data:`vta.compiler.frontend.onnx_fused.FUSED_REWRITES`, such as Attention), and their ``_expanded`` function
decompositions, through :class:`vta.compiler.onnx_backend.VtaBackend` as tests/test_onnx_backend.py does (calibrated
on the case's own input, constant inputs frozen to its values), and writes a Markdown table: operator x target ->
passed, refused (the lab's reason), failed (the largest error against onnx's expected output, beyond the int8
tolerance ``2 * s_out + s_in``) or crashed (an error that is not one of the lab's own)::

    python3 scripts/onnx_node_table.py                 # fsim and cpu -> docs/onnx-node-tests.md
    python3 scripts/onnx_node_table.py --tsim -o t.md  # tsim too (builds the Verilator model once)

Prints the totals per target and names the file it wrote.
"""
from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = ROOT / "docs" / "onnx-node-tests.md"


@dataclass(frozen=True)
class Outcome:
    """One case on one target: ``kind`` passed, refused, failed or crashed, and ``detail`` (the reason, the error)."""

    kind: str
    detail: str = ""


def node_cases() -> list[tuple[str, Any]]:
    """(operator, case) for the frontend's operators' node cases, then their ``_expanded`` forms."""
    from onnx.backend.test.loader import load_model_tests

    from vta.compiler.frontend.onnx_frontend import RULES
    from vta.compiler.frontend.onnx_fused import FUSED_REWRITES
    known = set(RULES) | set(FUSED_REWRITES) | {"ConvTranspose", "Col2Im", "LSTM", "GRU", "RNN"}   # rewritten first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = {case.name: case for case in load_model_tests(kind="node")}
    base = [(case.model.graph.node[0].op_type, case) for case in cases.values()
            if len(case.model.graph.node) == 1 and case.model.graph.node[0].op_type in known]
    return base + [(op, cases[case.name + "_expanded"]) for op, case in base if case.name + "_expanded" in cases]


def run_case(case: Any, target: str) -> Outcome:
    """``case`` prepared and run on ``target``, judged as tests/test_onnx_backend.py judges it."""
    from vta.compiler.frontend.onnx_frontend import UnsupportedOperatorError, UnsupportedOpsetError
    from vta.compiler.frontend.quantize import QuantizationError
    from vta.compiler.ir import GraphError
    from vta.compiler.onnx_backend import VtaBackend
    from vta.compiler.pipeline import InputError
    inputs, expected = case.data_sets[0]
    try:
        rep = VtaBackend.prepare(case.model, target)
        outputs = rep.run([np.asarray(_array(v)) for v in inputs])
    except (UnsupportedOperatorError, UnsupportedOpsetError, QuantizationError, GraphError, InputError) as err:
        return Outcome("refused", _one_line(str(err)))
    except Exception as err:  # noqa: BLE001 -- a crash is a result of the table, named by its type
        return Outcome("crashed", _one_line(f"{type(err).__name__}: {err}"))
    worst = ""
    for k, (got, want, s_out) in enumerate(zip(outputs, expected, rep.output_steps)):
        want = _array(want)
        if got.shape != want.shape:
            return Outcome("failed", f"output {k} has shape {list(got.shape)}, expected {list(want.shape)}")
        error = float(np.abs(got.astype(np.float64) - want).max()) if got.size else 0.0
        bound = 2 * s_out + rep.input_step
        if error > bound:
            worst = f"max error {error:.4g} > {bound:.4g} (2 * {s_out:.3g} + {rep.input_step:.3g})"
    return Outcome("failed", worst) if worst else Outcome("passed")


def _revision() -> str:
    """The commit of the code that ran, ``-dirty`` when ``compiler/`` or ``vta/`` differ from it (read-only git)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode:
        return "unknown"
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "compiler", "vta"], cwd=ROOT).returncode
    return head.stdout.strip() + ("-dirty" if dirty else "")


def _array(value: Any) -> np.ndarray:
    import onnx
    from onnx import numpy_helper
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line for a table cell, without the list of supported operators, at most ``limit`` characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Supported operators")]
    short = "; ".join(lines)
    short = short if len(short) <= limit else short[:limit - 3] + "..."
    return short.replace("|", "\\|")


def _cell(outcome: Outcome) -> str:
    return outcome.kind + (f" ({outcome.detail})" if outcome.detail else "")


def _counts(outcomes: list[Outcome]) -> str:
    counts = Counter(o.kind for o in outcomes)
    return ", ".join(f"{counts[kind]} {kind}" for kind in ("passed", "refused", "failed", "crashed") if counts[kind])


def render(results: dict[str, list[tuple[str, str, Outcome]]], targets: list[str], command: str) -> str:
    """The Markdown document: header, totals per target, one summary row per operator, then every case."""
    import onnx
    revision = _revision()
    lines = ["# onnx's node test cases through the lab's ONNX backend", "",
             f"Generated {datetime.date.today().isoformat()} with onnx {onnx.__version__} at revision {revision} by "
             f"`{command}`; do not edit by hand.", "",
             "Each case of `onnx.backend.test.case.node` whose one node is an operator of the frontend (and each "
             "`_expanded` decomposition of such a case) is prepared and run by `vta.compiler.onnx_backend.VtaBackend` "
             "on the target: calibrated on the case's own input, inputs the frontend takes only as constants (weights, "
             "Clip's bounds, Resize's scales...) frozen to the case's values. **passed**: within the int8 tolerance "
             "`max |got - expected| <= 2 * s_out + s_in` (the output's and the largest input's quantization step) of "
             "onnx's expected output; **refused**: one of the lab's own errors, its reason quoted; **failed**: beyond "
             "the tolerance; **crashed**: another exception.", "", "## Totals", "",
             "| target | " + " | ".join(["cases", "passed", "refused", "failed", "crashed"]) + " |",
             "|---|---:|---:|---:|---:|---:|"]
    every = [(target, outcome) for rows in results.values() for _, target, outcome in rows]
    for target in targets:
        counts = Counter(o.kind for t, o in every if t == target)
        lines.append(f"| {target} | {sum(counts.values())} | {counts['passed']} | {counts['refused']} | "
                     f"{counts['failed']} | {counts['crashed']} |")
    lines += ["", "## By operator", "", "| operator | cases | " + " | ".join(targets) + " |",
              "|---|---:|" + "---|" * len(targets)]
    for op in sorted(results):
        rows = results[op]
        per = {t: [o for _, target, o in rows if target == t] for t in targets}
        lines.append(f"| {op} | {len(per[targets[0]])} | " + " | ".join(_counts(per[t]) for t in targets) + " |")
    lines += ["", "## Every case", ""]
    for op in sorted(results):
        lines += [f"### {op}", "", "| case | " + " | ".join(targets) + " |", "|---|" + "---|" * len(targets)]
        names = list(dict.fromkeys(name for name, _, _ in results[op]))
        table = {(name, target): outcome for name, target, outcome in results[op]}
        for name in names:
            lines.append(f"| `{name}` | " + " | ".join(_cell(table[name, t]) for t in targets) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tsim", action="store_true", help="run on tsim too (the Verilator RTL simulation)")
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="the Markdown file to write "
                        "(default docs/onnx-node-tests.md)")
    args = parser.parse_args(argv)
    from vta.fileio import atomic_write_text
    targets = ["fsim", "cpu"] + (["tsim"] if args.tsim else [])
    results: dict[str, list[tuple[str, str, Outcome]]] = {}
    for op, case in node_cases():
        for target in targets:
            results.setdefault(op, []).append((case.name, target, run_case(case, target)))
    command = "python3 scripts/onnx_node_table.py" + (" --tsim" if args.tsim else "") + \
        ("" if args.output == DEFAULT_OUTPUT else f" -o {args.output}")
    atomic_write_text(args.output, render(results, targets, command) + "\n")
    every = [(target, outcome) for rows in results.values() for _, target, outcome in rows]
    for target in targets:
        print(f"{target}: {_counts([o for t, o in every if t == target])}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
