"""Moved: fit's search is techniques/fit/ (space, sources, problem, search). This module keeps the
old import path for code on other branches until they are merged; new code imports
tightfit.techniques.fit."""
from tightfit.techniques.fit import (Constraints, FitApp, FitError, FitPoint, FitProblem, FitSearch, dominates,  # noqa: F401
                                     meeting, merge, pareto, run_memory, search, select, split_partitions)
