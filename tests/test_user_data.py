"""Issue 37, point 4: `tightfit run MODEL|PLAN --input FILE --output FILE` on the user's own data
(.npy, raw float32 or int8 in; .npy, .npz or raw float32 out), and `export --check --keep-io`
leaving the checked input and the reference output beside the program, in the same raw format."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tightfit
from tightfit.cli import main
from tightfit.reference import run_reference


@pytest.fixture(scope="module")
def m5(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("data")
    assert main(["plan", "minakova5", "--out", str(base / "p.json")]) == 0
    return base


def _reference(x: np.ndarray) -> np.ndarray:
    g = tightfit.load("minakova5")
    return run_reference(g, x)[g.outputs[0]]


def _one_line(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tightfit: error: ")
    return err[0]


@pytest.mark.parametrize("what", ["minakova5", "p.json"])
def test_run_on_a_users_npy_and_raw_input(m5, tmp_path, what):
    model = what if what == "minakova5" else str(m5 / what)
    x = np.random.default_rng(37).standard_normal((1, 1, 32, 32)).astype(np.float32)
    want = _reference(x)
    np.save(tmp_path / "x.npy", x)
    x.tofile(tmp_path / "x.bin")
    assert main(["run", model, "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]) == 0
    assert main(["run", model, "--input", str(tmp_path / "x.bin"), "--output", str(tmp_path / "y.bin")]) == 0
    assert main(["run", model, "--input", str(tmp_path / "x.bin"), "--output", str(tmp_path / "y.npz")]) == 0
    got_npy, got_raw = np.load(tmp_path / "y.npy"), np.fromfile(tmp_path / "y.bin", "<f4")
    got_npz = next(iter(np.load(tmp_path / "y.npz").values()))
    assert got_npy.shape == want.shape and got_npz.shape == want.shape
    for got in (got_npy.ravel(), got_raw, got_npz.ravel()):
        assert np.abs(got - want.ravel()).max() <= 1e-4 * np.abs(want).max()


def test_a_raw_int8_input_is_read_as_its_values(m5, tmp_path):
    q = np.random.default_rng(1).integers(-128, 128, (1, 1, 32, 32)).astype(np.int8)
    q.tofile(tmp_path / "q.bin")
    assert main(["run", "minakova5", "--input", str(tmp_path / "q.bin"), "--output", str(tmp_path / "y.npy")]) == 0
    want = _reference(q.astype(np.float32))
    assert np.abs(np.load(tmp_path / "y.npy") - want).max() <= 1e-4 * np.abs(want).max()


def test_bad_input_and_output_files_are_one_line(m5, tmp_path, capsys):
    (tmp_path / "short.bin").write_bytes(b"\0" * 100)
    np.save(tmp_path / "wrong.npy", np.zeros((3, 3)))
    (tmp_path / "folder").mkdir()
    plan = str(m5 / "p.json")
    said = {
        ("--input", "short.bin"): "expected 4096 bytes (float32, 1x1x32x32) or 1024 (int8), got 100",
        ("--input", "wrong.npy"): "holds float64 3x3; the model takes 1x1x32x32 numbers",
        ("--input", "missing.bin"): "no such file",
        ("--input", "folder"): "is a folder, not a file",
    }
    for (option, name), message in said.items():
        for model in ("minakova5", plan):
            assert message in _one_line(["run", model, option, str(tmp_path / name)], capsys)
    assert "is a folder" in _one_line(["run", plan, "--output", str(tmp_path / "folder")], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "short.bin", "wrong.npy"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_keep_io_leaves_what_the_program_and_run_reproduce(m5, tmp_path):
    out = tmp_path / "c"
    assert main(["export", str(m5 / "p.json"), "--out", str(out), "--check", "--keep-io", "--runs", "1"]) == 0
    x = np.fromfile(out / "input.bin", "<f4").reshape(1, 1, 32, 32)
    ref = np.fromfile(out / "reference.bin", "<f4")
    assert np.abs(ref - _reference(x).ravel()).max() == 0
    subprocess.run([str(out / "minakova5"), str(out / "input.bin"), str(tmp_path / "c.bin")], check=True, capture_output=True)
    assert main(["run", str(m5 / "p.json"), "--input", str(out / "input.bin"), "--output", str(tmp_path / "py.bin")]) == 0
    for got in (np.fromfile(tmp_path / "c.bin", "<f4"), np.fromfile(tmp_path / "py.bin", "<f4")):
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


def test_keep_io_goes_with_check(m5, tmp_path, capsys):
    assert "--keep-io goes with --check" in _one_line(["export", str(m5 / "p.json"), "--out", str(tmp_path / "c"), "--keep-io"], capsys)
