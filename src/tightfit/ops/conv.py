"""Convolution (groups, depthwise, dilation, asymmetric padding, crop) with fused batch norm and
activations."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.graph.ir import Layer
from tightfit.ops import native
from tightfit.ops.registry import register
from tightfit.ops.activation import apply_activations
from tightfit.ops.base import (InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_positive, expect_rank,
                               param_tensor, sliding_windows)


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

    def prepare_params(self, layer: Layer, arrays) -> list[torch.Tensor]:
        """Weight, bias, and the weight prepacked once for oneDNN: without it every call
        reorders the weight into a temporary as large as the weight itself."""
        a = layer.attrs
        w = param_tensor(arrays[0])
        b = param_tensor(arrays[1]) if len(arrays) > 1 else torch.zeros(w.shape[0])
        return [w, b, PackedWeights(w, a)]

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
        if dense_out and _ONEDNN:
            return padded * itemsize
        # The fallback F.conv2d: its result before the copy into place, and oneDNN's reorder of
        # the weight for the call (as large as the weight).
        kh, kw = a["kernel"]
        weight = a["out_channels"] * (cin // a["groups"]) * kh * kw
        return (padded + out.numel(out_shape) + weight) * itemsize

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        kh, kw = layer.attrs["kernel"]
        return out.numel(out_shape) * (in_shapes[0][1] // layer.attrs["groups"]) * kh * kw

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        self.bind(layer, inputs, windows, out, out_region, params)()

    def bind(self, layer, inputs, windows, out, out_region, params) -> Callable[[], None]:
        """The step's kernel calls with their views cut, their padding chosen and, where oneDNN
        takes both views directly, the weight packed for the input's shape, once: on a band of
        a few rows this setup costs as much as a tenth of the convolution. Our own kernel takes
        any window in one call, its border padding included (no padded copy)."""
        a = layer.attrs
        clamp = clamp_bounds(a["act"])
        native = _native(inputs[0], out, windows[0], a, params, clamp or NO_CLAMP)
        if native is not None:
            return native if clamp is not None else _then_activations(native, out, a["act"])
        calls = kernel_calls(windows[0], out_region, tuple(a["kernel"]), tuple(a["stride"]), tuple(a["dilation"]))
        kernels = [_bind_call(x, y, call, a, params) for call in calls for x, y in [(inputs[0], out) if len(calls) == 1 else (
            inputs[0][:, :, call.in_rows[0] : call.in_rows[1]], out[:, :, call.out_rows[0] : call.out_rows[1]])]]

        def run() -> None:
            for kernel in kernels:
                kernel()
            apply_activations(out, a["act"])

        return run


def _then_activations(kernel: Callable[[], None], out: torch.Tensor, act) -> Callable[[], None]:
    def run() -> None:
        kernel()
        apply_activations(out, act)

    return run


_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise_")


# A pointwise convolution of at most this many multiply-adds runs as one matrix product: oneDNN's
# in-place convolution costs about 20 us a call besides its arithmetic, a GEMM about 2 us, but
# oneDNN computes about twice as fast on large blocks (a one-row band of mobilenet_v2's 16->96
# expansion: 21 us against 5 us; 512->512 on 14x14: 416 us against 913 us).
GEMM_MACS = 2**20


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


def native_applies(a: dict, in_channels: int, macs: int, dtype: torch.dtype = torch.float32,
                   any_threads: bool = False) -> str | None:
    """Which of our kernels runs a convolution step ('depthwise'; 'dense', for a grouped one a
    call per group or one over its block-diagonal weight), or None for oneDNN (views permitting:
    channels unit-stride). `any_threads`: at every thread count (the plans' kernel temporaries
    must hold wherever a plan runs)."""
    if tuple(a["dilation"]) != (1, 1) or dtype != torch.float32 or not native.available():
        return None
    one_thread, groups = torch.get_num_threads() == 1 and not any_threads, a["groups"]
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


def _native(x: torch.Tensor, y: torch.Tensor, win: InputWindow, a: dict, params,
            clamp: tuple[float, float]) -> Callable[[], None] | None:
    """The whole step on our own kernel, its border padding and the clamp included, where it applies."""
    kernel = tuple(a["kernel"])
    macs = y.numel() * kernel[0] * kernel[1] * (x.shape[1] // a["groups"])
    kind = native_applies(a, x.shape[1], macs, x.dtype)
    if kind is None or y.dtype != x.dtype or x.stride(1) != 1 or y.stride(1) != 1 or 0 in x.shape or 0 in y.shape:
        return None
    _, b, packs = params
    geometry = (kernel, tuple(a["stride"]), (win.pad[0], win.pad[2]), clamp)
    if kind == "depthwise":
        return native.conv_call(kind, x, y, packs.as_taps(), b, *geometry)
    groups = a["groups"]
    if block_diagonal(a, x.shape[1]):
        return native.conv_call(kind, x, y, *packs.block_diagonal_panels(b, groups), *geometry)
    xs, ys = x.tensor_split(groups, 1), y.tensor_split(groups, 1)
    calls = [native.conv_call(kind, xg, yg, w, bg, *geometry) for xg, yg, (w, bg) in zip(xs, ys, packs.panels(b, groups))]
    return None if None in calls else calls[0] if groups == 1 else native.NativeCalls.merged(calls)


def _bind_call(x: torch.Tensor, y: torch.Tensor, call: "KernelCall", a: dict, params) -> Callable[[], None]:
    if call.copy:
        return functools.partial(_convolve_padded, x, y, call.pad, a, params)
    pad = list(call.pad)
    _, b, packs = params
    if packs is not None and _pointwise_gemm(x, y, pad, a):
        return functools.partial(torch.addmm, b, _pixels(x), packs.as_taps(), out=_pixels(y))
    packed = packs.get(x.shape, pad) if packs is not None and _dense_nhwc(y) and _dense_nhwc(x) else None
    if packed is None:
        return functools.partial(_convolve, x, y, pad, a, params)
    return functools.partial(_accumulate, y, x, packed, b, pad, list(a["stride"]), list(a["dilation"]), a["groups"])


def _convolve_padded(x: torch.Tensor, y: torch.Tensor, pad: tuple[int, int, int, int], a: dict, params) -> None:
    _convolve(pad_copy(x, pad), y, [0, 0], a, params)


def _convolve(x: torch.Tensor, out: torch.Tensor, pad: list[int], a: dict, params) -> None:
    w, b, packs = params
    packed = packs.get(x.shape, pad) if packs is not None else None
    if packed is not None and _dense_nhwc(out) and _dense_nhwc(x):
        _accumulate(out, x, packed, b, pad, list(a["stride"]), list(a["dilation"]), a["groups"])
    else:
        out.copy_(F.conv2d(x, w, b, a["stride"], pad, a["dilation"], a["groups"]))


def _accumulate(y: torch.Tensor, x: torch.Tensor, packed: torch.Tensor, b: torch.Tensor, pad: list[int],
                stride: list[int], dilation: list[int], groups: int) -> None:
    """oneDNN accumulates the convolution into `y` in place: no result temporary."""
    y.zero_()
    torch.ops.mkldnn._convolution_pointwise_.binary(y, x, packed, b, pad, stride, dilation, groups, "add", 1.0, None, [], None)


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


def pad_copy(x: torch.Tensor, pad: tuple[int, int, int, int], value: float = 0.0) -> torch.Tensor:
    """A padded copy of x in x's memory format (one allocation, counted as step scratch)."""
    pt, pb, pl, pr = pad
    n, c, h, w = x.shape
    fmt = torch.channels_last if _dense_nhwc(x) or not x.is_contiguous() else torch.contiguous_format
    # Made in its format at once: torch.full(...).contiguous(memory_format=...) would hold two
    # padded copies for a moment, twice the counted scratch.
    out = torch.empty((n, c, h + pt + pb, w + pl + pr), dtype=x.dtype, memory_format=fmt).fill_(value)
    out[:, :, pt : pt + h, pl : pl + w].copy_(x)
    return out


