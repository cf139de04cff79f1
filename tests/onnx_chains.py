"""Small CNN chains written as ONNX directly, so the tests that need one run without PyTorch:
what an nn.Sequential of Conv2d, ReLU and MaxPool2d exports, spelled as tuples
("conv", out_channels, kernel, pad), ("relu",), ("maxpool", kernel) (stride = kernel)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tightfit.frontend.onnx_import import import_model
from tightfit.graph.ir import Graph


def conv(rng, i, x: str, c: int, shape: list[int], out: int, k: int, pad: int) -> tuple:
    """A Conv node (its output "t{i}"), its weights with PyTorch's default initialisation scale
    (uniform within 1/sqrt(fan-in)), and its output shape."""
    bound = 1.0 / np.sqrt(c * k * k)
    w = rng.uniform(-bound, bound, (out, c, k, k)).astype(np.float32)
    b = rng.uniform(-bound, bound, out).astype(np.float32)
    node = helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"t{i}"], kernel_shape=[k, k], pads=[pad] * 4)
    shape = [shape[0], out, shape[2] + 2 * pad - k + 1, shape[3] + 2 * pad - k + 1]
    return node, [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")], shape


def model_of(nodes: list, inits: list, input_shape: Sequence[int], output: str,
             output_shape: Sequence[int]) -> onnx.ModelProto:
    """Nodes over the input "x" as a checked opset-17 model with one output."""
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, list(output_shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def chain_model(layers: Sequence[tuple], input_shape: Sequence[int], seed: int = 0,
                swap_hw: bool = False) -> onnx.ModelProto:
    """The chain as an opset-17 model; `swap_hw` puts a Transpose of H and W first."""
    rng = np.random.default_rng(seed)
    nodes, inits, x, shape = [], [], "x", list(input_shape)
    if swap_hw:
        nodes.append(helper.make_node("Transpose", [x], ["xt"], perm=[0, 1, 3, 2]))
        x, shape = "xt", [shape[0], shape[1], shape[3], shape[2]]
    for i, (kind, *a) in enumerate(layers):
        if kind == "conv":
            node, weights, shape = conv(rng, i, x, shape[1], shape, *a)
            nodes.append(node)
            inits += weights
        elif kind == "relu":
            nodes.append(helper.make_node("Relu", [x], [f"t{i}"]))
        elif kind == "maxpool":
            nodes.append(helper.make_node("MaxPool", [x], [f"t{i}"], kernel_shape=[a[0]] * 2, strides=[a[0]] * 2))
            shape = [shape[0], shape[1], shape[2] // a[0], shape[3] // a[0]]
        else:
            raise ValueError(f"no layer kind {kind!r}")
        x = f"t{i}"
    return model_of(nodes, inits, input_shape, x, shape)


def chain_graph(layers: Sequence[tuple], input_shape: Sequence[int], name: str, seed: int = 0,
                swap_hw: bool = False) -> Graph:
    """The chain imported as tightfit's graph."""
    return import_model(chain_model(layers, input_shape, seed, swap_hw), None, name)
