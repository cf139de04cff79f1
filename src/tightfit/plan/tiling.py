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
column by column (top to bottom), and every layer computes only the rows below those the tiles
above computed, so each row is computed once per column and a layer needs its input only for
its new rows plus their halo (a tile of a deep group then holds a band, not the whole cone of
its receptive field). The rows a tile below needs again are copied into a small strip buffer;
that tile copies them back into the top of its own tile buffer. The computed rows are a
full-width band of the tile buffer, so kernels still write dense views. Column overlap is
recomputed (a reused column strip would make the computed part a strided view).

Below its space of tilings (a budget no coarse grid fits), the search also considers the whole
network by parts (plan/parts.py, found by the parts search): the limit the fine tilings approach,
row bands of the full width, but each layer with its own band height and a stream cut where a
tensor is held whole, which tiles of one grid per group cannot express. Such a configuration
has no groups; its `parts` says how it runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from tightfit.analysis.csdf import split_rows
from tightfit.errors import OptionError
from tightfit.graph.ir import Graph, itemsize, spatial
from tightfit.ops import get_op
from tightfit.ops.base import Region
from tightfit.plan import windows as memo
from tightfit.plan.deadline import Deadline, TimeUp, check, expired
from tightfit.plan.reuse import PlannedModel, assign_buffers, layout_for, whole_steps
from tightfit.plan.schema import Access, Buffer, Partition, Plan, Step

if TYPE_CHECKING:
    from tightfit.plan.parts_search import PartsPoint

OVERLAPS = ("recompute", "reuse")


class TilingError(OptionError):
    """A tiling that cannot be planned: unknown layer, a group that is not a single-input,
    single-output run of tileable layers, a bad grid."""


@dataclass(frozen=True)
class TileGroup:
    """Layers first..last (ids, inclusive) run tile by tile over a grid = (rows, columns) of the
    group's output; overlap between tiles "recompute"d or "reuse"d (kept in strip buffers).
    `edge` > 0: the first and last grid columns are `edge` output columns wide and the others
    share the rest evenly (0: all columns equally wide). A tile at the left or right border
    pads on that side only, and a kernel then copies its whole input window with the padding
    (step scratch); narrow border columns keep these copies small (see `clear_edge`).
    `overlay`: the group's whole output lies over its whole input's rows as the tiles finish
    reading them (needs both whole in the arena and the group before it not
    overlaid)."""

    first: int
    last: int
    grid: tuple[int, int] = (1, 1)
    overlap: str = "recompute"
    edge: int = 0
    overlay: bool = False  # the group's whole output takes its whole input's dead rows (plan/overlay.py)

    @property
    def layers(self) -> range:
        return range(self.first, self.last + 1)

    @property
    def tiles(self) -> int:
        return self.grid[0] * self.grid[1]

    def spec(self) -> str:
        return (f"{self.first}-{self.last}:{self.grid[0]}x{self.grid[1]}" + (":reuse" if self.overlap == "reuse" else "")
                + (f":edge{self.edge}" if self.edge else "") + (":overlay" if self.overlay else ""))


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
    """Cut points whose tensor is smaller (H x W) than the tensor at the cut point before: MAFAT
    cuts after max-pools, where merging the tiles into one tensor costs least; in a residual
    network the stride sits inside a block, so the cut after that block counts."""
    out, before = [], None
    for p in cut_points(graph):
        t = graph.inputs[0] if p == 0 else graph.layers[p - 1].output
        size = spatial(graph.shape(t)) if len(graph.shape(t)) == 4 else (0, 0)
        if before is not None and 0 < p < len(graph.layers) and size < before:
            out.append(p)
        before = size
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
    if group.edge and (group.edge < 0 or cols < 3 or w - 2 * group.edge < cols - 2):
        return f"border columns {group.edge} wide need a grid of at least 3 columns that fits the {w} columns of layer {group.last}"
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


_GROUP = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*:\s*(\d+)\s*[xX]\s*(\d+)\s*(?::\s*(?!edge|overlay)(\w+))?\s*(?::\s*edge(\d+))?"
                    r"\s*(?::\s*(overlay))?\s*$")


def parse_tiling(text: str, graph: Graph) -> tuple[TileGroup, ...]:
    """'0-7:5x5,8-15:2x2:reuse,16-20:9x4:reuse:edge2' -> groups (layer ids, inclusive; grid rows x
    columns; optional overlap policy, default recompute; optional border column width), checked
    against the graph."""
    groups = []
    for item in text.split(","):
        m = _GROUP.match(item)
        if m is None:
            raise TilingError(f"cannot read tiling group {item.strip()!r}: write FIRST-LAST:NxM[:reuse|:recompute][:edgeK], "
                              f"e.g. 0-7:5x5,8-15:2x2")
        a, b, n, k = (int(x) for x in m.groups()[:4])
        groups.append(TileGroup(a, b, (n, k), m.group(5) or "recompute", int(m.group(6) or 0), m.group(7) is not None))
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


