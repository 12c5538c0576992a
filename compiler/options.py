"""The options of a compile and of a model's run, each one frozen dataclass whose field defaults are the only defaults.

:class:`CompileOptions` is everything :func:`.pipeline.compile_model` takes besides the model and the config;
:class:`RunOptions` is what ``vta run MODEL`` takes besides them to run the compiled model. The command line
(:mod:`.cli`) builds each once from its parsed arguments (:meth:`CompileOptions.from_args`,
:meth:`RunOptions.from_args`) and passes it down; its ``--help`` defaults are read from the fields, so no default is
written twice. Scripts and tests may keep calling ``compile_model(model, cfg, policy="accel", calib=2)``: the keywords
build a :class:`CompileOptions`.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from vta.backend import FALLBACKS

__all__ = ["CompileOptions", "RunOptions", "FALLBACKS"]


@dataclass(frozen=True)
class CompileOptions:
    """How a model is imported, quantized and compiled (:func:`.pipeline.compile_model`).

    policy: where nodes run (:data:`.lowering.partition.POLICIES`). force_cpu: node names kept on the CPU.
    batch: images per inference for a model whose batch dimension is dynamic (None: 1; a fixed one is kept).
    input_shapes: (input name, whole shape) pairs for inputs with other dynamic dimensions. input_values: (input
    name, value) pairs making one-element inputs constants, so that the If nodes they decide compile as the branch
    taken (optimum's merged decoders' ``use_cache_branch``). calib: random calibration
    samples (where the zoo has no real images). seed: the calibration samples are seeded ``seed + 1`` (``vta run``'s
    random input ``seed``). double_buffer: two-thread programs (latency hiding); False: single-threaded.
    stem: a first convolution's lowering (:data:`.lowering.partition.STEMS`). requant: ``multiply`` or ``shift``
    (:data:`.ir.REQUANT_MODES`). progress: show progress bars (does not change the artefact).
    calibration: an ``.npz`` of named input batches or a folder of ``.npy`` files or images to calibrate on (None:
    ``calib`` random samples; see :mod:`.frontend.calibration`). preprocess: how images become inputs
    (:data:`.frontend.calibration.PREPROCESS`). calibration_method: minmax, percentile or entropy
    (:data:`.frontend.calibration.METHODS`); calibration_percentile: the percentile method's (in [50, 100]).
    keep_int8: Conv2d/Dense node names quantized with int8 weights on a design with int4 inputs or weights (mixed
    precision; the partitioner runs them on the CPU, see docs/precision.md); nothing on an int8 design.
    gelu: how a Gelu runs (:data:`.lowering.gelu.GELU_MODES`): ``auto`` (I-BERT's integer GELU on the accelerator's
    ALU where the partitioner estimates it faster, else the float table on the CPU), ``int`` or ``table``.
    layernorm: how a LayerNorm runs (:data:`.lowering.layernorm.LAYERNORM_MODES`): ``auto`` (the integer LayerNorm
    on the ALU of a design with ``lane_reduce`` where the partitioner estimates it faster, else the float
    ``QLayerNorm`` on the CPU), ``int`` (the integer node everywhere, on the ALU or the CPU) or ``float``.
    softmax: how a softmax runs (:data:`.lowering.softmax.SOFTMAX_MODES`): ``auto`` (the integer Softmax on the ALU
    of a design with ``lane_reduce`` where the partitioner estimates it faster, else the float ``QSoftmax`` on
    the CPU), ``int`` (the integer node wherever the softmax is over the last axis without a mask) or ``float``.
    weight_rounding: how weights become integers (:data:`.frontend.quantize.WEIGHT_ROUNDINGS`): ``nearest``, or
    ``gptq`` (each layer's output error on the calibration samples least, :mod:`.frontend.gptq`).
    attention_scores: what an attention score product read only by softmaxes becomes
    (:data:`.frontend.quantize.SCORE_WIDTHS`): ``int8`` as any MatMul's output (on the accelerator where it pays), or
    ``int32``, exact, its softmax reading it at the operands' scales (on the CPU: the accelerator writes int8).
    int8_budget: on a design with int4 inputs or weights, percentage points of top-1 agreement with the float model
    the narrow quantization may lose: the fewest sensitive Conv2d/Dense layers (greedily,
    :func:`.frontend.quantize.choose_int8_layers`) are kept at int8 on the CPU, besides ``keep_int8``, to stay within
    it, measured on the calibration samples' second half after calibrating on the first (None: no choice made).
    """

    policy: str = "auto"
    force_cpu: tuple[str, ...] = ()
    batch: int | None = None
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_values: tuple[tuple[str, float], ...] = ()
    calib: int = 4
    seed: int = 0
    double_buffer: bool = True
    stem: str = "auto"
    requant: str = "multiply"
    progress: bool = False
    calibration: str | None = None
    preprocess: str = "imagenet"
    calibration_method: str = "minmax"
    calibration_percentile: float = 99.99
    keep_int8: tuple[str, ...] = ()
    gelu: str = "auto"
    layernorm: str = "auto"
    softmax: str = "auto"
    weight_rounding: str = "nearest"
    int8_budget: float | None = None
    attention_scores: str = "int8"

    def __post_init__(self) -> None:
        from .frontend.calibration import METHODS, PREPROCESS
        from .frontend.quantize import SCORE_WIDTHS, WEIGHT_ROUNDINGS
        from .ir import REQUANT_MODES
        from .lowering.gelu import GELU_MODES
        from .lowering.layernorm import LAYERNORM_MODES
        from .lowering.partition import POLICIES, STEMS
        from .lowering.softmax import SOFTMAX_MODES
        if not 50.0 <= self.calibration_percentile <= 100.0:
            raise ValueError(f"calibration_percentile={self.calibration_percentile} must lie in [50, 100] (a "
                             f"percentile of the magnitudes, e.g. 99.99)")
        if self.int8_budget is not None and not 0.0 <= float(self.int8_budget) <= 100.0:
            raise ValueError(f"int8_budget={self.int8_budget} must lie in [0, 100] (percentage points of top-1 "
                             f"agreement with the float model)")
        if isinstance(self.force_cpu, str):
            raise TypeError(f"force_cpu must be a list of node names, not the string {self.force_cpu!r}")
        object.__setattr__(self, "force_cpu", tuple(self.force_cpu))
        if isinstance(self.keep_int8, str):
            raise TypeError(f"keep_int8 must be a list of node names, not the string {self.keep_int8!r}")
        object.__setattr__(self, "keep_int8", tuple(self.keep_int8))
        shapes = self.input_shapes.items() if isinstance(self.input_shapes, Mapping) else self.input_shapes
        object.__setattr__(self, "input_shapes", tuple((str(n), tuple(int(d) for d in s)) for n, s in shapes))
        values = self.input_values.items() if isinstance(self.input_values, Mapping) else self.input_values
        object.__setattr__(self, "input_values", tuple((str(n), float(v)) for n, v in values))
        for name, value, choices in (("policy", self.policy, POLICIES), ("stem", self.stem, STEMS),
                                     ("requant", self.requant, REQUANT_MODES),
                                     ("preprocess", self.preprocess, tuple(PREPROCESS)),
                                     ("calibration_method", self.calibration_method, METHODS),
                                     ("gelu", self.gelu, GELU_MODES),
                                     ("layernorm", self.layernorm, LAYERNORM_MODES),
                                     ("softmax", self.softmax, SOFTMAX_MODES),
                                     ("weight_rounding", self.weight_rounding, WEIGHT_ROUNDINGS),
                                     ("attention_scores", self.attention_scores, SCORE_WIDTHS)):
            if value not in choices:
                raise ValueError(f"{name}={value!r} is unknown; use one of {', '.join(choices)}")

    @classmethod
    def build(cls, options: "CompileOptions | None" = None, **overrides: Any) -> "CompileOptions":
        """``options`` (default: every default) with the fields named in ``overrides`` replaced; a TypeError naming
        an unknown keyword."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"unknown compile option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the "
                            f"options are {', '.join(f.name for f in dataclasses.fields(cls))}")
        base = options if options is not None else cls()
        if not isinstance(base, cls):
            raise TypeError(f"options must be a CompileOptions, not {type(base).__name__}")
        return dataclasses.replace(base, **overrides) if overrides else base

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "CompileOptions":
        """The options of parsed ``vta compile`` / ``vta run MODEL`` arguments; an option the parser did not define
        keeps its field's default."""
        given: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in _ARG_NAMES and hasattr(args, _ARG_NAMES[f.name]):
                given[f.name] = getattr(args, _ARG_NAMES[f.name])
        if "double_buffer" in given:
            given["double_buffer"] = not given["double_buffer"]
        if "progress" in given:
            given["progress"] = not given["progress"]
        if "input_shapes" in given:
            given["input_shapes"] = _shapes(given["input_shapes"] or [])
        if "input_values" in given:
            given["input_values"] = _values(given["input_values"] or [])
        for name in ("force_cpu", "keep_int8"):
            if given.get(name) is None:
                given.pop(name, None)
        return cls(**given)

    def changed(self) -> list[str]:
        """The fields that differ from their defaults, in field order."""
        default = type(self)()
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(default, f.name)]

    def input_shape_map(self) -> dict[str, tuple[int, ...]]:
        """:attr:`input_shapes` as a dict (what :func:`.pipeline.load_graph` takes)."""
        return dict(self.input_shapes)

    def input_value_map(self) -> dict[str, float]:
        """:attr:`input_values` as a dict (what :func:`.pipeline.load_graph` takes)."""
        return dict(self.input_values)


