"""``vta hw`` commands, registered by ``vta.cli`` when the command is ``hw``:

    vta hw verilog [--config C] -o DIR     write DIR/vta_core.v for the config
    vta hw resources [--config C] [--force] [--json]   LUT/FF/DSP/BRAM of the core (Yosys synth_xilinx, cached)
"""
import json
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers):
    """Add the ``hw`` group and its commands to the top-level ``subparsers`` of ``vta``."""
    from vta.cliutil import add_config_option, command_doc
    hw = subparsers.add_parser("hw", help="generate the hardware: Verilog, area estimates",
                               description="Generate the accelerator core of a config: its Verilog, or its FPGA "
                                           "resource counts from a Yosys synthesis.")
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


def _cmd_verilog(args):
    """Generate the core of the config (Amaranth) and write its Verilog as vta_core.v into the folder -o names."""
    from vta.cliutil import CliError, config_from_args

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
    print(f"{path} ({cfg.name})")
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
