// A foreign core for vta-lab's TSIM (docs/byo-rtl.md): hand-written Verilog around the generated core.
//
// byo_core has exactly the ports of docs/core-interface.md. It instantiates vta_core_inner (the generated vta_core,
// renamed by make_inner.py) and adds one register stage on each channel of the memory port: the read requests and
// the write beats leave through a skid buffer, the read beats arrive through one. Each stage is a two-entry
// valid/ready buffer: full throughput (one transfer per cycle), its outputs depend on its state alone (as the
// interface asks of the core's memory-port outputs), one cycle more latency each way. `done` waits until the
// stages are empty too (every write beat accepted by the host), and `progress` counts their transfers.
`default_nettype none

module byo_skid #(parameter W = 8) (
    input wire clk,
    input wire rst,
    input wire in_valid,
    output wire in_ready,
    input wire [W-1:0] in_data,
    output wire out_valid,
    input wire out_ready,
    output wire [W-1:0] out_data,
    output wire empty
);
    reg [W-1:0] main_d, skid_d;
    reg main_v, skid_v;
    assign in_ready = !skid_v;
    assign out_valid = main_v;
    assign out_data = main_d;
    assign empty = !main_v && !skid_v;
    always @(posedge clk) begin
        if (rst) begin
            main_v <= 1'b0;
            skid_v <= 1'b0;
        end else if (out_ready || !main_v) begin  // the main slot is free this cycle
            if (skid_v) begin
                main_d <= skid_d;
                main_v <= 1'b1;
                skid_v <= 1'b0;
            end else begin
                main_d <= in_data;
                main_v <= in_valid;
            end
        end else if (in_valid && !skid_v) begin  // main holds a stalled item: park the new one
            skid_d <= in_data;
            skid_v <= 1'b1;
        end
    end
endmodule

module byo_core #(parameter B = 8) (
    input wire clk,
    input wire rst,
    input wire start,
    input wire [31:0] insn_addr,
    input wire [31:0] insn_count,
    output wire done,
    input wire [5:0] csr_addr,
    output wire [63:0] csr_rdata,
    output wire progress,
    output wire mem_rd_req_valid,
    input wire mem_rd_req_ready,
    output wire [31:0] mem_rd_req_addr,
    output wire [15:0] mem_rd_req_len,
    input wire mem_rd_data_valid,
    output wire mem_rd_data_ready,
    input wire [8*B-1:0] mem_rd_data,
    output wire mem_wr_valid,
    input wire mem_wr_ready,
    output wire [31:0] mem_wr_addr,
    output wire [8*B-1:0] mem_wr_data,
    output wire [B-1:0] mem_wr_strb
);
    wire req_valid, req_ready, data_valid, data_ready, wr_valid, wr_ready, inner_done, inner_progress;
    wire [31:0] req_addr, wr_addr;
    wire [15:0] req_len;
    wire [8*B-1:0] data, wr_data;
    wire [B-1:0] wr_strb;
    wire req_empty, data_empty, wr_empty;

    vta_core_inner inner (
        .clk(clk), .rst(rst), .start(start), .insn_addr(insn_addr), .insn_count(insn_count), .done(inner_done),
        .csr_addr(csr_addr), .csr_rdata(csr_rdata), .progress(inner_progress),
        .mem_rd_req_valid(req_valid), .mem_rd_req_ready(req_ready), .mem_rd_req_addr(req_addr),
        .mem_rd_req_len(req_len), .mem_rd_data_valid(data_valid), .mem_rd_data_ready(data_ready),
        .mem_rd_data(data), .mem_wr_valid(wr_valid), .mem_wr_ready(wr_ready), .mem_wr_addr(wr_addr),
        .mem_wr_data(wr_data), .mem_wr_strb(wr_strb)
    );

    byo_skid #(.W(48)) req_stage (
        .clk(clk), .rst(rst), .in_valid(req_valid), .in_ready(req_ready), .in_data({req_len, req_addr}),
        .out_valid(mem_rd_req_valid), .out_ready(mem_rd_req_ready), .out_data({mem_rd_req_len, mem_rd_req_addr}),
        .empty(req_empty)
    );
    byo_skid #(.W(8*B)) data_stage (
        .clk(clk), .rst(rst), .in_valid(mem_rd_data_valid), .in_ready(mem_rd_data_ready), .in_data(mem_rd_data),
        .out_valid(data_valid), .out_ready(data_ready), .out_data(data), .empty(data_empty)
    );
    byo_skid #(.W(32 + 9*B)) wr_stage (
        .clk(clk), .rst(rst), .in_valid(wr_valid), .in_ready(wr_ready), .in_data({wr_strb, wr_data, wr_addr}),
        .out_valid(mem_wr_valid), .out_ready(mem_wr_ready), .out_data({mem_wr_strb, mem_wr_data, mem_wr_addr}),
        .empty(wr_empty)
    );

    assign done = inner_done && req_empty && data_empty && wr_empty;
    assign progress = inner_progress || (mem_rd_req_valid && mem_rd_req_ready)
                      || (mem_rd_data_valid && mem_rd_data_ready) || (mem_wr_valid && mem_wr_ready);
endmodule

`default_nettype wire
