"""Issue 23, points 2, 3 and 5: files carry data, not code; every output is written whole or not
at all (an OSError is one line, exit 2); a signal at any moment leaves no child process, no
temporary and no partial output."""
from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proc_tree import marked, new_mark
from test_fit import StepCost
from tightfit import atomic
from tightfit.cli import main
from tightfit.errors import ModelLoadError

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


def _one_line(argv, capsys) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("tightfit: error: "), captured.err
    return lines[0]


@pytest.fixture(scope="module")
def m5_plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "m5.json"
    assert main(["plan", "minakova5", "--out", str(path)]) == 0
    return path


# --- data, not code -----------------------------------------------------------------------------

def _with_spec(plan: Path, spec: str, to: Path) -> Path:
    data = json.loads(plan.read_text())
    data["models"][0]["spec"] = spec
    to.write_text(json.dumps(data))
    return to


def test_a_plan_naming_module_factory_is_refused(m5_plan, tmp_path, capsys):
    bad = _with_spec(m5_plan, "os:abort", tmp_path / "bad.json")
    for argv in (["run", str(bad)], ["run", str(bad), "--measure"], ["export", str(bad), "--out", str(tmp_path / "x")]):
        line = _one_line(argv, capsys)
        assert "module:factory" in line and "--allow-code" in line
    assert not (tmp_path / "x").exists()


def test_an_application_naming_module_factory_is_refused(tmp_path, capsys):
    app = tmp_path / "app.yaml"
    app.write_text("cnns:\n  - {name: a, model: 'os:abort'}\n")
    for argv in (["plan", str(app)], ["fit", str(app), "--budget", "1MB"]):
        assert "module:factory" in _one_line(argv, capsys)


def test_allow_code_lets_a_file_name_a_factory(m5_plan, tmp_path):
    import tightfit

    bad = _with_spec(m5_plan, "tightfit_no_such_module:make", tmp_path / "p.json")
    with pytest.raises(ModelLoadError, match="module:factory"):
        tightfit.api.load_plan(bad)
    with pytest.raises(ModelLoadError, match="cannot import"):  # tried: the refusal is lifted
        tightfit.api.load_plan(bad, allow_code=True)


def test_kernel_library_only_from_a_private_folder(tmp_path):
    from tightfit.kernels.library import UnsafeLibraryError, _check_private

    folder = tmp_path / "native"
    folder.mkdir(mode=0o700)
    _check_private(folder)
    for mode in (0o770, 0o707, 0o777):
        folder.chmod(mode)
        with pytest.raises(UnsafeLibraryError, match="not writable by group or others"):
            _check_private(folder)


# --- outputs whole or not at all -----------------------------------------------------------------

def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(atomic.OutputError, match="No space left on device"):
        atomic.write_text(target, "new" * 1000)
    assert target.read_text() == "old" and _leftovers(tmp_path) == [] and not atomic.LIVE


def test_a_written_file_has_the_umask_mode(tmp_path):
    before = os.umask(0o027)
    try:
        atomic.write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(before)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640


def test_plan_out_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    line = _one_line(["plan", "minakova5", "--out", str(tmp_path / "afile" / "p.json")], capsys)
    assert "afile is a file, not a folder" in line
    assert _leftovers(tmp_path) == []


def test_plan_out_on_a_full_disk(tmp_path, capsys, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    line = _one_line(["plan", "minakova5", "--out", str(tmp_path / "p.json")], capsys)
    assert "No space left on device" in line
    assert list(tmp_path.iterdir()) == []


def test_fit_outputs_on_a_full_disk(tmp_path, monkeypatch):
    from tightfit import api, files
    from tightfit import report as R

    app = api.load_fit_app("minakova5")
    outcome = api.fit(app, 16_000, cost=StepCost(), measure=False, timer=lambda plan, graphs: [1000.0] * len(graphs))

    def full(o):  # the disk fills while the last file is written, the others written already
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "fit_plot", full)
    with pytest.raises(atomic.OutputError, match="No space left on device"):
        files.write_fit_folder(outcome, tmp_path / "out", R.fit_report(outcome))
    assert list(tmp_path.iterdir()) == []


# --- signals --------------------------------------------------------------------------------------

def _env(mark: tuple[str, str], tmp: Path) -> dict[str, str]:
    return dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
                **{mark[0]: mark[1]})


def _gone(mark: tuple[str, str], seconds: float = 10.0) -> list[int]:
    """The processes of the tree still alive after up to `seconds` (the kernel delivers a
    parent-death signal as the parent's exit completes)."""
    end = time.monotonic() + seconds
    while (left := marked(mark)) and time.monotonic() < end:
        time.sleep(0.1)
    return left


def _ours(tmp: Path) -> list[str]:
    """What a run left in its TMPDIR, but torch's own compile cache folder."""
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor"))


def _interrupt(argv: list[str], signum: int, delay: float, tmp_path: Path) -> subprocess.CompletedProcess:
    mark, tmp = new_mark(), tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "tightfit.cli", *argv], env=_env(mark, tmp),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert _gone(mark) == [], f"children left after {signal.Signals(signum).name} at {delay:.1f} s"
    assert _ours(tmp) == [], f"temporaries left after {signal.Signals(signum).name} at {delay:.1f} s"
    assert "Traceback" not in stderr, stderr
    assert proc.returncode in (0, -signum, 128 + signum), (proc.returncode, stderr)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _whole_or_absent(out: Path) -> None:
    if out.is_dir():
        assert _leftovers(out.parent) == []
        for f in out.iterdir():
            if f.suffix == ".json":
                json.loads(f.read_text())
    elif out.exists():  # a file (plan --out) written before the signal came: whole
        assert _leftovers(out.parent) == []
        json.loads(out.read_text())


