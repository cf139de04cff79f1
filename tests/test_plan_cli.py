"""`tightfit plan` and `tightfit run plan.json` from the command line (tightfit.cli.main).

Good paths: a zoo model planned, written, read back, run and verified; every offset planner and
both layer orders; what `plan` prints; applications (two CNNs in one arena, a pipelined split).
Bad input: each gives one line on stderr starting 'tightfit: error:' and exit status 2
(DESIGN.md invariant 6)."""
from __future__ import annotations

import numpy as np

import json
import re
from pathlib import Path

import pytest

from tightfit import api
from tightfit.cli import main
from tightfit.plan.check import check_plan
from tightfit.plan.lifetimes import lifetimes
from tightfit.plan.place import planner_names
from tightfit.techniques.reuse.planner import ORDERS
from tightfit.runtime.executor import ArenaExecutor
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def ok(argv, capsys) -> str:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 0, (argv, out.out, out.err)
    return out.out


def err(argv, capsys) -> str:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    assert code == 2, (argv, code, out.out, out.err)
    lines = out.err.strip().splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("tightfit: error: "), lines[0]
    assert "Traceback" not in out.err
    return lines[0]


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Path]:
    """Plan files made once: mobilenet_v1 and minakova5 (default options)."""
    d = tmp_path_factory.mktemp("plans")
    out = {}
    for name in ("mobilenet_v1", "minakova5"):
        out[name] = d / f"{name}.json"
        assert main(["plan", name, "--out", str(out[name])]) == 0
    return out


def edited(src: Path, dst: Path, edit) -> Path:
    data = json.loads(src.read_text())
    edit(data)
    dst.write_text(json.dumps(data))
    return dst


# --- good paths ----------------------------------------------------------------------------------

def test_plan_mobilenet_v1_then_run_verify(plans, tmp_path, capsys):
    p = tmp_path / "p.json"
    text = ok(["plan", "mobilenet_v1", "--out", p], capsys)
    assert f"plan written to {p}" in text
    assert p.read_text() == plans["mobilenet_v1"].read_text()  # deterministic, byte for byte
    out = ok(["run", p, "--verify"], capsys)
    assert re.search(r"verify vs reference executor: OK", out), out


def test_run_measure_reports_the_peak_with_its_uncertainty(plans, capsys):
    """`run plan.json --measure`: the measured peak beside the analysed one, with how far the
    kernel's page counts may be off; the text says the same."""
    report = json.loads(ok(["run", plans["minakova5"], "--measure", "--json"], capsys))
    m = report["measured"]
    assert m["uncertainty_bytes"] > 0 and m["baseline_bytes"] > 0 and m["seconds"] > 0
    assert m["run_bytes"] - m["uncertainty_bytes"] <= report["analysed_peak_bytes"] + 64 * 1024
    assert re.search(r"measured peak above loaded baseline: .* \+/- .* \(analysed", ok(["run", plans["minakova5"], "--measure"], capsys))


def test_plan_prints_memory_figures(capsys):
    text = ok(["plan", "minakova5"], capsys)
    for needle in ("naive", "lower bound", "arena", "x lower bound", "planning time", "planner improve", "order imported"):
        assert needle in text, (needle, text)
    m = re.search(r"arena:\s+([\d.]+ \w+) \(([\d.]+) x lower bound\)", text)
    assert m and float(m.group(2)) >= 1.0, text
    report = json.loads(ok(["plan", "minakova5", "--json"], capsys))
    for key in ("naive_activation_bytes", "lower_bound_bytes", "arena_bytes", "ratio_to_lower_bound", "planning_seconds"):
        assert key in report, key
    assert report["arena_bytes"] >= report["lower_bound_bytes"]
    assert report["ratio_to_lower_bound"] == pytest.approx(report["arena_bytes"] / report["lower_bound_bytes"])


@pytest.mark.parametrize("planner", planner_names())
def test_every_planner(planner, tmp_path, capsys):
    p = tmp_path / f"{planner}.json"
    text = ok(["plan", "minakova5", "--planner", planner, "--out", p], capsys)
    assert f"planner {planner}" in text
    assert json.loads(p.read_text())["knobs"]["planner"] == planner
    assert "OK" in ok(["run", p, "--verify"], capsys)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_orders_and_layouts(order, layout, tmp_path, capsys):
    p = tmp_path / "p.json"
    text = ok(["plan", "mobilenet_v1_025", "--order", order, "--layout", layout, "--out", p], capsys)
    assert f"order {order}" in text and f"layout {layout}" in text
    assert "OK" in ok(["run", p, "--verify"], capsys)


