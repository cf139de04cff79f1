"""The cost model: step keys, the on-disk profile (reuse, --reprofile, damage), and how a plan's
predicted time is made of its steps. No timing is asserted (benchmarks do that)."""
from __future__ import annotations

import json
import math

import pytest

import tightfit
from tightfit.techniques.parts.planner import phases_for_rows, plan_parts
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.runtime import cost
from tightfit.analysis import predict
from tightfit.analysis.predict import bytes_since_same_key, cold_fetches, footprints, step_key
from tightfit.runtime.cost import CostModel, profile_id

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def small():
    g = tightfit.load("mobilenet_v1_025")
    phases, source = phases_for_rows(g, 16)
    return g, plan_parts(PlannedModel(g, "m"), phases, source)


def _no_timing(monkeypatch):
    def fail(run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES):
        raise AssertionError("a step was timed although the profile holds it")

    monkeypatch.setattr(cost, "_median_seconds", fail)


def test_profile_is_reused_from_disk(small, tmp_path, monkeypatch):
    g, p = small
    path = tmp_path / "profile.json"
    first = CostModel(path).plan_seconds(p, [g])
    assert first > 0
    saved = json.loads(path.read_text())
    assert saved and all(set(entry) <= {"s", "h", "n", "c"} for entry in saved.values())
    _no_timing(monkeypatch)
    assert CostModel(path).plan_seconds(p, [g]) == first


def test_reprofile_and_damaged_profiles_measure_again(small, tmp_path, monkeypatch):
    g, p = small
    path = tmp_path / "profile.json"
    native, runs = _native_runs(CostModel(path), p, g)
    monkeypatch.setattr(cost, "_median_seconds", lambda run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES: 1e-3)
    # Every timing takes the faked 1 ms: a step alone (so it is timed once in its loop, 1 ms less
    # a loop iteration or a native call, which take 1 us: 1000 per timing), a loop iteration per
    # other step, a native call per run of native steps, and the one partition.
    n = len(p.steps())
    expected = n * (1e-3 - 1e-6) + ((n - native) + runs) * 1e-6 + 1e-3
    assert CostModel(path, reprofile=True).plan_seconds(p, [g]) == pytest.approx(expected)
    path.write_text("{not json")
    assert CostModel(path).plan_seconds(p, [g]) == pytest.approx(expected)


def test_plan_time_is_its_steps_plus_the_loop(small, monkeypatch):
    """Predicted time = per step, between its hot and its stirred time by the bytes touched since
    the same key last ran (a step on our own kernels: its hot time) + the executor's calls (a loop
    iteration per step, or one native call per run of steps on our own kernels) + the bytes fetched
    cold x the seconds per cold byte (the step's own where it touches COLD_PROBE_BYTES or more)."""
    g, p = small
    monkeypatch.setattr(cost, "_median_seconds", lambda run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES:
                        2e-4 if stir_bytes else 1e-4)
    cm = CostModel(None)
    steps = p.steps()
    total = cm.plan_seconds(p, [g])
    prints = footprints(p, [g], steps)
    keys = [step_key(p, [g], s) for s in steps]
    since = bytes_since_same_key(keys, [touched for touched, _ in prints])
    # A step's hot time is its timing less the loop's or the native call's overhead.
    hot = {k: 1e-4 - (cm.native_call_seconds if k in cm.native else cm.loop_seconds) for k in keys}
    warm = [hot[k] + (0.0 if k in cm.native else 1e-4 * min(1.0, d / predict.WARM_BYTES)) for k, d in zip(keys, since)]
    cold, code = cold_fetches(prints, seconds=warm, decay=cm.llc_decay)
    code_seconds = sum(chance * cm.seconds.get(predict.CODE_KEY + op, 0.0) for op, chance in filter(None, code))
    native, runs = _native_runs(cm, p, g)
    calls = (len(steps) - native) * cm.loop_seconds + runs * cm.native_call_seconds
    fetch = sum(c * cm.cold.get(k, cm.cold_byte_seconds) for k, c in zip(keys, cold))
    assert total == pytest.approx(sum(warm) + calls + fetch + code_seconds + cm.partition_seconds)
    # By its terms (what bench/predict.py prints for a plan it missed): the same figures, apart.
    terms = cm.plan_terms(p, [g])
    assert (terms.steps, terms.fetch, terms.code) == pytest.approx((sum(warm), fetch, code_seconds))
    assert terms.calls == pytest.approx(calls + cm.partition_seconds) and terms.total == pytest.approx(total)
    assert cm.plan_terms(p, [g], program=True).calls == 0.0
    assert native == len(steps) and runs == 1  # every step runs inside one tf_run call
    # Middle bands of a layer repeat within L2's reach of each other; a layer's first band does not.
    assert min(since) < predict.WARM_BYTES <= max(since)


