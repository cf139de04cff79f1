"""Normalizations and reductions over channels: LayerNormalization over C (ConvNeXt; per pixel,
so it splits by rows and tiles like any elementwise op), InstanceNormalization (statistics over
each sample's H x W: whole samples only), and ReduceMean/ReduceMax over C (per pixel)."""
from __future__ import annotations

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.attention import layer_norm_spec
from tightfit.ops.registry import register
from tightfit.ops.base import InputWindow, OnnxNode, OnnxSpec, Op, Region, Shape

# The attribute the importer's channels-last rewrite sets on a LayerNormalization that ran over
# the last axis of an NHWC tensor and now runs over C of the NCHW one.
OVER_CHANNELS = "tightfit_over_channels"


def _channel_vector(node: OnnxNode, i: int, channels: int, what: str, default: float) -> np.ndarray:
    if i >= len(node.inputs) or not node.inputs[i]:
        return np.full(channels, default, np.float32)
    v = node.const_input(i)
    if v is None:
        raise ValueError(f"{what} (input {i}) must be a constant")
    if v.size not in (1, channels) or any(d != 1 for d in sorted(v.shape, reverse=True)[1:]):
        raise ValueError(f"{what} of shape {v.shape} is not one value per channel ({channels})")
    return np.broadcast_to(np.asarray(v, np.float32).reshape(-1), (channels,)).copy()


def _epsilon(node: OnnxNode) -> float:
    eps = float(node.attrs.get("epsilon", 1e-5))
    if not eps >= 0:
        raise ValueError(f"epsilon {eps} is negative")
    return eps


def _single_output(node: OnnxNode) -> None:
    if len([o for o in node.outputs if o]) > 1:
        raise ValueError("only the normalized output is supported (not the mean / inverse std outputs)")


class _Normalization(Op):
    """A per-channel affine normalization: same shape out, no weights of its own besides scale and
    bias, 4 multiply-adds per element."""

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        return tuple(in_shapes[0])

    def kernel_bytes(self, layer, graph, itemsize) -> int:
        return 0

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return 4 * out.numel(out_shape)


@register
class ChannelNorm(_Normalization):
    """y = (x - mean_C x) / sqrt(var_C x + eps) * scale + bias at every pixel."""

    name = "channel_norm"
    onnx_types = ("LayerNormalization",)

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        shape = node.shape(node.inputs[0])
        rank = len(shape)
        axis = int(node.attrs.get("axis", -1))
        if not -rank <= axis < rank:
            raise ValueError(f"axis {axis} out of range for rank {rank}")
        axis %= rank
        over_c = bool(node.attrs.get(OVER_CHANNELS)) or (axis == 1 and all(d == 1 for d in shape[2:]))
        if not over_c:
            _single_output(node)
            return layer_norm_spec(node, axis, _epsilon(node))
        if rank not in (2, 4):
            raise ValueError(f"LayerNormalization over axes {axis}..{rank - 1} of {shape}: only over channels (C of NCHW,"
                             " or the last axis between Transposes to and from NHWC, as ConvNeXt has it)")
        _single_output(node)
        c = shape[1]
        scale = _channel_vector(node, 1, c, "scale", 1.0)
        bias = _channel_vector(node, 2, c, "bias", 0.0)
        return OnnxSpec({"epsilon": _epsilon(node), "act": ()}, [node.inputs[0]], [scale, bias])


@register
class InstanceNorm(_Normalization):
    """y = (x - mean_HW x) / sqrt(var_HW x + eps) * scale_c + bias_c per sample and channel."""

    name = "instancenorm"
    onnx_types = ("InstanceNormalization",)
    splittable = False

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        shape = node.shape(node.inputs[0])
        if len(shape) != 4:
            raise ValueError(f"InstanceNormalization of a rank-{len(shape)} tensor; only NCHW (rank 4) is supported")
        c = shape[1]
        if len(node.inputs) < 3:
            raise ValueError("InstanceNormalization takes input, scale and bias")
        scale = _channel_vector(node, 1, c, "scale", 1.0)
        bias = _channel_vector(node, 2, c, "bias", 0.0)
        return OnnxSpec({"epsilon": _epsilon(node), "act": ()}, [node.inputs[0]], [scale, bias])

    def input_windows(self, layer: Layer, out: Region, in_shapes) -> tuple[InputWindow, ...]:
        return (InputWindow(Region.whole(in_shapes[0]).with_samples(out.n0, out.n1)),)


@register
class ChannelReduce(Op):
    """ReduceMean / ReduceMax over C with keepdims: (N, C, H, W) -> (N, 1, H, W), per pixel. The
    ONNX Reduce types map to global_pool, which hands a reduction over axis 1 to this op."""

    name = "channel_reduce"

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        if node.op_type not in ("ReduceMean", "ReduceMax"):
            raise ValueError(f"{node.op_type} over channels is not supported (ReduceMean, ReduceMax are)")
        shape = node.shape(node.inputs[0])
        axes = node.attrs.get("axes")
        if axes is None and node.const_input(1) is not None:
            axes = [int(a) for a in node.const_input(1).reshape(-1)]
        if len(shape) != 4 or axes is None or [int(a) % 4 for a in axes] != [1]:
            raise ValueError(f"a channel reduction takes NCHW data and axes [1]; got axes {axes} of {shape}")
        if not int(node.attrs.get("keepdims", 1)):
            raise ValueError("a reduction over C with keepdims=0 (an (N, H, W) tensor) is not supported; keepdims=1 is")
        return OnnxSpec({"kind": "max" if node.op_type == "ReduceMax" else "mean", "act": ()}, [node.inputs[0]])

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        n, _, h, w = in_shapes[0]
        return (n, 1, h, w)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape) * in_shapes[0][1]
