"""Processing by parts (Minakova & Stefanov): layers compute their output a few rows at a time in
the CSDF firing order, and each tensor lives in an H-window buffer that holds only the rows
still needed. Pure functions: graph and phases in, Plan out.

Windows are shifted, not rings: a kernel must read its input window as one dense block, and a
ring would split windows that wrap. When the producer's next band does not fit after the rows
still needed, a copy step moves those rows to the top of the buffer (a compaction); `slack_rows`
trades window memory for fewer compactions.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Collection, Mapping, Sequence

from tightfit.analysis.csdf import CSDFGraph, firing_order, to_csdf
from tightfit.graph.ir import Graph, itemsize, spatial
from tightfit.graph.forms import nhwc_output
from tightfit.techniques import windows as memo
from tightfit.ops import get_op
from tightfit.ops.base import Region
from tightfit.plan.overlay import overlay_buffers
from tightfit.techniques.interface import PlannedModel, run_memory
from tightfit.techniques.reuse.planner import dense_nhwc, layout_for
from tightfit.plan.schema import Access, Buffer, Partition, Plan, Step


@dataclass
class _Window:
    """Planning state of one tensor's buffer: rows [base, base + capacity) of the tensor."""

    buffer: int
    capacity: int
    base: int = 0
    produced: int = 0  # rows written so far
    kind: str = "window"


@dataclass(frozen=True)
class _Firing:
    layer: int | None  # None: an input's source
    rows: tuple[int, int]
    source: str = ""  # the model input a source firing delivers

    def tensor(self, graph: Graph) -> str:
        return self.source if self.layer is None else graph.layers[self.layer].output


def _firings(csdf: CSDFGraph, held: Collection[int] = ()) -> list[_Firing]:
    out = []
    for name, phase in firing_order(csdf, held):
        actor = csdf.actor(name)
        if actor.kind == "sink":
            continue
        r0 = sum(actor.rows_per_phase[: phase - 1])
        out.append(_Firing(actor.layer_id if actor.kind == "layer" else None, (r0, r0 + actor.rows_per_phase[phase - 1]),
                           actor.label if actor.kind == "source" else ""))
    return out


def _needs(graph: Graph, batch: int, firings: Sequence[_Firing]) -> list[dict[str, tuple[int, int]]]:
    """Per firing, the input rows [h0, h1) it reads of each tensor."""
    out = []
    for f in firings:
        reads: dict[str, tuple[int, int]] = {}
        if f.layer is not None:
            layer = graph.layers[f.layer]
            region = _region(graph, layer.output, f.rows, batch)
            shapes = [(batch,) + graph.shape(t)[1:] for t in layer.inputs]
            for t, w in zip(layer.inputs, memo.input_windows(graph, layer, region, shapes)):
                lo, hi = reads.get(t, (w.region.h0, w.region.h1))
                reads[t] = (min(lo, w.region.h0), max(hi, w.region.h1))
        out.append(reads)
    return out


def _region(graph: Graph, tensor: str, rows: tuple[int, int], batch: int) -> Region:
    _, w = spatial(graph.shape(tensor))
    return Region(0, batch, rows[0], rows[1], 0, w)


def _low_water(graph: Graph, firings: Sequence[_Firing], needs: Sequence[dict],
               streamed: Collection[str] = ()) -> list[dict[str, int]]:
    """After each firing, per tensor, the lowest row any later firing still reads (graph outputs
    are kept whole: the caller reads them at the end; a streamed one leaves as it is computed)."""
    keep_all = set(graph.outputs) - set(streamed)
    lows: list[dict[str, int]] = [dict() for _ in firings]
    running: dict[str, int] = {t: 0 for t in keep_all}
    for i in range(len(firings) - 1, -1, -1):
        lows[i] = dict(running)
        for t, (h0, _) in needs[i].items():
            running[t] = min(running.get(t, h0), h0)
    return lows


