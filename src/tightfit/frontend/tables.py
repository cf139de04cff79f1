"""The zoo's models written from published layer tables, built as ONNX graphs with no PyTorch.

Each graph is what `torch.onnx.export` wrote for the nn.Sequential these models once were (the
same node, tensor and weight names, "/3/MaxPool", "4.weight", batch norms kept as nodes), so the
imported layers, their ids and names, shapes and parameter counts are those of the PyTorch
version; the weights are zeros here, drawn by role afterwards (`zoo.randomize_onnx`)."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
BN_EPSILON = 1e-5  # torch's BatchNorm2d defaults, as its exporter writes them
BN_MOMENTUM = 0.9


class _Sequential:
    """Appends layers the way torch's exporter names an nn.Sequential's: module i's node is
    "/i/Conv" with output "/i/Conv_output_0" and weights "i.weight", "i.bias"."""

    def __init__(self, channels: int) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.x = "input"
        self.c = channels
        self.index = 0

    def _node(self, op: str, inputs: Sequence[str], prefix: str | None = None, **attrs) -> None:
        prefix = f"/{self.index}" if prefix is None else prefix
        out = f"{prefix}/{op}_output_0"
        self.nodes.append(helper.make_node(op, [self.x, *inputs], [out], name=f"{prefix}/{op}", **attrs))
        self.x = out
        self.index += prefix == f"/{self.index}"

    def _weight(self, name: str, shape: tuple[int, ...]) -> str:
        self.inits.append(numpy_helper.from_array(np.zeros(shape, np.float32), name))
        return name

    def conv(self, cout: int, k: int, stride: int = 1, pad: int = 0, groups: int = 1, bias: bool = True,
             module: str | None = None) -> None:
        m = str(self.index) if module is None else module
        params = [self._weight(f"{m}.weight", (cout, self.c // groups, k, k))]
        if bias:
            params.append(self._weight(f"{m}.bias", (cout,)))
        self._node("Conv", params, None if module is None else f"/{module}", dilations=[1, 1], group=groups,
                   kernel_shape=[k, k], pads=[pad] * 4, strides=[stride, stride])
        self.c = cout

    def batchnorm(self) -> None:
        m = str(self.index)
        params = [self._weight(f"{m}.{p}", (self.c,)) for p in ("weight", "bias", "running_mean", "running_var")]
        self._node("BatchNormalization", params, epsilon=BN_EPSILON, momentum=BN_MOMENTUM, training_mode=0)

    def activation(self, op: str, **attrs) -> None:
        self._node(op, [], **attrs)

    def maxpool(self, k: int, stride: int) -> None:
        self._node("MaxPool", [], ceil_mode=0, dilations=[1, 1], kernel_shape=[k, k], pads=[0, 0, 0, 0],
                   strides=[stride, stride])

    def pad(self, pads: Sequence[int], mode: str, module: str | None = None) -> None:
        """A Pad node (pads in ONNX order: begins of N, C, H, W then ends), its pads a constant."""
        prefix = f"/{self.index}" if module is None else module
        name = f"{prefix}/Pad_pads"
        self.inits.append(numpy_helper.from_array(np.asarray(pads, np.int64), name))
        self._node("Pad", [name], prefix, mode=mode)

    def global_avgpool(self) -> None:
        self._node("GlobalAveragePool", [])

    def flatten(self) -> None:
        self._node("Flatten", [], axis=1)

    def dense(self, cout: int) -> None:
        m = str(self.index)
        self._node("Gemm", [self._weight(f"{m}.weight", (cout, self.c)), self._weight(f"{m}.bias", (cout,))],
                   alpha=1.0, beta=1.0, transB=1)
        self.c = cout

    def model(self, name: str, input_shape: Sequence[int]) -> onnx.ModelProto:
        """The ONNX model; the last node's output is renamed "output", as the exporter names it."""
        self.nodes[-1].output[0] = "output"
        graph = helper.make_graph(
            self.nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(input_shape))],
            [helper.make_tensor_value_info("output", TensorProto.FLOAT, None)], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tightfit",
                                  ir_version=8)
        # The output's declared shape, as an exporter writes it (the checker requires one).
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0]
        model.graph.output[0].CopyFrom(inferred)
        return model


