"""Arena offset planners: give every buffer a byte offset in one shared arena.

A planner sees only abstract buffers -- a size and an inclusive range of steps during which the
buffer holds live data -- plus optional extra conflict pairs (buffers that must never share bytes
even though their lifetimes are disjoint, e.g. buffers of partitions that run concurrently). Two
buffers *conflict* when their lifetimes intersect or they form an extra pair; conflicting buffers
must occupy disjoint byte ranges ``[offset, offset + size)``. The goal is a small arena
(``max(offset + size)``).

This mirrors TFLite Micro's ``MemoryPlanner`` interface and tinygrad's memory planner: the
planners know nothing about graphs or tensors, which keeps them pure, cheap to test and reusable
for any schedule. Everything here is deterministic: the same input always gives the same offsets
(the improver's search is driven by a ``random.Random`` built from an explicit seed).

Offsets are always multiples of ``alignment`` and every size is rounded up to it while placing, so
that the next buffer stacked on top of another one also starts aligned.
"""
from __future__ import annotations

import bisect
import heapq
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

DEFAULT_ALIGNMENT = 64

Pair = tuple[int, int]
Offsets = tuple[int, ...]
Planner = Callable[..., Offsets]

# Placement policies for a buffer among its already-placed conflicting neighbours.
BEST_FIT = "best"  # smallest gap that holds it (Pisarchyk & Lee 2020)
FIRST_FIT = "first"  # lowest gap that holds it (TFLite GreedyMemoryPlanner)


@dataclass(frozen=True)
class BufferReq:
    """One buffer: ``size`` bytes, holding live data from ``first_use`` to ``last_use`` inclusive."""

    size: int
    first_use: int
    last_use: int

    def __post_init__(self) -> None:
        for name in ("size", "first_use", "last_use"):
            value = getattr(self, name)
            # bool is an int subclass; a True size is certainly a caller bug.
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"BufferReq.{name} must be an int, got {value!r}")
        if self.size < 0:
            raise ValueError(f"BufferReq.size must be >= 0, got {self.size}")
        if self.last_use < self.first_use:
            raise ValueError(
                f"BufferReq lifetime is empty: first_use={self.first_use} > last_use={self.last_use}"
            )

    def live_at(self, step: int) -> bool:
        return self.first_use <= step <= self.last_use

    def lifetime(self) -> str:
        return f"[{self.first_use}, {self.last_use}]"


class OverlapError(AssertionError):
    """Two conflicting buffers share bytes. An AssertionError because a planner produced it: a bug."""

    def __init__(self, i: int, j: int, a: BufferReq, b: BufferReq, off_a: int, off_b: int):
        self.i, self.j = i, j
        self.reqs = (a, b)
        self.offsets = (off_a, off_b)
        super().__init__(
            f"buffers {i} and {j} conflict but overlap: "
            f"buffer {i} (size {a.size}, steps {a.lifetime()}) at [{off_a}, {off_a + a.size}) and "
            f"buffer {j} (size {b.size}, steps {b.lifetime()}) at [{off_b}, {off_b + b.size})"
        )


class UnknownPlannerError(KeyError):
    """Asked for a planner name that is not registered."""

    def __init__(self, name: str, choices: Iterable[str]):
        self.name = name
        self.choices = tuple(sorted(choices))
        self.message = f"unknown planner {name!r}; choices: {', '.join(self.choices)}"
        super().__init__(self.message)

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return self.message


# --------------------------------------------------------------------------- conflicts and bounds


def _check_alignment(alignment: int) -> None:
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1:
        raise ValueError(f"alignment must be a positive int, got {alignment!r}")


