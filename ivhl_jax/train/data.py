"""Deterministic, resumable batching: the batch at step s is a pure function of (seed, s).

A training run's data position is a single integer (the step), so saving it in a checkpoint and
restoring it resumes the exact same sequence of batches — no iterator state to pickle. Epoch e
uses the permutation ``jax.random.permutation(fold_in(key(seed), e), n)``; step s reads slots
``[(s mod b) * batch, (s mod b + 1) * batch)`` of epoch ``s // b`` where ``b`` is the number of
full batches per epoch (the remainder of each epoch is dropped so every batch has the same shape).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ivhl_jax.core.validation import check_scalar

__all__ = ["Batcher", "train_test_split"]


@dataclasses.dataclass(frozen=True)
class Batcher:
    """Shuffled fixed-size batches over ``n_examples`` items, addressed by step number.

    Attributes:
      n_examples: dataset size.
      batch_size: items per batch (<= n_examples).
      seed: shuffling seed.
      shuffle: if False, epochs visit items in order.
    """

    n_examples: int
    batch_size: int
    seed: int = 0
    shuffle: bool = True

    def __post_init__(self):
        check_scalar(self.n_examples, "n_examples", integer=True, minimum=1)
        check_scalar(self.batch_size, "batch_size", integer=True, minimum=1)
        if self.batch_size > self.n_examples:
            raise ValueError(f"batch_size ({self.batch_size}) must be <= n_examples ({self.n_examples})")

    @property
    def batches_per_epoch(self) -> int:
        return self.n_examples // self.batch_size

    def indices(self, step: int | jax.Array) -> jax.Array:
        """Item indices (batch_size,) of the batch at ``step``; jit-compatible (step may be traced)."""
        bpe = self.batches_per_epoch
        epoch = step // bpe
        pos = (step % bpe) * self.batch_size
        if self.shuffle:
            key = jax.random.fold_in(jax.random.key(self.seed), epoch)
            order = jax.random.permutation(key, self.n_examples)
        else:
            order = jnp.arange(self.n_examples)
        return jax.lax.dynamic_slice_in_dim(order, pos, self.batch_size)

    def batch(self, arrays: Any, step: int | jax.Array) -> Any:
        """Gather the batch at ``step`` from a pytree of arrays with leading dimension n_examples."""
        idx = self.indices(step)
        return jax.tree_util.tree_map(lambda a: jnp.take(a, idx, axis=0), arrays)

    def numpy_indices(self, step: int) -> np.ndarray:
        """Host-side copy of :meth:`indices` (for pipelines that gather on the host)."""
        return np.asarray(self.indices(int(step)))


def train_test_split(n: int, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic split of ``range(n)`` into (train_idx, test_idx); ``n`` >= 1, ``test_fraction`` in [0, 1]."""
    check_scalar(n, "n", integer=True, minimum=1)
    check_scalar(test_fraction, "test_fraction", minimum=0.0, maximum=1.0)
    perm = np.random.default_rng(seed).permutation(n)
    n_test = int(round(n * test_fraction))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])
