"""The exported test program (c/main.c) under the sanitizers, with its weights read from a file
and its input read whole (-p): the buffers it allocates for them are freed (LeakSanitizer)."""
from __future__ import annotations

import numpy as np

import tightfit
from tightfit.export import export
from tightfit.export.build import build, run
from tightfit.runtime.reference import run_reference


def test_weights_file_program_is_clean_under_the_sanitizers(tmp_path):
    plan, graphs = tightfit.api.plan("minakova5")
    sources = export(plan, graphs, tmp_path / "c", weights="file")
    assert sources.weights_in_file
    built = build(tmp_path / "c", sources.name, cflags=["-std=c99", "-O2"], sanitize=True)
    x = tightfit.api.plan_inputs(graphs, plan)[0]
    ref = np.asarray(run_reference(graphs[0], x)[graphs[0].outputs[0]])
    for preload in (False, True):
        ran = run(built.binary, [np.asarray(x)], [ref.size], 2, tmp_path / "c" / "weights.bin", preload=preload)
        assert abs(ran.outputs[0] - ref.ravel()).max() < 1e-4
