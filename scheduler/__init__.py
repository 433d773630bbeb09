"""gpupack-scheduler: places fractional pods on GPUs held by capacity pods."""
