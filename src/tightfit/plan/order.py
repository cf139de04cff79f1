"""Memory-aware topological ordering of a CNN's layers.

Follows Serenity (Ahn et al., MLSys 2020): the set of already-scheduled
layers fully determines which tensors are live, so the minimum-peak order
can be found by dynamic programming over scheduled sets (memoising the best
"peak so far" per set), pruned against a known upper bound.  Like Serenity we
divide and conquer first: wherever the graph narrows so that *every*
topological order must finish one group of layers before starting the next
(typically at the single tensor between two inception/residual blocks), the
groups are independent and each is solved on its own.  A state budget caps
the search; past it a segment falls back to the better of the greedy and the
imported (identity) order, so the result is never worse than either.

Memory model (see :class:`OrderModel`): while node ``v`` runs, memory is the
bytes of every tensor that is already produced and still needed (by a
not-yet-run consumer, ``v`` included, or because it is a model output), plus
``v``'s own output, plus the model inputs while any of their consumers is
still to run, plus ``scratch[v]``.  A tensor is freed right after its last
consumer runs.  ``peak(order)`` is the maximum over the steps.
"""

from __future__ import annotations

import heapq
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


def _node_floor(m: OrderModel) -> tuple[int, ...]:
    """Per node, memory no order can avoid while it runs: its inputs, its
    output and its scratch are resident whatever the order."""
    ins = set(m.input_consumers)
    return tuple(
        m.out_bytes[v] + m.scratch[v] + sum(m.out_bytes[u] for u in set(ds))
        + (m.graph_inputs_bytes if v in ins else 0)
        for v, ds in enumerate(m.deps))


def _static_lower_bound(m: OrderModel) -> int:
    return max(_node_floor(m), default=0)


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
# Compiled (bitmask) form of a segment, used by greedy, BFS and DFS
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
    live0: int
    ready0: int
    floor: int  # static lower bound on the segment's peak

    @property
    def full(self) -> int:
        return (1 << len(self.nodes)) - 1


def _compile(
    m: OrderModel, cons: Sequence[Sequence[int]], nodes: Iterable[int], before: frozenset[int]
) -> _Seg:
    nodes = tuple(sorted(nodes))
    local = {v: i for i, v in enumerate(nodes)}
    done = before | set(nodes)  # scheduled once this segment is over

    def lmask(vs: Iterable[int]) -> int:
        return sum(1 << local[w] for w in set(vs) if w in local)

    inp_users = frozenset(m.input_consumers) if m.graph_inputs_bytes else frozenset()
    cost, keep, need, succ, frees = [], [], [], [], []
    for v in nodes:
        ds = sorted(set(m.deps[v]))
        cost.append(m.out_bytes[v] + m.scratch[v])
        keep.append(m.out_bytes[v] if cons[v] or v in m.outputs else 0)
        need.append(lmask(ds))
        succ.append(tuple(sorted(local[w] for w in cons[v] if w in local)))
        # Only tensors whose every consumer lies in/before this segment can be
        # freed here; the rest stay resident for the whole segment.
        fr = [(lmask(cons[u]), m.out_bytes[u]) for u in ds
              if u not in m.outputs and all(w in done for w in cons[u]) and m.out_bytes[u]]
        if v in inp_users and inp_users <= done:
            fr.append((lmask(inp_users), m.graph_inputs_bytes))
        frees.append(tuple(fr))
    live0 = sum(m.out_bytes[u] for u in before
                if u in m.outputs or any(w not in before for w in cons[u]))
    if inp_users and not inp_users <= before:
        live0 += m.graph_inputs_bytes
    ready0 = sum(1 << i for i, nd in enumerate(need) if nd == 0)
    return _Seg(nodes, tuple(cost), tuple(keep), tuple(need), tuple(succ),
                tuple(frees), live0, ready0, max(map(_node_floor(m).__getitem__, nodes)))


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
    seg = _compile(model, _consumers(model), range(model.n), frozenset())
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
    cost, keep, need, succ, frees = seg.cost, seg.keep, seg.need, seg.succ, seg.frees
    # frame: scheduled, live, ready, untried, bound-of-exhausted-children, step-in, peak
    stack: list[list] = [[0, seg.live0, seg.ready0, seg.ready0, _INF, 0, 0]]
    path: list[int] = []
    while True:
        fr = stack[-1]
        s, live, ready, todo = fr[0], fr[1], fr[2], fr[3]
        if s == seg.full:
            return tuple(path), fr[6]
        if not todo:  # exhausted: no completion from s stays under tau
            memo[s] = max(memo.get(s, 0), fr[4])
            stack.pop()
            if not stack:
                return None, fr[4]
            parent = stack[-1]
            parent[4] = min(parent[4], max(fr[5], fr[4]))
            path.pop()
            continue
        low = todo & -todo
        fr[3] = todo ^ low
        i = low.bit_length() - 1
        mem = live + cost[i]
        s2 = s | low
        known = memo.get(s2, 0)
        if mem > tau or known > tau:  # "peak so far" / memoised-bound pruning
            fr[4] = min(fr[4], max(mem, known))
            continue
        budget.spend()
        live2 = live + keep[i]
        for users, size in frees[i]:
            if not users & ~s2:  # i was the tensor's last consumer
                live2 -= size
        ready2 = ready ^ low
        for j in succ[i]:
            if not need[j] & ~s2:
                ready2 |= 1 << j
        stack.append([s2, live2, ready2, ready2, _INF, mem, max(fr[6], mem)])
        path.append(i)


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
    known order (seeded by greedy / imported order).  Values at or below
    ``floor`` are as good as any, so the search never tries to go lower."""
    lo = max(floor, part.seg.floor)
    first = True
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
    cons = _consumers(model)
    topo = heuristics[0]
    ranges = _segments(model, topo) if decompose else [(0, model.n)]
    steps = [step_memories(model, h) for h in heuristics]
    parts = []
    for start, end in ranges:
        seg = _compile(model, cons, topo[start:end], frozenset(topo[:start]))
        local = {v: i for i, v in enumerate(seg.nodes)}
        peak, h = min((max(st[start:end]), k) for k, st in enumerate(steps))
        parts.append(_Part(seg, peak, tuple(local[v] for v in heuristics[h][start:end])))
    return parts


def memory_order(model: OrderModel, max_states: int = 200_000, *,
                 decompose: bool = True) -> tuple[int, ...]:
    """Topological order with minimum peak memory.

    Exact -- and the lexicographically smallest optimal order -- whenever the
    search expands at most ``max_states`` scheduled sets (plus as many again
    for the tie-break pass).  Past the budget, a segment keeps the best order
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
    tie_budget = _Budget(max_states)
    order = tuple(v for p in parts for v in (p.seg.nodes[i] for i in _lex_first(p, target, tie_budget)))
    # Cheap safety net for the "never worse than the heuristics" contract.
    best_h = min(heuristics, key=lambda h: peak_of_order(model, h))
    return order if peak_of_order(model, order) <= peak_of_order(model, best_h) else best_h
