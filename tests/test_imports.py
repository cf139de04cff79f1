"""The layering: imports in src/tightfit point one way and form no cycle (docs/design.md, Layout).

Every import is read from the source with `ast` (module level and inside functions, `import x`,
`from x import y`, relative imports), so an import hidden in a function to dodge a cycle counts.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "tightfit"

# The one rule table: folder -> the other folders its modules may import (a folder's modules may
# import each other). A subpackage of tightfit is its folder; the modules directly in tightfit/
# are the face (cli, api, report, ...; the package's own __init__ is the face's door), except the
# base: the top-level modules that import only each other (errors, units, ...), which any folder
# may import. No file is named here: a module's folder, or for a top-level module what it
# imports, says where it stands. docs/design.md shows the same table (checked below).
ALLOWED: dict[str, set[str]] = {
    "face": {"techniques", "frontend", "analysis", "plan", "runtime", "export", "kernels", "ops", "graph", "base"},
    "techniques": {"analysis", "plan", "ops", "graph", "base"},
    "runtime": {"analysis", "plan", "kernels", "ops", "graph", "base"},
    "export": {"plan", "kernels", "ops", "graph", "base"},
    "kernels": {"plan", "ops", "graph", "base"},
    "analysis": {"plan", "ops", "graph", "base"},
    "plan": {"ops", "graph", "base"},
    "frontend": {"ops", "graph", "base"},
    "ops": {"graph", "base"},
    "graph": {"base"},
    "base": set(),
}


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


def base_modules(graph: dict[str, set[str]]) -> set[str]:
    """The largest set of top-level modules (not the package's __init__) that import only each
    other: the base, which every folder may use because it reaches back into none."""
    base = _top_level(graph)
    while True:
        leaving = {m for m in base if not graph[m] <= base}
        if not leaving:
            return base
        base -= leaving


def _top_level(graph: dict[str, set[str]]) -> set[str]:
    """Modules that are files directly in tightfit/ (a subpackage's __init__ is its folder's)."""
    packages = {m.split(".")[1] for m in graph if m.count(".") >= 2}
    return {m for m in graph if m.count(".") == 1 and m.split(".")[1] not in packages}


def layering(graph: dict[str, set[str]]) -> Callable[[str], str | None]:
    """module -> its layer: its folder, or for a top-level module the face or the base."""
    base, top = base_modules(graph), _top_level(graph)

    def layer_of(module: str) -> str | None:
        if module in base:
            return "base"
        if module == PACKAGE or module in top:
            return "face"
        folder = module.split(".")[1]
        return folder if folder in ALLOWED else None

    return layer_of


def unit_of(module: str, layer_of: Callable[[str], str | None]) -> str:
    """The node of the folder graph: a folder, but each face or base module by itself."""
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
    layer_of = layering(graph)
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        unit = unit_of(m, layer_of)
        out.setdefault(unit, set()).update(unit_of(t, layer_of) for t in targets if unit_of(t, layer_of) != unit)
    return out


def against_direction(graph: dict[str, set[str]]) -> list[str]:
    layer_of = layering(graph)
    return [f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)})" for m, targets in sorted(graph.items())
            for t in sorted(targets) if layer_of(t) != layer_of(m) and layer_of(t) not in ALLOWED.get(layer_of(m), set())]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_has_a_layer(graph):
    layer_of = layering(graph)
    assert [m for m in graph if layer_of(m) is None] == []


def test_the_base_is_what_the_layers_below_use(graph):
    """The base found by the rule holds the modules every layer needs (errors at least), and no
    module of a folder is in it."""
    base = base_modules(graph)
    assert f"{PACKAGE}.errors" in base and all(m.count(".") == 1 for m in base)


def test_no_cycle_between_modules(graph):
    assert cycles(graph) == []


def test_no_cycle_between_folders(graph):
    assert cycles(package_graph(graph)) == []


def test_no_edge_against_the_direction(graph):
    assert against_direction(graph) == []


def test_the_table_itself_has_no_cycle():
    assert cycles({k: set(v) for k, v in ALLOWED.items()}) == []


def test_design_doc_shows_the_rule_table():
    text = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"<!-- import-rules -->\n(.*?)<!-- /import-rules -->", text, re.S)
    assert block, "docs/design.md's Layout section lost its import-rules block"
    rows = [line.split() for line in block.group(1).splitlines()[1:] if line.strip()]
    assert {row[0]: set(row[1:]) - {"-"} for row in rows} == ALLOWED


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
        "errors.py": "",
        "atomic.py": "from tightfit.errors import E\n",
        "cli.py": "from tightfit.atomic import x\nfrom tightfit.techniques import order\n",
        "techniques/__init__.py": "",
        "techniques/order.py": "from tightfit.plan.check import g\n",
        "runtime/__init__.py": "",
        "runtime/executor.py": "from tightfit.plan.schema import Plan\nfrom tightfit.techniques import order\n",
    })
    g = import_graph(src)
    assert g["tightfit.graph.ir"] == {"tightfit.ops.conv"}
    assert g["tightfit.ops"] == {"tightfit.ops.conv"}
    assert g["tightfit.ops.conv"] == {"tightfit.graph.ir", "tightfit.ops"}
    assert sorted(cycles(g)) == [["tightfit.graph.ir", "tightfit.ops", "tightfit.ops.conv"],
                                 ["tightfit.plan.check", "tightfit.plan.overlay"]]
    assert cycles(package_graph(g)) == [["graph", "ops"]]
    assert against_direction(g) == ["tightfit.graph.ir (graph) imports tightfit.ops.conv (ops)",
                                    "tightfit.runtime.executor (runtime) imports tightfit.techniques.order (techniques)"]
