"""pytgi.backends.cuda: the NVIDIA GPU platform (Triton kernels, CUDA graphs, NCCL)."""
