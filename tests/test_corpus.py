"""The corpus of issue 22 (tightfit.frontend.corpus): CNNs people deploy, exported to ONNX as the
TorchScript exporter emits them, through every stage (bench/coverage.py's checks).

Default run: a fast subset (a small classifier at opset 17, the CRNN trunk at opset 11 with its
dynamic batch): import, the reuse plan at the lower bound, the reference executor against
onnxruntime, and one split plan (parts, 4 rows per phase) run by the arena executor against
the reference; the same CNN with its weights in Constant nodes and its output renamed behind
Identity nodes through `inspect` and `run --verify`; one hybrid (MobileViT at half width, 64x64)
at both opsets through import, `inspect`, `run --verify`, a split plan and `export --check`; the
two-input stereo model (issue 38) through import, `run --verify`, reuse, a parts plan and its C
export checked. Slow: the whole corpus at opsets 17 and 11,
with the PyTorch path and the parts and tiling plans the searches pick within half the reuse
arena (the smallest they reach where half is out of reach, said), each case on its own; and
`fit --budget` half the reuse arena, a case of its own per model and export."""
from __future__ import annotations

import contextlib
import io
import shutil
import sys
from pathlib import Path

import pytest

# the corpus is torchvision's models exported by torch: this whole module needs the extra
pytest.importorskip("torch", reason="the corpus needs PyTorch (pip install 'tightfit[torch]')")
pytest.importorskip("torchvision", reason="the corpus needs torchvision (pip install 'tightfit[torch]')")

