"""Fused tiling (Farley & Gerstlauer's MAFAT, DeepThings' fused tile partitioning, generalised):
a group of consecutive layers runs tile by tile over an N x M grid of its output, so the
group's intermediates hold one tile instead of the whole tensor. Pure functions: graph and
groups in, Plan out; plus the memory/time predictor and the configuration search.

A group is a run of layers [first, last] with one input tensor and one output tensor (branches
inside, residual adds and concats, are allowed). For each output tile the receptive fields are
walked backwards through the group with each op's `input_windows`: every intermediate tensor's
region is the bounding box of what its consumers in the group read. Because an op's input rows
depend only on its output rows and its input columns only on its output columns, that region's
rows depend only on the tile's grid row and its columns only on the grid column.

Buffers: the group's input and output tensors are whole (as layer by layer); every intermediate
region of a tile has its own dense "tile" buffer of exactly its shape, live only within the tile,
so the offset planner reuses the same bytes from tile to tile. Dense buffers matter: oneDNN
convolves straight into a dense channels-last view and allocates nothing, while a window of a
whole-width buffer is strided and falls back to a result temporary and a weight reorder. So a
tile narrower than the tensor copies its window of the group input into a tile buffer first
(as DeepThings does) and computes its output tile into a tile buffer that a copy step then
writes into the whole output (a model output is written in place: the caller reads it whole
from one buffer, so its steps pay the strided kernel's temporaries, counted as scratch).

Overlap: with "recompute" every tile computes its whole regions (MAFAT). With "reuse" tiles run
column by column (top to bottom), and the rows of each intermediate region that the tile below
also needs are copied into a small strip buffer; the tile below copies them back into the top of
its own tile buffer and computes only the rows below them. The computed rows are a full-width
band of the tile buffer, so kernels still write dense views. Column overlap is recomputed (a
reused column strip would make the computed part a strided view).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from tightfit.analysis.csdf import split_rows
from tightfit.errors import OptionError
from tightfit.graph.ir import Graph, itemsize, spatial
from tightfit.ops import get_op
from tightfit.ops.base import Region
from tightfit.plan.reuse import PlannedModel, assign_buffers, layout_for, whole_steps
from tightfit.plan.schema import Access, Buffer, Partition, Plan, Step

OVERLAPS = ("recompute", "reuse")


class TilingError(OptionError):
    """A tiling that cannot be planned: unknown layer, a group that is not a single-input,
    single-output run of tileable layers, a bad grid."""


@dataclass(frozen=True)
class TileGroup:
    """Layers first..last (ids, inclusive) run tile by tile over a grid = (rows, columns) of the
    group's output; overlap between tiles "recompute"d or "reuse"d (kept in strip buffers)."""

    first: int
    last: int
    grid: tuple[int, int] = (1, 1)
    overlap: str = "recompute"

    @property
    def layers(self) -> range:
        return range(self.first, self.last + 1)

    @property
    def tiles(self) -> int:
        return self.grid[0] * self.grid[1]

    def spec(self) -> str:
        return f"{self.first}-{self.last}:{self.grid[0]}x{self.grid[1]}" + (":reuse" if self.overlap == "reuse" else "")


def format_tiling(groups: Iterable[TileGroup]) -> str:
    return ",".join(g.spec() for g in groups)


# --- where groups may go ----------------------------------------------------------------------

def _last_use(graph: Graph) -> dict[str, int]:
    """tensor -> position of its last consumer (graph outputs: one past the last layer)."""
    last = {}
    for layer in graph.layers:
        for t in layer.inputs:
            last[t] = layer.id
    for t in graph.outputs:
        last[t] = len(graph.layers)
    return last


def cut_points(graph: Graph) -> tuple[int, ...]:
    """Positions p (0..L, before layer p) where exactly one tensor is live: the tensor entering
    layer p (the model input at 0, the model output at L). A group [first, last] is valid
    exactly when first and last + 1 are cut points and every layer in it can be tiled; cut
    points are where MAFAT's `cut` may go, generalised to any graph."""
    last = _last_use(graph)
    live = {t for t in graph.inputs if last.get(t, -1) >= 0}
    cuts = [0] if len(live) == 1 else []
    for layer in graph.layers:
        live.add(layer.output)
        live = {t for t in live if last.get(t, -1) > layer.id}
        if len(live) == 1 and layer.output in live:
            cuts.append(layer.id + 1)
    return tuple(cuts)


