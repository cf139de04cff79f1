"""A plan names its model file by a path relative to the plan file and by where the file was
(issue 22, acceptance 4): `tightfit run DIR/plan.json` works from any folder after `fit --out
DIR` and after DIR is moved; a model changed since is one clear line."""
from __future__ import annotations

import json
import shutil

import pytest

from onnx_chains import chain_model
from tightfit.cli import main
from tightfit.frontend import zoo
from test_plan_cli import ok


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m5.onnx").write_bytes(zoo.onnx_model("minakova5"))
    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


def test_fit_out_runs_from_any_folder_and_after_a_move(model_dir, monkeypatch, capsys):
    monkeypatch.chdir(model_dir / "work")
    ok(["fit", "../models/m5.onnx", "--budget", "6kB", "--out", "fitted", "--time-limit", "5"], capsys)
    plan = json.loads((model_dir / "work" / "fitted" / "plan.json").read_text())
    assert plan["models"][0]["spec"] == "../../models/m5.onnx"  # relative to the plan's folder
    monkeypatch.chdir(model_dir / "elsewhere")
    assert "max abs diff" in ok(["run", model_dir / "work" / "fitted" / "plan.json", "--verify"], capsys)
    moved = model_dir / "elsewhere" / "moved" / "deeper"
    moved.parent.mkdir()
    shutil.move(str(model_dir / "work" / "fitted"), moved)
    assert "max abs diff" in ok(["run", moved / "plan.json", "--verify"], capsys)
    monkeypatch.chdir(moved)
    ok(["run", "plan.json", "--verify"], capsys)


def test_plan_out_beside_the_model_moves_with_it(model_dir, monkeypatch, capsys):
    """A plan folder that holds its model too can be moved anywhere, the model's old place gone."""
    monkeypatch.chdir(model_dir / "models")
    ok(["plan", "m5.onnx", "--out", "plan.json"], capsys)
    assert json.loads((model_dir / "models" / "plan.json").read_text())["models"][0]["spec"] == "m5.onnx"
    shutil.move(str(model_dir / "models"), model_dir / "elsewhere" / "bundle")
    monkeypatch.chdir(model_dir / "work")
    ok(["run", model_dir / "elsewhere" / "bundle" / "plan.json", "--verify"], capsys)


def test_zoo_plans_keep_the_zoo_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ok(["plan", "minakova5", "--out", "p.json"], capsys)
    assert json.loads((tmp_path / "p.json").read_text())["models"][0]["spec"] == "minakova5"


OTHER = (("conv", 4, 17, 0), ("conv", 3, 16, 0))  # minakova5's input, another structure (3 output channels)


def test_a_changed_model_is_one_line(model_dir, monkeypatch, capsys):
    monkeypatch.chdir(model_dir / "work")
    ok(["plan", "../models/m5.onnx", "--out", "plan.json"], capsys)
    (model_dir / "models" / "m5.onnx").write_bytes(chain_model(OTHER, (1, 1, 32, 32)).SerializeToString())
    assert main(["run", "plan.json"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "another model" in lines[0] and "fingerprint" in lines[0], lines
    (model_dir / "models" / "m5.onnx").unlink()
    assert main(["run", "plan.json"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "model file of the plan not found" in lines[0], lines


def test_a_plan_written_without_the_json_suffix_runs_as_a_plan(model_dir, monkeypatch, capsys):
    """`plan --out p` writes the plan to the file p: `run p` reads it as a plan, not as a model."""
    monkeypatch.chdir(model_dir / "work")
    ok(["plan", "../models/m5.onnx", "--out", "p"], capsys)
    assert "verify vs reference executor: OK" in ok(["run", "p", "--verify"], capsys)
