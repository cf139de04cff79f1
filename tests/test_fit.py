"""`fit`: the search over every technique (tightfit.techniques.fit) and the command that runs, verifies
and reports its choice (tightfit.stages). The search runs with a deterministic stand-in for the cost
model (steps and MACs), so fronts are exact and reproducible; the command runs with the real one."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest

import tightfit.stages as F
from tightfit import api
from tightfit.cli import main
from tightfit.plan.check import check_plan
from tightfit.techniques.fit import Constraints, FitProblem, dominates, search
from tightfit.plan.place import place
from test_parts_search import step_cost as parts_step_cost

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TWO_PIPELINES = """
cnns:
  - {name: big, model: minakova5}
  - {name: small, model: minakova5}
partitions:
  - {cnn: big, layers: 0}
  - {cnn: big, layers: 1-2}
  - {cnn: small, layers: all}
pipelines: [[0, 1]]
"""


def step_cost(plan, graphs) -> float:
    """A fixed cost per step plus one per MAC (deterministic; the parts search's tests use it)."""
    return parts_step_cost(graphs)(plan)


@pytest.fixture(scope="module")
def two_cnn_app(tmp_path_factory):
    path = tmp_path_factory.mktemp("app") / "app.yaml"
    path.write_text(TWO_PIPELINES)
    return F.load_fit_app(str(path))


def enumerate_space(app, candidates_from):
    """Every genome of the space (technique candidates included) evaluated independently."""
    full = FitProblem(app, step_cost)
    for s, other in zip(full.spaces, candidates_from.spaces):
        s.candidates = other.candidates
    return [full.evaluate(g) for g in itertools.product(*(range(u + 1) for u in full.upper))]


@pytest.mark.parametrize("spec", ["minakova5", "app"])
def test_no_enumerated_plan_dominates_the_front(spec, two_cnn_app):
    """The genetic search alone (no enumeration shortcut) on a tiny CNN and a tiny application of
    two CNNs, one in two pipelined partitions: exhaustive enumeration beats no point of its front."""
    app = F.load_fit_app("minakova5") if spec == "minakova5" else two_cnn_app
    problem = FitProblem(app, step_cost)
    found = search(problem, Constraints(1, (0.0,) * len(app.models)), seed=1, exhaustive_limit=0, source_budget=4500)
    assert not found.early_exit and not found.fits
    everything = enumerate_space(app, problem)
    assert len(everything) > found.evaluated or spec == "app"
    for p in found.front:
        assert not any(dominates(q, p) for q in everything), p
    # Every point of the front is a valid plan of the application.
    for p in found.front:
        plan = place(problem.plan(p.genes), app.graphs, "greedy_by_size")
        report = check_plan(plan, app.graphs)
        assert report.arena_bytes >= report.lower_bound


def test_same_seed_same_front():
    app = F.load_fit_app("minakova5")
    fronts = []
    for seed in (7, 7):
        problem = FitProblem(app, step_cost)
        found = search(problem, Constraints(1, (0.0,)), seed=seed, exhaustive_limit=0, generations=4)
        fronts.append([(p.genes, p.memory_bytes, p.seconds) for p in found.front])
    assert fronts[0] == fronts[1] and len(fronts[0]) > 1


def test_early_exit_when_reuse_fits():
    app = F.load_fit_app("minakova5")
    problem = FitProblem(app, step_cost)
    found = search(problem, Constraints(10**6, (0.0,)), seed=0)
    assert found.early_exit and found.fits and found.evaluated == 1
    assert found.chosen == found.reuse and found.chosen.labels == ("layer by layer, imported order",)


def test_fit_runs_verifies_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["fit", "minakova5", "--budget", "5000B", "--out", str(out), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    chosen = r["chosen"]
    assert r["fits"] and not r["early_exit"] and chosen["memory_bytes"] <= 5000 < r["reuse_only"]["memory_bytes"]
    assert chosen["max_rel_diff_vs_reference"] <= 1e-4 and chosen["measured_run_bytes"] >= 0
    assert sorted(p.name for p in out.iterdir()) == ["memory.png", "plan.json", "report.json", "report.txt"]
    assert "why it fits" in (out / "report.txt").read_text()
    assert any(m["memory_bytes"] == chosen["memory_bytes"] or m["memory_bytes"] <= chosen["memory_bytes"] for m in r["front"])
    assert main(["run", str(out / "plan.json"), "--verify"]) == 0


def off_by_one(plan, graphs):
    """The plan with one compute step reading its input rows one place off in their buffer:
    still schema-valid (the rows fit the buffer)."""
    for pi, part in enumerate(plan.partitions):
        for si, s in enumerate(part.steps):
            if s.kind != "compute" or not s.inputs:
                continue
            a = s.inputs[0]
            n, h, w = a.at
            shift = 1 if h + 1 + a.region.h <= plan.buffers[a.buffer].shape[2] else -1
            if h + shift >= 0 and len(plan.buffers[a.buffer].shape) == 4:
                moved = replace(a, at=(n, h + shift, w))
                steps = part.steps[:si] + (replace(s, inputs=(moved,) + s.inputs[1:]),) + part.steps[si + 1:]
                parts = plan.partitions[:pi] + (replace(part, steps=steps),) + plan.partitions[pi + 1:]
                return replace(plan, partitions=parts)
    raise AssertionError("no step to corrupt")


def test_a_corrupted_plan_is_caught_before_it_is_reported(tmp_path, capsys, monkeypatch):
    real = F.final_plan
    monkeypatch.setattr(F, "final_plan", lambda problem, point: off_by_one(real(problem, point), problem.app.graphs))
    out = tmp_path / "out"
    assert main(["fit", "minakova5", "--budget", "5000B", "--out", str(out)]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "internal error" in err[0] and "checker" in err[0] and not captured.out
    assert not out.exists()


def test_outputs_catch_a_corruption_the_checker_would_miss(monkeypatch):
    """Verification also compares outputs: with the checker bypassed, the same corruption fails."""
    app = F.load_fit_app("minakova5")
    problem = FitProblem(app, step_cost)
    plan = off_by_one(F.final_plan(problem, problem.evaluate(problem.seeds()[2])), app.graphs)
    monkeypatch.setattr(F, "checked", lambda plan, graphs: None)
    with pytest.raises(F.VerificationFailed, match="differs from the reference"):
        F.verify(plan, app.graphs)


@pytest.mark.parametrize("argv, words", [
    (["fit", "minakova5", "--budget", "100B"], ("smallest reachable memory", "best reachable fps")),
    (["fit", "minakova5", "--budget", "1MB", "--min-fps", "1e12"], ("smallest reachable memory", "best reachable fps")),
    (["fit", "minakova5", "--budget", "1MB", "--min-fps", "1,2"], ("--min-fps",)),
    (["fit", "minakova5", "--budget", "6kB", "--with-params"], ("parameters alone",)),
    (["fit", "minakova5", "--budget", "lots"], ("cannot read size",)),
    (["fit", "nosuch.yaml", "--budget", "1MB"], ("not found",)),
])
def test_bad_input_is_one_line_and_writes_nothing(argv, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tightfit: error:") and all(w in err[0] for w in words), err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, words", [
    ("cnns:\n  - {name: a, model: minakova5}\npartitions:\n  - {cnn: b, layers: all}\n", ("names CNN 'b'",)),
    ("cnns:\n  - {name: a, model: nosuchnet}\n", ("CNN 'a'", "nosuchnet")),
])
def test_app_naming_unknown_cnns(text, words, tmp_path, capsys):
    app = tmp_path / "app.yaml"
    app.write_text(text)
    out = tmp_path / "out"
    assert main(["fit", str(app), "--budget", "1MB", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not out.exists()


class StepCost:
    plan_seconds = staticmethod(step_cost)


class StepsCost(StepCost):
    """A stand-in that predicts steps too (the tiling search times parts of plans)."""

    @staticmethod
    def steps_seconds(plan, graphs, steps) -> float:
        return 50e-6 * len(steps)


def test_pipelined_application_by_parts_runs_as_a_stream(tmp_path):
    """One CNN in two pipelined partitions: the chosen plan splits layers inside a partition,
    keeps the tensor crossing them whole (a FIFO of two copies) and runs as a pipeline."""
    path = tmp_path / "app.yaml"
    path.write_text("cnns:\n  - {name: a, model: mobilenet_v1_025, input_shape: 1x3x64x64}\npartitions:\n  - {cnn: a, layers: 0-5}\n"
                    "  - {cnn: a, layers: 6-28}\npipelines: [[0, 1]]\n")
    app = F.load_fit_app(str(path))
    reuse = FitProblem(app, step_cost).evaluate(FitProblem(app, step_cost).reuse_genes())
    o = api.fit(app, int(reuse.memory_bytes * 0.8), cost=StepCost(), measure=False, generations=1, max_steps=3000)
    assert o.fits and o.memory_bytes <= reuse.memory_bytes * 0.8
    kinds = {b.kind for b in o.plan.buffers}
    assert "window" in kinds and any(b.copies == 2 and b.kind == "whole" for b in o.plan.buffers)
    assert o.plan.concurrent == ((0, 1),)
    fps = F.measure_fps(o.plan, app.graphs, runs=1)
    assert len(fps) == 1 and fps[0] > 0


def test_the_search_over_a_frozen_profile_measures_nothing_and_notes_what_it_lacks():
    """Searches are pure: over a frozen profile they never measure; a step shape the profile
    lacks is noted (to be measured by the command layer) and the search is repeatable."""
    from golden_fit import synthetic_profile

    from tightfit.analysis.predict import Predictor
    from tightfit.runtime.profiling import profiled_search

    app = F.load_fit_app("minakova5")
    cost = synthetic_profile()
    snapshot = cost.frozen()

    def front(predict, deadline):
        problem = FitProblem(app, predict.plan_seconds, cost=predict)
        found = search(problem, Constraints(1, (0.0,)), seed=3, exhaustive_limit=0, generations=2, source_budget=4500,
                       deadline=deadline)
        return [(p.genes, p.memory_bytes, p.seconds, p.labels) for p in found.front]

    empty = Predictor(snapshot)
    front(empty, None)
    assert empty.missing and not cost.seconds  # nothing measured: only noted
    first, profiling = profiled_search(cost, front)
    assert profiling.complete and profiling.shapes >= len(empty.missing) and profiling.passes > 1
    again = Predictor(cost.frozen())
    assert front(again, None) == first and again.complete


def test_smallest_of_each_combines_each_cnns_smallest_plans(two_cnn_app):
    """The seeds' two smallest plans of each CNN, in every combination, smallest first."""
    from tightfit.techniques.registry import fit_sources

    problem = FitProblem(two_cnn_app, step_cost)
    problem.add_candidates(fit_sources(), 4500, lambda: None)
    seeds = problem.seeds()
    combos = problem.smallest_of_each(seeds, per_cnn=2)
    per_cnn = [sorted({tuple(x) for x in slices}, key=lambda x, s=s: (s.memory(s.decode(x)), x))
               for s, slices in zip(problem.spaces, zip(*(problem.split(g) for g in seeds)))]
    assert len(combos) == len(set(combos)) == len(per_cnn[0][:2]) * len(per_cnn[1][:2])
    assert [tuple(x) for x in problem.split(combos[0])] == [ranked[0] for ranked in per_cnn]
    for combo in combos:
        assert all(tuple(x) in ranked[:2] for x, ranked in zip(problem.split(combo), per_cnn))


def test_a_large_cnn_is_searched_quickly_unless_thorough(monkeypatch):
    """A CNN of QUICK_LAYERS layers or more: reuse and parts-everywhere seeds only, no parts
    search, a tiling search over the small grids and few cuts, no genetic search; `thorough`
    searches it as a small one."""
    import tightfit.techniques.fit.space as PF
    import tightfit.techniques.tiling as T
    import tightfit.techniques.tiling.config_search as TS

    app = F.load_fit_app("minakova5")
    monkeypatch.setattr(PF, "QUICK_LAYERS", len(app.graphs[0].layers))
    asked = []
    monkeypatch.setattr(TS, "search_tiling", lambda *a, **k: asked.append(k) or T.TilingSearch(
        T.tiling_point(T.TilingSetting(()), 1, 1.0), (), 0, True, 1))

    def searched(thorough):
        problem = FitProblem(app, step_cost, cost=StepsCost(), thorough=thorough)
        search(problem, Constraints(1, (0.0,)), exhaustive_limit=0, generations=2, source_budget=4500)
        return problem

    quick = searched(False)
    assert quick.spaces[0].quick and len(FitProblem._layer_seeds(quick.spaces[0])) == 3
    assert not any(c.technique == "parts" for c in quick.spaces[0].candidates)
    assert max(n for n, m in asked[0]["options"].grids) == T.QUICK_GRID_LIMIT
    assert asked[0]["options"].cuts == T.candidate_cuts(app.graphs[0], T.QUICK_CUTS)
    assert len(quick.points) <= len(quick.seeds()) + 4  # the seeds and the combinations of the smallest
    full = searched(True)
    assert not full.spaces[0].quick and asked[1]["options"].grids is None
    assert any(c.technique == "parts" for c in full.spaces[0].candidates)
    assert len(full.points) > len(quick.points)