def tileable(graph: Graph, lid: int) -> bool:
    layer = graph.layers[lid]
    return get_op(layer.op).splittable and len(graph.shape(layer.output)) == 4 and all(
        len(graph.shape(t)) == 4 for t in layer.inputs)


def groupable_runs(graph: Graph) -> tuple[tuple[int, int], ...]:
    """Maximal runs (first, last) of tileable layers between cut points: every valid group is a
    sub-run of one of these whose ends are cut points."""
    cuts = cut_points(graph)
    runs = []
    start = None
    for a, b in zip(cuts, cuts[1:]):
        ok = all(tileable(graph, l) for l in range(a, b))
        if ok and start is None:
            start = a
        if not ok and start is not None:
            runs.append((start, a - 1))
            start = None
    if start is not None:
        runs.append((start, cuts[-1] - 1))
    return tuple(runs)


def downsampling_cuts(graph: Graph) -> tuple[int, ...]:
    """Cut points right after a layer whose output is smaller (H x W) than its input: MAFAT cuts
    after max-pools, where merging the tiles into one tensor costs least."""
    out = []
    for p in cut_points(graph):
        if 0 < p < len(graph.layers):
            layer = graph.layers[p - 1]
            if len(graph.shape(layer.output)) == 4 and len(graph.shape(layer.inputs[0])) == 4 and \
                    spatial(graph.shape(layer.output)) < spatial(graph.shape(layer.inputs[0])):
                out.append(p)
    return tuple(out)


def group_problem(graph: Graph, group: TileGroup) -> str | None:
    """Why `group` cannot be tiled, or None."""
    n = len(graph.layers)
    if not (0 <= group.first <= group.last < n):
        return f"layers {group.first}-{group.last} are not layer ids of this model (0-{n - 1})"
    if group.overlap not in OVERLAPS:
        return f"overlap {group.overlap!r} is not one of {', '.join(OVERLAPS)}"
    rows, cols = group.grid
    h, w = spatial(graph.shape(graph.layers[group.last].output))
    if rows < 1 or cols < 1 or rows > h or cols > w:
        return f"grid {rows}x{cols} does not fit the {h}x{w} output of layer {group.last}"
    for lid in group.layers:
        if not tileable(graph, lid):
            layer = graph.layers[lid]
            return f"layer {lid} ({layer.name}, {layer.op}) needs whole samples and cannot be tiled"
    inside = {graph.layers[l].output for l in group.layers}
    inputs = {t for l in group.layers for t in graph.layers[l].inputs if t not in inside}
    if len(inputs) != 1:
        return f"layers {group.first}-{group.last} read {len(inputs)} tensors from outside; a group reads one"
    last = _last_use(graph)
    for lid in group.layers[:-1]:
        if last[graph.layers[lid].output] > group.last:
            return (f"layer {lid}'s output is used after layer {group.last}; a group's only "
                    f"output is its last layer's")
    return None


def check_groups(graph: Graph, groups: Sequence[TileGroup]) -> None:
    for grp in groups:
        problem = group_problem(graph, grp)
        if problem:
            raise TilingError(f"tiling {grp.spec()}: {problem}")
    ordered = sorted(groups, key=lambda x: x.first)
    for a, b in zip(ordered, ordered[1:]):
        if b.first <= a.last:
            raise TilingError(f"tiling groups {a.spec()} and {b.spec()} overlap")


_GROUP = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*(\w+))?\s*$")


def parse_tiling(text: str, graph: Graph) -> tuple[TileGroup, ...]:
    """'0-7:5x5,8-15:2x2:reuse' -> groups (layer ids, inclusive; grid rows x columns; optional
    overlap policy, default recompute), checked against the graph."""
    groups = []
    for item in text.split(","):
        m = _GROUP.match(item)
        if m is None:
            raise TilingError(f"cannot read tiling group {item.strip()!r}: write FIRST-LAST:NxM[:reuse|:recompute], "
                              f"e.g. 0-7:5x5,8-15:2x2")
        a, b, n, k = (int(x) for x in m.groups()[:4])
        groups.append(TileGroup(a, b, (n, k), m.group(5) or "recompute"))
    check_groups(graph, groups)
    return tuple(groups)


# --- the planner --------------------------------------------------------------------------------

def _union(a: Region | None, b: Region) -> Region:
    if a is None:
        return b
    return Region(min(a.n0, b.n0), max(a.n1, b.n1), min(a.h0, b.h0), max(a.h1, b.h1), min(a.w0, b.w0), max(a.w1, b.w1))


