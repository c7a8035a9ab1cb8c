"""Lowest layer: argument validation and precision policies. Imports nothing else from ivhl_jax."""
