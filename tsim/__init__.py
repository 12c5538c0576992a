"""vta.tsim: cycle-accurate co-simulation of the generated core in Verilator (installed from tsim/)."""
