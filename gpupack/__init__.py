"""gpupack's shared contract: the keys, units, policies and codec every component speaks.

Standard library only (enforced by import-linter). Components import this package and
never each other.
"""
