"""Tests for tightfit.plan.order (memory-aware topological ordering)."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tightfit.plan.order import (
    OrderModel,
    greedy_order,
    identity_order,
    is_topological,
    memory_order,
    peak_of_order,
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


def inception_chain(blocks: int, seed: int = 0) -> OrderModel:
    """stem -> [inception block]*blocks; each block: 4 branches (1x1 | 1x1,3x3 |
    1x1,3x3,3x3 | pool,1x1) joined by concat.  9 nodes per block."""
    deps: list[tuple[int, ...]] = [()]
    out, scr = [64], [0]
    x = 0
    rng = (seed * 2654435761 + 12345) % 2**32

    def size() -> int:
        nonlocal rng
        rng = (rng * 1103515245 + 12345) % 2**31
        return 8 + rng % 120

    for _ in range(blocks):
        ends = []
        for length in (1, 2, 3, 2):
            prev = x
            for _ in range(length):
                deps.append((prev,))
                out.append(size())
                scr.append(size() // 4)
                prev = len(deps) - 1
            ends.append(prev)
        deps.append(tuple(ends))
        out.append(sum(out[e] for e in ends))
        scr.append(0)
        x = len(deps) - 1
    return OrderModel(deps, out, scr, graph_inputs_bytes=32, input_consumers=(0,),
                      outputs=frozenset({x}))


def nas_like(cells: int, width: int = 5) -> OrderModel:
    """NASNet-ish cells reading the two previous cell outputs: no forced
    boundaries, so the exact search space grows exponentially."""
    deps: list[tuple[int, ...]] = [(), (0,)]
    out, scr = [48, 48], [0, 0]
    prev2, prev1 = 0, 1
    for c in range(cells):
        ops = []
        for k in range(width):
            deps.append(((prev1, prev2)[(c + k) % 2],))
            out.append(16 + (7 * k + 3 * c) % 40)
            scr.append((5 * k + c) % 11)
            ops.append(len(deps) - 1)
        deps.append(tuple(ops))
        out.append(48)
        scr.append(0)
        prev2, prev1 = prev1, len(deps) - 1
    return OrderModel(deps, out, scr, 16, (0,), frozenset({prev1}))


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


def test_prefers_branch_that_frees_memory():
    # Two branches from 0; branch A builds a big tensor then shrinks it.
    # Finishing A before starting B avoids holding B's big tensor alongside A's.
    m = OrderModel(deps=[(), (0,), (1,), (0,), (3,), (2, 4)],
                   out_bytes=[10, 100, 1, 100, 1, 5], scratch=[0] * 6)
    order = memory_order(m)
    assert peak_of_order(m, order) == brute_force(m)[0] == 111
    assert order == (0, 1, 2, 3, 4, 5)


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
    m = inception_chain(3, seed=1)
    whole = memory_order(m, decompose=False)
    assert memory_order(m) == whole
    assert peak_of_order(m, whole) <= peak_of_order(m, identity_order(m))


@pytest.mark.parametrize("blocks", [7, 22])  # 64 and 199 nodes
def test_inception_chain_is_fast_and_never_worse(blocks):
    m = inception_chain(blocks, seed=blocks)
    t0 = time.perf_counter()
    order = memory_order(m)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0
    assert is_topological(m, order)
    assert peak_of_order(m, order) <= peak_of_order(m, identity_order(m))
    assert peak_of_order(m, order) <= peak_of_order(m, greedy_order(m))


def test_wide_graph_fallback_is_bounded_and_never_worse():
    m = nas_like(cells=12)  # 74 nodes, no forced boundaries
    t0 = time.perf_counter()
    order = memory_order(m, max_states=5_000)
    assert time.perf_counter() - t0 < 2.0
    assert is_topological(m, order)
    p = peak_of_order(m, order)
    assert p <= peak_of_order(m, identity_order(m))
    assert p <= peak_of_order(m, greedy_order(m))
