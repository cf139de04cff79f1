"""Tests for tightfit.techniques.reuse.order (memory-aware topological ordering)."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tightfit.techniques.reuse.order import (
    OrderModel,
    greedy_order,
    identity_order,
    is_topological,
    memory_order,
    peak_of_order,
    step_memories,
)

MAX_EXTENSIONS = 3000  # keeps brute-force enumeration cheap


# --------------------------------------------------------------------------
# Brute force oracle
# --------------------------------------------------------------------------


def all_orders(model: OrderModel):
    """Every topological order, generated in lexicographic order."""
    n = model.n
    need = [set(d) for d in model.deps]
    order, done = [], set()

    def rec():
        if len(order) == n:
            yield tuple(order)
            return
        for v in range(n):
            if v not in done and need[v] <= done:
                order.append(v)
                done.add(v)
                yield from rec()
                done.discard(v)
                order.pop()

    yield from rec()


def brute_force(model: OrderModel) -> tuple[int, tuple[int, ...]]:
    """(optimal peak, lexicographically smallest optimal order)."""
    best = None
    for o in all_orders(model):
        p = peak_of_order(model, o)
        if best is None or p < best[0]:
            best = (p, o)
    return best


def count_extensions(n: int, deps: list[list[int]]) -> int:
    need = [sum(1 << u for u in d) for d in deps]
    ways = [0] * (1 << n)
    ways[0] = 1
    for s in range(1 << n):
        if ways[s]:
            for v in range(n):
                if not s >> v & 1 and need[v] & ~s == 0:
                    ways[s | 1 << v] += ways[s]
    return ways[-1]


# --------------------------------------------------------------------------
# Graph generators
# --------------------------------------------------------------------------


def _add_block(kind: str, deps: list[list[int]], tail: int | None, draw, cap: int) -> int | None:
    """Append one CNN-like block after `tail`; returns the new tail."""
    src = [] if tail is None else [tail]
    n = len(deps)
    if kind == "conv" or n + 2 > cap:
        deps.append(src)
        return n
    if kind == "residual":  # x -> body... -> add(x, body)
        body = draw(st.integers(1, min(3, cap - n - 1)))
        prev = src
        for _ in range(body):
            deps.append(prev)
            prev = [len(deps) - 1]
        deps.append(prev + src)
        return len(deps) - 1
    if kind == "concat":  # x -> k branches -> concat
        ends = []
        k = draw(st.integers(2, 3))
        for _ in range(k):
            length = draw(st.integers(1, 2))
            if len(deps) + length + 1 > cap:
                break
            prev = src
            for _ in range(length):
                deps.append(prev)
                prev = [len(deps) - 1]
            ends += prev
        deps.append(ends or src)
        return len(deps) - 1
    # "random": arbitrary extra edges into earlier nodes
    pool = list(range(n))
    extra = draw(st.lists(st.sampled_from(pool), max_size=3, unique=True)) if pool else []
    deps.append(sorted(set(src + extra)))
    return n


@st.composite
def natural_deps(draw, max_nodes: int = 10) -> list[list[int]]:
    cap = draw(st.integers(1, max_nodes))
    shape = draw(st.sampled_from(["chain", "residual", "concat", "random", "mixed"]))
    deps: list[list[int]] = []
    tail = None
    while len(deps) < cap:
        kind = shape if shape != "mixed" else draw(
            st.sampled_from(["conv", "residual", "concat", "random"]))
        if kind == "chain":
            kind = "conv"
        if kind == "random" and shape == "random":
            tail = None if draw(st.booleans()) else tail
        tail = _add_block(kind, deps, tail, draw, cap)
    # Too many topological orders make brute force slow: serialise neighbours.
    i = 1
    while count_extensions(len(deps), deps) > MAX_EXTENSIONS:
        if i - 1 not in deps[i]:
            deps[i] = sorted(deps[i] + [i - 1])
        i += 1
    return deps


@st.composite
def models(draw, max_nodes: int = 10) -> OrderModel:
    deps = draw(natural_deps(max_nodes))
    n = len(deps)
    # Relabel so dependencies are not in id order (the imported order may not be topological).
    perm = draw(st.permutations(range(n))) if draw(st.booleans()) else list(range(n))
    new_deps: list[tuple[int, ...]] = [()] * n
    for i, d in enumerate(deps):
        new_deps[perm[i]] = tuple(perm[u] for u in d)
    sizes = st.integers(0, 64)
    out_bytes = draw(st.lists(sizes, min_size=n, max_size=n))
    scratch = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    has_consumer = {u for d in new_deps for u in d}
    sources = [v for v in range(n) if not new_deps[v]]
    sinks = {v for v in range(n) if v not in has_consumer}
    extra_in = draw(st.lists(st.integers(0, n - 1), max_size=2))
    extra_out = draw(st.lists(st.integers(0, n - 1), max_size=2))
    return OrderModel(
        deps=new_deps,
        out_bytes=out_bytes,
        scratch=scratch,
        graph_inputs_bytes=draw(sizes),
        input_consumers=tuple(sorted(set(sources + extra_in))),
        outputs=frozenset(sinks | set(extra_out)),
    )


def inception_chain(blocks: int, seed: int = 0, branches=(1, 2, 3, 2)) -> OrderModel:
    """stem -> [inception block] * blocks.  Each block: parallel branches of
    convs (wide intermediates, narrow branch outputs) joined by a concat;
    9 nodes per block with the default branches."""
    rng = random.Random(seed)
    deps: list[tuple[int, ...]] = [()]
    out, scr = [64], [0]
    x = 0
    for _ in range(blocks):
        ends = []
        for length in branches:
            prev = x
            for k in range(length):
                deps.append((prev,))
                out.append(rng.randint(8, 40) if k == length - 1 else rng.randint(60, 300))
                scr.append(rng.randint(0, 60))
                prev = len(deps) - 1
            ends.append(prev)
        deps.append(tuple(ends))
        out.append(rng.randint(40, 120))
        scr.append(0)
        x = len(deps) - 1
    return OrderModel(deps, out, scr, graph_inputs_bytes=32, input_consumers=(0,),
                      outputs=frozenset({x}))


def wide_block(chains: int, length: int = 3, seed: int = 0) -> OrderModel:
    """One source feeding many parallel chains joined at the end: no forced
    boundaries inside, so the exact search space is (length+1)**chains."""
    rng = random.Random(seed)
    deps: list[tuple[int, ...]] = [()]
    out, scr, ends = [50], [0], []
    for _ in range(chains):
        prev = 0
        for k in range(length):
            deps.append((prev,))
            out.append(rng.randint(5, 40) if k == length - 1 else rng.randint(20, 300))
            scr.append(rng.randint(0, 50))
            prev = len(deps) - 1
        ends.append(prev)
    deps.append(tuple(ends))
    out.append(30)
    scr.append(0)
    return OrderModel(deps, out, scr, 16, (0,), frozenset({len(deps) - 1}))


# --------------------------------------------------------------------------
# Reference semantics
# --------------------------------------------------------------------------


def test_peak_of_order_hand_computed_residual():
    # x(0) -> a(1) -> b(2) -> add(0, 2) = 3 ; input consumed by 0; output 3.
    m = OrderModel(deps=[(), (0,), (1,), (0, 2)], out_bytes=[10, 20, 30, 10],
                   scratch=[1, 2, 3, 4], graph_inputs_bytes=5, input_consumers=(0,),
                   outputs=frozenset({3}))
    # step 0: inputs 5 + out 10 + scratch 1                   = 16
    # step 1: x 10 + out 20 + scratch 2                        = 32
    # step 2: x 10 + a 20 + out 30 + scratch 3                 = 63
    # step 3: x 10 + b 30 + out 10 + scratch 4                 = 54
    assert peak_of_order(m, (0, 1, 2, 3)) == 63


def test_unconsumed_node_and_outputs():
    # 1 has no consumer and is not an output: only live during its own step.
    m = OrderModel(deps=[(), (0,), (0,)], out_bytes=[4, 100, 7], scratch=[0, 0, 0],
                   outputs=frozenset({2}))
    assert peak_of_order(m, (0, 1, 2)) == 104
    assert peak_of_order(m, (0, 2, 1)) == 4 + 7 + 100


def test_is_topological():
    m = OrderModel(deps=[(), (0,), (1,)], out_bytes=[1, 1, 1], scratch=[0, 0, 0])
    assert is_topological(m, (0, 1, 2))
    assert not is_topological(m, (1, 0, 2))
    assert not is_topological(m, (0, 1))
    assert not is_topological(m, (0, 1, 1))
    assert not is_topological(m, (0, 1, 3))
    with pytest.raises(ValueError):
        peak_of_order(m, (2, 1, 0))


def test_model_validation():
    with pytest.raises(ValueError):
        OrderModel(deps=[(1,), (0,)], out_bytes=[1, 1], scratch=[0, 0])  # cycle
    with pytest.raises(ValueError):
        OrderModel(deps=[(), (5,)], out_bytes=[1, 1], scratch=[0, 0])
    with pytest.raises(ValueError):
        OrderModel(deps=[()], out_bytes=[1, 2], scratch=[0])


def test_empty_model():
    m = OrderModel(deps=[], out_bytes=[], scratch=[])
    assert memory_order(m) == ()
    assert peak_of_order(m, ()) == 0


def test_finishes_a_branch_before_starting_the_next():
    # 0 -> big A (1) -> small (3) ; 0 -> big B (2) -> small (4) ; join(3, 4).
    # The imported order holds both big tensors at once (10 + 100 + 100).
    m = OrderModel(deps=[(), (0,), (0,), (1,), (2,), (3, 4)],
                   out_bytes=[10, 100, 100, 1, 1, 5], scratch=[0] * 6)
    assert peak_of_order(m, identity_order(m)) == 210
    order = memory_order(m)
    assert order == (0, 1, 3, 2, 4, 5)
    assert peak_of_order(m, order) == brute_force(m)[0] == 111


def test_duplicate_dependency_counts_once():
    m = OrderModel(deps=[(), (0, 0)], out_bytes=[5, 7], scratch=[0, 0])
    assert peak_of_order(m, (0, 1)) == 12


# --------------------------------------------------------------------------
# Property tests against brute force
# --------------------------------------------------------------------------

FAST = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(models())
def test_memory_order_is_lexicographically_first_optimum(m):
    best_peak, best_order = brute_force(m)
    order = memory_order(m)
    assert is_topological(m, order)
    assert peak_of_order(m, order) == best_peak
    assert order == best_order  # deterministic tie-break: smallest ids first


@FAST
@given(models(), st.sampled_from([0, 1, 3, 20]))
def test_small_budget_falls_back_never_worse_than_heuristics(m, budget):
    order = memory_order(m, max_states=budget)
    assert is_topological(m, order)
    p = peak_of_order(m, order)
    assert p <= peak_of_order(m, identity_order(m))
    assert p <= peak_of_order(m, greedy_order(m))
    assert p >= brute_force(m)[0]


@settings(max_examples=100, deadline=None)
@given(models())
def test_heuristics_and_determinism(m):
    assert is_topological(m, greedy_order(m))
    ident = identity_order(m)
    assert ident == next(all_orders(m))  # imported order = lexicographically first
    if all(u < v for v, d in enumerate(m.deps) for u in d):
        assert ident == tuple(range(m.n))
    rebuilt = OrderModel(list(m.deps), list(m.out_bytes), list(m.scratch),
                         m.graph_inputs_bytes, list(m.input_consumers), set(m.outputs))
    assert memory_order(m) == memory_order(rebuilt) == memory_order(m)


@settings(max_examples=60, deadline=None)
@given(models())
def test_decomposition_matches_monolithic_search(m):
    assert memory_order(m, decompose=False) == memory_order(m)


# --------------------------------------------------------------------------
# Larger graphs
# --------------------------------------------------------------------------


def test_decomposition_agrees_on_inception_chain():
    m = inception_chain(7, seed=1)  # 64 nodes
    whole = memory_order(m, decompose=False)
    assert memory_order(m) == whole
    assert peak_of_order(m, whole) < peak_of_order(m, identity_order(m))


@pytest.mark.parametrize("blocks", [7, 22])  # 64 and 199 nodes
def test_inception_chain_is_fast_and_never_worse(blocks):
    m = inception_chain(blocks, seed=blocks, branches=(1, 3, 3, 2))
    t0 = time.perf_counter()
    order = memory_order(m)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0
    assert is_topological(m, order)
    assert peak_of_order(m, order) <= peak_of_order(m, identity_order(m))
    assert peak_of_order(m, order) <= peak_of_order(m, greedy_order(m))
    assert memory_order(m) == order


def test_budget_bounds_work_on_wide_graph():
    m = wide_block(chains=14)  # 4**14 scheduled sets, no forced boundaries
    t0 = time.perf_counter()
    small = memory_order(m, max_states=2_000)
    assert time.perf_counter() - t0 < 2.0
    assert is_topological(m, small)
    p = peak_of_order(m, small)
    assert p <= peak_of_order(m, identity_order(m))
    assert p <= peak_of_order(m, greedy_order(m))
    assert memory_order(m, max_states=2_000) == small  # deterministic under budget
    none = memory_order(m, max_states=0)  # pure fallback
    assert is_topological(m, none)
    assert peak_of_order(m, none) == min(peak_of_order(m, identity_order(m)),
                                         peak_of_order(m, greedy_order(m)))


def test_wide_graph_solved_exactly_with_enough_budget():
    m = wide_block(chains=6, length=2, seed=3)  # 3**6 scheduled sets
    order = memory_order(m)
    assert peak_of_order(m, order) == brute_force_dp(m)


def brute_force_dp(m: OrderModel) -> int:
    """Optimal peak by exhaustive DP over all scheduled sets (no pruning).
    A step's memory depends only on the set already scheduled, so it is read
    off the reference evaluator for any completion of the prefix."""
    best: dict[frozenset, tuple[int, tuple[int, ...]]] = {frozenset(): (0, ())}
    frontier = [frozenset()]
    for _ in range(m.n):
        nxt: dict[frozenset, tuple[int, tuple[int, ...]]] = {}
        for s in frontier:
            peak, prefix = best[s]
            for v in range(m.n):
                if v not in s and set(m.deps[v]) <= s:
                    order = prefix + (v,)
                    step = step_memories(m, complete(m, order))[len(prefix)]
                    key = s | {v}
                    if key not in nxt or max(peak, step) < nxt[key][0]:
                        nxt[key] = (max(peak, step), order)
        best.update(nxt)
        frontier = list(nxt)
    return best[frozenset(range(m.n))][0]


def complete(m: OrderModel, prefix: tuple[int, ...]) -> tuple[int, ...]:
    order, done = list(prefix), set(prefix)
    while len(order) < m.n:
        v = min(u for u in range(m.n) if u not in done and set(m.deps[u]) <= done)
        order.append(v)
        done.add(v)
    return tuple(order)