def test_method_naive_and_layout_map(capsys):
    text = ok(["plan", "minakova5", "--method", "naive", "--layout-map"], capsys)
    assert "method naive" in text and "arena" in text and "|" in text


# --- plan files that must be refused --------------------------------------------------------------

def test_plan_for_another_model(plans, tmp_path, capsys):
    p = edited(plans["mobilenet_v1"], tmp_path / "other.json", lambda d: d["models"][0].update(spec="mobilenet_v1_025"))
    line = err(["run", p], capsys)
    assert "another model" in line and "mobilenet_v1_025" in line


def test_tampered_offset_overlaps_live_buffer(plans, tmp_path, capsys):
    plan, graphs = api.load_plan(plans["mobilenet_v1"])
    life = lifetimes(plan, graphs)
    # Two buffers live at the same step: move the second onto the first.
    (i, (bi, _)), (j, (bj, _)) = next(((i, ki), (j, kj)) for i, ki in enumerate(life.keys) for j, kj in enumerate(life.keys)
                                      if i < j and life.reqs[i].first_use <= life.reqs[j].last_use
                                      and life.reqs[j].first_use <= life.reqs[i].last_use)

    def edit(d):
        d["buffers"][bj]["offsets"][0] = d["buffers"][bi]["offsets"][0]

    line = err(["run", edited(plans["mobilenet_v1"], tmp_path / "t.json", edit), "--verify"], capsys)
    assert "overlap" in line and "live at the same time" in line


def test_tampered_region(plans, tmp_path, capsys):
    def edit(d):
        step = d["partitions"][0]["steps"][2]  # a compute step
        step["out"]["region"][3] -= 1  # h1 - 1

    line = err(["run", edited(plans["minakova5"], tmp_path / "t.json", edit)], capsys)
    assert "needs" in line or "do not hold" in line or "does not compute all" in line


def test_tampered_arena_size(plans, tmp_path, capsys):
    line = err(["run", edited(plans["minakova5"], tmp_path / "t.json", lambda d: d.update(arena_bytes=d["arena_bytes"] - 4))],
               capsys)
    assert "arena has" in line


@pytest.mark.parametrize("content, needle", [
    ("this is not json {", "not valid JSON"),
    ("[1, 2, 3]", "not a tightfit plan"),
    ('{"format": "something-else"}', "not a tightfit plan"),
    ("", "not valid JSON"),
])
def test_not_a_plan(tmp_path, capsys, content, needle):
    p = tmp_path / "p.json"
    p.write_text(content)
    assert needle in err(["run", p], capsys)


def test_wrong_format_version(plans, tmp_path, capsys):
    line = err(["run", edited(plans["minakova5"], tmp_path / "v.json", lambda d: d.update(version=99))], capsys)
    assert "version 99" in line


def test_plan_missing_field(plans, tmp_path, capsys):
    line = err(["run", edited(plans["minakova5"], tmp_path / "m.json", lambda d: d.pop("buffers"))], capsys)
    assert "buffers" in line


def test_plan_field_of_wrong_type(plans, tmp_path, capsys):
    line = err(["run", edited(plans["minakova5"], tmp_path / "m.json", lambda d: d["buffers"][0].update(offsets="zero"))],
               capsys)
    assert "buffer 0" in line


def test_plan_file_not_found(tmp_path, capsys):
    assert "not found" in err(["run", tmp_path / "nope.json"], capsys)


def test_unparsable_limit(plans, capsys):
    line = err(["run", plans["minakova5"], "--enforce", "--limit", "12XB"], capsys)
    assert "12XB" in line


def test_limit_without_enforce(plans, capsys):
    assert "--enforce" in err(["run", plans["minakova5"], "--limit", "1MB"], capsys)


def test_unknown_planner(capsys):
    line = err(["plan", "minakova5", "--planner", "best_fit_magic"], capsys)
    assert "best_fit_magic" in line and "improve" in line


def test_unknown_order(capsys):
    line = err(["plan", "minakova5", "--order", "reverse"], capsys)
    assert "reverse" in line and "memory" in line


