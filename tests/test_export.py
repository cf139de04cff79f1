"""C export (export/): plans compiled to C99 programs that compute the reference executor's outputs.

Each plan is exported, built with the system's cc (warnings are errors), run on the same seeded
input as the reference executor (its input streamed by rows, as the steps ask), compared, and its
whole process measured. Portable kernels (plain -O2) and the AVX-512 ones (-march=native, where
the machine has them) both run. The library itself allocates nothing, keeps no mutable global
state and calls nothing but <string.h> and <math.h>."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tightfit
from tightfit.cli import main
from tightfit.api import check_export as check
from tightfit.export import PROCESS_SLACK, export, generate
from tightfit.export.build import build, run
from tightfit.plan import schema

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")

PORTABLE = ["-std=c99", "-O2"]  # issue 21's flags (with -Wall -Wextra -Werror -pedantic, always added)


def exported(tmp_path: Path, model: str, cflags=None, weights: str = "auto", sanitize: bool = False, runs: int = 2, **kw):
    plan, graphs = tightfit.api.plan(model, **kw)
    sources = export(plan, graphs, tmp_path / "out", weights=weights)
    return plan, graphs, sources, check(plan, graphs, sources, tmp_path / "out", cflags=cflags, runs=runs, sanitize=sanitize)


def assert_fits(c) -> None:
    assert c.ok, f"outputs differ: {c.max_abs_diff} > {c.tolerance}"
    assert c.peak_rss <= c.weight_bytes + c.arena_bytes + PROCESS_SLACK, c.lines()


@pytest.mark.parametrize("kw", [{"method": "reuse"}, {"method": "parts", "rows": 1}, {"method": "tiling", "tiling": "0-1:2x2:reuse"}],
                         ids=["reuse", "parts", "tiling"])
def test_minakova5_plans_build_portable_and_match(tmp_path, kw):
    *_, c = exported(tmp_path, "minakova5", cflags=PORTABLE, **kw)
    assert_fits(c)


def test_minakova5_under_address_and_undefined_sanitizers(tmp_path):
    *_, c = exported(tmp_path, "minakova5", cflags=PORTABLE, sanitize=True, method="tiling", tiling="0-1:2x2:reuse", runs=1)
    assert c.ok


@pytest.mark.parametrize("kw", [{"method": "reuse"}, {"method": "parts", "rows": 2},
                                {"method": "tiling", "tiling": "0-11:4x4,12-22:2x2:reuse"}], ids=["reuse", "parts", "tiling"])
def test_mobilenet_v2_plans_match(tmp_path, kw):
    """The default flags (-march=native: AVX-512 kernels where the machine has them), weights
    from a file (C initializers of 3.5 M weights take a minute to compile)."""
    *_, c = exported(tmp_path, "mobilenet_v2", weights="file", **kw)
    assert_fits(c)


def test_mobilenet_v2_tiled_portable_kernels_match(tmp_path):
    *_, c = exported(tmp_path, "mobilenet_v2", cflags=PORTABLE, weights="file", runs=1, method="tiling",
                     tiling="0-11:4x4,12-22:2x2:reuse")
    assert c.ok


def _app(tmp_path: Path, text: str) -> str:
    path = tmp_path / "app.yaml"
    path.write_text(text)
    return str(path)


def test_two_cnn_application_one_arena(tmp_path):
    app = _app(tmp_path, "cnns:\n  - {name: a, model: minakova5}\n  - {name: b, model: mobilenet_v1_025}\n")
    plan, graphs, sources, c = exported(tmp_path, app, cflags=PORTABLE)
    assert len(graphs) == 2 and c.ok
    header = (tmp_path / "out" / f"{sources.name}.h").read_text()
    assert f"{sources.name.upper()}_CNNS 2" in header


def test_pipelined_partitions_alternate_their_fifo_copies(tmp_path):
    """Two partitions of one CNN in a pipeline: the tensor between them has two copies; frame f
    uses copy f % 2 (runs 0 and 1 take both step tables), and the outputs match each time."""
    app = _app(tmp_path, "cnns:\n  - {name: m, model: mobilenet_v1_025}\npartitions:\n  - {cnn: m, layers: 0-9}\n"
                         "  - {cnn: m, layers: 10-28}\npipelines: [[0, 1]]\n")
    plan, graphs, sources, c = exported(tmp_path, app, cflags=PORTABLE, runs=3)
    assert max(b.copies for b in plan.buffers) == 2
    assert c.ok
    assert "_f1[]" in (tmp_path / "out" / f"{sources.name}.c").read_text()


def test_batch_of_samples(tmp_path):
    *_, c = exported(tmp_path, "minakova5", cflags=PORTABLE, batch=3)
    assert c.ok


def test_same_plan_same_bytes():
    plan, graphs = tightfit.api.plan("minakova5", method="parts", rows=2)
    assert generate(plan, graphs, "m").files == generate(plan, graphs, "m").files


def test_library_allocates_nothing_and_keeps_no_state(tmp_path):
    """The model and kernel objects: no writable data (no .data or .bss; the step tables' pointers
    sit in .data.rel.ro in a position-independent build, read-only once relocated) and no calls but
    string.h and math.h functions (no malloc, no stdio); built with threads (the default where
    pthreads are), the pthread calls that make, join and synchronize them, and nothing else."""
    plan, graphs = tightfit.api.plan("mobilenet_v1_025", method="tiling", tiling="0-5:3x3:reuse")
    sources = export(plan, graphs, tmp_path / "out", name="m")
    allowed = {"memcpy", "memmove", "memset", "expf", "tanhf", "powf", "erff", "logf", "log1pf", "expm1f", "sqrtf", "sqrt",
               "fabsf", "nearbyintf", "tf_run", "tf_read", "tf_read_int8", "tf_tensor_rows", "roundf",
               "_GLOBAL_OFFSET_TABLE_"}  # the linker's table, where the model takes tf_tensor_rows' address
    threads = {"pthread_create", "pthread_join", "pthread_mutex_init", "pthread_mutex_destroy", "pthread_mutex_lock",
               "pthread_mutex_unlock", "pthread_cond_init", "pthread_cond_destroy", "pthread_cond_wait",
               "pthread_cond_broadcast"}
    for src, flags, may in (("m.c", [], allowed), ("tf_kernels.c", ["-DTF_THREADS=0"], allowed),
                            ("tf_kernels.c", [], allowed | threads)):
        obj = tmp_path / (src + ".o")
        subprocess.run(["cc", "-std=c99", "-O2", "-fno-common", *flags, "-c", str(tmp_path / "out" / src), "-o", str(obj)],
                       check=True)
        sections = subprocess.run(["size", "-A", str(obj)], capture_output=True, text=True, check=True).stdout.splitlines()
        writable = [l for l in sections if l.split()[:1] in ([".data"], [".bss"]) and int(l.split()[1]) > 0]
        assert not writable, f"{src} has writable data: {writable}"
        undefined = set(subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout.split()) - {"U"}
        assert undefined <= may, f"{src} {flags} calls {undefined - may}"


DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "m.h"
static float a1[M_ARENA_BYTES / 4 + 1], a2[M_ARENA_BYTES / 4 + 1];
int main(int argc, char **argv) {
    float *x = malloc(2 * M_INPUT_ELEMS * sizeof(float)), *y = malloc(2 * M_OUTPUT_ELEMS * sizeof(float));
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(x, sizeof(float), 2 * M_INPUT_ELEMS, f) != 2 * M_INPUT_ELEMS) return 2;
    /* interleaved: each arena's run must be untouched by the other's */
    if (m_run(a1, x) || m_run(a2, x + M_INPUT_ELEMS)) return 3;
    m_read_output(a1, y);
    m_read_output(a2, y + M_OUTPUT_ELEMS);
    f = fopen(argv[2], "wb");
    fwrite(y, sizeof(float), 2 * M_OUTPUT_ELEMS, f);
    return fclose(f) != 0;
}
"""


