"""The kernel library: one C99 implementation per op (tf_kernels.c/.h), the arguments a plan's step
passes to it (step_args), and its shared build called through ctypes (library). The executor, the
profiler and the C export all run these kernels; nothing else computes an op."""
