"""Turn any ``step(state, params) -> state`` into a scanned rollout (the jax-cfd ``trajectory`` idea).

All time loops in ivhl_jax go through :func:`rollout`, so every simulation gets the same
behaviour: a ``lax.scan`` (no Python loop over steps), observations recorded every ``save_every``
steps, and optional rematerialisation so that ``grad`` through ``n`` steps stores only about
``n / save_every + save_every`` states instead of ``n``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ivhl_jax.validation import check_scalar

Step = Callable[[Any, Any], Any]
Observe = Callable[[Any, Any], Any]


def rollout(
    step: Step,
    state: Any,
    params: Any,
    n_steps: int,
    *,
    save_every: int = 1,
    observe: Observe | None = None,
    remat: bool = False,
    unroll: int = 1,
) -> tuple[Any, Any]:
    """Advance ``state`` by ``n_steps`` applications of ``step`` inside ``lax.scan``.

    Args:
      step: pure ``step(state, params) -> state``.
      state: initial state pytree.
      params: static-in-time parameters passed to every step (a pytree; may be traced).
      n_steps: number of steps (Python int, multiple of ``save_every``).
      save_every: record ``observe(state, params)`` after every ``save_every`` steps.
      observe: function of (state, params) returning a pytree of observations; defaults to the
        state itself (the full trajectory).
      remat: checkpoint each block of ``save_every`` steps so reverse-mode memory is
        O(n_steps / save_every) states plus one block, not O(n_steps).
      unroll: ``lax.scan`` unroll factor for the inner loop.

    Returns:
      (final_state, observations) where observations has a leading axis of length
      ``n_steps // save_every``.
    """
    check_scalar(n_steps, "n_steps", integer=True, nonnegative=True)
    check_scalar(save_every, "save_every", integer=True, minimum=1)
    n_steps, save_every = int(n_steps), int(save_every)
    if n_steps % save_every:
        raise ValueError(f"n_steps ({n_steps}) must be a multiple of save_every ({save_every})")
    observe = observe if observe is not None else (lambda s, p: s)

    def block(carry, _):
        def one(c, _):
            return step(c, params), None

        carry, _ = jax.lax.scan(one, carry, None, length=save_every, unroll=unroll)
        return carry, observe(carry, params)

    if remat:
        block = jax.checkpoint(block)
    return jax.lax.scan(block, state, None, length=n_steps // save_every)
