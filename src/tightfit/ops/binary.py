"""Elementwise ops over several inputs: Add/Sum (residual joins) and Mul (broadcast over H, W for
squeeze-excitation). Constant operands (a bias or a scale) are parameters."""
from __future__ import annotations

import numpy as np

from tightfit.graph.ir import Layer
from tightfit.ops.registry import register
from tightfit.ops.base import OnnxNode, OnnxSpec, Op, Shape, expect


class _Elementwise(Op):
    inplace_ok = True
    combine: str

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        dynamic = [t for t in node.inputs if node.const(t) is None]
        consts = [node.const(t).astype(np.float32) for t in node.inputs if node.const(t) is not None]
        out_rank = max(len(node.shape(t)) for t in dynamic)
        for c in consts:
            if c.ndim > out_rank:
                raise ValueError("constant operand of higher rank than the data")
        consts = [c.reshape((1,) * (out_rank - c.ndim) + c.shape) for c in consts]
        attrs = {"act": ()}
        if consts:
            # The constants' broadcast shape, so the output shape is known without the graph
            # (a constant may be larger than the data: x (N,C,1,1) + b (1,C,H,W)).
            attrs["param_shape"] = tuple(int(d) for d in np.broadcast_shapes(*[c.shape for c in consts]))
        return OnnxSpec(attrs, dynamic, consts)

    def check(self, layer: Layer, in_shapes, params) -> None:
        """Data inputs of the output's rank and batch, each dim the output's or 1 (a data input
        broadcast over H or W is read whole there); constants of one sample."""
        expect(len(in_shapes) >= 1, "takes at least one data input")
        rank = len(in_shapes[0])
        expect(all(len(s) == rank for s in in_shapes) and 2 <= rank <= 6,
               f"data inputs of shapes {[tuple(s) for s in in_shapes]} must all have one rank, 2 to 6")
        expect(all(s[0] == in_shapes[0][0] for s in in_shapes), f"data inputs {[tuple(s) for s in in_shapes]} differ in batch")
        expect(all(p.ndim == rank and p.shape[0] == 1 for p in params),
               f"constant operands of shapes {[tuple(p.shape) for p in params]} must be one sample of rank {rank}")
        try:
            out = np.broadcast_shapes(*[tuple(s) for s in in_shapes], *[tuple(p.shape) for p in params])
        except ValueError:
            raise ValueError(f"operands of shapes {[tuple(s) for s in in_shapes] + [tuple(p.shape) for p in params]} "
                             f"do not broadcast") from None
        expect(all(d >= 1 for d in out), f"operands broadcast to an empty shape {out}")
        if rank > 4:  # issue 38: held contiguous, run as 4-dim views of merged dims
            groups = merged_dims(out, [tuple(s) for s in in_shapes] + [tuple(p.shape) for p in params])
            expect(len(groups) <= 4, f"operands of shapes {[tuple(s) for s in in_shapes] + [tuple(p.shape) for p in params]}"
                                     " broadcast in more than 4 separate dims")

    def output_shape(self, layer: Layer, in_shapes, graph=None) -> Shape:
        shapes = list(in_shapes)
        if graph is not None:
            shapes += [graph.params[p].shape for p in layer.params]
        elif "param_shape" in layer.attrs:
            shapes.append(tuple(layer.attrs["param_shape"]))
        shape = np.broadcast_shapes(*[tuple(s) for s in shapes])
        return (in_shapes[0][0],) + tuple(shape[1:])

    def kernel_bytes(self, layer, graph, itemsize) -> int:
        return 0

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape) * max(1, len(in_shapes) + len(layer.params) - 1)


def merged_dims(out: Shape, shapes: list[Shape]) -> list[list[int]]:
    """Groups of adjacent dims of `out` (the batch alone first; dims of 1 dropped) over which every
    operand of `shapes` (of out's rank) is whole or of size 1 alike: each group is one dim of a
    merged view, for operands above rank 4 (issue 38)."""
    groups: list[list[int]] = [[0]]
    for k in range(1, len(out)):
        if out[k] == 1:
            continue
        last = groups[-1][-1]
        if last > 0 and all((s[last] == 1) == (s[k] == 1) for s in shapes):
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


