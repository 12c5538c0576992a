"""A small stand-in for the generated core, with exactly the ports of ``docs/core-interface.md``.

It lets the TSIM harness be tested on its own (reads, bursts, writes, latency, bounds checks, the watchdog, trace and
counters) independently of the real core in ``hw/``. It fetches the instruction stream through the memory port one
instruction at a time and executes each by its opcode, with *stand-in* meanings (not VTA's):

* LOAD, STORE: copy ``x_size`` bus beats from byte address ``dram_base * B`` to byte address ``x_stride * B``
  (``B = cfg.bus_bytes``) with one burst read, each beat written back as it arrives. LOAD counts the bytes in
  ``inp_bytes_read`` and ``load_insns``, STORE in ``out_bytes_written`` and ``store_insns``.
* ALU: spin for ``iter_out`` cycles, one ``alu_uops`` per cycle, with ``progress`` high.
* GEMM: hang forever (compute in ``wait_token``, no progress): what the watchdog is for.
* FINISH: raise ``done``.

Counters kept: cycles, fetch_busy, fetch_wait_mem, compute_busy, compute_wait_token, load_wait_mem, alu_uops,
insn_bytes_read, inp_bytes_read, out_bytes_written, fetch_insns, load_insns, compute_insns, store_insns.
"""
from __future__ import annotations

from pathlib import Path

from vta.config import VTAConfig
from vta.hw.regs import COUNTERS
from vta.isa import OP_ALU, OP_LOAD, layout

_VERILOG = r"""
module vta_core (
    input clk, input rst,
    input start, input [31:0] insn_addr, input [31:0] insn_count,
    output reg done,
    input [5:0] csr_addr, output reg [63:0] csr_rdata,
    output progress,
    output mem_rd_req_valid, input mem_rd_req_ready, output [31:0] mem_rd_req_addr, output [15:0] mem_rd_req_len,
    input mem_rd_data_valid, output mem_rd_data_ready, input [8*@B@-1:0] mem_rd_data,
    output mem_wr_valid, input mem_wr_ready, output [31:0] mem_wr_addr, output [8*@B@-1:0] mem_wr_data,
    output [@B@-1:0] mem_wr_strb
);
    localparam B = @B@;
    localparam IB = @IB@;
    localparam NB = IB / B;
    localparam S_IDLE = 0, S_FREQ = 1, S_FDATA = 2, S_EXEC = 3, S_CREQ = 4, S_CDATA = 5, S_HANG = 6, S_SPIN = 7,
               S_DONE = 8;
    reg [3:0] st;
    reg [31:0] pc, remaining;
    reg [8*IB-1:0] insn;
    reg [15:0] beat, len;
    reg [31:0] src, dst;
    reg wr_pend;
    reg [8*B-1:0] wr_data;
    reg [31:0] wr_addr;
    reg [31:0] spin;
    reg [63:0] c_cycles, c_fetch_busy, c_fetch_wait_mem, c_compute_busy, c_compute_wait_token, c_load_wait_mem,
               c_alu_uops, c_insn_bytes, c_inp_bytes, c_out_bytes, c_fetch_insns, c_load_insns, c_compute_insns,
               c_store_insns;

    wire [8*IB+8*B-1:0] insn_cat = {mem_rd_data, insn};
    wire [2:0] opcode = insn[2:0];
    wire [31:0] f_dram_base = insn[@DRAM_HI@:@DRAM_LO@];
    wire [15:0] f_x_size = insn[@XSIZE_HI@:@XSIZE_LO@];
    wire [15:0] f_x_stride = insn[@XSTRIDE_HI@:@XSTRIDE_LO@];
    wire [13:0] f_iter_out = insn[@ITER_HI@:@ITER_LO@];

    assign mem_rd_req_valid = (st == S_FREQ) || (st == S_CREQ);
    assign mem_rd_req_addr = (st == S_FREQ) ? pc : src;
    assign mem_rd_req_len = (st == S_FREQ) ? NB : len;
    assign mem_rd_data_ready = (st == S_FDATA) || (st == S_CDATA && !wr_pend);
    assign mem_wr_valid = wr_pend;
    assign mem_wr_addr = wr_addr;
    assign mem_wr_data = wr_data;
    assign mem_wr_strb = {B{1'b1}};
    wire rd_req_fire = mem_rd_req_valid && mem_rd_req_ready;
    wire rd_fire = mem_rd_data_valid && mem_rd_data_ready;
    wire wr_fire = mem_wr_valid && mem_wr_ready;
    wire copy_done = (st == S_CDATA) && beat == len && !wr_pend;
    assign progress = rd_req_fire || rd_fire || wr_fire || st == S_SPIN || st == S_EXEC;

    always @(*) begin
        case (csr_addr)
@CSR_CASES@
            default: csr_rdata = 64'd0;
        endcase
    end

    always @(posedge clk) begin
        if (rst) begin
            st <= S_IDLE;
            done <= 1'b0;
            wr_pend <= 1'b0;
        end else if (start) begin
            st <= (insn_count == 0) ? S_DONE : S_FREQ;
            done <= 1'b0;
            pc <= insn_addr;
            remaining <= insn_count;
            wr_pend <= 1'b0;
            c_cycles <= 0; c_fetch_busy <= 0; c_fetch_wait_mem <= 0; c_compute_busy <= 0;
            c_compute_wait_token <= 0; c_load_wait_mem <= 0; c_alu_uops <= 0; c_insn_bytes <= 0;
            c_inp_bytes <= 0; c_out_bytes <= 0; c_fetch_insns <= 0; c_load_insns <= 0; c_compute_insns <= 0;
            c_store_insns <= 0;
        end else begin
            if (st != S_IDLE && st != S_DONE) c_cycles <= c_cycles + 1;
            case (st)
                S_FREQ: begin
                    c_fetch_wait_mem <= c_fetch_wait_mem + 1;
                    if (rd_req_fire) begin st <= S_FDATA; beat <= 0; end
                end
                S_FDATA: begin
                    c_fetch_wait_mem <= c_fetch_wait_mem + 1;
                    if (rd_fire) begin
                        insn <= insn_cat[8*IB+8*B-1:8*B];
                        c_insn_bytes <= c_insn_bytes + B;
                        if (beat == NB - 1) st <= S_EXEC;
                        beat <= beat + 1;
                    end
                end
                S_EXEC: begin
                    c_fetch_busy <= c_fetch_busy + 1;
                    c_fetch_insns <= c_fetch_insns + 1;
                    pc <= pc + IB;
                    remaining <= remaining - 1;
                    case (opcode)
                        3'd0, 3'd1: begin
                            src <= f_dram_base * B;
                            dst <= f_x_stride * B;
                            len <= f_x_size;
                            beat <= 0;
                            st <= (f_x_size == 0) ? S_CDATA : S_CREQ;
                        end
                        3'd2: st <= S_HANG;
                        3'd3: begin st <= S_DONE; done <= 1'b1; c_compute_insns <= c_compute_insns + 1; end
                        default: begin spin <= f_iter_out; st <= S_SPIN; end
                    endcase
                end
                S_CREQ: begin
                    c_load_wait_mem <= c_load_wait_mem + 1;
                    if (rd_req_fire) st <= S_CDATA;
                end
                S_CDATA: begin
                    c_load_wait_mem <= c_load_wait_mem + 1;
                    if (rd_fire) begin
                        wr_pend <= 1'b1;
                        wr_data <= mem_rd_data;
                        wr_addr <= dst + beat * B;
                        beat <= beat + 1;
                    end
                    if (wr_fire) wr_pend <= 1'b0;
                    if (copy_done) begin
                        if (opcode == 3'd0) begin
                            c_inp_bytes <= c_inp_bytes + len * B;
                            c_load_insns <= c_load_insns + 1;
                        end else begin
                            c_out_bytes <= c_out_bytes + len * B;
                            c_store_insns <= c_store_insns + 1;
                        end
                        st <= (remaining == 0) ? S_DONE : S_FREQ;
                    end
                end
                S_SPIN: begin
                    c_compute_busy <= c_compute_busy + 1;
                    if (spin == 0) begin
                        c_compute_insns <= c_compute_insns + 1;
                        st <= (remaining == 0) ? S_DONE : S_FREQ;
                    end else begin
                        c_alu_uops <= c_alu_uops + 1;
                        spin <= spin - 1;
                    end
                end
                S_HANG: c_compute_wait_token <= c_compute_wait_token + 1;
                default: ;
            endcase
        end
    end
endmodule
"""