def test_the_program_is_predicted_without_the_executors_calls(small, monkeypatch):
    """The exported program runs the same steps in the same tf_run calls, made from C: its
    prediction is the executor's less, per partition, the executor's Python around it and its
    ctypes call of tf_run."""
    g, p = small
    monkeypatch.setattr(cost, "_median_seconds", lambda run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES:
                        2e-4 if stir_bytes else 1e-4)
    cm = CostModel(None)
    executor, program = cm.plan_seconds(p, [g]), cm.plan_seconds(p, [g], program=True)
    calls = len(p.partitions) * (cm.partition_seconds + cm.native_call_seconds)
    assert calls > 0 and program == pytest.approx(executor - calls)


def _native_runs(cm: CostModel, plan, g) -> tuple[int, int]:
    """(steps on our own kernels, runs of consecutive such steps) of a plan, profiling it."""
    cm.plan_seconds(plan, [g])
    native = [step_key(plan, [g], s) in cm.native for s in plan.steps()]
    return sum(native), sum(1 for i, n in enumerate(native) if n and (i == 0 or not native[i - 1]))


def _touched(plan, g, s) -> int:
    def view(a):
        b = plan.buffers[a.buffer]
        return a.region.numel(b.shape) * b.itemsize

    weights = sum(g.params[q].nbytes for q in g.layers[s.layer].params) if s.kind == "compute" else 0
    return view(s.out) + sum(view(a) for a in s.inputs) + weights


def _cold_by_brute_force(prints, cache_bytes: int, seconds=(), decay: float = 0.0) -> tuple[list[float], list]:
    """Per access, walk back (across the previous run) to the previous access of its block,
    summing the bytes in between, what of them missed and the seconds of the steps begun in
    between; a round of all accesses from all misses, again until the misses settle."""
    accesses = [(i, block, nbytes) for i, (_, blocks) in enumerate(prints) for block, nbytes in blocks]
    n = len(accesses)
    begins = [a == 0 or accesses[a - 1][0] != accesses[a][0] for a in range(n)]
    sizes: dict = {}
    for _, block, nbytes in accesses:
        sizes[block] = max(sizes.get(block, 0.0), nbytes)
    overflows = sum(sizes.values()) > cache_bytes
    missed = [1.0 if overflows or decay else 0.0] * n
    for _ in range(predict.MISS_ROUNDS if any(missed) else 0):
        updated = []
        for a, (_, block, _) in enumerate(accesses):
            b, touched, between, aged = a - 1, 0.0, 0.0, 0.0
            while accesses[b % n][1] != block:
                touched += accesses[b % n][2]
                between += missed[b % n] * accesses[b % n][2]
                aged += decay * seconds[accesses[b % n][0]] if decay and begins[b % n] else 0.0
                b -= 1
            own = between / cache_bytes if overflows else 0.0
            updated.append(0.0 if touched < predict.NEAR_BYTES else 1.0 - math.exp(-own - aged))
        done = max(abs(u - m) for u, m in zip(updated, missed)) < predict.MISS_TOLERANCE
        missed = updated
        if done:
            break
    cold, code = [0.0] * len(prints), [None] * len(prints)
    for (i, block, nbytes), m in zip(accesses, missed):
        cold[i] += m * nbytes
        if block[0] == "code" and m > 0.0:
            code[i] = (block[1], m)
    return cold, code


@pytest.mark.parametrize("rows", [0, 8])
def test_cold_bytes_follow_the_misses_in_between(rows):
    g = tightfit.load("mobilenet_v1")
    model = PlannedModel(g, "r")
    p = plan_parts(model, *phases_for_rows(g, rows)) if rows else plan_reuse(model)
    prints = footprints(p, [g], p.steps())
    assert [touched for touched, _ in prints] == [_touched(p, g, s) for s in p.steps()]
    seconds = [1e-6 * (1 + i % 7) for i in range(len(prints))]
    for cache_bytes, decay in ((2**20, 0.0), (4 * 2**20, 0.0), (2**30, 0.0), (4 * 2**20, 500.0), (2**30, 500.0)):
        cold, code = cold_fetches(prints, cache_bytes, seconds, decay)
        brute_cold, brute_code = _cold_by_brute_force(prints, cache_bytes, seconds, decay)
        assert cold == pytest.approx(brute_cold, rel=1e-6, abs=1e-3)
        assert [c and c[0] for c in code] == [c and c[0] for c in brute_code]
        assert [c and c[1] for c in code] == pytest.approx([c and c[1] for c in brute_code], abs=1e-6)
    # Everything stays in a 1 GiB cache; a smaller cache misses more.
    assert not any(cold_fetches(prints, 2**30)[0])
    assert sum(cold_fetches(prints, 2**20)[0]) > sum(cold_fetches(prints, 4 * 2**20)[0]) > 0
    # The global pool, once a run, more likely finds its code evicted than any convolution,
    # which runs every few steps.
    chances = {}
    for c in filter(None, cold_fetches(prints, 4 * 2**20)[1]):
        chances[c[0]] = max(chances.get(c[0], 0.0), c[1])
    assert chances["global_pool"] > chances.get("conv", 0.0)


