"""ONNX QOperator models (QLinearConv, QGemm, QLinearAdd, ... as `onnxruntime.quantization.quantize_static(...,
quant_format=QuantFormat.QOperator)` writes them) as the QDQ form they stand for.

Each QLinear node becomes DequantizeLinear on its int8 inputs, the float op, and QuantizeLinear on
its output (the same tensor names at both ends), its int32 bias a DequantizeLinear of scale x_scale *
w_scale; an op that moves or selects int8 values as they are (MaxPool, Flatten, Reshape, Transpose,
Squeeze, Unsqueeze) is wrapped alike with its input's scale. The importer then reads the file as a
QDQ one and `frontend/qdq.fold` makes the same int8 layers of it (one int8 IR, one set of kernels);
an op with no int8 kernel stays a float layer between a dequantize and a quantize layer. Each
reader gets a DequantizeLinear of its own, as onnxruntime's fused nodes read their inputs (so an
average pool follows QLinearAveragePool's arithmetic, not the float AveragePool's)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tightfit.errors import ModelLoadError

MS = "com.microsoft"
# QLinear node -> (the float op, indices of its (x, scale, zero point) inputs, of its output's (scale,
# zero point), attributes dropped); QLinearConv, QGemm, QLinearMatMul and QLinearConcat are their own.
UNARY = {
    "QLinearGlobalAveragePool": ("GlobalAveragePool", (3, 4), ("channels_last",)),
    "QLinearAveragePool": ("AveragePool", (3, 4), ("channels_last",)),
    "QLinearSigmoid": ("Sigmoid", (3, 4), ()),
    "QLinearLeakyRelu": ("LeakyRelu", (3, 4), ()),
}
BINARY = {"QLinearAdd": "Add", "QLinearMul": "Mul"}
# Ops onnxruntime runs on int8 tensors as they are: the output has the input's scale and zero point.
PASS = ("MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity")
DYNAMIC = ("MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "DynamicQuantizeMatMul")
QOPERATOR = frozenset({*UNARY, *BINARY, "QLinearConv", "QLinearMatMul", "QGemm", "QLinearConcat", *DYNAMIC})


def _ms_int8(node: onnx.NodeProto) -> bool:
    """An onnxruntime int8 op (com.microsoft's QLinear*, NhwcQLinear* and QOrdered* ops, QGemm,
    QAttention; not its float ops, QuickGelu among them)."""
    return node.domain == MS and (node.op_type.startswith(("QLinear", "NhwcQLinear", "QOrdered"))
                                  or node.op_type in ("QGemm", "QAttention", *DYNAMIC))


def is_qoperator(model: onnx.ModelProto) -> bool:
    return any(n.op_type in QOPERATOR or _ms_int8(n) for n in model.graph.node)


class _Rewrite:
    """The new node list, the new constants, and the quantization (scale, zero point names) of every
    int8 tensor seen so far."""

    def __init__(self, model: onnx.ModelProto):
        self.consts = {i.name: i for i in model.graph.initializer}
        self.quant: dict[str, tuple[str, str]] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, base: str, what: str) -> str:
        self.count += 1
        return f"{base}__{what}{self.count}"

    def const(self, label: str, name: str) -> np.ndarray:
        if not name:
            raise ModelLoadError(f"node {label!r}: a scale or zero point input is missing")
        if name not in self.consts:
            raise ModelLoadError(f"node {label!r}: its quantization parameter {name!r} is not a constant")
        return numpy_helper.to_array(self.consts[name])

    def dq(self, label: str, x: str, scale: str, zero: str, axis: int | None = None) -> str:
        """A DequantizeLinear of x (its own, for one reader)."""
        if not scale:
            raise ModelLoadError(f"node {label!r}: no scale for its input {x!r}")
        out = self.name(x, "dq")
        attrs = {} if axis is None else {"axis": axis}
        self.count += 1  # the node's name says whose input it is (a bad weight's error names it)
        self.nodes.append(helper.make_node("DequantizeLinear", [x, scale, zero] if zero else [x, scale], [out],
                                           name=f"{label}/{x}/dequantize{self.count}", **attrs))
        return out

    def q(self, label: str, y_float: str, y: str, scale: str, zero: str) -> None:
        self.nodes.append(helper.make_node("QuantizeLinear", [y_float, scale, zero] if zero else [y_float, scale], [y],
                                           name=f"{label}__quantize"))
        self.quant[y] = (scale, zero)

    def op(self, node: onnx.NodeProto, op_type: str, inputs: list[str], drop: tuple = ()) -> str:
        """The float op, named as the node (the layer's name, int8 or not)."""
        out = self.name(node.output[0], "f")
        attrs = [a for a in node.attribute if a.name not in drop]
        n = helper.make_node(op_type, inputs, [out], name=_label(node))
        n.attribute.extend(attrs)
        self.nodes.append(n)
        return out

    def bias(self, label: str, b: str, xs: str, ws: str) -> str:
        """An int32 bias as a DequantizeLinear of scale x_scale * w_scale (QLinearConv's, QGemm's)."""
        scale = (self.const(label, xs).astype(np.float32) * self.const(label, ws).astype(np.float32)).astype(np.float32)
        s_name, z_name = self.name(b, "scale"), self.name(b, "zero")
        self.inits += [numpy_helper.from_array(scale.reshape(-1) if scale.size > 1 else scale.reshape(()), s_name),
                       numpy_helper.from_array(np.zeros(scale.size if scale.size > 1 else (), np.int32), z_name)]
        return self.dq(label, b, s_name, z_name, 0 if scale.size > 1 else None)


def _label(node: onnx.NodeProto) -> str:
    return node.name or node.output[0]


def _inputs(node: onnx.NodeProto, count: int) -> list[str]:
    return list(node.input) + [""] * (count - len(node.input))


def _weight_axis(r: _Rewrite, label: str, scale: str, axis: int) -> int | None:
    return axis if r.const(label, scale).size > 1 else None


def _conv(r: _Rewrite, node: onnx.NodeProto) -> None:
    x, xs, xz, w, ws, wz, ys, yz, b = _inputs(node, 9)
    label = _label(node)
    ins = [r.dq(label, x, xs, xz), r.dq(label, w, ws, wz, _weight_axis(r, label, ws, 0))]
    if b:
        ins.append(r.bias(label, b, xs, ws))
    r.q(label, r.op(node, "Conv", ins), node.output[0], ys, yz)


def _gemm(r: _Rewrite, node: onnx.NodeProto) -> None:
    a, as_, az, b, bs, bz, c, ys, yz = _inputs(node, 9)
    label = _label(node)
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    ins = [r.dq(label, a, as_, az), r.dq(label, b, bs, bz, _weight_axis(r, label, bs, 0 if attrs.get("transB", 0) else 1))]
    if c:
        ins.append(r.bias(label, c, as_, bs))
    y = r.op(node, "Gemm", ins)
    if ys:  # without an output scale QGemm's output is float
        r.q(label, y, node.output[0], ys, yz)
    else:
        r.nodes.append(helper.make_node("Identity", [y], [node.output[0]], name=f"{label}__output"))


def _matmul(r: _Rewrite, node: onnx.NodeProto) -> None:
    a, as_, az, b, bs, bz, ys, yz = _inputs(node, 8)
    label = _label(node)
    axis = _weight_axis(r, label, bs, 1) if b in r.consts else None
    r.q(label, r.op(node, "MatMul", [r.dq(label, a, as_, az), r.dq(label, b, bs, bz, axis)]), node.output[0], ys, yz)


def _concat(r: _Rewrite, node: onnx.NodeProto) -> None:
    ys, yz, *rest = node.input
    label = _label(node)
    if len(rest) % 3:
        raise ModelLoadError(f"node {label!r} (QLinearConcat): {len(node.input)} inputs, not 2 + 3 per input")
    ins = [r.dq(label, *rest[i:i + 3]) for i in range(0, len(rest), 3)]
    r.q(label, r.op(node, "Concat", ins), node.output[0], ys, yz)


def _unary(r: _Rewrite, node: onnx.NodeProto) -> None:
    op, (si, zi), drop = UNARY[node.op_type]
    x, xs, xz, ys, yz = _inputs(node, 5)
    label = _label(node)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("channels_last", 0):
        raise ModelLoadError(f"node {label!r} ({node.op_type}): channels_last=1 (channels-last int8 tensors) is not read")
    r.q(label, r.op(node, op, [r.dq(label, x, xs, xz)], drop), node.output[0], ys, yz)


def _binary(r: _Rewrite, node: onnx.NodeProto) -> None:
    a, as_, az, b, bs, bz, ys, yz = _inputs(node, 8)
    label = _label(node)
    r.q(label, r.op(node, BINARY[node.op_type], [r.dq(label, a, as_, az), r.dq(label, b, bs, bz)]), node.output[0], ys, yz)


def _passing(r: _Rewrite, node: onnx.NodeProto) -> None:
    """MaxPool, Flatten, ... of an int8 tensor: dequantized, the op, quantized with the input's scale."""
    label = _label(node)
    x = node.input[0]
    s, z = r.quant[x]
    r.q(label, r.op(node, node.op_type, [r.dq(label, x, s, z), *node.input[1:]]), node.output[0], s, z)


REWRITES: dict[str, Callable[[_Rewrite, onnx.NodeProto], None]] = {
    "QLinearConv": _conv, "QGemm": _gemm, "QLinearMatMul": _matmul, "QLinearConcat": _concat,
    **{k: _unary for k in UNARY}, **{k: _binary for k in BINARY},
}


def _one(r: _Rewrite, node: onnx.NodeProto) -> None:
    label = _label(node)
    if node.op_type in DYNAMIC:
        raise ModelLoadError(f"node {label!r} ({node.op_type}): dynamic quantization (int8 scales computed at run "
                             "time) is not run; quantize the model statically (quantize_static)")
    if node.op_type in REWRITES:
        REWRITES[node.op_type](r, node)
        return
    if _ms_int8(node):  # e.g. QLinearSoftmax (onnxruntime's lookup-table softmax), NhwcQLinearConv (channels-last)
        raise ModelLoadError(f"node {label!r} ({node.op_type}, {MS}): onnxruntime's int8 op is not read (tightfit reads "
                             f"{', '.join(sorted(REWRITES))}; quantize leaving {node.op_type.removeprefix('QLinear')} "
                             "out of op_types_to_quantize, or as QDQ)")
    int8_in = [t for t in node.input if t in r.quant]
    if node.op_type == "QuantizeLinear":
        r.nodes.append(node)
        r.quant[node.output[0]] = (node.input[1], node.input[2] if len(node.input) > 2 else "")
    elif not int8_in or node.op_type == "DequantizeLinear":
        r.nodes.append(node)
    elif node.op_type in PASS and int8_in == [node.input[0]]:
        _passing(r, node)
    else:
        raise ModelLoadError(f"node {label!r} ({node.op_type}) reads the int8 tensor {int8_in[0]!r} as it is; "
                             f"tightfit reads {', '.join(PASS)} and the QLinear ops so")


def to_qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """The QOperator model in QDQ form (a new model; the file's unchanged)."""
    r = _Rewrite(model)
    for node in model.graph.node:
        _one(r, node)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(r.nodes)
    out.graph.initializer.extend(r.inits)
    del out.graph.value_info[:]  # the int8 tensors' types; the float ones between are new
    del out.opset_import[:]
    opsets = {o.domain: o.version for o in model.opset_import if o.domain not in (MS, "ai.onnx")}
    opsets[""] = max(opsets.get("", 13), 13)  # DequantizeLinear's axis (per-channel weights)
    out.opset_import.extend(helper.make_opsetid(d, v) for d, v in opsets.items())
    return out
