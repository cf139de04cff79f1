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
from tightfit.runtime.cost import CostModel, profile_id, step_key

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def small():
    g = tightfit.load("mobilenet_v1_025")
    phases, source = phases_for_rows(g, 16)
    return g, plan_parts(PlannedModel(g, "m"), phases, source)


def _no_timing(monkeypatch):
    def fail(run, samples=cost.SAMPLES):
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
    monkeypatch.setattr(cost, "_median_seconds", lambda run, samples=cost.SAMPLES: 1e-3)
    # Every step and the loop (1000 calls per timing) take the faked 1 ms.
    expected = len(p.steps()) * (1e-3 + 1e-6)
    assert CostModel(path, reprofile=True).plan_seconds(p, [g]) == pytest.approx(expected)
    path.write_text("{not json")
    assert CostModel(path).plan_seconds(p, [g]) == pytest.approx(expected)


def test_plan_time_is_its_steps_plus_the_loop(small, monkeypatch):
    """Predicted time = sum of step times + steps x the executor's per-step loop overhead."""
    g, p = small
    times = {}

    def fake(run, samples=cost.SAMPLES):
        return times.setdefault(len(times), 1e-4 * (len(times) + 1))

    monkeypatch.setattr(cost, "_median_seconds", fake)
    cm = CostModel(None)
    total = cm.plan_seconds(p, [g])
    steps = sum(cm.step_seconds(p, [g], s) for s in p.steps())
    assert total == pytest.approx(steps + len(p.steps()) * cm.loop_seconds)


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