def test_two_arenas_run_independently(tmp_path):
    from tightfit.reference import run_reference
    from tightfit.runtime.reference import random_input

    plan, graphs = tightfit.api.plan("minakova5", method="parts", rows=2)
    export(plan, graphs, tmp_path / "out", name="m")
    (tmp_path / "out" / "driver.c").write_text(DRIVER)
    binary = tmp_path / "driver"
    subprocess.run(["cc", "-std=c99", "-O2", "-o", str(binary), "driver.c", "m.c", "tf_kernels.c", "-lm"], cwd=tmp_path / "out", check=True)
    g = graphs[0]
    xs = [random_input(g, 1, seed) for seed in (1, 2)]
    (tmp_path / "in.bin").write_bytes(b"".join(np.asarray(x).astype("<f4").tobytes() for x in xs))
    subprocess.run([str(binary), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], check=True)
    got = np.fromfile(tmp_path / "out.bin", dtype="<f4").reshape(2, -1)
    for x, y in zip(xs, got):
        ref = np.asarray(run_reference(g, x)[g.outputs[0]]).reshape(-1)
        assert np.allclose(y, ref, atol=1e-4 * np.abs(ref).max())


# --- the command line ------------------------------------------------------------------------

def _plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    assert main(["plan", "minakova5", "--method", "tiling", "--tiling", "0-1:2x2:reuse", "--out", str(path)]) == 0
    return path


