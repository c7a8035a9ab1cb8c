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


def test_bundled_digits_equal_scikit_learns_bit_for_bit():
    datasets = pytest.importorskip("sklearn.datasets")
    from ivhl_jax.train.digits import load_digits

    x, y = load_digits()
    want_x, want_y = datasets.load_digits(return_X_y=True)
    assert x.dtype == want_x.dtype and y.dtype == want_y.dtype
    assert x.shape == want_x.shape == (1797, 64) and y.shape == want_y.shape == (1797,)
    assert x.tobytes() == want_x.tobytes() and y.tobytes() == want_y.tobytes()


def test_the_default_adaptive_trainer_loads_its_data_without_scikit_learn():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['sklearn'] = None  # as if scikit-learn were not installed\n"
        "from ivhl_jax.run.config import load_config\n"
        "from ivhl_jax.sims import train_adaptive as ta\n"
        "cfg = load_config(ta.TrainAdaptiveConfig)\n"
        "d = ta.load_dataset(cfg)\n"
        "print(cfg.dataset, len(d['y_train']), len(d['y_test']), d['x_train'].shape[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["digits", "1438", "359", "64"]
