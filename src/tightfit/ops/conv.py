"""Convolution (groups, depthwise, dilation, asymmetric padding, crop) with fused batch norm and
activations."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.graph.ir import Layer
from tightfit.ops import register
from tightfit.ops.activation import apply_activations
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, sliding_windows


def conv_out_size(size: int, kernel: int, stride: int, pad_total: int, dilation: int = 1, ceil: bool = False) -> int:
    extent = (kernel - 1) * dilation + 1
    span = size + pad_total - extent
    return (-(-span // stride) if ceil else span // stride) + 1


def resolve_pads(node: OnnxNode, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> tuple[int, int, int, int]:
    """ONNX pads (or auto_pad) as (top, left, bottom, right)."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        _, _, h, w = node.shape(node.inputs[0])
        pads = []
        for size, k, s, d in zip((h, w), kernel, stride, dilation):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return pads[0][0], pads[1][0], pads[0][1], pads[1][1]
    p = list(node.attrs.get("pads", [0, 0, 0, 0]))
    return int(p[0]), int(p[1]), int(p[2]), int(p[3])


def fold_batchnorm(weight: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, shift: np.ndarray,
                   mean: np.ndarray, var: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Fold an inference batch norm into the preceding conv/dense weights (float64 for accuracy)."""
    k = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = np.zeros_like(mean, dtype=np.float64) if bias is None else bias.astype(np.float64)
    w = weight.astype(np.float64) * k.reshape((-1,) + (1,) * (weight.ndim - 1))
    return w.astype(np.float32), ((b - mean) * k + shift).astype(np.float32)


@register
class Conv(Op):
    name = "conv"
    onnx_types = ("Conv",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        weight = node.const_input(1)
        if weight is None or weight.ndim != 4:
            raise ValueError(f"Conv {node.name!r}: only 2-D convolutions with constant weights are supported")
        kernel = tuple(int(k) for k in node.attrs.get("kernel_shape", weight.shape[2:]))
        stride = tuple(int(s) for s in node.attrs.get("strides", (1, 1)))
        dilation = tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))
        attrs = {
            "kernel": kernel, "stride": stride, "dilation": dilation,
            "pads": resolve_pads(node, kernel, stride, dilation),
            "groups": int(node.attrs.get("group", 1)), "out_channels": int(weight.shape[0]), "act": (),
        }
        bias = node.const_input(2)
        params = [weight.astype(np.float32)] + ([bias.astype(np.float32)] if bias is not None else [])
        return OnnxSpec(attrs, [node.inputs[0]], params)

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, _, h, w = in_shapes[0]
        kh, kw = layer.attrs["kernel"]
        sh, sw = layer.attrs["stride"]
        dh, dw = layer.attrs["dilation"]
        pt, pl, pb, pr = layer.attrs["pads"]
        return (n, layer.attrs["out_channels"], conv_out_size(h, kh, sh, pt + pb, dh), conv_out_size(w, kw, sw, pl + pr, dw))

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        a = layer.attrs
        return (sliding_windows(out, in_shapes[0], a["kernel"], a["stride"], a["pads"], a["dilation"]),)

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch") -> int:
        a = layer.attrs
        cin = in_shapes[0][1]
        if model == "darknet":
            # MAFAT eq. 2.1: im2col scratch = w_out * h_out * f^2 * c_in / s.
            kh, kw = a["kernel"]
            return out.n * out.h * out.w * kh * kw * (cin // a["groups"]) // a["stride"][0] * itemsize
        if model == "none":
            return 0
        # Our kernel: the zero-padded copy of the input window (only at the border), and the
        # result the convolution allocates before it is copied into the output view.
        win = self.input_windows(layer, out, in_shapes)[0]
        padded = 0
        if any(win.pad):
            pt, pb, pl, pr = win.pad
            padded = win.region.n * cin * (win.region.h + pt + pb) * (win.region.w + pl + pr)
        return (padded + out.numel(out_shape)) * itemsize

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        kh, kw = layer.attrs["kernel"]
        return out.numel(out_shape) * (in_shapes[0][1] // layer.attrs["groups"]) * kh * kw

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        a = layer.attrs
        x = inputs[0]
        pt, pb, pl, pr = windows[0].pad
        if pt or pb or pl or pr:
            x = F.pad(x, (pl, pr, pt, pb))
        y = F.conv2d(x, params[0], params[1] if len(params) > 1 else None, a["stride"], 0, a["dilation"], a["groups"])
        apply_activations(y, a["act"])
        out.copy_(y)
