"""The public API. Each function is a door into the command pipeline (tightfit.pipeline) or one
of its stages (tightfit.stages, tightfit.files), the same the CLI goes through: `plan` and `fit`
build the command's options object (tightfit.options) from their keyword arguments."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Sequence

import numpy as np

from tightfit import pipeline, stages
from tightfit.analysis.memory import ModelMemory, account
from tightfit.export import BuildOptions
from tightfit.files import load_plan, portable, read_inputs, write_outputs, write_plan
from tightfit.frontend.load import load, load_ref
from tightfit.graph.ir import Graph
from tightfit.options import FitOptions, PlanOptions
from tightfit.plan.schema import Plan
from tightfit.stages import (FitOutcome, RunResult, check_export_mcu, execute, load_fit_app, plan_for_budget, plan_inputs,
                             reference_io)
from tightfit.techniques.fit import FitApp, SearchOptions

__all__ = ["FitOutcome", "RunResult", "check_export", "check_export_linux", "check_export_mcu", "execute", "fit", "inspect", "load", "load_fit_app",
           "load_plan", "load_ref", "plan", "plan_for_budget", "plan_inputs", "portable", "read_inputs", "reference_io", "run",
           "write_outputs", "write_plan"]

_FIT_OPTIONS = {f.name for f in fields(FitOptions)}


def inspect(graph: Graph, dtype: str = "fp32", workspace: str = "none", batch: int = 1) -> ModelMemory:
    return account(graph, dtype, workspace, batch)


def run(graph: Graph, x: np.ndarray | None = None, keep: Sequence[str] = (), threads: int = 1) -> RunResult:
    """Run the reference executor once on `x` (a seeded random input if None), on `threads` threads."""
    return stages.run_model(graph, x, keep, threads)


def plan(model: str, method: str = "reuse", **options) -> tuple[Plan, list[Graph]]:
    """Plan a model or an application file with a technique of the registry; returns (Plan,
    graphs), the plan checked. `options` are PlanOptions' fields (tightfit.options): planner,
    order, layout, batch, input_shape; for method "parts" `phases` {layer id or name: phases} or
    "max", or `rows` output rows per phase, `held` layers; for "tiling" `tiling`
    "0-7:5x5,8-15:2x2:reuse"; for "vbs" (the `batch` samples of a request with a variable batch
    size across layers) `unit_bytes` and `latency`. With `budget` bytes, the technique's search
    picks the fastest plan within it, timed by `cost` (a CostModel; default this machine's
    profile) within `time_limit` seconds of search. `model` may be module:factory; an
    application file's CNNs may only with `allow_code`."""
    return pipeline.plan_model(PlanOptions(model, method, **options))


def fit(app: FitApp, budget_bytes: int | None = None, **options) -> FitOutcome:
    """Every technique searched for the plan that fits `budget_bytes` (see stages.fit): `options`
    are FitOptions' fields (with_params, min_fps, seed, best_effort, cost, measure, timer,
    thorough, objective, time_limit, threads, say, ...), and any other keyword a field of the genetic
    search's SearchOptions (generations, pop_size, exhaustive_limit, max_steps)."""
    search = SearchOptions(**{k: v for k, v in options.items() if k not in _FIT_OPTIONS})
    own = {k: v for k, v in options.items() if k in _FIT_OPTIONS}
    return stages.fit(app, FitOptions(budget=budget_bytes, **({"search": search} | own)))


def check_export(plan_: Plan, graphs, sources, directory: str | Path, seed: int = 0, keep_io: str | Path | None = None,
                 **build):
    """Build an exported plan, run it on the seeded inputs, compare with the reference executor
    (tightfit.export.Check); `build` are BuildOptions' fields (cc, cflags, runs, sanitize,
    timeout_s). With `keep_io`, a folder: the inputs and reference outputs are left there as
    input.bin and reference.bin."""
    return stages.check_export(plan_, graphs, sources, directory, BuildOptions(**build), seed, keep_io)


def check_export_linux(plan_: Plan, graphs, sources, directory: str | Path, target: str, cflags=None, cc: str | None = None,
                       keep_io: str | Path | None = None):
    """Cross-build an exported plan for a Linux `target` (export.linux.TARGETS), run it under qemu
    on the seeded inputs and compare with the reference executor (export.linux.CrossCheck)."""
    return stages.check_export_linux(plan_, graphs, sources, directory, target, BuildOptions(cc, cflags), keep_io)
