"""PyTorch is an optional extra (issue 39, point 3): the zoo's table models are ONNX graphs built
without it, and what needs it (an nn.Module, a torchvision model) is one line naming the extra
where it is missing. These tests hide torch from the code under test, so they run (and must
pass) with torch installed or not."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tightfit.cli import main
from tightfit.frontend import zoo
from tightfit.frontend.tables import TABLES

SRC = Path(__file__).resolve().parents[1] / "src"

# Run with torch and torchvision unimportable: each table model's ONNX bytes are built, checked
# and run in onnxruntime; what needs torch must say so.
NO_TORCH_SCRIPT = r"""
import hashlib, json, sys
sys.modules["torch"] = None  # `import torch` raises ImportError from here on
sys.modules["torchvision"] = None
import numpy as np, onnx, onnxruntime as ort
from tightfit.errors import TorchMissingError
from tightfit.frontend import zoo
from tightfit.frontend.load import load
out = {"tables": {}, "errors": {}}
for name in sys.argv[1:]:
    data = zoo.onnx_model(name)
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    shape = zoo._default_shape(name)
    y = sess.run(None, {"input": np.random.default_rng(0).standard_normal(shape, dtype=np.float32)})[0]
    out["tables"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "std": float(y.std()),
                           "finite": bool(np.isfinite(y).all()), "params": sum(int(np.prod(i.dims)) for i in model.graph.initializer
                                                                                 if i.data_type == onnx.TensorProto.FLOAT)}
for spec in ("resnet18", "json:loads"):
    try:
        zoo.onnx_model(spec) if spec in zoo.names() else load(spec, (1, 3, 8, 8))
        out["errors"][spec] = None
    except TorchMissingError as e:
        out["errors"][spec] = str(e)
out["torch_loaded"] = any(m == "torch" or m.startswith("torch.") for m, v in sys.modules.items() if v is not None)
print(json.dumps(out))
"""

# torch's parameter counts of the nn.Modules these models were (weights and batch-norm statistics).
TORCH_PARAMS = {"minakova5": 1561, "mobilenet_v1_025": 475544, "yolov2-16": 3429344, "tiny-yolov2": 15867885,
                "mobilenet_v1": 4253864}


def test_table_models_are_built_without_torch():
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "TIGHTFIT_CACHE": "off"}
    done = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT, *TABLES], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert not out["torch_loaded"]
    for name, row in out["tables"].items():
        assert row["finite"] and row["std"] > 1e-3, (name, row)
        assert row["params"] == TORCH_PARAMS[name], (name, row["params"])
        # The same bytes as the zoo makes here (the seed fixes them; no library draws them).
        assert row["sha256"] == hashlib.sha256(zoo._make(name, zoo._default_shape(name)).SerializeToString()).hexdigest()
    for spec, error in out["errors"].items():
        assert error is not None and "pip install 'tightfit[torch]'" in error, (spec, error)


@pytest.mark.parametrize("argv, named", [
    (["inspect", "resnet18", "--input-shape", "1x3x40x40"], "zoo model 'resnet18' (from torchvision)"),
    (["inspect", "json:loads", "--input-shape", "1x3x8x8"], "'json:loads' (a PyTorch module:factory)"),
])
def test_what_needs_torch_is_one_line_naming_the_extra(argv, named, monkeypatch, capsys):
    # The op registry and the techniques' options load first, as they may still load torch for
    # their kernels: what is tested is the frontend's word for what needs it.
    from tightfit.cli import build_parser

    build_parser()
    # Library versions key the torchvision models' disk cache: none read while torch is hidden.
    zoo._code_version.cache_clear()
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    try:
        assert main(argv) == 2
    finally:
        zoo._code_version.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0] and "needs PyTorch" in err[0] and "pip install 'tightfit[torch]'" in err[0], err
