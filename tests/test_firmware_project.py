"""Issue 37, point 3: `export --target cortex-m*` writes a firmware project (library, startup code,
linker script, test main, semihosting shim, a Makefile with `run-qemu`) that rebuilds in a clean
copy with its own Makefile and runs under qemu with the reference's outputs; the flash and RAM
are the user's numbers; a failure leaves nothing."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tightfit.cli import main
from tightfit.export import mcu

_MISSING = mcu.toolchain_available()
needs_toolchain = pytest.mark.skipif(_MISSING is not None or shutil.which("make") is None,
                                     reason=f"microcontroller toolchain: {_MISSING}")
SRC = Path(__file__).resolve().parents[1] / "src"
KIB = 1024


@pytest.fixture(scope="module")
def m5(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fw") / "p.json"
    assert main(["plan", "minakova5", "--out", str(path)]) == 0
    return path


@needs_toolchain
@pytest.mark.parametrize("target", ["cortex-m7", "cortex-m4"])
def test_the_project_rebuilds_in_a_clean_copy_and_runs_under_qemu(m5, tmp_path, capsys, target):
    out = tmp_path / "fw"
    assert main(["export", str(m5), "--out", str(out), "--target", target, "--ram", "64KiB", "--flash", "256KiB",
                 "--check", "--keep-io"]) == 0
    said = capsys.readouterr().out
    assert f"make -C {out} run-qemu" in said and "under qemu: outputs match" in said
    assert int(re.search(r"([\d,]+) instructions per inference", said).group(1).replace(",", "")) > 0
    files = {p.name for p in out.iterdir()}
    assert {"minakova5.c", "minakova5.h", "tf_kernels.c", "tf_kernels.h", "startup_cortex_m.S", "tf_semihost.c",
            "tf_semihost.h", "mcu_main.c", f"minakova5_{target}.ld", "Makefile", "input.bin", "reference.bin"} <= files
    assert "main.c" not in files  # the host test program is not part of a firmware project
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    subprocess.run(["make", "-s", "clean"], cwd=copy, check=True, capture_output=True)
    assert not (copy / f"minakova5_{target}.elf").exists()
    subprocess.run(["make", "-s"], cwd=copy, check=True, capture_output=True, timeout=300)
    assert (copy / f"minakova5_{target}.elf").read_bytes() == (out / f"minakova5_{target}.elf").read_bytes()
    ran = subprocess.run(["make", "-s", "run-qemu"], cwd=copy, check=True, capture_output=True, text=True, timeout=120)
    assert re.search(r"tightfit-mcu: inference took [1-9]\d* core clock cycles", ran.stdout + ran.stderr)
    got, ref = np.fromfile(copy / "output.bin", "<f4"), np.fromfile(copy / "reference.bin", "<f4")
    assert got.shape == ref.shape and np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


@needs_toolchain
def test_sizes_no_board_holds_build_and_the_check_says_why(m5, tmp_path, capsys):
    out = tmp_path / "fw"
    assert main(["export", str(m5), "--out", str(out), "--target", "cortex-m7", "--ram", "8MiB", "--flash", "8MiB", "--check"]) == 0
    said = capsys.readouterr().out
    assert "--check not run: qemu's mps2-an500 has 4 MiB" in said
    assert (out / "minakova5_cortex-m7.elf").is_file()
    run = subprocess.run(["make", "-s", "run-qemu"], cwd=out, capture_output=True, text=True)
    assert run.returncode != 0 and "cannot run under qemu" in run.stdout


@needs_toolchain
@pytest.mark.parametrize("ram, flash, said", [
    ("12KiB", "256KiB", "cortex-m7: RAM overflowed by"),
    ("64KiB", "8KiB", "cortex-m7: FLASH overflowed by"),
])
def test_an_overflow_leaves_nothing(m5, tmp_path, capsys, ram, flash, said):
    out = tmp_path / "fw"
    capsys.readouterr()
    assert main(["export", str(m5), "--out", str(out), "--target", "cortex-m7", "--ram", ram, "--flash", flash]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_missing_cross_compiler_leaves_nothing(m5, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    env = dict(os.environ, PATH=str(bare), PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "fw"
    done = subprocess.run([sys.executable, "-m", "tightfit.cli", "export", str(m5), "--out", str(out), "--target", "cortex-m7",
                           "--ram", "64KiB", "--flash", "256KiB"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "arm-none-eabi-gcc" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


@pytest.mark.slow
@needs_toolchain
def test_mobilenet_v2_for_a_cortex_m7_with_16_mib_of_flash_builds(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "mobilenet_v2", "--out", str(plan)]) == 0
    out = tmp_path / "fw"
    assert main(["export", str(plan), "--out", str(out), "--target", "cortex-m7", "--ram", "8MiB", "--flash", "16MiB"]) == 0
    said = capsys.readouterr().out
    assert (out / "mobilenet_v2_cortex-m7.elf").is_file() and "FLASH" in said


@needs_toolchain
def test_fit_for_a_cortex_m7_fits_the_arena_to_what_the_ram_leaves(tmp_path, capsys):
    out = tmp_path / "fw"
    assert main(["fit", "minakova5", "--target", "cortex-m7", "--ram", "20KiB", "--flash", "256KiB", "--export", str(out),
                 "--time-limit", "5"]) == 0
    said = capsys.readouterr().out
    assert "budget: what --ram 20KiB leaves after the 8192 B stack" in said and "firmware project" in said
    built = mcu.build_project(out, mcu.Project("minakova5", "cortex-m7", 20 * KIB, 256 * KIB, 8192, 0, ()))
    assert built.ram_used <= 20 * KIB and built.arena <= 20 * KIB - 8192
    assert (out / "Makefile").is_file() and (out / "startup_cortex_m.S").is_file()


@needs_toolchain
def test_fit_fits_again_when_the_programs_data_overflows_the_ram(tmp_path, capsys, monkeypatch):
    """The first guess of the program's own RAM is made too small on purpose: the link overflows,
    and fit chooses a plan smaller by as much."""
    import tightfit.pipeline as pipeline

    monkeypatch.setattr(pipeline, "RAM_RESERVE", -2048)
    ram = 8192 + 8192 + 64  # the stack, minakova5's layer-by-layer arena (8 KiB): no room for the program's data
    assert main(["fit", "minakova5", "--target", "cortex-m7", "--ram", str(ram), "--flash", "256KiB",
                 "--export", str(tmp_path / "fw"), "--time-limit", "5", "--progress"]) == 0
    captured = capsys.readouterr()
    again = re.search(r"the program's own data took (\d+) B more RAM; fitting again to (\d+) B", captured.err)
    assert again and 0 < int(again.group(1)) <= 256 and int(again.group(2)) < 8192, captured.err
    used = int(re.search(r"RAM (\d+) B of (\d+) B \(arena (\d+) B", captured.out).group(1))
    assert used <= ram


@pytest.mark.parametrize("argv, said", [
    (["--ram", "20KiB", "--flash", "256KiB"], "needs --ram, --flash and --export"),
    (["--ram", "8KiB", "--flash", "256KiB", "--export", "x"], "leaves nothing for the arena"),
    (["--ram", "20KiB", "--flash", "4KiB", "--export", "x"], "the weights alone"),
    (["--ram", "20KiB", "--flash", "256KiB", "--export", "x", "--budget", "4kB"], "leave out --budget"),
])
def test_fit_target_mistakes_are_one_line(tmp_path, capsys, monkeypatch, argv, said):
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["fit", "minakova5", "--target", "cortex-m7", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert list(tmp_path.iterdir()) == []
