"""Model validation: an imported graph is checked once, against the ops' shape inference, before
anything plans it. Here and not in the IR, which knows nothing of ops."""
from __future__ import annotations

from tightfit.graph.ir import Graph
from tightfit.ops import get_op


class GraphError(ValueError):
    """An internally inconsistent graph (an importer bug, not a user error)."""


def validate(graph: Graph) -> Graph:
    """Check ids, names, topological order, shapes and parameters; raise GraphError."""
    seen: set[str] = set(graph.inputs)
    names: set[str] = set()
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
        expected = get_op(layer.op).output_shape(layer, [graph.shape(t) for t in layer.inputs], graph)
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
