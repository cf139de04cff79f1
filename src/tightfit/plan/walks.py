"""Time inside one step: when a kernel writes each part of its output and last reads each part of
its inputs, by the walks of ops/walks.py. The checker (plan/check.py) proves with it that a step
whose output shares bytes with one of its own inputs (written in place, or overlaid at an offset:
plan/overlay.py) never writes over input bytes it still reads; the overlay planner (via
plan/lifetimes.row_lifetimes) finds such placements row by row.

Times count from the step's start: reads of the window of output row r at 2r + 2, writes of
output row r at 2r + 1 (before its own reads, as a kernel may do); for "elements", reads of
output position p's inputs at 2p and its writes at 2p + 1.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tightfit.graph.ir import Graph
from tightfit.ops import get_op
from tightfit.ops.base import Region
from tightfit.ops.walks import ELEMENTS, ROWS, SAME, kernel_walks
from tightfit.plan.schema import Access, Step


def rows_times(graph: Graph, step: Step, batch: int) -> tuple[dict[int, int], list[dict[int, int]]] | None:
    """For a compute step whose kernel walks by rows, over one sample: (buffer row of the output
    -> its write time, per input access: buffer row -> its last read time); None otherwise."""
    layer = graph.layers[step.layer]
    r = step.out.region
    if ROWS not in kernel_walks(graph, layer) or r.n != 1:
        return None
    in_shapes = [(batch,) + graph.shape(t)[1:] for t in layer.inputs]
    op = get_op(layer.op)
    writes = {step.out.at[1] + i: 2 * i + 1 for i in range(r.h)}
    reads: list[dict[int, int]] = [{} for _ in step.inputs]
    for i in range(r.h):
        row = Region(r.n0, r.n1, r.h0 + i, r.h0 + i + 1, r.w0, r.w1)
        for a, win, last in zip(step.inputs, op.input_windows(layer, row, in_shapes), reads):
            for h in range(win.region.h0, win.region.h1):
                last[a.at[1] + h - a.region.h0] = 2 * i + 2
    return writes, reads


def _flat_index(ids: np.ndarray, lo: int, size: int) -> np.ndarray:
    """Per cell id in [lo, lo + size): its index in `ids` read flat, or -1."""
    out = np.full(size, -1, dtype=np.int64)
    out[ids.ravel() - lo] = np.arange(ids.size)
    return out


def _same(out_ids: np.ndarray, in_ids: np.ndarray, wi: np.ndarray, ri: np.ndarray, shared: np.ndarray) -> bool:
    return out_ids.shape == in_ids.shape and bool((wi[shared] == ri[shared]).all())


def _elements(out_ids: np.ndarray, in_ids: np.ndarray, wi: np.ndarray, ri: np.ndarray, shared: np.ndarray) -> bool:
    """Output position p over input position q <= p, at the same cell of the position."""
    if out_ids.shape != in_ids.shape or out_ids.shape[0] != 1:
        return False
    k = out_ids.shape[-1]
    w, r = wi[shared], ri[shared]
    return bool(((w % k == r % k) & (w // k >= r // k)).all())


def _rows(out_ids: np.ndarray, in_ids: np.ndarray, times, which: int, wi: np.ndarray, ri: np.ndarray,
          shared: np.ndarray, out: Access, a: Access) -> bool:
    """Output row r only over input rows whose last read is by a row before r."""
    if times is None:
        return False
    writes, reads = times
    row_w = (wi[shared] // int(np.prod(out_ids.shape[2:]))) % out_ids.shape[1] + out.at[1]
    row_r = (ri[shared] // int(np.prod(in_ids.shape[2:]))) % in_ids.shape[1] + a.at[1]
    tw = np.array([writes[int(h)] for h in row_w], dtype=np.int64)
    tr = np.array([reads[which].get(int(h), 1 << 40) for h in row_r], dtype=np.int64)
    return bool((tw > tr).all())


def own_overlap_error(graph: Graph, step: Step, batch: int, out_ids: np.ndarray,
                      in_ids: Sequence[np.ndarray | None]) -> str | None:
    """None if the step's kernel never writes over bytes of its inputs it still reads; else the
    tensor it would. `out_ids`, `in_ids`: the cell ids of the output's and each input's region,
    (n, h, w, cells of a position), equal ids for the same bytes; an input's None: it shares no
    bytes with the output."""
    layer = graph.layers[step.layer]
    walks = kernel_walks(graph, layer)
    times = rows_times(graph, step, batch) if ROWS in walks else None
    for which, (a, ids) in enumerate(zip(step.inputs, in_ids)):
        if ids is None or ids.size == 0 or out_ids.size == 0:
            continue
        lo = min(int(out_ids.min()), int(ids.min()))
        size = max(int(out_ids.max()), int(ids.max())) - lo + 1
        wi, ri = _flat_index(out_ids, lo, size), _flat_index(ids, lo, size)
        shared = (wi >= 0) & (ri >= 0)
        if not shared.any():
            continue
        proofs = {SAME: lambda: _same(out_ids, ids, wi, ri, shared),
                  ELEMENTS: lambda: _elements(out_ids, ids, wi, ri, shared),
                  ROWS: lambda: _rows(out_ids, ids, times, which, wi, ri, shared, step.out, a)}
        if not any(proofs[w]() for w in sorted(walks)):
            return a.tensor
    return None
