"""Tests for Alg. 8 of Minakova's thesis, Ch. 6 (shared-buffer reuse across CNNs)."""
from __future__ import annotations

import importlib.util
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

# Load the module by file: it is self-contained, and this keeps the test independent of
# whatever the package __init__ files import while other parts of tightfit are being built.
_PATH = Path(__file__).resolve().parents[1] / "src" / "tightfit" / "plan" / "shared_buffers.py"
_SPEC = importlib.util.spec_from_file_location("tightfit_plan_shared_buffers", _PATH)
sb = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = sb  # dataclasses look their module up while building classes
_SPEC.loader.exec_module(sb)

Edge, Partition, Application = sb.Edge, sb.Partition, sb.Application
seq = sb.sequential


def groups(buffers) -> list[tuple[frozenset[str], int]]:
    return [(frozenset(e.name for e in b.edges), b.size) for b in buffers]


# --- The thesis example APP -------------------------------------------------------------

TABLE_6_1 = [  # (edge, size) in the order of Table 6.1, B_1 .. B_9
    ("e12^1", 3072), ("e23^1", 8192), ("e24^1", 8192), ("e34^1", 8192), ("e45^1", 8192),
    ("e12^2", 3072), ("e23^2(1)", 6272), ("e23^2(2)", 6272), ("e34^2", 10),
]

TABLE_6_2 = [  # (edges, size) of B_1 .. B_4
    (frozenset({"e12^1", "e34^1", "e12^2"}), 8192),
    (frozenset({"e23^1", "e45^1", "e23^2(1)"}), 8192),
    (frozenset({"e24^1", "e23^2(2)"}), 8192),
    (frozenset({"e34^2"}), 10),
]


def test_table_6_1_naive_allocation():
    app = sb.thesis_example_app()
    assert [(e.name, e.size) for e in app.edges] == TABLE_6_1
    # The thesis (Sec. 6.5.1) prints 51446 for the naive total; Table 6.1's own sizes sum to
    # 51466 (3072 + 4*8192 + 3072 + 2*6272 + 10), so the printed total is a typo.
    assert sb.naive_size(app) == 51466


def test_app_uses_schedules_of_section_6_4():
    app = sb.thesis_example_app()
    # Sec. 6.5.2 reprints schedule_2 as {{l_2^2}, {l_3^2}}: a misprint. Sec. 6.4 defines
    # schedule_2 = {{l_1^2}, {l_2^2}} (P_2 holds l_1^2 and l_2^2), which is what we follow.
    assert [p.schedule for p in app.partitions] == [
        ((1,), (2,), (3,), (4,), (5,)), ((1,), (2,)), ((3,), (4,))]
    assert app.pipelines == (frozenset({"P2", "P3"}),)


def test_alg8_reproduces_table_6_2():
    buffers = sb.shared_buffer_reuse(sb.thesis_example_app())
    assert groups(buffers) == TABLE_6_2
    assert sb.total_size(buffers) == 24586


def test_alg8_thesis_lifetime_example():
    # Sec. 6.5.1: under schedule_1, e_23^1 lives in steps [2,3] and e_24^1 in [2,4].
    p1 = sb.thesis_example_app().partitions[0]
    life = {e.name: sb.lifetime(e, p1.schedule) for e in p1.edges}
    assert life["e23^1"] == sb.Lifetime(2, 3)
    assert life["e24^1"] == sb.Lifetime(2, 4)
    assert life["e23^1"].overlaps(life["e24^1"])


@pytest.mark.parametrize("owners", [("P2", "P3"), ("P2", "P2"), ("P3", "P3")])
def test_table_6_2_does_not_depend_on_who_owns_the_pipelined_edge(owners):
    # The thesis does not say which partition owns each copy of e_23^2; all readings agree.
    p1, p2, p3 = sb.thesis_example_app().partitions
    e12, copy1 = p2.edges
    copy2, e34 = p3.edges
    own = {"P2": [e12], "P3": []}
    for owner, copy in zip(owners, (copy1, copy2)):
        own[owner].append(copy)
    own["P3"].append(e34)  # keep the Table 6.1 visiting order
    app = Application((p1, replace(p2, edges=tuple(own["P2"])),
                       replace(p3, edges=tuple(own["P3"]))), (frozenset({"P2", "P3"}),))
    assert groups(sb.shared_buffer_reuse(app)) == TABLE_6_2


# --- Small hand-made cases --------------------------------------------------------------

def test_chain_alternates_two_buffers_and_touching_lifetimes_conflict():
    # e12 on [1,2], e23 on [2,3], e34 on [3,4]: neighbours touch at one step and so conflict
    # (a layer reads its input while writing its output); e12 and e34 can share.
    edges = (Edge("a", 1, 1, 2, 10), Edge("b", 1, 2, 3, 20), Edge("c", 1, 3, 4, 30))
    app = Application((Partition("P", 1, seq(1, 2, 3, 4), edges),))
    assert groups(sb.shared_buffer_reuse(app)) == [
        (frozenset({"a", "c"}), 30), (frozenset({"b"}), 20)]


