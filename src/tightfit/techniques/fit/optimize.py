"""fit's search (Minakova thesis Alg. 9): reuse alone if it meets the constraints; else seeds,
the memory side, NSGA-II and a local search around the front; and the choice among its points."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from tightfit.errors import TightfitError
from tightfit.techniques.deadline import Deadline, expired
from tightfit.techniques.fit.problem import FitProblem, _OutOfWork, _silent
from tightfit.techniques.fit.space import FitPoint
from tightfit.techniques.interface import Technique

POP_SIZE = 16
GENERATIONS = 20
EXHAUSTIVE_LIMIT = 512  # spaces at most this large are enumerated instead of searched
# Work bound of the genetic search, in steps of the CNN plans it builds (building and timing a
# plan costs about its steps): small CNNs run every generation, a large one stops early, the
# same way for the same seed.
MAX_STEPS = 100_000
MEMORY_ROUNDS = 16  # moves of the memory side's descent (each plans at most two per gene)


class FitError(TightfitError):
    """No plan meets the constraints; names the smallest memory and best fps reachable."""


# --- the search ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Constraints:
    budget_bytes: int | None  # bounds FitPoint.memory_bytes
    min_fps: tuple[float, ...]  # per CNN (0: none)

    def met(self, p: FitPoint) -> bool:
        return ((self.budget_bytes is None or p.memory_bytes <= self.budget_bytes)
                and all(f >= need for f, need in zip(p.fps, self.min_fps)))


@dataclass(frozen=True)
class FitSearch:
    chosen: FitPoint
    front: tuple[FitPoint, ...]
    evaluated: int
    fits: bool
    early_exit: bool
    reuse: FitPoint  # the reuse-only plan (Alg. 9 line 1)


def _smallest_first(p: FitPoint) -> tuple:
    return (p.memory_bytes, sum(p.seconds), p.genes)


def meeting(front: Sequence[FitPoint], constraints: Constraints) -> list[FitPoint]:
    """The points meeting every constraint, smallest memory first (then fastest)."""
    return sorted((p for p in front if constraints.met(p)), key=_smallest_first)


def select(front: Sequence[FitPoint], constraints: Constraints) -> tuple[FitPoint, bool]:
    """Alg. 9 lines 9-16: the smallest memory among the points meeting every constraint; if none,
    the smallest memory of the front (and False)."""
    ok = meeting(front, constraints)
    return (ok[0], True) if ok else (min(front, key=_smallest_first), False)


@dataclass(frozen=True)
class SearchOptions:
    """How `search` runs: its seed, the genetic search's population and generations and its work
    bound (`max_steps` steps of the plans it builds), the size of a space enumerated instead
    (`exhaustive_limit`), the techniques asked for candidates (`sources`, default the registry's
    fit sources) with `source_budget` (run memory per CNN), and what it reports to: `progress`
    (plans done, of how many), `say` (a line per phase), and its `deadline`."""

    seed: int = 0
    pop_size: int = POP_SIZE
    generations: int = GENERATIONS
    exhaustive_limit: int = EXHAUSTIVE_LIMIT
    sources: Mapping[str, Technique] | None = None
    source_budget: int | None = None
    max_steps: int = MAX_STEPS
    progress: Callable[[int, int], None] | None = None
    deadline: Deadline | None = None
    say: Callable[[str], None] = _silent


def search(problem: FitProblem, constraints: Constraints, options: SearchOptions | None = None, **settings) -> FitSearch:
    """Alg. 9: reuse alone if it meets the constraints (early exit); else a multi-objective
    genetic search (NSGA-II) seeded with every other planner's plans and polished by a local
    search around its front, or every genome when the space has at most `exhaustive_limit` of
    them. `options` (SearchOptions; `settings` replace its fields by name): `sources` are asked
    for candidates with `source_budget` (run memory per CNN). The genetic search stops early once
    its plans reach `max_steps` steps in all (seeds are always evaluated), and does not run when
    a CNN is searched quickly (QUICK_LAYERS). Deterministic for a given seed. Past `deadline`
    (checked between plans: the sources, the memory side's rounds, the enumeration, the genetic
    search) the search goes on to the next phase and answers from the plans found so far
    (reuse and the seeds are always evaluated); `say` gets a line per phase (what, how far,
    best so far)."""
    o = replace(options or SearchOptions(), **settings)
    say, deadline, sources, progress = o.say, o.deadline, o.sources, o.progress
    report = progress or (lambda done, total: None)
    reuse = problem.evaluate_exact(problem.reuse_genes())
    say(f"fit: reuse only: {_best(problem)}")
    # Without a budget the smallest plan meeting the minimum fps is wanted, not reuse alone.
    if constraints.budget_bytes is not None and constraints.met(reuse):
        report(1, 1)
        return FitSearch(reuse, (reuse,), len(problem.points), True, True, reuse)
    problem.deadline, problem.say = deadline, say
    # A space too large to enumerate even without candidates is searched from the seeds: their
    # plans are built before the sources share the time left.
    seeded = problem.size > o.exhaustive_limit
    if sources is None:
        from tightfit.techniques.registry import fit_sources

        sources = fit_sources()
    problem.add_candidates(sources, o.source_budget,
                           problem.build_layer_seeds if seeded else lambda: None)
    if problem.exact_size <= o.exhaustive_limit:  # (the time-guided candidates add at most a few times as many)
        total = _enumerate(problem, report, deadline, say)
    else:
        total = _evolve(problem, o.seed, o.pop_size, o.generations, o.max_steps, report, deadline, say)
    report(total, total)
    front = problem.front()
    say(f"fit: search done: {_best(problem)}")
    chosen, fits = select(front, constraints)
    return FitSearch(chosen, front, len(problem.points), fits, False, reuse)


def _enumerate(problem: FitProblem, report: Callable[[int, int], None], deadline: Deadline | None,
               say: Callable[[str], None]) -> int:
    """Every genome of a small space, until the deadline; the number of plans there were."""
    total = problem.size
    problem.on_evaluate = lambda n: report(n, total)
    for genes in itertools.product(*(range(u + 1) for u in problem.upper)):
        if expired(deadline):
            say(f"fit: time is up during the enumeration of {total} plans")
            break
        (problem.evaluate_exact if problem.exact_genes(genes) else problem.evaluate)(genes)
    say(f"fit: enumerated: {_best(problem)}")
    return total


def _evolve(problem: FitProblem, seed: int, pop_size: int, generations: int, max_steps: int,
            report: Callable[[int, int], None], deadline: Deadline | None, say: Callable[[str], None]) -> int:
    """The seeds, the memory side (seeds no time chose, a descent on memory alone), then the
    genetic search and its polish within `max_steps` planned steps; the plans it may evaluate."""
    total = pop_size * (generations + 1)
    problem.on_evaluate = lambda n: report(min(n, total), total)
    seeds = problem.seeds()
    for genes in seeds + problem.smallest_of_each(seeds):
        problem.evaluate(genes)
    exact = problem.seeds(exact=True)
    for genes in exact + problem.smallest_of_each(exact):
        problem.evaluate_exact(genes)
    say(f"fit: seeds: {_best(problem)}")
    quick = any(s.quick for s in problem.spaces)
    before = problem.planned_steps
    if not quick:
        _descend_memory(problem, deadline=deadline)
        say(f"fit: memory side: {_best(problem)}")
    # The work bound counts the seeds' and the genetic search's plans, not the descent's.
    max_steps += problem.planned_steps - before
    problem.max_steps = max_steps
    evaluate_report = problem.on_evaluate

    def on_evaluate(n: int) -> None:
        evaluate_report(n)
        if n % pop_size == 0:
            say(f"fit: genetic search: {_best(problem)}")

    problem.on_evaluate = on_evaluate
    try:
        if problem.planned_steps > max_steps or quick:
            # The seeds took the work (any new plan would stop it), or a CNN is searched quickly.
            raise _OutOfWork
        _nsga2(problem, seed, pop_size, generations)
        _polish(problem)
    except _OutOfWork:
        if expired(deadline):
            say("fit: time is up: the genetic search stops")
    problem.max_steps = math.inf
    return total


def _best(problem: FitProblem) -> str:
    """How far the search is and the best so far: plans evaluated, smallest memory, best fps."""
    points = list(problem.points.values())
    smallest = min(p.memory_bytes for p in points)
    fps = [max(p.fps[m] for p in points) for m in range(len(problem.spaces))]
    return (f"{len(points)} plans evaluated, smallest {smallest / 1e6:.3f} MB, best predicted fps "
            + ", ".join(f"{f:.1f}" for f in fps))


def _descend_memory(problem: FitProblem, rounds: int = MEMORY_ROUNDS, deadline: Deadline | None = None) -> None:
    """The memory side's local search: from its smallest point, every gene one step up and
    down (layer genome and exact candidates only), the move that lowers the memory most (ties:
    the smaller genome), until none does. Neighbours are planned, not timed: no time is looked
    at, and no new step shape is profiled for a plan that is not taken."""
    upper = problem.upper
    start = min((problem.points[k] for k in problem.exact), key=lambda p: (p.memory_bytes, p.genes))
    genes, best = start.genes, start.memory_bytes
    for _ in range(rounds):
        if expired(deadline):
            return
        moves = [m for m in (genes[:i] + (v,) + genes[i + 1:] for i, u in enumerate(upper)
                             for v in (genes[i] - 1, genes[i] + 1) if 0 <= v <= u) if problem.exact_genes(m)]
        step = min(moves, key=lambda m: (problem.memory(m), m), default=None)
        if step is None or problem.memory(step) >= best:
            return
        genes, best = step, problem.memory(step)
        problem.evaluate_exact(genes)


def _polish(problem: FitProblem) -> None:
    """Local search after the genetic one: every gene of every front point one step up and
    down, until the front stops changing (or the work bound stops it)."""
    upper = problem.upper
    tried: set[tuple[int, ...]] = set()
    while True:
        todo = [p.genes for p in problem.front() if p.genes not in tried]
        if not todo:
            return
        for genes in todo:
            tried.add(genes)
            for i, u in enumerate(upper):
                for v in (genes[i] - 1, genes[i] + 1):
                    if 0 <= v <= u:
                        problem.evaluate(genes[:i] + (v,) + genes[i + 1:])


def _nsga2(problem: FitProblem, seed: int, pop_size: int, generations: int) -> None:
    import numpy as np
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.optimize import minimize

    upper = np.array(problem.upper, dtype=float)
    n_obj = 1 + len(problem.spaces)

    class _Pymoo(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=len(upper), n_obj=n_obj, xl=np.zeros(len(upper)), xu=upper, vtype=int)

        def _evaluate(self, X, out, *args, **kwargs) -> None:
            out["F"] = np.array([problem.evaluate(np.rint(x).astype(int)).objectives() for x in X])

    rng = np.random.default_rng(seed)
    seeds = np.array(problem.seeds(), dtype=float)
    extra = rng.integers(0, upper + 1, size=(max(0, pop_size - len(seeds)), len(upper))).astype(float)
    start = np.vstack([seeds, extra])[: max(pop_size, len(seeds))]
    algorithm = NSGA2(pop_size=len(start), sampling=start, crossover=SBX(prob=0.9, eta=3, vtype=float, repair=RoundingRepair()),
                      mutation=PM(eta=3, vtype=float, repair=RoundingRepair()), eliminate_duplicates=True)
    minimize(_Pymoo(), algorithm, ("n_gen", generations + 1), seed=seed, verbose=False)
