"""The graph IR (compiler/ir.py): construction, validation, requant parameter checks, MAC counts."""
from __future__ import annotations

import numpy as np
import pytest

from vta.compiler.ir import (
    AddRequant,
    Graph,
    GraphError,
    GraphIndex,
    Node,
    Requant,
    TensorInfo,
    conv_output_hw,
    node_macs,
)


def _graph() -> Graph:
    g = Graph("g", inputs=["x"], outputs=["y"])
    g.add_tensor("x", (1, 4, 8, 8), "float32")
    g.add_constant("w", np.zeros((8, 4, 3, 3), np.float32))
    g.add_tensor("c", (1, 8, 8, 8), "float32")
    g.add_tensor("y", (1, 8, 8, 8), "float32")
    g.add_node("Conv2d", "conv", ["x", "w"], ["c"], strides=(1, 1), pads=(1, 1, 1, 1), groups=1)
    g.add_node("Relu", "relu", ["c"], ["y"])
    return g


def test_graph_queries_and_macs():
    g = _graph()
    g.validate()
    assert g.producer("c").name == "conv" and g.producer("x") is None
    assert [n.name for n in g.consumers("c")] == ["relu"]
    assert node_macs(g, g.node("conv")) == 8 * 8 * 8 * 4 * 9
    assert node_macs(g, g.node("relu")) == 0
    assert not g.is_quantized
    assert "conv" in g.summary() and "macs=18432" in g.summary()
    assert g.unique_name("c") == "c_1" and g.unique_name("z") == "z"
    assert g.unique_name("conv", node=True) == "conv_1" and g.unique_name("conv") == "conv"
    with pytest.raises(KeyError, match="Graph 'g' has no node named 'nope'"):
        g.node("nope")


def test_the_node_names_follow_every_edit_of_the_node_list():
    """add_node and unique_name keep the names between calls; an edit of ``nodes`` made directly (remove, insert,
    a new list, a pop) must be seen, and validate names a node name used twice however it got there."""
    g = _graph()
    g.add_tensor("z", (1, 8, 8, 8), "float32")
    assert g.unique_name("relu", node=True) == "relu_1"
    relu = g.nodes.pop()
    assert g.unique_name("relu", node=True) == "relu"
    g.add_node("Relu", "relu", ["c"], ["z"])                   # the name is free again
    g.nodes.insert(0, Node("Relu", "early", ["x"], ["e"], {}))
    with pytest.raises(GraphError, match="Node name 'early' is used twice"):
        g.add_node("Relu", "early", ["c"], ["y"])
    g.nodes = [n for n in g.nodes if n.name != "early"]
    assert g.unique_name("early", node=True) == "early"
    g.nodes.remove(g.node("relu"))
    g.nodes.append(relu)                                       # the same length, another last node
    assert g.unique_name("relu", node=True) == "relu_1"
    g.nodes.append(Node("Relu", "relu", ["c"], ["z"], {}))     # a name used twice behind add_node's back
    with pytest.raises(GraphError, match="node name 'relu' is used twice"):
        g.validate()


def test_graph_index_answers_as_the_graph_does():
    g = _graph()
    g.add_tensor("s", (1, 8, 8, 8), "float32")
    g.add_node("Mul", "square", ["y", "y"], ["s"])               # reads one tensor twice
    g.add_node("Add", "sum", ["s", "c"], ["s2"])
    index = GraphIndex(g)
    for name in ["x", "w", "c", "y", "s", "s2", "absent"]:
        assert index.producer(name) is g.producer(name)
        assert index.consumers(name) == g.consumers(name)
    assert [n.name for n in index.consumers("c")] == ["relu", "sum"]
    index.consumers("c").clear()                                 # a new list each time
    assert len(index.consumers("c")) == 2


def test_validate_collects_problems():
    g = _graph()
    g.nodes.reverse()
    g.nodes[1].attrs = {}
    g.add_node("Wibble", "w2", ["y"], ["y"])
    with pytest.raises(GraphError, match=r"node 'relu' reads 'c' before it is produced; node 'conv' \(Conv2d\) "
                                         r"lacks attribute\(s\) strides, pads, groups; node 'w2' has op 'Wibble'.*"
                                         r"tensor 'y' is written twice\.$"):
        g.validate()


def test_tensor_and_name_errors():
    with pytest.raises(GraphError, match="Tensor 't' has dtype 'float16'; expected one of float32, int8, int32"):
        TensorInfo("t", (1,), "float16")
    with pytest.raises(GraphError, match=r"Tensor 't' has shape \(1, 0\); every dimension must be positive"):
        TensorInfo("t", (1, 0), "int8")
    g = _graph()
    with pytest.raises(GraphError, match="Tensor 'x' is declared twice in graph 'g'"):
        g.add_tensor("x", (1,), "int8")
    with pytest.raises(GraphError, match="Node name 'conv' is used twice"):
        g.add_node("Relu", "conv", ["y"], ["z"])


