"""Fixtures shared across tiers: the local HTTP stub of the API (`tests/apistub.py`)."""

pytest_plugins = ["tests.apistub"]
