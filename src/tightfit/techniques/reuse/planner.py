"""Layer-by-layer plans with buffer reuse: one whole-tensor buffer per tensor (an elementwise
layer writes over an input that dies there), placed in one arena by an offset planner.

Pure functions: graph(s) and options in, Plan out."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tightfit.graph.ir import Graph, itemsize, last_reads, spatial
from tightfit.ops import get_op
from tightfit.ops.base import Region
from tightfit.plan.overlay import overlap_in_place
from tightfit.plan.place import place
from tightfit.plan.schema import Access, Buffer, Partition, Plan, Step
from tightfit.techniques import windows as memo
from tightfit.techniques.interface import PlannedModel

ORDERS = ("imported", "memory")


def layer_order(graph: Graph, order: str) -> tuple[int, ...]:
    if order == "imported":
        return tuple(range(len(graph.layers)))
    if order == "memory":
        from tightfit.techniques.reuse.order import memory_order

        return tuple(memory_order(order_model(graph)))
    from tightfit.errors import OptionError

    raise OptionError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")


def order_model(graph: Graph, dtype: str = "fp32"):
    """The graph as the order search sees it: layers, their inputs, output and scratch bytes."""
    from tightfit.analysis.memory import layer_workspace
    from tightfit.techniques.reuse.order import OrderModel

    producer = {l.output: l.id for l in graph.layers}
    deps = tuple(tuple(dict.fromkeys(producer[t] for t in l.inputs if t in producer)) for l in graph.layers)
    # Every input counted live from the start to the last layer reading any of them: an order
    # search over a model of several inputs ranks orders by a bound above the plan's own.
    return OrderModel(
        deps=deps,
        out_bytes=tuple(graph.tensors[l.output].nbytes(dtype) for l in graph.layers),
        scratch=tuple(layer_workspace(graph, l.id, dtype) for l in graph.layers),
        graph_inputs_bytes=sum(graph.tensors[t].nbytes(dtype) for t in graph.inputs),
        input_consumers=tuple(l.id for l in graph.layers if set(graph.inputs) & set(l.inputs)),
        outputs=frozenset(producer[t] for t in graph.outputs),
    )


def dense_nhwc(shape: tuple[int, ...], layout: str) -> bool:
    """Whether a whole-width region of a buffer of this shape is one dense channels-last block."""
    return layout == "nhwc" and len(shape) == 4 and shape[1] > 1


def whole_steps(model: PlannedModel, m: int, order: Sequence[int], buffer_of: dict[str, int], dtype: str,
                layout: str = "nhwc", loaded: set[str] | None = None) -> list[Step]:
    """One compute step per layer, every tensor whole in its buffer, each model input's step just
    before its first reader (so an input read late is not held from the start). `loaded`: the
    inputs loaded already (by an earlier partition); the ones loaded here are added to it."""
    g, batch = model.graph, model.batch
    loaded = set() if loaded is None else loaded
    steps = []
    for lid in order:
        layer = g.layers[lid]
        for inp in dict.fromkeys(t for t in layer.inputs if t in g.inputs and t not in loaded):
            steps.append(Step("input", m, -1, Access(inp, buffer_of[inp], Region.whole(g.shape(inp), batch), (0, 0, 0))))
            loaded.add(inp)
        out_shape = (batch,) + g.shape(layer.output)[1:]
        region = Region.whole(out_shape)
        in_shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
        windows = memo.input_windows(g, layer, region, in_shapes)
        inputs = tuple(Access(t, buffer_of[t], w.region, (w.region.n0, w.region.h0, w.region.w0)) for t, w in zip(layer.inputs, windows))
        scratch = memo.workspace_bytes(g, layer, region, in_shapes, out_shape, itemsize(dtype), dense_nhwc(out_shape, layout), layout == "nhwc")
        steps.append(Step("compute", m, lid, Access(layer.output, buffer_of[layer.output], region, (0, 0, 0)), inputs, scratch))
    return steps


def assign_buffers(graph: Graph, order: Sequence[int], inplace: bool, exclude: frozenset[int] = frozenset()) -> dict[str, str]:
    """tensor -> tensor whose buffer it uses (itself, or an input it overwrites in place);
    layers in `exclude` never write in place."""
    last = last_reads(graph, order)
    home = {t: t for t in graph.tensors}
    for pos, lid in enumerate(order):
        layer = graph.layers[lid]
        if not inplace or not get_op(layer.op).inplace_ok or lid in exclude:
            continue
        for t in layer.inputs:
            if (last[t] == pos and t not in graph.outputs and graph.shape(t) == graph.shape(layer.output)
                    and layer.inputs.count(t) == 1):
                home[layer.output] = home[t]
                break
    return home


def layout_for(shape: tuple[int, ...], layout: str) -> str:
    return layout if len(shape) == 4 else "flat"


def plan_reuse(models: Sequence[PlannedModel] | PlannedModel, planner: str = "improve", order: str = "imported",
               layout: str = "nhwc", dtype: str = "fp32", inplace: bool = True,
               partitions: Sequence[tuple[int, Sequence[int]]] | None = None,
               concurrent: Sequence[Sequence[int]] = ()) -> Plan:
    """Layer-by-layer plan of one or several models in one arena.

    `partitions` are (model, layer ids); default one partition per model, run one after another.
    Partitions in a `concurrent` set run at the same time (a pipeline on successive inputs):
    their buffers never share memory and a tensor passed between them is double-buffered.
    planner "naive" places every buffer after the previous one (no reuse: what DL frameworks do).
    """
    from tightfit.plan.place import place

    models = [models] if isinstance(models, PlannedModel) else list(models)
    if partitions is None:
        partitions = [(m, range(len(mm.graph.layers))) for m, mm in enumerate(models)]
    orders = [layer_order(mm.graph, order) for mm in models]
    homes = [assign_buffers(mm.graph, seq, inplace and planner != "naive") for mm, seq in zip(models, orders)]
    buffers: list[tuple[tuple[int, ...], str, int]] = []
    index: dict[tuple[int, str], int] = {}
    parts = []
    loaded: dict[int, set[str]] = {}  # per model, the inputs an earlier partition loaded
    for pid, (m, layer_ids) in enumerate(partitions):
        g, home = models[m].graph, homes[m]
        chosen = set(layer_ids)
        seq = tuple(i for i in orders[m] if i in chosen)
        done = loaded.setdefault(m, set())
        fresh = [t for t in g.inputs if t not in done and any(t in g.layers[i].inputs for i in seq)]
        for t in fresh + [g.layers[i].output for i in seq]:
            if home[t] == t:
                index[(m, t)] = len(buffers)
                shape = (models[m].batch,) + g.shape(t)[1:]
                buffers.append((shape, layout_for(shape, layout), g.tensors[t].item_bytes(dtype)))
        buffer_of = {t: index[(m, home[t])] for t in home if (m, home[t]) in index}
        steps = whole_steps(models[m], m, seq, buffer_of, dtype, layout, done)
        parts.append(Partition(pid, m, seq, tuple(steps)))
    copies = _fifo_copies(parts, concurrent, len(buffers))
    draft = Plan(tuple(mm.ref() for mm in models), dtype,
                 tuple(Buffer(i, "whole", s, lay, (0,) * copies[i], item) for i, (s, lay, item) in enumerate(buffers)),
                 tuple(parts), tuple(tuple(c) for c in concurrent), 0,
                 {"method": "naive" if planner == "naive" else "reuse", "planner": planner, "order": order,
                  "layout": layout, "inplace": inplace and planner != "naive"})
    return place(draft, [mm.graph for mm in models], planner)


def plan_reuse_overlapping(model: PlannedModel, planner: str = "improve", order: str = "imported", layout: str = "nhwc",
                           dtype: str = "fp32") -> Plan:
    """The layer-by-layer plan with outputs also laid over their inputs' bytes at an offset where
    the kernel's walk is done reading them before it writes them (plan/overlay.overlap_in_place:
    in-place depthwise and int8 convolutions, issue 40 point 4)."""
    plan = plan_reuse(model, planner, order, layout, dtype)
    if planner == "naive":
        return plan
    plan = overlap_in_place(plan, [model.graph], planner)
    return replace(plan, knobs=dict(plan.knobs, overlap=True))


def _fifo_copies(parts: Sequence[Partition], concurrent: Sequence[Sequence[int]], n: int) -> list[int]:
    """A buffer used by two partitions that run at the same time is a FIFO: two copies."""
    from tightfit.plan.lifetimes import buffer_users

    users = buffer_users(parts)
    sets = [set(c) for c in concurrent]
    return [2 if len(users.get(b, ())) > 1 and any(users[b] <= s for s in sets) else 1 for b in range(n)]