@dataclass(frozen=True)
class PartsOptions:
    """How a parts plan is shaped besides its phases. `align`: phase counts (layer ids as keys)
    become rows per phase that end where the producers' phases make rows computable
    (`aligned_rows`) instead of equal parts. `held`: layers (ids or names) whose outputs are kept
    whole and complete before their readers start (analysis.csdf.firing_order). `overlay`: a
    whole tensor written while another is read top to bottom may take its dead rows
    (plan/overlay.py). `inplace`: a step's output may also take rows of its own input its kernel
    is done reading (plan/overlay.py within steps), and the overlays are kept only where they
    make the run memory smaller.
    `slack_rows`: window rows traded for fewer compactions. `stream_outputs`: the model's outputs
    are handed to the caller by rows as they are computed ('output' steps), so that the arena holds
    a window of each instead of the whole tensor (as a row-band input arrives by rows); a 4-D
    output the model file gives channels-last (a .tflite's) is kept whole."""

    align: bool = False
    held: Collection[int | str] = ()
    overlay: bool = True
    slack_rows: int = 0
    inplace: bool = False
    stream_outputs: bool = False


def plan_parts(model: PlannedModel, phases: Mapping[int | str, int | Sequence[int]], source_rows=None,
               planner: str = "improve", layout: str = "nhwc", dtype: str = "fp32",
               options: PartsOptions = PartsOptions()) -> Plan:
    """A plan running `model` by parts with the given phases per layer (see analysis.csdf.to_csdf),
    shaped by `options`, its buffers placed by `planner`."""
    from tightfit.plan.place import place

    draft = draft_parts(model, phases, source_rows, layout, dtype, options)
    return place(replace(draft, knobs=dict(draft.knobs, planner=planner)), [model.graph], planner)


def draft_parts(model: PlannedModel, phases: Mapping[int | str, int | Sequence[int]], source_rows=None,
                layout: str = "nhwc", dtype: str = "fp32", options: PartsOptions = PartsOptions()) -> Plan:
    """plan_parts's plan before its buffers are placed (lifetimes and step times need no offsets)."""
    g, batch = model.graph, model.batch
    held = sorted({g.layer(l).id for l in options.held})  # ids or names; an unknown one is an OptionError
    if options.align:
        phases, source_rows = aligned_rows(g, phases, source_rows or 1)
    csdf = to_csdf(g, phases, source_rows)
    firings = _firings(csdf, held)
    needs = _needs(g, batch, firings)
    # an output the file gives channels-last stays whole: its sinks (the C program's OUTPUT.bin)
    # take rows of the graph's NCHW form, and a band of NHWC rows is not a run of the file's bytes
    streamed = [t for t in g.outputs if options.stream_outputs and len(g.shape(t)) == 4 and not nhwc_output(g, t)]
    lows = _low_water(g, firings, needs, streamed)
    caps = _capacities(g, firings, needs, lows, options.slack_rows)
    windows: dict[str, _Window] = {}
    buffers: list[Buffer] = []
    over = _in_place(g, firings, caps)
    for t, cap in caps.items():
        shape = (batch,) + g.shape(t)[1:]
        h, _ = spatial(shape)
        if t in over:  # written over its input's whole buffer
            windows[t] = _Window(windows[over[t]].buffer, h, kind="whole")
            continue
        kind = "whole" if cap >= h else "window"
        cap = min(cap, h)
        block = shape[:2] + (cap,) + shape[3:] if len(shape) == 4 else shape
        windows[t] = _Window(len(buffers), cap, kind=kind)
        buffers.append(Buffer(len(buffers), kind, block, layout_for(shape, layout), (0,), g.tensors[t].item_bytes(dtype),
                              "shift" if kind == "window" else ""))
    steps: list[Step] = []
    for i, f in enumerate(firings):
        tensor = f.tensor(g)
        win = windows[tensor]
        low = min(lows[i - 1].get(tensor, win.produced) if i else 0, f.rows[0])
        steps.extend(_compact(g, tensor, win, low, f.rows, batch))
        out = Access(tensor, win.buffer, _region(g, tensor, f.rows, batch), (0, f.rows[0] - win.base, 0))
        if f.layer is None:
            steps.append(Step("input", 0, -1, out))
        else:
            steps.append(_compute(g, f.layer, out, windows, batch, dtype, layout))
            if tensor in streamed:
                steps.append(Step("output", 0, -1, out, (out,)))
        win.produced = f.rows[1]
    knobs = {"method": "parts", "layout": layout, "slack_rows": options.slack_rows,
             "phases": {str(a.layer_id): a.phases for a in csdf.actors if a.kind == "layer" and a.phases > 1},
             "rows_per_phase": {str(a.layer_id): list(a.rows_per_phase) for a in csdf.actors
                                if a.kind == "layer" and a.phases > 1},
             "source_rows": list(csdf.actors[0].rows_per_phase), "held": held}
    if streamed:
        knobs["stream_outputs"] = True
    plan = Plan((model.ref(),), dtype, tuple(buffers), (Partition(0, 0, tuple(range(len(g.layers))), tuple(steps)),), (), 0, knobs)
    if not (options.overlay or options.inplace):
        return plan
    overlaid = overlay_buffers(plan, [g], within_steps=options.inplace)
    if not options.inplace:
        return overlaid
    # A block is one request as long-lived as all its members: where that costs more than the
    # shared bytes save (mobilenet_v2 224 int8's smallest setting by parts: 187 kB with, 159 kB
    # without), the plan keeps its buffers apart. (Only with `inplace`: the searches' fronts, and
    # fit's golden ones, are those of the plain overlay pass.)
    return overlaid if run_memory(overlaid, [g]) <= run_memory(plan, [g]) else plan


