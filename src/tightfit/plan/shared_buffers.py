"""Shared-buffer reuse across CNNs: Minakova's thesis, Ch. 6, Algorithm 8.

Model (thesis Sec. 6.4): an application runs one or more CNNs, split into partitions. Each
partition has a schedule, a sequence of steps, each step executing one or more of its layers
(a layer may appear in several steps when it processes data by parts). Every CNN edge starts
with its own ("naive") buffer holding ``size`` tokens. ``J`` lists groups of partitions that run
concurrently as a pipeline; any two partitions that share a group may never share a buffer.

Algorithm 8 (Sec. 6.5.1) is a greedy pass: visit the edges partition by partition, put each
edge into the existing buffer that can take it with the least growth, or open a new buffer.
The result is a tuple of ``SharedBuffer``; each one is as large as its largest edge.

Pure Python on purpose: no torch, no other tightfit module, so planners, tests and benches can
use it without loading a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Layer = int
"""A layer's index inside its CNN: l_i^n is layer ``i`` of CNN ``n``."""

Step = tuple[Layer, ...]
"""The layers (or layer phases) executed at one step of a schedule."""


@dataclass(frozen=True)
class Edge:
    """A CNN edge e_{src,dst}^cnn whose data needs ``size`` tokens (its naive buffer size)."""

    name: str
    cnn: int
    src: Layer
    dst: Layer
    size: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"edge {self.name!r}: size must be >= 0, got {self.size}")


@dataclass(frozen=True)
class Partition:
    """A partition P_m of one CNN: its schedule and the edges P_m.E whose buffers it owns.

    An edge that crosses into another partition may name a layer that this schedule never runs;
    see ``lifetime`` for how its interval is then closed.
    """

    name: str
    cnn: int
    schedule: tuple[Step, ...]
    edges: tuple[Edge, ...]

    def __post_init__(self) -> None:
        if not self.schedule or not all(self.schedule):
            raise ValueError(f"partition {self.name!r}: schedule and its steps must be non-empty")
        for edge in self.edges:
            self._check_edge(edge)

    def _check_edge(self, edge: Edge) -> None:
        if edge.cnn != self.cnn:
            raise ValueError(f"edge {edge.name!r} of CNN {edge.cnn} in partition "
                             f"{self.name!r} of CNN {self.cnn}")
        # With neither end scheduled here the edge's lifetime would be pure invention.
        if edge.src not in self.layers and edge.dst not in self.layers:
            raise ValueError(f"edge {edge.name!r}: neither layer {edge.src} nor {edge.dst} "
                             f"is in the schedule of partition {self.name!r}")
        # A consumer done before its producer starts reads nothing: the schedule is wrong,
        # and the empty interval would make the overlap test meaningless.
        span = lifetime(edge, self.schedule)
        if span.first > span.last:
            raise ValueError(f"edge {edge.name!r}: partition {self.name!r} runs layer "
                             f"{edge.dst} for the last time before layer {edge.src} first")

    @property
    def layers(self) -> frozenset[Layer]:
        return frozenset(layer for step in self.schedule for layer in step)


@dataclass(frozen=True)
class Application:
    """The thesis's (CNNs, B^naive, P, J, schedules) tuple; CNNs and B^naive live in the edges."""

    partitions: tuple[Partition, ...]
    pipelines: tuple[frozenset[str], ...] = ()  # J: names of partitions that run concurrently

    def __post_init__(self) -> None:
        names = [p.name for p in self.partitions]
        if len(set(names)) != len(names):
            raise ValueError(f"partition names must be unique: {names}")
        edge_names = [e.name for e in self.edges]
        if len(set(edge_names)) != len(edge_names):
            raise ValueError("edge names must be unique across the application")
        unknown = set().union(*self.pipelines) - set(names)
        if unknown:
            raise ValueError(f"J names unknown partitions: {sorted(unknown)}")

    @property
    def edges(self) -> tuple[Edge, ...]:
        return tuple(edge for part in self.partitions for edge in part.edges)

    def concurrent(self, a: str, b: str) -> bool:
        """Whether partitions ``a`` and ``b`` (distinct) run in one pipeline group of J."""
        return a != b and any(a in group and b in group for group in self.pipelines)


@dataclass(frozen=True)
class Lifetime:
    """Closed, 1-based interval of schedule steps during which an edge's data is in memory."""

    first: int
    last: int

    def overlaps(self, other: Lifetime) -> bool:
        # Closed intervals: at the step where one edge is read and the other written, both
        # are in memory at once (thesis: e_23^1 on [2,3] and e_24^1 on [2,4] conflict).
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class SharedBuffer:
    """One buffer of the result: the edges it holds over time, and its size in tokens."""

    edges: tuple[Edge, ...]
    size: int


def lifetime(edge: Edge, schedule: tuple[Step, ...]) -> Lifetime:
    """Steps from the first run of ``edge.src`` to the last run of ``edge.dst`` (Alg. 8, l. 13-16).

    The thesis leaves open edges that cross a partition boundary (in APP, e_23^2 runs from P_2
    into P_3, and schedule_2 never runs l_3^2). We take the conservative reading: a producer
    missing from the schedule means the data is already there when the partition starts
    (step 1); a consumer missing means the data must survive to the partition's last step.
    """
    first = _steps_running(edge.src, schedule)
    last = _steps_running(edge.dst, schedule)
    return Lifetime(first[0] if first else 1, last[-1] if last else len(schedule))


