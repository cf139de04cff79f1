"""Issue 37, point 1: a command that writes a folder writes it beside, then puts it in place in one
step; an existing non-empty folder is replaced only with --force, a file never; every failure
and signal leaves --out as it was (absent, or the user's own folder untouched)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tightfit import atomic
from tightfit.cli import main

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


@pytest.fixture(scope="module")
def m5_plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "m5.json"
    assert main(["plan", "minakova5", "--out", str(path)]) == 0
    return path


def _user_folder(path: Path) -> dict[str, str]:
    """A folder holding a user's work: returns what it holds, to compare with afterwards."""
    (path / "data").mkdir(parents=True)
    (path / "important.c").write_text("int main(void) { return 0; }\n")
    (path / "data" / "x.txt").write_text("keep me")
    return _contents(path)


def _contents(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def _one_line(argv, capsys) -> str:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("tightfit: error: "), (code, err)
    return err[0]


def _no_leftovers(folder: Path) -> None:
    assert [p.name for p in folder.iterdir() if p.name.startswith(".")] == []
    assert not atomic.LIVE


# --- the helper ---------------------------------------------------------------------------------

def test_a_new_folder_appears_whole(tmp_path):
    out = tmp_path / "new"
    with atomic.output_folder(out) as stage:
        (stage / "a.txt").write_text("a")
        assert not out.exists()
    assert _contents(out) == {"a.txt": "a"}
    _no_leftovers(tmp_path)


def test_an_error_in_the_block_leaves_the_old_folder(tmp_path):
    out = tmp_path / "proj"
    before = _user_folder(out)
    with pytest.raises(RuntimeError):
        with atomic.output_folder(out, force=True) as stage:
            (stage / "a.txt").write_text("a")
            raise RuntimeError("the build failed")
    assert _contents(out) == before
    _no_leftovers(tmp_path)


def test_force_swaps_the_folder_whole(tmp_path):
    out = tmp_path / "proj"
    _user_folder(out)
    with atomic.output_folder(out, force=True) as stage:
        (stage / "a.txt").write_text("a")
    assert _contents(out) == {"a.txt": "a"}
    _no_leftovers(tmp_path)


def test_an_empty_folder_is_taken_without_force(tmp_path):
    (tmp_path / "empty").mkdir()
    with atomic.output_folder(tmp_path / "empty") as stage:
        (stage / "a.txt").write_text("a")
    assert _contents(tmp_path / "empty") == {"a.txt": "a"}


def test_a_folder_filled_meanwhile_is_not_replaced(tmp_path):
    out = tmp_path / "proj"
    with pytest.raises(atomic.OutputError, match="not empty"):
        with atomic.output_folder(out) as stage:
            (stage / "a.txt").write_text("a")
            _user_folder(out)  # another program made it while we worked
    assert (out / "important.c").exists()
    _no_leftovers(tmp_path)


# --- export ----------------------------------------------------------------------------------------

def test_export_refuses_a_non_empty_folder_and_keeps_it(m5_plan, tmp_path, capsys):
    out = tmp_path / "proj"
    before = _user_folder(out)
    line = _one_line(["export", str(m5_plan), "--out", str(out)], capsys)
    assert "exists and is not empty" in line and "--force" in line
    assert _contents(out) == before
    _no_leftovers(tmp_path)


def test_export_force_replaces_the_folder_whole(m5_plan, tmp_path, capsys):
    out = tmp_path / "proj"
    _user_folder(out)
    assert main(["export", str(m5_plan), "--out", str(out), "--force"]) == 0
    assert not (out / "important.c").exists() and (out / "main.c").exists() and (out / "Makefile").exists()
    _no_leftovers(tmp_path)


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_file_is_never_replaced_by_a_folder(m5_plan, tmp_path, capsys, force):
    out = tmp_path / "proj"
    out.write_text("my notes")
    line = _one_line(["export", str(m5_plan), "--out", str(out), *force], capsys)
    assert "is a file" in line
    assert out.read_text() == "my notes"
    _no_leftovers(tmp_path)


def test_the_root_and_the_current_folder_are_refused(m5_plan, tmp_path, capsys, monkeypatch):
    (tmp_path / "mine.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    assert "the root folder" in _one_line(["export", str(m5_plan), "--out", "/"], capsys)
    for out in (".", "./", str(tmp_path), ".."):
        line = _one_line(["export", str(m5_plan), "--out", out, "--force"], capsys)
        assert "the current folder or one above it" in line, line
    assert _contents(tmp_path) == {"mine.txt": "mine"}


@pytest.mark.parametrize("args, message", [
    (["--check", "--cc", "no-such-compiler-xyz"], "no C compiler"),
    (["--check", "--cflags", "-std=c99 -fno-such-flag-xyz"], "the C build failed"),
    (["--target", "cortex-m7", "--ram", "512KiB", "--flash", "2MiB", "--weights", "file"], "keeps the weights in flash"),
])
def test_a_failed_export_leaves_the_old_folder_or_none(m5_plan, tmp_path, capsys, args, message):
    new, old = tmp_path / "new", tmp_path / "old"
    assert message in _one_line(["export", str(m5_plan), "--out", str(new), *args], capsys)
    assert not new.exists()
    before = _user_folder(old)
    assert message in _one_line(["export", str(m5_plan), "--out", str(old), "--force", *args], capsys)
    assert _contents(old) == before
    _no_leftovers(tmp_path)


# --- a signal in the middle of `export --check` ------------------------------------------------------

SLOW_CC = """#!/bin/sh
# A compiler that says it started, then takes its time: the moment to interrupt is known.
touch "{mark}"
sleep 30
exec cc "$@"
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_check_leaves_the_old_folder(m5_plan, tmp_path, signum):
    mark, cc = tmp_path / "cc-started", tmp_path / "slow-cc"
    cc.write_text(SLOW_CC.format(mark=mark))
    cc.chmod(0o755)
    out = tmp_path / "work" / "proj"
    before = _user_folder(out)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "tightfit.cli", "export", str(m5_plan), "--out", str(out), "--force",
                             "--check", "--cc", str(cc)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while not mark.exists() and proc.poll() is None and time.monotonic() < end:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate()[1]
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, stderr
    assert "nothing partial was left" in stderr and "Traceback" not in stderr
    assert _contents(out) == before
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["proj"]


# --- fit ---------------------------------------------------------------------------------------------

def test_fit_refuses_a_non_empty_out_before_searching(tmp_path, capsys):
    out = tmp_path / "res"
    before = _user_folder(out)
    t0 = time.monotonic()
    line = _one_line(["fit", "minakova5", "--budget", "10kB", "--out", str(out)], capsys)
    assert "--out" in line and "--force" in line and time.monotonic() - t0 < 30
    assert _contents(out) == before
    line = _one_line(["fit", "minakova5", "--budget", "10kB", "--export", str(tmp_path / "res" / "important.c")], capsys)
    assert "--export" in line and "is a file" in line


def test_fit_force_replaces_out_whole(tmp_path, capsys):
    out = tmp_path / "res"
    _user_folder(out)
    assert main(["fit", "minakova5", "--budget", "10kB", "--out", str(out), "--force", "--time-limit", "5"]) == 0
    assert sorted(_contents_names(out)) == ["memory.png", "plan.json", "report.json", "report.txt"]
    _no_leftovers(tmp_path)


def _contents_names(path: Path) -> list[str]:
    return [p.name for p in path.iterdir()]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_export_check_into_a_new_folder_appears_whole(m5_plan, tmp_path, capsys):
    out = tmp_path / "proj"
    assert main(["export", str(m5_plan), "--out", str(out), "--check", "--runs", "1"]) == 0
    names = set(_contents_names(out))
    assert {"main.c", "Makefile", "tf_kernels.c"} <= names
    _no_leftovers(tmp_path)
