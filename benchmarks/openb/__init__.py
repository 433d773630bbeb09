"""Replay of the Alibaba openb GPU-sharing trace through the placement core."""
