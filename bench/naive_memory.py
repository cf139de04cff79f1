"""Naive memory (m_DL: every tensor of the imported model in its own buffer, plus all parameters)
beside Minakova & Stefanov Table III, fp32, MB = 10^6 bytes as the paper uses.

    python bench/naive_memory.py
"""
from __future__ import annotations

import tightfit
from benchlib import header

# (paper row, paper m_DL in MB, our zoo models standing for it)
TABLE_III = [
    ("resnet18", 84, ["resnet18"]),
    ("googlenet", 86, ["googlenet", "onnxzoo-inception_v1"]),
    ("tiny yolo v2", 142, ["tiny-yolov2"]),
    ("inception v1", 81, ["onnxzoo-inception_v1", "googlenet"]),
    ("VGG 19", 700, ["vgg19", "onnxzoo-vgg19"]),
    ("densenet121", 327, ["densenet121", "onnxzoo-densenet121"]),
    ("squeezenet", 34, ["squeezenet1_0", "onnxzoo-squeezenet"]),
]

# Why a row differs by more than 5% (checked against the models' own tensors and parameters).
WHY = {
    "resnet18": "within 5%",
    "googlenet": "torchvision's GoogLeNet has batch norms and no LRN, unlike the Caffe GoogLeNet of the paper: other tensors and parameters",
    "onnxzoo-inception_v1": "the Caffe GoogLeNet as shipped in the onnx wheel counts 65.2 MB by this definition; the paper does not say "
                            "which further buffers its framework allocated, so the 16 MB gap is unexplained",
    "tiny-yolov2": "within 5%",
    "densenet121": "torchvision's DenseNet has no Caffe Scale layers; the ONNX-zoo DenseNet the paper used keeps a Mul and an Add "
                   "output after every batch norm (see onnxzoo-densenet121, +8%)",
    "onnxzoo-densenet121": "the wheel's DenseNet (BN, Scale Mul/Add and ReLU outputs all separate tensors) counts 8% more than the "
                           "paper's figure; the paper's exact model version is not stated",
    "squeezenet1_0": "the torch export keeps every ReLU output as its own tensor (torch runs them in place); the ONNX-zoo "
                     "SqueezeNet, the paper's model, matches within 2%",
}


def main() -> None:
    header(__doc__.splitlines()[0].rstrip())
    print("Naive memory m_DL = m_par + every imported tensor, fp32, MB = 10^6 bytes (Minakova & Stefanov Table III)")
    head = f"{'paper CNN':<14} {'paper m_DL':>10}   {'our model':<22} {'m_par':>8} {'tensors':>8} {'m_DL':>8} {'diff':>7}"
    print(head)
    print("-" * len(head))
    notes = []
    for paper_name, paper_mb, models in TABLE_III:
        for name in models:
            g = tightfit.load(name)
            mem = tightfit.inspect(g)
            par = mem.original_param_bytes / 1e6
            total = mem.naive_bytes / 1e6
            diff = (total - paper_mb) / paper_mb
            print(f"{paper_name:<14} {paper_mb:>10}   {name:<22} {par:>8.1f} {total - par:>8.1f} {total:>8.1f} {diff:>+7.1%}")
            if abs(diff) > 0.05:
                notes.append(f"  {paper_name} / {name}: {diff:+.1%}: {WHY[name]}")
    if notes:
        print("\nRows differing by more than 5%:")
        print("\n".join(notes))


if __name__ == "__main__":
    main()
