"""The PyTorch frontend: nn.Module -> Graph through ONNX (so that there is one importer), the
torchvision models of the zoo, and their seeded random weights.

The only module of tightfit that imports torch. torch is an optional extra
(`pip install 'tightfit[torch]'`): ONNX models and the zoo's table models need none of it, so
every function here imports it on first use, through `require_torch`, and an install without it
gets one line naming the extra (TorchMissingError), not an ImportError's traceback."""
from __future__ import annotations

import io
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from tightfit.errors import InputShapeError, TorchMissingError
from tightfit.graph.ir import Graph

if TYPE_CHECKING:
    import torch

OPSET = 17
EXTRA = "pip install 'tightfit[torch]'"


def require_torch(what: str, torchvision: bool = False) -> ModuleType:
    """The torch module (torchvision imported too with `torchvision`), or TorchMissingError
    saying that `what` needs the torch extra."""
    try:
        import torch

        if torchvision:
            import torchvision as _  # noqa: F401
    except ImportError as e:
        raise TorchMissingError(f"{what} needs PyTorch ({e.name or 'torch'} is not installed): {EXTRA}") from None
    return torch


def is_module(obj: object) -> bool:
    """Whether `obj` is an nn.Module. Answered without importing torch: an object can only be
    a module if something already imported torch to make it."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def export_onnx(module: "torch.nn.Module", input_shape: "Sequence[int] | Mapping[str, Sequence[int]]") -> onnx.ModelProto:
    """Export in eval mode, batch norms kept as nodes (the importer fuses them itself, and the
    model's own tensors stay visible for naive accounting). A module of several inputs takes
    {input name: shape}, in its forward's order."""
    torch = require_torch("importing a PyTorch module")
    from tightfit.frontend.validate import check_layer_shape

    shapes = dict(input_shape) if isinstance(input_shape, Mapping) else {"input": input_shape}
    for name, shape in shapes.items():
        if len(shape) != 4 or any(int(d) <= 0 for d in shape):
            raise InputShapeError(f"input shape {tuple(shape)} is not a positive NCHW shape")
        check_layer_shape(name, tuple(int(d) for d in shape))  # refused before the export allocates it
    module = module.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(module, tuple(torch.zeros(*s) for s in shapes.values()), buf, dynamo=False, opset_version=OPSET,
                              do_constant_folding=False, input_names=list(shapes), output_names=["output"])
        except (RuntimeError, ValueError, IndexError) as e:  # the module's forward rejects the shape
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            shown = ", ".join("x".join(map(str, s)) for s in shapes.values())
            raise InputShapeError(f"the model does not run on input shape {shown}: {reason}") from None
    return _name_outputs(onnx.load_from_string(buf.getvalue()))


def _name_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A module with several outputs (a detector's heads): "output", "output1", "output2", ...
    in the module's order, rather than the exporter's numbers for all but the first."""
    renames = {o.name: f"output{i}" for i, o in enumerate(model.graph.output) if i}
    for o in model.graph.output:
        o.name = renames.get(o.name, o.name)
    for node in model.graph.node:
        for i, t in enumerate(node.output):
            node.output[i] = renames.get(t, t)
        for i, t in enumerate(node.input):
            node.input[i] = renames.get(t, t)
    return model


def from_module(module: "torch.nn.Module", input_shape: "Sequence[int] | Mapping[str, Sequence[int]]",
                name: str = "module") -> Graph:
    from tightfit.frontend.onnx_import import import_model

    return import_model(export_onnx(module, input_shape), input_shape, name)


def load_factory(spec: str) -> "torch.nn.Module":
    """The nn.Module that 'package.module:factory' returns (ModelLoadError when the import, the
    factory or its result fails: the user's code, not ours)."""
    import importlib

    from tightfit.errors import ModelLoadError

    torch = require_torch(f"{spec!r} (a PyTorch module:factory)")
    mod_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise ModelLoadError(f"cannot import {spec!r}: {e}") from None
    except Exception as e:  # the module's own code failed as it was imported: the user's code, not ours
        raise ModelLoadError(f"importing {mod_name!r} for {spec!r} raised {_first_line(e)}") from None
    try:
        module = factory()
    except Exception as e:  # the user's factory failed
        raise ModelLoadError(f"factory {spec!r} raised {_first_line(e)}") from None
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"{spec!r} returned {type(module).__name__}, not a torch.nn.Module")
    return module


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


# --- the zoo's torchvision models ---------------------------------------------------------------

def torchvision_factory(name: str, family: str = "", **kw: Any) -> Callable[[], "torch.nn.Module"]:
    """A maker of torchvision's `name` (of torchvision.models, or its submodule `family`:
    "segmentation") without weights (no downloads: the machine has no internet)."""
    def make() -> "torch.nn.Module":
        require_torch(f"torchvision model {name!r}", torchvision=True)
        import importlib

        models = importlib.import_module(f"torchvision.models{'.' + family if family else ''}")
        return getattr(models, name)(weights=None, **kw)

    return make


def versions() -> tuple[str, str]:
    """(torch, torchvision) versions: what a cached export depends on besides our code."""
    torch = require_torch("a torchvision model", torchvision=True)
    import torchvision

    return torch.__version__, torchvision.__version__


def randomize_module(module: "torch.nn.Module", seed: int,
                     calibrate_shape: Sequence[int] | None = None) -> "torch.nn.Module":
    """He-scaled conv and dense weights, non-trivial batch-norm statistics, small biases.

    With `calibrate_shape`, each batch norm's running statistics are then scaled to its input
    on a seeded random batch of that shape (see `weights.bn_scale`), so that values keep their scale
    however deep the network is: without it, residual networks grow by orders of magnitude
    (ResNet-50's logits reached ~4e3, ShuffleNet's ~1e5, past what fp16 holds)."""
    torch = require_torch("a PyTorch module's random weights")
    nn = torch.nn
    g = torch.Generator().manual_seed(seed)
    bns = []
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                gain = 1.0 if isinstance(m, nn.Linear) else 2.0
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (gain / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.05)
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.weight.copy_(0.8 + 0.4 * torch.rand(c, generator=g))
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(0.5 + torch.rand(c, generator=g))
                bns.append(m)
        module.eval()
        if calibrate_shape is not None and bns:
            # a module of several inputs (its `input_names`) gets a batch of its own for each
            count = len(getattr(module, "input_names", ("input",)))
            _calibrate(module, bns, tuple(torch.randn(tuple(calibrate_shape), generator=g) for _ in range(count)))
    return module


def _calibrate(module: "torch.nn.Module", bns: list, xs: "tuple[torch.Tensor, ...]") -> None:
    """One forward pass on the inputs `xs`, each batch norm's statistics scaled to its input just before it runs."""
    from tightfit.frontend.weights import bn_scale

    torch = require_torch("a PyTorch module's random weights")

    def calibrate(bn: "torch.nn.Module", args: tuple) -> None:
        # Runs before the batch norm itself, so each one sees calibrated inputs.
        mean, var = bn_scale(args[0].double().numpy(), bn.running_mean.double().numpy(), bn.running_var.double().numpy())
        bn.running_mean.copy_(torch.from_numpy(mean))
        bn.running_var.copy_(torch.from_numpy(var))

    hooks = [m.register_forward_pre_hook(calibrate) for m in bns]
    try:
        module(*xs)
    finally:
        for h in hooks:
            h.remove()


def run_module(module: "torch.nn.Module", x: np.ndarray) -> np.ndarray:
    """The module's output on `x` (float32 NCHW), for tests that compare it with an import."""
    torch = require_torch("running a PyTorch module")
    with torch.no_grad():
        return module(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()
