"""int8 .tflite files made here: Keras models with random weights, converted by TensorFlow's
int8 converter on random calibration data (full integer quantization, int8 input and output).

Needs tensorflow (tensorflow-cpu) only to MAKE a file; tightfit reads .tflite without it. The
files are cached under ~/.cache/tightfit/tflite (or $TIGHTFIT_CACHE/tflite), keyed by name.

    python bench/tflite_models.py small tests/data/small_int8.tflite tests/data/small_int8_tflm.npz
        (the test model, and TFLite Micro's outputs on seeded int8 inputs, which tests/test_tflite.py
        compares against where the interpreter is not installed)
    python bench/tflite_models.py softmax tests/data/softmax_int8.tflite tests/data/softmax_int8_tflm.npz
    python bench/tflite_models.py small-float-io tests/data/small_float_io.tflite tests/data/small_float_io_tflm.npz
    python bench/tflite_models.py tanh tests/data/tanh_int8.tflite        # an op tightfit does not import
    python bench/tflite_models.py float16 tests/data/float16.tflite       # float16 weights
    python bench/tflite_models.py broadcast tests/data/broadcast_int8.tflite tests/data/broadcast_int8_tflm.npz
        (an ADD of a (1,1,1,C) map onto an NHWC one; MAX_POOL_2D and AVERAGE_POOL_2D with a fused RELU)
    python bench/tflite_models.py mul tests/data/mul_int8.tflite tests/data/mul_int8_tflm.npz
        (MUL of two maps, and of a (1,1,1,C) map onto one: a squeeze-excitation's scaling)
    python bench/tflite_models.py add-const tests/data/add_const_int8.tflite   # an ADD of a constant: refused
    python bench/tflite_models.py map tests/data/map_int8.tflite tests/data/map_int8_tflm.npz
        (a 4-D NHWC output, H, W and C all different)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np

CALIBRATION = 8  # random samples the converter calibrates activation ranges on


def cache_dir() -> Path:
    root = os.environ.get("TIGHTFIT_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "tightfit") / "tflite"


def to_tflite(model, seed: int = 0, float_io: bool = False) -> bytes:
    """A Keras model as an int8 .tflite (int8 input and output; with `float_io` float32 ones, the
    file quantizing its input and dequantizing its output, and dense layers per tensor)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    shape = (1, *model.input_shape[1:])

    def calibration():
        for _ in range(CALIBRATION):
            yield [rng.uniform(-1.0, 1.0, shape).astype(np.float32)]

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.representative_dataset = calibration
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if float_io:
        conv._experimental_disable_per_channel_quantization_for_dense_layers = True
    else:
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


