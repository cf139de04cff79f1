"""Lifetimes: when each part of a plan's memory holds data, from the steps themselves. One module
for the checker (plan/check.py), the overlay pass (plan/overlay.py), placement and the planners.

- buffer copies: first to last access, model outputs to the end (`lifetimes`), as requests for
  the offset planner, with the conflicts of partitions that run at the same time;
- overlay blocks: buffers linked by overlays are one request (`block_positions`);
- rows of a buffer: first to last step touching each row (`row_lifetimes`), what an overlay may
  share.
Tensors in a layer order (no plan yet) are the IR's query: graph.ir.last_reads.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Sequence

from tightfit.graph.ir import Graph, last_reads
from tightfit.ops.base import Region
from tightfit.plan.offsets import BufferReq
from tightfit.plan.schema import Access, Buffer, Partition, Plan, PlanError
from tightfit.plan.walks import rows_times


@dataclass(frozen=True)
class Lifetimes:
    """Per buffer copy: (buffer id, copy) -> request; plus extra conflicts between requests."""

    keys: tuple[tuple[int, int], ...]
    reqs: tuple[BufferReq, ...]
    extra: tuple[tuple[int, int], ...]
    step_scratch: tuple[int, ...]
    # Per key: where its request starts, in bytes from the buffer's offset (an overlay block's
    # request, keyed by its root, may start below the root: plan/overlay.py).
    starts: tuple[int, ...] = ()

    def arena_offsets(self, plan: Plan) -> list[int]:
        """Each request's offset in the arena, as the plan places it."""
        starts = self.starts or (0,) * len(self.keys)
        return [plan.buffers[b].offsets[c] + s for (b, c), s in zip(self.keys, starts)]

    def live_bytes(self) -> list[int]:
        """Bytes of the buffer copies live at each step (first to last use), scratch excluded."""
        n = len(self.step_scratch)
        delta = [0] * (n + 1)
        for r in self.reqs:
            delta[r.first_use] += r.size
            delta[r.last_use + 1] -= r.size
        out, total = [], 0
        for d in delta[:n]:
            total += d
            out.append(total)
        return out


def step_partitions(plan: Plan) -> list[int]:
    return [p.id for p in plan.partitions for _ in p.steps]


def streamed_outputs(plan: Plan) -> set[tuple[int, str]]:
    """(model, tensor) of the model outputs the plan hands to the caller by rows ('output' steps):
    the arena never holds them whole, and they live only until their last rows are handed over."""
    return {(s.model, s.out.tensor) for s in plan.steps() if s.kind == "output"}


def output_accesses(plan: Plan, graphs: Sequence[Graph]) -> list[tuple[int, Access]]:
    """(model, access of the whole tensor) for every model output the caller reads from the arena
    after the run (a streamed one is not: streamed_outputs). An output written by several steps
    (row bands) must land in one buffer with one index map, so that together the bands form the
    whole tensor there."""
    writes: dict[tuple[int, str], list[Access]] = {}
    for s in plan.steps():
        writes.setdefault((s.model, s.out.tensor), []).append(s.out)
    streamed = streamed_outputs(plan)
    out = []
    for m, g in enumerate(graphs):
        for t in g.outputs:
            if (m, t) in streamed:
                continue
            if (m, t) not in writes:
                raise PlanError(f"plan never writes output {t!r} of model {m}")
            accesses = writes[(m, t)]
            first = accesses[0]
            shift = tuple(at - r for at, r in zip(first.at, (first.region.n0, first.region.h0, first.region.w0)))
            for a in accesses:
                if a.buffer != first.buffer or tuple(at - r for at, r in zip(a.at, (a.region.n0, a.region.h0, a.region.w0))) != shift:
                    raise PlanError(f"output {t!r} is written to different places; the caller needs it whole in one buffer")
            whole = Region.whole(g.shape(t), plan.models[m].batch)
            out.append((m, Access(t, first.buffer, whole, (whole.n0 + shift[0], whole.h0 + shift[1], whole.w0 + shift[2]))))
    return out


def lifetimes(plan: Plan, graphs: Sequence[Graph], conflicts: bool = True) -> Lifetimes:
    """Per buffer copy, first to last use (model outputs to the end); `conflicts=False` skips
    the concurrency conflicts (a search that only reads live bytes does not need them)."""
    steps = plan.steps()
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, s in enumerate(steps):
        for a in (s.out, *s.inputs):
            first.setdefault(a.buffer, i)
            last[a.buffer] = i
    end = max(len(steps) - 1, 0)
    for _, a in output_accesses(plan, graphs):
        last[a.buffer] = end
    positions = block_positions(plan.buffers)
    blocks = _blocks(plan, positions, first, last)
    keys, reqs, starts = [], [], []
    for b in plan.buffers:
        if b.id in blocks:
            lo, hi, f, l = blocks[b.id]
            keys.append((b.id, 0))
            reqs.append(BufferReq(hi - lo, f, l))
            starts.append(lo)
            continue
        if b.id not in first or b.id in positions:
            continue
        for c in range(b.copies):
            keys.append((b.id, c))
            reqs.append(BufferReq(b.nbytes, first[b.id], last[b.id]))
            starts.append(0)
    extra = _concurrency_conflicts(plan, keys) if conflicts else ()
    return Lifetimes(tuple(keys), tuple(reqs), extra, tuple(s.scratch for s in steps), tuple(starts))


