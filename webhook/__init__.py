"""gpupack's mutating admission webhook: opted-in GPU pods become fractional GPU pods."""