def test_a_signal_while_measuring_leaves_nothing(m5_plan, tmp_path):
    """`run --measure` at a seeded random moment: its measuring child is gone with it."""
    delay = random.Random(23).uniform(1.0, 6.0)
    _interrupt(["run", str(m5_plan), "--measure"], signal.SIGTERM, delay, tmp_path)


def test_children_die_with_their_parent(tmp_path):
    """Our children (measuring child, timing workers, cc, exported programs: all started by
    children.popen) have a parent-death signal: SIGKILL of the parent (no handler can run)
    still ends them."""
    mark = new_mark()
    script = ("import sys, time\nfrom tightfit import children\n"
              "kids = [children.popen([sys.executable, '-c', 'import time; time.sleep(300)']) for _ in range(2)]\n"
              "print('started', flush=True)\ntime.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], env=_env(mark, tmp_path), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started"
        end = time.monotonic() + 60
        while len(seen := marked(mark)) < 3 and time.monotonic() < end:
            time.sleep(0.1)
        assert len(seen) == 3
    finally:
        proc.kill()
        proc.wait()
    assert _gone(mark) == []


SLOW_COMMANDS = {
    "fit": lambda plan, out: ["fit", "minakova5", "--budget", "10kB", "--out", str(out)],
    "run --measure": lambda plan, out: ["run", str(plan), "--measure"],
    "export --check": lambda plan, out: ["export", str(plan), "--out", str(out), "--check"],
    "plan": lambda plan, out: ["plan", "minakova5", "--method", "parts", "--out", str(out)],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(SLOW_COMMANDS))
def test_signals_at_random_moments(command, m5_plan, tmp_path):
    """Each command, each of SIGINT, SIGTERM and SIGHUP at seeded random moments of its run: no
    child, no temporary, the output whole or absent. The moments spread over the command's time
    as timed here first, after its imports (before the CLI's handler is installed, SIGINT is
    Python's KeyboardInterrupt in the middle of importing torch: nothing to clean up then, but a
    traceback)."""
    out = tmp_path / "out"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import tightfit.cli"], env=_env(new_mark(), tmp_path), check=True, timeout=300)
    imports = time.monotonic() - t0 + 1.0
    t0 = time.monotonic()
    whole = subprocess.run([sys.executable, "-m", "tightfit.cli", *SLOW_COMMANDS[command](m5_plan, out)],
                           env=_env(new_mark(), tmp_path), capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    assert whole.returncode == 0, whole.stderr
    rng = random.Random(f"23 {command}")
    for i, signum in enumerate([signal.SIGINT, signal.SIGTERM, signal.SIGHUP] * 2):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        if out.exists():
            out.unlink()
        case = tmp_path / f"case{i}"
        case.mkdir()
        _interrupt(SLOW_COMMANDS[command](m5_plan, out), signum, rng.uniform(imports, max(imports, took)), case)
        _whole_or_absent(out)


@pytest.mark.requires_torch
def test_sigint_while_torch_loads_is_a_quiet_130(tmp_path):
    """SIGINT as `import torch` runs (its libraries are being mapped, for a user's nn.Module
    factory): the CLI's handler is in place already (`import tightfit.cli` imports no torch), so:
    status 130, no traceback, no output."""
    (tmp_path / "user_net.py").write_text("import torch.nn as nn\n\ndef make():\n    return nn.Sequential(nn.Conv2d(3, 4, 3))\n")
    env = _env(new_mark(), tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    loaded = subprocess.run([sys.executable, "-c", "import sys, tightfit.cli; print('torch' in sys.modules)"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert loaded.stdout.strip() == "False", loaded.stderr
    proc = subprocess.Popen([sys.executable, "-m", "tightfit.cli", "inspect", "user_net:make", "--input-shape", "1x3x8x8"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 60
    while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text() and time.monotonic() < end:
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert "Traceback" not in stderr and stdout == "", (stdout, stderr)
    assert stderr.strip().splitlines() == ["tightfit: interrupted (SIGINT); nothing partial was left"], stderr


@pytest.mark.requires_torch
def test_a_factory_that_raises_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "user_models.py").write_text("def make():\n    raise ValueError('no weights\\nhere')\n"
                                             "def crash_on_import():\n    pass\nraise_later = None\n")
    (tmp_path / "broken_module.py").write_text("raise RuntimeError('import-time failure')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _one_line(["inspect", "user_models:make", "--input-shape", "1x3x8x8"], capsys)
    assert line == "tightfit: error: factory 'user_models:make' raised ValueError: no weights"
    line = _one_line(["inspect", "user_models:raise_later", "--input-shape", "1x3x8x8"], capsys)
    assert "'user_models:raise_later' raised TypeError" in line
    line = _one_line(["inspect", "broken_module:make", "--input-shape", "1x3x8x8"], capsys)
    assert "'broken_module:make'" in line and "RuntimeError: import-time failure" in line
