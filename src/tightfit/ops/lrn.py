"""Local response normalization across channels (AlexNet, GoogLeNet): local in H and W, so it
splits by rows and tiles."""
from __future__ import annotations

import torch.nn.functional as F

from tightfit.graph.ir import Layer
from tightfit.ops import register
from tightfit.ops.base import OnnxNode, OnnxSpec, Op, Shape


@register
class LRN(Op):
    name = "lrn"
    onnx_types = ("LRN",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        a = node.attrs
        return OnnxSpec({"size": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)),
                         "beta": float(a.get("beta", 0.75)), "bias": float(a.get("bias", 1.0))}, [node.inputs[0]])

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape) * layer.attrs["size"]

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch") -> int:
        # torch's implementation keeps the squared input, its padded copy and the divisor.
        return 3 * out.numel(out_shape) * itemsize if model == "torch" else 0

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        a = layer.attrs
        out.copy_(F.local_response_norm(inputs[0], a["size"], a["alpha"], a["beta"], a["bias"]))
