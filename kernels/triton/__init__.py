"""The Triton kernels for CUDA devices: paged attention and the KV store."""
