"""The one plan checker, used by every test and every plan the CLI writes or runs.

It derives everything from the steps themselves:
- structure: each step's accesses fit their buffers and tensors, and each compute step reads
  exactly the input windows its op asks for;
- coverage: every layer's output and the model input are written in full;
- data flow: a simulation tags each buffer cell with the tensor element it holds; every read
  must find the element it expects (catches a slot overwritten before it is read, a range off
  by one, a buffer that is too small for its index map);
- placement: lifetimes (plan/lifetimes.py: first to last access, model outputs to the end)
  plus buffers of partitions that run at the same time give the conflict relation; no two
  conflicting buffers may overlap in the arena, and the arena must hold them all. Buffers linked by overlays
  (plan/overlay.py) are one request, and the simulation tags their shared cells once, so an
  overlay is accepted exactly when no element in it is overwritten before it is read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tightfit.graph.ir import Graph, spatial
from tightfit.ops import get_op
from tightfit.ops.registry import step_workspace
from tightfit.ops.base import Region
from tightfit.plan.lifetimes import Lifetimes, block_positions, buffer_users, lifetimes, output_accesses
from tightfit.plan.offsets import OverlapError, check_offsets, lower_bound
from tightfit.plan.overlay import eligible, shared_cell_bytes
from tightfit.plan.schema import Access, Buffer, Plan, PlanError, Step
from tightfit.plan.walks import own_overlap_error
from tightfit.ops.walks import kernel_walks


@dataclass(frozen=True)
class CheckReport:
    arena_bytes: int
    lower_bound: int
    scratch_peak: int
    steps: int

    @property
    def ratio(self) -> float:
        return self.arena_bytes / self.lower_bound if self.lower_bound else 1.0

    @property
    def peak_bytes(self) -> int:
        """Analysed run memory: the arena plus the largest step's kernel temporaries."""
        return self.arena_bytes + self.scratch_peak


def concurrent_lower_bound(plan: Plan, life: Lifetimes) -> int:
    """Partitions that run at the same time never share memory, so each one's busiest step adds
    up: for each concurrent set, the sum over its partitions of the bytes live at that
    partition's busiest step (each buffer counted once, with the first partition using it)."""
    steps_of: dict[int, range] = {}
    start = 0
    for p in plan.partitions:
        steps_of[p.id] = range(start, start + len(p.steps))
        start += len(p.steps)
    users = buffer_users(plan.partitions)
    best = 0
    for group in plan.concurrent:
        counted: set[int] = set()
        total = 0
        for pid in group:
            mine = [i for i, (b, _) in enumerate(life.keys) if pid in users.get(b, ()) and i not in counted]
            peak, peak_set = 0, []
            for step in steps_of[pid]:
                live = [i for i in mine if life.reqs[i].first_use <= step <= life.reqs[i].last_use]
                size = sum(life.reqs[i].size for i in live)
                if size > peak:
                    peak, peak_set = size, live
            total += peak
            counted.update(peak_set)
        best = max(best, total)
    return best


