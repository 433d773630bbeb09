"""Per-pod decision time of the placement core on the openb cluster."""