def _two_partitions(pipelined: bool) -> Application:
    # Both edges live over steps [1,2] of their own partition.
    a = Partition("A", 1, seq(1, 2), (Edge("x", 1, 1, 2, 5),))
    b = Partition("B", 1, seq(3, 4), (Edge("y", 1, 3, 4, 7),))
    return Application((a, b), (frozenset({"A", "B"}),) if pipelined else ())


def test_concurrent_partitions_never_share():
    assert groups(sb.shared_buffer_reuse(_two_partitions(pipelined=True))) == [
        (frozenset({"x"}), 5), (frozenset({"y"}), 7)]


def test_non_concurrent_partitions_share_whatever_their_step_numbers():
    # This is where the printed Alg. 8 and its prose part ways: as printed, the ``else``
    # would compare the step intervals [1,2] and [1,2] of x and y (from different schedules)
    # and keep them apart. Following the prose, partitions that never run at once share.
    assert groups(sb.shared_buffer_reuse(_two_partitions(pipelined=False))) == [
        (frozenset({"x", "y"}), 7)]


def test_same_partition_overlap_is_checked():
    # The other half of the misbinding: as printed, edges of one partition would never be
    # compared at all and would always share.
    edges = (Edge("u", 1, 1, 3, 4), Edge("v", 1, 2, 3, 4))
    app = Application((Partition("P", 1, seq(1, 2, 3), edges),))
    assert len(sb.shared_buffer_reuse(app)) == 2


def test_best_fit_picks_least_growth_and_first_on_ties():
    # s, l, m are alive together, so they open three buffers; z, in a partition that never
    # runs at the same time, could go into any of them.
    edges = (Edge("s", 1, 1, 4, 10), Edge("l", 1, 1, 4, 100), Edge("m", 1, 1, 4, 100),
             Edge("z", 1, 4, 5, 90))
    p = Partition("P", 1, seq(1, 2, 3, 4), edges[:3])
    q = Partition("Q", 1, seq(4, 5), edges[3:])
    buffers = sb.shared_buffer_reuse(Application((p, q)))
    # s would grow by 80; l and m by 0; l comes first.
    assert groups(buffers) == [
        (frozenset({"s"}), 10), (frozenset({"l", "z"}), 100), (frozenset({"m"}), 100)]


def test_buffer_grows_to_its_largest_edge():
    a = Partition("A", 1, seq(1, 2), (Edge("x", 1, 1, 2, 5),))
    b = Partition("B", 2, seq(1, 2), (Edge("y", 2, 1, 2, 50),))
    assert groups(sb.shared_buffer_reuse(Application((a, b)))) == [(frozenset({"x", "y"}), 50)]


def test_lifetime_with_phases_and_partition_boundaries():
    # Data processing by parts: l_3 and l_4 alternate (thesis schedule'_1 style).
    schedule = ((1,), (2,), (3,), (4,), (3,), (4,))
    assert sb.lifetime(Edge("e", 1, 2, 3, 1), schedule) == sb.Lifetime(2, 5)
    assert sb.lifetime(Edge("e", 1, 3, 4, 1), schedule) == sb.Lifetime(3, 6)
    # Producer in another partition: alive from the start; consumer elsewhere: to the end.
    assert sb.lifetime(Edge("e", 1, 0, 3, 1), schedule) == sb.Lifetime(1, 5)
    assert sb.lifetime(Edge("e", 1, 2, 9, 1), schedule) == sb.Lifetime(2, 6)
    # A step may run several layers.
    assert sb.lifetime(Edge("e", 1, 1, 2, 1), ((1, 2), (3,))) == sb.Lifetime(1, 1)


def test_malformed_inputs_are_rejected():
    with pytest.raises(ValueError):
        Partition("P", 1, seq(1, 2), (Edge("e", 1, 3, 4, 1),))  # neither end scheduled
    with pytest.raises(ValueError):
        Partition("P", 1, seq(1, 2), (Edge("e", 2, 1, 2, 1),))  # edge of another CNN
    with pytest.raises(ValueError):
        Partition("P", 1, seq(2, 1), (Edge("e", 1, 1, 2, 1),))  # read before it is written
    with pytest.raises(ValueError):
        Partition("P", 1, (), ())
    p = Partition("P", 1, seq(1, 2), (Edge("e", 1, 1, 2, 1),))
    with pytest.raises(ValueError):
        Application((p,), (frozenset({"P", "Q"}),))  # J names an unknown partition
    with pytest.raises(ValueError):
        Application((p, replace(p, name="R")))  # edge names repeat
    with pytest.raises(ValueError):
        Edge("e", 1, 1, 2, -1)


# --- Invariants on random applications, against a brute-force conflict check ------------