def test_requant_checks():
    r = Requant(np.array([5, 5]), np.array([3, 3]), lo=0, hi=6)
    assert r.per_tensor and not r.pure_shift and r.channels == 2
    assert repr(r) == "Requant(M=5, S=3, lo=0, hi=6)"
    assert not Requant(np.array([1, 2]), np.array([0, 0])).per_tensor
    with pytest.raises(GraphError, match=r"Requant multiplier spans \[0, 5\]; it must lie in \[1, 32767\]"):
        Requant(np.array([0, 5]), np.array([1, 1]))
    with pytest.raises(GraphError, match=r"Requant shift spans \[1, 32\]; it must lie in \[0, 31\]"):
        Requant(np.array([1, 1]), np.array([1, 32]))
    with pytest.raises(GraphError, match=r"Requant clip range \(5, 4\)"):
        Requant(np.array([1]), np.array([1]), lo=5, hi=4)
    with pytest.raises(GraphError, match="Requant multiplier has shape"):
        Requant(np.array([1, 1]), np.array([1]))
    with pytest.raises(GraphError, match="must hold integers"):
        Requant(np.array([1.5]), np.array([1]))
    with pytest.raises(GraphError, match=r"AddRequant mb=40000 must lie in \[1, 32767\]"):
        AddRequant(ma=1, mb=40000, shift=0)


def test_conv_output_hw():
    assert conv_output_hw(224, 224, (7, 7), (2, 2), (3, 3, 3, 3)) == (112, 112)
    assert conv_output_hw(7, 5, (3, 3), (2, 1), (1, 0, 1, 2)) == (4, 5)


def test_validate_checks_the_accelerator_contract():
    g = Graph("q", inputs=["x"], outputs=["y"])
    g.add_tensor("x", (1, 4), "int8", 0.1)
    g.add_constant("w", np.zeros((3, 4), np.int8))
    g.add_constant("b", np.zeros(3, np.int64).astype(np.int32))
    g.add_tensor("y", (1, 3), "int8", 0.2)
    g.add_node("QDense", "fc", ["x", "w", "b"], ["y"], requant=Requant(np.array([1, 1]), np.array([0, 0])))
    with pytest.raises(GraphError, match=r"node 'fc' \(QDense\) needs a Requant and a bias with 3 channels"):
        g.validate()
    g.nodes[0].attrs["requant"] = Requant(np.array([1, 1, 1]), np.array([0, 0, 0]))
    g.validate()
    g.tensors["y"].scale = None
    g.add_tensor("z", (1, 3), "int8", 0.1)
    g.add_node("QAdd", "add", ["y", "x"], ["z"], requant=AddRequant(1, 1, 0))
    with pytest.raises(GraphError, match=r"node 'fc' \(QDense\) must write an int8 tensor with a scale, not int8 "
                                         r"scale=None; node 'add' \(QAdd\) needs two int8 operands of equal shape"):
        g.validate()


def test_quantized_graph_pickles():
    import pickle

    from vta.compiler import qops
    from vta.compiler.frontend import zoo
    from vta.compiler.frontend.onnx_frontend import import_onnx
    from vta.compiler.frontend.quantize import quantize
    g = import_onnx(zoo.build_model("tiny_cnn"))
    x = np.random.default_rng(0).uniform(0, 1, (3, 1, 8, 8)).astype(np.float32)
    q = quantize(g, {"input": x})
    back = pickle.loads(pickle.dumps(q))
    back.validate()
    assert repr(back.nodes[1].attrs["requant"]) == repr(q.nodes[1].attrs["requant"])
    np.testing.assert_array_equal(qops.run_reference(back, {"input": x[:1]})["output"],
                                  qops.run_reference(q, {"input": x[:1]})["output"])


def test_lut_transpose_and_resize_nodes_validate_and_round_trip_as_data():
    g = Graph("q", inputs=["x"], outputs=["z"])
    g.add_tensor("x", (1, 2, 3, 4), "int8", 0.1)
    g.add_tensor("a", (1, 2, 3, 4), "int8", 0.05)
    g.add_tensor("b", (1, 3, 4, 2), "int8", 0.05)
    g.add_tensor("z", (1, 3, 8, 4), "int8", 0.05)
    g.add_node("QLut", "sig", ["x"], ["a"], table=np.arange(-128, 128).astype(np.int8), function="Sigmoid")
    g.add_node("Transpose", "t", ["a"], ["b"], perm=(0, 2, 3, 1))
    g.add_node("Resize", "up", ["b"], ["z"], mode="linear", coordinate_transformation_mode="half_pixel",
               nearest_mode="round_prefer_floor", scales=(1.0, 1.0, 2.0, 2.0), sizes=(1, 3, 8, 4))
    g.validate()
    back = Graph.from_data(*g.to_data())
    assert back.node("up").attrs == g.node("up").attrs and back.node("t").attrs["perm"] == (0, 2, 3, 1)
    np.testing.assert_array_equal(back.node("sig").attrs["table"], g.node("sig").attrs["table"])
    del g.node("up").attrs["sizes"]
    with pytest.raises(GraphError, match=r"node 'up' \(Resize\) lacks attribute\(s\) sizes"):
        g.validate()
