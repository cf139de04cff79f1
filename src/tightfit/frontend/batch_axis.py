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
