"""The frontend: models in, Graphs out. The ONNX and PyTorch importers, model validation, the
built-in zoo, loading a model by name and application files; above the ops (it asks them for
shapes) and below the face."""
