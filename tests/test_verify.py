"""--verify's second opinion: where onnxruntime and tightfit differ, onnx's reference evaluator in
float64 decides (onnxruntime's float32 sums drift over millions of values: fuzz seed 102946, a
GlobalAveragePool over 21 M values, read 1% off)."""
from __future__ import annotations

import numpy as np


import tightfit
from tightfit import verify
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input


SPEC, SHAPE = "mobilenet_v1_025", (1, 3, 32, 32)  # one the evaluator runs (minakova5's negative pads it cannot)


def _case():
    g = tightfit.api.load_ref(SPEC, SHAPE)
    x = random_input(g)
    return g, x, run_reference(g, x)


def test_onnxruntime_off_and_float64_agreeing_with_us_is_ok_against_float64(monkeypatch):
    g, x, ours = _case()
    real = verify.onnxruntime_outputs
    monkeypatch.setattr(verify, "onnxruntime_outputs", lambda *a: {k: v * 1.01 for k, v in real(*a).items()})
    c = verify.verify_with_onnxruntime(SPEC, SHAPE, g, x, ours)
    assert c.ok and c.against.startswith("float64") and c.max_abs_diff < 1e-5, c


def test_our_error_is_caught_by_float64_too(monkeypatch):
    g, x, ours = _case()
    wrong = {k: v * 1.01 for k, v in ours.items()}
    c = verify.verify_with_onnxruntime(SPEC, SHAPE, g, x, wrong)
    assert not c.ok and c.against == "", c


def test_float64_outputs_match_ours_on_a_zoo_model():
    g, x, ours = _case()
    exact = verify.float64_outputs(verify.onnx_bytes_for(SPEC, SHAPE), verify.model_input(g, x))
    assert exact is not None
    for name in g.outputs:
        assert np.allclose(exact[name].astype(np.float32), ours[name], rtol=1e-4, atol=1e-5)
