"""Variable batch size DP (Choudhury et al. Sec. III): the paper's 3-layer worked example exactly,
the FBS and Greedy-VBS baselines, and an oracle that enumerates schedules and scores them with
an independent simulator of held activations (not the DP's own recurrences)."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tightfit.techniques.vbs.linear_dp import INF, LinearProfile, Step, fixed_batch, greedy_vbs, schedule, solve


def worked_example() -> LinearProfile:
    """in = out = b, ws(1) = ws(3) = b, ws(2) = 4b, time(i, 1) = 4, time(i, 2) = 3 per sample."""
    b = np.arange(3)
    units = np.stack([b, b, b])
    return LinearProfile(time=np.array([[INF, 4.0, 3.0]] * 3), inp=units, out=units,
                         ws=np.stack([b, 4 * b, b]))


def test_worked_example_tables():
    t = solve(worked_example(), 7)
    # The paper numbers layers from 1; here from 0: OPT[2,2,2,7] is opt_at(1, 1, 2, 7).
    assert t.opt_at(1, 1, 2, 7) == 4
    assert t.opt_at(0, 2, 2, 7) == 10
    assert t.exact_at(1, 1, 1, 5) == INF
    assert t.exact_at(1, 1, 2, 7) == INF
    assert t.per_sample == 10
    # The paper's initialisation line gives OPTExact[i,i,1,m] = 4 for 3 <= m <= 7 for every i,
    # but layer 2 needs in + out + ws = 1 + 1 + 4 = 6 units at batch 1: it is 4 only from m = 6
    # (as the same paragraph's OPT[2,2,1,m] = 4 for m = 6, 7 says).
    assert [t.exact_at(1, 1, 1, m) for m in range(3, 8)] == [INF, INF, INF, 4, 4]
    assert [t.exact_at(0, 0, 1, m) for m in range(3, 8)] == [4] * 5


def test_worked_example_schedule_and_baselines():
    p = worked_example()
    t = solve(p, 7)
    assert schedule(t) == [Step(0, 2), Step(1, 1), Step(1, 1), Step(2, 2)]  # batches 2, [1, 1], 2
    assert fixed_batch(p, 7, 2) == (1, 12.0)
    assert greedy_vbs(p, 7, 2) == ([], INF)  # layer 2 holds 2 + 2 and needs ws 4: 8 > 7


def _dp_space(i: int, j: int, b: int, exact: bool):
    """Every schedule the recurrences describe (in execution order), enumerated."""
    if i > j or b == 0:
        yield []
        return
    if exact:
        for k in range(i, j + 1):
            for before in _dp_space(i, k - 1, b, False):
                for after in _dp_space(k + 1, j, b, False):
                    yield before + [(k, b)] + after
        return
    for b1 in range(1, b + 1):
        for first in _dp_space(i, j, b1, True):
            for rest in _dp_space(i, j, b - b1, False):
                yield first + rest


def _simulate(profile: LinearProfile, steps, request: int) -> tuple[float, int]:
    """Run a schedule sample by sample: samples wait between layers; memory at a step is every
    waiting sample's activation plus the step's input, output and workspace. Returns (time per
    sample, peak units); raises if the schedule is not valid."""
    n = profile.layers
    waiting = [0] * (n + 1)
    waiting[0] = request
    per_sample = [int(profile.inp[i, 1]) for i in range(n)] + [int(profile.out[n - 1, 1])]
    peak, total = 0, 0.0
    for layer, b in steps:
        assert waiting[layer] >= b
        waiting[layer] -= b
        held = sum(c * per_sample[k] for k, c in enumerate(waiting))
        peak = max(peak, held + int(profile.inp[layer, b] + profile.out[layer, b] + profile.ws[layer, b]))
        waiting[layer + 1] += b
        total += b * profile.time[layer, b]
    assert waiting[n] == request
    return total / request, peak


def _random_profile(rng: random.Random, n: int, big_b: int) -> LinearProfile:
    act = [rng.randint(1, 3) for _ in range(n + 1)]  # units per sample at each boundary
    time = np.full((n, big_b + 1), INF)
    ws = np.zeros((n, big_b + 1), dtype=int)
    for i in range(n):
        t = rng.uniform(2, 6)
        for b in range(1, big_b + 1):
            t *= rng.uniform(0.7, 1.0)  # larger batches are no slower per sample
            time[i, b] = round(t, 3)
            ws[i, b] = rng.randint(0, 2) * b + rng.randint(0, 2)
    bs = np.arange(big_b + 1)
    inp = np.stack([act[i] * bs for i in range(n)])
    out = np.stack([act[i + 1] * bs for i in range(n)])
    return LinearProfile(time, inp, out, ws)


@pytest.mark.parametrize("seed", range(40))
def test_dp_agrees_with_enumerated_schedules(seed):
    rng = random.Random(seed)
    n, request = rng.randint(1, 3), rng.randint(1, 4)
    p = _random_profile(rng, n, request)
    scored = [_simulate(p, s, request) for s in _dp_space(0, n - 1, request, False)]
    least = min(peak for _, peak in scored)
    for memory in sorted({least - 1, least, least + 2, max(peak for _, peak in scored)}):
        t = solve(p, memory)
        best = min((tm for tm, peak in scored if peak <= memory), default=INF)
        assert t.per_sample == pytest.approx(best) if best < INF else t.per_sample == INF
        if best < INF:
            steps = [(s.layer, s.batch) for s in schedule(t)]
            tm, peak = _simulate(p, steps, request)
            assert peak <= memory and math.isclose(tm, best)


def test_profiles_of_a_zoo_model_from_the_analyser():
    """mobilenet_v1_025 in 64 KiB units: memory from the analyser's accounting, a made-up time
    that favours larger batches. VBS is never slower than FBS, its schedule fits when replayed,
    and with room for the whole request at every layer it is FBS at that batch."""
    import tightfit
    from tightfit.analysis.memory import layer_workspace
    from tightfit.techniques.vbs.linear_dp import linear_chain, linear_profile

    g = tightfit.load("mobilenet_v1_025")
    assert linear_chain(g) == [l.id for l in g.layers]
    unit = 64 * 1024
    p = linear_profile(g, 4, unit, lambda lid, b: (1 + b) * 1e-3)
    first = g.layers[0]
    assert p.inp[0, 3] == -(-g.tensors[first.inputs[0]].nbytes("fp32", 3) // unit)
    assert p.ws[0, 2] == -(-layer_workspace(g, first.id, batch=2) // unit)
    # The least memory at which FBS runs at batch 1, and at which it reaches batch 4.
    fbs1 = next(m for m in range(1, 1000) if fixed_batch(p, m, 4)[0] >= 1)
    fbs4 = next(m for m in range(fbs1, 1000) if fixed_batch(p, m, 4)[0] == 4)
    for memory in (fbs1, (fbs1 + fbs4) // 2, fbs4 - 1, fbs4):
        t = solve(p, memory)
        assert t.per_sample <= fixed_batch(p, memory, 4)[1] + 1e-12
        steps = schedule(t)
        assert [sum(s.batch for s in steps if s.layer == i) for i in range(p.layers)] == [4] * p.layers
    assert solve(p, fbs4).per_sample == pytest.approx(fixed_batch(p, fbs4, 4)[1])


def test_graph_with_branches_is_refused():
    import tightfit
    from tightfit.errors import OptionError
    from tightfit.techniques.vbs.linear_dp import linear_chain, linear_profile

    g = tightfit.load("onnxzoo-squeezenet")  # fire modules: two branches concatenated
    assert linear_chain(g) is None
    with pytest.raises(OptionError, match="without branches"):
        linear_profile(g, 2, 2**20, lambda lid, b: 1.0)


def test_vbs_plan_runs_the_planned_sub_batches(kernel_runs):
    """A DP schedule for 4 samples of mobilenet_v1_025 becomes a plan: it passes the checker, its
    kernels run exactly the planned sub-batch sizes, and every sample's output equals the
    reference executor's on that sample alone."""
    import tightfit
    from tightfit.plan.check import check_plan
    from tightfit.techniques.interface import PlannedModel
    from tightfit.techniques.vbs.linear_dp import linear_chain, linear_profile
    from tightfit.techniques.vbs.graph_dp import plan_schedule
    from tightfit.runtime.executor import ArenaExecutor
    from tightfit.reference import run_reference
    from tightfit.verify import compare

    g = tightfit.load("mobilenet_v1_025")
    p = linear_profile(g, 4, 64 * 1024, lambda lid, b: (1 + b) * 1e-3)
    fbs1 = next(m for m in range(1, 1000) if fixed_batch(p, m, 4)[0] >= 1)
    fbs4 = next(m for m in range(fbs1, 1000) if fixed_batch(p, m, 4)[0] == 4)
    steps = schedule(solve(p, (fbs1 + fbs4) // 2))
    assert len({s.batch for s in steps}) > 1  # a variable batch: more than one size
    chain = linear_chain(g)
    plan = plan_schedule(PlannedModel(g, "mobilenet_v1_025", 4), [(chain[s.layer], s.batch) for s in steps])
    check_plan(plan, [g])
    ran = kernel_runs(g)
    x = np.random.default_rng(0).standard_normal((4,) + g.shape(g.inputs[0])[1:], dtype=np.float32)
    out = ArenaExecutor(plan, [g], fill_nan=True).run(x)[0][g.outputs[0]]
    assert ran == [(s.layer, s.batch) for s in steps]
    for n in range(4):
        assert compare(out[n : n + 1], run_reference(g, x[n : n + 1])[g.outputs[0]]).ok
