"""Tests for vta.compiler.runtime.fingerprint: a compiled model's parts by digest, and differences that name the
part."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vta.compiler.pipeline import compile_model
from vta.compiler.runtime.compiled import AccelStep, Compiled
from vta.compiler.runtime.fingerprint import PART_MEANINGS, differences, fingerprint, program_parts
from vta.config import VTAConfig


@pytest.fixture(scope="module")
def tiny() -> Compiled:
    return compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2)


def _with_dram_byte_flipped(compiled: Compiled, layer: str, allocation: str) -> Compiled:
    steps = []
    for step in compiled.steps:
        if isinstance(step, AccelStep) and step.node.name == layer:
            dram = step.program.dram.copy()
            dram[step.program.allocations[allocation].offset] ^= 1
            step = dataclasses.replace(step, program=dataclasses.replace(step.program, dram=dram))
        steps.append(step)
    return dataclasses.replace(compiled, steps=steps)


def test_every_accelerator_layer_has_its_instructions_allocations_layout_and_schedule(tiny):
    parts = fingerprint(tiny)
    for step in tiny.steps:
        if isinstance(step, AccelStep):
            names = {f"{step.node.name} {p}" for p in ["instructions", "layout", "schedule",
                                                      *step.program.allocations]}
            assert names <= set(parts)
    assert {"graph", "scales", "decisions"} <= set(parts)
    assert {p for p in parts if p.startswith("constant ")} == {f"constant {n}" for n in tiny.graph.constants}
    assert all(len(v) == 16 and int(v, 16) >= 0 for v in parts.values())


def test_the_same_compile_has_no_differences(tiny):
    again = compile_model("tiny_cnn", VTAConfig(), policy="accel", calib=2)
    assert differences(fingerprint(tiny), fingerprint(again)) == []


def test_a_changed_weight_byte_names_the_layer_and_its_weights(tiny):
    moved = differences(fingerprint(tiny), fingerprint(_with_dram_byte_flipped(tiny, "conv_7", "w")),
                        names=("before", "after"))
    assert len(moved) == 1
    assert moved[0].startswith("conv_7 w: ") and " in before, " in moved[0]
    assert moved[0].endswith(PART_MEANINGS["w"])


def test_a_changed_micro_op_names_the_kernels(tiny):
    moved = differences(fingerprint(tiny), fingerprint(_with_dram_byte_flipped(tiny, "gemm_12", "uops0")))
    assert [m.split(":")[0] for m in moved] == ["gemm_12 uops0"]
    assert moved[0].endswith(PART_MEANINGS["uops"])


def test_a_changed_scale_names_the_scales_not_the_constants(tiny):
    graph = tiny.graph.copy()
    name = next(t for t in graph.tensors.values() if t.scale is not None).name
    graph.tensors[name] = dataclasses.replace(graph.tensors[name], scale=graph.tensors[name].scale * 2)
    moved = differences(fingerprint(tiny), fingerprint(dataclasses.replace(tiny, graph=graph)))
    assert [m.split(":")[0] for m in moved] == ["scales"]


def test_program_parts_cover_the_instruction_stream(tiny):
    step = next(s for s in tiny.steps if isinstance(s, AccelStep))
    parts = program_parts(step.program)
    dram = step.program.dram.copy()
    dram[step.program.insn_offset] ^= 0xFF
    changed = program_parts(dataclasses.replace(step.program, dram=dram))
    assert [k for k in parts if parts[k] != changed[k]] == ["instructions"]
    assert not np.array_equal(step.program.dram, dram)  # the compile itself is untouched


def test_parts_only_in_one_compile_are_named():
    assert differences({"graph": "1", "conv_1 w": "2"}, {"graph": "1", "conv_2 w": "2"}, names=("old", "new")) == [
        f"conv_1 w: only in old ({PART_MEANINGS['w']})", f"conv_2 w: only in new ({PART_MEANINGS['w']})"]
