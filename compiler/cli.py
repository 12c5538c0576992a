"""Command line of the compiler: ``vta compile MODEL -o FILE`` and the model half of ``vta run MODEL``.

``MODEL`` is a model-zoo name (``resnet18``, ``tiny_cnn``, ... see :func:`.zoo.list_models`), a path to an ONNX
file, or (for ``vta run``) a compiled artefact written by ``vta compile`` (``.vtac``). ONNX models are imported,
quantized on the user's data (``--calibration FILE.npz|DIR``, :mod:`.frontend.calibration`) or, with a loud warning,
on seeded random inputs (``--calib`` samples), and compiled for the config; ``vta run`` then runs the model on
``--target`` with a seeded random input (or ``--input FILE.npy``), prints the per-layer table of :mod:`.report`,
checks the output against the integer reference (:func:`.qops.run_reference`) bit for bit (exit code 1 when it
differs) and states its error against the float model (ONNX Runtime on the ONNX file, else the float reference;
exit code 1 when it exceeds ``--accuracy-budget``).

vta/cli.py owns the parser of ``vta run`` and calls :func:`add_run_arguments` and :func:`run_model` lazily.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import time
from typing import Any, Mapping

import numpy as np

from vta.cliutil import wrote

__all__ = ["register", "add_run_arguments", "add_report_options", "run_model", "compile_options", "ARTEFACT_SUFFIX"]

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
    """The compile options (:class:`.options.CompileOptions`; their defaults are the dataclass's)."""
    from .ir import REQUANT_MODES
    from .lowering.gelu import GELU_MODES
    from .lowering.layernorm import LAYERNORM_MODES
    from .lowering.partition import POLICIES, STEMS
    from .lowering.softmax import SOFTMAX_MODES
    from .options import CompileOptions
    default = CompileOptions()
    p.add_argument("--policy", choices=POLICIES, default=None,
                   help=f"auto: offload where supported and estimated faster; accel: wherever supported; cpu: "
                        f"nothing (default: {default.policy}; the zoo's gpt2_decode: accel, which its run says)")
    p.add_argument("--stem", choices=STEMS, default=default.stem,
                   help="how a first convolution (few channels from the CPU side) is lowered: im2col folds the "
                        "kernel window and channels into the reduction (a 1x1 GEMM, bias in spare lanes), columns "
                        "folds the kernel columns, direct neither; auto: the fastest estimate (default: "
                        "%(default)s)")
    p.add_argument("--requant", choices=REQUANT_MODES, default=default.requant,
                   help="requantization of each layer's int32 results to int8: multiply (an integer multiplier and "
                        "a shift per channel) or shift (power-of-two weight scales per channel, as VTA's TVM stack: "
                        "no multiply, and a linear or conv layer's bias rides in its accumulators' start, so it "
                        "costs K/16 + 4 cycles per output vector instead of K/16 + 6 on the default design; costs "
                        "up to one bit of weight precision per channel; an attention product's output scale moves "
                        "to the power-of-two grid instead: K/16 + 4 instead of K/16 + 5, up to one bit of output "
                        "precision) (default: %(default)s)")
    p.add_argument("--gelu", choices=GELU_MODES, default=default.gelu,
                   help="how a Gelu runs: int: I-BERT's integer GELU (placed on the accelerator's ALU or the CPU "
                        "by the estimates); table: the float-exact table on the CPU; auto: int where the "
                        "partitioner puts it on the accelerator, else the table (default: %(default)s)")
    p.add_argument("--layernorm", choices=LAYERNORM_MODES, default=default.layernorm,
                   help="how a LayerNorm runs: int: the integer LayerNorm (on the ALU of a design with "
                        "lane_reduce, or the CPU, by the estimates); float: computed in float from the int8 input, "
                        "on the CPU; auto: int where the partitioner puts it on the accelerator, else float "
                        "(default: %(default)s)")
    p.add_argument("--softmax", choices=SOFTMAX_MODES, default=default.softmax,
                   help="how a softmax runs: int: the integer Softmax (on the ALU of a design with lane_reduce, or "
                        "the CPU, by the estimates; a softmax with a fused mask or over another axis stays float); "
                        "float: computed in float from the int8 input, on the CPU; auto: int where the partitioner "
                        "puts it on the accelerator, else float (default: %(default)s)")
    p.add_argument("--force-cpu", metavar="NODE", action="append", default=list(default.force_cpu),
                   help="keep the named node on the CPU (repeatable)")
    p.add_argument("--keep-int8", metavar="NODE", action="append", default=list(default.keep_int8),
                   help="on a design with int4 inputs or weights: quantize the named Conv/Dense node with int8 "
                        "weights and run it on the CPU (mixed precision, e.g. the last layer; repeatable; "
                        "docs/precision.md)")
    p.add_argument("--int8-budget", metavar="POINTS", type=float, default=default.int8_budget,
                   help="on a design with int4 inputs or weights: keep the fewest sensitive Conv/Dense layers at "
                        "int8 on the CPU (chosen greedily) so that top-1 agreement with the float model loses at "
                        "most POINTS percentage points, measured on the second half of the calibration samples "
                        "after calibrating on the first; the report lists the layers kept (docs/precision.md)")
    p.add_argument("--batch", type=int, default=default.batch,
                   help="images per inference for a model whose batch dimension is dynamic (default: 1; a fixed "
                        "batch dimension is kept)")
    p.add_argument("--input-shape", metavar="NAME=SHAPE", action="append", default=list(default.input_shapes),
                   type=_input_shape, help="the whole shape of an input whose dimensions beyond the batch are "
                                           "symbolic, e.g. images=1x3x224x224 (repeatable); 0 for a prompt's empty "
                                           "KV cache")
    p.add_argument("--input-value", metavar="NAME=VALUE", action="append", default=list(default.input_values),
                   type=_input_value, help="compile a one-element input as this constant (repeatable), so that an "
                                           "If it decides becomes the branch taken: optimum's merged decoders, "
                                           "use_cache_branch=1 (or 0); read from the --input .npz when not given")
    p.add_argument("--calib", type=int, default=default.calib,
                   help="random calibration samples when no --calibration is given (default: %(default)s)")
    from .frontend.calibration import METHODS, PREPROCESS
    from .frontend.quantize import SCORE_WIDTHS, WEIGHT_ROUNDINGS
    p.add_argument("--calibration", metavar="FILE|DIR", default=default.calibration,
                   help="calibrate on your data: an .npz of named input batches (input name -> array [N, ...] of N "
                        "samples), an .npy of one input's N samples [N, ...], or a folder of .npy files (one sample "
                        "or a batch each; one-input models) or of "
                        "images (.png/.jpg, needs Pillow; NCHW inputs of 1 or 3 channels, see --preprocess). "
                        "Without it the model is calibrated on random normal values and its accuracy on real inputs "
                        "is unknown. A pre-quantized model keeps its own scales; of a partially quantized one, only "
                        "the activations it left float take their ranges from these samples")
    p.add_argument("--preprocess", choices=tuple(PREPROCESS), default=default.preprocess,
                   help="how calibration images become inputs, after a bilinear resize to the input's H x W: "
                        + "; ".join(f"{k}: {v}" for k, v in PREPROCESS.items()) + " (default: %(default)s)")
    p.add_argument("--calibration-method", choices=METHODS, default=default.calibration_method,
                   help="how each tensor's range is chosen from the calibration data: minmax (the largest "
                        "magnitude), percentile (--calibration-percentile of the magnitudes per sample; outliers "
                        "saturate), entropy (the KL-divergence threshold of the magnitudes' histogram, as TensorRT's "
                        "and onnxruntime's Entropy calibrators); weights are always per channel (default: "
                        "%(default)s)")
    p.add_argument("--weight-rounding", choices=WEIGHT_ROUNDINGS, default=default.weight_rounding,
                   help="how weights are rounded to integers: nearest, or gptq (each layer's output error on the "
                        "calibration samples least, same scales; calibration then also measures each layer's input "
                        "moments; EfficientNet-Lite0 needs it, docs/precision.md) (default: %(default)s)")
    p.add_argument("--attention-scores", choices=SCORE_WIDTHS, default=default.attention_scores,
                   help="attention score products (Q.K^T read only by softmaxes): int8 as any MatMul's output, or "
                        "int32, exact into their softmax, on the CPU (the accelerator writes int8); int32 helps "
                        "models whose scores span a wide range (docs/transformers.md) (default: %(default)s)")
    p.add_argument("--calibration-percentile", type=float, default=default.calibration_percentile,
                   metavar="P", help="the percentile of --calibration-method percentile, in [50, 100] (default: "
                                     "%(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` -> ``("NAME", (1, 3, 224, 224))`` (argparse reports the ArgumentTypeError as usage)."""
    name, sep, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or min(shape) < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=SHAPE with dimensions of 0 or more joined by x, e.g. "
                                         f"images=1x3x224x224 (0 only for an input the graph may leave unread, such "
                                         f"as a prompt's empty KV cache past_key_values.0.key=1x8x0x64)")
    return name, shape


def _input_value(text: str) -> tuple[str, float]:
    """``NAME=1`` -> ``("NAME", 1.0)``; ``true``/``false`` are 1 and 0 (argparse reports the ArgumentTypeError as
    usage)."""
    name, sep, value = text.rpartition("=")
    words = {"true": 1.0, "false": 0.0}
    try:
        number = words[value.strip().lower()] if value.strip().lower() in words else float(value)
    except ValueError:
        number = float("nan")
    if not sep or not name or number != number or number in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE with a finite number or true/false, e.g. "
                                         f"use_cache_branch=1")
    return name, number


