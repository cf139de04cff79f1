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


@pytest.fixture
def kernel_runs(monkeypatch):
    """`record(graph)` makes every op of the graph log (layer id, samples) each time the executor
    runs one of its steps, into the list it returns (patched where the executor binds kernels)."""
    from tightfit.ops import get_op

    def record(graph) -> list[tuple[int, int]]:
        ran: list[tuple[int, int]] = []
        for op_name in {l.op for l in graph.layers}:
            op = type(get_op(op_name))

            def counting_bind(self, layer, inputs, windows, out, out_region, params, _bind=op.bind):
                kernel = _bind(self, layer, inputs, windows, out, out_region, params)

                def run() -> None:
                    ran.append((layer.id, out.shape[0]))
                    kernel()

                return run

            monkeypatch.setattr(op, "bind", counting_bind)
        return ran

    return record
