"""The README is a front door: short, the two commands first, every link into docs/ resolving; and
the benches write their figures into docs/benchmarks.md through one helper (bench/benchlib.py)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import benchlib  # noqa: E402

README = (ROOT / "README.md").read_text()


def test_readme_is_at_most_150_lines():
    assert len(README.splitlines()) <= 150


def test_the_two_commands_are_in_the_first_25_lines_and_ci_runs_the_test_one():
    first = README.splitlines()[:25]
    commands = [line.strip() for line in first if line.startswith("    python3.11 -m venv")]
    assert len(commands) == 2 and commands[0].endswith("--out fit-minakova5")
    assert commands[1] in (ROOT / ".ci" / "run").read_text()


def test_every_relative_link_in_readme_and_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = [f"{page.name}: {target}" for page in pages
              for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())
              if not (page.parent / target).exists()]
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README))
    assert linked == {p.name for p in (ROOT / "docs").glob("*.md")}


def test_a_section_is_replaced_and_the_rest_kept():
    text = "intro\n<!-- bench:a -->\nold\n<!-- /bench:a -->\nafter\n"
    assert benchlib.replace_section(text, "a", "new\n") == "intro\n<!-- bench:a -->\nnew\n<!-- /bench:a -->\nafter\n"


def test_a_section_not_there_yet_is_added_at_the_end():
    out = benchlib.replace_section("intro\n", "b", "figures")
    assert out == "intro\n\n<!-- bench:b -->\nfigures\n<!-- /bench:b -->\n"
    assert benchlib.replace_section(out, "b", "again").count("<!-- bench:b -->") == 1


@pytest.mark.parametrize("text", [
    "<!-- bench:a -->\nx\n<!-- /bench:a -->\n<!-- bench:a -->\ny\n<!-- /bench:a -->\n",  # marked twice
    "<!-- /bench:a -->\nx\n<!-- bench:a -->\n",  # end before start
    "<!-- bench:a -->\nno end\n",
])
def test_a_badly_marked_section_is_refused(text):
    with pytest.raises(ValueError, match="bench:a"):
        benchlib.replace_section(text, "a", "new")


def test_docs_section_writes_what_was_printed_only_when_the_run_ends_well(tmp_path, monkeypatch, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n<!-- bench:x -->\nold\n<!-- /bench:x -->\n")
    monkeypatch.setattr(benchlib, "DOCS", doc)
    with pytest.raises(RuntimeError):
        with benchlib.docs_section("x", True, "python bench/x.py"):
            print("half a table")
            raise RuntimeError("the bench failed")
    assert "old" in doc.read_text()
    with benchlib.docs_section("x", True, "python bench/x.py --fast"):
        print("median 1.5%")
    text = doc.read_text()
    assert "median 1.5%" in text and "`python bench/x.py --fast`" in text and "old" not in text
    assert "median 1.5%" in capsys.readouterr().out  # still printed as usual
    assert [p.name for p in tmp_path.iterdir()] == ["benchmarks.md"]  # no temporary left


def test_the_benchmarks_doc_marks_each_generated_section_once():
    text = benchlib.DOCS.read_text()
    names = re.findall(r"<!-- bench:(\w+) -->", text)
    assert names and sorted(names) == sorted(set(names)) == sorted(re.findall(r"<!-- /bench:(\w+) -->", text))
