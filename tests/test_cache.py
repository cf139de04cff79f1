"""Caches (issue 23 point 6, issue 20 acceptance 6): damaged or wrongly shaped cost profiles and
zoo files are rebuilt, an unwritable cache works in memory with one warning line, processes
sharing a profile lose none of each other's timings, and a killed process keeps every timing it
measured."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import onnx
import pytest

from tightfit import cache
from tightfit.frontend import zoo
from tightfit.runtime.cost import CostModel

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _python(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("damage", [b"{not json", b"", b"[]", b'{"seconds": {}, "hot": {}, "native": []}',
                                    b'{"k": {"s": "fast"}}', b'{"k": {"s": -1.0}}', b'{"k": {"s": 1e999}}',
                                    b'{"k": {"q": 1.0}}', b"\xff\xfe", b"[" * 100000])
def test_a_damaged_or_wrongly_shaped_profile_is_rebuilt(tmp_path, damage):
    path = tmp_path / "profile.json"
    path.write_bytes(damage)
    model = CostModel(path)
    assert model.seconds == {} and model.hot_seconds == {}
    model.record("loop", 2e-7)
    model.save()
    assert json.loads(path.read_text()) == {"loop": {"s": 2e-7}}
    assert CostModel(path).seconds == {"loop": 2e-7}


def test_damaged_journal_lines_are_skipped(tmp_path):
    path = tmp_path / "profile.json"
    CostModel(path).record("a", 1.0)
    with open(str(path) + ".journal", "ab") as f:  # a kill mid-line, and lines of the wrong shape
        f.write(b'["b", {"s": "x"}]\n[1, 2]\n{"c": 3}\n["d", {"s": 4.0, "h": 3.0, "n": true}]\n["e", {"s": 1')
    model = CostModel(path)
    assert model.seconds == {"a": 1.0, "d": 4.0} and model.hot_seconds == {"d": 3.0} and model.native == {"d"}


def test_an_unwritable_cache_works_in_memory_with_one_warning(tmp_path, capsys):
    # A directory that cannot be made (below /proc, even for root)
    model = CostModel(Path("/proc/tightfit-no-such-dir/cost/p.json"))
    for i in range(5):
        model.record(f"k{i}", float(i))
    model.save()
    assert model.seconds["k4"] == 4.0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "not writable" in lines[0] and "in memory" in lines[0]


def test_a_read_only_cache_directory_keeps_what_it_holds(tmp_path, capsys, monkeypatch):
    path = tmp_path / "cost" / "p.json"
    first = CostModel(path)
    first.record("old", 1.0)
    first.save()
    capsys.readouterr()
    read_only = os.geteuid() != 0
    if read_only:
        for f in (tmp_path / "cost").iterdir():
            f.chmod(0o444)
        (tmp_path / "cost").chmod(0o555)
    else:  # root writes anyway: refuse writes as a read-only mount does
        real_open = os.open

        def refuse(file, flags, *args, **kwargs):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
                raise OSError(errno.EROFS, "Read-only file system", file)
            return real_open(file, flags, *args, **kwargs)

        monkeypatch.setattr(cache.os, "open", refuse)
        monkeypatch.setattr(cache.tempfile, "mkstemp", lambda *a, **k: refuse("tmp", os.O_CREAT))
    try:
        model = CostModel(path)
        assert model.seconds == {"old": 1.0}
        model.record("new", 2.0)
        model.record("newer", 3.0)
        model.save()
        assert model.seconds == {"old": 1.0, "new": 2.0, "newer": 3.0}
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and "not writable" in lines[0]
    finally:
        (tmp_path / "cost").chmod(0o755)
    monkeypatch.undo()
    assert CostModel(path).seconds == {"old": 1.0}


WRITER = """
    import sys
    from pathlib import Path
    from tightfit.runtime.cost import CostModel
    model = CostModel(Path(sys.argv[1]) if len(sys.argv) > 1 else Path({path!r}))
    for i in range(200):
        model.record("{tag}%d" % i, float(i))
        if i % 7 == 0:
            model.save()  # folds the journal into the file while the other process appends
    model.save()
    print("done")
"""


def test_two_processes_sharing_a_profile_end_with_the_union(tmp_path):
    path = tmp_path / "cost" / "p.json"
    procs = [_python(WRITER.format(path=str(path), tag=tag)) for tag in "ab"]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    expected = {f"{tag}{i}": float(i) for tag in "ab" for i in range(200)}
    assert CostModel(path).seconds == expected
    assert {k: e["s"] for k, e in json.loads(path.read_text()).items()} == expected  # folded, journal empty
    assert Path(str(path) + ".journal").read_bytes() == b""


MEASURER = """
    import time
    from pathlib import Path
    import tightfit
    from tightfit.techniques.interface import PlannedModel
    from tightfit.techniques.reuse.planner import plan_reuse
    from tightfit.runtime.cost import CostModel, step_key
    g = tightfit.load("minakova5")
    plan = plan_reuse(PlannedModel(g, "minakova5"))
    model = CostModel(Path({path!r}))
    for step in plan.steps():
        model.step_seconds(plan, [g], step)
        print(step_key(plan, [g], step), flush=True)
    time.sleep(600)  # killed here, never saved
"""


def test_a_killed_measuring_process_keeps_every_timing_it_measured(tmp_path):
    path = tmp_path / "p.json"
    proc = _python(MEASURER.format(path=str(path)))
    measured = [proc.stdout.readline().strip() for _ in range(3)]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert all(measured), proc.stderr
    kept = CostModel(path)
    for key in measured:
        assert key in kept.seconds and key in kept.hot_seconds


@pytest.fixture
def zoo_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TIGHTFIT_CACHE", str(tmp_path))
    zoo.clear_cache()
    yield tmp_path
    zoo.clear_cache()


@pytest.mark.parametrize("damage", [b"garbage\xff", b"", b'{"valid": "json"}', "truncated"])
def test_a_damaged_zoo_file_is_made_again(zoo_cache, damage):
    good = zoo.onnx_model("minakova5")
    (path,) = (zoo_cache / "zoo").glob("minakova5-*.onnx")
    path.write_bytes(good[: len(good) // 2] if damage == "truncated" else damage)
    zoo.clear_cache()
    assert zoo.onnx_model("minakova5") == good
    assert path.read_bytes() == good
    onnx.checker.check_model(onnx.load_from_string(path.read_bytes()))


def test_an_unwritable_zoo_cache_loads_with_one_warning(monkeypatch, capsys):
    monkeypatch.setenv("TIGHTFIT_CACHE", "/proc/tightfit-no-such-dir")
    zoo.clear_cache()
    try:
        assert zoo.load("minakova5").layers
        zoo.clear_cache()
        assert zoo.load("minakova5").layers
    finally:
        zoo.clear_cache()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "not writable" in lines[0]