def tile_regions(graph: Graph, group: TileGroup, out: Region, batch: int,
                 done: dict[str, tuple[int, int, int]] | None = None) -> dict[str, Region]:
    """Every tensor's region one output tile needs (the group input's included): receptive
    fields walked backwards, the bounding box over a tensor's consumers in the group.

    With `done` (reused overlap; tensor -> end of the rows the tiles above in this column have
    computed, and their columns; updated here): a layer computes only the rows below those, so
    its inputs are needed only for these rows plus their halo; the rows above come from the tile
    above. A tensor no layer of this tile needs (its consumers have nothing left to compute) has
    no region, except in the bottom tile, which computes every row left."""
    out_h, out_w = spatial(graph.shape(graph.layers[group.last].output))
    need: dict[str, Region] = {graph.layers[group.last].output: out}
    for lid in reversed(group.layers):
        layer = graph.layers[lid]
        h, w = spatial(graph.shape(layer.output))
        if layer.output not in need:
            # The bottom tile still computes rows no consumer reads (a stride that skips the last row).
            if done is None or out.h1 != out_h or done.get(layer.output, (h,))[0] >= h:
                continue
            end, w0, w1 = done[layer.output]
            need[layer.output] = Region(out.n0, out.n1, end, h, w0, w1)
        # Tiles at the border take the rows and columns there that no consumer reads (a
        # stride that skips the last row): every tensor is then computed in full.
        r = need[layer.output]
        region = Region(r.n0, r.n1, 0 if out.h0 == 0 else r.h0, h if out.h1 == out_h else r.h1,
                        0 if out.w0 == 0 else r.w0, w if out.w1 == out_w else r.w1)
        computed = region
        if done is not None:
            end, w0, w1 = done.get(layer.output, (0, region.w0, region.w1))
            # Columns stay those of the column's first tile (a branch with nothing left to
            # compute would narrow them), so kept rows and new rows share one width.
            region = replace(region, w0=min(w0, region.w0), w1=max(w1, region.w1))
            if region.h0 < end:  # overlaps rows computed above: hold them all (later tiles may need them)
                region = replace(region, h1=max(region.h1, end))
                computed = replace(region, h0=end)
            done[layer.output] = (region.h1, region.w0, region.w1)
        need[layer.output] = region
        if computed.is_empty():
            continue
        shapes = [(batch,) + graph.shape(t)[1:] for t in layer.inputs]
        for t, win in zip(layer.inputs, memo.input_windows(graph, layer, computed, shapes)):
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
        shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
        out_shape = (batch,) + g.shape(layer.output)[1:]
        wins = memo.input_windows(g, layer, region, shapes)
        ins = tuple(_access(t, home[t], w.region) for t, w in zip(layer.inputs, wins))
        views = [(self.buffers[a.buffer].shape, a.region) for a in ins] + [(self.buffers[out[0]].shape, region)]
        dense = all(_dense(s, r, self.layout) for s, r in views)
        scratch = memo.workspace_bytes(g, layer, region, shapes, out_shape, itemsize(self.dtype), dense, self.layout == "nhwc")
        self.steps.append(Step("compute", 0, lid, _access(layer.output, out, region), ins, scratch))


def _access(tensor: str, where: tuple[int, Region], region: Region) -> Access:
    buffer, held = where
    return Access(tensor, buffer, region, (region.n0 - held.n0, region.h0 - held.h0, region.w0 - held.w0))


def _group_steps(b: _Builder, group: TileGroup, whole: dict[str, int]) -> None:
    """A group's steps, tile by tile, column by column; `whole` maps the group input and output
    to their whole buffers (a streamed model input has none)."""
    g, batch = b.graph, b.batch
    out_t = g.layers[group.last].output
    inside = [g.layers[l].output for l in group.layers]
    (in_t,) = {t for l in group.layers for t in g.layers[l].inputs if t not in inside}
    whole_at = {t: (whole[t], Region.whole((batch,) + g.shape(t)[1:])) for t in (in_t, out_t) if t in whole}
    rows, cols = _tile_spans(g, group)
    reuse = group.overlap == "reuse"
    for c0, c1 in cols:
        done: dict[str, tuple[int, int, int]] | None = {} if reuse else None  # rows computed so far in this column
        needs = [tile_regions(g, group, Region(0, batch, r0, r1, c0, c1), batch, done) for r0, r1 in rows]
        strips: dict[str, tuple[int, Region]] = {}  # rows kept for a tile below (reuse)
        for i, need in enumerate(needs):
            home = {in_t: _tile_input(b, in_t, need[in_t], whole_at.get(in_t))} if in_t in need else {}
            for lid in group.layers:
                t = g.layers[lid].output
                if t not in need:  # nothing of it needed by this tile: its strip waits for a tile below
                    continue
                below = next((n[t] for n in needs[i + 1:] if t in n), None) if reuse and t != out_t else None
                home[t] = _tile_layer(b, lid, need[t], home, whole_at[out_t] if t == out_t else None, strips, below)