@register
class Add(_Elementwise):
    name = "add"
    onnx_types = ("Add", "Sum")
    combine = "add"


@register
class Mul(_Elementwise):
    name = "mul"
    onnx_types = ("Mul",)
    combine = "mul"


# --- the other elementwise functions of several operands ---------------------------------------

# ONNX type -> the function; each folds over its operands in order: ((a f b) f c) ...
ELTWISE_FNS = {"Sub": "sub", "Div": "div", "Pow": "pow", "Min": "min", "Max": "max", "PRelu": "prelu", "Clip": "clip"}
COMMUTATIVE = ("min", "max")


@register
class Eltwise(_Elementwise):
    """Sub, Div, Pow, Min, Max, PRelu and Clip with tensor bounds: operands broadcast as numpy
    does, in the order the node gives them (`order`: i >= 0 is data input i, -1 - j is constant
    j), so a constant may come first (1 - x, 6 / x)."""

    name = "eltwise"
    onnx_types = ("Sub", "Div", "Pow", "Min", "Max", "PRelu")
    combine = "fold"

    def from_onnx(self, node: OnnxNode) -> OnnxSpec:
        fn = ELTWISE_FNS[node.op_type]
        names = _operand_names(node, fn)
        dynamic = [t for t in names if t and node.const(t) is None]
        if not dynamic:
            raise ValueError("no data input (constants alone are folded)")
        if len(set(dynamic)) != len(dynamic):
            raise ValueError("the same tensor twice as an operand (x - x, x / x) is not supported")
        ranks = [len(node.shape(t)) for t in dynamic]
        if len(set(ranks)) != 1:
            raise ValueError(f"data inputs of ranks {ranks}; only equal ranks are supported")
        order, consts = _order_and_constants(node, names, dynamic, ranks[0])
        shapes = [tuple(node.shape(t)) for t in dynamic] + [c.shape for c in consts]
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            raise ValueError(f"operands of shapes {shapes} do not broadcast") from None
        attrs = {"fn": fn, "order": tuple(order), "act": ()}
        if consts:
            attrs["param_shape"] = tuple(int(d) for d in np.broadcast_shapes(*[c.shape for c in consts]))
        return OnnxSpec(attrs, dynamic, consts)

    def macs(self, layer, out, in_shapes, out_shape) -> int:
        return out.numel(out_shape) * max(1, len(layer.attrs["order"]) - 1)


def _operand_names(node: OnnxNode, fn: str) -> list[str]:
    """The node's operands in order; Clip's missing bounds as empty names (no bound)."""
    names = list(node.inputs)
    if fn == "clip":
        names += [""] * (3 - len(names))
    arity = {"sub": 2, "div": 2, "pow": 2, "prelu": 2, "clip": 3}.get(fn)
    if (arity is not None and len(names) != arity) or not names:
        raise ValueError(f"{node.op_type} takes {arity or 'at least 1'} inputs, this node has {len(names)}")
    if fn != "clip" and any(not t for t in names):
        raise ValueError(f"{node.op_type} with an empty input name")
    return names


def _order_and_constants(node: OnnxNode, names: list[str], dynamic: list[str],
                         rank: int) -> tuple[list[int], list[np.ndarray]]:
    """Each operand as data input i (i >= 0) or constant j (-1 - j), and the constants at the
    data's rank (a missing Clip bound is -inf or +inf)."""
    order, consts = [], []
    for k, t in enumerate(names):
        if t and node.const(t) is None:
            order.append(dynamic.index(t))
            continue
        c = np.asarray(node.const(t), dtype=np.float32) if t else np.float32(-np.inf if k == 1 else np.inf)
        if c.ndim > rank:
            raise ValueError(f"constant {t!r} of shape {c.shape} has a higher rank than the data ({rank})")
        c = c.reshape((1,) * (rank - c.ndim) + c.shape)
        if c.shape[0] != 1:
            raise ValueError(f"constant {t!r} of shape {c.shape} varies over the batch")
        order.append(-1 - len(consts))
        consts.append(c)
    return order, consts
