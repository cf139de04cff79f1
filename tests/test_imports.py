"""The layering: imports in src/tightfit point one way and form no cycle (docs/design.md, Layout).

Every import is read from the source with `ast` (module level and inside functions, `import x`,
`from x import y`, relative imports), so an import hidden in a function to dodge a cycle counts.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "tightfit"

# The one rule table: layer -> the other layers its modules may import (a layer's modules may
# import each other). docs/design.md's Layout section shows the same table (checked below). A subpackage
# of tightfit is its own layer; top-level modules are the face or the base. The techniques are,
# for now, the modules of plan/ outside the plan format (PLAN_FORMAT), until they get a package.
ALLOWED: dict[str, set[str]] = {
    "face": {"techniques", "frontend", "analysis", "plan", "runtime", "export", "ops", "graph", "base"},
    "techniques": {"analysis", "plan", "ops", "graph", "base"},
    "runtime": {"analysis", "plan", "ops", "graph", "base"},
    "export": {"plan", "ops", "graph", "base"},
    "analysis": {"plan", "ops", "graph", "base"},
    "plan": {"ops", "graph", "base"},
    "frontend": {"ops", "graph", "base"},
    "ops": {"graph", "base"},
    "graph": {"base"},
    "base": set(),
}
PLAN_FORMAT = {"schema", "check", "lifetimes", "offsets", "overlay", "place"}
FACE = {"tightfit", "tightfit.api", "tightfit.cli", "tightfit.report", "tightfit.fit", "tightfit.verify",
        "tightfit.vbs_calibration", "tightfit._child"}
BASE = {"tightfit.errors", "tightfit.units", "tightfit.cache", "tightfit.tolerance", "tightfit.atomic", "tightfit.children"}


def module_files(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package by its __init__)."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its source: `from a import b` names
    module a.b if that is a module, else a; a name not a module resolves to its nearest known
    parent (a package's __init__)."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if is_package else name.split(".")[:-1]

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            if t == PACKAGE or t.startswith(PACKAGE + "."):
                m = resolve(t)
                if m is not None and m != name:
                    out.add(m)
    return out


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    files = module_files(src)
    return {name: imported_modules(name, path, set(files)) for name, path in files.items()}


def layer_of(module: str) -> str | None:
    if module in FACE:
        return "face"
    if module in BASE:
        return "base"
    parts = module.split(".")  # a subpackage's name; a top-level module not in FACE or BASE has none
    if parts[1:2] == ["plan"] and len(parts) > 2 and parts[2] not in PLAN_FORMAT:
        return "techniques"
    return parts[1] if parts[1] in ALLOWED and parts[1] not in ("face", "base") else None


def unit_of(module: str) -> str:
    """The node of the package graph: a layer, but each face or base module by itself."""
    layer = layer_of(module)
    return module if layer in ("face", "base", None) else layer


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(unit_of(m), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(m))
    return out


def against_direction(graph: dict[str, set[str]]) -> list[str]:
    return [f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)})" for m, targets in sorted(graph.items())
            for t in sorted(targets) if layer_of(t) != layer_of(m) and layer_of(t) not in ALLOWED.get(layer_of(m), set())]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_has_a_layer(graph):
    assert [m for m in graph if layer_of(m) is None] == []


def test_no_cycle_between_modules(graph):
    assert cycles(graph) == []


def test_no_cycle_between_packages(graph):
    assert cycles(package_graph(graph)) == []


def test_no_edge_against_the_direction(graph):
    assert against_direction(graph) == []


def test_design_doc_shows_the_rule_table():
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"<!-- import-rules -->\n(.*?)<!-- /import-rules -->", text, re.S)
    assert block, "docs/design.md's Layout section lost its import-rules block"
    rows = [line.split() for line in block.group(1).splitlines()[1:] if line.strip()]
    assert {row[0]: set(row[1:]) - {"-"} for row in rows} == ALLOWED
    listed = re.search(r"<!-- plan-format -->(.*?)<!-- /plan-format -->", text, re.S)
    assert listed and set(re.findall(r"plan/(\w+)\.py", listed.group(1))) == PLAN_FORMAT


def write_package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_walk_finds_imports_in_functions_relative_and_submodules(tmp_path):
    src = write_package(tmp_path, {
        "__init__.py": "",
        "graph/__init__.py": "",
        "graph/ir.py": "def f():\n    from ..ops import conv\n",
        "ops/__init__.py": "from . import conv\n",
        "ops/conv.py": "import tightfit.graph.ir as ir\nfrom tightfit.ops import Region\n",
        "plan/__init__.py": "",
        "plan/check.py": "def g():\n    from tightfit.plan.overlay import x\n",
        "plan/overlay.py": "from .check import g\n",
        "plan/order.py": "",
        "runtime/__init__.py": "",
        "runtime/executor.py": "from tightfit.plan.schema import Plan\nfrom tightfit.plan import order\n",
    })
    g = import_graph(src)
    assert g["tightfit.graph.ir"] == {"tightfit.ops.conv"}
    assert g["tightfit.ops"] == {"tightfit.ops.conv"}
    assert g["tightfit.ops.conv"] == {"tightfit.graph.ir", "tightfit.ops"}
    assert cycles(g) == [["tightfit.graph.ir", "tightfit.ops", "tightfit.ops.conv"],
                         ["tightfit.plan.check", "tightfit.plan.overlay"]]
    assert cycles(package_graph(g)) == [["graph", "ops"]]
    assert against_direction(g) == ["tightfit.graph.ir (graph) imports tightfit.ops.conv (ops)",
                                    "tightfit.runtime.executor (runtime) imports tightfit.plan.order (techniques)"]
