"""Issue 21, acceptance 1 and 2 in full (slow): every zoo model's reuse plan; parts and tiling plans
of minakova5, mobilenet_v2, resnet18, googlenet, tiny-yolov2 and yolov2-16 at 1/2 and 1/8 of the
reuse arena; an overlay plan; an application of two CNNs. Each is exported, built with exactly
`-std=c99 -O2 -Wall -Wextra -Werror -pedantic`, run on the reference executor's seeded input and
compared, its whole process's peak held to weights + arena + 2 MiB; then built again with
-fsanitize=address,undefined (any report aborts the program: -fno-sanitize-recover) and compared.

Where a budget is below what the search reaches, the smallest plan it reaches is used (printed)."""
from __future__ import annotations

from pathlib import Path

import pytest

import tightfit
from tightfit.errors import BudgetError
from tightfit.api import check_export as check
from tightfit.export import export
from tightfit.frontend import zoo
from tightfit.plan.check import check_plan
from tightfit.techniques.interface import run_memory
from tightfit.units import human

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STRICT = ["-std=c99", "-O2"]  # the check adds -Wall -Wextra -Werror -pedantic
SEARCH_SECONDS = 60  # the CLI's default --time-limit
SANITIZED_RUN_SECONDS = 3600  # VGG-19 in plain C under ASan + UBSan: ~20 GFLOP unvectorised
SEARCHED = ("minakova5", "mobilenet_v2", "resnet18", "googlenet", "tiny-yolov2", "yolov2-16")

CASES = ([pytest.param(m, "reuse", None, id=f"reuse-{m}") for m in zoo.names()]
         + [pytest.param("yolov2-16", "tiling", "8-11:19x1:reuse:overlay", id="overlay-yolov2-16"),
            pytest.param(str(ROOT / "examples" / "adaptive.yaml"), "reuse", None, id="app-adaptive")]
         + [pytest.param(m, method, frac, id=f"{method}-{m}-1of{frac}")
            for m in SEARCHED for method in ("parts", "tiling") for frac in (2, 8)])


def plan_for(model: str, method: str, arg):
    if method == "reuse":
        return tightfit.api.plan(model)
    if isinstance(arg, str):
        return tightfit.api.plan(model, method=method, tiling=arg)
    reuse, graphs = tightfit.api.plan(model)
    budget = reuse.arena_bytes // arg
    try:
        return tightfit.api.plan(model, method=method, budget=budget, time_limit=SEARCH_SECONDS)
    except BudgetError as e:  # the search's own smallest: a second timed search may not reach it again
        assert e.smallest is not None, str(e)
        print(f"{model} {method}: 1/{arg} of the reuse arena ({human(budget)}) is below the search's reach; "
              f"using the smallest it reaches, {human(run_memory(e.smallest))}")
        check_plan(e.smallest, graphs)
        return e.smallest, graphs


@pytest.mark.parametrize("model,method,arg", CASES)
def test_exported_plan_builds_strict_matches_and_fits(model, method, arg, tmp_path):
    plan, graphs = plan_for(model, method, arg)
    sources = export(plan, graphs, tmp_path / "c")
    strict = check(plan, graphs, sources, tmp_path / "c", cflags=STRICT)
    assert strict.ok, f"outputs differ: max abs diff {strict.max_abs_diff} > {strict.tolerance}"
    assert strict.peak_rss <= strict.budget_bytes, \
        f"whole-process peak {human(strict.peak_rss)} > weights + arena + 2 MiB = {human(strict.budget_bytes)}"
    sanitized = check(plan, graphs, sources, tmp_path / "c", cflags=STRICT, sanitize=True,
                      timeout_s=SANITIZED_RUN_SECONDS)
    assert sanitized.ok, f"sanitized build: outputs differ: max abs diff {sanitized.max_abs_diff}"
