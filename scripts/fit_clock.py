"""Fit the clock model (vta/clock.py) to place-and-route results and state its error on held-out designs.

    python3 scripts/fit_clock.py [CONFIG ...]      (default: the designs of docs/hardware.md's "Timing" table)

For each config, runs ``vta hw timing`` (seed 1, LFE5U-85F; cached: minutes the first time, instant after), then
prints: each design's routed clock and critical path; the logic delay of each element of the model
(:data:`vta.clock.ELEMENT_NS`) as nextpnr reports it on the routed paths (median over the designs); the routing fit
(:func:`vta.clock.fit_routing`) on all designs; and each design's leave-one-out error (the model fitted on the others).
Paste the figures into vta/clock.py (``ELEMENT_NS``, ``CALIBRATION``, ``ROUTING``, ``MODEL_ERROR_PCT``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from vta.clock import fit_routing, leave_one_out, model_clock, path_delays
from vta.config import load_config
from vta.hw.timing import timing

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = ("configs/timing/small1x4.toml", "configs/timing/small1x4_rq.toml", "configs/small1x8.toml",
           "configs/timing/small1x8_rq.toml")
"""The designs the model is fitted on: BLOCK 4 and 8, with and without FUSED_REQUANT."""
CELL_ELEMENT = {"DP16KD": "bram", "TRELLIS_FF": "ff", "MULT18X18D": "mult", "CCU2C": "carry", "LUT4": "lut",
                "PFUMX": "lut", "L6MUX21": "lut", "TRELLIS_DPR16X4": "lut"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", default=[str(ROOT / d) for d in DESIGNS])
    args = parser.parse_args()
    points, delays = [], {}
    for path in args.configs:
        cfg = load_config(path)
        result = timing(cfg, seed=1, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
        if result["source"] != "place-and-route":
            print(f"{cfg.name}: {result['source']} (not routed), left out of the fit")
            continue
        crit = result["critical_path"]
        print(f"{cfg.name}: {result['fmax_mhz']} MHz, {crit['unit']}: {crit['from']} -> {crit['to']}, "
              f"logic {crit['logic_ns']} ns + routing {crit['routing_ns']} ns, elements {crit['elements']}")
        points.append((cfg, float(result["fmax_mhz"])))
        for kind, cells, ns in crit["elements"]:
            element = CELL_ELEMENT.get(kind)
            if element == "ff" and ns == 0:
                element = "setup"
            if element is not None and (element != "carry" or cells >= 16):
                delays.setdefault(element, []).append(ns)
    print("element delays (ns, median over the routed paths):",
          {k: round(statistics.median(v), 3) for k, v in sorted(delays.items())})
    if len(points) >= 2:
        print("routing fit (a, b):", tuple(round(x, 4) for x in fit_routing(points)))
        for (cfg, mhz), err in zip(points, leave_one_out(points)):
            print(f"  {cfg.name}: routed {mhz} MHz, model now {model_clock(cfg).mhz} MHz "
                  f"({path_delays(cfg)}), leave-one-out error {err:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
