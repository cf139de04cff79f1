"""Overlays: a whole tensor written while another is still being read, in the same bytes.

A tiled group or a chain of layers by parts reads its whole input top to bottom and writes its
whole output top to bottom. Rows of the input that every reader is done with are dead, so the
output's rows can go there, a few rows behind: the two buffers share memory though both are live
(MCUNetV2 and TinyEngine do this for one layer in place; here across a group). Buffer reuse alone
cannot: it only shares memory between buffers whose lifetimes do not overlap.

A buffer with `overlay = (host, shift)` lies `shift` bytes from its host's offset. Buffers linked
by overlays form a block, placed as one request (its extent, its members' lifetimes together).
`overlay_buffers` is a pure pass over a draft plan: for each whole buffer, the block position
with the least extent at which every pair of overlapping rows has disjoint lifetimes (first
write to last read, per row, from the steps). The plan checker proves the result by simulating
the shared cells, so the pass's reasoning is never trusted alone.

Overlays are kept to what the simulation can tag cell by cell: one sample, channels-last, one
element size, positions in whole cells (a cell: the common divisor of the block's channel counts;
e.g. VGG's pooled 256-channel output of stage 3 goes into the dead rows of its 128-channel input
of stage 3, whose rows have the same bytes).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from tightfit.graph.ir import Graph
from tightfit.plan.lifetimes import block_positions, lifetimes, row_lifetimes
from tightfit.plan.place import place
from tightfit.plan.schema import Buffer, Plan

ALIGN = 64  # block positions are multiples of this and of the cell size, as offsets are


def cell_bytes(b: Buffer) -> int:
    return b.shape[1] * b.itemsize


def shared_cell_bytes(buffers: Sequence[Buffer]) -> int:
    """The cell of a block: the largest run of elements every member's positions are made of."""
    return math.gcd(*(b.shape[1] for b in buffers)) * buffers[0].itemsize


def eligible(b: Buffer) -> bool:
    return b.kind == "whole" and b.copies == 1 and len(b.shape) == 4 and b.shape[0] == 1 and b.layout == "nhwc"


def overlay_buffers(plan: Plan, graphs: Sequence[Graph], within_steps: bool = False) -> Plan:
    """The draft with overlays where they save memory (offsets are placed afterwards).
    `within_steps`: a step's output may also lie over its own input's rows that the step is done
    reading when it writes them, as its kernel's walk allows (ops/walks.py: in-place depthwise
    convolution, int8 convolutions); else only over rows dead before the step."""
    if any(b.overlay is not None for b in plan.buffers):
        return plan  # blocks already chosen (a tiling group's); this pass starts from none
    rows = row_lifetimes(plan, graphs, eligible, within_steps)
    span = {b: _span(life) for b, life in rows.items()}
    # A row of one can share bytes with a row of the other only if one dies before the other is
    # written: the first death before the last write (a cheap test that skips most pairs).
    turnover = {b: (min(l for w, l in life if l >= 0), max(w for w, l in life if l >= 0)) for b, life in rows.items()
                if span[b] is not None}

    def live_together(x: int, y: int) -> bool:
        return span[x][0] <= span[y][1] and span[y][0] <= span[x][1]

    def turn_over(x: int, y: int) -> bool:
        return turnover[x][0] < turnover[y][1] or turnover[y][0] < turnover[x][1]

    buffers = list(plan.buffers)
    members: dict[int, list[tuple[int, int]]] = {}  # block root -> [(buffer id, position)]
    for b in plan.buffers:
        if not eligible(b) or span.get(b.id) is None:
            continue
        best = None
        for root, group in members.items():
            # A block only for buffers live at the same time: sharing bytes between buffers
            # live apart is buffer reuse, which the offset planner does without tying them.
            if not any(live_together(b.id, m) for m, _ in group) or not any(turn_over(b.id, m) for m, _ in group):
                continue
            if any(buffers[m].itemsize != b.itemsize for m, _ in group):  # an int8 and an fp32 buffer: cells differ
                continue
            found = _best_position(b, rows, group, buffers)
            if found is not None and (best is None or found[1] > best[2]):
                best = (root, found[0], found[1])
        if best is None:
            members[b.id] = [(b.id, 0)]
            continue
        root, pos, _ = best
        members[root].append((b.id, pos))
        buffers[b.id] = replace(b, overlay=(root, pos))
    return replace(plan, buffers=tuple(buffers))


def overlay_pair(plan: Plan, graphs: Sequence[Graph], host: int, guest: int, within_steps: bool = False,
                 join: bool = False) -> Plan:
    """The draft with buffer `guest` overlaying buffer `host` (neither in an overlay yet) where
    that saves the most; unchanged if both are not eligible or no overlapping position is safe.
    `within_steps`: as overlay_buffers's. `join`: one of the two may be in a block already; the
    other joins that block (its position safe against every member)."""
    positions = block_positions(plan.buffers)
    if (host in positions or guest in positions) and not join or (host in positions and guest in positions):
        return plan
    if guest in positions:
        host, guest = guest, host
    h, b = plan.buffers[host], plan.buffers[guest]
    if not (eligible(h) and eligible(b)) or h.itemsize != b.itemsize:
        return plan
    root = positions.get(host, (host, 0))[0]
    group = [(m, pos) for m, (r, pos) in positions.items() if r == root] or [(host, 0)]
    if any(not eligible(plan.buffers[m]) or plan.buffers[m].itemsize != b.itemsize for m, _ in group):
        return plan
    rows = row_lifetimes(plan, graphs, eligible, within_steps)
    if guest not in rows or any(m not in rows for m, _ in group):
        return plan
    found = _best_position(b, rows, group, list(plan.buffers))
    if found is None:
        return plan
    return replace(plan, buffers=tuple(replace(x, overlay=(root, found[0])) if x.id == guest else x for x in plan.buffers))


