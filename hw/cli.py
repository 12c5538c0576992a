"""``vta hw`` commands, registered by ``vta.cli`` when the command is ``hw``:

    vta hw verilog [--config C] -o DIR     write DIR/vta_core.v for the config
    vta hw resources [--config C] [--force] [--json]   LUT/FF/DSP/BRAM of the core (Yosys synth_xilinx, cached)
    vta hw timing [--config C] [--seed N] [--device D] [--estimate] [--force] [--json]   max clock and critical path
        (Yosys synth_ecp5 + nextpnr-ecp5, cached)
"""
import json
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers):
    """Add the ``hw`` group and its commands to the top-level ``subparsers`` of ``vta``."""
    from vta.cliutil import add_config_option, command_doc
    hw = subparsers.add_parser("hw", help="generate the hardware: Verilog, area estimates, timing",
                               description="Generate the accelerator core of a config: its Verilog, its FPGA "
                                           "resource counts from a Yosys synthesis, or its clock from place and "
                                           "route (timing).")
    sub = hw.add_subparsers(dest="hw_command", metavar="COMMAND", required=True)
    verilog = sub.add_parser("verilog", help="write the core's Verilog (vta_core.v) for a config",
                             description=command_doc(_cmd_verilog))
    add_config_option(verilog)
    verilog.add_argument("-o", "--output", metavar="DIR", required=True, help="folder to write vta_core.v into")
    verilog.add_argument("--gemm-form", choices=("packed", "array"), default="packed",
                         help="GEMM core implementation, the same function either way: packed (fast to simulate, "
                              "the default) or array (a signed 8x8 multiplier per MAC, better to synthesize; "
                              "'vta hw resources' uses it)")
    verilog.set_defaults(func=_cmd_verilog)
    res = sub.add_parser("resources", help="synthesize the core (Yosys synth_xilinx) and report LUT, FF, DSP, BRAM",
                         description="Synthesize the core of the config with Yosys (synth_xilinx) and print its "
                                     "LUT, LUT-RAM, FF, DSP and BRAM counts; a result is cached per config.")
    add_config_option(res)
    res.add_argument("--force", action="store_true", help="synthesize again even when a cached result exists")
    res.add_argument("--json", action="store_true", help="print the counts as JSON")
    res.set_defaults(func=_cmd_resources)
    _register_timing(sub, add_config_option, command_doc)


def _register_timing(sub, add_config_option, command_doc):
    from .timing import DEFAULT_DEVICE, DEFAULT_SEED, DEVICES
    tim = sub.add_parser("timing", help="place and route the core on an ECP5 FPGA: max clock and critical path",
                         description=command_doc(_cmd_timing))
    add_config_option(tim)
    tim.add_argument("--seed", type=int, default=DEFAULT_SEED, metavar="N",
                     help=f"nextpnr's placement seed (default {DEFAULT_SEED}); the clock moves ~10%% with it")
    tim.add_argument("--device", choices=sorted(DEVICES), default=DEFAULT_DEVICE,
                     help=f"ECP5 part (default {DEFAULT_DEVICE}: {DEVICES[DEFAULT_DEVICE]}, the largest)")
    tim.add_argument("--estimate", action="store_true",
                     help="place only and report nextpnr's post-placement estimate (minutes faster than routing)")
    tim.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                     help="seconds routing may take before the post-placement estimate is taken instead "
                          "(default 1800)")
    tim.add_argument("--force", action="store_true", help="synthesize and place again even when a result is cached")
    tim.add_argument("--json", action="store_true", help="print the result as JSON")
    tim.set_defaults(func=_cmd_timing)


def _cmd_verilog(args):
    """Generate the core of the config (Amaranth) and write its Verilog as vta_core.v into the folder -o names."""
    from vta.cliutil import CliError, config_from_args, wrote

    from .verilog import generate_verilog
    if Path(args.output).suffix.lower() in (".v", ".sv"):  # a file name where a folder is expected
        raise CliError(f"-o {args.output}: -o names the folder vta_core.v is written into, not a Verilog file; e.g. "
                       f"-o {Path(args.output).parent / 'rtl'}")
    cfg = config_from_args(args)
    try:
        path = generate_verilog(cfg, args.output, gemm_form=args.gemm_form)  # written whole (vta.fileio)
    except OSError as err:  # from vta.fileio, a sentence naming the path; from mkdir, the folder and the reason
        raise CliError(str(err) if err.filename is None else f"-o {args.output}: cannot write there ({err.filename}: "
                       f"{err.strerror})") from None
    print(wrote(path, f"the core's Verilog, {cfg.name}"))
    return 0


def _cmd_resources(args):
    from vta.cliutil import config_from_args

    from .area import resources
    cfg = config_from_args(args)
    counts = resources(cfg, force=args.force, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(counts, indent=1, sort_keys=True))
    else:
        print(f"{cfg.name}: LUT {counts['lut']} (LUT-RAM {counts['lutram']}), FF {counts['ff']}, DSP {counts['dsp']}, "
              f"BRAM {counts['bram']:g} (RAMB36 {counts['bram36']}, RAMB18 {counts['bram18']})")
    return 0


def _cmd_timing(args):
    """Synthesize the core of the config for a Lattice ECP5 (Yosys synth_ecp5) inside a five-pin wrapper and place
    and route it (nextpnr-ecp5, router2, a fixed seed): print its maximum clock, the critical path in the core's
    terms (unit, from which register to which), run time and tool versions. Cached per design, tools, seed and
    device. A design too large for the device is named with the resources it lacks and gets the clock model's
    figure, labelled as such."""
    from vta.cliutil import CliError, config_from_args

    from .timing import TimingError, format_timing, timing
    cfg = config_from_args(args)
    if args.seed < 0:
        raise CliError(f"--seed {args.seed}: the seed must be 0 or more")
    try:
        result = timing(cfg, seed=args.seed, device=args.device, force=args.force, estimate=args.estimate,
                        route_timeout=args.timeout, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    except TimingError as err:
        raise CliError(str(err)) from None
    if result["source"] == "none":
        from vta.clock import model_clock
        est = model_clock(cfg)
        result["model"] = {"fmax_mhz": est.mhz, "unit": est.unit, "error_pct": est.error_pct}
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print(format_timing(result))
    return 0
