from tightfit.graph.ir import DTYPE_BYTES, Graph, Layer, Quant, Tensor, itemsize

__all__ = ["DTYPE_BYTES", "Graph", "Layer", "Quant", "Tensor", "itemsize"]
