"""One search over every technique (Minakova thesis ch. 6, Algorithms 8-10, and beyond it): for one
CNN or an application of several, the plans on the memory/throughput Pareto front, and the one
that fits a memory budget and every CNN's minimum fps with the least memory.

The problem (pymoo style, separate from the algorithm): a genome per CNN, concatenated.
  [technique, order, align, source, group_1 .. group_G]
- technique 0: the layer genome below; technique i > 0: the i-th candidate plan a technique
  offered for this CNN (every technique of the registry marked as fit's source is searched with
  a brief Problem, techniques/interface.py, and offers points of its front);
- order: with no layer split, imported (0) or the memory-minimising order (1);
- align: rows per phase aligned to the producers' phases (1) or equal parts (0);
- source: the input arrives in 2^gene row bands;
- group_g: every splittable layer of group g computes its output in 2^gene phases (capped at its
  rows), i.e. k = rows / phases rows per phase. A small CNN has a group per layer; a large one
  groups contiguous layers of one resolution, long runs cut after their smallest tensor (at
  most `max_groups` genes).
Buffer reuse is always applied across every CNN of the application, pipeline-aware: one plan
holds every CNN's partitions, its buffers placed together (place()), partitions that run at the
same time never share memory and a tensor crossing pipelined partitions is a FIFO of two copies.
In a CNN with several partitions, the layers next to a crossing tensor stay whole (so the
crossing tensor is whole and every partition's steps keep their order).

Objectives: the application's run memory (from the analyser: the arena, i.e. its lower bound,
or with concurrent partitions the placed arena, plus the largest step's kernel temporaries; plus
the parameters with `with_params`) and the predicted seconds of every CNN (cost model).
Evaluations are memoised per genome and per CNN. The front is the Pareto set of every plan
evaluated, seeds included (reuse only, parts everywhere, the first groups by parts, every
source's candidates, and the combinations of each CNN's two smallest seeds), so it is never
worse than any of them; NSGA-II is followed by a local search around the front.

The memory side is timing-independent. Times guide NSGA-II, the local search and the sources'
fastest picks, so what they find depends on the cost profile. The memory side never looks at a
time: reuse only, the layer-genome seeds, every source's smallest plan (found by its own memory
side), the combinations of each CNN's smallest of these, a descent on memory alone from the
smallest, or in a small space every genome of these. The front keeps no point below the memory
side's smallest, so the smallest plan `fit` reports, and whether a budget can be met, are the
same under any cost profile (and the same seed).

Modules: space.py (the application, one CNN's genome and the plans it decodes to, merging them),
problem.py (evaluation, memoised; the techniques' candidates), optimize.py (Alg. 9:
seeds, the memory side, NSGA-II, the local search, choosing).
"""
from tightfit.techniques.fit.problem import FitProblem
from tightfit.techniques.fit.optimize import Constraints, FitError, FitSearch, SearchOptions, meeting, search, select
from tightfit.techniques.fit.space import FitApp, FitPoint, merge, split_partitions
from tightfit.techniques.interface import dominates, pareto, run_memory

__all__ = ["Constraints", "FitApp", "FitError", "FitPoint", "FitProblem", "FitSearch", "SearchOptions", "dominates", "meeting", "merge",
           "pareto", "run_memory", "search", "select", "split_partitions"]
