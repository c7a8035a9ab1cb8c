"""Numerical building blocks shared by the physics: fast transcendentals, spectral (FFT) multipliers,
the stepper protocol and the scanned trajectory driver. Imports only :mod:`ivhl_jax.core`."""
