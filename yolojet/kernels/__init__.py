"""Hand-written Triton kernels, one family per file, each with a thin launcher over NHWC channel views."""
