"""Lowest layer: argument validation, precision policies, the per-backend table (the one reader of the platform
and the core count), the per-machine tuning cache, device meshes and array placement, and reading compiled
programs (HLO). Imports nothing else from ivhl_jax."""
