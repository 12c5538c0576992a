"""ResNet-18 (224x224) on the default design and on BLOCK 8, BLOCK 32 and BATCH 2 designs, side by side: per-layer
cycles, utilization and the schedule search's choices, against the targets of the issue "codesign for speed".

Usage: python scripts/bench_resnet18.py [--designs NAMES] [--per-layer] [--tsim] [--tsim-layers NAMES]
                                        [--no-resnet50] [--no-stem] [--requant multiply|shift]

Each design compiles ResNet-18 with one image per BATCH row (the schedule search picks each conv/dense tiling by the
cycle model; results cached under the cache folder) and prints, side by side: the convolutions including the first
(target <= 7,800,000 cycles on the default design), those after the first (target <= 7,200,000), the first
convolution's cycles and utilization, the residual adds apart, the median per-layer GEMM utilization of the
convolutions (target >= 95%), the worst 1x1 convolution (target >= 80%) and ResNet-50's overall utilization (target
>= 85%), all by the cycle model. ``--per-layer`` adds each design's per-layer table (cycles, utilization, bounding
module, schedule; the default design's is always printed). ``--tsim`` runs every accelerator layer's program on the
RTL (``vta tsim``; slow: minutes per design) and prints the model's error per layer and the largest;
``--tsim-layers`` limits that to the named layers. Unless ``--no-stem``, the first convolution's three lowerings
(im2col, kw-folded, direct) are compared by the model on the default design, against the CPU kernel's measured time
and with the host's im2col time measured. ``--requant shift`` compiles every design with power-of-two requantization
(as VTA's TVM stack: a shift alone, no ALU MUL, one fewer non-MAC micro-op per output vector; slightly less accurate)
instead of the default multiplier and shift; without it the default design's targets are printed for both (VTA's
own stack, the issue's point of comparison, requantizes with shifts). Each target block ends with the least cycles
VTA's ISA allows those convolutions (one micro-op per cycle: the GEMM bound, the non-MAC micro-ops per output vector
and the first convolution's micro-ops in its lowering).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from vta.compiler.lowering.layout import fold_kernel_columns, im2col, im2col_packed, pack_activation
from vta.compiler.pipeline import REQUANT_MODES, compile_model
from vta.compiler.runtime.compiled import AccelStep, Compiled
from vta.config import ConfigError, VTAConfig, load_config
from vta.cost import estimate
from vta.isa import Alu, Gemm, insn_uops

TARGET_CONVS = 7_800_000
TARGET_AFTER_FIRST = 7_200_000
TARGET_MEDIAN = 0.95
TARGET_ONE_BY_ONE = 0.80
TARGET_RESNET50 = 0.85
TARGET_KNOBS = 7_300_000
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
DESIGNS = {"default": None, "block8": "small1x8.toml", "block32": "large1x32.toml", "batch2": "batch2x16.toml",
           "knobs": "knobs.toml"}
"""Design name -> its config file under configs/ (None: VTA's defaults)."""


@dataclass
class Figures:
    """One design's ResNet-18 figures by the cycle model (cycles per inference of ``batch`` images)."""

    name: str
    cfg: VTAConfig
    compiled: Compiled
    convs: list[tuple[AccelStep, int]]
    adds: int
    resnet50: float | None = None

    @property
    def conv_total(self) -> int:
        return sum(c for _, c in self.convs)

    @property
    def after_first(self) -> int:
        return sum(c for _, c in self.convs[1:])

    def util(self, step: AccelStep, cycles: int) -> float:
        return step.macs / (cycles * self.cfg.macs_per_cycle) if cycles else 0.0

    @property
    def utils(self) -> list[float]:
        return [self.util(s, c) for s, c in self.convs]

    def ones(self) -> list[tuple[str, float]]:
        return [(s.node.name, self.util(s, c)) for s, c in self.convs if _kernel(self.compiled, s) == (1, 1)]


def _kernel(compiled: Compiled, step: AccelStep) -> tuple[int, int]:
    """(KH, KW) of a convolution step's weights (1x1 for dense layers)."""
    shape = compiled.graph.shape(step.node.inputs[1])
    return (int(shape[2]), int(shape[3])) if len(shape) == 4 else (1, 1)


def _accel_steps(compiled: Compiled) -> list[AccelStep]:
    return [s for s in compiled.steps if isinstance(s, AccelStep)]


def design_config(name: str) -> VTAConfig:
    """The config of design ``name`` (a key of :data:`DESIGNS`)."""
    file = DESIGNS[name]
    return VTAConfig() if file is None else load_config(CONFIGS / file)


def figures(name: str, cfg: VTAConfig, resnet50: bool, requant: str = "multiply") -> Figures:
    """Compile ResNet-18 (and ResNet-50 when asked) for ``cfg`` with ``cfg.batch`` images and ``requant``
    requantization (see :func:`compile_model`); the model's figures."""
    compiled = compile_model("resnet18", cfg, batch=cfg.batch, requant=requant)
    convs = [(s, s.predicted_cycles) for s in _accel_steps(compiled) if s.node.op == "QConv2d"]
    adds = sum(s.predicted_cycles for s in _accel_steps(compiled) if s.node.op == "QAdd")
    fig = Figures(name, cfg, compiled, convs, adds)
    if resnet50:
        steps = _accel_steps(compile_model("resnet50", cfg, batch=cfg.batch, requant=requant))
        cycles = sum(s.predicted_cycles for s in steps)
        fig.resnet50 = sum(s.macs for s in steps) / (cycles * cfg.macs_per_cycle)
    return fig


def per_layer(fig: Figures, measured: dict[str, int] | None = None) -> None:
    """The per-layer table of ``fig``: model cycles, utilization, bound, schedule (and tsim's cycles and the model's
    error where ``measured`` has the layer)."""
    print(f"\n{fig.name} ({fig.cfg.name}, batch {fig.cfg.batch}): per layer, cycle model"
          + (" and tsim" if measured else ""))
    print("(gemm, alu: micro-ops the compute module issues; other: its remaining busy cycles, i.e. instruction "
          "overheads and LOAD ACC/UOP; idle: cycles it waits for loads and stores)")
    print(f"{'layer':10s} {'kernel':>6s} {'model':>9s} {'util':>5s} {'tsim':>9s} {'error':>7s} {'gemm':>9s} "
          f"{'alu':>8s} {'other':>7s} {'idle':>6s} {'bound':8s} schedule")
    for step in _accel_steps(fig.compiled):
        c = step.predicted_cycles
        util = fig.util(step, c) if step.macs else 0.0
        kh, kw = _kernel(fig.compiled, step) if step.macs else (0, 0)
        got = (measured or {}).get(step.node.name)
        tsim = f"{got:9,d} {(c - got) / got * 100:6.2f}%" if got else f"{'-':>9s} {'-':>7s}"
        gemm, alu, other, idle = compute_breakdown(step)
        print(f"{step.node.name:10s} {f'{kh}x{kw}' if step.macs else '':>6s} {c:9,d} {util * 100:4.0f}% {tsim} "
              f"{gemm:9,d} {alu:8,d} {other:7,d} {idle:6,d} {step.schedule.get('bound', ''):8s} {step.tiling}")


def compute_breakdown(step: AccelStep) -> tuple[int, int, int, int]:
    """Where the compute module's cycles go in ``step``'s program by the cycle model: (GEMM micro-ops, ALU
    micro-ops, other busy cycles: instruction overheads and its LOAD ACC/UOP, idle cycles: waiting for loads and
    stores, including the program's start and drain)."""
    est = estimate(step.program)
    gemm = sum(insn_uops(i) for i in step.program.insns if isinstance(i, Gemm))
    alu = sum(insn_uops(i) for i in step.program.insns if isinstance(i, Alu))
    busy = est.busy["compute"]
    return gemm, alu, busy - gemm - alu, est.cycles - busy


def side_by_side(figs: list[Figures]) -> None:
    """The issue's figures for every design in columns (cycles per inference of the design's batch)."""
    def row(label: str, values: list[str]) -> None:
        print(f"{label:44s}" + "".join(f"{v:>18s}" for v in values))

    print()
    row("ResNet-18 by the cycle model", [f.name for f in figs])
    row("  config", [f.cfg.name[:17] for f in figs])
    row("  images per inference (BATCH)", [str(f.cfg.batch) for f in figs])
    row("  MACs per cycle", [str(f.cfg.macs_per_cycle) for f in figs])
    row(f"  convs incl. first (default <= {TARGET_CONVS:,})", [f"{f.conv_total:,}" for f in figs])
    row(f"  convs after first (default <= {TARGET_AFTER_FIRST:,})", [f"{f.after_first:,}" for f in figs])
    row("  compute bound of all convs", [f"{sum(s.macs for s, _ in f.convs) // f.cfg.macs_per_cycle:,}"
                                         for f in figs])
    row("  first conv cycles", [f"{f.convs[0][1]:,}" for f in figs])
    row("  first conv utilization", [f"{f.util(*f.convs[0]):.1%}" for f in figs])
    row("  first conv lowering", [f.convs[0][0].tiling.split()[-1] for f in figs])
    row("  residual adds (apart)", [f"{f.adds:,}" for f in figs])
    row(f"  median conv utilization (>= {TARGET_MEDIAN:.0%})", [f"{statistics.median(f.utils):.1%}" for f in figs])
    row(f"  worst 1x1 conv (>= {TARGET_ONE_BY_ONE:.0%})", [f"{min(u for _, u in f.ones()):.1%}" for f in figs])
    row("  1x1 convs", [" ".join(f"{u:.0%}" for _, u in f.ones()) for f in figs])
    row(f"  ResNet-50 overall utilization (>= {TARGET_RESNET50:.0%})",
        [f"{f.resnet50:.1%}" if f.resnet50 is not None else "-" for f in figs])


def targets(fig: Figures, requant: str = "multiply") -> None:
    """Which of the VTA-compatible targets the default design meets, by the cycle model."""
    checks = [("convs incl. first", fig.conv_total <= TARGET_CONVS, f"{fig.conv_total:,} <= {TARGET_CONVS:,}"),
              ("convs after first", fig.after_first <= TARGET_AFTER_FIRST,
               f"{fig.after_first:,} <= {TARGET_AFTER_FIRST:,}"),
              ("median conv utilization", statistics.median(fig.utils) >= TARGET_MEDIAN,
               f"{statistics.median(fig.utils):.1%} >= {TARGET_MEDIAN:.0%}"),
              ("every 1x1 conv", all(u >= TARGET_ONE_BY_ONE for _, u in fig.ones()),
               f"min {min(u for _, u in fig.ones()):.1%} >= {TARGET_ONE_BY_ONE:.0%}")]
    if fig.resnet50 is not None:
        checks.append(("ResNet-50 overall", fig.resnet50 >= TARGET_RESNET50,
                       f"{fig.resnet50:.1%} >= {TARGET_RESNET50:.0%}"))
    print(f"\ntargets on {fig.name} (VTA-compatible ISA, cycle model, {requant} requantization):")
    for label, ok, text in checks:
        print(f"  {label:26s} {'met' if ok else 'missed':7s} {text}")


def floor_after_first(fig: Figures) -> tuple[int, int]:
    """(GEMM bound, output vectors) of the convolutions after the first: the bound of the VTA-compatible ISA is the
    GEMM micro-ops plus one reset and the requantization's ALU passes per output vector."""
    macs = sum(s.macs for s, _ in fig.convs[1:])
    vectors = 0
    for s, _ in fig.convs[1:]:
        n, o, oh, ow = fig.compiled.graph.shape(s.node.outputs[0])
        vectors += -(-n // fig.cfg.batch) * -(-o // fig.cfg.block_out) * oh * ow
    return macs // fig.cfg.macs_per_cycle, vectors


def print_floors(fig: Figures, requant: str) -> None:
    """The least cycles VTA's ISA allows the default design's convolutions, the compute module issuing one micro-op
    per cycle: after the first, :func:`floor_after_first`'s GEMM bound plus the non-MAC micro-ops per output vector;
    with the first, plus the micro-ops the first convolution issues in its lowering (its reduction in whole blocks,
    one reset and the requantization per output vector)."""
    bound, vectors = floor_after_first(fig)
    ops = "reset, ADD bias, SHR, MAX, MIN" if requant == "shift" else "reset, ADD bias, MUL, SHR, MAX, MIN"
    per = ops.count(",") + 1
    after = bound + per * vectors
    first = fig.convs[0][0]
    issued = first.gemm_uops + first.alu_uops
    lowering = first.fold.label if first.fold is not None else "direct"
    print(f"  after the first: GEMM bound {bound:,} + {vectors:,} output vectors x {per} non-MAC micro-ops "
          f"({ops}) = {after:,} cycles at least on this ISA")
    print(f"  with the first: + the {issued:,} micro-ops the first convolution issues ({lowering}: "
          f"{first.gemm_uops:,} GEMM incl. resets, {first.alu_uops:,} ALU) = {after + issued:,} cycles at least")


def run_tsim(fig: Figures, only: set[str] | None) -> dict[str, int]:
    """tsim's cycles of every accelerator layer's program (or those named in ``only``); inputs are zero (timing does
    not depend on the data)."""
    from vta.backend import get_backend
    backend = get_backend("tsim", check="none")
    out: dict[str, int] = {}
    for step in _accel_steps(fig.compiled):
        if only and step.node.name not in only:
            continue
        t0 = time.perf_counter()
        result = backend.run(step.program)
        assert result.cycles is not None
        out[step.node.name] = int(result.cycles)
        err = (step.predicted_cycles - out[step.node.name]) / out[step.node.name] * 100
        print(f"  tsim {fig.name} {step.node.name}: {out[step.node.name]:,} cycles, model {step.predicted_cycles:,} "
              f"({err:+.2f}%), {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def stem_comparison(cfg: VTAConfig) -> None:
    """The first convolution's lowerings by the cycle model, the CPU kernel's measured time and the host's im2col."""
    from vta.backend import get_backend
    print(f"\nfirst convolution's lowerings on {cfg.name} (accelerator time at {cfg.clock_mhz:g} MHz):")
    base = None
    for stem in ("im2col", "columns", "direct"):
        compiled = compile_model("resnet18", cfg, stem=stem)
        step = _accel_steps(compiled)[0]
        base = base or compiled
        print(f"  {stem:8s} {step.predicted_cycles:10,d} cycles = {step.predicted_cycles / cfg.clock_mhz / 1e3:6.2f} ms"
              f"  ({step.gemm_uops:,} GEMM + {step.alu_uops:,} ALU micro-ops; {step.tiling})")
    assert base is not None
    step = _accel_steps(base)[0]
    graph = base.graph
    x = np.random.default_rng(0).integers(-128, 128, graph.shape(step.node.inputs[0])).astype(np.int8)
    fold = step.fold
    assert fold is not None and fold.kh
    def best(work: Callable[[], object], repeat: int = 7) -> float:
        """The fastest of ``repeat`` runs of ``work``, seconds (the machine is shared: the minimum is the cost)."""
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            work()
            times.append(time.perf_counter() - t0)
        return min(times)

    pads = (fold.pad_top, fold.pad_left, fold.pad_bottom, fold.pad_right)
    cols = im2col(x, kh=fold.kh, kw=fold.kw, sh=fold.sh, sw=fold.sw, pads=pads, bias_lanes=fold.bias_lanes)
    host = best(lambda: im2col_packed(x, kh=fold.kh, kw=fold.kw, sh=fold.sh, sw=fold.sw, pads=pads,
                                      bias_lanes=fold.bias_lanes, batch=cfg.batch, block=cfg.block_in))
    folded = best(lambda: pack_activation(fold_kernel_columns(x, kw=fold.kw, sw=fold.sw, pad_left=fold.pad_left,
                                                              pad_right=fold.pad_right),
                                          batch=cfg.batch, block=cfg.block_in))
    plain = best(lambda: pack_activation(x, batch=cfg.batch, block=cfg.block_in))
    print(f"  host (numpy, this machine, best of 7): im2col + packing {host * 1e3:.2f} ms ({cols.nbytes:,} bytes); "
          f"kw-fold + packing {folded * 1e3:.2f} ms; packing the plain input {plain * 1e3:.2f} ms")
    cpu = get_backend("cpu")
    cpu.run_node(graph, step.node, {step.node.inputs[0]: x})      # JIT
    on_cpu = best(lambda: cpu.run_node(graph, step.node, {step.node.inputs[0]: x}), 3)
    print(f"  CPU kernel (llvmlite, best of 3): {on_cpu * 1e3:.1f} ms for the whole convolution")
    print(f"  partition's reason: {base.decisions[step.node.name].reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", default=",".join(DESIGNS),
                        help=f"comma-separated designs among {', '.join(DESIGNS)} (default: all)")
    parser.add_argument("--per-layer", action="store_true", help="every design's per-layer table")
    parser.add_argument("--tsim", action="store_true", help="run the layers on the RTL and print the model's error")
    parser.add_argument("--tsim-layers", help="with --tsim: only these comma-separated layers (e.g. conv_2,conv_60)")
    parser.add_argument("--no-resnet50", action="store_true", help="skip ResNet-50")
    parser.add_argument("--no-stem", action="store_true", help="skip the first convolution's lowering comparison")
    parser.add_argument("--requant", choices=REQUANT_MODES, default="multiply",
                        help="requantization: multiply (an integer multiplier and a shift per channel, default) or "
                             "shift (power-of-two scales as VTA's TVM stack: no ALU MUL, one fewer micro-op per "
                             "output vector, slightly less accurate)")
    parser.add_argument("--model-only", action="store_true", help=argparse.SUPPRESS)  # the model is the default now
    args = parser.parse_args()
    names = [n.strip() for n in args.designs.split(",") if n.strip()]
    unknown = [n for n in names if n not in DESIGNS]
    if not names or unknown:
        print(f"bench_resnet18.py: error: unknown design {', '.join(unknown) or '(none)'}; the designs are "
              f"{', '.join(DESIGNS)}", file=sys.stderr)
        sys.exit(2)
    only = {n.strip() for n in args.tsim_layers.split(",")} if args.tsim_layers else None
    figs = []
    for name in names:
        try:
            cfg = design_config(name)
        except (ConfigError, OSError) as err:
            print(f"bench_resnet18.py: error: design {name}: {err}", file=sys.stderr)
            sys.exit(2)
        t0 = time.perf_counter()
        fig = figures(name, cfg, not args.no_resnet50, args.requant)
        print(f"{name}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        measured = run_tsim(fig, only) if args.tsim else None
        if args.per_layer or name == "default" or measured:
            per_layer(fig, measured)
        if measured:
            errs = [abs(fig_step.predicted_cycles - measured[fig_step.node.name]) / measured[fig_step.node.name]
                    for fig_step in _accel_steps(fig.compiled) if fig_step.node.name in measured]
            print(f"  {name}: model error against tsim on {len(errs)} layers: largest {max(errs):.2%}, "
                  f"mean {statistics.mean(errs):.2%}")
            convs = [measured.get(step.node.name) for step, _ in fig.convs]
            if all(c is not None for c in convs):
                print(f"  {name} on tsim: convs incl. first {sum(convs):,} (model {fig.conv_total:,}), after the "
                      f"first {sum(convs[1:]):,} (model {fig.after_first:,})")
        figs.append(fig)
    side_by_side(figs)
    for fig in figs:
        if fig.name == "default":
            targets(fig, args.requant)
            print_floors(fig, args.requant)
            if args.requant != "shift":  # VTA's TVM stack requantizes with power-of-two scales (no MUL pass)
                shift = figures("default", fig.cfg, False, "shift")
                targets(shift, "shift")
                print_floors(shift, "shift")
        if fig.name == "knobs":  # the default design with every codesign knob on (configs/knobs.toml)
            print(f"\ntarget on knobs (all codesign knobs on, cycle model): convs incl. first "
                  f"{'met' if fig.conv_total <= TARGET_KNOBS else 'missed'} {fig.conv_total:,} <= {TARGET_KNOBS:,}")
    if not args.no_stem and "default" in names:
        stem_comparison(design_config("default"))


if __name__ == "__main__":
    main()
