"""The 2+1D engine-speed op (bench/ops_cdt3_speed.py): our side's chains, thermalised at the target, timed."""

import numpy as np

from ivhl_jax.bench import ops_cdt3_speed, peer_cdt3


def test_our_chains_reach_the_target_and_count_their_attempts():
    spec = peer_cdt3.RunSpec(k0=5.0, k3=1.70, target=150, n_slices=4, thermal=10, sweeps=10, ksteps=1, epsilon=0.01)
    ch = ops_cdt3_speed.thermalised(spec, 2, 20_000)
    assert [c["n31"] for c in ch.counts()] == [150, 150]
    assert ch.run_one(5_000, 3) > 0
    wall, cpu = ch.run_all(5_000, 4)
    assert wall > 0 and cpu > 0
    f = [ch.counts()[c] for c in range(2)]
    assert not any(c["overflow"] for c in f)
    # every iteration is one attempt, rejections included (the reference's count)
    att = [int(np.sum(_attempts(ch, c))) for c in range(2)]
    assert att == [5_000, 5_000]
    assert set(ch.acceptance()) == {"26", "62", "44", "23", "32"}


def _attempts(ch, c):
    from ivhl_jax.physics.cdt import d3_state

    return d3_state.unpack(ch.bufs[c], ch.tetra_capacity, ch.spec.n_slices)["attempts"]
