"""Convolution (groups, depthwise, dilation, asymmetric padding, crop) with fused batch norm and
activations."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import (InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_positive, expect_rank,
                               sliding_windows)


def conv_out_size(size: int, kernel: int, stride: int, pad_total: int, dilation: int = 1, ceil: bool = False) -> int:
    extent = (kernel - 1) * dilation + 1
    span = size + pad_total - extent
    return (-(-span // stride) if ceil else span // stride) + 1


def check_window(kernel, stride, dilation, pads, in_shape: Shape, crop: bool = False) -> None:
    """A 2-D sliding window (conv, pooling): kernel, strides and dilations >= 1, padding
    non-negative (a conv's negative padding is a crop folded from a Pad: less than the input),
    and the dilated kernel within the padded input, so that every output dim is at least 1."""
    expect_positive(kernel, 2, "kernel")
    expect_positive(stride, 2, "strides")
    expect_positive(dilation, 2, "dilations")
    expect(len(pads) == 4 and all(isinstance(p, (int, np.integer)) for p in pads), f"pads {tuple(pads)} must be 4 integers")
    h, w = in_shape[2], in_shape[3]
    for size, before, after, what in ((h, pads[0], pads[2], "rows"), (w, pads[1], pads[3], "columns")):
        expect(crop or (before >= 0 and after >= 0), f"pads {tuple(pads)} must not be negative")
        expect(before > -size and after > -size and before + after > -size, f"pads {tuple(pads)} crop away all {size} {what}")
    for size, k, d, p, what in ((h, kernel[0], dilation[0], pads[0] + pads[2], "rows"), (w, kernel[1], dilation[1], pads[1] + pads[3], "columns")):
        expect((k - 1) * d + 1 <= size + p,
               f"kernel {tuple(kernel)} with dilations {tuple(dilation)} spans more than the {size + p} padded input {what}")


def resolve_pads(node: OnnxNode, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> tuple[int, int, int, int]:
    """ONNX pads (or auto_pad) as (top, left, bottom, right)."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"auto_pad {auto!r} is not NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    expect_positive(stride, 2, "strides")
    expect_positive(dilation, 2, "dilations")
    expect_positive(kernel, 2, "kernel")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        _, _, h, w = node.shape(node.inputs[0])
        pads = []
        for size, k, s, d in zip((h, w), kernel, stride, dilation):
            out = -(-size // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return pads[0][0], pads[1][0], pads[0][1], pads[1][1]
    if auto == "VALID":
        return 0, 0, 0, 0
    p = list(node.attrs.get("pads", [0, 0, 0, 0]))
    expect(len(p) == 4, f"pads {tuple(p)} must be 4 integers (top, left, bottom, right)")
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

    def check(self, layer: Layer, in_shapes, params) -> None:
        """The weight's (C_out, C_in / groups, kh, kw) against the input's channels, the groups and
        the kernel; the dilated kernel within the padded input (a crop within the input)."""
        super().check(layer, in_shapes, params)
        a = layer.attrs
        expect_rank(in_shapes[0], (4,))
        cin = in_shapes[0][1]
        check_window(a["kernel"], a["stride"], a["dilation"], a["pads"], in_shapes[0], crop=True)
        groups, cout = a["groups"], a["out_channels"]
        expect(isinstance(groups, int) and groups >= 1 and cin % groups == 0 and cout % groups == 0,
               f"group {groups} must divide the input's {cin} and the output's {cout} channels")
        expect(1 <= len(params) <= 2, f"takes a weight and an optional bias, got {len(params)} parameters")
        want = (cout, cin // groups) + tuple(a["kernel"])
        expect(tuple(params[0].shape) == want,
               f"weight of shape {tuple(params[0].shape)} does not fit {cin} input channels in {groups} group(s) "
               f"and kernel {tuple(a['kernel'])}: expected {want}")
        if len(params) > 1:
            expect(tuple(params[1].shape) == (cout,), f"bias of shape {tuple(params[1].shape)}, expected ({cout},)")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, _, h, w = in_shapes[0]
        kh, kw = layer.attrs["kernel"]
        sh, sw = layer.attrs["stride"]
        dh, dw = layer.attrs["dilation"]
        pt, pl, pb, pr = layer.attrs["pads"]
        return (n, layer.attrs["out_channels"], conv_out_size(h, kh, sh, pt + pb, dh), conv_out_size(w, kw, sw, pl + pr, dw))

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        """The receptive field of `out`; a region that reaches the last output row (column) also
        takes the input's trailing rows that a stride skips, so a whole-width view stays one
        dense block (the kernel's output count is unchanged)."""
        a = layer.attrs
        win = sliding_windows(out, in_shapes[0], a["kernel"], a["stride"], a["pads"], a["dilation"])
        _, _, oh, ow = self.output_shape(layer, in_shapes)
        _, _, h, w = in_shapes[0]
        r, (_, pb, _, pr) = win.region, win.pad
        # Not under a crop (negative padding): the skipped rows would then be cropped data.
        h1 = h if out.h1 == oh and pb == 0 and a["pads"][2] >= 0 else r.h1
        w1 = w if out.w1 == ow and pr == 0 and a["pads"][3] >= 0 else r.w1
        return (InputWindow(Region(r.n0, r.n1, r.h0, h1, r.w0, w1), win.pad),)

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="none", dense_out: bool = True, channels_last: bool = False) -> int:
        """Our kernels need none (any window, its padding included, into any view); the darknet
        model is MAFAT eq. 2.1's im2col scratch, to compare with the paper."""
        if model != "darknet":
            return 0
        a = layer.attrs
        kh, kw = a["kernel"]
        # w_out * h_out * f^2 * c_in / s
        return out.n * out.h * out.w * kh * kw * (in_shapes[0][1] // a["groups"]) // a["stride"][0] * itemsize

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        kh, kw = layer.attrs["kernel"]
        return out.numel(out_shape) * (in_shapes[0][1] // layer.attrs["groups"]) * kh * kw


NO_CLAMP = (-math.inf, math.inf)


def clamp_bounds(act: Sequence[tuple]) -> tuple[float, float] | None:
    """The activation chain as one clamp (none, ReLU, Clip), or None when it is something else."""
    if not act:
        return NO_CLAMP
    if len(act) == 1 and act[0][0] == "relu":
        return (0.0, math.inf)
    if len(act) == 1 and act[0][0] == "clip":
        return (float(act[0][1]), float(act[0][2]))
    return None

