"""Transposed convolution (decoders, detection and segmentation heads): strides, pads,
output_padding, dilations, groups (depthwise included), auto_pad and output_shape, with fused
activations.

Along one axis input place i adds into padded output places i*s + k*d (k < K); output place o
is padded place o + pad_begin. So outputs [o0, o1) read exactly the inputs
ceil((o0 + pad - (K-1)d) / s) .. floor((o1 - 1 + pad) / s), and decoder layers split by rows and
tiles like a convolution."""
from __future__ import annotations

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape
from tightfit.ops.registry import register


def transposed_size(size: int, kernel: int, stride: int, pad_total: int, dilation: int, output_padding: int) -> int:
    return (size - 1) * stride - pad_total + (kernel - 1) * dilation + 1 + output_padding


def transposed_span(o0: int, o1: int, stride: int, pad: int, extent: int, size: int) -> tuple[int, int, int]:
    """Input span [a, b) that outputs [o0, o1) read along one axis, and the padded output place
    of the span's first input (a * stride). An output span no input reaches (a gap of a stride
    wider than the kernel, or the output_padding tail) reads the input place nearest it, which
    adds nothing to it: plans access non-empty windows."""
    first = -(-(o0 + pad - extent + 1) // stride)
    last = (o1 - 1 + pad) // stride
    a, b = max(first, 0), min(last, size - 1) + 1
    if a >= b:
        a = min(max(last, 0), size - 1)
        b = a + 1
    return a, b, a * stride


def _auto_pads(node: OnnxNode, kernel, stride, dilation, out_pad) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from pads, auto_pad or output_shape, as ONNX and onnxruntime
    have it: the odd unit of a total padding goes to the end for SAME_UPPER, to the start
    otherwise (SAME_LOWER, and an output_shape without auto_pad)."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    target = node.attrs.get("output_shape")
    if auto == "VALID":
        return 0, 0, 0, 0
    if auto == "NOTSET" and target is None:
        p = [int(v) for v in node.attrs.get("pads", [0, 0, 0, 0])]
        if len(p) != 4:
            raise ValueError(f"pads {p} (2-D: four values)")
        return p[0], p[1], p[2], p[3]
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"auto_pad {auto!r}")
    _, _, h, w = node.shape(node.inputs[0])
    target = [int(v) for v in target][-2:] if target is not None else [h * stride[0], w * stride[1]]
    begin, end = [], []
    for size, k, s, d, op, t in zip((h, w), kernel, stride, dilation, out_pad, target):
        total = max(0, (size - 1) * s + op + (k - 1) * d + 1 - t)
        small, big = total // 2, total - total // 2
        b, e = (small, big) if auto == "SAME_UPPER" else (big, small)
        begin.append(b)
        end.append(e)
    return begin[0], begin[1], end[0], end[1]


def fold_batchnorm_transposed(weight: np.ndarray, bias: np.ndarray | None, groups: int, scale: np.ndarray,
                              shift: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """A batch norm after a transposed convolution folded into it: output channel g * C_out/g + k
    is weight[g * C_in/g : (g + 1) * C_in/g, k] (float64 for accuracy)."""
    cin, cog, kh, kw = weight.shape
    k = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    b = np.zeros_like(mean, dtype=np.float64) if bias is None else bias.astype(np.float64)
    w = weight.astype(np.float64).reshape(groups, cin // groups, cog, kh, kw) * k.reshape(groups, 1, cog, 1, 1)
    return w.reshape(weight.shape).astype(np.float32), ((b - mean) * k + shift).astype(np.float32)


@register
class ConvTranspose(Op):
    name = "conv_transpose"
    onnx_types = ("ConvTranspose",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        weight = node.const_input(1)
        if weight is None or weight.ndim != 4:
            raise ValueError("only 2-D transposed convolutions with constant weights are supported")
        if len(node.shape(node.inputs[0])) != 4:
            raise ValueError("the input must be NCHW")
        groups = int(node.attrs.get("group", 1))
        cin = node.shape(node.inputs[0])[1]
        if cin != weight.shape[0] or cin % groups:
            raise ValueError(f"weight {weight.shape} does not fit {cin} input channels in {groups} groups")
        kernel = tuple(int(k) for k in node.attrs.get("kernel_shape", weight.shape[2:]))
        if kernel != tuple(weight.shape[2:]):
            raise ValueError(f"kernel_shape {kernel} differs from the weight's {weight.shape[2:]}")
        stride = tuple(int(s) for s in node.attrs.get("strides", (1, 1)))
        dilation = tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))
        out_pad = tuple(int(p) for p in node.attrs.get("output_padding", (0, 0)))
        if len(stride) != 2 or len(dilation) != 2 or len(out_pad) != 2 or min(stride + dilation) < 1:
            raise ValueError(f"strides {stride}, dilations {dilation}, output_padding {out_pad}")
        if any(p >= max(s, d) for p, s, d in zip(out_pad, stride, dilation)) or min(out_pad) < 0:
            raise ValueError(f"output_padding {out_pad} must be below the stride or dilation")
        pads = _auto_pads(node, kernel, stride, dilation, out_pad)
        if min(pads) < 0:
            raise ValueError(f"negative pads {pads}")
        attrs = {"kernel": kernel, "stride": stride, "dilation": dilation, "pads": pads, "output_padding": out_pad,
                 "groups": groups, "out_channels": int(weight.shape[1]) * groups, "act": ()}
        bias = node.const_input(2)
        if len(node.inputs) > 2 and node.inputs[2] and bias is None:
            raise ValueError("the bias must be a constant")
        params = [weight.astype(np.float32)] + ([bias.astype(np.float32)] if bias is not None else [])
        return OnnxSpec(attrs, [node.inputs[0]], params)

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, _, h, w = in_shapes[0]
        a = layer.attrs
        pt, pl, pb, pr = a["pads"]
        return (n, a["out_channels"],
                transposed_size(h, a["kernel"][0], a["stride"][0], pt + pb, a["dilation"][0], a["output_padding"][0]),
                transposed_size(w, a["kernel"][1], a["stride"][1], pl + pr, a["dilation"][1], a["output_padding"][1]))

    def _spans(self, layer: Layer, out: Region, in_shapes) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        a = layer.attrs
        _, _, h, w = in_shapes[0]
        (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["stride"], a["dilation"]
        return (transposed_span(out.h0, out.h1, sh, a["pads"][0], (kh - 1) * dh + 1, h),
                transposed_span(out.w0, out.w1, sw, a["pads"][1], (kw - 1) * dw + 1, w))

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        (h0, h1, _), (w0, w1, _) = self._spans(layer, out, in_shapes)
        return (InputWindow(Region(out.n0, out.n1, h0, h1, w0, w1)),)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        """Every input of the window times every kernel tap and the output channels of its group."""
        a = layer.attrs
        (h0, h1, _), (w0, w1, _) = self._spans(layer, out, in_shapes)
        kh, kw = a["kernel"]
        return out.n * (h1 - h0) * (w1 - w0) * in_shapes[0][1] * (a["out_channels"] // a["groups"]) * kh * kw