def _randomize(model, seed: int) -> None:
    """Random batch-norm statistics (a fresh model's are 0 / 1, every batch norm the identity);
    the other weights are Keras' random initial ones."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        ws = layer.get_weights()
        if not ws:
            continue
        if type(layer).__name__ == "BatchNormalization":  # gamma, beta, mean, variance
            g, b, m, v = ws
            layer.set_weights([rng.uniform(0.5, 1.5, g.shape), rng.uniform(-0.2, 0.2, b.shape),
                               rng.uniform(-0.2, 0.2, m.shape), rng.uniform(0.5, 1.5, v.shape)])


def small(seed: int = 0):
    """A small CNN with every op the importer takes: a ZeroPadding2D before a stride-2 conv (PAD),
    CONV_2D with RELU6 and RELU, DEPTHWISE_CONV_2D, an ADD (with a fused RELU), MAX_POOL_2D,
    AVERAGE_POOL_2D (SAME padding: windows clipped at the border), CONCATENATION, a global average
    (MEAN), FULLY_CONNECTED; a flatten of a 2x2 map into a second dense layer (RESHAPE); SOFTMAX."""
    import tensorflow as tf

    L = tf.keras.layers
    x = inp = tf.keras.Input((32, 32, 3), batch_size=1)
    x = L.ZeroPadding2D(((0, 1), (0, 1)))(x)
    x = L.Conv2D(16, 3, strides=2, use_bias=False)(x)
    x = L.BatchNormalization()(x)
    x = L.ReLU(6.0)(x)
    y = L.DepthwiseConv2D(3, padding="same")(x)
    y = L.ReLU()(y)
    y = L.Conv2D(16, 1)(y)
    x = L.ReLU()(L.Add()([x, y]))  # an ADD with a fused RELU
    a = L.MaxPooling2D(2)(x)
    b = L.AveragePooling2D(3, strides=2, padding="same")(x)
    x = L.Concatenate()([a, b])
    x = L.Conv2D(24, 3, strides=2, padding="same", activation="relu")(x)
    g = L.GlobalAveragePooling2D()(x)
    f = L.Flatten()(L.AveragePooling2D(2)(x))
    x = L.Concatenate()([L.Dense(10)(g), L.Dense(6, activation="relu")(f)])
    model = tf.keras.Model(inp, L.Softmax()(x))
    _randomize(model, seed)
    return model


def tiny_tanh(seed: int = 0):
    """A conv then a TANH, an op the importer does not take (tests/data/tanh_int8.tflite)."""
    import tensorflow as tf

    x = inp = tf.keras.Input((8, 8, 3), batch_size=1)
    x = tf.keras.layers.Activation("tanh")(tf.keras.layers.Conv2D(4, 3)(x))
    return tf.keras.Model(inp, x)


def dense_softmax(seed: int = 0):
    """Dense logits spread over about +-12 (weights scaled up) into a SOFTMAX: differences across
    the whole range of TFLite's fixed-point exp, some below its cut-off (tests/data/softmax_int8.tflite)."""
    import tensorflow as tf

    x = inp = tf.keras.Input((1, 1, 32), batch_size=1)
    dense = tf.keras.layers.Dense(120)
    x = tf.keras.layers.Softmax()(dense(tf.keras.layers.Flatten()(x)))
    model = tf.keras.Model(inp, x)
    w, bias = dense.get_weights()
    rng = np.random.default_rng(seed)
    dense.set_weights([rng.normal(0.0, 2.0, w.shape).astype(np.float32), bias])
    return model


def feature_map(seed: int = 0):
    """A 4-D NHWC output of H, W and C all different (6 x 10 x 5), from a (6, 10, 3) input: a
    layout mistake at either end changes the values (tests/data/map_int8.tflite)."""
    import tensorflow as tf

    L = tf.keras.layers
    x = inp = tf.keras.Input((6, 10, 3), batch_size=1)
    x = L.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = L.DepthwiseConv2D(3, padding="same")(x)
    x = L.Conv2D(5, 1)(x)
    model = tf.keras.Model(inp, x)
    _randomize(model, seed)
    return model


def broadcast(seed: int = 0):
    """An ADD of a per-channel (1, 1, 1, C) map (a MEAN kept 4-D, which the converter squeezes to
    (C,)) onto the (1, H, W, C) map; MAX_POOL_2D and AVERAGE_POOL_2D with a fused RELU (the
    converter fuses the ReLU into the pool) (tests/data/broadcast_int8.tflite)."""
    import tensorflow as tf

    L = tf.keras.layers
    x = inp = tf.keras.Input((8, 6, 3), batch_size=1)
    x = L.Conv2D(5, 3, padding="same")(x)
    x = L.Add()([x, L.GlobalAveragePooling2D(keepdims=True)(L.Conv2D(5, 1)(x))])
    a = L.ReLU()(L.MaxPooling2D(2)(x))
    b = L.ReLU()(L.AveragePooling2D(2)(x))
    model = tf.keras.Model(inp, L.Concatenate()([a, b]))
    _randomize(model, seed)
    return model


def mul(seed: int = 0):
    """MUL of two maps, and of a (1, 1, 1, C) map onto an NHWC one (tests/data/mul_int8.tflite)."""
    import tensorflow as tf

    L = tf.keras.layers
    x = inp = tf.keras.Input((6, 8, 3), batch_size=1)
    x = L.Conv2D(4, 3, padding="same")(x)
    y = L.Conv2D(4, 1)(x)
    x = L.Multiply()([x, y])
    x = L.Multiply()([x, L.GlobalAveragePooling2D(keepdims=True)(y)])
    model = tf.keras.Model(inp, L.Conv2D(3, 1)(x))
    _randomize(model, seed)
    return model


def add_const(seed: int = 0):
    """An ADD of a constant map after a MUL, which the converter cannot fold into a bias
    (tests/data/add_const_int8.tflite: refused in one line)."""
    import tensorflow as tf

    L = tf.keras.layers
    rng = np.random.default_rng(seed)
    x = inp = tf.keras.Input((4, 4, 2), batch_size=1)
    x = L.Conv2D(2, 1)(x)
    x = L.Multiply()([x, x])
    x = tf.keras.ops.add(x, rng.uniform(-0.5, 0.5, (1, 4, 4, 2)).astype(np.float32))
    return tf.keras.Model(inp, x)


