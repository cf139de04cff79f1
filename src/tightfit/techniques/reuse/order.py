"""Memory-aware topological ordering of a CNN's layers.

Follows Serenity (Ahn et al., MLSys 2020).  The set of already-scheduled
layers fully determines which tensors are live, so the search runs over
scheduled sets and memoises, per set, a proven lower bound on the best peak
any completion from it can reach.  Like Serenity:

* divide and conquer first: wherever every topological order must finish
  one group of layers before starting the next (typically at the single
  tensor between two inception/residual blocks) the groups are independent
  and each is solved on its own, so long chains of blocks stay cheap;
* "peak so far" pruning against a bound tau, and adaptive budgeting of
  tau: starting from the greedy/imported order's peak, probes bisect tau
  between the best order found and the best proven lower bound.  Each probe
  is a depth-first pass (ready nodes in ascending id, so a success is the
  lexicographically smallest order under tau) that shares the memo with
  every earlier probe;
* a state budget caps the work; past it a segment keeps the best order
  found so far, never worse than the greedy or the imported order.

Memory model (see :class:`OrderModel`): while node ``v`` runs, memory is the
bytes of every tensor that is already produced and still needed (by a
not-yet-run consumer, ``v`` included, or because it is a model output), plus
``v``'s own output, plus the model inputs while any of their consumers is
still to run, plus ``scratch[v]``.  A tensor is freed right after its last
consumer runs.  ``peak(order)`` is the maximum over the steps.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

__all__ = [
    "OrderModel",
    "greedy_order",
    "identity_order",
    "is_topological",
    "memory_order",
    "peak_of_order",
    "step_memories",
]


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class OrderModel:
    """A layer DAG reduced to what matters for the peak-memory of an order.

    ``deps[i]``: the nodes whose tensors node ``i`` reads (ids in ``0..n-1``,
    any order, must form a DAG).  ``out_bytes[i]``: size of node ``i``'s
    output tensor.  ``scratch[i]``: workspace bytes while ``i`` runs.
    ``graph_inputs_bytes``: total size of the model inputs, live until the
    last node in ``input_consumers`` has run (never live if that is empty).
    ``outputs``: nodes whose tensors are model outputs and live to the end.
    """

    deps: tuple[tuple[int, ...], ...]
    out_bytes: tuple[int, ...]
    scratch: tuple[int, ...]
    graph_inputs_bytes: int = 0
    input_consumers: tuple[int, ...] = ()
    outputs: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        # Normalise to immutable tuples so the model is hashable and safe to share.
        fix = object.__setattr__
        fix(self, "deps", tuple(tuple(int(u) for u in d) for d in self.deps))
        fix(self, "out_bytes", tuple(int(b) for b in self.out_bytes))
        fix(self, "scratch", tuple(int(b) for b in self.scratch))
        fix(self, "graph_inputs_bytes", int(self.graph_inputs_bytes))
        fix(self, "input_consumers", tuple(int(v) for v in self.input_consumers))
        fix(self, "outputs", frozenset(int(v) for v in self.outputs))
        _validate(self)

    @property
    def n(self) -> int:
        return len(self.deps)


def _validate(m: OrderModel) -> None:
    n = m.n
    if len(m.out_bytes) != n or len(m.scratch) != n:
        raise ValueError("deps, out_bytes and scratch must have the same length")
    if min(m.out_bytes + m.scratch + (m.graph_inputs_bytes,)) < 0:
        raise ValueError("byte sizes must be non-negative")
    for v, ds in enumerate(m.deps):
        for u in ds:
            if not 0 <= u < n or u == v:
                raise ValueError(f"node {v} has invalid dependency {u}")
    for v in (*m.input_consumers, *m.outputs):
        if not 0 <= v < n:
            raise ValueError(f"node id {v} out of range")
    if len(identity_order(m)) != n:
        raise ValueError("deps contain a cycle")


def _consumers(m: OrderModel) -> tuple[tuple[int, ...], ...]:
    cons: list[list[int]] = [[] for _ in range(m.n)]
    for v, ds in enumerate(m.deps):
        for u in sorted(set(ds)):
            cons[u].append(v)
    return tuple(tuple(c) for c in cons)


def _node_floor(m: OrderModel, v: int) -> int:
    """Memory no order can avoid while v runs: its inputs, its output and
    its scratch are resident whatever the order."""
    inputs = m.graph_inputs_bytes if v in m.input_consumers else 0
    return m.out_bytes[v] + m.scratch[v] + sum(m.out_bytes[u] for u in set(m.deps[v])) + inputs


def _static_lower_bound(m: OrderModel) -> int:
    return max((_node_floor(m, v) for v in range(m.n)), default=0)


# --------------------------------------------------------------------------
# Reference evaluation (the single definition of memory used everywhere)
# --------------------------------------------------------------------------


def is_topological(model: OrderModel, order: Sequence[int]) -> bool:
    """True iff ``order`` is a permutation of all nodes with deps first."""
    if len(order) != model.n or set(order) != set(range(model.n)):
        return False
    pos = {v: k for k, v in enumerate(order)}
    return all(pos[u] < pos[v] for v in range(model.n) for u in model.deps[v])


def step_memories(model: OrderModel, order: Sequence[int]) -> tuple[int, ...]:
    """Bytes resident while each node of ``order`` runs (straight from the
    definition; deliberately independent of the search's incremental code)."""
    if not is_topological(model, order):
        raise ValueError("order is not a topological order of the model")
    pending = [len(c) for c in _consumers(model)]
    inp_users = set(model.input_consumers)
    inp_live = model.graph_inputs_bytes if inp_users else 0
    live, steps = 0, []
    for v in order:
        steps.append(live + inp_live + model.out_bytes[v] + model.scratch[v])
        for u in set(model.deps[v]):
            pending[u] -= 1
            if pending[u] == 0 and u not in model.outputs:
                live -= model.out_bytes[u]
        inp_users.discard(v)
        if not inp_users:
            inp_live = 0
        if pending[v] or v in model.outputs:
            live += model.out_bytes[v]
    return tuple(steps)


def peak_of_order(model: OrderModel, order: Sequence[int]) -> int:
    """Peak resident bytes of running the model in ``order``."""
    return max(step_memories(model, order), default=0)


# --------------------------------------------------------------------------
# Compiled (bitmask) form of a segment, used by the greedy and the search
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Seg:
    """Nodes of one segment with local bit indices (ascending global id, so
    ascending bit == preferred tie-break).  Everything scheduled before the
    segment is folded into ``live0``."""

    nodes: tuple[int, ...]
    cost: tuple[int, ...]  # out + scratch: added to live bytes while running
    keep: tuple[int, ...]  # out if the tensor outlives its own step, else 0
    need: tuple[int, ...]  # local mask of in-segment dependencies
    succ: tuple[tuple[int, ...], ...]
    frees: tuple[tuple[tuple[int, int], ...], ...]  # (consumer mask, bytes)
    settle: tuple[tuple[tuple[int, int], ...], ...]  # (consumer mask, bytes)
    live0: int
    held0: int
    ready0: int
    by_floor: tuple[tuple[int, int], ...]  # (node floor, bit), largest first
    by_cost: tuple[int, ...]  # costs ascending ...
    cost_bits: tuple[int, ...]  # ... the node bit of each ...
    cost_prefix: tuple[int, ...]  # ... and the mask of the k cheapest nodes

    @property
    def full(self) -> int:
        return (1 << len(self.nodes)) - 1


@dataclass(frozen=True)
class _Layout:
    """Positions in one topological order: whether a node runs before/within
    a segment is then a comparison (segments are position ranges)."""

    cons: tuple[tuple[int, ...], ...]
    pos: tuple[int, ...]
    last_use: tuple[int, ...]  # position of a node's last consumer (-1: none)

    @staticmethod
    def of(m: OrderModel, topo: Sequence[int]) -> _Layout:
        cons = _consumers(m)
        pos = [0] * m.n
        for k, v in enumerate(topo):
            pos[v] = k
        last = tuple(max((pos[w] for w in c), default=-1) for c in cons)
        return _Layout(cons, tuple(pos), last)


def _compile(m: OrderModel, lay: _Layout, start: int, end: int,
             nodes: Iterable[int], live_before: Iterable[int]) -> _Seg:
    """Compile the nodes at positions [start, end); ``live_before``: the
    produced tensors still resident when the segment starts."""
    cons, pos, last_use = lay.cons, lay.pos, lay.last_use
    nodes = tuple(sorted(nodes))
    local = {v: i for i, v in enumerate(nodes)}
    live_before = tuple(live_before)

    def lmask(vs: Iterable[int]) -> int:
        return sum(1 << local[w] for w in set(vs) if w in local)

    def sticky(u: int) -> bool:  # resident until the segment ends once produced
        return m.out_bytes[u] > 0 and (u in m.outputs or last_use[u] >= end)

    inp_users = frozenset(m.input_consumers) if m.graph_inputs_bytes else frozenset()
    inp_last = max((pos[v] for v in inp_users), default=-1)
    cost, keep, need, succ, frees, settle = [], [], [], [], [], []
    for v in nodes:
        ds = sorted(set(m.deps[v]))
        cost.append(m.out_bytes[v] + m.scratch[v])
        keep.append(m.out_bytes[v] if cons[v] or v in m.outputs else 0)
        need.append(lmask(ds))
        succ.append(tuple(sorted(local[w] for w in cons[v] if w in local)))
        # Only tensors whose every consumer lies in/before this segment can be
        # freed here; the sticky rest stay resident for the whole segment.
        frees.append(tuple(
            [(lmask(cons[u]), m.out_bytes[u]) for u in ds if not sticky(u) and m.out_bytes[u]]
            + ([(lmask(inp_users), m.graph_inputs_bytes)]
               if v in inp_users and inp_last < end else [])))
        # A sticky tensor no remaining node reads is dead weight on every later
        # step; tracking it gives the search a cheap lower bound.
        settle.append(tuple(
            [(lmask(cons[u]), m.out_bytes[u]) for u in ds if sticky(u)]
            + ([(0, m.out_bytes[v])] if sticky(v) and not lmask(cons[v]) else [])))
    live0 = sum(m.out_bytes[u] for u in live_before)
    if inp_last >= start:
        live0 += m.graph_inputs_bytes
    held0 = sum(m.out_bytes[u] for u in live_before if sticky(u) and not lmask(cons[u]))
    ready0 = sum(1 << i for i, nd in enumerate(need) if nd == 0)
    by_floor = tuple(sorted(((_node_floor(m, v), 1 << i) for i, v in enumerate(nodes)),
                            key=lambda fb: (-fb[0], fb[1])))
    cheap = sorted(range(len(nodes)), key=lambda i: (cost[i], i))
    prefix = [0]
    for i in cheap:
        prefix.append(prefix[-1] | 1 << i)
    return _Seg(nodes, tuple(cost), tuple(keep), tuple(need), tuple(succ), tuple(frees),
                tuple(settle), live0, held0, ready0, by_floor,
                tuple(cost[i] for i in cheap), tuple(1 << i for i in cheap), tuple(prefix))


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        mask ^= low
        yield low.bit_length() - 1


def _advance(seg: _Seg, s: int, live: int, ready: int, i: int) -> tuple[int, int, int]:
    """Schedule local node i: new scheduled mask, live bytes after, ready mask."""
    b = 1 << i
    s2 = s | b
    live2 = live + seg.keep[i]
    for users, size in seg.frees[i]:
        if not users & ~s2:  # i was the tensor's last consumer
            live2 -= size
    ready2 = ready & ~b
    for j in seg.succ[i]:
        if not seg.need[j] & ~s2:
            ready2 |= 1 << j
    return s2, live2, ready2


# --------------------------------------------------------------------------
# Heuristic orders
# --------------------------------------------------------------------------


def identity_order(model: OrderModel) -> tuple[int, ...]:
    """The imported order: ``0..n-1`` when that is topological, otherwise the
    lexicographically smallest topological order (Kahn with a min-heap).
    Returns fewer than n nodes only on a cycle (used by validation)."""
    indeg = [len(set(d)) for d in model.deps]
    cons: list[list[int]] = [[] for _ in range(len(indeg))]
    for v, ds in enumerate(model.deps):
        for u in set(ds):
            if 0 <= u < len(cons):
                cons[u].append(v)
    heap = [v for v, k in enumerate(indeg) if k == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        v = heapq.heappop(heap)
        order.append(v)
        for w in cons[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, w)
    return tuple(order)


def greedy_order(model: OrderModel) -> tuple[int, ...]:
    """Run, at each step, the ready node that keeps the running peak lowest,
    then leaves the fewest live bytes behind, then has the lowest id."""
    seg = _compile(model, _Layout.of(model, identity_order(model)), 0, model.n, range(model.n), ())
    s, live, ready, peak, order = 0, seg.live0, seg.ready0, 0, []
    while ready:
        best = None
        for i in _bits(ready):
            nxt = _advance(seg, s, live, ready, i)
            key = (max(peak, live + seg.cost[i]), nxt[1], i)
            if best is None or key < best[0]:
                best = (key, nxt)
        (peak, _, i), (s, live, ready) = best
        order.append(seg.nodes[i])
    return tuple(order)


# --------------------------------------------------------------------------
# Exact search
# --------------------------------------------------------------------------


class _BudgetExceeded(Exception):
    pass


class _Budget:
    """Counts expanded search states; shared by all segments of one call."""

    def __init__(self, limit: int) -> None:
        self.left = max(0, limit)

    def spend(self) -> None:
        if self.left <= 0:
            raise _BudgetExceeded
        self.left -= 1


_INF = float("inf")


def _decide(seg: _Seg, memo: dict[int, int], tau: int,
            budget: _Budget) -> tuple[tuple[int, ...] | None, int]:
    """Is there an order of the segment with every step <= tau?

    Depth-first over scheduled sets, trying ready nodes in ascending id, so
    the first success is the lexicographically smallest such order; returns
    it with its peak.  The best completion peak from a scheduled set depends
    on the set alone, so every exhausted set memoises a proven lower bound
    on it (``memo``): later probes skip it whenever that bound exceeds their
    tau, and a failure returns the root's bound -- the next tau worth trying.
    """
    keep, need, succ, frees, settle, by_floor, full = (
        seg.keep, seg.need, seg.succ, seg.frees, seg.settle, seg.by_floor, seg.full)
    memo_get, n = memo.get, len(by_floor)
    stack = [_frame(seg, tau, 0, seg.live0, seg.ready0, 0, 0, seg.held0, 0)]
    path: list[int] = []
    while True:
        fr = stack[-1]
        s, live, ready, todo = fr[0], fr[1], fr[2], fr[3]
        if s == full:
            return tuple(path), fr[6]
        if not todo:  # exhausted: no completion from s stays under tau
            bound = fr[4]
            if bound > memo_get(s, 0):
                memo[s] = bound
            stack.pop()
            if not stack:
                return None, bound
            parent = stack[-1]
            if fr[5] > bound:
                bound = fr[5]
            if bound < parent[4]:
                parent[4] = bound
            path.pop()
            continue
        low = todo & -todo
        fr[3] = todo ^ low
        i = low.bit_length() - 1
        mem = live + seg.cost[i]
        s2 = s | low
        known = memo_get(s2, 0)
        if known > tau:  # memoised: s2 cannot finish under tau
            known = known if known > mem else mem
            if known < fr[4]:
                fr[4] = known
            continue
        live2 = live + keep[i]
        for users, size in frees[i]:
            if not users & ~s2:  # i was the tensor's last consumer
                live2 -= size
        held2 = fr[7]
        for users, size in settle[i]:
            if not users & ~s2:
                held2 += size
        k = fr[8]
        while k < n and by_floor[k][1] & s2:
            k += 1
        future = held2 + (by_floor[k][0] if k < n else 0)
        if future > tau:  # settled bytes + the biggest node still to run
            future = future if future > mem else mem
            if future < fr[4]:
                fr[4] = future
            continue
        budget.spend()
        ready2 = ready ^ low
        for j in succ[i]:
            if not need[j] & ~s2:
                ready2 |= 1 << j
        peak = mem if mem > fr[6] else fr[6]
        stack.append(_frame(seg, tau, s2, live2, ready2, mem, peak, held2, k))
        path.append(i)


def _frame(seg: _Seg, tau: int, s: int, live: int, ready: int,
           step: int, peak: int, held: int, k: int) -> list:
    """A search frame: scheduled, live, ready, untried, bound of exhausted
    children, step into it, peak so far, settled sticky bytes, first
    unscheduled entry of by_floor (only moves forward as the set grows).
    Ready nodes whose own step would exceed tau are never tried ("peak so
    far" pruning); the cheapest of them seeds the frame's bound."""
    j = bisect_right(seg.by_cost, tau - live)
    todo = ready & seg.cost_prefix[j]
    over = ready ^ todo
    bound = _INF
    if over:
        while not seg.cost_bits[j] & over:
            j += 1
        bound = live + seg.by_cost[j]
    return [s, live, ready, todo, bound, step, peak, held, k]


@dataclass
class _Part:
    """One segment, its best known local order and the search memo."""

    seg: _Seg
    peak: int  # peak of `local` (upper bound on the segment optimum)
    local: tuple[int, ...]
    memo: dict[int, int] = field(default_factory=dict)
    exact: bool = False  # peak proven optimal (or proven not to matter)


def _solve(part: _Part, floor: int, budget: _Budget) -> None:
    """Bisect the segment's peak between a proven lower bound and the best
    known order (seeded by greedy / imported order).  ``floor`` is a lower
    bound on the whole model's peak, so nothing below it is worth finding;
    the first probe tries it directly since it is often achievable."""
    lo, first = floor, True
    while lo < part.peak:
        tau = lo if first else (lo + part.peak - 1) // 2
        first = False
        try:
            local, bound = _decide(part.seg, part.memo, tau, budget)
        except _BudgetExceeded:
            return  # fallback: keep the best order found so far
        if local is None:
            lo = bound
        else:
            part.local, part.peak = local, bound
    part.exact = True


def _lex_first(part: _Part, target: int, budget: _Budget) -> tuple[int, ...]:
    """Smallest local order with peak <= target, or the known witness."""
    try:
        local, _ = _decide(part.seg, part.memo, target, budget)
    except _BudgetExceeded:
        return part.local
    return part.local if local is None else local


# --------------------------------------------------------------------------
# Divide and conquer
# --------------------------------------------------------------------------


def _segments(model: OrderModel, topo: Sequence[int]) -> list[tuple[int, int]]:
    """Position ranges [start, end) that every topological order fills with
    the same node set.  A boundary after position k is forced iff each of
    the first k nodes is an ancestor of every later node; all topological
    orders share forced prefixes, so checking one order finds them all."""
    n = len(topo)
    anc = [0] * n
    for v in topo:
        for u in set(model.deps[v]):
            anc[v] |= anc[u] | (1 << u)
    suffix_common = [-1] * (n + 1)  # -1: all bits set (empty intersection)
    for k in range(n - 1, -1, -1):
        suffix_common[k] = suffix_common[k + 1] & anc[topo[k]]
    cuts, prefix = [0], 0
    for k in range(1, n):
        prefix |= 1 << topo[k - 1]
        if not prefix & ~suffix_common[k]:
            cuts.append(k)
    cuts.append(n)
    return list(zip(cuts, cuts[1:]))


def _parts(model: OrderModel, heuristics: Sequence[Sequence[int]],
           decompose: bool) -> list[_Part]:
    """Compile each segment with the best heuristic order as its witness
    (ties keep the earlier heuristic, i.e. the imported order)."""
    topo = heuristics[0]
    lay = _Layout.of(model, topo)
    ranges = _segments(model, topo) if decompose else [(0, model.n)]
    steps = [step_memories(model, h) for h in heuristics]
    parts, live = [], set()
    for start, end in ranges:
        seg = _compile(model, lay, start, end, topo[start:end], sorted(live))
        local = {v: i for i, v in enumerate(seg.nodes)}
        peak, h = min((max(st[start:end]), k) for k, st in enumerate(steps))
        parts.append(_Part(seg, peak, tuple(local[v] for v in heuristics[h][start:end])))
        live.update(topo[start:end])  # then drop what the segment consumed for good
        live = {u for u in live if u in model.outputs or lay.last_use[u] >= end}
    return parts


def memory_order(model: OrderModel, max_states: int = 200_000, *,
                 decompose: bool = True) -> tuple[int, ...]:
    """Topological order with minimum peak memory.

    Exact -- and the lexicographically smallest optimal order -- whenever the
    search (optimum plus tie-break pass) expands at most ``max_states``
    scheduled sets in total.  Past the budget, a segment keeps the best order
    found so far, which is never worse than :func:`greedy_order` or the
    imported order.  ``decompose=False`` disables the split at forced
    boundaries (for testing).
    """
    if model.n == 0:
        return ()
    heuristics = (identity_order(model), greedy_order(model))
    parts = _parts(model, heuristics, decompose)
    floor, budget = _static_lower_bound(model), _Budget(max_states)
    # Small segments first: cheap to solve exactly, and each optimum found
    # raises the floor below which the remaining segments need not go.
    for part in sorted(parts, key=lambda p: len(p.seg.nodes)):
        _solve(part, floor, budget)
        if part.exact:
            floor = max(floor, part.peak)
    target = max(p.peak for p in parts)
    # Segments are independent, so per-segment smallest orders under the
    # overall peak concatenate to the overall smallest one.
    order = tuple(p.seg.nodes[i] for p in parts for i in _lex_first(p, target, budget))
    # Cheap safety net for the "never worse than the heuristics" contract.
    best_h = min(heuristics, key=lambda h: peak_of_order(model, h))
    return order if peak_of_order(model, order) <= peak_of_order(model, best_h) else best_h
