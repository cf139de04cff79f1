"""Shared fixtures, and the `requires_torch` marker.

PyTorch is an optional extra (`pip install 'tightfit[torch]'`). A test that needs it (an
nn.Module, a torchvision model of the zoo, the corpus) is marked `requires_torch` and skipped
with that reason where torch is not installed. A test that reaches a torchvision model through
some other path (a zoo name in a list) and stops on tightfit's own TorchMissingError is skipped
the same way, with the error's line as the reason, and only where torch is missing: with torch
installed every test runs."""
from __future__ import annotations

import importlib.util

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("torchvision") is not None
TORCH_REASON = "needs PyTorch and torchvision (pip install 'tightfit[torch]')"


def pytest_collection_modifyitems(config, items) -> None:
    if HAS_TORCH:
        return
    skip = pytest.mark.skip(reason=TORCH_REASON)
    for item in items:
        if "requires_torch" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    if HAS_TORCH or outcome.excinfo is None:
        return
    from tightfit.errors import TorchMissingError

    if isinstance(outcome.excinfo[1], TorchMissingError):
        outcome.force_exception(pytest.skip.Exception(f"{TORCH_REASON}: {outcome.excinfo[1]}", _use_item_location=True))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: intra-op threads only add wake-up latency (and contend on a loaded box).
    Nothing to set where the kernels run without torch."""
    if not HAS_TORCH:
        yield
        return
    import torch

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
