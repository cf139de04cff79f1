"""Memory accounting per layer and per model (DESIGN.md definitions).

- param: the parameters a layer holds at run time (batch norms folded); `kernel` is the main
  weight tensor alone (MAFAT Table 2.1's 'Weights').
- naive: what DL frameworks do, the papers' 'no reduction': every tensor of the imported model
  in its own buffer (activation outputs included) plus all of the imported model's parameters.
- layer peak: running layer by layer in imported order, freeing each tensor after its last
  reader, the largest (live tensors + that layer's workspace).
"""
from __future__ import annotations

from dataclasses import dataclass

from tightfit.errors import OptionError
from tightfit.graph.ir import Graph, itemsize, last_reads
from tightfit.ops import WORKSPACE_MODELS, get_op
from tightfit.ops.registry import step_workspace
from tightfit.ops.base import Region


@dataclass(frozen=True)
class LayerMemory:
    id: int
    name: str
    op: str
    input_shapes: tuple[tuple[int, ...], ...]
    output_shape: tuple[int, ...]
    kernel_bytes: int
    param_bytes: int
    input_bytes: int
    output_bytes: int
    workspace_bytes: int

    @property
    def total_bytes(self) -> int:
        """MAFAT's 'Total': weights + input + output + scratch."""
        return self.kernel_bytes + self.input_bytes + self.output_bytes + self.workspace_bytes


@dataclass(frozen=True)
class ModelMemory:
    model: str
    dtype: str
    workspace: str
    batch: int
    layers: tuple[LayerMemory, ...]
    param_bytes: int
    original_param_bytes: int
    naive_bytes: int
    layer_peak_bytes: int


def layer_workspace(graph: Graph, layer_id: int, dtype: str = "fp32", workspace: str = "none", batch: int = 1) -> int:
    layer = graph.layers[layer_id]
    in_shapes = [_batched(graph.shape(t), batch) for t in layer.inputs]
    out_shape = _batched(graph.shape(layer.output), batch)
    return step_workspace(layer, Region.whole(out_shape), in_shapes, out_shape, itemsize(dtype), workspace)


def _batched(shape: tuple[int, ...], batch: int) -> tuple[int, ...]:
    return (batch,) + tuple(shape[1:])


def account(graph: Graph, dtype: str = "fp32", workspace: str = "none", batch: int = 1) -> ModelMemory:
    if workspace not in WORKSPACE_MODELS:
        raise OptionError(f"unknown workspace model {workspace!r}; choose from {', '.join(WORKSPACE_MODELS)}")
    size = itemsize(dtype)
    rows = []
    for layer in graph.layers:
        op = get_op(layer.op)
        rows.append(LayerMemory(
            id=layer.id, name=layer.name, op=layer.op,
            input_shapes=tuple(graph.shape(t) for t in layer.inputs), output_shape=graph.shape(layer.output),
            kernel_bytes=op.kernel_bytes(layer, graph, size), param_bytes=op.param_bytes(layer, graph, size),
            input_bytes=sum(graph.tensors[t].nbytes(dtype, batch) for t in dict.fromkeys(layer.inputs)),
            output_bytes=graph.tensors[layer.output].nbytes(dtype, batch),
            workspace_bytes=layer_workspace(graph, layer.id, dtype, workspace, batch),
        ))
    original_params = graph.original_param_count * size
    naive = original_params + sum(t.nbytes(dtype, batch) for t in graph.original_tensors)
    return ModelMemory(
        model=graph.name, dtype=dtype, workspace=workspace, batch=batch, layers=tuple(rows),
        param_bytes=sum(r.param_bytes for r in rows), original_param_bytes=original_params,
        naive_bytes=naive, layer_peak_bytes=layer_peak(graph, rows, dtype, batch),
    )


def layer_peak(graph: Graph, rows: tuple[LayerMemory, ...] | list[LayerMemory], dtype: str, batch: int) -> int:
    last = last_reads(graph) | {t: len(graph.layers) for t in graph.outputs}
    live: dict[str, int] = {}
    peak = 0
    for layer, row in zip(graph.layers, rows):
        # a model input is live from its first reader on (a second input read late is not held before)
        live.update({t: graph.tensors[t].nbytes(dtype, batch) for t in layer.inputs if t in graph.inputs})
        live[layer.output] = row.output_bytes
        peak = max(peak, sum(live.values()) + row.workspace_bytes)
        for t in set(layer.inputs):
            if last.get(t) == layer.id:
                live.pop(t, None)
    return peak
