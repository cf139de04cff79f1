"""Same seed, same profile, same front and pick (issue 20, acceptance 2): the fronts stored in
tests/golden/ were computed by the search before its refactor into techniques, with the fixed
synthetic profile of golden_fit.py; the search now must give them again."""
from __future__ import annotations

import json
import math

import pytest

from golden_fit import CASES, GOLDEN, figures

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def same(got, want) -> bool:
    """Equal, floats to 1e-12 relative (a sum regrouped may round in its last bit)."""
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=1e-12)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return got == want


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_golden_front_and_pick(case):
    want = json.loads((GOLDEN / f"fit_{case[0]}.json").read_text())
    got = json.loads(json.dumps(figures(case)))
    assert got["budget"] == want["budget"]
    assert same(got["front"], want["front"]), (got["front"], want["front"])
    assert same(got["search_pick"], want["search_pick"]) and same(got["fit_pick"], want["fit_pick"])
    assert got["plan_arena_bytes"] == want["plan_arena_bytes"]
