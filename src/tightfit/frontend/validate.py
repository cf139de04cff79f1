"""Model validation at the door: the ONNX wiring (every tensor defined before it is read, no
cycle, no tensor produced twice), each layer's inputs, weights and attributes against its op's
`check`, and every tensor's shape (positive dims, small enough to be held in memory), before
anything is planned or allocated. Here and not in the IR, which knows nothing of ops."""
from __future__ import annotations

import os
from math import prod
from typing import Sequence

import numpy as np
import onnx

from tightfit.errors import ModelLoadError
from tightfit.graph.ir import Graph, Layer
from tightfit.ops import get_op


class GraphError(ValueError):
    """An internally inconsistent graph (an importer bug, not a user error)."""


def memory_bytes() -> int:
    """This machine's physical memory (a tensor larger than it could never be held)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 2**40


# fp32 bytes one tensor may take: no plan can run a model whose single tensor (or weight) cannot
# be held in memory, and refusing it here keeps any later step from trying to allocate it.
MAX_TENSOR_BYTES = memory_bytes()


def check_layer_shape(where: str, shape: Sequence[int], batch: int | None = None) -> None:
    """Positive dims, and the tensor (at `batch` samples if given) small enough to be held."""
    if not shape or any(not isinstance(d, (int, np.integer)) or d < 1 for d in shape):
        raise ModelLoadError(f"{where} has shape {tuple(shape)}: every dim must be at least 1")
    n = shape[0] if batch is None else batch
    nbytes = n * prod(int(d) for d in shape[1:]) * 4
    if nbytes > MAX_TENSOR_BYTES:
        raise ModelLoadError(f"{where} of shape {(n,) + tuple(shape[1:])} takes {nbytes / 2**30:.1f} GiB, more than this "
                             f"machine's {MAX_TENSOR_BYTES / 2**30:.1f} GiB of memory")


def check_layer(layer: Layer, in_shapes: Sequence[tuple[int, ...]], params: Sequence[np.ndarray], where: str) -> None:
    """The layer's op check (inputs, weights, attributes); a failure names `where`."""
    try:
        get_op(layer.op).check(layer, in_shapes, params)
    except ValueError as e:
        raise ModelLoadError(f"{where}: {e}") from None
    for p in params:
        if p.size * 4 > MAX_TENSOR_BYTES:
            raise ModelLoadError(f"{where}: a parameter of shape {p.shape} larger than this machine's memory")
        # A NaN or infinite weight makes the outputs it reaches depend on how a kernel treats
        # padding (0 x NaN is NaN where a kernel multiplies the zeros, finite where it skips them).
        if p.dtype.kind == "f" and not np.isfinite(p).all():
            raise ModelLoadError(f"{where}: a parameter of shape {p.shape} holds NaN or infinite values")


def check_wiring(model: onnx.ModelProto) -> None:
    """Every node input is a graph input, an initializer or an earlier node's output; no tensor
    is produced twice; the graph outputs exist. A read of a later node's output is named a cycle
    when it is one, else an order problem (ONNX nodes are topologically sorted)."""
    g = model.graph
    names = [i.name for i in (*g.initializer, *g.input, *g.output)]
    names += [s for n in g.node for s in (n.name, n.op_type, n.domain, *n.input, *n.output)]
    if not all(isinstance(s, str) for s in names):  # protobuf hands out undecodable strings as bytes
        raise ModelLoadError("the model's names are not valid UTF-8 (a corrupt file?)")
    defined = {i.name for i in g.initializer} | {i.name for i in g.input}
    producer: dict[str, int] = {}
    for idx, node in enumerate(g.node):
        for o in node.output:
            if not o:
                continue
            if o in defined or o in producer:
                raise ModelLoadError(f"tensor {o!r} is produced twice (by node {_label(node)!r} and before it)")
            producer[o] = idx
    for idx, node in enumerate(g.node):
        for t in node.input:
            if not t or t in defined or producer.get(t, idx) < idx:
                continue
            if t not in producer:
                raise ModelLoadError(f"node {_label(node)!r} ({node.op_type}) reads {t!r}, which no node, input or "
                                     f"initializer defines")
            cycle = _cycle_through(g, producer, idx)
            if cycle:
                raise ModelLoadError("the graph has a cycle: " + " -> ".join(repr(_label(g.node[i])) for i in cycle))
            raise ModelLoadError(f"node {_label(node)!r} ({node.op_type}) reads {t!r} before node "
                                 f"{_label(g.node[producer[t]])!r} produces it (ONNX nodes must be in topological order)")
    for o in g.output:
        if o.name not in defined and o.name not in producer:
            raise ModelLoadError(f"graph output {o.name!r} is produced by no node")


def _label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else node.op_type)


def _cycle_through(g: onnx.GraphProto, producer: dict[str, int], start: int) -> list[int]:
    """Node indices of a cycle through node `start` (start ... start), or [] if none."""
    parents = {start: -1}
    stack = [start]
    while stack:
        i = stack.pop()
        for t in g.node[i].input:
            j = producer.get(t)
            if j is None:
                continue
            if j == start:  # data flows start -> i -> its consumer ... -> start
                path = [start]
                while i != start:
                    path.append(i)
                    i = parents[i]
                return path + [start]
            if j not in parents:
                parents[j] = i
                stack.append(j)
    return []


def validate(graph: Graph) -> Graph:
    """Check ids, names, topological order, each layer against its op, and shapes. A layer that
    fails its op's check or has an impossible shape is a model error (ModelLoadError naming the
    layer and its nodes); the rest are importer bugs (GraphError)."""
    seen: set[str] = set(graph.inputs)
    names: set[str] = set()
    for t in graph.inputs:
        check_layer_shape(f"input {t!r}", graph.shape(t))
    for i, layer in enumerate(graph.layers):
        if layer.id != i:
            raise GraphError(f"layer {layer.name!r} has id {layer.id}, expected {i}")
        if layer.name in names:
            raise GraphError(f"duplicate layer name {layer.name!r}")
        names.add(layer.name)
        for t in layer.inputs:
            if t not in seen:
                raise GraphError(f"layer {i} ({layer.name}) reads {t!r} before it is produced")
        if layer.output in seen:
            raise GraphError(f"tensor {layer.output!r} is produced twice")
        for p in layer.params:
            if p not in graph.params:
                raise GraphError(f"layer {i} ({layer.name}) names missing parameter {p!r}")
        where = f"layer {i} ({layer.name}, nodes {', '.join(layer.nodes) or '-'})"
        in_shapes = [graph.shape(t) for t in layer.inputs]
        check_layer(layer, in_shapes, [graph.params[p] for p in layer.params], where)
        expected = get_op(layer.op).output_shape(layer, in_shapes, graph)
        check_layer_shape(f"{where} output", tuple(expected))
        if tuple(expected) != graph.shape(layer.output):
            raise GraphError(
                f"layer {i} ({layer.name}): output shape {graph.shape(layer.output)} "
                f"but {layer.op} infers {tuple(expected)}"
            )
        seen.add(layer.output)
    for t in graph.outputs:
        if t not in seen:
            raise GraphError(f"graph output {t!r} is never produced")
    return graph