def _blocks(plan: Plan, positions: dict[int, tuple[int, int]], first: dict[int, int],
            last: dict[int, int]) -> dict[int, tuple[int, int, int, int]]:
    """Per overlay block root: (lowest byte, highest byte, first use, last use) of its used
    members, positions from the root's offset."""
    out: dict[int, tuple[int, int, int, int]] = {}
    for b, (root, pos) in positions.items():
        if b not in first:
            continue
        lo, hi, f, l = out.get(root, (pos, pos, first[b], last[b]))
        out[root] = (min(lo, pos), max(hi, pos + plan.buffers[b].nbytes), min(f, first[b]), max(l, last[b]))
    return out


def buffer_users(partitions: Sequence[Partition]) -> dict[int, set[int]]:
    """buffer id -> ids of the partitions whose steps access it."""
    users: dict[int, set[int]] = {}
    for p in partitions:
        for st in p.steps:
            for a in (st.out, *st.inputs):
                users.setdefault(a.buffer, set()).add(p.id)
    return users


def _concurrency_conflicts(plan: Plan, keys: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Copies of one buffer never share; nor do two buffers when some partition using one runs
    at the same time as some other partition using the other."""
    users = buffer_users(plan.partitions)
    partners: dict[int, set[int]] = {}
    for group in plan.concurrent:
        for p in group:
            partners.setdefault(p, set()).update(q for q in group if q != p)
    reach = {b: set().union(*(partners.get(p, set()) for p in u)) for b, u in users.items()}
    by_buffer: dict[int, list[int]] = {}
    for i, (b, _) in enumerate(keys):
        by_buffer.setdefault(b, []).append(i)
    extra: set[tuple[int, int]] = set()
    for b, idx in by_buffer.items():
        extra.update((x, y) for k, x in enumerate(idx) for y in idx[k + 1 :])
        if reach.get(b):  # the relation is symmetric: each pair is found from both buffers
            for other, idx_other in by_buffer.items():
                if other != b and reach[b] & users.get(other, set()):
                    extra.update((min(x, y), max(x, y)) for x in idx for y in idx_other)
    return tuple(sorted(extra))


def block_positions(buffers: Sequence[Buffer]) -> dict[int, tuple[int, int]]:
    """Buffer id -> (block root id, bytes from the root's offset), for buffers in overlays."""
    out: dict[int, tuple[int, int]] = {}
    for b in buffers:
        if b.overlay is None:
            continue
        root, pos, seen = b.id, 0, set()
        while buffers[root].overlay is not None and root not in seen:
            seen.add(root)
            host, shift = buffers[root].overlay
            root, pos = host, pos + shift
        out[b.id] = (root, pos)
        out.setdefault(root, (root, 0))
    return out


def row_lifetimes(plan: Plan, graphs: Sequence[Graph], eligible: Callable[[Buffer], bool],
                  within_steps: bool = False) -> dict[int, list[tuple[int, int]]]:
    """Per `eligible` buffer used by the steps: per row, (first time, last time touching it) (a
    partial row counts whole); rows never used get an empty lifetime. Model outputs are read at
    the end. Times are steps; `within_steps`: steps * STEP_TIMES plus the time inside the step
    (plan/walks.py) where the kernel's walk gives one (a step's output rows then may take input
    rows it is done reading), else a step's writes at its start and reads at its end."""
    steps = plan.steps()
    scale = _step_times(plan) if within_steps else 1
    out: dict[int, list[list[int]]] = {}
    end = len(steps) * scale

    def touch(a, rows: Callable[[int], int]) -> None:
        b = plan.buffers[a.buffer]
        if not eligible(b):
            return
        life = out.setdefault(a.buffer, [[end, -1] for _ in range(b.shape[2])])
        for h in range(a.at[1], a.at[1] + a.region.h):
            t = rows(h)
            life[h][0] = min(life[h][0], t)
            life[h][1] = max(life[h][1], t)

    for i, s in enumerate(steps):
        base = i * scale
        times = rows_times(graphs[s.model], s, plan.models[s.model].batch) if within_steps and s.kind == "compute" else None
        for k, a in enumerate(s.inputs):
            # a row no window reads (a 1x1 stride-2 conv's odd rows) lives through the step, as the
            # checker (walks._rows) takes it: never written over by the step's own output
            touch(a, (lambda h, m=times[1][k]: base + m.get(h, scale - 1)) if times else (lambda h: base + scale - 1))
        touch(s.out, (lambda h: base + times[0][h]) if times else (lambda h: base))
    for _, a in output_accesses(plan, graphs):
        touch(a, lambda h: end)
    return {b: [(w, l) for w, l in life] for b, life in out.items()}


def _step_times(plan: Plan) -> int:
    """Times per step inside it (plan/walks.py: 2 per output row and 3 more)."""
    return 2 * max((s.out.region.h for s in plan.steps()), default=1) + 3


def tensor_last_use(graph: Graph) -> dict[str, int]:
    """tensor -> id of its last consumer in the imported order (a graph output: one past the
    last layer, it lives to the end)."""
    last = dict(last_reads(graph))
    for t in graph.outputs:
        last[t] = len(graph.layers)
    return last


def buffer_tensors(plan: Plan) -> dict[int, tuple[int, str]]:
    """buffer id -> (model, tensor) of the first access to it in step order."""
    out: dict[int, tuple[int, str]] = {}
    for s in plan.steps():
        for a in (s.out,) + s.inputs:
            out.setdefault(a.buffer, (s.model, a.tensor))
    return out


def live_at(life: Lifetimes, steps: Collection[int]) -> list[tuple[tuple[int, int], BufferReq]]:
    """The (buffer, copy) keys and requests of the buffers live at any of `steps`."""
    lo, hi = (min(steps), max(steps)) if steps else (0, -1)
    return [(k, r) for k, r in zip(life.keys, life.reqs)
            if r.first_use <= hi and r.last_use >= lo and any(r.first_use <= i <= r.last_use for i in steps)]
