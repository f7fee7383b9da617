"""Per-task post-processing in torch ops, following ultralytics' predictors: the CPU fallback and the truth the
GPU kernels of each task are held to. One module per task."""
