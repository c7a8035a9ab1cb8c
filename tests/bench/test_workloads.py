"""bench/workloads.py: the reference workloads."""

from __future__ import annotations

import jax

from ivhl_jax.bench.workloads import mlp_workload


def test_mlp_reference_has_the_seed_parameter_count():
    params = jax.eval_shape(lambda: mlp_workload()[1])
    assert sum(x.size for layer in params for x in layer.values()) == 67210
