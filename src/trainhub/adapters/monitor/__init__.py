"""The node monitoring agent (psutil; NVML where GPUs exist) and where its state is kept."""
