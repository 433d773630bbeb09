"""Benchmarks: measured as ratios against a baseline run in the same run."""
