"""What the tests and the benchmarks share to stand in for what is not here: a fake NVML
reader (`nvml`), a fake /proc (`procfs`), a CUDA process (`cuda_worker`), the memory
shim and its fake CUDA driver built with this machine's compiler (`shim_build`), and pods
as the API server sends them (`pods`). Never shipped: the image copies the product's
packages only."""
