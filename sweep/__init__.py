"""Design-space sweeps (``vta sweep FILE``): which accelerator to build for a set of models.

``spec`` (the sweep file, validated whole, expanded to points), ``measure`` (one point in a worker: compile, cycle
model or tsim, area, energy), ``runner`` (local processes or Dask, resumable), ``store`` (SQLite rows), ``area``
(analytical FPGA area), ``counts`` and ``energy`` (event counts and a 45 nm energy table), ``pareto`` (frontiers,
plots, tables), ``cli`` (the command). The top floor: imported by nothing but the CLI and scripts.
"""
