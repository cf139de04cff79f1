"""Where fused-tiling groups may go, and how they are written: a group is a run of layers
[first, last] with one input tensor and one output tensor (branches inside, residual adds and
concats, are allowed) between cut points (where exactly one tensor is live), every layer of it
tileable; `parse_tiling` reads the CLI's spec of groups."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from tightfit.errors import OptionError
from tightfit.graph.ir import Graph, spatial
from tightfit.ops import get_op
from tightfit.plan.lifetimes import tensor_last_use

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

def cut_points(graph: Graph) -> tuple[int, ...]:
    """Positions p (0..L, before layer p) where exactly one tensor is live: the tensor entering
    layer p (the model input at 0, the model output at L). A group [first, last] is valid
    exactly when first and last + 1 are cut points and every layer in it can be tiled; cut
    points are where MAFAT's `cut` may go, generalised to any graph."""
    last = tensor_last_use(graph)
    # A model input arrives just before its first reader (techniques/reuse/planner.whole_steps):
    # a second input read late is not live before it.
    first: dict[str, int] = {}
    for layer in graph.layers:
        for t in layer.inputs:
            if t in graph.inputs:
                first.setdefault(t, layer.id)
    live = {t for t in graph.inputs if first.get(t) == 0}
    cuts = [0] if len(live) == 1 else []
    for layer in graph.layers:
        live.add(layer.output)
        live |= {t for t in graph.inputs if first.get(t) == layer.id + 1}
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
    last = tensor_last_use(graph)
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
