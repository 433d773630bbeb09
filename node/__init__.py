"""What gpupack runs on a GPU node for the pods that share it, apart from metrics: the CSI
drivers that hand pods MPS (`gpupack-mps-csi`) and the memory shim (`gpupack-cuda-csi`),
and the MPS control daemon in an MPS GPU's capacity pod (`gpupack-mps-daemon`)."""
