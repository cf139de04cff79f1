"""Issue 37, point 5: numeric options validated in one line (finite, positive where they must be,
values starting with '-'), the size grammar parses every unit its error names, opsets outside the
supported range refused, --version, and fit's report saying what it counts and where time went."""
from __future__ import annotations

import re

import onnx
import pytest
from onnx import TensorProto, helper

from tightfit.cli import main
from tightfit.errors import OptionError
from tightfit.report import _search_line, _verdict, fit_text
from tightfit.units import parse_size


def _one_line(argv, capsys) -> str:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("tightfit: error: "), (code, captured.err)
    assert "usage:" not in captured.err and captured.out == ""
    return err[0]


@pytest.mark.parametrize("argv, said", [
    (["fit", "minakova5", "--budget", "10kB", "--seed", "-1"], "--seed"),
    (["fit", "minakova5", "--budget", "10kB", "--seed", "99999999999"], "--seed"),
    (["fit", "minakova5", "--budget", "10kB", "--time-limit", "nan"], "finite"),
    (["fit", "minakova5", "--budget", "10kB", "--time-limit", "inf"], "finite"),
    (["fit", "minakova5", "--budget", "10kB", "--time-limit", "0"], "--time-limit"),
    (["fit", "minakova5", "--budget", "10kB", "--time-limit", "-3"], "--time-limit"),
    (["plan", "minakova5", "--method", "parts", "--rows", "0"], "--rows"),
    (["plan", "minakova5", "--batch", "0"], "--batch"),
    (["fit", "minakova5", "--budget", "-5kB"], "must be positive"),
    (["fit", "minakova5", "--budget", "0"], "must be positive"),
    (["fit", "minakova5", "--budget", "2EiB"], "at most 1 EiB"),
    (["fit", "minakova5", "--bugdet", "5kB"], "unrecognized arguments"),
    (["export", "x.json"], "--out"),
    (["fit", "minakova5", "--budget", "10kB", "--seed", "one"], "--seed"),
    (["export", "x.json", "--out", "o", "--check", "--cflags", "-O2"], "is written --cflags=VALUE"),
])
def test_bad_values_are_one_line(capsys, argv, said):
    assert said in _one_line(argv, capsys)


def test_every_unit_the_size_error_names_parses():
    with pytest.raises(OptionError) as e:
        parse_size("12 bananas")
    units = re.findall(r"\b(B|[kMGTPE]B|[KMGTPE]iB)\b", str(e.value))
    assert {"TB", "EB", "TiB", "EiB", "kB", "KiB"} <= set(units)
    for unit in units:
        assert parse_size(f"1{unit}") >= 1
    assert parse_size("1TB") == 10**12 and parse_size("1EiB") == 2**60


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"tightfit \d+\.\d+\.\d+\n", capsys.readouterr().out)


@pytest.mark.parametrize("opset", [0, 22, 30])
def test_opsets_outside_the_supported_range_are_refused(tmp_path, capsys, opset):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / f"m{opset}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    line = _one_line(["inspect", str(path)], capsys)
    assert f"opset {opset} is not supported" in line and "1-21" in line


def _report(**chosen) -> dict:
    c = {"techniques": ["reuse"], "memory_bytes": 40_000, "arena_bytes": 40_000, "scratch_peak_bytes": 0,
         "lower_bound_bytes": 40_000, "predicted_fps": [10.0], "max_rel_diff_vs_reference": 0.0} | chosen
    return {"cnns": ["m"], "budget_bytes": 64 * 1024, "with_params": False, "param_bytes": int(13.3 * 2**20),
            "min_fps": [0.0], "fits": True, "early_exit": False, "evaluated": 66, "search_seconds": 138.0,
            "search_timing": {"search_seconds": 60.2, "profiling_seconds": 70.1, "finding_seconds": 7.7,
                              "profiled_shapes": 41, "passes": 2, "time_limit": 60.0},
            "threads": 1, "chosen_by": "speed", "timed_fps": [], "chosen": c, "front": [], "contributions": [],
            "peak": {"step": 0, "scratch_bytes": 0, "tensors": []}}


def test_the_verdict_says_when_only_the_analysis_can_tell():
    uncertain = _report(measured_memory_bytes=96 * 1024, measured_uncertainty_bytes=248 * 1024)
    assert _verdict(uncertain).startswith("fits (analysed")
    text = fit_text(uncertain)
    assert "between 0.000 MB (0 B) and 0.352 MB (344.00 KiB)" in text
    assert _verdict(_report(measured_memory_bytes=40_000, measured_uncertainty_bytes=4096)) == "fits"
    assert _verdict(_report()) == "fits"


def test_the_report_says_what_the_budget_counts_and_where_the_time_went():
    text = fit_text(_report())
    assert "budget covers activations (the weights, 13.30 MiB, are not counted; --with-params counts them)" in text
    line = _search_line(_report())
    assert line.startswith("searched 66 plans in 138.0 s: search 60.2 s of the 60 s limit, profiling 41 new step shapes 70.1 s")
    assert "finding them 7.7 s (1 more search passes)" in line
    assert "budget covers the weights (13.30 MiB) and the activations" in fit_text(_report() | {"with_params": True})


def test_plan_out_never_replaces_a_folder(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "mine.txt").write_text("mine")
    assert "is a folder" in _one_line(["plan", "minakova5", "--out", str(tmp_path / "p")], capsys)
    assert (tmp_path / "p" / "mine.txt").read_text() == "mine"
