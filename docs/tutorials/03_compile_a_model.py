#!/usr/bin/env python3
# Tutorial 3: compiling a model. ResNet-18 from its ONNX file to a compiled artefact (.vtac), what ran where and
# why, a run checked against the integer reference, the report with its plots, and the disassembly of one layer.
#
# Run it:   python docs/tutorials/03_compile_a_model.py                          (ResNet-18 on fsim, ~20 s)
#           python docs/tutorials/03_compile_a_model.py --target tsim            (cycles from the RTL: minutes)
#           python docs/tutorials/03_compile_a_model.py --model mini_resnet      (a small zoo model, ~3 s)
#           python docs/tutorials/03_compile_a_model.py --model my_model.onnx    (your own ONNX file)
# The model can also be given in the environment: VTA_TUTORIAL_MODEL=mini_resnet (the tests use it).
#
# The same steps on the command line:
#   vta compile resnet18 -o build/tutorials/resnet18.vtac
#   vta run build/tutorials/resnet18.vtac --report-json build/tutorials/r.json --plot build/tutorials/r.png --reasons
#   vta disasm build/tutorials/resnet18.vtac --layer NAME
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

import numpy as np

from vta.asm import disassemble
from vta.compiler.frontend import zoo
from vta.compiler.pipeline import compile_model, random_inputs
from vta.compiler.qops import run_reference
from vta.compiler.report import build_report, roofline_path
from vta.compiler.runtime.compiled import AccelStep, Compiled
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig
from vta.programfile import read_program

OUT_DIR = os.path.join("build", "tutorials")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Tutorial 3: compile a model, run it, read the report")
    parser.add_argument("--model", default=os.environ.get("VTA_TUTORIAL_MODEL", "resnet18"),
                        help="a zoo model name or an .onnx file (default: resnet18, or $VTA_TUTORIAL_MODEL)")
    parser.add_argument("--target", default="fsim", choices=["fsim", "tsim"], help="where accelerator layers run")
    args = parser.parse_args(argv)
    os.makedirs(OUT_DIR, exist_ok=True)

    # 1. The ONNX file. Zoo models are built by the lab (seeded weights) and cached as ordinary ONNX files; any
    #    other .onnx path works the same way (a file with symbolic dimensions beyond the batch needs input_shapes,
    #    `vta run --input-shape NAME=1x3x224x224` on the command line).
    onnx_path = str(zoo.get_model(args.model)) if args.model in zoo.list_models() else args.model
    name = os.path.splitext(os.path.basename(args.model))[0]
    print(f"model: {onnx_path}")

    # 2. Compile: import, quantize to int8 (calibrated on sample inputs), partition (each node on the accelerator
    #    or the CPU), then tile and generate one accelerator program per accelerator layer. The artefact holds all
    #    of it: save it once, run it many times (`vta run FILE.vtac`).
    cfg = VTAConfig()
    compiled = compile_model(onnx_path, cfg)
    vtac = os.path.join(OUT_DIR, f"{name}.vtac")
    compiled.save(vtac)
    seconds = compiled.compile_seconds or 0.0  # a fact of this run: the artefact does not store it
    compiled = Compiled.load(vtac)   # what a later session would do
    where = Counter(step.where for step in compiled.steps)
    print(f"compiled in {seconds:.2f} s: {where['accel']} of {len(compiled.steps)} layers on the "
          f"accelerator; wrote {vtac}")

    # 3. What ran where, and why: each node has a Decision (target, reason, estimated times in microseconds).
    print("placement of the first layers:")
    for step in compiled.steps[:6]:
        decision = compiled.decisions[step.node.name]
        print(f"  {step.node.name:18s} {step.node.op:14s} {decision.target:6s} {decision.reason}")

    # 4. Run it: accelerator layers on the target, the rest on the CPU fallback; the output must equal the integer
    #    reference of the quantized model bit for bit.
    inputs = random_inputs(compiled.graph, seed=0)
    out = run(compiled, inputs, target=args.target)
    reference = run_reference(compiled.graph, inputs)
    exact = all(np.array_equal(reference[k], out.outputs[k]) for k in reference)
    print(f"ran on {args.target}: output equals the integer reference: {exact}")

    # 5. The report: one row per layer (where, MACs, micro-ops, cycles on tsim, utilization, bytes, energy) and
    #    totals; as a table, JSON/CSV, and two plots: per-layer bars and a roofline.
    report = build_report(compiled, out, model=name)
    print(report.format())
    files = {"json": os.path.join(OUT_DIR, f"{name}_report.json"), "plot": os.path.join(OUT_DIR, f"{name}.png")}
    report.write_json(files["json"])
    report.plot(files["plot"])
    files["roofline"] = roofline_path(files["plot"])
    report.plot_roofline(files["roofline"])
    for path in files.values():
        print(f"wrote {path}")

    # 6. One layer's program, disassembled: the first accelerator layer (`vta disasm FILE.vtac --layer NAME`).
    layer = next(step for step in compiled.steps if isinstance(step, AccelStep))
    _, program = read_program(vtac, layer.node.name)
    text = disassemble(program.insns, program.cfg)
    print(f"layer {layer.node.name} ({layer.tiling}): {len(program.insns)} instructions; the first 8:")
    print("\n".join("  " + line for line in text.splitlines()[:8]))
    return {"compiled": compiled, "out": out, "reference": reference, "exact": exact, "report": report,
            "files": files, "vtac": vtac, "layer": layer.node.name, "text": text}


if __name__ == "__main__":
    main(sys.argv[1:])