def check_plan(plan: Plan, graphs: Sequence[Graph]) -> CheckReport:
    """Raise PlanError naming the first problem; return the plan's memory figures."""
    if len(graphs) != len(plan.models):
        raise PlanError(f"plan names {len(plan.models)} models, {len(graphs)} given")
    _check_sanity(plan, graphs)
    _check_ids(plan)
    _check_steps(plan, graphs)
    _simulate(plan, graphs)
    _check_partitions(plan, graphs)
    _check_scratch(plan, graphs)
    life = lifetimes(plan, graphs)
    offsets = life.arena_offsets(plan)
    try:
        check_offsets(life.reqs, offsets, life.extra)
    except OverlapError as e:
        (bi, ci), (bj, cj) = life.keys[e.i], life.keys[e.j]
        raise PlanError(f"buffers {bi} and {bj} are live at the same time (steps {e.reqs[0].lifetime()} and "
                        f"{e.reqs[1].lifetime()}) but overlap in the arena at offsets {e.offsets[0]} and {e.offsets[1]}") from None
    top = max((o + r.size for o, r in zip(offsets, life.reqs)), default=0)
    if top > plan.arena_bytes:
        raise PlanError(f"buffers reach byte {top} but the arena has {plan.arena_bytes}")
    for b in plan.buffers:  # those no step uses too: the executor cuts a view for every buffer
        if any(o + b.nbytes > plan.arena_bytes for o in b.offsets):
            raise PlanError(f"buffer {b.id} at offsets {list(b.offsets)} reaches byte {max(b.offsets) + b.nbytes} "
                            f"but the arena has {plan.arena_bytes}")
    bound = max(lower_bound(life.reqs), concurrent_lower_bound(plan, life))
    if plan.arena_bytes < bound:  # cannot happen without an overlap; kept as the stated invariant
        raise PlanError(f"arena {plan.arena_bytes} is below the lower bound {bound}")
    return CheckReport(plan.arena_bytes, bound, max(life.step_scratch, default=0), len(life.step_scratch))


