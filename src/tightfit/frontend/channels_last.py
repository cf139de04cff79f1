"""Channels-last blocks back to NCHW, so they stay a spatial chain that parts and tiling split.

torchvision's ConvNeXt block runs dwconv -> Permute to NHWC -> LayerNorm(last dim) -> Linear ->
GELU -> Linear -> Permute back (and LayerNorm2d permutes around a LayerNorm). Between the two
Transposes every node works per pixel over the last axis (channels): rewritten for NCHW data,
LayerNorm over the last axis is a channel LayerNorm, a Linear (MatMul by a constant) a 1x1
conv, a constant operand of shape (..., C) one of (1, C, 1, 1), a reduction or softmax over
the last axis one over C. The Transposes become Identity. A block with any other node, or
whose tensors are read outside it, is left as it is."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tightfit.frontend import folding
from tightfit.ops.activation import ONNX_ACTIVATIONS
from tightfit.ops.normalize import OVER_CHANNELS

TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
ELEMENTWISE = set(ONNX_ACTIVATIONS) | {"Add", "Sub", "Mul", "Div", "Pow", "Min", "Max", "Sum", "Identity", "Dropout"}
LAST_AXIS = ("LayerNormalization", "Softmax", "LogSoftmax")
REDUCE = ("ReduceMean", "ReduceMax")


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _perm(node: onnx.NodeProto) -> list[int] | None:
    return [int(p) for p in _attrs(node).get("perm", [])] if node.op_type == "Transpose" else None


def _constants(nodes: Iterable[onnx.NodeProto], consts: dict[str, np.ndarray], opset: int) -> dict[str, np.ndarray]:
    """The constants, those of Constant nodes, and what simple nodes make of them (exporters
    write a Linear's weight as Transpose(W), and alias weights through Identity)."""
    out = dict(consts)
    for n in nodes:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        elif n.input and all(t in out for t in n.input if t) and len(n.output) == 1:
            values = [out[t] if t else None for t in n.input]
            try:
                value = (np.transpose(values[0], _attrs(n).get("perm")) if n.op_type == "Transpose"
                         else folding.fold(n.op_type, _attrs(n), values, opset))
            except Exception:  # left to the importer's folding, which names the node
                value = None
            if value is not None:
                out[n.output[0]] = np.asarray(value)
    return out


def _last_axis(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> bool:
    """Whether a node works over the last axis of a rank-4 tensor only (its own rules)."""
    a = _attrs(node)
    if node.op_type in LAST_AXIS:
        return int(a.get("axis", -1)) in (-1, 3)
    if node.op_type in REDUCE:
        axes = a.get("axes")
        if axes is None and len(node.input) > 1 and node.input[1] in consts:
            axes = consts[node.input[1]].reshape(-1).tolist()
        return axes is not None and [int(x) % 4 for x in axes] == [3] and int(a.get("keepdims", 1)) == 1
    if node.op_type == "MatMul":
        w = consts.get(node.input[1])
        return w is not None and w.ndim == 2 and node.input[0] not in consts
    return node.op_type in ELEMENTWISE and all(consts[t].ndim <= 4 for t in node.input if t in consts)


def _block(start: int, nodes: list[onnx.NodeProto], readers: dict[str, list[int]], consts: dict[str, np.ndarray],
           outputs: set[str]) -> tuple[list[int], list[int]] | None:
    """(inner nodes, closing Transposes) of the channels-last block opened by nodes[start]."""
    inner: list[int] = []
    exits: list[int] = []
    made = {nodes[start].output[0]}
    queue = [nodes[start].output[0]]
    while queue:
        t = queue.pop()
        if t in outputs:
            return None
        for j in readers.get(t, []):
            if j in inner or j in exits:
                continue
            n = nodes[j]
            if _perm(n) == TO_NCHW:
                exits.append(j)
            elif _last_axis(n, consts):
                inner.append(j)
                made.update(o for o in n.output if o)
                queue.extend(o for o in n.output if o)
            else:
                return None
    for j in inner:
        if any(t and t not in made and t not in consts for t in nodes[j].input):
            return None  # reads channels-last data from outside the block
    return (sorted(inner), exits) if exits else None


def _nchw_const(name: str, value: np.ndarray, new: dict[str, np.ndarray]) -> str:
    """A constant operand broadcast against NHWC data, as one broadcast against NCHW data."""
    if value.size == 1:
        return name
    key = f"{name}::nchw"
    v4 = value.reshape((1,) * (4 - value.ndim) + value.shape)
    new[key] = np.ascontiguousarray(v4.transpose(0, 3, 1, 2))
    return key


def _rewritten(n: onnx.NodeProto, consts: dict[str, np.ndarray], new: dict[str, np.ndarray]) -> onnx.NodeProto:
    a = _attrs(n)
    inputs = list(n.input)
    if n.op_type == "MatMul":
        key = f"{n.input[1]}::conv1x1"
        w = consts[n.input[1]]
        new[key] = np.ascontiguousarray(w.T.reshape(w.shape[1], w.shape[0], 1, 1))
        return helper.make_node("Conv", [inputs[0], key], list(n.output), name=n.name, kernel_shape=[1, 1])
    if n.op_type == "LayerNormalization":
        a.update(axis=1, **{OVER_CHANNELS: 1})
    elif n.op_type in ("Softmax", "LogSoftmax"):
        a["axis"] = 1
    elif n.op_type in REDUCE:
        if "axes" in a:
            a["axes"] = [1]
        else:
            key = f"{n.input[1]}::nchw"
            new[key] = np.array([1], np.int64)
            inputs[1] = key
    else:
        inputs = [_nchw_const(t, consts[t], new) if t in consts else t for t in inputs]
    return helper.make_node(n.op_type, inputs, list(n.output), name=n.name, domain=n.domain, **a)


def rewrite(nodes: list[onnx.NodeProto], consts: dict[str, np.ndarray], outputs: set[str],
            opset: int = 17) -> list[onnx.NodeProto]:
    """The nodes with every channels-last block rewritten for NCHW; new constants go into `consts`."""
    known = _constants(nodes, consts, opset)
    readers: dict[str, list[int]] = {}
    for j, n in enumerate(nodes):
        for t in dict.fromkeys(n.input):
            readers.setdefault(t, []).append(j)
    out = list(nodes)
    done: set[int] = set()
    for i, n in enumerate(nodes):
        if i in done or _perm(n) != TO_NHWC:
            continue
        block = _block(i, nodes, readers, known, outputs)
        if block is None:
            continue
        inner, exits = block
        new: dict[str, np.ndarray] = {}
        out[i] = helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name)
        for j in exits:
            out[j] = helper.make_node("Identity", [nodes[j].input[0]], [nodes[j].output[0]], name=nodes[j].name)
        for j in inner:
            out[j] = _rewritten(nodes[j], known, new)
        consts.update(new)
        known.update(new)
        done.update([i, *inner, *exits])
    return out
