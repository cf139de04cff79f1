"""Pooling: max and average over sliding windows (padding, ceil_mode, dilation), and
global pooling over H and W (GlobalAveragePool, GlobalMaxPool, ReduceMean/ReduceMax over H, W)."""
from __future__ import annotations


from tightfit.graph.ir import Layer
from tightfit.ops.attention import reduce_spec
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape, expect, expect_rank, sliding_windows
from tightfit.ops.conv import check_window, conv_out_size, resolve_pads


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

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        kh, kw = layer.attrs["kernel"]
        return out.numel(out_shape) * kh * kw


@register
class MaxPool(_WindowPool):
    name = "maxpool"
    onnx_types = ("MaxPool",)


def _is_identity(attrs: dict) -> bool:
    """A 1x1 window with stride 1 and no padding (an adaptive pool exported at its input size,
    as torchvision's VGG and AlexNet do): a copy."""
    return tuple(attrs["kernel"]) == (1, 1) and tuple(attrs["stride"]) == (1, 1) and not any(attrs["pads"])


@register
class AveragePool(_WindowPool):
    name = "avgpool"
    onnx_types = ("AveragePool",)


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
            if axes is not None and rank == 4 and [a % rank for a in axes] == [1] and node.attrs.get("keepdims", 1):
                from tightfit.ops.registry import get_op

                spec = get_op("channel_reduce").from_onnx(node)
                return OnnxSpec(spec.attrs, spec.inputs, spec.params, "channel_reduce")
            if axes is None or sorted(a % rank for a in axes) != [2, 3] or rank != 4:
                return reduce_spec(node)
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
