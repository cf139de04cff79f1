"""Attention's q, k, v taken apart along the batch axis, rewritten to keep the batch first.

Exporters of multi-head attention write `qkv.reshape(N, T, 3, heads, d).permute(2, 0, 3, 1, 4)`
then `qkv[0]`, `qkv[1]`, `qkv[2]`: a Transpose that moves the batch axis away from dim 0, read only
by Gathers of one constant index along axis 0. The IR keeps the batch first (it is free: variable
batch and sample ranges), so each such Gather becomes a Gather of that index along the axis the
Transpose moved to the front, followed by a Transpose of the remaining dims, which keeps the
batch first; the values are the same.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _scalar_index(node: onnx.NodeProto, consts: dict[str, np.ndarray]) -> int | None:
    """The constant scalar index of a Gather along axis 0, or None."""
    if node.op_type != "Gather" or int(_attrs(node).get("axis", 0)) != 0 or len(node.input) < 2:
        return None
    idx = consts.get(node.input[1])
    return int(idx) if idx is not None and np.asarray(idx).ndim == 0 else None


def _constant_values(nodes: list[onnx.NodeProto], consts: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = dict(consts)
    for n in nodes:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def rewrite(nodes: list[onnx.NodeProto], consts: dict[str, np.ndarray], outputs: set[str]) -> list[onnx.NodeProto]:
    """`nodes` with each Transpose that moves the batch axis and is read only by Gathers of a
    constant scalar index along axis 0 replaced as the module says; other nodes as they are."""
    values = _constant_values(nodes, consts)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    for t in nodes:
        perm = [int(p) for p in _attrs(t).get("perm", [])] if t.op_type == "Transpose" else []
        if not perm or perm[0] == 0 or t.output[0] in outputs:
            continue
        gathers = readers.get(t.output[0], [])
        indices = [_scalar_index(g, values) for g in gathers]
        if not gathers or any(i is None for i in indices):
            continue
        front = perm[0]
        rest = [p - (p > front) for p in perm[1:]]
        replaced[id(t)] = []
        for g, i in zip(gathers, indices):
            base = g.name or g.output[0]
            picked = f"{g.output[0]}::picked"
            replaced[id(g)] = [helper.make_node("Gather", [t.input[0], g.input[1]], [picked], name=f"{base}::gather",
                                                axis=front),
                               helper.make_node("Transpose", [picked], list(g.output), name=base, perm=rest)]
    return [m for n in nodes for m in replaced.get(id(n), [n])]


# --- windows folded into the batch (Swin's window partition) -------------------------------------
# Exporters of window attention write x.view(N, H/w, w, W/w, w, C).permute(...).reshape(N * windows,
# w * w, C): the windows join the batch. The IR keeps the batch free, so such a tensor is held as
# (N, windows, w * w, C), one dim more than the file says ("folded" by `windows`), the same elements
# in the same order; each node reading it is rewritten for the extra dim (axes after the batch
# move by one), until a Reshape gives the batch back (x.view(N, ...)). Shape nodes still see the
# file's shapes.

ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Max", "Min", "Sum"}
ONE_AXIS = {"Softmax": None, "LogSoftmax": None, "LayerNormalization": -1, "Gather": 0}  # default axis (None: needs one)


def file_shape(shape: tuple[int, ...], windows: int) -> tuple[int, ...]:
    """The shape the file gives a tensor held with `windows` folded into its batch (1: as it is)."""
    return shape if windows == 1 else (shape[0] * shape[1],) + tuple(shape[2:])


def _with(node: onnx.NodeProto, inputs: list[str] | None = None, **attrs) -> onnx.NodeProto:
    """A copy of `node` with other inputs and attributes."""
    out = helper.make_node(node.op_type, list(node.input) if inputs is None else inputs, list(node.output),
                           name=node.name, domain=node.domain)
    kept = [a for a in node.attribute if a.name not in attrs]
    out.attribute.extend(kept)
    for k, v in attrs.items():
        out.attribute.append(helper.make_attribute(k, v))
    return out


def fold_node(node: onnx.NodeProto, inputs: list[str], shapes: dict, consts: dict, windows: dict[str, int],
              batch: int) -> tuple[onnx.NodeProto, int] | None:
    """(the node rewritten for inputs held folded, the output's windows), or None where the node
    neither reads a folded tensor nor folds one (it is then imported as it is). A node it cannot
    rewrite is returned unchanged with windows 0: the caller refuses it."""
    k = max((windows.get(i, 1) for i in inputs if i), default=1)
    t = node.op_type
    if t == "Reshape" and len(inputs) > 1 and inputs[1] in consts and inputs[0] in shapes:
        return _reshape(node, inputs, shapes, consts, windows, batch)
    if k == 1:
        return None
    if any(windows.get(i, 1) not in (1, k) for i in inputs if i):
        return node, 0
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    data = next(i for i in inputs if windows.get(i, 1) == k)
    rank = len(shapes[data]) - 1  # the file's rank
    if t == "Transpose":
        perm = [int(p) for p in attrs.get("perm", range(rank - 1, -1, -1))]
        return (node, 0) if perm[0] != 0 else (_with(node, perm=[0, 1] + [p + 1 for p in perm[1:]]), k)
    if t in ONE_AXIS:
        axis = attrs.get("axis", ONE_AXIS[t])
        if axis is None or int(axis) % max(rank, 1) == 0:
            return node, 0
        return _with(node, axis=int(axis) % rank + 1), k
    if t == "Expand" and len(inputs) > 1 and inputs[1] in consts:  # to the file's shape: to the held one
        target = [int(d) for d in np.asarray(consts[inputs[1]]).reshape(-1)]
        if len(target) != rank or target[0] != batch * k:
            return node, 0
        name = f"{node.output[0]}::held_shape"
        consts[name] = np.asarray([batch, k] + target[1:], np.int64)
        return _with(node, [inputs[0], name]), k
    if t.startswith("Reduce"):
        return _reduce(node, inputs, consts, attrs, rank, k)
    if t in ELEMENTWISE or (len([i for i in inputs if i and i not in consts]) == 1 and t in UNARY):
        for i in inputs:
            c = consts.get(i)
            if c is not None and np.asarray(c).ndim >= rank and np.asarray(c).shape[0] != 1:
                return node, 0  # a constant that differs per window of the file's batch
        return node, k
    return node, 0


UNARY = {"Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Gelu", "Abs", "Neg", "Exp", "Log", "Reciprocal", "Identity",
         "Dropout", "Cast", "HardSigmoid", "HardSwish", "LeakyRelu", "Clip", "Softplus", "Elu", "Selu", "Mish"}


def _reduce(node, inputs, consts, attrs, rank: int, k: int):
    """A Reduce* over axes after the batch: each axis one further (attribute, or input since
    opsets 13 / 18)."""
    if "axes" in attrs:
        axes = [int(a) % rank for a in attrs["axes"]]
        return (node, 0) if 0 in axes or not axes else (_with(node, axes=[a + 1 for a in axes]), k)
    if len(inputs) < 2 or inputs[1] not in consts:
        return node, 0  # over every axis: the batch's windows too
    axes = [int(a) % rank for a in np.asarray(consts[inputs[1]]).reshape(-1)]
    if 0 in axes or not axes:
        return node, 0
    name = f"{node.output[0]}::held_axes"
    consts[name] = np.asarray([a + 1 for a in axes], np.int64)
    return _with(node, [inputs[0], name]), k


def _reshape(node, inputs, shapes, consts, windows, batch):
    x, k = inputs[0], windows.get(inputs[0], 1)
    have = file_shape(shapes[x], k)
    target = [int(d) for d in np.asarray(consts[inputs[1]]).reshape(-1)]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    target = [have[i] if d == 0 and not attrs.get("allowzero", 0) and i < len(have) else d for i, d in enumerate(target)]
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = int(np.prod(have)) // max(known, 1)
    if k == 1 and not (target[0] % batch == 0 and target[0] > batch):
        return None  # folds no windows: the importer's own Reshape (a batch spelled 1 included)
    if target[0] == batch:
        held, out = target, 1
    elif target[0] % batch == 0 and target[0] > batch:
        held, out = [batch, target[0] // batch] + target[1:], target[0] // batch
    else:
        return node, 0
    name = f"{node.output[0]}::held_shape"
    consts[name] = np.asarray(held, np.int64)
    return _with(node, [inputs[0], name]), out