CANDIDATES = 6  # the busiest steps whose output is tried over its input, per round


def overlap_in_place(draft: Plan, graphs: Sequence[Graph], planner: str) -> Plan:
    """The placed plan with, round by round, the output of one of the busiest steps laid over its
    largest input where its kernel's walk allows (overlay_pair within steps, joining a block
    either is in), kept where the placed arena shrinks, or stays and the steps' live bytes,
    largest first, shrink (two steps may tie at the peak: one link lowers one of them); until
    no such step is left. A block is one request as long-lived as all its members, which can cost
    more than it saves: hence each link is tried on the placed arena."""
    best = place(draft, graphs, planner)
    best_key = _overlap_key(best, graphs)
    tried: set[int] = set()
    while True:
        live = lifetimes(best, graphs, conflicts=False).live_bytes()
        steps = best.steps()
        order = sorted((i for i, s in enumerate(steps) if s.kind == "compute" and i not in tried
                        and eligible(best.buffers[s.out.buffer]) and any(eligible(best.buffers[a.buffer]) for a in s.inputs)),
                       key=lambda i: -live[i])[:CANDIDATES]
        found = []  # (key, step, plan) of the links that are progress
        for i in order:
            s = steps[i]
            host = max((a.buffer for a in s.inputs if eligible(best.buffers[a.buffer])), key=lambda b: best.buffers[b].nbytes)
            paired = overlay_pair(best, graphs, host, s.out.buffer, within_steps=True, join=True)
            placed = place(paired, graphs, planner) if paired is not best else None
            key = _overlap_key(placed, graphs) if placed is not None else None
            if key is not None and key < best_key:
                found.append((key, i, placed))
            else:
                tried.add(i)
        if not found:
            return best
        # The best of the round: a link that shrinks the arena before one that only lowers a tie.
        best_key, i, best = min(found, key=lambda f: (f[0], f[1]))
        tried.add(i)


def _overlap_key(plan: Plan, graphs: Sequence[Graph]) -> tuple[int, tuple[int, ...]]:
    """The arena, then the steps' live bytes largest first: a link that lowers one of two tied
    peaks (or the next peak below) is progress, one that swells a quiet step's block is not."""
    return plan.arena_bytes, tuple(sorted(lifetimes(plan, graphs, conflicts=False).live_bytes(), reverse=True))


def block_growth(plan: Plan, guest: int) -> tuple[int, int]:
    """(bytes the block holds beyond its host, beyond its guest) for a guest and its host."""
    b = plan.buffers[guest]
    host, pos = b.overlay
    extent = max(plan.buffers[host].nbytes, pos + b.nbytes) - min(0, pos)
    return extent - plan.buffers[host].nbytes, extent - b.nbytes


def _best_position(b: Buffer, rows: dict, group: list[tuple[int, int]], buffers: list[Buffer]) -> tuple[int, int] | None:
    """(position, bytes saved) of `b` in a block of `group`'s members, the most saved first; None
    if no overlapping position is safe."""
    lo = min(p for _, p in group)
    hi = max(p + buffers[m].nbytes for m, p in group)
    step = math.lcm(ALIGN, cell_bytes(b))

    def safe(pos: int) -> bool:
        return all(_disjoint(b, pos, buffers[m], p, rows) for m, p in group)

    # Positions below the block overlap it less the lower they go; the first safe one from the
    # top saves the most. At `top` (the block's start in b's whole cells, which members of other
    # channel counts need not start on), b lies inside the block (nothing more to save) if safe.
    top = -(-lo // step) * step
    if top + b.nbytes <= hi and safe(top):
        return top, b.nbytes
    low, high = (lo - b.nbytes) // step * step, top  # low: disjoint, always safe
    while high - low > step:
        mid = (low + high) // 2 // step * step
        low, high = (mid, high) if safe(mid) else (low, mid)
    saved = min(hi, low + b.nbytes) - max(lo, low)  # the bytes b shares with the block
    return (low, saved) if saved > 0 else None


def _span(life: list[tuple[int, int]]) -> tuple[int, int] | None:
    """A buffer's first and last step over its used rows (None: no row used)."""
    used = [r for r in life if r[1] >= 0]
    return (min(w for w, _ in used), max(l for _, l in used)) if used else None


def _disjoint(a: Buffer, pa: int, b: Buffer, pb: int, rows: dict) -> bool:
    """Whether every pair of a row of `a` (at pa) and a row of `b` (at pb) sharing bytes has
    disjoint lifetimes."""
    ra, rb = a.shape[3] * cell_bytes(a), b.shape[3] * cell_bytes(b)
    life_a, life_b = rows[a.id], rows[b.id]
    for i, (wa, la) in enumerate(life_a):
        start, end = pa + i * ra, pa + (i + 1) * ra
        j0, j1 = max((start - pb) // rb, 0), min((end - 1 - pb) // rb, len(life_b) - 1)
        for j in range(j0, j1 + 1):
            wb, lb = life_b[j]
            if not (la < wb or lb < wa):
                return False
    return True
