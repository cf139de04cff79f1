"""The reference executor: runs any Graph layer by layer with the registry's kernels, each layer
computing its whole output into a fresh tensor, each tensor freed after its last reader."""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import torch

from tightfit.graph.ir import Graph, last_reads
from tightfit.ops import get_op, run_layer


def load_params(graph: Graph) -> dict[int, list[torch.Tensor]]:
    """Kernel-ready parameters per layer id, made once per graph."""
    return {l.id: get_op(l.op).prepare_params(l, [graph.params[p] for p in l.params]) for l in graph.layers}


def run_reference(
    graph: Graph, inputs: Mapping[str, torch.Tensor] | torch.Tensor,
    keep: Iterable[str] = (), params: dict[int, list[torch.Tensor]] | None = None,
) -> dict[str, torch.Tensor]:
    """Run the graph; return its outputs (in the model's order) and any tensors named in `keep`."""
    if isinstance(inputs, torch.Tensor):
        inputs = {graph.inputs[0]: inputs}
    params = load_params(graph) if params is None else params
    keep = dict.fromkeys(list(graph.outputs) + list(keep))
    batch = next(iter(inputs.values())).shape[0]
    live: dict[str, torch.Tensor] = {k: v.contiguous() for k, v in inputs.items()}
    last = last_reads(graph)
    with torch.no_grad():
        for layer in graph.layers:
            shape = (batch,) + graph.shape(layer.output)[1:]
            out = torch.empty(shape, dtype=torch.float32)
            run_layer(layer, [live[t] for t in layer.inputs], params[layer.id], out)
            live[layer.output] = out
            for t in set(layer.inputs):
                if last.get(t) == layer.id and t not in keep:
                    del live[t]
    return {k: live[k] for k in keep if k in live}


def input_tensor(values: np.ndarray) -> torch.Tensor:
    """An input for the executors from an array of values (their tensor type), as float32."""
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def random_input(graph: Graph, batch: int | None = None, seed: int = 0) -> torch.Tensor:
    shape = graph.shape(graph.inputs[0])
    if batch is not None:
        shape = (batch,) + shape[1:]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)