def to_float16_tflite(model) -> bytes:
    """The model with float16 weights (TFLite's float16 quantization): a file tightfit refuses."""
    import tensorflow as tf

    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    conv.target_spec.supported_types = [tf.float16]
    return conv.convert()


def mobilenet_v2(alpha: float, size: int, seed: int = 0):
    """Keras MobileNetV2 without its top (Keras' own top adds a Shape/StridedSlice/Pack reshape on
    which TFLite Micro's interpreter aborts), then global average pool + Dense(1000)."""
    import tensorflow as tf

    base = tf.keras.applications.MobileNetV2((size, size, 3), alpha=alpha, include_top=False, weights=None, pooling="avg")
    return _headed(base, seed)


def mobilenet_v1(alpha: float, size: int, seed: int = 0):
    import tensorflow as tf

    base = tf.keras.applications.MobileNet((size, size, 3), alpha=alpha, include_top=False, weights=None, pooling="avg")
    return _headed(base, seed, classes=2)


def resnet18(size: int = 224, seed: int = 0):
    """The standard ResNet-18 (He et al. 2016, the basic-block one torchvision ships; Keras has
    none): a 7x7 stride-2 conv and a 3x3 stride-2 max pool, four stages of two basic blocks (64,
    128, 256, 512 channels; the first block of stages 2-4 strided, its shortcut a 1x1 stride-2 conv
    + batch norm), global average pool + Dense(1000). TensorFlow's SAME padding (the stride-2
    windows padded at the bottom right) instead of torchvision's symmetric ZeroPadding, which the
    converter would make a PAD copy of the largest tensor. Keras' random initial weights (seeded),
    random batch-norm statistics."""
    import tensorflow as tf

    L = tf.keras.layers
    tf.keras.utils.set_random_seed(seed)

    def conv_bn(x, filters: int, k: int, stride: int = 1):
        return L.BatchNormalization()(L.Conv2D(filters, k, strides=stride, padding="same", use_bias=False)(x))

    def block(x, filters: int, stride: int):
        y = L.ReLU()(conv_bn(x, filters, 3, stride))
        y = conv_bn(y, filters, 3)
        short = conv_bn(x, filters, 1, stride) if stride != 1 or x.shape[-1] != filters else x
        return L.ReLU()(L.Add()([y, short]))

    x = inp = tf.keras.Input((size, size, 3), batch_size=1)
    x = L.MaxPooling2D(3, strides=2, padding="same")(L.ReLU()(conv_bn(x, 64, 7, 2)))
    for i, filters in enumerate((64, 128, 256, 512)):
        x = block(block(x, filters, 1 if i == 0 else 2), filters, 1)
    base = tf.keras.Model(inp, L.GlobalAveragePooling2D()(x))
    return _headed(base, seed)


def _headed(base, seed: int, classes: int = 1000):
    import tensorflow as tf

    x = tf.keras.layers.Dense(classes)(base.output)
    model = tf.keras.Model(base.input, x)
    _randomize(model, seed)
    return model


MODELS: dict[str, Callable] = {
    "small": small,
    "tanh": tiny_tanh,
    "softmax": dense_softmax,
    "map": feature_map,
    "broadcast": broadcast,
    "mul": mul,
    "add-const": add_const,
    "mv2-1.0-224": lambda: mobilenet_v2(1.0, 224),
    "mv2-0.35-144": lambda: mobilenet_v2(0.35, 144),
    "mv2-0.35-128": lambda: mobilenet_v2(0.35, 128),
    "mv1-0.25-96": lambda: mobilenet_v1(0.25, 96),
    "resnet18-224": lambda: resnet18(224),
}