def test_cli_export_check(tmp_path, capsys):
    plan = _plan_file(tmp_path)
    capsys.readouterr()
    assert main(["export", str(plan), "--out", str(tmp_path / "c"), "--check", "--runs", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["ok"] and report["check"]["peak_rss"] <= report["check"]["budget_bytes"]
    assert (tmp_path / "c" / "Makefile").exists()
    assert subprocess.run(["make", "-s", "-C", str(tmp_path / "c")], capture_output=True).returncode == 0


@pytest.mark.parametrize("args, message", [
    (["--cc", "no-such-compiler-xyz", "--check"], "no C compiler"),
    (["--cflags", "-std=c99 -fno-such-flag-xyz", "--check"], "the C build failed"),
    (["--target", "cortex-m7"], "needs --ram and --flash"),
    (["--ram", "1MiB"], "go with a cortex-m target"),
])
def test_cli_export_errors_are_one_line(tmp_path, capsys, args, message):
    plan = _plan_file(tmp_path)
    capsys.readouterr()
    assert main(["export", str(plan), "--out", str(tmp_path / "c"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err


def test_cli_export_bad_plan_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "tightfit-plan", "version": 1, "models": []')
    assert main(["export", str(bad), "--out", str(tmp_path / "c")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "c").exists() and not list(tmp_path.glob(".c.*"))


def test_export_replaces_a_folder_whole_only_with_force(tmp_path):
    from tightfit.atomic import OutputError

    plan, graphs = tightfit.api.plan("minakova5")
    out = tmp_path / "c"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(OutputError, match="not empty: give --force"):
        export(plan, graphs, out, name="m")
    assert [p.name for p in out.iterdir()] == ["stale.txt"]
    export(plan, graphs, out, name="m", force=True)
    assert not (out / "stale.txt").exists() and (out / "m.c").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["c"]


def test_plan_file_round_trip_exports_the_same_code(tmp_path):
    plan, graphs = tightfit.api.plan("minakova5", method="parts", rows=2)
    again = schema.loads(schema.dumps(plan))
    assert generate(plan, graphs, "m").files == generate(again, graphs, "m").files


def test_parts_overlay_plan(tmp_path):
    """A whole tensor written over the dead rows of one still read (plan/overlay.py): the C steps
    run in the plan's order, so the overlay holds as in the executor."""
    from onnx_chains import chain_graph
    from test_overlay import PHASES, STAGE
    from tightfit.techniques.parts.planner import plan_parts
    from tightfit.techniques.interface import PlannedModel

    g = chain_graph(STAGE, (1, 1, 16, 16), "stage")
    plan = plan_parts(PlannedModel(g, "stage"), PHASES)
    assert any(b.overlay is not None for b in plan.buffers)
    sources = export(plan, [g], tmp_path / "out", name="stage")
    assert check(plan, [g], sources, tmp_path / "out", cflags=PORTABLE).ok


@pytest.mark.parametrize("counts", [(2**31, 0, 0), (0, 2**31, 0), (0, 0, 2**31)])
def test_step_tables_refuse_what_32_bit_offsets_cannot_reach(counts):
    from tightfit.export.codegen import INDEX_LIMIT, _check_index_range
    from tightfit.export.errors import ExportError

    _check_index_range(INDEX_LIMIT - 1, INDEX_LIMIT - 1, INDEX_LIMIT - 1)
    with pytest.raises(ExportError, match="32 bits"):
        _check_index_range(*counts)


def test_program_leaves_out_the_kernels_its_plan_does_not_run(tmp_path):
    """The build passes the plan's step kinds (TF_KINDS, also in the Makefile): the kernels of the
    other kinds are left out of the program's code, and its outputs are the same."""
    plan, graphs = tightfit.api.plan("minakova5", method="parts", rows=2)
    sources = export(plan, graphs, tmp_path / "out")
    (kinds,) = sources.defines
    mask = int(kinds.removeprefix("-DTF_KINDS=").removesuffix("ULL"), 16)
    from tightfit.ops.abi import STEP

    kinds_run = {k for k, v in STEP.items() if mask >> v & 1}
    assert {"conv", "input"} <= kinds_run and not kinds_run & {"gemm", "softmax", "qconv", "matmul", "deconv"}, kinds_run
    assert kinds in (tmp_path / "out" / "Makefile").read_text()
    c = check(plan, graphs, sources, tmp_path / "out", cflags=PORTABLE)
    assert c.ok
    every = build(tmp_path / "out", sources.name, cflags=PORTABLE)  # no TF_KINDS: every kernel
    assert c.built.text < every.text - 20_000, (c.built.text, every.text)  # -O2 portable: 38 KB less
