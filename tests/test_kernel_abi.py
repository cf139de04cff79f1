"""The kernel library's interface has one source: ops/abi.py's table. The header's generated part
is what the table gives (run `python -m tightfit.ops.abi` after editing the table), and the codes
the C export writes are the table's."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tightfit.kernels.step_args import BINDERS, Code
from tightfit.ops import abi, op_names

HEADER = Path(abi.__file__).parents[1] / "kernels" / "tf_kernels.h"


def test_header_declarations_are_the_tables():
    text = HEADER.read_text()
    assert abi.header_with_declarations(text) == text, "tf_kernels.h is stale: run python -m tightfit.ops.abi"


def test_codes_follow_the_table():
    assert abi.ACTS["relu"] == 1 and len(abi.ACTS) == len(abi.ACT_NAMES)  # 0 ends a chain
    assert Code("STEP", "conv").c_name == "TF_STEP_CONV" and Code("STEP", "conv").value == abi.STEP["conv"]
    assert set(abi.ELT_FNS.values()) == set(range(len(abi.ELT_NAMES)))


def test_every_registered_op_has_a_binder():
    assert sorted(set(op_names()) - set(BINDERS)) == []


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("flags", [["-DTF_SIMD=0"], ["-march=native"]])
def test_library_builds_strict_c99(tmp_path, flags):
    """The portable and vector paths build as C99 with every warning an error."""
    src = HEADER.with_name("tf_kernels.c")
    done = subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-pedantic", "-Werror", "-Wno-psabi", *flags,
                           "-c", str(src), "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
