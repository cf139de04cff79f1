"""Convolution (groups, depthwise, dilation, asymmetric padding, crop) with fused batch norm and
activations."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import lru_cache
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
        r, (pt, pb, pl, pr) = win.region, win.pad
        # Not under a crop (negative padding): the skipped rows would then be cropped data.
        h1 = h if out.h1 == oh and pb == 0 and a["pads"][2] >= 0 else r.h1
        w1 = w if out.w1 == ow and pr == 0 and a["pads"][3] >= 0 else r.w1
        return (InputWindow(Region(r.n0, r.n1, r.h0, h1, r.w0, w1), win.pad),)

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch", dense_out: bool = True, channels_last: bool = False) -> int:
        """torch model: the zero-padded copy of an input window whose padding is asymmetric
        (a band at the border), plus the result temporary when the output view is not a dense
        channels-last block (then the kernel cannot write into it directly)."""
        a = layer.attrs
        cin = in_shapes[0][1]
        if model == "darknet":
            # MAFAT eq. 2.1: im2col scratch = w_out * h_out * f^2 * c_in / s.
            kh, kw = a["kernel"]
            return out.n * out.h * out.w * kh * kw * (cin // a["groups"]) // a["stride"][0] * itemsize
        if model == "none":
            return 0
        win = self.input_windows(layer, out, in_shapes)[0]
        if channels_last and itemsize == 4 and not win.region.is_empty() and native_applies(
                a, cin, self.macs(layer, out, in_shapes, out_shape), any_threads=True):
            return 0  # our kernel: any window, its padding included, into any view
        padded = max((win.region.n * cin * (c.in_rows[1] - c.in_rows[0] + c.pad[0] + c.pad[1]) * (win.region.w + c.pad[2] + c.pad[3])
                      for c in kernel_calls(win, out, tuple(a["kernel"]), tuple(a["stride"]), tuple(a["dilation"])) if c.copy), default=0)
        if dense_out:
            return padded * itemsize
        # The fallback F.conv2d: its result before the copy into place, and oneDNN's reorder of
        # the weight for the call (as large as the weight).
        kh, kw = a["kernel"]
        weight = a["out_channels"] * (cin // a["groups"]) * kh * kw
        return (padded + out.numel(out_shape) + weight) * itemsize

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        kh, kw = layer.attrs["kernel"]
        return out.numel(out_shape) * (in_shapes[0][1] // layer.attrs["groups"]) * kh * kw


# A convolution runs on our own kernels (ops/native.py) with its clamp fused, where they are faster
# than oneDNN, which costs about 20 us a call besides its arithmetic (and torch's matrix product
# reaches 30-45 GMAC/s on a tile's small products): dense 324 pixels x 16->96, 6.5 us against 13.2;
# depthwise 9x9x96, 2.5 us against 21. With several threads, which oneDNN splits a layer over, up to
# DEPTHWISE_MACS or DENSE_MACS multiply-adds. On one thread, a depthwise one at any size (56x56x144:
# 140-150 us against 130-150); a dense one up to DENSE_MACS_ONE_THREAD, or any size when its weight
# stays in L2 (at most DENSE_WEIGHT_BYTES): our kernel reads the whole weight again for every 6
# pixels, where oneDNN blocks the product for the cache (3x3 128->128 on 28x28, 590 KB of weight:
# 1037 us against 860; 64->64 on 56x56, 147 KB: 943 against 920; 16->96 1x1 on 112x112: 255 against
# 285; a 3-row band of 512->512, 9.4 MB, 11.8 M: 106 against 130).
DEPTHWISE_MACS = 2**19
DENSE_MACS = 2**21
DENSE_MACS_ONE_THREAD = 2**24
DENSE_WEIGHT_BYTES = 2**18
# A grouped convolution with fewer channels per group than this runs as one dense call over its
# block-diagonal weight (zeros between the groups: `groups` times the multiply-adds, where a call
# per group would cost more; onnxzoo-shufflenet's 24 -> 112 in 4 groups), within the same size rules.
GROUP_CHANNELS_MIN = 16
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


def native_applies(a: dict, in_channels: int, macs: int, any_threads: bool = True) -> str | None:
    """The scratch model's rule (workspace "torch"): which steps it charges no temporaries,
    'depthwise' or 'dense', as the torch executor's own kernels took them; None where it charges
    the padded copy. (The kernel library needs no scratch for any step: see workspace_bytes.)"""
    if tuple(a["dilation"]) != (1, 1):
        return None
    one_thread, groups = not any_threads, a["groups"]
    if in_channels == a["out_channels"] == groups and groups > 1:
        return "depthwise" if one_thread or macs <= DEPTHWISE_MACS else None
    weight_bytes = in_channels // groups * a["kernel"][0] * a["kernel"][1] * a["out_channels"] // groups * 4
    if block_diagonal(a, in_channels):
        macs, weight_bytes = macs * groups, weight_bytes * groups * groups
    small = macs <= DENSE_MACS or (one_thread and (macs <= DENSE_MACS_ONE_THREAD or weight_bytes <= DENSE_WEIGHT_BYTES))
    return "dense" if small else None


def block_diagonal(a: dict, in_channels: int) -> bool:
    """Whether a grouped convolution runs on our dense kernel as one call over its block-diagonal
    weight (too few channels per group for a call per group)."""
    return a["groups"] > 1 and min(in_channels, a["out_channels"]) // a["groups"] < GROUP_CHANNELS_MIN


@dataclass(frozen=True)
class KernelCall:
    """One kernel call of a conv step, rows relative to the step's output and input window:
    with `copy`, its input rows are copied with `pad` (top, bottom, left, right) zero rows and
    columns around them; without, the kernel pads symmetrically by `pad` = [rows, columns]."""

    out_rows: tuple[int, int]
    in_rows: tuple[int, int]
    pad: tuple[int, ...]
    copy: bool


@lru_cache(maxsize=65536)  # called on every step of a run: the same few bands recur
def kernel_calls(win: InputWindow, out: Region, kernel, stride, dilation) -> tuple[KernelCall, ...]:
    """How a conv step runs: one call when the kernel can apply the window's padding itself;
    else, for a band at the top or bottom border, the output rows whose receptive field reaches
    into the padding are split off. With stride 1 such a border part is one call with symmetric
    padding that also writes a few wrong rows inside the middle part, which runs last and
    overwrites them: no copy. Otherwise only its few input rows are copied with padding (a
    whole band copied would be a temporary as large as the band)."""
    direct = direct_padding(win, out, kernel, stride, dilation)
    real, (pt, pb, pl, pr) = win.region.h, win.pad
    whole_copy = (KernelCall((0, out.h), (0, real), win.pad, True),)
    if direct is not None:
        return (KernelCall((0, out.h), (0, real), tuple(direct), False),)
    if pl != pr or real == 0:
        return whole_copy
    s, ext = stride[0], (kernel[0] - 1) * dilation[0] + 1
    top = min(out.h, -(-pt // s))  # rows that read the top padding
    bottom = max(top, (pt + real - ext) // s + 1) if pt + real >= ext else out.h  # first row reading the bottom padding
    if bottom <= top or (bottom - top) * s + ext - s > real:
        return whole_copy
    borders, middle = [], None
    for a, b in ((0, top), (top, bottom), (bottom, out.h)):
        if b <= a:
            continue
        v0, v1 = a * s, (b - 1) * s + ext  # rows of the padded window
        r0, r1 = max(v0 - pt, 0), min(v1 - pt, real)
        pad_top, pad_bottom = max(pt - v0, 0), max(v1 - pt - real, 0)
        if not (pad_top or pad_bottom):
            middle = KernelCall((a, b), (r0, r1), (0, pl), False)
        elif s == 1 and r1 > r0 and pad_top and not pad_bottom and b + pad_top <= bottom:
            borders.append(KernelCall((a, b + pad_top), (r0, r1), (pad_top, pl), False))
        elif s == 1 and r1 > r0 and pad_bottom and not pad_top and a - pad_bottom >= top:
            borders.append(KernelCall((a - pad_bottom, b), (r0, r1), (pad_bottom, pl), False))
        else:
            borders.append(KernelCall((a, b), (r0, r1), (pad_top, pad_bottom, pl, pr), True))
    return tuple(borders) + (middle,)


def direct_padding(win: InputWindow, out: Region, kernel, stride, dilation) -> list[int] | None:
    """Symmetric padding the kernel can apply itself so that its output is exactly `out`, or None
    when the window's border padding needs an explicit zero-padded copy (e.g. a band at the top
    whose bottom rows are real data)."""
    pt, pb, pl, pr = win.pad
    if pt < pb or pl < pr:
        return None
    if win.region.h == 0 or win.region.w == 0:
        return None  # a window wholly in the padding: torch convolves no empty input, even padded
    for size, p, k, s, d, want in ((win.region.h, pt, kernel[0], stride[0], dilation[0], out.h),
                                   (win.region.w, pl, kernel[1], stride[1], dilation[1], out.w)):
        if (size + 2 * p - (k - 1) * d - 1) // s + 1 != want:
            return None
    return [pt, pl]
