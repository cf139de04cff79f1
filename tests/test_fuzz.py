"""Fuzzing (issue 23): random small CNNs edited at random (dims, attributes, initializers,
wiring), edited plan and application files, and odd option values, each put through the CLI.
Every case ends in exit 0 with verified outputs or exit 2 with one line: never a traceback, a
signal, a hang, a file left behind or a child process left running. The tests print the counts
per class and outcome, and every failure with the (class, seed) that reproduces it."""
from __future__ import annotations

import json

import pytest

import fuzzing


def _report(tally: fuzzing.Tally, capsys) -> None:
    with capsys.disabled():
        print("\n" + tally.table())
        for klass, key, kind, detail in tally.failures[:40]:
            print(f"  FAILED {key}: {kind}: {detail[:300]}")


def test_fuzz_default(tmp_path, capsys, one_torch_thread):
    """300+ cases (models by import, verification against onnxruntime and, every third, a plan
    run and verified; plan files; applications; option values)."""
    tally = fuzzing.campaign(n_models=150, n_plans=70, n_apps=50, n_cli=45, folder=tmp_path, seed0=0)
    _report(tally, capsys)
    assert tally.total() >= 300
    assert not tally.failures
    outcomes = {k for per in tally.counts.values() for k in per}
    assert {"ok", "refused"} <= outcomes  # the generator makes both good and bad inputs


@pytest.mark.slow
def test_fuzz_10000(tmp_path, capsys, one_torch_thread):
    """Progress and failures are printed as they happen (a long run), past pytest's capture."""
    import time

    def say(line: str) -> None:
        with capsys.disabled():
            print(time.strftime("%H:%M:%S"), line, flush=True)

    tally = fuzzing.campaign(n_models=4500, n_plans=2500, n_apps=1500, n_cli=1500, folder=tmp_path, seed0=100000, say=say)
    _report(tally, capsys)
    assert tally.total() >= 10000
    assert not tally.failures


@pytest.mark.parametrize("case", ["model", "plan", "app", "budget"])
def test_fuzz_real_processes(tmp_path, case):
    """A few cases as real processes: no signal (the C kernel reading past a weight was a
    segfault), one line, exit 2, nothing left in the folder."""
    if case == "model":  # a Conv whose weight's input channels do not match its input's
        import numpy as np
        from onnx import TensorProto, helper, numpy_helper

        w = numpy_helper.from_array(np.ones((16, 1, 3, 3), np.float32), "w")
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
        path = tmp_path / "m.onnx"
        path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString())
        argv = ["run", str(path), "--verify"]
    elif case == "plan":
        path = tmp_path / "p.json"
        path.write_text(json.dumps({"format": "tightfit-plan", "version": 1, "models": [[[[]]]] * 3}))
        argv = ["run", str(path), "--enforce"]
    elif case == "app":
        path = tmp_path / "app.yaml"
        path.write_text("cnns: [{name: a, model: minakova5}, {name: a, model: minakova5}]\n")
        argv = ["plan", str(path)]
    else:
        argv = ["fit", "minakova5", "--budget", "9" * 400]
    before = {p.name for p in tmp_path.iterdir()}
    status, out, err = fuzzing.run_subprocess(argv)
    outcome = fuzzing.classify(status, out, err)
    assert outcome.kind == "refused", (outcome, err[-2000:])
    assert {p.name for p in tmp_path.iterdir()} == before