def _in_place(g: Graph, firings, caps: Mapping[str, int]) -> dict[str, str]:
    """output -> the input whose buffer it takes: a layer whose op may write over its input, run in
    one firing, the sole reader of that input, both held whole (issue 38: attention's softmax over
    its scores, the reuse plan's in-place write, which a split plan then needs no second copy of)."""
    count: dict[int | None, int] = {}
    for f in firings:
        count[f.layer] = count.get(f.layer, 0) + 1
    over: dict[str, str] = {}
    for layer in g.layers:
        t = layer.inputs[0] if layer.inputs else None
        if (t is None or not get_op(layer.op).inplace_ok or count.get(layer.id) != 1 or layer.output in g.outputs
                or t in g.inputs or t in g.outputs or len(g.consumers(t)) != 1 or layer.inputs.count(t) != 1
                or g.shape(t) != g.shape(layer.output)):
            continue
        h = spatial(g.shape(t))[0]
        if caps.get(t, 0) >= h and caps.get(layer.output, 0) >= h:
            over[layer.output] = t
    return over


def _capacities(g: Graph, firings, needs, lows, slack: int) -> dict[str, int]:
    """Rows each tensor's window must hold: from the lowest row still needed to the end of the
    band being written, at every firing; plus the slack."""
    cap: dict[str, int] = {}
    produced: dict[str, int] = {}
    for i, f in enumerate(firings):
        tensor = f.tensor(g)
        low = lows[i - 1].get(tensor, produced.get(tensor, 0)) if i else 0
        low = min(low, f.rows[0])
        cap[tensor] = max(cap.get(tensor, 0), f.rows[1] - low)
        produced[tensor] = f.rows[1]
    return {t: c + slack for t, c in cap.items()}


def _compact(g: Graph, tensor: str, win: _Window, low: int, rows: tuple[int, int], batch: int) -> list[Step]:
    """If rows[1] does not fit after `win.base`, move the kept rows [low, rows[0]) to the top."""
    if rows[1] - win.base <= win.capacity:
        return []
    kept = (low, rows[0])
    win_old = win.base
    win.base = low
    if kept[1] <= kept[0]:
        return []
    region = _region(g, tensor, kept, batch)
    src = Access(tensor, win.buffer, region, (0, kept[0] - win_old, 0))
    # Overlapping rows are shifted in chunks by the executor: no temporary.
    return [Step("copy", 0, -1, Access(tensor, win.buffer, region, (0, 0, 0)), (src,), 0)]


