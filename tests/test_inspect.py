"""Memory accounting: MAFAT Table 2.1 reproduced from `inspect yolov2-16 --workspace darknet`."""
from __future__ import annotations

import json

import pytest

import tightfit
from tightfit.cli import main
from tightfit.report import dims
from tightfit.units import mib, round_half_up

# MAFAT (Farley & Gerstlauer) Table 2.1: layer, type, dimensions (input HxWxC), weights (bytes),
# input, output, scratch, total (MiB, two decimals as printed).
TABLE_2_1 = [
    (0, "Conv", "608x608x3", 3456, 4.23, 45.13, 38.07, 87.43),
    (1, "Max", "608x608x32", 0, 45.13, 11.28, 0.00, 56.41),
    (2, "Conv", "304x304x32", 73728, 11.28, 22.56, 101.53, 135.45),
    (3, "Max", "304x304x64", 0, 22.56, 5.64, 0.00, 28.20),
    (4, "Conv", "152x152x64", 294912, 5.64, 11.28, 50.77, 67.97),
    (5, "Conv", "152x152x128", 32768, 11.28, 5.64, 11.28, 28.23),
    (6, "Conv", "152x152x64", 294912, 5.64, 11.28, 50.77, 67.97),
    (7, "Max", "152x152x128", 0, 11.28, 2.82, 0.00, 14.10),
    (8, "Conv", "76x76x128", 1179648, 2.82, 5.64, 25.38, 34.97),
    (9, "Conv", "76x76x256", 131072, 5.64, 2.82, 5.64, 14.23),
    (10, "Conv", "76x76x128", 1179648, 2.82, 5.64, 25.38, 34.97),
    (11, "Max", "76x76x256", 0, 5.64, 1.41, 0.00, 7.05),
    # The paper prints 4717872 bytes for layer 12's weights; 3x3x256x512x4 = 4718592, as its own
    # layer 14 (same shape) shows: the printed figure is a typo.
    (12, "Conv", "38x38x256", 4718592, 1.41, 2.82, 12.69, 21.42),
    (13, "Conv", "38x38x512", 524288, 2.82, 1.41, 2.82, 7.55),
    (14, "Conv", "38x38x256", 4718592, 1.41, 2.82, 12.69, 21.42),
    (15, "Conv", "38x38x512", 524288, 2.82, 1.41, 2.82, 7.55),
]
PAPER_TYPE = {"conv": "Conv", "maxpool": "Max"}


def _mib(n: int) -> float:
    return round_half_up(mib(n), 2)


def test_table_2_1_reproduced_by_cli(capsys):
    assert main(["inspect", "yolov2-16", "--workspace", "darknet", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    layers = report["layers"]
    assert len(layers) == 16
    for (idx, typ, dim, weights, inp, out, scratch, total), row in zip(TABLE_2_1, layers):
        assert row["id"] == idx
        assert PAPER_TYPE[row["op"]] == typ
        assert dims(tuple(row["input_shapes"][0])) == dim
        assert row["kernel_bytes"] == weights
        assert _mib(row["input_bytes"]) == inp
        assert _mib(row["output_bytes"]) == out
        assert _mib(row["workspace_bytes"]) == scratch
        assert _mib(row["kernel_bytes"] + row["input_bytes"] + row["output_bytes"] + row["workspace_bytes"]) == total


def test_table_printed_with_half_up_rounding(capsys):
    assert main(["inspect", "yolov2-16", "--workspace", "darknet"]) == 0
    text = capsys.readouterr().out
    row0 = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    # 608*608*32*4 B = 45.125 MiB exactly: the paper prints 45.13 (half up), not 45.12.
    assert row0.split()[-4:] == ["4.23", "45.13", "38.07", "87.43"]


def test_dtype_scales_every_column():
    g = tightfit.load("minakova5")
    f32, i8 = tightfit.inspect(g, "fp32"), tightfit.inspect(g, "int8")
    for a, b in zip(f32.layers, i8.layers):
        assert a.output_bytes == 4 * b.output_bytes
        assert a.param_bytes == 4 * b.param_bytes
    assert f32.naive_bytes == 4 * i8.naive_bytes


def test_minakova_example_sizes_at_one_byte_per_element():
    """Minakova & Stefanov Table II, Ex1 (1 byte per element): b12 = 1024, b23 = 1024, b34 = 48, b45 = 2."""
    mem = tightfit.inspect(tightfit.load("minakova5"), "int8")
    assert [r.input_bytes for r in mem.layers] == [1024, 1024, 48]
    assert mem.layers[-1].output_bytes == 2


def test_layer_peak_is_live_tensors_plus_scratch():
    g = tightfit.load("minakova5")
    mem = tightfit.inspect(g, "int8", "none")
    # Layer by layer without scratch, the largest step holds input + output of one layer.
    assert mem.layer_peak_bytes == max(r.input_bytes + r.output_bytes for r in mem.layers)


def test_naive_counts_every_original_tensor_and_parameter():
    g = tightfit.load("resnet18")
    mem = tightfit.inspect(g)
    acts = sum(t.nbytes("fp32") for t in g.original_tensors)
    assert mem.naive_bytes == acts + 4 * g.original_param_count
    # resnet18 exported with its batch norms: 11.69 M parameters + BN running statistics.
    assert 11_600_000 < g.original_param_count < 11_800_000
    # conv, BN and ReLU outputs are separate tensors of the imported model, not layers of ours.
    assert len(g.original_tensors) > 2 * len(g.layers)


def test_batch_scales_activations_not_parameters():
    g = tightfit.load("minakova5")
    one, four = tightfit.inspect(g, batch=1), tightfit.inspect(g, batch=4)
    assert four.layers[0].output_bytes == 4 * one.layers[0].output_bytes
    assert four.param_bytes == one.param_bytes
