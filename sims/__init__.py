"""Runnable simulations (imported as ``ivhl_jax.sims``).

Each simulation is a module ``ivhl_jax.sims.<name>`` exposing ``main(argv: list[str]) -> int``;
``ivhl sim <name>`` dispatches to it and ``ivhl train <name>`` to ``ivhl_jax.sims.train_<name>``.
"""
