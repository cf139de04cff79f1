"""The kernel library beside onnxruntime at one thread (issue 39, point 7).

Per model, the reuse plan on the arena executor (every step in the C kernel library, one tf_run
call) and onnxruntime's session on the same ONNX file (one intra-op and one inter-op thread),
interleaved: ROUNDS rounds of RUNS runs each, each run's process CPU time (both run on the calling
thread, so other processes holding the cores count in neither); the median of all runs. Target:
onnxruntime's time over ours >= 1.0 on each model. The exported program runs the same kernels
(bench/export.py times it beside both).

The int8 rows (issue 40): the same models quantized here by onnxruntime's `quantize_static` (QDQ,
its defaults, after its advised pre-processing; calibrated on 4 random inputs), our int8 kernels
beside onnxruntime's int8 session of the same QDQ file, timed alike.

    python bench/kernels.py [--models mobilenet_v2,resnet18,googlenet,efficientnet_b0]
                            [--int8-models mobilenet_v2,resnet18] [--write-docs]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import onnxruntime as ort  # noqa: E402

import tightfit  # noqa: E402
from benchlib import add_write_docs, docs_section, header, loaded, verdict  # noqa: E402
from tightfit.frontend import zoo  # noqa: E402
from tightfit.runtime.executor import ArenaExecutor  # noqa: E402
from tightfit.runtime.reference import random_input  # noqa: E402
from tightfit.techniques.interface import PlannedModel  # noqa: E402
from tightfit.techniques.reuse.planner import plan_reuse  # noqa: E402

MODELS = ("mobilenet_v2", "resnet18", "googlenet", "efficientnet_b0")
INT8_MODELS = ("mobilenet_v2", "resnet18")
ROUNDS, RUNS = 3, 5
TARGET = 1.0


def cpu_seconds(run) -> float:
    t0 = time.process_time()
    run()
    return time.process_time() - t0


def quantized(name: str, folder: Path) -> Path:
    """The zoo model's int8 QDQ file as onnxruntime's quantize_static writes it (its defaults)."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    src, out = folder / f"{name}.float.onnx", folder / f"{name}.int8.onnx"
    src.write_bytes(zoo.onnx_model(name))
    quant_pre_process(str(src), str(src))
    g = tightfit.load(str(src))
    feeds = iter([{g.inputs[0]: random_input(g, seed=i)} for i in range(4)])
    reader = type("Reader", (CalibrationDataReader,), {"get_next": lambda self: next(feeds, None)})()
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process, taken above
    quantize_static(str(src), str(out), reader)
    return out


def one_model(name: str, int8: bool = False) -> tuple[float, float]:
    """(ours, onnxruntime's) median seconds a run; int8: of the model's QDQ int8 form."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(quantized(name, Path(tmp))) if int8 else name
        g = tightfit.load(path)
        session_model = path if int8 else zoo.onnx_model(name)
        return timed(g, session_model, name)


def timed(g, session_model, name: str) -> tuple[float, float]:
    x = random_input(g)
    ex = ArenaExecutor(plan_reuse(PlannedModel(g, name)), [g])
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    session = ort.InferenceSession(session_model, so, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    runs = {"ours": lambda: ex.run(x), "ort": lambda: session.run(None, feed)}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for run in runs.values():
        run()  # warm-up: pages touched, code loaded
    for _ in range(ROUNDS):
        for key, run in runs.items():
            times[key] += [cpu_seconds(run) for _ in range(RUNS)]
    return statistics.median(times["ours"]), statistics.median(times["ort"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--int8-models", default=",".join(INT8_MODELS))
    add_write_docs(ap)
    args = ap.parse_args()
    with docs_section("kernels", args.write_docs,
                      f"python bench/kernels.py --models {args.models} --int8-models {args.int8_models}"):
        header("The kernel library beside onnxruntime, reuse plans, one thread, process CPU time (issue 39, point 7)")
        print(f"\n{'model':<18} {'tightfit':>10} {'onnxruntime':>12} {'ort / ours':>11} {'target':>7}  verdict")
        for name in filter(None, args.models.split(",")):
            ours, ort_s = one_model(name)
            ratio = ort_s / ours
            ok = verdict([(ratio >= TARGET, "slower than onnxruntime")])
            print(f"{name:<18} {ours * 1e3:>7.1f} ms {ort_s * 1e3:>9.1f} ms {ratio:>10.2f}x {TARGET:>6.1f}x  {ok}{loaded()}", flush=True)
        for name in filter(None, args.int8_models.split(",")):
            ours, ort_s = one_model(name, int8=True)
            ratio = ort_s / ours
            ok = verdict([(ratio >= TARGET, "slower than onnxruntime's int8")])
            label = f"{name} int8"
            print(f"{label:<18} {ours * 1e3:>7.1f} ms {ort_s * 1e3:>9.1f} ms {ratio:>10.2f}x {TARGET:>6.1f}x  {ok}{loaded()}", flush=True)


if __name__ == "__main__":
    main()