def test_unknown_method_and_bad_batch(capsys):
    assert "method" in err(["plan", "minakova5", "--method", "magic"], capsys)
    assert "batch" in err(["plan", "minakova5", "--batch", "0"], capsys)


# --- applications -----------------------------------------------------------------------------------

def app(tmp_path: Path, text: str, name: str = "app.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_app_two_cnns_in_one_arena(tmp_path, capsys):
    a = app(tmp_path, "cnns:\n  - {name: a, model: minakova5}\n  - {name: b, model: mobilenet_v1_025}\n")
    p = tmp_path / "app.json"
    text = ok(["plan", a, "--out", p], capsys)
    assert "minakova5" in text and "mobilenet_v1_025" in text
    data = json.loads(p.read_text())
    assert [m["spec"] for m in data["models"]] == ["minakova5", "mobilenet_v1_025"]
    assert [pt["model"] for pt in data["partitions"]] == [0, 1]
    # One arena: the two run one after another, so it is the larger of the two, not their sum.
    single = {}
    for name in ("minakova5", "mobilenet_v1_025"):
        q = tmp_path / f"{name}.json"
        ok(["plan", name, "--out", q], capsys)
        single[name] = json.loads(q.read_text())["arena_bytes"]
    assert max(single.values()) <= data["arena_bytes"] < sum(single.values())
    out = ok(["run", p, "--verify"], capsys)
    assert "OK" in out


def test_app_same_cnn_twice(tmp_path, capsys):
    a = app(tmp_path, "cnns:\n  - {name: a, model: minakova5}\n  - {name: b, model: minakova5}\n")
    p = tmp_path / "twice.json"
    ok(["plan", a, "--out", p], capsys)
    assert "OK" in ok(["run", p, "--verify"], capsys)


def test_app_json_file(tmp_path, capsys):
    a = app(tmp_path, json.dumps({"cnns": [{"name": "a", "model": "minakova5"}]}), "app.json")
    p = tmp_path / "plan.json"
    ok(["plan", a, "--out", p], capsys)
    assert "OK" in ok(["run", p, "--verify"], capsys)


PIPELINED = """cnns:
  - {name: mn, model: mobilenet_v1_025}
partitions:
  - {cnn: mn, layers: 0-13}
  - {cnn: mn, layers: 14-28}
pipelines: [[0, 1]]
"""


def test_pipelined_app(tmp_path, capsys):
    p = tmp_path / "pipe.json"
    ok(["plan", app(tmp_path, PIPELINED), "--out", p], capsys)
    plan, graphs = api.load_plan(p)  # checks fingerprints and the plan
    report = check_plan(plan, graphs)
    assert [pt.layers for pt in plan.partitions] == [tuple(range(14)), tuple(range(14, 29))]
    assert plan.concurrent == ((0, 1),)
    fifo = [b for b in plan.buffers if b.copies == 2]
    assert len(fifo) == 1, "only the tensor between the two stages is double-buffered"
    b = fifo[0]
    lo, hi = sorted(b.offsets)
    assert hi >= lo + b.nbytes, "the FIFO's two copies overlap"
    (g,) = graphs
    assert b.shape == (1,) + g.shape(g.layers[13].output)[1:]
    # Buffers of the two stages never share bytes, even where their steps do not overlap in time.
    users = {}
    for pt in plan.partitions:
        for s in pt.steps:
            for a in (s.out, *s.inputs):
                users.setdefault(a.buffer, set()).add(pt.id)
    spans = {k: (o, o + plan.buffers[k].nbytes) for k in users for o in plan.buffers[k].offsets}
    first = [k for k, u in users.items() if u == {0}]
    second = [k for k, u in users.items() if u == {1}]
    for i in first:
        for j in second:
            for oi in plan.buffers[i].offsets:
                for oj in plan.buffers[j].offsets:
                    assert oi + plan.buffers[i].nbytes <= oj or oj + plan.buffers[j].nbytes <= oi, (i, j)
    assert report.arena_bytes >= report.lower_bound
    assert "OK" in ok(["run", p, "--verify"], capsys)


def test_pipelined_stream_matches_reference(tmp_path, capsys):
    """The pipeline runs stage k on frame f while stage k-1 works on frame f+1; every frame's
    outputs equal the reference run of that frame."""
    p = tmp_path / "pipe.json"
    ok(["plan", app(tmp_path, PIPELINED), "--out", p], capsys)
    plan, (g,) = api.load_plan(p)
    frames = [random_input(g, seed=s) for s in range(5)]
    got = {}
    n = ArenaExecutor(plan, [g], fill_nan=True).run_stream(frames, lambda f, outs: got.__setitem__(f, np.array(outs[0]["output"])))
    assert n == 5 and sorted(got) == list(range(5))
    for f, x in enumerate(frames):
        want = run_reference(g, x)["output"]
        assert float(np.abs(np.asarray(got[f]) - np.asarray(want)).max()) <= 1e-4 * float(np.abs(np.asarray(want)).max()), f"frame {f}"


@pytest.mark.parametrize("text, needle", [
    ("cnns:\n  - {name: a, model: resnet19}\n", "resnet19"),
    ("cnns:\n  - {name: a, model: minakova5}\npartitions:\n  - {cnn: a, layers: 0-1}\n  - {cnn: a, layers: 1-2}\n",
     "overlap"),
    ("cnns:\n  - {name: a, model: minakova5}\npartitions:\n  - {cnn: a, layers: 0-1}\n", "in no partition"),
    ("cnns:\n  - {name: a, model: minakova5}\npartitions:\n  - {cnn: a, layers: 0-7}\n", "does not exist"),
    ("cnns:\n  - {name: a, model: minakova5}\npartitions:\n  - {cnn: b, layers: all}\n", "not one of"),
    ("cnns:\n  - {name: a, model: minakova5}\npartitions:\n  - {cnn: a, layers: zero-two}\n", "cannot read layer range"),
    ("cnns:\n  - {name: a, model: minakova5}\npipelines: [[0, 5]]\n", "pipeline set"),
    ("cnns: []\n", "cnns"),
    ("cnns: [unclosed\n", "cannot read application file"),
    ("cnns:\n  - {name: a}\n", "name and a model"),
])
def test_bad_application_files(tmp_path, capsys, text, needle):
    line = err(["plan", app(tmp_path, text)], capsys)
    assert needle in line, line


# --- malformed plans that still crash (src bugs, reported) -------------------------------------------

def _swap_partition_models(d):
    d["partitions"][0]["model"], d["partitions"][1]["model"] = 1, 0


def _itemsize_8_with_room(d):
    b = d["buffers"][0]
    b["itemsize"], b["offsets"] = 8, [d["arena_bytes"]]
    d["arena_bytes"] += 8 * 32 * 32




@pytest.mark.parametrize("edit, needle", [
    pytest.param(lambda d: d.update(buffers=[1, 2]), "buffer", id="buffer-not-an-object"),
    pytest.param(lambda d: d["partitions"][0].update(steps=[1, 2]), "step", id="step-not-an-object"),
    pytest.param(lambda d: d["buffers"][0].update(itemsize=-1), "itemsize", id="negative-itemsize"),
    pytest.param(lambda d: d["buffers"][0].update(itemsize=8), "buffer", id="itemsize-8"),
    # The checker does not compare a buffer's itemsize with the plan's dtype, nor check that an
    # offset is a multiple of it: the executor then trips on its own assertion.
    pytest.param(_itemsize_8_with_room, "itemsize", id="itemsize-8-with-room"),
    pytest.param(lambda d: d["buffers"][-1].update(offsets=[d["buffers"][-1]["offsets"][0] + 1]), "offset",
                 id="offset-not-a-multiple-of-itemsize"),
    pytest.param(lambda d: d["partitions"][0]["steps"][1].update(kind="fold"), "step kind", id="unknown-step-kind"),
    pytest.param(lambda d: d["buffers"][0].update(layout="nwhc"), "layout", id="unknown-layout"),
])
def test_malformed_plan_json(plans, tmp_path, capsys, edit, needle):
    line = err(["run", edited(plans["minakova5"], tmp_path / "bad.json", edit)], capsys)
    assert needle in line


def test_partition_model_swapped(tmp_path, capsys):
    a = app(tmp_path, "cnns:\n  - {name: a, model: minakova5}\n  - {name: b, model: mobilenet_v1_025}\n")
    p = tmp_path / "app.json"
    ok(["plan", a, "--out", p], capsys)
    bad = edited(p, tmp_path / "swap.json", _swap_partition_models)
    err(["run", bad], capsys)
