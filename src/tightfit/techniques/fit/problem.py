"""fit's problem: decodes genomes, evaluates them (memoised), keeps every point evaluated and
asks the techniques for candidates."""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Mapping, Sequence

from tightfit.graph.ir import Graph
from tightfit.techniques.deadline import Deadline, expired, share
from tightfit.plan.schema import Plan
from tightfit.techniques.fit.space import MAX_GROUPS, Candidate, CNNSpace, FitApp, FitPoint, cnn_spaces, merge
from tightfit.techniques.interface import Config, Problem, Technique, pareto, run_memory

# The share of fit's time limit its sources leave for the seeds, evaluated after them.
SEEDS_SHARE = 0.1


def _silent(line: str) -> None:
    pass


class _OutOfWork(Exception):
    """The genetic search reached its work bound."""


class _Seconds:
    """A prediction given as a function of whole plans only (a stand-in: no step times, so no
    technique that times parts of plans is asked)."""

    def __init__(self, plan_seconds: Callable[[Plan, Sequence[Graph]], float]):
        self.plan_seconds = plan_seconds


class FitProblem:
    """Decodes genomes, evaluates them (memoised) and keeps every point evaluated."""

    def __init__(self, app: FitApp, cost_seconds: Callable[[Plan, Sequence[Graph]], float],
                 param_bytes: int = 0, max_groups: int = MAX_GROUPS, layout: str = "nhwc", dtype: str = "fp32",
                 cost: Any = None, thorough: bool = False, stream_outputs: bool = False):
        self.app = app
        self.cost_seconds = cost_seconds
        self.cost = cost
        self.param_bytes = param_bytes
        self.spaces = cnn_spaces(app, max_groups, layout, dtype, thorough, stream_outputs)
        # the techniques' own settings every source is asked with (parts: outputs handed over by rows)
        self.settings = {"stream_outputs": True} if stream_outputs else {}
        self.points: dict[tuple, FitPoint] = {}
        self.exact: set[tuple] = set()  # keys of the points the memory side evaluated
        self._memory: dict[tuple, int] = {}
        self._seconds: dict[tuple[int, tuple], float] = {}
        self.on_evaluate: Callable[[int], None] = lambda n: None
        self.max_steps = math.inf
        self.deadline: Deadline | None = None  # the genetic search and the sources stop past it
        self.say: Callable[[str], None] = _silent

    @property
    def upper(self) -> list[int]:
        return [u for s in self.spaces for u in s.upper()]

    @property
    def size(self) -> int:
        return math.prod(u + 1 for u in self.upper)

    @property
    def exact_size(self) -> int:
        """The size of the space without the time-guided candidates: whether the space is
        enumerated is decided on it, so that the memory side (every exact genome when enumerated)
        is the same however many candidates a source's fastest pick added."""
        return math.prod(u + 1 if i else sum(c.exact for c in s.candidates) + 1
                         for s in self.spaces for i, u in enumerate(s.upper()))

    def split(self, genes: Sequence[int]) -> list[Sequence[int]]:
        out, i = [], 0
        for s in self.spaces:
            out.append(genes[i:i + s.width])
            i += s.width
        return out

    def keys(self, genes: Sequence[int]) -> tuple:
        return tuple(s.decode(x) for s, x in zip(self.spaces, self.split(genes)))

    def plan(self, genes: Sequence[int]) -> Plan:
        """The application plan of a genome (unplaced)."""
        return merge(self.app, [s.plan(k) for s, k in zip(self.spaces, self.keys(genes))])

    @property
    def planned_steps(self) -> int:
        return sum(s.planned_steps for s in self.spaces)

    def evaluate(self, genes: Sequence[int]) -> FitPoint:
        genes = tuple(int(v) for v in genes)
        keys = self.keys(genes)
        if keys not in self.points:
            if self.planned_steps > self.max_steps or (self.max_steps < math.inf and expired(self.deadline)):
                raise _OutOfWork
            memory = self.memory(genes)
            seconds = tuple(self._cnn_seconds(s, k) for s, k in zip(self.spaces, keys))
            self.points[keys] = FitPoint(genes, memory, seconds, tuple(s.label(k) for s, k in zip(self.spaces, keys)))
            self.on_evaluate(len(self.points))
        return self.points[keys]

    def memory(self, genes: Sequence[int]) -> int:
        """A genome's memory (as FitPoint.memory_bytes) without predicting its time."""
        keys = self.keys(genes)
        if keys not in self._memory:
            if len(self.spaces) == 1 and not self.app.concurrent:  # the application's plan is the CNN's
                self._memory[keys] = self.spaces[0].memory(keys[0]) + self.param_bytes
            else:
                plan = merge(self.app, [s.plan(k) for s, k in zip(self.spaces, keys)])
                self._memory[keys] = run_memory(plan, self.app.graphs) + self.param_bytes
        return self._memory[keys]

    def exact_genes(self, genes: Sequence[int]) -> bool:
        """Whether every CNN runs its layer genome or an exact candidate (no time-guided plan)."""
        return all(x[0] == 0 or s.candidates[x[0] - 1].exact for s, x in zip(self.spaces, self.split(genes)))

    def evaluate_exact(self, genes: Sequence[int]) -> FitPoint:
        """Evaluate for the memory side (which then counts the point)."""
        p = self.evaluate(genes)
        self.exact.add(self.keys(p.genes))
        return p

    def _cnn_seconds(self, space: CNNSpace, key: tuple) -> float:
        if (space.index, key) not in self._seconds:
            self._seconds[(space.index, key)] = self.cost_seconds(space.plan(key), [space.model.graph])
        return self._seconds[(space.index, key)]

    def add_candidates(self, sources: Mapping[str, Technique], budget_bytes: int | None,
                       meanwhile: Callable[[], None] = lambda: None) -> None:
        """`meanwhile`; then ask every technique of `sources` for candidates for each CNN that runs
        as one partition (a technique plans a whole CNN; a CNN split into partitions keeps the
        layer genome): its search with a brief Problem (run memory `budget_bytes` per CNN), the
        points it offers of its front."""
        predict = self.cost if self.cost is not None else _Seconds(self.cost_seconds)
        # `meanwhile` first, then the sources share the time left less SEEDS_SHARE of it (the
        # seeds are evaluated past the deadline) by their `fit_share`: the first source took all
        # of it on inception_v3 (the parts search, 60 s; tiling planned nothing) and fit ran 8 s
        # past a 60 s limit.
        meanwhile()
        reserve = SEEDS_SHARE * self.deadline.left() if self.deadline is not None else 0.0
        jobs = [(s, t) for s in self.spaces if len(s.partitions) == 1 for t in sources.values()]
        per_space: dict[int, list[Candidate]] = {}
        for i, (s, technique) in enumerate(jobs):
            fraction = technique.fit_share / sum(t.fit_share for _, t in jobs[i:])
            problem = Problem(s.model, budget_bytes, predict, Config(s.layout, s.dtype, None, settings=self.settings),
                              share(self.deadline, fraction, reserve), self.say, brief=True, quick=s.quick)
            per_space.setdefault(s.index, []).extend(candidates(technique, problem))
        for s in self.spaces:
            if s.index in per_space:
                # The exact candidates first: their genes then do not depend on how many
                # time-guided candidates a technique offered.
                s.candidates = tuple(sorted(per_space[s.index], key=lambda c: not c.exact))

    def seeds(self, exact: bool = False) -> list[tuple[int, ...]]:
        """Reuse only (both orders), parts everywhere (one row per phase; both alignments), the
        first groups by parts and the rest whole or in two parts (early layers hold the large
        tensors; the rest reuses memory after them), and every candidate of every source; each
        CNN alike. `exact`: the exact candidates only (the memory side's seeds: the same however
        many time-guided candidates a source offered for any CNN)."""
        genomes = []
        per_cnn = []
        for s in self.spaces:
            n = len(s.groups)
            count = sum(c.exact for c in s.candidates) if exact else len(s.candidates)
            candidates = [[i, 0, 0, 0] + [0] * n for i in range(1, count + 1)]
            per_cnn.append(self._layer_seeds(s) + candidates)
        for k in range(max(len(c) for c in per_cnn)):
            genomes.append(tuple(v for c in per_cnn for v in c[min(k, len(c) - 1)]))
        return list(dict.fromkeys(genomes))

    @staticmethod
    def _layer_seeds(s: CNNSpace) -> list[list[int]]:
        """One CNN's seeds of the layer genome (technique 0)."""
        up = s.upper()
        n = len(s.groups)
        whole = [[0, 0, 0, 0] + [0] * n, [0, 1, 0, 0] + [0] * n]
        finest = [[0, 0, 0] + up[3:], [0, 0, 1] + up[3:]]
        if s.quick:
            return whole + finest[:1]
        prefixes = [[0, 0, 0] + up[3:5 + k] + [min(rest, u) for u in up[5 + k:]]
                    for rest in (0, 1) for k in range(n - 1)]
        return whole + finest + prefixes

    def build_layer_seeds(self) -> None:
        """Every CNN's plans of its layer-genome seeds, their memory and their seconds: kept for
        the seeds' evaluation."""
        for s in self.spaces:
            for x in self._layer_seeds(s):
                key = s.decode(x)
                s.memory(key)
                self._cnn_seconds(s, key)

    def smallest_of_each(self, genomes: Sequence[Sequence[int]], per_cnn: int = 2) -> list[tuple[int, ...]]:
        """Per CNN, the `per_cnn` slices of `genomes` whose plans of that CNN alone need the least
        memory, in every combination (smallest first): CNNs that run one after another share
        memory, so the application's smallest plan combines small plans of each CNN, but not
        always each one's smallest (merged, a CNN's many small tile buffers may place worse than
        another's windows: app 6 of Table 6.6 needed 0.18 MB more from the smallest of each)."""
        best = []
        for s, slices in zip(self.spaces, zip(*(self.split(g) for g in genomes))):
            ranked = sorted({tuple(x) for x in slices}, key=lambda x: (s.memory(s.decode(x)), x))
            best.append(ranked[:per_cnn])
        return [tuple(int(v) for x in combo for v in x) for combo in itertools.product(*best)]

    def reuse_genes(self) -> tuple[int, ...]:
        return tuple(v for s in self.spaces for v in [0, 0, 0, 0] + [0] * len(s.groups))

    def floor(self) -> int | None:
        """The memory side's smallest memory (None before it ran)."""
        return min((self.points[k].memory_bytes for k in self.exact), default=None)

    def front(self) -> tuple[FitPoint, ...]:
        """The Pareto front of the points evaluated, less those below the memory side's smallest
        (found by time-guided search: another cost profile would not find them)."""
        floor = self.floor()
        return pareto([p for p in self.points.values() if floor is None or p.memory_bytes >= floor], tiebreak=lambda p: p.genes)


def candidates(technique: Technique, problem: Problem) -> list[Candidate]:
    """The candidate plans a technique offers for one CNN: points of its brief search's front,
    each drafted (unplaced) from its Config."""
    front = technique.search(problem)
    if front is None:
        return []
    model = problem.model
    return [Candidate(technique.name, p.labels[0], lambda p=p: technique.draft(model, p.config), p.exact)
            for p in technique.offers(front)]
