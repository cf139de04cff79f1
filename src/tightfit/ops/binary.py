"""Elementwise ops over several inputs: Add/Sum (residual joins) and Mul (broadcast over H, W for
squeeze-excitation). Constant operands (a bias or a scale) are parameters."""
from __future__ import annotations

import numpy as np
import torch

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.activation import apply_activations
from tightfit.ops.base import OnnxNode, OnnxSpec, Op, Shape, expect
from tightfit.ops.conv import clamp_bounds
from tightfit.ops.native import add_call


class _Elementwise(Op):
    inplace_ok = True
    combine: str

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        dynamic = [t for t in node.inputs if node.const(t) is None]
        consts = [node.const(t).astype(np.float32) for t in node.inputs if node.const(t) is not None]
        out_rank = max(len(node.shape(t)) for t in dynamic)
        for c in consts:
            if c.ndim > out_rank:
                raise ValueError("constant operand of higher rank than the data")
        consts = [c.reshape((1,) * (out_rank - c.ndim) + c.shape) for c in consts]
        attrs = {"act": ()}
        if consts:
            # The constants' broadcast shape, so the output shape is known without the graph
            # (a constant may be larger than the data: x (N,C,1,1) + b (1,C,H,W)).
            attrs["param_shape"] = tuple(int(d) for d in np.broadcast_shapes(*[c.shape for c in consts]))
        return OnnxSpec(attrs, dynamic, consts)

    def check(self, layer: Layer, in_shapes, params) -> None:
        """Data inputs of the output's rank and batch, each dim the output's or 1 (a data input
        broadcast over H or W is read whole there); constants of one sample."""
        expect(len(in_shapes) >= 1, "takes at least one data input")
        rank = len(in_shapes[0])
        expect(all(len(s) == rank for s in in_shapes) and rank in (2, 4),
               f"data inputs of shapes {[tuple(s) for s in in_shapes]} must all have rank 2 or all rank 4")
        expect(all(s[0] == in_shapes[0][0] for s in in_shapes), f"data inputs {[tuple(s) for s in in_shapes]} differ in batch")
        expect(all(p.ndim == rank and p.shape[0] == 1 for p in params),
               f"constant operands of shapes {[tuple(p.shape) for p in params]} must be one sample of rank {rank}")
        try:
            out = np.broadcast_shapes(*[tuple(s) for s in in_shapes], *[tuple(p.shape) for p in params])
        except ValueError:
            raise ValueError(f"operands of shapes {[tuple(s) for s in in_shapes] + [tuple(p.shape) for p in params]} "
                             f"do not broadcast") from None
        expect(all(d >= 1 for d in out), f"operands broadcast to an empty shape {out}")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        shapes = list(in_shapes)
        if graph is not None:
            shapes += [graph.params[p].shape for p in layer.params]
        elif "param_shape" in layer.attrs:
            shapes.append(tuple(layer.attrs["param_shape"]))
        shape = np.broadcast_shapes(*[tuple(s) for s in shapes])
        return (in_shapes[0][0],) + tuple(shape[1:])

    def kernel_bytes(self, layer, graph, itemsize) -> int:
        return 0

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape) * max(1, len(in_shapes) + len(layer.params) - 1)

    def bind(self, layer, inputs, windows, out, out_region, params):
        """A sum of two same-shaped views with a clamp runs on our own kernel (ops/native.py)."""
        clamp = clamp_bounds(layer.attrs["act"])
        if self.combine == "add" and len(inputs) == 2 and not params and clamp is not None:
            native = add_call(out, inputs[0], inputs[1], clamp)
            if native is not None:
                return native
        return super().bind(layer, inputs, windows, out, out_region, params)

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        operands = list(inputs) + [_param_region(p, out_region) for p in params]
        # Add and Mul commute: start from the operand the output is written over (if any), so
        # an output placed over any input of its shape is read before it is overwritten.
        for i, x in enumerate(operands):
            if x.shape == out.shape and x.data_ptr() == out.data_ptr() and x.stride() == out.stride():
                operands.insert(0, operands.pop(i))
                break
        first = operands[0]
        if first.shape == out.shape:
            if out.data_ptr() != first.data_ptr():
                out.copy_(first)
        else:
            out.copy_(first.expand_as(out))
        for x in operands[1:]:
            (out.add_ if self.combine == "add" else out.mul_)(x)
        apply_activations(out, layer.attrs["act"])


def _param_region(p: torch.Tensor, region) -> torch.Tensor:
    """A constant operand broadcast over N; slice each of its H, W that is not broadcast."""
    if p.dim() == 4:
        if p.shape[2] > 1:
            p = p[:, :, region.h0 : region.h1]
        if p.shape[3] > 1:
            p = p[:, :, :, region.w0 : region.w1]
    return p


@register
class Add(_Elementwise):
    name = "add"
    onnx_types = ("Add", "Sum")
    combine = "add"


@register
class Mul(_Elementwise):
    name = "mul"
    onnx_types = ("Mul",)
    combine = "mul"
