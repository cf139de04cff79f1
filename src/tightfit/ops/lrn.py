"""Local response normalization across channels (AlexNet, GoogLeNet): local in H and W, so it
splits by rows and tiles."""
from __future__ import annotations


from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import OnnxNode, OnnxSpec, Op, Shape, expect, expect_rank


@register
class LRN(Op):
    name = "lrn"
    onnx_types = ("LRN",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        a = node.attrs
        return OnnxSpec({"size": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)),
                         "beta": float(a.get("beta", 0.75)), "bias": float(a.get("bias", 1.0))}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        expect_rank(in_shapes[0], (4,))
        expect(isinstance(layer.attrs["size"], int) and layer.attrs["size"] >= 1, f"size {layer.attrs['size']} must be >= 1")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape) * layer.attrs["size"]
