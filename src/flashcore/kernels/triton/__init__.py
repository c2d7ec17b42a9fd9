"""Portable Triton kernels (every CUDA GPU, and the CPU interpreter)."""
