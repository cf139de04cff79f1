"""Shared fixtures."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (and contend on a loaded box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
