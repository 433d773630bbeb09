"""Benchmarks: harness logic exercised on tiny hand-written inputs."""
