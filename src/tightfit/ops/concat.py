"""Concat along channels (inception and densenet joins); splittable by rows and tiles."""
from __future__ import annotations

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.activation import apply_activations
from tightfit.ops.base import OnnxNode, OnnxSpec, Op, Shape, expect


@register
class Concat(Op):
    name = "concat"
    onnx_types = ("Concat",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        rank = len(node.shape(node.inputs[0]))
        axis = int(node.attrs.get("axis", 1)) % rank
        if axis != 1:
            raise ValueError("only concatenation along channels (axis 1) is supported")
        if any(node.const(t) is not None for t in node.inputs):
            raise ValueError("concatenation with a constant is not supported")
        return OnnxSpec({"act": ()}, list(node.inputs))

    def check(self, layer: Layer, in_shapes, params) -> None:
        """Inputs alike but in channels."""
        expect(len(in_shapes) >= 1 and not params, "takes one or more data inputs and no constants")
        first = tuple(in_shapes[0])
        expect(len(first) in (2, 4) and all(len(s) == len(first) and s[0] == first[0] and tuple(s[2:]) == first[2:] for s in in_shapes),
               f"inputs of shapes {[tuple(s) for s in in_shapes]} differ in more than their channels")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        first = tuple(in_shapes[0])
        return (first[0], sum(s[1] for s in in_shapes)) + first[2:]

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape)

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        c = 0
        for x in inputs:
            out[:, c : c + x.shape[1]].copy_(x)
            c += x.shape[1]
        apply_activations(out, layer.attrs["act"])
