"""Executors of the graph IR: the torch reference (truth and CPU fallback) and, on GPUs, the Triton engine."""