def _darknet(s: _Sequential, spec: Sequence) -> None:
    """Darknet's layers: (channels, kernel) is conv + batch norm + leaky ReLU 0.1; "M" a 2x2
    stride-2 max pool; "M1" a 2x2 stride-1 max pool after an edge pad of one row and column."""
    for item in spec:
        if item == "M":
            s.maxpool(2, 2)
        elif item == "M1":
            s.pad([0, 0, 0, 0, 0, 0, 1, 1], "edge")
            s.maxpool(2, 1)
        else:
            cout, k = item
            s.conv(cout, k, pad=k // 2, bias=False)
            s.batchnorm()
            s.activation("LeakyRelu", alpha=0.1)


def yolov2_16(input_shape: Sequence[int]) -> onnx.ModelProto:
    """YOLOv2's first 16 layers as in MAFAT Table 2.1 (Darknet: conv + BN + leaky, 2x2 max)."""
    s = _Sequential(3)
    _darknet(s, [(32, 3), "M", (64, 3), "M", (128, 3), (64, 1), (128, 3), "M",
                 (256, 3), (128, 1), (256, 3), "M", (512, 3), (256, 1), (512, 3), (256, 1)])
    return s.model("yolov2-16", input_shape)


def tiny_yolov2(input_shape: Sequence[int]) -> onnx.ModelProto:
    """Tiny YOLOv2 (VOC, 416x416): 9 conv layers, 6 max pools, 125-channel 13x13 head."""
    s = _Sequential(3)
    _darknet(s, [(16, 3), "M", (32, 3), "M", (64, 3), "M", (128, 3), "M", (256, 3), "M", (512, 3), "M1",
                 (1024, 3), (1024, 3)])
    s.conv(125, 1)
    return s.model("tiny-yolov2", input_shape)


def mobilenet_v1(input_shape: Sequence[int], width: float = 1.0) -> onnx.ModelProto:
    """MobileNet v1 (Howard et al. 2017, Table 1) with width multiplier."""
    def c(ch: int) -> int:
        return max(8, int(ch * width))

    def conv_bn_relu(cout: int, k: int, stride: int, groups: int = 1) -> None:
        s.conv(cout, k, stride, k // 2, groups, bias=False)
        s.batchnorm()
        s.activation("Relu")

    s = _Sequential(3)
    conv_bn_relu(c(32), 3, 2)
    for cout, stride in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]:
        conv_bn_relu(s.c, 3, stride, groups=s.c)
        conv_bn_relu(c(cout), 1, 1)
    s.global_avgpool()
    s.flatten()
    s.dense(1000)
    return s.model(f"mobilenet_v1_{width:g}", input_shape)


def minakova5(input_shape: Sequence[int]) -> onnx.ModelProto:
    """The 5-layer example CNN of Minakova & Stefanov Fig. 1: n1 input 32x32x1; n2 17x17 conv to
    16x16x4; n3 5x5 stride-3 conv with crop 1 (pad -1) to 4x4x3; n4 4x4 conv to 1x1x2; n5 output."""
    s = _Sequential(1)
    s.conv(4, 17, module="n2")
    s.pad([0, 0, -1, -1, 0, 0, -1, -1], "constant", module="")
    s.conv(3, 5, stride=3, module="n3")
    s.conv(2, 4, module="n4")
    return s.model("minakova5", input_shape)


# name -> (builder at an input shape, the zoo's input shape, about)
TABLES: dict[str, tuple[Callable[[Sequence[int]], onnx.ModelProto], tuple[int, int, int, int], str]] = {
    "yolov2-16": (yolov2_16, (1, 3, 608, 608), "YOLOv2 first 16 layers (MAFAT Table 2.1)"),
    "tiny-yolov2": (tiny_yolov2, (1, 3, 416, 416), "Tiny YOLOv2 (VOC)"),
    "mobilenet_v1": (mobilenet_v1, (1, 3, 224, 224), "MobileNet v1, width 1.0"),
    "mobilenet_v1_025": (lambda shape: mobilenet_v1(shape, 0.25), (1, 3, 224, 224), "MobileNet v1, width 0.25"),
    "minakova5": (minakova5, (1, 1, 32, 32), "5-layer example CNN of Minakova & Stefanov Fig. 1"),
}