def _random_app(rng: random.Random) -> Application:
    partitions: list[Partition] = []
    for cnn in range(1, rng.randint(1, 3) + 1):
        n = rng.randint(2, 5)
        cuts = sorted(rng.sample(range(2, n + 1), rng.randint(0, min(2, n - 1))))
        bounds = [1, *cuts, n + 1]
        chunks = [list(range(lo, hi)) for lo, hi in zip(bounds, bounds[1:])]
        chunk_of = {layer: i for i, chunk in enumerate(chunks) for layer in chunk}
        owned: list[list[Edge]] = [[] for _ in chunks]
        for src in range(1, n + 1):
            for dst in range(src + 1, n + 1):
                if rng.random() < 0.5:
                    continue
                name = f"c{cnn}e{src}{dst}"
                cs, cd = chunk_of[src], chunk_of[dst]
                # A pipelined edge belongs to its producer, its consumer, or both as two copies.
                homes = [cs] if cs == cd else rng.choice([[cs], [cd], [cs, cd]])
                for copy, home in enumerate(homes):
                    owned[home].append(Edge(f"{name}_{copy}", cnn, src, dst, rng.randint(1, 50)))
        for i, chunk in enumerate(chunks):
            rng.shuffle(owned[i])
            partitions.append(_random_partition(rng, f"N{cnn}P{i}", cnn, chunk, owned[i]))
    rng.shuffle(partitions)
    names = [p.name for p in partitions]
    pipelines = tuple(frozenset(rng.sample(names, rng.randint(2, len(names))))
                      for _ in range(rng.randint(0, 2))) if len(names) > 1 else ()
    return Application(tuple(partitions), pipelines)


def _random_partition(rng: random.Random, name: str, cnn: int, layers: list[int],
                      edges: list[Edge]) -> Partition:
    # Draw schedules until one is valid (no edge read for the last time before it is first
    # written); fall back to running the layers in order, which always is.
    for _ in range(50):
        try:
            return Partition(name, cnn, _random_schedule(rng, layers), tuple(edges))
        except ValueError:
            pass
    return Partition(name, cnn, seq(*layers), tuple(edges))


def _random_schedule(rng: random.Random, layers: list[int]) -> tuple[tuple[int, ...], ...]:
    # Random steps, layers repeating (phases) and sharing steps; every layer runs at least once.
    steps = [tuple(rng.sample(layers, rng.randint(1, len(layers))))
             for _ in range(rng.randint(0, 4))]
    for layer in layers:
        if not any(layer in step for step in steps):
            steps.insert(rng.randint(0, len(steps)), (layer,))
    return tuple(steps)


def _live_sets(part: Partition) -> list[set[str]]:
    """Brute force: at each step, which edges of ``part`` hold data (enumerated, no intervals)."""
    steps = range(len(part.schedule))
    runs = {layer: {s for s in steps if layer in part.schedule[s]} for layer in part.layers}
    live = []
    for s in steps:
        now = set()
        for e in part.edges:
            written = e.src not in runs or any(t <= s for t in runs[e.src])
            still_needed = e.dst not in runs or any(t >= s for t in runs[e.dst])
            if written and still_needed:
                now.add(e.name)
        live.append(now)
    return live


def _brute_conflicts(app: Application) -> set[frozenset[str]]:
    pairs: set[frozenset[str]] = set()
    for part in app.partitions:
        for now in _live_sets(part):
            pairs |= {frozenset((a, b)) for a in now for b in now if a != b}
    for group in app.pipelines:
        members = [p for p in app.partitions if p.name in group]
        for p in members:
            for q in members:
                if p.name != q.name:
                    pairs |= {frozenset((a.name, b.name)) for a in p.edges for b in q.edges}
    return pairs


def _clique_lower_bound(app: Application) -> int:
    # Edges alive at one step of a partition conflict pairwise; so do those of partitions
    # run together. Picking the heaviest step of each partition in a group gives a clique,
    # and each edge of a clique needs its own buffer at least as large as itself.
    size = {e.name: e.size for e in app.edges}
    heaviest = {p.name: max(sum(size[n] for n in now) for now in _live_sets(p))
                for p in app.partitions}
    bound = max(heaviest.values())
    for group in app.pipelines:
        bound = max(bound, sum(heaviest[name] for name in group))
    return bound


@pytest.mark.parametrize("seed", range(300))
def test_random_apps_respect_conflicts(seed):
    rng = random.Random(seed)
    app = _random_app(rng)
    buffers = sb.shared_buffer_reuse(app)
    order = {e.name: i for i, e in enumerate(app.edges)}
    conflicts = _brute_conflicts(app)

    # Every edge is in exactly one buffer, and each buffer is as large as its largest edge.
    placed = [e.name for b in buffers for e in b.edges]
    assert sorted(placed) == sorted(order)
    assert all(b.size == max(e.size for e in b.edges) for b in buffers)

    # No two edges in memory at once, or from concurrent partitions, share a buffer.
    for b in buffers:
        names = [e.name for e in b.edges]
        for i, a in enumerate(names):
            for c in names[i + 1:]:
                assert frozenset((a, c)) not in conflicts, (a, c)

    # Greedy, not wasteful: a buffer is opened only when every older buffer already held an
    # edge (visited earlier) that conflicts with the opener.
    for k, b in enumerate(buffers):
        opener = b.edges[0].name
        for older in buffers[:k]:
            assert any(order[e.name] < order[opener] and frozenset((e.name, opener)) in conflicts
                       for e in older.edges), (opener, older)

    total = sb.total_size(buffers)
    assert _clique_lower_bound(app) <= total <= sb.naive_size(app)
