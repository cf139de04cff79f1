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
from typing import Sequence

from tightfit.analysis.csdf import needs_whole_input
from tightfit.errors import OptionError
from tightfit.graph.ir import Graph, itemsize, last_reads
from tightfit.ops import WORKSPACE_MODELS, get_op
from tightfit.ops.registry import step_workspace
from tightfit.ops.base import Region
from tightfit.plan.lifetimes import lifetimes
from tightfit.plan.schema import Plan


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
    original_params = graph.original_param_count * size + graph.original_int_param_bytes
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


@dataclass(frozen=True)
class WholeStepPeaks:
    """What the layers no plan splits (attention over all tokens, a layer norm, a dense layer:
    each a whole step) cost a plan. `blocks`: the most bytes live (with that step's scratch) at a
    step while a buffer a whole step reads or writes is live (the whole step itself, and the
    split steps around it that must keep its tensors whole); `split`: the most at any other step
    (the convolutional stages). Where `blocks` is the plan's peak, the whole steps set its arena
    and splitting the other layers further gains nothing."""

    blocks: int
    split: int
    whole_steps: int


def whole_step_peaks(plan: Plan, graphs: Sequence[Graph]) -> WholeStepPeaks:
    life = lifetimes(plan, graphs, conflicts=False)
    live = life.live_bytes()
    steps = plan.steps()
    whole = [s.kind == "compute" and needs_whole_input(graphs[s.model], graphs[s.model].layers[s.layer]) for s in steps]
    held = {a.buffer for s, w in zip(steps, whole) if w for a in (s.out, *s.inputs)}
    in_block = [False] * len(steps)
    for (b, _), r in zip(life.keys, life.reqs):
        if b in held:
            in_block[r.first_use:r.last_use + 1] = [True] * (r.last_use + 1 - r.first_use)
    blocks = max((n + k for n, k, b in zip(live, life.step_scratch, in_block) if b), default=0)
    split = max((n + k for n, k, b in zip(live, life.step_scratch, in_block) if not b), default=0)
    return WholeStepPeaks(blocks, split, sum(whole))