from tightfit.errors import UnsupportedOpsError  # noqa: E402
from tightfit.frontend import corpus  # noqa: E402
from tightfit.frontend.onnx_import import load_onnx  # noqa: E402
from tightfit.plan.check import check_plan  # noqa: E402
from tightfit.techniques.parts.planner import phases_for_rows, plan_parts  # noqa: E402
from tightfit.techniques.interface import PlannedModel  # noqa: E402
from tightfit.techniques.reuse.planner import plan_reuse  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402
from tightfit.runtime.reference import random_input  # noqa: E402
from tightfit.verify import verify_with_onnxruntime  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import coverage  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Models that stop on an operator not supported yet: each an xfail naming the op (strict, so a
# model that starts importing fails here until its mark is dropped). Empty since the operators
# of issue 22 merged; the slow run has not been redone since.
MISSING_OPS: dict[str, str] = {}


def test_corpus_lists_the_issue_models():
    wanted = {"alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet",
              "inception_v3", "mnasnet1_0", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
              "regnet_x_400mf", "regnet_y_400mf", "resnet18", "resnet50", "resnext50_32x4d", "shufflenet_v2_x1_0",
              "squeezenet1_1", "vgg11_bn", "wide_resnet50_2", "fcn_resnet50", "deeplabv3_mobilenet_v3_large",
              "lraspp_mobilenet_v3_large", "yolov5n", "unet", "dbnet", "crnn",
              "svtr", "mobilevit_xxs", "mobilevit_tiny", "efficientformer_l1"}  # issue 38: hybrids
    assert wanted <= set(corpus.names())
    assert corpus.entry("yolov5n").input_shape == (1, 3, 640, 640)
    assert corpus.entry("crnn").input_shape == (1, 3, 32, 320)


@pytest.mark.parametrize("name,opset", [("squeezenet1_1", 17), ("crnn", 11)])
def test_fast_subset(name, opset):
    path = corpus.onnx_path(name, opset)
    g = load_onnx(path)
    assert g.shape(g.inputs[0]) == corpus.entry(name).input_shape  # opset 11's dynamic batch: 1
    assert g.original_param_count == coverage.file_parameters(path)
    model = PlannedModel(g, str(path))
    report = check_plan(plan_reuse(model, "improve"), [g])
    assert report.arena_bytes == report.lower_bound, report.ratio
    x = random_input(g)
    want = run_reference(g, x)
    assert verify_with_onnxruntime(str(path), None, g, x, want).ok
    phases, source = phases_for_rows(g, 4)
    parts = plan_parts(model, phases, source)
    assert check_plan(parts, [g]).peak_bytes < report.peak_bytes
    assert coverage.matches_reference(parts, g, x, want)


@pytest.mark.parametrize("opset", corpus.OPSETS)
def test_a_hybrid_model_end_to_end(opset, tmp_path, capsys):
    """Issue 38's default-run hybrid: MobileViT-XXS's layer table at half width on 64x64 (MobileNetV2
    blocks, MobileViT blocks that unfold the map into 2x2 patches, run attention over them and
    fold back), exported at opset 17 and at the older opset (LayerNormalization spelled out, a
    dynamic batch). `inspect` counts every weight of the file; `run --verify` matches
    onnxruntime; reuse is at the lower bound; parts at one row per phase splits the
    convolutions, the token rows of the layer norms and Linears and the query rows of the attention
    scores (rank 5, run on rank 4), holds a smaller arena than reuse and matches; `export --check` builds it
    as C and matches."""
    import json

    from tightfit.analysis.csdf import needs_whole_input
    from tightfit.cli import main

    path, g = coverage.load("mobilevit_tiny", opset)
    ops = {l.op for l in g.layers}
    assert {"conv", "matmul", "softmax_axis", "layer_norm", "gemm"} <= ops, ops
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["original_param_bytes"] == 4 * coverage.file_parameters(path)
    assert main(["run", str(path), "--verify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verify"]["ok"]
    model = PlannedModel(g, str(path))
    reuse = check_plan(plan_reuse(model, "improve"), [g])
    assert reuse.arena_bytes == reuse.lower_bound
    phases, source = phases_for_rows(g, 1)
    whole = [l for l in g.layers if needs_whole_input(g, l)]
    # whole steps: taking q, k, v apart, the unfold and fold, and the classifier; the token rows of
    # norms, Linears and adds split, and so do the scores (rank 5, run on rank 4: query-token bands)
    assert {l.op for l in whole} <= {"gather", "reshape", "transpose", "global_pool", "gemm"}
    assert any(g.layers[l].op == "matmul" for l in phases) and any(g.layers[l].op == "softmax_axis" for l in phases)
    assert all(len(g.shape(l.output)) == 2 for l in whole if l.op == "gemm")
    assert any(g.layers[l].op == "layer_norm" for l in phases) and any(g.layers[l].op == "gemm" for l in phases)
    parts = plan_parts(model, phases, source)
    assert check_plan(parts, [g]).arena_bytes < reuse.arena_bytes
    x = random_input(g)
    assert coverage.matches_reference(parts, g, x, run_reference(g, x))
    if shutil.which("cc") is None:
        pytest.skip("no C compiler for export --check")
    plan_file = tmp_path / "plan.json"
    assert main(["plan", str(path), "--method", "parts", "--rows", "1", "--out", str(plan_file)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan_file), "--out", str(tmp_path / "c"), "--check", "--cflags", "-std=c99 -O1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["check"]["ok"]


HYBRIDS = ("svtr", "mobilevit_xxs", "efficientformer_l1")  # issue 38: convolutions with attention blocks


@pytest.mark.slow
@pytest.mark.parametrize("name,opset", [pytest.param(n, o, id=f"{n}-opset{o}") for o in corpus.OPSETS for n in HYBRIDS])
def test_hybrid_export_check(name, opset, tmp_path, capsys):
    """The C export of each hybrid's split plan (parts, two rows per phase: the convolutions
    and the token rows by bands, attention over all tokens whole) builds and matches."""
    import json

    from tightfit.cli import main

    if shutil.which("cc") is None:
        pytest.skip("no C compiler for export --check")
    plan_file = tmp_path / "plan.json"
    assert main(["plan", str(corpus.onnx_path(name, opset)), "--method", "parts", "--rows", "2", "--out", str(plan_file)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan_file), "--out", str(tmp_path / "c"), "--check", "--cflags", "-std=c99 -O1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["check"]["ok"]


def test_the_two_input_model_end_to_end(tmp_path, capsys):
    """Issue 38's two-input corpus model (a stereo pair: shared-weight towers, a cost volume, two
    heads) in the default run: import (every parameter of the file), `run --verify` against
    onnxruntime on both outputs, the reuse plan at the lower bound, a parts plan run by the arena
    executor against the reference, and the C export of that plan built and checked."""
    import json

    from tightfit.cli import main

    path = corpus.onnx_path("stereonet", 17)
    g = load_onnx(path)
    assert g.inputs == ("left", "right") and g.outputs == ("disparity", "confidence")
    assert g.original_param_count == coverage.file_parameters(path)
    assert main(["run", str(path), "--verify", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["verify"]["ok"] and list(ran["outputs"]) == ["disparity", "confidence"], ran
    model = PlannedModel(g, str(path))
    report = check_plan(plan_reuse(model, "improve"), [g])
    assert report.arena_bytes == report.lower_bound, report.ratio
    x = random_input(g)
    want = run_reference(g, x)
    phases, source = phases_for_rows(g, 8)
    parts = plan_parts(model, phases, source)
    assert check_plan(parts, [g]).peak_bytes < report.peak_bytes
    assert coverage.matches_reference(parts, g, x, want)
    plan_path = tmp_path / "parts.json"
    assert main(["plan", str(path), "--method", "parts", "--rows", "8", "--out", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan_path), "--out", str(tmp_path / "c"), "--check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["check"]["ok"]


def test_a_corpus_model_with_constant_weights_and_a_renamed_output(tmp_path, capsys):
    """The same CNN in the form some converters write: every weight in a Constant node, the
    output reached through Identity nodes under a name of its own. `inspect` counts the same
    parameters as the file holds; `run --verify` matches onnxruntime and keeps the name."""
    import json

    import onnx
    from onnx import helper

    from tightfit.cli import main

    model = onnx.load(str(corpus.onnx_path("squeezenet1_1", 17)))
    graph = model.graph
    consts = [helper.make_node("Constant", [], [w.name], value=w) for w in graph.initializer]
    out = graph.output[0]
    tail = [helper.make_node("Identity", [out.name], ["scores"]), helper.make_node("Identity", ["scores"], ["logits"])]
    nodes = consts + list(graph.node) + tail
    del graph.initializer[:], graph.node[:]
    graph.node.extend(nodes)
    out.name = "logits"
    path = tmp_path / "squeezenet_constants.onnx"
    onnx.save(model, str(path))

    assert main(["inspect", str(path), "--json"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert inspected["totals"]["original_param_bytes"] == 4 * coverage.file_parameters(path) > 0
    assert coverage.file_parameters(path) == coverage.file_parameters(corpus.onnx_path("squeezenet1_1", 17))
    assert main(["run", str(path), "--verify", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["verify"]["ok"] and list(ran["outputs"]) == ["logits"], ran


def _cases() -> list:
    cases = []
    for opset in corpus.OPSETS:  # every model at opset 17 first: a run cut short still covers the corpus once
        for name in corpus.names():
            marks = [pytest.mark.slow]
            if name in MISSING_OPS:
                marks.append(pytest.mark.xfail(raises=UnsupportedOpsError, strict=True,
                                               reason=f"needs {MISSING_OPS[name]} (branch ops-elem / ops-spatial)"))
            cases.append(pytest.param(name, opset, marks=marks, id=f"{name}-opset{opset}"))
    return cases


@pytest.mark.parametrize("name,opset", _cases())
def test_whole_corpus(name, opset):
    """Acceptance 2 of issue 22 for one model and export, but `fit` (test_fit_half_the_reuse_arena)."""
    with contextlib.redirect_stderr(io.StringIO()):
        load_onnx(corpus.onnx_path(name, opset))  # an unsupported op raises here (xfail above)
    row = coverage.check_model(name, opset, pytorch=opset == corpus.OPSETS[0])  # (that path has no opset)
    print(coverage.HEAD, coverage.line(row), sep="\n")  # the model's row of bench/coverage.py's table
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in row.seconds.items()))
    for kind in ("parts", "tiling"):
        if getattr(row, f"{kind}_bytes") > row.half:
            print(f"{name} opset {opset} {kind}: half the reuse arena ({row.half} B) is below the search's reach; "
                  f"the smallest it reaches, {getattr(row, f'{kind}_bytes')} B, is run instead")
    assert not row.error, row.error
    assert row.params == row.file_params, "inspect misses weights of the file"
    if opset == corpus.OPSETS[0]:
        assert row.torch_path_params == row.torch_params, "the PyTorch path misses parameters"
        assert row.torch_path_ok, "the PyTorch path's graph differs from the module"
    assert row.ort_ok, f"differs from onnxruntime: {row.ort_diff}"
    assert row.reuse == row.lower_bound, row.reuse / row.lower_bound
    assert not row.problems, row.problems
    assert row.parts_ok and row.tiling_ok, "a split plan differs from the reference executor"
    assert row.parts_bytes <= row.reuse_run and row.tiling_bytes <= row.reuse_run  # run memory against run memory


@pytest.mark.parametrize("name,opset", _cases())
def test_fit_half_the_reuse_arena(name, opset):
    """`fit --budget` half the reuse arena runs and verifies (fit checks its pick against the
    reference itself); where nothing it reaches fits, its smallest plan runs instead, said."""
    path, g = coverage.load(name, opset)
    half = check_plan(plan_reuse(PlannedModel(g, str(path)), "improve"), [g]).arena_bytes // 2
    fitted = coverage.fit_half(path, half)
    print(f"{name} opset {opset}: fit --budget {half} B: {fitted}")
    assert fitted == "ok" or fitted.startswith("smallest"), fitted


def test_tiling_search_stopped_by_its_deadline_answers():
    """Found by the corpus under load: a tiling search whose deadline passed before the fine
    space had its layer-by-layer options for the new cut points failed with KeyError."""
    from tightfit.techniques.deadline import Deadline
    from tightfit.techniques.tiling import TilingOptions, search_tiling

    g = load_onnx(corpus.onnx_path("squeezenet1_1", 17))
    found = search_tiling(PlannedModel(g, "squeezenet1_1"), lambda plan, steps: float(len(steps)), 1, options=TilingOptions(front_points=0), deadline=Deadline.after(0.0))
    assert found.timed_out and found.chosen.memory_bytes > 0