def cached(name: str) -> Path:
    """The model's .tflite, made (with tensorflow) the first time and cached."""
    path = cache_dir() / f"{name}.tflite"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        data = to_tflite(MODELS[name]())
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def write_expected(path: Path, out: Path, seeds: int = 4) -> None:
    """TFLite Micro's outputs for seeded int8 inputs, stored beside the test file, so that the
    test compares against them where the interpreter is not installed."""
    from tflite_micro.python.tflite_micro import runtime

    data = path.read_bytes()
    details = runtime.Interpreter.from_bytes(data).get_input_details(0)
    shape = tuple(int(d) for d in details["shape"])  # the file's (NHWC) shape: random_int8's and random_float's draws
    if details["dtype"] == np.float32:
        xs = np.stack([np.random.default_rng(seed).uniform(-1.2, 1.2, shape).astype(np.float32) for seed in range(seeds)])
    else:
        xs = np.stack([np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8) for seed in range(seeds)])
    ys = np.stack([tflm_outputs(data, x) for x in xs])
    np.savez_compressed(out, x=xs, y=ys)


if __name__ == "__main__":
    name, out = sys.argv[1], Path(sys.argv[2])
    if name == "float16":
        out.write_bytes(to_float16_tflite(tiny_tanh()))
    elif name == "small-float-io":
        out.write_bytes(to_tflite(small(), float_io=True))
    else:
        out.write_bytes(to_tflite(MODELS[name]()))
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    if len(sys.argv) > 3:  # the TFLite Micro outputs to compare against (needs tflite-micro)
        write_expected(out, Path(sys.argv[3]))
        print(f"wrote {sys.argv[3]}")


# --- running a .tflite: TFLite Micro's interpreter, and tightfit on the same int8 values ----------

def tflm_outputs(data: bytes, x_q: np.ndarray, arena_size: int | None = None) -> np.ndarray:
    """TFLite Micro's int8 output for an int8 NHWC input (the `tflite-micro` package)."""
    from tflite_micro.python.tflite_micro import runtime

    interp = runtime.Interpreter.from_bytes(data, arena_size=arena_size)
    interp.set_input(x_q, 0)
    interp.invoke()
    return interp.get_output(0)


def edge_quant(graph) -> tuple[tuple[float, int], tuple[float, int]]:
    """(scale, zero point) of the graph's int8 input (its Quant, or its input quantize layer's for
    a float input) and of its output dequantize layer."""
    t = graph.tensors[graph.inputs[0]]
    if t.dtype == "int8":
        first = (t.quant.scale[0], t.quant.zero_point[0])
    else:
        q = next(l for l in graph.layers if l.op == "quantize" and l.inputs[0] == graph.inputs[0])
        first = (q.attrs["scale"], q.attrs["zero_point"])
    y = graph.tensors[graph.outputs[0]]
    if y.dtype == "int8":
        return first, (y.quant.scale[0], y.quant.zero_point[0])
    d = next(l for l in graph.layers if l.op == "dequantize" and l.output == graph.outputs[0])
    return first, (d.attrs["scale"], d.attrs["zero_point"])


def random_int8(graph, seed: int = 0) -> np.ndarray:
    """A random int8 input in the file's layout (NHWC for an image)."""
    shape = graph.shape(graph.inputs[0])
    if len(shape) == 4:
        n, c, h, w = shape
        shape = (n, h, w, c)
    return np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8)


def random_float(graph, seed: int = 0) -> np.ndarray:
    """A random float32 input in the file's NHWC layout, a little beyond the calibration range."""
    n, c, h, w = graph.shape(graph.inputs[0])
    return np.random.default_rng(seed).uniform(-1.2, 1.2, (n, h, w, c)).astype(np.float32)


def as_graph_input(graph, x_q: np.ndarray) -> np.ndarray:
    """The int8 NHWC input as the graph's NCHW input: the same int8 values where the graph takes
    the file's int8 input, else (a float graph input) exactly their real values, which the input's
    quantize step gives back as the same integers."""
    x = x_q.transpose(0, 3, 1, 2) if x_q.ndim == 4 else x_q
    if graph.tensors[graph.inputs[0]].dtype == "int8":
        return np.ascontiguousarray(x, dtype=np.int8)
    (s, z), _ = edge_quant(graph)
    return np.ascontiguousarray((x.astype(np.float32) - np.float32(z)) * np.float32(s))


def as_int8_output(graph, y: np.ndarray) -> np.ndarray:
    """The graph's output as the file's integers: an int8 output as it is, a float one (a
    dequantized int8 tensor) quantized again (exact)."""
    if graph.tensors[graph.outputs[0]].dtype == "int8":
        return np.asarray(y, np.int8)
    _, (s, z) = edge_quant(graph)
    return np.clip(np.rint(y / np.float32(s)) + z, -128, 127).astype(np.int8)