def _align(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


def _lifetime_pairs(reqs: Sequence[BufferReq]) -> Iterable[Pair]:
    """Pairs whose inclusive lifetimes intersect, by a sweep over start steps.

    Sorting by first_use lets each buffer stop scanning at the first later-starting buffer that
    starts after it ends, so the cost is O(n log n + pairs) rather than O(n^2).
    """
    order = sorted(range(len(reqs)), key=lambda k: (reqs[k].first_use, k))
    for pos, i in enumerate(order):
        end = reqs[i].last_use
        for j in order[pos + 1 :]:
            if reqs[j].first_use > end:
                break
            yield (i, j) if i < j else (j, i)


def _normalise_extra(extra: Iterable[Sequence[int]], n: int) -> set[Pair]:
    pairs: set[Pair] = set()
    for pair in extra:
        i, j = pair
        if not (0 <= i < n and 0 <= j < n):
            raise ValueError(f"extra conflict {tuple(pair)} names a buffer outside 0..{n - 1}")
        if i == j:
            raise ValueError(f"extra conflict {tuple(pair)} pairs a buffer with itself")
        pairs.add((i, j) if i < j else (j, i))
    return pairs


def conflicts(reqs: Sequence[BufferReq], extra: Iterable[Sequence[int]] = ()) -> frozenset[Pair]:
    """All conflicting pairs ``(i, j)`` with ``i < j``: intersecting lifetimes plus ``extra``."""
    pairs = _normalise_extra(extra, len(reqs))
    pairs.update(_lifetime_pairs(reqs))
    return frozenset(pairs)


def lower_bound(
    reqs: Sequence[BufferReq],
    step_scratch: Mapping[int, int] | None = None,
    *,
    alignment: int = 1,
) -> int:
    """Peak over steps of the bytes live at that step (plus that step's scratch).

    No placement can beat it, because everything live at one step must sit side by side. With
    ``alignment > 1`` all but the topmost buffer at a step take their rounded-up size, so the bound
    tightens to ``sum(aligned sizes) - largest padding``; still valid for aligned planners.
    Extra conflicts are ignored, so the true optimum may exceed it when there are any.
    """
    _check_alignment(alignment)
    scratch = dict(step_scratch or {})
    if any(v < 0 for v in scratch.values()):
        raise ValueError("step_scratch values must be >= 0")
    if not reqs:
        return max(scratch.values(), default=0)
    aligned = [_align(r.size, alignment) for r in reqs]
    # Live bytes at a step only increase at a first_use, so the peak (without scratch) sits at
    # one of them; scratch steps are probed too because they add bytes of their own.
    probes = sorted({r.first_use for r in reqs} | set(scratch))
    starts = _Prefix([r.first_use for r in reqs], aligned)
    ends = _Prefix([r.last_use for r in reqs], aligned)
    pads = _LivePad(reqs, aligned)
    best = 0
    for step in probes:  # ascending, as _LivePad requires
        live = starts.total_upto(step) - ends.total_below(step)
        best = max(best, live - pads.max_at(step) + scratch.get(step, 0))
    return best


class _LivePad:
    """Largest alignment padding among buffers live at a step, for ascending step queries.

    A max-heap of (padding, last_use) with lazy deletion: expired entries are dropped only when
    they reach the top, which is all that matters for the maximum. O(n log n) over all queries.
    """

    def __init__(self, reqs: Sequence[BufferReq], aligned: Sequence[int]):
        self.pending = sorted((r.first_use, -(a - r.size), r.last_use) for r, a in zip(reqs, aligned))
        self.next = 0
        self.heap: list[tuple[int, int]] = []

    def max_at(self, step: int) -> int:
        while self.next < len(self.pending) and self.pending[self.next][0] <= step:
            _, neg_pad, last = self.pending[self.next]
            heapq.heappush(self.heap, (neg_pad, last))
            self.next += 1
        while self.heap and self.heap[0][1] < step:
            heapq.heappop(self.heap)
        return -self.heap[0][0] if self.heap else 0


class _Prefix:
    """Sum of weights whose key is <= / < a query, via sorted keys and prefix sums."""

    def __init__(self, keys: Sequence[int], weights: Sequence[int]):
        pairs = sorted(zip(keys, weights))
        self.keys = [k for k, _ in pairs]
        self.sums = [0]
        for _, w in pairs:
            self.sums.append(self.sums[-1] + w)

    def total_upto(self, key: int) -> int:
        return self.sums[bisect.bisect_right(self.keys, key)]

    def total_below(self, key: int) -> int:
        return self.sums[bisect.bisect_left(self.keys, key)]


# --------------------------------------------------------------------------- checking and output


def arena_bytes(reqs: Sequence[BufferReq], offsets: Sequence[int]) -> int:
    """Arena size the offsets need: ``max(offset + size)``, 0 for no buffers."""
    _check_lengths(reqs, offsets)
    return max((o + r.size for r, o in zip(reqs, offsets)), default=0)


def _check_lengths(reqs: Sequence[BufferReq], offsets: Sequence[int]) -> None:
    if len(reqs) != len(offsets):
        raise ValueError(f"{len(reqs)} buffers but {len(offsets)} offsets")


def check_offsets(
    reqs: Sequence[BufferReq],
    offsets: Sequence[int],
    extra_conflicts: Iterable[Sequence[int]] = (),
) -> None:
    """Raise OverlapError if any two conflicting buffers share a byte; ValueError on bad offsets."""
    _check_lengths(reqs, offsets)
    for i, o in enumerate(offsets):
        if not isinstance(o, int) or isinstance(o, bool) or o < 0:
            raise ValueError(f"offset of buffer {i} must be a non-negative int, got {o!r}")
    # Sorted so that the reported pair does not depend on set iteration order.
    for i, j in sorted(conflicts(reqs, extra_conflicts)):
        a, b, oa, ob = reqs[i], reqs[j], offsets[i], offsets[j]
        # Half-open ranges; an empty (size 0) range overlaps nothing.
        if a.size and b.size and oa < ob + b.size and ob < oa + a.size:
            raise OverlapError(i, j, a, b, oa, ob)


def format_layout(reqs: Sequence[BufferReq], offsets: Sequence[int], width: int = 60) -> str:
    """Printable layout, one line per buffer (index, size, lifetime, offset, bar over the arena).

    Like TFLite's PrintMemoryPlan, meant for eyeballing a plan: '#' marks the bytes a buffer
    occupies, scaled so the full bar is the whole arena.
    """
    _check_lengths(reqs, offsets)
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    arena = arena_bytes(reqs, offsets)
    lines = [
        f"arena {arena} bytes, {len(reqs)} buffers",
        f"{'buf':>4} {'size':>10} {'lifetime':>12} {'offset':>10}  layout",
    ]
    for i, (r, o) in enumerate(zip(reqs, offsets)):
        life = f"[{r.first_use},{r.last_use}]"
        lines.append(f"{i:>4} {r.size:>10} {life:>12} {o:>10}  |{_bar(o, r.size, arena, width)}|")
    return "\n".join(lines)


def _bar(offset: int, size: int, arena: int, width: int) -> str:
    if arena == 0 or size == 0:
        return "." * width
    lo = offset * width // arena
    hi = max(lo + 1, -(-(offset + size) * width // arena))  # even tiny buffers stay visible
    hi = min(hi, width)
    lo = min(lo, hi - 1)
    return "." * lo + "#" * (hi - lo) + "." * (width - hi)


# --------------------------------------------------------------------------- placement core


@dataclass(frozen=True)
class _Problem:
    """A planning instance reduced to what placement needs."""

    raw: tuple[int, ...]  # requested sizes, for the arena
    size: tuple[int, ...]  # sizes rounded up to the alignment, for placing
    adj: tuple[tuple[int, ...], ...]  # conflicting buffers, per buffer, ascending
    adj_sets: tuple[frozenset[int], ...]
    target: int  # a proven lower bound on the arena: reaching it means optimal

    @property
    def n(self) -> int:
        return len(self.raw)


def _problem(
    reqs: Sequence[BufferReq], extra: Iterable[Sequence[int]], alignment: int
) -> _Problem:
    _check_alignment(alignment)
    n = len(reqs)
    pairs = conflicts(reqs, extra)
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, j in pairs:
        adj[i].append(j)
        adj[j].append(i)
    raw = tuple(r.size for r in reqs)
    size = tuple(_align(s, alignment) for s in raw)
    # Any conflicting pair must also sit side by side; this is what lifts the bound above the
    # step peak when extra conflicts join buffers from different steps.
    pair_bound = max(
        (size[i] + size[j] - max(size[i] - raw[i], size[j] - raw[j]) for i, j in pairs), default=0
    )
    target = max(lower_bound(reqs, alignment=alignment), pair_bound)
    return _Problem(
        raw=raw,
        size=size,
        adj=tuple(tuple(sorted(a)) for a in adj),
        adj_sets=tuple(frozenset(a) for a in adj),
        target=target,
    )


def _fit(prob: _Problem, i: int, offsets: Sequence[int], placed: Sequence[bool], fit: str) -> int:
    """Offset for buffer ``i`` among its placed neighbours: a gap that holds it, else on top."""
    need = prob.size[i]
    if need == 0:
        return 0  # occupies no bytes, so it can never collide
    size = prob.size
    # Hot loop of every planner: plain list comprehension and comparisons are ~2x faster than
    # generator + max() in CPython. Zero-size neighbours sit at 0 with an empty span: harmless.
    spans = sorted([(offsets[j], offsets[j] + size[j]) for j in prob.adj[i] if placed[j]])
    prev, best, best_gap = 0, -1, -1
    for lo, hi in spans:
        gap = lo - prev
        if gap >= need:
            if fit == FIRST_FIT:
                return prev
            if best < 0 or gap < best_gap:
                best, best_gap = prev, gap
        # Neighbours need not conflict with each other, so their spans may overlap: keep the max.
        if hi > prev:
            prev = hi
    return prev if best < 0 else best


def _place(
    prob: _Problem,
    order: Sequence[int],
    fit: str,
    start: int = 0,
    base: Sequence[int] | None = None,
) -> list[int]:
    """Place buffers in ``order``; positions before ``start`` keep their ``base`` offsets.

    Reusing the prefix is exact, not an approximation: a buffer's offset depends only on the
    buffers placed before it, so an unchanged prefix places identically.
    """
    offsets = list(base) if base is not None and start else [0] * prob.n
    placed = [False] * prob.n
    for i in order[:start]:
        placed[i] = True
    for i in order[start:]:
        offsets[i] = _fit(prob, i, offsets, placed, fit)
        placed[i] = True
    return offsets


def _arena(prob: _Problem, offsets: Sequence[int]) -> int:
    return max((o + s for o, s in zip(offsets, prob.raw)), default=0)


def _by_size_order(prob: _Problem) -> list[int]:
    return sorted(range(prob.n), key=lambda i: (-prob.raw[i], i))


def _by_conflicts_order(prob: _Problem) -> list[int]:
    # Most-constrained first: buffers with many (and large) neighbours are hardest to fit late.
    weight = [sum(prob.size[j] for j in prob.adj[i]) for i in range(prob.n)]
    return sorted(range(prob.n), key=lambda i: (-len(prob.adj[i]), -weight[i], -prob.raw[i], i))


# --------------------------------------------------------------------------- greedy planners


def greedy_by_size(
    reqs: Sequence[BufferReq],
    extra_conflicts: Iterable[Sequence[int]] = (),
    alignment: int = DEFAULT_ALIGNMENT,
) -> Offsets:
    """Greedy by Size (Pisarchyk & Lee 2020; TFLite's GreedyMemoryPlanner).

    Largest buffers first, each into the best-fitting gap between its already-placed conflicting
    buffers, or on top of them when no gap holds it. Big buffers placed early leave gaps that the
    many small ones later fill.
    """
    prob = _problem(reqs, extra_conflicts, alignment)
    return tuple(_place(prob, _by_size_order(prob), BEST_FIT))


def greedy_by_conflicts(
    reqs: Sequence[BufferReq],
    extra_conflicts: Iterable[Sequence[int]] = (),
    alignment: int = DEFAULT_ALIGNMENT,
) -> Offsets:
    """Most-conflicted buffers first (count, then total conflicting bytes, then size); best-fit."""
    prob = _problem(reqs, extra_conflicts, alignment)
    return tuple(_place(prob, _by_conflicts_order(prob), BEST_FIT))


def shared_buffers(
    reqs: Sequence[BufferReq],
    extra_conflicts: Iterable[Sequence[int]] = (),
    alignment: int = DEFAULT_ALIGNMENT,
) -> Offsets:
    """Shared-buffer reuse, Minakova's thesis Ch. 6, Algorithm 8 (Sec. 6.5.1).

    Buffers are visited in the order given (the thesis visits edges partition by partition); each
    joins the existing shared buffer none of whose members conflicts with it and that grows least
    (the first of equal growth, as the strict ``cost < cost_min`` of line 31), else opens a new one.
    Shared buffers are stacked in the order they were opened; each is as large as its largest member.
    The thesis's application (Table 6.1 -> Table 6.2) is reproduced in tests/test_alg8.py.
    """
    prob = _problem(reqs, extra_conflicts, alignment)
    members: list[list[int]] = []
    sizes: list[int] = []
    home = [0] * prob.n
    for i in range(prob.n):
        reusable = [k for k, group in enumerate(members) if not prob.adj_sets[i].intersection(group)]
        if not reusable:
            members.append([i])
            sizes.append(prob.size[i])
            home[i] = len(members) - 1
            continue
        best = min(reusable, key=lambda k: max(prob.size[i] - sizes[k], 0))
        members[best].append(i)
        sizes[best] = max(sizes[best], prob.size[i])
        home[i] = best
    bases = [0] * len(sizes)
    for k in range(1, len(sizes)):
        bases[k] = bases[k - 1] + sizes[k - 1]
    return tuple(bases[home[i]] if prob.size[i] else 0 for i in range(prob.n))


# --------------------------------------------------------------------------- improver


@dataclass(frozen=True)
class _Solution:
    order: tuple[int, ...]
    fit: str
    offsets: tuple[int, ...]
    arena: int
    at_peak: int  # buffers touching the arena top: fewer means closer to shaving the peak
    spread: int  # sum of buffer tops: lower means a more compact plan with room to spare

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.arena, self.at_peak, self.spread)


def _solution(prob: _Problem, order: Sequence[int], fit: str, offsets: Sequence[int]) -> _Solution:
    arena = _arena(prob, offsets)
    tops = [o + s for o, s in zip(offsets, prob.raw)]
    at_peak = tops.count(arena)
    return _Solution(tuple(order), fit, tuple(offsets), arena, at_peak, sum(tops))


def _evaluate(prob: _Problem, order: Sequence[int], fit: str) -> _Solution:
    return _solution(prob, order, fit, _place(prob, order, fit))


def _heuristic_orders(prob: _Problem) -> list[list[int]]:
    """A handful of classic orderings; different instances favour different ones."""
    n, raw, size = prob.n, prob.raw, prob.size
    weight = [size[i] + sum(size[j] for j in prob.adj[i]) for i in range(n)]
    return [
        _by_size_order(prob),
        _by_conflicts_order(prob),
        sorted(range(n), key=lambda i: (-weight[i], -raw[i], i)),
        sorted(range(n), key=lambda i: (-raw[i] * (len(prob.adj[i]) + 1), i)),
    ]


def _seed(prob: _Problem) -> _Solution:
    """Best of the two registered greedies, so the improver can never do worse than either."""
    by_size = _evaluate(prob, _by_size_order(prob), BEST_FIT)
    by_conf = _evaluate(prob, _by_conflicts_order(prob), BEST_FIT)
    return by_conf if by_conf.arena < by_size.arena else by_size


def improve(
    reqs: Sequence[BufferReq],
    extra_conflicts: Iterable[Sequence[int]] = (),
    alignment: int = DEFAULT_ALIGNMENT,
    *,
    max_evals: int | None = None,
    exact_nodes: int = 20_000,
    seed: int = 0,
) -> Offsets:
    """Improve on the better greedy plan; never worse than it, stops early at a proven optimum.

    1. Seed with the better of greedy_by_size / greedy_by_conflicts (ties: by size).
    2. Try a few more heuristic orders under both best-fit and first-fit placement.
    3. Up to ``_EXACT_MAX_N`` buffers: exact branch and bound over placement orders, at most
       ``exact_nodes`` search nodes. If it finishes, its plan is optimal and is returned.
    4. Otherwise: seeded local search over placement orders, at most ``max_evals`` placements
       (default scales with instance size, see ``_default_evals``), ending early when a
       third of the budget passes without a new best; ``RESTARTS`` such walks (seeds
       ``seed``, ``seed + 1``, ...) from the same start, the best kept.

    Every phase stops once the arena equals a proven lower bound. Work is bounded by counts,
    never by wall time, so the result is reproducible; ``seed`` only picks the walk.
    """
    prob = _problem(reqs, extra_conflicts, alignment)
    best = _seed(prob)
    for order in _heuristic_orders(prob):
        for fit in (BEST_FIT, FIRST_FIT):
            if best.arena <= prob.target:
                return best.offsets
            best = min(best, _evaluate(prob, order, fit), key=lambda s: s.arena)
    if best.arena <= prob.target:
        return best.offsets
    if prob.n <= _EXACT_MAX_N:
        best, complete = _branch_and_bound(prob, best, exact_nodes)
        if complete:
            return best.offsets
    evals = _default_evals(prob) if max_evals is None else max_evals
    start = best
    for walk in range(RESTARTS):
        best = min(best, _local_search(prob, start, evals, random.Random(seed + walk)), key=lambda s: s.arena)
        if best.arena <= prob.target:
            break
    return best.offsets


RESTARTS = 3  # local-search walks from the same start, the best kept: one walk can stall on a plateau


_EXACT_MAX_N = 10  # beyond this even a pruned search over orders rarely finishes in budget


def _default_evals(prob: _Problem) -> int:
    # One placement visits each buffer and its neighbour list, so it costs ~ n + 2*edges steps.
    # Spend about 1M such steps (~0.5 s in CPython), clamped to 100..2000 placements.
    cost = prob.n + sum(len(a) for a in prob.adj)
    return max(100, min(2000, 1_000_000 // max(cost, 1)))


def _branch_and_bound(
    prob: _Problem, incumbent: _Solution, max_nodes: int
) -> tuple[_Solution, bool]:
    """Depth-first search over placement orders with first-fit placement.

    Returns the best plan and whether the search finished (then that plan is optimal).
    Complete: in an optimal plan, re-placing buffers first-fit in ascending-offset order puts
    each at or below its optimal offset (everything placed earlier ends below it), so some order
    reaches the optimum. Two pruning rules keep it small:
      * adjacent non-conflicting buffers commute (neither sees the other), so only the order with
        the lower index first is explored;
      * placing more buffers only removes free space, so each unplaced buffer's current first-fit
        offset + size bounds the final arena from below.
    """
    n = prob.n
    offsets, placed, order = [0] * n, [False] * n, []
    best = incumbent
    nodes = 0
    exhausted = False  # node budget ran out before the search finished

    def dfs(arena: int) -> bool:  # True: stop now (optimum proven or budget spent)
        nonlocal best, nodes, exhausted
        nodes += 1
        if len(order) == n:
            if arena < best.arena:
                best = _solution(prob, order, FIRST_FIT, offsets)
            return best.arena <= prob.target
        if nodes >= max_nodes:
            exhausted = True
            return True
        moves, bound = _bnb_moves(prob, offsets, placed, order[-1] if order else -1, arena)
        if bound >= best.arena:
            return False
        for top, _, i, off in moves:
            offsets[i], placed[i] = off, True
            order.append(i)
            stop = dfs(max(arena, top))
            order.pop()
            placed[i] = False
            if stop:
                return True
        return False

    dfs(0)
    return best, not exhausted


def _bnb_moves(
    prob: _Problem, offsets: list[int], placed: list[bool], last: int, arena: int
) -> tuple[list[tuple[int, int, int, int]], int]:
    """Children of a search node (lowest resulting top first) and a bound on its leaves."""
    moves = []
    bound = arena
    for i in range(prob.n):
        if placed[i]:
            continue
        off = _fit(prob, i, offsets, placed, FIRST_FIT)
        bound = max(bound, off + prob.raw[i])
        if last < 0 or i > last or i in prob.adj_sets[last]:
            moves.append((off + prob.raw[i], -prob.raw[i], i, off))
    return sorted(moves), bound


def _local_search(prob: _Problem, start: _Solution, max_evals: int, rng: random.Random) -> _Solution:
    """Seeded local search over placement orders.

    Moves target the buffers that touch the arena top (the only ones whose placement sets the
    arena): pull one earlier so it gets a lower slot, or push a conflicting buffer beneath it later.
    Candidates are compared by (arena, buffers at the peak, sum of tops); equal-or-better ones are
    accepted, so the walk can cross plateaus where the arena alone does not move. After a stretch
    without a new best it restarts from the best plan.
    """
    best = cur = start
    stale = since_best = 0
    restart_after = max(50, max_evals // 10)
    patience = max(100, max_evals // 3)
    for _ in range(max_evals):
        if best.arena <= prob.target or since_best >= patience:
            break
        order, changed, fit = _propose(prob, cur, rng)
        offsets = _place(prob, order, fit, changed, cur.offsets)
        cand = _solution(prob, order, fit, offsets)
        if cand.key <= cur.key:
            cur = cand
        if cand.key < best.key:
            # Only a smaller arena resets patience; tie-break gains alone do not justify more work.
            since_best = 0 if cand.arena < best.arena else since_best + 1
            best, stale = cand, 0
        else:
            stale += 1
            since_best += 1
        if stale >= restart_after:
            cur, stale = best, 0
    return best


def _propose(prob: _Problem, sol: _Solution, rng: random.Random) -> tuple[list[int], int, str]:
    """A neighbouring order, the first position that changed, and the fit policy.

    Every move reorders two *conflicting* buffers: swapping non-conflicting ones can never change
    the plan (neither sees the other while being placed), so it would waste a placement.
    """
    order = list(sol.order)
    if rng.random() < 0.03:  # occasionally switch policy; everything must be re-placed
        return order, 0, FIRST_FIT if sol.fit == BEST_FIT else BEST_FIT
    pos = {b: k for k, b in enumerate(order)}
    offsets, raw, arena = sol.offsets, prob.raw, sol.arena
    if rng.random() < 0.8:
        # A buffer touching the arena top, and a conflicting one placed before it.
        top = rng.choice([i for i in range(prob.n) if offsets[i] + raw[i] == arena])
        earlier = [j for j in prob.adj[top] if pos[j] < pos[top]]
    else:
        # Anywhere: a little diversification so the walk does not circle the same peak.
        top = order[rng.randrange(1, prob.n)] if prob.n > 1 else order[0]
        earlier = [j for j in prob.adj[top] if pos[j] < pos[top]]
    if not earlier:  # nothing placed before it that it conflicts with: fall back to a swap
        a, b = sorted(rng.sample(range(prob.n), 2)) if prob.n > 1 else (0, 0)
        order[a], order[b] = order[b], order[a]
        return order, a, sol.fit
    j = rng.choice(earlier)
    p, q = pos[j], pos[top]
    if rng.random() < 0.5:  # promote: top goes right before j, so it is placed before j
        order.insert(p, order.pop(q))
    else:  # demote: j goes right after top, so top is placed before j
        order.insert(q, order.pop(p))
    return order, p, sol.fit


# --------------------------------------------------------------------------- registry


PLANNERS: dict[str, Planner] = {
    "greedy_by_size": greedy_by_size,
    "greedy_by_conflicts": greedy_by_conflicts,
    "improve": improve,
    "shared_buffers": shared_buffers,
}


def get_planner(name: str) -> Planner:
    """The planner registered as ``name``; UnknownPlannerError (a KeyError) names the choices."""
    try:
        return PLANNERS[name]
    except KeyError:
        raise UnknownPlannerError(name, PLANNERS) from None