STANDIN_COUNTERS = ("cycles", "fetch_busy", "fetch_wait_mem", "compute_busy", "compute_wait_token",
                    "load_wait_mem", "alu_uops", "insn_bytes_read", "inp_bytes_read", "out_bytes_written",
                    "fetch_insns", "load_insns", "compute_insns", "store_insns")
"""The counters the stand-in keeps (the others read as zero)."""


def standin_verilog(cfg: VTAConfig) -> str:
    """The stand-in's Verilog source for ``cfg`` (bus width and instruction field positions from the config)."""
    lay = layout(cfg)
    if cfg.bus_bytes > lay.insn_bytes:
        raise ValueError(f"the stand-in core needs bus_bytes <= {lay.insn_bytes} (one instruction), "
                         f"not {cfg.bus_bytes}")

    def hi_lo(opcode: int, name: str) -> tuple[int, int]:
        f = lay.field(opcode, name)
        return f.msb, f.lsb

    def reg(name: str) -> str:
        return "c_" + name.replace("_read", "").replace("_written", "")

    cases = "\n".join(f"            6'd{COUNTERS.index(name)}: csr_rdata = {reg(name)};" for name in STANDIN_COUNTERS)
    subst = {
        "B": cfg.bus_bytes, "IB": lay.insn_bytes,
        "DRAM_HI": hi_lo(OP_LOAD, "dram_base")[0], "DRAM_LO": hi_lo(OP_LOAD, "dram_base")[1],
        "XSIZE_HI": hi_lo(OP_LOAD, "x_size")[0], "XSIZE_LO": hi_lo(OP_LOAD, "x_size")[1],
        "XSTRIDE_HI": hi_lo(OP_LOAD, "x_stride")[0], "XSTRIDE_LO": hi_lo(OP_LOAD, "x_stride")[1],
        "ITER_HI": hi_lo(OP_ALU, "iter_out")[0], "ITER_LO": hi_lo(OP_ALU, "iter_out")[1],
        "CSR_CASES": cases,
    }
    text = _VERILOG
    for key, value in subst.items():
        text = text.replace(f"@{key}@", str(value))
    return text


def generate_standin(cfg: VTAConfig, out_dir: Path) -> Path:
    """Write ``vta_core.v`` (the stand-in) into ``out_dir``; same signature as ``vta.hw.verilog.generate_verilog``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "vta_core.v"
    path.write_text(standin_verilog(cfg))
    return path
