"""Command line of the compiler: ``vta compile MODEL -o FILE`` and the model half of ``vta run MODEL``.

``MODEL`` is a model-zoo name (``resnet18``, ``tiny_cnn``, ... see :func:`.zoo.list_models`), a path to an ONNX
file, or (for ``vta run``) a compiled artefact written by ``vta compile`` (``.vtac``). ONNX models are imported,
quantized on seeded random calibration inputs (``--calib`` samples) and compiled for the config; ``vta run`` then
runs the model on ``--target`` with a seeded random input (or ``--input FILE.npy``), prints the per-layer table of
:mod:`.report` and checks the output against the integer reference (:func:`.qops.run_reference`) bit for bit (exit
code 1 when it differs).

vta/cli.py owns the parser of ``vta run`` and calls :func:`add_run_arguments` and :func:`run_model` lazily.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any

import numpy as np

__all__ = ["register", "add_run_arguments", "run_model", "ARTEFACT_SUFFIX"]

log = logging.getLogger("vta")
ARTEFACT_SUFFIX = ".vtac"


def register(subparsers: Any) -> None:
    """Add ``vta compile`` to the ``vta`` command's subparsers."""
    from vta.cliutil import add_config_option
    p = subparsers.add_parser("compile", help="compile an ONNX model to an accelerator program",
                              description="Import, quantize and compile MODEL (a zoo name or an .onnx file) for a "
                                          "config; write the compiled artefact (accelerator programs + CPU steps) "
                                          "to one file that `vta run FILE` executes.")
    p.add_argument("model", metavar="MODEL", help="a model zoo name (e.g. resnet18) or an .onnx path")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help=f"artefact to write (e.g. model"
                                                                         f"{ARTEFACT_SUFFIX})")
    add_config_option(p)
    _add_model_options(p)
    p.add_argument("--no-double-buffer", action="store_true",
                   help="single-threaded programs: no latency hiding (to measure what it buys)")
    p.set_defaults(func=_cmd_compile)


def _add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", choices=("auto", "accel", "cpu"), default="auto",
                   help="auto: offload where supported and estimated faster; accel: wherever supported; cpu: "
                        "nothing (default: auto)")
    p.add_argument("--force-cpu", metavar="NODE", action="append", default=[],
                   help="keep the named node on the CPU (repeatable)")
    p.add_argument("--batch", type=int, default=None,
                   help="images per inference for a model whose batch dimension is dynamic (default: 1; a fixed "
                        "batch dimension is kept)")
    p.add_argument("--calib", type=int, default=4, help="random calibration samples (default: 4)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options `vta run MODEL` takes on top of vta/cli.py's (``--target``, ``--config``, ``--seed``, ``--json`` and
    ``--no-double-buffer``, which compiles single-threaded programs)."""
    _add_model_options(parser)
    parser.add_argument("--report-json", metavar="FILE", help="write the per-layer report as JSON")
    parser.add_argument("--report-csv", metavar="FILE", help="write the per-layer report as CSV")
    parser.add_argument("--plot", metavar="FILE", help="write a bar chart of cycles or micro-ops per layer (PNG)")
    parser.add_argument("--reasons", action="store_true", help="show why each layer runs where it does")
    parser.add_argument("--no-check", action="store_true", help="skip the bit-exact check against the reference")
    parser.add_argument("--input", metavar="FILE.npy", help="the model's input (a .npy array of its input shape, "
                                                            "float32); default: seeded random normal values")


def _cmd_compile(args: argparse.Namespace) -> int:
    from vta.cliutil import config_from_args

    from .pipeline import compile_model
    cfg = config_from_args(args)
    compiled = compile_model(args.model, cfg, policy=args.policy, force_cpu=args.force_cpu, batch=args.batch,
                             calib=args.calib, double_buffer=not args.no_double_buffer,
                             progress=not args.no_progress)
    compiled.save(args.output)
    print(f"compiled {args.model} for {cfg.name}: {compiled.accel_steps} of {len(compiled.steps)} layers on the "
          f"accelerator, {compiled.compile_seconds:.2f} s; wrote {args.output}")
    return 0


def run_model(args: argparse.Namespace) -> int:
    """`vta run MODEL`: compile (or load) the model, run it on ``args.target``, print the report, check exactness."""
    from vta.cliutil import config_from_args

    from . import qops
    from .pipeline import compile_model
    from .report import build_report
    from .runtime import Compiled, run
    progress = not getattr(args, "no_progress", False)
    if str(args.model).endswith(ARTEFACT_SUFFIX) and os.path.exists(args.model):
        compiled = Compiled.load(args.model)
        if getattr(args, "config", None) and config_from_args(args) != compiled.cfg:
            raise ValueError(f"{args.model} was compiled for {compiled.cfg.name}, not for the --config given")
    else:
        compiled = compile_model(args.model, config_from_args(args), policy=getattr(args, "policy", "auto"),
                                 force_cpu=getattr(args, "force_cpu", []), batch=getattr(args, "batch", None),
                                 calib=getattr(args, "calib", 4), seed=getattr(args, "seed", 0),
                                 double_buffer=not getattr(args, "no_double_buffer", False), progress=progress)
    graph = compiled.graph
    inputs = _inputs_from_args(graph, args)
    start = time.perf_counter()
    out = run(compiled, inputs, target=args.target, progress=progress)
    seconds = time.perf_counter() - start
    report = build_report(compiled, out, model=compiled.meta.get("model", graph.name))
    report.extra["compile_seconds"] = round(compiled.compile_seconds, 3)
    report.extra["run_seconds"] = round(seconds, 3)
    exact = None
    if not getattr(args, "no_check", False):
        ref = qops.run_reference(graph, inputs)
        exact = all(np.array_equal(ref[k], out.outputs[k]) for k in ref)
        report.extra["bit_exact_vs_reference"] = exact
    _write_outputs(report, args)
    if getattr(args, "json", False):
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.format(reasons=getattr(args, "reasons", False)))
    if exact is False:
        log.error("the output differs from the integer reference")
        return 1
    return 0


def _inputs_from_args(graph: Any, args: argparse.Namespace) -> dict[str, np.ndarray]:
    """The ``--input`` array for the model's one input, else seeded random inputs."""
    from .pipeline import random_inputs
    path = getattr(args, "input", None)
    if not path:
        return random_inputs(graph, getattr(args, "seed", 0))
    if len(graph.inputs) != 1:
        raise ValueError(f"--input gives one array but the model takes {len(graph.inputs)} inputs "
                         f"({', '.join(graph.inputs)})")
    name = graph.inputs[0]
    value = np.load(path)
    if value.shape != graph.shape(name):
        raise ValueError(f"--input {path} has shape {value.shape}; the model's input {name!r} has shape "
                         f"{graph.shape(name)}")
    return {name: value.astype(np.float32)}


def _write_outputs(report: Any, args: argparse.Namespace) -> None:
    if getattr(args, "report_json", None):
        report.write_json(args.report_json)
    if getattr(args, "report_csv", None):
        report.write_csv(args.report_csv)
    if getattr(args, "plot", None):
        report.plot(args.plot)
