"""Flax modules (imported as ``ivhl_jax.models``)."""