def _check_sanity(plan: Plan, graphs: Sequence[Graph]) -> None:
    """What must hold before anything is sized from the plan's numbers."""
    from tightfit.graph.ir import DTYPE_BYTES

    size = DTYPE_BYTES.get(plan.dtype)
    if size is None:
        raise PlanError(f"plan dtype {plan.dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    for m, (ref, g) in enumerate(zip(plan.models, graphs)):
        named = tuple((t, tuple(g.shape(t))) for t in g.inputs) if len(g.inputs) > 1 else ()
        if tuple(ref.input_shape) != tuple(g.shape(g.inputs[0])) or ref.inputs != named or not 1 <= ref.batch <= 4096:
            raise PlanError(f"model {m}: input shape {ref.input_shape} or batch {ref.batch} does not fit {ref.spec!r}")
    # No buffer needs more than every tensor of every model together (a sanity bound that keeps a
    # malformed file from sizing huge arrays).
    largest = sum(t.nbytes(plan.dtype, ref.batch) for ref, g in zip(plan.models, graphs) for t in g.tensors.values())
    # A float tensor takes the plan's dtype, a quantized one its own (int8 tensors are 1 byte).
    items = {t.item_bytes(plan.dtype) for g in graphs for t in g.tensors.values()}
    total = 0
    for i, b in enumerate(plan.buffers):
        if b.id != i:
            raise PlanError(f"buffer {i} has id {b.id}")
        if b.itemsize not in items:
            raise PlanError(f"buffer {i} has itemsize {b.itemsize}, not one of its tensors' ({', '.join(map(str, sorted(items)))})")
        if not b.offsets or any(o < 0 or o % b.itemsize for o in b.offsets):
            raise PlanError(f"buffer {i} has a bad offset list {b.offsets} (non-negative multiples of {b.itemsize})")
        if not b.shape or any(d < 1 for d in b.shape) or b.nbytes > largest:
            raise PlanError(f"buffer {i} has shape {b.shape}, larger than all the models' tensors together")
        total += b.nbytes * b.copies
    _check_overlays(plan)
    # The offset planners' arena is at most the buffer copies side by side, each rounded up to
    # 64 bytes (naive placement); a plan may waste as much again, no more: a larger arena or
    # offset (which the executor would allocate) is a tampered number.
    bound = 2 * sum(-(-b.nbytes // 64) * 64 * b.copies for b in plan.buffers)
    if plan.arena_bytes < 0 or plan.arena_bytes > bound:
        raise PlanError(f"arena of {plan.arena_bytes} bytes does not fit its buffers (at most {bound} bytes, twice "
                        f"their copies side by side)")



def _check_ids(plan: Plan) -> None:
    """Partition ids are their positions; concurrent sets name known partitions, each once."""
    for i, p in enumerate(plan.partitions):
        if p.id != i:
            raise PlanError(f"partition {i} has id {p.id}")
    seen: set[int] = set()
    for group in plan.concurrent:
        for pid in group:
            if not 0 <= pid < len(plan.partitions):
                raise PlanError(f"concurrent set {list(group)} names unknown partition {pid} (0-{len(plan.partitions) - 1})")
            if pid in seen:
                raise PlanError(f"partition {pid} is named twice in the concurrent sets {[list(g) for g in plan.concurrent]}")
            seen.add(pid)


def _check_scratch(plan: Plan, graphs: Sequence[Graph]) -> None:
    """Each step's `scratch` is what its op's kernels allocate (`workspace_bytes` of the torch
    model, the output view dense or not, channels-last or not: the planners' choices), an input
    step's what its row-band source holds (techniques/tiling/planner.py), a copy's nothing: a tampered figure
    would misstate the analysed memory and the limit `run --enforce` derives from it."""
    from tightfit.graph.ir import DTYPE_BYTES

    size = DTYPE_BYTES[plan.dtype]
    for k, s in enumerate(plan.steps()):
        g, batch = graphs[s.model], plan.models[s.model].batch
        if s.kind == "compute":
            layer = g.layers[s.layer]
            in_shapes = [(batch,) + g.shape(t)[1:] for t in layer.inputs]
            out_shape = (batch,) + g.shape(layer.output)[1:]
            allowed = set()
            for channels_last, dense in ((True, True), (True, False), (False, True), (False, False)):
                allowed.add(step_workspace(layer, s.out.region, in_shapes, out_shape, size, "none", dense, channels_last))
                if s.scratch in allowed:
                    break
        elif s.kind == "input":
            shape = g.shape(s.out.tensor)
            buffer = plan.buffers[s.out.buffer]
            row_band = 2 * s.out.region.n * shape[1] * spatial(shape)[1] * buffer.itemsize  # an int8 input: 1 B a value
            allowed = {0, row_band * min(s.out.region.h, max(1, buffer.nbytes // (2 * row_band)))}
        else:
            allowed = {0}
        if s.scratch not in allowed:
            raise PlanError(f"step {k} ({_describe(graphs, s)}) states {s.scratch} bytes of scratch; its kernels allocate "
                            f"{' or '.join(map(str, sorted(allowed)))}")


def _check_overlays(plan: Plan) -> None:
    """An overlay names another buffer, lies where it says, and keeps to what the simulation
    tags cell by cell (plan/overlay.py); links form no cycle."""
    n = len(plan.buffers)
    for b in plan.buffers:
        if b.overlay is None:
            continue
        if plan.concurrent:
            raise PlanError(f"buffer {b.id} overlays another, but overlays need partitions that run one after another")
        host, shift = b.overlay
        if not 0 <= host < n or host == b.id:
            raise PlanError(f"buffer {b.id} overlays unknown buffer {host}")
        h = plan.buffers[host]
        hops, root = 0, h
        while root.overlay is not None:
            hops += 1
            if hops > n:
                raise PlanError(f"buffer {b.id}: its overlays form a cycle")
            root = plan.buffers[root.overlay[0]]
        if not (eligible(b) and eligible(h)) or b.itemsize != h.itemsize or shift % shared_cell_bytes((b, h)):
            raise PlanError(f"buffer {b.id} overlays buffer {host}: both must be whole, one sample, channels-last, of one "
                            f"element size, {shift} bytes apart in whole cells of their channels' common divisor")
        if b.offsets[0] != h.offsets[0] + shift:
            raise PlanError(f"buffer {b.id} overlays buffer {host} at {shift} bytes but lies at {b.offsets[0] - h.offsets[0]}")


def _check_partitions(plan: Plan, graphs: Sequence[Graph]) -> None:
    for p in plan.partitions:
        if not 0 <= p.model < len(graphs):
            raise PlanError(f"partition {p.id} names unknown model {p.model}")
        computed = set()
        for st in p.steps:
            if st.model != p.model:
                raise PlanError(f"partition {p.id} of model {p.model} holds a step of model {st.model}")
            if st.kind == "compute":
                computed.add(st.layer)
        if computed != set(p.layers):
            raise PlanError(f"partition {p.id} lists layers {sorted(p.layers)[:8]} but computes {sorted(computed)[:8]}")


def _check_access(plan: Plan, graph: Graph, a: Access, where: str, empty_ok: bool = False) -> None:
    """`empty_ok`: the region may hold no rows or columns (a compute step's input window that
    lies wholly in the padding, e.g. a Pad's band of padding rows)."""
    if not 0 <= a.buffer < len(plan.buffers):
        raise PlanError(f"{where}: unknown buffer {a.buffer}")
    if a.tensor not in graph.tensors:
        raise PlanError(f"{where}: unknown tensor {a.tensor!r}")
    b = plan.buffers[a.buffer]
    shape = graph.shape(a.tensor)
    if len(b.shape) != len(shape) or (len(shape) == 4 and b.shape[1] != shape[1]) or (len(shape) != 4 and tuple(b.shape[1:]) != tuple(shape[1:])):
        raise PlanError(f"{where}: buffer {a.buffer} of shape {b.shape} cannot hold {a.tensor!r} of shape {shape}")
    r = a.region
    h, w = spatial(shape)
    empty = r.n <= 0 or r.h < 0 or r.w < 0 or (not empty_ok and r.is_empty())
    if empty or r.n0 < 0 or r.h0 < 0 or r.w0 < 0 or r.h1 > h or r.w1 > w or r.h0 > h or r.w0 > w:
        raise PlanError(f"{where}: region {_fmt(r)} outside tensor {a.tensor!r}")
    bh, bw = spatial(b.shape)
    n, hh, ww = a.at
    if n < 0 or hh < 0 or ww < 0 or n + r.n > b.shape[0] or hh + r.h > bh or ww + r.w > bw:
        raise PlanError(f"{where}: region {_fmt(r)} at {a.at} does not fit buffer {a.buffer} of shape {b.shape}")


def _fmt(r: Region) -> str:
    return f"n[{r.n0},{r.n1}) h[{r.h0},{r.h1}) w[{r.w0},{r.w1})"


def _check_steps(plan: Plan, graphs: Sequence[Graph]) -> None:
    for k, s in enumerate(plan.steps()):
        if not 0 <= s.model < len(graphs):
            raise PlanError(f"step {k}: unknown model {s.model}")
        g = graphs[s.model]
        batch = plan.models[s.model].batch
        where = f"step {k}"
        for a in (s.out, *s.inputs):
            _check_access(plan, g, a, where, empty_ok=s.kind == "compute" and a is not s.out)
            item = g.tensors[a.tensor].item_bytes(plan.dtype) if a.tensor in g.tensors else None
            if item is not None and plan.buffers[a.buffer].itemsize != item:
                raise PlanError(f"{where}: tensor {a.tensor!r} has {item}-byte elements, its buffer {a.buffer} "
                                f"{plan.buffers[a.buffer].itemsize}-byte ones")
            if a.region.n1 > batch:
                raise PlanError(f"{where}: samples {a.region.n0}-{a.region.n1} beyond batch {batch}")
        if s.kind == "input":
            if s.out.tensor not in g.inputs or s.inputs:
                raise PlanError(f"{where}: an input step must write the model input and read nothing")
        elif s.kind == "output":
            if s.out.tensor not in g.outputs or s.inputs != (s.out,) or len(g.shape(s.out.tensor)) != 4:
                raise PlanError(f"{where}: an output step hands over a region of a 4-d model output it reads (inputs == (out,))")
        elif s.kind == "copy":
            if len(s.inputs) != 1 or s.inputs[0].tensor != s.out.tensor or s.inputs[0].region != s.out.region:
                raise PlanError(f"{where}: a copy step moves one region of one tensor")
        else:
            _check_compute(g, s, where)


def _check_compute(g: Graph, s: Step, where: str) -> None:
    if not 0 <= s.layer < len(g.layers):
        raise PlanError(f"{where}: unknown layer {s.layer}")
    layer = g.layers[s.layer]
    if s.out.tensor != layer.output or tuple(a.tensor for a in s.inputs) != layer.inputs:
        raise PlanError(f"{where}: layer {s.layer} ({layer.name}) reads {layer.inputs} and writes {layer.output!r}")
    op = get_op(layer.op)
    in_shapes = [g.shape(t) for t in layer.inputs]
    h, w = spatial(g.shape(layer.output))
    if not op.splittable and (s.out.region.h, s.out.region.w) != (h, w):
        if not op.splits_rows(layer, in_shapes, g.shape(layer.output)):
            raise PlanError(f"{where}: layer {s.layer} ({layer.op}) needs whole samples")
        if s.out.region.w != w:
            raise PlanError(f"{where}: layer {s.layer} ({layer.op}) needs whole rows")
    for a, win in zip(s.inputs, op.input_windows(layer, s.out.region, in_shapes)):
        if a.region != win.region:
            raise PlanError(f"{where}: layer {s.layer} ({layer.name}) needs {_fmt(win.region)} of {a.tensor!r}, the plan reads {_fmt(a.region)}")


class _Cells:
    """Per buffer copy 0: which tensor element (n, h, w) each cell holds (-1: nothing valid). A
    cell is one position's channels, or in an overlay block the common divisor of its members'
    channel counts (a position of a member then spans several cells, all tagged alike)."""

    def __init__(self, plan: Plan):
        self.tags = {}
        positions = block_positions(plan.buffers)
        extent: dict[int, tuple[int, int]] = {}  # block root -> lowest, highest byte
        members: dict[int, list[Buffer]] = {}
        for b, (root, pos) in positions.items():
            lo, hi = extent.get(root, (pos, pos))
            extent[root] = (min(lo, pos), max(hi, pos + plan.buffers[b].nbytes))
            members.setdefault(root, []).append(plan.buffers[b])
        cell = {root: shared_cell_bytes(bs) for root, bs in members.items()}
        blocks = {root: np.full((4, (hi - lo) // cell[root]), -1, dtype=np.int64) for root, (lo, hi) in extent.items()}
        # Cell ids, unique across the plan: equal ids are the same bytes (a step's output over its
        # own input is proven by plan/walks.py from them).
        self.ids, self.root, first = {}, {}, 0
        block_ids = {}
        for root, arr in blocks.items():
            block_ids[root] = np.arange(first, first + arr.shape[1], dtype=np.int64)
            first += arr.shape[1]
        for b in plan.buffers:
            h, w = spatial(b.shape)
            if b.id in positions:
                # Members of an overlay block view one array of cells, as they share the arena.
                root, pos = positions[b.id]
                start, per_position = (pos - extent[root][0]) // cell[root], b.shape[1] * b.itemsize // cell[root]
                self.tags[b.id] = blocks[root][:, start : start + h * w * per_position].reshape(4, 1, h, w, per_position)
                self.ids[b.id] = block_ids[root][start : start + h * w * per_position].reshape(1, h, w, per_position)
                self.root[b.id] = root
            else:
                self.tags[b.id] = np.full((4, b.shape[0], h, w, 1), -1, dtype=np.int64)
                self.ids[b.id] = np.arange(first, first + b.shape[0] * h * w, dtype=np.int64).reshape(b.shape[0], h, w, 1)
                first += b.shape[0] * h * w
                self.root[b.id] = b.id

    def view(self, a: Access) -> np.ndarray:
        n, h, w = a.at
        r = a.region
        return self.tags[a.buffer][:, n : n + r.n, h : h + r.h, w : w + r.w]

    def id_view(self, a: Access) -> np.ndarray:
        n, h, w = a.at
        r = a.region
        return self.ids[a.buffer][n : n + r.n, h : h + r.h, w : w + r.w]


def _expected(tid: int, r: Region) -> np.ndarray:
    """The tags of region r of tensor tid, with a trailing axis of one that spans a position's cells."""
    n, h, w = np.meshgrid(np.arange(r.n0, r.n1), np.arange(r.h0, r.h1), np.arange(r.w0, r.w1), indexing="ij")
    return np.stack([np.full_like(n, tid), n, h, w])[..., None]


def _simulate(plan: Plan, graphs: Sequence[Graph]) -> None:
    cells = _Cells(plan)
    ids: dict[tuple[int, str], int] = {}
    written: dict[int, np.ndarray] = {}
    handed: dict[tuple[int, str], np.ndarray] = {}  # a streamed output: how often each element left
    for k, s in enumerate(plan.steps()):
        if s.kind == "compute":
            _check_own_overlap(plan, graphs, cells, k, s)
        for a in s.inputs:
            tid = ids.get((s.model, a.tensor), -2)
            if not (cells.view(a) == _expected(tid, a.region)).all():
                raise PlanError(f"step {k} ({_describe(graphs, s)}) reads {_fmt(a.region)} of {a.tensor!r} from buffer "
                                f"{a.buffer} at {a.at}, but those cells do not hold it (overwritten or never written)")
        if s.kind == "output":
            shape = (plan.models[s.model].batch,) + spatial(graphs[s.model].shape(s.out.tensor))
            r = s.out.region
            handed.setdefault((s.model, s.out.tensor), np.zeros(shape, dtype=np.int32))[r.n0 : r.n1, r.h0 : r.h1, r.w0 : r.w1] += 1
            continue
        tid = ids.setdefault((s.model, s.out.tensor), len(ids))
        cells.view(s.out)[...] = _expected(tid, s.out.region)
        shape = graphs[s.model].shape(s.out.tensor)
        mask = written.setdefault(tid, np.zeros((plan.models[s.model].batch,) + spatial(shape), dtype=bool))
        r = s.out.region
        mask[r.n0 : r.n1, r.h0 : r.h1, r.w0 : r.w1] = True
    for m, g in enumerate(graphs):
        for t in list(g.inputs) + [l.output for l in g.layers]:
            tid = ids.get((m, t))
            if tid is None or not written[tid].all():
                raise PlanError(f"plan does not compute all of {t!r} (model {m})")
    for (m, t), count in handed.items():
        if not (count == 1).all():
            raise PlanError(f"output {t!r} (model {m}) is streamed, but not every element is handed over exactly once")
    for m, a in output_accesses(plan, graphs):
        if not (cells.view(a) == _expected(ids[(m, a.tensor)], a.region)).all():
            raise PlanError(f"output {a.tensor!r} is overwritten before the run ends")


def _check_own_overlap(plan: Plan, graphs: Sequence[Graph], cells: _Cells, k: int, s: Step) -> None:
    """A step whose output shares bytes with one of its inputs (in place, or overlaid at an
    offset) must have a kernel whose walk never writes over input bytes it still reads."""
    out_root = cells.root[s.out.buffer]
    if all(cells.root[a.buffer] != out_root for a in s.inputs):
        return
    in_ids = [cells.id_view(a) if cells.root[a.buffer] == out_root else None for a in s.inputs]
    g = graphs[s.model]
    bad = own_overlap_error(g, s, plan.models[s.model].batch, cells.id_view(s.out), in_ids)
    if bad is not None:
        layer = g.layers[s.layer]
        raise PlanError(f"step {k}: layer {s.layer} ({layer.name}, {layer.op}) writes over the input cells it reads "
                        f"(of {bad!r}) before its kernel is done reading them (ops/walks.py: {', '.join(sorted(kernel_walks(g, layer))) or 'no overlap'})")


def _describe(graphs: Sequence[Graph], s: Step) -> str:
    if s.kind == "compute":
        return f"layer {s.layer} {graphs[s.model].layers[s.layer].name}"
    return s.kind
