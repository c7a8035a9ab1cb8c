"""bench.studies.condensate_supersolid_tube (slow): the roton of ¹⁶⁴Dy in an infinite tube softens to zero where the
ground state turns modulated, as in bench/results/condensate_supersolid_tube_cpu.json."""

import pytest

from bench.studies import condensate_supersolid_tube as T


@pytest.mark.slow  # six float64 CG ground states and three BdG solves on 16³: ~2 min on the shared host
def test_the_tube_roton_softens_to_zero_where_the_ground_state_turns_modulated():
    """¹⁶⁴Dy in an infinite tube (f⊥ = 150 Hz, dipoles along x, n₁ = 2500 µm⁻¹, one period L = 2.5 µm on 16³;
    bench/results/condensate_supersolid_tube_cpu.json): on the uniform side the roton pair (k = 2π/L, cos and sin)
    is the lowest BdG excitation and ω² falls linearly as a_s is lowered; below, the ground state is modulated with
    C² linear in a_s (C ∝ √(a_C − a_s), a continuous transition). The a_s where ω² extrapolates to zero must equal
    the onset a_C of the contrast: a mode that stopped short of zero (as in the finite trap) fails this."""
    import jax

    rows = []
    with jax.enable_x64(True):
        for a_s in (92.3, 92.2, 92.1, 92.0, 91.9, 91.8):
            system, _ = T.tube(a_s, (16, 16, 16), (4.0, 4.0), 2.5)
            _, row = T.ground(system, 6250.0, T.seeded(system, 6250.0, 0.1))
            assert row["converged"]
            rec = {"a_s": a_s, "ground": row}
            if a_s > 92.05:
                assert row["contrast"] < 1e-6  # the uniform tube
                modes = T.roton_modes(system, 6250.0, 1e-6, 3000)  # metric="A": resolved as ω² → 0
                assert max(modes["residual"]) <= 1e-4 and modes["k_index"] == [1, 1], modes
                w2 = modes["omega_squared"]
                assert w2[1] - w2[0] < 1e-8 * w2[1]  # the degenerate pair cos kz, sin kz
                rec["modes"] = modes
            else:
                assert row["contrast"] > 0.05
            rows.append(rec)
    fit = T.fits(rows, 3)
    a_w, a_c = fit["omega_squared"]["zero_at"], fit["contrast_squared"]["zero_at"]
    assert fit["omega_squared"]["slope"] > 0.1 and fit["contrast_squared"]["slope"] < 0, fit
    assert 92.0 < a_w < 92.1 and abs(a_w - a_c) < 0.05, fit
