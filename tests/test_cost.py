"""The cost model: step keys, the on-disk profile (reuse, --reprofile, damage), and how a plan's
predicted time is made of its steps. No timing is asserted (benchmarks do that)."""
from __future__ import annotations

import json

import pytest
import torch

import tightfit
from tightfit.plan.parts import phases_for_rows, plan_parts
from tightfit.plan.reuse import PlannedModel, plan_reuse
from tightfit.runtime import cost
from tightfit.runtime.cost import CostModel, cold_weight_bytes, profile_id, step_key

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
    assert saved["profile"] == profile_id() and saved["seconds"]
    _no_timing(monkeypatch)
    assert CostModel(path).plan_seconds(p, [g]) == first


def test_reprofile_and_damaged_profiles_measure_again(small, tmp_path, monkeypatch):
    g, p = small
    path = tmp_path / "profile.json"
    CostModel(path).plan_seconds(p, [g])
    monkeypatch.setattr(cost, "_median_seconds", lambda run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES: 1e-3)
    # Every step and the loop (1000 calls per timing) take the faked 1 ms.
    expected = len(p.steps()) * (1e-3 + 1e-6)
    assert CostModel(path, reprofile=True).plan_seconds(p, [g]) == pytest.approx(expected)
    path.write_text("{not json")
    assert CostModel(path).plan_seconds(p, [g]) == pytest.approx(expected)


def test_plan_time_is_its_steps_plus_the_loop(small, monkeypatch):
    """Predicted time = sum of step times + steps x the executor's per-step loop overhead +
    the weights fetched cold x the measured seconds per cold byte."""
    g, p = small
    times = {}

    def fake(run, samples=cost.SAMPLES, stir_bytes=cost.STIR_BYTES):
        return times.setdefault(len(times), 1e-4 * (len(times) + 1))

    monkeypatch.setattr(cost, "_median_seconds", fake)
    cm = CostModel(None)
    total = cm.plan_seconds(p, [g])
    steps = sum(cm.step_seconds(p, [g], s) for s in p.steps())
    cold = sum(cold_weight_bytes(p, [g], p.steps())) * cm.cold_byte_seconds
    assert total == pytest.approx(steps + len(p.steps()) * cm.loop_seconds + cold)


def _cold_by_brute_force(plan, g, cache_bytes: int) -> list[int]:
    """Per step with weights: walk back (across the previous run) to the layer's previous step,
    summing what the steps in between touch."""
    steps = plan.steps()

    def view(a):
        b = plan.buffers[a.buffer]
        return a.region.numel(b.shape) * b.itemsize

    def weights(s):
        return sum(g.params[q].nbytes for q in g.layers[s.layer].params) if s.kind == "compute" else 0

    touched = [view(s.out) + sum(view(a) for a in s.inputs) + weights(s) for s in steps]
    out = []
    for i, s in enumerate(steps):
        w = weights(s)
        if not w or w > cache_bytes:
            out.append(0)
            continue
        j, between = (i - 1) % len(steps), 0
        while steps[j].kind != "compute" or steps[j].layer != s.layer:
            between += touched[j]
            j = (j - 1) % len(steps)
        out.append(w if between > cache_bytes else 0)
    return out


@pytest.mark.parametrize("rows", [1, 8])
def test_cold_weights_follow_reuse_distance(rows):
    g = tightfit.load("resnet18")
    phases, source = phases_for_rows(g, rows)
    p = plan_parts(PlannedModel(g, "r"), phases, source)
    for cache_bytes in (2**20, 16 * 2**20, 2**30):
        cold = cold_weight_bytes(p, [g], p.steps(), cache_bytes)
        assert cold == _cold_by_brute_force(p, g, cache_bytes)
    cold = cold_weight_bytes(p, [g], p.steps(), 16 * 2**20)
    layer4 = [c for s, c in zip(p.steps(), cold) if s.kind == "compute" and g.layers[s.layer].params
              and sum(g.params[q].nbytes for q in g.layers[s.layer].params) > 8 * 2**20]
    # 9.4 MB convolutions, most bands with other layers' bands in between
    assert layer4 and sum(map(bool, layer4)) >= len(layer4) // 2
    assert not any(cold_weight_bytes(p, [g], p.steps(), 2**30))  # everything stays in a 1 GiB cache


def test_profile_id_names_the_thread_count():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = profile_id()
        torch.set_num_threads(2)
        assert profile_id() != one
    finally:
        torch.set_num_threads(before)


def test_identical_layers_share_a_key_and_border_bands_do_not():
    g = tightfit.load("resnet18")
    reuse = plan_reuse(PlannedModel(g, "r"))
    keys = [step_key(reuse, [g], s) for s in reuse.steps() if s.kind == "compute"]
    assert len(set(keys)) < len(keys)  # resnet's repeated blocks measure once
    phases, source = phases_for_rows(g, 8)
    parts = plan_parts(PlannedModel(g, "r"), phases, source)
    conv0 = [s for s in parts.steps() if s.kind == "compute" and s.layer == 0]
    top, middle = conv0[0], conv0[1]
    assert top.out.region.h == middle.out.region.h
    assert step_key(parts, [g], top) != step_key(parts, [g], middle)  # the top band is padded
    assert step_key(parts, [g], conv0[1]) == step_key(parts, [g], conv0[2])