_ARG_NAMES = {"policy": "policy", "force_cpu": "force_cpu", "batch": "batch", "input_shapes": "input_shape",
              "input_values": "input_value",
              "calib": "calib", "seed": "seed", "double_buffer": "no_double_buffer", "stem": "stem",
              "requant": "requant", "progress": "no_progress", "calibration": "calibration",
              "preprocess": "preprocess", "calibration_method": "calibration_method",
              "calibration_percentile": "calibration_percentile", "keep_int8": "keep_int8",
              "gelu": "gelu", "layernorm": "layernorm", "softmax": "softmax",
              "weight_rounding": "weight_rounding",
              "int8_budget": "int8_budget", "attention_scores": "attention_scores"}
"""CompileOptions field -> the argparse attribute it is read from (``no_*`` flags are negated)."""


def _values(pairs: Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """``--input-value`` pairs, each name once; a CliError naming an input given twice with different values."""
    from vta.cliutil import CliError
    values: dict[str, float] = {}
    for name, value in pairs:
        if name in values and values[name] != value:
            raise CliError(f"--input-value gives input {name!r} twice, as {values[name]:g} and {value:g}")
        values[name] = value
    return tuple(values.items())


def _shapes(pairs: Iterable[tuple[str, tuple[int, ...]]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``--input-shape`` pairs, each name once; a CliError naming an input given twice with different shapes."""
    from vta.cliutil import CliError
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in pairs:
        if name in shapes and shapes[name] != shape:
            raise CliError(f"--input-shape gives input {name!r} twice, as {'x'.join(map(str, shapes[name]))} and "
                           f"{'x'.join(map(str, shape))}")
        shapes[name] = shape
    return tuple(shapes.items())


@dataclass(frozen=True)
class RunOptions:
    """How ``vta run MODEL`` runs a compiled model (:func:`.cli.run_model`).

    target: the backend of the accelerator layers (or of every layer: an operator backend such as ``cpu``).
    fallback: where the other layers go (:data:`FALLBACKS`; resolved by :func:`vta.backend.choose_fallback`).
    emulate_gpu: run the GPU kernels in the SIMT emulator on the CPU. max_cycles: tsim's cycle budget per program
    (None: tsim's own default). check: compare the output with the integer reference bit for bit. input: a ``.npy``
    file of the model's input (None: seeded random values). reasons: show why each layer runs where it does.
    output: an ``.npz`` file to save the outputs in (graph output name -> array). accuracy_budget: the largest
    error against the float model the run accepts (:func:`.report.parse_budget`'s syntax; None: no limit).
    """

    target: str
    fallback: str = "cpu"
    emulate_gpu: bool = False
    max_cycles: int | None = None
    check: bool = True
    input: str | None = None
    reasons: bool = False
    output: str | None = None
    accuracy_budget: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RunOptions":
        """The options of parsed ``vta run MODEL`` arguments; one the parser did not define keeps its default."""
        given: dict[str, Any] = {"target": args.target}
        for name, attr in (("fallback", "fallback"), ("emulate_gpu", "emulate_gpu"), ("max_cycles", "max_cycles"),
                           ("input", "input"), ("reasons", "reasons"), ("output", "output"),
                           ("accuracy_budget", "accuracy_budget")):
            if getattr(args, attr, None) is not None:
                given[name] = getattr(args, attr)
        if hasattr(args, "no_check"):
            given["check"] = not args.no_check
        return cls(**given)
