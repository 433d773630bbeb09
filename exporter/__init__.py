"""gpupack-exporter: per-pod GPU compute and memory from NVML, and capacity-pod GPU discovery."""
