"""The fused-tiling planner: graph and groups in, Plan out (pure). See techniques/tiling for the
buffers and overlap policies it plans."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from tightfit.analysis.csdf import split_rows
from tightfit.graph.ir import Graph, itemsize, spatial
from tightfit.ops import get_op
from tightfit.ops.base import Region
from tightfit.techniques import windows as memo
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import assign_buffers, layout_for, whole_steps
from tightfit.plan.schema import Access, Buffer, Partition, Plan, Step
from tightfit.techniques.tiling.groups import TileGroup, TilingError, check_groups, format_tiling

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
        item = self.graph.tensors[tensor].item_bytes(self.dtype)
        self.buffers.append(Buffer(len(self.buffers), "tile", shape, layout_for(shape, self.layout), (0,), item))
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
        item = b.graph.tensors[tensor].item_bytes(b.dtype)  # an int8 input's rows are 1 byte a value
        row_band = 2 * region.n * b.graph.shape(tensor)[1] * spatial(b.graph.shape(tensor))[1] * item
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


def _streams(g: Graph, tiled: Sequence[TileGroup], t: str, batch: int) -> bool:
    """Whether model input `t` can arrive tile by tile: the first layer reading it starts a group
    whose tiles cover it, and no layer outside that group reads it."""
    readers = [l.id for l in g.consumers(t)]
    grp = next((x for x in tiled if readers and x.first == min(readers)), None)
    return grp is not None and all(r in grp.layers for r in readers) and _tiles_cover_input(g, grp, batch)


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


def draft_tiling(model: PlannedModel, groups: Sequence[TileGroup], layout: str = "nhwc", dtype: str = "fp32") -> Plan:
    """plan_tiling's plan before its buffers are placed (lifetimes and step times need no offsets)."""
    g, batch = model.graph, model.batch
    check_groups(g, groups)
    tiled = sorted((grp for grp in groups if grp.tiles > 1), key=lambda x: x.first)
    in_group = {l for grp in tiled for l in grp.layers}
    order = tuple(range(len(g.layers)))
    home = assign_buffers(g, order, True, exclude=frozenset(in_group))
    internal = {g.layers[l].output for grp in tiled for l in grp.layers[:-1]}
    streamed = {g.layers[grp.first].inputs[0] for grp in tiled if grp.first == 0 or g.layers[grp.first].inputs[0] in g.inputs}
    streamed = {t for t in streamed if t in g.inputs and _streams(g, tiled, t, batch)}
    internal |= streamed  # a model input that arrives tile by tile into its group's tile buffers
    buffers: list[Buffer] = []
    buffer_of: dict[str, int] = {}
    for t in list(g.inputs) + [l.output for l in g.layers]:
        if home[t] == t and t not in internal:
            shape = (batch,) + g.shape(t)[1:]
            buffer_of[t] = len(buffers)
            buffers.append(Buffer(len(buffers), "whole", shape, layout_for(shape, layout), (0,), g.tensors[t].item_bytes(dtype)))
    for t, h in home.items():
        if h in buffer_of:
            buffer_of[t] = buffer_of[h]
    b = _Builder(g, batch, dtype, layout, buffers, [])
    starts = {grp.first: grp for grp in tiled}
    group_of = {l: grp.first for grp in tiled for l in grp.layers}
    # Every layer's whole step, each model input's step just before its first reader; a group's
    # layers are replaced by its tiles, the input steps of its layers put before them (a streamed
    # input has no whole buffer: its step is dropped, its tiles load it).
    plain = whole_steps(model, 0, order, {**{t: -1 for t in g.tensors}, **buffer_of}, dtype, layout)
    waiting: list[Step] = []
    for s in plain:
        if s.kind == "input":
            waiting += [] if s.out.tensor in streamed else [s]
            continue
        if s.layer in group_of and s.layer != group_of[s.layer]:
            b.steps += waiting
        else:
            b.steps += waiting
            if s.layer in starts:
                _group_steps(b, starts[s.layer], buffer_of)
            else:
                b.steps.append(s)
        waiting = []
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
