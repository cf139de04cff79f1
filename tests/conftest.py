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
    """`record(graph)` makes the executor log (layer id, samples) for every compute step of the
    graph each time it runs one: the samples are the output view's N in the step's kernel
    arguments (what the C kernel is told to compute), logged as tf_run runs its partition."""
    from tightfit.runtime import executor

    def record(graph) -> list[tuple[int, int]]:
        ran: list[tuple[int, int]] = []
        bound: dict[int, list[tuple[int, int]]] = {}
        bind, run_partition = executor.ArenaExecutor._bind, executor.ArenaExecutor.run_partition

        def counting_bind(self, p, ctx, *stored):
            part = bind(self, p, ctx, *stored)
            logged = []
            for s in p.steps:
                if s.kind == "compute" and self.graphs[s.model] is graph:
                    args, y = executor.step_args(ctx, s), ctx.view(s.model, s.out)
                    assert y in args.fields, f"step of layer {s.layer}: its output view is not in its arguments"
                    logged.append((s.layer, y.dims[0]))
            bound[id(part)] = logged
            return part

        def counting_run(self, part, x):
            run_partition(self, part, x)
            ran.extend(bound.get(id(part), ()))

        monkeypatch.setattr(executor.ArenaExecutor, "_bind", counting_bind)
        monkeypatch.setattr(executor.ArenaExecutor, "run_partition", counting_run)
        return ran

    return record