def _spans(size: int, parts: int) -> list[tuple[int, int]]:
    out, start = [], 0
    for k in split_rows(size, parts):
        out.append((start, start + k))
        start += k
    return out


def tile_regions(graph: Graph, group: TileGroup, out: Region, batch: int) -> dict[str, Region]:
    """Every tensor's region one output tile needs (the group input's included): receptive
    fields walked backwards, the bounding box over a tensor's consumers in the group."""
    out_h, out_w = spatial(graph.shape(graph.layers[group.last].output))
    need: dict[str, Region] = {graph.layers[group.last].output: out}
    for lid in reversed(group.layers):
        layer = graph.layers[lid]
        # Tiles at the border take the rows and columns there that no consumer reads (a
        # stride that skips the last row): every tensor is then computed in full.
        h, w = spatial(graph.shape(layer.output))
        r = need[layer.output]
        region = need[layer.output] = Region(r.n0, r.n1, 0 if out.h0 == 0 else r.h0, h if out.h1 == out_h else r.h1,
                                             0 if out.w0 == 0 else r.w0, w if out.w1 == out_w else r.w1)
        shapes = [(batch,) + graph.shape(t)[1:] for t in layer.inputs]
        for t, win in zip(layer.inputs, get_op(layer.op).input_windows(layer, region, shapes)):
            need[t] = _union(need.get(t), win.region)
    return need


def _dense(buffer_shape: tuple[int, ...], region: Region, layout: str) -> bool:
    """Whether a region's view of a buffer is one dense channels-last block."""
    n, c, h, w = buffer_shape
    if layout != "nhwc" or c <= 1:
        return False
    return (region.w == w or region.h == 1) and (region.n == 1 or (region.h == h and region.w == w))


@dataclass
class _Builder:
    """Planning state: buffers made so far and the steps emitted."""

    graph: Graph
    batch: int
    dtype: str
    layout: str
    buffers: list[Buffer]
    steps: list[Step]

    def buffer(self, tensor: str, region: Region) -> int:
        shape = (region.n, self.graph.shape(tensor)[1], region.h, region.w)
        self.buffers.append(Buffer(len(self.buffers), "tile", shape, layout_for(shape, self.layout), (0,), itemsize(self.dtype)))
        return len(self.buffers) - 1

    def copy(self, tensor: str, region: Region, src: tuple[int, Region], dst: tuple[int, Region]) -> None:
        """Copy `region` of `tensor` between buffers; each given as (buffer, region it holds)."""
        self.steps.append(Step("copy", 0, -1, _access(tensor, dst, region), (_access(tensor, src, region),)))

    def compute(self, lid: int, region: Region, out: tuple[int, Region], home: dict[str, tuple[int, Region]]) -> None:
        g, batch = self.graph, self.batch
        layer = g.layers[lid]
        op = get_op(layer.op)
        shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
        out_shape = (batch,) + g.shape(layer.output)[1:]
        wins = op.input_windows(layer, region, shapes)
        ins = tuple(_access(t, home[t], w.region) for t, w in zip(layer.inputs, wins))
        views = [(self.buffers[a.buffer].shape, a.region) for a in ins] + [(self.buffers[out[0]].shape, region)]
        dense = all(_dense(s, r, self.layout) for s, r in views)
        scratch = op.workspace_bytes(layer, region, shapes, out_shape, itemsize(self.dtype), "torch", dense)
        self.steps.append(Step("compute", 0, lid, _access(layer.output, out, region), ins, scratch))


def _access(tensor: str, where: tuple[int, Region], region: Region) -> Access:
    buffer, held = where
    return Access(tensor, buffer, region, (region.n0 - held.n0, region.h0 - held.h0, region.w0 - held.w0))


