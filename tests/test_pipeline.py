"""The command layer's shape (docs/design.md, "The commands: one staged pipeline"): the CLI only
parses (its options objects equal the API's for the same request), reaches the techniques only
through the registry, and report.py writes no file."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tightfit.cli as cli
from tightfit import api
from tightfit.errors import OptionError
from tightfit.options import FitOptions, PlanOptions

FACE = Path(cli.__file__).parent


def parsed(argv: list[str]):
    return cli.build_parser().parse_args(argv)


def imports(path: Path) -> set[str]:
    """Every tightfit module a file imports (module level or in a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tightfit"):
            found |= {f"{node.module}.{a.name}" if node.module == "tightfit" else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tightfit")}
    return found


def test_the_cli_builds_the_options_the_api_builds():
    argv = ["plan", "minakova5", "--method", "parts", "--rows", "2", "--hold", "3,conv", "--input-shape", "1x1x12x12"]
    assert cli.plan_options(parsed(argv)) == PlanOptions("minakova5", "parts", rows=2, held=(3, "conv"), phases="",
                                                         input_shape=(1, 1, 12, 12))
    argv = ["plan", "minakova5", "--method", "tiling", "--budget", "8kB", "--time-limit", "5", "--out", "p.json"]
    assert cli.plan_options(parsed(argv)) == PlanOptions("minakova5", "tiling", budget=8000, time_limit=5.0,
                                                         phases="", out="p.json")
    argv = ["fit", "minakova5", "--budget", "5kB", "--min-fps", "30", "--seed", "3", "--with-params"]
    assert cli.fit_options(parsed(argv)) == FitOptions("minakova5", 5000, with_params=True, min_fps="30", seed=3,
                                                       time_limit=60.0)


def test_the_cli_and_the_api_plan_alike(tmp_path):
    """`tightfit plan --out` writes the plan `api.plan` returns for the same options."""
    from tightfit.plan import schema

    out = tmp_path / "p.json"
    assert cli.main(["plan", "minakova5", "--method", "parts", "--rows", "2", "--out", str(out)]) == 0
    mine, _ = api.plan("minakova5", "parts", rows=2)
    written = schema.read_plan(out)
    assert written.steps() == mine.steps() and written.buffers == mine.buffers


def test_an_option_of_another_method_is_one_line_from_the_api_too():
    with pytest.raises(OptionError, match="--rows and --phases go with --method parts"):
        api.plan("minakova5", rows=2)


def test_the_cli_reaches_the_techniques_only_through_the_registry():
    below = {m for m in imports(FACE / "cli.py") if m.split(".")[1] in
             {"techniques", "plan", "analysis", "runtime", "export", "kernels", "graph", "frontend"}}
    assert below == {"tightfit.techniques.registry"}


def test_report_only_formats():
    """No file is opened or written in report.py: writing belongs to the write stage (files.py)."""
    calls = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
             for n in ast.walk(ast.parse((FACE / "report.py").read_text())) if isinstance(n, ast.Call)}
    assert not calls & {"open", "write_text", "write_bytes", "mkdir", "output_folder", "replace", "rename"}
