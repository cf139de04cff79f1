"""Pooling: max and average over sliding windows (padding, ceil_mode, dilation), and
global pooling over H and W (GlobalAveragePool, GlobalMaxPool, ReduceMean/ReduceMax over H, W)."""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.activation import apply_activations
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_rank, sliding_windows
from tightfit.ops import native
from tightfit.ops.conv import check_window, clamp_bounds, conv_out_size, resolve_pads


class _WindowPool(Op):
    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        if "kernel_shape" not in node.attrs:
            raise ValueError(f"{node.op_type} {node.name!r}: kernel_shape is required")
        kernel = tuple(int(k) for k in node.attrs["kernel_shape"])
        if len(kernel) != 2:
            raise ValueError(f"{node.op_type} {node.name!r}: only 2-D pooling is supported")
        stride = tuple(int(s) for s in node.attrs.get("strides", (1, 1)))
        dilation = tuple(int(d) for d in node.attrs.get("dilations", (1, 1)))
        attrs = {
            "kernel": kernel, "stride": stride, "dilation": dilation,
            "pads": resolve_pads(node, kernel, stride, dilation),
            "ceil_mode": bool(node.attrs.get("ceil_mode", 0)),
            "count_include_pad": bool(node.attrs.get("count_include_pad", 0)), "act": (),
            "in_hw": tuple(node.shape(node.inputs[0])[2:]),
        }
        return OnnxSpec(attrs, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        """A window within the padded input, padding smaller than the window (so that no window
        lies wholly in the padding), and the input size it was imported at."""
        super().check(layer, in_shapes, params)
        a = layer.attrs
        expect_rank(in_shapes[0], (4,))
        expect(not params, "takes no parameters")
        check_window(a["kernel"], a["stride"], a["dilation"], a["pads"], in_shapes[0])
        extent = [(k - 1) * d + 1 for k, d in zip(a["kernel"], a["dilation"])]
        expect(all(p < e for p, e in zip(a["pads"], extent + extent)),
               f"pads {tuple(a['pads'])} must be smaller than the window {tuple(extent)}")
        expect(tuple(a["in_hw"]) == tuple(in_shapes[0][2:]), f"imported for input size {tuple(a['in_hw'])}, given {tuple(in_shapes[0][2:])}")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, c, h, w = in_shapes[0]
        a = layer.attrs
        pt, pl, pb, pr = a["pads"]
        oh = conv_out_size(h, a["kernel"][0], a["stride"][0], pt + pb, a["dilation"][0], a["ceil_mode"])
        ow = conv_out_size(w, a["kernel"][1], a["stride"][1], pl + pr, a["dilation"][1], a["ceil_mode"])
        if a["ceil_mode"]:
            # ONNX/torch: the last window must start inside the input or the leading padding.
            oh -= (oh - 1) * a["stride"][0] >= h + pt
            ow -= (ow - 1) * a["stride"][1] >= w + pl
        return (n, c, oh, ow)

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        a = layer.attrs
        return (sliding_windows(out, in_shapes[0], a["kernel"], a["stride"], a["pads"], a["dilation"]),)

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch", dense_out: bool = True, channels_last: bool = False) -> int:
        if model != "torch" or (channels_last and itemsize == 4 and _native_applies(layer.attrs)):
            return 0
        win = self.input_windows(layer, out, in_shapes)[0]
        padded = 0
        if any(win.pad):
            pt, pb, pl, pr = win.pad
            padded = win.region.n * in_shapes[0][1] * (win.region.h + pt + pb) * (win.region.w + pl + pr)
        return (padded + out.numel(out_shape)) * itemsize

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        kh, kw = layer.attrs["kernel"]
        return out.numel(out_shape) * kh * kw


@register
class MaxPool(_WindowPool):
    name = "maxpool"
    onnx_types = ("MaxPool",)

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        self.bind(layer, inputs, windows, out, out_region, params)()

    def bind(self, layer, inputs, windows, out, out_region, params) -> Callable[[], None]:
        """Our kernel where it applies (`_native_pool`); else max over the k x k taps as in-place
        maxima of strided views into `out`: torch's own
        max pooling always builds int64 indices (twice the output) even without autograd.
        Each tap touches the outputs whose tap lands inside the window; padding and ceil-mode
        overhang are simply never read (they would be -inf). The first two taps that cover
        every output start it off in one call. The views are cut here, once: on a one-row band
        cutting them costs five times the maxima themselves."""
        a = layer.attrs
        x = inputs[0]
        ours = _native_pool(a, x, out, windows[0], None)
        if ours is not None:
            return ours
        pt, _, pl, _ = windows[0].pad
        (kh, kw), (sh, sw), (dh, dw) = a["kernel"], a["stride"], a["dilation"]
        oh, ow = out.shape[2], out.shape[3]
        taps, full = [], []
        for i in range(kh):
            r0, r1, rin = _tap_span(oh, sh, i * dh - pt, x.shape[2])
            for j in range(kw):
                c0, c1, cin = _tap_span(ow, sw, j * dw - pl, x.shape[3])
                if r1 > r0 and c1 > c0:
                    src = x[:, :, rin : rin + (r1 - r0 - 1) * sh + 1 : sh, cin : cin + (c1 - c0 - 1) * sw + 1 : sw]
                    (full if (r0, r1, c0, c1) == (0, oh, 0, ow) else taps).append((out[:, :, r0:r1, c0:c1], src))
        rest = full[2:] + taps
        act = a["act"]

        def run() -> None:
            if len(full) >= 2:
                torch.maximum(full[0][1], full[1][1], out=out)
            elif full:
                out.copy_(full[0][1])
            else:
                out.fill_(float("-inf"))
            for dst, src in rest:
                torch.maximum(dst, src, out=dst)
            apply_activations(out, act)

        return run

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch", dense_out: bool = True, channels_last: bool = False) -> int:
        return 0


def _is_identity(attrs: dict) -> bool:
    """A 1x1 window with stride 1 and no padding (an adaptive pool exported at its input size,
    as torchvision's VGG and AlexNet do): a copy."""
    return tuple(attrs["kernel"]) == (1, 1) and tuple(attrs["stride"]) == (1, 1) and not any(attrs["pads"])


def _tap_span(n_out: int, stride: int, offset: int, size: int) -> tuple[int, int, int]:
    """Outputs [o0, o1) whose tap at input row o * stride + offset lies in [0, size), and the
    input row of o0."""
    o0 = max(0, -(offset // stride))  # ceil(-offset / stride)
    o1 = max(o0, min(n_out, -((offset - size) // stride)))  # ceil((size - offset) / stride)
    return o0, o1, o0 * stride + offset


def _counts(o0: int, o1: int, k: int, s: int, pad_before: int, lo: int, hi: int, d: int = 1) -> torch.Tensor:
    """How many of each window's k taps (dilation d) fall in [lo, hi), for outputs o0..o1-1."""
    taps = (torch.arange(o0, o1) * s - pad_before).view(-1, 1) + torch.arange(k).view(1, -1) * d
    return ((taps >= lo) & (taps < hi)).sum(dim=1).to(torch.float32)


@register
class AveragePool(_WindowPool):
    name = "avgpool"
    onnx_types = ("AveragePool",)

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch", dense_out: bool = True, channels_last: bool = False) -> int:
        if _is_identity(layer.attrs):
            return 0
        return super().workspace_bytes(layer, out, in_shapes, out_shape, itemsize, model, dense_out, channels_last)

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        self.bind(layer, inputs, windows, out, out_region, params)()

    def bind(self, layer, inputs, windows, out, out_region, params) -> Callable[[], None]:
        """Our kernel where it applies (`_native_pool`), else torch's. The divisors are worked out
        once: on a band of a few rows their dozen small tensor calls cost more than the pooling
        (onnxzoo-shufflenet's 3x3 bands)."""
        a, x = layer.attrs, inputs[0]
        if _is_identity(a):
            return functools.partial(_copy_activated, out, x, a["act"])
        divisor = _divisor(a, out_region)
        ours = _native_pool(a, x, out, windows[0], divisor)
        if ours is not None:
            return ours
        return functools.partial(_average, out, x, windows[0].pad, a, divisor)


def _native_applies(a: dict) -> bool:
    """Whether our pooling kernel takes a step of this layer (views permitting: channels
    unit-stride): no dilation, an activation that is a clamp."""
    return native.available() and tuple(a.get("dilation", (1, 1))) == (1, 1) and clamp_bounds(a["act"]) is not None


def _native_pool(a: dict, x: torch.Tensor, out: torch.Tensor, win: InputWindow,
                 divisor: torch.Tensor | None) -> native.NativeCalls | None:
    """The step on our own kernel, its window's padding and ceil-mode overhang left out and its
    clamp fused (max pooling; average pooling with `divisor`), where it applies."""
    if not _native_applies(a) or x.dtype != torch.float32 or 0 in x.shape or 0 in out.shape:
        return None
    inverse = None if divisor is None else 1.0 / divisor
    return native.pool_call(out, x, a["kernel"], a["stride"], (win.pad[0], win.pad[2]), clamp_bounds(a["act"]), inverse)


def _copy_activated(out: torch.Tensor, x: torch.Tensor, act) -> None:
    out.copy_(x)
    apply_activations(out, act)


def _average(out: torch.Tensor, x: torch.Tensor, pad: tuple[int, int, int, int], a: dict, divisor: torch.Tensor) -> None:
    pt, pb, pl, pr = pad
    if pt or pb or pl or pr:
        x = F.pad(x, (pl, pr, pt, pb))
    kh, kw = a["kernel"]
    sh, sw = a["stride"]
    dh, dw = a.get("dilation", (1, 1))
    if (dh, dw) == (1, 1):
        y = F.avg_pool2d(x, (kh, kw), (sh, sw), 0, divisor_override=1)
    else:  # ONNX AveragePool-19 dilations: a per-channel sum with a dilated all-ones kernel
        c = x.shape[1]
        ones = torch.ones((c, 1, kh, kw), dtype=x.dtype)
        y = F.conv2d(x, ones, None, (sh, sw), 0, (dh, dw), c)
    y.div_(divisor)
    apply_activations(y, a["act"])
    out.copy_(y)


def _divisor(a: dict, out_region: Region) -> torch.Tensor:
    """Per output position, its taps inside the input (or inside input + padding when
    count_include_pad), excluding ceil_mode overhang, as ONNX and torch define it."""
    kh, kw = a["kernel"]
    sh, sw = a["stride"]
    dh, dw = a.get("dilation", (1, 1))
    h, w = a["in_hw"]
    ptop, pleft, pbot, pright = a["pads"]
    if a["count_include_pad"]:
        ch = _counts(out_region.h0, out_region.h1, kh, sh, ptop, -ptop, h + pbot, dh)
        cw = _counts(out_region.w0, out_region.w1, kw, sw, pleft, -pleft, w + pright, dw)
    else:
        ch = _counts(out_region.h0, out_region.h1, kh, sh, ptop, 0, h, dh)
        cw = _counts(out_region.w0, out_region.w1, kw, sw, pleft, 0, w, dw)
    return ch.view(-1, 1) * cw.view(1, -1)


@register
class GlobalPool(Op):
    """Mean or max over all of H and W; the output keeps (N, C, 1, 1) or drops to (N, C)."""

    name = "global_pool"
    onnx_types = ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "ReduceMax")
    splittable = False

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        kind = "max" if "Max" in node.op_type else "mean"
        keepdims = True
        if node.op_type.startswith("Reduce"):
            axes = node.attrs.get("axes")
            if axes is None:
                c = node.const_input(1)
                axes = None if c is None else [int(v) for v in c.reshape(-1)]
            rank = len(node.shape(node.inputs[0]))
            if axes is not None and rank == 4 and [a % rank for a in axes] == [1]:
                from tightfit.ops.registry import get_op

                spec = get_op("channel_reduce").from_onnx(node)
                return OnnxSpec(spec.attrs, spec.inputs, spec.params, "channel_reduce")
            if axes is None or sorted(a % rank for a in axes) != [2, 3] or rank != 4:
                raise ValueError(f"{node.op_type} {node.name!r}: only reductions over H and W (axes 2, 3) or over C (axis 1) are supported")
            keepdims = bool(node.attrs.get("keepdims", 1))
        return OnnxSpec({"kind": kind, "keepdims": keepdims, "act": ()}, [node.inputs[0]])

    def check(self, layer: Layer, in_shapes, params) -> None:
        super().check(layer, in_shapes, params)
        expect_rank(in_shapes[0], (4,))

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, c = in_shapes[0][:2]
        return (n, c, 1, 1) if layer.attrs["keepdims"] else (n, c)

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        _, _, h, w = in_shapes[0]
        return (InputWindow(Region(out.n0, out.n1, 0, h, 0, w)),)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        _, c, h, w = in_shapes[0]
        return out.n * c * h * w

    def workspace_bytes(self, layer, out, in_shapes, out_shape, itemsize, model="torch", dense_out: bool = True, channels_last: bool = False) -> int:
        return out.numel(out_shape) * itemsize if model == "torch" else 0

    def compute(self, layer, inputs, windows, out, out_region, params) -> None:
        x = inputs[0]
        y = x.amax(dim=(2, 3), keepdim=True) if layer.attrs["kind"] == "max" else x.mean(dim=(2, 3), keepdim=True)
        apply_activations(y, layer.attrs["act"])
        out.copy_(y.view(out.shape))
