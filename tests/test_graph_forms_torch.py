"""Graph forms of real ONNX files as torch.onnx exports them (issue 22): several outputs (also
through the PyTorch path), opsets 7 to 21, a chain of reshapes to a rank-5 output; each checked
through the CLI and against onnxruntime and the module."""
from __future__ import annotations

import shutil

import onnx
import pytest

torch = pytest.importorskip("torch", reason="torch.onnx exports need PyTorch (pip install 'tightfit[torch]')")

import torch.nn as nn  # noqa: E402

from tightfit import api  # noqa: E402
from tightfit.cli import main  # noqa: E402
from tightfit.frontend.onnx_import import import_model, load_onnx  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402
from tightfit.runtime.reference import random_input  # noqa: E402
from tightfit.verify import compare, model_input, onnxruntime_outputs  # noqa: E402
from test_graph_forms import _plan_and_verify, _run_json  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _ThreeHeads(nn.Module):
    """A detector's shape: a trunk, an upsampled branch and three heads at three scales."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2, self.c3 = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 8, 3, 2, 1), nn.Conv2d(8, 8, 3, 2, 1)
        self.heads = nn.ModuleList(nn.Conv2d(c, 7, 1) for c in (16, 8, 8))

    def forward(self, x):
        a = torch.relu(self.c1(x))
        b = torch.relu(self.c2(a))
        c = torch.relu(self.c3(b))
        up = torch.cat((a, nn.functional.interpolate(b, scale_factor=2.0)), 1)
        return self.heads[0](up), self.heads[1](b), self.heads[2](c)


def test_several_outputs(tmp_path, capsys):
    torch.manual_seed(0)
    module = _ThreeHeads().eval()
    path = tmp_path / "heads.onnx"
    torch.onnx.export(module, (torch.zeros(1, 3, 32, 32),), str(path), dynamo=False, opset_version=17,
                      input_names=["images"], output_names=["p3", "p4", "p5"])
    g = load_onnx(path)
    assert g.outputs == ("p3", "p4", "p5")
    report = _run_json(["run", path, "--verify"], capsys)
    assert report["verify"]["ok"] and list(report["outputs"]) == ["p3", "p4", "p5"], report
    with torch.no_grad():
        want = module(torch.from_numpy(random_input(g)))
    got = run_reference(g, random_input(g))
    for name, w in zip(g.outputs, want):
        assert compare(got[name], w).ok
    from tightfit.frontend.torch_import import from_module

    through_torch = from_module(module, (1, 3, 32, 32))  # the PyTorch path names them in the module's order
    assert through_torch.outputs == ("output", "output1", "output2")
    got = run_reference(through_torch, random_input(through_torch))
    assert all(compare(got[t], w).ok for t, w in zip(through_torch.outputs, want))
    for i, method in enumerate((["--method", "reuse"], ["--method", "parts", "--rows", "1"],
                                ["--method", "tiling", "--tiling", "0-0:2x2"])):
        plan = tmp_path / f"plan{i}.json"
        assert main(["plan", str(path), *method, "--out", str(plan)]) == 0, capsys.readouterr()
        capsys.readouterr()
        report = _run_json(["run", plan, "--verify"], capsys)
        assert report["verify"]["ok"] and len(report["outputs"]) == 3, report
    if shutil.which("cc") is not None:  # the C export writes every head, in the model's order
        from tightfit.export import export

        plan_, graphs = api.load_plan(tmp_path / "plan2.json")
        sources = export(plan_, graphs, tmp_path / "c", weights="c")
        assert api.check_export(plan_, graphs, sources, tmp_path / "c", cflags=["-std=c99", "-O2"]).ok


class _Small(nn.Module):
    """Opset 7's Upsample cannot be exported by torch; later opsets get it."""

    def __init__(self, upsample: bool) -> None:
        super().__init__()
        up = [nn.Upsample(scale_factor=2.0, mode="nearest")] if upsample else []
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Conv2d(8, 8, 3, 1, 1, groups=8), nn.ReLU6(), nn.Conv2d(8, 16, 1),
                                  *up, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("opset", [7, 9, 11, 13, 17, 21])
def test_old_and_new_opsets(opset, tmp_path):
    """Exported at opsets 7-20 by torch (21 through onnx's version converter), imported and
    matched against onnxruntime."""
    torch.manual_seed(1)
    module = _Small(opset >= 9).eval()
    with torch.no_grad():
        module.body[1].running_mean.uniform_(-0.1, 0.1)
        module.body[1].running_var.uniform_(0.5, 1.5)
    path = tmp_path / "small.onnx"
    torch.onnx.export(module, (torch.zeros(1, 3, 16, 16),), str(path), dynamo=False, opset_version=min(opset, 20))
    model = onnx.load(str(path))
    if opset > 20:
        model = onnx.version_converter.convert_version(model, opset)
    assert model.opset_import[0].version == opset
    g = import_model(model, None, f"small{opset}")
    x = random_input(g)
    got = run_reference(g, x)[g.outputs[0]]
    want = onnxruntime_outputs(model.SerializeToString(), model_input(g, x))
    assert compare(got, want[g.outputs[0]]).ok


class _Rank5Head(nn.Module):
    """YOLOv5's export without its decoder: each head reshaped to (N, anchors, H, W, 5 + classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.c, self.d = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 3 * 7, 1)

    def forward(self, x):
        y = self.d(torch.relu(self.c(x)))
        n, _, h, w = y.shape
        return y.view(n, 3, 7, h, w).permute(0, 1, 3, 4, 2).contiguous()


def test_a_chain_of_reshapes_at_the_output(tmp_path, capsys):
    torch.manual_seed(2)
    path = tmp_path / "head.onnx"
    torch.onnx.export(_Rank5Head().eval(), (torch.zeros(1, 3, 32, 32),), str(path), dynamo=False, opset_version=17,
                      input_names=["images"], output_names=["out"])
    g = load_onnx(path)
    assert g.outputs == ("out",) and g.shape("out") == (1, 3, 16, 16, 7)
    report = _run_json(["run", path, "--verify"], capsys)
    assert report["verify"]["ok"] and list(report["outputs"]) == ["out"], report
    _plan_and_verify(str(path), tmp_path, capsys)
