"""Elementwise unary layers: a standalone activation chain, and batch normalization that could
not be fused into a preceding conv (e.g. DenseNet's pre-activation BN -> ReLU)."""
from __future__ import annotations

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import OnnxNode, OnnxSpec, Op, Shape, expect, expect_rank


@register
class Activation(Op):
    """A chain of activations on one tensor; the importer builds it from Relu, Clip, ..."""

    name = "activation"
    inplace_ok = True

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])


@register
class BatchNorm(Op):
    name = "batchnorm"
    onnx_types = ("BatchNormalization",)
    inplace_ok = True

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        params = [node.const_input(i) for i in range(1, 5)]
        if any(p is None for p in params):
            raise ValueError("batch norm statistics must be constants (inference mode)")
        if any(p.ndim != 1 for p in params) or int(node.attrs.get("training_mode", 0)):
            raise ValueError("only inference batch norm with per-channel statistics is supported")
        return OnnxSpec({"epsilon": float(node.attrs.get("epsilon", 1e-5)), "act": ()}, [node.inputs[0]],
                        [p.astype(np.float32) for p in params])

    def check(self, layer: Layer, in_shapes, params) -> None:
        """Four statistics of one value per channel of an (N, C) or (N, C, H, W) input."""
        super().check(layer, in_shapes, params)
        expect_rank(in_shapes[0], (2, 4))
        c = in_shapes[0][1]
        expect(len(params) == 4 and all(tuple(p.shape) == (c,) for p in params),
               f"statistics of shapes {[tuple(p.shape) for p in params]}, expected four of ({c},)")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])

    def param_bytes(self, layer, graph, itemsize) -> int:
        return 2 * int(graph.params[layer.params[0]].size) * itemsize  # folded to scale + shift
