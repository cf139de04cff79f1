"""The reference run: a graph layer by layer on the kernel library, channels-last, each buffer
freed after its last reader (the reuse plan). Outputs of plans are compared with it; the
independent checks of the kernels themselves are onnxruntime and onnx's reference evaluator
(tests/test_ops.py, verify.py). A module of the face: it plans (techniques/) and runs (runtime/)."""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from tightfit.graph.ir import Graph
from tightfit.kernels.step_args import Context
from tightfit.runtime.executor import ArenaExecutor, typed, view_array
from tightfit.runtime.reference import input_dtype
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse


def run_reference(graph: Graph, inputs, keep: Iterable[str] = (), threads: int = 1) -> dict[str, np.ndarray]:
    """Run the graph on one input (an array, or {input name: array}) on `threads` threads; return
    its outputs (in the model's order) and any tensors named in `keep`, as arrays of their own."""
    # Each input as the executor takes it (float32, or an int8 input's int8 values, checked there).
    if isinstance(inputs, Mapping):
        x = {t: _as_input(inputs[t], graph, t) for t in graph.inputs}
        batch = int(x[graph.inputs[0]].shape[0])
    else:
        x = _as_input(inputs, graph, graph.inputs[0])
        batch = int(x.shape[0])
    wanted = dict.fromkeys(list(graph.outputs) + list(keep))
    # Tensors asked for besides the outputs each keep a buffer of their own (the naive plan);
    # else buffers are reused after their last reader, as a layer-by-layer run frees tensors.
    planner = "naive" if len(wanted) > len(graph.outputs) else "improve"
    plan = plan_reuse(PlannedModel(graph, graph.name or "reference", batch), planner=planner, layout="nhwc")
    ex = ArenaExecutor(plan, [graph], threads=threads)
    outs = ex.run(x)[0]
    ctx = Context(plan, [graph], 0)
    written = {s.out.tensor: s.out for s in plan.steps()}
    result = {}
    for t in wanted:
        if t in outs:
            result[t] = outs[t].copy()
        elif t in written:
            shape = (batch,) + tuple(graph.shape(t)[1:])
            arena = typed(ex.arena, plan.buffers[written[t].buffer].itemsize)
            result[t] = view_array(arena, ctx.view(0, written[t]), shape).copy()
    return result


def _as_input(a, graph: Graph, tensor: str) -> np.ndarray:
    a = np.asarray(a)
    return np.ascontiguousarray(a if input_dtype(graph, tensor) == np.int8 else a.astype(np.float32, copy=False))
