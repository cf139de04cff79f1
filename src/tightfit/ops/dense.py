"""Dense layers (Gemm, MatMul with a constant weight), which need whole samples (they split only
along N), and Softmax over channels, which is per pixel."""
from __future__ import annotations

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.attention import matmul_spec, softmax_axis_spec
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_rank


@register
class Gemm(Op):
    """y = x W^T + b with W stored (out, in); a rank-4 input is flattened (fused Flatten)."""

    name = "gemm"
    onnx_types = ("Gemm", "MatMul")
    splittable = False

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        w = node.const_input(1)
        if node.op_type == "MatMul" and w is None and node.const_input(0) is None:
            return matmul_spec(node)
        if w is None or w.ndim != 2 or node.const_input(0) is not None:
            raise ValueError("only data x constant-weight products and products of two activations are supported")
        if node.op_type == "MatMul":
            rank = len(node.shape(node.inputs[0]))
            if not 2 <= rank <= 6:
                raise ValueError(f"MatMul of data of rank {rank} by a constant weight; ranks 2 to 6 are supported")
            attrs = {"act": (), "out_features": int(w.shape[1])} | ({"last_axis": True} if rank >= 3 else {})
            return OnnxSpec(attrs, [node.inputs[0]], [w.T.astype(np.float32)])
        if node.attrs.get("transA", 0):
            raise ValueError("Gemm with transA is not supported")
        alpha, beta = float(node.attrs.get("alpha", 1.0)), float(node.attrs.get("beta", 1.0))
        w = w if node.attrs.get("transB", 0) else w.T
        w = w * np.float32(alpha) if alpha != 1.0 else w  # one copy, not two, for VGG-sized weights
        params = [np.ascontiguousarray(w, dtype=np.float32)]
        b = node.const_input(2)
        if b is not None:
            b = np.asarray(b, dtype=np.float64) * beta
            if b.ndim == 2 and b.shape[0] == 1:  # C of shape (1, out): the same bias for every row
                b = b[0]
            if b.ndim > 1 or b.size not in (1, w.shape[0]):
                raise ValueError(f"Gemm bias of shape {b.shape} differs per sample; only (out,), (1, out) or scalars are supported")
            params.append(np.broadcast_to(b, (w.shape[0],)).astype(np.float32))
        return OnnxSpec({"act": (), "out_features": int(w.shape[0])}, [node.inputs[0]], params)

    def check(self, layer: Layer, in_shapes, params) -> None:
        """The weight's (out, in) against the input's per-sample size (a 4-D input is flattened)."""
        super().check(layer, in_shapes, params)
        expect_rank(in_shapes[0], (3, 4, 5, 6) if layer.attrs.get("last_axis") else (2, 4))
        features, out = _features(layer, in_shapes[0]), layer.attrs["out_features"]
        expect(1 <= len(params) <= 2, f"takes a weight and an optional bias, got {len(params)} parameters")
        expect(tuple(params[0].shape) == (out, features),
               f"weight of shape {tuple(params[0].shape)} does not fit {features} input features: expected ({out}, {features})")
        if len(params) > 1:
            expect(tuple(params[1].shape) == (out,), f"bias of shape {tuple(params[1].shape)}, expected ({out},)")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        if layer.attrs.get("last_axis"):  # tokens (N, T, C) -> (N, T, out)
            return tuple(in_shapes[0][:-1]) + (layer.attrs["out_features"],)
        return (in_shapes[0][0], layer.attrs["out_features"])

    def splits_rows(self, layer: Layer, in_shapes, out_shape: Shape) -> bool:
        """A Linear over the last axis of rank-4 tokens (N, windows, T, C): each row of tokens
        on its own, so a band of rows reads that band."""
        return bool(layer.attrs.get("last_axis")) and len(in_shapes[0]) == 4

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        if layer.attrs.get("last_axis") and len(in_shapes[0]) == 4:
            return (InputWindow(Region(out.n0, out.n1, out.h0, out.h1, 0, in_shapes[0][3])),)
        return (InputWindow(Region.whole(in_shapes[0]).with_samples(out.n0, out.n1)),)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        if layer.attrs.get("last_axis"):  # per token: its features times the outputs
            return out.numel(out_shape) * int(in_shapes[0][-1])
        return out.n * int(np.prod(in_shapes[0][1:])) * layer.attrs["out_features"]


def _features(layer: Layer, shape: Shape) -> int:
    """Input features of one product: the last axis of tokens, else the whole sample."""
    return int(shape[-1]) if layer.attrs.get("last_axis") else int(np.prod(shape[1:]))


@register
class Softmax(Op):
    """Softmax and LogSoftmax over C: of (N, C) class scores, or at every pixel of (N, C, H, W)
    (per-pixel class maps of segmentation heads), which splits by rows and tiles."""

    name = "softmax"
    onnx_types = ("Softmax", "LogSoftmax")

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        shape = node.shape(node.inputs[0])
        # Default axis: 1 before opset 13, -1 since. Before opset 13 the input is coerced to 2-D
        # at the axis (a softmax over all of C x H x W): that is over C only where H x W is 1.
        old = node.opset is not None and node.opset < 13
        axis = int(node.attrs.get("axis", 1 if len(shape) == 2 or old else -1))
        if not -len(shape) <= axis < len(shape):
            raise ValueError(f"axis {axis} out of range for rank {len(shape)}")
        axis %= len(shape)
        # Before opset 13 the coercion to 2-D at the last axis is a softmax over that axis alone.
        if axis > 0 and (axis != 1 or len(shape) == 3) and (not old or axis == len(shape) - 1):
            return softmax_axis_spec(node, axis)
        if axis != 1 or len(shape) not in (2, 4) or (old and any(d != 1 for d in shape[2:])):
            raise ValueError(f"{node.op_type} over axis {axis} of {shape}{' (opset < 13: over all dims from it)' if old else ''};"
                             " only over C (axis 1) of (N, C) or (N, C, H, W) data is supported")
        return OnnxSpec({"log": node.op_type == "LogSoftmax"}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        expect(len(in_shapes[0]) in (2, 4), f"input of shape {tuple(in_shapes[0])}: softmax over C of (N, C) or (N, C, H, W)")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])
