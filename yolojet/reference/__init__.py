"""The truth and the CPU fallback: the graph IR executed with torch ops in float32, and ultralytics' pre- and
post-processing per task in torch ops. Nothing here imports the kernels or Triton (a test checks it)."""
