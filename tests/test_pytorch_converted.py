"""onnx's own backend test cases converted from PyTorch modules (onnx/backend/test/data/
pytorch-converted): each folder holds model.onnx and test_data_set_0/{input_0,output_0}.pb.

Every case is either imported, run with the reference executor and matched to the stored output
(max abs diff <= 1e-4 x max abs value), or rejected at import with a clear TightfitError
(1-D / 3-D ops, inputs of rank other than 4, op types tightfit does not have). EXPECTED_TO_RUN
lists the cases that must run, so a regression that starts rejecting one fails.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tightfit.errors import InputShapeError, ModelLoadError, TightfitError, UnsupportedOpsError
from tightfit.frontend.onnx_import import load_onnx
from tightfit.reference import run_reference

DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "pytorch-converted"
CASES = sorted(p.name for p in DATA.iterdir() if (p / "model.onnx").is_file()) if DATA.is_dir() else []

# 2-D image ops on rank-4 inputs that tightfit supports.
EXPECTED_TO_RUN = frozenset({
    "test_AvgPool2d", "test_AvgPool2d_stride",
    "test_BatchNorm2d_eval", "test_BatchNorm2d_momentum_eval",
    "test_Conv2d", "test_Conv2d_depthwise", "test_Conv2d_depthwise_padded", "test_Conv2d_depthwise_strided",
    "test_Conv2d_depthwise_with_multiplier", "test_Conv2d_dilated", "test_Conv2d_groups",
    "test_Conv2d_groups_thnn", "test_Conv2d_no_bias", "test_Conv2d_padding", "test_Conv2d_strided",
    "test_MaxPool2d", "test_MaxPool2d_stride_padding_dilation",
    "test_ConstantPad2d", "test_ZeroPad2d", "test_ReflectionPad2d", "test_ReplicationPad2d",
    "test_ReLU", "test_Sigmoid", "test_Tanh",
    # Reshape (1, 1, 3, 3, 4, 4) -> Transpose -> Reshape: layout ops on whole samples.
    "test_PixelShuffle",
})

# Cases rejected because an op type is missing; the rest are rejected for their input rank.
EXPECTED_UNSUPPORTED_OP = {
    "test_ConvTranspose2d": "ConvTranspose",
    "test_ConvTranspose2d_no_bias": "ConvTranspose",
    "test_PReLU_2d": "PRelu",
    "test_PReLU_2d_multiparam": "PRelu",
    "test_log_softmax_dim3": "LogSoftmax",
    # Softmax over W of (2, 3, 4, 5): only softmax over the class axis is supported.
    "test_softmax_functional_dim3": "Softmax",
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _load(case: str, name: str) -> np.ndarray:
    return numpy_helper.to_array(onnx.load_tensor(str(DATA / case / "test_data_set_0" / name)))


def test_cases_found():
    assert len(CASES) > 50, f"pytorch-converted cases not found under {DATA}"
    assert EXPECTED_TO_RUN <= set(CASES), sorted(EXPECTED_TO_RUN - set(CASES))
    assert set(EXPECTED_UNSUPPORTED_OP) <= set(CASES)


@pytest.mark.parametrize("case", CASES)
def test_pytorch_converted(case):
    model = DATA / case / "model.onnx"
    x = _load(case, "input_0.pb")
    expected = _load(case, "output_0.pb")
    try:
        graph = load_onnx(model, input_shape=x.shape)
    except TightfitError as e:
        assert case not in EXPECTED_TO_RUN, f"{case} should run but import rejected it: {e}"
        message = str(e)
        assert message and "\n" not in message
        if x.dtype != np.float32:  # an Embedding's indices: refused as data of another type
            assert isinstance(e, ModelLoadError) and "float32" in message, message
            return
        assert isinstance(e, (InputShapeError, UnsupportedOpsError)), f"{case}: unexpected {type(e).__name__}: {e}"
        if case in EXPECTED_UNSUPPORTED_OP:
            assert isinstance(e, UnsupportedOpsError) and EXPECTED_UNSUPPORTED_OP[case] in e.unsupported, message
        elif x.ndim != 4:
            assert isinstance(e, InputShapeError) and "rank" in message, message
        return
    # Imported: it must run and match, whether or not it is listed as expected to run.
    # A rank-3 input reaches NCHW through the file's own reshapes (absorbed at import): the
    # graph's input is their end.
    x4 = np.array(x, copy=True).reshape(graph.shape(graph.inputs[0]))
    out = np.asarray(run_reference(graph, x4)[graph.outputs[0]])
    assert out.shape == expected.shape, f"{case}: output shape {out.shape}, expected {expected.shape}"
    scale = float(np.abs(expected).max())
    err = float(np.abs(out.astype(np.float64) - expected).max())
    assert err <= 1e-4 * scale, f"{case}: max abs diff {err:.3g} > 1e-4 x {scale:.3g}"