def test_a_block_written_just_before_misses_only_when_the_run_overflows_the_cache():
    """A random-replacement cache in its steady state: a run of blocks that fits misses nothing;
    one that does not misses even data written one step before, and the more the larger the run."""
    mb = 2**20

    def run(big: int) -> list[tuple[int, list]]:
        # a step writes block "a" (3 MB), one touches 2 MB, the next reads "a"; one touches `big`
        return [(3 * mb, [(("a",), 3.0 * mb)]), (2 * mb, [(("c",), 2.0 * mb)]), (3 * mb, [(("a",), 3.0 * mb)]),
                (big, [(("b",), float(big))])]

    fits = cold_fetches(run(mb), 8 * mb)[0]
    small, large = (cold_fetches(run(b * mb), 8 * mb)[0] for b in (16, 64))
    assert fits == [0.0] * 4
    assert 0.0 < small[2] < large[2] < 3 * mb


def test_other_work_on_the_host_evicts_by_the_seconds_in_between():
    """A run whose blocks fit: nothing misses on a host of our own; with other work evicting at
    `decay` per second, a block misses with chance 1 - exp(-decay x the seconds of the steps in
    between), unless it is used again within L2's reach."""
    near = predict.NEAR_BYTES
    # step 0 reads "w" once a run; steps 1 and 2 read "x", one right after the other
    prints = [(2 * near, [(("w",), 2.0 * near)]), (2 * near, [(("x",), 2.0 * near)]), (2 * near, [(("x",), 2.0 * near)])]
    seconds, decay = [1e-3, 2e-3, 3e-3], 100.0
    assert cold_fetches(prints, 8 * near, seconds)[0] == [0.0] * 3
    cold = cold_fetches(prints, 8 * near, seconds, decay)[0]
    assert cold == pytest.approx([2 * near * -math.expm1(-decay * 5e-3), 2 * near * -math.expm1(-decay * 1e-3), 0.0])


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_arena_spans_are_the_executors_views(layout):
    """The reuse walk's address range of every access is where the executor's view lies."""
    from tightfit.kernels.step_args import Context

    g = tightfit.load("mobilenet_v1_025")
    p = plan_parts(PlannedModel(g, "m"), *phases_for_rows(g, 5), layout=layout)
    ctx = Context(p, [g], 0)
    for s in p.steps():
        for a in (s.out,) + s.inputs:
            v = ctx.view(s.model, a)
            if 0 in v.dims:
                continue
            first = v.off * 4
            last = first + sum((n - 1) * st for n, st in zip(v.dims, v.strides)) * 4 + 4
            assert predict._arena_span(p, a) == (first, last), (s, a)


def test_profile_id_names_the_kernels_code(monkeypatch):
    one = profile_id()
    monkeypatch.setattr(cost.kernels, "code_digest", lambda: "other kernels")
    assert profile_id() != one


def test_identical_layers_share_a_key_and_border_bands_do_not():
    g = tightfit.load("mobilenet_v1")
    reuse = plan_reuse(PlannedModel(g, "r"))
    keys = [step_key(reuse, [g], s) for s in reuse.steps() if s.kind == "compute"]
    assert len(set(keys)) < len(keys)  # its five repeated 14x14 blocks measure once
    phases, source = phases_for_rows(g, 8)
    parts = plan_parts(PlannedModel(g, "r"), phases, source)
    conv0 = [s for s in parts.steps() if s.kind == "compute" and s.layer == 0]
    top, middle = conv0[0], conv0[1]
    assert top.out.region.h == middle.out.region.h
    assert step_key(parts, [g], top) != step_key(parts, [g], middle)  # the top band is padded
    assert step_key(parts, [g], conv0[1]) == step_key(parts, [g], conv0[2])