# option -> (the suffixes it takes, what it writes)
OUTPUT_SUFFIXES = {"--report-json": ((".json",), "a JSON report"), "--report-csv": ((".csv",), "a CSV report"),
                   "--plot": ((".png", ".svg", ".pdf"), "a plot"), "-o": ((ARTEFACT_SUFFIX,), "a compiled artefact"),
                   "--output": ((".npz",), "the model's outputs"), "--html": ((".html",), "an HTML report")}


def check_output_path(option: str, path: str) -> None:
    """Before any work: ``path`` (given to ``option``) has a suffix ``option`` writes, is not a folder, and its folder
    exists and is writable (:func:`vta.cliutil.check_output_folder`); else a :class:`~vta.cliutil.CliError` (exit 2)
    saying which."""
    from vta.cliutil import CliError, check_output_folder
    suffixes, what = OUTPUT_SUFFIXES[option]
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in suffixes:
        choices = suffixes[0] if len(suffixes) == 1 else ", ".join(suffixes[:-1]) + " or " + suffixes[-1]
        raise CliError(f"{option} {path}: {what} is written as {choices}, not {suffix or 'a file without suffix'}")
    check_output_folder(option, path, suffix)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CliError(f"{option} {path}: the file exists and is not writable")


def compile_options(args: argparse.Namespace) -> Any:
    """The :class:`.options.CompileOptions` of parsed arguments, checked: a CliError for a batch or a calibration
    count below 1, or an input given two shapes."""
    from vta.cliutil import CliError

    from .options import CompileOptions
    options = CompileOptions.from_args(_with_policy(args))
    if options.batch is not None and options.batch < 1:
        raise CliError(f"--batch must be at least 1 (images per inference), not {options.batch}")
    if options.calib < 1:
        raise CliError(f"--calib must be at least 1 (calibration samples), not {options.calib}")
    if options.calibration and not os.path.exists(options.calibration):
        raise CliError(f"--calibration {options.calibration}: no such file or folder")
    return options


