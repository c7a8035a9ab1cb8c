"""Lowest layer: argument validation, precision policies, the per-backend table and the per-machine tuning cache.
Imports nothing else from ivhl_jax."""