def test_a_step_is_timed_among_copies_of_itself_without_the_call_around_it(small, monkeypatch):
    """A short step's hot time is k copies run as the executor runs them, less the one native call
    (or the k loop iterations), over k: a lone timing also carries the call from Python and the
    clock's reading. Its stirred time adds what a stir costs a lone timing."""
    g, p = small
    own, call, clock, stir = 2e-6, 4e-7, 3e-7, 1e-6

    def fake(run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES):
        count = run.args[4]  # tf_run(arena, weights, indices, steps, count, ...)
        if count > 1:  # k copies in one call
            return count * own + call
        return own + call + clock + (stir if stir_bytes == cost.STIR_BYTES else 0.0)

    cm = CostModel(None)
    cm.record("native_call", call)
    cm.record("loop", 5e-8)
    cm.record("cold_byte", 0.0)
    monkeypatch.setattr(cost, "_median_seconds", fake)
    steps = [s for s in p.steps() if s.kind == "compute"]
    key = step_key(p, [g], steps[0])
    cm._profile(p, [g], steps[0], key)
    assert cm.hot_seconds[key] == pytest.approx(own)
    assert cm.seconds[key] == pytest.approx(own + stir)


def test_cold_byte_constant_is_a_median_over_repeated_probes(monkeypatch):
    """One probe taken during a moment's load on the shared cache does not move the constant that
    every cold byte of every plan is charged by."""
    warm, cold, outlier = 400e-6, 500e-6, 1500e-6
    colds = iter([outlier] + [cold] * (cost.COLD_BYTE_REPEATS - 1))

    def fake(run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES):
        return next(colds) if stir_bytes > cost.STIR_BYTES else warm

    monkeypatch.setattr(cost, "_median_seconds", fake)
    nbytes = 512 * 512 * 9 * 4  # the probe's weight
    assert cost._cold_byte_seconds() == pytest.approx((cold - warm) / nbytes)


def test_a_large_step_has_its_own_rate_per_byte_fetched_from_memory(monkeypatch):
    """A step touching COLD_PROBE_BYTES or more is also timed with the whole cache evicted; its
    extra time per byte touched is its rate (a classifier's matrix-vector product streams its
    weights, which a convolution's arithmetic hides); smaller steps use the profile's constant."""
    evicted, stirred, hot = 9e-4, 2e-4, 1e-4

    def fake(run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES):
        return evicted if stir_bytes == 2 * predict.CACHE_BYTES else stirred if stir_bytes else hot

    monkeypatch.setattr(cost, "_median_seconds", fake)
    g = tightfit.load("mobilenet_v1")
    plan = plan_reuse(PlannedModel(g, "m"))
    cm = CostModel(None)
    cm.plan_seconds(plan, [g])
    steps = plan.steps()
    touched = [t for t, _ in footprints(plan, [g], steps)]
    rated = {step_key(plan, [g], s): t for s, t in zip(steps, touched) if t >= predict.COLD_PROBE_BYTES}
    classifier = [s for s in steps if s.kind == "compute" and g.layers[s.layer].op == "gemm"]
    assert classifier and {step_key(plan, [g], s) for s in classifier} <= set(rated)
    assert cm.cold == pytest.approx({k: (evicted - stirred) / t for k, t in rated.items()})


def test_an_ops_code_cost_is_taken_from_its_smallest_probe(small, monkeypatch):
    """What evicted code costs is what is left of a cold timing after the data's fetch at the
    cold_byte rate; a step that touches less leaves less of its data's error in it, so a step a
    CODE_PROBE_SHRINK-th the size of the first probe measures it again (whichever plan a profile
    began with), and one not that much smaller does not."""
    g, p = small
    convs = [s for s in p.steps() if s.kind == "compute" and g.layers[s.layer].op == "conv"]
    touched = {id(convs[0]): 800_000, id(convs[1]): 500_000, id(convs[2]): 20_000}
    cold = iter([9e-4, 5e-4])
    monkeypatch.setattr(cost, "_footprint", lambda plan, graphs, step, chunk: (touched[id(step)], []))
    monkeypatch.setattr(cost, "_median_seconds", lambda run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES:
                        next(cold) if stir_bytes == 4 * cost.CACHE_BYTES else 1e-5)
    cm = CostModel(None)
    cm.record("cold_byte", 0.0)
    cm.record("native_call", 0.0)
    cm.record("loop", 0.0)
    code_key = predict.CODE_KEY + "conv"
    measured = []
    for s in convs[:3]:
        cm._profile(p, [g], s, step_key(p, [g], s))
        measured.append(cm.seconds[code_key])
    assert measured == pytest.approx([9e-4 - 1e-5, 9e-4 - 1e-5, 5e-4 - 1e-5])
