"""The ``vta`` command line (also ``python -m vta``). Argument parsing and logging setup live here and only here.

Commands::

    vta config show [--config FILE] [--json]   every field, derived value, ISA field width and the canonical name
    vta config check FILE                      validate a config file (exit 2 with every problem listed)
    vta disasm PROGRAM [--raw]                 a saved program (.npz) or a raw instruction binary as text
    vta asm TEXT -o FILE.bin                   assembly text to raw encoded instructions
    vta run [MODEL] [--target NAME]            the built-in GEMM benchmark, a saved program (.npz), or a model
                                               (a zoo name or .onnx file, delegated to vta.compiler.cli.run_model)
    vta hw | compile | tsim ...                groups registered by vta.hw.cli, vta.compiler.cli, vta.tsim.cli

Plug-in groups: a module ``vta.<group>.cli`` with ``register(subparsers)`` adds its sub-parsers and sets
``func=handler`` on each (``handler(args) -> int | None``). It is imported only when its group is the command
given, so ``vta --help`` and ``vta config ...`` never import amaranth, onnx or llvmlite; a group whose module is
missing is simply absent. Plug-ins take a config with :func:`vta.cliutil.add_config_option` and
:func:`vta.cliutil.config_from_args` and raise :class:`vta.cliutil.CliError`; they never import this module.

Exit codes: 0 success; 1 a run failed (simulation error, wrong result); 2 bad input (bad config, bad assembly,
bad file, bad arguments). Library errors print as one message without a traceback unless ``--debug`` is given
(anywhere on the line).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import logging
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from . import __version__
from .cliutil import CliError, add_config_option, clock_option, command_doc, config_from_args, wrote
from .suggest import did_you_mean

__all__ = ["main", "build_parser", "add_config_option", "config_from_args", "CliError"]

log = logging.getLogger("vta")

# group -> (module, one-line help shown by `vta --help` without importing the module)
PLUGINS: dict[str, tuple[str, str]] = {
    "hw": ("vta.hw.cli", "generate the hardware: Verilog, area estimates, timing (vta hw --help)"),
    "compile": ("vta.compiler.cli", "compile an ONNX model to an accelerator program (vta compile --help)"),
    "tsim": ("vta.tsim.cli", "Verilator co-simulation: build, run, trace (vta tsim --help)"),
    "sweep": ("vta.sweep.cli", "design-space sweep: frontier of speed, area and energy (vta sweep --help)"),
    "report": ("vta.compiler.report_cli", "re-render a saved run report or compare two runs (vta report --help)"),
    "conform": ("vta.tsim.conform", "conformance kit: check a foreign core's RTL against fsim (vta conform --help)"),
}


# ---- config ---------------------------------------------------------------------------------------------------------
def _config_facts(cfg: Any) -> dict[str, Any]:
    """Every field, derived value and ISA layout fact of ``cfg`` as plain data (what `config show` prints)."""
    from .config import MEM_NAMES
    from .isa import OPCODE_NAMES, layout
    lay = layout(cfg)
    buffers = {}
    sizes = {"uop": cfg.log_uop_buff_size, "inp": cfg.log_inp_buff_size, "wgt": cfg.log_wgt_buff_size,
             "acc": cfg.log_acc_buff_size, "out": cfg.log_out_buff_size}
    for mem, name in MEM_NAMES.items():
        if name == "acc8":
            continue
        depth = cfg.depth(mem)
        buffers[name] = {"bytes": 1 << sizes[name], "entry_bytes": cfg.elem_bytes(mem), "depth": depth,
                         "index_bits": max(depth - 1, 0).bit_length()}
    isa = {OPCODE_NAMES[op]: {f.name: {"lsb": f.lsb, "msb": f.msb, "width": f.width, "signed": f.signed}
                              for f in fs} for op, fs in sorted(lay.fields.items())}
    isa["UOP"] = {f.name: {"lsb": f.lsb, "msb": f.msb, "width": f.width, "signed": f.signed} for f in lay.uop_fields}
    return {
        "name": cfg.name,
        "fields": _all_fields(cfg),
        "derived": {"batch": cfg.batch, "block_in": cfg.block_in, "block_out": cfg.block_out,
                    "inp_width": cfg.inp_width, "wgt_width": cfg.wgt_width, "acc_width": cfg.acc_width,
                    "out_width": cfg.out_width, "log_out_buff_size": cfg.log_out_buff_size,
                    "macs_per_cycle": cfg.macs_per_cycle, "insn_bits": lay.insn_bits, "insn_bytes": lay.insn_bytes,
                    "uop_bits": lay.uop_bits, "uop_bytes": cfg.uop_bytes},
        "buffers": buffers,
        "isa": isa,
    }


def _all_fields(cfg: Any) -> dict[str, Any]:
    """Every field of ``cfg`` under its VTA-style key, the codesign knobs too when they are off (``to_dict`` leaves
    them out so that a design without knobs has exactly VTA's keys)."""
    from .config import KNOBS
    return {**cfg.to_dict(), **{knob.upper(): getattr(cfg, knob) for knob in KNOBS if not getattr(cfg, knob)}}


def _format_config(facts: dict[str, Any], source: str) -> str:
    d = facts["derived"]
    lines = [f"name        {facts['name']}", f"source      {source}", "", "fields"]
    lines += [f"  {key:<19} {json.dumps(value) if isinstance(value, bool) else value}"
              for key, value in facts["fields"].items()]
    lines += ["", "derived",
              f"  GEMM core          {d['batch']} x {d['block_in']} times {d['block_in']} x {d['block_out']} "
              f"({d['macs_per_cycle']} int{d['inp_width']} x int{d['wgt_width']} MACs per micro-op)",
              f"  element widths     inp {d['inp_width']}, wgt {d['wgt_width']}, acc {d['acc_width']}, "
              f"out {d['out_width']} bits",
              f"  instructions       {d['insn_bits']} bits ({d['insn_bytes']} bytes)",
              f"  micro-ops          {d['uop_bits']} bits ({d['uop_bytes']} bytes)",
              f"  LOG_OUT_BUFF_SIZE  {d['log_out_buff_size']}",
              "", "buffers     bytes  entry bytes   depth  index bits"]
    for name, b in facts["buffers"].items():
        lines.append(f"  {name:<5} {b['bytes']:>9} {b['entry_bytes']:>12} {b['depth']:>7} {b['index_bits']:>11}")
    lines += ["", "ISA fields (name[msb:lsb], bit 0 = LSB; (s) = signed)"]
    common = set(facts["isa"]["FINISH"])
    rows = {"common": facts["isa"]["FINISH"]}
    rows.update({op: {n: f for n, f in fs.items() if n not in common}
                 for op, fs in facts["isa"].items() if op != "FINISH"})
    for op, fs in rows.items():
        parts = [f"{n}[{f['msb']}:{f['lsb']}]" + ("(s)" if f["signed"] else "") for n, f in fs.items()]
        lines += _wrap(f"  {op:<7}", parts, width=118)
    return "\n".join(lines)


def _wrap(head: str, words: list[str], width: int) -> list[str]:
    """``words`` after ``head``, wrapped to ``width`` columns with continuation lines indented under the first."""
    lines, line = [], head
    for word in words:
        if len(line) + 1 + len(word) > width and line.strip():
            lines.append(line)
            line = " " * len(head)
        line += " " + word
    lines.append(line)
    return lines


def _cmd_config_show(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    facts = _config_facts(cfg)
    if args.json:
        print(json.dumps(facts, indent=2))
    else:
        print(_format_config(facts, args.config or "defaults (VTAConfig())"))
    return 0


def _cmd_config_check(args: argparse.Namespace) -> int:
    from .config import load_config
    cfg = load_config(args.file)
    print(f"{args.file}: valid; canonical name {cfg.name}")
    return 0


# ---- asm / disasm ---------------------------------------------------------------------------------------------------
def _read_bytes(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise CliError(f"cannot read {path}: {err.strerror}") from None


TEXT_SUFFIXES = (".s", ".asm", ".txt")
"""What `vta disasm -o` writes: assembly text."""


def _check_suffix(option: str, path: str | None, suffixes: tuple[str, ...], what: str) -> None:
    """CliError (exit 2, before any work) unless ``path`` (when given) ends in one of ``suffixes``."""
    if path is None:
        return
    suffix = Path(path).suffix.lower()
    if suffix not in suffixes:
        raise CliError(f"{option} {path}: {what} is written as {' or '.join(suffixes)}, not "
                       f"{suffix or 'a file without a suffix'}")


def _cmd_disasm(args: argparse.Namespace) -> int:
    """Print the instructions of a program saved by Program.save (.npz), of a model compiled by `vta compile`
    (.vtac: every accelerator layer, or the one --layer names), or of a raw binary of encoded instructions (--raw,
    read with --config), one per line in the syntax `vta asm` reads."""
    from .asm import disassemble
    from .isa import decode_stream
    _check_suffix("-o", args.output, TEXT_SUFFIXES, "assembly text")
    if args.raw:
        if args.layer is not None:
            raise CliError("--layer picks a layer of a compiled model (.vtac), not of a raw binary")
        if args.uops:
            raise CliError("--uops needs a saved program (.npz): a raw instruction binary has no DRAM image")
        cfg = config_from_args(args)
        insns = decode_stream(_read_bytes(args.program), cfg)
        text = f"# config {cfg.name}, {len(insns)} instructions\n" + disassemble(insns, cfg, numbered=args.numbered)
    else:
        if args.config:
            raise CliError("--config is only for --raw binaries; a saved program carries its own config")
        from .programfile import read_program, read_programs
        is_model = str(args.program).lower().endswith(".vtac")
        # a .vtac holds one program per accelerator layer: --layer picks one, else every layer is listed in turn
        if args.layer is not None or not is_model:
            programs = [read_program(args.program, args.layer)]
        else:
            programs = read_programs(args.program)
        parts = []
        for name, program in programs:
            cfg, insns = program.cfg, program.insns
            part = (f"# layer {name}\n" if is_model else "") + f"# config {cfg.name}, {len(insns)} instructions\n"
            part += disassemble(insns, cfg, numbered=args.numbered)
            parts.append(part + (_uop_listing(program) if args.uops else ""))
        text = "\n".join(parts)
        insns = [insn for _, program in programs for insn in program.insns]
    _write_text(text, args.output)
    if args.output is not None:
        print(wrote(args.output, f"{len(insns)} instructions as text"))
    return 0


def _uop_listing(program: Any) -> str:
    """The micro-ops every ``LOAD UOP`` of ``program`` loads, read from its initial DRAM image, as UOP lines."""
    import numpy as np

    from .asm import disassemble_uops
    from .config import MEM_UOP
    from .isa import Load
    cfg = program.cfg
    nbytes = cfg.uop_bytes
    dtype = np.dtype("<u4") if nbytes == 4 else np.dtype("<u8")
    parts = []
    for index, insn in enumerate(program.insns):
        if not (isinstance(insn, Load) and insn.mem == MEM_UOP and insn.x_size):
            continue
        rows: list[Any] = []
        sram: list[int] = []
        row_len = insn.x_pad_0 + insn.x_size + insn.x_pad_1  # SRAM entries per row, padding included
        for y in range(insn.y_size):
            start = (insn.dram_base + y * insn.x_stride) * nbytes
            end = start + insn.x_size * nbytes
            if end > program.dram.size:
                raise CliError(f"instruction {index} loads micro-ops from bytes [{start}, {end}), beyond the "
                               f"{program.dram.size}-byte DRAM image", 1)
            rows.append(np.frombuffer(program.dram[start:end].tobytes(), dtype=dtype))
            first = insn.sram_base + (y + insn.y_pad_0) * row_len + insn.x_pad_0
            sram.extend(range(first, first + insn.x_size))
        text = disassemble_uops(np.concatenate(rows), cfg)
        lines = [f"{line}  # sram {k}" for k, line in zip(sram, text.splitlines())]
        parts.append(f"\n# micro-ops loaded by instruction {index} (to uop sram {insn.sram_base})\n" +
                     "".join(line + "\n" for line in lines))
    return "".join(parts)


def _write_text(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    from .fileio import atomic_write_text
    try:
        atomic_write_text(output, text)
    except OSError as err:  # its message is a sentence naming the path
        raise CliError(str(err)) from None


def _cmd_asm(args: argparse.Namespace) -> int:
    from .asm import assemble_listing
    from .isa import encode_stream, encode_uops
    _check_suffix("-o", args.output, (".bin",), "a raw instruction binary")
    _check_suffix("--uop-output", args.uop_output, (".bin",), "a raw micro-op binary")
    if args.uop_output and Path(args.uop_output).resolve() == Path(args.output).resolve():
        raise CliError(f"-o {args.output} and --uop-output {args.uop_output} are the same file: the micro-ops would "
                       f"overwrite the instructions; give two different files")
    cfg = config_from_args(args)
    text = _read_source(args.text)
    listing = assemble_listing(text, cfg)
    if listing.uops and not args.uop_output:
        raise CliError(f"{args.text} has {len(listing.uops)} UOP lines; give --uop-output FILE to write them")
    data = encode_stream(listing.insns, cfg).tobytes()
    _write_bytes(args.output, data)
    print(wrote(args.output, f"{len(listing.insns)} instructions, {len(data)} bytes, {cfg.name}"))
    if args.uop_output:
        u = listing.uops
        words = encode_uops([x.dst for x in u], [x.src for x in u], [x.wgt for x in u], cfg).tobytes() if u else b""
        _write_bytes(args.uop_output, words)
        print(wrote(args.uop_output, f"{len(u)} micro-ops, {len(words)} bytes, little-endian"))
    return 0


def _read_source(path: str) -> str:
    """The assembly text at ``path`` ('-': standard input), UTF-8 and at most ``vta.asm.MAX_SOURCE_BYTES``, read in
    chunks (an endless stream stops at the limit or its first invalid byte); CliError naming the file otherwise."""
    from .asm import MAX_SOURCE_BYTES
    from .textfile import TextFileError, read_stream, read_text
    try:
        if path != "-":
            return read_text(path, limit=MAX_SOURCE_BYTES)
        stream = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text stream put in its place (a test's io.StringIO): its text is already decoded
            stream = io.BytesIO(sys.stdin.read().encode())
        return read_stream(stream, "standard input", limit=MAX_SOURCE_BYTES, what="the input")
    except OSError as err:
        raise CliError(f"cannot read {path}: {err.strerror or err}") from None
    except TextFileError as err:
        raise CliError(str(err)) from None


def _write_bytes(path: str, data: bytes) -> None:
    from .fileio import atomic_write_bytes
    try:
        atomic_write_bytes(path, data)
    except OSError as err:  # its message is a sentence naming the path
        raise CliError(str(err)) from None


# ---- run ------------------------------------------------------------------------------------------------------------
def _print_gemm_report(args: argparse.Namespace, report: Any) -> int:
    """Print the GEMM benchmark's :class:`~vta.backend.RunSummary` (JSON with ``--json``, else the table); exit
    code 1 when its ``correct`` is false (the output differs from the numpy reference), else 0."""
    if args.json:
        print(report.to_json())
    else:
        print(_format_run(report.to_dict()))
    if not report.correct:
        log.error("the GEMM output differs from the numpy reference")
        return 1
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise CliError(f"--seed must be a non-negative integer, not {args.seed}")
    clock_option(args)  # --clock-mhz (an option when vta.compiler.cli adds the model options), checked on every path
    args.rtl_options = _rtl_options(args)  # --rtl/--top: a foreign core for tsim, checked before any work
    if args.model is not None and str(args.model).endswith(".npz"):
        return _run_program(args)
    if args.model is not None:
        _limit_options(args)  # rejects the fsim limits, which model runs do not take yet
        _cycle_options(args)  # checks --max-cycles before the compile (the model run passes it on)
        return _run_model(args)
    for name in ("m", "k", "n"):
        value = getattr(args, name)
        if value < 1:
            raise CliError(f"--{name} must be a positive number of elements, not {value}")
    cfg = config_from_args(args)
    import numpy as np

    from .backend import RunSummary, backend_info, get_backend, program_backends
    from .gemm import gemm_program
    program, expected = gemm_program(cfg, args.m, args.k, args.n, seed=args.seed,
                                     double_buffer=not args.no_double_buffer)
    if not backend_info(args.target).runs_programs:
        if not backend_info(args.target).runs_operators:
            raise CliError(f"the {args.target} backend runs neither accelerator programs nor graph operators; the "
                           f"GEMM benchmark needs a backend that runs one of them ({', '.join(program_backends())}, "
                           f"or an operator backend such as cpu)")
        return _run_gemm_operator(args, cfg, program, expected)
    backend = get_backend(args.target, **args.rtl_options, **_limit_options(args), **_cycle_options(args))
    log.info("running a %dx%dx%d GEMM (%d instructions) on %s", args.m, args.k, args.n, len(program.insns),
             args.target)
    result = backend.run(program)
    correct = bool(np.array_equal(program.read(GEMM_OUTPUT, result.dram), expected))
    report = RunSummary.of(f"gemm {args.m}x{args.k}x{args.n}", program, result,
                           useful_macs=args.m * args.k * args.n, correct=correct, clock_mhz=_run_clock(args, result))
    return _print_gemm_report(args, report)


def _run_gemm_operator(args: argparse.Namespace, cfg: Any, program: Any, expected: Any) -> int:
    """The GEMM benchmark on an operator backend (``--target cpu``): the same A, B and requantization as the
    accelerator program, computed by the compiler's quantized Dense operator (``QDense``, ``y = clip((x @ w.T) >>
    shift, lo, hi)`` with the design's output range) and checked against the same numpy reference. There are no
    instructions and no cycles; the summary gives the operator's wall time (its second call, after the JIT has
    compiled the kernel)."""
    import time

    import numpy as np

    from .backend import RunSummary, get_backend
    from .compiler.ir import Graph, Requant
    from .gemm import unpack_out
    from .isa import ALU_SHR, Alu
    from .packing import element_range
    if clock_option(args) is not None:
        raise CliError(f"--clock-mhz turns cycles into time, and the {args.target} backend counts no cycles (it runs "
                       f"the GEMM as one graph operator); leave it out, or run on a backend that counts cycles "
                       f"(--target tsim)")
    m, k, n = args.m, args.k, args.n
    a = unpack_out(program.read("A"), m, k)  # packed inp elements -> (m, k)
    w = unpack_out(program.read("B"), n, k)  # packed wgt elements are B transposed: (n, k), Dense's weight layout
    shift = next(insn.imm for insn in program.insns if isinstance(insn, Alu) and insn.alu_opcode == ALU_SHR)
    graph = Graph("gemm")
    graph.add_tensor("A", (m, k), "int8")
    graph.add_constant("B_T", w)
    graph.add_constant("bias", np.zeros(n, np.int32))
    graph.add_tensor("C", (m, n), "int8")
    lo, hi = element_range(cfg.out_width)  # the accelerator's clip: [-128, 127], or [-8, 7] on an int4 design
    node = graph.add_node("QDense", "gemm", ["A", "B_T", "bias"], ["C"],
                          requant=Requant(np.ones(n, np.int64), np.full(n, shift, np.int64), lo, hi))
    backend = get_backend(args.target, **_limit_options(args), **_cycle_options(args))  # these raise for cpu
    log.info("running a %dx%dx%d GEMM as one QDense operator on %s", m, k, n, args.target)
    backend.run_node(graph, node, {"A": a})  # the first call compiles the kernel (JIT); time the second
    start = time.perf_counter()
    out = np.asarray(backend.run_node(graph, node, {"A": a}))
    seconds = time.perf_counter() - start
    correct = bool(np.array_equal(out, unpack_out(expected, m, n)))
    report = RunSummary(f"gemm {m}x{k}x{n}", args.target, cfg.name, None, None, correct,
                        {"useful_macs": m * k * n, "operator": "QDense (the compiler's quantized Dense)",
                         "shift": int(shift), "wall_time_us": round(seconds * 1e6, 3)})
    return _print_gemm_report(args, report)


def _run_program(args: argparse.Namespace) -> int:
    """`vta run PROGRAM.npz`: run a saved program as it is and print the backend's statistics."""
    if args.config:
        raise CliError("--config does not apply to a saved program (.npz): it carries its own config")
    if not Path(args.model).is_file():
        raise CliError(f"cannot read {args.model}: no such file")
    from .backend import RunSummary, get_backend
    from .program import Program
    program = Program.load(args.model)
    backend = get_backend(args.target, **args.rtl_options, **_limit_options(args), **_cycle_options(args))
    result = backend.run(program)
    report = RunSummary.of(f"program {args.model}", program, result, clock_mhz=_run_clock(args, result))
    print(report.to_json() if args.json else _format_run(report.to_dict()))
    return 0


def _run_clock(args: argparse.Namespace, result: Any) -> float | None:
    """The ``--clock-mhz`` a program's run gives its time at (None: the design's clock); CliError when the backend
    counted no cycles, since there is then no time to give at it (ignoring the option would say nothing)."""
    mhz = clock_option(args)
    if mhz is not None and not result.cycles:
        raise CliError(f"--clock-mhz turns cycles into time, and the {args.target} backend counts no cycles; leave "
                       f"it out, or run on a backend that counts cycles (--target tsim)")
    return mhz


def _limit(text: str) -> int | None:
    """An argparse type: a non-negative integer, or 'none' for no limit."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'none', not {text!r}")
    return value


def _flags_of(names: dict[str, object]) -> str:
    """Option names as command-line flags: ``--max-insns, --max-uops``."""
    return ", ".join("--" + name.replace("_", "-") for name in names)


def _rtl_options(args: argparse.Namespace) -> dict[str, Any]:
    """The tsim backend's options for ``--rtl FILE... [--top NAME]`` (a foreign core, vta.tsim.byo), linted and
    port-checked against the config now, before any compile or build; {} without ``--rtl``."""
    if getattr(args, "rtl", None) is None and getattr(args, "top", None) is None:
        return {}
    if args.target != "tsim":
        raise CliError(f"--rtl and --top give a foreign core for --target tsim, not for --target {args.target}")
    from pathlib import Path

    from .tsim.cli import foreign_core
    model = Path(str(args.model)) if args.model is not None else None
    if model is not None and model.suffix == ".npz" and model.is_file():  # a saved program carries its config
        from .program import Program
        cfg = Program.load(model).cfg
    elif model is not None and model.suffix == ".vtac" and model.is_file():  # so does a compiled artefact
        from .compiler.runtime.compiled import Compiled
        cfg = Compiled.load(model).cfg
    else:
        cfg = config_from_args(args)
    return foreign_core(args, cfg).backend_options()


def _limit_options(args: argparse.Namespace) -> dict[str, int | None]:
    """The fsim backend's work limits given on the command line (--max-insns, --max-uops); CliError for others."""
    given = {name: getattr(args, name) for name in ("max_insns", "max_uops") if hasattr(args, name)}
    if given and args.target != "fsim":
        raise CliError(f"{_flags_of(given)} apply only to the fsim backend, not to --target {args.target}; leave "
                       f"them out")
    if given and args.model is not None and not str(args.model).endswith(".npz"):
        raise CliError(f"{_flags_of(given)} apply to the GEMM benchmark and to saved programs (.npz), not yet to "
                       f"models ({args.model}); leave them out")
    return given


def _cycle_options(args: argparse.Namespace) -> dict[str, int]:
    """The tsim backend's cycle budget given on the command line (--max-cycles N; 0: derived from the program)."""
    if getattr(args, "max_cycles", None) is None:
        return {}
    if args.target != "tsim":
        raise CliError(f"--max-cycles is a cycle budget for --target tsim, not for --target {args.target}; leave "
                       "it out")
    if args.max_cycles < 0:
        raise CliError(f"--max-cycles must be a number of cycles >= 0 (0: derived from the program), not "
                       f"{args.max_cycles}")
    return {"max_cycles": args.max_cycles}


GEMM_OUTPUT = "C"
"""The allocation of vta.gemm.gemm_program that holds the result."""


def _format_run(report: dict[str, Any]) -> str:
    cycles = report["cycles"]
    program = (f"{report['instructions']} instructions" if report["instructions"] is not None
               else "one graph operator, no accelerator program")
    lines = [f"{report['workload']} on {report['backend']} ({report['config']}, {program})",
             f"  {'result':<28} {_verdict(report['correct'])}",
             f"  {'cycles':<28} {cycles if cycles is not None else 'n/a (this backend does not count cycles)'}"]
    for title in ("summary", "stats", "counters"):
        if report[title]:
            lines.append(f"{title}")
            lines += [f"  {key:<28} {f'{value:.1%}' if key == 'mac_utilization' else _fmt_value(value)}"
                      for key, value in report[title].items()]
    return "\n".join(lines)


def _verdict(correct: bool | None) -> str:
    if correct is None:
        return "not checked (no reference for a saved program)"
    return "correct (matches numpy)" if correct else "WRONG (differs from numpy)"


def _fmt_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,.3f}"
    return str(value)


def _run_model(args: argparse.Namespace) -> int:
    try:
        from .compiler.cli import run_model
    except ImportError as err:
        raise CliError(f"running a model ({args.model}) needs vta.compiler.cli.run_model, which is not available "
                       f"({err}); without MODEL, `vta run` runs the built-in GEMM benchmark", 1) from None
    code = run_model(args)
    return int(code or 0)


# ---- parser ---------------------------------------------------------------------------------------------------------
def _add_config_group(sub: Any) -> None:
    config = sub.add_parser("config", help="show or check an accelerator config",
                            description="Show every field of a config with its derived values, or check a file.")
    csub = config.add_subparsers(dest="config_command", metavar="{show,check}", required=True)
    show = csub.add_parser("show", help="print every field, derived value, ISA field layout and the canonical name",
                           description="Print every field of the config, the derived values (buffer depths, "
                                       "element bytes, instruction and micro-op bits, ISA field positions) and the "
                                       "canonical name.")
    add_config_option(show)
    show.add_argument("--json", action="store_true", help="print the same facts as JSON")
    show.set_defaults(func=_cmd_config_show)
    check = csub.add_parser("check", help="validate a config file (exit 2 listing every problem)",
                            description="Validate a config file (VTA's JSON or TOML); print its canonical name, or "
                                        "every problem found and exit with code 2.")
    check.add_argument("file", metavar="FILE", help="vta_config.json or a .toml file")
    check.set_defaults(func=_cmd_config_check)


def _add_asm_commands(sub: Any) -> None:
    disasm = sub.add_parser("disasm", help="print a program's instructions as assembly text",
                            description=command_doc(_cmd_disasm))
    disasm.add_argument("program", metavar="PROGRAM",
                        help="a .npz program file, a compiled model (.vtac), or a raw binary with --raw")
    disasm.add_argument("--layer", metavar="NAME", default=None,
                        help="with a .vtac: only this accelerator layer (a graph node name, as the run's table "
                             "shows it)")
    disasm.add_argument("--raw", action="store_true",
                        help="PROGRAM is raw little-endian instructions (as `vta asm` writes), no header")
    add_config_option(disasm)
    disasm.add_argument("-n", "--numbered", action="store_true", help="append each instruction's index as a comment")
    disasm.add_argument("--uops", action="store_true",
                        help="also print the micro-ops each LOAD UOP loads, as UOP lines (saved programs only)")
    disasm.add_argument("-o", "--output", metavar="FILE", help="write the text to FILE instead of standard output")
    disasm.set_defaults(func=_cmd_disasm)
    asm = sub.add_parser("asm", help="assemble text into raw encoded instructions",
                         description="Assemble instruction text (the syntax `vta disasm` prints; see vta.asm) into "
                                     "raw little-endian instructions of the config's width (128 or 256 bits each).")
    asm.add_argument("text", metavar="TEXT", help="the assembly file, UTF-8, at most 64 MiB ('-' reads standard "
                                                  "input)")
    asm.add_argument("-o", "--output", metavar="FILE.bin", required=True, help="where to write the instructions")
    asm.add_argument("--uop-output", metavar="FILE.bin",
                     help="where to write the micro-ops of UOP lines (a file other than -o's)")
    add_config_option(asm)
    asm.set_defaults(func=_cmd_asm)


def _add_run_command(sub: Any, with_model_options: bool) -> None:
    run = sub.add_parser("run", help="run the GEMM benchmark or a model on a backend and print statistics",
                         description="Without MODEL: build the GEMM benchmark program (C = A x B, int8 inputs, "
                                     "M x K times K x N), run it on the chosen backend (on cpu: the same GEMM as "
                                     "one quantized Dense operator), check the result against numpy and print the "
                                     "backend's statistics. With MODEL (a zoo name such as "
                                     "resnet18 or an .onnx file): compile and run the model (vta.compiler).")
    run.add_argument("model", metavar="MODEL", nargs="?", default=None,
                     help="a model zoo name, an .onnx path or a compiled model (.vtac, from vta compile), or a "
                          "saved program (.npz) to run as it is (default: the built-in GEMM benchmark)")
    from .backend import BACKENDS
    run.add_argument("--target", choices=list(BACKENDS), default="fsim",
                     help="backend: " + "; ".join(f"{info.name}: {info.summary}" for info in BACKENDS.values()) +
                          " (default: fsim)")
    add_config_option(run)
    run.add_argument("--m", type=int, default=256, help="GEMM rows of A and C, elements (default: 256)")
    run.add_argument("--k", type=int, default=256, help="GEMM reduction length, elements (default: 256)")
    run.add_argument("--n", type=int, default=256, help="GEMM columns of B and C, elements (default: 256)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random int8 inputs (default: 0)")
    run.add_argument("--no-double-buffer", action="store_true",
                     help="do not overlap loads and stores with the GEMM (no latency hiding)")
    run.add_argument("--json", action="store_true",
                     help="print the statistics as JSON (a GEMM or a saved program: the keys of "
                          "vta.backend.RunSummary, as `vta tsim run --json`; a model: the run report)")
    run.add_argument("--rtl", metavar="FILE", nargs="+", default=None,
                     help="tsim: a foreign core (Verilog/SystemVerilog files or .f lists; docs/byo-rtl.md)")
    run.add_argument("--top", metavar="NAME", default=None, help="tsim: the foreign core's top module (vta_core)")
    run.add_argument("--max-insns", type=_limit, default=argparse.SUPPRESS, metavar="N",
                     help="fsim: stop with an error before executing more than N instructions ('none': no limit; "
                          "default: 10000000)")
    run.add_argument("--max-uops", type=_limit, default=argparse.SUPPRESS, metavar="N",
                     help="fsim: stop with an error before executing more than N GEMM/ALU micro-op iterations "
                          "('none': no limit; default: 2**32)")
    run.add_argument("--max-cycles", type=int, default=None, metavar="N",
                     help="tsim: cycle budget per program (default 0: derived from the program, 8x the cycle "
                          "model's prediction plus slack)")
    if with_model_options:
        _model_run_options(run)
    run.set_defaults(func=_cmd_run)


def _model_run_options(run: argparse.ArgumentParser) -> None:
    """Let vta.compiler.cli add its model options to `vta run` (optional hook ``add_run_arguments(parser)``)."""
    try:
        module = importlib.import_module("vta.compiler.cli")
    except Exception as err:  # noqa: BLE001 - a broken compiler must not break `vta run` of the GEMM benchmark
        log.debug("vta.compiler.cli not available: %s", err)
        return
    hook: Callable[[argparse.ArgumentParser], None] | None = getattr(module, "add_run_arguments", None)
    if hook is not None:
        hook(run)


def _plugin_available(module: str) -> bool:
    """Whether ``module`` can be found, without importing it (its parent package is imported)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _add_plugins(sub: Any, command: str | None) -> None:
    """Register each plug-in group: for real when it is the command given, else as a light placeholder."""
    for group, (module, summary) in PLUGINS.items():
        if group == command:
            try:
                plugin = importlib.import_module(module)
            except ImportError as err:
                if err.name != module:  # the module exists but something it needs does not
                    raise CliError(f"the `vta {group}` commands cannot start: {err}") from None
                continue
            plugin.register(sub)
        elif _plugin_available(module):
            sub.add_parser(group, help=summary, add_help=False)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose subcommands report their own usage errors: an unknown option of `vta run` shows the
    usage of `vta run` (not of `vta`) and the closest option, then one ``vta: error: ...`` line (exit code 2).

    argparse hands a subcommand's unknown words up to the top-level parser, which would print its own usage; a
    subcommand's parser (every parser ``add_subparsers`` makes is of this class) rejects them itself instead."""

    def parse_known_args(self, args: Any = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != "vta":
            self.error(self.unrecognized(extras))
        return namespace, extras

    def unrecognized(self, extras: list[str]) -> str:
        """The message for ``extras``, the first unknown option followed by its closest known option, if any."""
        options = [opt for action in self._actions for opt in action.option_strings]
        first = next((word for word in extras if word.startswith("-")), None)
        hint = did_you_mean(first.split("=", 1)[0], options) if first else ""
        return f"unrecognized arguments: {' '.join(extras)}{hint}"

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"vta: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; ``command`` is the subcommand about to run (its plug-in, if any, is imported)."""
    parser = _Parser(
        prog="vta", description="vta-lab: configure, program, simulate and report on a VTA-like int8 GEMM "
                                "accelerator. Exit codes: 0 ok, 1 a run failed, 2 bad input.")
    parser.add_argument("--version", action="version", version=f"vta-lab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to standard error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_config_group(sub)
    _add_asm_commands(sub)
    _add_run_command(sub, with_model_options=(command == "run"))
    _add_plugins(sub, command)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The first word of ``argv`` that is not an option (the global options take no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _exit_code(err: BaseException) -> int | None:
    """2 for bad input, 1 for a failed run, None for an unexpected error (a bug: show the traceback)."""
    if isinstance(err, CliError):
        return err.code
    if isinstance(err, MemoryError):
        return 1
    if isinstance(err, (ValueError, TypeError, OSError, KeyError)):
        return 2  # ConfigError, EncodeError, DecodeError, AsmError are ValueErrors
    if type(err).__module__.startswith("vta."):
        return 1  # the library's own domain errors, e.g. SimulationError
    return None


def _message(err: BaseException) -> str:
    """The one line a user sees for ``err``: its message, an OSError as ``FILE: reason``, a KeyError's key text."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.filename}: {err.strerror}" if err.filename else err.strerror
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        return err.args[0]
    if isinstance(err, MemoryError):
        detail = f" ({' '.join(str(err).split())})" if str(err) else ""
        return (f"out of memory{detail}: the model at these shapes needs more memory than this machine has; give "
                f"smaller input shapes or a smaller batch")
    return str(err) or type(err).__name__


def _quiet_stdout() -> None:
    """Point standard output at the null device, so that Python's flush of it at exit does not report the closed
    pipe again."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no file descriptor (a captured stream): nothing to flush
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:  # accepted anywhere: `vta run --debug` as well as `vta --debug run`
        argv = ["--debug"] + [word for word in argv if word != "--debug"]
    command = _command_of(argv)
    try:
        parser = build_parser(command)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exit_:  # --help, --version, or a usage error argparse has already printed
            return exit_.code if isinstance(exit_.code, int) else 2
        level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
        logging.basicConfig(level=level, format="vta: %(levelname)s: %(message)s", stream=sys.stderr, force=True)
        code = args.func(args)
        return int(code or 0)
    except KeyboardInterrupt:
        print("vta: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of standard output stopped (`vta config show | head -1`): not bad input
        _quiet_stdout()
        return 141           # 128 + SIGPIPE, as a shell reports a command a closed pipe stopped
    except Exception as err:  # noqa: BLE001 - the one place errors become messages and exit codes
        code = _exit_code(err)
        if debug or code is None:
            traceback.print_exc()
            return code if code is not None else 1
        print(f"vta: error: {_message(err)}", file=sys.stderr)
        return code