def _with_policy(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``policy`` set when ``--policy`` was not given: the zoo model's own (:func:`.frontend.zoo.
    default_policy`, said on stderr) or the default ``auto``."""
    if getattr(args, "policy", "auto") is not None:
        return args
    from .frontend.zoo import default_policy
    from .options import CompileOptions
    own = default_policy(str(getattr(args, "model", "")))
    policy = own[0] if own else CompileOptions.policy
    if own:
        print(f"policy {own[0]}: the zoo's default for {args.model}, as {own[1]}; --policy auto gives the "
              f"estimates' choice", file=sys.stderr)
    return argparse.Namespace(**{**vars(args), "policy": policy})


_COMPILE_FLAGS = {"policy": "--policy", "stem": "--stem", "requant": "--requant", "force_cpu": "--force-cpu",
                  "batch": "--batch", "calib": "--calib", "input_shapes": "--input-shape",
                  "input_values": "--input-value", "calibration": "--calibration", "preprocess": "--preprocess",
                  "calibration_method": "--calibration-method", "calibration_percentile": "--calibration-percentile",
                  "keep_int8": "--keep-int8", "gelu": "--gelu", "layernorm": "--layernorm",
                  "softmax": "--softmax",
                  "weight_rounding": "--weight-rounding",
                  "int8_budget": "--int8-budget", "attention_scores": "--attention-scores"}
"""CompileOptions field -> its option; the ones `vta run MODEL.vtac` refuses (the artefact fixed them)."""


def _refuse_compile_options(args: argparse.Namespace, options: Any) -> None:
    """`vta run MODEL.vtac` with a compile option changed from its default: a CliError naming it (the artefact was
    compiled already, with its own choices; ignoring the option silently would report a run not asked for)."""
    from vta.cliutil import CliError
    changed = options.changed()
    given = [flag for name, flag in _COMPILE_FLAGS.items() if name in changed]
    if given:
        raise CliError(f"{', '.join(given)} {'is a compile option' if len(given) == 1 else 'are compile options'}: "
                       f"{args.model} was compiled already with its own; compile again (vta compile MODEL "
                       f"{given[0]} ... -o FILE.vtac) or run the model by name")


def check_clock(args: argparse.Namespace) -> None:
    """``--clock-mhz`` must be a clock the config accepts (:data:`vta.config.CLOCK_MHZ_RANGE`); CliError otherwise
    (the one check every command with the option makes: :func:`vta.cliutil.clock_option`)."""
    from vta.cliutil import clock_option
    clock_option(args)


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """The options that write or show a run report (``vta run MODEL`` and ``vta report``): ``--report-json``,
    ``--report-csv``, ``--plot``, ``--html`` (suffixes checked by :data:`OUTPUT_SUFFIXES`), ``--reasons`` and
    ``--wide``."""
    parser.add_argument("--report-json", metavar="FILE", help="write the per-layer report as JSON")
    parser.add_argument("--report-csv", metavar="FILE", help="write the per-layer report as CSV")
    parser.add_argument("--plot", metavar="FILE", help="write per-layer stacked bars of where cycles and energy went "
                                                      "(.png, .svg or .pdf) and the roofline beside it (FILE_roofline)")
    parser.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page (opens "
                                                      "offline): sortable layer table, cycles per module, roofline, "
                                                      "energy, accuracy, config")
    parser.add_argument("--clock-mhz", type=float, metavar="MHZ", default=None,
                        help="give times at this clock (default: the design's own: its cached vta hw timing "
                             "result, else the clock model; a config's CLOCK_MHZ other than 100 counts as given)")
    parser.add_argument("--reasons", action="store_true", help="show why each layer runs where it does")
    parser.add_argument("--wide", action="store_true", help="every column of the per-layer table (input shapes, "
                                                            "micro-ops, whole names); default: fits 120 columns")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options `vta run MODEL` takes on top of vta/cli.py's (``--target``, ``--config``, ``--seed``, ``--json`` and
    ``--no-double-buffer``, which compiles single-threaded programs)."""
    _add_model_options(parser)
    add_report_options(parser)
    parser.add_argument("--no-check", action="store_true", help="skip the bit-exact check against the reference")
    parser.add_argument("--input", metavar="FILE.npy|FILE.npz",
                        help="the model's input (a .npy array of its input shape, float32), or every input by name "
                             "(an .npz; e.g. a decode step's input_ids and past.N.key/value, or a diffusion UNet's "
                             "sample, timestep and encoder_hidden_states); default: seeded random values (token ids "
                             "uniform over the embedding table, integer timesteps in [0, 1000), floats standard "
                             "normal)")
    parser.add_argument("--output", metavar="FILE.npz", help="save the model's outputs (output name -> array)")
    parser.add_argument("--accuracy-budget", metavar="BUDGET",
                        help="fail the run (exit 1) when its error against the float model exceeds BUDGET: a number "
                             "X (or X%%) bounds the largest error as %% of the float output's range; cosine>=V, "
                             "top1>=V or top5>=V (V in [0, 1]) bound the cosine similarity or the top-1/top-5 "
                             "agreement from below")
    from vta.backend import FALLBACKS

    from .options import RunOptions
    parser.add_argument("--fallback", choices=FALLBACKS, default=RunOptions.fallback,
                        help="where layers the accelerator does not run go: cpu (the llvmlite kernels), gpu (the GPU "
                             "kernels on a CUDA device), auto (gpu when a device is present, else cpu; decided by "
                             "vta.backend.choose_fallback) (default: %(default)s)")
    parser.add_argument("--emulate-gpu", action="store_true",
                        help="with --fallback gpu or --target gpu: run the GPU kernels in the SIMT emulator on the "
                             "CPU (needed where there is no CUDA device)")


def _cmd_compile(args: argparse.Namespace) -> int:
    from vta.cliutil import config_from_args

    from .pipeline import calibration_set, check_force_cpu, compile_model, load_graph
    check_output_path("-o", args.output)
    options = compile_options(args)
    cfg = config_from_args(args)
    graph = load_graph(args.model, batch=options.batch, input_shapes=options.input_shape_map(),
                       input_values=options.input_value_map() or None)
    check_force_cpu(graph, options.force_cpu)
    calibration = None if not _calibrates(graph) else calibration_set(args.model, graph, options)  # QDQ: none
    _warn_random_calibration(calibration.info if calibration else {})
    compiled = compile_model(args.model, cfg, options, graph=graph, calibration=calibration)
    compiled.save(args.output)
    print(f"compiled {args.model} for {cfg.name}: {compiled.accel_steps} of {len(compiled.steps)} layers on the "
          f"accelerator; quantization (calibration included) {compiled.frontend_seconds or 0.0:.2f} s, lowering "
          f"{compiled.compile_seconds or 0.0:.2f} s")
    print(wrote(args.output, "compiled model"))
    return 0


def run_model(args: argparse.Namespace) -> int:
    """`vta run MODEL`: compile (or load) the model, run it on ``args.target``, print the report, check exactness."""
    from vta.backend import choose_fallback
    from vta.cliutil import config_from_args
    from vta.clock import design_clock

    from . import qops
    from .options import RunOptions
    from .pipeline import calibration_set, check_force_cpu, compile_model
    from .report import budget_failure, build_report, parse_budget
    from .runtime.compiled import Compiled
    from .runtime.executor import run
    for option, attr in (("--report-json", "report_json"), ("--report-csv", "report_csv"), ("--plot", "plot"),
                         ("--html", "html"), ("--output", "output")):
        if getattr(args, attr, None):
            check_output_path(option, getattr(args, attr))
    copts, ropts = compile_options(args), RunOptions.from_args(args)
    check_clock(args)
    if ropts.accuracy_budget is not None:
        parse_budget(ropts.accuracy_budget)  # a bad budget is bad input: refused before any work
    choice = choose_fallback(ropts.target, ropts.fallback, emulate_gpu=ropts.emulate_gpu)
    if str(args.model).endswith(ARTEFACT_SUFFIX) and os.path.exists(args.model):
        _refuse_compile_options(args, copts)
        compiled = Compiled.load(args.model)
        if getattr(args, "config", None) and config_from_args(args) != compiled.cfg:
            raise ValueError(f"{args.model} was compiled for {compiled.cfg.name}, not for the --config given")
        inputs = _inputs(compiled.graph, ropts, copts.seed, compiled.meta.get("input_values"))
        float_graph = None
        _warn_random_calibration(compiled.meta.get("calibration", {}))
    else:
        cfg = config_from_args(args)
        float_graph, copts = _load_for_input(args.model, copts, ropts.input)
        check_force_cpu(float_graph, copts.force_cpu)
        inputs = _inputs(float_graph, ropts, copts.seed, copts.input_value_map())  # checked before the compile
        calibration = None if not _calibrates(float_graph) else calibration_set(args.model, float_graph, copts)
        _warn_random_calibration(calibration.info if calibration else {})
        compiled = compile_model(args.model, cfg, copts, graph=float_graph, calibration=calibration)
    graph = compiled.graph
    start = time.perf_counter()
    options = dict(getattr(args, "rtl_options", None) or {})  # vta run --rtl: a foreign core (generator, sources)
    if ropts.max_cycles is not None:  # vta run --max-cycles N (tsim), checked by vta.cli
        options["max_cycles"] = ropts.max_cycles
    out = run(compiled, inputs, target=ropts.target, progress=copts.progress,
              backend_options=options or choice.target_options, fallback=choice.fallback)
    seconds = time.perf_counter() - start
    report = build_report(compiled, out, model=compiled.meta.get("model", graph.name),
                          clock=design_clock(compiled.cfg, args.clock_mhz))
    if "requant" in compiled.meta:  # artefacts compiled before the option existed do not record it
        report.extra["requant"] = compiled.meta["requant"]
    if "quantization" in compiled.meta:  # a pre-quantized file: its own scales (and what the lab quantized of it)
        report.extra["quantization"] = compiled.meta["quantization"]
    wide = [n.name for n in compiled.graph.nodes if n.op == "QMatMulWide"]
    if wide:
        report.extra["attention_scores"] = f"int32, exact into their softmax, on the CPU ({len(wide)} products)"
    if compiled.compile_seconds is not None:  # compiled in this run, not loaded from a .vtac
        report.extra["quantize_seconds"] = round(compiled.frontend_seconds or 0.0, 3)   # calibration included
        report.extra["compile_seconds"] = round(compiled.compile_seconds, 3)
    report.extra["run_seconds"] = round(seconds, 3)
    if out.setup_seconds >= 0.01:  # tsim's Verilator build or cache load, apart from every layer's host ms
        report.extra["build_seconds"] = round(out.setup_seconds, 2)
    if choice.note:
        report.extra["fallback"] = choice.note
    if options.get("generator") is not None:  # vta run --rtl: the report names the foreign core it ran on
        report.extra["rtl_core"] = str(options["generator"])
    exact = None
    if ropts.check:
        ref = qops.run_reference(graph, inputs)
        exact = all(np.array_equal(ref[k], out.outputs[k]) for k in ref)
        report.extra["matches_integer_reference"] = exact
    report.extra["accuracy"] = _accuracy(args.model, compiled, float_graph, inputs, out.outputs,
                                         dict(copts.input_shapes))
    report.extra.update(_transformer_figures(compiled.meta.get("model", args.model), compiled, report))
    if "calibration" in compiled.meta:  # artefacts compiled before calibration was recorded do not say
        report.extra["calibration"] = compiled.meta["calibration"]
    if "int8_budget" in compiled.meta:  # --int8-budget: the layers it kept at int8 and their CPU time
        int8 = dict(compiled.meta["int8_budget"])
        int8["cpu_us_of_kept"] = round(sum(compiled.decisions[n].cpu_us or 0.0 for n in int8["kept"]
                                           if n in compiled.decisions), 3)
        report.extra["int8_budget"] = int8
    written = _write_outputs(report, args)
    if ropts.output:
        _save_outputs(ropts.output, out.outputs)
        written.append(wrote(ropts.output, f"the outputs {', '.join(out.outputs)}"))
    if getattr(args, "json", False):
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(report.format(reasons=ropts.reasons, wide=getattr(args, "wide", False)))
    for line in written:  # every file written, named (on standard error with --json, which keeps stdout JSON)
        print(line, file=sys.stderr if getattr(args, "json", False) else sys.stdout)
    if exact is False:
        log.error("the output differs from the integer reference")
        return 1
    failure = budget_failure(report.extra["accuracy"], ropts.accuracy_budget) if ropts.accuracy_budget else None
    if failure:
        from vta.cliutil import CliError
        raise CliError(failure, 1)
    return 0


def _calibrates(graph: Any) -> bool:
    """Whether compiling ``graph`` reads calibration samples: not for a pre-quantized model, nor for a partially
    quantized one whose float islands are weights only (:attr:`.ir.Graph.partial`)."""
    return not graph.is_quantized and not (graph.partial is not None and not graph.partial.needs_ranges)


def _warn_random_calibration(info: dict[str, Any]) -> None:
    """One loud line on standard error when the model was calibrated on random values rather than data."""
    if info.get("source") == "random normal":
        print(f"vta: warning: calibrated on {info.get('samples')} samples of RANDOM normal data (no --calibration): "
              f"the quantization ranges fit random inputs, so the accuracy figures mean nothing for real inputs; "
              f"give --calibration FILE.npz|DIR with samples of your data", file=sys.stderr)


def _accuracy(model: str, compiled: Any, float_graph: Any, inputs: dict[str, np.ndarray],
              outputs: dict[str, np.ndarray], declared: Mapping[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """The run's error against the float model: ONNX Runtime on the ONNX file or zoo model when installed, else the
    float reference on the float graph (:func:`.frontend.quantize.float_outputs`); ``{"reference": which,
    "outputs": {name: metrics}}``, and ``"where_lost"`` (:func:`.frontend.quantize.error_sources`: the layers that
    lose most cosine against the float graph) when an output's cosine is below ``LOSS_REPORT_BELOW``. For an artefact
    (.vtac) the float model is its recorded model, when found."""
    from .frontend import zoo
    from .frontend.quantize import LOSS_REPORT_BELOW, accuracy_vs_float, error_sources, float_outputs, output_scale
    from .pipeline import load_graph
    source = compiled.meta.get("model", model)
    path = source if os.path.isfile(source) and source.endswith(".onnx") else \
        zoo.get_model(source) if source in zoo.list_models() else None
    if float_graph is None:
        if path is None:
            return {"reference": f"none (the float model {source} of this artefact is not at hand)", "outputs": {}}
        first = compiled.graph.inputs[0]              # the shapes it was compiled for (dynamic axes fixed then)
        float_graph = load_graph(os.fspath(path), batch=compiled.graph.shape(first)[0],
                                 input_shapes={name: compiled.graph.shape(name) for name in compiled.graph.inputs},
                                 input_values=compiled.meta.get("input_values"))
    ref, which = float_outputs(path, float_graph, inputs, declared, compiled.meta.get("input_values"))
    if not ref:
        return {"reference": which, "outputs": {}}
    refused = which.partition(" (")[2]
    kind = "the zoo model " if source in zoo.list_models() else "the quantized file " if _quantized_file(path) else ""
    which = f"{which} on {kind}{source}" if which == "onnxruntime" else \
        f"the lab's float reference on the float graph of {source}" + (f" ({refused}" if refused else "")
    on_file = kind == "the quantized file " and which.startswith("onnxruntime")
    broken = _nonfinite_scales(path) if on_file else []
    plain = _dequantized_outputs(path, compiled.graph, inputs, declared, compiled.meta.get("input_values")) \
        if broken else None
    if plain is not None:                  # onnxruntime's run of the file is NaN from those tensors on: not the model
        ref = plain
        named = ", ".join(map(repr, broken[:2])) + (f" and {len(broken) - 2} more" if len(broken) > 2 else "")
        which = (f"onnxruntime on the dequantized float graph of {source}, not on the quantized file: its quantizer "
                 f"gave {named} an infinite scale, which onnxruntime's run of the file turns into NaN")
    result: dict[str, Any] = {
        "reference": which,
        "outputs": {name: accuracy_vs_float(ref[name], outputs[name], output_scale(compiled.graph, name))
                    for name in compiled.graph.outputs}}
    if on_file and plain is None:
        own = _file_own_error(path, compiled.graph, inputs, ref, declared, compiled.meta.get("input_values"))
        if own:
            result["file_own_cosine"] = own
    found = _kept_tokens(compiled.graph, inputs)
    if found is not None:
        # The output's rows at the mask's positions, and the text says just that: an encoder-decoder's decoder rows
        # may have the mask's shape too, though the mask is the encoder's.
        mask, kept = found
        for name, metrics in result["outputs"].items():
            want, got = np.asarray(ref[name]), np.asarray(outputs[name])
            if want.shape[:2] == kept.shape and got.shape == want.shape and not kept.all() and kept.any():
                rows = accuracy_vs_float(want[kept], got[kept], output_scale(compiled.graph, name))
                metrics["kept_tokens"] = {"mask": mask, "tokens": int(kept.sum()), "of": int(kept.size),
                                          **{k: v for k, v in rows.items() if not k.startswith("top")}}
    worst = min((m["cosine"] for m in result["outputs"].values() if m.get("cosine") is not None), default=1.0)
    if worst < LOSS_REPORT_BELOW and not float_graph.is_quantized and "quantization" not in compiled.meta:
        result["where_lost"] = error_sources(float_graph, compiled.graph, inputs)
    return result


def _nonfinite_scales(path: Any) -> list[str]:
    """The tensors of the pre-quantized ONNX file ``path`` that a QuantizeLinear quantizes at a scale holding inf or
    NaN, and the scales of that kind a QOperator node reads (onnxruntime's quantizer writes inf where its calibration
    saw an infinite value: an attention mask's -inf).
    onnxruntime dequantizes such a tensor to NaN (``(q - zp) * inf``), so its run of the file is not the model from
    there on. Empty when there are none or the file cannot be read."""
    import onnx
    from onnx import numpy_helper
    try:
        proto = onnx.load(os.fspath(path), load_external_data=False)
        scales = {init.name: init for init in proto.graph.initializer if init.data_type in
                  (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
                  and not init.external_data and int(np.prod(init.dims)) <= 4096}
        def infinite(name: str) -> bool:
            return name in scales and not np.isfinite(numpy_helper.to_array(scales[name])).all()
        named = [node.input[0] if node.op_type == "QuantizeLinear" else scale   # a QOperator node: its scale
                 for node in proto.graph.node
                 if node.op_type in ("QuantizeLinear", "QGemm") or node.op_type.startswith("QLinear")
                 for scale in node.input[1:] if infinite(scale)]
        return list(dict.fromkeys(named))
    except Exception:  # noqa: BLE001 - a file onnx cannot read was not measured against anyway
        return []


def _dequantized_outputs(path: Any, graph: Any, inputs: dict[str, np.ndarray],
                         declared: Mapping[str, tuple[int, ...]] | None, values: Any) -> dict[str, np.ndarray] | None:
    """onnxruntime's outputs of the pre-quantized file ``path``'s own float computation (its dequantized float graph,
    :func:`.frontend.dequantize.qdq_to_float`) on ``inputs``, by output name; None when the file cannot be
    dequantized or onnxruntime refuses the result."""
    import onnx

    from .frontend.dequantize import qdq_to_float
    from .frontend.onnx_frontend import file_conventions
    from .frontend.prequant import normalized
    from .frontend.quantize import float_outputs
    try:
        proto = onnx.load(os.fspath(path))
        file_conventions(proto)           # read as the import reads it (an input's default is not a constant)
        plain = qdq_to_float(normalized(proto))
        if plain is None:
            return None
        floats, how = float_outputs(plain, graph, inputs, declared, values)
    except Exception:  # noqa: BLE001 - a file the dequantizer or onnxruntime cannot take: no such figure
        return None
    return floats if how == "onnxruntime" else None


def _file_own_error(path: Any, graph: Any, inputs: dict[str, np.ndarray], ref: Mapping[str, np.ndarray],
                    declared: Mapping[str, tuple[int, ...]] | None, values: Any) -> dict[str, float]:
    """How far onnxruntime on the pre-quantized file ``path`` (``ref``, by output name) is from the file's own float
    computation (its dequantized float graph, :func:`_dequantized_outputs`): the cosine per output, so the run's
    figure against the file can be read against the file's own quantization error. Empty when the file cannot be
    dequantized or onnxruntime refuses the result."""
    from .frontend.quantize import accuracy_vs_float
    floats = _dequantized_outputs(path, graph, inputs, declared, values)
    if floats is None:
        return {}
    cosines = {name: accuracy_vs_float(floats[name], ref[name], None)["cosine"]
               for name in ref if name in floats and np.shape(floats[name]) == np.shape(ref[name])}
    return {name: float(c) for name, c in cosines.items() if c is not None}


def _kept_tokens(graph: Any, inputs: dict[str, np.ndarray]) -> tuple[str, np.ndarray] | None:
    """The run's attention mask and where it is 1 (``[batch, tokens]``, bool): the one input that
    :func:`.frontend.masks.is_mask_input` takes for a runtime mask, when it holds 0s and 1s; None when there is none
    (or several)."""
    from .frontend.masks import is_mask_input
    masks = [name for name in graph.inputs if is_mask_input(graph, name)]
    if len(masks) != 1:
        return None
    value = np.asarray(inputs.get(masks[0]))
    if value.ndim != 2 or not np.isin(value, (0, 1)).all():
        return None
    return masks[0], value.astype(bool)


def _quantized_file(path: Any) -> bool:
    """Whether the ONNX file ``path`` is pre-quantized (so onnxruntime on it is the quantized model, not a float
    one)."""
    if path is None:
        return False
    import onnx

    from .frontend.prequant import is_quantized_model
    try:
        return is_quantized_model(onnx.load(os.fspath(path), load_external_data=False))
    except Exception:  # noqa: BLE001 - a file onnx cannot read was not measured against anyway
        return False


def _transformer_figures(model: str, compiled: Any, report: Any) -> dict[str, str]:
    """Report lines for a model of token ids: ``tokens_per_s`` at the design's clock (the report's inferences per
    second times the tokens of one inference: 128 for a prefill, 1 for a decode step); for a mixture-of-experts
    model, ``moe``: its top-k choices and the experts' dense linear layers (:mod:`.frontend.moe`); for a zoo model
    with a labelled test set (``vit_digits``), ``test_accuracy``: float and int8 top-1 on it
    (:func:`.zoo.test_accuracy`)."""
    from .frontend import zoo
    from .pipeline import token_range
    graph = compiled.graph
    lines = {}
    ids = [name for name in graph.inputs if token_range(graph, name) is not None]
    totals = report.totals
    cycles, kind = (totals["cycles"], "measured") if totals["cycles"] else (totals["predicted"], "predicted")
    if ids and cycles:
        tokens = int(np.prod(graph.shape(ids[0])))
        lines["tokens_per_s"] = (f"{tokens * report.clock_mhz * 1e6 / cycles:,.1f} ({tokens} token(s) per inference "
                                 f"of {ids[0]} {list(graph.shape(ids[0]))} in {cycles:,} {kind} accelerator cycles "
                                 f"at {report.clock_mhz:.4g} MHz; the layers on the CPU fallback not counted)")
    routers = [n for n in graph.nodes if n.op == "TopKOneHot"]
    expert_rows = [r for r in report.rows if re.search(r"/expert\d+$", str(r.get("layer", "")))]
    if routers and expert_rows:
        experts = max(graph.shape(n.inputs[0])[-1] for n in routers)
        macs = sum(int(r["macs"] or 0) for r in expert_rows)
        on_accel = sum(r["where"] == "accel" for r in expert_rows)
        lines["moe"] = (f"{len(routers)} top-k choice(s) (TopKOneHot, on the CPU, on int8 scores); the experts' "
                        f"{len(expert_rows)} linear layers ({on_accel} on the accelerator) run dense over every "
                        f"routed row: {macs:,} MACs, {experts} times what a dispatch of each row to its own expert "
                        f"alone would do (the instructions are static; see docs/transformers.md)")
    found = zoo.test_accuracy(model, graph) if model in zoo.list_models() else None
    if found is not None:
        lines["test_accuracy"] = (f"float {found['float']:.2f}%, int8 {found['int8']:.2f}% top-1 on "
                                  f"{found['images']} images ({found['source']}; float: {found['float_reference']}, "
                                  f"int8: the integer reference, which the accelerator's outputs match); the two "
                                  f"agree on {found['agreement']:.2f}% of them")
    return lines


def _save_outputs(path: str, outputs: dict[str, np.ndarray]) -> None:
    """``--output FILE.npz``: the outputs by name, written atomically."""
    from vta.fileio import atomic_path
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **outputs)  # type: ignore[arg-type]  # numpy's stub types allow_pickle, not **arrays


def _load_for_input(model: str, copts: Any, data: str | None) -> tuple[Any, Any]:
    """The float graph of ``model`` (:func:`.pipeline.load_graph`) and the compile options it was loaded with. When
    ``data`` (``--input``) is an .npz: the one-element arrays of the inputs that decide an If (:func:`_if_inputs`)
    and no ``--input-value`` gives become ``input_values``; when an input has dynamic dimensions that no
    ``--input-shape`` gives, the shapes of its arrays for the inputs not given are used. Each said on stderr."""
    from .frontend.onnx_frontend import DynamicShapeError
    from .pipeline import load_graph, read_npz_shapes
    npz = bool(data) and str(data).lower().endswith(".npz") and os.path.isfile(str(data))
    deciding = _if_inputs(model) - set(copts.input_value_map()) if npz else set()
    if deciding:
        with np.load(str(data), allow_pickle=False) as arrays:
            found = {name: float(np.asarray(arrays[name]).reshape(-1)[0]) for name in sorted(deciding)
                     if name in arrays.files and np.asarray(arrays[name]).size == 1
                     and np.asarray(arrays[name]).dtype.kind in "biuf"}
        if found:
            print(f"input values from --input {data}: " + ", ".join(f"{k}={v:g}" for k, v in found.items()) +
                  " (each decides an If, compiled as the branch taken)", file=sys.stderr)
            copts = dataclasses.replace(copts, input_values=copts.input_values + tuple(found.items()))
    given, values = copts.input_shape_map(), copts.input_value_map() or None
    try:
        return load_graph(model, batch=copts.batch, input_shapes=given, input_values=values), copts
    except DynamicShapeError:
        if not npz:
            raise
        shapes = {name: shape for name, shape in read_npz_shapes(str(data)).items()
                  if name not in given and name not in (values or {})}
    print(f"input shapes from --input {data}: " + ", ".join(f"{name}={'x'.join(map(str, shape))}"
                                                            for name, shape in shapes.items()), file=sys.stderr)
    return load_graph(model, batch=copts.batch, input_shapes={**given, **shapes}, input_values=values), copts


def _if_inputs(model: str) -> set[str]:
    """The graph inputs of the ONNX file ``model`` that an If node reads as its condition (optimum's merged
    decoders' ``use_cache_branch``); none for a zoo name or a file that does not load."""
    if not os.path.isfile(model) or not model.lower().endswith(".onnx"):
        return set()
    import onnx
    try:
        graph = onnx.load(model, load_external_data=False).graph
    except Exception:  # noqa: BLE001 - the import names what is wrong with the file
        return set()
    inits = {i.name for i in graph.initializer}
    inputs = {vi.name for vi in graph.input if vi.name not in inits}
    return {n.input[0] for n in graph.node if n.op_type == "If" and n.input and n.input[0] in inputs}


def _inputs(graph: Any, options: Any, seed: int, fixed: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """The ``--input`` arrays (an .npy for a model's one input, an .npz by name; checked: numeric, their shapes,
    finite, token ids in range; an array for an input compiled as a constant, in ``fixed``, holds that value), else
    random inputs seeded ``seed``."""
    from .pipeline import load_input, random_inputs
    if not options.input:
        return random_inputs(graph, seed)
    return load_input(graph, options.input, fixed)


def _write_outputs(report: Any, args: argparse.Namespace) -> list[str]:
    """Write the ``--report-json``, ``--report-csv``, ``--plot`` and ``--html`` files; returns one ``wrote ...`` line
    each."""
    written = []
    if getattr(args, "report_json", None):
        report.write_json(args.report_json)
        written.append(wrote(args.report_json, "per-layer report, JSON"))
    if getattr(args, "report_csv", None):
        report.write_csv(args.report_csv)
        written.append(wrote(args.report_csv, "per-layer report, CSV"))
    if getattr(args, "plot", None):
        from .report import roofline_path
        report.plot(args.plot)
        report.plot_roofline(roofline_path(args.plot))
        written.append(wrote(args.plot, "per-layer plot"))
        written.append(wrote(roofline_path(args.plot), "roofline plot"))
    if getattr(args, "html", None):
        from .html_report import write_run_html
        write_run_html(report, args.html)
        written.append(wrote(args.html, "HTML report, self-contained"))
    return written
