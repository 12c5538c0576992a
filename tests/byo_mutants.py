"""Single-point mutants of the generated core's Verilog, for the conformance kit's mutation check.

Each :class:`Mutant` changes one piece of text inside one module of the Verilog ``vta.hw.verilog`` writes (for
``configs/small1x8.toml``: the anchors name its bus and vector widths): an ALU opcode decoded wrongly, an operand
swapped, an off-by-one in a loop or pad bound, a dropped dependency token, a wrong pad value... ``feature`` is the
conformance kit's feature (:mod:`vta.tsim.conform_programs`) that must fail on it. :func:`mutate` refuses a text that
does not occur exactly once in its module, so a change in the generator shows as a clear error, not as a mutant that
silently mutates nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Mutant", "MUTANTS", "mutate", "write_mutant"]


@dataclass(frozen=True)
class Mutant:
    """``old`` replaced by ``new`` in module ``module`` (its name without the ``vta_core.`` prefix; ``""``: the top,
    ``vta_core`` itself)."""

    name: str
    module: str
    old: str
    new: str
    feature: str


MUTANTS: tuple[Mutant, ...] = (
    Mutant("alu-min-decoded-as-max", "compute.alu.lane0", "res = \\$2 ;", "res = \\$4 ;", "alu min"),
    Mutant("alu-add-decoded-as-mul", "compute.alu.lane0", "res = \\$5 [31:0];", "res = \\$10 [31:0];", "alu add"),
    Mutant("alu-shr-logical", "compute.alu.lane0", "$signed(a) >>> b[4:0]", "a >> b[4:0]", "alu shr"),
    Mutant("alu-min-unsigned", "compute.alu.lane0", "assign \\$1  = $signed(a) < $signed(b);",
           "assign \\$1  = a < b;", "alu min"),
    Mutant("gemm-reset-ignored", "compute", "assign res = cmd_insn[7] ?", "assign res = 1'h0 ?", "gemm reset"),
    Mutant("gemm-inp-reads-wgt-index", "compute", "assign inp_rd__addr = \\$9 [10:0];",
           "assign inp_rd__addr = \\$10 [10:0];", "gemm"),
    Mutant("load-inp-pad-value", "load.engine", "pad ? 64'h8080808080808080 :", "pad ? 64'h8080808080808081 :",
           "load inp"),
    Mutant("load-acc-pad-value", "compute.engine", "assign \\$35  = pad ? 256'h" + "0" * 64,
           "assign \\$35  = pad ? 256'h" + "0" * 63 + "1", "load acc"),
    Mutant("load-bottom-pad-off-by-one", "load.engine.walker", "assign \\$16  = r >= \\$signal$11 ;",
           "assign \\$16  = r > \\$signal$11 ;", "load inp"),
    Mutant("store-stride-is-x-size", "store", "assign \\$52  = drow + insn[111:96];",
           "assign \\$52  = drow + insn[95:80];", "store"),
    Mutant("token-compute-to-load-dropped", "tq_c2l", "assign push = push_valid & push_ready;",
           "assign push = 1'h0 & push_ready;", "tokens compute->load"),
    Mutant("uop-loop-ends-one-early", "compute", "assign \\$56  = cmd_insn[34:21] - 1'h1;",
           "assign \\$56  = cmd_insn[34:21] - 2'h2;", "gemm"),
    Mutant("load-uop-pad-value", "compute.engine", "pad ? 32'd0 :", "pad ? 32'd1 :", "load uop"),
    # The three classes the kit missed before its corner and stress programs (issue 28): each escapes the directed
    # programs of one feature each and random programs, and is caught by the feature named here.
    Mutant("alu-shl-amount-5-bits", "compute.alu.lane0", "assign \\$7  = a << \\$6 [5:0];",
           "assign \\$7  = a << \\$6 [4:0];", "corner alu shr"),
    Mutant("gemm-dot-18-bits", "compute", "a[31:0] + dot[31:0];", "a[31:0] + { {14{dot[17]}}, dot[17:0] };",
           "corner gemm extremes"),
    Mutant("token-l2c-lost-when-push-meets-pop", "tq_l2c", "assign \\$4  = pop & \\$3 ;", "assign \\$4  = pop ;",
           "stress tokens"),
    # The classes of the second round (issue 28): a long LOAD's row counter, done not waiting for load (the kit's
    # directed programs before that round and random programs pass both), an immediate's sign, a token queue's
    # reset value, the arbiter's burst length, a counter's CSR address.
    Mutant("wgt-rows-count-bit-5-lost", "load.engine.reader_wgt", "assign \\$27  = c_y - 1'h1;",
           "assign \\$27  = { c_y[15:6], 1'h0, c_y[4:0] } - 1'h1;", "corner long wgt"),
    Mutant("done-ignores-load", "", "assign \\$2  = idle & \\idle$231 ;", "assign \\$2  = idle & 1'h1 ;",
           "corner finish backlog"),
    Mutant("alu-imm-sign-bit-lost", "compute", "assign b = cmd_insn[111] ? { cmd_insn[127], ",
           "assign b = cmd_insn[111] ? { 1'h0, ", "alu min_imm"),
    Mutant("token-c2s-one-after-reset", "tq_c2s", "if (rst) level <= 7'h00;", "if (rst) level <= 7'h01;",
           "tokens compute->store"),
    Mutant("arbiter-burst-length-bit-4-lost", "arbiter", "assign \\$10  = { 1'h0, mem_rd__req_len, 2'h0 };",
           "assign \\$10  = { 1'h0, mem_rd__req_len[15:5], 1'h0, mem_rd__req_len[3:0], 2'h0 };", "load wgt"),
    Mutant("csr-load-wait-mem-reads-zero", "", "6'h06:\n          csr_rdata = cnt_load_wait_mem;",
           "6'h3f:\n          csr_rdata = cnt_load_wait_mem;", "load wgt"),
    # A lost reset (issue 28, the mutation score's m076): the acc8 reader's active flag keeps its value through a
    # reset; a fresh model starts it from its declared initial value, so only a reset between programs shows it.
    Mutant("acc8-reader-active-not-reset", "compute.engine.reader_acc8", "if (rst) r_active <= 1'h0;",
           "if (1'h0) r_active <= 1'h0;", "corner reset"),
)
"""The mutants, each with the feature that must fail on it (a feature name, or the start of the names of a group of
features: ``stress tokens`` is every ``stress tokens ...`` feature; one of them must fail)."""


def mutate(verilog: str, mutant: Mutant) -> str:
    """``verilog`` with ``mutant`` applied; ValueError when its text does not occur exactly once in its module."""
    header = f"module \\vta_core.{mutant.module} " if mutant.module else "module vta_core("
    name = f"vta_core.{mutant.module}" if mutant.module else "vta_core"
    start = verilog.find(header)
    if start < 0 or verilog.find(header, start + 1) >= 0:
        raise ValueError(f"mutant {mutant.name}: module {name} not found once in the Verilog")
    end = verilog.index("\nendmodule", start)
    body = verilog[start:end]
    if body.count(mutant.old) != 1:
        raise ValueError(f"mutant {mutant.name}: {mutant.old!r} occurs {body.count(mutant.old)} times in module "
                         f"{name}, not once")
    return verilog[:start] + body.replace(mutant.old, mutant.new) + verilog[end:]


def write_mutant(verilog: Path, mutant: Mutant, out_dir: Path) -> Path:
    """Write the mutated copy of the core ``verilog`` to ``out_dir/vta_core.v``; returns its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "vta_core.v"
    path.write_text(mutate(Path(verilog).read_text(), mutant))
    return path