def _tile_input(b: _Builder, tensor: str, region: Region, whole: tuple[int, Region] | None) -> tuple[int, Region]:
    """Where a tile reads its group input: a dense tile buffer loaded from the source (a streamed
    model input) or copied from the whole buffer, or the whole buffer when the tile spans its width."""
    if whole is not None and region.w == whole[1].w:
        return whole
    home = (b.buffer(tensor, region), region)
    if whole is not None:
        b.copy(tensor, region, whole, home)
    else:
        # A source delivers whole-width row bands (RowSource, as a camera): the band, made of
        # its rows and their concatenation, is the step's scratch. The one input step of a tile
        # asks for a few rows at a time, each band at most half the tile buffer it fills, so
        # that input steps seldom set the plan's largest scratch (a whole tile's band can be a
        # few times its buffer); the executor derives that row count from the step's scratch.
        row_band = 2 * region.n * b.graph.shape(tensor)[1] * spatial(b.graph.shape(tensor))[1] * itemsize(b.dtype)
        rows = min(region.h, max(1, b.buffers[home[0]].nbytes // (2 * row_band)))
        b.steps.append(Step("input", 0, -1, _access(tensor, home, region), (), row_band * rows))
    return home


def _tile_layer(b: _Builder, lid: int, region: Region, home: dict[str, tuple[int, Region]],
                whole_out: tuple[int, Region] | None, strips: dict[str, tuple[int, Region]],
                below: Region | None) -> tuple[int, Region]:
    """One layer's steps in one tile: its region into a tile buffer (the group output: into the
    whole buffer, directly or by a copy); with reuse, the rows kept by the tile above copied in
    first and only the rows below them computed, and the rows the tile below needs kept."""
    t = b.graph.layers[lid].output
    # A model output is written where the caller reads it (one buffer, one index map).
    if whole_out is not None and (region.w == whole_out[1].w or t in b.graph.outputs):
        b.compute(lid, region, whole_out, home)
        return whole_out
    at = (b.buffer(t, region), region)
    todo = region
    if t in strips:
        kept = strips.pop(t)
        b.copy(t, kept[1], kept, at)
        todo = Region(region.n0, region.n1, kept[1].h1, region.h1, region.w0, region.w1)
    if not todo.is_empty():
        b.compute(lid, todo, at, home)
    if below is not None and below.h0 < region.h1:
        keep = Region(region.n0, region.n1, below.h0, min(region.h1, below.h1), region.w0, region.w1)
        strips[t] = (b.buffer(t, keep), keep)
        b.copy(t, keep, at, strips[t])
    if whole_out is not None:
        b.copy(t, region, at, whole_out)
    return at


def _tile_spans(g: Graph, group: TileGroup) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The grid's row and column spans of the group's output."""
    h, w = spatial(g.shape(g.layers[group.last].output))
    e, cols = group.edge, group.grid[1]
    if not e:
        return _spans(h, group.grid[0]), _spans(w, cols)
    inner = [(a + e, b + e) for a, b in _spans(w - 2 * e, cols - 2)]
    return _spans(h, group.grid[0]), [(0, e)] + inner + [(w - e, w)]


def clear_edge(g: Graph, group: TileGroup, batch: int = 1) -> int:
    """The narrowest border column (output columns) whose neighbour's receptive field stays clear
    of that border at every tensor of the group: then only border tiles pad a side."""
    h, w = spatial(g.shape(g.layers[group.last].output))
    for e in range(1, w // 2):
        left = tile_regions(g, group, Region(0, batch, 0, 1, e, e + 1), batch)
        right = tile_regions(g, group, Region(0, batch, 0, 1, w - e - 1, w - e), batch)
        if all(r.w0 > 0 for r in left.values()) and all(
                r.w1 < spatial(g.shape(t))[1] for t, r in right.items()):
            return e
    return 0


def _tiles_cover_input(g: Graph, group: TileGroup, batch: int) -> bool:
    """Whether the group's tiles read every row and column of its input (a stride larger than
    its kernel skips some): then the input can arrive tile by tile and is never whole."""
    in_t = g.layers[group.first].inputs[0]
    rows, cols = _tile_spans(g, group)
    for spans, axis in ((rows, 0), (cols, 1)):
        reach = 0
        for a, b in spans:
            out = Region(0, batch, a, b, 0, 1) if axis == 0 else Region(0, batch, 0, 1, a, b)
            r = tile_regions(g, group, out, batch)[in_t]
            lo, hi = (r.h0, r.h1) if axis == 0 else (r.w0, r.w1)
            if lo > reach:
                return False
            reach = max(reach, hi)
        if reach < spatial(g.shape(in_t))[axis]:
            return False
    return True


def plan_tiling(model: PlannedModel, groups: Sequence[TileGroup], planner: str = "improve", layout: str = "nhwc",
                dtype: str = "fp32") -> Plan:
    """A plan running each group tile by tile and every other layer layer by layer (whole
    tensors with buffer reuse, as plan_reuse). Groups with a 1x1 grid run layer by layer, so a
    tiling of 1x1 groups is exactly the layer-by-layer plan."""
    from tightfit.plan.place import place

    draft = draft_tiling(model, groups, layout, dtype)
    return place(replace(draft, knobs=dict(draft.knobs, planner=planner)), [model.graph], planner)


def plan_point(model: PlannedModel, point: TilingPoint, planner: str = "improve", layout: str = "nhwc",
               dtype: str = "fp32") -> Plan:
    """The placed plan of a configuration the search assembled (tiled groups, or parts)."""
    if point.parts is not None:
        from tightfit.plan import parts_search

        return parts_search.plan_point(model, point.parts, planner, layout, dtype)
    return plan_tiling(model, point.groups, planner, layout, dtype)


def draft_tiling(model: PlannedModel, groups: Sequence[TileGroup], layout: str = "nhwc", dtype: str = "fp32") -> Plan:
    """plan_tiling's plan before its buffers are placed (lifetimes and step times need no offsets)."""
    g, batch = model.graph, model.batch
    check_groups(g, groups)
    tiled = sorted((grp for grp in groups if grp.tiles > 1), key=lambda x: x.first)
    in_group = {l for grp in tiled for l in grp.layers}
    order = tuple(range(len(g.layers)))
    home = assign_buffers(g, order, True, exclude=frozenset(in_group))
    internal = {g.layers[l].output for grp in tiled for l in grp.layers[:-1]}
    inp = g.inputs[0]
    streamed = bool(tiled) and tiled[0].first == 0 and _tiles_cover_input(g, tiled[0], batch)
    if streamed:  # the model input arrives tile by tile into the first group's tile buffers
        internal.add(inp)
    buffers: list[Buffer] = []
    buffer_of: dict[str, int] = {}
    for t in [inp] + [l.output for l in g.layers]:
        if home[t] == t and t not in internal:
            shape = (batch,) + g.shape(t)[1:]
            buffer_of[t] = len(buffers)
            buffers.append(Buffer(len(buffers), "whole", shape, layout_for(shape, layout), (0,), itemsize(dtype)))
    for t, h in home.items():
        if h in buffer_of:
            buffer_of[t] = buffer_of[h]
    # (A streamed input has no whole buffer: whole_steps' input step is then dropped.)
    plain = whole_steps(model, 0, [l for l in order if l not in in_group], {inp: -1, **buffer_of}, dtype, layout)
    by_layer = {s.layer: s for s in plain[1:]}
    b = _Builder(g, batch, dtype, layout, buffers, [] if streamed else [plain[0]])
    starts = {grp.first: grp for grp in tiled}
    for lid in order:
        if lid in starts:
            _group_steps(b, starts[lid], buffer_of)
        elif lid not in in_group:
            b.steps.append(by_layer[lid])
    knobs = {"method": "tiling", "order": "imported", "layout": layout, "tiling": format_tiling(sorted(groups, key=lambda x: x.first)),
             "groups": [{"first": x.first, "last": x.last, "grid": list(x.grid), "overlap": x.overlap, "edge": x.edge,
                         "overlay": x.overlay} for x in groups]}
    plan = Plan((model.ref(),), dtype, tuple(b.buffers), (Partition(0, 0, order, tuple(b.steps)),), (), 0, knobs)
    for grp in tiled:
        if grp.overlay:
            plan = _overlay_group(plan, g, grp, buffer_of)
    return plan


def _overlay_group(plan: Plan, g: Graph, grp: TileGroup, buffer_of: dict[str, int]) -> Plan:
    from tightfit.plan.overlay import overlay_pair

    inp = g.layers[grp.first].inputs[0]
    out = g.layers[grp.last].output
    host, guest = buffer_of.get(inp), buffer_of.get(out)
    if host is None or guest is None or host == guest or plan.buffers[host].overlay is not None:
        raise TilingError(f"group {grp.spec()}: an overlay needs the group's input and output whole in the arena "
                          f"(not the model input arriving by tiles) and the group before it not overlaid")
    placed = overlay_pair(plan, [g], host, guest)
    if placed.buffers[guest].overlay is None:
        raise TilingError(f"group {grp.spec()}: its output cannot share its input's memory (no input row is "
                          f"dead before an output row is written)")
    return placed


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


# --- predictor and configuration search ---------------------------------------------------------
#
# MAFAT's Alg. 3 searches a fixed space (no cut or one cut at 4, 8 or 12 of YOLOv2; square
# grids) with a fitted memory predictor. Here: any number of groups up to `max_groups`, each
# between two cut points (by default the cuts after downsampling, where merging tiles costs
# least), any grid up to 8x8 (by default squares and grids one tile off square), either overlap
# policy; memory read exactly off each plan's lifetimes and step scratch, time from a cost
# function (the cost model).
#
# Bounding the work. Cut points separate the graph: at a step inside a group only the group's
# own buffers (and model outputs) are live, so a group's memory (bytes live, step scratch) and
# its steps' time do not depend on the other groups. Each (group, grid, overlap) is planned once,
# as the only group of a draft plan (memoised), and a configuration's prediction is assembled:
# peak = max live over its segments + max scratch over its segments (what check_plan reports),
# seconds = sum over segments. Memory is evaluated for every option; time only for the options a
# budget (the asked one, and a ladder of budgets for the front) can use: per segment and overlap,
# the `timed_per_segment` coarsest grids that fit (more tiles usually cost more time; the answer
# is the fastest of every configuration assembled, so a finer grid timed for a smaller ladder
# budget still wins when it is faster), and never a grid whose memory is no lower than a coarser
# grid's (dominated). A dynamic program over the cut points then picks, for each scratch cap S (the
# distinct step scratches), the fastest chain whose live bytes fit budget - S. Finer grids of a
# group stop once PLATEAU_GRIDS of them in a row lower neither its live bytes nor its scratch by
# PLATEAU_GAIN: the group's whole input and output buffers, which no grid shrinks, then dominate.
#
# The fine space. When an asked budget (budget_bytes or one of extra_budgets) lies below every
# configuration of the space above, the search adds: cuts at every cut point (not only after
# downsampling; if there are at most MAX_FINE_CUTS), and per segment the families of
# `fine_groups` (reused overlap, tiles one or two rows high, up to GRID_LIMIT columns, with and
# without narrow border columns), each family stopped by the same plateau rule. A segment is
# skipped when its whole input and output alone (live together in any tiling of it) exceed the
# smallest asked budget, or when an option already planned for it fits that budget, so the fine
# space costs only where it can help. Looking for the fastest
# configuration tries at most TIME_CAPS scratch caps per budget.

GRID_LIMIT = 8
MAX_CUTS = 10  # candidate cut points kept (evenly spaced) when a graph has more
MAX_FINE_CUTS = 24  # the fine space (asked budgets below the space above) cuts at every cut point if at most this many
PLATEAU_GRIDS = 3  # finer grids stop after this many in a row lower a group's live bytes and scratch by < PLATEAU_GAIN
PLATEAU_GAIN = 0.01
TIME_CAPS = 12  # scratch caps tried per budget when looking for the fastest configuration

StepSeconds = Callable[[Plan, Sequence[Step]], float]


@dataclass(frozen=True)
class TilingPoint:
    """A configuration (its tiled groups; other layers run layer by layer) and its prediction:
    run memory (arena lower bound + largest step scratch) and seconds."""

    groups: tuple[TileGroup, ...]
    peak_bytes: int
    seconds: float
    parts: "PartsPoint | None" = None  # the whole network by parts instead (no groups)

    @property
    def spec(self) -> str:
        if self.parts is not None:
            return _parts_spec(self.parts)
        return format_tiling(self.groups) or "layer-by-layer"


def smallest_key(p: TilingPoint) -> tuple:
    """Smallest peak first; ties broken without a time (fewer tiles, then the spec)."""
    return (p.peak_bytes, sum(g.tiles for g in p.groups), p.spec)


def _parts_spec(p: "PartsPoint") -> str:
    """Phases per layer (runs of equal phases as ranges), the input's bands, held layers:
    "parts 0:512,1:304,2-5:152, input 256, held 11"."""
    runs: list[list[int]] = []  # [first, last, phases]
    for lid, n in p.phases:
        if runs and runs[-1][1] == lid - 1 and runs[-1][2] == n:
            runs[-1][1] = lid
        else:
            runs.append([lid, lid, n])
    layers = ",".join(f"{a}:{n}" if a == b else f"{a}-{b}:{n}" for a, b, n in runs)
    return (f"parts {layers}, input {p.source_phases}" + (", aligned" if p.align else "")
            + (f", held {','.join(map(str, p.held))}" if p.held else ""))


@dataclass(frozen=True)
class TilingSearch:
    chosen: TilingPoint  # fastest within the budget; if none fits, the smallest reachable
    front: tuple[TilingPoint, ...]  # Pareto front (peak_bytes, seconds) of the configurations assembled
    evaluated: int  # group options planned (memory); each timed at most once
    fits: bool
    smallest_bytes: int  # the smallest peak any configuration in the searched space reaches
    points: tuple[TilingPoint, ...] = ()  # every configuration assembled (the front's superset)
    timed_out: bool = False  # the deadline stopped the planning of group options


def default_grids(limit: int = GRID_LIMIT) -> tuple[tuple[int, int], ...]:
    """Grids 1x1 .. limit x limit, square or one tile off square, by tile count."""
    grids = [(n, m) for n in range(1, limit + 1) for m in range(1, limit + 1) if abs(n - m) <= 1]
    return tuple(sorted(grids, key=lambda x: (x[0] * x[1], x)))


def candidate_cuts(graph: Graph, limit: int = MAX_CUTS) -> tuple[int, ...]:
    """Where groups may start and end in the search: the model's ends, the cut points after
    downsampling (all cut points if there are fewer than two of those), at most `limit`, and
    the ends of every groupable run (the cut points around layers that cannot be tiled: a model
    whose first layer is a layout transpose has no coarse group without the cut after it)."""
    cuts = downsampling_cuts(graph)
    if len(cuts) < 2:
        cuts = tuple(p for p in cut_points(graph) if 0 < p < len(graph.layers))
    if len(cuts) > limit:
        cuts = tuple(cuts[round(k * (len(cuts) - 1) / (limit - 1))] for k in range(limit))
    around = {p for first, last in groupable_runs(graph) for p in (first, last + 1)}
    return tuple(sorted({0, len(graph.layers)} | set(cuts) | around))


def fine_groups(g: Graph, first: int, last: int, limit: int = GRID_LIMIT) -> list[list[TileGroup]]:
    """The small-memory space of one group, in families of grids by column count: overlap
    reused, tiles one or two output rows high (reuse makes the row overlap free, so rows cost
    little), 1..limit columns, each family also with border columns as narrow as `clear_edge`."""
    h, w = spatial(g.shape(g.layers[last].output))
    edge = clear_edge(g, TileGroup(first, last, (1, min(3, w)), "reuse"))
    families = []
    for n in sorted({h, -(-h // 2)} - {1}):
        families.append([TileGroup(first, last, (n, m), "reuse") for m in range(1, min(limit, w) + 1)])
        if edge:
            families.append([TileGroup(first, last, (n, m), "reuse", edge) for m in range(3, min(limit, w) + 1)
                             if w - 2 * edge >= m - 2])
    return [f for f in families if f]


def _whole_bytes(model: PlannedModel, a: int, b: int, dtype: str, overlay: bool = False) -> int:
    """A lower bound of the memory of layers a..b-1 as one group: its whole input (unless it is
    the model input, which may arrive tile by tile) and its whole output, live together; with
    `overlay`, the larger of the two (the output may share the input's bytes)."""
    g = model.graph
    tensors = ([] if a == 0 else [g.layers[a - 1].output]) + [g.layers[b - 1].output]
    sizes = [g.tensors[t].nbytes(dtype, model.batch) for t in tensors]
    if overlay and len(tensors) == 2:
        return max(sizes)
    return sum(sizes)


def _lags(draft: Plan, grp: TileGroup) -> tuple[int, int]:
    """An overlaid group's block growth beyond its input and beyond its output (0, 0 if none)."""
    from tightfit.plan.overlay import block_growth

    if not grp.overlay:
        return 0, 0
    guest = next(b.id for b in draft.buffers if b.overlay is not None)
    return block_growth(draft, guest)


def _joins(prev: "_Option | None", opt: "_Option", live_cap: int) -> bool:
    """Whether `opt` may follow `prev` within `live_cap`: an overlaid group's block also holds
    bytes in the segments beside it, and a group's input may not be an overlay already."""
    if prev is None:
        return not opt.overlaid
    if prev.overlaid and opt.overlaid:
        return False
    return prev.live + opt.lag_prev <= live_cap and opt.live + prev.lag_next <= live_cap


def _live(opt: "_Option", prev: "_Option | None" = None) -> int:
    """A segment's live bytes, bounded with its neighbours' overlay blocks (the DP's memory)."""
    if prev is None:
        return opt.live
    return max(opt.live + prev.lag_next, prev.live + opt.lag_prev)


def cost_seconds(cost, graph: Graph) -> StepSeconds:
    """The cost model's predicted seconds of some steps of a plan."""
    return lambda plan, steps: cost.steps_seconds(plan, [graph], steps)


def step_memory(plan: Plan, graph: Graph) -> tuple[list[int], list[int]]:
    """Per step: bytes of the buffers live at it, and its scratch."""
    from tightfit.plan.lifetimes import lifetimes

    life = lifetimes(plan, [graph], conflicts=False)
    return life.live_bytes(), list(life.step_scratch)


@dataclass
class _Option:
    """One way to run the layers between two cut points: layer by layer (group None) or a group."""

    group: TileGroup | None
    live: int
    scratch: int
    plan: Plan | None = None
    steps: tuple[int, int] = (0, 0)
    seconds: float | None = None
    # An overlaid group's block: bytes beyond its input, live in the segment before it (from that
    # input's first write), and beyond its output, live in the segment after it.
    lag_prev: int = 0
    lag_next: int = 0

    @property
    def overlaid(self) -> bool:
        return self.group is not None and self.group.overlay

    @property
    def peak(self) -> int:
        return self.live + self.scratch


def search_tiling(model: PlannedModel, seconds: StepSeconds, budget_bytes: int | None = None, max_groups: int = 3,
                  grids: Sequence[tuple[int, int]] | None = None, overlaps: Sequence[str] = OVERLAPS,
                  cuts: Sequence[int] | None = None, layout: str = "nhwc", dtype: str = "fp32",
                  timed_per_segment: int = 2, front_points: int = 12, extra_budgets: Sequence[int] = (),
                  parts: bool = True, deadline: Deadline | None = None,
                  progress: Callable[[str], None] = lambda line: None) -> TilingSearch:
    """With `budget_bytes`: the fastest configuration found whose predicted run memory fits
    (`fits` False: `chosen` is the smallest reachable). Without: the fastest overall. The
    front is assembled over a ladder of `front_points` budgets from the smallest reachable peak
    to the layer-by-layer peak, plus the fastest within each of `extra_budgets` (so one search
    answers several budgets: the fastest front point within each). A budget below the space of
    `cuts` and `grids` opens the fine space (see above). `seconds(plan, steps)` predicts the time
    of some of a plan's steps (`cost_seconds(CostModel.default(), graph)`). With `parts`, a budget
    below the coarse space also gets the parts search's front there (the whole network by parts).
    Past `deadline` (checked before each group option is planned) no more options are planned
    and the configurations are assembled from those planned so far; `progress` gets a line per
    stage."""
    g = model.graph
    L = len(g.layers)
    cuts = tuple(sorted(set(cuts) | {0, L})) if cuts is not None else candidate_cuts(g)
    real = set(cut_points(g))
    grids = tuple(sorted(grids or default_grids(), key=lambda x: (x[0] * x[1], x)))
    base = draft_tiling(model, (), layout, dtype)
    base_live, base_scratch = step_memory(base, g)
    options: dict[tuple[int, int], list[list[_Option]]] = {}  # segment -> per overlap: memory-Pareto grids by tiles
    plain: dict[tuple[int, int], _Option] = {}
    evaluated = 0

    def groupable(a: int, b: int) -> bool:
        return a in real and b in real and all(tileable(g, l) for l in range(a, b))

    def add_segments(points: Sequence[int], keep: Callable[[int, int], bool], groups_of) -> None:
        """Plan the options of every segment between `points` that `keep` admits: layer by layer,
        and each list of groups `groups_of(a, b)` gives (finer grids last), memory only."""
        nonlocal evaluated
        pairs = [(a, b) for i, a in enumerate(points) for b in points[i + 1:]]
        for a, b in pairs:  # every segment can run layer by layer, whatever the deadline cuts off below
            lo, hi = (0 if a == 0 else a + 1), b + 1  # the segment's steps in the layer-by-layer plan
            plain.setdefault((a, b), _Option(None, max(base_live[lo:hi]), max(base_scratch[lo:hi]), base, (lo, hi)))
        if timed_out:  # (the fine space's new cut points still need their layer-by-layer options)
            return
        for a, b in pairs:
            if not groupable(a, b) or not keep(a, b):
                continue
            for candidates in groups_of(a, b):
                kept: list[_Option] = []
                stale = 0
                for grp in candidates:
                    if stale >= PLATEAU_GRIDS:
                        break
                    check(deadline)
                    try:
                        draft = draft_tiling(model, [grp], layout, dtype)
                    except TilingError:  # an overlay variant whose output cannot share its input
                        break
                    evaluated += 1
                    live, scratch = step_memory(draft, g)
                    lo, hi = (0 if a == 0 else a + 1), len(draft.steps()) - (L - b)
                    # Plans are dropped (rebuilt if timed): a big graph's fine grids are large.
                    opt = _Option(grp, max(live[lo:hi]), max(scratch[lo:hi]), None, (lo, hi), None,
                                  *_lags(draft, grp))
                    gains = not kept or any(getattr(opt, f) < min(getattr(k, f) for k in kept) * (1 - PLATEAU_GAIN)
                                            for f in ("live", "scratch"))
                    stale = 0 if gains else stale + 1
                    # Dominated: more tiles, no less live memory and no less scratch. (Scratch
                    # counts once per configuration, live bytes per segment: both matter.)
                    if not any(k.live <= opt.live and k.scratch <= opt.scratch for k in kept):
                        kept.append(opt)
                options.setdefault((a, b), []).append(kept)

    def coarse_groups(a: int, b: int) -> list[list[TileGroup]]:
        h, w = spatial(g.shape(g.layers[b - 1].output))
        return [[TileGroup(a, b - 1, (n, m), ov) for n, m in grids
                 if n * m > 1 and n <= h and m <= w and not (ov == "reuse" and n == 1)] for ov in overlaps]

    timed_out = False

    def add_until_deadline(*args) -> None:
        nonlocal timed_out
        try:
            add_segments(*args)
        except TimeUp:
            timed_out = True
        progress(f"tiling search: {evaluated} group options planned{' (time is up)' if timed_out else ''}")

    add_until_deadline(cuts, lambda a, b: True, coarse_groups)

    def timed(opt: _Option) -> float:
        if opt.seconds is None:
            plan = opt.plan or draft_tiling(model, [opt.group], layout, dtype)
            opt.seconds = seconds(plan, plan.steps()[opt.steps[0]:opt.steps[1]])
        return opt.seconds

    def usable(seg: tuple[int, int], live_cap: int, scratch_cap: int, first: int | None) -> list[_Option]:
        out = [plain[seg]] if plain[seg].live <= live_cap and plain[seg].scratch <= scratch_cap else []
        for kept in options.get(seg, ()):
            out += [o for o in kept if o.live <= live_cap and o.scratch <= scratch_cap][:first]
        return out

    def chain(live_cap: int, scratch_cap: int, cost: Callable[[_Option, "_Option | None"], float], combine,
              first: int | None = timed_per_segment) -> tuple[float, list[_Option]] | None:
        """The best chain of options over the cut points (at most max_groups groups), each
        segment choosing among its `first` coarsest fitting grids per overlap (None: all)."""
        best: dict[tuple[int, int], tuple[float, list[_Option]]] = {(0, 0): (0.0, [])}
        for j, b in enumerate(cuts):
            for a in cuts[:j]:
                for opt in usable((a, b), live_cap, scratch_cap, first):
                    for k in range(max_groups + 1):
                        if (a, k) not in best:
                            continue
                        k2 = k + (opt.group is not None)
                        prev = best[(a, k)][1][-1] if best[(a, k)][1] else None
                        if k2 > max_groups or not _joins(prev, opt, live_cap):
                            continue
                        value = combine(best[(a, k)][0], cost(opt, prev))
                        if (b, k2) not in best or value < best[(b, k2)][0]:
                            best[(b, k2)] = (value, best[(a, k)][1] + [opt])
        ends = [best[(L, k)] for k in range(max_groups + 1) if (L, k) in best]
        return min(ends, key=lambda e: e[0], default=None)

    def point(opts: list[_Option]) -> TilingPoint:
        groups = tuple(o.group for o in opts if o.group is not None)
        if any(o.overlaid for o in opts):
            # A block spans segments, so per-segment figures only bound it: the plan is read.
            live, scratch = step_memory(draft_tiling(model, groups, layout, dtype), g)
            peak = max(live) + max(scratch)
        else:
            peak = max(o.live for o in opts) + max(o.scratch for o in opts)
        return TilingPoint(groups, peak, sum(timed(o) for o in opts))

    def caps() -> list[int]:
        every = [plain[s] for s in plain] + [o for per in options.values() for kept in per for o in kept]
        return sorted({o.scratch for o in every})

    scratch_caps = caps()

    def fastest(budget: int) -> TilingPoint | None:
        found = []
        fitting = [s for s in scratch_caps if s <= budget]
        # At most TIME_CAPS scratch caps (evenly over the sorted distinct ones, the largest kept):
        # each cap may time other options, and the fine space has hundreds of distinct scratches.
        # The smallest configuration is found over every cap (untimed) and competes anyway.
        stride = max(1, -(-len(fitting) // TIME_CAPS))
        for s in fitting[::-1][::stride][::-1]:
            c = chain(budget - s, s, lambda o, _: timed(o), lambda x, y: x + y)
            if c is not None:
                found.append(point(c[1]))
        return min(found, key=lambda p: (p.seconds, p.peak_bytes), default=None)

    def smallest_point() -> TilingPoint:
        best_small = None
        for s in scratch_caps:
            c = chain(1 << 62, s, _live, max, None)
            if c is not None and (best_small is None or c[0] + s < best_small[0]):
                best_small = (c[0] + s, c[1])
        return point(best_small[1])

    smallest = smallest_point()
    asked = [x for x in (budget_bytes, *extra_budgets) if x is not None]
    below = bool(asked) and min(asked) < smallest.peak_bytes  # a budget below the coarse space
    # Parts configurations compete only where the tiles' coarse space cannot go.
    by_parts = ([p for p in _parts_points(model, seconds, min(asked), layout, dtype, deadline, progress)
                 if p.peak_bytes < smallest.peak_bytes] if parts and below and not expired(deadline) else [])
    if below and "reuse" in overlaps:
        # Below the space above: the fine space, for the segments that can still fit.
        target = min(asked)
        every_cut = cut_points(g)
        cuts = tuple(sorted(set(cuts) | (set(every_cut) if len(every_cut) <= MAX_FINE_CUTS else set())))
        if not any(_whole_bytes(model, a, b, dtype, overlay=True) <= target for i, a in enumerate(cuts) for b in cuts[i + 1:]):
            # Nothing can fit (`fit` asks for its smallest plan with a budget of 0): look for the
            # smallest reachable instead, in every segment that could lower it.
            target = smallest.peak_bytes

        def worth(a: int, b: int) -> bool:  # could fit, and nothing planned for it so far does
            known = [plain[(a, b)]] + [o for kept in options.get((a, b), ()) for o in kept]
            return _whole_bytes(model, a, b, dtype, overlay=True) <= target and min(o.peak for o in known) > target

        def fine_and_overlaid(a: int, b: int) -> list[list[TileGroup]]:
            families = fine_groups(g, a, b - 1)
            if a == 0:  # the model input arrives by tiles: nothing whole to overlay
                return families
            return families + [[replace(grp, overlay=True) for grp in f] for f in families]

        add_until_deadline(cuts, worth, fine_and_overlaid)
        scratch_caps = caps()
        smallest = smallest_point()
    top = fastest(1 << 62)
    # The memory side: the smallest chain (no time looked at) and the parts search's smallest.
    # A time-guided find below it depends on the cost profile: dropped, so the smallest
    # configuration, and whether a budget is reachable, are the same under any profile.
    smallest = min([smallest] + by_parts, key=smallest_key)
    floor = 0 if timed_out else smallest.peak_bytes  # (cut off by the deadline: nothing is dropped)
    seen = [smallest, top] + by_parts
    if front_points > 1 and top.peak_bytes > smallest.peak_bytes:
        ratio = (top.peak_bytes / smallest.peak_bytes) ** (1 / (front_points - 1))
        ladder = [int(smallest.peak_bytes * ratio ** k) for k in range(1, front_points - 1)]
    else:
        ladder = []
    for budget in ladder + list(extra_budgets):
        p = fastest(budget)
        if p is not None:
            seen.append(p)
    # Every assembled configuration competes: a ladder budget may have timed finer grids that
    # turn out faster (smaller tiles stay in cache) than the coarsest that fit.
    limit = 1 << 62 if budget_bytes is None else budget_bytes
    p = fastest(limit)
    seen += [p] if p is not None else []
    seen = [q for q in seen if q.peak_bytes >= floor]
    fitting = [q for q in seen if q.peak_bytes <= limit]
    chosen, fits = (min(fitting, key=lambda q: (q.seconds, q.peak_bytes)), True) if fitting else (smallest, False)
    from tightfit.plan.parts_search import pareto

    distinct = tuple({(p.groups, p.parts): p for p in seen}.values())
    smallest = min(seen, key=smallest_key)
    return TilingSearch(chosen, pareto(list(distinct)), evaluated, fits, smallest.peak_bytes, distinct, timed_out)


def _parts_points(model: PlannedModel, seconds: StepSeconds, budget: int, layout: str, dtype: str,
                  deadline: Deadline | None = None, progress: Callable[[str], None] = lambda line: None) -> list[TilingPoint]:
    """The parts search's front for `budget`, as configurations."""
    from tightfit.plan.parts_search import search_parts

    found = search_parts(model, lambda plan: seconds(plan, plan.steps()), budget, layout=layout, dtype=dtype,
                         deadline=deadline, progress=progress)
    return [TilingPoint((), p.peak_bytes, p.seconds, p) for p in found.front]