def _pointwise_gemm(x: torch.Tensor, y: torch.Tensor, pad: list[int], a: dict) -> bool:
    """A small 1x1 convolution between dense channels-last views: a (pixels x C) matrix product."""
    return (tuple(a["kernel"]) == (1, 1) and tuple(a["stride"]) == (1, 1) and a["groups"] == 1 and not any(pad)
            and _dense_nhwc(x) and _dense_nhwc(y) and x.shape[2:] == y.shape[2:] and y.numel() * x.shape[1] <= GEMM_MACS)


def _pixels(t: torch.Tensor) -> torch.Tensor:
    """A dense channels-last view as a (pixels x channels) matrix over the same memory."""
    return t.permute(0, 2, 3, 1).view(-1, t.shape[1])


def _dense_nhwc(t: torch.Tensor) -> bool:
    return t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and t.shape[1] > 1


class PackedWeights:
    """The weight reordered for oneDNN, once per input shape (oneDNN picks the blocked format
    by shape): made on the first run, reused after, so runs never reorder weights."""

    def __init__(self, w: torch.Tensor, a: dict):
        self.w, self.a = w, a
        self.by_shape: dict[tuple, torch.Tensor] = {}
        self._taps: torch.Tensor | None = None
        self._panels: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._block_diagonal: tuple[torch.Tensor, torch.Tensor] | None = None

    def as_taps(self) -> torch.Tensor:
        """The weight as (kh*kw*C_in/groups) x C_out: per tap and input channel, its coefficient
        for every output channel (our depthwise kernel's layout; for a 1x1 weight, the matrix that
        multiplies a view's pixels); made once."""
        if self._taps is None:
            self._taps = self._taps_view().contiguous()
        return self._taps

    def _taps_view(self) -> torch.Tensor:
        return self.w.permute(2, 3, 1, 0).reshape(-1, self.w.shape[0])

    def panels(self, b: torch.Tensor, groups: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per group, its weight and bias in our dense kernel's layout (native.dense_panels); made once."""
        if self._panels is None:
            # The taps matrix is not kept: one copy of the weight besides w.
            taps = self._taps if self._taps is not None and groups == 1 else None
            self._panels = [native.dense_panels(taps if taps is not None else w.permute(2, 3, 1, 0).reshape(-1, w.shape[0]), bg)
                            for w, bg in zip(self.w.tensor_split(groups), b.tensor_split(groups))]
        return self._panels

    def block_diagonal_panels(self, b: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The grouped weight as one dense weight, zero between the groups, and the bias, in our
        dense kernel's layout; made once."""
        if self._block_diagonal is None:
            c, per_group = self.w.shape[:2]
            dense = self.w.new_zeros(c, per_group * groups, *self.w.shape[2:])
            for k, wg in enumerate(self.w.tensor_split(groups)):
                dense[k * (c // groups) : (k + 1) * (c // groups), k * per_group : (k + 1) * per_group] = wg
            self._block_diagonal = native.dense_panels(dense.permute(2, 3, 1, 0).reshape(-1, c), b)
        return self._block_diagonal

    def get(self, shape: torch.Size, pad: list[int]) -> torch.Tensor | None:
        if not _ONEDNN:
            return None
        key = (tuple(shape), tuple(pad))
        packed = self.by_shape.get(key)
        if packed is None:
            a = self.a
            packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
                self.w.to_mkldnn(), list(pad), list(a["stride"]), list(a["dilation"]), a["groups"], list(shape))
            self.by_shape[key] = packed
        return packed