def _compute(g: Graph, lid: int, out: Access, windows: dict[str, _Window], batch: int, dtype: str, layout: str) -> Step:
    layer = g.layers[lid]
    shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
    out_shape = (batch,) + g.shape(layer.output)[1:]
    wins = memo.input_windows(g, layer, out.region, shapes)
    ins = tuple(Access(t, windows[t].buffer, w.region, (w.region.n0, w.region.h0 - windows[t].base, w.region.w0))
                for t, w in zip(layer.inputs, wins))
    scratch = memo.workspace_bytes(g, layer, out.region, shapes, out_shape, itemsize(dtype), dense_nhwc(out_shape, layout), layout == "nhwc")
    return Step("compute", 0, lid, out, ins, scratch)


def phases_for_rows(graph: Graph, rows: int) -> tuple[dict[int, int], int]:
    """Every layer that can be split computes `rows` output rows per phase; the input arrives
    `rows` rows at a time. Returns (phases per layer, source phases)."""
    from tightfit.analysis.csdf import needs_whole_input
    from tightfit.errors import OptionError

    if rows < 1:
        raise OptionError("--rows must be at least 1")
    phases = {}
    for layer in graph.layers:
        h, _ = spatial(graph.shape(layer.output))
        if h > rows and not needs_whole_input(graph, layer):
            phases[layer.id] = -(-h // rows)
    h_in = min(spatial(graph.shape(t))[0] for t in graph.inputs)  # source phases every input has rows for
    return phases, -(-h_in // rows)


def aligned_rows(graph: Graph, phases: Mapping[int, int], source_phases: int) -> tuple[dict[int, tuple[int, ...]], tuple[int, ...]]:
    """Rows per phase for phase counts, so that each layer's phase j computes every output row
    that its producers' phases up to j make computable (the input arrives in equal bands). With
    equal parts instead, a 3x3 consumer is one row short after each producer phase, so the
    producer must run a phase ahead and its window holds two bands; aligned, it holds one band
    plus the halo. A layer whose producers have other phase counts gets equal parts."""
    from tightfit.analysis.csdf import split_rows

    inp = graph.inputs[0]  # the rows per phase answered are its own (every input of one height takes them)
    ends: dict[str, list[int]] = {t: list(accumulate(split_rows(spatial(graph.shape(t))[0], source_phases))) for t in graph.inputs}
    rows: dict[int, tuple[int, ...]] = {}
    for layer in graph.layers:  # producers come before their consumers
        p = phases.get(layer.id, 1)
        h = spatial(graph.shape(layer.output))[0]
        if p > 1:
            rows[layer.id] = _ready_rows(graph, layer, p, ends) or split_rows(h, p)
        ends[layer.output] = list(accumulate(rows.get(layer.id, (h,))))
    return rows, tuple(b - a for a, b in zip([0] + ends[inp][:-1], ends[inp]))


def _ready_rows(graph: Graph, layer, p: int, ends: Mapping[str, list[int]]) -> tuple[int, ...] | None:
    """Rows per phase when phase j computes all rows whose inputs the producers' phase j has
    delivered; None if a producer has another phase count or a phase would be empty."""
    if any(len(ends[t]) != p for t in layer.inputs):
        return None
    h, w = spatial(graph.shape(layer.output))
    in_shapes = [graph.shape(t) for t in layer.inputs]

    def ready(o: int, j: int) -> bool:  # can rows [0, o) be computed after producer phase j?
        wins = memo.input_windows(graph, layer, Region(0, 1, 0, o, 0, w), in_shapes)
        return all(win.region.h1 <= ends[t][j] for t, win in zip(layer.inputs, wins))

    out_ends, o = [], 0
    for j in range(p - 1):
        while o < h and ready(o + 1, j):
            o += 1
        out_ends.append(o)
    out_ends.append(h)
    if any(b <= a for a, b in zip([0] + out_ends[:-1], out_ends)):
        return None
    return tuple(b - a for a, b in zip([0] + out_ends[:-1], out_ends))
