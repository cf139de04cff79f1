"""The peak-memory measurement (fresh process, malloc env, HWM reset) sees exactly what a run
touches: calibrated against a run that allocates a known number of bytes."""
from __future__ import annotations

import pytest

from tightfit.runtime.measure import measure_subprocess

MiB = 2**20


@pytest.mark.parametrize("size", [8 * MiB, 64 * MiB])
def test_measured_peak_matches_a_known_allocation(size):
    m = measure_subprocess({"kind": "alloc", "bytes": size})
    assert abs(m.run_bytes - size) <= 1 * MiB, (m.run_bytes, size)


def test_reference_run_is_measured_above_baseline():
    import tightfit

    m = measure_subprocess({"kind": "reference", "model": "minakova5"})
    assert m.baseline_bytes > 50 * MiB  # torch is loaded
    assert 0 <= m.run_bytes < 4 * MiB  # a 32x32 CNN
    assert tightfit.inspect(tightfit.load("minakova5")).layer_peak_bytes < 4 * MiB