def shared_buffer_reuse(app: Application) -> tuple[SharedBuffer, ...]:
    """Algorithm 8: greedily pack every edge of ``app`` into shared buffers."""
    conflicts = _conflict_test(app)
    buffers: tuple[SharedBuffer, ...] = ()
    # Visiting order matters to a greedy pass: partitions as given, edges as each lists them.
    for edge in app.edges:
        buffers = _place(edge, buffers, conflicts)
    return buffers


def total_size(buffers: tuple[SharedBuffer, ...]) -> int:
    """Tokens the buffers occupy together (thesis Eq. 2.7 before multiplying by token size)."""
    return sum(buffer.size for buffer in buffers)


def naive_size(app: Application) -> int:
    """Tokens of the naive allocation B^naive: one buffer per edge."""
    return sum(edge.size for edge in app.edges)


def _steps_running(layer: Layer, schedule: tuple[Step, ...]) -> list[int]:
    return [index for index, step in enumerate(schedule, start=1) if layer in step]


def _conflict_test(app: Application) -> Callable[[Edge, Edge], bool]:
    """Whether two edges are in memory at once and so may not share a buffer (Alg. 8, l. 7-18).

    The printed Alg. 8 hangs the ``else`` of line 12 on the ``if`` of line 10, which would
    compare step intervals only for edges of *different*, non-concurrent partitions (whose
    schedules share no clock) and never for edges of the *same* partition. The prose says the
    opposite, and its own example (e_23^1 and e_24^1 of P_1 may not share) needs it: the
    ``else`` belongs to line 9's ``if m != x``. So: different partitions conflict iff J runs
    them concurrently; the same partition conflicts iff the lifetimes overlap.
    """
    home = {edge.name: part for part in app.partitions for edge in part.edges}
    life = {edge.name: lifetime(edge, part.schedule)
            for part in app.partitions for edge in part.edges}

    def conflicts(a: Edge, b: Edge) -> bool:
        pa, pb = home[a.name], home[b.name]
        if pa.name != pb.name:
            # Non-concurrent partitions never hold data at the same time (e.g. CNN^1 and
            # CNN^2 of APP take turns per frame), so only a shared pipeline forbids sharing.
            return app.concurrent(pa.name, pb.name)
        return life[a.name].overlaps(life[b.name])

    return conflicts


def _place(edge: Edge, buffers: tuple[SharedBuffer, ...],
           conflicts: Callable[[Edge, Edge], bool]) -> tuple[SharedBuffer, ...]:
    """Put ``edge`` into the reusable buffer that grows least, or a new one (Alg. 8, l. 19-35)."""
    reusable = [k for k, buffer in enumerate(buffers)
                if not any(conflicts(edge, other) for other in buffer.edges)]
    if not reusable:
        return buffers + (SharedBuffer((edge,), edge.size),)
    # min() keeps the first of equal costs, as the strict ``cost < cost_min`` of line 31 does.
    best = min(reusable, key=lambda k: _growth(buffers[k], edge))
    chosen = buffers[best]
    grown = SharedBuffer(chosen.edges + (edge,), chosen.size + _growth(chosen, edge))
    return buffers[:best] + (grown,) + buffers[best + 1:]


def _growth(buffer: SharedBuffer, edge: Edge) -> int:
    # Line 30: a buffer only grows when the new edge needs more than it already has.
    return max(edge.size - buffer.size, 0)


def sequential(*layers: Layer) -> tuple[Step, ...]:
    """A schedule running one layer per step, in the order given."""
    return tuple((layer,) for layer in layers)


def thesis_example_app() -> Application:
    """APP of thesis Sec. 6.4: edge sizes from Table 6.1, partitions and schedules from Sec. 6.4.

    CNN^1 is one partition P_1 run l_1..l_5. CNN^2 is split into P_2 (l_1, l_2) and P_3
    (l_3, l_4), pipelined: J = {{P_2, P_3}}. Sec. 6.5.2 reprints schedule_2 as {l_2^2}, {l_3^2};
    that is a misprint, the definition in Sec. 6.4 ({l_1^2}, {l_2^2}) is used here.

    The pipelined edge l_2^2 -> l_3^2 appears twice in Table 6.1 (e_23^2(1), e_23^2(2)): one
    copy written by P_2 while P_3 reads the other. The thesis does not say which partition
    owns which copy; we give the first to its producer P_2 and the second to its consumer P_3
    (Table 6.2 comes out the same if both belong to P_2 or both to P_3). Edges are listed in
    Table 6.1 order, which is the order Alg. 8 visits them.
    """
    cnn1 = (
        Edge("e12^1", 1, 1, 2, 3072),
        Edge("e23^1", 1, 2, 3, 8192),
        Edge("e24^1", 1, 2, 4, 8192),
        Edge("e34^1", 1, 3, 4, 8192),
        Edge("e45^1", 1, 4, 5, 8192),
    )
    p1 = Partition("P1", 1, sequential(1, 2, 3, 4, 5), cnn1)
    p2 = Partition("P2", 2, sequential(1, 2),
                   (Edge("e12^2", 2, 1, 2, 3072), Edge("e23^2(1)", 2, 2, 3, 6272)))
    p3 = Partition("P3", 2, sequential(3, 4),
                   (Edge("e23^2(2)", 2, 2, 3, 6272), Edge("e34^2", 2, 3, 4, 10)))
    return Application((p1, p2, p3), (frozenset({"P2", "P3"}),))