def _group_steps(b: _Builder, group: TileGroup, whole: dict[str, int]) -> None:
    """A group's steps, tile by tile; `whole` maps the group input and output to whole buffers."""
    g, batch = b.graph, b.batch
    out_t = g.layers[group.last].output
    H, W = spatial(g.shape(out_t))
    inside = [g.layers[l].output for l in group.layers]
    (in_t,) = {t for l in group.layers for t in g.layers[l].inputs if t not in inside}
    whole_region = {t: Region.whole((batch,) + g.shape(t)[1:]) for t in (in_t, out_t)}
    rows, cols = _spans(H, group.grid[0]), _spans(W, group.grid[1])
    reuse = group.overlap == "reuse"
    for c0, c1 in cols:
        needs = [tile_regions(g, group, Region(0, batch, r0, r1, c0, c1), batch) for r0, r1 in rows]
        strips: dict[str, tuple[int, Region]] = {}
        for i, need in enumerate(needs):
            home = {in_t: (whole[in_t], whole_region[in_t])}
            if need[in_t].w < whole_region[in_t].w:
                home[in_t] = (b.buffer(in_t, need[in_t]), need[in_t])
                b.copy(in_t, need[in_t], (whole[in_t], whole_region[in_t]), home[in_t])
            for lid in group.layers:
                t = g.layers[lid].output
                region = need[t]
                # A model output is written where the caller reads it (one buffer, one index map).
                if t == out_t and (region.w == W or t in g.outputs):
                    b.compute(lid, region, (whole[out_t], whole_region[out_t]), home)
                    continue
                home[t] = (b.buffer(t, region), region)
                todo = region
                if reuse and t in strips:  # rows the tile above computed
                    kept = strips.pop(t)
                    b.copy(t, kept[1], kept, home[t])
                    todo = Region(region.n0, region.n1, kept[1].h1, region.h1, region.w0, region.w1)
                if not todo.is_empty():
                    b.compute(lid, todo, home[t], home)
                if reuse and t != out_t and i + 1 < len(needs) and needs[i + 1][t].h0 < region.h1:
                    below = needs[i + 1][t]
                    keep = Region(region.n0, region.n1, below.h0, min(region.h1, below.h1), region.w0, region.w1)
                    strips[t] = (b.buffer(t, keep), keep)
                    b.copy(t, keep, home[t], strips[t])
                if t == out_t:
                    b.copy(t, region, home[t], (whole[out_t], whole_region[out_t]))


def plan_tiling(model: PlannedModel, groups: Sequence[TileGroup], planner: str = "improve", layout: str = "nhwc",
                dtype: str = "fp32") -> Plan:
    """A plan running each group tile by tile and every other layer layer by layer (whole
    tensors with buffer reuse, as plan_reuse). Groups with a 1x1 grid run layer by layer, so a
    tiling of 1x1 groups is exactly the layer-by-layer plan."""
    from tightfit.plan.place import place

    g, batch = model.graph, model.batch
    check_groups(g, groups)
    tiled = sorted((grp for grp in groups if grp.tiles > 1), key=lambda x: x.first)
    in_group = {l for grp in tiled for l in grp.layers}
    order = tuple(range(len(g.layers)))
    home = assign_buffers(g, order, True, exclude=frozenset(in_group))
    internal = {g.layers[l].output for grp in tiled for l in grp.layers[:-1]}
    buffers: list[Buffer] = []
    buffer_of: dict[str, int] = {}
    for t in [g.inputs[0]] + [l.output for l in g.layers]:
        if home[t] == t and t not in internal:
            shape = (batch,) + g.shape(t)[1:]
            buffer_of[t] = len(buffers)
            buffers.append(Buffer(len(buffers), "whole", shape, layout_for(shape, layout), (0,), itemsize(dtype)))
    for t, h in home.items():
        if h in buffer_of:
            buffer_of[t] = buffer_of[h]
    plain = whole_steps(model, 0, [l for l in order if l not in in_group], buffer_of, dtype, layout)
    by_layer = {s.layer: s for s in plain[1:]}
    b = _Builder(g, batch, dtype, layout, buffers, [plain[0]])
    starts = {grp.first: grp for grp in tiled}
    for lid in order:
        if lid in starts:
            _group_steps(b, starts[lid], buffer_of)
        elif lid not in in_group:
            b.steps.append(by_layer[lid])
    knobs = {"method": "tiling", "planner": planner, "layout": layout, "tiling": format_tiling(sorted(groups, key=lambda x: x.first)),
             "groups": [{"first": x.first, "last": x.last, "grid": list(x.grid), "overlap": x.overlap} for x in groups]}
    draft = Plan((model.ref(),), dtype, tuple(b.buffers), (Partition(0, 0, order, tuple(b.steps)),), (), 0, knobs)
    return place(draft, [g], planner)


def executed_macs(plan: Plan, graphs: Sequence[Graph]) -> int:
    """Multiply-accumulates the plan's compute steps execute (recomputed overlap included)."""
    total = 0
    for s in plan.steps():
        if s.kind == "compute":
            g = graphs[s.model]
            layer = g.layers[s.layer]
            batch = plan.models[s.model].batch
            shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
            total += get_op(layer.op).macs(layer, s.out.region, shapes, (batch,) + g.shape(layer.output)[1:])
    return total
