"""ivhl_jax.train.data: the deterministic batcher and train/test split."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ivhl_jax import data


def test_batcher_is_a_pure_function_of_step():
    b = data.Batcher(100, 16, seed=3)
    assert b.batches_per_epoch == 6
    np.testing.assert_array_equal(b.indices(7), b.indices(7))
    epoch0 = np.concatenate([np.asarray(b.indices(s)) for s in range(6)])
    assert len(set(epoch0.tolist())) == 96  # no repeats within an epoch
    assert not np.array_equal(b.indices(0), b.indices(6))  # new permutation next epoch
    assert np.array_equal(jax.jit(b.indices)(jnp.int32(7)), b.indices(7))
    with pytest.raises(ValueError, match="batch_size \\(200\\) must be <= n_examples"):
        data.Batcher(100, 200)
    tr, te = data.train_test_split(50, 0.2, seed=0)
    assert len(te) == 10 and len(np.intersect1d(tr, te)) == 0
